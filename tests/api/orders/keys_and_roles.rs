//! Idempotent placeOrder, who may act on which order, and bad order input.

use super::*;

pub(super) async fn ten_repeats_of_one_keyed_place_order_place_one_order(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let item = app.create_inventory("PLACE-1", 20).await;
    let alice = app.token("alice", Role::Customer);
    let input = json!({
        "items": [{ "inventoryId": item, "quantity": 2 }],
        "shippingAddress": address("1 Main Street"),
        "idempotencyKey": "place-1",
    });
    let requests = (0..10)
        .map(|_| {
            let (app, token, input) = (app.clone(), alice.clone(), input.clone());
            async move { named(app.place_order(&token, input).await) }.boxed()
        })
        .collect();
    let results = at_once(requests).await;
    assert_eq!(count(&results, "OrderPlaced"), 10, "every repeat gets the first outcome: {results:?}");
    let ids: HashSet<Uuid> = results.iter().map(|(_, r)| uuid(&r["order"]["id"])).collect();
    assert_eq!(ids.len(), 1, "one order for every repeat: {ids:?}");

    assert_eq!(app.stock_and_version(item).await, (18, 2), "stock taken once");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 1);
    app.assert_invariant().await;
}

at_every_isolation! { ten_repeats_of_one_keyed_place_order_place_one_order; }

#[tokio::test(flavor = "multi_thread")]
async fn a_place_order_key_reused_for_other_items_is_refused_and_writes_nothing() {
    let app = TestApp::spawn().await;
    let (x, y) = (app.create_inventory("REUSE-X", 20).await, app.create_inventory("REUSE-Y", 20).await);
    let alice = app.token("alice", Role::Customer);
    let input = |items: Value| json!({ "items": items, "shippingAddress": address("1 Main Street"), "idempotencyKey": "place-2" });
    let (name, first) = named(app.place_order(&alice, input(json!([{ "inventoryId": x, "quantity": 1 }]))).await);
    assert_eq!(name, "OrderPlaced", "{first}");
    let snapshot = app.snapshot().await;

    for items in [
        json!([{ "inventoryId": x, "quantity": 2 }]),
        json!([{ "inventoryId": y, "quantity": 1 }]),
        json!([{ "inventoryId": x, "quantity": 1 }, { "inventoryId": y, "quantity": 1 }]),
    ] {
        let (name, body) = named(app.place_order(&alice, input(items.clone())).await);
        assert_eq!(name, "ERROR", "{items}: {body}");
        assert_eq!(error_code(&body), Some("IDEMPOTENCY_KEY_REUSED"), "{items}: {body}");
    }
    assert_eq!(app.snapshot().await, snapshot, "nothing written");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);

    // The same request still replays the first order.
    let (name, replay) = named(app.place_order(&alice, input(json!([{ "inventoryId": x, "quantity": 1 }]))).await);
    assert_eq!(name, "OrderPlaced", "{replay}");
    assert_eq!(replay["order"]["id"], first["order"]["id"]);
    assert_eq!(app.snapshot().await, snapshot);
    app.assert_invariant().await;
}

// ---------- 8. who may do what ----------

