//! Configuration: every setting is a flag and an environment variable, with
//! defaults that give a working server on a developer's machine.
//!
//! The doc comments below are the settings' `--help` and their rows in
//! docs/operations.md: a unit test renders that table from the flags and
//! fails when the file's copy differs.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args, Command, FromArgMatches, ValueEnum};

/// How the server connects to PostgreSQL.
#[derive(Args, Debug, Clone)]
pub struct DatabaseConfig {
    /// PostgreSQL URL; the database is created if missing. Without it: the
    /// server on `127.0.0.1:5432` if it lets `postgres` in without a password
    /// and is PostgreSQL 15 or newer, otherwise a private PostgreSQL started
    /// from the installed binaries (one log line says why). libpq's multi-host form
    /// (`postgres://h1:p1,h2:p2/db?target_session_attrs=read-write`, as
    /// `pg_autoctl show uri` prints it) makes every pool follow the host that
    /// accepts writes; several hosts need `STOCKGUARD_JWT_SECRET`.
    #[arg(long, env = "DATABASE_URL", global = true)]
    pub database_url: Option<String>,

    /// Where the private PostgreSQL keeps its data between runs.
    #[arg(long, env = "STOCKGUARD_DATA_DIR", default_value = ".stockguard/postgres", global = true)]
    pub data_dir: PathBuf,

    /// Connections in each of the two pools of a server process: the general
    /// one, and the one for one-statement reservations.
    #[arg(long, env = "STOCKGUARD_POOL_SIZE", default_value_t = 16, global = true)]
    pub pool_size: u32,

    /// How long a request waits for a pooled connection (and a new connection
    /// for its server) before it fails with `DATABASE_UNAVAILABLE` (milliseconds).
    #[arg(long, env = "STOCKGUARD_ACQUIRE_TIMEOUT_MS", default_value_t = 3000, global = true)]
    pub acquire_timeout_ms: u64,

    /// `statement_timeout` set on every connection (milliseconds).
    #[arg(long, env = "STOCKGUARD_STATEMENT_TIMEOUT_MS", default_value_t = 5000, global = true)]
    pub statement_timeout_ms: u64,
}

impl DatabaseConfig {
    /// The acquire timeout as a duration.
    pub(crate) fn acquire_timeout(&self) -> Duration {
        Duration::from_millis(self.acquire_timeout_ms)
    }

    /// The statement timeout as a duration.
    pub(crate) fn statement_timeout(&self) -> Duration {
        Duration::from_millis(self.statement_timeout_ms)
    }
}

/// The process's own settings, for every command: its log lines and its threads.
#[derive(Args, Debug, Clone)]
pub(crate) struct ProcessConfig {
    /// Format of the log lines on stderr; `RUST_LOG` filters them.
    #[arg(long, env = "STOCKGUARD_LOG_FORMAT", value_enum, default_value = "text", global = true)]
    pub log_format: LogFormat,

    /// Threads that run requests; 0 = one per CPU core, less one (at least
    /// one) when PostgreSQL runs on this machine too (no URL, a loopback
    /// host or a Unix socket): every hand-over between the server's threads
    /// is a wake-up the database's processes wait behind.
    // On two cores shared with PostgreSQL one thread was faster than two in
    // every benchmark cell: bench/results/decisions.md, "A core left to a
    // PostgreSQL on the same machine".
    #[arg(long, env = "STOCKGUARD_WORKER_THREADS", default_value_t = 0, global = true)]
    pub worker_threads: usize,
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

    /// Most complex query accepted: one point per field, and a connection's
    /// rows count `first` times.
    #[arg(long, env = "STOCKGUARD_MAX_COMPLEXITY", default_value_t = 2000)]
    pub max_complexity: usize,

    /// Most lexical tokens in a query text; longer documents are refused
    /// before they are parsed (`GRAPHQL_PARSE_FAILED`).
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

    /// Most GraphQL operations in flight per process, HTTP and websocket
    /// (live subscriptions aside); more are refused at once with `OVERLOADED`
    /// (HTTP 503) instead of queueing without bound. This also bounds every
    /// queue behind it (the pool's waiters, coalesced batches).
    #[arg(long, env = "STOCKGUARD_MAX_IN_FLIGHT", default_value_t = 512)]
    pub max_in_flight: usize,

