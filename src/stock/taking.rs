//! Taking stock: one reservation ([`RESERVE_SQL`] from an inventory's one
//! level, [`ALLOCATING_RESERVE_SQL`] across its levels), the reservations of
//! coalesced callers on one inventory or many ([`COALESCED_RESERVE_SQL`]), and
//! the lines of a multi-item request (`reserveMany`, `placeOrder`).
//!
//! Every statement here locks the inventory rows first (in id order when
//! there are several), then their levels, the order every stock statement
//! keeps (docs/locations.md), so no two of them can deadlock whatever
//! locations they name. Which levels give how many units is decided by the
//! database function `allocate` over the levels the statement has locked,
//! and written by the same statement: one allocation row and one ledger row
//! per location touched.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use sea_orm::{
    DbBackend, DbErr, FromQueryResult, QueryResult, Statement,
    sqlx::{self, Postgres, postgres::PgArguments, query::Query},
};
use uuid::Uuid;

use super::{
    allocating::{Allocating, eligible, preference},
    fragments::{
        CHOICE_COLUMNS, LEDGER_WITH_ID, choice, expiry, inventory_columns, reservation_columns_as_r, set, sole, step,
    },
    rows::{InventoryRow, MovementReason, ReservationRow, ReservationStatus, sql},
};

/// The one-statement reservation from an inventory held in one place, the
/// reservation of a request that may take from anywhere. Parameters: `$1`
/// inventory id, `$2` quantity, `$3` expected version (NULL: none), `$4` the
/// new reservation's id, `$5` user id, `$6` idempotency key, `$7` request
/// fingerprint (both NULL without a key), `$8` TTL in seconds (0: never
/// expires), `$9` the ledger row's id. One row (the inventory as left, then
/// the reservation as `r_*`) when stock was taken.
///
/// The decision is the UPDATE's own WHERE (`stock >= qty`, and `version =
/// expected` when given), never an earlier SELECT, so two requests can never
/// both see the last unit. It takes only from an inventory whose stock is
/// all at one active location ([`sole`]): its level then holds exactly the
/// row's `stock`, so the level follows the row, and the whole reservation
/// is one allocation there. 0 rows means: no such row, too little stock,
/// the version moved, or the stock is in several places or at an inactive
/// one ([`ALLOCATING_RESERVE_SQL`] serves those); one read afterwards tells
/// which. A second request with the same idempotency key fails on the
/// unique index and the whole statement is rolled back, so the stock its
/// UPDATE took is given back.
pub static RESERVE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"
WITH taken AS (
    UPDATE inventories
       {set}
     WHERE id = $1 AND stock >= $2 AND ($3::integer IS NULL OR version = $3) AND {sole}
 RETURNING {columns}
), drawn AS (
    UPDATE stock_levels l SET available = t.stock
      FROM taken t
     WHERE l.inventory_id = t.id AND l.location_id = t.sole_location_id
), reservation AS (
    INSERT INTO reservations
           (id, inventory_id, user_id, quantity, status, idempotency_key, request_fingerprint, expires_at)
    SELECT $4, id, $5, $2, {active}, $6, $7, {expires}
      FROM taken
 RETURNING *
), allocation AS (
    INSERT INTO allocations (reservation_id, location_id, quantity)
    SELECT $4, sole_location_id, $2 FROM taken
), movement AS (
    {LEDGER_WITH_ID}
    SELECT $9, id, -$2, {reserved}, stock, version, $4, NULL, sole_location_id FROM taken
)
SELECT taken.*, {reservation} FROM taken, reservation r"#,
        active = sql(ReservationStatus::Active),
        reserved = sql(MovementReason::Reserved),
        set = step("", "- $2"),
        sole = sole(""),
        columns = inventory_columns(""),
        expires = expiry("$8"),
        reservation = reservation_columns_as_r(),
    )
});

