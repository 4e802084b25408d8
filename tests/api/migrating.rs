//! The migration to locations (m20261207_090000_keep_stock_per_location),
//! proved on a database written as the `main` of before locations wrote it:
//! every number the API shows is unchanged, everything is at the default
//! location, the check holds, and the migrated database serves reserves,
//! releases, expiries and cancels that keep it holding. And a shop that
//! never makes a location sees what it saw before, plus the new fields.

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use serde_json::{Value, json};
use stockguard::{auth::Role, config::Limits, invariant};
use uuid::Uuid;

use crate::helpers::{BeforeMigration, Options, TestApp, sweep_all, uuid};

const A: Uuid = Uuid::from_u128(0xa1);
const B: Uuid = Uuid::from_u128(0xb1);
const C: Uuid = Uuid::from_u128(0xc1);
const D: Uuid = Uuid::from_u128(0xd1);
/// MIG-A's reservation of 3 by alice, expiring in a quarter of an hour.
const EXPIRING: Uuid = Uuid::from_u128(0x1);
/// An order of bob's, PENDING: 4 of MIG-A and 1 of MIG-B.
const PENDING: Uuid = Uuid::from_u128(0xf1);

/// What `main` before locations wrote, row for row as its statements wrote
/// them (a change is the inventory's row, version + 1, and one ledger row):
///
/// - MIG-A, created with 20: alice's ACTIVE 3 (expiring), an ACTIVE 2 with
///   an idempotency key, a reservation released and one expired, a restock
///   of 5, a PENDING order's line of 4 and a FULFILLED order's line of 2;
/// - MIG-B, created with 5: an ACTIVE 1 past its expiry, not yet swept, and
///   the PENDING order's line of 1;
/// - MIG-C: its first three changes archived into `ledger_checkpoints`,
///   then a restock of 2;
/// - MIG-D, created with none.
const BEFORE_LOCATIONS: &str = r#"
INSERT INTO inventories (id, sku, name, stock, version) VALUES
    ('00000000-0000-0000-0000-0000000000a1', 'MIG-A', 'A', 14, 11),
    ('00000000-0000-0000-0000-0000000000b1', 'MIG-B', 'B', 3, 3),
    ('00000000-0000-0000-0000-0000000000c1', 'MIG-C', 'C', 12, 4),
    ('00000000-0000-0000-0000-0000000000d1', 'MIG-D', 'D', 0, 1);
INSERT INTO orders (id, user_id, status, ship_name, ship_line1, ship_city, ship_postal_code, ship_country,
                    confirmed_at, confirmed_by, fulfilled_at, fulfilled_by) VALUES
    ('00000000-0000-0000-0000-0000000000f1', 'bob', 'PENDING', 'Bob', 'Main St 1', 'Berlin', '10115', 'DE',
     NULL, NULL, NULL, NULL),
    ('00000000-0000-0000-0000-0000000000f2', 'bob', 'FULFILLED', 'Bob', 'Main St 1', 'Berlin', '10115', 'DE',
     now(), 'operator', now(), 'operator');
INSERT INTO reservations (id, inventory_id, order_id, user_id, quantity, status, idempotency_key,
                          request_fingerprint, expires_at) VALUES
    ('00000000-0000-0000-0000-000000000001', '00000000-0000-0000-0000-0000000000a1', NULL, 'alice', 3, 'ACTIVE',
     NULL, NULL, now() + interval '15 minutes'),
    ('00000000-0000-0000-0000-000000000002', '00000000-0000-0000-0000-0000000000a1', NULL, 'carol', 2, 'ACTIVE',
     'carol-key', 'carol-fingerprint', NULL),
    ('00000000-0000-0000-0000-000000000003', '00000000-0000-0000-0000-0000000000a1', NULL, 'dave', 1, 'RELEASED',
     NULL, NULL, now() + interval '15 minutes'),
    ('00000000-0000-0000-0000-000000000004', '00000000-0000-0000-0000-0000000000a1',
     '00000000-0000-0000-0000-0000000000f1', 'bob', 4, 'ORDERED', NULL, NULL, NULL),
    ('00000000-0000-0000-0000-000000000005', '00000000-0000-0000-0000-0000000000a1',
     '00000000-0000-0000-0000-0000000000f2', 'bob', 2, 'FULFILLED', NULL, NULL, NULL),
    ('00000000-0000-0000-0000-000000000006', '00000000-0000-0000-0000-0000000000a1', NULL, 'erin', 1, 'EXPIRED',
     NULL, NULL, now() - interval '1 hour'),
    ('00000000-0000-0000-0000-000000000007', '00000000-0000-0000-0000-0000000000b1', NULL, 'frank', 1, 'ACTIVE',
     NULL, NULL, now() - interval '1 minute'),
    ('00000000-0000-0000-0000-000000000008', '00000000-0000-0000-0000-0000000000b1',
     '00000000-0000-0000-0000-0000000000f1', 'bob', 1, 'ORDERED', NULL, NULL, NULL);
