//! The invariant per location and per order line (src/invariant/): a
//! database written the way the stock statements write it, over two
//! locations and with a return, passes; each condition, broken by one
//! direct write, is reported with its numbers. The check answers on a month
//! of history, past the server's statement timeout, and holds the ledger
//! only as much as it must while it reads.

use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait, TransactionTrait};
use stockguard::{
    invariant::{self, CheckError, Checked, Drift, Found, InventoryDrift, LevelDrift, Progress, Step},
    stock,
};
use uuid::Uuid;

use crate::helpers::TestApp;

/// The inventory split over `default` and `east`.
pub const SPLIT: Uuid = Uuid::from_u128(0xa);
/// The inventory that never left `default`.
pub const HOME: Uuid = Uuid::from_u128(0xb);
/// The second location.
pub const EAST: Uuid = Uuid::from_u128(0xe);
/// SPLIT's ACTIVE reservation of 6: 4 from default, 2 from east.
pub const ACTIVE: Uuid = Uuid::from_u128(0x1);
/// SPLIT's ORDERED line of 2, from east.
pub const ORDERED: Uuid = Uuid::from_u128(0x2);
/// SPLIT's FULFILLED line of 1, shipped from default.
pub const FULFILLED: Uuid = Uuid::from_u128(0x3);
/// SPLIT's RELEASED reservation of 1, taken from east and given back.
pub const RELEASED: Uuid = Uuid::from_u128(0x4);

