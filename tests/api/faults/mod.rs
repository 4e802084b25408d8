//! Faults injected under load: backends killed mid-request, the database
//! stopped and started again, responses lost after the commit, a pool starved
//! by a held row lock, and a graceful shutdown of the real binary. Whatever
//! happens, every request is answered with a union member or a retryable
//! `DATABASE_UNAVAILABLE`, nothing is half-written (the invariant holds), and
//! the server recovers by itself.

mod durable;
mod lost_responses;
pub(crate) mod restart;
mod storm;

use self::lost_responses::*;
use self::restart::*;
use self::storm::*;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    process::Command,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use futures::future::join_all;
use rand::{RngExt as _, SeedableRng, rngs::StdRng};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement, TransactionTrait};
use serde_json::{Value, json};
use stockguard::{
    auth::{Keys, Role},
    config::{DatabaseConfig, Limits},
    db::{self, DbFailure},
    embedded::EmbeddedPostgres,
    invariant,
};
use stockguard_support::process::{Log, ServerProcess};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use uuid::Uuid;

use crate::{
    documents::{CANCEL_ORDER, CREATE_INVENTORY, INVENTORIES, PLACE_ORDER, RESERVE},
    helpers::{Options, Reply, TestApp, eventually, post, request, server_url},
    process::binary,
    ws::{SUBSCRIPTION, Socket, connect, next, send},
};

// ---------- requests and what came back ----------

/// How one GraphQL request over HTTP came back.
#[derive(Debug, Clone)]
enum Answer {
    /// `data.<field>` is there: its `__typename` (or `"data"` for a plain
    /// object) and its value.
    Member(String, Value),
    /// Every error is retryable and nothing ran: `DATABASE_UNAVAILABLE`
    /// (HTTP 200), or `THROTTLED` (HTTP 429) when the caller's own
    /// operations held its share of the pool as long as a connection is
    /// waited for.
    Retryable,
    /// Anything else: what it was.
    Bad(String),
}

impl Answer {
    fn typename(&self) -> Option<&str> {
        match self {
            Self::Member(name, _) => Some(name),
            _ => None,
        }
    }
}

/// Judges an HTTP response to a request for `field`.
fn judge(reply: &Reply, field: &str) -> Answer {
    let text = String::from_utf8_lossy(&reply.body);
    if let Some(err) = &reply.cut_short {
        return Answer::Bad(format!("HTTP {} with an incomplete body: {err}", reply.status));
    }
    let code = match reply.status {
        200 => "DATABASE_UNAVAILABLE",
        429 => "THROTTLED",
        status => return Answer::Bad(format!("HTTP {status}: {text}")),
    };
    let Ok(body) = serde_json::from_slice::<Value>(&reply.body) else {
        return Answer::Bad(format!("not JSON: {text}"));
    };
    if let Some(errors) = body["errors"].as_array() {
        let retryable =
            |e: &Value| e["extensions"]["code"] == code && e["extensions"]["retryable"] == Value::Bool(true);
        return if !errors.is_empty() && errors.iter().all(retryable) {
            Answer::Retryable
        } else {
            Answer::Bad(format!("errors: {body}"))
        };
    }
    let result = &body["data"][field];
    match result["__typename"].as_str() {
        Some(name) => Answer::Member(name.to_owned(), result.clone()),
        None if result.is_object() => Answer::Member("data".into(), result.clone()),
        None => Answer::Bad(format!("no {field} in {body}")),
    }
}

/// Sends a GraphQL request for `field` with `client` (whose timeout bounds
/// every wait) and judges what came back. `Err` when no response came back
/// at all.
async fn ask(
    client: &reqwest::Client,
    address: &str,
    token: Option<&str>,
    field: &str,
    query: &str,
    variables: Value,
) -> Result<Answer, reqwest::Error> {
    let bearer = token.map(|token| format!("Bearer {token}"));
    let reply = post(client, address, bearer.as_deref(), request(query, variables)).await?;
    Ok(judge(&reply, field))
}

/// The answer of `request`, re-sent while it is a retryable error (at most
/// 10 times, 100 ms apart).
async fn served<F, Fut>(mut request: F) -> Answer
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Answer, reqwest::Error>>,
{
    for _ in 0..10 {
        match request().await.expect("an HTTP response") {
            Answer::Retryable => tokio::time::sleep(Duration::from_millis(100)).await,
            answer => return answer,
        }
    }
    panic!("still a retryable error after 10 tries");
}

