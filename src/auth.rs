//! Who is calling: HS256 bearer tokens with the claims `sub`, `role` and `exp`.
//!
//! The user id only ever comes from a verified token, never from a mutation
//! argument. A request without a token may read inventory and nothing else; a
//! missing or bad token on a protected field is `UNAUTHENTICATED`, a role that
//! may not call a field at all is `FORBIDDEN`.

use async_graphql::Context;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::error::AppError;

/// Longest accepted user id.
const MAX_SUB_LEN: usize = 128;

/// What a caller may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reserves, orders and manages their own things.
    Customer,
    /// Also creates and restocks inventory and reads everything.
    Operator,
}

/// The claims Stockguard signs and requires.
#[derive(Debug, Serialize, Deserialize)]
pub struct Claims {
    /// The user id.
    pub sub: String,
    /// The user's role.
    pub role: Role,
    /// Expiry, seconds since the epoch.
    pub exp: i64,
}

/// A verified caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The user id (`sub`).
    pub id: String,
    /// The role.
    pub role: Role,
}

impl User {
    /// Whether this user is an operator.
    pub fn is_operator(&self) -> bool {
        self.role == Role::Operator
    }

    /// Whether this user may see an object owned by `owner`.
    pub fn may_see(&self, owner: &str) -> bool {
        self.is_operator() || self.id == owner
    }
}

/// The caller of one request, put into the GraphQL context by the HTTP layer.
#[derive(Debug, Clone)]
pub enum Viewer {
    /// No `Authorization` header.
    Anonymous,
    /// A header that did not verify; the reason is for the error message.
    Invalid(&'static str),
    /// A verified user.
    User(User),
}

/// The signing and verifying keys for one secret.
#[derive(Clone)]
pub struct Keys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
}

impl Keys {
    /// Keys for an HS256 secret.
    pub fn new(secret: &[u8]) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = 30;
        validation.set_required_spec_claims(&["exp", "sub"]);
        Self { encoding: EncodingKey::from_secret(secret), decoding: DecodingKey::from_secret(secret), validation }
    }

    /// A fresh random secret, for a server started without one.
    pub fn random_secret() -> String {
        let bytes: [u8; 32] = rand::random();
        hex::encode(bytes)
    }

    /// Signs a token for `sub` with `role`, valid for `ttl`.
    pub fn mint(&self, sub: &str, role: Role, ttl: chrono::Duration) -> Result<String, jsonwebtoken::errors::Error> {
        let claims = Claims { sub: sub.to_owned(), role, exp: (chrono::Utc::now() + ttl).timestamp() };
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
    }

    /// Reads the caller from an `Authorization` header value, if any.
    pub fn viewer(&self, authorization: Option<&str>) -> Viewer {
        let Some(value) = authorization else { return Viewer::Anonymous };
        let Some(token) = value.strip_prefix("Bearer ").map(str::trim) else {
            return Viewer::Invalid("the Authorization header must be `Bearer <token>`");
        };
        // Only HS256 is in `validation.algorithms`, so `alg: none` and RS256
        // headers are refused before any signature is looked at.
        match jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation) {
            // A NUL cannot be stored as a user id (PostgreSQL text refuses it).
            Ok(data)
                if !data.claims.sub.is_empty()
                    && data.claims.sub.len() <= MAX_SUB_LEN
                    && !data.claims.sub.contains('\0') =>
            {
                Viewer::User(User { id: data.claims.sub, role: data.claims.role })
            }
            Ok(_) => Viewer::Invalid("the token's subject is empty, too long or holds a NUL"),
            Err(err) => match err.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => Viewer::Invalid("the token has expired"),
                _ => Viewer::Invalid("the token is not valid"),
            },
        }
    }
}

/// The signed-in user, or `UNAUTHENTICATED`.
pub fn user<'a>(ctx: &'a Context<'_>) -> Result<&'a User, AppError> {
    match ctx.data_opt::<Viewer>() {
        Some(Viewer::User(user)) => Ok(user),
        Some(Viewer::Invalid(reason)) => Err(AppError::Unauthenticated(reason)),
        Some(Viewer::Anonymous) | None => Err(AppError::Unauthenticated("this operation needs a bearer token")),
    }
}

/// The signed-in operator, or `UNAUTHENTICATED` / `FORBIDDEN`.
pub fn operator<'a>(ctx: &'a Context<'_>) -> Result<&'a User, AppError> {
    let user = user(ctx)?;
    if user.is_operator() { Ok(user) } else { Err(AppError::Forbidden) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_token_reads_back_as_its_user() {
        let keys = Keys::new(b"secret");
        let token = keys.mint("alice", Role::Customer, chrono::Duration::minutes(5)).expect("mint");
        let viewer = keys.viewer(Some(&format!("Bearer {token}")));
        assert!(matches!(viewer, Viewer::User(User { ref id, role: Role::Customer }) if id == "alice"));
    }

    #[test]
    fn a_token_signed_with_another_secret_is_invalid() {
        let token = Keys::new(b"other").mint("alice", Role::Operator, chrono::Duration::minutes(5)).expect("mint");
        assert!(matches!(Keys::new(b"secret").viewer(Some(&format!("Bearer {token}"))), Viewer::Invalid(_)));
    }

    #[test]
    fn an_expired_token_is_invalid_past_the_leeway() {
        let keys = Keys::new(b"secret");
        let token = keys.mint("alice", Role::Customer, chrono::Duration::seconds(-60)).expect("mint");
        assert!(matches!(keys.viewer(Some(&format!("Bearer {token}"))), Viewer::Invalid("the token has expired")));
    }
}
