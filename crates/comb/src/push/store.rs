//! Storing pushed messages: durably, in order, once.
//!
//! Concurrent push requests are fused into one transaction per batch:
//!
//! 1. lock the rows of every partition in the batch, in id order (no deadlocks between batches);
//! 2. store the messages at positions `head + 1, head + 2, …`, where the head is the newest
//!    position stored (what `comb.partition_head` answers, written inline by `messages::head_pos!`).
//!    Nothing is updated: the partition row is only locked.
//!
//! Step 2 takes one of three shapes. From 64 messages on, the heads are read, and for items
//! with a producer's transaction id the ids each partition already holds (a statement per
//! partition), and the rest are copied in with binary `COPY`, which costs the database about
//! half as much per row, in two round trips. Under 64, items with a producer's transaction id
//! go through an insert that first skips ids the partition already holds (on Citus, a read
//! of the held ids per partition and then the plain append, so every statement names one
//! shard); batches without such ids cannot repeat a stored message and are appended by a
//! plain `INSERT … SELECT unnest(…)`. Those two are one call on one PostgreSQL
//! (`comb.store_batch`, with the hand-off), and on Citus BEGIN, lock, insert and COMMIT in
//! one round trip.
//!
//! Whatever reads the heads is a statement after the lock, so its snapshot sees every earlier
//! push of those partitions, and positions in a partition are committed in the order they are
//! assigned. A reader can therefore never pass a position that commits later: nothing is
//! skipped however pushes race (the defect of cursors taken from transaction start time).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use bytes::{BufMut, Bytes, BytesMut};
use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use futures_util::{SinkExt, pin_mut};
use tokio::sync::oneshot;
use tokio_postgres::types::{IsNull, ToSql, Type};
use tokio_postgres::{Row, Statement};
use uuid::Uuid;

use super::handoff;
use crate::backend::{Backend, Forms};
use crate::db::{self, DbError, Pipelined, Prepared};
use crate::fusion::{self, Fuser, Runner};
use crate::messages::insert::{
    COPY_SQL, COPY_WITH_SUB_SQL, HEADS_CITUS_SQL, HEADS_SQL, INSERT_SQL, PRIOR_BEGIN,
    PRIOR_CITUS_BEGIN, PRIOR_CITUS_SQL, PRIOR_SQL,
};
use crate::metrics::Stage;
use crate::schema::citus::Placement;
use crate::wake::Wake;
use futures_util::future::join_all;

/// One message ready to store: names resolved, payload validated.
#[derive(Debug, Clone)]
pub(crate) struct NewMessage {
    pub(crate) queue: Arc<str>,
    pub(crate) queue_id: Uuid,
    /// Partition name, to resolve again if the partition vanished (shared by the request's
    /// messages to that partition).
    pub(crate) partition: Arc<str>,
    pub(crate) partition_id: Uuid,
    /// The producer's transaction id, if it gave one: only those can be duplicates. Without
    /// one the message id stands in (see [`NewMessage::transaction_id`]).
    pub(crate) client_transaction_id: Option<String>,
    pub(crate) message_id: Uuid,
    pub(crate) trace_id: Option<String>,
    /// The subject of the token the message was pushed with, when tokens are required.
    pub(crate) producer_sub: Option<Arc<str>>,
    /// The payload's JSON text: a slice of the request body, never copied on the way in.
    pub(crate) payload: Bytes,
}

impl NewMessage {
    /// The transaction id stored with the message: the producer's, or else the message id.
    pub(crate) fn transaction_id(&self) -> TransactionId<'_> {
        match &self.client_transaction_id {
            Some(t) => TransactionId::Client(t),
            None => TransactionId::Own(self.message_id),
        }
    }
}

/// A message's transaction id as stored and answered. The broker's own ids are the message
/// id's text, written out where it is needed instead of kept as a string per message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TransactionId<'a> {
    /// Given by the producer.
    Client(&'a str),
    /// The message id, in its hyphenated lower-case form.
    Own(Uuid),
}

impl TransactionId<'_> {
    /// Calls `f` with the id's text (no allocation either way).
    pub(crate) fn with_str<R>(&self, f: impl FnOnce(&str) -> R) -> R {
        match self {
            TransactionId::Client(t) => f(t),
            TransactionId::Own(id) => f(id.hyphenated().encode_lower(&mut Uuid::encode_buffer())),
        }
    }
}

impl serde::Serialize for TransactionId<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.with_str(|t| s.serialize_str(t))
    }
}

impl ToSql for TransactionId<'_> {
    fn to_sql(
        &self,
        _: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        self.with_str(|t| out.extend_from_slice(t.as_bytes()));
        Ok(IsNull::No)
    }

    tokio_postgres::types::accepts!(TEXT, VARCHAR);
    tokio_postgres::types::to_sql_checked!();
}

/// What became of one pushed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stored {
    /// Stored now under this message id.
    Queued(Uuid),
    /// The partition already held this transaction id; the first message's id.
    Duplicate(Uuid),
    /// The partition disappeared (its queue was deleted) before the message was stored.
    PartitionGone,
}

/// A push request waiting for its batch.
pub(crate) struct PushJob {
    /// Shared with the request handler, which answers from it after the batch.
    pub(crate) messages: Arc<Vec<NewMessage>>,
    pub(crate) reply: oneshot::Sender<Result<Vec<Stored>, Arc<DbError>>>,
}

/// The partitions' heads a copy starts after: over the batch's partitions, or on Citus one
/// partition's (a statement per partition, each on its worker).
const HEADS: Forms = Forms {
    postgres: HEADS_SQL,
    citus: HEADS_CITUS_SQL,
};

/// The read of the ids a partition holds among a checked batch's ([`PRIOR_SQL`]).
const PRIOR: Forms = Forms {
    postgres: PRIOR_SQL,
    citus: PRIOR_CITUS_SQL,
};

/// The start of the transaction that reads [`PRIOR`] ([`PRIOR_BEGIN`]).
const PRIOR_START: Forms = Forms {
    postgres: PRIOR_BEGIN,
    citus: PRIOR_CITUS_BEGIN,
};

const APPEND_SQL: &str =
    crate::messages::insert::append_sql!(crate::catalog::partitions_among!("$7"));

/// [`APPEND_SQL`] on Citus: the heads' reads name the batch's partitions (`$7`) to the
/// distributed tables in so many words, so Citus reads only their shards — one, as pushes
/// are fused per shard — instead of every shard of the messages.
const APPEND: Forms = Forms {
    postgres: APPEND_SQL,
    citus: crate::messages::insert::append_sql!(
        head: crate::messages::head_pos!("p.id", among "$7");
        crate::catalog::partitions_among!("$7")
    ),
};

