//! Reservations: taking stock for a user with one statement, idempotency keys,
//! expiry and the sweeper, and reading reservations back.

pub mod batch;
pub mod coalesce;
pub mod entity;
pub mod graphql;
pub mod loader;
pub mod store;
pub mod sweeper;

pub use entity::{Model as ReservationRow, ReservationStatus};
