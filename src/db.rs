//! The database: connecting (creating the database when it is missing, and
//! following the primary among several hosts, see [`primary`]), the releases
//! Stockguard runs on and the local server it may use ([`local`]), migrating,
//! and the one place where database errors are classified.
//!
//! Every write path in Stockguard is safe to re-run, because its conditions
//! are checked again by the statement itself. So a collision (SQLSTATE 40001
//! serialization failure, 40P01 deadlock) is re-run a bounded number of times
//! by [`Collisions::run`] instead of being reported as a crash. A read that
//! builds an answer runs once more, in a transaction that cannot collide
//! ([`read_answer!`]), so the retryable error that collisions end in is only
//! ever answered by a request that wrote nothing.

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use migration::{Migrator, MigratorTrait};
use sea_orm::{
    AccessMode, ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr,
    IsolationLevel, RuntimeErr, Statement, TransactionTrait, sqlx,
};
use tokio::sync::Mutex;
use uuid::Uuid;

use crate::config::DatabaseConfig;

pub mod local;
pub(crate) mod primary;
mod statements;
pub(crate) use primary::Primary;
pub use statements::StatementPool;

/// What a database error means to Stockguard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbFailure {
    /// 23505: a unique index refused the row; names the constraint.
    UniqueViolation(Option<String>),
    /// 23514: a CHECK constraint refused the row.
    CheckViolation(Option<String>),
    /// 22003: a number left its column's range (e.g. stock past `i32::MAX`).
    OutOfRange,
    /// 40001: serialization failure; the statement or transaction may be re-run.
    SerializationFailure,
    /// 40P01: deadlock detected; may be re-run.
    Deadlock,
    /// 55P03: `lock_timeout` ran out (or NOWAIT found the row locked).
    LockNotAvailable,
    /// 57014: `statement_timeout` ran out or the statement was cancelled.
    StatementTimeout,
    /// 42P04: `CREATE DATABASE` of a name that exists.
    DuplicateDatabase,
    /// The server could not be reached, the connection was lost, no pooled
    /// connection was free in time, or the server refused a write because it
    /// is read-only (25006: a standby, after a failover).
    Unavailable,
    /// Anything else: a bug or a broken database.
    Other,
}

impl DbFailure {
    /// A short name for logs and metric labels.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Self::UniqueViolation(_) => "unique_violation",
            Self::CheckViolation(_) => "check_violation",
            Self::OutOfRange => "out_of_range",
            Self::SerializationFailure => "serialization_failure",
            Self::Deadlock => "deadlock",
            Self::LockNotAvailable => "lock_timeout",
            Self::StatementTimeout => "statement_timeout",
            Self::DuplicateDatabase => "duplicate_database",
            Self::Unavailable => "unavailable",
            Self::Other => "other",
        }
    }

    /// Whether re-running the same statement or transaction may succeed.
    pub fn is_collision(&self) -> bool {
        matches!(self, Self::SerializationFailure | Self::Deadlock)
    }
}

/// Classifies a SeaORM error; the one place that knows SQLSTATEs.
pub fn classify(err: &DbErr) -> DbFailure {
    let runtime = match err {
        DbErr::ConnectionAcquire(_) => return DbFailure::Unavailable,
        DbErr::Conn(e) | DbErr::Exec(e) | DbErr::Query(e) => e,
        _ => return DbFailure::Other,
    };
    let sqlx_err = match runtime {
        RuntimeErr::SqlxError(e) => e.as_ref(),
        _ => return DbFailure::Other,
    };
    match sqlx_err {
        sqlx::Error::Database(db) => {
            let constraint = db.constraint().map(str::to_owned);
            match db.code().as_deref() {
                Some("23505") => DbFailure::UniqueViolation(constraint),
                Some("23514") => DbFailure::CheckViolation(constraint),
                Some("22003") => DbFailure::OutOfRange,
                Some("40001") => DbFailure::SerializationFailure,
                Some("40P01") => DbFailure::Deadlock,
                Some("55P03") => DbFailure::LockNotAvailable,
                Some("57014") => DbFailure::StatementTimeout,
                Some("42P04") => DbFailure::DuplicateDatabase,
                // 25006 read_only_sql_transaction: the server is (now) a
                // standby, or was set read-only. Nothing was written; the
                // primary is elsewhere or coming back, so this is an outage
                // the client may retry, not a bug.
                Some("25006") => DbFailure::Unavailable,
                // 08xxx connection exceptions; 57P01..57P03: the backend was
                // terminated, the server is shutting down or not yet accepting.
                Some(code) if code.starts_with("08") || code.starts_with("57P") => DbFailure::Unavailable,
                // 53300 too_many_connections: the server (or the database's
                // connection limit) is full for the moment.
                Some("53300") => DbFailure::Unavailable,
                _ => DbFailure::Other,
            }
        }
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => DbFailure::Unavailable,
        _ => DbFailure::Other,
    }
}

