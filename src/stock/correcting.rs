//! Correcting what a location holds for reasons other than a sale: an
//! operator's adjustment, a signed change or a count ([`adjust`]), and a
//! level's safety stock ([`set_safety_stock`]).

use std::sync::LazyLock;

use sea_orm::{ActiveEnum as _, DbBackend, Statement};
use uuid::Uuid;

use super::{
    fragments::{
        Ids, LEDGER_ADJUSTED, held_at, inventory_columns, location_or_default, lock_inventories, lock_levels,
        seen_as_locked, set,
    },
    rows::{AdjustmentReason, MovementReason, sql},
};

/// What an adjustment asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// A signed change of the level's available units (never 0).
    Delta(i32),
    /// What a count found on hand there (0 or more): the change is the
    /// count less what the level has on hand.
    Count(i32),
}

/// An adjustment as the statement writes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Adjustment<'a> {
    /// The inventory.
    pub inventory_id: Uuid,
    /// The location; none: the default location.
    pub location_id: Option<Uuid>,
    /// A change or a count.
    pub change: Change,
    /// Why.
    pub reason: AdjustmentReason,
    /// The operator's note, if any.
    pub note: Option<&'a str>,
    /// The inventory's version the operator saw, if given.
    pub expected_version: Option<i32>,
    /// The operator (the token's `sub`): the ledger row's `actor`, and
    /// whose key space the key is in.
    pub operator: &'a str,
    /// The idempotency key and the request's fingerprint, if given.
    pub key: Option<(&'a str, &'a str)>,
}

/// Adjusts one level in one statement: a [`Change::Delta`] changes its
/// available units by the delta, a [`Change::Count`] by the count less its
/// units on hand (available + reserved + committed there). Applied, it is
/// one change of the inventory (version + 1, `stock` by the delta) with one
/// `ADJUSTED` ledger row at the location carrying the reason, the note and
/// the operator as `actor`, and the key claimed with the delta applied,
/// which a replay answers. A positive change at a location that never held
/// the inventory makes its level, and the inventory is then held in
/// several places (`sole_location_id`).
///
/// Nothing is written when the inventory or location does not exist, the
/// version is not `expected_version`, the change is 0 (a count that
/// matches), or the level's available units would fall below 0: a negative
/// change takes only available units, never the reserved or committed ones
/// (the level's `CHECK (available >= 0)` would refuse it too), and a count
/// below what reservations hold there (reserved + committed) is the same
/// condition.
///
/// This locks the inventory row, then its levels (the lock order of every
/// stock statement), so a reserve, a release or the sweeper on the same
/// inventory waits for it or it for them, and the level's available units
/// are read as locked (as they are now): a change is judged on them alone.
/// A count needs what reservations hold there too, which is read unlocked,
/// from the statement's snapshot; at READ COMMITTED that may be older than
/// the row the statement waited for, and then it runs again
/// ([`seen_as_locked`]), so a count is never judged against holds that have
/// changed. A change reads no hold, so it never runs again for that: on an
/// item under a stream of reserves it would find the row changed every
/// time. A key already claimed fails on `idempotency_keys`' primary key and
/// rolls the whole statement back.
///
/// One row, always: `found` (the inventory exists), `located` (so does the
/// location), `current` (its version is the expected one, or none was
/// given), `applied`, the `delta` judged, the inventory as left (as locked
/// when nothing was applied; its columns NULL when not found) and the
/// level as left: `l_location_id`, `l_available`, `l_safety_stock`, and for
/// a count `l_reserved` and `l_committed` (NULL for a change, which did not
/// read them).
pub(crate) fn adjust(a: Adjustment<'_>) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH loc AS (
    {location}
), inv AS MATERIALIZED (
    {inv}
), lvl AS MATERIALIZED (
    {lvl}
), held AS (
    {held}
), judged AS (
    SELECT inv.id AS inventory_id, inv.stock, inv.version, loc.id AS location_id, coalesce(v.available, 0) AS available,
           coalesce(v.safety_stock, 0) AS safety_stock, h.reserved, h.committed,
           coalesce($3::integer, $4::integer - (coalesce(v.available, 0) + h.reserved + h.committed)) AS delta,
           ($5::integer IS NULL OR inv.version = $5) AS current
      FROM inv CROSS JOIN loc CROSS JOIN held h
      LEFT JOIN lvl v ON v.location_id = loc.id
     WHERE $4::integer IS NULL OR {seen}
), plan AS (
    SELECT j.*, j.current AND j.delta <> 0 AND j.available + j.delta >= 0 AS apply FROM judged j
), changed AS (
    -- From the values `inv` locked, not the row's own: at READ COMMITTED
    -- that is first the snapshot's, which a change judged without it may be
    -- older than, and `stock >= 0` would be checked on it before the row is
    -- read again. An inventory that gets units at a location besides its
    -- sole one is held in several places from now on.
    UPDATE inventories i
       {set}, sole_location_id = CASE WHEN i.sole_location_id = p.location_id THEN p.location_id END
      FROM plan p
     WHERE i.id = p.inventory_id AND p.apply
 RETURNING {changed_columns}
), level AS (
    -- From the value `lvl` locked, not the row's own: at READ COMMITTED
    -- that is first the snapshot's.
    INSERT INTO stock_levels AS l (inventory_id, location_id, available)
    SELECT p.inventory_id, p.location_id, p.available + p.delta FROM plan p, changed c
        ON CONFLICT (inventory_id, location_id) DO UPDATE SET available = excluded.available
), movement AS (
    {LEDGER_ADJUSTED}
    SELECT c.id, p.delta, {adjusted}, c.stock, c.version, NULL, NULL, p.location_id, $7, $8, $6
      FROM changed c, plan p
), claimed AS (
    INSERT INTO idempotency_keys (user_id, idempotency_key, request_fingerprint, adjusted)
    SELECT $8, $9, $10, p.delta FROM changed c, plan p WHERE $9::text IS NOT NULL
), after AS (
    SELECT * FROM changed
     UNION ALL
    SELECT {inv_columns} FROM inv WHERE NOT EXISTS (SELECT 1 FROM changed)
)
SELECT EXISTS (SELECT 1 FROM inv) AS found, EXISTS (SELECT 1 FROM loc) AS located,
       coalesce(p.current, false) AS current, EXISTS (SELECT 1 FROM changed) AS applied,
       coalesce(p.delta, 0) AS delta, i.*,
       p.location_id AS l_location_id,
       (p.available + CASE WHEN EXISTS (SELECT 1 FROM changed) THEN p.delta ELSE 0 END)::bigint AS l_available,
       p.safety_stock AS l_safety_stock,
       CASE WHEN $4::integer IS NOT NULL THEN p.reserved::bigint END AS l_reserved,
       CASE WHEN $4::integer IS NOT NULL THEN p.committed::bigint END AS l_committed
  FROM (SELECT 1) one
  LEFT JOIN plan p ON true
  LEFT JOIN after i ON true"#,
            location = location_or_default("$2"),
            inv = lock_inventories(&inventory_columns(""), Ids::One("$1"), None),
            lvl = lock_levels(Ids::One("(SELECT id FROM inv)")),
            held = held_at("(SELECT id FROM inv)", "(SELECT id FROM loc)", "$4::integer IS NOT NULL"),
            seen = seen_as_locked("$1"),
            set = set("p.stock + p.delta", "p.version + 1"),
            changed_columns = inventory_columns("i."),
            inv_columns = inventory_columns(""),
            adjusted = sql(MovementReason::Adjusted),
        )
    });
    let (delta, counted) = match a.change {
        Change::Delta(delta) => (Some(delta), None),
        Change::Count(counted) => (None, Some(counted)),
    };
    Statement::from_sql_and_values(
        DbBackend::Postgres,
        SQL.as_str(),
        [
            a.inventory_id.into(),
            a.location_id.into(),
            delta.into(),
            counted.into(),
            a.expected_version.into(),
            a.reason.to_value().into(),
            a.note.map(str::to_owned).into(),
            a.operator.into(),
            a.key.map(|(key, _)| key.to_owned()).into(),
            a.key.map(|(_, fingerprint)| fingerprint.to_owned()).into(),
        ],
    )
}

