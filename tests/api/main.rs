//! Stockguard's integration tests: one binary, each test with its own fresh
//! database and a real server on port 0, talked to over real HTTP. The
//! documents they send, the client and the server as a child process are
//! the `stockguard-support` crate's, shared with the examples.

use stockguard_support::{documents, hostile};

mod admission;
mod allocation_model;
mod archive;
mod attacks;
mod auth;
mod bad_input;
mod browser;
mod checkout;
mod cli;
mod clients;
mod coalescing;
mod concurrency;
mod db_errors;
mod deploy;
mod events;
mod exhausted;
mod fair_share;
mod faults;
mod fingerprints;
mod first_run;
mod flood;
mod fuzz;
mod graphiql;
mod helpers;
mod http;
mod http_spec;
mod invariant;
mod kits;
mod lifecycle;
mod live;
mod live_levels;
mod location_races;
mod locations;
mod migrating;
mod node;
mod orders;
mod plans;
mod process;
mod quantities;
mod queries;
mod returns;
mod stock_ops;
mod stock_states;
mod traces;
mod transfers;
mod waitlists;
mod webhooks;
mod ws;
