//! The per-request inventory DataLoaders: every `inventory` field resolved in
//! one request is fetched with one `WHERE id = ANY($1)` statement, every
//! `inventoryBySku` with one `WHERE sku = ANY($1)`. The stock states
//! (`available`, `reserved`, `committed`, `onHand`) are the sums of the
//! levels (`locations::loader::LevelsLoader`), read with them.
//!
//! A loader is made for each request and dropped with it, so its cache never
//! serves a version older than the request. Its batches are reads that build
//! answers, mutations' included ([`read_answer!`]).

use std::{collections::HashMap, sync::Arc};

use async_graphql::dataloader::Loader;
use sea_orm::DbErr;
use uuid::Uuid;

use super::InventoryRow as Model;
use crate::{context::pool_loader, db::read_answer};

pool_loader! {
    /// Loads inventories by id in batches.
    InventoryLoader
}

impl Loader<Uuid> for InventoryLoader {
    type Value = Model;
    type Error = Arc<DbErr>;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, Model>, Self::Error> {
        let rows = read_answer!(&self.db, |db| super::store::find_many(db, keys.iter().copied()))?;
        Ok(rows.into_iter().map(|row| (row.id, row)).collect())
    }
}

pool_loader! {
    /// Loads inventories by SKU in batches, so aliased `inventoryBySku` fields
    /// cost one statement however many there are.
    InventoryBySkuLoader
}

impl Loader<String> for InventoryBySkuLoader {
    type Value = Model;
    type Error = Arc<DbErr>;

    async fn load(&self, keys: &[String]) -> Result<HashMap<String, Model>, Self::Error> {
        let rows = read_answer!(&self.db, |db| super::store::find_by_skus(db, keys))?;
        Ok(rows.into_iter().map(|row| (row.sku.clone(), row)).collect())
    }
}

pool_loader! {
    /// Loads ledger rows by id in batches (for `node(id:)`).
    MovementLoader
}

impl Loader<Uuid> for MovementLoader {
    type Value = super::movements::Model;
    type Error = Arc<DbErr>;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, Self::Value>, Self::Error> {
        let rows = read_answer!(&self.db, |db| super::movements::find_many(db, keys))?;
        Ok(rows.into_iter().map(|row| (row.id, row)).collect())
    }
}
