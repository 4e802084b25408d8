//! Events out, tried from outside: a real HTTP receiver in the test process
//! (accepting, failing and stalling on command), endpoints made through
//! `createWebhook`, and what arrived compared with what the database says
//! was committed.

mod adjustments;
mod crash;
mod failover;
mod kills;
mod kits;
mod migrated;
mod receiver;
mod retention;
mod returns;
mod scan;
mod sharing;
mod thread;
mod units;
mod waitlists;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use futures::FutureExt;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use serde_json::{Value, json};
use stockguard::{auth::Role, config::Limits};
use uuid::Uuid;

use self::receiver::{Answer, Receiver, events, verifies};
use crate::helpers::{Isolation, Options, TestApp, address, at_every_isolation, at_once, eventually, retried, uuid};

const CREATE_WEBHOOK: &str = "mutation($input: CreateWebhookInput!) { createWebhook(input: $input) {
  endpoint { id url events active } secret } }";

/// Limits for a test of deliveries: loopback receivers allowed, a fast
/// pump, short attempts and a short schedule.
fn limits(schedule: &[f64]) -> Limits {
    Limits {
        webhook_allow_loopback: true,
        event_poll_ms: 20,
        webhook_timeout_ms: 500,
        webhook_retry_schedule: schedule.to_vec(),
        ..Limits::default()
    }
}

async fn spawn(isolation: Isolation, limits: Limits) -> Arc<TestApp> {
    Arc::new(TestApp::spawn_with_options(Options { isolation, limits, pool_size: 6, ..Options::default() }).await)
}

/// `createWebhook`'s variables for an endpoint of every event type at `receiver`.
fn every_event_to(receiver: &Receiver) -> Value {
    json!({ "input": { "url": receiver.url, "events": ["STOCK_CHANGED", "RESERVATION_CHANGED", "ORDER_CHANGED"] } })
}

/// An endpoint for every event type at `receiver`: what `createWebhook`
/// answered (the endpoint and its secret).
async fn create_endpoint(app: &TestApp, receiver: &Receiver) -> Value {
    app.mutate(&app.operator(), "createWebhook", CREATE_WEBHOOK, every_event_to(receiver)).await
}

/// An endpoint for every event type at `receiver`; its secret.
async fn subscribe(app: &TestApp, receiver: &Receiver) -> String {
    let created = create_endpoint(app, receiver).await;
    created["secret"].as_str().unwrap_or_else(|| panic!("no secret: {created}")).to_owned()
}

/// An endpoint for every event type at `receiver`, made through server
/// process `process`; its secret.
async fn subscribe_process(process: &crate::process::Process, receiver: &Receiver) -> String {
    let operator = process.token("operator", Role::Operator);
    let (_, created) =
        process.graphql(Some(&operator), CREATE_WEBHOOK, every_event_to(receiver)).await.expect("create");
    created["data"]["createWebhook"]["secret"].as_str().expect("a secret").to_owned()
}

/// Every committed stock change of `inventories`, as `(inventory,
/// version)`, from the ledger.
async fn committed_changes(app: &TestApp, inventories: &[Uuid]) -> BTreeSet<(Uuid, i64)> {
    ledger_changes(&app.db, inventories).await
}

/// [`committed_changes`] read through `db` (a test server's or a server
/// process's connection for checks).
async fn ledger_changes(db: &DatabaseConnection, inventories: &[Uuid]) -> BTreeSet<(Uuid, i64)> {
    let ids = inventories.iter().map(|id| format!("'{id}'")).collect::<Vec<_>>().join(", ");
    let sql = format!("SELECT DISTINCT inventory_id, version_after FROM stock_movements WHERE inventory_id IN ({ids})");
    let rows = db.query_all_raw(Statement::from_string(DbBackend::Postgres, sql)).await.expect("the ledger");
    let change = |row: &sea_orm::QueryResult| -> (Uuid, i64) {
        (row.try_get("", "inventory_id").expect("id"), i64::from(row.try_get::<i32>("", "version_after").expect("v")))
    };
    rows.iter().map(change).collect()
}

