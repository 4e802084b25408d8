//! Inventories: the stocked items, their reads, creation and restocking.

pub mod entity;
pub mod graphql;
pub mod loader;
pub mod movements;
pub mod store;

pub use entity::Model as InventoryRow;
