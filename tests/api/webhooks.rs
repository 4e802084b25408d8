//! Webhook endpoints through the API: operators create them (the signing
//! secret shown once), change, delete and list them, read their deliveries
//! and replay the failed ones; the egress rules refuse URLs that would
//! reach inside the network, writing nothing; customers may do none of it.
//! Deliveries are written here straight into the table, as the dispatcher
//! (src/events/) writes them.

use std::sync::Arc;

use futures::FutureExt;
use serde_json::{Value, json};
use stockguard::{auth::Role, config::Limits, events::egress::MAX_URL_LEN};
use uuid::Uuid;

use crate::{
    helpers::{Isolation, TestApp, at_once, error_code, uuid},
    locations::run,
};

const CREATE: &str = "mutation($input: CreateWebhookInput!) {
  createWebhook(input: $input) { secret endpoint { id nodeId url events active createdAt } } }";

const UPDATE: &str = "mutation($input: UpdateWebhookInput!) {
  updateWebhook(input: $input) { id url events active } }";

const DELETE: &str = "mutation($id: UUID!) { deleteWebhook(id: $id) }";

const REDELIVER: &str = "mutation($id: UUID!) { redeliverFailed(endpointId: $id) }";

const ENDPOINTS: &str = "query($first: Int, $after: String) {
  webhookEndpoints(first: $first, after: $after) {
    nodes { id url events active } pageInfo { hasNextPage endCursor } } }";

const NODE: &str = "query($id: ID!) { node(id: $id) { __typename ... on WebhookEndpoint { id url events } } }";

const DELIVERIES: &str = "query($first: Int, $after: String, $status: DeliveryStatus) {
  webhookEndpoints(first: 1) { nodes { id deliveries(first: $first, after: $after, status: $status) {
    nodes { id eventIds status attempts lastAttemptAt lastResponseStatus lastError nextAttemptAt deliveredAt }
    pageInfo { hasNextPage endCursor } } } } }";

/// A server whose webhooks may reach loopback (STOCKGUARD_WEBHOOK_ALLOW_LOOPBACK=true).
async fn with_loopback() -> TestApp {
    TestApp::spawn_configured(Isolation::ReadCommitted, Limits { webhook_allow_loopback: true, ..Limits::default() })
        .await
}

/// `createWebhook` as the operator: the whole answer (errors included).
async fn create(app: &TestApp, url: &str, events: Value) -> Value {
    let input = json!({ "url": url, "events": events });
    app.mutate(&app.operator(), "createWebhook", CREATE, json!({ "input": input })).await
}

/// Creates an endpoint to `url` for every event type; its id.
async fn endpoint(app: &TestApp, url: &str) -> Uuid {
    let created = create(app, url, json!(["STOCK_CHANGED", "RESERVATION_CHANGED", "ORDER_CHANGED"])).await;
    uuid(&created["endpoint"]["id"])
}

/// An endpoint at `url` whose deliveries are written and read by the test
/// alone: deactivated, so no server process leases it and attempts them.
async fn idle_endpoint(app: &TestApp, url: &str) -> Uuid {
    let id = endpoint(app, url).await;
    run(app, "UPDATE webhook_endpoints SET active = false WHERE id = $1", vec![id.into()]).await;
    id
}

/// Writes a delivery of `endpoint` with `status` and `attempts`, made
/// `age` seconds ago (so the order of a page is known); its id.
async fn delivery(app: &TestApp, endpoint: Uuid, status: &str, attempts: i32, age: i32) -> Uuid {
    let id = Uuid::new_v4();
    run(
        app,
        "INSERT INTO webhook_deliveries (id, endpoint_id, seqs, event_ids, status, attempts, last_attempt_at,
                                         last_response_status, last_error, next_attempt_at, delivered_at, created_at)
         VALUES ($1, $2, ARRAY[1, 2]::bigint[], ARRAY[gen_random_uuid(), gen_random_uuid()], $3, $4,
                 now() - interval '1 minute', CASE $3 WHEN 'DELIVERED' THEN 204 ELSE 503 END,
                 CASE $3 WHEN 'DELIVERED' THEN NULL ELSE 'HTTP 503' END, now() + interval '1 hour',
                 CASE $3 WHEN 'DELIVERED' THEN now() END, now() - make_interval(secs => $5))",
        vec![id.into(), endpoint.into(), status.into(), attempts.into(), f64::from(age).into()],
    )
    .await;
    id
}

