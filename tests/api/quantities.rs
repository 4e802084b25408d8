//! Changing a held quantity: the difference taken with the conditional
//! decrement or given back, one change and one ledger row each; what cannot
//! be changed; concurrent changes of one line and of one inventory, exact at
//! every isolation level.

use std::sync::Arc;

use futures::future::FutureExt;
use serde_json::json;
use stockguard::auth::Role;
use uuid::Uuid;

use crate::helpers::{Isolation, TestApp, at_every_isolation, at_once, count, error_code, named, names, uuid};

/// Reserves `quantity` of `inventory` for `token`; the reservation's id.
async fn hold(app: &TestApp, token: &str, inventory: Uuid, quantity: i32) -> Uuid {
    let reserved = app.reserve(token, json!({ "inventoryId": inventory, "quantity": quantity })).await;
    assert_eq!(reserved["__typename"], "Reserved", "{reserved}");
    uuid(&reserved["reservation"]["id"])
}

/// The quantity stored for reservation `id`.
async fn held(app: &TestApp, id: Uuid) -> i64 {
    app.count(&format!("SELECT quantity::bigint FROM reservations WHERE id = '{id}'")).await
}

/// The QUANTITY_CHANGED ledger rows of reservation `id`: `(delta, stock_after, version_after)`.
async fn changes(app: &TestApp, id: Uuid) -> Vec<(i64, i64, i64)> {
    app.rows(&format!(
        "SELECT delta, stock_after, version_after FROM stock_movements \
         WHERE reason = 'QUANTITY_CHANGED' AND reservation_id = '{id}' ORDER BY version_after"
    ))
    .await
    .iter()
    .map(|r| {
        let n = |c: &str| r[c].as_i64().expect("number");
        (n("delta"), n("stock_after"), n("version_after"))
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_quantity_grows_by_taking_the_difference_and_shrinks_by_giving_it_back() {
    let app = TestApp::spawn().await;
    let item = app.create_inventory("RESIZE-1", 10).await;
    let alice = app.token("alice", Role::Customer);
    let id = hold(&app, &alice, item, 2).await;

    let (name, grown) = named(app.change_quantity(&alice, id, 5).await);
    assert_eq!(name, "ReservationChanged", "{grown}");
    assert_eq!((&grown["reservation"]["quantity"], &grown["reservation"]["status"]), (&json!(5), &json!("ACTIVE")));
    assert_eq!((&grown["inventory"]["stock"], &grown["inventory"]["version"]), (&json!(5), &json!(3)));
    assert_eq!(app.states(item).await, [5, 5, 0, 10]);

    let (name, shrunk) = named(app.change_quantity(&alice, id, 1).await);
    assert_eq!(name, "ReservationChanged", "{shrunk}");
    assert_eq!((&shrunk["inventory"]["stock"], &shrunk["inventory"]["version"]), (&json!(9), &json!(4)));
    assert_eq!(changes(&app, id).await, [(-3, 5, 3), (4, 9, 4)], "one ledger row per change, the signed delta");

    // Already at that quantity: nothing to change, nothing written.
    let snapshot = app.snapshot().await;
    let (name, same) = named(app.change_quantity(&alice, id, 1).await);
    assert_eq!((name.as_str(), &same["inventory"]["version"]), ("ReservationChanged", &json!(4)), "{same}");
    // More than the stock can give: sold out, with the difference it needed.
    let (name, sold_out) = named(app.change_quantity(&alice, id, 20).await);
    assert_eq!(name, "SoldOut", "{sold_out}");
    assert_eq!((&sold_out["requested"], &sold_out["inventory"]["stock"]), (&json!(19), &json!(9)));
    // Up to the last unit still fits.
    assert_eq!(app.snapshot().await, snapshot, "nothing written");
    let (name, all) = named(app.change_quantity(&alice, id, 10).await);
    assert_eq!((name.as_str(), &all["inventory"]["stock"]), ("ReservationChanged", &json!(0)), "{all}");
    assert_eq!(app.states(item).await, [0, 10, 0, 10]);
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_owner_s_active_unexpired_reservations_change() {
    // The expired one must stay unswept: the test checks nothing is written.
    let app = TestApp::without_sweeper(Isolation::ReadCommitted).await;
    let item = app.create_inventory("RESIZE-2", 20).await;
    let (alice, bob) = (app.token("alice", Role::Customer), app.token("bob", Role::Customer));
    let active = hold(&app, &alice, item, 1).await;
    let released = hold(&app, &alice, item, 1).await;
    app.release(&alice, released).await;
    let expired = hold(&app, &alice, item, 1).await;
    app.count(&format!(
        "WITH moved AS (UPDATE reservations SET expires_at = now() - interval '1 second' WHERE id = '{expired}' \
         RETURNING 1) SELECT count(*) FROM moved"
    ))
    .await;
    let ordered = hold(&app, &alice, item, 1).await;
    let input = json!({ "reservationIds": [ordered], "shippingAddress": crate::helpers::address("1 Main St") });
    assert_eq!(named(app.checkout(&alice, input).await).0, "OrderPlaced");
    let snapshot = app.snapshot().await;

    let (name, result) = named(app.change_quantity(&bob, active, 3).await);
    assert_eq!((name.as_str(), &result["reservationId"]), ("ReservationNotFound", &json!(active)), "{result}");
    let unknown = Uuid::new_v4();
    assert_eq!(named(app.change_quantity(&alice, unknown, 3).await).0, "ReservationNotFound");
    for (id, status) in [(released, "RELEASED"), (expired, "EXPIRED"), (ordered, "ORDERED")] {
        let (name, result) = named(app.change_quantity(&alice, id, 3).await);
        assert_eq!(name, "ReservationNotActive", "{status}: {result}");
        assert_eq!((&result["reservation"]["status"], &result["reservation"]["quantity"]), (&json!(status), &json!(1)));
    }
    for quantity in [0, -1, 1001] {
        let body = app.change_quantity(&alice, active, quantity).await;
        assert_eq!(error_code(&body), Some("BAD_USER_INPUT"), "{quantity}: {body}");
    }
    assert_eq!(app.snapshot().await, snapshot, "nothing written");
    app.assert_invariant().await;
}

/// Per round: twelve changes of one line at once, each to its own quantity.
/// They apply one after the other, each to the quantity the one before left:
/// whichever came last holds, the stock gave or took exactly the difference,
/// every answer is a consistent state, and each change is one version step
/// and one ledger row.
async fn concurrent_changes_of_one_line_are_exact(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let item = app.create_inventory("RESIZE-LINE", 100).await;
    let alice = app.token("alice", Role::Customer);
    for round in 0..10 {
        let id = hold(&app, &alice, item, 5).await;
        let (stock, version) = app.stock_and_version(item).await;
        let targets: Vec<i32> = (1..=12).collect();
        let requests = targets
            .iter()
            .map(|&quantity| {
                let (app, token) = (app.clone(), alice.clone());
                async move { named(app.change_quantity(&token, id, quantity).await) }.boxed()
            })
            .collect();
        let results = at_once(requests).await;
        let context = format!("round {round}: {:?}", names(&results));
        assert_eq!(count(&results, "ReservationChanged"), 12, "the stock fits every one: {context}");
        for (_, answer) in &results {
            let after = answer["inventory"]["stock"].as_i64().expect("stock");
            let quantity = answer["reservation"]["quantity"].as_i64().expect("quantity");
            assert_eq!(after + quantity, i64::from(stock) + 5, "each answer is one state; {context}: {answer}");
        }
        let (final_stock, final_version) = app.stock_and_version(item).await;
        let quantity = held(&app, id).await;
        assert!(targets.contains(&(quantity as i32)), "{context}");
        assert_eq!(i64::from(final_stock) + quantity, i64::from(stock) + 5, "exact; {context}");
        let steps = changes(&app, id).await;
        assert_eq!(final_version - version, steps.len() as i32, "a version step per change; {context}");
        // The one already at its quantity (5) changes nothing, unless it came
        // after another had moved the line away.
        assert!((11..=12).contains(&steps.len()), "{context}: {steps:?}");
        app.release(&alice, id).await;
    }
    assert_eq!(app.stock_and_version(item).await.0, 100);
    app.assert_invariant().await;
}

/// Per round: twenty holds of one unit each on an inventory of 30, all
/// grown to 3 at once: the inventory gives what it has and no more.
async fn concurrent_growth_on_one_inventory_never_overdraws(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let item = app.create_inventory("RESIZE-MANY", 30).await;
    let mut holds = Vec::new();
    for i in 0..20 {
        let token = app.token(&format!("user-{i}"), Role::Customer);
        let id = hold(&app, &token, item, 1).await;
        holds.push((token, id));
    }
    let requests = holds
        .iter()
        .map(|(token, id)| {
            let (app, token, id) = (app.clone(), token.clone(), *id);
            async move { named(app.change_quantity(&token, id, 3).await) }.boxed()
        })
        .collect();
    let results = at_once(requests).await;
    let grown = count(&results, "ReservationChanged");
    assert_eq!(grown + count(&results, "SoldOut"), 20, "no errors: {:?}", names(&results));
    // 10 left after the holds; each growth takes 2.
    assert_eq!(grown, 5, "every unit given and none more: {:?}", names(&results));
    for (_, answer) in results.iter().filter(|(name, _)| name == "SoldOut") {
        assert_eq!(answer["requested"], 2, "{answer}");
        assert!(answer["inventory"]["stock"].as_i64().expect("stock") < 2, "{answer}");
    }
    let mut total = 0;
    for (_, id) in &holds {
        total += held(&app, *id).await;
    }
    assert_eq!(total, 30, "every unit held");
    assert_eq!(app.stock_and_version(item).await, (0, 1 + 20 + 5));
    assert_eq!(app.states(item).await, [0, 30, 0, 30]);
    app.assert_invariant().await;
}

at_every_isolation! {
    concurrent_changes_of_one_line_are_exact;
    concurrent_growth_on_one_inventory_never_overdraws;
}
