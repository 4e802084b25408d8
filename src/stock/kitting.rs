//! Taking and giving back a kit's components together: [`reserve_kit`]
//! takes every component of a kit reservation in one statement or none,
//! [`release_kit`] gives them all back in one. The sweeper expires a kit's
//! components together too (`super::returning::sweep`).
//!
//! A kit reservation's components are reservations of their own, one per
//! component inventory, carrying its id (`kit_reservation_id`). Every
//! statement that changes their status changes all of them at once, after
//! locking the kit reservation's row, so two such statements on one kit
//! take turns and no reader sees them in different statuses; the
//! statements for one reservation (release, extend, change of quantity,
//! checkout) never match a kit's component.

use std::sync::LazyLock;

use sea_orm::{DbBackend, Statement, Value};
use uuid::Uuid;

use super::{
    allocating::{eligible, held, offered, preference},
    fragments::{
        CHOICE_COLUMNS, Ids, LEDGER_OF_KITS, Lines, active_unexpired, choice, expiry, inventory_columns,
        lock_inventories, lock_levels, per_line, reservation_columns_as_r, set,
    },
    lines::{FRESH, Line, line_cte, line_values},
    rows::{MovementReason, ReservationStatus, sql},
};

/// The request [`reserve_kit`] binds. Public for the benchmark's KIT
/// cells, which build it as the server does.
#[derive(Debug, Clone, Copy)]
pub struct KitReserve<'a> {
    /// The kit.
    pub kit_id: Uuid,
    /// Kits.
    pub quantity: i32,
    /// One line per component, sorted by inventory id: kits × component
    /// quantity each, all choosing locations as the request does.
    pub lines: &'a [Line],
    /// The new kit reservation's id.
    pub kit_reservation_id: Uuid,
    /// The owner.
    pub user_id: &'a str,
    /// The idempotency key and its request's fingerprint.
    pub key: Option<(&'a str, &'a str)>,
    /// Seconds until the reservations expire; 0 = never.
    pub ttl_secs: i32,
}

/// Reserves `quantity` kits in one statement: every component's units or
/// none. It locks the components' inventories in id order and then their
/// levels (the order every stock statement keeps, so a kit, a cart and a
/// single reserve sharing inventories wait for each other instead of
/// deadlocking), lets `allocate` choose each component's locations from
/// what its eligible levels offer a customer ([`offered`]: never safety
/// stock), and writes only when every component can be served and the kit
/// is active: one kit reservation, one reservation per component (the
/// first carrying the key), an allocation and a ledger row (with the kit
/// reservation's id) per location taken from, each component one change
/// of its inventory (version + 1). Levels added after the statement began
/// do not add up to their row's stock and the statement runs again
/// (`retry_stale_read`).
///
/// One row per component, by inventory id: the inventory as locked,
/// whether its locations could give it (`feasible`), what they offer
/// (`eligible`, as [`held`] says), and the reservation written (`r_*`,
/// NULL when nothing was).
///
/// Public for the benchmark's KIT cells (examples/bench), which run it
/// prepared on connections of their own as the cells' one-statement limit.
pub fn reserve_kit(request: KitReserve<'_>) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH {line}, locked AS MATERIALIZED (
    {locked}
), lvl AS MATERIALIZED (
    {levels}
), {fresh}, plan AS (
    SELECT line.*, a.locations, a.takes, a.eligible
      FROM line, LATERAL (
           SELECT array_agg(location_id ORDER BY {preference}) AS locations,
                  allocate(array_agg({offered} ORDER BY {preference}), line.quantity, line.fewest, line.split)
                      AS takes,
                  {held} AS eligible
             FROM lvl v WHERE v.inventory_id = line.inventory_id AND {eligible}) a
), go AS (
    SELECT (SELECT ok FROM fresh) IS NOT FALSE AND bool_and(takes IS NOT NULL)
           AND count(*) = (SELECT count(*) FROM locked)
           AND EXISTS (SELECT 1 FROM kits WHERE id = $10 AND active) AS ok
      FROM plan
), pick AS (
    SELECT plan.inventory_id, p.location_id, p.take
      FROM plan, unnest(plan.locations, plan.takes) AS p(location_id, take)
     WHERE p.take > 0
), taken AS (
    UPDATE inventories i
       {set}
      FROM plan p JOIN locked k ON k.id = p.inventory_id
     WHERE i.id = p.inventory_id AND (SELECT ok FROM go)
 RETURNING i.id, i.stock, i.version, p.quantity, p.n, p.ids, p.fewest, p.split
), drawn AS (
    UPDATE stock_levels l SET available = v.available - p.take
      FROM pick p JOIN lvl v ON v.inventory_id = p.inventory_id AND v.location_id = p.location_id
      JOIN taken t ON t.id = p.inventory_id
     WHERE l.inventory_id = p.inventory_id AND l.location_id = p.location_id
), kit AS (
    INSERT INTO kit_reservations (id, kit_id, user_id, quantity)
    SELECT $9, $10, $11, $12 WHERE (SELECT ok FROM go)
), reservation AS (
    INSERT INTO reservations (id, inventory_id, user_id, quantity, status, idempotency_key, request_fingerprint,
                              expires_at, kit_reservation_id, {CHOICE_COLUMNS})
    SELECT gen_random_uuid(), id, $11, quantity, {active}, CASE WHEN n = 1 THEN $13 END,
           CASE WHEN n = 1 THEN $14 END, {expires}, $9, {choice}
      FROM taken
 RETURNING *
), allocation AS (
    INSERT INTO allocations (reservation_id, location_id, quantity)
    SELECT r.id, p.location_id, p.take FROM pick p JOIN reservation r ON r.inventory_id = p.inventory_id
), movement AS (
    {LEDGER_OF_KITS}
    SELECT t.id, -p.take, {reserved}, t.stock, t.version, r.id, NULL, p.location_id, $9
      FROM taken t JOIN reservation r ON r.inventory_id = t.id JOIN pick p ON p.inventory_id = t.id
)
SELECT {columns}, p.takes IS NOT NULL AS feasible, p.eligible, {reservation}
  FROM plan p JOIN locked k ON k.id = p.inventory_id LEFT JOIN reservation r ON r.inventory_id = p.inventory_id
 ORDER BY k.id"#,
            line = line_cte(),
            locked = lock_inventories(&inventory_columns(""), Ids::Array("$1"), None),
            levels = lock_levels(Ids::Array("ARRAY(SELECT id FROM locked)")),
            fresh = FRESH,
            preference = preference("line.ids"),
            eligible = eligible("line.ids"),
            offered = offered("", None),
            held = held("line.split", &offered("", None)),
            set = set("k.stock - p.quantity", "k.version + 1"),
            active = sql(ReservationStatus::Active),
            reserved = sql(MovementReason::Reserved),
            expires = expiry("$15"),
            choice = choice("ids", "fewest", "split"),
            columns = inventory_columns("k."),
            reservation = reservation_columns_as_r(),
        )
    });
    let mut values = line_values(request.lines);
    values.extend([
        request.kit_reservation_id.into(),
        request.kit_id.into(),
        request.user_id.into(),
        request.quantity.into(),
        request.key.map(|(key, _)| key.to_owned()).into(),
        request.key.map(|(_, fingerprint)| fingerprint.to_owned()).into(),
        request.ttl_secs.into(),
    ]);
    Statement::from_sql_and_values(DbBackend::Postgres, SQL.as_str(), values)
}

