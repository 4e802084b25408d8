//! Waiting lists: each unit freed while customers wait goes to the first of
//! them, in the statement that frees it (docs/waitlists.md).
//!
//! Units come back to a level by many statements (a release, the sweeper's
//! expiry, a cancelled order, a smaller quantity, a restock, a restocking
//! return, a positive adjustment, a transfer in), and the next one written
//! must not forget the line. So the hand-off is a trigger on the level:
//! whenever a level's `available` grows, `offer_freed_units` runs at the
//! end of that statement, in its transaction, and moves the freed units to
//! the WAITING entries of the inventory in the order they joined. A level
//! whose inventory nobody waits for does not even call it: the trigger's
//! condition reads the level's own `waiting` flag, which a join sets on
//! every level of its inventory (under their locks, which every freeing
//! statement takes too), and the trigger clears on its own level when it
//! finds nobody waiting. A flag left set costs one call; it is never unset
//! while an entry waits (the check says so).
//!
//! The units held for an entry are an ordinary ACTIVE reservation
//! (`reservations.waitlist_entry_id`), so every reader and the invariant
//! count them as reserved with no change. While the entry waits the hold
//! belongs to no customer (`user_id` is `waitlist:` and the entry's id, a
//! subject no signed token of a customer carries) and never expires; once
//! it holds the entry's whole quantity it becomes the offer: it is given to
//! the entry's user with the entry's offer expiry, and the entry is OFFERED.
//! From then on it is a hold like any other; `waitlist_settle` follows its
//! status (released: LEFT, expired: EXPIRED, checked out: CLAIMED), and the
//! units a release or an expiry brings back run through the trigger again,
//! to the next in line. A cancelled order's units come back the same way
//! and never reopen the entry it was placed from: only an entry still
//! WAITING or OFFERED is settled.
//!
//! Every change of an entry's status (and its joining) records one
//! `WAITLIST_CHANGED` event, its `version` the entry's.

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
CREATE TABLE waitlist_entries (
    id                  uuid        PRIMARY KEY,
    -- The order of the line: assigned at joining, strictly increasing.
    seq                 bigint      GENERATED ALWAYS AS IDENTITY,
    -- Exactly one of the two: what the entry waits for.
    inventory_id        uuid        REFERENCES inventories (id),
    kit_id              uuid        REFERENCES kits (id),
    user_id             text        NOT NULL,
    quantity            integer     NOT NULL CHECK (quantity > 0),
    held                integer     NOT NULL DEFAULT 0,
    -- A kit's entry: the units of every component held for it so far.
    -- Every hand-off to an entry writes its row (this, or `held`), so two
    -- transactions handing units to one entry at REPEATABLE READ or
    -- SERIALIZABLE collide on it instead of each counting the holds its
    -- snapshot shows.
    units_held          integer     NOT NULL DEFAULT 0,
    status              text        NOT NULL
        CHECK (status IN ('WAITING', 'OFFERED', 'CLAIMED', 'EXPIRED', 'LEFT')),
    location_ids        uuid[],
    offer_secs          integer     NOT NULL CHECK (offer_secs > 0),
    -- An inventory's entry: its hold, then its offer.
    reservation_id      uuid,
    -- A kit's entry: its offer (its holds are a reservation per component).
    kit_reservation_id  uuid,
    version             integer     NOT NULL DEFAULT 1,
    idempotency_key     text,
    request_fingerprint text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    offered_at          timestamptz,
    CHECK ((inventory_id IS NULL) <> (kit_id IS NULL)),
    CHECK (held BETWEEN 0 AND quantity),
    CHECK ((status = 'WAITING') = (held < quantity) OR status IN ('LEFT', 'EXPIRED'))
);
CREATE INDEX waitlist_entries_line ON waitlist_entries (inventory_id, seq) WHERE status = 'WAITING';
CREATE UNIQUE INDEX waitlist_entries_open ON waitlist_entries (inventory_id, user_id)
    WHERE status IN ('WAITING', 'OFFERED');
CREATE INDEX waitlist_entries_kit_line ON waitlist_entries (kit_id, seq) WHERE status = 'WAITING' AND kit_id IS NOT NULL;
CREATE UNIQUE INDEX waitlist_entries_kit_open ON waitlist_entries (kit_id, user_id)
    WHERE status IN ('WAITING', 'OFFERED') AND kit_id IS NOT NULL;
