//! GraphQL types and resolvers for inventories. Resolvers check the caller,
//! parse the input and call the [`InventoryService`] (or, for the fields a
//! response may ask for many times, the request's DataLoaders).

use async_graphql::{Context, Enum, ErrorExtensions, ID, InputObject, Object, SimpleObject, Subscription, Union};
use chrono::{DateTime, Utc};
use futures::{StreamExt, stream::BoxStream};
use uuid::Uuid;

use super::{
    InventoryRow,
    loader::{InventoryBySkuLoader, InventoryLoader, MovementLoader},
    movements,
    service::{InventoryService, RestockOutcome},
};
use crate::{
    adjustments::graphql::AdjustmentReason,
    context::Parts,
    error::{AppError, GqlResult, IntoGql},
    global_id,
    live::Feed,
    locations::graphql::{self as locations, Location, StockLevel},
    pagination::{self, Connection, Cursor, VersionCursor, connection},
    telemetry, validate,
};

/// Largest `stock` of a new inventory, largest single restock and largest
/// single transfer: operators move warehouse stock, not a customer's cart.
pub(crate) const MAX_STOCK_CHANGE: i32 = 1_000_000_000;

/// An inventory row as the API shows it.
pub(crate) struct Inventory(pub InventoryRow);

/// A stocked item. `version` grows by exactly 1 for every change of the row:
/// each reservation, release, expiry, restock, change of a held quantity and
/// fulfilled order line counts as one (a checkout moves no stock and counts
/// as none).
#[Object]
impl Inventory {
    /// The inventory's id.
    async fn id(&self) -> Uuid {
        self.0.id
    }

    /// The inventory's global id, for `node(id:)` (Relay).
    pub(crate) async fn node_id(&self) -> ID {
        global_id::encode(global_id::Kind::Inventory, self.0.id)
    }

    /// Stock keeping unit, unique across inventories.
    async fn sku(&self) -> &str {
        &self.0.sku
    }

    /// Display name.
    async fn name(&self) -> &str {
        &self.0.name
    }

    /// Units available to reserve.
    async fn stock(&self) -> i32 {
        self.0.stock
    }

    /// 1 when created, +1 with every committed change. Send it back as
    /// `expectedVersion` to change the row only if nobody changed it since.
    async fn version(&self) -> i32 {
        self.0.version
    }

    /// When the row last changed.
    async fn updated_at(&self) -> DateTime<Utc> {
        self.0.updated_at
    }

