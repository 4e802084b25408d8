//! Delivery: each active endpoint's outbox rows, in order, in bodies of up
//! to 100 events (an outbox row's), signed, at least once.
//!
//! Every process leases the endpoints nobody holds (`leased_until` in the
//! past) and runs one task per endpoint it holds, so an endpoint is served
//! by one process at a time (no double send in normal operation), a slow or
//! dead endpoint holds up only its own task, and the endpoints of a process
//! that died are taken over when its leases run out. A task works through
//! its endpoint's deliveries in order, oldest first: the next bodies are
//! cut from the outbox (the events after the endpoint's cursor that it
//! subscribes to, a body per outbox row) and recorded as PENDING
//! deliveries, with the cursor moved, in one statement, before they are
//! sent; each is sent only after the one before it was answered 2xx, and is
//! retried until a 2xx answers or the schedule is spent (FAILED, which
//! turns the endpoint off until `redeliverFailed` sends it again). So an
//! endpoint sees each inventory's and each order's events in version order,
//! within and across bodies, and a process killed mid-send leaves PENDING
//! deliveries that whoever leases the endpoint next sends again. A task
//! holds at most `BATCH` bodies, whatever the backlog.

use std::{collections::HashMap, sync::LazyLock, time::Duration};

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use rand::RngExt as _;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, Value};
use sha2::Sha256;
use tokio::{
    sync::watch,
    task::{self, JoinHandle, JoinSet},
    time::Instant,
};
use uuid::Uuid;

use super::{DeliveryStatus, egress};
use crate::stock::rows::sql;

/// How a process delivers.
#[derive(Debug, Clone)]
pub struct Delivering {
    /// How long a process holds an endpoint without renewing its lease.
    pub lease: Duration,
    /// How long one attempt may take, connection included.
    pub timeout: Duration,
    /// The waits between attempts; after the last one fails the delivery is FAILED.
    pub schedule: Vec<Duration>,
    /// Whether `http` to a loopback address is allowed (development, tests).
    pub allow_loopback: bool,
    /// How often an idle endpoint looks for new events, and the process for endpoints to lease.
    pub poll: Duration,
}

/// Most bytes of a receiver's answer kept in `last_error`.
const MAX_ERROR_CHARS: usize = 300;

/// Leases the endpoints nobody holds (or this process holds) and starts a
/// task for each one not already served here, every `poll`, until `stop`;
/// then waits (briefly) for the tasks to record what they sent, and gives
/// the leases back. Leasing goes through `requests` (the requests' pool,
/// open anyway); the endpoints' tasks work on `db`.
pub fn spawn(
    requests: DatabaseConnection,
    db: DatabaseConnection,
    delivering: Delivering,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let me = Uuid::new_v4();
        let mut serving = Serving::default();
        let mut stop_outer = stop.clone();
        // New endpoints are looked for about as often as an idle pump looks,
        // and this process's leases renewed at least three times a lease:
        // a task renews its lease only between attempts, and an attempt may
        // outlast a short lease, which would let another process send the
        // same delivery at the same time.
        let every = delivering.poll.max(super::pump::IDLE).min(delivering.lease / 3);
        let mut ticks = tokio::time::interval(every.max(Duration::from_millis(10)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = stop_outer.changed() => break,
            }
            serving.reap();
            let leased = match lease(&requests, me, delivering.lease).await {
                Ok(leased) => leased,
                Err(err) => {
                    tracing::warn!(error = %err, "leasing webhook endpoints failed; trying again");
                    continue;
                }
            };
            for endpoint in leased {
                if !serving.serves(endpoint) {
                    let (db, delivering, stop) = (db.clone(), delivering.clone(), stop.clone());
                    serving.start(endpoint, async move { serve(&db, me, endpoint, &delivering, stop).await });
                }
            }
        }
        // Each task records what it sent before it ends; one still waiting
        // for a receiver is cut off, and its delivery sent again by whoever
        // leases the endpoint next (at least once). Leases lapse on their
        // own; giving them back lets another process take over at once.
        // Bounded: a stopping process does not wait for a receiver or a
        // database that does not answer.
        let ended = async { while serving.tasks.join_next().await.is_some() {} };
        let _ = tokio::time::timeout(Duration::from_secs(1), ended).await;
        serving.tasks.abort_all();
        let release = "UPDATE webhook_endpoints SET leased_until = '-infinity' WHERE leased_by = $1";
        let release = requests.execute_raw(Statement::from_sql_and_values(DbBackend::Postgres, release, [me.into()]));
        let _ = tokio::time::timeout(Duration::from_secs(1), release).await;
    })
}

