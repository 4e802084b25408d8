//! The stock ledger (`stock_movements`): one row per committed change of an
//! inventory, written by the same statement as the change. Read here; written
//! only by the statements that change stock.

use chrono::{DateTime, Utc};
use sea_orm::{ColumnTrait, Condition, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect, entity::prelude::*};

use crate::pagination::{Page, VersionCursor};
pub(crate) use crate::stock::rows::{AdjustmentReason, MovementReason};

/// One ledger row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "stock_movements")]
pub(crate) struct Model {
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
    /// The location whose level changed; `None` for rows written before
    /// stock was kept per location (they were all at the default location).
    pub location_id: Option<Uuid>,
    /// The operator's note, on the rows of adjustments and returns.
    pub note: Option<String>,
    /// The operator who made the change (the token's `sub`), on the rows of
    /// adjustments and returns; none for customers' and the sweeper's rows.
    pub actor: Option<String>,
    /// Why an operator adjusted stock: set on ADJUSTED rows, and only on them.
    pub adjustment_reason: Option<AdjustmentReason>,
    /// The kit reservation whose change wrote the row, if any.
    pub kit_reservation_id: Option<Uuid>,
}

/// No relations are navigated through the ORM.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub(crate) enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// One page of an inventory's ledger in `(version_after, id)` order, with
/// one extra row when more follow. A change that touches several locations
/// writes several rows at one version, so the version alone cannot say
/// where a page ended; the id breaks the tie, and no row is skipped or
/// repeated across pages.
pub(crate) async fn page(
    db: &impl ConnectionTrait,
    inventory_id: Uuid,
    page: Page<VersionCursor>,
) -> Result<Vec<Model>, DbErr> {
    let mut query = Entity::find().filter(Column::InventoryId.eq(inventory_id));
    query = match page.after {
        Some(VersionCursor { version, id: Some(id) }) => query.filter(
            Condition::any()
                .add(Column::VersionAfter.gt(version))
                .add(Condition::all().add(Column::VersionAfter.eq(version)).add(Column::Id.gt(id))),
        ),
        Some(VersionCursor { version, id: None }) => query.filter(Column::VersionAfter.gt(version)),
        None => query,
    };
    query.order_by_asc(Column::VersionAfter).order_by_asc(Column::Id).limit(page.first + 1).all(db).await
}

/// The ledger rows with these ids (missing ones are left out).
pub(crate) async fn find_many(db: &impl ConnectionTrait, ids: &[Uuid]) -> Result<Vec<Model>, DbErr> {
    Entity::find().filter(Column::Id.is_in(ids.iter().copied())).all(db).await
}
