//! GraphQL types and resolvers for reservations. Resolvers check the caller,
//! parse the input and call the [`ReservationService`].

use async_graphql::{Context, Enum, ErrorExtensions, ID, InputObject, Object, SimpleObject, Union};
use chrono::{DateTime, Utc};
use uuid::Uuid;

mod inputs;

pub(crate) use inputs::{AllocationStrategy, ReserveInput, ReserveItemInput, ReserveManyInput};

use super::{
    ReservationRow,
    domain::{self, Unavailable},
    loader::ReservationLoader,
    reserve::{ReserveOutcome, ReserveRequest},
    service::{ChangeOutcome, ExtendOutcome, ReleaseOutcome, ReservationService, ReserveManyOutcome},
};
use crate::{
    context::Parts,
    error::{AppError, GqlResult, IntoGql},
    global_id,
    inventory::graphql::{Conflict, Inventory, InventoryNotFound, load as load_inventory},
    kits::graphql::{self as kits, KitReservation, ReservationPartOfKit},
    locations::graphql::{self as locations, Allocation},
    pagination::{self, Connection, Cursor, connection},
    reservations, telemetry, validate,
};

/// Where a reservation is in its life.
#[derive(Enum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReservationStatus {
    /// Holds stock for the user.
    Active,
    /// Given back by the user or an operator; its stock was returned.
    Released,
    /// Ran past `expiresAt`; its stock was returned.
    Expired,
    /// A line of an order; holds stock until the order is cancelled or fulfilled.
    Ordered,
    /// A line of a fulfilled order: its units have left the warehouse. Final.
    Fulfilled,
}

impl From<reservations::ReservationStatus> for ReservationStatus {
    fn from(status: reservations::ReservationStatus) -> Self {
        use reservations::ReservationStatus as Row;
        match status {
            Row::Active => Self::Active,
            Row::Released => Self::Released,
            Row::Expired => Self::Expired,
            Row::Ordered => Self::Ordered,
            Row::Fulfilled => Self::Fulfilled,
        }
    }
}

/// Why a line could not be served.
#[derive(Enum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnavailableReason {
    /// Not enough stock.
    SoldOut,
    /// The row is no longer at the expected version.
    Conflict,
    /// No inventory has that id.
    NotFound,
}

impl From<domain::UnavailableReason> for UnavailableReason {
    fn from(reason: domain::UnavailableReason) -> Self {
        match reason {
            domain::UnavailableReason::SoldOut => Self::SoldOut,
            domain::UnavailableReason::Conflict => Self::Conflict,
            domain::UnavailableReason::NotFound => Self::NotFound,
        }
    }
}

/// A reservation row as the API shows it.
pub(crate) struct Reservation(pub ReservationRow);

/// Units of one inventory held for one user.
#[Object]
impl Reservation {
    /// The reservation's id.
    async fn id(&self) -> Uuid {
        self.0.id
    }

    /// The reservation's global id, for `node(id:)` (Relay).
    pub(crate) async fn node_id(&self) -> ID {
        global_id::encode(global_id::Kind::Reservation, self.0.id)
    }

    /// The inventory the stock was taken from (batched per request).
    async fn inventory(&self, ctx: &Context<'_>) -> GqlResult<Inventory> {
        load_inventory(ctx, self.0.inventory_id)
            .await?
            .ok_or_else(|| AppError::internal(anyhow::anyhow!("a reservation's inventory is missing")).extend())
    }

    /// The owner.
    async fn user_id(&self) -> &str {
        &self.0.user_id
    }

    /// Units held.
    async fn quantity(&self) -> i32 {
        self.0.quantity
    }

    /// Life-cycle state. An ACTIVE reservation past its `expiresAt` reads as
    /// EXPIRED at once, even before the sweeper has returned its stock.
    async fn status(&self, ctx: &Context<'_>) -> GqlResult<ReservationStatus> {
        Ok(domain::status_at(&self.0, ctx.as_of()?).into())
    }