/// The endpoints served here, each by its task, which ends when the lease
/// is lost.
#[derive(Default)]
struct Serving {
    tasks: JoinSet<()>,
    endpoints: HashMap<task::Id, Uuid>,
}

impl Serving {
    fn serves(&self, endpoint: Uuid) -> bool {
        self.endpoints.values().any(|&served| served == endpoint)
    }

    fn start(&mut self, endpoint: Uuid, serve: impl Future<Output = ()> + Send + 'static) {
        let started = self.tasks.spawn(serve);
        self.endpoints.insert(started.id(), endpoint);
    }

    /// Forgets the endpoints whose task has ended, so that the next lease
    /// starts each one again: one whose lease was lost, and one whose task
    /// panicked. A panicked task's endpoint, kept, would have its lease
    /// renewed by this process for ever and be served by none.
    fn reap(&mut self) {
        while let Some(ended) = self.tasks.try_join_next_with_id() {
            let id = match ended {
                Ok((id, ())) => id,
                Err(err) => {
                    tracing::error!(error = %err, "a webhook endpoint's task ended abnormally; it starts again");
                    err.id()
                }
            };
            self.endpoints.remove(&id);
        }
    }
}

/// Leases (or renews) every active endpoint that is free or already this
/// process's; their ids.
async fn lease(db: &DatabaseConnection, me: Uuid, lease: Duration) -> Result<Vec<Uuid>, DbErr> {
    let sql = "UPDATE webhook_endpoints SET leased_by = $1, leased_until = now() + make_interval(secs => $2)
                WHERE id IN (SELECT id FROM webhook_endpoints
                              WHERE active AND (leased_by = $1 OR leased_until < now())
                                FOR UPDATE SKIP LOCKED)
            RETURNING id";
    let values: [Value; 2] = [me.into(), lease.as_secs_f64().into()];
    let rows = db.query_all_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, values)).await?;
    rows.iter().map(|row| row.try_get("", "id")).collect()
}

/// What a task needs of its endpoint, read again before every attempt (an
/// operator may change the URL, or deactivate it).
struct Endpoint {
    url: String,
    secret: String,
}

/// A delivery to attempt.
struct Delivery {
    id: Uuid,
    attempts: i32,
    next_attempt_at: DateTime<Utc>,
    /// Its body, exactly as it is signed and sent; none while it is not due.
    body: Option<String>,
}

/// Serves one endpoint while this process holds its lease.
async fn serve(
    db: &DatabaseConnection,
    me: Uuid,
    endpoint_id: Uuid,
    delivering: &Delivering,
    mut stop: watch::Receiver<bool>,
) {
    let mut task = Task { db, me, endpoint_id, delivering, client: Client::default(), delivered: Vec::new() };
    loop {
        if *stop.borrow() {
            break;
        }
        let pause = match task.step().await {
            Ok(Step::Held(pause)) => pause,
            Ok(Step::Lost) => break,
            Err(err) => {
                tracing::warn!(error = %err, endpoint = %endpoint_id, "a webhook delivery step failed; trying again");
                delivering.poll
            }
        };
        if !pause.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.changed() => break,
            }
        }
    }
    task.flush().await;
}

/// What one step came to.
enum Step {
    /// Still this process's endpoint; wait this long before the next step.
    Held(Duration),
    /// The lease is gone (expired and taken, or the endpoint deactivated or deleted).
    Lost,
}

/// A delivery that was sent and answered 2xx, not yet recorded: the next
/// step's statement records it (one round trip a step instead of two).
struct Delivered {
    id: Uuid,
    /// Attempts made before this one.
    attempts: i32,
    status: u16,
}

impl Delivered {
    /// The values [`recording_delivered`] reads `delivered` from: their
    /// ids, the attempt each was answered at, and the statuses.
    fn values(delivered: &[Self]) -> [Value; 3] {
        [
            delivered.iter().map(|d| d.id).collect::<Vec<Uuid>>().into(),
            delivered.iter().map(|d| d.attempts + 1).collect::<Vec<i32>>().into(),
            delivered.iter().map(|d| i32::from(d.status)).collect::<Vec<i32>>().into(),
        ]
    }
}

/// Most deliveries one step takes and sends.
const BATCH: i64 = 10;

