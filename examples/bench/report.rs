//! The report: the markdown tables (reserve cells, strategies, the
//! contested order, the targets) and the SVG chart of reservations per
//! second against clients.

use std::{fmt::Write as _, path::Path};

use crate::{
    Settings,
    baseline::Baseline,
    drop::DropRun,
    history::Probes,
    measure::Stats,
    pairs::{self, Pair},
    scenarios::{
        COMPONENTS, Invariant, KitCell, MultiCell, Scenario, component_reservations_per_sec, kits_and_singles,
    },
    traces::Traces,
    webhook::Webhook,
};

/// One reserve cell: a scenario at a client count, both sides.
pub struct Cell {
    /// HOT or SPREAD.
    pub scenario: Scenario,
    /// Concurrent clients.
    pub clients: usize,
    /// Over HTTP.
    pub stockguard: Stats,
    /// The raw-SQL limit.
    pub raw: Stats,
    /// The minimal two-write statement on its own schema.
    pub floor: Stats,
}

/// Stockguard and the raw-SQL limit in one database.
pub struct Sides {
    /// Over HTTP.
    pub stockguard: Stats,
    /// The raw-SQL limit.
    pub raw: Stats,
}

/// SPREAD at a client count in the database without history and in the
/// one with it, measured round by round.
pub struct HistoryCell {
    /// Concurrent clients.
    pub clients: usize,
    /// The main database (only the benchmark's own rows).
    pub without: Sides,
    /// The second database, filled with history.
    pub with: Sides,
}

/// The history run (see `history.rs`).
pub struct History {
    /// Past reservations (and ledger rows) filled in.
    pub rows: u64,
    /// How long the fill took.
    pub fill_secs: f64,
    /// The probes in the database without history.
    pub without: Probes,
    /// The probes in the one with it.
    pub with: Probes,
    /// SPREAD at 16 and 64 clients.
    pub cells: Vec<HistoryCell>,
}

/// CPU µs per successful reservation: (server, PostgreSQL backends).
pub fn cpu_per_reservation(s: &Stats) -> (f64, f64) {
    let n = s.successes.max(1) as f64;
    (s.usage.server.unwrap_or_default().cpu_secs * 1e6 / n, s.usage.pg_cpu_secs * 1e6 / n)
}

/// The strategy comparison: HOT with and without `expectedVersion`, and the contested order.
pub struct Strategy {
    /// Concurrent clients.
    pub clients: usize,
    /// Plain `reserve` on HOT at that count, if measured.
    pub plain: Option<Stats>,
    /// `reserve` at an expected version with retries.
    pub expected: Stats,
    /// The contested order, per locking mode.
    pub orders: Vec<(&'static str, Stats)>,
}

/// One row of the strategies table.
fn strategy_row(md: &mut String, label: &str, s: &Stats, conflicts: u64, retries: u64, gave_up: u64) {
    let _ = writeln!(
        md,
        "| {label} | {:.0} | {conflicts} | {retries} | {gave_up} | {} | {:.0} | {:.2} / {:.2} / {:.2} | {:.1} |",
        s.per_sec(s.successes),
        s.errors,
        s.per_sec(s.requests),
        s.p50_ms,
        s.p95_ms,
        s.p99_ms,
        s.usage.server.unwrap_or_default().cpu_secs,
    );
}

/// kB in MB.
pub fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// `a / b`, or 0 when `b` is not positive.
pub fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// Everything the report shows.
pub struct Report<'a> {
    /// The run's settings.
    pub settings: &'a Settings,
    /// The date, machine, PostgreSQL and server lines.
    pub header: String,
    /// The reserve cells.
    pub cells: &'a [Cell],
    /// The MULTI cells.
    pub multi: &'a [MultiCell],
    /// The KIT and KIT+SINGLES cells.
    pub kits: &'a [KitCell],
    /// The strategy comparison.
    pub strategy: &'a Strategy,
    /// The invariant checks.
    pub invariant: &'a Invariant,
    /// VmHWM of the first server when the main matrix was done.
    pub main_hwm_kb: u64,
    /// The history run, if one was made.
    pub history: Option<&'a History>,
    /// The comparison with another build, if one was made.
    pub baseline: Option<&'a Baseline>,
    /// The `--webhook` run, if one was made.
    pub webhook: Option<&'a Webhook>,
    /// The `--traces` run, if one was made.
    pub traces: Option<&'a Traces>,
    /// The `--drop` run, if one was made.
    pub drop: Option<&'a DropRun>,
}