    /// When the stock was taken.
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }

    /// When the reservation lapses; null = never expires.
    async fn expires_at(&self) -> Option<DateTime<Utc>> {
        self.0.expires_at
    }

    /// Which locations gave its units (adding up to `quantity`), by priority then code.
    async fn allocations(&self, ctx: &Context<'_>) -> GqlResult<Vec<Allocation>> {
        locations::allocations(ctx, self.0.id).await
    }

    /// The kit reservation this is a component of; null for a reservation of its own.
    async fn kit_reservation(&self, ctx: &Context<'_>) -> GqlResult<Option<KitReservation>> {
        kits::of(ctx, &self.0).await
    }
}

/// Stock was taken.
#[derive(SimpleObject)]
pub(crate) struct Reserved {
    /// The new reservation (for a replayed idempotency key: the first one).
    pub reservation: Reservation,
    /// The inventory exactly as the reserving statement left it (for a replay: the latest row).
    pub inventory: Inventory,
}

/// Not enough stock; nothing was taken.
#[derive(SimpleObject)]
pub(crate) struct SoldOut {
    /// Units asked for.
    pub requested: i32,
    /// What the eligible locations offer the request together: their
    /// sellable units, those above each level's `safetyStock` (all their
    /// available units for an operator's `useSafetyStock`); with
    /// `allowSplit: false` the largest single one. For a transfer or an
    /// adjustment: the level's available units.
    pub available: i32,
    /// The latest committed state.
    pub inventory: Inventory,
}

/// How a reservation request ended.
#[derive(Union)]
pub(crate) enum ReserveResult {
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
            ReserveOutcome::SoldOut { requested, available, inventory } => {
                Self::SoldOut(SoldOut { requested, available, inventory: Inventory(inventory) })
            }
            ReserveOutcome::InventoryNotFound => Self::InventoryNotFound(InventoryNotFound { inventory_id }),
        }
    }
}

/// The reservation with `id` if the caller may see it (their own, or any
/// for operators), through the request's DataLoader; `UNAUTHENTICATED`
/// without a token.
pub(crate) async fn visible(ctx: &Context<'_>, id: Uuid) -> GqlResult<Option<Reservation>> {
    let user = ctx.user()?;
    let loader = ctx.loader::<ReservationLoader>()?;
    let row = loader.load_one(id).await.gql()?;
    Ok(row.filter(|row| user.may_see(&row.user_id)).map(Reservation))
}

/// Reservation queries; signed-in users.
#[derive(Default)]
pub(crate) struct ReservationQuery;

#[Object]
impl ReservationQuery {
    /// One reservation: the caller's own, or any for operators; others read as null.
    async fn reservation(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The reservation's id.")] id: Uuid,
    ) -> GqlResult<Option<Reservation>> {
        visible(ctx, id).await
    }

    /// The caller's reservations, oldest first.
    #[graphql(complexity = "crate::pagination::page_cost(first, child_complexity)")]
    async fn my_reservations(
        &self,
        ctx: &Context<'_>,
        #[graphql(
            default_with = "Some(pagination::DEFAULT_PAGE_SIZE)",
            desc = "Page size, 1 to the server's maximum page size (STOCKGUARD_MAX_PAGE_SIZE)."
        )]
        first: Option<i32>,
        #[graphql(desc = "The `endCursor` of the previous page.")] after: Option<String>,
    ) -> GqlResult<Connection<Cursor, Reservation>> {
        let user = ctx.user()?;
        let service = ctx.part::<ReservationService>()?;
        let (page, rows) = service.page(&user.id, first, after.as_deref()).await.gql()?;
        Ok(connection(page, rows, |row| Cursor { created_at: row.created_at, id: row.id }, Reservation))
    }
}

/// Reservation mutations; signed-in users.
#[derive(Default)]
pub(crate) struct ReservationMutation;

