//! The cursor of a (partition, group): its identity row in `comb.cursors` and its state as
//! insert-only versions in `comb.cursor_states`.
//!
//! Every writer of a state version (claims, acks, lease extension, lease expiry, moves) inserts
//! one full row with `ver` one above the version it follows; the column list is written once,
//! here, so the writers cannot disagree on it. Here too: the state as Rust sees it
//! ([`Cursor`]), locking a set of cursors ([`LOCK_SQL`]), reading their latest state after the
//! lock ([`state_sql!`], [`locked_cursors`]) and appending the next versions ([`StateWrites`]),
//! and the statements of the state's generations ([`generations`]). The claim and ack
//! statements, one round trip each, are built from this module's fragments.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use tokio_postgres::Statement;
use uuid::Uuid;

use crate::backend::{Backend, Forms};
use crate::db::DbError;
use crate::queue::QueueOptions;

/// The type of a cursor state's `column`, for PL/pgSQL variables holding it (`%TYPE`).
pub(crate) fn column_type(column: &str) -> String {
    format!("comb.cursor_states.{column}%TYPE")
}

/// `INSERT INTO comb.cursor_states (…every column…)`, for statements that append a full state
/// version; the `SELECT` that follows gives the columns in this order: partition, group,
/// generation, version, position, position's segment, settled positions, attempt positions,
/// attempt counts, lease id, lease end, last position leased, available from, last claimed.
macro_rules! insert_state {
    () => {
        "INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at)"
    };
}
pub(crate) use insert_state;

/// [`insert_state!`] with the lease's digest after the other columns: what a claim appends
/// (`pop::claim`), the only writer that sets it, and a lease's extension, which carries it.
/// `lease_digest` is the SHA-256 of the leased transaction ids in byte order, each as its
/// length in bytes, `:` and itself ([`digest`]); every other writer leaves it NULL, so a
/// version carries it only while nothing has moved the cursor since its claim.
macro_rules! insert_leased_state {
    () => {
        "INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at,
     lease_digest)"
    };
}
pub(crate) use insert_leased_state;

/// The digest of a lease's transaction ids, an aggregate over the rows with the ids in column
/// `$id`: the SHA-256 of each id in byte order, written as its length in bytes, `:` and itself
/// (so no two lists of ids give the same text), computed by the broker by [`digest`].
macro_rules! lease_digest {
    ($id:literal) => {
        concat!(
            "sha256(convert_to(string_agg(octet_length(",
            $id,
            ")::text || ':' || ",
            $id,
            ", '' ORDER BY ",
            $id,
            // The space before the comma is kept: the text is part of
            // `comb.claim_partition_v4`'s body, made once per database and pinned.
            " COLLATE \"C\") , 'UTF8'))"
        )
    };
}
pub(crate) use lease_digest;

/// The digest [`lease_digest!`] computes in SQL, of `ids` distinct and in byte order.
pub(crate) fn digest<'a>(ids: impl IntoIterator<Item = &'a str>) -> Vec<u8> {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for id in ids {
        h.update(id.len().to_string().as_bytes());
        h.update(b":");
        h.update(id.as_bytes());
    }
    h.finalize().to_vec()
}

/// `INSERT INTO comb.cursor_states (…)` for a cursor's first version: its position and its
/// lease bound given, every other column the table's default (no lease, nothing settled).
/// The `SELECT` that follows gives partition, group, generation, version, position, lease
/// bound.
macro_rules! insert_first_state {
    () => {
        "INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, lease_upto)"
    };
}
pub(crate) use insert_first_state;

/// The generation a new state version goes into: the newest, read inside the writing
/// statement itself, so a statement never writes into a generation maintenance has left.
macro_rules! newest_gen {
    () => {
        "(SELECT max(gen) FROM comb.cursor_gens)"
    };
}
pub(crate) use newest_gen;

/// A statement that appends a full state version by `INSERT … SELECT` ([`insert_state!`]),
/// cut for a PL/pgSQL function run on a partition's worker. Run there as one statement,
/// Citus plans the `INSERT … SELECT` in steps whose results it sends to every node, and the
/// worker commits them in two phases; as a read into variables, then an insert of their
/// values, each statement is a router statement of the worker's own shards.
pub(crate) struct StateByValues {
    /// Declarations of the variables: `{prefix}_<column>` and `{prefix}_newest_gen`.
    pub declare: String,
    /// The column variables, in the insert's order, for an `INTO` or a `FOR … IN`.
    pub vars: String,
    /// Reads the newest generation into its variable (a reference table, read apart).
    pub newest_gen: String,
    /// The insert's `SELECT`, as given: its statement written with the newest generation
    /// taken from its variable (`{prefix}_newest_gen`), a fragment in place of
    /// [`newest_gen!`].
    pub select: String,
    /// The insert of the variables.
    pub insert: String,
}

impl StateByValues {
    /// The pieces for the insert of the new state by the variables of `prefix`, `select`
    /// being the insert's `SELECT` written with `{prefix}_newest_gen` for its generation.
    pub(crate) fn of(select: &str, prefix: &str) -> StateByValues {
        StateByValues::inserted_by(insert_state!(), select, prefix)
    }

    /// [`StateByValues::of`] for a claim's state, with its lease's digest
    /// ([`insert_leased_state!`]).
    pub(crate) fn of_lease(select: &str, prefix: &str) -> StateByValues {
        StateByValues::inserted_by(insert_leased_state!(), select, prefix)
    }

