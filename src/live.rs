//! Live changes: the feeds behind `Subscription.inventoryChanged` and
//! `Subscription.orderChanged`, fed by PostgreSQL LISTEN/NOTIFY.
//!
//! Triggers NOTIFY inside the changing transaction, so only committed states
//! are announced, in commit order. Each server process keeps one listening
//! connection ([`Live`]) for the channels of every feed and fans the
//! announcements out in memory through a bounded broadcast channel per feed
//! ([`Feed`]): a subscriber that falls behind skips ahead (and is sent the
//! latest row) instead of slowing the others or any writer. The listener
//! reconnects by itself when the database goes away, then resends every
//! watched row's current state, so nothing committed in the gap is lost.
//!
//! This module knows no feature: a feature describes the rows it follows
//! as a [`Source`] (its trigger's channels and watcher table, how an
//! announcement reads as a row, how rows are read afresh), and the
//! composition root (`server.rs`) makes a feed of it.
//!
//! PostgreSQL serializes the commits of every transaction that NOTIFYs, so
//! the triggers only notify for watched rows (see the migrations): each
//! watched inventory or order holds a row in `inventory_watchers` or
//! `order_watchers` while this process has a subscription of it (see
//! [`Watched`]), and only a row that exists can be watched.
//!
//! A checkout changes an inventory's `reserved` and `committed` without
//! changing its row; its trigger announces only the inventory's id (on
//! `inventory_states_changed`, a source's `ids` channel), and the
//! subscriptions of that inventory read the row afresh, so what they send
//! is never older than what they sent before.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicI32, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, future::BoxFuture, stream::BoxStream};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, sqlx::postgres::PgListener};
use tokio::{
    sync::{Mutex, broadcast, watch},
    task::JoinHandle,
};
use uuid::Uuid;

/// Announcements buffered per feed and process before slow subscribers skip ahead.
const BUFFER: usize = 4096;

/// A row a feed follows.
pub(crate) trait Followed: Clone + Send + Sync + 'static {
    /// The row's id, as its announcements and watcher rows name it.
    fn id(&self) -> Uuid;
    /// Its version: grows with every committed change.
    fn version(&self) -> i32;
    /// Whether the row can no longer change, so following it ends.
    fn is_final(&self) -> bool;
}

/// Reads the rows with these ids as they are committed now (missing ones
/// are left out).
pub(crate) type Read<T> =
    Arc<dyn Fn(DatabaseConnection, Vec<Uuid>) -> BoxFuture<'static, Result<Vec<T>, DbErr>> + Send + Sync>;

/// What a feature tells Live about the rows it follows.
pub(crate) struct Source<T> {
    /// The table of watcher rows its trigger consults (`inventory_watchers`).
    pub watchers: &'static str,
    /// The watched row's id column in it (`inventory_id`).
    pub key: &'static str,
    /// The channel its trigger announces a committed row on (as JSON).
    pub rows: &'static str,
    /// The channel that announces the id alone of a row that changed in a
    /// way the row does not show, to be read afresh, if there is one.
    pub ids: Option<&'static str>,
    /// The row an announcement on `rows` carries.
    pub parse: fn(&str) -> Result<T, String>,
    /// Reads rows afresh.
    pub read: Read<T>,
}

/// One committed change as the listener heard it.
#[derive(Debug, Clone)]
enum Heard<T> {
    /// The row as committed.
    Row(T),
    /// The row with this id changed in a way it does not show: read it afresh.
    Moved(Uuid),
}

/// The in-process fan-out of one kind of row's committed changes.
pub(crate) struct Feed<T> {
    /// The changes heard.
    heard: broadcast::Sender<Heard<T>>,
    /// The rows this process watches.
    watched: Arc<Watched>,
    /// Where the rows come from.
    source: Arc<Source<T>>,
}

impl<T> Clone for Feed<T> {
    fn clone(&self) -> Self {
        Self { heard: self.heard.clone(), watched: self.watched.clone(), source: self.source.clone() }
    }
}

/// Why a subscription could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WatchError {
    /// No row has this id; nothing was registered.
    #[error("no row has this id")]
    NotFound,
    /// The database failed.
    #[error(transparent)]
    Db(#[from] DbErr),
}

impl<T: Followed> Feed<T> {
    /// The row `id` as committed now, if it exists.
    async fn read_one(&self, db: &DatabaseConnection, id: Uuid) -> Result<Option<T>, DbErr> {
        Ok((self.source.read)(db.clone(), vec![id]).await?.into_iter().next())
    }

