//! The outbox and the deliveries: the one module that writes and reads the
//! `outbox` and `webhook_deliveries` tables, and the layout of an outbox
//! row, which it both writes ([`rows`], [`WRITE_ROWS`]) and cuts bodies
//! from ([`body`]).
//!
//! An outbox row holds events `first_seq..=seq`, numbered in delivery
//! order, at most [`EVENTS_PER_ROW`]: `ids[i]` and `types[i]` are the
//! `i`-th event's, `body` their texts as sent, joined by commas, and
//! `ends[i]` where the `i`-th text ends, in characters from the body's
//! start, so that one event is cut out without parsing the body. A delivery
//! is a body to one endpoint: a row's events of the types it takes, as
//! `{"events":[...]}`.
//!
//! The pump writes rows and prunes those no endpoint needs (its pass's
//! statement takes [`WRITE_ROWS`] and [`PRUNE`]); an endpoint's task cuts,
//! takes and records deliveries ([`step`]); operators page and replay them
//! (`crate::webhooks`, through [`history`]); the archive ages out both
//! ([`AGED_ROWS_SQL`], [`AGED_DELIVERIES_SQL`]).

pub(crate) mod history;
pub mod step;

use std::sync::LazyLock;

use sea_orm::{ActiveEnum as _, Value};
use uuid::Uuid;

use super::{DeliveryStatus, EventType};
use crate::stock::rows::sql;

/// Most events in one outbox row, and so in one body.
pub(crate) const EVENTS_PER_ROW: usize = 100;

/// One outbox row: events `first_seq..=last_seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    /// The number of its first event.
    pub first_seq: i64,
    /// The number of its last event (the row's key, `seq`).
    pub last_seq: i64,
    /// Each event's id.
    pub ids: Vec<Uuid>,
    /// Each event's type.
    pub types: Vec<EventType>,
    /// Where each event's text ends in `body`, in characters from its start.
    pub ends: Vec<i32>,
    /// The events, joined with commas.
    pub body: String,
}

/// `events`, numbered from `last_seq + 1`, cut into rows: `write` puts an
/// event's text at the end of the body it is given and names its id and type.
pub(crate) fn rows<E>(
    last_seq: i64,
    events: &[E],
    mut write: impl FnMut(&E, &mut String) -> (Uuid, EventType),
) -> Vec<Row> {
    let mut rows = Vec::with_capacity(events.len().div_ceil(EVENTS_PER_ROW));
    for (n, chunk) in events.chunks(EVENTS_PER_ROW).enumerate() {
        let first_seq = last_seq + (n * EVENTS_PER_ROW) as i64 + 1;
        let mut row = Row {
            first_seq,
            last_seq: first_seq + chunk.len() as i64 - 1,
            ids: Vec::with_capacity(chunk.len()),
            types: Vec::with_capacity(chunk.len()),
            ends: Vec::with_capacity(chunk.len()),
            body: String::with_capacity(chunk.len() * 400),
        };
        for event in chunk {
            if !row.body.is_empty() {
                row.body.push(',');
            }
            let (id, kind) = write(event, &mut row.body);
            row.ids.push(id);
            row.types.push(kind);
            // Every character of a body is ASCII (numbers, ids, fixed
            // words, timestamps), so bytes count characters.
            row.ends.push(i32::try_from(row.body.len()).unwrap_or(i32::MAX));
        }
        rows.push(row);
    }
    rows
}

/// Writes outbox rows, as a CTE's statement in the pump's pass: the first
/// seven parameters of the statement it is part of, [`row_values`].
pub(crate) const WRITE_ROWS: &str = "
    INSERT INTO outbox (seq, first_seq, ids, types, ends, body)
    SELECT r.seq, r.first_seq, ($7::uuid[])[r.start : r.start + (r.seq - r.first_seq)::integer],
           string_to_array(r.types, ','), string_to_array(r.ends, ',')::integer[], r.body
      FROM unnest($1::bigint[], $2::bigint[], $3::integer[], $4::text[], $5::text[], $6::text[])
           AS r(first_seq, seq, start, types, ends, body)";

/// The values of [`WRITE_ROWS`] for `rows` numbered after `last_seq` (their
/// bodies moved out, not copied): each row's first and last number, where
/// its ids start in the seventh, its types and ends as text lists, its
/// body; the ids of all its events.
pub(crate) fn row_values(rows: &mut [Row], last_seq: i64) -> [Value; 7] {
    let ids: Vec<Uuid> = rows.iter().flat_map(|r| r.ids.iter().copied()).collect();
    let bodies: Vec<String> = rows.iter_mut().map(|r| std::mem::take(&mut r.body)).collect();
    let listed = |items: Vec<String>| items.join(",");
    [
        rows.iter().map(|r| r.first_seq).collect::<Vec<i64>>().into(),
        rows.iter().map(|r| r.last_seq).collect::<Vec<i64>>().into(),
        rows.iter().map(|r| i32::try_from(r.first_seq - last_seq).unwrap_or(i32::MAX)).collect::<Vec<i32>>().into(),
        rows.iter().map(|r| listed(r.types.iter().map(|t| t.to_value()).collect())).collect::<Vec<String>>().into(),
        rows.iter().map(|r| listed(r.ends.iter().map(i32::to_string).collect())).collect::<Vec<String>>().into(),
        bodies.into(),
        ids.into(),
    ]
}

