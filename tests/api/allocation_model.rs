//! A property test of allocation: random location layouts and random carts,
//! one at a time through the API, each outcome compared with
//! `stockguard::stock::allocating::model` (the rules in Rust) applied to
//! the eligible levels in order of preference. The server decides in SQL
//! (the `allocate` function inside each taking statement); the two must
//! agree on success, on what each location gives, and on the `available`
//! a refusal reports.
//!
//! The random numbers come from a fixed seed, and every failure names the
//! seed and the case, so it reproduces.

use std::collections::BTreeMap;

use rand::{RngExt as _, SeedableRng, rngs::StdRng};
use serde_json::{Value, json};
use stockguard::{
    auth::Role,
    stock::allocating::{Allocating, model},
};
use uuid::Uuid;

use crate::{
    helpers::{Isolation, at_every_isolation, uuid},
    location_races::{RESERVE_AT, RESERVE_MANY_AT, allocations, available_at, random_choice, stocked_at, with_choice},
    locations::{UPDATE_LOCATION, create_location},
};

/// Cases per test.
const CASES: usize = 50;

/// Fixed, so a failure reproduces.
const SEED: u64 = 0x2656;

/// One location of a case's layout.
struct Place {
    id: Uuid,
    code: String,
    priority: i32,
    active: bool,
}

/// One line of a cart, on an inventory of its own, and what the model says
/// of it.
struct Line {
    inventory: Uuid,
    quantity: i32,
    choice: Allocating,
    /// The inventory's available units at each location of the layout.
    levels: BTreeMap<Uuid, i64>,
    /// What each eligible location gives, or `None`: sold out.
    expected: Option<BTreeMap<Uuid, i64>>,
    /// What a refusal reports: the eligible levels' sum, or with no split
    /// the largest one.
    available: i64,
}

/// The eligible levels of `levels` for `choice`, in order of preference
/// (the list's order when given, else priority then code; inactive ones
/// skipped), as the model takes them: `(location, available)`.
fn preferred(layout: &[Place], levels: &BTreeMap<Uuid, i64>, choice: &Allocating) -> Vec<(Uuid, i64)> {
    let mut places: Vec<&Place> = match &choice.location_ids {
        Some(ids) => ids.iter().filter_map(|id| layout.iter().find(|p| p.id == *id)).collect(),
        None => {
            let mut all: Vec<&Place> = layout.iter().collect();
            all.sort_by(|a, b| (a.priority, &a.code).cmp(&(b.priority, &b.code)));
            all
        }
    };
    places.retain(|p| p.active);
    places.iter().map(|p| (p.id, levels.get(&p.id).copied().unwrap_or(0))).collect()
}

/// What the model says of a line of `quantity` on `levels`.
fn expect(
    layout: &[Place],
    levels: &BTreeMap<Uuid, i64>,
    quantity: i32,
    choice: &Allocating,
) -> (Option<BTreeMap<Uuid, i64>>, i64) {
    let eligible = preferred(layout, levels, choice);
    let available: Vec<i32> = eligible.iter().map(|(_, units)| i32::try_from(*units).expect("small")).collect();
    let taken = model(&available, quantity, choice.strategy, choice.allow_split).map(|take| {
        eligible
            .iter()
            .zip(take)
            .filter(|(_, units)| *units > 0)
            .map(|((at, _), units)| (*at, i64::from(units)))
            .collect()
    });
    let reported =
        if choice.allow_split { available.iter().sum::<i32>() } else { available.iter().copied().max().unwrap_or(0) };
    (taken, i64::from(reported))
}

/// The allocations of a reservation as a map, location to units.
fn allocated(reservation: &Value) -> BTreeMap<Uuid, i64> {
    allocations(reservation).into_iter().collect()
}

