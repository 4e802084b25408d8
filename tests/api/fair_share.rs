//! Fair share (docs/operations.md): the cost in every response, a budget per
//! caller that refuses before anything runs and refills, and a share of the
//! in-flight limit per caller that leaves every other caller admitted.

use std::{sync::Arc, time::Duration};

use sea_orm::{ConnectionTrait, TransactionTrait};
use serde_json::{Value, json};
use stockguard::{auth::Role, config::Limits};

use crate::{
    helpers::{Isolation, Options, TestApp, eventually},
    ws::{connect_with, next_result, send},
};

/// A page of inventories with three fields per row.
const PAGE: &str = "query($f: Int) { inventories(first: $f) { nodes { id sku stock } } }";

/// What a request got back: its status, `Retry-After`, and its body.
struct Answer {
    status: u16,
    retry_after: Option<u64>,
    body: Value,
}

impl Answer {
    fn code(&self) -> Option<&str> {
        self.body["errors"][0]["extensions"]["code"].as_str()
    }

    /// `extensions.cost.<name>` as an integer.
    fn cost(&self, name: &str) -> i64 {
        self.body["extensions"]["cost"][name].as_i64().unwrap_or_else(|| panic!("cost.{name} in {}", self.body))
    }

    /// `extensions.cost.throttleStatus.<name>`.
    fn throttle(&self, name: &str) -> f64 {
        let value = &self.body["extensions"]["cost"]["throttleStatus"][name];
        value.as_f64().unwrap_or_else(|| panic!("throttleStatus.{name} in {}", self.body))
    }
}

/// POSTs `query` as `token` (or anonymously), with `X-Forwarded-For:
/// forwarded` when given, asking for `application/graphql-response+json`.
async fn ask(app: &TestApp, token: Option<&str>, forwarded: Option<&str>, query: &str, variables: Value) -> Answer {
    let mut request = app
        .client
        .post(format!("{}/graphql", app.address))
        .header("accept", "application/graphql-response+json")
        .json(&json!({ "query": query, "variables": variables }));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(forwarded) = forwarded {
        request = request.header("x-forwarded-for", forwarded);
    }
    answer(request.send().await.expect("send")).await
}

async fn answer(response: reqwest::Response) -> Answer {
    let status = response.status().as_u16();
    let retry_after = response.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse().ok());
    Answer { status, retry_after, body: response.json().await.expect("a JSON body") }
}

/// A server with small buckets that refill slowly (`rate` points a second).
async fn with_buckets(size: f64, rate: f64, trusted_proxies: &str) -> TestApp {
    let limits = Limits {
        bucket_size: size,
        bucket_restore_rate: rate,
        operator_bucket_size: size * 10.0,
        operator_bucket_restore_rate: rate * 10.0,
        trusted_proxies: trusted_proxies
            .split(',')
            .filter(|p| !p.is_empty())
            .map(|p| p.parse().expect("net"))
            .collect(),
        ..Limits::default()
    };
    TestApp::spawn_with_options(Options { limits, ..Options::default() }).await
}