    fn inserted_by(head: &str, select: &str, prefix: &str) -> StateByValues {
        let columns: Vec<&str> = head
            [head.find('(').expect("columns") + 1..head.rfind(')').expect("columns")]
            .split(',')
            .map(str::trim)
            .collect();
        let mut declare: String = columns
            .iter()
            .map(|c| format!("    {prefix}_{c} {};\n", column_type(c)))
            .collect();
        declare.push_str(&format!(
            "    {prefix}_newest_gen {};\n",
            column_type("gen")
        ));
        debug_assert!(select.contains(&format!("{prefix}_newest_gen")), "{select}");
        let vars: Vec<String> = columns.iter().map(|c| format!("{prefix}_{c}")).collect();
        let vars = vars.join(", ");
        StateByValues {
            declare,
            newest_gen: format!("SELECT {} INTO {prefix}_newest_gen", newest_gen!()),
            select: select.to_string(),
            insert: format!("{head}\nVALUES ({vars})"),
            vars,
        }
    }
}

/// The latest state version of the cursor (`$p`, `$g`), two SQL expressions: a call of
/// `comb.cursor_state`, a set of one row (none for a cursor without state), for statements
/// that read it beside other tables (`CROSS JOIN LATERAL state_of!(…) s`).
macro_rules! state_of {
    ($p:literal, $g:literal) => {
        concat!("comb.cursor_state(", $p, ", ", $g, ")")
    };
}
pub(crate) use state_of;

/// How far the cursor (`$p`, `$g`) (SQL expressions) is behind its partition: a call of
/// `comb.cursor_lag`, one row (none for a cursor without state) of its position, the
/// partition's head, the messages between them not settled yet (`lag`), the oldest one's
/// time, and its live lease and last claim.
macro_rules! lag_of {
    ($p:literal, $g:literal) => {
        concat!("comb.cursor_lag(", $p, ", ", $g, ")")
    };
}
pub(crate) use lag_of;

/// `INSERT INTO comb.cursors (…)`: a cursor's identity row; the `SELECT` that follows gives
/// partition, group and queue. Cursors are made with their partition or their group's
/// subscription, each with its first state version ([`insert_first_state!`]).
macro_rules! insert_cursor {
    () => {
        "INSERT INTO comb.cursors (partition_id, consumer_group, queue_id)"
    };
}
pub(crate) use insert_cursor;

/// The lowest position of the cursors of partition `$p` (an SQL expression), NULL while no
/// group reads it: where the partition's slowest group stands.
macro_rules! slowest_position {
    ($p:literal) => {
        concat!(
            "(SELECT min(s.cursor_pos) FROM comb.cursors c
                     CROSS JOIN LATERAL comb.cursor_state(c.partition_id, c.consumer_group) s
                     WHERE c.partition_id = ",
            $p,
            ")"
        )
    };
}
pub(crate) use slowest_position;

/// The cursors of queue `$q` (an SQL expression), a `SELECT` of their partition and group
/// (`partition_id`, `consumer_group`): one read of the queue's cursors, for statements that
/// read it apart (on Citus into an intermediate result) and then each cursor's state.
macro_rules! cursors_of_queue {
    ($q:literal) => {
        concat!(
            "SELECT c.partition_id, c.consumer_group FROM comb.cursors c WHERE c.queue_id = ",
            $q
        )
    };
}
pub(crate) use cursors_of_queue;

/// The queue of the statement's cursor `u` (`u.partition_id`, `u.consumer_group`) as `c`:
/// one probe of the cursor's key (`LIMIT` keeps the subquery from becoming a join the
/// planner could answer by reading every cursor of the queue). No row: no such cursor.
macro_rules! queue_of_cursor {
    () => {
        $crate::cursor::queue_of_cursor!(one "")
    };
    (one $one:literal) => {
        concat!(
            "CROSS JOIN LATERAL (
    SELECT c.queue_id FROM comb.cursors c
    WHERE c.partition_id = u.partition_id AND c.consumer_group = u.consumer_group",
            $one,
            "
    LIMIT 1
) c"
        )
    };
}
pub(crate) use queue_of_cursor;

// Fragments of the claim.

/// The cursors' identity rows as `c` (partition, group, queue), for the claim's walk over a
/// group's cursors and for its row locks: the claim locks `c` (`FOR NO KEY UPDATE OF c`), never
/// a state version, so that appending versions never waits on a reader.
macro_rules! cursors {
    () => {
        "comb.cursors c"
    };
}
pub(crate) use cursors;

/// Every cursor `c` with its latest state `s`, the `FROM` of statements that pick cursors
/// by their state; on Citus (`citus`) the state is read as [`latest_state`], which runs on
/// each worker correlated by partition.
pub(crate) fn cursors_with_state(citus: bool) -> String {
    let state = if citus {
        latest_state("c.partition_id", "c.consumer_group", None)
    } else {
        state_of!("c.partition_id", "c.consumer_group").to_string()
    };
    format!("comb.cursors c\nCROSS JOIN LATERAL {state} s")
}

/// Whether partition `partition` (an SQL expression) is read by some group and every group
/// stands at or past position `pos` (an SQL condition): its messages up to `pos` are settled
/// for all. On Citus (`citus`) the state is read as [`latest_state`].
pub(crate) fn all_passed(partition: &str, pos: &str, citus: bool) -> String {
    let state = if citus {
        latest_state("c.partition_id", "c.consumer_group", None)
    } else {
        state_of!("c.partition_id", "c.consumer_group").to_string()
    };
    format!(
        "EXISTS (SELECT 1 FROM comb.cursors c WHERE c.partition_id = {partition})
             AND NOT EXISTS (
                 SELECT 1 FROM comb.cursors c
                 LEFT JOIN LATERAL {state} st ON true
                 WHERE c.partition_id = {partition}
                   AND coalesce(st.cursor_pos, 0) < {pos})"
    )
}

/// The lock of the cursor (`$p` partition, `$g` group: SQL expressions) without its leading
/// `SELECT`: [`LOCK_ONE_SQL`], and in PL/pgSQL `PERFORM lock_one!(…)` for a writer of one
/// cursor's next version (`… SKIP LOCKED` for one that must not wait).
macro_rules! lock_one {
    ($p:literal, $g:literal) => {
        concat!(
            "1 FROM comb.cursors WHERE partition_id = ",
            $p,
            " AND consumer_group = ",
            $g,
            "\nFOR NO KEY UPDATE"
        )
    };
}
pub(crate) use lock_one;

