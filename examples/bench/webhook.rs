//! `--webhook`: the reserve path with events going out, and how late they
//! arrive (issue 27, "Events out"; docs/webhooks.md).
//!
//! The contract promises that one endpoint subscribed to everything costs
//! the reserve path at most 10 %, and that every committed change arrives.
//! A second server of this build gets a database of its own, seeded as the
//! first, and one endpoint for every event type (made through
//! `createWebhook`), pointing at a receiver in this process on loopback
//! (allowed by `STOCKGUARD_WEBHOOK_ALLOW_LOOPBACK`). First SPREAD at 64
//! clients runs on it alone for `--webhook-secs`, while nothing is queued:
//! the receiver records each stock change's arrival minus its `occurredAt`,
//! per 10 s window of `occurredAt` (the last window's changes arriving late
//! shows a dispatcher falling behind), and the outbox backlog is read at
//! each window's end. Then HOT and SPREAD take turns on the main server (no
//! endpoint) and on it, round by round as `baseline.rs` does, so the
//! machine's drift falls on both.
//!
//! The cell is a correctness check too: once the dispatcher has drained,
//! every stock change committed after the endpoint existed (the ledger's
//! `(inventory_id, version_after)` of the transactions that a snapshot taken
//! right after `createWebhook` did not show, which the pump must send, see
//! `src/events/pump.rs`) must have arrived, each inventory's in version
//! order, every body signed with the endpoint's secret; otherwise the
//! benchmark exits 1.

mod receiver;
mod report;

use std::{path::Path, time::Duration};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use futures::TryStreamExt as _;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement, TransactionTrait, sqlx};
use serde_json::json;
use stockguard::auth::Role;
use tokio::time::Instant;
use uuid::Uuid;

use self::receiver::Receiver;
use crate::{
    measure::Stats,
    pairs::{self, Pair, Server},
    scenarios::{Bench, Scenario, Shop},
};
use stockguard_support::{client::Gql, process::ServerProcess};

/// The lag is reported per window of this many seconds of `occurredAt`.
const WINDOW: Duration = Duration::from_secs(10);

/// How long the dispatcher may take to drain after the load stops before
/// the missing changes are counted anyway.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);

const CREATE_WEBHOOK: &str = "mutation($input: CreateWebhookInput!) { createWebhook(input: $input) {
  endpoint { id } secret } }";

/// Arrival minus `occurredAt` of the stock changes committed in a span of
/// the sustained run, in ms. A change that had not arrived when the drain
/// ended counts as later than every one that had: a quantile that falls on
/// one is None (not arrived), so a dispatcher falling behind cannot look
/// fast by what it did deliver.
#[derive(Default)]
pub struct Lags {
    /// Stock changes committed in the span (the ledger's).
    pub committed: usize,
    /// Of them, arrived.
    pub arrived: usize,
    /// Median.
    pub p50_ms: Option<f64>,
    /// 99th percentile.
    pub p99_ms: Option<f64>,
    /// The worst.
    pub max_ms: Option<f64>,
}

impl Lags {
    /// The lags of `arrived` (any order) out of `committed` changes.
    fn of(mut arrived: Vec<f64>, committed: usize) -> Self {
        arrived.sort_unstable_by(f64::total_cmp);
        let n = committed.max(arrived.len());
        let quantile = |p: f64| {
            if n == 0 { None } else { arrived.get(((n - 1) as f64 * p).round() as usize).copied() }
        };
        Self {
            committed,
            arrived: arrived.len(),
            p50_ms: quantile(0.50),
            p99_ms: quantile(0.99),
            max_ms: quantile(1.0),
        }
    }
}

/// One window of the sustained run.
pub struct LagWindow {
    /// Seconds into the run where it starts.
    pub from_secs: u64,
    /// The lags of the changes committed in it.
    pub lags: Lags,
    /// The outbox backlog of the endpoint at the window's end, if read.
    pub backlog: Option<i64>,
}

