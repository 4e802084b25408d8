//! reserveMany over opposite lines, and shipping address changes against
//! stale versions and finished orders.

use super::*;

/// 100 requests for one unit each of X and Y (60 in stock each), half naming
/// them X then Y and half Y then X, all released by one barrier.
pub(super) async fn opposite_reserve_many_requests_never_deadlock_or_oversell(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let (x, y) = (app.create_inventory("PAIR-X", 60).await, app.create_inventory("PAIR-Y", 60).await);
    let requests = (0..100)
        .map(|i| {
            let app = app.clone();
            let token = app.token(&format!("user-{i}"), Role::Customer);
            let (first, second) = if i % 2 == 0 { (x, y) } else { (y, x) };
            let items = json!([{ "inventoryId": first, "quantity": 1 }, { "inventoryId": second, "quantity": 1 }]);
            async move { named(app.reserve_many(&token, items).await) }.boxed()
        })
        .collect();
    let results = at_once(requests).await;

    let granted = count(&results, "ReservedAll");
    assert_eq!(granted + count(&results, "ItemsUnavailable"), 100, "no errors: {:?}", names(&results));
    assert!(granted <= 60, "never more than the stock: {granted}");
    let mut returned_ids = HashSet::new();
    for (name, result) in &results {
        if name == "ReservedAll" {
            let reservations = result["reservations"].as_array().expect("reservations");
            let inventories: BTreeSet<Uuid> = reservations.iter().map(|r| uuid(&r["inventory"]["id"])).collect();
            assert_eq!(inventories, BTreeSet::from([x, y]), "{result}");
            assert_eq!(reservations.len(), 2, "{result}");
            for reservation in reservations {
                assert_eq!((&reservation["quantity"], &reservation["status"]), (&json!(1), &json!("ACTIVE")));
                returned_ids.insert(uuid(&reservation["id"]));
            }
        } else {
            let items = result["items"].as_array().expect("items");
            assert!(!items.is_empty(), "a refusal says which line failed: {result}");
            for item in items {
                assert!([x, y].contains(&uuid(&item["inventoryId"])), "{result}");
                match item["reason"].as_str() {
                    // Stock only ever falls here, so sold out means none left.
                    Some("SOLD_OUT") => assert_eq!(item["inventory"]["stock"], 0, "{result}"),
                    // No expectedVersion was given: only an exhausted collision retry may say CONFLICT.
                    Some("CONFLICT") => {
                        assert!(
                            !matches!(isolation, Isolation::ReadCommitted),
                            "no CONFLICT at read committed: {result}"
                        )
                    }
                    _ => panic!("unexpected reason: {result}"),
                }
            }
        }
    }
    if matches!(isolation, Isolation::ReadCommitted) {
        assert_eq!(granted, 60, "at read committed nobody is refused while stock is left: {:?}", names(&results));
    }

    let taken = i32::try_from(granted).expect("small");
    assert_eq!(app.stock_and_version(x).await.0, 60 - taken, "X lost exactly one unit per ReservedAll");
    assert_eq!(app.stock_and_version(y).await.0, 60 - taken, "Y lost exactly one unit per ReservedAll");
    let stored = app.rows("SELECT id, inventory_id, quantity, status FROM reservations").await;
    assert_eq!(stored.len(), 2 * granted, "two reservations per ReservedAll, none for a refusal");
    assert!(stored.iter().all(|r| r["quantity"] == 1 && r["status"] == "ACTIVE"), "{stored:?}");
    let stored_ids: HashSet<Uuid> = stored.iter().map(|r| uuid(&r["id"])).collect();
    assert_eq!(stored_ids, returned_ids, "the reservations returned are the ones stored");
    for id in [x, y] {
        let held = app.count(&format!("SELECT count(*) FROM reservations WHERE inventory_id = '{id}'")).await;
        assert_eq!(held, i64::from(taken));
    }
    app.assert_invariant().await;
}

at_every_isolation! { opposite_reserve_many_requests_never_deadlock_or_oversell; }

