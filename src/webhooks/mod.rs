//! Webhooks, as operators see them: the endpoints events are sent to (a
//! URL, the event types it takes, a signing secret shown once), their
//! deliveries and what became of each, and replaying the failed ones. Every
//! URL passes the egress rules at creation here and again at delivery
//! (`crate::events::egress`). Sending, and the outbox and delivery tables,
//! are the event pump's and dispatcher's, in `src/events/`, which this
//! feature reads and writes the deliveries through; docs/webhooks.md is the
//! integrators' side.

pub(crate) mod graphql;
pub(crate) mod service;
pub(crate) mod store;
