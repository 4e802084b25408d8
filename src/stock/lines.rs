//! Taking the lines of a multi-item request (`reserveMany`, `placeOrder`)
//! all or none, inside one transaction: [`lock_lines`] locks the lines'
//! inventories in id order and then their levels, and says for each line
//! whether its eligible locations can give it; [`take_lines`] then takes
//! every line in one statement. Each line chooses its locations as a single
//! reservation does (`allocate` over its eligible levels, in its order of
//! preference), so a cart's lines may each come from other places.

use std::sync::LazyLock;

use sea_orm::{ActiveEnum, DbBackend, DbErr, FromQueryResult, QueryResult, Statement, Value};
use uuid::Uuid;

use super::{
    allocating::{Allocating, eligible, held, offered, preference},
    fragments::{
        CHOICE_COLUMNS, Ids, LEDGER_OF_KITS, choice, expiry, inventory_columns, levels, lock_inventories, lock_levels,
        set,
    },
    rows::{InventoryRow, MovementReason, ReservationStatus},
};

/// What the lines of a multi-item request are taken for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Purpose {
    /// Plain reservations (`reserveMany`): ACTIVE for `ttl_secs` (0 = never
    /// expire), ledger reason RESERVED.
    Reservations {
        /// Seconds until they expire.
        ttl_secs: i32,
    },
    /// The lines of this order (`placeOrder`): ORDERED, ledger reason ORDERED.
    Order(Uuid),
}

/// One line of a multi-item request, merged and checked (one per inventory).
/// Public for the benchmark, whose KIT limit builds a kit's lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The inventory.
    pub inventory_id: Uuid,
    /// Units, summed over the request's lines for this inventory.
    pub quantity: i32,
    /// The version the client saw, if it sent one.
    pub expected_version: Option<i32>,
    /// Where its units may come from.
    pub allocating: Allocating,
}

/// The CTE `line` of the lines bound as `$1`..`$8`, one element per line in
/// each array: inventory, quantity, expected version, whether that version
/// is checked, the count of its location ids in the flat array `$5` (0:
/// any), FEWEST_LOCATIONS, split. `ids` is each line's slice of `$5`.
pub(super) fn line_cte() -> &'static str {
    r#"line AS (
    SELECT u.inventory_id, u.quantity, CASE WHEN u.checked THEN u.expected_version END AS expected_version,
           CASE WHEN u.count > 0
                THEN ($5::uuid[])[u.start : u.start + u.count - 1] END AS ids,
           u.fewest, u.split, u.n
      FROM (SELECT l.*, (sum(l.count) OVER (ORDER BY l.n) - l.count + 1)::integer AS start
              FROM unnest($1::uuid[], $2::integer[], $3::integer[], $4::boolean[], $6::integer[], $7::boolean[],
                          $8::boolean[]) WITH ORDINALITY
                AS l(inventory_id, quantity, expected_version, checked, count, fewest, split, n)) u
)"#
}

/// The values of `$1`..`$8` for [`line_cte`].
pub(super) fn line_values(lines: &[Line]) -> Vec<Value> {
    let ids: Vec<Uuid> = lines.iter().flat_map(|l| l.allocating.location_ids.iter().flatten().copied()).collect();
    let counts: Vec<i32> = lines
        .iter()
        .map(|l| l.allocating.location_ids.as_ref().map_or(0, |ids| i32::try_from(ids.len()).unwrap_or(i32::MAX)))
        .collect();
    vec![
        Value::from(lines.iter().map(|l| l.inventory_id).collect::<Vec<Uuid>>()),
        Value::from(lines.iter().map(|l| l.quantity).collect::<Vec<i32>>()),
        // Arrays cannot carry NULLs through the driver, so "no expected
        // version" travels as `false` in $4 beside a placeholder 0, and "any
        // location" as a count of 0 ids (an empty list is refused before).
        Value::from(lines.iter().map(|l| l.expected_version.unwrap_or(0)).collect::<Vec<i32>>()),
        Value::from(lines.iter().map(|l| l.expected_version.is_some()).collect::<Vec<bool>>()),
        Value::from(ids),
        Value::from(counts),
        Value::from(lines.iter().map(|l| l.allocating.columns().1.is_some()).collect::<Vec<bool>>()),
        Value::from(lines.iter().map(|l| l.allocating.allow_split).collect::<Vec<bool>>()),
    ]
}

