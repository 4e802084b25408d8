//! Returns of fulfilled orders (`returnOrder`, `Order.returns`,
//! `OrderItem.returned`): the request checked (`domain.rs`), the use case
//! (`service.rs`), the SQL (`store.rs`, the stock statement in
//! `stock::taking_back`), the per-request loader and the GraphQL types.

pub(crate) mod domain;
pub(crate) mod graphql;
pub(crate) mod loader;
pub(crate) mod service;
pub(crate) mod store;
