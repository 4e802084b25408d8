//! Orders. An order's lines are its reservations (status ORDERED, `order_id`
//! set), so this adds the table and the foreign key the first migration left
//! out, plus `batch_id` that ties the reservations of one multi-item request.

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
CREATE TABLE orders (
    id                uuid        PRIMARY KEY,
    user_id           text        NOT NULL,
    status            text        NOT NULL CHECK (status IN ('PENDING', 'CONFIRMED', 'CANCELLED')),
    ship_name         text        NOT NULL,
    ship_line1        text        NOT NULL,
    ship_line2        text,
    ship_city         text        NOT NULL,
    ship_postal_code  text        NOT NULL,
    ship_country      text        NOT NULL,
    confirmed_at      timestamptz,
    confirmed_by      text,
    version           integer     NOT NULL DEFAULT 1,
    created_at        timestamptz NOT NULL DEFAULT now(),
    -- CONFIRMED exactly when confirmed_at and confirmed_by are set.
    CONSTRAINT orders_confirmation CHECK (CASE WHEN status = 'CONFIRMED'
        THEN confirmed_at IS NOT NULL AND confirmed_by IS NOT NULL
        ELSE confirmed_at IS NULL AND confirmed_by IS NULL END)
);
CREATE INDEX orders_user_created ON orders (user_id, created_at, id);
CREATE INDEX orders_created ON orders (created_at, id);

ALTER TABLE reservations
    ADD CONSTRAINT reservations_order_fk FOREIGN KEY (order_id) REFERENCES orders (id),
    ADD COLUMN batch_id uuid;
CREATE INDEX reservations_batch ON reservations (batch_id) WHERE batch_id IS NOT NULL;
"#,
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(
                "ALTER TABLE reservations DROP CONSTRAINT reservations_order_fk, DROP COLUMN batch_id; DROP TABLE orders;",
            )
            .await?;
        Ok(())
    }
}
