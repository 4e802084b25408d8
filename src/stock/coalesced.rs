//! Taking stock for coalesced callers, on one inventory or many, in one
//! statement: [`COALESCED_RESERVE_SQL`] (a walk through each inventory's
//! callers), [`DISTINCT_RESERVE_SQL`] (each caller on its own inventory) and,
//! when the batch names an inventory held in several places,
//! [`ACROSS_LEVELS_RESERVE_SQL`], and when kits are among its callers,
//! [`KITS_RESERVE_SQL`]. Each caller gets the answer it would have
//! got alone, one at a time, in arrival order.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use sea_orm::{
    DbErr, FromQueryResult, QueryResult,
    sqlx::{self, Postgres, postgres::PgArguments, query::Query},
};
use uuid::Uuid;

use super::{
    allocating::{eligible, offered, preference, sole_offered, sole_safety_stock},
    fragments::{
        Ids, LEDGER_WITH_ID, LEDGER_WITH_ID_OF_KITS, expiry, inventory_columns, lock_inventories, lock_levels, set,
        sole, step,
    },
    rows::{InventoryRow, MovementReason, ReservationStatus, sql},
};

/// The callers of a batch, from the bind arrays: one row per caller
/// (`r`), `n` its place in arrival order.
const CALLERS: &str = "unnest($1::uuid[], $2::uuid[], $3::text[], $4::integer[], $6::uuid[], $7::text[], $8::text[],
                  $9::integer[], $5::integer[], $10::boolean[]) WITH ORDINALITY
        AS r(inventory_id, reservation_id, user_id, quantity, movement_id, idempotency_key, request_fingerprint,
             expected_version, ttl_secs, use_safety, n)";

/// The end of a walk (`walk` rows of `inventory_id`, `k`, `stock`,
/// `version`, `granted`, over the locked rows `inv`): its steps, each
/// inventory's last step, and the inventory rows written once, at their
/// last stock and version.
fn steps() -> String {
    format!(
        "steps AS (
    SELECT * FROM walk WHERE k > 0
), last AS (
    SELECT DISTINCT ON (inventory_id) inventory_id, stock, version FROM steps ORDER BY inventory_id, k DESC
), taken AS (
    UPDATE inventories i
       {set}
      FROM last JOIN inv o ON o.id = last.inventory_id
     WHERE i.id = last.inventory_id AND last.version > o.version
 RETURNING i.id, i.updated_at, i.stock, i.sole_location_id
)",
        set = set("last.stock", "last.version"),
    )
}

/// What the one level of a walk's inventory offers the caller `r` (its
/// `use_safety`) in the walk row aliased `alias` (`"w."`, `"s."`), whose
/// `stock` is the level's units and `kept` its safety stock: the rule of
/// [`super::allocating::offered`], on the walk's running stock.
fn offer(alias: &str) -> String {
    format!("({alias}stock - CASE WHEN r.use_safety THEN 0 ELSE {alias}kept END)")
}

/// A walk's answer, one row per caller in arrival order (see [`Turn`]),
/// `available` what the caller could have taken from after its turn.
fn answers(available: &str) -> String {
    format!(
        "SELECT CASE WHEN s.k IS NOT NULL THEN true WHEN inv.id IS NOT NULL THEN NULL ELSE false END AS found,
       coalesce(s.granted, false) AS granted,
       inv.id, inv.sku, inv.name, s.stock, s.version, inv.created_at,
       coalesce(t.updated_at, inv.updated_at) AS updated_at, inv.sole_location_id, {available} AS available,
       now() AS now, {expires} AS expires_at
  FROM req r
  LEFT JOIN steps s ON s.inventory_id = r.inventory_id AND s.k = r.k
  LEFT JOIN inv ON inv.id = r.inventory_id
  LEFT JOIN taken t ON t.id = r.inventory_id
 ORDER BY r.n",
        expires = expiry("r.ttl_secs"),
    )
}

