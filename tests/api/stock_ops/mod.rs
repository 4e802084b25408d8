//! Stock operations besides a sale: `adjustStock` (a signed change or a
//! count, with a reason) and safety stock (`setSafetyStock`,
//! `useSafetyStock`). An adjustment is one change with one `ADJUSTED`
//! ledger row and takes only available units; a count sets on hand, is
//! refused below what is held and writes nothing when it matches; no
//! customer path takes a level's safety stock, an operator asking to may;
//! bad input writes nothing; the check counts adjustments and reports a
//! drift of one. The races are in `races.rs`, the mixed coalesced batches
//! in `batches.rs`.

mod batches;
mod races;

use sea_orm::ConnectionTrait;
use serde_json::{Value, json};
use stockguard::{auth::Role, invariant};
use uuid::Uuid;

use crate::{
    documents::{
        ADJUST_STOCK, ADJUSTED_MOVEMENTS, CHANGE_QUANTITY_OFFERED, PLACE_ORDER_OFFERED, RESERVE_MANY_OFFERED,
        RESERVE_OFFERED, SAFETY_STATES, SET_SAFETY_STOCK,
    },
    helpers::{TestApp, address, error_code, uuid},
    locations::{create_location, default_location, levels_of, stocked},
    transfers::transfer,
};

/// `adjustStock` with `input`, as `token`.
pub async fn adjust(app: &TestApp, token: &str, input: Value) -> Value {
    app.mutate(token, "adjustStock", ADJUST_STOCK, json!({ "input": input })).await
}

/// `setSafetyStock` with `input`, as `token`.
pub async fn set_safety(app: &TestApp, token: &str, input: Value) -> Value {
    app.mutate(token, "setSafetyStock", SET_SAFETY_STOCK, json!({ "input": input })).await
}

/// `reserve` with `input`, answering what a refused request was offered.
pub async fn reserve(app: &TestApp, token: &str, input: Value) -> Value {
    app.mutate(token, "reserve", RESERVE_OFFERED, json!({ "input": input })).await
}

/// `reserveMany` of `items`, answering what each short line was offered.
pub async fn reserve_many(app: &TestApp, token: &str, items: Value) -> Value {
    app.mutate(token, "reserveMany", RESERVE_MANY_OFFERED, json!({ "input": { "items": items } })).await
}

/// `placeOrder` of `items`, answering what each short line was offered.
pub async fn place_order(app: &TestApp, token: &str, items: Value) -> Value {
    let input = json!({ "items": items, "shippingAddress": address("1 Safety Street") });
    app.mutate(token, "placeOrder", PLACE_ORDER_OFFERED, json!({ "input": input })).await
}

/// `changeReservationQuantity` of `id` to `quantity`, answering what a refused increase was offered.
pub async fn change_quantity(app: &TestApp, token: &str, id: Uuid, quantity: i32) -> Value {
    let input = json!({ "reservationId": id, "quantity": quantity });
    app.mutate(token, "changeReservationQuantity", CHANGE_QUANTITY_OFFERED, json!({ "input": input })).await
}

/// The inventory's stock states, safety stock and levels through the API.
pub async fn safety_states(app: &TestApp, inventory: Uuid) -> Value {
    app.graphql(None, SAFETY_STATES, json!({ "id": inventory })).await["data"]["inventory"].clone()
}

/// The ADJUSTED ledger rows of `inventory` through the API, oldest first.
async fn adjusted_rows(app: &TestApp, inventory: Uuid) -> Vec<Value> {
    let body = app.graphql(Some(&app.operator()), ADJUSTED_MOVEMENTS, json!({ "id": inventory })).await;
    let nodes = body["data"]["inventory"]["movements"]["nodes"].as_array().unwrap_or_else(|| panic!("{body}")).clone();
    nodes.into_iter().filter(|row| row["reason"] == "ADJUSTED").collect()
}

