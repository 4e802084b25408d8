//! Following the primary: `DATABASE_URL` in libpq's multi-host form
//! (`postgres://h1:p1,h2:p2/db?target_session_attrs=read-write`, as
//! `pg_autoctl show uri` prints it), and the watcher that moves every
//! connection of a process to the host that accepts writes.
//!
//! sqlx connects to one host and knows neither a host list nor
//! `target_session_attrs`, and no well-kept crate adds them to sqlx's pool.
//! So this module does what libpq does, in two parts:
//!
//! - [`parse`] splits the URL into one single-host URL per host, and decides
//!   whether a server must accept writes: with `target_session_attrs=read-write`
//!   (or `primary`), and by default when there is more than one host
//!   (Stockguard writes; a standby is of no use to it).
//! - [`Primary`] knows which host accepted writes last. The pool opens
//!   connections to that host only (`Pool::set_connect_options`); a new
//!   connection is checked with `SHOW transaction_read_only` and refused when
//!   the server is read-only (sqlx then retries it, with the options as they
//!   are by then). With several hosts a watcher task keeps one connection of
//!   its own to the current host and asks it every [`HEARTBEAT`] whether it
//!   still accepts writes; when it does not, or a new connection found a
//!   read-only server, the watcher tries every host in turn until one
//!   accepts writes, and points the pool there. Connections opened before
//!   that moment are closed when they are next handed out or given back, so
//!   nothing keeps talking to the old primary. The statement pool and the
//!   live listener open their connections with the pool's current options,
//!   so they follow too.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use sea_orm::sqlx::{
    self, Connection as _,
    pool::PoolConnectionMetadata,
    postgres::{PgConnectOptions, PgConnection, PgPool},
};
use tokio::sync::Notify;

/// How often the watcher asks the current host whether it still accepts writes.
const HEARTBEAT: Duration = Duration::from_millis(500);

/// How long the watcher waits before it tries every host again when none accepts writes.
const RESCAN_AFTER: Duration = Duration::from_millis(200);

/// The servers a `DATABASE_URL` names, and what Stockguard needs of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// One URL per host, in the order given, each naming only that host
    /// (user, database and parameters as given, `target_session_attrs` left out).
    pub hosts: Vec<String>,
    /// Whether a server must accept writes to be used.
    pub read_write: bool,
}

/// Why a `DATABASE_URL` cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UrlError {
    /// Not `postgres://...` or `postgresql://...`.
    #[error("DATABASE_URL must start with postgres:// or postgresql://")]
    Scheme,
    /// An empty entry in the host list (`h1,,h2`).
    #[error("DATABASE_URL has an empty host in its host list")]
    EmptyHost,
    /// A `target_session_attrs` that would let Stockguard write to a standby.
    #[error("DATABASE_URL: target_session_attrs={0} is not supported (Stockguard writes: use read-write or any)")]
    SessionAttrs(String),
}

/// Splits a libpq-style URL with one or more hosts into one URL per host.
pub(crate) fn parse(url: &str) -> Result<Target, UrlError> {
    let (scheme, rest) = url.split_once("://").ok_or(UrlError::Scheme)?;
    if scheme != "postgres" && scheme != "postgresql" {
        return Err(UrlError::Scheme);
    }
    // The authority ends at the path or the query; neither a host list nor
    // (percent-encoded) user info holds a '/' or a '?'.
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path_and_query) = rest.split_at(authority_end);
    let (userinfo, host_list) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, authority),
    };
    let (path, query) = match path_and_query.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path_and_query, None),
    };
    let mut session_attrs = None;
    let kept: Vec<&str> = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|pair| match pair.split_once('=') {
            Some(("target_session_attrs", value)) => {
                session_attrs = Some(value.to_owned());
                false
            }
            _ => !pair.is_empty(),
        })
        .collect();
    let hosts: Vec<&str> = host_list.split(',').collect();
    // One empty host is libpq's default (a local socket); an empty entry in a list is a typo.
    if hosts.len() > 1 && hosts.iter().any(|host| host.is_empty()) {
        return Err(UrlError::EmptyHost);
    }
    let read_write = match session_attrs.as_deref() {
        None => hosts.len() > 1,
        Some("any") => false,
        Some("read-write" | "primary") => true,
        Some(other) => return Err(UrlError::SessionAttrs(other.to_owned())),
    };
    let userinfo = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    let query = if kept.is_empty() { String::new() } else { format!("?{}", kept.join("&")) };
    let hosts = hosts.iter().map(|host| format!("{scheme}://{userinfo}{host}{path}{query}")).collect();
    Ok(Target { hosts, read_write })
}

