//! GraphQL types and resolvers for kits. Resolvers check the caller, parse
//! the input and call the [`KitService`] (or, for fields a response may ask
//! for many times, the request's DataLoaders).

use async_graphql::{Context, ErrorExtensions, ID, InputObject, Object, SimpleObject, Union};
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{
    domain::{ComponentInput, Part},
    loader::{AvailableLoader, ComponentsLoader, KitBySkuLoader, KitLoader, KitReservationLoader, PartsLoader},
    rows::{ComponentRow, KitReservationRow, KitRow},
    service::{KitExtendOutcome, KitReleaseOutcome, KitRequest, KitReserveOutcome, KitService},
};
use crate::{
    context::Parts,
    error::{AppError, GqlResult, IntoGql},
    global_id,
    inventory::{graphql::Inventory, loader::InventoryLoader},
    pagination::{self, Connection, Cursor, connection},
    reservations::{
        ReservationRow,
        domain::{self as reservation_domain, KitLine, Unavailable},
        graphql::{
            AllocationStrategy, ExtendResult, Reservation, ReservationExtended, ReservationNotActive,
            ReservationNotFound, ReservationStatus, UnavailableItem,
        },
    },
    telemetry, validate,
};

/// A kit row as the API shows it.
pub(crate) struct Kit(pub KitRow);

/// Several inventories sold as one.
#[Object]
impl Kit {
    /// The kit's id.
    async fn id(&self) -> Uuid {
        self.0.id
    }

    /// The kit's global id, for `node(id:)` (Relay).
    pub(crate) async fn node_id(&self) -> ID {
        global_id::encode(global_id::Kind::Kit, self.0.id)
    }

    /// Unique among kits.
    async fn sku(&self) -> &str {
        &self.0.sku
    }

    /// Display name.
    async fn name(&self) -> &str {
        &self.0.name
    }

    /// An inactive kit cannot be reserved; its reservations stay.
    async fn active(&self) -> bool {
        self.0.active
    }

    /// Its components, flattened: each inventory once, ordered by inventory sku.
    async fn components(&self, ctx: &Context<'_>) -> GqlResult<Vec<KitComponent>> {
        let rows = ctx.loader::<ComponentsLoader>()?.load_one(self.0.id).await.gql()?.unwrap_or_default();
        // One batch for every component's inventory (and every other kit's
        // on the page), not one statement per component.
        let ids = rows.iter().map(|row| row.inventory_id);
        let mut inventories = ctx.loader::<InventoryLoader>()?.load_many(ids).await.gql()?;
        let mut components = Vec::with_capacity(rows.len());
        for row in rows {
            let inventory = inventories
                .remove(&row.inventory_id)
                .ok_or_else(|| AppError::internal(anyhow::anyhow!("a kit's component is missing")).extend())?;
            components.push(KitComponent { row, inventory: Inventory(inventory) });
        }
        components.sort_by(|a, b| a.inventory.0.sku.cmp(&b.inventory.0.sku));
        Ok(components)
    }

    /// Kits a customer could reserve now, one after another (default
    /// strategy, split allowed): min over its components of ⌊sellable ÷
    /// quantity⌋, read in one snapshot, one statement per page of kits; 0
    /// while the kit is inactive.
    async fn available(&self, ctx: &Context<'_>) -> GqlResult<i32> {
        Ok(ctx.loader::<AvailableLoader>()?.load_one(self.0.id).await.gql()?.unwrap_or(0))
    }

    /// Kits wanted by its waiting list's WAITING entries (batched per request).
    async fn waiting(&self, ctx: &Context<'_>) -> GqlResult<i32> {
        let loader = ctx.loader::<crate::waitlists::loader::KitWaitingLoader>()?;
        let wanted = loader.load_one(self.0.id).await.gql()?.unwrap_or(0);
        i32::try_from(wanted)
            .map_err(|_| crate::error::AppError::internal(anyhow::anyhow!("{wanted} kits wanted")).extend())
    }

    /// When it was made.
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }
}

/// Units of an inventory in one kit.
pub(crate) struct KitComponent {
    row: ComponentRow,
    inventory: Inventory,
}

/// Units of an inventory in one kit.
#[Object]
impl KitComponent {
    /// The inventory.
    async fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// Units of it in one kit.
    async fn quantity(&self) -> i32 {
        self.row.quantity
    }
}

/// A kit reservation row as the API shows it.
pub(crate) struct KitReservation(pub KitReservationRow);

