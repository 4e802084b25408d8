//! Stock operations under concurrency, at every isolation level, several
//! rounds each, every round checked against the database (the check, and
//! the ledger replayed level by level): negative adjustments racing
//! reserves, releases, the sweeper and transfers never take a held unit and
//! never lose one; counts racing reserves apply (on hand is then the count)
//! or answer `CountBelowHeld` / `Conflict`; customers racing for the last
//! units above safety stock on every path never take one of its units,
//! while operators asking to may; a keyed adjustment sent ten times at once
//! changes stock once.

use std::sync::Arc;

use futures::{FutureExt, future::BoxFuture};
use sea_orm::{ConnectionTrait, TransactionTrait};
use serde_json::{Value, json};
use stockguard::{auth::Role, config::Limits};
use uuid::Uuid;

use super::{adjust, change_quantity, place_order, reserve, reserve_many, safety_states, set_safety};
use crate::{
    helpers::{Isolation, TestApp, at_every_isolation, at_once, count, error_code, named, names, sweep_all, uuid},
    locations::{create_location, default_location, stocked},
    transfers::transfer,
};

/// Rounds of each race per isolation level: each a fresh inventory, checked.
const ROUNDS: usize = 3;

/// A request of a race: its kind and its answer, named.
type Raced = BoxFuture<'static, (&'static str, (String, Value))>;

