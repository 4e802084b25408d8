//! GraphQL over HTTP, by the spec (graphql.github.io/graphql-over-http):
//! queries by `GET /graphql?query=&variables=&operationName=&extensions=`
//! (mutations by GET are 405), everything by `POST /graphql` with a JSON
//! body (any other content type is 415), and the response's media type
//! chosen from `Accept`: `application/graphql-response+json` when the client
//! asks for it — then a request that never ran is a 4xx without `data` —,
//! else `application/json` (no `Accept`, `*/*` and `application/json`
//! included), where every GraphQL answer is a 200.
//!
//! Requests are read here, not by async-graphql-axum 7.2, because its
//! extractor (`GraphQLRequest`, `GraphQLBatchRequest`) answers otherwise.
//! Swapped in for `parse_get` and `read_body`/`parse_body`, with our checks
//! kept around it, these tests failed:
//!
//! - it reads the body from `into_body()`, which axum's `DefaultBodyLimit`
//!   does not bound: a 70 KiB query ran and answered 200
//!   (`http::bodies_that_are_not_graphql_requests_get_400_and_oversized_ones_413`).
//!   With the body wrapped in `http_body_util::Limited`, the overflow reaches
//!   the rejection as `ParseRequestError::Io` holding only the error's text,
//!   so it is a 400, not a 413, unless the code were chosen by matching that
//!   text (the same test, `fuzz::bodies_that_are_no_graphql_request_get_400_or_413_and_write_nothing`,
//!   `http_spec::a_body_past_the_limit_is_413_with_or_without_a_length`);
//! - its GET reads `operation_name` where the spec says `operationName`, so a
//!   document of several operations cannot be run by GET
//!   (`http_spec::a_get_of_several_operations_runs_the_one_its_operation_name_names`).
//!
//! Read from its source, not run: it takes a missing or non-JSON
//! `Content-Type` as JSON and `multipart/*` as uploads without a size or
//! count bound (the 415 check below comes first, as
//! `http::a_post_without_a_json_content_type_is_415_and_runs_nothing` wants);
//! it parses through the untagged `BatchRequest`, which copies every string
//! of the body once more (see `parse_body`); and its `GraphQLResponse` is
//! always a 200 as `application/graphql-response+json`, whatever `Accept`
//! says, which `http::request_errors_are_400_without_data_under_graphql_response_json_and_200_under_json`,
//! `http::graphiql_is_only_for_browsers_and_accept_picks_the_media_type` and
//! the audit's 400-status checks (`clients::the_graphql_over_http_audit_has_no_failures_and_no_warnings`)
//! refuse. Wrapped in all of that, what it would still do is one
//! `serde_json::from_slice`. Its websocket side runs async-graphql's own
//! protocol (`async_graphql::http::WebSocket`), which `ws.rs` uses directly;
//! its `GraphQLSubscription` sets no message size (axum's 64 MiB default),
//! and `GraphQLWebSocket::serve` owns the socket's loop, so the
//! `connection_init` deadline (close 4408) and the server's pings have no
//! place in it (`attacks::a_socket_that_never_initialises_is_closed_and_oversized_messages_are_refused_unrun`,
//! `attacks::the_server_pings_a_quiet_socket_and_closes_one_that_never_answers`).
//! So the crate is not a dependency.

use std::time::Duration;

use async_graphql::{BatchRequest, Request, Response};
use axum::{
    body::{Body, Bytes},
    extract::{RawQuery, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response as HttpResponse},
};
use rand::RngExt as _;
use serde::{Deserialize, Serialize};

use super::{
    Http,
    callers::{Peer, authorization, caller},
    error_response, graphiql_page,
};
use crate::{
    error::ErrorCode,
    gateway::{Admitted, Refusal, Visit, code_of},
};

/// The shortest and longest a `THROTTLED` answer is held on its connection
/// before it is sent: a client that re-sends the moment it is refused
/// gets at most ten refusals a second per connection, and one told to wait
/// a second or more is answered within a second.
const HOLD: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(1));

/// The media type a response is sent as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Media {
    /// `application/graphql-response+json`: status codes tell request errors apart.
    GraphqlResponse,
    /// `application/json`: the legacy type, every GraphQL answer a 200.
    Json,
}

impl Media {
    fn content_type(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Self::GraphqlResponse => "application/graphql-response+json; charset=utf-8",
            Self::Json => "application/json; charset=utf-8",
        })
    }
}

