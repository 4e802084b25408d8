//! Giving stock back: a release, the sweeper's expiry of due reservations,
//! and the lines of a cancelled order.

use std::sync::LazyLock;

use sea_orm::{DbBackend, Statement};
use uuid::Uuid;

use super::fragments::{LEDGER, inventory_columns, reservation_columns_as_r, set, step};

/// Gives an ACTIVE, unexpired reservation of `owner`'s stock back, once: the
/// conditions are in the UPDATE's WHERE, so of many concurrent releases
/// exactly one matches, and an expired one is left to the sweeper. One row
/// (read with `ReservationChange::from_row`) when it was released; 0 rows:
/// not there, not the caller's, or not ACTIVE any more (a concurrent release
/// won, or it expired), which one read afterwards tells apart.
pub fn release(reservation_id: Uuid, owner: &str) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH released AS (
    UPDATE reservations SET status = 'RELEASED'
     WHERE id = $1 AND status = 'ACTIVE' AND user_id = $2 AND (expires_at IS NULL OR expires_at > now())
 RETURNING *
), returned AS (
    UPDATE inventories i
       {set}
      FROM released r
     WHERE i.id = r.inventory_id
 RETURNING {columns}, r.quantity
), movement AS (
    {LEDGER}
    SELECT id, quantity, 'RELEASED', stock, version, $1, NULL FROM returned
)
SELECT returned.*, {reservation} FROM returned, released r"#,
            set = step("i.", "+ r.quantity"),
            columns = inventory_columns("i."),
            reservation = reservation_columns_as_r(),
        )
    });
    Statement::from_sql_and_values(DbBackend::Postgres, SQL.as_str(), [reservation_id.into(), owner.into()])
}

/// Expires at most `limit` due reservations; one row, how many it expired.
///
/// Rows another sweeper (or a release, or an extension) holds are skipped,
/// not waited for: they are either being handled or no longer due. Their
/// inventories are locked in id order (`locked`), the order every
/// multi-item writer locks in, so a sweep and an order (or another sweep)
/// wait for each other instead of deadlocking. Each expiry is its own change
/// of its inventory: the version grows by the number of expired
/// reservations, and each gets its ledger row with the running stock and
/// version.
pub fn sweep(limit: i64) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH due AS (
    SELECT id FROM reservations
     WHERE status = 'ACTIVE' AND expires_at <= now()
     ORDER BY expires_at
     LIMIT $1
       FOR UPDATE SKIP LOCKED
), expired AS (
    UPDATE reservations r SET status = 'EXPIRED'
      FROM due WHERE r.id = due.id
 RETURNING r.id, r.inventory_id, r.quantity
), totals AS (
    SELECT inventory_id, sum(quantity)::integer AS quantity, count(*)::integer AS n
      FROM expired GROUP BY inventory_id
), locked AS MATERIALIZED (
    SELECT id FROM inventories
     WHERE id IN (SELECT inventory_id FROM totals)
     ORDER BY id
       FOR UPDATE
), returned AS (
    UPDATE inventories i
       {set}
      FROM totals t JOIN locked l ON l.id = t.inventory_id
     WHERE i.id = t.inventory_id
 RETURNING i.id, i.stock, i.version, t.quantity, t.n
), movement AS (
    {LEDGER}
    SELECT e.inventory_id, e.quantity, 'EXPIRED',
           (r.stock - r.quantity + sum(e.quantity) OVER w)::integer,
           (r.version - r.n + row_number() OVER w)::integer,
           e.id, NULL
      FROM expired e JOIN returned r ON r.id = e.inventory_id
    WINDOW w AS (PARTITION BY e.inventory_id ORDER BY e.id)
)
SELECT count(*) FROM expired"#,
            set = set("i.stock + t.quantity", "i.version + t.n"),
        )
    });
    Statement::from_sql_and_values(DbBackend::Postgres, SQL.as_str(), [limit.into()])
}

/// This locks the inventories of an order's lines in id order, the order
/// every multi-item writer (and the sweeper) locks in, so a cancel and a
/// `placeOrder` cannot deadlock. Run inside the cancelling transaction,
/// before [`cancel_order`].
pub fn lock_order(order_id: Uuid) -> Statement {
    Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT 1 FROM inventories
          WHERE id IN (SELECT inventory_id FROM reservations WHERE order_id = $1)
          ORDER BY id FOR UPDATE",
        [order_id.into()],
    )
}

/// Gives back the stock of a cancelled order's lines: the lines turn
/// RELEASED and each inventory and the ledger change in one statement. Only
/// ORDERED lines match, so stock can come back once per line.
pub fn cancel_order(order_id: Uuid) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH released AS (
    UPDATE reservations SET status = 'RELEASED'
     WHERE order_id = $1 AND status = 'ORDERED'
 RETURNING id, inventory_id, quantity
), returned AS (
    UPDATE inventories i
       {set}
      FROM released r
     WHERE i.id = r.inventory_id
 RETURNING i.id, i.stock, i.version, r.quantity, r.id AS reservation_id
)
{LEDGER}
SELECT id, quantity, 'ORDER_CANCELLED', stock, version, reservation_id, $1 FROM returned"#,
            set = step("i.", "+ r.quantity"),
        )
    });
    Statement::from_sql_and_values(DbBackend::Postgres, SQL.as_str(), [order_id.into()])
}
