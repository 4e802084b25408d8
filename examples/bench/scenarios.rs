//! The workloads: what each client does in a loop (the hot or spread
//! `reserve`, `reserve` at an expected version with retries, one contested
//! order, contested checkouts of carts, `reserveKit`), the raw-SQL side of a reserve cell, and the benchmark's runs of
//! them against its own server and database. The load tool (`load.rs`) runs
//! the same client loops against a server that is already running.

mod clients;
mod kits;
mod multi;
mod setup;

pub use self::{clients::*, kits::*, multi::*, setup::*};

use std::{
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use futures::{StreamExt as _, TryStreamExt as _};
use reqwest::header::HeaderValue;
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, Statement, TransactionTrait,
    sqlx::{self, Connection as _, postgres::PgConnection},
};
use serde_json::{Value, json};
use stockguard::{
    auth::{Keys, Role},
    stock::{RESERVE_SQL, allocating::Allocating, receiving, taking::Reserve},
};
use tokio::sync::RwLock;
use uuid::Uuid;

use crate::{
    Settings,
    measure::{Extra, Measured, ONE_REQUEST, Recorder, Stats, Usage, measure, run_tasks, window_of},
    report::Cell,
};
use stockguard_support::{
    client::{Gql, Outcome},
    documents::brief::{
        CANCEL, CHANGE_ADDRESS, CHECKOUT, CONFIRM, INVENTORY_VERSION, ORDER_VERSION, RELEASE, RESERVE, RESERVE_TYPENAME,
    },
    process::ServerProcess,
};

/// The statement a raw-SQL side of a reserve cell runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Raw {
    /// The server's own `RESERVE_SQL` on the server's schema: the limit.
    Limit,
    /// The server's own multi-location reserve statement on the server's
    /// schema, asking as a `reserve` naming no location does: MULTI's limit
    /// (`Reserve::allocating_query`, `ALLOCATING_RESERVE_SQL`).
    Anywhere,
    /// [`FLOOR_SQL`] on its own schema: what any reservation system pays.
    Floor,
    /// The server's own kit statement (`stock::kitting::reserve_kit`) for
    /// the kit clients of a KIT or KIT+SINGLES cell, `RESERVE_SQL` for the
    /// others: their limit.
    Kit,
}

/// The minimal two-write reservation: the conditional decrement and the
/// reservation row, on a schema of nothing more (`floor`, see
/// [`create_floor`]): `$1` inventory, `$2` quantity, `$3` id, `$4` user.
pub const FLOOR_SQL: &str = "WITH taken AS (\
       UPDATE floor.inventories SET stock = stock - $2 WHERE id = $1 AND stock >= $2 RETURNING id) \
     INSERT INTO floor.reservations (id, inventory_id, user_id, quantity) \
     SELECT $3, id, $4, $2 FROM taken RETURNING id";

/// The floor's schema, with a copy of every inventory's id and stock.
pub async fn create_floor(db: &DatabaseConnection) -> anyhow::Result<()> {
    db.execute_unprepared(
        "CREATE SCHEMA floor; \
         CREATE TABLE floor.inventories (id uuid PRIMARY KEY, stock integer NOT NULL CHECK (stock >= 0)); \
         CREATE TABLE floor.reservations (id uuid PRIMARY KEY, inventory_id uuid NOT NULL, user_id text NOT NULL, \
             quantity integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now()); \
         INSERT INTO floor.inventories SELECT id, stock FROM inventories; ANALYZE floor.inventories;",
    )
    .await
    .context("the floor's schema")?;
    Ok(())
}

/// The outcomes of a successful reservation in a reserve cell: a single
/// reserve's, and a kit's (KIT and KIT+SINGLES), counted as one each.
pub const RESERVED: [&str; 2] = ["Reserved", KIT_RESERVED];