INSERT INTO stock_movements (inventory_id, delta, reason, stock_after, version_after, reservation_id, order_id)
SELECT m.inventory_id::uuid, m.delta, m.reason, m.stock_after, m.version_after, m.reservation_id::uuid,
       m.order_id::uuid
  FROM (VALUES
    ('00000000-0000-0000-0000-0000000000a1', 20, 'CREATED', 20, 1, NULL, NULL),
    ('00000000-0000-0000-0000-0000000000a1', -3, 'RESERVED', 17, 2, '00000000-0000-0000-0000-000000000001', NULL),
    ('00000000-0000-0000-0000-0000000000a1', -2, 'RESERVED', 15, 3, '00000000-0000-0000-0000-000000000002', NULL),
    ('00000000-0000-0000-0000-0000000000a1', -1, 'RESERVED', 14, 4, '00000000-0000-0000-0000-000000000003', NULL),
    ('00000000-0000-0000-0000-0000000000a1', 1, 'RELEASED', 15, 5, '00000000-0000-0000-0000-000000000003', NULL),
    ('00000000-0000-0000-0000-0000000000a1', 5, 'RESTOCKED', 20, 6, NULL, NULL),
    ('00000000-0000-0000-0000-0000000000a1', -4, 'ORDERED', 16, 7, '00000000-0000-0000-0000-000000000004',
     '00000000-0000-0000-0000-0000000000f1'),
    ('00000000-0000-0000-0000-0000000000a1', -2, 'ORDERED', 14, 8, '00000000-0000-0000-0000-000000000005',
     '00000000-0000-0000-0000-0000000000f2'),
    ('00000000-0000-0000-0000-0000000000a1', -2, 'FULFILLED', 14, 9, '00000000-0000-0000-0000-000000000005',
     '00000000-0000-0000-0000-0000000000f2'),
    ('00000000-0000-0000-0000-0000000000a1', -1, 'RESERVED', 13, 10, '00000000-0000-0000-0000-000000000006', NULL),
    ('00000000-0000-0000-0000-0000000000a1', 1, 'EXPIRED', 14, 11, '00000000-0000-0000-0000-000000000006', NULL),
    ('00000000-0000-0000-0000-0000000000b1', 5, 'CREATED', 5, 1, NULL, NULL),
    ('00000000-0000-0000-0000-0000000000b1', -1, 'RESERVED', 4, 2, '00000000-0000-0000-0000-000000000007', NULL),
    ('00000000-0000-0000-0000-0000000000b1', -1, 'ORDERED', 3, 3, '00000000-0000-0000-0000-000000000008',
     '00000000-0000-0000-0000-0000000000f1'),
    ('00000000-0000-0000-0000-0000000000c1', 2, 'RESTOCKED', 12, 4, NULL, NULL),
    ('00000000-0000-0000-0000-0000000000d1', 0, 'CREATED', 0, 1, NULL, NULL)
  ) AS m (inventory_id, delta, reason, stock_after, version_after, reservation_id, order_id);
INSERT INTO ledger_checkpoints (inventory_id, changes, stock, received, fulfilled, version_after, archived_until)
VALUES ('00000000-0000-0000-0000-0000000000c1', 3, 10, 10, 0, 3, now() - interval '100 days');
"#;

/// The invariant as `main` checked it before locations (src/invariant.rs of
/// then): the SKUs that break it.
const CHECK_BEFORE_LOCATIONS: &str = r#"
SELECT coalesce(string_agg(i.sku, ',' ORDER BY i.sku), '')
  FROM inventories i
  LEFT JOIN (SELECT inventory_id,
                    coalesce(sum(quantity) FILTER (WHERE status = 'ACTIVE'), 0) AS reserved,
                    coalesce(sum(quantity) FILTER (WHERE status = 'ORDERED'), 0) AS committed,
                    coalesce(sum(quantity) FILTER (WHERE status = 'FULFILLED'), 0) AS fulfilled
               FROM reservations GROUP BY inventory_id) h ON h.inventory_id = i.id
  LEFT JOIN (SELECT inventory_id, sum(changes) AS changes, sum(stock) AS stock, sum(fulfilled) AS fulfilled,
                    sum(received) AS received
               FROM (SELECT inventory_id, count(*) AS changes,
                            coalesce(sum(delta) FILTER (WHERE reason <> 'FULFILLED'), 0) AS stock,
                            coalesce(-sum(delta) FILTER (WHERE reason = 'FULFILLED'), 0) AS fulfilled,
                            coalesce(sum(delta) FILTER (WHERE reason IN ('CREATED', 'RESTOCKED')), 0) AS received
                       FROM stock_movements GROUP BY inventory_id
                     UNION ALL
                     SELECT inventory_id, changes, stock, fulfilled, received FROM ledger_checkpoints) parts
              GROUP BY inventory_id) l ON l.inventory_id = i.id
 WHERE NOT (i.stock >= 0
            AND coalesce(l.received, 0) - coalesce(h.fulfilled, 0)
                = i.stock + coalesce(h.reserved, 0) + coalesce(h.committed, 0)
            AND i.version = coalesce(l.changes, 0)
            AND i.stock = coalesce(l.stock, 0)
            AND coalesce(h.fulfilled, 0) = coalesce(l.fulfilled, 0))"#;

