//! Order use cases: place, check out a cart, confirm, cancel, fulfil, change
//! the address.
//!
//! Confirm, cancel and fulfil depend only on the current state, so they
//! re-read and retry the whole transaction (at most [`MAX_ATTEMPTS`], never
//! inside an outer transaction). Changing the address is based on what a
//! person saw, so it is never retried: a stale version is reported with the
//! current order. A checkout is one statement, re-run on collisions; when it
//! wrote nothing, one read of the cart's latest rows says why. Placing an
//! order writes the order row and takes the stock of every line (the
//! reservations' `take_every_line`) in one transaction: all or nothing.

use std::sync::Arc;

use chrono::Utc;
use futures::stream::BoxStream;
use sea_orm::{DatabaseConnection, DbErr, TransactionTrait};
use uuid::Uuid;

use super::{
    domain::{Order, ShippingAddress},
    entity::OrderStatus,
    store,
};
use crate::{
    app::AppState,
    auth::User,
    config::{Limits, OrderLocking},
    db::{Collisions, DbFailure, Exhausted, classify, read_answer},
    error::AppError,
    idempotency::{self, Extra, Key, Part},
    kits::store as kit_store,
    live::Feed,
    pagination::Page,
    reservations::{
        ReservationRow, ReservationStatus,
        domain::{MAX_LINES, Taking, Unavailable, status_at},
        service::{known_locations, lines_in_conflict, multi_item_key, take_every_line},
        store as reservation_store,
    },
    stock::lines::Purpose,
    telemetry,
};

/// Attempts of a confirm or cancel before `OrderModifiedConcurrently`.
pub(crate) const MAX_ATTEMPTS: u32 = 3;

/// The orders feature as the resolvers see it: one per server process,
/// built by the composition root and handed to the schema as data.
#[derive(Clone)]
pub(crate) struct OrderService {
    /// The connection pool.
    db: DatabaseConnection,
    /// Re-runs collided statements.
    collisions: Collisions,
    /// The limits, the order locking mode and its lock timeout.
    limits: Arc<Limits>,
}

/// How `placeOrder` ended.
#[derive(Debug)]
pub(crate) enum PlaceOutcome {
    /// The order and its lines exist (now, or from the first request with this key).
    Placed(Order),
    /// Nothing was written; the lines that could not be served.
    ItemsUnavailable(Vec<Unavailable>),
}

/// Why a reservation of a cart cannot be checked out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnavailableReservationReason {
    /// No such reservation, or someone else's.
    NotFound,
    /// Past its expiry, whether or not the sweeper has returned its stock yet.
    Expired,
    /// Given back.
    Released,
    /// Already a line of an order (this one's, another checkout's, or a fulfilled one's).
    Ordered,
    /// A component of a kit reservation, which is checked out whole (`kitReservationIds`).
    PartOfKit,
}

/// A reservation of a cart that cannot be checked out, with its latest state.
#[derive(Debug, Clone)]
pub(crate) struct UnavailableReservation {
    /// The reservation the request named.
    pub reservation_id: Uuid,
    /// Why.
    pub reason: UnavailableReservationReason,
    /// The latest committed row (none when not found).
    pub reservation: Option<ReservationRow>,
}

/// How a checkout ended.
#[derive(Debug)]
pub(crate) enum CheckoutOutcome {
    /// The order and its lines exist (now, or from the first request with this key).
    Placed(Order),
    /// Nothing was written; the reservations that could not be checked out.
    ReservationsUnavailable(Vec<UnavailableReservation>),
}

/// A change of status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transition {
    /// PENDING → CONFIRMED (operators).
    Confirm,
    /// PENDING → CANCELLED, stock back.
    Cancel,
    /// CONFIRMED → FULFILLED (operators), the lines shipped.
    Fulfil,
}

