//! Setting up: direct connections, the SPREAD rows, the statement as a
//! pgbench script, and what the server runs with.

use super::*;

/// A direct connection. PostgreSQL's `max_connections` is shared with
/// whatever else runs on the machine, so "too many clients" (53300) is waited
/// out for up to a minute.
pub(super) async fn connect_patiently(url: &str) -> anyhow::Result<PgConnection> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut told = false;
    loop {
        match PgConnection::connect(url).await {
            Ok(conn) => return Ok(conn),
            Err(err)
                if Instant::now() < deadline
                    && err.as_database_error().and_then(|e| e.code()).as_deref() == Some("53300") =>
            {
                if !told {
                    eprintln!("bench:   PostgreSQL has too many clients; waiting for connections to free up");
                    told = true;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(err) => return Err(err.into()),
        }
    }
}

/// SPREAD's inventories.
pub const SPREAD_ROWS: usize = 10_000;
/// Each SPREAD inventory's stock.
pub const SPREAD_STOCK: i32 = 1_000_000_000;

/// The [`SPREAD_ROWS`] SPREAD inventories, each with [`SPREAD_STOCK`].
pub async fn seed_spread(db: &DatabaseConnection) -> anyhow::Result<Vec<Uuid>> {
    seed_rows(db, "SPREAD", &[SPREAD_STOCK; SPREAD_ROWS]).await
}

/// One inventory per entry of `stocks` with that stock (SKU `<sku>-<n>`),
/// created with the server's own statement (each with its ledger row) in
/// one transaction, so seeding commits once.
pub async fn seed_rows(db: &DatabaseConnection, sku: &str, stocks: &[i32]) -> anyhow::Result<Vec<Uuid>> {
    let txn = db.begin().await?;
    let mut ids = Vec::with_capacity(stocks.len());
    for (n, &stock) in (1..).zip(stocks) {
        let id = Uuid::new_v4();
        let name = format!("{} {n}", sku.to_lowercase());
        txn.execute_raw(receiving::create(id, &format!("{sku}-{n}"), &name, stock, None)).await?;
        ids.push(id);
    }
    txn.commit().await?;
    db.execute_unprepared("ANALYZE inventories; ANALYZE stock_movements;").await?;
    Ok(ids)
}

/// The inventories of [`seed_rows`], made through `server`'s API instead
/// (`createInventory`, 16 at a time), for a server of another build whose
/// schema this build's statement may not fit. The ids come in the order of
/// `stocks`.
pub async fn create_rows(
    server: &ServerProcess,
    operator: &str,
    sku: &str,
    stocks: &[i32],
) -> anyhow::Result<Vec<Uuid>> {
    let gql = Gql::new(&server.url, 16)?;
    let gql = &gql;
    let created = futures::stream::iter((1..).zip(stocks))
        .map(|(n, &stock)| async move {
            let name = format!("{} {n}", sku.to_lowercase());
            gql.create_inventory(operator, &format!("{sku}-{n}"), &name, stock.into()).await
        })
        .buffered(16);
    created.try_collect().await
}

/// [`RESERVE_SQL`] as a pgbench script: `$1` is the inventory numbered
/// `:n` (its id is the number, see bench/statement/run.sh), `$4` the new
/// reservation's id made by `id_function`, the rest as a plain `reserve`
/// of one unit with the default TTL.
pub fn pgbench_script(id_function: &str) -> String {
    let ttl = stockguard::config::Limits::default().reservation_ttl_secs;
    // `$10` before `$1`, which it begins with.
    let values = [
        ("$10", "false".into()),
        ("$9", id_function.to_owned()),
        ("$8", format!("{ttl}")),
        ("$7", "NULL::text".into()),
        ("$6", "NULL::text".into()),
        ("$5", "'bench-' || :client_id::text".into()),
        ("$4", id_function.to_owned()),
        ("$3", "NULL::integer".into()),
        ("$2", "1".into()),
        ("$1", "lpad(to_hex(:n::integer), 32, '0')::uuid".into()),
    ];
    let mut sql = RESERVE_SQL.trim().to_owned();
    for (parameter, value) in values {
        sql = sql.replace(parameter, &value);
    }
    // pgbench reads a statement up to its semicolon, on as many lines as it takes.
    format!("\\set n random(1, 10000)\n{sql};")
}

/// One text value of `sql`, or `?`.
pub async fn show(db: &DatabaseConnection, sql: &str) -> String {
    match db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await {
        Ok(Some(row)) => row.try_get_by_index::<String>(0).unwrap_or_else(|_| "?".into()),
        _ => "?".into(),
    }
}

/// The reservation TTL the server runs with: its default, or the
/// `STOCKGUARD_RESERVATION_TTL_SECS` it inherits from this process.
pub fn server_ttl_secs() -> anyhow::Result<i32> {
    match std::env::var("STOCKGUARD_RESERVATION_TTL_SECS") {
        Ok(ttl) => ttl.parse().context("STOCKGUARD_RESERVATION_TTL_SECS"),
        Err(_) => Ok(stockguard::config::Limits::default().reservation_ttl_secs),
    }
}
