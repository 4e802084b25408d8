//! Returns of fulfilled orders (`returnOrder`, `Order.returns`,
//! `OrderItem.returned`): the request checked (`domain.rs`), the use case
//! (`service.rs`), the SQL (`store.rs`, the stock statement in
//! `stock::taking_back`), the per-request loader and the GraphQL types.

pub mod domain;
pub mod graphql;
pub mod loader;
pub mod service;
pub mod store;
