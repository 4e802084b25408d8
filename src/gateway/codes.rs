//! An `extensions.code` on every error an operation can end in: the
//! async-graphql extension [`ErrorCodes`] gives one to each error that
//! async-graphql or a resolver left without; `docs/operations.md` lists them.

use std::sync::{Arc, Mutex};

use async_graphql::{
    Pos, Response, ServerError, ServerResult, Value, Variables,
    extensions::{Extension, ExtensionContext, ExtensionFactory, NextParseQuery, NextRequest, NextSubscribe},
    parser::types::{ExecutableDocument, Field, Selection, SelectionSet},
};
use futures::{StreamExt, stream::BoxStream};

/// The `extensions.code` of an error, if it has one.
pub fn code_of(error: &ServerError) -> Option<&str> {
    match error.extensions.as_ref()?.get("code")? {
        Value::String(code) => Some(code),
        _ => None,
    }
}

/// `error` with `code` as its `extensions.code`.
pub fn coded(mut error: ServerError, code: &str) -> ServerError {
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