/// One statement for coalesced callers (each taking from anywhere), on one inventory or many: `$1`
/// inventories, `$2` reservation ids, `$3` users, `$4` quantities, `$6`
/// ledger row ids, `$7` idempotency keys and `$8` request fingerprints
/// (NULL for a caller without a key), `$9` expected versions (NULL for a
/// caller without one), `$5` TTLs in seconds (0: never expires), `$10`
/// whether each may take safety stock (an operator's `useSafetyStock`);
/// one element per caller, in arrival order. A key used before (by any request of its
/// user) fails the whole statement on the keys' unique index, so it
/// writes nothing and its callers are served alone, where the key replays.
///
/// This locks every inventory named for the statement, in id order (the
/// `ORDER BY id FOR UPDATE` in `inv`: PostgreSQL sorts, then locks), the
/// order every multi-item writer and the sweeper lock in, so two batches of
/// this or another process that share inventories wait for each other
/// instead of deadlocking. Then it walks each inventory's callers in arrival
/// order granting each whose quantity still fits in what the level offers
/// that caller (its units above the level's safety stock, `kept`, or all
/// of them for a caller who may take safety stock: a batch mixes customers
/// and operators, so this is decided per caller) and whose expected version,
/// if it gave one, is the version at its turn (a caller that does not fit
/// is refused, a later smaller one may still be served: exactly what
/// one-at-a-time would do), writes each inventory's new stock and version
/// once (one version step per grant), every granted reservation, and one
/// ledger row per grant with its own stock and version. It grants only on
/// an inventory held in one place ([`sole`]): its one level follows the
/// row, and each grant is one allocation there. One row per caller in
/// arrival order: `found` false when its inventory does not exist, NULL
/// when it exists but is held in several places or at an inactive one (the
/// caller is served alone, across its levels), else the inventory as it
/// stood after that caller's turn.
pub static COALESCED_RESERVE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"
WITH RECURSIVE req AS MATERIALIZED (
    SELECT r.*, row_number() OVER (PARTITION BY r.inventory_id ORDER BY r.n) AS k
      FROM {CALLERS}
), inv AS MATERIALIZED (
    {inv}
), walk AS (
    SELECT inv.id AS inventory_id, 0::bigint AS k, inv.stock AS stock, inv.version AS version, false AS granted,
           inv.kept AS kept
      FROM inv WHERE inv.sole
    UNION ALL
    SELECT w.inventory_id, r.k,
           CASE WHEN {fits} THEN w.stock - r.quantity ELSE w.stock END,
           CASE WHEN {fits} THEN w.version + 1 ELSE w.version END,
           {fits}, w.kept
      FROM walk w JOIN req r ON r.inventory_id = w.inventory_id AND r.k = w.k + 1
), {steps}, drawn AS (
    UPDATE stock_levels l SET available = t.stock
      FROM taken t
     WHERE l.inventory_id = t.id AND l.location_id = t.sole_location_id
), granted AS (
    SELECT r.*, s.stock, s.version, o.sole_location_id
      FROM req r JOIN steps s ON s.inventory_id = r.inventory_id AND s.k = r.k JOIN inv o ON o.id = r.inventory_id
     WHERE s.granted
), reservation AS (
    INSERT INTO reservations
           (id, inventory_id, user_id, quantity, status, idempotency_key, request_fingerprint, expires_at)
    SELECT reservation_id, inventory_id, user_id, quantity, {active}, idempotency_key, request_fingerprint,
           {granted_expires}
      FROM granted
), allocation AS (
    INSERT INTO allocations (reservation_id, location_id, quantity)
    SELECT reservation_id, sole_location_id, quantity FROM granted
), movement AS (
    {LEDGER_WITH_ID}
    SELECT movement_id, inventory_id, -quantity, {reserved}, stock, version, reservation_id, NULL, sole_location_id
      FROM granted
)
{answers}"#,
        answers = answers(&format!("greatest({}, 0)", offer("s."))),
        steps = steps(),
        inv = lock_inventories(
            &format!("{}, {} AS sole, {} AS kept", inventory_columns(""), sole(""), sole_safety_stock("inventories.")),
            Ids::Array("$1"),
            None
        ),
        active = sql(ReservationStatus::Active),
        reserved = sql(MovementReason::Reserved),
        granted_expires = expiry("ttl_secs"),
        fits = format!(
            "({} >= r.quantity AND (r.expected_version IS NULL OR r.expected_version = w.version))",
            offer("w.")
        ),
    )
});

