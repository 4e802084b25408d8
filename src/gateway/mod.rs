//! The one way in for a GraphQL operation, whether it came over HTTP or a
//! websocket.
//!
//! [`Gateway::admit`] gives every operation the same things: its document
//! checked within the bounds of `documents.rs` (parsed once and kept), the
//! operation picked by name, the caller, a fresh set of per-request
//! DataLoaders, the schema with the right depth bound, and a permit of the
//! in-flight limit and of its caller's share of it (`accounts.rs`). The
//! permit travels with the work ([`Admitted::execute`]) and is given back
//! only when the work really ends, even if the client went away first.
//! Subscriptions are long-lived, so they hold a place under their own caps
//! instead (see `ws.rs`).
//!
//! Every response carries `extensions.cost`, and an operation is paid from
//! its caller's bucket before it runs (`cost.rs`, `accounts.rs`).
//!
//! Every error an operation can end in carries an `extensions.code`
//! ([`ErrorCodes`]); `docs/operations.md` lists them.
//!
//! The gateway sits below the schema and the composition root: it is given
//! what it runs ([`Setup`]: the schemas as [`Run`], their SDL, the request
//! data) by `server.rs`, and imports neither, so `schema.rs` can use its
//! [`ErrorCodes`] without a cycle.

mod accounts;
mod callers;
mod codes;
mod cost;
mod persisted;
mod shapes;

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use self::{
    accounts::Share,
    cost::{Fair, Meter},
    persisted::Persisted,
    shapes::Shapes,
};
pub use self::{
    accounts::Tier,
    callers::Caller,
    codes::{ErrorCodes, code_of, coded},
    cost::Fairness,
};

use async_graphql::{
    Positioned, Request, Response, ServerError,
    parser::types::{DocumentOperations, ExecutableDocument, OperationDefinition, OperationType},
};
use futures::{FutureExt, StreamExt, future::BoxFuture, stream::BoxStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::{
    documents::{Bounds, Checked, Documents, Introspection},
    error::ErrorCode,
};

/// What runs a checked operation: a schema, seen only as what it does
/// (async-graphql's `Executor`, in a form that can be held as a value).
pub trait Run: Send + Sync + 'static {
    /// Runs a query or mutation to its response.
    fn execute(&self, request: Request) -> BoxFuture<'static, Response>;

    /// Runs any operation as a stream of responses.
    fn execute_stream(&self, request: Request) -> BoxStream<'static, Response>;
}

impl<E: async_graphql::Executor + Clone> Run for E {
    fn execute(&self, request: Request) -> BoxFuture<'static, Response> {
        let executor = self.clone();
        async move { executor.execute(request).await }.boxed()
    }

    fn execute_stream(&self, request: Request) -> BoxStream<'static, Response> {
        async_graphql::Executor::execute_stream(self, request, None)
    }
}

/// Puts a request's own data (its DataLoaders) into it.
pub type RequestData = Arc<dyn Fn(Request) -> Request + Send + Sync>;

/// What a gateway is made of, given by the composition root.
pub struct Setup {
    /// The schema with the API's depth bound.
    pub schema: Arc<dyn Run>,
    /// The same schema with the looser depth bound for introspection-only documents.
    pub introspection: Arc<dyn Run>,
    /// The schema's SDL, for variable coercion and the nulls of field errors.
    pub sdl: String,
    /// The bounds every document keeps.
    pub bounds: Bounds,
    /// One permit per operation in flight in the process.
    pub in_flight: Arc<Semaphore>,
    /// The callers' buckets and in-flight shares.
    pub fairness: Fairness,
    /// Each request's own data; the gateway adds the caller.
    pub request_data: RequestData,
}

/// When a caller past its in-flight share is told to retry: its own
/// operations end in about this time, and it is the same second
/// `OVERLOADED` gives.
const SHARE_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Admits GraphQL operations; cheap to clone, one per server.
#[derive(Clone)]
pub struct Gateway {
    /// The schema with the API's depth bound.
    schema: Arc<dyn Run>,
    /// The same schema with the looser depth bound for introspection-only documents.
    introspection: Arc<dyn Run>,
    /// Checked documents of recent queries.
    documents: Documents,
    /// Queries registered by hash (automatic persisted queries).
    persisted: Persisted,
    /// The schema's types, for variable coercion and the nulls of field errors.
    shapes: Arc<Shapes>,
    /// One permit per operation in flight.
    in_flight: Arc<Semaphore>,
    /// The callers' buckets and in-flight shares.
    fair: Arc<Fair>,
    /// Each request's own data.
    request_data: RequestData,
}

/// Why an operation was not run.
#[derive(Debug)]
pub enum Refusal {
    /// The in-flight limit is reached; the client may retry.
    Overloaded,
    /// The caller holds its whole share of the in-flight limit; it may
    /// retry once one of its operations ended.
    Throttled,
    /// The document, or the choice of operation, is refused; nothing ran.
    Request(ServerError),
}

impl Refusal {
    /// An operation that failed inside the server (its cause was logged).
    pub fn internal() -> Self {
        Self::Request(coded(ServerError::new("internal error", None), ErrorCode::Internal))
    }

