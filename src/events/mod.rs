//! Events out (docs/webhooks.md): every committed change of stock, of a
//! reservation's status and of an order, delivered to webhook endpoints at
//! least once, in order per inventory and per order, signed.
//!
//! The change records its event itself (its ledger rows, or a row of
//! `events` written in its transaction), so a crash between commit and send
//! loses nothing. [`pump`] reads the changes of finished transactions and
//! writes the events [`render`] makes of them into the [`outbox`], numbered
//! in delivery order; [`deliver`] sends each endpoint its events as the
//! outbox's deliveries; [`restart`] starts either again if it panics;
//! [`retention`] ages out what nobody took. Endpoints are managed through
//! `crate::webhooks`, which comes here for the vocabulary below, the
//! deliveries' history and the [`egress`] rules; nothing here imports it.

pub mod deliver;
pub mod egress;
pub mod outbox;
pub mod pump;
pub(crate) mod render;
pub(crate) mod restart;
pub(crate) mod retention;

use sea_orm::{DatabaseConnection, DeriveActiveEnum, EnumIter};
use tokio::{sync::watch, task::JoinHandle};
use uuid::Uuid;

/// The settings of the connections events work on (`stockguard-events`,
/// opened by [`spawn`]), where every pass and every delivery runs, beyond
/// those of every connection of the server (no JIT, `crate::db::connect`).
///
/// - Commits that do not wait for the disk: a crash or failover of
///   PostgreSQL can undo only the last of them, and an undone pass is made
///   again from the ledger (whose commits do wait), an undone delivery is
///   sent again; nothing is lost, and at worst an event arrives twice,
///   which at least once allows. A flush a pass and a step cost the events'
///   backends a tenth of their CPU (bench/results/decisions.md).
/// - No sequential scans: the statements are planned once per connection,
///   often while the day's ledger partition or the outbox is still empty.
///   A pass that scanned the partition whole read every row written since
///   (40,006 rows, 40 ms, for a pass that found none, under `bench load
///   reserve`); a delivery that scanned the outbox for its body visited
///   every row the pump had deleted since the last vacuum, a quarter of
///   the events' backends' CPU under load. The ledger's BRIN index and the
///   outbox's key bound the reads whatever the statistics said.
pub const SETTINGS: [(&str, &str); 2] = [("synchronous_commit", "off"), ("enable_seqscan", "off")];

/// Starts the event pump and the webhook deliveries on a thread of their
/// own ([`THREAD`]), with connections of their own (`stockguard-events`),
/// until `stop` turns true, each started again if it panics
/// ([`restart`]); the handle ends when both have stopped.
///
/// Not on the requests' runtime: a pass makes thousands of events at a
/// time, and a delivery step reads and signs bodies of up to 100, each
/// without a pause; on the requests' one thread (two cores shared with
/// PostgreSQL, src/cli.rs) every request waited out each of them. On a
/// thread of their own the kernel shares the cores between the two instead.
/// Their connections are the thread's too, so neither runtime wakes the
/// other for them; only the looks for endpoints (once a second) go through
/// `requests`' pool, which is open anyway.
pub(crate) fn spawn(
    requests: DatabaseConnection,
    delivering: deliver::Delivering,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let (done, stopped) = tokio::sync::oneshot::channel::<()>();
    let work = move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(async move {
            let events = crate::db::side_pool(&requests, "stockguard-events", 2, &SETTINGS);
            let pump = restart::supervised("pump", restart::PAUSE, stop.clone(), || {
                pump::run(requests.clone(), events.clone(), delivering.poll, stop.clone())
            });
            // The process's name in the endpoints' leases, the same across
            // restarts of the dispatcher, which then renews its own leases
            // at once instead of waiting for them to lapse.
            let me = Uuid::new_v4();
            let dispatcher = restart::supervised("dispatcher", restart::PAUSE, stop.clone(), || {
                deliver::supervise::run(requests.clone(), events.clone(), delivering.clone(), me, stop.clone())
            });
            tokio::join!(pump, dispatcher);
        });
        drop(done);
        std::io::Result::Ok(())
    };
    let started = std::thread::Builder::new().name(THREAD.into()).spawn(move || {
        if let Err(err) = work() {
            tracing::error!(error = %err, "the events' runtime could not start: no events are sent");
        }
    });
    if let Err(err) = started {
        tracing::error!(error = %err, "the events' thread could not start: no events are sent");
    }
    tokio::spawn(async move {
        let _ = stopped.await;
    })
}

/// The name of the events' thread (as `top -H` shows it).
pub const THREAD: &str = "sg-events";

/// The types of event, as a body's `type`, `outbox.types`, `events.type`
/// and an endpoint's `events` spell them; SQL text takes them from here
/// with `stock::rows::sql`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "Text")]
pub(crate) enum EventType {
    /// A change of an inventory's stock (one ledger change).
    #[sea_orm(string_value = "STOCK_CHANGED")]
    StockChanged,
    /// A change of a reservation's status.
    #[sea_orm(string_value = "RESERVATION_CHANGED")]
    ReservationChanged,
    /// A new version of an order.
    #[sea_orm(string_value = "ORDER_CHANGED")]
    OrderChanged,
    /// A waiting list entry joined or changed status.
    #[sea_orm(string_value = "WAITLIST_CHANGED")]
    WaitlistChanged,
}

/// Where a delivery (one body of 1 to 100 events to one endpoint) stands,
/// as `webhook_deliveries.status` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "Text")]
pub(crate) enum DeliveryStatus {
    /// Not yet answered with a 2xx; sent (again) at `next_attempt_at`.
    #[sea_orm(string_value = "PENDING")]
    Pending,
    /// Answered with a 2xx.
    #[sea_orm(string_value = "DELIVERED")]
    Delivered,
    /// Every attempt of the retry schedule failed; `redeliverFailed` makes it PENDING again.
    #[sea_orm(string_value = "FAILED")]
    Failed,
}

#[cfg(test)]
mod tests {
    use sea_orm::{ActiveEnum as _, Iterable as _};

    use super::*;

    /// The names are the receivers' contract (a body's `type`) and what
    /// the migrations' CHECK lists allow: renaming a variant must not
    /// rename what is stored and sent.
    #[test]
    fn event_types_and_delivery_statuses_keep_their_stored_names() {
        let types: Vec<String> = EventType::iter().map(|kind| kind.to_value()).collect();
        assert_eq!(types, ["STOCK_CHANGED", "RESERVATION_CHANGED", "ORDER_CHANGED", "WAITLIST_CHANGED"]);
        let statuses: Vec<String> = DeliveryStatus::iter().map(|status| status.to_value()).collect();
        assert_eq!(statuses, ["PENDING", "DELIVERED", "FAILED"]);
    }
}