    /// Every change of this inventory's stock, oldest first (operators only).
    #[graphql(complexity = "crate::pagination::page_cost(first, child_complexity)")]
    async fn movements(
        &self,
        ctx: &Context<'_>,
        #[graphql(
            default_with = "Some(pagination::DEFAULT_PAGE_SIZE)",
            desc = "Page size, 1 to the server's maximum page size (STOCKGUARD_MAX_PAGE_SIZE)."
        )]
        first: Option<i32>,
        #[graphql(desc = "The `endCursor` of the previous page.")] after: Option<String>,
    ) -> GqlResult<Connection<VersionCursor, StockMovement>> {
        ctx.operator()?;
        let service = ctx.part::<InventoryService>()?;
        let (page, rows) = service.movements(self.0.id, first, after.as_deref()).await.gql()?;
        Ok(connection(page, rows, |row| VersionCursor { version: row.version_after, id: Some(row.id) }, StockMovement))
    }

    /// Units free to reserve: the same number as `stock`, read in one
    /// snapshot with `reserved`, `committed` and `levels` (batched per request).
    async fn available(&self, ctx: &Context<'_>) -> GqlResult<i32> {
        units(self.states(ctx).await?.available)
    }

    /// Units held by ACTIVE reservations (carts). A reservation past its
    /// `expiresAt` reads as EXPIRED at once, but its units count here until
    /// the sweeper returns them to `available`: they are not free before.
    async fn reserved(&self, ctx: &Context<'_>) -> GqlResult<i32> {
        units(self.states(ctx).await?.reserved)
    }

    /// Units held by the lines of PENDING and CONFIRMED orders.
    async fn committed(&self, ctx: &Context<'_>) -> GqlResult<i32> {
        units(self.states(ctx).await?.committed)
    }

    /// Units in the warehouse: `available + reserved + committed`, from one
    /// snapshot. Falls when an order is fulfilled or an adjustment takes
    /// units away; grows with restocks, returns and adjustments that add.
    async fn on_hand(&self, ctx: &Context<'_>) -> GqlResult<i32> {
        units(self.states(ctx).await?.on_hand())
    }

    /// Its levels' safety stock, summed: units no customer may take.
    async fn safety_stock(&self, ctx: &Context<'_>) -> GqlResult<i32> {
        units(self.states(ctx).await?.safety_stock)
    }

    /// Units a customer may take: each level's `sellable`
    /// (`max(0, available - safetyStock)`), summed, from the same snapshot.
    async fn sellable(&self, ctx: &Context<'_>) -> GqlResult<i32> {
        units(self.states(ctx).await?.sellable)
    }

    /// Units wanted by its waiting list's WAITING entries (batched per request).
    async fn waiting(&self, ctx: &Context<'_>) -> GqlResult<i32> {
        let loader = ctx.loader::<crate::waitlists::loader::WaitingLoader>()?;
        units(loader.load_one(self.0.id).await.gql()?.unwrap_or(0))
    }

    /// Its stock at each location that ever held it, by priority then code
    /// (batched per request); the state fields above are their sums.
    async fn levels(&self, ctx: &Context<'_>) -> GqlResult<Vec<StockLevel>> {
        locations::levels(ctx, self.0.id).await
    }

    /// Its stock at one location; null when that location never held it.
    async fn level(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The location's id.")] location_id: Uuid,
    ) -> GqlResult<Option<StockLevel>> {
        locations::level(ctx, self.0.id, location_id).await
    }
}

/// Where the units of one inventory are: the sums of its levels.
#[derive(Debug, Clone, Copy)]
struct StockStates {
    /// Free to reserve: the same number as the `stock` column.
    available: i64,
    /// Held by ACTIVE reservations, including any past their expiry whose
    /// stock the sweeper has not returned yet (those units are not
    /// available until it has).
    reserved: i64,
    /// Held by ORDERED reservations: the lines of PENDING and CONFIRMED orders.
    committed: i64,
    /// The levels' safety stock.
    safety_stock: i64,
    /// What customers may take: the levels' sellable units.
    sellable: i64,
}

impl StockStates {
    /// Units in the warehouse: available, reserved and committed.
    fn on_hand(&self) -> i64 {
        self.available + self.reserved + self.committed
    }
}

impl Inventory {
    /// This inventory's stock states: the sums of its levels, from the same
    /// DataLoader as `levels`, so one statement (one snapshot) answers both
    /// and they add up even while the stock changes. An `inventoryChanged`
    /// event's row is the announced one, but its states and levels are read
    /// when it is sent: without this they came from two statements, and
    /// under load one event's levels did not add up to its states.
    async fn states(&self, ctx: &Context<'_>) -> GqlResult<StockStates> {
        let levels = locations::level_states(ctx, self.0.id).await?;
        let none = StockStates { available: 0, reserved: 0, committed: 0, safety_stock: 0, sellable: 0 };
        Ok(levels.iter().fold(none, |sums, level| StockStates {
            available: sums.available + level.available,
            reserved: sums.reserved + level.reserved,
            committed: sums.committed + level.committed,
            safety_stock: sums.safety_stock + i64::from(level.safety_stock),
            sellable: sums.sellable + level.sellable(),
        }))
    }
}

/// A count of units as a GraphQL `Int`. Sums of holds are wider than a
/// row's stock; one past `i32::MAX` is a broken database, not a client's fault.
fn units(n: i64) -> GqlResult<i32> {
    i32::try_from(n)
        .map_err(|_| AppError::internal(anyhow::anyhow!("a stock state of {n} does not fit in an Int")).extend())
}