/// This locks the inventories of `lines` in id order, then all their
/// levels, for the rest of the transaction, so two multi-item requests
/// naming the same inventories in opposite orders wait for each other
/// instead of deadlocking, and what is judged against the locked rows cannot
/// go stale before [`take_lines`]. One row per line whose inventory exists,
/// by inventory id: the inventory, whether its eligible locations can give
/// the line under its rules (`feasible`) from what they offer a customer
/// (their units above safety stock, [`offered`]: the lines of `reserveMany`
/// and `placeOrder` never take safety stock), and what they offer
/// (`eligible`, as [`held`] says), read with [`LockedLine`].
/// Levels added after the statement began do not add up to their row's
/// stock, and the statement is run again (`retry_stale_read`).
pub(crate) fn lock_lines(lines: &[Line]) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH {line}, locked AS MATERIALIZED (
    {locked}
), lvl AS MATERIALIZED (
    {levels}
), {fresh}, judged AS (
    SELECT line.inventory_id,
           allocate(array_agg({offered} ORDER BY {preference}) FILTER (WHERE v.location_id IS NOT NULL),
                    line.quantity, line.fewest, line.split) IS NOT NULL AS feasible,
           {held} AS eligible
      FROM line LEFT JOIN lvl v ON v.inventory_id = line.inventory_id AND {eligible}
     GROUP BY line.inventory_id, line.quantity, line.fewest, line.split
)
SELECT k.*, coalesce(j.feasible, false) AS feasible, j.eligible
  FROM locked k JOIN judged j ON j.inventory_id = k.id
 WHERE (SELECT ok FROM fresh) IS NOT FALSE
 ORDER BY k.id"#,
            line = line_cte(),
            locked = lock_inventories(&inventory_columns(""), Ids::Array("$1"), None),
            levels = lock_levels(Ids::Array("ARRAY(SELECT id FROM locked)")),
            fresh = FRESH,
            preference = preference("line.ids"),
            eligible = eligible("line.ids"),
            held = held("line.split", &offered("v.", None)),
            offered = offered("v.", None),
        )
    });
    Statement::from_sql_and_values(DbBackend::Postgres, SQL.as_str(), line_values(lines))
}

/// The CTE `fresh` of a statement that locked the inventories of its lines
/// (`locked`, with their `stock`) and then their levels (`lvl`): `ok` when
/// each inventory's levels add up to its stock, and a serialization failure
/// (`retry_stale_read`) when a level made after the statement began is not
/// among those it locked, so the statement runs again.
pub(super) const FRESH: &str = r#"fresh AS (
    SELECT bool_and(CASE WHEN coalesce(v.available, 0) = k.stock THEN true ELSE retry_stale_read() END) AS ok
      FROM locked k
      LEFT JOIN (SELECT inventory_id, sum(available) AS available FROM lvl GROUP BY inventory_id) v
        ON v.inventory_id = k.id
)"#;

/// A line's inventory as [`lock_lines`] locked it, and whether its
/// eligible locations can give the line.
#[derive(Debug)]
pub(crate) struct LockedLine {
    /// The locked inventory row.
    pub inventory: InventoryRow,
    /// Whether the line's eligible locations can give it under its rules.
    pub feasible: bool,
    /// What they offer ([`held`]): their sum, or without a split the largest.
    pub eligible: i32,
}

impl LockedLine {
    /// The line a row of [`lock_lines`] describes.
    pub(crate) fn from_row(row: &QueryResult) -> Result<Self, DbErr> {
        Ok(Self {
            inventory: InventoryRow::from_query_result(row, "")?,
            feasible: row.try_get("", "feasible")?,
            eligible: row.try_get("", "eligible")?,
        })
    }
}

/// One reservation the lines are taken for: an inventory's loose units (the
/// request's own lines of it, summed), or a kit line's units of one of its
/// components. A line's units are shared out among its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Part {
    /// The new reservation's id.
    pub id: Uuid,
    /// The inventory (one of the lines').
    pub inventory_id: Uuid,
    /// Its units.
    pub quantity: i32,
    /// The kit reservation it is a component of, if any.
    pub kit_reservation_id: Option<Uuid>,
}

