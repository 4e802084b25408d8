//! A reservation served by one statement of its own: a caller that finds
//! no batch running, a caller of a batch that failed, a request that names
//! locations, or every request when coalescing is off. Which statement runs
//! (the inventory's one level, or across its levels), and what a statement
//! that took nothing means, is decided here.

use sea_orm::DatabaseConnection;
use uuid::Uuid;

use super::{
    reserve::{ReserveOutcome, ReserveRequest, replay},
    spread::Spread,
    store,
};
use crate::{
    db::{Collisions, Exhausted, StatementPool, read_answer},
    error::AppError,
    idempotency::{self, Key},
    inventory::store as inventory_store,
    stock::taking::Reserve,
};

/// Takes `quantity` units for `user_id` with a one-statement reserve: a
/// caller that finds nothing running, a caller of a batch that failed, a
/// request that names locations, or every request when coalescing is off.
///
/// A request that may take from anywhere first tries the inventory's one
/// level with the conditional UPDATE of its row ([`Reserve::query`]); when
/// the stock is in several places that takes nothing, and the request is
/// served across the levels ([`Reserve::allocating_query`]), as a request
/// that names locations always is. The reservation, its allocations and its
/// ledger rows are written by the same statement as the decrement, so a
/// reservation exists exactly when stock was taken; when nothing was taken,
/// one read of the latest row tells why.
pub(crate) async fn reserve_alone(
    db: &DatabaseConnection,
    statements: &StatementPool,
    collisions: &Collisions,
    user_id: &str,
    request: &ReserveRequest,
    spread: &Spread,
) -> Result<ReserveOutcome, AppError> {
    let key = request.key();
    if request.allocating.is_anywhere() && !spread.contains(request.inventory_id) {
        match reserve_once(db, statements, collisions, user_id, request, key.as_ref(), Path::SoleLevel).await? {
            Taken::Done(outcome) => return Ok(outcome),
            Taken::Exhausted => return not_taken(db, user_id, request, key.as_ref(), true).await,
            Taken::Nothing => {}
        }
        return beyond_sole_level(db, statements, collisions, user_id, request, key.as_ref(), spread).await;
    }
    across_levels(db, statements, collisions, user_id, request, key.as_ref()).await
}

/// Which statement a single reserve runs.
#[derive(Debug, Clone, Copy)]
enum Path {
    /// [`Reserve::query`]: the inventory's one level, through its row.
    SoleLevel,
    /// [`Reserve::allocating_query`]: across the inventory's levels.
    AcrossLevels,
}

/// What one reserve statement (with its collision retries) came to.
enum Taken {
    /// Answered: stock taken, or the key's first outcome replayed.
    Done(ReserveOutcome),
    /// Nothing taken; a read tells why.
    Nothing,
    /// Every attempt collided.
    Exhausted,
}

/// Runs one reserve statement on `path`.
async fn reserve_once(
    db: &DatabaseConnection,
    statements: &StatementPool,
    collisions: &Collisions,
    user_id: &str,
    request: &ReserveRequest,
    key: Option<&Key>,
    path: Path,
) -> Result<Taken, AppError> {
    let reserve = Reserve {
        inventory_id: request.inventory_id,
        quantity: request.quantity,
        expected_version: request.expected_version,
        // Time-ordered (v7): new keys land at the right edge of the primary
        // key's B-tree instead of on a random page of it, which with months
        // of history is a page that is seldom cached (bench/results/decisions.md,
        // "Decisions", reservation ids).
        reservation_id: Uuid::now_v7(),
        movement_id: Uuid::now_v7(),
        user_id,
        idempotency_key: key.map(|k| k.key.as_str()),
        fingerprint: key.map(|k| k.fingerprint.as_str()),
        ttl_secs: request.ttl_secs,
        allocating: &request.allocating,
        use_safety_stock: request.use_safety_stock,
    };
    let attempted = match path {
        Path::SoleLevel => store::reserve(statements, collisions, &reserve).await,
        Path::AcrossLevels => store::reserve_allocating(statements, collisions, &reserve).await,
    };
    let attempted = match attempted {
        Ok(attempted) => attempted,
        // The key was used first by a request that has committed.
        Err(err) if idempotency::is_taken(&err) => {
            return replay(db, user_id, key)
                .await?
                .map(Taken::Done)
                .ok_or_else(|| AppError::internal(anyhow::anyhow!("a taken idempotency key has no first use")));
        }
        Err(err) => return Err(err.into()),
    };
    Ok(match attempted.done() {
        Ok(Some(change)) => {
            Taken::Done(ReserveOutcome::Reserved { reservation: change.reservation, inventory: change.inventory })
        }
        Ok(None) => Taken::Nothing,
        Err(Exhausted { .. }) => Taken::Exhausted,
    })
}

