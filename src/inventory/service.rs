//! Inventory use cases: create and restock, and what their statements'
//! results mean (a taken SKU is bad input; a restock that matched nothing is
//! not found or a conflict); pages of inventories and of their ledger, and
//! live changes. The SQL runs in `store.rs` and `movements.rs`.

use std::sync::Arc;

use futures::stream::BoxStream;
use sea_orm::DatabaseConnection;
use uuid::Uuid;

use super::{InventoryRow, movements, store};
use crate::{
    app::AppState,
    config::Limits,
    db::{Collisions, DbFailure, classify, read_answer},
    error::AppError,
    live::{Feed, WatchError},
    pagination::{Page, VersionCursor},
};

/// The inventory feature as the resolvers see it: one per server process,
/// built by the composition root and handed to the schema as data.
#[derive(Clone)]
pub(crate) struct InventoryService {
    /// The connection pool.
    db: DatabaseConnection,
    /// Re-runs collided statements.
    collisions: Collisions,
    /// The limits pages are checked against.
    limits: Arc<Limits>,
}

/// How a restock ended.
#[derive(Debug)]
pub(crate) enum RestockOutcome {
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

impl InventoryService {
    /// The service over `state`'s pool, collision policy and limits.
    pub(crate) fn new(state: &AppState) -> Self {
        Self { db: state.db.clone(), collisions: state.collisions.clone(), limits: state.limits.clone() }
    }

    /// A new inventory at version 1 with its stock at `location_id` (None:
    /// the default location; see [`create`]).
    pub(crate) async fn create(
        &self,
        sku: &str,
        name: &str,
        stock: i32,
        location_id: Option<Uuid>,
    ) -> Result<InventoryRow, AppError> {
        create(&self.db, sku, name, stock, location_id).await
    }

    /// Adds `quantity` units at `location_id` (None: the default location),
    /// optionally only if the row is still at `expected_version`. An unknown
    /// location is bad input. When collision retries run out the answer is
    /// `Conflict` with the latest row.
    pub(crate) async fn restock(
        &self,
        id: Uuid,
        quantity: i32,
        expected_version: Option<i32>,
        location_id: Option<Uuid>,
    ) -> Result<RestockOutcome, AppError> {
        known_location(&self.db, location_id).await?;
        let restocked = store::restock(&self.db, &self.collisions, id, quantity, expected_version, location_id).await;
        let row = match restocked {
            // Collision retries that ran out are answered as a stale
            // version is: `Conflict` with the latest row.
            Ok(attempted) => attempted.done().unwrap_or(None),
            Err(err) if classify(&err) == DbFailure::OutOfRange => {
                return Err(AppError::bad_input("input.quantity", "stock would exceed the largest storable amount"));
            }
            Err(err) => return Err(err.into()),
        };
        if let Some(row) = row {
            return Ok(RestockOutcome::Restocked(row));
        }
        Ok(match read_answer!(&self.db, |db| store::find(db, id))? {
            None => RestockOutcome::NotFound,
            Some(inventory) => {
                RestockOutcome::Conflict { expected_version: expected_version.unwrap_or(inventory.version), inventory }
            }
        })
    }

    /// One page of inventories, oldest first: `first` rows (checked against
    /// the limits) after the cursor `after`, with one more when more follow.
    pub(crate) async fn page(
        &self,
        first: Option<i32>,
        after: Option<&str>,
    ) -> Result<(Page, Vec<InventoryRow>), AppError> {
        let page = Page::parse(first, after, self.limits.max_page_size)?;
        Ok((page, store::page(&self.db, page).await?))
    }

    /// One page of inventory `id`'s ledger in version order, as [`Self::page`].
    pub(crate) async fn movements(
        &self,
        id: Uuid,
        first: Option<i32>,
        after: Option<&str>,
    ) -> Result<(Page<VersionCursor>, Vec<movements::Model>), AppError> {
        let page = Page::parse(first, after, self.limits.max_page_size)?;
        Ok((page, read_answer!(&self.db, |db| movements::page(db, id, page))?))
    }

    /// Every committed change of inventory `id` from now on (see
    /// [`Feed::watch`]); none when no inventory has that id.
    pub(crate) async fn watch(
        &self,
        live: &Feed<InventoryRow>,
        id: Uuid,
    ) -> Result<Option<BoxStream<'static, InventoryRow>>, AppError> {
        match live.watch(self.db.clone(), id).await {
            Ok(changes) => Ok(Some(changes)),
            Err(WatchError::NotFound) => Ok(None),
            Err(WatchError::Db(err)) => Err(err.into()),
        }
    }
}

/// A new inventory at version 1 with its stock and `CREATED` ledger entry
/// at `location_id` (None: the default location). A taken SKU or an
/// unknown location is bad input. Also what `stockguard seed` runs,
/// without a server.
pub(crate) async fn create(
    db: &DatabaseConnection,
    sku: &str,
    name: &str,
    stock: i32,
    location_id: Option<Uuid>,
) -> Result<InventoryRow, AppError> {
    known_location(db, location_id).await?;
    match store::create(db, Uuid::new_v4(), sku, name, stock, location_id).await {
        Ok(Some(row)) => Ok(row),
        // The location was there a moment ago: removed since? Locations are
        // never removed, so this is not an outcome a client can cause.
        Ok(None) => Err(AppError::internal(anyhow::anyhow!("creating inventory {sku:?} returned no row"))),
        Err(err) if matches!(classify(&err), DbFailure::UniqueViolation(_)) => {
            Err(AppError::bad_input("input.sku", format!("an inventory with sku {sku:?} already exists")))
        }
        Err(err) => Err(err.into()),
    }
}

/// Refuses a `locationId` that names no location (`BAD_USER_INPUT`);
/// None, the default location, always exists.
async fn known_location(db: &DatabaseConnection, location_id: Option<Uuid>) -> Result<(), AppError> {
    let Some(id) = location_id else { return Ok(()) };
    if read_answer!(db, |db| store::unknown_locations(db, &[id]))?.is_empty() {
        return Ok(());
    }
    Err(AppError::bad_input("input.locationId", format!("no location has id {id}")))
}