/// The media type `Accept` prefers; `None` when it accepts neither (406).
/// Without `Accept`, as the spec says, `application/json`.
fn negotiate(headers: &HeaderMap) -> Option<Media> {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else { return Some(Media::Json) };
    let mut best: Option<(f32, Media)> = None;
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let media = match parts.next().unwrap_or_default().trim().to_ascii_lowercase().as_str() {
            "application/graphql-response+json" => Media::GraphqlResponse,
            "application/json" | "application/*" | "*/*" => Media::Json,
            _ => continue,
        };
        let q = parts.find_map(|p| p.trim().strip_prefix("q=")?.parse::<f32>().ok()).unwrap_or(1.0);
        // On a tie the newer, more precise type wins.
        let better = match best {
            None => true,
            Some((best_q, best_media)) => {
                q > best_q || (q == best_q && media == Media::GraphqlResponse && best_media == Media::Json)
            }
        };
        if q > 0.0 && better {
            best = Some((q, media));
        }
    }
    best.map(|(_, media)| media)
}

/// Whether `Accept` asks for an HTML page before anything else (a browser
/// navigating to `/graphql`).
fn wants_html(headers: &HeaderMap) -> bool {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    accept.split(',').next().is_some_and(|first| first.trim().starts_with("text/html"))
}

/// Whether a response is a request error: nothing ran, so there is no data
/// (a field error always has a path; a request error never has one).
fn is_request_error(response: &Response) -> bool {
    !response.errors.is_empty()
        && response.data == async_graphql::Value::Null
        && response.errors.iter().all(|e| e.path.is_empty())
}

/// One response as HTTP, by the rules of `media`. A refusal to run now
/// (`THROTTLED`, `OVERLOADED`) is 429 or 503 with `Retry-After` under
/// either media type, as the server's other refusals before any work are.
fn respond(media: Media, response: Response) -> HttpResponse {
    let request_error = is_request_error(&response);
    let refusal = if request_error { response.errors.first().and_then(code_of) } else { None };
    let (status, retry_after) = match refusal {
        Some(ErrorCode::Throttled) => (StatusCode::TOO_MANY_REQUESTS, Some(retry_after_secs(&response))),
        Some(ErrorCode::Overloaded) => (StatusCode::SERVICE_UNAVAILABLE, Some(1)),
        _ if request_error && media == Media::GraphqlResponse => (StatusCode::BAD_REQUEST, None),
        _ => (StatusCode::OK, None),
    };
    let mut answer = if request_error && status != StatusCode::OK {
        // No `data` at all: the request never ran.
        let mut body = serde_json::json!({ "errors": response.errors });
        if !response.extensions.is_empty() {
            body["extensions"] = serde_json::to_value(&response.extensions).unwrap_or_default();
        }
        with_type(status, media, &body)
    } else {
        with_type(status, media, &response)
    };
    if let Some(seconds) = retry_after {
        answer.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    answer
}

/// How long to hold `responses` before they are sent, if any of them is a
/// `THROTTLED` refusal: its `retryAfterMs` within [`HOLD`] (the longest of
/// them), the upper bound spread at random over its second half. Each refusal's `retryAfterMs` then counts from the end of the
/// hold, so a client that waits as told comes back when it said.
fn pace(responses: &mut [Response]) -> Option<Duration> {
    let retry_after = |response: &Response| {
        let error = response.errors.first().filter(|error| code_of(error) == Some(ErrorCode::Throttled))?;
        match error.extensions.as_ref()?.get("retryAfterMs")? {
            async_graphql::Value::Number(ms) => ms.as_u64().map(Duration::from_millis),
            _ => None,
        }
    };
    // The longest hold is spread over its second half: connections refused
    // together (a flooder's, all told to wait a second or more) then come
    // back spread out, not in one burst the worker thread must read at once.
    let longest = HOLD.1.mul_f64(rand::rng().random_range(0.5..=1.0));
    let hold = responses.iter().filter_map(retry_after).max()?.clamp(HOLD.0, longest);
    for response in responses.iter_mut() {
        let Some(wait) = retry_after(response) else { continue };
        let rest = u64::try_from(wait.saturating_sub(hold).as_millis()).unwrap_or(u64::MAX).max(1);
        if let Some(extensions) = response.errors.first_mut().and_then(|error| error.extensions.as_mut()) {
            extensions.set("retryAfterMs", rest);
        }
    }
    Some(hold)
}

/// Holds `responses` as [`pace`] says.
async fn held(responses: &mut [Response]) {
    if let Some(hold) = pace(responses) {
        tokio::time::sleep(hold).await;
    }
}

/// One response as HTTP by [`respond`], held first if it is a `THROTTLED` refusal.
async fn answer(media: Media, mut response: Response) -> HttpResponse {
    held(std::slice::from_mut(&mut response)).await;
    respond(media, response)
}

/// Runs `admitted` and answers it as HTTP: the answer is made into bytes
/// where the operation ran (see `Admitted::execute_then`), then held if it
/// is a `THROTTLED` refusal.
async fn run(media: Media, admitted: Admitted) -> HttpResponse {
    let (reply, hold) = admitted
        .execute_then(move |mut response| {
            let hold = pace(std::slice::from_mut(&mut response));
            (respond(media, response), hold)
        })
        .await;
    if let Some(hold) = hold {
        tokio::time::sleep(hold).await;
    }
    reply
}

/// `Retry-After` in whole seconds (at least one) from the first error's
/// `retryAfterMs`.
fn retry_after_secs(response: &Response) -> u64 {
    let ms = response.errors.first().and_then(|error| match error.extensions.as_ref()?.get("retryAfterMs")? {
        async_graphql::Value::Number(ms) => ms.as_u64(),
        _ => None,
    });
    ms.unwrap_or(1000).div_ceil(1000).max(1)
}

/// `body` as JSON of `media`, written straight from the value: through a
/// `serde_json::Value` every key was allocated twice, and the fields came
/// out sorted instead of in the order the query asked for them.
fn with_type(status: StatusCode, media: Media, body: &impl Serialize) -> HttpResponse {
    // Nothing here serializes to an error (every map key is a string).
    let body = serde_json::to_string(body).unwrap_or_else(|_| "null".to_owned());
    let mut response = (status, body).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, media.content_type());
    response
}

