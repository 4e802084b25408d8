//! The pieces every stock statement is made of, and the conditions and
//! sums the features' reads and the invariant share with them. Every
//! status and ledger reason is written from its enum ([`super::rows`]).

use sea_orm::{IdenStatic, Iterable};

use super::rows::{MovementReason, ReservationStatus, inventory, reservation, sql, sql_list};

/// The inventory columns of the inventory aliased `alias` (`""`, `"i."`),
/// every one an `InventoryRow` reads (SeaORM reads a row's columns by name).
pub fn inventory_columns(alias: &str) -> String {
    inventory::Column::iter().map(|column| format!("{alias}{}", column.as_str())).collect::<Vec<_>>().join(", ")
}

/// Every reservation column of `r` as `r_<column>`, so one row carries an
/// inventory and a reservation side by side (read back with the prefix `"r_"`).
pub fn reservation_columns_as_r() -> String {
    let columns = reservation::Column::iter().map(|column| format!("r.{0} AS r_{0}", column.as_str()));
    columns.collect::<Vec<_>>().join(", ")
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

/// [`LEDGER`] with the row's id first (eight values): the reserve paths,
/// which write most ledger rows, send time-ordered (v7) ids made by the
/// server, so new rows land at the right edge of the primary key instead of
/// on a random page of a B-tree that history makes larger than the cache.
pub const LEDGER_WITH_ID: &str = "INSERT INTO stock_movements (id, inventory_id, delta, reason, stock_after, version_after, reservation_id, order_id)";

/// What a change of many reservation lines at once does to their stock.
#[derive(Debug, Clone, Copy)]
pub enum Lines {
    /// Their units come back to available stock (an expiry, a cancel).
    Return,
    /// Their units leave the warehouse: on-hand stock falls, available
    /// stock does not move (a fulfilment).
    Ship,
}

/// The CTEs `totals`, `changed` and `movement` of a statement that changes
/// many reservation lines at once; `lines` names an earlier CTE of the
/// changed lines (`id, inventory_id, quantity`), `reason` their ledger rows'
/// reason, `order_id` the ledger's order (`"NULL"`, `"$1"`). With `locked`, the inventories are the rows of
/// an earlier CTE `locked` (`id`), already locked in id order.
///
/// Each line is its own change of its inventory, even when several lines
/// share one: the row is updated once, its version grows by the number of
/// its lines, and each line gets its ledger row with the running stock and
/// version (lines of one inventory in id order). An `UPDATE ... FROM` that
/// joined the lines themselves would update a shared row once, for one of
/// its lines, and lose the others.
pub fn per_line(lines: &str, what: Lines, reason: MovementReason, order_id: &str, locked: bool) -> String {
    let (stock, delta, stock_after) = match what {
        Lines::Return => ("i.stock + t.quantity", "e.quantity", "c.stock - c.quantity + sum(e.quantity) OVER w"),
        Lines::Ship => ("i.stock", "-e.quantity", "c.stock"),
    };
    let locked = if locked { " JOIN locked l ON l.id = t.inventory_id" } else { "" };
    format!(
        r#"totals AS (
    SELECT inventory_id, sum(quantity)::integer AS quantity, count(*)::integer AS n
      FROM {lines} GROUP BY inventory_id
), changed AS (
    UPDATE inventories i
       {set}
      FROM totals t{locked}
     WHERE i.id = t.inventory_id
 RETURNING i.id, i.stock, i.version, t.quantity, t.n
), movement AS (
    {LEDGER}
    SELECT e.inventory_id, {delta}, {reason}, ({stock_after})::integer,
           (c.version - c.n + row_number() OVER w)::integer, e.id, {order_id}
      FROM {lines} e JOIN changed c ON c.id = e.inventory_id
    WINDOW w AS (PARTITION BY e.inventory_id ORDER BY e.id)
)"#,
        set = set(stock, "i.version + t.n"),
        reason = sql(reason),
    )
}

