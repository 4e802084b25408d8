//! Reservations: taking stock for a user with one statement, idempotency keys,
//! and reading reservations back.

pub mod batch;
pub mod entity;
pub mod graphql;
pub mod store;

pub use entity::{Model as ReservationRow, ReservationStatus};
