//! A local production topology in one command: a pg_auto_failover monitor
//! and two data nodes (primary and synchronous standby), three Stockguard
//! processes with one shared secret and the multi-host `DATABASE_URL`, and
//! HAProxy in front, all on loopback ports, data under `target/cluster`.
//!
//! ```sh
//! cargo run --example cluster -- up       # builds the server of this profile, starts everything
//! cargo run --example cluster -- status   # roles, synchronous standby, readiness
//! cargo run --example cluster -- down     # stops everything it started, removes the folder
//! ```
//!
//! It installs nothing: without `pg_autoctl` (Debian's
//! `postgresql-15-auto-failover`) or `haproxy` it says which is missing, in
//! one line, and exits 1. See docs/deploy.md.

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use stockguard_support::{formation::Formation, process::server_binary};

#[derive(Parser, Debug)]
#[command(about = "A local HA formation: pg_auto_failover, three Stockguard processes, HAProxy")]
struct Args {
    #[command(subcommand)]
    command: Command,
    /// The folder that holds the whole formation.
    #[arg(long, global = true)]
    dir: Option<PathBuf>,
    /// The first of its loopback ports: monitor, +1 and +2 the data nodes,
    /// +80 HAProxy, +81.. the Stockguard processes.
    #[arg(long, global = true, default_value_t = 16000)]
    base_port: u16,
    /// The server binary (default: this profile's, built first).
    #[arg(long, global = true)]
    server_bin: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start the formation.
    Up,
    /// Show roles, the synchronous standby and readiness.
    Status,
    /// Stop everything `up` started and remove the folder.
    Down,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("cluster: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let dir = args.dir.unwrap_or_else(Formation::default_dir);
    let formation = Formation::new(&dir, args.base_port)?;
    match args.command {
        Command::Up => {
            if dir.exists() {
                anyhow::bail!(
                    "{} exists: the formation is up or was not taken down (`cluster down` first)",
                    dir.display()
                );
            }
            let bin = server_binary(args.server_bin.as_deref(), "cluster")?;
            if let Err(err) = formation.up(&bin).await {
                // Left as it is for its logs; `down` stops what did start.
                anyhow::bail!("up failed ({err:#}); logs in {}, `cluster down` stops what started", dir.display());
            }
            print!("{}", formation.status().await?);
            println!(
                "GraphQL: {}/graphql  (tokens: STOCKGUARD_JWT_SECRET=$(cat {}/secret) cargo run -- token --sub alice)",
                formation.url(),
                dir.display()
            );
        }
        Command::Status => print!("{}", formation.status().await?),
        Command::Down => formation.down().await?,
    }
    Ok(())
}