/// Locks the cursor of (`$1` partition, `$2` group), the one cursor a writer of a single
/// state version holds (lease extension); no row: no such cursor.
pub(crate) const LOCK_ONE_SQL: &str = concat!("\nSELECT ", lock_one!("$1", "$2"));

/// Like [`LOCK_SQL`] for the cursors of group `$2` on partitions `$1` whose lease ended
/// unsettled, skipping busy ones (another claim or ack holds them; they are seen again
/// later). Their state is read afterwards with [`state_sql!`].
pub(crate) const LOCK_EXPIRED_SQL: &str = "
SELECT c.partition_id FROM comb.cursors c
CROSS JOIN LATERAL comb.cursor_state(c.partition_id, c.consumer_group) s
WHERE c.partition_id = ANY($1) AND c.consumer_group = $2
  AND s.lease_id IS NOT NULL AND s.lease_expires_at <= now()
ORDER BY c.partition_id
FOR NO KEY UPDATE OF c SKIP LOCKED";

/// Deletes the cursors of a deleted queue (their state versions stay until their
/// generation is dropped whole); returns how many.
pub(crate) async fn delete_of_queue<C: GenericClient>(
    tx: &C,
    queue_id: Uuid,
) -> Result<u64, tokio_postgres::Error> {
    tx.execute("DELETE FROM comb.cursors WHERE queue_id = $1", &[&queue_id])
        .await
}

/// The state of one (partition, group) cursor, as the ack rules see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cursor {
    pub(crate) cursor_pos: i64,
    pub(crate) cursor_seg: i32,
    /// Settled positions above `cursor_pos`, sorted.
    pub(crate) settled: Vec<i64>,
    /// (position, failed attempts) above `cursor_pos`, sorted by position.
    pub(crate) attempts: Vec<(i64, i32)>,
    pub(crate) lease_id: Option<Uuid>,
    /// The lease has not expired.
    pub(crate) lease_live: bool,
    /// The lease acks of this request are judged against: the live lease as the request found
    /// it. A failure in the middle of a batch ends the lease for later requests, not for the
    /// rest of its own batch.
    pub(crate) request_lease: Option<Uuid>,
    pub(crate) lease_upto: i64,
    /// Set when a failure asks for the partition to rest this many milliseconds.
    pub(crate) rest_ms: Option<u64>,
}

/// A cursor locked for update, with what the rules need to know about its queue.
pub(crate) struct Locked {
    pub(crate) cursor: Cursor,
    pub(crate) queue_id: Uuid,
    pub(crate) options: QueueOptions,
    pub(crate) changed: bool,
}

/// Locks cursor rows in a stable order (acks of one batch never deadlock with another's).
/// The rows only serialise writers; the state is read by a later statement ([`state_sql!`]),
/// whose snapshot then holds every version written before the lock was granted.
pub const LOCK_SQL: &str = "
SELECT c.partition_id FROM comb.cursors c
WHERE (c.partition_id, c.consumer_group) IN (SELECT * FROM unnest($1::uuid[], $2::text[]))
ORDER BY c.partition_id, c.consumer_group
FOR NO KEY UPDATE OF c";

/// Locks the cursors of (`$1` partitions, `$2` groups, pairwise) that no other transaction
/// holds, in the same order as [`LOCK_SQL`], skipping the others: for a writer that must never
/// wait on a cursor (a push handing its messages to a waiting pop, which holds partition locks
/// and would otherwise wait behind a claim, or deadlock with a transaction that acks, then
/// pushes). The state is read by a later statement, as after [`LOCK_SQL`].
pub(crate) const LOCK_FREE_SQL: &str = "
SELECT c.partition_id, c.consumer_group FROM comb.cursors c
WHERE (c.partition_id, c.consumer_group) IN (SELECT * FROM unnest($1::uuid[], $2::text[]))
ORDER BY c.partition_id, c.consumer_group
FOR NO KEY UPDATE OF c SKIP LOCKED";

/// The cursor lock: [`LOCK_SQL`], and on Citus, which locks rows only in a statement of one
/// shard, the coordinator locking each cursor with one of its own (`comb.lock_cursors`), in
/// the same order.
pub(crate) const LOCK: Forms = Forms {
    postgres: LOCK_SQL,
    citus: "SELECT * FROM comb.lock_cursors($1, $2)",
};

/// The columns [`locked_cursors`] reads, of a cursor's state `s` and its queue `q`, shared
/// by the statements that read locked cursors.
macro_rules! locked_columns {
    () => {
        "
SELECT s.partition_id, s.consumer_group, s.cursor_pos, s.cursor_seg, s.settled,
       s.attempt_pos, s.attempt_cnt, s.lease_id,
       coalesce(s.lease_expires_at > now(), false) AS lease_live, s.lease_upto,
       q.options, q.id AS queue_id"
    };
}
pub(crate) use locked_columns;

