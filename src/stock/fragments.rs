//! The pieces every stock statement is made of.

/// The inventory columns a statement returns, in the entity's order, so a
/// row reads back as an `InventoryRow`.
pub const INVENTORY_COLUMNS: &str = "id, sku, name, stock, version, created_at, updated_at";

/// [`INVENTORY_COLUMNS`] of the inventory aliased `alias` (`"i."`).
pub fn inventory_columns(alias: &str) -> String {
    INVENTORY_COLUMNS.split(", ").map(|column| format!("{alias}{column}")).collect::<Vec<_>>().join(", ")
}

/// The reservation columns, in the entity's order.
const RESERVATION_COLUMNS: [&str; 11] = [
    "id",
    "inventory_id",
    "order_id",
    "user_id",
    "quantity",
    "status",
    "idempotency_key",
    "request_fingerprint",
    "created_at",
    "expires_at",
    "batch_id",
];

/// Every reservation column of `r` as `r_<column>`, so one row carries an
/// inventory and a reservation side by side (read back with the prefix `"r_"`).
pub fn reservation_columns_as_r() -> String {
    RESERVATION_COLUMNS.iter().map(|column| format!("r.{column} AS r_{column}")).collect::<Vec<_>>().join(", ")
}

/// The `SET` of a change that leaves the row at `stock` and `version`; the
/// one place `updated_at` is kept.
pub fn set(stock: &str, version: &str) -> String {
    format!("SET stock = {stock}, version = {version}, updated_at = now()")
}

/// The `SET` of one change of the row aliased `alias` (`""` or `"i."`) by
/// `delta` (`"- $2"`): one version step.
pub fn step(alias: &str, delta: &str) -> String {
    set(&format!("{alias}stock {delta}"), &format!("{alias}version + 1"))
}

/// The ledger row of a change, to be followed by a `SELECT` of exactly these
/// seven values.
pub const LEDGER: &str =
    "INSERT INTO stock_movements (inventory_id, delta, reason, stock_after, version_after, reservation_id, order_id)";

/// When a reservation made now expires, given its TTL in seconds as the
/// integer parameter `seconds` (`"$8"`); 0 means never (NULL).
pub fn expiry(seconds: &str) -> String {
    format!("CASE WHEN {seconds}::integer > 0 THEN now() + {seconds}::integer * interval '1 second' END")
}
