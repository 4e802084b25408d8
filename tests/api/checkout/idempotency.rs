//! Checkout replays and the one key space it shares with reserve and placeOrder.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_checkout_replay_returns_the_first_order() {
    let app = TestApp::spawn().await;
    let (x, y) = (app.create_inventory("REPLAY-X", 10).await, app.create_inventory("REPLAY-Y", 10).await);
    let alice = app.token("alice", Role::Customer);
    let ids = cart(&app, &alice, &[(x, 1), (y, 2)]).await;
    let (name, first) = named(app.checkout(&alice, checkout_of(&ids, Some("cart-1"))).await);
    assert_eq!(name, "OrderPlaced", "{first}");
    let snapshot = app.snapshot().await;

    // The same request, its ids in another order: the first order, nothing written.
    let reversed: Vec<Uuid> = ids.iter().rev().copied().collect();
    let (name, replay) = named(app.checkout(&alice, checkout_of(&reversed, Some("cart-1"))).await);
    assert_eq!(name, "OrderPlaced", "{replay}");
    assert_eq!(replay["order"]["id"], first["order"]["id"]);
    assert_eq!(app.snapshot().await, snapshot);
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
    // Still the first order once it has moved on, as it is now.
    let id = uuid(&first["order"]["id"]);
    assert_eq!(named(app.confirm(&app.operator(), id).await).0, "OrderConfirmed");
    let (_, replay) = named(app.checkout(&alice, checkout_of(&ids, Some("cart-1"))).await);
    assert_eq!((&replay["order"]["id"], &replay["order"]["status"]), (&json!(id), &json!("CONFIRMED")));

    // The key with another cart or another address is a reuse.
    let other = cart(&app, &alice, &[(x, 1)]).await;
    let mut elsewhere = checkout_of(&ids, Some("cart-1"));
    elsewhere["shippingAddress"] = address("2 Other Road");
    for (what, input) in [("another cart", checkout_of(&other, Some("cart-1"))), ("another address", elsewhere)] {
        let body = app.checkout(&alice, input).await;
        assert_eq!(error_code(&body), Some("IDEMPOTENCY_KEY_REUSED"), "{what}: {body}");
    }
    // Another user's key space is their own.
    let bob = app.token("bob", Role::Customer);
    let bobs = cart(&app, &bob, &[(y, 1)]).await;
    assert_eq!(named(app.checkout(&bob, checkout_of(&bobs, Some("cart-1"))).await).0, "OrderPlaced");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reserve_place_order_and_checkout_share_one_key_space() {
    let app = TestApp::spawn().await;
    let item = app.create_inventory("KEYSPACE-1", 10).await;
    let alice = app.token("alice", Role::Customer);
    let ids = cart(&app, &alice, &[(item, 1)]).await;
    assert_eq!(named(app.checkout(&alice, checkout_of(&ids, Some("shared"))).await).0, "OrderPlaced");
    let reserved = app.reserve(&alice, json!({ "inventoryId": item, "idempotencyKey": "reserved" })).await;
    assert_eq!(reserved["__typename"], "Reserved", "{reserved}");
    let snapshot = app.snapshot().await;

    // A checkout's key is refused for a reservation or an order, and back.
    let reserve = app.reserve(&alice, json!({ "inventoryId": item, "idempotencyKey": "shared" })).await;
    assert_eq!(error_code(&reserve), Some("IDEMPOTENCY_KEY_REUSED"), "{reserve}");
    let items = json!([{ "inventoryId": item, "quantity": 1 }]);
    let input = json!({ "items": items, "shippingAddress": address("1 Cart Street"), "idempotencyKey": "shared" });
    let placed = app.place_order(&alice, input).await;
    assert_eq!(error_code(&placed), Some("IDEMPOTENCY_KEY_REUSED"), "{placed}");
    let rid = uuid(&reserved["reservation"]["id"]);
    let checkout = app.checkout(&alice, checkout_of(&[rid], Some("reserved"))).await;
    assert_eq!(error_code(&checkout), Some("IDEMPOTENCY_KEY_REUSED"), "{checkout}");
    assert_eq!(app.snapshot().await, snapshot, "nothing written");
    app.assert_invariant().await;
}

pub(super) async fn ten_repeats_of_one_keyed_checkout_place_one_order(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let (x, y) = (app.create_inventory("REPEAT-X", 10).await, app.create_inventory("REPEAT-Y", 10).await);
    let alice = app.token("alice", Role::Customer);
    let ids = cart(&app, &alice, &[(x, 2), (y, 1)]).await;
    let before = (app.stock_and_version(x).await, app.stock_and_version(y).await);
    let requests = (0..10)
        .map(|_| {
            let (app, token, input) = (app.clone(), alice.clone(), checkout_of(&ids, Some("double-submit")));
            async move { named(app.checkout(&token, input).await) }.boxed()
        })
        .collect();
    let results = at_once(requests).await;
    assert_eq!(count(&results, "OrderPlaced"), 10, "every repeat gets the first order: {:?}", names(&results));
    let orders: std::collections::HashSet<&Value> = results.iter().map(|(_, r)| &r["order"]["id"]).collect();
    assert_eq!(orders.len(), 1, "one order: {orders:?}");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
    assert_eq!((app.stock_and_version(x).await, app.stock_and_version(y).await), before, "no stock moved");
    app.assert_invariant().await;
}
