//! Retention: `stockguard archive` deletes old done-with rows while servers
//! run, and the ledger still adds up at every moment; it forgets old
//! idempotency keys whole.

use std::{process::Command, sync::Arc, time::Duration};

use futures::future::join_all;
use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};
use serde_json::json;
use stockguard::{archive, auth::Role, db::Collisions, invariant, stock};
use tokio::sync::Barrier;

use crate::helpers::{Isolation, TestApp, address, at_every_isolation, uuid};

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
    // The ledger of 100 days ago had its day partitions; the backdated rows
    // move into them.
    stock::partitions::make(&app.db, 101, -100).await.expect("the partitions of 100 days ago");
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
    let old_partitions =
        "SELECT count(*) FROM ledger_days() WHERE day < (now() AT TIME ZONE 'UTC' - interval '99 days')::date";
    assert_eq!(app.count(old_partitions).await, 2, "the days 100 and 101 days ago");
    assert_eq!(app.count("SELECT count(*) FROM stock_movements_default").await, 0, "every row in its day");

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
    // Dropping a day takes the whole ledger's lock for a moment and waits
    // for it at most 200 ms: with writers queued on the ledger the archive
    // may leave an emptied day to the next run, never a day with rows.
    assert!(archived.partitions <= 2, "{archived:?}");
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
    let again = again.expect("archive");
    assert_eq!((again.reservations, again.ledger_rows), (0, 0));
    let dropped = archived.partitions + again.partitions;
    assert_eq!((dropped, app.count(old_partitions).await), (2, 0), "the emptied days dropped, once");
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

/// A change over two locations writes two ledger rows at one version; the
/// archive counts it once, keeps each location's sums in its level
/// checkpoint, and takes a deleted reservation's allocations with it, so
/// the check holds throughout and after.
async fn archiving_a_ledger_over_two_locations_keeps_every_level_true(isolation: Isolation) {
    use crate::invariant::{EAST, HOME, RELEASED, SPLIT, two_locations};
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    stock::partitions::make(&app.db, 101, -100).await.expect("the partitions of 100 days ago");
    two_locations(&app, "now() - interval '100 days'").await;
    app.assert_invariant().await;

    let barrier = Arc::new(Barrier::new(2));
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
    barrier.wait().await;
    let archived = archive::archive(&app.db, &Collisions::new(20), Duration::from_secs(90 * 24 * 3600), 2).await;
    let archived = archived.expect("archive");
    assert_eq!(checking.await.expect("task"), vec![], "the check failed while the archive ran");
    assert_eq!((archived.reservations, archived.ledger_rows), (1, 12), "{archived:?}");
    assert!(archived.statements > 4, "an hour apart, in slices: {archived:?}");

    assert_eq!(app.count("SELECT count(*) FROM stock_movements").await, 0);
    assert_eq!(app.count(&format!("SELECT count(*) FROM allocations WHERE reservation_id = '{RELEASED}'")).await, 0);
    assert_eq!(app.count("SELECT count(*) FROM allocations").await, 4, "those of lines that count stay");
    let checkpoints = app.rows("SELECT inventory_id, changes, version_after FROM ledger_checkpoints").await;
    let mut checkpoints: Vec<_> =
        checkpoints.iter().map(|c| (uuid(&c["inventory_id"]), c["changes"].as_i64())).collect();
    checkpoints.sort();
    assert_eq!(checkpoints, vec![(SPLIT, Some(9)), (HOME, Some(1))], "a change of two rows counts once");
    let levels = app
        .rows(
            "SELECT c.inventory_id, l.code, c.stock, c.on_hand FROM ledger_checkpoint_levels c \
               JOIN locations l ON l.id = c.location_id",
        )
        .await;
    let mut levels: Vec<_> = levels
        .iter()
        .map(|c| {
            (
                uuid(&c["inventory_id"]),
                c["code"].as_str().unwrap_or_default().to_owned(),
                c["stock"].as_i64(),
                c["on_hand"].as_i64(),
            )
        })
        .collect();
    levels.sort();
    assert_eq!(
        levels,
        vec![
            (SPLIT, "default".to_owned(), Some(3), Some(7)),
            (SPLIT, "east".to_owned(), Some(3), Some(7)),
            (HOME, "default".to_owned(), Some(4), Some(4)),
        ],
        "rows without a location counted at the default one; {EAST} kept apart"
    );
    app.assert_invariant().await;
}

