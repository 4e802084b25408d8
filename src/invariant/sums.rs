//! The statements of a check, in the order it runs them. Each reads a
//! bounded part of one table and adds what it found to two temporary
//! tables of partial sums, one row per inventory (`check_inventory_parts`)
//! and one per inventory and location (`check_level_parts`):
//!
//! 1. [`LEDGER_PARTS`] lists the ledger's partitions that hold rows, and
//!    [`ledger_part`] sums one of them; [`CHECKPOINTS`] adds what the
//!    archive folded away.
//! 2. [`RESERVATION_BLOCKS`] measures the reservations, and [`lines`] sums
//!    the lines that count in one range of their blocks.
//! 3. [`TOTALS`] adds the partial sums up, per inventory and per level.
//! 4. [`batch_end`] finds where a batch of inventories (by SKU) ends, and
//!    [`drifts`] judges that batch.
//!
//! A change writes all its ledger rows (one per location it touches) in
//! one statement, so they share `created_at` and land in one partition:
//! counting distinct versions per partition and adding the counts up counts
//! each change once. Reservations have no such key, and ranges of blocks
//! (a TID range scan, PostgreSQL 14 and later) cut them instead: in one
//! snapshot every row has exactly one visible version, in one block, so the
//! ranges see each line once.

use std::sync::LazyLock;

use sea_orm::{DbBackend, Statement};

use crate::stock::{
    fragments::{
        allocated, holding, ledger_fulfilled, ledger_location, ledger_on_hand, ledger_received, ledger_stock, units,
    },
    rows::{ReservationStatus, sql, sql_list},
};

/// The temporary tables of partial sums, gone with the check's
/// transaction. A ledger part fills the ledger's columns and a range of
/// reservations the lines', each leaving the others at 0.
pub(super) const TEMP_TABLES: &str = r#"
CREATE TEMP TABLE check_inventory_parts (
    inventory_id     uuid   NOT NULL,
    changes          bigint NOT NULL DEFAULT 0,
    ledger_stock     bigint NOT NULL DEFAULT 0,
    received         bigint NOT NULL DEFAULT 0,
    ledger_fulfilled bigint NOT NULL DEFAULT 0,
    reserved         bigint NOT NULL DEFAULT 0,
    committed        bigint NOT NULL DEFAULT 0,
    fulfilled        bigint NOT NULL DEFAULT 0,
    misallocated     bigint NOT NULL DEFAULT 0
) ON COMMIT DROP;
CREATE TEMP TABLE check_level_parts (
    inventory_id     uuid   NOT NULL,
    location_id      uuid   NOT NULL,
    reserved         bigint NOT NULL DEFAULT 0,
    committed        bigint NOT NULL DEFAULT 0,
    on_hand          bigint NOT NULL DEFAULT 0,
    ledger_stock     bigint NOT NULL DEFAULT 0
) ON COMMIT DROP;"#;

/// The ledger's partitions that may hold a row this snapshot sees, one row
/// each (`part`, its name as SQL writes it), in order of their names (the
/// day partitions by day). A partition of no blocks holds no row, and a row
/// this snapshot sees was written before the size was read, so the empty
/// days ahead (and the default partition, while it is empty) are skipped
/// soundly. The partitions are read from the catalog, which locks none of
/// them (`pg_partition_tree` would lock them all until the check ends), and
/// measuring one locks it only for that moment.
pub(super) const LEDGER_PARTS: &str = "SELECT inhrelid::regclass::text AS part FROM pg_inherits \
     WHERE inhparent = 'stock_movements'::regclass AND pg_relation_size(inhrelid) > 0 ORDER BY 1";