/// Serves a request that may take from anywhere and that the inventory's
/// one level did not serve (alone, or at its turn in a coalesced
/// statement, or passed over there as a caller who may take safety stock):
/// a read tells whether that was the answer (no such inventory, another
/// version, too little sellable stock in its one place) or the stock is in
/// several places (or its one place is inactive), and then the request is
/// served across the levels.
pub(super) async fn beyond_sole_level(
    db: &DatabaseConnection,
    statements: &StatementPool,
    collisions: &Collisions,
    user_id: &str,
    request: &ReserveRequest,
    key: Option<&Key>,
    spread: &Spread,
) -> Result<ReserveOutcome, AppError> {
    if let Some(outcome) = replay(db, user_id, key).await? {
        return Ok(outcome);
    }
    let Some(inventory) = read_answer!(db, |db| inventory_store::find(db, request.inventory_id))? else {
        return Ok(ReserveOutcome::InventoryNotFound);
    };
    spread.learn(&inventory);
    if inventory.sole_location_id.is_some() {
        // What its one level offers the request: its stock less the level's
        // safety stock, unless the request may take that too.
        let available = read_answer!(db, |db| store::available(
            db,
            request.inventory_id,
            &request.allocating,
            request.use_safety_stock
        ))?;
        if available < request.quantity {
            return Ok(ReserveOutcome::SoldOut { requested: request.quantity, available, inventory });
        }
    }
    if let Some(expected_version) = request.expected_version.filter(|&v| v != inventory.version) {
        return Ok(ReserveOutcome::Conflict { expected_version, inventory });
    }
    across_levels(db, statements, collisions, user_id, request, key).await
}

/// Serves a request across the inventory's levels.
async fn across_levels(
    db: &DatabaseConnection,
    statements: &StatementPool,
    collisions: &Collisions,
    user_id: &str,
    request: &ReserveRequest,
    key: Option<&Key>,
) -> Result<ReserveOutcome, AppError> {
    match reserve_once(db, statements, collisions, user_id, request, key, Path::AcrossLevels).await? {
        Taken::Done(outcome) => Ok(outcome),
        Taken::Nothing => not_taken(db, user_id, request, key, false).await,
        Taken::Exhausted => not_taken(db, user_id, request, key, true).await,
    }
}

/// The answer to a reserve whose statement took nothing (or, `exhausted`,
/// whose every attempt collided: `Conflict` with the latest row), from a
/// read afterwards of the row and of what the request's eligible
/// locations hold. Its reads run again after a collision ([`read_answer!`]):
/// the request wrote nothing, but a reserve that took nothing is answered,
/// not failed.
async fn not_taken(
    db: &DatabaseConnection,
    user_id: &str,
    request: &ReserveRequest,
    key: Option<&Key>,
    exhausted: bool,
) -> Result<ReserveOutcome, AppError> {
    // A replay of a request that did take stock must return that first
    // outcome, not a `Conflict` with its own old version.
    if let Some(outcome) = replay(db, user_id, key).await? {
        return Ok(outcome);
    }
    let Some(inventory) = read_answer!(db, |db| inventory_store::find(db, request.inventory_id))? else {
        return Ok(ReserveOutcome::InventoryNotFound);
    };
    let available = read_answer!(db, |db| store::available(
        db,
        request.inventory_id,
        &request.allocating,
        request.use_safety_stock
    ))?;
    Ok(match request.expected_version {
        expected if exhausted => {
            ReserveOutcome::Conflict { expected_version: expected.unwrap_or(inventory.version), inventory }
        }
        _ if available < request.quantity => {
            ReserveOutcome::SoldOut { requested: request.quantity, available, inventory }
        }
        Some(expected_version) => ReserveOutcome::Conflict { expected_version, inventory },
        // Enough stock and no version asked for, yet nothing taken: only a
        // change between the statement and this read can do that, so the
        // reservation is decided as of the statement: sold out.
        None => ReserveOutcome::SoldOut { requested: request.quantity, available, inventory },
    })
}
