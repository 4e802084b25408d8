//! Inventory use cases: create and restock, and what their statements'
//! results mean (a taken SKU is bad input; a restock that matched nothing is
//! not found or a conflict). The SQL runs in `store.rs`.

use sea_orm::DatabaseConnection;
use uuid::Uuid;

use super::{InventoryRow, store};
use crate::{
    db::{Attempted, Collisions, DbFailure, classify},
    error::AppError,
};

/// A new inventory at version 1 with its `CREATED` ledger entry. A taken SKU is bad input.
pub async fn create(db: &DatabaseConnection, sku: &str, name: &str, stock: i32) -> Result<InventoryRow, AppError> {
    match store::create(db, Uuid::new_v4(), sku, name, stock).await {
        Ok(Some(row)) => Ok(row),
        Ok(None) => Err(AppError::internal(anyhow::anyhow!("creating inventory {sku:?} returned no row"))),
        Err(err) if matches!(classify(&err), DbFailure::UniqueViolation(_)) => {
            Err(AppError::bad_input("input.sku", format!("an inventory with sku {sku:?} already exists")))
        }
        Err(err) => Err(err.into()),
    }
}

/// How a restock ended.
#[derive(Debug)]
pub enum RestockOutcome {
    /// Stock was added; the row as the statement left it.
    Restocked(InventoryRow),
    /// `expectedVersion` was stale (or collisions ran out); the latest row.
    Conflict {
        /// The version the client sent (or, without one, the version last seen).
        expected_version: i32,
        /// The latest committed row.
        inventory: InventoryRow,
    },
    /// No inventory has that id.
    NotFound,
}

/// Adds `quantity` units, optionally only if the row is still at `expected_version`.
pub async fn restock(
    db: &DatabaseConnection,
    collisions: &Collisions,
    id: Uuid,
    quantity: i32,
    expected_version: Option<i32>,
) -> Result<RestockOutcome, AppError> {
    let row = match store::restock(db, collisions, id, quantity, expected_version).await {
        Ok(Attempted::Done(row)) => row,
        Ok(Attempted::Exhausted { .. }) => None,
        Err(err) if classify(&err) == DbFailure::OutOfRange => {
            return Err(AppError::bad_input("input.quantity", "stock would exceed the largest storable amount"));
        }
        Err(err) => return Err(err.into()),
    };
    if let Some(row) = row {
        return Ok(RestockOutcome::Restocked(row));
    }
    Ok(match store::find(db, id).await? {
        None => RestockOutcome::NotFound,
        Some(inventory) => {
            RestockOutcome::Conflict { expected_version: expected_version.unwrap_or(inventory.version), inventory }
        }
    })
}
