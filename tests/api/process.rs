//! The server binary as a child process with a database of its own, for the
//! tests that attack the process itself: a crash must fail the test, not
//! abort the test binary, and memory is read from `/proc/<pid>/status`.
//!
//! `STOCKGUARD_SERVER_BINARY` points the tests at another build (an older
//! commit's, to see an attack succeed there); by default they run the
//! binary built with them.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use serde_json::{Value, json};
use stockguard::{
    auth::{DEFAULT_MAX_TOKEN_TTL_SECS, Keys, Role},
    config::DatabaseConfig,
    db,
};
use uuid::Uuid;

use crate::helpers::{Isolation, SECRET, drop_database, server_url};

/// The binary under test.
pub fn binary() -> PathBuf {
    std::env::var_os("STOCKGUARD_SERVER_BINARY").map_or_else(|| env!("CARGO_BIN_EXE_stockguard").into(), PathBuf::from)
}

/// A running server process.
pub struct Process {
    child: Child,
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
    log: PathBuf,
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
        let database_url = database_url.to_owned();
        let log = std::env::temp_dir().join(format!("stockguard-{}.log", Uuid::new_v4().simple()));
        let output = std::fs::File::create(&log).expect("log file");
        let mut command = Command::new(binary());
        match secret {
            Some(secret) => command.env("STOCKGUARD_JWT_SECRET", secret),
            None => command.env_remove("STOCKGUARD_JWT_SECRET"),
        };
        let child = command
            .env("DATABASE_URL", &database_url)
            .env("STOCKGUARD_ADDR", "127.0.0.1:0")
            .env("STOCKGUARD_NO_SEED", "true")
            // Small pools: tests run side by side on one PostgreSQL of 100 connections.
            .env("STOCKGUARD_POOL_SIZE", "4")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(output.try_clone().expect("log file"))
            .stderr(output)
            .spawn()
            .expect("start stockguard");
        let config = DatabaseConfig {
            database_url: Some(database_url.clone()),
            data_dir: ".stockguard/postgres".into(),
            pool_size: 2,
            acquire_timeout_ms: 30_000,
            statement_timeout_ms: 30_000,
        };
        let db = db::connect(&database_url, &config).await.expect("connect for checks");
        let keys = Keys::new(SECRET.as_bytes(), DEFAULT_MAX_TOKEN_TTL_SECS).expect("a long enough secret");
        let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().expect("client");
        let mut process = Self {
            child,
            address: String::new(),
            addr: String::new(),
            db,
            client,
            database_url,
            owns_database,
            log,
            keys,
        };
        process.addr = process.announced_address().await;
        process.address = format!("http://{}", process.addr);
        process.until_ready().await;
        process
    }

    /// The address the server says it serves on.
    async fn announced_address(&mut self) -> String {
        const SAYS: &str = "serving GraphiQL on http://";
        let started = Instant::now();
        loop {
            if let Some(rest) = self.log().split_once(SAYS).map(|(_, rest)| rest.to_owned()) {
                return rest.split('/').next().unwrap_or_default().to_owned();
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the server exited before it listened ({status}):\n{}", self.log());
            }
            assert!(started.elapsed() < Duration::from_secs(60), "no address within 60 s:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn until_ready(&mut self) {
        let started = Instant::now();
        while !matches!(self.client.get(format!("{}/readyz", self.address)).send().await, Ok(r) if r.status() == 200) {
            assert!(started.elapsed() < Duration::from_secs(30), "not ready within 30 s:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// What the server printed.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process's resident memory in KiB.
    pub fn rss_kb(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// Fails the test unless the process still runs and `/healthz` answers
    /// within `within`; returns how long it took.
    pub async fn assert_serving(&mut self, within: Duration) -> Duration {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("the server died ({status}):\n{}", tail(&self.log()));
        }
        let started = Instant::now();
        let answer = tokio::time::timeout(within, self.client.get(format!("{}/healthz", self.address)).send()).await;
        match answer {
            Ok(Ok(response)) if response.status() == 200 => started.elapsed(),
            Ok(answer) => panic!("/healthz: {answer:?}\n{}", tail(&self.log())),
            Err(_) => panic!("/healthz did not answer within {within:?}\n{}", tail(&self.log())),
        }
    }

    /// Sends the process SIGTERM, as an orchestrator stopping it does.
    pub fn terminate(&self) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().expect("kill");
        assert!(sent.success(), "SIGTERM sent");
    }

    /// The exit status, once the process has exited (within `limit`, or the test fails).
    pub async fn exit_status(&mut self, limit: Duration) -> std::process::ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(started.elapsed() < limit, "still running after {limit:?}:\n{}", tail(&self.log()));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A token for `sub` with `role`, valid for ten minutes.
    pub fn token(&self, sub: &str, role: Role) -> String {
        self.keys.mint(sub, role, chrono::Duration::minutes(10)).expect("mint")
    }

    /// POSTs a GraphQL request; the status and the JSON body (a string when
    /// the body is not JSON), or the transport error.
    pub async fn graphql(&self, token: Option<&str>, query: &str, variables: Value) -> Result<(u16, Value), String> {
        let mut request = self.client.post(format!("{}/graphql", self.address));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.json(&json!({ "query": query, "variables": variables })).send().await;
        let response = response.map_err(|err| format!("{err:?}"))?;
        let status = response.status().as_u16();
        let text = response.text().await.map_err(|err| format!("{err:?}"))?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
    }

    /// Creates an inventory as operator and returns its id.
    pub async fn create_inventory(&self, sku: &str, stock: i32) -> Uuid {
        let operator = self.token("operator", Role::Operator);
        let query = "mutation($input: CreateInventoryInput!) { createInventory(input: $input) { id } }";
        let variables = json!({ "input": { "sku": sku, "name": sku, "stock": stock } });
        let (_, body) = self.graphql(Some(&operator), query, variables).await.expect("create");
        body["data"]["createInventory"]["id"].as_str().and_then(|id| id.parse().ok()).expect("an id")
    }

    /// A count from the database.
    pub async fn count(&self, sql: &str) -> i64 {
        let row =
            self.db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await.expect("query").expect("row");
        row.try_get_by_index(0).expect("count")
    }
}

/// The last lines of a log, for a failure message.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

impl Drop for Process {
    /// Kills the server and drops the database this process made.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
        if self.owns_database {
            drop_database(&self.database_url);
        }
    }
}
