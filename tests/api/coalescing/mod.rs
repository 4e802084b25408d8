//! Coalesced reservations: many conditional reserves on one inventory are
//! served by shared statements, yet each caller gets its own exact answer.

mod deadlocks;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::future::join_all;
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, TransactionTrait};
use serde_json::{Value, json};
use stockguard::{
    auth::Role,
    config::Limits,
    db::{Collisions, StatementPool},
    reservations::{
        coalesce::{Batching, Coalescer},
        reserve::{ReserveOutcome, ReserveRequest},
    },
    stock::allocating::Allocating,
};
use tokio::sync::Barrier;

use crate::{
    helpers::{Isolation, RESERVE, TestApp, at_every_isolation, error_code, eventually},
    process::Process,
};

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
    // Shared statements: a row's `xmin` is the transaction that inserted it.
    // Alone, each grant is a transaction of its own (37); 200 callers
    // released at once into a 20 ms window share batches by the dozen.
    // Three grants per transaction on average at least: one pair that
    // happened to share a statement cannot meet that.
    let transactions =
        app.count(&format!("SELECT count(DISTINCT xmin::text) FROM reservations WHERE inventory_id = '{id}'")).await;
    println!("{transactions} transactions for 37 grants");
    assert!(transactions * 3 <= 37, "{transactions} transactions for 37 grants: they were not coalesced");
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
async fn a_failing_batch_is_served_again_caller_by_caller_so_only_the_bad_caller_fails() {
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

    // The batch that held the poisoned caller failed whole and wrote
    // nothing; its callers were then each served alone, so only the
    // poisoned one fails.
    let failed: Vec<usize> = (0..results.len()).filter(|&i| results[i].get("errors").is_some()).collect();
    assert_eq!(failed, [15], "only the poisoned caller fails: {results:?}");
    assert_eq!(error_code(&results[15]), Some("INTERNAL"), "{:?}", results[15]);
    let reserved = results.iter().filter(|r| r["__typename"] == "Reserved").count();
    assert_eq!(reserved, 30, "every other caller is served: {results:?}");
    // Nothing of the failed batch was written: stock and ledger agree with the grants.
    let (stock, version) = app.stock_and_version(id).await;
    assert_eq!((stock, version), (100 - reserved as i32, 1 + reserved as i32));
    app.assert_invariant().await;
}

/// A request for `quantity` of `id` without a version or a key.
pub fn unguarded(id: uuid::Uuid, quantity: i32) -> ReserveRequest {
    ReserveRequest {
        inventory_id: id,
        quantity,
        expected_version: None,
        idempotency_key: None,
        ttl_secs: 900,
        allocating: Allocating::default(),
        use_safety_stock: false,
    }
}

/// A coalescer of its own over `app`'s database, batching as `batching` says.
pub fn coalescer(app: &TestApp, batching: Batching) -> Arc<Coalescer> {
    Arc::new(Coalescer::new(app.db.clone(), StatementPool::beside(&app.db), Collisions::new(20), batching))
}

/// A transaction holding inventory `id`'s row, so that statements taking
/// from it wait on its lock until the transaction ends.
async fn hold_row(db: &DatabaseConnection, id: uuid::Uuid) -> DatabaseTransaction {
    let holder = db.begin().await.expect("begin");
    holder
        .execute_unprepared(&format!("SELECT 1 FROM inventories WHERE id = '{id}' FOR UPDATE"))
        .await
        .expect("lock the row");
    holder
}