/// A batch on one PostgreSQL in one call, `comb.store_batch`, a transaction of its own: the
/// partitions' lock, the store ([`APPEND_SQL`], or [`INSERT_SQL`] when `a_checks` says which
/// messages carry a producer's transaction id), and with pops offered the batch's messages
/// (`o_…`), the hand-off ([`handoff::HAND_OFF_FUNCTION`]; one offer's steps inline,
/// [`handoff::GRANT_ONE`]), each a statement of its own whose
/// snapshot follows the one before. One statement where `BEGIN`, the lock, the insert, the
/// hand-off and `COMMIT` were five: each costs the database a message exchange, a snapshot
/// and a send. Its rows: the partitions locked (plain append: `partition_id` alone), each
/// checked message's outcome in order (`ord`, `prior_id`, `stored`), and the leases handed off
/// (`consumer_group` set). Its statements are planned as the consumer path's are
/// ([`db::function_plans`]): the lock's plan for an array of partitions was otherwise made
/// again on every call. A push of one message, the commonest at light load, is stored by
/// [`APPEND_ONE_SQL`] (and its duplicate check, [`crate::messages::insert::prior_of!`]), with
/// the same outcomes. Made on every start by `comb migrate`
/// ([`crate::schema::install_functions`]); not on Citus.
pub(crate) static STORE_FUNCTION: LazyLock<String> = LazyLock::new(|| {
    let lock = with_names(crate::catalog::LOCK_PARTITIONS_SQL, &["a_lock"]);
    let append = with_names(
        APPEND_SQL,
        &[
            "a_partitions",
            "a_ranks",
            "a_ids",
            "a_txids",
            "a_traces",
            "a_payloads",
            "a_lock",
            "a_subs",
        ],
    );
    let insert = with_names(
        crate::messages::insert::insert_sql!(
            "SELECT NULL::uuid, i.ord, pr.message_id, s.message_id IS NOT NULL, NULL::text,
       NULL::uuid, NULL::bigint, NULL::uuid, NULL::timestamptz"
        ),
        &[
            "a_partitions",
            "a_txids",
            "a_ids",
            "a_traces",
            "a_payloads",
            "a_checks",
            "a_subs",
        ],
    );
    format!(
        "
CREATE FUNCTION {name}(a_lock uuid[], a_partitions uuid[],
    a_ranks int8[], a_ids uuid[], a_txids text[], a_traces text[], a_payloads bytea[],
    a_subs text[], a_checks bool[], o_partitions uuid[], o_groups text[], o_leases uuid[],
    o_lengths float8[], o_batches int8[])
RETURNS TABLE (partition_id uuid, ord bigint, prior_id uuid, stored boolean,
    consumer_group text, lease_id uuid, pos bigint, message_id uuid, created_at timestamptz)
LANGUAGE plpgsql {plans} AS $body$
#variable_conflict use_column
DECLARE
    one_prior uuid;
{grant_declare}BEGIN
    IF a_checks IS NULL THEN
        RETURN QUERY SELECT l.id, NULL::bigint, NULL::uuid, NULL::boolean, NULL::text,
            NULL::uuid, NULL::bigint, NULL::uuid, NULL::timestamptz
            FROM ({lock}) l;
        IF cardinality(a_ids) > 1 THEN
            {append};
        ELSIF FOUND THEN
            {append_one};
        END IF;
    ELSE
        PERFORM 1 FROM ({lock}) l;
        IF cardinality(a_ids) > 1 THEN
            RETURN QUERY {insert};
        ELSE
            IF a_checks[1] THEN
                one_prior := ({prior_one});
            END IF;
            IF one_prior IS NULL THEN
                {append_one};
            END IF;
            RETURN QUERY SELECT NULL::uuid, 1::bigint, one_prior, one_prior IS NULL,
                NULL::text, NULL::uuid, NULL::bigint, NULL::uuid, NULL::timestamptz;
        END IF;
    END IF;
    IF cardinality(o_partitions) = 1 THEN
{grant_one}
    ELSIF cardinality(o_partitions) > 0 THEN
        RETURN QUERY SELECT h.partition_id, NULL::bigint, NULL::uuid, NULL::boolean,
            h.consumer_group, h.lease_id, h.pos, h.message_id, h.created_at
            FROM {hand_off}(o_partitions, o_groups, o_leases, o_lengths, o_batches, a_ids) h;
    END IF;
END $body$",
        name = STORE_NAME,
        hand_off = handoff::HAND_OFF_NAME,
        plans = db::function_plans(),
        append_one = APPEND_ONE_SQL,
        grant_declare = handoff::GRANT_ONE_DECLARE,
        grant_one = handoff::GRANT_ONE,
        prior_one = crate::messages::insert::prior_of!("a_partitions[1]", "a_txids[1]"),
    )
});

/// A push of one message in [`STORE_FUNCTION`]: its row as `INSERT … VALUES` of the
/// function's arguments, where a batch unnests them and joins their partitions' heads.
const APPEND_ONE_SQL: &str = crate::messages::insert::append_one_sql!(
    "a_partitions[1]",
    "a_ranks[1]",
    "a_ids[1]",
    "a_txids[1]",
    "a_traces[1]",
    "a_payloads[1]",
    "a_subs[1]"
);

/// [`STORE_FUNCTION`]'s name in this build's set of functions.
pub(crate) const STORE_NAME: &str = crate::schema::versioned!("comb.store_batch");

/// The call of [`STORE_FUNCTION`].
const STORE_CALL: &str = concat!(
    "SELECT * FROM ",
    crate::schema::versioned!("comb.store_batch"),
    "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
);

/// `sql` with its parameters `$1`, `$2`… named `names[0]`, `names[1]`…: a statement's text
/// inside a function whose arguments come in another order.
fn with_names(sql: &str, names: &[&str]) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            out.push('$');
        } else {
            let k: usize = after[..digits].parse().expect("a parameter's number");
            out.push_str(names[k - 1]);
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

/// Rows in PostgreSQL's binary `COPY` format for `COPY_SQL`, encoded straight into one
/// buffer: one pass over the batch, no future or dynamic dispatch per field.
struct CopyRows {
    buf: BytesMut,
    /// Whether rows carry the producer's subject ([`COPY_WITH_SUB_SQL`]).
    with_sub: bool,
}

/// Encoded rows are handed to the connection in pieces of about this size, so a batch of
/// large payloads is not held twice in memory.
const COPY_CHUNK: usize = 1 << 20;

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01 00:00 UTC).
const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;

