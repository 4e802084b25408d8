//! Live changes: `Subscription.inventoryChanged` and
//! `Subscription.orderChanged`, fed by PostgreSQL LISTEN/NOTIFY.
//!
//! Triggers NOTIFY inside the changing transaction, so only committed states
//! are announced, in commit order. Each server process keeps one listening
//! connection for every channel and fans the announcements out in memory
//! through a bounded broadcast channel per feed (stock, orders): a
//! subscriber that falls behind skips ahead (and is sent the latest row)
//! instead of slowing the others or any writer. The listener reconnects by
//! itself when the database goes away, then resends every watched row's
//! current state, so nothing committed in the gap is lost.
//!
//! PostgreSQL serializes the commits of every transaction that NOTIFYs, so
//! the triggers only notify for watched rows (see the migrations): each
//! watched inventory or order holds a row in `inventory_watchers` or
//! `order_watchers` while this process has a subscription of it (see
//! [`Watched`]), and only a row that exists can be watched.
//!
//! A checkout changes an inventory's `reserved` and `committed` without
//! changing its row; its trigger announces only the inventory's id (on
//! `inventory_states_changed`), and the subscriptions of that inventory
//! read the row afresh, so what they send is never older than what they sent
//! before.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicI32, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, stream::BoxStream};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, sqlx::postgres::PgListener};
use tokio::{
    sync::{Mutex, broadcast, watch},
    task::JoinHandle,
};
use uuid::Uuid;

use crate::{
    inventory::{InventoryRow, store as inventory_store},
    orders::{
        domain::Order,
        entity::{Model as OrderRow, OrderStatus},
        store as order_store,
    },
};

/// The channel the inventory trigger announces a changed row on (the row as JSON).
const INVENTORY_CHANGED: &str = "inventory_changed";

/// The channel a checkout's trigger announces an inventory on whose states
/// changed without its row (the id alone).
const INVENTORY_STATES_CHANGED: &str = "inventory_states_changed";

/// The channel the order trigger announces a changed row on (the row as JSON).
const ORDER_CHANGED: &str = "order_changed";

/// Announcements buffered per feed and process before slow subscribers skip ahead.
const BUFFER: usize = 4096;

/// One committed inventory change as the listener heard it.
#[derive(Debug, Clone)]
enum Heard {
    /// The row as committed.
    Row(InventoryRow),
    /// The inventory with this id changed in a way its row does not show
    /// (a checkout moved units from `reserved` to `committed`): read it afresh.
    Moved(Uuid),
}

/// The in-process fan-out of committed inventory and order changes.
#[derive(Clone)]
pub struct Live {
    /// Inventory changes.
    stock: broadcast::Sender<Heard>,
    /// Order changes, as orders.
    orders: broadcast::Sender<Order>,
    /// The inventories this process watches.
    watched_inventories: Arc<Watched>,
    /// The orders this process watches.
    watched_orders: Arc<Watched>,
}

