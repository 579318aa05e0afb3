//! Claims: lease partitions to a group and read their next messages.
//!
//! A claim takes two round trips in one transaction. The first walks the group's cursors of
//! the queue round robin (from just after the partition this server claimed last), takes
//! those that are behind their partition's head and hold no lease, and locks their rows with
//! `SKIP LOCKED`, so concurrent claims never wait on each other. The second, whose snapshot is
//! taken once the locks are held, reads each cursor's latest state again, reads the next
//! `batch` unsettled messages once, and appends the cursor's next state version holding the
//! lease (or, with auto-ack, the moved position).
//! Nothing is updated in place. Concurrent pops with the same shape are fused into one claim
//! for as many partitions as they want together, and a server runs the walks of one
//! (queue, group) one after another, on that group's lane: the next claim walks once the one
//! before holds its cursors, starting after them, so walks never race each other for the same
//! cursors and a walk reads only two cursors beyond those it wants. Claims of other servers
//! may still hold some it sees; the walk then goes on past them, looking further. Where the
//! queue sets no option only a walk checks (`windowBuffer`, `delayedProcessing`), a walk reads
//! eight beyond (eight per partition for a multi-partition pop), and the next claims lock those
//! by key, in walk order, without walking (`Rovers::take_ahead`); one that finds them taken or
//! emptied since walks after all.
//!
//! The statements name only this module's own functions (`comb.claimable_now`,
//! `comb.refuse_sealed_payload`): every piece that reads another module's table is that
//! table's owner's fragment (`cursor`, `catalog`, `push`, `queue`). Their Citus forms rewrite
//! the composed text, so the unit test pinning each statement's text (`claim_pinned.sql`)
//! fails when a fragment changes under them.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use tokio::sync::{Semaphore, oneshot};
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use serde_json::value::RawValue;

use super::unreadable::{self, Unreadable};
use crate::backend::{Backend, Forms};
use crate::db::{self, DbError, Pipelined, Prepared};
use crate::encryption::Keys;
use crate::fusion::{self, Fuser, Reply, Runner};
use crate::metrics::{Metrics, QueueCounts, Stage};

/// The shape of a pop; pops with the same shape are claimed together.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PopShape {
    pub(crate) queue_id: Uuid,
    /// The queue's name, which per-queue counters are kept by.
    pub(crate) queue: String,
    pub(crate) group: String,
    /// Only this partition, when the consumer named one.
    pub(crate) partition_id: Option<Uuid>,
    /// Most messages per partition.
    pub(crate) batch: i32,
    /// Advance the cursor inside the pop instead of leasing.
    pub(crate) auto_ack: bool,
    /// Queen's multi-partition pop (`partitions` > 1): every partition the pop claims is
    /// leased under one lease id, and `batch` caps the messages over all of them. Such pops
    /// are claimed one at a time, each with its own lease.
    pub(crate) shared_lease: bool,
    /// The queue seals payloads (`encryptionEnabled`): the claim opens them before it commits,
    /// so that one this server cannot open is dead-lettered instead of consumed unseen.
    pub(crate) sealed: bool,
    /// The queue sets neither `windowBuffer` nor `delayedProcessing`, which only a walk
    /// checks per partition: a claim may take the cursors the last walk saw ahead without
    /// walking again ([`Rovers::take_ahead`]).
    pub(crate) claims_ahead: bool,
}

impl PopShape {
    /// Whether this pop's claim may take the cursors its group's last walk saw ahead, and its
    /// walks keep them: a pop over the whole queue, in a queue that allows it.
    fn takes_ahead(&self) -> bool {
        self.claims_ahead && self.partition_id.is_none()
    }

    /// The lane of this shape's claims: one per (queue, group), so that a server's walks over
    /// the same cursors run one after another instead of racing for them.
    pub(crate) fn lane(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.queue_id.hash(&mut h);
        self.group.hash(&mut h);
        h.finish()
    }
}

/// A pop request waiting for its batch.
pub(crate) struct PopJob {
    pub(crate) shape: PopShape,
    /// How many partitions this pop may lease.
    pub(crate) partitions: usize,
    pub(crate) reply: Reply<Vec<Claim>>,
}

/// One leased partition and the messages handed out with it.
#[derive(Debug, Clone)]
pub(crate) struct Claim {
    pub(crate) partition_id: Uuid,
    pub(crate) partition: String,
    /// `None` with auto-ack: nothing is leased.
    pub(crate) lease_id: Option<Uuid>,
    pub(crate) messages: Vec<Delivered>,
}

/// A message as handed to a consumer.
#[derive(Debug, Clone)]
pub(crate) struct Delivered {
    pub(crate) pos: i64,
    pub(crate) message_id: Uuid,
    pub(crate) transaction_id: String,
    pub(crate) trace_id: Option<String>,
    /// The subject of the token the message was pushed with.
    pub(crate) producer_sub: Option<String>,
    /// The payload, opened (see [`crate::encryption`]): JSON as the producer sent it.
    pub(crate) data: Box<RawValue>,
    pub(crate) created_at: DateTime<Utc>,
    /// 1 for the first delivery, then one more per failed attempt.
    pub(crate) attempt: i32,
}

/// Options of the queue a claim reads, with the server's defaults filled in.
macro_rules! queue_options {
    () => {
        concat!(
            "SELECT coalesce((options->>'leaseTime')::float8, $5) AS lease_secs,
           coalesce((options->>'delayedProcessing')::float8, 0) AS delay_secs,
           coalesce((options->>'windowBuffer')::float8, 0) AS window_secs,
           ",
            crate::queue::retention_secs!("options"),
            " AS retention_secs
    FROM ",
            crate::catalog::queue_by_id!("$1")
        )
    };
}

