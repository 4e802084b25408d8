//! The waiting list use cases: joining (only what cannot be reserved now,
//! one open entry per customer and inventory, idempotent by key), leaving,
//! and the reads. The SQL runs in `store.rs`; the hand-off of freed units
//! is the database's (`mod.rs`).

use sea_orm::DatabaseConnection;
use uuid::Uuid;

use super::store::{self, EntryRow, Item, Join};
use crate::{app::AppState, db::Collisions, error::AppError};

/// The waiting lists as the resolvers see them.
#[derive(Clone)]
pub(crate) struct WaitlistService {
    db: DatabaseConnection,
    collisions: Collisions,
    /// How long an offer is held for its customer (STOCKGUARD_WAITLIST_OFFER_SECS).
    offer_secs: i32,
}

/// What a customer asks to wait for.
#[derive(Debug, Clone)]
pub(crate) struct JoinRequest {
    pub item: Item,
    pub quantity: i32,
    /// Only units freed at these locations; all when none.
    pub location_ids: Option<Vec<Uuid>>,
    pub idempotency_key: Option<String>,
}

impl JoinRequest {
    /// What a replay with the same key must ask for again.
    fn fingerprint(&self) -> String {
        let mut locations = self.location_ids.clone().unwrap_or_default();
        locations.sort();
        let item = match self.item {
            Item::Inventory(id) => format!("inventory:{id}"),
            Item::Kit(id) => format!("kit:{id}"),
        };
        format!("join:{item}:{}:{locations:?}", self.quantity)
    }
}

/// How a join ended.
#[derive(Debug)]
pub(crate) enum JoinOutcome {
    /// In line: a new entry, the caller's open one, or a replay of the key.
    Joined(EntryRow),
    /// The quantity can be reserved now; nothing written.
    NotSoldOut { available: i64 },
    /// No such inventory.
    InventoryNotFound,
    /// No such kit, or not on sale.
    KitNotFound,
}

impl WaitlistService {
    pub(crate) fn new(state: &AppState) -> Self {
        Self {
            db: state.db.clone(),
            collisions: state.collisions.clone(),
            offer_secs: state.limits.waitlist_offer_secs,
        }
    }

    /// Puts `user` in line for `request`.
    pub(crate) async fn join(&self, user: &str, request: &JoinRequest) -> Result<JoinOutcome, AppError> {
        let fingerprint = request.fingerprint();
        if let Some(key) = &request.idempotency_key
            && let Some(entry) = store::find_by_key(&self.db, user, key).await?
        {
            return replay(entry, &fingerprint);
        }
        if let Some(ids) = &request.location_ids {
            let mut distinct = ids.clone();
            distinct.sort();
            distinct.dedup();
            if store::active_locations(&self.db, &distinct).await? != distinct.len() {
                return Err(AppError::bad_input("input.locationIds", "every location must exist and be active"));
            }
        }
        let join = Join {
            id: Uuid::now_v7(),
            item: request.item,
            user_id: user.to_owned(),
            quantity: request.quantity,
            location_ids: request.location_ids.clone(),
            offer_secs: self.offer_secs,
            idempotency_key: request.idempotency_key.clone(),
            fingerprint: fingerprint.clone(),
        };
        // Twice at most: a join that lost a race to the caller's own other
        // join (or another with its key) finds that entry the second time.
        for _ in 0..2 {
            let run = || store::join(&self.db, &join);
            let key = match join.item {
                Item::Inventory(id) | Item::Kit(id) => id,
            };
            let judged = self.collisions.run(key, run).await?.done()?;
            if !judged.found {
                return Ok(match join.item {
                    Item::Inventory(_) => JoinOutcome::InventoryNotFound,
                    Item::Kit(_) => JoinOutcome::KitNotFound,
                });
            }
            if judged.joined {
                let entry = store::find(&self.db, join.id).await?;
                return entry.map(JoinOutcome::Joined).ok_or_else(|| missing("a joined entry"));
            }
            if judged.sellable >= i64::from(request.quantity) {
                return Ok(JoinOutcome::NotSoldOut { available: judged.sellable });
            }
            if let Some(key) = &request.idempotency_key
                && let Some(entry) = store::find_by_key(&self.db, user, key).await?
            {
                return replay(entry, &fingerprint);
            }
            if let Some(entry) = store::find_open(&self.db, request.item, user).await? {
                return Ok(JoinOutcome::Joined(entry));
            }
        }
        Err(AppError::DatabaseUnavailable)
    }

    /// Takes `owner`'s entry out of the line; none when it is not theirs.
    pub(crate) async fn leave(&self, owner: &str, id: Uuid) -> Result<Option<EntryRow>, AppError> {
        Ok(store::leave(&self.db, &self.collisions, id, owner).await?.done()?)
    }

    /// One entry.
    pub(crate) async fn find(&self, id: Uuid) -> Result<Option<EntryRow>, AppError> {
        Ok(store::find(&self.db, id).await?)
    }

    /// A page of `user`'s entries, newest first.
    pub(crate) async fn mine(&self, user: &str, first: u64, before: Option<i64>) -> Result<Vec<EntryRow>, AppError> {
        Ok(store::mine(&self.db, user, first, before).await?)
    }

    /// A page of an item's line in offer order.
    pub(crate) async fn line(&self, item: Item, first: u64, after: Option<i64>) -> Result<Vec<EntryRow>, AppError> {
        Ok(store::line(&self.db, item, first, after).await?)
    }
}

/// The entry a key made, when the request is the same as the one that made it.
fn replay(entry: EntryRow, fingerprint: &str) -> Result<JoinOutcome, AppError> {
    if entry.same_request(fingerprint) {
        Ok(JoinOutcome::Joined(entry))
    } else {
        Err(AppError::bad_input("input.idempotencyKey", "this idempotency key was used for another request"))
    }
}

fn missing(what: &str) -> AppError {
    AppError::internal(anyhow::anyhow!("{what} is missing"))
}