/// One endpoint's task.
struct Task<'a> {
    db: &'a DatabaseConnection,
    me: Uuid,
    endpoint_id: Uuid,
    delivering: &'a Delivering,
    client: Client,
    delivered: Vec<Delivered>,
}

impl Task<'_> {
    /// Records the deliveries sent, renews the lease and takes the
    /// endpoint's current deliveries (cutting the next ones from the outbox
    /// when none is pending) in one statement, then attempts them in order
    /// while they are due and answered 2xx: one that fails is recorded, and
    /// the ones after it wait for it (the endpoint's order).
    async fn step(&mut self) -> Result<Step, DbErr> {
        let delivering = self.delivering;
        let taken = next(self.db, self.me, self.endpoint_id, delivering.lease, &self.delivered).await?;
        self.delivered.clear();
        let Some((endpoint, deliveries)) = taken else { return Ok(Step::Lost) };
        if deliveries.is_empty() {
            return Ok(Step::Held(delivering.poll));
        }
        let started = Instant::now();
        for delivery in deliveries {
            let Some(body) = &delivery.body else {
                if !self.delivered.is_empty() {
                    break;
                }
                let wait = (delivery.next_attempt_at - Utc::now()).to_std().unwrap_or_default();
                return Ok(Step::Held(wait.min(delivering.poll.max(Duration::from_secs(1)))));
            };
            // The lease is renewed only by the statement: the rest of the
            // batch waits for the next one rather than outlast it.
            if !self.delivered.is_empty() && started.elapsed() > delivering.lease / 4 {
                break;
            }
            let outcome = send(&mut self.client, &endpoint, delivery.id, body, delivering).await;
            match (&outcome.error, outcome.status) {
                (None, Some(status)) => {
                    self.delivered.push(Delivered { id: delivery.id, attempts: delivery.attempts, status });
                }
                _ => {
                    record_failure(self.db, delivery.id, delivery.attempts, &outcome, delivering).await?;
                    break;
                }
            }
        }
        Ok(Step::Held(Duration::ZERO))
    }

    /// Records the deliveries sent, if the task stops before its next step.
    async fn flush(&mut self) {
        let delivered = std::mem::take(&mut self.delivered);
        if delivered.is_empty() {
            return;
        }
        let sql = recording_delivered("unnest($1::uuid[], $2::integer[], $3::integer[]) AS d(id, attempts, status)");
        let values = Delivered::values(&delivered);
        if let Err(err) = self.db.execute_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, values)).await {
            tracing::warn!(error = %err, deliveries = delivered.len(), "delivered webhooks could not be recorded; they will be sent again");
        }
    }
}

/// Records as DELIVERED the deliveries that `sent` (a `FROM` item `d` of
/// `id`, `attempts` and `status`) says were answered 2xx at that attempt,
/// if still PENDING: in a task's step ([`STEP_SQL`]), and on its own when
/// a task stops ([`Task::flush`]).
fn recording_delivered(sent: &str) -> String {
    format!(
        "UPDATE webhook_deliveries w
            SET status = {delivered}, attempts = d.attempts, last_attempt_at = now(), last_response_status = d.status,
                last_error = NULL, next_attempt_at = now(), delivered_at = now()
           FROM {sent}
          WHERE w.id = d.id AND w.status = {pending}",
        delivered = sql(DeliveryStatus::Delivered),
        pending = sql(DeliveryStatus::Pending),
    )
}