/// First half of a claim (see [`CANDIDATES`]): the walk's partitions filtered by `$walk`, the
/// cursor's state read by `$state`, the next messages by `$messages`, the locked cursors
/// joined on `$cand`, the queue's options checked by `$claimable`.
macro_rules! candidates_sql {
    (walk: $walk:expr; state: $state:expr; messages: $messages:literal; cand: $cand:expr;
     claimable: $claimable:expr) => {
        concat!(
            "
WITH q AS (
    ",
            queue_options!(),
            "),
walk AS (
    (SELECT c.partition_id, false AS wrapped FROM ",
            crate::cursor::cursors!(),
            "
     WHERE c.queue_id = $1 AND c.consumer_group = $2
       AND ",
            $walk,
            " AND c.partition_id > $6
     ORDER BY c.partition_id)
    UNION ALL
    (SELECT c.partition_id, true FROM ",
            crate::cursor::cursors!(),
            "
     WHERE c.queue_id = $1 AND c.consumer_group = $2
       AND ",
            $walk,
            " AND c.partition_id <= $6
     ORDER BY c.partition_id)
),
cs AS (
    SELECT w.wrapped, s.*
    FROM walk w
    CROSS JOIN LATERAL ",
            $state,
            " s
),
-- Cursors to claim (free, with messages to hand out) and cursors whose lease ended, in walk
-- order; the walk stops a few beyond what is wanted ($7). This server's claims of one group
-- run one at a time (their lane), so only other servers' claims lock some of these first.
-- The queue's options are read through scalar subqueries, not a join: joined, the planner
-- would copy the free-cursor test into a filter of its own and probe each cursor's next
-- message twice.
seen AS (
    SELECT f.partition_id, f.wrapped, f.lease_id IS NOT NULL AS expired
    FROM cs f
    WHERE (f.lease_id IS NOT NULL AND f.lease_expires_at <= now())
       OR (f.lease_id IS NULL AND f.available_at <= now()
           -- Not EXISTS: the planner drops an EXISTS's ORDER BY and may then walk the
           -- partition in any order; in position order it reads one index entry.
           AND (SELECT m.pos FROM ",
            crate::messages::partition_messages!($messages),
            "
                  AND m.pos > f.cursor_pos AND m.seg >= f.cursor_seg
                ORDER BY m.pos LIMIT 1) IS NOT NULL
           -- windowBuffer, retentionSeconds and delayedProcessing, checked by a function
           -- called only for queues that set one: inline, their plan nodes would be
           -- initialised by every walk of every queue.
           AND ((SELECT window_secs + retention_secs + delay_secs FROM q) = 0
                OR ",
            $claimable,
            "))
    LIMIT $4::bigint + $7::bigint
),
cand AS (
    SELECT c.partition_id
    FROM seen e
    JOIN ",
            crate::cursor::cursors!(),
            " ON c.partition_id = e.partition_id AND c.consumer_group = $2",
            $cand,
            "
    WHERE NOT e.expired
    ORDER BY e.wrapped, e.partition_id
    LIMIT $4
    FOR NO KEY UPDATE OF c SKIP LOCKED
)
SELECT partition_id, false AS wrapped, 0::int2 AS kind FROM cand
UNION ALL
SELECT partition_id, wrapped, 1::int2 FROM seen WHERE expired
UNION ALL
SELECT e.partition_id, e.wrapped, 2::int2 FROM seen e
WHERE NOT e.expired AND NOT EXISTS (SELECT 1 FROM cand c WHERE c.partition_id = e.partition_id)"
        )
    };
}

/// What a claim reads before it writes (see [`CLAIM`]): the queue's options (`$options`), the
/// cursors' states (`$state`, of the partitions `$from`, named `$name`), the next messages of
/// each (`$messages`, bounded by `$bound`) as `$picked`, capped by `$capped`, and the span of
/// each partition's messages handed out.
macro_rules! claim_reads {
    (options: $options:expr; from: $from:expr; name: $name:literal; state: $state:expr;
     picked: $picked:literal; messages: $messages:literal; bound: $bound:expr;
     capped: $capped:expr) => {
        concat!(
            "WITH q AS (",
            $options,
            "),
st AS MATERIALIZED (
    SELECT s.*, ",
            crate::catalog::partition_name!($name),
            " AS name
    FROM ",
            $from,
            "
    CROSS JOIN LATERAL ",
            $state,
            " s
    WHERE s.lease_id IS NULL AND s.available_at <= now()
),
",
            $picked,
            " AS MATERIALIZED (
    SELECT st.partition_id, m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload,
           m.created_at, m.producer_sub,
           1 + coalesce(st.attempt_cnt[array_position(st.attempt_pos, m.pos)], 0) AS attempt
    FROM st
    CROSS JOIN q
    CROSS JOIN LATERAL (
        SELECT m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at,
               m.producer_sub
        FROM ",
            crate::messages::partition_messages!($messages),
            "
          AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
          AND m.pos <> ALL (st.settled)
          AND (q.delay_secs = 0 OR m.created_at <= now() - make_interval(secs => q.delay_secs))
          AND (q.retention_secs = 0
               OR m.created_at > now() - make_interval(secs => q.retention_secs))",
            $bound,
            "
        ORDER BY m.pos
        LIMIT $4
    ) m
),
",
            $capped,
            "
span AS (
    -- Messages before the first one handed out that are not settled are past their queue's
    -- retention: the position moves over them.
    SELECT partition_id, max(pos) AS upto,
           CASE WHEN $6 THEN max(pos) ELSE min(pos) - 1 END AS cut,
           -- The leased ids, for the lease's digest: aggregated as they come, so the
           -- messages are grouped by hashing, not sorted (the digest sorts each lease's ids).
           array_agg(transaction_id) FILTER (WHERE NOT $6) AS ids
    FROM msgs GROUP BY partition_id
)"
        )
    };
}

/// The `SELECT` of a claim's new cursor states: the generation `$gen`, the lease `$lease`.
macro_rules! claim_state {
    (gen: $gen:expr; lease: $lease:literal) => {
        concat!(
            "SELECT st.partition_id, $2, ",
            $gen,
            ", st.ver + 1,
           greatest(st.cursor_pos, span.cut), st.cursor_seg,
           ARRAY(SELECT x FROM unnest(st.settled) x WHERE x > span.cut),
           ARRAY(SELECT a FROM unnest(st.attempt_pos) a WHERE a > span.cut),
           ARRAY(SELECT n FROM unnest(st.attempt_pos, st.attempt_cnt) AS x(a, n)
                 WHERE a > span.cut),
           CASE WHEN $6 THEN NULL ELSE ",
            $lease,
            " END,
           CASE WHEN $6 THEN NULL ELSE now() + make_interval(secs => q.lease_secs) END,
           span.upto, st.available_at, clock_timestamp(),
           (SELECT ",
            crate::cursor::lease_digest!("x"),
            " FROM unnest(span.ids) x)
    FROM st
    JOIN span ON span.partition_id = st.partition_id
    CROSS JOIN q"
        )
    };
}

/// A claim statement: [`claim_reads!`], the insert of [`claim_state!`], the messages handed
/// out with their partition's lease, and `$refuse` (the refusal of sealed payloads, or not).
macro_rules! claim_sql {
    (reads: $reads:expr; lease: $lease:literal; refuse: $refuse:expr) => {
        concat!(
            "\n",
            $reads,
            ",
claimed AS (
    ",
            crate::cursor::insert_leased_state!(),
            "
    ",
            claim_state!(gen: crate::cursor::newest_gen!(); lease: $lease),
            "
    RETURNING partition_id, lease_id, lease_expires_at
),
leased AS MATERIALIZED (
    SELECT cl.partition_id, st.name, cl.lease_id, cl.lease_expires_at
    FROM claimed cl
    JOIN st ON st.partition_id = cl.partition_id
)
SELECT l.partition_id, l.name, l.lease_id, l.lease_expires_at,
       m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at, m.attempt,
       m.producer_sub",
            $refuse,
            "
FROM msgs m
JOIN leased l ON l.partition_id = m.partition_id"
        )
    };
}

/// The refusal of a sealed payload, in a claim that does not open payloads before it commits.
macro_rules! refuse_sealed {
    () => {
        ",
       CASE WHEN substr(m.payload, 1, 1) = '\\x00'::bytea THEN comb.refuse_sealed_payload() END"
    };
}

/// The cap of a shared claim's messages over all its partitions.
macro_rules! shared_cap {
    () => {
        "msgs AS MATERIALIZED (
    SELECT * FROM (
        SELECT p.*, row_number() OVER (
                   ORDER BY array_position($3::uuid[], p.partition_id), p.pos) AS rank
        FROM picked p) r
    WHERE rank <= $8
),"
    };
}

/// The partitions a claim names: every one of `$3` on PostgreSQL; on Citus the one in `$9`.
macro_rules! claim_partitions {
    (postgres) => {
        "unnest($3::uuid[]) AS c(partition_id)"
    };
    (citus) => {
        "(SELECT $9::uuid WHERE $9::uuid = ANY($3::uuid[])) AS c(partition_id)"
    };
}

/// [`claim_reads!`] of the four claims, by form (`postgres`, `citus`), options (`$options`),
/// bound of the messages (`$bound`) and sharing (`plain`, `shared`).
macro_rules! reads_of {
    (postgres, $options:expr, $bound:expr, plain) => {
        claim_reads!(options: $options; from: claim_partitions!(postgres);
            name: "c.partition_id"; state: crate::cursor::state_of!("c.partition_id", "$2");
            picked: "msgs"; messages: "st.partition_id"; bound: $bound; capped: "")
    };
    (postgres, $options:expr, $bound:expr, shared) => {
        claim_reads!(options: $options; from: claim_partitions!(postgres);
            name: "c.partition_id"; state: crate::cursor::state_of!("c.partition_id", "$2");
            picked: "picked"; messages: "st.partition_id"; bound: $bound; capped: shared_cap!())
    };
    (citus, $options:expr, $bound:expr, plain) => {
        claim_reads!(options: $options; from: claim_partitions!(citus);
            name: "c.partition_id AND p.id = $9";
            state: crate::cursor::state_in_partition!("c.partition_id", "$2", one "$9");
            picked: "msgs"; messages: "st.partition_id AND m.partition_id = $9"; bound: $bound;
            capped: "")
    };
    (citus, $options:expr, $bound:expr, shared) => {
        claim_reads!(options: $options; from: claim_partitions!(citus);
            name: "c.partition_id AND p.id = $9";
            state: crate::cursor::state_in_partition!("c.partition_id", "$2", one "$9");
            picked: "picked"; messages: "st.partition_id AND m.partition_id = $9"; bound: $bound;
            capped: shared_cap!())
    };
}

/// First half of a claim: the group's cursors of the queue with messages to hand out and no
/// lease, locked with `SKIP LOCKED` so concurrent claims never wait on each other; and the
/// cursors whose lease ended unsettled (not locked: `lease::expire_leases` locks them). One row
/// per cursor: its partition (`partition_id`), whether the walk had wrapped around
/// (`wrapped`), and what it is (`kind`) — 0 locked to claim, 1 lease ended, 2 free but passed
/// over (locked by another claim, or beyond what was wanted).
///
/// Fairness is round robin: cursors are walked in partition order starting after the
/// partition the previous claim of this server took (`$6`), wrapping around, so every
/// partition with pending messages is served within one turn of the walk. The walk is lazy:
/// a claim reads the state of a few more cursors than it wants, not of every partition of the
/// queue, unless few partitions have messages.
pub const CANDIDATES_SQL: &str = candidates_sql!(
    walk: "($3::uuid IS NULL OR c.partition_id = $3)";
    state: crate::cursor::state_of!("w.partition_id", "$2");
    messages: "f.partition_id";
    cand: "";
    claimable: "comb.claimable_now(f.partition_id, f.cursor_pos, f.cursor_seg,
                                      (SELECT window_secs FROM q),
                                      (SELECT retention_secs FROM q),
                                      (SELECT delay_secs FROM q))"
);

/// [`CANDIDATES_SQL`] for a Citus cluster, where every walk names one partition (`$3`): each
/// distributed table is filtered by it in so many words, so Citus plans the statement with
/// one task on the worker holding the partition (a router statement) and lets it lock rows,
/// which it refuses across shards. The cursor's state is read by a subquery
/// ([`crate::cursor::latest_state`]), and `comb.claimable_now` written out
/// ([`claimable_citus!`]): run on the worker, a function's own queries would be distributed
/// queries from a shard, which Citus refuses.
pub const CANDIDATES_CITUS_SQL: &str = candidates_sql!(
    walk: "c.partition_id = $3";
    state: crate::cursor::state_in_partition!("w.partition_id", "$2", one "$3");
    messages: "f.partition_id AND m.partition_id = $3";
    cand: " AND c.partition_id = $3";
    claimable: claimable_citus!()
);

/// The claim's first half, by storage.
const CANDIDATES: Forms = Forms {
    postgres: CANDIDATES_SQL,
    citus: CANDIDATES_CITUS_SQL,
};

/// `comb.claimable_now(f.partition_id, …)` of the walk for one partition (`$3`), as an
/// expression of the statement: the partition's head time (`comb.partition_head`) against
/// `windowBuffer` and `retentionSeconds`, its next message's time against
/// `delayedProcessing`.
macro_rules! claimable_citus {
    () => {
        concat!(
            "(
    ((SELECT window_secs FROM q) = 0
     OR (",
            crate::messages::head_at_written_out!("$3"),
            "
         <= now() - make_interval(secs => (SELECT window_secs FROM q))) IS TRUE)
    AND ((SELECT retention_secs FROM q) = 0
     OR (",
            crate::messages::head_at_written_out!("$3"),
            "
         > now() - make_interval(secs => (SELECT retention_secs FROM q))) IS TRUE)
    AND ((SELECT delay_secs FROM q) = 0
     OR ((SELECT m.created_at FROM ",
            crate::messages::partition_messages!("$3"),
            " AND m.pos > f.cursor_pos AND m.seg >= f.cursor_seg
          ORDER BY m.pos LIMIT 1)
         <= now() - make_interval(secs => (SELECT delay_secs FROM q))) IS TRUE))"
        )
    };
}
use claimable_citus;

/// Second half of a claim, run once the cursors are locked (so its snapshot sees every
/// version written before): read the latest state again, read the next `batch` unsettled
/// messages of each partition once, and write the cursor's next version with the lease (or,
/// with auto-ack, with the position moved past what was handed out). Per-partition figures
/// (name, lease) are joined to the messages once per partition, and rows come back in no
/// particular order ([`claims_from_rows`] groups them): sorting the handed-out payloads
/// again, and looking up a partition's name for each of them, cost a third of the
/// statement.
///
/// A claim whose COMMIT is pipelined behind it (not `OPENING_…`) cannot look at what it read
/// before it commits, so a sealed payload makes it fail (and roll back) instead: the claim is
/// then made again by one that opens payloads first.
pub const CLAIM_SQL: &str = claim_sql!(
    reads: reads_of!(postgres, concat!("\n    ", queue_options!()), "", plain);
    lease: "gen_random_uuid()";
    refuse: refuse_sealed!()
);

/// [`CLAIM_SQL`] for a pop whose partitions share one lease (`$7`, a uuid) and whose `batch`
/// caps the messages over all of them (`$8`): the next messages of every partition are
/// ranked in the walk's order of the partitions (`$3`), then by position, and only the first
/// `$8` are handed out, so each partition still hands out a prefix of what it holds. A
/// partition left without messages by the cap is not leased (its lock ends with the claim).
pub const SHARED_CLAIM_SQL: &str = claim_sql!(
    reads: reads_of!(postgres, concat!("\n    ", queue_options!()), "", shared);
    lease: "$7::uuid";
    refuse: refuse_sealed!()
);

/// [`CLAIM_SQL`] for claims that open payloads before they commit (queues that seal them):
/// the same statement without the refusal of sealed payloads.
const OPENING_CLAIM_SQL: &str = claim_sql!(
    reads: reads_of!(postgres, concat!("\n    ", queue_options!()), "", plain);
    lease: "gen_random_uuid()";
    refuse: ""
);

/// [`SHARED_CLAIM_SQL`] for claims that open payloads before they commit.
const OPENING_SHARED_CLAIM_SQL: &str = claim_sql!(
    reads: reads_of!(postgres, concat!("\n    ", queue_options!()), "", shared);
    lease: "$7::uuid";
    refuse: ""
);

/// The claims, by storage: on Citus the call of the claim function
/// ([`CLAIM_CITUS_FUNCTION`]), which picks the kind of claim by its arguments.
const CLAIM: Forms = Forms {
    postgres: CLAIM_SQL,
    citus: CLAIM_CITUS_CALL,
};
const SHARED_CLAIM: Forms = Forms {
    postgres: SHARED_CLAIM_SQL,
    citus: CLAIM_CITUS_CALL,
};
const OPENING_CLAIM: Forms = Forms {
    postgres: OPENING_CLAIM_SQL,
    citus: CLAIM_CITUS_CALL,
};
const OPENING_SHARED_CLAIM: Forms = Forms {
    postgres: OPENING_SHARED_CLAIM_SQL,
    citus: CLAIM_CITUS_CALL,
};

/// The SQLSTATE of `comb.refuse_sealed_payload()` (schema version 15).
const SEALED_IN_CLAIM: &str = "CB001";

/// The claims' Citus forms ([`CLAIM_SQL`] and the others for one partition, `$9`, the only
/// element of `$3`, named to every distributed table for the reason of
/// [`CANDIDATES_CITUS_SQL`]): what the bodies of [`CLAIM_CITUS_FUNCTION`] run, pinned with
/// the claims (its partition is the ninth argument for all four; the plain claims leave the
/// seventh and eighth unused).
#[cfg(test)]
const CLAIM_CITUS_SQL: &str = claim_sql!(
    reads: reads_of!(citus, concat!("\n    ", queue_options!()), "", plain);
    lease: "gen_random_uuid()";
    refuse: refuse_sealed!()
);
#[cfg(test)]
const SHARED_CLAIM_CITUS_SQL: &str = claim_sql!(
    reads: reads_of!(citus, concat!("\n    ", queue_options!()), "", shared);
    lease: "$7::uuid";
    refuse: refuse_sealed!()
);
#[cfg(test)]
const OPENING_CLAIM_CITUS_SQL: &str = claim_sql!(
    reads: reads_of!(citus, concat!("\n    ", queue_options!()), "", plain);
    lease: "gen_random_uuid()";
    refuse: ""
);
#[cfg(test)]
const OPENING_SHARED_CLAIM_CITUS_SQL: &str = claim_sql!(
    reads: reads_of!(citus, concat!("\n    ", queue_options!()), "", shared);
    lease: "$7::uuid";
    refuse: ""
);

/// The queue's options in [`CLAIM_CITUS_FUNCTION`]: read first, into its variables.
macro_rules! delegated_options {
    () => {
        "SELECT claim_q_lease_secs AS lease_secs, claim_q_delay_secs AS delay_secs, \
         claim_q_window_secs AS window_secs, claim_q_retention_secs AS retention_secs"
    };
}

/// The bound of the messages [`CLAIM_CITUS_FUNCTION`] hands out: the new state's
/// `lease_upto` (see [`delegated_claim`]).
macro_rules! delegated_bound {
    () => {
        "\n          AND m.pos <= claim_lease_upto"
    };
}

/// The claim of one partition on Citus as one function, `comb.claim_partition`, distributed by
/// its partition (`a_partition`, co-located with `comb.partitions`) with `force_delegation`:
/// called inside the claim's transaction, Citus sends the whole call to the worker holding the
/// partition, which runs the claim there against its own shards. Sent from the coordinator as
/// one statement, the claim's steps (materialised CTEs, the insert of the new state) were each
/// planned apart and their intermediate results passed through the coordinator, which also
/// made the claim commit in two phases; delegated, the transaction touches one worker over one
/// connection and commits in one phase. The body is the Citus form of the statement the plain
/// claim sends (one of four, by `shared` and `opening`), in three router statements
/// ([`delegated_claim`]) made of the same fragments as [`CLAIM_SQL`], so the semantics stay
/// those of the claims. Made by `comb migrate` on Citus ([`crate::schema::citus::delegate`]);
/// the opening forms return a last column of NULL where the others refuse sealed payloads.
pub(crate) static CLAIM_CITUS_FUNCTION: LazyLock<String> = LazyLock::new(|| {
    let state = crate::cursor::StateByValues::of_lease(CLAIM_CITUS_STATE, "claim");
    crate::schema::citus::function_of_partition(
        crate::schema::versioned!("comb.claim_partition"),
        "a_queue uuid, a_group text, a_ids uuid[], a_batch bigint, a_lease_secs float8, \
         a_auto_ack boolean, a_lease uuid, a_cap bigint, a_partition uuid, a_shared boolean, \
         a_opening boolean",
        "partition_id uuid, name text, lease_id uuid, lease_expires_at timestamptz, \
         pos bigint, message_id uuid, transaction_id text, trace_id text, payload bytea, \
         created_at timestamptz, attempt integer, producer_sub text, refused boolean",
        &format!(
            "
DECLARE
{}BEGIN
    IF a_shared AND a_opening THEN
{}
    ELSIF a_shared THEN
{}
    ELSIF a_opening THEN
{}
    ELSE
{}
    END IF;
END;",
            delegated_declare(&state),
            delegated_claim(
                &state,
                reads_of!(citus, delegated_options!(), "", shared),
                reads_of!(citus, delegated_options!(), delegated_bound!(), shared),
                CLAIM_CITUS_SHARED_STATE,
                ",\n       NULL::boolean",
            ),
            delegated_claim(
                &state,
                reads_of!(citus, delegated_options!(), "", shared),
                reads_of!(citus, delegated_options!(), delegated_bound!(), shared),
                CLAIM_CITUS_SHARED_STATE,
                refuse_sealed!(),
            ),
            delegated_claim(
                &state,
                reads_of!(citus, delegated_options!(), "", plain),
                reads_of!(citus, delegated_options!(), delegated_bound!(), plain),
                CLAIM_CITUS_STATE,
                ",\n       NULL::boolean",
            ),
            delegated_claim(
                &state,
                reads_of!(citus, delegated_options!(), "", plain),
                reads_of!(citus, delegated_options!(), delegated_bound!(), plain),
                CLAIM_CITUS_STATE,
                refuse_sealed!(),
            ),
        ),
    )
});

/// The new state of [`CLAIM_CITUS_FUNCTION`]'s claims, their generation its variable.
const CLAIM_CITUS_STATE: &str = claim_state!(gen: "claim_newest_gen"; lease: "gen_random_uuid()");
const CLAIM_CITUS_SHARED_STATE: &str = claim_state!(gen: "claim_newest_gen"; lease: "$7::uuid");

/// The declarations of [`CLAIM_CITUS_FUNCTION`]'s variables: the new state's and the queue's
/// options.
fn delegated_declare(state: &crate::cursor::StateByValues) -> String {
    let mut declare = state.declare.clone();
    for o in ["lease_secs", "delay_secs", "window_secs", "retention_secs"] {
        declare.push_str(&format!("    claim_q_{o} float8;\n"));
    }
    declare
}

/// A claim of Citus form as the statements of [`CLAIM_CITUS_FUNCTION`]'s body: `reads` (the
/// claim's reads, the queue's options from the variables), `bounded` (the same, the messages
/// bounded by the new state's `lease_upto`), the new state `select` and the last column
/// `refused`.
///
/// Why several: run on the worker as one statement, its data-modifying CTE (the insert of the
/// new state) keeps Citus from planning it as one router statement, so Citus plans each CTE
/// apart and sends the results the insert reads to every worker (an `INSERT … SELECT` is
/// planned after its inputs, so they are wanted "anywhere"): one worker down then failed
/// every claim, also of partitions on the live workers. Cut up, each statement runs on that
/// worker alone: the queue's options and the newest cursor generation read first (reference
/// tables, read apart: `force_delegation` refuses a statement joining them to the
/// partition's tables, which are of another co-location group), then (1) the new state read
/// into variables, (2) the messages handed out, read before the insert (against the state
/// the claim replaces) and bounded by the new state's `lease_upto`, so that a message pushed
/// meanwhile is not handed out unleased, (3) the new state inserted from the variables. The
/// claim's walk holds the cursor's lock, so no other claim moves it between them.
fn delegated_claim(
    state: &crate::cursor::StateByValues,
    reads: &str,
    bounded: &str,
    select: &str,
    refused: &str,
) -> String {
    let (newest_gen, vars, insert) = (&state.newest_gen, &state.vars, &state.insert);
    format!(
        "SELECT lease_secs, delay_secs, window_secs, retention_secs
FROM ({options}) o
INTO claim_q_lease_secs, claim_q_delay_secs, claim_q_window_secs, claim_q_retention_secs;
IF NOT FOUND THEN
    RETURN;
END IF;
{newest_gen};
{reads}
{select}
INTO {vars};
IF NOT FOUND THEN
    RETURN;
END IF;
RETURN QUERY
{bounded}
SELECT st.partition_id, st.name, claim_lease_id, claim_lease_expires_at,
       m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at, m.attempt,
       m.producer_sub{refused}
FROM msgs m
JOIN st ON st.partition_id = m.partition_id
ORDER BY m.pos;
{insert};",
        options = queue_options!(),
    )
}

/// [`CLAIM_CITUS_FUNCTION`]'s signature and distribution argument, for
/// `create_distributed_function`.
pub(crate) const CLAIM_CITUS_SIGNATURE: (&str, &str, bool) = (
    concat!(
        crate::schema::versioned!("comb.claim_partition"),
        "(uuid, text, uuid[], bigint, double precision, boolean, uuid, bigint, \
         uuid, boolean, boolean)"
    ),
    "a_partition",
    true,
);

/// The claim on Citus: one call of [`CLAIM_CITUS_FUNCTION`], a router statement Citus
/// delegates to the partition's worker (custom plans, so that its arguments are constants).
pub static CLAIM_CITUS_CALL: &str = concat!(
    "SELECT * FROM ",
    crate::schema::versioned!("comb.claim_partition"),
    "(
    $1::uuid, $2::text, $3::uuid[], $4::bigint, $5::float8, $6::boolean, $7::uuid, $8::bigint,
    $9::uuid, $10::boolean, $11::boolean)"
);