/// Writes, as the stock statements do, two inventories and their history:
/// reservations made at `at` (an SQL timestamp), ledger rows in the ten
/// hours before it, an hour apart. SPLIT created with 10 (a ledger row of
/// before locations, no location), restocked 5 at east, 2 moved from
/// default to east, then a reservation split over both, an order line, a
/// shipped line, and a reservation released. The rows of one change share
/// their version and their time. Ends: default 3 available + 4 reserved,
/// east 3 + 2 reserved + 2 committed; SPLIT stock 6 at version 9; HOME 4 at
/// default, its sole location.
pub async fn two_locations(app: &TestApp, at: &str) {
    let sql = format!(
        r#"
INSERT INTO locations (id, code, name, priority) VALUES ('{EAST}', 'east', 'East', 10);
INSERT INTO inventories (id, sku, name, stock, version, sole_location_id) VALUES
    ('{SPLIT}', 'SPLIT', 'Split', 6, 9, NULL),
    ('{HOME}', 'HOME', 'Home', 4, 1, (SELECT id FROM locations WHERE code = 'default'));
INSERT INTO stock_levels (inventory_id, location_id, available)
SELECT '{SPLIT}'::uuid, id, 3 FROM locations WHERE code = 'default'
UNION ALL SELECT '{SPLIT}', '{EAST}', 3
UNION ALL SELECT '{HOME}', id, 4 FROM locations WHERE code = 'default';
INSERT INTO orders (id, user_id, status, ship_name, ship_line1, ship_city, ship_postal_code, ship_country,
                    confirmed_at, confirmed_by, fulfilled_at, fulfilled_by) VALUES
    ('{ORDERED}', 'u', 'PENDING', 'N', 'L', 'C', 'P', 'DE', NULL, NULL, NULL, NULL),
    ('{FULFILLED}', 'u', 'FULFILLED', 'N', 'L', 'C', 'P', 'DE', now(), 'op', now(), 'op');
INSERT INTO reservations (id, inventory_id, order_id, user_id, quantity, status, created_at) VALUES
    ('{ACTIVE}', '{SPLIT}', NULL, 'u', 6, 'ACTIVE', {at}),
    ('{ORDERED}', '{SPLIT}', '{ORDERED}', 'u', 2, 'ORDERED', {at}),
    ('{FULFILLED}', '{SPLIT}', '{FULFILLED}', 'u', 1, 'FULFILLED', {at}),
    ('{RELEASED}', '{SPLIT}', NULL, 'u', 1, 'RELEASED', {at});
INSERT INTO allocations (reservation_id, location_id, quantity)
SELECT '{ACTIVE}'::uuid, id, 4 FROM locations WHERE code = 'default'
UNION ALL SELECT '{ACTIVE}', '{EAST}', 2
UNION ALL SELECT '{ORDERED}', '{EAST}', 2
UNION ALL SELECT '{FULFILLED}', id, 1 FROM locations WHERE code = 'default'
UNION ALL SELECT '{RELEASED}', '{EAST}', 1;
INSERT INTO stock_movements (inventory_id, location_id, delta, reason, stock_after, version_after,
                             reservation_id, order_id, created_at)
SELECT m.inventory_id::uuid, CASE m.place WHEN 'east' THEN '{EAST}'::uuid WHEN 'default' THEN d.id END,
       m.delta, m.reason, m.stock_after, m.version, m.reservation::uuid, m.order_id::uuid,
       {at} - (10 - m.version) * interval '1 hour'
  FROM (VALUES
    ('{SPLIT}', NULL, 10, 'CREATED', 10, 1, NULL, NULL),
    ('{SPLIT}', 'east', 5, 'RESTOCKED', 15, 2, NULL, NULL),
    ('{SPLIT}', 'default', -2, 'TRANSFERRED_OUT', 15, 3, NULL, NULL),
    ('{SPLIT}', 'east', 2, 'TRANSFERRED_IN', 15, 3, NULL, NULL),
    ('{SPLIT}', 'default', -4, 'RESERVED', 9, 4, '{ACTIVE}', NULL),
    ('{SPLIT}', 'east', -2, 'RESERVED', 9, 4, '{ACTIVE}', NULL),
    ('{SPLIT}', 'east', -2, 'ORDERED', 7, 5, '{ORDERED}', '{ORDERED}'),
    ('{SPLIT}', 'default', -1, 'ORDERED', 6, 6, '{FULFILLED}', '{FULFILLED}'),
    ('{SPLIT}', 'default', -1, 'FULFILLED', 6, 7, '{FULFILLED}', '{FULFILLED}'),
    ('{SPLIT}', 'east', -1, 'RESERVED', 5, 8, '{RELEASED}', NULL),
    ('{SPLIT}', 'east', 1, 'RELEASED', 6, 9, '{RELEASED}', NULL),
    ('{HOME}', 'default', 4, 'CREATED', 4, 1, NULL, NULL)
  ) AS m (inventory_id, place, delta, reason, stock_after, version, reservation, order_id),
       (SELECT id FROM locations WHERE code = 'default') AS d;
"#
    );
    app.db.execute_unprepared(&sql).await.expect("two locations' history");
}

/// The drifts after `tamper`, on a fresh copy of [`two_locations`].
async fn drifts_after(tamper: &str) -> Vec<Drift> {
    let app = TestApp::spawn().await;
    two_locations(&app, "now()").await;
    assert_eq!(invariant::check(&app.db).await.expect("check"), vec![], "sound before {tamper}");
    app.db.execute_unprepared(tamper).await.expect(tamper);
    invariant::check(&app.db).await.expect("check")
}

fn inventories(drifts: &[Drift]) -> Vec<&InventoryDrift> {
    drifts.iter().filter_map(|d| if let Drift::Inventory(d) = d { Some(d) } else { None }).collect()
}

fn levels(drifts: &[Drift]) -> Vec<&LevelDrift> {
    drifts.iter().filter_map(|d| if let Drift::Level(d) = d { Some(d) } else { None }).collect()
}

/// A drifting level as `(code, available, reserved, committed, on_hand, ledger_stock)`.
type LevelNumbers = (Option<String>, Option<i64>, i64, i64, i64, i64);