impl KitReservation {
    /// Its component reservations, by inventory id.
    async fn parts(&self, ctx: &Context<'_>) -> GqlResult<Vec<ReservationRow>> {
        Ok(ctx.loader::<PartsLoader>()?.load_one(self.0.id).await.gql()?.unwrap_or_default())
    }

    /// Its first component: every component has its status and expiry.
    async fn first(&self, ctx: &Context<'_>) -> GqlResult<ReservationRow> {
        self.parts(ctx)
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| AppError::internal(anyhow::anyhow!("a kit reservation has no component")).extend())
    }
}

/// A customer's hold on kits: one reservation per component inventory,
/// living and dying together.
#[Object]
impl KitReservation {
    /// The kit reservation's id.
    async fn id(&self) -> Uuid {
        self.0.id
    }

    /// Its global id, for `node(id:)` (Relay).
    pub(crate) async fn node_id(&self) -> ID {
        global_id::encode(global_id::Kind::KitReservation, self.0.id)
    }

    /// The kit.
    async fn kit(&self, ctx: &Context<'_>) -> GqlResult<Kit> {
        load(ctx, self.0.kit_id)
            .await?
            .ok_or_else(|| AppError::internal(anyhow::anyhow!("a kit reservation's kit is missing")).extend())
    }

    /// The owner.
    async fn user_id(&self) -> &str {
        &self.0.user_id
    }

    /// Kits held.
    async fn quantity(&self) -> i32 {
        self.0.quantity
    }

    /// The status of every one of its reservations (they always share it).
    async fn status(&self, ctx: &Context<'_>) -> GqlResult<ReservationStatus> {
        Ok(reservation_domain::status_at(&self.first(ctx).await?, ctx.as_of()?).into())
    }

    /// When the kits were taken.
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }

    /// When its reservations lapse (together); null = never.
    async fn expires_at(&self, ctx: &Context<'_>) -> GqlResult<Option<DateTime<Utc>>> {
        Ok(self.first(ctx).await?.expires_at)
    }

    /// One per component: quantity = kits × component quantity, with its allocations.
    async fn reservations(&self, ctx: &Context<'_>) -> GqlResult<Vec<Reservation>> {
        Ok(self.parts(ctx).await?.into_iter().map(Reservation).collect())
    }
}

/// The kit `id` through the request's DataLoader.
pub(crate) async fn load(ctx: &Context<'_>, id: Uuid) -> GqlResult<Option<Kit>> {
    Ok(ctx.loader::<KitLoader>()?.load_one(id).await.gql()?.map(Kit))
}

/// The kit reservation `id` if the caller may see it (their own, or any for
/// operators); `UNAUTHENTICATED` without a token.
pub(crate) async fn visible(ctx: &Context<'_>, id: Uuid) -> GqlResult<Option<KitReservation>> {
    let user = ctx.user()?;
    let row = ctx.loader::<KitReservationLoader>()?.load_one(id).await.gql()?;
    Ok(row.filter(|row| user.may_see(&row.user_id)).map(KitReservation))
}

/// The kit reservation a reservation is a component of, if any.
pub(crate) async fn of(ctx: &Context<'_>, reservation: &ReservationRow) -> GqlResult<Option<KitReservation>> {
    let Some(id) = reservation.kit_reservation_id else { return Ok(None) };
    let row = ctx.loader::<KitReservationLoader>()?.load_one(id).await.gql()?;
    Ok(row.map(KitReservation))
}

/// The reservation is a component of a kit reservation, which is released,
/// extended and changed whole; nothing was written.
#[derive(SimpleObject)]
pub(crate) struct ReservationPartOfKit {
    /// The reservation as it is.
    pub reservation: Reservation,
    /// The kit reservation it is a component of: act on it instead.
    pub kit_reservation: KitReservation,
}

impl ReservationPartOfKit {
    /// The answer for `reservation`, a component of a kit reservation.
    pub(crate) async fn new(ctx: &Context<'_>, reservation: ReservationRow) -> GqlResult<Self> {
        let kit_reservation = of(ctx, &reservation)
            .await?
            .ok_or_else(|| AppError::internal(anyhow::anyhow!("a kit's component has no kit reservation")).extend())?;
        Ok(Self { reservation: Reservation(reservation), kit_reservation })
    }
}

/// A component of a new kit: an inventory or a whole kit (flattened into its components).
#[derive(InputObject)]
pub(crate) struct KitComponentInput {
    /// An inventory; exactly one of `inventoryId` and `kitId`.
    pub inventory_id: Option<Uuid>,
    /// A kit, replaced by its components; exactly one of `inventoryId` and `kitId`.
    pub kit_id: Option<Uuid>,
    /// Units (or kits) per kit, 1 to 1000.
    pub quantity: i32,
}