/// Every inventory's numbers as the API shows them (src/inventory/store.rs
/// `states`, the inventory's `stock` and `version`), by SKU.
const NUMBERS: &str = r#"
SELECT json_agg(json_build_array(sku, stock, version, reserved, committed, stock + reserved + committed)
                ORDER BY sku)::text
  FROM (SELECT i.sku, i.stock, i.version,
               coalesce(sum(r.quantity) FILTER (WHERE r.status = 'ACTIVE'), 0) AS reserved,
               coalesce(sum(r.quantity) FILTER (WHERE r.status = 'ORDERED'), 0) AS committed
          FROM inventories i LEFT JOIN reservations r ON r.inventory_id = i.id
         GROUP BY i.id) AS n"#;

/// The one text value of `sql`'s one row, `""` for NULL.
async fn text(db: &DatabaseConnection, sql: &str) -> String {
    let row = db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await.expect(sql).expect("a row");
    row.try_get_by_index::<Option<String>>(0).expect("text").unwrap_or_default()
}

/// The numbers of [`NUMBERS`], as JSON.
async fn numbers(db: &DatabaseConnection) -> Value {
    serde_json::from_str(&text(db, NUMBERS).await).expect("json")
}

/// A database of [`BEFORE_LOCATIONS`], migrated up to the migration to
/// locations, written, and then migrated the rest of the way, with what the
/// migration must have done checked; served by an app whose sweeper keeps
/// out of the way (tests sweep by hand); and the numbers of before.
async fn migrated() -> (TestApp, Value) {
    let before_locations = BeforeMigration::new("m20261207_090000_keep_stock_per_location").await;
    let db = &before_locations.db;
    db.execute_unprepared(BEFORE_LOCATIONS).await.expect("write as main wrote");
    assert_eq!(text(db, CHECK_BEFORE_LOCATIONS).await, "", "the check of then holds before");
    let before = numbers(db).await;
    assert_eq!(
        before,
        json!([
            ["MIG-A", 14, 11, 5, 4, 23],
            ["MIG-B", 3, 3, 1, 1, 5],
            ["MIG-C", 12, 4, 0, 0, 12],
            ["MIG-D", 0, 1, 0, 0, 0]
        ])
    );

    before_locations.migrate().await;
    assert_eq!(numbers(db).await, before, "no number changed");
    let levels = "SELECT json_agg(json_build_array(i.sku, l.code, s.available = i.stock, i.sole_location_id = l.id) \
                  ORDER BY i.sku)::text \
                  FROM inventories i JOIN stock_levels s ON s.inventory_id = i.id JOIN locations l ON l.id = s.location_id";
    let levels: Value = serde_json::from_str(&text(db, levels).await).expect("json");
    assert_eq!(
        levels,
        json!([
            ["MIG-A", "default", true, true],
            ["MIG-B", "default", true, true],
            ["MIG-C", "default", true, true],
            ["MIG-D", "default", true, true]
        ]),
        "one level each, at the default location, its sole one, holding all its stock"
    );
    let allocated = "SELECT count(*)::text || ' ' || count(*) FILTER (WHERE a.allocated = ARRAY['default:' || r.quantity]) \
                     FROM reservations r LEFT JOIN LATERAL \
                     (SELECT array_agg(l.code || ':' || a.quantity) AS allocated FROM allocations a \
                       JOIN locations l ON l.id = a.location_id WHERE a.reservation_id = r.id) a ON true";
    assert_eq!(text(db, allocated).await, "8 8", "every reservation, one allocation of all of it at default");
    let checkpoint = "SELECT string_agg(l.code || ':' || c.stock || ':' || c.on_hand, ',') \
                      FROM ledger_checkpoint_levels c JOIN locations l ON l.id = c.location_id";
    assert_eq!(text(db, checkpoint).await, "default:10:10", "the archived sums, at the default location");
    assert_eq!(invariant::check(db).await.expect("check"), vec![], "the check holds after");
    let name = before_locations.hand_over().await;

    let limits = Limits { sweep_interval_ms: 3_600_000, ..Limits::default() };
    let app = TestApp::spawn_with_options(Options { database: Some(name), limits, ..Options::default() }).await;
    (app, before)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_of_before_locations_migrates_with_every_number_the_api_shows_unchanged() {
    let (app, before) = migrated().await;
    for (id, row) in [A, B, C, D].into_iter().zip(before.as_array().expect("rows")) {
        // A row is [sku, stock, version, reserved, committed, onHand]; the API's
        // states are [available (= stock), reserved, committed, onHand].
        let expected = [1, 3, 4, 5].map(|i| row[i].as_i64().expect("a number"));
        assert_eq!(app.states(id).await, expected, "{id} through the API");
    }
    app.assert_invariant().await;
}

/// The statements of now work on what the statements of then wrote.
#[tokio::test(flavor = "multi_thread")]
async fn a_migrated_database_reserves_releases_expires_and_cancels_keeping_the_check() {
    let (app, _) = migrated().await;
    assert_eq!(sweep_all(&app.db, 100).await, 1, "MIG-B's overdue reservation");
    app.assert_invariant().await;

    let erin = app.token("erin", Role::Customer);
    let reserved = app.reserve(&erin, json!({ "inventoryId": A, "quantity": 2 })).await;
    assert_eq!(reserved["__typename"], "Reserved", "{reserved}");
    app.assert_invariant().await;
    let released = app.release(&app.token("alice", Role::Customer), EXPIRING).await;
    assert_eq!(released["__typename"], "ReservationReleased", "{released}");
    app.assert_invariant().await;
    let cancelled = app.cancel(&app.token("bob", Role::Customer), PENDING).await;
    assert_eq!(cancelled["__typename"], "OrderCancelled", "{cancelled}");
    app.assert_invariant().await;

    // 14 - 2 + 3 + 4 at MIG-A (carol's and erin's 2 each still held), 3 + 1 + 1
    // at MIG-B, all at the default level.
    assert_eq!(app.states(A).await, [19, 4, 0, 23]);
    assert_eq!(app.states(B).await, [5, 0, 0, 5]);
    let levels = app.rows("SELECT s.inventory_id, s.available FROM stock_levels s ORDER BY s.inventory_id").await;
    let levels: Vec<_> = levels.iter().map(|l| (uuid(&l["inventory_id"]), l["available"].as_i64())).collect();
    assert_eq!(levels, vec![(A, Some(19)), (B, Some(5)), (C, Some(12)), (D, Some(0))]);
    let allocation = app
        .rows(&format!(
            "SELECT l.code, a.quantity FROM allocations a JOIN locations l ON l.id = a.location_id \
              WHERE a.reservation_id = '{}'",
            uuid(&reserved["reservation"]["id"])
        ))
        .await;
    assert_eq!(allocation, vec![json!({ "code": "default", "quantity": 2 })], "a new reservation, at default");
}

const LEVELS: &str = "query($id: UUID!) { inventory(id: $id) {
    levels { location { code priority active } available reserved committed onHand } } }";

