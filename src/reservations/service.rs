//! Reservation use cases: reserve (coalesced or alone), reserve many (and
//! the taking of every line or none that `placeOrder` shares), release,
//! extend, change the quantity. This is where it is decided which path a
//! reservation takes, whether a request is the replay of an idempotency
//! key, and what a statement that took nothing means (sold out, conflict,
//! not found); the rules that need no database are in `domain.rs`, the SQL
//! runs in `store.rs`, the statements come from `stock`.

use std::{sync::Arc, time::Duration};

use chrono::Utc;
use sea_orm::{DatabaseConnection, DatabaseTransaction, DbErr, TransactionTrait};
use uuid::Uuid;

use super::{
    ReservationRow, ReservationStatus,
    alone::reserve_alone,
    coalesce::{Batching, Coalescer},
    domain::{self, Taking, Unavailable},
    reserve::{ReserveOutcome, ReserveRequest},
    spread::Spread,
    store,
};
use crate::{
    app::AppState,
    config::Limits,
    db::{Collisions, Exhausted, StatementPool, read_answer},
    error::AppError,
    idempotency::{self, Extra, Key, Part},
    inventory::{InventoryRow, store as inventory_store},
    pagination::Page,
    stock::{
        allocating::Allocating,
        lines::{Line, Purpose},
        taking::ReservationChange,
    },
};

/// How a multi-item reservation ended.
#[derive(Debug)]
pub(crate) enum ReserveManyOutcome {
    /// Every line was reserved (now, or by the first request with this key).
    ReservedAll(Vec<ReservationRow>),
    /// Nothing was reserved; the lines that could not be served.
    ItemsUnavailable(Vec<Unavailable>),
}

/// How a release ended.
#[derive(Debug)]
pub(crate) enum ReleaseOutcome {
    /// The stock went back; the reservation and inventory as the statement left them.
    Released {
        /// The reservation, now RELEASED.
        reservation: ReservationRow,
        /// The inventory after the stock came back.
        inventory: InventoryRow,
    },
    /// No such reservation visible to the caller.
    NotFound,
    /// Visible, but no longer ACTIVE (released, expired or an order line).
    NotActive(ReservationRow),
    /// A component of a kit reservation, which is released whole; nothing written.
    PartOfKit(ReservationRow),
}

/// How an extension ended.
#[derive(Debug)]
pub(crate) enum ExtendOutcome {
    /// The new expiry is saved.
    Extended(ReservationRow),
    /// No such reservation of the caller's.
    NotFound,
    /// Not ACTIVE any more (released, expired or an order line).
    NotActive(ReservationRow),
    /// A component of a kit reservation, which is extended whole; nothing written.
    PartOfKit(ReservationRow),
}

/// How a change of a reservation's quantity ended.
#[derive(Debug)]
pub(crate) enum ChangeOutcome {
    /// The reservation holds the new quantity (now, or already did).
    Changed {
        /// The reservation as changed.
        reservation: ReservationRow,
        /// The inventory as the change left it (already at the quantity: the latest row).
        inventory: InventoryRow,
    },
    /// The inventory cannot give the units the change needs; nothing changed.
    SoldOut {
        /// Units the change needed beyond what the reservation held.
        requested: i32,
        /// What the eligible locations hold (see `SoldOut.available`).
        available: i32,
        /// The latest committed row.
        inventory: InventoryRow,
    },
    /// No such reservation of the caller's.
    NotFound,
    /// Not ACTIVE any more, or expired (released, swept or not, or an order line).
    NotActive(ReservationRow),
    /// A component of a kit reservation, whose quantities follow the kit's; nothing written.
    PartOfKit(ReservationRow),
}

/// Runs of a quantity change whose result went stale before it was read.
const CHANGE_ATTEMPTS: u32 = 3;

/// The reservations feature as the resolvers see it: one per server
/// process, built by the composition root and handed to the schema as data.
#[derive(Clone)]
pub(crate) struct ReservationService {
    /// The connection pool.
    db: DatabaseConnection,
    /// Connections for one-statement reservations.
    statements: StatementPool,
    /// Re-runs collided statements.
    collisions: Collisions,
    /// Serves concurrent conditional reservations in batches (one
    /// inventory's or many's); none when coalescing is switched off.
    coalescer: Option<Coalescer>,
    /// The inventories seen held in several places (shared with the coalescer).
    spread: Arc<Spread>,
    /// The limits requests are checked against.
    limits: Arc<Limits>,
}