/// A client whose every request is answered or given up within 10 s.
fn bounded_client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("client")
}

fn address(line1: &str) -> Value {
    json!({ "name": "Fault Tester", "line1": line1, "city": "Porto", "postalCode": "4000-001", "country": "PT" })
}

fn uuid_of(value: &Value) -> Uuid {
    value.as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("not a UUID: {value}"))
}

// ---------- reads straight from the database, through lost connections ----------

/// Runs `sql` (one row, one bigint) on `db`, re-running it when its pooled
/// connection turns out to have been killed: a storm may have left dead
/// connections in the test's own pool too.
async fn count_on(db: &DatabaseConnection, sql: &str) -> i64 {
    let mut last = None;
    for _ in 0..5 {
        match db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await {
            Ok(row) => return row.expect("one row").try_get_by_index(0).expect("a bigint"),
            Err(err) if db::classify(&err) == DbFailure::Unavailable => {
                last = Some(err);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("{sql}: {err}"),
        }
    }
    panic!("{sql}: still unavailable: {last:?}");
}

/// The invariant on `db`, re-run when a killed connection got in the way.
async fn assert_invariant_on(db: &DatabaseConnection) {
    for _ in 0..5 {
        match invariant::check(db).await {
            Ok(drifts) => {
                assert!(drifts.is_empty(), "invariant broken: {drifts:?}");
                return;
            }
            Err(invariant::CheckError::Database(err)) if db::classify(&err) == DbFailure::Unavailable => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("invariant check failed: {err}"),
        }
    }
    panic!("the database stayed unavailable for the invariant check");
}

/// A port nothing listened on a moment ago: another process may take it
/// before PostgreSQL binds it, so its one user retries with another.
fn free_port() -> u16 {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
    probe.local_addr().expect("addr").port()
}

/// `stockguard check` against `url`, as an operator would run it.
fn stockguard_check(url: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_stockguard"))
        .args(["check", "--database-url", url])
        .env_remove("DATABASE_URL")
        .output()
        .expect("run stockguard check")
}

// ---------- 4. a starved pool and slow statements ----------

/// Waits until the server has no operation in flight (its clients may have
/// gone), no connection in a transaction and none running a statement.
async fn until_settled(app: &TestApp) -> Duration {
    let settled = eventually(Duration::from_secs(10), "no operation, transaction or statement left", || async {
        app.server.operations_in_flight() == 0
            && open_transactions(app).await.is_empty()
            && busy_connections(app).await == 0
    });
    settled.await
}

/// Orders placed over websockets that close right after sending: a mutation
/// that reached the server runs to its end (it is not dropped with its
/// socket), so every one is placed, whole, and no transaction stays open.
#[tokio::test(flavor = "multi_thread")]
async fn orders_over_websockets_that_close_mid_transaction_finish_whole() {
    const ROUNDS: usize = 20;
    let app = TestApp::spawn_with_options(Options { pool_size: 4, ..Options::default() }).await;
    let (a, b) = (app.create_inventory("WS-CUT-A", 10_000).await, app.create_inventory("WS-CUT-B", 10_000).await);
    let authorization = json!({ "Authorization": format!("Bearer {}", app.token("dave", Role::Customer)) });
    let mut rng = StdRng::seed_from_u64(0xC7);
    for round in 0..ROUNDS {
        let lines = json!([{ "inventoryId": a, "quantity": 1 }, { "inventoryId": b, "quantity": 2 }]);
        let input = json!({ "items": lines, "shippingAddress": address(&format!("{round} Socket Lane")) });
        let mut socket = crate::ws::connect_with(&app.address, "graphql-transport-ws", authorization.clone()).await;
        let payload = json!({ "query": PLACE_ORDER, "variables": { "input": input } });
        send(&mut socket, json!({ "id": "order", "type": "subscribe", "payload": payload })).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..=15))).await;
        drop(socket);
    }
    until_settled(&app).await;
    let orders = app.count("SELECT count(*) FROM orders").await;
    let whole = "SELECT count(*) FROM orders o WHERE (SELECT count(*) FROM reservations r \
                 WHERE r.order_id = o.id AND r.status = 'ORDERED') = 2";
    assert_eq!(orders, ROUNDS as i64, "every order that reached the server was placed, socket closed or not");
    assert_eq!(app.count(whole).await, orders, "every order has both its lines");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_row_lock_and_a_starved_pool_give_fast_retryable_errors_and_write_nothing() {
    let app = Arc::new(
        TestApp::spawn_with_options(Options {
            pool_size: 2,
            acquire_timeout_ms: 300,
            statement_timeout_ms: 1000,
            // Carol's reserves past her turns wait for one no longer than
            // one of them waits on the row.
            limits: Limits { max_turn_wait_ms: 1000, ..Limits::default() },
            ..Options::default()
        })
        .await,
    );
    let a = app.create_inventory("SLOW-A", 100).await;
    let carol = app.token("carol", Role::Customer);
    let before = app.snapshot().await;

    // This locks A for as long as the test's transaction lives, so every
    // reserve of A waits for it until its statement_timeout runs out.
    let holder = app.db.begin().await.expect("begin");
    holder.execute_unprepared(&format!("SELECT 1 FROM inventories WHERE id = '{a}' FOR UPDATE")).await.expect("lock A");

    let client = bounded_client();
    let started = Instant::now();
    let reserves = (0..20).map(|n| {
        let input = json!({ "inventoryId": a, "idempotencyKey": format!("slow-{n}") });
        let (client, address, carol) = (client.clone(), app.address.clone(), carol.clone());
        async move { ask(&client, &address, Some(&carol), "reserve", RESERVE, json!({ "input": input })).await }
    });
    let reads = (0..20).map(|_| {
        let (client, address) = (client.clone(), app.address.clone());
        async move { ask(&client, &address, None, "inventories", INVENTORIES, json!({ "f": 10 })).await }
    });
    let (reserves, reads) = tokio::join!(join_all(reserves), join_all(reads));
    let took = started.elapsed();
    let written_while_locked = app.snapshot().await;
    holder.rollback().await.expect("release A");

    let tally = Tally::default();
    for sent in reserves {
        let answer = tally.record("reserve", sent);
        assert!(matches!(answer, Some(Answer::Retryable)), "a reserve of a locked row: {answer:?}");
    }
    for sent in reads {
        tally.record("inventories", sent);
    }
    println!(
        "starved pool: 40 requests answered in {took:?}, {} retryable, members {:?}",
        tally.retryable.load(Ordering::Relaxed),
        tally.members.lock().expect("tally"),
    );
    let bad = tally.bad.lock().expect("tally").clone();
    assert!(bad.is_empty(), "neither a union member nor a retryable error: {bad:#?}");
    // Every reserve was answered while A was still locked (it is released
    // only after the answers): only the statement timeout and the pool's
    // acquire timeout can have ended them, which is what is proved, not a speed.
    assert_eq!(written_while_locked, before, "nothing was written while the row was locked");

    // The lock is gone: the same requests now succeed, one after another. (A
    // 300 ms wait for the one connection the listener leaves free can still
    // run out on a busy machine: that answer is retryable, so it is retried.)
    for n in 0..20 {
        let input = json!({ "inventoryId": a, "idempotencyKey": format!("slow-{n}") });
        let reserved =
            served(|| ask(&client, &app.address, Some(&carol), "reserve", RESERVE, json!({ "input": input.clone() })))
                .await;
        assert_eq!(reserved.typename(), Some("Reserved"), "{reserved:?}");
    }
    let read = served(|| ask(&client, &app.address, None, "inventories", INVENTORIES, json!({ "f": 10 }))).await;
    let Answer::Member(_, read) = read else { panic!("read: {read:?}") };
    assert_eq!(read["nodes"][0]["stock"], 80, "{read}");
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 20);
    app.assert_invariant().await;
}

