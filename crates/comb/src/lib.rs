//! Comb: a partitioned message queue on PostgreSQL with an HTTP API.
//!
//! Start with `ARCHITECTURE.md` at the repository root for the map. In short: `http` is the
//! edge (decode, validate, problem+json) and calls one use case per route: `push`, `pop`,
//! `ack`, `lease`, `transaction`, `catalog`. Each fused use case hands its work to a `fusion`
//! queue that turns concurrent requests into one database round trip; `schema` owns the
//! tables. Only what the binary and the test suite need is public.

/// The wire types clients read (the `comb` command's client commands among them): the same
/// types the server answers with, so a field cannot drift between the two.
pub mod wire {
    pub use crate::http::problem::ProblemBody as Problem;
    pub use crate::http::push::{PushResult, PushStatus};

    /// The administration's answers the `comb` command prints: a queue list and a queue's
    /// detail, consumer groups, a seek, a message listing (dead letters and `tail` read it
    /// too), and the dead letters' requeue and purge.
    pub use crate::admin::dead_letters::{PurgeAnswer, RequeueAnswer};
    pub use crate::admin::groups::{FiguresAt, GroupQueueLag, GroupSummary, QueueGroup, Sought};
    pub use crate::admin::messages::{ListedMessage, MessageListing};
    pub use crate::admin::resources::{
        MessageCounts, PartitionFigures, PartitionGroupLag, PartitionMessages, QueueDetail,
        QueueFigures, QueueList, QueuePartition,
    };
}

// The bottom: imports nothing from the modules above it.
mod auth;
mod backend;
mod code;
pub mod config;
mod cursor;
mod db;
mod encryption;
mod fusion;
mod messages;
mod metrics;
mod queue;
mod refusal;
mod replication;
mod schema;

// Notification of pushes and catalog changes between servers.
mod wake;

// Names, options and subscriptions.
mod catalog;

// The use cases. `ack` and `pop` are public only for the statements whose plans the test
// suite checks (`tests/suite/claim_plans.rs`); everything else in them is crate-private.
pub mod ack;
mod admin;
mod backlog;
mod dead_letter;
mod lease;
mod maintenance;
pub mod pop;
mod push;
mod streams;
mod transaction;

// The edge and the wiring; the dashboard's pages are a client of the edge, in process.
mod dashboard;
mod http;
pub mod server;

#[cfg(test)]
mod layering;