/// The latest state of locked cursors (`$1` partitions and `$2` groups, pairwise) with their
/// queue, in the columns [`locked_cursors`] reads. The tokens given join the cursor `c`'s
/// queue as `q`: the queue's owner joins it (`catalog::join_queue!`) and holds the statement
/// (`catalog::CURSOR_STATE_SQL`), as this module sits below it.
macro_rules! state_sql {
    (citus; $($queue:tt)*) => {
        concat!(
            $crate::cursor::locked_columns!(),
            "
FROM (SELECT DISTINCT * FROM unnest($1::uuid[], $2::text[])) AS u(partition_id, consumer_group)
JOIN comb.cursors c
  ON c.partition_id = u.partition_id AND c.consumer_group = u.consumer_group
     AND c.partition_id = $3
",
            $($queue)*,
            "
CROSS JOIN LATERAL ",
            $crate::cursor::state_in_partition!("u.partition_id", "u.consumer_group", one "$3"),
            " s"
        )
    };
    ($($queue:tt)*) => {
        concat!(
            $crate::cursor::locked_columns!(),
            "
FROM (SELECT DISTINCT * FROM unnest($1::uuid[], $2::text[])) AS u(partition_id, consumer_group)
JOIN comb.cursors c
  ON c.partition_id = u.partition_id AND c.consumer_group = u.consumer_group
",
            $($queue)*,
            "
CROSS JOIN LATERAL comb.cursor_state(u.partition_id, u.consumer_group) s"
        )
    };
}
pub(crate) use state_sql;

/// [`latest_state`] composed at compile time: of the cursor (`$partition`, `$group`), SQL
/// expressions, with `one $one` in the partition named by that parameter (a router
/// statement).
macro_rules! state_in_partition {
    ($partition:literal, $group:literal) => {
        concat!(
            "(SELECT * FROM comb.cursor_states s
          WHERE s.partition_id = ",
            $partition,
            "
            AND s.consumer_group = ",
            $group,
            "
          ORDER BY s.gen DESC, s.ver DESC LIMIT 1)"
        )
    };
    ($partition:literal, $group:literal, one $one:literal) => {
        concat!(
            "(SELECT * FROM comb.cursor_states s
          WHERE s.partition_id = ",
            $partition,
            " AND s.partition_id = ",
            $one,
            "
            AND s.consumer_group = ",
            $group,
            "
          ORDER BY s.gen DESC, s.ver DESC LIMIT 1)"
        )
    };
}
pub(crate) use state_in_partition;

/// The latest state of the cursor of (`partition`, `group`), two SQL expressions, written out
/// as a subquery for Citus: `comb.cursor_state`, run on a worker, would itself be a
/// distributed query from a shard, which Citus refuses, and Citus pushes no function but an
/// immutable one down to the workers. `one`, the parameter naming the statement's one
/// partition, makes it a router statement on that partition's worker; without it the
/// statement runs on every worker, each subquery correlated by partition.
pub(crate) fn latest_state(partition: &str, group: &str, one: Option<&str>) -> String {
    let one = one.map_or(String::new(), |p| format!(" AND s.partition_id = {p}"));
    latest_state_in(STATES, &format!("{partition}{one}"), group)
}

/// [`latest_state`] read from the table `states`: [`STATES`], or one of its shards on a
/// Citus worker (a quoted name the coordinator's catalog gave).
pub(crate) fn latest_state_in(states: &str, partition: &str, group: &str) -> String {
    format!(
        "(SELECT * FROM {states} s
          WHERE s.partition_id = {partition}
            AND s.consumer_group = {group}
          ORDER BY s.gen DESC, s.ver DESC LIMIT 1)"
    )
}

/// The cursors' identity table, for statements that must name one of its shards.
pub(crate) const CURSORS: &str = "comb.cursors";

/// The cursors' state versions, for statements that must name one of its shards.
pub(crate) const STATES: &str = "comb.cursor_states";

/// Cursors as read by [`state_sql!`].
pub(crate) fn locked_cursors(rows: &[tokio_postgres::Row]) -> HashMap<(Uuid, String), Locked> {
    let mut cursors = HashMap::new();
    for r in rows {
        let attempt_pos: Vec<i64> = r.get("attempt_pos");
        let attempt_cnt: Vec<i32> = r.get("attempt_cnt");
        let options: serde_json::Value = r.get("options");
        let set = serde_json::from_value(options).unwrap_or_default();
        cursors.insert(
            (r.get("partition_id"), r.get("consumer_group")),
            Locked {
                cursor: Cursor {
                    cursor_pos: r.get("cursor_pos"),
                    cursor_seg: r.get("cursor_seg"),
                    settled: r.get("settled"),
                    attempts: attempt_pos.into_iter().zip(attempt_cnt).collect(),
                    lease_id: r.get("lease_id"),
                    lease_live: r.get("lease_live"),
                    request_lease: None,
                    lease_upto: r.get("lease_upto"),
                    rest_ms: None,
                },
                options: QueueOptions::from_set(&set),
                queue_id: r.get("queue_id"),
                changed: false,
            },
        );
    }
    cursors
}

/// Appends the next version of changed cursors, the state read from `$state`. What the rules
/// do not decide (lease expiry, last claim) is carried over from the version it follows.
macro_rules! write_sql {
    ($($state:tt)*) => { concat!(
    "\n",
    insert_state!(),
    "
SELECT u.partition_id, u.consumer_group, ",
    newest_gen!(),
    ", s.ver + 1,
       u.cursor_pos, u.cursor_seg, u.settled::bigint[], u.attempt_pos::bigint[],
       u.attempt_cnt::integer[], u.lease_id,
       CASE WHEN u.lease_id IS NULL THEN NULL ELSE s.lease_expires_at END,
       s.lease_upto,
       CASE WHEN u.rest_ms IS NULL THEN s.available_at
           ELSE now() + make_interval(secs => u.rest_ms / 1000.0) END,
       s.last_claimed_at
FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::integer[], $5::text[], $6::text[],
            $7::text[], $8::uuid[], $9::bigint[])
    AS u(partition_id, consumer_group, cursor_pos, cursor_seg, settled, attempt_pos,
         attempt_cnt, lease_id, rest_ms)
CROSS JOIN LATERAL ",
    $($state)*,
    " s"
    ) };
}

/// Appends the next version of changed cursors; on Citus, of cursors all of one partition
/// (`$10`), their state read by a subquery of that partition ([`latest_state!`]).
const WRITE: Forms = Forms {
    postgres: write_sql!("comb.cursor_state(u.partition_id, u.consumer_group)"),
    citus: write_sql!(state_in_partition!("u.partition_id", "u.consumer_group", one "$10")),
};

