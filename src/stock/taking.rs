//! Taking stock for one reservation: [`RESERVE_SQL`] from an inventory's
//! one level, [`ALLOCATING_RESERVE_SQL`] across its levels. The
//! reservations of coalesced callers are taken in [`super::coalesced`],
//! the lines of a multi-item request (`reserveMany`, `placeOrder`) in
//! [`super::lines`].
//!
//! Every statement here locks the inventory rows first (in id order when
//! there are several), then their levels, the order every stock statement
//! keeps (docs/locations.md; [`super::fragments::lock_inventories`],
//! [`super::fragments::lock_levels`]), so no two of them can deadlock
//! whatever locations they name. Which levels give how many units is decided by the
//! database function `allocate` over the levels the statement has locked,
//! and written by the same statement: one allocation row and one ledger row
//! per location touched.

use std::sync::LazyLock;

use sea_orm::{
    DbBackend, DbErr, FromQueryResult, QueryResult, Statement,
    sqlx::{self, Postgres, postgres::PgArguments, query::Query},
};
use uuid::Uuid;

use super::{
    allocating::{Allocating, eligible, offered, preference, sole_offered},
    fragments::{
        CHOICE_COLUMNS, Ids, LEDGER_WITH_ID, choice, expiry, inventory_columns, lock_inventories, lock_levels,
        reservation_columns_as_r, set, sole, step,
    },
    rows::{InventoryRow, MovementReason, ReservationRow, ReservationStatus, sql},
};

/// The one-statement reservation from an inventory held in one place, the
/// reservation of a request that may take from anywhere. Parameters: `$1`
/// inventory id, `$2` quantity, `$3` expected version (NULL: none), `$4` the
/// new reservation's id, `$5` user id, `$6` idempotency key, `$7` request
/// fingerprint (both NULL without a key), `$8` TTL in seconds (0: never
/// expires), `$9` the ledger row's id, `$10` whether the request may take
/// safety stock (an operator's `useSafetyStock`). One row (the inventory as
/// left, then the reservation as `r_*`) when stock was taken.
///
/// The decision is the UPDATE's own WHERE (what the level offers the
/// request, [`sole_offered`], `>= qty`, and `version = expected` when
/// given), never an earlier SELECT, so two requests can never both see the
/// last unit. It takes only from an inventory whose stock is
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
     WHERE id = $1 AND {offered} >= $2 AND ($3::integer IS NULL OR version = $3) AND {sole}
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
        offered = sole_offered("inventories.", "$10::boolean"),
        columns = inventory_columns(""),
        expires = expiry("$8"),
        reservation = reservation_columns_as_r(),
    )
});

/// The one-statement reservation across an inventory's levels: the
/// parameters of [`RESERVE_SQL`], then `$11` the location ids to take from
/// in order of preference (NULL: every active location by priority),
/// `$12` FEWEST_LOCATIONS (else PRIORITY), `$13` whether the units may come
/// from several locations. One row as [`RESERVE_SQL`]'s when stock was taken.
///
/// It locks the inventory row (`inv`, with the version check, so a moved
/// version matches nothing), then every level of it (`lvl`; `FOR UPDATE`
/// reads each as it is now even when the statement waited for the row),
/// lets `allocate` choose among the eligible ones in order of preference
/// from what each offers the request ([`offered`]: its sellable units, or
/// all of them for `$10`), and takes from each chosen level what it gives in
/// the same statement:
/// the check and the take are one statement over the same locked rows. A
/// level's new value is computed from the value `lvl` locked (the current
/// one), and the row's from the values `inv` locked, not from the UPDATE's
/// own row, which at READ COMMITTED is first the snapshot's: a statement
/// that waited for a change adding units would have failed `available >= 0`
/// or `stock >= 0` on it for nothing (see [`RESERVE_SQL`]).
/// Levels added after the statement began are not among the rows it
/// locked; then they do not add up to the row's `stock`, and the statement
/// is run again (`retry_stale_read`, a serialization failure). 0 rows: no
/// such row, the version moved, or the eligible locations cannot give the
/// units under the rules; one read afterwards tells which.
pub(crate) static ALLOCATING_RESERVE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"
WITH inv AS MATERIALIZED (
    {inv}
), lvl AS MATERIALIZED (
    {lvl}
), plan AS (
    SELECT array_agg(location_id ORDER BY {preference}) FILTER (WHERE {eligible}) AS locations,
           allocate(array_agg({offered} ORDER BY {preference}) FILTER (WHERE {eligible}), $2, $12::boolean,
                    $13::boolean) AS takes,
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
        inv = lock_inventories("id, stock, version", Ids::One("$1"), Some("($3::integer IS NULL OR version = $3)")),
        lvl = lock_levels(Ids::One("(SELECT id FROM inv)")),
        set = set("inv.stock - $2", "inv.version + 1"),
        columns = inventory_columns("i."),
        expires = expiry("$8"),
        reservation = reservation_columns_as_r(),
        preference = preference("$11::uuid[]"),
        eligible = eligible("$11::uuid[]"),
        offered = offered("", Some("$10::boolean")),
        choice = choice("$11::uuid[]", "$12::boolean", "$13::boolean"),
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
    /// Whether it may take safety stock (an operator's `useSafetyStock`).
    pub use_safety_stock: bool,
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
            .bind(self.use_safety_stock)
    }
}

/// A reservation and its inventory as the statement that changed both left
/// them (a row of [`RESERVE_SQL`] or of a release).
#[derive(Debug)]
pub(crate) struct ReservationChange {
    /// The inventory after the change.
    pub inventory: InventoryRow,
    /// The reservation after the change.
    pub reservation: ReservationRow,
}

impl ReservationChange {
    /// The change a statement's row describes.
    pub(crate) fn from_row(row: &QueryResult) -> Result<Self, DbErr> {
        Ok(Self {
            inventory: InventoryRow::from_query_result(row, "")?,
            reservation: ReservationRow::from_query_result(row, "r_")?,
        })
    }

    /// A read (it changes nothing) of the latest committed reservation
    /// `reservation_id` and its inventory in one statement, so both come
    /// from one snapshot; read with [`ReservationChange::from_row`].
    pub(crate) fn latest(reservation_id: Uuid) -> Statement {
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
