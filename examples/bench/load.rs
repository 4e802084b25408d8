//! `bench load`: the benchmark's client loops against a server that is
//! already running, for a manual look (not part of the tests). Each
//! scenario creates its own inventory, runs `--clients` clients and reports
//! requests per second, latency percentiles and outcome counts; with
//! `--database-url` the docs/design.md invariant is checked afterwards. A new
//! scenario is a [`Scenario`] variant and one function that spawns its
//! clients.

use std::{
    sync::{Arc, atomic::AtomicI64},
    time::{Duration, Instant},
};

use clap::Subcommand;
use stockguard::{
    auth::{Keys, Role},
    config::DatabaseConfig,
};
use tokio::{sync::RwLock, task::JoinHandle};
use uuid::Uuid;

use crate::{
    measure::{Recorder, Stats, run_tasks},
    scenarios::{
        CHECKOUT_SUCCESSES, CheckoutContest, ORDER_SUCCESSES, OrderContest, Targets, Units, address, reserve_client,
    },
};
use stockguard_support::client::Gql;

/// A load against a running server.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The server.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: String,
    /// The server's STOCKGUARD_JWT_SECRET.
    #[arg(long)]
    secret: String,
    /// Check the invariant in this database afterwards.
    #[arg(long)]
    database_url: Option<String>,
    /// What the clients do.
    #[command(subcommand)]
    scenario: Scenario,
}

/// What the clients of a load do.
#[derive(Subcommand, Debug)]
enum Scenario {
    /// Many clients reserving one hot inventory, `--total` units in all.
    Reserve {
        /// Concurrent clients.
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// Units reserved in all (one request each).
        #[arg(long, default_value_t = 10_000)]
        total: i64,
    },
    /// Many clients contesting one order at a time (see `OrderContest`).
    Order {
        /// Concurrent clients.
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// How long.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
    /// Many customers checking out carts on a few hot inventories, each
    /// cart submitted several times at once (see `CheckoutContest`).
    Checkout {
        /// Concurrent clients (customers).
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// How long.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Hot inventories the carts hold.
        #[arg(long, default_value_t = 4)]
        inventories: usize,
        /// Holds per cart.
        #[arg(long, default_value_t = 3)]
        lines: usize,
        /// Checkouts sent at once per cart.
        #[arg(long, default_value_t = 2)]
        submits: usize,
    },
}

/// A token valid for the load.
fn token(keys: &Keys, sub: &str, role: Role) -> anyhow::Result<String> {
    Ok(keys.mint(sub, role, chrono::Duration::hours(1))?)
}

/// Runs the load and prints its report.
pub async fn run(args: Args) -> anyhow::Result<std::process::ExitCode> {
    let keys = Keys::new(args.secret.as_bytes(), stockguard::config::DEFAULT_MAX_TOKEN_TTL_SECS)?;
    let operator = token(&keys, "load-operator", Role::Operator)?;
    let started = Instant::now();
    let (tasks, success): (Vec<JoinHandle<anyhow::Result<Recorder>>>, &[&str]) = match args.scenario {
        Scenario::Reserve { clients, total } => {
            let gql = Arc::new(Gql::new(&args.url, clients)?);
            let sku = format!("LOAD-{}", Uuid::new_v4().simple());
            let hot = Arc::new(vec![gql.create_inventory(&operator, &sku, "load test", total).await?]);
            let hot = Targets { ids: hot, units: Units::One };
            let left = Arc::new(AtomicI64::new(total));
            let until = Instant::now() + Duration::from_secs(24 * 3600);
            let mut tasks = Vec::with_capacity(clients);
            for i in 0..clients {
                let token = token(&keys, &format!("load-{i}"), Role::Customer)?;
                let rec = Recorder::new(Instant::now(), until);
                let client =
                    reserve_client(gql.clone(), token, hot.clone(), i as u64 + 1, rec, Some(left.clone()), false);
                tasks.push(tokio::spawn(client));
            }
            (tasks, &["Reserved"])
        }
        Scenario::Order { clients, seconds } => {
            let gql = Arc::new(Gql::new(&args.url, clients)?);
            let customer = token(&keys, "load-customer", Role::Customer)?;
            let sku = format!("ORDER-LOAD-{}", Uuid::new_v4().simple());
            let inventory = gql.create_inventory(&operator, &sku, "order load", 1_000_000_000).await?;
            let first = gql.place_order(&customer, inventory, address("start")).await?;
            let contest =
                Arc::new(OrderContest { gql, current: Arc::new(RwLock::new(first)), operator, customer, inventory });
            let until = Instant::now() + Duration::from_secs(seconds);
            let tasks = (0..clients)
                .map(|i| tokio::spawn(contest.clone().client(i, Recorder::new(Instant::now(), until), until)))
                .collect();
            (tasks, &ORDER_SUCCESSES)
        }
        Scenario::Checkout { clients, seconds, inventories, lines, submits } => {
            let gql = Arc::new(Gql::new(&args.url, clients * (submits + 1))?);
            let mut hot = Vec::with_capacity(inventories);
            for n in 0..inventories.max(1) {
                let sku = format!("CHECKOUT-LOAD-{n}-{}", Uuid::new_v4().simple());
                hot.push(gql.create_inventory(&operator, &sku, "checkout load", 1_000_000_000).await?);
            }
            let contest = Arc::new(CheckoutContest {
                gql,
                inventories: Arc::new(hot),
                lines: lines.max(1),
                submits: submits.max(1),
            });
            let until = Instant::now() + Duration::from_secs(seconds);
            let mut tasks = Vec::with_capacity(clients);
            for i in 0..clients {
                let customer = token(&keys, &format!("load-cart-{i}"), Role::Customer)?;
                let rec = Recorder::new(Instant::now(), until);
                tasks.push(tokio::spawn(contest.clone().client(i, customer, rec, until)));
            }
            (tasks, &CHECKOUT_SUCCESSES)
        }
    };
    let recorder = run_tasks(tasks).await?;
    let stats = Stats::from(recorder, started.elapsed().as_secs_f64(), success);
    println!(
        "{} requests in {:.2} s = {:.0} req/s ({:.0} successes/s)",
        stats.requests,
        stats.seconds,
        stats.per_sec(stats.requests),
        stats.per_sec(stats.successes)
    );
    println!("latency p50 {:.2} ms  p95 {:.2} ms  p99 {:.2} ms", stats.p50_ms, stats.p95_ms, stats.p99_ms);
    for (outcome, n) in &stats.outcomes {
        println!("{n:>8}  {outcome}");
    }
    let mut ok = stats.errors == 0;
    if let Some(url) = args.database_url {
        let config = DatabaseConfig {
            database_url: Some(url.clone()),
            pool_size: 1,
            acquire_timeout_ms: 5000,
            statement_timeout_ms: 60_000,
            ..DatabaseConfig::default()
        };
        let db = stockguard::db::connect(&url, &config).await?;
        let drifts = stockguard::invariant::check(&db).await?;
        ok &= drifts.is_empty();
        println!("invariant: {}", if drifts.is_empty() { "holds".to_owned() } else { format!("{drifts:?}") });
        db.close().await?;
    }
    Ok(if ok { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::FAILURE })
}
