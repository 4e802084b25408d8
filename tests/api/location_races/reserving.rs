//! Reserves at once on small locations: random strategies, location lists
//! and split settings never over-allocate a location, and reserveMany lines
//! naming locations and inventories in opposite orders never deadlock and
//! stay all or nothing.

use std::{collections::BTreeMap, sync::Arc};

use futures::FutureExt;
use rand::{RngExt as _, SeedableRng, rngs::StdRng};
use serde_json::{Value, json};
use stockguard::{auth::Role, config::Limits, stock::allocating::Allocating};
use uuid::Uuid;

use super::{
    RESERVE_AT, RESERVE_MANY_AT, allocations, assert_allocated, assert_levels_add_up, assert_only, available_at,
    eligible, outcomes, random_choice, stocked_at, with_choice,
};
use crate::{
    helpers::{Isolation, TestApp, at_every_isolation, at_once, uuid},
    locations::{UPDATE_LOCATION, create_location},
};

/// Rounds per test, each on fresh inventories.
const ROUNDS: usize = 3;

/// Requests lined up in each round.
const REQUESTS: usize = 60;

/// Fixed, so a failure reproduces; printed with the counts.
const SEED: u64 = 0x2606;

/// Units reserved at each location, summed over Reserved answers.
fn taken(reservations: &[Value]) -> BTreeMap<Uuid, i64> {
    let mut taken = BTreeMap::new();
    for (at, units) in reservations.iter().flat_map(allocations) {
        *taken.entry(at).or_insert(0) += units;
    }
    taken
}

/// Asserts that each location of `inventory` gave exactly what the answers
/// say it gave: what it had = what it has + what the answers took there,
/// and the ACTIVE allocations in the database say the same.
async fn assert_conserved(app: &TestApp, inventory: Uuid, initial: &[(Uuid, i32)], taken: &BTreeMap<Uuid, i64>) {
    let left = available_at(app, inventory).await;
    let held = app
        .rows(&format!(
            "SELECT a.location_id, sum(a.quantity)::bigint AS units FROM allocations a
               JOIN reservations r ON r.id = a.reservation_id
              WHERE r.inventory_id = '{inventory}' AND r.status = 'ACTIVE' GROUP BY 1"
        ))
        .await;
    let held: BTreeMap<Uuid, i64> =
        held.iter().map(|row| (uuid(&row["location_id"]), row["units"].as_i64().expect("units"))).collect();
    assert_eq!(&held, taken, "the database holds what the answers took");
    for (at, had) in initial {
        let (now, gave) = (left.get(at).copied().unwrap_or(0), taken.get(at).copied().unwrap_or(0));
        assert!(now >= 0, "{at} went negative: {left:?}");
        assert_eq!(i64::from(*had), now + gave, "{at} had {had}, has {now}, gave {gave}");
    }
}

