//! Reservation lifecycle: expiry, the sweeper (also two at once), extension,
//! and the stock ledger read back through the API.

use std::{sync::Arc, time::Duration};

use futures::future::join_all;
use sea_orm::ConnectionTrait;
use serde_json::json;
use stockguard::{
    app::AppState,
    auth::{Keys, Role},
    config::{DatabaseConfig, Limits},
    db,
    reservations::sweeper,
    server::Server,
};
use tokio::sync::Barrier;
use uuid::Uuid;

use crate::{
    documents::{MOVEMENTS, RESERVATION_STATUS},
    helpers::{Isolation, TestApp, at_every_isolation, error_code, eventually, sweep_all},
};

/// Moves the expiry of these reservations into the past.
async fn expire(app: &TestApp, ids: &str) {
    app.db
        .execute_unprepared(&format!(
            "UPDATE reservations SET expires_at = now() - interval '1 second' WHERE id IN ({ids})"
        ))
        .await
        .expect("expire");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_reservation_expires_after_the_configured_ttl() {
    let app = TestApp::without_sweeper(Isolation::ReadCommitted).await;
    let id = app.create_inventory("TTL-1", 5).await;
    let alice = app.token("alice", Role::Customer);
    let reserved = app.reserve(&alice, json!({ "inventoryId": id })).await;
    let rid = reserved["reservation"]["id"].as_str().expect("reserved").to_owned();
    let ttl = app
        .count(&format!(
            "SELECT extract(epoch FROM expires_at - created_at)::bigint FROM reservations WHERE id = '{rid}'"
        ))
        .await;
    assert_eq!(ttl, 900, "the default TTL is 15 minutes");
    // Order lines never expire.
    let address =
        json!({ "name": "Alice", "line1": "1 Main St", "city": "Osaka", "postalCode": "530-0001", "country": "JP" });
    let placed = app.place_order(&alice, json!({ "items": [{ "inventoryId": id }], "shippingAddress": address })).await;
    assert_eq!(placed["__typename"], "OrderPlaced", "{placed}");
    assert_eq!(app.count("SELECT count(*) FROM reservations WHERE status = 'ORDERED'").await, 1, "an order line");
    let never =
        app.count("SELECT count(*) FROM reservations WHERE status = 'ORDERED' AND expires_at IS NOT NULL").await;
    assert_eq!(never, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_expired_reservation_reads_expired_cannot_be_released_and_the_sweep_returns_its_stock() {
    let app = TestApp::without_sweeper(Isolation::ReadCommitted).await;
    let id = app.create_inventory("EXP-1", 5).await;
    let alice = app.token("alice", Role::Customer);
    let reserved = app.reserve(&alice, json!({ "inventoryId": id, "quantity": 2 })).await;
    let rid = reserved["reservation"]["id"].as_str().expect("reserved").to_owned();
    expire(&app, &format!("'{rid}'")).await;

    // Expired from the moment it expires, before any sweep.
    let read = app.graphql(Some(&alice), RESERVATION_STATUS, json!({ "id": rid })).await;
    assert_eq!(read["data"]["reservation"]["status"], "EXPIRED", "{read}");
    let release = app.release(&alice, &rid).await;
    assert_eq!(release["__typename"], "ReservationNotActive", "{release}");
    let extend = app.extend(&alice, &rid, 60).await;
    assert_eq!(extend["__typename"], "ReservationNotActive", "{extend}");
    assert_eq!(app.stock_and_version(id).await, (3, 2), "nothing returned before the sweep");

    assert_eq!(sweeper::sweep_once(&app.db, 100).await.expect("sweep"), 1);
    assert_eq!(sweeper::sweep_once(&app.db, 100).await.expect("sweep again"), 0, "stock returns once");
    assert_eq!(app.stock_and_version(id).await, (5, 3));
    let movements = app
        .count(&format!("SELECT count(*) FROM stock_movements WHERE reason = 'EXPIRED' AND reservation_id = '{rid}'"))
        .await;
    assert_eq!(movements, 1);
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_running_sweeper_returns_expired_stock_by_itself() {
    let limits = Limits { reservation_ttl_secs: 1, sweep_interval_ms: 100, ..Limits::default() };
    let app = TestApp::spawn_configured(Isolation::ReadCommitted, limits).await;
    let id = app.create_inventory("EXP-2", 3).await;
    let alice = app.token("alice", Role::Customer);
    app.reserve(&alice, json!({ "inventoryId": id, "quantity": 3 })).await;
    assert_eq!(app.stock_and_version(id).await.0, 0);
    eventually(Duration::from_secs(10), "the sweeper returns the stock", || async {
        app.stock_and_version(id).await.0 == 3
    })
    .await;
    assert_eq!(app.stock_and_version(id).await, (3, 3));
    assert_eq!(app.count("SELECT count(*) FROM reservations WHERE status = 'EXPIRED'").await, 1);
    app.assert_invariant().await;
}

async fn two_sweepers_return_every_expired_unit_once(isolation: Isolation) {
    let app = Arc::new(TestApp::without_sweeper(isolation).await);
    let mut items: Vec<Uuid> = Vec::new();
    for i in 0..4 {
        items.push(app.create_inventory(&format!("SWEEP-{i}"), 100).await);
    }
    for (n, item) in (0..120).zip(items.iter().cycle()) {
        let token = app.token(&format!("user-{n}"), Role::Customer);
        let reserved = app.reserve(&token, json!({ "inventoryId": item, "quantity": 1 + n % 3 })).await;
        assert_eq!(reserved["__typename"], "Reserved", "{reserved}");
    }
    app.db
        .execute_unprepared("UPDATE reservations SET expires_at = now() - interval '1 second'")
        .await
        .expect("expire all");

    // A second server process on the same database, with its own pool and sweeper.
    let config = DatabaseConfig {
        database_url: Some(app.database_url.clone()),
        pool_size: 4,
        acquire_timeout_ms: 30_000,
        statement_timeout_ms: 30_000,
        ..DatabaseConfig::default()
    };
    let other = db::connect(&app.database_url, &config).await.expect("second pool");
    let limits = Limits { sweep_interval_ms: 10, sweep_batch: 7, ..Limits::default() };
    let keys = Keys::new(b"another-secret-of-thirty-two-bytes!!", 3600).expect("secret");
    let second = Server::new(AppState::new(other.clone(), keys, limits)).spawn_workers();
    // And eight sweeps by hand at once, in small batches, racing it.
    let barrier = Arc::new(Barrier::new(8));
    let sweeps = (0..8).map(|_| {
        let (app, barrier) = (app.clone(), barrier.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            // Two sweeps on one inventory collide, and run again.
            sweep_all(&app.db, 5).await
        })
    });
    let by_hand: i64 = join_all(sweeps).await.into_iter().map(|r| r.expect("task")).sum();
    eventually(Duration::from_secs(10), "every reservation is swept", || async {
        app.count("SELECT count(*) FROM reservations WHERE status = 'ACTIVE'").await == 0
    })
    .await;
    second.shutdown().await;

    assert_eq!(app.count("SELECT count(*) FROM reservations WHERE status = 'EXPIRED'").await, 120);
    assert_eq!(app.count("SELECT count(*) FROM stock_movements WHERE reason = 'EXPIRED'").await, 120);
    assert!(by_hand <= 120, "{by_hand} expired by hand");
    for item in &items {
        assert_eq!(app.stock_and_version(*item).await.0, 100, "every unit back, once");
    }
    app.assert_invariant().await;
}

at_every_isolation! { two_sweepers_return_every_expired_unit_once; }

#[tokio::test(flavor = "multi_thread")]
async fn extending_moves_the_expiry_up_to_the_cap_for_the_owner_only() {
    let app = TestApp::without_sweeper(Isolation::ReadCommitted).await;
    let id = app.create_inventory("EXT-1", 5).await;
    let (alice, bob) = (app.token("alice", Role::Customer), app.token("bob", Role::Customer));
    let reserved = app.reserve(&alice, json!({ "inventoryId": id })).await;
    let rid = reserved["reservation"]["id"].as_str().expect("reserved").to_owned();
    let expiry = |answer: &serde_json::Value| {
        chrono::DateTime::parse_from_rfc3339(answer["reservation"]["expiresAt"].as_str().expect("expiresAt"))
            .expect("rfc3339")
    };
    let before = chrono::DateTime::parse_from_rfc3339(
        app.graphql(Some(&alice), RESERVATION_STATUS, json!({ "id": rid })).await["data"]["reservation"]["expiresAt"]
            .as_str()
            .expect("at"),
    )
    .expect("rfc3339");

    let extended = app.extend(&alice, &rid, 60).await;
    assert_eq!((expiry(&extended) - before).num_seconds(), 60, "{extended}");
    // Far past the cap: held at one hour from now.
    let capped = app.extend(&alice, &rid, 3600).await;
    let from_now = (expiry(&capped).with_timezone(&chrono::Utc) - chrono::Utc::now()).num_seconds();
    assert!((3590..=3600).contains(&from_now), "capped at the maximum: {from_now} s");

    let snapshot = app.snapshot().await;
    for seconds in [0, -5, 3601] {
        let refused = app.extend(&alice, &rid, seconds).await;
        assert_eq!(error_code(&refused), Some("BAD_USER_INPUT"), "{refused}");
    }
    let bobs = app.extend(&bob, &rid, 60).await;
    assert_eq!(bobs["__typename"], "ReservationNotFound");
    assert_eq!(app.snapshot().await, snapshot, "extensions do not touch stock or versions");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ledger_reads_back_every_change_for_operators_only() {
    let app = TestApp::without_sweeper(Isolation::ReadCommitted).await;
    let id = app.create_inventory("LEDGER-1", 10).await;
    let alice = app.token("alice", Role::Customer);
    let reserved = app.reserve(&alice, json!({ "inventoryId": id, "quantity": 3 })).await;
    let rid = reserved["reservation"]["id"].as_str().expect("reserved").to_owned();
    app.release(&alice, &rid).await;
    app.restock(&app.operator(), json!({ "inventoryId": id, "quantity": 5 })).await;

    let mut rows = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let body = app.graphql(Some(&app.operator()), MOVEMENTS, json!({ "id": id, "first": 2, "after": after })).await;
        let connection = &body["data"]["inventory"]["movements"];
        rows.extend(connection["nodes"].as_array().expect("nodes").iter().cloned());
        if connection["pageInfo"]["hasNextPage"] != true {
            break;
        }
        after = connection["pageInfo"]["endCursor"].as_str().map(str::to_owned);
    }
    let reasons: Vec<&str> = rows.iter().map(|r| r["reason"].as_str().expect("reason")).collect();
    assert_eq!(reasons, ["CREATED", "RESERVED", "RELEASED", "RESTOCKED"]);
    let deltas: Vec<i64> = rows.iter().map(|r| r["delta"].as_i64().expect("delta")).collect();
    assert_eq!(deltas, [10, -3, 3, 5]);
    let versions: Vec<i64> = rows.iter().map(|r| r["versionAfter"].as_i64().expect("version")).collect();
    assert_eq!(versions, [1, 2, 3, 4]);
    assert_eq!(rows[1]["reservationId"], rid.as_str());
    assert_eq!(rows[3]["stockAfter"], 15);

    let as_customer = app.graphql(Some(&alice), MOVEMENTS, json!({ "id": id })).await;
    assert_eq!(error_code(&as_customer), Some("FORBIDDEN"), "{as_customer}");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_sweeper_ends_after_the_sweep_it_is_in_not_after_its_tick() {
    let app = TestApp::without_sweeper(Isolation::ReadCommitted).await;
    let id = app.create_inventory("SWEEP-STOP", 300).await;
    let alice = app.token("alice", Role::Customer);
    for _ in 0..300 {
        let reserved = app.reserve(&alice, json!({ "inventoryId": id })).await;
        assert_eq!(reserved["__typename"], "Reserved", "{reserved}");
    }
    app.db.execute_unprepared("UPDATE reservations SET expires_at = now() - interval '1 second'").await.expect("due");
    // One reservation a sweep: a tick runs up to a hundred sweeps back to back.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let sweeping = sweeper::spawn(app.db.clone(), Duration::from_millis(1), 1, stopped);
    let expired = "SELECT count(*) FROM reservations WHERE status = 'EXPIRED'";
    eventually(Duration::from_secs(10), "the first sweep", || async { app.count(expired).await > 0 }).await;
    stop.send(true).expect("the sweeper listens");
    sweeping.await.expect("the sweeper ends");
    let swept = app.count(expired).await;
    assert!(swept < 100, "{swept} expired: the sweeper went on with its tick after the stop");
    app.assert_invariant().await;
}
