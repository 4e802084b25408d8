//! Locations: the places that hold stock, their reads and changes, each
//! inventory's level at each of them, which location gave a reservation's
//! units, and transfers of stock between two locations.

pub(crate) mod graphql;
pub(crate) mod loader;
pub(crate) mod service;
pub mod store;

pub(crate) use crate::stock::rows::LocationRow;
