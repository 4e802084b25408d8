//! `AppError`: the one error type of the service layer and the GraphQL
//! boundary, and [`ErrorCode`], every `extensions.code` the server sends.
//!
//! Business outcomes (sold out, conflict, not found) are not errors: they are
//! enums returned by the services and union members in the API. What is left
//! here is really an error, and each variant maps to one `extensions.code`.
//! An internal error carries its cause, which is logged once, where the error
//! becomes a response (`extend`), and never sent; an operator at a command
//! line reads it ([`AppError::for_operator`]).

use std::sync::Arc;

use async_graphql::ErrorExtensions;
use sea_orm::DbErr;

use crate::db::{DbFailure, Exhausted, classify};

/// Declares [`ErrorCode`] from one list of variants and their spellings,
/// so [`ErrorCode::ALL`] holds every code and each is spelled once.
macro_rules! error_codes {
    ($($(#[doc = $doc:literal])* $variant:ident = $spelling:literal,)*) => {
        /// An `extensions.code`: what a client switches on (docs/operations.md,
        /// "Errors", lists each; a unit test holds the two together).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub(crate) enum ErrorCode {
            $($(#[doc = $doc])* $variant,)*
        }

        impl ErrorCode {
            /// Every code.
            pub(crate) const ALL: [Self; [$($spelling),*].len()] = [$(Self::$variant),*];

            /// The code as sent.
            pub(crate) const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $spelling,)*
                }
            }
        }
    };
}

error_codes! {
    // The resolvers' (`AppError`).
    /// Input that can never succeed.
    BadUserInput = "BAD_USER_INPUT",
    /// An idempotency key used before for another request.
    IdempotencyKeyReused = "IDEMPOTENCY_KEY_REUSED",
    /// No valid token where one is needed.
    Unauthenticated = "UNAUTHENTICATED",
    /// A role that may not call the field.
    Forbidden = "FORBIDDEN",
    /// The database was not reached in time; retryable.
    DatabaseUnavailable = "DATABASE_UNAVAILABLE",
    /// A failure of ours; the cause is logged, never sent.
    Internal = "INTERNAL",
    // The gateway's.
    /// The document is not GraphQL, or too large to parse.
    GraphqlParseFailed = "GRAPHQL_PARSE_FAILED",
    /// The document breaks a validation rule.
    GraphqlValidationFailed = "GRAPHQL_VALIDATION_FAILED",
    /// No operation of the document can be chosen.
    OperationResolutionFailure = "OPERATION_RESOLUTION_FAILURE",
    /// Nested past the depth bound.
    MaxDepthLimit = "MAX_DEPTH_LIMIT",
    /// Past the complexity bound.
    CostEstimatedTooExpensive = "COST_ESTIMATED_TOO_EXPENSIVE",
    /// A persisted query's hash that the server does not hold.
    PersistedQueryNotFound = "PERSISTED_QUERY_NOT_FOUND",
    /// The caller's budget or share does not cover the operation now.
    Throttled = "THROTTLED",
    /// The process is at its limit of operations in flight.
    Overloaded = "OVERLOADED",
    /// The request is not a GraphQL request.
    BadRequest = "BAD_REQUEST",
    // The transports'.
    /// A subscription past its socket's or the process's cap.
    TooManySubscriptions = "TOO_MANY_SUBSCRIPTIONS",
    /// A body past the body limit.
    RequestTooLarge = "REQUEST_TOO_LARGE",
    /// A request past the request timeout.
    RequestTimeout = "REQUEST_TIMEOUT",
    /// An `Accept` that allows no media type the server sends.
    NotAcceptable = "NOT_ACCEPTABLE",
}

impl ErrorCode {
    /// The code spelled `code`, if it is one.
    pub(crate) fn parse(code: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|known| known.as_str() == code)
    }
}

impl From<ErrorCode> for async_graphql::Value {
    fn from(code: ErrorCode) -> Self {
        Self::from(code.as_str())
    }
}

impl serde::Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// An error a request can end in.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AppError {
    /// Input that can never succeed; nothing was written.
    #[error("{message}")]
    BadInput {
        /// The input field at fault, as the client named it (e.g. `input.quantity`).
        field: String,
        /// What is wrong, in words for the client.
        message: String,
    },
    /// The idempotency key was used before by this user for a different request.
    #[error("idempotency key was already used for a different request")]
    IdempotencyKeyReused,
    /// No valid token on a field that needs one.
    #[error("{0}")]
    Unauthenticated(&'static str),
    /// A valid token whose role may not call this field.
    #[error("this operation needs the operator role")]
    Forbidden,
    /// The database could not be reached in time, or collisions outlasted
    /// their re-runs: the request wrote nothing (only a commit cut off by a
    /// lost connection is unknown), and the client may retry.
    #[error("the database is unavailable, try again")]
    DatabaseUnavailable,
    /// Anything else: a failure of ours or of the database that the client
    /// can do nothing about. The cause is for the log, never for the client.
    #[error("internal error")]
    Internal(Arc<anyhow::Error>),
}

impl AppError {
    /// Bad input on `field`.
    pub(crate) fn bad_input(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::BadInput { field: field.into(), message: message.into() }
    }

