//! The PostgreSQL the tests and examples make their databases on, and
//! throw-away databases on it.

use std::{path::Path, sync::OnceLock, time::Duration};

use anyhow::Context as _;
use sea_orm::sqlx::{self, Connection as _, postgres::PgConnection};
use stockguard::embedded::{EmbeddedError, EmbeddedPostgres};
use uuid::Uuid;

/// The port of the tests' private PostgreSQL, beside the server's 54329.
const TEST_PORT: u16 = 54339;

/// The PostgreSQL server the tests (the integration tests and the library's
/// own) create their databases on: `STOCKGUARD_TEST_DATABASE_URL` if set;
/// else the server on 127.0.0.1:5432 if one listens; else a private cluster
/// in `target/test-postgres` from the installed binaries, as the server
/// itself does without a database, started by the first test that needs it
/// and left running for the next run (`pg_ctl -D target/test-postgres stop`
/// stops it; as root it may live elsewhere, see [`EmbeddedPostgres::new`]).
/// Panics with one line saying what is missing. Found once per process.
pub fn server_url() -> String {
    static FOUND: OnceLock<Result<String, String>> = OnceLock::new();
    FOUND.get_or_init(find_server).clone().unwrap_or_else(|missing| panic!("{missing}"))
}

fn find_server() -> Result<String, String> {
    if let Ok(url) = std::env::var("STOCKGUARD_TEST_DATABASE_URL") {
        return Ok(url);
    }
    let local: std::net::SocketAddr = ([127, 0, 0, 1], 5432).into();
    if std::net::TcpStream::connect_timeout(&local, Duration::from_millis(500)).is_ok() {
        return Ok("postgres://postgres@127.0.0.1:5432".to_owned());
    }
    let data_dir = crate::workspace().join("target/test-postgres");
    // Its own thread and runtime: the tests ask from inside theirs, and
    // starting the cluster awaits its tools.
    let started = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        runtime.block_on(start_private(&data_dir))
    });
    started.join().unwrap_or_else(|_| Err("the thread that starts the tests' PostgreSQL panicked".into()))
}

/// Starts (or finds running) the tests' private cluster in `data_dir`.
async fn start_private(data_dir: &Path) -> Result<String, String> {
    let cluster = EmbeddedPostgres::new(data_dir, TEST_PORT).map_err(|err| match err {
        EmbeddedError::NoBinaries => "no PostgreSQL for the tests: nothing listens on 127.0.0.1:5432, \
             STOCKGUARD_TEST_DATABASE_URL is not set, and no PostgreSQL binaries are installed \
             (Debian/Ubuntu: `apt-get install postgresql`)"
            .to_owned(),
        other => other.to_string(),
    })?;
    eprintln!("the tests' private PostgreSQL: {} on port {TEST_PORT}", cluster.data_dir().display());
    // Another test process may be starting the same cluster: then it runs soon.
    let url = format!("postgres://postgres@127.0.0.1:{TEST_PORT}");
    let mut last = String::new();
    for _ in 0..60 {
        match cluster.start().await {
            Ok(_) => return Ok(url),
            Err(err) => last = err.to_string(),
        }
        if cluster.is_running().await {
            return Ok(url);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(format!("the tests' private PostgreSQL ({}) did not start: {last}", cluster.data_dir().display()))
}

/// A fresh database on a PostgreSQL server, dropped by [`ThrowAway::drop`].
pub struct ThrowAway {
    /// The server's URL without a database name.
    base: String,
    /// `sg_<purpose>_<random>`.
    pub name: String,
    /// The database's URL.
    pub url: String,
}

impl ThrowAway {
    /// Creates `sg_<purpose>_<random>` on the server at `base` (a URL without
    /// a database name).
    pub async fn create(base: &str, purpose: &str) -> anyhow::Result<Self> {
        let base = base.trim_end_matches('/').to_owned();
        let name = format!("sg_{purpose}_{}", &Uuid::new_v4().simple().to_string()[..12]);
        let url = format!("{base}/{name}");
        stockguard::db::ensure_database(&url).await.with_context(|| format!("cannot create {url}"))?;
        Ok(Self { base, name, url })
    }

    /// Drops the database, ending its connections; a failure is only reported.
    pub async fn drop(self, purpose: &str) {
        if let Err(err) = drop_on(&self.base, &self.name).await {
            eprintln!("{purpose}: could not drop {}: {err:#}", self.name);
        }
    }
}

/// A connection to the `postgres` database of the server at `base`.
pub async fn admin(base: &str) -> anyhow::Result<PgConnection> {
    PgConnection::connect(&format!("{base}/postgres"))
        .await
        .with_context(|| format!("cannot connect to {base}/postgres"))
}

/// Drops database `name` on the server at `base`, ending its connections.
async fn drop_on(base: &str, name: &str) -> anyhow::Result<()> {
    let mut conn = admin(base).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(())
}

/// Drops the database at `url` (one the caller made), from a thread of its
/// own so it works inside and outside a runtime, as a `Drop` needs; a
/// failure is ignored.
pub fn drop_database(url: &str) {
    let Some((base, name)) = url.rsplit_once('/').map(|(s, n)| (s.to_owned(), n.to_owned())) else {
        return;
    };
    let dropped = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        runtime.block_on(drop_on(&base, &name)).ok()
    });
    let _ = dropped.join();
}
