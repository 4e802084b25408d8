//! GraphQL types and resolvers of the waiting lists. Customers join,
//! leave and read their own entries; operators read a line in offer order.

use async_graphql::{Context, ID, InputObject, Object, SimpleObject, Union, connection::CursorType};
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{
    service::{JoinOutcome, JoinRequest, WaitlistService},
    store::{EntryRow, Item, WaitlistStatus},
};
use crate::{
    context::Parts,
    error::{AppError, GqlResult, IntoGql},
    global_id,
    inventory::graphql::{self as inventory, Inventory, InventoryNotFound},
    kits::graphql::{self as kits, Kit, KitNotFound, KitReservation},
    locations::graphql::units,
    pagination::{self, Connection, Page, connection},
    reservations::graphql::{self as reservations, Reservation},
    telemetry, validate,
};

/// An entry as the API shows it.
pub(crate) struct WaitlistEntry(pub EntryRow);

/// A customer in line for units of an inventory, or for kits: offered, in
/// the order they joined, the units freed while they wait.
#[Object]
impl WaitlistEntry {
    /// The entry's id.
    async fn id(&self) -> Uuid {
        self.0.id
    }

    /// The entry's global id, for `node(id:)` (Relay).
    pub(crate) async fn node_id(&self) -> ID {
        global_id::encode(global_id::Kind::WaitlistEntry, self.0.id)
    }

    /// The inventory it waits for (batched per request); null for a kit's entry.
    async fn inventory(&self, ctx: &Context<'_>) -> GqlResult<Option<Inventory>> {
        match self.0.item {
            Item::Inventory(id) => inventory::load(ctx, id).await,
            Item::Kit(_) => Ok(None),
        }
    }

    /// The kit it waits for; null for an inventory's entry.
    async fn kit(&self, ctx: &Context<'_>) -> GqlResult<Option<Kit>> {
        match self.0.item {
            Item::Kit(id) => kits::load(ctx, id).await,
            Item::Inventory(_) => Ok(None),
        }
    }

    /// The customer in line.
    async fn user_id(&self) -> &str {
        &self.0.user_id
    }

    /// Units wanted: offered together or not at all.
    async fn quantity(&self) -> i32 {
        self.0.quantity
    }

    /// Where it stands.
    async fn status(&self) -> WaitlistStatus {
        self.0.status
    }

    /// Its place in line, 1 being the next to be offered; null unless WAITING.
    async fn position(&self) -> Option<i32> {
        self.0.position
    }

    /// When it joined: the line is in this order.
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }

    /// The hold offered to the customer: an ordinary ACTIVE reservation of
    /// theirs while OFFERED, kept after (CLAIMED, EXPIRED, LEFT); null while
    /// WAITING.
    async fn offer(&self, ctx: &Context<'_>) -> GqlResult<Option<Reservation>> {
        match (self.0.offered_at, self.0.reservation_id) {
            (Some(_), Some(id)) => reservations::visible(ctx, id).await,
            _ => Ok(None),
        }
    }

    /// The kit reservation offered to a kit's entry, as `offer` is to an
    /// inventory's: every component held whole, released, expired and
    /// checked out together; null while WAITING.
    async fn kit_offer(&self, ctx: &Context<'_>) -> GqlResult<Option<KitReservation>> {
        match (self.0.offered_at, self.0.kit_reservation_id) {
            (Some(_), Some(id)) => kits::visible(ctx, id).await,
            _ => Ok(None),
        }
    }

    /// When the offer was made.
    async fn offered_at(&self) -> Option<DateTime<Utc>> {
        self.0.offered_at
    }
}

/// What to wait for.
#[derive(InputObject)]
pub(crate) struct JoinWaitlistInput {
    /// The inventory; give exactly one of `inventoryId` and `kitId`.
    pub inventory_id: Option<Uuid>,
    /// The kit: every component's units are held as they are freed, and
    /// offered together as one kit reservation.
    pub kit_id: Option<Uuid>,
    /// Units (kits), 1 to STOCKGUARD_MAX_QUANTITY, offered together.
    #[graphql(default = 1)]
    pub quantity: i32,
    /// Only units freed at these active locations; any location when left out.
    pub location_ids: Option<Vec<Uuid>>,
    /// Same key from the same customer = the same entry.
    pub idempotency_key: Option<String>,
}