/// Sums one partition of the ledger (`part`, a name [`LEDGER_PARTS`] gave):
/// per inventory its changes (distinct versions), and per location (a row
/// without one is the default location's) the sums the invariant compares,
/// which added up over its locations are the inventory's. Two statements,
/// one text: the changes are counted from the guard index alone (an
/// index-only scan, once the day is vacuumed), the sums from one pass over
/// the rows.
pub(super) fn ledger_part(part: &str) -> String {
    format!(
        r#"
INSERT INTO check_inventory_parts (inventory_id, changes)
SELECT inventory_id, count(DISTINCT version_after) FROM {part} GROUP BY inventory_id;
WITH levels AS (
    SELECT inventory_id, {location} AS location_id, {on_hand} AS on_hand, {stock} AS stock,
           {received} AS received, {fulfilled} AS fulfilled
      FROM {part} GROUP BY 1, 2
), inventories AS (
    INSERT INTO check_inventory_parts (inventory_id, ledger_stock, received, ledger_fulfilled)
    SELECT inventory_id, sum(stock), sum(received), sum(fulfilled) FROM levels GROUP BY inventory_id
)
INSERT INTO check_level_parts (inventory_id, location_id, on_hand, ledger_stock)
SELECT inventory_id, location_id, on_hand, stock FROM levels;"#,
        stock = ledger_stock(),
        received = ledger_received(),
        fulfilled = ledger_fulfilled(),
        location = ledger_location(""),
        on_hand = ledger_on_hand(),
    )
}

/// Adds the archive's checkpoints: what the ledger rows it deleted added up
/// to, per inventory and per level.
pub(super) const CHECKPOINTS: &str = r#"
INSERT INTO check_inventory_parts (inventory_id, changes, ledger_stock, received, ledger_fulfilled)
SELECT inventory_id, changes, stock, received, fulfilled FROM ledger_checkpoints;
INSERT INTO check_level_parts (inventory_id, location_id, on_hand, ledger_stock)
SELECT inventory_id, location_id, on_hand, stock FROM ledger_checkpoint_levels;"#;

/// How many blocks the reservations take; one row, `blocks`. Read after the
/// snapshot is taken, so every row the snapshot sees lies below it.
pub(super) const RESERVATION_BLOCKS: &str =
    "SELECT pg_relation_size('reservations') / current_setting('block_size')::bigint AS blocks";

/// The block number past every block a table can have: the upper bound of
/// the last range of reservations, which so reaches any block added since
/// they were measured.
pub(super) const PAST_LAST_BLOCK: u32 = u32::MAX;

/// Sums the reservation lines that count (ACTIVE, ORDERED, FULFILLED) in the
/// blocks `[from, until)`: per inventory their units by status and how many
/// of them have allocations that do not add up to their quantity, and per
/// location what the allocations of the lines that hold stock hold.
///
/// The released and expired lines, most of the table, are read and passed
/// over; only the counted lines' allocations are looked up, by key.
pub(super) fn lines(from: u32, until: u32) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH counted AS MATERIALIZED (
    SELECT id, inventory_id, status, quantity FROM reservations
     WHERE ctid >= $1::tid AND ctid < $2::tid AND status IN {counted}
), lines AS (
    INSERT INTO check_inventory_parts (inventory_id, reserved, committed, fulfilled, misallocated)
    SELECT r.inventory_id, coalesce({reserved}, 0), coalesce({committed}, 0), coalesce({fulfilled}, 0),
           count(*) FILTER (WHERE a.allocated IS DISTINCT FROM r.quantity)
      FROM counted r
      LEFT JOIN (SELECT reservation_id, sum(quantity) AS allocated FROM allocations
                  WHERE reservation_id IN (SELECT id FROM counted) GROUP BY 1) a ON a.reservation_id = r.id
     GROUP BY r.inventory_id
)
INSERT INTO check_level_parts (inventory_id, location_id, reserved, committed)
SELECT r.inventory_id, a.location_id, coalesce({allocated_reserved}, 0), coalesce({allocated_committed}, 0)
  FROM counted r JOIN allocations a ON a.reservation_id = r.id
 WHERE r.status IN {holding}
 GROUP BY 1, 2"#,
            counted = sql_list([ReservationStatus::Active, ReservationStatus::Ordered, ReservationStatus::Fulfilled]),
            reserved = units(ReservationStatus::Active),
            committed = units(ReservationStatus::Ordered),
            fulfilled = units(ReservationStatus::Fulfilled),
            holding = holding(),
            allocated_reserved = allocated(ReservationStatus::Active),
            allocated_committed = allocated(ReservationStatus::Ordered),
        )
    });
    let tid = |block: u32| format!("({block},0)");
    Statement::from_sql_and_values(DbBackend::Postgres, SQL.as_str(), [tid(from).into(), tid(until).into()])
}

