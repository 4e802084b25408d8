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
//! explicit byte encoding of the request ([`Part`]), written in
//! `fingerprint.rs` and pinned by its tests, never a text the toolchain makes. A stored
//! fingerprint is `v2:` and the hex SHA-256 of that encoding.
//!
//! Keys stored before the encoding existed hold the bare hex SHA-256 of a
//! text made with Rust's `Debug` (`legacy.rs`). A replay of such a key is
//! matched against that text, so it still gets its first outcome; a key is
//! matched by the scheme its stored fingerprint names, never by both. The
//! legacy scheme stays while `SELECT count(*) FROM idempotency_keys WHERE
//! request_fingerprint NOT LIKE 'v2:%'` is above zero; once it is zero, or
//! `stockguard archive` has forgotten every key older than the encoding,
//! `legacy.rs` can go.
//!
//! Keys follow the archive's retention: `stockguard archive --older-than`
//! forgets the keys claimed before its cutoff (at least a day ago, so a key
//! is remembered for at least 24 h), each whole in one statement
//! (`stock::archiving::forget_keys`). The same key is then a new request.

use sea_orm::{
    ColumnTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, FromQueryResult, QueryFilter, QueryOrder, Statement,
};
use uuid::Uuid;

pub(crate) use self::fingerprint::{Extra, Key, Part};
use crate::{
    db::{DbFailure, classify, read_answer},
    error::AppError,
    stock::rows::{
        ReservationRow,
        reservation::{Column, Entity},
    },
};

mod fingerprint;
mod legacy;

/// The unique indexes that refuse a second use of a user's key: the key
/// space itself, and the reservations' own (which a second `reserve` of the
/// same key meets first).
const INDEXES: [&str; 2] = ["idempotency_keys_pkey", "reservations_user_idempotency_key"];

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
pub(crate) fn is_taken(err: &DbErr) -> bool {
    matches!(classify(err), DbFailure::UniqueViolation(Some(index)) if INDEXES.contains(&index.as_str()))
}

/// Whether this user's key was claimed by this very request (an operation
/// that keeps no row of its own beside the key, such as `transferStock`,
/// replays from the claim alone); `IDEMPOTENCY_KEY_REUSED` when a different
/// request claimed it.
pub(crate) async fn claimed(db: &DatabaseConnection, user_id: &str, key: &Key) -> Result<bool, AppError> {
    Ok(claim(db, user_id, key).await?.is_some())
}

/// The reservation that first used this user's key, if any;
/// `IDEMPOTENCY_KEY_REUSED` when that was a different request.
pub(crate) async fn first_use(
    db: &DatabaseConnection,
    user_id: &str,
    key: &Key,
) -> Result<Option<ReservationRow>, AppError> {
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
pub(crate) async fn replay_multi_item(
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
pub(crate) async fn replay_order(db: &DatabaseConnection, user_id: &str, key: &Key) -> Result<Option<Uuid>, AppError> {
    let Some(claim) = claim(db, user_id, key).await? else { return Ok(None) };
    Ok(Some(claim.order_id.ok_or_else(|| AppError::internal(anyhow::anyhow!("an order key's claim has no order")))?))
}

/// The return made by the `returnOrder` that first used the key, if any.
pub(crate) async fn replay_return(db: &DatabaseConnection, user_id: &str, key: &Key) -> Result<Option<Uuid>, AppError> {
    let Some(claim) = claim(db, user_id, key).await? else { return Ok(None) };
    Ok(Some(claim.return_id.ok_or_else(|| AppError::internal(anyhow::anyhow!("a return key's claim has no return")))?))
}

/// The delta applied by the `adjustStock` that first used the key, if any.
pub(crate) async fn replay_adjustment(
    db: &DatabaseConnection,
    user_id: &str,
    key: &Key,
) -> Result<Option<i32>, AppError> {
    let Some(claim) = claim(db, user_id, key).await? else { return Ok(None) };
    let delta =
        claim.adjusted.ok_or_else(|| AppError::internal(anyhow::anyhow!("an adjustment key's claim has no delta")));
    Ok(Some(delta?))
}