/// A refusal as HTTP, with the caller's `extensions.cost`: 503 for a full
/// server, 429 for a caller past its share or budget (held on the
/// connection first, see [`pace`]), 400 for a request that is not one
/// (`BAD_REQUEST`), else as any request error of `media`.
async fn refused(http: &Http, media: Media, refusal: Refusal, visit: &Visit) -> HttpResponse {
    let not_graphql = matches!(&refusal, Refusal::Request(error) if code_of(error) == Some(ErrorCode::BadRequest));
    let response = http.gateway.refused(refusal, visit);
    if not_graphql {
        let body = serde_json::json!({ "errors": response.errors, "extensions": response.extensions });
        return with_type(StatusCode::BAD_REQUEST, media, &body);
    }
    answer(media, response).await
}

fn not_acceptable() -> HttpResponse {
    error_response(
        StatusCode::NOT_ACCEPTABLE,
        ErrorCode::NotAcceptable,
        "accept application/graphql-response+json or application/json",
    )
}

/// The parameters of a GET request, as the spec names them.
#[derive(Deserialize)]
struct GetParams {
    #[serde(default)]
    query: String,
    #[serde(rename = "operationName")]
    operation_name: Option<String>,
    variables: Option<String>,
    extensions: Option<String>,
}

/// `GET /graphql`: a query from the URL, or GraphiQL for a browser that
/// asks for a page and no query.
pub(super) async fn get(
    State(http): State<Http>,
    peer: Peer,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> HttpResponse {
    if query.as_deref().is_none_or(str::is_empty) && wants_html(&headers) {
        return graphiql_page(State(http)).await;
    }
    let Some(media) = negotiate(&headers) else { return not_acceptable() };
    let visit = http.gateway.visit(caller(&http, &headers, &peer, authorization(&headers)));
    if let Some(refusal) = http.gateway.turned_away(&visit) {
        return refused(&http, media, refusal, &visit).await;
    }
    let request = match parse_get(query.as_deref().unwrap_or_default()) {
        Ok(request) => request,
        Err(message) => {
            let body = serde_json::json!({ "errors": [{ "message": message, "extensions": { "code": ErrorCode::BadRequest } }] });
            return with_type(StatusCode::BAD_REQUEST, media, &body);
        }
    };
    let prepared = match http.gateway.prepare(request, &visit) {
        Ok(prepared) => prepared,
        Err(refusal) => return refused(&http, media, refusal, &visit).await,
    };
    // GET must be safe: a mutation (or a subscription) only by POST.
    if prepared.kind() != async_graphql::parser::types::OperationType::Query {
        let body = serde_json::json!({ "errors": [{
            "message": format!("a {} cannot be sent by GET; use POST", prepared.kind()),
            "extensions": { "code": ErrorCode::BadRequest }
        }] });
        let mut response = with_type(StatusCode::METHOD_NOT_ALLOWED, media, &body);
        response.headers_mut().insert(header::ALLOW, HeaderValue::from_static("POST"));
        return response;
    }
    match prepared.admit() {
        Ok(admitted) => run(media, admitted).await,
        Err(refusal) => refused(&http, media, refusal, &visit).await,
    }
}

fn parse_get(query: &str) -> Result<Request, String> {
    let params: GetParams = serde_urlencoded::from_str(query).map_err(|err| format!("bad query string: {err}"))?;
    let mut request = Request::new(params.query);
    request.operation_name = params.operation_name;
    request.variables = json_param("variables", params.variables)?.unwrap_or_default();
    request.extensions = json_param("extensions", params.extensions)?.unwrap_or_default();
    Ok(request)
}

/// A GET parameter that holds a JSON object, if given.
fn json_param<T: serde::de::DeserializeOwned>(name: &str, text: Option<String>) -> Result<Option<T>, String> {
    text.filter(|t| !t.is_empty())
        .map(|t| serde_json::from_str(&t).map_err(|err| format!("{name} is not a JSON object: {err}")))
        .transpose()
}

/// Whether a `Content-Type` is JSON in UTF-8 (the spec's request type).
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else { return false };
    let mut parts = value.split(';');
    let json = parts.next().is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"));
    let utf8 = parts.all(|param| match param.trim().split_once('=') {
        Some((name, value)) if name.trim().eq_ignore_ascii_case("charset") => {
            value.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        }
        _ => true,
    });
    json && utf8
}

