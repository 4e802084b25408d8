//! The invariant of docs/design.md, checked straight from the tables: for every
//! inventory row
//!
//! - `stock >= 0`;
//! - `stock + held = received`, where `held` is the quantity of its ACTIVE and
//!   ORDERED reservations and `received` is its initial stock plus restocks;
//! - `version` = 1 + its committed changes = its number of ledger entries;
//! - the ledger adds up: the sum of its deltas is `stock`.
//!
//! `stockguard check`, every concurrency test and the benchmark use this one check.

use sea_orm::{ConnectionTrait, DbBackend, DbErr, FromQueryResult, Statement};
use uuid::Uuid;

/// One inventory whose numbers do not add up.
#[derive(Debug, Clone, PartialEq, Eq, FromQueryResult)]
pub struct Drift {
    /// The inventory.
    pub id: Uuid,
    /// Its SKU.
    pub sku: String,
    /// Units on hand.
    pub stock: i32,
    /// Its version.
    pub version: i32,
    /// Units held by ACTIVE and ORDERED reservations.
    pub held: i64,
    /// Initial stock plus restocks, from the ledger.
    pub received: i64,
    /// Number of ledger entries (should equal `version`).
    pub changes: i64,
    /// Sum of the ledger's deltas (should equal `stock`).
    pub ledger_stock: i64,
}

impl std::fmt::Display for Drift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}): stock {} + held {} vs received {}; version {} vs {} ledger entries; ledger sums to {}",
            self.sku, self.id, self.stock, self.held, self.received, self.version, self.changes, self.ledger_stock
        )
    }
}

/// Every inventory that breaks the invariant; empty when all is well. One
/// statement, so all the numbers come from one snapshot.
pub async fn check(db: &impl ConnectionTrait) -> Result<Vec<Drift>, DbErr> {
    const SQL: &str = r#"
WITH held AS (
    SELECT inventory_id, sum(quantity) AS held
      FROM reservations WHERE status IN ('ACTIVE', 'ORDERED') GROUP BY inventory_id
), ledger AS (
    SELECT inventory_id,
           count(*) AS changes,
           sum(delta) AS ledger_stock,
           coalesce(sum(delta) FILTER (WHERE reason IN ('CREATED', 'RESTOCKED')), 0) AS received
      FROM stock_movements GROUP BY inventory_id
)
SELECT i.id, i.sku, i.stock, i.version,
       coalesce(h.held, 0)::bigint AS held,
       coalesce(l.received, 0)::bigint AS received,
       coalesce(l.changes, 0)::bigint AS changes,
       coalesce(l.ledger_stock, 0)::bigint AS ledger_stock
  FROM inventories i
  LEFT JOIN held h ON h.inventory_id = i.id
  LEFT JOIN ledger l ON l.inventory_id = i.id
 WHERE NOT (i.stock >= 0
            AND i.stock + coalesce(h.held, 0) = coalesce(l.received, 0)
            AND i.version = coalesce(l.changes, 0)
            AND i.stock = coalesce(l.ledger_stock, 0))
 ORDER BY i.sku"#;
    Drift::find_by_statement(Statement::from_string(DbBackend::Postgres, SQL)).all(db).await
}
