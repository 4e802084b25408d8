//! Configuration: every setting is a flag and an environment variable, with
//! defaults that give a working server on a developer's machine.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args, Command, FromArgMatches, ValueEnum};

/// The default database when `DATABASE_URL` is not set: the local server, if one listens.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/stockguard";

/// How the server connects to PostgreSQL.
#[derive(Args, Debug, Clone)]
pub struct DatabaseConfig {
    /// PostgreSQL URL. Without it: the server on 127.0.0.1:5432 if one listens,
    /// otherwise a private PostgreSQL started from the installed binaries.
    #[arg(long, env = "DATABASE_URL", global = true)]
    pub database_url: Option<String>,

    /// Where the private PostgreSQL keeps its data between runs.
    #[arg(long, env = "STOCKGUARD_DATA_DIR", default_value = ".stockguard/postgres", global = true)]
    pub data_dir: PathBuf,

    /// Connections in each of the two pools of a server process: the general
    /// one, and the one for one-statement reservations.
    #[arg(long, env = "STOCKGUARD_POOL_SIZE", default_value_t = 16, global = true)]
    pub pool_size: u32,

    /// How long a request waits for a pooled connection before it fails with
    /// `DATABASE_UNAVAILABLE` (milliseconds).
    #[arg(long, env = "STOCKGUARD_ACQUIRE_TIMEOUT_MS", default_value_t = 3000, global = true)]
    pub acquire_timeout_ms: u64,

    /// `statement_timeout` set on every connection (milliseconds).
    #[arg(long, env = "STOCKGUARD_STATEMENT_TIMEOUT_MS", default_value_t = 5000, global = true)]
    pub statement_timeout_ms: u64,
}

impl DatabaseConfig {
    /// The acquire timeout as a duration.
    pub fn acquire_timeout(&self) -> Duration {
        Duration::from_millis(self.acquire_timeout_ms)
    }

    /// The statement timeout as a duration.
    pub fn statement_timeout(&self) -> Duration {
        Duration::from_millis(self.statement_timeout_ms)
    }
}

/// The API's limits (docs/api.md "Limits") and the write policies: order
/// locking, reservation lifetimes, the sweeper, coalescing, collision re-runs.
#[derive(Args, Debug, Clone)]
pub struct Limits {
    /// Largest quantity on one reservation line.
    #[arg(long, env = "STOCKGUARD_MAX_QUANTITY", default_value_t = 1000)]
    pub max_quantity: i32,

    /// Largest `first` of a connection.
    #[arg(long, env = "STOCKGUARD_MAX_PAGE_SIZE", default_value_t = 100)]
    pub max_page_size: i32,

    /// Deepest query accepted.
    #[arg(long, env = "STOCKGUARD_MAX_DEPTH", default_value_t = 12)]
    pub max_depth: usize,

    /// Most complex query accepted (one point per field).
    #[arg(long, env = "STOCKGUARD_MAX_COMPLEXITY", default_value_t = 2000)]
    pub max_complexity: usize,

    /// Most lexical tokens in a query text; longer documents are refused
    /// before they are parsed (GRAPHQL_PARSE_FAILED).
    #[arg(long, env = "STOCKGUARD_MAX_TOKENS", default_value_t = 5000)]
    pub max_tokens: usize,

    /// Largest request body in bytes; larger bodies get HTTP 413. Also the
    /// largest websocket message.
    #[arg(long, env = "STOCKGUARD_BODY_LIMIT", default_value_t = 64 * 1024)]
    pub body_limit: usize,

    /// Most TCP connections open at once; past it the server stops accepting
    /// until one closes (new clients wait in the listen queue).
    #[arg(long, env = "STOCKGUARD_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,

    /// How long a client may take to send a request's head, from the moment
    /// its connection opens or its first byte arrives (milliseconds).
    #[arg(long, env = "STOCKGUARD_HEADER_READ_TIMEOUT_MS", default_value_t = 10_000)]
    pub header_read_timeout_ms: u64,

    /// How long a keep-alive connection may sit idle between requests (milliseconds).
    #[arg(long, env = "STOCKGUARD_IDLE_TIMEOUT_MS", default_value_t = 60_000)]
    pub idle_timeout_ms: u64,

    /// How long one HTTP request may take, body upload included; past it the
    /// client gets HTTP 408 (`REQUEST_TIMEOUT`) while started work still
    /// finishes (milliseconds).
    #[arg(long, env = "STOCKGUARD_REQUEST_TIMEOUT_MS", default_value_t = 30_000)]
    pub request_timeout_ms: u64,

