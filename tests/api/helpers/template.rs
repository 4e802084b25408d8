//! The tests' databases: each a copy of one migrated template per
//! migration set, built once under an advisory lock.

use std::path::Path;

use migration::{Migrator, MigratorTrait};
use sea_orm::sqlx::{self, Connection as _, postgres::PgConnection};
use sha2::{Digest, Sha256};
use stockguard::{config::DatabaseConfig, db};
use uuid::Uuid;

use super::Isolation;

/// The template for this migration set: named after a hash of the
/// migrations' names and of the migration crate's sources, so a template of
/// other (or edited) migrations is never used.
fn template_name() -> String {
    let mut hasher = Sha256::new();
    for migration in Migrator::migrations() {
        hasher.update(migration.name());
        hasher.update(b"\n");
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("migration/src");
    let mut sources: Vec<_> =
        std::fs::read_dir(&dir).expect("the migration sources").map(|entry| entry.expect("entry").path()).collect();
    sources.sort();
    for source in sources {
        hasher.update(source.file_name().expect("a file").as_encoded_bytes());
        hasher.update(std::fs::read(&source).expect("a migration source"));
    }
    format!("sg_template_{}", &hex::encode(hasher.finalize())[..16])
}

async fn admin(server: &str) -> PgConnection {
    PgConnection::connect(&format!("{server}/postgres")).await.expect("connect to the postgres database")
}

async fn exists(admin: &mut PgConnection, name: &str) -> bool {
    let found: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pg_database WHERE datname = $1")
        .bind(name)
        .fetch_optional(admin)
        .await
        .expect("look for a database");
    found.is_some()
}

async fn run(admin: &mut PgConnection, sql: String) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(admin).await.map(drop)
}

/// Creates database `name` on `server` as a copy of the migrated template,
/// defaulting to `isolation`.
pub(super) async fn copy_of_template(server: &str, name: &str, isolation: Isolation) {
    let template = template(server).await;
    let mut admin = admin(server).await;
    // The template takes no connections, so none can be open while it is copied.
    run(&mut admin, format!("CREATE DATABASE \"{name}\" TEMPLATE \"{template}\"")).await.expect("copy the template");
    run(&mut admin, format!("ALTER DATABASE \"{name}\" SET default_transaction_isolation TO '{}'", isolation.sql()))
        .await
        .expect("set the isolation level");
    let _ = admin.close().await;
}

/// The migrated template on `server`, made first if it is not there yet.
///
/// Test processes sharing a server (two CI runs, or tests of one run) take
/// turns on an advisory lock named after the template, and the template gets
/// its name only once it is complete: it is migrated under a name of its own
/// and renamed last, so a half-built one (its builder died) is never used.
/// It accepts no connections, which `CREATE DATABASE ... TEMPLATE` needs.
async fn template(server: &str) -> String {
    let name = template_name();
    let mut admin = admin(server).await;
    if !exists(&mut admin, &name).await {
        let lock = u64::from_str_radix(&name["sg_template_".len()..], 16).map_or(0, |bits| bits as i64);
        sqlx::query("SELECT pg_advisory_lock($1)").bind(lock).execute(&mut admin).await.expect("lock");
        if !exists(&mut admin, &name).await {
            build_template(&mut admin, server, &name).await;
        }
        sqlx::query("SELECT pg_advisory_unlock($1)").bind(lock).execute(&mut admin).await.expect("unlock");
    }
    let _ = admin.close().await;
    name
}

/// Migrates a new database and renames it `name`; it is dropped again if
/// anything fails before (it is this run's own).
async fn build_template(admin: &mut PgConnection, server: &str, name: &str) {
    let building = format!("{name}_build_{}", &Uuid::new_v4().simple().to_string()[..8]);
    match run(admin, format!("CREATE DATABASE \"{building}\"")).await {
        Ok(()) => {}
        Err(err) => panic!("create {building}: {err}"),
    }
    let url = format!("{server}/{building}");
    let config = DatabaseConfig { database_url: Some(url.clone()), pool_size: 2, ..DatabaseConfig::default() };
    let migrated = async {
        let db = db::connect(&url, &config).await?;
        let result = db::migrate(&db).await;
        db.close().await?;
        result
    }
    .await;
    let finished = match migrated {
        Ok(()) => {
            let sealed =
                run(admin, format!("ALTER DATABASE \"{building}\" WITH ALLOW_CONNECTIONS false IS_TEMPLATE true"));
            match sealed.await {
                Ok(()) => run(admin, format!("ALTER DATABASE \"{building}\" RENAME TO \"{name}\"")).await,
                Err(err) => Err(err),
            }
        }
        Err(err) => panic_after_drop(admin, &building, &format!("migrate the template: {err}")).await,
    };
    if let Err(err) = finished {
        panic_after_drop(admin, &building, &format!("seal the template: {err}")).await;
    }
}

/// Drops this run's half-built template `building`, then fails with `why`.
async fn panic_after_drop(admin: &mut PgConnection, building: &str, why: &str) -> ! {
    let _ = run(admin, format!("ALTER DATABASE \"{building}\" WITH IS_TEMPLATE false")).await;
    let _ = run(admin, format!("DROP DATABASE IF EXISTS \"{building}\" WITH (FORCE)")).await;
    panic!("{why}");
}
