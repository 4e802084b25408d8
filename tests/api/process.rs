//! The server binary as a child process with a database of its own, for the
//! tests that attack the process itself: a crash must fail the test, not
//! abort the test binary, and memory is read from `/proc/<pid>/status`. The
//! harness is the support crate's [`ServerProcess`], shared with the
//! examples.
//!
//! `STOCKGUARD_SERVER_BINARY` points the tests at another build (an older
//! commit's, to see an attack succeed there); by default they run the
//! binary built with them.

use std::{path::PathBuf, process::ExitStatus, time::Duration};

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use serde_json::Value;
use stockguard::{
    auth::{Keys, Role},
    config::{DEFAULT_MAX_TOKEN_TTL_SECS, DatabaseConfig},
    db,
};
use stockguard_support::{
    client,
    process::{Log, ServerProcess},
};
use uuid::Uuid;

use crate::helpers::{Isolation, SECRET, drop_database, server_url};

/// The binary under test.
pub fn binary() -> PathBuf {
    std::env::var_os("STOCKGUARD_SERVER_BINARY").map_or_else(|| env!("CARGO_BIN_EXE_stockguard").into(), PathBuf::from)
}

/// A running server process, on a database it made or shares.
pub struct Process {
    server: ServerProcess,
    /// `http://127.0.0.1:<port>`.
    pub address: String,
    /// `127.0.0.1:<port>`.
    pub addr: String,
    /// A direct connection for checks.
    pub db: DatabaseConnection,
    /// A client whose every request gives up after 20 s, so no test hangs.
    pub client: reqwest::Client,
    /// The database's URL.
    pub database_url: String,
    /// Whether this process made the database (and drops it at the end).
    owns_database: bool,
    keys: Keys,
}

impl Process {
    /// Starts the server on port 0 against a fresh database, with `env` on
    /// top of the test secret, and waits until it is ready.
    pub async fn start(env: &[(&str, &str)]) -> Self {
        Self::launch(env, Some(SECRET)).await
    }

    /// Starts the server as a developer would, with no secret: it makes its own.
    pub async fn start_without_secret() -> Self {
        Self::launch(&[], None).await
    }

    /// Starts another server on `first`'s database (a second process of one
    /// deployment, with the same secret), with `env`.
    pub async fn beside(first: &Process, env: &[(&str, &str)]) -> Self {
        Self::launch_on(&first.database_url, false, env, Some(SECRET)).await
    }

    /// Two servers on one fresh database whose default isolation is
    /// `isolation`, each with `env`: two processes sharing the rows, as a
    /// deployment of several servers does.
    pub async fn start_two(env: &[(&str, &str)], isolation: Isolation) -> (Self, Self) {
        let name = format!("sg_test_{}", Uuid::new_v4().simple());
        let database_url = format!("{}/{name}", server_url());
        db::ensure_database(&database_url).await.expect("create the database");
        let admin = sea_orm::Database::connect(format!("{}/postgres", server_url())).await.expect("connect");
        let set = format!("ALTER DATABASE {name} SET default_transaction_isolation TO '{}'", isolation.sql());
        admin.execute_unprepared(&set).await.expect("set the isolation level");
        admin.close().await.expect("close");
        let first = Self::launch_on(&database_url, true, env, Some(SECRET)).await;
        let second = Self::beside(&first, env).await;
        (first, second)
    }

    async fn launch(env: &[(&str, &str)], secret: Option<&str>) -> Self {
        let name = format!("sg_test_{}", Uuid::new_v4().simple());
        let database_url = format!("{}/{name}", server_url());
        db::ensure_database(&database_url).await.expect("create the database");
        Self::launch_on(&database_url, true, env, secret).await
    }

