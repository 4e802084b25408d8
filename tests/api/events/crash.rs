//! PostgreSQL itself crashing under load, on a private cluster of the
//! test's own: a backend killed with SIGKILL makes the postmaster end every
//! backend and replay the WAL, which undoes the events' connections' last
//! commits if they were not yet flushed (they do not wait for the disk,
//! src/events/mod.rs). No event is lost and none is invented, first
//! arrivals stay in order, and every signature verifies.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use rand::{RngExt as _, SeedableRng, rngs::StdRng};
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use serde_json::json;
use stockguard::auth::Role;

use super::{
    assert_in_order, first_arrivals, ledger_changes, limits, receiver::Receiver, stock_changes, subscribe,
    until_delivered, verifies,
};
use crate::{
    faults::restart::{PrivateCluster, any},
    helpers::{Options, TestApp, eventually},
};

/// Fixed, so a failure reproduces.
const SEED: u64 = 0x2738;

/// Whether the database answers.
async fn answers(app: &TestApp) -> bool {
    any(&app.db, "SELECT 1::bigint").await
}

/// Kills one of the cluster's backends with SIGKILL, the events' own when
/// one is open; whether one was found.
async fn crash(app: &TestApp) -> bool {
    let sql = "SELECT pid FROM pg_stat_activity
                WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
                ORDER BY application_name = 'stockguard-events' DESC LIMIT 1";
    let Ok(Some(row)) = app.db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await else {
        return false;
    };
    let pid: i32 = row.try_get("", "pid").expect("a pid");
    std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().is_ok_and(|s| s.success())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_of_postgresql_under_load_loses_no_event() {
    let cluster = PrivateCluster::start().await;
    let app = Arc::new(
        TestApp::spawn_with_options(Options { limits: limits(&[0.05; 20]), pool_size: 6, ..cluster.options() }).await,
    );
    let receiver = Receiver::start().await;
    let secret = subscribe(&app, &receiver).await;
    let items = [app.create_inventory("CRASH-A", 1_000_000).await, app.create_inventory("CRASH-B", 1_000_000).await];

    // Eight clients reserve and release until told to stop; a request that
    // fails while the database recovers is not retried.
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..8)
        .map(|n| {
            let (app, stop, answered) = (app.clone(), stop.clone(), answered.clone());
            tokio::spawn(async move {
                let token = app.token(&format!("crash-{n}"), Role::Customer);
                let mut rng = StdRng::seed_from_u64(SEED + n);
                while !stop.load(Ordering::Relaxed) {
                    let item = items[rng.random_range(0..items.len())];
                    let reserved = app.reserve(&token, json!({ "inventoryId": item })).await;
                    if let Some(id) = reserved["reservation"]["id"].as_str() {
                        answered.fetch_add(1, Ordering::Relaxed);
                        if rng.random_bool(0.5) {
                            app.release(&token, id).await;
                        }
                    }
                }
            })
        })
        .collect();

    // Three crashes at random instants, each once the database answers again.
    let mut rng = StdRng::seed_from_u64(SEED);
    let mut crashes = 0;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..1200))).await;
        eventually(Duration::from_secs(30), "the database answers", || answers(&app)).await;
        if crash(&app).await {
            crashes += 1;
        }
    }
    eventually(Duration::from_secs(30), "the database answers after the last crash", || answers(&app)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.expect("client");
    }
    assert_eq!(crashes, 3, "three backends killed");

    eventually(Duration::from_secs(30), "the database answers", || answers(&app)).await;
    let committed = ledger_changes(&app.db, &items).await;
    until_delivered(&receiver, &committed, Duration::from_secs(60), "every committed change delivered").await;
    let first = first_arrivals(&receiver.accepted_events());
    let delivered = stock_changes(&first);
    assert_eq!(delivered.iter().copied().collect::<std::collections::BTreeSet<_>>(), committed, "one per change");
    assert_eq!(delivered.len(), committed.len(), "one first arrival per change");
    assert_in_order(&first);
    for received in receiver.received() {
        assert!(verifies(&secret, &received.signature, &received.body), "signature of {}", received.delivery);
    }
    eprintln!(
        "a_crash_of_postgresql_under_load_loses_no_event (seed {SEED:#x}): {crashes} crashes, {} reservations \
         answered, {} changes committed, {} bodies received",
        answered.load(Ordering::Relaxed),
        committed.len(),
        receiver.received().len()
    );
    drop(app);
    drop(cluster);
}
