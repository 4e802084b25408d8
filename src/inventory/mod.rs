//! Inventories: the stocked items, their reads, creation and restocking, and
//! the live `inventoryChanged` subscription.

pub(crate) mod graphql;
pub(crate) mod loader;
pub(crate) mod movements;
pub(crate) mod service;
pub(crate) mod store;

pub(crate) use crate::stock::rows::InventoryRow;
