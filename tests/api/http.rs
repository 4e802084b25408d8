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

/// The spec's order: a response's fields come in the order the query asked
/// for them, in a single response and in a batch's members alike.
#[tokio::test(flavor = "multi_thread")]
async fn fields_come_back_in_the_order_they_were_asked_for() {
    let app = TestApp::spawn().await;
    app.create_inventory("ORDER-OF-FIELDS", 3).await;
    let query = "{ inventories(first: 1) { nodes { sku id name } pageInfo { hasNextPage } } }";
    let at = |body: &str, key: &str| body.find(&format!("\"{key}\"")).unwrap_or_else(|| panic!("{key} in {body}"));
    let (status, single) = post_raw(&app, json!({ "query": query }).to_string()).await;
    let (_, batch) = post_raw(&app, json!([{ "query": query }]).to_string()).await;
    assert_eq!(status, 200, "{single}");
    for body in [single, batch] {
        assert!(at(&body, "sku") < at(&body, "id") && at(&body, "id") < at(&body, "name"), "{body}");
        assert!(at(&body, "nodes") < at(&body, "pageInfo"), "{body}");
        // The response's own members: data, then the cost.
        assert!(at(&body, "data") < at(&body, "extensions"), "{body}");
    }
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

/// A request to `/graphql` with `method`, `accept`, `content_type` and `body`:
/// the status, the content type and the body as JSON (or text).
async fn exchange(
    app: &TestApp,
    method: reqwest::Method,
    path_and_query: &str,
    accept: Option<&str>,
    content_type: Option<&str>,
    body: Option<String>,
) -> (u16, String, Value) {
    let mut request = app.client.request(method, format!("{}{path_and_query}", app.address));
    if let Some(accept) = accept {
        request = request.header("accept", accept);
    }
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    if let Some(body) = body {
        request = request.body(body);
    }
    let response = request.send().await.expect("send");
    let status = response.status().as_u16();
    let media = response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let text = response.text().await.expect("body");
    (status, media, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

fn url_encoded(query: &str) -> String {
    serde_urlencoded::to_string([("query", query)]).expect("encode")
}

#[tokio::test(flavor = "multi_thread")]
async fn queries_work_by_get_and_mutations_by_get_are_405_and_write_nothing() {
    let app = TestApp::spawn().await;
    let get = reqwest::Method::GET;
    let (status, media, body) =
        exchange(&app, get.clone(), &format!("/graphql?{}", url_encoded("{ __typename }")), None, None, None).await;
    assert_eq!((status, media.as_str()), (200, "application/json; charset=utf-8"), "{body}");
    assert_eq!(body["data"]["__typename"], "Query");
    // Variables and operationName in the URL, as urql and Apollo send them.
    let path = format!(
        "/graphql?{}&operationName=Q&variables=%7B%22s%22%3A%22NOPE%22%7D",
        url_encoded("query Q($s: String!) { inventoryBySku(sku: $s) { id } }")
    );
    let (status, _, body) = exchange(&app, get.clone(), &path, None, None, None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["data"]["inventoryBySku"].is_null() && body.get("errors").is_none(), "{body}");

    let before = app.snapshot().await;
    let mutation = r#"mutation { createInventory(input: { sku: "GET-1", name: "by get", stock: 1 }) { id } }"#;
    let response = app
        .client
        .get(format!("{}/graphql?{}", app.address, url_encoded(mutation)))
        .bearer_auth(app.operator())
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 405);
    assert_eq!(response.headers().get("allow").and_then(|v| v.to_str().ok()), Some("POST"));
    assert_eq!(app.snapshot().await, before, "a GET wrote nothing");
}

#[tokio::test(flavor = "multi_thread")]
async fn graphiql_is_only_for_browsers_and_accept_picks_the_media_type() {
    let app = TestApp::spawn().await;
    let (_, media, page) =
        exchange(&app, reqwest::Method::GET, "/graphql", Some("text/html,*/*;q=0.8"), None, None).await;
    assert!(media.starts_with("text/html") && page.as_str().is_some_and(|p| p.contains("graphiql")), "{media}");
    let post = |accept: Option<&'static str>| {
        exchange(
            &app,
            reqwest::Method::POST,
            "/graphql",
            accept,
            Some("application/json"),
            Some(r#"{"query":"{ __typename }"}"#.into()),
        )
    };
    for (accept, expected) in [
        (None, "application/json; charset=utf-8"),
        (Some("*/*"), "application/json; charset=utf-8"),
        (Some("application/json"), "application/json; charset=utf-8"),
        (Some("application/graphql-response+json"), "application/graphql-response+json; charset=utf-8"),
        (
            Some("application/graphql-response+json, application/json;q=0.9"),
            "application/graphql-response+json; charset=utf-8",
        ),
    ] {
        let (status, media, body) = post(accept).await;
        assert_eq!((status, media.as_str()), (200, expected), "Accept {accept:?}: {body}");
    }
    assert_eq!(post(Some("text/plain")).await.0, 406);
}

#[tokio::test(flavor = "multi_thread")]
async fn request_errors_are_400_without_data_under_graphql_response_json_and_200_under_json() {
    let app = TestApp::spawn().await;
    for (query, variables) in [
        ("{", json!({})),
        ("{ noSuchField }", json!({})),
        ("query($id: ID!) { __typename }", json!({ "id": null })),
        ("query($id: UUID!) { inventory(id: $id) { id } }", json!({ "id": "not-a-uuid" })),
    ] {
        let body = json!({ "query": query, "variables": variables }).to_string();
        let post = |accept: &'static str| {
            exchange(
                &app,
                reqwest::Method::POST,
                "/graphql",
                Some(accept),
                Some("application/json"),
                Some(body.clone()),
            )
        };
        let (status, _, strict) = post("application/graphql-response+json").await;
        assert_eq!(status, 400, "{query}: {strict}");
        assert!(strict.get("data").is_none() && strict["errors"][0]["extensions"]["code"].is_string(), "{strict}");
        let (status, _, legacy) = post("application/json").await;
        assert_eq!(status, 200, "{query}: {legacy}");
        assert!(legacy["errors"].is_array(), "{legacy}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_post_without_a_json_content_type_is_415_and_runs_nothing() {
    let app = TestApp::spawn().await;
    let before = app.snapshot().await;
    let create =
        json!({ "query": r#"mutation { createInventory(input: { sku: "CT-1", name: "x", stock: 1 }) { id } }"# });
    for content_type in
        [None, Some("text/plain"), Some("application/x-www-form-urlencoded"), Some("application/json; charset=latin1")]
    {
        let mut request =
            app.client.post(format!("{}/graphql", app.address)).bearer_auth(app.operator()).body(create.to_string());
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        assert_eq!(request.send().await.expect("send").status(), 415, "{content_type:?}");
    }
    assert_eq!(app.snapshot().await, before);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_field_error_nulls_the_field_up_to_the_nearest_nullable_parent() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("NULLS-1", 5).await;
    let alice = app.token("alice", stockguard::auth::Role::Customer);
    // movements (non-null, operators only) fails: its nullable parent `inventory` is null.
    let body = app
        .graphql(
            Some(&alice),
            "query($id: UUID!) { inventory(id: $id) { sku movements { nodes { delta } } } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(body["data"], json!({ "inventory": null }), "{body}");
    assert_eq!(body["errors"][0]["path"], json!(["inventory", "movements"]), "{body}");
    assert_eq!(body["errors"][0]["extensions"]["code"], "FORBIDDEN");
    // Through a non-null list of non-null nodes, up to `data` itself.
    let body =
        app.graphql(Some(&alice), "{ inventories { nodes { sku movements { nodes { delta } } } } }", json!({})).await;
    assert_eq!(body["data"], Value::Null, "{body}");
    // A root field that needs a token, beside one that does not: `data` is null.
    let body = app
        .graphql(
            None,
            "query($id: UUID!) { a: inventory(id: $id) { sku } b: myReservations { nodes { id } } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(body["data"], Value::Null, "{body}");
    assert_eq!(body["errors"][0]["extensions"]["code"], "UNAUTHENTICATED");
    // A nullable root field that needs a token: only it is null.
    let body = app
        .graphql(
            None,
            "query($id: UUID!) { a: inventory(id: $id) { sku } r: reservation(id: $id) { id } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(body["data"], json!({ "a": { "sku": "NULLS-1" }, "r": null }), "{body}");
}

fn sha256(text: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(text.as_bytes()))
}

#[tokio::test(flavor = "multi_thread")]
async fn persisted_queries_are_found_after_one_full_request_by_post_and_get() {
    let app = TestApp::spawn().await;
    let query = "{ inventories(first: 1) { pageInfo { hasNextPage } } }";
    let extensions = json!({ "persistedQuery": { "version": 1, "sha256Hash": sha256(query) } });
    let hash_only = json!({ "extensions": extensions }).to_string();
    let post =
        |body: String| exchange(&app, reqwest::Method::POST, "/graphql", None, Some("application/json"), Some(body));
    let (status, _, body) = post(hash_only.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["errors"][0]["extensions"]["code"], "PERSISTED_QUERY_NOT_FOUND", "{body}");
    assert_eq!(body["errors"][0]["message"], "PersistedQueryNotFound");
    let (status, _, body) = post(json!({ "query": query, "extensions": extensions }).to_string()).await;
    assert_eq!(status, 200);
    assert_eq!(body["data"]["inventories"]["pageInfo"]["hasNextPage"], false, "{body}");
    let (_, _, body) = post(hash_only).await;
    assert_eq!(body["data"]["inventories"]["pageInfo"]["hasNextPage"], false, "the hash alone now runs: {body}");
    // By GET, as Apollo sends hashed queries.
    let path =
        format!("/graphql?{}", serde_urlencoded::to_string([("extensions", extensions.to_string())]).expect("encode"));
    let (status, _, body) = exchange(&app, reqwest::Method::GET, &path, None, None, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"]["inventories"]["pageInfo"]["hasNextPage"], false, "{body}");
    // A hash that is not the query's.
    let wrong = json!({ "persistedQuery": { "version": 1, "sha256Hash": sha256("{ __typename }") } });
    let (status, _, body) = post(json!({ "query": query, "extensions": wrong }).to_string()).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["errors"][0]["extensions"]["code"], "BAD_REQUEST");
}

/// A CORS preflight for a POST with a bearer token from `origin`: the status
/// and the `Access-Control-Allow-Origin` it got, if any.
async fn preflight(client: &reqwest::Client, address: &str, origin: &str) -> (u16, Option<String>) {
    let response = client
        .request(reqwest::Method::OPTIONS, format!("{address}/graphql"))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "authorization, content-type")
        .send()
        .await
        .expect("preflight");
    let allowed =
        response.headers().get("access-control-allow-origin").and_then(|v| v.to_str().ok()).map(str::to_owned);
    (response.status().as_u16(), allowed)
}

#[tokio::test(flavor = "multi_thread")]
async fn browser_apps_on_configured_origins_may_call_the_api_and_others_may_not() {
    use stockguard::config::Limits;
    let limits = Limits { cors_origins: vec!["https://shop.example".into()], ..Limits::default() };
    let app = TestApp::spawn_with_options(crate::helpers::Options { limits, ..Default::default() }).await;
    let (status, allowed) = preflight(&app.client, &app.address, "https://shop.example").await;
    assert_eq!((status, allowed.as_deref()), (200, Some("https://shop.example")));
    let (_, allowed) = preflight(&app.client, &app.address, "https://evil.example").await;
    assert_eq!(allowed, None, "an origin not configured gets no grant");
    let (_, allowed) = preflight(&app.client, &app.address, "http://localhost:5173").await;
    assert_eq!(allowed, None, "loopback origins only in development");
    let response = app
        .client
        .post(format!("{}/graphql", app.address))
        .header("origin", "https://shop.example")
        .json(&json!({ "query": "{ __typename }" }))
        .send()
        .await
        .expect("send");
    assert_eq!(
        response.headers().get("access-control-allow-origin").and_then(|v| v.to_str().ok()),
        Some("https://shop.example")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_development_server_allows_loopback_origins() {
    let app = crate::process::Process::start_without_secret().await;
    for origin in ["http://localhost:5173", "http://127.0.0.1:3000"] {
        let (status, allowed) = preflight(&app.client, &app.address, origin).await;
        assert_eq!((status, allowed.as_deref()), (200, Some(origin)));
    }
    let (_, allowed) = preflight(&app.client, &app.address, "https://evil.example").await;
    assert_eq!(allowed, None);
}
