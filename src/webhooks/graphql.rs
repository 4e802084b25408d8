//! GraphQL types and resolvers for webhook endpoints and their deliveries
//! (docs/webhooks.md). Operators only, reads included: an endpoint's URL
//! and its deliveries say which systems stand behind the shop. Resolvers
//! check the caller and call the [`WebhookService`].

use async_graphql::{Context, Enum, ID, InputObject, Object, SimpleObject};
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{service::WebhookService, store::EndpointRow};
use crate::{
    context::Parts,
    error::{AppError, GqlResult, IntoGql},
    events::{self, outbox::history::DeliveryRow},
    global_id,
    pagination::{self, Connection, Cursor, connection},
};

/// What an event is about.
#[derive(Enum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    /// A change of an inventory's stock: one per change, however many
    /// locations it touched.
    StockChanged,
    /// A change of a reservation's status.
    ReservationChanged,
    /// A new version of an order: placed, address changed, confirmed,
    /// cancelled, fulfilled.
    OrderChanged,
    /// A waiting list entry joined or changed status (offered, claimed,
    /// expired, left).
    WaitlistChanged,
}

impl From<EventType> for events::EventType {
    fn from(kind: EventType) -> Self {
        match kind {
            EventType::StockChanged => Self::StockChanged,
            EventType::ReservationChanged => Self::ReservationChanged,
            EventType::OrderChanged => Self::OrderChanged,
            EventType::WaitlistChanged => Self::WaitlistChanged,
        }
    }
}

impl From<events::EventType> for EventType {
    fn from(kind: events::EventType) -> Self {
        match kind {
            events::EventType::StockChanged => Self::StockChanged,
            events::EventType::ReservationChanged => Self::ReservationChanged,
            events::EventType::OrderChanged => Self::OrderChanged,
            events::EventType::WaitlistChanged => Self::WaitlistChanged,
        }
    }
}

/// Where a delivery stands.
#[derive(Enum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeliveryStatus {
    /// Not yet answered with a 2xx; sent (again) at `nextAttemptAt`.
    Pending,
    /// Answered with a 2xx.
    Delivered,
    /// Every attempt of the retry schedule failed; `redeliverFailed` sends it again.
    Failed,
}

impl From<DeliveryStatus> for events::DeliveryStatus {
    fn from(status: DeliveryStatus) -> Self {
        match status {
            DeliveryStatus::Pending => Self::Pending,
            DeliveryStatus::Delivered => Self::Delivered,
            DeliveryStatus::Failed => Self::Failed,
        }
    }
}

impl From<events::DeliveryStatus> for DeliveryStatus {
    fn from(status: events::DeliveryStatus) -> Self {
        match status {
            events::DeliveryStatus::Pending => Self::Pending,
            events::DeliveryStatus::Delivered => Self::Delivered,
            events::DeliveryStatus::Failed => Self::Failed,
        }
    }
}

/// An endpoint row as the API shows it.
pub(crate) struct WebhookEndpoint(pub EndpointRow);

/// A URL that events are POSTed to, signed with the endpoint's secret.
#[Object]
impl WebhookEndpoint {
    /// The endpoint's id.
    async fn id(&self) -> Uuid {
        self.0.id
    }

    /// The endpoint's global id, for `node(id:)` (Relay).
    pub(crate) async fn node_id(&self) -> ID {
        global_id::encode(global_id::Kind::WebhookEndpoint, self.0.id)
    }

    /// Where bodies are POSTed, as the server normalised it.
    async fn url(&self) -> &str {
        &self.0.url
    }

    /// The types of event it is sent.
    async fn events(&self) -> Vec<EventType> {
        self.0.events.iter().copied().map(EventType::from).collect()
    }

    /// False: nothing is sent to it until it is set back to true (or
    /// `redeliverFailed` turns it on); what happens meanwhile is kept for it,
    /// back to the archive's retention.
    async fn active(&self) -> bool {
        self.0.active
    }

    /// When Stockguard turned it off because a delivery spent its whole
    /// retry schedule (FAILED); null while it is on, or when an operator
    /// turned it off. `redeliverFailed` turns it on again.
    async fn disabled_at(&self) -> Option<DateTime<Utc>> {
        self.0.disabled_at
    }

