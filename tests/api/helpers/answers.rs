//! Reading answers, starting requests at once, and waiting for a condition
//! that the test then asserts.

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::future::{BoxFuture, join_all};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use serde_json::{Value, json};
use stockguard::db;
use tokio::sync::Barrier;
use uuid::Uuid;

/// The `__typename` of a mutation's answer, or `"ERROR"` when the body has
/// errors (or no typename).
pub fn typename(answer: &Value) -> &str {
    answer["__typename"].as_str().unwrap_or("ERROR")
}

/// A mutation's answer beside its [`typename`], for tests that compare many.
pub fn named(answer: Value) -> (String, Value) {
    (typename(&answer).to_owned(), answer)
}

/// Every `(typename, answer)` named `name`.
pub fn count(results: &[(String, Value)], name: &str) -> usize {
    results.iter().filter(|(n, _)| n == name).count()
}

/// The typenames of `(typename, answer)` pairs, for messages.
pub fn names(results: &[(String, Value)]) -> Vec<&str> {
    results.iter().map(|(n, _)| n.as_str()).collect()
}

/// Starts every request at the same moment (one task each, behind one
/// barrier) and returns the results in the order given.
pub async fn at_once<T: Send + 'static>(requests: Vec<BoxFuture<'static, T>>) -> Vec<T> {
    let barrier = Arc::new(Barrier::new(requests.len()));
    let tasks = requests.into_iter().map(|request| {
        let barrier = barrier.clone();
        tokio::spawn(async move {
            barrier.wait().await;
            request.await
        })
    });
    join_all(tasks).await.into_iter().map(|r| r.expect("task")).collect()
}

/// Sweeps batches of `batch` until nothing more is due, re-running
/// collisions (two sweeps on one inventory) as the sweeper does; how many
/// reservations it expired.
///
/// A sweep that finds nothing is believed only when no due reservation is
/// left: PostgreSQL answers a collision before it has rolled the failed
/// sweep back, so the next sweep, on another connection, can find the due
/// rows still locked by the dying one and skip them.
pub async fn sweep_all(db: &DatabaseConnection, batch: i64) -> i64 {
    let mut total = 0;
    loop {
        match stockguard::reservations::sweeper::sweep_once(db, batch).await {
            Ok(0) if !anything_due(db).await => return total,
            Ok(0) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            Ok(expired) => total += expired,
            Err(err) => assert!(db::classify(&err).is_collision(), "{err}"),
        }
    }
}

async fn anything_due(db: &DatabaseConnection) -> bool {
    let due = "SELECT EXISTS (SELECT 1 FROM reservations WHERE status = 'ACTIVE' AND expires_at <= now())";
    let row = db.query_one_raw(Statement::from_string(DbBackend::Postgres, due)).await.expect("read what is due");
    row.expect("one row").try_get_by_index(0).expect("a bool")
}

/// A UUID from a JSON string.
pub fn uuid(value: &Value) -> Uuid {
    value.as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("not a UUID: {value}"))
}

/// An order's lines as `(inventory id, quantity)`, sorted.
pub fn order_lines(order: &Value) -> Vec<(Uuid, i64)> {
    let items = order["items"].as_array().unwrap_or_else(|| panic!("no items: {order}"));
    let mut lines: Vec<(Uuid, i64)> = items
        .iter()
        .map(|item| (uuid(&item["inventory"]["id"]), item["quantity"].as_i64().expect("quantity")))
        .collect();
    lines.sort();
    lines
}

/// A complete shipping address whose first line is `line1`.
pub fn address(line1: &str) -> Value {
    json!({ "name": "Alice Example", "line1": line1, "line2": "Floor 2", "city": "Lisbon", "postalCode": "1100-148", "country": "PT" })
}

/// The `extensions.code` of the first error of a response.
pub fn error_code(body: &Value) -> Option<&str> {
    body["errors"][0]["extensions"]["code"].as_str()
}

/// Runs `call` again, as a client told `retryable` would, while it answers
/// the retryable `DATABASE_UNAVAILABLE` (a statement pool that stayed full
/// past its acquire timeout, collisions that ran out), at most 10 times;
/// the last answer. For tests whose subject is not that refusal: a call
/// that wrote something before refusing would show in what they count
/// next (a second reservation, a release answered `ReservationNotActive`).
pub async fn retried<F, Fut>(mut call: F) -> Value
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Value>,
{
    let mut answer = call().await;
    for _ in 1..10 {
        if error_code(&answer) != Some("DATABASE_UNAVAILABLE") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        answer = call().await;
    }
    answer
}

/// Polls `probe` every 20 ms until it holds, and fails the test (naming
/// `what`) when it has not within `limit`: a wait that cannot pass without
/// the condition. Returns how long it took.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut probe: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if probe().await {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of the `/metrics` line of the server at `address` that starts
/// with `series` and a space; none while it has no such line.
pub async fn metric(client: &reqwest::Client, address: &str, series: &str) -> Option<f64> {
    let text = client.get(format!("{address}/metrics")).send().await.expect("metrics");
    let text = text.text().await.expect("metrics text");
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Every node of an `EXPLAIN (FORMAT JSON)` plan, `plan` first.
pub fn plan_nodes(plan: &Value) -> Vec<&Value> {
    let children = plan["Plans"].as_array().into_iter().flatten();
    std::iter::once(plan).chain(children.flat_map(plan_nodes)).collect()
}
