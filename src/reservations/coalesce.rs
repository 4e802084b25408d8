//! Request coalescing for hot items.
//!
//! One row takes only one committed change per WAL flush, so a hot item is
//! capped by commit latency however fast the server is. Conditional `reserve`
//! calls (no `expectedVersion`, no idempotency key) waiting on the same
//! inventory are therefore served together: while one batch runs, later
//! callers queue; the next batch takes them all (up to a maximum) and one
//! statement grants them in arrival order against the locked stock, writes
//! every granted reservation and ledger row, and answers each caller as if the
//! batch had run one request at a time: its own stock after, and a version one
//! higher per granted reservation before it. An idle inventory costs nothing:
//! its queue exists only while requests for it are in flight, and no queue
//! outgrows the server's limit of requests in flight.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use sea_orm::{DatabaseConnection, DbErr};
use tokio::sync::oneshot;
use uuid::Uuid;

use super::{
    ReservationRow, ReservationStatus,
    service::{self, ReserveOutcome, ReserveRequest},
    store,
};
use crate::{
    db::{Attempted, Collisions, StatementPool},
    error::AppError,
    stock::taking::{CoalescedReserve, Turn},
};

/// One caller waiting for its batch.
struct Waiting {
    /// The caller (token `sub`).
    user_id: String,
    /// Units asked for.
    quantity: i32,
    /// When it joined the queue.
    arrived: Instant,
    /// Where its answer goes.
    reply: oneshot::Sender<Result<ReserveOutcome, AppError>>,
}

/// The queues of inventories with requests in flight. A std mutex, not a
/// tokio one: it is held only to push or swap a vector, never across an await.
type Queues = Arc<Mutex<HashMap<Uuid, Vec<Waiting>>>>;

/// Serves conditional reservations of the same inventory in batches.
#[derive(Clone)]
pub struct Coalescer {
    /// For the reads of a caller served alone.
    db: DatabaseConnection,
    /// Where the statements run (one round trip each).
    statements: StatementPool,
    /// Re-runs collided statements.
    collisions: Collisions,
    /// The callers waiting, per inventory.
    queues: Queues,
    /// Most callers one statement serves.
    max_batch: usize,
    /// How long a batch may wait for more callers after its first arrived.
    window: Duration,
    /// Seconds until new reservations expire (0 = never).
    ttl_secs: i32,
}

impl Coalescer {
    /// A coalescer over `db` that runs its statements on `statements`.
    pub fn new(
        db: DatabaseConnection,
        statements: StatementPool,
        collisions: Collisions,
        max_batch: usize,
        window: Duration,
        ttl_secs: i32,
    ) -> Self {
        Self { db, statements, collisions, queues: Arc::default(), max_batch: max_batch.max(1), window, ttl_secs }
    }

    /// How many callers of `inventory_id` wait in its queue right now (not
    /// counting the one whose statement runs), for tests that must see
    /// callers queued before they go on.
    pub fn queued(&self, inventory_id: Uuid) -> usize {
        let queues = self.queues.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        queues.get(&inventory_id).map_or(0, Vec::len)
    }

    /// Reserves `quantity` of `inventory_id` for `user_id`, together with any
    /// other callers of the same inventory.
    pub async fn reserve(&self, inventory_id: Uuid, user_id: &str, quantity: i32) -> Result<ReserveOutcome, AppError> {
        let queued = {
            let mut queues = self.queues.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match queues.get_mut(&inventory_id) {
                Some(queue) => {
                    let (reply, answer) = oneshot::channel();
                    queue.push(Waiting { user_id: user_id.to_owned(), quantity, arrived: Instant::now(), reply });
                    Some(answer)
                }
                None => {
                    queues.insert(inventory_id, Vec::new());
                    None
                }
            }
        };
        if let Some(answer) = queued {
            return answer.await.unwrap_or(Err(AppError::Internal));
        }
        if self.window.is_zero() {
            // First in: serve itself at once, in its own task (no hand-over
            // to another task and back); whoever queues meanwhile is served
            // next, as one batch, when `_next` is dropped, even if this
            // caller goes away halfway.
            let _next = HandOver { coalescer: self, inventory_id };
            return self.alone(inventory_id, user_id, quantity).await;
        }
        // A batch that waits for company runs in its own task, so a caller
        // that goes away cannot strand the others.
        let (reply, answer) = oneshot::channel();
        let first = Waiting { user_id: user_id.to_owned(), quantity, arrived: Instant::now(), reply };
        tokio::spawn(self.clone().serve(inventory_id, vec![first]));
        answer.await.unwrap_or(Err(AppError::Internal))
    }

    /// Runs batches for one inventory until its queue is empty, then removes it.
    async fn serve(self, inventory_id: Uuid, mut batch: Vec<Waiting>) {
        loop {
            if !self.window.is_zero() && batch.len() < self.max_batch {
                let deadline = batch[0].arrived + self.window;
                tokio::time::sleep_until(deadline.into()).await;
                batch.extend(self.take(inventory_id, self.max_batch - batch.len()));
            }
            self.run(inventory_id, batch).await;
            match self.next_batch(inventory_id) {
                Some(next) => batch = next,
                None => return,
            }
        }
    }

