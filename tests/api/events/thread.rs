//! The events' work runs on a thread of its own (src/events/mod.rs): a
//! pass makes thousands of events without a pause, and on the requests'
//! one thread every request waited each pass out.

use std::time::Duration;

use serde_json::json;
use stockguard::{auth::Role, events};
use stockguard_support::documents::RESERVE;

use super::{receiver::Receiver, subscribe_process};
use crate::{helpers::eventually, process::Process};

#[tokio::test(flavor = "multi_thread")]
async fn events_are_made_and_sent_on_a_thread_of_their_own() {
    let env = [("STOCKGUARD_WEBHOOK_ALLOW_LOOPBACK", "true"), ("STOCKGUARD_EVENT_POLL_MS", "20")];
    let process = Process::start(&env).await;
    let receiver = Receiver::start().await;
    subscribe_process(&process, &receiver).await;
    let item = process.create_inventory("THREAD-1", 5).await;
    let token = process.token("thread-user", Role::Customer);
    let (status, reply) =
        process.graphql(Some(&token), RESERVE, json!({ "input": { "inventoryId": item } })).await.expect("reserve");
    assert_eq!(status, 200, "{reply}");
    eventually(Duration::from_secs(20), "the reservation's events delivered", || async {
        receiver.accepted_events().len() >= 2
    })
    .await;
    let threads = process.thread_names();
    assert!(threads.iter().any(|name| name == events::THREAD), "no thread {}: {threads:?}", events::THREAD);
}
