//! Faults injected under load: backends killed mid-request, the database
//! stopped and started again, responses lost after the commit, a pool starved
//! by a held row lock, and a graceful shutdown of the real binary. Whatever
//! happens, every request is answered with a union member or a retryable
//! `DATABASE_UNAVAILABLE`, nothing is half-written (the invariant holds), and
//! the server recovers by itself.

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
use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement, TransactionTrait};
use serde_json::{Value, json};
use stockguard::{
    auth::{Keys, Role},
    config::DatabaseConfig,
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
    /// Every error is `DATABASE_UNAVAILABLE` with `retryable: true`.
    Unavailable,
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
    if reply.status != 200 {
        return Answer::Bad(format!("HTTP {}: {text}", reply.status));
    }
    let Ok(body) = serde_json::from_slice::<Value>(&reply.body) else {
        return Answer::Bad(format!("not JSON: {text}"));
    };
    if let Some(errors) = body["errors"].as_array() {
        let retryable = |e: &Value| {
            e["extensions"]["code"] == "DATABASE_UNAVAILABLE" && e["extensions"]["retryable"] == Value::Bool(true)
        };
        return if !errors.is_empty() && errors.iter().all(retryable) {
            Answer::Unavailable
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
            Answer::Unavailable => tokio::time::sleep(Duration::from_millis(100)).await,
            answer => return answer,
        }
    }
    panic!("still DATABASE_UNAVAILABLE after 10 tries");
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
            Err(err) if db::classify(&err) == DbFailure::Unavailable => {
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

// ---------- 1. backends killed under load ----------

/// What the clients of the storm got back.
#[derive(Default)]
struct Tally {
    answered: AtomicUsize,
    retryable: AtomicUsize,
    /// Union members per operation, e.g. `reserve Reserved`.
    members: Mutex<BTreeMap<String, usize>>,
    /// Anything that is neither a union member nor a retryable error.
    bad: Mutex<Vec<String>>,
}

impl Tally {
    fn record(&self, operation: &str, sent: Result<Answer, reqwest::Error>) -> Option<Answer> {
        let answer = match sent {
            Ok(answer) => answer,
            Err(err) => {
                self.bad.lock().expect("tally").push(format!("{operation}: no response: {err}"));
                return None;
            }
        };
        self.answered.fetch_add(1, Ordering::Relaxed);
        match &answer {
            Answer::Member(name, _) => {
                *self.members.lock().expect("tally").entry(format!("{operation} {name}")).or_default() += 1;
            }
            Answer::Unavailable => {
                self.retryable.fetch_add(1, Ordering::Relaxed);
            }
            Answer::Bad(what) => self.bad.lock().expect("tally").push(format!("{operation}: {what}")),
        }
        Some(answer)
    }
}

/// One client of the storm: a mix of reserves with and without a key,
/// orders of one or two lines, and cancelling its own last order.
async fn storm_client(
    app: Arc<TestApp>,
    client: reqwest::Client,
    tally: Arc<Tally>,
    n: usize,
    items: [Uuid; 2],
    until: Instant,
) {
    let token = app.token(&format!("storm-{n}"), Role::Customer);
    let mut rng = StdRng::seed_from_u64(n as u64);
    let mut last_order: Option<Uuid> = None;
    let mut round = 0;
    while Instant::now() < until {
        round += 1;
        let item = items[rng.random_range(0..2)];
        match rng.random_range(0..4) {
            0 => {
                let input = json!({ "inventoryId": item, "quantity": rng.random_range(1..=3) });
                let sent =
                    ask(&client, &app.address, Some(&token), "reserve", RESERVE, json!({ "input": input })).await;
                tally.record("reserve", sent);
            }
            1 => {
                let input = json!({ "inventoryId": item, "idempotencyKey": format!("storm-{n}-{round}") });
                let sent =
                    ask(&client, &app.address, Some(&token), "reserve", RESERVE, json!({ "input": input })).await;
                tally.record("reserve(key)", sent);
            }
            2 => {
                let mut lines = vec![json!({ "inventoryId": items[0], "quantity": rng.random_range(1..=2) })];
                if rng.random_bool(0.5) {
                    lines.push(json!({ "inventoryId": items[1], "quantity": 1 }));
                }
                let input = json!({ "items": lines, "shippingAddress": address(&format!("{round} Storm Road")) });
                let sent =
                    ask(&client, &app.address, Some(&token), "placeOrder", PLACE_ORDER, json!({ "input": input }))
                        .await;
                if let Some(Answer::Member(name, result)) = tally.record("placeOrder", sent)
                    && name == "OrderPlaced"
                {
                    last_order = Some(uuid_of(&result["order"]["id"]));
                }
            }
            _ => {
                let Some(order) = last_order.take() else { continue };
                let sent =
                    ask(&client, &app.address, Some(&token), "cancelOrder", CANCEL_ORDER, json!({ "id": order })).await;
                tally.record("cancelOrder", sent);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_backends_under_load_gives_only_answers_or_retryable_errors_and_the_server_recovers() {
    let app = Arc::new(
        TestApp::spawn_with_options(Options { pool_size: 10, acquire_timeout_ms: 1000, ..Options::default() }).await,
    );
    let items = [app.create_inventory("STORM-A", 1_000_000).await, app.create_inventory("STORM-B", 1_000_000).await];
    let tally = Arc::new(Tally::default());

    // The killer has a connection of its own, named so that it never matches
    // its own filter.
    let database = app.database_url.rsplit('/').next().expect("database name").to_owned();
    let killer = sea_orm::Database::connect(format!("{}?application_name=killer", app.database_url))
        .await
        .expect("killer connects");
    let named = "SELECT count(*) FROM pg_stat_activity WHERE pid = pg_backend_pid() AND application_name = 'killer'";
    assert_eq!(count_on(&killer, named).await, 1, "the killer is not named stockguard");
    let kill = format!(
        "SELECT count(pg_terminate_backend(pid))::bigint FROM pg_stat_activity \
         WHERE datname = '{database}' AND application_name = 'stockguard' AND pid <> pg_backend_pid()"
    );

    let client = bounded_client();
    let storm = Duration::from_secs(5);
    let until = Instant::now() + storm;
    let clients: Vec<_> = (0..64)
        .map(|n| tokio::spawn(storm_client(app.clone(), client.clone(), tally.clone(), n, items, until)))
        .collect();
    let mut killed = 0;
    let mut kills = 0;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(200)).await;
        killed += count_on(&killer, &kill).await;
        kills += 1;
    }
    let last_kill = Instant::now();
    // The storm is over once the last kill is done and every client has had
    // its last answer; then the server must serve again within 1 s.
    for client in clients {
        client.await.expect("client task");
    }
    let storm_over = Instant::now();
    let prober = app.token("prober", Role::Customer);
    let mut recovered = None;
    while storm_over.elapsed() < Duration::from_secs(1) {
        let input = json!({ "inventoryId": items[0] });
        let sent = ask(&client, &app.address, Some(&prober), "reserve", RESERVE, json!({ "input": input })).await;
        if let Some(Answer::Member(name, _)) = tally.record("probe", sent)
            && name == "Reserved"
        {
            recovered = Some(storm_over.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let answered = tally.answered.load(Ordering::Relaxed);
    let retryable = tally.retryable.load(Ordering::Relaxed);
    println!(
        "backend kills: {kills} rounds terminated {killed} backends; {answered} requests answered, \
         {retryable} with retryable DATABASE_UNAVAILABLE; the clients' last answers came {:?} after the last \
         kill; a reserve succeeded {recovered:?} after that",
        storm_over - last_kill
    );
    println!("backend kills: union members {:?}", tally.members.lock().expect("tally"));
    let bad = tally.bad.lock().expect("tally").clone();
    assert!(bad.is_empty(), "{} requests got neither a union member nor a retryable error: {bad:#?}", bad.len());
    assert!(killed > 0, "the killer found backends to kill");
    assert!(recovered.is_some(), "no reserve succeeded within 1 s of the storm");

    assert_invariant_on(&app.db).await;
    let check = stockguard_check(&app.database_url);
    assert!(check.status.success(), "stockguard check: {}", String::from_utf8_lossy(&check.stdout));
}

// ---------- 2. the database stopped and started again ----------

/// A private cluster that is never left running or on disk, even when the
/// test fails half-way.
struct PrivateCluster {
    cluster: EmbeddedPostgres,
    dir: PathBuf,
    port: u16,
}

impl PrivateCluster {
    /// A fresh cluster on a port PostgreSQL could bind: PostgreSQL cannot
    /// be given a listening socket nor report a port it chose, so a port
    /// someone took between [`free_port`] and the start is replaced by another.
    async fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("stockguard-faults-{}", Uuid::new_v4().simple()));
        let mut failures = Vec::new();
        for _ in 0..5 {
            let port = free_port();
            let cluster = EmbeddedPostgres::new(&dir, port).expect("PostgreSQL binaries are installed");
            match cluster.start().await {
                Ok(started) => {
                    assert!(started, "this test started its own cluster");
                    return Self { cluster, dir, port };
                }
                Err(err) => failures.push(format!("port {port}: {err}")),
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        panic!("the cluster did not start on any of 5 free ports: {failures:#?}");
    }

    fn server_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}", self.port)
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        // After a clean stop there is no pid file; after a failure the
        // postmaster is told to quit at once (SIGQUIT: immediate shutdown).
        let pid_file = self.dir.join("postmaster.pid");
        if let Some(pid) = std::fs::read_to_string(&pid_file).ok().and_then(|s| s.lines().next().map(str::to_owned)) {
            let _ = Command::new("kill").args(["-QUIT", &pid]).status();
            for _ in 0..100 {
                if !pid_file.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A graphql-transport-ws connection subscribed to inventory `id`.
async fn subscribe(address: &str, id: Uuid) -> Socket {
    let mut socket = connect(address, "graphql-transport-ws").await;
    let payload = json!({ "query": SUBSCRIPTION, "variables": { "id": id } });
    send(&mut socket, json!({ "id": "1", "type": "subscribe", "payload": payload })).await;
    socket
}

/// Whether `sql` counts more than zero, false while the database is away.
async fn any(db: &DatabaseConnection, sql: &str) -> bool {
    match db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await {
        Ok(Some(row)) => row.try_get_by_index::<i64>(0).is_ok_and(|n| n > 0),
        _ => false,
    }
}

async fn readyz(app: &TestApp) -> u16 {
    let response = app.client.get(format!("{}/readyz", app.address)).send().await.expect("readyz answers");
    response.status().as_u16()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_restart_is_survived_without_restarting_the_server() {
    let cluster = PrivateCluster::start().await;
    let app = Arc::new(
        TestApp::spawn_with_options(Options {
            server_url: Some(cluster.server_url()),
            acquire_timeout_ms: 500,
            statement_timeout_ms: 2000,
            ..Options::default()
        })
        .await,
    );
    let load = app.create_inventory("RESTART-LOAD", 1_000_000).await;
    let watched = app.create_inventory("RESTART-WATCHED", 100).await;
    let alice = app.token("alice", Role::Customer);

    // A subscriber that sees changes before the restart...
    let mut socket = subscribe(&app.address, watched).await;
    let watchers = format!("SELECT count(*) FROM inventory_watchers WHERE inventory_id = '{watched}'");
    eventually(Duration::from_secs(10), "the watcher is registered", || any(&app.db, &watchers)).await;
    assert_eq!(app.reserve(&alice, json!({ "inventoryId": watched })).await["__typename"], "Reserved");
    let message = next(&mut socket).await;
    assert_eq!(message["payload"]["data"]["inventoryChanged"]["stock"], 99, "{message}");

    // ...and light load all along: a few clients reserving, with and without keys.
    let client = bounded_client();
    let tally = Arc::new(Tally::default());
    let slowest_unavailable = Arc::new(Mutex::new(Duration::ZERO));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..3)
        .map(|n| {
            let (app, client, tally, stop, slowest) =
                (app.clone(), client.clone(), tally.clone(), stop.clone(), slowest_unavailable.clone());
            tokio::spawn(async move {
                let token = app.token(&format!("light-{n}"), Role::Customer);
                let mut round = 0;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    let mut input = json!({ "inventoryId": load });
                    if n == 0 {
                        input["idempotencyKey"] = json!(format!("light-{round}"));
                    }
                    let started = Instant::now();
                    let sent =
                        ask(&client, &app.address, Some(&token), "reserve", RESERVE, json!({ "input": input })).await;
                    if let Some(Answer::Unavailable) = tally.record("reserve", sent) {
                        let mut slowest = slowest.lock().expect("slowest");
                        *slowest = (*slowest).max(started.elapsed());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        })
        .collect();
    eventually(Duration::from_secs(10), "the light load is answered", || async {
        tally.answered.load(Ordering::Relaxed) >= 3
    })
    .await;

    // The database goes away: not ready, and reserves fail fast and retryable.
    cluster.cluster.stop().await.expect("stop the cluster");
    let stopped = Instant::now();
    assert_eq!(readyz(&app).await, 503, "not ready while the database is down");
    for (n, input) in [json!({ "inventoryId": load }), json!({ "inventoryId": load, "idempotencyKey": "down-1" })]
        .into_iter()
        .enumerate()
    {
        let started = Instant::now();
        let answer = ask(&client, &app.address, Some(&alice), "reserve", RESERVE, json!({ "input": input }))
            .await
            .expect("an answer while the database is down");
        let took = started.elapsed();
        assert!(matches!(answer, Answer::Unavailable), "reserve {n} while down: {answer:?}");
        assert!(took < Duration::from_secs(2), "reserve {n} took {took:?} to fail");
    }
    // The outage lasts until the light load has met it a few times (and at
    // least three seconds), so the server sees a real outage, not a blip.
    eventually(Duration::from_secs(15), "the light load meets the outage", || async {
        tally.retryable.load(Ordering::Relaxed) >= 3 && stopped.elapsed() >= Duration::from_secs(3)
    })
    .await;
    let during = tally.retryable.load(Ordering::Relaxed);

    // It comes back: the same server is ready and reserves again.
    cluster.cluster.start().await.expect("start the cluster again");
    let restarted = Instant::now();
    let ready =
        eventually(Duration::from_secs(15), "/readyz is 200 after the restart", || async { readyz(&app).await == 200 })
            .await;
    eventually(Duration::from_secs(15), "a reserve succeeds after the restart", || async {
        let answer =
            ask(&client, &app.address, Some(&alice), "reserve", RESERVE, json!({ "input": { "inventoryId": load } }))
                .await
                .expect("an answer after the restart");
        match answer {
            Answer::Member(name, _) => name == "Reserved",
            Answer::Unavailable => false,
            Answer::Bad(what) => panic!("after the restart: {what}"),
        }
    })
    .await;
    let reserving = restarted.elapsed();

    // The live listener has reconnected by itself, and the subscription (whose
    // watcher row lives in an UNLOGGED table that survives a clean restart)
    // sees a change made now. On reconnecting, the listener resends each
    // watched row once (changes made while nobody listened were never
    // announced), so the latest state before the change may come first.
    let listening = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'";
    let relistened =
        eventually(Duration::from_secs(15), "the live listener listens again", || any(&app.db, listening)).await;
    assert_eq!(app.reserve(&alice, json!({ "inventoryId": watched, "quantity": 2 })).await["__typename"], "Reserved");
    let mut seen: Vec<(i64, i64)> = Vec::new();
    loop {
        let message = next(&mut socket).await;
        assert_eq!(message["type"], "next", "{message}");
        let inventory = &message["payload"]["data"]["inventoryChanged"];
        assert_eq!(inventory["id"], watched.to_string(), "{message}");
        let state = (inventory["stock"].as_i64().expect("stock"), inventory["version"].as_i64().expect("version"));
        assert!([(99, 2), (97, 3)].contains(&state), "only committed states of the watched row: {state:?}");
        assert!(seen.last().is_none_or(|last| last.1 <= state.1), "in commit order: {seen:?} then {state:?}");
        seen.push(state);
        if state == (97, 3) {
            break;
        }
    }

    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.expect("client task");
    }
    let slowest = *slowest_unavailable.lock().expect("slowest");
    println!(
        "database restart: {} light-load requests answered, {} retryable ({during} by the end of the outage), \
         slowest retryable answer {slowest:?}; after the start /readyz was 200 in {ready:?}, a reserve succeeded \
         in {reserving:?}, the listener listened again {relistened:?} later; the subscriber saw {seen:?} after the restart",
        tally.answered.load(Ordering::Relaxed),
        tally.retryable.load(Ordering::Relaxed),
    );
    let bad = tally.bad.lock().expect("tally").clone();
    assert!(bad.is_empty(), "light load got neither a union member nor a retryable error: {bad:#?}");
    assert!(during > 0, "the light load saw the outage");
    assert!(slowest < Duration::from_secs(2), "a request took {slowest:?} to fail while the database was down");
    assert_invariant_on(&app.db).await;

    // The app drops its database while the cluster still runs; then the
    // cluster stops and its folder goes.
    drop(socket);
    drop(app);
    cluster.cluster.stop().await.expect("stop the cluster");
}

// ---------- 3. responses lost after the commit ----------

/// Sends `body` to `/graphql` over a raw connection and drops the connection
/// part-way, as a client whose network fails would. `mode` picks where:
/// 0: in the middle of the request; 1: `wait_ms` after the whole request;
/// 2: once the first bytes of the response have arrived (after the commit).
async fn send_and_drop(address: &str, token: &str, body: &str, mode: u32, cut: f64, wait_ms: u64) {
    let host = address.trim_start_matches("http://");
    let request = format!(
        "POST /graphql HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(host).await.expect("connect");
    match mode {
        0 => {
            let upto = ((request.len() as f64) * cut) as usize;
            stream.write_all(&request.as_bytes()[..upto]).await.expect("write part");
        }
        1 => {
            stream.write_all(request.as_bytes()).await.expect("write");
            tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        }
        _ => {
            stream.write_all(request.as_bytes()).await.expect("write");
            let mut first = [0u8; 16];
            let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut first)).await;
            assert!(matches!(read, Ok(Ok(n)) if n > 0), "the server started answering");
        }
    }
    drop(stream);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retry_after_a_lost_response_takes_the_stock_once_per_idempotency_key() {
    const ROUNDS: usize = 20;
    const INITIAL: i32 = 1000;
    let app = TestApp::spawn().await;
    let id = app.create_inventory("LOST-1", INITIAL).await;
    let bob = app.token("bob", Role::Customer);
    let mut rng = StdRng::seed_from_u64(0x5EED);
    let mut committed_first = 0;
    let mut answers = Vec::new();
    for round in 0..ROUNDS {
        let key = format!("lost-{round}");
        let input = json!({ "inventoryId": id, "quantity": 1, "idempotencyKey": key });
        let body = json!({ "query": RESERVE, "variables": { "input": input } }).to_string();
        let mode = (round % 3) as u32;
        send_and_drop(&app.address, &bob, &body, mode, rng.random_range(0.0..1.0), rng.random_range(0..=20)).await;
        let first = format!("SELECT id::text FROM reservations WHERE user_id = 'bob' AND idempotency_key = '{key}'");
        let before = app.db.query_one_raw(Statement::from_string(DbBackend::Postgres, first)).await.expect("query");
        let before: Option<String> = before.map(|row| row.try_get_by_index(0).expect("id"));
        match mode {
            0 => assert!(before.is_none(), "round {round}: half a request is never run"),
            2 => assert!(before.is_some(), "round {round}: a response was on its way, so the first request committed"),
            _ => {}
        }

        // The client retries the same request with the same key.
        let retried = app.reserve(&bob, input).await;
        assert_eq!(retried["__typename"], "Reserved", "round {round} (mode {mode}): {retried}");
        let reservation = retried["reservation"]["id"].as_str().expect("reservation id").to_owned();
        if let Some(first) = before {
            committed_first += 1;
            assert_eq!(reservation, first, "round {round}: the retry returns the first request's reservation");
        }
        answers.push((key, reservation));
    }

    for (key, reservation) in &answers {
        let rows = app
            .count(&format!(
                "SELECT count(*) FROM reservations WHERE user_id = 'bob' AND idempotency_key = '{key}' \
                 AND id = '{reservation}'"
            ))
            .await;
        assert_eq!(rows, 1, "{key}: the answered reservation is the key's one row");
    }
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, ROUNDS as i64, "one reservation per key");
    assert_eq!(
        app.stock_and_version(id).await,
        (INITIAL - ROUNDS as i32, 1 + ROUNDS as i32),
        "stock taken once per key"
    );
    app.assert_invariant().await;
    println!("lost responses: {ROUNDS} keys, {committed_first} first requests had committed before the retry");
}

/// The server's connections that sit in a transaction nobody is running, as
/// `pid: last statement`.
async fn open_transactions(app: &TestApp) -> Vec<String> {
    let sql = "SELECT coalesce(json_agg(pid || ': ' || left(query, 80)), '[]')::text FROM pg_stat_activity \
               WHERE datname = current_database() AND application_name = 'stockguard' \
               AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'";
    let row = app.db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await.expect("query");
    let text: String = row.expect("one row").try_get_by_index(0).expect("json");
    serde_json::from_str(&text).expect("a list")
}

/// The server's connections running a statement right now.
async fn busy_connections(app: &TestApp) -> i64 {
    app.count(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND application_name = 'stockguard' AND pid <> pg_backend_pid() AND state = 'active'",
    )
    .await
}

/// Orders (one transaction each) whose clients hang up part-way: the server
/// must not drop the request's work halfway, and no connection may go back to
/// the pool with a transaction still open, or later requests would run (and
/// never commit) inside it.
#[tokio::test(flavor = "multi_thread")]
async fn orders_abandoned_mid_transaction_leave_no_transaction_open_and_nothing_half_written() {
    const ROUNDS: usize = 40;
    let app = TestApp::spawn_with_options(Options { pool_size: 4, ..Options::default() }).await;
    let (a, b) = (app.create_inventory("ABANDON-A", 10_000).await, app.create_inventory("ABANDON-B", 10_000).await);
    let dave = app.token("dave", Role::Customer);
    let mut rng = StdRng::seed_from_u64(0xAB);
    for round in 0..ROUNDS {
        let lines = json!([{ "inventoryId": a, "quantity": 1 }, { "inventoryId": b, "quantity": 2 }]);
        let input = json!({ "items": lines, "shippingAddress": address(&format!("{round} Hang-up Lane")) });
        let body = json!({ "query": PLACE_ORDER, "variables": { "input": input } }).to_string();
        send_and_drop(&app.address, &dave, &body, 1, 0.0, rng.random_range(0..=20)).await;
    }

    // Whatever was cut off settles: the server finishes the work it started
    // (it runs each request to completion, holding its in-flight place until
    // then, also while it waits for a pooled connection), and no connection
    // stays in a transaction.
    let settled = until_settled(&app).await;
    let orders = app.count("SELECT count(*) FROM orders").await;
    let whole = "SELECT count(*) FROM orders o WHERE (SELECT count(*) FROM reservations r \
                 WHERE r.order_id = o.id AND r.status = 'ORDERED') = 2";
    let broken = "SELECT coalesce(json_agg(json_build_object('order', o.id, 'lines', \
                  (SELECT json_agg(json_build_object('status', r.status, 'inventory', r.inventory_id, 'qty', r.quantity)) \
                   FROM reservations r WHERE r.order_id = o.id))), '[]')::text FROM orders o \
                  WHERE (SELECT count(*) FROM reservations r WHERE r.order_id = o.id AND r.status = 'ORDERED') <> 2";
    let row = app.db.query_one_raw(Statement::from_string(DbBackend::Postgres, broken)).await.expect("query");
    let broken: String = row.expect("one row").try_get_by_index(0).expect("json");
    assert_eq!(app.count(whole).await, orders, "every order that exists has both its lines: {broken}");
    assert_eq!(app.count("SELECT count(*) FROM reservations WHERE order_id IS NULL").await, 0);

    // Every pooled connection is fit for use: each reserve is committed (seen
    // from another connection) as soon as it is answered.
    let erin = app.token("erin", Role::Customer);
    for n in 1..=12 {
        let input = if n % 2 == 0 {
            json!({ "inventoryId": a, "idempotencyKey": format!("after-{n}") })
        } else {
            json!({ "inventoryId": b })
        };
        assert_eq!(app.reserve(&erin, input).await["__typename"], "Reserved");
        assert_eq!(app.count("SELECT count(*) FROM reservations WHERE user_id = 'erin'").await, n, "committed");
    }
    assert_eq!(open_transactions(&app).await, Vec::<String>::new(), "no transaction is open afterwards");
    app.assert_invariant().await;
    println!("abandoned orders: {ROUNDS} requests cut off, {orders} orders committed whole, settled in {settled:?}");
}

// ---------- 4. a starved pool and slow statements ----------

/// Waits until the server has no operation in flight (its clients may have
/// gone), no connection in a transaction and none running a statement.
async fn until_settled(app: &TestApp) -> Duration {
    let started = Instant::now();
    while app.server.operations_in_flight() > 0
        || !open_transactions(app).await.is_empty()
        || busy_connections(app).await > 0
    {
        let open = open_transactions(app).await;
        assert!(started.elapsed() < Duration::from_secs(10), "transactions left open: {open:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
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
        assert!(matches!(answer, Some(Answer::Unavailable)), "a reserve of a locked row: {answer:?}");
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
    assert!(took < Duration::from_secs(5), "40 requests took {took:?} to be answered");
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
