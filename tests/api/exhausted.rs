//! What each operation answers when every run of its statement collided
//! (`Attempted::Exhausted`, after `collision_attempts` runs): the one
//! documented outcome per operation (`Limits::collision_attempts`,
//! docs/operations.md). A trigger makes the operation's write fail with
//! SQLSTATE 40001 every time, as a SERIALIZABLE transaction that keeps
//! losing would, so the retries run out for certain; then it is dropped and
//! the same request succeeds, so nothing was left half-done.

use sea_orm::ConnectionTrait;
use serde_json::{Value, json};
use stockguard::{auth::Role, config::Limits};
use uuid::Uuid;

use crate::helpers::{Isolation, TestApp, address, error_code, named, uuid};

/// Runs per statement: few, so that running out is quick, and more than one,
/// so that a re-run is part of what is tested.
const ATTEMPTS: u32 = 2;

async fn app() -> TestApp {
    let app = TestApp::spawn_configured(
        Isolation::ReadCommitted,
        Limits { collision_attempts: ATTEMPTS, ..Limits::default() },
    )
    .await;
    app.db
        .execute_unprepared(
            "CREATE FUNCTION collide() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             RAISE EXCEPTION 'a collision forced by the test' USING ERRCODE = 'serialization_failure'; END $$",
        )
        .await
        .expect("the colliding function");
    app
}

/// Every `event` on `table` for which `when` holds fails with 40001 until [`stop`].
async fn collide(app: &TestApp, event: &str, table: &str, when: &str) {
    let sql = format!(
        "CREATE TRIGGER collide BEFORE {event} ON {table} FOR EACH ROW WHEN ({when}) EXECUTE FUNCTION collide()"
    );
    app.db.execute_unprepared(&sql).await.expect("the colliding trigger");
}

async fn stop(app: &TestApp, table: &str) {
    app.db.execute_unprepared(&format!("DROP TRIGGER collide ON {table}")).await.expect("drop the trigger");
}

async fn status(app: &TestApp, reservation: Uuid) -> String {
    let rows =
        app.rows(&format!("SELECT status, quantity, expires_at FROM reservations WHERE id = '{reservation}'")).await;
    rows[0]["status"].as_str().expect("a status").to_owned()
}

