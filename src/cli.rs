//! The command line. `stockguard` alone serves; the other commands share the
//! database settings.

use std::{
    net::SocketAddr,
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use sea_orm::DatabaseConnection;

use crate::{
    app::AppState,
    archive,
    auth::{Keys, Role},
    config::{DEFAULT_DATABASE_URL, DatabaseConfig, ProcessConfig, ServeConfig},
    db,
    embedded::EmbeddedPostgres,
    http, invariant, schema, seed,
    server::Server,
    stock::partitions,
    telemetry,
};

/// The port of the private PostgreSQL, away from the usual 5432 and 5433.
const EMBEDDED_PORT: u16 = 54329;

/// Stockguard: reserve stock and change orders under heavy concurrency.
#[derive(Parser, Debug)]
#[command(name = "stockguard", version, about, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    #[command(flatten)]
    database: DatabaseConfig,

    #[command(flatten)]
    process: ProcessConfig,

    #[command(flatten)]
    serve: ServeConfig,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve GraphQL and GraphiQL (the default).
    Serve(ServeConfig),
    /// Create the database if missing and apply pending migrations.
    Migrate,
    /// Print the GraphQL schema (SDL).
    Schema,
    /// Print which object types each union and interface may be (Apollo's `possibleTypes`).
    PossibleTypes,
    /// Print a bearer token signed with STOCKGUARD_JWT_SECRET.
    Token {
        /// The user id.
        #[arg(long)]
        sub: String,
        /// The role.
        #[arg(long, value_enum, default_value = "customer")]
        role: Role,
        /// Hours until the token expires.
        #[arg(long, default_value_t = 24)]
        ttl_hours: i64,
        /// The server's secret.
        #[arg(long, env = "STOCKGUARD_JWT_SECRET", hide_env_values = true)]
        jwt_secret: String,
    },
    /// Add the demo inventory (SKUs already present are left alone).
    Seed,
    /// Check the stock invariant of every inventory; exit 1 on drift.
    Check,
    /// Delete released and expired reservations and ledger rows older than
    /// `--older-than`, folding the ledger rows into per-inventory checkpoints
    /// (so `check` stays true); batched, safe while servers run.
    Archive {
        /// How old a row must be: a whole number and h, d or w (`90d`), at least `1d`.
        #[arg(long, value_parser = crate::archive::parse_age)]
        older_than: Duration,
        /// Rows one statement aims at.
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
        batch: u64,
    },
}

/// Runs the command line on a runtime of the configured size.
pub fn run() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    telemetry::init(cli.process.log_format);
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    runtime.worker_threads(match cli.process.worker_threads {
        0 => default_worker_threads(cores, cli.database.database_url.as_deref()),
        threads => threads,
    });
    runtime.enable_all().build().context("cannot start the runtime")?.block_on(dispatch(cli))
}

/// A thread per core, but one core left to PostgreSQL when it runs on this
/// machine. On two cores shared with PostgreSQL one thread served every
/// benchmark cell 8–18 % faster than two (bench/results/decisions.md): with
/// two, a fifth of the server's CPU went to switching between threads, while
/// the database's backends waited for a core.
fn default_worker_threads(cores: usize, database_url: Option<&str>) -> usize {
    if database_url.is_none_or(is_local) { (cores - 1).max(1) } else { cores }
}

/// Whether `url` names a PostgreSQL on this machine: a loopback host, or a
/// Unix socket. A URL sqlx cannot read (libpq's multi-host form) names a
/// cluster, which is not here.
fn is_local(url: &str) -> bool {
    let Ok(options) = url.parse::<sea_orm::sqlx::postgres::PgConnectOptions>() else { return false };
    let host = options.get_host();
    host.starts_with('/')
        || host == "localhost"
        || host.trim_matches(['[', ']']).parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        None => serve(cli.database, cli.serve).await.map(|()| ExitCode::SUCCESS),
        Some(Command::Serve(config)) => serve(cli.database, config).await.map(|()| ExitCode::SUCCESS),
        Some(Command::Schema) => {
            print!("{}", schema::sdl());
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::PossibleTypes) => {
            print!("{}", schema::possible_types());
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Token { sub, role, ttl_hours, jwt_secret }) => {
            let ttl = chrono::Duration::hours(ttl_hours);
            let token = Keys::new(jwt_secret.as_bytes(), ttl.num_seconds())?.mint(&sub, role, ttl)?;
            println!("{token}");
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Migrate) => {
            let database = Database::open(&cli.database).await?;
            database.close().await?;
            println!("migrations applied");
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Seed) => {
            let database = Database::open(&cli.database).await?;
            let added = seed::seed(&database.conn).await.map_err(|e| anyhow::anyhow!("seeding failed: {e}"));
            database.close().await?;
            println!("added {} demo inventories", added?);
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Archive { older_than, batch }) => {
            let database = Database::open(&cli.database).await?;
            let collisions = db::Collisions::new(20);
            let archived = archive::archive(&database.conn, &collisions, older_than, batch).await;
            database.close().await?;
            let archived = archived?;
            println!(
                "archived {} reservations and {} ledger rows in {} statements, dropped {} empty day partitions of the ledger",
                archived.reservations, archived.ledger_rows, archived.statements, archived.partitions
            );
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Check) => {
            let database = Database::open(&cli.database).await?;
            let drifts = invariant::check(&database.conn).await;
            database.close().await?;
            let drifts = drifts?;
            for drift in &drifts {
                println!("DRIFT {drift}");
            }
            if drifts.is_empty() {
                println!("invariant holds for every inventory");
                Ok(ExitCode::SUCCESS)
            } else {
                Ok(ExitCode::FAILURE)
            }
        }
    }
}