#[Object]
impl ReservationMutation {
    /// Takes stock for the caller in one statement. Sold out, conflict and not
    /// found are results, not errors.
    async fn reserve(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "What to take, and how to guard it.")] input: ReserveInput,
    ) -> GqlResult<ReserveResult> {
        let user = ctx.user()?;
        // Safety stock is the shop's own: only an operator may take it, and
        // a customer asking to is refused before anything is read.
        if input.use_safety_stock && !user.is_operator() {
            return Err(AppError::Forbidden.extend());
        }
        let service = ctx.part::<ReservationService>()?;
        let limits = service.limits();
        let request = ReserveRequest {
            inventory_id: input.inventory_id,
            quantity: validate::quantity("input.quantity", input.quantity, limits.max_quantity).gql()?,
            expected_version: input.expected_version,
            idempotency_key: validate::idempotency_key("input.idempotencyKey", input.idempotency_key.as_deref())
                .gql()?,
            ttl_secs: limits.reservation_ttl_secs,
            allocating: domain::choice(
                "input.locationIds",
                input.location_ids,
                input.strategy.into(),
                input.allow_split,
            )
            .gql()?,
            use_safety_stock: input.use_safety_stock,
        };
        let outcome = service.reserve(&user.id, &request).await.gql()?;
        Ok(telemetry::counted("reserve", ReserveResult::from_outcome(outcome, request.inventory_id)))
    }

    /// Reserves several inventories at once: all or nothing. Rows are taken in
    /// one fixed order, so opposite requests never deadlock.
    async fn reserve_many(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The lines, and an optional idempotency key.")] input: ReserveManyInput,
    ) -> GqlResult<ReserveManyResult> {
        let user = ctx.user()?;
        let service = ctx.part::<ReservationService>()?;
        let kits = match kits::kit_lines(ctx, input.kits.as_deref()).await? {
            Ok(kits) => kits,
            Err(missing) => {
                return Ok(telemetry::counted(
                    "reserveMany",
                    ReserveManyResult::ItemsUnavailable(ItemsUnavailable::new(missing)),
                ));
            }
        };
        let taking = ReserveItemInput::taking(&input.items, &kits, service.limits().max_quantity).gql()?;
        let key = validate::idempotency_key("input.idempotencyKey", input.idempotency_key.as_deref()).gql()?;
        let ttl = service.limits().reservation_ttl_secs;
        let outcome = service.reserve_many(&user.id, &taking, key, ttl).await.gql()?;
        Ok(telemetry::counted(
            "reserveMany",
            match outcome {
                ReserveManyOutcome::ReservedAll(rows) => {
                    ReserveManyResult::ReservedAll(ReservedAll::new(ctx, rows).await?)
                }
                ReserveManyOutcome::ItemsUnavailable(items) => {
                    ReserveManyResult::ItemsUnavailable(ItemsUnavailable::new(items))
                }
            },
        ))
    }

    /// Gives one of the caller's ACTIVE reservations back. Releasing twice
    /// returns the stock once.
    async fn release_reservation(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The reservation's id.")] id: Uuid,
    ) -> GqlResult<ReleaseResult> {
        let user = ctx.user()?;
        Ok(telemetry::counted(
            "releaseReservation",
            match ctx.part::<ReservationService>()?.release(id, &user.id).await.gql()? {
                ReleaseOutcome::Released { reservation, inventory } => {
                    ReleaseResult::ReservationReleased(ReservationReleased {
                        reservation: Reservation(reservation),
                        inventory: Inventory(inventory),
                    })
                }
                ReleaseOutcome::NotFound => {
                    ReleaseResult::ReservationNotFound(ReservationNotFound { reservation_id: id })
                }
                ReleaseOutcome::NotActive(reservation) => {
                    ReleaseResult::ReservationNotActive(ReservationNotActive { reservation: Reservation(reservation) })
                }
                ReleaseOutcome::PartOfKit(reservation) => {
                    ReleaseResult::ReservationPartOfKit(ReservationPartOfKit::new(ctx, reservation).await?)
                }
            },
        ))
    }

    /// Moves one of the caller's ACTIVE reservations' expiry `seconds` later,
    /// never further from now than the server's maximum reservation lifetime
    /// (STOCKGUARD_MAX_RESERVATION_TTL_SECS).
    async fn extend_reservation(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The reservation's id.")] id: Uuid,
        #[graphql(
            desc = "Seconds to add to its expiry, 1 to the server's maximum reservation lifetime (STOCKGUARD_MAX_RESERVATION_TTL_SECS)."
        )]
        seconds: i32,
    ) -> GqlResult<ExtendResult> {
        let user = ctx.user()?;
        let service = ctx.part::<ReservationService>()?;
        let max = service.limits().max_reservation_ttl_secs;
        let seconds = validate::within("seconds", seconds, 1..=max).gql()?;
        Ok(telemetry::counted(
            "extendReservation",
            match service.extend(id, &user.id, seconds, max).await.gql()? {
                ExtendOutcome::Extended(reservation) => {
                    ExtendResult::ReservationExtended(ReservationExtended { reservation: Reservation(reservation) })
                }
                ExtendOutcome::NotFound => {
                    ExtendResult::ReservationNotFound(ReservationNotFound { reservation_id: id })
                }
                ExtendOutcome::NotActive(reservation) => {
                    ExtendResult::ReservationNotActive(ReservationNotActive { reservation: Reservation(reservation) })
                }
                ExtendOutcome::PartOfKit(reservation) => {
                    ExtendResult::ReservationPartOfKit(ReservationPartOfKit::new(ctx, reservation).await?)
                }
            },
        ))
    }

    /// Changes one of the caller's ACTIVE, unexpired reservations to a new
    /// quantity in one statement: more takes the difference with the
    /// conditional decrement (`SoldOut.requested` is the difference when it
    /// does not fit), fewer gives the difference back. One change of the
    /// inventory (version + 1, one QUANTITY_CHANGED ledger row).
    async fn change_reservation_quantity(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The reservation and its new quantity.")] input: ChangeReservationQuantityInput,
    ) -> GqlResult<ChangeReservationQuantityResult> {
        let user = ctx.user()?;
        let service = ctx.part::<ReservationService>()?;
        let quantity = validate::quantity("input.quantity", input.quantity, service.limits().max_quantity).gql()?;
        let id = input.reservation_id;
        Ok(telemetry::counted(
            "changeReservationQuantity",
            match service.change_quantity(id, &user.id, quantity).await.gql()? {
                ChangeOutcome::Changed { reservation, inventory } => {
                    ChangeReservationQuantityResult::ReservationChanged(ReservationChanged {
                        reservation: Reservation(reservation),
                        inventory: Inventory(inventory),
                    })
                }
                ChangeOutcome::SoldOut { requested, available, inventory } => {
                    ChangeReservationQuantityResult::SoldOut(SoldOut {
                        requested,
                        available,
                        inventory: Inventory(inventory),
                    })
                }
                ChangeOutcome::NotFound => {
                    ChangeReservationQuantityResult::ReservationNotFound(ReservationNotFound { reservation_id: id })
                }
                ChangeOutcome::NotActive(reservation) => {
                    ChangeReservationQuantityResult::ReservationNotActive(ReservationNotActive {
                        reservation: Reservation(reservation),
                    })
                }
                ChangeOutcome::PartOfKit(reservation) => ChangeReservationQuantityResult::ReservationPartOfKit(
                    ReservationPartOfKit::new(ctx, reservation).await?,
                ),
            },
        ))
    }
}

