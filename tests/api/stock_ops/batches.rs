//! Coalesced batches mix customers and operators who take safety stock:
//! whether a caller may take it is decided per caller inside the batch's
//! one statement, never per batch. Callers are queued one after another
//! behind a held row so they share the next statement in that order (as
//! `coalescing` does), on one inventory
//! (the walk), on several (one conditional UPDATE each) and on one held in
//! several places (the walk across levels, which serves an operator asking
//! for safety stock alone right after it).

use std::{sync::Arc, time::Duration};

use sea_orm::{ConnectionTrait, TransactionTrait};
use serde_json::json;
use stockguard::reservations::{
    coalesce::{Batching, Coalescer},
    reserve::{ReserveOutcome, ReserveRequest},
};
use uuid::Uuid;

use super::{races::customers_below_safety_stock, set_safety};
use crate::{
    coalescing::{coalescer, unguarded},
    helpers::{TestApp, eventually},
    locations::{create_location, default_location, stocked},
    transfers::transfer,
};

/// One lane: while the first caller's statement runs, everyone else waits
/// and shares the next one.
const ONE_LANE: Batching = Batching { lanes: 1, max_batch: 64, backlog: 1, window: Duration::ZERO };

/// Queues `callers` on `coalescer`, one after another in the order given,
/// behind a first caller whose statement waits for `held`'s row (held
/// here), then lets the row go, so the callers share the next statement in
/// that order; their answers, in order.
async fn served_in_order_after_a_held_row(
    app: &TestApp,
    coalescer: &Arc<Coalescer>,
    held: Uuid,
    callers: Vec<(&'static str, ReserveRequest)>,
) -> Vec<ReserveOutcome> {
    let reserve = |user: &'static str, request: ReserveRequest| {
        let coalescer = coalescer.clone();
        tokio::spawn(async move { coalescer.reserve(user, &request).await })
    };
    let holder = app.db.begin().await.expect("begin");
    let lock = format!("SELECT 1 FROM inventories WHERE id = '{held}' FOR UPDATE");
    holder.execute_unprepared(&lock).await.expect("lock the row");
    let first = reserve("first", unguarded(held, 1));
    app.until_waiting_for_a_lock("WITH taken AS").await;
    let mut queued = Vec::new();
    for (n, (user, request)) in callers.into_iter().enumerate() {
        queued.push(reserve(user, request));
        eventually(Duration::from_secs(10), "the caller queues after the one before", || async {
            coalescer.waiting() == n + 1
        })
        .await;
    }
    holder.rollback().await.expect("release the row");
    assert!(matches!(first.await.expect("task"), Ok(ReserveOutcome::Reserved { .. })));
    let mut outcomes = Vec::new();
    for caller in queued {
        outcomes.push(caller.await.expect("task").expect("answered"));
    }
    outcomes
}

/// `quantity` of `id` for an operator taking safety stock.
fn keeping(id: Uuid, quantity: i32) -> ReserveRequest {
    ReserveRequest { use_safety_stock: true, ..unguarded(id, quantity) }
}

/// An outcome as `(member, units asked, units offered or left)`.
fn seen(outcome: &ReserveOutcome) -> (&'static str, i32, i32) {
    match outcome {
        ReserveOutcome::Reserved { reservation, inventory } => ("Reserved", reservation.quantity, inventory.stock),
        ReserveOutcome::SoldOut { requested, available, .. } => ("SoldOut", *requested, *available),
        other => panic!("unexpected {other:?}"),
    }
}

