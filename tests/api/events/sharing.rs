//! Endpoints and processes side by side (issue 27, items 3 and 7): a
//! stalled endpoint delays no other endpoint, and two processes on one
//! database send each delivery once when nothing fails.

use std::{
    collections::BTreeSet,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::FutureExt;
use serde_json::json;
use stockguard::{auth::Role, config::Limits};
use stockguard_support::documents::{RELEASE, RESERVE};

use super::{
    assert_in_order, committed_changes, first_arrivals, ledger_changes, limits,
    receiver::{Answer, Receiver},
    spawn, stock_changes, subscribe, subscribe_process, until_delivered, verifies,
};
use crate::{
    helpers::{Isolation, at_every_isolation, at_once, eventually},
    process::Process,
};

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
    until_delivered(&healthy, &committed, limit, "B has every change within the bound of A's second attempt").await;
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

/// Two processes sharing one endpoint: loopback allowed, a fast pump, a
/// 1 s lease (as in kills.rs, so a lapse would soon hand the endpoint over
/// and show as a second send) and a timeout the accepting receiver never
/// comes near.
const TWO_PROCESSES: [(&str, &str); 5] = [
    ("STOCKGUARD_WEBHOOK_ALLOW_LOOPBACK", "true"),
    ("STOCKGUARD_EVENT_POLL_MS", "20"),
    ("STOCKGUARD_WEBHOOK_TIMEOUT_MS", "2000"),
    ("STOCKGUARD_WEBHOOK_RETRY_SCHEDULE", "0.05,0.05,0.05,0.05,0.05"),
    ("STOCKGUARD_WEBHOOK_LEASE_SECS", "1"),
];

/// How long the load runs.
const LOAD: Duration = Duration::from_secs(6);

/// Rounds of twelve clients at once until [`LOAD`] has passed, each
/// reserving through one process and releasing two reservations in three
/// through the other; how many reserves and releases were granted.
async fn load(processes: [Arc<Process>; 2], items: &[uuid::Uuid]) -> (usize, usize) {
    let started = Instant::now();
    let (mut reserved, mut released) = (0, 0);
    for round in 0.. {
        if started.elapsed() >= LOAD {
            break;
        }
        let calls = (0..12).map(|n: usize| {
            let processes = processes.clone();
            let item = items[(round + n) % items.len()];
            async move {
                let token = processes[0].token(&format!("share-{n}"), Role::Customer);
                let (on, other) = (&processes[n % 2], &processes[(n + 1) % 2]);
                let input = json!({ "input": { "inventoryId": item } });
                let (_, answer) = on.graphql(Some(&token), RESERVE, input).await.expect("a reserve answered");
                let id = answer["data"]["reserve"]["reservation"]["id"].clone();
                let release = id.is_string() && !n.is_multiple_of(3);
                let released = if release {
                    let (_, answer) =
                        other.graphql(Some(&token), RELEASE, json!({ "id": id })).await.expect("answered");
                    answer["data"]["releaseReservation"]["__typename"] == "ReservationReleased"
                } else {
                    false
                };
                (id.is_string(), released)
            }
            .boxed()
        });
        for (granted, freed) in at_once(calls.collect()).await {
            reserved += usize::from(granted);
            released += usize::from(freed);
        }
    }
    (reserved, released)
}

/// Two server processes on one database, one accepting receiver, a few
/// seconds of reserves and releases through both, no kill: every committed
/// change arrives, first arrivals in order, every signature verifies, no
/// delivery and no event arrives twice (duplicates are allowed only after a
/// failure), and each delivery row was DELIVERED at its one attempt. Both
/// processes also pump (a pass at a time, under the pump row's lock): an
/// event numbered twice shows here as an event id that arrives twice.
#[tokio::test(flavor = "multi_thread")]
async fn two_processes_send_each_delivery_once() {
    let (first, second) = Process::start_two(&TWO_PROCESSES, Isolation::ReadCommitted).await;
    let (first, second) = (Arc::new(first), Arc::new(second));
    let receiver = Receiver::start().await;
    let secret = subscribe_process(&first, &receiver).await;
    let mut items = Vec::new();
    for n in 0..3 {
        items.push(first.create_inventory(&format!("TWO-{n}"), 1_000_000).await);
    }

    let (reserved, released) = load([first.clone(), second.clone()], &items).await;
    assert!(reserved > 0 && released > 0, "{reserved} reserved, {released} released");
    let committed = ledger_changes(&first.db, &items).await;
    until_delivered(&receiver, &committed, Duration::from_secs(60), "every committed change delivered").await;
    // The receiver has answered the last body; its row is marked a moment later.
    eventually(Duration::from_secs(10), "every delivery marked", || {
        let first = first.clone();
        async move { first.count("SELECT count(*) FROM webhook_deliveries WHERE status = 'PENDING'").await == 0 }
    })
    .await;

    let received = receiver.received();
    let accepted = receiver.accepted_events();
    let first_arrived = first_arrivals(&accepted);
    let delivered = stock_changes(&first_arrived);
    assert_eq!(delivered.iter().copied().collect::<BTreeSet<_>>(), committed, "one per committed change");
    assert_in_order(&first_arrived);
    for body in &received {
        assert_eq!(body.answered, Answer::Accept);
        assert!(verifies(&secret, &body.signature, &body.body), "signature of {}", body.delivery);
    }
    let deliveries_again = repeated(received.iter().map(|r| r.delivery.clone()));
    assert!(deliveries_again.is_empty(), "deliveries sent twice: {deliveries_again:?}");
    let rows = first.count("SELECT count(*) FROM webhook_deliveries").await;
    assert_eq!(usize::try_from(rows).expect("a count"), received.len(), "as many requests as delivery rows");
    let once = "SELECT count(*) FROM webhook_deliveries WHERE status = 'DELIVERED' AND attempts = 1";
    assert_eq!(first.count(once).await, rows, "every delivery DELIVERED at its first attempt");
    let events_again = repeated(accepted.iter().map(|e| format!("{} {} v{}", e["id"], e["type"], e["version"])));
    assert!(
        events_again.is_empty(),
        "{} events sent twice, e.g. {:?}",
        events_again.len(),
        &events_again[..3.min(events_again.len())]
    );
    eprintln!(
        "two_processes_send_each_delivery_once: {reserved} reserves, {released} releases, {} stock changes, \
         {} events in {} bodies, 0 twice",
        committed.len(),
        accepted.len(),
        received.len()
    );
}

/// The items that come more than once, each once.
fn repeated(items: impl Iterator<Item = String>) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let again: BTreeSet<String> = items.filter(|item| !seen.insert(item.clone())).collect();
    again.into_iter().collect()
}