/// The prepared statement that appends the next version of changed cursors.
pub(crate) struct StateWrites {
    write: Statement,
    backend: Backend,
}

impl StateWrites {
    pub(crate) async fn prepare<C: GenericClient>(
        client: &C,
        backend: Backend,
    ) -> Result<StateWrites, DbError> {
        Ok(StateWrites {
            write: client.prepare_cached(backend.sql(&WRITE)).await?,
            backend,
        })
    }

    /// Appends the next version of each changed cursor (none changed: nothing is sent). The
    /// cursors must have been locked in this transaction; no statement is prepared on the
    /// way, so whatever the caller pipelines with it follows it. On Citus, one statement per
    /// partition, each a router statement on its worker.
    pub(crate) async fn write<C: crate::db::Prepared>(
        &self,
        tx: &C,
        cursors: &HashMap<(Uuid, String), Locked>,
    ) -> Result<(), DbError> {
        let changed: Vec<(&(Uuid, String), &Locked)> =
            cursors.iter().filter(|(_, l)| l.changed).collect();
        if changed.is_empty() {
            return Ok(());
        }
        if self.backend.statements_span_partitions() {
            return self.write_one(tx, &changed, None).await;
        }
        for (partition, ks) in crate::schema::citus::by_partition(&changed, |c| c.0.0) {
            let mine: Vec<(&(Uuid, String), &Locked)> = ks.iter().map(|&k| changed[k]).collect();
            self.write_one(tx, &mine, self.backend.one_partition(partition))
                .await?;
        }
        Ok(())
    }

    /// [`StateWrites::write`] of changed cursors, all of `one` partition on Citus (`None`:
    /// any, on PostgreSQL).
    async fn write_one<C: crate::db::Prepared>(
        &self,
        tx: &C,
        changed: &[(&(Uuid, String), &Locked)],
        one: Option<Uuid>,
    ) -> Result<(), DbError> {
        let u_pid: Vec<Uuid> = changed.iter().map(|(k, _)| k.0).collect();
        let u_group: Vec<&str> = changed.iter().map(|(k, _)| k.1.as_str()).collect();
        let u_pos: Vec<i64> = changed.iter().map(|(_, l)| l.cursor.cursor_pos).collect();
        let u_seg: Vec<i32> = changed.iter().map(|(_, l)| l.cursor.cursor_seg).collect();
        let u_settled: Vec<String> = changed
            .iter()
            .map(|(_, l)| array_literal(l.cursor.settled.iter()))
            .collect();
        let u_apos: Vec<String> = changed
            .iter()
            .map(|(_, l)| array_literal(l.cursor.attempts.iter().map(|a| &a.0)))
            .collect();
        let u_acnt: Vec<String> = changed
            .iter()
            .map(|(_, l)| array_literal(l.cursor.attempts.iter().map(|a| &a.1)))
            .collect();
        let u_lease: Vec<Option<Uuid>> = changed.iter().map(|(_, l)| l.cursor.lease_id).collect();
        let u_rest: Vec<Option<i64>> = changed
            .iter()
            .map(|(_, l)| l.cursor.rest_ms.map(|m| m as i64))
            .collect();
        let params = crate::schema::citus::with_partition(
            &[
                &u_pid, &u_group, &u_pos, &u_seg, &u_settled, &u_apos, &u_acnt, &u_lease, &u_rest,
            ],
            &one,
        );
        tx.execute(&self.write, &params).await?;
        Ok(())
    }
}

/// A PostgreSQL array literal such as `{1,2,3}`.
fn array_literal<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
    let mut s = String::from("{");
    for (i, v) in items.enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&v.to_string());
    }
    s.push('}');
    s
}

/// The (partition, group) pairs any state version of which holds lease `$1`, each once: a
/// subquery for statements that find a lease's cursors.
macro_rules! lease_holders {
    () => {
        "SELECT DISTINCT partition_id, consumer_group FROM comb.cursor_states WHERE lease_id = $1"
    };
}
pub(crate) use lease_holders;

/// The statements of the state generations' lifecycle, which `maintenance::generations`
/// runs (when, and under which lock timeout, is its choice).
pub(crate) mod generations {
    /// The table of one generation.
    pub(crate) fn table(generation: i32) -> String {
        format!("comb.cursor_states_{generation}")
    }

    /// Every generation, oldest first, with the age of each in seconds.
    pub(crate) const LIST_SQL: &str =
        "SELECT gen, extract(epoch FROM now() - created_at)::float8 AS age
             FROM comb.cursor_gens ORDER BY gen";

    /// Sends writers to generation `$1`: they read the newest inside their own statements.
    pub(crate) const START_SQL: &str =
        "INSERT INTO comb.cursor_gens (gen) VALUES ($1) ON CONFLICT DO NOTHING";

    /// The whole state table locked in the mode a generation's `DROP` needs (every generation
    /// with it): the first lock of a generation's drop on Citus (`maintenance::generations`).
    pub(crate) const LOCK_ALL_SQL: &str = "LOCK TABLE comb.cursor_states IN ACCESS EXCLUSIVE MODE";

    /// Every column of the state, quoted, in order.
    pub(crate) const COLUMNS_SQL: &str = "SELECT quote_ident(attname) FROM pg_attribute
             WHERE attrelid = 'comb.cursor_states'::regclass AND attnum > 0 AND NOT attisdropped
             ORDER BY attnum";

