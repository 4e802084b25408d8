//! Inventories: the stocked items, their reads, creation and restocking, and
//! the live `inventoryChanged` subscription.

pub mod entity;
pub mod graphql;
pub mod loader;
pub mod movements;
pub mod service;
pub mod store;

pub use entity::Model as InventoryRow;
