//! Coalesced reserves on an inventory held in several places: callers that
//! take by the default choice share statements, and each gets exactly the
//! locations `allocate` would have given it alone, in the order the
//! reservations were granted.

use std::{collections::BTreeMap, sync::Arc};

use futures::FutureExt;
use rand::{RngExt as _, SeedableRng, rngs::StdRng};
use serde_json::{Value, json};
use stockguard::{
    auth::Role,
    config::Limits,
    stock::allocating::{Strategy, model},
};
use uuid::Uuid;

use super::{RESERVE_AT, allocations, assert_levels_add_up, assert_only, outcomes, stocked_at};
use crate::{
    helpers::{Isolation, at_every_isolation, at_once},
    locations::{UPDATE_LOCATION, create_location},
};

/// Rounds, each on fresh inventories.
const ROUNDS: usize = 3;

/// Requests lined up in each round.
const REQUESTS: usize = 60;

/// Fixed, so a failure reproduces; printed with the counts.
const SEED: u64 = 0x2607;

/// Per round a fresh inventory at three active locations (priorities 10,
/// 20, 20, so `b` and `c` are ordered by code) and a deactivated one, and a
/// second inventory held in one place, and sixty reserves of 1 to 4 units
/// at once that name no location, alternating between the two. Afterwards,
/// from the database: the reservations of the several-place inventory,
/// in the order their ledger rows' versions say they were granted, each
/// hold exactly what `allocate` (its Rust model) gives from what the levels
/// held after the grants before it; every `SoldOut` asked for more than was
/// left; some of its reservations shared a transaction (the coalesced
/// statement, not one statement each); and every level adds up.
async fn coalesced_callers_take_what_each_would_alone(isolation: Isolation) {
    let app = Arc::new(super::spawn(isolation, Limits::default()).await);
    let mut active = Vec::new();
    for (code, priority) in [("a", 10), ("c", 20), ("b", 20)] {
        active.push(create_location(&app, code, priority).await);
    }
    // By priority, then code.
    active.swap(1, 2);
    let closed = create_location(&app, "closed", 5).await;
    let mut rng = StdRng::seed_from_u64(SEED);
    let mut rounds = Vec::new();
    for round in 0..ROUNDS {
        let levels: Vec<(Uuid, i32)> =
            active.iter().chain([&closed]).map(|&at| (at, rng.random_range(20..=40))).collect();
        let spread = stocked_at(&app, &format!("SHARE-MANY-{round}"), &levels).await;
        let single = app.create_inventory(&format!("SHARE-ONE-{round}"), 40).await;
        rounds.push((spread, levels, single));
    }
    let update = json!({ "input": { "id": closed, "active": false } });
    let closing = app.mutate(&app.operator(), "updateLocation", UPDATE_LOCATION, update).await;
    assert_eq!(closing["active"], false, "{closing}");

    let mut answered = Vec::new();
    for (round, (spread, levels, single)) in rounds.iter().enumerate() {
        // One reserve first, so the server has seen the inventory held in
        // several places and batches its callers across the levels.
        let token = app.token(&format!("share-{round}-first"), Role::Customer);
        let first = json!({ "input": { "inventoryId": spread, "quantity": 1 } });
        let first = app.mutate(&token, "reserve", RESERVE_AT, first).await;
        assert_eq!(first["__typename"], "Reserved", "{first}");

        let quantities: Vec<i64> = (0..REQUESTS).map(|_| rng.random_range(1..=4)).collect();
        let calls = quantities.iter().enumerate().map(|(n, &quantity)| {
            let item = if n % 3 == 2 { *single } else { *spread };
            let app = app.clone();
            async move {
                let token = app.token(&format!("share-{round}-{n}"), Role::Customer);
                let input = json!({ "input": { "inventoryId": item, "quantity": quantity } });
                app.mutate(&token, "reserve", RESERVE_AT, input).await
            }
            .boxed()
        });
        let answers = at_once(calls.collect()).await;
        let counts = outcomes(answers.iter().map(|a| a["__typename"].as_str().unwrap_or("ERROR")));
        assert_only(&counts, &["Reserved", "SoldOut"], &answers);
        for (answer, quantity) in answers.iter().zip(&quantities) {
            if answer["__typename"] == "SoldOut" {
                let available = answer["available"].as_i64().unwrap_or(-1);
                assert!((0..*quantity).contains(&available), "round {round}: {answer}");
            }
        }
        let mut granted: Vec<Value> = answers
            .iter()
            .chain([&first])
            .filter(|a| a["__typename"] == "Reserved")
            .map(|a| a["reservation"].clone())
            .collect();
        let order = app
            .rows(&format!(
                "SELECT reservation_id::text AS id, min(version_after) AS version FROM stock_movements
                  WHERE inventory_id = '{spread}' AND reason = 'RESERVED' GROUP BY 1"
            ))
            .await;
        let version: BTreeMap<String, i64> = order
            .iter()
            .map(|row| (row["id"].as_str().expect("id").to_owned(), row["version"].as_i64().expect("version")))
            .collect();
        granted.retain(|r| version.contains_key(r["id"].as_str().unwrap_or_default()));
        granted.sort_by_key(|r| version[r["id"].as_str().unwrap_or_default()]);

        let mut left: Vec<i32> = levels[..active.len()].iter().map(|(_, units)| *units).collect();
        for reservation in &granted {
            let quantity = i32::try_from(reservation["quantity"].as_i64().expect("quantity")).expect("small");
            let takes = model(&left, quantity, Strategy::Priority, true)
                .unwrap_or_else(|| panic!("round {round}: granted beyond the model, left {left:?}: {reservation}"));
            let expected: BTreeMap<Uuid, i64> =
                active.iter().zip(&takes).filter(|(_, take)| **take > 0).map(|(&at, &t)| (at, i64::from(t))).collect();
            let got: BTreeMap<Uuid, i64> = allocations(reservation).into_iter().collect();
            assert_eq!(got, expected, "seed {SEED:#x}, round {round}, left {left:?}: {reservation}");
            left.iter_mut().zip(&takes).for_each(|(units, take)| *units -= take);
        }
        let shared = app
            .count(&format!(
                "SELECT count(*) FROM (SELECT 1 FROM reservations WHERE inventory_id = '{spread}'
                  GROUP BY xmin::text HAVING count(*) > 1) AS batches"
            ))
            .await;
        assert!(shared > 0, "round {round}: callers of the inventory held in several places shared no statement");
        let single_held = format!("SELECT count(*) FROM reservations WHERE inventory_id = '{single}'");
        assert!(app.count(&single_held).await > 0, "round {round}: the one-place inventory was reserved");
        answered.push((counts, granted.len(), shared));
    }
    assert_levels_add_up(&app.db).await;
    app.assert_invariant().await;
    eprintln!(
        "coalesced_callers_take_what_each_would_alone {isolation:?} (seed {SEED:#x}): {ROUNDS} rounds x {REQUESTS} \
         requests: (outcomes, reservations of the several-place inventory, transactions shared): {answered:?}"
    );
}

at_every_isolation! {
    coalesced_callers_take_what_each_would_alone;
}
