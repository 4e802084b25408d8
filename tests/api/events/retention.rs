//! What events keep: a delivery that spends its schedule turns its endpoint
//! off until `redeliverFailed` turns it on again, and then nothing made
//! meanwhile is lost; the outbox holds only what some endpoint still needs;
//! `stockguard archive` ages out the rest with the ledger.

use std::time::Duration;

use serde_json::{Value, json};
use stockguard::{archive, auth::Role, db::Collisions};
use uuid::Uuid;

use super::{
    CREATE_WEBHOOK, Isolation, TestApp, assert_in_order, committed_changes, first_arrivals, limits,
    receiver::{Answer, Receiver},
    spawn, stock_changes, until_delivered,
};
use crate::helpers::{address, at_every_isolation, eventually};

const ENDPOINT: &str = "query($id: ID!) { node(id: $id) { ... on WebhookEndpoint { active disabledAt } } }";
const UPDATE: &str = "mutation($input: UpdateWebhookInput!) { updateWebhook(input: $input) { id active } }";
const REDELIVER: &str = "mutation($id: UUID!) { redeliverFailed(endpointId: $id) }";

/// An endpoint for STOCK_CHANGED at `receiver`; its id and node id.
async fn endpoint(app: &TestApp, receiver: &Receiver) -> (Uuid, String) {
    let input = json!({ "url": receiver.url, "events": ["STOCK_CHANGED"] });
    let query = CREATE_WEBHOOK.replace("endpoint { id", "endpoint { nodeId id");
    let created = app.mutate(&app.operator(), "createWebhook", &query, json!({ "input": input })).await;
    let endpoint = &created["endpoint"];
    (crate::helpers::uuid(&endpoint["id"]), endpoint["nodeId"].as_str().expect("a node id").to_owned())
}

async fn state(app: &TestApp, node_id: &str) -> Value {
    let answer = app.graphql(Some(&app.operator()), ENDPOINT, json!({ "id": node_id })).await;
    answer["data"]["node"].clone()
}

/// Waits until the pump has numbered every event committed so far (its
/// last outbox row is at least the newest event's), so that what was not
/// sent was held back, not late.
async fn pumped(app: &TestApp, events: i64) {
    eventually(Duration::from_secs(20), "the pump numbered the events", || async move {
        app.count("SELECT last_seq FROM event_pump").await >= events
    })
    .await;
}

/// A receiver that fails every attempt: the delivery turns FAILED and the
/// endpoint off, and the changes made after are held, not sent. Once the
/// receiver is fixed, `redeliverFailed` turns the endpoint on: the failed
/// body goes first, then everything made while it was off, in order.
async fn a_spent_schedule_turns_the_endpoint_off_until_redelivered(isolation: Isolation) {
    let app = spawn(isolation, limits(&[0.05])).await;
    let receiver = Receiver::start().await;
    receiver.script(&[Answer::Fail(500); 2]);
    let (id, node_id) = endpoint(&app, &receiver).await;
    let item = app.create_inventory("EV-OFF", 10).await;
    eventually(Duration::from_secs(30), "the delivery FAILED", || {
        let app = app.clone();
        async move { app.count("SELECT count(*) FROM webhook_deliveries WHERE status = 'FAILED'").await == 1 }
    })
    .await;
    let off = state(&app, &node_id).await;
    assert_eq!(off["active"], false, "the failure turned the endpoint off: {off}");
    assert!(off["disabledAt"].is_string(), "and says when: {off}");
    let sent = receiver.received();
    assert_eq!(sent.len(), 2, "two attempts: the first and one after the schedule's one wait");
    assert!(stock_changes(&super::events(&sent[0].body)).contains(&(item, 1)), "{}", sent[0].body);

    let token = app.token("ev-off", Role::Customer);
    for _ in 0..3 {
        assert_eq!(app.reserve(&token, json!({ "inventoryId": item, "quantity": 1 })).await["__typename"], "Reserved");
    }
    pumped(&app, 7).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(receiver.received().len(), 2, "nothing is sent to an endpoint that is off");

    let replayed = app.mutate(&app.operator(), "redeliverFailed", REDELIVER, json!({ "id": id })).await;
    assert_eq!(replayed, 1, "the one FAILED delivery");
    let committed = committed_changes(&app, &[item]).await;
    let what = "the failed body and the held changes delivered";
    until_delivered(&receiver, &committed, Duration::from_secs(30), what).await;
    let first = first_arrivals(&receiver.accepted_events());
    assert_eq!(stock_changes(&first)[0], (item, 1), "the failed body went first");
    assert_in_order(&first);
    let on = state(&app, &node_id).await;
    assert_eq!(on, json!({ "active": true, "disabledAt": null }), "redeliverFailed turned it on");
}