/// The statement that moves every ORDERED line of the order `$1` to
/// `status` at once, each line one change of its inventory (see
/// [`per_line`]); one row, how many lines moved. Only ORDERED lines match,
/// so a line moves once.
pub fn order_lines(status: ReservationStatus, what: Lines, reason: MovementReason) -> String {
    format!(
        r#"
WITH moved AS (
    UPDATE reservations SET status = {status}
     WHERE order_id = $1 AND status = {ordered}
 RETURNING id, inventory_id, quantity
), {changes}
SELECT count(*) FROM moved"#,
        status = sql(status),
        ordered = sql(ReservationStatus::Ordered),
        changes = per_line("moved", what, reason, "$1", false),
    )
}

/// When a reservation made now expires, given its TTL in seconds as the
/// integer parameter `seconds` (`"$8"`); 0 means never (NULL).
pub fn expiry(seconds: &str) -> String {
    format!("CASE WHEN {seconds}::integer > 0 THEN now() + {seconds}::integer * interval '1 second' END")
}

/// The condition of a reservation that holds stock for its user and has
/// not run out: ACTIVE and unexpired. Only such a line may be released,
/// changed, extended or checked out; one past its expiry is the sweeper's.
pub fn active_unexpired() -> String {
    format!("status = {} AND (expires_at IS NULL OR expires_at > now())", sql(ReservationStatus::Active))
}

/// The statuses of reservations that hold stock (`('ACTIVE', 'ORDERED')`):
/// the predicate of the partial index `reservations_held`, which a read of
/// what an inventory holds names in its text so the index serves it.
pub fn holding() -> String {
    sql_list([ReservationStatus::Active, ReservationStatus::Ordered])
}

/// The units of reservations in `status` (`sum(quantity) FILTER (...)`,
/// NULL for none), summed over the group.
pub fn units(status: ReservationStatus) -> String {
    format!("sum(quantity) FILTER (WHERE status = {})", sql(status))
}

/// The ledger rows' sum of changes of available stock (every reason but
/// FULFILLED, which moves on-hand units only), 0 for none.
pub fn ledger_stock() -> String {
    format!("coalesce(sum(delta) FILTER (WHERE reason <> {}), 0)", sql(MovementReason::Fulfilled))
}

/// The ledger rows' units received: initial stock and restocks, 0 for none.
pub fn ledger_received() -> String {
    let received = sql_list([MovementReason::Created, MovementReason::Restocked]);
    format!("coalesce(sum(delta) FILTER (WHERE reason IN {received}), 0)")
}

/// The ledger rows' units shipped (positive), 0 for none.
pub fn ledger_fulfilled() -> String {
    format!("coalesce(-sum(delta) FILTER (WHERE reason = {}), 0)", sql(MovementReason::Fulfilled))
}

/// The location of the ledger rows aliased `alias` (`""`, `"m."`): rows
/// from before locations have none (NULL), and their stock was all at the
/// default location, where the migration put it.
pub fn ledger_location(alias: &str) -> String {
    let default = super::rows::location::DEFAULT_CODE;
    format!("coalesce({alias}location_id, (SELECT id FROM locations WHERE code = '{default}'))")
}

/// The ledger rows' sum of changes of on-hand units (the units in the
/// building: received, moved between locations, shipped), 0 for none. Over
/// one location's rows, it is what that location should hold: available
/// plus what its allocations hold.
pub fn ledger_on_hand() -> String {
    let moved = sql_list([
        MovementReason::Created,
        MovementReason::Restocked,
        MovementReason::TransferredIn,
        MovementReason::TransferredOut,
        MovementReason::Fulfilled,
    ]);
    format!("coalesce(sum(delta) FILTER (WHERE reason IN {moved}), 0)")
}

/// The units of the allocations `a` of reservations `r` in `status`
/// (`sum(a.quantity) FILTER (...)`, NULL for none), summed over the group:
/// a location's reserved or committed units.
pub fn allocated(status: ReservationStatus) -> String {
    format!("sum(a.quantity) FILTER (WHERE r.status = {})", sql(status))
}