/// Deletes the outbox rows no endpoint needs, as two CTEs (`needed`,
/// `pruned`) of the pump's pass, whose snapshot decides.
///
/// The first event some endpoint still needs is after its cursor (on or
/// off), or in a delivery not yet DELIVERED (to be sent, sent again, or
/// replayed). A body is cut, and the cursor moved past it, in one
/// statement ([`step`]), so the pass's snapshot sees either the old cursor
/// or the new delivery; an older snapshot only keeps more.
pub(crate) static PRUNE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "needed AS (
    SELECT least((SELECT min(sent_through) FROM webhook_endpoints) + 1,
                 (SELECT min(seqs[1]) FROM webhook_deliveries WHERE status <> {delivered})) AS seq
), pruned AS (
    DELETE FROM outbox o USING needed WHERE o.seq < needed.seq
)",
        delivered = sql(DeliveryStatus::Delivered),
    )
});

/// The body of the delivery of events `seqs` (an SQL expression naming
/// them, in order, all in one outbox row), as sent: `{"events":[...]}`
/// with the row's body whole when the delivery has all of the row's
/// events, or else its own events cut out by `ends`; the events list is
/// empty if the row has been aged out.
pub(crate) fn body(seqs: &str) -> String {
    format!(
        "'{{\"events\":[' || coalesce((SELECT CASE WHEN cardinality(o.ids) = cardinality({seqs}) THEN o.body ELSE (
               -- An endpoint subscribed to some of the row's types: its events, cut out.
               SELECT string_agg(substr(o.body, CASE WHEN u.i = 1 THEN 1 ELSE o.ends[u.i - 1] + 2 END,
                                        o.ends[u.i] - CASE WHEN u.i = 1 THEN 0 ELSE o.ends[u.i - 1] + 1 END),
                                 ',' ORDER BY u.i)
                 FROM generate_subscripts(o.ids, 1) AS u(i) WHERE o.first_seq + u.i - 1 = ANY({seqs})) END
              FROM (SELECT * FROM outbox WHERE seq >= {seqs}[1] ORDER BY seq LIMIT 1) o
             WHERE o.first_seq <= {seqs}[1]), '') || ']}}'"
    )
}

/// Deletes up to `$2` outbox rows made before `$1`, oldest first; how many
/// rows and how many events they held. Oldest by `seq`, which grows with
/// time, so a batch is found by a short index scan that stops at the first
/// row inside the retention.
pub(crate) const AGED_ROWS_SQL: &str = "WITH gone AS (
        DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox WHERE created_at < $1 ORDER BY seq LIMIT $2)
        RETURNING cardinality(ids) AS events)
        SELECT count(*) AS rows, coalesce(sum(events), 0)::bigint AS events FROM gone";

/// Deletes up to `$2` deliveries made before `$1`, whatever their status,
/// oldest first; how many (as `rows` and `events`, the shape of
/// [`AGED_ROWS_SQL`]'s answer).
pub(crate) const AGED_DELIVERIES_SQL: &str = "WITH gone AS (
        DELETE FROM webhook_deliveries WHERE id IN (
            SELECT id FROM webhook_deliveries WHERE created_at < $1 ORDER BY created_at LIMIT $2)
        RETURNING 1)
        SELECT count(*) AS rows, count(*) AS events FROM gone";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_ends_each_event_where_its_text_ends_and_numbers_on_from_the_last() {
        let events = ["{\"a\":1}", "{\"b\":22}", "{\"c\":333}"].map(|text| (Uuid::new_v4(), text));
        let made = rows(41, &events, |&(id, text), body| {
            body.push_str(text);
            (id, EventType::StockChanged)
        });
        let [row] = made.as_slice() else { panic!("one row: {made:?}") };
        assert_eq!((row.first_seq, row.last_seq), (42, 44));
        let texts = events.map(|(_, text)| text);
        assert_eq!(row.body, texts.join(","));
        let cut: Vec<&str> = (0..row.ends.len())
            .map(|i| {
                let start = if i == 0 { 0 } else { row.ends[i - 1] as usize + 1 };
                &row.body[start..row.ends[i] as usize]
            })
            .collect();
        assert_eq!(cut, texts, "each event cut out by its end, as a body is cut in SQL");
        assert_eq!(row.ids, events.map(|(id, _)| id));
    }
}
