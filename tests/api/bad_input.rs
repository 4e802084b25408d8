//! Invalid input is `BAD_USER_INPUT` (or a more specific code), names the
//! field, and writes nothing.

use serde_json::{Value, json};
use stockguard::auth::Role;

use crate::{
    documents::{CREATE_INVENTORY, INVENTORIES, MY_RESERVATIONS},
    helpers::{TestApp, error_code},
};

fn assert_bad_input(body: &Value, field: &str) {
    assert_eq!(error_code(body), Some("BAD_USER_INPUT"), "{body}");
    assert_eq!(body["errors"][0]["extensions"]["field"], field, "{body}");
    assert!(body["data"].is_null(), "no data for a refused mutation: {body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn reserve_refuses_bad_quantities_and_keys_and_writes_nothing() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("BAD-1", 5_000).await;
    let alice = app.token("alice", Role::Customer);
    let before = app.snapshot().await;

    for quantity in [0, -1, 1001, i32::MIN] {
        let body = app.reserve(&alice, json!({ "inventoryId": id, "quantity": quantity })).await;
        assert_bad_input(&body, "input.quantity");
    }
    for key in [String::new(), "   ".into(), "k".repeat(129), "a\u{0}b".into()] {
        let body = app.reserve(&alice, json!({ "inventoryId": id, "idempotencyKey": key })).await;
        assert_bad_input(&body, "input.idempotencyKey");
    }
    // Values GraphQL itself refuses: a bad UUID, an Int past 32 bits, a wrong type.
    for input in [
        json!({ "inventoryId": "not-a-uuid" }),
        json!({ "inventoryId": id, "quantity": 2_147_483_648_i64 }),
        json!({ "inventoryId": id, "quantity": "1" }),
        json!({ "inventoryId": id, "expectedVersion": 1.5 }),
    ] {
        let body = app.reserve(&alice, input.clone()).await;
        assert!(body.get("errors").is_some(), "{input} must be refused: {body}");
    }
    assert_eq!(app.snapshot().await, before);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idempotency_key_reused_for_another_request_is_refused() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("KEY-1", 10).await;
    let other = app.create_inventory("KEY-2", 10).await;
    let alice = app.token("alice", Role::Customer);
    let first = app.reserve(&alice, json!({ "inventoryId": id, "quantity": 1, "idempotencyKey": "k1" })).await;
    assert_eq!(first["__typename"], "Reserved");
    let before = app.snapshot().await;

    for changed in [
        json!({ "inventoryId": id, "quantity": 2, "idempotencyKey": "k1" }),
        json!({ "inventoryId": other, "quantity": 1, "idempotencyKey": "k1" }),
        json!({ "inventoryId": id, "quantity": 1, "expectedVersion": 2, "idempotencyKey": "k1" }),
    ] {
        let body = app.reserve(&alice, changed).await;
        assert_eq!(error_code(&body), Some("IDEMPOTENCY_KEY_REUSED"), "{body}");
    }
    assert_eq!(app.snapshot().await, before);

    // The same request replays the first outcome, even once it would now conflict.
    let replay = app.reserve(&alice, json!({ "inventoryId": id, "quantity": 1, "idempotencyKey": "k1" })).await;
    assert_eq!(replay["reservation"]["id"], first["reservation"]["id"]);
    // Keys belong to a user: bob may use the same key for his own request.
    let bob = app.token("bob", Role::Customer);
    let bobs = app.reserve(&bob, json!({ "inventoryId": id, "quantity": 2, "idempotencyKey": "k1" })).await;
    assert_eq!(bobs["__typename"], "Reserved");
    assert_ne!(bobs["reservation"]["id"], first["reservation"]["id"]);
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replayed_versioned_request_returns_its_first_outcome() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("REPLAY-1", 1).await;
    let alice = app.token("alice", Role::Customer);
    let input = json!({ "inventoryId": id, "quantity": 1, "expectedVersion": 1, "idempotencyKey": "once" });
    let first = app.reserve(&alice, input.clone()).await;
    assert_eq!(first["__typename"], "Reserved");
    // The version moved and the stock is gone, yet the replay is the first outcome.
    let replay = app.reserve(&alice, input).await;
    assert_eq!(replay["__typename"], "Reserved", "{replay}");
    assert_eq!(replay["reservation"]["id"], first["reservation"]["id"]);
    assert_eq!(app.stock_and_version(id).await, (0, 2));
}

#[tokio::test(flavor = "multi_thread")]
async fn inventory_mutations_refuse_bad_input_and_write_nothing() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("TAKEN-1", 5).await;
    let operator = app.operator();
    let before = app.snapshot().await;

    for (input, field) in [
        (json!({ "sku": "", "name": "x", "stock": 1 }), "input.sku"),
        (json!({ "sku": "S".repeat(65), "name": "x", "stock": 1 }), "input.sku"),
        (json!({ "sku": "OK-1", "name": " ", "stock": 1 }), "input.name"),
        (json!({ "sku": "OK-1", "name": "n".repeat(201), "stock": 1 }), "input.name"),
        (json!({ "sku": "OK-1", "name": "x", "stock": -1 }), "input.stock"),
        (json!({ "sku": "TAKEN-1", "name": "x", "stock": 1 }), "input.sku"),
    ] {
        let body = app.graphql(Some(&operator), CREATE_INVENTORY, json!({ "input": input })).await;
        assert_bad_input(&body, field);
    }
    for quantity in [0, -5] {
        let body = app.restock(&operator, json!({ "inventoryId": id, "quantity": quantity })).await;
        assert_bad_input(&body, "input.quantity");
    }
    assert_eq!(app.snapshot().await, before);

    // Past i32::MAX the database refuses the sum; that too is bad input.
    let big = json!({ "inventoryId": id, "quantity": 1_000_000_000 });
    for _ in 0..2 {
        let body = app.restock(&operator, big.clone()).await;
        assert_eq!(body["__typename"], "Restocked", "{body}");
    }
    let before = app.snapshot().await;
    assert_bad_input(&app.restock(&operator, big).await, "input.quantity");
    assert_eq!(app.snapshot().await, before);
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn page_sizes_and_cursors_out_of_range_are_refused() {
    let app = TestApp::spawn().await;
    let alice = app.token("alice", Role::Customer);
    for first in [0, -1, 101] {
        let body = app.graphql(None, INVENTORIES, json!({ "f": first })).await;
        assert_bad_input(&body, "first");
        let body = app.graphql(Some(&alice), MY_RESERVATIONS, json!({ "f": first })).await;
        assert_bad_input(&body, "first");
    }
    let body = app.graphql(None, INVENTORIES, json!({ "after": "garbage" })).await;
    assert_bad_input(&body, "after");
}
