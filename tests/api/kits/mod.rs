//! Kits: several inventories sold as one. A kit is flattened when it is
//! made (a component shared by two sub-kits counts once, summed); bad
//! input writes nothing; `reserveKit` takes every component or nothing, and
//! `Kit.available` is exactly the number of one-kit reservations that
//! succeed one after another; a kit reservation's components are released,
//! extended and expired together, never one alone; a key replays. The
//! races are in `races.rs`, the property test against a model in
//! `model.rs`.

mod batched;
mod model;
mod races;

use sea_orm::ConnectionTrait;
use serde_json::{Value, json};
use stockguard::auth::Role;
use uuid::Uuid;

use crate::{
    documents::{
        CHANGE_ONE, CHECKOUT_KITS, CREATE_KIT, EXTEND_KIT, EXTEND_ONE, KIT, KIT_RESERVATION, KITS, PLACE_ORDER_KITS,
        RELEASE_KIT, RELEASE_ONE, RESERVE_KIT, RESERVE_MANY_KITS, UPDATE_KIT,
    },
    helpers::{Isolation, TestApp, error_code, sweep_all, uuid},
    locations::{create_location, default_location, stocked},
    transfers::transfer,
};

/// `createKit` of `components` (JSON inputs) as an operator.
pub async fn create_kit(app: &TestApp, sku: &str, components: Value) -> Value {
    let input = json!({ "sku": sku, "name": format!("Kit {sku}"), "components": components });
    app.mutate(&app.operator(), "createKit", CREATE_KIT, json!({ "input": input })).await
}

/// The id of a new kit of `components`.
pub async fn kit_of(app: &TestApp, sku: &str, components: Value) -> Uuid {
    let kit = create_kit(app, sku, components).await;
    uuid(&kit["id"])
}

/// `reserveKit` as `token` of `quantity` kits (more input in `extra`).
pub async fn reserve_kit(app: &TestApp, token: &str, kit: Uuid, quantity: i32, extra: Value) -> Value {
    let mut input = json!({ "kitId": kit, "quantity": quantity });
    if let (Some(input), Some(extra)) = (input.as_object_mut(), extra.as_object()) {
        input.extend(extra.clone());
    }
    app.mutate(token, "reserveKit", RESERVE_KIT, json!({ "input": input })).await
}

/// `Kit.available` through the API.
pub async fn available(app: &TestApp, kit: Uuid) -> i64 {
    let body = app.graphql(None, KIT, json!({ "id": kit })).await;
    body["data"]["kit"]["available"].as_i64().unwrap_or_else(|| panic!("{body}"))
}

