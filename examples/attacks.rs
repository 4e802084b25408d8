//! Measures what each known attack does to a server build: time to answer,
//! whether the process lives, its memory, and what it wrote.
//!
//! ```sh
//! cargo run --release --example attacks                      # the build beside it
//! cargo run --release --example attacks -- --binary OLD/stockguard
//! ```
//!
//! It starts the binary on a throw-away database (on the PostgreSQL the
//! tests use unless `--database-url` says otherwise) once per attack, and prints one line per
//! attack. Unlike the tests in `tests/api/attacks.rs` it asserts nothing: it
//! reports, so that the build before a fix can be measured too.

use std::{
    path::PathBuf,
    process::Stdio,
    time::{Duration, Instant},
};

use clap::Parser;
use futures::{SinkExt, StreamExt};
use sea_orm::sqlx::{self, Connection as _, PgConnection};
use serde_json::{Value, json};
use stockguard::{
    auth::{Keys, Role},
    config::DEFAULT_MAX_TOKEN_TTL_SECS,
};
use stockguard_support::{
    client,
    database::{self, ThrowAway},
    hostile,
    process::{Log, ServerProcess, server_binary},
};
use tokio::{io::AsyncWriteExt, net::TcpStream};
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest, http::HeaderValue};

#[derive(Parser)]
struct Args {
    /// The server binary to attack (default: the release build beside this one).
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Where to make the throw-away databases (a server URL without a
    /// database name). Default: the server the tests use, found as they find
    /// it (`stockguard_support::database::server_url`).
    #[arg(long)]
    database_url: Option<String>,
}

const SECRET: &str = "attacks-secret-of-at-least-thirty-two-bytes";

/// One running server under attack, on a database of its own.
struct Target {
    server: ServerProcess,
    database: ThrowAway,
    /// A direct connection for counting rows and holding locks.
    sql: PgConnection,
    client: reqwest::Client,
    keys: Keys,
}

impl Target {
    async fn start(args: &Args, env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let binary = server_binary(args.binary.as_deref(), "attacks")?;
        let base = database::given_or_found(args.database_url.as_deref())?;
        let database = ThrowAway::create(&base, "attacks").await?;
        let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        let server =
            ServerProcess::start(&binary, &database.url, Some(SECRET), &env, Log::Warnings(Stdio::null())).await?;
        let sql = PgConnection::connect(&database.url).await?;
        let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
        let keys = Keys::new(SECRET.as_bytes(), DEFAULT_MAX_TOKEN_TTL_SECS)?;
        Ok(Self { server, database, sql, client, keys })
    }

    /// Stops the server and drops its database.
    async fn finish(self) {
        let _ = self.server.stop().await;
        self.database.drop("attacks").await;
    }

    fn rss_mb(&self) -> f64 {
        self.server.status_kb("VmRSS").unwrap_or(0) as f64 / 1024.0
    }

    /// Whether the process still runs (a dead one has no resident memory).
    fn alive(&self) -> bool {
        self.server.status_kb("VmRSS").is_some()
    }

    /// POSTs a query; the status, the first error code (or "ok"), and the time.
    async fn post(&self, token: Option<&str>, query: &str) -> (String, Duration) {
        let started = Instant::now();
        let mut request = self.client.post(format!("{}/graphql", self.server.url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let outcome =
            match request.json(&json!({ "query": query })).send().await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let body: Value = response.json().await.unwrap_or_default();
                    let code = body["errors"][0]["extensions"]["code"]
                        .as_str()
                        .unwrap_or(if body["errors"].is_array() { "error without a code" } else { "ok" });
                    format!("{status} {code}")
                }
                Err(err) if err.is_timeout() => "no answer in 30 s".to_owned(),
                Err(_) => "connection dropped".to_owned(),
            };
        (outcome, started.elapsed())
    }

    /// How long `/healthz` takes, or `None` within 5 s.
    async fn healthz(&self) -> Option<Duration> {
        let started = Instant::now();
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            self.client.get(format!("{}/healthz", self.server.url)).send(),
        );
        matches!(answer.await, Ok(Ok(r)) if r.status() == 200).then(|| started.elapsed())
    }

    async fn count(&mut self, sql: &'static str) -> i64 {
        sqlx::query_scalar::<_, i64>(sql).fetch_one(&mut self.sql).await.unwrap_or(-1)
    }

