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

mod checks;
mod client;
mod faults;

use self::checks::*;
use self::client::*;
use self::faults::*;

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