/// A GraphQL request or, when the body is a JSON array, a batch. Deciding
/// by the first byte spares serde's untagged-enum buffering, which copies
/// every string of the body once more before it is read.
fn parse_body(body: &[u8]) -> serde_json::Result<BatchRequest> {
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'[') => serde_json::from_slice(body).map(BatchRequest::Batch),
        _ => serde_json::from_slice(body).map(BatchRequest::Single),
    }
}

/// Reads the body within the body limit: 413 past it.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, HttpResponse> {
    axum::body::to_bytes(body, limit).await.map_err(|err| {
        let too_large =
            std::error::Error::source(&err).is_some_and(|source| source.is::<http_body_util::LengthLimitError>());
        if too_large {
            let message = format!("the body is larger than the limit of {limit} bytes");
            error_response(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::RequestTooLarge, &message)
        } else {
            error_response(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, "the body could not be read")
        }
    })
}

/// `POST /graphql`: a request or a batch (a JSON array of requests). A body
/// that is not JSON is 415, not a GraphQL request 400, over the limit 413,
/// and a full server 503. A caller turned away (known to be short of
/// budget, or holding its whole share) is refused before its body is read.
pub(super) async fn post(State(http): State<Http>, peer: Peer, headers: HeaderMap, body: Body) -> HttpResponse {
    let Some(media) = negotiate(&headers) else { return not_acceptable() };
    if !is_json(&headers) {
        return error_response(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::BadRequest,
            "send the request as Content-Type: application/json (UTF-8)",
        );
    }
    let visit = http.gateway.visit(caller(&http, &headers, &peer, authorization(&headers)));
    if let Some(refusal) = http.gateway.turned_away(&visit) {
        return refused(&http, media, refusal, &visit).await;
    }
    let body = match read_body(body, http.app.limits.body_limit).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let bad_request = |message: String| {
        let body =
            serde_json::json!({ "errors": [{ "message": message, "extensions": { "code": ErrorCode::BadRequest } }] });
        with_type(StatusCode::BAD_REQUEST, media, &body)
    };
    let batch = match parse_body(&body) {
        Ok(batch) => batch,
        Err(err) => return bad_request(format!("the body is not a GraphQL request: {err}")),
    };
    let (single, requests) = match batch {
        BatchRequest::Single(request) => (true, vec![request]),
        BatchRequest::Batch(requests) if requests.len() > http.app.limits.max_batch => {
            return bad_request(format!("a batch may hold at most {} operations", http.app.limits.max_batch));
        }
        BatchRequest::Batch(requests) if requests.is_empty() => {
            return bad_request("the body is not a GraphQL request: an empty batch".to_owned());
        }
        BatchRequest::Batch(requests) => (false, requests),
    };
    let mut admitted: Vec<Result<Admitted, Refusal>> = Vec::with_capacity(requests.len());
    for request in requests {
        let admission = http.gateway.admit(request, &visit);
        match admission {
            // Whatever was admitted is dropped unrun, its places given back.
            Err(refusal @ (Refusal::Overloaded | Refusal::Throttled | Refusal::Short(_))) => {
                return refused(&http, media, refusal, &visit).await;
            }
            Err(Refusal::Request(error)) if single || code_of(&error) == Some(ErrorCode::BadRequest) => {
                return refused(&http, media, Refusal::Request(error), &visit).await;
            }
            admission => admitted.push(admission),
        }
    }
    if single {
        // A single request's refusals were answered above: what is left runs.
        return match admitted.pop() {
            Some(Ok(admitted)) => run(media, admitted).await,
            Some(Err(refusal)) => refused(&http, media, refusal, &visit).await,
            None => refused(&http, media, Refusal::internal(), &visit).await,
        };
    }
    let (http, visit) = (&http, &visit);
    let mut responses = futures::future::join_all(admitted.into_iter().map(|admission| async move {
        match admission {
            Ok(admitted) => admitted.execute().await,
            Err(refusal) => http.gateway.refused(refusal, visit),
        }
    }))
    .await;
    held(&mut responses).await;
    // A batch is not in the spec; every member answers in one 200.
    with_type(StatusCode::OK, media, &responses)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(value: &str) -> Option<Media> {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_str(value).expect("header"));
        negotiate(&headers)
    }

    #[test]
    fn accept_is_negotiated_as_the_spec_says() {
        assert_eq!(negotiate(&HeaderMap::new()), Some(Media::Json), "no Accept: application/json");
        assert_eq!(accept("application/json"), Some(Media::Json));
        assert_eq!(accept("*/*"), Some(Media::Json));
        assert_eq!(accept("application/graphql-response+json"), Some(Media::GraphqlResponse));
        // Apollo Client's and urql's default.
        assert_eq!(accept("application/graphql-response+json, application/json;q=0.9"), Some(Media::GraphqlResponse));
        assert_eq!(accept("application/json, application/graphql-response+json;q=0.5"), Some(Media::Json));
        assert_eq!(accept("text/html"), None);
        assert_eq!(accept("application/graphql-response+json;q=0"), None);
    }

    #[test]
    fn only_utf8_json_is_a_request_body() {
        let content = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_str(value).expect("header"));
            is_json(&headers)
        };
        assert!(content("application/json"));
        assert!(content("application/json; charset=utf-8"));
        assert!(content("Application/JSON; charset=\"UTF-8\""));
        assert!(!content("application/json; charset=latin1"));
        assert!(!content("text/plain"));
        assert!(!content("application/x-www-form-urlencoded"));
        assert!(!is_json(&HeaderMap::new()));
    }

    /// A `THROTTLED` refusal is held within [`HOLD`], and its
    /// `retryAfterMs` then counts from the end of the hold; other answers
    /// are not held.
    #[test]
    fn a_throttled_answer_is_held_and_its_wait_counts_from_then() {
        let throttled = |ms: u64| {
            let mut error = async_graphql::ServerError::new("no", None);
            let extensions = error.extensions.get_or_insert_with(Default::default);
            extensions.set("code", ErrorCode::Throttled);
            extensions.set("retryAfterMs", ms);
            Response::from_errors(vec![error])
        };
        let left = |response: &Response| {
            let extensions = response.errors[0].extensions.as_ref().expect("extensions");
            match extensions.get("retryAfterMs") {
                Some(async_graphql::Value::Number(ms)) => ms.as_u64(),
                _ => None,
            }
        };
        let mut soon = [throttled(5)];
        assert_eq!(pace(&mut soon), Some(HOLD.0), "at least the shortest hold");
        assert_eq!(left(&soon[0]), Some(1), "and then at once");
        let mut later = [throttled(2_500)];
        let hold = pace(&mut later).expect("held");
        assert!(HOLD.1 / 2 <= hold && hold <= HOLD.1, "at most the longest hold, spread: {hold:?}");
        let rest = u64::try_from((Duration::from_millis(2_500) - hold).as_millis()).expect("ms");
        assert_eq!(left(&later[0]), Some(rest), "the rest of the wait");
        let mut served = [Response::new(async_graphql::Value::Null)];
        assert_eq!(pace(&mut served), None);
        let mut batch = [Response::new(async_graphql::Value::Null), throttled(300), throttled(450)];
        assert_eq!(pace(&mut batch), Some(Duration::from_millis(450)), "a batch is held for its longest");
        assert_eq!((left(&batch[1]), left(&batch[2])), (Some(1), Some(1)));
    }

    #[test]
    fn get_parameters_are_read_by_their_spec_names() {
        let request = parse_get("query=query%20Q%20%7B%20__typename%20%7D&operationName=Q&variables=%7B%22a%22%3A1%7D")
            .expect("parsed");
        assert_eq!(request.query, "query Q { __typename }");
        assert_eq!(request.operation_name.as_deref(), Some("Q"));
        assert!(parse_get("variables=%5B1%5D").is_err(), "variables must be an object");
    }
}