/// A new quantity for a held reservation.
#[derive(InputObject)]
pub(crate) struct ChangeReservationQuantityInput {
    /// The caller's ACTIVE reservation.
    pub reservation_id: Uuid,
    /// The new quantity, 1 to the server's maximum quantity (STOCKGUARD_MAX_QUANTITY).
    pub quantity: i32,
}

/// The reservation holds its new quantity.
#[derive(SimpleObject)]
pub(crate) struct ReservationChanged {
    /// The reservation with its new quantity.
    pub reservation: Reservation,
    /// The inventory exactly as the change left it (when the reservation
    /// already held that quantity: the latest row, unchanged).
    pub inventory: Inventory,
}

/// How a change of quantity ended.
#[derive(Union)]
pub(crate) enum ChangeReservationQuantityResult {
    /// Changed.
    ReservationChanged(ReservationChanged),
    /// The difference does not fit in the stock; nothing changed.
    SoldOut(SoldOut),
    /// Not ACTIVE any more, or expired; nothing changed.
    ReservationNotActive(ReservationNotActive),
    /// Not found (or not the caller's).
    ReservationNotFound(ReservationNotFound),
    /// A component of a kit reservation, whose quantities follow the kit's; nothing changed.
    ReservationPartOfKit(ReservationPartOfKit),
}

