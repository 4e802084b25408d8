//! Shipping: the lines of a fulfilled order leave the warehouse.

use std::sync::LazyLock;

use sea_orm::{DbBackend, Statement};
use uuid::Uuid;

use super::{
    fragments::{Lines, order_lines},
    rows::{MovementReason, ReservationStatus},
};

/// Ships a fulfilled order's lines: they turn FULFILLED, and each is one
/// change of its inventory that leaves available stock as it is (the units
/// were taken when the line was reserved or ordered) and takes them out of
/// on hand: the version grows by one per line, and each line gets a
/// FULFILLED ledger row with delta −quantity and the unchanged stock. Only
/// ORDERED lines match, so a line ships once. Run after
/// [`super::lock_order`], in the fulfilling transaction; one row, how many
/// lines shipped.
pub fn fulfil_order(order_id: Uuid) -> Statement {
    static SQL: LazyLock<String> =
        LazyLock::new(|| order_lines(ReservationStatus::Fulfilled, Lines::Ship, MovementReason::Fulfilled));
    Statement::from_sql_and_values(DbBackend::Postgres, SQL.as_str(), [order_id.into()])
}
