//! SQL for inventories: reads, and running the `stock` statements that
//! create and restock (each writes its ledger entry in the same statement,
//! so the ledger can never disagree with the row). `service.rs` decides what
//! a result means.

use sea_orm::{ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, FromQueryResult, QueryFilter};
use uuid::Uuid;

use super::entity::{Column, Entity, Model};
use crate::{
    db::{Attempted, Collisions},
    pagination::{self, Page},
    stock::receiving,
};

/// One inventory by id.
pub async fn find(db: &impl ConnectionTrait, id: Uuid) -> Result<Option<Model>, DbErr> {
    Entity::find_by_id(id).one(db).await
}

/// The inventories with these ids (missing ones are left out).
pub async fn find_many(db: &impl ConnectionTrait, ids: impl IntoIterator<Item = Uuid>) -> Result<Vec<Model>, DbErr> {
    Entity::find().filter(Column::Id.is_in(ids)).all(db).await
}

/// The inventories with these SKUs (missing ones are left out).
pub async fn find_by_skus(db: &DatabaseConnection, skus: &[String]) -> Result<Vec<Model>, DbErr> {
    Entity::find().filter(Column::Sku.is_in(skus.iter().cloned())).all(db).await
}

/// One page in `(created_at, id)` order, with one extra row when more follow.
pub async fn page(db: &DatabaseConnection, page: Page) -> Result<Vec<Model>, DbErr> {
    pagination::keyset(Entity::find(), Column::CreatedAt, Column::Id, page).all(db).await
}

/// Runs the creation of an inventory with its `CREATED` ledger entry; the row as created.
pub async fn create(
    db: &DatabaseConnection,
    id: Uuid,
    sku: &str,
    name: &str,
    stock: i32,
) -> Result<Option<Model>, DbErr> {
    db.query_one_raw(receiving::create(id, sku, name, stock))
        .await?
        .map(|row| Model::from_query_result(&row, ""))
        .transpose()
}

/// Runs a restock, re-run on collisions; the row as left when it matched.
pub async fn restock(
    db: &DatabaseConnection,
    collisions: &Collisions,
    id: Uuid,
    quantity: i32,
    expected_version: Option<i32>,
) -> Result<Attempted<Option<Model>>, DbErr> {
    let run = || async {
        let row = db.query_one_raw(receiving::restock(id, quantity, expected_version)).await?;
        row.map(|row| Model::from_query_result(&row, "")).transpose()
    };
    collisions.run(id, run).await
}
