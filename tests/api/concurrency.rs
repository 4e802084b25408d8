//! Many requests at once, lined up behind a barrier, then the outcome checked
//! straight from the database. Each scenario runs at READ COMMITTED,
//! REPEATABLE READ and SERIALIZABLE.

use std::sync::Arc;

use futures::future::join_all;
use serde_json::{Value, json};
use stockguard::{auth::Role, config::Limits};
use tokio::sync::Barrier;

use crate::helpers::{Isolation, TestApp, at_every_isolation};

/// Fires `inputs` at `reserve` all at once, one task each, and returns the results.
async fn reserve_at_once(app: &Arc<TestApp>, requests: Vec<(String, Value)>) -> Vec<Value> {
    let barrier = Arc::new(Barrier::new(requests.len()));
    let tasks = requests.into_iter().map(|(token, input)| {
        let (app, barrier) = (app.clone(), barrier.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            app.reserve(&token, input).await
        })
    });
    join_all(tasks).await.into_iter().map(|r| r.expect("task")).collect()
}

fn typenames(results: &[Value]) -> Vec<String> {
    results.iter().map(|r| r["__typename"].as_str().map_or_else(|| format!("ERROR {r}"), str::to_owned)).collect()
}

fn count(names: &[String], name: &str) -> usize {
    names.iter().filter(|n| *n == name).count()
}

async fn two_hundred_reservations_on_ten_units_grant_exactly_ten(isolation: Isolation, coalesce: bool) {
    let app = Arc::new(TestApp::spawn_configured(isolation, Limits { coalesce, ..Limits::default() }).await);
    let id = app.create_inventory("HOT-1", 10).await;
    let requests = (0..200)
        .map(|i| (app.token(&format!("user-{i}"), Role::Customer), json!({ "inventoryId": id, "quantity": 1 })))
        .collect();
    let names = typenames(&reserve_at_once(&app, requests).await);

    assert_eq!(count(&names, "Reserved"), 10, "{names:?}");
    assert_eq!(count(&names, "SoldOut"), 190, "{names:?}");
    assert_eq!(app.stock_and_version(id).await, (0, 11));
    assert_eq!(app.count(&format!("SELECT count(*) FROM reservations WHERE inventory_id = '{id}'")).await, 10);
    app.assert_invariant().await;
}

/// A catalogue: forty one-unit items, and a wave of forty callers at once,
/// one per item, so the batches that form name each item once (the
/// statement without the walk); a second wave finds every item sold out.
async fn a_wave_of_one_caller_per_item_takes_each_item_once(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let mut items = Vec::new();
    for i in 0..40 {
        items.push(app.create_inventory(&format!("CAT-{i}"), 1).await);
    }
    for (wave, expected) in [(0, "Reserved"), (1, "SoldOut")] {
        let requests = items
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let token = app.token(&format!("user-{wave}-{i}"), Role::Customer);
                (token, json!({ "inventoryId": id, "quantity": 1 }))
            })
            .collect();
        let names = typenames(&reserve_at_once(&app, requests).await);
        assert_eq!(count(&names, expected), items.len(), "wave {wave}: {names:?}");
    }
    for id in &items {
        assert_eq!(app.stock_and_version(*id).await, (0, 2), "{id}");
    }
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 40);
    let shared = "SELECT count(*) FROM (SELECT 1 FROM stock_movements WHERE reason = 'RESERVED' \
                  GROUP BY xmin::text HAVING count(*) > 1) AS batches";
    assert!(app.count(shared).await > 0, "items shared a statement");
    app.assert_invariant().await;
}

async fn two_reservations_with_the_same_expected_version_let_exactly_one_win(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let id = app.create_inventory("SEEN-1", 1000).await;
    let (alice, bob) = (app.token("alice", Role::Customer), app.token("bob", Role::Customer));
    for round in 0..50 {
        let (_, seen) = app.stock_and_version(id).await;
        let input = json!({ "inventoryId": id, "quantity": 1, "expectedVersion": seen });
        let results = reserve_at_once(&app, vec![(alice.clone(), input.clone()), (bob.clone(), input)]).await;
        let names = typenames(&results);
        assert_eq!(count(&names, "Reserved"), 1, "round {round}: {names:?}");
        assert_eq!(count(&names, "Conflict"), 1, "round {round}: {names:?}");
        let conflict = results.iter().find(|r| r["__typename"] == "Conflict").expect("conflict");
        assert_eq!(conflict["expectedVersion"], seen);
        assert_eq!(conflict["inventory"]["version"], seen + 1, "the conflict carries the new version");
    }
    assert_eq!(app.stock_and_version(id).await, (950, 51));
    app.assert_invariant().await;
}

