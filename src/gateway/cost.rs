//! What an operation costs, and the budget it is paid from: every response
//! carries `extensions.cost` (docs/operations.md, "Fair share").
//!
//! - **Requested** is the complexity async-graphql measures while it
//!   validates the document, before anything runs: one point per field, a
//!   connection's fields counted `first` times (`pagination::page_cost`).
//!   The [`Metering`] extension takes it from the caller's bucket right
//!   there, or refuses the operation with `THROTTLED` and `retryAfterMs`.
//! - **Actual** is one point per field really resolved (counted by the same
//!   extension), so a page that returned 3 of 100 rows costs its 3 rows.
//!   When the operation ends, what it took and did not use goes back into
//!   the bucket; it never pays more than it requested.
//!
//! A subscription pays its requested cost once, when it starts; each of its
//! events reports what that event resolved.

use std::{
    sync::{
        Arc, OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use async_graphql::{
    Name, QueryPathSegment, Response, ServerError, ServerResult, ValidationResult, Value,
    extensions::{Extension, ExtensionContext, ExtensionFactory, NextResolve, NextValidation, ResolveInfo},
    indexmap::IndexMap,
};
use rand::RngExt as _;

use super::{
    buckets::{Buckets, Status, Tier},
    callers::{Caller, CallerKey, Shares},
};
use crate::config::Limits;

/// The fair-share settings, from `limits`.
#[derive(Debug, Clone, Copy)]
pub struct Fairness {
    /// Customers' and anonymous callers' buckets.
    pub customer: Tier,
    /// Operators' buckets.
    pub operator: Tier,
    /// Most buckets kept at once.
    pub max_buckets: usize,
    /// Most operations one caller may have in flight.
    pub per_caller: usize,
}

impl Fairness {
    /// The settings of `limits`.
    pub fn of(limits: &Limits) -> Self {
        Self {
            customer: Tier { size: limits.bucket_size, rate: limits.bucket_restore_rate },
            operator: Tier { size: limits.operator_bucket_size, rate: limits.operator_bucket_restore_rate },
            max_buckets: limits.max_buckets,
            per_caller: limits.max_in_flight_per_caller,
        }
    }
}

/// Every caller's budget and in-flight share in this process.
pub struct Fair {
    buckets: Buckets,
    /// Operations in flight per caller.
    pub shares: Arc<Shares>,
    customer: Tier,
    operator: Tier,
}

impl Fair {
    /// Budgets and shares by `fairness`.
    pub fn new(fairness: Fairness) -> Self {
        Self {
            buckets: Buckets::new(fairness.max_buckets),
            shares: Shares::new(fairness.per_caller),
            customer: fairness.customer,
            operator: fairness.operator,
        }
    }

    /// The meter of one operation by `caller`.
    pub fn meter(self: &Arc<Self>, caller: &Caller) -> Arc<Meter> {
        let tier = if caller.is_operator() { self.operator } else { self.customer };
        Arc::new(Meter {
            fair: self.clone(),
            key: caller.key(),
            tier,
            requested: AtomicUsize::new(0),
            charged: AtomicUsize::new(0),
            actual: AtomicUsize::new(0),
        })
    }
}

/// One operation's cost: what it requested, took and resolved. In the
/// request's data, where [`Metering`] finds it.
pub struct Meter {
    fair: Arc<Fair>,
    /// Whose bucket.
    pub key: CallerKey,
    tier: Tier,
    /// The complexity measured in validation (0 until then).
    requested: AtomicUsize,
    /// What was taken from the bucket and not settled yet.
    charged: AtomicUsize,
    /// Fields resolved (since the last event, for a subscription).
    actual: AtomicUsize,
}

impl Meter {
    /// Takes `requested` from the bucket, or says how long until it is there.
    fn charge(&self, requested: usize) -> Result<(), Duration> {
        self.requested.store(requested, Ordering::Relaxed);
        let cost = requested as f64;
        self.fair.buckets.take(&self.key, self.tier, cost, Instant::now())?;
        self.charged.store(requested, Ordering::Relaxed);
        Ok(())
    }

    /// The operation ended: what it took and did not use goes back, and
    /// `response` gets its `extensions.cost`.
    pub fn settle(&self, response: &mut Response) {
        let charged = self.charged.swap(0, Ordering::Relaxed);
        let actual = self.actual.swap(0, Ordering::Relaxed);
        let unused = charged.saturating_sub(actual) as f64;
        let status = self.fair.buckets.give_back(&self.key, self.tier, unused, Instant::now());
        self.report(response, actual, status);
    }

    /// One event of a subscription: what it resolved, with the bucket now.
    pub fn event(&self, response: &mut Response) {
        let actual = self.actual.swap(0, Ordering::Relaxed);
        let status = self.fair.buckets.status(&self.key, self.tier, Instant::now());
        self.report(response, actual, status);
    }

    /// Puts `extensions.cost` into `response`.
    fn report(&self, response: &mut Response, actual: usize, status: Status) {
        response.extensions.insert("cost".to_owned(), report(self.requested.load(Ordering::Relaxed), actual, status));
    }

    /// The cost of an operation refused before it was measured: nothing
    /// requested, nothing resolved, the bucket as it is.
    pub fn unmeasured(&self, response: &mut Response) {
        let status = self.fair.buckets.status(&self.key, self.tier, Instant::now());
        self.report(response, 0, status);
    }
}

/// `extensions.cost` as the contract names it (docs/api.md, "Fair share").
fn report(requested: usize, actual: usize, status: Status) -> Value {
    // Two decimals: a bucket refills continuously, and more digits are noise.
    let float = |x: f64| Value::from((x * 100.0).floor() / 100.0);
    let throttle = IndexMap::from([
        (Name::new("maximumAvailable"), float(status.maximum)),
        (Name::new("currentlyAvailable"), float(status.available)),
        (Name::new("restoreRate"), float(status.rate)),
    ]);
    Value::Object(IndexMap::from([
        (Name::new("requestedQueryCost"), Value::from(requested as u64)),
        (Name::new("actualQueryCost"), Value::from(actual as u64)),
        (Name::new("throttleStatus"), Value::Object(throttle)),
    ]))
}

/// The `THROTTLED` error: the caller's budget (or share) does not cover the
/// operation now; `retryAfterMs` says when it will, lengthened by up to a
/// quarter at random, so that the many connections of one caller refused
/// at once do not all come back in the same instant (each is validated
/// before its bucket can refuse it again).
pub fn throttled(message: &str, retry_after: Duration) -> ServerError {
    let retry_after = retry_after.mul_f64(rand::rng().random_range(1.0..1.25));
    let mut error = ServerError::new(message, None);
    let extensions = error.extensions.get_or_insert_with(Default::default);
    extensions.set("code", "THROTTLED");
    extensions.set("retryable", true);
    extensions.set("retryAfterMs", u64::try_from(retry_after.as_millis().max(1)).unwrap_or(u64::MAX));
    error
}

/// The async-graphql extension that pays an operation's requested cost
/// from its caller's bucket after validation, and counts the fields it
/// resolves. It must be the outermost extension, so it charges only
/// documents that every other check let through.
pub struct Metering;

impl ExtensionFactory for Metering {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(MeteringExtension::default())
    }
}

#[derive(Default)]
struct MeteringExtension {
    /// The operation's meter, found in its data at validation; none for a
    /// schema run without the gateway (its responses carry no cost).
    meter: OnceLock<Arc<Meter>>,
}

#[async_graphql::async_trait::async_trait]
impl Extension for MeteringExtension {
    async fn validation(
        &self,
        ctx: &ExtensionContext<'_>,
        next: NextValidation<'_>,
    ) -> Result<ValidationResult, Vec<ServerError>> {
        let result = next.run(ctx).await?;
        let Some(meter) = ctx.data_opt::<Arc<Meter>>() else { return Ok(result) };
        let meter = self.meter.get_or_init(|| meter.clone());
        if let Err(wait) = meter.charge(result.complexity) {
            crate::telemetry::throttled("cost");
            let message = format!(
                "this operation costs {} points and your budget holds fewer now; retry after retryAfterMs",
                result.complexity
            );
            return Err(vec![throttled(&message, wait)]);
        }
        Ok(result)
    }

    async fn resolve(
        &self,
        ctx: &ExtensionContext<'_>,
        info: ResolveInfo<'_>,
        next: NextResolve<'_>,
    ) -> ServerResult<Option<Value>> {
        // A field, not an item of a list (async-graphql resolves each item
        // through this hook too): one point per field, as the complexity counts.
        let field = matches!(info.path_node.segment, QueryPathSegment::Name(_));
        if let Some(meter) = self.meter.get().filter(|_| field) {
            meter.actual.fetch_add(1, Ordering::Relaxed);
        }
        next.run(ctx, info).await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

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