    async fn socket(&self) -> anyhow::Result<Socket> {
        let url = format!("{}/graphql/ws", self.server.url.replace("http://", "ws://"));
        let mut request = url.into_client_request()?;
        request.headers_mut().insert("Sec-WebSocket-Protocol", HeaderValue::from_static("graphql-transport-ws"));
        Ok(tokio_tungstenite::connect_async(request).await?.0)
    }

    async fn create_inventory(&self, sku: &str) -> String {
        let operator = self.keys.mint("operator", Role::Operator, chrono::Duration::minutes(30)).unwrap_or_default();
        let created = client::create_inventory(&self.client, &self.server.url, &operator, sku, sku, 1_000_000).await;
        created.map(|id| id.to_string()).unwrap_or_default()
    }
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

async fn send(socket: &mut Socket, message: Value) -> bool {
    socket.send(Message::text(message.to_string())).await.is_ok()
}

/// The next text message within `within`: its JSON, or what happened instead.
async fn next(socket: &mut Socket, within: Duration) -> Result<Value, String> {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, socket.next()).await {
            Ok(Some(Ok(Message::Text(text)))) => {
                let value: Value = serde_json::from_str(&text).unwrap_or_default();
                if value["type"] != "ping" && value["type"] != "pong" && value["type"] != "ka" {
                    return Ok(value);
                }
            }
            Ok(Some(Ok(Message::Close(frame)))) => {
                return Err(format!("closed {:?}", frame.map(|f| u16::from(f.code))));
            }
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(err))) => return Err(format!("dropped ({err})")),
            Ok(None) => return Err("dropped".to_owned()),
            Err(_) => return Err(format!("nothing in {within:?}")),
        }
    }
}

