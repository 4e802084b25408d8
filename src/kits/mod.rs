//! Kits: several inventories sold as one (docs/kits.md). A kit's
//! components are flattened when it is made and never change after
//! (`domain.rs`); `reserveKit` takes every component in one statement
//! (`stock::kitting`), and a kit reservation's components live and die
//! together. The rows (`rows.rs`), the use cases (`service.rs`), the SQL
//! (`store.rs`), the batched reads (`loader.rs`) and the GraphQL types.

pub(crate) mod domain;
pub(crate) mod graphql;
pub(crate) mod loader;
pub(crate) mod rows;
pub(crate) mod service;
pub(crate) mod store;