/// A time as binary `COPY` writes a `timestamptz`: microseconds since 2000-01-01 UTC.
fn copy_time(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros() - PG_EPOCH_UNIX_MICROS
}

impl CopyRows {
    /// The signature, no flags, no header extension.
    fn new(rows: usize, with_sub: bool) -> CopyRows {
        let mut buf = BytesMut::with_capacity((19 + rows * 160).min(COPY_CHUNK));
        buf.put_slice(b"PGCOPY\n\xff\r\n\0");
        buf.put_i32(0);
        buf.put_i32(0);
        CopyRows { buf, with_sub }
    }

    /// One message at `pos` of segment `seg`, stamped `at` (see [`copy_time`]).
    fn row(&mut self, m: &NewMessage, pos: i64, seg: i32, at: i64) {
        let b = &mut self.buf;
        b.put_i16(if self.with_sub { 9 } else { 8 });
        b.put_i32(16);
        b.put_slice(m.partition_id.as_bytes());
        b.put_i32(8);
        b.put_i64(pos);
        b.put_i32(4);
        b.put_i32(seg);
        b.put_i32(16);
        b.put_slice(m.message_id.as_bytes());
        m.transaction_id().with_str(|t| Self::text(b, t.as_bytes()));
        match &m.trace_id {
            Some(t) => Self::text(b, t.as_bytes()),
            None => b.put_i32(-1),
        }
        Self::text(b, &m.payload);
        b.put_i32(8);
        b.put_i64(at);
        if self.with_sub {
            match &m.producer_sub {
                Some(s) => Self::text(b, s.as_bytes()),
                None => b.put_i32(-1),
            }
        }
    }

    fn text(b: &mut BytesMut, bytes: &[u8]) {
        b.put_i32(i32::try_from(bytes.len()).expect("fields are far below 2 GiB"));
        b.put_slice(bytes);
    }

    /// The rows and the trailer.
    fn finish(mut self) -> Bytes {
        self.buf.put_i16(-1);
        self.buf.freeze()
    }
}

/// Batches of at least this many messages (and no duplicate check) are copied in rather than
/// inserted: `COPY` writes rows in bulk (one WAL record per page), about half the database's
/// work per row of an `INSERT … SELECT`, at the price of one more round trip.
const COPY_MIN_ROWS: usize = 64;

/// Push workers keyed by [`shard_key`] (or [`worker_key`]), a batch weighing its messages.
fn keyed(
    workers: usize,
    max_items: usize,
    run: Runner<PushJob>,
    stage: Arc<Stage>,
) -> Fuser<PushJob> {
    Fuser::start_keyed(
        workers,
        max_items,
        |j: &PushJob| j.messages.len(),
        run,
        stage,
    )
}

/// Starts the push workers.
pub(crate) fn start(
    pool: Pool,
    backend: Backend,
    wake: Arc<Wake>,
    workers: usize,
    max_items: usize,
    stage: Arc<Stage>,
) -> Fuser<PushJob> {
    let run: Runner<PushJob> = Arc::new(move |jobs| {
        let pool = pool.clone();
        let wake = wake.clone();
        Box::pin(async move { run_batch(&pool, backend, &wake, jobs).await })
    });
    keyed(workers, max_items, run, stage)
}

/// The shard key of a push. Pushes lighter than [`COPY_MIN_ROWS`] all share one worker:
/// every transaction pays for its commit, and one transaction of 30 small pushes costs the
/// database far less than four of 8, so small pushes ride together, one transaction at a
/// time, in batches that grow with the load. Heavier pushes are keyed by their lowest
/// partition id, so pushes to one partition share a worker and batches in flight at once
/// rarely wait for each other's partition locks. A push spanning partitions stays one
/// transaction (and may then wait, briefly, for another worker).
pub(crate) fn shard_key(messages: &[NewMessage]) -> u64 {
    if messages.len() < COPY_MIN_ROWS {
        return 0;
    }
    messages
        .iter()
        .map(|m| m.partition_id)
        .min()
        .map_or(0, |id| {
            let v = id.as_u128();
            (v as u64) ^ ((v >> 64) as u64)
        })
}

/// A batch's store (`$store`, an expression awaited anew on every attempt), run again
/// (after a short pause) when the database rolled the batch back to break a deadlock or a
/// serialization conflict: nothing of it was kept, and the producers waiting on it would
/// otherwise get a 500 for a conflict that was not theirs. (A macro: an async closure
/// borrowing the batch would not make a `Send` future.)
macro_rules! again_on_conflict {
    ($store:expr) => {{
        let mut attempt = 1;
        loop {
            match $store {
                Err(e) if attempt < STORE_ATTEMPTS && e.is_rolled_back_conflict() => {
                    tracing::warn!(attempt, error = %e, "push batch rolled back by a conflict; storing it again");
                    tokio::time::sleep(std::time::Duration::from_millis(20 * u64::from(attempt)))
                        .await;
                    attempt += 1;
                }
                result => break result,
            }
        }
    }};
}

/// Starts the fuser of one Citus worker's pushes on the direct route ([`crate::db::route`]):
/// a batch there fuses pushes to any of the worker's shards into one transaction of that
/// worker. Each shard's messages are locked and appended by statements of that shard alone
/// (router statements, run by the worker's local execution), so the transaction touches no
/// other node and commits in one phase, while its `BEGIN`, `COMMIT` and round trip are paid
/// once per worker batch instead of once per shard: with a worker's shards many and pushes
/// small, a batch per shard held one or two pushes.
pub(crate) fn start_on_worker(
    pool: Pool,
    backend: Backend,
    wake: Arc<Wake>,
    placement: Arc<Placement>,
    workers: usize,
    max_items: usize,
    stage: Arc<Stage>,
) -> Fuser<PushJob> {
    let run: Runner<PushJob> = Arc::new(move |jobs| {
        let pool = pool.clone();
        let wake = wake.clone();
        let placement = placement.clone();
        Box::pin(async move { run_worker_batch(&pool, backend, &placement, &wake, jobs).await })
    });
    keyed(workers, max_items, run, stage)
}