/// The process's coalescer if its limits switch coalescing on: one for
/// every feature that reserves (`reserve`, `reserveKit`), so they share
/// lanes and batches.
pub(crate) fn coalescer(state: &AppState) -> Option<Coalescer> {
    let limits = &state.limits;
    limits.coalesce.then(|| {
        Coalescer::new(
            state.db.clone(),
            state.statements.clone(),
            state.collisions.clone(),
            Batching {
                lanes: limits.coalesce_lanes,
                max_batch: limits.coalesce_max_batch,
                backlog: limits.coalesce_backlog,
                window: Duration::from_micros(limits.coalesce_window_us),
            },
        )
    })
}

impl ReservationService {
    /// The service over `state`'s pools, serving single reserves through
    /// `coalescer` (none: each alone).
    pub(crate) fn new(state: &AppState, coalescer: Option<Coalescer>) -> Self {
        let spread = coalescer.as_ref().map_or_else(Arc::default, Coalescer::spread);
        Self {
            db: state.db.clone(),
            statements: state.statements.clone(),
            collisions: state.collisions.clone(),
            coalescer,
            spread,
            limits: state.limits.clone(),
        }
    }

    /// The limits requests are checked against.
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// One page of `user_id`'s reservations, oldest first: `first` rows
    /// (checked against the limits) after the cursor `after`, with one more
    /// when more follow.
    pub(crate) async fn page(
        &self,
        user_id: &str,
        first: Option<i32>,
        after: Option<&str>,
    ) -> Result<(Page, Vec<ReservationRow>), AppError> {
        let page = Page::parse(first, after, self.limits.max_page_size)?;
        Ok((page, store::page_for_user(&self.db, user_id, page).await?))
    }

    /// Takes stock for `user_id`, sharing one statement with others waiting
    /// at the same time (on its inventory or on others) when coalescing is on
    /// and it takes by the default choice (any active location, by priority,
    /// splitting allowed), wherever the inventory's stock is. A request that
    /// chooses otherwise is served alone.
    pub(crate) async fn reserve(&self, user_id: &str, request: &ReserveRequest) -> Result<ReserveOutcome, AppError> {
        known_locations(&self.db, &request.allocating, "input.locationIds").await?;
        match &self.coalescer {
            Some(coalescer) if request.allocating.is_default() => coalescer.reserve(user_id, request).await,
            _ => reserve_alone(&self.db, &self.statements, &self.collisions, user_id, request, &self.spread).await,
        }
    }

    /// Reserves every line or none (see [`take_every_line`]).
    pub(crate) async fn reserve_many(
        &self,
        user_id: &str,
        taking: &Taking,
        idempotency_key: Option<String>,
        ttl_secs: i32,
    ) -> Result<ReserveManyOutcome, AppError> {
        let lines = &taking.lines;
        for (i, line) in lines.iter().enumerate() {
            known_locations(&self.db, &line.allocating, &format!("input.items[{i}].locationIds")).await?;
        }
        let key = idempotency_key.map(|key| multi_item_key(key, "reserveMany", taking, Extra::default()));
        if let Some(first) = replay_multi_item(&self.db, user_id, key.as_ref()).await? {
            return Ok(ReserveManyOutcome::ReservedAll(first));
        }
        let inactive = taking.inactive();
        if !inactive.is_empty() {
            return Ok(ReserveManyOutcome::ItemsUnavailable(inactive));
        }
        let run = || async {
            let txn = self.db.begin().await?;
            let purpose = Purpose::Reservations { ttl_secs };
            let taken = take_every_line(&txn, user_id, taking, purpose, key.as_ref()).await?;
            if taken.is_ok() {
                txn.commit().await?;
            }
            Ok(taken)
        };
        let taken = match self.collisions.run(lines[0].inventory_id, run).await {
            Ok(attempted) => attempted.done(),
            // The key's first request committed while this one waited.
            Err(err) if idempotency::is_taken(&err) => {
                return replay_multi_item(&self.db, user_id, key.as_ref())
                    .await?
                    .map(ReserveManyOutcome::ReservedAll)
                    .ok_or_else(|| AppError::internal(anyhow::anyhow!("a taken idempotency key has no first use")));
            }
            Err(err) => return Err(err.into()),
        };
        Ok(match taken {
            Ok(Ok(rows)) => ReserveManyOutcome::ReservedAll(rows),
            Ok(Err(unavailable)) => ReserveManyOutcome::ItemsUnavailable(unavailable),
            Err(Exhausted { .. }) => ReserveManyOutcome::ItemsUnavailable(lines_in_conflict(&self.db, lines).await?),
        })
    }