/// [`COALESCED_RESERVE_SQL`] for a batch whose callers all name different
/// inventories, the common batch on a catalogue: with one caller per row
/// there is nothing to walk, so each caller's reservation is the conditional
/// UPDATE of its own row, decided by the UPDATE's own WHERE as in
/// [`RESERVE_SQL`] (what the level offers each caller, [`sole_offered`], by
/// the caller's own `use_safety`). Without the walk's `FOR UPDATE` and recursive CTE it
/// costs PostgreSQL about 15 % less per batch
/// (bench/results/decisions.md#a-statement-without-the-walk-for-batches-of-distinct-inventories-kept).
/// The same parameters; one row per caller in arrival order, as
/// [`Turn::from_row`] reads it: `found` NULL for a caller not served (no
/// row, too little stock, another version, stock in several places: like
/// [`RESERVE_SQL`]'s zero rows, told apart by a read afterwards), else its
/// inventory as left. Like [`RESERVE_SQL`] it takes only from an inventory
/// held at one active location, from its one level.
///
/// Rows are still updated in id order: the callers are sorted by inventory,
/// and the statement pool plans without sequential and bitmap scans, so
/// PostgreSQL reaches inventories only through their primary key, either
/// probing it for each caller in turn or scanning it in id order beside
/// them; every plan it can make updates in id order (tests/api/plans.rs
/// checks the plan on catalogues of several sizes).
pub static DISTINCT_RESERVE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"
WITH req AS MATERIALIZED (
    SELECT *
      FROM {CALLERS}
     ORDER BY inventory_id
), taken AS (
    UPDATE inventories i
       {set}
      FROM req r
     WHERE i.id = r.inventory_id AND i.id = ANY($1) AND {offered} >= r.quantity
       AND (r.expected_version IS NULL OR i.version = r.expected_version) AND {sole}
 RETURNING {inventory}, r.n, r.reservation_id, r.user_id, r.quantity, r.movement_id, r.idempotency_key,
           r.request_fingerprint, r.ttl_secs
), drawn AS (
    UPDATE stock_levels l SET available = t.stock
      FROM taken t
     WHERE l.inventory_id = t.id AND l.location_id = t.sole_location_id
), reservation AS (
    INSERT INTO reservations
           (id, inventory_id, user_id, quantity, status, idempotency_key, request_fingerprint, expires_at)
    SELECT t.reservation_id, t.id, t.user_id, t.quantity, {active}, t.idempotency_key, t.request_fingerprint,
           {taken_expires}
      FROM taken t
), allocation AS (
    INSERT INTO allocations (reservation_id, location_id, quantity)
    SELECT t.reservation_id, t.sole_location_id, t.quantity FROM taken t
), movement AS (
    {LEDGER_WITH_ID}
    SELECT t.movement_id, t.id, -t.quantity, {reserved}, t.stock, t.version, t.reservation_id, NULL,
           t.sole_location_id
      FROM taken t
)
SELECT CASE WHEN t.n IS NOT NULL THEN true END AS found, t.n IS NOT NULL AS granted,
       {taken}, t.stock AS available, now() AS now, {expires} AS expires_at
  FROM req r LEFT JOIN taken t ON t.n = r.n
 ORDER BY r.n"#,
        set = step("i.", "- r.quantity"),
        sole = sole("i."),
        offered = sole_offered("i.", "r.use_safety"),
        active = sql(ReservationStatus::Active),
        reserved = sql(MovementReason::Reserved),
        inventory = inventory_columns("i."),
        taken = inventory_columns("t."),
        taken_expires = expiry("t.ttl_secs"),
        expires = expiry("r.ttl_secs"),
    )
});

/// The body of the CTE `held` of a statement across levels: per locked
/// inventory (`inv`), what its eligible levels (`lvl`) offer customers
/// together (`eligible`), and whether its levels add up to its row's stock
/// (`fresh`; a level added after the statement began does not, and the
/// statement is run again: `retry_stale_read`).
static HELD: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT inv.id AS inventory_id,
           (coalesce(sum({offered}) FILTER (WHERE {eligible}), 0))::integer AS eligible,
           CASE WHEN coalesce(sum(v.available), 0) = inv.stock THEN true ELSE retry_stale_read() END AS fresh
      FROM inv LEFT JOIN lvl v ON v.inventory_id = inv.id
     GROUP BY inv.id, inv.stock",
        offered = offered("", None),
        eligible = eligible("NULL::uuid[]"),
    )
});