    /// The `extensions.code` of this refusal.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Overloaded => ErrorCode::Overloaded,
            Self::Throttled => ErrorCode::Throttled,
            Self::Request(error) => code_of(error).unwrap_or(ErrorCode::GraphqlValidationFailed),
        }
    }

    /// The refusal as a GraphQL response.
    pub fn into_response(self) -> Response {
        match self {
            Self::Overloaded => {
                let mut error = ServerError::new("the server is at its limit of requests in flight, try again", None);
                let extensions = error.extensions.get_or_insert_with(Default::default);
                extensions.set("code", ErrorCode::Overloaded);
                extensions.set("retryable", true);
                Response::from_errors(vec![error])
            }
            Self::Throttled => {
                let message = "you have as many operations in flight as one caller may; retry when one has ended";
                Response::from_errors(vec![cost::throttled(message, SHARE_RETRY)])
            }
            Self::Request(error) => Response::from_errors(vec![error]),
        }
    }
}

impl Gateway {
    /// A gateway made of `setup`.
    pub fn new(setup: Setup) -> Self {
        Self {
            shapes: Arc::new(Shapes::from_sdl(&setup.sdl)),
            introspection: setup.introspection,
            schema: setup.schema,
            documents: Documents::new(setup.bounds),
            persisted: Persisted::default(),
            in_flight: setup.in_flight,
            fair: Arc::new(Fair::new(setup.fairness)),
            request_data: setup.request_data,
        }
    }

    /// Checks `request`'s document and picks its operation, without taking
    /// a permit: what an operation is must be known before it is admitted
    /// (a transport may refuse some kinds, a subscription takes no permit).
    pub fn prepare(&self, mut request: Request, caller: &Caller) -> Result<Prepared, Refusal> {
        let to_keep = self.persisted.resolve(&mut request).map_err(Refusal::Request)?;
        if request.query.trim().is_empty() {
            let error = ServerError::new("the request is not a GraphQL request: it has no query", None);
            return Err(Refusal::Request(coded(error, ErrorCode::BadRequest)));
        }
        let checked = self.documents.check(&request.query).map_err(|r| Refusal::Request(r.into_server_error()))?;
        if let Some(to_keep) = to_keep {
            self.persisted.keep(to_keep, &request.query);
        }
        let selected = operation(&checked.document, request.operation_name.as_deref()).map_err(Refusal::Request)?;
        self.shapes.coerce(&selected.node.variable_definitions, &request.variables).map_err(Refusal::Request)?;
        let kind = selected.node.ty;
        let schema = match checked.introspection {
            Introspection::Only => self.introspection.clone(),
            Introspection::No => self.schema.clone(),
        };
        request.set_parsed_query(checked.document.clone());
        let meter = self.fair.meter(caller);
        let completion = Completion {
            checked,
            operation_name: request.operation_name.clone(),
            kind,
            shapes: self.shapes.clone(),
            meter: meter.clone(),
        };
        // Each operation gets its own DataLoaders, so nothing is cached past it.
        let request = (self.request_data)(request.data(caller.viewer.clone()).data(meter).data(kind));
        Ok(Prepared { request, schema, completion, in_flight: self.in_flight.clone(), fair: self.fair.clone() })
    }

    /// Checks `request` and takes a permit for it: everything an operation
    /// gets before it runs, whichever transport brought it.
    pub fn admit(&self, request: Request, caller: &Caller) -> Result<Admitted, Refusal> {
        self.prepare(request, caller)?.admit()
    }

    /// `refusal` as a response, with the caller's `extensions.cost`
    /// (nothing requested, nothing resolved: it never ran).
    pub fn refused(&self, refusal: Refusal, caller: &Caller) -> Response {
        let mut response = refusal.into_response();
        self.fair.meter(caller).unmeasured(&mut response);
        response
    }
}

/// What is done to every response of an operation before it leaves: the
/// spec's nulls for field errors (see `shapes.rs`).
struct Completion {
    checked: Arc<Checked>,
    operation_name: Option<String>,
    kind: OperationType,
    shapes: Arc<Shapes>,
    /// The operation's cost, settled into each response.
    meter: Arc<Meter>,
}

impl Completion {
    /// The last response of a query or mutation: its cost settled.
    fn complete(&self, mut response: Response) -> Response {
        self.meter.settle(&mut response);
        self.propagate(response)
    }

    /// One event of a subscription: what it resolved.
    fn event(&self, mut response: Response) -> Response {
        self.meter.event(&mut response);
        self.propagate(response)
    }

    fn propagate(&self, mut response: Response) -> Response {
        if response.errors.iter().any(|error| !error.path.is_empty()) {
            let root = match self.kind {
                OperationType::Query => "Query",
                OperationType::Mutation => "Mutation",
                OperationType::Subscription => "Subscription",
            };
            let document = &self.checked.document;
            if let Ok(operation) = operation(document, self.operation_name.as_deref()) {
                self.shapes.propagate(&mut response, document, root, &operation.node.selection_set.node);
            }
        }
        response
    }