/// Three active locations of 3 to 7 units each and a deactivated one that
/// also holds units, per round a fresh inventory, and sixty reserves of 1
/// to 4 units at once, each with a random strategy, a random list of
/// locations (a random subset in random order, sometimes naming the
/// inactive one, or none) and a random split setting. Every answer is
/// `Reserved` or `SoldOut` (or `Conflict`, when collision retries run out,
/// as docs/operations.md says; counted): a reservation's allocations add up to its
/// quantity, at eligible locations only, split only when allowed; a
/// `SoldOut` reports fewer units than asked (stock only falls in a round);
/// no location gives more than it had, and the locations' units add up to
/// what they had.
async fn reserves_with_random_choices_never_over_allocate_a_location(isolation: Isolation) {
    let app = Arc::new(super::spawn(isolation, Limits::default()).await);
    let mut active = Vec::new();
    for (code, priority) in [("a", 10), ("b", 20), ("c", 20)] {
        active.push(create_location(&app, code, priority).await);
    }
    let closed = create_location(&app, "closed", 5).await;
    let every: Vec<Uuid> = active.iter().copied().chain([closed]).collect();
    let mut rng = StdRng::seed_from_u64(SEED);
    let mut rounds = Vec::new();
    for round in 0..ROUNDS {
        let levels: Vec<(Uuid, i32)> = every.iter().map(|&at| (at, rng.random_range(3..=7))).collect();
        rounds.push((stocked_at(&app, &format!("RACE-ANY-{round}"), &levels).await, levels));
    }
    let update = json!({ "input": { "id": closed, "active": false } });
    let closing = app.mutate(&app.operator(), "updateLocation", UPDATE_LOCATION, update).await;
    assert_eq!(closing["active"], false, "{closing}");

    let mut answered = Vec::new();
    for (round, (item, levels)) in rounds.iter().enumerate() {
        let requests: Vec<(i64, Allocating)> =
            (0..REQUESTS).map(|_| (rng.random_range(1..=4), random_choice(&mut rng, &every))).collect();
        let calls = requests.iter().enumerate().map(|(n, (quantity, choice))| {
            let (app, input) = (app.clone(), with_choice(json!({ "inventoryId": item, "quantity": quantity }), choice));
            async move {
                let token = app.token(&format!("any-{round}-{n}"), Role::Customer);
                app.mutate(&token, "reserve", RESERVE_AT, json!({ "input": input })).await
            }
            .boxed()
        });
        let answers = at_once(calls.collect()).await;
        let counts = outcomes(answers.iter().map(|a| a["__typename"].as_str().unwrap_or("ERROR")));
        assert_only(&counts, &["Reserved", "SoldOut", "Conflict"], &answers);
        let mut reservations = Vec::new();
        for (answer, (quantity, choice)) in answers.iter().zip(&requests) {
            let context = format!("seed {SEED:#x}, round {round}, {choice:?}");
            if answer["__typename"] == "Reserved" {
                let reservation = &answer["reservation"];
                assert_eq!(reservation["quantity"], *quantity, "{context}: {answer}");
                assert_allocated(reservation, &eligible(choice, &active), choice.allow_split);
                reservations.push(reservation.clone());
            } else if answer["__typename"] == "SoldOut" {
                let available = answer["available"].as_i64().unwrap_or(-1);
                assert!((0..*quantity).contains(&available), "{context}: {answer}");
            }
        }
        assert_conserved(&app, *item, levels, &taken(&reservations)).await;
        answered.push(counts);
    }
    assert_levels_add_up(&app.db).await;
    eprintln!(
        "reserves_with_random_choices_never_over_allocate_a_location {isolation:?} (seed {SEED:#x}): \
         {ROUNDS} rounds x {REQUESTS} requests: {answered:?}"
    );
}