impl Report<'_> {
    /// The cell of `scenario` at `clients`, if measured.
    pub fn cell(&self, scenario: Scenario, clients: usize) -> Option<&Cell> {
        self.cells.iter().find(|c| c.scenario == scenario && c.clients == clients)
    }

    /// Errors over every run.
    pub fn total_errors(&self) -> u64 {
        let cells: u64 = self.cells.iter().map(|c| c.stockguard.errors + c.raw.errors + c.floor.errors).sum();
        let multi: u64 = self.multi.iter().map(|c| c.stockguard.errors + c.limit.errors).sum::<u64>()
            + self.kits.iter().map(|c| c.stockguard.errors + c.limit.errors).sum::<u64>();
        let history: u64 = (self.history.iter().flat_map(|h| &h.cells))
            .map(|c| c.without.stockguard.errors + c.without.raw.errors + c.with.stockguard.errors + c.with.raw.errors)
            .sum::<u64>()
            + (self.baseline.iter().flat_map(|b| &b.cells)).map(Pair::errors).sum::<u64>();
        let strategy: u64 =
            self.strategy.expected.errors + self.strategy.orders.iter().map(|(_, s)| s.errors).sum::<u64>();
        cells
            + multi
            + history
            + strategy
            + self.webhook.map_or(0, Webhook::errors)
            + self.traces.map_or(0, Traces::errors)
    }

    /// (target, measured, met or None when not measured).
    pub fn targets(&self) -> Vec<(String, String, Option<bool>)> {
        let mut out = Vec::new();
        for clients in [16, 64] {
            let target = format!("SPREAD at {clients} clients: ≥ 1.2× the raw-SQL limit, p99 ≤ 2× the limit's p99");
            match self.cell(Scenario::Spread, clients) {
                Some(c) => {
                    let r = ratio(c.stockguard.per_sec(c.stockguard.successes), c.raw.per_sec(c.raw.successes));
                    let p = ratio(c.stockguard.p99_ms, c.raw.p99_ms);
                    let measured = format!(
                        "{r:.2}× the limit's res/s ({:.0} vs {:.0}); p99 {:.2} ms = {p:.2}× the limit's {:.2} ms",
                        c.stockguard.per_sec(c.stockguard.successes),
                        c.raw.per_sec(c.raw.successes),
                        c.stockguard.p99_ms,
                        c.raw.p99_ms
                    );
                    out.push((target, measured, Some(r >= 1.2 && p <= 2.0)));
                }
                None => out.push((target, "not measured".into(), None)),
            }
        }
        let target = "HOT at 64 clients: ≥ 10× the single-statement limit".to_owned();
        match self.cell(Scenario::Hot, 64) {
            Some(c) => {
                let r = ratio(c.stockguard.per_sec(c.stockguard.successes), c.raw.per_sec(c.raw.successes));
                let measured = format!(
                    "{r:.2}× ({:.0} vs {:.0} res/s)",
                    c.stockguard.per_sec(c.stockguard.successes),
                    c.raw.per_sec(c.raw.successes)
                );
                out.push((target, measured, Some(r >= 10.0)));
            }
            None => out.push((target, "not measured".into(), None)),
        }
        for clients in [16, 64] {
            let target = format!("MULTI at {clients} clients: ≥ 1.0× its own one-statement limit");
            match self.multi.iter().find(|c| c.clients == clients) {
                Some(c) => {
                    let (g, l) = (c.stockguard.per_sec(c.stockguard.successes), c.limit.per_sec(c.limit.successes));
                    let r = ratio(g, l);
                    out.push((target, format!("{r:.2}× ({g:.0} vs {l:.0} res/s)"), Some(r >= 1.0)));
                }
                None => out.push((target, "not measured".into(), None)),
            }
        }
        for scenario in [Scenario::Kit, Scenario::KitSingles] {
            for clients in [16, 64] {
                let target = format!("{} at {clients} clients: ≥ 1.0× its own one-statement limit", scenario.name());
                match self.kits.iter().find(|c| c.scenario == scenario && c.clients == clients) {
                    Some(c) => {
                        let (g, l) = (c.stockguard.per_sec(c.stockguard.successes), c.limit.per_sec(c.limit.successes));
                        let r = ratio(g, l);
                        out.push((target, format!("{r:.2}× ({g:.0} vs {l:.0} res/s)"), Some(r >= 1.0)));
                    }
                    None => out.push((target, "not measured".into(), None)),
                }
            }
        }
        let target = "server peak RSS ≤ 64 MB under the 64-client load".to_owned();
        if self.cells.iter().any(|c| c.clients == 64) {
            let mb = mb(self.main_hwm_kb);
            out.push((target, format!("{mb:.1} MB (VmHWM after the 64-client runs)"), Some(mb <= 64.0)));
        } else {
            out.push((target, "not measured".into(), None));
        }
        let target = "SPREAD throughput with history ≥ 0.9× without".to_owned();
        let worst = (self.history.iter().flat_map(|h| h.cells.iter().map(move |c| (h.rows, c))))
            .map(|(rows, c)| {
                let (without, with) = (&c.without.stockguard, &c.with.stockguard);
                (rows, c.clients, ratio(with.per_sec(with.successes), without.per_sec(without.successes)))
            })
            .min_by(|a, b| a.2.total_cmp(&b.2));
        match worst {
            Some((rows, clients, r)) => out.push((
                target,
                format!("{r:.2}× at {clients} clients (the lowest) with {rows} history rows"),
                Some(r >= 0.9),
            )),
            None => out.push((target, "not measured".into(), None)),
        }
        let target =
            "HOT, SPREAD and MULTI within 5 % of the build before (--baseline-bin), in the same rounds".to_owned();
        // Not the kit cells (compared when both builds have kits): this
        // target is the cells that were there before them.
        let worst = self.baseline.and_then(|b| pairs::worst(b.cells.iter().filter(|c| !c.scenario.is_kit())));
        match worst {
            Some((c, r)) => out.push((
                target,
                format!("{r:.2}× at {} x{} (the lowest after / before)", c.scenario.name(), c.clients),
                Some(r >= 0.95),
            )),
            None => out.push((target, "not measured".into(), None)),
        }
        out.extend(self.webhook.iter().flat_map(|w| w.targets()));
        let errors = self.total_errors();
        out.push(("zero errors".into(), format!("{errors} errors"), Some(errors == 0)));
        let v = self.invariant.violations.len();
        out.push((
            "zero invariant violations".into(),
            format!("{v} violations in {} checks", self.invariant.checks),
            Some(v == 0),
        ));
        out
    }

    /// The whole report as markdown.
    pub fn markdown(&self) -> String {
        let s = self.settings;
        let mut md = String::new();
        let _ = writeln!(md, "# Stockguard benchmark{}\n", if s.smoke { " (smoke)" } else { "" });
        md.push_str(&self.header);
        let _ = writeln!(
            md,
            "- runs: {} s measured per side; a reserve cell alternates Stockguard and raw SQL in {} rounds, \
             each after {} s warm-up; clients {}{}\n",
            s.duration.as_secs(),
            s.rounds,
            s.warmup.as_secs(),
            s.clients.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
            if s.keyed { "; every reserve carries a fresh idempotency key (`--keyed`)" } else { "" }
        );
        md.push_str("## Reserve: Stockguard over HTTP vs the raw-SQL limit and the floor\n\n");
        md.push_str(
            "Successful reservations per second. Raw SQL (the one-statement limit): the server's own \
             `RESERVE_SQL`, prepared, one dedicated connection per client, no HTTP, no GraphQL. Floor: the \
             minimal two-write reservation (conditional decrement + reservation row) on a schema of nothing \
             more, the same way. Ratio = Stockguard / raw SQL; vs floor = Stockguard / floor. Latency in ms. \
             CPU µs per reservation: the server process, and the PostgreSQL backends of the benchmark's \
             database (WAL writer and checkpointer not included), over the measured window.\n\n\
             | scenario | clients | Stockguard res/s | raw SQL res/s | ratio | floor res/s | vs floor | \
             raw SQL / floor | p99 Stockguard / raw / floor | CPU µs/res server | CPU µs/res PostgreSQL: \
             Stockguard / raw / floor |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
        );
        for c in self.cells {
            let (g, r, f) = (&c.stockguard, &c.raw, &c.floor);
            let (server_us, pg_us) = cpu_per_reservation(g);
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.2} | {:.2} | {:.2} / {:.2} / {:.2} | {:.0} | {:.0} / {:.0} / {:.0} |",
                c.scenario.name(),
                c.clients,
                g.per_sec(g.successes),
                r.per_sec(r.successes),
                ratio(g.per_sec(g.successes), r.per_sec(r.successes)),
                f.per_sec(f.successes),
                ratio(g.per_sec(g.successes), f.per_sec(f.successes)),
                ratio(r.per_sec(r.successes), f.per_sec(f.successes)),
                g.p99_ms,
                r.p99_ms,
                f.p99_ms,
                server_us,
                pg_us,
                cpu_per_reservation(r).1,
                cpu_per_reservation(f).1,
            );
        }
        md.push_str("\nLatency and memory:\n\n");
        md.push_str(
            "| scenario | clients | Stockguard res/s | raw SQL res/s | ratio | p50 / p95 / p99 Stockguard | p99 raw | \
             errors | server CPU s | server peak RSS MB |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
        );
        for c in self.cells {
            let (g, r) = (&c.stockguard, &c.raw);
            let used = g.usage.server.unwrap_or_default();
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.0} | {:.2} | {:.2} / {:.2} / {:.2} | {:.2} | {} | {:.1} | {:.1} |",
                c.scenario.name(),
                c.clients,
                g.per_sec(g.successes),
                r.per_sec(r.successes),
                ratio(g.per_sec(g.successes), r.per_sec(r.successes)),
                g.p50_ms,
                g.p95_ms,
                g.p99_ms,
                r.p99_ms,
                g.errors + r.errors,
                used.cpu_secs,
                mb(used.max_rss_kb),
            );
        }
        md.push_str(
            "\nDetails. Server CPU is utime + stime of the server process over the measured window (100 % = one \
             core); peak RSS is the highest VmRSS sampled every 100 ms during the run, VmHWM the server's peak \
             since it started. Load generator CPU is this benchmark process; machine busy is all cores, all \
             processes (PostgreSQL included), 100 % = every core busy.\n\n\
             | scenario | clients | Stockguard outcomes | raw SQL outcomes | raw p50 / p95 ms | server CPU % | \
             server VmHWM MB | load generator CPU s, Stockguard / raw | machine busy %, Stockguard / raw |\n\
             |---|--:|---|---|--:|--:|--:|--:|--:|\n",
        );
        for c in self.cells {
            let (g, r) = (&c.stockguard.usage, &c.raw.usage);
            let used = g.server.unwrap_or_default();
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {:.2} / {:.2} | {:.0} | {:.1} | {:.1} / {:.1} | {:.0} / {:.0} |",
                c.scenario.name(),
                c.clients,
                c.stockguard.outcomes_text(),
                c.raw.outcomes_text(),
                c.raw.p50_ms,
                c.raw.p95_ms,
                100.0 * used.cpu_secs / c.stockguard.seconds,
                mb(used.hwm_kb),
                g.loadgen_cpu_secs,
                r.loadgen_cpu_secs,
                g.machine_busy_pct,
                r.machine_busy_pct,
            );
        }

        self.multi_markdown(&mut md);
        self.kit_markdown(&mut md);

        if let Some(b) = self.baseline {
            md.push_str(&b.markdown());
        }
        if let Some(w) = self.webhook {
            md.push_str(&w.markdown());
        }
        if let Some(t) = self.traces {
            md.push_str(&t.markdown());
        }
        if let Some(d) = self.drop {
            md.push_str(&d.markdown());
        }
        if let Some(h) = self.history {
            let _ = writeln!(
                md,
                "\n## SPREAD with {} rows of history\n\n\
                 A second database, seeded as the first and served by a second server, was filled with {} past \
                 reservations (released or expired, 100,000 users, over 30 days) and as many ledger rows ({:.0} s). \
                 Then SPREAD was measured in both databases, taking turns round by round as a cell's sides do: \
                 Stockguard without, with; raw SQL without, with. Without = the first database (only the \
                 benchmark's own rows).\n\n\
                 | clients | Stockguard res/s without / with | ratio | p99 ms without / with | raw SQL res/s without / with | ratio |\n\
                 |--:|--:|--:|--:|--:|--:|",
                h.rows, h.rows, h.fill_secs
            );
            for c in &h.cells {
                let (ge, gh) = (&c.without.stockguard, &c.with.stockguard);
                let (re, rh) = (&c.without.raw, &c.with.raw);
                let (ge_s, gh_s) = (ge.per_sec(ge.successes), gh.per_sec(gh.successes));
                let (re_s, rh_s) = (re.per_sec(re.successes), rh.per_sec(rh.successes));
                let _ = writeln!(
                    md,
                    "| {} | {ge_s:.0} / {gh_s:.0} | {:.2} | {:.2} / {:.2} | {re_s:.0} / {rh_s:.0} | {:.2} |",
                    c.clients,
                    ratio(gh_s, ge_s),
                    ge.p99_ms,
                    gh.p99_ms,
                    ratio(rh_s, re_s),
                );
            }
            let _ = writeln!(
                md,
                "\nWhat must not grow with history (median of 200 calls after the cells, µs, without / with): \
                 one sweep with nothing due {:.0} / {:.0}; the first page (20 rows) of `myReservations` for a user \
                 with thousands {:.0} / {:.0}.",
                h.without.sweep_us, h.with.sweep_us, h.without.my_reservations_us, h.with.my_reservations_us
            );
        }

        let st = self.strategy;
        let _ = writeln!(md, "\n## Strategies on HOT, {} clients\n", st.clients);
        md.push_str(
            "`expectedVersion`: each logical reservation reads `inventory { version }`, reserves at that version \
             and on `Conflict` reads again and retries, at most 3 retries. Latency is per logical reservation \
             (all its requests).\n\n\
             | strategy | successes/s | conflicts | retries | gave up | errors | HTTP requests/s | p50 / p95 / p99 ms | server CPU s |\n\
             |---|--:|--:|--:|--:|--:|--:|--:|--:|\n",
        );
        if let Some(p) = &st.plain {
            let conflicts = p.outcomes.get("Conflict").copied().unwrap_or(0);
            strategy_row(&mut md, "plain `reserve` (no `expectedVersion`)", p, conflicts, 0, 0);
        }
        let e = &st.expected;
        let gave_up = e.outcomes.get("gave up").copied().unwrap_or(0);
        strategy_row(&mut md, "`expectedVersion`, re-read + ≤ 3 retries", e, e.conflicts, e.retries, gave_up);

        let _ = writeln!(md, "\n## One contested order, {} clients\n", st.clients);
        md.push_str(
            "Clients mostly change the shipping address (read the version, change at it), every 50th operation \
             is a confirm or a cancel; a confirmed or cancelled order is replaced by a new one. Successes: \
             `ShippingAddressChanged`, `OrderConfirmed`, `OrderCancelled`. Conflicts: `OrderVersionConflict`, \
             `OrderModifiedConcurrently`.\n\n\
             | locking | operations/s | successes/s | conflicts | errors | p50 / p95 / p99 ms | server CPU s | outcomes |\n\
             |---|--:|--:|--:|--:|--:|--:|---|\n",
        );
        for (mode, o) in &st.orders {
            let _ = writeln!(
                md,
                "| {mode} | {:.0} | {:.0} | {} | {} | {:.2} / {:.2} / {:.2} | {:.1} | {} |",
                o.per_sec(o.operations),
                o.per_sec(o.successes),
                o.conflicts,
                o.errors,
                o.p50_ms,
                o.p95_ms,
                o.p99_ms,
                o.usage.server.unwrap_or_default().cpu_secs,
                o.outcomes_text(),
            );
        }

        md.push_str("\n## Targets\n\n");
        for (target, measured, met) in self.targets() {
            let _ = match met {
                Some(true) => writeln!(md, "- {target}: {measured}: **met**"),
                Some(false) => writeln!(md, "- {target}: {measured}: **not met**"),
                None => writeln!(md, "- {target}: not measured in this run"),
            };
        }
        if self.invariant.violations.is_empty() {
            let _ = writeln!(md, "\nInvariant: held after every run ({} checks).", self.invariant.checks);
        } else {
            md.push_str("\nInvariant VIOLATED:\n\n");
            for v in &self.invariant.violations {
                let _ = writeln!(md, "- {v}");
            }
        }
        md
    }

    /// The MULTI table, if measured.
    fn multi_markdown(&self, md: &mut String) {
        if self.multi.is_empty() {
            return;
        }
        md.push_str(
            "\n## MULTI: a catalogue spread over 4 locations\n\n\
             Reserves of 1–3 units that name no location (PRIORITY, splits allowed) on items holding a few \
             units at each of three preferred locations and the bulk at a fourth. Limit: the server's own \
             multi-location reserve statement (`ALLOCATING_RESERVE_SQL`), prepared, one dedicated connection per \
             client, measured as the raw-SQL limit above, taking turns with Stockguard. Split: reservations \
             of the cell (both sides) that took from more than one location.\n\n\
             | clients | Stockguard res/s | limit res/s | ratio | p99 ms Stockguard / limit | CPU µs/res server | \
             CPU µs/res PostgreSQL: Stockguard / limit | split | errors |\n|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
        );
        for c in self.multi {
            let (g, l) = (&c.stockguard, &c.limit);
            let (server_us, pg_us) = cpu_per_reservation(g);
            let _ = writeln!(
                md,
                "| {} | {:.0} | {:.0} | {:.2} | {:.2} / {:.2} | {server_us:.0} | {pg_us:.0} / {:.0} | {:.1} % of {} | {} |",
                c.clients,
                g.per_sec(g.successes),
                l.per_sec(l.successes),
                ratio(g.per_sec(g.successes), l.per_sec(l.successes)),
                g.p99_ms,
                l.p99_ms,
                cpu_per_reservation(l).1,
                100.0 * ratio(c.split.0 as f64, c.split.1 as f64),
                c.split.1,
                g.errors + l.errors,
            );
        }
    }

    /// The KIT and KIT+SINGLES table, if measured.
    fn kit_markdown(&self, md: &mut String) {
        if self.kits.is_empty() {
            return;
        }
        let _ = write!(
            md,
            "\n## KIT: kits of {COMPONENTS} SPREAD inventories, and kits beside single reserves\n\n\
             KIT: `reserveKit` of one kit, naming no location, on random kits of {COMPONENTS} distinct SPREAD \
             inventories (one unit of each; {} kits made with `createKit` after every other cell). \
             KIT+SINGLES: half the clients (the even ones) as KIT, half `reserve` one unit of a random \
             inventory of those kits. Limit: the server's own kit statement (`stock::kitting::reserve_kit`) \
             for the kit clients and `RESERVE_SQL` for the others, prepared, one dedicated connection per \
             client, measured as the raw-SQL limit above, taking turns with Stockguard. A kit reservation \
             counts as one reservation (res/s, ratio, CPU per reservation); component res/s counts the \
             reservations it writes, {COMPONENTS} per kit, plus the single reserves. Kits: the kit \
             reservations among the reservations, Stockguard / limit.\n\n\
             | cell | clients | Stockguard res/s | limit res/s | ratio | component res/s Stockguard / limit | \
             kits Stockguard / limit | p99 ms Stockguard / limit | CPU µs/res server | \
             CPU µs/res PostgreSQL: Stockguard / limit | errors |\n\
             |---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
            self.kit_count()
        );
        for c in self.kits {
            let (g, l) = (&c.stockguard, &c.limit);
            let (server_us, pg_us) = cpu_per_reservation(g);
            let share = |s: &crate::measure::Stats| {
                let (kits, singles) = kits_and_singles(s);
                100.0 * ratio(kits as f64, (kits + singles) as f64)
            };
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.0} | {:.2} | {:.0} / {:.0} | {:.0} % / {:.0} % | {:.2} / {:.2} | {server_us:.0} | \
                 {pg_us:.0} / {:.0} | {} |",
                c.scenario.name(),
                c.clients,
                g.per_sec(g.successes),
                l.per_sec(l.successes),
                ratio(g.per_sec(g.successes), l.per_sec(l.successes)),
                component_reservations_per_sec(g),
                component_reservations_per_sec(l),
                share(g),
                share(l),
                g.p99_ms,
                l.p99_ms,
                cpu_per_reservation(l).1,
                g.errors + l.errors,
            );
        }
        md.push_str("\nOutcomes:\n\n| cell | clients | Stockguard | limit |\n|---|--:|---|---|\n");
        for c in self.kits {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} |",
                c.scenario.name(),
                c.clients,
                c.stockguard.outcomes_text(),
                c.limit.outcomes_text()
            );
        }
    }

    /// Kits made for the KIT cells in this run.
    fn kit_count(&self) -> usize {
        crate::scenarios::kit_count(self.settings.smoke)
    }

    /// Successful reservations/s vs clients, Stockguard and raw SQL, HOT and SPREAD.
    pub fn chart(&self, path: &Path) -> anyhow::Result<()> {
        use plotters::prelude::*;

        let log2 = |c: usize| (c as f64).log2();
        let xs: Vec<f64> = self.cells.iter().map(|c| log2(c.clients)).collect();
        let (mut x0, mut x1) = xs.iter().fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
        if x1 - x0 < 1.0 {
            x0 -= 1.0;
            x1 += 1.0;
        }
        let x0 = x0 - 0.2;
        let x1 = x1 + 0.2;
        let ymax = self
            .cells
            .iter()
            .flat_map(|c| [c.stockguard.per_sec(c.stockguard.successes), c.raw.per_sec(c.raw.successes)])
            .fold(1.0f64, f64::max)
            * 1.15;

        let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("Successful reservations per second", ("sans-serif", 24))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(x0..x1, 0f64..ymax)?;
        chart
            .configure_mesh()
            .x_desc("concurrent clients (log scale)")
            .y_desc("successful reservations/s")
            .x_labels(((x1 - x0).ceil() as usize) + 1)
            .x_label_formatter(&|x| {
                let c = 2f64.powf(*x);
                if (c - c.round()).abs() < 0.01 { format!("{c:.0}") } else { String::new() }
            })
            .y_label_formatter(&|y| format!("{y:.0}"))
            .light_line_style(RGBColor(240, 240, 240))
            .draw()?;

        let red = RGBColor(200, 40, 40);
        let blue = RGBColor(30, 90, 200);
        let series: [(Scenario, bool, &str, RGBColor); 4] = [
            (Scenario::Spread, false, "Stockguard, SPREAD (10,000 rows)", blue),
            (Scenario::Spread, true, "raw-SQL limit, SPREAD", blue),
            (Scenario::Hot, false, "Stockguard, HOT (one row)", red),
            (Scenario::Hot, true, "raw-SQL limit, HOT", red),
        ];
        for (scenario, raw, label, color) in series {
            let points: Vec<(f64, f64)> = self
                .cells
                .iter()
                .filter(|c| c.scenario == scenario)
                .map(|c| {
                    let s = if raw { &c.raw } else { &c.stockguard };
                    (log2(c.clients), s.per_sec(s.successes))
                })
                .collect();
            let style = color.stroke_width(if raw { 2 } else { 3 });
            if raw {
                chart.draw_series(DashedLineSeries::new(points.clone(), 8, 6, style))?.label(label).legend(
                    move |(x, y)| {
                        EmptyElement::at((x, y))
                            + PathElement::new(vec![(0, 0), (8, 0)], style)
                            + PathElement::new(vec![(14, 0), (22, 0)], style)
                    },
                );
                chart.draw_series(points.iter().map(|&p| TriangleMarker::new(p, 6, color.filled())))?;
            } else {
                chart
                    .draw_series(LineSeries::new(points.clone(), style))?
                    .label(label)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], style));
                chart.draw_series(points.iter().map(|&p| Circle::new(p, 5, color.filled())))?;
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    }
}
