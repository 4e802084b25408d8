//! SQL for webhook endpoints and their deliveries: creating, changing and
//! deleting an endpoint, pages of endpoints and of one endpoint's
//! deliveries (by `(created_at, id)`), and putting failed deliveries back
//! in line. The event pump and the dispatcher (`src/events/`) own the
//! rest of these tables' writes; `service.rs` decides what a result means.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, FromQueryResult, Statement, Value};
use uuid::Uuid;

use crate::{
    events::{DeliveryStatus, EventType},
    pagination::{Cursor, Page},
    stock::rows::sql,
};

/// An endpoint as the API shows it: never its secret, lease or cursor.
#[derive(Debug, Clone, PartialEq, Eq, FromQueryResult)]
pub struct EndpointRow {
    /// The endpoint's id.
    pub id: Uuid,
    /// Where bodies are POSTed (checked by the egress rules when written).
    pub url: String,
    /// The event types it takes.
    pub events: Vec<EventType>,
    /// False: nothing is sent to it until it is set back to true.
    pub active: bool,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When Stockguard turned it off because a delivery spent its whole
    /// schedule; none while it is on, or when an operator turned it off.
    pub disabled_at: Option<DateTime<Utc>>,
}

/// The columns of an [`EndpointRow`].
const ENDPOINT: &str = "id, url, events, active, created_at, disabled_at";

/// One delivery of one endpoint: a body of events and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, FromQueryResult)]
pub struct DeliveryRow {
    /// The delivery's id (the `stockguard-delivery` header).
    pub id: Uuid,
    /// The events in its body, in order.
    pub event_ids: Vec<Uuid>,
    /// Where it stands.
    pub status: DeliveryStatus,
    /// Attempts made since it was created or last replayed.
    pub attempts: i32,
    /// When it was last sent.
    pub last_attempt_at: Option<DateTime<Utc>>,
    /// The HTTP status of the last answer, if one came.
    pub last_response_status: Option<i32>,
    /// Why the last attempt failed, if it did.
    pub last_error: Option<String>,
    /// When it is sent next.
    pub next_attempt_at: DateTime<Utc>,
    /// When a 2xx answered it.
    pub delivered_at: Option<DateTime<Utc>>,
    /// When it was made, the first half of its position in a page.
    pub created_at: DateTime<Utc>,
}

/// A new endpoint with `secret`, as a row.
pub struct NewEndpoint<'a> {
    /// The checked URL.
    pub url: &'a str,
    /// The event types, at least one.
    pub events: &'a [EventType],
    /// The signing secret.
    pub secret: &'a str,
}

/// The CTE that wakes the event pump when the first endpoint is created:
/// the pump reads nothing while there is none (so an idle shop pays
/// nothing for events), and starts again from now, not from the last
/// change it read, which may be months of ledger ago. While any endpoint
/// exists, on or off, the pump runs, so an endpoint turned on again is sent
/// what happened while it was off (back to the archive's retention).
/// What it kept of each inventory's units (`event_stock`) is forgotten
/// too: changes made while it stood still never reached it.
const WAKE: &str = "wake AS (UPDATE event_pump SET seen = pg_current_snapshot()
                               WHERE NOT EXISTS (SELECT 1 FROM webhook_endpoints)),
                    forgotten AS (DELETE FROM event_stock WHERE NOT EXISTS (SELECT 1 FROM webhook_endpoints))";

/// Creates an endpoint. Its cursor starts at the pump's last outbox row, so
/// it is sent the events pumped after it, none from before. The pump's row
/// is read, not locked: a pump committing meanwhile hands the endpoint the
/// events of its window too, which were recorded at about the same
/// instant; sending an event more is allowed, blocking every creation
/// behind the pump's transaction buys nothing.
pub async fn create(db: &impl ConnectionTrait, new: NewEndpoint<'_>) -> Result<EndpointRow, DbErr> {
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        format!(
            "WITH {WAKE} INSERT INTO webhook_endpoints (url, events, secret, sent_through)
             SELECT $1, $2, $3, last_seq FROM event_pump
             RETURNING {ENDPOINT}"
        ),
        [new.url.into(), new.events.to_vec().into(), new.secret.into()],
    );
    EndpointRow::find_by_statement(statement).one(db).await?.ok_or(DbErr::RecordNotInserted)
}

/// Changes the given fields of endpoint `id` (the others stay); the row as
/// left, or none when no endpoint has that id.
pub async fn update(
    db: &impl ConnectionTrait,
    id: Uuid,
    url: Option<&str>,
    events: Option<&[EventType]>,
    active: Option<bool>,
) -> Result<Option<EndpointRow>, DbErr> {
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        format!(
            "UPDATE webhook_endpoints
                SET url = coalesce($2, url), events = coalesce($3, events), active = coalesce($4, active),
                    disabled_at = CASE WHEN $4::boolean IS NULL THEN disabled_at END
              WHERE id = $1
          RETURNING {ENDPOINT}"
        ),
        [id.into(), url.map(str::to_owned).into(), events.map(<[EventType]>::to_vec).into(), active.into()],
    );
    EndpointRow::find_by_statement(statement).one(db).await
}

