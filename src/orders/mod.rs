//! Orders: an aggregate read and saved as one unit, whose every save is
//! version-checked; its lines are reservations with status ORDERED.

pub mod domain;
pub mod entity;
pub mod graphql;
pub mod loader;
pub mod service;
pub mod store;
