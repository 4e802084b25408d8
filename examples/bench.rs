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
//! rounds (each after `--warmup-secs`), so whatever else the machine does
//! falls on both alike; before each cell the inventories are vacuumed and a
//! checkpoint is taken, as pgbench does. Then it compares strategies on HOT (plain
//! `reserve` vs `expectedVersion` with re-read and up to 3 retries) and one
//! contested order in optimistic vs pessimistic locking (the server is
//! restarted for the second mode).
//!
//! After every run the DESIGN.md invariant is checked from the database; a
//! violation (or a reserve run with no successful reservation at all) makes
//! the benchmark exit 1. The report is a markdown table on stdout and, for a
//! full run (or with `--out`), `bench/results/latest.md` and the chart
//! `bench/results/reservations.svg`. Progress goes to stderr.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use clap::Parser;
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, Statement,
    sqlx::{self, Connection as _, postgres::PgConnection},
};
use serde_json::{Value, json};
use stockguard::{
    auth::{Keys, Role},
    stock::RESERVE_SQL,
};
use support::{Server, ThrowAway, server_binary, status_kb};
use tokio::sync::RwLock;
use uuid::Uuid;

mod support;

#[derive(Parser, Debug)]
#[command(about = "Stockguard's benchmark: the server against the raw-SQL limit, on a fresh database")]
struct Args {
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
    /// PostgreSQL server URL without a database name; `sg_bench_<random>` is created there.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    database_url_base: String,
    /// The server binary. Default: `stockguard` of this example's profile
    /// (target/<profile>/stockguard), built first with cargo.
    #[arg(long)]
    server_bin: Option<PathBuf>,
}

struct Settings {
    duration: Duration,
    warmup: Duration,
    rounds: u32,
    clients: Vec<usize>,
    smoke: bool,
    out: Option<PathBuf>,
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
        Ok(Self { duration, warmup, rounds, clients, smoke: args.smoke, out })
    }

    /// Clients of the strategy comparison: 64 when measured, else the most measured.
    fn strategy_clients(&self) -> usize {
        if self.clients.contains(&64) { 64 } else { self.clients.last().copied().unwrap_or(1) }
    }
}

// ---------------------------------------------------------------------------
// The server under test

/// Samples the server's VmRSS every 100 ms while a run lasts.
struct RssSampler {
    stop: Arc<AtomicBool>,
    max_kb: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl RssSampler {
    fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let max_kb = Arc::new(AtomicU64::new(status_kb(pid, "VmRSS").unwrap_or(0)));
        let task = tokio::spawn({
            let (stop, max_kb) = (stop.clone(), max_kb.clone());
            async move {
                while !stop.load(Ordering::Relaxed) {
                    max_kb.fetch_max(status_kb(pid, "VmRSS").unwrap_or(0), Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        });
        Self { stop, max_kb, task }
    }

    async fn finish(self, pid: u32) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.max_kb.fetch_max(status_kb(pid, "VmRSS").unwrap_or(0), Ordering::Relaxed);
        self.max_kb.load(Ordering::Relaxed)
    }
}

/// What the server used during one measured window.
#[derive(Clone, Copy, Default)]
struct ServerUse {
    cpu_secs: f64,
    max_rss_kb: u64,
    /// VmHWM at the end of the run: the peak since the process started.
    hwm_kb: u64,
}

/// CPU and memory used during one run's measured window.
#[derive(Clone, Copy, Default)]
struct Usage {
    /// The server's, when the run went through it.
    server: Option<ServerUse>,
    /// This process: the load generator (and, for raw SQL, the client side of the statements).
    loadgen_cpu_secs: f64,
    /// How busy the whole machine was (every process, including PostgreSQL).
    machine_busy_pct: f64,
}

/// CPU counters at one moment.
struct CpuSnapshot {
    server_secs: f64,
    own_secs: f64,
    /// Jiffies of all CPUs from /proc/stat: all, and all but idle and iowait.
    machine_total: u64,
    machine_busy: u64,
}

impl CpuSnapshot {
    fn take(server: Option<u32>, clk_tck: f64) -> Self {
        let read = |path: String| std::fs::read_to_string(path).unwrap_or_default();
        let server_secs = server.map_or(0.0, |pid| parse_cpu(&read(format!("/proc/{pid}/stat")), clk_tck));
        let own_secs = parse_cpu(&read("/proc/self/stat".into()), clk_tck);
        let stat = read("/proc/stat".into());
        let jiffies: Vec<u64> = stat
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("cpu "))
            .map(|l| l.split_whitespace().filter_map(|v| v.parse().ok()).collect())
            .unwrap_or_default();
        // user nice system idle iowait irq softirq steal (guest time is in user already).
        let machine_total: u64 = jiffies.iter().take(8).sum();
        let idle = jiffies.get(3).copied().unwrap_or(0) + jiffies.get(4).copied().unwrap_or(0);
        Self { server_secs, own_secs, machine_total, machine_busy: machine_total.saturating_sub(idle) }
    }
}

// ---------------------------------------------------------------------------
// Recording

/// One task's measurements; merged after a run.
#[derive(Default)]
struct Recorder {
    measure_from: Option<Instant>,
    until: Option<Instant>,
    latencies_us: Vec<u32>,
    outcomes: BTreeMap<String, u64>,
    errors: u64,
    conflicts: u64,
    retries: u64,
    requests: u64,
}

impl Recorder {
    fn new(measure_from: Instant, until: Instant) -> Self {
        Self { measure_from: Some(measure_from), until: Some(until), ..Self::default() }
    }

    /// Whether an operation that ended at `end` falls in the measured window.
    fn counts(&self, end: Instant) -> bool {
        self.measure_from.is_some_and(|from| end >= from) && self.until.is_some_and(|until| end <= until)
    }

    /// Records one operation that started at `start`, unless it ended outside the window.
    fn record(&mut self, start: Instant, outcome: &Outcome, extra: Extra) -> bool {
        let end = Instant::now();
        if !self.counts(end) {
            return false;
        }
        self.latencies_us.push(u32::try_from(end.duration_since(start).as_micros()).unwrap_or(u32::MAX));
        let name = match outcome {
            Outcome::Ok(name) => name.clone(),
            Outcome::Error(err) => {
                self.errors += 1;
                format!("error: {err}")
            }
        };
        *self.outcomes.entry(name).or_default() += 1;
        self.conflicts += extra.conflicts;
        self.retries += extra.retries;
        self.requests += extra.requests;
        true
    }

