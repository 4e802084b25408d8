//! A manual load against a running server (not part of the tests):
//!
//! ```sh
//! STOCKGUARD_JWT_SECRET=load cargo run --release &
//! cargo run --release --example load -- --secret load reserve --clients 64 --total 10000
//! cargo run --release --example load -- --secret load order --clients 64 --seconds 10
//! ```
//!
//! `reserve` takes `--total` units of one hot inventory from `--clients`
//! concurrent clients and reports throughput, latency and outcomes. `order`
//! keeps one order contested by clients mixing confirm, cancel and
//! changeShippingAddress; when it is confirmed or cancelled the next is placed.
//! With `--database-url` the DESIGN.md invariant is checked afterwards.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    time::{Duration, Instant},
};

use clap::{Parser, Subcommand};
use serde_json::{Value, json};
use stockguard::auth::{Keys, Role};
use tokio::sync::{Mutex, RwLock};
use uuid::Uuid;

#[derive(Parser)]
struct Args {
    /// The server.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: String,
    /// The server's STOCKGUARD_JWT_SECRET.
    #[arg(long)]
    secret: String,
    /// Check the invariant in this database afterwards.
    #[arg(long)]
    database_url: Option<String>,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Many clients reserving one hot inventory.
    Reserve {
        #[arg(long, default_value_t = 64)]
        clients: usize,
        #[arg(long, default_value_t = 10_000)]
        total: i64,
    },
    /// Many clients contesting one order at a time.
    Order {
        #[arg(long, default_value_t = 64)]
        clients: usize,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
}

struct Client {
    http: reqwest::Client,
    url: String,
}

impl Client {
    async fn graphql(&self, token: &str, query: &str, variables: Value) -> anyhow::Result<Value> {
        let response = self
            .http
            .post(&self.url)
            .bearer_auth(token)
            .json(&json!({ "query": query, "variables": variables }))
            .send()
            .await?;
        Ok(response.json().await?)
    }
}

type Tally = Arc<Mutex<BTreeMap<String, u64>>>;

async fn count(tally: &Tally, key: String) {
    *tally.lock().await.entry(key).or_default() += 1;
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted.get(((sorted.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or_default()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let keys = Keys::new(args.secret.as_bytes(), stockguard::auth::DEFAULT_MAX_TOKEN_TTL_SECS)?;
    let client = Arc::new(Client {
        http: reqwest::Client::builder().pool_max_idle_per_host(256).build()?,
        url: format!("{}/graphql", args.url),
    });
    let operator = keys.mint("load-operator", Role::Operator, chrono::Duration::hours(1))?;
    let tally: Tally = Arc::default();
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let started = Instant::now();

    match args.mode {
        Mode::Reserve { clients, total } => {
            let sku = format!("LOAD-{}", Uuid::new_v4().simple());
            let created = client
                .graphql(
                    &operator,
                    "mutation($i: CreateInventoryInput!) { createInventory(input: $i) { id } }",
                    json!({ "i": { "sku": sku, "name": "load test", "stock": total } }),
                )
                .await?;
            let id = created["data"]["createInventory"]["id"].as_str().unwrap_or_default().to_owned();
            let left = Arc::new(AtomicI64::new(total));
            let tasks = (0..clients).map(|i| {
                let (client, tally, latencies, left, id) =
                    (client.clone(), tally.clone(), latencies.clone(), left.clone(), id.clone());
                let token = keys.mint(&format!("load-{i}"), Role::Customer, chrono::Duration::hours(1));
                tokio::spawn(async move {
                    let token = token?;
                    while left.fetch_sub(1, Ordering::SeqCst) > 0 {
                        let t = Instant::now();
                        let body = client
                            .graphql(
                                &token,
                                "mutation($i: ReserveInput!) { reserve(input: $i) { __typename } }",
                                json!({ "i": { "inventoryId": id } }),
                            )
                            .await?;
                        latencies.lock().await.push(t.elapsed());
                        let outcome = body["data"]["reserve"]["__typename"].as_str().map_or_else(
                            || format!("error {}", body["errors"][0]["extensions"]["code"]),
                            str::to_owned,
                        );
                        count(&tally, outcome).await;
                    }
                    anyhow::Ok(())
                })
            });
            for task in futures::future::join_all(tasks).await {
                task??;
            }
        }
        Mode::Order { clients, seconds } => {
            let sku = format!("ORDER-LOAD-{}", Uuid::new_v4().simple());
            let created = client
                .graphql(
                    &operator,
                    "mutation($i: CreateInventoryInput!) { createInventory(input: $i) { id } }",
                    json!({ "i": { "sku": sku, "name": "order load", "stock": 1_000_000_000 } }),
                )
                .await?;
            let inventory = created["data"]["createInventory"]["id"].as_str().unwrap_or_default().to_owned();
            let customer = keys.mint("load-customer", Role::Customer, chrono::Duration::hours(1))?;
            let place = |client: Arc<Client>, customer: String, inventory: String| async move {
                let body = client
                    .graphql(
                        &customer,
                        "mutation($i: PlaceOrderInput!) { placeOrder(input: $i) { ... on OrderPlaced { order { id } } } }",
                        json!({ "i": { "items": [{ "inventoryId": inventory }], "shippingAddress": address("start") } }),
                    )
                    .await?;
                anyhow::Ok(body["data"]["placeOrder"]["order"]["id"].as_str().unwrap_or_default().to_owned())
            };
            let current = Arc::new(RwLock::new(place(client.clone(), customer.clone(), inventory.clone()).await?));
            let deadline = Instant::now() + Duration::from_secs(seconds);
            let tasks = (0..clients).map(|i| {
                let (client, tally, latencies, current) =
                    (client.clone(), tally.clone(), latencies.clone(), current.clone());
                let (operator, customer, inventory) = (operator.clone(), customer.clone(), inventory.clone());
                tokio::spawn(async move {
                    let mut n = 0usize;
                    while Instant::now() < deadline {
                        n += 1;
                        let order = current.read().await.clone();
                        // Mostly address changes from screens, now and then a
                        // confirm or a cancel, so the order stays contested.
                        let op = match (i + n) % 50 {
                            0 => "confirmOrder",
                            1 => "cancelOrder",
                            _ => "changeShippingAddress",
                        };
                        let t = Instant::now();
                        let body = match op {
                            "changeShippingAddress" => {
                                let seen = client
                                    .graphql(&customer, "query($id: UUID!) { order(id: $id) { version } }", json!({ "id": order }))
                                    .await?;
                                let version = seen["data"]["order"]["version"].as_i64().unwrap_or(0);
                                client
                                    .graphql(
                                        &customer,
                                        "mutation($i: ChangeShippingAddressInput!) { changeShippingAddress(input: $i) { __typename } }",
                                        json!({ "i": { "orderId": order, "expectedVersion": version, "shippingAddress": address(&format!("client {i} #{n}")) } }),
                                    )
                                    .await?
                            }
                            _ => {
                                client
                                    .graphql(&operator, &format!("mutation($id: UUID!) {{ {op}(id: $id) {{ __typename }} }}"), json!({ "id": order }))
                                    .await?
                            }
                        };
                        latencies.lock().await.push(t.elapsed());
                        let outcome = body["data"][op]["__typename"].as_str().map_or_else(
                            || format!("error {}", body["errors"][0]["extensions"]["code"]),
                            str::to_owned,
                        );
                        if outcome == "OrderConfirmed" || outcome == "OrderCancelled" {
                            let next = place(client.clone(), customer.clone(), inventory.clone()).await?;
                            let mut current = current.write().await;
                            if *current == order {
                                *current = next;
                            }
                        }
                        count(&tally, format!("{op} -> {outcome}")).await;
                    }
                    anyhow::Ok(())
                })
            });
            for task in futures::future::join_all(tasks).await {
                task??;
            }
        }
    }

    let elapsed = started.elapsed();
    let mut latencies = latencies.lock().await.clone();
    latencies.sort();
    let requests = latencies.len();
    println!(
        "{requests} requests in {:.2} s = {:.0} req/s",
        elapsed.as_secs_f64(),
        requests as f64 / elapsed.as_secs_f64()
    );
    println!(
        "latency p50 {:?}  p95 {:?}  p99 {:?}  max {:?}",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.95),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or_default()
    );
    for (outcome, n) in tally.lock().await.iter() {
        println!("{n:>8}  {outcome}");
    }
    if let Some(url) = args.database_url {
        let config = stockguard::config::DatabaseConfig {
            database_url: Some(url.clone()),
            data_dir: ".stockguard/postgres".into(),
            pool_size: 1,
            acquire_timeout_ms: 5000,
            statement_timeout_ms: 60_000,
        };
        let db = stockguard::db::connect(&url, &config).await?;
        let drifts = stockguard::invariant::check(&db).await?;
        println!("invariant: {}", if drifts.is_empty() { "holds".to_owned() } else { format!("{drifts:?}") });
    }
    Ok(())
}

fn address(line1: &str) -> Value {
    json!({ "name": "Load Tester", "line1": line1, "city": "Osaka", "postalCode": "530-0001", "country": "JP" })
}
