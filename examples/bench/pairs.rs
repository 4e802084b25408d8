//! Two servers measured in the same rounds: the main server beside another
//! (another build's, this build with a webhook endpoint, this build with
//! traces on), cell by cell, so the machine's drift falls on both.

use std::{ffi::OsStr, fmt::Write as _, path::Path, process::Stdio};

use crate::{
    measure::Stats,
    report::{cpu_per_reservation, ratio},
    scenarios::{Bench, By, Scenario, Shop, Side},
};
use stockguard_support::{
    database::ThrowAway,
    process::{Log, ServerProcess},
};

/// Runs `work` with a server of `bin` (started with `env`) on a fresh
/// database of its own, given the server and the database's URL; then
/// stops the server and drops the database, whatever `work` returned.
pub async fn beside<T, V: AsRef<OsStr>>(
    database_url_base: &str,
    bin: &Path,
    secret: &str,
    env: &[(&str, V)],
    work: impl AsyncFnOnce(&ServerProcess, &str) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let database = ThrowAway::create(database_url_base, "bench").await?;
    eprintln!("bench: {} serving database {}", bin.display(), database.name);
    let result = async {
        let server =
            ServerProcess::start(bin, &database.url, Some(secret), env, Log::Warnings(Stdio::inherit())).await?;
        let result = work(&server, &database.url).await;
        server.stop_after(result).await
    }
    .await;
    database.drop("bench").await;
    result
}

/// One server of a pair, with its database and its name in the report.
#[derive(Clone, Copy)]
pub struct Server<'a> {
    /// Its name in the progress lines and the table.
    pub label: &'static str,
    /// The process.
    pub process: &'a ServerProcess,
    /// Its database: `None` for the main server's, the bench's own.
    pub shop: Option<&'a Shop>,
    /// Whether this build's invariant is checked on its database after each
    /// cell (not on another build's, whose schema it may not fit).
    pub checked: bool,
}

/// One cell: the same scenario and clients on both servers, in the order
/// they were given.
pub struct Pair {
    /// HOT, SPREAD or (`--baseline-bin`) MULTI, KIT and KIT+SINGLES.
    pub scenario: Scenario,
    /// Concurrent clients.
    pub clients: usize,
    /// Each server's figures.
    pub stats: [Stats; 2],
}

impl Pair {
    /// The second server's reservations per second over the first's.
    pub fn ratio(&self) -> f64 {
        let [first, second] = &self.stats;
        ratio(second.per_sec(second.successes), first.per_sec(first.successes))
    }

    /// Errors on both servers.
    pub fn errors(&self) -> u64 {
        self.stats.iter().map(|s| s.errors).sum()
    }

    /// Whether either server reserved nothing.
    pub fn idle(&self) -> bool {
        self.stats.iter().any(|s| s.successes == 0)
    }
}

impl Bench {
    fn shop_of<'a>(&'a self, server: Server<'a>) -> &'a Shop {
        server.shop.unwrap_or(&self.shop)
    }

    /// HOT and SPREAD (the smoke: SPREAD) at every client count on both
    /// `servers`, round by round; `what` names the pair in the progress lines.
    pub async fn pairs(&mut self, servers: [Server<'_>; 2], what: &str) -> anyhow::Result<Vec<Pair>> {
        let scenarios: &[Scenario] =
            if self.settings.smoke { &[Scenario::Spread] } else { &[Scenario::Hot, Scenario::Spread] };
        self.pairs_of(scenarios, servers, what).await
    }

    /// [`Bench::pairs`] of `scenarios`, each already seeded on both servers.
    pub async fn pairs_of(
        &mut self,
        scenarios: &[Scenario],
        servers: [Server<'_>; 2],
        what: &str,
    ) -> anyhow::Result<Vec<Pair>> {
        let mut cells = Vec::new();
        for &scenario in scenarios {
            for clients in self.settings.clients.clone() {
                // Half of one client reserves nothing single: as in the main run.
                if scenario == Scenario::KitSingles && clients < 2 {
                    continue;
                }
                eprintln!("bench: {} x{clients}: {what}, {} rounds", scenario.name(), self.settings.rounds);
                let sides = servers.map(|s| Side { label: s.label, shop: self.shop_of(s), by: By::Http(s.process) });
                let stats = self.rounds(&sides, scenario, clients).await?;
                let after = format!("{} x{clients}, {what}", scenario.name());
                for server in servers.iter().filter(|s| s.checked) {
                    let after = format!("{after} ({})", server.label);
                    match server.shop {
                        Some(shop) => self.invariant.check(&shop.db, &after).await?,
                        None => self.invariant.check(&self.shop.db, &after).await?,
                    }
                }
                cells.push(Pair { scenario, clients, stats });
            }
        }
        Ok(cells)
    }
}

/// The markdown table of `cells`, columns named by `labels` (the servers'
/// in their order): reservations per second, the second's over the
/// first's, p99, and CPU per reservation of the server and of PostgreSQL.
pub fn table(cells: &[Pair], labels: [&str; 2]) -> String {
    let [a, b] = labels;
    let mut md = format!(
        "| scenario | clients | {a} res/s | {b} res/s | {b} / {a} | p99 ms {a} / {b} | \
         CPU µs/res server {a} / {b} | CPU µs/res PostgreSQL {a} / {b} |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|\n"
    );
    for c in cells {
        let [x, y] = &c.stats;
        let ((x_server, x_pg), (y_server, y_pg)) = (cpu_per_reservation(x), cpu_per_reservation(y));
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {:.0} | {:.2} | {:.2} / {:.2} | {x_server:.0} / {y_server:.0} | {x_pg:.0} / {y_pg:.0} |",
            c.scenario.name(),
            c.clients,
            x.per_sec(x.successes),
            y.per_sec(y.successes),
            c.ratio(),
            x.p99_ms,
            y.p99_ms,
        );
    }
    md
}

/// The cell with the lowest second / first ratio, and the ratio.
pub fn worst<'a>(cells: impl IntoIterator<Item = &'a Pair>) -> Option<(&'a Pair, f64)> {
    cells.into_iter().map(|c| (c, c.ratio())).min_by(|a, b| a.1.total_cmp(&b.1))
}
