//! Location use cases: pages of locations, creating and changing one (a
//! taken code is bad input), and transferring stock between two locations
//! of an inventory, with what the transfer statement's result means (0
//! rows: not found, a conflict or sold out, told apart by one read
//! afterwards) and idempotency-key replays. The SQL runs in `store.rs`.

use std::sync::Arc;

use sea_orm::DatabaseConnection;
use uuid::Uuid;

use super::{
    LocationRow,
    store::{self, LevelState, LocationCursor, Transfer},
};
use crate::{
    app::AppState,
    config::Limits,
    db::{Collisions, DbFailure, classify, read_answer},
    error::AppError,
    idempotency::{self, Key},
    inventory::{InventoryRow, store as inventories},
    pagination::Page,
};

/// The location feature as the resolvers see it: one per server process,
/// built by the composition root and handed to the schema as data.
#[derive(Clone)]
pub(crate) struct LocationService {
    /// The connection pool.
    db: DatabaseConnection,
    /// Re-runs collided statements.
    collisions: Collisions,
    /// The limits pages are checked against.
    limits: Arc<Limits>,
}

/// A transfer as the resolver asks for it (already checked).
#[derive(Debug, Clone)]
pub(crate) struct TransferRequest {
    /// The inventory.
    pub inventory_id: Uuid,
    /// The source location.
    pub from: Uuid,
    /// The target location, not the source.
    pub to: Uuid,
    /// Units, 1 to the maximum quantity.
    pub quantity: i32,
    /// The inventory's version the operator saw, if given.
    pub expected_version: Option<i32>,
    /// The idempotency key, if given.
    pub idempotency_key: Option<String>,
}

/// How a transfer ended.
#[derive(Debug)]
pub(crate) enum TransferOutcome {
    /// The units moved (or, for a replayed key, had moved).
    Transferred {
        /// The inventory as the transfer left it (for a replay: the latest row).
        inventory: InventoryRow,
        /// The source level after it.
        from: LevelState,
        /// The target level after it.
        to: LevelState,
    },
    /// The source holds fewer units than asked for; nothing moved.
    SoldOut {
        /// Units asked for.
        requested: i32,
        /// What the source holds (0 when it never held this inventory).
        available: i32,
        /// The latest committed row.
        inventory: InventoryRow,
    },
    /// `expectedVersion` was stale (or collisions ran out); the latest row.
    Conflict {
        /// The version the client sent (or, without one, the version last seen).
        expected_version: i32,
        /// The latest committed row.
        inventory: InventoryRow,
    },
    /// No inventory has that id.
    InventoryNotFound,
    /// No location has this id (the source is named first when neither exists).
    LocationNotFound(Uuid),
}

impl LocationService {
    /// The service over `state`'s pool, collision policy and limits.
    pub(crate) fn new(state: &AppState) -> Self {
        Self { db: state.db.clone(), collisions: state.collisions.clone(), limits: state.limits.clone() }
    }

    /// One page of locations by priority then code: `first` rows (checked
    /// against the limits) after the cursor `after`, with one more when more follow.
    pub(crate) async fn page(
        &self,
        first: Option<i32>,
        after: Option<&str>,
    ) -> Result<(Page<LocationCursor>, Vec<LocationRow>), AppError> {
        let page = Page::parse(first, after, self.limits.max_page_size)?;
        let rows = store::page(&self.db, page.clone()).await?;
        Ok((page, rows))
    }

    /// A new location; a taken code is bad input.
    pub(crate) async fn create(&self, code: &str, name: &str, priority: i32) -> Result<LocationRow, AppError> {
        match store::create(&self.db, code, name, priority).await {
            Ok(row) => Ok(row),
            Err(err) if matches!(classify(&err), DbFailure::UniqueViolation(_)) => {
                Err(AppError::bad_input("input.code", format!("a location with code {code:?} already exists")))
            }
            Err(err) => Err(err.into()),
        }
    }

    /// Changes the given fields of a location; `None` when there is none with `id`.
    pub(crate) async fn update(
        &self,
        id: Uuid,
        name: Option<&str>,
        priority: Option<i32>,
        active: Option<bool>,
    ) -> Result<Option<LocationRow>, AppError> {
        Ok(store::update(&self.db, id, name, priority, active).await?)
    }

