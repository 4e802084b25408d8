//! A local production topology on loopback ports, from Debian's packages:
//! a pg_auto_failover monitor and two data nodes (a primary and a
//! synchronous standby), three Stockguard processes sharing one secret and
//! the multi-host `DATABASE_URL` that `pg_autoctl show uri` prints, and
//! HAProxy in front of them, checking `/readyz`. Everything lives under one
//! folder (`target/cluster` by default); [`Formation::down`] stops what
//! [`Formation::up`] started and removes the folder.
//!
//! PostgreSQL and pg_autoctl refuse to run as root, so as root they run as
//! the `postgres` user (`runuser`), which owns the folder.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use sea_orm::sqlx::{self, Connection as _, postgres::PgConnection};
use stockguard::embedded::is_root;

/// Loopback ports, from `base`: the monitor, the two nodes, HAProxy, the apps.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    /// The first port; the others follow it.
    pub base: u16,
}

impl Ports {
    pub fn monitor(self) -> u16 {
        self.base
    }
    pub fn node(self, n: usize) -> u16 {
        self.base + n as u16
    }
    pub fn haproxy(self) -> u16 {
        self.base + 80
    }
    pub fn app(self, n: usize) -> u16 {
        self.base + 80 + n as u16
    }
}

/// How many Stockguard processes serve the formation.
pub const APPS: usize = 3;

/// How long a Stockguard process drains after SIGTERM: above HAProxy's
/// check interval × fall (250 ms × 2), so no new request meets a closed port.
const SHUTDOWN_DELAY_MS: u64 = 1500;

/// The formation under one folder.
pub struct Formation {
    /// The folder that holds everything.
    pub dir: PathBuf,
    /// Its ports.
    pub ports: Ports,
    /// PostgreSQL's binaries, put first on pg_autoctl's `PATH`.
    bindir: PathBuf,
    /// Run PostgreSQL's tools as `postgres` (we are root).
    as_postgres: bool,
}

/// One data node as the monitor reports it.
#[derive(Debug, Clone)]
pub struct NodeState {
    /// `node1` or `node2`.
    pub name: String,
    /// Its port.
    pub port: u16,
    /// What the node reports (`primary`, `secondary`, `wait_primary`, ...).
    pub reported: String,
    /// What the monitor assigned.
    pub assigned: String,
}

/// PostgreSQL's binaries of the version pg_auto_failover was installed for
/// (pg_autoctl runs them), once pg_autoctl and haproxy are known to be installed;
/// `Err` names what is missing, in one line.
pub fn find_tools() -> anyhow::Result<PathBuf> {
    // The PostgreSQL version pg_auto_failover's extension was installed for.
    let bindir = std::fs::read_dir("/usr/share/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|version| version.path().join("extension/pgautofailover.control").exists())
        .map(|version| Path::new("/usr/lib/postgresql").join(version.file_name()).join("bin"))
        .filter(|bin| bin.join("pg_ctl").exists())
        .max();
    let missing: Vec<&str> = [("pg_autoctl", "postgresql-15-auto-failover"), ("haproxy", "haproxy")]
        .into_iter()
        .filter(|(tool, _)| !which(tool))
        .map(|(_, package)| package)
        .collect();
    match bindir {
        _ if !missing.is_empty() => bail!("not installed: apt-get install {}", missing.join(" ")),
        None => bail!(
            "no pg_auto_failover extension for an installed PostgreSQL: apt-get install postgresql-15-auto-failover"
        ),
        Some(bindir) => Ok(bindir),
    }
}

fn which(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).chain([PathBuf::from("/usr/sbin")]).any(|d| d.join(tool).exists()))
        .unwrap_or(false)
}

impl Formation {
    /// The formation in `dir` on ports from `base`; `Err` when a tool is missing.
    pub fn new(dir: &Path, base: u16) -> anyhow::Result<Self> {
        let bindir = find_tools()?;
        Ok(Self { dir: dir.to_path_buf(), ports: Ports { base }, bindir, as_postgres: is_root() })
    }

    /// The default folder: `target/cluster` of this checkout, or, as root
    /// from a checkout the `postgres` account cannot enter (a parent of
    /// mode 0700), `cluster` in the folder the private PostgreSQL would use
    /// instead (`stockguard::embedded::reachable_by_postgres`).
    pub fn default_dir() -> PathBuf {
        Self::dir_in(&crate::workspace().join("target"))
    }

