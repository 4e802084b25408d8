//! Failover under load, against the local formation of `examples/cluster.rs`
//! (brought up first when it is not up, and taken down again at the end).
//!
//! ```sh
//! cargo run --example failover                                   # every fault, 3 runs, 20 s of load each
//! cargo run --example failover -- --fault kill-primary --runs 1 --seconds 8   # one short run
//! ```
//!
//! `--clients` (64) clients go through HAProxy, each with its own token:
//! they reserve with an idempotency key, place orders with a key and cancel
//! them, and retry every retryable answer (`DATABASE_UNAVAILABLE`,
//! `OVERLOADED`, HTTP 502/503/504, a connection that broke) with the same
//! key, as a well-behaved client does, until it ends in a union member
//! (`cancelOrder` has no key: a retry that finds the order already
//! `CANCELLED` counts as the cancellation whose answer was lost). A
//! subscriber follows one hot inventory over a websocket through HAProxy.
//! Part-way through the load one fault is injected:
//!
//! - `planned`: `pg_autoctl perform failover`;
//! - `kill-primary`: `kill -9` of the primary's postmaster;
//! - `kill-app`: `kill -9` of one Stockguard process (restarted afterwards).
//!
//! Afterwards, on the primary: every reservation and order a client saw
//! committed exists (an acknowledged write lost is a violation); no
//! reservation or order exists that its client's retries did not end in;
//! nothing is oversold; the invariant and `stockguard check` hold; the
//! subscription received changes after the fault. Per run it prints the
//! requests answered, the retryable errors (and their rate before the
//! fault, the machine's own noise), the time from the fault to the first
//! success, the longest stretch without any success after it, and the
//! acknowledged writes lost. It exits 1 on any violation.

use std::{
    collections::HashSet,
    path::PathBuf,
    process::ExitCode,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use clap::{Parser, ValueEnum};
use futures::{SinkExt as _, StreamExt as _};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use serde_json::{Value, json};
use stockguard::auth::{Keys, Role};
use stockguard_support::{
    client::{Gql, Outcome},
    documents::brief::{CANCEL, PLACE_ORDER, RESERVE},
    formation::{self, APPS, Formation},
    process::server_binary,
};
use uuid::Uuid;

#[derive(Parser, Debug)]
#[command(about = "Stockguard failover under load: pg_auto_failover, three processes, HAProxy")]
struct Args {
    /// Which fault to inject.
    #[arg(long, value_enum, default_value = "all")]
    fault: FaultArg,
    /// Seconds of load per run (the fault comes at 40 %; the load goes on
    /// for at least 5 s after the first success after the fault).
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Runs of each fault.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Concurrent clients.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// The formation's folder (default target/cluster).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The formation's first port (see `cluster --help`).
    #[arg(long, default_value_t = 16000)]
    base_port: u16,
    /// The server binary (default: this profile's, built first).
    #[arg(long)]
    server_bin: Option<PathBuf>,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum FaultArg {
    Planned,
    KillPrimary,
    KillApp,
    All,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Planned,
    KillPrimary,
    KillApp,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Self::Planned => "planned",
            Self::KillPrimary => "kill-primary",
            Self::KillApp => "kill-app",
        }
    }
}

/// The process killed by `kill-app`.
const VICTIM_APP: usize = 2;

/// How long a client keeps retrying one request before it gives up (a violation).
const GIVE_UP: Duration = Duration::from_secs(120);

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("failover: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<bool> {
    let dir = args.dir.clone().unwrap_or_else(Formation::default_dir);
    let formation = Formation::new(&dir, args.base_port)?;
    let bin = server_binary(args.server_bin.as_deref(), "failover")?;
    let ours = !formation.is_up();
    if ours {
        if dir.exists() {
            bail!("{} holds a formation that is not up: `cargo run --example cluster -- down` first", dir.display());
        }
        eprintln!("failover: bringing the formation up");
        if let Err(err) = formation.up(&bin).await {
            let _ = formation.down().await;
            return Err(err.context("the formation did not come up"));
        }
    }
    let outcome = all_runs(&args, &formation, &bin).await;
    if ours {
        eprintln!("failover: taking the formation down");
        formation.down().await?;
    }
    outcome
}