/// Two endpoints, one of them off: once the one that is on has been sent
/// everything, the outbox still holds what the other has not been sent,
/// and nothing more; when it is turned on and has been sent it all too
/// (nothing made while it was off is missing), the outbox is empty.
async fn the_outbox_holds_only_what_an_endpoint_still_needs(isolation: Isolation) {
    let app = spawn(isolation, limits(&[0.05])).await;
    let (on, off) = (Receiver::start().await, Receiver::start().await);
    endpoint(&app, &on).await;
    let (paused, _) = endpoint(&app, &off).await;
    let update = |active: bool| json!({ "input": { "id": paused, "active": active } });
    app.mutate(&app.operator(), "updateWebhook", UPDATE, update(false)).await;
    let item = app.create_inventory("EV-KEEP", 10).await;
    let token = app.token("ev-keep", Role::Customer);
    for _ in 0..5 {
        assert_eq!(app.reserve(&token, json!({ "inventoryId": item, "quantity": 1 })).await["__typename"], "Reserved");
    }
    let committed = committed_changes(&app, &[item]).await;
    until_delivered(&on, &committed, Duration::from_secs(30), "everything sent to the endpoint that is on").await;
    let backlog =
        format!("SELECT p.last_seq - w.sent_through FROM event_pump p, webhook_endpoints w WHERE w.id = '{paused}'");
    let backlog = app.count(&backlog).await;
    assert!(backlog >= committed.len() as i64, "every change is in the paused endpoint's backlog: {backlog}");
    assert_eq!(
        app.count("SELECT coalesce(sum(cardinality(ids)), 0) FROM outbox").await,
        backlog,
        "the outbox holds its backlog, all of it"
    );
    assert!(off.received().is_empty(), "nothing sent while off");

    app.mutate(&app.operator(), "updateWebhook", UPDATE, update(true)).await;
    until_delivered(&off, &committed, Duration::from_secs(30), "everything made while off sent when on again").await;
    assert_in_order(&first_arrivals(&off.accepted_events()));
    eventually(Duration::from_secs(10), "the outbox empty once both were sent it all", || {
        let app = app.clone();
        async move { app.count("SELECT coalesce(sum(cardinality(ids)), 0) FROM outbox").await == 0 }
    })
    .await;
}

/// Order events recorded while no endpoint exists wait unpumped; an
/// endpoint that is off keeps a backlog, its FAILED delivery and the other
/// endpoint's DELIVERED ones stay listed: the archive deletes each of them
/// once it is older than the retention, and nothing newer.
async fn the_archive_ages_out_events_and_deliveries_with_the_ledger(isolation: Isolation) {
    let app = spawn(isolation, limits(&[0.05])).await;
    let retention = Duration::from_secs(90 * 24 * 3600);
    let customer = app.token("ev-age", Role::Customer);
    let item = app.create_inventory("EV-AGE", 50).await;
    let order =
        json!({ "items": [{ "inventoryId": item, "quantity": 1 }], "shippingAddress": address("1 Main Street") });
    assert_eq!(app.place_order(&customer, order).await["__typename"], "OrderPlaced");
    assert_eq!(app.count("SELECT count(*) FROM events").await, 1, "recorded with no endpoint");
    let archived = archive::archive(&app.db, &Collisions::new(20), retention, 2).await.expect("the archive runs");
    assert_eq!(archived.events.events, 0, "a new event stays");
    age(&app, "events", "occurred_at").await;
    let archived = archive::archive(&app.db, &Collisions::new(20), retention, 2).await.expect("the archive runs");
    assert_eq!(archived.events.events, 1, "the old order event goes");
    assert_eq!(app.count("SELECT count(*) FROM events").await, 0);

    let (sent, failing) = (Receiver::start().await, Receiver::start().await);
    failing.script(&[Answer::Fail(500); 2]);
    endpoint(&app, &sent).await;
    endpoint(&app, &failing).await;
    for _ in 0..4 {
        assert_eq!(
            app.reserve(&customer, json!({ "inventoryId": item, "quantity": 1 })).await["__typename"],
            "Reserved"
        );
    }
    pumped(&app, 8).await;
    eventually(Duration::from_secs(30), "one endpoint sent everything, the other's delivery FAILED", || {
        let (app, sent) = (app.clone(), sent.clone());
        async move {
            stock_changes(&sent.accepted_events()).len() >= 4
                && app.count("SELECT count(*) FROM webhook_deliveries WHERE status = 'FAILED'").await == 1
                && app.count("SELECT count(*) FROM webhook_deliveries WHERE status = 'PENDING'").await == 0
        }
    })
    .await;
    let outbox = app.count("SELECT coalesce(sum(cardinality(ids)), 0) FROM outbox").await;
    assert!(outbox >= 8, "the endpoint that is off keeps its events: {outbox}");
    let deliveries = app.count("SELECT count(*) FROM webhook_deliveries").await;
    age(&app, "outbox", "created_at").await;
    age(&app, "webhook_deliveries", "created_at").await;

    app.restock(&app.operator(), json!({ "inventoryId": item, "quantity": 1 })).await;
    eventually(Duration::from_secs(30), "the restock delivered", || {
        let sent = sent.clone();
        async move { stock_changes(&sent.accepted_events()).len() >= 5 }
    })
    .await;
    let archived = archive::archive(&app.db, &Collisions::new(20), retention, 2).await.expect("the archive runs");
    assert_eq!(archived.events.events, outbox as u64, "the old outbox rows, sent or not");
    assert_eq!(archived.events.deliveries, deliveries as u64, "every old delivery, FAILED or not");
    let left = app.count("SELECT count(*) FROM webhook_deliveries").await;
    assert!(left >= 1, "the restock's delivery stays");
    assert_eq!(
        app.count("SELECT count(*) FROM webhook_deliveries WHERE created_at > now() - interval '1 day'").await,
        left,
        "only new deliveries are left"
    );
    assert!(app.count("SELECT coalesce(sum(cardinality(ids)), 0) FROM outbox").await >= 1, "the restock's events stay");
}

/// Makes every row of `table` 100 days old.
async fn age(app: &TestApp, table: &str, column: &str) {
    let sql = format!(
        "WITH aged AS (UPDATE {table} SET {column} = now() - interval '100 days' RETURNING 1) SELECT count(*) FROM aged"
    );
    assert!(app.count(&sql).await > 0, "{table} had rows to age");
}

at_every_isolation! {
    a_spent_schedule_turns_the_endpoint_off_until_redelivered;
    the_outbox_holds_only_what_an_endpoint_still_needs;
    the_archive_ages_out_events_and_deliveries_with_the_ledger;
}
