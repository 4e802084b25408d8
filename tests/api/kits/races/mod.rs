//! Kits under contention (issue 48, part 6), at every isolation level,
//! several rounds each, every round checked against the database (the
//! check, each level's units replayed from the ledger, and reads of our
//! own): a randomized mix of kits, a nested kit, a pack and single
//! reserves of the same inventories over three locations never oversells a
//! level nor takes safety stock, and the kits' units are exactly what
//! their answers say; a reader beside reserves, releases, extensions and
//! the sweeper never sees a partial kit, in SQL or through the API; kits
//! naming inventories and locations in opposite orders never deadlock;
//! releases, double releases and the sweeper racing them return each kit
//! reservation's units once, to the locations they came from.
//!
//! - `mixing`: the mix;
//! - `reading`: the readers, beside the mix and across an expiry;
//! - `ordering`: opposite orders;
//! - `returning`: releases, double releases and the sweeper.
//!
//! The random numbers come from fixed seeds, printed with each test's
//! counts, so a failure reproduces. What the modules share is here.

mod mixing;
mod ordering;
mod reading;
mod returning;

use std::{collections::BTreeMap, sync::Arc};

use futures::{FutureExt, future::BoxFuture};
use serde_json::{Value, json};
use stockguard::{auth::Role, stock::allocating::Allocating};
use uuid::Uuid;

use super::kit_of;
use crate::{
    documents::RELEASE_KIT,
    helpers::{TestApp, sweep_all, uuid},
    location_races::{RESERVE_AT, assert_allocated, eligible, outcomes, with_choice},
    locations::{create_location, default_location, stocked},
    transfers::transfer,
};

/// Rounds of each race per isolation level, each on fresh inventories and kits.
const ROUNDS: usize = 3;

/// Fixed, so a failure reproduces; each test adds its own offset.
const SEED: u64 = 0x4806;

/// `reserveKit`, answering each component's units and where they came from.
pub const RESERVE_KIT_AT: &str = "mutation($input: ReserveKitInput!) { reserveKit(input: $input) { __typename
   ... on KitReserved { kitReservation { id nodeId quantity status
       reservations { id quantity status inventory { id } allocations { location { id } quantity } } } }
   ... on KitSoldOut { requested available components { inventoryId reason available } }
   ... on KitNotFound { kitId } } }";

/// A kit of a round: its id and its flattened components `(inventory, per kit)`.
#[derive(Debug, Clone)]
struct Kit {
    id: Uuid,
    components: Vec<(Uuid, i64)>,
}

impl Kit {
    /// A new kit `sku` of `given` (JSON component inputs), flattened to `components`.
    async fn new(app: &TestApp, sku: &str, given: Value, mut components: Vec<(Uuid, i64)>) -> Self {
        components.sort();
        Self { id: kit_of(app, sku, given).await, components }
    }
}

/// One request of a race, named by its kind, with its answer.
type Raced = BoxFuture<'static, (&'static str, Value)>;

/// The `__typename` of an answer, or its error code (`ERROR` without one).
fn name_of(answer: &Value) -> &str {
    answer["__typename"].as_str().or_else(|| answer["errors"][0]["extensions"]["code"].as_str()).unwrap_or("ERROR")
}