at_every_isolation! {
    archiving_a_ledger_over_two_locations_keeps_every_level_true;
}

/// Reservations and ledger rows refer to their inventory without a foreign
/// key (bench/results/decisions.md#per-row-costs-of-a-coalesced-batch-14-callers-14-inventories:
/// a coalesced batch took 81–88 µs a row with them, 73–83 without); what keeps them from pointing at
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

/// The ledger has a partition per day (UTC), so history leaves today's
/// guard index small; processes starting together make the days ahead once.
#[tokio::test(flavor = "multi_thread")]
async fn todays_ledger_rows_go_to_todays_partition_made_once_by_processes_racing_for_it() {
    let app = Arc::new(TestApp::spawn().await);
    let id = app.create_inventory("TODAY-1", 10).await;
    let token = app.token("today", Role::Customer);
    assert_eq!(app.reserve(&token, json!({ "inventoryId": id })).await["__typename"], "Reserved");
    let where_rows = app
        .rows(
            "SELECT tableoid::regclass::text AS part, count(*) AS n FROM stock_movements \
              WHERE inventory_id IN (SELECT id FROM inventories WHERE sku = 'TODAY-1') GROUP BY 1",
        )
        .await;
    let today = app.rows("SELECT 'stock_movements_' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD') AS part").await;
    assert_eq!(where_rows, vec![json!({ "part": today[0]["part"], "n": 2 })], "created and reserved, today");

    // The guard is the day's: a version written twice at one location is refused.
    let twice = app
        .db
        .execute_unprepared(&format!(
            "INSERT INTO stock_movements (inventory_id, delta, reason, stock_after, version_after, location_id) \
             SELECT '{id}', 0, 'RESTOCKED', 9, 2, id FROM locations WHERE code = 'default'"
        ))
        .await;
    assert!(twice.is_err_and(|e| e.to_string().contains("duplicate key")), "version 2 is taken");

    // Eight processes' upkeep at once, for the next 40 days.
    let days_made = "SELECT count(*) FROM ledger_days() WHERE day >= (now() AT TIME ZONE 'UTC')::date";
    let before = app.count(days_made).await;
    assert!(before > i64::from(stock::partitions::DAYS_AHEAD), "today and a week ahead are ready: {before}");
    let barrier = Arc::new(Barrier::new(8));
    let racing = (0..8).map(|_| {
        let (app, barrier) = (app.clone(), barrier.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            stock::partitions::make(&app.db, 0, 40).await
        })
    });
    let made: Vec<i32> = join_all(racing).await.into_iter().map(|r| r.expect("task").expect("made")).collect();
    assert_eq!(app.count(days_made).await, 41, "today and the next 40 days, one partition each");
    assert_eq!(made.iter().map(|&n| i64::from(n)).sum::<i64>(), 41 - before, "each day made once: {made:?}");
}

