//! Endpoints side by side (issue 27, item 3): a stalled endpoint delays no
//! other endpoint.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use futures::FutureExt;
use serde_json::json;
use stockguard::{auth::Role, config::Limits};

use super::{
    assert_in_order, committed_changes, first_arrivals, limits,
    receiver::{Answer, Receiver},
    spawn, stock_changes, subscribe, verifies,
};
use crate::helpers::{Isolation, at_every_isolation, at_once, eventually};

/// The server's webhook timeout in the stall test: one attempt on the
/// stalled endpoint lasts this long.
const TIMEOUT: Duration = Duration::from_secs(20);

/// The healthy endpoint must have every change within this of the stalled
/// endpoint's second attempt arriving: half of one stall. A correct server
/// needs the burst (under a second) and the pump's next passes (a few
/// seconds on a loaded machine: each pass is JIT-compiled by PostgreSQL).
const BOUND: Duration = Duration::from_secs(10);

/// Two receivers, an endpoint each, on one server: A never answers within
/// the timeout, B accepts. Once A's first attempt has timed out and its
/// second is under way, 45 reserves at once; B receives every committed
/// stock change (the ledger's, the inventories' creation included) within
/// [`BOUND`] of A's second request arriving, in order and signed, while A's
/// delivery is still PENDING after 1 attempt with its second outstanding.
///
/// Why a server whose stalled endpoint held up the others would fail: with
/// one loop over the endpoints (or anything B's sending waits for while A's
/// attempt runs: a shared worker, one request in flight per process, a
/// connection held through the send), B gets no new body from the moment
/// A's second attempt is sent until it times out, [`TIMEOUT`] later. The
/// burst's changes commit only after A's second request has arrived, so
/// such a server delivers them to B no earlier than [`TIMEOUT`] after that
/// attempt was sent: twice [`BOUND`]. And by then A's second attempt has
/// ended (recorded as attempt 2, a third request follows at once), which the
/// last checks exclude.
async fn a_stalled_endpoint_delays_no_other(isolation: Isolation) {
    let timeout_ms = u64::try_from(TIMEOUT.as_millis()).expect("ms");
    let app = spawn(isolation, Limits { webhook_timeout_ms: timeout_ms, ..limits(&[0.05; 100]) }).await;
    let stalled = Receiver::start().await;
    stalled.script(&[Answer::Stall(TIMEOUT * 10); 10]);
    let healthy = Receiver::start().await;
    subscribe(&app, &stalled).await;
    let secret = subscribe(&app, &healthy).await;
    let items = [
        app.create_inventory("SHARE-A", 50).await,
        app.create_inventory("SHARE-B", 50).await,
        app.create_inventory("SHARE-C", 50).await,
    ];

    // A's first attempt times out; its second request arrives once the
    // first is recorded (attempts = 1) and the schedule's 50 ms have passed.
    eventually(TIMEOUT * 4, "the stalled endpoint's second attempt", || {
        let stalled = stalled.clone();
        async move { stalled.received().len() >= 2 }
    })
    .await;
    let stalled_since = stalled.received()[1].at;

    let calls = (0..45).map(|n| {
        let app = app.clone();
        let item = items[n % items.len()];
        async move {
            let token = app.token(&format!("share-{n}"), Role::Customer);
            app.reserve(&token, json!({ "inventoryId": item, "quantity": 1 })).await
        }
        .boxed()
    });
    let reserved = at_once(calls.collect()).await;
    for answer in &reserved {
        assert_eq!(answer["__typename"], "Reserved", "{answer}");
    }
    let committed = committed_changes(&app, &items).await;
    assert_eq!(committed.len(), items.len() + reserved.len(), "a creation and a reserve each: {committed:?}");
    let limit = (stalled_since + BOUND).saturating_duration_since(Instant::now());
    eventually(limit, "B has every change within the bound of A's second attempt", || {
        let (healthy, committed) = (healthy.clone(), committed.clone());
        async move {
            let delivered: BTreeSet<_> = stock_changes(&healthy.accepted_events()).into_iter().collect();
            delivered.is_superset(&committed)
        }
    })
    .await;
    let took = stalled_since.elapsed();
    assert!(took < BOUND, "B had every change {took:?} after A's second attempt began, not within {BOUND:?}");

    // A is still stuck in its second attempt: no third request, and its
    // delivery PENDING with the first attempt recorded.
    let sent_to_a = stalled.received();
    assert_eq!(sent_to_a.len(), 2, "A's second attempt is still under way");
    assert!(sent_to_a.iter().all(|r| r.answered != Answer::Accept), "A accepted nothing");
    let of_a = format!(
        "SELECT count(*) FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id \
          WHERE e.url = '{}'",
        stalled.url
    );
    assert_eq!(app.count(&format!("{of_a} AND d.status = 'PENDING' AND d.attempts = 1")).await, 1, "A's delivery");
    assert_eq!(app.count(&format!("{of_a} AND d.status <> 'PENDING'")).await, 0, "nothing of A's done");

    let first = first_arrivals(&healthy.accepted_events());
    let delivered = stock_changes(&first);
    assert_eq!(delivered.iter().copied().collect::<BTreeSet<_>>(), committed, "B: one per change");
    assert_eq!(delivered.len(), committed.len(), "B: no change twice among first arrivals");
    assert_in_order(&first);
    for received in healthy.received() {
        assert!(verifies(&secret, &received.signature, &received.body), "signature of {}", received.delivery);
    }
    eprintln!(
        "a_stalled_endpoint_delays_no_other {isolation:?}: {} changes at B {took:?} after A's second attempt \
         began (bound {BOUND:?}, timeout {TIMEOUT:?}), {} bodies",
        committed.len(),
        healthy.received().len()
    );
}

at_every_isolation! {
    a_stalled_endpoint_delays_no_other;
}
