//! `cargo run -p migration -- up|down|status|fresh`: the SeaORM migration CLI,
//! reading `DATABASE_URL`. The server also applies pending migrations at start.

use sea_orm_migration::prelude::*;

#[tokio::main]
async fn main() {
    cli::run_cli(migration::Migrator).await;
}
