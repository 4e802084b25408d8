//! The adjustment use cases: an operator's `adjustStock`, with what its
//! statement's row means (applied, a count that matched, more taken than
//! available, a count below what is held, a stale version, no such
//! inventory or location) and idempotency-key replays; and
//! `setSafetyStock`. The SQL runs in `store.rs`.

use sea_orm::DatabaseConnection;
use uuid::Uuid;

use super::store::{self, Judged};
use crate::{
    app::AppState,
    db::{Collisions, DbFailure, Exhausted, classify, read_answer},
    error::AppError,
    idempotency::{self, Key},
    inventory::{InventoryRow, store as inventories},
    locations::store::{self as levels, LevelState},
    stock::correcting::{Adjustment, Change},
};

/// The adjustments feature as the resolvers see it: one per server
/// process, built by the composition root and handed to the schema as data.
#[derive(Clone)]
pub(crate) struct AdjustmentService {
    /// The connection pool.
    db: DatabaseConnection,
    /// Re-runs collided statements.
    collisions: Collisions,
}

/// How an adjustment ended.
#[derive(Debug)]
pub(crate) enum AdjustOutcome {
    /// Applied (now, or by the first request with this key), or a count
    /// that matched (`delta` 0, nothing written).
    Adjusted {
        /// The inventory as the adjustment left it (for a replay: the latest row).
        inventory: InventoryRow,
        /// The level as the adjustment left it (for a replay: the latest).
        level: LevelState,
        /// The change of the level's units, as applied.
        delta: i32,
    },
    /// A negative delta beyond the level's available units; nothing written.
    SoldOut {
        /// Units the delta would have taken.
        requested: i32,
        /// The level's available units.
        available: i32,
        /// The inventory as judged.
        inventory: InventoryRow,
    },
    /// A count below what reservations hold at the level; nothing written.
    CountBelowHeld {
        /// The level as judged.
        level: LevelState,
        /// Its reserved and committed units.
        held: i64,
    },
    /// The inventory is not at the expected version (or collision retries
    /// ran out); nothing written.
    Conflict {
        /// The version the request expected (or, without one, the latest).
        expected_version: i32,
        /// The latest committed row.
        inventory: InventoryRow,
    },
    /// No inventory has that id.
    InventoryNotFound,
    /// No location has that id.
    LocationNotFound(Uuid),
}

impl AdjustmentService {
    /// The service over `state`'s pool and collision policy.
    pub(crate) fn new(state: &AppState) -> Self {
        Self { db: state.db.clone(), collisions: state.collisions.clone() }
    }

    /// Adjusts one level for the operator `adjustment.operator` (see
    /// `stock::correcting::adjust`). A key this operator already used for
    /// this very request replays the delta it applied with the inventory and
    /// level as they are now; for another request it is
    /// `IDEMPOTENCY_KEY_REUSED`. A level pushed past the largest storable
    /// amount is `BAD_USER_INPUT`. When collision retries run out nothing
    /// was written: `Conflict` with the latest row, as for a restock.
    pub(crate) async fn adjust(
        &self,
        adjustment: Adjustment<'_>,
        key: Option<String>,
    ) -> Result<AdjustOutcome, AppError> {
        let key = key.map(|key| Key::adjust(key, &adjustment));
        if let Some(replayed) = self.replay(&adjustment, key.as_ref()).await? {
            return Ok(replayed);
        }
        let statement =
            Adjustment { key: key.as_ref().map(|k| (k.key.as_str(), k.fingerprint.as_str())), ..adjustment };
        let judged = match store::adjust(&self.db, &self.collisions, statement).await {
            Ok(attempted) => attempted.done(),
            // The same key's first request committed meanwhile.
            Err(err) if idempotency::is_taken(&err) => {
                return self
                    .replay(&adjustment, key.as_ref())
                    .await?
                    .ok_or_else(|| AppError::internal(anyhow::anyhow!("a taken idempotency key has no adjustment")));
            }
            Err(err) if classify(&err) == DbFailure::OutOfRange => {
                return Err(AppError::bad_input("input.delta", "stock would exceed the largest storable amount"));
            }
            Err(err) => return Err(err.into()),
        };
        let judged = match judged {
            Ok(judged) => judged,
            Err(Exhausted { .. }) => return self.exhausted(&adjustment).await,
        };
        // A change reads no hold (see `stock::correcting::adjust`): what
        // reservations hold there is read right after, in a statement of its
        // own that a collision cannot turn into a retryable error now that
        // the units have changed.
        let held = match judged.level {
            Some(level) if level.held.is_none() => {
                let inventory_id = adjustment.inventory_id;
                read_answer!(&self.db, |db| store::held(db, inventory_id, level.location_id))?
            }
            _ => (0, 0),
        };
        Ok(outcome(&adjustment, judged, held))
    }

