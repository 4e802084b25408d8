//! Connections for the one-statement reservations, kept out of sqlx's pool.
//!
//! sqlx 0.9's pool sends a round trip (`Sync`, wait for `ReadyForQuery`)
//! every time a connection goes back to it, and by default another before it
//! hands one out. For `reserve`, whose whole database work is one statement,
//! that made three round trips where one does: the profile of the SPREAD
//! benchmark showed the pool's acquire and release at a fifth of the server's
//! CPU, and PostgreSQL woke up three times per reservation. Here a connection
//! goes from one statement to the next with nothing in between; one that sat
//! idle for a while is pinged first, and one whose statement failed for any
//! reason but an SQL error is closed, not reused (a read-only server's 25006
//! counts as a failed connection: it is a standby now). Connections are
//! opened with the main pool's options as they are at that moment, so when
//! the pool follows a new primary (`db::primary`), the connections opened
//! before are closed instead of used again.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use sea_orm::{
    ConnAcquireErr, DatabaseConnection, DbErr, QueryResult, RuntimeErr,
    sqlx::{
        self, Connection as _, Postgres,
        postgres::{PgArguments, PgConnectOptions, PgConnection, PgPool},
        query::Query,
    },
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;

use super::{DbFailure, classify};
use crate::telemetry;

/// A connection idle for longer than this is pinged before its next statement,
/// so one that died in the quiet (a database restart) is replaced instead of
/// failing a request.
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// A small pool of connections for statements that run alone (no transaction).
#[derive(Clone)]
pub struct StatementPool {
    inner: Arc<Inner>,
}

struct Inner {
    /// How to open a connection: the main pool's options as they are now
    /// (host, `statement_timeout`, application name), or fixed ones.
    options: Options,
    /// One permit per connection, open or not; FIFO, so waiters are served in turn.
    permits: Arc<Semaphore>,
    /// Open connections nobody is using, with the moment they were put back
    /// and the options they were opened with.
    idle: Mutex<Vec<Idle>>,
    /// How long a statement waits for a connection before it fails as unavailable.
    acquire_timeout: Duration,
}

/// Where the options for a new connection come from.
enum Options {
    /// The main pool's current ones: they change when it follows a new primary.
    Follow(PgPool),
    /// Always these.
    Fixed(Arc<PgConnectOptions>),
}

impl Options {
    fn current(&self) -> Arc<PgConnectOptions> {
        match self {
            Self::Follow(pool) => pool.connect_options(),
            Self::Fixed(options) => options.clone(),
        }
    }
}

/// An idle connection.
struct Idle {
    conn: PgConnection,
    /// When it was put back.
    since: Instant,
    /// The options it was opened with.
    opened_with: Arc<PgConnectOptions>,
}

/// One leased connection; only [`Lease::give_back_unless_broken`] returns it
/// to the pool, so a lease dropped halfway through a statement closes its
/// connection.
struct Lease<'a> {
    /// The pool the connection goes back to.
    pool: &'a Inner,
    /// The connection, in use by one statement.
    conn: PgConnection,
    /// The options it was opened with.
    opened_with: Arc<PgConnectOptions>,
    /// The pool's permit for it, given up only after the connection is back.
    permit: OwnedSemaphorePermit,
}

impl StatementPool {
    /// A pool the size of `db`'s, opening connections the way `db` does.
    pub fn beside(db: &DatabaseConnection) -> Self {
        let pool = db.get_postgres_connection_pool();
        let (size, acquire_timeout) =
            (pool.options().get_max_connections() as usize, pool.options().get_acquire_timeout());
        Self::with(Options::Follow(pool.clone()), size, acquire_timeout)
    }

    /// A pool of at most `size` connections opened with `options`.
    pub fn new(options: PgConnectOptions, size: usize, acquire_timeout: Duration) -> Self {
        Self::with(Options::Fixed(Arc::new(options)), size, acquire_timeout)
    }