/// The body of the CTE `shelf`: each inventory's eligible levels laid end
/// to end in order of preference, each with the sellable units it offers
/// and where they `start`, from which consecutive grants take runs.
static SHELF: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT inventory_id, location_id, offered,
           sum(offered) OVER (PARTITION BY inventory_id ORDER BY {preference}) - offered AS start
      FROM (SELECT *, {offered} AS offered FROM lvl) v
     WHERE {eligible} AND offered > 0",
        preference = preference("NULL::uuid[]"),
        offered = offered("", None),
        eligible = eligible("NULL::uuid[]"),
    )
});

/// The body of the CTE `pick`: the run of the shelf each grant of
/// `granted` (a CTE of `reservation_id`, `movement_id`, `inventory_id`,
/// `stock`, `version`, `quantity` and its `start` on its inventory's shelf,
/// with `columns` passed through) takes, one row per level it touches,
/// `j` numbering them.
fn pick(granted: &str, columns: &str) -> String {
    format!(
        "SELECT g.reservation_id, g.movement_id, g.inventory_id, g.stock, g.version,{columns} sh.location_id,
           (least(g.start + g.quantity, sh.start + sh.offered) - greatest(g.start, sh.start))::integer AS take,
           row_number() OVER (PARTITION BY g.reservation_id ORDER BY sh.start) AS j
      FROM {granted} g JOIN shelf sh ON sh.inventory_id = g.inventory_id
     WHERE sh.start < g.start + g.quantity AND sh.start + sh.offered > g.start"
    )
}

/// The body of the CTE `drawn`: each level written once, from the value
/// `lvl` locked, less what the grants `pick` from it.
const DRAWN: &str = "UPDATE stock_levels l SET available = v.available - d.take
      FROM (SELECT inventory_id, location_id, sum(take) AS take FROM pick GROUP BY inventory_id, location_id) d
      JOIN lvl v ON v.inventory_id = d.inventory_id AND v.location_id = d.location_id
     WHERE l.inventory_id = d.inventory_id AND l.location_id = d.location_id";