/// Everything a refused request must leave as it was.
async fn untouched(app: &TestApp) -> (String, i64, i64, i64) {
    (
        app.snapshot().await,
        app.count("SELECT count(*) FROM kits").await,
        app.count("SELECT count(*) FROM kit_components").await,
        app.count("SELECT count(*) FROM kit_reservations").await,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kit_is_flattened_and_a_component_shared_by_two_sub_kits_counts_once() {
    let app = TestApp::spawn().await;
    let (lens, battery, strap) =
        (stocked(&app, "LENS", 10).await, stocked(&app, "BATTERY", 50).await, stocked(&app, "STRAP", 9).await);
    let body_kit = kit_of(
        &app,
        "BODY",
        json!([{ "inventoryId": lens, "quantity": 1 }, { "inventoryId": battery, "quantity": 2 }]),
    )
    .await;
    let power = kit_of(&app, "POWER", json!([{ "inventoryId": battery, "quantity": 1 }])).await;
    let kit = create_kit(
        &app,
        "BUNDLE",
        json!([
            { "kitId": body_kit, "quantity": 2 },
            { "kitId": power, "quantity": 1 },
            { "inventoryId": strap, "quantity": 4 },
        ]),
    )
    .await;
    // Ordered by inventory sku: BATTERY 2×2 + 1, LENS 2, STRAP 4.
    let components: Vec<(String, i64)> = kit["components"]
        .as_array()
        .expect("components")
        .iter()
        .map(|c| (c["inventory"]["sku"].as_str().expect("sku").to_owned(), c["quantity"].as_i64().expect("n")))
        .collect();
    assert_eq!(components, vec![("BATTERY".into(), 5), ("LENS".into(), 2), ("STRAP".into(), 4)]);
    // min(50 / 5, 10 / 2, 9 / 4) = 2.
    assert_eq!(kit["available"], 2, "{kit}");
    assert_eq!((&kit["active"], &kit["sku"]), (&json!(true), &json!("BUNDLE")));
    let by_sku = app.graphql(None, "query { kitBySku(sku: \"BUNDLE\") { id } }", json!({})).await;
    assert_eq!(by_sku["data"]["kitBySku"]["id"], kit["id"]);
    let node = app
        .graphql(None, "query($id: ID!) { node(id: $id) { ... on Kit { sku } } }", json!({ "id": kit["nodeId"] }))
        .await;
    assert_eq!(node["data"]["node"]["sku"], "BUNDLE", "{node}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_kits_are_bad_input_and_write_nothing() {
    let app = TestApp::spawn().await;
    let item = stocked(&app, "KIT-PART", 5).await;
    let existing = kit_of(&app, "EXISTING", json!([{ "inventoryId": item, "quantity": 1 }])).await;
    let before = untouched(&app).await;
    let operator = app.operator();
    let cases = [
        json!([]),
        json!([{ "inventoryId": item, "kitId": existing, "quantity": 1 }]),
        json!([{ "quantity": 1 }]),
        json!([{ "inventoryId": Uuid::new_v4(), "quantity": 1 }]),
        json!([{ "kitId": Uuid::new_v4(), "quantity": 1 }]),
        json!([{ "inventoryId": item, "quantity": 1 }, { "inventoryId": item, "quantity": 2 }]),
        json!([{ "inventoryId": item, "quantity": 0 }]),
        json!([{ "inventoryId": item, "quantity": 1001 }]),
        json!([{ "kitId": existing, "quantity": 600 }, { "inventoryId": item, "quantity": 401 }]),
    ];
    for components in cases {
        let input = json!({ "sku": "NEW", "name": "New", "components": components });
        let body = app.graphql(Some(&operator), CREATE_KIT, json!({ "input": input })).await;
        assert_eq!(error_code(&body), Some("BAD_USER_INPUT"), "{components}: {body}");
    }
    let duplicate =
        json!({ "sku": "EXISTING", "name": "Again", "components": [{ "inventoryId": item, "quantity": 1 }] });
    let body = app.graphql(Some(&operator), CREATE_KIT, json!({ "input": duplicate })).await;
    assert_eq!(error_code(&body), Some("BAD_USER_INPUT"), "a sku another kit has: {body}");
    let customer = app.token("alice", Role::Customer);
    let input = json!({ "sku": "MINE", "name": "Mine", "components": [{ "inventoryId": item, "quantity": 1 }] });
    let body = app.graphql(Some(&customer), CREATE_KIT, json!({ "input": input })).await;
    assert_eq!(error_code(&body), Some("FORBIDDEN"), "{body}");
    let update = json!({ "input": { "id": existing, "active": false } });
    let body = app.graphql(Some(&customer), UPDATE_KIT, update).await;
    assert_eq!(error_code(&body), Some("FORBIDDEN"), "{body}");
    assert_eq!(untouched(&app).await, before, "nothing written");
    let many: Vec<Value> = futures::future::join_all((0..51).map(|n| {
        let app = &app;
        async move { json!({ "inventoryId": stocked(app, &format!("MANY-{n}"), 1).await, "quantity": 1 }) }
    }))
    .await;
    let before = untouched(&app).await;
    let body = app
        .graphql(Some(&operator), CREATE_KIT, json!({ "input": { "sku": "MANY", "name": "Many", "components": many } }))
        .await;
    assert_eq!(error_code(&body), Some("BAD_USER_INPUT"), "51 inventories: {body}");
    assert_eq!(untouched(&app).await, before, "nothing written");
}

#[tokio::test(flavor = "multi_thread")]
async fn available_is_exactly_the_kits_reserved_one_after_another_and_a_short_kit_takes_nothing() {
    let app = TestApp::spawn().await;
    let (camera, battery) = (stocked(&app, "CAM", 5).await, stocked(&app, "BAT", 7).await);
    // Safety stock counts: one battery of the seven is the shop's own.
    let set = json!({ "input": { "inventoryId": battery, "quantity": 1 } });
    let body = app.graphql(Some(&app.operator()), crate::documents::SET_SAFETY_STOCK, set).await;
    assert!(body["errors"].is_null(), "{body}");
    let kit = kit_of(
        &app,
        "CAM-KIT",
        json!([{ "inventoryId": camera, "quantity": 1 }, { "inventoryId": battery, "quantity": 2 }]),
    )
    .await;
    let alice = app.token("alice", Role::Customer);
    let expected = available(&app, kit).await;
    assert_eq!(expected, 3, "min(5 / 1, 6 / 2)");
    for n in 0..expected {
        let answer = reserve_kit(&app, &alice, kit, 1, json!({})).await;
        assert_eq!(answer["__typename"], "KitReserved", "kit {n}: {answer}");
        let parts = answer["kitReservation"]["reservations"].as_array().expect("parts");
        let quantities: Vec<(Uuid, i64)> =
            parts.iter().map(|p| (uuid(&p["inventory"]["id"]), p["quantity"].as_i64().expect("n"))).collect();
        let mut expected_parts = vec![(camera, 1), (battery, 2)];
        expected_parts.sort();
        assert_eq!(quantities, expected_parts, "one reservation per component, by inventory id");
        assert!(parts.iter().all(|p| p["kitReservation"]["id"] == answer["kitReservation"]["id"]));
        assert!(
            parts.iter().all(|p| p["status"] == "ACTIVE" && p["expiresAt"] == answer["kitReservation"]["expiresAt"])
        );
    }
    assert_eq!(available(&app, kit).await, 0);
    let before = untouched(&app).await;
    let short = reserve_kit(&app, &alice, kit, 1, json!({})).await;
    assert_eq!(short["__typename"], "KitSoldOut", "{short}");
    assert_eq!((&short["requested"], &short["available"]), (&json!(1), &json!(0)));
    assert_eq!(short["components"], json!([{ "inventoryId": battery, "reason": "SOLD_OUT", "available": 0 }]));
    assert_eq!(untouched(&app).await, before, "a short kit takes nothing, not even its camera");
    assert_eq!(app.states(camera).await[0], 2, "two cameras left");
    // Each component was one change of its inventory, its ledger rows carrying the kit reservation.
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM stock_movements WHERE inventory_id = '{battery}' AND kit_reservation_id IS NOT NULL"
        ))
        .await,
        3
    );
    assert_eq!(app.stock_and_version(battery).await, (1, 4));
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kit_takes_each_component_across_locations_by_the_strategy() {
    let app = TestApp::spawn().await;
    let (a, b) = (stocked(&app, "SPLIT-A", 4).await, stocked(&app, "SPLIT-B", 4).await);
    let north = create_location(&app, "north", 1).await;
    let from = default_location(&app).await;
    let moved = json!({ "inventoryId": a, "fromLocationId": from, "toLocationId": north, "quantity": 3 });
    assert_eq!(transfer(&app, &app.operator(), moved).await["__typename"], "StockTransferred");
    let kit =
        kit_of(&app, "SPLIT-KIT", json!([{ "inventoryId": a, "quantity": 2 }, { "inventoryId": b, "quantity": 1 }]))
            .await;
    let alice = app.token("alice", Role::Customer);
    let answer = reserve_kit(&app, &alice, kit, 2, json!({})).await;
    assert_eq!(answer["__typename"], "KitReserved", "{answer}");
    let parts = answer["kitReservation"]["reservations"].as_array().expect("parts").clone();
    let part_a = parts.iter().find(|p| uuid(&p["inventory"]["id"]) == a).expect("a");
    assert_eq!(part_a["quantity"], 4);
    // By priority: the default location's one unit first, then north's three.
    let allocations = json!([{ "location": { "code": "default" }, "quantity": 1 }, { "location": { "code": "north" }, "quantity": 3 }]);
    assert_eq!(part_a["allocations"], allocations);
    // Without a split, no location holds 4 of A any more.
    let refused = reserve_kit(&app, &alice, kit, 1, json!({ "allowSplit": false })).await;
    assert_eq!(refused["__typename"], "KitSoldOut", "{refused}");
    let released =
        app.mutate(&alice, "releaseKitReservation", RELEASE_KIT, json!({ "id": answer["kitReservation"]["id"] })).await;
    assert_eq!(released["__typename"], "KitReservationReleased", "{released}");
    assert_eq!(app.states(a).await, [4, 0, 0, 4]);
    let levels = crate::locations::levels_of(&app, a).await;
    assert_eq!(levels, vec![("default".into(), 1), ("north".into(), 3)], "each unit back where it came from");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kit_reservation_is_released_and_extended_whole_and_never_one_component_alone() {
    let app = TestApp::spawn().await;
    let (a, b) = (stocked(&app, "WHOLE-A", 5).await, stocked(&app, "WHOLE-B", 5).await);
    let kit =
        kit_of(&app, "WHOLE", json!([{ "inventoryId": a, "quantity": 1 }, { "inventoryId": b, "quantity": 1 }])).await;
    let alice = app.token("alice", Role::Customer);
    let answer = reserve_kit(&app, &alice, kit, 2, json!({})).await;
    let kit_reservation = answer["kitReservation"].clone();
    let part = kit_reservation["reservations"][0]["id"].clone();
    let before = untouched(&app).await;
    let release = app.mutate(&alice, "releaseReservation", RELEASE_ONE, json!({ "id": part })).await;
    assert_eq!(release["__typename"], "ReservationPartOfKit", "{release}");
    assert_eq!(release["kitReservation"]["id"], kit_reservation["id"]);
    let extend = app.mutate(&alice, "extendReservation", EXTEND_ONE, json!({ "id": part, "seconds": 60 })).await;
    assert_eq!(extend["__typename"], "ReservationPartOfKit", "{extend}");
    let change = json!({ "input": { "reservationId": part, "quantity": 1 } });
    let change = app.mutate(&alice, "changeReservationQuantity", CHANGE_ONE, change).await;
    assert_eq!(change["__typename"], "ReservationPartOfKit", "{change}");
    assert_eq!(untouched(&app).await, before, "nothing written");

    let bob = app.token("bob", Role::Customer);
    let not_bobs = app.mutate(&bob, "releaseKitReservation", RELEASE_KIT, json!({ "id": kit_reservation["id"] })).await;
    assert_eq!(not_bobs["__typename"], "ReservationNotFound", "{not_bobs}");
    let seen = app.graphql(Some(&bob), KIT_RESERVATION, json!({ "id": kit_reservation["id"] })).await;
    assert_eq!(seen["data"]["kitReservation"], Value::Null, "someone else's reads as null");

    let extended = app
        .mutate(&alice, "extendKitReservation", EXTEND_KIT, json!({ "id": kit_reservation["id"], "seconds": 30 }))
        .await;
    assert_eq!(extended["__typename"], "ReservationExtended", "{extended}");
    let read = app.graphql(Some(&alice), KIT_RESERVATION, json!({ "id": kit_reservation["id"] })).await;
    let read = &read["data"]["kitReservation"];
    let expiries: Vec<&Value> =
        read["reservations"].as_array().expect("parts").iter().map(|p| &p["expiresAt"]).collect();
    assert!(
        expiries.iter().all(|e| **e == read["expiresAt"]) && read["expiresAt"] != kit_reservation["expiresAt"],
        "{read}"
    );

    let released =
        app.mutate(&alice, "releaseKitReservation", RELEASE_KIT, json!({ "id": kit_reservation["id"] })).await;
    assert_eq!(released["__typename"], "KitReservationReleased", "{released}");
    assert_eq!(released["kitReservation"]["reservations"], json!([{ "status": "RELEASED" }, { "status": "RELEASED" }]));
    let again = app.mutate(&alice, "releaseKitReservation", RELEASE_KIT, json!({ "id": kit_reservation["id"] })).await;
    assert_eq!(again["__typename"], "ReservationNotActive", "{again}");
    assert_eq!((app.states(a).await, app.states(b).await), ([5, 0, 0, 5], [5, 0, 0, 5]), "returned once");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sweeper_expires_a_kits_components_together_and_a_key_replays_the_first_kit() {
    let app = TestApp::without_sweeper(Isolation::ReadCommitted).await;
    let (a, b, c) = (stocked(&app, "EXP-A", 5).await, stocked(&app, "EXP-B", 5).await, stocked(&app, "EXP-C", 5).await);
    let kit = kit_of(&app, "EXP", json!([{ "inventoryId": a, "quantity": 1 }, { "inventoryId": b, "quantity": 2 }, { "inventoryId": c, "quantity": 1 }])).await;
    let alice = app.token("alice", Role::Customer);
    let first = reserve_kit(&app, &alice, kit, 1, json!({ "idempotencyKey": "kit-1" })).await;
    let again = reserve_kit(&app, &alice, kit, 1, json!({ "idempotencyKey": "kit-1" })).await;
    assert_eq!(again["kitReservation"]["id"], first["kitReservation"]["id"], "{again}");
    assert_eq!(app.count("SELECT count(*) FROM kit_reservations").await, 1, "taken once");
    let other = reserve_kit(&app, &alice, kit, 2, json!({ "idempotencyKey": "kit-1" })).await;
    assert_eq!(error_code(&other), Some("IDEMPOTENCY_KEY_REUSED"), "another request with the key: {other}");
    // Due now; a sweep of one line at a time still expires the kit whole.
    let due = "UPDATE reservations SET expires_at = now() - interval '1 second' WHERE kit_reservation_id IS NOT NULL";
    app.db.execute_unprepared(due).await.expect("make the kit due");
    let expired = sweep_all(&app.db, 1).await;
    assert_eq!(expired, 3, "the three components");
    let statuses = app.rows("SELECT DISTINCT status FROM reservations WHERE kit_reservation_id IS NOT NULL").await;
    assert_eq!(statuses, vec![json!({ "status": "EXPIRED" })]);
    assert_eq!((app.states(a).await[0], app.states(b).await[0], app.states(c).await[0]), (5, 5, 5));
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_inactive_kit_cannot_be_reserved_and_a_plain_checkout_of_a_component_is_refused() {
    let app = TestApp::spawn().await;
    let a = stocked(&app, "OFF-A", 5).await;
    let kit = kit_of(&app, "OFF", json!([{ "inventoryId": a, "quantity": 1 }])).await;
    let alice = app.token("alice", Role::Customer);
    let held = reserve_kit(&app, &alice, kit, 1, json!({})).await;
    let part = held["kitReservation"]["reservations"][0]["id"].clone();
    let checkout =
        json!({ "input": { "reservationIds": [part], "shippingAddress": crate::helpers::address("1 Kit Road") } });
    let body = app.graphql(Some(&alice), crate::documents::CHECKOUT, checkout).await;
    let answer = &body["data"]["checkout"];
    assert_eq!(answer["__typename"], "ReservationsUnavailable", "{body}");
    assert_eq!(answer["reservations"][0]["reason"], "PART_OF_KIT", "{body}");
    let off =
        app.mutate(&app.operator(), "updateKit", UPDATE_KIT, json!({ "input": { "id": kit, "active": false } })).await;
    assert_eq!(off["active"], false);
    let refused = reserve_kit(&app, &alice, kit, 1, json!({})).await;
    assert_eq!(refused, json!({ "__typename": "KitNotFound", "kitId": kit }));
    let unknown = app
        .mutate(&app.operator(), "updateKit", UPDATE_KIT, json!({ "input": { "id": Uuid::new_v4(), "name": "x" } }))
        .await;
    assert_eq!(unknown, Value::Null);
    let page = app.graphql(None, KITS, json!({ "first": 10 })).await;
    assert_eq!(page["data"]["kits"]["nodes"][0]["available"], 0, "an inactive kit offers none: {page}");
    app.mutate(&app.operator(), "updateKit", UPDATE_KIT, json!({ "input": { "id": kit, "active": true } })).await;
    assert_eq!(available(&app, kit).await, 4, "active again: the four units left");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kit_reservation_is_checked_out_whole_and_a_cancel_returns_every_component() {
    let app = TestApp::spawn().await;
    let (a, b) = (stocked(&app, "ORD-A", 6).await, stocked(&app, "ORD-B", 6).await);
    let kit =
        kit_of(&app, "ORD", json!([{ "inventoryId": a, "quantity": 2 }, { "inventoryId": b, "quantity": 1 }])).await;
    let alice = app.token("alice", Role::Customer);
    let held = reserve_kit(&app, &alice, kit, 1, json!({})).await;
    let kit_reservation = held["kitReservation"]["id"].clone();
    let loose = app.reserve(&alice, json!({ "inventoryId": a, "quantity": 1 })).await;
    let loose = loose["reservation"]["id"].clone();
    let dropped = reserve_kit(&app, &alice, kit, 1, json!({})).await;
    let dropped_id = dropped["kitReservation"]["id"].clone();
    app.mutate(&alice, "releaseKitReservation", RELEASE_KIT, json!({ "id": dropped_id })).await;

    let address = crate::helpers::address("1 Kit Road");
    let before = untouched(&app).await;
    let stale = json!({ "input": { "reservationIds": [loose], "kitReservationIds": [kit_reservation, dropped_id],
                                   "shippingAddress": address } });
    let refused = app.mutate(&alice, "checkout", CHECKOUT_KITS, stale).await;
    assert_eq!(refused["__typename"], "ReservationsUnavailable", "{refused}");
    assert_eq!(refused["reservations"], json!([{ "reservationId": dropped_id, "reason": "RELEASED" }]));
    assert_eq!(untouched(&app).await, before, "nothing written");
    let bob = app.token("bob", Role::Customer);
    let not_bobs = json!({ "input": { "kitReservationIds": [kit_reservation], "shippingAddress": address } });
    let refused = app.mutate(&bob, "checkout", CHECKOUT_KITS, not_bobs).await;
    assert_eq!(refused["reservations"], json!([{ "reservationId": kit_reservation, "reason": "NOT_FOUND" }]));

    let input = json!({ "input": { "reservationIds": [loose], "kitReservationIds": [kit_reservation],
                                   "shippingAddress": address, "idempotencyKey": "kit-order" } });
    let placed = app.mutate(&alice, "checkout", CHECKOUT_KITS, input.clone()).await;
    assert_eq!(placed["__typename"], "OrderPlaced", "{placed}");
    let mut items: Vec<(Uuid, i64, bool)> = placed["order"]["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| (uuid(&i["inventory"]["id"]), i["quantity"].as_i64().expect("n"), i["kit"]["id"] == json!(kit)))
        .collect();
    items.sort();
    let mut expected = vec![(a, 2, true), (a, 1, false), (b, 1, true)];
    expected.sort();
    assert_eq!(items, expected, "one line per component with its kit, and the loose line without");
    let replayed = app.mutate(&alice, "checkout", CHECKOUT_KITS, input).await;
    assert_eq!(replayed["order"]["id"], placed["order"]["id"], "the key replays the order");
    let read = app.graphql(Some(&alice), KIT_RESERVATION, json!({ "id": kit_reservation })).await;
    assert_eq!(read["data"]["kitReservation"]["status"], "ORDERED", "{read}");

    let cancelled =
        app.mutate(&alice, "cancelOrder", crate::documents::CANCEL_ORDER, json!({ "id": placed["order"]["id"] })).await;
    assert_eq!(cancelled["__typename"], "OrderCancelled", "{cancelled}");
    assert_eq!((app.states(a).await, app.states(b).await), ([6, 0, 0, 6], [6, 0, 0, 6]), "every unit back");
    let statuses = app
        .rows(&format!(
            "SELECT DISTINCT status FROM reservations WHERE kit_reservation_id = '{}'",
            uuid(&kit_reservation)
        ))
        .await;
    assert_eq!(statuses, vec![json!({ "status": "RELEASED" })]);
    let rows = app
        .count(&format!(
            "SELECT count(*) FROM stock_movements WHERE reason = 'ORDER_CANCELLED' AND kit_reservation_id = '{}'",
            uuid(&kit_reservation)
        ))
        .await;
    assert_eq!(rows, 2, "the cancel's ledger rows name the kit reservation");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cart_sums_kit_lines_and_loose_units_of_their_components_before_judging_them() {
    let app = TestApp::spawn().await;
    // Medusa #16502: 97 + 23 against 108 must not be accepted.
    let (bottle, cap) = (stocked(&app, "BOTTLE", 108).await, stocked(&app, "CAP", 200).await);
    let pack = kit_of(
        &app,
        "SIX-PACK",
        json!([{ "inventoryId": bottle, "quantity": 1 }, { "inventoryId": cap, "quantity": 1 }]),
    )
    .await;
    let alice = app.token("alice", Role::Customer);
    let before = untouched(&app).await;
    let input = json!({ "input": { "items": [{ "inventoryId": bottle, "quantity": 23 }],
                                   "kits": [{ "kitId": pack, "quantity": 97 }] } });
    let refused = app.mutate(&alice, "reserveMany", RESERVE_MANY_KITS, input).await;
    assert_eq!(refused["__typename"], "ItemsUnavailable", "{refused}");
    assert_eq!(
        refused["items"],
        json!([{ "inventoryId": bottle, "reason": "SOLD_OUT", "available": 108, "kitId": pack }])
    );
    assert_eq!(untouched(&app).await, before, "nothing written");
    let unknown = Uuid::new_v4();
    let missing = json!({ "input": { "kits": [{ "kitId": unknown }] } });
    let missing = app.mutate(&alice, "reserveMany", RESERVE_MANY_KITS, missing).await;
    assert_eq!(
        missing["items"],
        json!([{ "inventoryId": unknown, "reason": "NOT_FOUND", "available": null, "kitId": unknown }])
    );

    let input = json!({ "input": { "items": [{ "inventoryId": bottle, "quantity": 11 }],
                                   "kits": [{ "kitId": pack, "quantity": 97 }], "idempotencyKey": "cart-1" } });
    let reserved = app.mutate(&alice, "reserveMany", RESERVE_MANY_KITS, input.clone()).await;
    assert_eq!(reserved["__typename"], "ReservedAll", "{reserved}");
    assert_eq!(
        reserved["reservations"],
        json!([{ "id": reserved["reservations"][0]["id"], "quantity": 11,
                                                   "inventory": { "id": bottle }, "kitReservation": null }])
    );
    let kit_reservation = &reserved["kitReservations"][0];
    assert_eq!((&kit_reservation["quantity"], &kit_reservation["kit"]["id"]), (&json!(97), &json!(pack)));
    let replayed = app.mutate(&alice, "reserveMany", RESERVE_MANY_KITS, input).await;
    assert_eq!(replayed, reserved, "the key replays the whole cart");
    assert_eq!((app.states(bottle).await[0], app.states(cap).await[0]), (0, 103));
    app.assert_invariant().await;

    let restock = json!({ "input": { "inventoryId": bottle, "quantity": 12 } });
    app.graphql(Some(&app.operator()), crate::documents::RESTOCK, restock).await;
    let order = json!({ "input": { "items": [{ "inventoryId": cap, "quantity": 1 }],
                                   "kits": [{ "kitId": pack, "quantity": 2 }],
                                   "shippingAddress": crate::helpers::address("1 Pack Lane") } });
    let placed = app.mutate(&alice, "placeOrder", PLACE_ORDER_KITS, order).await;
    assert_eq!(placed["__typename"], "OrderPlaced", "{placed}");
    let mut items: Vec<(Uuid, i64, bool)> = placed["order"]["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| (uuid(&i["inventory"]["id"]), i["quantity"].as_i64().expect("n"), i["kit"]["id"] == json!(pack)))
        .collect();
    items.sort();
    let mut expected = vec![(bottle, 2, true), (cap, 1, false), (cap, 2, true)];
    expected.sort();
    assert_eq!(items, expected);
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_archive_takes_a_done_kit_reservation_whole_or_leaves_it() {
    let app = TestApp::spawn().await;
    let (a, b) = (stocked(&app, "AR-A", 5).await, stocked(&app, "AR-B", 5).await);
    let kit =
        kit_of(&app, "AR", json!([{ "inventoryId": a, "quantity": 1 }, { "inventoryId": b, "quantity": 1 }])).await;
    let alice = app.token("alice", Role::Customer);
    let plain = reserve_kit(&app, &alice, kit, 1, json!({})).await;
    let keyed = reserve_kit(&app, &alice, kit, 1, json!({ "idempotencyKey": "archived-kit" })).await;
    let held = reserve_kit(&app, &alice, kit, 1, json!({})).await;
    for done in [&plain, &keyed] {
        let released = app
            .mutate(&alice, "releaseKitReservation", RELEASE_KIT, json!({ "id": done["kitReservation"]["id"] }))
            .await;
        assert_eq!(released["__typename"], "KitReservationReleased", "{released}");
    }
    stockguard::stock::partitions::make(&app.db, 101, -100).await.expect("partitions");
    app.db
        .execute_unprepared(
            "UPDATE reservations SET created_at = created_at - interval '100 days';
             UPDATE kit_reservations SET created_at = created_at - interval '100 days';
             UPDATE idempotency_keys SET created_at = created_at - interval '100 days';
             UPDATE stock_movements SET created_at = created_at - interval '100 days';",
        )
        .await
        .expect("backdate");
    let collisions = stockguard::db::Collisions::new(20);
    let ninety_days = std::time::Duration::from_secs(90 * 24 * 3600);
    stockguard::archive::archive(&app.db, &collisions, ninety_days, 3).await.expect("archive");
    app.assert_invariant().await;
    let left = app.rows("SELECT k.id, count(r.id) AS parts FROM kit_reservations k LEFT JOIN reservations r ON r.kit_reservation_id = k.id GROUP BY k.id").await;
    assert_eq!(
        left,
        vec![json!({ "id": held["kitReservation"]["id"], "parts": 2 })],
        "the released kits went whole, the held one stayed whole"
    );
    let read = app.graphql(Some(&alice), KIT_RESERVATION, json!({ "id": held["kitReservation"]["id"] })).await;
    assert_eq!(read["data"]["kitReservation"]["status"], "ACTIVE", "{read}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_keyed_cart_replays_its_first_outcome_after_its_kit_is_deactivated() {
    let app = TestApp::spawn().await;
    let a = stocked(&app, "REPLAY-A", 5).await;
    let kit = kit_of(&app, "REPLAY", json!([{ "inventoryId": a, "quantity": 2 }])).await;
    let alice = app.token("alice", Role::Customer);
    let input = json!({ "input": { "kits": [{ "kitId": kit }], "idempotencyKey": "replay-cart" } });
    let first = app.mutate(&alice, "reserveMany", RESERVE_MANY_KITS, input.clone()).await;
    assert_eq!(first["__typename"], "ReservedAll", "{first}");
    app.mutate(&app.operator(), "updateKit", UPDATE_KIT, json!({ "input": { "id": kit, "active": false } })).await;
    let replayed = app.mutate(&alice, "reserveMany", RESERVE_MANY_KITS, input).await;
    assert_eq!(replayed, first, "the key replays the first outcome");
    let fresh = json!({ "input": { "kits": [{ "kitId": kit }] } });
    let refused = app.mutate(&alice, "reserveMany", RESERVE_MANY_KITS, fresh).await;
    assert_eq!(
        refused["items"],
        json!([{ "inventoryId": kit, "reason": "NOT_FOUND", "available": null, "kitId": kit }])
    );
    assert_eq!(app.states(a).await[0], 3, "taken once");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_page_of_kits_with_their_availability_and_components_costs_the_same_statements_however_many_kits_and_parts() {
    // No sweeper: its ticks run on the same pool, and one landing during a
    // read was counted as the page's (a failure on a loaded machine).
    let app = TestApp::without_sweeper(Isolation::ReadCommitted).await;
    let page = "query { kits(first: 100) { nodes { sku available components { inventory { sku stock } quantity } } } }";
    let mut counted = Vec::new();
    // Two kits of one component, then six more of four: each read is one batch for the page.
    for (round, (kits, parts)) in [(2, 1), (6, 4)].into_iter().enumerate() {
        for n in 0..kits {
            let mut components = Vec::new();
            for p in 0..parts {
                let item = stocked(&app, &format!("PAGE-{round}-{n}-{p}"), 9).await;
                components.push(json!({ "inventoryId": item, "quantity": 3 }));
            }
            kit_of(&app, &format!("PAGE-{round}-{n}"), json!(components)).await;
        }
        let before = app.statements.load(std::sync::atomic::Ordering::SeqCst);
        let body = app.graphql(None, page, json!({})).await;
        counted.push(app.statements.load(std::sync::atomic::Ordering::SeqCst) - before);
        let nodes = body["data"]["kits"]["nodes"].as_array().unwrap_or_else(|| panic!("{body}")).clone();
        assert!(nodes.iter().all(|kit| kit["available"] == 3), "{body}");
    }
    assert_eq!(counted[0], counted[1], "one statement per kind of read for the page, not per kit or per component");
}
