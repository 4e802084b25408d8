//! The one module that changes stock. Every statement that changes an
//! inventory is built here: taking stock for reservations and order lines
//! ([`taking`]), giving it back on release, expiry and cancel
//! ([`returning`]), and receiving it on create and restock ([`receiving`]).
//!
//! They are built from the same fragments, so docs/design.md's rule has one
//! home: a change of an inventory is one version step (`version + 1` per
//! change, `updated_at = now()`) and one ledger row (`INSERT INTO
//! stock_movements`) written by the same statement, and a statement that
//! returns the inventory returns its columns in the entity's order. Features
//! take a ready statement (its SQL and bind values) from here and run it;
//! no other module writes `inventories`' stock or the ledger.

mod fragments;
pub mod receiving;
pub mod returning;
pub mod taking;

pub use taking::{COALESCED_RESERVE_SQL, RESERVE_SQL};

#[cfg(test)]
mod tests;
