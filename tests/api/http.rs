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

#[tokio::test(flavor = "multi_thread")]
async fn queries_past_the_depth_limit_are_refused() {
    let app = TestApp::spawn().await;
    let deep = "{ __schema { types { fields { type { ofType { ofType { ofType { ofType { ofType { ofType { ofType { ofType { name } } } } } } } } } } } } }";
    let body = app.graphql(None, deep, json!({})).await;
    assert!(body["errors"][0]["message"].as_str().is_some_and(|m| m.contains("deep")), "{body}");
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