/// Asserts that every answer is one of `allowed` (no error of any kind
/// reached a client: no deadlock, serialization failure, exhausted retry
/// or INTERNAL), naming `what` and the counts.
fn assert_answered(answers: &[(&'static str, Value)], allowed: &[&str], what: &str) -> BTreeMap<String, usize> {
    let counts =
        outcomes(answers.iter().map(|(kind, answer)| if name_of(answer) == "ERROR" { *kind } else { name_of(answer) }));
    let unexpected: Vec<&(&str, Value)> = answers.iter().filter(|(_, a)| !allowed.contains(&name_of(a))).collect();
    assert!(unexpected.is_empty(), "{what}: {counts:?}; unexpected answers: {unexpected:#?}");
    counts
}

/// `reserveKit` of `kit` as `user`, with `choice`, as a race's request.
fn reserving_kit(app: &Arc<TestApp>, user: String, kit: Uuid, quantity: i64, choice: &Allocating) -> Raced {
    let (app, input) = (app.clone(), with_choice(json!({ "kitId": kit, "quantity": quantity }), choice));
    async move {
        let token = app.token(&user, Role::Customer);
        ("reserveKit", app.mutate(&token, "reserveKit", RESERVE_KIT_AT, json!({ "input": input })).await)
    }
    .boxed()
}

/// `reserve` of `inventory` as `user`, with `choice`, as a race's request.
fn reserving_one(app: &Arc<TestApp>, user: String, inventory: Uuid, quantity: i64, choice: &Allocating) -> Raced {
    let (app, input) = (app.clone(), with_choice(json!({ "inventoryId": inventory, "quantity": quantity }), choice));
    async move {
        let token = app.token(&user, Role::Customer);
        ("reserve", app.mutate(&token, "reserve", RESERVE_AT, json!({ "input": input })).await)
    }
    .boxed()
}

/// `releaseKitReservation` of `id` as its owner `user`, as a race's request.
fn releasing_kit(app: &Arc<TestApp>, user: &str, id: Uuid) -> Raced {
    let (app, user) = (app.clone(), user.to_owned());
    async move {
        let token = app.token(&user, Role::Customer);
        ("releaseKit", app.mutate(&token, "releaseKitReservation", RELEASE_KIT, json!({ "id": id })).await)
    }
    .boxed()
}

/// Both sweepers' work as a race's request: every due reservation
/// expired, in batches of `batch`; the answer is how many.
fn sweeping(app: &Arc<TestApp>, batch: i64) -> Raced {
    let app = app.clone();
    async move { ("sweep", json!({ "__typename": "Swept", "expired": sweep_all(&app.db, batch).await })) }.boxed()
}

/// Asserts that a `KitReserved` answer holds `quantity` of `kit` whole: one
/// ACTIVE reservation per component of kits × its quantity, each allocated
/// as `choice` allows among `active`; the units per inventory.
fn assert_whole(answer: &Value, kit: &Kit, quantity: i64, choice: &Allocating, active: &[Uuid]) -> Vec<(Uuid, i64)> {
    let held = &answer["kitReservation"];
    assert_eq!((&held["quantity"], &held["status"]), (&json!(quantity), &json!("ACTIVE")), "{answer}");
    let parts = held["reservations"].as_array().unwrap_or_else(|| panic!("no reservations: {answer}"));
    let mut units: Vec<(Uuid, i64)> =
        parts.iter().map(|p| (uuid(&p["inventory"]["id"]), p["quantity"].as_i64().expect("units"))).collect();
    units.sort();
    let expected: Vec<(Uuid, i64)> = kit.components.iter().map(|&(at, per)| (at, per * quantity)).collect();
    assert_eq!(units, expected, "one reservation per component, kits × its quantity: {answer}");
    for part in parts {
        assert_eq!(part["status"], "ACTIVE", "{answer}");
        assert_allocated(part, &eligible(choice, active), choice.allow_split);
    }
    units
}

/// Per `(inventory, location)` of `inventories`: available, safety stock,
/// and the units ACTIVE reservations hold there, all of them and those of
/// kit reservations, from the database in one statement.
async fn levels(app: &TestApp, inventories: &[Uuid]) -> BTreeMap<(Uuid, Uuid), [i64; 4]> {
    let ids: Vec<String> = inventories.iter().map(|id| format!("'{id}'")).collect();
    let rows = app
        .rows(&format!(
            "SELECT s.inventory_id, s.location_id, s.available, s.safety_stock,
                    coalesce(sum(a.quantity), 0)::bigint AS held,
                    coalesce(sum(a.quantity) FILTER (WHERE r.kit_reservation_id IS NOT NULL), 0)::bigint AS kits
               FROM stock_levels s
               LEFT JOIN reservations r ON r.inventory_id = s.inventory_id AND r.status = 'ACTIVE'
               LEFT JOIN allocations a ON a.reservation_id = r.id AND a.location_id = s.location_id
              WHERE s.inventory_id IN ({})
              GROUP BY 1, 2, 3, 4",
            ids.join(",")
        ))
        .await;
    let n = |row: &Value, column: &str| row[column].as_i64().unwrap_or_else(|| panic!("{column} in {row}"));
    rows.iter()
        .map(|row| {
            let key = (uuid(&row["inventory_id"]), uuid(&row["location_id"]));
            (key, [n(row, "available"), n(row, "safety_stock"), n(row, "held"), n(row, "kits")])
        })
        .collect()
}

/// `units` of `inventory` moved from `from` to `to` by an operator.
async fn move_units(app: &TestApp, inventory: Uuid, from: Uuid, to: Uuid, units: i32) {
    let input = json!({ "inventoryId": inventory, "fromLocationId": from, "toLocationId": to, "quantity": units });
    let moved = transfer(app, &app.operator(), input).await;
    assert_eq!(moved["__typename"], "StockTransferred", "{moved}");
}

/// Three active locations: default (priority 0), north (10), south (20).
async fn three_locations(app: &TestApp) -> [Uuid; 3] {
    [default_location(app).await, create_location(app, "north", 10).await, create_location(app, "south", 20).await]
}

/// An inventory of `levels` units at each of `at`: made at the first,
/// moved to the others.
async fn spread(app: &TestApp, sku: &str, at: &[Uuid; 3], levels: [i32; 3]) -> Uuid {
    let item = stocked(app, sku, levels.iter().sum()).await;
    for (to, units) in at[1..].iter().zip(&levels[1..]) {
        if *units > 0 {
            move_units(app, item, at[0], *to, *units).await;
        }
    }
    item
}
