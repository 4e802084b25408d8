//! The pieces every stock statement is made of, and the conditions and
//! sums the features' reads and the invariant share with them. Every
//! status and ledger reason is written from its enum ([`super::rows`]).

use sea_orm::{IdenStatic, Iterable};

use super::rows::{MovementReason, ReservationStatus, inventory, reservation, sql, sql_list};

/// The inventory columns of the inventory aliased `alias` (`""`, `"i."`),
/// every one an `InventoryRow` reads (SeaORM reads a row's columns by name).
pub(crate) fn inventory_columns(alias: &str) -> String {
    inventory::Column::iter().map(|column| format!("{alias}{}", column.as_str())).collect::<Vec<_>>().join(", ")
}

/// Every reservation column of `r` as `r_<column>`, so one row carries an
/// inventory and a reservation side by side (read back with the prefix `"r_"`).
pub(crate) fn reservation_columns_as_r() -> String {
    let columns = reservation::Column::iter().map(|column| format!("r.{0} AS r_{0}", column.as_str()));
    columns.collect::<Vec<_>>().join(", ")
}

/// The `SET` of a change that leaves the row at `stock` and `version`; the
/// one place `updated_at` is kept.
pub(crate) fn set(stock: &str, version: &str) -> String {
    format!("SET stock = {stock}, version = {version}, updated_at = now()")
}

/// The `SET` of one change of the row aliased `alias` (`""` or `"i."`) by
/// `delta` (`"- $2"`): one version step.
pub(crate) fn step(alias: &str, delta: &str) -> String {
    set(&format!("{alias}stock {delta}"), &format!("{alias}version + 1"))
}

/// The ledger row of a change at one location, to be followed by a `SELECT`
/// of exactly these eight values. A change that touches several levels of
/// its inventory writes one row for each, all with the change's stock and
/// version.
pub(crate) const LEDGER: &str = "INSERT INTO stock_movements \
     (inventory_id, delta, reason, stock_after, version_after, reservation_id, order_id, location_id)";

/// [`LEDGER`] for a change of reservations that may be a kit's components
/// (nine values): the eight, then the kit reservation's id (NULL for a
/// reservation of its own), so a kit reservation's ledger rows name it.
pub(crate) const LEDGER_OF_KITS: &str = "INSERT INTO stock_movements \
     (inventory_id, delta, reason, stock_after, version_after, reservation_id, order_id, location_id, kit_reservation_id)";

/// [`LEDGER`] for an operator's change (ten values): the eight, then the
/// operator's `note` and their `sub` as `actor`.
pub(crate) const LEDGER_BY_OPERATOR: &str = "INSERT INTO stock_movements \
     (inventory_id, delta, reason, stock_after, version_after, reservation_id, order_id, location_id, note, actor)";

/// [`LEDGER_BY_OPERATOR`] for an adjustment (eleven values): the ten, then
/// its `adjustment_reason`, which the table requires on ADJUSTED rows and
/// refuses on any other.
pub const LEDGER_ADJUSTED: &str = "INSERT INTO stock_movements \
     (inventory_id, delta, reason, stock_after, version_after, reservation_id, order_id, location_id, note, actor, \
      adjustment_reason)";

/// [`LEDGER`] with the row's id first (nine values): the reserve paths,
/// which write most ledger rows, send time-ordered (v7) ids made by the
/// server, so new rows land at the right edge of the primary key instead of
/// on a random page of a B-tree that history makes larger than the cache.
pub(crate) const LEDGER_WITH_ID: &str = "INSERT INTO stock_movements \
     (id, inventory_id, delta, reason, stock_after, version_after, reservation_id, order_id, location_id)";

/// [`LEDGER_WITH_ID`] for reserves that may be a kit's components (ten
/// values): the nine, then the kit reservation's id (NULL for a
/// reservation of its own).
pub(crate) const LEDGER_WITH_ID_OF_KITS: &str = "INSERT INTO stock_movements \
     (id, inventory_id, delta, reason, stock_after, version_after, reservation_id, order_id, location_id, \
      kit_reservation_id)";

