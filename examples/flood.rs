//! Measures fair share against a flooder that does not wait (issue 45): one
//! customer's token keeps `--connections` connections busy with the most
//! expensive read the limits admit and sends it again the moment it is
//! answered or refused, while another customer makes one small read after
//! another. Quiet and flooded phases alternate `--rounds` times, so a
//! machine whose load drifts shows in the spread instead of in one ratio.
//!
//! ```sh
//! cargo build --release --bin stockguard --example flood
//! target/release/examples/flood --binary target/release/stockguard
//! target/release/examples/flood --binary OLD/stockguard --env STOCKGUARD_BUCKET_SIZE=6000
//! ```
//!
//! The server runs with its default settings (plus `--env`) on a throw-away
//! database. The other customer's reads run on a thread of their own, so the
//! flooder's tasks never delay the clock that times them. Per round it
//! prints the other customer's p50/p99 quiet and flooded, its errors, the
//! flooder's answered and refused reads (and refusals per connection per
//! second), the server's own count of refusals, and the server's CPU.

use std::{
    path::PathBuf,
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use clap::Parser;
use serde_json::{Value, json};
use stockguard::{
    auth::{Keys, Role},
    config::DEFAULT_MAX_TOKEN_TTL_SECS,
};
use stockguard_support::{
    client,
    database::ThrowAway,
    documents::{FLOOD_READ, RESERVE, SMALL_READ},
    process::{Log, ServerProcess, server_binary},
};

#[derive(Parser)]
struct Args {
    /// The server binary (default: the release build beside this one).
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Where to make the throw-away database.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    database_url: String,
    /// The flooder's connections.
    #[arg(long, default_value_t = 200)]
    connections: usize,
    /// Length of each flooded phase (seconds).
    #[arg(long, default_value_t = 15)]
    seconds: u64,
    /// Length of each quiet phase (seconds).
    #[arg(long, default_value_t = 5)]
    quiet_seconds: u64,
    /// Quiet and flooded phases, in turn.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Extra server settings, `NAME=VALUE` (repeatable); none: the defaults.
    #[arg(long = "env")]
    env: Vec<String>,
}

const SECRET: &str = "flood-secret-of-at-least-thirty-two-bytes";

/// What one phase of the other customer's reads saw.
struct Sampled {
    took: Vec<Duration>,
    errors: usize,
    first_error: Option<String>,
}

/// The flooder's counts, shared by its connections.
#[derive(Default)]
struct Counts {
    answered: AtomicU64,
    refused: AtomicU64,
    other: AtomicU64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // The flooder's runtime; the sampler has a thread of its own (below).
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let binary = server_binary(args.binary.as_deref(), "flood")?;
    let database = ThrowAway::create(&args.database_url, "flood").await?;
    let env: Vec<(String, String)> = args
        .env
        .iter()
        .map(|pair| pair.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).context("--env NAME=VALUE"))
        .collect::<anyhow::Result<_>>()?;
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let server = ServerProcess::start(&binary, &database.url, Some(SECRET), &env, Log::Warnings(Stdio::inherit()))
        .await
        .context("starting the server")?;
    let result = measure(&args, &server).await;
    let _ = server.stop().await;
    database.drop("flood").await;
    result
}