/// On a Citus cluster, a pop over the whole queue first lists the group's partitions that may
/// have something to hand out, without locking (Citus locks rows only in a statement of one
/// shard): a query run on every worker at once, in walk order from after the last partition
/// claimed (`$3`). Each is then claimed as a named partition, a router statement that
/// locks its cursor and skips it if another claim holds it. Queue options
/// (`windowBuffer`, `retentionSeconds`, `delayedProcessing`) are left to that claim.
pub static CANDIDATES_LIST_CITUS_SQL: LazyLock<String> = LazyLock::new(|| {
    super::by_worker::candidates_list(
        crate::cursor::CURSORS,
        crate::cursor::STATES,
        crate::messages::MESSAGES,
    )
});

/// Where the next claim of each (queue, group) starts its walk over the partitions: just
/// after the last partition this server claimed; and the free cursors with messages the last
/// walk saw beyond those it took, in walk order, which the next claims take without walking
/// (see [`Rovers::take_ahead`]). Only hints, for fairness and to spare walks (another server
/// keeps its own); losing them costs nothing but one walk from the start.
#[derive(Default)]
struct Rovers(Mutex<HashMap<(Uuid, String), Rover>>);

/// One (queue, group)'s place in the walk.
struct Rover {
    after: Uuid,
    /// Cursors seen free with messages to hand out, in walk order, and when.
    ahead: std::collections::VecDeque<Uuid>,
    seen_at: std::time::Instant,
}