/// In line.
#[derive(SimpleObject)]
pub(crate) struct WaitlistJoined {
    /// The entry: new, the caller's open one for the item, or the one the key made.
    pub entry: WaitlistEntry,
}

/// The units can be reserved now: reserve instead. Nothing written.
#[derive(SimpleObject)]
pub(crate) struct NotSoldOut {
    /// Sellable units (for a kit: kits) at the entry's locations.
    pub available: i32,
}

/// How a join ended.
#[derive(Union)]
pub(crate) enum JoinWaitlistResult {
    /// In line.
    WaitlistJoined(WaitlistJoined),
    /// Enough units are there now.
    NotSoldOut(NotSoldOut),
    /// No such inventory.
    InventoryNotFound(InventoryNotFound),
    /// No such kit.
    KitNotFound(KitNotFound),
}

/// A place in the order entries joined in (of every line): a line's
/// pages go forward from it, a customer's (newest first) backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LineCursor(i64);

impl CursorType for LineCursor {
    type Error = &'static str;

    fn decode_cursor(s: &str) -> Result<Self, Self::Error> {
        s.strip_prefix('w').and_then(|n| n.parse().ok()).filter(|n: &i64| *n > 0).map(Self).ok_or("malformed cursor")
    }

    fn encode_cursor(&self) -> String {
        format!("w{}", self.0)
    }
}

/// An entry the caller may see: their own, or any for an operator.
pub(crate) async fn visible(ctx: &Context<'_>, id: Uuid) -> GqlResult<Option<WaitlistEntry>> {
    let user = ctx.user()?;
    let entry = ctx.part::<WaitlistService>()?.find(id).await.gql()?;
    Ok(entry.filter(|entry| user.may_see(&entry.user_id)).map(WaitlistEntry))
}

/// Waiting list queries.
#[derive(Default)]
pub(crate) struct WaitlistQuery;

#[Object]
impl WaitlistQuery {
    /// The caller's entries in every status, newest first.
    #[graphql(complexity = "crate::pagination::page_cost(first, child_complexity)")]
    async fn my_waitlist_entries(
        &self,
        ctx: &Context<'_>,
        #[graphql(
            default_with = "Some(pagination::DEFAULT_PAGE_SIZE)",
            desc = "Page size, 1 to the server's maximum page size (STOCKGUARD_MAX_PAGE_SIZE)."
        )]
        first: Option<i32>,
        #[graphql(desc = "The `endCursor` of the previous page.")] after: Option<String>,
    ) -> GqlResult<Connection<LineCursor, WaitlistEntry>> {
        let user = ctx.user()?;
        let service = ctx.part::<WaitlistService>()?;
        let page = Page::<LineCursor>::parse(first, after.as_deref(), service_max(ctx)?).gql()?;
        let rows = service.mine(&user.id, page.first, page.after.map(|c| c.0)).await.gql()?;
        Ok(connection(page, rows, |row| LineCursor(row.seq), WaitlistEntry))
    }

    /// An inventory's (or a kit's) WAITING and OFFERED entries in offer
    /// order (operators).
    #[graphql(complexity = "crate::pagination::page_cost(first, child_complexity)")]
    async fn waitlist(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The inventory; give exactly one of `inventoryId` and `kitId`.")] inventory_id: Option<Uuid>,
        #[graphql(desc = "The kit; give exactly one of `inventoryId` and `kitId`.")] kit_id: Option<Uuid>,
        #[graphql(
            default_with = "Some(pagination::DEFAULT_PAGE_SIZE)",
            desc = "Page size, 1 to the server's maximum page size (STOCKGUARD_MAX_PAGE_SIZE)."
        )]
        first: Option<i32>,
        #[graphql(desc = "The `endCursor` of the previous page.")] after: Option<String>,
    ) -> GqlResult<Connection<LineCursor, WaitlistEntry>> {
        ctx.operator()?;
        let service = ctx.part::<WaitlistService>()?;
        let page = Page::<LineCursor>::parse(first, after.as_deref(), service_max(ctx)?).gql()?;
        let item = match (inventory_id, kit_id) {
            (Some(inventory), None) => Item::Inventory(inventory),
            (None, Some(kit)) => Item::Kit(kit),
            _ => return Err(one_of()).gql(),
        };
        let rows = service.line(item, page.first, page.after.map(|c| c.0)).await.gql()?;
        Ok(connection(page, rows, |row| LineCursor(row.seq), WaitlistEntry))
    }
}