    /// Makes generation `next`'s table and attaches it, with `n_distinct` partitions assumed.
    /// Built standalone and then attached: ATTACH takes only SHARE UPDATE EXCLUSIVE on the
    /// parent, which neither readers nor writers conflict with, where CREATE … PARTITION OF
    /// would queue an ACCESS EXCLUSIVE lock in front of all traffic. The indexes match the
    /// parent's, so ATTACH adopts them instead of building its own; the CHECK constraint
    /// spares it a validation scan.
    pub(crate) fn make_sql(next: i32, n_distinct: u32) -> String {
        let t = table(next);
        let end = next + 1;
        format!(
            "CREATE TABLE {t} (LIKE comb.cursor_states INCLUDING DEFAULTS INCLUDING STORAGE);
         CREATE INDEX ON {t} (partition_id, consumer_group, gen, ver);
         CREATE INDEX ON {t} (lease_id) WHERE lease_id IS NOT NULL;
         ALTER TABLE {t} ALTER COLUMN partition_id SET (n_distinct = {n_distinct});
         ALTER TABLE {t} ADD CONSTRAINT cursor_states_{next}_gen
             CHECK (gen >= {next} AND gen < {end});
         ALTER TABLE comb.cursor_states ATTACH PARTITION {t} FOR VALUES FROM ({next}) TO ({end});"
        )
    }

    /// Locks generation `old`, copies the latest version of each cursor still living there
    /// into generation `newest` (`columns` of [`COLUMNS_SQL`]), drops its table and forgets
    /// it: four statements, the copy second.
    ///
    /// SHARE waits for any writer still inserting into the old generation (its statement
    /// chose it just before the newest took over) and keeps new ones out; readers go on.
    /// The copy starts from the cursors that exist, so states of deleted queues stay
    /// behind, and skips cursors that already have this version or a later one in a newer
    /// generation. (`gen >= n + 1` rather than `gen > n`: only the former prunes `n`.)
    /// The latest version is ordered by (gen, ver), as the index is: by `ver` alone the
    /// planner would read and sort every version of the cursor.
    pub(crate) fn carry_forward_sql(old: i32, newest: i32, columns: &[String]) -> String {
        let t = table(old);
        let values: Vec<String> = columns
            .iter()
            .map(|c| {
                if c == "gen" {
                    newest.to_string()
                } else {
                    format!("s.{c}")
                }
            })
            .collect();
        format!(
            "LOCK TABLE {t} IN SHARE MODE;
             INSERT INTO {into} ({columns})
             SELECT {values}
             FROM comb.cursors c
             CROSS JOIN LATERAL (
                 SELECT * FROM {t} s
                 WHERE s.partition_id = c.partition_id AND s.consumer_group = c.consumer_group
                 ORDER BY s.gen DESC, s.ver DESC LIMIT 1
             ) s
             WHERE NOT EXISTS (
                 SELECT 1 FROM comb.cursor_states n
                 WHERE n.gen >= {newer}
                   AND n.partition_id = s.partition_id
                   AND n.consumer_group = s.consumer_group
                   AND n.ver >= s.ver);
             DROP TABLE {t};
             DELETE FROM comb.cursor_gens WHERE gen = {old};",
            into = table(newest),
            columns = columns.join(", "),
            values = values.join(", "),
            newer = old + 1,
        )
    }
}

// Reads and changes for the administration.

/// Deletes a group's cursors of a queue (when the group stops reading it); answers how many.
/// The rows are locked first, in partition order, as every writer of cursors locks them.
pub(crate) async fn delete_group_cursors(
    client: &impl tokio_postgres::GenericClient,
    queue_id: Uuid,
    group: &str,
) -> Result<u64, DbError> {
    client
        .query(
            "SELECT 1 FROM comb.cursors WHERE queue_id = $1 AND consumer_group = $2
             ORDER BY partition_id FOR UPDATE",
            &[&queue_id, &group],
        )
        .await?;
    Ok(client
        .execute(
            "DELETE FROM comb.cursors WHERE queue_id = $1 AND consumer_group = $2",
            &[&queue_id, &group],
        )
        .await?)
}

/// The (partition, group) of every cursor of the given partitions, by partition and group.
pub(crate) async fn cursors_of_partitions(
    client: &impl tokio_postgres::GenericClient,
    partitions: &[Uuid],
) -> Result<Vec<(Uuid, String)>, DbError> {
    Ok(client
        .query(
            "SELECT partition_id, consumer_group FROM comb.cursors
             WHERE partition_id = ANY ($1) ORDER BY partition_id, consumer_group",
            &[&partitions],
        )
        .await?
        .iter()
        .map(|r| (r.get("partition_id"), r.get("consumer_group")))
        .collect())
}

// Messages, for the administration.

/// Where one group's cursor of a partition stands with respect to one message.
#[derive(Debug, Clone)]
pub(crate) struct GroupAtMessage {
    pub group: String,
    /// The cursor passed the message or settled it.
    pub settled: bool,
    /// A live lease handed the message out.
    pub leased: bool,
    /// Deliveries of the message to the group so far.
    pub attempts: i32,
}

/// Every group reading the partition, by name, with where it stands on the message at `pos`.
pub(crate) async fn groups_at_message(
    client: &impl tokio_postgres::GenericClient,
    partition: Uuid,
    pos: i64,
) -> Result<Vec<GroupAtMessage>, DbError> {
    Ok(client
        .query(
            "SELECT c.consumer_group,
                    ($2 <= coalesce(s.cursor_pos, 0) OR $2 = ANY (s.settled)) AS settled,
                    coalesce(s.lease_expires_at > now() AND $2 <= s.lease_upto, false) AS leased,
                    coalesce((SELECT n FROM unnest(s.attempt_pos, s.attempt_cnt) AS a(pos, n)
                              WHERE a.pos = $2), 0) AS attempts
             FROM comb.cursors c
             CROSS JOIN LATERAL comb.cursor_state(c.partition_id, c.consumer_group) s
             WHERE c.partition_id = $1
             ORDER BY c.consumer_group",
            &[&partition, &pos],
        )
        .await?
        .iter()
        .map(|r| GroupAtMessage {
            group: r.get("consumer_group"),
            settled: r.get::<_, Option<bool>>("settled").unwrap_or(false),
            leased: r.get("leased"),
            attempts: r.get("attempts"),
        })
        .collect())
}