    /// Most GraphQL operations one caller (a token's `sub`, or a client
    /// address when anonymous) may have in flight in a process, running or
    /// waiting for a turn, HTTP and websocket together; past it that caller
    /// is refused with `THROTTLED` (HTTP 429) before its request is read,
    /// while every other caller is still admitted.
    #[arg(long, env = "STOCKGUARD_MAX_IN_FLIGHT_PER_CALLER", default_value_t = 128)]
    pub max_in_flight_per_caller: usize,

    /// Operations of one caller that may always run at once in a process;
    /// the rest of its in-flight operations wait, first come first served,
    /// behind that caller's own (never behind another caller's) and take
    /// no permit of `STOCKGUARD_MAX_IN_FLIGHT` while they wait, at most
    /// `STOCKGUARD_MAX_TURN_WAIT_MS` (then `THROTTLED`). A caller whose
    /// budget is not being drained may also run on a spare turn while one
    /// is free: the pool's connections beyond the live listener's one and
    /// twice this setting (7 of the default 16), shared by all callers.
    /// The default is a quarter of the default pool.
    #[arg(long, env = "STOCKGUARD_MAX_RUNNING_PER_CALLER", default_value_t = 4)]
    pub max_running_per_caller: usize,

    /// Longest an operation waits for a turn among its caller's own
    /// (milliseconds); past it the operation is refused with `THROTTLED`
    /// (HTTP 429), nothing ran. A turn comes when one of the caller's
    /// running operations ends, so this is a few statement timeouts: a
    /// caller whose own operations are queued longer than that sends more
    /// than its share can serve.
    #[arg(long, env = "STOCKGUARD_MAX_TURN_WAIT_MS", default_value_t = 10_000)]
    pub max_turn_wait_ms: u64,

    /// Points in the cost bucket of each customer and anonymous caller
    /// (`throttleStatus.maximumAvailable`). An operation whose requested cost
    /// exceeds what is left is refused before it runs (`THROTTLED`, HTTP 429).
    /// Keep it at or above `STOCKGUARD_MAX_COMPLEXITY`, or the largest
    /// queries can never run.
    #[arg(long, env = "STOCKGUARD_BUCKET_SIZE", default_value_t = 100_000.0)]
    pub bucket_size: f64,

    /// Points per second a customer's or anonymous caller's bucket refills
    /// (`throttleStatus.restoreRate`).
    #[arg(long, env = "STOCKGUARD_BUCKET_RESTORE_RATE", default_value_t = 50_000.0)]
    pub bucket_restore_rate: f64,

    /// Points in each operator's cost bucket.
    #[arg(long, env = "STOCKGUARD_OPERATOR_BUCKET_SIZE", default_value_t = 1_000_000.0)]
    pub operator_bucket_size: f64,

    /// Points per second an operator's bucket refills.
    #[arg(long, env = "STOCKGUARD_OPERATOR_BUCKET_RESTORE_RATE", default_value_t = 500_000.0)]
    pub operator_bucket_restore_rate: f64,

    /// Most cost buckets a process keeps (about 100 bytes each). Full
    /// buckets are forgotten; past the cap the least recently used half goes.
    #[arg(long, env = "STOCKGUARD_MAX_BUCKETS", default_value_t = 100_000)]
    pub max_buckets: usize,

    /// Proxies whose `X-Forwarded-For` names the client, comma-separated
    /// addresses or networks (`10.0.0.0/8,192.168.1.7`). The client is the
    /// last address in the header that is not one of them. None by default:
    /// the header is ignored and the peer address is the client.
    #[arg(long, env = "STOCKGUARD_TRUSTED_PROXIES", value_delimiter = ',', value_parser = parse_network)]
    pub trusted_proxies: Vec<ipnet::IpNet>,

    /// Most operations in one batched request.
    #[arg(long, env = "STOCKGUARD_MAX_BATCH", default_value_t = 10)]
    pub max_batch: usize,

    /// How `confirmOrder` and `cancelOrder` guard an order against concurrent writers.
    #[arg(long, env = "STOCKGUARD_ORDER_LOCKING", value_enum, default_value = "optimistic")]
    pub order_locking: OrderLocking,

    /// `lock_timeout` of the pessimistic order path; its `statement_timeout`
    /// is twice this (milliseconds).
    #[arg(long, env = "STOCKGUARD_LOCK_TIMEOUT_MS", default_value_t = 2000)]
    pub lock_timeout_ms: u64,

    /// Lifetime of a new ACTIVE reservation (seconds; 0 = never expires).
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

    /// How often the event pump numbers the events of finished transactions
    /// into the outbox, and an idle webhook endpoint looks for new ones
    /// (milliseconds).
    #[arg(long, env = "STOCKGUARD_EVENT_POLL_MS", default_value_t = 100)]
    pub event_poll_ms: u64,

