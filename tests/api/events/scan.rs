//! The pump's read of the ledger stays bounded: it finds a pass's rows
//! through the BRIN index on `txid`, which skips only summarized ranges,
//! and autovacuum summarizes only when it visits (under load, not within a
//! minute). So the pump summarizes the ranges that filled since its last
//! pass itself, and a pass reads only the ranges still filling, however
//! long the ledger has grown. And a pass is planned so that the index
//! bounds its read even when the plan was made before the ledger had
//! statistics (the pump's connection keeps its first plan).

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, Statement, TransactionTrait};
use serde_json::{Value, json};
use stockguard::{
    auth::Role,
    events::{self, outbox::step, pump},
};

use super::{Isolation, limits, receiver::Receiver, spawn, subscribe};
use crate::helpers::{eventually, plan_nodes};

/// The ranges of the ledger's BRIN index that no one summarized, in the
/// partition of its newest row: those below the range that holds that row,
/// and that range itself (0 or 1). Summarizing is the only way to count
/// them: what it summarizes now, the pump had left.
async fn unsummarized(db: &impl ConnectionTrait) -> (i64, i64) {
    let sql = "
WITH newest AS (
    SELECT tableoid, (ctid::text::point)[0]::bigint AS block FROM stock_movements ORDER BY txid DESC LIMIT 1
), ledger AS (
    SELECT x.indexrelid AS index, n.block / 16 * 16 AS filling
      FROM newest n JOIN pg_index x ON x.indrelid = n.tableoid
      JOIN pg_inherits h ON h.inhrelid = x.indexrelid AND h.inhparent = 'stock_movements_txid'::regclass
)
SELECT (SELECT coalesce(sum(brin_summarize_range(l.index, b)), 0) FROM generate_series(0, l.filling - 16, 16) b)::bigint AS filled,
       brin_summarize_range(l.index, l.filling)::bigint AS filling
  FROM ledger l";
    let row = db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await.expect("summarize");
    let row = row.expect("a row");
    (row.try_get("", "filled").expect("filled"), row.try_get("", "filling").expect("filling"))
}

/// The snapshot the pump's last pass kept, which every pass moves (its own
/// transaction, which wrote, is in the next pass's snapshot).
async fn pump_snapshot(db: &impl ConnectionTrait) -> String {
    let sql = "SELECT seen::text AS seen FROM event_pump";
    let row = db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await.expect("the pump's row");
    row.expect("a row").try_get("", "seen").expect("its snapshot")
}

/// A test server whose ledger holds 30,000 rows written before its one
/// endpoint (at `receiver`) existed, with autovacuum off for the ledger (so
/// only the pump summarizes it, and nothing analyzes it), and one
/// reservation after, whose events have been delivered.
async fn a_long_ledger_then_a_change() -> (std::sync::Arc<crate::helpers::TestApp>, Receiver) {
    let app = spawn(Isolation::ReadCommitted, limits(&[1.0])).await;
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
    // Rows of an inventory no one reads (many ranges of 16 pages),
    // written before any endpoint exists, so no pass pumps them.
    app.db
        .execute_unprepared(&format!(
            "INSERT INTO stock_movements (id, inventory_id, delta, reason, stock_after, version_after)
             SELECT gen_random_uuid(), '00000000-0000-0000-0000-0000000005ca', 1, 'RESTOCKED', g, g
               FROM generate_series(1, {OLD_ROWS}) g"
        ))
        .await
        .expect("ledger rows");
    // A change after the endpoint, so that passes run and have rows to find.
    let receiver = a_reservation_sent(&app, "SCAN-1").await;
    (app, receiver)
}

/// A receiver, an endpoint at it, and one reservation of a new inventory
/// `sku` whose two events it has been sent.
async fn a_reservation_sent(app: &crate::helpers::TestApp, sku: &str) -> Receiver {
    let receiver = Receiver::start().await;
    subscribe(app, &receiver).await;
    let item = app.create_inventory(sku, 5).await;
    app.reserve(&app.token("scan-user", Role::Customer), json!({ "inventoryId": item, "quantity": 1 })).await;
    eventually(Duration::from_secs(20), "the reservation's events delivered", || async {
        receiver.accepted_events().len() >= 2
    })
    .await;
    receiver
}

/// Ledger rows written before the endpoint.
const OLD_ROWS: i64 = 30_000;

/// The pump summarizes every range of the ledger below the one its newest
/// rows are written to, and leaves that one alone: a summarized range must
/// widen its summary for every row inserted into it, inside every reserve
/// statement (4.6 % of the HOT chain's reservations, bench/results).
#[tokio::test(flavor = "multi_thread")]
async fn the_pump_summarizes_the_ledger_ranges_filled_and_not_the_one_filling() {
    let (app, _receiver) = a_long_ledger_then_a_change().await;
    // The pass that pumped the change summarizes after it commits, before
    // the pump's next pass begins: wait for a pass after it.
    let seen = pump_snapshot(&app.db).await;
    eventually(Duration::from_secs(20), "a pass after the change's", || async { pump_snapshot(&app.db).await != seen })
        .await;
    let (filled, filling) = unsummarized(&app.db).await;
    assert_eq!(filled, 0, "every filled range summarized by the pump");
    assert_eq!(filling, 1, "the range still filling was left unsummarized");
}

