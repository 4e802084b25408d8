//! Moving stock between two locations of one inventory (`transferStock`).

use std::sync::LazyLock;

use sea_orm::{DbBackend, Statement};
use uuid::Uuid;

use super::{
    fragments::{Ids, LEDGER, inventory_columns, lock_inventories, lock_levels, step},
    rows::{MovementReason, sql},
};

/// Moves `quantity` units of inventory `inventory_id` from location `from`
/// to location `to`, only if the row is still at `expected_version` when
/// one is given, and claims `user_id`'s idempotency key with the request's
/// fingerprint when one is given. One change of the inventory: its stock
/// (the sum of its levels) stays, its version grows by 1, and two ledger
/// rows at that version (`TRANSFERRED_OUT` at `from`, `TRANSFERRED_IN` at
/// `to`). One row when it moved: the inventory as left (the columns an
/// `InventoryRow` reads), with `from_available` and `to_available`, the two
/// levels' available units as this statement left them.
///
/// This locks the inventory row first and then its levels (the
/// locking protocol: the inventory row is the mutex for its levels), so two
/// transfers in opposite directions between the same two locations queue on
/// the inventory row instead of deadlocking on the levels, and the source's
/// available units are read locked, so concurrent transfers and takers never
/// overdraw it. The target level is made by the first unit that arrives.
///
/// 0 rows: no such inventory, the version moved, or the source holds fewer
/// than `quantity` (or has no level); one read afterwards tells which. It
/// locks every level of the inventory, so a level another statement created
/// after this one's snapshot (READ COMMITTED) shows as levels that do not
/// add up to the row's stock, and the statement is run again
/// (`retry_stale_read`) instead of reading the source as absent. A key
/// already claimed fails on `idempotency_keys`' primary key and rolls the
/// whole statement back.
pub(crate) fn transfer(
    inventory_id: Uuid,
    from: Uuid,
    to: Uuid,
    quantity: i32,
    expected_version: Option<i32>,
    user_id: &str,
    key: Option<(&str, &str)>,
) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH inv AS MATERIALIZED (
    {inv}
), lvl AS MATERIALIZED (
    {lvl}
), src AS (
    SELECT CASE WHEN coalesce(sum(available), 0) = coalesce((SELECT stock FROM inv), 0)
                THEN coalesce(sum(available) FILTER (WHERE location_id = $2), 0)
                ELSE CASE WHEN retry_stale_read() THEN 0 END END AS available
      FROM lvl
), moved AS (
    UPDATE inventories i
       {set}, sole_location_id = CASE WHEN i.sole_location_id = $3 THEN $3 END
      FROM inv
     WHERE i.id = inv.id AND (SELECT available FROM src) >= $4
 RETURNING {columns}
), drawn AS (
    -- From the locked value, not the UPDATE's own row: at READ COMMITTED
    -- that is first the snapshot's, and a level raised since would fail
    -- `available >= 0` for nothing.
    UPDATE stock_levels l SET available = (SELECT available FROM lvl WHERE location_id = $2) - $4
      FROM moved m
     WHERE l.inventory_id = m.id AND l.location_id = $2
 RETURNING l.available
), arrived AS (
    INSERT INTO stock_levels (inventory_id, location_id, available)
    SELECT id, $3, $4 FROM moved
        ON CONFLICT (inventory_id, location_id) DO UPDATE SET available = stock_levels.available + excluded.available
 RETURNING available
), movement AS (
    -- Typed NULLs: the UNION would otherwise resolve them as text.
    {LEDGER}
    SELECT id, -$4, {out}, stock, version, NULL::uuid, NULL::uuid, $2 FROM moved
     UNION ALL
    SELECT id, $4, {into}, stock, version, NULL::uuid, NULL::uuid, $3 FROM moved
), claimed AS (
    INSERT INTO idempotency_keys (user_id, idempotency_key, request_fingerprint)
    SELECT $6, $7, $8 FROM moved WHERE $7::text IS NOT NULL
)
SELECT moved.*, drawn.available AS from_available, arrived.available AS to_available
  FROM moved, drawn, arrived"#,
            inv = lock_inventories("id, stock", Ids::One("$1"), Some("($5::integer IS NULL OR version = $5)")),
            lvl = lock_levels(Ids::One("(SELECT id FROM inv)")),
            set = step("i.", ""),
            columns = inventory_columns("i."),
            out = sql(MovementReason::TransferredOut),
            into = sql(MovementReason::TransferredIn),
        )
    });
    Statement::from_sql_and_values(
        DbBackend::Postgres,
        SQL.as_str(),
        [
            inventory_id.into(),
            from.into(),
            to.into(),
            quantity.into(),
            expected_version.into(),
            user_id.into(),
            key.map(|(key, _)| key.to_owned()).into(),
            key.map(|(_, fingerprint)| fingerprint.to_owned()).into(),
        ],
    )
}
