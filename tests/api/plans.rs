//! Statements that PostgreSQL plans once and that cost the same however
//! much history the tables hold: each test counts plans or rows read in the
//! database itself, where a slow plan would show.

use sea_orm::{ConnectionTrait, DbBackend, QueryTrait, Statement, TransactionTrait};
use stockguard::{
    db::StatementPool,
    pagination::Page,
    reservations::{store, sweeper},
    stock::{DISTINCT_RESERVE_SQL, coalesced::CoalescedReserve, returning, shipping},
};
use uuid::Uuid;

use crate::helpers::TestApp;

/// The generic and custom plans PostgreSQL made so far for the prepared
/// statements of this session whose text starts with `prefix`.
const PLANS: &str = "SELECT coalesce(sum(generic_plans), 0)::bigint, coalesce(sum(custom_plans), 0)::bigint \
                     FROM pg_prepared_statements WHERE statement LIKE $1 || '%'";

/// Small batches, whose plans PostgreSQL judges cheaper than the generic
/// one: on the statement pool neither batch statement (callers of distinct
/// inventories, and callers sharing one) is planned again per batch.
#[tokio::test(flavor = "multi_thread")]
async fn the_coalesced_reserve_is_planned_once_however_its_batches_vary() {
    let app = TestApp::spawn().await;
    let a = app.create_inventory("PLAN-A", 100).await;
    let b = app.create_inventory("PLAN-B", 100).await;
    let pool = StatementPool::beside(&app.db);
    for round in 0..20 {
        let inventories: Vec<Uuid> = if round % 2 == 0 { vec![a, b] } else { vec![a, a, b] };
        let reservation_ids: Vec<Uuid> = inventories.iter().map(|_| Uuid::now_v7()).collect();
        let movement_ids: Vec<Uuid> = inventories.iter().map(|_| Uuid::now_v7()).collect();
        let users: Vec<&str> = inventories.iter().map(|_| "planner").collect();
        let quantities: Vec<i32> = inventories.iter().map(|_| 1).collect();
        let no_keys: Vec<Option<&str>> = inventories.iter().map(|_| None).collect();
        let reserve = CoalescedReserve {
            inventory_ids: &inventories,
            reservation_ids: &reservation_ids,
            movement_ids: &movement_ids,
            user_ids: &users,
            quantities: &quantities,
            keys: &no_keys,
            fingerprints: &no_keys,
            expected_versions: &inventories.iter().map(|_| None).collect::<Vec<_>>(),
            ttl_secs: &inventories.iter().map(|_| 900).collect::<Vec<_>>(),
            use_safety_stock: &inventories.iter().map(|_| false).collect::<Vec<_>>(),
            across_levels: false,
            kits: None,
        };
        let turns = pool.fetch_all("test", reserve.query()).await.expect("coalesced reserve");
        assert_eq!(turns.len(), inventories.len());
    }
    // One statement at a time: the pool hands out the same connection again.
    for (statement, prefix) in [("distinct", "\nWITH req"), ("walk", "\nWITH RECURSIVE req")] {
        let plans = sea_orm::sqlx::query(PLANS).bind(prefix);
        let row = pool.fetch_optional("test", plans).await.expect("plans").expect("a row");
        let (generic, custom): (i64, i64) =
            (row.try_get_by_index(0).expect("generic"), row.try_get_by_index(1).expect("custom"));
        assert_eq!((generic, custom), (10, 0), "10 batches of the {statement} statement: generic and custom plans");
    }
    app.assert_invariant().await;
}

/// The sweeper's statement has no parameter left to plan for: one plan,
/// made once, for every sweep.
#[tokio::test(flavor = "multi_thread")]
async fn the_sweep_is_planned_once() {
    let app = TestApp::spawn().await;
    // One connection for all of it, so its prepared statements can be read.
    let session = app.db.begin().await.expect("begin");
    for _ in 0..10 {
        sweeper::sweep_once(&session, 500).await.expect("sweep");
    }
    let plans = Statement::from_sql_and_values(DbBackend::Postgres, PLANS, ["\nWITH due AS".into()]);
    let row = session.query_one_raw(plans).await.expect("plans").expect("a row");
    let custom: i64 = row.try_get_by_index(1).expect("custom plans");
    assert_eq!(custom, 0, "sweeps planned one by one");
    session.rollback().await.expect("rollback");
}