/// Re-runs statements that collided, a bounded number of times.
///
/// After a first collision the re-runs on one key (an inventory id) queue on an
/// in-process lock: under REPEATABLE READ and SERIALIZABLE every writer that
/// waited for a hot row fails together when the holder commits, and if they all
/// came back at once they would collide again. In the queue each re-run starts
/// with a fresh snapshot and meets only newcomers, so the herd drains.
#[derive(Clone)]
pub struct Collisions {
    /// Lock stripes: a key maps to one stripe, so memory stays fixed however
    /// many inventories there are. A tokio mutex, because the statement is
    /// awaited while it is held.
    stripes: Arc<[Mutex<()>]>,
    /// Runs of one statement before the collision is reported.
    max_attempts: u32,
}

/// How a collision-guarded run ended.
pub(crate) enum Attempted<T> {
    /// The statement ran (after one or more runs).
    Done(T),
    /// Every attempt collided.
    Exhausted {
        /// How many runs were made.
        attempts: u32,
    },
}

impl<T> Attempted<T> {
    /// What the statement returned, or [`Exhausted`] when every run collided.
    /// Each operation answers `Exhausted` with its one outcome, listed at
    /// `Limits::collision_attempts`: the conflict member of its union with
    /// the latest rows where it has one, else `DATABASE_UNAVAILABLE`
    /// (`AppError`'s `From<Exhausted>`).
    pub(crate) fn done(self) -> Result<T, Exhausted> {
        match self {
            Self::Done(value) => Ok(value),
            Self::Exhausted { attempts } => Err(Exhausted { attempts }),
        }
    }
}

/// Every run of a statement collided (40001 or 40P01), so nothing it would
/// have written was written; the same request may succeed when retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exhausted {
    /// How many runs were made.
    pub attempts: u32,
}

impl Collisions {
    const STRIPES: usize = 256;

    /// A policy of at most `max_attempts` runs per statement.
    pub fn new(max_attempts: u32) -> Self {
        let stripes = (0..Self::STRIPES).map(|_| Mutex::new(())).collect::<Vec<_>>();
        Self { stripes: stripes.into(), max_attempts: max_attempts.max(1) }
    }

    /// Runs `statement` until it does not collide or the attempts are used up.
    /// Errors that are not collisions are returned at once.
    pub(crate) async fn run<T, F, Fut>(&self, key: Uuid, mut statement: F) -> Result<Attempted<T>, DbErr>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, DbErr>>,
    {
        let stripe = &self.stripes[(key.as_u128() % Self::STRIPES as u128) as usize];
        for attempt in 1..=self.max_attempts {
            let _queued = if attempt > 1 { Some(stripe.lock().await) } else { None };
            match statement().await {
                Ok(value) => return Ok(Attempted::Done(value)),
                Err(err) if classify(&err).is_collision() => {
                    tracing::debug!(attempt, error = %err, "collision, re-running");
                    crate::telemetry::db_failure(classify(&err).label());
                    crate::telemetry::collision_retry("statement");
                }
                Err(err) => return Err(err),
            }
        }
        tracing::warn!(attempts = self.max_attempts, %key, "collision retries exhausted");
        Ok(Attempted::Exhausted { attempts: self.max_attempts })
    }
}