/// Why stock changed.
#[derive(Enum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MovementReason {
    /// The inventory was created with its initial stock.
    Created,
    /// A reservation took stock.
    Reserved,
    /// A reservation was released and its stock returned.
    Released,
    /// A reservation expired and the sweeper returned its stock.
    Expired,
    /// An operator added stock.
    Restocked,
    /// An order line took stock.
    Ordered,
    /// An order was cancelled and its line's stock returned.
    OrderCancelled,
    /// An order line's units left the warehouse: `delta` is the change of
    /// on-hand units (available stock does not move, `stockAfter` is unchanged).
    Fulfilled,
    /// A reservation's quantity was changed; `delta` is the change of available stock.
    QuantityChanged,
    /// Units left this location for another (`transferStock`); `delta` is negative.
    TransferredOut,
    /// Units arrived at this location from another (`transferStock`).
    TransferredIn,
    /// Units of a fulfilled order's line came back to available stock here
    /// (`returnOrder`, RESTOCK); `delta` is positive, `reservationId` the
    /// order line. A WRITE_OFF writes no row.
    Returned,
    /// An operator changed the units here for a reason other than a sale
    /// (`adjustStock`): on hand and available change by `delta`;
    /// `adjustmentReason` says why.
    Adjusted,
}

impl From<movements::MovementReason> for MovementReason {
    fn from(reason: movements::MovementReason) -> Self {
        use movements::MovementReason as Ledger;
        match reason {
            Ledger::Created => Self::Created,
            Ledger::Reserved => Self::Reserved,
            Ledger::Released => Self::Released,
            Ledger::Expired => Self::Expired,
            Ledger::Restocked => Self::Restocked,
            Ledger::Ordered => Self::Ordered,
            Ledger::OrderCancelled => Self::OrderCancelled,
            Ledger::Fulfilled => Self::Fulfilled,
            Ledger::QuantityChanged => Self::QuantityChanged,
            Ledger::TransferredOut => Self::TransferredOut,
            Ledger::TransferredIn => Self::TransferredIn,
            Ledger::Returned => Self::Returned,
            Ledger::Adjusted => Self::Adjusted,
        }
    }
}

/// A ledger row as the API shows it.
pub(crate) struct StockMovement(movements::Model);

/// Every change of stock, written in the same statement as the change itself.
#[Object]
impl StockMovement {
    /// The ledger row's id.
    async fn id(&self) -> Uuid {
        self.0.id
    }

    /// The ledger row's global id, for `node(id:)` (Relay).
    pub(crate) async fn node_id(&self) -> ID {
        global_id::encode(global_id::Kind::StockMovement, self.0.id)
    }

    /// Units added; negative when stock was taken.
    async fn delta(&self) -> i32 {
        self.0.delta
    }

    /// Why the stock changed.
    async fn reason(&self) -> MovementReason {
        self.0.reason.into()
    }

    /// Stock right after the change.
    async fn stock_after(&self) -> i32 {
        self.0.stock_after
    }

    /// The inventory's version right after the change.
    async fn version_after(&self) -> i32 {
        self.0.version_after
    }

    /// The reservation involved, if any.
    async fn reservation_id(&self) -> Option<Uuid> {
        self.0.reservation_id
    }

    /// The order involved, if any.
    async fn order_id(&self) -> Option<Uuid> {
        self.0.order_id
    }

    /// When the change was made.
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }

    /// The location whose stock changed (batched per request); null on rows
    /// written before stock was kept per location, which were all at the
    /// location with code `default`.
    async fn location(&self, ctx: &Context<'_>) -> GqlResult<Option<Location>> {
        match self.0.location_id {
            Some(id) => locations::load(ctx, id).await,
            None => Ok(None),
        }
    }

    /// Why an operator adjusted stock; set on `ADJUSTED` rows, null on all others.
    async fn adjustment_reason(&self) -> Option<AdjustmentReason> {
        self.0.adjustment_reason.map(Into::into)
    }

    /// The operator's note, on `ADJUSTED` and `RETURNED` rows.
    async fn note(&self) -> Option<&str> {
        self.0.note.as_deref()
    }

    /// The operator who made the change (their token's `sub`), on `ADJUSTED`
    /// and `RETURNED` rows; null for customers' and the sweeper's rows.
    async fn actor(&self) -> Option<&str> {
        self.0.actor.as_deref()
    }

    /// The kit reservation whose change wrote the row; null for every other.
    async fn kit_reservation_id(&self) -> Option<Uuid> {
        self.0.kit_reservation_id
    }
}

