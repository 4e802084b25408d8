//! Relay cursor pagination over `(created_at, id)`, the keyset every
//! connection here is ordered by: stable under concurrent inserts, and one
//! index range scan per page.

use std::borrow::Cow;

use async_graphql::{
    Object, OutputType, TypeName,
    connection::{CursorType, Edge, EmptyFields, PageInfo},
};
use chrono::{DateTime, Utc};
use sea_orm::{ColumnTrait, Condition, EntityTrait, QueryFilter, QueryOrder, QuerySelect, Select, Value};
use uuid::Uuid;

use crate::{error::AppError, validate};

/// The earliest instant PostgreSQL's `timestamptz` can hold (4714-11-24 BC,
/// midnight UTC) in microseconds since the Unix epoch. No row was created
/// before it, and the database refuses a parameter before it, so a cursor
/// naming an earlier time is malformed.
const EARLIEST_MICROS: i64 = -210_866_803_200_000_000;

/// A position in a `(created_at, id)` ordered list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// The row's creation time.
    pub(crate) created_at: DateTime<Utc>,
    /// The row's id, which breaks ties between rows created in the same microsecond.
    pub(crate) id: Uuid,
}

impl CursorType for Cursor {
    type Error = &'static str;

    fn decode_cursor(s: &str) -> Result<Self, Self::Error> {
        let (micros, id) = s.split_once('_').ok_or("malformed cursor")?;
        let micros = micros.parse::<i64>().ok().filter(|&m| m >= EARLIEST_MICROS).ok_or("malformed cursor")?;
        Ok(Self {
            created_at: DateTime::from_timestamp_micros(micros).ok_or("malformed cursor")?,
            id: Uuid::parse_str(id).map_err(|_| "malformed cursor")?,
        })
    }

    fn encode_cursor(&self) -> String {
        format!("{}_{}", self.created_at.timestamp_micros(), self.id)
    }
}

/// A checked page request: how many rows, after which cursor.
#[derive(Debug, Clone, Copy)]
pub struct Page<C = Cursor> {
    /// Rows wanted (one more is fetched to learn whether there is a next page).
    pub first: u64,
    /// Rows strictly after this position.
    pub after: Option<C>,
}

impl<C: CursorType> Page<C> {
    /// Checks `first` against `1..=max` and decodes `after`.
    pub(crate) fn parse(first: Option<i32>, after: Option<&str>, max: i32) -> Result<Self, AppError> {
        let first = validate::within("first", first.unwrap_or(DEFAULT_PAGE_SIZE), 1..=max)?;
        let after = after
            .map(C::decode_cursor)
            .transpose()
            .map_err(|_| AppError::bad_input("after", "after is not a cursor from this connection"))?;
        Ok(Self { first: first as u64, after })
    }
}

impl Page {
    /// For a statement's text: the condition that starts the page after its
    /// cursor, `(created_at, id) > (after)` as a row comparison, which a
    /// `(…, created_at, id)` index answers with one range scan (nothing
    /// without a cursor), and its values, parameters `$first` and
    /// `$first + 1`.
    pub(crate) fn after_sql(&self, first: usize) -> (String, Vec<Value>) {
        match self.after {
            Some(Cursor { created_at, id }) => {
                (format!("AND (created_at, id) > (${first}, ${})", first + 1), vec![created_at.into(), id.into()])
            }
            None => (String::new(), Vec::new()),
        }
    }

    /// The `LIMIT` of the page: one row more than asked, to tell whether more follow.
    pub(crate) fn limit(&self) -> Value {
        i64::try_from(self.first).unwrap_or(i64::MAX).saturating_add(1).into()
    }
}

/// A position in an inventory's ledger: ordered by version, then by row id,
/// since one change writes a row per location it touches, all at one version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VersionCursor {
    /// The row's `version_after`.
    pub version: i32,
    /// The row's id; `None` in a cursor made before a version could hold
    /// several rows (`v<version>`), which stands after all of its rows.
    pub id: Option<Uuid>,
}

impl CursorType for VersionCursor {
    type Error = &'static str;

    fn decode_cursor(s: &str) -> Result<Self, Self::Error> {
        let rest = s.strip_prefix('v').ok_or("malformed cursor")?;
        let (version, id) = match rest.split_once(':') {
            Some((version, id)) => (version, Some(Uuid::parse_str(id).map_err(|_| "malformed cursor")?)),
            None => (rest, None),
        };
        Ok(Self { version: version.parse().map_err(|_| "malformed cursor")?, id })
    }

    fn encode_cursor(&self) -> String {
        match self.id {
            Some(id) => format!("v{}:{id}", self.version),
            None => format!("v{}", self.version),
        }
    }
}

