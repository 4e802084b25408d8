//! Stock per location (docs/locations.md).
//!
//! An inventory's available units are kept per location in `stock_levels`;
//! `inventories.stock` stays, as their sum, changed by the same statements.
//! What a reservation or order line holds is kept per location in
//! `allocations`, so its units go back where they came from; its reserved or
//! committed state is its reservation's status, so a level's reserved and
//! committed units are sums over its allocations, never a second copy that
//! could drift. Every new ledger row names its location.
//!
//! The migration makes the `default` location (priority 0) and moves what
//! exists there without changing any number: every inventory's stock becomes
//! its default level, every reservation one allocation at the default
//! location. Ledger rows from before keep a NULL location, which every sum
//! reads as the default location, so the ledger is not rewritten.
//!
//! Locks: a statement that changes stock locks the inventory rows first (in
//! id order when there are several), then their levels: the inventory row
//! serializes every change of its levels, so two statements naming
//! locations in opposite orders wait for each other instead of deadlocking. The allocation rules live in one function, `allocate`,
//! which every taking statement calls (src/stock/allocating.rs).

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
CREATE TABLE locations (
    id          uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    code        text        NOT NULL UNIQUE CHECK (length(code) BETWEEN 1 AND 64),
    name        text        NOT NULL,
    priority    integer     NOT NULL DEFAULT 100,
    active      boolean     NOT NULL DEFAULT true,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX locations_priority ON locations (priority, code);
-- The active locations, which every reservation from an inventory held in
-- one place asks for (`sole_location_id IN (SELECT id FROM locations WHERE
-- active)`): the statement pool plans without sequential scans.
CREATE INDEX locations_active ON locations (id) WHERE active;
INSERT INTO locations (code, name, priority) VALUES ('default', 'Default', 0);

-- Inventories are never deleted (a trigger refuses it), so a level needs no
-- foreign key to its inventory; it names a location that exists.
CREATE TABLE stock_levels (
    inventory_id    uuid    NOT NULL,
    location_id     uuid    NOT NULL REFERENCES locations (id),
    available       integer NOT NULL CHECK (available >= 0),
    PRIMARY KEY (inventory_id, location_id)
);

CREATE TABLE allocations (
    reservation_id  uuid    NOT NULL,
    location_id     uuid    NOT NULL,
    quantity        integer NOT NULL CHECK (quantity > 0),
    PRIMARY KEY (reservation_id, location_id)
);

-- The location of all an inventory's stock while it has one level: a
-- reservation that may take from anywhere takes from it with the
-- conditional UPDATE of the inventory row alone (src/stock/taking.rs).
-- Levels are never removed, so once NULL it stays NULL.
ALTER TABLE inventories ADD COLUMN sole_location_id uuid;

-- How a reservation chose its locations, so that taking more for it later
-- chooses the same way; NULL is the default (every active location,
-- PRIORITY, splitting allowed), so a plain reservation stores nothing.
ALTER TABLE reservations
    ADD COLUMN location_ids uuid[],
    ADD COLUMN fewest_locations boolean,
    ADD COLUMN allow_split boolean;

ALTER TABLE stock_movements
    ADD COLUMN location_id uuid,
    DROP CONSTRAINT stock_movements_reason_check,
    ADD CONSTRAINT stock_movements_reason_check CHECK (reason IN
        ('CREATED', 'RESERVED', 'RELEASED', 'EXPIRED', 'RESTOCKED', 'ORDERED', 'ORDER_CANCELLED',
         'FULFILLED', 'QUANTITY_CHANGED', 'TRANSFERRED_OUT', 'TRANSFERRED_IN'));

-- One change writes one ledger row per level it touches, all at the
-- change's version: a version is unique per inventory and location (a NULL
-- location, from before locations, counts as one value).
DO $$
DECLARE
    part regclass;
    con name;
