//! `db::classify` against real PostgreSQL errors: each SQLSTATE Stockguard
//! acts on is produced for real and must land in its class; and the
//! statement pool's handling of failed connections.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, TransactionTrait, sqlx};
use serde_json::json;
use stockguard::{
    config::DatabaseConfig,
    db::{self, DbFailure, StatementPool, classify},
    stock::receiving,
};

use crate::helpers::{TestApp, eventually, server_url};

async fn pool(app: &TestApp, size: u32) -> DatabaseConnection {
    let config = DatabaseConfig {
        pool_size: size,
        acquire_timeout_ms: 10_000,
        statement_timeout_ms: 10_000,
        ..DatabaseConfig::default()
    };
    db::connect(&app.database_url, &config).await.expect("connect")
}

fn failure(result: Result<sea_orm::ExecResult, DbErr>) -> DbFailure {
    classify(&result.expect_err("the statement must fail"))
}

#[tokio::test(flavor = "multi_thread")]
async fn constraint_and_range_errors_are_classified() {
    let app = TestApp::spawn().await;
    app.create_inventory("DUP-1", 1).await;
    let insert = "INSERT INTO inventories (id, sku, name, stock) VALUES (gen_random_uuid(), 'DUP-1', 'x', 1)";
    assert_eq!(
        failure(app.db.execute_unprepared(insert).await),
        DbFailure::UniqueViolation(Some("inventories_sku_key".into()))
    );
    let negative = "INSERT INTO inventories (id, sku, name, stock) VALUES (gen_random_uuid(), 'NEG-1', 'x', -1)";
    assert_eq!(
        failure(app.db.execute_unprepared(negative).await),
        DbFailure::CheckViolation(Some("inventories_stock_check".into()))
    );
    let overflow =
        "INSERT INTO inventories (id, sku, name, stock) VALUES (gen_random_uuid(), 'BIG-1', 'x', 2147483647 + 1)";
    assert_eq!(failure(app.db.execute_unprepared(overflow).await), DbFailure::OutOfRange);

    // 42P04: a database of that name exists already.
    let name = app.database_url.rsplit('/').next().expect("database name");
    let admin = sea_orm::Database::connect(format!("{}/postgres", server_url())).await.expect("connect");
    let again = admin.execute_unprepared(&format!("CREATE DATABASE \"{name}\"")).await;
    assert_eq!(failure(again), DbFailure::DuplicateDatabase);
    admin.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_serialization_failure_and_a_deadlock_are_collisions() {
    let app = TestApp::spawn().await;
    let a = app.create_inventory("RACE-A", 10).await;
    let b = app.create_inventory("RACE-B", 10).await;
    let db = pool(&app, 4).await;

    // 40001: a REPEATABLE READ transaction locks a row changed after its snapshot.
    let txn = db.begin().await.expect("begin");
    txn.execute_unprepared("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ").await.expect("isolation");
    txn.execute_unprepared("SELECT 1 FROM inventories").await.expect("snapshot");
    db.execute_raw(receiving::restock(a, 1, None, None)).await.expect("a concurrent restock");
    let err = failure(txn.execute_unprepared(&format!("SELECT 1 FROM inventories WHERE id = '{a}' FOR UPDATE")).await);
    assert_eq!(err, DbFailure::SerializationFailure);
    assert!(err.is_collision());
    drop(txn);

    // 40P01: two transactions lock A and B in opposite orders.
    let first = db.begin().await.expect("begin");
    let second = db.begin().await.expect("begin");
    first.execute_unprepared(&format!("SELECT 1 FROM inventories WHERE id = '{a}' FOR UPDATE")).await.expect("lock a");
    second.execute_unprepared(&format!("SELECT 1 FROM inventories WHERE id = '{b}' FOR UPDATE")).await.expect("lock b");
    let (sql_b, sql_a) = (
        format!("SELECT 1 FROM inventories WHERE id = '{b}' FOR UPDATE"),
        format!("SELECT 1 FROM inventories WHERE id = '{a}' FOR UPDATE"),
    );
    let (lock_b, lock_a) = (first.execute_unprepared(&sql_b), second.execute_unprepared(&sql_a));
    let (one, other) = tokio::join!(lock_b, lock_a);
    let deadlocked: Vec<DbFailure> = [one, other].into_iter().filter_map(Result::err).map(|e| classify(&e)).collect();
    assert_eq!(deadlocked, vec![DbFailure::Deadlock], "PostgreSQL breaks the cycle by failing one side");
    assert!(deadlocked[0].is_collision());
}

#[tokio::test(flavor = "multi_thread")]
async fn lock_and_statement_timeouts_are_classified() {
    let app = TestApp::spawn().await;
    let a = app.create_inventory("WAIT-A", 10).await;
    let db = pool(&app, 4).await;
    let holder = db.begin().await.expect("begin");
    holder.execute_unprepared(&format!("SELECT 1 FROM inventories WHERE id = '{a}' FOR UPDATE")).await.expect("hold");
    let waiter = db.begin().await.expect("begin");
    waiter.execute_unprepared("SET LOCAL lock_timeout = '50ms'").await.expect("lock_timeout");
    let err =
        failure(waiter.execute_unprepared(&format!("SELECT 1 FROM inventories WHERE id = '{a}' FOR UPDATE")).await);
    assert_eq!(err, DbFailure::LockNotAvailable);
    drop(waiter);
    drop(holder);

    let slow = db.begin().await.expect("begin");
    slow.execute_unprepared("SET LOCAL statement_timeout = '50ms'").await.expect("statement_timeout");
    assert_eq!(failure(slow.execute_unprepared("SELECT pg_sleep(2)").await), DbFailure::StatementTimeout);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_lost_mid_statement_is_unavailable_and_the_pool_recovers() {
    let app = TestApp::spawn().await;
    let db = pool(&app, 1).await;
    let running = tokio::spawn({
        let db = db.clone();
        async move { db.execute_unprepared("SELECT pg_sleep(30) /* to be terminated */").await }
    });
    // Terminate the backend as soon as the statement shows up as running.
    let terminate = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE query LIKE 'SELECT pg_sleep(30) /* to be terminated */%' AND pid <> pg_backend_pid()";
    eventually(Duration::from_secs(10), "the statement shows up in pg_stat_activity and is terminated", || async {
        app.db.query_one_raw(Statement::from_string(DbBackend::Postgres, terminate)).await.expect("terminate").is_some()
    })
    .await;
    assert_eq!(failure(running.await.expect("task")), DbFailure::Unavailable);
    // The broken connection is dropped and the next statement gets a new one.
    db.execute_unprepared("SELECT 1").await.expect("the pool reconnects by itself");
}

/// The backend pid of the connection a statement of `pool` ran on.
async fn backend_pid(pool: &StatementPool) -> Result<i32, DbErr> {
    let row = pool.fetch_optional("test", sqlx::query("SELECT pg_backend_pid() AS pid")).await?;
    row.expect("one row").try_get::<i32>("", "pid")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_statement_pool_keeps_a_connection_through_sql_errors_and_replaces_a_killed_one() {
    let app = TestApp::spawn().await;
    let pool = StatementPool::beside(&app.db);
    let first = backend_pid(&pool).await.expect("first statement");
    assert_eq!(pool.idle(), 1, "the connection went back");
    assert_eq!(backend_pid(&pool).await.expect("second statement"), first, "and was used again");

    // An SQL error leaves the connection usable: it is kept.
    let error = pool.fetch_optional("test", sqlx::query("SELECT 1 / 0")).await.expect_err("division by zero");
    assert_eq!(classify(&error), DbFailure::Other);
    assert_eq!(backend_pid(&pool).await.expect("after an SQL error"), first);

    // A terminated backend: the statement on it fails as unavailable (a
    // retryable answer for the client), the connection is dropped, and the
    // next statement runs on a new one.
    let killed = app
        .db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT pg_terminate_backend($1) AS killed",
            [first.into()],
        ))
        .await
        .expect("terminate")
        .expect("a row")
        .try_get::<bool>("", "killed")
        .expect("killed");
    assert!(killed);
    let error = backend_pid(&pool).await.expect_err("the connection was killed");
    assert_eq!(classify(&error), DbFailure::Unavailable, "{error}");
    assert_eq!(pool.idle(), 0, "a broken connection is not kept");
    let next = backend_pid(&pool).await.expect("a new connection");
    assert_ne!(next, first);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_statement_pool_fails_fast_as_unavailable() {
    let app = TestApp::spawn().await;
    let pool = StatementPool::new(
        (*app.db.get_postgres_connection_pool().connect_options()).clone(),
        1,
        Duration::from_millis(200),
    );
    let busy = {
        let pool = pool.clone();
        tokio::spawn(async move {
            pool.fetch_optional("test", sqlx::query("SELECT pg_sleep(5) /* holds the one connection */")).await
        })
    };
    let sleeping = "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' \
                    AND query = 'SELECT pg_sleep(5) /* holds the one connection */'";
    eventually(Duration::from_secs(10), "the first statement holds the pool's one connection", || async {
        app.count(sleeping).await > 0
    })
    .await;
    let error = backend_pid(&pool).await.expect_err("no connection free");
    assert_eq!(classify(&error), DbFailure::Unavailable, "{error}");
    // Refused while the sleeper still holds the one connection: it did not
    // wait for the connection to come back.
    assert!(app.count(sleeping).await > 0, "the error came only after the sleeper let go");
    busy.await.expect("join").expect("the sleeper finishes");
}

/// Ends every connection to the test's database but the caller's, so the
/// next statements run on new sessions (which read the database's settings).
async fn reconnect_everyone(app: &TestApp) {
    let sql = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
               WHERE datname = current_database() AND pid <> pg_backend_pid()";
    app.db.execute_unprepared(sql).await.expect("terminate the server's connections");
    // The test's own check pool lost its other connection too: each failed
    // statement drops a dead one, until the pool answers again.
    eventually(Duration::from_secs(10), "the check pool reconnects", || async {
        app.db.execute_unprepared("SELECT 1").await.is_ok()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_server_is_retryable_unavailable_and_the_server_recovers_when_it_takes_writes_again() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("RO-1", 10).await;
    let alice = app.token("alice", stockguard::auth::Role::Customer);
    let name = app.database_url.rsplit('/').next().expect("database name").to_owned();
    // What a demoted primary (a standby now) answers every write with: 25006.
    // (Set and reset from the maintenance database, which stays writable.)
    let admin = sea_orm::Database::connect(format!("{}/postgres", server_url())).await.expect("connect");
    admin
        .execute_unprepared(&format!("ALTER DATABASE \"{name}\" SET default_transaction_read_only = on"))
        .await
        .expect("make the database read-only");
    reconnect_everyone(&app).await;

    let db = pool(&app, 1).await;
    let write = db.execute_unprepared(&format!("UPDATE inventories SET name = 'x' WHERE id = '{id}'")).await;
    assert_eq!(failure(write), DbFailure::Unavailable, "25006 is an outage, not a bug");
    db.close().await.expect("close");

    // Through the API, with and without a key, one item and several: a
    // retryable DATABASE_UNAVAILABLE, never INTERNAL, and nothing written.
    let before = app.snapshot().await;
    for input in [json!({ "inventoryId": id }), json!({ "inventoryId": id, "idempotencyKey": "ro-1" })] {
        let answer = app.reserve(&alice, input).await;
        assert_eq!(crate::helpers::error_code(&answer), Some("DATABASE_UNAVAILABLE"), "{answer}");
        assert_eq!(answer["errors"][0]["extensions"]["retryable"], true, "{answer}");
    }
    let many = app.reserve_many(&alice, json!([{ "inventoryId": id, "quantity": 1 }])).await;
    assert_eq!(crate::helpers::error_code(&many), Some("DATABASE_UNAVAILABLE"), "{many}");
    let ready = app.client.get(format!("{}/readyz", app.address)).send().await.expect("readyz");
    assert_eq!(ready.status(), 503, "a read-only database is not ready for a load balancer");
    admin
        .execute_unprepared(&format!("ALTER DATABASE \"{name}\" RESET default_transaction_read_only"))
        .await
        .expect("writable again");
    admin.close().await.expect("close");
    assert_eq!(app.snapshot().await, before, "nothing was written");

    // Writable again (a new primary): the same request now succeeds, without a restart.
    reconnect_everyone(&app).await;
    eventually(Duration::from_secs(10), "a reserve succeeds once the database takes writes", || async {
        app.reserve(&alice, json!({ "inventoryId": id, "idempotencyKey": "ro-1" })).await["__typename"] == "Reserved"
    })
    .await;
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 1, "one key, one reservation");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn readiness_answers_at_once_while_requests_hold_every_pooled_connection() {
    let app = TestApp::spawn_with_options(crate::helpers::Options { pool_size: 3, ..Default::default() }).await;
    let pool = app.server.state().db.get_postgres_connection_pool().clone();
    // Take every connection the pool will give (the live listener holds one).
    let mut held = Vec::new();
    while let Ok(Ok(conn)) = tokio::time::timeout(Duration::from_millis(500), pool.acquire()).await {
        held.push(conn);
    }
    assert_eq!(pool.num_idle(), 0, "the pool is saturated");
    assert!(!held.is_empty());
    // Every pooled connection stays held until the end: a probe queued
    // behind the pool could only time out, so a 200 proves it did not queue.
    let ready = app.client.get(format!("{}/readyz", app.address)).send().await.expect("readyz");
    assert_eq!(ready.status(), 200, "the database is up; a busy pool is no reason to be taken out");
    drop(held);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_url_of_several_hosts_connects_to_one_that_answers_and_names_each_when_none_does() {
    let app = TestApp::spawn().await;
    // A host where nothing listens comes first, as a dead primary would.
    let (scheme, rest) = app.database_url.split_once("://").expect("a URL");
    let hosts = |first: &str| match rest.split_once('@') {
        Some((user, rest)) => format!("{scheme}://{user}@{first},{rest}"),
        None => format!("{scheme}://{first},{rest}"),
    };
    let config = |url: &str| DatabaseConfig {
        database_url: Some(url.to_owned()),
        pool_size: 2,
        acquire_timeout_ms: 2_000,
        statement_timeout_ms: 10_000,
        ..DatabaseConfig::default()
    };
    let url = hosts("127.0.0.1:1");
    let db = db::connect(&url, &config(&url)).await.expect("the second host answers");
    let writable = db
        .query_one_raw(Statement::from_string(DbBackend::Postgres, "SHOW transaction_read_only"))
        .await
        .expect("query")
        .expect("a row")
        .try_get_by_index::<String>(0)
        .expect("text");
    assert_eq!(writable, "off", "several hosts: connected to one that takes writes");
    db.close().await.expect("close");

    let none = format!("postgres://postgres@127.0.0.1:1,127.0.0.1:2/{}", "nowhere");
    let error = db::connect(&none, &config(&none)).await.expect_err("no host answers").to_string();
    assert!(error.contains("127.0.0.1:1") && error.contains("127.0.0.1:2"), "names each host: {error}");
}
