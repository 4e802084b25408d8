//! The pump's read of the ledger stays bounded: it finds a pass's rows
//! through the BRIN index on `txid`, which skips only summarized ranges,
//! and autovacuum summarizes only when it visits (under load, not within a
//! minute). So the pump summarizes the ranges that filled since its last
//! pass itself, and a pass reads only the ranges still filling, however
//! long the ledger has grown.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DbBackend, Statement};
use serde_json::json;
use stockguard::auth::Role;

use super::{Isolation, limits, receiver::Receiver, spawn, subscribe};
use crate::helpers::eventually;

/// Filled ledger ranges of this test's database that no one summarized.
async fn unsummarized(db: &impl ConnectionTrait) -> i64 {
    // Summarizing is the only way to count them: what it summarizes now,
    // the pump had left.
    let sql = stockguard::events::pump::SUMMARIZE_SQL;
    let row = db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await.expect("summarize");
    row.expect("a row").try_get("", "ranges").expect("ranges")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pump_summarizes_the_ledger_ranges_filled_since_its_last_pass() {
    let app = spawn(Isolation::ReadCommitted, limits(&[1.0])).await;
    // No autovacuum of this test's own ledger: only the pump may summarize.
    app.db
        .execute_unprepared(
            "DO $$ DECLARE p regclass; BEGIN
               FOR p IN SELECT inhrelid FROM pg_inherits WHERE inhparent = 'stock_movements'::regclass LOOP
                 EXECUTE format('ALTER TABLE %s SET (autovacuum_enabled = false)', p);
               END LOOP;
             END $$",
        )
        .await
        .expect("autovacuum off");
    // 30,000 ledger rows of an inventory no one reads (several ranges of
    // 128 pages), written before any endpoint exists, so no pass pumps them.
    app.db
        .execute_unprepared(
            "INSERT INTO stock_movements (id, inventory_id, delta, reason, stock_after, version_after)
             SELECT gen_random_uuid(), '00000000-0000-0000-0000-0000000005ca', 1, 'RESTOCKED', g, g
               FROM generate_series(1, 30000) g",
        )
        .await
        .expect("ledger rows");
    let receiver = Receiver::start().await;
    subscribe(&app, &receiver).await;
    // A change after the endpoint, so that passes run and have rows to find.
    let item = app.create_inventory("SCAN-1", 5).await;
    app.reserve(&app.token("scan-user", Role::Customer), json!({ "inventoryId": item, "quantity": 1 })).await;
    eventually(Duration::from_secs(20), "the reservation's events delivered", || async {
        receiver.accepted_events().len() >= 2
    })
    .await;
    assert_eq!(unsummarized(&app.db).await, 0, "every filled range summarized by the pump");
}
