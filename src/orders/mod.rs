//! Orders: an aggregate read and saved as one unit, whose every save is
//! version-checked; its lines are reservations with status ORDERED. Units
//! of a fulfilled order that come back are its returns ([`returns`]).

pub(crate) mod domain;
pub(crate) mod entity;
pub(crate) mod graphql;
pub(crate) mod loader;
pub(crate) mod returns;
pub(crate) mod service;
pub(crate) mod store;