async fn twenty_repeats_of_one_idempotency_key_take_one_unit(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let id = app.create_inventory("CLICK-1", 5).await;
    let alice = app.token("alice", Role::Customer);
    let input = json!({ "inventoryId": id, "quantity": 1, "idempotencyKey": "double-click-1" });
    let results = reserve_at_once(&app, (0..20).map(|_| (alice.clone(), input.clone())).collect()).await;

    let names = typenames(&results);
    assert_eq!(count(&names, "Reserved"), 20, "{names:?}");
    let ids: std::collections::HashSet<&str> = results.iter().filter_map(|r| r["reservation"]["id"].as_str()).collect();
    assert_eq!(ids.len(), 1, "one reservation for every repeat: {ids:?}");
    assert_eq!(app.stock_and_version(id).await, (4, 2));
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 1);
    app.assert_invariant().await;
}

at_every_isolation! {
    two_hundred_reservations_on_ten_units_grant_exactly_ten
        => |isolation| two_hundred_reservations_on_ten_units_grant_exactly_ten(isolation, true);
    one_statement_per_request_also_grants_exactly_ten
        => |isolation| two_hundred_reservations_on_ten_units_grant_exactly_ten(isolation, false);
    the_same_expected_version_lets_exactly_one_of_two_win
        => two_reservations_with_the_same_expected_version_let_exactly_one_win;
    repeats_of_one_idempotency_key_take_one_unit => twenty_repeats_of_one_idempotency_key_take_one_unit;
    one_caller_per_item_takes_each_item_once => a_wave_of_one_caller_per_item_takes_each_item_once;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_restocks_all_count_and_stale_versions_conflict() {
    let app = Arc::new(TestApp::spawn().await);
    let id = app.create_inventory("RESTOCK-1", 0).await;
    let operator = app.operator();
    let barrier = Arc::new(Barrier::new(40));
    let tasks = (0..40).map(|i| {
        let (app, barrier, operator) = (app.clone(), barrier.clone(), operator.clone());
        tokio::spawn(async move {
            // Half restock blindly, half from a screen that saw version 1.
            let input = if i % 2 == 0 {
                json!({ "inventoryId": id, "quantity": 3 })
            } else {
                json!({ "inventoryId": id, "quantity": 5, "expectedVersion": 1 })
            };
            barrier.wait().await;
            app.restock(&operator, input).await
        })
    });
    let results: Vec<Value> = join_all(tasks).await.into_iter().map(|r| r.expect("task")).collect();
    let names: Vec<String> = results.iter().map(|r| r["__typename"].as_str().unwrap_or("ERROR").to_owned()).collect();
    let versioned_wins = count(&names, "Restocked") - 20;
    assert!(count(&names, "ERROR") == 0, "{results:?}");
    assert!(versioned_wins <= 1, "at most one restock from version 1 wins: {names:?}");
    let (stock, version) = app.stock_and_version(id).await;
    assert_eq!(stock, 20 * 3 + 5 * versioned_wins as i32);
    assert_eq!(version, 1 + 20 + versioned_wins as i32);
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mixed_quantities_never_take_more_than_the_stock() {
    let app = Arc::new(TestApp::spawn().await);
    let id = app.create_inventory("MIXED-1", 37).await;
    let requests = (0..60)
        .map(|i| {
            let token = app.token(&format!("user-{i}"), Role::Customer);
            (token, json!({ "inventoryId": id, "quantity": 1 + i % 4 }))
        })
        .collect();
    let results = reserve_at_once(&app, requests).await;
    let granted: i64 = results
        .iter()
        .filter(|r| r["__typename"] == "Reserved")
        .map(|r| r["reservation"]["quantity"].as_i64().expect("quantity"))
        .sum();
    assert!(results.iter().all(|r| r["__typename"] == "Reserved" || r["__typename"] == "SoldOut"), "{results:?}");
    let (stock, _) = app.stock_and_version(id).await;
    assert_eq!(i64::from(stock), 37 - granted);
    // Nobody was refused while enough stock was left for them.
    for sold_out in results.iter().filter(|r| r["__typename"] == "SoldOut") {
        assert!(sold_out["requested"].as_i64().expect("requested") > i64::from(stock));
    }
    app.assert_invariant().await;
}
