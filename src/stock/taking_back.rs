//! Taking back what a customer sent: a return of a fulfilled order's lines,
//! restocked or written off, counted against what each line shipped.

use std::sync::LazyLock;

use sea_orm::{ActiveEnum as _, DbBackend, Statement};
use uuid::Uuid;

use super::{
    fragments::{Ids, LEDGER_BY_OPERATOR, lock_inventories, step},
    rows::{MovementReason, ReservationStatus, ReturnDisposition, sql},
};

/// One inventory's units of a return as the operator asked for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReturnLine {
    /// The inventory; the order has one line (or more) of it.
    pub inventory_id: Uuid,
    /// Units, at least 1.
    pub quantity: i32,
    /// Restocked or written off.
    pub disposition: ReturnDisposition,
    /// Where restocked units go; none: back where the line shipped them
    /// from. Always none for a write-off.
    pub location_id: Option<Uuid>,
}

/// A return as the statement writes it.
#[derive(Debug, Clone, Copy)]
pub struct OrderReturn<'a> {
    /// The order.
    pub order_id: Uuid,
    /// The new return's id.
    pub return_id: Uuid,
    /// The operator (the token's `sub`): the return's `created_by`, the
    /// ledger rows' `actor`, and whose key space the key is in.
    pub operator: &'a str,
    /// The operator's note, if any.
    pub note: Option<&'a str>,
    /// One line per inventory.
    pub lines: &'a [ReturnLine],
    /// The idempotency key and the request's fingerprint, if given.
    pub key: Option<(&'a str, &'a str)>,
}