    /// `cluster` in `target`, or, as root when the `postgres` account cannot
    /// enter `target`, in the folder the private PostgreSQL would use instead.
    pub fn dir_in(target: &Path) -> PathBuf {
        stockguard::embedded::reachable_by_postgres(target).unwrap_or_else(|_| target.to_path_buf()).join("cluster")
    }

    fn pgdata(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The shared secret of the Stockguard processes.
    pub fn secret(&self) -> anyhow::Result<String> {
        std::fs::read_to_string(self.dir.join("secret")).context("the formation is not up (no secret)")
    }

    /// The URL of HAProxy.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.haproxy())
    }

    /// The URL of app `n` (1-based), past HAProxy.
    pub fn app_url(&self, n: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports.app(n))
    }

    /// A `pg_autoctl` command (as `postgres` when we are root), its
    /// configuration and state kept in the formation's folder.
    fn autoctl(&self, args: &[&str]) -> std::process::Command {
        let mut command = if self.as_postgres {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--", "pg_autoctl"]);
            c
        } else {
            std::process::Command::new("pg_autoctl")
        };
        let path = format!("{}:{}", self.bindir.display(), std::env::var("PATH").unwrap_or_default());
        command
            .args(args)
            .env("PATH", path)
            .env("XDG_CONFIG_HOME", self.dir.join("config"))
            .env("XDG_DATA_HOME", self.dir.join("share"))
            .env("XDG_RUNTIME_DIR", self.dir.join("run"))
            .current_dir(&self.dir)
            .stdin(Stdio::null());
        command
    }

    /// Runs a short `pg_autoctl` command; its stdout, or an error with its stderr.
    pub fn autoctl_output(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.autoctl(args).output().with_context(|| format!("cannot run pg_autoctl {args:?}"))?;
        if !out.status.success() {
            bail!("pg_autoctl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts a long-running `pg_autoctl ... --run` in its own process group,
    /// its output to `<name>.log`.
    fn spawn_autoctl(&self, name: &str, args: &[&str]) -> anyhow::Result<()> {
        use std::os::unix::process::CommandExt as _;
        let log = std::fs::File::create(self.dir.join(format!("{name}.log")))?;
        let mut command = self.autoctl(args);
        command.stdout(log.try_clone()?).stderr(log).process_group(0);
        command.spawn().with_context(|| format!("cannot start pg_autoctl for {name}"))?;
        Ok(())
    }

    /// Whether the formation is up (its folder has a state file).
    pub fn is_up(&self) -> bool {
        self.dir.join("uri").exists()
    }

    /// The multi-host URL `pg_autoctl show uri` printed at `up`.
    pub fn uri(&self) -> anyhow::Result<String> {
        Ok(std::fs::read_to_string(self.dir.join("uri")).context("the formation is not up (no uri)")?.trim().to_owned())
    }

    /// Brings everything up with `bin` as the Stockguard binary; the
    /// formation's URL once HAProxy has a ready app behind it.
    pub async fn up(&self, bin: &Path) -> anyhow::Result<()> {
        if self.dir.exists() {
            bail!("{} exists: the formation is up or was not taken down (`cluster down` first)", self.dir.display());
        }
        for dir in ["config", "share", "run"] {
            std::fs::create_dir_all(self.dir.join(dir))?;
        }
        if self.as_postgres {
            let owned =
                std::process::Command::new("chown").arg("-R").arg("postgres:postgres").arg(&self.dir).status()?;
            if !owned.success() {
                bail!("cannot give {} to the postgres user", self.dir.display());
            }
        }
        if self.as_postgres {
            let reachable = std::process::Command::new("runuser")
                .args(["-u", "postgres", "--", "test", "-w"])
                .arg(&self.dir)
                .status()?;
            if !reachable.success() {
                bail!(
                    "the postgres user cannot reach {} (a parent folder is closed to it): pass --dir",
                    self.dir.display()
                );
            }
        }
        let started = Instant::now();
        let monitor = self.pgdata("monitor");
        let monitor_port = self.ports.monitor().to_string();
        eprintln!("cluster: the pg_auto_failover monitor on port {monitor_port}");
        self.spawn_autoctl(
            "monitor",
            &[
                "create",
                "monitor",
                "--pgdata",
                &monitor.to_string_lossy(),
                "--pgport",
                &monitor_port,
                "--hostname",
                "127.0.0.1",
                "--auth",
                "trust",
                "--no-ssl",
                "--run",
            ],
        )?;
        let monitor_url = format!("postgres://autoctl_node@127.0.0.1:{monitor_port}/pg_auto_failover?sslmode=disable");
        wait_for("the monitor", Duration::from_secs(60), || async { connects(&monitor_url).await }).await?;
        for n in 1..=2 {
            eprintln!("cluster: data node {n} on port {}", self.ports.node(n));
            self.spawn_autoctl(
                &format!("node{n}"),
                &[
                    "create",
                    "postgres",
                    "--pgdata",
                    &self.pgdata(&format!("node{n}")).to_string_lossy(),
                    "--pgport",
                    &self.ports.node(n).to_string(),
                    "--hostname",
                    "127.0.0.1",
                    "--name",
                    &format!("node{n}"),
                    "--auth",
                    "trust",
                    "--no-ssl",
                    "--dbname",
                    "stockguard",
                    "--monitor",
                    &monitor_url,
                    "--run",
                ],
            )?;
            // The first node must be registered before the second, so
            // that it is the one that becomes the primary.
            if n == 1 {
                wait_for("node 1 as a single primary", Duration::from_secs(90), || async {
                    self.states().is_ok_and(|s| s.iter().any(|n| n.reported == "single" && n.assigned == "single"))
                })
                .await?;
            }
        }
        self.until_healthy(Duration::from_secs(180)).await?;
        let uri =
            self.autoctl_output(&["show", "uri", "--formation", "default", "--pgdata", &monitor.to_string_lossy()])?;
        // pg_autoctl leaves the user out (libpq would take the OS user's
        // name); the database belongs to `postgres`, which trusts loopback.
        let uri = uri.trim().replacen("postgres://", "postgres://postgres@", 1);
        std::fs::write(self.dir.join("uri"), &uri)?;
        let secret = stockguard::auth::Keys::random_secret();
        std::fs::write(self.dir.join("secret"), &secret)?;
        for n in 1..=APPS {
            self.start_app(bin, n).await?;
        }
        self.start_haproxy()?;
        wait_for("HAProxy with a ready app", Duration::from_secs(30), || async {
            ready(&format!("{}/readyz", self.url())).await
        })
        .await?;
        eprintln!("cluster: up in {:.0?}", started.elapsed());
        Ok(())
    }

    /// Waits until the monitor reports a primary and a secondary, nudging
    /// the primary to checkpoint meanwhile: a new standby's base backup
    /// waits for a checkpoint, and PostgreSQL's default spreads one over minutes.
    pub async fn until_healthy(&self, limit: Duration) -> anyhow::Result<Vec<NodeState>> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(states) = self.states() {
                let settled = |role: &str| states.iter().any(|n| n.reported == role && n.assigned == role);
                if settled("primary") && settled("secondary") {
                    return Ok(states);
                }
                for node in states.iter().filter(|n| n.reported.contains("primary")) {
                    let url = format!("postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable", node.port);
                    if let Ok(mut conn) = PgConnection::connect(&url).await {
                        let _ = sqlx::raw_sql("CHECKPOINT").execute(&mut conn).await;
                        let _ = conn.close().await;
                    }
                }
            }
            if Instant::now() > deadline {
                bail!("no primary and secondary within {limit:?}: {:?}", self.states());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The data nodes as the monitor reports them (`pg_autoctl show state`).
    pub fn states(&self) -> anyhow::Result<Vec<NodeState>> {
        let monitor = self.pgdata("monitor");
        let table = self.autoctl_output(&["show", "state", "--pgdata", &monitor.to_string_lossy()])?;
        // Name | Node | Host:Port | TLI: LSN | Connection | Reported State | Assigned State
        Ok(table
            .lines()
            .map(|line| line.split('|').map(str::trim).collect::<Vec<_>>())
            .filter(|cols| cols.len() == 7 && cols[0] != "Name")
            .map(|cols| NodeState {
                name: cols[0].to_owned(),
                port: cols[2].rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or(0),
                reported: cols[5].to_owned(),
                assigned: cols[6].to_owned(),
            })
            .collect())
    }

    /// The node that reports itself primary, if one does.
    pub fn primary(&self) -> anyhow::Result<Option<NodeState>> {
        Ok(self.states()?.into_iter().find(|n| n.reported == "primary" || n.reported == "wait_primary"))
    }

    /// The postmaster pid of a data node, from its `postmaster.pid`.
    pub fn postmaster_pid(&self, node: &str) -> anyhow::Result<u32> {
        let pid_file = self.pgdata(node).join("postmaster.pid");
        let text = std::fs::read_to_string(&pid_file).with_context(|| format!("no {}", pid_file.display()))?;
        text.lines().next().and_then(|l| l.trim().parse().ok()).context("an unreadable postmaster.pid")
    }

    /// A planned failover: `pg_autoctl perform failover`, which returns once
    /// the standby is the primary.
    pub fn perform_failover(&self) -> anyhow::Result<()> {
        let monitor = self.pgdata("monitor");
        self.autoctl_output(&["perform", "failover", "--formation", "default", "--pgdata", &monitor.to_string_lossy()])
            .map(drop)
    }

    fn app_pid_file(&self, n: usize) -> PathBuf {
        self.dir.join(format!("app{n}.pid"))
    }

    /// The pid of app `n`, if it has one recorded.
    pub fn app_pid(&self, n: usize) -> Option<u32> {
        std::fs::read_to_string(self.app_pid_file(n)).ok().and_then(|pid| pid.trim().parse().ok())
    }

    /// Starts Stockguard process `n` (1-based) and waits until it is ready.
    pub async fn start_app(&self, bin: &Path, n: usize) -> anyhow::Result<()> {
        use std::os::unix::process::CommandExt as _;
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join(format!("app{n}.log")))?;
        let child = std::process::Command::new(bin)
            .arg("serve")
            .env("DATABASE_URL", self.uri()?)
            .env("STOCKGUARD_JWT_SECRET", self.secret()?)
            .env("STOCKGUARD_ADDR", format!("127.0.0.1:{}", self.ports.app(n)))
            .env("STOCKGUARD_NO_SEED", "true")
            .env("STOCKGUARD_SHUTDOWN_DELAY_MS", SHUTDOWN_DELAY_MS.to_string())
            .env("STOCKGUARD_POOL_SIZE", "8")
            .env("STOCKGUARD_ACQUIRE_TIMEOUT_MS", "2000")
            .env("RUST_LOG", "info,sqlx=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        std::fs::write(self.app_pid_file(n), child.id().to_string())?;
        let url = format!("{}/readyz", self.app_url(n));
        wait_for(&format!("Stockguard {n}"), Duration::from_secs(60), || async { ready(&url).await }).await
    }

    fn start_haproxy(&self) -> anyhow::Result<()> {
        let servers: String =
            (1..=APPS).map(|n| format!("    server app{n} 127.0.0.1:{} check\n", self.ports.app(n))).collect();
        // Health checks every 250 ms, out after 2 failures, back after 1
        // success. `retry-on conn-failure` resends a request only when no
        // byte of it reached a server (a killed process), which is always
        // safe; anything later is the client's retry, with its idempotency key.
        let config = format!(
            "global\n    maxconn 4096\n\ndefaults\n    mode http\n    timeout connect 1s\n    timeout client 60s\n    \
             timeout server 30s\n    timeout tunnel 1h\n    retries 3\n    option redispatch\n    \
             retry-on conn-failure\n\nfrontend stockguard\n    bind 127.0.0.1:{}\n    default_backend apps\n\n\
             backend apps\n    balance roundrobin\n    option httpchk GET /readyz\n    http-check expect status 200\n    \
             default-server inter 250ms fall 2 rise 1\n{servers}",
            self.ports.haproxy()
        );
        let cfg = self.dir.join("haproxy.cfg");
        std::fs::write(&cfg, config)?;
        let log = std::fs::File::create(self.dir.join("haproxy.log"))?;
        let status = std::process::Command::new("haproxy")
            .arg("-D")
            .arg("-f")
            .arg(&cfg)
            .arg("-p")
            .arg(self.dir.join("haproxy.pid"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .status()
            .context("cannot run haproxy")?;
        if !status.success() {
            bail!("haproxy did not start: see {}", self.dir.join("haproxy.log").display());
        }
        Ok(())
    }

    /// What is running, in lines for a person.
    pub async fn status(&self) -> anyhow::Result<String> {
        let mut out = String::new();
        for node in self.states()? {
            out.push_str(&format!(
                "{}  127.0.0.1:{}  {} (assigned {})\n",
                node.name, node.port, node.reported, node.assigned
            ));
        }
        if let Some(primary) = self.primary()? {
            let url = format!("postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable", primary.port);
            if let Ok(mut conn) = PgConnection::connect(&url).await {
                let names: String = sqlx::query_scalar("SHOW synchronous_standby_names").fetch_one(&mut conn).await?;
                out.push_str(&format!("synchronous_standby_names on the primary: {names:?}\n"));
                let _ = conn.close().await;
            }
        }
        out.push_str(&format!("DATABASE_URL={}\n", self.uri()?));
        for n in 1..=APPS {
            let state = if ready(&format!("{}/readyz", self.app_url(n))).await { "ready" } else { "NOT READY" };
            out.push_str(&format!("stockguard {n}  {}  pid {:?}  {state}\n", self.app_url(n), self.app_pid(n)));
        }
        let proxy = if ready(&format!("{}/readyz", self.url())).await { "serving" } else { "NOT SERVING" };
        out.push_str(&format!("haproxy  {}  {proxy}\n", self.url()));
        Ok(out)
    }

    /// Stops everything `up` started (apps with SIGTERM, HAProxy, then the
    /// nodes and the monitor with `pg_autoctl stop`) and removes the folder.
    pub async fn down(&self) -> anyhow::Result<()> {
        if !self.dir.exists() {
            eprintln!("cluster: nothing at {}", self.dir.display());
            return Ok(());
        }
        let mut pids: Vec<u32> = (1..=APPS).filter_map(|n| self.app_pid(n)).collect();
        if let Some(pid) =
            std::fs::read_to_string(self.dir.join("haproxy.pid")).ok().and_then(|p| p.trim().parse().ok())
        {
            pids.push(pid);
        }
        for pid in &pids {
            // One that already exited (a killed app) is no error here.
            let _ = std::process::Command::new("kill").arg("-TERM").arg(pid.to_string()).stderr(Stdio::null()).status();
        }
        for name in ["node2", "node1", "monitor"] {
            let pgdata = self.pgdata(name);
            if pgdata.exists()
                && let Err(err) = self.autoctl_output(&["stop", "--pgdata", &pgdata.to_string_lossy()])
            {
                eprintln!("cluster: {err}");
            }
        }
        // Until every process we started (and every postmaster) is gone.
        let postmasters: Vec<u32> =
            ["node1", "node2", "monitor"].iter().filter_map(|n| self.postmaster_pid(n).ok()).collect();
        let all: Vec<u32> = pids.iter().chain(&postmasters).copied().collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        while all.iter().any(|pid| Path::new(&format!("/proc/{pid}")).exists()) {
            if Instant::now() > deadline {
                for pid in all.iter().filter(|pid| Path::new(&format!("/proc/{pid}")).exists()) {
                    let _ = std::process::Command::new("kill").arg("-KILL").arg(pid.to_string()).status();
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // pg_autoctl's supervisors exit once their postgres has stopped.
        let supervisors = self.dir.to_string_lossy().into_owned();
        let deadline = Instant::now() + Duration::from_secs(15);
        while supervisors_running(&supervisors) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        std::fs::remove_dir_all(&self.dir).with_context(|| format!("cannot remove {}", self.dir.display()))?;
        Ok(())
    }
}

/// Whether a pg_autoctl of this formation (its command line names `dir`)
/// still runs, read from `/proc`.
fn supervisors_running(dir: &str) -> bool {
    std::fs::read_dir("/proc").into_iter().flatten().flatten().any(|entry| {
        std::fs::read(entry.path().join("cmdline")).is_ok_and(|cmd| {
            let cmd = String::from_utf8_lossy(&cmd);
            cmd.contains("pg_autoctl") && cmd.contains(dir)
        })
    })
}

/// Whether `url` answers 200.
pub async fn ready(url: &str) -> bool {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build();
    match client {
        Ok(client) => client.get(url).send().await.is_ok_and(|r| r.status().is_success()),
        Err(_) => false,
    }
}

async fn connects(url: &str) -> bool {
    match PgConnection::connect(url).await {
        Ok(conn) => {
            let _ = conn.close().await;
            true
        }
        Err(_) => false,
    }
}

/// Polls `probe` every 200 ms until it holds; an error naming `what` after `limit`.
pub async fn wait_for<F, Fut>(what: &str, limit: Duration, mut probe: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !probe().await {
        if Instant::now() > deadline {
            bail!("{what}: not within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}
