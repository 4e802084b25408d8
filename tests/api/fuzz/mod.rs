//! Hostile input, generated. Every mutation's input is fuzzed with proptest
//! and sent as GraphQL variables; malicious documents and random bodies are
//! thrown at the transport. One real server per test, 64 cases each.
//!
//! The properties, for every case:
//! - the HTTP status is 200 (400 or 413 only for a body that is not a GraphQL
//!   request or is over the limit), never 500;
//! - the body is JSON with `data` or `errors`, and every error has an
//!   `extensions.code` that is a client's fault ([`CLIENT_CODES`]), never
//!   `INTERNAL` or `DATABASE_UNAVAILABLE`, and never missing;
//! - a refused request leaves the database exactly as it was;
//! - an answered one (a union member) keeps the docs/design.md invariant.
//!
//! proptest runs synchronously, so each test runs its cases on a blocking
//! thread and drives every case's requests with the runtime's `block_on`.

mod adjustments;
mod hostile_documents;
mod inputs;
mod locations;
mod mutations;
mod queries;
mod waitlists;

use self::inputs::*;
use self::mutations::*;

use std::future::Future;

use proptest::{
    collection::vec,
    prelude::*,
    sample::select,
    test_runner::{Config, TestCaseError, TestRunner},
};
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use serde_json::{Value, json};
use stockguard::{auth::Role, invariant};
use uuid::Uuid;

use crate::{
    helpers::{RESERVE, TestApp, error_code, request},
    hostile::{aliases, deep_value, fragment_fan_out},
};

/// The body limit of `Limits::default()`.
const BODY_LIMIT: usize = 64 * 1024;

/// The codes a client can earn; anything else is the server's fault.
const CLIENT_CODES: [&str; 9] = [
    "BAD_USER_INPUT",
    "IDEMPOTENCY_KEY_REUSED",
    "UNAUTHENTICATED",
    "FORBIDDEN",
    "GRAPHQL_PARSE_FAILED",
    "GRAPHQL_VALIDATION_FAILED",
    "OPERATION_RESOLUTION_FAILURE",
    "MAX_DEPTH_LIMIT",
    "COST_ESTIMATED_TOO_EXPENSIVE",
];

// ---------------------------------------------------------------------------
// Running properties against one server

/// Runs `case` on 64 values of the strategy `make` builds, on a blocking
/// thread so that each case can drive its requests with `block_on`. Fails
/// the test with proptest's (shrunk) counterexample.
async fn for_64_cases<S, F, Fut>(make: impl FnOnce() -> S + Send + 'static, case: F)
where
    S: Strategy,
    F: Fn(S::Value) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), TestCaseError>>,
{
    let runtime = tokio::runtime::Handle::current();
    let result = tokio::task::spawn_blocking(move || {
        // Each shrinking step is a real request too, so shrink a little only.
        let config = Config { cases: 64, max_shrink_iters: 32, failure_persistence: None, ..Config::default() };
        TestRunner::new(config).run(&make(), |value| runtime.block_on(case(value))).map_err(|err| err.to_string())
    })
    .await
    .expect("the property runner");
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// What the database holds that a refused request must not touch: the
/// helpers' snapshot plus every reservation's and order's mutable columns,
/// and the returns.
async fn state(app: &TestApp) -> String {
    let sql = "SELECT \
        (SELECT md5(coalesce(string_agg(concat_ws(':', id, status, quantity, expires_at, order_id, idempotency_key, \
                                                  returned), \
                                        ',' ORDER BY id), '')) FROM reservations) || '|' || \
        (SELECT count(*) FROM returns) || '|' || (SELECT count(*) FROM return_lines) || '|' || \
        (SELECT md5(coalesce(string_agg(concat_ws(':', id, status, version, ship_name, ship_line1, ship_line2, \
                                                  ship_city, ship_postal_code, ship_country, confirmed_by, \
                                                  fulfilled_by), \
                                        ',' ORDER BY id), '')) FROM orders)";
    let row =
        app.db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await.expect("query").expect("row");
    let rows: String = row.try_get_by_index(0).expect("hashes");
    format!("{}|{rows}", app.snapshot().await)
}

/// One integer column of the row with `id`, if there is one.
async fn scalar(app: &TestApp, sql: &str, id: Uuid) -> Option<i32> {
    let row = app
        .db
        .query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, [id.into()]))
        .await
        .expect("query")?;
    Some(row.try_get_by_index(0).expect("integer"))
}

/// An HTTP answer: status, body (JSON, or the text as a JSON string), and
/// how many bytes were sent.
#[derive(Debug)]
struct Reply {
    status: u16,
    body: Value,
    sent: usize,
}

/// POSTs `body` to /graphql with `authorization` as the header, if any.
async fn post(app: &TestApp, authorization: Option<&str>, body: Vec<u8>) -> Reply {
    let sent = body.len();
    let reply = app.post(authorization, body).await.expect("the server answers");
    assert!(reply.cut_short.is_none(), "a body: {:?}", reply.cut_short);
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Reply { status: reply.status, body, sent }
}

