//! The state every request shares: the pools, the token keys, the limits and
//! the collision policy. Cheap to clone; each server process has one. It
//! knows no feature: what a feature keeps at run time (the coalescer, live
//! stock) is wired by the composition root, `server.rs`.

use std::sync::{Arc, atomic::AtomicBool};

use sea_orm::DatabaseConnection;

use crate::{
    auth::Keys,
    config::Limits,
    db::{Collisions, ReadyProbe, StatementPool},
};

/// Shared state of one server process.
#[derive(Clone)]
pub struct AppState {
    /// The connection pool.
    pub db: DatabaseConnection,
    /// Connections for one-statement reservations (no per-use round trip).
    pub(crate) statements: StatementPool,
    /// Signs and verifies bearer tokens (shared: the state is cloned for
    /// every request, and keys and limits are the large part of it).
    pub(crate) keys: Arc<Keys>,
    /// The API's limits.
    pub(crate) limits: Arc<Limits>,
    /// Re-runs collided statements.
    pub(crate) collisions: Collisions,
    /// `/readyz`'s own database connection.
    pub(crate) ready: ReadyProbe,
    /// Set when the process is about to stop (SIGTERM with a shutdown
    /// delay): `/readyz` answers 503 so load balancers send no new
    /// requests, while every request that still comes is served.
    pub(crate) draining: Arc<AtomicBool>,
}

impl AppState {
    /// State over `db` with `keys` and `limits`.
    pub fn new(db: DatabaseConnection, keys: Keys, limits: Limits) -> Self {
        let collisions = Collisions::new(limits.collision_attempts);
        let statements = StatementPool::beside(&db);
        let ready = ReadyProbe::beside(&db);
        Self {
            db,
            statements,
            keys: Arc::new(keys),
            limits: Arc::new(limits),
            collisions,
            ready,
            draining: Arc::default(),
        }
    }
}
