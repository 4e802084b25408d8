//! Checkout, quantity changes and fulfilment.
//!
//! A reservation can now be checked out into an order (ACTIVE → ORDERED,
//! no expiry, the order's id) and an order's lines can leave the warehouse
//! (ORDERED → FULFILLED); the ledger gains the reasons of those changes. The
//! rules that guard stock live here as well as in the code: an order line
//! carries its order and never expires, a cart line belongs to no order, and
//! an order is FULFILLED exactly when it carries who fulfilled it and when
//! (it stays confirmed, so its confirmation is kept). `reservations_held`
//! serves the reads of `reserved` and `committed`: only the holding rows,
//! however long the history of released and expired ones grows.

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
ALTER TABLE reservations
    DROP CONSTRAINT reservations_status_check,
    ADD CONSTRAINT reservations_status_check
        CHECK (status IN ('ACTIVE', 'RELEASED', 'EXPIRED', 'ORDERED', 'FULFILLED')),
    -- An order line (ORDERED, FULFILLED) names its order and never expires;
    -- a cart line (ACTIVE) is no order's. RELEASED and EXPIRED rows keep what
    -- they had (a cancelled order's lines keep its id).
    ADD CONSTRAINT reservations_order_line CHECK (CASE
        WHEN status IN ('ORDERED', 'FULFILLED') THEN order_id IS NOT NULL AND expires_at IS NULL
        WHEN status = 'ACTIVE' THEN order_id IS NULL
        ELSE true END);

ALTER TABLE stock_movements
    DROP CONSTRAINT stock_movements_reason_check,
    ADD CONSTRAINT stock_movements_reason_check CHECK (reason IN
        ('CREATED', 'RESERVED', 'RELEASED', 'EXPIRED', 'RESTOCKED', 'ORDERED', 'ORDER_CANCELLED',
         'FULFILLED', 'QUANTITY_CHANGED'));

ALTER TABLE orders
    ADD COLUMN fulfilled_at timestamptz,
    ADD COLUMN fulfilled_by text,
    DROP CONSTRAINT orders_status_check,
    ADD CONSTRAINT orders_status_check CHECK (status IN ('PENDING', 'CONFIRMED', 'CANCELLED', 'FULFILLED')),
    -- Confirmed exactly when CONFIRMED or (later) FULFILLED.
    DROP CONSTRAINT orders_confirmation,
    ADD CONSTRAINT orders_confirmation CHECK (CASE WHEN status IN ('CONFIRMED', 'FULFILLED')
        THEN confirmed_at IS NOT NULL AND confirmed_by IS NOT NULL
        ELSE confirmed_at IS NULL AND confirmed_by IS NULL END),
    -- FULFILLED exactly when fulfilled_at and fulfilled_by are set.
    ADD CONSTRAINT orders_fulfilment CHECK (CASE WHEN status = 'FULFILLED'
        THEN fulfilled_at IS NOT NULL AND fulfilled_by IS NOT NULL
        ELSE fulfilled_at IS NULL AND fulfilled_by IS NULL END);

CREATE INDEX reservations_held ON reservations (inventory_id) INCLUDE (status, quantity)
    WHERE status IN ('ACTIVE', 'ORDERED');
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
DROP INDEX reservations_held;
ALTER TABLE orders
    DROP CONSTRAINT orders_fulfilment,
    DROP CONSTRAINT orders_confirmation,
    ADD CONSTRAINT orders_confirmation CHECK (CASE WHEN status = 'CONFIRMED'
        THEN confirmed_at IS NOT NULL AND confirmed_by IS NOT NULL
        ELSE confirmed_at IS NULL AND confirmed_by IS NULL END),
    DROP CONSTRAINT orders_status_check,
    ADD CONSTRAINT orders_status_check CHECK (status IN ('PENDING', 'CONFIRMED', 'CANCELLED')),
    DROP COLUMN fulfilled_by,
    DROP COLUMN fulfilled_at;
ALTER TABLE stock_movements
    DROP CONSTRAINT stock_movements_reason_check,
    ADD CONSTRAINT stock_movements_reason_check CHECK (reason IN
        ('CREATED', 'RESERVED', 'RELEASED', 'EXPIRED', 'RESTOCKED', 'ORDERED', 'ORDER_CANCELLED'));
ALTER TABLE reservations
    DROP CONSTRAINT reservations_order_line,
    DROP CONSTRAINT reservations_status_check,
    ADD CONSTRAINT reservations_status_check CHECK (status IN ('ACTIVE', 'RELEASED', 'EXPIRED', 'ORDERED'));
"#,
            )
            .await?;
        Ok(())
    }
}
