//! The one way in for a GraphQL operation, whether it came over HTTP or a
//! websocket.
//!
//! [`Gateway::admit`] gives every operation the same things: its document
//! checked within the bounds of `documents.rs` (parsed once and kept), the
//! operation picked by name, the caller, a fresh set of per-request
//! DataLoaders, the schema with the right depth bound, and a permit of the
//! in-flight limit. The permit travels with the work ([`Admitted::execute`],
//! [`Admitted::stream`]) and is given back only when the work really ends,
//! even if the client went away first. Subscriptions are long-lived, so they
//! hold a place under their own caps instead (see `ws.rs`).
//!
//! Every error an operation can end in carries an `extensions.code`
//! ([`ErrorCodes`]); the README's error table lists them.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use async_graphql::{
    Pos, Positioned, Request, Response, ServerError, ServerResult, Value, Variables,
    extensions::{Extension, ExtensionContext, ExtensionFactory, NextParseQuery, NextRequest, NextSubscribe},
    parser::types::{
        DocumentOperations, ExecutableDocument, Field, OperationDefinition, OperationType, Selection, SelectionSet,
    },
};
use futures::{StreamExt, stream::BoxStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::{
    app::AppState,
    auth::Viewer,
    documents::{Bounds, Documents, Introspection},
    schema::{self, AppSchema},
    server::{self, Server},
};

/// Admits GraphQL operations; cheap to clone, one per server.
#[derive(Clone)]
pub struct Gateway {
    /// The schema with the API's depth bound.
    schema: AppSchema,
    /// The same schema with the looser depth bound for introspection-only documents.
    introspection: AppSchema,
    /// Checked documents of recent queries.
    documents: Documents,
    /// One permit per operation in flight.
    in_flight: Arc<Semaphore>,
    /// What every request's data is made from (the DataLoaders' pools).
    app: AppState,
}

/// Why an operation was not run.
#[derive(Debug)]
pub enum Refusal {
    /// The in-flight limit is reached; the client may retry.
    Overloaded,
    /// The document, or the choice of operation, is refused; nothing ran.
    Request(ServerError),
}

impl Refusal {
    /// The `extensions.code` of this refusal.
    pub fn code(&self) -> &str {
        match self {
            Self::Overloaded => "OVERLOADED",
            Self::Request(error) => code_of(error).unwrap_or("GRAPHQL_VALIDATION_FAILED"),
        }
    }

    /// The refusal as a GraphQL response.
    pub fn into_response(self) -> Response {
        match self {
            Self::Overloaded => {
                let mut error = ServerError::new("the server is at its limit of requests in flight, try again", None);
                let extensions = error.extensions.get_or_insert_with(Default::default);
                extensions.set("code", "OVERLOADED");
                extensions.set("retryable", true);
                Response::from_errors(vec![error])
            }
            Self::Request(error) => Response::from_errors(vec![error]),
        }
    }
}

/// An operation that may run: its request prepared, its permit held.
pub struct Admitted {
    request: Request,
    schema: AppSchema,
    kind: OperationType,
    permit: Option<OwnedSemaphorePermit>,
}

impl Gateway {
    /// A gateway over `server`'s schema and limits.
    pub fn new(server: &Server) -> Self {
        let app = server.state().clone();
        let bounds = Bounds { max_tokens: app.limits.max_tokens, max_selections: app.limits.max_complexity };
        Self {
            schema: server.schema(),
            introspection: schema::build_for_introspection(app.clone()),
            documents: Documents::new(bounds),
            in_flight: Arc::new(Semaphore::new(app.limits.max_in_flight.max(1))),
            app,
        }
    }

    /// The schema operations run on.
    pub fn schema(&self) -> &AppSchema {
        &self.schema
    }

    /// Checks `request`'s document and picks its operation, without taking
    /// a permit: what an operation is must be known before it is admitted
    /// (a transport may refuse some kinds, a subscription takes no permit).
    pub fn prepare(&self, mut request: Request, viewer: Viewer) -> Result<Prepared, Refusal> {
        let checked = self.documents.check(&request.query).map_err(|r| Refusal::Request(r.into_server_error()))?;
        let kind = operation(&checked.document, request.operation_name.as_deref()).map_err(Refusal::Request)?.node.ty;
        let schema = match checked.introspection {
            Introspection::Only => self.introspection.clone(),
            Introspection::No => self.schema.clone(),
        };
        request.set_parsed_query(checked.document);
        // Each operation gets its own DataLoaders, so nothing is cached past it.
        let request = server::request_data(&self.app, request.data(viewer));
        Ok(Prepared { request, schema, kind, in_flight: self.in_flight.clone() })
    }

    /// Checks `request` and takes a permit for it: everything an operation
    /// gets before it runs, whichever transport brought it.
    pub fn admit(&self, request: Request, viewer: Viewer) -> Result<Admitted, Refusal> {
        self.prepare(request, viewer)?.admit()
    }
}

/// A checked operation that has not taken its permit yet.
pub struct Prepared {
    request: Request,
    schema: AppSchema,
    kind: OperationType,
    in_flight: Arc<Semaphore>,
}

impl Prepared {
    /// Query, mutation or subscription.
    pub fn kind(&self) -> OperationType {
        self.kind
    }

    /// Takes a permit of the in-flight limit, or refuses at once: a full
    /// server answers instead of queueing, so memory and waiting stay bounded.
    pub fn admit(self) -> Result<Admitted, Refusal> {
        let Ok(permit) = self.in_flight.try_acquire_owned() else {
            crate::telemetry::db_failure("overloaded");
            return Err(Refusal::Overloaded);
        };
        Ok(Admitted { request: self.request, schema: self.schema, kind: self.kind, permit: Some(permit) })
    }

    /// Runs without a permit: for subscriptions, which hold a place under
    /// their own caps for as long as they live.
    pub fn stream_unmetered(self) -> BoxStream<'static, Response> {
        self.schema.execute_stream(self.request)
    }
}