    fn merge(&mut self, other: Recorder) {
        self.latencies_us.extend(other.latencies_us);
        for (k, v) in other.outcomes {
            *self.outcomes.entry(k).or_default() += v;
        }
        self.errors += other.errors;
        self.conflicts += other.conflicts;
        self.retries += other.retries;
        self.requests += other.requests;
    }
}

#[derive(Clone, Copy)]
struct Extra {
    conflicts: u64,
    retries: u64,
    requests: u64,
}

const ONE_REQUEST: Extra = Extra { conflicts: 0, retries: 0, requests: 1 };

/// The result of one operation: a `__typename` (or a name we give it), or an error.
enum Outcome {
    Ok(String),
    Error(String),
}

/// One side of a reserve cell, summed over its rounds.
#[derive(Default)]
struct Measured {
    recorder: Recorder,
    usage: Usage,
    rounds: u32,
}

impl Measured {
    fn add(&mut self, (recorder, usage): (Recorder, Usage)) {
        self.recorder.merge(recorder);
        let (sum, one) = (&mut self.usage, usage);
        sum.server = match (sum.server, one.server) {
            (Some(a), Some(b)) => Some(ServerUse {
                cpu_secs: a.cpu_secs + b.cpu_secs,
                max_rss_kb: a.max_rss_kb.max(b.max_rss_kb),
                hwm_kb: a.hwm_kb.max(b.hwm_kb),
            }),
            (a, b) => a.or(b),
        };
        sum.loadgen_cpu_secs += one.loadgen_cpu_secs;
        sum.machine_busy_pct += one.machine_busy_pct;
        self.rounds += 1;
    }

    /// The statistics over `seconds` measured in all; machine busy is the mean of the rounds.
    fn stats(self, seconds: f64) -> Stats {
        let mut stats = Stats::from(self.recorder, seconds, &["Reserved"]);
        stats.usage = self.usage;
        stats.usage.machine_busy_pct /= f64::from(self.rounds.max(1));
        stats
    }
}

/// The merged measurements of one run.
#[derive(Clone, Default)]
struct Stats {
    seconds: f64,
    operations: u64,
    successes: u64,
    outcomes: BTreeMap<String, u64>,
    errors: u64,
    conflicts: u64,
    retries: u64,
    requests: u64,
    p50_ms: f64,
    p95_ms: f64,
    p99_ms: f64,
    usage: Usage,
}

impl Stats {
    fn from(mut merged: Recorder, seconds: f64, success: &[&str]) -> Self {
        merged.latencies_us.sort_unstable();
        let pct = |p: f64| {
            let v = &merged.latencies_us;
            if v.is_empty() { 0.0 } else { f64::from(v[((v.len() - 1) as f64 * p).round() as usize]) / 1000.0 }
        };
        let successes = merged.outcomes.iter().filter(|(k, _)| success.contains(&k.as_str())).map(|(_, v)| v).sum();
        Self {
            seconds,
            operations: merged.latencies_us.len() as u64,
            successes,
            p50_ms: pct(0.50),
            p95_ms: pct(0.95),
            p99_ms: pct(0.99),
            outcomes: merged.outcomes,
            errors: merged.errors,
            conflicts: merged.conflicts,
            retries: merged.retries,
            requests: merged.requests,
            usage: Usage::default(),
        }
    }

    fn per_sec(&self, n: u64) -> f64 {
        n as f64 / self.seconds
    }

    fn outcomes_text(&self) -> String {
        self.outcomes.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
    }
}

/// Runs `tasks` (each given its recorder) and merges what they recorded.
async fn run_tasks(tasks: Vec<tokio::task::JoinHandle<anyhow::Result<Recorder>>>) -> anyhow::Result<Recorder> {
    let mut merged = Recorder::default();
    for task in futures::future::join_all(tasks).await {
        merged.merge(task??);
    }
    Ok(merged)
}

/// A fast PRNG for picking SPREAD rows (xorshift64*).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as usize % n
    }
}

// ---------------------------------------------------------------------------
// GraphQL over HTTP

/// The benchmark's client: the shared one, and the measured loop's request.
struct Gql {
    client: support::Gql,
    /// [`RESERVE`] as a JSON string, for [`Gql::reserve`].
    reserve_json: String,
}

/// Only what [`Gql::reserve`] reads of an answer.
#[derive(serde::Deserialize)]
struct ReserveAnswer<'a> {
    #[serde(borrow)]
    data: Option<ReserveData<'a>>,
    #[serde(default)]
    errors: Vec<AnswerError>,
}

#[derive(serde::Deserialize)]
struct ReserveData<'a> {
    #[serde(borrow)]
    reserve: Option<Typename<'a>>,
}

#[derive(serde::Deserialize)]
struct Typename<'a> {
    #[serde(borrow, rename = "__typename")]
    typename: std::borrow::Cow<'a, str>,
}

#[derive(serde::Deserialize)]
struct AnswerError {
    extensions: Option<AnswerCode>,
}

#[derive(serde::Deserialize)]
struct AnswerCode {
    code: Option<String>,
}

impl Gql {
    fn new(base: &str, clients: usize) -> anyhow::Result<Self> {
        Ok(Self { client: support::Gql::new(base, clients)?, reserve_json: serde_json::to_string(RESERVE)? })
    }

    /// `reserve` of one unit: the measured loop's request, lean on purpose.
    /// The load generator shares the machine with what it measures, so the
    /// body is written straight to text and only `__typename` is read back.
    async fn reserve(&self, authorization: &reqwest::header::HeaderValue, inventory: Uuid) -> Outcome {
        let body = format!(r#"{{"query":{},"variables":{{"i":{{"inventoryId":"{inventory}"}}}}}}"#, self.reserve_json);
        let sent = self
            .client
            .http
            .post(&self.client.url)
            .header(reqwest::header::AUTHORIZATION, authorization)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await;
        let response = match sent {
            Ok(response) if response.status().is_success() => response,
            Ok(response) => return Outcome::Error(format!("HTTP {}", response.status().as_u16())),
            Err(e) => return Outcome::Error(format!("HTTP {}", if e.is_timeout() { "timeout" } else { "transport" })),
        };
        let Ok(bytes) = response.bytes().await else { return Outcome::Error("HTTP bad body".into()) };
        match serde_json::from_slice::<ReserveAnswer<'_>>(&bytes) {
            Ok(answer) if !answer.errors.is_empty() => {
                let code = answer.errors[0].extensions.as_ref().and_then(|e| e.code.as_deref()).unwrap_or("no code");
                Outcome::Error(format!("GraphQL {code}"))
            }
            Ok(ReserveAnswer { data: Some(ReserveData { reserve: Some(name) }), .. }) => {
                Outcome::Ok(name.typename.into_owned())
            }
            Ok(_) => Outcome::Error("no data.reserve".into()),
            Err(_) => Outcome::Error("HTTP bad body".into()),
        }
    }