impl From<InventoryRow> for Inventory {
    fn from(row: InventoryRow) -> Self {
        Self(row)
    }
}

/// One ledger row through the request's DataLoader (operators only, as
/// `Inventory.movements`).
pub(crate) async fn movement(ctx: &Context<'_>, id: Uuid) -> GqlResult<Option<StockMovement>> {
    ctx.operator()?;
    let loader = ctx.loader::<MovementLoader>()?;
    Ok(loader.load_one(id).await.gql()?.map(StockMovement))
}

/// Loads one inventory through the request's DataLoader, so that all the
/// `inventory` fields of one response cost one statement.
pub(crate) async fn load(ctx: &Context<'_>, id: Uuid) -> GqlResult<Option<Inventory>> {
    let loader = ctx.loader::<InventoryLoader>()?;
    let row = loader.load_one(id).await.gql()?;
    Ok(row.map(Inventory))
}

/// The version the client expected is no longer the latest: nothing was
/// written. Shows the latest committed state beside what the client sent.
#[derive(SimpleObject)]
pub(crate) struct Conflict {
    /// The version the request expected (for a request without one whose
    /// collision retries ran out: the version the server last saw).
    pub expected_version: i32,
    /// The latest committed state.
    pub inventory: Inventory,
}

/// No inventory has this id.
#[derive(SimpleObject)]
pub(crate) struct InventoryNotFound {
    /// The id that was asked for.
    pub inventory_id: Uuid,
}

/// Stock was added.
#[derive(SimpleObject)]
pub(crate) struct Restocked {
    /// The inventory as the restock left it.
    pub inventory: Inventory,
}

/// How a restock ended.
#[derive(Union)]
pub(crate) enum RestockResult {
    /// Stock was added.
    Restocked(Restocked),
    /// `expectedVersion` was stale; nothing was written.
    Conflict(Conflict),
    /// No such inventory.
    InventoryNotFound(InventoryNotFound),
}

/// A new inventory.
#[derive(InputObject)]
pub(crate) struct CreateInventoryInput {
    /// Stock keeping unit: 1 to 64 characters, unique.
    pub sku: String,
    /// Display name: 1 to 200 characters.
    pub name: String,
    /// Units on hand at creation, 0 or more.
    pub stock: i32,
    /// Where the initial stock is; omitted: the default location. An
    /// unknown id is `BAD_USER_INPUT`.
    pub location_id: Option<Uuid>,
}

/// Stock to add to an inventory.
#[derive(InputObject)]
pub(crate) struct RestockInput {
    /// The inventory to restock.
    pub inventory_id: Uuid,
    /// Units to add, 1 or more.
    pub quantity: i32,
    /// The version the operator saw; given, the restock happens only if the row
    /// is still at that version.
    pub expected_version: Option<i32>,
    /// Where the units arrive; omitted: the default location. An unknown id
    /// is `BAD_USER_INPUT`.
    pub location_id: Option<Uuid>,
}

/// Inventory queries; readable without a token.
#[derive(Default)]
pub(crate) struct InventoryQuery;

#[Object]
impl InventoryQuery {
    /// One inventory by id.
    async fn inventory(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The inventory's id.")] id: Uuid,
    ) -> GqlResult<Option<Inventory>> {
        load(ctx, id).await
    }

    /// One inventory by SKU.
    async fn inventory_by_sku(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The stock keeping unit, exactly.")] sku: String,
    ) -> GqlResult<Option<Inventory>> {
        // No SKU holds a NUL (`createInventory` refuses one), and PostgreSQL
        // text cannot carry one: the database would fail the lookup.
        if sku.contains('\0') {
            return Ok(None);
        }
        let loader = ctx.loader::<InventoryBySkuLoader>()?;
        let row = loader.load_one(sku).await.gql()?;
        Ok(row.map(Inventory))
    }

