//! The fingerprints of keys stored before the canonical encoding: the hex
//! SHA-256 of a text that wrote optional integers (and, from `orders`, the
//! shipping address) as `Debug` did. The texts are spelled out here so that
//! no `Debug` output enters them; they are matched, never stored (see the
//! docs of `idempotency` for when they can go).

use sha2::{Digest, Sha256};
use uuid::Uuid;

/// An optional integer as `Debug` wrote it: `Some(3)`, `None`.
pub(super) fn optional(value: Option<i32>) -> String {
    value.map_or_else(|| "None".to_owned(), |n| format!("Some({n})"))
}

pub(super) fn reserve(inventory_id: Uuid, quantity: i32, expected_version: Option<i32>) -> String {
    let text = format!("reserve\n{inventory_id}\n{quantity}\n{}", optional(expected_version));
    hex::encode(Sha256::digest(text.as_bytes()))
}

pub(super) fn multi_item(operation: &str, lines: &[(Uuid, i32, Option<i32>)], extra: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(operation.as_bytes());
    for (inventory_id, quantity, expected_version) in lines {
        hasher.update(format!("\n{inventory_id}:{quantity}:{}", optional(*expected_version)));
    }
    hasher.update(b"\n");
    hasher.update(extra.as_bytes());
    hex::encode(hasher.finalize())
}

pub(super) fn checkout(reservation_ids: &[Uuid], extra: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"checkout");
    for id in reservation_ids {
        hasher.update(format!("\n{id}"));
    }
    hasher.update(b"\n");
    hasher.update(extra.as_bytes());
    hex::encode(hasher.finalize())
}
