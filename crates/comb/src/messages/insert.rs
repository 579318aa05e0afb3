//! The push's statements on message storage: the insert with a duplicate check, the plain
//! append, the heads a copied batch starts from, and the copy itself. `push::store` runs
//! them in its transaction after locking the batch's partitions.

/// `INSERT INTO comb.messages (…)`: the columns every insert of the push gives, in this
/// order: partition, position, segment, message id, transaction id, trace id, payload,
/// time stored, producer's subject.
macro_rules! insert_messages {
    () => {
        "INSERT INTO comb.messages
    (partition_id, pos, seg, message_id, transaction_id, trace_id, payload, created_at,
     producer_sub)"
    };
}
pub(crate) use insert_messages;

/// The message partition `$p` already holds under transaction id `$txid` (SQL
/// expressions), its id, if any: the duplicate check of a push with producers' ids.
macro_rules! prior_of {
    ($p:literal, $txid:literal) => {
        concat!(
            "SELECT m.message_id FROM comb.messages m
        WHERE m.partition_id = ",
            $p,
            " AND m.transaction_id = ",
            $txid,
            "
        LIMIT 1"
        )
    };
}
pub(crate) use prior_of;

/// The insert of a push's only message, its values SQL expressions (the arguments of
/// `comb.store_batch`, a PL/pgSQL function): [`append_sql!`]'s row at `head + $rank` in the
/// newest segment, as `INSERT … VALUES`. The unnest and the join a batch's statement needs
/// cost more to start than one row costs to insert. The caller holds the partition's lock.
macro_rules! append_one_sql {
    ($p:literal, $rank:literal, $id:literal, $txid:literal, $trace:literal, $payload:literal,
     $sub:literal) => {
        concat!(
            crate::messages::insert::insert_messages!(),
            "
VALUES (",
            $p,
            ", ",
            crate::messages::head_pos!($p),
            " + ",
            $rank,
            ", ",
            crate::messages::segments::newest_segment!(),
            ", ",
            $id,
            ", ",
            $txid,
            ", ",
            $trace,
            ", ",
            $payload,
            ", statement_timestamp(), ",
            $sub,
            ")"
        )
    };
}
pub(crate) use append_one_sql;

/// The insert for batches where some message carries a producer's transaction id: a message
/// whose id the partition already holds is not stored again, and answers with the id stored;
/// its rows' columns as `$outcomes` says (the statement's, or a function's wider rows).
macro_rules! insert_sql {
    () => {
        $crate::messages::insert::insert_sql!(
            "SELECT i.ord, pr.message_id AS prior_id, s.message_id IS NOT NULL AS stored"
        )
    };
    ($outcomes:literal) => { concat!(
    "
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::text[], $5::bytea[], $6::bool[],
                         $7::text[])
        WITH ORDINALITY AS t(partition_id, transaction_id, message_id, trace_id, payload, check_dup,
                             producer_sub, ord)
),
prior AS (
    SELECT i.ord, m.message_id
    FROM input i
    CROSS JOIN LATERAL (
        ",
    crate::messages::insert::prior_of!("i.partition_id", "i.transaction_id"),
    "
    ) m
    WHERE i.check_dup
),
fresh AS (
    SELECT i.*, row_number() OVER (PARTITION BY i.partition_id ORDER BY i.ord) AS rn
    FROM input i
    WHERE NOT EXISTS (SELECT 1 FROM prior p WHERE p.ord = i.ord)
),
segment AS (SELECT max(seg) AS seg FROM comb.segments),
heads AS (
    SELECT d.partition_id, ",
    crate::messages::head_pos!("d.partition_id"),
    " AS pos
    FROM (SELECT DISTINCT partition_id FROM fresh) d
),
stored AS (
    ",
    crate::messages::insert::insert_messages!(),
    "
    SELECT f.partition_id, h.pos + f.rn, s.seg, f.message_id, f.transaction_id,
           f.trace_id, f.payload, statement_timestamp(), f.producer_sub
    FROM fresh f
    JOIN heads h ON h.partition_id = f.partition_id
    CROSS JOIN segment s
    RETURNING message_id
)
",
    $outcomes,
    "
FROM input i
LEFT JOIN prior pr ON pr.ord = i.ord
LEFT JOIN stored s ON s.message_id = i.message_id
ORDER BY i.ord"
    ) };
}
pub(crate) use insert_sql;

/// [`insert_sql!`] as a statement of its own.
pub(crate) const INSERT_SQL: &str = insert_sql!();

/// The transaction ids among `$2` that partition `$1` already holds, with the message each
/// was first stored as, read after the push's partition lock (so no racing push of the
/// partition slips in between), after which the new messages are copied in (a batch of
/// `COPY` size, on both backends) or take the plain append (on Citus).
///
/// On one PostgreSQL the partition is tested on each row found (`IS TRUE`) rather than
/// given to an index, so that the transaction ids' index is the only one the read can take
/// ([`PRIOR_BEGIN`] prices out whole-table reads). A connection keeps the generic plan it
/// made, and one made while the newest segment was empty (analysed empty, as a segment made
/// ahead of its turn is) otherwise read that segment whole, or the partition's run of its
/// primary key, for every batch, until maintenance next refreshed its statistics, while the
/// segment grew by every push. A transaction id found in another partition is read and
/// passed over.
pub(crate) const PRIOR_SQL: &str = "
SELECT DISTINCT ON (m.transaction_id) m.transaction_id, m.message_id
FROM comb.messages m
WHERE m.transaction_id = ANY($2::text[]) AND (m.partition_id = $1) IS TRUE
ORDER BY m.transaction_id, m.pos";