/// [`COALESCED_RESERVE_SQL`] for a batch that names an inventory held in
/// several places (any inventory of it may be): each caller takes by the
/// default choice (every active location, by priority then code, splitting
/// allowed), the only choice the coalescer batches. The same parameters and
/// rows, where `available` is what the active locations offered customers
/// after the caller's turn (their sellable units, `SoldOut.available`, as
/// alone).
///
/// It walks customers only: a caller who may take safety stock is not
/// served here (its row says `found` NULL, so it is served alone right
/// after, across the levels, as if it had come after the batch). The
/// shelf below lays each level's sellable units end to end, which holds
/// only while every grant takes from the top of them; a grant that may
/// reach into a level's safety stock would break that (docs/stock-operations.md).
///
/// It locks the batch's inventory rows in id order, then all their levels
/// (the order of every stock statement), and walks each inventory's callers
/// in arrival order against what its active levels offer together, granting
/// each whose quantity still fits and whose expected version, if it gave
/// one, is the version at its turn. Where each granted caller's units come
/// from needs no walk of its own: by the default choice a caller takes the
/// first units still left in order of preference, so the granted callers
/// of an inventory take consecutive runs of its eligible levels laid end to
/// end (`shelf`, each level's sellable units), each run starting where the grants before it ended. That
/// is what `allocate` gives each caller in turn (tests/api/location_races
/// compare the two). Each level is written once, from the value `lvl`
/// locked; one allocation and one ledger row per caller and location
/// touched. Levels added after the statement began do not add up to their
/// row's stock, and the statement is run again (`retry_stale_read`).
pub static ACROSS_LEVELS_RESERVE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"
WITH RECURSIVE req AS MATERIALIZED (
    SELECT r.*, CASE WHEN NOT r.use_safety
                     THEN row_number() OVER (PARTITION BY r.inventory_id, r.use_safety ORDER BY r.n) END AS k
      FROM {CALLERS}
), inv AS MATERIALIZED (
    {inv}
), lvl AS MATERIALIZED (
    {levels}
), held AS MATERIALIZED (
    {held}
), walk AS (
    SELECT inv.id AS inventory_id, 0::bigint AS k, h.eligible AS eligible, inv.stock AS stock,
           inv.version AS version, false AS granted
      FROM inv JOIN held h ON h.inventory_id = inv.id
     WHERE h.fresh
    UNION ALL
    SELECT w.inventory_id, r.k,
           CASE WHEN {fits} THEN w.eligible - r.quantity ELSE w.eligible END,
           CASE WHEN {fits} THEN w.stock - r.quantity ELSE w.stock END,
           CASE WHEN {fits} THEN w.version + 1 ELSE w.version END,
           {fits}
      FROM walk w JOIN req r ON r.inventory_id = w.inventory_id AND r.k = w.k + 1
), {steps}, granted AS (
    SELECT r.*, s.stock, s.version, h.eligible - s.eligible - r.quantity AS start
      FROM req r JOIN steps s ON s.inventory_id = r.inventory_id AND s.k = r.k
      JOIN held h ON h.inventory_id = r.inventory_id
     WHERE s.granted
), shelf AS (
    {shelf}
), pick AS (
    {pick}
), drawn AS (
    {drawn}
), reservation AS (
    INSERT INTO reservations
           (id, inventory_id, user_id, quantity, status, idempotency_key, request_fingerprint, expires_at)
    SELECT reservation_id, inventory_id, user_id, quantity, {active}, idempotency_key, request_fingerprint,
           {granted_expires}
      FROM granted
), allocation AS (
    INSERT INTO allocations (reservation_id, location_id, quantity)
    SELECT reservation_id, location_id, take FROM pick
), movement AS (
    {LEDGER_WITH_ID}
    SELECT CASE WHEN j = 1 THEN movement_id ELSE gen_random_uuid() END, inventory_id, -take, {reserved}, stock,
           version, reservation_id, NULL, location_id
      FROM pick
)
{answers}"#,
        answers = answers("s.eligible"),
        steps = steps(),
        inv = lock_inventories(&inventory_columns(""), Ids::Array("$1"), None),
        levels = lock_levels(Ids::Array("ARRAY(SELECT id FROM inv)")),
        held = HELD.as_str(),
        shelf = SHELF.as_str(),
        drawn = DRAWN,
        pick = pick("granted", ""),
        active = sql(ReservationStatus::Active),
        reserved = sql(MovementReason::Reserved),
        granted_expires = expiry("ttl_secs"),
        fits = "(w.eligible >= r.quantity AND (r.expected_version IS NULL OR r.expected_version = w.version))",
    )
});

