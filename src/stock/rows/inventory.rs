//! The `inventories` table.

use chrono::{DateTime, Utc};
use sea_orm::entity::prelude::*;

/// One stocked item. `version` is 1 when created and grows by exactly one with
/// every committed change of the row. It deserializes from the live-stock
/// trigger's JSON announcement of a row (`inventory::store::live_source`).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, serde::Deserialize)]
#[sea_orm(table_name = "inventories")]
pub struct Model {
    /// Primary key.
    #[sea_orm(primary_key, auto_increment = false)]
    pub(crate) id: Uuid,
    /// Stock keeping unit, unique.
    #[sea_orm(unique)]
    pub(crate) sku: String,
    /// Display name.
    pub(crate) name: String,
    /// Units on hand; `CHECK (stock >= 0)`.
    pub stock: i32,
    /// Optimistic-lock version.
    pub version: i32,
    /// When the row was created.
    pub(crate) created_at: DateTime<Utc>,
    /// When the row last changed.
    pub(crate) updated_at: DateTime<Utc>,
    /// The location of all its stock while it has one level (one location
    /// ever held it), NULL once a second location holds it: a reservation
    /// that may come from anywhere then takes from this one level with the
    /// conditional UPDATE of this row, without reading the levels first.
    pub(crate) sole_location_id: Option<Uuid>,
}

/// No relations are navigated through the ORM; joins are written where needed.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