/// The ids of an endpoint page's nodes.
fn ids(nodes: &Value) -> Vec<Uuid> {
    nodes.as_array().unwrap_or_else(|| panic!("no nodes: {nodes}")).iter().map(|node| uuid(&node["id"])).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn customers_and_anonymous_callers_may_not_touch_webhooks_and_write_nothing() {
    let app = TestApp::spawn().await;
    let existing = endpoint(&app, "https://hooks.example.com/in").await;
    let alice = app.token("alice", Role::Customer);
    let create = json!({ "input": { "url": "https://evil.example.com/", "events": ["STOCK_CHANGED"] } });
    let update = json!({ "input": { "id": existing, "url": "https://evil.example.com/" } });
    let id = json!({ "id": existing });
    let calls = [(CREATE, create), (UPDATE, update), (DELETE, id.clone()), (REDELIVER, id), (ENDPOINTS, json!({}))];
    for (query, variables) in calls {
        let body = app.graphql(Some(&alice), query, variables.clone()).await;
        assert_eq!(error_code(&body), Some("FORBIDDEN"), "{body}");
        let body = app.graphql(None, query, variables).await;
        assert_eq!(error_code(&body), Some("UNAUTHENTICATED"), "{body}");
    }
    let node = json!({ "id": stockguard::global_id::encode(stockguard::global_id::Kind::WebhookEndpoint, existing) });
    let body = app.graphql(Some(&alice), NODE, node.clone()).await;
    assert_eq!(error_code(&body), Some("FORBIDDEN"), "{body}");
    let body = app.graphql(Some(&app.operator()), NODE, node).await;
    assert_eq!(body["data"]["node"]["__typename"], "WebhookEndpoint", "{body}");
    let stored = app.rows("SELECT id, url FROM webhook_endpoints").await;
    assert_eq!(stored, vec![json!({ "id": existing, "url": "https://hooks.example.com/in" })]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_webhook_shows_its_secret_once_and_takes_the_events_from_now_on() {
    let app = with_loopback().await;
    // Events already pumped are not the new endpoint's.
    run(&app, "UPDATE event_pump SET last_seq = 42", vec![]).await;
    let created =
        create(&app, "http://127.0.0.1:9/hook", json!(["ORDER_CHANGED", "STOCK_CHANGED", "ORDER_CHANGED"])).await;
    let secret = created["secret"].as_str().unwrap_or_else(|| panic!("a secret: {created}")).to_owned();
    assert!(secret.len() == 64 && secret.chars().all(|c| c.is_ascii_hexdigit()), "{secret}");
    let endpoint = &created["endpoint"];
    assert_eq!(
        (&endpoint["url"], &endpoint["events"], &endpoint["active"]),
        (&json!("http://127.0.0.1:9/hook"), &json!(["ORDER_CHANGED", "STOCK_CHANGED"]), &json!(true)),
        "{created}"
    );
    let id = uuid(&endpoint["id"]);
    let stored = app.rows(&format!("SELECT secret, sent_through FROM webhook_endpoints WHERE id = '{id}'")).await;
    assert_eq!(stored, vec![json!({ "secret": secret, "sent_through": 42 })]);

    // No read shows the secret again: not the list, not `node`.
    let operator = app.operator();
    for (query, variables) in [(ENDPOINTS, json!({})), (NODE, json!({ "id": endpoint["nodeId"] }))] {
        let reply = app.post(Some(&format!("Bearer {operator}")), crate::helpers::request(query, variables)).await;
        let text = String::from_utf8_lossy(&reply.expect("sent").body).into_owned();
        assert!(text.contains(&id.to_string()) && !text.contains(&secret), "{text}");
    }
    // And the type has no field that could.
    let body = app.graphql(Some(&operator), "{ webhookEndpoints { nodes { secret } } }", json!({})).await;
    assert!(body["errors"][0]["message"].as_str().is_some_and(|m| m.contains("secret")), "{body}");
    assert_eq!(body["data"], Value::Null, "{body}");

    let second = create(&app, "http://127.0.0.1:9/other", json!(["RESERVATION_CHANGED"])).await;
    assert_ne!(second["secret"].as_str(), Some(secret.as_str()), "every endpoint has its own secret");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_update_changes_the_given_fields_and_unknown_endpoints_are_null_or_false() {
    let app = TestApp::spawn().await;
    let operator = app.operator();
    let id = endpoint(&app, "https://hooks.example.com/in").await;
    let change = json!({ "input": { "id": id, "active": false, "events": ["RESERVATION_CHANGED"] } });
    let changed = app.mutate(&operator, "updateWebhook", UPDATE, change).await;
    assert_eq!(
        changed,
        json!({ "id": id, "url": "https://hooks.example.com/in", "events": ["RESERVATION_CHANGED"], "active": false })
    );
    let change = json!({ "input": { "id": id, "url": "https://Other.Example.com" } });
    let changed = app.mutate(&operator, "updateWebhook", UPDATE, change).await;
    assert_eq!(
        (&changed["url"], &changed["events"], &changed["active"]),
        (&json!("https://other.example.com/"), &json!(["RESERVATION_CHANGED"]), &json!(false)),
    );

    let unknown = Uuid::new_v4();
    let body =
        app.mutate(&operator, "updateWebhook", UPDATE, json!({ "input": { "id": unknown, "active": true } })).await;
    assert_eq!(body, Value::Null);
    assert_eq!(app.mutate(&operator, "redeliverFailed", REDELIVER, json!({ "id": unknown })).await, json!(0));
    assert_eq!(app.mutate(&operator, "deleteWebhook", DELETE, json!({ "id": unknown })).await, json!(false));

    delivery(&app, id, "FAILED", 3, 10).await;
    assert_eq!(app.mutate(&operator, "deleteWebhook", DELETE, json!({ "id": id })).await, json!(true));
    assert_eq!(app.mutate(&operator, "deleteWebhook", DELETE, json!({ "id": id })).await, json!(false));
    assert_eq!(app.count("SELECT count(*) FROM webhook_endpoints").await, 0);
    assert_eq!(app.count("SELECT count(*) FROM webhook_deliveries").await, 0, "its deliveries went with it");
}

#[tokio::test(flavor = "multi_thread")]
async fn urls_the_egress_rules_refuse_and_empty_event_lists_are_bad_input_and_write_nothing() {
    let app = TestApp::spawn().await;
    let operator = app.operator();
    let kept = endpoint(&app, "https://hooks.example.com/in").await;
    let too_long = format!("https://hooks.example.com/{}", "a".repeat(MAX_URL_LEN));
    let refused = [
        "http://hooks.example.com/in",
        "ftp://hooks.example.com/in",
        "https://10.0.0.5/in",
        "https://192.168.1.10/in",
        "https://172.20.0.1/in",
        "https://169.254.169.254/latest/meta-data/",
        "https://[::ffff:169.254.169.254]/",
        "https://[fd00::1]/",
        "https://100.64.0.1/",
        "https://localhost:9000/in",
        "http://127.0.0.1:9000/in",
        "https://2130706433/",
        "https://user:password@hooks.example.com/in",
        too_long.as_str(),
        "not a url",
    ];
    for url in refused {
        let body = create(&app, url, json!(["STOCK_CHANGED"])).await;
        assert_eq!(error_code(&body), Some("BAD_USER_INPUT"), "{url}: {body}");
        assert_eq!(body["errors"][0]["extensions"]["field"], "input.url", "{url}: {body}");
        let change = json!({ "input": { "id": kept, "url": url, "active": false } });
        let body = app.graphql(Some(&operator), UPDATE, change).await;
        assert_eq!(error_code(&body), Some("BAD_USER_INPUT"), "{url}: {body}");
    }
    let body = create(&app, "https://hooks.example.com/other", json!([])).await;
    assert_eq!(
        (error_code(&body), &body["errors"][0]["extensions"]["field"]),
        (Some("BAD_USER_INPUT"), &json!("input.events"))
    );
    let body =
        app.graphql(Some(&operator), UPDATE, json!({ "input": { "id": kept, "events": [], "active": false } })).await;
    assert_eq!(error_code(&body), Some("BAD_USER_INPUT"), "{body}");

    let stored = app.rows("SELECT id, url, active, events FROM webhook_endpoints").await;
    let events = json!(["STOCK_CHANGED", "RESERVATION_CHANGED", "ORDER_CHANGED"]);
    assert_eq!(
        stored,
        vec![json!({ "id": kept, "url": "https://hooks.example.com/in", "active": true, "events": events })]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn http_to_loopback_is_allowed_with_the_setting_and_nothing_else_opens() {
    let app = with_loopback().await;
    for url in ["http://127.0.0.1:9000/in", "http://localhost:9000/in", "http://[::1]:9000/in", "https://127.0.0.1/in"]
    {
        let created = create(&app, url, json!(["STOCK_CHANGED"])).await;
        assert_eq!(created["endpoint"]["url"], url, "{created}");
    }
    for url in ["http://hooks.example.com/in", "http://10.0.0.5/in", "https://169.254.169.254/", "https://[fe80::1]/"] {
        let body = create(&app, url, json!(["STOCK_CHANGED"])).await;
        assert_eq!(error_code(&body), Some("BAD_USER_INPUT"), "{url}: {body}");
    }
    assert_eq!(app.count("SELECT count(*) FROM webhook_endpoints").await, 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn webhook_endpoints_come_a_page_at_a_time_oldest_first() {
    let app = TestApp::spawn().await;
    let mut made = Vec::new();
    for n in 0..5 {
        made.push(endpoint(&app, &format!("https://hooks.example.com/{n}")).await);
    }
    let operator = app.operator();
    let (mut seen, mut after, mut pages) = (Vec::new(), Value::Null, 0);
    loop {
        let body = app.graphql(Some(&operator), ENDPOINTS, json!({ "first": 2, "after": after })).await;
        let connection = &body["data"]["webhookEndpoints"];
        seen.extend(ids(&connection["nodes"]));
        pages += 1;
        if connection["pageInfo"]["hasNextPage"] != json!(true) {
            break;
        }
        after = connection["pageInfo"]["endCursor"].clone();
    }
    assert_eq!((seen, pages), (made, 3));
    for first in [0, 101] {
        let body = app.graphql(Some(&operator), ENDPOINTS, json!({ "first": first })).await;
        assert_eq!(error_code(&body), Some("BAD_USER_INPUT"), "{body}");
    }
    let body = app.graphql(Some(&operator), ENDPOINTS, json!({ "after": "nonsense" })).await;
    assert_eq!(error_code(&body), Some("BAD_USER_INPUT"), "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn deliveries_are_listed_by_status_and_failed_ones_are_sent_again() {
    let app = TestApp::spawn().await;
    let operator = app.operator();
    let hook = idle_endpoint(&app, "https://hooks.example.com/in").await;
    let failed = [delivery(&app, hook, "FAILED", 12, 50).await, delivery(&app, hook, "FAILED", 12, 40).await];
    let delivered = delivery(&app, hook, "DELIVERED", 1, 30).await;
    let pending = delivery(&app, hook, "PENDING", 2, 20).await;
    let other = endpoint(&app, "https://hooks.example.com/other").await;
    let others = delivery(&app, other, "FAILED", 12, 10).await;

    let page = |status: Value, first: i32, after: Value| {
        let app = &app;
        let operator = operator.clone();
        async move {
            let variables = json!({ "status": status, "first": first, "after": after });
            let body = app.graphql(Some(&operator), DELIVERIES, variables).await;
            assert!(body.get("errors").is_none(), "{body}");
            body["data"]["webhookEndpoints"]["nodes"][0]["deliveries"].clone()
        }
    };
    let failures = page(json!("FAILED"), 20, Value::Null).await;
    assert_eq!(ids(&failures["nodes"]), failed, "{failures}");
    let first = &failures["nodes"][0];
    assert_eq!(
        (
            &first["status"],
            &first["attempts"],
            &first["lastResponseStatus"],
            &first["lastError"],
            &first["nextAttemptAt"]
        ),
        (&json!("FAILED"), &json!(12), &json!(503), &json!("HTTP 503"), &Value::Null),
        "{first}"
    );
    assert_eq!(first["eventIds"].as_array().map(Vec::len), Some(2), "{first}");
    let done = page(json!("DELIVERED"), 20, Value::Null).await;
    assert_eq!(ids(&done["nodes"]), [delivered]);
    assert!(done["nodes"][0]["deliveredAt"].is_string(), "{done}");
    // All of them, three a page, oldest first.
    let head = page(Value::Null, 3, Value::Null).await;
    assert_eq!(head["pageInfo"]["hasNextPage"], true, "{head}");
    let tail = page(Value::Null, 3, head["pageInfo"]["endCursor"].clone()).await;
    let all: Vec<Uuid> = ids(&head["nodes"]).into_iter().chain(ids(&tail["nodes"])).collect();
    assert_eq!(all, [failed[0], failed[1], delivered, pending]);

    let before = app.rows("SELECT now()::text AS at").await[0]["at"].clone();
    assert_eq!(app.mutate(&operator, "redeliverFailed", REDELIVER, json!({ "id": hook })).await, json!(2));
    let rows = app
        .rows(&format!(
            "SELECT id, status, attempts, next_attempt_at >= '{}' AND next_attempt_at <= now() AS due
               FROM webhook_deliveries WHERE endpoint_id = '{hook}' ORDER BY created_at",
            before.as_str().expect("a time")
        ))
        .await;
    let expected = [
        json!({ "id": failed[0], "status": "PENDING", "attempts": 0, "due": true }),
        json!({ "id": failed[1], "status": "PENDING", "attempts": 0, "due": true }),
        json!({ "id": delivered, "status": "DELIVERED", "attempts": 1, "due": false }),
        json!({ "id": pending, "status": "PENDING", "attempts": 2, "due": false }),
    ];
    assert_eq!(rows, expected);
    let untouched = app.rows(&format!("SELECT status FROM webhook_deliveries WHERE id = '{others}'")).await;
    assert_eq!(untouched, vec![json!({ "status": "FAILED" })], "another endpoint's failures stay");
    assert_eq!(app.mutate(&operator, "redeliverFailed", REDELIVER, json!({ "id": hook })).await, json!(0));
    let again = page(json!("PENDING"), 20, Value::Null).await;
    assert_eq!(ids(&again["nodes"]), [failed[0], failed[1], pending]);
    assert!(again["nodes"][0]["nextAttemptAt"].is_string(), "{again}");
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_deliveries_replayed_by_many_callers_at_once_are_counted_once() {
    let app = Arc::new(TestApp::spawn().await);
    let hook = idle_endpoint(&app, "https://hooks.example.com/in").await;
    for age in 0..30 {
        delivery(&app, hook, "FAILED", 12, age).await;
    }
    let calls = (0..12)
        .map(|_| {
            let app = app.clone();
            async move { app.mutate(&app.operator(), "redeliverFailed", REDELIVER, json!({ "id": hook })).await }
                .boxed()
        })
        .collect();
    let counts: Vec<i64> = at_once(calls).await.iter().map(|n| n.as_i64().unwrap_or_else(|| panic!("{n}"))).collect();
    assert_eq!(counts.iter().sum::<i64>(), 30, "each delivery replayed by one caller: {counts:?}");
    assert_eq!(
        app.count("SELECT count(*) FROM webhook_deliveries WHERE status = 'PENDING' AND attempts = 0").await,
        30
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn many_webhooks_created_at_once_are_all_created_and_listed() {
    let app = Arc::new(TestApp::spawn().await);
    let calls = (0..24)
        .map(|n| {
            let app = app.clone();
            async move { create(&app, &format!("https://hooks.example.com/{n}"), json!(["STOCK_CHANGED"])).await }
                .boxed()
        })
        .collect();
    let created = at_once(calls).await;
    let mut made: Vec<Uuid> = created.iter().map(|answer| uuid(&answer["endpoint"]["id"])).collect();
    let mut secrets: Vec<&str> = created.iter().filter_map(|answer| answer["secret"].as_str()).collect();
    secrets.sort_unstable();
    secrets.dedup();
    assert_eq!(secrets.len(), 24, "a secret of its own for each");
    assert_eq!(app.count("SELECT count(DISTINCT secret) FROM webhook_endpoints").await, 24);
    let body = app.graphql(Some(&app.operator()), ENDPOINTS, json!({ "first": 100 })).await;
    let mut listed = ids(&body["data"]["webhookEndpoints"]["nodes"]);
    made.sort();
    listed.sort();
    assert_eq!(listed, made);
}
