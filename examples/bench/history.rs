//! `--history N`: the tables as a shop that has run for a month has them.
//!
//! Before the history cells, N past reservations (released or expired,
//! 100,000 users, spread over the last 30 days and over the SPREAD
//! inventories) and N ledger rows (a RESERVED and a RELEASED or EXPIRED row
//! per pair) are written with `generate_series`, a million rows per
//! statement. Each ledger row is a version of its own below every real one
//! (negative: the rows came before), and each inventory's version grows by
//! its history rows in one relative UPDATE at the end, so the invariant
//! holds again however the server changed the rows meanwhile (the sweeper).
//! Their keys are time-ordered, as the server's are. The ledger rows go to
//! the day partitions of their days, made first as the days would have.
//! The indexes whose keys do not follow time (a user's reservations, each
//! day's guard of the ledger's version per inventory) are dropped first and
//! built again after, by one sort each: the state is the same as if the rows
//! had come one by one, minus the hours.
//!
//! The history goes into a second database, seeded as the first and
//! served by a second server. SPREAD is then measured in both, round by
//! round (Stockguard without, with; raw SQL without, with), so the
//! comparison is made in the same minutes: cells taken minutes apart
//! differed by as much as the machine drifted (the raw-SQL limit alone
//! moved by 0.6–0.9× between the main cells and a later history cell).
//!
//! The probes time what must not grow with history: the sweeper's claim
//! (nothing due) and the first page of a user's `myReservations`, in both
//! databases after the cells.

use std::{path::Path, time::Instant};

use anyhow::Context as _;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use stockguard::{
    pagination::Page,
    reservations::{store, sweeper},
    stock,
};
use uuid::Uuid;

use crate::{
    pairs,
    report::{History, HistoryCell, Sides},
    scenarios::{Bench, By, Raw, Scenario, Shop, Side},
};
use stockguard_support::process::ServerProcess;

/// The history run: a second database and server, `bench.settings.history`
/// rows of history there, then SPREAD at 16 and 64 clients in both
/// databases, round by round.
pub async fn compare(
    bench: &mut Bench,
    server: &ServerProcess,
    server_bin: &Path,
    database_url_base: &str,
    secret: &str,
) -> anyhow::Result<History> {
    eprintln!("bench: history: a second database and server");
    let locking = [("STOCKGUARD_ORDER_LOCKING", "optimistic")];
    pairs::beside(database_url_base, server_bin, secret, &locking, async |second, url| {
        measure_with(bench, server, second, url).await
    })
    .await
}

/// Seeds and fills the second database, then measures both.
async fn measure_with(
    bench: &mut Bench,
    server: &ServerProcess,
    second: &ServerProcess,
    database_url: &str,
) -> anyhow::Result<History> {
    let rows = bench.settings.history;
    let shop = Shop::open(database_url, second, &bench.keys).await?;
    bench.invariant.check(&shop.db, "seeding the second database").await?;
    eprintln!("bench: history: filling {rows} past reservations and ledger rows");
    let fill_secs = fill(&shop.db, &shop.spread, rows).await?;
    bench.invariant.check(&shop.db, "the history fill").await?;
    let mut cells = Vec::new();
    for clients in bench.settings.clients.iter().copied().filter(|c| [16, 64].contains(c)).collect::<Vec<_>>() {
        eprintln!("bench: SPREAD x{clients} without and with history: Stockguard and raw SQL");
        let sides = [
            Side { label: "Stockguard without", shop: &bench.shop, by: By::Http(server) },
            Side { label: "with", shop: &shop, by: By::Http(second) },
            Side { label: "raw SQL without", shop: &bench.shop, by: By::Sql(Raw::Limit) },
            Side { label: "with", shop: &shop, by: By::Sql(Raw::Limit) },
        ];
        let [stockguard, stockguard_with, raw, raw_with] = bench.rounds(&sides, Scenario::Spread, clients).await?;
        let after = format!("SPREAD x{clients} without and with history");
        bench.invariant.check(&bench.shop.db, &after).await?;
        bench.invariant.check(&shop.db, &after).await?;
        cells.push(HistoryCell {
            clients,
            without: Sides { stockguard, raw },
            with: Sides { stockguard: stockguard_with, raw: raw_with },
        });
    }
    let without = probe(&bench.shop.db, 200).await?;
    let with = probe(&shop.db, 200).await?;
    shop.db.close().await?;
    Ok(History { rows, fill_secs, without, with, cells })
}

/// Rows one fill statement writes.
const CHUNK: u64 = 1_000_000;

/// The key of history row `g` of a table (`prefix`, one hex digit): in the
/// order the rows were made, as the server's time-ordered keys are, and
/// below every key the server makes (a v7 key starts with today's time).
fn key(prefix: char) -> String {
    format!("('0{prefix}' || lpad(to_hex(g.g), 30, '0'))::uuid")
}

