//! The invariant of docs/design.md, extended by the checkout contract
//! (docs/checkout.md) and by locations (docs/locations.md), checked straight
//! from the tables. For every inventory row:
//!
//! - `stock >= 0` (`stock` is `available`);
//! - `received - fulfilled = available + reserved + committed`, where
//!   `received` is its initial stock plus restocks plus the units returned
//!   to stock (RESTOCK lines of returns, `RETURNED`), `fulfilled` the units of
//!   its FULFILLED lines, `reserved` the units of its ACTIVE reservations and
//!   `committed` those of its ORDERED ones (lines of PENDING and CONFIRMED
//!   orders). An ACTIVE reservation past its expiry counts as `reserved`
//!   until the sweeper returns its stock: its units are not `available`
//!   before that, so counting them anywhere else would break the sum;
//! - `version` = 1 + its committed changes = its number of distinct ledger
//!   versions (one change writes one ledger row per location it touches,
//!   all at the change's version);
//! - the ledger agrees: the deltas of every change of available stock add up
//!   to `stock`, and the FULFILLED entries to minus the fulfilled lines' units;
//! - its levels' `available` add up to `stock`; while it has a sole location
//!   (`sole_location_id`), that location's level is its only one;
//! - the allocations of each of its ACTIVE, ORDERED and FULFILLED lines add
//!   up to the line's quantity (so a line has at least one).
//!
//! And for every inventory and every location its levels, ledger rows or
//! holding allocations name (a ledger row without a location is the default
//! location's):
//!
//! - the level exists and `available >= 0`;
//! - `on hand = available + reserved + committed`, where `on hand` is the
//!   ledger's received, transferred, fulfilled and returned units there, and `reserved`
//!   / `committed` the allocations there of ACTIVE / ORDERED lines;
//! - `available` = the ledger's deltas there of every change of available stock.
//!
//! And for every order line with returns: `0 <= returned <= quantity`
//! (never more back than shipped), `returned` is the sum of its return
//! lines, and only a FULFILLED line has any.
//!
//! Entries archived by `stockguard archive` count through their inventory's
//! checkpoint rows (`ledger_checkpoints`, `ledger_checkpoint_levels`), which
//! hold their sums.
//!
//! One statement, so every number comes from one snapshot and the check holds
//! at every moment, not only when writers are idle. `stockguard check`, every
//! concurrency test and the benchmark use this one check.

use std::sync::LazyLock;

use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement};
use serde::Deserialize;
use uuid::Uuid;

use crate::stock::{
    fragments::{
        allocated, holding, ledger_fulfilled, ledger_location, ledger_on_hand, ledger_received, ledger_stock, units,
    },
    rows::{ReservationStatus, sql, sql_list},
};

/// What does not add up: an inventory's own numbers, one of its levels,
/// or an order line's returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drift {
    /// The inventory's numbers, summed over its locations.
    Inventory(InventoryDrift),
    /// Its numbers at one location.
    Level(LevelDrift),
    /// An order line's returned units.
    Line(LineDrift),
}

/// One inventory whose numbers do not add up.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct InventoryDrift {
    /// The inventory.
    pub id: Uuid,
    /// Its SKU.
    pub sku: String,
    /// Units available (the `stock` column).
    pub stock: i64,
    /// Its version.
    pub version: i64,
    /// Units held by ACTIVE reservations.
    pub reserved: i64,
    /// Units held by ORDERED reservations (order lines not yet fulfilled).
    pub committed: i64,
    /// Units of FULFILLED lines.
    pub fulfilled: i64,
    /// Initial stock, restocks and units returned to stock, from the ledger.
    pub received: i64,
    /// Number of distinct ledger versions (should equal `version`).
    pub changes: i64,
    /// Sum of the ledger's deltas of available stock (should equal `stock`).
    pub ledger_stock: i64,
    /// Minus the sum of the ledger's FULFILLED deltas (should equal `fulfilled`).
    pub ledger_fulfilled: i64,
    /// Sum of its levels' available units (should equal `stock`).
    pub levels_available: i64,
    /// The locations of its levels.
    pub level_locations: Vec<Uuid>,
    /// Its sole location, if any (should be its only level's).
    pub sole_location_id: Option<Uuid>,
    /// Its ACTIVE, ORDERED and FULFILLED lines whose allocations do not add
    /// up to their quantity (should be 0).
    pub misallocated: i64,
}

/// One inventory's numbers at one location that do not add up.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LevelDrift {
    /// The inventory.
    pub inventory_id: Uuid,
    /// Its SKU.
    pub sku: String,
    /// The location.
    pub location_id: Uuid,
    /// Its code; none when no location has this id.
    pub code: Option<String>,
    /// The level's available units; none when there is no level.
    pub available: Option<i64>,
    /// Units there of ACTIVE reservations' allocations.
    pub reserved: i64,
    /// Units there of ORDERED reservations' allocations.
    pub committed: i64,
    /// Received, transferred, fulfilled and returned units there, from the
    /// ledger (should equal available + reserved + committed).
    pub on_hand: i64,
    /// Sum of the ledger's deltas of available stock there (should equal `available`).
    pub ledger_stock: i64,
}

