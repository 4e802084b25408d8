//! MULTI: reserving on a catalogue whose stock is spread over 4 locations
//! (docs/locations.md), against the one-statement limit of the server's
//! multi-location reserve statement, measured the way the single-location
//! cells measure `RESERVE_SQL`.
//!
//! Each item holds a few units (0 to 39, at random) at each of its three
//! preferred locations (`default`, priority 0; `bench-a`, 10; `bench-b`,
//! 20) and the bulk at the last (`bench-c`, 30). Reserves of 1–3 units name
//! no location, so they take by PRIORITY with splits allowed: from the first
//! location that still has units, splitting where one runs short, until the
//! small levels are used up. The share of reservations that split is
//! reported beside each cell. Both sides take from the same rows, turn by
//! turn, so they see the same levels.

use futures::{StreamExt as _, TryStreamExt as _};
use stockguard_support::documents::brief::{CREATE_LOCATION, TRANSFER_STOCK};

use super::*;

/// MULTI's rows in a full run, and in the smoke.
const MULTI_ROWS: usize = 10_000;
const MULTI_ROWS_SMOKE: usize = 200;
/// Units at each of the three preferred locations are below this.
const SMALL: usize = 40;
/// Units at each item's last location: never running out, and with the
/// three small levels at most the 10^9 units `createInventory` takes (a
/// server of another build is seeded through it).
const BULK: i32 = 1_000_000_000 - 3 * SMALL as i32;
/// The three locations made besides `default`: code and priority.
const LOCATIONS: [(&str, i32); 3] = [("bench-a", 10), ("bench-b", 20), ("bench-c", 30)];

/// One MULTI cell: Stockguard over HTTP and the multi-location limit.
pub struct MultiCell {
    /// Concurrent clients.
    pub clients: usize,
    /// Over HTTP.
    pub stockguard: Stats,
    /// The multi-location statement, one per reservation.
    pub limit: Stats,
    /// Of the reservations both sides made in this cell: (split over more
    /// than one location, all).
    pub split: (i64, i64),
}

impl Shop {
    /// Seeds MULTI through the server's API: three locations
    /// (`createLocation`), `rows` items created at `default` (in SQL, or
    /// with `createInventory` on a shop seeded [through the
    /// API](Shop::open_through_api)), then each item's units moved to the
    /// others (`transferStock`, 16 at a time).
    pub async fn seed_multi(&mut self, server: &ServerProcess, keys: &Keys, rows: usize) -> anyhow::Result<()> {
        let operator = keys.mint("bench-operator", Role::Operator, chrono::Duration::hours(4))?;
        let gql = Gql::new(&server.url, 16)?;
        let mut locations = Vec::with_capacity(LOCATIONS.len());
        for (code, priority) in LOCATIONS {
            let input = json!({ "i": { "code": code, "name": format!("bench {code}"), "priority": priority } });
            let body = gql.data(&operator, CREATE_LOCATION, input).await.map_err(anyhow::Error::msg)?;
            let id =
                body["data"]["createLocation"]["id"].as_str().with_context(|| format!("createLocation: {body}"))?;
            locations.push(id.parse::<Uuid>()?);
        }
        let default = show(&self.db, "SELECT id::text FROM locations WHERE code = 'default'").await;
        let default: Uuid = default.parse().with_context(|| format!("the default location's id: {default}"))?;

        // What stays at `default`, then what goes to each new location.
        let mut rng = Rng::new(4);
        let layouts: Vec<[i32; 4]> = (0..rows)
            .map(|_| {
                let mut small = || rng.below(SMALL) as i32;
                [small(), small(), small(), BULK]
            })
            .collect();
        let stocks: Vec<i32> = layouts.iter().map(|l| l.iter().sum()).collect();
        let ids = if self.through_api {
            create_rows(server, &operator, "MULTI", &stocks).await?
        } else {
            seed_rows(&self.db, "MULTI", &stocks).await?
        };
        let transfers = ids.iter().zip(&layouts).flat_map(|(&id, layout)| {
            (locations.iter().zip(&layout[1..])).filter(|(_, units)| **units > 0).map(move |(&to, &units)| {
                json!({ "i": { "inventoryId": id, "fromLocationId": default, "toLocationId": to, "quantity": units } })
            })
        });
        let (gql, operator) = (&gql, &operator);
        futures::stream::iter(transfers)
            .map(|input| async move {
                match gql.call(operator, TRANSFER_STOCK, input, "transferStock").await {
                    Outcome::Ok(name, _) if name == "StockTransferred" => Ok(()),
                    Outcome::Ok(name, _) => anyhow::bail!("transferStock: {name}"),
                    Outcome::Error(err) => anyhow::bail!("transferStock: {err}"),
                }
            })
            .buffer_unordered(16)
            .try_collect::<()>()
            .await?;
        self.db.execute_unprepared("ANALYZE stock_levels; ANALYZE locations;").await?;
        self.multi = Arc::new(ids);
        Ok(())
    }

    /// Of MULTI's reservations so far: (split over more than one location, all).
    async fn splits(&self) -> anyhow::Result<(i64, i64)> {
        let row = self
            .db
            .query_one_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT count(*) FILTER (WHERE n > 1) AS split, count(*) AS total FROM ( \
                   SELECT count(*) AS n FROM allocations a JOIN reservations r ON r.id = a.reservation_id \
                    WHERE r.inventory_id = ANY($1) GROUP BY a.reservation_id) per_reservation",
                [self.multi.to_vec().into()],
            ))
            .await?
            .context("one row")?;
        Ok((row.try_get("", "split")?, row.try_get("", "total")?))
    }
}

impl Bench {
    /// MULTI's rows in this run.
    pub fn multi_rows(&self) -> usize {
        if self.settings.smoke { MULTI_ROWS_SMOKE } else { MULTI_ROWS }
    }

    /// Seeds MULTI and measures it at every client count; run after the
    /// single-location cells, which so measure what they always have.
    pub async fn multi_cells(&mut self, server: &ServerProcess) -> anyhow::Result<Vec<MultiCell>> {
        let rows = self.multi_rows();
        eprintln!("bench: seeding MULTI ({rows} rows over 4 locations: createLocation, transferStock)");
        self.shop.seed_multi(server, &self.keys, rows).await?;
        self.invariant.check(&self.shop.db, "seeding MULTI").await?;
        let mut cells = Vec::new();
        for clients in self.settings.clients.clone() {
            eprintln!(
                "bench: MULTI x{clients}: Stockguard and the multi-location limit, {} rounds",
                self.settings.rounds
            );
            let before = self.shop.splits().await?;
            let shop = &self.shop;
            let sides = [
                Side { label: "Stockguard", shop, by: By::Http(server) },
                Side { label: "limit", shop, by: By::Sql(Raw::Anywhere) },
            ];
            let [stockguard, limit] = self.rounds(&sides, Scenario::Multi, clients).await?;
            let after = self.shop.splits().await?;
            let split = (after.0 - before.0, after.1 - before.1);
            for (side, stats) in [("Stockguard", &stockguard), ("limit", &limit)] {
                eprintln!(
                    "bench:   {side}: {:.0} res/s, p99 {:.2} ms, {}",
                    stats.per_sec(stats.successes),
                    stats.p99_ms,
                    stats.outcomes_text()
                );
            }
            eprintln!("bench:   split over locations: {} of {} reservations", split.0, split.1);
            self.invariant.check(&self.shop.db, &format!("MULTI x{clients}")).await?;
            cells.push(MultiCell { clients, stockguard, limit, split });
        }
        Ok(cells)
    }
}
