//! The benchmark: one command, its own server, its own database.
//!
//! ```sh
//! cargo run --release --example bench              # the full run (about 5 minutes)
//! cargo run --example bench -- --smoke             # 2-second smoke, as CI runs it
//! ```
//!
//! It builds and starts the `stockguard` server of the same profile as this
//! example on a fresh database `sg_bench_<random>`, seeds HOT (one row) and
//! SPREAD (10,000 rows) with a stock of 10^9, and drives `reserve` over HTTP
//! with keep-alive clients, each with its own token, at every `--clients`
//! count for `--duration-secs`. In the same cell it measures the raw-SQL
//! limit: the server's own reserve statement (`RESERVE_SQL`, with the
//! server's TTL), prepared, through as many direct database connections,
//! with no HTTP and no GraphQL. The two sides take turns in `--rounds`
//! rounds (each after `--warmup-secs`, every other round in reverse), so
//! whatever else the machine does falls on both alike; before each cell the
//! inventories are vacuumed and a checkpoint is taken, as pgbench does. With
//! `--history N`, SPREAD is also measured beside a second database holding N
//! rows of history (see `history.rs`); with `--baseline-bin PATH`, HOT,
//! SPREAD and MULTI beside the server of another build (see `baseline.rs`); with
//! `--webhook`, HOT and SPREAD beside a server of this build with one webhook
//! endpoint, the events' lag over `--webhook-secs` and a check that every
//! change arrived (see `webhook.rs`); with `--traces RATIO`, HOT and SPREAD
//! beside a server of this build exporting that share of its traces (see
//! `traces.rs`). Then MULTI: a catalogue spread over 4
//! locations, reserved 1–3 units at a time, against the limit of the server's
//! multi-location reserve statement (`scenarios/multi.rs`). Then it compares strategies on HOT (plain
//! `reserve` vs `expectedVersion` with re-read and up to 3 retries) and one
//! contested order in optimistic vs pessimistic locking (the server is
//! restarted for the second mode). Last, KIT and KIT+SINGLES: 2,500 kits of
//! 4 SPREAD inventories, reserved with `reserveKit` (and, in KIT+SINGLES, by
//! half the clients, their components with `reserve`), against the limit of
//! the server's kit statement (`scenarios/kits.rs`); last so that every
//! cell before it measures the database it always has. With `--drop`, after
//! them, a drop with a waiting list: offers per second and the time from a
//! unit's release to its offer (`drop.rs`).
//!
//! After every run the docs/design.md invariant is checked from the database; a
//! violation (or a reserve run with no successful reservation at all) makes
//! the benchmark exit 1. The report is a markdown table on stdout and, for a
//! full run (or with `--out`), `bench/results/latest.md` and the chart
//! `bench/results/reservations.svg`. Progress goes to stderr.
//!
//! `bench load` drives the same client loops against a server that is
//! already running (not part of the tests), reporting requests per second,
//! latency percentiles and outcome counts:
//!
//! ```sh
//! export STOCKGUARD_JWT_SECRET=$(openssl rand -hex 32)   # at least 32 bytes
//! cargo run --release &
//! cargo run --release --example bench -- load --secret "$STOCKGUARD_JWT_SECRET" reserve --clients 64 --total 10000
//! cargo run --release --example bench -- load --secret "$STOCKGUARD_JWT_SECRET" order --clients 64 --seconds 10
//! cargo run --release --example bench -- load --secret "$STOCKGUARD_JWT_SECRET" checkout --clients 32 --seconds 10
//! ```
//!
//! The code: `measure.rs` (what was used and recorded, the statistics),
//! `scenarios.rs` (the client loops and the benchmark's runs), `report.rs`
//! (markdown and chart), `load.rs` (the load tool); the server, the
//! database, the GraphQL client and the documents are the workspace's
//! `stockguard-support` crate (`support/`), shared with the soak and the tests.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::bail;
use clap::{Parser, Subcommand};
use stockguard::auth::Keys;

use measure::{clk_tck, machine};
use report::{Report, Strategy};
use scenarios::{Bench, Invariant, Scenario, Shop, server_ttl_secs, show};
use stockguard_support::{
    database::{self, ThrowAway},
    process::{Log, ServerProcess, server_binary, status_kb},
};

