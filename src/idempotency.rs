//! Idempotency keys, for `reserve`, `reserveMany`, `placeOrder`,
//! `checkout`, `transferStock`, `returnOrder` and `adjustStock` alike.
//!
//! A user has one key space for all of them, held by the primary key of
//! `idempotency_keys` (user, key). The first request with a key claims it in
//! the statement that writes its outcome, so a second statement with the
//! same key fails on the key and is rolled back whole: stock is taken (or a
//! cart checked out) at most once. A request that writes reservations
//! stores the key on the (first) reservation, under the unique index
//! `reservations_user_idempotency_key`, and a trigger claims it in the same
//! statement; a checkout, which writes no reservation, claims its key beside
//! the order it inserts, a return beside the return it makes, and an
//! adjustment beside the delta it applied. Beside the key goes the request's fingerprint, a
//! hash of what makes it that request, so a true replay (same key, same
//! request) gets the first outcome and a reuse (same key, other request, or
//! another operation) is refused with `IDEMPOTENCY_KEY_REUSED`.
//!
//! Fingerprints are stored, so what they hash must never change: it is an
//! explicit byte encoding of the request ([`Part`]), written here and pinned
//! by the tests below, never a text the toolchain makes. A stored
//! fingerprint is `v2:` and the hex SHA-256 of that encoding.
//!
//! Keys stored before the encoding existed hold the bare hex SHA-256 of a
//! text made with Rust's `Debug` ([`legacy`]). A replay of such a key is
//! matched against that text, so it still gets its first outcome; a key is
//! matched by the scheme its stored fingerprint names, never by both. The
//! legacy scheme stays while `SELECT count(*) FROM idempotency_keys WHERE
//! request_fingerprint NOT LIKE 'v2:%'` is above zero; once it is zero, or
//! `stockguard archive` has forgotten every key older than the encoding,
//! [`legacy`] can go.
//!
//! Keys follow the archive's retention: `stockguard archive --older-than`
//! forgets the keys claimed before its cutoff (at least a day ago, so a key
//! is remembered for at least 24 h), each whole in one statement
//! (`stock::archiving::forget_keys`). The same key is then a new request.

