//! The ledger, one partition per day (UTC), so its cost stays flat as
//! history grows.
//!
//! Every ledger row goes into the unique `(inventory_id, version_after)`
//! index, the ledger's guard and the path `movements` pages by. Its keys
//! start with the inventory, so each inventory appends to a leaf page of its
//! own: on a shop with a month of history that is one page per inventory
//! (10,000 of them, ~80 MB beside 128 MB of shared buffers, each written
//! whole to the WAL once after every checkpoint), where a young ledger has a
//! few hundred (bench/results/decisions.md). With a partition per day, only
//! today's partition takes rows, and its index holds today's rows alone.
//!
//! - `ledger_partitions(first, last)` makes the partitions of those days that
//!   do not exist yet: each made beside the table and then attached, which
//!   locks the table `SHARE UPDATE EXCLUSIVE` (writers go on) instead of the
//!   `ACCESS EXCLUSIVE` of `CREATE TABLE ... PARTITION OF`. The migration
//!   makes today's and the next seven days'; every server process makes
//!   those ahead again at start and hourly (`stock::partitions`).
//! - A row of a day with no partition yet goes to the default partition, so
//!   a write never fails for want of one.
//! - The guard is per partition: a version written twice on one day is
//!   refused as before. Versions only grow under the inventory's row lock, so
//!   a repeat on another day would take a bug that the per-day guard already
//!   catches on the day it happens.
//! - `drop_empty_ledger_partitions(before)`: the archive's last step, which
//!   drops the day partitions ending by `before` that it has emptied.
//! - `ledger_days()`: the day partitions and their days, for the functions
//!   above and whoever else needs them.
//!
//! A ledger that already has rows becomes the partition of everything up to
//! tomorrow, as it is (no row is copied); the day partitions start after it.

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
ALTER TABLE stock_movements RENAME TO stock_movements_before;
ALTER INDEX stock_movements_created_brin RENAME TO stock_movements_before_created_brin;

CREATE TABLE stock_movements (LIKE stock_movements_before INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (created_at);
CREATE INDEX stock_movements_created_brin ON stock_movements USING brin (created_at);

CREATE TABLE stock_movements_default PARTITION OF stock_movements DEFAULT;
ALTER TABLE stock_movements_default ADD PRIMARY KEY (id), ADD UNIQUE (inventory_id, version_after);

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM stock_movements_before) THEN
        EXECUTE format('ALTER TABLE stock_movements ATTACH PARTITION stock_movements_before
                        FOR VALUES FROM (MINVALUE) TO (%L)',
                       ((now() AT TIME ZONE 'UTC')::date + 1)::timestamp AT TIME ZONE 'UTC');
    ELSE
        DROP TABLE stock_movements_before;
    END IF;
END
$$;

-- The ledger's day partitions and their days (UTC), read from the catalog.
CREATE FUNCTION ledger_days() RETURNS TABLE (part regclass, day date) LANGUAGE sql STABLE
    SET search_path FROM CURRENT AS $$
    SELECT c.oid::regclass, to_date(right(c.relname, 8), 'YYYYMMDD')
      FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
     WHERE i.inhparent = 'stock_movements'::regclass AND c.relname ~ '^stock_movements_[0-9]{8}$'
$$;

-- Both run as their owner (the role that migrates), so a server whose role
-- may not create tables still keeps its days ahead.
CREATE FUNCTION ledger_partitions(first date, last date) RETURNS integer LANGUAGE plpgsql
    SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    made integer := 0;
    day date;
    name text;
BEGIN
    -- Server processes that start together take turns.
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
            -- The day is inside the partition of a ledger from before
            -- partitioning, or the default partition already holds rows of
            -- it: those rows stay where they are.
            WHEN invalid_object_definition OR check_violation THEN NULL;
        END;
    END LOOP;
    RETURN made;
END
$$;

-- Dropping a partition locks the whole ledger for a moment: it never waits
-- long in line for that lock behind a transaction (writers would queue
-- behind the wait); an archive run after this one drops what is left.
CREATE FUNCTION drop_empty_ledger_partitions(before timestamptz) RETURNS integer LANGUAGE plpgsql
    SECURITY DEFINER SET search_path FROM CURRENT SET lock_timeout = '200ms' AS $$
DECLARE
    dropped integer := 0;
    part regclass;
    has_rows boolean;
BEGIN
    FOR part IN
        SELECT d.part FROM ledger_days() d
         WHERE (d.day + 1)::timestamp AT TIME ZONE 'UTC' <= before ORDER BY d.day
    LOOP
        BEGIN
            LOCK TABLE stock_movements IN ACCESS EXCLUSIVE MODE;
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s)', part) INTO has_rows;
            CONTINUE WHEN has_rows;
            EXECUTE format('DROP TABLE %s', part);
            dropped := dropped + 1;
        EXCEPTION WHEN lock_not_available THEN RETURN dropped;
        END;
    END LOOP;
    RETURN dropped;
END
$$;

SELECT ledger_partitions((now() AT TIME ZONE 'UTC')::date, (now() AT TIME ZONE 'UTC')::date + 7);
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
CREATE TABLE stock_movements_plain (LIKE stock_movements INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
INSERT INTO stock_movements_plain SELECT * FROM stock_movements;
DROP FUNCTION drop_empty_ledger_partitions(timestamptz);
DROP FUNCTION ledger_partitions(date, date);
DROP FUNCTION ledger_days();
DROP TABLE stock_movements;
ALTER TABLE stock_movements_plain RENAME TO stock_movements;
ALTER TABLE stock_movements ADD PRIMARY KEY (id), ADD UNIQUE (inventory_id, version_after);
CREATE INDEX stock_movements_created_brin ON stock_movements USING brin (created_at);
"#,
            )
            .await?;
        Ok(())
    }
}