/// Everything a refused request must leave as it was: stock, versions,
/// reservations and ledger, every level's units and safety stock, and the claimed keys.
pub async fn untouched(app: &TestApp) -> (String, Vec<Value>, i64) {
    let levels =
        app.rows("SELECT inventory_id, location_id, available, safety_stock FROM stock_levels ORDER BY 1, 2").await;
    (app.snapshot().await, levels, app.count("SELECT count(*) FROM idempotency_keys").await)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_decrease_takes_only_available_units_in_one_change_with_one_adjusted_row() {
    let app = TestApp::spawn().await;
    let operator = app.operator();
    let item = stocked(&app, "ADJ-DOWN", 10).await;
    let held = reserve(&app, &app.token("alice", Role::Customer), json!({ "inventoryId": item, "quantity": 3 })).await;
    assert_eq!(held["__typename"], "Reserved", "{held}");
    let (_, version) = app.stock_and_version(item).await;

    // Eight would reach into the three alice holds.
    let before = untouched(&app).await;
    let refused = adjust(&app, &operator, json!({ "inventoryId": item, "delta": -8, "reason": "DAMAGED" })).await;
    assert_eq!(refused["__typename"], "SoldOut", "{refused}");
    assert_eq!((&refused["requested"], &refused["available"]), (&json!(8), &json!(7)), "the level's available units");
    assert_eq!(untouched(&app).await, before, "nothing written");

    let input = json!({ "inventoryId": item, "delta": -7, "reason": "DAMAGED", "note": "  pallet dropped  " });
    let answer = adjust(&app, &operator, input).await;
    assert_eq!(answer["__typename"], "StockAdjusted", "{answer}");
    assert_eq!(answer["delta"], -7);
    assert_eq!(answer["inventory"], json!({ "id": item, "stock": 0, "version": version + 1, "onHand": 3 }));
    let level = &answer["level"];
    assert_eq!((&level["available"], &level["reserved"], &level["onHand"]), (&json!(0), &json!(3), &json!(3)));
    assert_eq!(level["location"]["code"], "default", "the default location when none is named");
    let rows = adjusted_rows(&app, item).await;
    assert_eq!(
        rows,
        vec![json!({ "delta": -7, "reason": "ADJUSTED", "adjustmentReason": "DAMAGED", "note": "pallet dropped",
                     "actor": "operator", "stockAfter": 0, "versionAfter": version + 1,
                     "location": { "code": "default" } })]
    );
    assert_eq!(app.states(item).await, [0, 3, 0, 3], "alice's three are still held");
    // A ledger row that is not an adjustment says no reason and no actor.
    let body = app.graphql(Some(&operator), ADJUSTED_MOVEMENTS, json!({ "id": item })).await;
    let reserved = &body["data"]["inventory"]["movements"]["nodes"][1];
    assert_eq!((&reserved["reason"], &reserved["adjustmentReason"]), (&json!("RESERVED"), &Value::Null));
    assert_eq!((&reserved["note"], &reserved["actor"]), (&Value::Null, &Value::Null), "{reserved}");
    let found = adjust(&app, &operator, json!({ "inventoryId": item, "delta": 4, "reason": "FOUND" })).await;
    assert_eq!((&found["delta"], &found["inventory"]["stock"]), (&json!(4), &json!(4)), "{found}");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_count_sets_on_hand_is_refused_below_what_is_held_and_writes_nothing_when_it_matches() {
    let app = TestApp::spawn().await;
    let operator = app.operator();
    let item = stocked(&app, "ADJ-COUNT", 10).await;
    let (default, b) = (default_location(&app).await, create_location(&app, "b", 10).await);
    let moved = json!({ "inventoryId": item, "fromLocationId": default, "toLocationId": b, "quantity": 4 });
    assert_eq!(transfer(&app, &operator, moved).await["__typename"], "StockTransferred");
    // Three held at the default location (priority 0): 3 available there, 6 on hand.
    let held = reserve(&app, &app.token("alice", Role::Customer), json!({ "inventoryId": item, "quantity": 3 })).await;
    assert_eq!(held["reservation"]["allocations"], json!([{ "location": { "code": "default" }, "quantity": 3 }]));
    let count = |at: Option<Uuid>, counted: i32| {
        let mut input = json!({ "inventoryId": item, "countedOnHand": counted, "reason": "CYCLE_COUNT" });
        if let Some(at) = at {
            input["locationId"] = json!(at);
        }
        input
    };

    let before = untouched(&app).await;
    let below = adjust(&app, &operator, count(None, 2)).await;
    assert_eq!(below["__typename"], "CountBelowHeld", "{below}");
    assert_eq!(below["held"], 3);
    assert_eq!(
        below["level"],
        json!({ "location": { "code": "default" }, "available": 3, "reserved": 3, "committed": 0, "onHand": 6 })
    );
    assert_eq!(untouched(&app).await, before, "nothing written below what is held");
    let matched = adjust(&app, &operator, count(Some(default), 6)).await;
    assert_eq!((&matched["__typename"], &matched["delta"]), (&json!("StockAdjusted"), &json!(0)), "{matched}");
    assert_eq!(matched["level"]["onHand"], 6);
    assert_eq!(untouched(&app).await, before, "a count that matches writes nothing");

    let (_, version) = app.stock_and_version(item).await;
    let fewer = adjust(&app, &operator, count(None, 4)).await;
    assert_eq!(
        (&fewer["delta"], &fewer["level"]["available"], &fewer["level"]["onHand"]),
        (&json!(-2), &json!(1), &json!(4))
    );
    let more = adjust(&app, &operator, count(Some(b), 9)).await;
    assert_eq!(
        (&more["delta"], &more["level"]["available"], &more["inventory"]["version"]),
        (&json!(5), &json!(9), &json!(version + 2))
    );
    // A location that never held it: the count makes its level.
    let c = create_location(&app, "c", 20).await;
    let found = adjust(&app, &operator, count(Some(c), 2)).await;
    assert_eq!((&found["delta"], &found["level"]["location"]["code"]), (&json!(2), &json!("c")), "{found}");
    assert_eq!(levels_of(&app, item).await, vec![("default".into(), 1), ("b".into(), 9), ("c".into(), 2)]);
    let reasons = app
        .rows(&format!(
            "SELECT delta, adjustment_reason FROM stock_movements WHERE inventory_id = '{item}' AND reason = 'ADJUSTED' ORDER BY version_after"
        ))
        .await;
    let expected = [-2, 5, 2].map(|delta| json!({ "delta": delta, "adjustment_reason": "CYCLE_COUNT" }));
    assert_eq!(reasons, expected);
    assert_eq!(app.states(item).await, [12, 3, 0, 15]);
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stale_version_an_unknown_inventory_or_location_writes_nothing() {
    let app = TestApp::spawn().await;
    let operator = app.operator();
    let item = stocked(&app, "ADJ-GUARD", 5).await;
    let before = untouched(&app).await;
    let stale = json!({ "inventoryId": item, "delta": 1, "reason": "CORRECTION", "expectedVersion": 7 });
    let conflict = adjust(&app, &operator, stale).await;
    assert_eq!(
        conflict,
        json!({ "__typename": "Conflict", "expectedVersion": 7, "inventory": { "id": item, "stock": 5, "version": 1 } })
    );
    // A count that would match is judged against the version first.
    let matching = json!({ "inventoryId": item, "countedOnHand": 5, "reason": "CYCLE_COUNT", "expectedVersion": 2 });
    assert_eq!(adjust(&app, &operator, matching).await["__typename"], "Conflict");
    let missing = Uuid::new_v4();
    let unknown = adjust(&app, &operator, json!({ "inventoryId": missing, "delta": 1, "reason": "FOUND" })).await;
    assert_eq!(unknown, json!({ "__typename": "InventoryNotFound", "inventoryId": missing }));
    let nowhere = json!({ "inventoryId": item, "locationId": missing, "delta": 1, "reason": "FOUND" });
    assert_eq!(
        adjust(&app, &operator, nowhere).await,
        json!({ "__typename": "LocationNotFound", "locationId": missing })
    );
    assert_eq!(untouched(&app).await, before, "nothing written");
    let current = json!({ "inventoryId": item, "delta": 2, "reason": "CORRECTION", "expectedVersion": 1 });
    assert_eq!(adjust(&app, &operator, current).await["inventory"]["version"], 2);
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_and_customers_are_refused_and_write_nothing() {
    let app = TestApp::spawn().await;
    let operator = app.operator();
    let customer = app.token("alice", Role::Customer);
    let item = stocked(&app, "ADJ-BAD", 5).await;
    let before = untouched(&app).await;
    let bad = [
        (json!({ "inventoryId": item, "delta": 1, "countedOnHand": 6, "reason": "OTHER" }), "input.countedOnHand"),
        (json!({ "inventoryId": item, "reason": "OTHER" }), "input.delta"),
        (json!({ "inventoryId": item, "delta": 0, "reason": "OTHER" }), "input.delta"),
        (json!({ "inventoryId": item, "delta": -1_000_000_001, "reason": "OTHER" }), "input.delta"),
        (json!({ "inventoryId": item, "countedOnHand": -1, "reason": "CYCLE_COUNT" }), "input.countedOnHand"),
        (json!({ "inventoryId": item, "delta": 1, "reason": "OTHER", "note": "x".repeat(501) }), "input.note"),
        (json!({ "inventoryId": item, "delta": 1, "reason": "OTHER", "idempotencyKey": "" }), "input.idempotencyKey"),
    ];
    for (input, field) in bad {
        let body = adjust(&app, &operator, input.clone()).await;
        assert_eq!(error_code(&body), Some("BAD_USER_INPUT"), "{input}: {body}");
        assert_eq!(body["errors"][0]["extensions"]["field"], field, "{input}: {body}");
    }
    // Past the largest storable amount is bad input too, and writes nothing.
    let by = |delta: i32| json!({ "inventoryId": item, "delta": delta, "reason": "CORRECTION" });
    for _ in 0..2 {
        assert_eq!(adjust(&app, &operator, by(1_000_000_000)).await["__typename"], "StockAdjusted");
    }
    let near = untouched(&app).await;
    let past = adjust(&app, &operator, by(1_000_000_000)).await;
    assert_eq!(error_code(&past), Some("BAD_USER_INPUT"), "{past}");
    assert_eq!(untouched(&app).await, near, "nothing written");
    for _ in 0..2 {
        assert_eq!(adjust(&app, &operator, by(-1_000_000_000)).await["__typename"], "StockAdjusted");
    }
    assert_eq!(untouched(&app).await.1, before.1, "the level is as it was");

    let before = untouched(&app).await;
    for quantity in [-1, 1_000_000_001] {
        let body = set_safety(&app, &operator, json!({ "inventoryId": item, "quantity": quantity })).await;
        assert_eq!(error_code(&body), Some("BAD_USER_INPUT"), "{quantity}: {body}");
    }
    let asked = adjust(&app, &customer, json!({ "inventoryId": item, "delta": -1, "reason": "SHRINKAGE" })).await;
    assert_eq!(error_code(&asked), Some("FORBIDDEN"), "{asked}");
    let asked = set_safety(&app, &customer, json!({ "inventoryId": item, "quantity": 0 })).await;
    assert_eq!(error_code(&asked), Some("FORBIDDEN"), "{asked}");
    let asked = reserve(&app, &customer, json!({ "inventoryId": item, "quantity": 1, "useSafetyStock": true })).await;
    assert_eq!(error_code(&asked), Some("FORBIDDEN"), "a customer may not take safety stock: {asked}");
    assert_eq!(untouched(&app).await, before, "nothing written");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn no_customer_path_takes_safety_stock_and_an_operator_asking_to_may() {
    let app = TestApp::spawn().await;
    let (operator, alice) = (app.operator(), app.token("alice", Role::Customer));
    let item = stocked(&app, "SAFE-ONE", 10).await;
    let (_, version) = app.stock_and_version(item).await;
    let ledger = app.count("SELECT count(*) FROM stock_movements").await;
    let level = set_safety(&app, &operator, json!({ "inventoryId": item, "quantity": 4 })).await;
    assert_eq!(
        (&level["location"]["code"], &level["safetyStock"], &level["sellable"]),
        (&json!("default"), &json!(4), &json!(6))
    );
    assert_eq!(app.stock_and_version(item).await, (10, version), "no unit moves, no version");
    assert_eq!(app.count("SELECT count(*) FROM stock_movements").await, ledger, "no ledger row");
    let states = safety_states(&app, item).await;
    assert_eq!((&states["safetyStock"], &states["sellable"], &states["available"]), (&json!(4), &json!(6), &json!(10)));

    let refused = reserve(&app, &alice, json!({ "inventoryId": item, "quantity": 7 })).await;
    assert_eq!((&refused["__typename"], &refused["available"]), (&json!("SoldOut"), &json!(6)), "{refused}");
    let five = reserve(&app, &alice, json!({ "inventoryId": item, "quantity": 5 })).await;
    assert_eq!(five["__typename"], "Reserved", "{five}");
    let more = change_quantity(&app, &alice, uuid(&five["reservation"]["id"]), 7).await;
    assert_eq!(
        (&more["__typename"], &more["requested"], &more["available"]),
        (&json!("SoldOut"), &json!(2), &json!(1))
    );
    let last = reserve(&app, &alice, json!({ "inventoryId": item, "quantity": 1 })).await;
    assert_eq!(last["__typename"], "Reserved", "the last sellable unit: {last}");
    let many = reserve_many(&app, &alice, json!([{ "inventoryId": item, "quantity": 1 }])).await;
    assert_eq!(many["items"], json!([{ "inventoryId": item, "reason": "SOLD_OUT", "available": 0 }]), "{many}");
    let order = place_order(&app, &alice, json!([{ "inventoryId": item, "quantity": 1 }])).await;
    assert_eq!(order["items"], json!([{ "inventoryId": item, "reason": "SOLD_OUT", "available": 0 }]), "{order}");
    let by_location = json!({ "inventoryId": item, "quantity": 1, "locationIds": [default_location(&app).await] });
    assert_eq!(reserve(&app, &alice, by_location).await["available"], 0);
    let plain = reserve(&app, &operator, json!({ "inventoryId": item, "quantity": 1 })).await;
    assert_eq!(plain["__typename"], "SoldOut", "an operator not asking keeps it too: {plain}");

    let taken = reserve(&app, &operator, json!({ "inventoryId": item, "quantity": 3, "useSafetyStock": true })).await;
    assert_eq!(taken["__typename"], "Reserved", "{taken}");
    let too_many =
        reserve(&app, &operator, json!({ "inventoryId": item, "quantity": 2, "useSafetyStock": true })).await;
    assert_eq!((&too_many["__typename"], &too_many["available"]), (&json!("SoldOut"), &json!(1)), "all it may take");
    let states = safety_states(&app, item).await;
    assert_eq!((&states["available"], &states["sellable"], &states["reserved"]), (&json!(1), &json!(0), &json!(9)));

    let unknown = set_safety(&app, &operator, json!({ "inventoryId": Uuid::new_v4(), "quantity": 1 })).await;
    assert_eq!(unknown, Value::Null);
    let nowhere =
        set_safety(&app, &operator, json!({ "inventoryId": item, "locationId": Uuid::new_v4(), "quantity": 1 })).await;
    assert_eq!(nowhere, Value::Null);
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn safety_stock_is_kept_per_level_when_stock_is_in_several_places() {
    let app = TestApp::spawn().await;
    let (operator, alice) = (app.operator(), app.token("alice", Role::Customer));
    let item = stocked(&app, "SAFE-SPREAD", 10).await;
    let (default, b) = (default_location(&app).await, create_location(&app, "b", 10).await);
    let moved = json!({ "inventoryId": item, "fromLocationId": default, "toLocationId": b, "quantity": 5 });
    assert_eq!(transfer(&app, &operator, moved).await["__typename"], "StockTransferred");
    set_safety(&app, &operator, json!({ "inventoryId": item, "quantity": 4 })).await;
    let at_b = set_safety(&app, &operator, json!({ "inventoryId": item, "locationId": b, "quantity": 1 })).await;
    assert_eq!((&at_b["safetyStock"], &at_b["sellable"]), (&json!(1), &json!(4)));
    // A location that never held it keeps its safety stock for the first units there.
    let c = create_location(&app, "c", 20).await;
    let at_c = set_safety(&app, &operator, json!({ "inventoryId": item, "locationId": c, "quantity": 2 })).await;
    assert_eq!((&at_c["available"], &at_c["safetyStock"], &at_c["sellable"]), (&json!(0), &json!(2), &json!(0)));
    let states = safety_states(&app, item).await;
    assert_eq!((&states["safetyStock"], &states["sellable"]), (&json!(7), &json!(5)), "{states}");

    let split = reserve(&app, &alice, json!({ "inventoryId": item, "quantity": 5 })).await;
    let allocations = &split["reservation"]["allocations"];
    assert_eq!(
        *allocations,
        json!([{ "location": { "code": "default" }, "quantity": 1 }, { "location": { "code": "b" }, "quantity": 4 }])
    );
    let none = reserve(&app, &alice, json!({ "inventoryId": item, "quantity": 1, "allowSplit": false })).await;
    assert_eq!((&none["__typename"], &none["available"]), (&json!("SoldOut"), &json!(0)), "{none}");
    let restocked = app.restock(&operator, json!({ "inventoryId": item, "quantity": 3, "locationId": c })).await;
    assert_eq!(restocked["__typename"], "Restocked");
    let from_c = reserve(&app, &alice, json!({ "inventoryId": item, "quantity": 1 })).await;
    assert_eq!(
        from_c["reservation"]["allocations"],
        json!([{ "location": { "code": "c" }, "quantity": 1 }]),
        "{from_c}"
    );
    let operator_takes =
        reserve(&app, &operator, json!({ "inventoryId": item, "quantity": 6, "useSafetyStock": true })).await;
    assert_eq!(operator_takes["__typename"], "Reserved", "{operator_takes}");
    assert_eq!(safety_states(&app, item).await["available"], 1);
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn adjustments_keep_the_check_clean_and_a_drift_of_one_is_reported() {
    let app = TestApp::spawn().await;
    let operator = app.operator();
    let item = stocked(&app, "ADJ-CHECK", 20).await;
    let b = create_location(&app, "b", 10).await;
    let changes = [
        json!({ "inventoryId": item, "delta": -3, "reason": "SHRINKAGE" }),
        json!({ "inventoryId": item, "locationId": b, "delta": 6, "reason": "FOUND" }),
        json!({ "inventoryId": item, "countedOnHand": 15, "reason": "CYCLE_COUNT" }),
        json!({ "inventoryId": item, "locationId": b, "delta": -1, "reason": "RETURN_TO_SUPPLIER" }),
    ];
    for input in changes {
        assert_eq!(adjust(&app, &operator, input.clone()).await["__typename"], "StockAdjusted", "{input}");
    }
    reserve(&app, &app.token("alice", Role::Customer), json!({ "inventoryId": item, "quantity": 4 })).await;
    assert_eq!(levels_of(&app, item).await, vec![("default".into(), 11), ("b".into(), 5)]);
    assert_eq!(invariant::check(&app.db).await.expect("check"), vec![], "adjusted units are counted");

    // One unit more in the ledger than at the level: the level and the inventory drift.
    let tamper = format!(
        "UPDATE stock_movements SET delta = delta + 1 \
          WHERE inventory_id = '{item}' AND reason = 'ADJUSTED' AND location_id = '{b}' AND delta = 6"
    );
    app.db.execute_unprepared(&tamper).await.expect("tamper with the ledger");
    let drifts = invariant::check(&app.db).await.expect("check");
    let level = drifts.iter().find_map(|d| match d {
        invariant::Drift::Level(level) => Some(level),
        _ => None,
    });
    let level = level.unwrap_or_else(|| panic!("a level drift: {drifts:?}"));
    assert_eq!(
        (level.location_id, level.available, level.on_hand, level.ledger_stock),
        (b, Some(5), 6, 6),
        "{drifts:?}"
    );
    let inventory = drifts.iter().find_map(|d| match d {
        invariant::Drift::Inventory(inventory) => Some(inventory),
        _ => None,
    });
    let inventory = inventory.unwrap_or_else(|| panic!("an inventory drift: {drifts:?}"));
    assert_eq!((inventory.id, inventory.stock, inventory.ledger_stock, inventory.received), (item, 16, 17, 21));
}