/// Whether `conn`'s server accepts writes: `transaction_read_only` is off
/// (on for a hot standby and for a database set
/// `default_transaction_read_only`: libpq's `read-write` test).
pub(crate) async fn accepts_writes(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    let read_only: String = sqlx::query_scalar("SHOW transaction_read_only").fetch_one(conn).await?;
    Ok(read_only == "off")
}

/// Which host of a [`Target`] a process's pool talks to, and the watcher
/// that moves it when that host stops accepting writes. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Primary {
    inner: Arc<Inner>,
}

struct Inner {
    /// `(host, port)` of every host, in the URL's order.
    hosts: Vec<(String, u16)>,
    /// Whether a server must accept writes (see [`Target::read_write`]).
    read_write: bool,
    /// The index in `hosts` of the host the pool opens connections to.
    current: Mutex<usize>,
    /// When the pool was last pointed at another host: connections opened
    /// before are closed instead of being used again.
    moved_at: Mutex<Option<Instant>>,
    /// Wakes the watcher early: a new connection found a read-only server.
    suspect: Notify,
}

impl Primary {
    /// The hosts of `target`; the pool starts on the first.
    pub(crate) fn new(target: &Target) -> Result<Self, sqlx::Error> {
        let hosts = target
            .hosts
            .iter()
            .map(|url| url.parse::<PgConnectOptions>().map(|o| (o.get_host().to_owned(), o.get_port())))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            inner: Arc::new(Inner {
                hosts,
                read_write: target.read_write,
                current: Mutex::new(0),
                moved_at: Mutex::new(None),
                suspect: Notify::new(),
            }),
        })
    }

    /// Whether there is anywhere to move to.
    pub(crate) fn has_alternatives(&self) -> bool {
        self.inner.hosts.len() > 1
    }

    /// `template` pointed at host `index`.
    fn options_for(&self, template: &PgConnectOptions, index: usize) -> PgConnectOptions {
        let (host, port) = &self.inner.hosts[index];
        template.clone().host(host).port(*port)
    }

    /// The first host, from the current one on, that accepts a connection
    /// (and writes, when required) within `timeout` per host; tried until
    /// `deadline`. Makes it the current host and returns its index and the
    /// connection. The error says what each host answered.
    pub(crate) async fn find(
        &self,
        template: &PgConnectOptions,
        timeout: Duration,
        deadline: Instant,
    ) -> Result<(usize, PgConnection), sqlx::Error> {
        loop {
            let start = self.current();
            let mut answers = Vec::new();
            for step in 0..self.inner.hosts.len() {
                let index = (start + step) % self.inner.hosts.len();
                let options = self.options_for(template, index);
                match self.try_host(&options, timeout).await {
                    Ok(conn) => {
                        *lock(&self.inner.current) = index;
                        return Ok((index, conn));
                    }
                    Err(why) => {
                        let (host, port) = &self.inner.hosts[index];
                        answers.push(format!("{host}:{port}: {why}"));
                    }
                }
            }
            if Instant::now() + RESCAN_AFTER >= deadline {
                let what = if self.inner.read_write { "accepts writes" } else { "answers" };
                return Err(sqlx::Error::Configuration(
                    format!("no host of DATABASE_URL {what} ({})", answers.join("; ")).into(),
                ));
            }
            tokio::time::sleep(RESCAN_AFTER).await;
        }
    }

    /// A connection to one host, if it answers (and accepts writes, when required).
    async fn try_host(&self, options: &PgConnectOptions, timeout: Duration) -> Result<PgConnection, String> {
        let mut conn = match tokio::time::timeout(timeout, PgConnection::connect_with(options)).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(err)) => return Err(err.to_string()),
            Err(_) => return Err(format!("no answer within {timeout:?}")),
        };
        match tokio::time::timeout(timeout, self.usable(&mut conn)).await {
            Ok(Ok(true)) => Ok(conn),
            Ok(Ok(false)) => Err("read-only".into()),
            Ok(Err(err)) => Err(err.to_string()),
            Err(_) => Err(format!("no answer within {timeout:?}")),
        }
    }

    /// Whether `conn`'s server is one to use: it answers, and accepts writes
    /// when that is required.
    pub(crate) async fn usable(&self, conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
        if !self.inner.read_write {
            return conn.ping().await.map(|()| true);
        }
        accepts_writes(conn).await
    }

    /// The pool's `after_connect`: refuses a connection to a server that does
    /// not accept writes (when that is required), and wakes the watcher.
    pub(crate) async fn check_new(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        // A fresh connection answered its startup: without the write check
        // there is nothing more to ask (and no round trip to spend).
        if !self.inner.read_write || self.usable(conn).await? {
            return Ok(());
        }
        self.inner.suspect.notify_one();
        Err(sqlx::Error::Configuration("the server does not accept writes (read-only); looking for the primary".into()))
    }

    /// The pool's `before_acquire` and `after_release`: whether a connection
    /// may be used again, i.e. was opened after the pool last moved.
    pub(crate) fn keep(&self, meta: &PoolConnectionMetadata) -> bool {
        let Some(moved_at) = *lock(&self.inner.moved_at) else { return true };
        Instant::now().checked_sub(meta.age).is_none_or(|opened| opened >= moved_at)
    }

    fn current(&self) -> usize {
        *lock(&self.inner.current)
    }

    /// Starts the watcher of `pool` (only worth it with several hosts). It
    /// ends when the pool is closed.
    pub(crate) fn watch(&self, pool: PgPool, timeout: Duration) {
        let this = self.clone();
        tokio::spawn(async move { this.run_watcher(pool, timeout).await });
    }

    async fn run_watcher(&self, pool: PgPool, timeout: Duration) {
        let mut probe: Option<PgConnection> = None;
        loop {
            tokio::select! {
                () = self.inner.suspect.notified() => {}
                () = tokio::time::sleep(HEARTBEAT) => {}
                () = pool.close_event() => return,
            }
            if let Some(conn) = probe.as_mut()
                && matches!(tokio::time::timeout(timeout, self.usable(conn)).await, Ok(Ok(true)))
            {
                continue;
            }
            probe = None;
            let before = self.current();
            let template = pool.connect_options();
            // Until a host is found or the pool closes: the deadline is far away.
            let far = Instant::now() + Duration::from_secs(365 * 24 * 3600);
            let found = tokio::select! {
                found = self.find(&template, timeout, far) => found,
                () = pool.close_event() => return,
            };
            let Ok((index, conn)) = found else { continue };
            probe = Some(conn);
            if index != before {
                *lock(&self.inner.moved_at) = Some(Instant::now());
                pool.set_connect_options(self.options_for(&template, index));
                let (host, port) = &self.inner.hosts[index];
                tracing::warn!(host, port, "the primary moved: new connections go to {host}:{port}");
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_list_becomes_one_url_per_host_that_must_accept_writes() {
        let target = parse("postgres://u:p@h1:6001,h2:6002/shop?target_session_attrs=read-write&sslmode=disable")
            .expect("parses");
        assert_eq!(
            target,
            Target {
                hosts: vec![
                    "postgres://u:p@h1:6001/shop?sslmode=disable".into(),
                    "postgres://u:p@h2:6002/shop?sslmode=disable".into()
                ],
                read_write: true,
            }
        );
    }

    #[test]
    fn one_host_is_used_as_given_and_several_need_writes_by_default() {
        let one = parse("postgres://postgres@127.0.0.1:5432/stockguard").expect("parses");
        assert_eq!(
            one,
            Target { hosts: vec!["postgres://postgres@127.0.0.1:5432/stockguard".into()], read_write: false }
        );
        let two = parse("postgresql://a,b:5433").expect("parses");
        assert_eq!(two.hosts, vec!["postgresql://a", "postgresql://b:5433"]);
        assert!(two.read_write, "several hosts: Stockguard needs the writable one");
        let any = parse("postgres://a,b/db?target_session_attrs=any").expect("parses");
        assert!(!any.read_write);
        let primary = parse("postgres://[::1]:5432/db?target_session_attrs=primary").expect("parses");
        assert_eq!((primary.hosts, primary.read_write), (vec!["postgres://[::1]:5432/db".to_owned()], true));
    }

    #[test]
    fn bad_urls_are_refused_with_what_is_wrong() {
        assert_eq!(parse("mysql://h/db"), Err(UrlError::Scheme));
        assert_eq!(parse("h1,h2/db"), Err(UrlError::Scheme));
        assert_eq!(parse("postgres://h1,,h2/db"), Err(UrlError::EmptyHost));
        assert_eq!(parse("postgres://h1,/db"), Err(UrlError::EmptyHost));
        assert_eq!(
            parse("postgres://h1,h2/db?target_session_attrs=standby"),
            Err(UrlError::SessionAttrs("standby".into()))
        );
    }
}