/// The sustained run at SPREAD and what arrived of everything.
pub struct LagRun {
    /// Concurrent clients.
    pub clients: usize,
    /// The load's reserves.
    pub load: Stats,
    /// Its windows, in order.
    pub windows: Vec<LagWindow>,
    /// Over the whole run.
    pub lags: Lags,
    /// Events the receiver got per second from the start of the run to
    /// the end of the drain: what the dispatcher kept up.
    pub delivered_per_sec: f64,
    /// The backlog at mid-run.
    pub backlog_mid: i64,
    /// The backlog when the load stopped.
    pub backlog_end: i64,
    /// How long after the load stopped everything it committed had arrived
    /// (to a quarter of a second).
    pub drain_secs: f64,
    /// Whether it drained within [`DRAIN_LIMIT`].
    pub drained: bool,
}

/// What arrived over the whole cell, against the ledger.
#[derive(Default)]
pub struct Delivered {
    /// Stock changes committed after the endpoint existed.
    pub committed: u64,
    /// Of them, how many had not arrived when the final drain ended.
    pub missing: u64,
    /// Of those, how many the server had recorded as DELIVERED: lost, not late.
    pub lost: u64,
    /// Whether the final drain came to pass (else the missing may be late).
    pub drained: bool,
    /// Events received (every arrival).
    pub events: u64,
    /// The bodies they came in.
    pub bodies: u64,
    /// STOCK_CHANGED events that arrived again.
    pub repeats: u64,
    /// STOCK_CHANGED first arrivals with a version not above its inventory's last.
    pub out_of_order: u64,
    /// Bodies whose `stockguard-signature` is not the endpoint's, or that did not parse.
    pub bad: u64,
}

impl Delivered {
    /// Whether the promise held: nothing missing, in order, every body signed.
    pub fn held(&self) -> bool {
        self.missing == 0 && self.out_of_order == 0 && self.bad == 0
    }
}

/// The `--webhook` run.
pub struct Webhook {
    /// HOT and SPREAD without the endpoint (the main server) and with it.
    pub cells: Vec<Pair>,
    /// The sustained run.
    pub lag: LagRun,
    /// The correctness check.
    pub delivered: Delivered,
}

/// Starts the server with the endpoint on a database of its own, runs the
/// cells and the sustained run, and checks what arrived.
pub async fn compare(
    bench: &mut Bench,
    server: &ServerProcess,
    server_bin: &Path,
    database_url_base: &str,
    secret: &str,
) -> anyhow::Result<Webhook> {
    eprintln!("bench: webhook: a second server with one endpoint, on a database of its own");
    let receiver = Receiver::start().await?;
    let env = [("STOCKGUARD_ORDER_LOCKING", "optimistic"), ("STOCKGUARD_WEBHOOK_ALLOW_LOOPBACK", "true")];
    let result = pairs::beside(database_url_base, server_bin, secret, &env, async |with, url| {
        measure_with(bench, server, with, url, &receiver).await
    })
    .await;
    drop(receiver);
    result
}

async fn measure_with(
    bench: &mut Bench,
    server: &ServerProcess,
    with: &ServerProcess,
    database_url: &str,
    receiver: &Receiver,
) -> anyhow::Result<Webhook> {
    eprintln!("bench: webhook: seeding HOT and SPREAD");
    let shop = Shop::open(database_url, with, &bench.keys).await?;
    // After seeding: its 10,000 creations are not what is measured.
    let (endpoint, since) = subscribe(bench, with, &shop.db, receiver).await?;
    let result = async {
        // First, while nothing is queued: the cells' events would otherwise
        // be ahead of its own (an endpoint's deliveries go one at a time, in order).
        let lag = sustained(bench, with, &shop, endpoint, receiver).await?;
        bench.invariant.check(&shop.db, "the sustained run with a webhook endpoint").await?;
        let servers = [
            Server { label: "no endpoint", process: server, shop: None, checked: true },
            Server { label: "one endpoint", process: with, shop: Some(&shop), checked: true },
        ];
        let cells = bench.pairs(servers, "without and with a webhook endpoint").await?;
        let (end, drained) = drain(&shop.db, endpoint, Instant::now()).await?;
        let delivered = delivered(&shop.db, endpoint, &since, &end, drained, receiver).await?;
        anyhow::Ok(Webhook { cells, lag, delivered })
    }
    .await;
    shop.db.close().await?;
    result
}

