//! The ledger's index on `txid` (how the event pump finds the rows of the
//! transactions committed since its last pass) summarizes 16 pages a range
//! instead of 128.
//!
//! A BRIN index is lossy: a pass reads every row of each range whose
//! summary may hold a new transaction, and the range still filling always
//! may, so every pass read again up to 128 pages of rows it had pumped
//! before, about ten for each new one under load (`Rows Removed by Index
//! Recheck: 5287` for 390 rows: a quarter of the events' PostgreSQL time,
//! bench/results/decisions.md). At 16 pages it reads again at most about
//! 700 rows. The index stays a few kB a day of ledger.
//!
//! Rebuilding it reads the whole ledger once and holds writes to it off
//! while it does (seconds for millions of rows); new day partitions take
//! the index with its setting when they are attached.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// The index as the pump reads it, `pages_per_range` set.
fn txid_index(pages_per_range: u32) -> String {
    format!(
        "DROP INDEX stock_movements_txid;
         CREATE INDEX stock_movements_txid ON stock_movements USING brin (txid)
             WITH (autosummarize = on, pages_per_range = {pages_per_range});"
    )
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.get_connection().execute_unprepared(&txid_index(16)).await.map(drop)
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.get_connection().execute_unprepared(&txid_index(128)).await.map(drop)
    }
}
