//! Stockguard against the clients frontend teams use, each the real library
//! from `clients/interop/` (pinned in its lockfile) talking to the real
//! server binary: the GraphQL-over-HTTP audit, urql with its defaults,
//! Apollo Client with GET queries and with persisted queries, and Relay's
//! compiler and runtime with `node(id:)` and a connection. They need
//! Node.js, so they are ignored by a plain `cargo test`; `.ci/run` runs them.

use std::time::Duration;

use serde_json::{Value, json};
use stockguard::auth::Role;

use crate::{
    node::{last_json, package, run},
    process::Process,
};

async fn interop(app: &Process, script: &str, args: &[&str]) -> Value {
    let dir = package("interop").await;
    let url = format!("{}/graphql", app.address);
    let mut all = vec![script, url.as_str()];
    all.extend_from_slice(args);
    last_json(&run(&dir, "node", &all, Duration::from_secs(120)).await)
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Node.js (clients/interop); .ci/run runs it"]
async fn the_graphql_over_http_audit_has_no_failures_and_no_warnings() {
    let app = Process::start(&[]).await;
    let audit = interop(&app, "audit.mjs", &[]).await;
    println!("graphql-http audit: {audit}");
    assert_eq!(audit["error"], 0, "no MUST fails: {audit}");
    assert_eq!(audit["warn"], 0, "and no SHOULD: {audit}");
    assert!(audit["total"].as_u64().is_some_and(|n| n >= 60), "{audit}");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Node.js (clients/interop); .ci/run runs it"]
async fn urql_with_its_default_options_queries_by_get_and_reserves_by_post() {
    let app = Process::start(&[]).await;
    let id = app.create_inventory("URQL-1", 3).await;
    let token = app.token("urql-user", Role::Customer);
    let seen = interop(&app, "urql.mjs", &[&token, &id.to_string()]).await;
    assert_eq!(seen["methods"], json!(["GET", "POST"]), "{seen}");
    assert_eq!(seen["read"]["inventory"]["stock"], 3, "{seen}");
    assert_eq!(seen["reserve"]["__typename"], "Reserved", "{seen}");
    assert_eq!(seen["reserve"]["inventory"]["stock"], 2, "{seen}");
    assert_eq!(app.count(&format!("SELECT stock::bigint FROM inventories WHERE id = '{id}'")).await, 2);
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Node.js (clients/interop); .ci/run runs it"]
async fn apollo_queries_by_get_and_falls_back_from_an_unknown_persisted_query() {
    let app = Process::start(&[]).await;
    let id = app.create_inventory("APOLLO-1", 3).await;
    let token = app.token("apollo-user", Role::Customer);
    let seen = interop(&app, "apollo.mjs", &[&token, &id.to_string()]).await;
    assert_eq!(seen["getMethods"], json!(["GET", "POST"]), "{seen}");
    assert_eq!(seen["read"]["inventory"]["sku"], "APOLLO-1", "{seen}");
    assert_eq!(seen["take"]["__typename"], "Reserved", "the fragment on the union matched: {seen}");
    // The first client's hash alone was not found; it sent the query once.
    let first = &seen["persistedFirst"];
    assert_eq!(first["requests"], json!([{ "method": "GET", "query": false }, { "method": "POST", "query": true }]));
    assert_eq!(first["data"]["inventory"]["stock"], 2, "{seen}");
    // The next client needs nothing but the hash.
    let second = &seen["persistedSecond"];
    assert_eq!(second["requests"], json!([{ "method": "GET", "query": false }]), "{seen}");
    assert_eq!(second["data"]["inventory"]["stock"], 2, "{seen}");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Node.js (clients/interop); .ci/run runs it"]
async fn relay_compiles_refetchable_fragments_and_refetches_and_paginates_through_node() {
    let app = Process::start(&[]).await;
    let dir = package("interop").await;
    std::fs::create_dir_all(dir.join("relay/__generated__")).expect("artifact directory");
    // The compiler validates the fragments against schema.graphql.
    run(&dir, "npx", &["relay-compiler"], Duration::from_secs(120)).await;

    let id = app.create_inventory("RELAY-1", 5).await;
    let operator = app.token("operator", Role::Operator);
    let ids = json!({ "id": id });
    let place = "mutation($id: UUID!) { placeOrder(input: { items: [{ inventoryId: $id, quantity: 2 }], \
                 shippingAddress: { name: \"R\", line1: \"1 Relay Way\", city: \"Oslo\", postalCode: \"0150\", country: \"NO\" } }) \
                 { ... on OrderPlaced { order { nodeId } } } }";
    let (_, placed) = app.graphql(Some(&operator), place, ids.clone()).await.expect("order");
    let order = placed["data"]["placeOrder"]["order"]["nodeId"].as_str().expect("an order").to_owned();
    let (_, read) = app.graphql(None, "query($id: UUID!) { inventory(id: $id) { nodeId } }", ids).await.expect("read");
    let inventory = read["data"]["inventory"]["nodeId"].as_str().expect("a node id").to_owned();

    let seen = interop(&app, "relay.mjs", &[&operator, &inventory, &order]).await;
    let refetched = &seen["InventoryRefetchQuery"][0]["data"]["node"];
    assert_eq!((refetched["sku"].as_str(), refetched["stock"].as_i64()), (Some("RELAY-1"), Some(3)), "{seen}");
    let order = &seen["OrderRefetchQuery"][0]["data"]["node"];
    assert_eq!((order["status"].as_str(), order["items"][0]["quantity"].as_i64()), (Some("PENDING"), Some(2)));
    let pages = &seen["InventoryMovementsPaginationQuery"];
    let page = |n: usize| pages[n]["data"]["node"]["movements"].clone();
    assert_eq!(page(0)["edges"][0]["node"]["reason"], "CREATED", "{seen}");
    assert_eq!(page(0)["pageInfo"]["hasNextPage"], true);
    assert_eq!(page(1)["edges"][0]["node"]["reason"], "ORDERED", "the second page follows the first: {seen}");
}
