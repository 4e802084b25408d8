//! Parsed GraphQL documents, kept by query text.
//!
//! Clients send the same few operations over and over (a generated client has
//! a fixed set), and parsing one was the largest single cost of a `reserve`
//! request in the server's profile. Documents of short queries are kept; when
//! the cache is full it is emptied, so a client that sends endless distinct
//! queries costs the memory of one full cache and nothing more.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use async_graphql::{
    Request,
    parser::types::{ExecutableDocument, OperationType, Selection},
};

/// Longest query text whose document is kept.
const MAX_QUERY_LEN: usize = 4096;
/// Most documents kept.
const MAX_DOCUMENTS: usize = 256;

/// The cache; cheap to clone, shared by every request of a server.
#[derive(Clone, Default)]
pub struct Documents {
    parsed: Arc<Mutex<HashMap<String, ExecutableDocument>>>,
}

impl Documents {
    /// Gives `request` its parsed document, from the cache or by parsing it
    /// now, and tells whether it only introspects. A query that does not
    /// parse is left alone: execution reports the syntax error as usual.
    pub fn prepare(&self, request: &mut Request) -> Introspection {
        if let Some(document) = self.lock().get(&request.query).cloned() {
            let only = introspection_only(&document);
            request.set_parsed_query(document);
            return only;
        }
        let Ok(document) = async_graphql::parser::parse_query(&request.query) else { return Introspection::No };
        let only = introspection_only(&document);
        if request.query.len() <= MAX_QUERY_LEN {
            let mut parsed = self.lock();
            if parsed.len() >= MAX_DOCUMENTS {
                parsed.clear();
            }
            parsed.insert(request.query.clone(), document.clone());
        }
        request.set_parsed_query(document);
        only
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, ExecutableDocument>> {
        self.parsed.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Whether a request selects only introspection fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Introspection {
    /// Every operation is a query of `__schema`, `__type` or `__typename` only.
    Only,
    /// Anything else, including text that does not parse.
    No,
}

fn introspection_only(document: &ExecutableDocument) -> Introspection {
    let only = document.operations.iter().all(|(_, operation)| {
        operation.node.ty == OperationType::Query
            && operation.node.selection_set.node.items.iter().all(|selection| match &selection.node {
                Selection::Field(field) => field.node.name.node.starts_with("__"),
                // Fragments on the root could hide other fields; not introspection-only.
                _ => false,
            })
    });
    if only { Introspection::Only } else { Introspection::No }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepare(documents: &Documents, query: &str) -> (Introspection, bool) {
        let mut request = Request::new(query);
        let only = documents.prepare(&mut request);
        (only, request.parsed_query().is_ok())
    }

    #[test]
    fn introspection_is_told_from_the_document() {
        let documents = Documents::default();
        assert_eq!(prepare(&documents, "{ __schema { types { name } } }").0, Introspection::Only);
        assert_eq!(prepare(&documents, "query { __type(name: \"Query\") { name } __typename }").0, Introspection::Only);
        // `__typename` inside a real field is not introspection.
        assert_eq!(prepare(&documents, "mutation { reserve(input: {}) { __typename } }").0, Introspection::No);
        assert_eq!(
            prepare(&documents, "{ __schema { types { name } } inventories { totalCount } }").0,
            Introspection::No
        );
        assert_eq!(prepare(&documents, "{ ...F } fragment F on Query { __typename }").0, Introspection::No);
        assert_eq!(prepare(&documents, "{ __schema {").0, Introspection::No);
    }

    #[test]
    fn documents_are_reused_and_the_cache_stays_bounded() {
        let documents = Documents::default();
        let (_, parsed) = prepare(&documents, "{ inventories { totalCount } }");
        assert!(parsed);
        assert_eq!(documents.lock().len(), 1);
        prepare(&documents, "{ inventories { totalCount } }");
        assert_eq!(documents.lock().len(), 1, "the same text is one entry");
        // Text that does not parse is not kept.
        prepare(&documents, "{ inventories {");
        assert_eq!(documents.lock().len(), 1);
        for i in 0..(MAX_DOCUMENTS * 2) {
            prepare(&documents, &format!("{{ a{i}: inventories {{ totalCount }} }}"));
            assert!(documents.lock().len() <= MAX_DOCUMENTS);
        }
        // Long queries are parsed but not kept.
        let long = format!("{{ {} }}", "__typename ".repeat(MAX_QUERY_LEN / 10));
        assert_eq!(prepare(&documents, &long), (Introspection::Only, true));
        assert!(!documents.lock().contains_key(&long));
    }
}