/// Queues `callers` on `coalescer` behind a first caller whose statement
/// waits for `held`'s row (held here), then lets the row go, so the callers
/// share the next statement; their answers, in order.
pub async fn served_after_a_held_row(
    app: &TestApp,
    coalescer: &Arc<Coalescer>,
    held: uuid::Uuid,
    callers: Vec<(&'static str, ReserveRequest)>,
) -> Vec<ReserveOutcome> {
    let reserve = |user: &'static str, request: ReserveRequest| {
        let coalescer = coalescer.clone();
        tokio::spawn(async move { coalescer.reserve(user, &request).await })
    };
    let holder = hold_row(&app.db, held).await;
    let first = reserve("first", unguarded(held, 1));
    app.until_waiting_for_a_lock("WITH taken AS").await;
    let expected = callers.len();
    let queued: Vec<_> = callers.into_iter().map(|(user, request)| reserve(user, request)).collect();
    eventually(Duration::from_secs(10), "the callers queue", || async { coalescer.waiting() == expected }).await;
    holder.rollback().await.expect("release the row");
    assert!(matches!(first.await.expect("task"), Ok(ReserveOutcome::Reserved { .. })));
    let mut outcomes = Vec::new();
    for caller in queued {
        outcomes.push(caller.await.expect("task").expect("answered"));
    }
    outcomes
}

