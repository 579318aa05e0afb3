//! The ack transaction's SQL: lock cursors, read their state with what they handed out,
//! append their next versions and the dead letters.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use deadpool_postgres::{GenericClient, Pool, Transaction};
use tokio_postgres::Statement;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::{AckItem, AckJob, AckOutcome, AckRefusal, Cursor, completed};
use crate::cursor;
use crate::db::{self, DbError};
use crate::fusion::{Fuser, Runner};
use crate::metrics::Stage;
use crate::queue::QueueOptions;

/// Positions of acked messages, found by transaction id: one descent of the transaction id
/// index per message. Acks read positions from their cursor's delivered range instead
/// ([`ACK_STATE_SQL`]); this finds the few that are not there.
pub const LOOKUP_SQL: &str = "
SELECT i.ord, m.pos, m.seg
FROM unnest($1::uuid[], $2::text[]) WITH ORDINALITY AS i(partition_id, transaction_id, ord)
CROSS JOIN LATERAL (
    -- No ORDER BY: a transaction id is stored once per partition, and ordering by position
    -- would make the planner walk the partition in position order instead of using the
    -- (transaction_id, partition_id) index.
    SELECT m.pos, m.seg FROM comb.messages m
    WHERE m.partition_id = i.partition_id AND m.transaction_id = i.transaction_id
    LIMIT 1
) m";

/// Locks cursor rows in a stable order (acks of one batch never deadlock with another's).
/// The rows only serialise writers; the state is read by a later statement ([`STATE_SQL`]),
/// whose snapshot then holds every version written before the lock was granted.
pub const LOCK_SQL: &str = "
SELECT c.partition_id FROM comb.cursors c
WHERE (c.partition_id, c.consumer_group) IN (SELECT * FROM unnest($1::uuid[], $2::text[]))
ORDER BY c.partition_id, c.consumer_group
FOR NO KEY UPDATE OF c";

/// [`LOCK_SQL`] on Citus, which locks rows only in a statement of one shard: the
/// coordinator locks each cursor with one of its own (`comb.lock_cursors`), in the same order.
const LOCK_CITUS_SQL: &str = "SELECT * FROM comb.lock_cursors($1, $2)";

/// The cursor lock this database takes: [`LOCK_SQL`], or its Citus form.
pub(crate) fn lock_sql() -> &'static str {
    if crate::schema::citus::on() {
        LOCK_CITUS_SQL
    } else {
        LOCK_SQL
    }
}

/// The columns [`locked_cursors`] reads, of a cursor's state `s` and its queue `q`, shared
/// by the statements that read locked cursors.
macro_rules! locked_columns {
    () => {
        "
SELECT s.partition_id, s.consumer_group, s.cursor_pos, s.cursor_seg, s.settled,
       s.attempt_pos, s.attempt_cnt, s.lease_id,
       coalesce(s.lease_expires_at > now(), false), s.lease_upto,
       q.options, q.id"
    };
}

/// The latest state of locked cursors, in the columns [`locked_cursors`] reads.
pub const STATE_SQL: &str = concat!(
    locked_columns!(),
    "
FROM (SELECT DISTINCT * FROM unnest($1::uuid[], $2::text[])) AS u(partition_id, consumer_group)
JOIN comb.cursors c
  ON c.partition_id = u.partition_id AND c.consumer_group = u.consumer_group
JOIN comb.queues q ON q.id = c.queue_id
CROSS JOIN LATERAL comb.cursor_state(u.partition_id, u.consumer_group) s"
);

