//! The per-request order DataLoaders: every `order(id:)` of one request is
//! fetched with one statement, and the `items` of every order in one
//! response with one more. Its batches are reads that build answers,
//! mutations' included ([`read_answer!`]).

use std::{collections::HashMap, sync::Arc};

use async_graphql::dataloader::Loader;
use sea_orm::DbErr;
use uuid::Uuid;

use super::domain::Order;
use crate::{context::pool_loader, db::read_answer, reservations::ReservationRow};

pool_loader! {
    /// Loads orders by id in batches.
    OrderLoader
}

impl Loader<Uuid> for OrderLoader {
    type Value = Order;
    type Error = Arc<DbErr>;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, Order>, Self::Error> {
        let orders = read_answer!(&self.db, |db| super::store::find_many(db, keys))?;
        Ok(orders.into_iter().map(|order| (order.id, order)).collect())
    }
}

pool_loader! {
    /// Loads order lines by order id in batches.
    OrderLinesLoader
}

impl Loader<Uuid> for OrderLinesLoader {
    type Value = Vec<ReservationRow>;
    type Error = Arc<DbErr>;

    async fn load(&self, keys: &[Uuid]) -> Result<HashMap<Uuid, Self::Value>, Self::Error> {
        let mut lines: HashMap<Uuid, Self::Value> = HashMap::new();
        for line in read_answer!(&self.db, |db| super::store::lines(db, keys))? {
            if let Some(order_id) = line.order_id {
                lines.entry(order_id).or_default().push(line);
            }
        }
        for order_lines in lines.values_mut() {
            order_lines.sort_by_key(|line| line.inventory_id);
        }
        Ok(lines)
    }
}
