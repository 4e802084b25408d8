//! Idempotency keys stored before the canonical fingerprint encoding still
//! replay: each test stores a key as the server did then (its fingerprint
//! the hex SHA-256 of a `Debug`-made text, spelled out here as it was),
//! straight in the database, and sends the same request again.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use stockguard::auth::Role;
use uuid::Uuid;

use crate::helpers::{TestApp, address, error_code, named, uuid};

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

#[tokio::test]
async fn a_reserve_key_stored_with_the_legacy_fingerprint_replays_its_first_outcome() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("LEGACY-1", 10).await;
    let alice = app.token("alice", Role::Customer);
    let (name, first) = named(app.reserve(&alice, json!({ "inventoryId": id, "quantity": 2 })).await);
    assert_eq!(name, "Reserved", "{first}");
    let reservation = uuid(&first["reservation"]["id"]);
    // What `reserve` with this key stored before: `Debug` of `Option<i32>`.
    let legacy = sha256_hex(&format!("reserve\n{id}\n2\nNone"));
    assert!(!legacy.contains(':'));
    app.count(&format!(
        "WITH r AS (UPDATE reservations SET idempotency_key = 'legacy-1', request_fingerprint = '{legacy}' \
         WHERE id = '{reservation}' RETURNING user_id), \
         k AS (INSERT INTO idempotency_keys (user_id, idempotency_key, request_fingerprint) \
         SELECT user_id, 'legacy-1', '{legacy}' FROM r RETURNING 1) SELECT count(*) FROM k"
    ))
    .await;

    let replay = app.reserve(&alice, json!({ "inventoryId": id, "quantity": 2, "idempotencyKey": "legacy-1" })).await;
    let (name, replay) = named(replay);
    assert_eq!(name, "Reserved", "{replay}");
    assert_eq!(uuid(&replay["reservation"]["id"]), reservation, "the first outcome");
    assert_eq!(app.stock_and_version(id).await.0, 8, "stock taken once");
    // The legacy fingerprint is this request's, not any request's.
    let other = app.reserve(&alice, json!({ "inventoryId": id, "quantity": 3, "idempotencyKey": "legacy-1" })).await;
    assert_eq!(error_code(&other), Some("IDEMPOTENCY_KEY_REUSED"), "{other}");
    app.assert_invariant().await;
}

#[tokio::test]
async fn a_place_order_key_stored_with_the_legacy_fingerprint_replays_its_first_outcome() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("LEGACY-2", 10).await;
    let alice = app.token("alice", Role::Customer);
    let input = |key: Option<&str>| {
        let mut input =
            json!({ "items": [{ "inventoryId": id, "quantity": 1 }], "shippingAddress": address("1 Main St") });
        if let Some(key) = key {
            input["idempotencyKey"] = Value::from(key);
        }
        input
    };
    let (name, first) = named(app.place_order(&alice, input(None)).await);
    assert_eq!(name, "OrderPlaced", "{first}");
    let order = uuid(&first["order"]["id"]);
    // What `placeOrder` with this key stored before: the lines with `Debug`
    // of their expected versions, and `Debug` of the `ShippingAddress`.
    let shipping = r#"ShippingAddress { name: "Alice Example", line1: "1 Main St", line2: Some("Floor 2"), city: "Lisbon", postal_code: "1100-148", country: "PT" }"#;
    let legacy = sha256_hex(&format!("placeOrder\n{id}:1:None\n{shipping}"));
    app.count(&format!(
        "WITH k AS (INSERT INTO idempotency_keys (user_id, idempotency_key, request_fingerprint, order_id) \
         SELECT user_id, 'legacy-2', '{legacy}', id FROM orders WHERE id = '{order}' RETURNING 1) \
         SELECT count(*) FROM k"
    ))
    .await;

    let (name, replay) = named(app.place_order(&alice, input(Some("legacy-2"))).await);
    assert_eq!(name, "OrderPlaced", "{replay}");
    assert_eq!(uuid(&replay["order"]["id"]), order, "the first outcome");
    assert_eq!(app.stock_and_version(id).await.0, 9, "stock taken once");
    app.assert_invariant().await;
}

#[test]
fn the_legacy_texts_here_are_the_ones_the_unit_tests_pin() {
    // The same spelling as above, for the inputs `src/idempotency/fingerprint.rs` pins.
    let text = format!("reserve\n{}\n2\nSome(3)", Uuid::from_u128(1));
    assert_eq!(sha256_hex(&text), "7b4809da65cb4d8601e408b69581b64c75c341d4bc16551c7821af6a333104bf");
}