/// The one-statement reservation across an inventory's levels: the
/// parameters of [`RESERVE_SQL`], then `$10` the location ids to take from
/// in order of preference (NULL: every active location by priority),
/// `$11` FEWEST_LOCATIONS (else PRIORITY), `$12` whether the units may come
/// from several locations. One row as [`RESERVE_SQL`]'s when stock was taken.
///
/// It locks the inventory row (`inv`, with the version check, so a moved
/// version matches nothing), then every level of it (`lvl`; `FOR UPDATE`
/// reads each as it is now even when the statement waited for the row),
/// lets `allocate` choose among the eligible ones in order of preference,
/// and takes from each chosen level what it gives in the same statement:
/// the check and the take are one statement over the same locked rows. A
/// level's new value is computed from the value `lvl` locked (the current
/// one), not from the UPDATE's own row, which at READ COMMITTED is first
/// the snapshot's and may fail `available >= 0` for nothing (see
/// [`RESERVE_SQL`]).
/// Levels added after the statement began are not among the rows it
/// locked; then they do not add up to the row's `stock`, and the statement
/// is run again (`retry_stale_read`, a serialization failure). 0 rows: no
/// such row, the version moved, or the eligible locations cannot give the
/// units under the rules; one read afterwards tells which.
pub static ALLOCATING_RESERVE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"
WITH inv AS MATERIALIZED (
    SELECT id, stock FROM inventories
     WHERE id = $1 AND ($3::integer IS NULL OR version = $3)
       FOR UPDATE
), lvl AS MATERIALIZED (
    SELECT l.location_id, l.available, c.priority, c.code, c.active
      FROM stock_levels l JOIN locations c ON c.id = l.location_id
     WHERE l.inventory_id = (SELECT id FROM inv)
       FOR UPDATE OF l
), plan AS (
    SELECT array_agg(location_id ORDER BY {preference}) FILTER (WHERE {eligible}) AS locations,
           allocate(array_agg(available ORDER BY {preference}) FILTER (WHERE {eligible}), $2, $11::boolean,
                    $12::boolean) AS takes,
           CASE WHEN coalesce(sum(available), 0) = coalesce((SELECT stock FROM inv), 0) THEN true
                ELSE retry_stale_read() END AS fresh
      FROM lvl
), pick AS (
    SELECT p.location_id, p.take, row_number() OVER (ORDER BY p.k) AS k
      FROM plan, unnest(plan.locations, plan.takes) WITH ORDINALITY AS p(location_id, take, k)
     WHERE p.take > 0
), taken AS (
    UPDATE inventories i
       {set}
      FROM inv
     WHERE i.id = inv.id AND (SELECT fresh AND takes IS NOT NULL FROM plan)
 RETURNING {columns}
), drawn AS (
    UPDATE stock_levels l SET available = v.available - p.take
      FROM pick p JOIN lvl v ON v.location_id = p.location_id, taken t
     WHERE l.inventory_id = t.id AND l.location_id = p.location_id
), reservation AS (
    INSERT INTO reservations
           (id, inventory_id, user_id, quantity, status, idempotency_key, request_fingerprint, expires_at,
            {CHOICE_COLUMNS})
    SELECT $4, id, $5, $2, {active}, $6, $7, {expires}, {choice}
      FROM taken
 RETURNING *
), allocation AS (
    INSERT INTO allocations (reservation_id, location_id, quantity)
    SELECT $4, p.location_id, p.take FROM pick p, taken
), movement AS (
    {LEDGER_WITH_ID}
    SELECT CASE WHEN p.k = 1 THEN $9 ELSE gen_random_uuid() END, t.id, -p.take, {reserved}, t.stock, t.version, $4,
           NULL, p.location_id
      FROM taken t, pick p
)
SELECT taken.*, {reservation} FROM taken, reservation r"#,
        active = sql(ReservationStatus::Active),
        reserved = sql(MovementReason::Reserved),
        set = step("i.", "- $2"),
        columns = inventory_columns("i."),
        expires = expiry("$8"),
        reservation = reservation_columns_as_r(),
        preference = preference("$10::uuid[]"),
        eligible = eligible("$10::uuid[]"),
        choice = choice("$10::uuid[]", "$11::boolean", "$12::boolean"),
    )
});

/// The bind values of [`RESERVE_SQL`].
#[derive(Debug, Clone, Copy)]
pub struct Reserve<'a> {
    /// The inventory to take from.
    pub inventory_id: Uuid,
    /// Units.
    pub quantity: i32,
    /// The version the client saw, for the optimistic check.
    pub expected_version: Option<i32>,
    /// The new reservation's id.
    pub reservation_id: Uuid,
    /// Its ledger row's id.
    pub movement_id: Uuid,
    /// The owner.
    pub user_id: &'a str,
    /// The client's idempotency key.
    pub idempotency_key: Option<&'a str>,
    /// The fingerprint of the request carrying the key.
    pub fingerprint: Option<&'a str>,
    /// Seconds until the reservation expires; 0 = never.
    pub ttl_secs: i32,
    /// Where the units may come from (only [`Reserve::allocating_query`] reads it).
    pub allocating: &'a Allocating,
}