    fn with(options: Options, size: usize, acquire_timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                options,
                permits: Arc::new(Semaphore::new(size.max(1))),
                idle: Mutex::default(),
                acquire_timeout,
            }),
        }
    }

    /// Runs the statement `name` and returns its first row, if any.
    pub async fn fetch_optional(
        &self,
        name: &'static str,
        query: Query<'_, Postgres, PgArguments>,
    ) -> Result<Option<QueryResult>, DbErr> {
        async {
            let mut lease = self.inner.lease().await?;
            let result = query.fetch_optional(lease.conn()).await.map_err(query_err);
            lease.give_back_unless_broken(result.as_ref().err());
            result.map(|row| row.map(QueryResult::from))
        }
        .instrument(telemetry::statement(name))
        .await
    }

    /// Runs the statement `name` and returns all its rows.
    pub async fn fetch_all(
        &self,
        name: &'static str,
        query: Query<'_, Postgres, PgArguments>,
    ) -> Result<Vec<QueryResult>, DbErr> {
        async {
            let mut lease = self.inner.lease().await?;
            let result = query.fetch_all(lease.conn()).await.map_err(query_err);
            lease.give_back_unless_broken(result.as_ref().err());
            result.map(|rows| rows.into_iter().map(QueryResult::from).collect())
        }
        .instrument(telemetry::statement(name))
        .await
    }

    /// Open connections not in use right now.
    pub fn idle(&self) -> usize {
        self.inner.idle.lock().map_or(0, |idle| idle.len())
    }
}

impl Inner {
    async fn lease(&self) -> Result<Lease<'_>, DbErr> {
        let deadline = Instant::now() + self.acquire_timeout;
        let permit = tokio::time::timeout_at(deadline.into(), self.permits.clone().acquire_owned())
            .await
            .map_err(|_| DbErr::ConnectionAcquire(ConnAcquireErr::Timeout))?
            .map_err(|_| DbErr::ConnectionAcquire(ConnAcquireErr::ConnectionClosed))?;
        let options = self.options.current();
        // Newest first: the connection most likely to be alive and warm.
        while let Some(Idle { mut conn, since, opened_with }) = self.pop_idle() {
            if !Arc::ptr_eq(&opened_with, &options) {
                // Opened before the main pool moved to another primary.
                continue;
            }
            if since.elapsed() < PING_AFTER_IDLE {
                return Ok(Lease { pool: self, conn, opened_with, permit });
            }
            if let Ok(Ok(())) = tokio::time::timeout_at(deadline.into(), conn.ping()).await {
                return Ok(Lease { pool: self, conn, opened_with, permit });
            }
            // Dead or too slow: let it go and try the next.
        }
        // Generic plans only: the coalesced reserve's arrays change length
        // from batch to batch, and PostgreSQL, judging the plan for each
        // length cheaper than the generic one, would otherwise plan the
        // whole statement again for every small batch: measured at 490 µs
        // of backend CPU per reservation in batches of one or two, against
        // 65 µs with the generic plan (bench/results/decisions.md). No
        // sequential or bitmap scans: they would reach a batch's inventories
        // in the order their rows lie on disk, and the batch of distinct
        // inventories must update them in id order, as every writer locks
        // (`stock::DISTINCT_RESERVE_SQL`). Nothing run here needs either.
        // No JIT: a plan that must still scan a table without a usable
        // index carries the planner's penalty for a disabled scan, which
        // lifts its cost past `jit_above_cost`, and a generic plan is then
        // compiled on every execution (measured: 800 ms for a batch of four
        // on one inventory). These statements run for a millisecond; JIT
        // never pays for itself on them.
        let generic = (*options).clone().options([
            ("plan_cache_mode", "force_generic_plan"),
            ("enable_seqscan", "off"),
            ("enable_bitmapscan", "off"),
            ("jit", "off"),
        ]);
        let conn = tokio::time::timeout_at(deadline.into(), PgConnection::connect_with(&generic))
            .await
            .map_err(|_| DbErr::ConnectionAcquire(ConnAcquireErr::Timeout))?
            .map_err(conn_err)?;
        Ok(Lease { pool: self, conn, opened_with: options, permit })
    }

    fn pop_idle(&self) -> Option<Idle> {
        self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner).pop()
    }
}

impl Lease<'_> {
    fn conn(&mut self) -> &mut PgConnection {
        &mut self.conn
    }

    /// Puts the connection back unless `error` says it may be broken. An SQL
    /// error (a constraint, a collision) leaves it ready for the next
    /// statement; a lost connection, a terminated backend (57P01 arrives as an
    /// SQL error) or a protocol error does not.
    fn give_back_unless_broken(self, error: Option<&DbErr>) {
        let Self { pool, conn, opened_with, permit } = self;
        if error.is_none_or(|err| classify(err) != DbFailure::Unavailable) {
            let idle = Idle { conn, since: Instant::now(), opened_with };
            pool.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(idle);
        }
        // The permit last: a waiter it wakes finds the connection idle.
        drop(permit);
    }
}

fn conn_err(err: sqlx::Error) -> DbErr {
    DbErr::Conn(RuntimeErr::SqlxError(err.into()))
}

fn query_err(err: sqlx::Error) -> DbErr {
    DbErr::Query(RuntimeErr::SqlxError(err.into()))
}
