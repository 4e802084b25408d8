//! Events out (docs/webhooks.md): every committed change of stock, of a
//! reservation's status and of an order, delivered to webhook endpoints at
//! least once, in order per inventory and per order, signed.
//!
//! The change records its event itself (its ledger rows, or a row of
//! `events` written in its transaction), so a crash between commit and send
//! loses nothing. [`pump`] reads the changes of finished transactions and
//! writes the events [`render`] makes of them into the outbox, numbered in
//! delivery order; [`deliver`] sends each endpoint its
//! events; [`retention`] ages out what nobody took. Endpoints are managed
//! through `crate::webhooks`.

pub mod deliver;
pub mod pump;
pub mod render;
pub mod retention;