/// An existing ledger is not copied by the migration that partitions it: it
/// becomes the partition of everything up to tomorrow, whole, and the days
/// after it get partitions of their own.
#[tokio::test(flavor = "multi_thread")]
async fn a_ledger_from_before_partitioning_stays_whole_and_later_days_get_their_own() {
    use migration::{Migrator, MigratorTrait};
    let server = crate::helpers::server_url();
    let name = format!("sg_test_{}", uuid::Uuid::new_v4().simple());
    let admin = sea_orm::Database::connect(format!("{server}/postgres")).await.expect("connect");
    admin.execute_unprepared(&format!("CREATE DATABASE \"{name}\"")).await.expect("create the database");
    let url = format!("{server}/{name}");
    let upgraded = async {
        let db = sea_orm::Database::connect(&url).await.expect("connect");
        let partitioning = Migrator::migrations()
            .iter()
            .position(|m| m.name() == "m20261205_090000_partition_the_ledger_by_day")
            .expect("the partitioning migration");
        Migrator::up(&db, Some(partitioning as u32)).await.expect("the migrations before partitioning");
        db.execute_unprepared(
            "INSERT INTO stock_movements (inventory_id, delta, reason, stock_after, version_after, created_at) \
             SELECT gen_random_uuid(), 5, 'CREATED', 5, 1, now() - g * interval '1 day' FROM generate_series(0, 9) g",
        )
        .await
        .expect("a ledger of ten days");
        Migrator::up(&db, None).await.expect("partition the ledger");
        let rows = |sql: &'static str| {
            let db = &db;
            async move {
                let row = db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await.expect("query");
                row.expect("row").try_get_by_index::<String>(0).expect("text")
            }
        };
        let kept = rows("SELECT string_agg(DISTINCT tableoid::regclass::text, ',') || ':' || count(*) FROM stock_movements").await;
        let later = rows(
            "INSERT INTO stock_movements (inventory_id, delta, reason, stock_after, version_after, created_at) \
             VALUES (gen_random_uuid(), 5, 'CREATED', 5, 1, now() + interval '2 days') \
             RETURNING (tableoid::regclass::text = 'stock_movements_' || to_char(created_at AT TIME ZONE 'UTC', 'YYYYMMDD'))::text",
        )
        .await;
        db.close().await.expect("close");
        (kept, later)
    }
    .await;
    admin.execute_unprepared(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")).await.expect("drop");
    admin.close().await.expect("close");
    assert_eq!(upgraded, ("stock_movements_before:10".to_owned(), "true".to_owned()));
}

/// A deployment may serve with a role that cannot create tables (one role
/// migrates, another serves): the days ahead are made all the same.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_role_that_may_not_create_tables_still_makes_the_days_ahead() {
    let app = TestApp::spawn().await;
    let role = format!("sg_test_role_{}", uuid::Uuid::new_v4().simple());
    app.db.execute_unprepared(&format!("CREATE ROLE {role} NOLOGIN")).await.expect("a role of its own");
    let as_role = async {
        let txn = app.db.begin().await?;
        txn.execute_unprepared(&format!("SET LOCAL ROLE {role}")).await?;
        txn.execute_unprepared("SAVEPOINT s").await?;
        let refused = txn.execute_unprepared("CREATE TABLE may_not (x int)").await.err().map(|e| e.to_string());
        txn.execute_unprepared("ROLLBACK TO SAVEPOINT s").await?;
        txn.execute_unprepared(
            "SELECT ledger_partitions((now() AT TIME ZONE 'UTC')::date + 50, (now() AT TIME ZONE 'UTC')::date + 51)",
        )
        .await?;
        txn.commit().await.map(|()| refused)
    }
    .await;
    app.db.execute_unprepared(&format!("DROP ROLE {role}")).await.expect("drop the role it made");
    let refused = as_role.expect("the role makes partitions through the function, not by itself");
    assert!(refused.is_some_and(|e| e.contains("permission denied")), "the role itself creates no table");
    let made =
        app.count("SELECT count(*) FROM ledger_days() WHERE day - (now() AT TIME ZONE 'UTC')::date IN (50, 51)").await;
    assert_eq!(made, 2);
}

