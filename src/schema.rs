//! The GraphQL schema, merged from the feature modules' types. It does not
//! know about HTTP: the gateway puts the caller and fresh DataLoaders into
//! each request (`server::request_data`), and `server.rs` builds the
//! features' runtime state (services, live feeds) and hands it over as data.

use std::collections::BTreeMap;

use async_graphql::{
    MergedObject, MergedSubscription, SDLExportOptions, Schema,
    parser::types::{TypeKind, TypeSystemDefinition},
};

use crate::{
    adjustments::{graphql::AdjustmentMutation, service::AdjustmentService},
    app::AppState,
    config::Limits,
    documents, gateway,
    inventory::{
        graphql::{InventoryMutation, InventoryQuery, InventorySubscription},
        service::InventoryService,
    },
    kits::{
        graphql::{KitMutation, KitQuery},
        service::KitService,
    },
    locations::{
        graphql::{LocationMutation, LocationQuery},
        service::LocationService,
    },
    node::NodeQuery,
    orders::{
        graphql::{OrderMutation, OrderQuery, OrderSubscription},
        returns::{graphql::ReturnMutation, service::ReturnService},
        service::OrderService,
    },
    reservations::{
        graphql::{ReservationMutation, ReservationQuery},
        service::ReservationService,
    },
    telemetry,
    waitlists::{
        graphql::{WaitlistMutation, WaitlistQuery},
        service::WaitlistService,
    },
    webhooks::{
        graphql::{WebhookMutation, WebhookQuery},
        service::WebhookService,
    },
};

/// The root query type.
#[derive(MergedObject, Default)]
pub struct Query(
    InventoryQuery,
    ReservationQuery,
    KitQuery,
    WaitlistQuery,
    OrderQuery,
    LocationQuery,
    WebhookQuery,
    NodeQuery,
);

/// The root mutation type.
#[derive(MergedObject, Default)]
pub struct Mutation(
    InventoryMutation,
    ReservationMutation,
    KitMutation,
    WaitlistMutation,
    OrderMutation,
    ReturnMutation,
    AdjustmentMutation,
    LocationMutation,
    WebhookMutation,
);

/// The root subscription type.
#[derive(MergedSubscription, Default)]
pub struct Subscription(InventorySubscription, OrderSubscription);

/// The schema Stockguard serves.
pub type AppSchema = Schema<Query, Mutation, Subscription>;

/// [`AppSchema`] while it is being built.
pub(crate) type AppSchemaBuilder = async_graphql::SchemaBuilder<Query, Mutation, Subscription>;

fn builder(limits: &Limits) -> AppSchemaBuilder {
    Schema::build(Query::default(), Mutation::default(), Subscription::default())
        // The depth and complexity bounds are kept by `ErrorCodes`, which
        // refuses with their codes and then charges the caller's bucket
        // (see `gateway/codes.rs`, `gateway/cost.rs`).
        .extension(gateway::ErrorCodes::new(limits))
        // The same bound `documents.rs` checks first, so async-graphql's own
        // walk over the expanded document never goes deeper than that check.
        .limit_recursive_depth(documents::MAX_NESTING)
}

/// Each feature's service, which its resolvers call.
#[derive(Clone)]
pub(crate) struct Services {
    /// Inventories.
    pub inventory: InventoryService,
    /// Reservations, with the coalescer of hot items.
    pub reservations: ReservationService,
    /// Kits and kit reservations.
    pub kits: KitService,
    /// Waiting lists.
    pub waitlists: WaitlistService,
    /// Orders.
    pub orders: OrderService,
    /// Returns of fulfilled orders.
    pub returns: ReturnService,
    /// Adjustments of levels and their safety stock.
    pub adjustments: AdjustmentService,
    /// Locations, their levels and transfers.
    pub locations: LocationService,
    /// Webhook endpoints and their deliveries.
    pub webhooks: WebhookService,
}

/// The schema over `state` and the features' runtime state, which
/// `features` adds as data, with the configured depth and complexity limits.
pub(crate) fn build(state: AppState, features: impl FnOnce(AppSchemaBuilder) -> AppSchemaBuilder) -> AppSchema {
    let limits = state.limits.clone();
    features(builder(&limits)).data(state).extension(telemetry::Observe).finish()
}

/// Depth allowed to introspection-only requests. GraphiQL's own schema query
/// nests `ofType` past the API's depth limit; introspection types form cycles
/// (`__Type.fields.type.fields...`), so it still gets a bound, a looser one.
pub(crate) const INTROSPECTION_DEPTH: usize = 20;

/// The same schema for requests that only introspect, with the looser depth
/// bound [`INTROSPECTION_DEPTH`]. Introspection resolves no feature's field,
/// so it carries only the shared state.
pub(crate) fn build_for_introspection(state: AppState) -> AppSchema {
    let limits = Limits { max_depth: state.limits.max_depth.max(INTROSPECTION_DEPTH), ..(*state.limits).clone() };
    builder(&limits).data(state).extension(telemetry::Observe).finish()
}

/// The schema as SDL: what `stockguard schema` prints and `schema.graphql` holds.
pub fn sdl() -> String {
    sdl_of(&builder(&Limits::default()).finish())
}

/// `schema` as SDL, with `@specifiedBy` on the scalars that have a spec.
pub fn sdl_of<Q, M, S>(schema: &Schema<Q, M, S>) -> String
where
    Q: async_graphql::ObjectType + 'static,
    M: async_graphql::ObjectType + 'static,
    S: async_graphql::SubscriptionType + 'static,
{
    schema.sdl_with_options(SDLExportOptions::new().include_specified_by())
}

/// Which object types each union and interface may be, as Apollo Client's
/// `possibleTypes` (and graphql-codegen's fragment matcher) take it: what a
/// client needs to match fragments on `ReserveResult`, `Node` and the other
/// abstract types. `clients/possible-types.json` holds it, beside
/// `schema.graphql`.
pub fn possible_types() -> String {
    let mut possible: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let document = async_graphql::parser::parse_schema(sdl()).map_err(|err| err.to_string());
    for definition in document.map(|d| d.definitions).unwrap_or_default() {
        let TypeSystemDefinition::Type(definition) = definition else { continue };
        let name = definition.node.name.node.to_string();
        match definition.node.kind {
            TypeKind::Union(union) => {
                possible.entry(name).or_default().extend(union.members.iter().map(|m| m.node.to_string()));
            }
            TypeKind::Object(object) => {
                for interface in object.implements {
                    possible.entry(interface.node.to_string()).or_default().push(name.clone());
                }
            }
            _ => {}
        }
    }
    possible.values_mut().for_each(|members| members.sort());
    let mut json = serde_json::to_string_pretty(&possible).unwrap_or_default();
    json.push('\n');
    json
}
