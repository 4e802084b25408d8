//! Coalesced reservations: many conditional reserves on one inventory are
//! served by shared statements, yet each caller gets its own exact answer.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::future::join_all;
use sea_orm::{ConnectionTrait, TransactionTrait};
use serde_json::{Value, json};
use stockguard::{
    auth::Role,
    config::Limits,
    db::{Collisions, StatementPool},
    reservations::{coalesce::Coalescer, service::ReserveOutcome},
};
use tokio::sync::Barrier;

use crate::helpers::{Isolation, TestApp, at_every_isolation, error_code, eventually};

/// Every caller's whole response body, fired together.
async fn fire(app: &Arc<TestApp>, requests: Vec<(String, i32)>, id: uuid::Uuid) -> Vec<Value> {
    let barrier = Arc::new(Barrier::new(requests.len()));
    let tasks = requests.into_iter().map(|(user, quantity)| {
        let (app, barrier) = (app.clone(), barrier.clone());
        tokio::spawn(async move {
            let token = app.token(&user, Role::Customer);
            barrier.wait().await;
            app.reserve(&token, json!({ "inventoryId": id, "quantity": quantity })).await
        })
    });
    join_all(tasks).await.into_iter().map(|r| r.expect("task")).collect()
}

/// Checks the answers read like one-at-a-time: ordered by version, each
/// grant lowers the stock by exactly its quantity.
fn assert_serial(results: &[Value], initial: i64) {
    let mut granted: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for r in results.iter().filter(|r| r["__typename"] == "Reserved") {
        let version = r["inventory"]["version"].as_i64().expect("version");
        let stock = r["inventory"]["stock"].as_i64().expect("stock");
        let quantity = r["reservation"]["quantity"].as_i64().expect("quantity");
        assert!(granted.insert(version, (stock, quantity)).is_none(), "version {version} answered twice");
    }
    let mut stock = initial;
    for (i, (version, (after, quantity))) in granted.iter().enumerate() {
        assert_eq!(*version, i as i64 + 2, "versions advance by one per grant: {granted:?}");
        stock -= quantity;
        assert_eq!(*after, stock, "each caller sees the stock after its own grant: {granted:?}");
    }
}

async fn many_reserves_on_one_item_grant_exactly_the_stock(isolation: Isolation) {
    // A window long enough that the callers share batches.
    let limits = Limits { coalesce_window_us: 20_000, ..Limits::default() };
    let app = Arc::new(TestApp::spawn_configured(isolation, limits).await);
    let id = app.create_inventory("COALESCE-1", 37).await;
    let results = fire(&app, (0..200).map(|i| (format!("user-{i}"), 1)).collect(), id).await;

    let reserved = results.iter().filter(|r| r["__typename"] == "Reserved").count();
    let sold_out = results.iter().filter(|r| r["__typename"] == "SoldOut").count();
    assert_eq!((reserved, sold_out), (37, 163), "every caller answered, none with an error: {results:?}");
    assert_serial(&results, 37);
    assert_eq!(app.stock_and_version(id).await, (0, 38));
    assert_eq!(app.count(&format!("SELECT count(*) FROM reservations WHERE inventory_id = '{id}'")).await, 37);
    // Shared statements: the 37 grants came from fewer transactions than grants.
    let transactions = app
        .count(&format!(
            "SELECT count(DISTINCT created_at) FROM stock_movements WHERE inventory_id = '{id}' AND reason = 'RESERVED'"
        ))
        .await;
    assert!(transactions < 37, "{transactions} transactions for 37 grants: nothing was coalesced");
    app.assert_invariant().await;
}

at_every_isolation! { many_reserves_on_one_item_grant_exactly_the_stock; }

