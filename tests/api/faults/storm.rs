//! Backends killed under load: every request is answered with a union member
//! or a retryable error, and the server recovers by itself.

use super::*;

/// What the clients of the storm got back.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) answered: AtomicUsize,
    pub(super) retryable: AtomicUsize,
    /// Union members per operation, e.g. `reserve Reserved`.
    pub(super) members: Mutex<BTreeMap<String, usize>>,
    /// Anything that is neither a union member nor a retryable error.
    pub(super) bad: Mutex<Vec<String>>,
}

impl Tally {
    pub(super) fn record(&self, operation: &str, sent: Result<Answer, reqwest::Error>) -> Option<Answer> {
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
            Answer::Retryable => {
                self.retryable.fetch_add(1, Ordering::Relaxed);
            }
            Answer::Bad(what) => self.bad.lock().expect("tally").push(format!("{operation}: {what}")),
        }
        Some(answer)
    }
}

/// One client of the storm: a mix of reserves with and without a key,
/// orders of one or two lines, and cancelling its own last order.
pub(super) async fn storm_client(
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
    // its last answer; then the server must serve again by itself.
    for client in clients {
        client.await.expect("client task");
    }
    let storm_over = Instant::now();
    let prober = app.token("prober", Role::Customer);
    let recovered = eventually(Duration::from_secs(10), "a reserve succeeds after the storm", || async {
        let input = json!({ "inventoryId": items[0] });
        let sent = ask(&client, &app.address, Some(&prober), "reserve", RESERVE, json!({ "input": input })).await;
        matches!(tally.record("probe", sent), Some(Answer::Member(name, _)) if name == "Reserved")
    })
    .await;

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

    assert_invariant_on(&app.db).await;
    let check = stockguard_check(&app.database_url);
    assert!(check.status.success(), "stockguard check: {}", String::from_utf8_lossy(&check.stdout));
}
