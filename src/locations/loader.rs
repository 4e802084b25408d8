//! The per-request location DataLoaders: every location named in one
//! response is fetched with one `WHERE id = ANY($1)` statement, the levels
//! of every inventory in it with one more, and the allocations of every
//! reservation and order line in it with one more.
//!
//! A loader is made for each request and dropped with it, so its cache never
//! serves anything older than the request. Its batches are reads that build
//! answers, mutations' included ([`read_answer!`]).

use std::{collections::HashMap, sync::Arc};

use async_graphql::dataloader::Loader;
use sea_orm::DbErr;
use uuid::Uuid;

use super::{LocationRow, store, store::LevelState};
use crate::{context::pool_loader, db::read_answer, stock::rows::AllocationRow};

pool_loader! {
    /// Loads locations by id in batches.
    LocationLoader
}

impl Loader<Uuid> for LocationLoader {
    type Value = LocationRow;
    type Error = Arc<DbErr>;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, LocationRow>, Self::Error> {
        let rows = read_answer!(&self.db, |db| store::find_many(db, keys))?;
        Ok(rows.into_iter().map(|row| (row.id, row)).collect())
    }
}

pool_loader! {
    /// Loads the levels of inventories by inventory id in batches, each
    /// inventory's by priority then code; an inventory with none has an empty list.
    LevelsLoader
}

impl Loader<Uuid> for LevelsLoader {
    type Value = Vec<LevelState>;
    type Error = Arc<DbErr>;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, Self::Value>, Self::Error> {
        let mut levels: HashMap<Uuid, Self::Value> = keys.iter().map(|id| (*id, Vec::new())).collect();
        for level in read_answer!(&self.db, |db| store::levels(db, keys))? {
            levels.entry(level.inventory_id).or_default().push(level);
        }
        Ok(levels)
    }
}

pool_loader! {
    /// Loads the allocations of reservations (and order lines) by reservation
    /// id in batches, each reservation's by priority then code.
    AllocationsLoader
}

impl Loader<Uuid> for AllocationsLoader {
    type Value = Vec<AllocationRow>;
    type Error = Arc<DbErr>;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, Self::Value>, Self::Error> {
        let mut allocations: HashMap<Uuid, Self::Value> = keys.iter().map(|id| (*id, Vec::new())).collect();
        for allocation in read_answer!(&self.db, |db| store::allocations(db, keys))? {
            allocations.entry(allocation.reservation_id).or_default().push(allocation);
        }
        Ok(allocations)
    }
}