/// [`STATE_SQL`] for acks, given each cursor once with the number of acks it receives: each
/// locked cursor's state, and the position, segment and
/// transaction id of its messages from just after its position up to the last one handed
/// out, the acked messages among them. One ordered read of the primary key per cursor costs
/// the database several times less than a descent of the transaction id index per acked
/// message. The read stops a little beyond as many messages as the request acks on that
/// cursor (and those already settled above its position), so acking one message of a large
/// lease reads a few rows; acks not found there are looked up by [`LOOKUP_SQL`].
pub const ACK_STATE_SQL: &str = concat!(
    locked_columns!(),
    ", r.pos, r.seg, r.transaction_id
FROM unnest($1::uuid[], $2::text[], $3::bigint[]) AS u(partition_id, consumer_group, acks)
-- One probe of the cursor's key each (LIMIT keeps the subquery from becoming a join the
-- planner could answer by reading every cursor of the queue).
CROSS JOIN LATERAL (
    SELECT c.queue_id FROM comb.cursors c
    WHERE c.partition_id = u.partition_id AND c.consumer_group = u.consumer_group
    LIMIT 1
) c
JOIN comb.queues q ON q.id = c.queue_id
CROSS JOIN LATERAL comb.cursor_state(u.partition_id, u.consumer_group) s
CROSS JOIN LATERAL (
    SELECT array_agg(m.pos) AS pos, array_agg(m.seg) AS seg,
           array_agg(m.transaction_id) AS transaction_id
    FROM comb.messages m
    WHERE m.partition_id = u.partition_id
      AND m.pos > s.cursor_pos
      AND m.pos <= least(s.lease_upto,
                         s.cursor_pos + 2 * u.acks + 8 + cardinality(s.settled))
      AND m.seg >= s.cursor_seg
) r"
);

const NAMES_SQL: &str = "
SELECT p.id, p.name, q.name FROM comb.partitions p JOIN comb.queues q ON q.id = p.queue_id
WHERE p.id = ANY($1)";

/// The queues of the partitions that exist among `partitions` (a probe of the partitions'
/// primary key each): what a token limited to some queues is checked against before it acks.
/// A cursor's (`u`) latest state written out for a router statement on Citus: through
/// `comb.cursor_state` Citus would refuse the statement (a function reading a distributed
/// table), and with it run on the worker, a distributed query from a shard.
fn citus_state(one: &str) -> String {
    format!(
        "(SELECT * FROM comb.cursor_states s
          WHERE s.partition_id = u.partition_id AND s.partition_id = {one}
            AND s.consumer_group = u.consumer_group
          ORDER BY s.gen DESC, s.ver DESC LIMIT 1)"
    )
}

/// The Citus forms of the statements of judged acks and lease expiry: each reads and writes
/// one partition (its last parameter), named to every distributed table, so that Citus plans
/// it on that partition's worker. Callers split their work by partition on Citus.
static LOOKUP_CITUS_SQL: LazyLock<String> = LazyLock::new(|| {
    LOOKUP_SQL.replace(
        "WHERE m.partition_id = i.partition_id AND",
        "WHERE m.partition_id = i.partition_id AND m.partition_id = $3 AND",
    )
});
pub(crate) static STATE_CITUS_SQL: LazyLock<String> = LazyLock::new(|| {
    STATE_SQL
        .replace(
            "ON c.partition_id = u.partition_id AND c.consumer_group = u.consumer_group",
            "ON c.partition_id = u.partition_id AND c.consumer_group = u.consumer_group
                AND c.partition_id = $3",
        )
        .replace(
            "CROSS JOIN LATERAL comb.cursor_state(u.partition_id, u.consumer_group) s",
            &format!("CROSS JOIN LATERAL {} s", citus_state("$3")),
        )
});
static ACK_STATE_CITUS_SQL: LazyLock<String> = LazyLock::new(|| {
    ACK_STATE_SQL
        .replace(
            "WHERE c.partition_id = u.partition_id AND c.consumer_group = u.consumer_group",
            "WHERE c.partition_id = u.partition_id AND c.consumer_group = u.consumer_group
               AND c.partition_id = $4",
        )
        .replace(
            "CROSS JOIN LATERAL comb.cursor_state(u.partition_id, u.consumer_group) s",
            &format!("CROSS JOIN LATERAL {} s", citus_state("$4")),
        )
        .replace(
            "WHERE m.partition_id = u.partition_id",
            "WHERE m.partition_id = u.partition_id AND m.partition_id = $4",
        )
});
static WRITE_CITUS_SQL: LazyLock<String> = LazyLock::new(|| {
    WRITE_SQL.replace(
        "CROSS JOIN LATERAL comb.cursor_state(u.partition_id, u.consumer_group) s",
        &format!("CROSS JOIN LATERAL {} s", citus_state("$10")),
    )
});
static DEAD_LETTER_CITUS_SQL: LazyLock<String> = LazyLock::new(|| {
    DEAD_LETTER_SQL.replace(
        "JOIN comb.messages m ON m.partition_id = d.partition_id AND m.pos = d.pos",
        "JOIN comb.messages m ON m.partition_id = d.partition_id AND m.pos = d.pos
             AND m.partition_id = $8",
    )
});