    /// One operation; the `__typename` of `data.<field>`, or the error.
    async fn call(&self, token: &str, query: &str, variables: Value, field: &str) -> (Outcome, Value) {
        let body = match self.raw(token, query, variables).await {
            Ok(body) => body,
            Err(err) => return (Outcome::Error(err), Value::Null),
        };
        let outcome = if let Some(errors) = body.get("errors").and_then(Value::as_array).filter(|e| !e.is_empty()) {
            let code = errors[0]["extensions"]["code"].as_str().unwrap_or("no code");
            Outcome::Error(format!("GraphQL {code}"))
        } else if let Some(name) = body["data"][field]["__typename"].as_str() {
            Outcome::Ok(name.to_owned())
        } else {
            Outcome::Error(format!("no data.{field}"))
        };
        (outcome, body)
    }

    async fn raw(&self, token: &str, query: &str, variables: Value) -> Result<Value, String> {
        match self.client.post(token, query, variables).await? {
            (status, _) if !status.is_success() => Err(format!("HTTP {}", status.as_u16())),
            (_, Some(body)) => Ok(body),
            (_, None) => Err("HTTP bad body".to_owned()),
        }
    }
}

const RESERVE: &str = "mutation($i: ReserveInput!) { reserve(input: $i) { __typename } }";
const VERSION: &str = "query($id: UUID!) { inventory(id: $id) { __typename version } }";

// ---------------------------------------------------------------------------
// The workloads

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Scenario {
    Hot,
    Spread,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Self::Hot => "HOT",
            Self::Spread => "SPREAD",
        }
    }
}

struct Bench {
    settings: Settings,
    keys: Keys,
    database_url: String,
    db: DatabaseConnection,
    hot: Uuid,
    spread: Arc<Vec<Uuid>>,
    clk_tck: f64,
    /// The server's reservation TTL, which the raw-SQL runs pass too, so both
    /// write the same rows (an expiring reservation is also in the sweeper's index).
    ttl_secs: i32,
    invariant_checks: u32,
    violations: Vec<String>,
}

/// The window of one run: warm-up until `measure_from`, measured until `until`.
fn window(settings: &Settings) -> (Instant, Instant) {
    window_of(settings.warmup, settings.duration)
}

fn window_of(warmup: Duration, measured: Duration) -> (Instant, Instant) {
    let measure_from = Instant::now() + warmup;
    (measure_from, measure_from + measured)
}

impl Bench {
    fn targets(&self, scenario: Scenario) -> Arc<Vec<Uuid>> {
        match scenario {
            Scenario::Hot => Arc::new(vec![self.hot]),
            Scenario::Spread => self.spread.clone(),
        }
    }

    fn tokens(&self, clients: usize) -> anyhow::Result<Vec<String>> {
        (0..clients)
            .map(|i| Ok(self.keys.mint(&format!("bench-{i}"), Role::Customer, chrono::Duration::hours(4))?))
            .collect()
    }

    /// Measures CPU (the server's, this load generator's, the machine's)
    /// over the measured window of `run`, and the server's memory over all of it.
    async fn measure<F: Future<Output = anyhow::Result<Recorder>>>(
        &self,
        server: Option<&Server>,
        measure_from: Instant,
        run: F,
    ) -> anyhow::Result<(Recorder, Usage)> {
        let pid = server.map(|s| s.pid);
        let clk_tck = self.clk_tck;
        let sampler = pid.map(RssSampler::start);
        let at_start = tokio::spawn(async move {
            tokio::time::sleep_until(measure_from.into()).await;
            CpuSnapshot::take(pid, clk_tck)
        });
        let recorder = run.await?;
        let end = CpuSnapshot::take(pid, clk_tck);
        let start = at_start.await?;
        let server = match (pid, sampler) {
            (Some(pid), Some(sampler)) => Some(ServerUse {
                cpu_secs: (end.server_secs - start.server_secs).max(0.0),
                max_rss_kb: sampler.finish(pid).await,
                hwm_kb: status_kb(pid, "VmHWM").unwrap_or(0),
            }),
            _ => None,
        };
        let machine_total = end.machine_total.saturating_sub(start.machine_total);
        let machine_busy = end.machine_busy.saturating_sub(start.machine_busy);
        Ok((
            recorder,
            Usage {
                server,
                loadgen_cpu_secs: (end.own_secs - start.own_secs).max(0.0),
                machine_busy_pct: if machine_total > 0 {
                    100.0 * machine_busy as f64 / machine_total as f64
                } else {
                    0.0
                },
            },
        ))
    }

    /// One reserve cell: Stockguard and raw SQL take turns for
    /// `settings.rounds` rounds, each measured for its share of the duration.
    async fn cell(&mut self, server: &Server, scenario: Scenario, clients: usize) -> anyhow::Result<Cell> {
        self.settle().await?;
        let rounds = self.settings.rounds;
        let slice = self.settings.duration / rounds;
        let (mut stockguard, mut raw) = (Measured::default(), Measured::default());
        for _ in 0..rounds {
            stockguard.add(self.stockguard(server, scenario, clients, slice).await?);
            raw.add(self.raw_sql(scenario, clients, slice).await?);
        }
        self.check_invariant(&format!("{} x{clients}, Stockguard and raw SQL", scenario.name())).await?;
        let seconds = (slice * rounds).as_secs_f64();
        Ok(Cell { scenario, clients, stockguard: stockguard.stats(seconds), raw: raw.stats(seconds) })
    }