    /// When it was created; it is sent the events recorded after.
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }

    /// Its deliveries (bodies of 1 to 100 events), oldest first.
    #[graphql(complexity = "crate::pagination::page_cost(first, child_complexity)")]
    async fn deliveries(
        &self,
        ctx: &Context<'_>,
        #[graphql(
            default_with = "Some(pagination::DEFAULT_PAGE_SIZE)",
            desc = "Page size, 1 to the server's maximum page size (STOCKGUARD_MAX_PAGE_SIZE)."
        )]
        first: Option<i32>,
        #[graphql(desc = "The `endCursor` of the previous page.")] after: Option<String>,
        #[graphql(desc = "Only deliveries with this status.")] status: Option<DeliveryStatus>,
    ) -> GqlResult<Connection<Cursor, WebhookDelivery>> {
        ctx.operator()?;
        let service = ctx.part::<WebhookService>()?;
        let status = status.map(events::DeliveryStatus::from);
        let (page, rows) = service.deliveries(self.0.id, status, first, after.as_deref()).await.gql()?;
        let cursor = |row: &DeliveryRow| Cursor { created_at: row.created_at, id: row.id };
        Ok(connection(page, rows, cursor, WebhookDelivery))
    }
}

/// A delivery row as the API shows it.
pub(crate) struct WebhookDelivery(DeliveryRow);

/// One body of events sent to one endpoint, and what became of it.
#[Object]
impl WebhookDelivery {
    /// The delivery's id, sent as the `stockguard-delivery` header.
    async fn id(&self) -> Uuid {
        self.0.id
    }

    /// The ids of the events in its body, in order.
    async fn event_ids(&self) -> &[Uuid] {
        &self.0.event_ids
    }

    /// Where it stands.
    async fn status(&self) -> DeliveryStatus {
        self.0.status.into()
    }

    /// Attempts made, since it was created or last replayed by `redeliverFailed`.
    async fn attempts(&self) -> i32 {
        self.0.attempts
    }

    /// When it was last sent.
    async fn last_attempt_at(&self) -> Option<DateTime<Utc>> {
        self.0.last_attempt_at
    }

    /// The HTTP status of the last answer; null when none came (a timeout,
    /// a refused connection, an address the egress rules refuse).
    async fn last_response_status(&self) -> Option<i32> {
        self.0.last_response_status
    }

    /// Why the last attempt failed.
    async fn last_error(&self) -> Option<&str> {
        self.0.last_error.as_deref()
    }

    /// When it is sent next; null unless PENDING.
    async fn next_attempt_at(&self) -> Option<DateTime<Utc>> {
        (self.0.status == events::DeliveryStatus::Pending).then_some(self.0.next_attempt_at)
    }

    /// When a 2xx answered it.
    async fn delivered_at(&self) -> Option<DateTime<Utc>> {
        self.0.delivered_at
    }
}

/// A new webhook endpoint.
#[derive(InputObject)]
pub(crate) struct CreateWebhookInput {
    /// `https://…`, at most 2048 bytes, to a public address (docs/webhooks.md,
    /// "Egress"); `http://` only to loopback, with STOCKGUARD_WEBHOOK_ALLOW_LOOPBACK=true.
    pub url: String,
    /// The types of event to send it, at least one.
    pub events: Vec<EventType>,
}

/// An endpoint was created.
#[derive(SimpleObject)]
pub(crate) struct WebhookCreated {
    /// The endpoint.
    pub endpoint: WebhookEndpoint,
    /// The signing secret (64 hex digits), shown this once: no read returns
    /// it again. Bodies are signed with it (`stockguard-signature`).
    pub secret: String,
}

/// Changes to an endpoint; fields left out stay as they are.
#[derive(InputObject)]
pub(crate) struct UpdateWebhookInput {
    /// The endpoint to change.
    pub id: Uuid,
    /// A new URL, under the same rules as `createWebhook`'s.
    pub url: Option<String>,
    /// New event types, at least one.
    pub events: Option<Vec<EventType>>,
    /// False: send nothing until set back to true.
    pub active: Option<bool>,
}

