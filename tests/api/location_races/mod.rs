//! Proof under contention for stock per location (issue 26, item 6): many
//! requests lined up behind one barrier, over real HTTP, at every isolation
//! level, and every number read back from the database afterwards.
//!
//! - `reserving`: reserves with random strategies, location lists and split
//!   settings on three small locations never over-allocate one; reserveMany
//!   lines naming locations (and inventories) in opposite orders never
//!   deadlock and stay all or nothing;
//! - `moving`: transfers both ways, reserves, releases, restocks and sweeps
//!   at once conserve stock;
//! - `processes`: two server processes with overlapping batches never
//!   deadlock, and each round's answers are exactly what it wrote;
//! - `sharing`: coalesced reserves on an inventory held in several places
//!   share statements and each takes what `allocate` gives it alone.
//!
//! Each test prints (`eprintln!`) its rounds, requests and outcome counts.
//! The checks per location here ([`assert_levels_add_up`]) are on top of
//! [`crate::helpers::TestApp::assert_invariant`], which checks each
//! inventory as a whole.

mod moving;
mod processes;
mod reserving;
mod sharing;

use std::collections::BTreeMap;

use rand::{RngExt as _, rngs::StdRng, seq::SliceRandom};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use serde_json::{Value, json};
use stockguard::config::Limits;
use stockguard::stock::allocating::{Allocating, Strategy};
use uuid::Uuid;

use crate::helpers::{Isolation, Options, TestApp, uuid};

/// `reserve`, answering with where the units came from.
pub const RESERVE_AT: &str = "mutation($input: ReserveInput!) { reserve(input: $input) { __typename
  ... on Reserved { reservation { id quantity allocations { location { id } quantity } } }
  ... on SoldOut { requested available }
  ... on Conflict { expectedVersion }
  ... on InventoryNotFound { inventoryId } } }";

/// `reserveMany`, answering with where each line's units came from.
pub const RESERVE_MANY_AT: &str = "mutation($input: ReserveManyInput!) { reserveMany(input: $input) { __typename
  ... on ReservedAll { reservations { id quantity inventory { id } allocations { location { id } quantity } } }
  ... on ItemsUnavailable { items { inventoryId reason available } } } }";

/// `createInventory` at a location.
pub const CREATE_AT: &str = "mutation($input: CreateInventoryInput!) { createInventory(input: $input) { id } }";

/// `restock`, answering with its typename.
pub const RESTOCK_AT: &str = "mutation($input: RestockInput!) { restock(input: $input) { __typename } }";

/// A test server whose database defaults to `isolation`, with `limits`, on
/// a pool of 5: enough for the requests of a round to contend (the machine
/// has two cores), and few enough that these tests, side by side with the
/// rest on one PostgreSQL of 100 connections, do not run out of them
/// ("too many clients" fails a request with INTERNAL).
pub async fn spawn(isolation: Isolation, limits: Limits) -> TestApp {
    TestApp::spawn_with_options(Options { isolation, limits, pool_size: 5, ..Options::default() }).await
}

/// Creates an inventory holding `levels` (location, units): created at the
/// first location, restocked at the others (a level of 0 stays unwritten).
pub async fn stocked_at(app: &TestApp, sku: &str, levels: &[(Uuid, i32)]) -> Uuid {
    let operator = app.operator();
    let (first, stock) = levels[0];
    let input = json!({ "sku": sku, "name": sku, "stock": stock, "locationId": first });
    let created = app.mutate(&operator, "createInventory", CREATE_AT, json!({ "input": input })).await;
    let id = uuid(&created["id"]);
    for &(location, quantity) in levels[1..].iter().filter(|(_, quantity)| *quantity > 0) {
        let input = json!({ "inventoryId": id, "quantity": quantity, "locationId": location });
        let restocked = app.mutate(&operator, "restock", RESTOCK_AT, json!({ "input": input })).await;
        assert_eq!(restocked["__typename"], "Restocked", "{restocked}");
    }
    id
}

