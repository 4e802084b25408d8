//! The one way a server starts, for `stockguard serve` and for the tests
//! alike: [`Database::open`] finds, creates, migrates and prepares the
//! database; [`Application::build`] binds the listener (port 0 included)
//! and builds the state, the composition root (`server.rs`), its workers
//! and the router; [`Application::run_until_stopped`] serves until the
//! future it is given resolves, then stops the workers and closes the pool.

use std::{
    future::Future,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use axum::Router;
use sea_orm::DatabaseConnection;
use tokio::net::TcpListener;

use crate::{
    app::AppState,
    auth::{Keys, Role},
    config::{DatabaseConfig, Limits, ServeConfig},
    db::{self, local},
    embedded::EmbeddedPostgres,
    http::{self, ConnectionLimits},
    seed,
    server::{Server, Workers},
    stock::partitions,
};

/// The port of the private PostgreSQL, away from the usual 5432 and 5433.
const EMBEDDED_PORT: u16 = 54329;

/// An open, migrated database, and the private cluster behind it if this
/// process started one.
pub struct Database {
    /// The pool. A caller may look into it before the server is built (the
    /// tests count its statements through its metric callback).
    pub conn: DatabaseConnection,
    /// The private cluster this process started, stopped by [`Self::close`].
    embedded: Option<EmbeddedPostgres>,
}

impl Database {
    /// Finds the database (the configured URL; else the server on
    /// 127.0.0.1:5432 if it lets `postgres` in without a password and is
    /// recent enough; else a private cluster on port 54329), creates it if
    /// missing, connects, refuses a release Stockguard does not run on,
    /// migrates, and makes the ledger's partitions ahead.
    pub async fn open(config: &DatabaseConfig) -> anyhow::Result<Self> {
        Self::open_with(config, local::USUAL_ADDR, EMBEDDED_PORT).await
    }

    /// [`Self::open`] with the address of the local server to try and the
    /// port of the private cluster to start instead: a test gives its own,
    /// so as not to meet the machine's server or another process's cluster.
    pub async fn open_with(config: &DatabaseConfig, local: SocketAddr, private_port: u16) -> anyhow::Result<Self> {
        let (url, embedded) = match &config.database_url {
            Some(url) => (url.clone(), None),
            None => match local::probe(local).await {
                Ok(_) => (format!("postgres://postgres@{local}/stockguard"), None),
                Err(why) => {
                    let unstarted = || {
                        format!(
                            "no database: DATABASE_URL is not set, the PostgreSQL on {local} cannot be used \
                             ({why}), and a private one cannot be started"
                        )
                    };
                    let cluster = EmbeddedPostgres::new(&config.data_dir, private_port).with_context(unstarted)?;
                    let started = cluster.start().await.with_context(unstarted)?;
                    tracing::info!(
                        data_dir = %cluster.data_dir().display(),
                        port = private_port,
                        "no DATABASE_URL, and the PostgreSQL on {local} cannot be used: {why}; {} a private PostgreSQL",
                        if started { "started" } else { "using the already running" }
                    );
                    (cluster.url("stockguard"), started.then_some(cluster))
                }
            },
        };
        let opened = Self::connect(&url, config).await;
        match (opened, embedded) {
            (Ok(conn), embedded) => Ok(Self { conn, embedded }),
            (Err(err), Some(cluster)) => {
                // A cluster this call started is not left running behind an error.
                if let Err(stop) = cluster.stop().await {
                    tracing::warn!(error = %stop, "could not stop the private PostgreSQL");
                }
                Err(err)
            }
            (Err(err), None) => Err(err),
        }
    }

    /// Creates, connects to, checks and migrates the database at `url`.
    async fn connect(url: &str, config: &DatabaseConfig) -> anyhow::Result<DatabaseConnection> {
        db::ensure_database(url)
            .await
            .with_context(|| format!("cannot reach or create the database at {}", redact(url)))?;
        let conn = db::connect(url, config).await.with_context(|| format!("cannot connect to {}", redact(url)))?;
        // Before any migration: an older release would fail half-way
        // through them, leaving a database neither old nor new.
        let release = local::release(&conn).await.context("cannot read the server's release")?;
        release.require_supported().with_context(|| format!("cannot use the PostgreSQL at {}", redact(url)))?;
        db::migrate(&conn).await.context("migrations failed")?;
        // Before the first request: a server that was down past the last
        // day made ahead would otherwise write today's first rows into the
        // default partition, and today's partition could not be attached.
        partitions::make(&conn, 0, partitions::DAYS_AHEAD)
            .await
            .context("making the ledger's partitions ahead failed")?;
        Ok(conn)
    }

    /// Closes the pool and stops a private cluster this process started.
    pub(crate) async fn close(self) -> anyhow::Result<()> {
        self.conn.close().await?;
        if let Some(cluster) = self.embedded {
            cluster.stop().await?;
        }
        Ok(())
    }
}

/// What a server is built from besides its database.
pub struct Settings {
    /// Where to listen; port 0 lets the system choose ([`Application::address`] says which).
    pub addr: SocketAddr,
    /// The API's limits and write policies.
    pub limits: Limits,
    /// The keys tokens are verified (and dev tokens signed) with.
    pub keys: Keys,
    /// The operator and customer tokens of a server that made its own secret.
    pub dev_tokens: Option<DevTokens>,
    /// Whether an empty database gets the demo inventory.
    pub seed: bool,
}

/// Ready-made tokens for trying a server that made its own secret.
#[derive(Clone)]
pub struct DevTokens {
    /// `sub=operator`; GraphiQL sends it.
    pub(crate) operator: String,
    /// `sub=alice`.
    pub(crate) customer: String,
}

impl Settings {
    /// The settings of `stockguard serve`, refused when the server must not start.
    ///
    /// Without `STOCKGUARD_JWT_SECRET` the server makes a throw-away secret and
    /// shows an operator token in GraphiQL, which anyone who can reach the page
    /// could use: so that is allowed only on a loopback address. Nor is it
    /// allowed with a `DATABASE_URL` of several hosts: that is a deployment of
    /// several processes, and a token one of them signed with a secret of its
    /// own would be refused by the others. An explicit secret must be long
    /// enough to resist guessing.
    pub(crate) fn from_config(config: &ServeConfig, database_url: Option<&str>) -> anyhow::Result<Self> {
        let max_ttl = config.max_token_ttl_secs;
        let (keys, dev_tokens) = match &config.jwt_secret {
            Some(secret) => (Keys::new(secret.as_bytes(), max_ttl)?, None),
            None => {
                let hosts =
                    database_url.and_then(|url| db::primary::parse(url).ok()).map_or(1, |target| target.hosts.len());
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
                (keys, Some(DevTokens { operator, customer }))
            }
        };
        Ok(Self { addr: config.addr, limits: config.limits.clone(), keys, dev_tokens, seed: !config.no_seed })
    }
}

/// A built server, listening but not yet serving.
pub struct Application {
    database: Database,
    server: Server,
    workers: Workers,
    listener: TcpListener,
    address: SocketAddr,
    router: Router,
    connections: ConnectionLimits,
}

impl Application {
    /// Seeds an empty database if asked, builds the state, the server's
    /// parts, its workers and the router over `database`, and binds
    /// `settings.addr`.
    pub async fn build(settings: Settings, database: Database) -> anyhow::Result<Self> {
        let Settings { addr, limits, keys, dev_tokens, seed } = settings;
        if seed {
            let added = seed::seed_if_empty(&database.conn)
                .await
                .map_err(|e| anyhow::anyhow!("seeding failed: {}", e.for_operator()))?;
            if added > 0 {
                tracing::info!(added, "empty database: added demo inventory");
            }
        }
        let connections = http::connection_limits(&limits);
        let server = Server::new(AppState::new(database.conn.clone(), keys, limits));
        let router = http::router(&server, dev_tokens.as_ref().map(|tokens| tokens.operator.as_str()));
        let listener = TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
        let address = listener.local_addr()?;
        let workers = server.spawn_workers();
        Ok(Self { database, server, workers, listener, address, router, connections })
    }

    /// The address it listens on (the port the system chose for port 0).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The server's parts: its state, schema and limits.
    pub fn server(&self) -> &Server {
        &self.server
    }

    /// Serves until `stop` resolves and the requests in flight are answered,
    /// then stops the workers and closes the database.
    pub async fn run_until_stopped(self, stop: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        http::serve(self.listener, self.router, self.connections, stop).await?;
        self.workers.shutdown().await;
        self.database.close().await
    }
}

/// Resolves when a server should stop accepting connections: on SIGINT or
/// SIGTERM, after `delay` during which `/readyz` answers 503 (`draining`) and
/// every request is still served, so a load balancer takes the process out
/// before its port closes.
pub(crate) async fn drain(draining: Arc<AtomicBool>, delay: Duration) {
    http::shutdown_signal().await;
    if delay.is_zero() {
        return;
    }
    draining.store(true, Ordering::Release);
    tracing::info!(delay_ms = delay.as_millis() as u64, "draining: /readyz answers 503, still serving");
    tokio::time::sleep(delay).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_left_out_of_messages() {
        assert_eq!(redact("postgres://u:secret@h:5432/db"), "postgres://u@h:5432/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
    }
}
