//! Live stock: `Subscription.inventoryChanged`, fed by PostgreSQL
//! LISTEN/NOTIFY.
//!
//! A trigger NOTIFYs inside the changing transaction, so only committed states
//! are announced, in commit order. Each server process keeps one listening
//! connection and fans the announcements out in memory through a bounded
//! broadcast channel: a subscriber that falls behind skips ahead (and is sent
//! the latest row) instead of slowing the others or any writer. The listener
//! reconnects by itself when the database goes away, then resends every
//! watched inventory's current row, so nothing committed in the gap is lost.
//!
//! The trigger only notifies for watched inventories (see the migrations),
//! so each watched inventory holds a row in `inventory_watchers` while this
//! process has a subscription of it (see [`Watched`]), and only an
//! inventory that exists can be watched.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicI32, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, stream::BoxStream};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, DbErr, FromQueryResult, Statement, sqlx::postgres::PgListener,
};
use tokio::{
    sync::{Mutex, broadcast, watch},
    task::JoinHandle,
};
use uuid::Uuid;

use crate::inventory::{InventoryRow, store as inventory_store};

/// The NOTIFY channel the trigger announces on.
const CHANNEL: &str = "inventory_changed";

/// Announcements buffered per process before slow subscribers skip ahead.
const BUFFER: usize = 4096;

/// The in-process fan-out of committed inventory changes.
#[derive(Clone)]
pub struct LiveStock {
    sender: broadcast::Sender<InventoryRow>,
    watched: Arc<Watched>,
}

impl Default for LiveStock {
    fn default() -> Self {
        Self { sender: broadcast::channel(BUFFER).0, watched: Arc::new(Watched::new()) }
    }
}

/// Why a subscription could not start.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// No inventory has this id; nothing was registered.
    #[error("no inventory has this id")]
    NotFound,
    /// The database failed.
    #[error(transparent)]
    Db(#[from] DbErr),
}

impl LiveStock {
    /// Listens on one connection until `stop` turns true, re-connecting after
    /// failures, and broadcasts every announcement.
    pub fn spawn_listener(&self, db: DatabaseConnection, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
        let (sender, watched) = (self.sender.clone(), self.watched.clone());
        tokio::spawn(async move {
            let mut reconnect = false;
            loop {
                let listened = tokio::select! {
                    result = listen(&db, &sender, &watched, reconnect) => result,
                    _ = stop.changed() => return,
                };
                reconnect = true;
                if let Err(err) = listened {
                    tracing::warn!(error = %err, "live stock listener lost its connection; reconnecting");
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = stop.changed() => return,
                }
            }
        })
    }

    /// The committed states of inventory `id` from now on; refused for an
    /// inventory that does not exist.
    pub async fn watch(
        &self,
        db: DatabaseConnection,
        id: Uuid,
    ) -> Result<BoxStream<'static, InventoryRow>, WatchError> {
        if inventory_store::find(&db, id).await?.is_none() {
            return Err(WatchError::NotFound);
        }
        // Subscribe before the watcher row exists, so nothing announced
        // after the row commits can be missed.
        let receiver = self.sender.subscribe();
        let watcher = self.watched.register(&db, id).await?;
        let changes = futures::stream::unfold((receiver, watcher), move |(mut receiver, watcher)| {
            let db = db.clone();
            async move {
                loop {
                    match receiver.recv().await {
                        Ok(row) if row.id == id => return Some((row, (receiver, watcher))),
                        Ok(_) => {}
                        // Fell behind: skip to the latest committed row.
                        Err(broadcast::error::RecvError::Lagged(skipped)) => {
                            tracing::debug!(skipped, %id, "slow subscriber skipped ahead");
                            if let Ok(Some(row)) = inventory_store::find(&db, id).await {
                                return Some((row, (receiver, watcher)));
                            }
                        }
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            }
        });
        Ok(changes.boxed())
    }
}

async fn listen(
    db: &DatabaseConnection,
    sender: &broadcast::Sender<InventoryRow>,
    watched: &Watched,
    reconnect: bool,
) -> Result<(), sea_orm::sqlx::Error> {
    let mut listener = PgListener::connect_with(db.get_postgres_connection_pool()).await?;
    // Asked before LISTEN, so that the connection's last statement (what
    // `pg_stat_activity` shows) stays the LISTEN.
    let pid: i32 = sea_orm::sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut listener).await?;
    listener.listen(CHANNEL).await?;
    match watched.listening_on(db, pid).await {
        // Changes committed while no one listened were not announced: after a
        // reconnect, send every watched inventory's current row once, so
        // subscribers catch up.
        Ok(rows) if reconnect => rows.into_iter().for_each(|row| drop(sender.send(row))),
        Ok(_) => {}
        Err(err) => tracing::warn!(error = %err, "could not register the watched inventories with the new listener"),
    }
    loop {
        // `None`: the connection was lost; announcements may have been missed
        // while it was, so start over with a fresh LISTEN.
        let Some(notification) = listener.try_recv().await? else {
            return Err(sea_orm::sqlx::Error::Protocol("the listening connection closed".into()));
        };
        // The trigger sends the row as committed, one key per column.
        match serde_json::from_str::<InventoryRow>(notification.payload()) {
            // No receivers is fine: nobody in this process is watching.
            Ok(row) => drop(sender.send(row)),
            Err(err) => tracing::warn!(error = %err, "unreadable inventory announcement"),
        }
    }
}

