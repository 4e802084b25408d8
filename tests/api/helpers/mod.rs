//! `TestApp`: a real server on port 0 against a database of its own, copied
//! from one migrated template (`template.rs`), built by the same
//! `Application::build` as `stockguard serve`; a method per mutation, all
//! through the support crate's [`post`]; reads straight from the database;
//! and (`answers.rs`) reading answers and the waits that assert what they
//! wait for.

mod answers;
mod template;

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
    auth::{Keys, Role},
    config::{DEFAULT_MAX_TOKEN_TTL_SECS, DatabaseConfig, Limits},
    db, invariant,
    schema::AppSchema,
    server::Server,
    startup::{Application, Database, Settings},
};
use uuid::Uuid;

pub use self::answers::{
    address, at_once, count, error_code, eventually, metric, named, names, order_lines, plan_nodes, retried, sweep_all,
    uuid,
};
use self::template::copy_of_template;
pub use crate::documents::RESERVE;
use crate::documents::{
    CANCEL_ORDER, CHANGE_ADDRESS, CHANGE_QUANTITY, CHECKOUT, CONFIRM_ORDER, EXTEND, FULFILL_ORDER, PLACE_ORDER,
    RELEASE, RESERVE_MANY, RESTOCK, RETURN_ORDER, STOCK_STATES,
};

use stockguard_support::client;
pub use stockguard_support::{
    client::{Reply, post, request},
    database::{drop_database, server_url},
};

/// The secret every test server signs with.
pub const SECRET: &str = "stockguard-test-secret-of-32-bytes-or-more";

/// PostgreSQL's default isolation for a test database.
#[derive(Debug, Clone, Copy)]
pub enum Isolation {
    ReadCommitted,
    RepeatableRead,
    Serializable,
}

impl Isolation {
    /// The level as `SET default_transaction_isolation` spells it.
    pub fn sql(self) -> &'static str {
        match self {
            Self::ReadCommitted => "read committed",
            Self::RepeatableRead => "repeatable read",
            Self::Serializable => "serializable",
        }
    }
}

