//! Releases, double releases and the sweeper racing them return each kit
//! reservation's units once, to the locations they came from.

use std::{collections::BTreeMap, sync::Arc};

use rand::{RngExt as _, SeedableRng, rngs::StdRng};
use sea_orm::ConnectionTrait;
use serde_json::json;
use stockguard::auth::Role;
use uuid::Uuid;

use super::{
    Kit, RESERVE_KIT_AT, ROUNDS, Raced, SEED, assert_answered, assert_whole, levels, name_of, releasing_kit, spread,
    sweeping, three_locations,
};
use crate::{
    helpers::{Isolation, TestApp, at_every_isolation, at_once, sweep_all, uuid},
    location_races::{assert_levels_add_up, random_choice, with_choice},
};

/// Per round: A, B and C, 30 units at each of three locations; kits P (A +
/// B), Q (2 B + C) and NEST (P + C, flattened A + B + C); each level
/// recorded; then 12 kit reservations of 1 or 2 kits, one after another,
/// with random choices of locations (so their units come from several), and
/// the first six made due. Then at once: every kit reservation released
/// twice by its owner, and two sweepers; then one more sweep (a due kit
/// whose row a release held was skipped, not waited for). Every level is
/// back at what it was; each of the six unexpired kits was released by
/// exactly one of its two releases (the other: `ReservationNotActive`),
/// each due one by neither (a release never takes an expired hold) and
/// expired whole by the sweepers, who expired exactly their components;
/// in the ledger, every component's units came back once to each location
/// that gave them (its rows there add up to 0, one return row per
/// allocation), every row carrying the kit reservation; the check holds.
async fn releases_expiry_and_double_releases_return_each_kits_units_once(isolation: Isolation) {
    let app = Arc::new(TestApp::without_sweeper(isolation).await);
    let at = three_locations(&app).await;
    let mut rng = StdRng::seed_from_u64(SEED + 3);
    let mut totals = BTreeMap::<String, usize>::new();
    for round in 0..ROUNDS {
        let a = spread(&app, &format!("BACK-A-{round}"), &at, [30, 30, 30]).await;
        let b = spread(&app, &format!("BACK-B-{round}"), &at, [30, 30, 30]).await;
        let c = spread(&app, &format!("BACK-C-{round}"), &at, [30, 30, 30]).await;
        let one = |item: Uuid, n: i64| json!({ "inventoryId": item, "quantity": n });
        let p = Kit::new(&app, &format!("P-{round}"), json!([one(a, 1), one(b, 1)]), vec![(a, 1), (b, 1)]).await;
        let q = Kit::new(&app, &format!("Q-{round}"), json!([one(b, 2), one(c, 1)]), vec![(b, 2), (c, 1)]).await;
        let nested = json!([{ "kitId": p.id, "quantity": 1 }, one(c, 1)]);
        let nest = Kit::new(&app, &format!("NEST-{round}"), nested, vec![(a, 1), (b, 1), (c, 1)]).await;
        let kits = [p, q, nest];
        let before = levels(&app, &[a, b, c]).await;
        let mut held = Vec::new();
        for n in 0..12 {
            let (kit, quantity, choice) = (&kits[n % 3], rng.random_range(1..=2), random_choice(&mut rng, &at));
            let user = format!("back-{round}-{n}");
            let input = with_choice(json!({ "kitId": kit.id, "quantity": quantity }), &choice);
            let answer = app
                .mutate(&app.token(&user, Role::Customer), "reserveKit", RESERVE_KIT_AT, json!({ "input": input }))
                .await;
            assert_eq!(answer["__typename"], "KitReserved", "{answer}");
            assert_whole(&answer, kit, quantity, &choice, &at);
            held.push((user, uuid(&answer["kitReservation"]["id"]), kit.components.len() as i64));
        }
        let due: Vec<String> = held[..6].iter().map(|(_, id, _)| format!("'{id}'")).collect();
        let make_due = format!(
            "UPDATE reservations SET expires_at = now() - interval '1 second' WHERE kit_reservation_id IN ({})",
            due.join(",")
        );
        app.db.execute_unprepared(&make_due).await.expect("make six kits due");

        let mut requests: Vec<Raced> = Vec::new();
        for (user, id, _) in held.iter().chain(&held) {
            requests.push(releasing_kit(&app, user, *id));
        }
        requests.push(sweeping(&app, 3));
        requests.push(sweeping(&app, 5));
        let answers = at_once(requests).await;
        let counts =
            assert_answered(&answers, &["KitReservationReleased", "ReservationNotActive", "Swept"], "giving back");
        let later = sweep_all(&app.db, 10).await;
        let swept: i64 = answers.iter().filter_map(|(_, a)| a["expired"].as_i64()).sum::<i64>() + later;
        let due_parts: i64 = held[..6].iter().map(|h| h.2).sum();
        assert_eq!(swept, due_parts, "round {round}: the sweepers expired the due kits' components, once");
        for (n, (_, id, _)) in held.iter().enumerate() {
            let (first, second) = (name_of(&answers[n].1), name_of(&answers[n + held.len()].1));
            let mut pair = [first, second];
            pair.sort_unstable();
            let (expected, status) = if n < 6 {
                (["ReservationNotActive", "ReservationNotActive"], "EXPIRED")
            } else {
                (["KitReservationReleased", "ReservationNotActive"], "RELEASED")
            };
            assert_eq!(pair, expected, "round {round}: kit reservation {n}'s two releases");
            let statuses = app
                .rows(&format!(
                    "SELECT DISTINCT status::text AS status FROM reservations WHERE kit_reservation_id = '{id}'"
                ))
                .await;
            assert_eq!(statuses, vec![json!({ "status": status })], "round {round}: kit reservation {n}");
        }
        let after = levels(&app, &[a, b, c]).await;
        let available = |levels: &BTreeMap<(Uuid, Uuid), [i64; 4]>| -> Vec<((Uuid, Uuid), i64)> {
            levels.iter().map(|(key, v)| (*key, v[0])).collect()
        };
        assert_eq!(available(&after), available(&before), "round {round}: every level back where it was");
        let ids: Vec<String> = held.iter().map(|(_, id, _)| format!("'{id}'")).collect();
        let wrong = app
            .rows(&format!(
                "SELECT r.id, m.location_id, sum(m.delta) AS net, count(*) FILTER (WHERE m.delta > 0) AS returns,
                        count(*) FILTER (WHERE m.kit_reservation_id IS DISTINCT FROM r.kit_reservation_id) AS unmarked
                   FROM reservations r JOIN stock_movements m ON m.reservation_id = r.id
                  WHERE r.kit_reservation_id IN ({})
                  GROUP BY 1, 2
                 HAVING sum(m.delta) <> 0 OR count(*) FILTER (WHERE m.delta > 0) <> 1
                     OR count(*) FILTER (WHERE m.kit_reservation_id IS DISTINCT FROM r.kit_reservation_id) > 0",
                ids.join(",")
            ))
            .await;
        assert!(wrong.is_empty(), "round {round}: units not returned once to where they came from: {wrong:#?}");
        let allocated = app
            .count(&format!(
                "SELECT count(*) FROM allocations a JOIN reservations r ON r.id = a.reservation_id
                  WHERE r.kit_reservation_id IN ({})",
                ids.join(",")
            ))
            .await;
        let returned = app
            .count(&format!(
                "SELECT count(*) FROM stock_movements WHERE delta > 0 AND kit_reservation_id IN ({})",
                ids.join(",")
            ))
            .await;
        assert_eq!(returned, allocated, "round {round}: one return row per allocation");
        assert_levels_add_up(&app.db).await;
        app.assert_invariant().await;
        for (name, n) in counts {
            *totals.entry(name).or_default() += n;
        }
    }
    eprintln!(
        "releases_expiry_and_double_releases_return_each_kits_units_once {isolation:?} (seed {:#x}): {ROUNDS} rounds \
         x 26 requests (12 kits, 6 due): {totals:?}",
        SEED + 3
    );
}

at_every_isolation! {
    releases_expiry_and_double_releases_return_each_kits_units_once;
}
