//! Delivery: each active endpoint's outbox rows, in order, in bodies of up
//! to 100 events, signed, at least once.
//!
//! Every process leases the endpoints nobody holds (`leased_until` in the
//! past) and runs one task per endpoint it holds, so an endpoint is served
//! by one process at a time (no double send in normal operation), a slow or
//! dead endpoint holds up only its own task, and the endpoints of a process
//! that died are taken over when its leases run out. A task works through
//! its endpoint's deliveries one at a time, oldest first: the next body is
//! cut from the outbox (the events after the endpoint's cursor that it
//! subscribes to) and recorded as a PENDING delivery, with the cursor moved,
//! in one statement, before it is sent; it is retried until a 2xx answers
//! or the schedule is spent (FAILED, which turns the endpoint off until
//! `redeliverFailed` sends it again), and only then does the next one go.
//! So an endpoint sees each inventory's and each order's events in version
//! order, within and across bodies, and a process killed mid-send leaves a
//! PENDING delivery that whoever leases the endpoint next sends again. A
//! task holds one body at a time, whatever the backlog.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use rand::RngExt as _;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, Value};
use sha2::Sha256;
use tokio::{sync::watch, task::JoinHandle};
use uuid::Uuid;

use crate::webhooks::egress;

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

/// Most events in one body.
const MAX_EVENTS_PER_BODY: i64 = 100;

/// Most bytes of a receiver's answer kept in `last_error`.
const MAX_ERROR_CHARS: usize = 300;

/// Leases the endpoints nobody holds (or this process holds) and starts a
/// task for each one not already served here, every `poll`, until `stop`.
/// Leasing goes through `requests` (the requests' pool, open anyway);
/// the endpoints' tasks work on `db`.
pub fn spawn(
    requests: DatabaseConnection,
    db: DatabaseConnection,
    delivering: Delivering,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let me = Uuid::new_v4();
        let serving: Arc<Mutex<HashSet<Uuid>>> = Arc::default();
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
            let leased = match lease(&requests, me, delivering.lease).await {
                Ok(leased) => leased,
                Err(err) => {
                    tracing::warn!(error = %err, "leasing webhook endpoints failed; trying again");
                    continue;
                }
            };
            for endpoint in leased {
                let fresh = serving.lock().unwrap_or_else(PoisonError::into_inner).insert(endpoint);
                if fresh {
                    let (db, delivering, serving, stop) =
                        (db.clone(), delivering.clone(), serving.clone(), stop.clone());
                    tokio::spawn(async move {
                        serve(&db, me, endpoint, &delivering, stop).await;
                        serving.lock().unwrap_or_else(PoisonError::into_inner).remove(&endpoint);
                    });
                }
            }
        }
        // Leases lapse on their own; giving them back lets another process
        // take over at once. Bounded: a stopping process does not wait for
        // a database that does not answer.
        let release = "UPDATE webhook_endpoints SET leased_until = '-infinity' WHERE leased_by = $1";
        let release = requests.execute_raw(Statement::from_sql_and_values(DbBackend::Postgres, release, [me.into()]));
        let _ = tokio::time::timeout(Duration::from_secs(1), release).await;
    })
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
    seqs: Vec<i64>,
    attempts: i32,
    next_attempt_at: DateTime<Utc>,
}

/// Serves one endpoint while this process holds its lease.
async fn serve(
    db: &DatabaseConnection,
    me: Uuid,
    endpoint_id: Uuid,
    delivering: &Delivering,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        if *stop.borrow() {
            return;
        }
        let pause = match step(db, me, endpoint_id, delivering).await {
            Ok(Step::Held(pause)) => pause,
            Ok(Step::Lost) => return,
            Err(err) => {
                tracing::warn!(error = %err, endpoint = %endpoint_id, "a webhook delivery step failed; trying again");
                delivering.poll
            }
        };
        if !pause.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.changed() => return,
            }
        }
    }
}

/// What one step came to.
enum Step {
    /// Still this process's endpoint; wait this long before the next step.
    Held(Duration),
    /// The lease is gone (expired and taken, or the endpoint deactivated or deleted).
    Lost,
}

