//! `Inventory.waiting` and `Kit.waiting` for a page of inventories (or
//! kits) in one statement.

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
        Ok(read_answer!(&self.db, |db| super::store::waiting(db, false, keys))?.into_iter().collect())
    }
}

pool_loader! {
    /// Loads the kits wanted by each kit's WAITING entries in batches.
    KitWaitingLoader
}

impl Loader<Uuid> for KitWaitingLoader {
    type Value = i64;
    type Error = Arc<DbErr>;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, i64>, Self::Error> {
        Ok(read_answer!(&self.db, |db| super::store::waiting(db, true, keys))?.into_iter().collect())
    }
}
