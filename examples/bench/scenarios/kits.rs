//! KIT and KIT+SINGLES: reserving kits of SPREAD's inventories
//! (docs/kits.md), against the one-statement limit of the server's kit
//! statement (`stock::kitting::reserve_kit`), measured the way the
//! single-location cells measure `RESERVE_SQL`.
//!
//! The kits are made after every other cell, so those measure the database
//! they always have: [`KITS`] kits (`createKit`, as an operator), each of
//! [`COMPONENTS`] distinct SPREAD inventories drawn at random, one unit of
//! each per kit; an inventory may be in several kits, as a battery is in
//! several camera kits. KIT's clients `reserveKit` one kit at a time,
//! naming no location (the default choice); KIT+SINGLES's even clients do
//! so too, its odd ones `reserve` one unit of a random component inventory
//! of those kits, so kits and single reserves wait for the same rows. The
//! limit side runs the same mix: the kit statement, built as the server
//! builds it (the kit's lines as `kit_components` holds them), and
//! `RESERVE_SQL`, each prepared, one dedicated connection per client.
//!
//! A kit reservation counts as one reservation; it writes one reservation
//! per component, shown beside it as component reservations.

use std::collections::BTreeMap;

use sea_query_sqlx::SqlxValues;
use stockguard::stock::{
    kitting::{KitReserve, reserve_kit},
    lines::Line,
};
use stockguard_support::documents::{CREATE_KIT, brief::RESERVE_KIT_TYPENAME};

use super::*;

/// Kits in a full run, and in the smoke.
const KITS: usize = 2_500;
const KITS_SMOKE: usize = 50;
/// Distinct SPREAD inventories per kit, one unit of each.
pub const COMPONENTS: usize = 4;

/// One kit as the limit side reserves it: its id and its lines (one per
/// component, by inventory id, one unit per kit each, the default choice
/// of locations), as `reserveKit` of one kit builds them.
pub struct BenchKit {
    /// The kit.
    pub id: Uuid,
    /// Its lines for one kit.
    pub lines: Vec<Line>,
}

/// One KIT or KIT+SINGLES cell: Stockguard over HTTP and the limit.
pub struct KitCell {
    /// [`Scenario::Kit`] or [`Scenario::KitSingles`].
    pub scenario: Scenario,
    /// Concurrent clients.
    pub clients: usize,
    /// Over HTTP.
    pub stockguard: Stats,
    /// The kit statement (and `RESERVE_SQL` for KIT+SINGLES's single reserves).
    pub limit: Stats,
}

/// Of `stats`: (kit reservations, single reservations).
pub fn kits_and_singles(stats: &Stats) -> (u64, u64) {
    let count = |name: &str| stats.outcomes.get(name).copied().unwrap_or(0);
    (count(KIT_RESERVED), count("Reserved"))
}

/// Reservations of components per second: [`COMPONENTS`] per kit, one per single reserve.
pub fn component_reservations_per_sec(stats: &Stats) -> f64 {
    let (kits, singles) = kits_and_singles(stats);
    stats.per_sec(kits * COMPONENTS as u64 + singles)
}

/// Kits made in a run (the smoke's or a full one).
pub fn kit_count(smoke: bool) -> usize {
    if smoke { KITS_SMOKE } else { KITS }
}

/// The outcome of a kit reserved, over HTTP and in raw SQL.
pub const KIT_RESERVED: &str = "KitReserved";

impl Scenario {
    /// KIT or KIT+SINGLES.
    pub fn is_kit(self) -> bool {
        matches!(self, Self::Kit | Self::KitSingles)
    }

    /// Whether client `i` of this scenario reserves kits (the others, of
    /// KIT+SINGLES, reserve single units of the kits' components).
    pub fn kit_client(self, i: usize) -> bool {
        match self {
            Self::Kit => true,
            Self::KitSingles => i.is_multiple_of(2),
            Self::Hot | Self::Spread | Self::Multi => false,
        }
    }
}

