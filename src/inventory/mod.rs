//! Inventories: the stocked items, their reads, creation and restocking, and
//! the live `inventoryChanged` subscription.

pub mod graphql;
pub mod loader;
pub mod movements;
pub mod service;
pub mod store;

pub use crate::stock::rows::InventoryRow;