/// The kit reservation `$1` of the owner `$2`, locked: the first step of
/// every statement that changes its components' status, so they take turns.
fn lock_kit() -> &'static str {
    "SELECT id FROM kit_reservations WHERE id = $1 AND user_id = $2 FOR UPDATE"
}

/// Gives back every component of an ACTIVE, unexpired kit reservation of
/// `owner`'s at once, each unit to the location that gave it, each
/// component one change of its inventory (ledger reason RELEASED, with the
/// kit reservation's id). One row, how many components it released (0:
/// not there, not the owner's, or not ACTIVE any more).
pub(crate) fn release_kit(kit_reservation_id: Uuid, owner: &str) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH kit AS MATERIALIZED (
    {lock_kit}
), released AS (
    UPDATE reservations SET status = {released}
     WHERE kit_reservation_id = (SELECT id FROM kit) AND {active_unexpired}
 RETURNING id, inventory_id, quantity, kit_reservation_id
), locked AS MATERIALIZED (
    {locked}
), {returned}
SELECT count(*) FROM released"#,
            lock_kit = lock_kit(),
            released = sql(ReservationStatus::Released),
            active_unexpired = active_unexpired(),
            locked = lock_inventories("id", Ids::Query("SELECT inventory_id FROM released"), None),
            returned = per_line("released", Lines::Return, MovementReason::Released, "NULL", true),
        )
    });
    Statement::from_sql_and_values(DbBackend::Postgres, SQL.as_str(), [kit_reservation_id.into(), owner.into()])
}

/// Moves the expiry of every component of an ACTIVE, unexpired kit
/// reservation of `owner`'s `seconds` later, never past `max_ttl_secs`
/// from now, at once: the components as saved (none when nothing matched).
pub(crate) fn extend_kit(kit_reservation_id: Uuid, owner: &str, seconds: i32, max_ttl_secs: i32) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH kit AS MATERIALIZED (
    {lock_kit}
)
UPDATE reservations
   SET expires_at = CASE WHEN expires_at IS NOT NULL
       THEN least(expires_at + $3::integer * interval '1 second', now() + $4::integer * interval '1 second') END
 WHERE kit_reservation_id = (SELECT id FROM kit) AND {active_unexpired}
RETURNING *"#,
            lock_kit = lock_kit(),
            active_unexpired = active_unexpired(),
        )
    });
    let values: [Value; 4] = [kit_reservation_id.into(), owner.into(), seconds.into(), max_ttl_secs.into()];
    Statement::from_sql_and_values(DbBackend::Postgres, SQL.as_str(), values)
}