/// A new kit.
#[derive(InputObject)]
pub(crate) struct CreateKitInput {
    /// Unique among kits, 1 to 64 characters.
    pub sku: String,
    /// Display name, 1 to 200 characters.
    pub name: String,
    /// 1 to 50 inventories once flattened, 1 to 1000 units of each per kit.
    pub components: Vec<KitComponentInput>,
}

/// A new name or state for a kit: its components never change (a new
/// recipe is a new kit).
#[derive(InputObject)]
pub(crate) struct UpdateKitInput {
    /// The kit.
    pub id: Uuid,
    /// A new display name.
    pub name: Option<String>,
    /// False: it cannot be reserved any more (its reservations stay).
    pub active: Option<bool>,
}

/// A request to reserve kits.
#[derive(InputObject)]
pub(crate) struct ReserveKitInput {
    /// The kit.
    pub kit_id: Uuid,
    /// Kits, 1 to the server's maximum quantity; each component line
    /// (kits × its quantity) within it too.
    #[graphql(default = 1)]
    pub quantity: i32,
    /// Take every component only from these locations, in this order of preference.
    pub location_ids: Option<Vec<Uuid>>,
    /// How each component's locations are chosen.
    #[graphql(default_with = "AllocationStrategy::Priority")]
    pub strategy: AllocationStrategy,
    /// False: each component's units from one location.
    #[graphql(default = true)]
    pub allow_split: bool,
    /// Same key from the same user = same outcome, kits taken at most once.
    pub idempotency_key: Option<String>,
}

/// A kit line of `reserveMany` or `placeOrder`.
#[derive(InputObject)]
pub(crate) struct KitLineInput {
    /// The kit.
    pub kit_id: Uuid,
    /// Kits.
    #[graphql(default = 1)]
    pub quantity: i32,
    /// Take every component only from these locations, in this order of
    /// preference; other lines of the same inventories must choose alike.
    pub location_ids: Option<Vec<Uuid>>,
    /// How each component's locations are chosen.
    #[graphql(default_with = "AllocationStrategy::Priority")]
    pub strategy: AllocationStrategy,
    /// False: each component's units from one location.
    #[graphql(default = true)]
    pub allow_split: bool,
}

/// The kit lines of a multi-item request with their kits' components
/// (an inactive kit's too, refused after its key is looked up): `Err` with
/// a `NOT_FOUND` item (its `inventoryId` and `kitId` the kit's) for each
/// line whose kit does not exist.
pub(crate) async fn kit_lines(
    ctx: &Context<'_>,
    inputs: Option<&[KitLineInput]>,
) -> GqlResult<Result<Vec<KitLine>, Vec<Unavailable>>> {
    let inputs = inputs.unwrap_or_default();
    // One batch for the kits and one for their components, however many lines.
    let ids = inputs.iter().map(|input| input.kit_id);
    let kits = ctx.loader::<KitLoader>()?.load_many(ids.clone()).await.gql()?;
    let components = ctx.loader::<ComponentsLoader>()?.load_many(ids).await.gql()?;
    let mut lines = Vec::with_capacity(inputs.len());
    let mut missing = Vec::new();
    for (i, input) in inputs.iter().enumerate() {
        let field = format!("input.kits[{i}].locationIds");
        let allocating =
            reservation_domain::choice(&field, input.location_ids.clone(), input.strategy.into(), input.allow_split)
                .gql()?;
        let Some(kit) = kits.get(&input.kit_id) else {
            missing.push(Unavailable::missing_kit(input.kit_id));
            continue;
        };
        let parts = components.get(&kit.id).map(|rows| rows.iter().map(|c| (c.inventory_id, c.quantity)).collect());
        lines.push(KitLine {
            kit_id: kit.id,
            quantity: input.quantity,
            allocating,
            components: parts.unwrap_or_default(),
            active: kit.active,
        });
    }
    Ok(if missing.is_empty() { Ok(lines) } else { Err(missing) })
}

/// The kit reservations of a multi-item request's reservations, by id.
pub(crate) async fn kit_reservations_of(ctx: &Context<'_>, rows: &[ReservationRow]) -> GqlResult<Vec<KitReservation>> {
    let mut ids: Vec<Uuid> = rows.iter().filter_map(|row| row.kit_reservation_id).collect();
    ids.sort_unstable();
    ids.dedup();
    let found = ctx.loader::<KitReservationLoader>()?.load_many(ids.iter().copied()).await.gql()?;
    Ok(ids.iter().filter_map(|id| found.get(id).cloned()).map(KitReservation).collect())
}

