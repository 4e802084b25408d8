//! An adjustment as an operator asks for it, checked before any statement
//! runs: what makes it bad input is decided here, free of SQL.

use crate::{error::AppError, inventory::graphql::MAX_STOCK_CHANGE, stock::correcting::Change, validate};

/// Checks the change of an `adjustStock`: exactly one of a `delta` (not 0,
/// at most [`MAX_STOCK_CHANGE`] either way) and a `counted_on_hand` (0 to
/// [`MAX_STOCK_CHANGE`]); otherwise `BAD_USER_INPUT` naming the field.
pub(crate) fn change(delta: Option<i32>, counted_on_hand: Option<i32>) -> Result<Change, AppError> {
    match (delta, counted_on_hand) {
        (Some(_), Some(_)) => {
            Err(AppError::bad_input("input.countedOnHand", "give either input.delta or input.countedOnHand, not both"))
        }
        (None, None) => Err(AppError::bad_input("input.delta", "give input.delta or input.countedOnHand")),
        (Some(0), None) => Err(AppError::bad_input("input.delta", "input.delta must not be 0")),
        (Some(delta), None) => {
            validate::within("input.delta", delta, -MAX_STOCK_CHANGE..=MAX_STOCK_CHANGE).map(Change::Delta)
        }
        (None, Some(counted)) => {
            validate::within("input.countedOnHand", counted, 0..=MAX_STOCK_CHANGE).map(Change::Count)
        }
    }
}

/// Checks the quantity of a `setSafetyStock`: 0 to [`MAX_STOCK_CHANGE`].
pub(crate) fn safety_stock(quantity: i32) -> Result<i32, AppError> {
    validate::within("input.quantity", quantity, 0..=MAX_STOCK_CHANGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(result: Result<Change, AppError>) -> String {
        match result {
            Err(AppError::BadInput { field, .. }) => field,
            other => panic!("not bad input: {other:?}"),
        }
    }

    #[test]
    fn a_change_is_a_delta_or_a_count() {
        assert_eq!(change(Some(-3), None).ok(), Some(Change::Delta(-3)));
        assert_eq!(change(None, Some(0)).ok(), Some(Change::Count(0)), "an empty shelf is a count");
        assert_eq!(change(Some(MAX_STOCK_CHANGE), None).ok(), Some(Change::Delta(MAX_STOCK_CHANGE)));
    }

    #[test]
    fn both_neither_a_zero_delta_a_negative_count_and_too_much_are_bad_input() {
        assert_eq!(field(change(Some(1), Some(1))), "input.countedOnHand");
        assert_eq!(field(change(None, None)), "input.delta");
        assert_eq!(field(change(Some(0), None)), "input.delta");
        assert_eq!(field(change(None, Some(-1))), "input.countedOnHand");
        assert_eq!(field(change(Some(-MAX_STOCK_CHANGE - 1), None)), "input.delta");
        assert_eq!(field(change(None, Some(MAX_STOCK_CHANGE + 1))), "input.countedOnHand");
        assert!(safety_stock(-1).is_err() && safety_stock(MAX_STOCK_CHANGE + 1).is_err());
        assert_eq!(safety_stock(0).ok(), Some(0));
    }
}
