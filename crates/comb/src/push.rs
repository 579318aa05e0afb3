//! Push: store messages durably, in order, once.
//!
//! Concurrent push requests are fused into one transaction of two statements, sent together
//! in one round trip:
//!
//! 1. lock the rows of every partition in the batch, in id order (no deadlocks between batches);
//! 2. skip items whose transaction id the partition already holds, then insert the rest at
//!    positions `head_pos + 1, head_pos + 2, …` and move each partition's head.
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
use uuid::Uuid;

use crate::db::DbError;
use crate::fusion::{Fuser, Runner};
use crate::wake::Wake;

/// One message ready to store: names resolved, payload validated.
#[derive(Debug, Clone)]
pub struct NewMessage {
    pub queue: Arc<str>,
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
        ORDER BY m.pos LIMIT 1
    ) m
    WHERE i.check_dup
),
fresh AS (
    SELECT i.*, row_number() OVER (PARTITION BY i.partition_id ORDER BY i.ord) AS rn
    FROM input i
    WHERE NOT EXISTS (SELECT 1 FROM prior p WHERE p.ord = i.ord)
),
segment AS (SELECT max(seg) AS seg FROM comb.segments),
stored AS (
    INSERT INTO comb.messages
        (partition_id, pos, seg, message_id, transaction_id, trace_id, payload, created_at)
    SELECT f.partition_id, p.head_pos + f.rn, s.seg, f.message_id, f.transaction_id,
           f.trace_id, f.payload, statement_timestamp()
    FROM fresh f
    JOIN comb.partitions p ON p.id = f.partition_id
    CROSS JOIN segment s
    RETURNING message_id
),
heads AS (
    UPDATE comb.partitions p
    SET head_pos = p.head_pos + c.n, last_push_at = statement_timestamp()
    FROM (SELECT partition_id, count(*) AS n FROM fresh GROUP BY partition_id) c
    WHERE p.id = c.partition_id
    RETURNING p.id
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
    Fuser::start(workers, max_items, |j: &PushJob| j.messages.len(), run)
}

async fn run_batch(pool: &Pool, wake: &Wake, jobs: Vec<PushJob>) {
    let all: Vec<&NewMessage> = jobs.iter().flat_map(|j| j.messages.iter()).collect();
    match store(pool, &all).await {
        Ok(outcomes) => {
            let mut queues: Vec<&str> = all.iter().map(|m| &*m.queue).collect();
            queues.sort_unstable();
            queues.dedup();
            for q in queues {
                wake.notify(q);
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

/// Stores a batch in one transaction and answers one outcome per message, in order.
async fn store(pool: &Pool, all: &[&NewMessage]) -> Result<Vec<Stored>, DbError> {
    // Within the batch, a repeated (partition, transaction id) is a duplicate of its first
    // occurrence; only first occurrences go to the database.
    let mut first_of: HashMap<(Uuid, &str), usize> = HashMap::new();
    let mut sent: Vec<usize> = Vec::with_capacity(all.len());
    let mut repeat_of: Vec<Option<usize>> = Vec::with_capacity(all.len());
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
    let mut partition_ids: Vec<Uuid> = Vec::with_capacity(sent.len());
    let mut txids: Vec<&str> = Vec::with_capacity(sent.len());
    let mut message_ids: Vec<Uuid> = Vec::with_capacity(sent.len());
    let mut trace_ids: Vec<Option<&str>> = Vec::with_capacity(sent.len());
    let mut payloads: Vec<&[u8]> = Vec::with_capacity(sent.len());
    let mut check: Vec<bool> = Vec::with_capacity(sent.len());
    for &i in &sent {
        let m = all[i];
        partition_ids.push(m.partition_id);
        txids.push(&m.transaction_id);
        message_ids.push(m.message_id);
        trace_ids.push(m.trace_id.as_deref());
        payloads.push(&m.payload);
        check.push(m.client_transaction_id);
    }
    let mut lock_ids = partition_ids.clone();
    lock_ids.sort_unstable();
    lock_ids.dedup();

    let client = pool.get().await?;
    let lock = client.prepare_cached(LOCK_SQL).await?;
    let insert = client.prepare_cached(INSERT_SQL).await?;
    // BEGIN, lock, insert and COMMIT are pipelined: one round trip. If a statement fails,
    // the ones after it fail too and COMMIT rolls back.
    let lock_params: [&(dyn ToSql + Sync); 1] = [&lock_ids];
    let insert_params: [&(dyn ToSql + Sync); 6] = [
        &partition_ids,
        &txids,
        &message_ids,
        &trace_ids,
        &payloads,
        &check,
    ];
    let (begin, _locked, rows, commit) = tokio::join!(
        client.batch_execute("BEGIN"),
        client.query(&lock, &lock_params),
        client.query(&insert, &insert_params),
        client.batch_execute("COMMIT"),
    );
    begin?;
    let rows = rows?;
    commit?;

    let mut by_sent: Vec<Stored> = Vec::with_capacity(sent.len());
    for (k, row) in rows.iter().enumerate() {
        let prior: Option<Uuid> = row.get(1);
        let stored: bool = row.get(2);
        by_sent.push(match prior {
            Some(id) => Stored::Duplicate(id),
            None if stored => Stored::Queued(message_ids[k]),
            None => Stored::PartitionGone,
        });
    }
    let mut sent_index: HashMap<usize, usize> = HashMap::with_capacity(sent.len());
    for (k, &i) in sent.iter().enumerate() {
        sent_index.insert(i, k);
    }
    let mut out = Vec::with_capacity(all.len());
    for (i, rep) in repeat_of.iter().enumerate() {
        out.push(match rep {
            None => by_sent[sent_index[&i]].clone(),
            Some(j) => match &by_sent[sent_index[j]] {
                Stored::Queued(id) | Stored::Duplicate(id) => Stored::Duplicate(*id),
                Stored::PartitionGone => Stored::PartitionGone,
            },
        });
    }
    Ok(out)
}