/// The condition of an inventory row (aliased `alias`: `""`, `"i."`) whose
/// units may be taken from its one level directly, as the conditional
/// UPDATE of the row alone: it has one level (`sole_location_id`) and that
/// location is active. Any other is taken from through its levels.
pub(crate) fn sole(alias: &str) -> String {
    format!("{alias}sole_location_id IN (SELECT id FROM locations WHERE active)")
}

/// Which inventories a statement locks, or reads the levels of: the ids
/// from wherever the statement has them, rendered as a condition on an
/// inventory id column. Each form keeps the plan PostgreSQL makes for it
/// (an index probe for one id, an index scan over an array), so a statement
/// built from [`lock_inventories`] is planned as one that spelled it out.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ids<'a> {
    /// One inventory: an expression of its id (`"$1"`, `"(SELECT id FROM inv)"`).
    One(&'a str),
    /// The inventories of a `uuid[]` expression (`"$1"`, `"ARRAY(SELECT id FROM locked)"`).
    Array(&'a str),
    /// The inventories a query selects, from any table or earlier CTE
    /// (`"SELECT inventory_id FROM expired"`).
    Query(&'a str),
}

impl Ids<'_> {
    /// The condition that `column` is one of these ids.
    fn of(self, column: &str) -> String {
        match self {
            Self::One(id) => format!("{column} = {id}"),
            Self::Array(ids) => format!("{column} = ANY({ids})"),
            Self::Query(ids) => format!("{column} IN ({ids})"),
        }
    }
}

/// The first step of the lock order, the rule that keeps stock statements
/// from deadlocking (docs/locations.md, "Locks: one global order"): this
/// locks the rows of the inventories `ids` names (and `condition` keeps,
/// e.g. a version check: a row it rejects is not locked) in id order, for
/// the rest of the transaction, and selects `columns` of them. PostgreSQL
/// sorts, then locks, so any two statements that lock inventories through
/// here wait for each other in one order, whatever order their callers
/// named the inventories in; for one id the sort costs nothing (the planner
/// drops it). Every statement that locks inventory rows does it with this
/// (as a `MATERIALIZED` CTE, or whole), and locks levels only after it,
/// with [`lock_levels`].
pub(crate) fn lock_inventories(columns: &str, ids: Ids<'_>, condition: Option<&str>) -> String {
    let condition = condition.map(|c| format!(" AND {c}")).unwrap_or_default();
    format!(
        "SELECT {columns} FROM inventories
     WHERE {}{condition}
     ORDER BY id FOR UPDATE",
        ids.of("id")
    )
}

/// The levels of the inventories `ids` names, each with its location's
/// priority, code and active flag: `inventory_id, location_id, available,
/// safety_stock, priority, code, active`, the columns
/// [`super::allocating::eligible`], [`super::allocating::offered`] and
/// [`super::allocating::preference`] read. Unlocked: for a statement whose
/// transaction locked them before ([`lock_levels`]).
pub(crate) fn levels(ids: Ids<'_>) -> String {
    format!(
        "SELECT l.inventory_id, l.location_id, l.available, l.safety_stock, c.priority, c.code, c.active
      FROM stock_levels l JOIN locations c ON c.id = l.location_id
     WHERE {}",
        ids.of("l.inventory_id")
    )
}

/// The second step of the lock order: [`levels`] of inventories the
/// statement has locked with [`lock_inventories`] (`ids` names them from
/// that CTE, e.g. `Ids::One("(SELECT id FROM inv)")`), locked. The
/// inventory row is the mutex for its levels: only a holder of the row
/// locks them, so the order among them needs no sort, and waiting for a
/// level never happens. `FOR UPDATE` reads each level as it is now, even
/// when the statement waited; a level made after the statement began is
/// not among them, which the statement detects by their sum against the
/// row's `stock` (`retry_stale_read`). Only the levels are locked, never
/// their locations.
pub(crate) fn lock_levels(ids: Ids<'_>) -> String {
    format!("{}\n       FOR UPDATE OF l", levels(ids))
}

/// The columns a reservation stores of how it chose its locations, in the
/// order [`choice`] gives their values.
pub(crate) const CHOICE_COLUMNS: &str = "location_ids, fewest_locations, allow_split";

/// The values of [`CHOICE_COLUMNS`] from a request's location ids (`uuid[]`
/// expression, NULL: any), FEWEST_LOCATIONS flag and split flag (boolean
/// expressions): NULL for each default, so a plain reservation stores nothing.
pub(crate) fn choice(ids: &str, fewest: &str, split: &str) -> String {
    format!("{ids}, CASE WHEN {fewest} THEN true END, CASE WHEN NOT {split} THEN false END")
}

/// What a change of many reservation lines at once does to their stock.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Lines {
    /// Their units come back to available stock (an expiry, a cancel).
    Return,
    /// Their units leave the warehouse: on-hand stock falls, available
    /// stock does not move (a fulfilment).
    Ship,
}

