//! Live stock over a real websocket, in both protocols, and the metrics page.

use std::time::Duration;

use sea_orm::{ConnectionTrait, TransactionTrait};
use serde_json::json;
use stockguard::auth::Role;
use uuid::Uuid;

use crate::{
    helpers::{TestApp, eventually},
    ws::{SUBSCRIPTION, connect, next, send},
};

/// Waits until the server has registered the subscription's watcher, so
/// changes made from now on are announced.
pub async fn until_watched(app: &TestApp, id: Uuid) {
    let watchers = format!("SELECT count(*) FROM inventory_watchers WHERE inventory_id = '{id}'");
    eventually(Duration::from_secs(10), "the subscription registers its watcher", || async {
        app.count(&watchers).await > 0
    })
    .await;
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
    eventually(Duration::from_secs(10), "the watcher goes with its subscription", || async {
        app.count("SELECT count(*) FROM inventory_watchers").await == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_subscriber_sees_each_reservation_in_order_over_graphql_transport_ws() {
    three_reservations_arrive_in_order("graphql-transport-ws", "subscribe", "next").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_subscriber_sees_each_reservation_in_order_over_legacy_graphql_ws() {
    three_reservations_arrive_in_order("graphql-ws", "start", "data").await;
}

/// One statement that changes several inventories (here `reserveMany`)
/// announces each watched one with its own new state, and none of the
/// others: the announcement is a statement trigger over every changed row.
#[tokio::test(flavor = "multi_thread")]
async fn one_statement_announces_every_watched_inventory_it_changes_and_no_other() {
    use sea_orm::sqlx::postgres::PgListener;

    let app = TestApp::spawn().await;
    let (first, second) =
        (app.create_inventory("LIVE-MANY-1", 10).await, app.create_inventory("LIVE-MANY-2", 10).await);
    let quiet = app.create_inventory("LIVE-MANY-QUIET", 10).await;
    let mut listener = PgListener::connect(&app.database_url).await.expect("listen");
    listener.listen("inventory_changed").await.expect("LISTEN");
    let mut socket = connect(&app.address, "graphql-transport-ws").await;
    for (n, id) in [(1, first), (2, second)] {
        let payload = json!({ "query": SUBSCRIPTION, "variables": { "id": id } });
        send(&mut socket, json!({ "id": n.to_string(), "type": "subscribe", "payload": payload })).await;
        until_watched(&app, id).await;
    }

    let alice = app.token("alice", Role::Customer);
    let items = json!([
        { "inventoryId": first, "quantity": 1 },
        { "inventoryId": quiet, "quantity": 3 },
        { "inventoryId": second, "quantity": 2 },
    ]);
    assert_eq!(app.reserve_many(&alice, items).await["__typename"], "ReservedAll");

    // A transaction's notifications are delivered together at its commit.
    let mut heard = Vec::new();
    while let Ok(notification) = tokio::time::timeout(Duration::from_millis(500), listener.recv()).await {
        let row: serde_json::Value = serde_json::from_str(notification.expect("heard").payload()).expect("a row");
        heard.push((row["id"].as_str().expect("id").to_owned(), row["stock"].as_i64(), row["version"].as_i64()));
    }
    heard.sort();
    let mut expected = vec![(first.to_string(), Some(9), Some(2)), (second.to_string(), Some(8), Some(2))];
    expected.sort();
    assert_eq!(heard, expected, "each watched inventory once, with its own state; the quiet one never");
    let mut seen = Vec::new();
    for _ in 0..2 {
        let message = next(&mut socket).await;
        seen.push((
            message["id"].as_str().expect("id").to_owned(),
            message["payload"]["data"]["inventoryChanged"]["stock"].as_i64(),
        ));
    }
    seen.sort();
    assert_eq!(seen, [("1".to_owned(), Some(9)), ("2".to_owned(), Some(8))]);
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
    let current = format!("SELECT coalesce(max(pid), 0)::bigint FROM ({listeners}) l");
    eventually(Duration::from_secs(20), "the listener comes back", || async {
        let current = app.count(&current).await;
        current != 0 && current != old
    })
    .await;
    // The change made in the gap arrives once the listener is back.
    let message = next(&mut socket).await;
    assert_eq!(message["payload"]["data"]["inventoryChanged"]["stock"], 6, "{message}");
    assert_eq!(message["payload"]["data"]["inventoryChanged"]["version"], 2, "{message}");
}

/// The live inventory with every stock state.
const STATES_SUBSCRIPTION: &str =
    "subscription($id: UUID!) { inventoryChanged(id: $id) { version stock available reserved committed onHand } }";

/// The live order.
const ORDER_SUBSCRIPTION: &str = "subscription($id: UUID!) { orderChanged(id: $id) { id status version } }";

/// The `inventoryChanged` data of the next message.
async fn next_inventory(socket: &mut crate::ws::Socket) -> [i64; 6] {
    let message = next(socket).await;
    let inventory = &message["payload"]["data"]["inventoryChanged"];
    let n = |name: &str| inventory[name].as_i64().unwrap_or_else(|| panic!("{name} in {message}"));
    [n("version"), n("stock"), n("available"), n("reserved"), n("committed"), n("onHand")]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_subscriber_sees_every_stock_state_from_cart_to_shipment() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("LIVE-STATES", 10).await;
    let mut socket = connect(&app.address, "graphql-transport-ws").await;
    let payload = json!({ "query": STATES_SUBSCRIPTION, "variables": { "id": id } });
    send(&mut socket, json!({ "id": "1", "type": "subscribe", "payload": payload })).await;
    until_watched(&app, id).await;

    let (alice, operator) = (app.token("alice", Role::Customer), app.operator());
    let reserved = app.reserve(&alice, json!({ "inventoryId": id, "quantity": 3 })).await;
    assert_eq!(next_inventory(&mut socket).await, [2, 7, 7, 3, 0, 10], "reserved");
    let reservation = reserved["reservation"]["id"].clone();
    let input = json!({ "reservationIds": [reservation], "shippingAddress": crate::helpers::address("1 Live St") });
    let placed = app.checkout(&alice, input).await;
    assert_eq!(placed["__typename"], "OrderPlaced", "{placed}");
    // No stock moved and the version stays, but the states did change.
    assert_eq!(next_inventory(&mut socket).await, [2, 7, 7, 0, 3, 10], "checked out");
    let order = crate::helpers::uuid(&placed["order"]["id"]);
    // Confirming changes no stock state: the next message is the fulfilment's.
    assert_eq!(app.confirm(&operator, order).await["__typename"], "OrderConfirmed");
    assert_eq!(app.fulfill(&operator, order).await["__typename"], "OrderFulfilled");
    assert_eq!(next_inventory(&mut socket).await, [3, 7, 7, 0, 0, 7], "fulfilled");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_owner_follows_an_order_until_it_is_fulfilled_and_others_are_refused() {
    let app = TestApp::spawn().await;
    let item = app.create_inventory("LIVE-ORDER", 10).await;
    let (alice, bob, operator) = (app.token("alice", Role::Customer), app.token("bob", Role::Customer), app.operator());
    let address = crate::helpers::address("1 Live St");
    let input = json!({ "items": [{ "inventoryId": item }], "shippingAddress": address });
    let order = crate::helpers::uuid(&app.place_order(&alice, input).await["order"]["id"]);
    let subscribe = json!({ "query": ORDER_SUBSCRIPTION, "variables": { "id": order } });

    // Someone else, or nobody: an error, as for an unknown id.
    let unknown = json!({ "query": ORDER_SUBSCRIPTION, "variables": { "id": Uuid::new_v4() } });
    for (who, payload, subscription, code) in [
        ("bob", json!({ "Authorization": format!("Bearer {bob}") }), &subscribe, "BAD_USER_INPUT"),
        ("alice, an unknown id", json!({ "Authorization": format!("Bearer {alice}") }), &unknown, "BAD_USER_INPUT"),
        ("anonymous", json!({}), &subscribe, "UNAUTHENTICATED"),
    ] {
        let mut socket = crate::ws::connect_with(&app.address, "graphql-transport-ws", payload).await;
        send(&mut socket, json!({ "id": "1", "type": "subscribe", "payload": subscription })).await;
        let answer = next(&mut socket).await;
        let error = if answer["type"] == "error" { &answer["payload"][0] } else { &answer["payload"]["errors"][0] };
        assert_eq!(error["extensions"]["code"], code, "{who}: {answer}");
        assert!(answer["payload"]["data"]["orderChanged"].is_null(), "{who}: {answer}");
    }
    assert_eq!(app.count("SELECT count(*) FROM order_watchers").await, 0, "no one registered");

    // The owner and an operator follow it; each change once, in order; done when final.
    let mut sockets = Vec::new();
    for token in [&alice, &operator] {
        let payload = json!({ "Authorization": format!("Bearer {token}") });
        let mut socket = crate::ws::connect_with(&app.address, "graphql-transport-ws", payload).await;
        send(&mut socket, json!({ "id": "1", "type": "subscribe", "payload": subscribe })).await;
        sockets.push(socket);
    }
    // Watched, and by a process whose listening connection is LISTENing
    // (its last statement): a change announced before that would reach
    // the subscriptions only as the latest state once it listens.
    let watched = format!(
        "SELECT count(*) FROM order_watchers w JOIN pg_stat_activity a ON a.pid = w.listener_pid \
          WHERE w.order_id = '{order}' AND a.query LIKE 'LISTEN%'"
    );
    crate::helpers::eventually(Duration::from_secs(10), "the order is watched by a listening process", || async {
        app.count(&watched).await > 0
    })
    .await;
    assert_eq!(app.confirm(&operator, order).await["__typename"], "OrderConfirmed");
    assert_eq!(app.fulfill(&operator, order).await["__typename"], "OrderFulfilled");
    // The subscription that wrote the watcher row was live before the
    // confirmation, so it sees both changes. The other may have started
    // only after the confirmation (nothing here waits for it): then it sees
    // what followed its start. Either way each change once, in order,
    // ending with the final state.
    let mut saw_both = false;
    for socket in &mut sockets {
        let mut seen = Vec::new();
        loop {
            let message = next(socket).await;
            if message["type"] == "complete" {
                break;
            }
            assert_eq!(message["type"], "next", "{message}");
            let changed = &message["payload"]["data"]["orderChanged"];
            seen.push((changed["status"].as_str().unwrap_or("?").to_owned(), changed["version"].as_i64()));
        }
        let both = [("CONFIRMED".to_owned(), Some(2)), ("FULFILLED".to_owned(), Some(3))];
        assert!(seen == both || seen == both[1..], "each change once, in order, then complete: {seen:?}");
        saw_both |= seen == both;
    }
    assert!(saw_both, "the subscription live before the confirmation saw it");
    crate::helpers::eventually(Duration::from_secs(10), "the watcher goes with its subscriptions", || async {
        app.count("SELECT count(*) FROM order_watchers").await == 0
    })
    .await;
    // Subscribing to a final order completes at once.
    let mut socket = sockets.pop().expect("a socket");
    send(&mut socket, json!({ "id": "2", "type": "subscribe", "payload": subscribe })).await;
    let message = next(&mut socket).await;
    assert_eq!((&message["type"], &message["id"]), (&json!("complete"), &json!("2")), "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn only_watched_orders_notify() {
    use sea_orm::sqlx::postgres::PgListener;

    let app = TestApp::spawn().await;
    let item = app.create_inventory("LIVE-QUIET", 10).await;
    let (alice, operator) = (app.token("alice", Role::Customer), app.operator());
    let input = json!({ "items": [{ "inventoryId": item }], "shippingAddress": crate::helpers::address("1 Live St") });
    let quiet = crate::helpers::uuid(&app.place_order(&alice, input.clone()).await["order"]["id"]);
    let watched = crate::helpers::uuid(&app.place_order(&alice, input).await["order"]["id"]);
    let mut listener = PgListener::connect(&app.database_url).await.expect("listen");
    listener.listen("order_changed").await.expect("LISTEN");

    let payload = json!({ "Authorization": format!("Bearer {alice}") });
    let mut socket = crate::ws::connect_with(&app.address, "graphql-transport-ws", payload).await;
    let subscribe = json!({ "query": ORDER_SUBSCRIPTION, "variables": { "id": watched } });
    send(&mut socket, json!({ "id": "1", "type": "subscribe", "payload": subscribe })).await;
    crate::helpers::eventually(Duration::from_secs(10), "the order is watched", || async {
        app.count(&format!("SELECT count(*) FROM order_watchers WHERE order_id = '{watched}'")).await > 0
    })
    .await;
    // The unwatched order changes first; notifications arrive in commit
    // order, so had it notified, its notification would come first.
    assert_eq!(app.confirm(&operator, quiet).await["__typename"], "OrderConfirmed");
    assert_eq!(app.confirm(&operator, watched).await["__typename"], "OrderConfirmed");
    let heard = tokio::time::timeout(Duration::from_secs(10), listener.recv()).await.expect("in time").expect("heard");
    let row: serde_json::Value = serde_json::from_str(heard.payload()).expect("a row");
    assert_eq!(row["id"], watched.to_string(), "only the watched order notified: {row}");
    assert_eq!(next(&mut socket).await["payload"]["data"]["orderChanged"]["status"], "CONFIRMED");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_listener_that_cannot_register_its_watchers_tries_again_until_it_can() {
    // Statements give up after a second; no sweeper competes for the pool.
    let app = TestApp::spawn_with_options(crate::helpers::Options {
        statement_timeout_ms: 1_000,
        limits: stockguard::config::Limits { sweep_interval_ms: 3_600_000, ..Default::default() },
        ..Default::default()
    })
    .await;
    let id = app.create_inventory("LIVE-REGISTER", 10).await;
    let mut socket = connect(&app.address, "graphql-transport-ws").await;
    let payload = json!({ "query": SUBSCRIPTION, "variables": { "id": id } });
    send(&mut socket, json!({ "id": "1", "type": "subscribe", "payload": payload })).await;
    until_watched(&app, id).await;

    // A crash restart or a failover: the watcher rows are gone (unlogged
    // tables) and the listening connection is lost. The table stays locked
    // for a while, so the new listener's registration times out.
    let blocker = app.db.begin().await.expect("begin");
    blocker.execute_unprepared("DELETE FROM inventory_watchers").await.expect("forget the watchers");
    blocker.execute_unprepared("LOCK TABLE inventory_watchers IN ACCESS EXCLUSIVE MODE").await.expect("lock");
    let listener = "SELECT coalesce(max(pid), 0)::bigint FROM pg_stat_activity \
                    WHERE datname = current_database() AND query LIKE 'LISTEN%'";
    let old = app.count(listener).await;
    assert!(old > 0, "one listening connection");
    app.count(&format!("SELECT count(pg_terminate_backend({old}))")).await;
    app.until_waiting_for_a_lock("WITH stale AS").await;
    let registering = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                       AND wait_event_type = 'Lock' AND ltrim(query, E' \\t\\r\\n') LIKE 'WITH stale AS%'";
    eventually(Duration::from_secs(10), "the registration times out", || async { app.count(registering).await == 0 })
        .await;
    blocker.commit().await.expect("unlock");

    // The listener tries again, so the next change is announced.
    let alice = app.token("alice", Role::Customer);
    assert_eq!(app.reserve(&alice, json!({ "inventoryId": id })).await["__typename"], "Reserved");
    // (A catch-up message with the state at registration may come first.)
    for _ in 0..3 {
        let message = next(&mut socket).await;
        if message["payload"]["data"]["inventoryChanged"]["stock"] == 9 {
            return;
        }
    }
    panic!("the reservation was never announced");
}
