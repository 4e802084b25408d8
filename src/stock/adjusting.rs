//! Adjusting a hold: a cart line's quantity changes in place.

use std::sync::LazyLock;

use sea_orm::{DbBackend, Statement};
use uuid::Uuid;

use super::{
    allocating::{eligible, offered, preference},
    fragments::{
        Ids, LEDGER, active_unexpired, inventory_columns, lock_inventories, lock_levels, reservation_columns_as_r, set,
    },
    rows::{MovementReason, sql},
};

/// Changes an ACTIVE, unexpired reservation of `owner`'s to `quantity`
/// units in one statement: more takes the difference by the reservation's
/// own choice of locations (`allocate` over what its eligible levels offer
/// a customer, [`offered`]: never their safety stock, whoever the owner;
/// without a split only from the location that holds it), fewer gives the difference
/// back to the locations that gave it, the least preferred first, so no
/// location ends up holding more of it than it gave. One change of the
/// inventory (version + 1) with one QUANTITY_CHANGED ledger row per
/// location touched, whose delta is the change of available stock there.
/// One row (read with `ReservationChange::from_row`) when it changed.
///
/// Locks, in the order every stock statement keeps: the reservation
/// (`line`), its allocations (`held`), the inventory (`inv`), its levels
/// (`lvl`). So two changes of one line apply one after the other, each to
/// the quantity the other left; the sweeper skips a locked line, and a line
/// it holds (or released, checked out or expired) no longer matches.
/// Allocations or levels added after the statement began do not add up to
/// their line's quantity or their inventory's stock; the statement is then
/// run again (`retry_stale_read`). Which allocations shrink or go is
/// decided on `held`'s values (the rows as locked, as they are now), never
/// on a condition of the UPDATE's own: at READ COMMITTED that is tested
/// first against the row as the statement's snapshot saw it, and a row
/// changed since would be skipped, not re-read. Levels are set from the
/// values `lvl` locked for the same reason: a new value computed from the
/// snapshot's row is checked against `available >= 0` before the row is
/// re-read; the inventory row's from the values `inv` locked, for the same
/// reason (`stock >= 0`). 0 rows: not there, not the caller's, not
/// ACTIVE, expired, already at `quantity`, or the locations cannot give
/// the difference; one read afterwards tells which.
pub(crate) fn change_quantity(reservation_id: Uuid, owner: &str, quantity: i32) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH line AS MATERIALIZED (
    SELECT id, inventory_id, quantity, location_ids, coalesce(fewest_locations, false) AS fewest,
           coalesce(allow_split, true) AS split
      FROM reservations
     WHERE id = $1 AND user_id = $2 AND {active_unexpired} AND quantity <> $3::integer AND kit_reservation_id IS NULL
       FOR UPDATE
), held AS MATERIALIZED (
    SELECT location_id, quantity FROM allocations WHERE reservation_id = (SELECT id FROM line) FOR UPDATE
), held_fresh AS (
    SELECT CASE WHEN coalesce(sum(quantity), 0) = coalesce((SELECT quantity FROM line), 0) THEN true
                ELSE retry_stale_read() END AS ok
      FROM held
), inv AS MATERIALIZED (
    {inv}
), lvl AS MATERIALIZED (
    {lvl}
), level AS (
    SELECT v.*, coalesce(h.quantity, 0) AS held FROM lvl v LEFT JOIN held h ON h.location_id = v.location_id
), plan AS (
    SELECT CASE WHEN $3::integer > l.quantity THEN
               allocate(array_agg({offered} ORDER BY {preference})
                            FILTER (WHERE {eligible} AND (l.split OR v.held > 0)),
                        $3::integer - l.quantity, l.fewest, l.split)
           END AS takes,
           array_agg(v.location_id ORDER BY {preference}) FILTER (WHERE {eligible} AND (l.split OR v.held > 0))
               AS locations,
           CASE WHEN coalesce(sum(v.available), 0) = (SELECT stock FROM inv) THEN true
                ELSE retry_stale_read() END AS fresh
      FROM line l JOIN level v ON true
     GROUP BY l.id, l.quantity, l.fewest, l.split, l.location_ids
), give AS (
    SELECT v.location_id,
           least(v.held, greatest(0, l.quantity - $3::integer - coalesce(sum(v.held) OVER (
               ORDER BY array_position(l.location_ids, v.location_id) DESC NULLS LAST, v.priority DESC, v.code DESC
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)))::integer AS give
      FROM line l JOIN level v ON v.held > 0
     WHERE $3::integer < l.quantity
), delta AS (
    SELECT p.location_id, -p.take AS change
      FROM plan, unnest(plan.locations, plan.takes) AS p(location_id, take)
     WHERE p.take > 0
    UNION ALL
    SELECT location_id, give FROM give WHERE give > 0
), changed AS (
    UPDATE inventories i
       {set}
      FROM line l, inv
     WHERE i.id = inv.id AND (SELECT fresh FROM plan)
       AND ($3::integer < l.quantity OR (SELECT takes IS NOT NULL FROM plan))
 RETURNING {columns}, l.quantity AS held
), levels AS (
    UPDATE stock_levels v SET available = lv.available + d.change
      FROM delta d JOIN lvl lv ON lv.location_id = d.location_id, changed c
     WHERE v.inventory_id = c.id AND v.location_id = d.location_id
), grown AS (
    INSERT INTO allocations AS a (reservation_id, location_id, quantity)
    SELECT $1, d.location_id, -d.change FROM delta d, changed c WHERE d.change < 0
        ON CONFLICT (reservation_id, location_id) DO UPDATE SET quantity = a.quantity + excluded.quantity
), shrunk AS (
    UPDATE allocations a SET quantity = h.quantity - d.change
      FROM delta d JOIN held h ON h.location_id = d.location_id, changed c
     WHERE a.reservation_id = $1 AND a.location_id = d.location_id AND d.change > 0 AND h.quantity > d.change
), emptied AS (
    DELETE FROM allocations a
     USING delta d JOIN held h ON h.location_id = d.location_id, changed c
     WHERE a.reservation_id = $1 AND a.location_id = d.location_id AND d.change > 0 AND h.quantity = d.change
), resized AS (
    UPDATE reservations r SET quantity = $3::integer
      FROM changed c
     WHERE r.id = $1
 RETURNING r.*
), movement AS (
    {LEDGER}
    SELECT c.id, d.change, {reason}, c.stock, c.version, $1, NULL, d.location_id FROM changed c, delta d
)
SELECT changed.*, {reservation} FROM changed, resized r"#,
            active_unexpired = active_unexpired(),
            inv = lock_inventories(
                "id, stock, version",
                Ids::One("(SELECT inventory_id FROM line)"),
                Some("(SELECT ok FROM held_fresh)")
            ),
            lvl = lock_levels(Ids::One("(SELECT id FROM inv)")),
            preference = preference("l.location_ids"),
            eligible = eligible("l.location_ids"),
            offered = offered("v.", None),
            reason = sql(MovementReason::QuantityChanged),
            set = set("inv.stock - ($3::integer - l.quantity)", "inv.version + 1"),
            columns = inventory_columns("i."),
            reservation = reservation_columns_as_r(),
        )
    });
    Statement::from_sql_and_values(
        DbBackend::Postgres,
        SQL.as_str(),
        [reservation_id.into(), owner.into(), quantity.into()],
    )
}