CREATE INDEX waitlist_entries_kit_offered ON waitlist_entries (kit_id, seq) WHERE status = 'OFFERED' AND kit_id IS NOT NULL;
-- The kits an inventory is a component of, for the trigger.
CREATE INDEX kit_components_inventory ON kit_components (inventory_id);
CREATE INDEX waitlist_entries_user ON waitlist_entries (user_id, seq);
CREATE INDEX waitlist_entries_offered ON waitlist_entries (inventory_id, seq) WHERE status = 'OFFERED';
CREATE UNIQUE INDEX waitlist_entries_user_idempotency_key ON waitlist_entries (user_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

ALTER TABLE stock_levels ADD COLUMN waiting boolean NOT NULL DEFAULT false;
ALTER TABLE reservations ADD COLUMN waitlist_entry_id uuid;
-- Only holds and offers are in it: the check finds them by it.
CREATE INDEX reservations_waitlist_entry ON reservations (waitlist_entry_id) WHERE waitlist_entry_id IS NOT NULL;

ALTER TABLE events DROP CONSTRAINT events_type_check;
ALTER TABLE events ADD CONSTRAINT events_type_check
    CHECK (type IN ('RESERVATION_CHANGED', 'ORDER_CHANGED', 'WAITLIST_CHANGED'));

-- One WAITLIST_CHANGED event per change of an entry: its joining, and
-- each change of status (every statement that changes one also counts its
-- version up). A change of position is none.
CREATE FUNCTION record_waitlist_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (type, subject_id, version, data)
    VALUES ('WAITLIST_CHANGED', NEW.id, NEW.version,
            jsonb_build_object('entryId', NEW.id, 'inventoryId', NEW.inventory_id, 'kitId', NEW.kit_id,
                               'status', NEW.status, 'quantity', NEW.quantity,
                               'reservationId', CASE WHEN NEW.status <> 'WAITING' THEN NEW.reservation_id END,
                               'kitReservationId', NEW.kit_reservation_id));
    RETURN NULL;
END
$$;
CREATE TRIGGER waitlist_entries_joined AFTER INSERT ON waitlist_entries
    FOR EACH ROW EXECUTE FUNCTION record_waitlist_change();
CREATE TRIGGER waitlist_entries_changed AFTER UPDATE OF status ON waitlist_entries
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION record_waitlist_change();

-- The units of inventory `item` entry `w` still lacks: of its quantity for
-- an inventory's entry; for a kit's, of the item's component quantity
-- times the kits, less what its hold of the item has.
--
-- These helpers are plpgsql, not sql: PostgreSQL plans a sql function's
-- query again at every call that it does not inline, about 0.8 ms each
-- here, and the trigger calls them for every unit it hands on; plpgsql
-- keeps its plans for the session.
CREATE FUNCTION waitlist_lacks(w waitlist_entries, item uuid) RETURNS integer LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN CASE WHEN w.kit_id IS NULL THEN w.quantity - w.held
           ELSE (SELECT c.quantity * w.quantity FROM kit_components c WHERE c.kit_id = w.kit_id AND c.inventory_id = item)
                - coalesce((SELECT sum(r.quantity) FROM reservations r
                             WHERE r.waitlist_entry_id = w.id AND r.inventory_id = item AND r.status = 'ACTIVE'), 0)::integer
           END;
END
$$;

-- The first WAITING entry (by joining) that lacks units of inventory
-- `item` a level at `location` can give: the first of the item's own line,
-- or of the lines of the kits it is a component of, whichever joined
-- first. Each line is read through its partial index in joining order (an
-- inventory's WAITING entry always lacks units; a kit's may hold all it
-- needs of this one), so a line of 10,000 costs what its head does.
CREATE FUNCTION waitlist_head(item uuid, location uuid) RETURNS uuid LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT id FROM (
        (SELECT w.id, w.seq FROM waitlist_entries w
          WHERE w.inventory_id = item AND w.status = 'WAITING'
            AND (w.location_ids IS NULL OR location = ANY (w.location_ids))
          ORDER BY w.seq LIMIT 1)
        UNION ALL
        (SELECT w.id, w.seq FROM waitlist_entries w
          WHERE w.kit_id IN (SELECT kit_id FROM kit_components WHERE inventory_id = item) AND w.status = 'WAITING'
            AND w.kit_id IS NOT NULL
            AND (w.location_ids IS NULL OR location = ANY (w.location_ids))
            AND waitlist_lacks(w, item) > 0
          ORDER BY w.seq LIMIT 1)
    ) heads ORDER BY seq LIMIT 1);
END
$$;

-- Whether some WAITING entry lacks units of inventory `item` that a level
-- at `location` can give: an entry of the item, or of a kit it is a
-- component of.
CREATE FUNCTION waitlist_lacking(item uuid, location uuid) RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN waitlist_head(item, location) IS NOT NULL;
END
$$;