/// One test per isolation level for each `scenario(isolation)`: a module
/// named after the scenario holding `at_read_committed`,
/// `at_repeatable_read` and `at_serializable`. With `=> |isolation| ...` the
/// scenario is any expression of the level.
macro_rules! at_every_isolation {
    ($($name:ident $(=> $scenario:expr)?;)+) => {$(
        mod $name {
            use super::*;
            use crate::helpers::Isolation;

            #[tokio::test(flavor = "multi_thread")]
            async fn at_read_committed() {
                crate::helpers::at_every_isolation!(@run $name $(, $scenario)?)(Isolation::ReadCommitted).await;
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn at_repeatable_read() {
                crate::helpers::at_every_isolation!(@run $name $(, $scenario)?)(Isolation::RepeatableRead).await;
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn at_serializable() {
                crate::helpers::at_every_isolation!(@run $name $(, $scenario)?)(Isolation::Serializable).await;
            }
        }
    )+};
    (@run $name:ident) => { $name };
    (@run $name:ident, $scenario:expr) => { $scenario };
}
pub(crate) use at_every_isolation;

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
    /// A database of the test's own on that server (its name) to serve
    /// instead of a fresh copy of the template, e.g. one migrated step by
    /// step from an older schema; dropped with the app like a copy, its
    /// isolation left as it is.
    pub database: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            isolation: Isolation::ReadCommitted,
            limits: Limits::default(),
            server_url: None,
            // Each test server holds its pool and a statement pool of this
            // size: two tests side by side, beside the tests' own child
            // processes, must stay under PostgreSQL's 100 connections.
            pool_size: 6,
            // Generous: tests assert outcomes, not timing, on a busy 2-core machine.
            acquire_timeout_ms: 30_000,
            statement_timeout_ms: 30_000,
            database: None,
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
    /// The server's parts, to look into (e.g. a request's data).
    pub server: Server,
    /// Statements the server's pool has run.
    pub statements: Arc<AtomicUsize>,
    /// The database's URL.
    pub database_url: String,
    /// Mints the tests' tokens with the server's secret.
    keys: Keys,
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

    /// A server whose sweeper stays out of the way, for tests that expire
    /// reservations and sweep by hand (or must see them unswept).
    pub async fn without_sweeper(isolation: Isolation) -> Self {
        Self::spawn_configured(isolation, Limits { sweep_interval_ms: 3_600_000, ..Limits::default() }).await
    }

    /// A server with every knob the tests turn.
    pub async fn spawn_with_options(options: Options) -> Self {
        let Options {
            isolation,
            mut limits,
            server_url: server,
            pool_size,
            acquire_timeout_ms,
            statement_timeout_ms,
            database,
        } = options;
        let server = server.unwrap_or_else(server_url);
        // As generous as the test client: tests assert outcomes, not timing
        // (the attack tests, on their own process, test the timeout itself).
        limits.request_timeout_ms = limits.request_timeout_ms.max(120_000);
        let name = match database {
            Some(name) => name,
            None => {
                let name = format!("sg_test_{}", Uuid::new_v4().simple());
                copy_of_template(&server, &name, isolation).await;
                name
            }
        };
        let database_url = format!("{server}/{name}");
        let config = DatabaseConfig {
            database_url: Some(database_url.clone()),
            pool_size,
            acquire_timeout_ms,
            statement_timeout_ms,
            ..DatabaseConfig::default()
        };
        let checks =
            DatabaseConfig { pool_size: 2, acquire_timeout_ms: 30_000, statement_timeout_ms: 30_000, ..config.clone() };
        let direct = db::connect(&database_url, &checks).await.expect("connect for checks");
        // The server is built as `stockguard serve` builds it, on a pool
        // whose statements the test counts.
        let mut database = Database::open(&config).await.expect("open the test's database");
        let statements = Arc::new(AtomicUsize::new(0));
        let counter = statements.clone();
        database.conn.set_metric_callback(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        let keys = Keys::new(SECRET.as_bytes(), DEFAULT_MAX_TOKEN_TTL_SECS).expect("a long enough secret");
        let settings =
            Settings { addr: ([127, 0, 0, 1], 0).into(), limits, keys: keys.clone(), dev_tokens: None, seed: false };
        let application = Application::build(settings, database).await.expect("build the server");
        let address = format!("http://{}", application.address());
        let server = application.server().clone();
        let schema = server.schema();
        tokio::spawn(application.run_until_stopped(std::future::pending()));

        let client = reqwest::Client::builder().timeout(Duration::from_secs(120)).build().expect("client");
        Self { address, client, db: direct, schema, server, statements, database_url, keys }
    }

    /// A token for `sub` with `role`.
    pub fn token(&self, sub: &str, role: Role) -> String {
        self.keys.mint(sub, role, chrono::Duration::minutes(10)).expect("mint")
    }

    /// An operator's token.
    pub fn operator(&self) -> String {
        self.token("operator", Role::Operator)
    }

    // ---------- GraphQL over HTTP ----------

    /// POSTs `body` to `/graphql` with the server's client (see [`post`]).
    pub async fn post(
        &self,
        authorization: Option<&str>,
        body: impl Into<reqwest::Body>,
    ) -> Result<Reply, reqwest::Error> {
        post(&self.client, &self.address, authorization, body).await
    }

    /// POSTs a GraphQL request and returns the JSON body.
    pub async fn graphql(&self, token: Option<&str>, query: &str, variables: Value) -> Value {
        let bearer = token.map(|token| format!("Bearer {token}"));
        let reply = self.post(bearer.as_deref(), request(query, variables)).await.expect("send");
        assert_eq!(reply.status, 200, "GraphQL answers 200");
        serde_json::from_slice(&reply.body).expect("JSON body")
    }

    /// Runs a mutation of `field` as `token`: `data.<field>` when it was
    /// answered, or the whole body when it has errors.
    pub async fn mutate(&self, token: &str, field: &str, query: &str, variables: Value) -> Value {
        let body = self.graphql(Some(token), query, variables).await;
        if body.get("errors").is_some() { body } else { body["data"][field].clone() }
    }

    /// Creates an inventory as operator and returns its id.
    pub async fn create_inventory(&self, sku: &str, stock: i32) -> Uuid {
        let (name, operator) = (format!("Item {sku}"), self.operator());
        let created = client::create_inventory(&self.client, &self.address, &operator, sku, &name, stock.into());
        created.await.unwrap_or_else(|err| panic!("{err:#}"))
    }

    /// `reserve` with `input`.
    pub async fn reserve(&self, token: &str, input: Value) -> Value {
        self.mutate(token, "reserve", RESERVE, json!({ "input": input })).await
    }

    /// `reserveMany` of `items`.
    pub async fn reserve_many(&self, token: &str, items: Value) -> Value {
        self.mutate(token, "reserveMany", RESERVE_MANY, json!({ "input": { "items": items } })).await
    }

    /// `releaseReservation`.
    pub async fn release(&self, token: &str, id: impl std::fmt::Display) -> Value {
        self.mutate(token, "releaseReservation", RELEASE, json!({ "id": id.to_string() })).await
    }

    /// `extendReservation` by `seconds`.
    pub async fn extend(&self, token: &str, id: impl std::fmt::Display, seconds: i32) -> Value {
        self.mutate(token, "extendReservation", EXTEND, json!({ "id": id.to_string(), "s": seconds })).await
    }

    /// `restock` with `input`, as `token`.
    pub async fn restock(&self, token: &str, input: Value) -> Value {
        self.mutate(token, "restock", RESTOCK, json!({ "input": input })).await
    }

    /// `placeOrder` with `input`.
    pub async fn place_order(&self, token: &str, input: Value) -> Value {
        self.mutate(token, "placeOrder", PLACE_ORDER, json!({ "input": input })).await
    }

    /// `confirmOrder`.
    pub async fn confirm(&self, token: &str, id: Uuid) -> Value {
        self.mutate(token, "confirmOrder", CONFIRM_ORDER, json!({ "id": id })).await
    }

    /// `cancelOrder`.
    pub async fn cancel(&self, token: &str, id: Uuid) -> Value {
        self.mutate(token, "cancelOrder", CANCEL_ORDER, json!({ "id": id })).await
    }

    /// `changeShippingAddress` of order `id`, seen at `expected_version`, to `to`.
    pub async fn change_address(&self, token: &str, id: Uuid, expected_version: i32, to: &Value) -> Value {
        let input = json!({ "orderId": id, "expectedVersion": expected_version, "shippingAddress": to });
        self.mutate(token, "changeShippingAddress", CHANGE_ADDRESS, json!({ "input": input })).await
    }

    /// `checkout` with `input`.
    pub async fn checkout(&self, token: &str, input: Value) -> Value {
        self.mutate(token, "checkout", CHECKOUT, json!({ "input": input })).await
    }

    /// `changeReservationQuantity` of reservation `id` to `quantity`.
    pub async fn change_quantity(&self, token: &str, id: impl std::fmt::Display, quantity: i32) -> Value {
        let input = json!({ "reservationId": id.to_string(), "quantity": quantity });
        self.mutate(token, "changeReservationQuantity", CHANGE_QUANTITY, json!({ "input": input })).await
    }

    /// `fulfillOrder`.
    pub async fn fulfill(&self, token: &str, id: Uuid) -> Value {
        self.mutate(token, "fulfillOrder", FULFILL_ORDER, json!({ "id": id })).await
    }

    /// `returnOrder` with `input`, as `token`.
    pub async fn return_order(&self, token: &str, input: Value) -> Value {
        self.mutate(token, "returnOrder", RETURN_ORDER, json!({ "input": input })).await
    }

    /// The inventory's `stock`, `version` and stock states through the API:
    /// `[available, reserved, committed, onHand]`.
    pub async fn states(&self, id: Uuid) -> [i64; 4] {
        let body = self.graphql(None, STOCK_STATES, json!({ "id": id })).await;
        let inventory = &body["data"]["inventory"];
        let state = |name: &str| inventory[name].as_i64().unwrap_or_else(|| panic!("{name} in {body}"));
        [state("available"), state("reserved"), state("committed"), state("onHand")]
    }

    // ---------- straight from the database ----------

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
    /// Like [`Self::assert_invariant`], it reads again past connections a
    /// test terminated.
    pub async fn count(&self, sql: &str) -> i64 {
        let mut read = self.db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await;
        for _ in 0..32 {
            match &read {
                Err(err) if stockguard::db::classify(err) == stockguard::db::DbFailure::Unavailable => {
                    read = self.db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await;
                }
                _ => break,
            }
        }
        read.expect("query").expect("row").try_get_by_index(0).expect("count")
    }

    /// The rows of `sql`, as JSON objects (column name → value), in no promised
    /// order: callers that compare lists sort them.
    pub async fn rows(&self, sql: &str) -> Vec<Value> {
        let wrapped = format!("SELECT coalesce(json_agg(t), '[]'::json)::text FROM ({sql}) t");
        let row = self
            .db
            .query_one_raw(Statement::from_string(DbBackend::Postgres, wrapped))
            .await
            .expect("query")
            .expect("one row");
        let text: String = row.try_get_by_index(0).expect("json text");
        match serde_json::from_str(&text).expect("json") {
            Value::Array(rows) => rows,
            other => panic!("not an array: {other}"),
        }
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

    /// Fails the test when any inventory breaks the docs/design.md invariant.
    ///
    /// A test that terminated the database's backends leaves dead
    /// connections in the pool; a check that meets one (an outage, to the
    /// server) runs again on the next, at most once per pooled connection.
    pub async fn assert_invariant(&self) {
        let mut checked = invariant::check(&self.db).await;
        for _ in 0..32 {
            match &checked {
                Err(invariant::CheckError::Database(err))
                    if stockguard::db::classify(err) == stockguard::db::DbFailure::Unavailable =>
                {
                    checked = invariant::check(&self.db).await;
                }
                _ => break,
            }
        }
        let drifts = checked.expect("check");
        assert!(drifts.is_empty(), "invariant broken: {drifts:?}");
    }

    /// Waits (10 s at most) until a statement of this test's database whose
    /// text starts with `prefix` waits for a lock, and fails the test if none does.
    pub async fn until_waiting_for_a_lock(&self, prefix: &str) {
        let sql = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND ltrim(query, E' \\t\\r\\n') LIKE '{}%'",
            prefix.replace('\'', "''")
        );
        eventually(Duration::from_secs(10), &format!("a statement {prefix:?}... waits for a lock"), || async {
            self.count(&sql).await > 0
        })
        .await;
    }
}

impl Drop for TestApp {
    /// Drops the test's database, so runs leave nothing behind. `FORCE` ends
    /// the server's connections, which die with the test anyway.
    fn drop(&mut self) {
        drop_database(&self.database_url);
    }
}

/// A database of its own, migrated up to just before one migration, for a
/// test to write as the `main` of before wrote it and then migrate the rest
/// of the way; dropped on drop until handed to a test app.
pub struct BeforeMigration {
    pub name: String,
    pub db: DatabaseConnection,
    /// Its URL while this drops it.
    dropped: Option<String>,
}

impl BeforeMigration {
    /// A new database with every migration before `migration` applied.
    pub async fn new(migration: &str) -> Self {
        use migration::{Migrator, MigratorTrait};
        let server = server_url();
        let name = format!("sg_test_{}", Uuid::new_v4().simple());
        let admin = sea_orm::Database::connect(format!("{server}/postgres")).await.expect("connect");
        admin.execute_unprepared(&format!("CREATE DATABASE \"{name}\"")).await.expect("create the database");
        admin.close().await.expect("close");
        let url = format!("{server}/{name}");
        let db = sea_orm::Database::connect(&url).await.expect("connect");
        let this = Self { name, db, dropped: Some(url) };
        let before = Migrator::migrations().iter().position(|m| m.name() == migration).expect("the migration");
        Migrator::up(&this.db, Some(before as u32)).await.expect("the migrations before");
        this
    }

    /// Applies the rest of the migrations.
    pub async fn migrate(&self) {
        use migration::{Migrator, MigratorTrait};
        Migrator::up(&self.db, None).await.expect("the migrations from there on");
    }

    /// Closes its connections and hands it over to a test app, which drops
    /// it when it goes; its name.
    pub async fn hand_over(mut self) -> String {
        self.db.clone().close().await.expect("close");
        self.dropped = None;
        std::mem::take(&mut self.name)
    }
}

impl Drop for BeforeMigration {
    fn drop(&mut self) {
        if let Some(url) = &self.dropped {
            drop_database(url);
        }
    }
}