const ALLOCATIONS: &str = "query($id: UUID!) { reservation(id: $id) { allocations { location { code } quantity } } }";

#[tokio::test(flavor = "multi_thread")]
async fn a_shop_that_never_makes_a_location_sees_what_it_saw_before_and_the_default_location() {
    let app = TestApp::spawn().await;
    let id = app.create_inventory("PLAIN-1", 5).await;
    let alice = app.token("alice", Role::Customer);
    let reserved = app.reserve(&alice, json!({ "inventoryId": id, "quantity": 2 })).await;
    let reservation = uuid(&reserved["reservation"]["id"]);
    assert_eq!(
        reserved,
        json!({
            "__typename": "Reserved",
            "reservation": { "id": reservation, "quantity": 2, "status": "ACTIVE", "userId": "alice" },
            "inventory": { "id": id, "stock": 3, "version": 2 }
        }),
        "the answer of before, field for field"
    );
    // The data of before; `extensions` now carries the request's cost.
    let states = app.graphql(None, crate::documents::STOCK_STATES, json!({ "id": id })).await;
    assert_eq!(
        states["data"],
        json!({ "inventory": {
            "stock": 3, "version": 2, "available": 3, "reserved": 2, "committed": 0, "onHand": 5
        } })
    );

    // The new fields say where it all is: the default location.
    let levels = app.graphql(None, LEVELS, json!({ "id": id })).await;
    assert_eq!(
        levels["data"],
        json!({ "inventory": { "levels": [{
            "location": { "code": "default", "priority": 0, "active": true },
            "available": 3, "reserved": 2, "committed": 0, "onHand": 5
        }] } })
    );
    let allocations = app.graphql(Some(&alice), ALLOCATIONS, json!({ "id": reservation })).await;
    assert_eq!(
        allocations["data"],
        json!({ "reservation": { "allocations": [{ "location": { "code": "default" }, "quantity": 2 }] } })
    );
    app.assert_invariant().await;
}
