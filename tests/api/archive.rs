//! Retention: `stockguard archive` deletes old done-with rows while servers
//! run, and the ledger still adds up at every moment.

use std::{process::Command, sync::Arc, time::Duration};

use futures::future::join_all;
use sea_orm::ConnectionTrait;
use serde_json::json;
use stockguard::{archive, auth::Role, db::Collisions, invariant};
use tokio::sync::Barrier;

use crate::helpers::{TestApp, uuid};

/// Reservations and ledger rows made 100 days ago: on two inventories, 40
/// reservations of which 30 released, and one released with a key.
async fn history(app: &TestApp) -> [uuid::Uuid; 2] {
    let ids = [app.create_inventory("OLD-A", 1000).await, app.create_inventory("OLD-B", 1000).await];
    for i in 0..40 {
        let token = app.token(&format!("old-{i}"), Role::Customer);
        let reserved = app.reserve(&token, json!({ "inventoryId": ids[i % 2] })).await;
        if i < 30 {
            let released = app.release(&token, uuid(&reserved["reservation"]["id"])).await;
            assert!(released.get("errors").is_none(), "{released}");
        }
    }
    let token = app.token("old-keyed", Role::Customer);
    let keyed = app.reserve(&token, json!({ "inventoryId": ids[0], "idempotencyKey": "old-key" })).await;
    app.release(&token, uuid(&keyed["reservation"]["id"])).await;
    app.db
        .execute_unprepared(
            "UPDATE reservations SET created_at = created_at - interval '100 days'; \
             UPDATE stock_movements SET created_at = created_at - interval '100 days';",
        )
        .await
        .expect("backdate");
    ids
}

#[tokio::test(flavor = "multi_thread")]
async fn archiving_under_concurrent_reserves_keeps_the_ledger_true_and_spares_recent_rows() {
    let app = Arc::new(TestApp::spawn().await);
    let ids = history(&app).await;
    let old_ledger = app.count("SELECT count(*) FROM stock_movements").await;
    assert_eq!(old_ledger, 2 + 41 + 31, "two creations, 41 reservations, 31 releases");

    // Reserves, an archive of small slices and checks, all at once.
    let barrier = Arc::new(Barrier::new(42));
    let reserves = (0..40).map(|i| {
        let (app, barrier) = (app.clone(), barrier.clone());
        tokio::spawn(async move {
            let token = app.token(&format!("new-{i}"), Role::Customer);
            barrier.wait().await;
            app.reserve(&token, json!({ "inventoryId": ids[i % 2] })).await
        })
    });
    let reserves: Vec<_> = reserves.collect();
    let archiving = tokio::spawn({
        let (app, barrier) = (app.clone(), barrier.clone());
        async move {
            barrier.wait().await;
            archive::archive(&app.db, &Collisions::new(20), Duration::from_secs(90 * 24 * 3600), 3).await
        }
    });
    let checking = tokio::spawn({
        let (app, barrier) = (app.clone(), barrier.clone());
        async move {
            barrier.wait().await;
            let mut drifts = Vec::new();
            for _ in 0..20 {
                drifts.extend(invariant::check(&app.db).await.expect("check"));
            }
            drifts
        }
    });
    let answers: Vec<_> = join_all(reserves).await.into_iter().map(|r| r.expect("task")).collect();
    let archived = archiving.await.expect("task").expect("archive");
    let drifts = checking.await.expect("task");

    assert!(answers.iter().all(|a| a["__typename"] == "Reserved"), "{answers:?}");
    assert!(drifts.is_empty(), "the check failed while the archive ran: {drifts:?}");
    assert_eq!((archived.reservations, archived.ledger_rows), (30, old_ledger as u64), "{archived:?}");
    assert!(archived.statements > 2, "batched: {archived:?}");
    // What is recent or still counts is all there.
    assert_eq!(app.count("SELECT count(*) FROM reservations WHERE created_at > now() - interval '1 day'").await, 40);
    assert_eq!(app.count("SELECT count(*) FROM stock_movements").await, 40);
    assert_eq!(app.count("SELECT count(*) FROM reservations WHERE status = 'ACTIVE'").await, 50);
    assert_eq!(app.count("SELECT count(*) FROM reservations WHERE idempotency_key = 'old-key'").await, 1);
    assert_eq!(app.count("SELECT count(*) FROM ledger_checkpoints").await, 2);
    assert_eq!(app.stock_and_version(ids[0]).await, (1000 - 5 - 20, 1 + 21 + 16 + 20));
    app.assert_invariant().await;

    // Once more: nothing old is left, and the checkpoints are not counted twice.
    let again = archive::archive(&app.db, &Collisions::new(20), Duration::from_secs(90 * 24 * 3600), 3).await;
    assert_eq!(again.map(|a| (a.reservations, a.ledger_rows)).expect("archive"), (0, 0));
    let check = stockguard(&["check", "--database-url", &app.database_url]);
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stdout));
}

fn stockguard(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_stockguard")).args(args).env_remove("DATABASE_URL").output().expect("run")
}

#[tokio::test(flavor = "multi_thread")]
async fn stockguard_archive_refuses_bad_ages_and_archives_a_good_one() {
    let app = TestApp::spawn().await;
    history(&app).await;
    let rows = || app.count("SELECT (SELECT count(*) FROM reservations) + (SELECT count(*) FROM stock_movements)");
    let before = rows().await;
    for bad in [
        &["--older-than", "0d"][..],
        &["--older-than", "12h"],
        &["--older-than", "90x"],
        &["--older-than", "-3d"],
        &["--older-than", "90"],
        &["--older-than", "90d", "--batch", "0"],
        &[],
    ] {
        let output = stockguard(&[&["archive", "--database-url", &app.database_url], bad].concat());
        assert_eq!(output.status.code(), Some(2), "{bad:?} is refused: {}", String::from_utf8_lossy(&output.stderr));
        assert_eq!(rows().await, before, "{bad:?} deleted nothing");
    }
    let output = stockguard(&["archive", "--database-url", &app.database_url, "--older-than", "90d"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(said.contains("archived 30 reservations and 74 ledger rows"), "{said}");
    app.assert_invariant().await;
}

/// Reservations and ledger rows refer to their inventory without a foreign
/// key (bench/results/decisions.md); what keeps them from pointing at
/// nothing is that an inventory, with or without rows, is never removed.
#[tokio::test(flavor = "multi_thread")]
async fn an_inventory_is_never_deleted_or_truncated() {
    let app = TestApp::spawn().await;
    let used = app.create_inventory("KEPT-USED", 10).await;
    let token = app.token("keeper", Role::Customer);
    let reserved = app.reserve(&token, json!({ "inventoryId": used })).await;
    assert_eq!(reserved["__typename"], "Reserved", "{reserved}");
    app.create_inventory("KEPT-NEW", 10).await;
    for sql in [
        format!("DELETE FROM inventories WHERE id = '{used}'"),
        "DELETE FROM inventories WHERE sku = 'KEPT-NEW'".to_owned(),
        "TRUNCATE inventories CASCADE".to_owned(),
    ] {
        let err = app.db.execute_unprepared(&sql).await.expect_err(&sql);
        assert!(err.to_string().contains("inventories are never removed"), "{sql}: {err}");
    }
    assert_eq!(app.count("SELECT count(*) FROM inventories").await, 2);
    app.assert_invariant().await;
}
