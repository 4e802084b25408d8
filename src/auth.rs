//! Who is calling: HS256 bearer tokens with the claims `sub`, `role` and `exp`.
//!
//! The user id only ever comes from a verified token, never from a mutation
//! argument. A request without a token may read inventory and nothing else; a
//! missing or bad token on a protected field is `UNAUTHENTICATED`, a role that
//! may not call a field at all is `FORBIDDEN`.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

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
pub(crate) struct Claims {
    /// The user id.
    pub sub: String,
    /// The user's role.
    pub role: Role,
    /// Expiry, seconds since the epoch.
    pub exp: i64,
    /// When the token was issued, seconds since the epoch (optional; checked when given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<i64>,
    /// Not valid before, seconds since the epoch (optional; checked when given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<i64>,
}

/// Shortest accepted HS256 secret: RFC 7518 asks for a key at least as long
/// as the hash (256 bits); a shorter one can be guessed offline from any token.
pub(crate) const MIN_SECRET_BYTES: usize = 32;

/// Seconds a clock may be off between the token's issuer and this server.
const LEEWAY_SECS: i64 = 30;

/// Most tokens kept verified at once (about 300 bytes each); past it the
/// list starts again empty, and each caller's next request verifies anew.
const MAX_VERIFIED: usize = 10_000;

/// A secret too short to sign with.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "STOCKGUARD_JWT_SECRET must be at least {MIN_SECRET_BYTES} bytes, it has {0} \
     (make one with `openssl rand -hex 32`)"
)]
pub struct WeakSecret(pub usize);

/// A verified caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct User {
    /// The user id (`sub`).
    pub id: String,
    /// The role.
    pub role: Role,
}

impl User {
    /// Whether this user is an operator.
    pub(crate) fn is_operator(&self) -> bool {
        self.role == Role::Operator
    }

    /// Whether this user may see an object owned by `owner`.
    pub(crate) fn may_see(&self, owner: &str) -> bool {
        self.is_operator() || self.id == owner
    }
}

/// The caller of one request, put into the GraphQL context by the HTTP layer.
#[derive(Debug, Clone)]
pub(crate) enum Viewer {
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
    /// Longest lifetime accepted, from issue (or from now) to expiry.
    max_ttl_secs: i64,
    /// Tokens that verified, shared by every clone.
    verified: Verified,
}

/// Tokens that verified, by their exact text, with the user each names and
/// its expiry. Checking a token's signature and decoding its claims were 3 %
/// of the server's CPU under `bench load reserve`, where every request of a
/// client carries the same token. Only the very bytes that verified are
/// found here, so nothing unsigned gets in; of the checks that passed then,
/// `nbf`, `iat` and the lifetime cap can only pass later too, and expiry is
/// checked again at every use.
#[derive(Clone, Default)]
struct Verified(Arc<Mutex<HashMap<Box<str>, Kept>>>);

/// A verified token's user and expiry (seconds since the epoch).
type Kept = (User, i64);

impl Verified {
    fn get(&self, token: &str) -> Option<Kept> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).get(token).cloned()
    }

    fn keep(&self, token: &str, user: &User, exp: i64) {
        let mut verified = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if verified.len() >= MAX_VERIFIED {
            verified.clear();
        }
        verified.insert(token.into(), (user.clone(), exp));
    }
}

