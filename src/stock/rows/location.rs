//! The `locations` table: the places that hold stock.

use chrono::{DateTime, Utc};
use sea_orm::entity::prelude::*;

/// The code of the location every database has, made by the migration that
/// brought locations: stock received without a location goes there.
pub(crate) const DEFAULT_CODE: &str = "default";

/// A place that holds stock: a warehouse, a store, a supplier's drop-ship stock.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "locations")]
pub(crate) struct Model {
    /// Primary key.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// Unique, 1 to 64 characters.
    #[sea_orm(unique)]
    pub code: String,
    /// Display name.
    pub name: String,
    /// PRIORITY allocation tries lower numbers first; ties by code.
    pub priority: i32,
    /// Never allocated from while false; its stock still counts as on hand.
    pub active: bool,
    /// When it was made.
    pub created_at: DateTime<Utc>,
}

/// No relations are navigated through the ORM; joins are written where needed.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub(crate) enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