impl Part {
    /// One part per line, of its units and no kit: a request without kit lines.
    pub(crate) fn loose(lines: &[Line]) -> Vec<Self> {
        let part = |line: &Line| Self {
            id: Uuid::new_v4(),
            inventory_id: line.inventory_id,
            quantity: line.quantity,
            kit_reservation_id: None,
        };
        lines.iter().map(part).collect()
    }
}

/// A kit reservation made with a request's lines: the kit, how many, its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KitPart {
    /// The kit reservation's id.
    pub id: Uuid,
    /// The kit.
    pub kit_id: Uuid,
    /// Kits.
    pub quantity: i32,
}

/// Takes every line at once, inside the transaction that locked them with
/// [`lock_lines`]: each line's units from the locations `allocate` chooses
/// for the line as a whole (so loose units and kit lines' units of one
/// inventory are judged together and never take more than is there), then
/// shared out among its `parts` in order, each location's units to the
/// parts in turn: one reservation per part, one allocation and one ledger
/// row per location a part takes from, all carrying `multi_item_id` (and a
/// kit part its kit reservation's id); the kit reservations `kits`. Each
/// part is one change of its inventory: the row is updated once, its
/// version grows by its number of parts, and each part's ledger rows have
/// the running stock and version (parts in order). The first part carries the
/// idempotency key (and its fingerprint) for the whole request. Returns
/// the reservations, ordered by inventory id.
///
/// With the rows locked, the statement reads the levels as they are and
/// decides again with `allocate`, over what they offer ([`offered`]), what
/// [`lock_lines`] judged; it writes only
/// when every line can be served, so a line that did not match shows up as
/// missing rows, which the caller must treat as a failure.
pub(crate) fn take_lines(
    lines: &[Line],
    parts: &[Part],
    kits: &[KitPart],
    purpose: Purpose,
    user_id: &str,
    key: Option<(&str, &str)>,
    multi_item_id: Uuid,
) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH {line}, lvl AS (
    {levels}
), plan AS (
    SELECT line.*, a.locations, a.takes
      FROM line, LATERAL (
           SELECT array_agg(location_id ORDER BY {preference}) AS locations,
                  allocate(array_agg({offered} ORDER BY {preference}), line.quantity, line.fewest, line.split)
                      AS takes
             FROM lvl v WHERE v.inventory_id = line.inventory_id AND {eligible}) a
), pick AS (
    SELECT plan.inventory_id, p.location_id, p.take,
           sum(p.take) OVER w - p.take AS lo, sum(p.take) OVER w AS hi
      FROM plan, unnest(plan.locations, plan.takes) WITH ORDINALITY AS p(location_id, take, k)
     WHERE p.take > 0
    WINDOW w AS (PARTITION BY plan.inventory_id ORDER BY p.k)
), part AS (
    SELECT u.id, u.inventory_id, u.quantity, nullif(u.kit_reservation_id, '{nil}'::uuid) AS kit_reservation_id, u.m,
           sum(u.quantity) OVER w - u.quantity AS lo, sum(u.quantity) OVER w AS hi,
           row_number() OVER w AS rank, count(*) OVER (PARTITION BY u.inventory_id) AS n
      FROM unnest($17::uuid[], $18::uuid[], $19::integer[], $20::uuid[]) WITH ORDINALITY
        AS u(id, inventory_id, quantity, kit_reservation_id, m)
    WINDOW w AS (PARTITION BY u.inventory_id ORDER BY u.m)
), share AS (
    SELECT pt.id, k.inventory_id, k.location_id, (least(k.hi, pt.hi) - greatest(k.lo, pt.lo))::integer AS take
      FROM part pt JOIN pick k ON k.inventory_id = pt.inventory_id AND k.lo < pt.hi AND pt.lo < k.hi
), taken AS (
    UPDATE inventories i
       {set}
      FROM plan line JOIN (SELECT inventory_id, count(*)::integer AS n FROM part GROUP BY inventory_id) c
        ON c.inventory_id = line.inventory_id
     WHERE i.id = line.inventory_id AND (line.expected_version IS NULL OR i.version = line.expected_version)
       AND (SELECT bool_and(takes IS NOT NULL) FROM plan)
 RETURNING i.id, i.stock, i.version, line.quantity, line.ids, line.fewest, line.split
), drawn AS (
    UPDATE stock_levels l SET available = l.available - p.take
      FROM pick p JOIN taken t ON t.id = p.inventory_id
     WHERE l.inventory_id = p.inventory_id AND l.location_id = p.location_id
), kit AS (
    INSERT INTO kit_reservations (id, kit_id, user_id, quantity)
    SELECT k.id, k.kit_id, $10, k.quantity
      FROM unnest($21::uuid[], $22::uuid[], $23::integer[]) AS k(id, kit_id, quantity)
     WHERE EXISTS (SELECT 1 FROM taken)
), reservation AS (
    INSERT INTO reservations (id, inventory_id, order_id, user_id, quantity, status,
                              idempotency_key, request_fingerprint, batch_id, expires_at, kit_reservation_id,
                              {CHOICE_COLUMNS})
    SELECT pt.id, pt.inventory_id, $9, $10, pt.quantity, $11,
           CASE WHEN pt.m = 1 THEN $12 END, CASE WHEN pt.m = 1 THEN $13 END, $14, {expires}, pt.kit_reservation_id,
           {choice}
      FROM part pt JOIN taken t ON t.id = pt.inventory_id
 RETURNING *
), allocation AS (
    INSERT INTO allocations (reservation_id, location_id, quantity)
    SELECT s.id, s.location_id, s.take FROM share s JOIN reservation r ON r.id = s.id
), movement AS (
    {LEDGER_OF_KITS}
    SELECT t.id, -s.take, $15, (t.stock + t.quantity - pt.hi)::integer, (t.version - pt.n + pt.rank)::integer, r.id,
           $9, s.location_id, r.kit_reservation_id
      FROM taken t JOIN part pt ON pt.inventory_id = t.id JOIN reservation r ON r.id = pt.id
      JOIN share s ON s.id = pt.id
)
SELECT * FROM reservation ORDER BY inventory_id, id"#,
            line = line_cte(),
            levels = levels(Ids::Array("$1")),
            set = set("i.stock - line.quantity", "i.version + c.n"),
            expires = expiry("$16"),
            preference = preference("line.ids"),
            eligible = eligible("line.ids"),
            choice = choice("t.ids", "t.fewest", "t.split"),
            offered = offered("", None),
            nil = Uuid::nil(),
        )
    });
    // Order lines never expire: they hold stock until the order is cancelled.
    let (order_id, status, reason, ttl_secs) = match purpose {
        Purpose::Reservations { ttl_secs } => (None, ReservationStatus::Active, MovementReason::Reserved, ttl_secs),
        Purpose::Order(id) => (Some(id), ReservationStatus::Ordered, MovementReason::Ordered, 0),
    };
    let mut values = line_values(lines);
    values.extend([
        order_id.into(),
        user_id.into(),
        status.to_value().into(),
        key.map(|(key, _)| key.to_owned()).into(),
        key.map(|(_, fingerprint)| fingerprint.to_owned()).into(),
        multi_item_id.into(),
        reason.to_value().into(),
        ttl_secs.into(),
        // Arrays cannot carry NULLs through the driver: "no kit" travels as the nil UUID.
        Value::from(parts.iter().map(|p| p.id).collect::<Vec<Uuid>>()),
        Value::from(parts.iter().map(|p| p.inventory_id).collect::<Vec<Uuid>>()),
        Value::from(parts.iter().map(|p| p.quantity).collect::<Vec<i32>>()),
        Value::from(parts.iter().map(|p| p.kit_reservation_id.unwrap_or_default()).collect::<Vec<Uuid>>()),
        Value::from(kits.iter().map(|k| k.id).collect::<Vec<Uuid>>()),
        Value::from(kits.iter().map(|k| k.kit_id).collect::<Vec<Uuid>>()),
        Value::from(kits.iter().map(|k| k.quantity).collect::<Vec<i32>>()),
    ]);
    Statement::from_sql_and_values(DbBackend::Postgres, SQL.as_str(), values)
}
