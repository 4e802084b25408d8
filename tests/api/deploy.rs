//! Several real server processes on one database, as a deployment runs
//! them: hot items coalesced by each process and together, the sweeper in
//! three processes, and the drain on SIGTERM that a rolling restart behind
//! a load balancer relies on.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::future::join_all;
use serde_json::{Value, json};
use stockguard::auth::Role;
use tokio::sync::Barrier;
use uuid::Uuid;

use crate::{
    helpers::{RESERVE, eventually},
    process::Process,
};

/// The value of an unlabelled counter in a process's `/metrics` (0 when absent).
async fn counter(process: &Process, name: &str) -> f64 {
    let text = process.client.get(format!("{}/metrics", process.address)).send().await.expect("metrics");
    let text = text.text().await.expect("metrics text");
    text.lines()
        .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread")]
async fn two_processes_on_one_hot_item_each_coalesce_and_together_grant_exactly_the_stock() {
    // A window long enough that each process's callers share batches.
    let env = [("STOCKGUARD_COALESCE_WINDOW_US", "20000")];
    let first = Arc::new(Process::start(&env).await);
    let second = Arc::new(Process::beside(&first, &env).await);
    // 150 units for 2 × 100 callers: whatever one process grants (at most
    // its 100), the other grants at least 50, so both have batches to show.
    let id = first.create_inventory("SIDE-BY-SIDE-1", 150).await;

    // 100 callers on each process, all at once.
    let barrier = Arc::new(Barrier::new(200));
    let calls = (0..200).map(|n| {
        let process = if n % 2 == 0 { first.clone() } else { second.clone() };
        let barrier = barrier.clone();
        tokio::spawn(async move {
            let token = process.token(&format!("user-{n}"), Role::Customer);
            barrier.wait().await;
            let answer = process.graphql(Some(&token), RESERVE, json!({ "input": { "inventoryId": id } })).await;
            (n % 2, answer.expect("answered").1["data"]["reserve"].clone())
        })
    });
    let answers: Vec<(usize, Value)> = join_all(calls).await.into_iter().map(|r| r.expect("task")).collect();

    let named = |name: &str| answers.iter().filter(|(_, a)| a["__typename"] == name).count();
    assert_eq!((named("Reserved"), named("SoldOut")), (150, 50), "only union members: {answers:?}");
    assert_eq!(first.count(&format!("SELECT stock::int8 FROM inventories WHERE id = '{id}'")).await, 0);
    for process in [0, 1] {
        let granted: Vec<Uuid> = answers
            .iter()
            .filter(|(p, a)| *p == process && a["__typename"] == "Reserved")
            .map(|(_, a)| a["reservation"]["id"].as_str().and_then(|id| id.parse().ok()).expect("an id"))
            .collect();
        assert!(granted.len() >= 50, "process {process} granted {} of the 150", granted.len());
        let ids = granted.iter().map(|id| format!("'{id}'")).collect::<Vec<_>>().join(",");
        // A row's `xmin` is the transaction that inserted it. Alone, each
        // grant is a transaction of its own; 100 callers released at once
        // into a 20 ms window share batches by the dozen. Three grants per
        // transaction on average at least: one pair that happened to share
        // a statement cannot meet that.
        let transactions =
            first.count(&format!("SELECT count(DISTINCT xmin::text) FROM reservations WHERE id IN ({ids})")).await;
        println!("process {process}: {transactions} transactions for {} grants", granted.len());
        assert!(
            transactions * 3 <= granted.len() as i64,
            "process {process}: {transactions} transactions for {} grants: it did not coalesce",
            granted.len()
        );
    }
    let drifts = stockguard::invariant::check(&first.db).await.expect("check");
    assert!(drifts.is_empty(), "{drifts:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sweepers_of_three_processes_return_each_expiry_once() {
    let env = [
        ("STOCKGUARD_RESERVATION_TTL_SECS", "1"),
        ("STOCKGUARD_SWEEP_INTERVAL_MS", "50"),
        ("STOCKGUARD_SWEEP_BATCH", "7"),
    ];
    let first = Process::start(&env).await;
    let others = [Process::beside(&first, &env).await, Process::beside(&first, &env).await];
    let processes: Vec<&Process> = std::iter::once(&first).chain(others.iter()).collect();
    let mut items = Vec::new();
    for i in 0..4 {
        items.push(first.create_inventory(&format!("SWEEP3-{i}"), 100).await);
    }
    // 90 reservations through all three; they expire a second later, some
    // while others are still being made.
    for n in 0..90 {
        let process = processes[n % 3];
        let token = process.token(&format!("user-{n}"), Role::Customer);
        let input = json!({ "inventoryId": items[n % 4], "quantity": 1 + n % 3 });
        let (_, body) = process.graphql(Some(&token), RESERVE, json!({ "input": input })).await.expect("answered");
        assert_eq!(body["data"]["reserve"]["__typename"], "Reserved", "{body}");
    }
    eventually(Duration::from_secs(30), "every reservation expires and is swept", || async {
        first.count("SELECT count(*) FROM reservations WHERE status = 'ACTIVE'").await == 0
    })
    .await;

    assert_eq!(first.count("SELECT count(*) FROM reservations WHERE status = 'EXPIRED'").await, 90);
    assert_eq!(first.count("SELECT count(*) FROM stock_movements WHERE reason = 'EXPIRED'").await, 90);
    let twice = "SELECT count(*) FROM (SELECT reservation_id FROM stock_movements WHERE reason = 'EXPIRED' \
                 GROUP BY reservation_id HAVING count(*) > 1) t";
    assert_eq!(first.count(twice).await, 0, "no expiry was returned twice");
    for item in &items {
        assert_eq!(first.count(&format!("SELECT stock::int8 FROM inventories WHERE id = '{item}'")).await, 100);
    }
    let mut swept = 0.0;
    for process in &processes {
        swept += counter(process, "stockguard_sweeper_expired_total").await;
    }
    assert_eq!(swept, 90.0, "the three sweepers together expired each reservation once");
    let drifts = stockguard::invariant::check(&first.db).await.expect("check");
    assert!(drifts.is_empty(), "{drifts:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn on_sigterm_readiness_turns_off_while_requests_are_served_then_the_process_exits_cleanly() {
    const DELAY: Duration = Duration::from_secs(4);
    let mut process = Process::start(&[("STOCKGUARD_SHUTDOWN_DELAY_MS", "4000")]).await;
    let id = process.create_inventory("DRAIN-1", 10).await;
    let alice = process.token("alice", Role::Customer);
    let readyz = |process: &Process| {
        let request = process.client.get(format!("{}/readyz", process.address)).send();
        async move { request.await.map(|r| r.status().as_u16()).unwrap_or(0) }
    };
    assert_eq!(readyz(&process).await, 200);

    process.terminate();
    let signalled = Instant::now();
    eventually(Duration::from_secs(3), "/readyz answers 503 after SIGTERM", || async { readyz(&process).await == 503 })
        .await;
    // Taken out of the load balancer, yet still serving whatever arrives.
    let (status, body) =
        process.graphql(Some(&alice), RESERVE, json!({ "input": { "inventoryId": id } })).await.expect("answered");
    assert_eq!((status, body["data"]["reserve"]["__typename"].as_str()), (200, Some("Reserved")), "{body}");
    assert!(signalled.elapsed() < DELAY, "the check ran inside the delay; the machine is too slow for this test");

    let status = process.exit_status(DELAY + Duration::from_secs(15)).await;
    assert!(status.success(), "exit {status:?}:\n{}", process.log());
    assert!(signalled.elapsed() >= DELAY, "stopped after {:?}, before the delay", signalled.elapsed());
    assert_eq!(process.count("SELECT count(*) FROM reservations").await, 1);
}
