//! GraphQL documents: read within bounds, parsed, checked for their
//! expanded size, and kept by query text.
//!
//! async-graphql's parser recurses once per nesting level of a value or a
//! selection (`[[[[...]]]]` a few thousand deep overflowed the stack and
//! aborted the process), and its depth and complexity checks expand every
//! fragment spread at every place it is used, so a 1 KB document of fragments
//! that each spread the next one twice costs 2^n steps before it is refused.
//! So a query text is first scanned without recursion (its token count and
//! its bracket nesting), then parsed, then measured once per fragment (its
//! size and nesting once expanded, memoised, with cycles and unknown
//! fragments refused), and only a document within every bound reaches
//! async-graphql's validation. The upstream parser has no depth limit for
//! values (async-graphql-parser 7.2.1); these guards stay until it does.
//!
//! Clients send the same few operations over and over (a generated client has
//! a fixed set), and parsing was the largest single cost of a `reserve` in
//! the server's profile, so checked documents of short queries are kept; when
//! the cache is full it is emptied, so a client that sends endless distinct
//! queries costs the memory of one full cache and nothing more.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use async_graphql::{
    Name, Pos, Positioned, ServerError,
    parser::types::{ExecutableDocument, OperationType, Selection, SelectionSet},
};

use crate::error::ErrorCode;

/// Longest query text whose document is kept.
const MAX_QUERY_LEN: usize = 4096;
/// Most documents kept.
const MAX_DOCUMENTS: usize = 256;

/// Deepest nesting of selections and fragment spreads once fragments are
/// expanded; async-graphql's own recursive walk is set to the same bound
/// (`limit_recursive_depth` in `schema.rs`), so it never walks deeper than
/// this check has.
pub(crate) const MAX_NESTING: usize = 32;

/// Deepest nesting of brackets (`{`, `[`, `(`) in a query text, values
/// included. Far above any real query (GraphiQL's introspection query nests
/// 12 deep), far below what the parser's recursion can take.
const MAX_BRACKETS: usize = 48;

/// The bounds a document must keep.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// Most lexical tokens in the query text.
    pub max_tokens: usize,
    /// Most selections (fields, fragment spreads, inline fragments) once every
    /// fragment is expanded where it is spread. Every selection costs at least
    /// one point of complexity, so this is the complexity limit: a document
    /// past it would be refused anyway, and one within it is cheap to walk.
    pub max_selections: usize,
}

/// Why a query text was refused before validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Not a GraphQL document, or past a bound of its text (tokens, brackets).
    Parse {
        /// What is wrong, for the client.
        message: String,
        /// Where, when known.
        pos: Option<Pos>,
    },
    /// A fragment spread that cannot be expanded: unknown, or part of a cycle.
    Invalid {
        /// What is wrong, for the client.
        message: String,
        /// Where.
        pos: Pos,
    },
    /// Too large once its fragments are expanded.
    TooExpensive {
        /// What is wrong, for the client.
        message: String,
    },
    /// Nested too deep once its fragments are expanded.
    TooDeep {
        /// What is wrong, for the client.
        message: String,
    },
}

impl Refused {
    fn too_deep() -> Self {
        Self::TooDeep {
            message: format!(
                "the query nests selections and fragments deeper than the recursion limit of {MAX_NESTING}"
            ),
        }
    }

    /// The `extensions.code` of this refusal (docs/operations.md, Errors).
    pub(crate) fn code(&self) -> ErrorCode {
        match self {
            Self::Parse { .. } => ErrorCode::GraphqlParseFailed,
            Self::Invalid { .. } => ErrorCode::GraphqlValidationFailed,
            Self::TooExpensive { .. } => ErrorCode::CostEstimatedTooExpensive,
            Self::TooDeep { .. } => ErrorCode::MaxDepthLimit,
        }
    }

    /// The refusal as a GraphQL error with its code.
    pub(crate) fn into_server_error(self) -> ServerError {
        let code = self.code();
        let mut error = match self {
            Self::Parse { message, pos } => ServerError::new(message, pos),
            Self::Invalid { message, pos } => ServerError::new(message, Some(pos)),
            Self::TooExpensive { message } | Self::TooDeep { message } => ServerError::new(message, None),
        };
        error.extensions.get_or_insert_with(Default::default).set("code", code);
        error
    }
}