/// Every line was reserved.
#[derive(SimpleObject)]
pub(crate) struct ReservedAll {
    /// One reservation per inventory named by `items`, ordered by inventory
    /// id (a kit line's reservations are its kit reservation's).
    pub reservations: Vec<Reservation>,
    /// One kit reservation per kit line.
    pub kit_reservations: Vec<KitReservation>,
}

impl ReservedAll {
    /// The answer of a request whose reservations are `rows`.
    pub(crate) async fn new(ctx: &Context<'_>, rows: Vec<ReservationRow>) -> GqlResult<Self> {
        let kit_reservations = kits::kit_reservations_of(ctx, &rows).await?;
        let reservations = rows.into_iter().filter(|row| row.kit_reservation_id.is_none()).map(Reservation).collect();
        Ok(Self { reservations, kit_reservations })
    }
}

/// A line that could not be served.
#[derive(SimpleObject)]
pub(crate) struct UnavailableItem {
    /// The inventory the line named.
    pub inventory_id: Uuid,
    /// Why it could not be served.
    pub reason: UnavailableReason,
    /// The latest committed state (null when not found).
    pub inventory: Option<Inventory>,
    /// For a `SOLD_OUT` line: the sellable units its eligible locations
    /// offered together, those above each level's `safetyStock` (with
    /// `allowSplit: false`: the largest single one); null otherwise.
    pub available: Option<i32>,
    /// Set when a kit line named the short inventory (the first such kit):
    /// the item is then that kit's short component.
    pub kit_id: Option<Uuid>,
}

/// Nothing was reserved; every line that could not be served, and why.
#[derive(SimpleObject)]
pub(crate) struct ItemsUnavailable {
    /// Only the failing lines.
    pub items: Vec<UnavailableItem>,
}

impl ItemsUnavailable {
    /// The GraphQL view of the lines a store call refused.
    pub(crate) fn new(unavailable: Vec<Unavailable>) -> Self {
        let items = unavailable
            .into_iter()
            .map(|u| UnavailableItem {
                inventory_id: u.inventory_id,
                reason: u.reason.into(),
                inventory: u.inventory.map(Inventory),
                available: u.available,
                kit_id: u.kit_id,
            })
            .collect();
        Self { items }
    }
}

/// How a multi-item reservation ended.
#[derive(Union)]
pub(crate) enum ReserveManyResult {
    /// Every line was reserved.
    ReservedAll(ReservedAll),
    /// Nothing was reserved.
    ItemsUnavailable(ItemsUnavailable),
}

/// The stock went back.
#[derive(SimpleObject)]
pub(crate) struct ReservationReleased {
    /// The reservation, now RELEASED.
    pub reservation: Reservation,
    /// The inventory after the stock came back.
    pub inventory: Inventory,
}

/// No reservation with this id is visible to the caller.
#[derive(SimpleObject)]
pub(crate) struct ReservationNotFound {
    /// The id that was asked for.
    pub reservation_id: Uuid,
}

/// The reservation is no longer ACTIVE (released, expired, or an order line).
#[derive(SimpleObject)]
pub(crate) struct ReservationNotActive {
    /// The reservation as it is.
    pub reservation: Reservation,
}

/// The reservation's expiry moved.
#[derive(SimpleObject)]
pub(crate) struct ReservationExtended {
    /// The reservation with its new `expiresAt`.
    pub reservation: Reservation,
}

/// How an extension ended.
#[derive(Union)]
pub(crate) enum ExtendResult {
    /// The expiry moved.
    ReservationExtended(ReservationExtended),
    /// Not found (or not the caller's).
    ReservationNotFound(ReservationNotFound),
    /// Not ACTIVE any more, or already expired; nothing changed.
    ReservationNotActive(ReservationNotActive),
    /// A component of a kit reservation: extend the kit reservation; nothing changed.
    ReservationPartOfKit(ReservationPartOfKit),
}

/// How a release ended.
#[derive(Union)]
pub(crate) enum ReleaseResult {
    /// The stock went back.
    ReservationReleased(ReservationReleased),
    /// Not found (or not the caller's).
    ReservationNotFound(ReservationNotFound),
    /// Not ACTIVE any more; nothing changed.
    ReservationNotActive(ReservationNotActive),
    /// A component of a kit reservation: release the kit reservation; nothing changed.
    ReservationPartOfKit(ReservationPartOfKit),
}
