//! A reader beside reserves, releases, extensions and the sweeper never
//! sees a partial kit, in SQL or through the API, nor through the API a
//! kit whose expiry passes while it is read.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::FutureExt;
use rand::{RngExt as _, SeedableRng, rngs::StdRng};
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use serde_json::{Value, json};
use stockguard::auth::Role;

use super::{
    Kit, ROUNDS, Raced, SEED, assert_answered, name_of, releasing_kit, reserving_kit, reserving_one, spread, sweeping,
    three_locations,
};
use crate::{
    documents::EXTEND_KIT,
    helpers::{Isolation, TestApp, at_every_isolation, at_once, eventually, uuid},
    kits::{kit_of, reserve_kit},
    location_races::{assert_levels_add_up, random_choice},
    locations::stocked,
};

/// Kit reservations by `nodeId`, with their status and their components'.
const KIT_RESERVATION_NODES: &str = "query($ids: [ID!]!) { nodes(ids: $ids) {
   ... on KitReservation { id status reservations { status } } } }";

/// Every kit reservation a reader must never see: components in more than
/// one status, or not exactly one reservation per component of its kit.
/// One statement, so one snapshot at every isolation level.
const PARTIAL_KITS: &str = "
SELECT kit_reservation_id AS id, array_agg(DISTINCT status::text) AS statuses, count(*) AS parts
  FROM reservations WHERE kit_reservation_id IS NOT NULL
 GROUP BY 1 HAVING count(DISTINCT status) > 1
UNION ALL
SELECT k.id, ARRAY[]::text[], count(r.id)
  FROM kit_reservations k LEFT JOIN reservations r ON r.kit_reservation_id = k.id
 GROUP BY k.id, k.kit_id HAVING count(r.id) <> (SELECT count(*) FROM kit_components c WHERE c.kit_id = k.kit_id)";

