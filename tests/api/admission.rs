//! Admission: what a request refused at the in-flight limit is counted as.

use sea_orm::{ConnectionTrait, TransactionTrait};
use serde_json::{Value, json};
use stockguard::{auth::Role, config::Limits};

use crate::helpers::{Isolation, Options, TestApp};

/// The value of the `/metrics` line that starts with `series` and a space.
async fn metric(app: &TestApp, series: &str) -> Option<f64> {
    let text = app.client.get(format!("{}/metrics", app.address)).send().await.expect("metrics");
    let text = text.text().await.expect("metrics text");
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_overloaded_request_is_counted_as_overloaded_and_not_as_a_database_failure() {
    let limits = Limits { max_in_flight: 1, coalesce: false, ..Limits::default() };
    let app = std::sync::Arc::new(
        TestApp::spawn_with_options(Options { isolation: Isolation::ReadCommitted, limits, ..Options::default() })
            .await,
    );
    let id = app.create_inventory("ADMIT-1", 10).await;
    let alice = app.token("alice", Role::Customer);
    // One request waits on a row this test holds, filling the server.
    let holder = app.db.begin().await.expect("begin");
    holder.execute_unprepared(&format!("SELECT 1 FROM inventories WHERE id = '{id}' FOR UPDATE")).await.expect("lock");
    let waiting = {
        let (app, alice) = (app.clone(), alice.clone());
        tokio::spawn(async move { app.reserve(&alice, json!({ "inventoryId": id })).await })
    };
    app.until_waiting_for_a_lock("").await;
    let overloaded_before = metric(&app, "stockguard_overloaded_total").await.unwrap_or(0.0);

    let body: Value = app
        .client
        .post(format!("{}/graphql", app.address))
        .bearer_auth(&alice)
        .json(&json!({ "query": "{ inventories { nodes { id } } }" }))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(body["errors"][0]["extensions"]["code"], "OVERLOADED", "{body}");

    // Counters are per process and other tests run beside this one, so the
    // refusal is seen as a rise of its own counter, and as no database
    // failure of class `overloaded` at all (no code path counts one).
    let overloaded_after = metric(&app, "stockguard_overloaded_total").await.unwrap_or(0.0);
    assert!(overloaded_after > overloaded_before, "{overloaded_before} -> {overloaded_after}");
    assert_eq!(metric(&app, "stockguard_db_failures_total{class=\"overloaded\"}").await, None);

    holder.rollback().await.expect("release the row");
    assert_eq!(waiting.await.expect("task")["__typename"], "Reserved");
}