impl Admitted {
    /// Query, mutation or subscription.
    pub fn kind(&self) -> OperationType {
        self.kind
    }

    /// Runs the operation to its end, holding the permit until then even if
    /// the caller stops waiting (see [`Finish`]).
    pub async fn execute(mut self) -> Response {
        let permit = self.permit.take();
        let (schema, request) = (self.schema, self.request);
        Finish::new(async move {
            let response = schema.execute(request).await;
            drop(permit);
            response
        })
        .await
    }

    /// The operation as a stream of responses (one for a query or mutation);
    /// the permit is held until the stream ends or is dropped.
    pub fn stream(mut self) -> BoxStream<'static, Response> {
        let permit = self.permit.take();
        let responses = self.schema.execute_stream(self.request);
        futures::stream::unfold((responses, permit), |(mut responses, permit)| async move {
            responses.next().await.map(|response| (response, (responses, permit)))
        })
        .boxed()
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
                "OPERATION_RESOLUTION_FAILURE",
            ));
        }
    };
    found.ok_or_else(|| {
        coded(
            ServerError::new(format!("the document has no operation named {:?}", name.unwrap_or_default()), None),
            "OPERATION_RESOLUTION_FAILURE",
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

/// The `extensions.code` of an error, if it has one.
pub fn code_of(error: &ServerError) -> Option<&str> {
    match error.extensions.as_ref()?.get("code")? {
        Value::String(code) => Some(code),
        _ => None,
    }
}

fn coded(mut error: ServerError, code: &str) -> ServerError {
    error.extensions.get_or_insert_with(Default::default).set("code", code);
    error
}

/// The async-graphql extension that gives every error of an operation an
/// `extensions.code`: validation failures, variables that do not coerce, the
/// depth and complexity limits, and (as a last resort, logged) any field
/// error a resolver left without one.
pub struct ErrorCodes;

impl ExtensionFactory for ErrorCodes {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(ErrorCodesExtension::default())
    }
}

#[derive(Default)]
struct ErrorCodesExtension {
    /// Where the document's arguments that use a variable are named: an
    /// invalid value there came from the variables (BAD_USER_INPUT), an
    /// invalid value elsewhere is a literal in the document (validation).
    /// Shared with the response stream of a subscription.
    variable_arguments: Arc<Mutex<Vec<Pos>>>,
}

/// Gives every error of `response` that has no code one.
fn code_errors(response: &mut Response, variable_arguments: &Mutex<Vec<Pos>>) {
    if response.errors.iter().all(|e| code_of(e).is_some()) {
        return;
    }
    let variable_arguments = variable_arguments.lock().map(|p| p.clone()).unwrap_or_default();
    for error in response.errors.iter_mut().filter(|e| code_of(e).is_none()) {
        let code = classify(error, &variable_arguments);
        if code == "INTERNAL" {
            tracing::error!(message = %error.message, path = ?error.path, "a field error without a code");
        }
        error.extensions.get_or_insert_with(Default::default).set("code", code);
    }
}

#[async_graphql::async_trait::async_trait]
impl Extension for ErrorCodesExtension {
    async fn request(&self, ctx: &ExtensionContext<'_>, next: NextRequest<'_>) -> Response {
        let mut response = next.run(ctx).await;
        code_errors(&mut response, &self.variable_arguments);
        response
    }

    /// Operations over a websocket run as streams, past the `request` hook.
    fn subscribe<'s>(
        &self,
        ctx: &ExtensionContext<'_>,
        stream: BoxStream<'s, Response>,
        next: NextSubscribe<'_>,
    ) -> BoxStream<'s, Response> {
        let variable_arguments = self.variable_arguments.clone();
        next.run(ctx, stream)
            .map(move |mut response| {
                code_errors(&mut response, &variable_arguments);
                response
            })
            .boxed()
    }

    async fn parse_query(
        &self,
        ctx: &ExtensionContext<'_>,
        query: &str,
        variables: &Variables,
        next: NextParseQuery<'_>,
    ) -> ServerResult<ExecutableDocument> {
        let document = next.run(ctx, query, variables).await?;
        let uses_variables = document.operations.iter().any(|(_, op)| !op.node.variable_definitions.is_empty());
        if uses_variables && let Ok(mut positions) = self.variable_arguments.lock() {
            collect_variable_arguments(&document, &mut positions);
        }
        Ok(document)
    }
}