/// Creates the endpoint for every event type through `createWebhook`; its
/// id, and a snapshot taken after it was committed: the transactions that
/// snapshot does not show are sent to it.
async fn subscribe(
    bench: &Bench,
    with: &ServerProcess,
    db: &DatabaseConnection,
    receiver: &Receiver,
) -> anyhow::Result<(Uuid, String)> {
    let operator = bench.keys.mint("bench-operator", Role::Operator, chrono::Duration::hours(4))?;
    let input = json!({ "url": receiver.url, "events": ["STOCK_CHANGED", "RESERVATION_CHANGED", "ORDER_CHANGED"] });
    let answer = Gql::new(&with.url, 1)?.data(&operator, CREATE_WEBHOOK, json!({ "input": input })).await;
    let answer = answer.map_err(|err| anyhow::anyhow!("createWebhook: {err}"))?;
    let created = &answer["data"]["createWebhook"];
    let secret = created["secret"].as_str().with_context(|| format!("createWebhook answered {answer}"))?;
    let id = created["endpoint"]["id"].as_str().and_then(|id| id.parse().ok()).context("the endpoint's id")?;
    receiver.set_secret(secret);
    Ok((id, snapshot(db).await?))
}

/// The events the pump has numbered that the endpoint's deliveries have not
/// taken yet.
async fn backlog(db: &DatabaseConnection, endpoint: Uuid) -> anyhow::Result<i64> {
    let sql = "SELECT (SELECT last_seq FROM event_pump) - sent_through FROM webhook_endpoints WHERE id = $1";
    let row = db.query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, [endpoint.into()])).await?;
    Ok(row.context("the endpoint is gone")?.try_get_by_index(0)?)
}

/// Whether everything committed by `end` (a snapshot) reached the
/// receiver: the pump's snapshot shows every ledger row that `end` shows,
/// the endpoint's deliveries took every event numbered, and none is still
/// pending (a delivery is DELIVERED only after the receiver answered). One
/// statement, so all of it is read at one instant. JIT off: the planner's
/// guesses for the pump's one row would have it compile for a second per look.
async fn drained(db: &DatabaseConnection, endpoint: Uuid, end: &str) -> anyhow::Result<bool> {
    let sql = "SELECT p.last_seq = w.sent_through
                  AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.endpoint_id = w.id AND d.status = 'PENDING')
                  AND NOT EXISTS (SELECT 1 FROM stock_movements m
                                   WHERE m.txid >= pg_snapshot_xmin(p.seen)::text::bigint
                                     AND NOT pg_visible_in_snapshot(m.txid::text::xid8, p.seen)
                                     AND pg_visible_in_snapshot(m.txid::text::xid8, $2::pg_snapshot))
                 FROM webhook_endpoints w, event_pump p WHERE w.id = $1";
    let txn = db.begin().await?;
    txn.execute_unprepared("SET LOCAL jit = off").await?;
    let values: [sea_orm::Value; 2] = [endpoint.into(), end.into()];
    let row = txn.query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, values)).await?;
    txn.commit().await?;
    Ok(row.context("the endpoint is gone")?.try_get_by_index(0)?)
}

/// Waits (up to [`DRAIN_LIMIT`] after `stopped`) until everything
/// committed before now has arrived; the snapshot it waited for, and
/// whether it came to pass. Called when every reserve has been answered,
/// so the snapshot shows each change they made.
async fn drain(db: &DatabaseConnection, endpoint: Uuid, stopped: Instant) -> anyhow::Result<(String, bool)> {
    let end = snapshot(db).await?;
    let mut drained = false;
    while !drained && stopped.elapsed() < DRAIN_LIMIT {
        tokio::time::sleep(Duration::from_millis(250)).await;
        drained = self::drained(db, endpoint, &end).await?;
    }
    if !drained {
        eprintln!("bench: webhook: the dispatcher had not drained {} s after the load stopped", DRAIN_LIMIT.as_secs());
    }
    Ok((end, drained))
}

