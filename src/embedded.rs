//! A private PostgreSQL for a machine where none is running: `initdb` once
//! into a project-local folder (kept between runs), `pg_ctl start` on a port of
//! its own, `pg_ctl stop` when the server stops. The tests start theirs, and
//! stop and restart databases of their own, with the same code.
//!
//! PostgreSQL refuses to run as root, so as root its tools run as the
//! `postgres` account, which must be able to enter the folder: a clone under
//! a private directory (`mktemp -d`, `/root`) is out of its reach, and then
//! the cluster lives under `/var/tmp` instead (see [`EmbeddedPostgres::new`]).

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::Output,
};

use tokio::process::Command;

/// What can go wrong with the private cluster; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    /// No `initdb`/`pg_ctl` on this machine.
    #[error(
        "no database: DATABASE_URL is not set, nothing listens on 127.0.0.1:5432, and no PostgreSQL \
         binaries were found to start a private one. Install PostgreSQL (Debian/Ubuntu: \
         `apt-get install postgresql`) or set DATABASE_URL"
    )]
    NoBinaries,
    /// A PostgreSQL tool failed; its output is included.
    #[error("{tool} failed: {output}")]
    Tool {
        /// The command that failed.
        tool: String,
        /// What it printed.
        output: String,
    },
    /// Running as root, no folder the `postgres` account can enter was found.
    #[error("{0}")]
    Unreachable(String),
    /// The file system refused.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A PostgreSQL cluster in a folder of its own.
#[derive(Debug)]
pub struct EmbeddedPostgres {
    /// `initdb`, `pg_ctl`.
    bin_dir: PathBuf,
    /// The cluster's data folder (absolute).
    data_dir: PathBuf,
    /// The TCP port on 127.0.0.1.
    port: u16,
    /// PostgreSQL refuses to run as root: then every tool runs as `postgres`.
    as_postgres_user: bool,
}

impl EmbeddedPostgres {
    /// A cluster in `data_dir` on `port`, with the binaries this machine has.
    ///
    /// As root, when the `postgres` account cannot enter `data_dir` (a parent
    /// of mode 0700), the cluster lives in
    /// `/var/tmp/stockguard-<uid>-<hash of data_dir's path>` instead, owned by
    /// that account and the same on every run from the same folder;
    /// [`Self::data_dir`] says where.
    pub fn new(data_dir: &Path, port: u16) -> Result<Self, EmbeddedError> {
        let bin_dir = find_bin_dir().ok_or(EmbeddedError::NoBinaries)?;
        let data_dir = reachable_by_postgres(data_dir)?;
        Ok(Self { bin_dir, data_dir, port, as_postgres_user: is_root() })
    }

    /// Where the cluster's files are.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The URL of database `name` in this cluster.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Initializes the folder on first use and starts the cluster unless it
    /// already runs. Returns whether this call started it.
    pub async fn start(&self) -> Result<bool, EmbeddedError> {
        if self.as_postgres_user {
            self.run(Command::new("chown").args(["-R", "postgres:postgres"]).arg(&self.data_dir), "chown").await?;
        }
        if !self.data_dir.join("PG_VERSION").exists() {
            let mut initdb = self.tool("initdb");
            initdb.arg("-D").arg(&self.data_dir).args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"]);
            self.run(&mut initdb, "initdb").await?;
        }
        if self.is_running().await {
            return Ok(false);
        }
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories='{}'",
            self.port,
            self.data_dir.display()
        );
        let mut start = self.tool("pg_ctl");
        start
            .arg("start")
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-w", "-t", "60", "-l"])
            .arg(self.data_dir.join("server.log"))
            .arg("-o")
            .arg(options);
        self.run(&mut start, "pg_ctl start").await?;
        Ok(true)
    }

    /// Stops the cluster, finishing nothing: `-m fast` rolls back open transactions.
    pub async fn stop(&self) -> Result<(), EmbeddedError> {
        let mut stop = self.tool("pg_ctl");
        stop.arg("stop").arg("-D").arg(&self.data_dir).args(["-m", "fast", "-w"]);
        self.run(&mut stop, "pg_ctl stop").await
    }

    /// Whether a postmaster runs on this folder.
    pub async fn is_running(&self) -> bool {
        let mut status = self.tool("pg_ctl");
        status.arg("status").arg("-D").arg(&self.data_dir);
        matches!(status.output().await, Ok(out) if out.status.success())
    }

    fn tool(&self, name: &str) -> Command {
        let path = self.bin_dir.join(name);
        if self.as_postgres_user {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(path);
            cmd
        } else {
            Command::new(path)
        }
    }

    async fn run(&self, cmd: &mut Command, tool: &str) -> Result<(), EmbeddedError> {
        let Output { status, stdout, stderr } = cmd.kill_on_drop(true).output().await?;
        if status.success() {
            Ok(())
        } else {
            let output = format!("{}{}", String::from_utf8_lossy(&stdout), String::from_utf8_lossy(&stderr));
            Err(EmbeddedError::Tool { tool: tool.to_owned(), output: output.trim().to_owned() })
        }
    }
}

