//! The database stopped and started again, on a private cluster of the test's
//! own: the server survives it without a restart.

use super::*;

/// A private cluster that is never left running or on disk, even when the
/// test fails half-way.
pub(crate) struct PrivateCluster {
    pub(super) cluster: EmbeddedPostgres,
    pub(super) dir: PathBuf,
    pub(super) port: u16,
}

impl PrivateCluster {
    /// A fresh cluster on a port PostgreSQL could bind: PostgreSQL cannot
    /// be given a listening socket nor report a port it chose, so a port
    /// someone took between [`free_port`] and the start is replaced by another.
    pub(crate) async fn start() -> Self {
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

    /// A folder and a free port for a cluster that the code under test
    /// starts, cleaned up as one this started would be.
    pub(crate) fn unstarted() -> Self {
        let dir = std::env::temp_dir().join(format!("stockguard-faults-{}", Uuid::new_v4().simple()));
        let port = free_port();
        let cluster = EmbeddedPostgres::new(&dir, port).expect("PostgreSQL binaries are installed");
        Self { cluster, dir, port }
    }

    /// Its folder, where `pg_hba.conf` is.
    pub(crate) fn data_dir(&self) -> &std::path::Path {
        self.cluster.data_dir()
    }

    /// Its port on 127.0.0.1.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Whether its postmaster runs.
    pub(crate) async fn is_running(&self) -> bool {
        self.cluster.is_running().await
    }

    pub(crate) fn server_url(&self) -> String {
        format!("postgres://postgres@{}", self.host())
    }

    /// Where it listens, as a host of a multi-host URL (`127.0.0.1:port`).
    pub(crate) fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Stops it (fast shutdown: sessions are ended).
    pub(crate) async fn stop(&self) {
        self.cluster.stop().await.expect("stop the cluster");
    }

    /// A test server's options on this cluster: it gives up fast while the
    /// database is away.
    pub(crate) fn options(&self) -> Options {
        Options {
            server_url: Some(self.server_url()),
            acquire_timeout_ms: 500,
            statement_timeout_ms: 2000,
            ..Options::default()
        }
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
pub(super) async fn subscribe(address: &str, id: Uuid) -> Socket {
    let mut socket = connect(address, "graphql-transport-ws").await;
    let payload = json!({ "query": SUBSCRIPTION, "variables": { "id": id } });
    send(&mut socket, json!({ "id": "1", "type": "subscribe", "payload": payload })).await;
    socket
}

/// Whether `sql` counts more than zero, false while the database is away.
pub(crate) async fn any(db: &DatabaseConnection, sql: &str) -> bool {
    match db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await {
        Ok(Some(row)) => row.try_get_by_index::<i64>(0).is_ok_and(|n| n > 0),
        _ => false,
    }
}

pub(super) async fn readyz(app: &TestApp) -> u16 {
    let response = app.client.get(format!("{}/readyz", app.address)).send().await.expect("readyz answers");
    response.status().as_u16()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_restart_is_survived_without_restarting_the_server() {
    let cluster = PrivateCluster::start().await;
    let app = Arc::new(TestApp::spawn_with_options(cluster.options()).await);
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
                    if let Some(Answer::Retryable) = tally.record("reserve", sent) {
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
    cluster.stop().await;
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
        assert!(matches!(answer, Answer::Retryable), "reserve {n} while down: {answer:?}");
        // A refused connection fails at once; waiting for the pool instead
        // would take its 30 s acquire timeout.
        assert!(took < Duration::from_secs(10), "reserve {n} took {took:?} to fail");
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
            Answer::Retryable => false,
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
    cluster.stop().await;
}
