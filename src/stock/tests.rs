//! Every stock statement, rendered and `EXPLAIN`ed by PostgreSQL against
//! the migrated schema, with bind values of the types the features send: a
//! statement that does not parse, names a column that is not there or
//! mistypes a parameter fails here, whichever feature runs it.

use sea_orm::{
    ConnectionTrait, DatabaseConnection, Statement,
    sqlx::{self, Connection as _, postgres::PgConnection},
};
use uuid::Uuid;

use super::{
    ACROSS_LEVELS_RESERVE_SQL, COALESCED_RESERVE_SQL, DISTINCT_RESERVE_SQL, RESERVE_SQL, adjusting, allocating,
    archiving,
    coalesced::CoalescedReserve,
    correcting::{self, Adjustment, Change},
    kitting::{self, KitReserve},
    lines::{self, KitPart, Line, Part, Purpose},
    lock_order, moving, receiving, returning,
    rows::{AdjustmentReason, ReturnDisposition},
    shipping,
    taking::{self, ALLOCATING_RESERVE_SQL, Reserve},
    taking_back::{self, OrderReturn, ReturnLine},
};
use crate::config::DatabaseConfig;

/// The server the tests create their databases on, as the integration tests find it.
fn server_url() -> String {
    stockguard_support::database::server_url()
}

/// Every statement built with sea-orm values, by name.
fn statements() -> Vec<(&'static str, Statement)> {
    let id = Uuid::new_v4();
    let now = chrono::Utc::now();
    let somewhere = somewhere();
    let lines = [
        Line { inventory_id: id, quantity: 2, expected_version: Some(3), allocating: somewhere.clone() },
        Line {
            inventory_id: Uuid::new_v4(),
            quantity: 1,
            expected_version: None,
            allocating: allocating::Allocating::default(),
        },
    ];
    let returned = [
        ReturnLine { inventory_id: id, quantity: 2, disposition: ReturnDisposition::Restock, location_id: None },
        ReturnLine {
            inventory_id: Uuid::new_v4(),
            quantity: 1,
            disposition: ReturnDisposition::Restock,
            location_id: Some(id),
        },
        ReturnLine {
            inventory_id: Uuid::new_v4(),
            quantity: 3,
            disposition: ReturnDisposition::WriteOff,
            location_id: None,
        },
    ];
    let kit_id = Uuid::new_v4();
    let parts = [
        Part { id: Uuid::new_v4(), inventory_id: id, quantity: 1, kit_reservation_id: None },
        Part { id: Uuid::new_v4(), inventory_id: id, quantity: 1, kit_reservation_id: Some(kit_id) },
    ];
    let kits = [KitPart { id: kit_id, kit_id, quantity: 1 }];
    let kit_reserve = KitReserve {
        kit_id,
        quantity: 2,
        lines: &lines,
        kit_reservation_id: kit_id,
        user_id: "alice",
        key: Some(("k", "f")),
        ttl_secs: 900,
    };
    let order_return = OrderReturn {
        order_id: id,
        return_id: Uuid::new_v4(),
        operator: "op",
        note: Some("damaged box"),
        lines: &returned,
        key: Some(("k", "f")),
    };
    let adjustment = Adjustment {
        inventory_id: id,
        location_id: Some(id),
        change: Change::Delta(-2),
        reason: AdjustmentReason::Damaged,
        note: Some("forklift"),
        expected_version: Some(3),
        operator: "op",
        key: Some(("k", "f")),
    };
    vec![
        ("create", receiving::create(id, "SKU-1", "an item", 10, None)),
        ("create at a location", receiving::create(id, "SKU-1", "an item", 10, Some(id))),
        ("restock", receiving::restock(id, 5, Some(1), Some(id))),
        ("restock without a version", receiving::restock(id, 5, None, None)),
        ("lock_lines", lines::lock_lines(&lines)),
        (
            "take_lines for reservations",
            lines::take_lines(
                &lines,
                &parts,
                &kits,
                Purpose::Reservations { ttl_secs: 900 },
                "alice",
                Some(("k", "f")),
                id,
            ),
        ),
        ("take_lines for an order", lines::take_lines(&lines, &parts, &kits, Purpose::Order(id), "alice", None, id)),
        ("eligible available", allocating::available(id, &somewhere, false)),
        ("eligible available with safety stock", allocating::available(id, &somewhere, true)),
        ("transfer", moving::transfer(id, id, Uuid::new_v4(), 1, Some(1), "op", Some(("k", "f")))),
        ("unknown locations", allocating::unknown(&[id])),
        ("release", returning::release(id, "alice")),
        ("sweep", returning::sweep(500)),
        ("lock_order", lock_order(id)),
        ("cancel_order", returning::cancel_order(id)),
        ("change_quantity", adjusting::change_quantity(id, "alice", 3)),
        ("fulfil_order", shipping::fulfil_order(id)),
        ("return_order", taking_back::return_order(order_return)),
        ("adjust by a delta", correcting::adjust(adjustment)),
        (
            "adjust to a count, without a location, note, version or key",
            correcting::adjust(Adjustment {
                location_id: None,
                change: Change::Count(0),
                note: None,
                expected_version: None,
                key: None,
                ..adjustment
            }),
        ),
        ("set_safety_stock", correcting::set_safety_stock(id, Some(id), 5)),
        ("set_safety_stock at the default location", correcting::set_safety_stock(id, None, 0)),
        (
            "return_order without a note or key",
            taking_back::return_order(OrderReturn { note: None, key: None, ..order_return }),
        ),
        ("latest reservation change", taking::ReservationChange::latest(id)),
        ("reserve_kit", kitting::reserve_kit(kit_reserve)),
        ("reserve_kit without a key", kitting::reserve_kit(KitReserve { key: None, ttl_secs: 0, ..kit_reserve })),
        ("release_kit", kitting::release_kit(id, "alice")),
        ("extend_kit", kitting::extend_kit(id, "alice", 30, 900)),
        ("oldest key", archiving::oldest_key()),
        ("forget_keys", archiving::forget_keys(now, now)),
        ("oldest archivable reservation", archiving::oldest_reservation()),
        ("archive_reservations", archiving::archive_reservations(now, now)),
        ("oldest ledger row", archiving::oldest_ledger_row()),
        ("archive_ledger", archiving::archive_ledger(now, now)),
        ("drop_empty_partitions", archiving::drop_empty_partitions(now)),
    ]
}

