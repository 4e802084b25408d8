//! Automatic persisted queries, by Apollo's protocol: a client sends only
//! `extensions.persistedQuery.sha256Hash`; an unknown hash is answered
//! `PERSISTED_QUERY_NOT_FOUND`, and the client sends the query with its hash
//! once, which is kept (bounded) for the next time.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use async_graphql::{Request, ServerError, Value};
use sha2::{Digest, Sha256};

use super::coded;
use crate::error::ErrorCode;

/// Most bytes of query text kept; when more would be kept the cache is
/// emptied, so endless distinct queries cost one full cache and no more.
const MAX_BYTES: usize = 4 << 20;

/// The queries clients have registered, by the hex SHA-256 of their text.
#[derive(Clone, Default)]
pub(super) struct Persisted {
    queries: Arc<Mutex<Kept>>,
}

#[derive(Default)]
struct Kept {
    by_hash: HashMap<String, Arc<str>>,
    bytes: usize,
}

/// A persisted-query hash a request carried with its query, to keep once the
/// query has passed its checks.
pub(super) struct ToKeep {
    hash: String,
}

impl Persisted {
    /// Fills in `request`'s query from its persisted-query hash, if it sent
    /// only the hash; checks the hash of a query it sent with one. Returns
    /// the hash to [`keep`](Self::keep) when the query came with it.
    pub(super) fn resolve(&self, request: &mut Request) -> Result<Option<ToKeep>, ServerError> {
        let Some(persisted) = request.extensions.get("persistedQuery") else { return Ok(None) };
        let Value::Object(persisted) = persisted else {
            return Err(bad_request("extensions.persistedQuery must be an object"));
        };
        if persisted.get("version") != Some(&Value::from(1)) {
            return Err(bad_request("only version 1 of persisted queries is supported"));
        }
        let Some(Value::String(hash)) = persisted.get("sha256Hash") else {
            return Err(bad_request("extensions.persistedQuery.sha256Hash must be a string"));
        };
        let hash = hash.to_ascii_lowercase();
        if request.query.is_empty() {
            let known = self.lock().by_hash.get(&hash).cloned();
            return match known {
                Some(query) => {
                    request.query = query.to_string();
                    Ok(None)
                }
                // Apollo's clients look for this message or this code.
                None => Err(coded(ServerError::new("PersistedQueryNotFound", None), ErrorCode::PersistedQueryNotFound)),
            };
        }
        if hex::encode(Sha256::digest(request.query.as_bytes())) != hash {
            return Err(bad_request("provided sha does not match query"));
        }
        Ok(Some(ToKeep { hash }))
    }

    /// Keeps `query` under the hash it came with.
    pub(super) fn keep(&self, kept: ToKeep, query: &str) {
        let mut queries = self.lock();
        if queries.by_hash.contains_key(&kept.hash) {
            return;
        }
        if queries.bytes + query.len() > MAX_BYTES {
            *queries = Kept::default();
        }
        queries.bytes += query.len();
        queries.by_hash.insert(kept.hash, query.into());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.queries.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn bad_request(message: &str) -> ServerError {
    coded(ServerError::new(message, None), ErrorCode::BadRequest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_hash(query: &str, hash: &str) -> Request {
        let mut request = Request::new(query);
        let persisted = serde_json::json!({ "version": 1, "sha256Hash": hash });
        request.extensions.insert("persistedQuery".into(), Value::from_json(persisted).expect("value"));
        request
    }

    #[test]
    fn an_unknown_hash_is_not_found_until_its_query_is_sent_once() {
        let persisted = Persisted::default();
        let query = "{ __typename }";
        let hash = hex::encode(Sha256::digest(query));
        let error = persisted.resolve(&mut with_hash("", &hash)).err().expect("not found");
        assert_eq!(super::super::code_of(&error), Some(ErrorCode::PersistedQueryNotFound));
        let kept = persisted.resolve(&mut with_hash(query, &hash)).expect("checked").expect("to keep");
        persisted.keep(kept, query);
        let mut again = with_hash("", &hash);
        assert!(persisted.resolve(&mut again).expect("found").is_none());
        assert_eq!(again.query, query);
    }

    #[test]
    fn a_hash_that_does_not_match_its_query_is_refused() {
        let persisted = Persisted::default();
        let error = persisted.resolve(&mut with_hash("{ __typename }", &"0".repeat(64))).err().expect("refused");
        assert_eq!(super::super::code_of(&error), Some(ErrorCode::BadRequest));
    }

    #[test]
    fn the_cache_stays_within_its_bytes() {
        let persisted = Persisted::default();
        for i in 0..200 {
            let query = format!("{{ a{i}: __typename }} # {}", "x".repeat(60_000));
            persisted.keep(ToKeep { hash: format!("{i}") }, &query);
            assert!(persisted.lock().bytes <= MAX_BYTES);
        }
    }
}
