//! Kits naming inventories and locations in opposite orders, single
//! reserves and releases never deadlock.

use std::{collections::BTreeMap, sync::Arc};

use futures::FutureExt;
use rand::{RngExt as _, SeedableRng, rngs::StdRng};
use serde_json::json;
use stockguard::{
    auth::Role,
    config::Limits,
    stock::allocating::{Allocating, Strategy},
};
use uuid::Uuid;

use super::{
    Kit, ROUNDS, Raced, SEED, assert_answered, name_of, releasing_kit, reserving_kit, reserving_one, spread,
    three_locations,
};
use crate::{
    helpers::{Isolation, at_every_isolation, at_once, uuid},
    kits::reserve_kit,
    location_races::assert_levels_add_up,
};

/// Every one of `ids`, in that order, with a random strategy and split.
fn naming(ids: &[Uuid; 3], rng: &mut StdRng) -> Allocating {
    Allocating {
        location_ids: Some(ids.to_vec()),
        strategy: if rng.random_bool(0.5) { Strategy::Priority } else { Strategy::FewestLocations },
        allow_split: rng.random_bool(0.7),
    }
}

/// Per round: A and B, 10 units at each of three locations; kit X is A + 2
/// B made naming A first, kit Y is B + 2 A made naming B first, and three
/// kits of each and two single holds of each inventory are held before the
/// race. Then 50 requests at once: 16 kits of X naming the locations
/// default, north, south and 16 of Y naming them the other way round (a
/// strategy and split at random), 6 single reserves of A and B with the
/// locations each way, and releases of the six held kits and four holds.
/// No request fails: every answer is a union member (a deadlock that ran
/// out of retries, or any error, would not be), every release released;
/// each level adds up and the check holds; and PostgreSQL broke no
/// deadlock in the test's database (its statistics reach the counter within
/// a second of a backend going idle, so the earlier rounds' are surely
/// counted by the end).
async fn kits_naming_inventories_in_opposite_orders_never_deadlock(isolation: Isolation) {
    let app = Arc::new(crate::location_races::spawn(isolation, Limits::default()).await);
    let at = three_locations(&app).await;
    let reversed = [at[2], at[1], at[0]];
    let mut rng = StdRng::seed_from_u64(SEED + 2);
    let mut totals = BTreeMap::<String, usize>::new();
    for round in 0..ROUNDS {
        let a = spread(&app, &format!("ORDER-A-{round}"), &at, [10, 10, 10]).await;
        let b = spread(&app, &format!("ORDER-B-{round}"), &at, [10, 10, 10]).await;
        let one = |item: Uuid, n: i64| json!({ "inventoryId": item, "quantity": n });
        let x = Kit::new(&app, &format!("X-{round}"), json!([one(a, 1), one(b, 2)]), vec![(a, 1), (b, 2)]).await;
        let y = Kit::new(&app, &format!("Y-{round}"), json!([one(b, 1), one(a, 2)]), vec![(a, 2), (b, 1)]).await;
        let mut held_kits = Vec::new();
        let mut held_ones = Vec::new();
        for n in 0..6 {
            let user = format!("kit-holder-{round}-{n}");
            let kit = if n % 2 == 0 { x.id } else { y.id };
            let answer = reserve_kit(&app, &app.token(&user, Role::Customer), kit, 1, json!({})).await;
            assert_eq!(answer["__typename"], "KitReserved", "{answer}");
            held_kits.push((user, uuid(&answer["kitReservation"]["id"])));
        }
        for n in 0..4 {
            let user = format!("holder-{round}-{n}");
            let answer = app.reserve(&app.token(&user, Role::Customer), one(if n % 2 == 0 { a } else { b }, 1)).await;
            assert_eq!(answer["__typename"], "Reserved", "{answer}");
            held_ones.push((user, uuid(&answer["reservation"]["id"])));
        }

        let mut requests: Vec<Raced> = Vec::new();
        for n in 0..32 {
            let (kit, ids) = if n % 2 == 0 { (x.id, &at) } else { (y.id, &reversed) };
            let picked = naming(ids, &mut rng);
            requests.push(reserving_kit(&app, format!("x-y-{round}-{n}"), kit, rng.random_range(1..=2), &picked));
        }
        for n in 0..6 {
            let (item, ids) = if n % 2 == 0 { (a, &reversed) } else { (b, &at) };
            let picked = naming(ids, &mut rng);
            requests.push(reserving_one(&app, format!("one-{round}-{n}"), item, rng.random_range(1..=3), &picked));
        }
        for (user, id) in &held_kits {
            requests.push(releasing_kit(&app, user, *id));
        }
        for (user, id) in held_ones.iter().cloned() {
            let app = app.clone();
            requests.push(async move { ("release", app.release(&app.token(&user, Role::Customer), id).await) }.boxed());
        }
        let answers = at_once(requests).await;
        let allowed =
            ["KitReserved", "KitSoldOut", "Reserved", "SoldOut", "KitReservationReleased", "ReservationReleased"];
        let counts = assert_answered(&answers, &allowed, "opposite orders");
        let released = answers.iter().filter(|(k, _)| *k == "releaseKit" || *k == "release");
        assert!(released.clone().all(|(_, a)| name_of(a).ends_with("Released")), "{:?}", released.collect::<Vec<_>>());
        assert_levels_add_up(&app.db).await;
        app.assert_invariant().await;
        for (name, n) in counts {
            *totals.entry(name).or_default() += n;
        }
    }
    let deadlocks = app.count("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").await;
    assert_eq!(deadlocks, 0, "PostgreSQL broke a deadlock (and the server re-ran it)");
    eprintln!(
        "kits_naming_inventories_in_opposite_orders_never_deadlock {isolation:?} (seed {:#x}): {ROUNDS} rounds x 48 \
         requests: {totals:?}",
        SEED + 2
    );
}

at_every_isolation! {
    kits_naming_inventories_in_opposite_orders_never_deadlock;
}