/// One order line whose returned units do not add up.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LineDrift {
    /// The line (a reservation).
    pub reservation_id: Uuid,
    /// Its order.
    pub order_id: Option<Uuid>,
    /// Its inventory.
    pub inventory_id: Uuid,
    /// The inventory's SKU.
    pub sku: String,
    /// The line's status (should be FULFILLED when it has returns).
    pub status: String,
    /// Units it shipped.
    pub quantity: i64,
    /// Its `returned` counter (should be between 0 and `quantity`).
    pub returned: i64,
    /// Sum of its return lines (should equal `returned`).
    pub return_lines: i64,
}

impl std::fmt::Display for Drift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Inventory(d) => write!(
                f,
                "{} ({}): received {} - fulfilled {} vs available {} + reserved {} + committed {}; \
                 version {} vs {} ledger versions; ledger sums to {} available and {} fulfilled; \
                 levels hold {} available at {:?} (sole location {:?}); \
                 lines whose allocations do not add up to their quantity: {}",
                d.sku,
                d.id,
                d.received,
                d.fulfilled,
                d.stock,
                d.reserved,
                d.committed,
                d.version,
                d.changes,
                d.ledger_stock,
                d.ledger_fulfilled,
                d.levels_available,
                d.level_locations,
                d.sole_location_id,
                d.misallocated
            ),
            Self::Line(d) => write!(
                f,
                "{} ({}) line {} of order {:?}, {}: returned {} of {} shipped, return lines {}",
                d.sku, d.inventory_id, d.reservation_id, d.order_id, d.status, d.returned, d.quantity, d.return_lines
            ),
            Self::Level(d) => {
                let available = d.available.map_or_else(|| "no level".to_owned(), |n| n.to_string());
                write!(
                    f,
                    "{} ({}) at {} ({}): on hand {} vs available {} + reserved {} + committed {}; \
                     ledger sums to {} available",
                    d.sku,
                    d.inventory_id,
                    d.code.as_deref().unwrap_or("no such location"),
                    d.location_id,
                    d.on_hand,
                    available,
                    d.reserved,
                    d.committed,
                    d.ledger_stock
                )
            }
        }
    }
}

