//! `--drop`: a drop with a waiting list (docs/waitlists.md). One item is
//! sold out to `units` customers holding one unit each, and `entries`
//! customers wait in its line for one unit each (10,000 and 2,000; the
//! smoke's 200 and 50). Then its holders release at full speed through
//! `clients` clients: each release is the statement that offers its unit
//! to the next in line, so the time from a unit's release to its offer is
//! the release's own answer time, measured per request. Reported: offers
//! per second, p50 and p99 of that time, and the server's and
//! PostgreSQL's CPU per offer; checked from the database: exactly the
//! first `units` entries are OFFERED, in the order they joined, and the
//! invariant holds.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use serde_json::json;
use stockguard::auth::Role;
use stockguard_support::{
    client::{Gql, Outcome},
    documents::{RELEASE, RESERVE},
    process::ServerProcess,
};
use tokio::sync::Mutex;
use uuid::Uuid;

use crate::{measure, scenarios::Bench};

/// What the drop measured.
pub struct DropRun {
    /// Entries in line when the releases began.
    pub entries: usize,
    /// Units released (one offer each).
    pub units: usize,
    /// Concurrent releasing clients.
    pub clients: usize,
    /// Seconds from the first release to the last answer.
    pub secs: f64,
    /// Entries OFFERED afterwards.
    pub offers: i64,
    /// Release-to-offer time: the release's answer time, median and 99th percentile.
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// CPU per offer: the server's and PostgreSQL's backends', in µs.
    pub server_us: f64,
    pub pg_us: f64,
}

impl DropRun {
    /// Offers per second.
    pub fn per_sec(&self) -> f64 {
        self.offers as f64 / self.secs.max(f64::EPSILON)
    }

    /// The report's section.
    pub fn markdown(&self) -> String {
        format!(
            "\n## DROP: a sold-out item, {} waiting, {} units released at full speed\n\n\
             Each release offers its unit to the next in line in its own statement, so a unit's \
             release-to-offer time is the release's answer time. {} clients.\n\n\
             | offers/s | p50 release→offer | p99 release→offer | server CPU/offer | PostgreSQL CPU/offer |\n\
             |---|---|---|---|---|\n\
             | {:.0} | {:.2} ms | {:.2} ms | {:.0} µs | {:.0} µs |\n\n\
             Checked from the database: exactly the first {} entries are OFFERED, in the order they \
             joined; the invariant holds.\n",
            self.entries,
            self.units,
            self.clients,
            self.per_sec(),
            self.p50_ms,
            self.p99_ms,
            self.server_us,
            self.pg_us,
            self.units,
        )
    }
}