/// Runs a read that builds an answer: `$read`, a future of `Result<_,
/// DbErr>` that reads through `$conn`, with `$conn` bound to `$db` (a
/// `&DatabaseConnection`); after a collision (40001, 40P01), once more with
/// `$conn` bound to a `REPEATABLE READ READ ONLY` transaction
/// ([`read_only`]). Written `read_answer!(&self.db, |db| store::find(db, id))`.
///
/// At SERIALIZABLE, PostgreSQL may abort a statement that only reads when
/// it would close a cycle of read/write dependencies among concurrent
/// transactions. Most of these reads run after a mutation's write has
/// committed (its answer's fields, what a statement that wrote nothing
/// meant), so answered as the retryable `DATABASE_UNAVAILABLE` that abort
/// would tell the client to repeat a write that is done: a transfer moved
/// twice, a reservation held twice. A read-only REPEATABLE READ transaction
/// is never aborted for serialization, and sees every commit before it,
/// the request's own write included. At the other levels a read never
/// collides, so the first run is the only one and costs what the read does.
///
/// For reads on the pool only: a statement that collided inside a
/// transaction has doomed that transaction, and re-running it is the
/// transaction's own retries' work.
macro_rules! read_answer {
    ($db:expr, |$conn:ident| $read:expr) => {{
        let pool: &sea_orm::DatabaseConnection = $db;
        let first = {
            let $conn = pool;
            $read.await
        };
        match first {
            Err(err) if $crate::db::classify(&err).is_collision() => {
                async {
                    let txn = $crate::db::read_only(pool, &err).await?;
                    let value = {
                        let $conn = &txn;
                        $read.await
                    }?;
                    txn.commit().await?;
                    Ok::<_, sea_orm::DbErr>(value)
                }
                .await
            }
            first => first,
        }
    }};
}
pub(crate) use read_answer;

/// A `REPEATABLE READ READ ONLY` transaction on `db`, in which a read that
/// `collided` runs again ([`read_answer!`]).
pub(crate) async fn read_only(db: &DatabaseConnection, collided: &DbErr) -> Result<DatabaseTransaction, DbErr> {
    let failure = classify(collided);
    tracing::debug!(error = %collided, "a read collided, reading again in a read-only transaction");
    crate::telemetry::db_failure(failure.label());
    crate::telemetry::collision_retry("read");
    db.begin_with_config(Some(IsolationLevel::RepeatableRead), Some(AccessMode::ReadOnly)).await
}

/// Splits `postgres://.../name?x` into the URL of the `postgres` maintenance
/// database and `name`.
fn split_database_name(url: &str) -> Option<(String, String)> {
    let (before_query, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let (server, name) = before_query.rsplit_once('/')?;
    if name.is_empty() || server.ends_with('/') {
        return None;
    }
    let mut admin = format!("{server}/postgres");
    if let Some(q) = query {
        admin.push('?');
        admin.push_str(q);
    }
    Some((admin, name.to_owned()))
}

/// The hosts of `url`, and the URL of the one to connect to first: the
/// first that accepts writes when there are several (tried for at most
/// `timeout`), else the one given.
async fn pick_host(url: &str, timeout: Duration) -> Result<(Primary, String), DbErr> {
    let target = primary::parse(url).map_err(|err| DbErr::Custom(err.to_string()))?;
    let primary = Primary::new(&target).map_err(conn_err)?;
    if !primary.has_alternatives() {
        return Ok((primary, target.hosts[0].clone()));
    }
    let template: sqlx::postgres::PgConnectOptions = target.hosts[0].parse().map_err(conn_err)?;
    let (index, probe) = primary.find(&template, timeout, Instant::now() + timeout).await.map_err(conn_err)?;
    drop(probe);
    Ok((primary, target.hosts[index].clone()))
}

fn conn_err(err: sqlx::Error) -> DbErr {
    DbErr::Conn(RuntimeErr::SqlxError(err.into()))
}

/// Creates the database named in `url` when it does not exist yet.
pub async fn ensure_database(url: &str) -> Result<(), DbErr> {
    let Some((admin_url, name)) = split_database_name(url) else {
        return Ok(());
    };
    let timeout = Duration::from_secs(5);
    let (_, admin_url) = pick_host(&admin_url, timeout).await?;
    let mut opts = ConnectOptions::new(admin_url);
    opts.max_connections(1).sqlx_logging(false).connect_timeout(timeout);
    let admin = Database::connect(opts).await?;
    let exists = admin
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT 1 FROM pg_database WHERE datname = $1",
            [name.clone().into()],
        ))
        .await?
        .is_some();
    if !exists {
        let quoted = name.replace('"', "\"\"");
        match admin.execute_unprepared(&format!("CREATE DATABASE \"{quoted}\"")).await {
            Ok(_) => tracing::info!(database = %name, "created database"),
            // Another process created it between our look and our CREATE.
            Err(err) if classify(&err) == DbFailure::DuplicateDatabase => {}
            Err(err) => return Err(err),
        }
    }
    admin.close().await
}

