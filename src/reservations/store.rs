//! SQL for reservations, above all the one-statement `reserve`.

use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, FromQueryResult, QueryFilter,
    QueryOrder, Statement, TransactionTrait, sqlx,
};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::entity::{Column, Entity, Model};
use crate::{
    db::{Attempted, Collisions, DbFailure, StatementPool, classify},
    error::AppError,
    inventory::{InventoryRow, store as inventory_store},
    pagination::{self, Page},
    reservations::batch::{self, Keyed, Line, Purpose, Unavailable, UnavailableReason},
};

/// Every reservation column of `r` as `r_<column>`, so a statement can return
/// an inventory row and a reservation row side by side (read back with the
/// prefix `"r_"`). A macro, because `concat!` takes only literals.
macro_rules! reservation_columns_as_r {
    () => {
        "r.id AS r_id, r.inventory_id AS r_inventory_id, r.order_id AS r_order_id, \
         r.user_id AS r_user_id, r.quantity AS r_quantity, r.status AS r_status, \
         r.idempotency_key AS r_idempotency_key, r.request_fingerprint AS r_request_fingerprint, \
         r.created_at AS r_created_at, r.expires_at AS r_expires_at, r.batch_id AS r_batch_id"
    };
}

/// The unique index that holds one idempotency key per user.
const IDEMPOTENCY_INDEX: &str = "reservations_user_idempotency_key";

/// A checked reservation request.
#[derive(Debug, Clone)]
pub struct ReserveRequest {
    /// The inventory to take from.
    pub inventory_id: Uuid,
    /// Units, already checked against the limits.
    pub quantity: i32,
    /// The version the client saw, for the optimistic check.
    pub expected_version: Option<i32>,
    /// The client's idempotency key.
    pub idempotency_key: Option<String>,
    /// Seconds until the reservation expires; 0 = never.
    pub ttl_secs: i32,
}

impl ReserveRequest {
    /// A hash of everything that makes two requests "the same request", so a
    /// key replayed with other content can be told from a true replay.
    fn fingerprint(&self) -> String {
        let canonical = format!("reserve\n{}\n{}\n{:?}", self.inventory_id, self.quantity, self.expected_version);
        hex::encode(Sha256::digest(canonical.as_bytes()))
    }
}

/// How a reservation request ended.
#[derive(Debug)]
pub enum ReserveOutcome {
    /// Stock was taken (now, or by the first request with this idempotency key).
    Reserved {
        /// The reservation.
        reservation: Model,
        /// The inventory as the reserving statement left it (for a replay: the latest row).
        inventory: InventoryRow,
    },
    /// The row is no longer at the expected version; nothing was taken.
    Conflict {
        /// The version the request expected (or, without one, the last seen).
        expected_version: i32,
        /// The latest committed row.
        inventory: InventoryRow,
    },
    /// Not enough stock; nothing was taken.
    SoldOut {
        /// Units asked for.
        requested: i32,
        /// The latest committed row.
        inventory: InventoryRow,
    },
    /// No inventory has that id.
    InventoryNotFound,
}

/// The one-statement reservation. Parameters: `$1` inventory id, `$2`
/// quantity, `$3` expected version (NULL: none), `$4` the new reservation's
/// id, `$5` user id, `$6` idempotency key, `$7` request fingerprint (both
/// NULL without a key), `$8` TTL in seconds (0: never expires). One row (the
/// inventory as left, then the reservation as `r_*`) when stock was taken.
///
/// 0 rows from `taken` means: no such row, too little stock, or the version
/// moved; one read afterwards tells which. A second request with the same
/// idempotency key fails on the unique index and the whole statement is
/// rolled back, so the stock its UPDATE took is given back.
pub const RESERVE_SQL: &str = concat!(
    r#"
WITH taken AS (
    UPDATE inventories
       SET stock = stock - $2, version = version + 1, updated_at = now()
     WHERE id = $1 AND stock >= $2 AND ($3::integer IS NULL OR version = $3)
 RETURNING id, sku, name, stock, version, created_at, updated_at
), reservation AS (
    INSERT INTO reservations
           (id, inventory_id, user_id, quantity, status, idempotency_key, request_fingerprint, expires_at)
    SELECT $4, id, $5, $2, 'ACTIVE', $6, $7,
           CASE WHEN $8::integer > 0 THEN now() + $8::integer * interval '1 second' END
      FROM taken
 RETURNING *
), movement AS (
    INSERT INTO stock_movements (inventory_id, delta, reason, stock_after, version_after, reservation_id)
    SELECT id, -$2, 'RESERVED', stock, version, $4 FROM taken
)
SELECT taken.*, "#,
    reservation_columns_as_r!(),
    " FROM taken, reservation r"
);