/// The partition a Citus statement is about, as its last parameter; nothing on PostgreSQL.
fn with_partition<'a>(
    params: &[&'a (dyn ToSql + Sync)],
    one: &'a Option<Uuid>,
) -> Vec<&'a (dyn ToSql + Sync)> {
    let mut all = params.to_vec();
    if one.is_some() {
        all.push(one);
    }
    all
}

/// `items` grouped by partition, first appearance first (Citus's statements take one).
fn by_partition<T>(items: &[T], of: impl Fn(&T) -> Uuid) -> Vec<(Uuid, Vec<usize>)> {
    let mut out: Vec<(Uuid, Vec<usize>)> = Vec::new();
    for (k, i) in items.iter().enumerate() {
        let p = of(i);
        match out.iter_mut().find(|(q, _)| *q == p) {
            Some((_, ks)) => ks.push(k),
            None => out.push((p, vec![k])),
        }
    }
    out
}

pub(crate) async fn queues_of(pool: &Pool, partitions: &[Uuid]) -> Result<Vec<String>, DbError> {
    let client = pool.get().await?;
    let names = client.prepare_cached(NAMES_SQL).await?;
    Ok(client
        .query(&names, &[&partitions])
        .await?
        .iter()
        .map(|r| r.get(2))
        .collect())
}

/// Appends the next version of changed cursors. What the rules do not decide (lease expiry,
/// last claim) is carried over from the version it follows.
const WRITE_SQL: &str = concat!(
    "\n",
    cursor::insert_state!(),
    "
SELECT u.partition_id, u.consumer_group, (SELECT max(gen) FROM comb.cursor_gens), s.ver + 1,
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
CROSS JOIN LATERAL comb.cursor_state(u.partition_id, u.consumer_group) s"
);

const DEAD_LETTER_SQL: &str = "
INSERT INTO comb.dead_letters
    (id, queue_id, partition_id, consumer_group, pos, message_id, transaction_id, trace_id,
     payload, created_at, attempts, error, producer_sub)
SELECT d.id, d.queue_id, m.partition_id, d.consumer_group, m.pos, m.message_id,
       m.transaction_id, m.trace_id, m.payload, m.created_at, d.attempts, d.error,
       m.producer_sub
FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::bigint[], $6::integer[], $7::text[])
    AS d(id, queue_id, partition_id, consumer_group, pos, attempts, error)
JOIN comb.messages m ON m.partition_id = d.partition_id AND m.pos = d.pos";

/// Starts the ack workers.
pub(crate) fn start(
    pool: Pool,
    workers: usize,
    max_items: usize,
    stage: Arc<Stage>,
) -> Fuser<AckJob> {
    let run: Runner<AckJob> = Arc::new(move |jobs| {
        let pool = pool.clone();
        Box::pin(async move {
            let items: Vec<&AckItem> = jobs.iter().flat_map(|j| j.items.iter()).collect();
            match settle(&pool, &items).await {
                Ok(outcomes) => {
                    let mut it = outcomes.into_iter();
                    for job in jobs {
                        let mine: Vec<AckOutcome> = it.by_ref().take(job.items.len()).collect();
                        let _ = job.reply.send(Ok(mine));
                    }
                }
                Err(e) => {
                    let e = Arc::new(e);
                    for job in jobs {
                        let _ = job.reply.send(Err(e.clone()));
                    }
                }
            }
        })
    });
    Fuser::start(workers, max_items, |j: &AckJob| j.items.len(), run, stage)
}

/// A cursor locked for update, with what the rules need to know about its queue.
pub(crate) struct Locked {
    pub(crate) cursor: Cursor,
    pub(crate) queue_id: Uuid,
    pub(crate) options: QueueOptions,
    pub(crate) changed: bool,
}

/// A message to dead-letter, gathered while acks are applied.
#[derive(Clone)]
pub(crate) struct DeadLetter {
    pub(crate) queue_id: Uuid,
    pub(crate) partition_id: Uuid,
    pub(crate) group: String,
    pub(crate) pos: i64,
    pub(crate) attempts: i32,
    pub(crate) error: Option<String>,
}

/// The consumer path's planner settings for one transaction ([`db::consumer_plans`]): what
/// acks inside a client's transaction run under, as the consumer pool's connections do.
pub const PLANS: &str = db::consumer_plans!();