/// Which inventories a reserve cell takes from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Scenario {
    /// One row everyone wants.
    Hot,
    /// 10,000 rows, picked at random.
    Spread,
    /// Rows whose stock is spread over 4 locations, picked at random, 1–3
    /// units each (see [`Shop::seed_multi`]).
    Multi,
    /// Kits of 4 SPREAD rows, picked at random, one kit at a time (see
    /// [`Shop::seed_kits`]).
    Kit,
    /// Half the clients reserve kits as KIT does, half one unit of a
    /// random component row of those kits.
    KitSingles,
}

impl Scenario {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Self::Hot => "HOT",
            Self::Spread => "SPREAD",
            Self::Multi => "MULTI",
            Self::Kit => "KIT",
            Self::KitSingles => "KIT+SINGLES",
        }
    }

    /// How many units each of its reserves asks for.
    pub fn units(self) -> Units {
        match self {
            Self::Hot | Self::Spread | Self::Kit | Self::KitSingles => Units::One,
            Self::Multi => Units::OneToThree,
        }
    }
}

/// How many units a reserve asks for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Units {
    /// One, drawing nothing, so a client picks the same rows as ever.
    One,
    /// 1, 2 or 3, at random.
    OneToThree,
}

impl Units {
    /// The units of the next reserve.
    pub fn draw(self, rng: &mut Rng) -> i32 {
        match self {
            Self::One => 1,
            Self::OneToThree => 1 + rng.below(3) as i32,
        }
    }
}

/// What a reserve client takes from: rows picked at random, and the units
/// each reserve asks for.
#[derive(Clone)]
pub struct Targets {
    /// The rows.
    pub ids: Arc<Vec<Uuid>>,
    /// Units per reserve.
    pub units: Units,
}

/// A fast PRNG for picking SPREAD rows (xorshift64*).
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// A number below `n`.
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as usize % n
    }
}

// ---------------------------------------------------------------------------
// The benchmark's runs

/// One database the benchmark measures on, as its server sees it: HOT,
/// the SPREAD inventories and the floor's schema.
pub struct Shop {
    /// The throw-away database.
    pub database_url: String,
    /// A connection for seeding, settling and checking.
    pub db: DatabaseConnection,
    /// The one HOT inventory.
    pub hot: Uuid,
    /// The SPREAD inventories.
    pub spread: Arc<Vec<Uuid>>,
    /// The MULTI inventories, once seeded (after the single-location cells).
    pub multi: Arc<Vec<Uuid>>,
    /// The kits, once seeded (after every other cell).
    pub kits: Arc<Vec<BenchKit>>,
    /// The SPREAD inventories in at least one kit, once the kits are seeded.
    pub kit_components: Arc<Vec<Uuid>>,
    /// Whether its inventories are made through the server's API only
    /// (another build's server, see [`Shop::open_through_api`]).
    pub through_api: bool,
}

impl Shop {
    /// Seeds the database of `server` (already migrated by it): HOT through
    /// the server, SPREAD and the floor in SQL.
    pub async fn open(database_url: &str, server: &ServerProcess, keys: &Keys) -> anyhow::Result<Self> {
        Self::seeded(database_url, server, keys, false).await
    }

    /// [`Shop::open`] for a server of another build (`--baseline-bin`),
    /// whose schema this build's statements may not fit: SPREAD (and later
    /// MULTI) is made through the server's API too, with `createInventory`.
    pub async fn open_through_api(database_url: &str, server: &ServerProcess, keys: &Keys) -> anyhow::Result<Self> {
        Self::seeded(database_url, server, keys, true).await
    }

    async fn seeded(
        database_url: &str,
        server: &ServerProcess,
        keys: &Keys,
        through_api: bool,
    ) -> anyhow::Result<Self> {
        let config = stockguard::config::DatabaseConfig {
            database_url: Some(database_url.to_owned()),
            pool_size: 2,
            acquire_timeout_ms: 10_000,
            statement_timeout_ms: 300_000,
            ..stockguard::config::DatabaseConfig::default()
        };
        let db = stockguard::db::connect(database_url, &config).await?;
        let operator = keys.mint("bench-operator", Role::Operator, chrono::Duration::hours(4))?;
        let hot = Gql::new(&server.url, 1)?.create_inventory(&operator, "HOT", "bench HOT", 1_000_000_000).await?;
        let spread = if through_api {
            create_rows(server, &operator, "SPREAD", &[SPREAD_STOCK; SPREAD_ROWS]).await?
        } else {
            seed_spread(&db).await?
        };
        let spread = Arc::new(spread);
        create_floor(&db).await?;
        Ok(Self {
            database_url: database_url.to_owned(),
            db,
            hot,
            spread,
            multi: Arc::default(),
            kits: Arc::default(),
            kit_components: Arc::default(),
            through_api,
        })
    }