/// Two inventories X and Y at locations A and B (5 units each), per round,
/// and sixty two-line reserveMany requests at once: the lines name the
/// inventories in either order and, for most lines, A and B in opposite
/// orders (X [A, B] with Y [B, A], and the reverse), with random
/// strategies, split settings and quantities of 1 to 3. No request fails
/// (no deadlock, no serialization failure reaches a client); a `ReservedAll`
/// holds both lines, each allocated as it asked; an `ItemsUnavailable`
/// names sold-out lines (or CONFLICT ones, when collision retries run out)
/// and wrote nothing (its user holds no
/// reservation); every location's units add up.
async fn reserve_many_naming_locations_in_opposite_orders_never_deadlocks(isolation: Isolation) {
    let app = Arc::new(super::spawn(isolation, Limits::default()).await);
    let (a, b) = (create_location(&app, "a", 10).await, create_location(&app, "b", 20).await);
    let both = [a, b];
    let mut rng = StdRng::seed_from_u64(SEED + 1);
    let mut answered = Vec::new();
    for round in 0..ROUNDS {
        let levels = [(a, 5), (b, 5)];
        let x = stocked_at(&app, &format!("RACE-X-{round}"), &levels).await;
        let y = stocked_at(&app, &format!("RACE-Y-{round}"), &levels).await;
        let carts: Vec<Vec<(Uuid, i64, Allocating)>> = (0..REQUESTS)
            .map(|n| {
                let (first, second) = if n % 2 == 0 { (x, y) } else { (y, x) };
                let orders = if n / 2 % 2 == 0 { [vec![a, b], vec![b, a]] } else { [vec![b, a], vec![a, b]] };
                [first, second]
                    .into_iter()
                    .zip(orders)
                    .map(|(item, ids)| {
                        let mut choice = random_choice(&mut rng, &both);
                        choice.location_ids = (rng.random_range(0..5) > 0).then_some(ids);
                        (item, rng.random_range(1..=3), choice)
                    })
                    .collect()
            })
            .collect();
        let calls = carts.iter().enumerate().map(|(n, cart)| {
            let items: Vec<Value> = cart
                .iter()
                .map(|(item, quantity, choice)| {
                    with_choice(json!({ "inventoryId": item, "quantity": quantity }), choice)
                })
                .collect();
            let app = app.clone();
            async move {
                let token = app.token(&format!("many-{round}-{n}"), Role::Customer);
                let input = json!({ "input": { "items": items } });
                app.mutate(&token, "reserveMany", RESERVE_MANY_AT, input).await
            }
            .boxed()
        });
        let answers = at_once(calls.collect()).await;
        let counts = outcomes(answers.iter().map(|a| a["__typename"].as_str().unwrap_or("ERROR")));
        assert_only(&counts, &["ReservedAll", "ItemsUnavailable"], &answers);

        let held = app
            .rows(&format!(
                "SELECT user_id, count(*) AS n FROM reservations WHERE inventory_id IN ('{x}', '{y}') GROUP BY 1"
            ))
            .await;
        let held: BTreeMap<String, i64> = held
            .iter()
            .map(|row| (row["user_id"].as_str().expect("user").to_owned(), row["n"].as_i64().expect("n")))
            .collect();
        let mut reservations = Vec::new();
        for (n, (answer, cart)) in answers.iter().zip(&carts).enumerate() {
            let context = format!("seed {:#x}, round {round}, cart {cart:?}", SEED + 1);
            let user = format!("many-{round}-{n}");
            if answer["__typename"] == "ReservedAll" {
                let lines = answer["reservations"].as_array().unwrap_or_else(|| panic!("{answer}"));
                assert_eq!(lines.len(), 2, "{context}: {answer}");
                for (item, quantity, choice) in cart {
                    let line = lines.iter().find(|r| uuid(&r["inventory"]["id"]) == *item);
                    let line = line.unwrap_or_else(|| panic!("{context}: no line of {item}: {answer}"));
                    assert_eq!(line["quantity"], *quantity, "{context}: {answer}");
                    assert_allocated(line, &eligible(choice, &both), choice.allow_split);
                    reservations.push(line.clone());
                }
                assert_eq!(held.get(&user), Some(&2), "{context}: both lines held");
            } else {
                let items = answer["items"].as_array().unwrap_or_else(|| panic!("{answer}"));
                assert!(!items.is_empty(), "{context}: {answer}");
                for unavailable in items {
                    let line = cart.iter().find(|(item, _, _)| *item == uuid(&unavailable["inventoryId"]));
                    let (_, quantity, _) = line.unwrap_or_else(|| panic!("{context}: not a line: {answer}"));
                    if unavailable["reason"] == "SOLD_OUT" {
                        let available = unavailable["available"].as_i64().unwrap_or(-1);
                        assert!((0..*quantity).contains(&available), "{context}: {answer}");
                    } else {
                        assert_eq!(unavailable["reason"], "CONFLICT", "{context}: {answer}");
                    }
                }
                assert_eq!(held.get(&user), None, "{context}: an unavailable cart wrote nothing");
            }
        }
        let (on_x, on_y): (Vec<Value>, Vec<Value>) =
            reservations.into_iter().partition(|r| uuid(&r["inventory"]["id"]) == x);
        assert_conserved(&app, x, &levels, &taken(&on_x)).await;
        assert_conserved(&app, y, &levels, &taken(&on_y)).await;
        answered.push(counts);
    }
    assert_levels_add_up(&app.db).await;
    eprintln!(
        "reserve_many_naming_locations_in_opposite_orders_never_deadlocks {isolation:?} (seed {:#x}): \
         {ROUNDS} rounds x {REQUESTS} requests: {answered:?}",
        SEED + 1
    );
}

at_every_isolation! {
    reserves_with_random_choices_never_over_allocate_a_location;
    reserve_many_naming_locations_in_opposite_orders_never_deadlocks;
}
