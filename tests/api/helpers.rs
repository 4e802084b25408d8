//! `TestApp`: a real server on port 0 against a database of its own, plus
//! request helpers and reads straight from the database.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use serde_json::{Value, json};
use stockguard::{
    app::AppState,
    auth::{Keys, Role},
    config::{DatabaseConfig, Limits},
    db, http, invariant,
    schema::AppSchema,
    server::{Server, Workers},
};
use uuid::Uuid;

/// The server the tests create their databases on.
pub fn server_url() -> String {
    std::env::var("STOCKGUARD_TEST_DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// The secret every test server signs with.
pub const SECRET: &str = "test-secret";

/// PostgreSQL's default isolation for a test database.
#[derive(Debug, Clone, Copy)]
pub enum Isolation {
    ReadCommitted,
    RepeatableRead,
    Serializable,
}

impl Isolation {
    fn sql(self) -> &'static str {
        match self {
            Self::ReadCommitted => "read committed",
            Self::RepeatableRead => "repeatable read",
            Self::Serializable => "serializable",
        }
    }
}

/// What a test server is made of; `Options::default()` is what most tests use.
pub struct Options {
    /// PostgreSQL's default isolation for the test database.
    pub isolation: Isolation,
    /// The API's limits and write policies.
    pub limits: Limits,
    /// The PostgreSQL server (without a database name); default [`server_url`].
    pub server_url: Option<String>,
    /// The server's pool size.
    pub pool_size: u32,
    /// How long a request waits for a pooled connection.
    pub acquire_timeout_ms: u64,
    /// `statement_timeout` of the server's connections.
    pub statement_timeout_ms: u64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            isolation: Isolation::ReadCommitted,
            limits: Limits::default(),
            server_url: None,
            pool_size: 10,
            // Generous: tests assert outcomes, not timing, on a busy 2-core machine.
            acquire_timeout_ms: 30_000,
            statement_timeout_ms: 30_000,
        }
    }
}

/// One running server with its own database.
pub struct TestApp {
    /// `http://127.0.0.1:<port>`.
    pub address: String,
    /// A keep-alive HTTP client.
    pub client: reqwest::Client,
    /// A direct connection for checks, outside the server.
    pub db: DatabaseConnection,
    /// The schema the server serves.
    pub schema: AppSchema,
    /// Statements the server's pool has run.
    pub statements: Arc<AtomicUsize>,
    /// The database's URL.
    pub database_url: String,
    keys: Keys,
    /// The sweeper and the live-stock listener, stopped with the test.
    _workers: Workers,
}

impl TestApp {
    /// A server at READ COMMITTED (PostgreSQL's default).
    pub async fn spawn() -> Self {
        Self::spawn_with(Isolation::ReadCommitted).await
    }

    /// A server whose database defaults to `isolation`.
    pub async fn spawn_with(isolation: Isolation) -> Self {
        Self::spawn_configured(isolation, Limits::default()).await
    }

    /// A server whose database defaults to `isolation`, with `limits` (which
    /// also hold the order locking mode and lock timeout).
    pub async fn spawn_configured(isolation: Isolation, limits: Limits) -> Self {
        Self::spawn_with_options(Options { isolation, limits, ..Options::default() }).await
    }

    /// A server with every knob the tests turn.
    pub async fn spawn_with_options(options: Options) -> Self {
        let Options { isolation, limits, server_url: server, pool_size, acquire_timeout_ms, statement_timeout_ms } =
            options;
        let name = format!("sg_test_{}", Uuid::new_v4().simple());
        let database_url = format!("{}/{name}", server.unwrap_or_else(server_url));
        db::ensure_database(&database_url).await.expect("create the test database");
        let config = DatabaseConfig {
            database_url: Some(database_url.clone()),
            data_dir: ".stockguard/postgres".into(),
            pool_size,
            acquire_timeout_ms,
            statement_timeout_ms,
        };
        let direct = db::connect(
            &database_url,
            &DatabaseConfig {
                pool_size: 2,
                acquire_timeout_ms: 30_000,
                statement_timeout_ms: 30_000,
                ..config.clone()
            },
        )
        .await
        .expect("connect for checks");
        direct
            .execute_unprepared(&format!(
                "ALTER DATABASE {name} SET default_transaction_isolation TO '{}'",
                isolation.sql()
            ))
            .await
            .expect("set the isolation level");
        let mut pool = db::connect(&database_url, &config).await.expect("connect the server");
        db::migrate(&pool).await.expect("migrate");
        let statements = Arc::new(AtomicUsize::new(0));
        let counter = statements.clone();
        pool.set_metric_callback(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        });

