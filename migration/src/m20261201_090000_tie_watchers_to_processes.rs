//! Watcher rows tied to the server process that holds them.
//!
//! A row per live subscription let one client write thousands of rows, and
//! the rows of a process that crashed stayed forever. Now a process keeps one
//! row per watched inventory, however many of its subscriptions share it,
//! carrying the backend pid of its listening connection: a process that
//! starts listening removes every row whose listener is no longer in
//! `pg_stat_activity`. The table is an unlogged cache of live connections, so
//! it is made anew; the trigger reads it by name and needs no change.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(
                r#"
DROP TABLE inventory_watchers;
CREATE UNLOGGED TABLE inventory_watchers (
    process_id    uuid    NOT NULL,
    inventory_id  uuid    NOT NULL,
    listener_pid  integer NOT NULL,
    PRIMARY KEY (process_id, inventory_id)
);
CREATE INDEX inventory_watchers_inventory ON inventory_watchers (inventory_id);
"#,
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(
                r#"
DROP TABLE inventory_watchers;
CREATE UNLOGGED TABLE inventory_watchers (
    id            uuid        PRIMARY KEY,
    inventory_id  uuid        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX inventory_watchers_inventory ON inventory_watchers (inventory_id);
"#,
            )
            .await?;
        Ok(())
    }
}