/// A batch of one worker's pushes: split by shard, in shard order (every batch locks
/// partitions in the same order: shard, then id), stored in one transaction.
async fn run_worker_batch(
    pool: &Pool,
    backend: Backend,
    placement: &Placement,
    wake: &Arc<Wake>,
    jobs: Vec<PushJob>,
) {
    let all: Vec<&NewMessage> = jobs.iter().flat_map(|j| j.messages.iter()).collect();
    let groups = by_shard(placement, &all);
    let members: Vec<Vec<&NewMessage>> = groups
        .iter()
        .map(|g| g.iter().map(|&i| all[i]).collect())
        .collect();
    let plans: Vec<Plan<'_>> = members.iter().map(|m| Plan::new(m, backend)).collect();
    let result = again_on_conflict!(store_shards(pool, &plans).await).map(|per_shard| {
        let mut out = vec![Stored::PartitionGone; all.len()];
        for (g, stored) in groups.iter().zip(per_shard) {
            for (&i, s) in g.iter().zip(stored) {
                out[i] = s;
            }
        }
        out
    });
    if result.is_ok() {
        announce(wake, all.iter().copied());
    }
    fusion::reply_all(jobs, result, |j| (j.messages.len(), j.reply));
}

/// Indexes into `all` grouped by the shard of their partition, in shard order. A partition
/// whose shard is not cached (its placement just expired) is a group of its own: a group
/// must never span shards, or its statements would not be router statements.
fn by_shard(placement: &Placement, all: &[&NewMessage]) -> Vec<Vec<usize>> {
    let ids: Vec<Uuid> = all.iter().map(|m| m.partition_id).collect();
    let (shards, _) = placement.known(&ids);
    let mut groups: std::collections::BTreeMap<(i64, Option<Uuid>), Vec<usize>> =
        std::collections::BTreeMap::new();
    for (i, m) in all.iter().enumerate() {
        let key = match shards.get(&m.partition_id) {
            Some(&shard) => (shard, None),
            None => (i64::MAX, Some(m.partition_id)),
        };
        groups.entry(key).or_default().push(i);
    }
    groups.into_values().collect()
}

/// What the first round trip of a shard's part of a worker batch left: its outcomes, or
/// (a checked part on Citus) the ids it read, for the append of the second.
enum Step {
    Done(Vec<Stored>),
    Read(PriorIds),
}

