//! Who may do what (docs/api.md "Transport"), each check followed by a look at the
//! database to see that a refused request wrote nothing.

use jsonwebtoken::{EncodingKey, Header};
use serde_json::json;
use stockguard::auth::Role;

use crate::{
    documents::{CREATE_INVENTORY, RESTOCK},
    helpers::{SECRET, TestApp, error_code},
};

/// Signs arbitrary claims with the test secret.
fn signed(claims: serde_json::Value) -> String {
    jsonwebtoken::encode(&Header::default(), &claims, &EncodingKey::from_secret(SECRET.as_bytes())).expect("sign")
}

fn in_an_hour() -> i64 {
    chrono::Utc::now().timestamp() + 3600
}

#[tokio::test(flavor = "multi_thread")]
async fn anyone_may_read_inventory_but_reserving_needs_a_token() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("PUBLIC-1", 5).await;
    let read = app.graphql(None, "query($id: UUID!) { inventory(id: $id) { sku stock } }", json!({ "id": id })).await;
    assert_eq!(read["data"]["inventory"]["stock"], 5);
    let by_sku = app.graphql(None, r#"{ inventoryBySku(sku: "PUBLIC-1") { stock } }"#, json!({})).await;
    assert_eq!(by_sku["data"]["inventoryBySku"]["stock"], 5);

    let before = app.snapshot().await;
    let body =
        app.graphql(None, crate::helpers::RESERVE, json!({ "input": { "inventoryId": id, "quantity": 1 } })).await;
    assert_eq!(error_code(&body), Some("UNAUTHENTICATED"), "{body}");
    let mine = app.graphql(None, "{ myReservations { nodes { id } } }", json!({})).await;
    assert_eq!(error_code(&mine), Some("UNAUTHENTICATED"), "{mine}");
    assert_eq!(app.snapshot().await, before);
}

#[tokio::test(flavor = "multi_thread")]
async fn customers_may_not_create_or_restock_inventory() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("OPS-1", 5).await;
    let alice = app.token("alice", Role::Customer);
    let before = app.snapshot().await;

    let create = json!({ "input": { "sku": "NEW-1", "name": "New", "stock": 1 } });
    assert_eq!(error_code(&app.graphql(Some(&alice), CREATE_INVENTORY, create.clone()).await), Some("FORBIDDEN"));
    assert_eq!(error_code(&app.graphql(None, CREATE_INVENTORY, create).await), Some("UNAUTHENTICATED"));
    let restock = json!({ "input": { "inventoryId": id, "quantity": 5 } });
    assert_eq!(error_code(&app.graphql(Some(&alice), RESTOCK, restock).await), Some("FORBIDDEN"));
    assert_eq!(app.snapshot().await, before);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_tokens_are_unauthenticated_and_write_nothing() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("TOKENS-1", 5).await;
    let valid = app.token("alice", Role::Customer);
    let expired_long_ago =
        signed(json!({ "sub": "alice", "role": "customer", "exp": chrono::Utc::now().timestamp() - 120 }));
    let other_secret = jsonwebtoken::encode(
        &Header::default(),
        &json!({ "sub": "alice", "role": "operator", "exp": in_an_hour() }),
        &EncodingKey::from_secret(b"not the secret"),
    )
    .expect("sign");
    let alg_none =
        "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJtYWxsb3J5Iiwicm9sZSI6Im9wZXJhdG9yIiwiZXhwIjo0MTAyNDQ0ODAwfQ.";
    // An RS256 header over an HMAC signature made with the shared secret.
    let rs256 = {
        let hs = signed(json!({ "sub": "mallory", "role": "operator", "exp": in_an_hour() }));
        let (_, rest) = hs.split_once('.').expect("jwt");
        format!("eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9.{rest}")
    };
    let no_exp = signed(json!({ "sub": "alice", "role": "customer" }));
    let no_sub = signed(json!({ "role": "customer", "exp": in_an_hour() }));
    let empty_sub = signed(json!({ "sub": "", "role": "customer", "exp": in_an_hour() }));
    let bad_role = signed(json!({ "sub": "alice", "role": "admin", "exp": in_an_hour() }));
    let no_role = signed(json!({ "sub": "alice", "exp": in_an_hour() }));
    let before = app.snapshot().await;

    let bad = [
        expired_long_ago,
        other_secret,
        alg_none.to_owned(),
        rs256,
        no_exp,
        no_sub,
        empty_sub,
        bad_role,
        no_role,
        "not-a-jwt".to_owned(),
    ];
    for token in &bad {
        let body = app.reserve(token, json!({ "inventoryId": id, "quantity": 1 })).await;
        assert_eq!(error_code(&body), Some("UNAUTHENTICATED"), "token {token}: {body}");
    }
    // Not `Bearer`: also refused.
    let response = app
        .client
        .post(format!("{}/graphql", app.address))
        .header("Authorization", format!("Token {valid}"))
        .json(&json!({ "query": crate::helpers::RESERVE, "variables": { "input": { "inventoryId": id } } }))
        .send()
        .await
        .expect("send");
    let body: serde_json::Value = response.json().await.expect("json");
    assert_eq!(error_code(&body), Some("UNAUTHENTICATED"), "{body}");
    assert_eq!(app.snapshot().await, before);
}