/// Reads every kit reservation in one statement until `stop`, counting its
/// reads in `reads`; every partial kit it saw.
fn reading_sql(
    app: &Arc<TestApp>,
    stop: &Arc<AtomicBool>,
    reads: &Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<Vec<Value>> {
    let (app, stop, reads) = (app.clone(), stop.clone(), reads.clone());
    tokio::spawn(async move {
        let mut seen = Vec::new();
        let wrapped = format!("SELECT coalesce(json_agg(t), '[]'::json)::text FROM ({PARTIAL_KITS}) t");
        loop {
            let stopping = stop.load(Ordering::SeqCst);
            let read = app.db.query_one_raw(Statement::from_string(DbBackend::Postgres, wrapped.clone())).await;
            match read {
                Ok(row) => {
                    let text: String = row.expect("one row").try_get_by_index(0).expect("json text");
                    let found: Vec<Value> = serde_json::from_str(&text).expect("json");
                    seen.extend(found);
                    reads.fetch_add(1, Ordering::SeqCst);
                }
                // At SERIALIZABLE a reader may be the one PostgreSQL cancels
                // to break a cycle of writers: it saw nothing, and reads again.
                Err(err) if stockguard::db::classify(&err).is_collision() => continue,
                Err(err) => panic!("the reader failed: {err}"),
            }
            if stopping {
                return seen;
            }
        }
    })
}

/// Reads the kit reservations `node_ids` through the API (as an operator,
/// who may see them all) until `stop`, counting its reads in `reads`;
/// every kit reservation it saw whose components' statuses were not all
/// its own.
fn reading_api(
    app: &Arc<TestApp>,
    node_ids: Vec<String>,
    stop: &Arc<AtomicBool>,
    reads: &Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<Vec<Value>> {
    let (app, stop, reads) = (app.clone(), stop.clone(), reads.clone());
    tokio::spawn(async move {
        let operator = app.operator();
        let mut seen = Vec::new();
        loop {
            let stopping = stop.load(Ordering::SeqCst);
            let body = app.graphql(Some(&operator), KIT_RESERVATION_NODES, json!({ "ids": node_ids })).await;
            let nodes = body["data"]["nodes"].as_array().unwrap_or_else(|| panic!("{body}"));
            assert_eq!(nodes.len(), node_ids.len(), "{body}");
            for node in nodes {
                let parts = node["reservations"].as_array().unwrap_or_else(|| panic!("{body}"));
                if parts.is_empty() || parts.iter().any(|p| p["status"] != node["status"]) {
                    seen.push(node.clone());
                }
            }
            reads.fetch_add(1, Ordering::SeqCst);
            if stopping {
                return seen;
            }
        }
    })
}

/// Per round: a kit K of A + B + 2 C (each inventory 60 units over three
/// locations) and 16 kit reservations of it held by as many customers, the
/// first four past their expiry. Two readers start and keep reading: one
/// statement over every kit reservation ([`PARTIAL_KITS`]) and the API
/// (`nodes` of the 16, each `KitReservation { status reservations { status }
/// }`). Then at once: releases of six of the held kits (three of them
/// twice), extensions of four, the sweeper (batches of 2), 12 new kits and
/// 6 single reserves of A, B and C. Neither reader ever saw a partial kit,
/// and each read while the race ran; every answer is a union member; each
/// released kit was released once and the second release answered
/// `ReservationNotActive`; the sweeper expired exactly the four due kits'
/// twelve components; afterwards every held kit is in the status its
/// requests gave it, and the check holds.
async fn a_reader_beside_the_mix_never_sees_a_partial_kit(isolation: Isolation) {
    let app = Arc::new(TestApp::without_sweeper(isolation).await);
    let at = three_locations(&app).await;
    let mut rng = StdRng::seed_from_u64(SEED + 1);
    let (mut sql_reads, mut api_reads, mut totals) = (0, 0, BTreeMap::<String, usize>::new());
    for round in 0..ROUNDS {
        let a = spread(&app, &format!("READ-A-{round}"), &at, [20, 20, 20]).await;
        let b = spread(&app, &format!("READ-B-{round}"), &at, [20, 20, 20]).await;
        let c = spread(&app, &format!("READ-C-{round}"), &at, [20, 20, 20]).await;
        let given = json!([{ "inventoryId": a, "quantity": 1 }, { "inventoryId": b, "quantity": 1 }, { "inventoryId": c, "quantity": 2 }]);
        let kit = Kit::new(&app, &format!("READ-{round}"), given, vec![(a, 1), (b, 1), (c, 2)]).await;
        let mut held = Vec::new();
        for n in 0..16 {
            let user = format!("holder-{round}-{n}");
            let answer = reserve_kit(&app, &app.token(&user, Role::Customer), kit.id, 1, json!({})).await;
            assert_eq!(answer["__typename"], "KitReserved", "{answer}");
            let reservation = &answer["kitReservation"];
            held.push((user, uuid(&reservation["id"]), reservation["nodeId"].as_str().expect("nodeId").to_owned()));
        }
        let due: Vec<String> = held[..4].iter().map(|(_, id, _)| format!("'{id}'")).collect();
        let due = format!(
            "UPDATE reservations SET expires_at = now() - interval '1 second' WHERE kit_reservation_id IN ({})",
            due.join(",")
        );
        app.db.execute_unprepared(&due).await.expect("make four kits due");

        let stop = Arc::new(AtomicBool::new(false));
        let (sql_count, api_count) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let sql_reader = reading_sql(&app, &stop, &sql_count);
        let api_reader = reading_api(&app, held.iter().map(|h| h.2.clone()).collect(), &stop, &api_count);
        eventually(Duration::from_secs(30), "both readers read", || async {
            sql_count.load(Ordering::SeqCst) > 0 && api_count.load(Ordering::SeqCst) > 0
        })
        .await;
        let started = (sql_count.load(Ordering::SeqCst), api_count.load(Ordering::SeqCst));

        let mut requests: Vec<Raced> = Vec::new();
        for (user, id, _) in held[4..10].iter().chain(&held[4..7]) {
            requests.push(releasing_kit(&app, user, *id));
        }
        for (user, id, _) in &held[10..14] {
            let (user, id) = (user.clone(), *id);
            let app = app.clone();
            requests.push(
                async move {
                    let token = app.token(&user, Role::Customer);
                    let extended =
                        app.mutate(&token, "extendKitReservation", EXTEND_KIT, json!({ "id": id, "seconds": 60 }));
                    ("extendKit", extended.await)
                }
                .boxed(),
            );
        }
        requests.push(sweeping(&app, 2));
        for n in 0..12 {
            let choice = random_choice(&mut rng, &at);
            requests.push(reserving_kit(&app, format!("racer-{round}-{n}"), kit.id, rng.random_range(1..=2), &choice));
        }
        for (n, item) in [a, b, c, a, b, c].into_iter().enumerate() {
            let choice = random_choice(&mut rng, &at);
            requests.push(reserving_one(&app, format!("single-{round}-{n}"), item, rng.random_range(1..=3), &choice));
        }
        let answers = at_once(requests).await;
        let during = (sql_count.load(Ordering::SeqCst) - started.0, api_count.load(Ordering::SeqCst) - started.1);
        stop.store(true, Ordering::SeqCst);
        let (partial_sql, partial_api) = (sql_reader.await.expect("reader"), api_reader.await.expect("reader"));
        assert!(partial_sql.is_empty(), "round {round}: a statement saw partial kits: {partial_sql:#?}");
        assert!(partial_api.is_empty(), "round {round}: the API showed partial kits: {partial_api:#?}");
        assert!(during.0 > 0 && during.1 > 0, "round {round}: both readers read while the race ran: {during:?}");
        sql_reads += sql_count.load(Ordering::SeqCst);
        api_reads += api_count.load(Ordering::SeqCst);

        let allowed = [
            "KitReservationReleased",
            "ReservationNotActive",
            "ReservationExtended",
            "Swept",
            "KitReserved",
            "KitSoldOut",
            "Reserved",
            "SoldOut",
        ];
        let counts = assert_answered(&answers, &allowed, "beside the readers");
        let of = |kind: &str| answers.iter().filter(|(k, _)| *k == kind).map(|(_, a)| name_of(a)).collect::<Vec<_>>();
        let (releases, extends) = (of("releaseKit"), of("extendKit"));
        // The kits released twice (4..7) by exactly one of their two
        // releases, whichever ran first; the others (7..10) by their one.
        for n in 0..6 {
            let mut answered: Vec<&str> = vec![releases[n]];
            if n < 3 {
                answered.push(releases[n + 6]);
            }
            answered.sort_unstable();
            let expected: &[&str] =
                if n < 3 { &["KitReservationReleased", "ReservationNotActive"] } else { &["KitReservationReleased"] };
            assert_eq!(answered, expected, "round {round}: the releases of held kit {}", n + 4);
        }
        assert_eq!(extends, ["ReservationExtended"; 4]);
        let swept = answers.iter().find(|(k, _)| *k == "sweep").map(|(_, a)| a["expired"].clone());
        if swept != Some(json!(12)) {
            let due: Vec<String> = held[..4].iter().map(|(_, id, _)| format!("'{id}'")).collect();
            let left = app
                .rows(&format!(
                    "SELECT kit_reservation_id, status::text, expires_at::text, now()::text AS now FROM reservations
                      WHERE kit_reservation_id IN ({}) ORDER BY 1",
                    due.join(",")
                ))
                .await;
            panic!("round {round}: the sweeper expired {swept:?}, not the four due kits' 12 components: {left:#?}");
        }
        for (n, (_, id, _)) in held.iter().enumerate() {
            let expected = match n {
                0..4 => "EXPIRED",
                4..10 => "RELEASED",
                _ => "ACTIVE",
            };
            let statuses = app
                .rows(&format!(
                    "SELECT DISTINCT status::text AS status FROM reservations WHERE kit_reservation_id = '{id}'"
                ))
                .await;
            assert_eq!(statuses, vec![json!({ "status": expected })], "round {round}: held kit {n}");
        }
        assert_levels_add_up(&app.db).await;
        app.assert_invariant().await;
        for (name, n) in counts {
            *totals.entry(name).or_default() += n;
        }
    }
    eprintln!(
        "a_reader_beside_the_mix_never_sees_a_partial_kit {isolation:?} (seed {:#x}): {ROUNDS} rounds x 38 requests, \
         {sql_reads} reads in SQL and {api_reads} through the API: {totals:?}",
        SEED + 1
    );
}

/// Reads `node_ids` through the API, counting reads in `reads`, until a
/// read shows every one EXPIRED (30 s at most, then the test fails);
/// every kit reservation shown with components in a status not its own.
fn reading_api_across(
    app: &Arc<TestApp>,
    node_ids: Vec<String>,
    reads: &Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<Vec<Value>> {
    let (app, reads) = (app.clone(), reads.clone());
    tokio::spawn(async move {
        let (operator, start) = (app.operator(), std::time::Instant::now());
        let mut partial = Vec::new();
        loop {
            let body = app.graphql(Some(&operator), KIT_RESERVATION_NODES, json!({ "ids": node_ids })).await;
            let nodes = body["data"]["nodes"].as_array().unwrap_or_else(|| panic!("{body}")).clone();
            for node in &nodes {
                let parts = node["reservations"].as_array().unwrap_or_else(|| panic!("{body}"));
                if parts.iter().any(|p| p["status"] != node["status"]) {
                    partial.push(node.clone());
                }
            }
            reads.fetch_add(1, Ordering::SeqCst);
            if nodes.iter().all(|node| node["status"] == "EXPIRED") {
                return partial;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "the kits never read as EXPIRED: {body}");
        }
    })
}

/// Times the kit reservations' expiries pass while the readers read.
const CROSSINGS: usize = 8;

/// Readers of the kit reservations across their expiry.
const READERS: usize = 6;

/// A kit reservation whose expiry passes while it is being read: 30 kit
/// reservations of a kit of 20 components, read through the API by six
/// readers over and over; once each has read them (ACTIVE: due in an
/// hour), they are made due one every 20 ms from 200 ms on (not swept: the
/// API shows a due hold as EXPIRED), and the readers go on until they read
/// them all EXPIRED; eight times. No read shows a kit reservation with a
/// component in a status not its own.
async fn a_kit_expiring_while_read_through_the_api_is_never_shown_partial(isolation: Isolation) {
    let app = Arc::new(TestApp::without_sweeper(isolation).await);
    let mut given = Vec::new();
    for n in 0..20 {
        given.push(json!({ "inventoryId": stocked(&app, &format!("EDGE-{n}"), 100).await, "quantity": 1 }));
    }
    let kit = kit_of(&app, "EDGE", json!(given)).await;
    let mut held = Vec::new();
    for n in 0..30 {
        let answer = reserve_kit(&app, &app.token(&format!("edge-{n}"), Role::Customer), kit, 1, json!({})).await;
        assert_eq!(answer["__typename"], "KitReserved", "{answer}");
        held.push(answer["kitReservation"]["nodeId"].as_str().expect("nodeId").to_owned());
    }
    let far = "UPDATE reservations SET expires_at = now() + interval '1 hour' WHERE kit_reservation_id IS NOT NULL";
    // One kit reservation due every 20 ms from 200 ms on, each with all its
    // components: whenever a read runs in those 600 ms, some kit's expiry
    // passes while it resolves.
    let soon = "UPDATE reservations r
                   SET expires_at = now() + interval '200 milliseconds' + o.n * interval '20 milliseconds'
                  FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM kit_reservations) o
                 WHERE r.kit_reservation_id = o.id";
    let mut reads = 0;
    for round in 0..CROSSINGS {
        app.db.execute_unprepared(far).await.expect("due in an hour");
        let counts: Vec<Arc<AtomicUsize>> = (0..READERS).map(|_| Arc::new(AtomicUsize::new(0))).collect();
        let readers: Vec<_> = counts.iter().map(|count| reading_api_across(&app, held.clone(), count)).collect();
        eventually(Duration::from_secs(30), "every reader read the kits ACTIVE", || async {
            counts.iter().all(|count| count.load(Ordering::SeqCst) > 0)
        })
        .await;
        app.db.execute_unprepared(soon).await.expect("due from 200 ms on");
        for reader in readers {
            let partial = reader.await.expect("reader");
            assert!(partial.is_empty(), "round {round}: the API showed partial kits: {partial:#?}");
        }
        reads += counts.iter().map(|count| count.load(Ordering::SeqCst)).sum::<usize>();
    }
    app.assert_invariant().await;
    eprintln!(
        "a_kit_expiring_while_read_through_the_api_is_never_shown_partial {isolation:?}: {CROSSINGS} crossings, \
         {READERS} readers of 30 kit reservations of 20 components, {reads} reads"
    );
}

at_every_isolation! {
    a_reader_beside_the_mix_never_sees_a_partial_kit;
    a_kit_expiring_while_read_through_the_api_is_never_shown_partial;
}
