//! The one module that changes stock. Every statement that changes an
//! inventory is built here: taking stock for reservations ([`taking`]),
//! for coalesced callers ([`coalesced`]) and for order lines ([`lines`]),
//! giving it back on release, expiry and cancel ([`returning`]), receiving it on create and restock ([`receiving`]),
//! changing a held quantity ([`adjusting`]), an operator's adjustment of a
//! level and its safety stock ([`correcting`]), shipping an order's lines
//! out of the warehouse ([`shipping`]), taking back what a fulfilled order
//! returns ([`taking_back`]), folding old ledger rows into
//! checkpoints ([`archiving`]), and keeping the ledger's day partitions
//! ready ([`partitions`]).
//!
//! They are built from the same fragments, so docs/design.md's rule has one
//! home: a change of an inventory is one version step (`version + 1` per
//! change, `updated_at = now()`) and one ledger row (`INSERT INTO
//! stock_movements`) written by the same statement, and a statement that
//! returns the inventory returns the columns an `InventoryRow` reads.
//! Features take a ready statement (its SQL and bind values) from here and
//! run it; no other module writes `inventories`' stock or the ledger. The
//! rows these statements return and the statuses they write are here too
//! ([`rows`]), with the conditions and sums that reads and the invariant
//! share with them ([`fragments`]), so no status is spelled twice.
//!
//! The lock order that keeps them from deadlocking (inventory rows in id
//! order, then their levels) has one home too: every statement that locks
//! inventories or levels is built from [`fragments::lock_inventories`] and
//! [`fragments::lock_levels`].

pub(crate) mod adjusting;
pub mod allocating;
pub(crate) mod archiving;
pub mod coalesced;
pub(crate) mod correcting;
pub mod fragments;
/// Public for the benchmark's KIT cells (examples/bench), whose limit is
/// [`kitting::reserve_kit`] run on its own connections.
pub mod kitting;
pub mod lines;
pub mod moving;
pub mod partitions;
pub mod receiving;
pub mod returning;
pub mod rows;
pub mod shipping;
pub mod taking;
pub mod taking_back;

use std::sync::LazyLock;

use sea_orm::{DbBackend, Statement};
use uuid::Uuid;

pub use coalesced::{ACROSS_LEVELS_RESERVE_SQL, COALESCED_RESERVE_SQL, DISTINCT_RESERVE_SQL};
pub use taking::RESERVE_SQL;

/// This locks the inventories of an order's lines in id order, the order
/// every multi-item writer (and the sweeper) locks in, so a cancel or a
/// fulfilment and a `placeOrder` cannot deadlock. Run inside the cancelling
/// or fulfilling transaction, before [`returning::cancel_order`] or
/// [`shipping::fulfil_order`].
pub(crate) fn lock_order(order_id: Uuid) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        fragments::lock_inventories(
            "1",
            fragments::Ids::Query("SELECT inventory_id FROM reservations WHERE order_id = $1"),
            None,
        )
    });
    Statement::from_sql_and_values(DbBackend::Postgres, SQL.as_str(), [order_id.into()])
}

#[cfg(test)]
mod tests;
