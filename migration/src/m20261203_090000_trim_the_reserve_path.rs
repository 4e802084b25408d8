//! A leaner reserve path: what each reservation writes must pay for itself.
//!
//! Measured with pgbench on `RESERVE_SQL` alone (bench/statement/run.sh,
//! figures in bench/results/decisions.md): `reservations_inventory` served
//! no query (the reads of held stock use the partial `reservations_held`,
//! and inventories are never deleted, so the foreign key needs no index of
//! its own), yet every reservation paid for its insert, and with history
//! for its growing size.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.get_connection().execute_unprepared("DROP INDEX reservations_inventory;").await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("CREATE INDEX reservations_inventory ON reservations (inventory_id);")
            .await?;
        Ok(())
    }
}