/// Runs the drop against `server` (on the bench's database).
pub async fn run(bench: &mut Bench, server: &ServerProcess, clients: usize) -> anyhow::Result<DropRun> {
    let (entries, units) = if bench.settings.smoke { (200, 50) } else { (10_000, 2_000) };
    eprintln!("bench: DROP: {units} units held, {entries} in line, released by {clients} clients");
    let gql = Arc::new(Gql::new(&server.url, clients)?);
    let operator = bench.keys.mint("bench-operator", Role::Operator, chrono::Duration::hours(4))?;
    let sku = format!("DROP-{}", Uuid::new_v4().simple());
    let item = gql.create_inventory(&operator, &sku, "A drop", units as i64).await?;
    let holds = hold_every_unit(bench, &gql, item, units, clients).await?;
    join_the_line(&bench.shop.db, item, entries).await?;

    let times = Arc::new(std::sync::Mutex::new(Vec::new()));
    let start = Instant::now();
    let releases = release_all(gql.clone(), holds, clients, times.clone());
    let (_, usage) = measure::measure(Some(server.pid), &bench.shop.db, bench.clk_tck, start, releases).await?;
    let secs = start.elapsed().as_secs_f64();
    let mut times = std::mem::take(&mut *times.lock().map_err(|_| anyhow::anyhow!("a release task panicked"))?);
    times.sort_unstable();
    let at = |q: f64| times.get(((times.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or_default();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;

    let offers = offered_in_order(&bench.shop.db, item, units).await?;
    bench.invariant.check(&bench.shop.db, "the drop").await?;
    let per_offer = |secs: f64| secs * 1e6 / (offers.max(1) as f64);
    let run = DropRun {
        entries,
        units,
        clients,
        secs,
        offers,
        p50_ms: ms(at(0.5)),
        p99_ms: ms(at(0.99)),
        server_us: per_offer(usage.server.map_or(0.0, |s| s.cpu_secs)),
        pg_us: per_offer(usage.pg_cpu_secs),
    };
    eprintln!(
        "bench:   {:.0} offers/s, release→offer p50 {:.2} ms p99 {:.2} ms, CPU/offer server {:.0} µs PostgreSQL {:.0} µs",
        run.per_sec(),
        run.p50_ms,
        run.p99_ms,
        run.server_us,
        run.pg_us
    );
    Ok(run)
}

/// Releases every hold, `clients` at a time, each client taking the next
/// from one queue; every answer time goes into `times`.
async fn release_all(
    gql: Arc<Gql>,
    holds: Vec<(String, String)>,
    clients: usize,
    times: Arc<std::sync::Mutex<Vec<Duration>>>,
) -> anyhow::Result<measure::Recorder> {
    let queue = Arc::new(Mutex::new(holds));
    let tasks = (0..clients).map(|_| {
        let (gql, queue, times) = (gql.clone(), queue.clone(), times.clone());
        tokio::spawn(async move {
            loop {
                let Some((token, id)) = queue.lock().await.pop() else { return anyhow::Ok(()) };
                let sent = Instant::now();
                match gql.call(&token, RELEASE, json!({ "id": id }), "releaseReservation").await {
                    Outcome::Ok(name, _) if name == "ReservationReleased" => {
                        let took = sent.elapsed();
                        times.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.push(took);
                    }
                    other => bail!("a release answered {other:?}"),
                }
            }
        })
    });
    for task in futures::future::join_all(tasks).await {
        task??;
    }
    Ok(measure::Recorder::default())
}

/// Reserves every unit of `item`, one each by `units` customers, `clients`
/// at a time; their tokens and reservations.
async fn hold_every_unit(
    bench: &Bench,
    gql: &Arc<Gql>,
    item: Uuid,
    units: usize,
    clients: usize,
) -> anyhow::Result<Vec<(String, String)>> {
    let tokens: Vec<String> = (0..units)
        .map(|n| bench.keys.mint(&format!("drop-holder-{n}"), Role::Customer, chrono::Duration::hours(4)))
        .collect::<Result<_, _>>()?;
    let mut holds = Vec::with_capacity(units);
    for chunk in tokens.chunks(clients.max(1)) {
        let calls = chunk.iter().map(|token| {
            let gql = gql.clone();
            async move {
                let input = json!({ "input": { "inventoryId": item, "quantity": 1 } });
                match gql.call(token, RESERVE, input, "reserve").await {
                    Outcome::Ok(name, data) if name == "Reserved" => {
                        let id = data["reservation"]["id"].as_str().context("a reservation id")?;
                        anyhow::Ok((token.clone(), id.to_owned()))
                    }
                    other => bail!("holding the drop answered {other:?}"),
                }
            }
        });
        for held in futures::future::join_all(calls).await {
            holds.push(held?);
        }
    }
    Ok(holds)
}

/// Puts `entries` customers in `item`'s line, one unit each, as
/// `joinWaitlist` would (one statement: the entries in order, and the
/// item's levels flagged so that their freed units reach the line).
async fn join_the_line(db: &sea_orm::DatabaseConnection, item: Uuid, entries: usize) -> anyhow::Result<()> {
    let sql = "WITH joined AS (
                   INSERT INTO waitlist_entries (id, inventory_id, user_id, quantity, status, offer_secs)
                   SELECT gen_random_uuid(), $1, 'drop-waiting-' || n, 1, 'WAITING', 900
                     FROM generate_series(1, $2) AS n ORDER BY n
               )
               UPDATE stock_levels SET waiting = true WHERE inventory_id = $1";
    let count = i64::try_from(entries)?;
    db.execute_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, [item.into(), count.into()])).await?;
    Ok(())
}

/// How many of `item`'s entries are OFFERED, failing unless they are
/// exactly the first `units` to have joined.
async fn offered_in_order(db: &sea_orm::DatabaseConnection, item: Uuid, units: usize) -> anyhow::Result<i64> {
    let sql = "SELECT count(*) FILTER (WHERE status = 'OFFERED') AS offered,
                      count(*) FILTER (WHERE status = 'OFFERED' AND n > $2) AS out_of_order
                 FROM (SELECT status, row_number() OVER (ORDER BY seq) AS n
                         FROM waitlist_entries WHERE inventory_id = $1) e";
    let row = db
        .query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, [item.into(), (units as i64).into()]))
        .await?
        .context("one row")?;
    let (offered, out_of_order): (i64, i64) = (row.try_get("", "offered")?, row.try_get("", "out_of_order")?);
    if offered != units as i64 || out_of_order != 0 {
        bail!("the drop offered {offered} entries ({out_of_order} out of order), not the first {units}");
    }
    Ok(offered)
}