/// Every inventory, level and order line that breaks the invariant; empty
/// when all is well. One statement, so all the numbers come from one snapshot.
pub async fn check(db: &impl ConnectionTrait) -> Result<Vec<Drift>, DbErr> {
    // The two kinds of drift have different columns, so each row carries
    // its numbers as one JSON object, read into the kind's struct.
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH lines AS (
    SELECT inventory_id,
           coalesce({reserved}, 0) AS reserved,
           coalesce({committed}, 0) AS committed,
           coalesce({fulfilled}, 0) AS fulfilled
      FROM reservations WHERE status IN {counted} GROUP BY inventory_id
), misallocated AS (
    -- Only the counted lines' allocations are summed: the released and
    -- expired ones' are most of the table and count nowhere.
    SELECT inventory_id, count(*) AS n
      FROM (SELECT r.inventory_id, r.quantity, sum(a.quantity) AS allocated
              FROM reservations r LEFT JOIN allocations a ON a.reservation_id = r.id
             WHERE r.status IN {counted}
             GROUP BY r.id) AS line
     WHERE allocated IS DISTINCT FROM quantity
     GROUP BY inventory_id
), ledger AS (
    -- The ledger rows, and what archived ones added up to (their checkpoint).
    SELECT inventory_id, sum(changes) AS changes, sum(ledger_stock) AS ledger_stock,
           sum(ledger_fulfilled) AS ledger_fulfilled, sum(received) AS received
      FROM (SELECT inventory_id,
                   count(DISTINCT version_after) AS changes,
                   {ledger_stock} AS ledger_stock,
                   {ledger_fulfilled} AS ledger_fulfilled,
                   {ledger_received} AS received
              FROM stock_movements GROUP BY inventory_id
            UNION ALL
            SELECT inventory_id, changes, stock, fulfilled, received FROM ledger_checkpoints) AS parts
     GROUP BY inventory_id
), levels AS (
    SELECT inventory_id, sum(available) AS available, array_agg(location_id ORDER BY location_id) AS locations
      FROM stock_levels GROUP BY inventory_id
), located AS (
    -- Every (inventory, location) that a level, a holding allocation, a
    -- ledger row or a checkpoint names; `available` stays NULL without a level.
    SELECT inventory_id, location_id, sum(available) AS available,
           sum(reserved) AS reserved, sum(committed) AS committed,
           sum(on_hand) AS on_hand, sum(ledger_stock) AS ledger_stock
      FROM (SELECT inventory_id, location_id, available::bigint AS available,
                   0 AS reserved, 0 AS committed, 0 AS on_hand, 0 AS ledger_stock
              FROM stock_levels
            UNION ALL
            SELECT r.inventory_id, a.location_id, NULL,
                   coalesce({allocated_reserved}, 0), coalesce({allocated_committed}, 0), 0, 0
              FROM allocations a JOIN reservations r ON r.id = a.reservation_id
             WHERE r.status IN {holding}
             GROUP BY r.inventory_id, a.location_id
            UNION ALL
            SELECT inventory_id, {location}, NULL, 0, 0, {ledger_on_hand}, {ledger_stock}
              FROM stock_movements GROUP BY 1, 2
            UNION ALL
            SELECT inventory_id, location_id, NULL, 0, 0, on_hand, stock
              FROM ledger_checkpoint_levels) AS parts
     GROUP BY inventory_id, location_id
)
SELECT kind, detail FROM (
    SELECT 'inventory' AS kind, d.sku, NULL::text AS code, to_jsonb(d) AS detail
      FROM (SELECT i.id, i.sku, i.stock::bigint AS stock, i.version::bigint AS version,
                   coalesce(h.reserved, 0)::bigint AS reserved,
                   coalesce(h.committed, 0)::bigint AS committed,
                   coalesce(h.fulfilled, 0)::bigint AS fulfilled,
                   coalesce(l.received, 0)::bigint AS received,
                   coalesce(l.changes, 0)::bigint AS changes,
                   coalesce(l.ledger_stock, 0)::bigint AS ledger_stock,
                   coalesce(l.ledger_fulfilled, 0)::bigint AS ledger_fulfilled,
                   coalesce(v.available, 0)::bigint AS levels_available,
                   coalesce(v.locations, '{{}}') AS level_locations,
                   i.sole_location_id,
                   coalesce(m.n, 0)::bigint AS misallocated
              FROM inventories i
              LEFT JOIN lines h ON h.inventory_id = i.id
              LEFT JOIN ledger l ON l.inventory_id = i.id
              LEFT JOIN levels v ON v.inventory_id = i.id
              LEFT JOIN misallocated m ON m.inventory_id = i.id
             WHERE NOT (i.stock >= 0
                        AND coalesce(l.received, 0) - coalesce(h.fulfilled, 0)
                            = i.stock + coalesce(h.reserved, 0) + coalesce(h.committed, 0)
                        AND i.version = coalesce(l.changes, 0)
                        AND i.stock = coalesce(l.ledger_stock, 0)
                        AND coalesce(h.fulfilled, 0) = coalesce(l.ledger_fulfilled, 0)
                        AND i.stock = coalesce(v.available, 0)
                        AND (i.sole_location_id IS NULL OR v.locations = ARRAY[i.sole_location_id])
                        AND m.n IS NULL)) AS d
    UNION ALL
    SELECT 'level', d.sku, d.code, to_jsonb(d)
      FROM (SELECT p.inventory_id, i.sku, p.location_id, o.code, p.available::bigint AS available,
                   p.reserved::bigint AS reserved, p.committed::bigint AS committed,
                   p.on_hand::bigint AS on_hand, p.ledger_stock::bigint AS ledger_stock
              FROM located p
              JOIN inventories i ON i.id = p.inventory_id
              LEFT JOIN locations o ON o.id = p.location_id
             WHERE NOT (p.available IS NOT NULL
                        AND p.available >= 0
                        AND p.on_hand = p.available + p.reserved + p.committed
                        AND p.available = p.ledger_stock)) AS d
    UNION ALL
    SELECT 'line', d.sku, NULL, to_jsonb(d)
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
                        AND (r.returned = 0 OR r.status = {fulfilled_status}))) AS d
) AS drifts
 ORDER BY sku, kind, code"#,
            reserved = units(ReservationStatus::Active),
            committed = units(ReservationStatus::Ordered),
            fulfilled = units(ReservationStatus::Fulfilled),
            fulfilled_status = sql(ReservationStatus::Fulfilled),
            counted = sql_list([ReservationStatus::Active, ReservationStatus::Ordered, ReservationStatus::Fulfilled]),
            holding = holding(),
            allocated_reserved = allocated(ReservationStatus::Active),
            allocated_committed = allocated(ReservationStatus::Ordered),
            location = ledger_location(""),
            ledger_stock = ledger_stock(),
            ledger_fulfilled = ledger_fulfilled(),
            ledger_received = ledger_received(),
            ledger_on_hand = ledger_on_hand(),
        )
    });
    let rows = db.query_all_raw(Statement::from_string(DbBackend::Postgres, SQL.as_str())).await?;
    rows.iter()
        .map(|row| {
            let kind: String = row.try_get("", "kind")?;
            let detail: serde_json::Value = row.try_get("", "detail")?;
            let read = |err: serde_json::Error| DbErr::Type(format!("a {kind} drift: {err}"));
            match kind.as_str() {
                "inventory" => serde_json::from_value(detail).map(Drift::Inventory).map_err(read),
                "line" => serde_json::from_value(detail).map(Drift::Line).map_err(read),
                _ => serde_json::from_value(detail).map(Drift::Level).map_err(read),
            }
        })
        .collect()
}