/// Sets the safety stock of inventory `inventory_id` at `location_id`
/// (none: the default location) to `quantity`, in one statement. It moves
/// no unit, writes no ledger row and leaves the version as it is. A
/// location that never held the inventory gets its level (no units) when
/// `quantity` is above 0, and the inventory is then held in several places
/// (`sole_location_id`, the one change of its row, which readers of
/// versions do not see); setting 0 there writes nothing.
///
/// This locks the inventory row and then its levels, as every stock
/// statement does, so a reserve that decides by the level's safety stock
/// after locking them (across levels, and every line of a cart) sees the
/// new value once this commits. A reserve from an inventory held in one
/// place reads it unlocked ([`super::allocating::sole_safety_stock`]); at
/// READ COMMITTED one that began before this committed may still decide by
/// the old value.
///
/// One row, always: `found`, `located`, and the level's `l_location_id`,
/// `l_available` and `l_safety_stock` as left (NULL when either is
/// missing; 0 units where no level was made). What reservations hold there
/// is not read: it does not change.
pub(crate) fn set_safety_stock(inventory_id: Uuid, location_id: Option<Uuid>, quantity: i32) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH loc AS (
    {location}
), inv AS MATERIALIZED (
    {inv}
), lvl AS MATERIALIZED (
    {lvl}
), kept AS (
    INSERT INTO stock_levels AS l (inventory_id, location_id, available, safety_stock)
    SELECT inv.id, loc.id, 0, $3 FROM inv, loc
     WHERE $3 > 0 OR EXISTS (SELECT 1 FROM lvl WHERE location_id = loc.id)
        ON CONFLICT (inventory_id, location_id) DO UPDATE SET safety_stock = excluded.safety_stock
 RETURNING l.inventory_id, l.location_id, l.available, l.safety_stock
), spread AS (
    UPDATE inventories i SET sole_location_id = NULL
      FROM kept k
     WHERE i.id = k.inventory_id AND i.sole_location_id <> k.location_id
)
SELECT EXISTS (SELECT 1 FROM inv) AS found, EXISTS (SELECT 1 FROM loc) AS located, loc.id AS l_location_id,
       coalesce(k.available, 0)::bigint AS l_available, coalesce(k.safety_stock, 0) AS l_safety_stock
  FROM (SELECT 1) one
  LEFT JOIN loc ON true LEFT JOIN kept k ON true"#,
            location = location_or_default("$2"),
            inv = lock_inventories("id, sole_location_id", Ids::One("$1"), None),
            lvl = lock_levels(Ids::One("(SELECT id FROM inv)")),
        )
    });
    Statement::from_sql_and_values(
        DbBackend::Postgres,
        SQL.as_str(),
        [inventory_id.into(), location_id.into(), quantity.into()],
    )
}
