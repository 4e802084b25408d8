//! SQL for reservations: running the stock statements that take and give
//! back a reservation's stock (re-run on collisions), extending an expiry,
//! and reading reservations. Nothing here decides what a result means;
//! `service.rs` does.

use std::sync::LazyLock;

use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, EntityTrait,
    FromQueryResult, QueryFilter, Select, Statement,
};
use uuid::Uuid;

use super::domain::Taking;
use crate::{
    db::{Attempted, Collisions, StatementPool},
    idempotency::Key,
    pagination::{self, Page},
    stock::{
        adjusting,
        allocating::{self, Allocating},
        coalesced::{CoalescedReserve, Turn},
        fragments,
        lines::{self, Line, LockedLine, Purpose},
        returning,
        rows::{
            AllocationRow, allocation,
            reservation::{Column, Entity, Model},
        },
        taking::{ReservationChange, Reserve},
    },
};

/// Runs the one-statement reservation on the statement pool (one round
/// trip), re-run on collisions; the change when stock was taken.
pub(crate) async fn reserve(
    statements: &StatementPool,
    collisions: &Collisions,
    reserve: &Reserve<'_>,
) -> Result<Attempted<Option<ReservationChange>>, DbErr> {
    let run = || async {
        statements
            .fetch_optional("reserve", reserve.query())
            .await?
            .as_ref()
            .map(ReservationChange::from_row)
            .transpose()
    };
    collisions.run(reserve.inventory_id, run).await
}

/// Runs the one-statement reservation across the inventory's levels on
/// the statement pool, re-run on collisions; the change when stock was taken.
pub(crate) async fn reserve_allocating(
    statements: &StatementPool,
    collisions: &Collisions,
    reserve: &Reserve<'_>,
) -> Result<Attempted<Option<ReservationChange>>, DbErr> {
    let run = || async {
        let row = statements.fetch_optional("reserve across locations", reserve.allocating_query()).await?;
        row.as_ref().map(ReservationChange::from_row).transpose()
    };
    collisions.run(reserve.inventory_id, run).await
}

/// What the locations a request may take from offer it (their sellable
/// units, or with `use_safety` all of them: their sum, or without a split
/// the largest), read after it could not be served.
pub async fn available(
    db: &impl ConnectionTrait,
    inventory_id: Uuid,
    allocating: &Allocating,
    use_safety: bool,
) -> Result<i32, DbErr> {
    let row = db.query_one_raw(allocating::available(inventory_id, allocating, use_safety)).await?;
    Ok(row.map(|row| row.try_get("", "available")).transpose()?.unwrap_or(0))
}

/// What the locations `reservation` may take more from offer it: by its
/// own choice, and without a split only where it already is; never their
/// safety stock (a quantity increase is a customer's path, whoever holds
/// the reservation).
pub async fn available_for_more(db: &impl ConnectionTrait, reservation: &Model) -> Result<i32, DbErr> {
    let mut choice =
        Allocating::stored(reservation.location_ids.clone(), reservation.fewest_locations, reservation.allow_split);
    if !choice.allow_split {
        let held =
            allocation::Entity::find().filter(allocation::Column::ReservationId.eq(reservation.id)).all(db).await?;
        let held: Vec<Uuid> = held.into_iter().map(|a: AllocationRow| a.location_id).collect();
        choice.location_ids = Some(match choice.location_ids {
            Some(ids) => ids.into_iter().filter(|id| held.contains(id)).collect(),
            None => held,
        });
    }
    available(db, reservation.inventory_id, &choice, false).await
}

/// Runs one coalesced statement for several callers (of one inventory or
/// many), re-run on collisions; one turn per caller, in arrival order.
pub(crate) async fn reserve_coalesced(
    statements: &StatementPool,
    collisions: &Collisions,
    reserve: &CoalescedReserve<'_>,
) -> Result<Attempted<Vec<Turn>>, DbErr> {
    let run = || async {
        statements.fetch_all("reserve coalesced", reserve.query()).await?.iter().map(Turn::from_row).collect()
    };
    let key = reserve.inventory_ids.first().copied().unwrap_or_default();
    collisions.run(key, run).await
}

/// Locks the inventories of a multi-item request's `lines` (sorted by id)
/// in id order, then their levels, for the rest of `txn`; each line's
/// locked row and whether its locations can give it (a missing one is
/// left out).
pub(crate) async fn lock_lines(txn: &DatabaseTransaction, lines: &[Line]) -> Result<Vec<LockedLine>, DbErr> {
    txn.query_all_raw(lines::lock_lines(lines)).await?.iter().map(LockedLine::from_row).collect()
}

