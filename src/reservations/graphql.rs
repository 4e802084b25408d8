//! GraphQL types and resolvers for reservations.

use async_graphql::{Context, ErrorExtensions, InputObject, Object, SimpleObject, Union, connection::Connection};
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{
    ReservationRow, ReservationStatus,
    store::{self, ReserveOutcome, ReserveRequest},
};
use crate::{
    app::state,
    auth,
    error::{AppError, GqlResult, IntoGql},
    inventory::graphql::{Conflict, Inventory, InventoryNotFound, load as load_inventory},
    pagination::{Cursor, Page, connection},
    validate,
};

/// A reservation row as the API shows it.
pub struct Reservation(pub ReservationRow);

/// Units of one inventory held for one user.
#[Object]
impl Reservation {
    /// The reservation's id.
    async fn id(&self) -> Uuid {
        self.0.id
    }

    /// The inventory the stock was taken from (batched per request).
    async fn inventory(&self, ctx: &Context<'_>) -> GqlResult<Inventory> {
        load_inventory(ctx, self.0.inventory_id).await?.ok_or_else(|| AppError::Internal.extend())
    }

    /// The owner.
    async fn user_id(&self) -> &str {
        &self.0.user_id
    }

    /// Units held.
    async fn quantity(&self) -> i32 {
        self.0.quantity
    }

    /// Life-cycle state.
    async fn status(&self) -> ReservationStatus {
        self.0.status
    }

    /// When the stock was taken.
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }

    /// When the reservation lapses; null = never expires.
    async fn expires_at(&self) -> Option<DateTime<Utc>> {
        self.0.expires_at
    }
}

/// A request to take stock of one inventory.
#[derive(InputObject)]
pub struct ReserveInput {
    /// The inventory to take from.
    pub inventory_id: Uuid,
    /// Units, 1 to the configured maximum (1000).
    #[graphql(default = 1)]
    pub quantity: i32,
    /// The version the client saw. Given: optimistic check (version AND stock).
    /// Omitted: conditional decrement only (hot items).
    pub expected_version: Option<i32>,
    /// Same key from the same user = same outcome, stock taken at most once (double clicks).
    pub idempotency_key: Option<String>,
}

/// Stock was taken.
#[derive(SimpleObject)]
pub struct Reserved {
    /// The new reservation (for a replayed idempotency key: the first one).
    pub reservation: Reservation,
    /// The inventory exactly as the reserving statement left it (for a replay: the latest row).
    pub inventory: Inventory,
}

/// Not enough stock; nothing was taken.
#[derive(SimpleObject)]
pub struct SoldOut {
    /// Units asked for.
    pub requested: i32,
    /// The latest committed state.
    pub inventory: Inventory,
}

/// How a reservation request ended.
#[derive(Union)]
pub enum ReserveResult {
    /// Stock was taken.
    Reserved(Reserved),
    /// `expectedVersion` was stale; nothing was taken.
    Conflict(Conflict),
    /// Not enough stock; nothing was taken.
    SoldOut(SoldOut),
    /// No such inventory.
    InventoryNotFound(InventoryNotFound),
}

impl ReserveResult {
    fn from_outcome(outcome: ReserveOutcome, inventory_id: Uuid) -> Self {
        match outcome {
            ReserveOutcome::Reserved { reservation, inventory } => {
                Self::Reserved(Reserved { reservation: Reservation(reservation), inventory: Inventory(inventory) })
            }
            ReserveOutcome::Conflict { expected_version, inventory } => {
                Self::Conflict(Conflict { expected_version, inventory: Inventory(inventory) })
            }
            ReserveOutcome::SoldOut { requested, inventory } => {
                Self::SoldOut(SoldOut { requested, inventory: Inventory(inventory) })
            }
            ReserveOutcome::InventoryNotFound => Self::InventoryNotFound(InventoryNotFound { inventory_id }),
        }
    }
}

/// Reservation queries; signed-in users.
#[derive(Default)]
pub struct ReservationQuery;

#[Object]
impl ReservationQuery {
    /// One reservation: the caller's own, or any for operators; others read as null.
    async fn reservation(&self, ctx: &Context<'_>, id: Uuid) -> GqlResult<Option<Reservation>> {
        let user = auth::user(ctx).gql()?;
        let row = store::find(&state(ctx).db, id).await.gql()?;
        Ok(row.filter(|row| user.may_see(&row.user_id)).map(Reservation))
    }

    /// The caller's reservations, oldest first.
    async fn my_reservations(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 20, desc = "Page size, 1 to the configured maximum (100).")] first: Option<i32>,
        #[graphql(desc = "The `endCursor` of the previous page.")] after: Option<String>,
    ) -> GqlResult<Connection<Cursor, Reservation>> {
        let user = auth::user(ctx).gql()?;
        let app = state(ctx);
        let page = Page::parse(first, after.as_deref(), app.limits.max_page_size).gql()?;
        let rows = store::page_for_user(&app.db, &user.id, page).await.gql()?;
        Ok(connection(page, rows, |row| Cursor { created_at: row.created_at, id: row.id }, Reservation))
    }
}

/// Reservation mutations; signed-in users.
#[derive(Default)]
pub struct ReservationMutation;

#[Object]
impl ReservationMutation {
    /// Takes stock for the caller in one statement. Sold out, conflict and not
    /// found are results, not errors.
    async fn reserve(&self, ctx: &Context<'_>, input: ReserveInput) -> GqlResult<ReserveResult> {
        let user = auth::user(ctx).gql()?;
        let app = state(ctx);
        let request = ReserveRequest {
            inventory_id: input.inventory_id,
            quantity: validate::quantity("input.quantity", input.quantity, app.limits.max_quantity).gql()?,
            expected_version: input.expected_version,
            idempotency_key: validate::idempotency_key("input.idempotencyKey", input.idempotency_key.as_deref())
                .gql()?,
        };
        let outcome = store::reserve(&app.db, &app.collisions, &user.id, &request).await.gql()?;
        Ok(ReserveResult::from_outcome(outcome, request.inventory_id))
    }
}