mod baseline;
mod drop;
mod history;
mod load;
mod measure;
mod pairs;
mod report;
mod scenarios;
mod traces;
mod webhook;

#[derive(Parser, Debug)]
#[command(
    about = "Stockguard's benchmark: the server against the raw-SQL limit, on a fresh database",
    args_conflicts_with_subcommands = true
)]
struct Args {
    /// Instead of the benchmark: a load against a running server.
    #[command(subcommand)]
    command: Option<Command>,
    /// Measured seconds per run (for a reserve cell: per side, over all its rounds).
    #[arg(long, default_value_t = 10)]
    duration_secs: u64,
    /// Warm-up seconds before each run or round (requests not counted).
    #[arg(long, default_value_t = 1)]
    warmup_secs: u64,
    /// Rounds per reserve cell: Stockguard and raw SQL take turns this many
    /// times, so a slow patch of the machine (a checkpoint, another process)
    /// falls on both sides alike.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Concurrent clients, one cell per count.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    clients: Vec<usize>,
    /// CI smoke: 2 s, no warm-up, 4 clients, a tiny strategy comparison, no
    /// files written unless `--out` is given.
    #[arg(long)]
    smoke: bool,
    /// Where latest.md and reservations.svg go (default for a full run: bench/results).
    #[arg(long)]
    out: Option<PathBuf>,
    /// PostgreSQL server URL without a database name; `sg_bench_<random>` is
    /// created there. Default: the server the tests use, found as they find
    /// it (`stockguard_support::database::server_url`).
    #[arg(long)]
    database_url_base: Option<String>,
    /// Past reservations (and as many ledger rows) to fill into a second
    /// database after the main cells; SPREAD is then measured in both,
    /// round by round (0: no history run; the smoke never fills).
    #[arg(long, default_value_t = 10_000_000)]
    history: u64,
    /// Every reserve (over HTTP and in raw SQL) carries a fresh idempotency
    /// key, as a client that retries safely sends it.
    #[arg(long)]
    keyed: bool,
    /// The server binary. Default: `stockguard` of this example's profile
    /// (target/<profile>/stockguard), built first with cargo.
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// The server binary of another build (an earlier commit's), whose HOT,
    /// SPREAD and MULTI cells are measured beside this build's, round by
    /// round, on a database of its own (see `baseline.rs`).
    #[arg(long)]
    baseline_bin: Option<PathBuf>,
    /// With `--baseline-bin`: the server binary measured after it, instead
    /// of this build's (two earlier commits, to put a number on one change).
    #[arg(long, requires = "baseline_bin")]
    after_bin: Option<PathBuf>,
    /// HOT and SPREAD also beside a server of this build with one webhook
    /// endpoint taking every event (to a receiver in this process), then
    /// SPREAD x64 on it alone for `--webhook-secs`: the events' lag, and
    /// whether every change arrived (see `webhook.rs`).
    #[arg(long)]
    webhook: bool,
    /// HOT and SPREAD also beside a server of this build exporting this
    /// share (0 to 1) of its traces to an OTLP collector in this process:
    /// what traces cost (see `traces.rs`).
    #[arg(long)]
    traces: Option<f64>,
    /// Seconds of the `--webhook` sustained run (the smoke's: 2).
    #[arg(long, default_value_t = 60)]
    webhook_secs: u64,
    /// Last, a drop with a waiting list: a sold-out item, 10,000 customers
    /// in line, its 2,000 holds released at full speed (see `drop.rs`).
    #[arg(long)]
    drop: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// A load against a server that is already running.
    Load(load::Args),
    /// Print the server's reserve statement (`RESERVE_SQL`) as a pgbench
    /// script: one unit of a random one of 10,000 inventories whose ids are
    /// their numbers, a new reservation id made by `--id-function`, the
    /// default TTL (see bench/statement/run.sh).
    StatementScript {
        /// The SQL that makes the new reservation's id.
        #[arg(long, default_value = "gen_random_uuid()")]
        id_function: String,
    },
}