impl Rovers {
    const LIMIT: usize = 100_000;

    /// How long the cursors a walk saw ahead stay worth taking without a walk: a partition
    /// that got messages since waits at most this long beyond its turn, and a lease that
    /// ended unsettled (which only a walk notices) this long beyond the walk that would
    /// have found it.
    const AHEAD_FOR: std::time::Duration = std::time::Duration::from_millis(100);

    fn get(&self, queue_id: Uuid, group: &str) -> Uuid {
        let map = self.0.lock().unwrap();
        map.get(&(queue_id, group.to_string()))
            .map_or(Uuid::nil(), |r| r.after)
    }

    /// After a walk: the next one starts after `after`; `ahead` (in walk order) may be
    /// claimed before it.
    fn set(&self, queue_id: Uuid, group: &str, after: Uuid, ahead: Vec<Uuid>) {
        let mut map = self.0.lock().unwrap();
        if map.len() >= Self::LIMIT {
            map.clear();
        }
        let rover = Rover {
            after,
            ahead: ahead.into(),
            seen_at: std::time::Instant::now(),
        };
        map.insert((queue_id, group.to_string()), rover);
    }

    /// Up to `n` of the cursors the last walk saw ahead, while they are fresh, in walk order;
    /// the next walk starts after the last of them. A claim of these reads their state again
    /// under their lock, so one taken meanwhile by another claim or emptied is only passed.
    /// With `whole`, all `n` or none: a shared-lease pop short of its partitions would walk
    /// for the rest, two claims where one walk's claim does.
    fn take_ahead(&self, queue_id: Uuid, group: &str, n: usize, whole: bool) -> Vec<Uuid> {
        let mut map = self.0.lock().unwrap();
        let Some(rover) = map.get_mut(&(queue_id, group.to_string())) else {
            return Vec::new();
        };
        if rover.seen_at.elapsed() > Self::AHEAD_FOR {
            rover.ahead.clear();
        }
        if whole && rover.ahead.len() < n {
            return Vec::new();
        }
        let n = n.min(rover.ahead.len());
        let taken: Vec<Uuid> = rover.ahead.drain(..n).collect();
        if let Some(&last) = taken.last() {
            rover.after = last;
        }
        taken
    }
}

/// Lanes of claims per pop worker. Each (queue, group) has one lane, so more lanes than
/// workers keep groups that share a lane from waiting for each other; the workers' count
/// still bounds the claims running at once (and the connections they hold).
const LANES_PER_WORKER: usize = 4;

/// Starts the pop workers.
#[allow(clippy::too_many_arguments)]
pub(crate) fn start(
    pool: Pool,
    backend: Backend,
    router: db::route::Router,
    to_workers: Option<Arc<db::Connector>>,
    workers: usize,
    default_lease_seconds: f64,
    metrics: Arc<Metrics>,
    keys: Arc<Keys>,
    stage: Arc<Stage>,
) -> Fuser<PopJob> {
    let ctx = Arc::new(Context {
        backend,
        router,
        to_workers,
        layout: super::by_worker::Layout::default(),
        rovers: Rovers::default(),
        default_lease_seconds,
        metrics,
        keys,
    });
    let running = Arc::new(Semaphore::new(workers.max(1)));
    let run: Runner<PopJob> = Arc::new(move |jobs| {
        let pool = pool.clone();
        let running = running.clone();
        let ctx = ctx.clone();
        Box::pin(async move { run_batch(pool, running, ctx, jobs).await })
    });
    Fuser::start_keyed(workers.max(1) * LANES_PER_WORKER, 256, |_| 1, run, stage)
}

