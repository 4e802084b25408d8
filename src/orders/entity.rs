//! The `orders` table. Rows are turned into the domain type by
//! `domain::Order::reconstitute`, which refuses an inconsistent row.

use chrono::{DateTime, Utc};
use sea_orm::entity::prelude::*;

/// Where an order is in its life.
// It deserializes from the live-order trigger's JSON announcement of a row (`store::live_source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumIter, DeriveActiveEnum, serde::Deserialize)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub(crate) enum OrderStatus {
    /// Placed; may be confirmed, cancelled or edited.
    #[sea_orm(string_value = "PENDING")]
    Pending,
    /// Confirmed by an operator; may be fulfilled, no longer cancelled.
    #[sea_orm(string_value = "CONFIRMED")]
    Confirmed,
    /// Cancelled; its stock went back. Final.
    #[sea_orm(string_value = "CANCELLED")]
    Cancelled,
    /// Its units left the warehouse (operators). Final.
    #[sea_orm(string_value = "FULFILLED")]
    Fulfilled,
}

/// One order row, as the table and the live-order trigger's JSON spell it.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, serde::Deserialize)]
#[sea_orm(table_name = "orders")]
pub(crate) struct Model {
    /// Primary key.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// The customer who placed it.
    pub user_id: String,
    /// Life-cycle state.
    pub status: OrderStatus,
    /// Recipient.
    pub ship_name: String,
    /// Street address.
    pub ship_line1: String,
    /// More of the address.
    pub ship_line2: Option<String>,
    /// City.
    pub ship_city: String,
    /// Postal code.
    pub ship_postal_code: String,
    /// Country.
    pub ship_country: String,
    /// When it was confirmed (exactly when CONFIRMED or FULFILLED).
    pub confirmed_at: Option<DateTime<Utc>>,
    /// Who confirmed it (exactly when CONFIRMED or FULFILLED).
    pub confirmed_by: Option<String>,
    /// Optimistic-lock version: 1 when placed, +1 with every save.
    pub version: i32,
    /// When it was placed.
    pub created_at: DateTime<Utc>,
    /// When its units left the warehouse (exactly when FULFILLED).
    pub fulfilled_at: Option<DateTime<Utc>>,
    /// The operator who fulfilled it (exactly when FULFILLED).
    pub fulfilled_by: Option<String>,
}

/// No relations are navigated through the ORM; joins are written where needed.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub(crate) enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
