//! Malicious documents and bodies that are no GraphQL request: refused whole,
//! within their bounds, writing nothing.

use super::*;

/// A selection `depth` fields deep through the introspection cycle
/// `__Type.fields.type`, starting at `__type`.
pub(super) fn introspection_at_depth(depth: usize) -> String {
    let mut selection = String::from("name");
    for level in (2..depth).rev() {
        let field = if level % 2 == 0 { "fields" } else { "type" };
        selection = format!("{field} {{ {selection} }}");
    }
    format!(r#"__type(name: "Query") {{ {selection} }}"#)
}

/// `reserve { ... on Reserved { reservation { inventory { reservation { ...`,
/// `depth` fields deep: past the depth limit and through fields Inventory lacks.
pub(super) fn nested_reserve(depth: usize) -> String {
    let mut selection = String::from("id");
    for level in (2..depth).rev() {
        let field = if level % 2 == 0 { "reservation" } else { "inventory" };
        selection = format!("{field} {{ {selection} }}");
    }
    format!("mutation($input: ReserveInput!) {{ reserve(input: $input) {{ ... on Reserved {{ {selection} }} }} }}")
}

/// `reserve` under `depth` nested inline fragments.
pub(super) fn fragments_in_fragments(depth: usize) -> String {
    let mut selection = String::from("__typename");
    for _ in 0..depth {
        selection = format!("... on Reserved {{ {selection} }}");
    }
    format!("mutation($input: ReserveInput!) {{ reserve(input: $input) {{ {selection} }} }}")
}

/// A document that must be refused whole, and why.
#[derive(Clone)]
pub(super) struct Hostile {
    pub(super) what: &'static str,
    pub(super) query: String,
    /// Words of which the first error message must hold one (none: any refusal).
    pub(super) says: &'static [&'static str],
}

/// Shown by what it is, not by its (long) text.
impl std::fmt::Debug for Hostile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let start: String = self.query.chars().take(160).collect();
        write!(f, "{} ({} bytes: {start}...)", self.what, self.query.len())
    }
}

/// Documents refused by validation, whatever their depth or size.
pub(super) const INVALID_DOCUMENTS: [(&str, &str); 10] = [
    ("a fragment cycle", "{ ...A } fragment A on Query { ...B } fragment B on Query { ...A }"),
    ("a fragment that spreads itself", "{ ...A } fragment A on Query { __typename ...A }"),
    (
        "a fragment cycle around reserve",
        "mutation($input: ReserveInput!) { ...A } \
         fragment A on Mutation { reserve(input: $input) { __typename } ...B } fragment B on Mutation { ...A }",
    ),
    ("an unknown root field", "{ nope }"),
    ("an unknown field of a result", "mutation($input: ReserveInput!) { reserve(input: $input) { nope } }"),
    (
        "an unknown argument",
        r#"mutation($input: ReserveInput!) { reserve(input: $input, userId: "mallory") { __typename } }"#,
    ),
    ("an undeclared variable", "mutation { reserve(input: $nope) { __typename } }"),
    ("an undefined fragment", "mutation($input: ReserveInput!) { reserve(input: $input) { ...Nope } }"),
    (
        "a reserve beside a subscription, no operation named",
        r#"subscription { inventoryChanged(id: "00000000-0000-0000-0000-000000000000") { id } }
           mutation($input: ReserveInput!) { reserve(input: $input) { __typename } }"#,
    ),
    ("a syntax error after a reserve", "mutation($input: ReserveInput!) { reserve(input: $input) { __typename } } }"),
];

pub(super) const TOO_DEEP: &[&str] = &["deep", "recursion"];

pub(super) fn beside_a_normal_field(depth: usize) -> String {
    format!("{{ inventories {{ nodes {{ id }} }} {} }}", introspection_at_depth(depth))
}

pub(super) fn introspection_alone(depth: usize) -> String {
    format!("{{ {} }}", introspection_at_depth(depth))
}