/// Sends `query` until it is refused, at most 200 times; the refusal.
async fn until_throttled(app: &TestApp, token: Option<&str>, forwarded: Option<&str>, query: &str) -> Answer {
    for _ in 0..200 {
        let answer = ask(app, token, forwarded, query, json!({ "f": 10 })).await;
        if answer.status != 200 {
            return answer;
        }
    }
    panic!("never throttled");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_response_carries_its_cost_and_a_short_page_costs_what_it_resolved() {
    let app = TestApp::spawn().await;
    for n in 0..6 {
        app.create_inventory(&format!("COST-{n}"), 5).await;
    }
    // One point per field, a connection's fields `first` times: 100 rows
    // of `nodes { id sku stock }` are 100 × 4 + 1.
    let full = ask(&app, None, None, PAGE, json!({ "f": 100 })).await;
    assert_eq!((full.status, full.cost("requestedQueryCost")), (200, 401), "{}", full.body);
    let short = ask(&app, None, None, PAGE, json!({ "f": 3 })).await;
    assert_eq!(short.cost("requestedQueryCost"), 13);
    // 6 rows came back of the 100 asked: 6 rows of 3 fields more than a page of 3.
    let (six, three) = (full.cost("actualQueryCost"), short.cost("actualQueryCost"));
    assert_eq!(six - three, 9, "six {six}, three {three}");
    assert!(six < 401 / 10, "a short page costs what it read: {six}");
    let max = full.throttle("maximumAvailable");
    assert_eq!(
        (max, full.throttle("restoreRate")),
        (Limits::default().bucket_size, Limits::default().bucket_restore_rate)
    );
    assert!(full.throttle("currentlyAvailable") <= max);

    // GET.
    let get = app
        .client
        .get(format!("{}/graphql", app.address))
        .query(&[("query", "{ inventories(first: 2) { nodes { id } } }")]);
    let get = answer(get.send().await.expect("get")).await;
    assert_eq!((get.status, get.cost("requestedQueryCost")), (200, 5), "{}", get.body);
    assert!(get.cost("actualQueryCost") > 0);

    // Errors: a document refused in validation, a request refused before
    // it was measured, and a field error.
    let invalid = ask(&app, None, None, "{ inventories { nope } }", json!({})).await;
    assert_eq!((invalid.status, invalid.code()), (400, Some("GRAPHQL_VALIDATION_FAILED")), "{}", invalid.body);
    assert_eq!((invalid.cost("requestedQueryCost"), invalid.cost("actualQueryCost")), (0, 0));
    let unparsed = ask(&app, None, None, "{ inventories", json!({})).await;
    assert_eq!(unparsed.status, 400);
    assert_eq!(unparsed.cost("actualQueryCost"), 0, "{}", unparsed.body);
    let field_error = ask(&app, None, None, "{ myReservations { nodes { id } } }", json!({})).await;
    assert_eq!(field_error.code(), Some("UNAUTHENTICATED"), "{}", field_error.body);
    assert!(field_error.cost("requestedQueryCost") > 0);

    // A websocket's result.
    let operator = app.operator();
    let mut socket =
        connect_with(&app.address, "graphql-transport-ws", json!({ "Authorization": format!("Bearer {operator}") }))
            .await;
    let subscribe = json!({ "id": "q", "type": "subscribe", "payload": { "query": PAGE, "variables": { "f": 3 } } });
    send(&mut socket, subscribe).await;
    let result = next_result(&mut socket).await;
    assert_eq!(result["type"], "next", "{result}");
    let cost = &result["payload"]["extensions"]["cost"];
    assert_eq!(
        (cost["requestedQueryCost"].as_i64(), cost["actualQueryCost"].as_i64()),
        (Some(13), Some(three)),
        "{result}"
    );
    assert_eq!(
        cost["throttleStatus"]["maximumAvailable"].as_f64(),
        Some(Limits::default().operator_bucket_size),
        "an operator's bucket"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spent_budget_refuses_with_429_and_retry_after_writes_nothing_and_refills() {
    let app = with_buckets(100.0, 5.0, "").await;
    let id = app.create_inventory("BUDGET-1", 1000).await;
    let alice = app.token("alice", Role::Customer);
    let reserve = format!(
        "mutation {{ reserve(input: {{ inventoryId: \"{id}\" }}) {{ __typename ... on Reserved {{ reservation {{ id }} }} }} }}"
    );
    let mut granted = 0;
    let refused = loop {
        let answer = ask(&app, Some(&alice), None, &reserve, json!({})).await;
        if answer.status != 200 {
            break answer;
        }
        assert_eq!(answer.body["data"]["reserve"]["__typename"], "Reserved", "{}", answer.body);
        granted += 1;
        assert!(granted < 100, "never throttled");
    };
    assert!(granted >= 1);
    assert_eq!((refused.status, refused.code()), (429, Some("THROTTLED")), "{}", refused.body);
    // `application/json` gets the same refusal. The bucket refills while
    // the machine is slow, so a request may pass first, which spends it again.
    let bearer = format!("Bearer {alice}");
    let mut legacy_granted = 0;
    let legacy = loop {
        let legacy = stockguard_support::client::request(&reserve, json!({}));
        let legacy = app.post(Some(&bearer), legacy).await.expect("send");
        if legacy.status != 200 {
            break legacy;
        }
        legacy_granted += 1;
        assert!(legacy_granted < 5, "application/json never throttled");
    };
    assert_eq!(legacy.status, 429);
    granted += legacy_granted;
    assert!(refused.body.get("data").is_none(), "nothing ran: {}", refused.body);
    let wait = refused.body["errors"][0]["extensions"]["retryAfterMs"].as_u64().expect("retryAfterMs");
    assert!(wait > 0 && wait <= 20_000, "at most the whole cost at 5 points a second: {wait}");
    assert_eq!(refused.retry_after, Some(wait.div_ceil(1000)), "Retry-After in whole seconds");
    assert!(refused.cost("requestedQueryCost") > 0);
    assert!(refused.throttle("currentlyAvailable") < refused.cost("requestedQueryCost") as f64);
    // Nothing was written by the refused reserve.
    let reservations = format!("SELECT count(*) FROM reservations WHERE inventory_id = '{id}'");
    assert_eq!(app.count(&reservations).await, granted);
    assert_eq!(app.stock_and_version(id).await.0, 1000 - granted as i32);

    // Bob's bucket is his own.
    let bob = app.token("bob", Role::Customer);
    assert_eq!(ask(&app, Some(&bob), None, &reserve, json!({})).await.status, 200);

    // Once the time it named has passed, alice is served again.
    tokio::time::sleep(Duration::from_millis(wait + 50)).await;
    let again = ask(&app, Some(&alice), None, &reserve, json!({})).await;
    assert_eq!(again.body["data"]["reserve"]["__typename"], "Reserved", "{}", again.body);
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn operators_have_the_larger_bucket() {
    let app = with_buckets(100.0, 0.01, "").await;
    // 40 rows of three fields request 161 points: more than a customer's
    // bucket holds, well within an operator's.
    let query = "{ inventories(first: 40) { nodes { id sku stock } } }";
    let alice = app.token("alice", Role::Customer);
    let customer = ask(&app, Some(&alice), None, query, json!({})).await;
    assert_eq!((customer.status, customer.code()), (429, Some("THROTTLED")), "{}", customer.body);
    assert_eq!(customer.throttle("maximumAvailable"), 100.0);
    let operator = ask(&app, Some(&app.operator()), None, query, json!({})).await;
    assert_eq!(operator.status, 200, "{}", operator.body);
    assert_eq!(operator.throttle("maximumAvailable"), 1000.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn anonymous_callers_are_kept_by_address_and_forwarded_for_counts_only_from_trusted_proxies() {
    // Untrusted (the default): the header is the client's own words, so
    // every anonymous request from this address shares one bucket.
    let app = with_buckets(100.0, 0.01, "").await;
    for n in 0..10 {
        app.create_inventory(&format!("ANON-{n}"), 1).await;
    }
    let refused = until_throttled(&app, None, Some("198.51.100.1"), PAGE).await;
    assert_eq!(refused.code(), Some("THROTTLED"), "{}", refused.body);
    let other = ask(&app, None, Some("198.51.100.2"), PAGE, json!({ "f": 10 })).await;
    assert_eq!(other.code(), Some("THROTTLED"), "a forged header earns no new bucket: {}", other.body);
    // A signed-in caller from the same address has a bucket of their own.
    let alice = app.token("alice", Role::Customer);
    assert_eq!(ask(&app, Some(&alice), None, PAGE, json!({ "f": 10 })).await.status, 200);
    drop(app);

    // Behind a trusted proxy (the test's own loopback address), the
    // forwarded client is the caller.
    let app = with_buckets(100.0, 0.01, "127.0.0.0/8").await;
    for n in 0..10 {
        app.create_inventory(&format!("ANON-{n}"), 1).await;
    }
    until_throttled(&app, None, Some("198.51.100.1"), PAGE).await;
    let other = ask(&app, None, Some("198.51.100.2"), PAGE, json!({ "f": 10 })).await;
    assert_eq!(other.status, 200, "another client behind the proxy: {}", other.body);
    // A client that writes its own header in front of the proxy's is still
    // the address the proxy saw.
    let forged = ask(&app, None, Some("198.51.100.2, 198.51.100.1"), PAGE, json!({ "f": 10 })).await;
    assert_eq!(forged.code(), Some("THROTTLED"), "{}", forged.body);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_caller_past_its_in_flight_share_is_throttled_at_once_while_another_is_admitted() {
    let limits = Limits { max_in_flight_per_caller: 3, coalesce: false, ..Limits::default() };
    let app = Arc::new(
        TestApp::spawn_with_options(Options { isolation: Isolation::ReadCommitted, limits, ..Options::default() })
            .await,
    );
    let id = app.create_inventory("SHARE-1", 100).await;
    let (alice, bob) = (app.token("alice", Role::Customer), app.token("bob", Role::Customer));
    // Every reserve waits in PostgreSQL on the row the test holds.
    let holder = app.db.begin().await.expect("begin");
    holder.execute_unprepared(&format!("SELECT 1 FROM inventories WHERE id = '{id}' FOR UPDATE")).await.expect("lock");
    let reserve = format!("mutation {{ reserve(input: {{ inventoryId: \"{id}\" }}) {{ __typename }} }}");
    let fire = |token: String, n: usize| {
        let (app, reserve) = (app.clone(), reserve.clone());
        tokio::spawn(async move {
            (0..n)
                .map(|_| {
                    let (app, reserve, token) = (app.clone(), reserve.clone(), token.clone());
                    tokio::spawn(async move { ask(&app, Some(&token), None, &reserve, json!({})).await })
                })
                .collect::<Vec<_>>()
        })
    };
    // Alice floods with 12 at once: 3 are admitted and wait, 9 are refused
    // without waiting for them.
    let alices = fire(alice.clone(), 12).await.expect("spawned");
    let blocked =
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'";
    eventually(Duration::from_secs(20), "alice's share reaches the database", || async {
        app.count(blocked).await == 3
    })
    .await;
    // Bob's requests are all admitted (his reserves wait on the row too,
    // and his read is the third of his share).
    let bobs = fire(bob.clone(), 2).await.expect("spawned");
    eventually(Duration::from_secs(20), "bob's reserves reach the database", || async {
        app.count(blocked).await == 5
    })
    .await;
    let read = ask(&app, Some(&bob), None, PAGE, json!({ "f": 5 })).await;
    assert_eq!(read.status, 200, "{}", read.body);
    // Alice's share counts her websocket operations too.
    let mut socket =
        connect_with(&app.address, "graphql-transport-ws", json!({ "Authorization": format!("Bearer {alice}") })).await;
    send(&mut socket, json!({ "id": "w", "type": "subscribe", "payload": { "query": PAGE, "variables": { "f": 1 } } }))
        .await;
    let refused = next_result(&mut socket).await;
    assert_eq!(refused["payload"]["errors"][0]["extensions"]["code"], "THROTTLED", "{refused}");
    assert!(refused["payload"]["extensions"]["cost"].is_object(), "{refused}");

    holder.rollback().await.expect("release the row");
    let mut outcomes = Vec::new();
    for task in alices.into_iter().chain(bobs) {
        let answer = task.await.expect("task");
        outcomes.push((answer.status, answer.body["data"]["reserve"]["__typename"].as_str().map(str::to_owned)));
    }
    let reserved = outcomes.iter().filter(|(_, name)| name.as_deref() == Some("Reserved")).count();
    let throttled = outcomes.iter().filter(|(status, _)| *status == 429).count();
    assert_eq!((reserved, throttled), (5, 9), "{outcomes:?}");
    assert_eq!(app.count(&format!("SELECT count(*) FROM reservations WHERE inventory_id = '{id}'")).await, 5);
    app.assert_invariant().await;
}

/// Alice's reserves wait in PostgreSQL on a row the test holds, fired
/// `n` at once; the count of backends waiting on a lock is what ran.
fn fire_reserves(app: &Arc<TestApp>, token: &str, id: uuid::Uuid, n: usize) -> Vec<tokio::task::JoinHandle<Answer>> {
    let reserve = format!("mutation {{ reserve(input: {{ inventoryId: \"{id}\" }}) {{ __typename }} }}");
    (0..n)
        .map(|_| {
            let (app, token, reserve) = (app.clone(), token.to_owned(), reserve.clone());
            tokio::spawn(async move { ask(&app, Some(&token), None, &reserve, json!({})).await })
        })
        .collect()
}

const BLOCKED: &str =
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'";

#[tokio::test(flavor = "multi_thread")]
async fn an_operation_waits_for_its_turn_no_longer_than_the_turn_wait_then_is_throttled() {
    // A pool of 4 (one for the live listener) and 2 turns a caller: no
    // spare turn to borrow.
    let limits = Limits { max_running_per_caller: 2, max_turn_wait_ms: 500, coalesce: false, ..Limits::default() };
    let app = Arc::new(
        TestApp::spawn_with_options(Options {
            isolation: Isolation::ReadCommitted,
            limits,
            pool_size: 4,
            ..Options::default()
        })
        .await,
    );
    let id = app.create_inventory("TURN-1", 100).await;
    let (alice, bob) = (app.token("alice", Role::Customer), app.token("bob", Role::Customer));
    let holder = app.db.begin().await.expect("begin");
    holder.execute_unprepared(&format!("SELECT 1 FROM inventories WHERE id = '{id}' FOR UPDATE")).await.expect("lock");
    let running = fire_reserves(&app, &alice, id, 2);
    eventually(Duration::from_secs(20), "alice's two turns wait on the row", || async {
        app.count(BLOCKED).await == 2
    })
    .await;

    // Her next two wait for a turn that does not come within the turn
    // wait: refused, nothing ran.
    let waiting = fire_reserves(&app, &alice, id, 2);
    // Bob is served all the while.
    let read = ask(&app, Some(&bob), None, PAGE, json!({ "f": 5 })).await;
    assert_eq!(read.status, 200, "{}", read.body);
    for task in waiting {
        let refused = task.await.expect("task");
        assert_eq!((refused.status, refused.code()), (429, Some("THROTTLED")), "{}", refused.body);
        assert!(refused.retry_after.is_some(), "{}", refused.body);
        assert!(refused.body["data"].is_null(), "{}", refused.body);
    }
    assert_eq!(app.count(BLOCKED).await, 2, "the refused reserves never reached the database");

    holder.rollback().await.expect("release the row");
    for task in running {
        let ran = task.await.expect("task");
        assert_eq!(ran.body["data"]["reserve"]["__typename"], "Reserved", "{}", ran.body);
    }
    assert_eq!(app.count(&format!("SELECT count(*) FROM reservations WHERE inventory_id = '{id}'")).await, 2);
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_caller_within_its_budget_borrows_spare_turns_and_leaves_its_own_to_others() {
    // A pool of 8: the live listener's one, 2 turns a caller, and 3 spare.
    let limits = Limits { max_running_per_caller: 2, coalesce: false, ..Limits::default() };
    let app = Arc::new(
        TestApp::spawn_with_options(Options {
            isolation: Isolation::ReadCommitted,
            limits,
            pool_size: 8,
            ..Options::default()
        })
        .await,
    );
    let id = app.create_inventory("TURN-2", 100).await;
    let (alice, bob) = (app.token("alice", Role::Customer), app.token("bob", Role::Customer));
    let holder = app.db.begin().await.expect("begin");
    holder.execute_unprepared(&format!("SELECT 1 FROM inventories WHERE id = '{id}' FOR UPDATE")).await.expect("lock");
    // Alice's cheap burst of 8 runs on her 2 turns and the 3 spare ones.
    let alices = fire_reserves(&app, &alice, id, 8);
    eventually(Duration::from_secs(20), "five of alice's reserves run", || async { app.count(BLOCKED).await == 5 })
        .await;
    // Bob's two run on his own turns, beside all she borrowed.
    let bobs = fire_reserves(&app, &bob, id, 2);
    eventually(Duration::from_secs(20), "bob's reserves run too", || async { app.count(BLOCKED).await == 7 }).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(app.count(BLOCKED).await, 7, "alice's other three wait for a turn, not for the pool");

    holder.rollback().await.expect("release the row");
    for task in alices.into_iter().chain(bobs) {
        let ran = task.await.expect("task");
        assert_eq!(ran.body["data"]["reserve"]["__typename"], "Reserved", "{}", ran.body);
    }
    assert_eq!(app.count(&format!("SELECT count(*) FROM reservations WHERE inventory_id = '{id}'")).await, 10);
    app.assert_invariant().await;
}