/// Opens the pool. Every connection gets the `statement_timeout`, so no
/// statement can hold a connection (and its locks) for longer, and runs
/// without JIT (`jit = off`; the pools beside it inherit both). With several
/// hosts (or `target_session_attrs=read-write`) the pool follows the primary
/// (see [`primary`]).
///
/// Every statement here runs for milliseconds, so JIT never pays for
/// itself, and PostgreSQL compiles a plan anew at every execution whose
/// estimated cost passes `jit_above_cost`, which a plan made without
/// statistics easily does: on 2.8 million reservations never analyzed,
/// the sweep (finding nothing due) compiled 141 functions in 620 ms every
/// second, two thirds of a core taken from the requests for as long as the
/// tables went unanalyzed (bench/results/decisions.md, "JIT").
pub async fn connect(url: &str, config: &DatabaseConfig) -> Result<DatabaseConnection, DbErr> {
    let (primary, first) = pick_host(url, config.acquire_timeout()).await?;
    let mut opts = ConnectOptions::new(first);
    opts.max_connections(config.pool_size)
        .min_connections(1)
        .acquire_timeout(config.acquire_timeout())
        .connect_timeout(config.acquire_timeout())
        .statement_timeout(config.statement_timeout())
        .set_application_name("stockguard")
        .map_sqlx_postgres_opts(|options| options.options([("jit", "off")]))
        // sqlx pings every connection it hands out by default: a round trip
        // per transaction. Only one that sat idle (it may have died) is worth one.
        .test_before_acquire_if_idle_for(Duration::from_secs(1))
        .sqlx_logging(false);
    // A connection opened before the pool moved to a new primary is closed
    // instead of being handed out or kept; a new one must reach a server
    // that accepts writes, when that is required.
    let on_acquire = primary.clone();
    opts.map_sqlx_postgres_before_acquire(move |_, meta| {
        let keep = on_acquire.keep(&meta);
        Box::pin(async move { Ok(keep) })
    });
    let hooks = primary.clone();
    opts.map_sqlx_postgres_pool_opts(move |pool| {
        let (on_connect, on_release) = (hooks.clone(), hooks.clone());
        pool.after_connect(move |conn, _| {
            let primary = on_connect.clone();
            Box::pin(async move { primary.check_new(conn).await })
        })
        .after_release(move |_, meta| {
            let keep = on_release.keep(&meta);
            Box::pin(async move { Ok(keep) })
        })
    });
    let db = Database::connect(opts).await?;
    if primary.has_alternatives() {
        primary.watch(db.get_postgres_connection_pool().clone(), config.acquire_timeout());
    }
    Ok(db)
}

