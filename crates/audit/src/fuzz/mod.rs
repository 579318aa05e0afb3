//! Bad input never hurts: requests generated from the server's own OpenAPI description and
//! then broken on purpose, plus hand-written edge cases, each checked for a clear answer.
//!
//! For every route of `GET /api/v1/openapi.json` the generator builds a plausible request
//! from the schemas (real queue names, partition ids and lease ids some of the time, so that
//! requests get past the first check), then mutates it: hostile values (nulls, huge numbers,
//! quotes, slashes, SQL, control characters, deep nesting), missing and unknown members,
//! wrong types, truncated or non-UTF-8 bodies, hostile path and query values. Hand-written
//! cases add bodies past 16 MiB (sized and chunked), 100,000-item batches, deep nesting and
//! wrong methods.
//!
//! Each answer must be below 500, every error must be `application/problem+json` with
//! `type`, `title`, `status` (equal to the HTTP status), `detail`, a non-empty `code` and
//! `error` equal to `detail`, and a refused request (4xx) must leave the database exactly as
//! it was. At the end the server must still be running and healthy.
//!
//! * [`wire`]: a raw HTTP/1.1 client that sends any bytes and reads any answer.
//! * [`hostile`]: values that have broken servers before.
//! * [`generator`]: requests generated from the OpenAPI description, then broken.
//! * [`cases`]: the hand-written edge cases.
//! * [`runner`]: runs the cases against a server and judges each answer and the database.
//! * [`flood`]: random names that exist nowhere, by the hundred thousand; the server's
//!   registries keyed by names must not grow.
//! * [`tokens`]: valid and broken bearer tokens, for a server that requires them: most
//!   cases carry the valid one, the others a broken one that must get 401.

pub mod cases;
pub mod flood;
pub mod generator;
pub mod hostile;
pub mod runner;
pub mod tokens;
pub mod wire;

pub use runner::{FuzzReport, against_new_server, against_new_server_with_tokens, run};

/// Real ids for requests to use, so that some get past the first checks.
#[derive(Debug, Clone, Default)]
pub struct Context {
    pub queues: Vec<String>,
    pub partitions: Vec<String>,
    pub groups: Vec<String>,
    pub partition_ids: Vec<String>,
    pub lease_ids: Vec<String>,
    pub transaction_ids: Vec<String>,
}
