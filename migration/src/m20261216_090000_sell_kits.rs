//! Kits: several inventories sold as one (docs/kits.md).
//!
//! A kit's components are written once, with the kit, and never change (a
//! new recipe is a new kit), so no reservation's meaning changes under it:
//! there is no statement that updates or deletes `kit_components`.
//!
//! A kit reservation is a row of its own holding the reservations of its
//! components (`reservations.kit_reservation_id`); their status and expiry
//! are theirs, kept equal by the statements that change them all at once.
//! The column has no foreign key on purpose: every reservation written,
//! the hot single reserves included, would queue the key's check trigger,
//! and the only statement that sets it inserts the kit reservation it
//! names in the same statement. Its index holds only kits' rows.
//!
//! The ledger's rows of a kit reservation's changes carry its id too, and
//! so does a checkout's `RESERVATION_CHANGED` event.

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
CREATE TABLE kits (
    id         uuid        PRIMARY KEY,
    sku        text        NOT NULL CONSTRAINT kits_sku_key UNIQUE,
    name       text        NOT NULL,
    active     boolean     NOT NULL DEFAULT true,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX kits_created ON kits (created_at, id);

CREATE TABLE kit_components (
    kit_id       uuid    NOT NULL REFERENCES kits (id),
    inventory_id uuid    NOT NULL REFERENCES inventories (id),
    quantity     integer NOT NULL CHECK (quantity BETWEEN 1 AND 1000),
    PRIMARY KEY (kit_id, inventory_id)
);

CREATE TABLE kit_reservations (
    id         uuid        PRIMARY KEY,
    kit_id     uuid        NOT NULL REFERENCES kits (id),
    user_id    text        NOT NULL,
    quantity   integer     NOT NULL CHECK (quantity > 0),
    created_at timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE reservations ADD COLUMN kit_reservation_id uuid;
CREATE INDEX reservations_kit_reservation ON reservations (kit_reservation_id) WHERE kit_reservation_id IS NOT NULL;

ALTER TABLE stock_movements ADD COLUMN kit_reservation_id uuid;

-- A checkout's event names the kit reservation a line is a component of,
-- as the events made from ledger rows do.
CREATE OR REPLACE FUNCTION record_checkout() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (type, subject_id, version, data)
    VALUES ('RESERVATION_CHANGED', NEW.inventory_id, 2147483647,
            jsonb_build_object('reservationId', NEW.id, 'status', NEW.status, 'quantity', NEW.quantity,
                               'orderId', NEW.order_id, 'kitReservationId', NEW.kit_reservation_id));
    RETURN NULL;
END
$$;
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
CREATE OR REPLACE FUNCTION record_checkout() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (type, subject_id, version, data)
    VALUES ('RESERVATION_CHANGED', NEW.inventory_id, 2147483647,
            jsonb_build_object('reservationId', NEW.id, 'status', NEW.status, 'quantity', NEW.quantity,
                               'orderId', NEW.order_id));
    RETURN NULL;
END
$$;
ALTER TABLE stock_movements DROP COLUMN kit_reservation_id;
DROP INDEX reservations_kit_reservation;
ALTER TABLE reservations DROP COLUMN kit_reservation_id;
DROP TABLE kit_reservations;
DROP TABLE kit_components;
DROP TABLE kits;
"#,
            )
            .await?;
        Ok(())
    }
}