/// Fills `n` past reservations and `n` ledger rows over `inventories`.
pub async fn fill(db: &DatabaseConnection, inventories: &[Uuid], n: u64) -> anyhow::Result<f64> {
    let started = Instant::now();
    let m = inventories.len() as u64;
    let n = n / 2 * 2;
    db.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "CREATE UNLOGGED TABLE bench_history_inventories AS \
         SELECT (k - 1)::bigint AS k, id FROM unnest($1::uuid[]) WITH ORDINALITY AS a(id, k) ORDER BY k",
        [sea_orm::Value::from(inventories.to_vec())],
    ))
    .await?;
    // The ledger's partitions of the month, as its days would have made them.
    stock::partitions::make(db, 31, 0).await.context("history: the ledger's day partitions")?;
    db.execute_unprepared("DROP INDEX reservations_user_created;").await.context("history: drop the user index")?;
    each_day_guard(db, "DROP CONSTRAINT %2$I").await.context("history: drop the ledger's guards")?;
    let mut start = 0;
    while start < n {
        let end = (start + CHUNK).min(n);
        // Row g of n: made 30 days ago for g = 0, an hour ago for the last;
        // pair p = g / 2 on inventory p mod m, its (p / m)-th pair there.
        let sql = format!(
            r#"
WITH ids AS (
    SELECT array_agg(id ORDER BY k) AS ids FROM bench_history_inventories
), g AS MATERIALIZED (
    SELECT g, ids[(g / 2) % {m} + 1] AS inventory_id,
           now() - interval '1 hour' - (1 - g::float8 / {n}) * interval '30 days' AS ts
      FROM generate_series({start}, {end} - 1) AS g, ids
), r AS (
    INSERT INTO reservations (id, inventory_id, user_id, quantity, status, created_at, expires_at)
    SELECT {reservation_key}, inventory_id, 'hist-' || (g.g::bigint * 7919 % 100000), 1,
           CASE WHEN g % 7 = 0 THEN 'EXPIRED' ELSE 'RELEASED' END, ts, ts + interval '15 minutes'
      FROM g
)
INSERT INTO stock_movements (id, inventory_id, delta, reason, stock_after, version_after, created_at)
SELECT {ledger_key}, inventory_id, CASE WHEN g % 2 = 0 THEN -1 ELSE 1 END,
       CASE WHEN g % 2 = 0 THEN 'RESERVED' WHEN (g / 2) % 7 = 0 THEN 'EXPIRED' ELSE 'RELEASED' END,
       1000000000 - 1 + g % 2, (-2 - 2 * ((g / 2) / {m}) - g % 2)::integer, ts
  FROM g"#,
            reservation_key = key('1'),
            ledger_key = key('2'),
        );
        db.execute_unprepared(&sql).await.context("history: fill")?;
        eprintln!("bench:   history: {end} of {n} rows ({:.0} s)", started.elapsed().as_secs_f64());
        start = end;
    }
    // Inventory k got the pairs k, k + m, ... below `pairs`: two changes each.
    let pairs = n / 2;
    let sql = format!(
        "UPDATE inventories i SET version = version + 2 * (({pairs} - 1 - h.k) / {m} + 1) \
           FROM bench_history_inventories h WHERE i.id = h.id AND h.k < {pairs}; \
         DROP TABLE bench_history_inventories;"
    );
    db.execute_unprepared(&sql).await.context("history: versions")?;
    db.execute_unprepared(
        "SET maintenance_work_mem = '256MB'; \
         CREATE INDEX reservations_user_created ON reservations (user_id, created_at, id);",
    )
    .await
    .context("history: the user index")?;
    each_day_guard(db, "ADD CONSTRAINT %2$I UNIQUE NULLS NOT DISTINCT (inventory_id, version_after, location_id)")
        .await
        .context("history: the ledger's guards")?;
    for sql in ["VACUUM (ANALYZE) reservations", "VACUUM (ANALYZE) stock_movements", "CHECKPOINT"] {
        db.execute_unprepared(sql).await.with_context(|| format!("history: {sql}"))?;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Runs `ALTER TABLE <partition> <action>` on each day partition of the
/// ledger, `%2$I` in `action` naming the partition's guard constraint (its
/// unique key of inventory, version and location, found by its kind, since
/// PostgreSQL shortens a long generated name).
async fn each_day_guard(db: &DatabaseConnection, action: &str) -> Result<(), sea_orm::DbErr> {
    let sql = format!(
        r#"
DO $$
DECLARE part text; guard text;
BEGIN
    FOR part IN SELECT d.part::text FROM ledger_days() d LOOP
        SELECT c.conname INTO guard FROM pg_constraint c
         WHERE c.conrelid = part::regclass AND c.contype = 'u';
        EXECUTE format('ALTER TABLE %1$I {action}', part, coalesce(guard, part || '_guard'));
    END LOOP;
END
$$"#
    );
    db.execute_unprepared(&sql).await.map(drop)
}

/// What must not grow with history, in µs per call (median of `runs`).
#[derive(Clone, Copy, Default)]
pub struct Probes {
    /// One sweep with nothing due.
    pub sweep_us: f64,
    /// The first page (20) of a user's reservations (a user with many).
    pub my_reservations_us: f64,
}

/// Times the probes, `runs` calls each.
pub async fn probe(db: &DatabaseConnection, runs: usize) -> anyhow::Result<Probes> {
    let mut sweep = Vec::with_capacity(runs);
    let mut mine = Vec::with_capacity(runs);
    for i in 0..runs {
        let started = Instant::now();
        sweeper::sweep_once(db, 500).await?;
        sweep.push(started.elapsed().as_secs_f64() * 1e6);
        // A user of the benchmark's own cells: thousands of reservations,
        // so the page is full before and after (a user of the history would
        // go from none to some, which is more rows, not more cost per row).
        let user = format!("bench-{}", i % 16);
        let started = Instant::now();
        store::page_for_user(db, &user, Page { first: 20, after: None }).await?;
        mine.push(started.elapsed().as_secs_f64() * 1e6);
    }
    Ok(Probes { sweep_us: median(&mut sweep), my_reservations_us: median(&mut mine) })
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}