/// The current snapshot, as text.
async fn snapshot(db: &DatabaseConnection) -> anyhow::Result<String> {
    let sql = "SELECT pg_current_snapshot()::text";
    let row = db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await?;
    Ok(row.context("no snapshot")?.try_get_by_index::<String>(0)?)
}

/// SPREAD at 64 clients (the smoke's count in the smoke) on the server with
/// the endpoint for `--webhook-secs`, the backlog read at every window's end
/// and at mid-run; then waits for the dispatcher to drain.
async fn sustained(
    bench: &Bench,
    with: &ServerProcess,
    shop: &Shop,
    endpoint: Uuid,
    receiver: &Receiver,
) -> anyhow::Result<LagRun> {
    let settings = &bench.settings;
    let secs = settings.webhook.context("--webhook-secs")?;
    let clients = if settings.smoke { settings.clients.last().copied().unwrap_or(1) } else { 64 };
    eprintln!("bench: webhook: SPREAD x{clients} for {} s, the events' lag", secs.as_secs());
    shop.db.execute_unprepared("VACUUM (ANALYZE) inventories").await?;
    // The measured window starts after the warm-up, as the load's does.
    let from = Instant::now() + settings.warmup;
    let from_utc = Utc::now() + chrono::TimeDelta::from_std(settings.warmup)?;
    let (started, events_before) = {
        let mut arrivals = receiver.inner();
        arrivals.lags_from = Some(from_utc);
        (Instant::now(), arrivals.events)
    };
    let marks: Vec<Duration> = {
        let mut marks: Vec<Duration> = (1..).map(|n| WINDOW * n).take_while(|&m| m < secs).collect();
        marks.extend([secs / 2, secs]);
        marks.sort_unstable();
        marks.dedup();
        marks
    };
    let sampling = async {
        let mut read = Vec::with_capacity(marks.len());
        for &mark in &marks {
            tokio::time::sleep_until(from + mark).await;
            read.push((mark, backlog(&shop.db, endpoint).await?));
        }
        anyhow::Ok(read)
    };
    let (load, read) = tokio::join!(bench.stockguard(with, shop, Scenario::Spread, clients, secs), sampling);
    let (recorder, usage) = load?;
    let read = read?;
    let load_stopped = Instant::now();
    let mut load = Stats::from(recorder, secs.as_secs_f64(), &["Reserved"]);
    load.usage = usage;

    let (_, drained) = drain(&shop.db, endpoint, load_stopped).await?;
    let drain_secs = load_stopped.elapsed().as_secs_f64();
    let delivered_per_sec = (receiver.inner().events - events_before) as f64 / started.elapsed().as_secs_f64();

    let backlog_at = |mark: Duration| read.iter().find(|(m, _)| *m == mark).map(|(_, b)| *b);
    let windows = secs.as_secs().div_ceil(WINDOW.as_secs());
    let committed = committed_per_window(&shop.db, from_utc, secs, windows).await?;
    let mut lags = std::mem::take(&mut receiver.inner().lags);
    lags.retain(|(at, _)| *at < secs);
    let windows = (0..windows)
        .map(|n| {
            let (start, end) = (WINDOW * n as u32, (WINDOW * (n as u32 + 1)).min(secs));
            let in_window = lags.iter().filter(|(at, _)| *at >= start && *at < end).map(|(_, lag)| *lag).collect();
            let lags = Lags::of(in_window, committed[n as usize]);
            LagWindow { from_secs: start.as_secs(), lags, backlog: backlog_at(end) }
        })
        .collect();
    Ok(LagRun {
        clients,
        load,
        windows,
        lags: Lags::of(lags.into_iter().map(|(_, lag)| lag).collect(), committed.iter().sum()),
        delivered_per_sec,
        backlog_mid: backlog_at(secs / 2).unwrap_or(0),
        backlog_end: backlog_at(secs).unwrap_or(0),
        drain_secs,
        drained,
    })
}

