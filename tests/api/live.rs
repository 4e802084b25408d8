//! Live stock over a real websocket, in both protocols, and the metrics page.

use std::time::Duration;

use serde_json::json;
use stockguard::auth::Role;
use uuid::Uuid;

use crate::{
    helpers::TestApp,
    ws::{SUBSCRIPTION, connect, next, send},
};

/// Waits until the server has registered the subscription's watcher, so
/// changes made from now on are announced.
async fn until_watched(app: &TestApp, id: Uuid) {
    for _ in 0..200 {
        if app.count(&format!("SELECT count(*) FROM inventory_watchers WHERE inventory_id = '{id}'")).await > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the subscription never registered its watcher");
}

async fn three_reservations_arrive_in_order(protocol: &str, subscribe: &str, data: &str) {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("LIVE-1", 10).await;
    let mut socket = connect(&app.address, protocol).await;
    send(
        &mut socket,
        json!({ "id": "1", "type": subscribe, "payload": { "query": SUBSCRIPTION, "variables": { "id": id } } }),
    )
    .await;
    until_watched(&app, id).await;

    let alice = app.token("alice", Role::Customer);
    for quantity in [1, 2, 3] {
        let reserved = app.reserve(&alice, json!({ "inventoryId": id, "quantity": quantity })).await;
        assert_eq!(reserved["__typename"], "Reserved");
    }
    // Another inventory's change is not this subscription's business.
    let other = app.create_inventory("LIVE-2", 10).await;
    app.reserve(&alice, json!({ "inventoryId": other })).await;

    let mut seen = Vec::new();
    for _ in 0..3 {
        let message = next(&mut socket).await;
        assert_eq!(message["type"], data, "{message}");
        let inventory = &message["payload"]["data"]["inventoryChanged"];
        assert_eq!(inventory["id"], id.to_string());
        seen.push((inventory["stock"].as_i64().expect("stock"), inventory["version"].as_i64().expect("version")));
    }
    assert_eq!(seen, [(9, 2), (7, 3), (4, 4)], "every committed state, in commit order");

    // Closing the subscription removes its watcher.
    drop(socket);
    for _ in 0..200 {
        if app.count("SELECT count(*) FROM inventory_watchers").await == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the watcher outlived its subscription");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_subscriber_sees_each_reservation_in_order_over_graphql_transport_ws() {
    three_reservations_arrive_in_order("graphql-transport-ws", "subscribe", "next").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_subscriber_sees_each_reservation_in_order_over_legacy_graphql_ws() {
    three_reservations_arrive_in_order("graphql-ws", "start", "data").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_metrics_page_counts_outcomes_latency_and_the_pool() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("METRICS-1", 1).await;
    let alice = app.token("alice", Role::Customer);
    app.reserve(&alice, json!({ "inventoryId": id })).await;
    app.reserve(&alice, json!({ "inventoryId": id })).await;
    let page = app.client.get(format!("{}/metrics", app.address)).send().await.expect("metrics");
    assert_eq!(page.status(), 200);
    let text = page.text().await.expect("text");
    for needle in [
        r#"stockguard_outcomes_total{field="reserve",outcome="Reserved"}"#,
        r#"stockguard_outcomes_total{field="reserve",outcome="SoldOut"}"#,
        r#"stockguard_graphql_field_duration_seconds_bucket{field="reserve""#,
        r#"stockguard_graphql_fields_total{field="reserve",status="ok"}"#,
        r#"stockguard_db_pool_connections{state="idle"}"#,
        r#"stockguard_db_pool_connections{state="in_use"}"#,
    ] {
        assert!(text.contains(needle), "{needle} missing from\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn subscriptions_survive_the_listener_losing_its_connection() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("LIVE-3", 10).await;
    let mut socket = connect(&app.address, "graphql-transport-ws").await;
    send(
        &mut socket,
        json!({ "id": "1", "type": "subscribe", "payload": { "query": SUBSCRIPTION, "variables": { "id": id } } }),
    )
    .await;
    until_watched(&app, id).await;

    // Kill the listening backend, as a database restart would.
    let listeners = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'";
    let old = app.count(&format!("SELECT coalesce(max(pid), 0)::bigint FROM ({listeners}) l")).await;
    assert!(old > 0, "one listening connection per server process");
    app.count(&format!("SELECT count(pg_terminate_backend({old}))")).await;
    // Change the stock while nobody listens, then wait (bounded) for a new listener.
    let alice = app.token("alice", Role::Customer);
    app.reserve(&alice, json!({ "inventoryId": id, "quantity": 4 })).await;
    for tries in 0.. {
        assert!(tries < 400, "the listener never came back");
        let current = app.count(&format!("SELECT coalesce(max(pid), 0)::bigint FROM ({listeners}) l")).await;
        if current != 0 && current != old {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // The change made in the gap arrives once the listener is back.
    let message = next(&mut socket).await;
    assert_eq!(message["payload"]["data"]["inventoryChanged"]["stock"], 6, "{message}");
    assert_eq!(message["payload"]["data"]["inventoryChanged"]["version"], 2, "{message}");
}
