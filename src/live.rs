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
//! The trigger only notifies for watched inventories (see the migration), so
//! each subscription holds a row in `inventory_watchers` while it lives.

use std::time::Duration;

use futures::{StreamExt, stream::BoxStream};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, DbErr, FromQueryResult, Statement, sqlx::postgres::PgListener,
};
use tokio::{
    sync::{broadcast, watch},
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
}

impl Default for LiveStock {
    fn default() -> Self {
        Self { sender: broadcast::channel(BUFFER).0 }
    }
}

impl LiveStock {
    /// Listens on one connection until `stop` turns true, re-connecting after
    /// failures, and broadcasts every announcement.
    pub fn spawn_listener(&self, db: DatabaseConnection, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
        let sender = self.sender.clone();
        tokio::spawn(async move {
            let mut reconnect = false;
            loop {
                let listened = tokio::select! {
                    result = listen(&db, &sender, reconnect) => result,
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

    /// The committed states of inventory `id` from now on.
    pub async fn watch(&self, db: DatabaseConnection, id: Uuid) -> Result<BoxStream<'static, InventoryRow>, DbErr> {
        // Subscribe before the watcher row exists, so nothing announced
        // after the row commits can be missed.
        let receiver = self.sender.subscribe();
        let watcher = Watcher::register(db.clone(), id).await?;
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
    reconnect: bool,
) -> Result<(), sea_orm::sqlx::Error> {
    let mut listener = PgListener::connect_with(db.get_postgres_connection_pool()).await?;
    listener.listen(CHANNEL).await?;
    if reconnect {
        // Changes committed while no one listened were not announced: send
        // every watched inventory's current row once, so subscribers catch up.
        match watched_rows(db).await {
            Ok(rows) => rows.into_iter().for_each(|row| drop(sender.send(row))),
            Err(err) => tracing::warn!(error = %err, "could not resend watched inventories after reconnecting"),
        }
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

/// The current rows of every watched inventory.
async fn watched_rows(db: &DatabaseConnection) -> Result<Vec<InventoryRow>, DbErr> {
    InventoryRow::find_by_statement(Statement::from_string(
        DbBackend::Postgres,
        "SELECT id, sku, name, stock, version, created_at, updated_at FROM inventories \
          WHERE id IN (SELECT inventory_id FROM inventory_watchers)",
    ))
    .all(db)
    .await
}

/// A row in `inventory_watchers` for as long as a subscription lives.
struct Watcher {
    db: DatabaseConnection,
    id: Uuid,
}

impl Watcher {
    async fn register(db: DatabaseConnection, inventory_id: Uuid) -> Result<Self, DbErr> {
        let id = Uuid::new_v4();
        db.execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "INSERT INTO inventory_watchers (id, inventory_id) VALUES ($1, $2)",
            [id.into(), inventory_id.into()],
        ))
        .await?;
        Ok(Self { db, id })
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let (db, id) = (self.db.clone(), self.id);
        // A row left behind (the process died first) only costs NOTIFYs.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let stmt = Statement::from_sql_and_values(
                    DbBackend::Postgres,
                    "DELETE FROM inventory_watchers WHERE id = $1",
                    [id.into()],
                );
                if let Err(err) = db.execute_raw(stmt).await {
                    tracing::debug!(error = %err, "could not remove an inventory watcher");
                }
            });
        }
    }
}
