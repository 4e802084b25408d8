//! Kit use cases: making and changing kits (operators), reserving kits
//! (one statement, `stock::kitting`), releasing and extending a kit
//! reservation whole, with what a statement that wrote nothing means and
//! idempotency-key replays. The SQL runs in `store.rs`.

use std::collections::BTreeMap;

use sea_orm::DatabaseConnection;
use uuid::Uuid;

use super::{
    domain::{self, ComponentInput, Part},
    rows::{KitReservationRow, KitRow},
    store,
};
use crate::{
    app::AppState,
    config::Limits,
    db::{Collisions, DbFailure, classify, read_answer},
    error::AppError,
    idempotency::{self, Key},
    inventory::store as inventories,
    pagination::Page,
    reservations::{
        ReservationRow,
        coalesce::{Coalescer, KitAsk, KitTurn},
        domain::{Unavailable, UnavailableReason},
        service::known_locations,
    },
    stock::{allocating::Allocating, kitting::KitReserve},
};

/// The kits feature as the resolvers see it: one per server process.
#[derive(Clone)]
pub(crate) struct KitService {
    /// The connection pool.
    db: DatabaseConnection,
    /// Re-runs collided statements.
    collisions: Collisions,
    /// The limits requests are checked against.
    limits: std::sync::Arc<Limits>,
    /// Serves kits by the default choice in the lanes and batches of
    /// single reserves; none when coalescing is switched off.
    coalescer: Option<Coalescer>,
}

/// A request to reserve kits, checked.
#[derive(Debug, Clone)]
pub(crate) struct KitRequest {
    /// The kit.
    pub kit_id: Uuid,
    /// Kits, 1 to the server's maximum quantity.
    pub quantity: i32,
    /// Where every component's units may come from.
    pub allocating: Allocating,
    /// The client's idempotency key.
    pub idempotency_key: Option<String>,
}

/// How a kit reservation request ended.
#[derive(Debug)]
pub(crate) enum KitReserveOutcome {
    /// Every component was taken (now, or by the first request with this key).
    Reserved(KitReservationRow),
    /// Some component cannot be served; nothing was taken.
    SoldOut {
        /// The kit.
        kit: KitRow,
        /// Kits asked for.
        requested: i32,
        /// Kits the components' eligible locations could give together.
        available: i32,
        /// The short components.
        components: Vec<Unavailable>,
    },
    /// No such kit, or it is inactive.
    NotFound,
}

/// How an extension of a kit reservation ended.
#[derive(Debug)]
pub(crate) enum KitExtendOutcome {
    /// Every component's expiry moved: the first component as saved.
    Extended(ReservationRow),
    /// No such kit reservation of the caller's.
    NotFound,
    /// Not ACTIVE any more: its first component as it is.
    NotActive(ReservationRow),
}

/// How a release of a kit reservation ended.
#[derive(Debug)]
pub(crate) enum KitReleaseOutcome {
    /// Every component's units went back.
    Released(KitReservationRow),
    /// No such kit reservation of the caller's.
    NotFound,
    /// Not ACTIVE any more: its first component as it is.
    NotActive(ReservationRow),
}

impl KitService {
    /// The service over `state`'s pool, batching kits through `coalescer`
    /// (none: each alone).
    pub(crate) fn new(state: &AppState, coalescer: Option<Coalescer>) -> Self {
        Self { db: state.db.clone(), collisions: state.collisions.clone(), limits: state.limits.clone(), coalescer }
    }

    /// The limits requests are checked against.
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// One page of kits, oldest first: `first` rows (checked against the
    /// limits) after the cursor `after`, with one more when more follow.
    pub(crate) async fn page(&self, first: Option<i32>, after: Option<&str>) -> Result<(Page, Vec<KitRow>), AppError> {
        let page = Page::parse(first, after, self.limits.max_page_size)?;
        Ok((page, store::page(&self.db, page).await?))
    }

