//! A randomized mix of kits, a nested kit, a pack and single reserves of
//! the same inventories over three locations never oversells a level nor
//! takes safety stock, and the kits' units are exactly what their answers
//! say.

use std::{collections::BTreeMap, sync::Arc};

use rand::{RngExt as _, SeedableRng, rngs::StdRng};
use serde_json::json;
use stockguard::{config::Limits, stock::allocating::Allocating};
use uuid::Uuid;

use super::{
    Kit, ROUNDS, SEED, assert_answered, assert_whole, levels, name_of, reserving_kit, reserving_one, spread,
    three_locations,
};
use crate::{
    helpers::{Isolation, at_every_isolation, at_once, uuid},
    location_races::{assert_allocated, assert_levels_add_up, eligible, random_choice},
    stock_ops::set_safety,
};

/// What a request of the mix asked for.
#[derive(Debug)]
enum Ask {
    /// Kits of the round's kit number `.0`.
    Kit(usize, i64),
    /// Units of one inventory.
    One(Uuid, i64),
}

/// Requests lined up in each round of the mix.
const MIX: usize = 40;

/// Customers the mix's requests come from.
const CUSTOMERS: usize = 8;

/// Per round: four inventories A (12 units), B (20), C (12) and D (30)
/// spread over three locations by transfers, safety stock on two levels
/// (B at north, D at default), and four kits: CAM (A + 2 B), DUO (B + C,
/// named C first), BUNDLE (CAM + C, a nested kit, flattened to A + 2 B + C)
/// and SIX (6 D, a pack). Then 40 requests at once from eight customers:
/// kits of 1 or 2 and single reserves of 1 to 3 (of D up to 6), each with
/// a random choice of locations, strategy and split (half the kits the
/// default one). Every answer is
/// `KitReserved`, `KitSoldOut`, `Reserved` or `SoldOut`; a kit reserved is
/// whole (one reservation per component, kits × its quantity, allocated
/// as asked); a refusal was short. In the database, no level fell below
/// its safety stock (so none below 0), each level's units are what it had
/// less what ACTIVE reservations hold there (no oversell), the units kit
/// reservations hold per inventory are exactly Σ kits × component quantity
/// of the `KitReserved` answers and the single reserves' those of the
/// `Reserved` ones, one kit reservation per `KitReserved`; the check holds.
/// Over the rounds some kits were reserved and some sold out.
async fn a_mix_of_kits_packs_and_single_reserves_never_oversells_a_level(isolation: Isolation) {
    mix(isolation, Sharing::AsItComes).await;
}

/// The mix with every request by the default choice and the coalescer
/// gathering callers for 100 ms, so kits and single reserves share batches'
/// statements: the same checks, and over the rounds some kit reservations
/// were written by a transaction that wrote other callers' reservations too.
async fn kits_batched_with_single_reserves_never_oversell_a_level(isolation: Isolation) {
    mix(isolation, Sharing::Batched).await;
}

/// How the mix's requests reach the coalescer.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sharing {
    /// With the default settings, half the kits and no single reserve by
    /// the default choice: those that queue share batches.
    AsItComes,
    /// Every request by the default choice, gathered into batches.
    Batched,
}

