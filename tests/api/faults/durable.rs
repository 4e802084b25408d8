//! A write acknowledged only once it is durable, also when the answer is a
//! replay or a refusal that reports it: on a private cluster that requires
//! a synchronous standby which never comes. A commit waiting for it is cut
//! off (its backend ended, as when a primary is killed mid-commit): its
//! client is told nothing, and the commit is done locally, visible to every
//! session and on no standby, as on a primary restarted from its own WAL.

use super::*;
use tokio::task::JoinHandle;

use crate::helpers::{address, error_code};

/// The cluster requires (`on`) or stops requiring a standby named `nobody`.
async fn require_a_standby(admin: &DatabaseConnection, on: bool) {
    let set = if on {
        "ALTER SYSTEM SET synchronous_standby_names = 'nobody'"
    } else {
        "ALTER SYSTEM RESET synchronous_standby_names"
    };
    admin.execute_unprepared(set).await.expect("ALTER SYSTEM");
    admin.execute_unprepared("SELECT pg_reload_conf()").await.expect("reload");
    let wanted = if on { "nobody" } else { "" };
    eventually(Duration::from_secs(10), "the setting is in force", || async {
        let row = admin.query_one_raw(Statement::from_string(DbBackend::Postgres, "SHOW synchronous_standby_names"));
        row.await.ok().flatten().and_then(|row| row.try_get_by_index::<String>(0).ok()).as_deref() == Some(wanted)
    })
    .await;
}

/// Ends the requests' backends waiting for the standby until `request` has
/// answered, as a primary killed while their commits waited would: each
/// commit is kept, and its client told nothing. What it answered.
async fn cut_off(admin: &DatabaseConnection, database: &str, request: JoinHandle<Value>) -> Value {
    let sql = format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
          WHERE datname = '{database}' AND wait_event = 'SyncRep' AND query NOT LIKE '%pg_logical_emit_message%'"
    );
    eventually(Duration::from_secs(20), "the request's commit is cut off", || async {
        any(admin, &sql).await;
        request.is_finished()
    })
    .await;
    request.await.expect("the request")
}

