//! The ack transaction's SQL: lock cursors, read their state with what they handed out,
//! append their next versions and the dead letters.

use std::collections::HashMap;
use std::sync::Arc;

use deadpool_postgres::{GenericClient, Pool, Transaction};
use tokio_postgres::Statement;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::{AckItem, AckJob, AckOutcome, AckRefusal, AckStatus, completed};
use crate::backend::{Backend, Forms};
use crate::catalog;
use crate::cursor::{self, Locked, locked_columns, locked_cursors};
use crate::db::{self, DbError, Pipelined};
use crate::dead_letter::{self, NewDeadLetter};
use crate::fusion::{self, Fuser, Runner};
use crate::metrics::Stage;

/// Positions of acked messages, found by transaction id: one descent of the transaction id
/// index per message. Acks read positions from their cursor's delivered range instead
/// ([`ACK_STATE_SQL`]); this finds the few that are not there.
macro_rules! lookup_sql {
    ($p:literal) => {
        concat!(
            "
SELECT i.ord, m.pos, m.seg
FROM unnest($1::uuid[], $2::text[]) WITH ORDINALITY AS i(partition_id, transaction_id, ord)
CROSS JOIN LATERAL (
    -- No ORDER BY: a transaction id is stored once per partition, and ordering by position
    -- would make the planner walk the partition in position order instead of using the
    -- (transaction_id, partition_id) index.
    SELECT m.pos, m.seg FROM ",
            crate::messages::partition_messages!($p),
            " AND m.transaction_id = i.transaction_id
    LIMIT 1
) m"
        )
    };
}

/// Positions of acked messages, found by transaction id (see [`lookup_sql!`]).
pub const LOOKUP_SQL: &str = lookup_sql!("i.partition_id");

/// [`STATE_SQL`] for acks, given each cursor once with the number of acks it receives: each
/// locked cursor's state, and the position, segment and
/// transaction id of its messages from just after its position up to the last one handed
/// out, the acked messages among them. One ordered read of the primary key per cursor costs
/// the database several times less than a descent of the transaction id index per acked
/// message. The read stops a little beyond as many messages as the request acks on that
/// cursor (and those already settled above its position), so acking one message of a large
/// lease reads a few rows; acks not found there are looked up by [`LOOKUP_SQL`].
macro_rules! ack_state_sql {
    (cursor: $cursor:expr; state: $state:expr; messages: $p:literal) => {
        concat!(
            locked_columns!(),
            ", r.pos, r.seg, r.transaction_id
FROM unnest($1::uuid[], $2::text[], $3::bigint[]) AS u(partition_id, consumer_group, acks)
",
            $cursor,
            "
",
            catalog::join_queue!("c.queue_id"),
            "
CROSS JOIN LATERAL ",
            $state,
            " s
CROSS JOIN LATERAL (
    SELECT array_agg(m.pos) AS pos, array_agg(m.seg) AS seg,
           array_agg(m.transaction_id) AS transaction_id
    FROM ",
            crate::messages::partition_messages!($p),
            "
      AND m.pos > s.cursor_pos
      AND m.pos <= least(s.lease_upto,
                         s.cursor_pos + 2 * u.acks + 8 + cardinality(s.settled))
      AND m.seg >= s.cursor_seg
) r"
        )
    };
}

/// The acks' state read (see [`ack_state_sql!`]).
pub const ACK_STATE_SQL: &str = ack_state_sql!(
    cursor: cursor::queue_of_cursor!();
    state: cursor::state_of!("u.partition_id", "u.consumer_group");
    messages: "u.partition_id"
);

/// The look-up of acked messages; on Citus of one partition (`$3`), named to the messages so
/// that Citus plans it on that partition's worker (callers split their work by partition).
const LOOKUP: Forms = Forms {
    postgres: LOOKUP_SQL,
    citus: lookup_sql!("i.partition_id AND m.partition_id = $3"),
};

