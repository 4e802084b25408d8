//! The soak: a mixed workload for minutes, against its own server and database.
//!
//! ```sh
//! cargo run --release --example soak                 # 5 minutes at 64 clients
//! cargo run --example soak -- --seconds 20           # as CI runs it
//! ```
//!
//! It starts the `stockguard` server of this example's profile (built first
//! with cargo, as the benchmark does) on a fresh database `sg_soak_<random>`
//! with a reservation TTL of 2 s and a sweep every 200 ms, so reservations
//! expire all through the run. It seeds 50 inventories (45 with plenty of
//! stock, 5 scarce ones that sell out) and runs `--clients` clients, each with
//! its own customer token, for `--seconds`. Every client loops over reserve
//! (plain, with `expectedVersion`, with an idempotency key sent twice),
//! release, extend, reserveMany, placeOrder, confirm (with the operator's
//! token), cancel and changeShippingAddress; reservations it does not
//! release expire.
//!
//! It fails (exit 1) when any error other than `DATABASE_UNAVAILABLE` or
//! `OVERLOADED` (HTTP 503) came back, when the server's RSS grew by 10 % or
//! more between the end of a 5 s warm-up and the end of the run, when nothing
//! expired, when the invariant does not hold (checked from the database and
//! by `stockguard check`), or when the server does not exit 0 on SIGTERM.
//! The report goes to stdout, progress to stderr, the server's log to a file
//! in the temporary directory (its path is printed).

mod workload;

use self::workload::*;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use clap::Parser;
use rand::{RngExt as _, SeedableRng as _, rngs::SmallRng, seq::IndexedRandom as _};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement};
use serde_json::{Value, json};
use stockguard::auth::{Keys, Role};
use stockguard_support::{
    client::{Gql, Outcome},
    database::{self, ThrowAway},
    documents::brief::{CANCEL, CHANGE_ADDRESS, CONFIRM, EXTEND, PLACE_ORDER, RELEASE, RESERVE, RESERVE_MANY},
    process::{Log, ServerProcess, server_binary, status_kb},
};
use uuid::Uuid;

#[derive(Parser, Debug)]
#[command(about = "Stockguard's soak: a mixed workload against its own server and database")]
struct Args {
    /// How long the clients run, in seconds (the first 5 are the warm-up).
    #[arg(long, default_value_t = 300)]
    seconds: u64,
    /// Concurrent clients, each with its own customer token.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// PostgreSQL server URL without a database name; `sg_soak_<random>` is
    /// created there. Default: the server the tests use, found as they find
    /// it (`stockguard_support::database::server_url`).
    #[arg(long)]
    database_url_base: Option<String>,
    /// The server binary. Default: `stockguard` of this example's profile
    /// (target/<profile>/stockguard), built first with cargo.
    #[arg(long)]
    server_bin: Option<PathBuf>,
}

/// Warm-up before the "start" RSS is read.
const WARM_UP: Duration = Duration::from_secs(5);
/// RSS growth from the end of the warm-up to the end that fails the soak.
const MAX_RSS_GROWTH_PERCENT: f64 = 10.0;
/// Error codes a healthy server may answer under load: both are retryable.
const TOLERATED: [&str; 2] = ["DATABASE_UNAVAILABLE", "OVERLOADED"];
/// Inventories seeded: the first `SCARCE` of them with little stock.
const INVENTORIES: usize = 50;
const SCARCE: usize = 5;
/// Reservation lifetime and sweep interval of the server under test.
const TTL_SECS: u32 = 2;
const SWEEP_INTERVAL_MS: u32 = 200;

// ---------------------------------------------------------------------------
// What the clients send

fn address(rng: &mut SmallRng) -> Value {
    let n: u32 = rng.random_range(1..10_000);
    json!({ "name": "Soak Tester", "line1": format!("{n} Main St"), "city": "Osaka",
            "postalCode": "530-0001", "country": "JP" })
}

// ---------------------------------------------------------------------------
// The run

async fn seed(gql: &Gql, operator: &str) -> anyhow::Result<Vec<Uuid>> {
    let mut ids = Vec::with_capacity(INVENTORIES);
    for i in 0..INVENTORIES {
        let stock = if i < SCARCE { 20 } else { 1_000_000_000 };
        let created = gql.create_inventory(operator, &format!("SOAK-{i:02}"), &format!("soak item {i}"), stock).await;
        ids.push(created.context("seeding failed")?);
    }
    Ok(ids)
}

async fn count_by(db: &DatabaseConnection, sql: &str) -> anyhow::Result<BTreeMap<String, i64>> {
    let rows = db.query_all_raw(Statement::from_string(DbBackend::Postgres, sql)).await?;
    rows.iter().map(|row| Ok((row.try_get_by_index::<String>(0)?, row.try_get_by_index::<i64>(1)?))).collect()
}

fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

fn listing(counts: &BTreeMap<String, impl std::fmt::Display>) -> String {
    counts.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
}

/// The run between creating and dropping the database: the report and
/// whether the soak passed.
async fn soak(args: &Args, server_bin: &Path, database_url: &str, log: &Path) -> anyhow::Result<(String, bool)> {
    let secret = Keys::random_secret();
    let keys = Keys::new(secret.as_bytes(), stockguard::config::DEFAULT_MAX_TOKEN_TTL_SECS)?;
    let ttl = chrono::Duration::seconds(i64::try_from(args.seconds)? + 600);
    let log_file = std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let env = [
        ("STOCKGUARD_RESERVATION_TTL_SECS", TTL_SECS.to_string()),
        ("STOCKGUARD_SWEEP_INTERVAL_MS", SWEEP_INTERVAL_MS.to_string()),
    ];
    let server = ServerProcess::start(server_bin, database_url, Some(&secret), &env, Log::Warnings(log_file.into()))
        .await
        .with_context(|| format!("server log: {}", log.display()))?;
    let gql = Gql::new(&server.url, args.clients)?;
    let operator = keys.mint("soak-operator", Role::Operator, ttl)?;
    let inventories = seed(&gql, &operator).await?;
    eprintln!("soak: seeded {INVENTORIES} inventories; {} clients for {} s", args.clients, args.seconds);

    let started = Instant::now();
    let shared = Arc::new(Shared {
        gql,
        operator,
        inventories,
        deadline: started + Duration::from_secs(args.seconds),
        requests: AtomicU64::new(0),
    });
    let mut tasks = Vec::with_capacity(args.clients);
    for i in 0..args.clients {
        let client = Client {
            shared: shared.clone(),
            token: keys.mint(&format!("soak-{i}"), Role::Customer, ttl)?,
            rng: SmallRng::seed_from_u64(rand::random::<u64>() ^ i as u64),
            tally: Tally::default(),
            reservations: Vec::new(),
            orders: Vec::new(),
            versions: BTreeMap::new(),
            keys: 0,
        };
        tasks.push(tokio::spawn(client.run()));
    }

    // The RSS at the end of the warm-up, then every 30 s (with progress).
    tokio::time::sleep(WARM_UP.min(Duration::from_secs(args.seconds))).await;
    let rss_start = status_kb(server.pid, "VmRSS").context("the server's VmRSS")?;
    let timeline = Arc::new(std::sync::Mutex::new(vec![(started.elapsed().as_secs(), rss_start)]));
    let progress = tokio::spawn({
        let (shared, timeline, pid) = (shared.clone(), timeline.clone(), server.pid);
        async move {
            let period = Duration::from_secs(30);
            let mut every = tokio::time::interval_at(tokio::time::Instant::from_std(started) + period, period);
            loop {
                every.tick().await;
                let (secs, rss) = (started.elapsed().as_secs(), status_kb(pid, "VmRSS").unwrap_or(0));
                eprintln!(
                    "soak: {secs} s, {} requests, RSS {:.1} MiB",
                    shared.requests.load(Ordering::Relaxed),
                    mib(rss)
                );
                timeline.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((secs, rss));
            }
        }
    });
    let requests_at_start = shared.requests.load(Ordering::Relaxed);

    let mut tally = Tally::default();
    for task in tasks {
        tally.merge(task.await?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    progress.abort();
    let rss_end = status_kb(server.pid, "VmRSS").context("the server's VmRSS")?;
    let mut timeline = timeline.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    timeline.push((started.elapsed().as_secs(), rss_end));

    // Let the sweeper catch up with what expired in the last seconds, then check.
    tokio::time::sleep(Duration::from_millis(u64::from(TTL_SECS) * 1000 + 3 * u64::from(SWEEP_INTERVAL_MS))).await;
    let db = Database::connect(database_url).await.context("connect for the checks")?;
    let drifts = stockguard::invariant::check(&db).await.context("invariant check")?;
    let reservations = count_by(&db, "SELECT status, count(*) FROM reservations GROUP BY status").await?;
    let orders = count_by(&db, "SELECT status, count(*) FROM orders GROUP BY status").await?;
    let movements = count_by(&db, "SELECT reason, count(*) FROM stock_movements GROUP BY reason").await?;
    db.close().await?;
    let check = std::process::Command::new(server_bin)
        .args(["check", "--database-url", database_url])
        .env("RUST_LOG", "warn")
        .output()
        .context("cannot run stockguard check")?;
    let stopped = server.stop().await;

    // The report.
    let mut failures = Vec::new();
    let mut out = String::new();
    let total: u64 = tally.requests.values().sum();
    out.push_str(&format!(
        "Soak: {} clients, {elapsed:.0} s, {INVENTORIES} inventories ({SCARCE} scarce), \
         TTL {TTL_SECS} s, sweep every {SWEEP_INTERVAL_MS} ms\n",
        args.clients
    ));
    out.push_str(&format!(
        "Server: {}\n\nRequests: {total} ({:.0}/s; {} after the warm-up)\n",
        server_bin.display(),
        total as f64 / elapsed,
        total.saturating_sub(requests_at_start)
    ));
    for (op, n) in &tally.requests {
        out.push_str(&format!(
            "  {:<24}{n:>8}  {}",
            op.name(),
            tally.outcomes.get(op).map(listing).unwrap_or_default()
        ));
        if let Some(errors) = tally.errors.get(op) {
            out.push_str(&format!("; errors: {}", listing(errors)));
        }
        out.push('\n');
    }
    let by_code = tally.errors_by_code();
    let error_total: u64 = by_code.values().sum();
    out.push_str(&format!(
        "Errors: {error_total}{}\n",
        if by_code.is_empty() { String::new() } else { format!(" ({})", listing(&by_code)) }
    ));
    for code in by_code.keys().filter(|code| !TOLERATED.contains(&code.as_str())) {
        failures.push(format!("error {code} (only {} are tolerated)", TOLERATED.join(" and ")));
    }

    let growth = (rss_end as f64 - rss_start as f64) / rss_start as f64 * 100.0;
    out.push_str(&format!(
        "Server RSS: {:.1} MiB after the {} s warm-up, {:.1} MiB at the end: {growth:+.1} % \
         (limit {MAX_RSS_GROWTH_PERCENT} %)\n",
        mib(rss_start),
        WARM_UP.as_secs(),
        mib(rss_end)
    ));
    let samples: Vec<String> = timeline.iter().map(|(secs, kb)| format!("{secs} s {:.1}", mib(*kb))).collect();
    out.push_str(&format!("RSS over time (MiB): {}\n", samples.join(", ")));
    if growth >= MAX_RSS_GROWTH_PERCENT {
        failures.push(format!("the server's RSS grew by {growth:.1} %"));
    }

    out.push_str(&format!("Reservations: {}\n", listing(&reservations)));
    out.push_str(&format!("Orders: {}\n", listing(&orders)));
    out.push_str(&format!("Ledger: {}\n", listing(&movements)));
    let expired = reservations.get("EXPIRED").copied().unwrap_or(0);
    out.push_str(&format!(
        "Expiry: {expired} reservations expired by the sweeper; clients saw {} as EXPIRED\n",
        tally.seen_expired
    ));
    if expired == 0 {
        failures.push("no reservation expired".into());
    }

    if drifts.is_empty() {
        out.push_str("Invariant (stockguard::invariant::check): holds for every inventory\n");
    } else {
        for drift in &drifts {
            out.push_str(&format!("Invariant: DRIFT {drift}\n"));
        }
        failures.push(format!("the invariant is broken for {} inventories", drifts.len()));
    }
    let check_said = String::from_utf8_lossy(&check.stdout).trim().to_owned();
    out.push_str(&format!("stockguard check: {} ({check_said})\n", check.status));
    if !check.status.success() {
        failures.push(format!("stockguard check: {}", check.status));
    }
    match stopped {
        Ok(status) => {
            out.push_str(&format!("SIGTERM: the server stopped with {status}\n"));
            if !status.success() {
                failures.push(format!("the server exited with {status} on SIGTERM"));
            }
        }
        Err(err) => failures.push(format!("stopping the server: {err:#}")),
    }
    if failures.is_empty() {
        out.push_str("PASS\n");
    } else {
        out.push_str(&format!("FAIL: {}\n", failures.join("; ")));
    }
    Ok((out, failures.is_empty()))
}

#[tokio::main]
async fn main() -> anyhow::Result<std::process::ExitCode> {
    let args = Args::parse();
    if args.seconds == 0 || args.clients == 0 {
        bail!("--seconds and --clients must be at least 1");
    }
    let server_bin = server_binary(args.server_bin.as_deref(), "soak")?;
    let base = database::given_or_found(args.database_url_base.as_deref())?;
    let database = ThrowAway::create(&base, "soak").await?;
    let log = std::env::temp_dir().join(format!("{}.log", database.name));
    eprintln!("soak: database {}, server {}, server log {}", database.name, server_bin.display(), log.display());

    let result = soak(&args, &server_bin, &database.url, &log).await;
    database.drop("soak").await;
    let (report, passed) = result?;
    println!("{report}");
    Ok(if passed {
        std::process::ExitCode::SUCCESS
    } else {
        eprintln!("soak: FAILED (server log: {})", log.display());
        std::process::ExitCode::FAILURE
    })
}