    /// Makes a kit of `components`, flattened (kits named as components
    /// are replaced by their components): unknown inventories or kits, and
    /// the rules of `domain::flatten`, are `BAD_USER_INPUT`, as is a sku
    /// another kit has.
    pub(crate) async fn create(
        &self,
        sku: &str,
        name: &str,
        components: &[ComponentInput],
    ) -> Result<KitRow, AppError> {
        let kit_ids: Vec<Uuid> = components
            .iter()
            .filter_map(|c| match c.part {
                Part::Kit(id) => Some(id),
                Part::Inventory(_) => None,
            })
            .collect();
        // Components never change, so what is read here is what the kits hold.
        let sub_kits = read_answer!(&self.db, |db| store::components(db, &kit_ids))?;
        let mut flattened_from: BTreeMap<Uuid, Vec<(Uuid, i32)>> = BTreeMap::new();
        for component in sub_kits {
            flattened_from.entry(component.kit_id).or_default().push((component.inventory_id, component.quantity));
        }
        let flat = domain::flatten(components, &flattened_from)?;
        let ids: Vec<Uuid> = flat.iter().map(|c| c.0).collect();
        let known = read_answer!(&self.db, |db| inventories::find_many(db, ids.iter().copied()))?;
        if let Some(unknown) = ids.iter().find(|id| !known.iter().any(|row| row.id == **id)) {
            return Err(AppError::bad_input("input.components", format!("no inventory has id {unknown}")));
        }
        match store::create(&self.db, Uuid::new_v4(), sku, name, &flat).await {
            Ok(kit) => Ok(kit),
            Err(err) if matches!(classify(&err), DbFailure::UniqueViolation(_)) => {
                Err(AppError::bad_input("input.sku", format!("a kit with sku {sku:?} already exists")))
            }
            Err(err) => Err(err.into()),
        }
    }

    /// Renames or (de)activates a kit; none when unknown.
    pub(crate) async fn update(
        &self,
        id: Uuid,
        name: Option<String>,
        active: Option<bool>,
    ) -> Result<Option<KitRow>, AppError> {
        Ok(store::update(&self.db, id, name, active).await?)
    }

    /// Reserves kits for `user_id` in one statement: every component or
    /// none (see `stock::kitting::reserve_kit`). When collision retries run
    /// out nothing was taken: the retryable `DATABASE_UNAVAILABLE`.
    pub(crate) async fn reserve(&self, user_id: &str, request: &KitRequest) -> Result<KitReserveOutcome, AppError> {
        known_locations(&self.db, &request.allocating, "input.locationIds").await?;
        let key = request
            .idempotency_key
            .clone()
            .map(|key| Key::reserve_kit(key, request.kit_id, request.quantity, &request.allocating));
        if let Some(first) = self.replay(user_id, key.as_ref()).await? {
            return Ok(KitReserveOutcome::Reserved(first));
        }
        let kit_id = request.kit_id;
        let Some(kit) = read_answer!(&self.db, |db| store::find_many(db, &[kit_id]))?.pop().filter(|kit| kit.active)
        else {
            return Ok(KitReserveOutcome::NotFound);
        };
        let components: Vec<(Uuid, i32)> = read_answer!(&self.db, |db| store::components(db, &[kit_id]))?
            .into_iter()
            .map(|c| (c.inventory_id, c.quantity))
            .collect();
        let lines = domain::lines(&components, request.quantity, &request.allocating, self.limits.max_quantity)?;
        let kit_reservation_id = Uuid::new_v4();
        let reserved = |created_at| {
            KitReserveOutcome::Reserved(KitReservationRow {
                id: kit_reservation_id,
                kit_id,
                user_id: user_id.to_owned(),
                quantity: request.quantity,
                created_at,
            })
        };
        // By the default choice a kit shares lanes and statements with
        // single reserves; otherwise, or when its batch did not serve it,
        // it runs its own statement (in its lane, if it was given one).
        let _lane = match &self.coalescer {
            Some(coalescer) if request.allocating.is_default() => {
                let ask = KitAsk {
                    kit_id,
                    quantity: request.quantity,
                    kit_reservation_id,
                    inventory_ids: lines.iter().map(|line| line.inventory_id).collect(),
                    quantities: lines.iter().map(|line| line.quantity).collect(),
                    key: key.clone(),
                    ttl_secs: self.limits.reservation_ttl_secs,
                };
                match coalescer.reserve_kit(user_id, ask).await? {
                    KitTurn::Granted { created_at } => return Ok(reserved(created_at)),
                    KitTurn::Alone(lane) => lane,
                }
            }
            _ => None,
        };
        let statement = KitReserve {
            kit_id,
            quantity: request.quantity,
            lines: &lines,
            kit_reservation_id,
            user_id,
            key: key.as_ref().map(|k| (k.key.as_str(), k.fingerprint.as_str())),
            ttl_secs: self.limits.reservation_ttl_secs,
        };
        let taken =
            match store::reserve(&self.db, &self.collisions, statement).await {
                Ok(attempted) => attempted.done()?,
                // The key's first request committed while this one waited.
                Err(err) if idempotency::is_taken(&err) => {
                    return self.replay(user_id, key.as_ref()).await?.map(KitReserveOutcome::Reserved).ok_or_else(
                        || AppError::internal(anyhow::anyhow!("a taken idempotency key has no first use")),
                    );
                }
                Err(err) => return Err(err.into()),
            };
        if let Some(first) = taken.first().and_then(|t| t.reservation.as_ref()) {
            return Ok(reserved(first.created_at));
        }
        let short: Vec<Unavailable> = taken
            .iter()
            .filter(|t| !t.line.feasible)
            .map(|t| Unavailable {
                inventory_id: t.line.inventory.id,
                reason: UnavailableReason::SoldOut,
                inventory: Some(t.line.inventory.clone()),
                available: Some(t.line.eligible),
                kit_id: Some(kit_id),
            })
            .collect();
        // Every component could be served, yet nothing was written: the kit
        // was deactivated meanwhile.
        if short.is_empty() {
            return Ok(KitReserveOutcome::NotFound);
        }
        let available =
            taken.iter().zip(&components).map(|(t, &(_, per_kit))| t.line.eligible / per_kit).min().unwrap_or(0);
        Ok(KitReserveOutcome::SoldOut { kit, requested: request.quantity, available, components: short })
    }