/// What a benchmark run is told to do.
pub struct Settings {
    /// Measured time per run (per side of a reserve cell).
    pub duration: Duration,
    /// Warm-up before each run or round.
    pub warmup: Duration,
    /// Rounds per reserve cell.
    pub rounds: u32,
    /// Client counts, one cell each, ascending.
    pub clients: Vec<usize>,
    /// The CI smoke.
    pub smoke: bool,
    /// Where the report files go, if anywhere.
    pub out: Option<PathBuf>,
    /// History rows to fill before the history cells (0: none).
    pub history: u64,
    /// Every reserve carries a fresh idempotency key.
    pub keyed: bool,
    /// The `--webhook` sustained run's length, when asked for.
    pub webhook: Option<Duration>,
    /// The `--traces` sampling ratio, when asked for.
    pub traces: Option<f64>,
    /// The `--drop` run.
    pub drop: bool,
}

impl Settings {
    fn from(args: &Args) -> anyhow::Result<Self> {
        let (duration, warmup, rounds, mut clients) = if args.smoke {
            (Duration::from_secs(2), Duration::ZERO, 1, vec![4])
        } else {
            let warmup = Duration::from_secs(args.warmup_secs);
            (Duration::from_secs(args.duration_secs), warmup, args.rounds.max(1), args.clients.clone())
        };
        clients.sort_unstable();
        clients.dedup();
        if clients.is_empty() || clients.contains(&0) || duration.is_zero() {
            bail!("--clients needs counts of 1 or more and --duration-secs must be at least 1");
        }
        let out = match (&args.out, args.smoke) {
            (Some(out), _) => Some(out.clone()),
            (None, true) => None,
            (None, false) => Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results")),
        };
        let history = if args.smoke { 0 } else { args.history };
        if args.webhook && args.webhook_secs == 0 {
            bail!("--webhook-secs must be at least 1");
        }
        let webhook = args.webhook.then(|| Duration::from_secs(if args.smoke { 2 } else { args.webhook_secs }));
        if args.traces.is_some_and(|ratio| !(0.0..=1.0).contains(&ratio)) {
            bail!("--traces takes a sampling ratio from 0 to 1");
        }
        let (smoke, keyed, traces, drop) = (args.smoke, args.keyed, args.traces, args.drop);
        Ok(Self { duration, warmup, rounds, clients, smoke, out, history, keyed, webhook, traces, drop })
    }

    /// Clients of the strategy comparison: 64 when measured, else the most measured.
    pub fn strategy_clients(&self) -> usize {
        if self.clients.contains(&64) { 64 } else { self.clients.last().copied().unwrap_or(1) }
    }
}

// One thread, as pgbench's default: on two cores shared with the server and
// PostgreSQL, a second load thread costs more in wake-ups than it adds, and
// the raw-SQL limit should be the highest this machine gives.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<std::process::ExitCode> {
    let args = Args::parse();
    match args.command {
        Some(Command::Load(load)) => return load::run(load).await,
        Some(Command::StatementScript { id_function }) => {
            println!("{}", scenarios::pgbench_script(&id_function));
            return Ok(std::process::ExitCode::SUCCESS);
        }
        None => {}
    }
    let settings = Settings::from(&args)?;
    let server_bin = server_binary(args.server_bin.as_deref(), "bench")?;
    let base = database::given_or_found(args.database_url_base.as_deref())?;
    let database = ThrowAway::create(&base, "bench").await?;
    eprintln!("bench: database {}, server {}", database.name, server_bin.display());

    let baseline =
        args.baseline_bin.as_deref().map(|before| [before, args.after_bin.as_deref().unwrap_or(&server_bin)]);
    let result = run(settings, &server_bin, baseline, &base, &database.url).await;
    database.drop("bench").await;
    let (markdown, ok) = result?;
    println!("{markdown}");
    Ok(if ok {
        std::process::ExitCode::SUCCESS
    } else {
        eprintln!("bench: FAILED (see above)");
        std::process::ExitCode::FAILURE
    })
}

/// Everything between creating and dropping the database. Returns the
/// report and whether the benchmark passed (invariant held, every reserve
/// run reserved something).
async fn run(
    settings: Settings,
    server_bin: &Path,
    baseline: Option<[&Path; 2]>,
    database_url_base: &str,
    database_url: &str,
) -> anyhow::Result<(String, bool)> {
    let secret = Keys::random_secret();
    let keys = Keys::new(secret.as_bytes(), stockguard::config::DEFAULT_MAX_TOKEN_TTL_SECS)?;
    let locking = [("STOCKGUARD_ORDER_LOCKING", "optimistic".to_owned())];
    let server =
        ServerProcess::start(server_bin, database_url, Some(&secret), &locking, Log::Warnings(Stdio::inherit()))
            .await?;
    let bins = Bins { server: server_bin, baseline };
    let result = main_matrix(settings, keys, &server, bins, database_url_base, database_url, &secret).await;
    server.stop_after(result).await
}