/// The endpoint with `id`, for `node(id:)`: operators only, as the typed fields.
pub(crate) async fn visible(ctx: &Context<'_>, id: Uuid) -> GqlResult<Option<WebhookEndpoint>> {
    ctx.operator()?;
    Ok(ctx.part::<WebhookService>()?.find(id).await.gql()?.map(WebhookEndpoint))
}

/// Webhook queries; operators only.
#[derive(Default)]
pub(crate) struct WebhookQuery;

#[Object]
impl WebhookQuery {
    /// Every webhook endpoint, oldest first (operators).
    #[graphql(complexity = "crate::pagination::page_cost(first, child_complexity)")]
    async fn webhook_endpoints(
        &self,
        ctx: &Context<'_>,
        #[graphql(
            default_with = "Some(pagination::DEFAULT_PAGE_SIZE)",
            desc = "Page size, 1 to the server's maximum page size (STOCKGUARD_MAX_PAGE_SIZE)."
        )]
        first: Option<i32>,
        #[graphql(desc = "The `endCursor` of the previous page.")] after: Option<String>,
    ) -> GqlResult<Connection<Cursor, WebhookEndpoint>> {
        ctx.operator()?;
        let (page, rows) = ctx.part::<WebhookService>()?.page(first, after.as_deref()).await.gql()?;
        let cursor = |row: &EndpointRow| Cursor { created_at: row.created_at, id: row.id };
        Ok(connection(page, rows, cursor, WebhookEndpoint))
    }
}

/// Webhook mutations; operators only.
#[derive(Default)]
pub(crate) struct WebhookMutation;

#[Object]
impl WebhookMutation {
    /// Creates a webhook endpoint (operators); it is sent the events of the
    /// chosen types recorded from now on. A URL the egress rules refuse, or
    /// no event type, is `BAD_USER_INPUT`.
    async fn create_webhook(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The URL and the event types.")] input: CreateWebhookInput,
    ) -> GqlResult<WebhookCreated> {
        ctx.operator()?;
        let events: Vec<events::EventType> = input.events.into_iter().map(Into::into).collect();
        let (row, secret) = ctx.part::<WebhookService>()?.create(&input.url, &events).await.gql()?;
        Ok(WebhookCreated { endpoint: WebhookEndpoint(row), secret: secret.reveal() })
    }

    /// Changes an endpoint's URL, event types or active flag (operators);
    /// null when no endpoint has the id.
    async fn update_webhook(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The endpoint and the fields to change.")] input: UpdateWebhookInput,
    ) -> GqlResult<Option<WebhookEndpoint>> {
        ctx.operator()?;
        let events: Option<Vec<events::EventType>> =
            input.events.map(|events| events.into_iter().map(Into::into).collect());
        let service = ctx.part::<WebhookService>()?;
        let row = service.update(input.id, input.url.as_deref(), events.as_deref(), input.active).await.gql()?;
        Ok(row.map(WebhookEndpoint))
    }

    /// Deletes an endpoint and its deliveries (operators); false when no
    /// endpoint has the id.
    async fn delete_webhook(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The endpoint's id.")] id: Uuid,
    ) -> GqlResult<bool> {
        ctx.operator()?;
        ctx.part::<WebhookService>()?.delete(id).await.gql()
    }

    /// Sends an endpoint's FAILED deliveries again (operators): each becomes
    /// PENDING, due now, its attempts back at 0, and the endpoint, which the
    /// failure turned off, is turned on; they go before anything newer.
    /// Returns how many (0 for an unknown endpoint, which changes nothing).
    async fn redeliver_failed(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The endpoint's id.")] endpoint_id: Uuid,
    ) -> GqlResult<i32> {
        ctx.operator()?;
        let count = ctx.part::<WebhookService>()?.redeliver_failed(endpoint_id).await.gql()?;
        i32::try_from(count)
            .map_err(|_| AppError::internal(anyhow::anyhow!("{count} deliveries do not fit in an Int")))
            .gql()
    }
}