/// What every claim of the pop workers shares.
struct Context {
    /// The storage claims run on.
    backend: Backend,
    /// Where a named partition's claim goes: its worker on the direct route.
    router: db::route::Router,
    /// Connects to a Citus worker (the database URL's settings at its host), for the listing
    /// of candidates one worker at a time ([`super::by_worker`]).
    to_workers: Option<Arc<db::Connector>>,
    /// Where the listing's shards are, for the listing one worker at a time on the direct
    /// route ([`super::by_worker::list_direct`]).
    layout: super::by_worker::Layout,
    rovers: Rovers,
    default_lease_seconds: f64,
    metrics: Arc<Metrics>,
    /// Opens sealed payloads before they are handed out.
    keys: Arc<Keys>,
}

/// Runs the claims of one lane's batch and returns once each has walked: the lane's next
/// claim may start while these read their messages and commit. Its walk starts after the
/// cursors these locked (the rover has moved past them) and skips them if it wraps around,
/// so claims of one lane still never walk the same cursors at once.
async fn run_batch(pool: Pool, running: Arc<Semaphore>, ctx: Arc<Context>, jobs: Vec<PopJob>) {
    let mut by_shape: HashMap<PopShape, Vec<PopJob>> = HashMap::new();
    for job in jobs {
        by_shape.entry(job.shape.clone()).or_default().push(job);
    }
    // Each shape is a transaction of its own, on a connection of its own.
    let mut walked = Vec::with_capacity(by_shape.len());
    for (shape, jobs) in by_shape {
        let (walk_done, walk_seen) = oneshot::channel();
        walked.push(walk_seen);
        let (pool, running, ctx) = (pool.clone(), running.clone(), ctx.clone());
        tokio::spawn(async move {
            let wanted: usize = jobs.iter().map(|j| j.partitions).sum();
            if ctx.backend.rows_lock_in_one_shard_only()
                && shape.partition_id.is_none()
                && !shape.shared_lease
            {
                let result = claim_listed(&pool, &running, &ctx, &shape, wanted, walk_done).await;
                return answer(jobs, result);
            }
            let _turn = running.acquire().await.expect("never closed");
            let mut walk_done = Some(walk_done);
            let pool = ctx.router.consumer(&pool, shape.partition_id).await;
            let client = match pool.get().await {
                Ok(client) => client,
                Err(e) => return answer(jobs, Err(DbError::from(e))),
            };
            let claim = |lease| Claiming {
                ctx: &ctx,
                shape: &shape,
                lease,
            };
            if shape.shared_lease {
                // One claim per pop, each under a lease of its own; the lane goes on once
                // the last of them walked.
                let mut jobs = jobs.into_iter().peekable();
                while let Some(job) = jobs.next() {
                    let mut done = jobs.peek().is_none().then(|| walk_done.take()).flatten();
                    let lease = (!shape.auto_ack).then(Uuid::now_v7);
                    let result = claim(lease).run(&client, job.partitions, &mut done).await;
                    answer(vec![job], result);
                }
                return;
            }
            let result = claim(None).run(&client, wanted, &mut walk_done).await;
            drop(walk_done);
            answer(jobs, result);
        });
    }
    // A claim that fails or ends drops its sender: that also lets the lane go on.
    for seen in walked {
        let _ = seen.await;
    }
}

/// Hands each pop its share of what a claim got, or the claim's error.
fn answer(jobs: Vec<PopJob>, result: Result<Vec<Claim>, DbError>) {
    fusion::reply_all(jobs, result, |j| (j.partitions, j.reply));
}

/// One claim for the pops of one shape.
struct Claiming<'a> {
    ctx: &'a Context,
    shape: &'a PopShape,
    /// The lease every partition of a shared-lease pop is claimed under.
    lease: Option<Uuid>,
}

impl Claiming<'_> {
    /// Claims up to `partitions` partitions; `walk_done` is told once the last walk holds its
    /// cursors.
    async fn run(
        &self,
        client: &deadpool_postgres::Client,
        partitions: usize,
        walk_done: &mut Option<oneshot::Sender<()>>,
    ) -> Result<Vec<Claim>, DbError> {
        if self.ctx.backend.rows_lock_in_one_shard_only() && self.shape.partition_id.is_none() {
            return self.run_listed(client, partitions, walk_done).await;
        }
        let mut claims: Vec<Claim> = Vec::new();
        // A walk claims less than wanted when leases ended (settled here, then their
        // partitions are free) or when other servers' claims held cursors it saw: the next
        // walk then starts past them and looks further ahead. Three walks at most: a pop
        // never spins.
        let ahead_too = self.shape.takes_ahead();
        // A multi-partition pop looks ahead for the next pops of as many partitions as its own
        // (their claims take all or none); fused one-partition pops take what there is.
        let mut lookahead = match (ahead_too, self.shape.shared_lease) {
            (true, true) => (LOOKAHEAD_SAVED * partitions as i64).min(LOOKAHEAD_SHARED_MAX),
            (true, false) => LOOKAHEAD_SAVED,
            (false, _) => LOOKAHEAD,
        };
        // A shared-lease pop's batch is a cap over all its partitions.
        let mut left = self.shape.shared_lease.then_some(self.shape.batch as i64);
        for round in 0..3 {
            // The first round takes what the last walk saw ahead, if anything; later rounds walk.
            let ahead = if ahead_too && round == 0 {
                let rovers = &self.ctx.rovers;
                let whole = self.shape.shared_lease;
                rovers.take_ahead(self.shape.queue_id, &self.shape.group, partitions, whole)
            } else {
                Vec::new()
            };
            let took_ahead = !ahead.is_empty();
            let walk = claim_once(
                client,
                self.ctx,
                self.shape,
                partitions - claims.len(),
                lookahead,
                Shared {
                    lease: self.lease,
                    cap: left,
                },
                ahead,
                |locked, expired, passed_held| {
                    let last = round == 2
                        || claims.len() + locked >= partitions
                        || (!expired && !passed_held);
                    if last && let Some(done) = walk_done.take() {
                        let _ = done.send(());
                    }
                },
            )
            .await?;
            if let Some(left) = &mut left {
                *left -= walk
                    .claims
                    .iter()
                    .map(|c| c.messages.len() as i64)
                    .sum::<i64>();
            }
            // Messages dead-lettered unread leave their partitions' next messages to hand
            // out: a walk that handed out nothing else looks again.
            let look_again = walk.unreadable > 0 && walk.claims.is_empty();
            claims.extend(walk.claims);
            if left.is_some_and(|l| l <= 0) {
                break;
            }
            if !walk.expired.is_empty() {
                let expired = crate::lease::expire_leases(
                    client,
                    self.ctx.backend,
                    &self.shape.group,
                    &walk.expired,
                )
                .await?;
                self.ctx.metrics.messages.discarded.add(expired.discarded);
                let counts = QueueCounts {
                    dead_lettered: expired.dead_lettered,
                    ..QueueCounts::default()
                };
                self.ctx.metrics.queues.add(&self.shape.queue, counts);
            }
            if claims.len() >= partitions
                || (walk.expired.is_empty() && !walk.passed_held && !look_again && !took_ahead)
            {
                break;
            }
            if walk.passed_held {
                lookahead *= 4;
            }
        }
        Ok(claims)
    }
}