    /// How long a websocket may stay open without `connection_init` (milliseconds).
    #[arg(long, env = "STOCKGUARD_WS_INIT_TIMEOUT_MS", default_value_t = 10_000)]
    pub ws_init_timeout_ms: u64,

    /// How often the server pings a websocket; one that answers nothing for
    /// two intervals is closed (milliseconds).
    #[arg(long, env = "STOCKGUARD_WS_KEEPALIVE_MS", default_value_t = 15_000)]
    pub ws_keepalive_ms: u64,

    /// Most live subscriptions on one websocket.
    #[arg(long, env = "STOCKGUARD_MAX_SUBSCRIPTIONS_PER_SOCKET", default_value_t = 50)]
    pub max_subscriptions_per_socket: usize,

    /// Origins whose browser apps may call the API (CORS), comma-separated,
    /// e.g. `https://shop.example.com`; `*` allows any. None by default; a
    /// server that made its own secret (development) also allows loopback
    /// origins (`http://localhost:<any port>` and the like).
    #[arg(long, env = "STOCKGUARD_CORS_ORIGINS", value_delimiter = ',')]
    pub cors_origins: Vec<String>,

    /// Most live subscriptions in one server process. Each costs about 15 KB
    /// (async-graphql's stream and context), so the default bounds them at
    /// about 30 MB; raise it with the memory to match.
    #[arg(long, env = "STOCKGUARD_MAX_SUBSCRIPTIONS", default_value_t = 2000)]
    pub max_subscriptions: usize,

    /// Most GraphQL requests in flight per process; more are refused at once
    /// with HTTP 503 (`OVERLOADED`) instead of queueing without bound. This
    /// also bounds every queue behind it (the pool's waiters, coalesced batches).
    #[arg(long, env = "STOCKGUARD_MAX_IN_FLIGHT", default_value_t = 512)]
    pub max_in_flight: usize,

    /// Most operations in one batched request.
    #[arg(long, env = "STOCKGUARD_MAX_BATCH", default_value_t = 10)]
    pub max_batch: usize,

    /// How order transitions guard against concurrent writers.
    #[arg(long, env = "STOCKGUARD_ORDER_LOCKING", value_enum, default_value = "optimistic")]
    pub order_locking: OrderLocking,

    /// `lock_timeout` of the pessimistic order path (milliseconds).
    #[arg(long, env = "STOCKGUARD_LOCK_TIMEOUT_MS", default_value_t = 2000)]
    pub lock_timeout_ms: u64,

    /// Lifetime of a new ACTIVE reservation in seconds; 0 = never expires.
    #[arg(long, env = "STOCKGUARD_RESERVATION_TTL_SECS", default_value_t = 900)]
    pub reservation_ttl_secs: i32,

    /// Furthest into the future `extendReservation` may move an expiry (seconds from now).
    #[arg(long, env = "STOCKGUARD_MAX_RESERVATION_TTL_SECS", default_value_t = 3600)]
    pub max_reservation_ttl_secs: i32,

    /// How often the sweeper returns the stock of expired reservations (milliseconds).
    #[arg(long, env = "STOCKGUARD_SWEEP_INTERVAL_MS", default_value_t = 1000)]
    pub sweep_interval_ms: u64,

    /// Most reservations one sweep statement expires.
    #[arg(long, env = "STOCKGUARD_SWEEP_BATCH", default_value_t = 500)]
    pub sweep_batch: i64,

    /// Serve concurrent reservations (with or without `expectedVersion` or an
    /// idempotency key) that wait at the same time with one statement, on one
    /// inventory or many.
    #[arg(long, env = "STOCKGUARD_COALESCE", default_value_t = true, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub coalesce: bool,

    /// Most coalesced statements (or callers alone) running at once; callers
    /// beyond them wait and share the next statement. Fewer lanes make larger
    /// batches (fewer commits) at the price of waiting.
    #[arg(long, env = "STOCKGUARD_COALESCE_LANES", default_value_t = 4)]
    pub coalesce_lanes: usize,

    /// Most reservations one coalesced statement serves.
    #[arg(long, env = "STOCKGUARD_COALESCE_MAX_BATCH", default_value_t = 64)]
    pub coalesce_max_batch: usize,

    /// Callers that must be waiting before a lane opens beside a running
    /// one (1: a lane for every caller while lanes are free). The first lane
    /// opens at once for a caller alone.
    #[arg(long, env = "STOCKGUARD_COALESCE_BACKLOG", default_value_t = 32)]
    pub coalesce_backlog: usize,

