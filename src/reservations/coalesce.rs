//! Request coalescing: group commit for reservations.
//!
//! One row takes only one committed change per WAL flush, and every
//! statement that commits alone pays a flush and a round trip of its own.
//! `reserve` calls (with or without `expectedVersion` or an idempotency key)
//! are therefore served in *lanes*: at most `lanes` statements run at once,
//! and an inventory is in at most one of them. A caller that finds nothing
//! running takes its own one-statement path at once, in its own task (no
//! added latency, no hand-over). Everyone else queues, and when a lane's
//! statement is done the lane takes the queue (up to a maximum, of any
//! inventories not in another lane) as one batch. A further lane opens only
//! when `backlog` callers wait: on a catalogue, where every caller's
//! inventory is idle, opening a lane per caller would make many small
//! statements where one larger one costs the database far less per
//! reservation (bench/results/decisions.md, "Lanes: open one beside a
//! running one only for a backlog"). A batch is one statement that
//! locks the batch's inventories in id order, grants each inventory's
//! callers in arrival order against its locked stock, writes every granted
//! reservation and ledger row, and answers each caller as if it had run
//! alone, one at a time: its own stock after, and a version one higher per
//! grant before it on its inventory. On a hot item that is the batch of its
//! waiting callers; on a catalogue it is the callers of many items sharing
//! one commit, usually each of another item, for which a leaner statement
//! without the walk serves each caller by the conditional UPDATE of its own
//! row (still in id order), and a caller it did not serve is answered from
//! a read afterwards, as alone. A batch naming an inventory this process
//! has seen held in several places walks across the levels instead
//! (`stock::coalesced`), so stock spread over locations is batched too.
//! Only reserves by the default choice come here (`service::reserve`), and
//! kits by the default choice (`kits::service`): a kit caller is one
//! caller of all its components' inventories, and a batch with kits in it
//! is served by `stock::coalesced::KITS_RESERVE_SQL`, which judges each
//! kit at its turn against every component at once.
//!
//! Every caller's own rules hold inside a batch. An expected version is
//! checked at the caller's turn, so of callers expecting one version the
//! first wins and the rest conflict, as alone. A key seen before fails the
//! batch on the keys' unique index (so it wrote nothing and its callers go
//! alone, where the key replays), and a keyed caller the batch did not serve
//! gets its key's first outcome if it had one. A batch whose statement fails
//! (for any reason but a lost database) wrote nothing, and its callers are
//! each served alone, so one bad caller fails alone. Nothing is kept for an
//! idle server: the queue holds only callers in flight, which the server's
//! in-flight limit bounds.