    /// The next batch of `inventory_id`; when nobody is queued, the queue is
    /// removed under the same lock, so the next caller leads a new one.
    fn next_batch(&self, inventory_id: Uuid) -> Option<Vec<Waiting>> {
        let mut queues = self.queues.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match queues.get_mut(&inventory_id) {
            Some(queue) if queue.is_empty() => {
                queues.remove(&inventory_id);
                None
            }
            Some(queue) => {
                let n = queue.len().min(self.max_batch);
                Some(queue.drain(..n).collect())
            }
            None => None,
        }
    }

    /// Up to `n` queued callers of `inventory_id`, oldest first.
    fn take(&self, inventory_id: Uuid, n: usize) -> Vec<Waiting> {
        let mut queues = self.queues.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match queues.get_mut(&inventory_id) {
            Some(queue) => {
                let n = queue.len().min(n);
                queue.drain(..n).collect()
            }
            None => Vec::new(),
        }
    }

    /// A caller alone: the plain one-statement reserve is cheaper for the
    /// database than the batch walk.
    async fn alone(&self, inventory_id: Uuid, user_id: &str, quantity: i32) -> Result<ReserveOutcome, AppError> {
        let request = ReserveRequest {
            inventory_id,
            quantity,
            expected_version: None,
            idempotency_key: None,
            ttl_secs: self.ttl_secs,
        };
        service::reserve_alone(&self.db, &self.statements, &self.collisions, user_id, &request).await
    }

    /// Runs one batch statement and answers every caller in it.
    async fn run(&self, inventory_id: Uuid, mut batch: Vec<Waiting>) {
        if batch.len() == 1 {
            if let Some(waiting) = batch.pop() {
                let result = self.alone(inventory_id, &waiting.user_id, waiting.quantity).await;
                let _ = waiting.reply.send(result);
            }
            return;
        }
        let ids: Vec<Uuid> = batch.iter().map(|_| Uuid::new_v4()).collect();
        let users: Vec<&str> = batch.iter().map(|w| w.user_id.as_str()).collect();
        let quantities: Vec<i32> = batch.iter().map(|w| w.quantity).collect();
        let reserve = CoalescedReserve {
            inventory_id,
            reservation_ids: &ids,
            user_ids: &users,
            quantities: &quantities,
            ttl_secs: self.ttl_secs,
        };
        let turns = store::reserve_coalesced(&self.statements, &self.collisions, &reserve).await;
        let answers = answer(inventory_id, &batch, &ids, turns);
        for (waiting, result) in batch.into_iter().zip(answers) {
            // A caller that has gone away no longer needs its answer.
            let _ = waiting.reply.send(result);
        }
    }
}

/// Passes the queue of an inventory on when its first caller is done (or
/// has gone away): to a serving task when callers queued meanwhile, else it
/// removes the queue.
struct HandOver<'a> {
    /// Whose queue it is.
    coalescer: &'a Coalescer,
    /// The inventory the queue is of.
    inventory_id: Uuid,
}

impl Drop for HandOver<'_> {
    fn drop(&mut self) {
        let Some(batch) = self.coalescer.next_batch(self.inventory_id) else { return };
        // Without a runtime (it is shutting down) the queued callers' replies
        // are dropped and they answer with an error instead of waiting forever.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(self.coalescer.clone().serve(self.inventory_id, batch));
        }
    }
}

/// Turns the statement's turns into one answer per caller.
fn answer(
    inventory_id: Uuid,
    batch: &[Waiting],
    ids: &[Uuid],
    turns: Result<Attempted<Vec<Turn>>, DbErr>,
) -> Vec<Result<ReserveOutcome, AppError>> {
    let turns = match turns {
        Ok(Attempted::Done(turns)) => turns,
        Ok(Attempted::Exhausted { attempts }) => {
            tracing::warn!(attempts, %inventory_id, "coalesced reserve collisions exhausted");
            return batch.iter().map(|_| Err(AppError::DatabaseUnavailable)).collect();
        }
        Err(err) => {
            // One failure for the whole batch: the statement wrote nothing.
            let err = AppError::from(err);
            return batch.iter().map(|_| Err(err.clone())).collect();
        }
    };
    if turns.is_empty() {
        return batch.iter().map(|_| Ok(ReserveOutcome::InventoryNotFound)).collect();
    }
    // The statement returns one turn per caller, in arrival order.
    batch
        .iter()
        .zip(ids)
        .zip(turns)
        .map(|((waiting, id), turn)| {
            Ok(if turn.granted {
                let reservation = ReservationRow {
                    id: *id,
                    inventory_id,
                    order_id: None,
                    user_id: waiting.user_id.clone(),
                    quantity: waiting.quantity,
                    status: ReservationStatus::Active,
                    idempotency_key: None,
                    request_fingerprint: None,
                    created_at: turn.now,
                    expires_at: turn.expires_at,
                    multi_item_id: None,
                };
                ReserveOutcome::Reserved { reservation, inventory: turn.inventory }
            } else {
                ReserveOutcome::SoldOut { requested: waiting.quantity, inventory: turn.inventory }
            })
        })
        .collect()
}