    /// `reserve` over HTTP for `measured`: one task per client, each with its own token.
    async fn stockguard(
        &mut self,
        server: &Server,
        scenario: Scenario,
        clients: usize,
        measured: Duration,
    ) -> anyhow::Result<(Recorder, Usage)> {
        let gql = Arc::new(Gql::new(&server.url, clients)?);
        let targets = self.targets(scenario);
        let tokens = self.tokens(clients)?;
        let (measure_from, until) = window_of(self.settings.warmup, measured);
        let tasks = tokens
            .into_iter()
            .enumerate()
            .map(|(i, token)| {
                let (gql, targets) = (gql.clone(), targets.clone());
                tokio::spawn(async move {
                    let authorization = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))?;
                    let mut rec = Recorder::new(measure_from, until);
                    let mut rng = Rng::new(i as u64 + 1);
                    while Instant::now() < until {
                        let id = targets[rng.below(targets.len())];
                        let start = Instant::now();
                        let outcome = gql.reserve(&authorization, id).await;
                        rec.record(start, &outcome, ONE_REQUEST);
                    }
                    anyhow::Ok(rec)
                })
            })
            .collect();
        self.measure(Some(server), measure_from, run_tasks(tasks)).await
    }

    /// `RESERVE_SQL` for `measured`, prepared, through one dedicated connection per client.
    async fn raw_sql(
        &mut self,
        scenario: Scenario,
        clients: usize,
        measured: Duration,
    ) -> anyhow::Result<(Recorder, Usage)> {
        let targets = self.targets(scenario);
        let ttl_secs = self.ttl_secs;
        let mut connections = Vec::with_capacity(clients);
        for _ in 0..clients {
            connections.push(connect_patiently(&self.database_url).await.context("raw SQL: connect")?);
        }
        let (measure_from, until) = window_of(self.settings.warmup, measured);
        let tasks = connections
            .into_iter()
            .enumerate()
            .map(|(i, mut conn)| {
                let targets = targets.clone();
                tokio::spawn(async move {
                    let user = format!("bench-raw-{i}");
                    let mut rec = Recorder::new(measure_from, until);
                    let mut rng = Rng::new(i as u64 + 1_000);
                    while Instant::now() < until {
                        let id = targets[rng.below(targets.len())];
                        let start = Instant::now();
                        let result = sqlx::query(RESERVE_SQL.as_str())
                            .bind(id)
                            .bind(1i32)
                            .bind(None::<i32>)
                            .bind(Uuid::new_v4())
                            .bind(user.as_str())
                            .bind(None::<String>)
                            .bind(None::<String>)
                            .bind(ttl_secs)
                            .fetch_optional(&mut conn)
                            .await;
                        let outcome = match result {
                            Ok(Some(_)) => Outcome::Ok("Reserved".into()),
                            Ok(None) => Outcome::Ok("no row".into()),
                            Err(err) => Outcome::Error(match err.as_database_error().and_then(|e| e.code()) {
                                Some(code) => format!("SQLSTATE {code}"),
                                None => "database".into(),
                            }),
                        };
                        rec.record(start, &outcome, ONE_REQUEST);
                    }
                    let _ = conn.close().await;
                    anyhow::Ok(rec)
                })
            })
            .collect();
        self.measure(None, measure_from, run_tasks(tasks)).await
    }

    /// HOT with `expectedVersion`: read the version, reserve at it, on
    /// `Conflict` read again and retry (at most 3 retries).
    async fn expected_version(&mut self, server: &Server, clients: usize) -> anyhow::Result<Stats> {
        let gql = Arc::new(Gql::new(&server.url, clients)?);
        let tokens = self.tokens(clients)?;
        let hot = self.hot;
        self.settle().await?;
        let (measure_from, until) = window(&self.settings);
        let tasks = tokens
            .into_iter()
            .map(|token| {
                let gql = gql.clone();
                tokio::spawn(async move {
                    let mut rec = Recorder::new(measure_from, until);
                    while Instant::now() < until {
                        let start = Instant::now();
                        let mut extra = Extra { conflicts: 0, retries: 0, requests: 0 };
                        let mut outcome = Outcome::Ok("gave up".into());
                        for attempt in 0..4 {
                            if attempt > 0 {
                                extra.retries += 1;
                            }
                            extra.requests += 2;
                            let seen = match gql.raw(&token, VERSION, json!({ "id": hot })).await {
                                Ok(body) => body["data"]["inventory"]["version"].as_i64(),
                                Err(err) => {
                                    outcome = Outcome::Error(err);
                                    break;
                                }
                            };
                            let Some(version) = seen else {
                                outcome = Outcome::Error("no version".into());
                                break;
                            };
                            let (result, _) = gql
                                .call(
                                    &token,
                                    RESERVE,
                                    json!({ "i": { "inventoryId": hot, "expectedVersion": version } }),
                                    "reserve",
                                )
                                .await;
                            match result {
                                Outcome::Ok(name) if name == "Conflict" => extra.conflicts += 1,
                                other => {
                                    outcome = other;
                                    break;
                                }
                            }
                        }
                        rec.record(start, &outcome, extra);
                    }
                    anyhow::Ok(rec)
                })
            })
            .collect();
        let (recorder, usage) = self.measure(Some(server), measure_from, run_tasks(tasks)).await?;
        let mut stats = Stats::from(recorder, self.settings.duration.as_secs_f64(), &["Reserved"]);
        stats.usage = usage;
        self.check_invariant(&format!("expectedVersion HOT x{clients}")).await?;
        Ok(stats)
    }

    /// One order contested by `clients`: mostly address changes (read the
    /// version, then change at it), now and then a confirm or a cancel; when
    /// the order is confirmed or cancelled the next one is placed (as in
    /// examples/load.rs `order`).
    async fn contested_order(&mut self, server: &Server, clients: usize, mode: &str) -> anyhow::Result<Stats> {
        let gql = Arc::new(Gql::new(&server.url, clients)?);
        let operator = self.keys.mint("bench-operator", Role::Operator, chrono::Duration::hours(4))?;
        let customer = self.keys.mint("bench-order-customer", Role::Customer, chrono::Duration::hours(4))?;
        let inventory = create_inventory(&gql, &operator, &format!("ORDER-{mode}"), 1_000_000_000).await?;
        let first = place_order(&gql, &customer, inventory).await?;
        let current = Arc::new(RwLock::new(first));
        self.settle().await?;
        let (measure_from, until) = window(&self.settings);
        let tasks = (0..clients)
            .map(|i| {
                let (gql, current, operator, customer) = (gql.clone(), current.clone(), operator.clone(), customer.clone());
                tokio::spawn(async move {
                    let mut rec = Recorder::new(measure_from, until);
                    let mut n = 0usize;
                    while Instant::now() < until {
                        n += 1;
                        let order = *current.read().await;
                        let op = match (i + n) % 50 {
                            0 => "confirmOrder",
                            1 => "cancelOrder",
                            _ => "changeShippingAddress",
                        };
                        let start = Instant::now();
                        let mut extra = ONE_REQUEST;
                        let outcome = if op == "changeShippingAddress" {
                            extra.requests = 2;
                            match gql.raw(&customer, "query($id: UUID!) { order(id: $id) { version } }", json!({ "id": order })).await {
                                Ok(seen) => {
                                    let version = seen["data"]["order"]["version"].as_i64().unwrap_or(0);
                                    let input = json!({ "i": { "orderId": order, "expectedVersion": version,
                                        "shippingAddress": address(&format!("client {i} #{n}")) } });
                                    gql.call(
                                        &customer,
                                        "mutation($i: ChangeShippingAddressInput!) { changeShippingAddress(input: $i) { __typename } }",
                                        input,
                                        op,
                                    )
                                    .await
                                    .0
                                }
                                Err(err) => Outcome::Error(err),
                            }
                        } else {
                            let query = format!("mutation($id: UUID!) {{ {op}(id: $id) {{ __typename }} }}");
                            gql.call(&operator, &query, json!({ "id": order }), op).await.0
                        };
                        if let Outcome::Ok(name) = &outcome
                            && (name == "OrderVersionConflict" || name == "OrderModifiedConcurrently")
                        {
                            extra.conflicts = 1;
                        }
                        let named = match outcome {
                            Outcome::Ok(name) => Outcome::Ok(format!("{op} → {name}")),
                            Outcome::Error(err) => Outcome::Error(format!("{op} → {err}")),
                        };
                        let finished = matches!(&named, Outcome::Ok(n) if n.ends_with("OrderConfirmed") || n.ends_with("OrderCancelled"));
                        rec.record(start, &named, extra);
                        if finished {
                            let next = place_order(&gql, &customer, inventory).await?;
                            let mut current = current.write().await;
                            if *current == order {
                                *current = next;
                            }
                        }
                    }
                    anyhow::Ok(rec)
                })
            })
            .collect();
        let (recorder, usage) = self.measure(Some(server), measure_from, run_tasks(tasks)).await?;
        let success = [
            "changeShippingAddress → ShippingAddressChanged",
            "confirmOrder → OrderConfirmed",
            "cancelOrder → OrderCancelled",
        ];
        let mut stats = Stats::from(recorder, self.settings.duration.as_secs_f64(), &success);
        stats.usage = usage;
        self.check_invariant(&format!("contested order, {mode}")).await?;
        Ok(stats)
    }

    /// The DESIGN.md invariant, from the database; a violation is remembered
    /// (and makes the benchmark exit 1).
    /// Brings the database to the same state before every run, as pgbench
    /// does: the inventories vacuumed (earlier runs left dead row versions)
    /// and a checkpoint taken, so no run pays for the one before it and a
    /// checkpoint falls inside a measured window less often.
    async fn settle(&self) -> anyhow::Result<()> {
        for sql in ["VACUUM (ANALYZE) inventories", "CHECKPOINT"] {
            self.db.execute_unprepared(sql).await.with_context(|| format!("before a run: {sql}"))?;
        }
        Ok(())
    }

    async fn check_invariant(&mut self, after: &str) -> anyhow::Result<()> {
        let drifts = stockguard::invariant::check(&self.db).await.context("invariant check")?;
        self.invariant_checks += 1;
        if drifts.is_empty() {
            eprintln!("bench:   invariant holds after {after}");
        } else {
            for drift in &drifts {
                eprintln!("bench:   INVARIANT VIOLATED after {after}: {drift}");
                self.violations.push(format!("after {after}: {drift}"));
            }
        }
        Ok(())
    }
}

