//! Idempotency keys, for `reserve`, `reserveMany`, `placeOrder` and
//! `checkout` alike.
//!
//! A user has one key space for all four, held by the primary key of
//! `idempotency_keys` (user, key). The first request with a key claims it in
//! the statement that writes its outcome, so a second statement with the
//! same key fails on the key and is rolled back whole: stock is taken (or a
//! cart checked out) at most once. A request that writes reservations
//! stores the key on the (first) reservation, under the unique index
//! `reservations_user_idempotency_key`, and a trigger claims it in the same
//! statement; a checkout, which writes no reservation, claims its key beside
//! the order it inserts. Beside the key goes the request's fingerprint, a
//! hash of what makes it that request, so a true replay (same key, same
//! request) gets the first outcome and a reuse (same key, other request, or
//! another operation) is refused with `IDEMPOTENCY_KEY_REUSED`. Fingerprints
//! are stored, so their text must never change: the tests below pin them.

use sea_orm::{
    ColumnTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, FromQueryResult, QueryFilter, QueryOrder, Statement,
};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::{
    db::{DbFailure, classify},
    error::AppError,
    stock::rows::{
        ReservationRow,
        reservation::{Column, Entity},
    },
};

/// The unique indexes that refuse a second use of a user's key: the key
/// space itself, and the reservations' own (which a second `reserve` of the
/// same key meets first).
const INDEXES: [&str; 2] = ["idempotency_keys_pkey", "reservations_user_idempotency_key"];

/// A client's idempotency key and the fingerprint of the request that carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    /// The key, as the client sent it (already checked).
    pub key: String,
    /// The request's fingerprint.
    pub fingerprint: String,
}

impl Key {
    /// The key of a single `reserve`.
    pub fn reserve(key: String, inventory_id: Uuid, quantity: i32, expected_version: Option<i32>) -> Self {
        let canonical = format!("reserve\n{inventory_id}\n{quantity}\n{expected_version:?}");
        Self { key, fingerprint: hex::encode(Sha256::digest(canonical.as_bytes())) }
    }

    /// The key of a multi-item `operation` (`"reserveMany"`, `"placeOrder"`)
    /// over its merged lines `(inventory, quantity, expected version)`, plus
    /// `extra`: anything else that makes the request what it is.
    pub fn multi_item(
        key: String,
        operation: &str,
        lines: impl IntoIterator<Item = (Uuid, i32, Option<i32>)>,
        extra: &str,
    ) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(operation.as_bytes());
        for (inventory_id, quantity, expected_version) in lines {
            hasher.update(format!("\n{inventory_id}:{quantity}:{expected_version:?}"));
        }
        hasher.update(b"\n");
        hasher.update(extra.as_bytes());
        Self { key, fingerprint: hex::encode(hasher.finalize()) }
    }

    /// The key of a `checkout` of these reservations (sorted, without
    /// repeats, as the request is merged), plus `extra`: anything else that
    /// makes the request what it is.
    pub fn checkout(key: String, reservation_ids: &[Uuid], extra: &str) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"checkout");
        for id in reservation_ids {
            hasher.update(format!("\n{id}"));
        }
        hasher.update(b"\n");
        hasher.update(extra.as_bytes());
        Self { key, fingerprint: hex::encode(hasher.finalize()) }
    }
}

/// A user's claim of a key: which request made it, and its order if it placed one.
#[derive(Debug, FromQueryResult)]
struct Claim {
    /// The fingerprint of the request that claimed the key.
    request_fingerprint: String,
    /// The order it placed (`placeOrder`, `checkout`).
    order_id: Option<Uuid>,
}

/// The claim of this user's key, if any; `IDEMPOTENCY_KEY_REUSED` when a
/// different request (of any operation) made it.
async fn claim(db: &DatabaseConnection, user_id: &str, key: &Key) -> Result<Option<Claim>, AppError> {
    let claim = Claim::find_by_statement(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT request_fingerprint, order_id FROM idempotency_keys WHERE user_id = $1 AND idempotency_key = $2",
        [user_id.into(), key.key.as_str().into()],
    ))
    .one(db)
    .await?;
    match claim {
        Some(claim) if claim.request_fingerprint != key.fingerprint => Err(AppError::IdempotencyKeyReused),
        claim => Ok(claim),
    }
}