/// Adds the partial sums up into one row per inventory
/// (`check_inventories`) and one per inventory and location
/// (`check_levels`), each looked up by key when its batch is judged.
/// Temporary tables are never analyzed by autovacuum; the batches' plans
/// need their sizes.
pub(super) const TOTALS: &str = r#"
CREATE TEMP TABLE check_inventories ON COMMIT DROP AS
SELECT inventory_id, sum(changes) AS changes, sum(ledger_stock) AS ledger_stock, sum(received) AS received,
       sum(ledger_fulfilled) AS ledger_fulfilled, sum(reserved) AS reserved, sum(committed) AS committed,
       sum(fulfilled) AS fulfilled, sum(misallocated) AS misallocated
  FROM check_inventory_parts GROUP BY inventory_id;
ALTER TABLE check_inventories ADD PRIMARY KEY (inventory_id);
CREATE TEMP TABLE check_levels ON COMMIT DROP AS
SELECT inventory_id, location_id, sum(reserved) AS reserved, sum(committed) AS committed,
       sum(on_hand) AS on_hand, sum(ledger_stock) AS ledger_stock
  FROM check_level_parts GROUP BY inventory_id, location_id;
ALTER TABLE check_levels ADD PRIMARY KEY (inventory_id, location_id);
ANALYZE check_inventories;
ANALYZE check_levels;"#;

/// How many inventories there are; one row, `n`.
pub(super) const INVENTORIES: &str = "SELECT count(*) AS n FROM inventories";

/// Where the next batch of at most `size` inventories by SKU ends, after
/// the SKU `after` (from the first without one); one row: its last SKU
/// (`last`, NULL when none is left) and its size (`n`).
pub(super) fn batch_end(after: Option<&str>, size: u64) -> Statement {
    let size = i64::try_from(size).unwrap_or(i64::MAX);
    match after {
        None => Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT max(sku) AS last, count(*) AS n FROM (SELECT sku FROM inventories ORDER BY sku LIMIT $1) b",
            [size.into()],
        ),
        Some(after) => Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT max(sku) AS last, count(*) AS n \
               FROM (SELECT sku FROM inventories WHERE sku > $1 ORDER BY sku LIMIT $2) b",
            [after.into(), size.into()],
        ),
    }
}

/// Every inventory of the batch that ends at the SKU `last` (after the SKU
/// `after`, or from the first without one), and every level of theirs, that
/// breaks the invariant: one row each (`kind`: `inventory` or `level`;
/// `detail`: its numbers as one JSON object, since the two kinds have
/// different columns), by SKU, then kind, then location code.
///
/// The levels judged are every (inventory, location) that a level, a
/// holding allocation, a ledger row or a checkpoint names; `available`
/// stays NULL without a level.
pub(super) fn drifts(after: Option<&str>, last: &str) -> Statement {
    static FIRST: LazyLock<String> = LazyLock::new(|| judge("sku <= $1"));
    static NEXT: LazyLock<String> = LazyLock::new(|| judge("sku > $2 AND sku <= $1"));
    match after {
        None => Statement::from_sql_and_values(DbBackend::Postgres, FIRST.as_str(), [last.into()]),
        Some(after) => Statement::from_sql_and_values(DbBackend::Postgres, NEXT.as_str(), [last.into(), after.into()]),
    }
}