#[tokio::test(flavor = "multi_thread")]
async fn someone_elses_reservation_reads_as_absent_but_operators_see_it() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("MINE-1", 5).await;
    let (alice, bob) = (app.token("alice", Role::Customer), app.token("bob", Role::Customer));
    let reserved = app.reserve(&alice, json!({ "inventoryId": id, "quantity": 2 })).await;
    let reservation_id = reserved["reservation"]["id"].as_str().expect("reserved").to_owned();
    let query = "query($id: UUID!) { reservation(id: $id) { id userId quantity } }";

    let as_bob = app.graphql(Some(&bob), query, json!({ "id": reservation_id })).await;
    assert_eq!(as_bob["data"]["reservation"], serde_json::Value::Null, "{as_bob}");
    let as_alice = app.graphql(Some(&alice), query, json!({ "id": reservation_id })).await;
    assert_eq!(as_alice["data"]["reservation"]["userId"], "alice");
    let as_operator = app.graphql(Some(&app.operator()), query, json!({ "id": reservation_id })).await;
    assert_eq!(as_operator["data"]["reservation"]["quantity"], 2);

    let bobs = app.graphql(Some(&bob), "{ myReservations { nodes { id } } }", json!({})).await;
    assert_eq!(bobs["data"]["myReservations"]["nodes"], json!([]));
    let alices = app.graphql(Some(&alice), "{ myReservations { nodes { id } } }", json!({})).await;
    assert_eq!(alices["data"]["myReservations"]["nodes"][0]["id"], reservation_id.as_str());
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_owner_releases_a_reservation_or_moves_an_order() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("OWNER-1", 5).await;
    let alice = app.token("alice", Role::Customer);
    let reserved = app.reserve(&alice, json!({ "inventoryId": id })).await;
    let reservation_id = reserved["reservation"]["id"].as_str().expect("reserved").to_owned();
    let placed = app
        .graphql(
            Some(&alice),
            "mutation($i: PlaceOrderInput!) { placeOrder(input: $i) { ... on OrderPlaced { order { id } } } }",
            json!({ "i": { "items": [{ "inventoryId": id }], "shippingAddress": {
                "name": "Alice", "line1": "1 Main St", "city": "Osaka", "postalCode": "530-0001", "country": "JP" } } }),
        )
        .await;
    let order_id = placed["data"]["placeOrder"]["order"]["id"].as_str().expect("placed").to_owned();
    let before = app.snapshot().await;

    let release = app
        .graphql(
            Some(&app.operator()),
            "mutation($id: UUID!) { releaseReservation(id: $id) { __typename } }",
            json!({ "id": reservation_id }),
        )
        .await;
    assert_eq!(release["data"]["releaseReservation"]["__typename"], "ReservationNotFound", "{release}");
    let mv = app
        .graphql(
            Some(&app.operator()),
            "mutation($i: ChangeShippingAddressInput!) { changeShippingAddress(input: $i) { __typename } }",
            json!({ "i": { "orderId": order_id, "expectedVersion": 1, "shippingAddress": {
                "name": "Mallory", "line1": "6 Elsewhere", "city": "Kyoto", "postalCode": "600-0000", "country": "JP" } } }),
        )
        .await;
    assert_eq!(mv["data"]["changeShippingAddress"]["__typename"], "OrderNotFound", "{mv}");
    assert_eq!(app.snapshot().await, before);
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_from_the_future_or_past_the_lifetime_cap_are_unauthenticated() {
    let app = TestApp::spawn().await;
    let now = chrono::Utc::now().timestamp();
    let day = stockguard::config::DEFAULT_MAX_TOKEN_TTL_SECS;
    let tokens = [
        ("a week-long token", signed(json!({ "sub": "alice", "role": "operator", "exp": now + 7 * day }))),
        (
            "issued in the future",
            signed(json!({ "sub": "alice", "role": "operator", "exp": now + 600, "iat": now + 600 })),
        ),
        (
            "not valid before later",
            signed(json!({ "sub": "alice", "role": "operator", "exp": now + 600, "nbf": now + 600 })),
        ),
    ];
    for (what, token) in tokens {
        let body = app.graphql(Some(&token), "{ myReservations { nodes { id } } }", json!({})).await;
        assert_eq!(error_code(&body), Some("UNAUTHENTICATED"), "{what}: {body}");
    }
}

