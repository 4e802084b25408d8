//! Stockguard's schema, as ordered SeaORM migrations.
//!
//! Every constraint that guards money or stock lives in the database as well as
//! in the code (`CHECK (stock >= 0)`, `CHECK (quantity > 0)`, one idempotency key
//! per user), so that a bug in the server can fail a statement but never store
//! an impossible row.

// `MigrationTrait` declares `&SchemaManager` with its lifetime elided, and
// async_trait makes an impl that names it (`SchemaManager<'_>`) a different
// signature, so the migrations cannot meet this lint.
#![expect(elided_lifetimes_in_paths, reason = "the signature MigrationTrait declares, see above")]

pub use sea_orm_migration::prelude::*;

mod m20261130_140000_create_inventory_tables;
mod m20261130_150000_create_orders;
mod m20261130_160000_create_live_stock;
mod m20261201_090000_tie_watchers_to_processes;
mod m20261202_090000_add_checkout_and_fulfilment;
mod m20261202_091000_create_idempotency_keys;
mod m20261202_092000_announce_orders_and_checkouts;
mod m20261203_090000_trim_the_reserve_path;
mod m20261203_100000_create_ledger_checkpoints;
mod m20261204_090000_guard_inventories_instead_of_checking_each_row;
mod m20261205_090000_partition_the_ledger_by_day;
mod m20261206_090000_announce_stock_changes_once_per_statement;
mod m20261207_090000_keep_stock_per_location;
mod m20261208_090000_send_events_out;
mod m20261209_090000_bound_what_events_keep;
mod m20261210_090000_keep_event_bodies_as_sent;
mod m20261211_090000_keep_a_bodys_events_in_one_row;
mod m20261212_090000_read_the_ledger_in_smaller_ranges;
mod m20261213_090000_index_idempotency_keys_by_age;
mod m20261214_090000_take_back_returned_units;
mod m20261215_090000_adjust_stock_and_keep_safety_stock;
mod m20261216_090000_sell_kits;
mod m20261217_090000_offer_freed_units_to_waiting_lists;

/// The migrations in the order they are applied.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261130_140000_create_inventory_tables::Migration),
            Box::new(m20261130_150000_create_orders::Migration),
            Box::new(m20261130_160000_create_live_stock::Migration),
            Box::new(m20261201_090000_tie_watchers_to_processes::Migration),
            Box::new(m20261202_090000_add_checkout_and_fulfilment::Migration),
            Box::new(m20261202_091000_create_idempotency_keys::Migration),
            Box::new(m20261202_092000_announce_orders_and_checkouts::Migration),
            Box::new(m20261203_090000_trim_the_reserve_path::Migration),
            Box::new(m20261203_100000_create_ledger_checkpoints::Migration),
            Box::new(m20261204_090000_guard_inventories_instead_of_checking_each_row::Migration),
            Box::new(m20261205_090000_partition_the_ledger_by_day::Migration),
            Box::new(m20261206_090000_announce_stock_changes_once_per_statement::Migration),
            Box::new(m20261207_090000_keep_stock_per_location::Migration),
            Box::new(m20261208_090000_send_events_out::Migration),
            Box::new(m20261209_090000_bound_what_events_keep::Migration),
            Box::new(m20261210_090000_keep_event_bodies_as_sent::Migration),
            Box::new(m20261211_090000_keep_a_bodys_events_in_one_row::Migration),
            Box::new(m20261212_090000_read_the_ledger_in_smaller_ranges::Migration),
            Box::new(m20261213_090000_index_idempotency_keys_by_age::Migration),
            Box::new(m20261214_090000_take_back_returned_units::Migration),
            Box::new(m20261215_090000_adjust_stock_and_keep_safety_stock::Migration),
            Box::new(m20261216_090000_sell_kits::Migration),
            Box::new(m20261217_090000_offer_freed_units_to_waiting_lists::Migration),
        ]
    }
}