/// A random choice of locations among `locations`: a third name none, the
/// rest a random non-empty subset in random order; either strategy; splits
/// allowed or not.
pub fn random_choice(rng: &mut StdRng, locations: &[Uuid]) -> Allocating {
    let location_ids = (rng.random_range(0..3) > 0).then(|| {
        let mut ids: Vec<Uuid> = locations.iter().copied().filter(|_| rng.random_bool(0.6)).collect();
        if ids.is_empty() {
            ids.push(locations[rng.random_range(0..locations.len())]);
        }
        ids.shuffle(rng);
        ids
    });
    let strategy = if rng.random_bool(0.5) { Strategy::Priority } else { Strategy::FewestLocations };
    Allocating { location_ids, strategy, allow_split: rng.random_bool(0.5) }
}

/// `input` with `choice`'s `locationIds` (when given), `strategy` and `allowSplit`.
pub fn with_choice(mut input: Value, choice: &Allocating) -> Value {
    let strategy = match choice.strategy {
        Strategy::Priority => "PRIORITY",
        Strategy::FewestLocations => "FEWEST_LOCATIONS",
    };
    input["strategy"] = json!(strategy);
    input["allowSplit"] = json!(choice.allow_split);
    if let Some(ids) = &choice.location_ids {
        input["locationIds"] = json!(ids);
    }
    input
}

/// The locations `choice` may take from, given the `active` ones.
pub fn eligible(choice: &Allocating, active: &[Uuid]) -> Vec<Uuid> {
    match &choice.location_ids {
        Some(ids) => ids.iter().copied().filter(|id| active.contains(id)).collect(),
        None => active.to_vec(),
    }
}

/// A reservation's allocations as `(location, units)`.
pub fn allocations(reservation: &Value) -> Vec<(Uuid, i64)> {
    let allocations = reservation["allocations"].as_array().unwrap_or_else(|| panic!("no allocations: {reservation}"));
    allocations.iter().map(|a| (uuid(&a["location"]["id"]), a["quantity"].as_i64().expect("units"))).collect()
}

/// Asserts what one reservation's allocations must be whatever the order the
/// requests ran in: they add up to its quantity, each is positive and at a
/// distinct location among `eligible` (the active ones, narrowed to the
/// request's `locationIds` when given), and there is one unless it could
/// split.
pub fn assert_allocated(reservation: &Value, eligible: &[Uuid], allow_split: bool) {
    let allocated = allocations(reservation);
    let units: i64 = allocated.iter().map(|(_, units)| units).sum();
    assert_eq!(Some(units), reservation["quantity"].as_i64(), "the allocations add up: {reservation}");
    assert!(allocated.iter().all(|(at, units)| *units > 0 && eligible.contains(at)), "{reservation} from {eligible:?}");
    let mut at: Vec<Uuid> = allocated.iter().map(|(at, _)| *at).collect();
    at.sort_unstable();
    at.dedup();
    assert_eq!(at.len(), allocated.len(), "one allocation per location: {reservation}");
    assert!(allow_split || allocated.len() == 1, "split without allowSplit: {reservation}");
}

/// How many answers had each typename (`ERROR` for an error body), for the
/// printed round counts and the assertions on them.
pub fn outcomes<'a>(typenames: impl IntoIterator<Item = &'a str>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for name in typenames {
        *counts.entry(name.to_owned()).or_insert(0) += 1;
    }
    counts
}

/// Asserts that every answer's typename is one of `allowed`: no error of any
/// kind (no deadlock, serialization failure or INTERNAL reaching a client).
pub fn assert_only(counts: &BTreeMap<String, usize>, allowed: &[&str], answers: &[Value]) {
    let name = |a: &Value| match a["__typename"].as_str() {
        Some(typename) => typename.to_owned(),
        None => a["errors"][0]["extensions"]["code"].as_str().unwrap_or("ERROR").to_owned(),
    };
    let unexpected: Vec<&Value> = answers.iter().filter(|a| !allowed.contains(&name(a).as_str())).collect();
    assert!(unexpected.is_empty(), "{counts:?}; unexpected answers: {unexpected:?}");
}