/// The text of [`drifts`] for the batch of inventories `within`.
fn judge(within: &str) -> String {
    format!(
        r#"
WITH batch AS MATERIALIZED (
    SELECT id, sku, stock, version, sole_location_id FROM inventories WHERE {within}
), levels AS (
    SELECT inventory_id, sum(available) AS available, array_agg(location_id ORDER BY location_id) AS locations
      FROM stock_levels WHERE inventory_id IN (SELECT id FROM batch) GROUP BY inventory_id
), located AS (
    SELECT coalesce(l.inventory_id, s.inventory_id) AS inventory_id,
           coalesce(l.location_id, s.location_id) AS location_id,
           l.available, coalesce(s.reserved, 0) AS reserved, coalesce(s.committed, 0) AS committed,
           coalesce(s.on_hand, 0) AS on_hand, coalesce(s.ledger_stock, 0) AS ledger_stock
      FROM (SELECT * FROM stock_levels WHERE inventory_id IN (SELECT id FROM batch)) l
      FULL JOIN (SELECT * FROM check_levels WHERE inventory_id IN (SELECT id FROM batch)) s
        ON s.inventory_id = l.inventory_id AND s.location_id = l.location_id
)
SELECT kind, detail FROM (
    SELECT 'inventory' AS kind, d.sku, NULL::text AS code, to_jsonb(d) AS detail
      FROM (SELECT i.id, i.sku, i.stock::bigint AS stock, i.version::bigint AS version,
                   coalesce(c.reserved, 0)::bigint AS reserved,
                   coalesce(c.committed, 0)::bigint AS committed,
                   coalesce(c.fulfilled, 0)::bigint AS fulfilled,
                   coalesce(c.received, 0)::bigint AS received,
                   coalesce(c.changes, 0)::bigint AS changes,
                   coalesce(c.ledger_stock, 0)::bigint AS ledger_stock,
                   coalesce(c.ledger_fulfilled, 0)::bigint AS ledger_fulfilled,
                   coalesce(v.available, 0)::bigint AS levels_available,
                   coalesce(v.locations, '{{}}') AS level_locations,
                   i.sole_location_id,
                   coalesce(c.misallocated, 0)::bigint AS misallocated
              FROM batch i
              LEFT JOIN check_inventories c ON c.inventory_id = i.id
              LEFT JOIN levels v ON v.inventory_id = i.id
             WHERE NOT (i.stock >= 0
                        AND coalesce(c.received, 0) - coalesce(c.fulfilled, 0)
                            = i.stock + coalesce(c.reserved, 0) + coalesce(c.committed, 0)
                        AND i.version = coalesce(c.changes, 0)
                        AND i.stock = coalesce(c.ledger_stock, 0)
                        AND coalesce(c.fulfilled, 0) = coalesce(c.ledger_fulfilled, 0)
                        AND i.stock = coalesce(v.available, 0)
                        AND (i.sole_location_id IS NULL OR v.locations = ARRAY[i.sole_location_id])
                        AND coalesce(c.misallocated, 0) = 0)) AS d
    UNION ALL
    SELECT 'level', d.sku, d.code, to_jsonb(d)
      FROM (SELECT p.inventory_id, i.sku, p.location_id, o.code, p.available::bigint AS available,
                   p.reserved::bigint AS reserved, p.committed::bigint AS committed,
                   p.on_hand::bigint AS on_hand, p.ledger_stock::bigint AS ledger_stock
              FROM located p
              JOIN batch i ON i.id = p.inventory_id
              LEFT JOIN locations o ON o.id = p.location_id
             WHERE NOT (p.available IS NOT NULL
                        AND p.available >= 0
                        AND p.on_hand = p.available + p.reserved + p.committed
                        AND p.available = p.ledger_stock)) AS d
) AS drifts
 ORDER BY sku, kind, code"#
    )
}

