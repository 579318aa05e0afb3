//! Comb's integration tests: one binary, one module per guarantee or topic.
//!
//! Every test gets a fresh database and its own `comb serve` process (`common::Env`), all in
//! one PostgreSQL cluster shared by the whole binary (`comb_harness::Postgres::shared`), so a
//! run starts PostgreSQL once instead of once per file and links one binary instead of one
//! per file. Nothing here changes cluster-wide settings: advisory locks, LISTEN/NOTIFY
//! channels, statistics and plans are all per database. A test that must take PostgreSQL
//! away (`metrics::a_scrape_without_its_database_still_answers_from_memory`) or change its
//! settings (`failover`, which makes servers read-only) starts clusters of its own with
//! `Postgres::start`. The delivery audit (`audit.rs`) is compiled into a binary of its own,
//! `tests/audit.rs`, which says why.
//!
//! Run one module with `cargo test -p comb --test suite lease::`, one test by its name.

mod common;

mod acks;
mod admin;
mod auth;
mod backends;
mod citus;
mod citus_lost;
mod claim_plans;
mod cli;
mod consumer_groups;
mod contract;
mod dashboard;
mod errors;
mod failover;
mod figures;
mod fuzz;
mod generations;
mod handoff;
mod hostile;
mod idempotency;
mod lease;
mod lease_extend;
mod limits;
mod long_poll;
mod metrics;
mod migrate;
mod no_skip;
mod partition_ids;
mod pop_options;
mod queen_compat;
mod queen_defects;
mod queen_python;
mod readme;
mod retention;
mod retries;
mod routes;
mod servers;
mod shutdown;
mod streams;
mod tls;
mod transactions;
mod unreadable;
mod upgrades;
