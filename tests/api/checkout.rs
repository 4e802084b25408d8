//! From cart to shipment: a cart's reservations checked out into an order
//! (all or nothing, no stock moved), the order confirmed and fulfilled, and
//! every stock state read back through the API and straight from the
//! database. The races of a checkout (the sweeper on a line expiring at that
//! instant, a release, a second checkout, an extension) run at every
//! isolation level, each round checked from the database.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::future::FutureExt;
use sea_orm::ConnectionTrait;
use serde_json::{Value, json};
use stockguard::auth::Role;
use uuid::Uuid;

use crate::{
    helpers::{Isolation, TestApp, address, at_every_isolation, at_once, count, error_code, named, names, uuid},
    orders::{line_statuses, order_row},
};

// ---------- helpers ----------

/// Reserves each `(inventory, quantity)` for `token`; the reservations' ids, in order.
async fn cart(app: &TestApp, token: &str, lines: &[(Uuid, i32)]) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for (inventory, quantity) in lines {
        let reserved = app.reserve(token, json!({ "inventoryId": inventory, "quantity": quantity })).await;
        assert_eq!(reserved["__typename"], "Reserved", "{reserved}");
        ids.push(uuid(&reserved["reservation"]["id"]));
    }
    ids
}

/// The input of a checkout of `ids`, with `key` when given.
fn checkout_of(ids: &[Uuid], key: Option<&str>) -> Value {
    json!({ "reservationIds": ids, "shippingAddress": address("1 Cart Street"), "idempotencyKey": key })
}

/// Sweeps until nothing more is due.
async fn sweep_all(app: &TestApp) -> i64 {
    crate::helpers::sweep_all(&app.db, 100).await
}

/// Moves the expiry of reservation `id` to `offset_ms` from now (negative: past).
async fn expire_in(app: &TestApp, id: Uuid, offset_ms: i64) {
    app.db
        .execute_unprepared(&format!(
            "UPDATE reservations SET expires_at = clock_timestamp() + {offset_ms} * interval '1 millisecond' \
             WHERE id = '{id}'"
        ))
        .await
        .expect("move the expiry");
}

/// The reservation's row, every column.
async fn reservation_row(app: &TestApp, id: Uuid) -> Value {
    let mut rows = app.rows(&format!("SELECT * FROM reservations WHERE id = '{id}'")).await;
    assert_eq!(rows.len(), 1, "reservation {id} has one row");
    rows.remove(0)
}

/// The ledger of an inventory, oldest first: `(reason, delta, stock_after, version_after)`.
async fn ledger(app: &TestApp, inventory: Uuid) -> Vec<(String, i64, i64, i64)> {
    app.rows(&format!(
        "SELECT reason, delta, stock_after, version_after FROM stock_movements \
         WHERE inventory_id = '{inventory}' ORDER BY version_after"
    ))
    .await
    .iter()
    .map(|r| {
        let n = |c: &str| r[c].as_i64().expect("number");
        (r["reason"].as_str().expect("reason").to_owned(), n("delta"), n("stock_after"), n("version_after"))
    })
    .collect()
}

// ---------- the flow ----------