    /// Gives an ACTIVE, unexpired reservation of `owner`'s stock back, once.
    /// When collision retries run out the reservation is as it was (still
    /// ACTIVE, most likely), which no member of the release's union says:
    /// the answer is the retryable `DATABASE_UNAVAILABLE`.
    pub(crate) async fn release(&self, id: Uuid, owner: &str) -> Result<ReleaseOutcome, AppError> {
        if let Some(change) = store::release(&self.db, &self.collisions, id, owner).await?.done()? {
            return Ok(ReleaseOutcome::Released { reservation: change.reservation, inventory: change.inventory });
        }
        Ok(match read_answer!(&self.db, |db| store::find(db, id))?.filter(|r| r.user_id == owner) {
            None => ReleaseOutcome::NotFound,
            Some(reservation) if reservation.kit_reservation_id.is_some() => ReleaseOutcome::PartOfKit(reservation),
            Some(reservation) => ReleaseOutcome::NotActive(self.reported(reservation).await?),
        })
    }

    /// Changes an ACTIVE, unexpired reservation of `owner`'s to `quantity`
    /// units in one statement (see `stock::adjusting`).
    pub(crate) async fn change_quantity(
        &self,
        id: Uuid,
        owner: &str,
        quantity: i32,
    ) -> Result<ChangeOutcome, AppError> {
        for _ in 0..CHANGE_ATTEMPTS {
            // Collision retries that run out are `DATABASE_UNAVAILABLE`.
            if let Some(change) =
                store::change_quantity(&self.db, &self.collisions, id, owner, quantity).await?.done()?
            {
                return Ok(ChangeOutcome::Changed { reservation: change.reservation, inventory: change.inventory });
            }
            // Nothing changed; one read of the latest rows (one snapshot) tells why.
            let latest = read_answer!(&self.db, |db| store::find_with_inventory(db, id))?;
            let Some(ReservationChange { reservation, inventory }) = latest.filter(|c| c.reservation.user_id == owner)
            else {
                return Ok(ChangeOutcome::NotFound);
            };
            if reservation.kit_reservation_id.is_some() {
                return Ok(ChangeOutcome::PartOfKit(reservation));
            }
            if domain::status_at(&reservation, Utc::now()) != ReservationStatus::Active {
                return Ok(ChangeOutcome::NotActive(self.reported(reservation).await?));
            }
            let needed = quantity - reservation.quantity;
            if needed == 0 {
                return Ok(ChangeOutcome::Changed { reservation: self.reported(reservation).await?, inventory });
            }
            let available = read_answer!(&self.db, |db| store::available_for_more(db, &reservation))?;
            if needed > available {
                return Ok(ChangeOutcome::SoldOut { requested: needed, available, inventory });
            }
            // The line or its stock moved between the statement and this read
            // (another change of the line, a release of other units): the
            // statement judged other numbers, so run it again on the latest.
        }
        tracing::warn!(%id, "quantity change kept going stale");
        Err(AppError::DatabaseUnavailable)
    }

    /// Moves an ACTIVE, unexpired reservation's expiry `seconds` later, but
    /// never past `max_ttl_secs` from now.
    pub(crate) async fn extend(
        &self,
        id: Uuid,
        owner: &str,
        seconds: i32,
        max_ttl_secs: i32,
    ) -> Result<ExtendOutcome, AppError> {
        // Collision retries that run out are `DATABASE_UNAVAILABLE`.
        if let Some(extended) =
            store::extend(&self.db, &self.collisions, id, owner, seconds, max_ttl_secs).await?.done()?
        {
            return Ok(ExtendOutcome::Extended(extended));
        }
        Ok(match read_answer!(&self.db, |db| store::find(db, id))?.filter(|r| r.user_id == owner) {
            None => ExtendOutcome::NotFound,
            Some(reservation) if reservation.kit_reservation_id.is_some() => ExtendOutcome::PartOfKit(reservation),
            Some(reservation) => ExtendOutcome::NotActive(self.reported(reservation).await?),
        })
    }