/// A choice of locations that names some, for the statements that bind one.
fn somewhere() -> allocating::Allocating {
    allocating::Allocating {
        location_ids: Some(vec![Uuid::new_v4()]),
        strategy: allocating::Strategy::FewestLocations,
        allow_split: false,
    }
}

async fn explain_all(db: &DatabaseConnection, url: &str) -> Vec<String> {
    let mut failures = Vec::new();
    for (name, mut statement) in statements() {
        statement.sql = format!("EXPLAIN {}", statement.sql);
        if let Err(err) = db.query_all_raw(statement).await {
            failures.push(format!("{name}: {err}"));
        }
    }
    // The statement pool's two, bound through sqlx as the pool sends them.
    let mut conn = match PgConnection::connect(url).await {
        Ok(conn) => conn,
        Err(err) => return vec![format!("connect: {err}")],
    };
    let reservation_id = Uuid::new_v4();
    let reserve = Reserve {
        inventory_id: Uuid::new_v4(),
        quantity: 1,
        expected_version: None,
        reservation_id,
        movement_id: Uuid::new_v4(),
        user_id: "alice",
        idempotency_key: Some("k"),
        fingerprint: Some("f"),
        ttl_secs: 900,
        allocating: &somewhere(),
        use_safety_stock: true,
    };
    let explained = reserve.bind(sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {}", *RESERVE_SQL))));
    if let Err(err) = explained.fetch_all(&mut conn).await {
        failures.push(format!("reserve: {err}"));
    }
    let (ids, fewest, split) = reserve.allocating.columns();
    let explained = reserve
        .bind(sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {}", *ALLOCATING_RESERVE_SQL))))
        .bind(ids)
        .bind(fewest.unwrap_or(false))
        .bind(split.unwrap_or(true));
    if let Err(err) = explained.fetch_all(&mut conn).await {
        failures.push(format!("reserve across levels: {err}"));
    }
    let id_of_two = Uuid::new_v4();
    let coalesced = CoalescedReserve {
        inventory_ids: &[id_of_two, id_of_two, Uuid::new_v4()],
        reservation_ids: &[reservation_id, Uuid::new_v4(), Uuid::new_v4()],
        movement_ids: &[Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4()],
        user_ids: &["alice", "bob", "carol"],
        quantities: &[1, 2, 3],
        keys: &[None, Some("k2"), None],
        fingerprints: &[None, Some("f2"), None],
        expected_versions: &[None, Some(1), None],
        ttl_secs: &[0, 900, 60],
        use_safety_stock: &[false, true, false],
        across_levels: false,
        kits: None,
    };
    let explained = coalesced.bind(sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {}", *COALESCED_RESERVE_SQL))));
    if let Err(err) = explained.fetch_all(&mut conn).await {
        failures.push(format!("coalesced reserve: {err}"));
    }
    let explained = coalesced.bind(sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {}", *DISTINCT_RESERVE_SQL))));
    if let Err(err) = explained.fetch_all(&mut conn).await {
        failures.push(format!("distinct reserve: {err}"));
    }
    let explained = coalesced.bind(sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {}", *ACROSS_LEVELS_RESERVE_SQL))));
    if let Err(err) = explained.fetch_all(&mut conn).await {
        failures.push(format!("coalesced reserve across levels: {err}"));
    }
    let _ = conn.close().await;
    failures
}

#[tokio::test(flavor = "multi_thread")]
async fn postgresql_plans_every_stock_statement() {
    let name = format!("sg_test_stock_{}", Uuid::new_v4().simple());
    let url = format!("{}/{name}", server_url());
    crate::db::ensure_database(&url).await.expect("create the database");
    let config = DatabaseConfig { database_url: Some(url.clone()), pool_size: 2, ..DatabaseConfig::default() };
    let db = crate::db::connect(&url, &config).await.expect("connect");
    crate::db::migrate(&db).await.expect("migrate");
    let failures = explain_all(&db, &url).await;
    db.close().await.expect("close");
    let admin = sea_orm::Database::connect(format!("{}/postgres", server_url())).await.expect("connect");
    admin.execute_unprepared(&format!("DROP DATABASE {name} WITH (FORCE)")).await.expect("drop the database");
    assert!(failures.is_empty(), "statements PostgreSQL cannot plan: {failures:#?}");
}