/// The transport's part of the contract: never 500, 413 exactly for bodies
/// over the limit, 400 only for bodies that are not GraphQL requests (pass
/// `may_be_400` for those), otherwise 200 with `data` or `errors` whose codes
/// are all the client's fault. Returns whether the reply carries errors (or
/// is not a 200 at all: then nothing ran).
fn check_transport(reply: &Reply, may_be_400: bool) -> Result<bool, TestCaseError> {
    prop_assert_ne!(reply.status, 500, "a 500: {}", reply.body);
    if reply.sent > BODY_LIMIT {
        prop_assert_eq!(reply.status, 413, "{} bytes: {}", reply.sent, reply.body);
        return Ok(true);
    }
    if reply.status == 400 && may_be_400 {
        prop_assert_eq!(&reply.body["errors"][0]["extensions"]["code"], "BAD_REQUEST", "{}", reply.body);
        return Ok(true);
    }
    prop_assert_eq!(reply.status, 200, "{}", reply.body);
    prop_assert!(
        reply.body.get("data").is_some() || reply.body.get("errors").is_some(),
        "neither data nor errors: {}",
        reply.body
    );
    let errors = reply.body.get("errors").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    for error in errors {
        prop_assert!(error["message"].is_string(), "an error without a message: {}", reply.body);
        let code = &error["extensions"]["code"];
        prop_assert!(
            code.as_str().is_some_and(|code| CLIENT_CODES.contains(&code)),
            "code {} is not the client's fault: {}",
            code,
            reply.body
        );
    }
    Ok(!errors.is_empty())
}

/// Sends one mutation as `caller` and checks every property: the transport,
/// no data beside errors, nothing written when refused, the invariant when
/// answered. Returns `data.<field>` when answered.
async fn mutate(
    app: &TestApp,
    caller: &Caller,
    query: &str,
    variables: Value,
    field: &str,
) -> Result<Option<Value>, TestCaseError> {
    let before = state(app).await;
    let reply = post(app, caller.header(app).as_deref(), request(query, variables)).await;
    let refused = check_transport(&reply, false)?;
    let data = &reply.body["data"][field];
    if refused {
        prop_assert!(data.is_null(), "data beside errors: {}", reply.body);
        prop_assert_eq!(state(app).await, before, "refused input wrote: {}", reply.body);
        return Ok(None);
    }
    prop_assert!(data.get("__typename").is_some_and(Value::is_string), "no result: {}", reply.body);
    let drifts = invariant::check(&app.db).await.expect("invariant check");
    prop_assert!(drifts.is_empty(), "invariant broken after {}: {:?}", reply.body, drifts);
    Ok(Some(data.clone()))
}

/// Sends a body that may be anything and checks the transport; whatever was
/// refused wrote nothing, whatever ran kept the invariant.
async fn send_anything(app: &TestApp, authorization: Option<&str>, body: Vec<u8>) -> Result<Reply, TestCaseError> {
    let before = state(app).await;
    let reply = post(app, authorization, body).await;
    if check_transport(&reply, true)? {
        // Errors beside data happen only to queries, which write nothing anyway.
        prop_assert_eq!(state(app).await, before, "a refused body wrote: {}", reply.body);
    } else {
        let drifts = invariant::check(&app.db).await.expect("invariant check");
        prop_assert!(drifts.is_empty(), "invariant broken after {}: {:?}", reply.body, drifts);
    }
    Ok(reply)
}

/// After everything, the server still answers a plain query.
async fn assert_still_serving(app: &TestApp) {
    let body = app.graphql(None, "{ inventories(first: 5) { nodes { id sku } } }", json!({})).await;
    assert!(body.get("errors").is_none(), "{body}");
    assert!(body["data"]["inventories"]["nodes"].is_array(), "{body}");
    app.assert_invariant().await;
}

// ---------------------------------------------------------------------------
// Who calls

/// The caller of a generated request.
#[derive(Debug, Clone)]
enum Caller {
    /// The customer the fixtures belong to.
    Alice,
    /// Another customer.
    Bob,
    Operator,
    Anonymous,
    /// An `Authorization` header that is not a valid token.
    Garbage(&'static str),
}

impl Caller {
    fn header(&self, app: &TestApp) -> Option<String> {
        let bearer = |token: String| Some(format!("Bearer {token}"));
        match self {
            Self::Alice => bearer(app.token("alice", Role::Customer)),
            Self::Bob => bearer(app.token("bob", Role::Customer)),
            Self::Operator => bearer(app.operator()),
            Self::Anonymous => None,
            Self::Garbage(value) => Some((*value).to_owned()),
        }
    }
}

const GARBAGE_HEADERS: [&str; 5] =
    ["Bearer not-a-token", "Bearer ", "Bearer a.b.c", "Basic YWxpY2U6c2VjcmV0", "bearer eyJhbGciOiJIUzI1NiJ9.e30.x"];

/// Mostly `main`, sometimes anyone else.
fn caller(main: Caller) -> impl Strategy<Value = Caller> {
    let other = if matches!(main, Caller::Operator) { Caller::Alice } else { Caller::Operator };
    prop_oneof![
        8 => Just(main),
        1 => prop_oneof![Just(other), Just(Caller::Bob)],
        1 => Just(Caller::Anonymous),
        1 => select(GARBAGE_HEADERS.to_vec()).prop_map(Caller::Garbage),
    ]
}