impl Claiming<'_> {
    /// A pop over the whole queue on Citus, one claim after another (a shared-lease pop's:
    /// its partitions share one lease): the candidates listed ([`Claiming::list`]), then each
    /// claimed as a named partition until enough are. Other pops take [`claim_listed`].
    async fn run_listed(
        &self,
        client: &deadpool_postgres::Client,
        partitions: usize,
        walk_done: &mut Option<oneshot::Sender<()>>,
    ) -> Result<Vec<Claim>, DbError> {
        let listed = self.list(client, partitions).await?;
        let mut claims: Vec<Claim> = Vec::new();
        // A shared-lease pop's batch caps the messages over all its partitions: each named
        // claim may take only what the ones before it left.
        let mut left = self.shape.batch;
        for partition_id in listed {
            if claims.len() >= partitions || left <= 0 {
                break;
            }
            let shape = PopShape {
                partition_id: Some(partition_id),
                batch: if self.shape.shared_lease {
                    left
                } else {
                    self.shape.batch
                },
                ..self.shape.clone()
            };
            let one = Claiming {
                ctx: self.ctx,
                shape: &shape,
                lease: self.lease,
            };
            let mut none = None;
            let got = Box::pin(one.run(client, 1, &mut none)).await?;
            if self.shape.shared_lease {
                let n: usize = got.iter().map(|c| c.messages.len()).sum();
                left -= i32::try_from(n).unwrap_or(i32::MAX);
            }
            claims.extend(got);
        }
        if let Some(done) = walk_done.take() {
            let _ = done.send(());
        }
        Ok(claims)
    }

    /// The partitions of the group that may have something to hand out, listed across the
    /// workers ([`CANDIDATES_LIST_CITUS_SQL`]) in walk order from the rover, a few more than
    /// `partitions`; the rover moves past them, so the lane's next list starts after them.
    async fn list(
        &self,
        client: &deadpool_postgres::Client,
        partitions: usize,
    ) -> Result<Vec<Uuid>, DbError> {
        let rover = self.ctx.rovers.get(self.shape.queue_id, &self.shape.group);
        let limit = (partitions as i64) + LOOKAHEAD;
        let (queue_id, group) = (self.shape.queue_id, &self.shape.group);
        let direct = super::by_worker::list_direct(
            client,
            &self.ctx.router,
            &self.ctx.layout,
            queue_id,
            group,
            partitions,
            limit,
        )
        .await?;
        let through_coordinator = match direct {
            Some(listed) => Ok(listed),
            None => client
                .query(
                    CANDIDATES_LIST_CITUS_SQL.as_str(),
                    &[&queue_id, group, &rover, &limit],
                )
                .await
                .map(|rows| rows.iter().map(|r| r.get("partition_id")).collect()),
        };
        let listed: Vec<Uuid> = match through_coordinator {
            Ok(listed) => listed,
            // A worker down: the live workers' candidates (see `by_worker`).
            Err(e) if super::by_worker::worker_unreachable(&e) => {
                let Some(workers) = &self.ctx.to_workers else {
                    return Err(e.into());
                };
                super::by_worker::list(client, workers, queue_id, group, rover, limit)
                    .await?
                    .ok_or(e)?
            }
            Err(e) => return Err(e.into()),
        };
        // The rover moves past what this claim means to take, not past the lookahead: a
        // listed partition left unclaimed comes first in the next walk instead of waiting a
        // whole round.
        if let Some(&last) = listed.get(listed.len().min(partitions).wrapping_sub(1)) {
            self.ctx.rovers.set(queue_id, group, last, Vec::new());
        }
        Ok(listed)
    }
}

/// A pop over the whole queue on Citus, for the fused pops of one shape: the candidates
/// listed under a turn of the pop workers ([`Claiming::list`]), then each claimed as a named
/// partition, as many at once as there are pop workers, each under a turn and on a
/// connection of its own (its worker's on the direct route). The lane goes on once the list
/// is made. (Claimed one after another, fifty fused pops waited for fifty claims in a row.)
/// When claims of the listed partitions found them taken (by the lane's batch before, still
/// claiming, or another server) and the list was full, so that more may wait past it, the
/// rest is listed once more from where this one stopped: the pops would otherwise get
/// nothing while partitions are free. A claim that fails leaves the others' answer; only
/// when none got anything is the error the answer.
async fn claim_listed(
    pool: &Pool,
    running: &Semaphore,
    ctx: &Context,
    shape: &PopShape,
    wanted: usize,
    walk_done: oneshot::Sender<()>,
) -> Result<Vec<Claim>, DbError> {
    let mut walk_done = Some(walk_done);
    let mut claims: Vec<Claim> = Vec::new();
    let mut failed = None;
    for _ in 0..LISTINGS {
        let want = wanted - claims.len();
        let listed = {
            let _turn = running.acquire().await.expect("never closed");
            let client = pool.get().await?;
            let lister = Claiming {
                ctx,
                shape,
                lease: None,
            };
            lister.list(&client, want).await?
        };
        if let Some(done) = walk_done.take() {
            let _ = done.send(());
        }
        let full = listed.len() as i64 >= want as i64 + LOOKAHEAD;
        claim_each(
            pool,
            running,
            ctx,
            shape,
            listed,
            wanted,
            &mut claims,
            &mut failed,
        )
        .await;
        if claims.len() >= wanted || !full {
            break;
        }
    }
    match failed {
        Some(e) if claims.is_empty() => Err(e),
        Some(e) => {
            tracing::warn!(error = %e, "a claim of a listed partition failed; the pops get the others");
            Ok(claims)
        }
        None => Ok(claims),
    }
}

/// Listings a fused pop over a queue on Citus makes at most ([`claim_listed`]).
const LISTINGS: usize = 2;

/// Claims the `listed` partitions, as many at once as `claims` still lacks of `wanted`, each
/// by [`claim_named`]; the first failure goes into `failed`. The rover ends at the last
/// partition tried, in the listing's order.
#[allow(clippy::too_many_arguments)]
async fn claim_each(
    pool: &Pool,
    running: &Semaphore,
    ctx: &Context,
    shape: &PopShape,
    listed: Vec<Uuid>,
    wanted: usize,
    claims: &mut Vec<Claim>,
    failed: &mut Option<DbError>,
) {
    let mut last = None;
    let mut pending = listed.into_iter();
    let mut claiming = futures_util::stream::FuturesUnordered::new();
    loop {
        while claims.len() + claiming.len() < wanted {
            let Some(partition_id) = pending.next() else {
                break;
            };
            last = Some(partition_id);
            claiming.push(claim_named(pool, running, ctx, shape, partition_id));
        }
        match futures_util::StreamExt::next(&mut claiming).await {
            Some(Ok(got)) => claims.extend(got),
            Some(Err(e)) => {
                failed.get_or_insert(e);
            }
            None => break,
        }
    }
    // Each named claim moved the rover to its own partition, in whatever order they ended:
    // it goes back to the last partition tried, in the listing's order.
    if let Some(last) = last {
        ctx.rovers
            .set(shape.queue_id, &shape.group, last, Vec::new());
    }
}

/// One listed partition claimed as a named one, under a turn of the pop workers.
async fn claim_named(
    pool: &Pool,
    running: &Semaphore,
    ctx: &Context,
    shape: &PopShape,
    partition_id: Uuid,
) -> Result<Vec<Claim>, DbError> {
    let _turn = running.acquire().await.expect("never closed");
    let shape = PopShape {
        partition_id: Some(partition_id),
        ..shape.clone()
    };
    let pool = ctx.router.consumer(pool, Some(partition_id)).await;
    let client = pool.get().await?;
    let one = Claiming {
        ctx,
        shape: &shape,
        lease: None,
    };
    Box::pin(one.run(&client, 1, &mut None)).await
}

/// How many free cursors beyond those it wants a claim's first walk reads.
const LOOKAHEAD: i64 = 2;

/// How many a walk reads beyond those it wants where the next claims may take what it saw
/// ahead without walking ([`PopShape::claims_ahead`]): each more costs the walk a cursor's
/// state and next message, and may spare a later claim its whole walk.
const LOOKAHEAD_SAVED: i64 = 8;

/// Most a multi-partition pop's walk looks ahead.
const LOOKAHEAD_SHARED_MAX: i64 = 128;

/// Cursors locked by key (in key order) put back in the order the walk saw them, which a
/// shared lease's cap follows: the first partition seen gives its messages first.
fn in_walk_order(locked: &mut [Uuid], ahead: &[Uuid]) {
    locked.sort_by_key(|p| ahead.iter().position(|a| a == p));
}

/// What one walk found.
#[derive(Default)]
struct Walk {
    claims: Vec<Claim>,
    /// Cursors whose lease ended unsettled.
    expired: Vec<Uuid>,
    /// It claimed less than wanted and passed over free cursors another claim held.
    passed_held: bool,
    /// Messages it dead-lettered because their payload could not be opened.
    unreadable: u64,
}

/// How a claim begins, on a connection of the consumer pool (whose settings plan it, see
/// [`db::consumer_plans`]). A claim with explicit acks does not wait for its WAL flush. A
/// lease is the one piece of state that may be lost in a database crash without breaking a
/// guarantee: its messages are then delivered again, exactly as after the lease's expiry,
/// and an ack under it is refused as under an expired lease. (A later durable commit, such as
/// the ack, flushes it anyway: the WAL is written in order.) An auto-ack claim moves the
/// position, which must not come back after a crash (at-most-once), so it waits like pushes
/// and acks.
pub fn begin_claim(auto_ack: bool) -> &'static str {
    if auto_ack {
        "BEGIN"
    } else {
        "BEGIN; SET LOCAL synchronous_commit = off"
    }
}

/// The lease and the cap of a shared-lease pop's claim (see [`SHARED_CLAIM_SQL`]).
struct Shared {
    lease: Option<Uuid>,
    /// Messages still to hand out; `None` for other pops.
    cap: Option<i64>,
}