/// Sets `settings` for the rest of `txn` (the events' connections have
/// [`events::SETTINGS`]).
async fn set_local<'a>(txn: &DatabaseTransaction, settings: impl IntoIterator<Item = (&'a str, &'a str)>) {
    for (name, value) in settings {
        txn.execute_unprepared(&format!("SET LOCAL {name} = '{value}'")).await.expect("a setting");
    }
}

/// What a pass reads of the ledger, from its plan as the pump makes it (its
/// settings, on a connection that never planned it before, so on the
/// statistics the ledger has now: none), run and rolled back: the rows,
/// and whether it scanned a partition whole.
async fn ledger_a_pass_reads(db: &DatabaseConnection) -> (i64, bool) {
    let txn = db.begin().await.expect("a transaction");
    set_local(&txn, events::SETTINGS).await;
    let explain = format!("EXPLAIN (ANALYZE, FORMAT JSON) {}", pump::LEDGER_SQL);
    let row = txn.query_one_raw(Statement::from_string(DbBackend::Postgres, explain)).await.expect("explain");
    let plan: Value = row.expect("a plan").try_get("", "QUERY PLAN").expect("json");
    txn.rollback().await.expect("rolled back");
    let ledger: Vec<&Value> = plan_nodes(&plan[0]["Plan"])
        .into_iter()
        .filter(|node| node["Relation Name"].as_str().is_some_and(|name| name.starts_with("stock_movements")))
        .collect();
    let whole = ledger.iter().any(|node| node["Node Type"] == "Seq Scan");
    let rows = ledger
        .iter()
        .map(|node| {
            let count = |key: &str| node[key].as_f64().unwrap_or(0.0);
            count("Actual Rows") * count("Actual Loops").max(1.0)
                + count("Rows Removed by Filter")
                + count("Rows Removed by Index Recheck")
        })
        .sum::<f64>() as i64;
    (rows, whole)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pass_reads_only_the_ledger_it_has_not_pumped_even_without_statistics() {
    let (app, _receiver) = a_long_ledger_then_a_change().await;
    // The rows a pass must look at: those of transactions from the oldest
    // one still running at the last pass on. Transaction ids are the whole
    // PostgreSQL server's, so another test's open transaction can hold that
    // horizon back to before the old rows; counted first, as the horizon
    // only moves on.
    let horizon = "SELECT count(*) FROM stock_movements m, event_pump p
                    WHERE m.txid >= pg_snapshot_xmin(p.seen)::text::bigint";
    let due = app.count(horizon).await;
    let (read, whole) = ledger_a_pass_reads(&app.db).await;
    assert!(!whole, "a pass scanned a ledger partition whole");
    // Beyond those, at most the rest of the range of 16 pages that holds
    // the oldest of them (about 1,000 rows here; in ranges of 128 pages, as
    // before, about 5,000 of the old rows).
    assert!(read <= due + 1_500, "a pass with nothing new read {read} ledger rows, {due} past the horizon");
}

/// A body lists each event's fields in the order docs/webhooks.md shows
/// them (a receiver reading it by eye, or streaming it, sees `id` and
/// `type` first and `data` last).
#[tokio::test(flavor = "multi_thread")]
async fn an_event_lists_its_fields_in_the_documented_order() {
    let app = spawn(Isolation::ReadCommitted, limits(&[1.0])).await;
    let receiver = a_reservation_sent(&app, "ORDER-OF-KEYS").await;
    let body = receiver.received().into_iter().map(|r| r.body).find(|b| b.contains("STOCK_CHANGED")).expect("a body");
    let event = &body[body.find("STOCK_CHANGED").and_then(|at| body[..at].rfind('{')).expect("an event")..];
    let at = |key: &str| event.find(&format!("\"{key}\"")).unwrap_or_else(|| panic!("no {key} in {event}"));
    let order = ["id", "type", "occurredAt", "inventoryId", "version", "data"].map(at);
    assert!(order.is_sorted(), "fields at {order:?} in {event}");
}

/// The plan of a task's step (`STEP_SQL`), prepared in `txn` as a task's
/// connection prepares it, explained with `options` for `arguments`.
async fn step_plan(txn: &DatabaseTransaction, options: &str, arguments: &str) -> Value {
    let prepare = format!(
        "PREPARE step(uuid, uuid, float8, uuid[], integer[], integer[], bigint) AS {}",
        step::STEP_SQL.as_str()
    );
    txn.execute_unprepared(&prepare).await.expect("prepared");
    let explain = format!("EXPLAIN ({options}) EXECUTE step({arguments})");
    let row = txn.query_one_raw(Statement::from_string(DbBackend::Postgres, explain)).await.expect("explain");
    let plan = row.expect("a plan").try_get("", "QUERY PLAN").expect("json");
    txn.execute_unprepared("DEALLOCATE step").await.expect("deallocated");
    plan
}

/// A task's step reads the outbox by its key, as its connection plans it
/// (the events' settings, the generic plan a connection keeps, made while
/// the outbox had no statistics): scanned whole, each body's read visited
/// every row the pump had deleted since the last vacuum, a quarter of the
/// events' backends' CPU under load (bench/results/decisions.md).
#[tokio::test(flavor = "multi_thread")]
async fn a_step_reads_the_outbox_by_its_key_even_without_statistics() {
    let app = spawn(Isolation::ReadCommitted, limits(&[1.0])).await;
    let txn = app.db.begin().await.expect("a transaction");
    set_local(&txn, events::SETTINGS.into_iter().chain([("plan_cache_mode", "force_generic_plan")])).await;
    let plan = step_plan(&txn, "FORMAT JSON", "gen_random_uuid(), gen_random_uuid(), 30, '{}', '{}', '{}', 10").await;
    txn.rollback().await.expect("rolled back");
    let scans: Vec<&Value> = plan_nodes(&plan[0]["Plan"])
        .into_iter()
        .filter(|node| node["Relation Name"] == "outbox" && node["Node Type"] == "Seq Scan")
        .collect();
    assert!(scans.is_empty(), "the outbox scanned whole: {scans:?}");
}

/// A step cuts an outbox row whose events its endpoint all takes as the row
/// is (its numbers and ids, its body): taking each row apart event by event
/// and putting it together again was half of the step's time under load
/// (bench/results/decisions.md). A row with events of a type the endpoint
/// does not take is still taken apart, and only its own events are cut.
#[tokio::test(flavor = "multi_thread")]
async fn a_step_cuts_a_row_whose_events_the_endpoint_all_takes_whole() {
    let app = spawn(Isolation::ReadCommitted, limits(&[1.0])).await;
    let me = uuid::Uuid::new_v4();
    // All in one transaction, rolled back: no process's dispatcher or pump
    // sees the endpoint, which this test holds the lease of anyway.
    let txn = app.db.begin().await.expect("a transaction");
    let endpoint = format!(
        "INSERT INTO webhook_endpoints (url, events, secret, sent_through, leased_by, leased_until)
         VALUES ('https://hooks.example.com/in', ARRAY['STOCK_CHANGED', 'RESERVATION_CHANGED'], 'secret', 0,
                 '{me}', now() + interval '1 hour')
         RETURNING id::text AS id"
    );
    let row = txn.query_one_raw(Statement::from_string(DbBackend::Postgres, endpoint)).await.expect("an endpoint");
    let endpoint: String = row.expect("a row").try_get("", "id").expect("its id");
    // Rows 1..=100, all of the endpoint's types, and 101..=200, every
    // other one an ORDER_CHANGED.
    txn.execute_unprepared(
        "INSERT INTO outbox (seq, first_seq, ids, types, ends, body)
         SELECT r * 100, r * 100 - 99, ARRAY(SELECT gen_random_uuid() FROM generate_series(1, 100)),
                ARRAY(SELECT CASE WHEN r = 2 AND i % 2 = 0 THEN 'ORDER_CHANGED' ELSE 'STOCK_CHANGED' END
                        FROM generate_series(1, 100) i),
                ARRAY(SELECT i * 4 - 2 FROM generate_series(1, 100) i),
                (SELECT string_agg(lpad(i::text, 3, '0'), ',' ORDER BY i) FROM generate_series(1, 100) i)
           FROM generate_series(1, 2) r",
    )
    .await
    .expect("outbox rows");
    let arguments = format!("'{endpoint}', '{me}', 30, '{{}}', '{{}}', '{{}}', 10");
    let plan = step_plan(&txn, "ANALYZE, FORMAT JSON", &arguments).await;
    let taken_apart: f64 = plan_nodes(&plan[0]["Plan"])
        .into_iter()
        .filter(|node| node["Alias"] == "apart")
        .map(|node| {
            let count = |key: &str| node[key].as_f64().unwrap_or(0.0);
            (count("Actual Rows") + count("Rows Removed by Filter")) * count("Actual Loops")
        })
        .sum();
    let cut = "SELECT (SELECT seqs = ARRAY(SELECT generate_series(1, 100)::bigint) AND event_ids = o.ids
                         FROM outbox o WHERE o.seq = 100) AS whole,
                      seqs = ARRAY(SELECT generate_series(101, 199, 2)::bigint) AS own
                 FROM webhook_deliveries d WHERE d.endpoint_id = $1::text::uuid ORDER BY seqs[1]";
    let rows = txn
        .query_all_raw(Statement::from_sql_and_values(DbBackend::Postgres, cut, [endpoint.into()]))
        .await
        .expect("the deliveries cut");
    txn.rollback().await.expect("rolled back");
    let cut: Vec<(bool, bool)> =
        rows.iter().map(|r| (r.try_get("", "whole").expect("whole"), r.try_get("", "own").expect("own"))).collect();
    assert_eq!(cut.len(), 2, "a delivery a row");
    assert!(cut[0].0, "the first row's delivery is the row's numbers and ids");
    assert!(cut[1].1, "the second row's delivery is its STOCK_CHANGED events only");
    assert_eq!(taken_apart, 100.0, "events taken apart one by one: only the second row's 100 should be");
}
