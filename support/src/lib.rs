//! What Stockguard's tests and examples share, written once: the server
//! binary as a child process ([`process`]), the PostgreSQL they make their
//! databases on ([`database`]), the GraphQL documents they send
//! ([`documents`], the hostile ones in [`hostile`]), the client
//! ([`client`]), and the local HA formation of the failover examples
//! ([`formation`]).

pub mod client;
pub mod database;
pub mod documents;
pub mod formation;
pub mod hostile;
pub mod process;

use std::path::{Path, PathBuf};

/// The workspace's root folder (where Stockguard's `Cargo.toml` is).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}