/// A checked document and what the gateway needs to know about it.
pub(crate) struct Checked {
    /// The parsed document.
    pub document: ExecutableDocument,
    /// Whether every operation only introspects.
    pub introspection: Introspection,
}

/// The cache; cheap to clone, shared by every request of a server.
#[derive(Clone)]
pub(crate) struct Documents {
    bounds: Bounds,
    parsed: Arc<Mutex<HashMap<String, Arc<Checked>>>>,
}

impl Documents {
    /// An empty cache whose documents keep `bounds`.
    pub(crate) fn new(bounds: Bounds) -> Self {
        Self { bounds, parsed: Arc::default() }
    }

    /// The checked document of `query`: from the cache, or scanned, parsed
    /// and measured now.
    pub(crate) fn check(&self, query: &str) -> Result<Arc<Checked>, Refused> {
        if let Some(checked) = self.lock().get(query).cloned() {
            return Ok(checked);
        }
        scan(query, self.bounds.max_tokens)?;
        let document = async_graphql::parser::parse_query(query).map_err(|err| Refused::Parse {
            message: format!("the query does not parse: {err}"),
            pos: err.positions().next(),
        })?;
        Measure::new(&document, self.bounds.max_selections).document()?;
        let checked = Arc::new(Checked { introspection: introspection_only(&document), document });
        if query.len() <= MAX_QUERY_LEN {
            let mut parsed = self.lock();
            if parsed.len() >= MAX_DOCUMENTS {
                parsed.clear();
            }
            parsed.insert(query.to_owned(), checked.clone());
        }
        Ok(checked)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Checked>>> {
        self.parsed.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Reads `text` as GraphQL tokens without building anything, refusing more
/// than `max_tokens` tokens or brackets nested deeper than [`MAX_BRACKETS`].
/// Strings and comments are skipped whole, so brackets inside them do not
/// count; anything the parser would refuse is left for it to refuse.
fn scan(text: &str, max_tokens: usize) -> Result<(), Refused> {
    let bytes = text.as_bytes();
    let (mut i, mut tokens, mut depth) = (0, 0usize, 0usize);
    while i < bytes.len() {
        let byte = bytes[i];
        i += 1;
        match byte {
            b' ' | b'\t' | b'\n' | b'\r' | b',' => continue,
            b'#' => {
                while i < bytes.len() && !matches!(bytes[i], b'\n' | b'\r') {
                    i += 1;
                }
                continue;
            }
            b'"' if bytes[i..].starts_with(b"\"\"") => i = block_string_end(bytes, i + 2),
            b'"' => i = string_end(bytes, i),
            b'{' | b'[' | b'(' => {
                depth += 1;
                if depth > MAX_BRACKETS {
                    return Err(Refused::Parse {
                        message: format!("the query nests brackets deeper than {MAX_BRACKETS}"),
                        pos: None,
                    });
                }
            }
            b'}' | b']' | b')' => depth = depth.saturating_sub(1),
            b'.' if bytes[i..].starts_with(b"..") => i += 2,
            b'_' | b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' => {
                // A name or a number: one token however long.
                while i < bytes.len()
                    && matches!(bytes[i], b'_' | b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'+' | b'-')
                {
                    i += 1;
                }
            }
            // Punctuators, and bytes the parser will refuse: one token each.
            _ => {}
        }
        tokens += 1;
        if tokens > max_tokens {
            return Err(Refused::Parse { message: format!("the query has more than {max_tokens} tokens"), pos: None });
        }
    }
    Ok(())
}

/// The index after the `"` that closes a string whose content starts at `i`
/// (or the end of the line, where the parser will refuse it).
fn string_end(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            b'\n' | b'\r' => return i,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// The index after the `"""` that closes a block string whose content starts
/// at `i` (`\"""` inside it is an escaped quote, not the end).
fn block_string_end(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() {
        if bytes[i..].starts_with(b"\\\"\"\"") {
            i += 4;
        } else if bytes[i..].starts_with(b"\"\"\"") {
            return i + 3;
        } else {
            i += 1;
        }
    }
    bytes.len()
}

/// A fragment's size and nesting once expanded, computed once.
#[derive(Debug, Clone, Copy)]
struct Size {
    /// Selections, saturating.
    selections: usize,
    /// Levels of selection sets below (and including) this one.
    nesting: usize,
}

/// Measures a document with every fragment expanded, each fragment once.
struct Measure<'a> {
    document: &'a ExecutableDocument,
    max_selections: usize,
    /// Fragments measured so far; `None` while one is being measured, so a
    /// spread that meets it again has found a cycle.
    fragments: HashMap<&'a Name, Option<Size>>,
}

impl<'a> Measure<'a> {
    fn new(document: &'a ExecutableDocument, max_selections: usize) -> Self {
        Self { document, max_selections, fragments: HashMap::new() }
    }

    /// Refuses the document when its operations together expand past the
    /// bounds, or a spread cannot be expanded.
    fn document(mut self) -> Result<(), Refused> {
        let mut selections = 0usize;
        for (_, operation) in self.document.operations.iter() {
            selections = selections.saturating_add(self.selection_set(&operation.node.selection_set, 0)?.selections);
            self.within(selections)?;
        }
        Ok(())
    }

    fn within(&self, selections: usize) -> Result<(), Refused> {
        if selections > self.max_selections {
            return Err(Refused::TooExpensive {
                message: format!(
                    "the query selects more than {} fields once its fragments are expanded",
                    self.max_selections
                ),
            });
        }
        Ok(())
    }

    /// The expanded size of `set`, `level` levels below an operation. The
    /// recursion stops at [`MAX_NESTING`] levels, whatever the document says.
    fn selection_set(&mut self, set: &'a Positioned<SelectionSet>, level: usize) -> Result<Size, Refused> {
        if level >= MAX_NESTING {
            return Err(Refused::too_deep());
        }
        let mut size = Size { selections: 0, nesting: 1 };
        for selection in &set.node.items {
            let below = match &selection.node {
                Selection::Field(field) if field.node.selection_set.node.items.is_empty() => {
                    Size { selections: 0, nesting: 0 }
                }
                Selection::Field(field) => self.selection_set(&field.node.selection_set, level + 1)?,
                Selection::InlineFragment(inline) => self.selection_set(&inline.node.selection_set, level + 1)?,
                Selection::FragmentSpread(spread) => self.fragment(&spread.node.fragment_name, level + 1)?,
            };
            size.selections = size.selections.saturating_add(1).saturating_add(below.selections);
            size.nesting = size.nesting.max(1 + below.nesting);
            self.within(size.selections)?;
            if level + size.nesting > MAX_NESTING {
                return Err(Refused::too_deep());
            }
        }
        Ok(size)
    }

    fn fragment(&mut self, name: &'a Positioned<Name>, level: usize) -> Result<Size, Refused> {
        match self.fragments.get(&name.node) {
            Some(Some(size)) => return Ok(*size),
            Some(None) => {
                return Err(Refused::Invalid {
                    message: format!("fragment \"{}\" spreads itself", name.node),
                    pos: name.pos,
                });
            }
            None => {}
        }
        let Some(fragment) = self.document.fragments.get(&name.node) else {
            return Err(Refused::Invalid { message: format!("unknown fragment \"{}\"", name.node), pos: name.pos });
        };
        self.fragments.insert(&name.node, None);
        let size = self.selection_set(&fragment.node.selection_set, level)?;
        self.fragments.insert(&name.node, Some(size));
        Ok(size)
    }
}

/// Whether a request selects only introspection fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Introspection {
    /// Every operation is a query of `__schema`, `__type` or `__typename` only.
    Only,
    /// Anything else.
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

    const BOUNDS: Bounds = Bounds { max_tokens: 5000, max_selections: 2000 };

    fn check(query: &str) -> Result<Arc<Checked>, Refused> {
        Documents::new(BOUNDS).check(query)
    }

    #[test]
    fn introspection_is_told_from_the_document() {
        let only = |query: &str| check(query).map(|checked| checked.introspection).ok();
        assert_eq!(only("{ __schema { types { name } } }"), Some(Introspection::Only));
        assert_eq!(only("query { __type(name: \"Query\") { name } __typename }"), Some(Introspection::Only));
        // `__typename` inside a real field is not introspection.
        assert_eq!(only("mutation { reserve(input: {}) { __typename } }"), Some(Introspection::No));
        assert_eq!(only("{ __schema { types { name } } inventories { totalCount } }"), Some(Introspection::No));
        assert_eq!(only("{ ...F } fragment F on Query { __typename }"), Some(Introspection::No));
        assert_eq!(only("{ __schema {"), None);
    }

    #[test]
    fn documents_are_reused_and_the_cache_stays_bounded() {
        let documents = Documents::new(BOUNDS);
        assert!(documents.check("{ inventories { totalCount } }").is_ok());
        assert_eq!(documents.lock().len(), 1);
        assert!(documents.check("{ inventories { totalCount } }").is_ok());
        assert_eq!(documents.lock().len(), 1, "the same text is one entry");
        // Text that does not parse is not kept.
        assert!(documents.check("{ inventories {").is_err());
        assert_eq!(documents.lock().len(), 1);
        for i in 0..(MAX_DOCUMENTS * 2) {
            assert!(documents.check(&format!("{{ a{i}: inventories {{ totalCount }} }}")).is_ok());
            assert!(documents.lock().len() <= MAX_DOCUMENTS);
        }
        // Long queries are checked but not kept.
        let long = format!("{{ {} }}", "__typename ".repeat(MAX_QUERY_LEN / 10));
        assert_eq!(documents.check(&long).map(|c| c.introspection).ok(), Some(Introspection::Only));
        assert!(!documents.lock().contains_key(&long));
    }

    #[test]
    fn brackets_nested_past_the_bound_are_refused_before_parsing() {
        let deep = |n: usize| format!("{{ inventories(after: {}1{}) {{ totalCount }} }}", "[".repeat(n), "]".repeat(n));
        assert!(check(&deep(MAX_BRACKETS - 2)).is_ok(), "within the bound it parses");
        let refused = check(&deep(5000)).err();
        assert!(
            matches!(refused, Some(Refused::Parse { ref message, .. }) if message.contains("brackets")),
            "{refused:?}"
        );
        // Brackets inside strings, block strings and comments do not count.
        let quoted = format!(
            "{{ inventoryBySku(sku: \"{0}\") {{ id }} a: inventoryBySku(sku: \"\"\"{0}\\\"\"\"\"\"\") {{ id }} }} # {0}",
            "[".repeat(5000)
        );
        assert!(check(&quoted).is_ok(), "{:?}", check(&quoted).err());
    }

    #[test]
    fn more_tokens_than_the_bound_are_refused() {
        let many = format!("{{ {} }}", "__typename ".repeat(BOUNDS.max_tokens));
        assert!(matches!(check(&many), Err(Refused::Parse { ref message, .. }) if message.contains("tokens")));
        let fewer = format!("{{ {} }}", "__typename ".repeat(BOUNDS.max_tokens - 10));
        assert!(matches!(check(&fewer), Err(Refused::TooExpensive { .. })), "5000 selections > 2000");
    }

    /// `levels` fragments, each spreading the next one twice.
    fn fan_out(levels: usize) -> String {
        let mut query = String::from("{ ...F0 }");
        for i in 0..levels {
            query.push_str(&format!(" fragment F{i} on Query {{ ...F{n} ...F{n} }}", n = i + 1));
        }
        query.push_str(&format!(" fragment F{levels} on Query {{ __typename }}"));
        query
    }

    #[test]
    fn fragment_fan_out_is_measured_once_per_fragment() {
        // 2^9 leaves and 1,023 spreads: 1,535 selections, within 2,000.
        assert!(check(&fan_out(9)).is_ok());
        // 2^30 leaves: walked spread by spread that is a billion visits,
        // minutes of work, so only a measurement once per fragment (30 of
        // them) ends within the generous bound on a busy machine.
        let started = std::time::Instant::now();
        assert!(matches!(check(&fan_out(30)), Err(Refused::TooExpensive { .. })));
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
    }

    #[test]
    fn cycles_unknown_fragments_and_deep_chains_are_refused() {
        assert!(matches!(check("{ ...A } fragment A on Query { ...A }"), Err(Refused::Invalid { .. })));
        assert!(matches!(
            check("{ ...A } fragment A on Query { inventories { nodes { ...B } } } fragment B on Inventory { ...A }"),
            Err(Refused::Invalid { .. })
        ));
        assert!(matches!(check("{ ...Nowhere }"), Err(Refused::Invalid { .. })));
        // A chain of 500 fragments, each spreading the next once.
        let mut chain = String::from("{ ...F0 }");
        for i in 0..500 {
            chain.push_str(&format!(" fragment F{i} on Query {{ ...F{} }}", i + 1));
        }
        chain.push_str(" fragment F500 on Query { __typename }");
        assert!(matches!(check(&chain), Err(Refused::TooDeep { .. })));
    }
}