async fn all_runs(args: &Args, formation: &Formation, bin: &std::path::Path) -> anyhow::Result<bool> {
    let faults = match args.fault {
        FaultArg::Planned => vec![Fault::Planned],
        FaultArg::KillPrimary => vec![Fault::KillPrimary],
        FaultArg::KillApp => vec![Fault::KillApp],
        FaultArg::All => vec![Fault::Planned, Fault::KillPrimary, Fault::KillApp],
    };
    let keys = Keys::new(formation.secret()?.as_bytes(), 86_400)?;
    let db = stockguard::db::connect(&formation.uri()?, &check_config(formation)?).await?;
    let mut reports = Vec::new();
    for fault in faults {
        for run in 1..=args.runs {
            formation.until_healthy(Duration::from_secs(180)).await?;
            eprintln!("failover: {} run {run}: {} clients for {} s", fault.name(), args.clients, args.seconds);
            let report = one_run(args, formation, bin, &keys, &db, fault, run).await?;
            println!("{}", report.line());
            reports.push(report);
        }
    }
    println!();
    println!(
        "| fault | run | requests answered | retryable errors | fault → first success | longest stretch without a success | acknowledged writes lost | violations |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for report in &reports {
        println!("{}", report.row());
    }
    let clean = reports.iter().all(|r| r.violations.is_empty());
    for report in reports.iter().filter(|r| !r.violations.is_empty()) {
        eprintln!("failover: {} run {} VIOLATIONS: {:#?}", report.fault.name(), report.run, report.violations);
    }
    db.close().await?;
    Ok(clean)
}

fn check_config(formation: &Formation) -> anyhow::Result<stockguard::config::DatabaseConfig> {
    Ok(stockguard::config::DatabaseConfig {
        database_url: Some(formation.uri()?),
        pool_size: 2,
        acquire_timeout_ms: 30_000,
        statement_timeout_ms: 30_000,
        ..stockguard::config::DatabaseConfig::default()
    })
}

/// What one run saw and found.
struct Report {
    fault: Fault,
    run: usize,
    answered: u64,
    retryable: u64,
    first_success: Option<Duration>,
    /// The longest stretch after the fault with no success at all: the outage as clients saw it.
    longest_gap: Duration,
    /// Retryable errors per second before the fault: the machine's own noise.
    baseline: f64,
    lost: usize,
    violations: Vec<String>,
}