impl Keys {
    /// Keys for an HS256 secret of at least [`MIN_SECRET_BYTES`], accepting
    /// tokens that live at most `max_ttl_secs`.
    pub fn new(secret: &[u8], max_ttl_secs: i64) -> Result<Self, WeakSecret> {
        if secret.len() < MIN_SECRET_BYTES {
            return Err(WeakSecret(secret.len()));
        }
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = LEEWAY_SECS as u64;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "sub"]);
        Ok(Self {
            encoding: EncodingKey::from_secret(secret),
            decoding: DecodingKey::from_secret(secret),
            validation,
            max_ttl_secs,
            verified: Verified::default(),
        })
    }

    /// A fresh random secret, for a server started without one.
    pub fn random_secret() -> String {
        let bytes: [u8; 32] = rand::random();
        hex::encode(bytes)
    }

    /// Signs a token for `sub` with `role`, valid for `ttl`.
    pub fn mint(&self, sub: &str, role: Role, ttl: chrono::Duration) -> Result<String, jsonwebtoken::errors::Error> {
        let now = chrono::Utc::now();
        let claims =
            Claims { sub: sub.to_owned(), role, exp: (now + ttl).timestamp(), iat: Some(now.timestamp()), nbf: None };
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
    }

    /// Reads the caller from an `Authorization` header value, if any.
    pub(crate) fn viewer(&self, authorization: Option<&str>) -> Viewer {
        self.viewer_at(authorization, chrono::Utc::now().timestamp())
    }

    /// [`Self::viewer`] at `now` (seconds since the epoch) for a token that
    /// verified before; one seen first is verified on the clock.
    fn viewer_at(&self, authorization: Option<&str>, now: i64) -> Viewer {
        let Some(value) = authorization else { return Viewer::Anonymous };
        let Some(token) = value.strip_prefix("Bearer ").map(str::trim) else {
            return Viewer::Invalid("the Authorization header must be `Bearer <token>`");
        };
        if let Some((user, exp)) = self.verified.get(token) {
            return if exp < now - LEEWAY_SECS { Viewer::Invalid("the token has expired") } else { Viewer::User(user) };
        }
        // Only HS256 is in `validation.algorithms`, so `alg: none` and RS256
        // headers are refused before any signature is looked at.
        let claims = match jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation) {
            Ok(data) => data.claims,
            Err(err) => {
                return Viewer::Invalid(match err.kind() {
                    jsonwebtoken::errors::ErrorKind::ExpiredSignature => "the token has expired",
                    jsonwebtoken::errors::ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)",
                    _ => "the token is not valid",
                });
            }
        };
        // A NUL cannot be stored as a user id (PostgreSQL text refuses it).
        if claims.sub.is_empty() || claims.sub.len() > MAX_SUB_LEN || claims.sub.contains('\0') {
            return Viewer::Invalid("the token's subject is empty, too long or holds a NUL");
        }
        if claims.iat.is_some_and(|iat| iat > now + LEEWAY_SECS) {
            return Viewer::Invalid("the token was issued in the future (iat)");
        }
        // The lifetime counts from issue, or from now for a token without `iat`:
        // a stolen long-lived token must not outlast the cap either way.
        if claims.exp - claims.iat.unwrap_or(now).min(now) > self.max_ttl_secs + LEEWAY_SECS {
            return Viewer::Invalid("the token lives longer than this server accepts");
        }
        let user = User { id: claims.sub, role: claims.role };
        self.verified.keep(token, &user, claims.exp);
        Viewer::User(user)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DEFAULT_MAX_TOKEN_TTL_SECS;

    const SECRET: &[u8] = b"a-secret-of-thirty-two-bytes-at-least";

    fn keys(secret: &[u8]) -> Keys {
        Keys::new(secret, DEFAULT_MAX_TOKEN_TTL_SECS).expect("a long enough secret")
    }

    fn signed(claims: serde_json::Value) -> String {
        let key = EncodingKey::from_secret(SECRET);
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key).expect("sign")
    }

    fn read(token: &str) -> Viewer {
        keys(SECRET).viewer(Some(&format!("Bearer {token}")))
    }

    #[test]
    fn a_minted_token_reads_back_as_its_user() {
        let token = keys(SECRET).mint("alice", Role::Customer, chrono::Duration::minutes(5)).expect("mint");
        assert!(matches!(read(&token), Viewer::User(User { ref id, role: Role::Customer }) if id == "alice"));
    }

    #[test]
    fn a_token_signed_with_another_secret_is_invalid() {
        let other = keys(b"another-secret-of-thirty-two-bytes!!");
        let token = other.mint("alice", Role::Operator, chrono::Duration::minutes(5)).expect("mint");
        assert!(matches!(read(&token), Viewer::Invalid(_)));
    }

    #[test]
    fn an_expired_token_is_invalid_past_the_leeway() {
        let token = keys(SECRET).mint("alice", Role::Customer, chrono::Duration::seconds(-60)).expect("mint");
        assert!(matches!(read(&token), Viewer::Invalid("the token has expired")));
    }

    #[test]
    fn a_token_that_verified_expires_all_the_same_and_only_its_own_bytes_are_taken_for_it() {
        let keys = keys(SECRET);
        let now = chrono::Utc::now().timestamp();
        let claims = serde_json::json!({ "sub": "alice", "role": "operator", "exp": now + 300 });
        let token = signed(claims.clone());
        let bearer = format!("Bearer {token}");
        assert!(matches!(keys.viewer(Some(&bearer)), Viewer::User(_)), "verified and kept");
        assert!(matches!(keys.viewer_at(Some(&bearer), now + 60), Viewer::User(_)), "kept, not expired");
        let later = now + 300 + LEEWAY_SECS + 1;
        assert!(matches!(keys.viewer_at(Some(&bearer), later), Viewer::Invalid("the token has expired")));
        // The same header and claims, signed with another secret.
        let other = EncodingKey::from_secret(b"another-secret-of-thirty-two-bytes!!");
        let forged = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &other).expect("sign");
        assert_eq!(forged.rsplit_once('.').map(|(signed, _)| signed), token.rsplit_once('.').map(|(signed, _)| signed));
        assert!(matches!(keys.viewer(Some(&format!("Bearer {forged}"))), Viewer::Invalid("the token is not valid")));
    }

    #[test]
    fn secrets_shorter_than_32_bytes_are_refused() {
        assert!(Keys::new(b"", DEFAULT_MAX_TOKEN_TTL_SECS).is_err());
        assert!(Keys::new(b"abc", DEFAULT_MAX_TOKEN_TTL_SECS).is_err());
        assert!(Keys::new(&[b'x'; 31], DEFAULT_MAX_TOKEN_TTL_SECS).is_err());
        assert!(Keys::new(&[b'x'; 32], DEFAULT_MAX_TOKEN_TTL_SECS).is_ok());
    }

    #[test]
    fn tokens_from_the_future_or_past_the_lifetime_cap_are_invalid() {
        let now = chrono::Utc::now().timestamp();
        let day = DEFAULT_MAX_TOKEN_TTL_SECS;
        let claims = |extra: serde_json::Value| {
            let mut claims = serde_json::json!({ "sub": "alice", "role": "operator", "exp": now + 600 });
            claims.as_object_mut().expect("object").extend(extra.as_object().cloned().unwrap_or_default());
            signed(claims)
        };
        assert!(matches!(read(&claims(serde_json::json!({}))), Viewer::User(_)));
        assert!(matches!(read(&claims(serde_json::json!({ "iat": now - 10, "nbf": now - 10 }))), Viewer::User(_)));
        assert!(matches!(read(&claims(serde_json::json!({ "nbf": now + 120 }))), Viewer::Invalid(_)));
        assert!(matches!(read(&claims(serde_json::json!({ "iat": now + 120 }))), Viewer::Invalid(_)));
        // Within the leeway of 30 s, a clock slightly ahead is fine.
        assert!(matches!(read(&claims(serde_json::json!({ "iat": now + 5, "nbf": now + 5 }))), Viewer::User(_)));
        let forever = signed(serde_json::json!({ "sub": "alice", "role": "operator", "exp": now + 10 * day }));
        assert!(matches!(read(&forever), Viewer::Invalid("the token lives longer than this server accepts")));
        let long = signed(serde_json::json!({ "sub": "a", "role": "operator", "iat": now - day, "exp": now + 600 }));
        assert!(matches!(read(&long), Viewer::Invalid("the token lives longer than this server accepts")));
    }
}
