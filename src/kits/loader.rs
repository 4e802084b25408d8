//! The per-request kit DataLoaders: every kit, kit reservation, list of
//! components, list of a kit reservation's reservations and kit
//! availability resolved in one request is read with one statement per
//! kind, so a page of 100 kits with their `available` costs one statement
//! for the availability, not one per kit or component.

use std::{collections::HashMap, sync::Arc};

use async_graphql::dataloader::Loader;
use sea_orm::DbErr;
use uuid::Uuid;

use super::{
    rows::{ComponentRow, KitReservationRow, KitRow},
    store,
};
use crate::{context::pool_loader, db::read_answer, reservations::ReservationRow};

pool_loader! {
    /// Loads kits by id in batches.
    KitLoader
}

impl Loader<Uuid> for KitLoader {
    type Value = KitRow;
    type Error = Arc<DbErr>;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, KitRow>, Self::Error> {
        let rows = read_answer!(&self.db, |db| store::find_many(db, keys))?;
        Ok(rows.into_iter().map(|row| (row.id, row)).collect())
    }
}

pool_loader! {
    /// Loads kits by sku in batches.
    KitBySkuLoader
}

impl Loader<String> for KitBySkuLoader {
    type Value = KitRow;
    type Error = Arc<DbErr>;

    async fn load(&self, keys: &[String]) -> Result<HashMap<String, KitRow>, Self::Error> {
        let rows = read_answer!(&self.db, |db| store::find_by_skus(db, keys))?;
        Ok(rows.into_iter().map(|row| (row.sku.clone(), row)).collect())
    }
}

pool_loader! {
    /// Loads kits' components by kit id in batches.
    ComponentsLoader
}

impl Loader<Uuid> for ComponentsLoader {
    type Value = Vec<ComponentRow>;
    type Error = Arc<DbErr>;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, Vec<ComponentRow>>, Self::Error> {
        let rows = read_answer!(&self.db, |db| store::components(db, keys))?;
        let mut by_kit: HashMap<Uuid, Vec<ComponentRow>> = HashMap::new();
        for row in rows {
            by_kit.entry(row.kit_id).or_default().push(row);
        }
        Ok(by_kit)
    }
}

pool_loader! {
    /// Loads what kits offer by kit id, a batch in one statement (one snapshot).
    AvailableLoader
}

impl Loader<Uuid> for AvailableLoader {
    type Value = i32;
    type Error = Arc<DbErr>;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, i32>, Self::Error> {
        Ok(read_answer!(&self.db, |db| store::available(db, keys))?)
    }
}

pool_loader! {
    /// Loads kit reservations by id in batches.
    KitReservationLoader
}

impl Loader<Uuid> for KitReservationLoader {
    type Value = KitReservationRow;
    type Error = Arc<DbErr>;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, KitReservationRow>, Self::Error> {
        let rows = read_answer!(&self.db, |db| store::kit_reservations(db, keys))?;
        Ok(rows.into_iter().map(|row| (row.id, row)).collect())
    }
}

pool_loader! {
    /// Loads kit reservations' component reservations by kit reservation id in batches.
    PartsLoader
}

impl Loader<Uuid> for PartsLoader {
    type Value = Vec<ReservationRow>;
    type Error = Arc<DbErr>;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, Vec<ReservationRow>>, Self::Error> {
        let rows = read_answer!(&self.db, |db| store::parts(db, keys))?;
        let mut by_kit: HashMap<Uuid, Vec<ReservationRow>> = HashMap::new();
        for row in rows {
            if let Some(id) = row.kit_reservation_id {
                by_kit.entry(id).or_default().push(row);
            }
        }
        Ok(by_kit)
    }
}