/// The server binaries: this build's, and the two of the before-and-after
/// comparison (another build's, and this one's or a third).
#[derive(Clone, Copy)]
struct Bins<'a> {
    server: &'a Path,
    baseline: Option<[&'a Path; 2]>,
}

async fn main_matrix(
    settings: Settings,
    keys: Keys,
    server: &ServerProcess,
    bins: Bins<'_>,
    database_url_base: &str,
    database_url: &str,
    secret: &str,
) -> anyhow::Result<(String, bool)> {
    let server_bin = bins.server;
    eprintln!("bench: seeding HOT (GraphQL) and SPREAD (10,000 rows, SQL)");
    let shop = Shop::open(database_url, server, &keys).await?;
    let db = &shop.db;

    // The server inherits the environment, so STOCKGUARD_* settings can be benchmarked.
    const SET_BY_BENCH: [&str; 4] =
        ["STOCKGUARD_ADDR", "STOCKGUARD_JWT_SECRET", "STOCKGUARD_NO_SEED", "STOCKGUARD_ORDER_LOCKING"];
    let overrides: Vec<String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("STOCKGUARD_") && !SET_BY_BENCH.contains(&k.as_str()))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let server_settings = if overrides.is_empty() {
        "default settings (two pools of 16 connections)".to_owned()
    } else {
        format!("default settings except {}", overrides.join(", "))
    };
    let header = format!(
        "- date: {}\n- machine: {}\n- PostgreSQL: {}; synchronous_commit = {}, shared_buffers = {}, \
         max_connections = {}\n- server: `{}` ({} build), {server_settings}, \
         RUST_LOG=warn; load generator, server and PostgreSQL share the machine\n",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        machine(),
        show(db, "SELECT version()").await.split(" on ").next().unwrap_or("?"),
        show(db, "SHOW synchronous_commit").await,
        show(db, "SHOW shared_buffers").await,
        show(db, "SHOW max_connections").await,
        server_bin.file_name().and_then(|n| n.to_str()).unwrap_or("stockguard"),
        server_bin.parent().and_then(|p| p.file_name()).and_then(|n| n.to_str()).unwrap_or("?"),
    );

    let mut bench = Bench {
        settings,
        keys,
        shop,
        clk_tck: clk_tck(),
        ttl_secs: server_ttl_secs()?,
        invariant: Invariant::default(),
    };
    bench.invariant.check(&bench.shop.db, "seeding").await?;

    let mut cells = Vec::new();
    for scenario in [Scenario::Hot, Scenario::Spread] {
        for clients in bench.settings.clients.clone() {
            eprintln!(
                "bench: {} x{clients}: Stockguard and raw SQL, {} rounds",
                scenario.name(),
                bench.settings.rounds
            );
            let cell = bench.cell(server, scenario, clients).await?;
            for (side, stats) in [("Stockguard", &cell.stockguard), ("raw SQL", &cell.raw), ("floor", &cell.floor)] {
                eprintln!(
                    "bench:   {side}: {:.0} res/s, p99 {:.2} ms, {}",
                    stats.per_sec(stats.successes),
                    stats.p99_ms,
                    stats.outcomes_text()
                );
            }
            cells.push(cell);
        }
    }
    let main_hwm_kb = status_kb(server.pid, "VmHWM").unwrap_or(0);

    let baseline = match bins.baseline {
        Some([before, after]) => Some(baseline::compare(&mut bench, after, before, database_url_base, secret).await?),
        None => None,
    };

    let webhook = match bench.settings.webhook {
        Some(_) => Some(webhook::compare(&mut bench, server, server_bin, database_url_base, secret).await?),
        None => None,
    };

    let traces = match bench.settings.traces {
        Some(ratio) => Some(traces::compare(&mut bench, server, server_bin, database_url_base, secret, ratio).await?),
        None => None,
    };

    let history = if bench.settings.history > 0 {
        Some(history::compare(&mut bench, server, server_bin, database_url_base, secret).await?)
    } else {
        None
    };

    // After the history cells too, so every single-location run before it
    // sees the database it always has.
    let multi = bench.multi_cells(server).await?;

    let clients = bench.settings.strategy_clients();
    eprintln!("bench: strategies on HOT x{clients}: expectedVersion with re-read and retries");
    let expected = bench.expected_version(server, clients).await?;
    eprintln!("bench: contested order x{clients}, optimistic");
    let optimistic = bench.contested_order(server, clients, "optimistic").await?;
    eprintln!("bench: restarting the server with STOCKGUARD_ORDER_LOCKING=pessimistic");
    let locking = [("STOCKGUARD_ORDER_LOCKING", "pessimistic".to_owned())];
    let pessimistic_server =
        ServerProcess::start(server_bin, database_url, Some(secret), &locking, Log::Warnings(Stdio::inherit())).await?;
    let pessimistic = bench.contested_order(&pessimistic_server, clients, "pessimistic").await;
    pessimistic_server.stop().await?;
    let pessimistic = pessimistic?;
    bench.invariant.check(&bench.shop.db, "the pessimistic server stopped").await?;

    // Last: the kits are made now, so no cell before sees them.
    let kits = bench.kit_cells(server).await?;
    let drop = if bench.settings.drop { Some(drop::run(&mut bench, server, clients).await?) } else { None };

    let strategy = Strategy {
        clients,
        plain: cells.iter().find(|c| c.scenario == Scenario::Hot && c.clients == clients).map(|c| c.stockguard.clone()),
        expected,
        orders: vec![("optimistic", optimistic), ("pessimistic", pessimistic)],
    };
    let report = Report {
        settings: &bench.settings,
        header,
        cells: &cells,
        multi: &multi,
        kits: &kits,
        strategy: &strategy,
        invariant: &bench.invariant,
        main_hwm_kb,
        history: history.as_ref(),
        baseline: baseline.as_ref(),
        webhook: webhook.as_ref(),
        traces: traces.as_ref(),
        drop: drop.as_ref(),
    };
    let markdown = report.markdown();
    if let Some(out) = &bench.settings.out {
        std::fs::create_dir_all(out)?;
        std::fs::write(out.join("latest.md"), &markdown)?;
        report.chart(&out.join("reservations.svg"))?;
        eprintln!("bench: wrote {} and {}", out.join("latest.md").display(), out.join("reservations.svg").display());
    }

    let idle: Vec<String> = (cells.iter())
        .filter(|c| c.stockguard.successes == 0 || c.raw.successes == 0)
        .map(|c| format!("{} x{}", c.scenario.name(), c.clients))
        .chain(
            multi
                .iter()
                .filter(|c| c.stockguard.successes == 0 || c.limit.successes == 0)
                .map(|c| format!("MULTI x{}", c.clients)),
        )
        .chain(
            (kits.iter())
                .filter(|c| c.stockguard.successes == 0 || c.limit.successes == 0)
                .map(|c| format!("{} x{}", c.scenario.name(), c.clients)),
        )
        .chain(
            (webhook.iter().flat_map(|w| &w.cells))
                .filter(|c| c.idle())
                .map(|c| format!("{} x{} with and without a webhook endpoint", c.scenario.name(), c.clients)),
        )
        .chain(
            (traces.iter().flat_map(|t| &t.cells))
                .filter(|c| c.idle())
                .map(|c| format!("{} x{} with traces off and on", c.scenario.name(), c.clients)),
        )
        .collect();
    if !idle.is_empty() {
        eprintln!("bench: no successful reservation in {}", idle.join(", "));
    }
    let invariant = &bench.invariant;
    if invariant.violations.is_empty() {
        eprintln!("bench: invariant: holds after every run ({} checks)", invariant.checks);
    } else {
        eprintln!("bench: invariant: VIOLATED ({} drifts)", invariant.violations.len());
    }
    let delivered = webhook.as_ref().is_none_or(|w| w.delivered.held());
    if !delivered {
        eprintln!("bench: webhook: a committed change did not arrive, or arrived out of order or unsigned");
    }
    let ok = invariant.violations.is_empty() && idle.is_empty() && delivered;
    bench.shop.db.close().await?;
    Ok((markdown, ok))
}