/// Renews the lease, then attempts the endpoint's current delivery (cutting
/// the next one from the outbox when none is pending) if it is due.
async fn step(db: &DatabaseConnection, me: Uuid, endpoint_id: Uuid, delivering: &Delivering) -> Result<Step, DbErr> {
    let Some(endpoint) = renew(db, me, endpoint_id, delivering.lease).await? else {
        return Ok(Step::Lost);
    };
    let delivery = match pending(db, endpoint_id).await? {
        Some(delivery) => delivery,
        None => match cut(db, me, endpoint_id).await? {
            Some(delivery) => delivery,
            None => return Ok(Step::Held(delivering.poll)),
        },
    };
    let wait = (delivery.next_attempt_at - Utc::now()).to_std().unwrap_or_default();
    if !wait.is_zero() {
        return Ok(Step::Held(wait.min(delivering.poll.max(Duration::from_secs(1)))));
    }
    let body = body(db, &delivery.seqs).await?;
    let outcome = send(&endpoint, delivery.id, &body, delivering).await;
    record(db, &delivery, &outcome, delivering).await?;
    Ok(Step::Held(Duration::ZERO))
}

/// Renews the lease on `endpoint_id` if this process still holds it and it
/// is active; its URL and secret.
async fn renew(
    db: &DatabaseConnection,
    me: Uuid,
    endpoint_id: Uuid,
    lease: Duration,
) -> Result<Option<Endpoint>, DbErr> {
    let sql = "UPDATE webhook_endpoints SET leased_until = now() + make_interval(secs => $3)
                WHERE id = $1 AND leased_by = $2 AND active AND leased_until > now()
            RETURNING url, secret";
    let values: [Value; 3] = [endpoint_id.into(), me.into(), lease.as_secs_f64().into()];
    let row = db.query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, values)).await?;
    row.map(|row| Ok(Endpoint { url: row.try_get("", "url")?, secret: row.try_get("", "secret")? })).transpose()
}

fn delivery(row: &sea_orm::QueryResult) -> Result<Delivery, DbErr> {
    Ok(Delivery {
        id: row.try_get("", "id")?,
        seqs: row.try_get("", "seqs")?,
        attempts: row.try_get("", "attempts")?,
        next_attempt_at: row.try_get("", "next_attempt_at")?,
    })
}

/// The endpoint's oldest PENDING delivery.
async fn pending(db: &DatabaseConnection, endpoint_id: Uuid) -> Result<Option<Delivery>, DbErr> {
    let sql = "SELECT id, seqs, attempts, next_attempt_at FROM webhook_deliveries
                WHERE endpoint_id = $1 AND status = 'PENDING' ORDER BY created_at, id LIMIT 1";
    let row = db.query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, [endpoint_id.into()])).await?;
    row.as_ref().map(delivery).transpose()
}

/// Cuts the next body from the outbox for an endpoint this process holds:
/// up to [`MAX_EVENTS_PER_BODY`] events after its cursor of the types it
/// subscribes to, recorded as a PENDING delivery with the cursor moved past
/// them, in one statement. None when nothing new is there.
///
/// A cut that takes fewer than a full body has taken every event it
/// subscribes to that the outbox holds, so the cursor moves to the
/// outbox's last row, past the events of other types too (the pump keeps
/// every row after any endpoint's cursor; a cursor that stopped at its last
/// own event would keep the rest forever). The pump numbers a pass's rows
/// in one transaction, above every row before it, so no row below the last
/// one seen here can still appear.
async fn cut(db: &DatabaseConnection, me: Uuid, endpoint_id: Uuid) -> Result<Option<Delivery>, DbErr> {
    let sql = "
WITH e AS MATERIALIZED (
    SELECT sent_through, events FROM webhook_endpoints WHERE id = $1 AND leased_by = $2 FOR UPDATE
), next AS MATERIALIZED (
    -- The cursor as a scalar, so that it bounds the scan of the outbox's
    -- key (as a join filter it walked the key from the first row).
    SELECT o.seq, o.id FROM outbox o
     WHERE o.seq > (SELECT sent_through FROM e) AND o.type = ANY((SELECT events FROM e)::text[])
     ORDER BY o.seq LIMIT $3
), cut AS (
    INSERT INTO webhook_deliveries (endpoint_id, seqs, event_ids)
    SELECT $1, array_agg(seq ORDER BY seq), array_agg(id ORDER BY seq) FROM next HAVING count(*) > 0
 RETURNING id, seqs, attempts, next_attempt_at
), through AS (
    SELECT CASE WHEN (SELECT count(*) FROM next) < $3 THEN (SELECT max(seq) FROM outbox)
                ELSE (SELECT max(seq) FROM next) END AS seq
), moved AS (
    UPDATE webhook_endpoints w SET sent_through = t.seq FROM e, through t WHERE w.id = $1 AND t.seq > e.sent_through
)
SELECT * FROM cut";
    let values: [Value; 3] = [endpoint_id.into(), me.into(), MAX_EVENTS_PER_BODY.into()];
    let row = db.query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, values)).await?;
    row.as_ref().map(delivery).transpose()
}