impl Shop {
    /// Seeds `count` kits of [`COMPONENTS`] distinct random SPREAD
    /// inventories, one unit each, through the server's API (`createKit`,
    /// 16 at a time), then reads their lines back as the server reads them
    /// (not on a shop seeded [through the API](Shop::open_through_api),
    /// whose schema may be another build's and which has no limit side).
    pub async fn seed_kits(&mut self, server: &ServerProcess, keys: &Keys, count: usize) -> anyhow::Result<()> {
        let operator = keys.mint("bench-operator", Role::Operator, chrono::Duration::hours(4))?;
        let gql = Gql::new(&server.url, 16)?;
        let mut rng = Rng::new(48);
        let recipes: Vec<Vec<Uuid>> = (0..count)
            .map(|_| {
                let mut picked = Vec::with_capacity(COMPONENTS);
                while picked.len() < COMPONENTS {
                    let id = self.spread[rng.below(self.spread.len())];
                    if !picked.contains(&id) {
                        picked.push(id);
                    }
                }
                picked
            })
            .collect();
        let (gql, operator) = (&gql, &operator);
        let ids: Vec<Uuid> = futures::stream::iter((1..).zip(&recipes))
            .map(|(n, recipe)| async move {
                let components: Vec<Value> =
                    recipe.iter().map(|id| json!({ "inventoryId": id, "quantity": 1 })).collect();
                let input =
                    json!({ "input": { "sku": format!("KIT-{n}"), "name": format!("bench kit {n}"), "components": components } });
                let body = gql.data(operator, CREATE_KIT, input).await.map_err(anyhow::Error::msg)?;
                let id = body["data"]["createKit"]["id"].as_str().with_context(|| format!("createKit: {body}"))?;
                anyhow::Ok(id.parse::<Uuid>()?)
            })
            .buffered(16)
            .try_collect()
            .await?;
        let mut components: Vec<Uuid> = recipes.into_iter().flatten().collect();
        components.sort_unstable();
        components.dedup();
        self.kit_components = Arc::new(components);
        let analyzed = self.db.execute_unprepared("ANALYZE kits; ANALYZE kit_components;").await;
        if self.through_api {
            // Another build's tables may be named otherwise: analyzed if they are not.
            self.kits = Arc::new(ids.into_iter().map(|id| BenchKit { id, lines: Vec::new() }).collect());
            return Ok(());
        }
        analyzed?;

        // The lines as `reserveKit` builds them: the components by inventory id.
        let rows = self
            .db
            .query_all_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT kit_id, inventory_id, quantity FROM kit_components WHERE kit_id = ANY($1) \
                  ORDER BY kit_id, inventory_id",
                [ids.clone().into()],
            ))
            .await?;
        let mut lines: BTreeMap<Uuid, Vec<Line>> = BTreeMap::new();
        for row in rows {
            let kit: Uuid = row.try_get("", "kit_id")?;
            lines.entry(kit).or_default().push(Line {
                inventory_id: row.try_get("", "inventory_id")?,
                quantity: row.try_get("", "quantity")?,
                expected_version: None,
                allocating: Allocating::default(),
            });
        }
        let kits: Vec<BenchKit> = ids
            .iter()
            .map(|&id| {
                let lines = lines.remove(&id).unwrap_or_default();
                anyhow::ensure!(lines.len() == COMPONENTS, "kit {id} has {} components", lines.len());
                Ok(BenchKit { id, lines })
            })
            .collect::<anyhow::Result<_>>()?;
        self.kits = Arc::new(kits);
        Ok(())
    }
}

/// Whether `server` has kits (a build before them has no `reserveKit`):
/// `reserveKit` of a kit that does not exist answers `KitNotFound` and
/// writes nothing.
pub async fn serves_kits(server: &ServerProcess, keys: &Keys) -> anyhow::Result<bool> {
    let token = keys.mint("bench-probe", Role::Customer, chrono::Duration::minutes(5))?;
    let input = json!({ "i": { "kitId": Uuid::nil() } });
    let outcome = Gql::new(&server.url, 1)?.call(&token, RESERVE_KIT_TYPENAME, input, "reserveKit").await;
    Ok(matches!(outcome, Outcome::Ok(name, _) if name == "KitNotFound"))
}