/// Every 40P01 a server meets is counted on its way to a re-run: none was.
async fn assert_met_no_deadlock(process: &Process) {
    let metrics = process.client.get(format!("{}/metrics", process.address)).send().await.expect("metrics");
    let metrics = metrics.text().await.expect("metrics text");
    let deadlocks = metrics.lines().find(|l| l.starts_with("stockguard_db_failures_total{class=\"deadlock\"}"));
    assert_eq!(deadlocks, None, "a server met a deadlock: {deadlocks:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn callers_queued_behind_a_first_caller_that_goes_away_are_still_served() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("COALESCE-4", 100).await;
    let coalescer = coalescer(&app, Batching { lanes: 4, max_batch: 64, backlog: 1, window: Duration::ZERO });
    // Hold the row, so the first caller's statement waits on its lock.
    let holder = hold_row(&app.db, id).await;
    let first = tokio::spawn({
        let coalescer = coalescer.clone();
        async move { coalescer.reserve("first", &unguarded(id, 1)).await }
    });
    // The first caller's own statement (the one-statement reserve) waits for the row.
    app.until_waiting_for_a_lock("WITH taken AS").await;
    // These queue behind the first caller, who then goes away mid-statement.
    let queued: Vec<_> = (0..5)
        .map(|i| {
            let coalescer = coalescer.clone();
            tokio::spawn(async move { coalescer.reserve(&format!("queued-{i}"), &unguarded(id, 1)).await })
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

#[tokio::test(flavor = "multi_thread")]
async fn callers_of_different_inventories_queued_behind_a_statement_share_the_next_one() {
    let app = TestApp::spawn().await;
    let held = app.create_inventory("LANE-HELD", 10).await;
    let plain = app.create_inventory("LANE-PLAIN", 10).await;
    let twice = app.create_inventory("LANE-TWICE", 10).await;
    let scarce = app.create_inventory("LANE-SCARCE", 2).await;
    let missing = uuid::Uuid::new_v4();
    // One lane: while the first caller's statement runs, everyone else waits.
    let coalescer = coalescer(&app, Batching { lanes: 1, max_batch: 64, backlog: 1, window: Duration::ZERO });
    let callers = vec![
        ("plain", unguarded(plain, 1)),
        ("twice-a", unguarded(twice, 3)),
        ("twice-b", unguarded(twice, 4)),
        ("scarce", unguarded(scarce, 5)),
        ("missing", unguarded(missing, 1)),
    ];
    let outcomes = served_after_a_held_row(&app, &coalescer, held, callers).await;
    // Each caller's answer is the one it would have had alone, one at a time.
    let seen = |outcome: &ReserveOutcome| match outcome {
        ReserveOutcome::Reserved { reservation, inventory } => {
            ("Reserved", reservation.quantity, inventory.stock, inventory.version)
        }
        ReserveOutcome::SoldOut { requested, inventory, .. } => {
            ("SoldOut", *requested, inventory.stock, inventory.version)
        }
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(seen(&outcomes[0]), ("Reserved", 1, 9, 2));
    let mut twice_answers = [seen(&outcomes[1]), seen(&outcomes[2])];
    twice_answers.sort_by_key(|answer| answer.3);
    let (earlier, later) = (twice_answers[0], twice_answers[1]);
    assert_eq!((earlier.0, earlier.2, earlier.3), ("Reserved", 10 - earlier.1, 2), "{twice_answers:?}");
    assert_eq!((later.0, later.2, later.3), ("Reserved", 3, 3), "{twice_answers:?}");
    assert_eq!(seen(&outcomes[3]), ("SoldOut", 5, 2, 1));
    assert!(matches!(outcomes[4], ReserveOutcome::InventoryNotFound), "{:?}", outcomes[4]);
    // The mechanism: the three grants of two inventories came from one transaction.
    let transactions = app
        .count(&format!(
            "SELECT count(DISTINCT xmin::text) FROM stock_movements \
             WHERE reason = 'RESERVED' AND inventory_id IN ('{plain}', '{twice}')"
        ))
        .await;
    assert_eq!(transactions, 1, "the queued callers of two inventories shared one statement");
    assert_eq!((app.stock_and_version(plain).await, app.stock_and_version(twice).await), ((9, 2), (3, 3)));
    assert_eq!(app.stock_and_version(scarce).await, (2, 1));
    app.assert_invariant().await;
}

/// Callers of distinct inventories share the statement without a walk, and
/// those it does not serve are answered as alone, from a read afterwards:
/// too little stock is sold out, another version a conflict, no row not found.
#[tokio::test(flavor = "multi_thread")]
async fn callers_of_distinct_inventories_share_one_statement_and_are_refused_as_alone() {
    let app = TestApp::spawn().await;
    let held = app.create_inventory("DISTINCT-HELD", 10).await;
    let plain = app.create_inventory("DISTINCT-PLAIN", 10).await;
    let other = app.create_inventory("DISTINCT-OTHER", 10).await;
    let scarce = app.create_inventory("DISTINCT-SCARCE", 2).await;
    let stale = app.create_inventory("DISTINCT-STALE", 10).await;
    let coalescer = coalescer(&app, Batching { lanes: 1, max_batch: 64, backlog: 1, window: Duration::ZERO });
    let callers = vec![
        ("plain", unguarded(plain, 1)),
        ("scarce", unguarded(scarce, 5)),
        ("stale", ReserveRequest { expected_version: Some(7), ..unguarded(stale, 1) }),
        ("missing", unguarded(uuid::Uuid::new_v4(), 1)),
        // Its own TTL in the shared statement: never expires.
        ("other", ReserveRequest { ttl_secs: 0, ..unguarded(other, 3) }),
    ];
    let outcomes = served_after_a_held_row(&app, &coalescer, held, callers).await;
    let reserved = |outcome: &ReserveOutcome| match outcome {
        ReserveOutcome::Reserved { reservation, inventory } => {
            (reservation.quantity, inventory.stock, inventory.version, reservation.expires_at.is_some())
        }
        other => panic!("expected Reserved, got {other:?}"),
    };
    assert_eq!(reserved(&outcomes[0]), (1, 9, 2, true));
    match &outcomes[1] {
        ReserveOutcome::SoldOut { requested: 5, inventory, .. } => {
            assert_eq!((inventory.stock, inventory.version), (2, 1))
        }
        other => panic!("expected SoldOut, got {other:?}"),
    }
    match &outcomes[2] {
        ReserveOutcome::Conflict { expected_version: 7, inventory } => {
            assert_eq!((inventory.stock, inventory.version), (10, 1))
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert!(matches!(outcomes[3], ReserveOutcome::InventoryNotFound), "{:?}", outcomes[3]);
    assert_eq!(reserved(&outcomes[4]), (3, 7, 2, false));
    let never = format!("SELECT count(*) FROM reservations WHERE inventory_id = '{other}' AND expires_at IS NULL");
    assert_eq!(app.count(&never).await, 1, "the TTL of 0 was kept in the database");
    let transactions = app
        .count(&format!(
            "SELECT count(DISTINCT xmin::text) FROM stock_movements \
             WHERE reason = 'RESERVED' AND inventory_id IN ('{plain}', '{other}')"
        ))
        .await;
    assert_eq!(transactions, 1, "the two grants shared one statement");
    assert_eq!(app.stock_and_version(scarce).await, (2, 1));
    assert_eq!(app.stock_and_version(stale).await, (10, 1));
    app.assert_invariant().await;
}

/// With lanes free but a backlog rule, callers of idle inventories that
/// arrive while a statement runs wait instead of each taking a lane of its
/// own; once `backlog` of them wait they share one statement beside the
/// running one (which is still blocked), not one statement each.
#[tokio::test(flavor = "multi_thread")]
async fn callers_of_idle_inventories_wait_for_a_backlog_before_a_second_lane_opens() {
    let app = TestApp::spawn().await;
    let held = app.create_inventory("BACKLOG-HELD", 10).await;
    let mut idle = Vec::new();
    for i in 0..3 {
        idle.push(app.create_inventory(&format!("BACKLOG-{i}"), 10).await);
    }
    let coalescer = coalescer(&app, Batching { lanes: 4, max_batch: 64, backlog: 3, window: Duration::ZERO });
    let holder = hold_row(&app.db, held).await;
    let reserve = |id: uuid::Uuid, user: String| {
        let coalescer = coalescer.clone();
        tokio::spawn(async move { coalescer.reserve(&user, &unguarded(id, 1)).await })
    };
    // Nothing runs: the first caller goes at once, and waits on the lock.
    let first = reserve(held, "first".into());
    app.until_waiting_for_a_lock("WITH taken AS").await;
    // Two callers of idle inventories: fewer than the backlog, so they wait
    // although three lanes are free.
    let mut queued = vec![reserve(idle[0], "idle-0".into()), reserve(idle[1], "idle-1".into())];
    eventually(Duration::from_secs(10), "two callers wait", || async { coalescer.waiting() == 2 }).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(coalescer.waiting(), 2, "below the backlog no lane opens");
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 0, "nothing was served meanwhile");
    // The third makes the backlog: one statement serves all three while the
    // first caller's statement still waits for its row.
    queued.push(reserve(idle[2], "idle-2".into()));
    for caller in queued {
        let outcome = tokio::time::timeout(Duration::from_secs(10), caller)
            .await
            .expect("served beside the blocked statement")
            .expect("task");
        assert!(matches!(outcome, Ok(ReserveOutcome::Reserved { .. })), "{outcome:?}");
    }
    assert!(!first.is_finished(), "the first caller still waits for its row");
    let transactions = app
        .count(&format!(
            "SELECT count(DISTINCT xmin::text) FROM stock_movements WHERE reason = 'RESERVED' \
             AND inventory_id IN ('{}', '{}', '{}')",
            idle[0], idle[1], idle[2]
        ))
        .await;
    assert_eq!(transactions, 1, "the three waiting callers shared one statement");
    holder.rollback().await.expect("release the row");
    assert!(matches!(first.await.expect("task"), Ok(ReserveOutcome::Reserved { .. })));
    app.assert_invariant().await;
}

/// Keyed and versioned callers share batches too, and keep their rules
/// there: new keys are served in one statement; a key seen before fails its
/// batch on the keys' unique index, so the batch writes nothing and its
/// callers are served alone, where the key replays its first outcome; a
/// keyed caller that a batch refuses (sold out) still gets its key's first
/// outcome; and of two callers expecting one version one wins and the other
/// conflicts, and one without the stock is sold out, as each alone.
#[tokio::test(flavor = "multi_thread")]
async fn keyed_and_versioned_callers_share_a_batch_and_keep_their_rules() {
    let app = TestApp::spawn().await;
    let held = app.create_inventory("KEYED-HELD", 10).await;
    let plenty = app.create_inventory("KEYED-PLENTY", 10).await;
    let scarce = app.create_inventory("KEYED-SCARCE", 1).await;
    let other = app.create_inventory("KEYED-OTHER", 10).await;
    let coalescer = coalescer(&app, Batching { lanes: 1, max_batch: 64, backlog: 1, window: Duration::ZERO });
    let keyed = |id: uuid::Uuid, key: &str| ReserveRequest { idempotency_key: Some(key.into()), ..unguarded(id, 1) };
    let versioned =
        |id: uuid::Uuid, version: i32| ReserveRequest { expected_version: Some(version), ..unguarded(id, 1) };
    let round = |callers| served_after_a_held_row(&app, &coalescer, held, callers);
    let reserved = |outcome: &ReserveOutcome| match outcome {
        ReserveOutcome::Reserved { reservation, .. } => reservation.id,
        other => panic!("expected Reserved, got {other:?}"),
    };
    let one_transaction = |ids: &[uuid::Uuid]| {
        let list = ids.iter().map(|id| format!("'{id}'")).collect::<Vec<_>>().join(", ");
        format!("SELECT count(DISTINCT xmin::text) FROM reservations WHERE id IN ({list})")
    };

    // New keys beside a caller without one: one statement, keys kept.
    let outcomes =
        round(vec![("alice", keyed(plenty, "a-1")), ("bob", keyed(scarce, "b-1")), ("carol", unguarded(plenty, 1))])
            .await;
    let first: Vec<_> = outcomes.iter().map(reserved).collect();
    assert_eq!(app.count(&one_transaction(&first)).await, 1, "keyed callers shared one statement");
    assert_eq!(app.count("SELECT count(*) FROM reservations WHERE idempotency_key IS NOT NULL").await, 2);

    // A key seen before, beside a new one: the repeat replays its first
    // reservation and the new key is served (alone, after the failed batch).
    let outcomes = round(vec![("alice", keyed(plenty, "a-1")), ("dave", keyed(plenty, "d-1"))]).await;
    assert_eq!(reserved(&outcomes[0]), first[0], "the repeated key replays its first reservation");
    assert!(!first.contains(&reserved(&outcomes[1])), "the new key is a new reservation");

    // A repeat on an inventory now sold out, beside a caller the batch
    // serves: the batch refuses the repeat, whose answer is its first outcome.
    let outcomes = round(vec![("bob", keyed(scarce, "b-1")), ("erin", unguarded(plenty, 1))]).await;
    assert_eq!(reserved(&outcomes[0]), first[1], "a refused repeat still answers with its first reservation");
    reserved(&outcomes[1]);

    // Versions: plenty is at version 5 (four grants), scarce at 2 and empty.
    assert_eq!(app.stock_and_version(plenty).await, (6, 5));
    let outcomes = round(vec![
        ("frank", versioned(plenty, 5)),
        ("grace", versioned(plenty, 5)),
        ("heidi", versioned(scarce, 2)),
        ("ivan", unguarded(other, 1)),
    ])
    .await;
    // Frank and grace expect the same version: whoever came first wins it,
    // and the other conflicts with the version after that grant.
    let (winner, loser) = match &outcomes[0] {
        ReserveOutcome::Reserved { .. } => (&outcomes[0], &outcomes[1]),
        _ => (&outcomes[1], &outcomes[0]),
    };
    let winner = reserved(winner);
    match loser {
        ReserveOutcome::Conflict { expected_version: 5, inventory } => {
            assert_eq!((inventory.stock, inventory.version), (5, 6), "the version after the winner's grant")
        }
        other => panic!("one of two callers expecting version 5 conflicts: {other:?}"),
    }
    assert!(matches!(&outcomes[2], ReserveOutcome::SoldOut { requested: 1, .. }), "{:?}", outcomes[2]);
    let ivan = reserved(&outcomes[3]);
    assert_eq!(app.count(&one_transaction(&[winner, ivan])).await, 1, "versioned callers shared one statement");

    // Alice, carol, dave, erin and the winner took from plenty, bob once
    // from scarce, ivan from other.
    assert_eq!(app.stock_and_version(plenty).await, (5, 6));
    assert_eq!(app.stock_and_version(other).await, (9, 2));
    assert_eq!(app.stock_and_version(scarce).await, (0, 2));
    assert_eq!(app.count(&format!("SELECT count(*) FROM reservations WHERE inventory_id <> '{held}'")).await, 7);
    app.assert_invariant().await;
}