        let keys = Keys::new(SECRET.as_bytes());
        let state = AppState::new(pool, keys.clone(), limits);
        let server = Server::new(state.clone());
        let workers = server.spawn_workers();
        let schema = server.schema();
        let router = http::router(state, schema.clone(), None);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(http::serve(listener, router, std::future::pending()));

        let client = reqwest::Client::builder().timeout(Duration::from_secs(120)).build().expect("client");
        Self { address, client, db: direct, schema, statements, database_url, keys, _workers: workers }
    }

    /// A token for `sub` with `role`.
    pub fn token(&self, sub: &str, role: Role) -> String {
        self.keys.mint(sub, role, chrono::Duration::minutes(10)).expect("mint")
    }

    /// An operator's token.
    pub fn operator(&self) -> String {
        self.token("operator", Role::Operator)
    }

    /// POSTs a GraphQL request and returns the JSON body.
    pub async fn graphql(&self, token: Option<&str>, query: &str, variables: Value) -> Value {
        let mut request = self.client.post(format!("{}/graphql", self.address));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.json(&json!({ "query": query, "variables": variables })).send().await.expect("send");
        assert_eq!(response.status(), 200, "GraphQL answers 200");
        response.json().await.expect("JSON body")
    }

    /// Creates an inventory as operator and returns its id.
    pub async fn create_inventory(&self, sku: &str, stock: i32) -> Uuid {
        let body = self
            .graphql(
                Some(&self.operator()),
                "mutation($input: CreateInventoryInput!) { createInventory(input: $input) { id } }",
                json!({ "input": { "sku": sku, "name": format!("Item {sku}"), "stock": stock } }),
            )
            .await;
        body["data"]["createInventory"]["id"]
            .as_str()
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("created: {body}"))
    }

    /// `reserve` with `input`; returns `data.reserve` or the whole body on errors.
    pub async fn reserve(&self, token: &str, input: Value) -> Value {
        let body = self.graphql(Some(token), RESERVE, json!({ "input": input })).await;
        if body.get("errors").is_some() { body } else { body["data"]["reserve"].clone() }
    }

    /// `(stock, version)` of an inventory, from the database.
    pub async fn stock_and_version(&self, id: Uuid) -> (i32, i32) {
        let row = self
            .db
            .query_one_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT stock, version FROM inventories WHERE id = $1",
                [id.into()],
            ))
            .await
            .expect("query")
            .expect("row");
        (row.try_get_by_index(0).expect("stock"), row.try_get_by_index(1).expect("version"))
    }

    /// A count from the database.
    pub async fn count(&self, sql: &str) -> i64 {
        let row =
            self.db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await.expect("query").expect("row");
        row.try_get_by_index(0).expect("count")
    }

    /// Everything a rejected request must leave untouched, as one string.
    pub async fn snapshot(&self) -> String {
        let sql = "SELECT coalesce(string_agg(concat_ws(':', sku, stock, version), ',' ORDER BY sku), '') \
                   || '|' || (SELECT count(*) FROM reservations) || '|' || (SELECT count(*) FROM stock_movements) \
                   FROM inventories";
        let row =
            self.db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await.expect("query").expect("row");
        row.try_get_by_index(0).expect("snapshot")
    }

    /// Fails the test when any inventory breaks the DESIGN.md invariant.
    pub async fn assert_invariant(&self) {
        let drifts = invariant::check(&self.db).await.expect("check");
        assert!(drifts.is_empty(), "invariant broken: {drifts:?}");
    }
}

/// The reserve mutation with every union member spelled out.
pub const RESERVE: &str = r#"
mutation($input: ReserveInput!) {
  reserve(input: $input) {
    __typename
    ... on Reserved { reservation { id quantity status userId } inventory { id stock version } }
    ... on Conflict { expectedVersion inventory { id stock version } }
    ... on SoldOut { requested inventory { id stock version } }
    ... on InventoryNotFound { inventoryId }
  }
}"#;

/// The `extensions.code` of the first error of a response.
pub fn error_code(body: &Value) -> Option<&str> {
    body["errors"][0]["extensions"]["code"].as_str()
}

impl Drop for TestApp {
    /// Drops the test's database, so runs leave nothing behind. `FORCE` ends
    /// the server's connections, which die with the test anyway.
    fn drop(&mut self) {
        let Some((server, name)) = self.database_url.rsplit_once('/').map(|(s, n)| (s.to_owned(), n.to_owned())) else {
            return;
        };
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(async {
                let admin = sea_orm::Database::connect(format!("{server}/postgres")).await.ok()?;
                admin.execute_unprepared(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await.ok()?;
                admin.close().await.ok()
            })
        });
        let _ = dropped.join();
    }
}