/// One client reserving one random kit of `kits` at a time over HTTP until
/// `rec`'s end; `keyed`, each with a fresh idempotency key.
pub async fn reserve_kit_client(
    gql: Arc<Gql>,
    token: String,
    kits: Arc<Vec<BenchKit>>,
    seed: u64,
    mut rec: Recorder,
    keyed: bool,
) -> anyhow::Result<Recorder> {
    let until = rec.until.context("a client's recorder says when it ends")?;
    let authorization = HeaderValue::from_str(&format!("Bearer {token}"))?;
    let mut rng = Rng::new(seed);
    let (prefix, mut sent) = (Uuid::new_v4().simple(), 0u64);
    let mut lean = gql.lean()?;
    while Instant::now() < until {
        let kit = kits[rng.below(kits.len())].id;
        sent += 1;
        let key = keyed.then(|| format!("{prefix}-{sent}"));
        let start = Instant::now();
        let outcome = lean.reserve_kit(&authorization, kit, 1, key.as_deref()).await;
        rec.record(start, &outcome, ONE_REQUEST);
    }
    Ok(rec)
}

/// One kit of `kit` for `user` in the server's kit statement, prepared, on
/// `conn`: [`KIT_RESERVED`] when it was taken.
pub(super) async fn raw_kit(
    conn: &mut PgConnection,
    kit: &BenchKit,
    user: &str,
    key: Option<(&str, &str)>,
    ttl_secs: i32,
) -> Outcome {
    let statement = reserve_kit(KitReserve {
        kit_id: kit.id,
        quantity: 1,
        lines: &kit.lines,
        kit_reservation_id: Uuid::new_v4(),
        user_id: user,
        key,
        ttl_secs,
    });
    // As sea-orm runs it for the server: the same SQL and bound values, a
    // persistent (prepared and cached) statement.
    let values = SqlxValues(statement.values.unwrap_or_else(|| sea_orm::sea_query::Values(Vec::new())));
    let query = sqlx::query_with(sqlx::AssertSqlSafe(statement.sql), values);
    match query.fetch_all(conn).await {
        Ok(rows) => {
            let taken = rows.first().and_then(|row| sqlx::Row::try_get::<Option<Uuid>, _>(row, "r_id").ok().flatten());
            let feasible = rows.iter().all(|row| sqlx::Row::try_get::<bool, _>(row, "feasible").unwrap_or(false));
            match (taken, feasible) {
                (Some(_), _) => Outcome::Ok(KIT_RESERVED.into(), Value::Null),
                (None, false) => Outcome::Ok("KitSoldOut".into(), Value::Null),
                (None, true) => Outcome::Ok("no kit taken".into(), Value::Null),
            }
        }
        Err(err) => Outcome::Error(match err.as_database_error().and_then(|e| e.code()) {
            Some(code) => format!("SQLSTATE {code}"),
            None => "database".into(),
        }),
    }
}

impl Bench {
    /// Seeds the kits and measures KIT at every client count, then
    /// KIT+SINGLES at every count of 2 or more; run after every other
    /// cell, which so measure what they always have.
    pub async fn kit_cells(&mut self, server: &ServerProcess) -> anyhow::Result<Vec<KitCell>> {
        let count = kit_count(self.settings.smoke);
        eprintln!("bench: seeding {count} kits of {COMPONENTS} SPREAD inventories (createKit)");
        self.shop.seed_kits(server, &self.keys, count).await?;
        self.invariant.check(&self.shop.db, "seeding the kits").await?;
        let mut cells = Vec::new();
        for scenario in [Scenario::Kit, Scenario::KitSingles] {
            for clients in self.settings.clients.clone() {
                if scenario == Scenario::KitSingles && clients < 2 {
                    continue;
                }
                eprintln!(
                    "bench: {} x{clients}: Stockguard and the kit statement's limit, {} rounds",
                    scenario.name(),
                    self.settings.rounds
                );
                let shop = &self.shop;
                let sides = [
                    Side { label: "Stockguard", shop, by: By::Http(server) },
                    Side { label: "limit", shop, by: By::Sql(Raw::Kit) },
                ];
                let [stockguard, limit] = self.rounds(&sides, scenario, clients).await?;
                for (side, stats) in [("Stockguard", &stockguard), ("limit", &limit)] {
                    eprintln!(
                        "bench:   {side}: {:.0} res/s ({:.0} component res/s), p99 {:.2} ms, {}",
                        stats.per_sec(stats.successes),
                        component_reservations_per_sec(stats),
                        stats.p99_ms,
                        stats.outcomes_text()
                    );
                }
                self.invariant.check(&self.shop.db, &format!("{} x{clients}", scenario.name())).await?;
                cells.push(KitCell { scenario, clients, stockguard, limit });
            }
        }
        Ok(cells)
    }
}