/// Waits up to `limit` until `receiver` has accepted an event of every
/// change in `committed`.
async fn until_delivered(receiver: &Receiver, committed: &BTreeSet<(Uuid, i64)>, limit: Duration, what: &str) {
    eventually(limit, what, || {
        let (receiver, committed) = (receiver.clone(), committed.clone());
        async move {
            let delivered: BTreeSet<(Uuid, i64)> = stock_changes(&receiver.accepted_events()).into_iter().collect();
            delivered.is_superset(&committed)
        }
    })
    .await;
}

/// The first arrival of each event, in arrival order.
fn first_arrivals(events: &[Value]) -> Vec<Value> {
    let mut seen = BTreeSet::new();
    events.iter().filter(|e| seen.insert(e["id"].as_str().unwrap_or_default().to_owned())).cloned().collect()
}

/// `(inventory, version)` of the STOCK_CHANGED events among `events`.
fn stock_changes(events: &[Value]) -> Vec<(Uuid, i64)> {
    events
        .iter()
        .filter(|e| e["type"] == "STOCK_CHANGED")
        .map(|e| (uuid(&e["inventoryId"]), e["version"].as_i64().expect("version")))
        .collect()
}

/// Asserts that each inventory's, each order's and each waiting list
/// entry's events arrived in version order (first arrivals), an order's
/// returns (which keep its version) after it by their number.
fn assert_in_order(first: &[Value]) {
    let mut last: BTreeMap<(String, String), (i64, i64)> = BTreeMap::new();
    for event in first.iter().filter(|e| e["type"] != "RESERVATION_CHANGED") {
        let subject = event["inventoryId"]
            .as_str()
            .or(event["orderId"].as_str())
            .or(event["entryId"].as_str())
            .unwrap_or_default();
        let key = (event["type"].as_str().unwrap_or_default().to_owned(), subject.to_owned());
        let place =
            (event["version"].as_i64().expect("a version"), event["data"]["returnNumber"].as_i64().unwrap_or(0));
        if let Some(before) = last.insert(key, place) {
            assert!(place > before, "{place:?} arrived after {before:?}: {event}");
        }
    }
}

