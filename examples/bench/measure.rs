//! Measuring: what the server, this load generator and the machine used
//! during a run (/proc), what each client recorded, and the statistics of a
//! run (throughput, percentiles, outcomes).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};

use stockguard_support::{client::Outcome, process::status_kb};

/// Samples the server's VmRSS every 100 ms while a run lasts.
pub struct RssSampler {
    /// Turns true when the run is over.
    stop: Arc<AtomicBool>,
    /// The highest VmRSS seen, in kB.
    max_kb: Arc<AtomicU64>,
    /// The sampling task.
    task: tokio::task::JoinHandle<()>,
}

impl RssSampler {
    /// Starts sampling process `pid`.
    pub fn start(pid: u32) -> Self {
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

    /// Stops, and the highest VmRSS seen (kB), the end included.
    pub async fn finish(self, pid: u32) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.max_kb.fetch_max(status_kb(pid, "VmRSS").unwrap_or(0), Ordering::Relaxed);
        self.max_kb.load(Ordering::Relaxed)
    }
}

/// What the server used during one measured window.
#[derive(Clone, Copy, Default)]
pub struct ServerUse {
    /// utime + stime over the measured window.
    pub cpu_secs: f64,
    /// The highest VmRSS sampled during the run.
    pub max_rss_kb: u64,
    /// VmHWM at the end of the run: the peak since the process started.
    pub hwm_kb: u64,
}

/// CPU and memory used during one run's measured window.
#[derive(Clone, Copy, Default)]
pub struct Usage {
    /// The server's, when the run went through it.
    pub server: Option<ServerUse>,
    /// This process: the load generator (and, for raw SQL, the client side of the statements).
    pub loadgen_cpu_secs: f64,
    /// How busy the whole machine was (every process, including PostgreSQL).
    pub machine_busy_pct: f64,
    /// CPU of the PostgreSQL backends serving the benchmark's database
    /// (not the WAL writer and checkpointer, which serve every database).
    pub pg_cpu_secs: f64,
}

/// CPU counters at one moment.
pub struct CpuSnapshot {
    /// The server's CPU seconds so far.
    server_secs: f64,
    /// This process's CPU seconds so far.
    own_secs: f64,
    /// Jiffies of all CPUs from /proc/stat: all, and all but idle and iowait.
    machine_total: u64,
    machine_busy: u64,
}