/// The CTEs of a statement that changes many reservation lines at once:
/// `parts`, `checked`, `totals`, `changed`, `numbered`, (for
/// [`Lines::Return`]) `restored`, and `movement`. `lines` names an earlier
/// CTE of the changed lines (`id, inventory_id, quantity, kit_reservation_id`) whose rows the
/// statement has locked, `reason` their ledger rows' reason, `order_id` the
/// ledger's order (`"NULL"`, `"$1"`). With `locked`, the inventories are the
/// rows of an earlier CTE `locked` (`id`), already locked in id order.
/// `changed` returns every inventory column of the rows as left, with the
/// lines' units (`quantity`) and count (`n`).
///
/// Each line is its own change of its inventory, even when several lines
/// share one: the row is updated once, its version grows by the number of
/// its lines, and each line gets one ledger row per location it holds units
/// at (its allocations), with the running stock and version (lines of one
/// inventory in id order). An `UPDATE ... FROM` that joined the lines
/// themselves would update a shared row once, for one of its lines, and
/// lose the others. Returned units go back to the levels that gave them.
///
/// The allocations are locked (`parts`) after their lines and before the
/// inventories: a line whose allocations were changed after the statement
/// began (a change of quantity that took from a new location) shows rows
/// that do not add up to its quantity, and the statement is run again
/// (`retry_stale_read`).
///
/// The allocations are found by key through an array of the lines' ids,
/// which PostgreSQL can only look up in the index, not by joining the
/// lines as a set: a join with lines it cannot count (an UPDATE's result)
/// was planned, on tables never analyzed, as a sequential scan of every
/// allocation ever made, and on 3 million of them every sweep ran into the
/// statement timeout, so expired stock never came back
/// (bench/results/decisions.md, "the sweeper stuck behind a plan without
/// statistics").
pub(crate) fn per_line(lines: &str, what: Lines, reason: MovementReason, order_id: &str, locked: bool) -> String {
    let (stock, delta, stock_after) = match what {
        Lines::Return => ("i.stock + t.quantity", "p.quantity", "n.stock - n.total + n.upto"),
        Lines::Ship => ("i.stock", "-p.quantity", "n.stock"),
    };
    let restored = match what {
        Lines::Return => {
            r#"), restored AS (
    UPDATE stock_levels l SET available = l.available + s.quantity
      FROM (SELECT n.inventory_id, p.location_id, sum(p.quantity)::integer AS quantity
              FROM parts p JOIN numbered n ON n.id = p.reservation_id
             GROUP BY n.inventory_id, p.location_id) s
     WHERE l.inventory_id = s.inventory_id AND l.location_id = s.location_id
"#
        }
        Lines::Ship => "",
    };
    let locked = if locked { " JOIN locked l ON l.id = t.inventory_id" } else { "" };
    format!(
        r#"parts AS MATERIALIZED (
    SELECT reservation_id, location_id, quantity FROM allocations
     WHERE reservation_id = ANY (ARRAY(SELECT id FROM {lines}))
       FOR UPDATE
), checked AS (
    SELECT bool_and(CASE WHEN coalesce(p.quantity, 0) = e.quantity THEN true ELSE retry_stale_read() END) AS ok
      FROM {lines} e
      LEFT JOIN (SELECT reservation_id, sum(quantity) AS quantity FROM parts GROUP BY reservation_id) p
        ON p.reservation_id = e.id
), totals AS (
    SELECT inventory_id, sum(quantity)::integer AS quantity, count(*)::integer AS n
      FROM {lines} GROUP BY inventory_id
), changed AS (
    UPDATE inventories i
       {set}
      FROM totals t{locked}
     WHERE i.id = t.inventory_id AND (SELECT ok FROM checked) IS NOT FALSE
 RETURNING {columns}, t.quantity, t.n
), numbered AS (
    SELECT e.id, e.inventory_id, e.kit_reservation_id, c.stock, c.quantity AS total,
           sum(e.quantity) OVER w AS upto, (c.version - c.n + row_number() OVER w)::integer AS version
      FROM {lines} e JOIN changed c ON c.id = e.inventory_id
    WINDOW w AS (PARTITION BY e.inventory_id ORDER BY e.id)
{restored}), movement AS (
    {LEDGER_OF_KITS}
    SELECT n.inventory_id, {delta}, {reason}, ({stock_after})::integer, n.version, n.id, {order_id}, p.location_id,
           n.kit_reservation_id
      FROM numbered n JOIN parts p ON p.reservation_id = n.id
)"#,
        set = set(stock, "i.version + t.n"),
        columns = inventory_columns("i."),
        reason = sql(reason),
    )
}

