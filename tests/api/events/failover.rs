//! The primary moves (its host stops, the other host takes writes): the
//! events follow the server there, without a restart.

use std::time::Duration;

use stockguard::{config::DatabaseConfig, db};

use super::*;
use crate::faults::restart::PrivateCluster;

/// Whether `receiver` has been sent a `STOCK_CHANGED` of `inventory`.
fn sent_a_change_of(receiver: &Receiver, inventory: Uuid) -> bool {
    stock_changes(&receiver.accepted_events()).iter().any(|&(changed, _)| changed == inventory)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_events_follow_the_primary_to_its_new_host() {
    // Two hosts with the same schema, as a primary and its standby hold;
    // the server's URL names both, the first first.
    let (first, second) = (PrivateCluster::start().await, PrivateCluster::start().await);
    let name = format!("sg_test_{}", Uuid::new_v4().simple());
    for cluster in [&first, &second] {
        let url = format!("{}/{name}", cluster.server_url());
        db::ensure_database(&url).await.expect("create the database");
        let config = DatabaseConfig { database_url: Some(url.clone()), ..DatabaseConfig::default() };
        let conn = db::connect(&url, &config).await.expect("connect");
        db::migrate(&conn).await.expect("migrate");
        conn.close().await.expect("close");
    }
    let both = format!("postgres://postgres@{},{}", first.host(), second.host());
    let app = TestApp::spawn_with_options(Options {
        server_url: Some(both),
        database: Some(name),
        limits: limits(&[0.2]),
        pool_size: 6,
        acquire_timeout_ms: 2_000,
        statement_timeout_ms: 5_000,
        ..Options::default()
    })
    .await;
    let receiver = Receiver::start().await;
    let alice = app.token("alice", Role::Customer);

    // On the first host: an endpoint, a reservation, its event sent.
    subscribe(&app, &receiver).await;
    let before = app.create_inventory("FOLLOW-1", 10).await;
    app.reserve(&alice, json!({ "inventoryId": before })).await;
    eventually(Duration::from_secs(20), "the first host's change is sent", || async {
        sent_a_change_of(&receiver, before)
    })
    .await;

    // The first host stops; the server moves to the second, where an
    // endpoint is made again (its data is its own here, where a standby's
    // would be the primary's).
    first.stop().await;
    eventually(Duration::from_secs(30), "the server writes to the second host", || async {
        create_endpoint(&app, &receiver).await["secret"].is_string()
    })
    .await;
    let after = app.create_inventory("FOLLOW-2", 10).await;
    let reserved = app.reserve(&alice, json!({ "inventoryId": after })).await;
    assert_eq!(reserved["__typename"], "Reserved", "{reserved}");
    eventually(Duration::from_secs(20), "the second host's change is sent", || async {
        sent_a_change_of(&receiver, after)
    })
    .await;
}
