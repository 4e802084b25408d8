//! The state every request shares: the pools, the token keys, the limits, the
//! collision policy, live stock and the coalescer. Cheap to clone; each server
//! process has one.

use std::time::Duration;

use sea_orm::DatabaseConnection;
use tokio::{sync::watch, task::JoinHandle};

use crate::{
    auth::Keys,
    config::Limits,
    db::{Collisions, StatementPool},
    live::LiveStock,
    reservations::{coalesce::Coalescer, sweeper},
};

/// Shared state of one server process.
#[derive(Clone)]
pub struct AppState {
    /// The connection pool.
    pub db: DatabaseConnection,
    /// Connections for one-statement reservations (no per-use round trip).
    pub statements: StatementPool,
    /// Signs and verifies bearer tokens.
    pub keys: Keys,
    /// The API's limits.
    pub limits: Limits,
    /// Re-runs collided statements.
    pub collisions: Collisions,
    /// Committed inventory changes, for subscriptions.
    pub live: LiveStock,
    /// Batches concurrent conditional reservations of one inventory.
    pub coalescer: Coalescer,
}

impl AppState {
    /// State over `db` with `keys` and `limits`.
    pub fn new(db: DatabaseConnection, keys: Keys, limits: Limits) -> Self {
        let collisions = Collisions::new(limits.collision_attempts);
        let statements = StatementPool::beside(&db);
        let coalescer = Coalescer::new(
            db.clone(),
            statements.clone(),
            collisions.clone(),
            limits.coalesce_max_batch,
            Duration::from_micros(limits.coalesce_window_us),
            limits.reservation_ttl_secs,
        );
        Self { db, statements, keys, limits, collisions, live: LiveStock::default(), coalescer }
    }

    /// Starts the background work of a server process: the sweeper and the
    /// live-stock listener.
    pub fn spawn_workers(&self) -> Workers {
        let (stop, stopped) = watch::channel(false);
        let sweeper = sweeper::spawn(
            self.db.clone(),
            Duration::from_millis(self.limits.sweep_interval_ms),
            self.limits.sweep_batch,
            stopped.clone(),
        );
        let listener = self.live.spawn_listener(self.db.clone(), stopped);
        Workers { stop, tasks: vec![sweeper, listener] }
    }
}

/// The background tasks of a server process.
pub struct Workers {
    /// Turns true to ask the tasks to stop between steps.
    stop: watch::Sender<bool>,
    /// The tasks, awaited on shutdown.
    tasks: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Asks every task to stop and waits until they have.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// The shared state from a resolver's context; the schema is always built with it.
pub fn state<'a>(ctx: &async_graphql::Context<'a>) -> &'a AppState {
    ctx.data_unchecked::<AppState>()
}
