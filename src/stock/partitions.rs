//! The ledger's day partitions, made ahead of the days that need them.
//!
//! `stock_movements` has a partition per day (UTC), so that only today's
//! partition takes rows and its guard index holds today's rows alone (the
//! migration `m20261205_090000_partition_the_ledger_by_day` says why). Every
//! process makes the partitions of today and the next [`DAYS_AHEAD`] days
//! when it opens the database, before it serves, and a server hourly after
//! that: a week of margin, so a day never starts without its partition
//! while any process runs. A row of a day without one would still be
//! written, into the default partition.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement};
use tokio::{sync::watch, task::JoinHandle};

/// How many days past today have their partition ready.
pub const DAYS_AHEAD: i32 = 7;

/// How often a process makes the partitions ahead again.
const EVERY: Duration = Duration::from_secs(3600);

/// Makes the partitions of the days from `days_back` before today to
/// `days_ahead` after it that do not exist yet; how many it made.
pub async fn make(db: &impl ConnectionTrait, days_back: i32, days_ahead: i32) -> Result<i32, DbErr> {
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT ledger_partitions((now() AT TIME ZONE 'UTC')::date - $1, (now() AT TIME ZONE 'UTC')::date + $2)",
            [days_back.into(), days_ahead.into()],
        ))
        .await?;
    row.map_or(Ok(0), |row| row.try_get_by_index::<i32>(0))
}

/// Makes the partitions ahead every hour until `stop` turns true (the
/// first an hour after start: opening the database made them); a failure
/// is logged and tried again next hour.
pub(crate) fn spawn(db: DatabaseConnection, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + EVERY, EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = stop.changed() => break,
            }
            match make(&db, 0, DAYS_AHEAD).await {
                Ok(0) => {}
                Ok(made) => tracing::info!(made, "made the ledger's partitions ahead"),
                Err(err) => {
                    tracing::warn!(error = %err, "making the ledger's partitions failed; trying again in an hour")
                }
            }
        }
    })
}
