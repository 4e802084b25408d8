//! The per-request reservation DataLoader: every `reservation(id:)` of one
//! request is fetched with one statement, so aliases cannot multiply round
//! trips.

use std::{collections::HashMap, sync::Arc};

use async_graphql::dataloader::Loader;
use sea_orm::DbErr;
use uuid::Uuid;

use super::ReservationRow;
use crate::context::pool_loader;

pool_loader! {
    /// Loads reservations by id in batches.
    ReservationLoader
}

impl Loader<Uuid> for ReservationLoader {
    type Value = ReservationRow;
    type Error = Arc<DbErr>;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, ReservationRow>, Self::Error> {
        let rows = super::store::find_many(&self.db, keys).await?;
        Ok(rows.into_iter().map(|row| (row.id, row)).collect())
    }
}