/// A process that starts after every day made ahead has passed (the
/// servers down for a week) makes today's partition before it serves, so
/// today's rows do not go to the default partition.
#[tokio::test(flavor = "multi_thread")]
async fn a_process_started_past_its_days_ahead_makes_today_before_anything_else() {
    let app = TestApp::spawn().await;
    app.db
        .execute_unprepared(
            "DO $$ DECLARE part regclass; BEGIN \
               FOR part IN SELECT d.part FROM ledger_days() d LOOP EXECUTE format('DROP TABLE %s', part); END LOOP; \
             END $$",
        )
        .await
        .expect("no day partitions left");
    let today = "SELECT count(*) FROM ledger_days() WHERE day = (now() AT TIME ZONE 'UTC')::date";
    assert_eq!(app.count(today).await, 0);
    let check = stockguard(&["check", "--database-url", &app.database_url]);
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    assert_eq!(app.count(today).await, 1, "made when the process opened the database");
}

/// Keys follow the archive's retention. A key claimed before the cutoff is
/// forgotten whole: its claim and its released line go, its held line and
/// its order's line stay without it, and the same request is then a new
/// one. A key claimed since still replays its first outcome.
#[tokio::test(flavor = "multi_thread")]
async fn an_archived_key_is_forgotten_whole_and_a_recent_one_still_replays() {
    let app = TestApp::spawn().await;
    let item = app.create_inventory("KEYS-1", 100).await;
    let alice = app.token("alice", Role::Customer);
    let reserve = |key: &str| json!({ "inventoryId": item, "idempotencyKey": key });
    let released = app.reserve(&alice, reserve("old-released")).await;
    let released = uuid(&released["reservation"]["id"]);
    assert!(app.release(&alice, released).await.get("errors").is_none());
    let held = app.reserve(&alice, reserve("old-held")).await;
    let order = json!({ "items": [{ "inventoryId": item, "quantity": 2 }], "shippingAddress": address("1 Old Street"), "idempotencyKey": "old-order" });
    let ordered = app.place_order(&alice, order.clone()).await;
    assert_eq!(ordered["__typename"], "OrderPlaced", "{ordered}");
    let recent = app.reserve(&alice, reserve("recent")).await;
    assert!(app.release(&alice, uuid(&recent["reservation"]["id"])).await.get("errors").is_none());
    // The old keys (and the rows written with them) were claimed 100 days ago.
    app.db
        .execute_unprepared(
            "UPDATE idempotency_keys SET created_at = created_at - interval '100 days' WHERE idempotency_key LIKE 'old-%'; \
             UPDATE reservations SET created_at = created_at - interval '100 days' WHERE idempotency_key LIKE 'old-%'",
        )
        .await
        .expect("backdate");

    let archived = archive::archive(&app.db, &Collisions::new(20), Duration::from_secs(90 * 24 * 3600), 10).await;
    let archived = archived.expect("archive");
    assert_eq!((archived.keys, archived.reservations), (3, 1), "{archived:?}");
    let keyed = "SELECT (SELECT count(*) FROM idempotency_keys WHERE idempotency_key LIKE 'old-%') \
                      + (SELECT count(*) FROM reservations WHERE idempotency_key LIKE 'old-%')";
    assert_eq!(app.count(keyed).await, 0, "no claim and no line keeps an old key");
    let gone = format!(
        "SELECT (SELECT count(*) FROM reservations WHERE id = '{released}') \
              + (SELECT count(*) FROM allocations WHERE reservation_id = '{released}')"
    );
    assert_eq!(app.count(&gone).await, 0, "the released line went, with its allocation");
    let kept = app
        .rows(&format!(
            "SELECT status, request_fingerprint IS NULL AS unkeyed FROM reservations \
              WHERE id = '{}' OR order_id = '{}' ORDER BY status",
            uuid(&held["reservation"]["id"]),
            uuid(&ordered["order"]["id"])
        ))
        .await;
    assert_eq!(
        kept,
        vec![json!({ "status": "ACTIVE", "unkeyed": true }), json!({ "status": "ORDERED", "unkeyed": true })],
        "the lines that hold stock stay, without the key"
    );
    app.assert_invariant().await;

    // The recent key replays; each forgotten one is a new request, and then
    // a key remembered again.
    let replayed = app.reserve(&alice, reserve("recent")).await;
    assert_eq!(replayed["reservation"]["id"], recent["reservation"]["id"], "{replayed}");
    for key in ["old-released", "old-held"] {
        let again = app.reserve(&alice, reserve(key)).await;
        assert_eq!(again["__typename"], "Reserved", "{key}: {again}");
        assert_ne!(again["reservation"]["id"], held["reservation"]["id"], "{key}");
        assert_ne!(uuid(&again["reservation"]["id"]), released, "{key}");
        let replayed = app.reserve(&alice, reserve(key)).await;
        assert_eq!(replayed["reservation"]["id"], again["reservation"]["id"], "{key}: {replayed}");
    }
    let again = app.place_order(&alice, order).await;
    assert_eq!(again["__typename"], "OrderPlaced", "{again}");
    assert_ne!(again["order"]["id"], ordered["order"]["id"], "a new order");
    assert_eq!(app.stock_and_version(item).await.0, 100 - 1 - 2 - 1 - 1 - 2, "the old holds, and the new ones");
    app.assert_invariant().await;
}