async fn measure(args: &Args, server: &ServerProcess) -> anyhow::Result<()> {
    let keys = Keys::new(SECRET.as_bytes(), DEFAULT_MAX_TOKEN_TTL_SECS)?;
    let mint = |sub: &str, role| keys.mint(sub, role, chrono::Duration::hours(4));
    let (operator, alice, bob) =
        (mint("flood-operator", Role::Operator)?, mint("alice", Role::Customer)?, mint("bob", Role::Customer)?);
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
    // 100 inventories, and 100 reservations of the flooder's: its reads
    // resolve every row they ask for.
    let mut ids = Vec::new();
    for n in 0..100 {
        let id = client::create_inventory(&http, &server.url, &operator, &format!("FLOOD-{n}"), "flood", 10).await?;
        ids.push(id);
    }
    for id in &ids {
        let body = client::request(RESERVE, json!({ "input": { "inventoryId": id } }));
        let reply = client::post(&http, &server.url, Some(&format!("Bearer {alice}")), body).await?;
        let body: Value = serde_json::from_slice(&reply.body)?;
        if body["data"]["reserve"]["__typename"] != "Reserved" {
            bail!("the flooder's reservation: {body}");
        }
    }
    let bearer = format!("Bearer {alice}");
    let probe = client::post(&http, &server.url, Some(&bearer), client::request(FLOOD_READ, json!({}))).await?;
    let probe: Value = serde_json::from_slice(&probe.body)?;
    let requested = probe["extensions"]["cost"]["requestedQueryCost"].as_u64().context("the read's cost")?;
    let settings = if args.env.is_empty() { "the defaults".to_owned() } else { args.env.join(" ") };
    println!(
        "flood: {} connections of one token, each read {requested} points, re-sent at once when refused; server {} with {settings}",
        args.connections,
        server_binary(args.binary.as_deref(), "flood")?.display()
    );

    let sampler = Sampler::start(server.url.clone(), bob, ids[0].to_string());
    sampler.run(Duration::from_secs(1)).await?; // warm-up
    let mut rows = Vec::new();
    for round in 1..=args.rounds {
        let cpu = Cpu::of(server.pid);
        let quiet = sampler.run(Duration::from_secs(args.quiet_seconds)).await?;
        let quiet_cpu = cpu.since();
        let refusals_before = throttled(&http, &server.url).await;
        let counts = Arc::new(Counts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let floods: Vec<_> = (0..args.connections)
            .map(|_| tokio::spawn(flood(server.url.clone(), alice.clone(), stop.clone(), counts.clone())))
            .collect();
        // Every connection open and the bucket's first fill spent.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (answered_before, refused_before) =
            (counts.answered.load(Ordering::Relaxed), counts.refused.load(Ordering::Relaxed));
        let cpu = Cpu::of(server.pid);
        let flooded = sampler.run(Duration::from_secs(args.seconds)).await?;
        let flooded_cpu = cpu.since();
        let answered = counts.answered.load(Ordering::Relaxed) - answered_before;
        let refused = counts.refused.load(Ordering::Relaxed) - refused_before;
        stop.store(true, Ordering::Relaxed);
        for flood in floods {
            flood.await?;
        }
        let server_refused = throttled(&http, &server.url).await - refusals_before;
        let (q50, q99) = percentiles(&quiet.took);
        let (f50, f99) = percentiles(&flooded.took);
        let ratio = f99.as_secs_f64() / q99.as_secs_f64();
        let per_connection = refused as f64 / args.connections as f64 / args.seconds as f64;
        println!(
            "round {round}: other customer quiet p50/p99 {:.2}/{:.2} ms ({} reads, {} errors, server CPU {:.0} %), \
             flooded {:.2}/{:.2} ms ({} reads, {} errors, server CPU {:.0} %): p99 {ratio:.2}×; \
             flooder {answered} answered, {refused} refused ({per_connection:.2} a second per connection; \
             the server counted {server_refused:.0} over the whole flood), {} other answers{}",
            ms(q50),
            ms(q99),
            quiet.took.len(),
            quiet.errors,
            quiet_cpu * 100.0,
            ms(f50),
            ms(f99),
            flooded.took.len(),
            flooded.errors,
            flooded_cpu * 100.0,
            counts.other.load(Ordering::Relaxed),
            flooded.first_error.or(quiet.first_error).map(|e| format!("; first error: {e}")).unwrap_or_default(),
        );
        rows.push((q99, f99, ratio));
    }
    let ratios: Vec<String> = rows.iter().map(|(_, _, r)| format!("{r:.2}")).collect();
    let best_quiet = rows.iter().map(|(q, _, _)| *q).min().unwrap_or_default();
    let worst_flooded = rows.iter().map(|(_, f, _)| *f).max().unwrap_or_default();
    println!(
        "p99 flooded / quiet by round: {}; worst flooded p99 {:.2} ms against the best quiet p99 {:.2} ms: {:.2}×",
        ratios.join(", "),
        ms(worst_flooded),
        ms(best_quiet),
        worst_flooded.as_secs_f64() / best_quiet.as_secs_f64()
    );
    Ok(())
}

/// One flooding connection until `stop`: the expensive read again and
/// again, never waiting, whatever the answer says.
async fn flood(url: String, token: String, stop: Arc<AtomicBool>, counts: Arc<Counts>) {
    // A client of its own, so each task is one keep-alive connection.
    let Ok(http) = reqwest::Client::builder().pool_max_idle_per_host(1).timeout(Duration::from_secs(60)).build() else {
        return;
    };
    let body = client::request(FLOOD_READ, json!({}));
    let authorization = format!("Bearer {token}");
    while !stop.load(Ordering::Relaxed) {
        let counter = match client::post(&http, &url, Some(&authorization), body.clone()).await {
            Ok(reply) if reply.status == 200 => &counts.answered,
            Ok(reply) if reply.status == 429 => &counts.refused,
            _ => &counts.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The other customer: small reads one after another on a thread and a
/// runtime of their own, one phase at a time.
struct Sampler {
    phases: tokio::sync::mpsc::Sender<(Duration, tokio::sync::oneshot::Sender<Sampled>)>,
}

impl Sampler {
    fn start(url: String, token: String, id: String) -> Self {
        let (phases, mut asked) = tokio::sync::mpsc::channel::<(Duration, tokio::sync::oneshot::Sender<Sampled>)>(1);
        std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            runtime.block_on(async move {
                let Ok(http) = reqwest::Client::builder().timeout(Duration::from_secs(30)).build() else { return };
                let body = client::request(SMALL_READ, json!({ "id": id }));
                let authorization = format!("Bearer {token}");
                while let Some((length, answer)) = asked.recv().await {
                    let mut sampled = Sampled { took: Vec::new(), errors: 0, first_error: None };
                    let until = Instant::now() + length;
                    while Instant::now() < until {
                        let started = Instant::now();
                        let reply = client::post(&http, &url, Some(&authorization), body.clone()).await;
                        sampled.took.push(started.elapsed());
                        let fine = reply.as_ref().is_ok_and(|reply| {
                            reply.status == 200
                                && serde_json::from_slice::<Value>(&reply.body)
                                    .is_ok_and(|v| v["data"]["inventory"]["id"] == id && v.get("errors").is_none())
                        });
                        if !fine {
                            sampled.errors += 1;
                            sampled.first_error.get_or_insert_with(|| match &reply {
                                Ok(reply) => format!("{} {}", reply.status, String::from_utf8_lossy(&reply.body)),
                                Err(err) => err.to_string(),
                            });
                        }
                    }
                    let _ = answer.send(sampled);
                }
            });
        });
        Self { phases }
    }

    /// The reads of one phase of `length`.
    async fn run(&self, length: Duration) -> anyhow::Result<Sampled> {
        let (answer, sampled) = tokio::sync::oneshot::channel();
        self.phases.send((length, answer)).await.map_err(|_| anyhow::anyhow!("the sampler stopped"))?;
        sampled.await.context("the sampler stopped")
    }
}

/// `(p50, p99)` of `samples`.
fn percentiles(samples: &[Duration]) -> (Duration, Duration) {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let at = |q: f64| sorted.get(((sorted.len().max(1) - 1) as f64 * q).round() as usize).copied().unwrap_or_default();
    (at(0.5), at(0.99))
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// The server's `stockguard_throttled_total`, every reason summed.
async fn throttled(http: &reqwest::Client, url: &str) -> f64 {
    let Ok(response) = http.get(format!("{url}/metrics")).send().await else { return 0.0 };
    let text = response.text().await.unwrap_or_default();
    text.lines()
        .filter(|line| line.starts_with("stockguard_throttled_total"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A process's CPU time from a starting point, as a share of one core.
struct Cpu {
    pid: u32,
    ticks: u64,
    at: Instant,
}

impl Cpu {
    fn of(pid: u32) -> Self {
        Self { pid, ticks: ticks(pid), at: Instant::now() }
    }

    /// CPU seconds per second since [`Cpu::of`].
    fn since(&self) -> f64 {
        // The kernel's clock ticks are 100 a second on Linux.
        (ticks(self.pid).saturating_sub(self.ticks)) as f64 / 100.0 / self.at.elapsed().as_secs_f64()
    }
}

/// User and system clock ticks of `pid` (`/proc/<pid>/stat`, fields 14 and 15).
fn ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may hold spaces; the fields after it are counted from its `)`.
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    fields.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
        + fields.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0)
}