/// The code of an error async-graphql or a resolver left without one.
fn classify(error: &ServerError, variable_arguments: &[Pos]) -> &'static str {
    let message = error.message.as_str();
    // A value that does not coerce to its type (a UUID that is not one, an
    // Int out of range, a variable not given): async-graphql's
    // `InputValueError` messages, at validation (for variables) or at
    // execution (for arguments, then with a path).
    let coercion = message.starts_with("Failed to parse \"")
        || message.starts_with("Expected input type \"")
        || (message.starts_with("Variable ") && message.ends_with(" is not defined."));
    if coercion {
        return "BAD_USER_INPUT";
    }
    if !error.path.is_empty() {
        // Every error a resolver makes carries its code already (`IntoGql`).
        return "INTERNAL";
    }
    if message == "Query is too complex." {
        "COST_ESTIMATED_TOO_EXPENSIVE"
    } else if message == "Query is nested too deep." || message.starts_with("The recursion depth of the query") {
        "MAX_DEPTH_LIMIT"
    } else if message.starts_with("Invalid value for argument")
        && error.locations.iter().any(|pos| variable_arguments.contains(pos))
    {
        "BAD_USER_INPUT"
    } else {
        "GRAPHQL_VALIDATION_FAILED"
    }
}

/// The positions of every argument (of a field or a directive) whose value
/// names a variable, in operations and fragments.
fn collect_variable_arguments(document: &ExecutableDocument, positions: &mut Vec<Pos>) {
    fn set(selection_set: &SelectionSet, positions: &mut Vec<Pos>) {
        for selection in &selection_set.items {
            match &selection.node {
                Selection::Field(selected) => field(&selected.node, positions),
                Selection::InlineFragment(inline) => set(&inline.node.selection_set.node, positions),
                Selection::FragmentSpread(_) => {}
            }
        }
    }
    fn field(field: &Field, positions: &mut Vec<Pos>) {
        let directive_arguments = field.directives.iter().flat_map(|d| d.node.arguments.iter());
        for (name, value) in field.arguments.iter().chain(directive_arguments) {
            if uses_variable(&value.node) {
                positions.push(name.pos);
            }
        }
        set(&field.selection_set.node, positions);
    }
    for (_, operation) in document.operations.iter() {
        set(&operation.node.selection_set.node, positions);
    }
    for fragment in document.fragments.values() {
        set(&fragment.node.selection_set.node, positions);
    }
}

/// Whether a value is or holds a variable. Recursion is bounded by the
/// document's bracket nesting, which `documents.rs` has checked.
fn uses_variable(value: &async_graphql_value::Value) -> bool {
    use async_graphql_value::Value as V;
    match value {
        V::Variable(_) => true,
        V::List(items) => items.iter().any(uses_variable),
        V::Object(fields) => fields.values().any(uses_variable),
        _ => false,
    }
}