    /// Moves units between two locations of an inventory for `user_id` (see
    /// `stock::moving::transfer`). A key this user already used for this
    /// very request replays its outcome with the latest rows; for another
    /// request it is `IDEMPOTENCY_KEY_REUSED`. When collision retries run
    /// out the answer is `Conflict` with the latest row, as for a restock.
    pub(crate) async fn transfer(&self, user_id: &str, request: &TransferRequest) -> Result<TransferOutcome, AppError> {
        let TransferRequest { inventory_id, from, to, quantity, expected_version, .. } = *request;
        let key = request
            .idempotency_key
            .clone()
            .map(|key| Key::transfer(key, inventory_id, (from, to), quantity, expected_version));
        if let Some(key) = &key
            && idempotency::claimed(&self.db, user_id, key).await?
        {
            return self.replay(request).await;
        }
        // Locations are never deleted, so one read before the statement
        // tells an unknown one for good (and keeps the target level's
        // foreign key from failing the statement).
        let known = read_answer!(&self.db, |db| store::find_many(db, &[from, to]))?;
        if let Some(missing) = [from, to].into_iter().find(|id| !known.iter().any(|location| location.id == *id)) {
            return Ok(TransferOutcome::LocationNotFound(missing));
        }
        let transfer = Transfer {
            inventory_id,
            from,
            to,
            quantity,
            expected_version,
            user_id,
            key: key.as_ref().map(|key| (key.key.as_str(), key.fingerprint.as_str())),
        };
        let moved = match store::transfer(&self.db, &self.collisions, transfer).await {
            Ok(attempted) => attempted.done(),
            // The same key's first request committed meanwhile.
            Err(err) if idempotency::is_taken(&err) => {
                let Some(key) = &key else { return Err(err.into()) };
                if idempotency::claimed(&self.db, user_id, key).await? {
                    return self.replay(request).await;
                }
                return Err(err.into());
            }
            Err(err) => return Err(err.into()),
        };
        if let Ok(Some(moved)) = moved {
            // Reserved and committed units are read right after, in a
            // statement of their own (a transfer moves neither) that a
            // serialization failure cannot turn into a retryable error now
            // that the units have moved (see `levels`); the available units
            // are the transfer statement's own.
            let (mut from_level, mut to_level) = self.levels(inventory_id, from, to).await?;
            from_level.available = moved.from_available.into();
            to_level.available = moved.to_available.into();
            return Ok(TransferOutcome::Transferred { inventory: moved.inventory, from: from_level, to: to_level });
        }
        let Some(inventory) = self.inventory(inventory_id).await? else {
            return Ok(TransferOutcome::InventoryNotFound);
        };
        match (moved, expected_version) {
            // Collision retries that ran out are answered as a stale
            // version is: `Conflict` with the latest row.
            (Err(_exhausted), expected) => {
                Ok(TransferOutcome::Conflict { expected_version: expected.unwrap_or(inventory.version), inventory })
            }
            (_, Some(expected)) if expected != inventory.version => {
                Ok(TransferOutcome::Conflict { expected_version: expected, inventory })
            }
            _ => {
                let (source, _) = self.levels(inventory_id, from, to).await?;
                let available = i32::try_from(source.available).unwrap_or(i32::MAX);
                Ok(TransferOutcome::SoldOut { requested: quantity, available, inventory })
            }
        }
    }

    /// The outcome of a transfer whose key it already claimed: the latest
    /// inventory row and levels.
    async fn replay(&self, request: &TransferRequest) -> Result<TransferOutcome, AppError> {
        let inventory = self
            .inventory(request.inventory_id)
            .await?
            .ok_or_else(|| AppError::internal(anyhow::anyhow!("a transferred inventory is missing")))?;
        let (from, to) = self.levels(request.inventory_id, request.from, request.to).await?;
        Ok(TransferOutcome::Transferred { inventory, from, to })
    }

    /// The latest inventory row, read again after a collision: it answers
    /// a transfer that moved nothing or a replay ([`read_answer!`]).
    async fn inventory(&self, inventory_id: Uuid) -> Result<Option<InventoryRow>, AppError> {
        Ok(read_answer!(&self.db, |db| inventories::find(db, inventory_id))?)
    }

    /// The latest levels of an inventory at `from` and `to`, each with
    /// nothing when it has none there. Read again after a collision
    /// ([`read_answer!`]): it answers a transfer whose units have moved.
    async fn levels(&self, inventory_id: Uuid, from: Uuid, to: Uuid) -> Result<(LevelState, LevelState), AppError> {
        let levels = read_answer!(&self.db, |db| store::levels(db, &[inventory_id]))?;
        let at = |location_id: Uuid| {
            let level = levels.iter().find(|level| level.location_id == location_id).cloned();
            level.unwrap_or_else(|| LevelState::empty(inventory_id, location_id))
        };
        Ok((at(from), at(to)))
    }
}
