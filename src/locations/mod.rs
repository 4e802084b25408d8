//! Locations: the places that hold stock, their reads and changes, each
//! inventory's level at each of them, which location gave a reservation's
//! units, and transfers of stock between two locations.

pub mod graphql;
pub mod loader;
pub mod service;
pub mod store;

pub use crate::stock::rows::LocationRow;