/// [`ACROSS_LEVELS_RESERVE_SQL`] for a batch with kits in it: a kit
/// caller takes every one of its components or none, so it is judged
/// against all of its inventories at its turn, and the walk goes through
/// the batch's callers in arrival order across inventories (not per
/// inventory), carrying what each inventory's levels still offer and its
/// version as arrays (`walk`, one element per inventory, by id). Every
/// caller has lines: one for a single reserve, one per component for a kit
/// (`$13`..`$17`: the caller's place in arrival order, inventory, units,
/// reservation id and ledger row id). `$11` and `$12` give each caller's kit
/// and kit reservation id (NULL for a single reserve); the other
/// parameters are [`COALESCED_RESERVE_SQL`]'s, a kit caller's inventory
/// being its first component's and its quantity the kits asked for.
///
/// A caller fits when each of its lines fits in what its inventory's
/// eligible levels offer customers after the grants before it, its
/// expected version (a single reserve's) is the version at its turn, and
/// its kit is active. Where each granted line's units come from is the
/// shelf of [`ACROSS_LEVELS_RESERVE_SQL`]: the granted lines of an
/// inventory take consecutive runs of its levels' sellable units in
/// arrival order. Each component is one change of its inventory (version +
/// 1, its own ledger rows carrying the kit reservation's id), the first
/// component (by inventory id) carries the key, and a granted kit writes
/// its kit reservation, as [`super::kitting::reserve_kit`] does alone. A
/// caller who may take safety stock is not served here (its row says
/// `found` NULL), as in [`ACROSS_LEVELS_RESERVE_SQL`]. Locks: the batch's
/// inventories in id order, then their levels, the order of every stock
/// statement. One row per caller in arrival order, as [`Turn::from_row`]
/// reads it; a kit caller's row is its first component's inventory, and
/// whether it was granted.
pub static KITS_RESERVE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"
WITH RECURSIVE req AS MATERIALIZED (
    SELECT r.*, k.kit_id, k.kit_reservation_id
      FROM {CALLERS}
      JOIN unnest($11::uuid[], $12::uuid[]) WITH ORDINALITY AS k(kit_id, kit_reservation_id, n) ON k.n = r.n
), line AS MATERIALIZED (
    SELECT l.*, dense_rank() OVER (ORDER BY l.inventory_id)::integer AS p
      FROM unnest($13::integer[], $14::uuid[], $15::integer[], $16::uuid[], $17::uuid[])
           AS l(n, inventory_id, quantity, reservation_id, movement_id)
), inv AS MATERIALIZED (
    {inv}
), lvl AS MATERIALIZED (
    {levels}
), held AS MATERIALIZED (
    {held}
), place AS MATERIALIZED (
    SELECT DISTINCT l.p, l.inventory_id, h.eligible, i.stock, i.version
      FROM line l LEFT JOIN inv i ON i.id = l.inventory_id LEFT JOIN held h ON h.inventory_id = l.inventory_id
), ask AS MATERIALIZED (
    SELECT n, array_agg(p ORDER BY p) AS ps, array_agg(quantity ORDER BY p) AS qs FROM line GROUP BY n
), walk AS (
    SELECT 0::bigint AS n, array_agg(eligible ORDER BY p) AS eligible, array_agg(version ORDER BY p) AS versions,
           false AS granted
      FROM place
     WHERE (SELECT bool_and(fresh) FROM held) IS NOT FALSE
    UNION ALL
    SELECT r.n,
           CASE WHEN g.fits
                THEN ARRAY(SELECT x.e - coalesce(d.q, 0)
                             FROM unnest(w.eligible) WITH ORDINALITY AS x(e, i)
                             LEFT JOIN unnest(a.ps, a.qs) AS d(p, q) ON d.p = x.i
                            ORDER BY x.i)
                ELSE w.eligible END,
           CASE WHEN g.fits
                THEN ARRAY(SELECT x.v + (d.p IS NOT NULL)::integer
                             FROM unnest(w.versions) WITH ORDINALITY AS x(v, i)
                             LEFT JOIN unnest(a.ps) AS d(p) ON d.p = x.i
                            ORDER BY x.i)
                ELSE w.versions END,
           g.fits
      FROM walk w JOIN req r ON r.n = w.n + 1 JOIN ask a ON a.n = r.n
     CROSS JOIN LATERAL (
           SELECT NOT r.use_safety
                  AND NOT EXISTS (SELECT 1 FROM unnest(a.ps, a.qs) AS d(p, q)
                                   WHERE NOT coalesce(w.eligible[d.p] >= d.q, false))
                  AND (r.expected_version IS NULL OR w.versions[a.ps[1]] = r.expected_version)
                  AND (r.kit_id IS NULL OR EXISTS (SELECT 1 FROM kits WHERE id = r.kit_id AND active)) AS fits
     ) g
), steps AS (
    SELECT * FROM walk WHERE n > 0
), ran AS MATERIALIZED (
    SELECT l.*, r.user_id, r.idempotency_key, r.request_fingerprint, r.ttl_secs, r.kit_reservation_id,
           (pl.stock - sum(l.quantity) OVER w)::integer AS stock,
           (pl.version + row_number() OVER w)::integer AS version,
           sum(l.quantity) OVER w - l.quantity AS start,
           row_number() OVER (PARTITION BY l.n ORDER BY l.inventory_id) AS j
      FROM line l JOIN steps s ON s.n = l.n JOIN req r ON r.n = l.n JOIN place pl ON pl.p = l.p
     WHERE s.granted
    WINDOW w AS (PARTITION BY l.inventory_id ORDER BY l.n)
), last AS (
    SELECT DISTINCT ON (inventory_id) inventory_id, stock, version FROM ran ORDER BY inventory_id, version DESC
), taken AS (
    UPDATE inventories i
       {set}
      FROM last
     WHERE i.id = last.inventory_id
 RETURNING i.id, i.updated_at
), shelf AS (
    {shelf}
), pick AS (
    {pick}
), drawn AS (
    {drawn}
), kit AS (
    INSERT INTO kit_reservations (id, kit_id, user_id, quantity)
    SELECT r.kit_reservation_id, r.kit_id, r.user_id, r.quantity
      FROM req r JOIN steps s ON s.n = r.n
     WHERE s.granted AND r.kit_id IS NOT NULL
), reservation AS (
    INSERT INTO reservations
           (id, inventory_id, user_id, quantity, status, idempotency_key, request_fingerprint, expires_at,
            kit_reservation_id)
    SELECT reservation_id, inventory_id, user_id, quantity, {active}, CASE WHEN j = 1 THEN idempotency_key END,
           CASE WHEN j = 1 THEN request_fingerprint END, {granted_expires}, kit_reservation_id
      FROM ran
), allocation AS (
    INSERT INTO allocations (reservation_id, location_id, quantity)
    SELECT reservation_id, location_id, take FROM pick
), movement AS (
    {LEDGER_WITH_ID_OF_KITS}
    SELECT CASE WHEN j = 1 THEN movement_id ELSE gen_random_uuid() END, inventory_id, -take, {reserved}, stock,
           version, reservation_id, NULL, location_id, kit_reservation_id
      FROM pick
)
SELECT CASE WHEN i.id IS NULL THEN false WHEN r.use_safety THEN NULL ELSE true END AS found,
       coalesce(s.granted, false) AS granted,
       i.id, i.sku, i.name, (i.stock - (pl.eligible - s.eligible[pl.p]))::integer AS stock,
       s.versions[pl.p] AS version, i.created_at, coalesce(t.updated_at, i.updated_at) AS updated_at,
       i.sole_location_id, s.eligible[pl.p] AS available, now() AS now, {expires} AS expires_at
  FROM req r
  LEFT JOIN steps s ON s.n = r.n
  LEFT JOIN inv i ON i.id = r.inventory_id
  LEFT JOIN place pl ON pl.inventory_id = r.inventory_id
  LEFT JOIN taken t ON t.id = r.inventory_id
 ORDER BY r.n"#,
        inv = lock_inventories(&inventory_columns(""), Ids::Array("$14"), None),
        levels = lock_levels(Ids::Array("ARRAY(SELECT id FROM inv)")),
        held = HELD.as_str(),
        shelf = SHELF.as_str(),
        drawn = DRAWN,
        pick = pick("ran", " g.kit_reservation_id,"),
        set = set("last.stock", "last.version"),
        active = sql(ReservationStatus::Active),
        reserved = sql(MovementReason::Reserved),
        granted_expires = expiry("ttl_secs"),
        expires = expiry("r.ttl_secs"),
    )
});

