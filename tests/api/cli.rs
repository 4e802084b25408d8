//! The binary's commands, run as a user would, and the private PostgreSQL.

use std::process::Command;

use sea_orm::ConnectionTrait;
use serde_json::json;
use stockguard::embedded::EmbeddedPostgres;
use uuid::Uuid;

use crate::helpers::{SECRET, TestApp};

fn stockguard(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_stockguard"))
        .args(args)
        .env_remove("DATABASE_URL")
        .output()
        .expect("run stockguard")
}

#[test]
fn stockguard_schema_prints_the_committed_schema() {
    let output = stockguard(&["schema"]);
    assert!(output.status.success());
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/schema.graphql")).expect("schema.graphql");
    assert!(String::from_utf8_lossy(&output.stdout) == committed, "`stockguard schema` differs from schema.graphql");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_from_stockguard_token_is_accepted_by_the_server() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("CLI-1", 2).await;
    let output = stockguard(&["token", "--sub", "carol", "--role", "customer", "--jwt-secret", SECRET]);
    assert!(output.status.success());
    let token = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let reserved = app.reserve(&token, json!({ "inventoryId": id })).await;
    assert_eq!(reserved["reservation"]["userId"], "carol", "{reserved}");
}

#[tokio::test(flavor = "multi_thread")]
async fn stockguard_check_passes_a_sound_database_and_reports_drift() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("CHECK-1", 4).await;
    app.reserve(&app.token("alice", stockguard::auth::Role::Customer), json!({ "inventoryId": id })).await;
    let check = || stockguard(&["check", "--database-url", &app.database_url]);
    let sound = check();
    assert!(sound.status.success(), "{}", String::from_utf8_lossy(&sound.stdout));

    // A reservation holding a unit that was never taken is drift.
    app.db
        .execute_unprepared(&format!("UPDATE reservations SET quantity = quantity + 1 WHERE inventory_id = '{id}'"))
        .await
        .expect("tamper");
    let drifted = check();
    assert_eq!(drifted.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&drifted.stdout).contains("DRIFT CHECK-1"));
}

#[tokio::test(flavor = "multi_thread")]
async fn stockguard_seed_that_fails_prints_the_cause_not_internal_error() {
    let app = TestApp::spawn().await;
    // A database that refuses new inventories for a reason of its own: to a
    // client that is only INTERNAL, but the operator must read the reason.
    app.db
        .execute_unprepared(
            "CREATE FUNCTION refuse_inventories() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'this database takes no new inventories'; END $$;
             CREATE TRIGGER refuse_inventories BEFORE INSERT ON inventories
                FOR EACH ROW EXECUTE FUNCTION refuse_inventories();",
        )
        .await
        .expect("a trigger that refuses inventories");
    let output = stockguard(&["seed", "--database-url", &app.database_url]);
    let said = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(said.contains("this database takes no new inventories"), "the cause is printed: {said}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_private_postgres_starts_in_its_own_folder_and_stops() {
    let dir = std::env::temp_dir().join(format!("stockguard-embedded-{}", Uuid::new_v4().simple()));
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
        probe.local_addr().expect("addr").port()
    };
    let cluster = EmbeddedPostgres::new(&dir, port).expect("PostgreSQL binaries are installed");
    assert!(cluster.start().await.expect("start"), "this call started it");
    assert!(!cluster.start().await.expect("start again"), "a running cluster is reused");

    let url = cluster.url("embedded_check");
    stockguard::db::ensure_database(&url).await.expect("create a database in it");
    let output = stockguard(&["migrate", "--database-url", &url]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));

    cluster.stop().await.expect("stop");
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "stopped clusters do not listen");
    let _ = std::fs::remove_dir_all(&dir);
}
