//! Orders: an aggregate read and saved as one unit, whose every save is
//! version-checked; its lines are reservations with status ORDERED. Units
//! of a fulfilled order that come back are its returns ([`returns`]).

pub mod domain;
pub mod entity;
pub mod graphql;
pub mod loader;
pub mod returns;
pub mod service;
pub mod store;