    /// An internal error caused by `cause`.
    pub(crate) fn internal(cause: impl Into<anyhow::Error>) -> Self {
        Self::Internal(Arc::new(cause.into()))
    }

    /// The `extensions.code` of this error.
    pub(crate) fn code(&self) -> ErrorCode {
        match self {
            Self::BadInput { .. } => ErrorCode::BadUserInput,
            Self::IdempotencyKeyReused => ErrorCode::IdempotencyKeyReused,
            Self::Unauthenticated(_) => ErrorCode::Unauthenticated,
            Self::Forbidden => ErrorCode::Forbidden,
            Self::DatabaseUnavailable => ErrorCode::DatabaseUnavailable,
            Self::Internal(_) => ErrorCode::Internal,
        }
    }

    /// The error as an operator reads it at a command line: what a client
    /// reads, and for an internal error its cause, which no client is sent.
    pub(crate) fn for_operator(&self) -> String {
        match self {
            Self::Internal(cause) => format!("{self}: {cause:#}"),
            _ => self.to_string(),
        }
    }
}

impl From<DbErr> for AppError {
    fn from(err: DbErr) -> Self {
        let failure = classify(&err);
        crate::telemetry::db_failure(failure.label());
        match failure {
            // Not reached in time, whatever the cause: the client may retry.
            DbFailure::Unavailable | DbFailure::StatementTimeout | DbFailure::LockNotAvailable => {
                tracing::warn!(error = %err, "database unavailable");
                Self::DatabaseUnavailable
            }
            // A collision of a one-statement write that is not re-run
            // (creating a location or a webhook endpoint): it wrote nothing,
            // and the client may retry, as when retries run out. A read that
            // builds an answer never ends here, since it may follow a write
            // that committed: it is read again where it cannot collide
            // (`db::read_answer!`).
            DbFailure::SerializationFailure | DbFailure::Deadlock => {
                tracing::warn!(error = %err, "collision outside the retries");
                Self::DatabaseUnavailable
            }
            failure => Self::internal(anyhow::Error::new(err).context(format!("database error ({failure:?})"))),
        }
    }
}

impl From<Exhausted> for AppError {
    /// Collision retries ran out for an operation whose union has no
    /// conflict member: nothing was written, and the client may retry
    /// (`Limits::collision_attempts` lists each operation's answer).
    fn from(_: Exhausted) -> Self {
        Self::DatabaseUnavailable
    }
}

impl ErrorExtensions for AppError {
    fn extend(&self) -> async_graphql::Error {
        if let Self::Internal(cause) = self {
            tracing::error!(cause = format!("{cause:#}"), "internal error");
        }
        async_graphql::Error::new(self.to_string()).extend_with(|_, ext| {
            ext.set("code", self.code());
            match self {
                Self::BadInput { field, .. } => ext.set("field", field.as_str()),
                Self::DatabaseUnavailable => ext.set("retryable", true),
                _ => {}
            }
        })
    }
}

/// The result of a resolver.
pub(crate) type GqlResult<T> = async_graphql::Result<T>;

/// Turns a service result into a resolver result, keeping the error's code.
///
/// A bare `?` would go through async-graphql's blanket `From<Display>` and drop
/// `extensions.code`, so every resolver converts through here.
pub(crate) trait IntoGql<T> {
    /// Convert, keeping `extensions`.
    fn gql(self) -> GqlResult<T>;
}

impl<T> IntoGql<T> for Result<T, AppError> {
    fn gql(self) -> GqlResult<T> {
        self.map_err(|err| err.extend())
    }
}

impl<T> IntoGql<T> for Result<T, DbErr> {
    fn gql(self) -> GqlResult<T> {
        self.map_err(|err| AppError::from(err).extend())
    }
}

/// A DataLoader's error: the database error it shares with every key of its batch.
impl<T> IntoGql<T> for Result<T, std::sync::Arc<DbErr>> {
    fn gql(self) -> GqlResult<T> {
        self.map_err(|err| AppError::from((*err).clone()).extend())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_reads_back_as_itself() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
        }
        assert_eq!(ErrorCode::parse("internal"), None, "spellings are exact");
    }

    #[test]
    fn every_code_is_in_the_table_of_the_docs_and_the_table_names_no_other() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
            .expect("docs/operations.md");
        let start = text.find("| `extensions.code` |").expect("docs/operations.md has the table of error codes");
        let documented: Vec<&str> = text[start..]
            .lines()
            .skip(2)
            .take_while(|line| line.starts_with('|'))
            .filter_map(|line| line.strip_prefix("| `")?.split_once('`').map(|(code, _)| code))
            .collect();
        for code in ErrorCode::ALL {
            assert!(
                documented.contains(&code.as_str()),
                "docs/operations.md's table of error codes lacks {}",
                code.as_str()
            );
        }
        for code in documented {
            assert!(ErrorCode::parse(code).is_some(), "docs/operations.md's table names {code}, which is no ErrorCode");
        }
    }

    #[test]
    fn an_operator_reads_the_cause_of_an_internal_error_and_a_client_does_not() {
        let error = AppError::internal(anyhow::anyhow!("relation \"stock_movements\" does not exist"));
        assert_eq!(error.to_string(), "internal error");
        assert_eq!(error.for_operator(), "internal error: relation \"stock_movements\" does not exist");
    }
}