/// The server's largest page.
fn service_max(ctx: &Context<'_>) -> GqlResult<i32> {
    Ok(ctx.part::<crate::app::AppState>()?.limits.max_page_size)
}

fn one_of() -> AppError {
    AppError::bad_input("input", "give exactly one of inventoryId and kitId")
}

/// Waiting list mutations; signed-in customers.
#[derive(Default)]
pub(crate) struct WaitlistMutation;

#[Object]
impl WaitlistMutation {
    /// Joins the line for units the caller cannot reserve now (`NotSoldOut`
    /// when they can). Each unit freed while the entry waits is held for the
    /// first in line; once its whole quantity is there it is offered as an
    /// ordinary ACTIVE reservation (for a kit, a kit reservation) with its
    /// own expiry (STOCKGUARD_WAITLIST_OFFER_SECS).
    async fn join_waitlist(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "What to wait for.")] input: JoinWaitlistInput,
    ) -> GqlResult<JoinWaitlistResult> {
        let user = ctx.user()?;
        let max = ctx.part::<crate::app::AppState>()?.limits.max_quantity;
        let quantity = validate::within("input.quantity", input.quantity, 1..=max).gql()?;
        let item = match (input.inventory_id, input.kit_id) {
            (Some(inventory), None) => Item::Inventory(inventory),
            (None, Some(kit)) => Item::Kit(kit),
            _ => return Err(one_of()).gql(),
        };
        let request = JoinRequest {
            item,
            quantity,
            location_ids: input.location_ids,
            idempotency_key: validate::idempotency_key("input.idempotencyKey", input.idempotency_key.as_deref())
                .gql()?,
        };
        let outcome = ctx.part::<WaitlistService>()?.join(&user.id, &request).await.gql()?;
        let result = match outcome {
            JoinOutcome::Joined(entry) => {
                JoinWaitlistResult::WaitlistJoined(WaitlistJoined { entry: WaitlistEntry(entry) })
            }
            JoinOutcome::NotSoldOut { available } => {
                JoinWaitlistResult::NotSoldOut(NotSoldOut { available: units(available)? })
            }
            JoinOutcome::InventoryNotFound | JoinOutcome::KitNotFound => match item {
                Item::Inventory(inventory_id) => {
                    JoinWaitlistResult::InventoryNotFound(InventoryNotFound { inventory_id })
                }
                Item::Kit(kit_id) => JoinWaitlistResult::KitNotFound(KitNotFound { kit_id }),
            },
        };
        Ok(telemetry::counted("joinWaitlist", result))
    }

    /// Leaves the line (the entry's customer): a WAITING entry's held units
    /// and an OFFERED entry's offer pass to the next in line in the same
    /// transaction, and the entry is LEFT. A CLAIMED, EXPIRED or LEFT entry
    /// comes back unchanged; null when the caller has no entry with this id.
    async fn leave_waitlist(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The entry's id.")] id: Uuid,
    ) -> GqlResult<Option<WaitlistEntry>> {
        let user = ctx.user()?;
        Ok(ctx.part::<WaitlistService>()?.leave(&user.id, id).await.gql()?.map(WaitlistEntry))
    }
}
