//! The command line. `stockguard` alone serves (built by `startup.rs`, as
//! the tests build theirs); the other commands share the database settings.

use std::{io::IsTerminal as _, net::SocketAddr, process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use crate::{
    archive,
    auth::{Keys, Role},
    config::{DatabaseConfig, ProcessConfig, ServeConfig},
    db, invariant, schema, seed,
    startup::{Application, Database, DevTokens, Settings, drain},
    telemetry,
};

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
    /// Check the stock invariant of every inventory and every location; exit 1 on drift.
    /// One snapshot, read a part at a time under the check's own time limit
    /// (not the server's statement timeout); progress on a terminal.
    Check {
        /// How long the check may take before it gives up (seconds; 0: no limit).
        #[arg(long, default_value_t = invariant::DEFAULT_TIME_LIMIT.as_secs())]
        time_limit_secs: u64,
        /// Inventories judged per statement.
        #[arg(long, default_value_t = invariant::DEFAULT_BATCH, value_parser = clap::value_parser!(u64).range(1..))]
        batch: u64,
    },
    /// Forget idempotency keys and delete released and expired reservations
    /// and ledger rows older than `--older-than`, folding the ledger rows into
    /// per-inventory checkpoints (so `check` stays true); batched, safe while
    /// servers run.
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
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    runtime.worker_threads(match cli.process.worker_threads {
        0 => default_worker_threads(cores, cli.database.database_url.as_deref()),
        threads => threads,
    });
    runtime.enable_all().build().context("cannot start the runtime")?.block_on(async {
        let traces = telemetry::init(cli.process.log_format);
        let result = dispatch(cli).await;
        traces.shutdown().await;
        result
    })
}

/// A thread per core, but one core left to PostgreSQL when it runs on this
/// machine. On two cores shared with PostgreSQL one thread served every
/// benchmark cell 8–18 % faster than two
/// (bench/results/decisions.md#a-core-left-to-a-postgresql-on-the-same-machine-c5809a6-kept): with
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
            let added =
                seed::seed(&database.conn).await.map_err(|e| anyhow::anyhow!("seeding failed: {}", e.for_operator()));
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
                "forgot {} idempotency keys, archived {} reservations and {} ledger rows in {} statements, \
                 dropped {} empty day partitions of the ledger, {} events and {} webhook deliveries",
                archived.keys,
                archived.reservations,
                archived.ledger_rows,
                archived.statements,
                archived.partitions,
                archived.events.events,
                archived.events.deliveries
            );
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Check { time_limit_secs, batch }) => {
            let time_limit = (time_limit_secs > 0).then(|| Duration::from_secs(time_limit_secs));
            let database = Database::open(&cli.database).await?;
            let checked = check(&database.conn, &invariant::Options { time_limit, batch }).await;
            database.close().await?;
            let checked = checked?;
            if checked.drifts == 0 {
                println!(
                    "invariant holds for every inventory and every location ({} inventories)",
                    checked.inventories
                );
                Ok(ExitCode::SUCCESS)
            } else {
                Ok(ExitCode::FAILURE)
            }
        }
    }
}

/// Runs the check, printing each drift as a `DRIFT` line as soon as it is
/// found and, when stderr is a terminal, its progress on one line there.
async fn check(db: &sea_orm::DatabaseConnection, options: &invariant::Options) -> anyhow::Result<invariant::Checked> {
    let terminal = std::io::stderr().is_terminal();
    let started = std::time::Instant::now();
    let checked = invariant::check_with(db, options, |found| match found {
        invariant::Found::Drift(drift) => {
            if terminal {
                eprint!("\r\x1b[2K");
            }
            println!("DRIFT {drift}");
        }
        invariant::Found::Progress(progress) if terminal => {
            eprint!("\r\x1b[2Kchecking ({:.0} s) {progress}", started.elapsed().as_secs_f64());
        }
        invariant::Found::Progress(_) => {}
    })
    .await;
    if terminal {
        eprint!("\r\x1b[2K");
    }
    match checked {
        Err(err @ invariant::CheckError::OutOfTime(_)) => {
            Err(anyhow::anyhow!("{err}; --time-limit-secs gives it longer (0: no limit)"))
        }
        checked => Ok(checked?),
    }
}

async fn serve(database_config: DatabaseConfig, config: ServeConfig) -> anyhow::Result<()> {
    // Settings first: a server that must not start says so before it touches anything.
    let settings = Settings::from_config(&config, database_config.database_url.as_deref())?;
    let dev_tokens = settings.dev_tokens.clone();
    let database = Database::open(&database_config).await?;
    let application = Application::build(settings, database).await?;
    announce(application.address(), dev_tokens.as_ref());
    let draining = application.server().state().draining.clone();
    application.run_until_stopped(drain(draining, Duration::from_millis(config.shutdown_delay_ms))).await?;
    tracing::info!("stopped");
    Ok(())
}

fn announce(addr: SocketAddr, dev_tokens: Option<&DevTokens>) {
    println!("Stockguard is serving GraphiQL on http://{addr}/ (GraphQL: POST http://{addr}/graphql)");
    if let Some(DevTokens { operator, customer }) = dev_tokens {
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
}