impl Report {
    /// The figures, each with what it counts, in the order of the table.
    fn figures(&self) -> [(&'static str, String); 8] {
        [
            ("run", self.run.to_string()),
            ("answered", self.answered.to_string()),
            ("retryable errors", format!("{} ({:.1}/s before the fault)", self.retryable, self.baseline)),
            ("fault → first success", ms(self.first_success)),
            ("longest stretch without a success", ms(Some(self.longest_gap))),
            ("acknowledged writes lost", self.lost.to_string()),
            ("violations", self.violations.len().to_string()),
            ("fault", self.fault.name().to_owned()),
        ]
    }

    fn line(&self) -> String {
        let [run, rest @ .., (_, fault)] = self.figures();
        let rest: Vec<String> = rest.into_iter().map(|(what, value)| format!("{what} {value}")).collect();
        format!("{fault} run {}: {}", run.1, rest.join(", "))
    }

    fn row(&self) -> String {
        let [run, rest @ .., (_, fault)] = self.figures();
        let rest: Vec<String> = rest.into_iter().map(|(_, value)| value).collect();
        format!("| {fault} | {} | {} |", run.1, rest.join(" | "))
    }
}

fn ms(duration: Option<Duration>) -> String {
    duration.map_or_else(|| "—".to_owned(), |d| format!("{} ms", d.as_millis()))
}

/// What the clients saw, shared by all of them.
#[derive(Default)]
struct Seen {
    /// Definitive answers (union members).
    answered: AtomicU64,
    /// Retryable errors and broken connections, each retried.
    retryable: AtomicU64,
    /// Reservations answered `Reserved`.
    reserved: Mutex<Vec<Uuid>>,
    /// Orders answered `OrderPlaced`.
    placed: Mutex<Vec<Uuid>>,
    /// Orders answered `OrderCancelled`.
    cancelled: Mutex<Vec<Uuid>>,
    /// Answers that are neither a union member nor retryable, or requests given up.
    bad: Mutex<Vec<String>>,
    /// When each success arrived and its request was sent.
    successes: Mutex<Vec<(Instant, Instant)>>,
    /// When each retryable error arrived.
    errors: Mutex<Vec<Instant>>,
    /// Retryable errors by code.
    codes: Mutex<std::collections::BTreeMap<String, u64>>,
}

/// Whether an error is one a client retries with the same request.
fn retryable(code: &str) -> bool {
    matches!(code, "DATABASE_UNAVAILABLE" | "OVERLOADED") || code.starts_with("HTTP")
}

impl Seen {
    /// Sends `query` until it ends in a union member (retrying retryable
    /// errors with the same variables, so the same key); the member, and
    /// whether an attempt before it failed (so it may have committed).
    async fn until_answered(
        &self,
        gql: &Gql,
        token: &str,
        query: &str,
        variables: Value,
        field: &str,
    ) -> Option<(String, Value, bool)> {
        let started = Instant::now();
        let mut retried = false;
        loop {
            let sent = Instant::now();
            match gql.call(token, query, variables.clone(), field).await {
                Outcome::Ok(name, data) => {
                    self.answered.fetch_add(1, Ordering::Relaxed);
                    lock(&self.successes).push((Instant::now(), sent));
                    return Some((name, data, retried));
                }
                Outcome::Error(code) if retryable(&code) => {
                    retried = true;
                    self.retryable.fetch_add(1, Ordering::Relaxed);
                    lock(&self.errors).push(Instant::now());
                    *lock(&self.codes).entry(code.clone()).or_default() += 1;
                    if started.elapsed() > GIVE_UP {
                        lock(&self.bad).push(format!("{field}: gave up after {GIVE_UP:?} of {code}"));
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Outcome::Error(code) => {
                    lock(&self.bad).push(format!("{field}: {code}"));
                    return None;
                }
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn address() -> Value {
    json!({ "name": "Failover Test", "line1": "1 Main St", "city": "Lisbon", "postalCode": "1100-148", "country": "PT" })
}

async fn one_run(
    args: &Args,
    formation: &Formation,
    bin: &std::path::Path,
    keys: &Keys,
    db: &DatabaseConnection,
    fault: Fault,
    run: usize,
) -> anyhow::Result<Report> {
    let tag = format!("fo-{}-{run}-{}", fault.name(), &Uuid::new_v4().simple().to_string()[..6]);
    let gql = Arc::new(Gql::new(&formation.url(), args.clients)?);
    let operator = keys.mint("operator", Role::Operator, chrono::Duration::hours(2))?;
    // Plenty of stock on most items, two that sell out during the run, and
    // separate items for orders, so each check reads only its own rows.
    let mut reserve_items = Vec::new();
    for (i, stock) in [1_000_000, 1_000_000, 1_000_000, 1_000_000, 300, 300].into_iter().enumerate() {
        reserve_items.push(create(&gql, &operator, &format!("{tag}-R{i}"), stock).await?);
    }
    let mut order_items = Vec::new();
    for i in 0..2 {
        order_items.push(create(&gql, &operator, &format!("{tag}-O{i}"), 1_000_000).await?);
    }
    let hot = reserve_items[0];

    let seen = Arc::new(Seen::default());
    let stop = Arc::new(AtomicBool::new(false));
    let changes = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let reconnects = Arc::new(AtomicU64::new(0));
    let subscriber = tokio::spawn(subscribe(formation.url(), hot, changes.clone(), reconnects.clone(), stop.clone()));

    let clients: Vec<_> = (0..args.clients)
        .map(|n| {
            let client = Client {
                gql: gql.clone(),
                seen: seen.clone(),
                stop: stop.clone(),
                token: keys.mint(&format!("{tag}-u{n}"), Role::Customer, chrono::Duration::hours(2)),
                reserve_items: reserve_items.clone(),
                order_items: order_items.clone(),
                n,
            };
            tokio::spawn(client.run())
        })
        .collect();

    let load_started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(args.seconds as f64 * 0.4)).await;
    eprintln!("failover: {} run {run}: injecting the fault", fault.name());
    let fault_at = inject(formation, fault).await?;
    let before_fault = lock(&seen.errors).iter().filter(|at| **at < fault_at).count();
    let baseline = before_fault as f64 / fault_at.duration_since(load_started).as_secs_f64();
    // Load until the planned time is over and for 5 s after the first
    // success sent after the fault (at most 3 minutes).
    let planned_end = load_started + Duration::from_secs(args.seconds);
    let cap = Instant::now() + Duration::from_secs(180);
    loop {
        let now = Instant::now();
        let recovered = lock(&seen.successes).iter().filter(|(_, sent)| *sent > fault_at).map(|(at, _)| *at).min();
        if (now >= planned_end && recovered.is_some_and(|at| now >= at + Duration::from_secs(5))) || now > cap {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.context("a client task panicked")?;
    }
    let load_ended = Instant::now();

    // The database settles (the old primary back as a standby), then the checks.
    formation.until_healthy(Duration::from_secs(180)).await?;
    let mut violations = Vec::new();
    let lost = check(db, &seen, &reserve_items, &order_items, &tag, &mut violations).await?;
    let check_run = std::process::Command::new(bin)
        .arg("check")
        .env("DATABASE_URL", formation.uri()?)
        .stdin(std::process::Stdio::null())
        .output()?;
    if !check_run.status.success() {
        violations.push(format!("stockguard check: {}", String::from_utf8_lossy(&check_run.stdout).trim()));
    }
    // The subscription: changes after the fault, on the same socket unless
    // its own process was the one killed.
    stop.store(true, Ordering::Relaxed);
    let _ = tokio::time::timeout(Duration::from_secs(5), subscriber).await;
    let after = lock(&changes).iter().filter(|at| **at > fault_at && **at <= load_ended).count();
    let reconnected = reconnects.load(Ordering::Relaxed);
    if after == 0 {
        violations.push("the subscription received no change after the fault".into());
    }
    eprintln!(
        "failover: {} run {run}: subscription: {after} changes after the fault, {reconnected} reconnects",
        fault.name()
    );
    if fault == Fault::KillApp {
        formation.start_app(bin, VICTIM_APP).await?;
    } else if reconnected > 0 {
        violations.push(format!("the subscription's socket broke {reconnected} times in a database fault"));
    }
    for n in 1..=APPS {
        formation::wait_for(&format!("Stockguard {n} ready again"), Duration::from_secs(60), || async {
            formation::ready(&format!("{}/readyz", formation.app_url(n))).await
        })
        .await?;
    }
    eprintln!("failover: {} run {run}: retryable errors by code: {:?}", fault.name(), lock(&seen.codes));
    violations.extend(lock(&seen.bad).iter().cloned());
    let successes = lock(&seen.successes);
    let first_success = successes.iter().filter(|(_, sent)| *sent >= fault_at).map(|(at, _)| *at - fault_at).min();
    let mut arrivals: Vec<Instant> = successes.iter().map(|(at, _)| *at).filter(|at| *at >= fault_at).collect();
    arrivals.sort();
    let longest_gap = std::iter::once(fault_at)
        .chain(arrivals.iter().copied())
        .zip(arrivals.iter().copied())
        .map(|(before, after)| after - before)
        .max()
        .unwrap_or_default();
    Ok(Report {
        fault,
        run,
        answered: seen.answered.load(Ordering::Relaxed),
        retryable: seen.retryable.load(Ordering::Relaxed),
        first_success,
        longest_gap,
        baseline,
        lost,
        violations,
    })
}

/// One well-behaved client: reserves with a fresh key each round, every
/// eighth round places an order (with a key) instead, and cancels every
/// other order it placed; every request is retried until it is answered.
struct Client {
    gql: Arc<Gql>,
    seen: Arc<Seen>,
    stop: Arc<AtomicBool>,
    token: Result<String, jsonwebtoken::errors::Error>,
    reserve_items: Vec<Uuid>,
    order_items: Vec<Uuid>,
    /// Which client, to spread the items.
    n: usize,
}

impl Client {
    async fn run(self) {
        let Ok(token) = &self.token else { return };
        let seen = &self.seen;
        let mut round = 0usize;
        while !self.stop.load(Ordering::Relaxed) {
            round += 1;
            if !round.is_multiple_of(8) {
                let item = self.reserve_items[(self.n + round) % self.reserve_items.len()];
                let input = json!({ "i": { "inventoryId": item, "idempotencyKey": format!("r-{round}") } });
                let Some((name, data, _)) = seen.until_answered(&self.gql, token, RESERVE, input, "reserve").await
                else {
                    continue;
                };
                match name.as_str() {
                    "Reserved" => match data["reservation"]["id"].as_str().and_then(|id| id.parse().ok()) {
                        Some(id) => lock(&seen.reserved).push(id),
                        None => lock(&seen.bad).push("Reserved without an id".into()),
                    },
                    "SoldOut" => {}
                    other => lock(&seen.bad).push(format!("reserve: {other}")),
                }
                continue;
            }
            let input = json!({ "i": {
                "items": [{ "inventoryId": self.order_items[round % self.order_items.len()], "quantity": 1 }],
                "shippingAddress": address(),
                "idempotencyKey": format!("o-{round}"),
            }});
            let Some((name, data, _)) = seen.until_answered(&self.gql, token, PLACE_ORDER, input, "placeOrder").await
            else {
                continue;
            };
            let Some(id) =
                data["order"]["id"].as_str().and_then(|id| id.parse().ok()).filter(|_| name == "OrderPlaced")
            else {
                lock(&seen.bad).push(format!("placeOrder: {name}"));
                continue;
            };
            lock(&seen.placed).push(id);
            if round.is_multiple_of(16)
                && let Some((name, data, retried)) =
                    seen.until_answered(&self.gql, token, CANCEL, json!({ "id": id }), "cancelOrder").await
            {
                // cancelOrder has no key: when an attempt failed with its
                // commit in flight (the primary killed), the retry finds
                // the order already CANCELLED, which is that attempt's work.
                let ours = retried && name == "OrderCannotBeCancelled" && data["order"]["status"] == "CANCELLED";
                if name == "OrderCancelled" || ours {
                    lock(&seen.cancelled).push(id);
                } else {
                    lock(&seen.bad).push(format!("cancelOrder: {name}"));
                }
            }
        }
    }
}

/// Creates an inventory through HAProxy (before any fault; retried while the formation settles).
async fn create(gql: &Gql, operator: &str, sku: &str, stock: i64) -> anyhow::Result<Uuid> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match gql.create_inventory(operator, sku, sku, stock).await {
            Ok(id) => return Ok(id),
            Err(err) if Instant::now() < deadline => {
                eprintln!("failover: createInventory {sku}: {err:#}; again");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(err) => return Err(err),
        }
    }
}

/// Injects `fault`; when it took effect: when a planned failover was asked
/// for (it returns once done), or when the signal was sent.
async fn inject(formation: &Formation, fault: Fault) -> anyhow::Result<Instant> {
    let at = match fault {
        Fault::Planned => {
            let dir = formation.dir.clone();
            let base = formation.ports.base;
            let asked = Instant::now();
            tokio::task::spawn_blocking(move || Formation::new(&dir, base)?.perform_failover()).await??;
            eprintln!("failover: pg_autoctl perform failover returned after {:.1?}", asked.elapsed());
            asked
        }
        Fault::KillPrimary => {
            let primary = formation.primary()?.context("no primary to kill")?;
            let pid = formation.postmaster_pid(&primary.name)?;
            eprintln!("failover: kill -9 {pid} (the postmaster of {}, the primary)", primary.name);
            kill9(pid)?
        }
        Fault::KillApp => {
            let pid = formation.app_pid(VICTIM_APP).context("no pid of the victim app")?;
            eprintln!("failover: kill -9 {pid} (Stockguard {VICTIM_APP})");
            kill9(pid)?
        }
    };
    Ok(at)
}

/// `kill -9 pid`; the moment it returned (the signal was delivered by then).
fn kill9(pid: u32) -> anyhow::Result<Instant> {
    let status = std::process::Command::new("kill").arg("-KILL").arg(pid.to_string()).status()?;
    if !status.success() {
        bail!("kill -9 {pid} failed");
    }
    Ok(Instant::now())
}

/// The checks on the primary; how many acknowledged writes are missing.
async fn check(
    db: &DatabaseConnection,
    seen: &Seen,
    reserve_items: &[Uuid],
    order_items: &[Uuid],
    tag: &str,
    violations: &mut Vec<String>,
) -> anyhow::Result<usize> {
    let ids = |sql: String| async move {
        let rows = db.query_all_raw(Statement::from_string(DbBackend::Postgres, sql)).await?;
        rows.iter().map(|row| row.try_get_by_index::<Uuid>(0)).collect::<Result<HashSet<Uuid>, _>>()
    };
    let list = |items: &[Uuid]| items.iter().map(|id| format!("'{id}'")).collect::<Vec<_>>().join(",");
    let acknowledged: HashSet<Uuid> = lock(&seen.reserved).iter().copied().collect();
    let stored = ids(format!(
        "SELECT id FROM reservations WHERE inventory_id IN ({}) AND order_id IS NULL",
        list(reserve_items)
    ))
    .await?;
    let lost_reservations = acknowledged.difference(&stored).count();
    let phantom_reservations = stored.difference(&acknowledged).count();
    let placed: HashSet<Uuid> = lock(&seen.placed).iter().copied().collect();
    let orders = ids(format!("SELECT id FROM orders WHERE user_id LIKE '{tag}-%'")).await?;
    let lost_orders = placed.difference(&orders).count();
    let phantom_orders = orders.difference(&placed).count();
    let cancelled: Vec<Uuid> = lock(&seen.cancelled).clone();
    let still_open = if cancelled.is_empty() {
        0
    } else {
        ids(format!("SELECT id FROM orders WHERE id IN ({}) AND status <> 'CANCELLED'", list(&cancelled))).await?.len()
    };
    if lost_reservations + lost_orders + still_open > 0 {
        violations.push(format!(
            "acknowledged writes lost: {lost_reservations} reservations, {lost_orders} orders, {still_open} cancellations"
        ));
    }
    if phantom_reservations + phantom_orders > 0 {
        violations.push(format!(
            "{phantom_reservations} reservations and {phantom_orders} orders exist that no client's retries ended in"
        ));
    }
    let negative = ids(format!(
        "SELECT id FROM inventories WHERE stock < 0 AND id IN ({},{})",
        list(reserve_items),
        list(order_items)
    ))
    .await?;
    if !negative.is_empty() {
        violations.push(format!("oversold: {negative:?}"));
    }
    let drifts = stockguard::invariant::check(db).await?;
    if !drifts.is_empty() {
        violations.push(format!("invariant: {drifts:?}"));
    }
    eprintln!(
        "failover: checked {} reservations and {} orders acknowledged, {} cancellations",
        acknowledged.len(),
        placed.len(),
        cancelled.len()
    );
    Ok(lost_reservations + lost_orders + still_open)
}

/// Follows `inventoryChanged` of `id` through HAProxy until `stop`,
/// recording when each change arrives; reconnects (counted) when the socket breaks.
async fn subscribe(
    base: String,
    id: Uuid,
    changes: Arc<Mutex<Vec<Instant>>>,
    reconnects: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) {
    use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest as _, http::HeaderValue};
    let mut first = true;
    while !stop.load(Ordering::Relaxed) {
        if !first {
            reconnects.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        first = false;
        let Ok(mut request) = format!("{}/graphql/ws", base.replace("http://", "ws://")).into_client_request() else {
            return;
        };
        request.headers_mut().insert("Sec-WebSocket-Protocol", HeaderValue::from_static("graphql-transport-ws"));
        let Ok(Ok((mut socket, _))) =
            tokio::time::timeout(Duration::from_secs(5), tokio_tungstenite::connect_async(request)).await
        else {
            continue;
        };
        let init = json!({ "type": "connection_init", "payload": {} }).to_string();
        let query = "subscription($id: UUID!) { inventoryChanged(id: $id) { version } }";
        let subscribe =
            json!({ "id": "1", "type": "subscribe", "payload": { "query": query, "variables": { "id": id } } });
        if socket.send(Message::text(init)).await.is_err()
            || socket.send(Message::text(subscribe.to_string())).await.is_err()
        {
            continue;
        }
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let message = match tokio::time::timeout(Duration::from_millis(500), socket.next()).await {
                Err(_) => continue,
                Ok(Some(Ok(message))) => message,
                Ok(_) => break,
            };
            match message {
                Message::Text(text) => {
                    let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                    match value["type"].as_str() {
                        Some("next") => lock(&changes).push(Instant::now()),
                        Some("ping") => {
                            let _ = socket.send(Message::text(json!({ "type": "pong" }).to_string())).await;
                        }
                        Some("error" | "complete") => break,
                        _ => {}
                    }
                }
                Message::Close(_) => break,
                _ => {}
            }
        }
    }
}