    /// How long one webhook delivery attempt may take, connecting included
    /// (milliseconds).
    #[arg(long, env = "STOCKGUARD_WEBHOOK_TIMEOUT_MS", default_value_t = 5000)]
    pub webhook_timeout_ms: u64,

    /// The waits between a webhook delivery's attempts (seconds, comma
    /// separated, each with ±20 % jitter); after the attempt that follows the
    /// last wait fails, the delivery is FAILED. The default spends about 24 h.
    #[arg(
        long,
        env = "STOCKGUARD_WEBHOOK_RETRY_SCHEDULE",
        value_delimiter = ',',
        default_value = "10,30,60,300,900,1800,3600,7200,14400,28800,28800"
    )]
    pub webhook_retry_schedule: Vec<f64>,

    /// How long a process holds a webhook endpoint without renewing its
    /// lease (seconds): another process takes over a dead one's endpoints
    /// after this.
    #[arg(long, env = "STOCKGUARD_WEBHOOK_LEASE_SECS", default_value_t = 30)]
    pub webhook_lease_secs: u64,

    /// Serve concurrent reservations (with or without `expectedVersion` or an
    /// idempotency key) that wait at the same time with one statement, on one
    /// inventory or many. The variable takes `true` or `false` (or yes/no,
    /// on/off, 1/0).
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
    /// member with the latest rows (`reserve`, `restock`, `transferStock`: `Conflict`;
    /// `reserveMany`, `placeOrder`: `ItemsUnavailable`, every line
    /// `CONFLICT`; `changeShippingAddress`: `OrderVersionConflict`, or
    /// `OrderNotEditable` once the order is not PENDING); else the retryable
    /// `DATABASE_UNAVAILABLE` (`releaseReservation`, `extendReservation`,
    /// `changeReservationQuantity`, `checkout`, `returnOrder`), never a
    /// member that would say the reservation is no longer ACTIVE.
    #[arg(long, env = "STOCKGUARD_COLLISION_ATTEMPTS", default_value_t = 20)]
    pub collision_attempts: u32,

    /// How long a waiting list's offer is held for its customer (seconds),
    /// 1 to 2,592,000 (30 days); then it expires and passes to the next in line.
    #[arg(long, env = "STOCKGUARD_WAITLIST_OFFER_SECS", default_value_t = 900,
          value_parser = clap::value_parser!(i32).range(1..=2_592_000))]
    pub waitlist_offer_secs: i32,

    /// Let webhooks reach loopback addresses (`http://127.0.0.1:…`,
    /// `http://localhost:…`, `https` too), for development and tests. Every
    /// other private, link-local or reserved address stays refused, at
    /// creation and after DNS at delivery (docs/webhooks.md, "Egress"). The
    /// variable takes `true` or `false` (or yes/no, on/off, 1/0).
    #[arg(long, env = "STOCKGUARD_WEBHOOK_ALLOW_LOOPBACK", value_parser = clap::builder::BoolishValueParser::new())]
    pub webhook_allow_loopback: bool,
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