/// utime + stime in seconds from a /proc/<pid>/stat line.
fn parse_cpu(stat: &str, clk_tck: f64) -> f64 {
    // The fields after the command name, which is in parentheses and may hold
    // spaces: the first is field 3 (state); utime is field 14, stime field 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (ticks(14) + ticks(15)) as f64 / clk_tck
}

fn address(line1: &str) -> Value {
    json!({ "name": "Bench", "line1": line1, "city": "Osaka", "postalCode": "530-0001", "country": "JP" })
}

async fn create_inventory(gql: &Gql, operator: &str, sku: &str, stock: i64) -> anyhow::Result<Uuid> {
    let body = gql
        .raw(
            operator,
            "mutation($i: CreateInventoryInput!) { createInventory(input: $i) { id } }",
            json!({ "i": { "sku": sku, "name": format!("bench {sku}"), "stock": stock } }),
        )
        .await
        .map_err(anyhow::Error::msg)?;
    let id = body["data"]["createInventory"]["id"].as_str().with_context(|| format!("createInventory: {body}"))?;
    Ok(id.parse()?)
}

async fn place_order(gql: &Gql, customer: &str, inventory: Uuid) -> anyhow::Result<Uuid> {
    let body = gql
        .raw(
            customer,
            "mutation($i: PlaceOrderInput!) { placeOrder(input: $i) { __typename ... on OrderPlaced { order { id } } } }",
            json!({ "i": { "items": [{ "inventoryId": inventory }], "shippingAddress": address("start") } }),
        )
        .await
        .map_err(anyhow::Error::msg)?;
    let id = body["data"]["placeOrder"]["order"]["id"].as_str().with_context(|| format!("placeOrder: {body}"))?;
    Ok(id.parse()?)
}

// ---------------------------------------------------------------------------
// Setting up and tearing down

/// A direct connection. PostgreSQL's `max_connections` is shared with
/// whatever else runs on the machine, so "too many clients" (53300) is waited
/// out for up to a minute.
async fn connect_patiently(url: &str) -> anyhow::Result<PgConnection> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut told = false;
    loop {
        match PgConnection::connect(url).await {
            Ok(conn) => return Ok(conn),
            Err(err)
                if Instant::now() < deadline
                    && err.as_database_error().and_then(|e| e.code()).as_deref() == Some("53300") =>
            {
                if !told {
                    eprintln!("bench:   PostgreSQL has too many clients; waiting for connections to free up");
                    told = true;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(err) => return Err(err.into()),
        }
    }
}

async fn seed_spread(db: &DatabaseConnection) -> anyhow::Result<Vec<Uuid>> {
    db.execute_unprepared(
        "INSERT INTO inventories (id, sku, name, stock, version) \
           SELECT gen_random_uuid(), 'SPREAD-' || g, 'spread ' || g, 1000000000, 1 FROM generate_series(1, 10000) g; \
         INSERT INTO stock_movements (inventory_id, delta, reason, stock_after, version_after) \
           SELECT id, stock, 'CREATED', stock, 1 FROM inventories WHERE sku LIKE 'SPREAD-%'; \
         ANALYZE inventories; ANALYZE stock_movements;",
    )
    .await?;
    let rows = db
        .query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT id FROM inventories WHERE sku LIKE 'SPREAD-%'",
        ))
        .await?;
    Ok(rows.iter().map(|r| r.try_get_by_index::<Uuid>(0)).collect::<Result<_, _>>()?)
}

async fn show(db: &DatabaseConnection, sql: &str) -> String {
    match db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await {
        Ok(Some(row)) => row.try_get_by_index::<String>(0).unwrap_or_else(|_| "?".into()),
        _ => "?".into(),
    }
}

