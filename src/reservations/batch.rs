//! Several inventories at once (`reserveMany`, `placeOrder`): all or nothing.
//!
//! Lines naming the same inventory are merged first. Then, in one short
//! transaction, the rows are locked in one fixed order (by id), so two requests
//! naming the same inventories in opposite orders queue instead of
//! deadlocking; the lines are judged against the locked rows; and one
//! statement takes the stock, writes the reservations and their ledger entries.

use std::collections::BTreeMap;

use sea_orm::{DatabaseTransaction, DbBackend, DbErr, FromQueryResult, Statement, Value};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::ReservationRow;
use crate::{error::AppError, inventory::InventoryRow, validate};

/// Most lines in one request, after merging.
pub const MAX_LINES: usize = 100;

/// One merged, checked line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The inventory.
    pub inventory_id: Uuid,
    /// Units, summed over the request's lines for this inventory.
    pub quantity: i32,
    /// The version the client saw, if it sent one.
    pub expected_version: Option<i32>,
}

/// A line as the client sent it.
#[derive(Debug, Clone)]
pub struct LineInput {
    /// The inventory.
    pub inventory_id: Uuid,
    /// Units.
    pub quantity: i32,
    /// The version the client saw.
    pub expected_version: Option<i32>,
}

/// Checks and merges lines: each quantity and each merged sum in
/// `1..=max_quantity`, at most [`MAX_LINES`], one expected version per
/// inventory. The result is sorted by inventory id, the locking order.
pub fn merge(lines: &[LineInput], max_quantity: i32) -> Result<Vec<Line>, AppError> {
    if lines.is_empty() {
        return Err(AppError::bad_input("input.items", "input.items must name at least one inventory"));
    }
    let mut merged: BTreeMap<Uuid, Line> = BTreeMap::new();
    for (i, input) in lines.iter().enumerate() {
        let field = format!("input.items[{i}].quantity");
        validate::quantity(&field, input.quantity, max_quantity)?;
        let line = merged.entry(input.inventory_id).or_insert(Line {
            inventory_id: input.inventory_id,
            quantity: 0,
            expected_version: None,
        });
        line.quantity = validate::quantity(&field, line.quantity + input.quantity, max_quantity)?;
        match (line.expected_version, input.expected_version) {
            (Some(a), Some(b)) if a != b => {
                return Err(AppError::bad_input(
                    format!("input.items[{i}].expectedVersion"),
                    format!("inventory {} is named with two different expectedVersions", input.inventory_id),
                ));
            }
            (None, given) => line.expected_version = given,
            _ => {}
        }
    }
    if merged.len() > MAX_LINES {
        return Err(AppError::bad_input("input.items", format!("at most {MAX_LINES} inventories per request")));
    }
    Ok(merged.into_values().collect())
}

/// A hash of an operation and its merged lines (plus anything else that
/// makes the request what it is), to tell an idempotent replay from a reuse.
pub fn fingerprint(operation: &str, lines: &[Line], extra: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(operation.as_bytes());
    for line in lines {
        hasher.update(format!("\n{}:{}:{:?}", line.inventory_id, line.quantity, line.expected_version));
    }
    hasher.update(b"\n");
    hasher.update(extra.as_bytes());
    hex::encode(hasher.finalize())
}

/// Why a line could not be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, async_graphql::Enum)]
pub enum UnavailableReason {
    /// Not enough stock.
    SoldOut,
    /// The row is no longer at the expected version.
    Conflict,
    /// No inventory has that id.
    NotFound,
}

/// A line that could not be served, with the latest state of its inventory.
#[derive(Debug, Clone)]
pub struct Unavailable {
    /// The inventory the line named.
    pub inventory_id: Uuid,
    /// Why.
    pub reason: UnavailableReason,
    /// The latest committed row (none when not found).
    pub inventory: Option<InventoryRow>,
}

/// What the lines are taken for.
#[derive(Debug, Clone, Copy)]
pub enum Purpose {
    /// Plain reservations (`reserveMany`): ACTIVE for `ttl_secs` (0 = never
    /// expire), ledger reason RESERVED.
    Reservations {
        /// Seconds until they expire.
        ttl_secs: i32,
    },
    /// The lines of this order (`placeOrder`): ORDERED, ledger reason ORDERED.
    Order(Uuid),
}

/// An idempotency key and the fingerprint of the request that carries it.
#[derive(Debug, Clone)]
pub struct Keyed {
    /// The client's key.
    pub key: String,
    /// The request's fingerprint.
    pub fingerprint: String,
}

/// Takes every line or none, inside `txn`. `Ok(Err(..))` lists every line
/// that cannot be served; the caller then rolls back (nothing was written).
pub async fn take(
    txn: &DatabaseTransaction,
    user_id: &str,
    lines: &[Line],
    purpose: Purpose,
    keyed: Option<&Keyed>,
) -> Result<Result<Vec<ReservationRow>, Vec<Unavailable>>, DbErr> {
    let ids: Vec<Uuid> = lines.iter().map(|l| l.inventory_id).collect();
    // This locks the rows in id order for the rest of the transaction, so two
    // requests naming the same inventories in opposite orders wait for each
    // other instead of deadlocking, and the judgement below cannot go stale.
    let locked = InventoryRow::find_by_statement(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT id, sku, name, stock, version, created_at, updated_at
           FROM inventories WHERE id = ANY($1) ORDER BY id FOR UPDATE",
        [ids_value(&ids)],
    ))
    .all(txn)
    .await?;
    let unavailable = judge(lines, &locked);
    if !unavailable.is_empty() {
        return Ok(Err(unavailable));
    }

    // The same conditions again in the UPDATE's WHERE: with the rows locked
    // they hold, and a line that did not match shows up as a missing row.
    const SQL: &str = r#"
