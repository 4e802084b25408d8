//! The per-request reservation DataLoader: every `reservation(id:)` of one
//! request is fetched with one statement, so aliases cannot multiply round
//! trips. Its batches are reads that build answers, mutations' included
//! ([`read_answer!`]).

use std::{collections::HashMap, sync::Arc};

use async_graphql::dataloader::Loader;
use sea_orm::DbErr;
use uuid::Uuid;

use super::ReservationRow;
use crate::{context::pool_loader, db::read_answer};

pool_loader! {
    /// Loads reservations by id in batches.
    ReservationLoader
}

impl Loader<Uuid> for ReservationLoader {
    type Value = ReservationRow;
    type Error = Arc<DbErr>;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, ReservationRow>, Self::Error> {
        let rows = read_answer!(&self.db, |db| super::store::find_many(db, keys))?;
        Ok(rows.into_iter().map(|row| (row.id, row)).collect())
    }
}