use std::{
    collections::{HashSet, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use sea_orm::DatabaseConnection;
use tokio::sync::oneshot;
use tracing::Instrument;
use uuid::Uuid;

use super::{
    ReservationRow, ReservationStatus, alone,
    reserve::{self, ReserveOutcome, ReserveRequest},
    spread::Spread,
    store,
};
use crate::{
    db::{Attempted, Collisions, DbFailure, Exhausted, StatementPool, classify},
    error::AppError,
    idempotency::{self, Key},
    stock::coalesced::{CoalescedReserve, KitLines, Turn},
    telemetry,
};

/// A `reserveKit` by the default choice, checked, for the coalescer to
/// serve: every component's units or none.
#[derive(Debug, Clone)]
pub(crate) struct KitAsk {
    /// The kit.
    pub kit_id: Uuid,
    /// Kits asked for.
    pub quantity: i32,
    /// The kit reservation's id, if it is made.
    pub kit_reservation_id: Uuid,
    /// The components' inventories, by id.
    pub inventory_ids: Vec<Uuid>,
    /// Each component's units (kits × its quantity per kit), as `inventory_ids`.
    pub quantities: Vec<i32>,
    /// Its idempotency key with the request's fingerprint, if it sent one.
    pub key: Option<Key>,
    /// Seconds until its reservations expire; 0 = never.
    pub ttl_secs: i32,
}

/// How the coalescer served a kit caller.
pub(crate) enum KitTurn {
    /// A batch's statement took every component: the kit reservation
    /// (`KitAsk::kit_reservation_id`) was made at `created_at`.
    Granted {
        /// When it was made (the statement's transaction start).
        created_at: DateTime<Utc>,
    },
    /// The caller runs its own statement: in a lane of its own, held until
    /// it is dropped, or without one when a batch did not serve it (refused
    /// at its turn, or the batch failed and wrote nothing), coming after
    /// the batch as a caller arriving later would.
    Alone(Option<Lane>),
}

/// What a waiting caller asks for, and where its answer goes.
enum Ask {
    /// A `reserve`: units of one inventory.
    One { request: ReserveRequest, reply: oneshot::Sender<Result<ReserveOutcome, AppError>> },
    /// A `reserveKit`: every component or none.
    Kit { kit: KitAsk, reply: oneshot::Sender<Result<KitTurn, AppError>> },
}

impl Ask {
    /// The inventories it takes from.
    fn inventories(&self) -> &[Uuid] {
        match self {
            Self::One { request, .. } => std::slice::from_ref(&request.inventory_id),
            Self::Kit { kit, .. } => &kit.inventory_ids,
        }
    }

    /// Answers `err`.
    fn fail(self, err: AppError) {
        match self {
            Self::One { reply, .. } => drop(reply.send(Err(err))),
            Self::Kit { reply, .. } => drop(reply.send(Err(err))),
        }
    }
}

/// One caller waiting for its batch.
struct Waiting {
    /// The caller (token `sub`).
    user_id: String,
    /// What it asks for.
    ask: Ask,
    /// Its idempotency key with the request's fingerprint, if it sent one.
    key: Option<Key>,
    /// When it joined the queue.
    arrived: Instant,
    /// Its span, for the batch's link to it (none with traces off).
    span: tracing::Span,
}

impl Waiting {
    /// `user_id`'s `request`, arriving now, answered on `reply`.
    fn one(user_id: &str, request: &ReserveRequest, reply: oneshot::Sender<Result<ReserveOutcome, AppError>>) -> Self {
        let key = request.key();
        Self::new(user_id, Ask::One { request: request.clone(), reply }, key)
    }

    /// `user_id`'s `kit`, arriving now, answered on `reply`.
    fn kit(user_id: &str, kit: KitAsk, reply: oneshot::Sender<Result<KitTurn, AppError>>) -> Self {
        let key = kit.key.clone();
        Self::new(user_id, Ask::Kit { kit, reply }, key)
    }

    fn new(user_id: &str, ask: Ask, key: Option<Key>) -> Self {
        let span = telemetry::caller_span();
        Self { user_id: user_id.to_owned(), ask, key, arrived: Instant::now(), span }
    }

    /// Units of a single reserve; kits of a kit caller.
    fn quantity(&self) -> i32 {
        match &self.ask {
            Ask::One { request, .. } => request.quantity,
            Ask::Kit { kit, .. } => kit.quantity,
        }
    }

    /// The version a single reserve expects; a kit caller expects none.
    fn expected_version(&self) -> Option<i32> {
        match &self.ask {
            Ask::One { request, .. } => request.expected_version,
            Ask::Kit { .. } => None,
        }
    }

    fn ttl_secs(&self) -> i32 {
        match &self.ask {
            Ask::One { request, .. } => request.ttl_secs,
            Ask::Kit { kit, .. } => kit.ttl_secs,
        }
    }

    /// Whether it may take safety stock: an operator's single reserve may;
    /// a kit never does.
    fn use_safety_stock(&self) -> bool {
        match &self.ask {
            Ask::One { request, .. } => request.use_safety_stock,
            Ask::Kit { .. } => false,
        }
    }
}

/// The lines of a batch with kits in it ([`KitLines`]): a single reserve's
/// one, with its reservation's ids, and a kit's one per component, each
/// with new time-ordered ids.
struct BatchLines {
    kit_ids: Vec<Option<Uuid>>,
    kit_reservation_ids: Vec<Option<Uuid>>,
    callers: Vec<i32>,
    inventory_ids: Vec<Uuid>,
    quantities: Vec<i32>,
    reservation_ids: Vec<Uuid>,
    movement_ids: Vec<Uuid>,
}

impl BatchLines {
    /// The lines of `batch`, whose single reserves take the reservation and
    /// ledger row ids `ids` and `movement_ids` (one per caller).
    fn of(batch: &[Waiting], ids: &[Uuid], movement_ids: &[Uuid]) -> Self {
        let mut lines = Self {
            kit_ids: Vec::with_capacity(batch.len()),
            kit_reservation_ids: Vec::with_capacity(batch.len()),
            callers: Vec::new(),
            inventory_ids: Vec::new(),
            quantities: Vec::new(),
            reservation_ids: Vec::new(),
            movement_ids: Vec::new(),
        };
        for (n, ((waiting, &id), &movement_id)) in (1..).zip(batch.iter().zip(ids).zip(movement_ids)) {
            let (kit_id, kit_reservation_id) = match &waiting.ask {
                Ask::One { request, .. } => {
                    lines.push(n, request.inventory_id, request.quantity, id, movement_id);
                    (None, None)
                }
                Ask::Kit { kit, .. } => {
                    for (&inventory_id, &quantity) in kit.inventory_ids.iter().zip(&kit.quantities) {
                        lines.push(n, inventory_id, quantity, Uuid::now_v7(), Uuid::now_v7());
                    }
                    (Some(kit.kit_id), Some(kit.kit_reservation_id))
                }
            };
            lines.kit_ids.push(kit_id);
            lines.kit_reservation_ids.push(kit_reservation_id);
        }
        lines
    }

    fn push(&mut self, caller: i32, inventory_id: Uuid, quantity: i32, reservation_id: Uuid, movement_id: Uuid) {
        self.callers.push(caller);
        self.inventory_ids.push(inventory_id);
        self.quantities.push(quantity);
        self.reservation_ids.push(reservation_id);
        self.movement_ids.push(movement_id);
    }

    fn bind(&self) -> KitLines<'_> {
        KitLines {
            kit_ids: &self.kit_ids,
            kit_reservation_ids: &self.kit_reservation_ids,
            callers: &self.callers,
            inventory_ids: &self.inventory_ids,
            quantities: &self.quantities,
            reservation_ids: &self.reservation_ids,
            movement_ids: &self.movement_ids,
        }
    }
}

/// The answer a queued caller's batch sends it.
async fn answered<T>(answer: oneshot::Receiver<Result<T, AppError>>) -> Result<T, AppError> {
    answer
        .await
        .unwrap_or_else(|_| Err(AppError::internal(anyhow::anyhow!("the coalesced batch ended without answering"))))
}

/// The lanes' shared state.
#[derive(Default)]
struct Lanes {
    /// Statements running (or about to), callers alone included.
    running: usize,
    /// The inventories of the running statements: a later caller of one of
    /// them waits for the next batch instead of queueing on its row lock.
    busy: HashSet<Uuid>,
    /// Callers waiting for a batch, in arrival order.
    queue: VecDeque<Waiting>,
}

impl Lanes {
    /// Up to `max` queued callers, oldest first, whose inventory is idle or
    /// already one of `batch`'s, added to `batch`; their inventories become busy.
    fn take_into(&mut self, batch: &mut Vec<Waiting>, max: usize) {
        let Self { busy, queue, .. } = self;
        let mut mine: HashSet<Uuid> = batch.iter().flat_map(|w| w.ask.inventories()).copied().collect();
        let mut rest = VecDeque::with_capacity(queue.len());
        for waiting in queue.drain(..) {
            let ids = waiting.ask.inventories();
            if batch.len() < max && ids.iter().all(|id| mine.contains(id) || !busy.contains(id)) {
                mine.extend(ids);
                busy.extend(ids);
                batch.push(waiting);
            } else {
                rest.push_back(waiting);
            }
        }
        *queue = rest;
    }
}

/// Serves conditional reservations in lanes, batching those that wait.
#[derive(Clone)]
pub struct Coalescer {
    /// For the reads of a caller served alone.
    db: DatabaseConnection,
    /// Where the statements run (one round trip each).
    statements: StatementPool,
    /// Re-runs collided statements.
    collisions: Collisions,
    /// Who runs and who waits. A std mutex, not a tokio one: it is held only
    /// to move callers between vectors, never across an await.
    lanes: Arc<Mutex<Lanes>>,
    /// Most statements running at once.
    max_lanes: usize,
    /// Most callers one statement serves.
    max_batch: usize,
    /// Callers waiting before a lane opens beside a running one.
    backlog: usize,
    /// How long a batch may wait for more callers after its first arrived.
    window: Duration,
    /// The inventories seen held in several places.
    spread: Arc<Spread>,
}

/// How a [`Coalescer`] batches.
#[derive(Debug, Clone, Copy)]
pub struct Batching {
    /// Most statements running at once.
    pub lanes: usize,
    /// Most callers one statement serves.
    pub max_batch: usize,
    /// Callers waiting before a lane opens beside a running one (1: at once).
    pub backlog: usize,
    /// How long a batch waits for more callers after its first (zero: only
    /// those that queued while the lanes were busy).
    pub window: Duration,
}

impl Coalescer {
    /// A coalescer over `db` that runs its statements on `statements`.
    pub fn new(db: DatabaseConnection, statements: StatementPool, collisions: Collisions, batching: Batching) -> Self {
        Self {
            db,
            statements,
            collisions,
            lanes: Arc::default(),
            max_lanes: batching.lanes.max(1),
            max_batch: batching.max_batch.max(1),
            backlog: batching.backlog.max(1),
            window: batching.window,
            spread: Arc::default(),
        }
    }

    /// The inventories it has seen held in several places, for the service
    /// to share.
    pub(super) fn spread(&self) -> Arc<Spread> {
        self.spread.clone()
    }

    fn lanes(&self) -> MutexGuard<'_, Lanes> {
        self.lanes.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many callers of `inventory_id` wait in the queue right now (not
    /// counting those whose statement runs), for tests that must see callers
    /// queued before they go on.
    pub fn queued(&self, inventory_id: Uuid) -> usize {
        self.lanes().queue.iter().filter(|w| w.ask.inventories().contains(&inventory_id)).count()
    }

    /// How many callers of any inventory wait in the queue right now.
    pub fn waiting(&self) -> usize {
        self.lanes().queue.len()
    }

    /// Serves `request` for `user_id`: alone when a lane may open for it
    /// (nothing runs, or the backlog is 1 and a lane is free) and nobody else
    /// takes from its inventory, else in a batch.
    pub async fn reserve(&self, user_id: &str, request: &ReserveRequest) -> Result<ReserveOutcome, AppError> {
        let inventory_id = request.inventory_id;
        let (reply, answer) = oneshot::channel();
        if !self.enter(&[inventory_id], || Waiting::one(user_id, request, reply)) {
            return answered(answer).await;
        }
        if self.window.is_zero() {
            // A lane of its own: served at once, in its own task; whoever
            // queued meanwhile is served next when `_lane` is dropped, even
            // if this caller goes away halfway.
            let _lane = Lane { coalescer: self.clone(), inventories: vec![inventory_id] };
            return self.alone(user_id, request).await;
        }
        // A batch that waits for company runs in its own task, so a caller
        // that goes away cannot strand the others.
        let (reply, answer) = oneshot::channel();
        tokio::spawn(self.clone().serve(vec![Waiting::one(user_id, request, reply)]));
        answered(answer).await
    }

    /// Serves `kit` for `user_id` as [`Self::reserve`] serves a single
    /// reserve, sharing lanes and batches with them: a kit caller that may
    /// have a lane of its own gets it back to run its own statement in
    /// (`KitTurn::Alone`), and one that queued shares a batch's statement
    /// with whoever waits, on its components' inventories or any other.
    pub(crate) async fn reserve_kit(&self, user_id: &str, kit: KitAsk) -> Result<KitTurn, AppError> {
        let inventories = kit.inventory_ids.clone();
        let (reply, answer) = oneshot::channel();
        if !self.enter(&inventories, || Waiting::kit(user_id, kit.clone(), reply)) {
            return answered(answer).await;
        }
        if self.window.is_zero() {
            return Ok(KitTurn::Alone(Some(Lane { coalescer: self.clone(), inventories })));
        }
        let (reply, answer) = oneshot::channel();
        tokio::spawn(self.clone().serve(vec![Waiting::kit(user_id, kit, reply)]));
        answered(answer).await
    }

    /// Lets a caller of `inventories` in: true when a lane may open for it
    /// (nothing runs, or the backlog is 1 and a lane is free) and nobody
    /// else takes from its inventories, the lane then counted as running
    /// and its inventories busy; else it queues as `waiting` (and a batch
    /// starts when enough company waits for a lane of its own).
    fn enter(&self, inventories: &[Uuid], waiting: impl FnOnce() -> Waiting) -> bool {
        let batch = {
            let mut lanes = self.lanes();
            if self.may_open(&lanes, 1) && inventories.iter().all(|id| !lanes.busy.contains(id)) {
                lanes.running += 1;
                lanes.busy.extend(inventories);
                return true;
            }
            lanes.queue.push_back(waiting());
            self.next_batch(&mut lanes)
        };
        if let Some(batch) = batch {
            tokio::spawn(self.clone().serve(batch));
        }
        false
    }

    /// Runs one batch in a lane already counted as running (its inventories
    /// already busy), then hands the lane on.
    async fn serve(self, mut batch: Vec<Waiting>) {
        if !self.window.is_zero() && batch.len() < self.max_batch {
            let deadline = batch[0].arrived + self.window;
            tokio::time::sleep_until(deadline.into()).await;
            self.lanes().take_into(&mut batch, self.max_batch);
        }
        let mut inventories: Vec<Uuid> = batch.iter().flat_map(|w| w.ask.inventories()).copied().collect();
        inventories.sort_unstable();
        inventories.dedup();
        let _lane = Lane { coalescer: self.clone(), inventories };
        self.run(batch).await;
    }

    /// Gives up a lane that served `inventories`, and takes the batches that
    /// can run now: one per lane that may open (see [`Self::may_open`]).
    fn finish(&self, inventories: &[Uuid]) -> Vec<Vec<Waiting>> {
        let mut lanes = self.lanes();
        lanes.running = lanes.running.saturating_sub(1);
        for id in inventories {
            lanes.busy.remove(id);
        }
        let mut batches = Vec::new();
        while let Some(batch) = self.next_batch(&mut lanes) {
            batches.push(batch);
        }
        batches
    }

    /// Whether a lane may open now for `waiting` callers (a caller alone
    /// counts itself): the first at once, one beside running ones only for
    /// a backlog.
    fn may_open(&self, lanes: &Lanes, waiting: usize) -> bool {
        lanes.running == 0 || (lanes.running < self.max_lanes && waiting >= self.backlog)
    }

    /// The queued callers that may run now as a batch in a new lane (counted
    /// as running, their inventories busy), if a lane may open.
    fn next_batch(&self, lanes: &mut Lanes) -> Option<Vec<Waiting>> {
        if lanes.queue.is_empty() || !self.may_open(lanes, lanes.queue.len()) {
            return None;
        }
        let mut batch = Vec::new();
        lanes.take_into(&mut batch, self.max_batch);
        if batch.is_empty() {
            return None;
        }
        lanes.running += 1;
        Some(batch)
    }

    /// A caller alone: the plain one-statement reserve is cheaper for the
    /// database than the batch walk.
    async fn alone(&self, user_id: &str, request: &ReserveRequest) -> Result<ReserveOutcome, AppError> {
        alone::reserve_alone(&self.db, &self.statements, &self.collisions, user_id, request, &self.spread).await
    }

    /// A queued caller served alone, answered: a kit caller runs its own
    /// statement.
    async fn waiting_alone(&self, waiting: Waiting) {
        let Waiting { user_id, ask, span, .. } = waiting;
        match ask {
            Ask::One { request, reply } => {
                let _ = reply.send(self.alone(&user_id, &request).instrument(span).await);
            }
            Ask::Kit { reply, .. } => drop(reply.send(Ok(KitTurn::Alone(None)))),
        }
    }

    /// Runs one batch statement and answers every caller in it.
    async fn run(&self, mut batch: Vec<Waiting>) {
        if batch.len() == 1 {
            if let Some(waiting) = batch.pop() {
                self.waiting_alone(waiting).await;
            }
            return;
        }
        // Time-ordered keys (see `alone::reserve_once`).
        let ids: Vec<Uuid> = batch.iter().map(|_| Uuid::now_v7()).collect();
        let movement_ids: Vec<Uuid> = batch.iter().map(|_| Uuid::now_v7()).collect();
        let inventories: Vec<Uuid> = batch.iter().map(|w| w.ask.inventories()[0]).collect();
        let users: Vec<&str> = batch.iter().map(|w| w.user_id.as_str()).collect();
        let quantities: Vec<i32> = batch.iter().map(Waiting::quantity).collect();
        let keys: Vec<Option<&str>> = batch.iter().map(|w| w.key.as_ref().map(|k| k.key.as_str())).collect();
        let fingerprints: Vec<Option<&str>> =
            batch.iter().map(|w| w.key.as_ref().map(|k| k.fingerprint.as_str())).collect();
        let expected_versions: Vec<Option<i32>> = batch.iter().map(Waiting::expected_version).collect();
        let ttl_secs: Vec<i32> = batch.iter().map(Waiting::ttl_secs).collect();
        // Per caller: customers and operators share batches.
        let use_safety_stock: Vec<bool> = batch.iter().map(Waiting::use_safety_stock).collect();
        let across_levels = inventories.iter().any(|&id| self.spread.contains(id));
        let lines =
            batch.iter().any(|w| matches!(w.ask, Ask::Kit { .. })).then(|| BatchLines::of(&batch, &ids, &movement_ids));
        let reserve = CoalescedReserve {
            inventory_ids: &inventories,
            reservation_ids: &ids,
            movement_ids: &movement_ids,
            user_ids: &users,
            quantities: &quantities,
            keys: &keys,
            fingerprints: &fingerprints,
            expected_versions: &expected_versions,
            ttl_secs: &ttl_secs,
            use_safety_stock: &use_safety_stock,
            across_levels,
            kits: lines.as_ref().map(BatchLines::bind),
        };
        let span = telemetry::batch(batch.len());
        telemetry::link_callers(&span, batch.iter().map(|w| &w.span));
        let turns = match store::reserve_coalesced(&self.statements, &self.collisions, &reserve)
            .instrument(span)
            .await
            .map(Attempted::done)
        {
            Ok(Ok(turns)) if turns.len() == batch.len() => turns,
            Ok(Ok(turns)) => {
                tracing::error!(callers = batch.len(), turns = turns.len(), "coalesced reserve answered short");
                return self.each_alone(batch, false).await;
            }
            // Each caller alone has its own retries, and when those run out
            // too its answer as alone (`Conflict`, see `not_taken`).
            Ok(Err(Exhausted { .. })) => return self.each_alone(batch, false).await,
            // The database is out of reach: each caller alone would only
            // wait for it again, so all fail now (and may retry).
            Err(err) if classify(&err) == DbFailure::Unavailable => {
                let err = AppError::from(err);
                for waiting in batch {
                    waiting.ask.fail(err.clone());
                }
                return;
            }
            // A key seen before: a client's retry, answered alone by its replay.
            Err(err) if idempotency::is_taken(&err) => {
                tracing::debug!(callers = batch.len(), "a coalesced caller's key was used before; serving them alone");
                return self.each_alone(batch, false).await;
            }
            Err(err) => {
                tracing::warn!(error = %err, callers = batch.len(), "coalesced reserve failed; serving its callers alone");
                let waited_out_a_lock =
                    matches!(classify(&err), DbFailure::StatementTimeout | DbFailure::LockNotAvailable);
                return self.each_alone(batch, waited_out_a_lock).await;
            }
        };
        for ((waiting, id), turn) in batch.into_iter().zip(ids).zip(turns) {
            let Waiting { user_id, ask, key, .. } = waiting;
            // A caller that has gone away no longer needs its answer.
            match ask {
                Ask::One { request, reply } => {
                    let _ = reply.send(self.outcome(&user_id, &request, key.as_ref(), id, turn).await);
                }
                Ask::Kit { reply, .. } => {
                    let turn = match turn {
                        Turn::Taken { granted: true, now, .. } => KitTurn::Granted { created_at: now },
                        // Refused at its turn: its own statement says why
                        // (which components are short, or the kit is gone),
                        // as for a caller that came after the batch.
                        _ => KitTurn::Alone(None),
                    };
                    let _ = reply.send(Ok(turn));
                }
            }
        }
    }

    /// A caller's answer from its turn in the statement, as alone.
    async fn outcome(
        &self,
        user_id: &str,
        request: &ReserveRequest,
        key: Option<&Key>,
        id: Uuid,
        turn: Turn,
    ) -> Result<ReserveOutcome, AppError> {
        let refused = match turn {
            Turn::Taken { granted: true, inventory, now, expires_at, .. } => {
                let reservation = ReservationRow {
                    id,
                    inventory_id: request.inventory_id,
                    order_id: None,
                    user_id: user_id.to_owned(),
                    quantity: request.quantity,
                    status: ReservationStatus::Active,
                    idempotency_key: key.map(|k| k.key.clone()),
                    request_fingerprint: key.map(|k| k.fingerprint.clone()),
                    created_at: now,
                    expires_at,
                    multi_item_id: None,
                    // Coalesced callers take by the default choice.
                    location_ids: None,
                    fewest_locations: None,
                    allow_split: None,
                    returned: 0,
                    kit_reservation_id: None,
                };
                return Ok(ReserveOutcome::Reserved { reservation, inventory });
            }
            // The statement cannot tell why (the stock may be in several
            // places), or passed the caller over (one who may take safety
            // stock, on stock in several places): decided by a read, and
            // served across the levels as alone when that is why.
            Turn::NotTaken => {
                let (db, statements, collisions) = (&self.db, &self.statements, &self.collisions);
                return alone::beyond_sole_level(db, statements, collisions, user_id, request, key, &self.spread).await;
            }
            Turn::NotFound => ReserveOutcome::InventoryNotFound,
            // Refused at its turn: too little stock comes first, as alone.
            Turn::Taken { granted: false, inventory, available, .. } => match request.expected_version {
                Some(expected_version) if available >= request.quantity => {
                    ReserveOutcome::Conflict { expected_version, inventory }
                }
                _ => ReserveOutcome::SoldOut { requested: request.quantity, available, inventory },
            },
        };
        // Not served now, but its key may have been by an earlier request:
        // that first outcome is the answer, as alone.
        Ok(reserve::replay(&self.db, user_id, key).await?.unwrap_or(refused))
    }

    /// Serves the callers of a failed batch statement (it wrote nothing)
    /// each alone, so a caller that cannot be served fails alone: in turn,
    /// one connection at a time, or `at_once` when the batch waited out a
    /// row another transaction holds, so that only that row's callers wait
    /// for it again, each once, while the rest are served (the statement
    /// pool bounds how many run). All at once for every failure made a key's
    /// replay, the common failure, take up to the whole statement pool.
    async fn each_alone(&self, batch: Vec<Waiting>, at_once: bool) {
        if at_once {
            futures::future::join_all(batch.into_iter().map(|waiting| self.waiting_alone(waiting))).await;
        } else {
            for waiting in batch {
                self.waiting_alone(waiting).await;
            }
        }
    }
}

/// A running lane. Dropped when its statement is done (or its caller has
/// gone away), it frees its inventories and starts the batches that can run
/// now, each in a task of its own.
pub(crate) struct Lane {
    /// Whose lane it is.
    coalescer: Coalescer,
    /// The inventories its statement takes from.
    inventories: Vec<Uuid>,
}

impl Drop for Lane {
    fn drop(&mut self) {
        let batches = self.coalescer.finish(&self.inventories);
        // Without a runtime (it is shutting down) the queued callers' replies
        // are dropped and they answer with an error instead of waiting forever.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            for batch in batches {
                runtime.spawn(self.coalescer.clone().serve(batch));
            }
        }
    }
}
