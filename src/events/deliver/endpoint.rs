//! One endpoint's task: while this process holds the endpoint's lease, a
//! step at a time, it takes the endpoint's deliveries in order
//! (`outbox::step`), sends each due one ([`super::send`]) after the one
//! before it was answered 2xx, and records a failure with the next attempt
//! on the retry schedule, or FAILED when the schedule is spent.

use std::time::Duration;

use chrono::Utc;
use rand::RngExt as _;
use sea_orm::{DatabaseConnection, DbErr};
use tokio::{sync::watch, time::Instant};
use uuid::Uuid;

use super::{
    Delivering,
    send::{Attempt, Client, send},
};
use crate::events::{
    DeliveryStatus,
    outbox::step::{self, Delivered, Failure},
};

/// Serves one endpoint while this process holds its lease.
pub(super) async fn serve(
    db: &DatabaseConnection,
    me: Uuid,
    endpoint_id: Uuid,
    delivering: &Delivering,
    mut stop: watch::Receiver<bool>,
) {
    let mut task = Task { db, me, endpoint_id, delivering, client: Client::default(), delivered: Vec::new() };
    loop {
        if *stop.borrow() {
            break;
        }
        let pause = match task.step().await {
            Ok(Step::Held(pause)) => pause,
            Ok(Step::Lost) => break,
            Err(err) => {
                tracing::warn!(error = %err, endpoint = %endpoint_id, "a webhook delivery step failed; trying again");
                delivering.poll
            }
        };
        if !pause.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.changed() => break,
            }
        }
    }
    task.flush().await;
}

/// What one step came to.
enum Step {
    /// Still this process's endpoint; wait this long before the next step.
    Held(Duration),
    /// The lease is gone (expired and taken, or the endpoint deactivated or deleted).
    Lost,
}

/// One endpoint's task.
struct Task<'a> {
    db: &'a DatabaseConnection,
    me: Uuid,
    endpoint_id: Uuid,
    delivering: &'a Delivering,
    client: Client,
    delivered: Vec<Delivered>,
}

impl Task<'_> {
    /// Records the deliveries sent, renews the lease and takes the
    /// endpoint's current deliveries (cutting the next ones from the outbox
    /// when none is pending) in one statement, then attempts them in order
    /// while they are due and answered 2xx: one that fails is recorded, and
    /// the ones after it wait for it (the endpoint's order).
    async fn step(&mut self) -> Result<Step, DbErr> {
        let delivering = self.delivering;
        let taken = step::next(self.db, self.me, self.endpoint_id, delivering.lease, &self.delivered).await?;
        self.delivered.clear();
        let Some((endpoint, deliveries)) = taken else { return Ok(Step::Lost) };
        if deliveries.is_empty() {
            return Ok(Step::Held(delivering.poll));
        }
        let started = Instant::now();
        for delivery in deliveries {
            let Some(body) = &delivery.body else {
                if !self.delivered.is_empty() {
                    break;
                }
                let wait = (delivery.next_attempt_at - Utc::now()).to_std().unwrap_or_default();
                return Ok(Step::Held(wait.min(delivering.poll.max(Duration::from_secs(1)))));
            };
            // The lease is renewed only by the statement: the rest of the
            // batch waits for the next one rather than outlast it.
            if !self.delivered.is_empty() && started.elapsed() > delivering.lease / 4 {
                break;
            }
            let outcome = send(&mut self.client, &endpoint, delivery.id, body, delivering).await;
            match (&outcome.error, outcome.status) {
                (None, Some(status)) => {
                    self.delivered.push(Delivered { id: delivery.id, attempts: delivery.attempts, status });
                }
                _ => {
                    record_failure(self.db, delivery.id, delivery.attempts, &outcome, delivering).await?;
                    break;
                }
            }
        }
        Ok(Step::Held(Duration::ZERO))
    }

    /// Records the deliveries sent, if the task stops before its next step.
    async fn flush(&mut self) {
        let delivered = std::mem::take(&mut self.delivered);
        if delivered.is_empty() {
            return;
        }
        if let Err(err) = step::record_delivered(self.db, &delivered).await {
            tracing::warn!(error = %err, deliveries = delivered.len(), "delivered webhooks could not be recorded; they will be sent again");
        }
    }
}

/// Records the failed attempt after `made_before` others of delivery
/// `id`: the next attempt after the schedule's next wait (with jitter), or
/// FAILED when the schedule is spent, which also turns the endpoint off
/// ([`step::record_failure`]).
async fn record_failure(
    db: &DatabaseConnection,
    id: Uuid,
    made_before: i32,
    attempt: &Attempt,
    delivering: &Delivering,
) -> Result<(), DbErr> {
    let attempts = made_before + 1;
    let wait = usize::try_from(made_before).ok().and_then(|i| delivering.schedule.get(i)).copied();
    let (status, retry_in) = match wait {
        Some(wait) => (DeliveryStatus::Pending, wait.mul_f64(rand::rng().random_range(0.8..1.2))),
        None => (DeliveryStatus::Failed, Duration::ZERO),
    };
    let (response_status, error) = (attempt.status, attempt.error.clone());
    step::record_failure(db, Failure { id, attempts, status, retry_in, response_status, error }).await?;
    if status == DeliveryStatus::Failed {
        tracing::warn!(delivery = %id, attempts, "a webhook delivery spent its schedule: FAILED, endpoint off");
    }
    Ok(())
}
