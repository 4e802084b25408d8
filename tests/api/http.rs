//! The transport: status codes for bodies that never become GraphQL, the
//! limits, health and readiness, GraphiQL.

use serde_json::{Value, json};

use crate::helpers::TestApp;

async fn post_raw(app: &TestApp, body: impl Into<reqwest::Body>) -> (u16, String) {
    let response = app
        .client
        .post(format!("{}/graphql", app.address))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("send");
    (response.status().as_u16(), response.text().await.expect("body"))
}

#[tokio::test(flavor = "multi_thread")]
async fn bodies_that_are_not_graphql_requests_get_400_and_oversized_ones_413() {
    let app = TestApp::spawn().await;
    assert_eq!(post_raw(&app, "{not json").await.0, 400);
    assert_eq!(post_raw(&app, r#"{"foo": 1}"#).await.0, 400);
    assert_eq!(post_raw(&app, "[1, 2]").await.0, 400);
    let padding = "x".repeat(70 * 1024);
    let huge = json!({ "query": format!("{{ inventories {{ nodes {{ id }} }} }} # {padding}") }).to_string();
    assert_eq!(post_raw(&app, huge).await.0, 413);
}

#[tokio::test(flavor = "multi_thread")]
async fn batches_run_up_to_the_limit() {
    let app = TestApp::spawn().await;
    let one = json!({ "query": "{ inventories { nodes { id } } }" });
    let (status, body) = post_raw(&app, Value::Array(vec![one.clone(); 2]).to_string()).await;
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<Value>(&body).expect("json").as_array().map(Vec::len), Some(2));
    assert_eq!(post_raw(&app, Value::Array(vec![one; 11]).to_string()).await.0, 400);
}

/// `depth` levels of `__type { fields { type ...` under `__schema`.
fn nested_introspection(levels: usize) -> String {
    let mut query = String::from("name");
    for _ in 0..levels {
        query = format!("fields {{ type {{ {query} }} }}");
    }
    format!("{{ __schema {{ types {{ {query} }} }} }}")
}

#[tokio::test(flavor = "multi_thread")]
async fn queries_past_the_depth_limit_are_refused() {
    let app = TestApp::spawn().await;
    // Past the API's depth of 12 when mixed with a normal field...
    let inner = nested_introspection(6);
    let mixed = format!("{{ inventories {{ nodes {{ id }} }} {} }}", &inner[1..inner.len() - 1]);
    let body = app.graphql(None, &mixed, json!({})).await;
    assert!(body["errors"][0]["message"].as_str().is_some_and(|m| m.contains("deep")), "{body}");
    // ...and past the looser bound for introspection alone (the cycle
    // `__Type.fields.type` would otherwise be unbounded).
    let body = app.graphql(None, &nested_introspection(12), json!({})).await;
    assert!(body["errors"][0]["message"].as_str().is_some_and(|m| m.contains("deep")), "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn graphiql_s_own_introspection_query_is_answered() {
    let app = TestApp::spawn().await;
    // The shape of GraphiQL's IntrospectionQuery: TypeRef nests ofType eight deep.
    let mut type_ref = String::from("kind name");
    for _ in 0..8 {
        type_ref = format!("kind name ofType {{ {type_ref} }}");
    }
    let query = format!(
        "query IntrospectionQuery {{ __schema {{ queryType {{ name }} types {{ kind name \
         fields(includeDeprecated: true) {{ name args {{ name type {{ {type_ref} }} }} type {{ {type_ref} }} }} }} }} }}"
    );
    let body = app.graphql(None, &query, json!({})).await;
    assert!(body.get("errors").is_none(), "{body}");
    assert_eq!(body["data"]["__schema"]["queryType"]["name"], "Query");
}

#[tokio::test(flavor = "multi_thread")]
async fn health_readiness_and_graphiql_answer() {
    let app = TestApp::spawn().await;
    let get = |path: &str| app.client.get(format!("{}{path}", app.address)).send();
    assert_eq!(get("/healthz").await.expect("healthz").status(), 200);
    assert_eq!(get("/readyz").await.expect("readyz").status(), 200);
    let page = get("/").await.expect("graphiql");
    assert_eq!(page.status(), 200);
    assert!(page.text().await.expect("html").contains("graphiql"));
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_past_the_in_flight_limit_are_refused_at_once_not_queued() {
    use sea_orm::{ConnectionTrait, TransactionTrait};
    use stockguard::{auth::Role, config::Limits};

    use crate::helpers::{Isolation, Options};

    let limits = Limits { max_in_flight: 2, ..Limits::default() };
    let app = std::sync::Arc::new(
        TestApp::spawn_with_options(Options { isolation: Isolation::ReadCommitted, limits, ..Options::default() })
            .await,
    );
    let id = app.create_inventory("FULL-1", 10).await;
    let alice = app.token("alice", Role::Customer);
    // Two requests wait on a row this test holds, filling the server.
    let holder = app.db.begin().await.expect("begin");
    holder.execute_unprepared(&format!("SELECT 1 FROM inventories WHERE id = '{id}' FOR UPDATE")).await.expect("lock");
    let waiting: Vec<_> = (0..2)
        .map(|i| {
            let (app, alice) = (app.clone(), alice.clone());
            tokio::spawn(async move {
                app.reserve(&alice, json!({ "inventoryId": id, "idempotencyKey": format!("wait-{i}") })).await
            })
        })
        .collect();
    for tries in 0.. {
        assert!(tries < 400, "the two requests never reached the database");
        let blocked = app
            .count(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .await;
        if blocked == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }

    let response = app
        .client
        .post(format!("{}/graphql", app.address))
        .bearer_auth(&alice)
        .json(&json!({ "query": "{ inventories { nodes { id } } }" }))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["errors"][0]["extensions"]["code"], "OVERLOADED", "{body}");
    assert_eq!(body["errors"][0]["extensions"]["retryable"], true);

    holder.rollback().await.expect("release the row");
    for task in waiting {
        assert_eq!(task.await.expect("task")["__typename"], "Reserved");
    }
    app.assert_invariant().await;
}
