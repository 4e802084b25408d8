//! The PostgreSQL the tests and examples make their databases on, found as
//! the server finds its own, and throw-away databases on it.

use std::{path::Path, sync::OnceLock, time::Duration};

use anyhow::Context as _;
use sea_orm::sqlx::{self, Connection as _, postgres::PgConnection};
use stockguard::{db::local, embedded::EmbeddedPostgres};
use uuid::Uuid;

/// The port of the tests' private PostgreSQL, beside the server's 54329.
const TEST_PORT: u16 = 54339;

/// The PostgreSQL server the tests (the integration tests and the library's
/// own) and the examples create their databases on:
/// `STOCKGUARD_TEST_DATABASE_URL` if set; else the server on 127.0.0.1:5432
/// if it lets `postgres` in without a password and is a release Stockguard
/// runs on (decided as the server decides, by `stockguard::db::local::probe`);
/// else a private cluster in `target/test-postgres` from the installed
/// binaries, as the server itself does without a database, started by the
/// first test that needs it and left running for the next run (`pg_ctl -D
/// target/test-postgres stop` stops it; as root it may live elsewhere, see
/// [`EmbeddedPostgres::new`]), with one line on stderr saying why and where.
/// Panics with one line saying what is missing. Found once per process.
pub fn server_url() -> String {
    try_server_url().unwrap_or_else(|missing| panic!("{missing}"))
}

/// `given` (an example's `--database-url-base`), else the server the tests
/// use ([`server_url`]), else the line that says what is missing.
pub fn given_or_found(given: Option<&str>) -> anyhow::Result<String> {
    given.map(str::to_owned).map_or_else(|| try_server_url().map_err(anyhow::Error::msg), Ok)
}

/// [`server_url`], or the line that says what is missing.
fn try_server_url() -> Result<String, String> {
    static FOUND: OnceLock<Result<String, String>> = OnceLock::new();
    FOUND.get_or_init(find_server).clone()
}

fn find_server() -> Result<String, String> {
    if let Ok(url) = std::env::var("STOCKGUARD_TEST_DATABASE_URL") {
        return Ok(url);
    }
    let data_dir = crate::workspace().join("target/test-postgres");
    // Its own thread and runtime: the tests ask from inside theirs, and
    // probing and starting the cluster await.
    let found = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        runtime.block_on(async {
            match local::probe(local::USUAL_ADDR).await {
                Ok(_) => Ok(format!("postgres://postgres@{}", local::USUAL_ADDR)),
                Err(why) => start_private(&data_dir, &why).await,
            }
        })
    });
    found.join().unwrap_or_else(|_| Err("the thread that finds the tests' PostgreSQL panicked".into()))
}

/// Starts (or finds running) the tests' private cluster in `data_dir`,
/// the local server being unusable for the reason `why`.
async fn start_private(data_dir: &Path, why: &local::Unusable) -> Result<String, String> {
    let usual = local::USUAL_ADDR;
    let cluster = EmbeddedPostgres::new(data_dir, TEST_PORT).map_err(|err| {
        format!(
            "no PostgreSQL for the tests: STOCKGUARD_TEST_DATABASE_URL is not set, the PostgreSQL on {usual} cannot \
             be used ({why}), and the tests' private one cannot be made: {err}"
        )
    })?;
    eprintln!(
        "the PostgreSQL on {usual} cannot be used ({why}): the tests' private PostgreSQL is {} on port {TEST_PORT}",
        cluster.data_dir().display()
    );
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