/// Locks every cursor of the partitions `partitions` in (partition, group) order, like every
/// writer of cursors: what a requeue of dead letters holds before it stores into them.
pub(crate) async fn lock_of_partitions<C: GenericClient>(
    tx: &C,
    partitions: &[Uuid],
) -> Result<(), tokio_postgres::Error> {
    tx.query(
        "SELECT 1 FROM comb.cursors WHERE partition_id = ANY ($1)
         ORDER BY partition_id, consumer_group FOR NO KEY UPDATE",
        &[&partitions],
    )
    .await?;
    Ok(())
}

// Moves, for the administration: clearing a queue, seeking a group, editing the cursors of a
// partition. A move is a new state version written under the cursor's row lock, like every
// other cursor change: position set, settled and attempt sets emptied, any lease ended (its
// acks then answer as stale). Nothing is deleted; what a move skips stays in message storage
// until maintenance drops its segment.

/// Where a move puts cursors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// After the partition's newest message: everything there now is passed.
    End,
    /// Before the first message: everything retained is delivered again.
    Start,
    /// Before the first message pushed at or after this time.
    Time(DateTime<Utc>),
}

/// Which cursors of a queue a move takes.
#[derive(Debug, Clone, Copy)]
pub struct Selection<'a> {
    pub queue_id: Uuid,
    /// One group, or every group of the queue.
    pub group: Option<&'a str>,
    /// One partition, or every partition of the queue.
    pub partition: Option<Uuid>,
    /// Only cursors behind the target move (a later subscription start never moves a group
    /// back).
    pub forward_only: bool,
}

/// What a move did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moved {
    /// Cursors given a new position.
    pub cursors: u64,
    /// Unsettled messages before the move, summed over the cursors moved.
    pub unsettled_before: i64,
    /// Unsettled messages after it.
    pub unsettled_after: i64,
}

/// The cursors of the selection, locked in (partition, group) order like every writer of
/// cursors.
const MOVE_LOCK_SQL: &str = "
SELECT c.partition_id FROM comb.cursors c
WHERE c.queue_id = $1 AND ($2::text IS NULL OR c.consumer_group = $2)
  AND ($3::uuid IS NULL OR c.partition_id = $3)
ORDER BY c.partition_id, c.consumer_group
FOR NO KEY UPDATE";

/// The next version of each selected cursor at its target position, written from its
/// latest version (read after the lock). Moving back lowers the segment bound to 0, which
/// only costs the next read a look at older segments.
const MOVE_SQL: &str = concat!(
    "
WITH plan AS (
    SELECT c.partition_id, c.consumer_group, s.ver, s.cursor_pos, s.cursor_seg,
           cardinality(s.settled) AS settled, s.last_claimed_at, h.pos AS head, t.pos
    FROM comb.cursors c
    CROSS JOIN LATERAL comb.cursor_state(c.partition_id, c.consumer_group) s
    CROSS JOIN LATERAL ",
    crate::messages::head_of!("c.partition_id"),
    " h
    CROSS JOIN LATERAL (
        SELECT CASE $4::text
            WHEN 'end' THEN h.pos
            WHEN 'start' THEN 0::bigint
            ELSE ",
    crate::messages::position_before!("c.partition_id", "$5"),
    "
        END AS pos
    ) t
    WHERE c.queue_id = $1 AND ($2::text IS NULL OR c.consumer_group = $2)
      AND ($3::uuid IS NULL OR c.partition_id = $3)
), moved AS (
    ",
    insert_state!(),
    "
    SELECT p.partition_id, p.consumer_group, ",
    newest_gen!(),
    ", p.ver + 1,
           p.pos, CASE WHEN p.pos >= p.cursor_pos THEN p.cursor_seg ELSE 0 END,
           '{}', '{}', '{}', NULL, NULL, p.pos, '-infinity', p.last_claimed_at
    FROM plan p
    WHERE NOT $6 OR p.pos > p.cursor_pos
    RETURNING 1
)
SELECT (SELECT count(*) FROM moved) AS moved,
       coalesce(sum(greatest(head - cursor_pos - settled, 0)), 0)::bigint AS before,
       coalesce(sum(greatest(head - CASE WHEN $6 THEN greatest(pos, cursor_pos) ELSE pos END, 0)), 0)::bigint
           AS after
FROM plan"
);

/// Moves the selected cursors to `target`, inside the caller's transaction.
pub async fn move_in(
    tx: &deadpool_postgres::Transaction<'_>,
    selection: Selection<'_>,
    target: Target,
) -> Result<Moved, tokio_postgres::Error> {
    let (kind, at): (&str, Option<DateTime<Utc>>) = match target {
        Target::End => ("end", None),
        Target::Start => ("start", None),
        Target::Time(t) => ("time", Some(t)),
    };
    let Selection {
        queue_id,
        group,
        partition,
        forward_only,
    } = selection;
    tx.query(MOVE_LOCK_SQL, &[&queue_id, &group, &partition])
        .await?;
    let row = tx
        .query_one(
            MOVE_SQL,
            &[&queue_id, &group, &partition, &kind, &at, &forward_only],
        )
        .await?;
    Ok(Moved {
        cursors: row.get::<_, i64>("moved") as u64,
        unsettled_before: row.get("before"),
        unsettled_after: row.get("after"),
    })
}

/// Locks the cursors of one partition (one group, or all), in group order.
const LOCK_PARTITION_SQL: &str = "
SELECT c.consumer_group FROM comb.cursors c
WHERE c.partition_id = $1 AND ($2::text IS NULL OR c.consumer_group = $2)
ORDER BY c.consumer_group
FOR NO KEY UPDATE";