WITH line AS (
    SELECT inventory_id, quantity, CASE WHEN checked THEN expected_version END AS expected_version, n
      FROM unnest($1::uuid[], $2::integer[], $3::integer[], $11::boolean[]) WITH ORDINALITY
        AS l(inventory_id, quantity, expected_version, checked, n)
), taken AS (
    UPDATE inventories i
       SET stock = i.stock - line.quantity, version = i.version + 1, updated_at = now()
      FROM line
     WHERE i.id = line.inventory_id AND i.stock >= line.quantity
       AND (line.expected_version IS NULL OR i.version = line.expected_version)
 RETURNING i.id, i.stock, i.version, line.quantity, line.n
), reservation AS (
    INSERT INTO reservations (id, inventory_id, order_id, user_id, quantity, status,
                              idempotency_key, request_fingerprint, batch_id, expires_at)
    SELECT gen_random_uuid(), id, $4, $5, quantity, $6,
           CASE WHEN n = 1 THEN $7 END, CASE WHEN n = 1 THEN $8 END, $9,
           CASE WHEN $12::integer > 0 THEN now() + $12::integer * interval '1 second' END
      FROM taken
 RETURNING *
), movement AS (
    INSERT INTO stock_movements (inventory_id, delta, reason, stock_after, version_after, reservation_id, order_id)
    SELECT t.id, -t.quantity, $10, t.stock, t.version, r.id, $4
      FROM taken t JOIN reservation r ON r.inventory_id = t.id
)
SELECT * FROM reservation ORDER BY inventory_id"#;
    // Order lines never expire: they hold stock until the order is cancelled.
    let (order_id, status, reason, ttl_secs) = match purpose {
        Purpose::Reservations { ttl_secs } => (None, "ACTIVE", "RESERVED", ttl_secs),
        Purpose::Order(id) => (Some(id), "ORDERED", "ORDERED", 0),
    };
    let values: Vec<Value> = vec![
        ids_value(&ids),
        Value::from(lines.iter().map(|l| l.quantity).collect::<Vec<i32>>()),
        // Arrays cannot carry NULLs through the driver, so "no expected
        // version" travels as `false` in $11 beside a placeholder 0.
        Value::from(lines.iter().map(|l| l.expected_version.unwrap_or(0)).collect::<Vec<i32>>()),
        order_id.into(),
        user_id.into(),
        status.into(),
        keyed.map(|k| k.key.clone()).into(),
        keyed.map(|k| k.fingerprint.clone()).into(),
        Uuid::new_v4().into(),
        reason.into(),
        Value::from(lines.iter().map(|l| l.expected_version.is_some()).collect::<Vec<bool>>()),
        ttl_secs.into(),
    ];
    let rows = ReservationRow::find_by_statement(Statement::from_sql_and_values(DbBackend::Postgres, SQL, values))
        .all(txn)
        .await?;
    if rows.len() != lines.len() {
        return Err(DbErr::Custom(format!("{} of {} locked lines were taken", rows.len(), lines.len())));
    }
    Ok(Ok(rows))
}

fn ids_value(ids: &[Uuid]) -> Value {
    Value::from(ids.to_vec())
}

/// Every line the locked rows cannot serve.
fn judge(lines: &[Line], locked: &[InventoryRow]) -> Vec<Unavailable> {
    lines
        .iter()
        .filter_map(|line| {
            let row = locked.iter().find(|row| row.id == line.inventory_id);
            let reason = match row {
                None => UnavailableReason::NotFound,
                // The same order of reasons as a single `reserve`: stock first.
                Some(row) if row.stock < line.quantity => UnavailableReason::SoldOut,
                Some(row) if line.expected_version.is_some_and(|v| v != row.version) => UnavailableReason::Conflict,
                Some(_) => return None,
            };
            Some(Unavailable { inventory_id: line.inventory_id, reason, inventory: row.cloned() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(id: Uuid, quantity: i32, expected_version: Option<i32>) -> LineInput {
        LineInput { inventory_id: id, quantity, expected_version }
    }

    #[test]
    fn lines_for_one_inventory_are_summed_and_sorted_by_id() {
        let (a, b) = (Uuid::from_u128(2), Uuid::from_u128(1));
        let merged = merge(&[input(a, 2, None), input(b, 1, Some(4)), input(a, 3, Some(7))], 1000).expect("merge");
        assert_eq!(
            merged,
            vec![
                Line { inventory_id: b, quantity: 1, expected_version: Some(4) },
                Line { inventory_id: a, quantity: 5, expected_version: Some(7) },
            ]
        );
    }

    #[test]
    fn two_expected_versions_for_one_inventory_are_bad_input() {
        let a = Uuid::from_u128(1);
        assert!(merge(&[input(a, 1, Some(1)), input(a, 1, Some(2))], 1000).is_err());
    }

    #[test]
    fn empty_requests_and_merged_sums_over_the_limit_are_bad_input() {
        let a = Uuid::from_u128(1);
        assert!(merge(&[], 1000).is_err());
        assert!(merge(&[input(a, 600, None), input(a, 600, None)], 1000).is_err());
    }
}
