//! The PostgreSQL releases Stockguard runs on, and whether the server on
//! this machine's usual address can be used without a `DATABASE_URL`.
//!
//! Without a URL the server and the tests connect as `postgres` with no
//! password. Seeing a port open is not enough to know that works: a server
//! from a distribution's package (`apt-get install postgresql`) listens on
//! 5432 and asks for a password over TCP, and an older release listens just
//! as well but fails half-way through the migrations. So [`probe`] opens a
//! real connection and reads the release; whatever it cannot use, it says
//! why, and the caller starts a private cluster instead (`embedded`).

use std::{fmt, net::SocketAddr, time::Duration};

use sea_orm::{
    ConnectionTrait, DbErr,
    sqlx::{self, Connection as _, postgres::PgConnection},
};

/// The oldest release Stockguard runs on, as `server_version_num` spells
/// it: the migrations use `NULLS NOT DISTINCT` (PostgreSQL 15).
pub(crate) const MIN_SERVER_VERSION_NUM: u32 = 150_000;

/// Where a PostgreSQL on this machine usually listens.
pub const USUAL_ADDR: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 5432);

/// How long the probe waits for a server that accepted the TCP connection
/// to let it in and answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// A PostgreSQL release, as `server_version_num` numbers it (150020 is 15.20).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Release(pub u32);

impl Release {
    /// The oldest release Stockguard runs on.
    pub(crate) const MIN: Self = Self(MIN_SERVER_VERSION_NUM);

    /// The release a version string names, as `initdb --version` or
    /// `SHOW server_version` print it: `15.20`, `16.4 (Debian 16.4-1)`,
    /// `initdb (PostgreSQL) 17.0`, `18beta1`, `9.6.24`.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let version = text.rsplit_once("(PostgreSQL)").map_or(text, |(_, after)| after).trim_start();
        let mut numbers = version
            .split(|c: char| !c.is_ascii_digit() && c != '.')
            .next()?
            .split('.')
            .map(|part| part.parse::<u32>().ok());
        let major = numbers.next()??;
        let minor = numbers.next().flatten().unwrap_or(0);
        if major >= 10 {
            Some(Self(major * 10_000 + minor))
        } else {
            // Before 10 a major release had two numbers (9.6) and a minor a third.
            let patch = numbers.next().flatten().unwrap_or(0);
            Some(Self(major * 10_000 + minor * 100 + patch))
        }
    }

    /// The major release: 15 for 15.20, 9 for 9.6.24.
    pub(crate) fn major(self) -> u32 {
        self.0 / 10_000
    }

    /// Stockguard runs on it, or the error that says it does not.
    pub(crate) fn require_supported(self) -> Result<Self, TooOld> {
        if self >= Self::MIN { Ok(self) } else { Err(TooOld(self)) }
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (major, rest) = (self.major(), self.0 % 10_000);
        if major >= 10 { write!(f, "{major}.{rest}") } else { write!(f, "{major}.{}.{}", rest / 100, rest % 100) }
    }
}

/// A release older than [`Release::MIN`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("it is PostgreSQL {0}, and Stockguard needs {min} or newer", min = Release::MIN.major())]
pub struct TooOld(pub Release);

/// The release of the server `db` is connected to.
pub(crate) async fn release(db: &impl ConnectionTrait) -> Result<Release, DbErr> {
    let row = db
        .query_one_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            "SELECT current_setting('server_version_num')::int AS num",
        ))
        .await?
        .ok_or_else(|| DbErr::Custom("SELECT current_setting('server_version_num') returned no row".into()))?;
    let num: i32 = row.try_get("", "num")?;
    Ok(Release(num.try_into().map_err(|_| DbErr::Custom(format!("server_version_num {num}")))?))
}

/// Why the PostgreSQL at an address cannot be used without a URL; the
/// message completes "the PostgreSQL on <address> cannot be used: ".
#[derive(Debug, thiserror::Error)]
pub enum Unusable {
    /// The connection was refused: nothing listens on the port.
    #[error("nothing listens there")]
    NothingListens,
    /// Something listens but did not let `postgres` in without a password
    /// (or refused it otherwise); the server's own words.
    #[error("it refused the connection ({0})")]
    Refused(String),
    /// Something listens but did not answer in time.
    #[error("it did not answer within {} s", PROBE_TIMEOUT.as_secs())]
    Silent,
    /// It let `postgres` in, but its release is too old.
    #[error(transparent)]
    TooOld(#[from] TooOld),
}

/// Connects to the server on `addr` as `postgres` with no password (the
/// way the server and the tests would without a URL; `PGPASSWORD` and
/// `~/.pgpass` count, as they do for every connection sqlx makes) and
/// reads its release: the release when Stockguard can use it, otherwise
/// why not.
pub async fn probe(addr: SocketAddr) -> Result<Release, Unusable> {
    let url = format!("postgres://postgres@{addr}/postgres");
    let asked = tokio::time::timeout(PROBE_TIMEOUT, async {
        let mut conn = PgConnection::connect(&url).await?;
        let num: i32 =
            sqlx::query_scalar("SELECT current_setting('server_version_num')::int").fetch_one(&mut conn).await?;
        let _ = conn.close().await;
        Ok::<_, sqlx::Error>(num)
    })
    .await;
    match asked {
        Err(_) => Err(Unusable::Silent),
        Ok(Err(sqlx::Error::Io(err))) if err.kind() == std::io::ErrorKind::ConnectionRefused => {
            Err(Unusable::NothingListens)
        }
        Ok(Err(sqlx::Error::Database(err))) => Err(Unusable::Refused(err.message().to_owned())),
        Ok(Err(err)) => Err(Unusable::Refused(err.to_string())),
        Ok(Ok(num)) => Ok(Release(u32::try_from(num).unwrap_or(0)).require_supported()?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_read_from_every_way_postgresql_prints_them() {
        assert_eq!(Release::parse("15.20"), Some(Release(150_020)));
        assert_eq!(Release::parse("initdb (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)"), Some(Release(150_020)));
        assert_eq!(Release::parse("initdb (PostgreSQL) 17.0"), Some(Release(170_000)));
        assert_eq!(Release::parse("16.4 (Homebrew)"), Some(Release(160_004)));
        assert_eq!(Release::parse("initdb (PostgreSQL) 18beta1"), Some(Release(180_000)));
        assert_eq!(Release::parse("9.6.24"), Some(Release(90_624)));
        assert_eq!(Release::parse("initdb: command not found"), None);
        assert_eq!(Release(90_624).to_string(), "9.6.24");
        assert_eq!(Release(140_011).to_string(), "14.11");
    }

    #[test]
    fn a_release_older_than_15_is_refused_with_what_it_is_and_what_is_needed() {
        let refused = Release(140_011).require_supported().expect_err("14 is too old");
        assert_eq!(refused.to_string(), "it is PostgreSQL 14.11, and Stockguard needs 15 or newer");
        assert_eq!(
            Unusable::from(refused).to_string(),
            "it is PostgreSQL 14.11, and Stockguard needs 15 or newer",
            "the probe's reason reads the same"
        );
        assert!(Release(90_624).require_supported().is_err());
        assert_eq!(Release(150_000).require_supported(), Ok(Release(150_000)));
        assert_eq!(Release(180_001).require_supported(), Ok(Release(180_001)));
    }
}