/// Deletes endpoint `id` with its deliveries (`ON DELETE CASCADE`); whether
/// there was one.
pub async fn delete(db: &impl ConnectionTrait, id: Uuid) -> Result<bool, DbErr> {
    let statement =
        Statement::from_sql_and_values(DbBackend::Postgres, "DELETE FROM webhook_endpoints WHERE id = $1", [id.into()]);
    Ok(db.execute_raw(statement).await?.rows_affected() == 1)
}

/// The endpoint with `id`, if there is one.
pub async fn find(db: &impl ConnectionTrait, id: Uuid) -> Result<Option<EndpointRow>, DbErr> {
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        format!("SELECT {ENDPOINT} FROM webhook_endpoints WHERE id = $1"),
        [id.into()],
    );
    EndpointRow::find_by_statement(statement).one(db).await
}

/// The condition and parameters that start a page after its cursor:
/// `(created_at, id) > (after)` as a row comparison, which the
/// `(…, created_at, id)` indexes answer with one range scan; nothing
/// without a cursor. `first` is the number of the first parameter it uses.
fn after(page: &Page, first: usize) -> (String, Vec<Value>) {
    match page.after {
        Some(Cursor { created_at, id }) => {
            (format!("AND (created_at, id) > (${first}, ${})", first + 1), vec![created_at.into(), id.into()])
        }
        None => (String::new(), Vec::new()),
    }
}

/// The `LIMIT` of a page: one row more than asked, to tell whether more follow.
fn limit(page: &Page) -> Value {
    i64::try_from(page.first).unwrap_or(i64::MAX).saturating_add(1).into()
}

/// One page of endpoints by `(created_at, id)`, with one extra row when more
/// follow (the `webhook_endpoints_created` index).
pub async fn page(db: &impl ConnectionTrait, page: Page) -> Result<Vec<EndpointRow>, DbErr> {
    let (after, mut values) = after(&page, 2);
    values.insert(0, limit(&page));
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        format!("SELECT {ENDPOINT} FROM webhook_endpoints WHERE true {after} ORDER BY created_at, id LIMIT $1"),
        values,
    );
    EndpointRow::find_by_statement(statement).all(db).await
}

/// One page of endpoint `endpoint_id`'s deliveries by `(created_at, id)`,
/// only those with `status` when given, with one extra row when more follow
/// (the `webhook_deliveries_endpoint` index).
pub async fn deliveries(
    db: &impl ConnectionTrait,
    endpoint_id: Uuid,
    status: Option<DeliveryStatus>,
    page: Page,
) -> Result<Vec<DeliveryRow>, DbErr> {
    let (after, mut values) = after(&page, 4);
    let head: [Value; 3] = [limit(&page), endpoint_id.into(), status.into()];
    values.splice(0..0, head);
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        format!(
            "SELECT id, event_ids, status, attempts, last_attempt_at, last_response_status, last_error,
                    next_attempt_at, delivered_at, created_at
               FROM webhook_deliveries
              WHERE endpoint_id = $2 AND ($3::text IS NULL OR status = $3) {after}
              ORDER BY created_at, id LIMIT $1"
        ),
        values,
    );
    DeliveryRow::find_by_statement(statement).all(db).await
}

/// Puts endpoint `endpoint_id`'s FAILED deliveries back in line: PENDING,
/// no attempts, due now, and turns the endpoint on again (a FAILED
/// delivery turned it off); how many. One statement, so a delivery the
/// dispatcher fails while it runs is either taken (and due now) or left
/// FAILED for the next call, never half changed. The last answer and error
/// stay, as what happened before the replay. The replayed deliveries are
/// the endpoint's oldest, and the dispatcher sends an endpoint's oldest
/// PENDING delivery first, so they go before anything newer.
pub async fn redeliver_failed(db: &impl ConnectionTrait, endpoint_id: Uuid) -> Result<u64, DbErr> {
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        format!(
            "WITH replayed AS (
                 UPDATE webhook_deliveries SET status = {pending}, attempts = 0, next_attempt_at = now()
                  WHERE endpoint_id = $1 AND status = {failed}
              RETURNING 1
             ), turned_on AS (
                 UPDATE webhook_endpoints SET active = true, disabled_at = NULL
                  WHERE id = $1 AND EXISTS (SELECT 1 FROM replayed)
             )
             SELECT count(*) AS replayed FROM replayed",
            pending = sql(DeliveryStatus::Pending),
            failed = sql(DeliveryStatus::Failed),
        ),
        [endpoint_id.into()],
    );
    let row = db.query_one_raw(statement).await?;
    Ok(row.map(|row| row.try_get::<i64>("", "replayed")).transpose()?.unwrap_or(0).max(0) as u64)
}