/// The statement that moves every ORDERED line of the order `$1` to
/// `status` at once, each line one change of its inventory (see
/// [`per_line`]); one row, how many lines moved. Only ORDERED lines match,
/// so a line moves once.
pub(crate) fn order_lines(status: ReservationStatus, what: Lines, reason: MovementReason) -> String {
    format!(
        r#"
WITH moved AS (
    UPDATE reservations SET status = {status}
     WHERE order_id = $1 AND status = {ordered}
 RETURNING id, inventory_id, quantity, kit_reservation_id
), {changes}
SELECT count(*) FROM moved"#,
        status = sql(status),
        ordered = sql(ReservationStatus::Ordered),
        changes = per_line("moved", what, reason, "$1", false),
    )
}

/// When a reservation made now expires, given its TTL in seconds as the
/// integer parameter `seconds` (`"$8"`); 0 means never (NULL).
pub(crate) fn expiry(seconds: &str) -> String {
    format!("CASE WHEN {seconds}::integer > 0 THEN now() + {seconds}::integer * interval '1 second' END")
}

/// The condition of a reservation that holds stock for its user and has
/// not run out: ACTIVE and unexpired. Only such a line may be released,
/// changed, extended or checked out; one past its expiry is the sweeper's.
pub(crate) fn active_unexpired() -> String {
    format!("status = {} AND (expires_at IS NULL OR expires_at > now())", sql(ReservationStatus::Active))
}

/// The statuses of reservations that hold stock (`('ACTIVE', 'ORDERED')`):
/// the predicate of the partial index `reservations_held`, which a read of
/// what an inventory holds names in its text so the index serves it.
pub(crate) fn holding() -> String {
    sql_list([ReservationStatus::Active, ReservationStatus::Ordered])
}

/// The units of reservations in `status` (`sum(quantity) FILTER (...)`,
/// NULL for none), summed over the group.
pub(crate) fn units(status: ReservationStatus) -> String {
    format!("sum(quantity) FILTER (WHERE status = {})", sql(status))
}

/// The ledger rows' sum of changes of available stock (every reason but
/// FULFILLED, which moves on-hand units only), 0 for none.
pub(crate) fn ledger_stock() -> String {
    format!("coalesce(sum(delta) FILTER (WHERE reason <> {}), 0)", sql(MovementReason::Fulfilled))
}

/// The ledger rows' units received from outside: initial stock, restocks,
/// units returned to stock (a fulfilled order's line restocked) and
/// operators' adjustments (signed), 0 for none.
pub fn ledger_received() -> String {
    let received = sql_list([
        MovementReason::Created,
        MovementReason::Restocked,
        MovementReason::Returned,
        MovementReason::Adjusted,
    ]);
    format!("coalesce(sum(delta) FILTER (WHERE reason IN {received}), 0)")
}

/// The ledger rows' units shipped (positive), 0 for none.
pub(crate) fn ledger_fulfilled() -> String {
    format!("coalesce(-sum(delta) FILTER (WHERE reason = {}), 0)", sql(MovementReason::Fulfilled))
}

