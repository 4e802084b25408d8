//! From cart to shipment: a cart's reservations checked out into an order
//! (all or nothing, no stock moved), the order confirmed and fulfilled, and
//! every stock state read back through the API and straight from the
//! database. The races of a checkout (the sweeper on a line expiring at that
//! instant, a release, a second checkout, an extension) run at every
//! isolation level, each round checked from the database.

mod idempotency;
mod races;
mod refusals;

use self::idempotency::*;

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
    helpers::{
        Isolation, TestApp, address, at_every_isolation, at_once, count, error_code, named, names, order_lines, uuid,
    },
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
    let mut expected = vec![(x, 2), (x, 3), (y, 1)];
    expected.sort();
    assert_eq!(order_lines(order), expected, "one line per reservation, with its quantity");
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
