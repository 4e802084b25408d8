//! Stock that changes for reasons other than a sale: an operator's
//! adjustment of a level (`adjustStock`: a signed change or a count, with a
//! reason) and a level's safety stock (`setSafetyStock`). The request
//! checked (`domain.rs`), the use case (`service.rs`), the SQL (`store.rs`,
//! the stock statements in `stock::correcting`) and the GraphQL types.

pub(crate) mod domain;
pub(crate) mod graphql;
pub(crate) mod service;
pub(crate) mod store;