/// Returns once everything committed before it, on the server `db` reaches,
/// is as durable as a commit of this process: flushed, and held by the
/// synchronous standby where one is required. For an answer that reports
/// a write another request made (a replay of an idempotency key, an order
/// already cancelled): the commit that made it may not be.
///
/// A commit that waits for its standby is shown to no one, but once the
/// wait is cut short (its backend ended, the postmaster killed) it is done
/// locally, and a primary restarted after a crash shows what its own WAL
/// holds, sent or not. A first attempt cut off so (its client saw an
/// error) is visible to the client's retry; a replay read from it
/// acknowledged a write that a failover after it undid (`examples/failover`,
/// kill-primary: an order lost). A transaction that writes WAL commits
/// after every commit it could see, and its commit waits for the WAL up to
/// its own record to be flushed and replicated: a transactional logical
/// message is the least WAL there is (no table, no lock, allowed to every
/// role).
pub(crate) async fn durable(db: &impl ConnectionTrait) -> Result<(), DbErr> {
    db.execute_unprepared("SELECT pg_logical_emit_message(true, 'stockguard', 'durable')").await.map(drop)
}

/// A small pool beside `db`'s, for background work that must never take a
/// connection a request waits for: the same server and settings, named
/// `name` in `pg_stat_activity`, at most `size` connections, opened only
/// when used and closed after a second idle (an idle shop's processes hold
/// none: PostgreSQL's connections are shared by every process). Its
/// connections run with `settings` (PostgreSQL parameters, as `SET` would
/// take them).
///
/// It follows the primary as `db`'s pool does ([`primary`]): it has that
/// pool's hooks (a connection opened before the primary moved is not used
/// again; a new one must reach a server that takes writes), and [`follow`]
/// points it at the host the watcher moved `db`'s pool to. Made with the
/// options of the moment only, a side pool went on connecting to the old
/// primary after a failover, and the events stopped until the process
/// restarted.
pub(crate) fn side_pool(
    db: &DatabaseConnection,
    name: &str,
    size: u32,
    settings: &[(&str, &str)],
) -> DatabaseConnection {
    let pool = db.get_postgres_connection_pool();
    let options = pool.connect_options().as_ref().clone().application_name(name).options(settings.iter().copied());
    let side = pool
        .options()
        .clone()
        .max_connections(size)
        .min_connections(0)
        .idle_timeout(Duration::from_secs(1))
        .connect_lazy_with(options);
    follow(pool.clone(), side.clone());
    sea_orm::SqlxPostgresConnector::from_sqlx_postgres_pool(side)
}

/// How often a side pool looks whether the server pool has moved.
const FOLLOW_EVERY: Duration = Duration::from_millis(250);

/// Points `side`'s new connections at the host `server`'s connect to, from
/// now until either pool closes: the primary's watcher moves `server`'s
/// pool only.
fn follow(server: sqlx::PgPool, side: sqlx::PgPool) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep(FOLLOW_EVERY) => {}
                () = server.close_event() => return,
                () = side.close_event() => return,
            }
            let (to, from) = (server.connect_options(), side.connect_options());
            if (to.get_host(), to.get_port()) != (from.get_host(), from.get_port()) {
                side.set_connect_options(from.as_ref().clone().host(to.get_host()).port(to.get_port()));
            }
        }
    });
}

/// Applies pending migrations. An advisory lock makes server processes that
/// start together take turns instead of racing on the same DDL.
pub async fn migrate(db: &DatabaseConnection) -> Result<(), DbErr> {
    const MIGRATION_LOCK: i64 = 0x5354_4f43_4b47; // "STOCKG"
    // A session-level lock is held by one connection, so take one connection
    // for the lock, the migration and the unlock.
    let conn = db.get_postgres_connection_pool();
    let mut lock_conn = conn.acquire().await.map_err(|e| DbErr::Conn(RuntimeErr::SqlxError(e.into())))?;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *lock_conn)
        .await
        .map_err(|e| DbErr::Exec(RuntimeErr::SqlxError(e.into())))?;
    let result = Migrator::up(db, None).await;
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *lock_conn)
        .await
        .map_err(|e| DbErr::Exec(RuntimeErr::SqlxError(e.into())))?;
    result
}

