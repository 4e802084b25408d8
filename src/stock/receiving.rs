//! Receiving stock: a new inventory with its initial stock, and a restock.

use std::sync::LazyLock;

use sea_orm::{DbBackend, Statement};
use uuid::Uuid;

use super::{
    fragments::{LEDGER, inventory_columns, step},
    rows::{MovementReason, sql},
};

/// A new inventory at version 1 with its `CREATED` ledger row, in one
/// statement; one row, the inventory. A taken SKU fails on its unique index.
pub fn create(id: Uuid, sku: &str, name: &str, stock: i32) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH created AS (
    INSERT INTO inventories (id, sku, name, stock, version)
    VALUES ($1, $2, $3, $4, 1)
    RETURNING {columns}
), movement AS (
    {LEDGER}
    SELECT id, stock, {reason}, stock, version, NULL, NULL FROM created
)
SELECT * FROM created"#,
            reason = sql(MovementReason::Created),
            columns = inventory_columns(""),
        )
    });
    Statement::from_sql_and_values(
        DbBackend::Postgres,
        SQL.as_str(),
        [id.into(), sku.into(), name.into(), stock.into()],
    )
}

/// Adds `quantity` units, only if the row is still at `expected_version`
/// when one is given; one row, the inventory as left.
///
/// A conditional UPDATE: the version check (when given) is in the WHERE, so
/// two operators restocking from the same screen cannot both succeed; 0 rows
/// means "not found or version moved", told apart by one read afterwards.
pub fn restock(id: Uuid, quantity: i32, expected_version: Option<i32>) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH restocked AS (
    UPDATE inventories
       {set}
     WHERE id = $1 AND ($3::integer IS NULL OR version = $3)
 RETURNING {columns}
), movement AS (
    {LEDGER}
    SELECT id, $2, {reason}, stock, version, NULL, NULL FROM restocked
)
SELECT * FROM restocked"#,
            set = step("", "+ $2"),
            reason = sql(MovementReason::Restocked),
            columns = inventory_columns(""),
        )
    });
    Statement::from_sql_and_values(
        DbBackend::Postgres,
        SQL.as_str(),
        [id.into(), quantity.into(), expected_version.into()],
    )
}
