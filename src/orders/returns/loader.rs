//! The per-request returns DataLoader: the returns of every order in one
//! response, with their lines, in two statements. Its batches are reads
//! that build answers, mutations' included ([`read_answer!`]).

use std::{collections::HashMap, sync::Arc};

use async_graphql::dataloader::Loader;
use sea_orm::DbErr;
use uuid::Uuid;

use super::store::{self, ReturnRecord};
use crate::{context::pool_loader, db::read_answer};

pool_loader! {
    /// Loads the returns of orders by order id in batches, each order's in
    /// the order they were made; an order with none has an empty list.
    ReturnsLoader
}

impl Loader<Uuid> for ReturnsLoader {
    type Value = Vec<ReturnRecord>;
    type Error = Arc<DbErr>;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, Self::Value>, Self::Error> {
        let mut returns: HashMap<Uuid, Self::Value> = keys.iter().map(|id| (*id, Vec::new())).collect();
        for record in read_answer!(&self.db, |db| store::of_orders(db, keys))? {
            returns.entry(record.row.order_id).or_default().push(record);
        }
        Ok(returns)
    }
}