    /// Every committed state of row `id` from now on, as announced; refused
    /// for a row that does not exist.
    pub(crate) async fn watch(&self, db: DatabaseConnection, id: Uuid) -> Result<BoxStream<'static, T>, WatchError> {
        if self.read_one(&db, id).await?.is_none() {
            return Err(WatchError::NotFound);
        }
        // Subscribe before the watcher row exists, so nothing announced
        // after the row commits can be missed.
        let receiver = self.heard.subscribe();
        let watcher = self.watched.register(&db, id).await?;
        let feed = self.clone();
        let changes = futures::stream::unfold((receiver, watcher), move |(mut receiver, watcher)| {
            let (db, feed) = (db.clone(), feed.clone());
            async move {
                loop {
                    let fresh = match receiver.recv().await {
                        Ok(Heard::Row(row)) if row.id() == id => return Some((row, (receiver, watcher))),
                        Ok(Heard::Moved(moved)) if moved == id => true,
                        Ok(_) => false,
                        // Fell behind: skip to the latest committed row.
                        Err(broadcast::error::RecvError::Lagged(skipped)) => {
                            tracing::debug!(skipped, %id, "slow subscriber skipped ahead");
                            true
                        }
                        Err(broadcast::error::RecvError::Closed) => return None,
                    };
                    if fresh && let Ok(Some(row)) = feed.read_one(&db, id).await {
                        return Some((row, (receiver, watcher)));
                    }
                }
            }
        });
        Ok(changes.boxed())
    }

    /// The committed states of `row` (as the caller was shown it) from now
    /// on, each once and newer than the last, in commit order; the stream
    /// ends after a final state, and at once for a row already final. Who
    /// may follow is the caller's decision.
    pub(crate) async fn follow(&self, db: DatabaseConnection, row: &T) -> Result<BoxStream<'static, T>, DbErr> {
        if row.is_final() {
            return Ok(futures::stream::empty().boxed());
        }
        let id = row.id();
        let receiver = self.heard.subscribe();
        let watcher = self.watched.register(&db, id).await?;
        // A change committed after the caller read the row but before the
        // watcher row committed was not announced: read it again now.
        let missed = self.read_one(&db, id).await?.filter(|latest| latest.version() > row.version());
        let state = (receiver, watcher, row.version(), missed, false);
        let feed = self.clone();
        let changes = futures::stream::unfold(state, move |(mut receiver, watcher, mut seen, mut missed, done)| {
            let (db, feed) = (db.clone(), feed.clone());
            async move {
                if done {
                    return None;
                }
                loop {
                    let latest = match missed.take() {
                        Some(row) => row,
                        None => match receiver.recv().await {
                            Ok(Heard::Row(row)) if row.id() == id => row,
                            Ok(Heard::Moved(moved)) if moved == id => match feed.read_one(&db, id).await {
                                Ok(Some(row)) => row,
                                _ => continue,
                            },
                            Ok(_) => continue,
                            Err(broadcast::error::RecvError::Lagged(skipped)) => {
                                tracing::debug!(skipped, %id, "slow follower skipped ahead");
                                match feed.read_one(&db, id).await {
                                    Ok(Some(row)) => row,
                                    _ => continue,
                                }
                            }
                            Err(broadcast::error::RecvError::Closed) => return None,
                        },
                    };
                    // A state read afresh may come again as its announcement.
                    if latest.version() <= seen {
                        continue;
                    }
                    seen = latest.version();
                    let done = latest.is_final();
                    return Some((latest, (receiver, watcher, seen, None, done)));
                }
            }
        });
        Ok(changes.boxed())
    }
}

/// A feed as the listener drives it, whatever its rows.
trait Hearing: Send + Sync {
    /// The channels it listens on.
    fn channels(&self) -> Vec<&'static str>;
    /// Broadcasts an announcement on one of its channels.
    fn hear(&self, channel: &str, payload: &str);
    /// The rows it watches.
    fn watched(&self) -> &Watched;
    /// Broadcasts the current state of the rows `ids`.
    fn resend<'a>(&'a self, db: &'a DatabaseConnection, ids: Vec<Uuid>) -> BoxFuture<'a, Result<(), DbErr>>;
}

impl<T: Followed> Hearing for Feed<T> {
    fn channels(&self) -> Vec<&'static str> {
        std::iter::once(self.source.rows).chain(self.source.ids).collect()
    }

    fn hear(&self, channel: &str, payload: &str) {
        // No receivers is fine: nobody in this process is watching.
        if channel == self.source.rows {
            match (self.source.parse)(payload) {
                Ok(row) => drop(self.heard.send(Heard::Row(row))),
                Err(err) => tracing::warn!(error = %err, channel, "unreadable announcement"),
            }
        } else {
            match payload.parse::<Uuid>() {
                Ok(id) => drop(self.heard.send(Heard::Moved(id))),
                Err(err) => tracing::warn!(error = %err, channel, "unreadable announcement of an id"),
            }
        }
    }

    fn watched(&self) -> &Watched {
        &self.watched
    }

    fn resend<'a>(&'a self, db: &'a DatabaseConnection, ids: Vec<Uuid>) -> BoxFuture<'a, Result<(), DbErr>> {
        Box::pin(async move {
            for row in (self.source.read)(db.clone(), ids).await? {
                drop(self.heard.send(Heard::Row(row)));
            }
            Ok(())
        })
    }
}

