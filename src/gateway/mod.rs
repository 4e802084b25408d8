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
//! A caller's operations take turns (at most `STOCKGUARD_MAX_RUNNING_PER_CALLER`
//! running at once, the rest waiting behind that caller's own), and a query
//! of a caller that takes more than its share (more operations in flight
//! than it may run, or a budget spent faster than it refills) runs on the
//! background lane (`background.rs`), a thread of lower priority, so its
//! CPU never sits in front of another caller's small request.
//!
//! The gateway sits below the schema and the composition root: it is given
//! what it runs ([`Setup`]: the schemas as [`Run`], their SDL, the request
//! data) by `server.rs`, and imports neither, so `schema.rs` can use its
//! [`ErrorCodes`] without a cycle.

mod accounts;
mod background;
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
    accounts::{Share, Turn},
    background::Background,
    cost::{Fair, Meter, SHARE_RETRY, Visitor},
    persisted::Persisted,
    shapes::Shapes,
};
pub(crate) use self::{
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
pub(crate) trait Run: Send + Sync + 'static {
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
pub(crate) type RequestData = Arc<dyn Fn(Request) -> Request + Send + Sync>;

/// What a gateway is made of, given by the composition root.
pub(crate) struct Setup {
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

/// Admits GraphQL operations; cheap to clone, one per server.
#[derive(Clone)]
pub(crate) struct Gateway {
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
    /// Where the queries of callers past their share run.
    background: Background,
}

/// A caller as one request found it: who, and its account (looked up
/// once, before the request's body is read).
pub(crate) struct Visit {
    caller: Caller,
    visitor: Visitor,
}

/// Why an operation was not run.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The in-flight limit is reached; the client may retry.
    Overloaded,
    /// The caller holds its whole share of the in-flight limit; it may
    /// retry once one of its operations ended.
    Throttled,
    /// The caller was refused for its budget and told to wait this much
    /// longer; nothing of its request was read.
    Short(std::time::Duration),
    /// The operation's turn among its caller's did not come within
    /// `STOCKGUARD_MAX_TURN_WAIT_MS`: the caller's own operations held its
    /// share all that time. Nothing ran; the client may retry.
    NoTurn,
    /// The document, or the choice of operation, is refused; nothing ran.
    Request(ServerError),
}

impl Refusal {
    /// An operation that failed inside the server (its cause was logged).
    pub(crate) fn internal() -> Self {
        Self::Request(coded(ServerError::new("internal error", None), ErrorCode::Internal))
    }

    /// The refusal as a GraphQL response.
    pub(crate) fn into_response(self) -> Response {
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
            Self::Short(wait) => {
                let message = "your budget was short of an operation you sent and you were told to wait; \
                               retry after retryAfterMs";
                Response::from_errors(vec![cost::throttled(message, wait)])
            }
            Self::NoTurn => {
                let message = "your own operations held your share of the database for as long as an \
                               operation waits for its turn; retry when some have ended";
                Response::from_errors(vec![cost::throttled(message, SHARE_RETRY)])
            }
            Self::Request(error) => Response::from_errors(vec![error]),
        }
    }
}

impl Gateway {
    /// A gateway made of `setup`.
    pub(crate) fn new(setup: Setup) -> Self {
        Self {
            shapes: Arc::new(Shapes::from_sdl(&setup.sdl)),
            introspection: setup.introspection,
            schema: setup.schema,
            documents: Documents::new(setup.bounds),
            persisted: Persisted::default(),
            in_flight: setup.in_flight,
            fair: Arc::new(Fair::new(setup.fairness)),
            request_data: setup.request_data,
            background: Background::start(),
        }
    }

    /// `caller` and its account, for the requests it sends now.
    pub(crate) fn visit(&self, caller: Caller) -> Visit {
        Visit { visitor: self.fair.visitor(&caller), caller }
    }

    /// A refusal for a caller that is known to be short of budget (told to
    /// wait, and back too early) or holds its whole in-flight share:
    /// decided before its request is read, so that a client that never
    /// waits costs this lookup and no parsing or validation.
    pub(crate) fn turned_away(&self, visit: &Visit) -> Option<Refusal> {
        let (short, wait) = self.fair.turned_away(&visit.visitor)?;
        Some(if short { Refusal::Short(wait) } else { Refusal::Throttled })
    }

    /// Checks `request`'s document and picks its operation, without taking
    /// a permit: what an operation is must be known before it is admitted
    /// (a transport may refuse some kinds, a subscription takes no permit).
    pub(crate) fn prepare(&self, mut request: Request, visit: &Visit) -> Result<Prepared, Refusal> {
        let caller = &visit.caller;
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
        let meter = self.fair.meter(&visit.visitor);
        let completion = Completion {
            checked,
            operation_name: request.operation_name.clone(),
            kind,
            shapes: self.shapes.clone(),
            meter: meter.clone(),
        };
        // Each operation gets its own DataLoaders, so nothing is cached past it.
        let request = (self.request_data)(request.data(caller.viewer.clone()).data(meter).data(kind));
        Ok(Prepared {
            request,
            schema,
            completion,
            in_flight: self.in_flight.clone(),
            fair: self.fair.clone(),
            background: self.background.clone(),
        })
    }

