//! Stockguard: a GraphQL API that reserves stock and changes orders under heavy
//! concurrency on PostgreSQL, and never oversells or silently loses an update.
//!
//! The reasoning is in `docs/design.md` and in the modules' own docs; the tour:

// Public, and why: the binary's entry (`cli`); what the tests, the
// examples and the support crate build and reach a server with, the way
// `stockguard serve` does (`startup`, `server`, `app`, `schema`, `config`,
// `auth`, `db`, `embedded`); the checks they run on its database
// (`invariant`, `archive`); and the few items the white-box tests of
// tests/api name (statement plans, the coalescer, the sweeper, event
// signatures: in `stock`, `reservations`, `locations`, `events`,
// `pagination`, `global_id`). Everything else is `pub(crate)`, and the lint
// below keeps it so: an item is `pub` only while one of those uses it.
#![warn(unreachable_pub)]

/// Adjustments: an operator's change or count of a level with a reason, and a level's safety stock.
pub(crate) mod adjustments;
/// The state every request shares.
pub mod app;
/// Retention: `stockguard archive` deletes old done-with rows in time slices, keeping the ledger's sums.
pub mod archive;
/// The HS256 bearer tokens, the caller's identity and the role checks.
pub mod auth;
/// The command line: `serve` (default), `migrate`, `schema`, `token`, `seed`, `check`, `archive`.
pub mod cli;
/// Every setting, from flags or the environment, with the API's limits.
pub mod config;
/// What a resolver takes from its context, checked: the caller, the state, services and loaders.
pub(crate) mod context;
/// Connecting, creating and migrating the database, the releases it runs on; the one place that classifies database errors.
pub mod db;
/// GraphQL documents read within bounds (tokens, nesting, expanded size), parsed once and kept.
pub(crate) mod documents;
/// A private PostgreSQL started from the installed binaries when no database is given and the local one cannot be used.
pub mod embedded;
/// `AppError`: what is really an error (bad input, auth, database), and its GraphQL code.
pub(crate) mod error;
/// Events out: the pump, the outbox and the webhook deliveries, and the egress rules every webhook URL passes.
pub mod events;
/// The one way in for a GraphQL operation (HTTP or websocket): bounds, caller, loaders, permit, error codes.
pub(crate) mod gateway;
/// Relay's global ids: the kinds of object that have one, and the encoding.
pub mod global_id;
/// The axum router and server: `/graphql`, `/graphql/ws`, GraphiQL, health, metrics, bounded connections, shutdown.
pub(crate) mod http;
/// Idempotency keys for every operation: fingerprints, first uses, replays.
pub(crate) mod idempotency;
/// The docs/design.md invariant, checked from the tables and the stock ledger.
pub mod invariant;
/// Inventories: reading, creating, restocking, and the per-request DataLoader.
pub(crate) mod inventory;
/// Kits: several inventories sold as one, every component taken in one statement.
pub(crate) mod kits;
/// Live changes: `inventoryChanged` and `orderChanged` subscriptions fed by LISTEN/NOTIFY.
pub(crate) mod live;
/// Locations: the places that hold stock, each inventory's levels there, allocations, transfers.
pub mod locations;
/// Relay's object identification: the `Node` interface, `node` and `nodes`.
pub(crate) mod node;
/// Orders: the version-checked aggregate, checkout of a cart, confirm/cancel/fulfil with retry or report, the pessimistic path.
pub(crate) mod orders;
/// Relay cursor pagination shared by every connection.
pub mod pagination;
/// Reservations: `reserve` alone or coalesced, multi-item requests, release, expiry and the sweeper.
pub mod reservations;
/// The GraphQL schema assembled from the feature modules.
pub mod schema;
/// Demo inventory for an empty database.
pub(crate) mod seed;
/// The composition root: each feature's runtime state, the schema, the workers, a request's data.
pub mod server;
/// The one way a server starts: the database opened, the application built, bound and run until stopped.
pub mod startup;
/// Every statement that changes stock, built from one set of fragments.
pub mod stock;
/// Logs, spans per GraphQL operation, and Prometheus metrics.
pub(crate) mod telemetry;
/// Input checks that turn bad input into `BAD_USER_INPUT` before anything runs.
pub(crate) mod validate;
/// Webhook endpoints and their deliveries, as operators manage them.
pub(crate) mod waitlists;
pub(crate) mod webhooks;
