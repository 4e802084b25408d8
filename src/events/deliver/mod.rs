//! Delivery: each active endpoint's outbox rows, in order, in bodies of up
//! to 100 events (an outbox row's), signed, at least once.
//!
//! Every process leases the endpoints nobody holds (`leased_until` in the
//! past) and runs one task per endpoint it holds, so an endpoint is served
//! by one process at a time (no double send in normal operation), a slow or
//! dead endpoint holds up only its own task, and the endpoints of a process
//! that died are taken over when its leases run out. A task works through
//! its endpoint's deliveries in order, oldest first: the next bodies are
//! cut from the outbox (the events after the endpoint's cursor that it
//! subscribes to, a body per outbox row) and recorded as PENDING
//! deliveries, with the cursor moved, in one statement, before they are
//! sent; each is sent only after the one before it was answered 2xx, and is
//! retried until a 2xx answers or the schedule is spent (FAILED, which
//! turns the endpoint off until `redeliverFailed` sends it again). So an
//! endpoint sees each inventory's and each order's events in version order,
//! within and across bodies, and a process killed mid-send leaves PENDING
//! deliveries that whoever leases the endpoint next sends again. A task
//! holds at most `outbox::step::BATCH` bodies, whatever the backlog.
//!
//! By idea: [`supervise`] leases the endpoints and keeps a task running for
//! each, [`endpoint`] is one endpoint's task, [`send`] sends one body; the
//! SQL of deliveries is the outbox's (`events::outbox::step`).

mod endpoint;
pub mod send;
pub(super) mod supervise;

use std::time::Duration;

/// How a process delivers.
#[derive(Debug, Clone)]
pub(crate) struct Delivering {
    /// How long a process holds an endpoint without renewing its lease.
    pub lease: Duration,
    /// How long one attempt may take, connection included.
    pub timeout: Duration,
    /// The waits between attempts; after the last one fails the delivery is FAILED.
    pub schedule: Vec<Duration>,
    /// Whether `http` to a loopback address is allowed (development, tests).
    pub allow_loopback: bool,
    /// How often an idle endpoint looks for new events, and the process for endpoints to lease.
    pub poll: Duration,
}