/// Every level that does not add up, straight from the tables in one
/// statement (one snapshot): per inventory and location, with rows of
/// before the locations (location NULL) counting at `default`,
///
/// - `available >= 0`;
/// - the ledger's changes of available stock add up to `available`;
/// - received + transferred in − transferred out − fulfilled (the ledger's
///   on-hand changes) = available + the units of the ACTIVE and ORDERED
///   allocations there;
///
/// and per inventory `stock` = the sum of its levels, and per ACTIVE or
/// ORDERED reservation its allocations add up to its quantity.
pub async fn level_drifts(db: &DatabaseConnection) -> Vec<Value> {
    let sql = r#"
WITH home AS (SELECT id FROM locations WHERE code = 'default'),
ledger AS (
    SELECT inventory_id, location_id, sum(available) AS available, sum(on_hand) AS on_hand
      FROM (SELECT inventory_id, coalesce(location_id, (SELECT id FROM home)) AS location_id,
                   sum(delta) FILTER (WHERE reason <> 'FULFILLED') AS available,
                   sum(delta) FILTER (WHERE reason IN ('CREATED', 'RESTOCKED', 'TRANSFERRED_IN',
                                                      'TRANSFERRED_OUT', 'FULFILLED')) AS on_hand
              FROM stock_movements GROUP BY 1, 2
            UNION ALL
            SELECT inventory_id, location_id, stock, on_hand FROM ledger_checkpoint_levels) AS parts
     GROUP BY 1, 2
), held AS (
    SELECT r.inventory_id, a.location_id, sum(a.quantity) AS held
      FROM allocations a JOIN reservations r ON r.id = a.reservation_id
     WHERE r.status IN ('ACTIVE', 'ORDERED') GROUP BY 1, 2
), places AS (
    SELECT inventory_id, location_id FROM stock_levels
    UNION SELECT inventory_id, location_id FROM ledger
    UNION SELECT inventory_id, location_id FROM held
), levels AS (
    SELECT p.inventory_id, p.location_id, s.available, coalesce(l.available, 0) AS ledger_available,
           coalesce(l.on_hand, 0) AS ledger_on_hand, coalesce(h.held, 0) AS held
      FROM places p
      LEFT JOIN stock_levels s USING (inventory_id, location_id)
      LEFT JOIN ledger l USING (inventory_id, location_id)
      LEFT JOIN held h USING (inventory_id, location_id)
), drifts AS (
    SELECT 'level' AS kind, to_jsonb(v) AS row FROM levels v
     WHERE NOT (coalesce(available, 0) >= 0 AND coalesce(available, 0) = ledger_available
                AND ledger_on_hand = coalesce(available, 0) + held)
    UNION ALL
    SELECT 'inventory', jsonb_build_object('id', i.id, 'stock', i.stock, 'levels', s.sum)
      FROM inventories i LEFT JOIN (SELECT inventory_id, sum(available) FROM stock_levels GROUP BY 1) s
        ON s.inventory_id = i.id
     WHERE i.stock <> coalesce(s.sum, 0)
    UNION ALL
    SELECT 'reservation', jsonb_build_object('id', r.id, 'quantity', r.quantity, 'allocated', a.sum)
      FROM reservations r LEFT JOIN (SELECT reservation_id, sum(quantity) FROM allocations GROUP BY 1) a
        ON a.reservation_id = r.id
     WHERE r.status IN ('ACTIVE', 'ORDERED') AND r.quantity <> coalesce(a.sum, 0)
)
SELECT coalesce(jsonb_agg(jsonb_build_object('kind', kind, 'row', row)), '[]')::text FROM drifts"#;
    let row = db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await.expect("query").expect("row");
    let text: String = row.try_get_by_index(0).expect("json text");
    match serde_json::from_str(&text).expect("json") {
        Value::Array(drifts) => drifts,
        other => panic!("not an array: {other}"),
    }
}

/// Fails the test when any level, inventory or holding reservation does not
/// add up ([`level_drifts`]), or the whole-inventory invariant is broken.
pub async fn assert_levels_add_up(db: &DatabaseConnection) {
    let drifts = level_drifts(db).await;
    assert!(drifts.is_empty(), "levels do not add up: {drifts:#?}");
    let drifts = stockguard::invariant::check(db).await.expect("check");
    assert!(drifts.is_empty(), "invariant broken: {drifts:?}");
}

/// Each location's available units of `inventory`, from the database.
pub async fn available_at(app: &TestApp, inventory: Uuid) -> BTreeMap<Uuid, i64> {
    let rows =
        app.rows(&format!("SELECT location_id, available FROM stock_levels WHERE inventory_id = '{inventory}'")).await;
    rows.iter().map(|row| (uuid(&row["location_id"]), row["available"].as_i64().expect("available"))).collect()
}
