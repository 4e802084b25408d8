//! Giving stock back: a release, the sweeper's expiry of due reservations,
//! and the lines of a cancelled order.

use std::sync::LazyLock;

use sea_orm::{DbBackend, Statement};
use uuid::Uuid;

use super::{
    fragments::{
        Ids, Lines, active_unexpired, inventory_columns, lock_inventories, order_lines, per_line,
        reservation_columns_as_r,
    },
    rows::{MovementReason, ReservationStatus, sql},
};

/// Gives an ACTIVE, unexpired reservation of `owner`'s stock back, once,
/// each unit to the location that gave it: the conditions are in the
/// UPDATE's WHERE, so of many concurrent releases exactly one matches, and
/// an expired one is left to the sweeper. One row (read with
/// `ReservationChange::from_row`) when it was released; 0 rows: not there,
/// not the caller's, or not ACTIVE any more (a concurrent release won, or it
/// expired), which one read afterwards tells apart.
pub fn release(reservation_id: Uuid, owner: &str) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH released AS (
    UPDATE reservations SET status = {released}
     WHERE id = $1 AND user_id = $2 AND {active_unexpired} AND kit_reservation_id IS NULL
 RETURNING *
), {returned}
SELECT {columns}, {reservation} FROM changed c, released r"#,
            released = sql(ReservationStatus::Released),
            active_unexpired = active_unexpired(),
            returned = per_line("released", Lines::Return, MovementReason::Released, "NULL", false),
            columns = inventory_columns("c."),
            reservation = reservation_columns_as_r(),
        )
    });
    Statement::from_sql_and_values(DbBackend::Postgres, SQL.as_str(), [reservation_id.into(), owner.into()])
}

/// Expires at most `limit` due reservations; one row, how many it expired.
///
/// Rows another sweeper (or a release, an extension, a checkout or a change
/// of quantity) holds are skipped, not waited for: they are either being
/// handled or no longer due. A kit reservation's components expire
/// together: the sweep claims due kit reservations by their own row (every
/// statement that changes a kit's components locks it first,
/// `super::kitting`), skipping those another holds, and expires every
/// ACTIVE component of each at once, whatever the limit, so no reader
/// sees a kit half expired. Their inventories are locked in id order
/// (`locked`), the order every multi-item writer locks in, so a sweep and an
/// order (or another sweep) wait for each other instead of deadlocking. Each
/// expiry is its own change of its inventory: the version grows by the number
/// of expired reservations, and each gets its ledger row with the running
/// stock and version.
///
/// The due kits' components are found through the partial index of
/// `kit_reservation_id` and added to the due reservations (`UNION ALL`):
/// an `OR` of the two in the UPDATE's WHERE can only be answered by
/// scanning every reservation, and on 10 million rows of history every
/// sweep ran into the statement timeout (tests/api/plans.rs). The
/// conditions are repeated on the row updated, so that at READ COMMITTED a
/// component a release changed after the statement's snapshot is judged
/// as it is now (PostgreSQL re-checks the UPDATE's own conditions on the
/// newest row, not a subquery's), and its units come back once.
///
/// The limit is written into the text, not bound: with `LIMIT $1` the
/// generic plan is costed for an unknown limit, PostgreSQL judges it dearer
/// than a plan for the actual one and plans the whole statement again on
/// every sweep, which costs more than the sweep
/// (bench/results/decisions.md#plans-made-once).
/// A process sweeps with one limit, so this is still one prepared statement.
pub fn sweep(limit: i64) -> Statement {
    Statement::from_string(
        DbBackend::Postgres,
        format!(
            r#"
WITH due AS (
    SELECT id FROM reservations
     WHERE status = {active} AND expires_at <= now() AND kit_reservation_id IS NULL
     ORDER BY expires_at
     LIMIT {limit}
       FOR UPDATE SKIP LOCKED
), due_kits AS MATERIALIZED (
    SELECT id FROM kit_reservations
     WHERE id IN (SELECT kit_reservation_id FROM reservations
                   WHERE status = {active} AND expires_at <= now() AND kit_reservation_id IS NOT NULL
                   ORDER BY expires_at
                   LIMIT {limit})
     ORDER BY id
       FOR UPDATE SKIP LOCKED
), expired AS (
    UPDATE reservations r SET status = {expired}
     WHERE r.id IN (SELECT id FROM due
                    UNION ALL
                    SELECT c.id FROM reservations c
                     WHERE c.kit_reservation_id = ANY (ARRAY(SELECT id FROM due_kits))
                       AND c.status = {active} AND c.expires_at <= now())
       AND r.status = {active} AND r.expires_at <= now()
 RETURNING r.id, r.inventory_id, r.quantity, r.kit_reservation_id
), locked AS MATERIALIZED (
    {locked}
), {returned}
SELECT count(*) FROM expired"#,
            active = sql(ReservationStatus::Active),
            expired = sql(ReservationStatus::Expired),
            locked = lock_inventories("id", Ids::Query("SELECT inventory_id FROM expired"), None),
            returned = per_line("expired", Lines::Return, MovementReason::Expired, "NULL", true),
        ),
    )
}

/// Gives back the stock of a cancelled order's lines: the lines turn
/// RELEASED and each inventory and the ledger change in one statement, one
/// change per line (an order checked out of a cart may hold two lines of one
/// inventory). Only ORDERED lines match, so stock can come back once per
/// line. Run after [`super::lock_order`], in the cancelling transaction.
pub fn cancel_order(order_id: Uuid) -> Statement {
    static SQL: LazyLock<String> =
        LazyLock::new(|| order_lines(ReservationStatus::Released, Lines::Return, MovementReason::OrderCancelled));
    Statement::from_sql_and_values(DbBackend::Postgres, SQL.as_str(), [order_id.into()])
}
