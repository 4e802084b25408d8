//! The first run on a machine whose own PostgreSQL cannot be used: a server
//! that asks for a password (as a distribution's package leaves it) is
//! passed over for a private cluster, which the server opens, migrates,
//! serves from and stops. A second private cluster plays the machine's
//! server, so the shared one on 5432 is never touched.

use std::{net::SocketAddr, time::Duration};

use sea_orm::{ConnectionTrait, DbBackend, Statement};
use serde_json::json;
use stockguard::{
    auth::{Keys, Role},
    config::{DEFAULT_MAX_TOKEN_TTL_SECS, DatabaseConfig, Limits},
    db::local::{self, Unusable},
    startup::{Application, Database, Settings},
};
use stockguard_support::formation::Formation;

use crate::{
    documents::INVENTORIES,
    faults::restart::PrivateCluster,
    helpers::{SECRET, eventually, post, request},
};

/// The `pg_hba.conf` of a server as `apt-get install postgresql` sets it up:
/// over TCP every role needs its password.
const PASSWORD_OVER_TCP: &str = "local all all trust\n\
                                 host all all 127.0.0.1/32 scram-sha-256\n\
                                 host all all ::1/128 scram-sha-256\n";

#[tokio::test(flavor = "multi_thread")]
async fn a_local_server_that_asks_for_a_password_is_passed_over_for_a_private_cluster() {
    // The machine's server: postgres has a password and must give it.
    let machine = PrivateCluster::start().await;
    let machine_addr: SocketAddr = ([127, 0, 0, 1], machine.port()).into();
    let admin = sea_orm::Database::connect(format!("{}/postgres", machine.server_url())).await.expect("connect");
    admin.execute_unprepared("ALTER ROLE postgres PASSWORD 'only-the-owner-knows'").await.expect("a password");
    std::fs::write(machine.data_dir().join("pg_hba.conf"), PASSWORD_OVER_TCP).expect("pg_hba.conf");
    admin.execute_unprepared("SELECT pg_reload_conf()").await.expect("reload");
    admin.close().await.expect("close");
    eventually(Duration::from_secs(10), "the machine's server asks for a password", || async move {
        local::probe(machine_addr).await.is_err()
    })
    .await;
    match local::probe(machine_addr).await {
        Err(Unusable::Refused(why)) => assert!(why.contains("password"), "refused for its password: {why}"),
        other => panic!("refused for its password, not {other:?}"),
    }

    // The server's own way in, told to look there and to start its cluster
    // in a folder and on a port of the test's.
    let private = PrivateCluster::unstarted();
    let config = DatabaseConfig { database_url: None, data_dir: private.data_dir().to_owned(), ..Default::default() };
    let database = Database::open_with(&config, machine_addr, private.port()).await.expect("open a private cluster");
    assert!(private.is_running().await, "the private cluster runs");
    let port = database
        .conn
        .query_one_raw(Statement::from_string(DbBackend::Postgres, "SELECT current_setting('port') AS port"))
        .await
        .expect("ask the port")
        .expect("a row")
        .try_get::<String>("", "port")
        .expect("the port");
    assert_eq!(port, private.port().to_string(), "the pool is on the private cluster, not the machine's");

    let keys = Keys::new(SECRET.as_bytes(), DEFAULT_MAX_TOKEN_TTL_SECS).expect("a long enough secret");
    let token = keys.mint("alice", Role::Customer, chrono::Duration::minutes(5)).expect("mint");
    let settings =
        Settings { addr: ([127, 0, 0, 1], 0).into(), limits: Limits::default(), keys, dev_tokens: None, seed: true };
    let application = Application::build(settings, database).await.expect("build the server");
    let address = format!("http://{}", application.address());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(application.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let client = reqwest::Client::new();
    let reply = post(&client, &address, Some(&format!("Bearer {token}")), request(INVENTORIES, json!({ "f": 5 })))
        .await
        .expect("an answer");
    let body: serde_json::Value = serde_json::from_slice(&reply.body).expect("JSON");
    let seeded = body["data"]["inventories"]["nodes"].as_array().map_or(0, Vec::len);
    assert!(seeded > 0, "the migrated, seeded database serves its demo inventory: {body}");

    stop.send(()).expect("the server waits for its stop");
    serving.await.expect("the server's task").expect("a clean stop");
    assert!(!private.is_running().await, "closing the database stopped the cluster it started");
}

#[test]
fn as_root_the_failover_formation_under_a_closed_folder_lives_where_postgres_can_enter() {
    use std::os::unix::fs::PermissionsExt as _;
    let closed = std::env::temp_dir().join(format!("stockguard-closed-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir(&closed).expect("a folder");
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).expect("chmod 0700");
    let target = closed.join("target");
    let dir = Formation::dir_in(&target);
    let moved = dir.parent().expect("a parent").to_owned();
    if stockguard::embedded::is_root() {
        assert!(moved.starts_with("/var/tmp"), "moved out of the 0700 folder: {}", dir.display());
        let enters = std::process::Command::new("runuser")
            .args(["-u", "postgres", "--", "test", "-x"])
            .arg(&moved)
            .status()
            .expect("runuser");
        assert!(enters.success(), "the postgres account enters {}", moved.display());
        assert_eq!(Formation::dir_in(&target), dir, "the same folder on every run from the same place");
        let _ = std::fs::remove_dir(&moved);
    } else {
        assert_eq!(moved, target.canonicalize().expect("made"), "a user's own folder is used as is");
    }
    let _ = std::fs::remove_dir_all(&closed);
}