BEGIN
    FOR part, con IN
        SELECT c.conrelid::regclass, c.conname
          FROM pg_constraint c JOIN pg_inherits i ON i.inhrelid = c.conrelid
         WHERE i.inhparent = 'stock_movements'::regclass AND c.contype = 'u'
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I, ADD UNIQUE NULLS NOT DISTINCT
                        (inventory_id, version_after, location_id)', part, con);
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION ledger_partitions(first date, last date) RETURNS integer LANGUAGE plpgsql
    SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    made integer := 0;
    day date;
    name text;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('ledger_partitions'));
    FOR day IN SELECT d::date FROM generate_series(first, last, interval '1 day') AS d LOOP
        name := 'stock_movements_' || to_char(day, 'YYYYMMDD');
        CONTINUE WHEN to_regclass(name) IS NOT NULL;
        BEGIN
            EXECUTE format('CREATE TABLE %I (LIKE stock_movements INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name);
            EXECUTE format('ALTER TABLE %I ADD PRIMARY KEY (id),
                            ADD UNIQUE NULLS NOT DISTINCT (inventory_id, version_after, location_id)', name);
            EXECUTE format('ALTER TABLE stock_movements ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', name,
                           day::timestamp AT TIME ZONE 'UTC', (day + 1)::timestamp AT TIME ZONE 'UTC');
            made := made + 1;
        EXCEPTION
            WHEN invalid_object_definition OR check_violation THEN NULL;
        END;
    END LOOP;
    RETURN made;
END
$$;

-- What archived ledger rows added up to at each location: `stock` the
-- deltas of available units (every reason but FULFILLED), `on_hand` those
-- of units in the building (received, transferred, fulfilled).
CREATE TABLE ledger_checkpoint_levels (
    inventory_id    uuid    NOT NULL,
    location_id     uuid    NOT NULL,
    stock           bigint  NOT NULL,
    on_hand         bigint  NOT NULL,
    PRIMARY KEY (inventory_id, location_id)
);

-- The one home of the allocation rules. `available` is what each eligible
-- location holds, in the caller's order of preference; the result is what
-- to take from each (aligned with `available`), or NULL when the eligible
-- locations cannot give `wanted` under the rules:
--   * split, not fewest (PRIORITY): fill in order, a running remainder;
--   * fewest (FEWEST_LOCATIONS): the first location that can give it all,
--     else the largest first (ties in order of preference);
--   * not split: the first location that can give it all, else NULL.
-- The parts always add up to `wanted` (docs/locations.md).
CREATE FUNCTION allocate(available integer[], wanted integer, fewest boolean, split boolean)
    RETURNS integer[] LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    n       integer := coalesce(array_length(available, 1), 0);
    take    integer[] := array_fill(0, ARRAY[n]);
    missing integer := wanted;
    best    integer;
BEGIN
    IF wanted <= 0 THEN
        RETURN NULL;
    END IF;
    IF fewest OR NOT split THEN
        FOR i IN 1 .. n LOOP
            IF available[i] >= wanted THEN
                take[i] := wanted;
                RETURN take;
            END IF;
        END LOOP;
        IF NOT split THEN
            RETURN NULL;
        END IF;
    END IF;
    WHILE missing > 0 LOOP
        best := NULL;
        FOR i IN 1 .. n LOOP
            CONTINUE WHEN take[i] > 0 OR available[i] <= 0;
            IF best IS NULL THEN
                best := i;
                EXIT WHEN NOT fewest;
            ELSIF available[i] > available[best] THEN
                best := i;
            END IF;
        END LOOP;
        IF best IS NULL THEN
            RETURN NULL;
        END IF;
        take[best] := least(available[best], missing);
        missing := missing - take[best];
    END LOOP;
    RETURN take;
END
$$;

-- A statement at READ COMMITTED that waited for a lock sees the rows it
-- locked as they are now, but rows inserted since it began not at all: a
-- statement that finds the rows it locked do not add up (allocations short
-- of their reservation's quantity, levels short of their inventory's stock)
-- read too early, and calls this to be run again with a new snapshot,
-- through the same retries as any serialization failure.
CREATE FUNCTION retry_stale_read() RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION 'rows were added after this statement began; run it again'
        USING ERRCODE = 'serialization_failure';
END
$$;

INSERT INTO stock_levels (inventory_id, location_id, available)
SELECT i.id, l.id, i.stock FROM inventories i, locations l WHERE l.code = 'default';
UPDATE inventories SET sole_location_id = (SELECT id FROM locations WHERE code = 'default');

INSERT INTO allocations (reservation_id, location_id, quantity)
SELECT r.id, l.id, r.quantity FROM reservations r, locations l WHERE l.code = 'default';

INSERT INTO ledger_checkpoint_levels (inventory_id, location_id, stock, on_hand)
SELECT c.inventory_id, l.id, c.stock, c.received - c.fulfilled FROM ledger_checkpoints c, locations l
 WHERE l.code = 'default';
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
DROP FUNCTION retry_stale_read();
DROP FUNCTION allocate(integer[], integer, boolean, boolean);
DROP TABLE ledger_checkpoint_levels;
DELETE FROM stock_movements WHERE reason IN ('TRANSFERRED_OUT', 'TRANSFERRED_IN');
DO $$
DECLARE
    part regclass;
    con name;
BEGIN
    FOR part, con IN
        SELECT c.conrelid::regclass, c.conname
          FROM pg_constraint c JOIN pg_inherits i ON i.inhrelid = c.conrelid
         WHERE i.inhparent = 'stock_movements'::regclass AND c.contype = 'u'
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I, ADD UNIQUE (inventory_id, version_after)', part, con);
    END LOOP;
END
$$;
ALTER TABLE stock_movements
    DROP CONSTRAINT stock_movements_reason_check,
    ADD CONSTRAINT stock_movements_reason_check CHECK (reason IN
        ('CREATED', 'RESERVED', 'RELEASED', 'EXPIRED', 'RESTOCKED', 'ORDERED', 'ORDER_CANCELLED',
         'FULFILLED', 'QUANTITY_CHANGED')),
    DROP COLUMN location_id;
-- New day partitions get the guard of before again.
CREATE OR REPLACE FUNCTION ledger_partitions(first date, last date) RETURNS integer LANGUAGE plpgsql
    SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    made integer := 0;
    day date;
    name text;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('ledger_partitions'));
    FOR day IN SELECT d::date FROM generate_series(first, last, interval '1 day') AS d LOOP
        name := 'stock_movements_' || to_char(day, 'YYYYMMDD');
        CONTINUE WHEN to_regclass(name) IS NOT NULL;
        BEGIN
            EXECUTE format('CREATE TABLE %I (LIKE stock_movements INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name);
            EXECUTE format('ALTER TABLE %I ADD PRIMARY KEY (id), ADD UNIQUE (inventory_id, version_after)', name);
            EXECUTE format('ALTER TABLE stock_movements ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', name,
                           day::timestamp AT TIME ZONE 'UTC', (day + 1)::timestamp AT TIME ZONE 'UTC');
            made := made + 1;
        EXCEPTION
            WHEN invalid_object_definition OR check_violation THEN NULL;
        END;
    END LOOP;
    RETURN made;
END
$$;
ALTER TABLE reservations DROP COLUMN allow_split, DROP COLUMN fewest_locations, DROP COLUMN location_ids;
ALTER TABLE inventories DROP COLUMN sole_location_id;
DROP TABLE allocations;
DROP TABLE stock_levels;
DROP TABLE locations;
"#,
            )
            .await?;
        Ok(())
    }
}