    /// The kit reservation made by the first request with this key, if any.
    async fn replay(&self, user_id: &str, key: Option<&Key>) -> Result<Option<KitReservationRow>, AppError> {
        let Some(key) = key else { return Ok(None) };
        let Some(first) = idempotency::first_use(&self.db, user_id, key).await? else { return Ok(None) };
        let missing = || AppError::internal(anyhow::anyhow!("a reserveKit key's first use has no kit reservation"));
        let id = first.kit_reservation_id.ok_or_else(missing)?;
        read_answer!(&self.db, |db| store::kit_reservations(db, &[id]))?.pop().map(Some).ok_or_else(missing)
    }

    /// Gives every component of an ACTIVE, unexpired kit reservation of
    /// `owner`'s back at once. When collision retries run out nothing was
    /// written: the retryable `DATABASE_UNAVAILABLE`.
    pub(crate) async fn release(&self, id: Uuid, owner: &str) -> Result<KitReleaseOutcome, AppError> {
        // Read first: a kit reservation's row never changes, and once the
        // release has committed nothing must stand between it and its answer.
        let Some(kit_reservation) = self.owned(id, owner).await? else { return Ok(KitReleaseOutcome::NotFound) };
        let released = store::release(&self.db, &self.collisions, id, owner).await?.done()?;
        if released > 0 {
            return Ok(KitReleaseOutcome::Released(kit_reservation));
        }
        Ok(KitReleaseOutcome::NotActive(self.first_part(id).await?))
    }

    /// Moves the expiry of every component of an ACTIVE, unexpired kit
    /// reservation of `owner`'s `seconds` later at once (never past
    /// `max_ttl_secs` from now); answered with its first component.
    pub(crate) async fn extend(
        &self,
        id: Uuid,
        owner: &str,
        seconds: i32,
        max_ttl_secs: i32,
    ) -> Result<KitExtendOutcome, AppError> {
        let extended = store::extend(&self.db, &self.collisions, id, owner, seconds, max_ttl_secs).await?.done()?;
        if let Some(first) = extended.into_iter().min_by_key(|r| r.inventory_id) {
            return Ok(KitExtendOutcome::Extended(first));
        }
        if self.owned(id, owner).await?.is_none() {
            return Ok(KitExtendOutcome::NotFound);
        }
        Ok(KitExtendOutcome::NotActive(self.first_part(id).await?))
    }

    /// The first component of the kit reservation `id` (they share their
    /// status), as another request left it, once that request's commit is
    /// durable: an answer that reports a write must not come before it
    /// (`crate::db::durable`).
    async fn first_part(&self, id: Uuid) -> Result<ReservationRow, AppError> {
        let parts = read_answer!(&self.db, |db| store::parts(db, &[id]))?;
        crate::db::durable(&self.db).await?;
        parts
            .into_iter()
            .next()
            .ok_or_else(|| AppError::internal(anyhow::anyhow!("a kit reservation has no component")))
    }

    /// The kit reservation `id` if it is `owner`'s.
    async fn owned(&self, id: Uuid, owner: &str) -> Result<Option<KitReservationRow>, AppError> {
        let found = read_answer!(&self.db, |db| store::kit_reservations(db, &[id]))?;
        Ok(found.into_iter().find(|k| k.user_id == owner))
    }
}