    fn targets(&self, scenario: Scenario) -> Targets {
        let ids = match scenario {
            Scenario::Hot => Arc::new(vec![self.hot]),
            Scenario::Spread => self.spread.clone(),
            Scenario::Multi => self.multi.clone(),
            // The single reserves of KIT+SINGLES (KIT's clients take kits only).
            Scenario::Kit | Scenario::KitSingles => self.kit_components.clone(),
        };
        Targets { ids, units: scenario.units() }
    }

    /// Brings the database to the same state before every run, as pgbench
    /// does: the inventories vacuumed (earlier runs left dead row versions)
    /// and a checkpoint taken, so no run pays for the one before it and a
    /// checkpoint falls inside a measured window less often.
    async fn settle(&self) -> anyhow::Result<()> {
        // MULTI's levels too, once there are any (and the kits', whose
        // reserves change SPREAD's); before that the single-location cells
        // settle as they always have.
        let levels =
            if self.multi.is_empty() && self.kits.is_empty() { None } else { Some("VACUUM (ANALYZE) stock_levels") };
        let sqls = ["VACUUM (ANALYZE) inventories", "VACUUM (ANALYZE) floor.inventories"].into_iter().chain(levels);
        for sql in sqls.chain(["CHECKPOINT"]) {
            self.db.execute_unprepared(sql).await.with_context(|| format!("before a run: {sql}"))?;
        }
        Ok(())
    }
}

/// The docs/design.md invariant checks made so far and what they found.
#[derive(Default)]
pub struct Invariant {
    /// Checks made.
    pub checks: u32,
    /// What they found.
    pub violations: Vec<String>,
}

impl Invariant {
    /// Checks the invariant in `db`; a violation is remembered (and makes
    /// the benchmark exit 1).
    pub async fn check(&mut self, db: &DatabaseConnection, after: &str) -> anyhow::Result<()> {
        let drifts = stockguard::invariant::check(db).await.context("invariant check")?;
        self.checks += 1;
        if drifts.is_empty() {
            eprintln!("bench:   invariant holds after {after}");
        } else {
            for drift in &drifts {
                eprintln!("bench:   INVARIANT VIOLATED after {after}: {drift}");
                self.violations.push(format!("after {after}: {drift}"));
            }
        }
        Ok(())
    }
}

/// One side of a reserve cell: who reserves, in which database.
pub struct Side<'a> {
    /// Its name in the progress lines.
    pub label: &'static str,
    /// Where it reserves.
    pub shop: &'a Shop,
    /// How.
    pub by: By<'a>,
}

/// How a side reserves.
#[derive(Clone, Copy)]
pub enum By<'a> {
    /// `reserve` over HTTP to this server.
    Http(&'a ServerProcess),
    /// This statement straight to the database.
    Sql(Raw),
}

/// The benchmark's state between runs: its database, and the invariant
/// checks made so far.
pub struct Bench {
    /// The run's settings.
    pub settings: Settings,
    /// Mints the clients' tokens.
    pub keys: Keys,
    /// The database of the main server.
    pub shop: Shop,
    /// Clock ticks per second, for /proc CPU times.
    pub clk_tck: f64,
    /// The server's reservation TTL, which the raw-SQL runs pass too, so both
    /// write the same rows (an expiring reservation is also in the sweeper's index).
    pub ttl_secs: i32,
    /// The invariant checks.
    pub invariant: Invariant,
}

impl Bench {
    fn tokens(&self, clients: usize) -> anyhow::Result<Vec<String>> {
        (0..clients)
            .map(|i| Ok(self.keys.mint(&format!("bench-{i}"), Role::Customer, chrono::Duration::hours(4))?))
            .collect()
    }

