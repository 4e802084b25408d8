//! The `reservations` table. An order's lines are reservations too (status
//! ORDERED with `order_id` set), so stock held by carts and by orders is
//! counted in one place.

use chrono::{DateTime, Utc};
use sea_orm::entity::prelude::*;

/// Where a reservation is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "Text")]
pub enum ReservationStatus {
    /// Holds stock for the user.
    #[sea_orm(string_value = "ACTIVE")]
    Active,
    /// Given back by the user or an operator; its stock was returned.
    #[sea_orm(string_value = "RELEASED")]
    Released,
    /// Ran past `expiresAt`; its stock was returned.
    #[sea_orm(string_value = "EXPIRED")]
    Expired,
    /// A line of an order; holds stock until the order is cancelled or fulfilled.
    #[sea_orm(string_value = "ORDERED")]
    Ordered,
    /// A line of a fulfilled order: its units have left the warehouse. Final.
    #[sea_orm(string_value = "FULFILLED")]
    Fulfilled,
}

/// One reservation of `quantity` units of one inventory for one user.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "reservations")]
pub struct Model {
    /// Primary key.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// The inventory the stock was taken from.
    pub(crate) inventory_id: Uuid,
    /// The order this is a line of, when it is one.
    pub(crate) order_id: Option<Uuid>,
    /// The owner (the token's `sub`).
    pub(crate) user_id: String,
    /// Units held; `CHECK (quantity > 0)`.
    pub quantity: i32,
    /// Life-cycle state.
    pub(crate) status: ReservationStatus,
    /// The client's idempotency key, unique per user.
    pub(crate) idempotency_key: Option<String>,
    /// Hash of the request that used the key, to tell a replay from a reuse.
    pub(crate) request_fingerprint: Option<String>,
    /// When the stock was taken.
    pub created_at: DateTime<Utc>,
    /// When the reservation lapses; `None` = never.
    pub expires_at: Option<DateTime<Utc>>,
    /// Shared by the reservations of one multi-item request (`reserveMany`,
    /// `placeOrder`); the first line carries the idempotency key for all.
    /// The column keeps its first name, `batch_id`, so that databases and
    /// server processes of earlier releases go on working beside this one.
    #[sea_orm(column_name = "batch_id")]
    pub(crate) multi_item_id: Option<Uuid>,
    /// The locations it may take from, in order of preference; `None`:
    /// every active location, by priority.
    pub(crate) location_ids: Option<Vec<Uuid>>,
    /// `Some(true)` when it takes from the fewest locations (FEWEST_LOCATIONS);
    /// `None` is PRIORITY.
    pub(crate) fewest_locations: Option<bool>,
    /// `Some(false)` when its units must all come from one location; `None`
    /// allows a split.
    pub(crate) allow_split: Option<bool>,
    /// Units of a FULFILLED order line returned since (restocked or written
    /// off); 0 for every other reservation. `CHECK (returned BETWEEN 0 AND quantity)`.
    pub(crate) returned: i32,
    /// The kit reservation this is a component of, if any: it then lives
    /// and dies with the kit reservation's other components.
    pub(crate) kit_reservation_id: Option<Uuid>,
}

/// No relations are navigated through the ORM; joins are written where needed.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