#[tokio::test(flavor = "multi_thread")]
async fn customers_may_not_confirm_and_cannot_touch_other_customers_orders() {
    let app = TestApp::spawn().await;
    let item = app.create_inventory("WHO-1", 10).await;
    let (alice, bob) = (app.token("alice", Role::Customer), app.token("bob", Role::Customer));
    let id = new_order(&app, &alice, item, 1).await;
    let before = order_state(&app, id).await;
    let snapshot = app.snapshot().await;

    for token in [&alice, &bob] {
        let (name, body) = named(app.confirm(token, id).await);
        assert_eq!(name, "ERROR", "{body}");
        assert_eq!(error_code(&body), Some("FORBIDDEN"), "{body}");
    }
    let read = app.graphql(Some(&bob), ORDER, json!({ "id": id })).await;
    assert!(read.get("errors").is_none() && read["data"]["order"].is_null(), "alice's order reads as absent: {read}");
    let (name, result) = named(app.cancel(&bob, id).await);
    assert_eq!((name.as_str(), &result["orderId"]), ("OrderNotFound", &json!(id)), "{result}");
    let (name, result) = named(app.change_address(&bob, id, 1, &address("6 Thief Street")).await);
    assert_eq!((name.as_str(), &result["orderId"]), ("OrderNotFound", &json!(id)), "{result}");
    let anonymous = app.graphql(None, ORDER, json!({ "id": id })).await;
    assert_eq!(error_code(&anonymous), Some("UNAUTHENTICATED"), "{anonymous}");

    assert_eq!(order_state(&app, id).await, before, "nothing written");
    assert_eq!(app.snapshot().await, snapshot);
    // The owner and an operator do see it.
    for token in [&alice, &app.operator()] {
        let read = app.graphql(Some(token), ORDER, json!({ "id": id })).await;
        assert_eq!(read["data"]["order"]["userId"], "alice", "{read}");
    }
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn customers_list_only_their_own_orders_and_operators_list_all() {
    let app = TestApp::spawn().await;
    let item = app.create_inventory("LIST-1", 10).await;
    let (alice, bob, operator) = (app.token("alice", Role::Customer), app.token("bob", Role::Customer), app.operator());
    let alice_pending = new_order(&app, &alice, item, 1).await;
    let alice_cancelled = new_order(&app, &alice, item, 1).await;
    assert_eq!(named(app.cancel(&alice, alice_cancelled).await).0, "OrderCancelled");
    let bob_pending = new_order(&app, &bob, item, 1).await;

    let listed = |token: String, status: Value| {
        let app = &app;
        async move {
            let body = app.graphql(Some(&token), ORDERS, json!({ "status": status })).await;
            let nodes = body["data"]["orders"]["nodes"].as_array().unwrap_or_else(|| panic!("{body}")).clone();
            nodes.iter().map(|n| uuid(&n["id"])).collect::<BTreeSet<Uuid>>()
        }
    };
    assert_eq!(listed(alice.clone(), json!("PENDING")).await, BTreeSet::from([alice_pending]));
    assert_eq!(listed(alice.clone(), Value::Null).await, BTreeSet::from([alice_pending, alice_cancelled]));
    assert_eq!(listed(alice, json!("CANCELLED")).await, BTreeSet::from([alice_cancelled]));
    assert_eq!(listed(bob.clone(), json!("PENDING")).await, BTreeSet::from([bob_pending]));
    assert_eq!(listed(bob, json!("CANCELLED")).await, BTreeSet::new());
    assert_eq!(listed(operator.clone(), json!("PENDING")).await, BTreeSet::from([alice_pending, bob_pending]));
    assert_eq!(listed(operator, Value::Null).await, BTreeSet::from([alice_pending, alice_cancelled, bob_pending]));
    app.assert_invariant().await;
}

// ---------- 9. bad input ----------

#[tokio::test(flavor = "multi_thread")]
async fn bad_order_input_is_refused_and_writes_nothing() {
    let app = TestApp::spawn().await;
    let (x, y) = (app.create_inventory("BADORDER-X", 10).await, app.create_inventory("BADORDER-Y", 10).await);
    let alice = app.token("alice", Role::Customer);
    let existing = new_order(&app, &alice, x, 1).await;
    let before = order_state(&app, existing).await;
    let snapshot = app.snapshot().await;
    let line = |quantity: i32| json!({ "inventoryId": x, "quantity": quantity });
    let with_name = |name: &str| {
        let mut to = address("1 Main Street");
        to["name"] = json!(name);
        to
    };

    let cases = [
        ("no items", json!({ "items": [], "shippingAddress": address("1 Main Street") })),
        ("quantity 0", json!({ "items": [line(0)], "shippingAddress": address("1 Main Street") })),
        ("quantity above the maximum", json!({ "items": [line(1001)], "shippingAddress": address("1 Main Street") })),
        (
            "a bad line beside a good one",
            json!({ "items": [{ "inventoryId": y, "quantity": 1 }, line(-1)], "shippingAddress": address("1 Main Street") }),
        ),
        ("an empty name", json!({ "items": [line(1)], "shippingAddress": with_name("") })),
        ("a blank name", json!({ "items": [line(1)], "shippingAddress": with_name("   ") })),
        (
            "a blank idempotency key",
            json!({ "items": [line(1)], "shippingAddress": address("1 Main Street"), "idempotencyKey": "  " }),
        ),
        (
            "two versions of one inventory",
            json!({
                "items": [
                    { "inventoryId": x, "quantity": 1, "expectedVersion": 2 },
                    { "inventoryId": x, "quantity": 1, "expectedVersion": 3 },
                ],
                "shippingAddress": address("1 Main Street"),
            }),
        ),
    ];
    for (what, input) in cases {
        let (name, body) = named(app.place_order(&alice, input).await);
        assert_eq!(name, "ERROR", "{what}: {body}");
        assert_eq!(error_code(&body), Some("BAD_USER_INPUT"), "{what}: {body}");
        assert!(body["data"].is_null(), "{what}: no data for a refused mutation: {body}");
        assert_eq!(app.snapshot().await, snapshot, "{what} wrote nothing");
    }

    // The same rules hold for reserveMany and for a new address.
    let items = json!([
        { "inventoryId": y, "quantity": 1, "expectedVersion": 1 },
        { "inventoryId": y, "quantity": 1, "expectedVersion": 2 },
    ]);
    let (name, body) = named(app.reserve_many(&alice, items).await);
    assert_eq!((name.as_str(), error_code(&body)), ("ERROR", Some("BAD_USER_INPUT")), "{body}");
    let (name, body) = named(app.change_address(&alice, existing, 1, &with_name(" ")).await);
    assert_eq!((name.as_str(), error_code(&body)), ("ERROR", Some("BAD_USER_INPUT")), "{body}");

    assert_eq!(app.snapshot().await, snapshot);
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
    assert_eq!(order_state(&app, existing).await, before);
    app.assert_invariant().await;
}