/// Takes `quantity` units for `user_id`, in one statement.
///
/// The decision is the UPDATE's own WHERE (`stock >= qty`, and `version =
/// expected` when given), never an earlier SELECT, so two requests can never
/// both see the last unit. The reservation and its ledger entry are written by
/// the same statement, so a reservation exists exactly when stock was taken.
pub async fn reserve(
    db: &DatabaseConnection,
    statements: &StatementPool,
    collisions: &Collisions,
    user_id: &str,
    request: &ReserveRequest,
) -> Result<ReserveOutcome, AppError> {
    let fingerprint = request.idempotency_key.as_ref().map(|_| request.fingerprint());
    let reservation_id = Uuid::new_v4();
    let run = || {
        statements.fetch_optional(
            sqlx::query(RESERVE_SQL)
                .bind(request.inventory_id)
                .bind(request.quantity)
                .bind(request.expected_version)
                .bind(reservation_id)
                .bind(user_id)
                .bind(request.idempotency_key.as_deref())
                .bind(fingerprint.as_deref())
                .bind(request.ttl_secs),
        )
    };
    let attempted = match collisions.run(request.inventory_id, run).await {
        Ok(attempted) => attempted,
        Err(err) if is_key_taken(&err) => {
            // The key was used first by a request that has committed.
            return replay(db, user_id, request, fingerprint.as_deref()).await?.ok_or(AppError::Internal);
        }
        Err(err) => return Err(err.into()),
    };

    if let Attempted::Done(Some(row)) = &attempted {
        return Ok(ReserveOutcome::Reserved {
            reservation: Model::from_query_result(row, "r_")?,
            inventory: InventoryRow::from_query_result(row, "")?,
        });
    }
    // Nothing taken. A replay of a request that did take stock must return
    // that first outcome, not a `Conflict` with its own old version.
    if let Some(outcome) = replay(db, user_id, request, fingerprint.as_deref()).await? {
        return Ok(outcome);
    }
    let Some(inventory) = inventory_store::find(db, request.inventory_id).await? else {
        return Ok(ReserveOutcome::InventoryNotFound);
    };
    Ok(match (attempted, request.expected_version) {
        (Attempted::Done(_), _) if inventory.stock < request.quantity => {
            ReserveOutcome::SoldOut { requested: request.quantity, inventory }
        }
        (Attempted::Done(_), Some(expected_version)) => ReserveOutcome::Conflict { expected_version, inventory },
        // Enough stock and no version asked for, yet nothing taken: only a
        // change between the statement and this read can do that, so the
        // reservation is decided as of the statement: sold out.
        (Attempted::Done(_), None) => ReserveOutcome::SoldOut { requested: request.quantity, inventory },
        (Attempted::Exhausted { attempts }, expected) => {
            tracing::warn!(attempts, inventory_id = %request.inventory_id, "reserve collisions exhausted");
            ReserveOutcome::Conflict { expected_version: expected.unwrap_or(inventory.version), inventory }
        }
    })
}

/// The first outcome of a single `reserve` with this user's idempotency key,
/// if one took stock; `IDEMPOTENCY_KEY_REUSED` when that was a different request.
async fn replay(
    db: &DatabaseConnection,
    user_id: &str,
    request: &ReserveRequest,
    fingerprint: Option<&str>,
) -> Result<Option<ReserveOutcome>, AppError> {
    let (Some(key), Some(fingerprint)) = (&request.idempotency_key, fingerprint) else {
        return Ok(None);
    };
    let Some(first) = first_with_key(db, user_id, key, fingerprint).await? else {
        return Ok(None);
    };
    let inventory = inventory_store::find(db, first.inventory_id).await?.ok_or(AppError::Internal)?;
    Ok(Some(ReserveOutcome::Reserved { reservation: first, inventory }))
}

/// The reservation that first used this user's idempotency key, if any.
/// Reservations, batches and orders share one key space per user, so a key
/// reused with anything but the same request is `IDEMPOTENCY_KEY_REUSED`.
pub async fn first_with_key(
    db: &DatabaseConnection,
    user_id: &str,
    key: &str,
    fingerprint: &str,
) -> Result<Option<Model>, AppError> {
    let first =
        Entity::find().filter(Column::UserId.eq(user_id)).filter(Column::IdempotencyKey.eq(key)).one(db).await?;
    match first {
        Some(first) if first.request_fingerprint.as_deref() != Some(fingerprint) => Err(AppError::IdempotencyKeyReused),
        first => Ok(first),
    }
}