/// How a confirm, cancel or fulfilment ended.
#[derive(Debug)]
pub(crate) enum TransitionOutcome {
    /// Done; the order as saved.
    Done(Order),
    /// The order's status does not allow it (no longer PENDING; for a
    /// fulfilment, not CONFIRMED); as it is now.
    NotAllowed(Order),
    /// No such order visible to the caller.
    NotFound,
    /// Every attempt lost a race, or the lock wait ran out.
    ModifiedConcurrently {
        /// Attempts made.
        attempts: u32,
    },
}

/// How `changeShippingAddress` ended.
#[derive(Debug)]
pub(crate) enum AddressOutcome {
    /// Saved; the order as it is now.
    Changed(Order),
    /// The order is no longer at the expected version; nothing was written.
    VersionConflict(Order),
    /// The order is not PENDING; nothing was written.
    NotEditable(Order),
    /// No such order visible to the caller.
    NotFound,
}

impl OrderService {
    /// The service over `state`'s pool, collision policy and limits.
    pub(crate) fn new(state: &AppState) -> Self {
        Self { db: state.db.clone(), collisions: state.collisions.clone(), limits: state.limits.clone() }
    }

    /// The limits requests are checked against.
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Takes the stock of every line, creates the order and its ORDERED
    /// reservations, all in one short transaction: all or nothing. When
    /// collision retries run out, every line is `CONFLICT`.
    pub(crate) async fn place_order(
        &self,
        user_id: &str,
        taking: &Taking,
        address: ShippingAddress,
        idempotency_key: Option<String>,
    ) -> Result<PlaceOutcome, AppError> {
        let Self { db, collisions, .. } = self;
        let lines = &taking.lines;
        for (i, line) in lines.iter().enumerate() {
            known_locations(db, &line.allocating, &format!("input.items[{i}].locationIds")).await?;
        }
        let key = idempotency_key.map(|key| multi_item_key(key, "placeOrder", taking, fingerprinted(&address)));
        if let Some(order) = replay(db, user_id, key.as_ref()).await? {
            return Ok(PlaceOutcome::Placed(order));
        }
        let inactive = taking.inactive();
        if !inactive.is_empty() {
            return Ok(PlaceOutcome::ItemsUnavailable(inactive));
        }
        let run = || async {
            let order = Order::place(Uuid::new_v4(), user_id.to_owned(), address.clone(), Utc::now());
            let txn = db.begin().await?;
            store::insert(&txn, &order).await?;
            let taken = take_every_line(&txn, user_id, taking, Purpose::Order(order.id), key.as_ref()).await?;
            if taken.is_ok() {
                txn.commit().await?;
            }
            Ok(taken.map(|_| order))
        };
        let placed = match collisions.run(lines[0].inventory_id, run).await {
            Ok(attempted) => attempted.done(),
            // The key's first request committed while this one waited.
            Err(err) if idempotency::is_taken(&err) => {
                return replay(db, user_id, key.as_ref())
                    .await?
                    .map(PlaceOutcome::Placed)
                    .ok_or_else(|| AppError::internal(anyhow::anyhow!("a taken idempotency key has no order")));
            }
            Err(err) => return Err(err.into()),
        };
        Ok(match placed {
            Ok(Ok(order)) => PlaceOutcome::Placed(order),
            Ok(Err(unavailable)) => PlaceOutcome::ItemsUnavailable(unavailable),
            Err(Exhausted { .. }) => PlaceOutcome::ItemsUnavailable(lines_in_conflict(db, lines).await?),
        })
    }