/// Forgetting keys while their lines are released: each line goes, by the
/// key it had or afterwards as a done line without one, and no line keeps
/// a key that nothing remembers (which would refuse that key for good).
#[tokio::test(flavor = "multi_thread")]
async fn keys_forgotten_while_their_lines_are_released_leave_no_line_behind() {
    let app = Arc::new(TestApp::spawn().await);
    let item = app.create_inventory("KEYS-RACE", 100).await;
    let alice = app.token("alice", Role::Customer);
    let mut held = Vec::new();
    for i in 0..20 {
        let reserved = app.reserve(&alice, json!({ "inventoryId": item, "idempotencyKey": format!("race-{i}") })).await;
        held.push(uuid(&reserved["reservation"]["id"]));
    }
    app.db
        .execute_unprepared(
            "UPDATE idempotency_keys SET created_at = created_at - interval '100 days'; \
             UPDATE reservations SET created_at = created_at - interval '100 days'",
        )
        .await
        .expect("backdate");

    let barrier = Arc::new(Barrier::new(held.len() + 1));
    let releases: Vec<_> = held
        .iter()
        .map(|&id| {
            let (app, barrier, alice) = (app.clone(), barrier.clone(), alice.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                app.release(&alice, id).await
            })
        })
        .collect();
    barrier.wait().await;
    let archived = archive::archive(&app.db, &Collisions::new(20), Duration::from_secs(90 * 24 * 3600), 1).await;
    for released in join_all(releases).await {
        let released = released.expect("task");
        assert_eq!(released["__typename"], "ReservationReleased", "{released}");
    }
    let archived = archived.expect("archive");
    assert_eq!(archived.keys, 20, "{archived:?}");

    let keyed = "SELECT (SELECT count(*) FROM idempotency_keys) \
                      + (SELECT count(*) FROM reservations WHERE idempotency_key IS NOT NULL)";
    assert_eq!(app.count(keyed).await, 0, "no key is remembered, by a claim or by a line");
    // A line released after the archive passed it is an ordinary done line.
    let again = archive::archive(&app.db, &Collisions::new(20), Duration::from_secs(90 * 24 * 3600), 1).await;
    let again = again.expect("archive");
    assert_eq!(archived.reservations + again.reservations, 20, "every line went once: {archived:?} {again:?}");
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 0);
    assert_eq!(app.stock_and_version(item).await.0, 100);
    app.assert_invariant().await;
    for i in 0..20 {
        let reserved = app.reserve(&alice, json!({ "inventoryId": item, "idempotencyKey": format!("race-{i}") })).await;
        assert_eq!(reserved["__typename"], "Reserved", "a new request: {reserved}");
    }
}