/// Whether `err` is the idempotency index refusing a second use of a key.
pub fn is_key_taken(err: &DbErr) -> bool {
    classify(err) == DbFailure::UniqueViolation(Some(IDEMPOTENCY_INDEX.into()))
}

/// One reservation by id.
pub async fn find(db: &impl ConnectionTrait, id: Uuid) -> Result<Option<Model>, DbErr> {
    Entity::find_by_id(id).one(db).await
}

/// The reservations with these ids (missing ones are left out).
pub async fn find_many(db: &impl ConnectionTrait, ids: &[Uuid]) -> Result<Vec<Model>, DbErr> {
    Entity::find().filter(Column::Id.is_in(ids.iter().copied())).all(db).await
}

/// One page of a user's reservations in `(created_at, id)` order, with one
/// extra row when more follow.
pub async fn page_for_user(db: &DatabaseConnection, user_id: &str, page: Page) -> Result<Vec<Model>, DbErr> {
    pagination::keyset(Entity::find().filter(Column::UserId.eq(user_id)), Column::CreatedAt, Column::Id, page)
        .all(db)
        .await
}

/// How a multi-item reservation ended.
#[derive(Debug)]
pub enum ReserveManyOutcome {
    /// Every line was reserved (now, or by the first request with this key).
    ReservedAll(Vec<Model>),
    /// Nothing was reserved; the lines that could not be served.
    ItemsUnavailable(Vec<Unavailable>),
}

/// Reserves every line or none (see [`batch`]).
pub async fn reserve_many(
    db: &DatabaseConnection,
    collisions: &Collisions,
    user_id: &str,
    lines: &[Line],
    idempotency_key: Option<String>,
    ttl_secs: i32,
) -> Result<ReserveManyOutcome, AppError> {
    let keyed = idempotency_key.map(|key| Keyed { fingerprint: batch::fingerprint("reserveMany", lines, ""), key });
    if let Some(first) = replay_batch(db, user_id, keyed.as_ref()).await? {
        return Ok(ReserveManyOutcome::ReservedAll(first));
    }
    let run = || async {
        let txn = db.begin().await?;
        let taken = batch::take(&txn, user_id, lines, Purpose::Reservations { ttl_secs }, keyed.as_ref()).await?;
        if taken.is_ok() {
            txn.commit().await?;
        }
        Ok(taken)
    };
    match collisions.run(lines[0].inventory_id, run).await {
        Ok(Attempted::Done(Ok(rows))) => Ok(ReserveManyOutcome::ReservedAll(rows)),
        Ok(Attempted::Done(Err(unavailable))) => Ok(ReserveManyOutcome::ItemsUnavailable(unavailable)),
        Ok(Attempted::Exhausted { .. }) => Ok(ReserveManyOutcome::ItemsUnavailable(all_in_conflict(db, lines).await?)),
        // The key's first request committed while this one waited.
        Err(err) if is_key_taken(&err) => replay_batch(db, user_id, keyed.as_ref())
            .await?
            .map(ReserveManyOutcome::ReservedAll)
            .ok_or(AppError::Internal),
        Err(err) => Err(err.into()),
    }
}

/// The reservations of the batch that first used this key, if any.
async fn replay_batch(
    db: &DatabaseConnection,
    user_id: &str,
    keyed: Option<&Keyed>,
) -> Result<Option<Vec<Model>>, AppError> {
    let Some(keyed) = keyed else { return Ok(None) };
    let Some(first) = first_with_key(db, user_id, &keyed.key, &keyed.fingerprint).await? else {
        return Ok(None);
    };
    let batch = first.batch_id.ok_or(AppError::Internal)?;
    Ok(Some(Entity::find().filter(Column::BatchId.eq(batch)).order_by_asc(Column::InventoryId).all(db).await?))
}

/// Every line as a conflict, with the latest rows: what a request reports
/// when each of its runs collided.
pub async fn all_in_conflict(db: &DatabaseConnection, lines: &[Line]) -> Result<Vec<Unavailable>, AppError> {
    tracing::warn!(lines = lines.len(), "multi-item collisions exhausted");
    let rows = inventory_store::find_many(db, lines.iter().map(|l| l.inventory_id)).await?;
    Ok(lines
        .iter()
        .map(|line| {
            let inventory = rows.iter().find(|row| row.id == line.inventory_id).cloned();
            let reason = if inventory.is_some() { UnavailableReason::Conflict } else { UnavailableReason::NotFound };
            Unavailable { inventory_id: line.inventory_id, reason, inventory }
        })
        .collect())
}