/// The statement of a task's step, `next` (public so that a test can plan
/// it as a task does): `$1` the endpoint, `$2` this process, `$3` the lease
/// in seconds, `$4`..`$6` the deliveries sent (ids, attempts, statuses),
/// `$7` the most deliveries to take (`BATCH`).
pub static STEP_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "
WITH delivered AS (
    SELECT * FROM unnest($4::uuid[], $5::integer[], $6::integer[]) AS d(id, attempts, status)
), recorded AS (
    {recorded}
), e AS MATERIALIZED (
    SELECT url, secret, sent_through, events FROM webhook_endpoints
     WHERE id = $1 AND leased_by = $2 AND active AND leased_until > now()
       FOR UPDATE
), pending AS MATERIALIZED (
    SELECT d.id, d.seqs, d.attempts, d.next_attempt_at FROM webhook_deliveries d
     WHERE d.endpoint_id = $1 AND d.status = {pending} AND d.id <> ALL($4::uuid[]) AND EXISTS (SELECT 1 FROM e)
     ORDER BY d.created_at, d.seqs[1] LIMIT $7
), next AS MATERIALIZED (
    -- The cursor as a scalar, so that it bounds the scan of the outbox's
    -- key (as a join filter it walked the key from the first row).
    -- `whole`: the endpoint takes every event of the row (it subscribes to
    -- each of their types, and its cursor is before them).
    SELECT o.seq, o.first_seq, o.ids, o.types,
           o.types <@ (SELECT events FROM e)::text[] AND o.first_seq > (SELECT sent_through FROM e) AS whole
      FROM outbox o
     WHERE NOT EXISTS (SELECT 1 FROM pending)
       AND o.seq > (SELECT sent_through FROM e) AND o.types && (SELECT events FROM e)::text[]
     ORDER BY o.seq LIMIT $7
), picked AS (
    -- A whole row is cut as it is: taking it apart event by event was half
    -- of this statement's time.
    SELECT n.seq, ARRAY(SELECT generate_series(n.first_seq, n.seq)) AS seqs, n.ids
      FROM next n
     WHERE n.whole
     UNION ALL
    SELECT n.seq, array_agg(n.first_seq + apart.i - 1 ORDER BY apart.i), array_agg(apart.id ORDER BY apart.i)
      FROM next n, unnest(n.ids, n.types) WITH ORDINALITY AS apart(id, type, i)
     WHERE NOT n.whole AND apart.type = ANY((SELECT events FROM e)::text[])
       AND n.first_seq + apart.i - 1 > (SELECT sent_through FROM e)
     GROUP BY n.seq
), cut AS (
    INSERT INTO webhook_deliveries (endpoint_id, seqs, event_ids)
    SELECT $1, seqs, ids FROM picked ORDER BY seq
 RETURNING id, seqs, attempts, next_attempt_at
), through AS (
    SELECT CASE WHEN EXISTS (SELECT 1 FROM pending) THEN NULL
                WHEN EXISTS (SELECT 1 FROM next) THEN (SELECT max(seq) FROM next)
                ELSE (SELECT max(seq) FROM outbox) END AS seq
), renewed AS (
    UPDATE webhook_endpoints w
       SET leased_until = now() + make_interval(secs => $3),
           sent_through = greatest(e.sent_through, coalesce(t.seq, e.sent_through))
      FROM e, through t WHERE w.id = $1
), chosen AS (
    SELECT * FROM pending UNION ALL SELECT * FROM cut
)
SELECT e.url, e.secret, c.id, c.attempts, c.next_attempt_at,
       CASE WHEN c.next_attempt_at <= now() THEN
           '{{\"events\":[' || coalesce((SELECT CASE WHEN cardinality(o.ids) = cardinality(c.seqs) THEN o.body ELSE (
               -- An endpoint subscribed to some of the row's types: its events, cut out.
               SELECT string_agg(substr(o.body, CASE WHEN u.i = 1 THEN 1 ELSE o.ends[u.i - 1] + 2 END,
                                        o.ends[u.i] - CASE WHEN u.i = 1 THEN 0 ELSE o.ends[u.i - 1] + 1 END),
                                 ',' ORDER BY u.i)
                 FROM generate_subscripts(o.ids, 1) AS u(i) WHERE o.first_seq + u.i - 1 = ANY(c.seqs)) END
              FROM (SELECT * FROM outbox WHERE seq >= c.seqs[1] ORDER BY seq LIMIT 1) o
             WHERE o.first_seq <= c.seqs[1]), '') || ']}}'
       END AS body
  FROM e LEFT JOIN chosen c ON true
 ORDER BY c.seqs[1]",
        recorded = recording_delivered("delivered d"),
        pending = sql(DeliveryStatus::Pending),
    )
});