/// Takes the stock of every line of `taking` for `purpose` in one statement
/// inside `txn`, after [`lock_lines`]: the reservations (one per part),
/// the kit reservations, and their ledger rows, the first part carrying
/// `key`. The reservations, ordered by inventory id.
pub(crate) async fn take_lines(
    txn: &DatabaseTransaction,
    user_id: &str,
    taking: &Taking,
    purpose: Purpose,
    key: Option<&Key>,
) -> Result<Vec<Model>, DbErr> {
    let key = key.map(|k| (k.key.as_str(), k.fingerprint.as_str()));
    let Taking { lines, parts, kits, .. } = taking;
    let statement = lines::take_lines(lines, parts, kits, purpose, user_id, key, Uuid::new_v4());
    Model::find_by_statement(statement).all(txn).await
}

/// Runs the release of `owner`'s reservation, re-run on collisions; the
/// change when its stock went back.
pub(crate) async fn release(
    db: &DatabaseConnection,
    collisions: &Collisions,
    id: Uuid,
    owner: &str,
) -> Result<Attempted<Option<ReservationChange>>, DbErr> {
    let run = || async {
        db.query_one_raw(returning::release(id, owner)).await?.as_ref().map(ReservationChange::from_row).transpose()
    };
    collisions.run(id, run).await
}

/// Runs the change of `owner`'s reservation to `quantity` units, re-run on
/// collisions; the change when it was made.
pub(crate) async fn change_quantity(
    db: &DatabaseConnection,
    collisions: &Collisions,
    id: Uuid,
    owner: &str,
    quantity: i32,
) -> Result<Attempted<Option<ReservationChange>>, DbErr> {
    let run = || async {
        let row = db.query_one_raw(adjusting::change_quantity(id, owner, quantity)).await?;
        row.as_ref().map(ReservationChange::from_row).transpose()
    };
    collisions.run(id, run).await
}

/// Moves an ACTIVE, unexpired reservation's expiry `seconds` later, but never
/// past `max_ttl_secs` from now; a reservation that never expires stays so.
/// The reservation as saved, or none when nothing matched; re-run on
/// collisions (a checkout or a change of the same line at REPEATABLE READ
/// or SERIALIZABLE).
pub(crate) async fn extend(
    db: &DatabaseConnection,
    collisions: &Collisions,
    id: Uuid,
    owner: &str,
    seconds: i32,
    max_ttl_secs: i32,
) -> Result<Attempted<Option<Model>>, DbErr> {
    // The expiry condition is in the WHERE, so a reservation the sweeper has
    // claimed (or that ran out a moment ago) is not revived; 0 rows: not the
    // caller's, not ACTIVE, or expired.
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
UPDATE reservations
   SET expires_at = CASE WHEN expires_at IS NOT NULL
       THEN least(expires_at + $3::integer * interval '1 second', now() + $4::integer * interval '1 second') END
 WHERE id = $1 AND user_id = $2 AND {active_unexpired} AND kit_reservation_id IS NULL
RETURNING *"#,
            active_unexpired = fragments::active_unexpired(),
        )
    });
    let run = || {
        let values = [id.into(), owner.into(), seconds.into(), max_ttl_secs.into()];
        Model::find_by_statement(Statement::from_sql_and_values(DbBackend::Postgres, SQL.as_str(), values)).one(db)
    };
    collisions.run(id, run).await
}

/// One reservation and its inventory by the reservation's id, in one read.
pub(crate) async fn find_with_inventory(
    db: &impl ConnectionTrait,
    id: Uuid,
) -> Result<Option<ReservationChange>, DbErr> {
    db.query_one_raw(ReservationChange::latest(id)).await?.as_ref().map(ReservationChange::from_row).transpose()
}

/// One reservation by id.
pub(crate) async fn find(db: &impl ConnectionTrait, id: Uuid) -> Result<Option<Model>, DbErr> {
    Entity::find_by_id(id).one(db).await
}

/// The reservations with these ids (missing ones are left out).
pub(crate) async fn find_many(db: &impl ConnectionTrait, ids: &[Uuid]) -> Result<Vec<Model>, DbErr> {
    Entity::find().filter(Column::Id.is_in(ids.iter().copied())).all(db).await
}

/// One page of a user's reservations in `(created_at, id)` order, with one
/// extra row when more follow.
pub async fn page_for_user(db: &DatabaseConnection, user_id: &str, page: Page) -> Result<Vec<Model>, DbErr> {
    page_query(user_id, page).all(db).await
}

/// The query of [`page_for_user`].
pub fn page_query(user_id: &str, page: Page) -> Select<Entity> {
    pagination::keyset(Entity::find().filter(Column::UserId.eq(user_id)), Column::CreatedAt, Column::Id, page)
}