    /// Checks out the caller's cart (made by [`cart`]) into one new PENDING
    /// order, all or nothing, without moving stock (see [`store::checkout`]):
    /// every reservation it names, and every component of every kit
    /// reservation it names. When collision retries run out nothing was
    /// judged, so no line can be named unavailable: the answer is the
    /// retryable `DATABASE_UNAVAILABLE`.
    pub(crate) async fn checkout(
        &self,
        user_id: &str,
        cart: &Cart,
        address: ShippingAddress,
        idempotency_key: Option<String>,
    ) -> Result<CheckoutOutcome, AppError> {
        let Self { db, collisions, .. } = self;
        let key = idempotency_key
            .map(|key| Key::checkout(key, &cart.reservation_ids, &cart.kit_reservation_ids, fingerprinted(&address)));
        if let Some(order) = replay(db, user_id, key.as_ref()).await? {
            return Ok(CheckoutOutcome::Placed(order));
        }
        let order = Order::place(Uuid::new_v4(), user_id.to_owned(), address, Utc::now());
        let run = || store::checkout(db, &order, cart, key.as_ref());
        let first = cart.reservation_ids.first().or(cart.kit_reservation_ids.first()).copied().unwrap_or_default();
        let lines = match collisions.run(first, run).await {
            Ok(attempted) => attempted.done()?,
            // The key was claimed first by a request that has committed.
            Err(err) if idempotency::is_taken(&err) => {
                return replay(db, user_id, key.as_ref())
                    .await?
                    .map(CheckoutOutcome::Placed)
                    .ok_or_else(|| AppError::internal(anyhow::anyhow!("a taken idempotency key has no order")));
            }
            Err(err) => return Err(err.into()),
        };
        if !lines.is_empty() {
            let own = lines.iter().filter(|line| line.kit_reservation_id.is_none()).count();
            let mut kits: Vec<Uuid> = lines.iter().filter_map(|line| line.kit_reservation_id).collect();
            kits.dedup();
            if own != cart.reservation_ids.len() || kits.len() != cart.kit_reservation_ids.len() {
                return Err(AppError::internal(anyhow::anyhow!(
                    "a checkout wrote {own} of a cart's {} reservations and {} of its {} kit reservations",
                    cart.reservation_ids.len(),
                    kits.len(),
                    cart.kit_reservation_ids.len()
                )));
            }
            return Ok(CheckoutOutcome::Placed(order));
        }
        // Nothing written. A concurrent replay of this key that won must get
        // the first order, not the lines it has just ordered reported as ORDERED.
        if let Some(first) = replay(db, user_id, key.as_ref()).await? {
            return Ok(CheckoutOutcome::Placed(first));
        }
        let unavailable = unavailable_reservations(db, user_id, cart).await?;
        if !unavailable.is_empty() {
            return Ok(CheckoutOutcome::ReservationsUnavailable(unavailable));
        }
        // The statement judged every line as it committed and no line becomes
        // available again, so one that wrote nothing names one that is not.
        tracing::error!("a checkout that ran wrote nothing, yet every line is available");
        Err(AppError::DatabaseUnavailable)
    }

    /// Confirms, cancels or fulfils, re-reading and retrying on a lost race
    /// (at most [`MAX_ATTEMPTS`], then `ModifiedConcurrently`).
    pub(crate) async fn transition(
        &self,
        user: &User,
        id: Uuid,
        transition: Transition,
    ) -> Result<TransitionOutcome, AppError> {
        let Self { db, limits, .. } = self;
        for attempt in 1..=MAX_ATTEMPTS {
            match attempt_transition(db, limits, user, id, transition).await {
                Ok(Attempt::Finished(outcome)) => {
                    // A refusal tells the client where another request left
                    // the order (a retried cancel finds it cancelled).
                    if let TransitionOutcome::NotAllowed(_) = outcome {
                        crate::db::durable(db).await?;
                    }
                    return Ok(outcome);
                }
                Ok(Attempt::LostRace) => {
                    tracing::debug!(attempt, %id, "order modified concurrently, retrying");
                    telemetry::collision_retry("order_version");
                }
                Err(err) => match classify(&err) {
                    failure if failure.is_collision() => {
                        tracing::debug!(attempt, %id, ?failure, "collision, retrying");
                        telemetry::db_failure(failure.label());
                        telemetry::collision_retry("transaction");
                    }
                    // The lock wait ran out: someone holds the order; report, do not queue.
                    failure @ (DbFailure::LockNotAvailable | DbFailure::StatementTimeout)
                        if limits.order_locking == OrderLocking::Pessimistic =>
                    {
                        telemetry::db_failure(failure.label());
                        return Ok(TransitionOutcome::ModifiedConcurrently { attempts: attempt });
                    }
                    _ => return Err(err.into()),
                },
            }
        }
        Ok(TransitionOutcome::ModifiedConcurrently { attempts: MAX_ATTEMPTS })
    }