/// The latest state of the cursors locked by [`LOCK_PARTITION_SQL`], read after the lock.
const PARTITION_STATE_SQL: &str = "
SELECT c.consumer_group, s.cursor_pos, s.cursor_seg, s.settled, s.attempt_pos, s.attempt_cnt,
       s.lease_id, coalesce(s.lease_expires_at > now(), false) AS lease_live, s.lease_upto
FROM comb.cursors c CROSS JOIN LATERAL comb.cursor_state(c.partition_id, c.consumer_group) s
WHERE c.partition_id = $1 AND ($2::text IS NULL OR c.consumer_group = $2)";

/// Appends the next version of changed cursors of one partition; what the edit does not
/// decide (lease end, last claim) is carried over, and `available_at` is reset when asked.
const EDIT_SQL: &str = concat!(
    "\n",
    insert_state!(),
    "
SELECT $1, u.consumer_group, ",
    newest_gen!(),
    ", s.ver + 1,
       u.cursor_pos, u.cursor_seg, u.settled::bigint[], u.attempt_pos::bigint[],
       u.attempt_cnt::integer[], s.lease_id, s.lease_expires_at, s.lease_upto,
       CASE WHEN $8 THEN '-infinity' ELSE s.available_at END, s.last_claimed_at
FROM unnest($2::text[], $3::bigint[], $4::integer[], $5::text[], $6::text[], $7::text[])
    AS u(consumer_group, cursor_pos, cursor_seg, settled, attempt_pos, attempt_cnt)
CROSS JOIN LATERAL comb.cursor_state($1, u.consumer_group) s"
);

/// Edits the cursors of one partition (one group, or every group) inside the caller's
/// transaction: `edit` changes a cursor as the ack rules see it and says whether it did.
/// Returns the groups whose cursor changed.
pub async fn edit_in(
    tx: &deadpool_postgres::Transaction<'_>,
    partition: Uuid,
    group: Option<&str>,
    reset_rest: bool,
    mut edit: impl FnMut(&str, &mut Cursor) -> bool,
) -> Result<Vec<String>, tokio_postgres::Error> {
    tx.query(LOCK_PARTITION_SQL, &[&partition, &group]).await?;
    let rows = tx.query(PARTITION_STATE_SQL, &[&partition, &group]).await?;
    let mut groups = Vec::new();
    let (mut pos, mut seg, mut settled, mut apos, mut acnt) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in rows {
        let name: String = r.get("consumer_group");
        let attempt_pos: Vec<i64> = r.get("attempt_pos");
        let attempt_cnt: Vec<i32> = r.get("attempt_cnt");
        let mut cursor = Cursor {
            cursor_pos: r.get("cursor_pos"),
            cursor_seg: r.get("cursor_seg"),
            settled: r.get("settled"),
            attempts: attempt_pos.into_iter().zip(attempt_cnt).collect(),
            lease_id: r.get("lease_id"),
            lease_live: r.get("lease_live"),
            request_lease: None,
            lease_upto: r.get("lease_upto"),
            rest_ms: None,
        };
        if !edit(&name, &mut cursor) {
            continue;
        }
        pos.push(cursor.cursor_pos);
        seg.push(cursor.cursor_seg);
        settled.push(array_literal(cursor.settled.iter()));
        apos.push(array_literal(cursor.attempts.iter().map(|a| a.0)));
        acnt.push(array_literal(cursor.attempts.iter().map(|a| a.1)));
        groups.push(name);
    }
    if !groups.is_empty() {
        tx.execute(
            EDIT_SQL,
            &[
                &partition,
                &groups,
                &pos,
                &seg,
                &settled,
                &apos,
                &acnt,
                &reset_rest,
            ],
        )
        .await?;
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::array_literal;

    #[test]
    fn array_literals() {
        assert_eq!(array_literal([1i64, 2, 3].iter()), "{1,2,3}");
        assert_eq!(array_literal(Vec::<i64>::new().iter()), "{}");
    }

    /// The claim's list names every column of the table as the migrations create it, in
    /// order; the other writers' list all but the lease's digest, which they leave NULL.
    #[test]
    fn the_column_list_is_the_tables() {
        let sql: String = crate::schema::MIGRATIONS
            .iter()
            .map(|m| m.sql)
            .collect::<Vec<_>>()
            .join("\n");
        let code: String = sql
            .lines()
            .map(|l| l.split("--").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let start = code
            .find("CREATE TABLE comb.cursor_states (")
            .expect("the table is created");
        let body = &code[start + "CREATE TABLE comb.cursor_states (".len()..];
        let (mut depth, mut parts, mut part) = (0, Vec::new(), String::new());
        for c in body.chars() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => break,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(std::mem::take(&mut part));
                    continue;
                }
                _ => {}
            }
            part.push(c);
        }
        parts.push(part);
        let mut columns: Vec<String> = parts
            .iter()
            .filter_map(|p| p.split_whitespace().next().map(str::to_string))
            .filter(|c| !c.eq_ignore_ascii_case("PRIMARY"))
            .collect();
        // Columns added later, in the order their migrations add them.
        let added = "ALTER TABLE comb.cursor_states ADD COLUMN ";
        for (at, _) in code.match_indices(added) {
            let rest = &code[at + added.len()..];
            columns.push(rest.split_whitespace().next().unwrap().to_string());
        }
        let listed = insert_leased_state!();
        let list = |head: &str| -> Vec<String> {
            head[head.find('(').unwrap() + 1..head.find(')').unwrap()]
                .split(',')
                .map(|c| c.trim().to_string())
                .collect()
        };
        assert_eq!(list(listed), columns);
        let mut others = columns;
        assert_eq!(others.pop().as_deref(), Some("lease_digest"));
        assert_eq!(list(insert_state!()), others);
    }
}
