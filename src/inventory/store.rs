//! SQL for inventories: reads, and running the `stock` statements that
//! create and restock (each writes its ledger entry in the same statement,
//! so the ledger can never disagree with the row). `service.rs` decides what
//! a result means.

use std::sync::Arc;

use sea_orm::{ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, FromQueryResult, QueryFilter};
use uuid::Uuid;

use crate::{
    db::{Attempted, Collisions},
    live,
    pagination::{self, Page},
    stock::{
        allocating, receiving,
        rows::inventory::{Column, Entity, Model},
    },
};

/// One inventory by id.
pub(crate) async fn find(db: &impl ConnectionTrait, id: Uuid) -> Result<Option<Model>, DbErr> {
    Entity::find_by_id(id).one(db).await
}

/// The inventories with these ids (missing ones are left out).
pub(crate) async fn find_many(
    db: &impl ConnectionTrait,
    ids: impl IntoIterator<Item = Uuid>,
) -> Result<Vec<Model>, DbErr> {
    Entity::find().filter(Column::Id.is_in(ids)).all(db).await
}

/// The inventories with these SKUs (missing ones are left out).
pub(crate) async fn find_by_skus(db: &impl ConnectionTrait, skus: &[String]) -> Result<Vec<Model>, DbErr> {
    Entity::find().filter(Column::Sku.is_in(skus.iter().cloned())).all(db).await
}

/// One page in `(created_at, id)` order, with one extra row when more follow.
pub(crate) async fn page(db: &DatabaseConnection, page: Page) -> Result<Vec<Model>, DbErr> {
    pagination::keyset(Entity::find(), Column::CreatedAt, Column::Id, page).all(db).await
}

/// Runs the creation of an inventory with its `CREATED` ledger entry at
/// `location_id` (None: the default location); the row as created, none
/// when the location does not exist.
pub(crate) async fn create(
    db: &DatabaseConnection,
    id: Uuid,
    sku: &str,
    name: &str,
    stock: i32,
    location_id: Option<Uuid>,
) -> Result<Option<Model>, DbErr> {
    db.query_one_raw(receiving::create(id, sku, name, stock, location_id))
        .await?
        .map(|row| Model::from_query_result(&row, ""))
        .transpose()
}

/// Runs a restock, re-run on collisions; the row as left when it matched.
pub(crate) async fn restock(
    db: &DatabaseConnection,
    collisions: &Collisions,
    id: Uuid,
    quantity: i32,
    expected_version: Option<i32>,
    location_id: Option<Uuid>,
) -> Result<Attempted<Option<Model>>, DbErr> {
    let run = || async {
        let row = db.query_one_raw(receiving::restock(id, quantity, expected_version, location_id)).await?;
        row.map(|row| Model::from_query_result(&row, "")).transpose()
    };
    collisions.run(id, run).await
}

/// Which of `ids` name no location (none when all are known).
pub(crate) async fn unknown_locations(db: &impl ConnectionTrait, ids: &[Uuid]) -> Result<Vec<Uuid>, DbErr> {
    let rows = db.query_all_raw(allocating::unknown(ids)).await?;
    rows.iter().map(|row| row.try_get("", "id")).collect()
}

impl live::Followed for Model {
    fn id(&self) -> Uuid {
        self.id
    }

    fn version(&self) -> i32 {
        self.version
    }

    /// An inventory can always change again.
    fn is_final(&self) -> bool {
        false
    }
}

/// The inventories as the live feed follows them: the trigger announces a
/// changed row as JSON on `inventory_changed` and, for a checkout, which
/// changes what an inventory holds but not its row, the id alone on
/// `inventory_states_changed` (see the migrations).
pub(crate) fn live_source() -> live::Source<Model> {
    live::Source {
        watchers: "inventory_watchers",
        key: "inventory_id",
        rows: "inventory_changed",
        ids: Some("inventory_states_changed"),
        parse: |payload| serde_json::from_str(payload).map_err(|err| err.to_string()),
        read: Arc::new(|db, ids| Box::pin(async move { find_many(&db, ids).await })),
    }
}