/// One claim: candidates locked and ended leases found in one round trip, then the claim
/// and its commit in a second. With cursors the last walk saw `ahead`, the first round trip
/// locks those instead of walking: a lock by key where a walk reads the state and the next
/// message of each cursor on its way (the claim reads them again under the lock anyway).
#[allow(clippy::too_many_arguments)]
async fn claim_once(
    client: &deadpool_postgres::Client,
    ctx: &Context,
    shape: &PopShape,
    partitions: usize,
    lookahead: i64,
    shared: Shared,
    ahead: Vec<Uuid>,
    walked: impl FnOnce(usize, bool, bool),
) -> Result<Walk, DbError> {
    let (rovers, default_lease_seconds) = (&ctx.rovers, ctx.default_lease_seconds);
    let stmt = client
        .prepare_cached(claim_sql_for(ctx.backend, &shared, shape.sealed))
        .await?;
    let pg: &tokio_postgres::Client = client;
    let p = Pipelined::on(pg);
    if !ahead.is_empty() {
        let relock = client.prepare_cached(ctx.backend.sql(&RELOCK)).await?;
        let relock_params: [&(dyn ToSql + Sync); 2] = [&ahead, &shape.group];
        let (begin, relocked) = tokio::join!(
            p.begin_with(begin_claim(shape.auto_ack)),
            p.query(&relock, &relock_params)
        );
        let mut locked: Vec<Uuid> = match begin.and(relocked) {
            Ok(rows) => rows.iter().map(|r| r.get("partition_id")).collect(),
            Err(e) => return Err(rollback(pg, e).await),
        };
        in_walk_order(&mut locked, &ahead);
        // Short of what was wanted, a walk follows: the lane waits for it.
        walked(locked.len(), false, locked.len() < partitions);
        if locked.is_empty() {
            p.commit().await?;
            return Ok(Walk::default());
        }
        return match claim_locked(client, ctx, shape, &stmt, &locked, &shared, shape.sealed).await {
            Ok((claims, unreadable)) => Ok(Walk {
                claims,
                unreadable,
                ..Walk::default()
            }),
            // A sealed payload in a queue not known to seal them: the claim rolled back, and
            // the walk that follows claims these cursors again, opening payloads first.
            Err(e) if refused_sealed(&e) => Ok(Walk::default()),
            Err(e) => Err(e),
        };
    }
    let candidates = client.prepare_cached(ctx.backend.sql(&CANDIDATES)).await?;
    let limit = partitions as i64;
    let rover = rovers.get(shape.queue_id, &shape.group);
    let params: [&(dyn ToSql + Sync); 7] = [
        &shape.queue_id,
        &shape.group,
        &shape.partition_id,
        &limit,
        &default_lease_seconds,
        &rover,
        &lookahead,
    ];
    let (begin, found) = tokio::join!(
        p.begin_with(begin_claim(shape.auto_ack)),
        p.query(&candidates, &params)
    );
    let found = match begin.and(found) {
        Ok(rows) => rows,
        Err(e) => return Err(rollback(pg, e).await),
    };
    let mut locked: Vec<Uuid> = Vec::new();
    let mut expired: Vec<Uuid> = Vec::new();
    let mut passed: Vec<(bool, Uuid)> = Vec::new();
    for r in found {
        let partition_id = r.get("partition_id");
        match r.get::<_, i16>("kind") {
            0 => locked.push(partition_id),
            1 => expired.push(partition_id),
            _ => passed.push((r.get("wrapped"), partition_id)),
        }
    }
    let passed_held = locked.len() < partitions && !passed.is_empty();
    if passed_held {
        // The next walk starts after what this one saw held by another claim.
        let last = passed.iter().max().expect("not empty").1;
        rovers.set(shape.queue_id, &shape.group, last, Vec::new());
    } else if let Some(&last) = locked.last() {
        // Locked in walk order: the next claim starts after the last of them, and may take
        // the free cursors this walk saw beyond it, in walk order, without walking.
        let order = |p: Uuid| (p <= rover, p);
        let mut ahead: Vec<Uuid> = Vec::new();
        if shape.takes_ahead() {
            ahead = passed
                .iter()
                .map(|&(_, p)| p)
                .filter(|&p| order(p) > order(last))
                .collect();
            ahead.sort_unstable_by_key(|&p| order(p));
        }
        rovers.set(shape.queue_id, &shape.group, last, ahead);
    }
    walked(locked.len(), !expired.is_empty(), passed_held);
    if locked.is_empty() {
        p.commit().await?;
        return Ok(Walk {
            claims: Vec::new(),
            expired,
            passed_held,
            unreadable: 0,
        });
    }
    let mut claimed = claim_locked(client, ctx, shape, &stmt, &locked, &shared, shape.sealed).await;
    if claimed.as_ref().is_err_and(refused_sealed) {
        // A sealed payload in a queue not known to seal them (its encryption was switched
        // off since): the claim rolled back. Lock the same cursors again (those another
        // claim took meanwhile are skipped) and claim them opening payloads before the
        // commit.
        let citus = !ctx.backend.statements_span_partitions();
        let relock = client.prepare_cached(ctx.backend.sql(&RELOCK)).await?;
        let opening = client
            .prepare_cached(claim_sql_for(ctx.backend, &shared, true))
            .await?;
        let one = locked[0];
        let relock_params: [&(dyn ToSql + Sync); 3] = [&locked, &shape.group, &one];
        // Only the Citus form names its one partition ($3).
        let relock_params = if citus {
            &relock_params[..]
        } else {
            &relock_params[..2]
        };
        let (begin, relocked) = tokio::join!(
            p.begin_with(begin_claim(shape.auto_ack)),
            p.query(&relock, relock_params)
        );
        let relocked: Vec<Uuid> = match begin.and(relocked) {
            Ok(rows) => rows.iter().map(|r| r.get("partition_id")).collect(),
            Err(e) => return Err(rollback(pg, e).await),
        };
        claimed = if relocked.is_empty() {
            p.commit().await?;
            Ok((Vec::new(), 0))
        } else {
            claim_locked(client, ctx, shape, &opening, &relocked, &shared, true).await
        };
    }
    let (claims, unreadable) = claimed?;
    Ok(Walk {
        claims,
        expired,
        passed_held,
        unreadable,
    })
}

/// The claim statement for a pop of this kind (see [`CLAIM_SQL`]); on a Citus cluster the
/// call of the claim function, which picks the kind by its arguments.
fn claim_sql_for(backend: Backend, shared: &Shared, opening: bool) -> &'static str {
    backend.sql(match (shared.cap.is_some(), opening) {
        (false, false) => &CLAIM,
        (true, false) => &SHARED_CLAIM,
        (false, true) => &OPENING_CLAIM,
        (true, true) => &OPENING_SHARED_CLAIM,
    })
}

/// Locks cursors of a group again, by partition (see [`claim_once`]).
const RELOCK_SQL: &str = concat!(
    "
SELECT c.partition_id FROM ",
    crate::cursor::cursors!(),
    "
WHERE c.partition_id = ANY($1) AND c.consumer_group = $2
ORDER BY c.partition_id
FOR NO KEY UPDATE OF c SKIP LOCKED"
);

/// The relock: [`RELOCK_SQL`], and on Citus, where a claim holds one partition (`$3`), named
/// to the cursors so that the lock is a router statement on its worker.
const RELOCK: Forms = Forms {
    postgres: RELOCK_SQL,
    citus: concat!(
        "
SELECT c.partition_id FROM ",
        crate::cursor::cursors!(),
        "
WHERE c.partition_id = ANY($1) AND c.partition_id = $3 AND c.consumer_group = $2
ORDER BY c.partition_id
FOR NO KEY UPDATE OF c SKIP LOCKED"
    ),
};

/// Whether a claim failed on a sealed payload it could not open before committing.
fn refused_sealed(e: &DbError) -> bool {
    matches!(e, DbError::Postgres(pg)
        if pg.code().is_some_and(|c| c.code() == SEALED_IN_CLAIM))
}

/// The second half of a claim (`stmt`, from [`claim_sql_for`]) in the transaction that
/// locked `locked`, and its commit. Without `opening`, the COMMIT is pipelined behind the
/// claim statement, which refuses sealed payloads. With it, the claim's payloads are opened
/// before the commit, and those that cannot be (sealed with a key this server lacks) are
/// dead-lettered in the same transaction: nothing is consumed that was not handed out.
async fn claim_locked(
    client: &deadpool_postgres::Client,
    ctx: &Context,
    shape: &PopShape,
    stmt: &tokio_postgres::Statement,
    locked: &[Uuid],
    shared: &Shared,
    opening: bool,
) -> Result<(Vec<Claim>, u64), DbError> {
    let pg: &tokio_postgres::Client = client;
    let batch = shape.batch as i64;
    let cap = shared.cap.unwrap_or(0);
    let citus = !ctx.backend.statements_span_partitions();
    let one = locked[0];
    let is_shared = shared.cap.is_some();
    let claim_params: [&(dyn ToSql + Sync); 11] = [
        &shape.queue_id,
        &shape.group,
        &locked,
        &batch,
        &ctx.default_lease_seconds,
        &shape.auto_ack,
        &shared.lease,
        &cap,
        &one,
        &is_shared,
        &opening,
    ];
    // The plain claim has no $7 and $8; the Citus call takes all eleven (its one partition,
    // then which claim).
    let params: &[&(dyn ToSql + Sync)] = match (is_shared, citus) {
        (true, false) => &claim_params[..8],
        (false, false) => &claim_params[..6],
        (_, true) => &claim_params,
    };
    let p = Pipelined::on(pg);
    if !opening {
        let (rows, commit) = tokio::join!(p.query(stmt, params), p.commit());
        // A failed claim makes the pipelined COMMIT roll back.
        let rows = rows?;
        commit?;
        let (claims, unreadable) = claims_from_rows(&rows, &ctx.keys);
        if !unreadable.is_empty() {
            // Not sealed, yet not JSON: bytes changed behind the broker's back, after the
            // claim committed. They are dead-lettered now, in a transaction of their own.
            settle_unreadable(client, ctx, shape, &unreadable, true).await?;
        }
        return Ok((claims, unreadable.len() as u64));
    }
    let rows = match p.query(stmt, params).await {
        Ok(rows) => rows,
        Err(e) => return Err(rollback(pg, e).await),
    };
    let (claims, unreadable) = claims_from_rows(&rows, &ctx.keys);
    if !unreadable.is_empty()
        && let Err(e) = settle_unreadable(client, ctx, shape, &unreadable, false).await
    {
        p.roll_back().await;
        return Err(e);
    }
    p.commit().await?;
    Ok((claims, unreadable.len() as u64))
}

