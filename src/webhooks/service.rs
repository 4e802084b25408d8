//! Webhook use cases for operators: creating an endpoint (its URL through
//! the egress rules, a fresh signing secret), changing and deleting one,
//! pages of endpoints and of an endpoint's deliveries, and replaying the
//! failed deliveries. Every refusal happens before a statement runs, so bad
//! input writes nothing. The endpoints' SQL runs in `store.rs`, the
//! deliveries' in the outbox's (`events::outbox::history`).

use std::{fmt, sync::Arc};

use sea_orm::DatabaseConnection;
use uuid::Uuid;

use super::store::{self, EndpointRow, NewEndpoint};
use crate::{
    app::AppState,
    config::Limits,
    db::read_answer,
    error::AppError,
    events::{
        DeliveryStatus, EventType,
        egress::{self, CheckedUrl},
        outbox::history::{self, DeliveryRow},
    },
    pagination::Page,
};

/// The webhook feature as the resolvers see it: one per server process,
/// built by the composition root and handed to the schema as data.
#[derive(Clone)]
pub(crate) struct WebhookService {
    /// The connection pool.
    db: DatabaseConnection,
    /// Page sizes, and whether webhooks may reach loopback.
    limits: Arc<Limits>,
}

/// An endpoint's signing secret: 32 random bytes as 64 hex digits. Its
/// `Debug` prints nothing of it, so no log line or span can carry it.
pub(crate) struct Secret(String);

impl Secret {
    /// A fresh secret from the thread's CSPRNG (ChaCha, seeded by the OS).
    fn generate() -> Self {
        Self(hex::encode(rand::random::<[u8; 32]>()))
    }

    /// The secret itself, to show its operator once.
    pub(crate) fn reveal(self) -> String {
        self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl WebhookService {
    /// The service over `state`'s pool and limits.
    pub(crate) fn new(state: &AppState) -> Self {
        Self { db: state.db.clone(), limits: state.limits.clone() }
    }

    /// Creates an endpoint for `url` taking `events`, with a new secret,
    /// returned this once. It is sent the events recorded after it.
    pub(crate) async fn create(&self, url: &str, events: &[EventType]) -> Result<(EndpointRow, Secret), AppError> {
        let url = self.check_url(url)?;
        let events = each_once(events)?;
        let secret = Secret::generate();
        let new = NewEndpoint { url: url.as_str(), events: &events, secret: &secret.0 };
        Ok((store::create(&self.db, new).await?, secret))
    }

    /// Changes the given fields of an endpoint (a new URL passes the egress
    /// rules, new events must name one type at least); `None` when there
    /// is none with `id`.
    pub(crate) async fn update(
        &self,
        id: Uuid,
        url: Option<&str>,
        events: Option<&[EventType]>,
        active: Option<bool>,
    ) -> Result<Option<EndpointRow>, AppError> {
        let url = url.map(|url| self.check_url(url)).transpose()?;
        let events = events.map(each_once).transpose()?;
        Ok(store::update(&self.db, id, url.as_ref().map(CheckedUrl::as_str), events.as_deref(), active).await?)
    }

    /// Deletes an endpoint and its deliveries; whether there was one.
    pub(crate) async fn delete(&self, id: Uuid) -> Result<bool, AppError> {
        Ok(store::delete(&self.db, id).await?)
    }

    /// The endpoint with `id`, if there is one.
    pub(crate) async fn find(&self, id: Uuid) -> Result<Option<EndpointRow>, AppError> {
        Ok(store::find(&self.db, id).await?)
    }

    /// One page of endpoints, oldest first: `first` rows (checked against
    /// the limits) after the cursor `after`, with one more when more follow.
    pub(crate) async fn page(
        &self,
        first: Option<i32>,
        after: Option<&str>,
    ) -> Result<(Page, Vec<EndpointRow>), AppError> {
        let page = Page::parse(first, after, self.limits.max_page_size)?;
        Ok((page, store::page(&self.db, page).await?))
    }

    /// One page of an endpoint's deliveries, oldest first, only those with
    /// `status` when given.
    pub(crate) async fn deliveries(
        &self,
        endpoint_id: Uuid,
        status: Option<DeliveryStatus>,
        first: Option<i32>,
        after: Option<&str>,
    ) -> Result<(Page, Vec<DeliveryRow>), AppError> {
        let page = Page::parse(first, after, self.limits.max_page_size)?;
        let rows = read_answer!(&self.db, |db| history::deliveries(db, endpoint_id, status, page))?;
        Ok((page, rows))
    }

    /// Makes an endpoint's FAILED deliveries PENDING again, due now with no
    /// attempts; how many (0 for an unknown endpoint).
    pub(crate) async fn redeliver_failed(&self, endpoint_id: Uuid) -> Result<u64, AppError> {
        Ok(history::redeliver_failed(&self.db, endpoint_id).await?)
    }

    /// `url` through the egress rules, as `input.url`'s bad input when refused.
    fn check_url(&self, url: &str) -> Result<CheckedUrl, AppError> {
        egress::check_url(url.trim(), self.limits.webhook_allow_loopback)
            .map_err(|err| AppError::bad_input("input.url", format!("input.url: {err}")))
    }
}

/// `events`, each once, in the order given; at least one.
fn each_once(events: &[EventType]) -> Result<Vec<EventType>, AppError> {
    if events.is_empty() {
        return Err(AppError::bad_input("input.events", "input.events must name at least one event type"));
    }
    let mut once: Vec<EventType> = Vec::with_capacity(events.len());
    for &kind in events {
        if !once.contains(&kind) {
            once.push(kind);
        }
    }
    Ok(once)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_named_once_each_and_never_none() {
        use EventType::*;
        let once = each_once(&[OrderChanged, StockChanged, OrderChanged]).expect("two types");
        assert_eq!(once, [OrderChanged, StockChanged]);
        assert!(matches!(each_once(&[]), Err(AppError::BadInput { .. })));
    }

    #[test]
    fn a_secret_is_64_hex_digits_fresh_each_time_and_never_debug_printed() {
        let (a, b) = (Secret::generate(), Secret::generate());
        assert_eq!(format!("{a:?}"), "Secret(<redacted>)");
        let (a, b) = (a.reveal(), b.reveal());
        assert!(a.len() == 64 && a.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b);
    }
}