/// The statements that give stock back or ship it find a line's
/// allocations by key, whatever the tables hold and whether or not they
/// were ever analyzed: on tables without statistics, a join of the lines
/// with `allocations` was planned as a sequential scan of every allocation
/// (100,000 here are enough), and with 3 million of them every sweep ran
/// into the statement timeout, so expired stock never came back
/// (bench/results/decisions.md, "the sweeper stuck behind a plan without
/// statistics"). Nor do they scan the reservations: the sweep once found
/// due kits' components by an `OR` beside the due reservations, which only
/// a scan of every reservation can answer, and on 10 million rows of
/// history every sweep ran into the statement timeout.
#[tokio::test(flavor = "multi_thread")]
async fn returning_and_shipping_read_allocations_by_key_even_without_statistics() {
    let app = TestApp::spawn().await;
    app.db
        .execute_unprepared(
            "ALTER TABLE allocations SET (autovacuum_enabled = false); \
             ALTER TABLE reservations SET (autovacuum_enabled = false); \
             INSERT INTO reservations (id, inventory_id, user_id, quantity, status) \
             SELECT gen_random_uuid(), gen_random_uuid(), 'history', 1, 'RELEASED' FROM generate_series(1, 100000); \
             INSERT INTO allocations (reservation_id, location_id, quantity) \
             SELECT id, gen_random_uuid(), 1 FROM reservations;",
        )
        .await
        .expect("history");
    let unanalyzed = "SELECT count(*) FROM pg_stat_user_tables WHERE relname IN ('allocations', 'reservations') \
                      AND last_analyze IS NULL AND last_autoanalyze IS NULL";
    assert_eq!(app.count(unanalyzed).await, 2, "the tables have no statistics");
    let id = Uuid::new_v4();
    let statements = [
        ("sweep", returning::sweep(500)),
        ("release", returning::release(id, "history")),
        ("cancel_order", returning::cancel_order(id)),
        ("fulfil_order", shipping::fulfil_order(id)),
    ];
    for (name, mut statement) in statements {
        statement.sql = format!("EXPLAIN (FORMAT JSON) {}", statement.sql);
        let row = app.db.query_one_raw(statement).await.expect("explain").expect("a plan");
        let plan: serde_json::Value = row.try_get_by_index(0).expect("plan");
        let mut sequential = Vec::new();
        sequential_scans(&plan[0]["Plan"], &mut sequential);
        for table in ["allocations", "reservations"] {
            assert!(!sequential.contains(&table.to_owned()), "{name} scans {table} whole: {plan:#}");
        }
    }
}

/// The server's connections compile no plan, however costly PostgreSQL
/// judges it: a plan made without statistics easily passes
/// `jit_above_cost`, and PostgreSQL then compiles it at every execution.
/// On 2.8 million reservations never analyzed, the sweep (nothing due)
/// compiled 141 functions in 620 ms every second, two thirds of a core
/// (bench/results/decisions.md, "JIT"). Here every plan passes the
/// threshold (`jit_above_cost = 0`), so a connection that still allowed
/// JIT would compile the sweep.
#[tokio::test(flavor = "multi_thread")]
async fn the_server_s_connections_compile_no_plan_however_costly_it_looks() {
    let app = TestApp::spawn().await;
    let session = app.db.begin().await.expect("begin");
    let jit = session.query_one_raw(Statement::from_string(DbBackend::Postgres, "SHOW jit")).await;
    assert_eq!(jit.expect("show").expect("a row").try_get_by_index::<String>(0).expect("jit"), "off");
    session.execute_unprepared("SET LOCAL jit_above_cost = 0").await.expect("every plan looks costly");
    let mut sweep = returning::sweep(500);
    sweep.sql = format!("EXPLAIN (ANALYZE, FORMAT JSON) {}", sweep.sql);
    let row = session.query_one_raw(sweep).await.expect("explain").expect("a plan");
    let plan: serde_json::Value = row.try_get_by_index(0).expect("plan");
    session.rollback().await.expect("rollback");
    assert!(plan[0].get("JIT").is_none(), "the sweep was compiled: {:#}", plan[0]["JIT"]);
}