/// Whether `request` came to wait for the standby (a backend of `database`
/// waits in `SyncRep` for the durability check) without answering first:
/// an answer before that acknowledged a write no standby holds. The
/// caller stops requiring the standby before it fails the test, so that
/// nothing is left waiting for it.
async fn waits_for_the_standby(admin: &DatabaseConnection, database: &str, request: &JoinHandle<Value>) -> bool {
    let sql = format!(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = '{database}' AND wait_event = 'SyncRep' AND query LIKE '%pg_logical_emit_message%'"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !request.is_finished() && Instant::now() < deadline {
        if any(admin, &sql).await {
            return !request.is_finished();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// A server on a private cluster that requires a standby at times, and an
/// admin connection to the cluster.
struct OnACluster {
    app: Arc<TestApp>,
    /// The name of the server's database.
    database: String,
    admin: DatabaseConnection,
    /// Dropped last: the cluster stops with it.
    _cluster: PrivateCluster,
}

impl OnACluster {
    async fn start() -> Self {
        let cluster = PrivateCluster::start().await;
        let app = Arc::new(TestApp::spawn_with_options(cluster.options()).await);
        let database = app.database_url.rsplit('/').next().expect("a database name").to_owned();
        let admin = sea_orm::Database::connect(format!("{}/postgres", cluster.server_url())).await.expect("admin");
        Self { app, database, admin, _cluster: cluster }
    }

    /// Sends `first` while a standby is required, and cuts its commit off:
    /// done locally, its client told nothing. The standby stays required.
    async fn cut_off(&self, first: impl FnOnce() -> JoinHandle<Value>) -> Value {
        require_a_standby(&self.admin, true).await;
        cut_off(&self.admin, &self.database, first()).await
    }

    /// Sends `request` while a standby is required, and stops requiring it
    /// once `request` waits for it (or has answered). Its answer, and
    /// whether it waited for the standby before it answered.
    async fn waits(&self, request: impl FnOnce() -> JoinHandle<Value>) -> (Value, bool) {
        require_a_standby(&self.admin, true).await;
        let request = request();
        let waited = waits_for_the_standby(&self.admin, &self.database, &request).await;
        require_a_standby(&self.admin, false).await;
        (request.await.expect("the request"), waited)
    }

    /// Sends `request` and cuts its commit off, checks that the commit was
    /// done all the same (`committed` counts 1) and that its client learnt
    /// nothing, then sends it again: the retry's answer, and whether it
    /// waited for the standby before it answered.
    async fn cut_off_and_retried(&self, request: impl Fn() -> JoinHandle<Value>, committed: &str) -> (Value, bool) {
        let first = self.cut_off(&request).await;
        assert_eq!(self.app.count(committed).await, 1, "the first is committed: {committed}");
        assert_eq!(error_code(&first), Some("DATABASE_UNAVAILABLE"), "its client learns nothing: {first}");
        self.waits(request).await
    }

    async fn finish(self) {
        self.app.assert_invariant().await;
        self.admin.close().await.expect("close");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replayed_or_refused_write_is_answered_only_once_the_first_is_durable() {
    let on = OnACluster::start().await;
    let app = on.app.clone();
    let item = app.create_inventory("DURABLE-1", 10).await;
    let alice = app.token("alice", Role::Customer);
    let input = json!({
        "items": [{ "inventoryId": item, "quantity": 1 }],
        "shippingAddress": address("1 Main St"),
        "idempotencyKey": "durable-1",
    });
    let place = || {
        let (app, alice, input) = (app.clone(), alice.clone(), input.clone());
        tokio::spawn(async move { app.place_order(&alice, input).await })
    };

    // The first placeOrder is cut off: its commit is done locally, visible
    // to every session, on no standby. Its retry finds the key claimed: it
    // may answer only once the claim is durable.
    let placed = "SELECT count(*) FROM orders WHERE user_id = 'alice'";
    let (retry, waited) = on.cut_off_and_retried(place, placed).await;
    assert!(waited, "the replay answered before a standby held the first order: {retry}");
    assert_eq!(retry["__typename"], "OrderPlaced", "{retry}");
    let order: Uuid = retry["order"]["id"].as_str().and_then(|id| id.parse().ok()).expect("an order id");
    assert_eq!(app.count(placed).await, 1, "the retry replayed the first order");

    // A cancel cut off in the same way; its retry is refused (the order is
    // cancelled), and that refusal too waits for the standby.
    let cancel = || {
        let (app, alice) = (app.clone(), alice.clone());
        tokio::spawn(async move { app.cancel(&alice, order).await })
    };
    let cancelled = format!("SELECT count(*) FROM orders WHERE id = '{order}' AND status = 'CANCELLED'");
    let (again, waited) = on.cut_off_and_retried(cancel, &cancelled).await;
    assert!(waited, "the refusal answered before a standby held the cancel: {again}");
    assert_eq!(again["__typename"], "OrderCannotBeCancelled", "{again}");
    assert_eq!(again["order"]["status"], "CANCELLED", "{again}");
    on.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retried_change_or_release_reports_the_first_only_once_it_is_durable() {
    let on = OnACluster::start().await;
    let app = on.app.clone();
    let item = app.create_inventory("DURABLE-2", 10).await;
    let alice = app.token("alice", Role::Customer);
    let reserved = app.reserve(&alice, json!({ "inventoryId": item, "quantity": 2 })).await;
    let held: Uuid = reserved["reservation"]["id"].as_str().and_then(|id| id.parse().ok()).expect("a reservation");
    let change = || {
        let (app, alice) = (app.clone(), alice.clone());
        tokio::spawn(async move { app.change_quantity(&alice, held, 3).await })
    };
    let release = || {
        let (app, alice) = (app.clone(), alice.clone());
        tokio::spawn(async move { app.release(&alice, held).await })
    };
    let extend = || {
        let (app, alice) = (app.clone(), alice.clone());
        tokio::spawn(async move { app.extend(&alice, held, 60).await })
    };

    // A change to 3 units cut off; its retry finds the reservation at 3
    // already, and that answer waits for the standby.
    let three = format!("SELECT count(*) FROM reservations WHERE id = '{held}' AND quantity = 3");
    let (again, waited) = on.cut_off_and_retried(change, &three).await;
    assert!(waited, "the retry answered before a standby held the change: {again}");
    assert_eq!(again["__typename"], "ReservationChanged", "{again}");
    assert_eq!(again["reservation"]["quantity"], 3, "{again}");

    // A release cut off; its retry finds the reservation released.
    let released = format!("SELECT count(*) FROM reservations WHERE id = '{held}' AND status = 'RELEASED'");
    let (again, waited) = on.cut_off_and_retried(release, &released).await;
    assert!(waited, "the refusal answered before a standby held the release: {again}");
    assert_eq!(again["__typename"], "ReservationNotActive", "{again}");
    assert_eq!(again["reservation"]["status"], "RELEASED", "{again}");

    // An extension of it is refused on the release's word, and waits too.
    let (extended, waited) = on.waits(extend).await;
    assert!(waited, "the refusal answered before a standby held the release: {extended}");
    assert_eq!(extended["__typename"], "ReservationNotActive", "{extended}");
    on.finish().await;
}