// ---------- 5. graceful shutdown under load ----------

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_under_load_answers_every_request_in_flight_and_exits_cleanly() {
    const SECRET: &str = "graceful-secret-of-thirty-two-bytes";
    let url = format!("{}/sg_test_{}", server_url(), Uuid::new_v4().simple());
    db::ensure_database(&url).await.expect("create the database");
    let no_env: [(&str, &str); 0] = [];
    let mut server = ServerProcess::start(&binary(), &url, Some(SECRET), &no_env, Log::Kept)
        .await
        .unwrap_or_else(|err| panic!("{err:#}"));
    let address = server.url.clone();

    let client = bounded_client();
    let keys = Keys::new(SECRET.as_bytes(), 3600).expect("a long enough secret");
    let operator = keys.mint("operator", Role::Operator, chrono::Duration::minutes(10)).expect("mint");
    let create = json!({ "input": { "sku": "GRACE-1", "name": "Graceful", "stock": 1_000_000 } });
    let created =
        ask(&client, &address, Some(&operator), "createInventory", CREATE_INVENTORY, create).await.expect("create");
    let Answer::Member(_, inventory) = created else { panic!("create: {created:?}") };
    let id = uuid_of(&inventory["id"]);

    // A live subscription is open through the shutdown too: it must not keep
    // the process alive.
    let socket = subscribe(&address, id).await;

    // 64 clients reserve until the server stops listening.
    let reserved = Arc::new(AtomicUsize::new(0));
    let tally = Arc::new(Tally::default());
    let refused = Arc::new(AtomicUsize::new(0));
    let unanswered = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..64)
        .map(|n| {
            let token = keys.mint(&format!("grace-{n}"), Role::Customer, chrono::Duration::minutes(10)).expect("mint");
            let (client, address, tally, reserved, refused, unanswered) =
                (client.clone(), address.clone(), tally.clone(), reserved.clone(), refused.clone(), unanswered.clone());
            tokio::spawn(async move {
                let give_up = Instant::now() + Duration::from_secs(20);
                while Instant::now() < give_up {
                    let input = json!({ "inventoryId": id });
                    match ask(&client, &address, Some(&token), "reserve", RESERVE, json!({ "input": input })).await {
                        Ok(answer) => {
                            if answer.typename() == Some("Reserved") {
                                reserved.fetch_add(1, Ordering::Relaxed);
                            }
                            tally.record("reserve", Ok(answer));
                        }
                        Err(err) if err.is_connect() => {
                            refused.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                        // A keep-alive connection the server closed before
                        // reading the request: nothing was done, try again.
                        Err(err) => unanswered.lock().expect("unanswered").push(format!("{err:?}")),
                    }
                }
            })
        })
        .collect();

    // Under load: every client has been answered before the signal, on average.
    eventually(Duration::from_secs(20), "the clients reserve", || async { reserved.load(Ordering::Relaxed) >= 64 })
        .await;
    let before_signal = reserved.load(Ordering::Relaxed);
    server.terminate().expect("SIGTERM sent");
    let signalled = Instant::now();
    let status = server.wait(Duration::from_secs(10)).await.unwrap_or_else(|err| panic!("after SIGTERM: {err:#}"));
    let exited = signalled.elapsed();
    assert!(status.success(), "exit status {status:?}\n{}", server.log());
    drop(socket);
    for client in clients {
        client.await.expect("client task");
    }

    let reserved = reserved.load(Ordering::Relaxed);
    let unanswered = unanswered.lock().expect("unanswered").clone();
    println!(
        "graceful shutdown: exited {exited:?} after SIGTERM; {} requests answered ({reserved} Reserved, \
         {before_signal} before the signal), {} refused at connect, {} closed before any response {:?}",
        tally.answered.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
        unanswered.len(),
        unanswered.iter().take(3).collect::<Vec<_>>(),
    );
    let bad = tally.bad.lock().expect("tally").clone();
    assert!(bad.is_empty(), "incomplete or unexpected answers: {bad:#?}");
    assert_eq!(refused.load(Ordering::Relaxed), 64, "every client ends on a refused connection");

    let config = DatabaseConfig {
        database_url: Some(url.clone()),
        pool_size: 1,
        acquire_timeout_ms: 10_000,
        statement_timeout_ms: 10_000,
        ..DatabaseConfig::default()
    };
    let db = db::connect(&url, &config).await.expect("connect");
    assert_invariant_on(&db).await;
    let rows = count_on(&db, "SELECT count(*) FROM reservations").await;
    assert_eq!(rows, reserved as i64, "every committed reservation was answered Reserved, and only those");
    db.close().await.expect("close");

    let name = url.rsplit('/').next().expect("database name");
    let admin = sea_orm::Database::connect(format!("{}/postgres", server_url())).await.expect("connect");
    admin.execute_unprepared(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await.expect("drop the database");
    admin.close().await.expect("close");
}