/// Asked for the first page of a user with many reservations among many
/// users with few (what history makes of the table), the generic plan of
/// the page's statement reads one page of rows, not every row of the user.
/// (The bound `LIMIT` keeps it so: with the limit written into the text,
/// PostgreSQL 15 costs this plan for an average user and reads and sorts
/// all of a busy user's rows, bench/results/decisions.md#plans-made-once.)
#[tokio::test(flavor = "multi_thread")]
async fn the_first_page_of_a_users_reservations_reads_one_page_however_many_they_have() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("PLAN-PAGE", 1_000_000).await;
    app.db
        .execute_unprepared(&format!(
            "INSERT INTO reservations (id, inventory_id, user_id, quantity, status, created_at) \
             SELECT gen_random_uuid(), '{id}', CASE WHEN g % 100 = 0 THEN 'busy' ELSE 'few-' || g % 10000 END, 1, \
                    'RELEASED', now() - g * interval '1 second' \
               FROM generate_series(1, 200000) g; \
             ANALYZE reservations;"
        ))
        .await
        .expect("history");
    // The statement as the feature builds it, prepared and planned
    // generically, as the server's connection plans it after five runs.
    let statement = store::page_query("busy", Page { first: 20, after: None }).build(DbBackend::Postgres);
    let values: Vec<String> = statement
        .values
        .expect("bound values")
        .0
        .iter()
        .map(|value| match value {
            sea_orm::Value::String(Some(s)) => format!("'{s}'"),
            sea_orm::Value::BigUnsigned(Some(v)) => v.to_string(),
            sea_orm::Value::BigInt(Some(v)) => v.to_string(),
            other => panic!("unexpected value {other:?}"),
        })
        .collect();
    let session = app.db.begin().await.expect("begin");
    let prepare = format!("SET LOCAL plan_cache_mode = force_generic_plan; PREPARE page AS {}; ", statement.sql);
    session.execute_unprepared(&prepare).await.expect("prepare");
    let explain = format!("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE page({})", values.join(", "));
    let row = session
        .query_one_raw(Statement::from_string(DbBackend::Postgres, explain))
        .await
        .expect("explain")
        .expect("a plan");
    let plan: serde_json::Value = row.try_get_by_index(0).expect("plan");
    session.rollback().await.expect("rollback");
    let mut most = 0;
    rows_read(&plan[0]["Plan"], &mut most);
    assert!(most <= 21, "a node read {most} rows for a page of 20: {plan:#}");
    let page = store::page_for_user(&app.db, "busy", Page { first: 20, after: None }).await.expect("page");
    assert_eq!(page.len(), 21);
    assert!(page.windows(2).all(|w| (w[0].created_at, w[0].id) < (w[1].created_at, w[1].id)), "in keyset order");
}

/// The most rows any node of `plan` produced.
fn rows_read(plan: &serde_json::Value, most: &mut u64) {
    let rows = plan["Actual Rows"].as_u64().unwrap_or(0) * plan["Actual Loops"].as_u64().unwrap_or(1);
    *most = (*most).max(rows);
    for child in plan["Plans"].as_array().into_iter().flatten() {
        rows_read(child, most);
    }
}

/// A batch of callers of distinct inventories updates their rows in the
/// order the plan reaches them, which must be id order, the order every
/// writer locks in: on catalogues small and large (ids random, so rows lie
/// on disk in no id order), the statement pool's generic plan reaches
/// inventories only through their primary key, never by a sequential or
/// bitmap scan (disk order) or another index.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_of_distinct_inventories_reaches_them_in_id_order_on_any_catalogue() {
    let app = TestApp::spawn().await;
    let pool = StatementPool::beside(&app.db);
    let prepare = format!(
        "PREPARE distinct_batch(uuid[], uuid[], text[], integer[], integer[], uuid[], text[], text[], integer[], boolean[]) \
         AS {}",
        *DISTINCT_RESERVE_SQL
    );
    pool.fetch_all("test", sea_orm::sqlx::query(sea_orm::sqlx::AssertSqlSafe(prepare))).await.expect("prepare");
    let mut catalogue = 0;
    for size in [3, 300, 5000] {
        let more = format!(
            "INSERT INTO inventories (id, sku, name, stock) SELECT gen_random_uuid(), 'ORDER-' || n, 'n', 10 \
             FROM generate_series({}, {size}) n; ANALYZE inventories",
            catalogue + 1
        );
        app.db.execute_unprepared(&more).await.expect("fill the catalogue");
        catalogue = size;
        let ids =
            app.db.query_all_raw(Statement::from_string(DbBackend::Postgres, "SELECT id FROM inventories LIMIT 3"));
        let ids: Vec<String> =
            ids.await.expect("ids").iter().map(|row| row.try_get::<Uuid>("", "id").expect("id").to_string()).collect();
        let uuids = |n: usize| (0..n).map(|_| format!("'{}'", Uuid::now_v7())).collect::<Vec<_>>().join(", ");
        let explain = format!(
            "EXPLAIN (FORMAT JSON) EXECUTE distinct_batch(ARRAY['{}']::uuid[], ARRAY[{}]::uuid[], \
             ARRAY['a', 'b', 'c'], ARRAY[1, 1, 1], ARRAY[900, 900, 900], ARRAY[{}]::uuid[], ARRAY[NULL, NULL, NULL]::text[], \
             ARRAY[NULL, NULL, NULL]::text[], ARRAY[NULL, NULL, NULL]::integer[], ARRAY[false, true, false])",
            ids.join("', '"),
            uuids(3),
            uuids(3)
        );
        let row = pool.fetch_optional("test", sea_orm::sqlx::query(sea_orm::sqlx::AssertSqlSafe(explain))).await;
        let plan: serde_json::Value = row.expect("explain").expect("a plan").try_get_by_index(0).expect("plan");
        let mut reached = Vec::new();
        inventory_scans(&plan[0]["Plan"], &mut reached);
        assert!(!reached.is_empty(), "the plan reads inventories: {plan:#}");
        for scan in reached {
            assert_eq!(scan, "Index Scan using inventories_pkey", "with {size} inventories: {plan:#}");
        }
    }
}