/// Whether this process runs as root (and so runs PostgreSQL's tools as `postgres`).
pub fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The folder (made if missing) where files wanted in `wanted` go so that
/// PostgreSQL, run as the `postgres` account, can reach them: `wanted`, or,
/// when this process runs as root and `postgres` cannot enter `wanted` (a
/// parent of mode 0700), `/var/tmp/stockguard-<uid>-<hash of wanted's
/// path>`, the same on every run from the same folder.
pub fn reachable_by_postgres(wanted: &Path) -> Result<PathBuf, EmbeddedError> {
    std::fs::create_dir_all(wanted)?;
    let wanted = wanted.canonicalize()?;
    if !is_root() || postgres_can_enter(&wanted) {
        return Ok(wanted);
    }
    let reachable = reachable_home(&wanted)?;
    tracing::info!(
        wanted = %wanted.display(),
        reachable = %reachable.display(),
        "the postgres account cannot enter the wanted folder: PostgreSQL's files go to the reachable one"
    );
    Ok(reachable)
}

/// Whether the `postgres` account can enter `dir` (every folder above it
/// included), asked as that account so that modes and ACLs both count.
fn postgres_can_enter(dir: &Path) -> bool {
    std::process::Command::new("runuser")
        .args(["-u", "postgres", "--", "test", "-x"])
        .arg(dir)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// A folder for the cluster meant for `wanted` that the `postgres` account
/// can enter: `/var/tmp/stockguard-<uid>-<16 hex digits of SHA-256 of
/// wanted's path>`, made by root and handed to `postgres` by [`EmbeddedPostgres::start`].
/// One that exists must be a folder of root's or postgres's, never a link.
fn reachable_home(wanted: &Path) -> Result<PathBuf, EmbeddedError> {
    use sha2::{Digest, Sha256};
    let hash = hex::encode(Sha256::digest(wanted.as_os_str().as_encoded_bytes()));
    let uid = std::fs::metadata("/proc/self")?.uid();
    let home = PathBuf::from(format!("/var/tmp/stockguard-{uid}-{}", &hash[..16]));
    let unusable = |why: &str| {
        EmbeddedError::Unreachable(format!(
            "the postgres account cannot enter {} and {} {why}: make the folders above the project \
             enterable (chmod o+x), run as another user than root, or set DATABASE_URL",
            wanted.display(),
            home.display()
        ))
    };
    match std::fs::symlink_metadata(&home) {
        Ok(meta) if meta.is_dir() && (meta.uid() == 0 || Some(meta.uid()) == postgres_uid()) => {}
        Ok(_) => return Err(unusable("belongs to another account or is not a folder")),
        Err(_) => std::fs::create_dir(&home).map_err(|err| unusable(&format!("cannot be made ({err})")))?,
    }
    if !postgres_can_enter(&home) {
        return Err(unusable("cannot be entered either"));
    }
    Ok(home)
}

/// The `postgres` account's uid.
fn postgres_uid() -> Option<u32> {
    let out = std::process::Command::new("id").args(["-u", "postgres"]).output().ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// `pg_config --bindir` when it has `initdb`, else the newest
/// `/usr/lib/postgresql/*/bin` (Debian keeps the server tools there).
fn find_bin_dir() -> Option<PathBuf> {
    let from_pg_config = std::process::Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    if let Some(dir) = from_pg_config.filter(|dir| dir.join("initdb").exists()) {
        return Some(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder of `mode` under the system's temporary folder, removed on drop.
    struct Private(PathBuf);

    impl Private {
        fn new(mode: u32) -> Self {
            use std::os::unix::fs::PermissionsExt;
            let dir = std::env::temp_dir().join(format!("stockguard-embedded-{}", uuid::Uuid::new_v4().simple()));
            std::fs::create_dir(&dir).expect("a temporary folder");
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).expect("chmod");
            Self(dir)
        }
    }

    impl Drop for Private {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn as_root_a_cluster_out_of_the_postgres_account_s_reach_lives_where_it_can_enter() {
        if find_bin_dir().is_none() {
            return assert!(matches!(EmbeddedPostgres::new(Path::new("unused"), 1), Err(EmbeddedError::NoBinaries)));
        }
        let closed = Private::new(0o700);
        let wanted = closed.0.join("postgres");
        let cluster = EmbeddedPostgres::new(&wanted, 1).expect("a folder for the cluster");
        if is_root() {
            let home = cluster.data_dir().to_owned();
            assert!(home.starts_with("/var/tmp"), "moved out of the 0700 folder: {}", home.display());
            assert!(postgres_can_enter(&home), "the postgres account enters {}", home.display());
            let again = EmbeddedPostgres::new(&wanted, 1).expect("the same folder again");
            assert_eq!(again.data_dir(), home, "the same folder on every run from the same place");
            let _ = std::fs::remove_dir(&home);
        } else {
            assert_eq!(cluster.data_dir(), wanted.canonicalize().expect("made"), "a user's own folder is used as is");
        }
        let open = Private::new(0o755);
        let cluster = EmbeddedPostgres::new(&open.0.join("postgres"), 1).expect("a folder for the cluster");
        assert!(cluster.data_dir().starts_with(open.0.canonicalize().expect("made")), "an enterable folder stays");
    }
}
