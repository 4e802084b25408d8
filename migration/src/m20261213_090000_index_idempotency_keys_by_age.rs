//! Idempotency keys follow the archive's retention: `stockguard archive`
//! forgets the keys older than its cutoff, a time slice at a time, as it
//! deletes reservations and ledger rows. It finds a slice through a BRIN
//! index on `created_at`, as it does theirs: keys are written in time order
//! and never changed, so a block range summary finds a slice, and a key's
//! claim (every keyed request's first write) pays for no B-tree.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(
                "CREATE INDEX idempotency_keys_created_brin ON idempotency_keys USING brin (created_at);",
            )
            .await
            .map(drop)
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.get_connection().execute_unprepared("DROP INDEX idempotency_keys_created_brin;").await.map(drop)
    }
}