/// Records `delivered` as DELIVERED, renews the lease on `endpoint_id` if
/// this process still holds it and it is active, and takes its oldest
/// PENDING deliveries or, when none is pending, cuts the next bodies from
/// the outbox: the events of the types it subscribes to in each of the
/// first outbox rows after its cursor that hold any (a row holds up to
/// [`super::render::EVENTS_PER_ROW`] events), each recorded as a PENDING
/// delivery, with the cursor moved past the last. At most [`BATCH`]
/// deliveries, in the order they must be sent. None when the lease is gone;
/// the endpoint, and its deliveries (each with its body when it is due).
///
/// When no row after the cursor holds an event it subscribes to, the
/// cursor moves to the outbox's last row, past the events of other types
/// (the pump keeps every row after any endpoint's cursor; a cursor that
/// stopped at its last own event would keep the rest forever). The pump
/// numbers a pass's rows in one transaction, above every row before it, so
/// no row below the last one seen here can still appear.
///
/// One statement, where recording, renewing, finding, cutting and reading
/// the body were five (the dispatcher fell behind at SPREAD x64: each
/// round trip waits for a backend among the load's; bench/results), and
/// one for several bodies: a statement, its commit and its round trip cost
/// PostgreSQL about as much as the body it carries (bench/results). The
/// deliveries just recorded are still PENDING to this statement's
/// snapshot, so they are passed over by id. Deliveries cut by one statement
/// share `created_at`; their first events order them. The endpoint's row
/// is written once (the lease and the cursor in one UPDATE): PostgreSQL
/// does not let one statement update a row twice.
async fn next(
    db: &DatabaseConnection,
    me: Uuid,
    endpoint_id: Uuid,
    lease: Duration,
    delivered: &[Delivered],
) -> Result<Option<(Endpoint, Vec<Delivery>)>, DbErr> {
    let [ids, attempts, statuses] = Delivered::values(delivered);
    let values: [Value; 7] =
        [endpoint_id.into(), me.into(), lease.as_secs_f64().into(), ids, attempts, statuses, BATCH.into()];
    let rows = db.query_all_raw(Statement::from_sql_and_values(DbBackend::Postgres, STEP_SQL.as_str(), values)).await?;
    let Some(first) = rows.first() else { return Ok(None) };
    let endpoint = Endpoint { url: first.try_get("", "url")?, secret: first.try_get("", "secret")? };
    let mut deliveries = Vec::with_capacity(rows.len());
    for row in &rows {
        let Some(id) = row.try_get::<Option<Uuid>>("", "id")? else { continue };
        deliveries.push(Delivery {
            id,
            attempts: row.try_get("", "attempts")?,
            next_attempt_at: row.try_get("", "next_attempt_at")?,
            body: row.try_get("", "body")?,
        });
    }
    Ok(Some((endpoint, deliveries)))
}

/// An endpoint's HTTP client, kept from attempt to attempt so its
/// connection is reused (a client per attempt, its TLS roots loaded and a
/// connection opened each time, was most of a body's time on loopback); a
/// new one when the endpoint's host or its resolved addresses change.
#[derive(Default)]
struct Client {
    kept: Option<(String, Vec<std::net::SocketAddr>, reqwest::Client)>,
}

impl Client {
    /// The client for `host` at `addresses`.
    fn for_host(
        &mut self,
        host: &str,
        addresses: &[std::net::SocketAddr],
        timeout: Duration,
    ) -> reqwest::Result<reqwest::Client> {
        if let Some((kept_host, kept_addresses, client)) = &self.kept
            && kept_host == host
            && kept_addresses == addresses
        {
            return Ok(client.clone());
        }
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(timeout)
            .resolve_to_addrs(host, addresses)
            .build()?;
        self.kept = Some((host.to_owned(), addresses.to_vec(), client.clone()));
        Ok(client)
    }
}

/// What one attempt came to.
struct Attempt {
    /// The receiver's status, when it answered.
    status: Option<u16>,
    /// Why it failed, when it did.
    error: Option<String>,
}

/// The `stockguard-signature` header of `body` sent at `t` (Unix seconds):
/// HMAC-SHA256 of `"<t>.<body>"` with the endpoint's secret, in hex. None
/// only if the MAC refused the key, which HMAC never does (any length).
pub fn signature(secret: &str, t: i64, body: &str) -> Option<String> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes()).ok()?;
    mac.update(format!("{t}.").as_bytes());
    mac.update(body.as_bytes());
    Some(format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes())))
}

