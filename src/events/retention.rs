//! Retention of events: `stockguard archive` deletes events and deliveries
//! older than the ledger's retention, whatever became of them.
//!
//! The pump already deletes the outbox rows every endpoint has been sent,
//! so what is left to age out is what someone did not take: the backlog of
//! an endpoint that is off (turned off by an operator, or by a delivery
//! that spent its schedule), FAILED deliveries nobody replayed, the
//! DELIVERED deliveries kept for the API's history, and the order events
//! recorded while no endpoint existed. Each goes once it is older than the
//! cutoff, so nothing outlives the ledger rows it describes; an endpoint
//! turned on again later is sent what is left after its cursor.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement};

use super::outbox;

/// What [`archive`] deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Aged {
    /// Events: numbered for delivery (in outbox rows), or recorded and
    /// never numbered because no endpoint existed.
    pub events: u64,
    /// Deliveries, whatever their status.
    pub deliveries: u64,
    /// Statements run.
    pub(crate) statements: u64,
}

/// Deletes, `batch` rows per statement (each its own short transaction, safe
/// under load and to stop at any point), the outbox rows, deliveries and
/// unpumped order events made before `cutoff`.
pub(crate) async fn archive(db: &DatabaseConnection, cutoff: DateTime<Utc>, batch: u64) -> Result<Aged, DbErr> {
    // Oldest first by each table's own order (`txid` grows with time, as
    // the outbox's `seq` does), so a batch is found by a short index scan
    // that stops at the first row inside the retention. Each says how many
    // rows it deleted and how many events they held.
    const EVENTS: &str = "WITH gone AS (
        DELETE FROM events WHERE id IN (SELECT id FROM events WHERE occurred_at < $1 ORDER BY occurred_at LIMIT $2)
        RETURNING 1)
        SELECT count(*) AS rows, count(*) AS events FROM gone";
    let (outbox, outbox_statements) = in_batches(db, outbox::AGED_ROWS_SQL, cutoff, batch).await?;
    let (deliveries, deliveries_statements) = in_batches(db, outbox::AGED_DELIVERIES_SQL, cutoff, batch).await?;
    let (recorded, recorded_statements) = in_batches(db, EVENTS, cutoff, batch).await?;
    Ok(Aged {
        events: outbox + recorded,
        deliveries,
        statements: outbox_statements + deliveries_statements + recorded_statements,
    })
}

/// Runs the batch delete `sql` (`$1` the cutoff, `$2` the batch) until a
/// batch comes up short; the events deleted and the statements run.
async fn in_batches(
    db: &DatabaseConnection,
    sql: &str,
    cutoff: DateTime<Utc>,
    batch: u64,
) -> Result<(u64, u64), DbErr> {
    let batch = batch.clamp(1, i64::MAX as u64);
    let (mut events, mut statements) = (0, 0);
    loop {
        let values = [cutoff.into(), (batch as i64).into()];
        let deleted = db.query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, values)).await?;
        let (rows, held) = match deleted {
            Some(row) => (row.try_get::<i64>("", "rows")?, row.try_get::<i64>("", "events")?),
            None => (0, 0),
        };
        events += held.max(0) as u64;
        statements += 1;
        if (rows.max(0) as u64) < batch {
            return Ok((events, statements));
        }
    }
}