/// Sixty reserves at once on three small inventories (some sold out), the
/// granted half released at once, a restock and an order: afterwards the
/// receiver has exactly one STOCK_CHANGED per committed change (the
/// ledger's (inventory, version) pairs: a SoldOut sent nothing), each
/// inventory's in version order, every reservation's ACTIVE and RELEASED
/// status, the order's ORDER_CHANGED, and every body's signature verifies.
async fn every_committed_change_arrives_once_in_order_and_signed(isolation: Isolation) {
    let app = spawn(isolation, limits(&[0.05, 0.05, 0.05])).await;
    let receiver = Receiver::start().await;
    let secret = subscribe(&app, &receiver).await;
    let items = [
        app.create_inventory("EV-A", 20).await,
        app.create_inventory("EV-B", 20).await,
        app.create_inventory("EV-C", 5).await,
    ];
    let calls = (0..60).map(|n| {
        let app = app.clone();
        let item = items[n % 3];
        async move {
            let token = app.token(&format!("ev-{n}"), Role::Customer);
            let input = json!({ "inventoryId": item, "quantity": 1 + n % 2 });
            (token.clone(), retried(|| app.reserve(&token, input.clone())).await)
        }
        .boxed()
    });
    let reserved = at_once(calls.collect()).await;
    let granted: Vec<(String, String)> = reserved
        .iter()
        .filter(|(_, r)| r["__typename"] == "Reserved")
        .map(|(token, r)| (token.clone(), r["reservation"]["id"].as_str().expect("id").to_owned()))
        .collect();
    assert!(reserved.iter().any(|(_, r)| r["__typename"] == "SoldOut"), "EV-C sold out: {reserved:?}");
    let releases = granted.iter().step_by(2).map(|(token, id)| {
        let (app, token, id) = (app.clone(), token.clone(), id.clone());
        async move { retried(|| app.release(&token, &id)).await }.boxed()
    });
    for released in at_once(releases.collect()).await {
        assert_eq!(released["__typename"], "ReservationReleased", "{released}");
    }
    // EV-A may have sold out and had none of its units released: the
    // restock is what the order is sure to find.
    let (operator, restock) = (app.operator(), json!({ "inventoryId": items[0], "quantity": 1 }));
    let restocked = retried(|| app.restock(&operator, restock.clone())).await;
    assert_eq!(restocked["__typename"], "Restocked", "{restocked}");
    let customer = app.token("ev-buyer", Role::Customer);
    let order =
        json!({ "items": [{ "inventoryId": items[0], "quantity": 1 }], "shippingAddress": address("1 Main Street") });
    let placed = retried(|| app.place_order(&customer, order.clone())).await;
    assert_eq!(placed["__typename"], "OrderPlaced", "{placed}");

    let committed = committed_changes(&app, &items).await;
    until_delivered(&receiver, &committed, Duration::from_secs(30), "every committed change delivered").await;
    // A change's reservation and order events follow its stock event, and
    // may be in the next body: wait for as many as were made, then check
    // that there are no more.
    let expected = [("ACTIVE", granted.len()), ("RELEASED", granted.iter().step_by(2).count()), ("ORDERED", 1)];
    let statuses = |first: &[Value]| {
        first.iter().filter(|e| e["type"] == "RESERVATION_CHANGED").fold(BTreeMap::new(), |mut counts, e| {
            *counts.entry(e["data"]["status"].as_str().unwrap_or("?").to_owned()).or_insert(0) += 1;
            counts
        })
    };
    eventually(Duration::from_secs(30), "every reservation's and the order's events delivered", || {
        let receiver = receiver.clone();
        async move {
            let first = first_arrivals(&receiver.accepted_events());
            let counts: BTreeMap<String, usize> = statuses(&first);
            expected.iter().all(|(status, n)| counts.get(*status).is_some_and(|got| got >= n))
                && first.iter().any(|e| e["type"] == "ORDER_CHANGED" && e["version"] == 1)
        }
    })
    .await;
    let first = first_arrivals(&receiver.accepted_events());
    let delivered = stock_changes(&first);
    assert_eq!(
        delivered.iter().copied().collect::<BTreeSet<_>>(),
        committed_changes(&app, &items).await,
        "one per change"
    );
    assert_eq!(delivered.len(), committed.len(), "no change twice among first arrivals");
    assert_in_order(&first);
    let counts = statuses(&first);
    assert_eq!(counts, expected.iter().map(|(status, n)| (status.to_string(), *n)).collect(), "one per status change");
    for received in receiver.received() {
        assert!(verifies(&secret, &received.signature, &received.body), "signature of {}", received.delivery);
        assert!((1..=100).contains(&events(&received.body).len()), "a body holds 1..100 events");
    }
    eprintln!(
        "every_committed_change_arrives_once_in_order_and_signed {isolation:?}: {} changes, {} events, {} bodies",
        committed.len(),
        first.len(),
        receiver.received().len()
    );
}

/// A receiver that fails (500), then stalls past the timeout, then accepts:
/// the same body comes again until it is accepted, nothing is lost, and
/// the delivery records its attempts.
async fn failures_and_timeouts_are_retried_until_accepted(isolation: Isolation) {
    let app = spawn(isolation, limits(&[0.05, 0.05, 0.05, 0.05])).await;
    let receiver = Receiver::start().await;
    receiver.script(&[Answer::Fail(500), Answer::Stall(Duration::from_secs(2)), Answer::Fail(503)]);
    subscribe(&app, &receiver).await;
    let item = app.create_inventory("EV-RETRY", 10).await;
    let token = app.token("ev-retry", Role::Customer);
    assert_eq!(app.reserve(&token, json!({ "inventoryId": item, "quantity": 2 })).await["__typename"], "Reserved");
    eventually(Duration::from_secs(30), "the change delivered after the failures", || {
        let receiver = receiver.clone();
        async move { stock_changes(&receiver.accepted_events()).contains(&(item, 2)) }
    })
    .await;
    let received = receiver.received();
    let first = &received[0];
    assert!(received.len() >= 4, "three failed attempts, then one accepted: {}", received.len());
    assert!(received[..4].iter().all(|r| r.delivery == first.delivery), "one delivery, attempted again");
    assert_eq!(received[3].answered, Answer::Accept);
    assert_eq!(received[0].body, received[3].body, "the same body each time");
    // The receiver has answered; the delivery is marked a moment later.
    let delivered = format!(
        "SELECT count(*) FROM webhook_deliveries WHERE id = '{}' AND status = 'DELIVERED' AND attempts = 4",
        first.delivery
    );
    eventually(Duration::from_secs(10), "the delivery DELIVERED after 4 attempts", || {
        let (app, delivered) = (app.clone(), delivered.clone());
        async move { app.count(&delivered).await == 1 }
    })
    .await;
}