/// An address (`10.0.0.7`, a network of one) or a network (`10.0.0.0/8`).
fn parse_network(text: &str) -> Result<ipnet::IpNet, String> {
    let text = text.trim();
    text.parse::<ipnet::IpNet>()
        .or_else(|_| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("{text:?} is neither an IP address nor a network like 10.0.0.0/8"))
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
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Longest lifetime of a token, by default (a day).
pub const DEFAULT_MAX_TOKEN_TTL_SECS: i64 = 24 * 60 * 60;

/// Settings of the `serve` command.
#[derive(Args, Debug, Clone)]
pub(crate) struct ServeConfig {
    /// Address to listen on.
    #[arg(long, env = "STOCKGUARD_ADDR", default_value = "127.0.0.1:8000")]
    pub addr: SocketAddr,

    /// HS256 secret for bearer tokens, at least 32 bytes (also read by
    /// `stockguard token`); required to listen on an address other than
    /// loopback. Without it a random secret is made at start, ready-made
    /// tokens are printed, and GraphiQL carries an operator token.
    #[arg(long, env = "STOCKGUARD_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,

    /// Longest lifetime of an accepted bearer token, from its `iat` (or from
    /// now, without one) to its `exp` (seconds).
    #[arg(long, env = "STOCKGUARD_MAX_TOKEN_TTL_SECS", default_value_t = DEFAULT_MAX_TOKEN_TTL_SECS)]
    pub max_token_ttl_secs: i64,

    /// How long the process keeps serving after SIGTERM with `/readyz`
    /// answering 503, before it stops accepting connections (milliseconds).
    /// Behind a load balancer, set it above the balancer's health-check
    /// interval times its fall count, so no new request reaches a closed port.
    #[arg(long, env = "STOCKGUARD_SHUTDOWN_DELAY_MS", default_value_t = 0)]
    pub shutdown_delay_ms: u64,

    /// Do not add demo inventory to an empty database. The variable takes
    /// `true` or `false` (or yes/no, on/off, 1/0).
    #[arg(long, env = "STOCKGUARD_NO_SEED", value_parser = clap::builder::BoolishValueParser::new())]
    pub no_seed: bool,

    #[command(flatten)]
    pub limits: Limits,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every setting, as `stockguard` reads them: the database's and the
    /// process's for every command, and `serve`'s.
    fn settings() -> Command {
        let command = DatabaseConfig::augment_args(Command::new("stockguard"));
        let command = ProcessConfig::augment_args(command);
        let mut command = ServeConfig::augment_args(command);
        // Building fills in what the derive leaves implicit, such as a flag's `false`.
        command.build();
        command
    }

    /// The settings table of docs/operations.md, in Markdown: one row per
    /// setting with its flag, environment variable, default and help (the doc
    /// comments above, with the possible values of a choice).
    fn settings_table() -> String {
        let mut table = String::from("| flag | environment | default | meaning |\n| --- | --- | --- | --- |\n");
        let command = settings();
        for arg in command.get_arguments().filter(|arg| !arg.is_hide_set() && arg.get_id() != "help") {
            let flag = arg.get_long().map_or_else(|| "—".to_owned(), |long| format!("`--{long}`"));
            let env = arg.get_env().map_or_else(|| "—".to_owned(), |env| format!("`{}`", env.to_string_lossy()));
            let defaults: Vec<String> =
                arg.get_default_values().iter().map(|value| format!("`{}`", value.to_string_lossy())).collect();
            let default = if defaults.is_empty() { "none".to_owned() } else { defaults.join(", ") };
            let help = arg.get_long_help().or(arg.get_help()).map(ToString::to_string).unwrap_or_default();
            let mut meaning = help.split_whitespace().collect::<Vec<_>>().join(" ");
            // A choice's values, each with its own doc comment; a boolean's go unlisted.
            let values: Vec<String> = arg
                .get_possible_values()
                .iter()
                .filter(|value| !value.is_hide_set())
                .filter_map(|value| Some(format!("`{}`: {}", value.get_name(), value.get_help()?)))
                .collect();
            if !values.is_empty() {
                meaning = format!("{meaning}. {}", values.join(". "));
            }
            let row = [flag, env, default, meaning.replace('|', "\\|")].join(" | ");
            table.push_str(&format!("| {row} |\n"));
        }
        table
    }

    /// Where the settings table is kept, between two marker comments.
    const OPERATIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md");
    const BEGIN: &str = "<!-- settings:begin (generated from src/config.rs) -->\n";
    const END: &str = "<!-- settings:end -->";

    #[test]
    fn the_settings_table_in_the_docs_is_the_flags_own() {
        let text = std::fs::read_to_string(OPERATIONS).expect("docs/operations.md");
        let start = text.find(BEGIN).expect("docs/operations.md has the settings:begin marker") + BEGIN.len();
        let end = start + text[start..].find(END).expect("docs/operations.md has the settings:end marker");
        let table = settings_table();
        if text[start..end] == table {
            return;
        }
        if std::env::var_os("STOCKGUARD_WRITE_DOCS").is_some() {
            std::fs::write(OPERATIONS, format!("{}{table}{}", &text[..start], &text[end..])).expect("written");
            return;
        }
        panic!(
            "docs/operations.md's settings table is not the one the flags in src/config.rs make; \
             rewrite it with `STOCKGUARD_WRITE_DOCS=1 cargo test --lib config` and commit it.\n\
             The table the flags make:\n{table}"
        );
    }

    #[test]
    fn every_setting_has_a_flag_an_environment_variable_and_a_meaning() {
        let command = settings();
        for arg in command.get_arguments().filter(|arg| arg.get_id() != "help") {
            assert!(
                arg.get_long().is_some() && arg.get_env().is_some(),
                "{} needs a flag and a variable",
                arg.get_id()
            );
            assert!(arg.get_help().is_some(), "{} needs a doc comment: it is the documentation", arg.get_id());
        }
    }

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
