//! An endpoint's deliveries as its task takes and records them: the one
//! statement of a step ([`STEP_SQL`], run by [`next`]), which records what
//! was sent, renews the lease, and takes the pending deliveries or cuts the
//! next ones from the outbox; the record of what a stopping task sent
//! ([`record_delivered`]); and the record of a failed attempt
//! ([`record_failure`]). When to attempt, and what an attempt came to, are
//! the task's (`events::deliver`).

use std::{sync::LazyLock, time::Duration};

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, Value};
use uuid::Uuid;

use crate::{events::DeliveryStatus, stock::rows::sql};

/// What a task needs of its endpoint, read again before every attempt (an
/// operator may change the URL, or deactivate it).
pub(crate) struct Endpoint {
    /// Where bodies are POSTed.
    pub url: String,
    /// What they are signed with.
    pub secret: String,
}

/// A delivery to attempt.
pub(crate) struct Delivery {
    /// The delivery's id.
    pub id: Uuid,
    /// Attempts made before this one.
    pub attempts: i32,
    /// When it is due.
    pub next_attempt_at: DateTime<Utc>,
    /// Its body, exactly as it is signed and sent; none while it is not due.
    pub body: Option<String>,
}

/// A delivery that was sent and answered 2xx, not yet recorded: the next
/// step's statement records it (one round trip a step instead of two).
pub(crate) struct Delivered {
    /// The delivery.
    pub id: Uuid,
    /// Attempts made before this one.
    pub attempts: i32,
    /// The receiver's 2xx.
    pub status: u16,
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

/// Records as DELIVERED the deliveries that `sent` (a `FROM` item `d` of
/// `id`, `attempts` and `status`) says were answered 2xx at that attempt,
/// if still PENDING: in a task's step ([`STEP_SQL`]), and on its own when
/// a task stops ([`record_delivered`]).
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
       CASE WHEN c.next_attempt_at <= now() THEN {body} END AS body
  FROM e LEFT JOIN chosen c ON true
 ORDER BY c.seqs[1]",
        recorded = recording_delivered("delivered d"),
        pending = sql(DeliveryStatus::Pending),
        body = super::body("c.seqs"),
    )
});

/// Records `delivered` as DELIVERED, renews the lease on `endpoint_id` if
/// this process still holds it and it is active, and takes its oldest
/// PENDING deliveries or, when none is pending, cuts the next bodies from
/// the outbox: the events of the types it subscribes to in each of the
/// first outbox rows after its cursor that hold any (a row holds up to
/// [`super::EVENTS_PER_ROW`] events), each recorded as a PENDING
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
pub(crate) async fn next(
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

/// Records `delivered` as DELIVERED on its own: what a task sent before it
/// stopped, with no next step to record it.
pub(crate) async fn record_delivered(db: &DatabaseConnection, delivered: &[Delivered]) -> Result<(), DbErr> {
    let sql = recording_delivered("unnest($1::uuid[], $2::integer[], $3::integer[]) AS d(id, attempts, status)");
    let values = Delivered::values(delivered);
    db.execute_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, values)).await?;
    Ok(())
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

/// A failed attempt, as [`record_failure`] records it.
pub(crate) struct Failure {
    /// The delivery.
    pub id: Uuid,
    /// Attempts made, this one included.
    pub attempts: i32,
    /// PENDING, attempted again `retry_in` from now; or FAILED, its
    /// schedule spent.
    pub status: DeliveryStatus,
    /// How long until the next attempt.
    pub retry_in: Duration,
    /// The receiver's status, when it answered.
    pub response_status: Option<u16>,
    /// Why it failed.
    pub error: Option<String>,
}

/// Records a failed attempt of a delivery that is still PENDING (a 2xx is
/// recorded by [`recording_delivered`]). A FAILED delivery also turns its
/// endpoint off (`disabled_at`) in the same statement: every later body
/// would wait out the whole schedule too, while the cursor keeps its place
/// for `redeliverFailed` to resume from.
pub(crate) async fn record_failure(db: &DatabaseConnection, failure: Failure) -> Result<(), DbErr> {
    let values: [Value; 6] = [
        failure.id.into(),
        failure.status.into(),
        failure.attempts.into(),
        failure.response_status.map(i32::from).into(),
        failure.error.into(),
        failure.retry_in.as_secs_f64().into(),
    ];
    db.execute_raw(Statement::from_sql_and_values(DbBackend::Postgres, RECORD_FAILURE_SQL.as_str(), values)).await?;
    Ok(())
}
