//! A single reservation request, how it ended, and the replay of its key:
//! what the service, the one-statement path (`alone.rs`) and the coalesced
//! path (`coalesce.rs`) share, so each of them imports it from here and
//! none from another.

use sea_orm::DatabaseConnection;
use uuid::Uuid;

use super::ReservationRow;
use crate::{
    db::read_answer,
    error::AppError,
    idempotency::{self, Key},
    inventory::{InventoryRow, store as inventory_store},
    stock::allocating::Allocating,
};

/// A checked reservation request.
#[derive(Debug, Clone)]
pub struct ReserveRequest {
    /// The inventory to take from.
    pub inventory_id: Uuid,
    /// Units, already checked against the limits.
    pub quantity: i32,
    /// The version the client saw, for the optimistic check.
    pub expected_version: Option<i32>,
    /// The client's idempotency key.
    pub idempotency_key: Option<String>,
    /// Seconds until the reservation expires; 0 = never.
    pub ttl_secs: i32,
    /// Where its units may come from (location ids already checked).
    pub allocating: Allocating,
    /// Whether it may take the levels' safety stock (an operator's
    /// `useSafetyStock`, checked); a customer's never does.
    pub use_safety_stock: bool,
}

impl ReserveRequest {
    /// Its idempotency key with the request's fingerprint, if it sent one.
    pub(super) fn key(&self) -> Option<Key> {
        let key = self.idempotency_key.clone()?;
        let Self { inventory_id, quantity, expected_version, .. } = *self;
        Some(Key::reserve(key, inventory_id, quantity, expected_version, &self.allocating, self.use_safety_stock))
    }
}

/// How a reservation request ended.
#[derive(Debug)]
pub enum ReserveOutcome {
    /// Stock was taken (now, or by the first request with this idempotency key).
    Reserved {
        /// The reservation.
        reservation: ReservationRow,
        /// The inventory as the reserving statement left it (for a replay: the latest row).
        inventory: InventoryRow,
    },
    /// The row is no longer at the expected version; nothing was taken.
    Conflict {
        /// The version the request expected (or, without one, the last seen).
        expected_version: i32,
        /// The latest committed row.
        inventory: InventoryRow,
    },
    /// Not enough stock; nothing was taken.
    SoldOut {
        /// Units asked for.
        requested: i32,
        /// What the eligible locations offer the request (its sellable
        /// units; see `SoldOut.available`).
        available: i32,
        /// The latest committed row.
        inventory: InventoryRow,
    },
    /// No inventory has that id.
    InventoryNotFound,
}

/// The first outcome of a single `reserve` with this key, if one took stock
/// (its reservation, and the inventory as it is now).
pub(super) async fn replay(
    db: &DatabaseConnection,
    user_id: &str,
    key: Option<&Key>,
) -> Result<Option<ReserveOutcome>, AppError> {
    let Some(key) = key else { return Ok(None) };
    let Some(first) = idempotency::first_use(db, user_id, key).await? else { return Ok(None) };
    let inventory = read_answer!(db, |db| inventory_store::find(db, first.inventory_id))?
        .ok_or_else(|| AppError::internal(anyhow::anyhow!("a reservation's inventory is missing")))?;
    Ok(Some(ReserveOutcome::Reserved { reservation: first, inventory }))
}
