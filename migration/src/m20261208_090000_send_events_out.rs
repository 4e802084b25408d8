//! Events out (docs/webhooks.md): every committed change becomes exactly one
//! event, delivered to webhook endpoints at least once, in order.
//!
//! The ledger is the outbox of stock changes: every stock change already
//! writes its ledger rows in the statement that makes it, so the reserve
//! path writes nothing more for events. Each ledger row now records the
//! transaction that wrote it (`txid`, a 64-bit transaction id, which never
//! wraps). Ids and sequences are taken before commit, so a reader by id
//! skips a row whose transaction took its id first and committed last; the
//! pump instead keeps the snapshot of its last pass (`event_pump.seen`) and
//! reads exactly the rows of the transactions that have become visible
//! since (`pg_visible_in_snapshot`), each once, whatever order they
//! committed in. A transaction that waited for another's row lock commits
//! after it, so every snapshot that sees the later change sees the earlier
//! one: an inventory's versions are never pumped out of order. A long
//! transaction costs only rescans of the rows above its id, not lag. A BRIN
//! index finds a pass's rows (the ledger is appended in roughly transaction
//! order), costing the writers next to nothing.
//!
//! Changes that write no ledger row (every change of an order, a checkout
//! turning a reservation into an order line) record their event in
//! `events` from a trigger, in the transaction of the change; these are
//! not on the reserve path.
//!
//! The pump turns the changes of newly visible transactions into `outbox` rows
//! in delivery order (per inventory and per order by version) under the
//! lock of `event_pump`'s one row, so one process pumps at a time and a
//! killed pump's transaction leaves nothing half done. It writes outbox rows
//! only while an endpoint is active. Each endpoint has a cursor
//! (`sent_through`) into the outbox and a lease, so several processes
//! deliver side by side, each endpoint by one of them at a time, and a
//! dead process's endpoints are taken over when its lease runs out.

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
-- No default on the existing rows (that would rewrite the ledger): rows from
-- before have no transaction recorded and are never events.
ALTER TABLE stock_movements ADD COLUMN txid bigint;
ALTER TABLE stock_movements ALTER COLUMN txid SET DEFAULT (pg_current_xact_id()::text::bigint);
CREATE INDEX stock_movements_txid ON stock_movements USING brin (txid) WITH (autosummarize = on);

CREATE TABLE events (
    id          uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    txid        bigint      NOT NULL DEFAULT (pg_current_xact_id()::text::bigint),
    type        text        NOT NULL CHECK (type IN ('RESERVATION_CHANGED', 'ORDER_CHANGED')),
    -- The inventory (a reservation's) or the order whose events it is ordered with.
    subject_id  uuid        NOT NULL,
    version     integer     NOT NULL,
    data        jsonb       NOT NULL,
    occurred_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX events_txid ON events (txid);

-- Every new version of an order is one ORDER_CHANGED event.
CREATE FUNCTION record_order_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (type, subject_id, version, data)
    VALUES ('ORDER_CHANGED', NEW.id, NEW.version,
            jsonb_build_object('orderId', NEW.id, 'status', NEW.status, 'version', NEW.version));
    RETURN NULL;
END
$$;
CREATE TRIGGER orders_placed AFTER INSERT ON orders
    FOR EACH ROW EXECUTE FUNCTION record_order_change();
CREATE TRIGGER orders_changed AFTER UPDATE ON orders
    FOR EACH ROW WHEN (OLD.version IS DISTINCT FROM NEW.version) EXECUTE FUNCTION record_order_change();

-- A checkout turns ACTIVE reservations into order lines without a ledger
-- row (their units stay where they are); every other status change of a
-- reservation writes ledger rows, from which its event is made.
CREATE FUNCTION record_checkout() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (type, subject_id, version, data)
    VALUES ('RESERVATION_CHANGED', NEW.inventory_id, 2147483647,
            jsonb_build_object('reservationId', NEW.id, 'status', NEW.status, 'quantity', NEW.quantity,
                               'orderId', NEW.order_id));
    RETURN NULL;
END
$$;
CREATE TRIGGER reservations_checked_out AFTER UPDATE OF status ON reservations
    FOR EACH ROW WHEN (OLD.status = 'ACTIVE' AND NEW.status = 'ORDERED') EXECUTE FUNCTION record_checkout();

CREATE TABLE webhook_endpoints (
    id            uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    url           text        NOT NULL,
    events        text[]      NOT NULL,
    secret        text        NOT NULL,
    active        boolean     NOT NULL DEFAULT true,
    created_at    timestamptz NOT NULL DEFAULT now(),
    -- The last outbox row handed to one of its deliveries.
    sent_through  bigint      NOT NULL,
    -- Which process delivers for it, until when.
    leased_by     uuid,
    leased_until  timestamptz NOT NULL DEFAULT '-infinity'
);
CREATE INDEX webhook_endpoints_created ON webhook_endpoints (created_at, id);

-- The events to deliver, in delivery order (`seq`), as delivered (`body`).
CREATE TABLE outbox (
    seq         bigint      PRIMARY KEY,
    id          uuid        NOT NULL,
    type        text        NOT NULL,
    body        jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The pump's one row: the snapshot of its last pass (every transaction it
-- shows as committed has been pumped) and the last outbox row it numbered.
CREATE TABLE event_pump (
    one         boolean     PRIMARY KEY DEFAULT true CHECK (one),
    seen        pg_snapshot NOT NULL,
    last_seq    bigint      NOT NULL DEFAULT 0
);
INSERT INTO event_pump (seen) VALUES (pg_current_snapshot());

CREATE TABLE webhook_deliveries (
    id                    uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    endpoint_id           uuid        NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    seqs                  bigint[]    NOT NULL,
    event_ids             uuid[]      NOT NULL,
    status                text        NOT NULL DEFAULT 'PENDING' CHECK (status IN ('PENDING', 'DELIVERED', 'FAILED')),
    attempts              integer     NOT NULL DEFAULT 0,
    last_attempt_at       timestamptz,
    last_response_status  integer,
    last_error            text,
    next_attempt_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at          timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, created_at, id);
CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (endpoint_id, created_at) WHERE status = 'PENDING';
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
DROP TABLE webhook_deliveries;
DROP TABLE event_pump;
DROP TABLE outbox;
DROP TABLE webhook_endpoints;
DROP TRIGGER reservations_checked_out ON reservations;
DROP FUNCTION record_checkout();
DROP TRIGGER orders_changed ON orders;
DROP TRIGGER orders_placed ON orders;
DROP FUNCTION record_order_change();
DROP TABLE events;
DROP INDEX stock_movements_txid;
ALTER TABLE stock_movements DROP COLUMN txid;
"#,
            )
            .await?;
        Ok(())
    }
}
