//! Push: store messages durably, in order, once.
//!
//! Concurrent push requests are fused into one transaction of two statements, sent together
//! in one round trip:
//!
//! 1. lock the rows of every partition in the batch, in id order (no deadlocks between batches);
//! 2. skip items whose transaction id the partition already holds, then insert the rest at
//!    positions `head + 1, head + 2, …`, where the head is the newest position stored
//!    (`comb.partition_head`). Nothing is updated: the partition row is only locked.
//!
//! The second statement takes its snapshot after the locks are held, so it sees every earlier
//! push of those partitions, and positions in a partition are committed in the order they are
//! assigned. A reader can therefore never pass a position that commits later: nothing is
//! skipped however pushes race (the defect of cursors taken from transaction start time).

use std::collections::HashMap;
use std::sync::Arc;

use deadpool_postgres::Pool;
use tokio::sync::oneshot;
use tokio_postgres::types::ToSql;
use tokio_postgres::{GenericClient, Row, Statement};
use uuid::Uuid;

use crate::db::DbError;
use crate::fusion::{Fuser, Runner};
use crate::wake::Wake;

/// One message ready to store: names resolved, payload validated.
#[derive(Debug, Clone)]
pub struct NewMessage {
    pub queue: Arc<str>,
    pub queue_id: Uuid,
    /// Partition name, to resolve again if the partition vanished.
    pub partition: String,
    pub partition_id: Uuid,
    pub transaction_id: String,
    /// The producer gave the transaction id (only those can be duplicates).
    pub client_transaction_id: bool,
    pub message_id: Uuid,
    pub trace_id: Option<String>,
    pub payload: Vec<u8>,
}

/// What became of one pushed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// Stored now under this message id.
    Queued(Uuid),
    /// The partition already held this transaction id; the first message's id.
    Duplicate(Uuid),
    /// The partition disappeared (its queue was deleted) before the message was stored.
    PartitionGone,
}

/// A push request waiting for its batch.
pub struct PushJob {
    /// Shared with the request handler, which answers from it after the batch.
    pub messages: Arc<Vec<NewMessage>>,
    pub reply: oneshot::Sender<Result<Vec<Stored>, Arc<DbError>>>,
}

const LOCK_SQL: &str =
    "SELECT id FROM comb.partitions WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE";

