//! The return use case: an operator's `returnOrder`, with what the return
//! statement's result means (nothing written: no such order, not
//! FULFILLED, an inventory not on the order, or more than a line shipped,
//! told apart from the statement's own rows) and idempotency-key replays.
//! The SQL runs in `store.rs`.

use std::sync::Arc;

use sea_orm::DatabaseConnection;
use uuid::Uuid;

use super::{
    domain::ReturnRequest,
    store::{self, Judged, ReturnRecord},
};
use crate::{
    app::AppState,
    config::Limits,
    db::{Collisions, read_answer},
    error::AppError,
    idempotency::{self, Key},
    inventory::store as inventories,
    orders::{domain::Order, entity::OrderStatus, store as orders},
    stock::taking_back::OrderReturn,
};

/// The returns feature as the resolvers see it: one per server process,
/// built by the composition root and handed to the schema as data.
#[derive(Clone)]
pub(crate) struct ReturnService {
    /// The connection pool.
    db: DatabaseConnection,
    /// Re-runs collided statements.
    collisions: Collisions,
    /// The limits requests are checked against.
    limits: Arc<Limits>,
}

/// How a return ended.
#[derive(Debug)]
pub(crate) enum ReturnOutcome {
    /// The return was made (now, or by the first request with this key).
    Returned {
        /// The order as it is now.
        order: Order,
        /// The return and its lines.
        record: ReturnRecord,
    },
    /// An asked line would return more than its order lines shipped; nothing was written.
    ExceedsFulfilled {
        /// The inventory.
        inventory_id: Uuid,
        /// Units its lines shipped.
        fulfilled: i64,
        /// Units of them returned before.
        returned: i64,
        /// Units asked for.
        requested: i32,
    },
    /// The order is not FULFILLED; nothing was written. As it is now.
    CannotBeReturned(Order),
    /// No order has this id.
    OrderNotFound,
}

impl ReturnService {
    /// The service over `state`'s pool, collision policy and limits.
    pub(crate) fn new(state: &AppState) -> Self {
        Self { db: state.db.clone(), collisions: state.collisions.clone(), limits: state.limits.clone() }
    }

