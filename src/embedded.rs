//! A private PostgreSQL for a machine whose own cannot be used (none runs,
//! it asks for a password, it is too old: `db::local`): `initdb` once into a
//! project-local folder (kept between runs), `pg_ctl start` on a port of its
//! own, `pg_ctl stop` when the server stops. The tests start theirs, and stop
//! and restart databases of their own, with the same code.
//!
//! The binaries are the newest release of at least 15 (as `initdb --version`
//! reports it) among the places the usual packages put them: `pg_config
//! --bindir`, `initdb` on `PATH`, Debian's and Ubuntu's
//! `/usr/lib/postgresql/*/bin`, the PGDG packages' `/usr/pgsql-*/bin` on
//! Fedora and RHEL, and Homebrew's `postgresql@*` (see [`find_bin_dir`]).
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

use crate::db::local::Release;

/// What can go wrong with the private cluster; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    /// No `initdb`/`pg_ctl` of a release Stockguard runs on on this machine;
    /// what was found, if anything, is older.
    #[error(
        "no server binaries of PostgreSQL {min} or newer were found{found} (Debian/Ubuntu: `apt-get install \
         postgresql`; Fedora/RHEL: `dnf install postgresql-server`; macOS: `brew install postgresql@17`)",
        min = Release::MIN.major(),
        found = found_too_old(.0)
    )]
    NoBinaries(Vec<(Release, PathBuf)>),
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
        let bin_dir = find_bin_dir()?;
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

/// The folder of `initdb` and `pg_ctl` of the newest release Stockguard
/// runs on among those installed where packages put them (see the module's
/// doc); the older ones found, if that is all there is.
fn find_bin_dir() -> Result<PathBuf, EmbeddedError> {
    let mut found: Vec<(Release, PathBuf)> = Vec::new();
    for dir in candidate_bin_dirs() {
        let Ok(dir) = dir.canonicalize() else { continue };
        if !dir.join("pg_ctl").exists() || found.iter().any(|(_, seen)| *seen == dir) {
            continue;
        }
        if let Some(release) = initdb_release(&dir) {
            found.push((release, dir));
        }
    }
    found.sort();
    match found.pop() {
        Some((release, dir)) if release >= Release::MIN => Ok(dir),
        newest => {
            found.extend(newest);
            Err(EmbeddedError::NoBinaries(found))
        }
    }
}

/// Folders that may hold the server's binaries, with `initdb` in them.
fn candidate_bin_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let pg_config =
        std::process::Command::new("pg_config").arg("--bindir").stderr(std::process::Stdio::null()).output();
    if let Some(out) = pg_config.ok().filter(|out| out.status.success()) {
        dirs.push(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    }
    // `initdb` on PATH is often a link (`/usr/local/bin/initdb`): its real
    // folder has `pg_ctl` beside it.
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(
            std::env::split_paths(&path)
                .filter_map(|dir| dir.join("initdb").canonicalize().ok()?.parent().map(Path::to_path_buf)),
        );
    }
    // Debian and Ubuntu: /usr/lib/postgresql/<major>/bin; the PGDG packages
    // on Fedora and RHEL: /usr/pgsql-<major>/bin; Homebrew on Apple silicon
    // and on Intel: <prefix>/opt/postgresql@<major>/bin.
    let globbed = [
        ("/usr/lib/postgresql", ""),
        ("/usr/", "pgsql-"),
        ("/opt/homebrew/opt", "postgresql@"),
        ("/usr/local/opt", "postgresql@"),
    ];
    for (parent, prefix) in globbed {
        let Ok(entries) = std::fs::read_dir(parent) else { continue };
        dirs.extend(
            entries
                .filter_map(Result::ok)
                .filter(|entry| entry.file_name().to_str().is_some_and(|name| name.starts_with(prefix)))
                .map(|entry| entry.path().join("bin")),
        );
    }
    dirs.retain(|dir| dir.join("initdb").exists());
    dirs
}

/// The release `initdb --version` in `dir` reports.
fn initdb_release(dir: &Path) -> Option<Release> {
    let out = std::process::Command::new(dir.join("initdb")).arg("--version").output().ok()?;
    out.status.success().then(|| Release::parse(&String::from_utf8_lossy(&out.stdout))).flatten()
}

/// ", only PostgreSQL 14.11 (<dir>)" for the older binaries found, or nothing.
fn found_too_old(found: &[(Release, PathBuf)]) -> String {
    if found.is_empty() {
        return String::new();
    }
    let each: Vec<String> = found.iter().map(|(release, dir)| format!("{release} ({})", dir.display())).collect();
    format!(", only PostgreSQL {}", each.join(", "))
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
    fn the_binaries_found_are_the_newest_release_of_at_least_15() {
        match find_bin_dir() {
            Ok(dir) => {
                let release = initdb_release(&dir).expect("initdb reports its release");
                assert!(release >= Release::MIN, "{release} in {}", dir.display());
                let newest = candidate_bin_dirs().iter().filter_map(|dir| initdb_release(dir)).max();
                assert_eq!(Some(release), newest, "the newest of {:?}", candidate_bin_dirs());
            }
            Err(EmbeddedError::NoBinaries(older)) => assert!(older.iter().all(|(release, _)| *release < Release::MIN)),
            Err(other) => panic!("{other}"),
        }
    }

    #[test]
    fn only_older_binaries_are_named_in_the_error() {
        let older = EmbeddedError::NoBinaries(vec![(Release(140_011), PathBuf::from("/usr/lib/postgresql/14/bin"))]);
        let message = older.to_string();
        assert!(
            message.starts_with(
                "no server binaries of PostgreSQL 15 or newer were found, only PostgreSQL 14.11 \
                 (/usr/lib/postgresql/14/bin) (Debian/Ubuntu:"
            ),
            "{message}"
        );
        assert!(!EmbeddedError::NoBinaries(Vec::new()).to_string().contains("only"));
    }

    #[test]
    fn as_root_a_cluster_out_of_the_postgres_account_s_reach_lives_where_it_can_enter() {
        if find_bin_dir().is_err() {
            return assert!(matches!(EmbeddedPostgres::new(Path::new("unused"), 1), Err(EmbeddedError::NoBinaries(_))));
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