/// The bind values of [`COALESCED_RESERVE_SQL`] (and of
/// [`DISTINCT_RESERVE_SQL`] and [`ACROSS_LEVELS_RESERVE_SQL`]): the callers,
/// in arrival order, one element each in every slice.
#[derive(Debug, Clone, Copy)]
pub struct CoalescedReserve<'a> {
    /// The inventory each caller takes from.
    pub inventory_ids: &'a [Uuid],
    /// The new reservations' ids.
    pub reservation_ids: &'a [Uuid],
    /// Their ledger rows' ids.
    pub movement_ids: &'a [Uuid],
    /// The callers.
    pub user_ids: &'a [&'a str],
    /// What each caller asks for.
    pub quantities: &'a [i32],
    /// Each caller's idempotency key, if it sent one.
    pub keys: &'a [Option<&'a str>],
    /// The fingerprint of each keyed caller's request.
    pub fingerprints: &'a [Option<&'a str>],
    /// The version each caller expects at its turn, if it gave one.
    pub expected_versions: &'a [Option<i32>],
    /// Seconds until each caller's reservation expires; 0 = never.
    pub ttl_secs: &'a [i32],
    /// Whether each caller may take safety stock (an operator's `useSafetyStock`).
    pub use_safety_stock: &'a [bool],
    /// Whether an inventory of the batch is known to be held in several
    /// places: then [`ACROSS_LEVELS_RESERVE_SQL`] serves it.
    pub across_levels: bool,
    /// The kits among the callers and every caller's lines, when there are
    /// kits: then [`KITS_RESERVE_SQL`] serves the batch.
    pub kits: Option<KitLines<'a>>,
}

