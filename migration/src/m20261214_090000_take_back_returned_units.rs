//! Returns of fulfilled orders (`returnOrder`, docs/stock-operations.md).
//!
//! An order line counts the units returned of it (`reservations.returned`),
//! never more than it shipped: the return statement raises the counter
//! under the condition `returned + quantity <= line quantity`, and the table
//! refuses anything else as well. A return is a row of `returns`, numbered
//! per order in the order the returns were made (the statement that makes
//! one holds every line of the order, so two returns of one order take
//! turns), and its lines are rows of `return_lines`: per order line, the
//! units written off, and the units put back at each location they went
//! to. A restocking return adds to available stock with one `RETURNED`
//! ledger row per level, carrying the operator's note and their `sub` as
//! `actor`.
//!
//! Every return is one `ORDER_CHANGED` event of its own, recorded by a
//! trigger in the return's transaction as an order's new version is, with
//! the version the order has (a return makes none) and the return's id and
//! number, by which the event pump orders an order's returns after its
//! last version.
//!
//! The ledger's `note` and `actor` are added only if missing: adjustments
//! (issue 47) add them too, in a migration of their own.

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
-- No table rewrite: a constant default is kept in the catalogue. The check
-- is validated after it is added, so writers wait only for the scan, not
-- for the lock of adding it.
ALTER TABLE reservations ADD COLUMN returned integer NOT NULL DEFAULT 0;
ALTER TABLE reservations
    ADD CONSTRAINT reservations_returned_check CHECK (returned >= 0 AND returned <= quantity) NOT VALID;
ALTER TABLE reservations VALIDATE CONSTRAINT reservations_returned_check;
-- The lines with returns, for `stockguard check`: a few among millions.
CREATE INDEX reservations_returned ON reservations (id) WHERE returned > 0;

CREATE TABLE returns (
    id          uuid        PRIMARY KEY,
    order_id    uuid        NOT NULL REFERENCES orders (id),
    -- 1 for an order's first return, then 2, 3, ... in the order they were made.
    number      integer     NOT NULL CHECK (number > 0),
    note        text        CHECK (char_length(note) BETWEEN 1 AND 500),
    created_by  text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (order_id, number)
);

CREATE TABLE return_lines (
    return_id       uuid    NOT NULL REFERENCES returns (id),
    -- The order line the units are counted against.
    reservation_id  uuid    NOT NULL REFERENCES reservations (id),
    inventory_id    uuid    NOT NULL REFERENCES inventories (id),
    -- Where RESTOCK units went back; none for WRITE_OFF units.
    location_id     uuid    REFERENCES locations (id),
    disposition     text    NOT NULL CHECK (disposition IN ('RESTOCK', 'WRITE_OFF')),
    quantity        integer NOT NULL CHECK (quantity > 0),
    CONSTRAINT return_lines_placed CHECK ((disposition = 'RESTOCK') = (location_id IS NOT NULL)),
    UNIQUE NULLS NOT DISTINCT (return_id, reservation_id, location_id)
);
CREATE INDEX return_lines_reservation ON return_lines (reservation_id);

-- A keyed return replays from its key's claim.
ALTER TABLE idempotency_keys ADD COLUMN return_id uuid REFERENCES returns (id);

ALTER TABLE stock_movements
    ADD COLUMN IF NOT EXISTS note text,
    ADD COLUMN IF NOT EXISTS actor text,
    DROP CONSTRAINT stock_movements_reason_check,
    ADD CONSTRAINT stock_movements_reason_check CHECK (reason IN
        ('CREATED', 'RESERVED', 'RELEASED', 'EXPIRED', 'RESTOCKED', 'ORDERED', 'ORDER_CANCELLED',
         'FULFILLED', 'QUANTITY_CHANGED', 'TRANSFERRED_OUT', 'TRANSFERRED_IN', 'ADJUSTED', 'RETURNED'));

CREATE FUNCTION record_order_return() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (type, subject_id, version, data)
    SELECT 'ORDER_CHANGED', o.id, o.version,
           jsonb_build_object('orderId', o.id, 'status', o.status, 'version', o.version,
                              'returnId', NEW.id, 'returnNumber', NEW.number)
      FROM orders o WHERE o.id = NEW.order_id;
    RETURN NULL;
END
$$;
CREATE TRIGGER returns_made AFTER INSERT ON returns
    FOR EACH ROW EXECUTE FUNCTION record_order_return();
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
DROP TRIGGER returns_made ON returns;
DROP FUNCTION record_order_return();
DELETE FROM stock_movements WHERE reason = 'RETURNED';
ALTER TABLE stock_movements
    DROP CONSTRAINT stock_movements_reason_check,
    ADD CONSTRAINT stock_movements_reason_check CHECK (reason IN
        ('CREATED', 'RESERVED', 'RELEASED', 'EXPIRED', 'RESTOCKED', 'ORDERED', 'ORDER_CANCELLED',
         'FULFILLED', 'QUANTITY_CHANGED', 'TRANSFERRED_OUT', 'TRANSFERRED_IN', 'ADJUSTED'));
ALTER TABLE idempotency_keys DROP COLUMN return_id;
DROP TABLE return_lines;
DROP TABLE returns;
DROP INDEX reservations_returned;
ALTER TABLE reservations DROP COLUMN returned;
"#,
            )
            .await?;
        Ok(())
    }
}