    /// Changes the address only if the order is still at `expected_version`.
    /// Never retried: a stale screen must be shown the current order. When
    /// collision retries run out the answer is the order as it is now, as
    /// for a lost race: `VersionConflict` (`NotEditable` once not PENDING).
    pub(crate) async fn change_shipping_address(
        &self,
        user: &User,
        id: Uuid,
        expected_version: i32,
        address: ShippingAddress,
    ) -> Result<AddressOutcome, AppError> {
        let Self { db, collisions, .. } = self;
        // Only the customer edits their order's address; to anyone else it is absent.
        let Some(current) = read_answer!(db, |db| store::find(db, id))?.filter(|order| order.user_id == user.id) else {
            return Ok(AddressOutcome::NotFound);
        };
        if current.version != expected_version {
            return Ok(AddressOutcome::VersionConflict(current));
        }
        let mut changed = current.clone();
        if changed.change_shipping_address(address).is_err() {
            return Ok(AddressOutcome::NotEditable(current));
        }
        // Re-running `save` after a collision is safe: the version condition
        // still guards what the user saw. Retries that ran out are answered
        // as a lost race: the order as it is now.
        let saved = collisions.run(id, || store::save(db, &changed, expected_version)).await?.done().unwrap_or(false);
        if saved {
            changed.version = expected_version + 1;
            return Ok(AddressOutcome::Changed(changed));
        }
        let latest = read_answer!(db, |db| store::find(db, id))?
            .ok_or_else(|| AppError::internal(anyhow::anyhow!("order {id} vanished")))?;
        Ok(if latest.status() == OrderStatus::Pending {
            AddressOutcome::VersionConflict(latest)
        } else {
            AddressOutcome::NotEditable(latest)
        })
    }

    /// One page of orders, oldest first, `first` rows after the cursor
    /// `after` (checked against the limits): `user`'s own, or all for
    /// operators; only `status` when given. The rows, with one more when
    /// more follow.
    pub(crate) async fn page(
        &self,
        user: &User,
        status: Option<OrderStatus>,
        first: Option<i32>,
        after: Option<&str>,
    ) -> Result<(Page, Vec<Order>), AppError> {
        let page = Page::parse(first, after, self.limits.max_page_size)?;
        let owner = (!user.is_operator()).then_some(user.id.as_str());
        Ok((page, store::page(&self.db, owner, status, page).await?))
    }

    /// Every committed change of order `id` from now on, if `user` may see
    /// it (see [`Live::watch_order`]); none when not.
    pub(crate) async fn watch(
        &self,
        live: &Feed<Order>,
        user: &User,
        id: Uuid,
    ) -> Result<Option<BoxStream<'static, Order>>, AppError> {
        let Some(order) = store::find(&self.db, id).await?.filter(|order| user.may_see(&order.user_id)) else {
            return Ok(None);
        };
        Ok(Some(live.follow(self.db.clone(), &order).await?))
    }
}