const INSERT_SQL: &str = "
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::text[], $5::bytea[], $6::bool[])
        WITH ORDINALITY AS t(partition_id, transaction_id, message_id, trace_id, payload, check_dup, ord)
),
prior AS (
    SELECT i.ord, m.message_id
    FROM input i
    CROSS JOIN LATERAL (
        SELECT m.message_id FROM comb.messages m
        WHERE m.partition_id = i.partition_id AND m.transaction_id = i.transaction_id
        LIMIT 1
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
    SELECT d.partition_id, h.pos
    FROM (SELECT DISTINCT partition_id FROM fresh) d
    CROSS JOIN LATERAL comb.partition_head(d.partition_id) h
),
stored AS (
    INSERT INTO comb.messages
        (partition_id, pos, seg, message_id, transaction_id, trace_id, payload, created_at)
    SELECT f.partition_id, h.pos + f.rn, s.seg, f.message_id, f.transaction_id,
           f.trace_id, f.payload, statement_timestamp()
    FROM fresh f
    JOIN heads h ON h.partition_id = f.partition_id
    CROSS JOIN segment s
    RETURNING message_id
)
SELECT i.ord, pr.message_id AS prior_id, s.message_id IS NOT NULL AS stored
FROM input i
LEFT JOIN prior pr ON pr.ord = i.ord
LEFT JOIN stored s ON s.message_id = i.message_id
ORDER BY i.ord";

/// Starts the push workers.
pub fn start(pool: Pool, wake: Arc<Wake>, workers: usize, max_items: usize) -> Fuser<PushJob> {
    let run: Runner<PushJob> = Arc::new(move |jobs| {
        let pool = pool.clone();
        let wake = wake.clone();
        Box::pin(async move { run_batch(&pool, &wake, jobs).await })
    });
    Fuser::start_keyed(workers, max_items, |j: &PushJob| j.messages.len(), run)
}

/// The shard key of a push: its lowest partition id. Pushes to one partition always share a
/// worker, so batches in flight at once never wait for each other's partition locks; a push
/// spanning partitions stays one transaction (and may then wait, briefly, for another worker).
pub fn shard_key(messages: &[NewMessage]) -> u64 {
    messages
        .iter()
        .map(|m| m.partition_id)
        .min()
        .map_or(0, |id| {
            let v = id.as_u128();
            (v as u64) ^ ((v >> 64) as u64)
        })
}

async fn run_batch(pool: &Pool, wake: &Wake, jobs: Vec<PushJob>) {
    let all: Vec<&NewMessage> = jobs.iter().flat_map(|j| j.messages.iter()).collect();
    let plan = Plan::new(&all);
    match store(pool, &plan).await {
        Ok(outcomes) => {
            for q in &plan.queues {
                wake.pushed(q);
            }
            let mut it = outcomes.into_iter();
            for job in jobs {
                let mine: Vec<Stored> = it.by_ref().take(job.messages.len()).collect();
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
}

/// Stores a batch in a transaction of its own: BEGIN, lock, insert and COMMIT are pipelined
/// in one round trip. If a statement fails, the ones after it fail too and COMMIT rolls back.
/// (No NOTIFY in here: it takes a cluster-wide lock held through the commit's WAL flush,
/// which would serialise every push commit; see `wake::broadcast`.)
async fn store(pool: &Pool, plan: &Plan<'_>) -> Result<Vec<Stored>, DbError> {
    let client = pool.get().await?;
    let lock = client.prepare_cached(LOCK_SQL).await?;
    let insert = client.prepare_cached(INSERT_SQL).await?;
    let pg: &tokio_postgres::Client = &client;
    let (begin, rows, commit) = tokio::join!(
        pg.batch_execute("BEGIN"),
        plan.run(pg, &lock, &insert),
        pg.batch_execute("COMMIT"),
    );
    begin?;
    let rows = rows?;
    commit?;
    Ok(plan.outcomes(&rows))
}

/// Stores messages inside the caller's transaction (used by `/transaction`); the caller
/// announces the pushed queues once it has committed.
pub async fn store_in(
    tx: &deadpool_postgres::Transaction<'_>,
    all: &[&NewMessage],
) -> Result<Vec<Stored>, DbError> {
    let plan = Plan::new(all);
    let lock = tx.prepare_cached(LOCK_SQL).await?;
    let insert = tx.prepare_cached(INSERT_SQL).await?;
    let pg: &tokio_postgres::Transaction = tx;
    let rows = plan.run(pg, &lock, &insert).await?;
    Ok(plan.outcomes(&rows))
}

/// A batch ready for the database: repeats within the batch folded onto their first
/// occurrence, columns laid out as arrays.
pub struct Plan<'a> {
    all: &'a [&'a NewMessage],
    /// Indexes (into `all`) of first occurrences, the ones sent.
    sent: Vec<usize>,
    /// For each message, the index of its first occurrence if it repeats one.
    repeat_of: Vec<Option<usize>>,
    lock_ids: Vec<Uuid>,
    /// Distinct queue names, sorted.
    pub queues: Vec<&'a str>,
}

impl<'a> Plan<'a> {
    /// Folds in-batch repeats of (partition, transaction id).
    pub fn new(all: &'a [&'a NewMessage]) -> Plan<'a> {
        let mut first_of: HashMap<(Uuid, &str), usize> = HashMap::new();
        let mut sent = Vec::with_capacity(all.len());
        let mut repeat_of = Vec::with_capacity(all.len());
        for (i, m) in all.iter().enumerate() {
            match first_of.get(&(m.partition_id, m.transaction_id.as_str())) {
                Some(&j) => repeat_of.push(Some(j)),
                None => {
                    first_of.insert((m.partition_id, m.transaction_id.as_str()), i);
                    repeat_of.push(None);
                    sent.push(i);
                }
            }
        }
        let mut lock_ids: Vec<Uuid> = sent.iter().map(|&i| all[i].partition_id).collect();
        lock_ids.sort_unstable();
        lock_ids.dedup();
        let mut queues: Vec<&str> = all.iter().map(|m| &*m.queue).collect();
        queues.sort_unstable();
        queues.dedup();
        Plan {
            all,
            sent,
            repeat_of,
            lock_ids,
            queues,
        }
    }

    /// Locks the partitions and inserts, pipelined, on a connection inside a transaction.
    async fn run<C: GenericClient>(
        &self,
        client: &C,
        lock: &Statement,
        insert: &Statement,
    ) -> Result<Vec<Row>, DbError> {
        let sent = || self.sent.iter().map(|&i| self.all[i]);
        let partition_ids: Vec<Uuid> = sent().map(|m| m.partition_id).collect();
        let txids: Vec<&str> = sent().map(|m| m.transaction_id.as_str()).collect();
        let message_ids: Vec<Uuid> = sent().map(|m| m.message_id).collect();
        let trace_ids: Vec<Option<&str>> = sent().map(|m| m.trace_id.as_deref()).collect();
        let payloads: Vec<&[u8]> = sent().map(|m| m.payload.as_slice()).collect();
        let check: Vec<bool> = sent().map(|m| m.client_transaction_id).collect();
        let lock_params: [&(dyn ToSql + Sync); 1] = [&self.lock_ids];
        let insert_params: [&(dyn ToSql + Sync); 6] = [
            &partition_ids,
            &txids,
            &message_ids,
            &trace_ids,
            &payloads,
            &check,
        ];
        let (locked, rows) = tokio::join!(
            client.query(lock, &lock_params),
            client.query(insert, &insert_params),
        );
        locked?;
        Ok(rows?)
    }

    /// One outcome per message of the batch, in order, from the insert's rows.
    fn outcomes(&self, rows: &[Row]) -> Vec<Stored> {
        let mut by_sent: HashMap<usize, Stored> = HashMap::with_capacity(self.sent.len());
        for (k, row) in rows.iter().enumerate() {
            let prior: Option<Uuid> = row.get(1);
            let stored: bool = row.get(2);
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