/// The reservation TTL the server runs with: its default, or the
/// `STOCKGUARD_RESERVATION_TTL_SECS` it inherits from this process.
fn server_ttl_secs() -> anyhow::Result<i32> {
    match std::env::var("STOCKGUARD_RESERVATION_TTL_SECS") {
        Ok(ttl) => ttl.parse().context("STOCKGUARD_RESERVATION_TTL_SECS"),
        Err(_) => Ok(stockguard::config::Limits::default().reservation_ttl_secs),
    }
}

fn clk_tck() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_owned()))
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
    format!(
        "{cores} cores, {:.1} GiB memory, {model}; load average at the start {load}",
        mem_kb as f64 / 1024.0 / 1024.0
    )
}

// ---------------------------------------------------------------------------
// Report

struct Cell {
    scenario: Scenario,
    clients: usize,
    stockguard: Stats,
    raw: Stats,
}

struct Strategy {
    clients: usize,
    plain: Option<Stats>,
    expected: Stats,
    orders: Vec<(&'static str, Stats)>,
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

struct Report<'a> {
    settings: &'a Settings,
    header: String,
    cells: &'a [Cell],
    strategy: &'a Strategy,
    invariant_checks: u32,
    violations: &'a [String],
    /// VmHWM of the first server when the main matrix was done.
    main_hwm_kb: u64,
}

impl Report<'_> {
    fn cell(&self, scenario: Scenario, clients: usize) -> Option<&Cell> {
        self.cells.iter().find(|c| c.scenario == scenario && c.clients == clients)
    }

    fn total_errors(&self) -> u64 {
        let cells: u64 = self.cells.iter().map(|c| c.stockguard.errors + c.raw.errors).sum();
        let strategy: u64 =
            self.strategy.expected.errors + self.strategy.orders.iter().map(|(_, s)| s.errors).sum::<u64>();
        cells + strategy
    }

    /// (target, measured, met or None when not measured).
    fn targets(&self) -> Vec<(String, String, Option<bool>)> {
        let mut out = Vec::new();
        for clients in [16, 64] {
            let target = format!("SPREAD at {clients} clients: ≥ 0.7× the raw-SQL limit, p99 ≤ 2× the limit's p99");
            match self.cell(Scenario::Spread, clients) {
                Some(c) => {
                    let r = ratio(c.stockguard.per_sec(c.stockguard.successes), c.raw.per_sec(c.raw.successes));
                    let p = ratio(c.stockguard.p99_ms, c.raw.p99_ms);
                    let measured = format!(
                        "{r:.2}× the limit's res/s ({:.0} vs {:.0}); p99 {:.2} ms = {p:.2}× the limit's {:.2} ms",
                        c.stockguard.per_sec(c.stockguard.successes),
                        c.raw.per_sec(c.raw.successes),
                        c.stockguard.p99_ms,
                        c.raw.p99_ms
                    );
                    out.push((target, measured, Some(r >= 0.7 && p <= 2.0)));
                }
                None => out.push((target, "not measured".into(), None)),
            }
        }
        let target = "HOT at 64 clients: ≥ 2× the single-statement limit".to_owned();
        match self.cell(Scenario::Hot, 64) {
            Some(c) => {
                let r = ratio(c.stockguard.per_sec(c.stockguard.successes), c.raw.per_sec(c.raw.successes));
                let measured = format!(
                    "{r:.2}× ({:.0} vs {:.0} res/s)",
                    c.stockguard.per_sec(c.stockguard.successes),
                    c.raw.per_sec(c.raw.successes)
                );
                out.push((target, measured, Some(r >= 2.0)));
            }
            None => out.push((target, "not measured".into(), None)),
        }
        let target = "server peak RSS ≤ 64 MB under the 64-client load".to_owned();
        if self.cells.iter().any(|c| c.clients == 64) {
            let mb = mb(self.main_hwm_kb);
            out.push((target, format!("{mb:.1} MB (VmHWM after the 64-client runs)"), Some(mb <= 64.0)));
        } else {
            out.push((target, "not measured".into(), None));
        }
        let errors = self.total_errors();
        out.push(("zero errors".into(), format!("{errors} errors"), Some(errors == 0)));
        let v = self.violations.len();
        out.push((
            "zero invariant violations".into(),
            format!("{v} violations in {} checks", self.invariant_checks),
            Some(v == 0),
        ));
        out
    }