/// The answers of `kind` among `answers`.
fn of(answers: &[(&'static str, (String, Value))], kind: &str) -> Vec<(String, Value)> {
    answers.iter().filter(|(k, _)| *k == kind).map(|(_, answer)| answer.clone()).collect()
}

/// Whether every answer of `kind` is one of `members` (no error reached a client).
fn all_in(answers: &[(String, Value)], members: &[&str], kind: &str) {
    let others: Vec<&(String, Value)> = answers.iter().filter(|(name, _)| !members.contains(&name.as_str())).collect();
    assert!(others.is_empty(), "{kind}: answers outside {members:?}: {others:?}");
}

/// The token of operator number `n`: each request of a race its own
/// caller, as many operators' would be (one caller's requests in flight
/// are bounded, `STOCKGUARD_MAX_IN_FLIGHT_PER_CALLER`).
fn operator_no(app: &TestApp, n: impl std::fmt::Display) -> String {
    app.token(&format!("operator-{n}"), Role::Operator)
}

/// `reserve` as `token` of `input`, named, as a race's request.
fn reserving(app: &Arc<TestApp>, kind: &'static str, token: String, input: Value) -> Raced {
    let app = app.clone();
    async move { (kind, named(reserve(&app, &token, input).await)) }.boxed()
}

/// The ledger's rows of customers' takes (reservations, order lines and
/// quantity increases of every user but the `safety-op-*` operators who
/// asked for safety stock) after which their level held fewer available
/// units than its safety stock: the level's available units replayed from
/// the ledger, change by change, at each location.
pub async fn customers_below_safety_stock(app: &TestApp, inventory: Uuid) -> Vec<Value> {
    app.rows(&format!(
        r#"
WITH lv AS (
    SELECT m.inventory_id, m.reason, m.delta, m.version_after, m.reservation_id,
           coalesce(m.location_id, (SELECT id FROM locations WHERE code = 'default')) AS location_id,
           sum(m.delta) FILTER (WHERE m.reason <> 'FULFILLED')
               OVER (PARTITION BY coalesce(m.location_id, (SELECT id FROM locations WHERE code = 'default'))
                     ORDER BY m.version_after) AS level_after
      FROM stock_movements m WHERE m.inventory_id = '{inventory}'
)
SELECT lv.version_after, lv.delta, lv.level_after, s.safety_stock, r.user_id
  FROM lv JOIN reservations r ON r.id = lv.reservation_id
  JOIN stock_levels s ON s.inventory_id = lv.inventory_id AND s.location_id = lv.location_id
 WHERE lv.delta < 0 AND lv.reason IN ('RESERVED', 'ORDERED', 'QUANTITY_CHANGED')
   AND r.user_id NOT LIKE 'safety-op-%' AND lv.level_after < s.safety_stock"#
    ))
    .await
}

/// Per round: 60 units over two locations (default 35, b 25), 30 of them
/// held by 15 reservations of 2 (all from default, priority 0); five are
/// past their expiry. Then at once: 20 adjustments of -1 to -3 (damaged or
/// lost, at either location), 16 customers' reserves of 1 or 2, releases
/// of 5 of the held reservations, 8 transfers of 2 between the locations
/// and the sweeper returning the expired ones. No request fails; an
/// adjustment refused took more than its level had available; the 10 units
/// of the reservations nobody touched are still held, with every new
/// reservation's; on hand is exactly 60 plus the applied adjustments; the
/// check holds.
async fn negative_adjustments_never_take_a_held_unit_nor_lose_one(isolation: Isolation) {
    let app = Arc::new(TestApp::without_sweeper(isolation).await);
    let operator = app.operator();
    let (default, b) = (default_location(&app).await, create_location(&app, "b", 10).await);
    let mut totals = [0usize; 4];
    for round in 0..ROUNDS {
        let item = stocked(&app, &format!("ADJ-RACE-{round}"), 60).await;
        let split = json!({ "inventoryId": item, "fromLocationId": default, "toLocationId": b, "quantity": 25 });
        assert_eq!(transfer(&app, &operator, split).await["__typename"], "StockTransferred");
        let mut held = Vec::new();
        for n in 0..15 {
            let token = app.token(&format!("holder-{n}"), Role::Customer);
            let answer = reserve(&app, &token, json!({ "inventoryId": item, "quantity": 2 })).await;
            held.push((token, uuid(&answer["reservation"]["id"])));
        }
        let expired: Vec<String> = held[10..].iter().map(|(_, id)| format!("'{id}'")).collect();
        let due = format!(
            "UPDATE reservations SET expires_at = now() - interval '1 second' WHERE id IN ({})",
            expired.join(",")
        );
        app.db.execute_unprepared(&due).await.expect("make five holds due");

        let mut requests: Vec<Raced> = Vec::new();
        for n in 0..20 {
            let (app, at) = (app.clone(), if n % 2 == 0 { default } else { b });
            let reason = if n % 3 == 0 { "SHRINKAGE" } else { "DAMAGED" };
            let input = json!({ "inventoryId": item, "locationId": at, "delta": -(1 + n % 3), "reason": reason });
            let token = operator_no(&app, n);
            requests.push(async move { ("adjust", named(adjust(&app, &token, input).await)) }.boxed());
        }
        for n in 0..16 {
            let token = app.token(&format!("racer-{n}"), Role::Customer);
            requests.push(reserving(&app, "reserve", token, json!({ "inventoryId": item, "quantity": 1 + n % 2 })));
        }
        for (token, id) in held[5..10].iter().cloned() {
            let app = app.clone();
            requests.push(async move { ("release", named(app.release(&token, id).await)) }.boxed());
        }
        for n in 0..8 {
            let app = app.clone();
            let (from, to) = if n % 2 == 0 { (default, b) } else { (b, default) };
            let input = json!({ "inventoryId": item, "fromLocationId": from, "toLocationId": to, "quantity": 2 });
            let token = operator_no(&app, 100 + n);
            requests.push(async move { ("transfer", named(transfer(&app, &token, input).await)) }.boxed());
        }
        let sweeping = app.clone();
        requests.push(
            async move {
                let swept = sweep_all(&sweeping.db, 100).await;
                ("sweep", ("Swept".to_owned(), json!(swept)))
            }
            .boxed(),
        );
        let answers = at_once(requests).await;

        let (adjusts, reserves, releases, transfers) =
            (of(&answers, "adjust"), of(&answers, "reserve"), of(&answers, "release"), of(&answers, "transfer"));
        all_in(&adjusts, &["StockAdjusted", "SoldOut"], "adjust");
        all_in(&reserves, &["Reserved", "SoldOut"], "reserve");
        all_in(&releases, &["ReservationReleased"], "release");
        all_in(&transfers, &["StockTransferred", "SoldOut", "Conflict"], "transfer");
        assert_eq!(of(&answers, "sweep")[0].1, json!(5), "the sweeper returned the five expired holds");
        for (_, refused) in adjusts.iter().filter(|(name, _)| name == "SoldOut") {
            assert!(refused["available"].as_i64() < refused["requested"].as_i64(), "{refused}");
        }
        let adjusted: i64 = adjusts.iter().filter_map(|(_, a)| a["delta"].as_i64()).sum();
        let reserved: i64 = reserves
            .iter()
            .filter(|(name, _)| name == "Reserved")
            .map(|(_, a)| a["reservation"]["quantity"].as_i64().expect("a quantity"))
            .sum();
        let [available, held_units, committed, on_hand] = app.states(item).await;
        assert_eq!((held_units, committed), (10 + reserved, 0), "no held unit taken: {:?}", names(&adjusts));
        assert_eq!(on_hand, 60 + adjusted, "no unit lost or invented");
        assert_eq!(available, on_hand - held_units);
        app.assert_invariant().await;
        let applied = count(&adjusts, "StockAdjusted");
        for (n, kind) in
            [applied, count(&reserves, "Reserved"), count(&transfers, "StockTransferred"), 5].iter().zip(&mut totals)
        {
            *kind += n;
        }
    }
    eprintln!(
        "negative_adjustments_never_take_a_held_unit_nor_lose_one {isolation:?}: {ROUNDS} rounds of 50 requests; \
         {} adjustments applied of {}, {} reserves granted, {} transfers moved, {} releases",
        totals[0],
        20 * ROUNDS,
        totals[1],
        totals[2],
        totals[3]
    );
}

/// Per round: 40 units at the default location, 8 held by four
/// reservations of 2; then at once 30 customers' reserves of 1 and ten
/// counts of the location (two below what is held before the race, three
/// with the version seen before it, judged by it first). A count applies, answers
/// `CountBelowHeld` (what is held is above it) or `Conflict` (only one
/// that gave a version); an applied count's answer and the ledger up to its
/// version both put on hand at the count, and on hand ends at the count
/// applied last (reserves never change it); the check holds.
async fn counts_racing_reserves_apply_or_refuse_and_leave_on_hand_at_the_count(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let counted_values = [4, 6, 8, 12, 30, 34, 36, 38, 40, 45];
    let mut totals = [0usize; 4];
    for round in 0..ROUNDS {
        let item = stocked(&app, &format!("COUNT-RACE-{round}"), 40).await;
        for n in 0..4 {
            let token = app.token(&format!("holder-{n}"), Role::Customer);
            assert_eq!(
                reserve(&app, &token, json!({ "inventoryId": item, "quantity": 2 })).await["__typename"],
                "Reserved"
            );
        }
        let (_, seen) = app.stock_and_version(item).await;
        let mut requests: Vec<Raced> = Vec::new();
        for (n, counted) in counted_values.into_iter().enumerate() {
            let app = app.clone();
            let mut input = json!({ "inventoryId": item, "countedOnHand": counted, "reason": "CYCLE_COUNT" });
            if n % 3 == 1 {
                input["expectedVersion"] = json!(seen);
            }
            let token = operator_no(&app, n);
            requests.push(async move { ("count", named(adjust(&app, &token, input).await)) }.boxed());
        }
        for n in 0..30 {
            let token = app.token(&format!("racer-{n}"), Role::Customer);
            requests.push(reserving(&app, "reserve", token, json!({ "inventoryId": item, "quantity": 1 })));
        }
        let answers = at_once(requests).await;
        let (counts, reserves) = (of(&answers, "count"), of(&answers, "reserve"));
        all_in(&counts, &["StockAdjusted", "CountBelowHeld", "Conflict"], "count");
        all_in(&reserves, &["Reserved", "SoldOut"], "reserve");

        let mut last: Option<(i64, i64)> = None;
        for ((name, answer), (n, counted)) in counts.iter().zip(counted_values.into_iter().enumerate()) {
            let counted = i64::from(counted);
            match name.as_str() {
                "StockAdjusted" => {
                    assert_eq!(answer["level"]["onHand"].as_i64(), Some(counted), "{answer}");
                    let version = answer["inventory"]["version"].as_i64().expect("a version");
                    let ledger = app
                        .count(&format!(
                            "SELECT coalesce(sum(delta), 0)::bigint FROM stock_movements WHERE inventory_id = '{item}' \
                              AND version_after <= {version} AND reason IN ('CREATED', 'RESTOCKED', 'TRANSFERRED_IN', \
                              'TRANSFERRED_OUT', 'FULFILLED', 'RETURNED', 'ADJUSTED')"
                        ))
                        .await;
                    assert_eq!(ledger, counted, "on hand at version {version} is the count: {answer}");
                    if last.is_none_or(|(v, _)| version >= v) {
                        if let Some((v, c)) = last.filter(|&(v, _)| v == version) {
                            assert_eq!(c, counted, "two counts judged at version {v} saw one on hand");
                        }
                        last = Some((version, counted));
                    }
                }
                "CountBelowHeld" => assert!(answer["held"].as_i64() > Some(counted), "{answer}"),
                _ => assert_eq!(n % 3, 1, "only a count that gave a version conflicts: {answer}"),
            }
        }
        for (n, counted) in counted_values.into_iter().enumerate().filter(|&(n, c)| n % 3 != 1 && c < 8) {
            assert_eq!(counts[n].0, "CountBelowHeld", "{counted} is below the 8 held before the race");
        }
        let [available, held, _, on_hand] = app.states(item).await;
        if let Some((_, counted)) = last {
            assert_eq!(on_hand, counted, "on hand is the count applied last");
        }
        let reserved = count(&reserves, "Reserved") as i64;
        assert_eq!((held, available), (8 + reserved, on_hand - 8 - reserved));
        app.assert_invariant().await;
        for (n, total) in [
            count(&counts, "StockAdjusted"),
            count(&counts, "CountBelowHeld"),
            count(&counts, "Conflict"),
            count(&reserves, "Reserved"),
        ]
        .iter()
        .zip(&mut totals)
        {
            *total += n;
        }
    }
    eprintln!(
        "counts_racing_reserves_apply_or_refuse_and_leave_on_hand_at_the_count {isolation:?}: {ROUNDS} rounds of 40 \
         requests; counts {} applied, {} below held, {} in conflict; {} reserves granted",
        totals[0], totals[1], totals[2], totals[3]
    );
}

/// Per round: S, 30 units in one place with a safety stock of 10, and M,
/// 15 units at each of two locations with 5 kept at each (20 sellable), each
/// with six customers' holds of 1. Then at once, about 70 requests: single
/// reserves (coalesced when `limits` coalesce), carts (`reserveMany`),
/// orders (`placeOrder`), quantity increases of the holds, operators'
/// reserves without `useSafetyStock` and four with it (`safety-op-*`).
/// Customers ask for more than is sellable. No request fails; no
/// customer's take, replayed from the ledger level by level, left its level
/// below its safety stock; nothing sellable is left; every operator that
/// asked for safety stock got it; the check holds.
async fn customers_racing_for_the_last_units_never_take_safety_stock(isolation: Isolation, limits: Limits) {
    let coalescing = limits.coalesce;
    let app = Arc::new(TestApp::spawn_configured(isolation, limits).await);
    let operator = app.operator();
    let (default, b) = (default_location(&app).await, create_location(&app, "b", 10).await);
    let mut totals = [0usize; 3];
    let mut shared = 0;
    for round in 0..ROUNDS.min(2) {
        let one = stocked(&app, &format!("SAFE-ONE-{round}"), 30).await;
        set_safety(&app, &operator, json!({ "inventoryId": one, "quantity": 10 })).await;
        let spread = stocked(&app, &format!("SAFE-SPREAD-{round}"), 30).await;
        let split = json!({ "inventoryId": spread, "fromLocationId": default, "toLocationId": b, "quantity": 15 });
        assert_eq!(transfer(&app, &operator, split).await["__typename"], "StockTransferred");
        for at in [default, b] {
            set_safety(&app, &operator, json!({ "inventoryId": spread, "locationId": at, "quantity": 5 })).await;
        }
        let mut holds = Vec::new();
        for (n, item) in [one, spread].into_iter().cycle().take(12).enumerate() {
            let token = app.token(&format!("holder-{n}"), Role::Customer);
            let answer = reserve(&app, &token, json!({ "inventoryId": item, "quantity": 1 })).await;
            holds.push((token, uuid(&answer["reservation"]["id"])));
        }

        let mut requests: Vec<Raced> = Vec::new();
        for n in 0..28 {
            let item = if n % 2 == 0 { one } else { spread };
            let token = app.token(&format!("racer-{n}"), Role::Customer);
            requests.push(reserving(&app, "customer", token, json!({ "inventoryId": item, "quantity": 1 })));
        }
        for n in 0..8 {
            let (app, token) = (app.clone(), app.token(&format!("cart-{n}"), Role::Customer));
            let items = json!([{ "inventoryId": one, "quantity": 1 }, { "inventoryId": spread, "quantity": 1 }]);
            requests.push(async move { ("cart", named(reserve_many(&app, &token, items).await)) }.boxed());
        }
        for n in 0..8 {
            let (app, token) = (app.clone(), app.token(&format!("buyer-{n}"), Role::Customer));
            let items = json!([{ "inventoryId": if n % 2 == 0 { one } else { spread }, "quantity": 1 }]);
            requests.push(async move { ("order", named(place_order(&app, &token, items).await)) }.boxed());
        }
        for (token, id) in holds.iter().cloned() {
            let app = app.clone();
            requests.push(async move { ("increase", named(change_quantity(&app, &token, id, 2).await)) }.boxed());
        }
        for n in 0..4 {
            let item = if n % 2 == 0 { one } else { spread };
            let plain = app.token(&format!("plain-op-{n}"), Role::Operator);
            requests.push(reserving(&app, "customer", plain, json!({ "inventoryId": item, "quantity": 1 })));
            let keeper = app.token(&format!("safety-op-{n}"), Role::Operator);
            let input = json!({ "inventoryId": item, "quantity": 2, "useSafetyStock": true });
            requests.push(reserving(&app, "keeper", keeper, input));
        }
        let total = requests.len();
        let answers = at_once(requests).await;
        let (customers, carts, orders) = (of(&answers, "customer"), of(&answers, "cart"), of(&answers, "order"));
        let (increases, keepers) = (of(&answers, "increase"), of(&answers, "keeper"));
        all_in(&customers, &["Reserved", "SoldOut"], "reserve");
        all_in(&carts, &["ReservedAll", "ItemsUnavailable"], "reserveMany");
        all_in(&orders, &["OrderPlaced", "ItemsUnavailable"], "placeOrder");
        all_in(&increases, &["ReservationChanged", "SoldOut"], "changeReservationQuantity");
        assert_eq!(count(&keepers, "Reserved"), 4, "an operator asking may take safety stock: {keepers:?}");
        assert!(count(&customers, "SoldOut") > 0, "customers asked for more than was sellable");

        for item in [one, spread] {
            let below = customers_below_safety_stock(&app, item).await;
            assert!(below.is_empty(), "customers took safety stock ({isolation:?}, round {round}): {below:?}");
            let states = safety_states(&app, item).await;
            assert_eq!(states["sellable"], 0, "nothing sellable left: {states}");
        }
        // Customers took at most S's 20 sellable units and the operators 4:
        // what is left is its safety stock less at most the operators' units.
        let (left, _) = app.stock_and_version(one).await;
        assert!((6..=10).contains(&left), "S holds {left}: its safety stock, less what operators took");
        app.assert_invariant().await;
        // The mechanism, where batches may form: single reserves of S that
        // shared a statement.
        let (grants, transactions) = (
            app.count(&format!("SELECT count(*) FROM stock_movements WHERE inventory_id = '{one}' AND reason = 'RESERVED'")).await,
            app.count(&format!(
                "SELECT count(DISTINCT xmin::text) FROM stock_movements WHERE inventory_id = '{one}' AND reason = 'RESERVED'"
            ))
            .await,
        );
        shared += grants - transactions;
        let granted = count(&customers, "Reserved") + count(&carts, "ReservedAll") + count(&orders, "OrderPlaced");
        for (n, t) in [total, granted, count(&increases, "ReservationChanged")].iter().zip(&mut totals) {
            *t += n;
        }
    }
    if coalescing {
        assert!(shared > 0, "no two reserves of S shared a statement: the coalesced path was not raced");
    }
    eprintln!(
        "customers_racing_for_the_last_units_never_take_safety_stock {isolation:?} coalescing={coalescing}: {} rounds, \
         {} requests; {} customers' reserves, carts and orders granted, {} increases; {shared} grants shared a statement",
        ROUNDS.min(2),
        totals[0],
        totals[1],
        totals[2]
    );
}

/// Ten `adjustStock` with one key at once change stock once: all ten answer
/// `StockAdjusted` with the delta applied, one ledger row, one version
/// step. The key with another delta is refused, and a new key adjusts
/// again; a keyed count replays the delta it applied, not a new one.
async fn a_keyed_adjustment_repeated_ten_times_at_once_changes_stock_once(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let item = stocked(&app, "ADJ-KEY", 20).await;
    let input = move |delta: i32, key: &str| json!({ "inventoryId": item, "delta": delta, "reason": "DAMAGED", "idempotencyKey": key });
    let repeats = (0..10).map(|_| {
        let (app, input) = (app.clone(), input(-3, "adjust-1"));
        async move { named(adjust(&app, &app.operator(), input).await) }.boxed()
    });
    let answers = at_once(repeats.collect()).await;
    assert_eq!(count(&answers, "StockAdjusted"), 10, "{answers:?}");
    assert!(answers.iter().all(|(_, answer)| answer["delta"] == -3), "{answers:?}");
    assert_eq!(app.stock_and_version(item).await, (17, 2), "one change");
    let rows = app
        .count(&format!("SELECT count(*) FROM stock_movements WHERE inventory_id = '{item}' AND reason = 'ADJUSTED'"))
        .await;
    assert_eq!(rows, 1);

    let reused = adjust(&app, &app.operator(), input(-2, "adjust-1")).await;
    assert_eq!(error_code(&reused), Some("IDEMPOTENCY_KEY_REUSED"), "{reused}");
    let other = adjust(&app, &app.token("someone-else", Role::Operator), input(-3, "adjust-1")).await;
    assert_eq!(other["delta"], -3, "another operator's key space: {other}");
    assert_eq!(app.stock_and_version(item).await, (14, 3));

    let counted =
        json!({ "inventoryId": item, "countedOnHand": 10, "reason": "CYCLE_COUNT", "idempotencyKey": "count-1" });
    assert_eq!(adjust(&app, &app.operator(), counted.clone()).await["delta"], -4);
    let grown = json!({ "inventoryId": item, "delta": 5, "reason": "FOUND" });
    assert_eq!(adjust(&app, &app.operator(), grown).await["__typename"], "StockAdjusted");
    let replayed = adjust(&app, &app.operator(), counted).await;
    assert_eq!(
        (&replayed["delta"], &replayed["inventory"]["stock"]),
        (&json!(-4), &json!(15)),
        "the first delta, the latest row"
    );
    app.assert_invariant().await;
}

/// A transaction that restocks `quantity` of `item` and holds its row until committed.
async fn restocking(app: &TestApp, item: Uuid, quantity: i32) -> sea_orm::DatabaseTransaction {
    let holder = app.db.begin().await.expect("begin");
    let restock = stockguard::stock::receiving::restock(item, quantity, None, None);
    holder.query_one_raw(restock).await.expect("a restock, not yet committed");
    holder
}

/// A take that waited for units to arrive gets them: a reserve across
/// levels, and a quantity increase, each begun while a restock held the
/// inventory row and sold out in its snapshot, take their units once the
/// restock commits. The new stock is computed from the row as locked; from
/// the snapshot's (at READ COMMITTED, older than the row it waited for)
/// `stock >= 0` failed the statement for nothing.
async fn a_take_that_waited_for_units_to_arrive_gets_them(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let item = stocked(&app, "WAITED", 0).await;
    let default = default_location(&app).await;
    let holder = restocking(&app, item, 5).await;
    let waiting = {
        let (app, token) = (app.clone(), app.token("alice", Role::Customer));
        let input = json!({ "inventoryId": item, "quantity": 2, "locationIds": [default] });
        tokio::spawn(async move { reserve(&app, &token, input).await })
    };
    app.until_waiting_for_a_lock("WITH inv AS").await;
    holder.commit().await.expect("commit the restock");
    let taken = waiting.await.expect("the reserve");
    assert_eq!(taken["__typename"], "Reserved", "{taken}");

    let bob = app.token("bob", Role::Customer);
    let held = reserve(&app, &bob, json!({ "inventoryId": item, "quantity": 1 })).await;
    let rest = reserve(&app, &app.token("carol", Role::Customer), json!({ "inventoryId": item, "quantity": 2 })).await;
    assert_eq!((&held["__typename"], &rest["__typename"]), (&json!("Reserved"), &json!("Reserved")));
    let holder = restocking(&app, item, 2).await;
    let waiting = {
        let (app, id) = (app.clone(), uuid(&held["reservation"]["id"]));
        tokio::spawn(async move { change_quantity(&app, &bob, id, 3).await })
    };
    app.until_waiting_for_a_lock("WITH line AS").await;
    holder.commit().await.expect("commit the restock");
    let grown = waiting.await.expect("the increase");
    assert_eq!((&grown["__typename"], &grown["reservation"]["quantity"]), (&json!("ReservationChanged"), &json!(3)));
    assert_eq!(app.states(item).await, [0, 7, 0, 7]);
    app.assert_invariant().await;
}

/// The safety race with the default settings (coalescing on), with a batch
/// window that makes batches form (100 ms: on a loaded machine the racers
/// reach the coalescer further apart than 20 ms, and then no batch formed
/// in one run of the full suite), and with coalescing off (every caller alone).
async fn customers_racing_coalesced(isolation: Isolation) {
    let limits = Limits { coalesce_window_us: 100_000, ..Limits::default() };
    customers_racing_for_the_last_units_never_take_safety_stock(isolation, limits).await;
}

async fn customers_racing_alone(isolation: Isolation) {
    customers_racing_for_the_last_units_never_take_safety_stock(
        isolation,
        Limits { coalesce: false, ..Limits::default() },
    )
    .await;
}

at_every_isolation! {
    negative_adjustments_never_take_a_held_unit_nor_lose_one;
    counts_racing_reserves_apply_or_refuse_and_leave_on_hand_at_the_count;
    customers_racing_coalesced;
    customers_racing_alone;
    a_keyed_adjustment_repeated_ten_times_at_once_changes_stock_once;
    a_take_that_waited_for_units_to_arrive_gets_them;
}
