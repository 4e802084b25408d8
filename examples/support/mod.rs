//! What the benchmark, its load tool and the soak share: the server under
//! test as a child process, building it, its memory, throw-away databases,
//! the one GraphQL client ([`client`]) and every document they send
//! ([`documents`]).

pub mod client;
pub mod documents;
pub mod formation;

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use sea_orm::sqlx::{self, Connection as _, postgres::PgConnection};
use tokio::process::Child;
use uuid::Uuid;

/// A `stockguard serve` child process on a free port.
pub struct ServerProcess {
    child: Child,
    /// Its process id.
    pub pid: u32,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
}

impl ServerProcess {
    /// Starts `bin` against `database_url` with `secret` and the extra
    /// environment `env`, its log to `stderr`, and waits (60 s at most) until
    /// `/readyz` answers.
    pub async fn start(
        bin: &Path,
        database_url: &str,
        secret: &str,
        env: &[(&str, String)],
        stderr: Stdio,
    ) -> anyhow::Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut child = tokio::process::Command::new(bin)
            .arg("serve")
            .env("DATABASE_URL", database_url)
            .env("STOCKGUARD_ADDR", format!("127.0.0.1:{port}"))
            .env("STOCKGUARD_JWT_SECRET", secret)
            .env("STOCKGUARD_NO_SEED", "true")
            .env("RUST_LOG", "warn")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start the server {}", bin.display()))?;
        let pid = child.id().context("the server exited at once")?;
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait()? {
                bail!("the server exited while starting: {status}");
            }
            if let Ok(response) = http.get(format!("{url}/readyz")).send().await
                && response.status().is_success()
            {
                break;
            }
            if Instant::now() > deadline {
                bail!("the server was not ready within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(Self { child, pid, url })
    }

    /// SIGTERM, then the exit status; a server still running after 15 s is
    /// killed, and that is an error.
    pub async fn stop(mut self) -> anyhow::Result<ExitStatus> {
        let sent = tokio::process::Command::new("kill").arg("-TERM").arg(self.pid.to_string()).status().await?;
        if !sent.success() {
            bail!("kill -TERM {} failed", self.pid);
        }
        match tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await {
            Ok(status) => Ok(status?),
            Err(_) => {
                self.child.kill().await?;
                bail!("the server did not stop within 15 s of SIGTERM; killed it");
            }
        }
    }
}

impl ServerProcess {
    /// Stops the server once `result` (of what ran against it) is in:
    /// `result`'s error first, then a failed stop, then an exit other than
    /// success.
    pub async fn stop_after<T>(self, result: anyhow::Result<T>) -> anyhow::Result<T> {
        let stopped = self.stop().await;
        let value = result?;
        let status = stopped?;
        if !status.success() {
            bail!("the server exited with {status} after SIGTERM");
        }
        Ok(value)
    }
}

/// A line of /proc/<pid>/status in kB (`VmRSS`, `VmHWM`), if the process runs.
pub fn status_kb(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The server binary to run: `given` (`--server-bin`), or else the one of
/// this example's profile, built first.
pub fn server_binary(given: Option<&Path>, example: &str) -> anyhow::Result<PathBuf> {
    let bin = match given {
        Some(bin) => bin.to_path_buf(),
        None => build_server(example)?,
    };
    if !bin.exists() {
        bail!("no server binary at {}", bin.display());
    }
    Ok(bin)
}

/// Builds the server binary of the running example's profile, so one command
/// never measures a stale server. Returns its path.
fn build_server(example: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // target/<profile>/examples/<example>
    let profile_dir = exe.parent().and_then(Path::parent).context("cannot find the target directory")?;
    let target_dir = profile_dir.parent().context("cannot find the target directory")?;
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        Some(name) => name,
        None => bail!("cannot tell the profile from {}", exe.display()),
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("{example}: building the server (profile {profile})");
    // The same selection as `cargo run --example`, so features unify the same
    // way and nothing already built is rebuilt.
    let status = std::process::Command::new(cargo)
        .args(["build", "--quiet", "--profile", profile, "--bins", "--examples", "--manifest-path"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", target_dir)
        .status()
        .context("cannot run cargo to build the server; pass --server-bin")?;
    if !status.success() {
        bail!("building the server failed");
    }
    Ok(profile_dir.join("stockguard"))
}

/// A fresh database on a PostgreSQL server, dropped by [`ThrowAway::drop`].
pub struct ThrowAway {
    /// The server's URL without a database name.
    base: String,
    /// `sg_<example>_<random>`.
    pub name: String,
    /// The database's URL.
    pub url: String,
}

impl ThrowAway {
    /// Creates `sg_<example>_<random>` on the server at `base` (a URL without a database name).
    pub async fn create(base: &str, example: &str) -> anyhow::Result<Self> {
        let base = base.trim_end_matches('/').to_owned();
        let name = format!("sg_{example}_{}", &Uuid::new_v4().simple().to_string()[..12]);
        let url = format!("{base}/{name}");
        stockguard::db::ensure_database(&url).await.with_context(|| format!("cannot create {url}"))?;
        Ok(Self { base, name, url })
    }

    /// Drops the database, ending its connections; a failure is only reported.
    pub async fn drop(self, example: &str) {
        if let Err(err) = drop_database(&self.base, &self.name).await {
            eprintln!("{example}: could not drop {}: {err:#}", self.name);
        }
    }
}

/// A connection to the `postgres` database of the server at `base`.
pub async fn admin(base: &str) -> anyhow::Result<PgConnection> {
    PgConnection::connect(&format!("{base}/postgres"))
        .await
        .with_context(|| format!("cannot connect to {base}/postgres"))
}

/// Drops a throw-away database, ending its connections.
async fn drop_database(base: &str, name: &str) -> anyhow::Result<()> {
    let mut conn = admin(base).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(())
}