/// Stores the per-shard `plans` of one worker batch in one transaction on one connection,
/// pipelined: `BEGIN`, each shard's lock and append, `COMMIT` in one round trip; with
/// producers' transaction ids, the locks and prior reads first, then the appends with the
/// `COMMIT` (never before them: an append must run under its lock). A failed statement fails
/// the ones after it, and the `COMMIT` then rolls back: the batch is stored whole or not at
/// all. A part big enough to be copied is a transaction of its own ([`Plan::copy`]), so a
/// batch with one stores each shard's part apart, at once.
async fn store_shards(pool: &Pool, plans: &[Plan<'_>]) -> Result<Vec<Vec<Stored>>, DbError> {
    if plans.iter().any(Plan::copies) {
        let each = plans.iter().map(|plan| store(pool, plan, &mut []));
        return futures_util::future::try_join_all(each).await;
    }
    pipelined(&pool.get().await?, plans).await
}

/// [`store_shards`] of `plans` none of which copies, on `client`: also a lone batch's store
/// on Citus ([`store`]), as the one plan of its shard.
async fn pipelined(
    client: &deadpool_postgres::Client,
    plans: &[Plan<'_>],
) -> Result<Vec<Vec<Stored>>, DbError> {
    let mut statements = Vec::with_capacity(plans.len());
    for plan in plans {
        statements.push(Statements::prepare(client, plan).await?);
    }
    let p = Pipelined::on(client);
    let parts = || plans.iter().zip(&statements);
    if statements.iter().all(|s| s.prior.is_none()) {
        let runs = join_all(parts().map(|(plan, s)| plan.run(&p, s)));
        let (begin, outcomes, commit) = tokio::join!(p.begin(), runs, p.commit());
        begin?;
        let outcomes = outcomes.into_iter().collect::<Result<Vec<_>, _>>()?;
        commit?;
        return Ok(outcomes);
    }
    let first = join_all(parts().map(|(plan, s)| {
        let p = &p;
        async move {
            match &s.prior {
                Some(prior) => Ok(Step::Read(
                    plan.read_prior_on_citus(p, &s.lock, prior).await?,
                )),
                None => Ok(Step::Done(plan.run(p, s).await?)),
            }
        }
    }));
    let (begin, steps) = tokio::join!(p.begin(), first);
    let steps = match begin
        .map_err(DbError::from)
        .and(steps.into_iter().collect::<Result<Vec<Step>, DbError>>())
    {
        Ok(steps) => steps,
        Err(e) => {
            db::roll_back(client).await;
            return Err(e);
        }
    };
    let second = join_all(parts().zip(steps).map(|((plan, s), step)| {
        let p = &p;
        async move {
            match step {
                Step::Done(outcomes) => Ok(outcomes),
                Step::Read(read) => plan.append_new_on_citus(p, &s.insert, &read).await,
            }
        }
    }));
    let (outcomes, commit) = tokio::join!(second, p.commit());
    let outcomes = outcomes.into_iter().collect::<Result<Vec<_>, _>>()?;
    commit?;
    Ok(outcomes)
}

/// Batches of a worker's small pushes that run at once (in a worker's fuser).
const WORKER_LANES: i64 = 2;

/// The key of a push in a worker's fuser ([`start_on_worker`]). Pushes lighter than
/// [`COPY_MIN_ROWS`] take one of [`WORKER_LANES`] queues by their lowest shard (`shard`), so
/// that as many batches of one worker run at once, each over shards of its own: a batch on
/// Citus waits on a statement per shard where one PostgreSQL runs one call, and one batch at
/// a time left the worker idle between them. Heavier pushes are keyed as [`shard_key`] says.
pub(crate) fn worker_key(messages: &[NewMessage], shard: i64) -> u64 {
    if messages.len() < COPY_MIN_ROWS {
        return shard.rem_euclid(WORKER_LANES) as u64;
    }
    shard_key(messages)
}

async fn run_batch(pool: &Pool, backend: Backend, wake: &Arc<Wake>, jobs: Vec<PushJob>) {
    let all: Vec<&NewMessage> = jobs.iter().flat_map(|j| j.messages.iter()).collect();
    let plan = Plan::new(&all, backend);
    // Pops waiting here for these queues, offered what the batch stores (not by `COPY`: a
    // batch that heavy is not the light load a hand-off saves a claim for).
    let mut offered = if plan.copies() {
        Vec::new()
    } else {
        let mut firsts: Vec<(Arc<str>, Uuid, Arc<str>)> = Vec::new();
        for m in &all {
            if !firsts.iter().any(|f| f.0 == m.queue) {
                firsts.push((m.queue.clone(), m.partition_id, m.partition.clone()));
            }
        }
        handoff::reserve(backend, wake, firsts)
    };
    let result = again_on_conflict!(store(pool, &plan, &mut offered).await);
    if result.is_ok() {
        let by_id: HashMap<Uuid, &NewMessage> = all.iter().map(|m| (m.message_id, *m)).collect();
        let quiet = handoff::deliver(pool, wake, offered, |h| {
            let Some(m) = by_id.get(&h.message_id) else {
                return false;
            };
            h.transaction_id = m.transaction_id().with_str(str::to_string);
            h.trace_id = m.trace_id.clone();
            h.producer_sub = m.producer_sub.as_deref().map(str::to_string);
            h.payload = m.payload.clone();
            true
        });
        announce_except(wake, all.iter().copied(), &quiet);
    }
    fusion::reply_all(jobs, result, |j| (j.messages.len(), j.reply));
}

/// Tries to store a batch this many times when the database undoes it to break a deadlock.
const STORE_ATTEMPTS: u32 = 3;

/// Stores a batch in a transaction of its own. On one PostgreSQL that is one call
/// ([`STORE_FUNCTION`]), which also hands the batch's messages to the pops `offered` them
/// ([`handoff`]). On Citus (no hand-off) BEGIN, lock, insert and COMMIT are pipelined in one
/// round trip, and if a statement fails the ones after it fail too and COMMIT rolls back; a
/// checked batch there takes two round trips (lock and prior ids, then append and COMMIT):
/// its COMMIT is sent only after its append, which must not run outside the lock.
/// (No NOTIFY in here: it takes a cluster-wide lock held through the commit's WAL flush,
/// which would serialise every push commit; see `wake::broadcast`.)
async fn store(
    pool: &Pool,
    plan: &Plan<'_>,
    offered: &mut [handoff::Offered],
) -> Result<Vec<Stored>, DbError> {
    let client = pool.get().await?;
    if plan.copies() {
        let result = plan.copy(&client).await;
        if result.is_err() {
            // The copy sends COMMIT only once every row is written.
            db::roll_back(&client).await;
        }
        return result;
    }
    if plan.backend.runs_data_path_functions() {
        let call = client.prepare_cached(STORE_CALL).await?;
        return plan.store_in_one_call(&client, &call, offered).await;
    }
    debug_assert!(offered.is_empty(), "nothing hands off on Citus");
    let mut outcomes = pipelined(&client, std::slice::from_ref(plan)).await?;
    Ok(outcomes.pop().expect("one plan, one outcome"))
}

/// Stores messages inside the caller's transaction (used by `/transaction`); the caller
/// announces the pushed queues once it has committed.
pub(crate) async fn store_in(
    tx: &deadpool_postgres::Transaction<'_>,
    backend: Backend,
    all: &[&NewMessage],
) -> Result<Vec<Stored>, DbError> {
    let plan = Plan::new(all, backend);
    let statements = Statements::prepare(tx, &plan).await?;
    plan.run(tx, &statements).await
}

/// What the first round trip of a checked batch on Citus read: the partitions the lock found
/// (`alive`), and the messages their partitions already hold under the batch's transaction
/// ids (`held`, by partition and id).
struct PriorIds {
    alive: Vec<Uuid>,
    held: HashMap<(Uuid, String), Uuid>,
}

/// The prepared statements a batch needs: the lock, and the insert its kind calls for. On
/// Citus a batch with producers' transaction ids reads their prior messages (`prior`) and
/// then takes the plain append ([`Plan::run_checked_on_citus`]).
struct Statements {
    lock: Statement,
    insert: Statement,
    prior: Option<Statement>,
}

impl Statements {
    async fn prepare<C: deadpool_postgres::GenericClient>(
        client: &C,
        plan: &Plan<'_>,
    ) -> Result<Statements, DbError> {
        let backend = plan.backend;
        let lock = client
            .prepare_cached(backend.sql(&crate::catalog::LOCK_PARTITIONS))
            .await?;
        // On Citus a checked batch reads its prior ids apart, then appends.
        let citus = !backend.statements_span_partitions();
        let insert = if plan.checks_duplicates() && !citus {
            client.prepare_cached(INSERT_SQL).await?
        } else {
            client.prepare_cached(backend.sql(&APPEND)).await?
        };
        let prior = if plan.checks_duplicates() && citus {
            Some(client.prepare_cached(backend.sql(&PRIOR)).await?)
        } else {
            None
        };
        Ok(Statements {
            lock,
            insert,
            prior,
        })
    }
}

/// The columns of a batch's messages, one element per message, as its statements take them.
struct Columns<'a> {
    partition_ids: Vec<Uuid>,
    /// Each message's rank among the batch's messages of its partition, from 1.
    ranks: Vec<i64>,
    message_ids: Vec<Uuid>,
    txids: Vec<TransactionId<'a>>,
    trace_ids: Vec<Option<&'a str>>,
    payloads: Vec<&'a [u8]>,
    /// Which messages carry a producer's transaction id, to look for in the partition.
    checks: Vec<bool>,
    /// Producers' subjects, or `None` when no message has one.
    subs: Option<Vec<Option<&'a str>>>,
}

/// A batch ready for the database: repeats within the batch folded onto their first
/// occurrence, columns laid out as arrays.
pub(crate) struct Plan<'a> {
    all: &'a [&'a NewMessage],
    /// Indexes (into `all`) of first occurrences, the ones sent.
    sent: Vec<usize>,
    /// For each message, the index of its first occurrence if it repeats one.
    repeat_of: Vec<Option<usize>>,
    lock_ids: Vec<Uuid>,
    backend: Backend,
}

/// Tells `wake` which partitions of which queues the committed `messages` went into.
pub(crate) fn announce<'m>(wake: &Wake, messages: impl Iterator<Item = &'m NewMessage>) {
    announce_except(wake, messages, &[]);
}

