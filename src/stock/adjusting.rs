//! Adjusting a hold: a cart line's quantity changes in place.

use std::sync::LazyLock;

use sea_orm::{DbBackend, Statement};
use uuid::Uuid;

use super::{
    fragments::{LEDGER, active_unexpired, inventory_columns, reservation_columns_as_r, step},
    rows::{MovementReason, sql},
};

/// Changes an ACTIVE, unexpired reservation of `owner`'s to `quantity`
/// units in one statement: more takes the difference from the inventory with
/// the conditional decrement, fewer gives the difference back. One change of
/// the inventory (version + 1) with one QUANTITY_CHANGED ledger row whose
/// delta is the change of available stock. One row (read with
/// `ReservationChange::from_row`) when it changed.
///
/// This locks the reservation for the statement (`line`), so two changes of
/// one line apply one after the other, each to the quantity the other left;
/// the sweeper skips a locked line, and a line it holds (or released,
/// checked out or expired) no longer matches. The stock condition is in the
/// inventory UPDATE's WHERE, so concurrent takers never overdraw. 0 rows:
/// not there, not the caller's, not ACTIVE, expired, already at `quantity`,
/// or too little stock for the difference; one read afterwards tells which.
pub fn change_quantity(reservation_id: Uuid, owner: &str, quantity: i32) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH line AS (
    SELECT id, inventory_id, quantity FROM reservations
     WHERE id = $1 AND user_id = $2 AND {active_unexpired}
       FOR UPDATE
), changed AS (
    UPDATE inventories i
       {set}
      FROM line l
     WHERE i.id = l.inventory_id AND l.quantity <> $3::integer AND i.stock >= $3::integer - l.quantity
 RETURNING {columns}, l.quantity AS held
), resized AS (
    UPDATE reservations r SET quantity = $3::integer
      FROM changed c
     WHERE r.id = $1
 RETURNING r.*
), movement AS (
    {LEDGER}
    SELECT id, held - $3::integer, {reason}, stock, version, $1, NULL FROM changed
)
SELECT changed.*, {reservation} FROM changed, resized r"#,
            active_unexpired = active_unexpired(),
            reason = sql(MovementReason::QuantityChanged),
            set = step("i.", "- ($3::integer - l.quantity)"),
            columns = inventory_columns("i."),
            reservation = reservation_columns_as_r(),
        )
    });
    Statement::from_sql_and_values(
        DbBackend::Postgres,
        SQL.as_str(),
        [reservation_id.into(), owner.into(), quantity.into()],
    )
}