    async fn launch_on(database_url: &str, owns_database: bool, env: &[(&str, &str)], secret: Option<&str>) -> Self {
        // Small pools: tests run side by side on one PostgreSQL of 100 connections.
        let env: Vec<(&str, &str)> = [("STOCKGUARD_POOL_SIZE", "4")].into_iter().chain(env.iter().copied()).collect();
        let started = ServerProcess::start(&binary(), database_url, secret, &env, Log::Kept).await;
        let server = started.unwrap_or_else(|err| {
            if owns_database {
                drop_database(database_url);
            }
            panic!("{err:#}")
        });
        let config = DatabaseConfig {
            database_url: Some(database_url.to_owned()),
            pool_size: 2,
            acquire_timeout_ms: 30_000,
            statement_timeout_ms: 30_000,
            ..DatabaseConfig::default()
        };
        let db = db::connect(database_url, &config).await.expect("connect for checks");
        let keys = Keys::new(SECRET.as_bytes(), DEFAULT_MAX_TOKEN_TTL_SECS).expect("a long enough secret");
        let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().expect("client");
        Self {
            address: server.url.clone(),
            addr: server.addr.clone(),
            server,
            db,
            client,
            database_url: database_url.to_owned(),
            owns_database,
            keys,
        }
    }

    /// What the server printed.
    pub fn log(&self) -> String {
        self.server.log()
    }

    /// The process's resident memory in KiB.
    pub fn rss_kb(&self) -> u64 {
        self.server.status_kb("VmRSS").unwrap_or(0)
    }

    /// The names of the process's threads (`/proc/<pid>/task/*/comm`).
    pub fn thread_names(&self) -> Vec<String> {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.server.pid)).expect("the process's threads");
        tasks
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .map(|name| name.trim().to_owned())
            .collect()
    }

    /// Fails the test unless the process still runs and `/healthz` answers
    /// within `within`; returns how long it took.
    pub async fn assert_serving(&mut self, within: Duration) -> Duration {
        if let Some(status) = self.server.exited() {
            panic!("the server died ({status}):\n{}", self.server.tail());
        }
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout(within, self.client.get(format!("{}/healthz", self.address)).send()).await;
        match answer {
            Ok(Ok(response)) if response.status() == 200 => started.elapsed(),
            Ok(answer) => panic!("/healthz: {answer:?}\n{}", self.server.tail()),
            Err(_) => panic!("/healthz did not answer within {within:?}\n{}", self.server.tail()),
        }
    }

    /// Sends the process SIGTERM, as an orchestrator stopping it does.
    pub fn terminate(&self) {
        self.server.terminate().expect("SIGTERM sent");
    }

    /// Kills the process with SIGKILL, as a crash or an OOM kill does: no
    /// handler runs, nothing is flushed.
    pub fn kill(&self) {
        let killed = std::process::Command::new("kill").args(["-KILL", &self.server.pid.to_string()]).status();
        assert!(killed.is_ok_and(|status| status.success()), "SIGKILL sent");
    }

    /// The exit status, once the process has exited (within `limit`, or the test fails).
    pub async fn exit_status(&mut self, limit: Duration) -> ExitStatus {
        self.server.wait(limit).await.unwrap_or_else(|err| panic!("{err:#}"))
    }

    /// A token for `sub` with `role`, valid for ten minutes.
    pub fn token(&self, sub: &str, role: Role) -> String {
        self.keys.mint(sub, role, chrono::Duration::minutes(10)).expect("mint")
    }

    /// POSTs a GraphQL request; the status and the JSON body (a string when
    /// the body is not JSON), or the transport error.
    pub async fn graphql(&self, token: Option<&str>, query: &str, variables: Value) -> Result<(u16, Value), String> {
        let bearer = token.map(|token| format!("Bearer {token}"));
        let reply = client::post(&self.client, &self.address, bearer.as_deref(), client::request(query, variables));
        let reply = reply.await.map_err(|err| format!("{err:?}"))?;
        if let Some(why) = reply.cut_short {
            return Err(why);
        }
        let text = String::from_utf8_lossy(&reply.body).into_owned();
        Ok((reply.status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
    }

    /// Creates an inventory as operator and returns its id.
    pub async fn create_inventory(&self, sku: &str, stock: i32) -> Uuid {
        let operator = self.token("operator", Role::Operator);
        let created = client::create_inventory(&self.client, &self.address, &operator, sku, sku, stock.into());
        created.await.unwrap_or_else(|err| panic!("{err:#}"))
    }

    /// A count from the database.
    pub async fn count(&self, sql: &str) -> i64 {
        let row =
            self.db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await.expect("query").expect("row");
        row.try_get_by_index(0).expect("count")
    }
}

impl Drop for Process {
    /// Drops the database this process made; the server is killed with its handle.
    fn drop(&mut self) {
        if self.owns_database {
            drop_database(&self.database_url);
        }
    }
}