#[tokio::test(flavor = "multi_thread")]
async fn mixed_quantities_are_granted_as_if_one_at_a_time() {
    let limits = Limits { coalesce_window_us: 20_000, ..Limits::default() };
    let app = Arc::new(TestApp::spawn_configured(Isolation::ReadCommitted, limits).await);
    let id = app.create_inventory("COALESCE-2", 50).await;
    let results = fire(&app, (0..100).map(|i| (format!("user-{i}"), 1 + i % 4)).collect(), id).await;

    assert!(results.iter().all(|r| r["__typename"] == "Reserved" || r["__typename"] == "SoldOut"), "{results:?}");
    assert_serial(&results, 50);
    // A refused caller asked for more than was left at its turn.
    for sold_out in results.iter().filter(|r| r["__typename"] == "SoldOut") {
        assert!(sold_out["requested"].as_i64() > sold_out["inventory"]["stock"].as_i64(), "{sold_out}");
    }
    let granted: i64 = results
        .iter()
        .filter(|r| r["__typename"] == "Reserved")
        .map(|r| r["reservation"]["quantity"].as_i64().expect("quantity"))
        .sum();
    let (stock, _) = app.stock_and_version(id).await;
    assert_eq!(i64::from(stock), 50 - granted);
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_batch_fails_each_of_its_callers_cleanly() {
    let limits = Limits { coalesce_window_us: 20_000, ..Limits::default() };
    let app = Arc::new(TestApp::spawn_configured(Isolation::ReadCommitted, limits).await);
    let id = app.create_inventory("COALESCE-3", 100).await;
    // One poisoned caller makes any statement that inserts its reservation fail.
    app.db
        .execute_unprepared(
            "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN RAISE EXCEPTION 'poisoned reservation'; END $$; \
             CREATE TRIGGER poison BEFORE INSERT ON reservations FOR EACH ROW \
             WHEN (NEW.user_id = 'poison') EXECUTE FUNCTION poison();",
        )
        .await
        .expect("install the trigger");
    let mut callers: Vec<(String, i32)> = (0..30).map(|i| (format!("user-{i}"), 1)).collect();
    callers.insert(15, ("poison".into(), 1));
    let results = fire(&app, callers, id).await;

    let failed: Vec<&Value> = results.iter().filter(|r| r.get("errors").is_some()).collect();
    assert!(!failed.is_empty(), "the poisoned caller's batch fails");
    assert!(failed.iter().all(|r| error_code(r) == Some("INTERNAL")), "{failed:?}");
    let reserved = results.iter().filter(|r| r["__typename"] == "Reserved").count();
    assert_eq!(reserved + failed.len(), 31, "every caller answered: {results:?}");
    // Nothing of the failed batch was written: stock and ledger agree with the grants.
    let (stock, version) = app.stock_and_version(id).await;
    assert_eq!((stock, version), (100 - reserved as i32, 1 + reserved as i32));
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn callers_queued_behind_a_first_caller_that_goes_away_are_still_served() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("COALESCE-4", 100).await;
    let coalescer = Arc::new(Coalescer::new(
        app.db.clone(),
        StatementPool::beside(&app.db),
        Collisions::new(20),
        64,
        Duration::ZERO,
        900,
    ));
    // Hold the row, so the first caller's statement waits on its lock.
    let holder = app.db.begin().await.expect("begin");
    holder
        .execute_unprepared(&format!("SELECT 1 FROM inventories WHERE id = '{id}' FOR UPDATE"))
        .await
        .expect("lock the row");
    let first = tokio::spawn({
        let coalescer = coalescer.clone();
        async move { coalescer.reserve(id, "first", 1).await }
    });
    // The first caller's own statement (the one-statement reserve) waits for the row.
    app.until_waiting_for_a_lock("WITH taken AS").await;
    // These queue behind the first caller, who then goes away mid-statement.
    let queued: Vec<_> = (0..5)
        .map(|i| {
            let coalescer = coalescer.clone();
            tokio::spawn(async move { coalescer.reserve(id, &format!("queued-{i}"), 1).await })
        })
        .collect();
    eventually(Duration::from_secs(10), "five callers queue behind the first", || async { coalescer.queued(id) == 5 })
        .await;
    first.abort();
    assert!(first.await.expect_err("aborted").is_cancelled());
    holder.rollback().await.expect("release the row");

    for caller in queued {
        let outcome = tokio::time::timeout(Duration::from_secs(10), caller)
            .await
            .expect("a queued caller is answered, not stranded")
            .expect("task");
        assert!(matches!(outcome, Ok(ReserveOutcome::Reserved { .. })), "{outcome:?}");
    }
    // The five queued callers got their units; the first caller's statement
    // may or may not have committed (its client was gone), but either way the
    // stock, the reservations and the ledger agree.
    let (stock, _) = app.stock_and_version(id).await;
    assert!(stock == 95 || stock == 94, "stock {stock}");
    app.assert_invariant().await;
}
