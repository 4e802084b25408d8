//! The per-request inventory DataLoader: every `inventory` field resolved in
//! one request is fetched with one `WHERE id = ANY($1)` statement.
//!
//! A loader is made for each request and dropped with it, so its cache never
//! serves a version older than the request.

use std::{collections::HashMap, sync::Arc};

use async_graphql::dataloader::Loader;
use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter};
use uuid::Uuid;

use super::entity::{Column, Entity, Model};

/// Loads inventories by id in batches.
pub struct InventoryLoader {
    /// The pool the batch statement runs on.
    pub db: DatabaseConnection,
}

impl Loader<Uuid> for InventoryLoader {
    type Value = Model;
    type Error = Arc<DbErr>;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, Model>, Self::Error> {
        let rows = Entity::find().filter(Column::Id.is_in(keys.iter().copied())).all(&self.db).await?;
        Ok(rows.into_iter().map(|row| (row.id, row)).collect())
    }
}