/// The location `n` (a `uuid` expression, `"$2"`) names, or the default
/// location when it is NULL: one row (`id`), none when it names none.
pub fn location_or_default(n: &str) -> String {
    let default = super::rows::location::DEFAULT_CODE;
    format!(
        "SELECT id FROM locations WHERE id = coalesce({n}::uuid, (SELECT id FROM locations WHERE code = '{default}'))"
    )
}

/// A freshness check for a statement that has locked one inventory row
/// (the CTE `inv` of [`lock_inventories`], with its `version`) and then
/// reads what reservations hold of it, unlocked. At READ COMMITTED a
/// statement that waited for the row reads it (and its levels, locked) as
/// they are now, but the reservations and allocations as its snapshot had
/// them, before the change it waited for. Every change of what is held
/// steps the inventory's version and locks its row first, so when the
/// version the snapshot sees is not the one locked, the holds read may be
/// stale, and the statement is run again (`retry_stale_read`); true
/// otherwise (and when the inventory `id`, an expression, does not exist).
pub fn seen_as_locked(id: &str) -> String {
    format!(
        "CASE WHEN (SELECT version FROM inventories WHERE id = {id}) IS NOT DISTINCT FROM (SELECT version FROM inv) \
              THEN true ELSE retry_stale_read() END"
    )
}

/// The units the holding reservations of the inventory `inventory` (an
/// expression) hold at the location `location` (an expression), read when
/// `when` (a boolean expression) is true: one row, `reserved` (ACTIVE) and
/// `committed` (ORDERED), 0 for none (or when not read). Each holding
/// reservation's allocation there is looked up by its key
/// (`reservations_held` finds the reservations, whatever number of released
/// ones the inventory has had).
pub fn held_at(inventory: &str, location: &str, when: &str) -> String {
    format!(
        "SELECT coalesce({reserved}, 0)::integer AS reserved, coalesce({committed}, 0)::integer AS committed
      FROM reservations r
     CROSS JOIN LATERAL (
        SELECT a.quantity FROM allocations a WHERE a.reservation_id = r.id AND a.location_id = {location} OFFSET 0
     ) a
     WHERE {when} AND r.inventory_id = {inventory} AND r.status IN {holding}",
        reserved = allocated(ReservationStatus::Active),
        committed = allocated(ReservationStatus::Ordered),
        holding = holding(),
    )
}

/// The location of the ledger rows aliased `alias` (`""`, `"m."`): rows
/// from before locations have none (NULL), and their stock was all at the
/// default location, where the migration put it.
pub(crate) fn ledger_location(alias: &str) -> String {
    let default = super::rows::location::DEFAULT_CODE;
    format!("coalesce({alias}location_id, (SELECT id FROM locations WHERE code = '{default}'))")
}

/// The ledger rows whose `delta` is a change of the units on hand (the
/// units in the building: received, moved between locations, shipped,
/// returned to stock, adjusted by an operator).
pub(crate) const ON_HAND_MOVES: [MovementReason; 7] = [
    MovementReason::Created,
    MovementReason::Restocked,
    MovementReason::TransferredIn,
    MovementReason::TransferredOut,
    MovementReason::Fulfilled,
    MovementReason::Returned,
    MovementReason::Adjusted,
];

/// The ledger rows whose `delta` is the opposite of a change of committed
/// units (those of order lines): placed by an order (stock taken),
/// given back by its cancellation. A shipment (FULFILLED) changes them by
/// its `delta`; a checkout, which commits reserved units, writes no ledger
/// row.
pub(crate) const COMMITTING_MOVES: [MovementReason; 2] = [MovementReason::Ordered, MovementReason::OrderCancelled];

/// The ledger rows' sum of changes of on-hand units ([`ON_HAND_MOVES`]), 0
/// for none. Over one location's rows, it is what that location should
/// hold: available plus what its allocations hold.
pub(crate) fn ledger_on_hand() -> String {
    format!("coalesce(sum(delta) FILTER (WHERE reason IN {}), 0)", sql_list(ON_HAND_MOVES))
}

/// The units of the allocations `a` of reservations `r` in `status`
/// (`sum(a.quantity) FILTER (...)`, NULL for none), summed over the group:
/// a location's reserved or committed units.
pub(crate) fn allocated(status: ReservationStatus) -> String {
    format!("sum(a.quantity) FILTER (WHERE r.status = {})", sql(status))
}
