//! Waiting lists: customers who could not get an item (an inventory or a
//! kit) line up, and each unit freed while they wait is held for the first
//! of them and offered as an ordinary hold (a kit reservation for a kit)
//! once their whole quantity is there (docs/waitlists.md).
//!
//! The hand-off is not here: it is the trigger `offer_freed_units` on the
//! stock levels (migration m20261217), so every statement that frees units
//! gives them to the line in its own transaction, whichever feature wrote
//! it. This module joins and leaves the line and reads it.

pub(crate) mod graphql;
pub(crate) mod loader;
pub(crate) mod service;
pub(crate) mod store;
