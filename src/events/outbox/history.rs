//! Deliveries as operators see them (`crate::webhooks`): a page of one
//! endpoint's deliveries and what became of each, and putting the failed
//! ones back in line.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, FromQueryResult, Statement, Value};
use uuid::Uuid;

use crate::{events::DeliveryStatus, pagination::Page, stock::rows::sql};

/// One delivery of one endpoint: a body of events and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, FromQueryResult)]
pub(crate) struct DeliveryRow {
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

/// One page of endpoint `endpoint_id`'s deliveries by `(created_at, id)`,
/// only those with `status` when given, with one extra row when more follow
/// (the `webhook_deliveries_endpoint` index).
pub(crate) async fn deliveries(
    db: &impl ConnectionTrait,
    endpoint_id: Uuid,
    status: Option<DeliveryStatus>,
    page: Page,
) -> Result<Vec<DeliveryRow>, DbErr> {
    let (after, mut values) = page.after_sql(4);
    let head: [Value; 3] = [page.limit(), endpoint_id.into(), status.into()];
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
pub(crate) async fn redeliver_failed(db: &impl ConnectionTrait, endpoint_id: Uuid) -> Result<u64, DbErr> {
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
