//! The outbox of before (a row per event, up to m20261210) migrated to rows
//! of up to 100 events (m20261211) with a backlog in it: every endpoint is
//! sent its backlog whole, once, in order, and only its types, and what is
//! made after follows it.

use sea_orm::ConnectionTrait;
use serde_json::json;
use stockguard::auth::Role;
use uuid::Uuid;

use super::{limits, receiver::Receiver, verifies};
use crate::helpers::{BeforeMigration, Options, TestApp, eventually};

/// Three events as the pump of before wrote them, one outbox row each.
const BACKLOG: [(i64, u128, &str); 3] =
    [(1, 0xe1, "STOCK_CHANGED"), (2, 0xe2, "RESERVATION_CHANGED"), (3, 0xe3, "STOCK_CHANGED")];

/// The body of before's event `seq`.
fn body(seq: i64, id: Uuid, kind: &str) -> String {
    let data = match kind {
        "STOCK_CHANGED" => {
            r#"{"reason":"RESTOCKED","delta":1,"locations":[],"available":1,"reserved":0,"committed":0,"onHand":1,"reservationId":null,"orderId":null}"#
        }
        _ => {
            r#"{"reservationId":"00000000-0000-0000-0000-0000000000a1","status":"ACTIVE","quantity":1,"orderId":null}"#
        }
    };
    format!(
        r#"{{"id":"{id}","type":"{kind}","occurredAt":"2026-12-01T10:00:00+00:00","inventoryId":"00000000-0000-0000-0000-0000000000b1","version":{},"data":{data}}}"#,
        seq + 1
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backlog_of_a_row_per_event_is_sent_whole_after_the_migration() {
    let before = BeforeMigration::new("m20261211_090000_keep_a_bodys_events_in_one_row").await;
    let db = &before.db;
    let (every, stock) = (Receiver::start().await, Receiver::start().await);
    let mut written = String::from("INSERT INTO outbox (seq, id, type, body) VALUES ");
    for (n, (seq, id, kind)) in BACKLOG.into_iter().enumerate() {
        let id = Uuid::from_u128(id);
        let separator = if n == 0 { "" } else { ", " };
        written += &format!("{separator}({seq}, '{id}', '{kind}', '{}')", body(seq, id, kind));
    }
    db.execute_unprepared(&format!(
        "INSERT INTO webhook_endpoints (url, events, secret, sent_through) VALUES
           ('{}', ARRAY['STOCK_CHANGED', 'RESERVATION_CHANGED', 'ORDER_CHANGED'], 'every-secret', 0),
           ('{}', ARRAY['STOCK_CHANGED'], 'stock-secret', 0);
         {written};
         UPDATE event_pump SET last_seq = 3, seen = pg_current_snapshot();",
        every.url, stock.url
    ))
    .await
    .expect("a backlog as before wrote it");
    before.migrate().await;
    let kept = "SELECT count(*) FROM outbox WHERE first_seq = seq AND cardinality(ids) = 1";
    let row = db.query_one_raw(sea_orm::Statement::from_string(sea_orm::DbBackend::Postgres, kept)).await;
    let kept: i64 = row.expect("count").expect("a row").try_get("", "count").expect("count");
    assert_eq!(kept, 3, "each event of before is a row of its one event");
    let name = before.hand_over().await;
    let app =
        TestApp::spawn_with_options(Options { database: Some(name), limits: limits(&[1.0]), ..Options::default() })
            .await;
    let ids = |receiver: &Receiver| -> Vec<Uuid> {
        receiver
            .accepted_events()
            .iter()
            .map(|e| e["id"].as_str().and_then(|id| id.parse().ok()).expect("an id"))
            .collect()
    };
    let backlog = |kinds: &[&str]| -> Vec<Uuid> {
        BACKLOG.iter().filter(|(_, _, kind)| kinds.contains(kind)).map(|&(_, id, _)| Uuid::from_u128(id)).collect()
    };
    eventually(std::time::Duration::from_secs(20), "both backlogs sent", || async {
        ids(&every).len() >= 3 && ids(&stock).len() >= 2
    })
    .await;
    assert_eq!(ids(&every), backlog(&["STOCK_CHANGED", "RESERVATION_CHANGED"]), "the whole backlog, once, in order");
    assert_eq!(ids(&stock), backlog(&["STOCK_CHANGED"]), "only its type, once, in order");
    for (receiver, secret) in [(&every, "every-secret"), (&stock, "stock-secret")] {
        for received in receiver.received() {
            assert!(verifies(secret, &received.signature, &received.body), "signed: {}", received.body);
            for event in super::events(&received.body) {
                let Some(&(seq, id, kind)) = BACKLOG.iter().find(|b| event["id"] == Uuid::from_u128(b.1).to_string())
                else {
                    continue;
                };
                let before = body(seq, Uuid::from_u128(id), kind);
                assert!(received.body.contains(&before), "sent as before wrote it: {before} in {}", received.body);
            }
        }
    }

    // What is made after follows, in rows of the new shape.
    let item = app.create_inventory("MIGRATED-EV", 3).await;
    app.reserve(&app.token("migrated-ev", Role::Customer), json!({ "inventoryId": item, "quantity": 1 })).await;
    eventually(std::time::Duration::from_secs(20), "the new changes sent", || async {
        ids(&every).len() >= 3 + 3 && ids(&stock).len() >= 2 + 2
    })
    .await;
    assert_eq!(ids(&every)[..3], backlog(&["STOCK_CHANGED", "RESERVATION_CHANGED"]), "nothing sent twice");
}
