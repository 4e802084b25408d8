//! Who a caller is, for fair share: the JWT `sub` when signed in, else the
//! client address (the transport works it out, trusted proxies included).

use std::{net::IpAddr, sync::Arc};

use crate::auth::{Role, Viewer};

/// The caller of one operation: who (from the token) and from where.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    /// The token's verdict.
    pub viewer: Viewer,
    /// The client's address: the peer's, or the one a trusted proxy forwarded.
    pub address: IpAddr,
}

impl Caller {
    /// Whose budget an operation spends: the user's when the token verified,
    /// else the address's (a bad token must not earn a budget of its own).
    pub(crate) fn key(&self) -> CallerKey {
        match &self.viewer {
            Viewer::User(user) => CallerKey::User(user.id.as_str().into()),
            Viewer::Anonymous | Viewer::Invalid(_) => CallerKey::Address(self.address),
        }
    }

    /// Whether the caller gets the operators' larger bucket.
    pub(crate) fn is_operator(&self) -> bool {
        matches!(&self.viewer, Viewer::User(user) if user.role == Role::Operator)
    }
}

/// What a caller's account (its bucket and in-flight share) is kept under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum CallerKey {
    /// A signed-in user, by `sub`.
    User(Arc<str>),
    /// An anonymous caller, by client address.
    Address(IpAddr),
}