/// Whether `err` is an index refusing a second use of a key: the key's
/// first request has committed meanwhile, so its outcome can be replayed
/// (or, for another request, refused).
pub fn is_taken(err: &DbErr) -> bool {
    matches!(classify(err), DbFailure::UniqueViolation(Some(index)) if INDEXES.contains(&index.as_str()))
}

/// The reservation that first used this user's key, if any;
/// `IDEMPOTENCY_KEY_REUSED` when that was a different request.
pub async fn first_use(db: &DatabaseConnection, user_id: &str, key: &Key) -> Result<Option<ReservationRow>, AppError> {
    if claim(db, user_id, key).await?.is_none() {
        return Ok(None);
    }
    let first =
        Entity::find().filter(Column::UserId.eq(user_id)).filter(Column::IdempotencyKey.eq(&key.key)).one(db).await?;
    // Claimed by this very request, so it wrote its reservation in the same statement.
    first.map(Some).ok_or_else(|| AppError::internal(anyhow::anyhow!("a claimed idempotency key has no reservation")))
}

/// Every reservation of the multi-item request that first used the key,
/// ordered by inventory id (as `reserveMany` answered them), if any.
pub async fn replay_multi_item(
    db: &DatabaseConnection,
    user_id: &str,
    key: &Key,
) -> Result<Option<Vec<ReservationRow>>, AppError> {
    let Some(first) = first_use(db, user_id, key).await? else { return Ok(None) };
    let multi_item = first
        .multi_item_id
        .ok_or_else(|| AppError::internal(anyhow::anyhow!("a reserveMany key's first use has no multi-item id")))?;
    let lines =
        Entity::find().filter(Column::MultiItemId.eq(multi_item)).order_by_asc(Column::InventoryId).all(db).await?;
    Ok(Some(lines))
}

/// The order placed by the request (`placeOrder`, `checkout`) that first
/// used the key, if any.
pub async fn replay_order(db: &DatabaseConnection, user_id: &str, key: &Key) -> Result<Option<Uuid>, AppError> {
    let Some(claim) = claim(db, user_id, key).await? else { return Ok(None) };
    Ok(Some(claim.order_id.ok_or_else(|| AppError::internal(anyhow::anyhow!("an order key's claim has no order")))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Stored fingerprints must stay valid across releases: a changed text
    // would turn every replay of an older key into IDEMPOTENCY_KEY_REUSED.

    #[test]
    fn the_fingerprint_of_a_reserve_never_changes() {
        let key = Key::reserve("k".into(), Uuid::from_u128(1), 2, Some(3));
        assert_eq!(key.fingerprint, "7b4809da65cb4d8601e408b69581b64c75c341d4bc16551c7821af6a333104bf");
    }

    #[test]
    fn the_fingerprints_of_multi_item_requests_never_change() {
        let lines = [(Uuid::from_u128(1), 1, None), (Uuid::from_u128(2), 4, Some(7))];
        let many = Key::multi_item("k".into(), "reserveMany", lines, "");
        assert_eq!(many.fingerprint, "21f934cb3a771e43aaff30c3400372f1003055020e3f8ea1dd7e7ebc59dbfd4e");
        let address = r#"ShippingAddress { name: "Alice", line1: "1 Main St", line2: None, city: "Osaka", postal_code: "530-0001", country: "JP" }"#;
        let order = Key::multi_item("k".into(), "placeOrder", lines, address);
        assert_eq!(order.fingerprint, "f7765cbbe731b738278329a9605cfa30124996f60a61fe5ee181d87f1aa9331c");
    }

    #[test]
    fn the_fingerprint_of_a_checkout_never_changes() {
        let address = r#"ShippingAddress { name: "Alice", line1: "1 Main St", line2: None, city: "Osaka", postal_code: "530-0001", country: "JP" }"#;
        let key = Key::checkout("k".into(), &[Uuid::from_u128(1), Uuid::from_u128(2)], address);
        assert_eq!(key.fingerprint, "3ffc95a42fdaf8f5153e4279acb60f7765bcb164755129f082b41041197df284");
    }
}