async fn mix(isolation: Isolation, sharing: Sharing) {
    let limits = match sharing {
        Sharing::AsItComes => Limits::default(),
        Sharing::Batched => Limits { coalesce_window_us: 100_000, ..Limits::default() },
    };
    let app = Arc::new(crate::location_races::spawn(isolation, limits).await);
    let operator = app.operator();
    let at = three_locations(&app).await;
    let mut rng = StdRng::seed_from_u64(SEED);
    let mut totals: BTreeMap<String, usize> = BTreeMap::new();
    for round in 0..ROUNDS {
        let a = spread(&app, &format!("MIX-A-{round}"), &at, [4, 4, 4]).await;
        let b = spread(&app, &format!("MIX-B-{round}"), &at, [6, 8, 6]).await;
        let c = spread(&app, &format!("MIX-C-{round}"), &at, [7, 5, 0]).await;
        let d = spread(&app, &format!("MIX-D-{round}"), &at, [8, 11, 11]).await;
        for (item, location, units) in [(b, at[1], 2), (d, at[0], 1)] {
            let set =
                set_safety(&app, &operator, json!({ "inventoryId": item, "locationId": location, "quantity": units }));
            assert_eq!(set.await["safetyStock"], units, "safety stock set");
        }
        let one = |item: Uuid, n: i64| json!({ "inventoryId": item, "quantity": n });
        let cam = Kit::new(&app, &format!("CAM-{round}"), json!([one(a, 1), one(b, 2)]), vec![(a, 1), (b, 2)]).await;
        let duo = Kit::new(&app, &format!("DUO-{round}"), json!([one(c, 1), one(b, 1)]), vec![(b, 1), (c, 1)]).await;
        let nested = json!([{ "kitId": cam.id, "quantity": 1 }, one(c, 1)]);
        let bundle = Kit::new(&app, &format!("BUNDLE-{round}"), nested, vec![(a, 1), (b, 2), (c, 1)]).await;
        let six = Kit::new(&app, &format!("SIX-{round}"), json!([one(d, 6)]), vec![(d, 6)]).await;
        let kits = [cam, duo, bundle, six];
        let items = [a, b, c, d];
        let before = levels(&app, &items).await;

        let asks: Vec<(Ask, Allocating)> = (0..MIX)
            .map(|_| {
                let ask = match rng.random_range(0..9) {
                    k @ 0..=3 => Ask::Kit(k, rng.random_range(1..=2)),
                    4 => Ask::Kit(0, 1),
                    n => {
                        let item = items[n - 5];
                        Ask::One(item, rng.random_range(1..=if item == d { 6 } else { 3 }))
                    }
                };
                // Half the kits choose as a shop page would (every location,
                // by priority, split), so more of them are taken.
                let choice = if sharing == Sharing::Batched || matches!(ask, Ask::Kit(..)) && rng.random_bool(0.5) {
                    Allocating::default()
                } else {
                    random_choice(&mut rng, &at)
                };
                (ask, choice)
            })
            .collect();
        let requests = asks.iter().enumerate().map(|(n, (ask, choice))| {
            let user = format!("customer-{}", n % CUSTOMERS);
            match *ask {
                Ask::Kit(k, quantity) => reserving_kit(&app, user, kits[k].id, quantity, choice),
                Ask::One(item, quantity) => reserving_one(&app, user, item, quantity, choice),
            }
        });
        let answers = at_once(requests.collect()).await;
        let counts = assert_answered(&answers, &["KitReserved", "KitSoldOut", "Reserved", "SoldOut"], "the mix");

        let (mut kit_units, mut one_units) = (BTreeMap::<Uuid, i64>::new(), BTreeMap::<Uuid, i64>::new());
        for ((ask, choice), (_, answer)) in asks.iter().zip(&answers) {
            let context = format!("seed {SEED:#x}, round {round}, {ask:?} {choice:?}: {answer}");
            match (ask, name_of(answer)) {
                (Ask::Kit(k, quantity), "KitReserved") => {
                    for (item, units) in assert_whole(answer, &kits[*k], *quantity, choice, &at) {
                        *kit_units.entry(item).or_default() += units;
                    }
                }
                (Ask::Kit(k, quantity), "KitSoldOut") => {
                    assert!(answer["available"].as_i64().unwrap_or(i64::MAX) < *quantity, "{context}");
                    let short = answer["components"].as_array().filter(|c| !c.is_empty());
                    for component in short.unwrap_or_else(|| panic!("no short component: {context}")) {
                        let item = uuid(&component["inventoryId"]);
                        let per = kits[*k].components.iter().find(|c| c.0 == item).map(|c| c.1);
                        let per = per.unwrap_or_else(|| panic!("not a component: {context}"));
                        assert!(component["available"].as_i64().unwrap_or(i64::MAX) < per * quantity, "{context}");
                    }
                }
                (Ask::One(item, quantity), "Reserved") => {
                    assert_eq!(answer["reservation"]["quantity"], *quantity, "{context}");
                    assert_allocated(&answer["reservation"], &eligible(choice, &at), choice.allow_split);
                    *one_units.entry(*item).or_default() += quantity;
                }
                (Ask::One(_, quantity), "SoldOut") => {
                    assert!(answer["available"].as_i64().unwrap_or(i64::MAX) < *quantity, "{context}");
                }
                (_, other) => panic!("{other} does not answer this request: {context}"),
            }
        }

        let after = levels(&app, &items).await;
        assert_eq!(after.keys().collect::<Vec<_>>(), before.keys().collect::<Vec<_>>(), "no level came or went");
        let (mut kits_held, mut all_held) = (BTreeMap::<Uuid, i64>::new(), BTreeMap::<Uuid, i64>::new());
        for (key @ (item, location), [available, safety, held, by_kits]) in &after {
            let had = before[key][0];
            assert!(
                *available >= *safety,
                "round {round}: {item} at {location} below its safety stock: {:?}",
                after[key]
            );
            assert_eq!(had, available + held, "round {round}: {item} at {location} had {had}: {:?}", after[key]);
            *kits_held.entry(*item).or_default() += by_kits;
            *all_held.entry(*item).or_default() += held;
        }
        for item in items {
            let total: i64 = before.iter().filter(|((i, _), _)| *i == item).map(|(_, v)| v[0]).sum();
            let (kits, held) = (kits_held.get(&item).copied().unwrap_or(0), all_held[&item]);
            assert!(held <= total, "round {round}: {item} holds {held} of {total}");
            assert_eq!(kits, kit_units.get(&item).copied().unwrap_or(0), "round {round}: kit units of {item}");
            assert_eq!(
                held - kits,
                one_units.get(&item).copied().unwrap_or(0),
                "round {round}: single units of {item}"
            );
        }
        let kit_ids: Vec<String> = kits.iter().map(|k| format!("'{}'", k.id)).collect();
        let made =
            app.count(&format!("SELECT count(*) FROM kit_reservations WHERE kit_id IN ({})", kit_ids.join(","))).await;
        assert_eq!(made as usize, counts.get("KitReserved").copied().unwrap_or(0), "one kit reservation per answer");
        // A row's `xmin` is the transaction that wrote it.
        let shared = app
            .count(&format!(
                "SELECT count(*) FROM kit_reservations k WHERE k.kit_id IN ({}) AND EXISTS (SELECT 1 FROM reservations r \
                  WHERE r.xmin::text = k.xmin::text AND r.kit_reservation_id IS DISTINCT FROM k.id)",
                kit_ids.join(",")
            ))
            .await;
        *totals.entry("kits sharing a statement".into()).or_default() += shared as usize;
        assert_levels_add_up(&app.db).await;
        app.assert_invariant().await;
        for (name, n) in counts {
            *totals.entry(name).or_default() += n;
        }
    }
    let mut expected = vec!["KitReserved", "KitSoldOut"];
    if sharing == Sharing::Batched {
        expected.push("kits sharing a statement");
    }
    for outcome in expected {
        assert!(totals.get(outcome).copied().unwrap_or(0) > 0, "no {outcome} in any round: {totals:?}");
    }
    eprintln!("the mix {sharing:?} {isolation:?} (seed {SEED:#x}): {ROUNDS} rounds x {MIX} requests: {totals:?}");
}

at_every_isolation! {
    a_mix_of_kits_packs_and_single_reserves_never_oversells_a_level;
    kits_batched_with_single_reserves_never_oversell_a_level;
}
