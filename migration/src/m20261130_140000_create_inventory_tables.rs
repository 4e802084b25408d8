//! Inventories, reservations and the stock ledger.
//!
//! `reservations.order_id` is here from the start so that order lines (ORDERED
//! reservations) are the same rows as plain reservations; its foreign key is
//! added by the migration that creates `orders`.

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
CREATE TABLE inventories (
    id          uuid        PRIMARY KEY,
    sku         text        NOT NULL UNIQUE,
    name        text        NOT NULL,
    stock       integer     NOT NULL CHECK (stock >= 0),
    version     integer     NOT NULL DEFAULT 1,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE reservations (
    id                  uuid        PRIMARY KEY,
    inventory_id        uuid        NOT NULL REFERENCES inventories (id),
    order_id            uuid,
    user_id             text        NOT NULL,
    quantity            integer     NOT NULL CHECK (quantity > 0),
    status              text        NOT NULL
        CHECK (status IN ('ACTIVE', 'RELEASED', 'EXPIRED', 'ORDERED')),
    idempotency_key     text,
    request_fingerprint text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    expires_at          timestamptz,
    CHECK ((idempotency_key IS NULL) = (request_fingerprint IS NULL))
);
-- One key per user: a second statement carrying the same key fails on this
-- index and is rolled back whole, so the stock it took is given back.
CREATE UNIQUE INDEX reservations_user_idempotency_key
    ON reservations (user_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX reservations_user_created ON reservations (user_id, created_at, id);
CREATE INDEX reservations_inventory ON reservations (inventory_id);
CREATE INDEX reservations_order ON reservations (order_id) WHERE order_id IS NOT NULL;

-- The stock ledger: one row per committed change of an inventory, written by
-- the same statement as the change. (inventory_id, version_after) is unique,
-- so two changes can never both claim the same version.
CREATE TABLE stock_movements (
    id              uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    inventory_id    uuid        NOT NULL REFERENCES inventories (id),
    delta           integer     NOT NULL,
    reason          text        NOT NULL CHECK (reason IN
        ('CREATED', 'RESERVED', 'RELEASED', 'EXPIRED', 'RESTOCKED', 'ORDERED', 'ORDER_CANCELLED')),
    stock_after     integer     NOT NULL CHECK (stock_after >= 0),
    version_after   integer     NOT NULL,
    reservation_id  uuid,
    order_id        uuid,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (inventory_id, version_after)
);
"#,
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("DROP TABLE stock_movements; DROP TABLE reservations; DROP TABLE inventories;")
            .await?;
        Ok(())
    }
}