    /// How long a batch waits for more callers after its first (microseconds;
    /// 0 = only those that queued while the previous batch ran).
    #[arg(long, env = "STOCKGUARD_COALESCE_WINDOW_US", default_value_t = 0)]
    pub coalesce_window_us: u64,

    /// How often a statement (or multi-item transaction) is run when it
    /// collides (SQLSTATE 40001 or 40P01) before the operation gives up.
    ///
    /// Then nothing was written, and each operation answers one way
    /// (`Attempted::done`): where its union has a conflict member, that
    /// member with the latest rows (`reserve`, `restock`: `Conflict`;
    /// `reserveMany`, `placeOrder`: `ItemsUnavailable`, every line
    /// `CONFLICT`; `changeShippingAddress`: `OrderVersionConflict`, or
    /// `OrderNotEditable` once the order is not PENDING); else the retryable
    /// `DATABASE_UNAVAILABLE` (`releaseReservation`, `extendReservation`,
    /// `changeReservationQuantity`, `checkout`), never a member that would
    /// say the reservation is no longer ACTIVE.
    #[arg(long, env = "STOCKGUARD_COLLISION_ATTEMPTS", default_value_t = 20)]
    pub collision_attempts: u32,
}

impl Default for Limits {
    /// The limits of a server started without flags or environment: the
    /// `default_value`s above are the only place a default is written.
    fn default() -> Self {
        defaults()
    }
}

impl Default for DatabaseConfig {
    /// The settings of a server started without flags or environment
    /// (no `DATABASE_URL`).
    fn default() -> Self {
        defaults()
    }
}

/// `T` as an empty command line parses it, with every environment variable
/// ignored: what the defaults are, not what this process happens to be given.
fn defaults<T: Args + FromArgMatches>() -> T {
    let command = T::augment_args(Command::new("stockguard")).mut_args(|arg| arg.env(None));
    let parsed = command.try_get_matches_from(["stockguard"]).and_then(|matches| T::from_arg_matches(&matches));
    // Every argument has a default or is optional, so an empty command line
    // always parses; the unit test below runs this for each type.
    parsed.expect("an empty command line parses")
}

/// How order transitions (confirm, cancel) guard against concurrent writers.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderLocking {
    /// Read, decide, save with `WHERE version = $seen`; re-read and retry on a
    /// lost race (at most 3 attempts). Best when writers on one order are rare.
    Optimistic,
    /// `SELECT ... FOR UPDATE` with a short `lock_timeout`: later writers wait
    /// instead of failing. Best when many writers hit one order at once.
    Pessimistic,
}

/// Log line format.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Settings of the `serve` command.
#[derive(Args, Debug, Clone)]
pub struct ServeConfig {
    /// Address to listen on.
    #[arg(long, env = "STOCKGUARD_ADDR", default_value = "127.0.0.1:8000")]
    pub addr: SocketAddr,

    /// HS256 secret for bearer tokens. Without it a random one is made at start
    /// and ready-made tokens are printed.
    #[arg(long, env = "STOCKGUARD_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,

    /// Longest lifetime of an accepted bearer token, from its `iat` (or from
    /// now, without one) to its `exp` (seconds).
    #[arg(long, env = "STOCKGUARD_MAX_TOKEN_TTL_SECS", default_value_t = crate::auth::DEFAULT_MAX_TOKEN_TTL_SECS)]
    pub max_token_ttl_secs: i64,

    /// How long the process keeps serving after SIGTERM with `/readyz`
    /// answering 503, before it stops accepting connections (milliseconds).
    /// Behind a load balancer, set it above the balancer's health-check
    /// interval times its fall count, so no new request reaches a closed port.
    #[arg(long, env = "STOCKGUARD_SHUTDOWN_DELAY_MS", default_value_t = 0)]
    pub shutdown_delay_ms: u64,

    /// Do not add demo inventory to an empty database.
    #[arg(long, env = "STOCKGUARD_NO_SEED", value_parser = clap::builder::BoolishValueParser::new())]
    pub no_seed: bool,

    #[command(flatten)]
    pub limits: Limits,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_the_command_line_defaults() {
        let limits = Limits::default();
        assert_eq!((limits.max_quantity, limits.max_page_size, limits.body_limit), (1000, 100, 64 * 1024));
        assert_eq!(limits.order_locking, OrderLocking::Optimistic);
        assert!(limits.coalesce);
        let database = DatabaseConfig::default();
        assert_eq!((database.database_url, database.pool_size), (None, 16));
        assert_eq!(database.data_dir, PathBuf::from(".stockguard/postgres"));
    }
}
