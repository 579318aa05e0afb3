//! The short delivery audits (`suite/audit.rs`, and on Citus `suite/citus_audit.rs`), in a
//! test binary of their own.
//!
//! It is the one integration test judged by a deadline: after the server's `kill -9` the
//! consumers have 45 s to settle every accepted message, and whatever they have not settled by
//! then counts as lost. Inside the suite binary it shares the machine with whichever tests run
//! beside it, and on a loaded machine that made it miss the deadline with nothing wrong in the
//! server. Cargo runs test binaries one after another, so here its tests share the machine
//! only with each other. It uses the suite's support code.

#[path = "suite/common/mod.rs"]
mod common;

#[path = "suite/audit.rs"]
mod audit;

#[path = "suite/citus_audit.rs"]
mod citus_audit;
