//! The `returns` and `return_lines` tables: what came back of a fulfilled
//! order, written by the return statement (`stock::taking_back`) beside the
//! stock it puts back.

use chrono::{DateTime, Utc};
use sea_orm::{DeriveActiveEnum, EnumIter, FromQueryResult};
use uuid::Uuid;

/// What happens to returned units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "Text")]
pub enum ReturnDisposition {
    /// Back to available stock at a location.
    #[sea_orm(string_value = "RESTOCK")]
    Restock,
    /// Counted as returned; no unit moves (damaged, not resellable).
    #[sea_orm(string_value = "WRITE_OFF")]
    WriteOff,
}

/// One return of an order, as stored.
#[derive(Debug, Clone, PartialEq, Eq, FromQueryResult)]
pub(crate) struct ReturnRow {
    /// Its id.
    pub id: Uuid,
    /// The order it returns units of.
    pub order_id: Uuid,
    /// 1 for the order's first return, then 2, 3, ... in the order they were made.
    pub number: i32,
    /// The operator's note.
    pub note: Option<String>,
    /// The operator who recorded it (the token's `sub`).
    pub created_by: String,
    /// When it was made.
    pub created_at: DateTime<Utc>,
}

/// Units of one inventory a return counted with one disposition at one
/// location (none for a write-off), summed over the order's lines of that
/// inventory.
#[derive(Debug, Clone, PartialEq, Eq, FromQueryResult)]
pub(crate) struct ReturnLineRow {
    /// The return.
    pub return_id: Uuid,
    /// The inventory.
    pub inventory_id: Uuid,
    /// Restocked or written off.
    pub disposition: ReturnDisposition,
    /// Where restocked units went back; none for a write-off.
    pub location_id: Option<Uuid>,
    /// Units, at least 1.
    pub quantity: i64,
}
