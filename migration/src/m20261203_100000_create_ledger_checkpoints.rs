//! A home for old rows: ledger checkpoints and time indexes for retention.
//!
//! `stockguard archive --older-than 90d` deletes released and expired
//! reservations and ledger rows older than the cutoff, time slice by time
//! slice. The invariant adds the ledger up per inventory, so what an archive
//! takes out of `stock_movements` it adds to the inventory's one row in
//! `ledger_checkpoints`, in the same statement: the changes it stood for,
//! their stock, received and fulfilled units, and how far it reaches.
//!
//! The slices are found by `created_at` through BRIN indexes: rows are
//! written in time order, so a block range summary finds a slice without a
//! B-tree that every reservation would have to maintain (a BRIN index
//! changes only when a new block range starts).

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
CREATE TABLE ledger_checkpoints (
    inventory_id    uuid        PRIMARY KEY REFERENCES inventories (id),
    -- How many ledger rows (committed changes) were archived.
    changes         bigint      NOT NULL CHECK (changes > 0),
    -- Their deltas of available stock (every reason but FULFILLED).
    stock           bigint      NOT NULL,
    -- Their units received (CREATED, RESTOCKED) and shipped (FULFILLED).
    received        bigint      NOT NULL,
    fulfilled       bigint      NOT NULL,
    -- The newest version and the newest row archived.
    version_after   integer     NOT NULL,
    archived_until  timestamptz NOT NULL
);
CREATE INDEX reservations_created_brin ON reservations USING brin (created_at);
CREATE INDEX stock_movements_created_brin ON stock_movements USING brin (created_at);
"#,
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(
                "DROP INDEX stock_movements_created_brin; DROP INDEX reservations_created_brin; \
                 DROP TABLE ledger_checkpoints;",
            )
            .await?;
        Ok(())
    }
}