/// One listening connection per process for every feed made with [`Live::feed`].
#[derive(Clone)]
pub(crate) struct Live {
    /// This process in the watcher tables.
    process: Uuid,
    /// The feeds, in the order they were made.
    feeds: Vec<Arc<dyn Hearing>>,
}

impl Default for Live {
    fn default() -> Self {
        Self { process: Uuid::new_v4(), feeds: Vec::new() }
    }
}

impl Live {
    /// A feed of the rows `source` describes, heard by this listener.
    pub(crate) fn feed<T: Followed>(&mut self, source: Source<T>) -> Feed<T> {
        let kind = Kind { table: source.watchers, key: source.key };
        let feed = Feed {
            heard: broadcast::channel(BUFFER).0,
            watched: Arc::new(Watched::new(self.process, kind)),
            source: Arc::new(source),
        };
        self.feeds.push(Arc::new(feed.clone()));
        feed
    }

    /// Listens on one connection until `stop` turns true, re-connecting after
    /// failures, and broadcasts every announcement.
    pub(crate) fn spawn_listener(&self, db: DatabaseConnection, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
        let live = self.clone();
        tokio::spawn(async move {
            let mut reconnect = false;
            loop {
                let listened = tokio::select! {
                    result = live.listen(&db, reconnect) => result,
                    _ = stop.changed() => return,
                };
                reconnect = true;
                if let Err(err) = listened {
                    tracing::warn!(error = %err, "the live listener stopped; listening again");
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = stop.changed() => return,
                }
            }
        })
    }

    /// One listening connection: LISTEN on every channel, register the
    /// watched rows with it, then broadcast until the connection is lost.
    /// A registration that fails ends it too, so that it is tried again on
    /// a fresh connection: without its watcher rows (gone after a crash
    /// restart or a failover: the tables are unlogged) nothing this process
    /// watches would be announced.
    async fn listen(&self, db: &DatabaseConnection, reconnect: bool) -> Result<(), ListenError> {
        let mut listener = PgListener::connect_with(db.get_postgres_connection_pool()).await?;
        // Asked and registered before LISTEN, so that the connection's last
        // statement (what `pg_stat_activity` shows) stays the LISTEN. The
        // watcher rows are written on this connection, not the pool's: in
        // an outage requests hold the pool, and a listener waiting behind
        // them would leave its subscribers without announcements.
        let pid: i32 = sea_orm::sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut listener).await?;
        let mut watched = Vec::with_capacity(self.feeds.len());
        for feed in &self.feeds {
            watched.push(feed.watched().listening_on(&mut listener, pid).await.map_err(register)?);
        }
        let channels: Vec<&str> = self.feeds.iter().flat_map(|feed| feed.channels()).collect();
        listener.listen_all(channels).await?;
        // Changes committed while no one listened were not announced: after
        // a reconnect, send every watched row's current state once (read
        // after LISTEN, so nothing falls in between), so subscribers catch up.
        if reconnect {
            for (feed, ids) in self.feeds.iter().zip(watched) {
                feed.resend(db, ids).await.map_err(register)?;
            }
        }
        loop {
            // `None`: the connection was lost; announcements may have been missed
            // while it was, so start over with a fresh LISTEN.
            let Some(notification) = listener.try_recv().await? else {
                return Err(ListenError::Lost(sea_orm::sqlx::Error::Protocol(
                    "the listening connection closed".into(),
                )));
            };
            let channel = notification.channel();
            match self.feeds.iter().find(|feed| feed.channels().contains(&channel)) {
                Some(feed) => feed.hear(channel, notification.payload()),
                None => tracing::warn!(channel, "an announcement on a channel nobody listens to"),
            }
        }
    }
}