/// The order lines with returns that do not add up, each as a `line` drift
/// (`kind`, `sku`, `detail`): `returned` outside 0..quantity, unequal to
/// its return lines, or on a line that is not FULFILLED. Read once, after
/// the inventories: only lines with returns can drift, and the partial
/// index `reservations_returned` and the return lines find them.
pub(super) static RETURNED_LINES: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"
SELECT 'line' AS kind, d.sku, to_jsonb(d) AS detail
  FROM (SELECT r.id AS reservation_id, r.order_id, r.inventory_id, i.sku, r.status,
               r.quantity::bigint AS quantity, r.returned::bigint AS returned,
               coalesce(t.quantity, 0)::bigint AS return_lines
          FROM (SELECT id FROM reservations WHERE returned > 0
                UNION SELECT reservation_id FROM return_lines) AS x
          JOIN reservations r ON r.id = x.id
          JOIN inventories i ON i.id = r.inventory_id
          LEFT JOIN (SELECT reservation_id, sum(quantity) AS quantity FROM return_lines
                      GROUP BY reservation_id) t ON t.reservation_id = r.id
         WHERE NOT (r.returned BETWEEN 0 AND r.quantity
                    AND r.returned = coalesce(t.quantity, 0)
                    AND (r.returned = 0 OR r.status = {fulfilled}))) AS d
 ORDER BY d.sku, d.reservation_id"#,
        fulfilled = sql(ReservationStatus::Fulfilled),
    )
});

/// The kit reservations that are not whole: each must have exactly one
/// reservation per component of its kit, each holding kits × the
/// component's quantity, all in one status with one expiry; and no
/// reservation may name a kit reservation that does not exist. Few beside
/// the inventories, read in one statement after them.
pub(super) const KIT_RESERVATIONS: &str = r#"
SELECT 'kit' AS kind, d.sku, to_jsonb(d) AS detail
  FROM (SELECT x.id AS kit_reservation_id, k.kit_id, coalesce(t.sku, '') AS sku, coalesce(k.quantity, 0)::bigint AS quantity,
               coalesce(p.statuses, '{}') AS statuses, coalesce(p.expiries, 0)::bigint AS expiries,
               coalesce((SELECT count(*) FROM kit_components c WHERE c.kit_id = k.kit_id), 0)::bigint AS components,
               coalesce(p.parts, 0)::bigint AS parts, coalesce(p.matching, 0)::bigint AS matching
          FROM (SELECT id FROM kit_reservations
                UNION SELECT kit_reservation_id FROM reservations WHERE kit_reservation_id IS NOT NULL) AS x
          LEFT JOIN kit_reservations k ON k.id = x.id
          LEFT JOIN kits t ON t.id = k.kit_id
          LEFT JOIN (SELECT r.kit_reservation_id, array_agg(DISTINCT r.status ORDER BY r.status) AS statuses,
                            count(DISTINCT r.expires_at) AS expiries, count(*) AS parts,
                            count(*) FILTER (WHERE r.quantity = c.quantity * kr.quantity) AS matching
                       FROM reservations r
                       JOIN kit_reservations kr ON kr.id = r.kit_reservation_id
                       LEFT JOIN kit_components c ON c.kit_id = kr.kit_id AND c.inventory_id = r.inventory_id
                      WHERE r.kit_reservation_id IS NOT NULL
                      GROUP BY r.kit_reservation_id) p ON p.kit_reservation_id = x.id
         WHERE k.id IS NULL OR p.parts IS NULL OR cardinality(p.statuses) <> 1 OR p.expiries > 1
            OR p.parts <> (SELECT count(*) FROM kit_components c WHERE c.kit_id = k.kit_id)
            OR p.matching <> p.parts) AS d
 ORDER BY d.sku, d.kit_reservation_id"#;