/// How a release ended.
#[derive(Debug)]
pub enum ReleaseOutcome {
    /// The stock went back; the reservation and inventory as the statement left them.
    Released {
        /// The reservation, now RELEASED.
        reservation: Model,
        /// The inventory after the stock came back.
        inventory: InventoryRow,
    },
    /// No such reservation visible to the caller.
    NotFound,
    /// Visible, but no longer ACTIVE (released, expired or an order line).
    NotActive(Model),
}

/// Gives an ACTIVE, unexpired reservation of `owner`'s stock back, once: the
/// conditions are in the UPDATE's WHERE, so of many concurrent releases exactly
/// one matches, and an expired one is left to the sweeper.
pub async fn release(
    db: &DatabaseConnection,
    collisions: &Collisions,
    id: Uuid,
    owner: &str,
) -> Result<ReleaseOutcome, AppError> {
    // 0 rows: not there, not the caller's, or not ACTIVE any more (a
    // concurrent release won, or it expired); one read afterwards tells which.
    const SQL: &str = concat!(
        r#"
WITH released AS (
    UPDATE reservations SET status = 'RELEASED'
     WHERE id = $1 AND status = 'ACTIVE' AND user_id = $2 AND (expires_at IS NULL OR expires_at > now())
 RETURNING *
), returned AS (
    UPDATE inventories i
       SET stock = i.stock + r.quantity, version = i.version + 1, updated_at = now()
      FROM released r
     WHERE i.id = r.inventory_id
 RETURNING i.id, i.sku, i.name, i.stock, i.version, i.created_at, i.updated_at, r.quantity
), movement AS (
    INSERT INTO stock_movements (inventory_id, delta, reason, stock_after, version_after, reservation_id)
    SELECT id, quantity, 'RELEASED', stock, version, $1 FROM returned
)
SELECT returned.*, "#,
        reservation_columns_as_r!(),
        " FROM returned, released r"
    );
    let values = [id.into(), owner.into()];
    let run = || db.query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, SQL, values.clone()));
    if let Attempted::Done(Some(row)) = collisions.run(id, run).await? {
        return Ok(ReleaseOutcome::Released {
            reservation: Model::from_query_result(&row, "r_")?,
            inventory: InventoryRow::from_query_result(&row, "")?,
        });
    }
    Ok(match find(db, id).await?.filter(|r| r.user_id == owner) {
        None => ReleaseOutcome::NotFound,
        Some(reservation) => ReleaseOutcome::NotActive(reservation),
    })
}

/// How an extension ended.
#[derive(Debug)]
pub enum ExtendOutcome {
    /// The new expiry is saved.
    Extended(Model),
    /// No such reservation of the caller's.
    NotFound,
    /// Not ACTIVE any more (released, expired or an order line).
    NotActive(Model),
}

/// Moves an ACTIVE, unexpired reservation's expiry `seconds` later, but never
/// past `max_ttl_secs` from now. A reservation that never expires stays so.
pub async fn extend(
    db: &DatabaseConnection,
    id: Uuid,
    owner: &str,
    seconds: i32,
    max_ttl_secs: i32,
) -> Result<ExtendOutcome, AppError> {
    // The expiry condition is in the WHERE, so a reservation the sweeper has
    // claimed (or that ran out a moment ago) is not revived.
    const SQL: &str = r#"
UPDATE reservations
   SET expires_at = CASE WHEN expires_at IS NOT NULL
       THEN least(expires_at + $3::integer * interval '1 second', now() + $4::integer * interval '1 second') END
 WHERE id = $1 AND user_id = $2 AND status = 'ACTIVE' AND (expires_at IS NULL OR expires_at > now())
RETURNING *"#;
    let stmt = Statement::from_sql_and_values(
        DbBackend::Postgres,
        SQL,
        [id.into(), owner.into(), seconds.into(), max_ttl_secs.into()],
    );
    if let Some(extended) = Model::find_by_statement(stmt).one(db).await? {
        return Ok(ExtendOutcome::Extended(extended));
    }
    Ok(match find(db, id).await?.filter(|r| r.user_id == owner) {
        None => ExtendOutcome::NotFound,
        Some(reservation) => ExtendOutcome::NotActive(reservation),
    })
}