/// Why a listening connection ended.
#[derive(Debug, thiserror::Error)]
enum ListenError {
    /// The connection could not be opened or was lost.
    #[error("the listening connection failed: {0}")]
    Lost(#[from] sea_orm::sqlx::Error),
    /// The watched rows could not be registered with it, or not read for the catch-up.
    #[error("could not register the watched rows with the listener: {0}")]
    Register(String),
}

fn register(err: impl std::fmt::Display) -> ListenError {
    ListenError::Register(err.to_string())
}

/// What is watched: the table of watcher rows and its key column.
struct Kind {
    /// `inventory_watchers` or `order_watchers`.
    table: &'static str,
    /// The watched row's id column in it.
    key: &'static str,
}

/// The rows of one kind this process watches, and their rows in the
/// kind's watcher table: one row per (process, watched row) however many
/// subscriptions share it, carrying the backend pid of this process's
/// listening connection, so that rows of a process that died (whose
/// listener is gone from `pg_stat_activity`) are found and removed by the
/// next process that starts listening.
struct Watched {
    /// This process in the watcher tables.
    process: Uuid,
    /// What is watched.
    kind: Kind,
    /// Subscriptions per watched row. A tokio mutex, held across the
    /// statement that adds or removes a watcher row, so that a watcher row is
    /// never removed while a subscription that needs it is starting.
    counts: Mutex<HashMap<Uuid, usize>>,
    /// The backend pid of the current listening connection (0 before the first).
    listener_pid: AtomicI32,
}

impl Watched {
    fn new(process: Uuid, kind: Kind) -> Self {
        Self { process, kind, counts: Mutex::default(), listener_pid: AtomicI32::new(0) }
    }

    /// One more subscription of `id`; its watcher row is written by the first.
    async fn register(self: &Arc<Self>, db: &DatabaseConnection, id: Uuid) -> Result<Watcher, DbErr> {
        let mut counts = self.counts.lock().await;
        let count = counts.entry(id).or_default();
        if *count == 0 {
            let Kind { table, key } = &self.kind;
            let written = db
                .execute_raw(Statement::from_sql_and_values(
                    DbBackend::Postgres,
                    format!(
                        "INSERT INTO {table} (process_id, {key}, listener_pid) VALUES ($1, $2, $3) \
                         ON CONFLICT DO NOTHING"
                    ),
                    [self.process.into(), id.into(), self.listener_pid.load(Ordering::Acquire).into()],
                ))
                .await;
            if let Err(err) = written {
                counts.remove(&id);
                return Err(err);
            }
        }
        *count += 1;
        Ok(Watcher { watched: self.clone(), db: db.clone(), id })
    }

    /// One subscription fewer; the last one removes the watcher row.
    async fn unregister(&self, db: &DatabaseConnection, id: Uuid) {
        let mut counts = self.counts.lock().await;
        let Some(count) = counts.get_mut(&id) else { return };
        *count -= 1;
        if *count > 0 {
            return;
        }
        counts.remove(&id);
        let Kind { table, key } = &self.kind;
        let removed = db
            .execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                format!("DELETE FROM {table} WHERE process_id = $1 AND {key} = $2"),
                [self.process.into(), id.into()],
            ))
            .await;
        if let Err(err) = removed {
            tracing::debug!(error = %err, table, "could not remove a watcher");
        }
    }

    /// A new listening connection (backend `pid`) has started: removes the
    /// watcher rows of processes whose listener is gone, writes this
    /// process's rows afresh (a failover's new primary has none: the tables
    /// are unlogged), and returns the ids this process watches.
    async fn listening_on(&self, listener: &mut PgListener, pid: i32) -> Result<Vec<Uuid>, sea_orm::sqlx::Error> {
        let counts = self.counts.lock().await;
        self.listener_pid.store(pid, Ordering::Release);
        let ids: Vec<Uuid> = counts.keys().copied().collect();
        // One statement, so the rows of this process are never half replaced.
        // (Its parts see one snapshot, so a row is updated in place rather
        // than deleted and inserted again.)
        let Kind { table, key } = &self.kind;
        let sql = format!(
            r#"
WITH stale AS (
    DELETE FROM {table}
     WHERE (process_id = $1 AND {key} <> ALL ($3))
        OR (process_id <> $1 AND listener_pid <> ALL (SELECT pid FROM pg_stat_activity))
)
INSERT INTO {table} (process_id, {key}, listener_pid)
SELECT $1, id, $2 FROM unnest($3::uuid[]) AS w(id)
    ON CONFLICT (process_id, {key}) DO UPDATE SET listener_pid = excluded.listener_pid"#
        );
        sea_orm::sqlx::query(sea_orm::sqlx::AssertSqlSafe(sql))
            .bind(self.process)
            .bind(pid)
            .bind(&ids)
            .execute(&mut *listener)
            .await?;
        Ok(ids)
    }
}

/// One subscription's hold on its watcher row.
struct Watcher {
    watched: Arc<Watched>,
    db: DatabaseConnection,
    id: Uuid,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let (watched, db, id) = (self.watched.clone(), self.db.clone(), self.id);
        // Without a runtime (the process is ending) the row stays: the next
        // process to listen removes it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { watched.unregister(&db, id).await });
        }
    }
}
