//! Comb: a partitioned message queue on PostgreSQL with an HTTP API.
//!
//! Start with `ARCHITECTURE.md` at the repository root for the map. In short: [`http`] is the
//! edge (validation, problem+json); [`push`], [`pop`] and [`ack`] are the hot paths, each fed
//! by a [`fusion`] queue that turns concurrent requests into one statement; [`catalog`] names
//! queues, partitions and subscriptions; [`schema`] owns the tables.

pub mod ack;
pub mod admin;
pub mod catalog;
pub mod config;
pub mod dashboard;
pub mod db;
pub mod fusion;
pub mod http;
pub mod lease;
pub mod maintenance;
pub mod metrics;
pub mod pop;
pub mod push;
pub mod queue;
pub mod schema;
pub mod server;
pub mod wake;
