//! Comb's benchmark suite: a load generator, the peers Comb is compared with, and the
//! accounting of what every party costs, all in one run against one PostgreSQL.
//!
//! A run starts a PostgreSQL cluster with fixed, durable settings ([`run::PG_SETTINGS`]),
//! then runs each cell ([`cells`]) on a fresh database with a fresh `comb serve` process:
//! set-up, warm-up, a measured window, and one result row ([`report::Row`]). Peers
//! ([`peers`]) run on the same cluster right after the Comb cell they are compared with.
//! Resources are read from `/proc` at the window's edges ([`meter`], [`procstat`]).
//!
//! With `--citus` the Comb cells also run on Citus clusters, measured per node ([`nodes`]);
//! the scale-out model, its check and the cluster targets are [`scaleout`]'s, written to
//! `bench/results/citus.json`.
//!
//! Two builds or configurations are compared by running them in turns on one cluster
//! ([`compare`]).
//!
//! The long runs (`comb-bench xmin`, `comb-bench soak`) reuse the same load and accounting
//! over many minutes on one shared skeleton, sampling as they go ([`long`], [`tables`]).

#![warn(missing_docs)]

pub mod cells;
pub mod compare;
pub mod http;
pub mod load;
pub mod long;
pub mod meter;
pub mod nodes;
pub mod peers;
pub mod procstat;
pub mod profile;
pub mod queen1;
pub mod report;
pub mod run;
pub mod scaleout;
pub mod stats;
pub mod stream_state;
pub mod tables;
