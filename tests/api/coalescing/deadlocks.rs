//! Two processes batching the same inventories: locked in id order, their
//! batches wait for each other and never deadlock.

use super::*;

/// Two server processes on one database, each batching callers of the same
/// six inventories (one lane, a window long enough to fill its batches), so
/// their batches overlap in every round: rows are locked in id order, so no
/// deadlock is ever detected, and every unit is granted exactly once.
pub(super) async fn two_processes_with_overlapping_batches_never_deadlock(isolation: Isolation) {
    let env = [("STOCKGUARD_COALESCE_LANES", "1"), ("STOCKGUARD_COALESCE_WINDOW_US", "20000")];
    let (one, two) = Process::start_two(&env, isolation).await;
    let mut inventories = Vec::new();
    for i in 0..6 {
        inventories.push(one.create_inventory(&format!("OVERLAP-{i}"), 50).await);
    }
    let mut answers: Vec<Value> = Vec::new();
    for round in 0..3 {
        let callers: Vec<(&Process, String, uuid::Uuid)> = (0..120)
            .map(|i| {
                let process = if i % 2 == 0 { &one } else { &two };
                // The two processes name the inventories in opposite orders.
                let n = if i % 2 == 0 { i / 2 % 6 } else { 5 - i / 2 % 6 };
                (process, format!("user-{round}-{i}"), inventories[n])
            })
            .collect();
        let barrier = Barrier::new(callers.len());
        let calls = callers.iter().map(|(process, user, id)| {
            let barrier = &barrier;
            async move {
                let token = process.token(user, Role::Customer);
                barrier.wait().await;
                let variables = json!({ "input": { "inventoryId": id } });
                let (status, body) = process.graphql(Some(&token), RESERVE, variables).await.expect("answered");
                assert_eq!(status, 200, "{body}");
                body["data"]["reserve"].clone()
            }
        });
        answers.extend(join_all(calls).await);
    }

    // 720 callers for 300 units: exactly 300 grants, each inventory's in one serial order.
    assert!(answers.iter().all(|a| a["__typename"] == "Reserved" || a["__typename"] == "SoldOut"), "{answers:?}");
    for id in &inventories {
        let mut versions: Vec<i64> = answers
            .iter()
            .filter(|a| a["__typename"] == "Reserved" && a["inventory"]["id"] == json!(id))
            .map(|a| {
                let (stock, version) = (a["inventory"]["stock"].as_i64(), a["inventory"]["version"].as_i64());
                assert_eq!(stock.zip(version).map(|(s, v)| s + v), Some(51), "stock after each grant: {a}");
                version.unwrap_or_default()
            })
            .collect();
        versions.sort_unstable();
        assert_eq!(versions, (2..=51).collect::<Vec<i64>>(), "one grant per version of {id}");
    }
    let left = one.count("SELECT coalesce(sum(stock), 0)::bigint FROM inventories").await;
    assert_eq!(left, 0, "every unit granted once");
    let shared = one
        .count(
            "SELECT count(*) FROM (SELECT 1 FROM stock_movements WHERE reason = 'RESERVED' \
             GROUP BY xmin::text HAVING count(DISTINCT inventory_id) > 1) AS batches",
        )
        .await;
    assert!(shared > 0, "batches of several inventories ran");
    // Neither server met a deadlock, and PostgreSQL counts every deadlock
    // it breaks (as its statistics reach it).
    for process in [&one, &two] {
        assert_met_no_deadlock(process).await;
    }
    let deadlocks = one.count("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").await;
    assert_eq!(deadlocks, 0, "PostgreSQL detected a deadlock");
    let drifts = stockguard::invariant::check(&one.db).await.expect("check");
    assert!(drifts.is_empty(), "invariant broken: {drifts:?}");
    drop(two);
}

at_every_isolation! { two_processes_with_overlapping_batches_never_deadlock; }

/// The deadlock the lock order prevents, made to happen if it can: two
/// processes each batch callers of the same three inventories, named in
/// opposite orders (one batch names each once, the other one of them twice,
/// so both batch statements take part), while a transaction holds the
/// middle one, so both batches stop halfway through taking their locks. Locked in id order, the
/// second batch waits behind the first at the first row; locked in the
/// order the callers came (tried: the test then fails with a deadlock on
/// every run), each would hold what the other needs next.
pub(super) async fn opposite_batches_stopped_halfway_wait_instead_of_deadlocking(isolation: Isolation) {
    let env = [("STOCKGUARD_COALESCE_LANES", "1"), ("STOCKGUARD_COALESCE_WINDOW_US", "1000000")];
    let (one, two) = Process::start_two(&env, isolation).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(one.create_inventory(&format!("ORDER-{i}"), 10).await);
    }
    ids.sort();
    let holder = hold_row(&one.db, ids[1]).await;
    // Each process's callers arrive in its order, 50 ms apart, well inside its window.
    // The first names each inventory once (its batch is the statement for
    // distinct inventories), the second one of them twice (the walk).
    let orders = [(&one, vec![ids[0], ids[1], ids[2]]), (&two, vec![ids[2], ids[1], ids[0], ids[2]])];
    let callers = orders.iter().flat_map(|(process, order)| order.iter().map(move |id| (*process, *id)));
    let calls = callers.enumerate().map(|(k, (process, id))| async move {
        let token = process.token(&format!("caller-{k}"), Role::Customer);
        tokio::time::sleep(Duration::from_millis(50) * k as u32).await;
        let variables = json!({ "input": { "inventoryId": id } });
        let (status, body) = process.graphql(Some(&token), RESERVE, variables).await.expect("answered");
        assert_eq!(status, 200, "{body}");
        body
    });
    // Both batch statements run and wait for a lock; then the middle row goes.
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                   AND wait_event_type = 'Lock' AND query LIKE '%req AS MATERIALIZED%'";
    let release = async {
        eventually(Duration::from_secs(20), "both batches wait for a lock", || async { one.count(waiting).await == 2 })
            .await;
        holder.rollback().await.expect("let the middle row go");
    };
    let (answers, ()) = tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(join_all(calls), release) })
        .await
        .expect("every caller answered");
    for answer in answers {
        assert_eq!(answer["data"]["reserve"]["__typename"], "Reserved", "{answer}");
    }
    for process in [&one, &two] {
        assert_met_no_deadlock(process).await;
    }
    for (id, left) in ids.iter().zip([8, 8, 7]) {
        assert_eq!(one.count(&format!("SELECT stock::bigint FROM inventories WHERE id = '{id}'")).await, left);
    }
    let drifts = stockguard::invariant::check(&one.db).await.expect("check");
    assert!(drifts.is_empty(), "invariant broken: {drifts:?}");
    drop(two);
}

at_every_isolation! { opposite_batches_stopped_halfway_wait_instead_of_deadlocking; }
