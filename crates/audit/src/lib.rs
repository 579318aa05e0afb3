//! Proof that Comb keeps its delivery guarantees under crashes, restarts and bad input.
//!
//! * [`workload`] runs the delivery audit: producers push uniquely numbered messages with
//!   client transaction ids across 100 partitions, retrying until answered; consumers in two
//!   groups pop with leases, ack, fail 1 % of messages and sometimes die mid-batch.
//! * [`ledger`] judges what they saw: lost, duplicated and out-of-order counts per group.
//! * [`scenario`] injects faults while the audit runs: `kill -9` of servers, a PostgreSQL
//!   crash, PostgreSQL unreachable, two servers with one killed.
//! * [`fuzz`] sends malformed, hostile and oversized requests to every route of the OpenAPI
//!   description and checks that each gets a clear problem+json 4xx and changes nothing.
//!
//! `comb-audit` (the binary) runs them from the command line; `make chaos` runs them all.

pub mod fuzz;
pub mod ha;
pub mod ledger;
pub mod pg;
pub mod rng;
pub mod scenario;
pub mod workload;