/// An open, migrated database, and the private cluster behind it if this
/// process started one.
struct Database {
    conn: DatabaseConnection,
    embedded: Option<EmbeddedPostgres>,
}

impl Database {
    /// Finds the database (DATABASE_URL, the local server, or a private
    /// cluster), creates it if missing, connects and migrates.
    async fn open(config: &DatabaseConfig) -> anyhow::Result<Self> {
        let (url, embedded) = match &config.database_url {
            Some(url) => (url.clone(), None),
            None if listens(DEFAULT_DATABASE_URL_ADDR).await => (DEFAULT_DATABASE_URL.to_owned(), None),
            None => {
                let cluster = EmbeddedPostgres::new(&config.data_dir, EMBEDDED_PORT)?;
                let started = cluster.start().await?;
                tracing::info!(
                    data_dir = %config.data_dir.display(),
                    port = EMBEDDED_PORT,
                    "no DATABASE_URL and nothing on 127.0.0.1:5432: {} a private PostgreSQL",
                    if started { "started" } else { "using the already running" }
                );
                (cluster.url("stockguard"), started.then_some(cluster))
            }
        };
        db::ensure_database(&url)
            .await
            .with_context(|| format!("cannot reach or create the database at {}", redact(&url)))?;
        let conn = db::connect(&url, config).await.with_context(|| format!("cannot connect to {}", redact(&url)))?;
        db::migrate(&conn).await.context("migrations failed")?;
        // Before the first request: a server that was down past the last
        // day made ahead would otherwise write today's first rows into the
        // default partition, and today's partition could not be attached.
        partitions::make(&conn, 0, partitions::DAYS_AHEAD)
            .await
            .context("making the ledger's partitions ahead failed")?;
        Ok(Self { conn, embedded })
    }

    /// Closes the pool and stops a private cluster this process started.
    async fn close(self) -> anyhow::Result<()> {
        self.conn.close().await?;
        if let Some(cluster) = self.embedded {
            cluster.stop().await?;
        }
        Ok(())
    }
}

/// 127.0.0.1:5432, where `DEFAULT_DATABASE_URL` points.
const DEFAULT_DATABASE_URL_ADDR: &str = "127.0.0.1:5432";