    /// Checks `request` and takes its place in the caller's share:
    /// everything an operation gets before its turn, whichever transport
    /// brought it.
    pub(crate) fn admit(&self, request: Request, visit: &Visit) -> Result<Admitted, Refusal> {
        self.prepare(request, visit)?.admit()
    }

    /// `refusal` as a response, with the caller's `extensions.cost`
    /// (nothing requested, nothing resolved: it never ran).
    pub(crate) fn refused(&self, refusal: Refusal, visit: &Visit) -> Response {
        let mut response = refusal.into_response();
        visit.visitor.unmeasured(&mut response);
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
pub(crate) struct Prepared {
    request: Request,
    schema: Arc<dyn Run>,
    completion: Completion,
    in_flight: Arc<Semaphore>,
    fair: Arc<Fair>,
    background: Background,
}

impl Prepared {
    /// Query, mutation or subscription.
    pub(crate) fn kind(&self) -> OperationType {
        self.completion.kind
    }

    /// Takes a place in the caller's share, or refuses at once: a caller
    /// past it is told it is its own doing (`THROTTLED`) while every other
    /// caller is still admitted. The permit of the in-flight limit is
    /// taken when the operation's turn comes ([`Admitted::execute`]), so
    /// only running operations hold one.
    pub(crate) fn admit(self) -> Result<Admitted, Refusal> {
        let Some(share) = self.fair.share(&self.completion.meter) else {
            crate::telemetry::throttled("in_flight");
            return Err(Refusal::Throttled);
        };
        Ok(Admitted { prepared: self, share })
    }

    /// Runs without a permit: for subscriptions, which hold a place under
    /// their own caps for as long as they live.
    pub(crate) fn stream_unmetered(self) -> BoxStream<'static, Response> {
        let responses = self.schema.execute_stream(self.request);
        self.completion.stream(responses)
    }
}

/// An operation that may run: its request prepared, its place in its
/// caller's share held.
pub(crate) struct Admitted {
    prepared: Prepared,
    share: Share,
}

/// One operation's place under the in-flight limit, in its caller's share
/// and among its caller's turns, counted in `stockguard_operations_in_flight`
/// until it is given back.
struct InFlight(
    #[expect(dead_code, reason = "held for its drop")] OwnedSemaphorePermit,
    #[expect(dead_code, reason = "held for its drop")] Share,
    #[expect(dead_code, reason = "held for its drop")] Turn,
);

impl InFlight {
    fn new(permit: OwnedSemaphorePermit, share: Share, turn: Turn) -> Self {
        crate::telemetry::operations_in_flight(1);
        Self(permit, share, turn)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        crate::telemetry::operations_in_flight(-1);
    }
}

impl Admitted {
    /// Waits for the operation's turn among its caller's, takes a permit
    /// of the in-flight limit (or answers `OVERLOADED`: a full server
    /// answers instead of queueing), and runs the operation to its end,
    /// holding the permit until then even if the caller stops waiting (see
    /// [`Finish`]). Waiting for the turn is not work: a caller that goes
    /// away then leaves nothing behind.
    ///
    /// A query of a caller that takes more than its share (it had as many
    /// operations in flight as it may run, or spends its budget faster
    /// than it refills)
    /// runs on the background lane; everything else on the runtime's own
    /// threads. Only queries: a mutation may hold row locks or lead a
    /// coalesced statement that other callers wait on, and must not be
    /// slowed by a lower priority.
    pub(crate) async fn execute(self) -> Response {
        self.execute_then(|response| response).await
    }

    /// [`Admitted::execute`], then `finish` on the response where the
    /// operation ran: a transport turns a large answer into bytes there,
    /// on the background lane too, instead of on the runtime's thread.
    pub(crate) async fn execute_then<T: Send + 'static>(
        self,
        finish: impl FnOnce(Response) -> T + Clone + Send + 'static,
    ) -> T {
        let Self { prepared: Prepared { request, schema, completion, in_flight, background, .. }, share } = self;
        let Some(turn) = completion.meter.turn().await else {
            crate::telemetry::throttled("turn");
            let mut response = Refusal::NoTurn.into_response();
            completion.meter.unmeasured(&mut response);
            return finish(response);
        };
        // Another of the caller's operations may have found its budget
        // short while this one waited: then this one is refused unvalidated.
        if let Some(wait) = completion.meter.short_for() {
            crate::telemetry::throttled("known_short");
            let mut response = Refusal::Short(wait).into_response();
            completion.meter.unmeasured(&mut response);
            return finish(response);
        }
        let Ok(permit) = in_flight.try_acquire_owned() else {
            crate::telemetry::overloaded();
            let mut response = Refusal::Overloaded.into_response();
            completion.meter.unmeasured(&mut response);
            return finish(response);
        };
        let aside = completion.kind == OperationType::Query && (share.crowded() || completion.meter.spending());
        let permit = InFlight::new(permit, share, turn);
        let finished = finish.clone();
        let work = async move {
            let response = schema.execute(request).await;
            drop(permit);
            finished(completion.complete(response))
        };
        if aside {
            crate::telemetry::background_operation();
            // Sent to the lane at once, so it runs to its end without a `Finish`.
            background.run(work).await.unwrap_or_else(|| finish(Refusal::internal().into_response()))
        } else {
            Finish::new(work).await
        }
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