/// The acks' state read; on Citus of one partition (`$4`), named to every distributed table
/// (the cursors, their state by a subquery in place of `comb.cursor_state`, the messages).
const ACK_STATE: Forms = Forms {
    postgres: ACK_STATE_SQL,
    citus: ack_state_sql!(
        cursor: cursor::queue_of_cursor!(one "
               AND c.partition_id = $4");
        state: cursor::state_in_partition!("u.partition_id", "u.consumer_group", one "$4");
        messages: "u.partition_id AND m.partition_id = $4"
    ),
};

/// The queues of the partitions that exist among `partitions` (a probe of the partitions'
/// primary key each): what a token limited to some queues is checked against before it acks.
pub(crate) async fn queues_of(pool: &Pool, partitions: &[Uuid]) -> Result<Vec<String>, DbError> {
    let client = pool.get().await?;
    let names = client.prepare_cached(catalog::NAMES_SQL).await?;
    Ok(client
        .query(&names, &[&partitions])
        .await?
        .iter()
        .map(|r| r.get("queue"))
        .collect())
}

/// Starts the ack workers.
pub(crate) fn start(
    pool: Pool,
    backend: Backend,
    router: db::route::Router,
    workers: usize,
    max_items: usize,
    stage: Arc<Stage>,
) -> Fuser<AckJob> {
    let run: Runner<AckJob> = Arc::new(move |jobs| {
        let (pool, router) = (pool.clone(), router.clone());
        Box::pin(async move {
            let items: Vec<&AckItem> = jobs.iter().flat_map(|j| j.items.iter()).collect();
            let result = settle(&pool, backend, &router, &items).await;
            fusion::reply_all(jobs, result, |j| (j.items.len(), j.reply));
        })
    });
    Fuser::start(workers, max_items, |j: &AckJob| j.items.len(), run, stage)
}

/// The consumer path's planner settings for one transaction ([`db::consumer_plans`]): what
/// acks inside a client's transaction run under, as the consumer pool's connections do.
pub const PLANS: &str = db::consumer_plans!();

/// Applies acks; one outcome per item, in order. Cursors whose every ack completes a
/// message under their live lease are judged in SQL in one round trip
/// ([`completed::settle`]); the others, and any such cursor SQL could not judge, take the
/// general path ([`settle_judged_here`]).
async fn settle(
    pool: &Pool,
    backend: Backend,
    router: &db::route::Router,
    items: &[&AckItem],
) -> Result<Vec<AckOutcome>, DbError> {
    let chosen = completed::completing(items);
    let mut outcomes: Vec<Option<AckOutcome>> = (0..items.len()).map(|_| None).collect();
    if !chosen.is_empty() && !backend.runs_data_path_functions() {
        settle_on_workers(pool, router, items, &chosen, &mut outcomes).await?;
    }
    let mut client = None;
    if !chosen.is_empty() && backend.runs_data_path_functions() {
        let only = db::route::only(items, |i| i.partition_id);
        let c = router.consumer(pool, only).await.get().await?;
        // Each path prepares its statements before its pipeline: a statement still being
        // prepared when COMMIT is sent would run after it, outside the transaction.
        let judge = c.prepare_cached(completed::COMPLETE_CALL).await?;
        outcomes = completed::settle(&c, &judge, items, &chosen, None).await?;
        client = Some(c);
    }
    let rest: Vec<usize> = (0..items.len())
        .filter(|&k| outcomes[k].is_none())
        .collect();
    // On Citus, a transaction per partition, on its worker: one over several would commit
    // in two phases across their workers.
    let mut rests: Vec<Vec<usize>> = Vec::new();
    if backend.commits_each_partition_alone() {
        let mut by_partition: HashMap<Uuid, Vec<usize>> = HashMap::new();
        for k in rest {
            by_partition
                .entry(items[k].partition_id)
                .or_default()
                .push(k);
        }
        rests.extend(by_partition.into_values());
    } else if !rest.is_empty() {
        rests.push(rest);
    }
    for rest in rests {
        let only = db::route::only(&rest, |&k| items[k].partition_id);
        let client = match client.take() {
            Some(client) => client,
            None => router.consumer(pool, only).await.get().await?,
        };
        let reads = ReadStatements::prepare(&client, backend).await?;
        let writes = WriteStatements::prepare(&client, backend).await?;
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

/// On Citus, the acks SQL can judge ([`completed`]) as a transaction per partition, each one
/// call run on its partition's worker: the calls of each worker pipelined on one connection
/// of its own (on the direct route; else all through the coordinator's), the workers at
/// once. An outcome per judged item goes into `outcomes`.
async fn settle_on_workers(
    pool: &Pool,
    router: &db::route::Router,
    items: &[&AckItem],
    chosen: &[usize],
    outcomes: &mut [Option<AckOutcome>],
) -> Result<(), DbError> {
    let mut by_partition: HashMap<Uuid, Vec<usize>> = HashMap::new();
    for &k in chosen {
        by_partition
            .entry(items[k].partition_id)
            .or_default()
            .push(k);
    }
    let groups = router
        .consumers_of_each(pool, by_partition.keys().copied())
        .await;
    let by_partition = &by_partition;
    let per_worker = groups.into_iter().map(|(pool, partitions)| async move {
        let client = pool.get().await?;
        let judge = client.prepare_cached(completed::JUDGE_CITUS_CALL).await?;
        let calls = partitions.iter().map(|&p| {
            let (client, judge) = (&client, &judge);
            async move {
                let ks = &by_partition[&p];
                let part = completed::settle(client, judge, items, ks, Some(p)).await?;
                Ok::<_, DbError>((ks, part))
            }
        });
        futures_util::future::try_join_all(calls).await
    });
    for worker in futures_util::future::join_all(per_worker).await {
        for (ks, mut part) in worker? {
            for &k in ks {
                outcomes[k] = part[k].take();
            }
        }
    }
    Ok(())
}

/// Applies acks in one transaction of their own, in two round trips: BEGIN with the reads,
/// then the writes with COMMIT. The rules run here, on the state read
/// ([`Cursor::apply`](crate::cursor::Cursor::apply)).
async fn settle_judged_here(
    client: &deadpool_postgres::Client,
    reads: &ReadStatements,
    writes: &WriteStatements,
    items: &[&AckItem],
) -> Result<Vec<AckOutcome>, DbError> {
    let p = Pipelined::on(client);
    let (begin, read) = tokio::join!(p.begin(), judge(&p, reads, items, false));
    let judged = match begin.map_err(DbError::from).and(read) {
        Ok(judged) => judged,
        Err(e) => {
            p.roll_back().await;
            return Err(e);
        }
    };
    // A failed write makes the pipelined COMMIT roll back.
    let (written, commit) = tokio::join!(
        write_back(&p, writes, &judged.cursors, &judged.dead),
        p.commit(),
    );
    written?;
    commit?;
    Ok(judged.outcomes)
}

/// Sets the consumer path's plans ([`PLANS`]) for the rest of the caller's transaction; on
/// Citus custom plans, the only ones it routes to one worker (see `db`).
async fn plans_in(tx: &Transaction<'_>, backend: Backend) -> Result<(), DbError> {
    tx.batch_execute(PLANS).await?;
    if backend.plans_for_each_execution() {
        tx.batch_execute("SET LOCAL plan_cache_mode = force_custom_plan")
            .await?;
    }
    Ok(())
}

/// Applies acks inside the caller's transaction; one outcome per item, in order.
/// Refused items change nothing; the caller decides whether to commit the rest. The rest
/// of the transaction runs with the consumer path's plans ([`db::consumer_plans`]).
pub(crate) async fn settle_in(
    tx: &Transaction<'_>,
    backend: Backend,
    items: &[&AckItem],
    strict: bool,
) -> Result<Vec<AckOutcome>, DbError> {
    // Cached plans of these statements are shared with the ack path's own transactions:
    // they are made under the same settings wherever they are made.
    plans_in(tx, backend).await?;
    let reads = ReadStatements::prepare(tx, backend).await?;
    let writes = WriteStatements::prepare(tx, backend).await?;
    let judged = judge(tx, &reads, items, strict).await?;
    write_back(tx, &writes, &judged.cursors, &judged.dead).await?;
    Ok(judged.outcomes)
}

/// What [`settle_run_in`] did to its cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunSettled {
    /// The transaction ids of the messages it completed, in position order.
    pub(crate) completed: Vec<String>,
    /// The lease ended (every message of it settled, or the rest given back).
    pub(crate) lease_released: bool,
    /// The source queue's name, for the counters.
    pub(crate) queue_name: Option<String>,
}

/// How long the rest of a lease still runs, in milliseconds, read after the cursor's lock.
const LEASE_LEFT_SQL: &str = concat!(
    "
SELECT greatest(0, ceil(extract(epoch FROM s.lease_expires_at - now()) * 1000))::bigint
FROM ",
    cursor::state_of!("$1", "$2"),
    " s"
);

/// Completes, inside the caller's transaction, the first `count` messages that the live
/// lease of (`partition`, `group`) handed out and nobody settled yet, in position order:
/// the ordered acks of a streams cycle, judged by the same rules as every ack
/// ([`Cursor::apply`], strict: every one under the live lease, named by `lease_id` or not).
/// Messages of the lease left unsettled are given back without counting an attempt, as a
/// `retry` ack gives them: with `release` at once, otherwise with the partition resting until
/// the lease would have ended, so that nobody gets them earlier and they come back then, in
/// order (a gate holding a partition back keeps its order and spends no attempts).
pub(crate) async fn settle_run_in(
    tx: &Transaction<'_>,
    backend: Backend,
    partition: Uuid,
    group: &str,
    count: usize,
    lease_id: Option<Uuid>,
    release: bool,
) -> Result<Result<RunSettled, AckRefusal>, DbError> {
    plans_in(tx, backend).await?;
    let reads = ReadStatements::prepare(tx, backend).await?;
    let writes = WriteStatements::prepare(tx, backend).await?;
    let pids = vec![partition];
    let groups = vec![group];
    let counts = vec![count as i64];
    let one = backend.one_partition(partition);
    let lock_params: [&(dyn ToSql + Sync); 2] = [&pids, &groups];
    let state_params = crate::schema::citus::with_partition(&[&pids, &groups, &counts], &one);
    let names_params: [&(dyn ToSql + Sync); 1] = [&pids];
    // Pipelined: one round trip. The state is read after the lock statement has finished.
    let (lock, locked, named) = tokio::join!(
        tx.query(&reads.lock, &lock_params),
        tx.query(&reads.state, &state_params),
        tx.query(&reads.names, &names_params),
    );
    lock?;
    let locked = locked?;
    let queue_name: Option<String> = named?.first().map(|r| r.get("queue"));
    let Some(row) = locked.first() else {
        return Ok(Err(AckRefusal::NotConsumed));
    };
    let mut handed: Vec<(i64, i32, String)> = match (
        row.get::<_, Option<Vec<i64>>>(12),
        row.get::<_, Option<Vec<i32>>>(13),
        row.get::<_, Option<Vec<String>>>(14),
    ) {
        (Some(p), Some(s), Some(t)) => p
            .into_iter()
            .zip(s)
            .zip(t)
            .map(|((p, s), t)| (p, s, t))
            .collect(),
        _ => Vec::new(),
    };
    handed.sort_unstable_by_key(|h| h.0);
    let mut cursors = locked_cursors(&locked);
    let Some(state) = cursors.get_mut(&(partition, group.to_string())) else {
        return Ok(Err(AckRefusal::NotConsumed));
    };
    state.cursor.begin_request();
    if state.cursor.request_lease.is_none() {
        return Ok(Err(AckRefusal::LeaseInvalid));
    }
    handed.retain(|h| state.cursor.settled.binary_search(&h.0).is_err());
    if handed.len() < count {
        return Ok(Err(AckRefusal::NotDelivered));
    }
    let mut completed = Vec::with_capacity(count);
    let mut lease_released = false;
    for (pos, seg, txid) in handed.drain(..count) {
        match state.cursor.apply(
            pos,
            seg,
            AckStatus::Completed,
            lease_id,
            &state.options,
            true,
        ) {
            Ok(applied) => lease_released |= applied.lease_released,
            Err(refusal) => return Ok(Err(refusal)),
        }
        completed.push(txid);
    }
    if let Some((pos, seg, _)) = handed.first().filter(|_| state.cursor.lease_id.is_some()) {
        let rest_ms = if release {
            None
        } else {
            let left = tx.query_one(LEASE_LEFT_SQL, &[&partition, &group]).await?;
            left.get::<_, Option<i64>>(0).map(|ms| ms.max(0) as u64)
        };
        match state
            .cursor
            .apply(*pos, *seg, AckStatus::Retry, lease_id, &state.options, true)
        {
            Ok(applied) => lease_released |= applied.lease_released,
            Err(refusal) => return Ok(Err(refusal)),
        }
        state.cursor.rest_ms = rest_ms;
    }
    state.changed = true;
    write_back(tx, &writes, &cursors, &[]).await?;
    Ok(Ok(RunSettled {
        completed,
        lease_released,
        queue_name,
    }))
}

/// Whether the (partition, group) cursor holds a live lease, its row locked for the rest of
/// `tx`: claims skip a locked cursor, so no lease begins before `tx` ends. Streams' cycles
/// without an ack ask this, so that they never change state a lease holder has read.
pub(crate) async fn lease_live_in(
    tx: &Transaction<'_>,
    backend: Backend,
    partition: Uuid,
    group: &str,
) -> Result<bool, DbError> {
    plans_in(tx, backend).await?;
    let reads = ReadStatements::prepare(tx, backend).await?;
    let pids = vec![partition];
    let groups = vec![group];
    let counts = vec![0_i64];
    let one = backend.one_partition(partition);
    let lock_params: [&(dyn ToSql + Sync); 2] = [&pids, &groups];
    let state_params = crate::schema::citus::with_partition(&[&pids, &groups, &counts], &one);
    let (lock, locked) = tokio::join!(
        tx.query(&reads.lock, &lock_params),
        tx.query(&reads.state, &state_params),
    );
    lock?;
    let locked = locked?;
    let mut cursors = locked_cursors(&locked);
    Ok(cursors
        .get_mut(&(partition, group.to_string()))
        .is_some_and(|state| {
            state.cursor.begin_request();
            state.cursor.request_lease.is_some()
        }))
}

/// The statements that read what acks are judged against.
struct ReadStatements {
    lookup: Statement,
    lock: Statement,
    state: Statement,
    names: Statement,
    backend: Backend,
}

impl ReadStatements {
    async fn prepare<C: GenericClient>(
        client: &C,
        backend: Backend,
    ) -> Result<ReadStatements, DbError> {
        Ok(ReadStatements {
            lookup: client.prepare_cached(backend.sql(&LOOKUP)).await?,
            lock: client.prepare_cached(backend.sql(&cursor::LOCK)).await?,
            state: client.prepare_cached(backend.sql(&ACK_STATE)).await?,
            names: client.prepare_cached(catalog::NAMES_SQL).await?,
            backend,
        })
    }
}

/// Acks judged: their outcomes, and the cursor versions and dead letters to write.
struct Judged {
    outcomes: Vec<AckOutcome>,
    cursors: HashMap<(Uuid, String), Locked>,
    dead: Vec<NewDeadLetter>,
}

/// Reads the cursors' state (locked first) with the positions of the messages they handed
/// out, in one pipelined round trip (a second looks up acked messages not found there), and
/// applies the acks to the cursors in memory.
async fn judge<C: db::Prepared>(
    tx: &C,
    statements: &ReadStatements,
    items: &[&AckItem],
    strict: bool,
) -> Result<Judged, DbError> {
    if statements.backend.statements_span_partitions() {
        return judge_one(tx, statements, items, strict, None).await;
    }
    // On Citus, a partition at a time; outcomes put back in the items' order.
    let mut outcomes: Vec<Option<AckOutcome>> = (0..items.len()).map(|_| None).collect();
    let mut cursors = HashMap::new();
    let mut dead = Vec::new();
    for (partition, ks) in crate::schema::citus::by_partition(items, |i| i.partition_id) {
        let mine: Vec<&AckItem> = ks.iter().map(|&k| items[k]).collect();
        let judged = judge_one(
            tx,
            statements,
            &mine,
            strict,
            statements.backend.one_partition(partition),
        )
        .await?;
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
async fn judge_one<C: db::Prepared>(
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
    let state_params = crate::schema::citus::with_partition(&[&pids, &groups, &counts], &one);
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
        partition_names.insert(r.get("id"), (r.get("partition"), r.get("queue")));
    }

    let mut outcomes = Vec::with_capacity(items.len());
    let mut dead: Vec<NewDeadLetter> = Vec::new();
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
        let Some(state) = cursors.get_mut(&(item.partition_id, item.group.to_string())) else {
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
                    dead.push(NewDeadLetter {
                        queue_id: state.queue_id,
                        partition_id: item.partition_id,
                        group: item.group.to_string(),
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
async fn positions<C: db::Prepared>(
    tx: &C,
    lookup: &Statement,
    items: &[&AckItem],
    locked: &[tokio_postgres::Row],
    one: Option<Uuid>,
) -> Result<Vec<Option<(i64, i32)>>, DbError> {
    let mut delivered: HashMap<(Uuid, &str), (i64, i32)> = HashMap::new();
    for r in locked {
        let partition_id: Uuid = r.get("partition_id");
        // NULL when the range is empty.
        let (Some(pos), Some(seg), Some(txids)) = (
            r.get::<_, Option<Vec<i64>>>("pos"),
            r.get::<_, Option<Vec<i32>>>("seg"),
            r.get::<_, Option<Vec<&str>>>("transaction_id"),
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
    let params = crate::schema::citus::with_partition(&[&pids, &txids], &one);
    for r in tx.query(lookup, &params).await? {
        let ord: i64 = r.get("ord");
        position[missing[(ord - 1) as usize]] = Some((r.get("pos"), r.get("seg")));
    }
    Ok(position)
}

/// The statements that write cursor versions and dead letters.
pub(crate) struct WriteStatements {
    states: cursor::StateWrites,
    dead: dead_letter::Writes,
}

impl WriteStatements {
    pub(crate) async fn prepare<C: GenericClient>(
        client: &C,
        backend: Backend,
    ) -> Result<WriteStatements, DbError> {
        Ok(WriteStatements {
            states: cursor::StateWrites::prepare(client, backend).await?,
            dead: dead_letter::Writes::prepare(client, backend).await?,
        })
    }
}

/// Appends the next version of changed cursors and writes new dead letters (pipelined: one
/// round trip, no statement prepared on the way, so a COMMIT pipelined after it follows
/// them). The cursors must have been locked in this transaction.
pub(crate) async fn write_back<C: db::Prepared>(
    tx: &C,
    statements: &WriteStatements,
    cursors: &HashMap<(Uuid, String), Locked>,
    dead: &[NewDeadLetter],
) -> Result<(), DbError> {
    let (u, d) = tokio::join!(
        statements.states.write(tx, cursors),
        statements.dead.write(tx, dead)
    );
    u?;
    d?;
    Ok(())
}
