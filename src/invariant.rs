//! The invariant of docs/design.md, extended by the checkout contract
//! (docs/checkout.md), checked straight from the tables: for every inventory row
//!
//! - `stock >= 0` (`stock` is `available`);
//! - `received - fulfilled = available + reserved + committed`, where
//!   `received` is its initial stock plus restocks, `fulfilled` the units of
//!   its FULFILLED lines, `reserved` the units of its ACTIVE reservations and
//!   `committed` those of its ORDERED ones (lines of PENDING and CONFIRMED
//!   orders). An ACTIVE reservation past its expiry counts as `reserved`
//!   until the sweeper returns its stock: its units are not `available`
//!   before that, so counting them anywhere else would break the sum;
//! - `version` = 1 + its committed changes = the number of versions in its
//!   ledger (a change writes one row per location it touches, at one version);
//! - the ledger agrees: the deltas of every change of available stock add up
//!   to `stock`, and the FULFILLED entries to minus the fulfilled lines' units.
//!   Entries archived by `stockguard archive` count through their
//!   inventory's checkpoint row (`ledger_checkpoints`), which holds their sums.
//!
//! One statement, so every number comes from one snapshot and the check holds
//! at every moment, not only when writers are idle. `stockguard check`, every
//! concurrency test and the benchmark use this one check.

use std::sync::LazyLock;

use sea_orm::{ConnectionTrait, DbBackend, DbErr, FromQueryResult, Statement};
use uuid::Uuid;

use crate::stock::{
    fragments::{ledger_fulfilled, ledger_received, ledger_stock, units},
    rows::{ReservationStatus, sql_list},
};

/// One inventory whose numbers do not add up.
#[derive(Debug, Clone, PartialEq, Eq, FromQueryResult)]
pub struct Drift {
    /// The inventory.
    pub id: Uuid,
    /// Its SKU.
    pub sku: String,
    /// Units available (the `stock` column).
    pub stock: i32,
    /// Its version.
    pub version: i32,
    /// Units held by ACTIVE reservations.
    pub reserved: i64,
    /// Units held by ORDERED reservations (order lines not yet fulfilled).
    pub committed: i64,
    /// Units of FULFILLED lines.
    pub fulfilled: i64,
    /// Initial stock plus restocks, from the ledger.
    pub received: i64,
    /// Number of versions in the ledger (should equal `version`).
    pub changes: i64,
    /// Sum of the ledger's deltas of available stock (should equal `stock`).
    pub ledger_stock: i64,
    /// Minus the sum of the ledger's FULFILLED deltas (should equal `fulfilled`).
    pub ledger_fulfilled: i64,
}

impl std::fmt::Display for Drift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}): received {} - fulfilled {} vs available {} + reserved {} + committed {}; \
             version {} vs {} ledger entries; ledger sums to {} available and {} fulfilled",
            self.sku,
            self.id,
            self.received,
            self.fulfilled,
            self.stock,
            self.reserved,
            self.committed,
            self.version,
            self.changes,
            self.ledger_stock,
            self.ledger_fulfilled
        )
    }
}

/// Every inventory that breaks the invariant; empty when all is well. One
/// statement, so all the numbers come from one snapshot.
pub async fn check(db: &impl ConnectionTrait) -> Result<Vec<Drift>, DbErr> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH lines AS (
    SELECT inventory_id,
           coalesce({reserved}, 0) AS reserved,
           coalesce({committed}, 0) AS committed,
           coalesce({fulfilled}, 0) AS fulfilled
      FROM reservations WHERE status IN {counted} GROUP BY inventory_id
), ledger AS (
    -- The ledger rows, and what archived ones added up to (their checkpoint).
    SELECT inventory_id, sum(changes) AS changes, sum(ledger_stock) AS ledger_stock,
           sum(ledger_fulfilled) AS ledger_fulfilled, sum(received) AS received
      FROM (SELECT inventory_id,
                   -- A change that touches several locations (a transfer)
                   -- writes a row per location, all at its version.
                   count(DISTINCT version_after) AS changes,
                   {ledger_stock} AS ledger_stock,
                   {ledger_fulfilled} AS ledger_fulfilled,
                   {ledger_received} AS received
              FROM stock_movements GROUP BY inventory_id
            UNION ALL
            SELECT inventory_id, changes, stock, fulfilled, received FROM ledger_checkpoints) AS parts
     GROUP BY inventory_id
)
SELECT i.id, i.sku, i.stock, i.version,
       coalesce(h.reserved, 0)::bigint AS reserved,
       coalesce(h.committed, 0)::bigint AS committed,
       coalesce(h.fulfilled, 0)::bigint AS fulfilled,
       coalesce(l.received, 0)::bigint AS received,
       coalesce(l.changes, 0)::bigint AS changes,
       coalesce(l.ledger_stock, 0)::bigint AS ledger_stock,
       coalesce(l.ledger_fulfilled, 0)::bigint AS ledger_fulfilled
  FROM inventories i
  LEFT JOIN lines h ON h.inventory_id = i.id
  LEFT JOIN ledger l ON l.inventory_id = i.id
 WHERE NOT (i.stock >= 0
            AND coalesce(l.received, 0) - coalesce(h.fulfilled, 0)
                = i.stock + coalesce(h.reserved, 0) + coalesce(h.committed, 0)
            AND i.version = coalesce(l.changes, 0)
            AND i.stock = coalesce(l.ledger_stock, 0)
            AND coalesce(h.fulfilled, 0) = coalesce(l.ledger_fulfilled, 0))
 ORDER BY i.sku"#,
            reserved = units(ReservationStatus::Active),
            committed = units(ReservationStatus::Ordered),
            fulfilled = units(ReservationStatus::Fulfilled),
            counted = sql_list([ReservationStatus::Active, ReservationStatus::Ordered, ReservationStatus::Fulfilled]),
            ledger_stock = ledger_stock(),
            ledger_fulfilled = ledger_fulfilled(),
            ledger_received = ledger_received(),
        )
    });
    Drift::find_by_statement(Statement::from_string(DbBackend::Postgres, SQL.as_str())).all(db).await
}
