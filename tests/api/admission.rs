//! Admission: a server whose in-flight operations are all taken refuses the
//! next one at once, and counts it as overloaded, not as a database failure.

use std::{sync::Arc, time::Duration};

use sea_orm::{ConnectionTrait, DatabaseTransaction, TransactionTrait};
use serde_json::{Value, json};
use stockguard::{auth::Role, config::Limits};
use tokio::task::JoinHandle;

use crate::helpers::{Isolation, Options, TestApp, eventually};

/// A server with `max_in_flight` operations, every one of them a reserve
/// waiting in PostgreSQL on a row the test holds.
struct Full {
    app: Arc<TestApp>,
    /// Holds the row the reserves wait on; rolled back by [`Full::release`].
    holder: DatabaseTransaction,
    waiting: Vec<JoinHandle<Value>>,
    /// The customer every request is sent as.
    alice: String,
}

impl Full {
    async fn new(max_in_flight: usize, sku: &str) -> Self {
        // Each request its own statement, so each waits on the row in PostgreSQL.
        let limits = Limits { max_in_flight, coalesce: false, ..Limits::default() };
        let app = Arc::new(
            TestApp::spawn_with_options(Options { isolation: Isolation::ReadCommitted, limits, ..Options::default() })
                .await,
        );
        let id = app.create_inventory(sku, 10).await;
        let alice = app.token("alice", Role::Customer);
        let holder = app.db.begin().await.expect("begin");
        holder
            .execute_unprepared(&format!("SELECT 1 FROM inventories WHERE id = '{id}' FOR UPDATE"))
            .await
            .expect("lock");
        let waiting = (0..max_in_flight)
            .map(|i| {
                let (app, alice) = (app.clone(), alice.clone());
                tokio::spawn(async move {
                    app.reserve(&alice, json!({ "inventoryId": id, "idempotencyKey": format!("wait-{i}") })).await
                })
            })
            .collect();
        let blocked =
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'";
        let expected = i64::try_from(max_in_flight).expect("a small limit");
        eventually(Duration::from_secs(20), "every admitted request reaches the database", || async {
            app.count(blocked).await == expected
        })
        .await;
        Self { app, holder, waiting, alice }
    }

    /// One more request, past the limit.
    async fn one_more(&self) -> reqwest::Response {
        self.app
            .client
            .post(format!("{}/graphql", self.app.address))
            .bearer_auth(&self.alice)
            .json(&json!({ "query": "{ inventories { nodes { id } } }" }))
            .send()
            .await
            .expect("send")
    }

    /// Lets the row go: every admitted request is then served.
    async fn release(self) -> Arc<TestApp> {
        self.holder.rollback().await.expect("release the row");
        for task in self.waiting {
            assert_eq!(task.await.expect("task")["__typename"], "Reserved");
        }
        self.app
    }
}

/// The value of `app`'s `/metrics` line that starts with `series` and a space.
async fn metric(app: &TestApp, series: &str) -> Option<f64> {
    crate::helpers::metric(&app.client, &app.address, series).await
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_past_the_in_flight_limit_are_refused_at_once_not_queued() {
    let full = Full::new(2, "FULL-1").await;

    let response = full.one_more().await;
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["errors"][0]["extensions"]["code"], "OVERLOADED", "{body}");
    assert_eq!(body["errors"][0]["extensions"]["retryable"], true);

    full.release().await.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_overloaded_request_is_counted_as_overloaded_and_not_as_a_database_failure() {
    let full = Full::new(1, "ADMIT-1").await;
    let overloaded_before = metric(&full.app, "stockguard_overloaded_total").await.unwrap_or(0.0);

    let body: Value = full.one_more().await.json().await.expect("json");
    assert_eq!(body["errors"][0]["extensions"]["code"], "OVERLOADED", "{body}");

    // Counters are per process and other tests run beside this one, so the
    // refusal is seen as a rise of its own counter, and as no database
    // failure of class `overloaded` at all (no code path counts one).
    let overloaded_after = metric(&full.app, "stockguard_overloaded_total").await.unwrap_or(0.0);
    assert!(overloaded_after > overloaded_before, "{overloaded_before} -> {overloaded_after}");
    assert_eq!(metric(&full.app, "stockguard_db_failures_total{class=\"overloaded\"}").await, None);

    full.release().await;
}