/// Every component was taken.
#[derive(SimpleObject)]
pub(crate) struct KitReserved {
    /// The new kit reservation (for a replayed key: the first one).
    pub kit_reservation: KitReservation,
}

/// Some component is short; nothing was taken.
#[derive(SimpleObject)]
pub(crate) struct KitSoldOut {
    /// The kit.
    pub kit: Kit,
    /// Kits asked for.
    pub requested: i32,
    /// Kits the components' eligible locations could give now.
    pub available: i32,
    /// The short components, with what their locations offer.
    pub components: Vec<UnavailableItem>,
}

/// No such kit, or it is inactive.
#[derive(SimpleObject)]
pub(crate) struct KitNotFound {
    /// The id that was asked for.
    pub kit_id: Uuid,
}

/// How a kit reservation request ended.
#[derive(Union)]
pub(crate) enum ReserveKitResult {
    /// Every component was taken.
    KitReserved(KitReserved),
    /// Some component is short; nothing was taken.
    KitSoldOut(KitSoldOut),
    /// No such kit, or it is inactive.
    KitNotFound(KitNotFound),
}

/// Every component's units went back.
#[derive(SimpleObject)]
pub(crate) struct KitReservationReleased {
    /// The kit reservation, now RELEASED.
    pub kit_reservation: KitReservation,
}

/// How a release of a kit reservation ended.
#[derive(Union)]
pub(crate) enum ReleaseKitResult {
    /// Released.
    KitReservationReleased(KitReservationReleased),
    /// Not found (or not the caller's).
    ReservationNotFound(ReservationNotFound),
    /// Not ACTIVE any more: its first component as it is.
    ReservationNotActive(ReservationNotActive),
}

/// Kit queries; anyone may read kits, a kit reservation is its owner's and operators'.
#[derive(Default)]
pub(crate) struct KitQuery;

#[Object]
impl KitQuery {
    /// One kit by id.
    async fn kit(&self, ctx: &Context<'_>, #[graphql(desc = "The kit's id.")] id: Uuid) -> GqlResult<Option<Kit>> {
        load(ctx, id).await
    }

    /// One kit by sku.
    async fn kit_by_sku(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The kit's sku.")] sku: String,
    ) -> GqlResult<Option<Kit>> {
        Ok(ctx.loader::<KitBySkuLoader>()?.load_one(sku).await.gql()?.map(Kit))
    }

    /// Kits, oldest first.
    #[graphql(complexity = "crate::pagination::page_cost(first, child_complexity)")]
    async fn kits(
        &self,
        ctx: &Context<'_>,
        #[graphql(
            default_with = "Some(pagination::DEFAULT_PAGE_SIZE)",
            desc = "Page size, 1 to the server's maximum page size (STOCKGUARD_MAX_PAGE_SIZE)."
        )]
        first: Option<i32>,
        #[graphql(desc = "The `endCursor` of the previous page.")] after: Option<String>,
    ) -> GqlResult<Connection<Cursor, Kit>> {
        let service = ctx.part::<KitService>()?;
        let (page, rows) = service.page(first, after.as_deref()).await.gql()?;
        Ok(connection(page, rows, |row| Cursor { created_at: row.created_at, id: row.id }, Kit))
    }

    /// One kit reservation: the caller's own, or any for operators; others read as null.
    async fn kit_reservation(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The kit reservation's id.")] id: Uuid,
    ) -> GqlResult<Option<KitReservation>> {
        visible(ctx, id).await
    }
}

/// Kit mutations: making kits for operators, reserving them for everyone signed in.
#[derive(Default)]
pub(crate) struct KitMutation;

