//! A return as an operator asks for it, checked before any statement runs:
//! what makes it bad input is decided here, free of SQL.

use uuid::Uuid;

use crate::{
    error::AppError,
    reservations::domain::MAX_LINES,
    stock::{rows::ReturnDisposition, taking_back::ReturnLine},
    validate,
};

/// A checked `returnOrder` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReturnRequest {
    /// The order.
    pub order_id: Uuid,
    /// One line per inventory, in the order the request named them.
    pub lines: Vec<ReturnLine>,
    /// The operator's note, trimmed; none when not given or blank.
    pub note: Option<String>,
}

impl ReturnRequest {
    /// Checks a request of `lines` (as sent, in order) with `note`: 1 to
    /// [`MAX_LINES`] lines, each of an inventory no other line names, of 1
    /// to `max_quantity` units, with a location only when RESTOCK; a note
    /// of at most [`validate::MAX_NOTE_CHARS`]. Otherwise `BAD_USER_INPUT` naming the
    /// field (`input.lines[2].quantity`).
    pub(crate) fn check(
        order_id: Uuid,
        lines: Vec<ReturnLine>,
        note: Option<&str>,
        max_quantity: i32,
    ) -> Result<Self, AppError> {
        if lines.is_empty() {
            return Err(AppError::bad_input("input.lines", "input.lines must name at least one inventory"));
        }
        if lines.len() > MAX_LINES {
            return Err(AppError::bad_input("input.lines", format!("at most {MAX_LINES} lines per return")));
        }
        for (i, line) in lines.iter().enumerate() {
            let field = |name: &str| format!("input.lines[{i}].{name}");
            validate::quantity(&field("quantity"), line.quantity, max_quantity)?;
            if line.disposition == ReturnDisposition::WriteOff && line.location_id.is_some() {
                return Err(AppError::bad_input(
                    field("locationId"),
                    "a WRITE_OFF line moves no units, so it takes no location",
                ));
            }
            if lines[..i].iter().any(|earlier| earlier.inventory_id == line.inventory_id) {
                return Err(AppError::bad_input(
                    field("inventoryId"),
                    format!("inventory {} is named by an earlier line", line.inventory_id),
                ));
            }
        }
        let note = validate::note("input.note", note)?;
        Ok(Self { order_id, lines, note })
    }

    /// The locations the request names (RESTOCK lines' `locationId`), each once.
    pub(crate) fn locations(&self) -> Vec<Uuid> {
        let mut ids: Vec<Uuid> = self.lines.iter().filter_map(|line| line.location_id).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::MAX_NOTE_CHARS;

    fn line(inventory: u128, quantity: i32, disposition: ReturnDisposition, location: Option<u128>) -> ReturnLine {
        ReturnLine {
            inventory_id: Uuid::from_u128(inventory),
            quantity,
            disposition,
            location_id: location.map(Uuid::from_u128),
        }
    }

    fn field(result: Result<ReturnRequest, AppError>) -> String {
        match result {
            Err(AppError::BadInput { field, .. }) => field,
            other => panic!("not bad input: {other:?}"),
        }
    }

    #[test]
    fn a_return_of_restocked_and_written_off_lines_is_kept_in_the_order_given() {
        let lines = vec![
            line(2, 3, ReturnDisposition::Restock, Some(9)),
            line(1, 1, ReturnDisposition::WriteOff, None),
            line(3, 2, ReturnDisposition::Restock, Some(9)),
        ];
        let request = ReturnRequest::check(Uuid::nil(), lines.clone(), Some("  box dented  "), 10).expect("valid");
        assert_eq!(request.lines, lines);
        assert_eq!(request.note.as_deref(), Some("box dented"));
        assert_eq!(request.locations(), [Uuid::from_u128(9)]);
        let blank = ReturnRequest::check(Uuid::nil(), lines, Some("   "), 10).expect("valid");
        assert_eq!(blank.note, None, "a blank note is none");
    }

    #[test]
    fn empty_duplicate_out_of_range_and_misplaced_lines_and_long_notes_are_bad_input() {
        let ok = || line(1, 1, ReturnDisposition::Restock, None);
        let check = |lines: Vec<ReturnLine>| ReturnRequest::check(Uuid::nil(), lines, None, 10);
        assert_eq!(field(check(Vec::new())), "input.lines");
        assert_eq!(
            field(check((0..=MAX_LINES as u128).map(|n| line(n, 1, ReturnDisposition::Restock, None)).collect())),
            "input.lines"
        );
        assert_eq!(field(check(vec![ok(), line(2, 0, ReturnDisposition::Restock, None)])), "input.lines[1].quantity");
        assert_eq!(field(check(vec![line(2, -1, ReturnDisposition::WriteOff, None)])), "input.lines[0].quantity");
        assert_eq!(field(check(vec![line(2, 11, ReturnDisposition::Restock, None)])), "input.lines[0].quantity");
        assert_eq!(field(check(vec![ok(), ok()])), "input.lines[1].inventoryId");
        assert_eq!(field(check(vec![line(2, 1, ReturnDisposition::WriteOff, Some(9))])), "input.lines[0].locationId");
        let long = "x".repeat(MAX_NOTE_CHARS + 1);
        assert_eq!(field(ReturnRequest::check(Uuid::nil(), vec![ok()], Some(&long), 10)), "input.note");
        let longest = "é".repeat(MAX_NOTE_CHARS);
        assert!(ReturnRequest::check(Uuid::nil(), vec![ok()], Some(&longest), 10).is_ok(), "characters, not bytes");
    }
}