/// The complexity of a connection field: its page size (what the client
/// asked for, at least 1) times the cost of one row, so that many aliased
/// pages of 100 rows cost what they would read. The page size is checked
/// against the configured maximum by the resolver, after this.
pub(crate) fn page_cost(first: Option<i32>, row_cost: usize) -> usize {
    let rows = usize::try_from(first.unwrap_or(DEFAULT_PAGE_SIZE)).unwrap_or(0).max(1);
    rows.saturating_mul(row_cost).saturating_add(1)
}

/// The page size of a connection when `first` is not given: the default
/// every connection field declares (`default_with`), so the schema shows it.
pub(crate) const DEFAULT_PAGE_SIZE: i32 = 20;

/// Orders `query` by `(created_at, id)` and narrows it to `page`, fetching
/// one row more than asked so the caller can tell whether a next page exists.
pub(crate) fn keyset<E: EntityTrait, C: ColumnTrait>(query: Select<E>, created_at: C, id: C, page: Page) -> Select<E> {
    let query = match page.after {
        Some(after) => query.filter(
            Condition::any()
                .add(created_at.gt(after.created_at))
                .add(Condition::all().add(created_at.eq(after.created_at)).add(id.gt(after.id))),
        ),
        None => query,
    };
    query.order_by_asc(created_at).order_by_asc(id).limit(page.first + 1)
}

/// Builds a forward connection from rows fetched with one extra row.
pub(crate) fn connection<C: CursorType + Send + Sync, Row, Node: OutputType>(
    page: Page<C>,
    mut rows: Vec<Row>,
    cursor: impl Fn(&Row) -> C,
    node: impl Fn(Row) -> Node,
) -> Connection<C, Node> {
    let has_next = rows.len() as u64 > page.first;
    rows.truncate(page.first as usize);
    let edges = rows.into_iter().map(|row| Edge::new(cursor(&row), node(row))).collect();
    Connection { edges, has_previous_page: page.after.is_some(), has_next_page: has_next }
}

/// A connection: one page of a list in Relay's shape. async-graphql's own
/// has the same fields but no description; this is it with one, named
/// `<Node>Connection` as async-graphql names its own, which clients know.
pub(crate) struct Connection<C: CursorType + Send + Sync, N: OutputType> {
    edges: Vec<Edge<C, N, EmptyFields>>,
    has_previous_page: bool,
    has_next_page: bool,
}

/// One page of a list: its rows as `nodes`, or as `edges` with the cursor of
/// each, and `pageInfo` to ask for the next page (`first` and `after: endCursor`).
#[Object(name_type)]
impl<C: CursorType + Send + Sync, N: OutputType> Connection<C, N> {
    /// Information to aid in pagination.
    async fn page_info(&self) -> PageInfo {
        PageInfo {
            has_previous_page: self.has_previous_page,
            has_next_page: self.has_next_page,
            start_cursor: self.edges.first().map(|edge| edge.cursor.encode_cursor()),
            end_cursor: self.edges.last().map(|edge| edge.cursor.encode_cursor()),
        }
    }

    /// The rows of this page, each with its cursor.
    async fn edges(&self) -> &[Edge<C, N, EmptyFields>] {
        &self.edges
    }

    /// The rows of this page.
    async fn nodes(&self) -> Vec<&N> {
        self.edges.iter().map(|edge| &edge.node).collect()
    }
}

impl<C: CursorType + Send + Sync, N: OutputType> TypeName for Connection<C, N> {
    fn type_name() -> Cow<'static, str> {
        format!("{}Connection", N::type_name()).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_survives_encoding() {
        let cursor = Cursor {
            created_at: DateTime::from_timestamp_micros(1_700_000_000_123_456).expect("time"),
            id: Uuid::new_v4(),
        };
        assert_eq!(Cursor::decode_cursor(&cursor.encode_cursor()), Ok(cursor));
        assert!(Cursor::decode_cursor("nonsense").is_err());
    }

    #[test]
    fn a_ledger_cursor_survives_encoding_and_an_older_one_still_decodes() {
        let cursor = VersionCursor { version: 7, id: Some(Uuid::new_v4()) };
        assert_eq!(VersionCursor::decode_cursor(&cursor.encode_cursor()), Ok(cursor));
        assert_eq!(VersionCursor::decode_cursor("v7"), Ok(VersionCursor { version: 7, id: None }));
        assert!(VersionCursor::decode_cursor("v7:nope").is_err());
        assert!(VersionCursor::decode_cursor("7").is_err());
    }

    #[test]
    fn a_cursor_before_postgresql_s_earliest_time_is_malformed() {
        let id = Uuid::nil();
        assert!(Cursor::decode_cursor(&format!("{EARLIEST_MICROS}_{id}")).is_ok());
        assert!(Cursor::decode_cursor(&format!("{}_{id}", EARLIEST_MICROS - 1)).is_err());
        assert!(Cursor::decode_cursor(&format!("{}_{id}", i64::MIN)).is_err());
    }
}