/// Applies acks; one outcome per item, in order. Cursors whose every ack completes a
/// message under their live lease are judged in SQL in one round trip
/// ([`completed::settle`]); the others, and any such cursor SQL could not judge, take the
/// general path ([`settle_judged_here`]).
async fn settle(pool: &Pool, items: &[&AckItem]) -> Result<Vec<AckOutcome>, DbError> {
    let client = pool.get().await?;
    // Each path prepares its statements before its pipeline: a statement still being
    // prepared when COMMIT is sent would run after it, outside the transaction.
    let chosen = completed::completing(items);
    let mut outcomes: Vec<Option<AckOutcome>> = if chosen.is_empty() {
        (0..items.len()).map(|_| None).collect()
    } else if crate::schema::citus::on() {
        // On Citus, a transaction per partition, each run on its partition's worker.
        let lock = client.prepare_cached(lock_sql()).await?;
        let judge = client.prepare_cached(&completed::JUDGE_CITUS_SQL).await?;
        let mut by_partition: HashMap<Uuid, Vec<usize>> = HashMap::new();
        for &k in &chosen {
            by_partition
                .entry(items[k].partition_id)
                .or_default()
                .push(k);
        }
        let mut outcomes: Vec<Option<AckOutcome>> = (0..items.len()).map(|_| None).collect();
        for (partition, ks) in by_partition {
            let mut part =
                completed::settle(&client, &lock, &judge, items, &ks, Some(partition)).await?;
            for k in ks {
                outcomes[k] = part[k].take();
            }
        }
        outcomes
    } else {
        let lock = client.prepare_cached(lock_sql()).await?;
        let judge = client.prepare_cached(completed::JUDGE_SQL).await?;
        completed::settle(&client, &lock, &judge, items, &chosen, None).await?
    };
    let rest: Vec<usize> = (0..items.len())
        .filter(|&k| outcomes[k].is_none())
        .collect();
    if !rest.is_empty() {
        let reads = ReadStatements::prepare(&client).await?;
        let writes = WriteStatements::prepare(&client).await?;
        let others: Vec<&AckItem> = rest.iter().map(|&k| items[k]).collect();
        let judged = settle_judged_here(&client, &reads, &writes, &others).await?;
        for (k, outcome) in rest.into_iter().zip(judged) {
            outcomes[k] = Some(outcome);
        }
    }
    Ok(outcomes
        .into_iter()
        .map(|o| o.expect("every item judged"))
        .collect())
}

/// Applies acks in one transaction of their own, in two round trips: BEGIN with the reads,
/// then the writes with COMMIT. The rules run here, on the state read
/// ([`super::cursor::Cursor::apply`]).
async fn settle_judged_here(
    client: &deadpool_postgres::Client,
    reads: &ReadStatements,
    writes: &WriteStatements,
    items: &[&AckItem],
) -> Result<Vec<AckOutcome>, DbError> {
    let (begin, read) = tokio::join!(
        client.batch_execute("BEGIN"),
        judge(client, reads, items, false),
    );
    let judged = match begin.map_err(DbError::from).and(read) {
        Ok(judged) => judged,
        Err(e) => {
            db::roll_back(client).await;
            return Err(e);
        }
    };
    // A failed write makes the pipelined COMMIT roll back.
    let (written, commit) = tokio::join!(
        write_back(client, writes, &judged.cursors, &judged.dead),
        client.batch_execute("COMMIT"),
    );
    written?;
    commit?;
    Ok(judged.outcomes)
}

/// Applies acks inside the caller's transaction; one outcome per item, in order.
/// Refused items change nothing; the caller decides whether to commit the rest. The rest
/// of the transaction runs with the consumer path's plans ([`db::consumer_plans`]).
pub(crate) async fn settle_in(
    tx: &Transaction<'_>,
    items: &[&AckItem],
    strict: bool,
) -> Result<Vec<AckOutcome>, DbError> {
    // Cached plans of these statements are shared with the ack path's own transactions:
    // they are made under the same settings wherever they are made.
    tx.batch_execute(PLANS).await?;
    if citus() {
        // Citus routes a statement to one worker only in a custom plan (see `db`).
        tx.batch_execute("SET LOCAL plan_cache_mode = force_custom_plan")
            .await?;
    }
    let reads = ReadStatements::prepare(tx).await?;
    let writes = WriteStatements::prepare(tx).await?;
    let judged = judge(tx, &reads, items, strict).await?;
    write_back(tx, &writes, &judged.cursors, &judged.dead).await?;
    Ok(judged.outcomes)
}