/// The address as it enters the fingerprint of a `placeOrder` or a
/// `checkout`: its fields by their API names, in a fixed order, and the text
/// keys stored before the canonical encoding hold for it (see
/// `idempotency/legacy.rs`). That text is what `Debug` wrote for `ShippingAddress`,
/// spelled out so that renaming the struct or a field cannot change it; its
/// strings are still escaped as `Debug` escapes a `str`, which is how they
/// were stored (a printable ASCII address, the usual one, is written as is).
fn fingerprinted(address: &ShippingAddress) -> Extra<'_> {
    let fields = vec![
        ("name", Part::Text(&address.name)),
        ("line1", Part::Text(&address.line1)),
        ("line2", Part::optional_text(address.line2.as_deref())),
        ("city", Part::Text(&address.city)),
        ("postalCode", Part::Text(&address.postal_code)),
        ("country", Part::Text(&address.country)),
    ];
    let line2 = address.line2.as_ref().map_or_else(|| "None".to_owned(), |line2| format!("Some({line2:?})"));
    let legacy = format!(
        "ShippingAddress {{ name: {:?}, line1: {:?}, line2: {line2}, city: {:?}, postal_code: {:?}, country: {:?} }}",
        address.name, address.line1, address.city, address.postal_code, address.country
    );
    Extra { fields: vec![("address", Part::Record(fields))], legacy }
}

/// The order placed first with this key, if any.
async fn replay(db: &DatabaseConnection, user_id: &str, key: Option<&Key>) -> Result<Option<Order>, AppError> {
    let Some(key) = key else { return Ok(None) };
    let Some(order_id) = idempotency::replay_order(db, user_id, key).await? else { return Ok(None) };
    Ok(Some(
        read_answer!(db, |db| store::find(db, order_id))?
            .ok_or_else(|| AppError::internal(anyhow::anyhow!("an idempotency key names a missing order")))?,
    ))
}

/// What a checkout takes: reservations and kit reservations, each sorted
/// (the locking order) and without repeats.
#[derive(Debug, Clone)]
pub(crate) struct Cart {
    /// Reservations of their own.
    pub reservation_ids: Vec<Uuid>,
    /// Kit reservations, each checked out whole.
    pub kit_reservation_ids: Vec<Uuid>,
}

/// The cart a checkout names: each list sorted and without repeats, at
/// most [`MAX_LINES`] ids each and at least one id in all; else
/// `BAD_USER_INPUT`.
pub(crate) fn cart(reservation_ids: &[Uuid], kit_reservation_ids: &[Uuid]) -> Result<Cart, AppError> {
    let ids = |given: &[Uuid], field: &str| {
        let mut ids = given.to_vec();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() > MAX_LINES {
            return Err(AppError::bad_input(field, format!("at most {MAX_LINES} per checkout")));
        }
        Ok(ids)
    };
    let cart = Cart {
        reservation_ids: ids(reservation_ids, "input.reservationIds")?,
        kit_reservation_ids: ids(kit_reservation_ids, "input.kitReservationIds")?,
    };
    if cart.reservation_ids.is_empty() && cart.kit_reservation_ids.is_empty() {
        return Err(AppError::bad_input(
            "input.reservationIds",
            "a checkout must name at least one reservation or kit reservation",
        ));
    }
    Ok(cart)
}

