//! The stock ledger (`stock_movements`): one row per committed change of an
//! inventory, written by the same statement as the change. Read here; written
//! only by the statements that change stock.

use chrono::{DateTime, Utc};
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect, entity::prelude::*,
};

use crate::pagination::{Page, VersionCursor};

/// Why stock changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "Text")]
pub enum MovementReason {
    /// The inventory was created with its initial stock.
    #[sea_orm(string_value = "CREATED")]
    Created,
    /// A reservation took stock.
    #[sea_orm(string_value = "RESERVED")]
    Reserved,
    /// A reservation was released and its stock returned.
    #[sea_orm(string_value = "RELEASED")]
    Released,
    /// A reservation expired and the sweeper returned its stock.
    #[sea_orm(string_value = "EXPIRED")]
    Expired,
    /// An operator added stock.
    #[sea_orm(string_value = "RESTOCKED")]
    Restocked,
    /// An order line took stock.
    #[sea_orm(string_value = "ORDERED")]
    Ordered,
    /// An order was cancelled and its line's stock returned.
    #[sea_orm(string_value = "ORDER_CANCELLED")]
    OrderCancelled,
    /// An order line's units left the warehouse: `delta` is the change of
    /// on-hand units (available stock does not move, `stockAfter` is unchanged).
    #[sea_orm(string_value = "FULFILLED")]
    Fulfilled,
    /// A reservation's quantity was changed; `delta` is the change of available stock.
    #[sea_orm(string_value = "QUANTITY_CHANGED")]
    QuantityChanged,
}

/// One ledger row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "stock_movements")]
pub struct Model {
    /// Primary key.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// The inventory that changed.
    pub inventory_id: Uuid,
    /// Units added (negative when taken).
    pub delta: i32,
    /// Why.
    pub reason: MovementReason,
    /// Stock right after the change.
    pub stock_after: i32,
    /// Version right after the change; unique per inventory.
    pub version_after: i32,
    /// The reservation involved, if any.
    pub reservation_id: Option<Uuid>,
    /// The order involved, if any.
    pub order_id: Option<Uuid>,
    /// When the change committed (its transaction's start).
    pub created_at: DateTime<Utc>,
}

/// No relations are navigated through the ORM.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// One page of an inventory's ledger in version order, with one extra row
/// when more follow.
pub async fn page(db: &DatabaseConnection, inventory_id: Uuid, page: Page<VersionCursor>) -> Result<Vec<Model>, DbErr> {
    let mut query = Entity::find().filter(Column::InventoryId.eq(inventory_id));
    if let Some(VersionCursor(after)) = page.after {
        query = query.filter(Column::VersionAfter.gt(after));
    }
    query.order_by_asc(Column::VersionAfter).limit(page.first + 1).all(db).await
}

/// The ledger rows with these ids (missing ones are left out).
pub async fn find_many(db: &DatabaseConnection, ids: &[Uuid]) -> Result<Vec<Model>, DbErr> {
    Entity::find().filter(Column::Id.is_in(ids.iter().copied())).all(db).await
}
