//! The GraphQL schema, merged from the feature modules. It does not know about
//! HTTP: the gateway puts the caller and fresh DataLoaders into each request
//! (`server::request_data`), and `server.rs` builds the features' runtime
//! state it is given.

use async_graphql::{MergedObject, MergedSubscription, Schema};

use crate::{
    app::AppState,
    config::Limits,
    documents, gateway,
    inventory::graphql::{InventoryMutation, InventoryQuery, InventorySubscription},
    live::Live,
    orders::graphql::{OrderMutation, OrderQuery, OrderSubscription},
    reservations::{
        graphql::{ReservationMutation, ReservationQuery},
        service::ReservationService,
    },
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
pub struct Subscription(InventorySubscription, OrderSubscription);

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

/// The schema over `state` and the features' runtime state, with the
/// configured depth and complexity limits.
pub fn build(state: AppState, reservations: ReservationService, live: Live) -> AppSchema {
    let limits = state.limits.clone();
    builder(&limits)
        .data(state)
        .data(reservations)
        .data(live)
        .extension(telemetry::Observe)
        .extension(gateway::ErrorCodes)
        .finish()
}

/// Depth allowed to introspection-only requests. GraphiQL's own schema query
/// nests `ofType` past the API's depth limit; introspection types form cycles
/// (`__Type.fields.type.fields...`), so it still gets a bound, a looser one.
pub const INTROSPECTION_DEPTH: usize = 20;

/// The same schema for requests that only introspect, with the looser depth
/// bound [`INTROSPECTION_DEPTH`]. Introspection resolves no feature's field,
/// so it carries only the shared state.
pub fn build_for_introspection(state: AppState) -> AppSchema {
    let limits = Limits { max_depth: state.limits.max_depth.max(INTROSPECTION_DEPTH), ..state.limits.clone() };
    builder(&limits).data(state).extension(telemetry::Observe).extension(gateway::ErrorCodes).finish()
}

/// The schema as SDL: what `stockguard schema` prints and `schema.graphql` holds.
pub fn sdl() -> String {
    builder(&Limits::default()).finish().sdl()
}