    /// All inventories, oldest first.
    #[graphql(complexity = "crate::pagination::page_cost(first, child_complexity)")]
    async fn inventories(
        &self,
        ctx: &Context<'_>,
        #[graphql(
            default_with = "Some(pagination::DEFAULT_PAGE_SIZE)",
            desc = "Page size, 1 to the server's maximum page size (STOCKGUARD_MAX_PAGE_SIZE)."
        )]
        first: Option<i32>,
        #[graphql(desc = "The `endCursor` of the previous page.")] after: Option<String>,
    ) -> GqlResult<Connection<Cursor, Inventory>> {
        let (page, rows) = ctx.part::<InventoryService>()?.page(first, after.as_deref()).await.gql()?;
        Ok(connection(page, rows, |row| Cursor { created_at: row.created_at, id: row.id }, Inventory))
    }
}

/// Inventory mutations; operators only.
#[derive(Default)]
pub(crate) struct InventoryMutation;

#[Object]
impl InventoryMutation {
    /// Creates an inventory at version 1 (operators).
    async fn create_inventory(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The new inventory.")] input: CreateInventoryInput,
    ) -> GqlResult<Inventory> {
        ctx.operator()?;
        let sku = validate::text("input.sku", &input.sku, 64).gql()?;
        let name = validate::text("input.name", &input.name, 200).gql()?;
        let stock = validate::within("input.stock", input.stock, 0..=MAX_STOCK_CHANGE).gql()?;
        let service = ctx.part::<InventoryService>()?;
        Ok(Inventory(service.create(&sku, &name, stock, input.location_id).await.gql()?))
    }

    /// Adds stock (operators). With `expectedVersion`, only if the row is
    /// still at that version.
    async fn restock(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "Which inventory, how many units, and optionally the version seen.")] input: RestockInput,
    ) -> GqlResult<RestockResult> {
        ctx.operator()?;
        let quantity = validate::within("input.quantity", input.quantity, 1..=MAX_STOCK_CHANGE).gql()?;
        let service = ctx.part::<InventoryService>()?;
        let outcome = service.restock(input.inventory_id, quantity, input.expected_version, input.location_id).await;
        Ok(telemetry::counted(
            "restock",
            match outcome.gql()? {
                RestockOutcome::Restocked(row) => RestockResult::Restocked(Restocked { inventory: Inventory(row) }),
                RestockOutcome::Conflict { expected_version, inventory } => {
                    RestockResult::Conflict(Conflict { expected_version, inventory: Inventory(inventory) })
                }
                RestockOutcome::NotFound => {
                    RestockResult::InventoryNotFound(InventoryNotFound { inventory_id: input.inventory_id })
                }
            },
        ))
    }
}

/// Live inventory; readable without a token.
#[derive(Default)]
pub(crate) struct InventorySubscription;

#[Subscription]
impl InventorySubscription {
    /// Every committed change of one inventory from now on, in commit order
    /// (graphql-transport-ws or graphql-ws at `/graphql/ws`). A subscriber
    /// that falls far behind skips ahead to the latest state. An event's
    /// row fields (`stock`, `version`, ...) are its change's; its stock
    /// states and `levels` are read as it is sent, in one snapshot, so they
    /// add up to each other and may already include a later change.
    async fn inventory_changed(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The inventory to follow.")] id: Uuid,
    ) -> async_graphql::Result<BoxStream<'static, Inventory>> {
        // The schema that serves introspection alone has no live stock, and
        // runs no subscription.
        let live = ctx.part::<Feed<InventoryRow>>()?;
        let Some(changes) = ctx.part::<InventoryService>()?.watch(live, id).await.gql()? else {
            return Err(AppError::bad_input("id", "no inventory has this id").extend());
        };
        Ok(changes.map(Inventory).boxed())
    }
}
