//! The sweeper: returns the stock of expired ACTIVE reservations.
//!
//! Every server process runs one. Each sweep claims up to a limit of due
//! reservations with `FOR UPDATE SKIP LOCKED`, so processes sweeping together
//! claim disjoint sets and no reservation's stock comes back twice; the same
//! statement marks the reservations EXPIRED, returns their stock and writes
//! the ledger (the statement is `stock::returning::sweep`).

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};
use tokio::{sync::watch, task::JoinHandle};

use crate::{db::classify, stock::returning};

/// Sweeps one tick may run back to back (full sweeps, collisions).
const MAX_SWEEPS_PER_TICK: usize = 100;

/// Expires at most `limit` due reservations; returns how many it expired.
/// Two sweeps touching the same inventories may collide (40001); that is
/// safe to run again.
pub async fn sweep_once(db: &impl ConnectionTrait, limit: i64) -> Result<i64, DbErr> {
    let row = db.query_one_raw(returning::sweep(limit)).await?;
    row.map_or(Ok(0), |row| row.try_get_by_index::<i64>(0))
}

/// Sweeps every `interval` until `stop` turns true. A failed sweep (a lost
/// connection, a collision with a writer) is logged and tried again next time.
pub fn spawn(
    db: DatabaseConnection,
    interval: Duration,
    limit: i64,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        // The first sweep one interval after start, not at once.
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = stop.changed() => break,
            }
            // A full sweep means more may be due, and a collision with another
            // sweeper or a writer means it made progress: sweep again at once,
            // a bounded number of times per tick. A stop is heeded between
            // sweeps, not only between ticks: a tick of a hundred full
            // sweeps held a server past its 15 s after SIGTERM when a
            // benchmark's reservations came due together.
            for _ in 0..MAX_SWEEPS_PER_TICK {
                if *stop.borrow() {
                    return;
                }
                match sweep_once(&db, limit).await {
                    Ok(expired) => {
                        if expired > 0 {
                            tracing::info!(expired, "returned the stock of expired reservations");
                            crate::telemetry::sweeper_returned(expired);
                        }
                        if expired < limit {
                            break;
                        }
                    }
                    Err(err) if classify(&err).is_collision() => {
                        tracing::debug!(error = %err, "sweep collided; sweeping again");
                        crate::telemetry::collision_retry("sweep");
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "sweep failed; trying again next interval");
                        break;
                    }
                }
            }
        }
    })
}
