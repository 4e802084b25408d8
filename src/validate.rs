//! Input checks. Each returns `BAD_USER_INPUT` naming the field, and runs
//! before any statement, so rejected input writes nothing.

use crate::error::AppError;

/// A quantity on a reservation line: `1..=max`.
pub(crate) fn quantity(field: &str, value: i32, max: i32) -> Result<i32, AppError> {
    if (1..=max).contains(&value) {
        Ok(value)
    } else {
        Err(AppError::bad_input(field, format!("{field} must be between 1 and {max}, got {value}")))
    }
}

/// A count that must be within `range`.
pub(crate) fn within(field: &str, value: i32, range: std::ops::RangeInclusive<i32>) -> Result<i32, AppError> {
    if range.contains(&value) {
        Ok(value)
    } else {
        Err(AppError::bad_input(
            field,
            format!("{field} must be between {} and {}, got {value}", range.start(), range.end()),
        ))
    }
}

/// A string that is neither blank nor longer than `max_chars`, and has no NUL
/// (PostgreSQL text cannot hold one). Returned trimmed.
pub(crate) fn text(field: &str, value: &str, max_chars: usize) -> Result<String, AppError> {
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Err(AppError::bad_input(field, format!("{field} must not be empty")));
    }
    if trimmed.chars().count() > max_chars {
        return Err(AppError::bad_input(field, format!("{field} must be at most {max_chars} characters")));
    }
    if trimmed.contains('\0') {
        return Err(AppError::bad_input(field, format!("{field} must not contain NUL characters")));
    }
    Ok(trimmed.to_owned())
}

/// The longest note an operator's change keeps (a return, an adjustment),
/// in characters.
pub(crate) const MAX_NOTE_CHARS: usize = 500;

/// An operator's optional note: trimmed, none when not given or blank, at
/// most [`MAX_NOTE_CHARS`] characters.
pub(crate) fn note(field: &str, value: Option<&str>) -> Result<Option<String>, AppError> {
    match value.map(str::trim) {
        None | Some("") => Ok(None),
        Some(note) => text(field, note, MAX_NOTE_CHARS).map(Some),
    }
}

/// An optional idempotency key: 1..=128 characters when given.
pub(crate) fn idempotency_key(field: &str, value: Option<&str>) -> Result<Option<String>, AppError> {
    value.map(|key| text(field, key, 128)).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_outside_one_to_max_are_refused() {
        assert!(quantity("q", 0, 10).is_err());
        assert!(quantity("q", -1, 10).is_err());
        assert!(quantity("q", 11, 10).is_err());
        assert_eq!(quantity("q", 10, 10).ok(), Some(10));
    }

    #[test]
    fn blank_overlong_and_nul_strings_are_refused() {
        assert!(text("s", "  ", 5).is_err());
        assert!(text("s", "abcdef", 5).is_err());
        assert!(text("s", "a\0b", 5).is_err());
        assert_eq!(text("s", " ab ", 5).ok().as_deref(), Some("ab"));
    }
}