/// The statements that read what acks are judged against.
struct ReadStatements {
    lookup: Statement,
    lock: Statement,
    state: Statement,
    names: Statement,
}

impl ReadStatements {
    async fn prepare<C: GenericClient>(client: &C) -> Result<ReadStatements, DbError> {
        Ok(ReadStatements {
            lookup: client
                .prepare_cached(if citus() {
                    &LOOKUP_CITUS_SQL
                } else {
                    LOOKUP_SQL
                })
                .await?,
            lock: client.prepare_cached(lock_sql()).await?,
            state: client
                .prepare_cached(if citus() {
                    &ACK_STATE_CITUS_SQL
                } else {
                    ACK_STATE_SQL
                })
                .await?,
            names: client.prepare_cached(NAMES_SQL).await?,
        })
    }
}

/// Acks judged: their outcomes, and the cursor versions and dead letters to write.
struct Judged {
    outcomes: Vec<AckOutcome>,
    cursors: HashMap<(Uuid, String), Locked>,
    dead: Vec<DeadLetter>,
}

/// Reads the cursors' state (locked first) with the positions of the messages they handed
/// out, in one pipelined round trip (a second looks up acked messages not found there), and
/// applies the acks to the cursors in memory.
async fn judge<C: GenericClient>(
    tx: &C,
    statements: &ReadStatements,
    items: &[&AckItem],
    strict: bool,
) -> Result<Judged, DbError> {
    if !citus() {
        return judge_one(tx, statements, items, strict, None).await;
    }
    // On Citus, a partition at a time; outcomes put back in the items' order.
    let mut outcomes: Vec<Option<AckOutcome>> = (0..items.len()).map(|_| None).collect();
    let mut cursors = HashMap::new();
    let mut dead = Vec::new();
    for (partition, ks) in by_partition(items, |i| i.partition_id) {
        let mine: Vec<&AckItem> = ks.iter().map(|&k| items[k]).collect();
        let judged = judge_one(tx, statements, &mine, strict, Some(partition)).await?;
        for (k, o) in ks.into_iter().zip(judged.outcomes) {
            outcomes[k] = Some(o);
        }
        cursors.extend(judged.cursors);
        dead.extend(judged.dead);
    }
    Ok(Judged {
        outcomes: outcomes.into_iter().map(|o| o.expect("judged")).collect(),
        cursors,
        dead,
    })
}

/// [`judge`] of items all of `one` partition on Citus (`None`: any, on PostgreSQL).
async fn judge_one<C: GenericClient>(
    tx: &C,
    statements: &ReadStatements,
    items: &[&AckItem],
    strict: bool,
    one: Option<Uuid>,
) -> Result<Judged, DbError> {
    // Each cursor once, with its acks counted: a batch acks many messages of few cursors.
    let mut acks: HashMap<(Uuid, &str), i64> = HashMap::new();
    for i in items {
        *acks.entry((i.partition_id, i.group.as_str())).or_default() += 1;
    }
    let pids: Vec<Uuid> = acks.keys().map(|k| k.0).collect();
    let groups: Vec<&str> = acks.keys().map(|k| k.1).collect();
    let counts: Vec<i64> = acks.values().copied().collect();
    let mut partitions = pids.clone();
    partitions.sort_unstable();
    partitions.dedup();
    let lock_params: [&(dyn ToSql + Sync); 2] = [&pids, &groups];
    let state_params = with_partition(&[&pids, &groups, &counts], &one);
    let names_params: [&(dyn ToSql + Sync); 1] = [&partitions];
    // Pipelined: one round trip. The state is read after the lock statement has finished.
    let (lock, locked, named) = tokio::join!(
        tx.query(&statements.lock, &lock_params),
        tx.query(&statements.state, &state_params),
        tx.query(&statements.names, &names_params),
    );
    lock?;
    let locked = locked?;
    let position = positions(tx, &statements.lookup, items, &locked, one).await?;
    let mut cursors = locked_cursors(&locked);
    for state in cursors.values_mut() {
        state.cursor.begin_request();
    }
    let mut partition_names: HashMap<Uuid, (String, String)> = HashMap::new();
    for r in named? {
        partition_names.insert(r.get(0), (r.get(1), r.get(2)));
    }

    let mut outcomes = Vec::with_capacity(items.len());
    let mut dead: Vec<DeadLetter> = Vec::new();
    for (k, item) in items.iter().enumerate() {
        let names = partition_names.get(&item.partition_id);
        let mut outcome = AckOutcome {
            result: Ok(()),
            queue_name: names.map(|n| n.1.clone()),
            partition_name: names.map(|n| n.0.clone()),
            lease_released: false,
            dlq: false,
            discarded: false,
        };
        let Some((pos, seg)) = position[k] else {
            outcome.result = Err(AckRefusal::MessageNotFound);
            outcomes.push(outcome);
            continue;
        };
        let Some(state) = cursors.get_mut(&(item.partition_id, item.group.clone())) else {
            outcome.result = Err(AckRefusal::NotConsumed);
            outcomes.push(outcome);
            continue;
        };
        match state
            .cursor
            .apply(pos, seg, item.status, item.lease_id, &state.options, strict)
        {
            Ok(applied) => {
                state.changed = true;
                outcome.lease_released = applied.lease_released;
                outcome.discarded = applied.discarded;
                if let Some(attempts) = applied.dead_letter {
                    outcome.dlq = true;
                    dead.push(DeadLetter {
                        queue_id: state.queue_id,
                        partition_id: item.partition_id,
                        group: item.group.clone(),
                        pos,
                        attempts,
                        error: item.error.clone(),
                    });
                }
            }
            Err(refusal) => outcome.result = Err(refusal),
        }
        outcomes.push(outcome);
    }
    Ok(Judged {
        outcomes,
        cursors,
        dead,
    })
}

