//! What an operation costs, and the budget it is paid from: every response
//! carries `extensions.cost` (docs/operations.md, "Fair share").
//!
//! - **Requested** is the complexity async-graphql measures while it
//!   validates the document, before anything runs: one point per field, a
//!   connection's fields counted `first` times (`pagination::page_cost`).
//!   [`charge`] takes it from the caller's bucket right there, or refuses
//!   the operation with `THROTTLED` and `retryAfterMs`.
//! - **Actual** is one point per field really resolved, counted in the
//!   response's data when the operation ends (every key of every object
//!   but `__typename`), so a page that returned 3 of 100
//!   rows costs its 3 rows. What the operation took and did not use goes
//!   back into the bucket then; it never pays more than it requested.
//!
//! Counting in the data, not in a per-field resolve hook, keeps the meter
//! off the path of every field: an extension's hook is a boxed future for
//! each field resolved (bench/results/decisions.md, "Fair share, the second
//! pass").
//!
//! A subscription pays its requested cost once, when it starts; each of its
//! events reports what that event resolved.

use std::{
    sync::{
        Arc, LazyLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use async_graphql::{Name, Response, ServerError, Value};
use rand::RngExt as _;
use tokio::sync::Semaphore;

use super::{
    accounts::{Account, Accounts, Share, Status, Tier, Turn},
    callers::Caller,
};
use crate::{config::Limits, error::ErrorCode};

/// The fair-share settings, from `limits`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fairness {
    /// Customers' and anonymous callers' buckets.
    pub customer: Tier,
    /// Operators' buckets.
    pub operator: Tier,
    /// Most buckets kept at once.
    pub max_buckets: usize,
    /// Most operations one caller may have in flight.
    pub per_caller: usize,
    /// Operations of one caller that may always run at once.
    pub running_per_caller: usize,
    /// Turns any caller whose bucket is not being drained may borrow past
    /// its own: the pool's connections beyond the live listener's one and
    /// twice a caller's own turns, so that however many one caller
    /// borrows, as many connections as its own turns are left to others.
    pub spare_turns: usize,
    /// How long an operation waits for its turn before it is refused with
    /// `THROTTLED`.
    pub turn_wait: Duration,
}

impl Fairness {
    /// The settings of `limits` for a pool of `pool_size` connections.
    pub(crate) fn of(limits: &Limits, pool_size: usize) -> Self {
        Self {
            customer: Tier { size: limits.bucket_size, rate: limits.bucket_restore_rate },
            operator: Tier { size: limits.operator_bucket_size, rate: limits.operator_bucket_restore_rate },
            max_buckets: limits.max_buckets,
            per_caller: limits.max_in_flight_per_caller,
            running_per_caller: limits.max_running_per_caller,
            spare_turns: pool_size.saturating_sub(1 + 2 * limits.max_running_per_caller),
            turn_wait: Duration::from_millis(limits.max_turn_wait_ms),
        }
    }
}

/// Every caller's budget and in-flight share in this process.
pub(super) struct Fair {
    accounts: Accounts,
    /// Most operations one caller may have in flight.
    per_caller: usize,
    /// Most operations of one caller running at once.
    running: usize,
    /// The longest an operation waits for its turn.
    turn_wait: Duration,
    /// Turns a caller whose bucket is not being drained may borrow.
    spare: Arc<Semaphore>,
    customer: Tier,
    operator: Tier,
}

impl Fair {
    /// Budgets and shares by `fairness`.
    pub(super) fn new(fairness: Fairness) -> Self {
        Self {
            accounts: Accounts::new(fairness.max_buckets, fairness.running_per_caller),
            per_caller: fairness.per_caller.max(1),
            running: fairness.running_per_caller.max(1),
            turn_wait: fairness.turn_wait,
            spare: Arc::new(Semaphore::new(fairness.spare_turns)),
            customer: fairness.customer,
            operator: fairness.operator,
        }
    }

    /// `caller`'s account, looked up once per request.
    pub(super) fn visitor(&self, caller: &Caller) -> Visitor {
        let tier = if caller.is_operator() { self.operator } else { self.customer };
        Visitor { account: self.accounts.account(&caller.key(), tier, Instant::now()), tier }
    }

    /// Whether `visitor`'s caller is turned away before anything of its
    /// request is read, and for how long: it is known to be short of
    /// budget (`true`), or it holds its whole in-flight share (`false`).
    pub(super) fn turned_away(&self, visitor: &Visitor) -> Option<(bool, Duration)> {
        if let Some(wait) = visitor.account.short_for(Instant::now()) {
            crate::telemetry::throttled("known_short");
            return Some((true, wait));
        }
        if Share::is_full(&visitor.account, self.per_caller) {
            crate::telemetry::throttled("in_flight");
            return Some((false, SHARE_RETRY));
        }
        None
    }

    /// The meter of one operation of `visitor`'s caller.
    pub(super) fn meter(&self, visitor: &Visitor) -> Arc<Meter> {
        Arc::new(Meter {
            account: visitor.account.clone(),
            tier: visitor.tier,
            turn_wait: self.turn_wait,
            spare: self.spare.clone(),
            requested: AtomicUsize::new(0),
            charged: AtomicUsize::new(0),
        })
    }

    /// A place in the share of `meter`'s caller, or none when it holds its
    /// whole share.
    pub(super) fn share(&self, meter: &Meter) -> Option<Share> {
        Share::take(&meter.account, self.per_caller, self.running)
    }
}

/// When a caller past its in-flight share is told to retry: its own
/// operations end in about this time, and it is the same second
/// `OVERLOADED` gives.
pub(super) const SHARE_RETRY: Duration = Duration::from_secs(1);

/// A caller's account as one request found it, before its body is read.
pub(super) struct Visitor {
    account: Arc<Account>,
    tier: Tier,
}

impl Visitor {
    /// Puts the cost of a request refused before it was measured into
    /// `response`: nothing requested, nothing resolved, the bucket as it is.
    pub(super) fn unmeasured(&self, response: &mut Response) {
        let status = self.account.status(self.tier, Instant::now());
        response.extensions.insert("cost".to_owned(), report(0, 0, status));
    }
}

/// One operation's cost: what it requested and took. In the request's
/// data, where validation finds it (see [`charge`]).
pub(super) struct Meter {
    /// The caller's bucket and in-flight count.
    account: Arc<Account>,
    tier: Tier,
    /// The longest the operation waits for its turn.
    turn_wait: Duration,
    /// The process's spare turns.
    spare: Arc<Semaphore>,
    /// The complexity measured in validation (0 until then).
    requested: AtomicUsize,
    /// What was taken from the bucket and not settled yet.
    charged: AtomicUsize,
}

impl Meter {
    /// Takes `requested` from the bucket, or says how long until it is there.
    fn charge(&self, requested: usize) -> Result<(), Duration> {
        self.requested.store(requested, Ordering::Relaxed);
        let cost = requested as f64;
        self.account.take(self.tier, cost, Instant::now())?;
        self.charged.store(requested, Ordering::Relaxed);
        Ok(())
    }

    /// The operation ended: what it took and did not use goes back, and
    /// `response` gets its `extensions.cost`.
    pub(super) fn settle(&self, response: &mut Response) {
        let charged = self.charged.swap(0, Ordering::Relaxed);
        let actual = resolved(&response.data);
        let unused = charged.saturating_sub(actual) as f64;
        let status = self.account.give_back(self.tier, unused, Instant::now());
        self.report(response, actual, status);
    }

    /// One event of a subscription: what it resolved, with the bucket now.
    pub(super) fn event(&self, response: &mut Response) {
        let actual = resolved(&response.data);
        let status = self.account.status(self.tier, Instant::now());
        self.report(response, actual, status);
    }

    /// Puts `extensions.cost` into `response`.
    fn report(&self, response: &mut Response, actual: usize, status: Status) {
        response.extensions.insert("cost".to_owned(), report(self.requested.load(Ordering::Relaxed), actual, status));
    }

    /// Waits for a turn among the operations of this meter's caller (or a
    /// spare one, unless it spends faster than it refills), or none when
    /// it did not come within the turn's bound: the caller's own
    /// operations held its share of the pool all that time.
    pub(super) async fn turn(&self) -> Option<Turn> {
        let spare = (!self.spending()).then_some(&self.spare);
        tokio::time::timeout(self.turn_wait, self.account.turn(spare)).await.ok()
    }

    /// How long the caller is still known to be short of budget, if it is.
    pub(super) fn short_for(&self) -> Option<Duration> {
        self.account.short_for(Instant::now())
    }

    /// Whether the caller spends its budget faster than it refills.
    pub(super) fn spending(&self) -> bool {
        self.account.spending(self.tier, Instant::now())
    }

    /// The cost of an operation refused before it was measured: nothing
    /// requested, nothing resolved, the bucket as it is.
    pub(super) fn unmeasured(&self, response: &mut Response) {
        let status = self.account.status(self.tier, Instant::now());
        self.report(response, 0, status);
    }
}

/// The fields resolved into `data`: a point for each key of each object
/// but `__typename`, which async-graphql answers without resolving.
fn resolved(data: &Value) -> usize {
    match data {
        Value::Object(fields) => {
            fields.iter().map(|(name, value)| usize::from(name.as_str() != "__typename") + resolved(value)).sum()
        }
        Value::List(items) => items.iter().map(resolved).sum(),
        _ => 0,
    }
}

/// `extensions.cost` as the contract names it (docs/api.md, "Fair share").
fn report(requested: usize, actual: usize, status: Status) -> Value {
    // The shape is made once and its values put in by position: this is in
    // every response, and a clone copies each key's hash where building the
    // maps anew hashed every key again.
    static SHAPE: LazyLock<Value> = LazyLock::new(|| {
        let object = |names: [&str; 3], values: [Value; 3]| {
            Value::Object(names.into_iter().map(Name::new).zip(values).collect())
        };
        let throttle = object(["maximumAvailable", "currentlyAvailable", "restoreRate"], Default::default());
        object(["requestedQueryCost", "actualQueryCost", "throttleStatus"], [Value::Null, Value::Null, throttle])
    });
    // Two decimals: a bucket refills continuously, and more digits are noise.
    let float = |x: f64| Value::from((x * 100.0).floor() / 100.0);
    let mut cost = SHAPE.clone();
    if let Value::Object(fields) = &mut cost {
        fields[0] = Value::from(requested as u64);
        fields[1] = Value::from(actual as u64);
        if let Value::Object(throttle) = &mut fields[2] {
            throttle[0] = float(status.maximum);
            throttle[1] = float(status.available);
            throttle[2] = float(status.rate);
        }
    }
    cost
}

/// The `THROTTLED` error: the caller's budget (or share) does not cover the
/// operation now; `retryAfterMs` says when it will, lengthened by up to a
/// quarter at random, so that the many connections of one caller refused
/// at once do not all come back in the same instant (each is validated
/// before its bucket can refuse it again).
pub(super) fn throttled(message: &str, retry_after: Duration) -> ServerError {
    let retry_after = retry_after.mul_f64(rand::rng().random_range(1.0..1.25));
    let mut error = ServerError::new(message, None);
    let extensions = error.extensions.get_or_insert_with(Default::default);
    extensions.set("code", ErrorCode::Throttled);
    extensions.set("retryable", true);
    extensions.set("retryAfterMs", u64::try_from(retry_after.as_millis().max(1)).unwrap_or(u64::MAX));
    error
}

/// Pays an operation's requested `complexity` from its caller's bucket, or
/// refuses it with `THROTTLED`. `ErrorCodes` calls it at the end of
/// validation, so only documents that every other check let through are
/// charged; a schema run without the gateway has no meter, and its
/// responses carry no cost. (Not an extension of its own: each extension
/// is a boxed future on every field resolved.)
pub(super) fn charge(meter: Option<&Arc<Meter>>, complexity: usize) -> Result<(), ServerError> {
    let Some(meter) = meter else { return Ok(()) };
    meter.charge(complexity).map_err(|wait| {
        crate::telemetry::throttled("cost");
        let message = format!(
            "this operation costs {complexity} points and your budget holds fewer now; retry after retryAfterMs"
        );
        throttled(&message, wait)
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// A key of an object is a field; an item of a list is not; `__typename` is free.
    #[test]
    fn actual_cost_counts_the_fields_in_the_data() {
        let data = Value::from_json(serde_json::json!({
            "inventories": { "__typename": "InventoryConnection", "nodes": [
                { "id": "1", "sku": "A", "stock": { "available": 1 } },
                { "id": "2", "sku": "B", "stock": null },
            ] }
        }))
        .expect("a value");
        // inventories, nodes, 2 × (id, sku, stock) and one available.
        assert_eq!(resolved(&data), 1 + 1 + 2 * 3 + 1);
        assert_eq!(resolved(&Value::Null), 0);
    }

    /// The names, their order and two decimals, as docs/api.md shows them.
    #[test]
    fn the_cost_reads_as_the_contract_names_it() {
        let status = Status { maximum: 1000.0, available: 987.654, rate: 50.0 };
        assert_eq!(
            serde_json::to_string(&report(12, 3, status)).expect("text"),
            r#"{"requestedQueryCost":12,"actualQueryCost":3,"throttleStatus":{"maximumAvailable":1000.0,"currentlyAvailable":987.65,"restoreRate":50.0}}"#
        );
    }

    /// Connections refused together are told to come back at different
    /// instants, none before the budget covers them.
    #[test]
    fn retry_after_is_spread_and_never_early() {
        let wait = Duration::from_millis(2_000);
        let told: BTreeSet<u64> = (0..50)
            .map(|_| {
                let error = throttled("no", wait);
                let extensions = error.extensions.expect("extensions");
                match extensions.get("retryAfterMs") {
                    Some(Value::Number(ms)) => ms.as_u64().expect("whole milliseconds"),
                    other => panic!("retryAfterMs: {other:?}"),
                }
            })
            .collect();
        assert!(told.len() > 10, "spread: {told:?}");
        assert!(told.iter().all(|ms| (2_000..2_500).contains(ms)), "{told:?}");
    }
}
