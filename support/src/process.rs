//! The `stockguard` binary as a child process: started on port 0 (it binds
//! the port and says which, so no other process can take it first), waited
//! for until `/readyz` answers, its log kept or passed on, stopped with
//! SIGTERM and killed if anything fails first. The tests attack it, the
//! examples measure it.

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use tokio::process::Child;
use uuid::Uuid;

/// Where a server's log goes.
pub enum Log {
    /// Every line into a file of the harness, read with [`ServerProcess::log`].
    Kept,
    /// Warnings and errors only, to `stderr`: what the operator of an example
    /// should see.
    Warnings(Stdio),
}

/// A running `stockguard serve`, killed when dropped.
pub struct ServerProcess {
    child: Child,
    /// Its process id.
    pub pid: u32,
    /// `127.0.0.1:<port>`, the port it chose.
    pub addr: String,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// Its standard output (and with [`Log::Kept`] its log), removed on drop.
    output: PathBuf,
}

/// What the server prints once it listens, before the address.
const LISTENING: &str = "serving GraphiQL on http://";

impl ServerProcess {
    /// Starts `bin serve` on 127.0.0.1:0 against `database_url`, signing
    /// tokens with `secret` (none: the server makes its own), with no demo
    /// data and the extra environment `env`, and waits (60 s at most) until
    /// it says where it listens and `/readyz` answers.
    pub async fn start<V: AsRef<OsStr>>(
        bin: &Path,
        database_url: &str,
        secret: Option<&str>,
        env: &[(&str, V)],
        log: Log,
    ) -> anyhow::Result<Self> {
        let output = std::env::temp_dir().join(format!("stockguard-{}.log", Uuid::new_v4().simple()));
        let stdout = std::fs::File::create(&output).with_context(|| format!("cannot create {}", output.display()))?;
        let mut command = tokio::process::Command::new(bin);
        command.arg("serve").env("DATABASE_URL", database_url).env("STOCKGUARD_ADDR", "127.0.0.1:0");
        command.env("STOCKGUARD_NO_SEED", "true");
        match secret {
            Some(secret) => command.env("STOCKGUARD_JWT_SECRET", secret),
            None => command.env_remove("STOCKGUARD_JWT_SECRET"),
        };
        let stderr = match log {
            Log::Kept => stdout.try_clone()?.into(),
            Log::Warnings(stderr) => {
                command.env("RUST_LOG", "warn");
                stderr
            }
        };
        let child = command
            .envs(env.iter().map(|(key, value)| (key, value)))
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start the server {}", bin.display()))?;
        let pid = child.id().context("the server exited at once")?;
        let mut server = Self { child, pid, addr: String::new(), url: String::new(), output };
        server.addr = server.announced_address(Duration::from_secs(60)).await?;
        server.url = format!("http://{}", server.addr);
        server.until_ready(Duration::from_secs(60)).await?;
        Ok(server)
    }

    /// The address the server says it listens on.
    async fn announced_address(&mut self, limit: Duration) -> anyhow::Result<String> {
        let started = Instant::now();
        loop {
            if let Some((_, rest)) = self.log().split_once(LISTENING) {
                return Ok(rest.split('/').next().unwrap_or_default().to_owned());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("the server exited before it listened ({status}):\n{}", self.tail());
            }
            if started.elapsed() > limit {
                bail!("the server did not listen within {limit:?}:\n{}", self.tail());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn until_ready(&mut self, limit: Duration) -> anyhow::Result<()> {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
        let started = Instant::now();
        loop {
            if matches!(http.get(format!("{}/readyz", self.url)).send().await, Ok(r) if r.status().is_success()) {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("the server exited while starting ({status}):\n{}", self.tail());
            }
            if started.elapsed() > limit {
                bail!("the server was not ready within {limit:?}:\n{}", self.tail());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// What the server printed to its standard output (all of its log with [`Log::Kept`]).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.output).unwrap_or_default()
    }

    /// The last 20 lines of [`Self::log`], for a failure message.
    pub fn tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// A line of the process's `/proc/<pid>/status` in kB (`VmRSS`, `VmHWM`),
    /// if it runs.
    pub fn status_kb(&self, key: &str) -> Option<u64> {
        status_kb(self.pid, key)
    }

    /// The exit status if the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends SIGTERM, as an orchestrator stopping the process does.
    pub fn terminate(&self) -> anyhow::Result<()> {
        let sent = std::process::Command::new("kill").arg("-TERM").arg(self.pid.to_string()).status()?;
        if !sent.success() {
            bail!("kill -TERM {} failed", self.pid);
        }
        Ok(())
    }

    /// The exit status once the process exits, or an error (with the log's
    /// tail) if it still runs after `limit`.
    pub async fn wait(&mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => Ok(status?),
            Err(_) => bail!("still running after {limit:?}:\n{}", self.tail()),
        }
    }

    /// SIGTERM, then the exit status; a server still running after 15 s is
    /// killed, and that is an error.
    pub async fn stop(mut self) -> anyhow::Result<ExitStatus> {
        self.terminate()?;
        match self.wait(Duration::from_secs(15)).await {
            Ok(status) => Ok(status),
            Err(err) => {
                self.child.kill().await?;
                Err(err.context("the server did not stop within 15 s of SIGTERM; killed it"))
            }
        }
    }

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

impl Drop for ServerProcess {
    /// Kills the process if it still runs (`kill_on_drop`) and removes its output.
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_file(&self.output);
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

/// The server binary an example runs: `given` (`--server-bin`), or else the
/// one of the example's profile, built first.
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
        .arg(crate::workspace().join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", target_dir)
        .status()
        .context("cannot run cargo to build the server; pass --server-bin")?;
    if !status.success() {
        bail!("building the server failed");
    }
    Ok(profile_dir.join("stockguard"))
}