/// Every reservation and kit reservation of the cart that cannot be
/// checked out now, with why, from one read of the latest rows each (a kit
/// reservation by its first component, whose status all of them share).
async fn unavailable_reservations(
    db: &DatabaseConnection,
    user_id: &str,
    cart: &Cart,
) -> Result<Vec<UnavailableReservation>, AppError> {
    let rows = read_answer!(db, |db| reservation_store::find_many(db, &cart.reservation_ids))?;
    let parts = read_answer!(db, |db| kit_store::parts(db, &cart.kit_reservation_ids))?;
    let now = Utc::now();
    // Someone else's reservation reads as absent, so ids do not leak.
    let mine = |row: &&ReservationRow| row.user_id == user_id;
    let own = cart.reservation_ids.iter().map(|&id| (id, rows.iter().filter(mine).find(|row| row.id == id), false));
    let kits = cart
        .kit_reservation_ids
        .iter()
        .map(|&id| (id, parts.iter().filter(mine).find(|row| row.kit_reservation_id == Some(id)), true));
    Ok(own
        .chain(kits)
        .filter_map(|(reservation_id, row, whole_kit)| {
            let reason = match row.map(|row| status_at(row, now)) {
                None => UnavailableReservationReason::NotFound,
                Some(ReservationStatus::Active)
                    if !whole_kit && row.is_some_and(|row| row.kit_reservation_id.is_some()) =>
                {
                    UnavailableReservationReason::PartOfKit
                }
                Some(ReservationStatus::Active) => return None,
                Some(ReservationStatus::Expired) => UnavailableReservationReason::Expired,
                Some(ReservationStatus::Released) => UnavailableReservationReason::Released,
                Some(ReservationStatus::Ordered | ReservationStatus::Fulfilled) => {
                    UnavailableReservationReason::Ordered
                }
            };
            Some(UnavailableReservation { reservation_id, reason, reservation: row.cloned() })
        })
        .collect())
}

/// How one attempt of a confirm, cancel or fulfilment ended.
enum Attempt {
    /// With an outcome to report.
    Finished(TransitionOutcome),
    /// Another writer saved the order after this attempt read it.
    LostRace,
}

async fn attempt_transition(
    db: &DatabaseConnection,
    limits: &Limits,
    user: &User,
    id: Uuid,
    transition: Transition,
) -> Result<Attempt, DbErr> {
    let txn = db.begin().await?;
    let order = match limits.order_locking {
        OrderLocking::Optimistic => store::find(&txn, id).await?,
        OrderLocking::Pessimistic => {
            store::find_for_update(&txn, id, std::time::Duration::from_millis(limits.lock_timeout_ms)).await?
        }
    };
    let Some(mut order) = order.filter(|order| user.may_see(&order.user_id)) else {
        return Ok(Attempt::Finished(TransitionOutcome::NotFound));
    };
    let seen = order.version;
    let allowed = match transition {
        Transition::Confirm => order.confirm(&user.id, Utc::now()).is_ok(),
        Transition::Cancel => order.cancel().is_ok(),
        Transition::Fulfil => order.fulfil(&user.id, Utc::now()).is_ok(),
    };
    if !allowed {
        return Ok(Attempt::Finished(TransitionOutcome::NotAllowed(order)));
    }
    // The order is saved first: whoever loses the race on the order row learns
    // it here, before touching any stock.
    if !store::save(&txn, &order, seen).await? {
        return Ok(Attempt::LostRace);
    }
    match transition {
        Transition::Confirm => {}
        Transition::Cancel => store::return_stock(&txn, order.id).await?,
        Transition::Fulfil => store::ship(&txn, order.id).await?,
    }
    txn.commit().await?;
    order.version = seen + 1;
    Ok(Attempt::Finished(TransitionOutcome::Done(order)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_enters_fingerprints_as_it_always_has() {
        let address = ShippingAddress {
            name: "Alice".into(),
            line1: "1 Main St".into(),
            line2: None,
            city: "Osaka".into(),
            postal_code: "530-0001".into(),
            country: "JP".into(),
        };
        assert_eq!(
            fingerprinted(&address).legacy,
            r#"ShippingAddress { name: "Alice", line1: "1 Main St", line2: None, city: "Osaka", postal_code: "530-0001", country: "JP" }"#
        );
        let with_line2 = ShippingAddress { line2: Some("Floor \"2\"".into()), ..address.clone() };
        assert_eq!(fingerprinted(&with_line2).legacy, format!("{with_line2:?}"), "as Debug wrote it");
        let extra = fingerprinted(&address);
        let Part::Record(fields) = &extra.fields[0].1 else { panic!("a record") };
        let names: Vec<&str> = fields.iter().map(|(name, _)| *name).collect();
        assert_eq!(names, ["name", "line1", "line2", "city", "postalCode", "country"]);
    }
}