/// A random layout: 2 to 5 locations with priorities 0 to 3 (ties broken
/// by code), about a quarter of them inactive, each case's its own (earlier
/// cases' locations hold nothing of this case's inventories, so being
/// eligible changes nothing); then 1 to 3 inventories, each with 0 to 9
/// units at each location (stocked before the inactive ones close), and a
/// cart with a line on each: 1 to 6 units, a random strategy, location list
/// (which may name inactive locations) and split setting. A cart of one
/// line goes through `reserve` half the time, else through `reserveMany`.
/// Every outcome is the model's: success or not, the units per location of
/// each reservation, and the `available` of each refused line; the levels
/// afterwards are the levels before less what was taken.
async fn every_cart_is_allocated_as_the_model_says(isolation: Isolation) {
    let app = crate::location_races::spawn(isolation, stockguard::config::Limits::default()).await;
    let operator = app.operator();
    let customer = app.token("shopper", Role::Customer);
    let mut rng = StdRng::seed_from_u64(SEED);
    let mut outcomes: BTreeMap<&str, usize> = BTreeMap::new();
    for case in 0..CASES {
        let context = format!("seed {SEED:#x}, case {case}");
        let mut layout = Vec::new();
        for i in 0..rng.random_range(2..=5) {
            let (code, priority) = (format!("k{case:03}l{i}"), rng.random_range(0..4));
            let id = create_location(&app, &code, priority).await;
            layout.push(Place { id, code, priority, active: rng.random_range(0..4) > 0 });
        }
        let ids: Vec<Uuid> = layout.iter().map(|p| p.id).collect();
        let mut lines = Vec::new();
        for n in 0..rng.random_range(1..=3) {
            let stock: Vec<(Uuid, i32)> = ids.iter().map(|&at| (at, rng.random_range(0..=9))).collect();
            let inventory = stocked_at(&app, &format!("MODEL-{case}-{n}"), &stock).await;
            let levels = stock.iter().map(|&(at, units)| (at, i64::from(units))).collect();
            let (quantity, choice) = (rng.random_range(1..=6), random_choice(&mut rng, &ids));
            let (expected, available) = expect(&layout, &levels, quantity, &choice);
            lines.push(Line { inventory, quantity, choice, levels, expected, available });
        }
        for place in layout.iter().filter(|p| !p.active) {
            let input = json!({ "input": { "id": place.id, "active": false } });
            assert_eq!(app.mutate(&operator, "updateLocation", UPDATE_LOCATION, input).await["active"], false);
        }
        let inputs: Vec<Value> = lines
            .iter()
            .map(|l| with_choice(json!({ "inventoryId": l.inventory, "quantity": l.quantity }), &l.choice))
            .collect();
        let describe: Vec<String> = lines
            .iter()
            .map(|l| {
                format!(
                    "{} of {:?} by {:?}: model {:?}, available {}",
                    l.quantity, l.levels, l.choice, l.expected, l.available
                )
            })
            .collect();
        let context = format!("{context}: {describe:#?}");
        let served = lines.iter().all(|l| l.expected.is_some());

        if lines.len() == 1 && rng.random_bool(0.5) {
            let answer = app.mutate(&customer, "reserve", RESERVE_AT, json!({ "input": inputs[0] })).await;
            let line = &lines[0];
            match &line.expected {
                Some(expected) => {
                    assert_eq!(answer["__typename"], "Reserved", "{context}: {answer}");
                    assert_eq!(&allocated(&answer["reservation"]), expected, "{context}: {answer}");
                }
                None => assert_eq!(
                    (&answer["__typename"], &answer["available"]),
                    (&json!("SoldOut"), &json!(line.available)),
                    "{context}: {answer}"
                ),
            }
            *outcomes.entry(if served { "Reserved" } else { "SoldOut" }).or_insert(0) += 1;
        } else {
            let answer =
                app.mutate(&customer, "reserveMany", RESERVE_MANY_AT, json!({ "input": { "items": inputs } })).await;
            if served {
                assert_eq!(answer["__typename"], "ReservedAll", "{context}: {answer}");
                let reservations = answer["reservations"].as_array().expect("reservations");
                assert_eq!(reservations.len(), lines.len(), "{context}: {answer}");
                for line in &lines {
                    let reservation = reservations.iter().find(|r| uuid(&r["inventory"]["id"]) == line.inventory);
                    let reservation = reservation.unwrap_or_else(|| panic!("{context}: a line is missing: {answer}"));
                    assert_eq!(Some(allocated(reservation)), line.expected, "{context}: {answer}");
                }
            } else {
                assert_eq!(answer["__typename"], "ItemsUnavailable", "{context}: {answer}");
                let mut refused: Vec<(Uuid, Value, Value)> = answer["items"]
                    .as_array()
                    .expect("items")
                    .iter()
                    .map(|item| (uuid(&item["inventoryId"]), item["reason"].clone(), item["available"].clone()))
                    .collect();
                let mut expected: Vec<(Uuid, Value, Value)> = lines
                    .iter()
                    .filter(|l| l.expected.is_none())
                    .map(|l| (l.inventory, json!("SOLD_OUT"), json!(l.available)))
                    .collect();
                refused.sort_by_key(|(id, _, _)| *id);
                expected.sort_by_key(|(id, _, _)| *id);
                assert_eq!(refused, expected, "{context}: only the refused lines, each with what it could have had");
            }
            *outcomes.entry(if served { "ReservedAll" } else { "ItemsUnavailable" }).or_insert(0) += 1;
        }
        for line in &lines {
            let mut left = line.levels.clone();
            for (at, units) in line.expected.iter().filter(|_| served).flatten() {
                *left.entry(*at).or_insert(0) -= units;
            }
            left.retain(|_, units| *units > 0);
            let mut now = available_at(&app, line.inventory).await;
            now.retain(|_, units| *units > 0);
            assert_eq!(now, left, "{context}: the levels lost exactly what was taken");
        }
    }
    app.assert_invariant().await;
    crate::location_races::assert_levels_add_up(&app.db).await;
    eprintln!("every_cart_is_allocated_as_the_model_says {isolation:?} (seed {SEED:#x}): {CASES} cases: {outcomes:?}");
}

at_every_isolation! {
    every_cart_is_allocated_as_the_model_says;
}
