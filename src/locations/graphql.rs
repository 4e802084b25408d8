//! GraphQL types and resolvers for locations, stock levels, allocations and
//! transfers. Resolvers check the caller, parse the input and call the
//! [`LocationService`] (or, for the fields a response may ask for many
//! times, the request's DataLoaders). Anyone may read; operators change.

use async_graphql::{Context, ErrorExtensions, ID, InputObject, Object, SimpleObject, Union};
use uuid::Uuid;

use super::{
    LocationRow,
    loader::{AllocationsLoader, LevelsLoader, LocationLoader},
    service::{LocationService, TransferOutcome, TransferRequest},
    store::{LevelState, LocationCursor},
};
use crate::{
    context::Parts,
    error::{AppError, GqlResult, IntoGql},
    global_id,
    inventory::graphql::{Conflict, Inventory, InventoryNotFound, MAX_STOCK_CHANGE},
    pagination::{self, Connection, connection},
    reservations::graphql::SoldOut,
    stock::rows::AllocationRow,
    telemetry, validate,
};

/// The default priority of a new location: after the default location's 0.
const DEFAULT_PRIORITY: i32 = 100;

/// A location row as the API shows it.
pub(crate) struct Location(pub LocationRow);

/// A place that holds stock: a warehouse, a store, a supplier's drop-ship stock.
#[Object]
impl Location {
    /// The location's id.
    async fn id(&self) -> Uuid {
        self.0.id
    }

    /// The location's global id, for `node(id:)` (Relay).
    pub(crate) async fn node_id(&self) -> ID {
        global_id::encode(global_id::Kind::Location, self.0.id)
    }

    /// Unique, 1 to 64 characters.
    async fn code(&self) -> &str {
        &self.0.code
    }

    /// Display name.
    async fn name(&self) -> &str {
        &self.0.name
    }

    /// Allocation by priority tries lower numbers first; ties by code.
    async fn priority(&self) -> i32 {
        self.0.priority
    }

    /// Never allocated from while false; its stock still counts in `onHand`.
    async fn active(&self) -> bool {
        self.0.active
    }
}

/// One inventory's units at one location.
pub(crate) struct StockLevel(pub LevelState);

/// One inventory's stock at one location.
#[Object]
impl StockLevel {
    /// The location (batched per request).
    async fn location(&self, ctx: &Context<'_>) -> GqlResult<Location> {
        load(ctx, self.0.location_id)
            .await?
            .ok_or_else(|| AppError::internal(anyhow::anyhow!("a level's location is missing")).extend())
    }

    /// Units free to reserve here.
    async fn available(&self) -> GqlResult<i32> {
        units(self.0.available)
    }

    /// Units here held by ACTIVE reservations (carts).
    async fn reserved(&self) -> GqlResult<i32> {
        units(self.0.reserved)
    }

    /// Units here held by the lines of PENDING and CONFIRMED orders.
    async fn committed(&self) -> GqlResult<i32> {
        units(self.0.committed)
    }

    /// Units in the building: `available + reserved + committed`.
    async fn on_hand(&self) -> GqlResult<i32> {
        units(self.0.available + self.0.reserved + self.0.committed)
    }

    /// The last available units here that no customer may take
    /// (`setSafetyStock`); an operator's `useSafetyStock` may.
    async fn safety_stock(&self) -> i32 {
        self.0.safety_stock
    }

    /// Units a customer may take here: `max(0, available - safetyStock)`.
    async fn sellable(&self) -> GqlResult<i32> {
        units(self.0.sellable())
    }
}

/// A count of units as a GraphQL `Int`; one past `i32::MAX` is a broken
/// database, not a client's fault.
pub(crate) fn units(n: i64) -> GqlResult<i32> {
    i32::try_from(n)
        .map_err(|_| AppError::internal(anyhow::anyhow!("a level of {n} units does not fit in an Int")).extend())
}

/// Units of a reservation taken from one location.
pub(crate) struct Allocation(AllocationRow);

/// Which location gave how many units of a reservation or order line.
#[Object]
impl Allocation {
    /// The location that gave them (batched per request).
    async fn location(&self, ctx: &Context<'_>) -> GqlResult<Location> {
        load(ctx, self.0.location_id)
            .await?
            .ok_or_else(|| AppError::internal(anyhow::anyhow!("an allocation's location is missing")).extend())
    }

    /// Units.
    async fn quantity(&self) -> i32 {
        self.0.quantity
    }
}