impl Default for Live {
    fn default() -> Self {
        let process = Uuid::new_v4();
        Self {
            stock: broadcast::channel(BUFFER).0,
            orders: broadcast::channel(BUFFER).0,
            watched_inventories: Arc::new(Watched::new(process, &INVENTORIES)),
            watched_orders: Arc::new(Watched::new(process, &ORDERS)),
        }
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

impl Live {
    /// Listens on one connection until `stop` turns true, re-connecting after
    /// failures, and broadcasts every announcement.
    pub fn spawn_listener(&self, db: DatabaseConnection, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
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
        let receiver = self.stock.subscribe();
        let watcher = self.watched_inventories.register(&db, id).await?;
        let changes = futures::stream::unfold((receiver, watcher), move |(mut receiver, watcher)| {
            let db = db.clone();
            async move {
                loop {
                    let fresh = match receiver.recv().await {
                        Ok(Heard::Row(row)) if row.id == id => return Some((row, (receiver, watcher))),
                        Ok(Heard::Moved(moved)) if moved == id => true,
                        Ok(_) => false,
                        // Fell behind: skip to the latest committed row.
                        Err(broadcast::error::RecvError::Lagged(skipped)) => {
                            tracing::debug!(skipped, %id, "slow subscriber skipped ahead");
                            true
                        }
                        Err(broadcast::error::RecvError::Closed) => return None,
                    };
                    if fresh && let Ok(Some(row)) = inventory_store::find(&db, id).await {
                        return Some((row, (receiver, watcher)));
                    }
                }
            }
        });
        Ok(changes.boxed())
    }

    /// The committed states of `order` (as the caller was shown it) from
    /// now on, each once, in commit order; the stream ends after a final
    /// state (CANCELLED, FULFILLED), and at once for an order already final.
    /// Who may watch is the caller's decision.
    pub async fn watch_order(&self, db: DatabaseConnection, order: &Order) -> Result<BoxStream<'static, Order>, DbErr> {
        if is_final(order) {
            return Ok(futures::stream::empty().boxed());
        }
        let id = order.id;
        let receiver = self.orders.subscribe();
        let watcher = self.watched_orders.register(&db, id).await?;
        // A change committed after the caller read the order but before the
        // watcher row committed was not announced: read it again now.
        let missed = order_store::find(&db, id).await?.filter(|latest| latest.version > order.version);
        let state = (receiver, watcher, order.version, missed, false);
        let changes = futures::stream::unfold(state, move |(mut receiver, watcher, mut seen, mut missed, done)| {
            let db = db.clone();
            async move {
                if done {
                    return None;
                }
                loop {
                    let latest = match missed.take() {
                        Some(order) => order,
                        None => match receiver.recv().await {
                            Ok(order) if order.id == id => order,
                            Ok(_) => continue,
                            Err(broadcast::error::RecvError::Lagged(skipped)) => {
                                tracing::debug!(skipped, %id, "slow order subscriber skipped ahead");
                                match order_store::find(&db, id).await {
                                    Ok(Some(order)) => order,
                                    _ => continue,
                                }
                            }
                            Err(broadcast::error::RecvError::Closed) => return None,
                        },
                    };
                    // A state read afresh may come again as its announcement.
                    if latest.version <= seen {
                        continue;
                    }
                    seen = latest.version;
                    let done = is_final(&latest);
                    return Some((latest, (receiver, watcher, seen, None, done)));
                }
            }
        });
        Ok(changes.boxed())
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
        let inventories = self.watched_inventories.listening_on(&mut listener, pid).await.map_err(register)?;
        let orders = self.watched_orders.listening_on(&mut listener, pid).await.map_err(register)?;
        listener.listen_all([INVENTORY_CHANGED, INVENTORY_STATES_CHANGED, ORDER_CHANGED]).await?;
        let registered = async {
            // Changes committed while no one listened were not announced:
            // after a reconnect, send every watched row's current state once
            // (read after LISTEN, so nothing falls in between), so
            // subscribers catch up.
            if reconnect {
                inventory_store::find_many(db, inventories).await?.into_iter().for_each(|row| {
                    drop(self.stock.send(Heard::Row(row)));
                });
                order_store::find_many(db, &orders).await?.into_iter().for_each(|order| drop(self.orders.send(order)));
            }
            Ok::<_, DbErr>(())
        };
        registered.await.map_err(register)?;
        loop {
            // `None`: the connection was lost; announcements may have been missed
            // while it was, so start over with a fresh LISTEN.
            let Some(notification) = listener.try_recv().await? else {
                return Err(ListenError::Lost(sea_orm::sqlx::Error::Protocol(
                    "the listening connection closed".into(),
                )));
            };
            // No receivers is fine: nobody in this process is watching.
            let payload = notification.payload();
            match notification.channel() {
                // The trigger sends the row as committed, one key per column.
                INVENTORY_CHANGED => match serde_json::from_str::<InventoryRow>(payload) {
                    Ok(row) => drop(self.stock.send(Heard::Row(row))),
                    Err(err) => tracing::warn!(error = %err, "unreadable inventory announcement"),
                },
                INVENTORY_STATES_CHANGED => match payload.parse::<Uuid>() {
                    Ok(id) => drop(self.stock.send(Heard::Moved(id))),
                    Err(err) => tracing::warn!(error = %err, "unreadable inventory states announcement"),
                },
                ORDER_CHANGED => match serde_json::from_str::<OrderRow>(payload).map(Order::reconstitute) {
                    Ok(Ok(order)) => drop(self.orders.send(order)),
                    Ok(Err(err)) => tracing::warn!(error = %err, "an announced order breaks the order rules"),
                    Err(err) => tracing::warn!(error = %err, "unreadable order announcement"),
                },
                channel => tracing::warn!(channel, "an announcement on a channel nobody listens to"),
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

/// Whether `order` can no longer change.
fn is_final(order: &Order) -> bool {
    matches!(order.status(), OrderStatus::Cancelled | OrderStatus::Fulfilled)
}

/// What is watched: the table of watcher rows and its key column.
struct Kind {
    /// `inventory_watchers` or `order_watchers`.
    table: &'static str,
    /// The watched row's id column in it.
    key: &'static str,
}

/// Watched inventories.
const INVENTORIES: Kind = Kind { table: "inventory_watchers", key: "inventory_id" };

/// Watched orders.
const ORDERS: Kind = Kind { table: "order_watchers", key: "order_id" };

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
    kind: &'static Kind,
    /// Subscriptions per watched row. A tokio mutex, held across the
    /// statement that adds or removes a watcher row, so that a watcher row is
    /// never removed while a subscription that needs it is starting.
    counts: Mutex<HashMap<Uuid, usize>>,
    /// The backend pid of the current listening connection (0 before the first).
    listener_pid: AtomicI32,
}

impl Watched {
    fn new(process: Uuid, kind: &'static Kind) -> Self {
        Self { process, kind, counts: Mutex::default(), listener_pid: AtomicI32::new(0) }
    }

    /// One more subscription of `id`; its watcher row is written by the first.
    async fn register(self: &Arc<Self>, db: &DatabaseConnection, id: Uuid) -> Result<Watcher, DbErr> {
        let mut counts = self.counts.lock().await;
        let count = counts.entry(id).or_default();
        if *count == 0 {
            let Kind { table, key } = self.kind;
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
        let Kind { table, key } = self.kind;
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
        let Kind { table, key } = self.kind;
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