/// Dead-letters what a claim could not open (inside its transaction, or in one of its own
/// when `alone`) and counts it.
async fn settle_unreadable(
    client: &deadpool_postgres::Client,
    ctx: &Context,
    shape: &PopShape,
    unreadable: &[Unreadable],
    alone: bool,
) -> Result<(), DbError> {
    let n = unreadable::settle(
        client,
        ctx.backend,
        unreadable::Claimant {
            queue_id: shape.queue_id,
            group: &shape.group,
        },
        unreadable,
        alone,
    )
    .await?;
    ctx.metrics.messages.unreadable.add(n);
    ctx.metrics.messages.dead_lettered.add(n);
    let counts = QueueCounts {
        dead_lettered: n,
        ..QueueCounts::default()
    };
    ctx.metrics.queues.add(&shape.queue, counts);
    Ok(())
}

/// The claims of [`CLAIM_SQL`]'s rows, which come in no particular order: one per partition,
/// in partition id order, each with its messages in position order and their payloads
/// opened; and the messages whose payload could not be opened, which are left out (as is a
/// partition left with no message).
fn claims_from_rows(rows: &[tokio_postgres::Row], keys: &Keys) -> (Vec<Claim>, Vec<Unreadable>) {
    let mut by_partition: HashMap<Uuid, Claim> = HashMap::new();
    let mut unreadable = Vec::new();
    for r in rows {
        let partition_id: Uuid = r.get("partition_id");
        let claim = by_partition.entry(partition_id).or_insert_with(|| Claim {
            partition_id,
            partition: r.get("name"),
            lease_id: r.get("lease_id"),
            messages: Vec::new(),
        });
        let attempt: i32 = r.get("attempt");
        let data = match keys.open_json(r.get::<_, &[u8]>("payload")) {
            Ok(data) => data,
            Err(why) => {
                unreadable.push(Unreadable {
                    partition_id,
                    pos: r.get("pos"),
                    attempt,
                    lease_id: claim.lease_id,
                    why,
                });
                continue;
            }
        };
        claim.messages.push(Delivered {
            pos: r.get("pos"),
            message_id: r.get("message_id"),
            transaction_id: r.get("transaction_id"),
            trace_id: r.get("trace_id"),
            data,
            created_at: r.get("created_at"),
            attempt,
            producer_sub: r.get("producer_sub"),
        });
    }
    let mut claims: Vec<Claim> = by_partition
        .into_values()
        .filter(|c| !c.messages.is_empty())
        .collect();
    claims.sort_unstable_by_key(|c| c.partition_id);
    for c in &mut claims {
        c.messages.sort_unstable_by_key(|m| m.pos);
    }
    (claims, unreadable)
}

/// Ends a transaction that failed part-way (see [`db::roll_back`]) and hands back the error
/// that failed it.
async fn rollback(pg: &tokio_postgres::Client, e: tokio_postgres::Error) -> DbError {
    db::roll_back(pg).await;
    e.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_seen_ahead_are_taken_in_walk_order_while_fresh_and_move_the_rover() {
        let rovers = Rovers::default();
        let (queue, group) = (Uuid::now_v7(), "g");
        let [a, b, c, d] = [0; 4].map(|_| Uuid::now_v7());
        assert!(
            rovers.take_ahead(queue, group, 1, false).is_empty(),
            "nothing walked yet"
        );
        rovers.set(queue, group, a, vec![b, c, d]);
        assert_eq!(rovers.get(queue, group), a);
        assert_eq!(rovers.take_ahead(queue, group, 2, false), vec![b, c]);
        assert_eq!(
            rovers.get(queue, group),
            c,
            "the next walk starts after them"
        );
        assert!(rovers.take_ahead(queue, "other", 1, false).is_empty());
        assert!(
            rovers.take_ahead(queue, group, 2, true).is_empty(),
            "a shared lease takes all it wants or none"
        );
        assert_eq!(rovers.take_ahead(queue, group, 5, false), vec![d]);
        assert!(
            rovers.take_ahead(queue, group, 1, false).is_empty(),
            "each is taken once"
        );
        rovers.set(queue, group, a, vec![b]);
        std::thread::sleep(Rovers::AHEAD_FOR + std::time::Duration::from_millis(50));
        assert!(
            rovers.take_ahead(queue, group, 1, false).is_empty(),
            "stale: walk again"
        );
        assert_eq!(rovers.get(queue, group), a);
    }

    #[test]
    fn cursors_locked_by_key_are_claimed_in_the_order_the_walk_saw_them() {
        // A walk that wrapped around: the highest ids first.
        let [a, b, c] = [0; 3].map(|_| Uuid::now_v7());
        let ahead = vec![c, a, b];
        let mut locked = vec![a, c];
        in_walk_order(&mut locked, &ahead);
        assert_eq!(locked, vec![c, a]);
    }

    /// Every statement of the claim, by name, as this build composes it.
    fn statements() -> Vec<(&'static str, String)> {
        vec![
            ("CANDIDATES_SQL", CANDIDATES_SQL.to_string()),
            ("CANDIDATES_CITUS_SQL", CANDIDATES_CITUS_SQL.to_string()),
            (
                "CANDIDATES_LIST_CITUS_SQL",
                CANDIDATES_LIST_CITUS_SQL.to_string(),
            ),
            ("CLAIM_SQL", CLAIM_SQL.to_string()),
            ("SHARED_CLAIM_SQL", SHARED_CLAIM_SQL.to_string()),
            ("OPENING_CLAIM_SQL", OPENING_CLAIM_SQL.to_string()),
            (
                "OPENING_SHARED_CLAIM_SQL",
                OPENING_SHARED_CLAIM_SQL.to_string(),
            ),
            ("CLAIM_CITUS_SQL", CLAIM_CITUS_SQL.to_string()),
            ("SHARED_CLAIM_CITUS_SQL", SHARED_CLAIM_CITUS_SQL.to_string()),
            (
                "OPENING_CLAIM_CITUS_SQL",
                OPENING_CLAIM_CITUS_SQL.to_string(),
            ),
            (
                "OPENING_SHARED_CLAIM_CITUS_SQL",
                OPENING_SHARED_CLAIM_CITUS_SQL.to_string(),
            ),
            ("CLAIM_CITUS_FUNCTION", CLAIM_CITUS_FUNCTION.to_string()),
            ("CLAIM_CITUS_CALL", CLAIM_CITUS_CALL.to_string()),
            ("RELOCK_SQL", RELOCK_SQL.to_string()),
            ("RELOCK_CITUS_SQL", RELOCK.citus.to_string()),
        ]
    }

    /// The statements pinned in `claim_pinned.sql`, one after a `-- @NAME` line each.
    fn pinned() -> Vec<(String, String)> {
        include_str!("claim_pinned.sql")
            .split("-- @")
            .skip(1)
            .map(|part| {
                let (name, sql) = part.split_once('\n').expect("a name line");
                (name.trim().to_string(), sql.to_string())
            })
            .collect()
    }

    fn words(sql: &str) -> String {
        sql.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// The claim is the hot path of every pop: its statements are composed from the
    /// fragments of the tables' owners, and a change of a fragment must not change their
    /// plans unseen. Each expands to the text pinned in `claim_pinned.sql` (whitespace
    /// aside); a deliberate change rewrites the file with `COMB_PIN_CLAIM_SQL=write`.
    #[test]
    fn claim_statements_expand_to_the_pinned_sql() {
        let now = statements();
        if std::env::var("COMB_PIN_CLAIM_SQL").as_deref() == Ok("write") {
            let text: String = now
                .iter()
                .map(|(name, sql)| format!("-- @{name}\n{}\n\n", sql.trim()))
                .collect();
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/pop/claim_pinned.sql");
            std::fs::write(path, text).unwrap();
            return;
        }
        let pinned = pinned();
        let names: Vec<&str> = now.iter().map(|(n, _)| *n).collect();
        let pinned_names: Vec<&str> = pinned.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, pinned_names, "the statements pinned");
        for ((name, sql), (_, want)) in now.iter().zip(&pinned) {
            assert_eq!(words(sql), words(want), "{name} changed:\n{sql}");
        }
    }

    #[test]
    fn only_claims_with_explicit_acks_skip_the_flush_wait() {
        assert!(begin_claim(false).contains("synchronous_commit = off"));
        // An auto-ack claim moves the position: it must be durable when answered.
        assert!(!begin_claim(true).contains("synchronous_commit"));
        assert_eq!(begin_claim(true), "BEGIN");
    }
}