/// The waiting list entries whose units are not their own, or whose freed
/// units could miss them, each as an `entry` drift (see `EntryDrift`): the
/// open entries, and the entries of every ACTIVE hold (found through the
/// partial index of holds), judged with their hold and their inventory's
/// levels.
pub(super) const WAITLIST_ENTRIES: &str = r#"
WITH judged AS (
    SELECT id FROM waitlist_entries WHERE status IN ('WAITING', 'OFFERED')
    UNION SELECT waitlist_entry_id FROM reservations WHERE waitlist_entry_id IS NOT NULL AND status = 'ACTIVE'
), items AS (
    -- The inventories each judged entry waits for: its own, or its kit's components.
    SELECT e.id AS entry_id, coalesce(c.inventory_id, e.inventory_id) AS inventory_id,
           coalesce(c.quantity, 1) * e.quantity AS wanted
      FROM waitlist_entries e
      LEFT JOIN kit_components c ON c.kit_id = e.kit_id
     WHERE e.id IN (SELECT id FROM judged)
)
SELECT 'entry' AS kind, d.sku, to_jsonb(d) AS detail
  FROM (SELECT e.id AS entry_id, e.inventory_id, e.kit_id, coalesce(i.sku, k.sku, '') AS sku, e.status,
               e.quantity::bigint AS quantity, e.held::bigint AS held, r.status AS hold_status,
               coalesce(r.quantity, 0)::bigint AS hold_quantity,
               (SELECT count(*) FROM stock_levels l JOIN items t ON t.inventory_id = l.inventory_id
                 WHERE t.entry_id = e.id AND NOT l.waiting AND e.status = 'WAITING') AS unflagged_levels
          FROM waitlist_entries e
          LEFT JOIN inventories i ON i.id = e.inventory_id
          LEFT JOIN kits k ON k.id = e.kit_id
          LEFT JOIN reservations r ON r.id = e.reservation_id
         WHERE e.id IN (SELECT id FROM judged)
           AND (EXISTS (SELECT 1 FROM stock_levels l JOIN items t ON t.inventory_id = l.inventory_id
                         WHERE t.entry_id = e.id AND NOT l.waiting AND e.status = 'WAITING')
                OR NOT coalesce(CASE
                 WHEN e.status = 'WAITING' AND e.kit_id IS NULL THEN e.held < e.quantity
                      AND ((e.held = 0 AND r.id IS NULL)
                           OR (r.status = 'ACTIVE' AND r.quantity = e.held AND r.expires_at IS NULL
                               AND r.user_id = 'waitlist:' || e.id AND r.waitlist_entry_id = e.id))
                 WHEN e.status = 'WAITING' THEN e.held = 0
                      -- Each hold of a kit's entry: a component's, unexpiring, no customer's, at most wanted.
                      AND NOT EXISTS (
                          SELECT 1 FROM reservations h LEFT JOIN items t ON t.entry_id = e.id AND t.inventory_id = h.inventory_id
                           WHERE h.waitlist_entry_id = e.id AND h.status = 'ACTIVE'
                             AND NOT coalesce(h.user_id = 'waitlist:' || e.id AND h.expires_at IS NULL
                                              AND h.kit_reservation_id IS NULL AND h.quantity <= t.wanted, false))
                 WHEN e.status = 'OFFERED' AND e.kit_id IS NULL THEN r.status = 'ACTIVE' AND r.quantity = e.quantity
                      AND r.user_id = e.user_id AND r.waitlist_entry_id = e.id
                 WHEN e.status = 'OFFERED' THEN EXISTS (
                          SELECT 1 FROM kit_reservations kr
                           WHERE kr.id = e.kit_reservation_id AND kr.user_id = e.user_id AND kr.quantity = e.quantity)
                 ELSE false END, false))) AS d
 ORDER BY d.sku, d.entry_id"#;
