//! An `extensions.code` on every error an operation can end in: the
//! async-graphql extension [`ErrorCodes`] gives one to each error that
//! async-graphql or a resolver left without; `docs/operations.md` lists them.
//!
//! The code is chosen from where the error was made, never from its text.
//! Each hook of the extension wraps one phase of async-graphql's request,
//! and an error that leaves a phase is of that phase's kind:
//!
//! - **Parsing** (the gateway hands the document over parsed, so only the
//!   recursion bound can refuse it here; `documents.rs` checks a tighter one
//!   first): `MAX_DEPTH_LIMIT` if the text parses, else `GRAPHQL_PARSE_FAILED`.
//! - **Validation**: `BAD_USER_INPUT` for an error at an argument whose value
//!   names a variable (the value came from the variables), else
//!   `GRAPHQL_VALIDATION_FAILED`. The depth and complexity bounds are judged
//!   here from async-graphql's own measures of a valid document
//!   ([`ValidationResult`]), so those refusals are made here with their codes
//!   (the schema itself is built without those limits). A document within
//!   them is then paid for from its caller's bucket, or refused with
//!   `THROTTLED` (`cost.rs`).
//! - **Execution**: an error located at an argument's value is a value that
//!   does not coerce to its type (`BAD_USER_INPUT`): async-graphql reports an
//!   argument it cannot read there, a resolver reports at its field. Every
//!   error a resolver makes carries its code already (`IntoGql`), so one
//!   without a code at its field is a bug: `INTERNAL`, logged.
//! - **Choosing the operation** (after validation, before execution; the
//!   gateway chooses first with the same code): `OPERATION_RESOLUTION_FAILURE`.
//!
//! Variables are coerced by the gateway before any of this (`shapes.rs`):
//! a variable that is not of its type, or a non-null one not given, is a
//! request error there, so async-graphql's validation never measures a
//! complexity from a variable it cannot read.

use std::sync::{Arc, Mutex};

use async_graphql::{
    Pos, Response, ServerError, ServerResult, ValidationResult, Value, Variables,
    extensions::{
        Extension, ExtensionContext, ExtensionFactory, NextExecute, NextParseQuery, NextRequest, NextSubscribe,
        NextValidation,
    },
    parser::types::{ExecutableDocument, Field, Selection, SelectionSet},
};
use futures::{StreamExt, stream::BoxStream};

use super::cost::{self, Meter};
use crate::{config::Limits, error::ErrorCode};

/// The `extensions.code` of an error, if it has one.
pub(crate) fn code_of(error: &ServerError) -> Option<ErrorCode> {
    match error.extensions.as_ref()?.get("code")? {
        Value::String(code) => ErrorCode::parse(code),
        _ => None,
    }
}

/// `error` with `code` as its `extensions.code`.
pub(crate) fn coded(mut error: ServerError, code: ErrorCode) -> ServerError {
    error.extensions.get_or_insert_with(Default::default).set("code", code);
    error
}

/// The async-graphql extension that gives every error of an operation an
/// `extensions.code` (see the module docs), refuses documents past the
/// depth and complexity bounds, and charges the rest to their callers.
pub(crate) struct ErrorCodes {
    /// Most complexity points (`limits.max_complexity`).
    max_complexity: usize,
    /// Deepest field nesting (`limits.max_depth`).
    max_depth: usize,
}

impl ErrorCodes {
    /// Codes errors and keeps the depth and complexity bounds of `limits`.
    pub(crate) fn new(limits: &Limits) -> Self {
        Self { max_complexity: limits.max_complexity, max_depth: limits.max_depth }
    }
}

impl ExtensionFactory for ErrorCodes {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(ErrorCodesExtension {
            max_complexity: self.max_complexity,
            max_depth: self.max_depth,
            arguments: Arc::default(),
        })
    }
}

struct ErrorCodesExtension {
    max_complexity: usize,
    max_depth: usize,
    /// Where the document's arguments are; shared with the response stream
    /// of a subscription.
    arguments: Arc<Mutex<Arguments>>,
}

/// The positions of the document's arguments (of fields and directives, in
/// operations and fragments).
#[derive(Default)]
struct Arguments {
    /// The names of arguments whose value is or holds a variable: where
    /// validation reports a value it refuses.
    variable_names: Vec<Pos>,
    /// Every argument's value: where execution reports a value that does
    /// not coerce.
    values: Vec<Pos>,
}