/// One location through the request's DataLoader.
pub(crate) async fn load(ctx: &Context<'_>, id: Uuid) -> GqlResult<Option<Location>> {
    let loader = ctx.loader::<LocationLoader>()?;
    Ok(loader.load_one(id).await.gql()?.map(Location))
}

/// An inventory's levels, by priority then code, through the request's DataLoader.
pub(crate) async fn levels(ctx: &Context<'_>, inventory_id: Uuid) -> GqlResult<Vec<StockLevel>> {
    Ok(level_states(ctx, inventory_id).await?.into_iter().map(StockLevel).collect())
}

/// An inventory's levels as read, by priority then code, through the
/// request's DataLoader: every field that asks for them in one response
/// shares one statement, so they come from one snapshot.
pub(crate) async fn level_states(ctx: &Context<'_>, inventory_id: Uuid) -> GqlResult<Vec<LevelState>> {
    let loader = ctx.loader::<LevelsLoader>()?;
    Ok(loader.load_one(inventory_id).await.gql()?.unwrap_or_default())
}

/// An inventory's level at one location, if that location ever held it.
pub(crate) async fn level(ctx: &Context<'_>, inventory_id: Uuid, location_id: Uuid) -> GqlResult<Option<StockLevel>> {
    Ok(levels(ctx, inventory_id).await?.into_iter().find(|level| level.0.location_id == location_id))
}

/// A reservation's (or order line's) allocations, by priority then code,
/// through the request's DataLoader.
pub(crate) async fn allocations(ctx: &Context<'_>, reservation_id: Uuid) -> GqlResult<Vec<Allocation>> {
    let loader = ctx.loader::<AllocationsLoader>()?;
    Ok(loader.load_one(reservation_id).await.gql()?.unwrap_or_default().into_iter().map(Allocation).collect())
}

/// A new location.
#[derive(InputObject)]
pub(crate) struct CreateLocationInput {
    /// Unique, 1 to 64 characters.
    pub code: String,
    /// Display name: 1 to 200 characters.
    pub name: String,
    /// Allocation by priority tries lower numbers first; ties by code.
    #[graphql(default_with = "DEFAULT_PRIORITY")]
    pub priority: i32,
}

/// Changes to a location; fields left out stay as they are.
#[derive(InputObject)]
pub(crate) struct UpdateLocationInput {
    /// The location to change.
    pub id: Uuid,
    /// A new display name: 1 to 200 characters.
    pub name: Option<String>,
    /// A new priority.
    pub priority: Option<i32>,
    /// False: never allocated from again until set back to true; existing
    /// reservations keep their units there.
    pub active: Option<bool>,
}

/// Units to move from one location of an inventory to another.
#[derive(InputObject)]
pub(crate) struct TransferStockInput {
    /// The inventory.
    pub inventory_id: Uuid,
    /// Where the units are now.
    pub from_location_id: Uuid,
    /// Where they go; not `fromLocationId`.
    pub to_location_id: Uuid,
    /// Units, 1 to 1,000,000,000 (as a restock: operators move warehouse
    /// stock, not a cart, so the customers' STOCKGUARD_MAX_QUANTITY does not apply).
    pub quantity: i32,
    /// The inventory's version the operator saw; given, the transfer happens
    /// only if the row is still at that version.
    pub expected_version: Option<i32>,
    /// Same key from the same user = same outcome, units moved at most once.
    pub idempotency_key: Option<String>,
}

/// Units moved: one change of the inventory (version + 1, stock unchanged)
/// with two ledger rows.
#[derive(SimpleObject)]
pub(crate) struct StockTransferred {
    /// The inventory as the transfer left it (for a replayed key: the latest row).
    pub inventory: Inventory,
    /// The source level after the transfer.
    pub from: StockLevel,
    /// The target level after the transfer.
    pub to: StockLevel,
}

/// No location has this id.
#[derive(SimpleObject)]
pub(crate) struct LocationNotFound {
    /// The id that was asked for.
    pub location_id: Uuid,
}

/// How a transfer ended.
#[derive(Union)]
pub(crate) enum TransferStockResult {
    /// Units moved.
    StockTransferred(StockTransferred),
    /// The source holds fewer units than asked for (`available` is the
    /// source's); nothing moved.
    SoldOut(SoldOut),
    /// `expectedVersion` was stale; nothing moved.
    Conflict(Conflict),
    /// No such inventory.
    InventoryNotFound(InventoryNotFound),
    /// No such location.
    LocationNotFound(LocationNotFound),
}