impl Reserve<'_> {
    /// [`RESERVE_SQL`] with these values, for the statement pool: the
    /// reservation from an inventory's one level.
    pub fn query(&self) -> Query<'static, Postgres, PgArguments> {
        self.bind(sqlx::query(RESERVE_SQL.as_str()))
    }

    /// [`ALLOCATING_RESERVE_SQL`] with these values, for the statement pool:
    /// the reservation across an inventory's levels.
    pub fn allocating_query(&self) -> Query<'static, Postgres, PgArguments> {
        let (ids, fewest, split) = self.allocating.columns();
        self.bind(sqlx::query(ALLOCATING_RESERVE_SQL.as_str()))
            .bind(ids)
            .bind(fewest.unwrap_or(false))
            .bind(split.unwrap_or(true))
    }

    /// `query` (of [`RESERVE_SQL`]'s parameters) with these values bound.
    pub(super) fn bind<'q>(&self, query: Query<'q, Postgres, PgArguments>) -> Query<'q, Postgres, PgArguments> {
        query
            .bind(self.inventory_id)
            .bind(self.quantity)
            .bind(self.expected_version)
            .bind(self.reservation_id)
            .bind(self.user_id)
            .bind(self.idempotency_key)
            .bind(self.fingerprint)
            .bind(self.ttl_secs)
            .bind(self.movement_id)
    }
}

/// A reservation and its inventory as the statement that changed both left
/// them (a row of [`RESERVE_SQL`] or of a release).
#[derive(Debug)]
pub struct ReservationChange {
    /// The inventory after the change.
    pub inventory: InventoryRow,
    /// The reservation after the change.
    pub reservation: ReservationRow,
}

impl ReservationChange {
    /// The change a statement's row describes.
    pub fn from_row(row: &QueryResult) -> Result<Self, DbErr> {
        Ok(Self {
            inventory: InventoryRow::from_query_result(row, "")?,
            reservation: ReservationRow::from_query_result(row, "r_")?,
        })
    }

    /// A read (it changes nothing) of the latest committed reservation
    /// `reservation_id` and its inventory in one statement, so both come
    /// from one snapshot; read with [`ReservationChange::from_row`].
    pub fn latest(reservation_id: Uuid) -> Statement {
        static SQL: LazyLock<String> = LazyLock::new(|| {
            format!(
                "SELECT {inventory}, {reservation} FROM reservations r JOIN inventories i ON i.id = r.inventory_id \
                 WHERE r.id = $1",
                inventory = inventory_columns("i."),
                reservation = reservation_columns_as_r(),
            )
        });
        Statement::from_sql_and_values(DbBackend::Postgres, SQL.as_str(), [reservation_id.into()])
    }
}

/// One statement for coalesced callers (each taking from anywhere), on one inventory or many: `$1`
/// inventories, `$2` reservation ids, `$3` users, `$4` quantities, `$6`
/// ledger row ids, `$7` idempotency keys and `$8` request fingerprints
/// (NULL for a caller without a key), `$9` expected versions (NULL for a
/// caller without one), `$5` TTLs in seconds (0: never expires); one
/// element per caller, in arrival order. A key used before (by any request of its
/// user) fails the whole statement on the keys' unique index, so it
/// writes nothing and its callers are served alone, where the key replays.
///
/// This locks every inventory named for the statement, in id order (the
/// `ORDER BY id FOR UPDATE` in `inv`: PostgreSQL sorts, then locks), the
/// order every multi-item writer and the sweeper lock in, so two batches of
/// this or another process that share inventories wait for each other
/// instead of deadlocking. Then it walks each inventory's callers in arrival
/// order granting each whose quantity still fits and whose expected version,
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
      FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::integer[], $6::uuid[], $7::text[], $8::text[],
                  $9::integer[], $5::integer[]) WITH ORDINALITY
        AS r(inventory_id, reservation_id, user_id, quantity, movement_id, idempotency_key, request_fingerprint,
             expected_version, ttl_secs, n)
), inv AS MATERIALIZED (
    SELECT {columns}, {sole} AS sole
      FROM inventories WHERE id = ANY($1) ORDER BY id FOR UPDATE
), walk AS (
    SELECT inv.id AS inventory_id, 0::bigint AS k, inv.stock AS stock, inv.version AS version, false AS granted
      FROM inv WHERE inv.sole
    UNION ALL
    SELECT w.inventory_id, r.k,
           CASE WHEN {fits} THEN w.stock - r.quantity ELSE w.stock END,
           CASE WHEN {fits} THEN w.version + 1 ELSE w.version END,
           {fits}
      FROM walk w JOIN req r ON r.inventory_id = w.inventory_id AND r.k = w.k + 1
), steps AS (
    SELECT * FROM walk WHERE k > 0
), last AS (
    SELECT DISTINCT ON (inventory_id) inventory_id, stock, version FROM steps ORDER BY inventory_id, k DESC
), taken AS (
    UPDATE inventories i
       {set}
      FROM last JOIN inv o ON o.id = last.inventory_id
     WHERE i.id = last.inventory_id AND last.version > o.version
 RETURNING i.id, i.updated_at, i.stock, i.sole_location_id
), drawn AS (
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
SELECT CASE WHEN s.k IS NOT NULL THEN true WHEN inv.id IS NOT NULL THEN NULL ELSE false END AS found,
       coalesce(s.granted, false) AS granted,
       inv.id, inv.sku, inv.name, s.stock, s.version, inv.created_at,
       coalesce(t.updated_at, inv.updated_at) AS updated_at, inv.sole_location_id,
       now() AS now, {expires} AS expires_at
  FROM req r
  LEFT JOIN steps s ON s.inventory_id = r.inventory_id AND s.k = r.k
  LEFT JOIN inv ON inv.id = r.inventory_id
  LEFT JOIN taken t ON t.id = r.inventory_id
 ORDER BY r.n"#,
        set = set("last.stock", "last.version"),
        columns = inventory_columns(""),
        sole = sole(""),
        active = sql(ReservationStatus::Active),
        reserved = sql(MovementReason::Reserved),
        expires = expiry("r.ttl_secs"),
        granted_expires = expiry("ttl_secs"),
        fits = "(w.stock >= r.quantity AND (r.expected_version IS NULL OR r.expected_version = w.version))",
    )
});