/// [`PRIOR_SQL`] on Citus: the partition given as the distribution column's equality, so
/// that it is a router statement of the partition's shard (the workers plan it for each
/// execution, from their shards' sizes). [`INSERT_SQL`]'s insert, a data-modifying CTE,
/// Citus plans in steps through the coordinator and commits in two phases; this read and
/// the plain append name one shard each and commit on its worker in one phase.
pub(crate) const PRIOR_CITUS_SQL: &str = "
SELECT DISTINCT ON (m.transaction_id) m.transaction_id, m.message_id
FROM comb.messages m
WHERE m.partition_id = $1 AND m.transaction_id = ANY($2::text[])
ORDER BY m.transaction_id, m.pos";

/// The start of a transaction that reads [`PRIOR_SQL`] outside a function: `BEGIN`, with
/// whole-table reads priced out and generic plans forced, as the consumer path plans
/// ([`crate::db::consumer_plans`]), and no parallel workers. Planned for each execution, the
/// check cost a third of a millisecond to plan over a queue's segments, and with whole-table
/// reads priced out its plans gathered from parallel workers (a disabled sequential scan
/// looks cheaper split among workers): 3.2 ms a check of 100 ids in `queen1`, where one
/// index probe per id and segment costs a tenth of that.
pub(crate) const PRIOR_BEGIN: &str = "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; \
     SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; \
     SET LOCAL max_parallel_workers_per_gather = 0";

/// [`PRIOR_BEGIN`] on Citus, which plans [`PRIOR_CITUS_SQL`] for each execution (it refuses
/// generic plans of distributed tables).
pub(crate) const PRIOR_CITUS_BEGIN: &str = "BEGIN; SET LOCAL enable_seqscan = off; \
     SET LOCAL enable_bitmapscan = off; SET LOCAL max_parallel_workers_per_gather = 0";

/// The insert for batches without producer-given transaction ids, which cannot repeat a stored
/// message: positions `head + rank` with each item's rank in its partition computed by the
/// broker, no duplicate check, nothing returned. Partitions deleted before the lock are not
/// in `comb.partitions` any more, so their items are left out; the lock statement's rows tell
/// which partitions were stored into. Producers' subjects (`$8`) are sent only when some
/// message has one: a missing array pads the column with NULLs at no cost per row. `$partitions`
/// is the catalog's rows of the batch's partitions (`$7`), given by the caller.
macro_rules! append_sql {
    (head: $head:expr; $($partitions:tt)*) => {
        concat!(
    "
",
    crate::messages::insert::insert_messages!(),
    "
SELECT i.partition_id, h.pos + i.rank, s.seg, i.message_id, i.transaction_id, i.trace_id,
       i.payload, statement_timestamp(), i.producer_sub
FROM unnest($1::uuid[], $2::bigint[], $3::uuid[], $4::text[], $5::text[], $6::bytea[],
            $8::text[])
    AS i(partition_id, rank, message_id, transaction_id, trace_id, payload, producer_sub)
JOIN (
    SELECT p.id, ",
    $head,
    " AS pos
    FROM ",
    $($partitions)*,
    "
) h ON h.id = i.partition_id
CROSS JOIN (SELECT max(seg) AS seg FROM comb.segments) s"
)
    };
    ($($partitions:tt)*) => {
        $crate::messages::insert::append_sql!(head: $crate::messages::head_pos!("p.id"); $($partitions)*)
    };
}
pub(crate) use append_sql;

/// Heads of the batch's partitions, the newest segment and the time to stamp, read after the
/// lock for a batch the broker copies in. Which partitions still exist is what the lock
/// returned, so the partition rows are not read again here.
pub(crate) const HEADS_SQL: &str = concat!(
    "
SELECT p.id, ",
    crate::messages::head_pos!("p.id"),
    " AS head, s.seg, statement_timestamp() AS at
FROM unnest($1::uuid[]) AS p(id)
CROSS JOIN (SELECT max(seg) AS seg FROM comb.segments) s"
);

/// [`HEADS_SQL`] on Citus, of one partition (`$1`): over several, Citus cannot join the
/// list of partitions to their messages; one statement per partition, each on its worker.
pub(crate) const HEADS_CITUS_SQL: &str = concat!(
    "SELECT $1::uuid AS id, ",
    crate::messages::head_pos!("$1"),
    " AS head, s.seg, statement_timestamp() AS at FROM (SELECT max(seg) AS seg FROM comb.segments) s"
);

pub(crate) const COPY_SQL: &str = "COPY comb.messages
    (partition_id, pos, seg, message_id, transaction_id, trace_id, payload, created_at)
    FROM STDIN (FORMAT binary)";

/// [`COPY_SQL`] with the producers' subjects, for batches where some message has one: the
/// batches of servers without tokens copy exactly what they did before.
pub(crate) const COPY_WITH_SUB_SQL: &str = "COPY comb.messages
    (partition_id, pos, seg, message_id, transaction_id, trace_id, payload, created_at,
     producer_sub)
    FROM STDIN (FORMAT binary)";