    /// The window of one run of the configured duration.
    fn window(&self) -> (Instant, Instant) {
        window_of(self.settings.warmup, self.settings.duration)
    }

    /// One reserve cell: Stockguard, raw SQL and the floor take turns for
    /// `settings.rounds` rounds, each measured for its share of the duration.
    pub async fn cell(&mut self, server: &ServerProcess, scenario: Scenario, clients: usize) -> anyhow::Result<Cell> {
        let shop = &self.shop;
        let sides = [
            Side { label: "Stockguard", shop, by: By::Http(server) },
            Side { label: "raw SQL", shop, by: By::Sql(Raw::Limit) },
            Side { label: "floor", shop, by: By::Sql(Raw::Floor) },
        ];
        let [stockguard, raw, floor] = self.rounds(&sides, scenario, clients).await?;
        self.invariant.check(&self.shop.db, &format!("{} x{clients}, Stockguard and raw SQL", scenario.name())).await?;
        Ok(Cell { scenario, clients, stockguard, raw, floor })
    }

    /// `sides` take turns for `settings.rounds` rounds, each measured for
    /// its share of the duration, so whatever else the machine does falls
    /// on all of them alike; every other round runs them in reverse.
    /// Every database is settled first.
    pub async fn rounds<const N: usize>(
        &self,
        sides: &[Side<'_>; N],
        scenario: Scenario,
        clients: usize,
    ) -> anyhow::Result<[Stats; N]> {
        for (i, side) in sides.iter().enumerate() {
            if !sides[..i].iter().any(|s| std::ptr::eq(s.shop, side.shop)) {
                side.shop.settle().await?;
            }
        }
        let rounds = self.settings.rounds;
        let slice = self.settings.duration / rounds;
        let mut measured: [Measured; N] = std::array::from_fn(|_| Measured::default());
        for round in 1..=rounds {
            // Every other round backwards, so no side always runs first
            // (or always right after a given other).
            let mut order: [usize; N] = std::array::from_fn(|i| i);
            if round % 2 == 0 {
                order.reverse();
            }
            let mut reserved = [0.0; N];
            for i in order {
                let side = &sides[i];
                let m = match side.by {
                    By::Http(server) => self.stockguard(server, side.shop, scenario, clients, slice).await?,
                    By::Sql(statement) => self.raw_sql(statement, side.shop, scenario, clients, slice).await?,
                };
                let outcomes = &m.0.outcomes;
                let successes: u64 = RESERVED.iter().filter_map(|name| outcomes.get(*name)).sum();
                reserved[i] = successes as f64 / slice.as_secs_f64();
                measured[i].add(m);
            }
            // Per round, so a slow patch (a checkpoint's full-page writes) shows where it fell.
            let line: Vec<String> = sides.iter().zip(reserved).map(|(s, r)| format!("{} {r:.0}", s.label)).collect();
            eprintln!("bench:   round {round}: {} res/s", line.join(", "));
        }
        let seconds = (slice * rounds).as_secs_f64();
        Ok(measured.map(|m| m.stats(seconds)))
    }

    /// `reserve` over HTTP for `measured` (after the warm-up): one task per
    /// client, each with its own token.
    pub async fn stockguard(
        &self,
        server: &ServerProcess,
        shop: &Shop,
        scenario: Scenario,
        clients: usize,
        measured: Duration,
    ) -> anyhow::Result<(Recorder, Usage)> {
        let gql = Arc::new(Gql::new(&server.url, clients)?);
        let targets = shop.targets(scenario);
        let (measure_from, until) = window_of(self.settings.warmup, measured);
        let tasks = (self.tokens(clients)?.into_iter().enumerate())
            .map(|(i, token)| {
                let rec = Recorder::new(measure_from, until);
                let keyed = self.settings.keyed;
                if scenario.kit_client(i) {
                    let kits = shop.kits.clone();
                    return tokio::spawn(reserve_kit_client(gql.clone(), token, kits, i as u64 + 1, rec, keyed));
                }
                tokio::spawn(reserve_client(gql.clone(), token, targets.clone(), i as u64 + 1, rec, None, keyed))
            })
            .collect();
        measure(Some(server.pid), &shop.db, self.clk_tck, measure_from, run_tasks(tasks)).await
    }

    /// `statement` for `measured`, prepared, through one dedicated
    /// connection per client.
    async fn raw_sql(
        &self,
        statement: Raw,
        shop: &Shop,
        scenario: Scenario,
        clients: usize,
        measured: Duration,
    ) -> anyhow::Result<(Recorder, Usage)> {
        let targets = shop.targets(scenario);
        let (ttl_secs, keyed) = (self.ttl_secs, self.settings.keyed);
        let mut connections = Vec::with_capacity(clients);
        for _ in 0..clients {
            connections.push(connect_patiently(&shop.database_url).await.context("raw SQL: connect")?);
        }
        let (measure_from, until) = window_of(self.settings.warmup, measured);
        // The connections are closed after the measurement, so their
        // backends are still there when their CPU is read.
        let done = Arc::new(std::sync::Mutex::new(Vec::with_capacity(clients)));
        let tasks = connections
            .into_iter()
            .enumerate()
            .map(|(i, mut conn)| {
                let done = done.clone();
                let targets = targets.clone();
                let kits = (statement == Raw::Kit && scenario.kit_client(i)).then(|| shop.kits.clone());
                tokio::spawn(async move {
                    let user = format!("bench-raw-{i}");
                    let mut rec = Recorder::new(measure_from, until);
                    let mut rng = Rng::new(i as u64 + 1_000);
                    let (prefix, mut sent) = (Uuid::new_v4().simple(), 0u64);
                    let anywhere = Allocating::default();
                    while Instant::now() < until {
                        sent += 1;
                        // A fresh key per statement, and a fingerprint the size of the server's.
                        let key = keyed.then(|| (format!("{prefix}-{sent}"), format!("{sent:064x}")));
                        if let Some(kits) = &kits {
                            let kit = &kits[rng.below(kits.len())];
                            let key = key.as_ref().map(|(key, fingerprint)| (key.as_str(), fingerprint.as_str()));
                            let start = Instant::now();
                            let outcome = raw_kit(&mut conn, kit, &user, key, ttl_secs).await;
                            rec.record(start, &outcome, ONE_REQUEST);
                            continue;
                        }
                        let reserve = Reserve {
                            inventory_id: targets.ids[rng.below(targets.ids.len())],
                            quantity: targets.units.draw(&mut rng),
                            expected_version: None,
                            // Time-ordered ids, as the server makes them.
                            reservation_id: Uuid::now_v7(),
                            movement_id: Uuid::now_v7(),
                            user_id: &user,
                            idempotency_key: key.as_ref().map(|(key, _)| key.as_str()),
                            fingerprint: key.as_ref().map(|(_, fingerprint)| fingerprint.as_str()),
                            ttl_secs,
                            allocating: &anywhere,
                            use_safety_stock: false,
                        };
                        let query = match statement {
                            Raw::Limit | Raw::Kit => reserve.query(),
                            Raw::Anywhere => reserve.allocating_query(),
                            Raw::Floor => sqlx::query(FLOOR_SQL)
                                .bind(reserve.inventory_id)
                                .bind(reserve.quantity)
                                .bind(reserve.reservation_id)
                                .bind(reserve.user_id),
                        };
                        let start = Instant::now();
                        let outcome = match query.fetch_optional(&mut conn).await {
                            Ok(Some(_)) => Outcome::Ok("Reserved".into(), Value::Null),
                            Ok(None) => Outcome::Ok("no row".into(), Value::Null),
                            Err(err) => Outcome::Error(match err.as_database_error().and_then(|e| e.code()) {
                                Some(code) => format!("SQLSTATE {code}"),
                                None => "database".into(),
                            }),
                        };
                        rec.record(start, &outcome, ONE_REQUEST);
                    }
                    done.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(conn);
                    anyhow::Ok(rec)
                })
            })
            .collect();
        let measured = measure(None, &shop.db, self.clk_tck, measure_from, run_tasks(tasks)).await;
        let connections = std::mem::take(&mut *done.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        for conn in connections {
            let _ = conn.close().await;
        }
        measured
    }

    /// HOT with `expectedVersion`: read the version, reserve at it, on
    /// `Conflict` read again and retry (at most 3 retries).
    pub async fn expected_version(&mut self, server: &ServerProcess, clients: usize) -> anyhow::Result<Stats> {
        let gql = Arc::new(Gql::new(&server.url, clients)?);
        let tokens = self.tokens(clients)?;
        let hot = self.shop.hot;
        self.shop.settle().await?;
        let (measure_from, until) = self.window();
        let tasks = tokens
            .into_iter()
            .map(|token| {
                let gql = gql.clone();
                tokio::spawn(async move {
                    let mut rec = Recorder::new(measure_from, until);
                    while Instant::now() < until {
                        let start = Instant::now();
                        let mut extra = Extra { conflicts: 0, retries: 0, requests: 0 };
                        let mut outcome = Outcome::Ok("gave up".into(), Value::Null);
                        for attempt in 0..4 {
                            if attempt > 0 {
                                extra.retries += 1;
                            }
                            extra.requests += 2;
                            let seen = match gql.data(&token, INVENTORY_VERSION, json!({ "id": hot })).await {
                                Ok(body) => body["data"]["inventory"]["version"].as_i64(),
                                Err(err) => {
                                    outcome = Outcome::Error(err);
                                    break;
                                }
                            };
                            let Some(version) = seen else {
                                outcome = Outcome::Error("no version".into());
                                break;
                            };
                            let input = json!({ "i": { "inventoryId": hot, "expectedVersion": version } });
                            match gql.call(&token, RESERVE_TYPENAME, input, "reserve").await {
                                Outcome::Ok(name, _) if name == "Conflict" => extra.conflicts += 1,
                                other => {
                                    outcome = other;
                                    break;
                                }
                            }
                        }
                        rec.record(start, &outcome, extra);
                    }
                    anyhow::Ok(rec)
                })
            })
            .collect();
        let (recorder, usage) =
            measure(Some(server.pid), &self.shop.db, self.clk_tck, measure_from, run_tasks(tasks)).await?;
        let mut stats = Stats::from(recorder, self.settings.duration.as_secs_f64(), &["Reserved"]);
        stats.usage = usage;
        self.invariant.check(&self.shop.db, &format!("expectedVersion HOT x{clients}")).await?;
        Ok(stats)
    }

    /// One order contested by `clients` (see [`OrderContest`]).
    pub async fn contested_order(
        &mut self,
        server: &ServerProcess,
        clients: usize,
        mode: &str,
    ) -> anyhow::Result<Stats> {
        let gql = Arc::new(Gql::new(&server.url, clients)?);
        let operator = self.keys.mint("bench-operator", Role::Operator, chrono::Duration::hours(4))?;
        let customer = self.keys.mint("bench-order-customer", Role::Customer, chrono::Duration::hours(4))?;
        let sku = format!("ORDER-{mode}");
        let inventory = gql.create_inventory(&operator, &sku, &format!("bench {sku}"), 1_000_000_000).await?;
        let first = gql.place_order(&customer, inventory, address("start")).await?;
        let contest =
            Arc::new(OrderContest { gql, current: Arc::new(RwLock::new(first)), operator, customer, inventory });
        self.shop.settle().await?;
        let (measure_from, until) = self.window();
        let tasks = (0..clients)
            .map(|i| tokio::spawn(contest.clone().client(i, Recorder::new(measure_from, until), until)))
            .collect();
        let (recorder, usage) =
            measure(Some(server.pid), &self.shop.db, self.clk_tck, measure_from, run_tasks(tasks)).await?;
        let mut stats = Stats::from(recorder, self.settings.duration.as_secs_f64(), &ORDER_SUCCESSES);
        stats.usage = usage;
        self.invariant.check(&self.shop.db, &format!("contested order, {mode}")).await?;
        Ok(stats)
    }
}