impl TransferStockResult {
    fn from_outcome(outcome: TransferOutcome, inventory_id: Uuid) -> Self {
        match outcome {
            TransferOutcome::Transferred { inventory, from, to } => Self::StockTransferred(StockTransferred {
                inventory: Inventory(inventory),
                from: StockLevel(from),
                to: StockLevel(to),
            }),
            TransferOutcome::SoldOut { requested, available, inventory } => {
                Self::SoldOut(SoldOut { requested, available, inventory: Inventory(inventory) })
            }
            TransferOutcome::Conflict { expected_version, inventory } => {
                Self::Conflict(Conflict { expected_version, inventory: Inventory(inventory) })
            }
            TransferOutcome::InventoryNotFound => Self::InventoryNotFound(InventoryNotFound { inventory_id }),
            TransferOutcome::LocationNotFound(location_id) => Self::LocationNotFound(LocationNotFound { location_id }),
        }
    }
}

/// Location queries; readable without a token.
#[derive(Default)]
pub(crate) struct LocationQuery;

#[Object]
impl LocationQuery {
    /// One location by id.
    async fn location(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The location's id.")] id: Uuid,
    ) -> GqlResult<Option<Location>> {
        load(ctx, id).await
    }

    /// All locations, by priority then code.
    #[graphql(complexity = "crate::pagination::page_cost(first, child_complexity)")]
    async fn locations(
        &self,
        ctx: &Context<'_>,
        #[graphql(
            default_with = "Some(pagination::DEFAULT_PAGE_SIZE)",
            desc = "Page size, 1 to the server's maximum page size (STOCKGUARD_MAX_PAGE_SIZE)."
        )]
        first: Option<i32>,
        #[graphql(desc = "The `endCursor` of the previous page.")] after: Option<String>,
    ) -> GqlResult<Connection<LocationCursor, Location>> {
        let (page, rows) = ctx.part::<LocationService>()?.page(first, after.as_deref()).await.gql()?;
        let cursor = |row: &LocationRow| LocationCursor { priority: row.priority, code: row.code.clone() };
        Ok(connection(page, rows, cursor, Location))
    }
}

/// Location mutations; operators only.
#[derive(Default)]
pub(crate) struct LocationMutation;

#[Object]
impl LocationMutation {
    /// Creates a location (operators). A taken code is `BAD_USER_INPUT`.
    async fn create_location(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The new location.")] input: CreateLocationInput,
    ) -> GqlResult<Location> {
        ctx.operator()?;
        let code = validate::text("input.code", &input.code, 64).gql()?;
        let name = validate::text("input.name", &input.name, 200).gql()?;
        Ok(Location(ctx.part::<LocationService>()?.create(&code, &name, input.priority).await.gql()?))
    }

    /// Changes a location's name, priority or active flag (operators); null
    /// when no location has the id.
    async fn update_location(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The location and the fields to change.")] input: UpdateLocationInput,
    ) -> GqlResult<Option<Location>> {
        ctx.operator()?;
        let name = input.name.as_deref().map(|name| validate::text("input.name", name, 200)).transpose().gql()?;
        let service = ctx.part::<LocationService>()?;
        let row = service.update(input.id, name.as_deref(), input.priority, input.active).await.gql()?;
        Ok(row.map(Location))
    }

    /// Moves units of an inventory from one location to another in one
    /// statement (operators): one change of the inventory, two ledger rows.
    /// With `expectedVersion`, only if the row is still at that version.
    async fn transfer_stock(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "Which inventory, from where to where, how many units, and how to guard it.")]
        input: TransferStockInput,
    ) -> GqlResult<TransferStockResult> {
        let user = ctx.operator()?;
        let service = ctx.part::<LocationService>()?;
        let quantity = validate::within("input.quantity", input.quantity, 1..=MAX_STOCK_CHANGE).gql()?;
        if input.from_location_id == input.to_location_id {
            return Err(AppError::bad_input("input.toLocationId", "input.toLocationId must not be the source")).gql();
        }
        let request = TransferRequest {
            inventory_id: input.inventory_id,
            from: input.from_location_id,
            to: input.to_location_id,
            quantity,
            expected_version: input.expected_version,
            idempotency_key: validate::idempotency_key("input.idempotencyKey", input.idempotency_key.as_deref())
                .gql()?,
        };
        let outcome = service.transfer(&user.id, &request).await.gql()?;
        Ok(telemetry::counted("transferStock", TransferStockResult::from_outcome(outcome, request.inventory_id)))
    }
}
