//! The outbox keeps each event's body as the text it is sent as, not as
//! `jsonb`: a body is only ever sent, and building `jsonb` (every
//! object sorted and encoded, every concatenation a copy, the whole body
//! aggregated again and printed back at every delivery) was most of the
//! event pump's and the dispatcher's work (bench/results/decisions.md,
//! "Events out: bodies as text"). It also kept the keys in `jsonb`'s own
//! order instead of the documented one.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("ALTER TABLE outbox ALTER COLUMN body TYPE text USING body::text")
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("ALTER TABLE outbox ALTER COLUMN body TYPE jsonb USING body::jsonb")
            .await?;
        Ok(())
    }
}