/// The parameters [`KITS_RESERVE_SQL`] adds: per caller its kit, and every
/// caller's lines (a single reserve's one, a kit's one per component).
#[derive(Debug, Clone, Copy)]
pub struct KitLines<'a> {
    /// Each caller's kit (none for a single reserve).
    pub kit_ids: &'a [Option<Uuid>],
    /// Each caller's new kit reservation's id (none for a single reserve).
    pub kit_reservation_ids: &'a [Option<Uuid>],
    /// Each line's caller, its place in arrival order from 1.
    pub callers: &'a [i32],
    /// Each line's inventory.
    pub inventory_ids: &'a [Uuid],
    /// Each line's units.
    pub quantities: &'a [i32],
    /// Each line's new reservation's id.
    pub reservation_ids: &'a [Uuid],
    /// Each line's first ledger row's id.
    pub movement_ids: &'a [Uuid],
}

impl CoalescedReserve<'_> {
    /// The batch's statement with these values, for the statement pool:
    /// [`KITS_RESERVE_SQL`] for a batch with kits, else
    /// [`ACROSS_LEVELS_RESERVE_SQL`] for a batch `across_levels`, else
    /// [`DISTINCT_RESERVE_SQL`] when every caller names another inventory,
    /// else [`COALESCED_RESERVE_SQL`].
    pub fn query(&self) -> Query<'static, Postgres, PgArguments> {
        let mut inventories = self.inventory_ids.to_vec();
        inventories.sort_unstable();
        inventories.dedup();
        if let Some(kits) = &self.kits {
            return self
                .bind(sqlx::query(KITS_RESERVE_SQL.as_str()))
                .bind(kits.kit_ids)
                .bind(kits.kit_reservation_ids)
                .bind(kits.callers)
                .bind(kits.inventory_ids)
                .bind(kits.quantities)
                .bind(kits.reservation_ids)
                .bind(kits.movement_ids);
        }
        let sql = if self.across_levels {
            &ACROSS_LEVELS_RESERVE_SQL
        } else if inventories.len() == self.inventory_ids.len() {
            &DISTINCT_RESERVE_SQL
        } else {
            &COALESCED_RESERVE_SQL
        };
        self.bind(sqlx::query(sql.as_str()))
    }

    /// `query` (of [`COALESCED_RESERVE_SQL`]'s parameters) with these values bound.
    pub(super) fn bind<'q>(&self, query: Query<'q, Postgres, PgArguments>) -> Query<'q, Postgres, PgArguments> {
        query
            .bind(self.inventory_ids)
            .bind(self.reservation_ids)
            .bind(self.user_ids)
            .bind(self.quantities)
            .bind(self.ttl_secs)
            .bind(self.movement_ids)
            .bind(self.keys)
            .bind(self.fingerprints)
            .bind(self.expected_versions)
            .bind(self.use_safety_stock)
    }
}

/// One caller's turn in a coalesced statement (a row of any of this
/// module's statements).
#[derive(Debug)]
pub(crate) enum Turn {
    /// The caller's inventory does not exist.
    NotFound,
    /// Nothing was taken for the caller, and the statement cannot tell why
    /// (its row may be missing, short of stock, at another version or held
    /// in several places): a read afterwards decides, as for a caller alone.
    NotTaken,
    /// The caller's turn on its inventory.
    Taken {
        /// Whether the caller got its units.
        granted: bool,
        /// The inventory right after its turn.
        inventory: InventoryRow,
        /// What the locations it may take from offered it right after its turn.
        available: i32,
        /// When the granted reservations were made (the transaction's start).
        now: DateTime<Utc>,
        /// Their expiry.
        expires_at: Option<DateTime<Utc>>,
    },
}

impl Turn {
    /// The turn a statement's row describes.
    pub(crate) fn from_row(row: &QueryResult) -> Result<Self, DbErr> {
        match row.try_get::<Option<bool>>("", "found")? {
            None => return Ok(Self::NotTaken),
            Some(false) => return Ok(Self::NotFound),
            Some(true) => {}
        }
        Ok(Self::Taken {
            granted: row.try_get("", "granted")?,
            inventory: InventoryRow::from_query_result(row, "")?,
            available: row.try_get("", "available")?,
            now: row.try_get("", "now")?,
            expires_at: row.try_get("", "expires_at")?,
        })
    }
}