/// [`announce`], except that the (partition, group) pairs `quiet` (handed all their new
/// messages) are not hinted to their group.
fn announce_except<'m>(
    wake: &Wake,
    messages: impl Iterator<Item = &'m NewMessage>,
    quiet: &[(Uuid, String)],
) {
    let mut pairs: Vec<(&str, Uuid)> = messages.map(|m| (&*m.queue, m.partition_id)).collect();
    pairs.sort_unstable();
    pairs.dedup();
    let quiet: Vec<(Uuid, &str)> = quiet.iter().map(|(p, g)| (*p, g.as_str())).collect();
    for chunk in pairs.chunk_by(|a, b| a.0 == b.0) {
        let partitions: Vec<Uuid> = chunk.iter().map(|p| p.1).collect();
        wake.pushed_except(chunk[0].0, &partitions, &quiet);
    }
}

impl<'a> Plan<'a> {
    /// Folds in-batch repeats of (partition, transaction id). Only producers' ids can repeat:
    /// an id the broker made is the message's own fresh id.
    pub(crate) fn new(all: &'a [&'a NewMessage], backend: Backend) -> Plan<'a> {
        let mut first_of: HashMap<(Uuid, &str), usize> = HashMap::new();
        let mut sent = Vec::with_capacity(all.len());
        let mut repeat_of = Vec::with_capacity(all.len());
        for (i, m) in all.iter().enumerate() {
            let Some(txid) = m.client_transaction_id.as_deref() else {
                repeat_of.push(None);
                sent.push(i);
                continue;
            };
            match first_of.get(&(m.partition_id, txid)) {
                Some(&j) => repeat_of.push(Some(j)),
                None => {
                    first_of.insert((m.partition_id, txid), i);
                    repeat_of.push(None);
                    sent.push(i);
                }
            }
        }
        let mut lock_ids: Vec<Uuid> = sent.iter().map(|&i| all[i].partition_id).collect();
        lock_ids.sort_unstable();
        lock_ids.dedup();
        Plan {
            all,
            sent,
            repeat_of,
            lock_ids,
            backend,
        }
    }

    /// Whether some message carries a producer's transaction id, which a stored message may
    /// already hold; batches without one take the plain append.
    fn checks_duplicates(&self) -> bool {
        self.sent
            .iter()
            .any(|&i| self.all[i].client_transaction_id.is_some())
    }

    /// Whether the batch is big enough to be copied in.
    fn copies(&self) -> bool {
        self.sent.len() >= COPY_MIN_ROWS
    }

    /// Stores the batch in a transaction of its own by `COPY`, in two round trips: BEGIN,
    /// the lock, the heads and the messages the partitions already hold under the batch's
    /// transaction ids (both read after the lock), and the start of the copy; then the rows
    /// of the messages not held, the end of the copy and COMMIT. The duplicate check is a
    /// read of one partition's ids per statement, so a checked batch is copied like any
    /// other instead of inserted by a statement that joins every row to its check.
    async fn copy(&self, client: &deadpool_postgres::Client) -> Result<Vec<Stored>, DbError> {
        let lock = client
            .prepare_cached(self.backend.sql(&crate::catalog::LOCK_PARTITIONS))
            .await?;
        let heads = client.prepare_cached(self.backend.sql(&HEADS)).await?;
        let citus = !self.backend.statements_span_partitions();
        let with_sub = self
            .sent
            .iter()
            .any(|&i| self.all[i].producer_sub.is_some());
        let copy = client
            .prepare_cached(if with_sub {
                COPY_WITH_SUB_SQL
            } else {
                COPY_SQL
            })
            .await?;
        let prior = if self.checks_duplicates() {
            Some(client.prepare_cached(self.backend.sql(&PRIOR)).await?)
        } else {
            None
        };
        let p = Pipelined::on(client);
        let params: [&(dyn ToSql + Sync); 1] = [&self.lock_ids];
        let (begin, locked, heads, held, sink) = tokio::join!(
            async {
                match prior {
                    Some(_) => p.begin_with(self.backend.sql(&PRIOR_START)).await,
                    None => p.begin().await,
                }
            },
            p.query(&lock, &params),
            async {
                if !citus {
                    return p.query(&heads, &params).await;
                }
                // On Citus a statement over several partitions' shards is not a router
                // statement: the heads are read a partition at a time.
                let heads = &heads;
                let p = &p;
                let each = self
                    .lock_ids
                    .iter()
                    .map(|id| async move { p.query(heads, &[id]).await });
                let rows = futures_util::future::try_join_all(each).await?;
                Ok(rows.into_iter().flatten().collect())
            },
            async {
                match &prior {
                    Some(prior) => self.read_held(&p, prior).await,
                    None => Ok(HashMap::new()),
                }
            },
            p.copy_in(&copy),
        );
        begin?;
        let locked = locked?;
        let heads = heads?;
        let held = held?;
        let sink = sink?;
        // Partitions deleted before the lock are not among the locked rows (sorted by id).
        let alive: Vec<Uuid> = locked.iter().map(|r| r.get("id")).collect();
        let mut next: HashMap<Uuid, i64> = HashMap::with_capacity(alive.len());
        let (mut seg, mut at) = (0i32, None::<DateTime<Utc>>);
        for row in &heads {
            let id: Uuid = row.get("id");
            if alive.binary_search(&id).is_ok() {
                next.insert(id, row.get("head"));
            }
            (seg, at) = (row.get("seg"), Some(row.get("at")));
        }
        let at = at.map_or(0, copy_time);
        let mut rows = CopyRows::new(self.sent.len(), with_sub);
        pin_mut!(sink);
        for &i in &self.sent {
            let m = self.all[i];
            if self.prior_in(&held, i).is_some() {
                continue;
            }
            let Some(pos) = next.get_mut(&m.partition_id) else {
                continue;
            };
            *pos += 1;
            rows.row(m, *pos, seg, at);
            if rows.buf.len() >= COPY_CHUNK {
                sink.as_mut().feed(rows.buf.split().freeze()).await?;
            }
        }
        sink.as_mut().feed(rows.finish()).await?;
        let (copied, commit) = tokio::join!(sink.finish(), p.commit());
        copied?;
        commit?;
        if held.is_empty() {
            return Ok(self.outcomes_by_partition(|p| next.contains_key(p)));
        }
        Ok(self.outcomes_held(&held, |p| next.contains_key(p)))
    }

    /// The message the partition already holds under message `i`'s transaction id, if the
    /// producer gave one and a read of `held` found it.
    fn prior_in(&self, held: &HashMap<(Uuid, String), Uuid>, i: usize) -> Option<Uuid> {
        let m = self.all[i];
        let t = m.client_transaction_id.as_ref()?;
        held.get(&(m.partition_id, t.clone())).copied()
    }

    /// One outcome per message of a checked batch: a duplicate of the message `held` names,
    /// queued when its partition was `stored` into, else its partition was gone.
    fn outcomes_held(
        &self,
        held: &HashMap<(Uuid, String), Uuid>,
        stored: impl Fn(&Uuid) -> bool,
    ) -> Vec<Stored> {
        let by_sent = self
            .sent
            .iter()
            .map(|&i| {
                let outcome = match self.prior_in(held, i) {
                    Some(id) => Stored::Duplicate(id),
                    None if stored(&self.all[i].partition_id) => {
                        Stored::Queued(self.all[i].message_id)
                    }
                    None => Stored::PartitionGone,
                };
                (i, outcome)
            })
            .collect();
        self.outcomes_of(by_sent)
    }

    /// The messages each partition of the batch already holds under the batch's producers'
    /// transaction ids, by (partition, id): [`PRIOR_SQL`], a statement per partition (on
    /// Citus each a router statement on the partition's worker). Sent after the lock, so
    /// it reads every push the lock waited for.
    async fn read_held<C: Prepared>(
        &self,
        client: &C,
        prior: &Statement,
    ) -> Result<HashMap<(Uuid, String), Uuid>, DbError> {
        let checked: Vec<usize> = self
            .sent
            .iter()
            .copied()
            .filter(|&i| self.all[i].client_transaction_id.is_some())
            .collect();
        let groups = crate::schema::citus::by_partition(&checked, |&i| self.all[i].partition_id);
        let reads = groups.iter().map(|(partition, ks)| {
            let txids: Vec<&str> = ks
                .iter()
                .filter_map(|&k| self.all[checked[k]].client_transaction_id.as_deref())
                .collect();
            async move {
                let params: [&(dyn ToSql + Sync); 2] = [partition, &txids];
                client.query(prior, &params).await
            }
        });
        let mut held: HashMap<(Uuid, String), Uuid> = HashMap::new();
        for ((partition, _), rows) in groups.iter().zip(join_all(reads).await) {
            for row in rows? {
                held.insert((*partition, row.get(0)), row.get(1));
            }
        }
        Ok(held)
    }

    /// One outcome per message when every new message of a stored partition was stored.
    fn outcomes_by_partition(&self, stored: impl Fn(&Uuid) -> bool) -> Vec<Stored> {
        self.all
            .iter()
            .enumerate()
            .map(|(i, m)| match self.repeat_of[i] {
                _ if !stored(&m.partition_id) => Stored::PartitionGone,
                None => Stored::Queued(m.message_id),
                Some(j) => Stored::Duplicate(self.all[j].message_id),
            })
            .collect()
    }

    /// Locks the partitions and inserts, pipelined, on a connection inside a transaction.
    async fn run<C: Prepared>(
        &self,
        client: &C,
        statements: &Statements,
    ) -> Result<Vec<Stored>, DbError> {
        let lock_params: [&(dyn ToSql + Sync); 1] = [&self.lock_ids];
        if let Some(prior) = &statements.prior {
            return self
                .run_checked_on_citus(client, &statements.lock, prior, &statements.insert)
                .await;
        }
        if self.checks_duplicates() {
            let (locked, rows) = tokio::join!(
                client.query(&statements.lock, &lock_params),
                self.insert_checked(client, &statements.insert),
            );
            locked?;
            return Ok(self.outcomes(&rows?.iter().collect::<Vec<_>>()));
        }
        let (locked, appended) = tokio::join!(
            client.query(&statements.lock, &lock_params),
            self.append(client, &statements.insert),
        );
        let locked = locked?;
        appended?;
        let stored: Vec<Uuid> = locked.iter().map(|r| r.get("id")).collect();
        Ok(self.outcomes_by_partition(|p| stored.contains(p)))
    }

    /// The plain append: each message's rank among the batch's messages of its partition.
    async fn append<C: Prepared>(&self, client: &C, insert: &Statement) -> Result<u64, DbError> {
        self.append_of(client, insert, &self.sent).await
    }

    /// The columns of the messages `sent` (indexes into `all`), as the statements take them.
    fn columns(&self, sent: &[usize]) -> Columns<'_> {
        let sent = || sent.iter().map(|&i| self.all[i]);
        let mut ranks: HashMap<Uuid, i64> = HashMap::with_capacity(self.lock_ids.len());
        Columns {
            partition_ids: sent().map(|m| m.partition_id).collect(),
            ranks: sent()
                .map(|m| {
                    let r = ranks.entry(m.partition_id).or_insert(0);
                    *r += 1;
                    *r
                })
                .collect(),
            message_ids: sent().map(|m| m.message_id).collect(),
            txids: sent().map(|m| m.transaction_id()).collect(),
            trace_ids: sent().map(|m| m.trace_id.as_deref()).collect(),
            payloads: sent().map(|m| &m.payload[..]).collect(),
            checks: sent().map(|m| m.client_transaction_id.is_some()).collect(),
            subs: sent()
                .any(|m| m.producer_sub.is_some())
                .then(|| sent().map(|m| m.producer_sub.as_deref()).collect()),
        }
    }

    /// [`Plan::append`] of the messages `sent` (indexes into `all`).
    async fn append_of<C: Prepared>(
        &self,
        client: &C,
        insert: &Statement,
        sent: &[usize],
    ) -> Result<u64, DbError> {
        let c = self.columns(sent);
        let params: [&(dyn ToSql + Sync); 8] = [
            &c.partition_ids,
            &c.ranks,
            &c.message_ids,
            &c.txids,
            &c.trace_ids,
            &c.payloads,
            &self.lock_ids,
            &c.subs,
        ];
        Ok(client.execute(insert, &params).await?)
    }

    /// The insert that skips messages whose transaction id the partition already holds.
    async fn insert_checked<C: Prepared>(
        &self,
        client: &C,
        insert: &Statement,
    ) -> Result<Vec<Row>, DbError> {
        let c = self.columns(&self.sent);
        let params: [&(dyn ToSql + Sync); 7] = [
            &c.partition_ids,
            &c.txids,
            &c.message_ids,
            &c.trace_ids,
            &c.payloads,
            &c.checks,
            &c.subs,
        ];
        Ok(client.query(insert, &params).await?)
    }

    /// Stores the batch in one call of [`STORE_FUNCTION`] (`call`), which leases its messages
    /// to the pops `offered` them and records what each got.
    async fn store_in_one_call(
        &self,
        client: &deadpool_postgres::Client,
        call: &Statement,
        offered: &mut [handoff::Offered],
    ) -> Result<Vec<Stored>, DbError> {
        let c = self.columns(&self.sent);
        let checks = self.checks_duplicates().then_some(&c.checks);
        let o = handoff::Offers::of(offered);
        let params: [&(dyn ToSql + Sync); 14] = [
            &self.lock_ids,
            &c.partition_ids,
            &c.ranks,
            &c.message_ids,
            &c.txids,
            &c.trace_ids,
            &c.payloads,
            &c.subs,
            &checks,
            &o.partitions,
            &o.groups,
            &o.leases,
            &o.lengths,
            &o.batches,
        ];
        let rows = client.query(call, &params).await?;
        let (granted, rows): (Vec<&Row>, Vec<&Row>) = rows
            .iter()
            .partition(|r| r.get::<_, Option<&str>>("consumer_group").is_some());
        handoff::record_granted(offered, &granted);
        if checks.is_some() {
            return Ok(self.outcomes(&rows));
        }
        let alive: Vec<Uuid> = rows.iter().map(|r| r.get("partition_id")).collect();
        Ok(self.outcomes_by_partition(|p| alive.contains(p)))
    }

    /// A batch with producers' transaction ids on Citus, in two round trips: the lock and,
    /// pipelined after it, each partition's prior messages of the batch's ids
    /// ([`PRIOR_CITUS_SQL`], a router statement per partition); then the plain append of the
    /// messages without one. Every statement names one partition's shard, so a push of one
    /// shard commits on its worker in one phase. The answers are [`INSERT_SQL`]'s.
    async fn run_checked_on_citus<C: Prepared>(
        &self,
        client: &C,
        lock: &Statement,
        prior: &Statement,
        append: &Statement,
    ) -> Result<Vec<Stored>, DbError> {
        let read = self.read_prior_on_citus(client, lock, prior).await?;
        self.append_new_on_citus(client, append, &read).await
    }

    /// The first round trip of [`Plan::run_checked_on_citus`]: the lock and each partition's
    /// prior messages of the batch's ids.
    async fn read_prior_on_citus<C: Prepared>(
        &self,
        client: &C,
        lock: &Statement,
        prior: &Statement,
    ) -> Result<PriorIds, DbError> {
        let lock_params: [&(dyn ToSql + Sync); 1] = [&self.lock_ids];
        let (locked, held) = tokio::join!(
            client.query(lock, &lock_params),
            self.read_held(client, prior),
        );
        let alive = locked?.iter().map(|r| r.get("id")).collect();
        Ok(PriorIds { alive, held: held? })
    }

    /// The second round trip of [`Plan::run_checked_on_citus`]: the append of the messages
    /// whose ids the partitions did not hold. It must run in the transaction that holds the
    /// lock (a `COMMIT` pipelined with the first round trip would release the lock before
    /// the append read the heads: two pushes would take the same positions).
    async fn append_new_on_citus<C: Prepared>(
        &self,
        client: &C,
        append: &Statement,
        read: &PriorIds,
    ) -> Result<Vec<Stored>, DbError> {
        let fresh: Vec<usize> = self
            .sent
            .iter()
            .copied()
            .filter(|&i| self.prior_in(&read.held, i).is_none())
            .collect();
        if !fresh.is_empty() {
            self.append_of(client, append, &fresh).await?;
        }
        Ok(self.outcomes_held(&read.held, |p| read.alive.contains(p)))
    }

    /// One outcome per message of the batch, in order, from the insert's rows.
    fn outcomes(&self, rows: &[&Row]) -> Vec<Stored> {
        let mut by_sent: HashMap<usize, Stored> = HashMap::with_capacity(self.sent.len());
        for (k, row) in rows.iter().enumerate() {
            let prior: Option<Uuid> = row.get("prior_id");
            let stored: bool = row.get("stored");
            let i = self.sent[k];
            by_sent.insert(
                i,
                match prior {
                    Some(id) => Stored::Duplicate(id),
                    None if stored => Stored::Queued(self.all[i].message_id),
                    None => Stored::PartitionGone,
                },
            );
        }
        self.outcomes_of(by_sent)
    }

    /// One outcome per message of the batch, in order, from the outcomes of those sent: a
    /// repeat within the batch is a duplicate of its first occurrence.
    fn outcomes_of(&self, by_sent: HashMap<usize, Stored>) -> Vec<Stored> {
        self.repeat_of
            .iter()
            .enumerate()
            .map(|(i, rep)| match rep {
                None => by_sent[&i].clone(),
                Some(j) => match &by_sent[j] {
                    Stored::Queued(id) | Stored::Duplicate(id) => Stored::Duplicate(*id),
                    Stored::PartitionGone => Stored::PartitionGone,
                },
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_named_by_number() {
        let names = ["a", "b", "", "", "", "", "", "", "", "j"];
        assert_eq!(
            with_names("SELECT $2::int, $1, $10, '$x'", &names),
            "SELECT b::int, a, j, '$x'"
        );
    }

    fn message(partition: Uuid, txid: &str, sub: &str) -> NewMessage {
        NewMessage {
            queue: "q".into(),
            queue_id: Uuid::nil(),
            partition: "p".into(),
            partition_id: partition,
            client_transaction_id: Some(txid.to_string()),
            message_id: Uuid::now_v7(),
            trace_id: None,
            producer_sub: Some(sub.into()),
            payload: Bytes::from_static(b"1"),
        }
    }

    /// The messages of a batch appended apart from the others (on Citus, those whose ids the
    /// partition did not hold) carry their own producers, not the batch's first ones.
    #[test]
    fn columns_of_some_messages_are_those_messages_own() {
        let (p, q) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let batch = [
            message(p, "t-1", "alice"),
            message(p, "t-2", "bob"),
            message(q, "t-1", "carol"),
        ];
        let all: Vec<&NewMessage> = batch.iter().collect();
        let plan = Plan::new(&all, Backend::POSTGRES);
        let c = plan.columns(&[1, 2]);
        assert_eq!(c.partition_ids, [p, q]);
        assert_eq!(c.ranks, [1, 1]);
        assert_eq!(c.subs, Some(vec![Some("bob"), Some("carol")]));
        assert_eq!(c.message_ids, [batch[1].message_id, batch[2].message_id]);
    }

    #[test]
    fn the_function_names_every_parameter() {
        let body = &*STORE_FUNCTION;
        let inner = &body[body.find("BEGIN").expect("a body")..];
        assert!(
            !inner
                .bytes()
                .zip(inner.bytes().skip(1))
                .any(|(a, b)| a == b'$' && b.is_ascii_digit()),
            "{inner}"
        );
    }
}