/// The numbers of each drifting level.
fn level_numbers(drifts: &[Drift]) -> Vec<LevelNumbers> {
    let numbers = |d: &&LevelDrift| (d.code.clone(), d.available, d.reserved, d.committed, d.on_hand, d.ledger_stock);
    levels(drifts).iter().map(numbers).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fresh_database_and_two_locations_written_as_the_statements_write_them_pass() {
    let app = TestApp::spawn().await;
    assert_eq!(invariant::check(&app.db).await.expect("check"), vec![]);
    two_locations(&app, "now()").await;
    assert_eq!(invariant::check(&app.db).await.expect("check"), vec![], "one change, one version, two rows");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_allocation_at_the_wrong_location_breaks_on_hand_at_both() {
    let drifts =
        drifts_after(&format!("UPDATE allocations SET location_id = (SELECT id FROM locations WHERE code = 'default') WHERE reservation_id = '{ORDERED}'")).await;
    let default = Some("default".to_owned());
    let east = Some("east".to_owned());
    assert_eq!(level_numbers(&drifts), vec![(default, Some(3), 4, 2, 7, 3), (east, Some(3), 2, 0, 7, 3)]);
    assert!(inventories(&drifts).is_empty(), "the inventory's own sums still hold: {drifts:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_ledger_row_at_the_wrong_location_breaks_both_levels_available() {
    // RESERVED moves available units only: on hand still adds up.
    let drifts = drifts_after(&format!(
        "UPDATE stock_movements SET location_id = NULL WHERE reservation_id = '{ACTIVE}' AND location_id = '{EAST}'"
    ))
    .await;
    let default = Some("default".to_owned());
    let east = Some("east".to_owned());
    assert_eq!(level_numbers(&drifts), vec![(default, Some(3), 4, 0, 7, 1), (east, Some(3), 2, 2, 7, 5)]);
    assert!(inventories(&drifts).is_empty(), "{drifts:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn levels_that_do_not_add_up_to_the_stock_are_reported() {
    let drifts = drifts_after(&format!("UPDATE stock_levels SET available = 4 WHERE location_id = '{EAST}'")).await;
    let inventory = inventories(&drifts);
    assert_eq!(inventory.len(), 1, "{drifts:?}");
    assert_eq!((inventory[0].sku.as_str(), inventory[0].stock, inventory[0].levels_available), ("SPLIT", 6, 7));
    assert_eq!(level_numbers(&drifts), vec![(Some("east".to_owned()), Some(4), 2, 2, 7, 3)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_negative_level_is_reported() {
    // The table refuses one; the check does not rely on it.
    let drifts = drifts_after(&format!(
        "ALTER TABLE stock_levels DROP CONSTRAINT stock_levels_available_check; \
         UPDATE stock_levels SET available = -1 WHERE inventory_id = '{SPLIT}' AND location_id = '{EAST}'; \
         UPDATE stock_levels SET available = 7 WHERE inventory_id = '{SPLIT}' AND location_id <> '{EAST}'"
    ))
    .await;
    let negative = levels(&drifts).into_iter().find(|d| d.available == Some(-1));
    assert!(negative.is_some_and(|d| d.location_id == EAST), "{drifts:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_location_the_ledger_names_without_a_level_is_reported() {
    let drifts = drifts_after(&format!(
        "DELETE FROM stock_levels WHERE inventory_id = '{SPLIT}' AND location_id = '{EAST}'; \
         UPDATE stock_levels SET available = 6 WHERE inventory_id = '{SPLIT}'"
    ))
    .await;
    let default = Some("default".to_owned());
    let east = Some("east".to_owned());
    assert_eq!(level_numbers(&drifts), vec![(default, Some(6), 4, 0, 7, 3), (east, None, 2, 2, 7, 3)]);
    assert!(inventories(&drifts).is_empty(), "the levels still add up to the stock: {drifts:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_line_whose_allocations_do_not_add_up_to_its_quantity_is_reported() {
    // A shipped line's allocations count nowhere else: only this condition sees them.
    let drifts = drifts_after(&format!("DELETE FROM allocations WHERE reservation_id = '{FULFILLED}'")).await;
    let inventory = inventories(&drifts);
    assert_eq!(inventory.iter().map(|d| (d.sku.as_str(), d.misallocated)).collect::<Vec<_>>(), vec![("SPLIT", 1)]);
    assert!(levels(&drifts).is_empty(), "{drifts:?}");

    // Too many units at one location of an active reservation: its level and the line.
    let drifts = drifts_after(&format!(
        "UPDATE allocations SET quantity = 3 WHERE reservation_id = '{ACTIVE}' AND location_id = '{EAST}'"
    ))
    .await;
    assert_eq!(inventories(&drifts).iter().map(|d| d.misallocated).collect::<Vec<_>>(), vec![1]);
    assert_eq!(level_numbers(&drifts), vec![(Some("east".to_owned()), Some(3), 3, 2, 7, 3)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_version_without_its_change_is_reported_and_a_change_of_two_rows_counts_once() {
    // A second row at version 3 is still one change; a row at version 10 is one more.
    // The second row is written as its change's rows are, at their instant
    // (one statement, one partition): the fixture's version 3 is 7 hours
    // old, on the previous day's partition between midnight and 7 UTC.
    let same = drifts_after(&format!(
        "INSERT INTO stock_movements (inventory_id, location_id, delta, reason, stock_after, version_after, created_at) \
         SELECT '{SPLIT}', NULL, 0, 'QUANTITY_CHANGED', 6, 3, created_at FROM stock_movements \
          WHERE inventory_id = '{SPLIT}' AND version_after = 3 LIMIT 1"
    ))
    .await;
    assert_eq!(same, vec![]);
    let more = drifts_after(&format!(
        "INSERT INTO stock_movements (inventory_id, location_id, delta, reason, stock_after, version_after) \
         VALUES ('{SPLIT}', '{EAST}', 0, 'QUANTITY_CHANGED', 6, 10)"
    ))
    .await;
    assert_eq!(inventories(&more).iter().map(|d| (d.version, d.changes)).collect::<Vec<_>>(), vec![(9, 10)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sole_location_that_is_not_the_only_level_is_reported() {
    let drifts = drifts_after(&format!(
        "UPDATE inventories SET sole_location_id = '{EAST}' WHERE id = '{SPLIT}'; \
         UPDATE inventories SET sole_location_id = '{EAST}' WHERE id = '{HOME}'"
    ))
    .await;
    let skus: Vec<_> = inventories(&drifts).iter().map(|d| (d.sku.clone(), d.sole_location_id)).collect();
    assert_eq!(skus, vec![("HOME".to_owned(), Some(EAST)), ("SPLIT".to_owned(), Some(EAST))]);
    assert!(levels(&drifts).is_empty(), "{drifts:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn archived_rows_count_at_their_location_through_the_level_checkpoints() {
    // A level checkpoint off by one unit on hand is drift at that level only.
    let drifts = drifts_after(&format!(
        "INSERT INTO ledger_checkpoint_levels (inventory_id, location_id, stock, on_hand) VALUES ('{SPLIT}', '{EAST}', 0, 1)"
    ))
    .await;
    assert_eq!(level_numbers(&drifts), vec![(Some("east".to_owned()), Some(3), 2, 2, 8, 3)]);
    assert!(inventories(&drifts).is_empty(), "{drifts:?}");
}

/// SPLIT's FULFILLED line returned whole, as `returnOrder` writes it: its
/// unit restocked at default (version 10, a `RETURNED` row there), the
/// line's counter at 1, one return and its line.
const RETURNED_ONCE: &str = "
INSERT INTO returns (id, order_id, number, created_by) VALUES ('00000000-0000-0000-0000-000000000099', '00000000-0000-0000-0000-000000000003', 1, 'op');
INSERT INTO return_lines (return_id, reservation_id, inventory_id, location_id, disposition, quantity)
SELECT '00000000-0000-0000-0000-000000000099', '00000000-0000-0000-0000-000000000003',
       '00000000-0000-0000-0000-00000000000a', id, 'RESTOCK', 1 FROM locations WHERE code = 'default';
UPDATE reservations SET returned = 1 WHERE id = '00000000-0000-0000-0000-000000000003';
UPDATE inventories SET stock = 7, version = 10 WHERE id = '00000000-0000-0000-0000-00000000000a';
UPDATE stock_levels SET available = available + 1
 WHERE inventory_id = '00000000-0000-0000-0000-00000000000a' AND location_id = (SELECT id FROM locations WHERE code = 'default');
INSERT INTO stock_movements (inventory_id, location_id, delta, reason, stock_after, version_after, reservation_id, order_id, actor)
SELECT '00000000-0000-0000-0000-00000000000a', id, 1, 'RETURNED', 7, 10, '00000000-0000-0000-0000-000000000003',
       '00000000-0000-0000-0000-000000000003', 'op' FROM locations WHERE code = 'default';";

#[tokio::test(flavor = "multi_thread")]
async fn a_returned_line_counts_as_received_and_a_line_whose_returns_do_not_add_up_is_reported() {
    let app = TestApp::spawn().await;
    two_locations(&app, "now()").await;
    app.db.execute_unprepared(RETURNED_ONCE).await.expect("a return");
    assert_eq!(invariant::check(&app.db).await.expect("check"), vec![], "a RETURNED unit is received and on hand");

    let tamper = format!("UPDATE reservations SET returned = 0 WHERE id = '{FULFILLED}'");
    app.db.execute_unprepared(&tamper).await.expect("tamper");
    let lines: Vec<(Uuid, i64, i64, i64, String)> = invariant::check(&app.db)
        .await
        .expect("check")
        .into_iter()
        .filter_map(|d| if let Drift::Line(d) = d { Some(d) } else { None })
        .map(|d| (d.reservation_id, d.quantity, d.returned, d.return_lines, d.status))
        .collect();
    assert_eq!(lines, vec![(FULFILLED, 1, 0, 1, "FULFILLED".to_owned())], "returned apart from its return lines");

    let not_shipped = format!("UPDATE reservations SET returned = 1 WHERE id = '{ORDERED}'");
    app.db.execute_unprepared(&not_shipped).await.expect("tamper");
    let drifts = invariant::check(&app.db).await.expect("check");
    let ordered = drifts
        .iter()
        .find_map(|d| if let Drift::Line(d) = d { (d.reservation_id == ORDERED).then_some(d) } else { None });
    assert_eq!(ordered.map(|d| (d.status.as_str(), d.returned)), Some(("ORDERED", 1)), "{drifts:?}");
    let shown = drifts.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n");
    assert!(
        shown.contains(&format!("line {ORDERED} of order Some({ORDERED}), ORDERED: returned 1 of 2 shipped")),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn stockguard_check_prints_a_drifting_level_with_its_location() {
    let app = TestApp::spawn().await;
    two_locations(&app, "now()").await;
    let check = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_stockguard"))
            .args(["check", "--database-url", &app.database_url])
            .env_remove("DATABASE_URL")
            .output()
            .expect("run")
    };
    let sound = check();
    let said = String::from_utf8_lossy(&sound.stdout);
    assert!(sound.status.success() && said.contains("every inventory and every location"), "{said}");

    let tamper = format!("UPDATE allocations SET quantity = 1 WHERE reservation_id = '{ORDERED}'");
    app.db.execute_unprepared(&tamper).await.expect("tamper");
    let drifted = check();
    let said = String::from_utf8_lossy(&drifted.stdout);
    assert_eq!(drifted.status.code(), Some(1), "{said}");
    let lines: Vec<_> = said.lines().filter(|line| line.starts_with("DRIFT")).collect();
    assert_eq!(lines.len(), 2, "the line and its level: {said}");
    assert!(lines[0].starts_with(&format!("DRIFT SPLIT ({SPLIT}): ")), "{said}");
    assert!(lines[0].ends_with("lines whose allocations do not add up to their quantity: 1"), "{said}");
    assert_eq!(
        lines[1],
        format!(
            "DRIFT SPLIT ({SPLIT}) at east ({EAST}): on hand 7 vs available 3 + reserved 2 + committed 1; \
             ledger sums to 3 available"
        )
    );
}

/// Writes a month of history as the server writes it, in a few statements:
/// `inventories` inventories (SKUs `HIST-000001` on), each made 30 days ago
/// with 1,000,000 units at the default location, then `per_day`
/// reservations of one unit a day, an hour apart, each taken and then
/// released (every tenth one shipped instead, as a line of the
/// inventory's one order), and a last one still held. Each reservation's
/// ledger rows land in its day's partition. Each inventory ends at version
/// `2 * 30 * per_day + 2`, with as many ledger rows, and every sum holds.
async fn month_of_history(app: &TestApp, inventories: u32, per_day: u32) {
    const DAYS: u32 = 30;
    let lines = DAYS * per_day;
    stock::partitions::make(&app.db, (DAYS + 1) as i32, 0).await.expect("the days of the month");
    let inventory = |i: &str| format!("('00000000-0000-4000-8000-' || lpad(to_hex({i}), 12, '0'))::uuid");
    let order = |i: &str| format!("('00000000-0000-4000-9000-' || lpad(to_hex({i}), 12, '0'))::uuid");
    let reservation = "('00000000-' || lpad(to_hex(j), 4, '0') || '-4000-a000-' || lpad(to_hex(i), 12, '0'))::uuid";
    let at = format!(
        "g.t0 + ((j - 1) / {per_day}) * interval '1 day' + ((j - 1) % {per_day}) * interval '1 hour' + i * interval '1 ms'"
    );
    let (inv_i, order_i) = (inventory("i"), order("i"));
    let sql = format!(
        r#"
CREATE TEMP TABLE g ON COMMIT DROP AS
SELECT (SELECT id FROM locations WHERE code = 'default') AS loc,
       date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - {DAYS} * interval '1 day' AS t0;
INSERT INTO inventories (id, sku, name, stock, version, sole_location_id, created_at)
SELECT {inv_i}, 'HIST-' || lpad(i::text, 6, '0'), 'History', 1000000 - {lines} / 10 - 1, 2 * {lines} + 2, g.loc, g.t0
  FROM generate_series(1, {inventories}) i, g;
INSERT INTO stock_levels (inventory_id, location_id, available)
SELECT id, sole_location_id, stock FROM inventories;
INSERT INTO orders (id, user_id, status, ship_name, ship_line1, ship_city, ship_postal_code, ship_country,
                    confirmed_at, confirmed_by, fulfilled_at, fulfilled_by)
SELECT {order_i}, 'u' || i, 'FULFILLED', 'N', 'L', 'C', 'P', 'DE', now(), 'op', now(), 'op'
  FROM generate_series(1, {inventories}) i;
INSERT INTO reservations (id, inventory_id, order_id, user_id, quantity, status, created_at)
SELECT {reservation}, {inv_i}, CASE WHEN j % 10 = 0 AND j <= {lines} THEN {order_i} END, 'u' || i, 1,
       CASE WHEN j > {lines} THEN 'ACTIVE' WHEN j % 10 = 0 THEN 'FULFILLED' ELSE 'RELEASED' END, {at}
  FROM generate_series(1, {lines} + 1) j, generate_series(1, {inventories}) i, g;
INSERT INTO allocations (reservation_id, location_id, quantity)
SELECT r.id, g.loc, 1 FROM reservations r, g;
INSERT INTO stock_movements (inventory_id, location_id, delta, reason, stock_after, version_after,
                             reservation_id, order_id, created_at)
SELECT {inv_i}, g.loc, 1000000, 'CREATED', 1000000, 1, NULL, NULL, g.t0
  FROM generate_series(1, {inventories}) i, g
UNION ALL
SELECT {inv_i}, g.loc, CASE WHEN s = 0 OR j % 10 = 0 THEN -1 ELSE 1 END,
       CASE WHEN s = 0 THEN 'RESERVED' WHEN j % 10 = 0 THEN 'FULFILLED' ELSE 'RELEASED' END,
       1000000 - j, 2 * j + s, {reservation}, CASE WHEN s = 1 AND j % 10 = 0 THEN {order_i} END,
       {at} + s * interval '1 minute'
  FROM generate_series(1, {lines} + 1) j, generate_series(0, 1) s, generate_series(1, {inventories}) i, g
 WHERE j <= {lines} OR s = 0;
"#
    );
    let txn = app.db.begin().await.expect("begin");
    txn.execute_unprepared("SET LOCAL statement_timeout = 0").await.expect("no timeout for the writing");
    txn.execute_unprepared(&sql).await.expect("a month of history");
    txn.commit().await.expect("commit");
}

/// The operator's check on a history that one statement cannot read within
/// the server's statement timeout: it keeps its own time limit, reads the
/// history a part at a time, and still finds a drift planted in the middle.
#[tokio::test(flavor = "multi_thread")]
async fn stockguard_check_finishes_on_a_history_far_past_the_servers_statement_timeout() {
    let app = TestApp::spawn().await;
    month_of_history(&app, 1000, 8).await;
    assert_eq!(app.count("SELECT count(*) FROM stock_movements").await, 482_000);
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 241_000);

    // What one statement over the history takes, at least: the ledger's
    // sums per inventory and per level, and the lines' per inventory.
    let one_statement = "SELECT (SELECT count(*) FROM (SELECT inventory_id, count(DISTINCT version_after), sum(delta) \
                                                     FROM stock_movements GROUP BY 1) l) \
                              + (SELECT count(*) FROM (SELECT inventory_id, location_id, sum(delta) \
                                                         FROM stock_movements GROUP BY 1, 2) v) \
                              + (SELECT count(*) FROM (SELECT inventory_id, sum(quantity) FROM reservations \
                                                        WHERE status IN ('ACTIVE', 'ORDERED', 'FULFILLED') GROUP BY 1) r)";
    let mut fastest = Duration::MAX;
    for _ in 0..2 {
        let started = Instant::now();
        assert_eq!(app.count(one_statement).await, 3000);
        fastest = fastest.min(started.elapsed());
    }
    // A server timeout a third of that, so no single statement over the
    // whole history fits in it; at least 50 ms, so opening the database fits.
    let timeout = (fastest / 3).clamp(Duration::from_millis(50), Duration::from_millis(250));
    assert!(
        fastest >= timeout * 3,
        "the history is too small to prove anything on this machine: one statement over it takes {fastest:?}"
    );
    let timeout_ms = timeout.as_millis().to_string();

    let check = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_stockguard"))
            .args([&["check", "--database-url", &app.database_url][..], extra].concat())
            .env_remove("DATABASE_URL")
            .output()
            .expect("run")
    };
    for extra in [&[][..], &["--statement-timeout-ms", &timeout_ms]] {
        let output = check(extra);
        let said = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && said.contains("every inventory and every location (1000 inventories)"),
            "{extra:?}: {said}{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    // The library's check reports its progress through every step, and
    // keeps its time limit.
    let mut steps = Vec::new();
    let options = invariant::Options { time_limit: None, batch: 300 };
    let checked = invariant::check_with(&app.db, &options, |found| match found {
        Found::Progress(p) if p.done == p.of => steps.push(p.step),
        Found::Progress(_) => {}
        Found::Drift(drift) => panic!("{drift}"),
    })
    .await
    .expect("check");
    assert_eq!(checked, Checked { inventories: 1000, drifts: 0 });
    assert_eq!(steps, [Step::Ledger, Step::Lines, Step::Inventories], "each step finished once, in order");
    let short = invariant::Options { time_limit: Some(Duration::from_millis(50)), ..options };
    let out_of_time = invariant::check_with(&app.db, &short, |_| {}).await;
    assert!(
        matches!(out_of_time, Err(CheckError::OutOfTime(limit)) if limit == Duration::from_millis(50)),
        "{out_of_time:?}"
    );

    // A change of the 15th day taken out of the ledger: the inventory's
    // version and its level's available units no longer add up.
    app.db
        .execute_unprepared(&format!(
            "DELETE FROM stock_movements WHERE inventory_id = '{}' AND version_after = 235",
            Uuid::from_u128(0x0000_0000_0000_4000_8000_0000_0000_01f4)
        ))
        .await
        .expect("plant a drift");
    let output = check(&["--statement-timeout-ms", &timeout_ms]);
    let said = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{said}");
    let drifts: Vec<_> = said.lines().filter(|line| line.starts_with("DRIFT")).collect();
    assert_eq!(drifts.len(), 2, "the inventory and its level: {said}");
    assert!(drifts[0].contains("HIST-000500") && drifts[0].contains("version 482 vs 481 ledger versions"), "{said}");
    assert!(drifts[1].contains("HIST-000500") && drifts[1].contains("at default"), "{said}");
}

/// A check holds the ledger so that no partition it may read is dropped
/// under it, and nothing else: once it has listed the partitions to read,
/// new days are made (a default partition it does not read is not in their
/// way), the ledger is read, and only the archive's dropping of emptied
/// days waits for it.
#[tokio::test(flavor = "multi_thread")]
async fn a_check_under_way_lets_new_days_be_made_and_the_ledger_read_but_no_day_dropped() {
    let app = TestApp::spawn().await;
    // The fixture's changes span the 9 hours before `at`: all of them on
    // one day (today's partition), whatever the hour the test runs at.
    two_locations(&app, "date_trunc('day', now()) + interval '10 hours'").await;
    let (listed, reached) = tokio::sync::oneshot::channel();
    let (resume, resumed) = std::sync::mpsc::channel::<()>();
    // The check runs on a thread and a runtime of its own, which its first
    // report of progress holds still while the test's runtime goes on.
    let url = app.database_url.clone();
    let checking = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async move {
            let db = sea_orm::Database::connect(url.as_str()).await.expect("connect");
            let mut listed = Some(listed);
            invariant::check_with(&db, &invariant::Options::default(), move |found| {
                assert!(matches!(found, Found::Progress(_)), "{found:?}");
                if let Some(listed) = listed.take() {
                    let _ = listed.send(found);
                    let _ = resumed.recv();
                }
            })
            .await
        })
    });
    let first = reached.await.expect("the check listed the partitions");
    assert_eq!(first, Found::Progress(Progress { step: Step::Ledger, done: 0, of: 2 }), "today's and the checkpoints");

    let made = in_time(stock::partitions::make(&app.db, 0, 40)).await.expect("the days ahead");
    assert!(made > 0, "new days attached beside the default partition");
    let rows = in_time(app.count("SELECT count(*) FROM stock_movements")).await;
    assert_eq!(rows, 12);
    let far = "SELECT drop_empty_ledger_partitions(now() + interval '60 days')::bigint";
    assert_eq!(in_time(app.count(far)).await, 0, "no day dropped while the check holds the ledger");

    resume.send(()).expect("resume");
    let checked = checking.join().expect("thread").expect("check");
    assert_eq!(checked, Checked { inventories: 2, drifts: 0 });
    assert!(app.count(far).await > 0, "the empty days ahead go once the check is done");
}

/// What `work` gives, within 10 s.
async fn in_time<T>(work: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), work).await.expect("done within 10 s")
}
