//! Reservations: taking stock for a user (alone or coalesced), several
//! inventories at once, idempotent replays, release, expiry and the sweeper,
//! and reading reservations back.

pub mod alone;
pub mod coalesce;
pub mod domain;
pub mod graphql;
pub mod loader;
pub mod reserve;
pub mod service;
pub mod spread;
pub mod store;
pub mod sweeper;

pub use crate::stock::rows::{ReservationRow, ReservationStatus};