/// Sends `body` once: the egress rules checked again on the resolved
/// addresses (an endpoint's name may have come to point inside), no
/// redirects, the whole attempt bounded by the timeout.
async fn send(
    client: &mut Client,
    endpoint: &Endpoint,
    delivery_id: Uuid,
    body: &str,
    delivering: &Delivering,
) -> Attempt {
    let failed = |error: String| Attempt { status: None, error: Some(error) };
    let checked = match egress::check_url(&endpoint.url, delivering.allow_loopback) {
        Ok(checked) => checked,
        Err(err) => return failed(format!("refused: {err}")),
    };
    let addresses = match egress::resolve(&checked, delivering.allow_loopback).await {
        Ok(addresses) => addresses,
        Err(err) => return failed(format!("refused: {err}")),
    };
    let host = match reqwest::Url::parse(&endpoint.url).ok().and_then(|url| url.host_str().map(str::to_owned)) {
        Some(host) => host,
        None => return failed("the URL has no host".into()),
    };
    let client = match client.for_host(&host, &addresses, delivering.timeout) {
        Ok(client) => client,
        Err(err) => return failed(format!("client: {err}")),
    };
    let t = Utc::now().timestamp();
    let Some(signature) = signature(&endpoint.secret, t, body) else {
        return failed("the secret cannot sign".into());
    };
    let sent = client
        .post(&endpoint.url)
        .header("content-type", "application/json")
        .header("stockguard-delivery", delivery_id.to_string())
        .header("stockguard-signature", signature)
        .body(body.to_owned())
        .send()
        .await;
    match sent {
        Ok(response) if response.status().is_success() => {
            Attempt { status: Some(response.status().as_u16()), error: None }
        }
        Ok(response) => {
            let status = response.status().as_u16();
            Attempt { status: Some(status), error: Some(format!("answered {status}")) }
        }
        Err(err) if err.is_timeout() => failed("timed out".into()),
        Err(err) => failed(without_url(&err)),
    }
}

/// A reqwest error's text without its URL (which may carry a token a receiver put in its path).
fn without_url(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    if let Some(url) = err.url() {
        text = text.replace(url.as_str(), "<url>");
    }
    text.chars().take(MAX_ERROR_CHARS).collect()
}

/// The statement of [`record_failure`]: `$1` the delivery, `$2` its new
/// status, `$3` its attempts, `$4` and `$5` the answer's status and the
/// error, `$6` the seconds until the next attempt.
static RECORD_FAILURE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH recorded AS (
             UPDATE webhook_deliveries
                SET status = $2, attempts = $3, last_attempt_at = now(), last_response_status = $4,
                    last_error = $5, next_attempt_at = now() + make_interval(secs => $6)
              WHERE id = $1 AND status = {pending}
          RETURNING endpoint_id
         )
         UPDATE webhook_endpoints w SET active = false, disabled_at = now()
           FROM recorded r
          WHERE w.id = r.endpoint_id AND $2 = {failed}",
        pending = sql(DeliveryStatus::Pending),
        failed = sql(DeliveryStatus::Failed),
    )
});

/// Records the failed attempt after `made_before` others of delivery
/// `id` (a 2xx is recorded by [`recording_delivered`]): the next attempt
/// after the schedule's next wait (with jitter), or FAILED when the
/// schedule is spent, which also turns the endpoint off (`disabled_at`) in
/// the same statement: every later body would wait out the whole schedule
/// too, while the cursor keeps its place for `redeliverFailed` to resume
/// from.
async fn record_failure(
    db: &DatabaseConnection,
    id: Uuid,
    made_before: i32,
    attempt: &Attempt,
    delivering: &Delivering,
) -> Result<(), DbErr> {
    let attempts = made_before + 1;
    let wait = usize::try_from(made_before).ok().and_then(|i| delivering.schedule.get(i)).copied();
    let (status, wait_secs) = match wait {
        Some(wait) => (DeliveryStatus::Pending, wait.as_secs_f64() * rand::rng().random_range(0.8..1.2)),
        None => (DeliveryStatus::Failed, 0.0),
    };
    let values: [Value; 6] = [
        id.into(),
        status.into(),
        attempts.into(),
        attempt.status.map(i32::from).into(),
        attempt.error.clone().into(),
        wait_secs.into(),
    ];
    db.execute_raw(Statement::from_sql_and_values(DbBackend::Postgres, RECORD_FAILURE_SQL.as_str(), values)).await?;
    if status == DeliveryStatus::Failed {
        tracing::warn!(delivery = %id, attempts, "a webhook delivery spent its schedule: FAILED, endpoint off");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_endpoint_whose_task_panicked_is_served_again_and_the_others_still_are() {
        let (failing, lasting) = (Uuid::new_v4(), Uuid::new_v4());
        let mut serving = Serving::default();
        serving.start(failing, async { panic!("a bug in a delivery") });
        serving.start(lasting, std::future::pending());
        for _ in 0..1000 {
            tokio::task::yield_now().await;
            serving.reap();
            if !serving.serves(failing) {
                break;
            }
        }
        assert!(!serving.serves(failing), "the panicked task's endpoint is still taken as served");
        assert!(serving.serves(lasting), "a running task's endpoint is forgotten");
    }
}