/// How every node of `plan` that reads `inventories` reads it.
fn inventory_scans(plan: &serde_json::Value, reached: &mut Vec<String>) {
    if plan["Relation Name"] == "inventories" && plan["Node Type"] != "ModifyTable" {
        let index = plan["Index Name"].as_str().map(|name| format!(" using {name}")).unwrap_or_default();
        reached.push(format!("{}{index}", plan["Node Type"].as_str().unwrap_or_default()));
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        inventory_scans(child, reached);
    }
}

/// On the statement pool (no sequential scans, generic plans) a plan that
/// still had to scan a table sequentially would carry the planner's penalty
/// for a disabled scan, lifting its cost past `jit_above_cost`, and its
/// generic plan would be compiled again on every run (a batch of four on
/// one inventory took 800 ms): no reserve statement scans a table
/// sequentially, and the pool does not compile plans.
#[tokio::test(flavor = "multi_thread")]
async fn the_statement_pool_s_reserves_read_every_table_by_an_index_and_compile_nothing() {
    let app = TestApp::spawn().await;
    let pool = StatementPool::beside(&app.db);
    let id = app.create_inventory("PLAN-JIT", 100).await;
    let types = "uuid[], uuid[], text[], integer[], integer[], uuid[], text[], text[], integer[], boolean[]";
    let statements = [
        ("distinct_pool", &*DISTINCT_RESERVE_SQL),
        ("walk_pool", &*stockguard::stock::COALESCED_RESERVE_SQL),
        ("levels_pool", &*stockguard::stock::ACROSS_LEVELS_RESERVE_SQL),
    ];
    for (name, sql) in statements {
        let prepare = format!("PREPARE {name}({types}) AS {sql}");
        pool.fetch_all("test", sea_orm::sqlx::query(sea_orm::sqlx::AssertSqlSafe(prepare))).await.expect("prepare");
        let explain = format!(
            "EXPLAIN (FORMAT JSON) EXECUTE {name}(ARRAY['{id}', '{id}']::uuid[], ARRAY['{}', '{}']::uuid[], \
             ARRAY['a', 'b'], ARRAY[1, 1], ARRAY[900, 900], ARRAY['{}', '{}']::uuid[], ARRAY[NULL, NULL]::text[], \
             ARRAY[NULL, NULL]::text[], ARRAY[NULL, NULL]::integer[], ARRAY[false, true])",
            Uuid::now_v7(),
            Uuid::now_v7(),
            Uuid::now_v7(),
            Uuid::now_v7()
        );
        let row = pool.fetch_optional("test", sea_orm::sqlx::query(sea_orm::sqlx::AssertSqlSafe(explain))).await;
        let plan: serde_json::Value = row.expect("explain").expect("a plan").try_get_by_index(0).expect("plan");
        let mut sequential = Vec::new();
        sequential_scans(&plan[0]["Plan"], &mut sequential);
        assert!(sequential.is_empty(), "the {name} statement scans {sequential:?} sequentially: {plan:#}");
    }
    let jit = pool.fetch_optional("test", sea_orm::sqlx::query("SHOW jit")).await.expect("show").expect("a row");
    assert_eq!(jit.try_get_by_index::<String>(0).expect("jit"), "off");
}

/// The tables that `plan` scans sequentially.
fn sequential_scans(plan: &serde_json::Value, tables: &mut Vec<String>) {
    if plan["Node Type"] == "Seq Scan" {
        tables.push(plan["Relation Name"].as_str().unwrap_or_default().to_owned());
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        sequential_scans(child, tables);
    }
}