-- Moves the units a statement freed at one level to the WAITING entries
-- that lack them (of its inventory, or of a kit it is a component of),
-- first joined first: each entry takes what it still lacks, into its hold
-- of the inventory; an inventory's entry whose hold reaches its quantity is
-- offered it, a kit's entry whose holds of every component are whole is
-- offered them as one kit reservation. Units a level keeps as safety stock
-- are not given. The head entry is locked, so two transactions freeing
-- units of one inventory hand them on one after the other (at REPEATABLE
-- READ and SERIALIZABLE the second collides, and its statement is run
-- again).
CREATE FUNCTION offer_freed_units() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    freed   integer := NEW.available - CASE WHEN TG_OP = 'UPDATE' THEN OLD.available ELSE 0 END;
    give    integer;
    e       waitlist_entries;
    stock_now   integer;
    version_now integer;
    hold    uuid;
    fresh   boolean;
    kit_hold uuid;
BEGIN
    IF NOT waitlist_lacking(NEW.inventory_id, NEW.location_id) THEN
        -- Nobody waits for what this level holds: it stops calling (its
        -- row is ours already; the other levels clear their own).
        IF NEW.waiting AND NOT EXISTS (
            SELECT 1 FROM waitlist_entries w
             WHERE w.status = 'WAITING'
               AND (w.inventory_id = NEW.inventory_id
                    OR w.kit_id IN (SELECT kit_id FROM kit_components WHERE inventory_id = NEW.inventory_id))) THEN
            UPDATE stock_levels SET waiting = false
             WHERE inventory_id = NEW.inventory_id AND location_id = NEW.location_id;
        END IF;
        RETURN NULL;
    END IF;
    IF NOT NEW.waiting THEN
        -- A level added while entries wait (a transfer or restock to a new location).
        UPDATE stock_levels SET waiting = true
         WHERE inventory_id = NEW.inventory_id AND location_id = NEW.location_id;
    END IF;
    -- What is there now (an earlier row of this statement may have given
    -- some away already), above safety stock.
    SELECT least(freed, l.available - l.safety_stock) INTO freed
      FROM stock_levels l WHERE l.inventory_id = NEW.inventory_id AND l.location_id = NEW.location_id;
    WHILE freed > 0 LOOP
        -- At READ COMMITTED a head another transaction changed while we
        -- waited for its lock may no longer qualify and comes back as no
        -- row: look again while one lacks units.
        FOR attempt IN 1..100 LOOP
            SELECT * INTO e FROM waitlist_entries
             WHERE id = waitlist_head(NEW.inventory_id, NEW.location_id) AND status = 'WAITING'
               FOR UPDATE;
            EXIT WHEN (FOUND AND waitlist_lacks(e, NEW.inventory_id) > 0)
                   OR NOT waitlist_lacking(NEW.inventory_id, NEW.location_id);
        END LOOP;
        EXIT WHEN e.id IS NULL OR e.status <> 'WAITING';
        give := least(freed, waitlist_lacks(e, NEW.inventory_id));
        EXIT WHEN give <= 0;
        UPDATE stock_levels SET available = available - give
         WHERE inventory_id = NEW.inventory_id AND location_id = NEW.location_id;
        UPDATE inventories SET stock = stock - give, version = version + 1, updated_at = now()
         WHERE id = NEW.inventory_id
        RETURNING stock, version INTO stock_now, version_now;
        IF e.kit_id IS NULL THEN
            hold := e.reservation_id;
        ELSE
            SELECT id INTO hold FROM reservations
             WHERE waitlist_entry_id = e.id AND inventory_id = NEW.inventory_id AND status = 'ACTIVE';
        END IF;
        fresh := hold IS NULL;
        hold := coalesce(hold, gen_random_uuid());
        INSERT INTO reservations (id, inventory_id, user_id, quantity, status, location_ids, waitlist_entry_id)
        VALUES (hold, NEW.inventory_id, 'waitlist:' || e.id, give, 'ACTIVE', e.location_ids, e.id)
        ON CONFLICT (id) DO UPDATE SET quantity = reservations.quantity + give;
        INSERT INTO allocations (reservation_id, location_id, quantity) VALUES (hold, NEW.location_id, give)
        ON CONFLICT (reservation_id, location_id) DO UPDATE SET quantity = allocations.quantity + give;
        INSERT INTO stock_movements (inventory_id, delta, reason, stock_after, version_after, reservation_id, location_id)
        VALUES (NEW.inventory_id, -give, CASE WHEN fresh THEN 'RESERVED' ELSE 'QUANTITY_CHANGED' END,
                stock_now, version_now, hold, NEW.location_id);
        IF e.kit_id IS NULL THEN
            IF e.held + give = e.quantity THEN
                UPDATE reservations SET user_id = e.user_id, expires_at = now() + e.offer_secs * interval '1 second'
                 WHERE id = hold;
                UPDATE waitlist_entries SET held = quantity, reservation_id = hold, status = 'OFFERED',
                       offered_at = now(), version = version + 1
                 WHERE id = e.id;
            ELSE
                UPDATE waitlist_entries SET held = held + give, reservation_id = hold WHERE id = e.id;
            END IF;
        ELSE
            UPDATE waitlist_entries SET units_held = units_held + give WHERE id = e.id;
        END IF;
        IF e.kit_id IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM kit_components c WHERE c.kit_id = e.kit_id AND waitlist_lacks(e, c.inventory_id) > 0) THEN
            -- Every component is held: the holds become one kit reservation of the customer's.
            kit_hold := gen_random_uuid();
            INSERT INTO kit_reservations (id, kit_id, user_id, quantity) VALUES (kit_hold, e.kit_id, e.user_id, e.quantity);
            UPDATE reservations SET user_id = e.user_id, kit_reservation_id = kit_hold,
                   expires_at = now() + e.offer_secs * interval '1 second'
             WHERE waitlist_entry_id = e.id AND status = 'ACTIVE';
            UPDATE waitlist_entries SET held = quantity, kit_reservation_id = kit_hold, status = 'OFFERED',
                   offered_at = now(), version = version + 1
             WHERE id = e.id;
        END IF;
        freed := freed - give;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE TRIGGER stock_levels_offer_freed AFTER UPDATE OF available ON stock_levels
    FOR EACH ROW WHEN (NEW.available > OLD.available AND NEW.waiting) EXECUTE FUNCTION offer_freed_units();