    /// `reservation`, as another request left it (a retried release finds
    /// it released by the first attempt), once that request's commit is
    /// durable: an answer that reports a write must not come before it
    /// (`crate::db::durable`).
    async fn reported(&self, reservation: ReservationRow) -> Result<ReservationRow, AppError> {
        crate::db::durable(&self.db).await?;
        Ok(reservation)
    }
}

/// The idempotency key of a multi-item `operation` over `taking`'s lines,
/// with `extra` for anything else that makes the request what it is; its
/// kit lines, when it has any, enter too (a kit and its components named
/// loose are two requests).
pub(crate) fn multi_item_key(key: String, operation: &str, taking: &Taking, mut extra: Extra<'_>) -> Key {
    let lines = taking.lines.iter().map(|l| (l.inventory_id, l.quantity, l.expected_version, &l.allocating));
    if !taking.kits.is_empty() {
        let kits = taking
            .kits
            .iter()
            .map(|k| Part::Record(vec![("kitId", Part::Id(k.kit_id)), ("quantity", Part::Int(k.quantity.into()))]));
        extra.fields.push(("kits", Part::List(kits.collect())));
        extra.legacy.clear();
    }
    Key::multi_item(key, operation, lines, extra)
}

/// Takes every line of `taking` (merged and sorted by `domain::Taking`) or
/// none, inside `txn`: the inventories are locked in id order, judged as
/// locked, and one statement takes them all. `Ok(Err(..))` lists every
/// line that cannot be served (a line a kit line named says which kit);
/// the caller then rolls back (nothing was written).
pub(crate) async fn take_every_line(
    txn: &DatabaseTransaction,
    user_id: &str,
    taking: &Taking,
    purpose: Purpose,
    key: Option<&Key>,
) -> Result<Result<Vec<ReservationRow>, Vec<Unavailable>>, DbErr> {
    let locked = store::lock_lines(txn, &taking.lines).await?;
    let unavailable = domain::judge(&taking.lines, &locked);
    if !unavailable.is_empty() {
        let named = |u: Unavailable| Unavailable { kit_id: taking.kit_of(u.inventory_id), ..u };
        return Ok(Err(unavailable.into_iter().map(named).collect()));
    }
    let rows = store::take_lines(txn, user_id, taking, purpose, key).await?;
    if rows.len() != taking.parts.len() {
        return Err(DbErr::Custom(format!("{} of {} locked parts were taken", rows.len(), taking.parts.len())));
    }
    Ok(Ok(rows))
}

/// Every line as a conflict, with the latest rows: what a multi-item
/// request answers when its collision retries ran out.
pub(crate) async fn lines_in_conflict(db: &DatabaseConnection, lines: &[Line]) -> Result<Vec<Unavailable>, AppError> {
    let latest = read_answer!(db, |db| inventory_store::find_many(db, lines.iter().map(|l| l.inventory_id)))?;
    Ok(domain::in_conflict(lines, &latest))
}

/// Refuses location ids that name no location (`BAD_USER_INPUT` at
/// `field`); an empty list is refused before, with the other input checks.
pub(crate) async fn known_locations(
    db: &DatabaseConnection,
    allocating: &Allocating,
    field: &str,
) -> Result<(), AppError> {
    let Some(ids) = &allocating.location_ids else { return Ok(()) };
    let unknown = read_answer!(db, |db| inventory_store::unknown_locations(db, ids))?;
    match unknown.first() {
        None => Ok(()),
        Some(id) => Err(AppError::bad_input(field, format!("no location has id {id}"))),
    }
}

/// The reservations of the multi-item request that first used this key, if any.
async fn replay_multi_item(
    db: &DatabaseConnection,
    user_id: &str,
    key: Option<&Key>,
) -> Result<Option<Vec<ReservationRow>>, AppError> {
    match key {
        Some(key) => idempotency::replay_multi_item(db, user_id, key).await,
        None => Ok(None),
    }
}