    /// `responses`, each completed.
    fn stream(self, responses: BoxStream<'static, Response>) -> BoxStream<'static, Response> {
        futures::stream::unfold((responses, self), |(mut responses, completion)| async move {
            let response = responses.next().await?;
            Some((completion.event(response), (responses, completion)))
        })
        .boxed()
    }
}

/// A checked operation that has not taken its permit yet.
pub struct Prepared {
    request: Request,
    schema: Arc<dyn Run>,
    completion: Completion,
    in_flight: Arc<Semaphore>,
    fair: Arc<Fair>,
}

impl Prepared {
    /// Query, mutation or subscription.
    pub fn kind(&self) -> OperationType {
        self.completion.kind
    }

    /// Takes a place in the caller's share and a permit of the in-flight
    /// limit, or refuses at once: a full server answers instead of
    /// queueing, so memory and waiting stay bounded. The share comes first,
    /// so a caller that fills the server is told it is its own doing
    /// (`THROTTLED`), and the others still find permits.
    pub fn admit(self) -> Result<Admitted, Refusal> {
        let Some(share) = self.fair.share(&self.completion.meter) else {
            crate::telemetry::throttled("in_flight");
            return Err(Refusal::Throttled);
        };
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            crate::telemetry::overloaded();
            return Err(Refusal::Overloaded);
        };
        Ok(Admitted { prepared: self, permit: InFlight::new(permit, share) })
    }

    /// Runs without a permit: for subscriptions, which hold a place under
    /// their own caps for as long as they live.
    pub fn stream_unmetered(self) -> BoxStream<'static, Response> {
        let responses = self.schema.execute_stream(self.request);
        self.completion.stream(responses)
    }
}

/// An operation that may run: its request prepared, its permit held.
pub struct Admitted {
    prepared: Prepared,
    permit: InFlight,
}

/// One operation's place under the in-flight limit and in its caller's
/// share, counted in `stockguard_operations_in_flight` until it is given back.
struct InFlight(
    #[expect(dead_code, reason = "held for its drop")] OwnedSemaphorePermit,
    #[expect(dead_code, reason = "held for its drop")] Share,
);

impl InFlight {
    fn new(permit: OwnedSemaphorePermit, share: Share) -> Self {
        crate::telemetry::operations_in_flight(1);
        Self(permit, share)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        crate::telemetry::operations_in_flight(-1);
    }
}

impl Admitted {
    /// Query, mutation or subscription.
    pub fn kind(&self) -> OperationType {
        self.prepared.kind()
    }

    /// Runs the operation to its end, holding the permit until then even if
    /// the caller stops waiting (see [`Finish`]).
    pub async fn execute(self) -> Response {
        let Self { prepared: Prepared { request, schema, completion, .. }, permit } = self;
        Finish::new(async move {
            let response = schema.execute(request).await;
            drop(permit);
            completion.complete(response)
        })
        .await
    }
}

/// The operation a request runs: the only one, or the one named.
fn operation<'a>(
    document: &'a ExecutableDocument,
    name: Option<&str>,
) -> Result<&'a Positioned<OperationDefinition>, ServerError> {
    let found = match (&document.operations, name) {
        (DocumentOperations::Single(operation), _) => Some(operation),
        (DocumentOperations::Multiple(operations), Some(name)) => operations.get(name),
        (DocumentOperations::Multiple(operations), None) if operations.len() == 1 => operations.values().next(),
        (DocumentOperations::Multiple(_), None) => {
            return Err(coded(
                ServerError::new("the document holds several operations: name one in operationName", None),
                ErrorCode::OperationResolutionFailure,
            ));
        }
    };
    found.ok_or_else(|| {
        coded(
            ServerError::new(format!("the document has no operation named {:?}", name.unwrap_or_default()), None),
            ErrorCode::OperationResolutionFailure,
        )
    })
}

/// Runs a request's work to the end even when its handler is dropped.
///
/// hyper drops a handler when the client hangs up, and a request cancelled
/// halfway through its database work could leave a connection inside an open
/// transaction (sqlx 0.9 loses track of a transaction whose BEGIN was cut off)
/// or a commit whose answer nobody reads. So the work is awaited in place (no
/// hand-over to another task on the common path), and if the handler goes
/// away first, what is left of it moves to a task of its own and finishes
/// there (an idempotency key lets the client fetch the committed outcome).
/// The work owns its in-flight permit, so the rest still counts against the limit.
struct Finish<F: Future + Send + 'static>(Option<Pin<Box<F>>>);

impl<F: Future + Send + 'static> Finish<F> {
    fn new(work: F) -> Self {
        Self(Some(Box::pin(work)))
    }
}

impl<F: Future + Send + 'static> Future for Finish<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(work) = self.0.as_mut() else { return Poll::Pending };
        let output = std::task::ready!(work.as_mut().poll(cx));
        self.0 = None;
        Poll::Ready(output)
    }
}

impl<F: Future + Send + 'static> Drop for Finish<F> {
    fn drop(&mut self) {
        // A panic in the work is the handler's to report; the work is not resumed.
        if std::thread::panicking() {
            return;
        }
        if let (Some(rest), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            runtime.spawn(async move {
                rest.await;
            });
        }
    }
}
