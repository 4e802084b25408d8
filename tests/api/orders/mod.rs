//! Orders and multi-line reservations: races between confirm and cancel,
//! opposite `reserveMany` requests, stale address edits, exhausted retries,
//! lock timeouts, releases, idempotency, visibility and bad input. Every
//! outcome is checked straight from the database afterwards.

mod confirm_and_cancel;
mod contention;
mod keys_and_roles;
mod lines_and_addresses;

use self::confirm_and_cancel::*;

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
    helpers::{
        Isolation, TestApp, address, at_every_isolation, at_once, count, error_code, named, names, order_lines, uuid,
    },
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
    let mut expected = vec![(x, 5), (y, 1)];
    expected.sort();
    assert_eq!(order_lines(order), expected, "lines naming the same inventory are merged");

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
