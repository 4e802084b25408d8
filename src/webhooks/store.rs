//! SQL for webhook endpoints: creating, changing and deleting an endpoint,
//! and pages of endpoints (by `(created_at, id)`). Their deliveries are the
//! outbox's (`events::outbox::history`), and the event pump and the
//! dispatcher (`src/events/`) own the rest of the endpoints' writes (the
//! lease and the cursor); `service.rs` decides what a result means.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, FromQueryResult, Statement};
use uuid::Uuid;

use crate::{events::EventType, pagination::Page};

/// An endpoint as the API shows it: never its secret, lease or cursor.
#[derive(Debug, Clone, PartialEq, Eq, FromQueryResult)]
pub(crate) struct EndpointRow {
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

/// A new endpoint with `secret`, as a row.
pub(crate) struct NewEndpoint<'a> {
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
pub(crate) async fn create(db: &impl ConnectionTrait, new: NewEndpoint<'_>) -> Result<EndpointRow, DbErr> {
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
pub(crate) async fn update(
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
pub(crate) async fn delete(db: &impl ConnectionTrait, id: Uuid) -> Result<bool, DbErr> {
    let statement =
        Statement::from_sql_and_values(DbBackend::Postgres, "DELETE FROM webhook_endpoints WHERE id = $1", [id.into()]);
    Ok(db.execute_raw(statement).await?.rows_affected() == 1)
}

/// The endpoint with `id`, if there is one.
pub(crate) async fn find(db: &impl ConnectionTrait, id: Uuid) -> Result<Option<EndpointRow>, DbErr> {
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        format!("SELECT {ENDPOINT} FROM webhook_endpoints WHERE id = $1"),
        [id.into()],
    );
    EndpointRow::find_by_statement(statement).one(db).await
}

/// One page of endpoints by `(created_at, id)`, with one extra row when more
/// follow (the `webhook_endpoints_created` index).
pub(crate) async fn page(db: &impl ConnectionTrait, page: Page) -> Result<Vec<EndpointRow>, DbErr> {
    let (after, mut values) = page.after_sql(2);
    values.insert(0, page.limit());
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        format!("SELECT {ENDPOINT} FROM webhook_endpoints WHERE true {after} ORDER BY created_at, id LIMIT $1"),
        values,
    );
    EndpointRow::find_by_statement(statement).all(db).await
}