/// `count` reserves of a unit of `item` at once, each by a customer of its
/// own (`<who>-<n>`); every one is granted.
async fn reserve_at_once(app: &Arc<TestApp>, item: Uuid, count: usize, who: &str) {
    let calls = (0..count).map(|n| {
        let (app, token) = (app.clone(), app.token(&format!("{who}-{n}"), Role::Customer));
        async move { app.reserve(&token, json!({ "inventoryId": item, "quantity": 1 })).await }.boxed()
    });
    for reserved in at_once(calls.collect()).await {
        assert_eq!(reserved["__typename"], "Reserved", "{reserved}");
    }
}

const UPDATE_WEBHOOK: &str = "mutation($input: UpdateWebhookInput!) { updateWebhook(input: $input) { id active } }";

/// A backlog of several bodies (made while the endpoint was off) is cut
/// into deliveries several at a time, and the receiver fails the second
/// body twice: each failed body comes again before any body after it,
/// every change arrives in version order, and the bodies were cut together
/// (deliveries sharing their `created_at`: one statement cut them).
async fn a_failing_body_holds_the_bodies_cut_with_it(isolation: Isolation) {
    let app = spawn(isolation, limits(&[0.05, 0.05, 0.05, 0.05])).await;
    let receiver = Receiver::start().await;
    let created = create_endpoint(&app, &receiver).await;
    let endpoint = created["endpoint"]["id"].as_str().unwrap_or_else(|| panic!("no endpoint: {created}")).to_owned();
    let switch = |active: bool| {
        let (app, endpoint) = (app.clone(), endpoint.clone());
        async move {
            let input = json!({ "input": { "id": endpoint, "active": active } });
            let changed = app.mutate(&app.operator(), "updateWebhook", UPDATE_WEBHOOK, input).await;
            assert_eq!(changed["active"], active, "{changed}");
        }
    };
    switch(false).await;
    let item = app.create_inventory("EV-BATCH", 1000).await;
    reserve_at_once(&app, item, 160, "ev-batch").await;
    let committed = committed_changes(&app, &[item]).await;
    let numbered = format!(
        "SELECT CASE WHEN sum(cardinality(array_positions(o.types, 'STOCK_CHANGED'))) >= {} THEN count(*) ELSE 0 END
           FROM outbox o, webhook_endpoints w WHERE w.id = '{endpoint}' AND o.seq > w.sent_through",
        committed.len()
    );
    eventually(Duration::from_secs(30), "every change numbered into three rows or more", || {
        let (app, numbered) = (app.clone(), numbered.clone());
        async move { app.count(&numbered).await >= 3 }
    })
    .await;
    receiver.script(&[Answer::Accept, Answer::Fail(500), Answer::Fail(503)]);
    switch(true).await;
    until_delivered(&receiver, &committed, Duration::from_secs(30), "every change delivered").await;

    let received = receiver.received();
    for (attempt, after) in received.iter().zip(&received[1..]) {
        if attempt.answered != Answer::Accept {
            assert_eq!(after.delivery, attempt.delivery, "a failed body is sent again before any after it");
        }
    }
    assert_eq!(received.iter().filter(|r| r.answered != Answer::Accept).count(), 2, "the script's two failures");
    let first = first_arrivals(&receiver.accepted_events());
    assert_eq!(stock_changes(&first).into_iter().collect::<BTreeSet<_>>(), committed, "one per change");
    assert_in_order(&first);
    let together = format!(
        "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM webhook_deliveries
            WHERE endpoint_id = '{endpoint}' GROUP BY created_at) cut"
    );
    assert!(app.count(&together).await >= 2, "several bodies cut by one statement");
}

at_every_isolation! {
    every_committed_change_arrives_once_in_order_and_signed;
    failures_and_timeouts_are_retried_until_accepted;
    a_failing_body_holds_the_bodies_cut_with_it;
}
