//! Adjustments as events: each applied adjustment is one `STOCK_CHANGED`
//! with `data.reason` `ADJUSTED` and its `data.adjustmentReason`, the units
//! after it, in version order among the reserves racing it; a refused
//! adjustment, a count that matched and a change of safety stock send
//! nothing.

use std::{collections::BTreeMap, time::Duration};

use futures::FutureExt;
use serde_json::{Value, json};
use stockguard::auth::Role;

use super::{
    Isolation, assert_in_order, committed_changes, first_arrivals, limits, receiver::Receiver, spawn, stock_changes,
    subscribe, until_delivered,
};
use crate::{
    helpers::{at_every_isolation, at_once, named},
    locations::stocked,
    stock_ops::{adjust, set_safety},
};

/// A safety stock set, then at once twelve adjustments (four reasons, some
/// more than is available, two counts: one that matches) and twelve
/// customers' reserves: the receiver gets one STOCK_CHANGED per committed
/// change and no more, in version order; each ADJUSTED one carries the
/// reason its ledger row has, its delta, and on hand moved by it.
async fn each_adjustment_is_one_stock_change_with_its_reason(isolation: Isolation) {
    let app = spawn(isolation, limits(&[0.05, 0.05, 0.05])).await;
    let receiver = Receiver::start().await;
    subscribe(&app, &receiver).await;
    let item = stocked(&app, "EV-ADJUST", 30).await;
    set_safety(&app, &app.operator(), json!({ "inventoryId": item, "quantity": 3 })).await;
    let reasons = ["DAMAGED", "SHRINKAGE", "FOUND", "RETURN_TO_SUPPLIER"];
    let mut calls = Vec::new();
    for n in 0..12 {
        let app = app.clone();
        let input = match n {
            // On hand is 30 before the race and reserves never change it: one matches.
            10 => json!({ "inventoryId": item, "countedOnHand": 30, "reason": "CYCLE_COUNT" }),
            11 => json!({ "inventoryId": item, "countedOnHand": 31, "reason": "CYCLE_COUNT" }),
            _ => {
                let delta = if reasons[n % 4] == "FOUND" { 2 } else { -(1 + (n as i32 % 3) * 7) };
                json!({ "inventoryId": item, "delta": delta, "reason": reasons[n % 4], "note": format!("change {n}") })
            }
        };
        calls.push(async move { ("adjust", named(adjust(&app, &app.operator(), input).await)) }.boxed());
    }
    for n in 0..12 {
        let app = app.clone();
        let token = app.token(&format!("ev-adjust-{n}"), Role::Customer);
        let input = json!({ "inventoryId": item, "quantity": 1 });
        calls.push(async move { ("reserve", named(app.reserve(&token, input).await)) }.boxed());
    }
    let answers = at_once(calls).await;
    let applied: Vec<&Value> = answers
        .iter()
        .filter(|(kind, (name, answer))| *kind == "adjust" && name == "StockAdjusted" && answer["delta"] != 0)
        .map(|(_, (_, answer))| answer)
        .collect();
    assert!(!applied.is_empty(), "{answers:?}");

    let committed = committed_changes(&app, &[item]).await;
    until_delivered(&receiver, &committed, Duration::from_secs(30), "every stock change delivered").await;
    let first = first_arrivals(&receiver.accepted_events());
    assert_in_order(&first);
    assert_eq!(stock_changes(&first).len(), committed.len(), "one per committed change, none for what wrote nothing");
    let ledger: BTreeMap<i64, Value> = app
        .rows(&format!(
            "SELECT version_after, delta, adjustment_reason FROM stock_movements WHERE inventory_id = '{item}' AND reason = 'ADJUSTED'"
        ))
        .await
        .into_iter()
        .map(|row| (row["version_after"].as_i64().expect("a version"), row))
        .collect();
    assert_eq!(ledger.len(), applied.len(), "one ledger row per applied adjustment");
    let adjusted: Vec<&Value> = first.iter().filter(|e| e["data"]["reason"] == "ADJUSTED").collect();
    assert_eq!(adjusted.len(), applied.len(), "one event per applied adjustment");
    for event in adjusted {
        let row = &ledger[&event["version"].as_i64().expect("a version")];
        let data = &event["data"];
        assert_eq!((&data["adjustmentReason"], &data["delta"]), (&row["adjustment_reason"], &row["delta"]), "{event}");
        assert_eq!(data["locations"].as_array().map(Vec::len), Some(1), "{event}");
        assert_eq!(data["reservationId"], Value::Null, "{event}");
    }
    let reserved: Vec<&Value> = first.iter().filter(|e| e["data"]["reason"] == "RESERVED").collect();
    assert!(reserved.iter().all(|e| e["data"].get("adjustmentReason").is_none()), "only adjustments say why");
    // On hand moves by the adjustments alone, version after version.
    let mut on_hand = None;
    for event in first.iter().filter(|e| e["type"] == "STOCK_CHANGED" && e["inventoryId"] == json!(item)) {
        let data = &event["data"];
        let now = data["onHand"].as_i64().expect("on hand");
        if let Some(before) = on_hand {
            let moved = if data["reason"] == "ADJUSTED" { data["delta"].as_i64().expect("a delta") } else { 0 };
            assert_eq!(now, before + moved, "{event}");
        }
        on_hand = Some(now);
    }
    app.assert_invariant().await;
}

at_every_isolation! {
    each_adjustment_is_one_stock_change_with_its_reason;
}