fn report(attack: &str, what: String) {
    println!("| {attack} | {what} |");
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    println!("| attack | measured |\n|---|---|");

    // 1. Deep list literals in an argument, a variable default, a directive.
    for (place, name) in [(0, "argument"), (1, "variable default"), (2, "directive argument")] {
        let target = Target::start(&args, &[]).await?;
        let query = hostile::deep_value(3000, place);
        let (outcome, took) = target.post(None, &query).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let alive = target.alive();
        report(
            &format!("{} B list nested 3,000 deep in a {name}", query.len()),
            format!("{outcome} in {took:.1?}; process alive: {alive}"),
        );
        target.finish().await;
    }

    // 2. Fragment fan-out, four at once, while /healthz is polled.
    {
        let target = Target::start(&args, &[]).await?;
        let query = hostile::fragment_fan_out(30);
        let started = Instant::now();
        let attacks: Vec<_> = (0..4).map(|_| target.post(None, &query)).collect();
        let attacks = futures::future::join_all(attacks);
        let health = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            target.healthz().await
        };
        let (outcomes, health) = tokio::join!(attacks, health);
        let (outcome, took) = outcomes.into_iter().max_by_key(|(_, took)| *took).unwrap_or_default();
        let health = health.map_or("no answer in 5 s".to_owned(), |d| format!("{d:.1?}"));
        report(
            &format!("4 x {} B fragment fan-out of 30 levels", query.len()),
            format!(
                "slowest: {outcome} in {took:.1?} (all four within {:.1?}); /healthz meanwhile: {health}",
                started.elapsed()
            ),
        );
        target.finish().await;
    }

    // 3. Alias floods and the metrics page.
    {
        let target = Target::start(&args, &[]).await?;
        let metrics = || async {
            target.client.get(format!("{}/metrics", target.server.url)).send().await.ok()?.text().await.ok()
        };
        let query = hostile::aliases("query", "inventoryBySku(sku: \"NOPE\") { id }", 900);
        let before = (metrics().await.unwrap_or_default().len(), target.rss_mb());
        let mut outcome = String::new();
        for _ in 0..50 {
            outcome = target.post(None, &query).await.0;
        }
        let after = (metrics().await.unwrap_or_default().len(), target.rss_mb());
        report(
            "50 requests x 900 aliases",
            format!(
                "{outcome}; /metrics {} -> {} KB; RSS {:.0} -> {:.0} MB",
                before.0 / 1024,
                after.0 / 1024,
                before.1,
                after.1
            ),
        );
        target.finish().await;
    }

    // 4. A query over the websocket, anonymous.
    {
        let target = Target::start(&args, &[]).await?;
        let id = target.create_inventory("WS-1").await;
        let mut socket = target.socket().await?;
        send(&mut socket, json!({ "type": "connection_init", "payload": {} })).await;
        let _ = next(&mut socket, Duration::from_secs(5)).await;
        let query = format!("{{ inventory(id: \"{id}\") {{ stock }} }}");
        send(&mut socket, json!({ "id": "1", "type": "subscribe", "payload": { "query": query } })).await;
        let answer = match next(&mut socket, Duration::from_secs(5)).await {
            Ok(message) => format!("answered: {}", message["payload"]),
            Err(what) => what,
        };
        report("anonymous `{ inventory { stock } }` over the websocket", answer);
        target.finish().await;
    }

    // 5. 100 sockets x 100 subscriptions of inventories that do not exist.
    {
        let mut target = Target::start(&args, &[]).await?;
        let id = target.create_inventory("SUB-1").await;
        let alice = target.keys.mint("alice", Role::Customer, chrono::Duration::minutes(30)).unwrap_or_default();
        let reserve = format!("mutation {{ reserve(input: {{ inventoryId: \"{id}\" }}) {{ __typename }} }}");
        let p50 = |mut times: Vec<Duration>| {
            times.sort();
            times[times.len() / 2]
        };
        let mut quiet = Vec::new();
        for _ in 0..20 {
            quiet.push(target.post(Some(&alice), &reserve).await.1);
        }
        let rss_before = target.rss_mb();
        let started = Instant::now();
        let mut sockets = Vec::new();
        for _ in 0..100 {
            let Ok(mut socket) = target.socket().await else { break };
            send(&mut socket, json!({ "type": "connection_init", "payload": {} })).await;
            let _ = next(&mut socket, Duration::from_secs(5)).await;
            for n in 0..100 {
                let payload = json!({ "query": "subscription($id: UUID!) { inventoryChanged(id: $id) { stock } }", "variables": { "id": uuid::Uuid::new_v4() } });
                send(&mut socket, json!({ "id": format!("s{n}"), "type": "subscribe", "payload": payload })).await;
            }
            sockets.push(socket);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut loaded = Vec::new();
        for _ in 0..20 {
            loaded.push(target.post(Some(&alice), &reserve).await.1);
        }
        let rows = target.count("SELECT count(*) FROM inventory_watchers").await;
        report(
            "100 sockets x 100 subscriptions of unknown ids",
            format!(
                "opened in {:.1?}; {rows} watcher rows; RSS {rss_before:.0} -> {:.0} MB; reserve p50 {:.1?} -> {:.1?}",
                started.elapsed(),
                target.rss_mb(),
                p50(quiet),
                p50(loaded)
            ),
        );
        drop(sockets);
        target.finish().await;
    }

    // 6. A socket that never sends connection_init; 7. a 10 MB message.
    {
        let mut target = Target::start(&args, &[]).await?;
        let mut silent = target.socket().await?;
        let started = Instant::now();
        let outcome = next(&mut silent, Duration::from_secs(30)).await;
        report("a websocket that never sends connection_init", format!("{outcome:?} after {:.1?}", started.elapsed()));
        let operator = target.keys.mint("operator", Role::Operator, chrono::Duration::minutes(30)).unwrap_or_default();
        let mut socket = target.socket().await?;
        send(
            &mut socket,
            json!({ "type": "connection_init", "payload": { "Authorization": format!("Bearer {operator}") } }),
        )
        .await;
        let _ = next(&mut socket, Duration::from_secs(5)).await;
        let query = format!(
            "mutation {{ createInventory(input: {{ sku: \"HUGE\", name: \"h\", stock: 1 }}) {{ id }} }} # {}",
            "x".repeat(10 << 20)
        );
        send(&mut socket, json!({ "id": "big", "type": "subscribe", "payload": { "query": query } })).await;
        let outcome = next(&mut socket, Duration::from_secs(30)).await.map(|m| m["type"].clone());
        let rows = target.count("SELECT count(*) FROM inventories WHERE sku = 'HUGE'").await;
        report("a 10 MB websocket message carrying a mutation", format!("{outcome:?}; rows written: {rows}"));
        target.finish().await;
    }

    // 8. A client that hangs up mid-request, with one permit.
    {
        let target = Target::start(&args, &[("STOCKGUARD_MAX_IN_FLIGHT", "1")]).await?;
        let id = target.create_inventory("HANG-1").await;
        let alice = target.keys.mint("alice", Role::Customer, chrono::Duration::minutes(30)).unwrap_or_default();
        let mut holder = PgConnection::connect(&target.database.url).await?;
        sqlx::query("BEGIN").execute(&mut holder).await?;
        let id: uuid::Uuid = id.parse()?;
        sqlx::query("SELECT 1 FROM inventories WHERE id = $1 FOR UPDATE").bind(id).execute(&mut holder).await?;
        let impatient = reqwest::Client::builder().timeout(Duration::from_millis(300)).build()?;
        let reserve = format!(
            "mutation {{ reserve(input: {{ inventoryId: \"{id}\", idempotencyKey: \"k\" }}) {{ __typename }} }}"
        );
        let _ = impatient
            .post(format!("{}/graphql", target.server.url))
            .bearer_auth(&alice)
            .json(&json!({ "query": reserve }))
            .send()
            .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (outcome, _) = target.post(None, "{ __typename }").await;
        drop(holder);
        report("a client hangs up while its reserve waits (in-flight limit 1)", format!("the next request: {outcome}"));
        target.finish().await;
    }

    // 9. 100 connections that send half a header.
    {
        let target = Target::start(&args, &[]).await?;
        let addr = target.server.url.trim_start_matches("http://").to_owned();
        let mut slow = Vec::new();
        for _ in 0..100 {
            if let Ok(mut stream) = TcpStream::connect(&addr).await {
                let _ = stream.write_all(b"POST /graphql HTTP/1.1\r\nHost: s\r\nContent-Ty").await;
                slow.push(stream);
            }
        }
        let (outcome, took) = target.post(None, "{ __typename }").await;
        tokio::time::sleep(Duration::from_secs(15)).await;
        let mut open = 0;
        for stream in &mut slow {
            let mut buf = [0u8; 64];
            if tokio::time::timeout(Duration::from_millis(10), tokio::io::AsyncReadExt::read(stream, &mut buf))
                .await
                .is_err()
            {
                open += 1;
            }
        }
        report(
            "100 connections sending half a header",
            format!("a normal request meanwhile: {outcome} in {took:.1?}; still open after 15 s: {open}"),
        );
        target.finish().await;
    }

    // 10. Pages in the cost; aliased lookups starving the pool.
    {
        let target = Target::start(&args, &[]).await?;
        for n in 0..100 {
            target.create_inventory(&format!("PAGE-{n}")).await;
        }
        let pages = hostile::aliases("query", "inventories(first: 100) { nodes { id } }", 200);
        let started = Instant::now();
        let response =
            target.client.post(format!("{}/graphql", target.server.url)).json(&json!({ "query": pages })).send().await;
        let body: Value = match response {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(_) => Value::Null,
        };
        let rows: usize =
            body["data"].as_object().map_or(0, |d| d.values().map(|v| v["nodes"].as_array().map_or(0, Vec::len)).sum());
        let code = body["errors"][0]["extensions"]["code"].as_str().unwrap_or("ok");
        report(
            "200 aliases of `inventories(first: 100)`",
            format!("{code}, {rows} rows returned, in {:.1?}", started.elapsed()),
        );

        let lookups = hostile::aliases("query", "inventoryBySku(sku: \"PAGE-1\") { id }", 450);
        let alice = target.keys.mint("alice", Role::Customer, chrono::Duration::minutes(30)).unwrap_or_default();
        let flood: Vec<_> = (0..24)
            .map(|_| async {
                for _ in 0..5 {
                    target.post(None, &lookups).await;
                }
            })
            .collect();
        let signed_in = async {
            let mut outcomes = Vec::new();
            for _ in 0..20 {
                outcomes.push(target.post(Some(&alice), "{ myReservations { nodes { id } } }").await);
            }
            outcomes
        };
        let (_, outcomes) = tokio::join!(futures::future::join_all(flood), signed_in);
        let failed = outcomes.iter().filter(|(o, _)| !o.ends_with("ok")).count();
        let slowest = outcomes.iter().map(|(_, t)| *t).max().unwrap_or_default();
        report(
            "24 clients x 450 aliased `inventoryBySku`",
            format!("a signed-in user meanwhile: {failed} of 20 failed, slowest {slowest:.1?}"),
        );
        target.finish().await;
    }

    // 11. Secrets.
    for secret in ["", "abc"] {
        let binary = server_binary(args.binary.as_deref(), "attacks")?;
        let output = tokio::process::Command::new(binary)
            .env("STOCKGUARD_JWT_SECRET", secret)
            .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none")
            .env("STOCKGUARD_ACQUIRE_TIMEOUT_MS", "500")
            .output()
            .await?;
        let said = String::from_utf8_lossy(&output.stderr).lines().last().unwrap_or_default().to_owned();
        report(&format!("STOCKGUARD_JWT_SECRET={secret:?}"), format!("{}: {said}", output.status));
    }
    Ok(())
}
