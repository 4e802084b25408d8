//! Issue 45's flood, with the default settings: one customer's token keeps
//! 200 connections busy with the most expensive reads the limits admit and
//! sends again the moment it is answered or refused, ignoring
//! `retryAfterMs` as a broken or hostile client does, while another
//! customer makes small reads one after another.
//!
//! What this asserts is the mechanism, which holds on any machine: every
//! one of the other customer's reads is answered without error; each of the
//! flooder's connections gets at most one refusal per 100 ms (each 429 is
//! held on its connection), as counted by the client and by the server's
//! `stockguard_throttled_total`; refusals were made before the request was
//! read (`known_short`, `in_flight`); and the flooder's reads ran on the
//! background lane. The latencies are printed, not asserted: on two cores
//! shared with the other tests they say more about the neighbours than
//! about the server. The 2× target of issue 45 is measured on a release
//! build by `examples/flood.rs` (bench/results/decisions.md, "Fair share by
//! default, against a flooder that does not wait").

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use stockguard::auth::Role;
use stockguard_support::documents::{FLOOD_READ, SMALL_READ};

use crate::process::Process;

/// The other customer's reads per phase.
const SAMPLES: usize = 300;

/// The flooder's connections.
const CONNECTIONS: usize = 200;

/// The shortest a refusal is held on its connection.
const HOLD: Duration = Duration::from_millis(100);

/// `(p50, p99)` of `samples`.
fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

/// `SAMPLES` small reads one after another as `token`; their latencies.
/// Every one must be answered, without error.
async fn sample(app: &Process, client: &reqwest::Client, token: &str, id: &str) -> Vec<Duration> {
    let mut took = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let started = Instant::now();
        let response = client
            .post(format!("{}/graphql", app.address))
            .bearer_auth(token)
            .json(&json!({ "query": SMALL_READ, "variables": { "id": id } }))
            .send()
            .await
            .expect("send");
        let status = response.status();
        let body: Value = response.json().await.expect("json");
        took.push(started.elapsed());
        assert_eq!(status, 200, "the other customer is always served: {body}");
        assert!(body.get("errors").is_none(), "the other customer gets no error: {body}");
        assert_eq!(body["data"]["inventory"]["id"], id, "{body}");
    }
    took
}

/// What one flooding connection got.
#[derive(Debug, Default)]
struct Flooded {
    answered: usize,
    refused: usize,
    /// Anything else: another status, or no answer.
    other: usize,
    /// How long it flooded.
    took: Duration,
}

/// One flooding connection until `stop`: the expensive read again and
/// again, never waiting, whatever the answer says.
async fn flood(address: String, token: String, stop: Arc<AtomicBool>) -> Flooded {
    // A client of its own: one keep-alive connection.
    let client = reqwest::Client::builder().pool_max_idle_per_host(1).timeout(Duration::from_secs(60)).build();
    let client = client.expect("client");
    let mut got = Flooded::default();
    let started = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let response = client
            .post(format!("{address}/graphql"))
            .bearer_auth(&token)
            .header("accept", "application/graphql-response+json")
            .json(&json!({ "query": FLOOD_READ }))
            .send()
            .await;
        match response.map(|r| r.status().as_u16()) {
            Ok(200) => got.answered += 1,
            Ok(429) => got.refused += 1,
            _ => got.other += 1,
        }
    }
    got.took = started.elapsed();
    got
}