    fn markdown(&self) -> String {
        let s = self.settings;
        let mut md = String::new();
        let _ = writeln!(md, "# Stockguard benchmark{}\n", if s.smoke { " (smoke)" } else { "" });
        md.push_str(&self.header);
        let _ = writeln!(
            md,
            "- runs: {} s measured per side; a reserve cell alternates Stockguard and raw SQL in {} rounds, \
             each after {} s warm-up; clients {}\n",
            s.duration.as_secs(),
            s.rounds,
            s.warmup.as_secs(),
            s.clients.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
        );
        md.push_str("## Reserve: Stockguard over HTTP vs the raw-SQL limit\n\n");
        md.push_str(
            "Successful reservations per second. Raw SQL: the server's own `RESERVE_SQL`, prepared, one \
             dedicated connection per client, no HTTP, no GraphQL. Ratio = Stockguard / raw SQL. Latency in ms.\n\n",
        );
        md.push_str(
            "| scenario | clients | Stockguard res/s | raw SQL res/s | ratio | p50 / p95 / p99 Stockguard | p99 raw | \
             errors | server CPU s | server peak RSS MB |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
        );
        for c in self.cells {
            let (g, r) = (&c.stockguard, &c.raw);
            let used = g.usage.server.unwrap_or_default();
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.0} | {:.2} | {:.2} / {:.2} / {:.2} | {:.2} | {} | {:.1} | {:.1} |",
                c.scenario.name(),
                c.clients,
                g.per_sec(g.successes),
                r.per_sec(r.successes),
                ratio(g.per_sec(g.successes), r.per_sec(r.successes)),
                g.p50_ms,
                g.p95_ms,
                g.p99_ms,
                r.p99_ms,
                g.errors + r.errors,
                used.cpu_secs,
                mb(used.max_rss_kb),
            );
        }
        md.push_str(
            "\nDetails. Server CPU is utime + stime of the server process over the measured window (100 % = one \
             core); peak RSS is the highest VmRSS sampled every 100 ms during the run, VmHWM the server's peak \
             since it started. Load generator CPU is this benchmark process; machine busy is all cores, all \
             processes (PostgreSQL included), 100 % = every core busy.\n\n\
             | scenario | clients | Stockguard outcomes | raw SQL outcomes | raw p50 / p95 ms | server CPU % | \
             server VmHWM MB | load generator CPU s, Stockguard / raw | machine busy %, Stockguard / raw |\n\
             |---|--:|---|---|--:|--:|--:|--:|--:|\n",
        );
        for c in self.cells {
            let (g, r) = (&c.stockguard.usage, &c.raw.usage);
            let used = g.server.unwrap_or_default();
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {:.2} / {:.2} | {:.0} | {:.1} | {:.1} / {:.1} | {:.0} / {:.0} |",
                c.scenario.name(),
                c.clients,
                c.stockguard.outcomes_text(),
                c.raw.outcomes_text(),
                c.raw.p50_ms,
                c.raw.p95_ms,
                100.0 * used.cpu_secs / c.stockguard.seconds,
                mb(used.hwm_kb),
                g.loadgen_cpu_secs,
                r.loadgen_cpu_secs,
                g.machine_busy_pct,
                r.machine_busy_pct,
            );
        }

        let st = self.strategy;
        let _ = writeln!(md, "\n## Strategies on HOT, {} clients\n", st.clients);
        md.push_str(
            "`expectedVersion`: each logical reservation reads `inventory { version }`, reserves at that version \
             and on `Conflict` reads again and retries, at most 3 retries. Latency is per logical reservation \
             (all its requests).\n\n\
             | strategy | successes/s | conflicts | retries | gave up | errors | HTTP requests/s | p50 / p95 / p99 ms | server CPU s |\n\
             |---|--:|--:|--:|--:|--:|--:|--:|--:|\n",
        );
        if let Some(p) = &st.plain {
            let _ = writeln!(
                md,
                "| plain `reserve` (no `expectedVersion`) | {:.0} | {} | 0 | 0 | {} | {:.0} | {:.2} / {:.2} / {:.2} | {:.1} |",
                p.per_sec(p.successes),
                p.outcomes.get("Conflict").copied().unwrap_or(0),
                p.errors,
                p.per_sec(p.requests),
                p.p50_ms,
                p.p95_ms,
                p.p99_ms,
                p.usage.server.unwrap_or_default().cpu_secs,
            );
        }
        let e = &st.expected;
        let _ = writeln!(
            md,
            "| `expectedVersion`, re-read + ≤ 3 retries | {:.0} | {} | {} | {} | {} | {:.0} | {:.2} / {:.2} / {:.2} | {:.1} |",
            e.per_sec(e.successes),
            e.conflicts,
            e.retries,
            e.outcomes.get("gave up").copied().unwrap_or(0),
            e.errors,
            e.per_sec(e.requests),
            e.p50_ms,
            e.p95_ms,
            e.p99_ms,
            e.usage.server.unwrap_or_default().cpu_secs,
        );

        let _ = writeln!(md, "\n## One contested order, {} clients\n", st.clients);
        md.push_str(
            "Clients mostly change the shipping address (read the version, change at it), every 50th operation \
             is a confirm or a cancel; a confirmed or cancelled order is replaced by a new one. Successes: \
             `ShippingAddressChanged`, `OrderConfirmed`, `OrderCancelled`. Conflicts: `OrderVersionConflict`, \
             `OrderModifiedConcurrently`.\n\n\
             | locking | operations/s | successes/s | conflicts | errors | p50 / p95 / p99 ms | server CPU s | outcomes |\n\
             |---|--:|--:|--:|--:|--:|--:|---|\n",
        );
        for (mode, o) in &st.orders {
            let _ = writeln!(
                md,
                "| {mode} | {:.0} | {:.0} | {} | {} | {:.2} / {:.2} / {:.2} | {:.1} | {} |",
                o.per_sec(o.operations),
                o.per_sec(o.successes),
                o.conflicts,
                o.errors,
                o.p50_ms,
                o.p95_ms,
                o.p99_ms,
                o.usage.server.unwrap_or_default().cpu_secs,
                o.outcomes_text(),
            );
        }

        md.push_str("\n## Targets\n\n");
        for (target, measured, met) in self.targets() {
            let _ = match met {
                Some(true) => writeln!(md, "- {target}: {measured}: **met**"),
                Some(false) => writeln!(md, "- {target}: {measured}: **not met**"),
                None => writeln!(md, "- {target}: not measured in this run"),
            };
        }
        if self.violations.is_empty() {
            let _ = writeln!(md, "\nInvariant: held after every run ({} checks).", self.invariant_checks);
        } else {
            md.push_str("\nInvariant VIOLATED:\n\n");
            for v in self.violations {
                let _ = writeln!(md, "- {v}");
            }
        }
        md
    }

    /// Successful reservations/s vs clients, Stockguard and raw SQL, HOT and SPREAD.
    fn chart(&self, path: &Path) -> anyhow::Result<()> {
        use plotters::prelude::*;

        let log2 = |c: usize| (c as f64).log2();
        let xs: Vec<f64> = self.cells.iter().map(|c| log2(c.clients)).collect();
        let (mut x0, mut x1) = xs.iter().fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
        if x1 - x0 < 1.0 {
            x0 -= 1.0;
            x1 += 1.0;
        }
        let x0 = x0 - 0.2;
        let x1 = x1 + 0.2;
        let ymax = self
            .cells
            .iter()
            .flat_map(|c| [c.stockguard.per_sec(c.stockguard.successes), c.raw.per_sec(c.raw.successes)])
            .fold(1.0f64, f64::max)
            * 1.15;

        let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("Successful reservations per second", ("sans-serif", 24))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(x0..x1, 0f64..ymax)?;
        chart
            .configure_mesh()
            .x_desc("concurrent clients (log scale)")
            .y_desc("successful reservations/s")
            .x_labels(((x1 - x0).ceil() as usize) + 1)
            .x_label_formatter(&|x| {
                let c = 2f64.powf(*x);
                if (c - c.round()).abs() < 0.01 { format!("{c:.0}") } else { String::new() }
            })
            .y_label_formatter(&|y| format!("{y:.0}"))
            .light_line_style(RGBColor(240, 240, 240))
            .draw()?;

        let red = RGBColor(200, 40, 40);
        let blue = RGBColor(30, 90, 200);
        let series: [(Scenario, bool, &str, RGBColor); 4] = [
            (Scenario::Spread, false, "Stockguard, SPREAD (10,000 rows)", blue),
            (Scenario::Spread, true, "raw-SQL limit, SPREAD", blue),
            (Scenario::Hot, false, "Stockguard, HOT (one row)", red),
            (Scenario::Hot, true, "raw-SQL limit, HOT", red),
        ];
        for (scenario, raw, label, color) in series {
            let points: Vec<(f64, f64)> = self
                .cells
                .iter()
                .filter(|c| c.scenario == scenario)
                .map(|c| {
                    let s = if raw { &c.raw } else { &c.stockguard };
                    (log2(c.clients), s.per_sec(s.successes))
                })
                .collect();
            let style = color.stroke_width(if raw { 2 } else { 3 });
            if raw {
                chart.draw_series(DashedLineSeries::new(points.clone(), 8, 6, style))?.label(label).legend(
                    move |(x, y)| {
                        EmptyElement::at((x, y))
                            + PathElement::new(vec![(0, 0), (8, 0)], style)
                            + PathElement::new(vec![(14, 0), (22, 0)], style)
                    },
                );
                chart.draw_series(points.iter().map(|&p| TriangleMarker::new(p, 6, color.filled())))?;
            } else {
                chart
                    .draw_series(LineSeries::new(points.clone(), style))?
                    .label(label)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], style));
                chart.draw_series(points.iter().map(|&p| Circle::new(p, 5, color.filled())))?;
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------

