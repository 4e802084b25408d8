//! A private PostgreSQL for a machine where none is running: `initdb` once
//! into a project-local folder (kept between runs), `pg_ctl start` on a port of
//! its own, `pg_ctl stop` when the server stops. The same code serves the
//! tests that need to stop and restart a database of their own.

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
    pub fn new(data_dir: &Path, port: u16) -> Result<Self, EmbeddedError> {
        let bin_dir = find_bin_dir().ok_or(EmbeddedError::NoBinaries)?;
        std::fs::create_dir_all(data_dir)?;
        let data_dir = data_dir.canonicalize()?;
        let as_postgres_user = std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false);
        Ok(Self { bin_dir, data_dir, port, as_postgres_user })
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

    async fn is_running(&self) -> bool {
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

/// The port of the tests' private PostgreSQL, beside the server's.
const TEST_PORT: u16 = 54339;

/// The PostgreSQL server the tests (the integration tests and this crate's
/// own) create their databases on: `STOCKGUARD_TEST_DATABASE_URL` if set;
/// else the server on 127.0.0.1:5432 if one listens; else a private cluster
/// in `target/test-postgres` from the installed binaries, as the server
/// itself does without a database, started by the first test that needs it
/// and left running for the next run (`pg_ctl -D target/test-postgres stop`
/// stops it). `Err` is one line saying what is missing. Found once per process.
pub fn test_server_url() -> Result<String, String> {
    static FOUND: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    FOUND.get_or_init(find_test_server).clone()
}

fn find_test_server() -> Result<String, String> {
    if let Ok(url) = std::env::var("STOCKGUARD_TEST_DATABASE_URL") {
        return Ok(url);
    }
    let local: std::net::SocketAddr = ([127, 0, 0, 1], 5432).into();
    if std::net::TcpStream::connect_timeout(&local, std::time::Duration::from_millis(500)).is_ok() {
        return Ok("postgres://postgres@127.0.0.1:5432".to_owned());
    }
    let data_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-postgres");
    // Its own thread and runtime: the tests ask from inside theirs, and
    // starting the cluster awaits its tools.
    let started = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        runtime.block_on(async {
            let cluster = EmbeddedPostgres::new(&data_dir, TEST_PORT).map_err(|err| match err {
                EmbeddedError::NoBinaries => "no PostgreSQL for the tests: nothing listens on 127.0.0.1:5432, \
                     STOCKGUARD_TEST_DATABASE_URL is not set, and no PostgreSQL binaries are installed \
                     (Debian/Ubuntu: `apt-get install postgresql`)"
                    .to_owned(),
                other => other.to_string(),
            })?;
            // Another test process may be starting the same cluster: then it runs soon.
            let url = format!("postgres://postgres@127.0.0.1:{TEST_PORT}");
            let mut last = String::new();
            for _ in 0..60 {
                match cluster.start().await {
                    Ok(_) => return Ok(url),
                    Err(err) => last = err.to_string(),
                }
                if cluster.is_running().await {
                    return Ok(url);
                }
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(format!("the tests' private PostgreSQL (target/test-postgres) did not start: {last}"))
        })
    });
    started.join().unwrap_or_else(|_| Err("the thread that starts the tests' PostgreSQL panicked".into()))
}