CREATE TRIGGER stock_levels_offer_added AFTER INSERT ON stock_levels
    FOR EACH ROW WHEN (NEW.available > 0) EXECUTE FUNCTION offer_freed_units();

-- An entry's hold or offer left ACTIVE: the entry follows, once. Released
-- (by its customer, or the hold of an entry leaving) is LEFT, expired is
-- EXPIRED, checked out is CLAIMED. An entry already settled is not
-- touched, so cancelling an order placed from an offer reopens nothing.
CREATE FUNCTION waitlist_settle() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE waitlist_entries
       SET status = CASE NEW.status WHEN 'ORDERED' THEN 'CLAIMED' WHEN 'EXPIRED' THEN 'EXPIRED' ELSE 'LEFT' END,
           version = version + 1
     WHERE id = NEW.waitlist_entry_id AND status IN ('WAITING', 'OFFERED');
    RETURN NULL;
END
$$;

CREATE TRIGGER reservations_settle_waitlist AFTER UPDATE OF status ON reservations
    FOR EACH ROW WHEN (NEW.waitlist_entry_id IS NOT NULL AND OLD.status = 'ACTIVE' AND NEW.status <> 'ACTIVE')
    EXECUTE FUNCTION waitlist_settle();
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
DROP TRIGGER reservations_settle_waitlist ON reservations;
DROP FUNCTION waitlist_settle();
DROP TRIGGER stock_levels_offer_added ON stock_levels;
DROP TRIGGER stock_levels_offer_freed ON stock_levels;
DROP FUNCTION offer_freed_units();
DROP FUNCTION waitlist_lacking(uuid, uuid);
DROP FUNCTION waitlist_head(uuid, uuid);
DROP FUNCTION waitlist_lacks(waitlist_entries, uuid);
DROP INDEX kit_components_inventory;
DROP TRIGGER waitlist_entries_changed ON waitlist_entries;
DROP TRIGGER waitlist_entries_joined ON waitlist_entries;
DROP FUNCTION record_waitlist_change();
DELETE FROM events WHERE type = 'WAITLIST_CHANGED';
ALTER TABLE events DROP CONSTRAINT events_type_check;
ALTER TABLE events ADD CONSTRAINT events_type_check CHECK (type IN ('RESERVATION_CHANGED', 'ORDER_CHANGED'));
ALTER TABLE reservations DROP COLUMN waitlist_entry_id;
ALTER TABLE stock_levels DROP COLUMN waiting;
DROP TABLE waitlist_entries;
"#,
            )
            .await?;
        Ok(())
    }
}