use sea_orm::{
    ActiveEnum as _, ColumnTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, FromQueryResult, QueryFilter,
    QueryOrder, Statement,
};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::{
    db::{DbFailure, classify, read_answer},
    error::AppError,
    stock::{
        allocating::{Allocating, Strategy},
        correcting::{Adjustment, Change},
        rows::{
            ReservationRow, ReturnDisposition,
            reservation::{Column, Entity},
        },
        taking_back::ReturnLine,
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
    /// The request's fingerprint, as it is stored: `v2:` and the hex
    /// SHA-256 of its canonical encoding.
    pub fingerprint: String,
    /// The fingerprint a key stored before the canonical encoding holds for
    /// the same request (see [`legacy`]); only ever compared, never stored.
    legacy: String,
}

/// What a stored fingerprint of the canonical encoding starts with.
const CANONICAL: &str = "v2:";

/// What the encoding of every request starts with: its name and version.
const MAGIC: &[u8] = b"stockguard.idempotency.v2";

/// A value of a request as it enters a fingerprint, in the canonical
/// encoding: one tag byte, then
///
/// - `s` text: its length in bytes (u32, big-endian), its UTF-8 bytes;
/// - `i` integer: i64, big-endian;
/// - `u` UUID: its 16 bytes;
/// - `n` absent (an optional value not given): nothing;
/// - `l` list: its length (u32, big-endian), then each item;
/// - `r` record: its number of fields (u32, big-endian), then each field's
///   name (as text, without its tag) and value, in the order the request's
///   constructor below writes them (never sorted, never skipped).
///
/// A request is [`MAGIC`], its operation's name as text (without its tag),
/// then a record of its fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part<'a> {
    /// Text.
    Text(&'a str),
    /// An integer.
    Int(i64),
    /// A UUID.
    Id(Uuid),
    /// An optional value that was not given.
    Absent,
    /// A list.
    List(Vec<Part<'a>>),
    /// Named fields, in a fixed order.
    Record(Vec<(&'a str, Part<'a>)>),
}

impl<'a> Part<'a> {
    /// Text, or [`Part::Absent`].
    pub fn optional_text(value: Option<&'a str>) -> Self {
        value.map_or(Self::Absent, Self::Text)
    }

    /// An integer, or [`Part::Absent`].
    pub fn optional_int(value: Option<i32>) -> Self {
        value.map_or(Self::Absent, |n| Self::Int(n.into()))
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::Text(text) => {
                out.push(b's');
                encode_text(text, out);
            }
            Self::Int(n) => {
                out.push(b'i');
                out.extend_from_slice(&n.to_be_bytes());
            }
            Self::Id(id) => {
                out.push(b'u');
                out.extend_from_slice(id.as_bytes());
            }
            Self::Absent => out.push(b'n'),
            Self::List(items) => {
                out.push(b'l');
                encode_len(items.len(), out);
                items.iter().for_each(|item| item.encode(out));
            }
            Self::Record(fields) => {
                out.push(b'r');
                encode_len(fields.len(), out);
                for (name, value) in fields {
                    encode_text(name, out);
                    value.encode(out);
                }
            }
        }
    }
}

fn encode_len(len: usize, out: &mut Vec<u8>) {
    // Requests are bounded far below 4 GiB by the body limit.
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
}

fn encode_text(text: &str, out: &mut Vec<u8>) {
    encode_len(text.len(), out);
    out.extend_from_slice(text.as_bytes());
}

/// The canonical encoding of `operation` with `fields`.
fn encoding(operation: &str, fields: Vec<(&str, Part<'_>)>) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    encode_text(operation, &mut out);
    Part::Record(fields).encode(&mut out);
    out
}

/// The stored fingerprint of `operation` with `fields`.
fn canonical(operation: &str, fields: Vec<(&str, Part<'_>)>) -> String {
    format!("{CANONICAL}{}", hex::encode(Sha256::digest(encoding(operation, fields))))
}

/// What else makes a multi-item request or a checkout what it is, beside
/// its lines: its fields, and the text the legacy fingerprint held for them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extra<'a> {
    /// Fields after the lines, in a fixed order.
    pub fields: Vec<(&'a str, Part<'a>)>,
    /// The same, as keys stored before the canonical encoding hashed it.
    pub legacy: String,
}

impl Key {
    /// The key of a single `reserve`. Taking safety stock enters the
    /// fingerprint only when asked for, so every fingerprint from before
    /// safety stock stays what it was.
    pub fn reserve(
        key: String,
        inventory_id: Uuid,
        quantity: i32,
        expected_version: Option<i32>,
        allocating: &Allocating,
        use_safety_stock: bool,
    ) -> Self {
        let mut fields = vec![
            ("inventoryId", Part::Id(inventory_id)),
            ("quantity", Part::Int(quantity.into())),
            ("expectedVersion", Part::optional_int(expected_version)),
        ];
        fields.extend(choice(allocating));
        if use_safety_stock {
            fields.push(("useSafetyStock", Part::Int(1)));
        }
        // No request from before safety stock took it.
        let legacy = if use_safety_stock {
            String::new()
        } else {
            legacy_unless_located(allocating, || legacy::reserve(inventory_id, quantity, expected_version))
        };
        Self { key, fingerprint: canonical("reserve", fields), legacy }
    }

    /// The key of a multi-item `operation` (`"reserveMany"`, `"placeOrder"`)
    /// over its merged lines `(inventory, quantity, expected version)`, plus
    /// `extra`: anything else that makes the request what it is.
    pub fn multi_item<'l>(
        key: String,
        operation: &str,
        lines: impl IntoIterator<Item = (Uuid, i32, Option<i32>, &'l Allocating)>,
        extra: Extra<'_>,
    ) -> Self {
        let lines: Vec<_> = lines.into_iter().collect();
        let plain: Vec<_> = lines.iter().map(|&(id, quantity, version, _)| (id, quantity, version)).collect();
        let legacy = if lines.iter().all(|(.., allocating)| allocating.is_default()) {
            legacy::multi_item(operation, &plain, &extra.legacy)
        } else {
            String::new()
        };
        let lines = lines
            .into_iter()
            .map(|(inventory_id, quantity, expected_version, allocating)| {
                let mut fields = vec![
                    ("inventoryId", Part::Id(inventory_id)),
                    ("quantity", Part::Int(quantity.into())),
                    ("expectedVersion", Part::optional_int(expected_version)),
                ];
                fields.extend(choice(allocating));
                Part::Record(fields)
            })
            .collect();
        let mut fields = vec![("lines", Part::List(lines))];
        fields.extend(extra.fields);
        Self { key, fingerprint: canonical(operation, fields), legacy }
    }

    /// The key of a `checkout` of these reservations (sorted, without
    /// repeats, as the request is merged), plus `extra`: anything else that
    /// makes the request what it is.
    pub fn checkout(key: String, reservation_ids: &[Uuid], extra: Extra<'_>) -> Self {
        let legacy = legacy::checkout(reservation_ids, &extra.legacy);
        let mut fields = vec![("reservationIds", Part::List(reservation_ids.iter().copied().map(Part::Id).collect()))];
        fields.extend(extra.fields);
        Self { key, fingerprint: canonical("checkout", fields), legacy }
    }

    /// The key of a `transferStock`. A transfer has no fingerprint from
    /// before the canonical encoding: its legacy one is empty, which no
    /// stored fingerprint is, so a legacy key never matches it.
    pub fn transfer(
        key: String,
        inventory_id: Uuid,
        (from, to): (Uuid, Uuid),
        quantity: i32,
        expected_version: Option<i32>,
    ) -> Self {
        let fields = vec![
            ("inventoryId", Part::Id(inventory_id)),
            ("fromLocationId", Part::Id(from)),
            ("toLocationId", Part::Id(to)),
            ("quantity", Part::Int(quantity.into())),
            ("expectedVersion", Part::optional_int(expected_version)),
        ];
        Self { key, fingerprint: canonical("transferStock", fields), legacy: String::new() }
    }

    /// The key of a `returnOrder` of `order_id` with these lines and note.
    /// The lines enter in inventory order, whatever order the request named
    /// them in (each inventory is named once). A return has no fingerprint
    /// from before the canonical encoding (see [`Key::transfer`]).
    pub fn return_order(key: String, order_id: Uuid, lines: &[ReturnLine], note: Option<&str>) -> Self {
        let mut sorted: Vec<&ReturnLine> = lines.iter().collect();
        sorted.sort_by_key(|line| line.inventory_id);
        let lines = sorted
            .into_iter()
            .map(|line| {
                let disposition = match line.disposition {
                    ReturnDisposition::Restock => "RESTOCK",
                    ReturnDisposition::WriteOff => "WRITE_OFF",
                };
                Part::Record(vec![
                    ("inventoryId", Part::Id(line.inventory_id)),
                    ("quantity", Part::Int(line.quantity.into())),
                    ("disposition", Part::Text(disposition)),
                    ("locationId", line.location_id.map_or(Part::Absent, Part::Id)),
                ])
            })
            .collect();
        let fields =
            vec![("orderId", Part::Id(order_id)), ("lines", Part::List(lines)), ("note", Part::optional_text(note))];
        Self { key, fingerprint: canonical("returnOrder", fields), legacy: String::new() }
    }

    /// The key of an `adjustStock`: the inventory, the location (none: the
    /// default one), the change or the count, the reason, the note and the
    /// expected version. An adjustment has no fingerprint from before the
    /// canonical encoding (see [`Key::transfer`]).
    pub fn adjust(key: String, request: &Adjustment<'_>) -> Self {
        let reason = request.reason.to_value();
        let (change, units) = match request.change {
            Change::Delta(delta) => ("delta", delta),
            Change::Count(counted) => ("countedOnHand", counted),
        };
        let fields = vec![
            ("inventoryId", Part::Id(request.inventory_id)),
            ("locationId", request.location_id.map_or(Part::Absent, Part::Id)),
            (change, Part::Int(units.into())),
            ("reason", Part::Text(&reason)),
            ("note", Part::optional_text(request.note)),
            ("expectedVersion", Part::optional_int(request.expected_version)),
        ];
        Self { key, fingerprint: canonical("adjustStock", fields), legacy: String::new() }
    }

    /// Whether a stored fingerprint is this request's, by the scheme it was
    /// stored with.
    fn matches(&self, stored: &str) -> bool {
        if stored.starts_with(CANONICAL) { stored == self.fingerprint } else { stored == self.legacy }
    }
}

/// The fingerprints of keys stored before the canonical encoding: the hex
/// SHA-256 of a text that wrote optional integers (and, from `orders`, the
/// shipping address) as `Debug` did. The texts are spelled out here so that
/// no `Debug` output enters them; they are matched, never stored (see the
/// module docs for when they can go).
pub mod legacy {
    use sha2::{Digest, Sha256};
    use uuid::Uuid;

    /// An optional integer as `Debug` wrote it: `Some(3)`, `None`.
    pub fn optional(value: Option<i32>) -> String {
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
}

/// The fields a request's choice of locations adds to its fingerprint:
/// none for the default (so every fingerprint from before locations stays
/// what it was), else the location ids, strategy and split setting, so a key
/// reused with another choice is a reuse, not a replay.
fn choice(allocating: &Allocating) -> Vec<(&'static str, Part<'static>)> {
    if allocating.is_default() {
        return Vec::new();
    }
    let ids = allocating
        .location_ids
        .as_ref()
        .map_or(Part::Absent, |ids| Part::List(ids.iter().copied().map(Part::Id).collect()));
    let strategy = match allocating.strategy {
        Strategy::Priority => "PRIORITY",
        Strategy::FewestLocations => "FEWEST_LOCATIONS",
    };
    vec![
        ("locationIds", ids),
        ("strategy", Part::Text(strategy)),
        ("allowSplit", Part::Int(allocating.allow_split.into())),
    ]
}

/// The legacy fingerprint of a request that chose no locations; a request
/// that did cannot be a replay of a key written before locations existed,
/// and gets none (an empty text matches no stored fingerprint).
fn legacy_unless_located(allocating: &Allocating, legacy: impl FnOnce() -> String) -> String {
    if allocating.is_default() { legacy() } else { String::new() }
}

/// A user's claim of a key: which request made it, and its order if it placed one.
#[derive(Debug, FromQueryResult)]
struct Claim {
    /// The fingerprint of the request that claimed the key.
    request_fingerprint: String,
    /// The order it placed (`placeOrder`, `checkout`).
    order_id: Option<Uuid>,
    /// The return it made (`returnOrder`).
    return_id: Option<Uuid>,
    /// The delta it applied (`adjustStock`).
    adjusted: Option<i32>,
}

/// The claim of this user's key, if any; `IDEMPOTENCY_KEY_REUSED` when a
/// different request (of any operation) made it. A claim of this request
/// is returned once its first outcome is durable ([`crate::db::durable`]):
/// every replay is answered from it.
async fn claim(db: &DatabaseConnection, user_id: &str, key: &Key) -> Result<Option<Claim>, AppError> {
    let claim = read_answer!(db, |db| Claim::find_by_statement(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT request_fingerprint, order_id, return_id, adjusted FROM idempotency_keys \
         WHERE user_id = $1 AND idempotency_key = $2",
        [user_id.into(), key.key.as_str().into()],
    ))
    .one(db))?;
    match claim {
        Some(claim) if !key.matches(&claim.request_fingerprint) => Err(AppError::IdempotencyKeyReused),
        Some(claim) => {
            crate::db::durable(db).await?;
            Ok(Some(claim))
        }
        None => Ok(None),
    }
}

/// Whether `err` is an index refusing a second use of a key: the key's
/// first request has committed meanwhile, so its outcome can be replayed
/// (or, for another request, refused).
pub fn is_taken(err: &DbErr) -> bool {
    matches!(classify(err), DbFailure::UniqueViolation(Some(index)) if INDEXES.contains(&index.as_str()))
}

/// Whether this user's key was claimed by this very request (an operation
/// that keeps no row of its own beside the key, such as `transferStock`,
/// replays from the claim alone); `IDEMPOTENCY_KEY_REUSED` when a different
/// request claimed it.
pub async fn claimed(db: &DatabaseConnection, user_id: &str, key: &Key) -> Result<bool, AppError> {
    Ok(claim(db, user_id, key).await?.is_some())
}

/// The reservation that first used this user's key, if any;
/// `IDEMPOTENCY_KEY_REUSED` when that was a different request.
pub async fn first_use(db: &DatabaseConnection, user_id: &str, key: &Key) -> Result<Option<ReservationRow>, AppError> {
    if claim(db, user_id, key).await?.is_none() {
        return Ok(None);
    }
    let mine = || Entity::find().filter(Column::UserId.eq(user_id)).filter(Column::IdempotencyKey.eq(&key.key));
    match read_answer!(db, |db| mine().one(db))? {
        Some(first) => Ok(Some(first)),
        // The archive forgot the key between the two reads: a new request.
        None if claim(db, user_id, key).await?.is_none() => Ok(None),
        // Claimed by this very request, so it wrote its reservation in the same statement.
        None => Err(AppError::internal(anyhow::anyhow!("a claimed idempotency key has no reservation"))),
    }
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
    let its_lines = || Entity::find().filter(Column::MultiItemId.eq(multi_item)).order_by_asc(Column::InventoryId);
    let lines = read_answer!(db, |db| its_lines().all(db))?;
    Ok(Some(lines))
}

/// The order placed by the request (`placeOrder`, `checkout`) that first
/// used the key, if any.
pub async fn replay_order(db: &DatabaseConnection, user_id: &str, key: &Key) -> Result<Option<Uuid>, AppError> {
    let Some(claim) = claim(db, user_id, key).await? else { return Ok(None) };
    Ok(Some(claim.order_id.ok_or_else(|| AppError::internal(anyhow::anyhow!("an order key's claim has no order")))?))
}

/// The return made by the `returnOrder` that first used the key, if any.
pub async fn replay_return(db: &DatabaseConnection, user_id: &str, key: &Key) -> Result<Option<Uuid>, AppError> {
    let Some(claim) = claim(db, user_id, key).await? else { return Ok(None) };
    Ok(Some(claim.return_id.ok_or_else(|| AppError::internal(anyhow::anyhow!("a return key's claim has no return")))?))
}

/// The delta applied by the `adjustStock` that first used the key, if any.
pub async fn replay_adjustment(db: &DatabaseConnection, user_id: &str, key: &Key) -> Result<Option<i32>, AppError> {
    let Some(claim) = claim(db, user_id, key).await? else { return Ok(None) };
    let delta =
        claim.adjusted.ok_or_else(|| AppError::internal(anyhow::anyhow!("an adjustment key's claim has no delta")));
    Ok(Some(delta?))
}

#[cfg(test)]
mod tests;