    /// The answer of an adjustment whose collision retries ran out (nothing
    /// written): `Conflict` with the latest row.
    async fn exhausted(&self, adjustment: &Adjustment<'_>) -> Result<AdjustOutcome, AppError> {
        Ok(match read_answer!(&self.db, |db| inventories::find(db, adjustment.inventory_id))? {
            None => AdjustOutcome::InventoryNotFound,
            Some(inventory) => AdjustOutcome::Conflict {
                expected_version: adjustment.expected_version.unwrap_or(inventory.version),
                inventory,
            },
        })
    }

    /// The adjustment made by the first request with this key, if any: the
    /// delta it applied, with the inventory and level as they are now.
    async fn replay(&self, adjustment: &Adjustment<'_>, key: Option<&Key>) -> Result<Option<AdjustOutcome>, AppError> {
        let Some(key) = key else { return Ok(None) };
        let Some(delta) = idempotency::replay_adjustment(&self.db, adjustment.operator, key).await? else {
            return Ok(None);
        };
        let missing = || AppError::internal(anyhow::anyhow!("an adjusted inventory or location is missing"));
        let inventory_id = adjustment.inventory_id;
        let inventory = read_answer!(&self.db, |db| inventories::find(db, inventory_id))?.ok_or_else(missing)?;
        let location_id =
            read_answer!(&self.db, |db| store::location(db, adjustment.location_id))?.ok_or_else(missing)?;
        let found = read_answer!(&self.db, |db| levels::levels(db, &[inventory_id]))?;
        let level = found.into_iter().find(|level| level.location_id == location_id).ok_or_else(missing)?;
        Ok(Some(AdjustOutcome::Adjusted { inventory, level, delta }))
    }

    /// Sets the safety stock of an inventory at a location (none: the
    /// default one) to `quantity` (checked); the level as left, none when
    /// the inventory or location does not exist. When collision retries
    /// run out nothing was written: the retryable `DATABASE_UNAVAILABLE`.
    pub(crate) async fn set_safety_stock(
        &self,
        inventory_id: Uuid,
        location_id: Option<Uuid>,
        quantity: i32,
    ) -> Result<Option<LevelState>, AppError> {
        let set = store::set_safety_stock(&self.db, &self.collisions, inventory_id, location_id, quantity).await?;
        let Some(level) = set.done()? else { return Ok(None) };
        // Setting safety stock moves no held unit: what is held there is read after.
        let held = read_answer!(&self.db, |db| store::held(db, inventory_id, level.location_id))?;
        Ok(Some(level.state(inventory_id, held)))
    }
}

/// What an adjustment's statement row means, in the order a request is
/// judged: no inventory, no location, a stale version, then the units;
/// `held`, the level's reserved and committed units when the statement did
/// not read them.
fn outcome(adjustment: &Adjustment<'_>, judged: Judged, held: (i64, i64)) -> AdjustOutcome {
    let Judged { found, located, current, applied, delta, inventory, level } = judged;
    let (Some(inventory), true) = (inventory, found) else { return AdjustOutcome::InventoryNotFound };
    let Some(level) = level.filter(|_| located) else {
        return AdjustOutcome::LocationNotFound(adjustment.location_id.unwrap_or_default());
    };
    let level = level.state(adjustment.inventory_id, held);
    if !current {
        let expected_version = adjustment.expected_version.unwrap_or(inventory.version);
        return AdjustOutcome::Conflict { expected_version, inventory };
    }
    if applied || delta == 0 {
        return AdjustOutcome::Adjusted { inventory, level, delta };
    }
    // Not applied, yet current and not 0: the level's available units
    // cannot give what the change takes.
    match adjustment.change {
        Change::Delta(_) => AdjustOutcome::SoldOut {
            requested: -delta,
            available: i32::try_from(level.available).unwrap_or(i32::MAX),
            inventory,
        },
        Change::Count(_) => {
            let held = level.reserved + level.committed;
            AdjustOutcome::CountBelowHeld { level, held }
        }
    }
}
