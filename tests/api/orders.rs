//! Orders and multi-line reservations: races between confirm and cancel,
//! opposite `reserveMany` requests, stale address edits, exhausted retries,
//! lock timeouts, releases, idempotency, visibility and bad input. Every
//! outcome is checked straight from the database afterwards.

use std::{
    collections::{BTreeSet, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use futures::future::FutureExt;
use sea_orm::{ConnectionTrait, TransactionTrait};
use serde_json::{Value, json};
use stockguard::{
    auth::Role,
    config::{Limits, OrderLocking},
};
use uuid::Uuid;

use crate::{
    documents::{ORDER, ORDERS},
    helpers::{Isolation, TestApp, address, at_every_isolation, at_once, count, error_code, named, names, uuid},
};

// ---------- helpers ----------

/// Places an order of `quantity` units of `inventory` and returns its id.
async fn new_order(app: &TestApp, token: &str, inventory: Uuid, quantity: i32) -> Uuid {
    let input = json!({
        "items": [{ "inventoryId": inventory, "quantity": quantity }],
        "shippingAddress": address("1 Main Street"),
    });
    let (name, result) = named(app.place_order(token, input).await);
    assert_eq!(name, "OrderPlaced", "{result}");
    uuid(&result["order"]["id"])
}

/// The order's row in `orders`, every column.
pub async fn order_row(app: &TestApp, id: Uuid) -> Value {
    let mut found = app.rows(&format!("SELECT * FROM orders WHERE id = '{id}'")).await;
    assert_eq!(found.len(), 1, "order {id} has one row");
    found.remove(0)
}

/// The statuses of an order's lines (its reservations), sorted.
pub async fn line_statuses(app: &TestApp, order: Uuid) -> Vec<String> {
    let mut statuses: Vec<String> = app
        .rows(&format!("SELECT status FROM reservations WHERE order_id = '{order}'"))
        .await
        .iter()
        .map(|row| row["status"].as_str().expect("status").to_owned())
        .collect();
    statuses.sort();
    statuses
}

/// Everything about one order the database holds: its row and its lines.
async fn order_state(app: &TestApp, order: Uuid) -> Value {
    let mut lines = app.rows(&format!("SELECT * FROM reservations WHERE order_id = '{order}'")).await;
    lines.sort_by_key(|line| line["id"].as_str().map(str::to_owned));
    json!({ "order": order_row(app, order).await, "lines": lines })
}

fn limits(order_locking: OrderLocking) -> Limits {
    Limits { order_locking, ..Limits::default() }
}

// ---------- placing an order ----------

#[tokio::test(flavor = "multi_thread")]
async fn placing_an_order_merges_lines_takes_stock_and_holds_it_as_ordered_reservations() {
    let app = TestApp::spawn().await;
    let (x, y) = (app.create_inventory("PLACE-X", 10).await, app.create_inventory("PLACE-Y", 10).await);
    let alice = app.token("alice", Role::Customer);
    let input = json!({
        "items": [
            { "inventoryId": x, "quantity": 2 },
            { "inventoryId": y, "quantity": 1 },
            { "inventoryId": x, "quantity": 3 },
        ],
        "shippingAddress": address("1 Main Street"),
    });
    let (name, placed) = named(app.place_order(&alice, input).await);
    assert_eq!(name, "OrderPlaced", "{placed}");
    let order = &placed["order"];
    let id = uuid(&order["id"]);
    assert_eq!(order["status"], "PENDING");
    assert_eq!(order["userId"], "alice");
    assert_eq!(order["version"], 1, "a new order is version 1");
    assert!(order["confirmedAt"].is_null() && order["confirmedBy"].is_null(), "{order}");
    assert_eq!(order["shippingAddress"], address("1 Main Street"));
    let mut items: Vec<(Uuid, i64)> = order["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| (uuid(&item["inventory"]["id"]), item["quantity"].as_i64().expect("quantity")))
        .collect();
    items.sort();
    let mut expected = vec![(x, 5), (y, 1)];
    expected.sort();
    assert_eq!(items, expected, "lines naming the same inventory are merged");

    assert_eq!(app.stock_and_version(x).await.0, 5);
    assert_eq!(app.stock_and_version(y).await.0, 9);
    let row = order_row(&app, id).await;
    assert_eq!(
        (row["status"].as_str(), row["user_id"].as_str(), row["version"].as_i64()),
        (Some("PENDING"), Some("alice"), Some(1))
    );
    assert!(row["confirmed_at"].is_null() && row["confirmed_by"].is_null(), "{row}");
    let held = app
        .rows(&format!(
            "SELECT inventory_id, sum(quantity)::int AS quantity FROM reservations \
             WHERE order_id = '{id}' AND status = 'ORDERED' AND user_id = 'alice' GROUP BY inventory_id"
        ))
        .await;
    let mut held: Vec<(Uuid, i64)> =
        held.iter().map(|r| (uuid(&r["inventory_id"]), r["quantity"].as_i64().expect("quantity"))).collect();
    held.sort();
    assert_eq!(held, expected, "the order's lines are ORDERED reservations carrying its id");
    assert_eq!(app.count("SELECT count(*) FROM reservations WHERE order_id IS NULL").await, 0);
    app.assert_invariant().await;

    // Reading it back, as its owner.
    let read = app.graphql(Some(&alice), ORDER, json!({ "id": id })).await;
    assert_eq!(read["data"]["order"]["id"], id.to_string(), "{read}");

    // Cancelling gives every unit back and releases the lines.
    let (name, cancelled) = named(app.cancel(&alice, id).await);
    assert_eq!(name, "OrderCancelled", "{cancelled}");
    assert_eq!(cancelled["order"]["status"], "CANCELLED");
    assert_eq!(cancelled["order"]["version"], 2);
    assert_eq!(app.stock_and_version(x).await.0, 10);
    assert_eq!(app.stock_and_version(y).await.0, 10);
    assert_eq!(line_statuses(&app, id).await, ["RELEASED", "RELEASED"]);
    assert_eq!(order_row(&app, id).await["version"], 2);
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_order_with_an_unavailable_line_is_not_placed_and_takes_nothing() {
    let app = TestApp::spawn().await;
    let (x, y) = (app.create_inventory("NOPE-X", 5).await, app.create_inventory("NOPE-Y", 2).await);
    let alice = app.token("alice", Role::Customer);
    let before = app.snapshot().await;
    let input = json!({
        "items": [{ "inventoryId": x, "quantity": 1 }, { "inventoryId": y, "quantity": 3 }],
        "shippingAddress": address("1 Main Street"),
    });
    let (name, result) = named(app.place_order(&alice, input).await);
    assert_eq!(name, "ItemsUnavailable", "{result}");
    assert_eq!(
        result["items"],
        json!([{ "inventoryId": y, "reason": "SOLD_OUT", "inventory": { "id": y, "stock": 2, "version": 1 } }]),
        "only the failing line is listed"
    );
    assert_eq!(app.snapshot().await, before);
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 0);
    app.assert_invariant().await;
}

// ---------- 1. confirm racing cancel ----------

/// Per round: a fresh PENDING order; the operator confirms it while its owner
/// cancels it, both released by one barrier. Exactly one wins.
async fn confirm_racing_cancel_lets_exactly_one_win(isolation: Isolation, locking: OrderLocking, rounds: usize) {
    let app = Arc::new(TestApp::spawn_configured(isolation, limits(locking)).await);
    let item = app.create_inventory("RACE-1", 1000).await;
    let (alice, operator) = (app.token("alice", Role::Customer), app.operator());
    let mut confirmed = 0;
    for round in 0..rounds {
        let id = new_order(&app, &alice, item, 1).await;
        let confirming = {
            let (app, token) = (app.clone(), operator.clone());
            async move { named(app.confirm(&token, id).await) }.boxed()
        };
        let cancelling = {
            let (app, token) = (app.clone(), alice.clone());
            async move { named(app.cancel(&token, id).await) }.boxed()
        };
        let results = at_once(vec![confirming, cancelling]).await;
        let ((confirm_name, confirm_body), (cancel_name, cancel_body)) = (&results[0], &results[1]);
        let context = format!("round {round}: confirm {confirm_body}, cancel {cancel_body}");

        let won_by_confirm = match (confirm_name.as_str(), cancel_name.as_str()) {
            ("OrderConfirmed", "OrderCannotBeCancelled" | "OrderModifiedConcurrently") => true,
            ("OrderCannotBeConfirmed" | "OrderModifiedConcurrently", "OrderCancelled") => false,
            _ => panic!("exactly one must win, without errors; {context}"),
        };
        let row = order_row(&app, id).await;
        let lines = line_statuses(&app, id).await;
        assert_eq!(row["version"], 2, "one change, one version step; {context}; row {row}");
        if won_by_confirm {
            confirmed += 1;
            let order = &confirm_body["order"];
            assert_eq!(order["status"], "CONFIRMED", "{context}");
            assert_eq!(order["version"], 2, "{context}");
            assert_eq!(order["confirmedBy"], "operator", "{context}");
            assert!(order["confirmedAt"].is_string(), "{context}");
            match cancel_name.as_str() {
                "OrderCannotBeCancelled" => assert_eq!(cancel_body["order"]["status"], "CONFIRMED", "{context}"),
                _ => assert_eq!(cancel_body["orderId"], id.to_string(), "{context}"),
            }
            assert_eq!(row["status"], "CONFIRMED", "{context}; row {row}");
            assert_eq!(row["confirmed_by"], "operator", "{context}; row {row}");
            assert!(!row["confirmed_at"].is_null(), "{context}; row {row}");
            assert_eq!(lines, ["ORDERED"], "confirming keeps the lines; {context}");
        } else {
            let order = &cancel_body["order"];
            assert_eq!(order["status"], "CANCELLED", "{context}");
            assert_eq!(order["version"], 2, "{context}");
            assert!(order["confirmedAt"].is_null() && order["confirmedBy"].is_null(), "{context}");
            match confirm_name.as_str() {
                "OrderCannotBeConfirmed" => assert_eq!(confirm_body["order"]["status"], "CANCELLED", "{context}"),
                _ => assert_eq!(confirm_body["orderId"], id.to_string(), "{context}"),
            }
            assert_eq!(row["status"], "CANCELLED", "{context}; row {row}");
            assert!(row["confirmed_at"].is_null() && row["confirmed_by"].is_null(), "{context}; row {row}");
            assert_eq!(lines, ["RELEASED"], "cancelling releases the lines; {context}");
        }
        assert_eq!(app.stock_and_version(item).await.0, 1000 - confirmed, "{context}");
    }
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE status = 'PENDING'").await,
        0,
        "every round decided its order"
    );
    assert_eq!(app.count("SELECT count(*) FROM orders WHERE status = 'CONFIRMED'").await, i64::from(confirmed));
    app.assert_invariant().await;
}

/// Rounds of a race: most where races are cheapest to run (READ COMMITTED, optimistic).
fn race_rounds(isolation: Isolation, locking: OrderLocking) -> usize {
    match (isolation, locking) {
        (Isolation::ReadCommitted, OrderLocking::Optimistic) => 100,
        _ => 25,
    }
}

at_every_isolation! {
    confirm_racing_cancel_lets_exactly_one_win_optimistic => |isolation| {
        confirm_racing_cancel_lets_exactly_one_win(isolation, OrderLocking::Optimistic, race_rounds(isolation, OrderLocking::Optimistic))
    };
    confirm_racing_cancel_lets_exactly_one_win_pessimistic => |isolation| {
        confirm_racing_cancel_lets_exactly_one_win(isolation, OrderLocking::Pessimistic, race_rounds(isolation, OrderLocking::Pessimistic))
    };
}

// ---------- 2. reserveMany ----------

/// 100 requests for one unit each of X and Y (60 in stock each), half naming
/// them X then Y and half Y then X, all released by one barrier.
async fn opposite_reserve_many_requests_never_deadlock_or_oversell(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let (x, y) = (app.create_inventory("PAIR-X", 60).await, app.create_inventory("PAIR-Y", 60).await);
    let requests = (0..100)
        .map(|i| {
            let app = app.clone();
            let token = app.token(&format!("user-{i}"), Role::Customer);
            let (first, second) = if i % 2 == 0 { (x, y) } else { (y, x) };
            let items = json!([{ "inventoryId": first, "quantity": 1 }, { "inventoryId": second, "quantity": 1 }]);
            async move { named(app.reserve_many(&token, items).await) }.boxed()
        })
        .collect();
    let results = at_once(requests).await;

    let granted = count(&results, "ReservedAll");
    assert_eq!(granted + count(&results, "ItemsUnavailable"), 100, "no errors: {:?}", names(&results));
    assert!(granted <= 60, "never more than the stock: {granted}");
    let mut returned_ids = HashSet::new();
    for (name, result) in &results {
        if name == "ReservedAll" {
            let reservations = result["reservations"].as_array().expect("reservations");
            let inventories: BTreeSet<Uuid> = reservations.iter().map(|r| uuid(&r["inventory"]["id"])).collect();
            assert_eq!(inventories, BTreeSet::from([x, y]), "{result}");
            assert_eq!(reservations.len(), 2, "{result}");
            for reservation in reservations {
                assert_eq!((&reservation["quantity"], &reservation["status"]), (&json!(1), &json!("ACTIVE")));
                returned_ids.insert(uuid(&reservation["id"]));
            }
        } else {
            let items = result["items"].as_array().expect("items");
            assert!(!items.is_empty(), "a refusal says which line failed: {result}");
            for item in items {
                assert!([x, y].contains(&uuid(&item["inventoryId"])), "{result}");
                match item["reason"].as_str() {
                    // Stock only ever falls here, so sold out means none left.
                    Some("SOLD_OUT") => assert_eq!(item["inventory"]["stock"], 0, "{result}"),
                    // No expectedVersion was given: only an exhausted collision retry may say CONFLICT.
                    Some("CONFLICT") => {
                        assert!(
                            !matches!(isolation, Isolation::ReadCommitted),
                            "no CONFLICT at read committed: {result}"
                        )
                    }
                    _ => panic!("unexpected reason: {result}"),
                }
            }
        }
    }
    if matches!(isolation, Isolation::ReadCommitted) {
        assert_eq!(granted, 60, "at read committed nobody is refused while stock is left: {:?}", names(&results));
    }

    let taken = i32::try_from(granted).expect("small");
    assert_eq!(app.stock_and_version(x).await.0, 60 - taken, "X lost exactly one unit per ReservedAll");
    assert_eq!(app.stock_and_version(y).await.0, 60 - taken, "Y lost exactly one unit per ReservedAll");
    let stored = app.rows("SELECT id, inventory_id, quantity, status FROM reservations").await;
    assert_eq!(stored.len(), 2 * granted, "two reservations per ReservedAll, none for a refusal");
    assert!(stored.iter().all(|r| r["quantity"] == 1 && r["status"] == "ACTIVE"), "{stored:?}");
    let stored_ids: HashSet<Uuid> = stored.iter().map(|r| uuid(&r["id"])).collect();
    assert_eq!(stored_ids, returned_ids, "the reservations returned are the ones stored");
    for id in [x, y] {
        let held = app.count(&format!("SELECT count(*) FROM reservations WHERE inventory_id = '{id}'")).await;
        assert_eq!(held, i64::from(taken));
    }
    app.assert_invariant().await;
}

at_every_isolation! { opposite_reserve_many_requests_never_deadlock_or_oversell; }

#[tokio::test(flavor = "multi_thread")]
async fn reserve_many_lists_only_the_lines_it_cannot_serve_and_takes_nothing() {
    let app = TestApp::spawn().await;
    let (x, y) = (app.create_inventory("MANY-X", 5).await, app.create_inventory("MANY-Y", 5).await);
    let alice = app.token("alice", Role::Customer);
    let before = app.snapshot().await;
    let missing = Uuid::new_v4();

    let cases = [
        // One line above the stock.
        (
            json!([{ "inventoryId": x, "quantity": 1 }, { "inventoryId": y, "quantity": 6 }]),
            json!([{ "inventoryId": y, "reason": "SOLD_OUT", "inventory": { "id": y, "stock": 5, "version": 1 } }]),
        ),
        // Two lines of one inventory, each servable alone, merged into one that is not.
        (
            json!([{ "inventoryId": x, "quantity": 3 }, { "inventoryId": x, "quantity": 3 }]),
            json!([{ "inventoryId": x, "reason": "SOLD_OUT", "inventory": { "id": x, "stock": 5, "version": 1 } }]),
        ),
        // A stale screen.
        (
            json!([{ "inventoryId": x, "quantity": 1, "expectedVersion": 7 }, { "inventoryId": y, "quantity": 1 }]),
            json!([{ "inventoryId": x, "reason": "CONFLICT", "inventory": { "id": x, "stock": 5, "version": 1 } }]),
        ),
        // An inventory that does not exist.
        (
            json!([{ "inventoryId": x, "quantity": 1 }, { "inventoryId": missing, "quantity": 1 }]),
            json!([{ "inventoryId": missing, "reason": "NOT_FOUND", "inventory": null }]),
        ),
    ];
    for (items, expected) in cases {
        let (name, result) = named(app.reserve_many(&alice, items.clone()).await);
        assert_eq!(name, "ItemsUnavailable", "{items}: {result}");
        assert_eq!(result["items"], expected, "{items}");
        assert_eq!(app.snapshot().await, before, "{items} took nothing");
    }

    // Merged lines that fit are granted together.
    let items = json!([
        { "inventoryId": x, "quantity": 2, "expectedVersion": 1 },
        { "inventoryId": y, "quantity": 1 },
        { "inventoryId": x, "quantity": 2, "expectedVersion": 1 },
    ]);
    let (name, result) = named(app.reserve_many(&alice, items).await);
    assert_eq!(name, "ReservedAll", "{result}");
    assert_eq!(app.stock_and_version(x).await.0, 1);
    assert_eq!(app.stock_and_version(y).await.0, 4);
    let held = |id: Uuid| {
        format!("SELECT sum(quantity)::bigint FROM reservations WHERE inventory_id = '{id}' AND status = 'ACTIVE'")
    };
    assert_eq!(app.count(&held(x)).await, 4);
    assert_eq!(app.count(&held(y)).await, 1);
    app.assert_invariant().await;
}

// ---------- 3. changing the shipping address ----------

async fn a_stale_address_change_returns_the_current_order_and_writes_nothing(isolation: Isolation) {
    let app = TestApp::spawn_with(isolation).await;
    let item = app.create_inventory("ADDR-1", 10).await;
    let alice = app.token("alice", Role::Customer);
    let id = new_order(&app, &alice, item, 1).await;
    let (first, second) = (address("2 First Avenue"), address("3 Second Road"));

    let (name, changed) = named(app.change_address(&alice, id, 1, &first).await);
    assert_eq!(name, "ShippingAddressChanged", "{changed}");
    assert_eq!(changed["order"]["version"], 2);
    assert_eq!(changed["order"]["shippingAddress"], first);
    let after_first = order_state(&app, id).await;
    let snapshot = app.snapshot().await;

    // A second screen that also saw version 1.
    let (name, conflict) = named(app.change_address(&alice, id, 1, &second).await);
    assert_eq!(name, "OrderVersionConflict", "{conflict}");
    assert_eq!(conflict["expectedVersion"], 1);
    assert_eq!(conflict["current"]["id"], id.to_string());
    assert_eq!(conflict["current"]["version"], 2);
    assert_eq!(conflict["current"]["shippingAddress"], first, "the current address, to show beside the typed one");
    assert_eq!(conflict["submitted"], second);

    let stored = order_row(&app, id).await;
    assert_eq!(stored["version"], 2);
    let stored_text = stored.to_string();
    assert!(stored_text.contains("2 First Avenue") && !stored_text.contains("3 Second Road"), "{stored}");
    assert_eq!(order_state(&app, id).await, after_first, "nothing written");
    assert_eq!(app.snapshot().await, snapshot);
    app.assert_invariant().await;
}

at_every_isolation! { a_stale_address_change_returns_the_current_order_and_writes_nothing; }

#[tokio::test(flavor = "multi_thread")]
async fn cancelled_and_confirmed_orders_are_not_editable() {
    let app = TestApp::spawn().await;
    let item = app.create_inventory("EDIT-1", 10).await;
    let alice = app.token("alice", Role::Customer);

    let cancelled = new_order(&app, &alice, item, 1).await;
    assert_eq!(named(app.cancel(&alice, cancelled).await).0, "OrderCancelled");
    let confirmed = new_order(&app, &alice, item, 1).await;
    assert_eq!(named(app.confirm(&app.operator(), confirmed).await).0, "OrderConfirmed");

    for (id, status) in [(cancelled, "CANCELLED"), (confirmed, "CONFIRMED")] {
        let before = order_state(&app, id).await;
        let snapshot = app.snapshot().await;
        // The current version, so only the status stands in the way.
        let (name, result) = named(app.change_address(&alice, id, 2, &address("9 Late Lane")).await);
        assert_eq!(name, "OrderNotEditable", "{result}");
        assert_eq!(result["order"]["status"], status);
        assert_eq!(result["order"]["version"], 2);
        assert_eq!(order_state(&app, id).await, before, "nothing written");
        assert_eq!(app.snapshot().await, snapshot);
    }
    app.assert_invariant().await;
}

// ---------- 4. retries run out ----------

async fn confirm_and_cancel_report_modified_concurrently_after_three_lost_races(isolation: Isolation) {
    let app = TestApp::spawn_configured(isolation, limits(OrderLocking::Optimistic)).await;
    let item = app.create_inventory("LOSE-1", 10).await;
    let alice = app.token("alice", Role::Customer);
    let id = new_order(&app, &alice, item, 2).await;
    // Every status change of an order now affects 0 rows: a race lost every time.
    app.db
        .execute_unprepared(
            "CREATE FUNCTION lose_every_race() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$; \
             CREATE TRIGGER lose_every_race BEFORE UPDATE ON orders FOR EACH ROW \
             WHEN (NEW.status IS DISTINCT FROM OLD.status) EXECUTE FUNCTION lose_every_race();",
        )
        .await
        .expect("install the trigger");
    let before = order_state(&app, id).await;
    let snapshot = app.snapshot().await;

    for what in ["confirm", "cancel"] {
        let (name, result) = if what == "confirm" {
            named(app.confirm(&app.operator(), id).await)
        } else {
            named(app.cancel(&alice, id).await)
        };
        assert_eq!(name, "OrderModifiedConcurrently", "{what}: {result}");
        assert_eq!(result["orderId"], id.to_string(), "{what}");
        assert_eq!(result["attempts"], 3, "{what}: at most 3 attempts");
        assert_eq!(order_state(&app, id).await, before, "{what} changed nothing");
        assert_eq!(app.snapshot().await, snapshot, "{what} moved no stock");
    }
    assert_eq!(line_statuses(&app, id).await, ["ORDERED"]);
    app.assert_invariant().await;

    // Once races can be won again, the order is as good as new.
    app.db.execute_unprepared("DROP TRIGGER lose_every_race ON orders").await.expect("drop the trigger");
    let (name, result) = named(app.cancel(&alice, id).await);
    assert_eq!(name, "OrderCancelled", "{result}");
    assert_eq!(order_row(&app, id).await["version"], 2);
    assert_eq!(app.stock_and_version(item).await.0, 10);
    app.assert_invariant().await;
}

at_every_isolation! { confirm_and_cancel_report_modified_concurrently_after_three_lost_races; }

// ---------- 5. lock timeout ----------

async fn a_held_order_row_times_out_into_modified_concurrently_in_pessimistic_mode(isolation: Isolation) {
    let limits = Limits { order_locking: OrderLocking::Pessimistic, lock_timeout_ms: 300, ..Limits::default() };
    let app = TestApp::spawn_configured(isolation, limits).await;
    let item = app.create_inventory("LOCK-1", 10).await;
    let alice = app.token("alice", Role::Customer);
    let id = new_order(&app, &alice, item, 1).await;
    let before = order_state(&app, id).await;
    let snapshot = app.snapshot().await;

    let txn = app.db.begin().await.expect("begin");
    txn.execute_unprepared(&format!("SELECT 1 FROM orders WHERE id = '{id}' FOR UPDATE")).await.expect("lock the row");
    for what in ["confirm", "cancel"] {
        let started = Instant::now();
        let (name, result) = if what == "confirm" {
            named(app.confirm(&app.operator(), id).await)
        } else {
            named(app.cancel(&alice, id).await)
        };
        let elapsed = started.elapsed();
        assert_eq!(name, "OrderModifiedConcurrently", "{what}: {result}");
        assert_eq!(result["orderId"], id.to_string());
        assert!(result["attempts"].as_i64().is_some_and(|n| n >= 1), "{result}");
        assert!(elapsed < Duration::from_secs(5), "{what} gave up on the lock in {elapsed:?}");
    }
    txn.rollback().await.expect("rollback");

    assert_eq!(order_row(&app, id).await["status"], "PENDING");
    assert_eq!(order_state(&app, id).await, before, "nothing written while the row was held");
    assert_eq!(app.snapshot().await, snapshot);
    // The lock is gone, and so is the obstacle.
    let (name, result) = named(app.confirm(&app.operator(), id).await);
    assert_eq!(name, "OrderConfirmed", "{result}");
    assert_eq!(order_row(&app, id).await["status"], "CONFIRMED");
    app.assert_invariant().await;
}

at_every_isolation! { a_held_order_row_times_out_into_modified_concurrently_in_pessimistic_mode; }

// ---------- 6. releasing reservations ----------

async fn ten_releases_of_one_reservation_return_its_stock_once(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let item = app.create_inventory("FREE-1", 10).await;
    let alice = app.token("alice", Role::Customer);
    let reserved = app.reserve(&alice, json!({ "inventoryId": item, "quantity": 3 })).await;
    assert_eq!(reserved["__typename"], "Reserved", "{reserved}");
    let reservation = uuid(&reserved["reservation"]["id"]);

    let requests = (0..10)
        .map(|_| {
            let (app, token) = (app.clone(), alice.clone());
            async move { named(app.release(&token, reservation).await) }.boxed()
        })
        .collect();
    let results = at_once(requests).await;
    assert_eq!(count(&results, "ReservationReleased"), 1, "{:?}", names(&results));
    assert_eq!(count(&results, "ReservationNotActive"), 9, "{:?}", names(&results));
    for (name, result) in &results {
        assert_eq!(result["reservation"]["status"], "RELEASED", "{name}: {result}");
    }
    let released = &results.iter().find(|(n, _)| n == "ReservationReleased").expect("one release").1;
    assert_eq!(released["inventory"]["stock"], 10);
    assert_eq!(released["inventory"]["version"], 3);

    assert_eq!(app.stock_and_version(item).await, (10, 3), "stock returned exactly once");
    let stored = app.rows(&format!("SELECT status FROM reservations WHERE id = '{reservation}'")).await;
    assert_eq!(stored, [json!({ "status": "RELEASED" })]);
    app.assert_invariant().await;
}

at_every_isolation! { ten_releases_of_one_reservation_return_its_stock_once; }

#[tokio::test(flavor = "multi_thread")]
async fn only_the_owner_releases_a_reservation_and_order_lines_are_not_releasable() {
    let app = TestApp::spawn().await;
    let item = app.create_inventory("FREE-2", 10).await;
    let (alice, bob) = (app.token("alice", Role::Customer), app.token("bob", Role::Customer));
    let reserved = app.reserve(&alice, json!({ "inventoryId": item, "quantity": 1 })).await;
    let reservation = uuid(&reserved["reservation"]["id"]);
    let order = new_order(&app, &alice, item, 2).await;
    let line = uuid(&app.rows(&format!("SELECT id FROM reservations WHERE order_id = '{order}'")).await[0]["id"]);
    let snapshot = app.snapshot().await;

    let (name, result) = named(app.release(&bob, reservation).await);
    assert_eq!(name, "ReservationNotFound", "someone else's reservation reads as absent: {result}");
    assert_eq!(result["reservationId"], reservation.to_string());
    let (name, result) = named(app.release(&alice, line).await);
    assert_eq!(name, "ReservationNotActive", "an order line is released by cancelling the order: {result}");
    assert_eq!(result["reservation"]["status"], "ORDERED");

    assert_eq!(app.snapshot().await, snapshot, "nothing written");
    let mut statuses: Vec<String> =
        app.rows("SELECT status FROM reservations").await.iter().map(|r| r["status"].to_string()).collect();
    statuses.sort();
    assert_eq!(statuses, [r#""ACTIVE""#, r#""ORDERED""#], "both untouched");
    assert_eq!(order_row(&app, order).await["version"], 1);
    app.assert_invariant().await;
}

// ---------- 7. idempotent placeOrder ----------

async fn ten_repeats_of_one_checkout_place_one_order(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let item = app.create_inventory("CHECKOUT-1", 20).await;
    let alice = app.token("alice", Role::Customer);
    let input = json!({
        "items": [{ "inventoryId": item, "quantity": 2 }],
        "shippingAddress": address("1 Main Street"),
        "idempotencyKey": "checkout-1",
    });
    let requests = (0..10)
        .map(|_| {
            let (app, token, input) = (app.clone(), alice.clone(), input.clone());
            async move { named(app.place_order(&token, input).await) }.boxed()
        })
        .collect();
    let results = at_once(requests).await;
    assert_eq!(count(&results, "OrderPlaced"), 10, "every repeat gets the first outcome: {results:?}");
    let ids: HashSet<Uuid> = results.iter().map(|(_, r)| uuid(&r["order"]["id"])).collect();
    assert_eq!(ids.len(), 1, "one order for every repeat: {ids:?}");

    assert_eq!(app.stock_and_version(item).await, (18, 2), "stock taken once");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 1);
    app.assert_invariant().await;
}

at_every_isolation! { ten_repeats_of_one_checkout_place_one_order; }

#[tokio::test(flavor = "multi_thread")]
async fn a_checkout_key_reused_for_other_items_is_refused_and_writes_nothing() {
    let app = TestApp::spawn().await;
    let (x, y) = (app.create_inventory("REUSE-X", 20).await, app.create_inventory("REUSE-Y", 20).await);
    let alice = app.token("alice", Role::Customer);
    let input = |items: Value| json!({ "items": items, "shippingAddress": address("1 Main Street"), "idempotencyKey": "checkout-2" });
    let (name, first) = named(app.place_order(&alice, input(json!([{ "inventoryId": x, "quantity": 1 }]))).await);
    assert_eq!(name, "OrderPlaced", "{first}");
    let snapshot = app.snapshot().await;

    for items in [
        json!([{ "inventoryId": x, "quantity": 2 }]),
        json!([{ "inventoryId": y, "quantity": 1 }]),
        json!([{ "inventoryId": x, "quantity": 1 }, { "inventoryId": y, "quantity": 1 }]),
    ] {
        let (name, body) = named(app.place_order(&alice, input(items.clone())).await);
        assert_eq!(name, "ERROR", "{items}: {body}");
        assert_eq!(error_code(&body), Some("IDEMPOTENCY_KEY_REUSED"), "{items}: {body}");
    }
    assert_eq!(app.snapshot().await, snapshot, "nothing written");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);

    // The same request still replays the first order.
    let (name, replay) = named(app.place_order(&alice, input(json!([{ "inventoryId": x, "quantity": 1 }]))).await);
    assert_eq!(name, "OrderPlaced", "{replay}");
    assert_eq!(replay["order"]["id"], first["order"]["id"]);
    assert_eq!(app.snapshot().await, snapshot);
    app.assert_invariant().await;
}

// ---------- 8. who may do what ----------

#[tokio::test(flavor = "multi_thread")]
async fn customers_may_not_confirm_and_cannot_touch_other_customers_orders() {
    let app = TestApp::spawn().await;
    let item = app.create_inventory("WHO-1", 10).await;
    let (alice, bob) = (app.token("alice", Role::Customer), app.token("bob", Role::Customer));
    let id = new_order(&app, &alice, item, 1).await;
    let before = order_state(&app, id).await;
    let snapshot = app.snapshot().await;

    for token in [&alice, &bob] {
        let (name, body) = named(app.confirm(token, id).await);
        assert_eq!(name, "ERROR", "{body}");
        assert_eq!(error_code(&body), Some("FORBIDDEN"), "{body}");
    }
    let read = app.graphql(Some(&bob), ORDER, json!({ "id": id })).await;
    assert!(read.get("errors").is_none() && read["data"]["order"].is_null(), "alice's order reads as absent: {read}");
    let (name, result) = named(app.cancel(&bob, id).await);
    assert_eq!((name.as_str(), &result["orderId"]), ("OrderNotFound", &json!(id)), "{result}");
    let (name, result) = named(app.change_address(&bob, id, 1, &address("6 Thief Street")).await);
    assert_eq!((name.as_str(), &result["orderId"]), ("OrderNotFound", &json!(id)), "{result}");
    let anonymous = app.graphql(None, ORDER, json!({ "id": id })).await;
    assert_eq!(error_code(&anonymous), Some("UNAUTHENTICATED"), "{anonymous}");

    assert_eq!(order_state(&app, id).await, before, "nothing written");
    assert_eq!(app.snapshot().await, snapshot);
    // The owner and an operator do see it.
    for token in [&alice, &app.operator()] {
        let read = app.graphql(Some(token), ORDER, json!({ "id": id })).await;
        assert_eq!(read["data"]["order"]["userId"], "alice", "{read}");
    }
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn customers_list_only_their_own_orders_and_operators_list_all() {
    let app = TestApp::spawn().await;
    let item = app.create_inventory("LIST-1", 10).await;
    let (alice, bob, operator) = (app.token("alice", Role::Customer), app.token("bob", Role::Customer), app.operator());
    let alice_pending = new_order(&app, &alice, item, 1).await;
    let alice_cancelled = new_order(&app, &alice, item, 1).await;
    assert_eq!(named(app.cancel(&alice, alice_cancelled).await).0, "OrderCancelled");
    let bob_pending = new_order(&app, &bob, item, 1).await;

    let listed = |token: String, status: Value| {
        let app = &app;
        async move {
            let body = app.graphql(Some(&token), ORDERS, json!({ "status": status })).await;
            let nodes = body["data"]["orders"]["nodes"].as_array().unwrap_or_else(|| panic!("{body}")).clone();
            nodes.iter().map(|n| uuid(&n["id"])).collect::<BTreeSet<Uuid>>()
        }
    };
    assert_eq!(listed(alice.clone(), json!("PENDING")).await, BTreeSet::from([alice_pending]));
    assert_eq!(listed(alice.clone(), Value::Null).await, BTreeSet::from([alice_pending, alice_cancelled]));
    assert_eq!(listed(alice, json!("CANCELLED")).await, BTreeSet::from([alice_cancelled]));
    assert_eq!(listed(bob.clone(), json!("PENDING")).await, BTreeSet::from([bob_pending]));
    assert_eq!(listed(bob, json!("CANCELLED")).await, BTreeSet::new());
    assert_eq!(listed(operator.clone(), json!("PENDING")).await, BTreeSet::from([alice_pending, bob_pending]));
    assert_eq!(listed(operator, Value::Null).await, BTreeSet::from([alice_pending, alice_cancelled, bob_pending]));
    app.assert_invariant().await;
}

// ---------- 9. bad input ----------

#[tokio::test(flavor = "multi_thread")]
async fn bad_order_input_is_refused_and_writes_nothing() {
    let app = TestApp::spawn().await;
    let (x, y) = (app.create_inventory("BADORDER-X", 10).await, app.create_inventory("BADORDER-Y", 10).await);
    let alice = app.token("alice", Role::Customer);
    let existing = new_order(&app, &alice, x, 1).await;
    let before = order_state(&app, existing).await;
    let snapshot = app.snapshot().await;
    let line = |quantity: i32| json!({ "inventoryId": x, "quantity": quantity });
    let with_name = |name: &str| {
        let mut to = address("1 Main Street");
        to["name"] = json!(name);
        to
    };

    let cases = [
        ("no items", json!({ "items": [], "shippingAddress": address("1 Main Street") })),
        ("quantity 0", json!({ "items": [line(0)], "shippingAddress": address("1 Main Street") })),
        ("quantity above the maximum", json!({ "items": [line(1001)], "shippingAddress": address("1 Main Street") })),
        (
            "a bad line beside a good one",
            json!({ "items": [{ "inventoryId": y, "quantity": 1 }, line(-1)], "shippingAddress": address("1 Main Street") }),
        ),
        ("an empty name", json!({ "items": [line(1)], "shippingAddress": with_name("") })),
        ("a blank name", json!({ "items": [line(1)], "shippingAddress": with_name("   ") })),
        (
            "a blank idempotency key",
            json!({ "items": [line(1)], "shippingAddress": address("1 Main Street"), "idempotencyKey": "  " }),
        ),
        (
            "two versions of one inventory",
            json!({
                "items": [
                    { "inventoryId": x, "quantity": 1, "expectedVersion": 2 },
                    { "inventoryId": x, "quantity": 1, "expectedVersion": 3 },
                ],
                "shippingAddress": address("1 Main Street"),
            }),
        ),
    ];
    for (what, input) in cases {
        let (name, body) = named(app.place_order(&alice, input).await);
        assert_eq!(name, "ERROR", "{what}: {body}");
        assert_eq!(error_code(&body), Some("BAD_USER_INPUT"), "{what}: {body}");
        assert!(body["data"].is_null(), "{what}: no data for a refused mutation: {body}");
        assert_eq!(app.snapshot().await, snapshot, "{what} wrote nothing");
    }

    // The same rules hold for reserveMany and for a new address.
    let items = json!([
        { "inventoryId": y, "quantity": 1, "expectedVersion": 1 },
        { "inventoryId": y, "quantity": 1, "expectedVersion": 2 },
    ]);
    let (name, body) = named(app.reserve_many(&alice, items).await);
    assert_eq!((name.as_str(), error_code(&body)), ("ERROR", Some("BAD_USER_INPUT")), "{body}");
    let (name, body) = named(app.change_address(&alice, existing, 1, &with_name(" ")).await);
    assert_eq!((name.as_str(), error_code(&body)), ("ERROR", Some("BAD_USER_INPUT")), "{body}");

    assert_eq!(app.snapshot().await, snapshot);
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
    assert_eq!(order_state(&app, existing).await, before);
    app.assert_invariant().await;
}

// ---------- 10. fulfilment ----------

/// Per round: a CONFIRMED order of two lines of one inventory (a checked-out
/// cart), fulfilled twice at once. It ships once: one OrderFulfilled, one
/// FULFILLED ledger row and one version step per line.
async fn two_fulfilments_of_one_order_ship_it_once(isolation: Isolation, locking: OrderLocking, rounds: usize) {
    let app = Arc::new(TestApp::spawn_configured(isolation, limits(locking)).await);
    let item = app.create_inventory("SHIP-1", 1000).await;
    let (alice, operator) = (app.token("alice", Role::Customer), app.operator());
    for round in 0..rounds {
        let mut lines = Vec::new();
        for quantity in [1, 2] {
            let reserved = app.reserve(&alice, json!({ "inventoryId": item, "quantity": quantity })).await;
            lines.push(uuid(&reserved["reservation"]["id"]));
        }
        let input = json!({ "reservationIds": lines, "shippingAddress": address("1 Main Street") });
        let id = uuid(&app.checkout(&alice, input).await["order"]["id"]);
        assert_eq!(named(app.confirm(&operator, id).await).0, "OrderConfirmed");
        let (stock, version) = app.stock_and_version(item).await;
        let requests = (0..2)
            .map(|_| {
                let (app, token) = (app.clone(), operator.clone());
                async move { named(app.fulfill(&token, id).await) }.boxed()
            })
            .collect();
        let results = at_once(requests).await;
        let context = format!("round {round}: {results:?}");
        assert_eq!(count(&results, "OrderFulfilled"), 1, "{context}");
        let (other, answer) = results.iter().find(|(n, _)| n != "OrderFulfilled").expect("the other");
        match other.as_str() {
            "OrderCannotBeFulfilled" => assert_eq!(answer["order"]["status"], "FULFILLED", "{context}"),
            "OrderModifiedConcurrently" => assert_eq!(answer["orderId"], id.to_string(), "{context}"),
            _ => panic!("exactly one ships, without errors; {context}"),
        }
        assert_eq!(line_statuses(&app, id).await, ["FULFILLED", "FULFILLED"], "{context}");
        let shipped = app
            .count(&format!("SELECT count(*) FROM stock_movements WHERE reason = 'FULFILLED' AND order_id = '{id}'"))
            .await;
        assert_eq!(shipped, 2, "one ledger row per line, once; {context}");
        assert_eq!(app.stock_and_version(item).await, (stock, version + 2), "{context}");
        assert_eq!(order_row(&app, id).await["version"], 3, "{context}");
    }
    app.assert_invariant().await;
}

at_every_isolation! {
    two_fulfilments_of_one_order_ship_it_once_optimistic => |isolation| {
        two_fulfilments_of_one_order_ship_it_once(isolation, OrderLocking::Optimistic, race_rounds(isolation, OrderLocking::Optimistic))
    };
    two_fulfilments_of_one_order_ship_it_once_pessimistic => |isolation| {
        two_fulfilments_of_one_order_ship_it_once(isolation, OrderLocking::Pessimistic, race_rounds(isolation, OrderLocking::Pessimistic))
    };
}