    /// The limits requests are checked against.
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Returns units of an order for the operator `operator` (see
    /// `stock::taking_back::return_order`), all of the request or nothing.
    /// A key this operator already used for this very request replays its
    /// return with the order as it is now; for another request it is
    /// `IDEMPOTENCY_KEY_REUSED`. An unknown `locationId`, or an inventory
    /// the order has no line of, is `BAD_USER_INPUT`. When collision retries
    /// run out nothing was judged: the retryable `DATABASE_UNAVAILABLE`.
    pub(crate) async fn return_order(
        &self,
        operator: &str,
        request: &ReturnRequest,
        idempotency_key: Option<String>,
    ) -> Result<ReturnOutcome, AppError> {
        let Self { db, collisions, .. } = self;
        let key = idempotency_key
            .map(|key| Key::return_order(key, request.order_id, &request.lines, request.note.as_deref()));
        if let Some(replayed) = self.replay(operator, key.as_ref()).await? {
            return Ok(replayed);
        }
        // Locations are never deleted, so one read before the statement
        // tells an unknown one for good (and keeps the level's foreign key
        // from failing the statement).
        let locations = request.locations();
        let unknown = if locations.is_empty() {
            Vec::new()
        } else {
            read_answer!(db, |db| inventories::unknown_locations(db, &locations))?
        };
        if let Some(missing) = unknown.first() {
            let i = request.lines.iter().position(|line| line.location_id == Some(*missing)).unwrap_or_default();
            return Err(AppError::bad_input(
                format!("input.lines[{i}].locationId"),
                format!("no location has id {missing}"),
            ));
        }
        let statement = OrderReturn {
            order_id: request.order_id,
            return_id: Uuid::new_v4(),
            operator,
            note: request.note.as_deref(),
            lines: &request.lines,
            key: key.as_ref().map(|key| (key.key.as_str(), key.fingerprint.as_str())),
        };
        let judged = match store::return_order(db, collisions, statement).await {
            Ok(attempted) => attempted.done()?,
            // The same key's first request committed meanwhile.
            Err(err) if idempotency::is_taken(&err) => {
                return self
                    .replay(operator, key.as_ref())
                    .await?
                    .ok_or_else(|| AppError::internal(anyhow::anyhow!("a taken idempotency key has no return")));
            }
            Err(err) => return Err(err.into()),
        };
        if let Some(return_id) = judged.iter().find_map(|j| j.return_id) {
            return self.returned(request.order_id, return_id).await;
        }
        // Nothing written. A concurrent request with this key that won must
        // get the first return, not the lines it has just returned reported
        // as returned.
        if let Some(replayed) = self.replay(operator, key.as_ref()).await? {
            return Ok(replayed);
        }
        self.refused(request, &judged).await
    }

    /// Why a return that wrote nothing was refused, from the statement's own
    /// rows: the order's status and each line as locked.
    async fn refused(&self, request: &ReturnRequest, judged: &[Judged]) -> Result<ReturnOutcome, AppError> {
        let status = judged.first().and_then(|j| j.order_status);
        match status {
            None => return Ok(ReturnOutcome::OrderNotFound),
            Some(OrderStatus::Fulfilled) => {}
            Some(_) => return Ok(ReturnOutcome::CannotBeReturned(self.order(request.order_id).await?)),
        }
        let of = |inventory_id: Uuid| judged.iter().find(|j| j.inventory_id == inventory_id);
        for (i, line) in request.lines.iter().enumerate() {
            if of(line.inventory_id).is_none_or(|j| j.fulfilled.is_none()) {
                return Err(AppError::bad_input(
                    format!("input.lines[{i}].inventoryId"),
                    format!("order {} has no line of inventory {}", request.order_id, line.inventory_id),
                ));
            }
        }
        for line in &request.lines {
            if let Some(&Judged { fulfilled: Some(fulfilled), returned: Some(returned), requested, .. }) =
                of(line.inventory_id)
                && returned + i64::from(requested) > fulfilled
            {
                let inventory_id = line.inventory_id;
                return Ok(ReturnOutcome::ExceedsFulfilled { inventory_id, fulfilled, returned, requested });
            }
        }
        // The statement judged every line as it wrote and found each one
        // fits, so one that wrote nothing names one that does not.
        tracing::error!(order_id = %request.order_id, "a return that ran wrote nothing, yet every line fits");
        Err(AppError::DatabaseUnavailable)
    }

    /// The return made by the first request with this key, if any, with
    /// the order as it is now.
    async fn replay(&self, operator: &str, key: Option<&Key>) -> Result<Option<ReturnOutcome>, AppError> {
        let Some(key) = key else { return Ok(None) };
        let Some(return_id) = idempotency::replay_return(&self.db, operator, key).await? else { return Ok(None) };
        let record = self.record(return_id).await?;
        Ok(Some(ReturnOutcome::Returned { order: self.order(record.row.order_id).await?, record }))
    }

    /// The answer of a return that was made: the order and the return,
    /// read after the write ([`read_answer!`]).
    async fn returned(&self, order_id: Uuid, return_id: Uuid) -> Result<ReturnOutcome, AppError> {
        Ok(ReturnOutcome::Returned { order: self.order(order_id).await?, record: self.record(return_id).await? })
    }

    /// A return that exists, with its lines.
    async fn record(&self, return_id: Uuid) -> Result<ReturnRecord, AppError> {
        read_answer!(&self.db, |db| store::find(db, return_id))?
            .ok_or_else(|| AppError::internal(anyhow::anyhow!("return {return_id} is missing")))
    }

    /// An order that exists, as it is now.
    async fn order(&self, order_id: Uuid) -> Result<Order, AppError> {
        read_answer!(&self.db, |db| orders::find(db, order_id))?
            .ok_or_else(|| AppError::internal(anyhow::anyhow!("order {order_id} is missing")))
    }
}
