//! Reservations: taking stock for a user (alone or coalesced), several
//! inventories at once, idempotent replays, release, expiry and the sweeper,
//! and reading reservations back.

pub(crate) mod alone;
pub mod coalesce;
pub(crate) mod domain;
pub(crate) mod graphql;
pub(crate) mod loader;
pub mod reserve;
pub(crate) mod service;
pub(crate) mod spread;
pub mod store;
pub mod sweeper;

pub(crate) use crate::stock::rows::{ReservationRow, ReservationStatus};