impl CpuSnapshot {
    /// The counters now, of `server` when given.
    pub fn take(server: Option<u32>, clk_tck: f64) -> Self {
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

/// One task's measurements; merged after a run.
#[derive(Default)]
pub struct Recorder {
    /// Operations that end before this are warm-up.
    pub measure_from: Option<Instant>,
    /// Operations that end after this are not counted.
    pub until: Option<Instant>,
    /// Latency of each counted operation.
    pub latencies_us: Vec<u32>,
    /// Counted operations by outcome.
    pub outcomes: BTreeMap<String, u64>,
    /// Counted operations that ended in an error.
    pub errors: u64,
    /// Conflicts met (a logical operation may meet several).
    pub conflicts: u64,
    /// Retries made.
    pub retries: u64,
    /// HTTP requests (or statements) sent.
    pub requests: u64,
}

impl Recorder {
    /// A recorder of operations ending between `measure_from` and `until`.
    pub fn new(measure_from: Instant, until: Instant) -> Self {
        Self { measure_from: Some(measure_from), until: Some(until), ..Self::default() }
    }

    /// Whether an operation that ended at `end` falls in the measured window.
    pub fn counts(&self, end: Instant) -> bool {
        self.measure_from.is_some_and(|from| end >= from) && self.until.is_some_and(|until| end <= until)
    }

    /// Records one operation that started at `start`, unless it ended outside the window.
    pub fn record(&mut self, start: Instant, outcome: &Outcome, extra: Extra) -> bool {
        let end = Instant::now();
        if !self.counts(end) {
            return false;
        }
        self.latencies_us.push(u32::try_from(end.duration_since(start).as_micros()).unwrap_or(u32::MAX));
        let name = match outcome {
            Outcome::Ok(name, _) => name.clone(),
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

    /// Adds what `other` recorded.
    pub fn merge(&mut self, other: Recorder) {
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

/// What one logical operation cost beyond its latency.
#[derive(Clone, Copy)]
pub struct Extra {
    /// Conflicts it met.
    pub conflicts: u64,
    /// Retries it made.
    pub retries: u64,
    /// Requests it sent.
    pub requests: u64,
}

/// The extras of an operation that is one request.
pub const ONE_REQUEST: Extra = Extra { conflicts: 0, retries: 0, requests: 1 };

/// One side of a reserve cell, summed over its rounds.
#[derive(Default)]
pub struct Measured {
    /// What every round recorded.
    pub recorder: Recorder,
    /// What every round used.
    pub usage: Usage,
    /// Rounds so far.
    pub rounds: u32,
}

impl Measured {
    /// Adds one round.
    pub fn add(&mut self, (recorder, usage): (Recorder, Usage)) {
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
        sum.pg_cpu_secs += one.pg_cpu_secs;
        self.rounds += 1;
    }

    /// The statistics over `seconds` measured in all; machine busy is the mean of the rounds.
    pub fn stats(self, seconds: f64) -> Stats {
        let mut stats = Stats::from(self.recorder, seconds, &crate::scenarios::RESERVED);
        stats.usage = self.usage;
        stats.usage.machine_busy_pct /= f64::from(self.rounds.max(1));
        stats
    }
}

/// The merged measurements of one run.
#[derive(Clone, Default)]
pub struct Stats {
    /// Measured seconds.
    pub seconds: f64,
    /// Operations counted.
    pub operations: u64,
    /// Operations that ended in a success.
    pub successes: u64,
    /// Operations by outcome.
    pub outcomes: BTreeMap<String, u64>,
    /// Operations that ended in an error.
    pub errors: u64,
    /// Conflicts met.
    pub conflicts: u64,
    /// Retries made.
    pub retries: u64,
    /// Requests sent.
    pub requests: u64,
    /// Median latency.
    pub p50_ms: f64,
    /// 95th percentile latency.
    pub p95_ms: f64,
    /// 99th percentile latency.
    pub p99_ms: f64,
    /// What the run used.
    pub usage: Usage,
}

impl Stats {
    /// The statistics of `merged` over `seconds`, counting the outcomes in `success` as successes.
    pub fn from(mut merged: Recorder, seconds: f64, success: &[&str]) -> Self {
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

    /// `n` per measured second.
    pub fn per_sec(&self, n: u64) -> f64 {
        n as f64 / self.seconds
    }

    /// The outcomes as `name count, ...`.
    pub fn outcomes_text(&self) -> String {
        self.outcomes.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
    }
}

/// Runs `tasks` (each given its recorder) and merges what they recorded.
pub async fn run_tasks(tasks: Vec<tokio::task::JoinHandle<anyhow::Result<Recorder>>>) -> anyhow::Result<Recorder> {
    let mut merged = Recorder::default();
    for task in futures::future::join_all(tasks).await {
        merged.merge(task??);
    }
    Ok(merged)
}

/// The window of a run: warm-up until `measure_from`, measured until `until`.
pub fn window_of(warmup: Duration, measured: Duration) -> (Instant, Instant) {
    let measure_from = Instant::now() + warmup;
    (measure_from, measure_from + measured)
}

/// CPU seconds so far of each PostgreSQL backend connected to `db`'s database.
async fn backends_cpu(db: &DatabaseConnection, clk_tck: f64) -> HashMap<u32, f64> {
    let sql = "SELECT pid FROM pg_stat_activity WHERE datname = current_database()";
    let rows = db.query_all_raw(Statement::from_string(DbBackend::Postgres, sql)).await.unwrap_or_default();
    rows.iter()
        .filter_map(|row| row.try_get_by_index::<i32>(0).ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            Some((pid as u32, parse_cpu(&stat, clk_tck)))
        })
        .collect()
}

/// Measures CPU (the server's, this load generator's, the machine's, the
/// database backends' of `pg`) over the measured window of `run`, and the
/// server's memory over all of it.
pub async fn measure<F: Future<Output = anyhow::Result<Recorder>>>(
    server: Option<u32>,
    pg: &DatabaseConnection,
    clk_tck: f64,
    measure_from: Instant,
    run: F,
) -> anyhow::Result<(Recorder, Usage)> {
    let pid = server;
    let sampler = pid.map(RssSampler::start);
    let at_start = tokio::spawn({
        let pg = pg.clone();
        async move {
            tokio::time::sleep_until(measure_from.into()).await;
            (CpuSnapshot::take(pid, clk_tck), backends_cpu(&pg, clk_tck).await)
        }
    });
    let recorder = run.await?;
    let end = CpuSnapshot::take(pid, clk_tck);
    let pg_end = backends_cpu(pg, clk_tck).await;
    let (start, pg_start) = at_start.await?;
    // A backend that connected during the window counts from zero.
    let pg_cpu_secs =
        pg_end.iter().map(|(pid, secs)| (secs - pg_start.get(pid).copied().unwrap_or(0.0)).max(0.0)).sum();
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
            machine_busy_pct: if machine_total > 0 { 100.0 * machine_busy as f64 / machine_total as f64 } else { 0.0 },
            pg_cpu_secs,
        },
    ))
}

/// utime + stime in seconds from a /proc/<pid>/stat line.
pub fn parse_cpu(stat: &str, clk_tck: f64) -> f64 {
    // The fields after the command name, which is in parentheses and may hold
    // spaces: the first is field 3 (state); utime is field 14, stime field 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (ticks(14) + ticks(15)) as f64 / clk_tck
}

/// Clock ticks per second (`getconf CLK_TCK`), 100 when unknown.
pub fn clk_tck() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// Cores, memory, CPU model and load average, for the report.
pub fn machine() -> String {
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