/// The stock changes (distinct inventory and version) committed in each of
/// `windows` windows of [`WINDOW`] from `from` (their `created_at` is the
/// events' `occurredAt`), the last cut at `secs`.
async fn committed_per_window(
    db: &DatabaseConnection,
    from: DateTime<Utc>,
    secs: Duration,
    windows: u64,
) -> anyhow::Result<Vec<usize>> {
    let sql = "SELECT floor(extract(epoch FROM created_at - $1) / $2)::bigint,
                      count(DISTINCT (inventory_id, version_after))
                 FROM stock_movements
                WHERE created_at >= $1 AND created_at < $1 + make_interval(secs => $3)
                GROUP BY 1";
    let rows = sqlx::query_as::<_, (i64, i64)>(sql)
        .bind(from)
        .bind(WINDOW.as_secs_f64())
        .bind(secs.as_secs_f64())
        .fetch_all(db.get_postgres_connection_pool())
        .await
        .context("the stock changes per window")?;
    let mut committed = vec![0; windows as usize];
    for (window, count) in rows {
        if let Some(slot) = usize::try_from(window).ok().and_then(|w| committed.get_mut(w)) {
            *slot = usize::try_from(count).unwrap_or(0);
        }
    }
    Ok(committed)
}

/// Counts the stock changes committed after the endpoint existed (not shown
/// by `since`) and before the final drain's snapshot `end` (a reservation
/// may expire since) that never arrived, and of those the ones in a
/// delivery the server recorded as DELIVERED. The committed ones are
/// streamed: a full run commits millions.
async fn delivered(
    db: &DatabaseConnection,
    endpoint: Uuid,
    since: &str,
    end: &str,
    drained: bool,
    receiver: &Receiver,
) -> anyhow::Result<Delivered> {
    let committed = "SELECT DISTINCT inventory_id, version_after::bigint FROM stock_movements
                      WHERE txid >= pg_snapshot_xmin($1::pg_snapshot)::text::bigint
                        AND NOT pg_visible_in_snapshot(txid::text::xid8, $1::pg_snapshot)
                        AND pg_visible_in_snapshot(txid::text::xid8, $2::pg_snapshot)";
    let sent = "SELECT DISTINCT (u.e->>'inventoryId')::uuid, (u.e->>'version')::bigint
                  FROM webhook_deliveries d
                  JOIN LATERAL (SELECT * FROM outbox WHERE seq >= d.seqs[1] ORDER BY seq LIMIT 1) o
                    ON o.first_seq <= d.seqs[1]
                 CROSS JOIN LATERAL json_array_elements(('[' || o.body || ']')::json) WITH ORDINALITY AS u(e, i)
                 WHERE d.endpoint_id = $1 AND d.status = 'DELIVERED' AND o.first_seq + u.i - 1 = ANY(d.seqs)
                   AND u.e->>'type' = 'STOCK_CHANGED'";
    let pool = db.get_postgres_connection_pool();
    // The changes recorded as DELIVERED are read before what arrived is
    // taken: the receiver records a body before it answers, the server marks
    // it after, so each of them is in what is taken after (the dispatcher
    // goes on sending while this runs when the drain did not end).
    let sent: Vec<(Uuid, i64)> =
        sqlx::query_as(sent).bind(endpoint).fetch_all(pool).await.context("the changes sent")?;
    let arrivals = std::mem::take(&mut *receiver.inner());
    let mut delivered = Delivered {
        events: arrivals.events,
        bodies: arrivals.bodies,
        repeats: arrivals.repeats,
        out_of_order: arrivals.out_of_order,
        bad: arrivals.bad,
        lost: sent.iter().filter(|change| !arrivals.stock.contains(change)).count() as u64,
        drained,
        ..Delivered::default()
    };
    let mut rows = sqlx::query_as::<_, (Uuid, i64)>(committed).bind(since).bind(end).fetch(pool);
    while let Some(change) = rows.try_next().await.context("the committed stock changes")? {
        delivered.committed += 1;
        delivered.missing += u64::from(!arrivals.stock.contains(&change));
    }
    eprintln!(
        "bench: webhook: {} stock changes committed after the endpoint existed, {} missing ({} recorded as \
         delivered); {} events in {} bodies, {} repeats, {} out of order, {} bad bodies",
        delivered.committed,
        delivered.missing,
        delivered.lost,
        delivered.events,
        delivered.bodies,
        delivered.repeats,
        delivered.out_of_order,
        delivered.bad
    );
    Ok(delivered)
}