/// The position and segment of each acked message (`None`: no such message in its
/// partition): from the delivered ranges read with the cursors' state, else looked up by
/// transaction id, all missing ones in one statement.
async fn positions<C: GenericClient>(
    tx: &C,
    lookup: &Statement,
    items: &[&AckItem],
    locked: &[tokio_postgres::Row],
    one: Option<Uuid>,
) -> Result<Vec<Option<(i64, i32)>>, DbError> {
    let mut delivered: HashMap<(Uuid, &str), (i64, i32)> = HashMap::new();
    for r in locked {
        let partition_id: Uuid = r.get(0);
        // NULL when the range is empty.
        let (Some(pos), Some(seg), Some(txids)) = (
            r.get::<_, Option<Vec<i64>>>(12),
            r.get::<_, Option<Vec<i32>>>(13),
            r.get::<_, Option<Vec<&str>>>(14),
        ) else {
            continue;
        };
        for ((p, s), t) in pos.into_iter().zip(seg).zip(txids) {
            delivered.insert((partition_id, t), (p, s));
        }
    }
    let mut position: Vec<Option<(i64, i32)>> = items
        .iter()
        .map(|i| {
            delivered
                .get(&(i.partition_id, i.transaction_id.as_str()))
                .copied()
        })
        .collect();
    let missing: Vec<usize> = (0..items.len())
        .filter(|&k| position[k].is_none())
        .collect();
    if missing.is_empty() {
        return Ok(position);
    }
    let pids: Vec<Uuid> = missing.iter().map(|&k| items[k].partition_id).collect();
    let txids: Vec<&str> = missing
        .iter()
        .map(|&k| items[k].transaction_id.as_str())
        .collect();
    let params = with_partition(&[&pids, &txids], &one);
    for r in tx.query(lookup, &params).await? {
        let ord: i64 = r.get(0);
        position[missing[(ord - 1) as usize]] = Some((r.get(1), r.get(2)));
    }
    Ok(position)
}

/// Cursors as read by [`STATE_SQL`].
pub(crate) fn locked_cursors(rows: &[tokio_postgres::Row]) -> HashMap<(Uuid, String), Locked> {
    let mut cursors = HashMap::new();
    for r in rows {
        let attempt_pos: Vec<i64> = r.get(5);
        let attempt_cnt: Vec<i32> = r.get(6);
        let options: serde_json::Value = r.get(10);
        let set = serde_json::from_value(options).unwrap_or_default();
        cursors.insert(
            (r.get(0), r.get(1)),
            Locked {
                cursor: Cursor {
                    cursor_pos: r.get(2),
                    cursor_seg: r.get(3),
                    settled: r.get(4),
                    attempts: attempt_pos.into_iter().zip(attempt_cnt).collect(),
                    lease_id: r.get(7),
                    lease_live: r.get(8),
                    request_lease: None,
                    lease_upto: r.get(9),
                    rest_ms: None,
                },
                options: QueueOptions::from_set(&set),
                queue_id: r.get(11),
                changed: false,
            },
        );
    }
    cursors
}