/// [`COALESCED_RESERVE_SQL`] for a batch whose callers all name different
/// inventories, the common batch on a catalogue: with one caller per row
/// there is nothing to walk, so each caller's reservation is the conditional
/// UPDATE of its own row, decided by the UPDATE's own WHERE as in
/// [`RESERVE_SQL`]. Without the walk's `FOR UPDATE` and recursive CTE it
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
      FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::integer[], $6::uuid[], $7::text[], $8::text[],
                  $9::integer[], $5::integer[]) WITH ORDINALITY
        AS r(inventory_id, reservation_id, user_id, quantity, movement_id, idempotency_key, request_fingerprint,
             expected_version, ttl_secs, n)
     ORDER BY inventory_id
), taken AS (
    UPDATE inventories i
       {set}
      FROM req r
     WHERE i.id = r.inventory_id AND i.id = ANY($1) AND i.stock >= r.quantity
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
       {taken}, now() AS now, {expires} AS expires_at
  FROM req r LEFT JOIN taken t ON t.n = r.n
 ORDER BY r.n"#,
        set = step("i.", "- r.quantity"),
        sole = sole("i."),
        active = sql(ReservationStatus::Active),
        reserved = sql(MovementReason::Reserved),
        inventory = inventory_columns("i."),
        taken = inventory_columns("t."),
        taken_expires = expiry("t.ttl_secs"),
        expires = expiry("r.ttl_secs"),
    )
});

/// The bind values of [`COALESCED_RESERVE_SQL`] (and of
/// [`DISTINCT_RESERVE_SQL`]): the callers, in arrival order, one element
/// each in every slice.
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
}

impl CoalescedReserve<'_> {
    /// The batch's statement with these values, for the statement pool:
    /// [`DISTINCT_RESERVE_SQL`] when every caller names another inventory,
    /// else [`COALESCED_RESERVE_SQL`].
    pub fn query(&self) -> Query<'static, Postgres, PgArguments> {
        let mut inventories = self.inventory_ids.to_vec();
        inventories.sort_unstable();
        inventories.dedup();
        let sql =
            if inventories.len() == self.inventory_ids.len() { &DISTINCT_RESERVE_SQL } else { &COALESCED_RESERVE_SQL };
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
    }
}

/// One caller's turn in a coalesced statement (a row of
/// [`COALESCED_RESERVE_SQL`] or [`DISTINCT_RESERVE_SQL`]).
#[derive(Debug)]
pub enum Turn {
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
        /// When the granted reservations were made (the transaction's start).
        now: DateTime<Utc>,
        /// Their expiry.
        expires_at: Option<DateTime<Utc>>,
    },
}

impl Turn {
    /// The turn a statement's row describes.
    pub fn from_row(row: &QueryResult) -> Result<Self, DbErr> {
        match row.try_get::<Option<bool>>("", "found")? {
            None => return Ok(Self::NotTaken),
            Some(false) => return Ok(Self::NotFound),
            Some(true) => {}
        }
        Ok(Self::Taken {
            granted: row.try_get("", "granted")?,
            inventory: InventoryRow::from_query_result(row, "")?,
            now: row.try_get("", "now")?,
            expires_at: row.try_get("", "expires_at")?,
        })
    }
}
