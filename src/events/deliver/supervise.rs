//! Supervising endpoints: every process leases the endpoints nobody holds
//! and runs one task per endpoint it holds (`endpoint.rs`), starting again
//! the task of one whose task ended (its lease lost, or a panic), and gives
//! its leases back when it stops.

use std::{collections::HashMap, time::Duration};

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, Value};
use tokio::{
    sync::watch,
    task::{self, JoinSet},
};
use uuid::Uuid;

use super::{Delivering, endpoint::serve};

/// Leases, as `me`, the endpoints nobody holds (or `me` holds) and starts
/// a task for each one not already served here, every `poll`, until
/// `stop`; then waits (briefly) for the tasks to record what they sent, and
/// gives the leases back. Leasing goes through `requests` (the requests'
/// pool, open anyway); the endpoints' tasks work on `db`. The tasks end
/// with it, even when it panics ([`Serving`] aborts them when dropped), so
/// the dispatcher started again as the same `me` serves each endpoint once.
pub(crate) async fn run(
    requests: DatabaseConnection,
    db: DatabaseConnection,
    delivering: Delivering,
    me: Uuid,
    stop: watch::Receiver<bool>,
) {
    let mut serving = Serving::default();
    let mut stop_outer = stop.clone();
    // New endpoints are looked for about as often as an idle pump looks,
    // and this process's leases renewed at least three times a lease:
    // a task renews its lease only between attempts, and an attempt may
    // outlast a short lease, which would let another process send the
    // same delivery at the same time.
    let every = delivering.poll.max(crate::events::pump::IDLE).min(delivering.lease / 3);
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