/// The sum of the `/metrics` lines that start with `series`.
async fn metric(app: &Process, series: &str) -> f64 {
    let text = app.client.get(format!("{}/metrics", app.address)).send().await.expect("metrics");
    let text = text.text().await.expect("metrics text");
    text.lines()
        .filter(|line| line.starts_with(series))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flooder_that_never_waits_is_paced_and_the_other_customer_is_always_served_with_the_defaults() {
    let app = Arc::new(Process::start(&[]).await);
    // 100 inventories, and 100 reservations of the flooder's: its reads
    // resolve every row they ask for.
    let alice = app.token("alice", Role::Customer);
    let mut ids = Vec::new();
    for n in 0..100 {
        ids.push(app.create_inventory(&format!("FLOOD-{n}"), 10).await);
    }
    for id in &ids {
        let reserve = format!("mutation {{ reserve(input: {{ inventoryId: \"{id}\" }}) {{ __typename }} }}");
        let (_, body) = app.graphql(Some(&alice), &reserve, json!({})).await.expect("reserve");
        assert_eq!(body["data"]["reserve"]["__typename"], "Reserved", "{body}");
    }
    let (_, probe) = app.graphql(Some(&alice), FLOOD_READ, json!({})).await.expect("probe");
    let requested = probe["extensions"]["cost"]["requestedQueryCost"].as_i64().expect("cost");
    assert!((1000..=2000).contains(&requested), "the most expensive kind of read: {requested}");

    let bob = app.token("bob", Role::Customer);
    let id = ids[0].to_string();
    let client = reqwest::Client::new();
    sample(&app, &client, &bob, &id).await; // warm-up
    let quiet = percentiles(sample(&app, &client, &bob, &id).await);

    let refusals_before = metric(&app, "stockguard_throttled_total").await;
    let stop = Arc::new(AtomicBool::new(false));
    let floods: Vec<_> =
        (0..CONNECTIONS).map(|_| tokio::spawn(flood(app.address.clone(), alice.clone(), stop.clone()))).collect();
    let flooded = percentiles(sample(&app, &client, &bob, &id).await);
    stop.store(true, Ordering::Relaxed);
    let mut connections = Vec::new();
    for flood in floods {
        connections.push(flood.await.expect("flooder"));
    }
    let quiet_after = percentiles(sample(&app, &client, &bob, &id).await);

    let answered: usize = connections.iter().map(|c| c.answered).sum();
    let refused: usize = connections.iter().map(|c| c.refused).sum();
    let server_refused = metric(&app, "stockguard_throttled_total").await - refusals_before;
    let unread = metric(&app, "stockguard_throttled_total{reason=\"known_short\"}").await
        + metric(&app, "stockguard_throttled_total{reason=\"in_flight\"}").await;
    let aside = metric(&app, "stockguard_background_operations_total").await;
    let seconds = connections.iter().map(|c| c.took).max().unwrap_or_default().as_secs_f64();
    println!(
        "flood of {CONNECTIONS} connections ({requested} points a read, never waiting) for {seconds:.1} s: \
         {answered} answered, {refused} refused ({:.1} a second per connection; the server counted \
         {server_refused}, {unread} of them refused unread); {aside} reads on the background lane; \
         the other customer's p50/p99 quiet {:?}/{:?} and after {:?}/{:?}, flooded {:?}/{:?}",
        refused as f64 / CONNECTIONS as f64 / seconds,
        quiet.0,
        quiet.1,
        quiet_after.0,
        quiet_after.1,
        flooded.0,
        flooded.1,
    );

    for (n, connection) in connections.iter().enumerate() {
        assert_eq!(connection.other, 0, "connection {n} got only answers and refusals: {connection:?}");
        // Each refusal was held at least `HOLD` on its connection.
        let most = (connection.took.as_secs_f64() / HOLD.as_secs_f64()).floor() as usize + 1;
        assert!(connection.refused <= most, "connection {n}: {connection:?}, at most {most} refusals");
    }
    assert!(refused > 0 && answered > 0, "the flooder was both served and refused");
    // Every refusal the server made reached the client: each connection
    // waits for its last answer before it stops.
    assert_eq!(server_refused, refused as f64, "refusals counted by the server and by the client");
    assert!(unread > 0.0, "refusals were made before the request was read");
    assert!(aside > 0.0, "the flooder's reads ran on the background lane");
}