/// Returns units of the FULFILLED order `order_id`, all of `lines` or
/// nothing, in one statement: each asked line's units are counted against
/// the order's lines of its inventory (in id order, each up to what it has
/// not returned yet: `reservations.returned`); its RESTOCK units go back to
/// available stock at its location, or where the line shipped them from,
/// most preferred location first (priority, then code), each at most what
/// it shipped from there less what earlier returns of the line put back
/// there; WRITE_OFF units move nothing. Each inventory a RESTOCK line
/// touches is one change (version + 1) with one `RETURNED` ledger row per
/// level, carrying the note and the operator as `actor`. The return is
/// numbered after the order's earlier ones, its lines recorded, and the
/// key claimed with the return, in the same statement.
///
/// This locks every line of the order, in id order, before anything else
/// (then the touched inventories in id order, then their levels, as every
/// stock statement does), so two returns of one order take turns: the
/// second judges `returned` as the first left it, and whatever races, a
/// line's returned units never pass what it shipped (nothing is written
/// when any asked line would: its `returned + quantity` above the line's
/// quantity, or no line of its inventory on a FULFILLED order). At READ
/// COMMITTED a return that waited for the lines sees their counters as the
/// return before it left them, but not that return's rows, which its
/// number, and where it may put units back, are read from: the counters
/// then disagree with the return lines read, and the statement is run
/// again (`retry_stale_read`) with a snapshot that holds them.
///
/// One row per asked inventory (`inventory_id`, `requested`, and the
/// `fulfilled` and `returned` units of its lines as locked, none when the
/// order has no FULFILLED line of it), each with `return_id` (the new
/// return, none when nothing was written) and `order_status` (none: no
/// such order). A key already claimed fails on `idempotency_keys`' primary
/// key and rolls the whole statement back.
pub fn return_order(r: OrderReturn<'_>) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        let (restock, write_off) = (sql(ReturnDisposition::Restock), sql(ReturnDisposition::WriteOff));
        format!(
            r#"
WITH asked AS (
    SELECT * FROM jsonb_to_recordset($5::jsonb) AS a(inventory_id uuid, quantity integer, disposition text, location_id uuid)
), lines AS MATERIALIZED (
    SELECT id, inventory_id, quantity, returned FROM reservations
     WHERE order_id = $1 AND status = {fulfilled}
     ORDER BY id
       FOR UPDATE
), earlier AS MATERIALIZED (
    SELECT reservation_id, location_id, quantity FROM return_lines
     WHERE reservation_id = ANY (ARRAY(SELECT id FROM lines))
), fresh AS (
    SELECT bool_and(CASE WHEN l.returned = coalesce(e.quantity, 0) THEN true ELSE retry_stale_read() END) AS ok
      FROM lines l
      LEFT JOIN (SELECT reservation_id, sum(quantity) AS quantity FROM earlier GROUP BY reservation_id) e
        ON e.reservation_id = l.id
), judged AS (
    SELECT a.inventory_id, a.quantity AS requested, sum(l.quantity) AS fulfilled, sum(l.returned) AS returned
      FROM asked a LEFT JOIN lines l ON l.inventory_id = a.inventory_id
     GROUP BY a.inventory_id, a.quantity
), fits AS (
    SELECT (SELECT ok FROM fresh) IS NOT FALSE
           AND bool_and(fulfilled IS NOT NULL AND returned + requested <= fulfilled) AS ok
      FROM judged
), counted AS MATERIALIZED (
    -- Each asked line's units over its inventory's lines, a running
    -- remainder in id order: a line takes what is left of the request, up
    -- to what it has not returned yet.
    SELECT * FROM (
        SELECT l.id AS reservation_id, l.inventory_id, a.disposition, a.location_id, l.returned,
               least(l.quantity - l.returned,
                     a.quantity - (sum(l.quantity - l.returned) OVER w - (l.quantity - l.returned)))::integer
                   AS quantity
          FROM asked a JOIN lines l ON l.inventory_id = a.inventory_id
         WHERE (SELECT ok FROM fits)
        WINDOW w AS (PARTITION BY l.inventory_id ORDER BY l.id)
    ) c
     WHERE quantity > 0
), placed AS MATERIALIZED (
    -- Where each counted line's RESTOCK units go: the location asked for,
    -- or the locations it shipped from by preference, each up to what it
    -- gave less what earlier returns of the line put back there.
    SELECT reservation_id, inventory_id, location_id, quantity FROM counted
     WHERE disposition = {restock} AND location_id IS NOT NULL
     UNION ALL
    SELECT reservation_id, inventory_id, location_id, quantity FROM (
        SELECT c.reservation_id, c.inventory_id, s.location_id,
               least(s.room, c.quantity - (sum(s.room) OVER w - s.room))::integer AS quantity
          FROM counted c
         CROSS JOIN LATERAL (
            SELECT a.location_id, greatest(a.quantity - coalesce(sum(e.quantity), 0), 0) AS room, o.priority, o.code
              FROM allocations a
              JOIN locations o ON o.id = a.location_id
              LEFT JOIN earlier e ON e.reservation_id = a.reservation_id AND e.location_id = a.location_id
             WHERE a.reservation_id = c.reservation_id
             GROUP BY a.location_id, a.quantity, o.priority, o.code
         ) s
         WHERE c.disposition = {restock} AND c.location_id IS NULL
        WINDOW w AS (PARTITION BY c.reservation_id ORDER BY s.priority, s.code)
    ) p
     WHERE quantity > 0
), totals AS (
    SELECT inventory_id, sum(quantity)::integer AS quantity FROM placed GROUP BY inventory_id
), inv AS MATERIALIZED (
    {inv}
), changed AS (
    -- An inventory that gets units at a location besides its sole one is
    -- held in several places from now on.
    UPDATE inventories i
       {set},
           sole_location_id = CASE WHEN NOT EXISTS (
               SELECT 1 FROM placed p WHERE p.inventory_id = i.id AND p.location_id IS DISTINCT FROM i.sole_location_id
           ) THEN i.sole_location_id END
      FROM totals t JOIN inv ON inv.id = t.inventory_id
     WHERE i.id = t.inventory_id
 RETURNING i.id, i.stock, i.version
), level AS (
    INSERT INTO stock_levels (inventory_id, location_id, available)
    SELECT p.inventory_id, p.location_id, sum(p.quantity)::integer
      FROM placed p JOIN changed c ON c.id = p.inventory_id
     GROUP BY p.inventory_id, p.location_id
     ORDER BY p.inventory_id, p.location_id
        ON CONFLICT (inventory_id, location_id) DO UPDATE SET available = stock_levels.available + excluded.available
), movement AS (
    {LEDGER_BY_OPERATOR}
    SELECT p.inventory_id, sum(p.quantity)::integer, {returned}, c.stock, c.version,
           (array_agg(p.reservation_id ORDER BY p.reservation_id))[1], $1, p.location_id, $4, $3
      FROM placed p JOIN changed c ON c.id = p.inventory_id
     GROUP BY p.inventory_id, p.location_id, c.stock, c.version
), made AS (
    INSERT INTO returns (id, order_id, number, note, created_by)
    SELECT $2, $1, ((SELECT count(*) FROM returns WHERE order_id = $1) + 1)::integer, $4, $3
     WHERE (SELECT ok FROM fits)
 RETURNING id
), made_lines AS (
    INSERT INTO return_lines (return_id, reservation_id, inventory_id, location_id, disposition, quantity)
    SELECT m.id, c.reservation_id, c.inventory_id, NULL::uuid, {write_off}, c.quantity
      FROM made m, counted c
     WHERE c.disposition = {write_off}
     UNION ALL
    SELECT m.id, p.reservation_id, p.inventory_id, p.location_id, {restock}, p.quantity
      FROM made m, placed p
), counted_lines AS (
    -- From the values `lines` locked, not the UPDATE's own row, which at
    -- READ COMMITTED is first the snapshot's.
    UPDATE reservations r SET returned = s.returned + s.quantity
      FROM (SELECT reservation_id, min(returned) AS returned, sum(quantity)::integer AS quantity
              FROM counted GROUP BY reservation_id) s
     WHERE r.id = s.reservation_id
), claimed AS (
    INSERT INTO idempotency_keys (user_id, idempotency_key, request_fingerprint, return_id)
    SELECT $3, $6, $7, id FROM made WHERE $6::text IS NOT NULL
)
SELECT j.inventory_id, j.requested, j.fulfilled, j.returned, (SELECT id FROM made) AS return_id,
       (SELECT status FROM orders WHERE id = $1) AS order_status
  FROM judged j
 ORDER BY j.inventory_id"#,
            fulfilled = sql(ReservationStatus::Fulfilled),
            inv = lock_inventories("id", Ids::Query("SELECT inventory_id FROM totals"), None),
            set = step("i.", "+ t.quantity"),
            returned = sql(MovementReason::Returned),
        )
    });
    let lines: Vec<serde_json::Value> = r
        .lines
        .iter()
        .map(|line| {
            serde_json::json!({
                "inventory_id": line.inventory_id,
                "quantity": line.quantity,
                "disposition": line.disposition.to_value(),
                "location_id": line.location_id,
            })
        })
        .collect();
    Statement::from_sql_and_values(
        DbBackend::Postgres,
        SQL.as_str(),
        [
            r.order_id.into(),
            r.return_id.into(),
            r.operator.into(),
            r.note.map(str::to_owned).into(),
            serde_json::Value::Array(lines).to_string().into(),
            r.key.map(|(key, _)| key.to_owned()).into(),
            r.key.map(|(_, fingerprint)| fingerprint.to_owned()).into(),
        ],
    )
}