#[tokio::test(flavor = "multi_thread")]
async fn a_cart_is_checked_out_confirmed_and_fulfilled_and_every_stock_state_follows() {
    let app = TestApp::without_sweeper(Isolation::ReadCommitted).await;
    let (x, y) = (app.create_inventory("FLOW-X", 10).await, app.create_inventory("FLOW-Y", 5).await);
    let (alice, operator) = (app.token("alice", Role::Customer), app.operator());
    // Two lines of X (reserved twice) and one of Y.
    let ids = cart(&app, &alice, &[(x, 2), (y, 1), (x, 3)]).await;
    assert_eq!(app.states(x).await, [5, 5, 0, 10], "available, reserved, committed, on hand");
    assert_eq!(app.states(y).await, [4, 1, 0, 5]);
    let before = (app.stock_and_version(x).await, app.stock_and_version(y).await);
    let movements = app.count("SELECT count(*) FROM stock_movements").await;

    // Checkout: the reservations become the order's lines; no stock moves.
    let (name, placed) = named(app.checkout(&alice, checkout_of(&ids, None)).await);
    assert_eq!(name, "OrderPlaced", "{placed}");
    let order = &placed["order"];
    let id = uuid(&order["id"]);
    assert_eq!(
        (&order["status"], &order["userId"], &order["version"]),
        (&json!("PENDING"), &json!("alice"), &json!(1))
    );
    assert_eq!(order["shippingAddress"], address("1 Cart Street"));
    let mut items: Vec<(Uuid, i64)> = order["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| (uuid(&item["inventory"]["id"]), item["quantity"].as_i64().expect("quantity")))
        .collect();
    items.sort();
    let mut expected = vec![(x, 2), (x, 3), (y, 1)];
    expected.sort();
    assert_eq!(items, expected, "one line per reservation, with its quantity");
    for rid in &ids {
        let row = reservation_row(&app, *rid).await;
        assert_eq!((&row["status"], &row["order_id"]), (&json!("ORDERED"), &json!(id)), "{row}");
        assert!(row["expires_at"].is_null(), "an order line never expires: {row}");
    }
    assert_eq!((app.stock_and_version(x).await, app.stock_and_version(y).await), before, "stock and versions stay");
    assert_eq!(app.count("SELECT count(*) FROM stock_movements").await, movements, "no ledger row: no stock moved");
    assert_eq!(app.states(x).await, [5, 0, 5, 10], "reserved became committed");
    assert_eq!(app.states(y).await, [4, 0, 1, 5]);
    app.assert_invariant().await;

    // Confirming keeps everything where it is.
    assert_eq!(named(app.confirm(&operator, id).await).0, "OrderConfirmed");
    assert_eq!(app.states(x).await, [5, 0, 5, 10]);

    // Fulfilling ships the lines: committed and on hand fall, available stays;
    // each line is one change of its inventory with its FULFILLED ledger row.
    let (name, fulfilled) = named(app.fulfill(&operator, id).await);
    assert_eq!(name, "OrderFulfilled", "{fulfilled}");
    let order = &fulfilled["order"];
    assert_eq!((&order["status"], &order["version"]), (&json!("FULFILLED"), &json!(3)), "{order}");
    assert_eq!(order["fulfilledBy"], "operator");
    assert!(order["fulfilledAt"].is_string() && order["confirmedAt"].is_string(), "still confirmed: {order}");
    let row = order_row(&app, id).await;
    assert_eq!((&row["status"], &row["fulfilled_by"]), (&json!("FULFILLED"), &json!("operator")), "{row}");
    assert!(!row["fulfilled_at"].is_null() && !row["confirmed_at"].is_null(), "{row}");
    assert_eq!(line_statuses(&app, id).await, ["FULFILLED", "FULFILLED", "FULFILLED"]);
    assert_eq!(app.states(x).await, [5, 0, 0, 5]);
    assert_eq!(app.states(y).await, [4, 0, 0, 4]);
    assert_eq!(app.stock_and_version(x).await, (5, before.0.1 + 2), "one version step per line");
    assert_eq!(app.stock_and_version(y).await, (4, before.1.1 + 1));
    let shipped: Vec<_> = ledger(&app, x).await.into_iter().filter(|(reason, ..)| reason == "FULFILLED").collect();
    let v = i64::from(before.0.1);
    let mut deltas: Vec<i64> = shipped.iter().map(|(_, delta, ..)| *delta).collect();
    deltas.sort();
    assert_eq!(deltas, [-3, -2], "delta = -quantity per line: {shipped:?}");
    assert!(shipped.iter().all(|(_, _, stock_after, _)| *stock_after == 5), "stock after stays: {shipped:?}");
    assert_eq!(shipped.iter().map(|(.., version)| *version).collect::<Vec<_>>(), [v + 1, v + 2]);
    app.assert_invariant().await;

    // A fulfilled order is final.
    let snapshot = app.snapshot().await;
    let (name, result) = named(app.cancel(&alice, id).await);
    assert_eq!((name.as_str(), &result["order"]["status"]), ("OrderCannotBeCancelled", &json!("FULFILLED")));
    let (name, result) = named(app.fulfill(&operator, id).await);
    assert_eq!((name.as_str(), &result["order"]["status"]), ("OrderCannotBeFulfilled", &json!("FULFILLED")));
    assert_eq!(app.snapshot().await, snapshot, "nothing written");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn only_confirmed_orders_are_fulfilled_and_only_by_operators() {
    let app = TestApp::spawn().await;
    let item = app.create_inventory("FULFIL-1", 10).await;
    let alice = app.token("alice", Role::Customer);
    let ids = cart(&app, &alice, &[(item, 2)]).await;
    let id = uuid(&app.checkout(&alice, checkout_of(&ids, None)).await["order"]["id"]);
    let snapshot = app.snapshot().await;

    let (name, result) = named(app.fulfill(&app.operator(), id).await);
    assert_eq!((name.as_str(), &result["order"]["status"]), ("OrderCannotBeFulfilled", &json!("PENDING")));
    let refused = app.fulfill(&alice, id).await;
    assert_eq!(error_code(&refused), Some("FORBIDDEN"), "{refused}");
    let missing = Uuid::new_v4();
    let (name, result) = named(app.fulfill(&app.operator(), missing).await);
    assert_eq!((name.as_str(), &result["orderId"]), ("OrderNotFound", &json!(missing)));
    assert_eq!(app.snapshot().await, snapshot, "nothing written");

    // A cancelled order's stock came back; it cannot be fulfilled either.
    assert_eq!(named(app.cancel(&alice, id).await).0, "OrderCancelled");
    let (name, result) = named(app.fulfill(&app.operator(), id).await);
    assert_eq!((name.as_str(), &result["order"]["status"]), ("OrderCannotBeFulfilled", &json!("CANCELLED")));
    assert_eq!(app.states(item).await, [10, 0, 0, 10]);
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_a_checked_out_order_returns_every_line_even_two_of_one_inventory() {
    let app = TestApp::spawn().await;
    let item = app.create_inventory("CANCEL-2", 10).await;
    let alice = app.token("alice", Role::Customer);
    let ids = cart(&app, &alice, &[(item, 2), (item, 3)]).await;
    let id = uuid(&app.checkout(&alice, checkout_of(&ids, None)).await["order"]["id"]);
    let (_, version) = app.stock_and_version(item).await;

    assert_eq!(named(app.cancel(&alice, id).await).0, "OrderCancelled");
    assert_eq!(app.stock_and_version(item).await, (10, version + 2), "both lines back, one change each");
    let returned: Vec<_> =
        ledger(&app, item).await.into_iter().filter(|(reason, ..)| reason == "ORDER_CANCELLED").collect();
    let mut steps: Vec<(i64, i64)> = returned.iter().map(|(_, delta, stock, _)| (*delta, *stock)).collect();
    steps.sort();
    assert!(steps == [(2, 7), (3, 10)] || steps == [(2, 10), (3, 8)], "a running stock per line: {returned:?}");
    assert_eq!(line_statuses(&app, id).await, ["RELEASED", "RELEASED"]);
    app.assert_invariant().await;
}

// ---------- scenarios: what a checkout refuses ----------

#[tokio::test(flavor = "multi_thread")]
async fn an_expired_cart_cannot_be_checked_out() {
    let app = TestApp::without_sweeper(Isolation::ReadCommitted).await;
    let (x, y) = (app.create_inventory("EXPIRED-X", 10).await, app.create_inventory("EXPIRED-Y", 10).await);
    let alice = app.token("alice", Role::Customer);
    let ids = cart(&app, &alice, &[(x, 2), (y, 1)]).await;
    // Both due, neither swept yet.
    expire_in(&app, ids[0], -1000).await;
    expire_in(&app, ids[1], -1000).await;
    let snapshot = app.snapshot().await;

    let (name, result) = named(app.checkout(&alice, checkout_of(&ids, None)).await);
    assert_eq!(name, "ReservationsUnavailable", "{result}");
    let listed = result["reservations"].as_array().expect("reservations");
    assert_eq!(listed.len(), 2, "{result}");
    let mut sorted = ids.clone();
    sorted.sort();
    for (item, id) in listed.iter().zip(&sorted) {
        assert_eq!(uuid(&item["reservationId"]), *id, "{result}");
        assert_eq!(item["reason"], "EXPIRED", "{result}");
        assert_eq!(item["reservation"]["status"], "EXPIRED", "due reads as expired before the sweep: {result}");
    }
    assert_eq!(app.snapshot().await, snapshot, "nothing written");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 0);
    // Until the sweep their units are still held, then they are available.
    assert_eq!(app.states(x).await, [8, 2, 0, 10]);
    assert_eq!(sweep_all(&app).await, 2);
    assert_eq!(app.states(x).await, [10, 0, 0, 10]);
    let (name, result) = named(app.checkout(&alice, checkout_of(&ids, None)).await);
    assert_eq!(name, "ReservationsUnavailable", "{result}");
    assert!(result["reservations"].as_array().expect("listed").iter().all(|r| r["reason"] == "EXPIRED"));
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cart_with_one_released_line_places_nothing() {
    let app = TestApp::spawn().await;
    let (x, y, z) = (
        app.create_inventory("RELEASED-X", 10).await,
        app.create_inventory("RELEASED-Y", 10).await,
        app.create_inventory("RELEASED-Z", 10).await,
    );
    let alice = app.token("alice", Role::Customer);
    let ids = cart(&app, &alice, &[(x, 1), (y, 2), (z, 3)]).await;
    assert_eq!(named(app.release(&alice, ids[1]).await).0, "ReservationReleased");
    let snapshot = app.snapshot().await;

    let (name, result) = named(app.checkout(&alice, checkout_of(&ids, None)).await);
    assert_eq!(name, "ReservationsUnavailable", "{result}");
    assert_eq!(
        result["reservations"],
        json!([{
            "reservationId": ids[1],
            "reason": "RELEASED",
            "reservation": { "id": ids[1], "status": "RELEASED", "quantity": 2, "expiresAt": result["reservations"][0]["reservation"]["expiresAt"] },
        }]),
        "only the failing line is listed"
    );
    assert_eq!(app.snapshot().await, snapshot, "nothing written");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 0);
    for id in [ids[0], ids[2]] {
        let row = reservation_row(&app, id).await;
        assert_eq!((&row["status"], &row["order_id"]), (&json!("ACTIVE"), &Value::Null), "untouched: {row}");
        assert!(!row["expires_at"].is_null(), "its expiry kept: {row}");
    }
    // Without the released line the rest checks out.
    let (name, result) = named(app.checkout(&alice, checkout_of(&[ids[0], ids[2]], None)).await);
    assert_eq!(name, "OrderPlaced", "{result}");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_checkout_lists_every_failing_reservation_with_its_reason() {
    let app = TestApp::without_sweeper(Isolation::ReadCommitted).await;
    let item = app.create_inventory("REASONS-1", 20).await;
    let (alice, bob) = (app.token("alice", Role::Customer), app.token("bob", Role::Customer));
    let [good, expired, released, ordered] =
        cart(&app, &alice, &[(item, 1), (item, 1), (item, 1), (item, 1)]).await.try_into().expect("four");
    let bobs = cart(&app, &bob, &[(item, 1)]).await[0];
    let unknown = Uuid::new_v4();
    expire_in(&app, expired, -1000).await;
    app.release(&alice, released).await;
    assert_eq!(named(app.checkout(&alice, checkout_of(&[ordered], None)).await).0, "OrderPlaced");
    let snapshot = app.snapshot().await;

    let all = [good, expired, released, ordered, bobs, unknown];
    let (name, result) = named(app.checkout(&alice, checkout_of(&all, None)).await);
    assert_eq!(name, "ReservationsUnavailable", "{result}");
    let mut listed: Vec<(Uuid, String, Value)> = result["reservations"]
        .as_array()
        .expect("reservations")
        .iter()
        .map(|r| {
            (uuid(&r["reservationId"]), r["reason"].as_str().expect("reason").to_owned(), r["reservation"].clone())
        })
        .collect();
    listed.sort_by_key(|(id, ..)| *id);
    let mut expected = vec![
        (expired, "EXPIRED", "EXPIRED"),
        (released, "RELEASED", "RELEASED"),
        (ordered, "ORDERED", "ORDERED"),
        (bobs, "NOT_FOUND", ""),
        (unknown, "NOT_FOUND", ""),
    ];
    expected.sort_by_key(|(id, ..)| *id);
    assert_eq!(listed.len(), expected.len(), "every failing one, and only those: {result}");
    for ((id, reason, reservation), (want_id, want_reason, want_status)) in listed.iter().zip(&expected) {
        assert_eq!((id, reason.as_str()), (want_id, *want_reason), "{result}");
        if want_status.is_empty() {
            assert!(reservation.is_null(), "someone else's or unknown reads as absent: {result}");
        } else {
            assert_eq!(reservation["status"], *want_status, "{result}");
        }
    }
    assert_eq!(app.snapshot().await, snapshot, "nothing written");
    assert_eq!(reservation_row(&app, good).await["status"], "ACTIVE");
    assert_eq!(reservation_row(&app, bobs).await["status"], "ACTIVE");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_checkout_input_is_refused_and_writes_nothing() {
    let app = TestApp::spawn().await;
    let item = app.create_inventory("BADCART-1", 200).await;
    let alice = app.token("alice", Role::Customer);
    let ids = cart(&app, &alice, &[(item, 1)]).await;
    let snapshot = app.snapshot().await;
    let mut blank_name = checkout_of(&ids, None);
    blank_name["shippingAddress"]["name"] = json!("  ");
    let too_many: Vec<Uuid> = (0..101).map(|_| Uuid::new_v4()).collect();
    for (what, input) in [
        ("no reservations", checkout_of(&[], None)),
        ("101 reservations", checkout_of(&too_many, None)),
        ("a blank name", blank_name),
        ("a blank key", checkout_of(&ids, Some("  "))),
    ] {
        let body = app.checkout(&alice, input).await;
        assert_eq!(error_code(&body), Some("BAD_USER_INPUT"), "{what}: {body}");
        assert_eq!(app.snapshot().await, snapshot, "{what} wrote nothing");
    }
    let anonymous = app.graphql(None, crate::documents::CHECKOUT, json!({ "input": checkout_of(&ids, None) })).await;
    assert_eq!(error_code(&anonymous), Some("UNAUTHENTICATED"), "{anonymous}");
    // One id named twice is one line.
    let (name, placed) = named(app.checkout(&alice, checkout_of(&[ids[0], ids[0]], None)).await);
    assert_eq!(name, "OrderPlaced", "{placed}");
    assert_eq!(placed["order"]["items"].as_array().map(Vec::len), Some(1), "{placed}");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
    app.assert_invariant().await;
}

// ---------- idempotency ----------

#[tokio::test(flavor = "multi_thread")]
async fn a_checkout_replay_returns_the_first_order() {
    let app = TestApp::spawn().await;
    let (x, y) = (app.create_inventory("REPLAY-X", 10).await, app.create_inventory("REPLAY-Y", 10).await);
    let alice = app.token("alice", Role::Customer);
    let ids = cart(&app, &alice, &[(x, 1), (y, 2)]).await;
    let (name, first) = named(app.checkout(&alice, checkout_of(&ids, Some("cart-1"))).await);
    assert_eq!(name, "OrderPlaced", "{first}");
    let snapshot = app.snapshot().await;

    // The same request, its ids in another order: the first order, nothing written.
    let reversed: Vec<Uuid> = ids.iter().rev().copied().collect();
    let (name, replay) = named(app.checkout(&alice, checkout_of(&reversed, Some("cart-1"))).await);
    assert_eq!(name, "OrderPlaced", "{replay}");
    assert_eq!(replay["order"]["id"], first["order"]["id"]);
    assert_eq!(app.snapshot().await, snapshot);
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
    // Still the first order once it has moved on, as it is now.
    let id = uuid(&first["order"]["id"]);
    assert_eq!(named(app.confirm(&app.operator(), id).await).0, "OrderConfirmed");
    let (_, replay) = named(app.checkout(&alice, checkout_of(&ids, Some("cart-1"))).await);
    assert_eq!((&replay["order"]["id"], &replay["order"]["status"]), (&json!(id), &json!("CONFIRMED")));

    // The key with another cart or another address is a reuse.
    let other = cart(&app, &alice, &[(x, 1)]).await;
    let mut elsewhere = checkout_of(&ids, Some("cart-1"));
    elsewhere["shippingAddress"] = address("2 Other Road");
    for (what, input) in [("another cart", checkout_of(&other, Some("cart-1"))), ("another address", elsewhere)] {
        let body = app.checkout(&alice, input).await;
        assert_eq!(error_code(&body), Some("IDEMPOTENCY_KEY_REUSED"), "{what}: {body}");
    }
    // Another user's key space is their own.
    let bob = app.token("bob", Role::Customer);
    let bobs = cart(&app, &bob, &[(y, 1)]).await;
    assert_eq!(named(app.checkout(&bob, checkout_of(&bobs, Some("cart-1"))).await).0, "OrderPlaced");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reserve_place_order_and_checkout_share_one_key_space() {
    let app = TestApp::spawn().await;
    let item = app.create_inventory("KEYSPACE-1", 10).await;
    let alice = app.token("alice", Role::Customer);
    let ids = cart(&app, &alice, &[(item, 1)]).await;
    assert_eq!(named(app.checkout(&alice, checkout_of(&ids, Some("shared"))).await).0, "OrderPlaced");
    let reserved = app.reserve(&alice, json!({ "inventoryId": item, "idempotencyKey": "reserved" })).await;
    assert_eq!(reserved["__typename"], "Reserved", "{reserved}");
    let snapshot = app.snapshot().await;

    // A checkout's key is refused for a reservation or an order, and back.
    let reserve = app.reserve(&alice, json!({ "inventoryId": item, "idempotencyKey": "shared" })).await;
    assert_eq!(error_code(&reserve), Some("IDEMPOTENCY_KEY_REUSED"), "{reserve}");
    let items = json!([{ "inventoryId": item, "quantity": 1 }]);
    let input = json!({ "items": items, "shippingAddress": address("1 Cart Street"), "idempotencyKey": "shared" });
    let placed = app.place_order(&alice, input).await;
    assert_eq!(error_code(&placed), Some("IDEMPOTENCY_KEY_REUSED"), "{placed}");
    let rid = uuid(&reserved["reservation"]["id"]);
    let checkout = app.checkout(&alice, checkout_of(&[rid], Some("reserved"))).await;
    assert_eq!(error_code(&checkout), Some("IDEMPOTENCY_KEY_REUSED"), "{checkout}");
    assert_eq!(app.snapshot().await, snapshot, "nothing written");
    app.assert_invariant().await;
}

async fn ten_repeats_of_one_keyed_checkout_place_one_order(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let (x, y) = (app.create_inventory("REPEAT-X", 10).await, app.create_inventory("REPEAT-Y", 10).await);
    let alice = app.token("alice", Role::Customer);
    let ids = cart(&app, &alice, &[(x, 2), (y, 1)]).await;
    let before = (app.stock_and_version(x).await, app.stock_and_version(y).await);
    let requests = (0..10)
        .map(|_| {
            let (app, token, input) = (app.clone(), alice.clone(), checkout_of(&ids, Some("double-submit")));
            async move { named(app.checkout(&token, input).await) }.boxed()
        })
        .collect();
    let results = at_once(requests).await;
    assert_eq!(count(&results, "OrderPlaced"), 10, "every repeat gets the first order: {:?}", names(&results));
    let orders: std::collections::HashSet<&Value> = results.iter().map(|(_, r)| &r["order"]["id"]).collect();
    assert_eq!(orders.len(), 1, "one order: {orders:?}");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
    assert_eq!((app.stock_and_version(x).await, app.stock_and_version(y).await), before, "no stock moved");
    app.assert_invariant().await;
}

// ---------- races ----------

/// Rounds of each checkout race.
const ROUNDS: usize = 25;

/// Per round: one reservation expiring at about the moment a checkout of it
/// and a busy sweeper start together (the expiry is spread from a little
/// before to a little after that moment, round by round). Exactly one wins:
/// the order holds the line and its stock stays taken, or the reservation is
/// EXPIRED and its stock is back; never both (an oversell), never neither.
async fn checkout_racing_the_sweeper_lets_exactly_one_win(isolation: Isolation) {
    let app = Arc::new(TestApp::without_sweeper(isolation).await);
    let item = app.create_inventory("EXPIRING-1", 1000).await;
    let alice = app.token("alice", Role::Customer);
    let (mut ordered, mut expired) = (0, 0);
    for round in 0..ROUNDS {
        let id = cart(&app, &alice, &[(item, 2)]).await[0];
        let (stock, _) = app.stock_and_version(item).await;
        let offset_ms = (round % 5) as i64 * 10 - 20;
        expire_in(&app, id, offset_ms).await;
        let checkout = {
            let (app, token) = (app.clone(), alice.clone());
            async move { named(app.checkout(&token, checkout_of(&[id], None)).await) }.boxed()
        };
        let sweeping = {
            let app = app.clone();
            async move {
                // A sweeper that sweeps on until the moment has well passed.
                let until = Instant::now() + Duration::from_millis(offset_ms.max(0) as u64 + 100);
                let mut swept = 0;
                while Instant::now() < until {
                    swept += sweep_all(&app).await;
                }
                (String::new(), json!(swept))
            }
            .boxed()
        };
        let results = at_once(vec![checkout, sweeping]).await;
        let (name, answer) = &results[0];
        // What the sweeper would still do later.
        let swept = results[1].1.as_i64().expect("swept") + sweep_all(&app).await;
        let context = format!("round {round} (expiry {offset_ms:+} ms): {name} {answer}, swept {swept}");

        let row = reservation_row(&app, id).await;
        let expiries = app
            .count(&format!(
                "SELECT count(*) FROM stock_movements WHERE reason = 'EXPIRED' AND reservation_id = '{id}'"
            ))
            .await;
        let orders =
            app.count(&format!("SELECT count(*) FROM reservations WHERE id = '{id}' AND order_id IS NOT NULL")).await;
        match name.as_str() {
            "OrderPlaced" => {
                ordered += 1;
                assert_eq!((&row["status"], orders, expiries, swept), (&json!("ORDERED"), 1, 0, 0), "{context}; {row}");
                assert_eq!(app.stock_and_version(item).await.0, stock, "its stock stays taken; {context}");
            }
            "ReservationsUnavailable" => {
                expired += 1;
                assert_eq!(answer["reservations"][0]["reason"], "EXPIRED", "{context}");
                assert_eq!((&row["status"], orders, expiries, swept), (&json!("EXPIRED"), 0, 1, 1), "{context}; {row}");
                assert_eq!(app.stock_and_version(item).await.0, stock + 2, "its stock is back; {context}");
            }
            _ => panic!("a checkout answers OrderPlaced or ReservationsUnavailable; {context}"),
        }
        app.assert_invariant().await;
    }
    eprintln!("checkout vs sweeper at {isolation:?}: {ordered} ordered, {expired} expired in {ROUNDS} rounds");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, ordered);
}

/// Per round: a cart of two lines checked out while its owner releases the
/// second. One wins: an order holding both lines, or the release with its
/// stock back and no order.
async fn checkout_racing_a_release_lets_one_win(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let (x, y) = (app.create_inventory("RACE-X", 1000).await, app.create_inventory("RACE-Y", 1000).await);
    let alice = app.token("alice", Role::Customer);
    let mut ordered = 0;
    for round in 0..ROUNDS {
        let ids = cart(&app, &alice, &[(x, 1), (y, 2)]).await;
        let (y_stock, _) = app.stock_and_version(y).await;
        let checkout = {
            let (app, token, input) = (app.clone(), alice.clone(), checkout_of(&ids, None));
            async move { named(app.checkout(&token, input).await) }.boxed()
        };
        let release = {
            let (app, token, line) = (app.clone(), alice.clone(), ids[1]);
            async move { named(app.release(&token, line).await) }.boxed()
        };
        let results = at_once(vec![checkout, release]).await;
        let ((checkout_name, checkout), (release_name, release)) = (&results[0], &results[1]);
        let context = format!("round {round}: {checkout_name} {checkout}, {release_name} {release}");
        let statuses = [reservation_row(&app, ids[0]).await, reservation_row(&app, ids[1]).await]
            .map(|row| row["status"].as_str().expect("status").to_owned());
        match (checkout_name.as_str(), release_name.as_str()) {
            ("OrderPlaced", "ReservationNotActive") => {
                ordered += 1;
                assert_eq!(release["reservation"]["status"], "ORDERED", "{context}");
                assert_eq!(statuses, ["ORDERED", "ORDERED"], "{context}");
                assert_eq!(app.stock_and_version(y).await.0, y_stock, "{context}");
            }
            ("ReservationsUnavailable", "ReservationReleased") => {
                let listed = &checkout["reservations"];
                assert_eq!(listed.as_array().map(Vec::len), Some(1), "{context}");
                assert_eq!((uuid(&listed[0]["reservationId"]), &listed[0]["reason"]), (ids[1], &json!("RELEASED")));
                assert_eq!(statuses, ["ACTIVE", "RELEASED"], "{context}");
                assert_eq!(app.stock_and_version(y).await.0, y_stock + 2, "{context}");
            }
            _ => panic!("exactly one must win, without errors; {context}"),
        }
        app.assert_invariant().await;
    }
    eprintln!("checkout vs release at {isolation:?}: {ordered} ordered of {ROUNDS}");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, ordered);
}

/// Per round: one cart checked out twice at once (a double submit without a
/// key): exactly one order, the other answer lists every line as ORDERED.
async fn two_checkouts_of_one_cart_place_one_order(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let (x, y) = (app.create_inventory("TWICE-X", 1000).await, app.create_inventory("TWICE-Y", 1000).await);
    let alice = app.token("alice", Role::Customer);
    for round in 0..ROUNDS {
        let ids = cart(&app, &alice, &[(x, 1), (y, 1)]).await;
        let requests = (0..2)
            .map(|_| {
                let (app, token, input) = (app.clone(), alice.clone(), checkout_of(&ids, None));
                async move { named(app.checkout(&token, input).await) }.boxed()
            })
            .collect();
        let results = at_once(requests).await;
        let context = format!("round {round}: {results:?}");
        assert_eq!(count(&results, "OrderPlaced"), 1, "{context}");
        assert_eq!(count(&results, "ReservationsUnavailable"), 1, "{context}");
        let (_, placed) = results.iter().find(|(n, _)| n == "OrderPlaced").expect("placed");
        let (_, refused) = results.iter().find(|(n, _)| n == "ReservationsUnavailable").expect("refused");
        let listed = refused["reservations"].as_array().expect("reservations");
        assert_eq!(listed.len(), 2, "{context}");
        assert!(
            listed.iter().all(|r| r["reason"] == "ORDERED" && r["reservation"]["status"] == "ORDERED"),
            "{context}"
        );
        let order = uuid(&placed["order"]["id"]);
        assert_eq!(line_statuses(&app, order).await, ["ORDERED", "ORDERED"], "{context}");
        assert_eq!(app.count("SELECT count(*) FROM orders").await, round as i64 + 1, "{context}");
    }
    app.assert_invariant().await;
}

/// Per round: a line checked out while its owner extends it. Either way the
/// order holds the line, which no longer expires; the extension happened
/// before (extended) or found an order line (not active).
async fn checkout_racing_an_extension_is_consistent_either_way(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let item = app.create_inventory("EXTEND-1", 1000).await;
    let alice = app.token("alice", Role::Customer);
    let mut extended_first = 0;
    for round in 0..ROUNDS {
        let id = cart(&app, &alice, &[(item, 1)]).await[0];
        let checkout = {
            let (app, token) = (app.clone(), alice.clone());
            async move { named(app.checkout(&token, checkout_of(&[id], None)).await) }.boxed()
        };
        let extend = {
            let (app, token) = (app.clone(), alice.clone());
            async move { named(app.extend(&token, id, 60).await) }.boxed()
        };
        let results = at_once(vec![checkout, extend]).await;
        let context = format!("round {round}: {results:?}");
        assert_eq!(results[0].0, "OrderPlaced", "an extension never stands in a checkout's way; {context}");
        match results[1].0.as_str() {
            "ReservationExtended" => extended_first += 1,
            "ReservationNotActive" => assert_eq!(results[1].1["reservation"]["status"], "ORDERED", "{context}"),
            _ => panic!("{context}"),
        }
        let row = reservation_row(&app, id).await;
        assert_eq!(row["status"], "ORDERED", "{context}");
        assert!(row["expires_at"].is_null(), "an order line never expires, extended or not; {context}");
    }
    eprintln!("checkout vs extension at {isolation:?}: extended first in {extended_first} of {ROUNDS}");
    app.assert_invariant().await;
}

at_every_isolation! {
    checkout_racing_the_sweeper_lets_exactly_one_win;
    checkout_racing_a_release_lets_one_win;
    two_checkouts_of_one_cart_place_one_order;
    checkout_racing_an_extension_is_consistent_either_way;
    ten_repeats_of_one_keyed_checkout_place_one_order;
}