impl ErrorCodesExtension {
    fn arguments(&self) -> std::sync::MutexGuard<'_, Arguments> {
        self.arguments.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Where an error without a code came from.
#[derive(Clone, Copy)]
enum Phase {
    /// Resolving fields (a query, a mutation, an event of a subscription).
    Execution,
    /// After validation and before execution (choosing the operation), or
    /// the execution of a subscription's event.
    Rest,
}

/// Gives every error of `response` that has no code one, by `phase`.
fn code_errors(response: &mut Response, arguments: &Mutex<Arguments>, phase: Phase) {
    if response.errors.iter().all(|e| code_of(e).is_some()) {
        return;
    }
    let arguments = arguments.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for error in response.errors.iter_mut().filter(|e| code_of(e).is_none()) {
        let at_values = !error.locations.is_empty() && error.locations.iter().all(|p| arguments.values.contains(p));
        let code = match phase {
            _ if at_values => ErrorCode::BadUserInput,
            Phase::Rest if error.path.is_empty() => ErrorCode::OperationResolutionFailure,
            Phase::Execution | Phase::Rest => {
                tracing::error!(message = %error.message, path = ?error.path, "a field error without a code");
                ErrorCode::Internal
            }
        };
        error.extensions.get_or_insert_with(Default::default).set("code", code);
    }
}

#[async_graphql::async_trait::async_trait]
impl Extension for ErrorCodesExtension {
    /// What is left without a code here was refused after validation and
    /// before execution: the choice of operation.
    async fn request(&self, ctx: &ExtensionContext<'_>, next: NextRequest<'_>) -> Response {
        let mut response = next.run(ctx).await;
        code_errors(&mut response, &self.arguments, Phase::Rest);
        response
    }

    /// Operations over a websocket run as streams, past the `request` hook.
    fn subscribe<'s>(
        &self,
        ctx: &ExtensionContext<'_>,
        stream: BoxStream<'s, Response>,
        next: NextSubscribe<'_>,
    ) -> BoxStream<'s, Response> {
        let arguments = self.arguments.clone();
        next.run(ctx, stream)
            .map(move |mut response| {
                code_errors(&mut response, &arguments, Phase::Rest);
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
        match next.run(ctx, query, variables).await {
            Ok(document) => {
                collect_arguments(&document, &mut self.arguments());
                Ok(document)
            }
            // After parsing, async-graphql checks only the recursion bound
            // (`limit_recursive_depth`; no directive limit is set).
            Err(error) if async_graphql::parser::parse_query(query).is_ok() => {
                Err(coded(error, ErrorCode::MaxDepthLimit))
            }
            Err(error) => Err(coded(error, ErrorCode::GraphqlParseFailed)),
        }
    }

    async fn validation(
        &self,
        ctx: &ExtensionContext<'_>,
        next: NextValidation<'_>,
    ) -> Result<ValidationResult, Vec<ServerError>> {
        let result = next.run(ctx).await.map_err(|errors| {
            let arguments = self.arguments();
            let code = |error: &ServerError| {
                let at_variable = error.locations.iter().any(|pos| arguments.variable_names.contains(pos));
                if at_variable { ErrorCode::BadUserInput } else { ErrorCode::GraphqlValidationFailed }
            };
            errors
                .into_iter()
                .map(|error| {
                    let code = code(&error);
                    coded(error, code)
                })
                .collect::<Vec<_>>()
        })?;
        if result.complexity > self.max_complexity {
            let error = ServerError::new("Query is too complex.", None);
            return Err(vec![coded(error, ErrorCode::CostEstimatedTooExpensive)]);
        }
        if result.depth > self.max_depth {
            let error = ServerError::new("Query is nested too deep.", None);
            return Err(vec![coded(error, ErrorCode::MaxDepthLimit)]);
        }
        // Last: only a document every check let through is paid for.
        cost::charge(ctx.data_opt::<Arc<Meter>>(), result.complexity).map_err(|error| vec![error])?;
        Ok(result)
    }

    async fn execute(
        &self,
        ctx: &ExtensionContext<'_>,
        operation_name: Option<&str>,
        next: NextExecute<'_>,
    ) -> Response {
        let mut response = next.run(ctx, operation_name).await;
        code_errors(&mut response, &self.arguments, Phase::Execution);
        response
    }
}

/// The positions of every argument (of a field or a directive), in
/// operations and fragments.
fn collect_arguments(document: &ExecutableDocument, positions: &mut Arguments) {
    fn set(selection_set: &SelectionSet, positions: &mut Arguments) {
        for selection in &selection_set.items {
            match &selection.node {
                Selection::Field(selected) => field(&selected.node, positions),
                Selection::InlineFragment(inline) => set(&inline.node.selection_set.node, positions),
                Selection::FragmentSpread(_) => {}
            }
        }
    }
    fn field(field: &Field, positions: &mut Arguments) {
        let directive_arguments = field.directives.iter().flat_map(|d| d.node.arguments.iter());
        for (name, value) in field.arguments.iter().chain(directive_arguments) {
            positions.values.push(value.pos);
            if uses_variable(&value.node) {
                positions.variable_names.push(name.pos);
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
        V::List(items) => items.iter().any(uses_variable),
        V::Object(fields) => fields.values().any(uses_variable),
        V::Variable(_) => true,
        _ => false,
    }
}