#[Object]
impl KitMutation {
    /// Makes a kit (operators). Components given as kits are flattened; a
    /// component shared by two sub-kits appears once with the summed quantity.
    async fn create_kit(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The new kit.")] input: CreateKitInput,
    ) -> GqlResult<Kit> {
        ctx.operator()?;
        let sku = validate::text("input.sku", &input.sku, 64).gql()?;
        let name = validate::text("input.name", &input.name, 200).gql()?;
        let components = input
            .components
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let part = match (c.inventory_id, c.kit_id) {
                    (Some(id), None) => Part::Inventory(id),
                    (None, Some(id)) => Part::Kit(id),
                    _ => {
                        let field = format!("input.components[{i}]");
                        return Err(AppError::bad_input(
                            &field,
                            format!("{field} needs exactly one of inventoryId and kitId"),
                        ));
                    }
                };
                Ok(ComponentInput { part, quantity: c.quantity })
            })
            .collect::<Result<Vec<_>, AppError>>()
            .gql()?;
        let service = ctx.part::<KitService>()?;
        Ok(Kit(service.create(&sku, &name, &components).await.gql()?))
    }

    /// Renames or (de)activates a kit (operators); null when unknown.
    async fn update_kit(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The kit and what changes.")] input: UpdateKitInput,
    ) -> GqlResult<Option<Kit>> {
        ctx.operator()?;
        let name = input.name.as_deref().map(|name| validate::text("input.name", name, 200)).transpose().gql()?;
        let service = ctx.part::<KitService>()?;
        Ok(service.update(input.id, name, input.active).await.gql()?.map(Kit))
    }

    /// Reserves kits for the caller: every component, or nothing, in one
    /// statement. Sold out and not found are results, not errors.
    async fn reserve_kit(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "What to take.")] input: ReserveKitInput,
    ) -> GqlResult<ReserveKitResult> {
        let user = ctx.user()?;
        let service = ctx.part::<KitService>()?;
        let request = KitRequest {
            kit_id: input.kit_id,
            quantity: validate::quantity("input.quantity", input.quantity, service.limits().max_quantity).gql()?,
            allocating: reservation_domain::choice(
                "input.locationIds",
                input.location_ids,
                input.strategy.into(),
                input.allow_split,
            )
            .gql()?,
            idempotency_key: validate::idempotency_key("input.idempotencyKey", input.idempotency_key.as_deref())
                .gql()?,
        };
        let result = match service.reserve(&user.id, &request).await.gql()? {
            KitReserveOutcome::Reserved(row) => {
                ReserveKitResult::KitReserved(KitReserved { kit_reservation: KitReservation(row) })
            }
            KitReserveOutcome::SoldOut { kit, requested, available, components } => {
                let components = crate::reservations::graphql::ItemsUnavailable::new(components).items;
                ReserveKitResult::KitSoldOut(KitSoldOut { kit: Kit(kit), requested, available, components })
            }
            KitReserveOutcome::NotFound => ReserveKitResult::KitNotFound(KitNotFound { kit_id: request.kit_id }),
        };
        Ok(telemetry::counted("reserveKit", result))
    }

    /// Gives every component of one of the caller's ACTIVE kit reservations
    /// back at once. Releasing twice returns the stock once.
    async fn release_kit_reservation(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The kit reservation's id.")] id: Uuid,
    ) -> GqlResult<ReleaseKitResult> {
        let user = ctx.user()?;
        let result = match ctx.part::<KitService>()?.release(id, &user.id).await.gql()? {
            KitReleaseOutcome::Released(row) => ReleaseKitResult::KitReservationReleased(KitReservationReleased {
                kit_reservation: KitReservation(row),
            }),
            KitReleaseOutcome::NotFound => {
                ReleaseKitResult::ReservationNotFound(ReservationNotFound { reservation_id: id })
            }
            KitReleaseOutcome::NotActive(first) => {
                ReleaseKitResult::ReservationNotActive(ReservationNotActive { reservation: Reservation(first) })
            }
        };
        Ok(telemetry::counted("releaseKitReservation", result))
    }

    /// Moves the expiry of every component of one of the caller's ACTIVE
    /// kit reservations `seconds` later at once, never further from now
    /// than the server's maximum reservation lifetime; answers with the
    /// first component.
    async fn extend_kit_reservation(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The kit reservation's id.")] id: Uuid,
        #[graphql(
            desc = "Seconds to add to its expiry, 1 to the server's maximum reservation lifetime (STOCKGUARD_MAX_RESERVATION_TTL_SECS)."
        )]
        seconds: i32,
    ) -> GqlResult<ExtendResult> {
        let user = ctx.user()?;
        let service = ctx.part::<KitService>()?;
        let max = service.limits().max_reservation_ttl_secs;
        let seconds = validate::within("seconds", seconds, 1..=max).gql()?;
        let result = match service.extend(id, &user.id, seconds, max).await.gql()? {
            KitExtendOutcome::Extended(first) => {
                ExtendResult::ReservationExtended(ReservationExtended { reservation: Reservation(first) })
            }
            KitExtendOutcome::NotActive(first) => {
                ExtendResult::ReservationNotActive(ReservationNotActive { reservation: Reservation(first) })
            }
            KitExtendOutcome::NotFound => ExtendResult::ReservationNotFound(ReservationNotFound { reservation_id: id }),
        };
        Ok(telemetry::counted("extendKitReservation", result))
    }
}
