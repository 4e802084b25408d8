//! The composition root: the one module that knows every feature's runtime
//! parts and wires them together. It builds each feature's service (the
//! reservations' with its coalescer) and the live feeds of inventories and
//! orders (each from its feature's source) once per process, hands them to
//! the schema as data, starts the background work (the sweeper, the
//! ledger's partitions ahead, the live listener), and makes each request's
//! DataLoaders.
//! Features never import it, and the shared state (`app.rs`) knows no feature.

use std::{sync::Arc, time::Duration};

use async_graphql::Request;
use tokio::{
    sync::{Semaphore, watch},
    task::JoinHandle,
};

use crate::{
    adjustments::service::AdjustmentService,
    app::AppState,
    context::{AsOf, Loaders},
    documents::Bounds,
    events::{self, deliver::Delivering},
    gateway::{Fairness, Gateway, Setup},
    inventory::{self, InventoryRow, service::InventoryService},
    kits::service::KitService,
    live::{Feed, Live},
    locations::service::LocationService,
    orders::{self, domain::Order, returns::service::ReturnService, service::OrderService},
    reservations::{
        service::{self as reservation_service, ReservationService},
        sweeper,
    },
    schema::{self, AppSchema, Services},
    stock::partitions,
    waitlists::service::WaitlistService,
    webhooks::service::WebhookService,
};

/// One server process's parts: the shared state and each feature's runtime state.
#[derive(Clone)]
pub struct Server {
    /// The state every request shares.
    state: AppState,
    /// Each feature's service, with the coalescer of hot items.
    services: Services,
    /// The listener of every live feed.
    live: Live,
    /// Committed inventory changes, for `inventoryChanged`.
    inventories: Feed<InventoryRow>,
    /// Committed order changes, for `orderChanged`.
    orders: Feed<Order>,
    /// One permit per GraphQL operation in flight in this process (the
    /// gateway takes them, HTTP and websocket alike).
    in_flight: Arc<Semaphore>,
}

impl Server {
    /// The parts of a process serving `state`.
    pub fn new(state: AppState) -> Self {
        let coalescer = reservation_service::coalescer(&state);
        let services = Services {
            inventory: InventoryService::new(&state),
            reservations: ReservationService::new(&state, coalescer.clone()),
            kits: KitService::new(&state, coalescer),
            waitlists: WaitlistService::new(&state),
            orders: OrderService::new(&state),
            returns: ReturnService::new(&state),
            adjustments: AdjustmentService::new(&state),
            locations: LocationService::new(&state),
            webhooks: WebhookService::new(&state),
        };
        let in_flight = Arc::new(Semaphore::new(state.limits.max_in_flight.max(1)));
        let mut live = Live::default();
        let inventories = live.feed(inventory::store::live_source());
        let orders = live.feed(orders::store::live_source());
        Self { state, services, live, inventories, orders, in_flight }
    }

    /// The permits of the in-flight limit.
    pub(crate) fn in_flight(&self) -> Arc<Semaphore> {
        self.in_flight.clone()
    }

    /// How many operations hold a permit now: those running, including any
    /// whose client hung up while the work goes on.
    pub fn operations_in_flight(&self) -> usize {
        self.state.limits.max_in_flight.max(1) - self.in_flight.available_permits()
    }

    /// The shared state.
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// The schema this process serves, with every feature's runtime state as data.
    pub fn schema(&self) -> AppSchema {
        schema::build(self.state.clone(), |schema| {
            let Services {
                inventory,
                reservations,
                kits,
                waitlists,
                orders,
                returns,
                adjustments,
                locations,
                webhooks,
            } = self.services.clone();
            schema
                .data(inventory)
                .data(locations)
                .data(reservations)
                .data(kits)
                .data(waitlists)
                .data(orders)
                .data(returns)
                .data(adjustments)
                .data(webhooks)
                .data(self.inventories.clone())
                .data(self.orders.clone())
        })
    }

    /// The gateway every operation of this process enters through, over
    /// its schemas, its limits and its per-request DataLoaders.
    pub(crate) fn gateway(&self) -> Gateway {
        let limits = &self.state.limits;
        let schema = self.schema();
        let state = self.state.clone();
        Gateway::new(Setup {
            sdl: schema::sdl_of(&schema),
            schema: Arc::new(schema),
            introspection: Arc::new(schema::build_for_introspection(self.state.clone())),
            bounds: Bounds { max_tokens: limits.max_tokens, max_selections: limits.max_complexity },
            in_flight: self.in_flight(),
            fairness: Fairness::of(
                limits,
                self.state.db.get_postgres_connection_pool().options().get_max_connections() as usize,
            ),
            request_data: Arc::new(move |request| request_data(&state, request)),
        })
    }

    /// Starts the background work of a server process: the sweeper, the
    /// ledger's partitions ahead, the event pump, the webhook deliveries and
    /// the live listener.
    pub fn spawn_workers(&self) -> Workers {
        let (stop, stopped) = watch::channel(false);
        let limits = &self.state.limits;
        let sweeper = sweeper::spawn(
            self.state.db.clone(),
            Duration::from_millis(limits.sweep_interval_ms),
            limits.sweep_batch,
            stopped.clone(),
        );
        let partitions = partitions::spawn(self.state.db.clone(), stopped.clone());
        let delivering = Delivering {
            lease: Duration::from_secs(limits.webhook_lease_secs),
            timeout: Duration::from_millis(limits.webhook_timeout_ms),
            schedule: limits
                .webhook_retry_schedule
                .iter()
                .map(|&secs| Duration::from_secs_f64(secs.max(0.0)))
                .collect(),
            allow_loopback: limits.webhook_allow_loopback,
            poll: Duration::from_millis(limits.event_poll_ms),
        };
        let events = events::spawn(self.state.db.clone(), delivering, stopped.clone());
        let listener = self.live.spawn_listener(self.state.db.clone(), stopped);
        Workers { stop, tasks: vec![sweeper, partitions, events, listener] }
    }
}

/// `request` with its own DataLoaders over `state`'s pool, so nothing is
/// cached past it, and the instant it is answered as of. The transport
/// adds the caller.
pub fn request_data(state: &AppState, request: Request) -> Request {
    request.data(Loaders::new(state.db.clone())).data(AsOf(chrono::Utc::now()))
}

/// The background tasks of a server process.
pub struct Workers {
    /// Turns true to ask the tasks to stop between steps.
    stop: watch::Sender<bool>,
    /// The tasks, awaited on shutdown.
    tasks: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Asks every task to stop and waits until they have.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}