#[tokio::test(flavor = "multi_thread")]
async fn reserve_many_lists_only_the_lines_it_cannot_serve_and_takes_nothing() {
    let app = TestApp::spawn().await;
    let (x, y) = (app.create_inventory("MANY-X", 5).await, app.create_inventory("MANY-Y", 5).await);
    let alice = app.token("alice", Role::Customer);
    let before = app.snapshot().await;
    let missing = Uuid::new_v4();

    let cases = [
        // One line above the stock.
        (
            json!([{ "inventoryId": x, "quantity": 1 }, { "inventoryId": y, "quantity": 6 }]),
            json!([{ "inventoryId": y, "reason": "SOLD_OUT", "inventory": { "id": y, "stock": 5, "version": 1 } }]),
        ),
        // Two lines of one inventory, each servable alone, merged into one that is not.
        (
            json!([{ "inventoryId": x, "quantity": 3 }, { "inventoryId": x, "quantity": 3 }]),
            json!([{ "inventoryId": x, "reason": "SOLD_OUT", "inventory": { "id": x, "stock": 5, "version": 1 } }]),
        ),
        // A stale screen.
        (
            json!([{ "inventoryId": x, "quantity": 1, "expectedVersion": 7 }, { "inventoryId": y, "quantity": 1 }]),
            json!([{ "inventoryId": x, "reason": "CONFLICT", "inventory": { "id": x, "stock": 5, "version": 1 } }]),
        ),
        // An inventory that does not exist.
        (
            json!([{ "inventoryId": x, "quantity": 1 }, { "inventoryId": missing, "quantity": 1 }]),
            json!([{ "inventoryId": missing, "reason": "NOT_FOUND", "inventory": null }]),
        ),
    ];
    for (items, expected) in cases {
        let (name, result) = named(app.reserve_many(&alice, items.clone()).await);
        assert_eq!(name, "ItemsUnavailable", "{items}: {result}");
        assert_eq!(result["items"], expected, "{items}");
        assert_eq!(app.snapshot().await, before, "{items} took nothing");
    }

    // Merged lines that fit are granted together.
    let items = json!([
        { "inventoryId": x, "quantity": 2, "expectedVersion": 1 },
        { "inventoryId": y, "quantity": 1 },
        { "inventoryId": x, "quantity": 2, "expectedVersion": 1 },
    ]);
    let (name, result) = named(app.reserve_many(&alice, items).await);
    assert_eq!(name, "ReservedAll", "{result}");
    assert_eq!(app.stock_and_version(x).await.0, 1);
    assert_eq!(app.stock_and_version(y).await.0, 4);
    let held = |id: Uuid| {
        format!("SELECT sum(quantity)::bigint FROM reservations WHERE inventory_id = '{id}' AND status = 'ACTIVE'")
    };
    assert_eq!(app.count(&held(x)).await, 4);
    assert_eq!(app.count(&held(y)).await, 1);
    app.assert_invariant().await;
}

// ---------- 3. changing the shipping address ----------

pub(super) async fn a_stale_address_change_returns_the_current_order_and_writes_nothing(isolation: Isolation) {
    let app = TestApp::spawn_with(isolation).await;
    let item = app.create_inventory("ADDR-1", 10).await;
    let alice = app.token("alice", Role::Customer);
    let id = new_order(&app, &alice, item, 1).await;
    let (first, second) = (address("2 First Avenue"), address("3 Second Road"));

    let (name, changed) = named(app.change_address(&alice, id, 1, &first).await);
    assert_eq!(name, "ShippingAddressChanged", "{changed}");
    assert_eq!(changed["order"]["version"], 2);
    assert_eq!(changed["order"]["shippingAddress"], first);
    let after_first = order_state(&app, id).await;
    let snapshot = app.snapshot().await;

    // A second screen that also saw version 1.
    let (name, conflict) = named(app.change_address(&alice, id, 1, &second).await);
    assert_eq!(name, "OrderVersionConflict", "{conflict}");
    assert_eq!(conflict["expectedVersion"], 1);
    assert_eq!(conflict["current"]["id"], id.to_string());
    assert_eq!(conflict["current"]["version"], 2);
    assert_eq!(conflict["current"]["shippingAddress"], first, "the current address, to show beside the typed one");
    assert_eq!(conflict["submitted"], second);

    let stored = order_row(&app, id).await;
    assert_eq!(stored["version"], 2);
    let stored_text = stored.to_string();
    assert!(stored_text.contains("2 First Avenue") && !stored_text.contains("3 Second Road"), "{stored}");
    assert_eq!(order_state(&app, id).await, after_first, "nothing written");
    assert_eq!(app.snapshot().await, snapshot);
    app.assert_invariant().await;
}

at_every_isolation! { a_stale_address_change_returns_the_current_order_and_writes_nothing; }

#[tokio::test(flavor = "multi_thread")]
async fn cancelled_and_confirmed_orders_are_not_editable() {
    let app = TestApp::spawn().await;
    let item = app.create_inventory("EDIT-1", 10).await;
    let alice = app.token("alice", Role::Customer);

    let cancelled = new_order(&app, &alice, item, 1).await;
    assert_eq!(named(app.cancel(&alice, cancelled).await).0, "OrderCancelled");
    let confirmed = new_order(&app, &alice, item, 1).await;
    assert_eq!(named(app.confirm(&app.operator(), confirmed).await).0, "OrderConfirmed");

    for (id, status) in [(cancelled, "CANCELLED"), (confirmed, "CONFIRMED")] {
        let before = order_state(&app, id).await;
        let snapshot = app.snapshot().await;
        // The current version, so only the status stands in the way.
        let (name, result) = named(app.change_address(&alice, id, 2, &address("9 Late Lane")).await);
        assert_eq!(name, "OrderNotEditable", "{result}");
        assert_eq!(result["order"]["status"], status);
        assert_eq!(result["order"]["version"], 2);
        assert_eq!(order_state(&app, id).await, before, "nothing written");
        assert_eq!(app.snapshot().await, snapshot);
    }
    app.assert_invariant().await;
}