/// `stockguard` run with `env` (and no database: it must refuse before it needs one).
/// Runs the server with `env` (on top of an unreachable database and no
/// secret of the caller's environment), expects it to refuse to start, and
/// returns what it said.
fn serve_refuses(env: &[(&str, &str)]) -> String {
    let output = std::process::Command::new(crate::process::binary())
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/never")
        .env_remove("STOCKGUARD_JWT_SECRET")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run stockguard");
    assert!(!output.status.success(), "it started with {env:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_short_secret_or_a_public_address_without_one_is_refused_at_start() {
    for secret in ["", "abc", "thirty-one-bytes-is-too-short!!"] {
        let stderr = serve_refuses(&[("STOCKGUARD_JWT_SECRET", secret)]);
        assert!(stderr.contains("STOCKGUARD_JWT_SECRET must be at least 32 bytes"), "{secret:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one clear line: {stderr}");
    }
    let stderr = serve_refuses(&[("STOCKGUARD_ADDR", "0.0.0.0:0")]);
    assert!(stderr.contains("STOCKGUARD_JWT_SECRET is required to listen on 0.0.0.0:0"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn graphiql_carries_a_token_only_for_a_throw_away_secret_on_loopback() {
    // With the configured secret: no token in the page.
    let app = crate::process::Process::start(&[]).await;
    let page = app.client.get(format!("{}/", app.address)).send().await.expect("page").text().await.expect("html");
    assert!(page.contains("graphiql") && !page.contains("Bearer"), "{page:.200}");
    drop(app);
    // Without one, on 127.0.0.1: the dev operator token.
    let app = crate::process::Process::start_without_secret().await;
    let page = app.client.get(format!("{}/", app.address)).send().await.expect("page").text().await.expect("html");
    assert!(page.contains("Bearer ey"), "the dev page carries the operator token");
}

#[test]
fn several_database_hosts_without_a_shared_secret_are_refused_at_start() {
    let several = "postgres://postgres@127.0.0.1:1,127.0.0.1:2/never?target_session_attrs=read-write";
    let stderr = serve_refuses(&[("DATABASE_URL", several)]);
    assert!(stderr.contains("STOCKGUARD_JWT_SECRET is required with a DATABASE_URL of 2 hosts"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one clear line: {stderr}");
}