/// How many transactions wrote the RESERVED rows of `id`.
async fn transactions(app: &TestApp, id: Uuid) -> i64 {
    app.count(&format!(
        "SELECT count(DISTINCT xmin::text) FROM stock_movements WHERE inventory_id = '{id}' AND reason = 'RESERVED'"
    ))
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn one_inventorys_batch_decides_safety_stock_caller_by_caller() {
    let app = TestApp::spawn().await;
    let held = stocked(&app, "BATCH-HELD", 10).await;
    let item = stocked(&app, "BATCH-ONE", 10).await;
    set_safety(&app, &app.operator(), json!({ "inventoryId": item, "quantity": 4 })).await;
    let coalescer = coalescer(&app, ONE_LANE);
    let callers = vec![
        ("alice", unguarded(item, 3)),
        ("safety-op-a", keeping(item, 3)),
        ("bob", unguarded(item, 2)),
        ("carol", unguarded(item, 1)),
        ("safety-op-b", keeping(item, 2)),
        ("dave", unguarded(item, 1)),
    ];
    let outcomes = served_in_order_after_a_held_row(&app, &coalescer, held, callers).await;
    let seen: Vec<_> = outcomes.iter().map(seen).collect();
    assert_eq!(
        seen,
        [
            ("Reserved", 3, 7),
            ("Reserved", 3, 4),
            ("SoldOut", 2, 0),
            ("SoldOut", 1, 0),
            ("Reserved", 2, 2),
            ("SoldOut", 1, 0)
        ],
        "each caller as alone, in arrival order: customers see 6 sellable, operators all 10"
    );
    assert_eq!(transactions(&app, item).await, 1, "the three grants shared one statement");
    assert!(customers_below_safety_stock(&app, item).await.is_empty());
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_of_distinct_inventories_decides_safety_stock_caller_by_caller() {
    let app = TestApp::spawn().await;
    let held = stocked(&app, "DISTINCT-SAFE-HELD", 10).await;
    let mut items = Vec::new();
    for n in 0..4 {
        let item = stocked(&app, &format!("DISTINCT-SAFE-{n}"), 10).await;
        set_safety(&app, &app.operator(), json!({ "inventoryId": item, "quantity": 4 })).await;
        items.push(item);
    }
    let coalescer = coalescer(&app, ONE_LANE);
    let callers = vec![
        ("alice", unguarded(items[0], 7)),
        ("safety-op-a", keeping(items[1], 7)),
        ("bob", unguarded(items[2], 6)),
        ("safety-op-b", keeping(items[3], 11)),
    ];
    let outcomes = served_in_order_after_a_held_row(&app, &coalescer, held, callers).await;
    let seen: Vec<_> = outcomes.iter().map(seen).collect();
    assert_eq!(seen, [("SoldOut", 7, 6), ("Reserved", 7, 3), ("Reserved", 6, 4), ("SoldOut", 11, 10)]);
    let shared = app
        .count(&format!(
            "SELECT count(DISTINCT xmin::text) FROM stock_movements WHERE reason = 'RESERVED' AND inventory_id IN ('{}', '{}')",
            items[1], items[2]
        ))
        .await;
    assert_eq!(shared, 1, "the operator's and the customer's grants shared one statement");
    for item in items {
        assert!(customers_below_safety_stock(&app, item).await.is_empty());
    }
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_across_levels_keeps_each_levels_safety_stock_and_serves_an_operator_asking_for_it() {
    let app = TestApp::spawn().await;
    let operator = app.operator();
    let held = stocked(&app, "ACROSS-SAFE-HELD", 10).await;
    let item = stocked(&app, "ACROSS-SAFE", 10).await;
    let (default, b) = (default_location(&app).await, create_location(&app, "b", 10).await);
    let split = json!({ "inventoryId": item, "fromLocationId": default, "toLocationId": b, "quantity": 5 });
    assert_eq!(transfer(&app, &operator, split).await["__typename"], "StockTransferred");
    for at in [default, b] {
        set_safety(&app, &operator, json!({ "inventoryId": item, "locationId": at, "quantity": 2 })).await;
    }
    let coalescer = coalescer(&app, ONE_LANE);
    // Alone first, so the coalescer learns the stock is in several places.
    let first = coalescer.reserve("zoe", &unguarded(item, 1)).await.expect("answered");
    assert_eq!(seen(&first), ("Reserved", 1, 9));
    let callers = vec![
        ("alice", unguarded(item, 3)),
        ("safety-op-a", keeping(item, 4)),
        ("bob", unguarded(item, 3)),
        ("carol", unguarded(item, 2)),
    ];
    let outcomes = served_in_order_after_a_held_row(&app, &coalescer, held, callers).await;
    let seen: Vec<_> = outcomes.iter().map(seen).collect();
    // Five sellable: alice 3, bob refused with 2 offered, carol the last 2;
    // the operator after them from the 4 units left, safety stock included.
    assert_eq!(seen[0].0, "Reserved");
    assert_eq!((seen[2].0, seen[2].2), ("SoldOut", 2), "{seen:?}");
    assert_eq!(seen[3].0, "Reserved", "{seen:?}");
    assert_eq!(seen[1], ("Reserved", 4, 0), "{seen:?}");
    let customers = app
        .count(&format!(
            "SELECT count(DISTINCT m.xmin::text) FROM stock_movements m JOIN reservations r ON r.id = m.reservation_id
              WHERE m.inventory_id = '{item}' AND m.reason = 'RESERVED' AND r.user_id IN ('alice', 'carol')"
        ))
        .await;
    assert_eq!(customers, 1, "the customers' grants shared the walk across levels");
    assert!(customers_below_safety_stock(&app, item).await.is_empty());
    app.assert_invariant().await;
}
