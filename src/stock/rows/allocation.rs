//! The `allocations` table: which location gave how many units of a
//! reservation or order line, so they go back where they came from.

use sea_orm::entity::prelude::*;

/// `quantity` units of a reservation taken from one location; the
/// allocations of a reservation add up to its quantity.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "allocations")]
pub(crate) struct Model {
    /// The reservation (or order line).
    #[sea_orm(primary_key, auto_increment = false)]
    pub reservation_id: Uuid,
    /// The location that gave them.
    #[sea_orm(primary_key, auto_increment = false)]
    pub location_id: Uuid,
    /// Units; `CHECK (quantity > 0)`.
    pub quantity: i32,
}

/// No relations are navigated through the ORM; joins are written where needed.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub(crate) enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