pub(super) fn hostile_document() -> impl Strategy<Value = Hostile> {
    let deep = |what, says, query: fn(usize) -> String, depths: std::ops::RangeInclusive<usize>| {
        depths.prop_map(move |depth| Hostile { what, query: query(depth), says })
    };
    let complex = |what, query| Just(Hostile { what, query, says: &["complex", "tokens"] });
    prop_oneof![
        deep("introspection beside a normal field", TOO_DEEP, beside_a_normal_field, 13..=100),
        deep("introspection alone past its own bound", TOO_DEEP, introspection_alone, 21..=100),
        deep("reserve nested past the depth limit", &[], nested_reserve, 13..=100),
        deep("fragments nested past the recursion limit", &["recursion", "brackets"], fragments_in_fragments, 33..=100),
        complex("1000 aliases of a page of 100", aliases("query", "inventories(first: 100) { nodes { id } }", 1000)),
        complex(
            "1000 aliased reserves",
            aliases("mutation($input: ReserveInput!)", "reserve(input:$input){...on Reserved{reservation{id}}}", 1000)
        ),
        select(INVALID_DOCUMENTS.to_vec()).prop_map(|(what, query)| Hostile {
            what,
            query: query.to_owned(),
            says: &[]
        }),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn malicious_documents_are_refused_whole_and_write_nothing() {
    let (app, inventories) = server_with_stock().await;
    let big = inventories[0];
    let app = std::sync::Arc::new(app);
    let shared = app.clone();
    for_64_cases(hostile_document, move |hostile| {
        let app = shared.clone();
        async move {
            let variables = json!({ "input": { "inventoryId": big } });
            let alice = Caller::Alice.header(&app);
            let body = request(&hostile.query, variables);
            prop_assert!(body.len() <= BODY_LIMIT, "{} must fit the body limit", hostile.what);
            let reply = send_anything(&app, alice.as_deref(), body).await?;
            prop_assert_eq!(reply.status, 200, "{}: {}", hostile.what, reply.body);
            let message = reply.body["errors"][0]["message"].as_str().unwrap_or_default().to_lowercase();
            prop_assert!(!message.is_empty(), "{} must be refused: {}", hostile.what, reply.body);
            prop_assert!(
                hostile.says.is_empty() || hostile.says.iter().any(|word| message.contains(word)),
                "{}: {}",
                hostile.what,
                reply.body
            );
            prop_assert!(reply.body["data"].is_null(), "{} ran: {}", hostile.what, reply.body);
            Ok(())
        }
    })
    .await;

    // Introspection alone is answered up to its own bound.
    let body = app.graphql(None, &format!("{{ {} }}", introspection_at_depth(20)), json!({})).await;
    assert!(body.get("errors").is_none(), "{body}");
    assert_still_serving(&app).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bodies_that_are_no_graphql_request_get_400_or_413_and_write_nothing() {
    let (app, inventories) = server_with_stock().await;
    let big = inventories[0];
    let alice = Caller::Alice.header(&app);
    let reserve = json!({ "query": RESERVE, "variables": { "input": { "inventoryId": big } } });
    let before = state(&app).await;
    let padded =
        json!({ "query": format!("{RESERVE} # {}", "x".repeat(70 * 1024)), "variables": reserve["variables"] });
    for (what, body, status) in [
        ("a batch of 11 reserves", Value::Array(vec![reserve.clone(); 11]).to_string(), 400),
        ("a reserve padded to 70 KiB", padded.to_string(), 413),
        ("70 KiB of garbage", "x".repeat(70 * 1024), 413),
        ("invalid JSON", "{\"query\": \"mutation {".to_owned(), 400),
        ("a number", "42".to_owned(), 400),
        ("a string", json!(RESERVE).to_string(), 400),
        ("an empty array", "[]".to_owned(), 400),
        ("an empty query", json!({ "query": "" }).to_string(), 400),
        ("a query that is not a string", json!({ "query": 5 }).to_string(), 400),
        ("variables that are not an object", json!({ "query": RESERVE, "variables": [1] }).to_string(), 400),
        ("a batch with a non-request", json!([reserve, 1]).to_string(), 400),
        ("a batch with an empty request", json!([reserve, {}]).to_string(), 400),
        ("JSON nested past serde's limit", format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)), 400),
    ] {
        let reply = post(&app, alice.as_deref(), body.into_bytes()).await;
        assert_eq!(reply.status, status, "{what}: {}", reply.body);
        assert_eq!(state(&app).await, before, "{what} wrote");
    }
    let app = std::sync::Arc::new(app);

    // Random bytes, valid requests with bytes flipped, and GraphQL-ish soup.
    let valid = serde_json::to_vec(&reserve).expect("serialize");
    let strategy = move || {
        let tokens = select(vec![
            "{",
            "}",
            "(",
            ")",
            "[",
            "]",
            ":",
            "$input",
            "...",
            "on",
            "fragment",
            "query",
            "mutation",
            "reserve",
            "input:",
            "__schema",
            "__type",
            "__typename",
            "inventories",
            "nodes",
            "id",
            "@skip(if: true)",
            "\"",
            "#",
            "\\u0000",
            "1e999",
            "Reserved",
            ",",
            " ",
        ]);
        prop_oneof![
            vec(any::<u8>(), 0..2048),
            (vec((any::<prop::sample::Index>(), any::<u8>(), 0..3_u8), 1..8), Just(valid)).prop_map(
                |(edits, mut body)| {
                    for (at, byte, how) in edits {
                        let i = at.index(body.len().max(1)).min(body.len());
                        match how {
                            0 if i < body.len() => body[i] = byte,
                            1 if i < body.len() => {
                                body.remove(i);
                            }
                            _ => body.insert(i, byte),
                        }
                    }
                    body
                }
            ),
            vec(tokens, 0..200).prop_map(|tokens| {
                serde_json::to_vec(&json!({ "query": tokens.concat(), "variables": {} })).expect("serialize")
            }),
        ]
    };
    let shared = app.clone();
    for_64_cases(strategy, move |body| {
        let app = shared.clone();
        async move {
            let alice = Caller::Alice.header(&app);
            send_anything(&app, alice.as_deref(), body).await.map(drop)
        }
    })
    .await;
    assert_still_serving(&app).await;
}

/// A hostile document as an attacker would vary it: a value nested up to
/// 6,000 deep in any of three places, fragments fanning out up to 40 levels,
/// or up to 2,500 aliases of a field (as many as fit the body limit).
pub(super) fn generated_hostile() -> impl Strategy<Value = Hostile> {
    let fields = select(vec![
        "__typename",
        "inventoryBySku(sku: \"X\") { id }",
        "inventories(first: 100) { nodes { id } }",
        "inventories { edges { node { id sku } } pageInfo { hasNextPage } }",
    ]);
    prop_oneof![
        (1..6000_usize, 0..3_usize).prop_map(|(levels, place)| Hostile {
            what: "a deep value",
            query: deep_value(levels, place),
            says: &[]
        }),
        (1..40_usize).prop_map(|levels| Hostile {
            what: "fragment fan-out",
            query: fragment_fan_out(levels),
            says: &[]
        }),
        // As many as fit well within the body limit (and a websocket message).
        (1..2500_usize, fields).prop_map(|(count, field)| {
            let count = count.min(60_000 / (field.len() + 8));
            Hostile { what: "an alias flood", query: aliases("query", field, count), says: &[] }
        }),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn generated_hostile_documents_are_answered_within_bounds_over_http_and_websockets() {
    let (app, _) = server_with_stock().await;
    let app = std::sync::Arc::new(app);
    let shared = app.clone();
    for_64_cases(generated_hostile, move |hostile| {
        let app = shared.clone();
        async move {
            let body = request(&hostile.query, json!({}));
            prop_assert!(body.len() <= BODY_LIMIT, "{:?} must fit the body limit", hostile);
            let started = std::time::Instant::now();
            send_anything(&app, None, body).await?;
            let took = started.elapsed();
            // Generous on a busy machine: the bounds refuse each document
            // in milliseconds, an unbounded walk of one would take minutes.
            prop_assert!(took < std::time::Duration::from_secs(10), "{:?} took {:?} over HTTP", hostile, took);
            // The same document over a websocket: one result, with codes, and the socket open.
            let mut socket = crate::ws::connect(&app.address, "graphql-transport-ws").await;
            let payload = json!({ "query": hostile.query });
            crate::ws::send(&mut socket, json!({ "id": "h", "type": "subscribe", "payload": payload })).await;
            let answer = crate::ws::next_result(&mut socket).await;
            prop_assert_eq!(&answer["type"], "next", "{:?}: {}", hostile, answer);
            let errors = answer["payload"]["errors"].as_array().cloned().unwrap_or_default();
            for error in errors {
                let code = error["extensions"]["code"].as_str().unwrap_or("none");
                prop_assert!(CLIENT_CODES.contains(&code), "{:?}: {} over the websocket", hostile, error);
            }
            let follow_up = json!({ "id": "after", "type": "subscribe", "payload": { "query": "{ __typename }" } });
            crate::ws::send(&mut socket, follow_up).await;
            let after = crate::ws::next_result(&mut socket).await;
            prop_assert_eq!(&after["payload"]["data"]["__typename"], "Query", "{:?}: the socket stopped", hostile);
            Ok(())
        }
    })
    .await;
    assert_still_serving(&app).await;
}