/// The body of the outbox rows `seqs`, exactly as it is signed and sent.
async fn body(db: &DatabaseConnection, seqs: &[i64]) -> Result<String, DbErr> {
    let sql = "SELECT jsonb_build_object('events', coalesce(jsonb_agg(body ORDER BY seq), '[]'))::text AS body
                 FROM outbox WHERE seq = ANY($1)";
    let row = db.query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, [seqs.to_vec().into()]));
    row.await?.map_or(Ok(r#"{"events":[]}"#.to_owned()), |row| row.try_get("", "body"))
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
async fn send(endpoint: &Endpoint, delivery_id: Uuid, body: &str, delivering: &Delivering) -> Attempt {
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
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(delivering.timeout)
        .resolve_to_addrs(&host, &addresses)
        .build();
    let client = match client {
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

/// Records an attempt: DELIVERED on a 2xx; else the next attempt after the
/// schedule's next wait (with jitter), or FAILED when the schedule is spent,
/// which also turns the endpoint off (`disabled_at`) in the same statement:
/// every later body would wait out the whole schedule too, while the
/// cursor keeps its place for `redeliverFailed` to resume from.
async fn record(
    db: &DatabaseConnection,
    delivery: &Delivery,
    attempt: &Attempt,
    delivering: &Delivering,
) -> Result<(), DbErr> {
    let attempts = delivery.attempts + 1;
    let wait = usize::try_from(delivery.attempts).ok().and_then(|i| delivering.schedule.get(i)).copied();
    let (status, wait_secs) = match (&attempt.error, wait) {
        (None, _) => ("DELIVERED", 0.0),
        (Some(_), Some(wait)) => ("PENDING", wait.as_secs_f64() * rand::rng().random_range(0.8..1.2)),
        (Some(_), None) => ("FAILED", 0.0),
    };
    let sql = "WITH recorded AS (
                   UPDATE webhook_deliveries
                      SET status = $2, attempts = $3, last_attempt_at = now(), last_response_status = $4,
                          last_error = $5, next_attempt_at = now() + make_interval(secs => $6),
                          delivered_at = CASE WHEN $2 = 'DELIVERED' THEN now() END
                    WHERE id = $1 AND status = 'PENDING'
                RETURNING endpoint_id
               )
               UPDATE webhook_endpoints w SET active = false, disabled_at = now()
                 FROM recorded r
                WHERE w.id = r.endpoint_id AND $2 = 'FAILED'";
    let values: [Value; 6] = [
        delivery.id.into(),
        status.into(),
        attempts.into(),
        attempt.status.map(i32::from).into(),
        attempt.error.clone().into(),
        wait_secs.into(),
    ];
    db.execute_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, values)).await?;
    if status == "FAILED" {
        tracing::warn!(delivery = %delivery.id, attempts, "a webhook delivery spent its schedule: FAILED, endpoint off");
    }
    Ok(())
}