/// The answer is the retryable `DATABASE_UNAVAILABLE`, not a union member.
fn assert_retryable(answer: &Value, what: &str) {
    assert_eq!(error_code(answer), Some("DATABASE_UNAVAILABLE"), "{what}: {answer}");
    assert_eq!(answer["errors"][0]["extensions"]["retryable"], true, "{what}: {answer}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_whose_retries_run_out_is_retryable_and_the_reservation_stays_active() {
    let app = app().await;
    let item = app.create_inventory("EXH-REL", 10).await;
    let alice = app.token("alice", Role::Customer);
    let reserved = app.reserve(&alice, json!({ "inventoryId": item, "quantity": 3 })).await;
    let id = uuid(&reserved["reservation"]["id"]);
    let snapshot = app.snapshot().await;

    collide(&app, "UPDATE", "reservations", "NEW.status = 'RELEASED'").await;
    let answer = app.release(&alice, id).await;
    // Never `ReservationNotActive`: the reservation is ACTIVE, and a client
    // told so would drop a hold it still has.
    assert_ne!(named(answer.clone()).0, "ReservationNotActive", "{answer}");
    assert_retryable(&answer, "release");
    assert_eq!(status(&app, id).await, "ACTIVE");
    assert_eq!(app.states(item).await, [7, 3, 0, 10], "the stock stays held");
    assert_eq!(app.snapshot().await, snapshot, "nothing written");
    stop(&app, "reservations").await;

    let (name, released) = named(app.release(&alice, id).await);
    assert_eq!(name, "ReservationReleased", "{released}");
    assert_eq!(app.states(item).await, [10, 0, 0, 10]);
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_extension_a_change_of_quantity_and_a_checkout_whose_retries_run_out_are_retryable() {
    let app = app().await;
    let item = app.create_inventory("EXH-HOLD", 10).await;
    let alice = app.token("alice", Role::Customer);
    let reserved = app.reserve(&alice, json!({ "inventoryId": item, "quantity": 2 })).await;
    let id = uuid(&reserved["reservation"]["id"]);
    let before = app.rows(&format!("SELECT quantity, expires_at FROM reservations WHERE id = '{id}'")).await;
    let snapshot = app.snapshot().await;

    collide(&app, "UPDATE", "reservations", "true").await;
    assert_retryable(&app.extend(&alice, id, 60).await, "extend");
    assert_retryable(&app.change_quantity(&alice, id, 5).await, "change quantity");
    let cart = json!({ "reservationIds": [id], "shippingAddress": address("1 Retry St") });
    assert_retryable(&app.checkout(&alice, cart.clone()).await, "checkout");
    assert_eq!(status(&app, id).await, "ACTIVE");
    let after = app.rows(&format!("SELECT quantity, expires_at FROM reservations WHERE id = '{id}'")).await;
    assert_eq!(after, before, "neither the expiry nor the quantity moved");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 0, "no order");
    assert_eq!(app.snapshot().await, snapshot, "nothing written");
    stop(&app, "reservations").await;

    assert_eq!(named(app.extend(&alice, id, 60).await).0, "ReservationExtended");
    assert_eq!(named(app.change_quantity(&alice, id, 5).await).0, "ReservationChanged");
    assert_eq!(named(app.checkout(&alice, cart).await).0, "OrderPlaced");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn takes_and_restocks_whose_retries_run_out_answer_their_conflict_with_the_latest_rows() {
    let app = app().await;
    let a = app.create_inventory("EXH-A", 10).await;
    let b = app.create_inventory("EXH-B", 10).await;
    let alice = app.token("alice", Role::Customer);
    let operator = app.operator();
    let snapshot = app.snapshot().await;

    collide(&app, "INSERT", "reservations", "true").await;
    let (name, conflict) = named(app.reserve(&alice, json!({ "inventoryId": a, "quantity": 1 })).await);
    assert_eq!(name, "Conflict", "reserve: {conflict}");
    assert_eq!(conflict["expectedVersion"], 1, "without one: the version last seen");
    assert_eq!(conflict["inventory"]["stock"], 10);
    let (name, versioned) =
        named(app.reserve(&alice, json!({ "inventoryId": a, "quantity": 1, "expectedVersion": 1 })).await);
    assert_eq!(name, "Conflict", "versioned reserve: {versioned}");

    let lines = json!([{ "inventoryId": a, "quantity": 1 }, { "inventoryId": b, "quantity": 2 }]);
    for (what, answer) in [
        ("reserveMany", app.reserve_many(&alice, lines.clone()).await),
        (
            "placeOrder",
            app.place_order(&alice, json!({ "items": lines, "shippingAddress": address("1 Retry St") })).await,
        ),
    ] {
        let (name, unavailable) = named(answer);
        assert_eq!(name, "ItemsUnavailable", "{what}: {unavailable}");
        let reasons: Vec<&Value> =
            unavailable["items"].as_array().expect("items").iter().map(|i| &i["reason"]).collect();
        assert_eq!(reasons, [&json!("CONFLICT"), &json!("CONFLICT")], "{what}: every line, with its latest row");
    }
    stop(&app, "reservations").await;

    collide(&app, "UPDATE", "inventories", "true").await;
    let (name, conflict) = named(app.restock(&operator, json!({ "inventoryId": a, "quantity": 5 })).await);
    assert_eq!(name, "Conflict", "restock: {conflict}");
    stop(&app, "inventories").await;

    assert_eq!(app.snapshot().await, snapshot, "nothing written");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 0, "no order");
    assert_eq!(named(app.reserve(&alice, json!({ "inventoryId": a, "quantity": 1 })).await).0, "Reserved");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_address_change_whose_retries_run_out_answers_the_version_conflict_with_the_order_as_it_is() {
    let app = app().await;
    let item = app.create_inventory("EXH-ADDR", 10).await;
    let alice = app.token("alice", Role::Customer);
    let input = json!({ "items": [{ "inventoryId": item, "quantity": 1 }], "shippingAddress": address("1 Old St") });
    let placed = app.place_order(&alice, input).await;
    let order = uuid(&placed["order"]["id"]);

    collide(&app, "UPDATE", "orders", "true").await;
    let (name, conflict) = named(app.change_address(&alice, order, 1, &address("2 New St")).await);
    assert_eq!(name, "OrderVersionConflict", "{conflict}");
    assert_eq!(conflict["current"]["shippingAddress"]["line1"], "1 Old St");
    assert_eq!(conflict["submitted"]["line1"], "2 New St");
    stop(&app, "orders").await;

    let (name, changed) = named(app.change_address(&alice, order, 1, &address("2 New St")).await);
    assert_eq!(name, "ShippingAddressChanged", "{changed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_return_whose_retries_run_out_is_retryable_and_returns_nothing() {
    let app = app().await;
    let item = crate::locations::stocked(&app, "EXH-RETURN", 5).await;
    let order = crate::returns::fulfilled_order(&app, &[(item, 2)]).await;
    let input = json!({ "orderId": order, "lines": [crate::returns::line(item, 1, false, None)] });
    let before = crate::returns::untouched(&app).await;

    collide(&app, "INSERT", "returns", "true").await;
    assert_retryable(&app.return_order(&app.operator(), input.clone()).await, "return");
    assert_eq!(crate::returns::untouched(&app).await, before, "nothing written");
    stop(&app, "returns").await;

    assert_eq!(named(app.return_order(&app.operator(), input).await).0, "OrderReturned");
    app.assert_invariant().await;
}
