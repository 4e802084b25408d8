//! The GraphQL schema, merged from the feature modules, and what each request
//! brings to it. It does not know about HTTP: the gateway puts the caller and
//! fresh DataLoaders ([`request_data`]) into each request.

use async_graphql::{MergedObject, MergedSubscription, Schema, dataloader::DataLoader};

use crate::{
    app::AppState,
    config::Limits,
    documents, gateway,
    inventory::graphql::{InventoryMutation, InventoryQuery, InventorySubscription},
    inventory::loader::{InventoryBySkuLoader, InventoryLoader},
    orders::graphql::{OrderMutation, OrderQuery},
    orders::loader::{OrderLinesLoader, OrderLoader},
    reservations::graphql::{ReservationMutation, ReservationQuery},
    reservations::loader::ReservationLoader,
    telemetry,
};

/// The root query type.
#[derive(MergedObject, Default)]
pub struct Query(InventoryQuery, ReservationQuery, OrderQuery);

/// The root mutation type.
#[derive(MergedObject, Default)]
pub struct Mutation(InventoryMutation, ReservationMutation, OrderMutation);

/// The root subscription type.
#[derive(MergedSubscription, Default)]
pub struct Subscription(InventorySubscription);

/// The schema Stockguard serves.
pub type AppSchema = Schema<Query, Mutation, Subscription>;

fn builder(limits: &Limits) -> async_graphql::SchemaBuilder<Query, Mutation, Subscription> {
    Schema::build(Query::default(), Mutation::default(), Subscription::default())
        .limit_depth(limits.max_depth)
        .limit_complexity(limits.max_complexity)
        // The same bound `documents.rs` checks first, so async-graphql's own
        // walk over the expanded document never goes deeper than that check.
        .limit_recursive_depth(documents::MAX_NESTING)
}

/// The schema over `state`, with the configured depth and complexity limits.
pub fn build(state: AppState) -> AppSchema {
    let limits = state.limits.clone();
    builder(&limits).data(state).extension(telemetry::Observe).extension(gateway::ErrorCodes).finish()
}

/// `request` with its own DataLoaders, so nothing is cached past it.
pub fn request_data(app: &AppState, request: async_graphql::Request) -> async_graphql::Request {
    let db = &app.db;
    request
        .data(DataLoader::new(InventoryLoader { db: db.clone() }, tokio::spawn))
        .data(DataLoader::new(InventoryBySkuLoader { db: db.clone() }, tokio::spawn))
        .data(DataLoader::new(ReservationLoader { db: db.clone() }, tokio::spawn))
        .data(DataLoader::new(OrderLoader { db: db.clone() }, tokio::spawn))
        .data(DataLoader::new(OrderLinesLoader { db: db.clone() }, tokio::spawn))
}

/// Depth allowed to introspection-only requests. GraphiQL's own schema query
/// nests `ofType` past the API's depth limit; introspection types form cycles
/// (`__Type.fields.type.fields...`), so it still gets a bound, a looser one.
pub const INTROSPECTION_DEPTH: usize = 20;

/// The same schema for requests that only introspect, with the looser depth
/// bound [`INTROSPECTION_DEPTH`].
pub fn build_for_introspection(state: AppState) -> AppSchema {
    let limits = Limits { max_depth: state.limits.max_depth.max(INTROSPECTION_DEPTH), ..state.limits.clone() };
    builder(&limits).data(state).extension(telemetry::Observe).extension(gateway::ErrorCodes).finish()
}

/// The schema as SDL: what `stockguard schema` prints and `schema.graphql` holds.
pub fn sdl() -> String {
    builder(&Limits::default()).finish().sdl()
}
