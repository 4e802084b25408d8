//! Who a caller is, for fair share: the JWT `sub` when signed in, else the
//! client address (the transport works it out, trusted proxies included);
//! and each caller's share of the operations in flight.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use crate::auth::{Role, Viewer};

/// The caller of one operation: who (from the token) and from where.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The token's verdict.
    pub viewer: Viewer,
    /// The client's address: the peer's, or the one a trusted proxy forwarded.
    pub address: IpAddr,
}

impl Caller {
    /// Whose budget an operation spends: the user's when the token verified,
    /// else the address's (a bad token must not earn a budget of its own).
    pub fn key(&self) -> CallerKey {
        match &self.viewer {
            Viewer::User(user) => CallerKey::User(user.id.as_str().into()),
            Viewer::Anonymous | Viewer::Invalid(_) => CallerKey::Address(self.address),
        }
    }

    /// Whether the caller gets the operators' larger bucket.
    pub fn is_operator(&self) -> bool {
        matches!(&self.viewer, Viewer::User(user) if user.role == Role::Operator)
    }
}

/// What a bucket and an in-flight share are kept under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CallerKey {
    /// A signed-in user, by `sub`.
    User(Arc<str>),
    /// An anonymous caller, by client address.
    Address(IpAddr),
}

/// How many operations each caller has in flight. An entry lives only while
/// its caller has one, so there are never more entries than operations in
/// flight (which the process-wide limit bounds).
pub struct Shares {
    /// Operations in flight by caller (a std Mutex: nothing awaits under it).
    map: Mutex<HashMap<CallerKey, usize>>,
    /// Most operations one caller may have in flight.
    per_caller: usize,
}

impl Shares {
    /// Shares of at most `per_caller` operations each.
    pub fn new(per_caller: usize) -> Arc<Self> {
        Arc::new(Self { map: Mutex::default(), per_caller: per_caller.max(1) })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<CallerKey, usize>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One more operation for `key`, unless it holds its whole share.
    pub fn take(self: &Arc<Self>, key: &CallerKey) -> Option<Share> {
        let mut map = self.lock();
        let held = map.entry(key.clone()).or_insert(0);
        if *held >= self.per_caller {
            return None;
        }
        *held += 1;
        Some(Share { shares: self.clone(), key: key.clone() })
    }
}

/// One operation's place in its caller's share, given back on drop.
pub struct Share {
    shares: Arc<Shares>,
    key: CallerKey,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut map = self.shares.lock();
        if let Some(held) = map.get_mut(&self.key) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                map.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_past_its_share_is_refused_while_others_are_not_and_entries_go_with_the_last() {
        let shares = Shares::new(2);
        let (alice, bob) = (CallerKey::User("alice".into()), CallerKey::User("bob".into()));
        let first = shares.take(&alice).expect("1 of 2");
        let _second = shares.take(&alice).expect("2 of 2");
        assert!(shares.take(&alice).is_none(), "alice holds her whole share");
        let bobs = shares.take(&bob).expect("bob has his own share");
        drop(first);
        assert!(shares.take(&alice).is_some(), "a place given back is free again");
        drop(bobs);
        assert!(!shares.lock().contains_key(&bob), "no entry for a caller with nothing in flight");
    }
}
