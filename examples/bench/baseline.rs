//! `--baseline-bin PATH`: this build's HOT, SPREAD and MULTI cells against
//! the server of another build (an earlier commit's `stockguard`), measured
//! in the same rounds.
//!
//! A change that must keep the speed of the cells it does not target is
//! judged by those cells before and after it. Cells of two runs minutes
//! apart differ by as much as the machine drifts (see `history.rs`), so the
//! other build gets a database of its own (migrated by its own server, to
//! its own schema), and so does a second server of this build, both seeded
//! the same way through their API, and each cell takes turns on both
//! servers round by round. MULTI is seeded after the single-location
//! cells, as in the main run, so they measure what they always have; it is
//! compared too because a change to the reserving statements (safety stock,
//! issue 47) changes the multi-location one as well. Then KIT and
//! KIT+SINGLES, seeded last as in the main run, when the other build has
//! kits (`reserveKit`; a build before them is measured without). The other build's
//! database is checked by its own `stockguard check` at the end, since this
//! build's invariant may not fit its schema.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::{
    pairs::{self, Pair, Server},
    scenarios::{Bench, Scenario, Shop, kit_count, serves_kits},
};
use stockguard_support::process::ServerProcess;

/// The comparison with another build.
pub struct Baseline {
    /// The other build's server binary.
    pub bin: PathBuf,
    /// Its `stockguard --version`, or what it printed instead.
    pub version: String,
    /// Its cells: the other build first, this build second.
    pub cells: Vec<Pair>,
    /// What its `stockguard check` said of its database at the end.
    pub check: String,
}

/// Starts the other build's server and a second server of this build, each
/// on a fresh database of its own seeded the same way through its API, and
/// measures HOT and SPREAD, then MULTI, at every client count on both. Not
/// the main server: its database has the main cells' rows by then, and a
/// fresh one beside it measured 0.78-0.83x of it (the before side favoured
/// by a younger database, not by its code).
pub async fn compare(
    bench: &mut Bench,
    server_bin: &Path,
    baseline_bin: &Path,
    database_url_base: &str,
    secret: &str,
) -> anyhow::Result<Baseline> {
    eprintln!("bench: baseline: {} beside this build", baseline_bin.display());
    let locking = [("STOCKGUARD_ORDER_LOCKING", "optimistic")];
    let (cells, check) =
        pairs::beside(database_url_base, baseline_bin, secret, &locking, async |before, before_url| {
            let cells = pairs::beside(database_url_base, server_bin, secret, &locking, async |after, after_url| {
                measure_both(bench, after, before, [after_url, before_url]).await
            })
            .await?;
            // Idle by now: the other build's own check of its database.
            anyhow::Ok((cells, check(baseline_bin, before_url).await?))
        })
        .await?;
    Ok(Baseline { bin: baseline_bin.to_owned(), version: version(baseline_bin).await, cells, check })
}

async fn measure_both(
    bench: &mut Bench,
    after: &ServerProcess,
    before: &ServerProcess,
    [after_url, before_url]: [&str; 2],
) -> anyhow::Result<Vec<Pair>> {
    eprintln!("bench: baseline: seeding HOT and SPREAD through each server's API");
    let mut before_shop = Shop::open_through_api(before_url, before, &bench.keys).await?;
    let mut after_shop = Shop::open_through_api(after_url, after, &bench.keys).await?;
    let what = "the baseline and this build";
    let cells = async {
        let mut cells = bench.pairs(servers([before, after], [&before_shop, &after_shop]), what).await?;
        let rows = bench.multi_rows();
        eprintln!("bench: baseline: seeding MULTI ({rows} rows over 4 locations) through each server's API");
        before_shop.seed_multi(before, &bench.keys, rows).await?;
        after_shop.seed_multi(after, &bench.keys, rows).await?;
        bench.invariant.check(&after_shop.db, "seeding MULTI (this build)").await?;
        let pair = servers([before, after], [&before_shop, &after_shop]);
        cells.extend(bench.pairs_of(&[Scenario::Multi], pair, what).await?);
        if !serves_kits(before, &bench.keys).await? {
            eprintln!("bench: baseline: the other build has no reserveKit; no KIT cells");
            return anyhow::Ok(cells);
        }
        let count = kit_count(bench.settings.smoke);
        eprintln!("bench: baseline: seeding {count} kits (createKit) through each server's API");
        before_shop.seed_kits(before, &bench.keys, count).await?;
        after_shop.seed_kits(after, &bench.keys, count).await?;
        bench.invariant.check(&after_shop.db, "seeding the kits (this build)").await?;
        let pair = servers([before, after], [&before_shop, &after_shop]);
        cells.extend(bench.pairs_of(&[Scenario::Kit, Scenario::KitSingles], pair, what).await?);
        anyhow::Ok(cells)
    }
    .await;
    before_shop.db.close().await?;
    after_shop.db.close().await?;
    cells
}

/// The pair of the comparison: the other build's server, unchecked, first.
fn servers<'a>([before, after]: [&'a ServerProcess; 2], [before_shop, after_shop]: [&'a Shop; 2]) -> [Server<'a>; 2] {
    [
        Server { label: "before", process: before, shop: Some(before_shop), checked: false },
        Server { label: "this build", process: after, shop: Some(after_shop), checked: true },
    ]
}

/// The other build's `stockguard check` on its database: its last line of
/// output, and whether it exited 0.
async fn check(bin: &Path, database_url: &str) -> anyhow::Result<String> {
    let output = tokio::process::Command::new(bin)
        .arg("check")
        .env("DATABASE_URL", database_url)
        .output()
        .await
        .with_context(|| format!("{} check", bin.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let last = text.lines().last().unwrap_or("(no output)").trim().to_owned();
    Ok(format!("{last} (exit {})", output.status.code().map_or_else(|| "by a signal".into(), |c| c.to_string())))
}

/// The other build's `--version`.
async fn version(bin: &Path) -> String {
    match tokio::process::Command::new(bin).arg("--version").output().await {
        Ok(output) => String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        Err(err) => format!("unknown ({err})"),
    }
}

impl Baseline {
    /// The report's section.
    pub fn markdown(&self) -> String {
        let mut md = format!(
            "\n## HOT, SPREAD, MULTI (and KIT) before and after this build\n\n\
             HOT, SPREAD and MULTI (the catalogue over 4 locations), and KIT and KIT+SINGLES when the other \
             build has kits (`createKit` after the other cells), on the server of another build (`{}`, {}) \
             and on a second server of this build (or of the build given by `--after-bin`), \
             each on a fresh database of its own migrated by it and seeded the same way through its API \
             (`createInventory`; for MULTI then `createLocation` and `transferStock`, after the other cells), \
             taking turns round by round. \
             Its database after the cells, by its own `stockguard check`: {}; \
             this build / before = this build's res/s over the other's.\n\n",
            self.bin.display(),
            self.version,
            self.check
        );
        md.push_str(&pairs::table(&self.cells, ["before", "this build"]));
        md.push('\n');
        md
    }
}