/// The inventories this process watches, and their rows in
/// `inventory_watchers`: one row per (process, inventory) however many
/// subscriptions share it, carrying the backend pid of this process's
/// listening connection, so that rows of a process that died (whose
/// listener is gone from `pg_stat_activity`) are found and removed by the
/// next process that starts listening.
struct Watched {
    /// This process in `inventory_watchers`.
    process: Uuid,
    /// Subscriptions per watched inventory. A tokio mutex, held across the
    /// statement that adds or removes a row, so that a row is never removed
    /// while a subscription that needs it is starting.
    counts: Mutex<HashMap<Uuid, usize>>,
    /// The backend pid of the current listening connection (0 before the first).
    listener_pid: AtomicI32,
}

impl Watched {
    fn new() -> Self {
        Self { process: Uuid::new_v4(), counts: Mutex::default(), listener_pid: AtomicI32::new(0) }
    }

    /// One more subscription of `inventory_id`; its row is written by the first.
    async fn register(self: &Arc<Self>, db: &DatabaseConnection, inventory_id: Uuid) -> Result<Watcher, DbErr> {
        let mut counts = self.counts.lock().await;
        let count = counts.entry(inventory_id).or_default();
        if *count == 0 {
            let written = db
                .execute_raw(Statement::from_sql_and_values(
                    DbBackend::Postgres,
                    "INSERT INTO inventory_watchers (process_id, inventory_id, listener_pid) VALUES ($1, $2, $3) \
                     ON CONFLICT DO NOTHING",
                    [self.process.into(), inventory_id.into(), self.listener_pid.load(Ordering::Acquire).into()],
                ))
                .await;
            if let Err(err) = written {
                counts.remove(&inventory_id);
                return Err(err);
            }
        }
        *count += 1;
        Ok(Watcher { watched: self.clone(), db: db.clone(), inventory_id })
    }

    /// One subscription fewer; the last one removes the row.
    async fn unregister(&self, db: &DatabaseConnection, inventory_id: Uuid) {
        let mut counts = self.counts.lock().await;
        let Some(count) = counts.get_mut(&inventory_id) else { return };
        *count -= 1;
        if *count > 0 {
            return;
        }
        counts.remove(&inventory_id);
        let removed = db
            .execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "DELETE FROM inventory_watchers WHERE process_id = $1 AND inventory_id = $2",
                [self.process.into(), inventory_id.into()],
            ))
            .await;
        if let Err(err) = removed {
            tracing::debug!(error = %err, "could not remove an inventory watcher");
        }
    }

    /// A new listening connection (backend `pid`) has started: removes the
    /// rows of processes whose listener is gone, writes this process's rows
    /// afresh (a failover's new primary has none: the table is unlogged),
    /// and returns the current rows of the inventories this process watches.
    async fn listening_on(&self, db: &DatabaseConnection, pid: i32) -> Result<Vec<InventoryRow>, DbErr> {
        let counts = self.counts.lock().await;
        self.listener_pid.store(pid, Ordering::Release);
        let ids: Vec<Uuid> = counts.keys().copied().collect();
        // One statement, so the rows of this process are never half replaced.
        // (Its parts see one snapshot, so a row is updated in place rather
        // than deleted and inserted again.)
        const SQL: &str = r#"
WITH stale AS (
    DELETE FROM inventory_watchers
     WHERE (process_id = $1 AND inventory_id <> ALL ($3))
        OR (process_id <> $1 AND listener_pid <> ALL (SELECT pid FROM pg_stat_activity))
), fresh AS (
    INSERT INTO inventory_watchers (process_id, inventory_id, listener_pid)
    SELECT $1, inventory_id, $2 FROM unnest($3::uuid[]) AS w(inventory_id)
        ON CONFLICT (process_id, inventory_id) DO UPDATE SET listener_pid = excluded.listener_pid
)
SELECT id, sku, name, stock, version, created_at, updated_at FROM inventories WHERE id = ANY($3)"#;
        InventoryRow::find_by_statement(Statement::from_sql_and_values(
            DbBackend::Postgres,
            SQL,
            [self.process.into(), pid.into(), ids.into()],
        ))
        .all(db)
        .await
    }
}

/// One subscription's hold on its inventory's watcher row.
struct Watcher {
    watched: Arc<Watched>,
    db: DatabaseConnection,
    inventory_id: Uuid,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let (watched, db, inventory_id) = (self.watched.clone(), self.db.clone(), self.inventory_id);
        // Without a runtime (the process is ending) the row stays: the next
        // process to listen removes it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { watched.unregister(&db, inventory_id).await });
        }
    }
}