// One thread, as pgbench's default: on two cores shared with the server and
// PostgreSQL, a second load thread costs more in wake-ups than it adds, and
// the raw-SQL limit should be the highest this machine gives.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<std::process::ExitCode> {
    let args = Args::parse();
    let settings = Settings::from(&args)?;
    let server_bin = server_binary(args.server_bin.as_deref(), "bench")?;
    let database = ThrowAway::create(&args.database_url_base, "bench").await?;
    eprintln!("bench: database {}, server {}", database.name, server_bin.display());

    let result = run(settings, &server_bin, &database.url).await;
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
async fn run(settings: Settings, server_bin: &Path, database_url: &str) -> anyhow::Result<(String, bool)> {
    let secret = Keys::random_secret();
    let keys = Keys::new(secret.as_bytes());
    let locking = [("STOCKGUARD_ORDER_LOCKING", "optimistic".to_owned())];
    let server = Server::start(server_bin, database_url, &secret, &locking, Stdio::inherit()).await?;
    let result = main_matrix(settings, keys, &server, server_bin, database_url, &secret).await;
    let stopped = server.stop().await;
    let (markdown, ok) = result?;
    let status = stopped?;
    if !status.success() {
        bail!("the server exited with {status} after SIGTERM");
    }
    Ok((markdown, ok))
}

async fn main_matrix(
    settings: Settings,
    keys: Keys,
    server: &Server,
    server_bin: &Path,
    database_url: &str,
    secret: &str,
) -> anyhow::Result<(String, bool)> {
    let db_config = stockguard::config::DatabaseConfig {
        database_url: Some(database_url.to_owned()),
        data_dir: ".stockguard/postgres".into(),
        pool_size: 2,
        acquire_timeout_ms: 10_000,
        statement_timeout_ms: 300_000,
    };
    let db = stockguard::db::connect(database_url, &db_config).await?;

    eprintln!("bench: seeding HOT (GraphQL) and SPREAD (10,000 rows, SQL)");
    let operator = keys.mint("bench-operator", Role::Operator, chrono::Duration::hours(4))?;
    let hot = create_inventory(&Gql::new(&server.url, 1)?, &operator, "HOT", 1_000_000_000).await?;
    let spread = Arc::new(seed_spread(&db).await?);

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
        show(&db, "SELECT version()").await.split(" on ").next().unwrap_or("?"),
        show(&db, "SHOW synchronous_commit").await,
        show(&db, "SHOW shared_buffers").await,
        show(&db, "SHOW max_connections").await,
        server_bin.file_name().and_then(|n| n.to_str()).unwrap_or("stockguard"),
        server_bin.parent().and_then(|p| p.file_name()).and_then(|n| n.to_str()).unwrap_or("?"),
    );

    let mut bench = Bench {
        settings,
        keys,
        database_url: database_url.to_owned(),
        db,
        hot,
        spread,
        clk_tck: clk_tck(),
        ttl_secs: server_ttl_secs()?,
        invariant_checks: 0,
        violations: Vec::new(),
    };
    bench.check_invariant("seeding").await?;

    let mut cells = Vec::new();
    for scenario in [Scenario::Hot, Scenario::Spread] {
        for clients in bench.settings.clients.clone() {
            eprintln!(
                "bench: {} x{clients}: Stockguard and raw SQL, {} rounds",
                scenario.name(),
                bench.settings.rounds
            );
            let cell = bench.cell(server, scenario, clients).await?;
            for (side, stats) in [("Stockguard", &cell.stockguard), ("raw SQL", &cell.raw)] {
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

    let clients = bench.settings.strategy_clients();
    eprintln!("bench: strategies on HOT x{clients}: expectedVersion with re-read and retries");
    let expected = bench.expected_version(server, clients).await?;
    eprintln!("bench: contested order x{clients}, optimistic");
    let optimistic = bench.contested_order(server, clients, "optimistic").await?;
    eprintln!("bench: restarting the server with STOCKGUARD_ORDER_LOCKING=pessimistic");
    let locking = [("STOCKGUARD_ORDER_LOCKING", "pessimistic".to_owned())];
    let pessimistic_server = Server::start(server_bin, database_url, secret, &locking, Stdio::inherit()).await?;
    let pessimistic = bench.contested_order(&pessimistic_server, clients, "pessimistic").await;
    pessimistic_server.stop().await?;
    let pessimistic = pessimistic?;
    bench.check_invariant("the pessimistic server stopped").await?;

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
        strategy: &strategy,
        invariant_checks: bench.invariant_checks,
        violations: &bench.violations,
        main_hwm_kb,
    };
    let markdown = report.markdown();
    if let Some(out) = &bench.settings.out {
        std::fs::create_dir_all(out)?;
        std::fs::write(out.join("latest.md"), &markdown)?;
        report.chart(&out.join("reservations.svg"))?;
        eprintln!("bench: wrote {} and {}", out.join("latest.md").display(), out.join("reservations.svg").display());
    }

    let idle: Vec<String> = cells
        .iter()
        .filter(|c| c.stockguard.successes == 0 || c.raw.successes == 0)
        .map(|c| format!("{} x{}", c.scenario.name(), c.clients))
        .collect();
    if !idle.is_empty() {
        eprintln!("bench: no successful reservation in {}", idle.join(", "));
    }
    if bench.violations.is_empty() {
        eprintln!("bench: invariant: holds after every run ({} checks)", bench.invariant_checks);
    } else {
        eprintln!("bench: invariant: VIOLATED ({} drifts)", bench.violations.len());
    }
    bench.db.close().await?;
    Ok((markdown, bench.violations.is_empty() && idle.is_empty()))
}
