//! `Inventory.waiting` for a page of inventories in one statement.

use std::{collections::HashMap, sync::Arc};

use async_graphql::dataloader::Loader;
use sea_orm::DbErr;
use uuid::Uuid;

use crate::{context::pool_loader, db::read_answer};

pool_loader! {
    /// Loads the units wanted by each inventory's WAITING entries in batches.
    WaitingLoader
}

impl Loader<Uuid> for WaitingLoader {
    type Value = i64;
    type Error = Arc<DbErr>;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, i64>, Self::Error> {
        Ok(read_answer!(&self.db, |db| super::store::waiting(db, keys))?.into_iter().collect())
    }
}