/// The readiness check's own connection, outside the pools: `/readyz` must
/// say whether the database takes writes, not queue behind a pool that busy
/// requests hold (a load balancer would take a merely busy process out).
#[derive(Clone)]
pub struct ReadyProbe {
    /// The main pool, for its current connect options (its current primary).
    pool: sqlx::PgPool,
    /// The probe's connection and the options it was opened with; taken out
    /// while in use, so one cut off by a timeout is never used again.
    conn: Arc<Mutex<Option<Opened>>>,
}

/// A connection and the options it was opened with.
type Opened = (sqlx::postgres::PgConnection, Arc<sqlx::postgres::PgConnectOptions>);

impl ReadyProbe {
    /// A probe of the server `db`'s pool connects to.
    pub(crate) fn beside(db: &DatabaseConnection) -> Self {
        Self { pool: db.get_postgres_connection_pool().clone(), conn: Arc::default() }
    }

    /// Whether the database answers within `timeout` and accepts writes
    /// (`transaction_read_only` off: not a standby, not set read-only).
    pub(crate) async fn is_ready(&self, timeout: Duration) -> bool {
        use sqlx::Connection as _;
        let mut slot = self.conn.lock().await;
        let options = self.pool.connect_options();
        let kept = slot.take().filter(|(_, opened_with)| Arc::ptr_eq(opened_with, &options));
        let checked = tokio::time::timeout(timeout, async {
            let mut conn = match kept {
                Some((conn, _)) => conn,
                None => sqlx::postgres::PgConnection::connect_with(&options).await.ok()?,
            };
            let writable = primary::accepts_writes(&mut conn).await.ok()?;
            Some((conn, writable))
        })
        .await;
        match checked {
            Ok(Some((conn, writable))) => {
                *slot = Some((conn, options));
                writable
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

    use super::*;

    #[test]
    fn database_name_is_split_from_the_url() {
        assert_eq!(
            split_database_name("postgres://u@h:5432/shop?sslmode=disable"),
            Some(("postgres://u@h:5432/postgres?sslmode=disable".into(), "shop".into()))
        );
        assert_eq!(split_database_name("postgres://u@h:5432/"), None);
    }

    /// Fails with a serialization failure (40001) unless it runs in a
    /// `REPEATABLE READ READ ONLY` transaction: a read as PostgreSQL's
    /// serializable checks abort it, on any server and at any level.
    const COLLIDES_UNLESS_READ_ONLY: &str = "DO $$ BEGIN
        IF current_setting('transaction_isolation') <> 'repeatable read'
           OR current_setting('transaction_read_only') <> 'on' THEN
            RAISE EXCEPTION 'a collision forced by the test' USING ERRCODE = 'serialization_failure';
        END IF;
    END $$";

    #[tokio::test]
    async fn a_read_that_collides_is_read_once_more_where_it_cannot_and_other_failures_are_not() {
        let url = format!("{}/postgres", stockguard_support::database::server_url());
        let db = Database::connect(url).await.expect("connect");
        let runs = AtomicU32::new(0);

        let collided = read_answer!(&db, |conn| {
            runs.fetch_add(1, SeqCst);
            conn.execute_unprepared(COLLIDES_UNLESS_READ_ONLY)
        });
        assert!(collided.is_ok(), "read again read-only: {collided:?}");
        assert_eq!(runs.swap(0, SeqCst), 2, "one run more after the collision");

        let read = read_answer!(&db, |conn| {
            runs.fetch_add(1, SeqCst);
            conn.execute_unprepared("SELECT 1")
        });
        assert!(read.is_ok(), "{read:?}");
        assert_eq!(runs.swap(0, SeqCst), 1, "a read that succeeds runs once");

        let failed = read_answer!(&db, |conn| {
            runs.fetch_add(1, SeqCst);
            conn.execute_unprepared("SELECT 1 / 0")
        });
        assert_eq!(failed.as_ref().map_err(classify).err(), Some(DbFailure::Other), "{failed:?}");
        assert_eq!(runs.load(SeqCst), 1, "only a collision is read again");
        db.close().await.expect("close");
    }
}