/// The statements that write cursor versions and dead letters.
pub(crate) struct WriteStatements {
    write: Statement,
    dead: Statement,
}

impl WriteStatements {
    pub(crate) async fn prepare<C: GenericClient>(client: &C) -> Result<WriteStatements, DbError> {
        Ok(WriteStatements {
            write: client
                .prepare_cached(if citus() { &WRITE_CITUS_SQL } else { WRITE_SQL })
                .await?,
            dead: client
                .prepare_cached(if citus() {
                    &DEAD_LETTER_CITUS_SQL
                } else {
                    DEAD_LETTER_SQL
                })
                .await?,
        })
    }
}

/// Appends the next version of changed cursors and writes new dead letters (pipelined: one
/// round trip, no statement prepared on the way, so a COMMIT pipelined after it follows
/// them). The cursors must have been locked in this transaction.
pub(crate) async fn write_back<C: GenericClient>(
    tx: &C,
    statements: &WriteStatements,
    cursors: &HashMap<(Uuid, String), Locked>,
    dead: &[DeadLetter],
) -> Result<(), DbError> {
    let changed: Vec<(&(Uuid, String), &Locked)> =
        cursors.iter().filter(|(_, l)| l.changed).collect();
    if !citus() {
        return write_one(tx, statements, &changed, dead, None).await;
    }
    // On Citus, a partition at a time.
    for (partition, ks) in by_partition(&changed, |c| c.0.0) {
        let mine: Vec<(&(Uuid, String), &Locked)> = ks.iter().map(|&k| changed[k]).collect();
        let buried: Vec<DeadLetter> = dead
            .iter()
            .filter(|d| d.partition_id == partition)
            .cloned()
            .collect();
        write_one(tx, statements, &mine, &buried, Some(partition)).await?;
    }
    Ok(())
}

/// [`write_back`] of cursors (and their dead letters) all of `one` partition on Citus.
async fn write_one<C: GenericClient>(
    tx: &C,
    statements: &WriteStatements,
    changed: &[(&(Uuid, String), &Locked)],
    dead: &[DeadLetter],
    one: Option<Uuid>,
) -> Result<(), DbError> {
    if changed.is_empty() {
        return Ok(());
    }
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
    let d_id: Vec<Uuid> = dead.iter().map(|_| Uuid::now_v7()).collect();
    let d_qid: Vec<Uuid> = dead.iter().map(|d| d.queue_id).collect();
    let d_pid: Vec<Uuid> = dead.iter().map(|d| d.partition_id).collect();
    let d_group: Vec<&str> = dead.iter().map(|d| d.group.as_str()).collect();
    let d_pos: Vec<i64> = dead.iter().map(|d| d.pos).collect();
    let d_att: Vec<i32> = dead.iter().map(|d| d.attempts).collect();
    let d_err: Vec<Option<&str>> = dead.iter().map(|d| d.error.as_deref()).collect();
    let dead_params = with_partition(
        &[&d_id, &d_qid, &d_pid, &d_group, &d_pos, &d_att, &d_err],
        &one,
    );
    let update_params = with_partition(
        &[
            &u_pid, &u_group, &u_pos, &u_seg, &u_settled, &u_apos, &u_acnt, &u_lease, &u_rest,
        ],
        &one,
    );
    let write_dead = async {
        if dead.is_empty() {
            return Ok(());
        }
        tx.execute(&statements.dead, &dead_params).await.map(|_| ())
    };
    let (u, d) = tokio::join!(tx.execute(&statements.write, &update_params), write_dead);
    u?;
    d?;
    Ok(())
}

/// Whether the database is a Citus coordinator (its statements take one partition each).
fn citus() -> bool {
    crate::schema::citus::on()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_literals() {
        assert_eq!(array_literal([1i64, 2, 3].iter()), "{1,2,3}");
        assert_eq!(array_literal(Vec::<i64>::new().iter()), "{}");
    }
}
