//! The `stock_levels` table: an inventory's available units at one location.
//! Reserved and committed units at a level are not stored: they are the
//! allocations of its ACTIVE and ORDERED reservations ([`super::allocation`]).

use sea_orm::entity::prelude::*;

/// One inventory's available units at one location; `CHECK (available >= 0)`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "stock_levels")]
pub struct Model {
    /// The inventory.
    #[sea_orm(primary_key, auto_increment = false)]
    pub inventory_id: Uuid,
    /// The location.
    #[sea_orm(primary_key, auto_increment = false)]
    pub location_id: Uuid,
    /// Units there that nobody holds.
    pub available: i32,
    /// The last available units there that no customer may take (an
    /// operator may, with `useSafetyStock`); `CHECK (safety_stock >= 0)`.
    pub safety_stock: i32,
}

/// No relations are navigated through the ORM; joins are written where needed.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