async fn listens(addr: &str) -> bool {
    matches!(tokio::time::timeout(Duration::from_millis(500), tokio::net::TcpStream::connect(addr)).await, Ok(Ok(_)))
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{}@{}", &url[..scheme + 3], user, &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

async fn serve(database_config: DatabaseConfig, config: ServeConfig) -> anyhow::Result<()> {
    // Settings first: a server that must not start says so before it touches anything.
    let (keys, dev_tokens) = keys(&config, database_config.database_url.as_deref())?;
    let database = Database::open(&database_config).await?;
    if !config.no_seed {
        let added = seed::seed_if_empty(&database.conn).await.map_err(|e| anyhow::anyhow!("seeding failed: {e}"))?;
        if added > 0 {
            tracing::info!(added, "empty database: added demo inventory");
        }
    }
    let state = AppState::new(database.conn.clone(), keys, config.limits.clone());
    let server = Server::new(state);
    let workers = server.spawn_workers();
    let router = http::router(&server, dev_tokens.as_ref().map(|(op, _)| op.as_str()));
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .with_context(|| format!("cannot listen on {}", config.addr))?;
    announce(listener.local_addr()?, dev_tokens.as_ref());
    let shutdown = drain(server.state().draining.clone(), Duration::from_millis(config.shutdown_delay_ms));
    http::serve(listener, router, http::connection_limits(&config.limits), shutdown).await?;
    workers.shutdown().await;
    database.close().await?;
    tracing::info!("stopped");
    Ok(())
}

/// Resolves when the server should stop accepting connections: on SIGINT or
/// SIGTERM, after `delay` during which `/readyz` answers 503 (`draining`) and
/// every request is still served, so a load balancer takes this process
/// out before its port closes.
async fn drain(draining: Arc<AtomicBool>, delay: Duration) {
    http::shutdown_signal().await;
    if delay.is_zero() {
        return;
    }
    draining.store(true, Ordering::Release);
    tracing::info!(delay_ms = delay.as_millis() as u64, "draining: /readyz answers 503, still serving");
    tokio::time::sleep(delay).await;
}

/// The token keys of a server, and the ready-made dev tokens when it made
/// its own secret.
///
/// Without `STOCKGUARD_JWT_SECRET` the server makes a throw-away secret and
/// shows an operator token in GraphiQL, which anyone who can reach the page
/// could use: so that is allowed only on a loopback address. Nor is it
/// allowed with a `DATABASE_URL` of several hosts: that is a deployment of
/// several processes, and a token one of them signed with a secret of its
/// own would be refused by the others. An explicit secret must be long
/// enough to resist guessing.
fn keys(config: &ServeConfig, database_url: Option<&str>) -> anyhow::Result<(Keys, Option<(String, String)>)> {
    let max_ttl = config.max_token_ttl_secs;
    if let Some(secret) = &config.jwt_secret {
        return Ok((Keys::new(secret.as_bytes(), max_ttl)?, None));
    }
    let hosts = database_url.and_then(|url| db::primary::parse(url).ok()).map_or(1, |target| target.hosts.len());
    if hosts > 1 {
        anyhow::bail!(
            "STOCKGUARD_JWT_SECRET is required with a DATABASE_URL of {hosts} hosts: every process of a \
             deployment must verify the tokens the others accept, so they share one secret"
        );
    }
    if !config.addr.ip().is_loopback() {
        anyhow::bail!(
            "STOCKGUARD_JWT_SECRET is required to listen on {}, which is not a loopback address \
             (without it the server would make its own secret and hand out operator tokens in GraphiQL)",
            config.addr
        );
    }
    let keys = Keys::new(Keys::random_secret().as_bytes(), max_ttl)?;
    let ttl = chrono::Duration::seconds(max_ttl.min(24 * 60 * 60));
    let operator = keys.mint("operator", Role::Operator, ttl)?;
    let customer = keys.mint("alice", Role::Customer, ttl)?;
    Ok((keys, Some((operator, customer))))
}

fn announce(addr: SocketAddr, dev_tokens: Option<&(String, String)>) {
    println!("Stockguard is serving GraphiQL on http://{addr}/ (GraphQL: POST http://{addr}/graphql)");
    if let Some((operator, customer)) = dev_tokens {
        println!(
            "No STOCKGUARD_JWT_SECRET set: using a random secret for this run. GraphiQL sends the operator token.\n\
             Operator token (sub=operator): {operator}\n\
             Customer token (sub=alice):    {customer}\n\
             Use them as the header  Authorization: Bearer <token>"
        );
    } else {
        println!("Mint a token with: stockguard token --sub alice --role customer");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_core_is_left_to_a_postgresql_on_this_machine() {
        let threads = |cores, url| default_worker_threads(cores, url);
        assert_eq!(threads(2, None), 1, "the local or private server");
        assert_eq!(threads(2, Some("postgres://postgres@127.0.0.1:5432/sg")), 1);
        assert_eq!(threads(4, Some("postgres://localhost/sg")), 3);
        assert_eq!(threads(4, Some("postgres://[::1]:5432/sg")), 3);
        assert_eq!(threads(4, Some("postgres:///sg?host=/var/run/postgresql")), 3);
        assert_eq!(threads(1, None), 1, "never none");
        assert_eq!(threads(8, Some("postgres://db.internal:5432/sg")), 8, "a database elsewhere");
        assert_eq!(threads(8, Some("postgres://10.0.0.5:5432,10.0.0.6:5432/sg")), 8, "a cluster");
    }

    #[test]
    fn passwords_are_left_out_of_messages() {
        assert_eq!(redact("postgres://u:secret@h:5432/db"), "postgres://u@h:5432/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
    }
}
