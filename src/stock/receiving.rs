//! Receiving stock: a new inventory with its initial stock, and a restock.

use std::sync::LazyLock;

use sea_orm::{DbBackend, Statement};
use uuid::Uuid;

use super::{
    fragments::{LEDGER, inventory_columns, location_or_default as location, step},
    rows::{MovementReason, sql},
};

/// A new inventory at version 1 with its initial stock at `location_id`
/// (None: the default location) and its `CREATED` ledger row there, in one
/// statement; one row, the inventory. A taken SKU fails on its unique
/// index; no row when the location does not exist.
pub fn create(id: Uuid, sku: &str, name: &str, stock: i32, location_id: Option<Uuid>) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH loc AS (
    {location}
), created AS (
    INSERT INTO inventories (id, sku, name, stock, version, sole_location_id)
    SELECT $1, $2, $3, $4, 1, loc.id FROM loc
    RETURNING {columns}
), level AS (
    INSERT INTO stock_levels (inventory_id, location_id, available)
    SELECT id, sole_location_id, stock FROM created
), movement AS (
    {LEDGER}
    SELECT id, stock, {reason}, stock, version, NULL, NULL, sole_location_id FROM created
)
SELECT * FROM created"#,
            location = location("$5"),
            reason = sql(MovementReason::Created),
            columns = inventory_columns(""),
        )
    });
    Statement::from_sql_and_values(
        DbBackend::Postgres,
        SQL.as_str(),
        [id.into(), sku.into(), name.into(), stock.into(), location_id.into()],
    )
}

/// Adds `quantity` units at `location_id` (None: the default location),
/// only if the row is still at `expected_version` when one is given; one
/// row, the inventory as left.
///
/// A conditional UPDATE: the version check (when given) is in the WHERE, so
/// two operators restocking from the same screen cannot both succeed; 0 rows
/// means "not found, version moved, or no such location", told apart by
/// reads afterwards. The inventory row is updated (locked) before its level,
/// which is made when the location never held it; an inventory then held
/// in a second place is no longer held in one (`sole_location_id`).
pub fn restock(id: Uuid, quantity: i32, expected_version: Option<i32>, location_id: Option<Uuid>) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH loc AS (
    {location}
), restocked AS (
    UPDATE inventories i
       {set}, sole_location_id = CASE WHEN i.sole_location_id = loc.id THEN loc.id END
      FROM loc
     WHERE i.id = $1 AND ($3::integer IS NULL OR i.version = $3)
 RETURNING {columns}, loc.id AS location_id
), level AS (
    INSERT INTO stock_levels (inventory_id, location_id, available)
    SELECT id, location_id, $2 FROM restocked
        ON CONFLICT (inventory_id, location_id) DO UPDATE SET available = stock_levels.available + excluded.available
), movement AS (
    {LEDGER}
    SELECT id, $2, {reason}, stock, version, NULL, NULL, location_id FROM restocked
)
SELECT * FROM restocked"#,
            location = location("$4"),
            set = step("i.", "+ $2"),
            reason = sql(MovementReason::Restocked),
            columns = inventory_columns("i."),
        )
    });
    Statement::from_sql_and_values(
        DbBackend::Postgres,
        SQL.as_str(),
        [id.into(), quantity.into(), expected_version.into(), location_id.into()],
    )
}
