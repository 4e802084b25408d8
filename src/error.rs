//! `AppError`: the one error type of the service layer and the GraphQL boundary.
//!
//! Business outcomes (sold out, conflict, not found) are not errors: they are
//! enums returned by the services and union members in the API. What is left
//! here is really an error, and each variant maps to one `extensions.code`.
//! An internal error carries its cause, which is logged once, where the error
//! becomes a response (`extend`), and never sent.

use std::sync::Arc;

use async_graphql::ErrorExtensions;
use sea_orm::DbErr;

use crate::db::{DbFailure, Exhausted, classify};

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
    pub fn bad_input(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::BadInput { field: field.into(), message: message.into() }
    }

    /// An internal error caused by `cause`.
    pub fn internal(cause: impl Into<anyhow::Error>) -> Self {
        Self::Internal(Arc::new(cause.into()))
    }

    /// The `extensions.code` of this error.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadInput { .. } => "BAD_USER_INPUT",
            Self::IdempotencyKeyReused => "IDEMPOTENCY_KEY_REUSED",
            Self::Unauthenticated(_) => "UNAUTHENTICATED",
            Self::Forbidden => "FORBIDDEN",
            Self::DatabaseUnavailable => "DATABASE_UNAVAILABLE",
            Self::Internal(_) => "INTERNAL",
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
pub type GqlResult<T> = async_graphql::Result<T>;

/// Turns a service result into a resolver result, keeping the error's code.
///
/// A bare `?` would go through async-graphql's blanket `From<Display>` and drop
/// `extensions.code`, so every resolver converts through here.
pub trait IntoGql<T> {
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
