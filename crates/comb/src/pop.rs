//! Pop: lease partitions to a consumer group and hand out their next messages.
//!
//! A claim is one statement: pick partitions of the queue where the group's cursor is behind
//! the partition head and no lease is live, least recently served first (fairness), locking
//! the cursor rows with `SKIP LOCKED` so concurrent claims never wait on each other; read the
//! next `batch` unsettled messages of each; record the lease (or, with auto-ack, move the cursor
//! past what was handed out). Concurrent pops with the same shape are fused into one claim
//! for as many partitions as they want together.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use tokio::sync::oneshot;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::db::DbError;
use crate::fusion::{Fuser, Runner};

/// The shape of a pop; pops with the same shape are claimed together.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PopShape {
    pub queue_id: Uuid,
    pub group: String,
    /// Only this partition, when the consumer named one.
    pub partition_id: Option<Uuid>,
    /// Most messages per partition.
    pub batch: i32,
    /// Advance the cursor inside the pop instead of leasing.
    pub auto_ack: bool,
}

/// A pop request waiting for its batch.
pub struct PopJob {
    pub shape: PopShape,
    /// How many partitions this pop may lease.
    pub partitions: usize,
    pub reply: oneshot::Sender<Result<Vec<Claim>, Arc<DbError>>>,
}

/// One leased partition and the messages handed out with it.
#[derive(Debug, Clone)]
pub struct Claim {
    pub partition_id: Uuid,
    pub partition: String,
    /// `None` with auto-ack: nothing is leased.
    pub lease_id: Option<Uuid>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub messages: Vec<Delivered>,
}

/// A message as handed to a consumer.
#[derive(Debug, Clone)]
pub struct Delivered {
    pub pos: i64,
    pub message_id: Uuid,
    pub transaction_id: String,
    pub trace_id: Option<String>,
    pub payload: Vec<u8>,
    pub created_at: DateTime<Utc>,
    /// 1 for the first delivery, then one more per failed attempt.
    pub attempt: i32,
}

const CLAIM_SQL: &str = "
WITH q AS (
    SELECT coalesce((options->>'leaseTime')::float8, $6) AS lease_secs,
           coalesce((options->>'delayedProcessing')::float8, 0) AS delay_secs,
           coalesce((options->>'windowBuffer')::float8, 0) AS window_secs,
           coalesce((options->>'retentionSeconds')::float8, 0) AS retention_secs
    FROM comb.queues WHERE id = $1
),
cand AS (
    SELECT c.partition_id, c.cursor_pos, c.cursor_seg, c.settled, c.attempt_pos, c.attempt_cnt
    FROM comb.cursors c
    JOIN comb.partitions p ON p.id = c.partition_id
    CROSS JOIN q
    WHERE c.queue_id = $1 AND c.consumer_group = $2
      AND ($3::uuid IS NULL OR c.partition_id = $3)
      AND p.head_pos > c.cursor_pos
      AND c.lease_id IS NULL
      AND c.available_at <= now()
      AND (q.window_secs = 0
           OR p.last_push_at <= now() - make_interval(secs => q.window_secs))
      AND (q.retention_secs = 0
           OR p.last_push_at > now() - make_interval(secs => q.retention_secs))
      AND (q.delay_secs = 0 OR (
           SELECT m.created_at FROM comb.messages m
           WHERE m.partition_id = c.partition_id
             AND m.pos > c.cursor_pos AND m.seg >= c.cursor_seg
           ORDER BY m.pos LIMIT 1) <= now() - make_interval(secs => q.delay_secs))
    ORDER BY c.last_claimed_at, c.partition_id
    LIMIT $4
    FOR NO KEY UPDATE OF c SKIP LOCKED
),
picked AS (
    SELECT cand.partition_id, cand.cursor_pos, cand.cursor_seg, cand.settled,
           cand.attempt_pos, cand.attempt_cnt, min(m.pos) AS first, max(m.pos) AS upto
    FROM cand
    CROSS JOIN q
    CROSS JOIN LATERAL (
        SELECT m.pos FROM comb.messages m
        WHERE m.partition_id = cand.partition_id
          AND m.pos > cand.cursor_pos AND m.seg >= cand.cursor_seg
          AND m.pos <> ALL (cand.settled)
          AND (q.delay_secs = 0 OR m.created_at <= now() - make_interval(secs => q.delay_secs))
          AND (q.retention_secs = 0
               OR m.created_at > now() - make_interval(secs => q.retention_secs))
        ORDER BY m.pos
        LIMIT $5
    ) m
    GROUP BY cand.partition_id, cand.cursor_pos, cand.cursor_seg, cand.settled,
             cand.attempt_pos, cand.attempt_cnt
),
claimed AS (
    UPDATE comb.cursors c SET
        lease_id = CASE WHEN $7 THEN NULL ELSE gen_random_uuid() END,
        lease_expires_at = CASE WHEN $7 THEN NULL
            ELSE now() + make_interval(secs => q.lease_secs) END,
        lease_upto = picked.upto,
        -- Messages before the first one handed out that are not settled are past their
        -- queue's retention: the position moves over them.
        cursor_pos = CASE WHEN $7 THEN picked.upto
            ELSE greatest(c.cursor_pos, picked.first - 1) END,
        settled = ARRAY(SELECT s FROM unnest(c.settled) s
            WHERE s > CASE WHEN $7 THEN picked.upto ELSE picked.first - 1 END),
        attempt_pos = ARRAY(SELECT a FROM unnest(c.attempt_pos) a
            WHERE a > CASE WHEN $7 THEN picked.upto ELSE picked.first - 1 END),
        attempt_cnt = ARRAY(SELECT n FROM unnest(c.attempt_pos, c.attempt_cnt) AS x(a, n)
            WHERE a > CASE WHEN $7 THEN picked.upto ELSE picked.first - 1 END),
        last_claimed_at = clock_timestamp()
    FROM picked, q
    WHERE c.partition_id = picked.partition_id AND c.consumer_group = $2
    RETURNING c.partition_id, c.lease_id, c.lease_expires_at, picked.attempt_pos,
              picked.attempt_cnt, picked.first, picked.cursor_seg AS from_seg, picked.settled AS skip, picked.upto
)
SELECT cl.partition_id, p.name, cl.lease_id, cl.lease_expires_at,
       m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at,
       1 + coalesce(cl.attempt_cnt[array_position(cl.attempt_pos, m.pos)], 0) AS attempt
FROM claimed cl
JOIN comb.partitions p ON p.id = cl.partition_id
CROSS JOIN LATERAL (
    SELECT m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at
    FROM comb.messages m
    WHERE m.partition_id = cl.partition_id
      AND m.pos >= cl.first AND m.pos <= cl.upto AND m.seg >= cl.from_seg
      AND m.pos <> ALL (cl.skip)
    ORDER BY m.pos
) m
ORDER BY cl.partition_id, m.pos";

/// Leases of the group that ended without being settled: their messages must count an
/// attempt (and may be dead-lettered) before the partition is handed out again.
const EXPIRED_SQL: &str = "
SELECT c.partition_id FROM comb.cursors c
WHERE c.queue_id = $1 AND c.consumer_group = $2
  AND ($3::uuid IS NULL OR c.partition_id = $3)
  AND c.lease_id IS NOT NULL AND c.lease_expires_at <= now()
LIMIT 256";

/// Starts the pop workers.
pub fn start(pool: Pool, workers: usize, default_lease_seconds: f64) -> Fuser<PopJob> {
    let run: Runner<PopJob> = Arc::new(move |jobs| {
        let pool = pool.clone();
        Box::pin(async move { run_batch(&pool, default_lease_seconds, jobs).await })
    });
    Fuser::start(workers, 256, |_| 1, run)
}

async fn run_batch(pool: &Pool, default_lease_seconds: f64, jobs: Vec<PopJob>) {
    let mut by_shape: HashMap<PopShape, Vec<PopJob>> = HashMap::new();
    for job in jobs {
        by_shape.entry(job.shape.clone()).or_default().push(job);
    }
    let client = match pool.get().await {
        Ok(c) => c,
        Err(e) => {
            let e = Arc::new(DbError::from(e));
            for job in by_shape.into_values().flatten() {
                let _ = job.reply.send(Err(e.clone()));
            }
            return;
        }
    };
    // Each shape is one statement; they are pipelined on the same connection.
    let claims = by_shape.into_iter().map(|(shape, jobs)| {
        let client = &client;
        async move {
            let wanted: usize = jobs.iter().map(|j| j.partitions).sum();
            let result = claim(client, pool, &shape, wanted, default_lease_seconds).await;
            (jobs, result)
        }
    });
    for (jobs, result) in futures_util::future::join_all(claims).await {
        match result {
            Ok(claims) => {
                let mut it = claims.into_iter();
                for job in jobs {
                    let mine: Vec<Claim> = it.by_ref().take(job.partitions).collect();
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
}

async fn claim(
    client: &deadpool_postgres::Client,
    pool: &Pool,
    shape: &PopShape,
    partitions: usize,
    default_lease_seconds: f64,
) -> Result<Vec<Claim>, DbError> {
    let mut claims = claim_once(client, shape, partitions, default_lease_seconds).await?;
    if let Some(expired) = claims.1.take()
        && !expired.is_empty()
    {
        // Count the attempts of the ended leases, then claim again: those partitions (and
        // their undelivered messages) are free now.
        crate::ack::expire_leases(pool, &shape.group, &expired).await?;
        if claims.0.len() < partitions {
            let more = claim_once(
                client,
                shape,
                partitions - claims.0.len(),
                default_lease_seconds,
            )
            .await?;
            claims.0.extend(more.0);
        }
    }
    Ok(claims.0)
}

/// One claim statement, pipelined with the look for ended leases.
async fn claim_once(
    client: &deadpool_postgres::Client,
    shape: &PopShape,
    partitions: usize,
    default_lease_seconds: f64,
) -> Result<(Vec<Claim>, Option<Vec<Uuid>>), DbError> {
    let stmt = client.prepare_cached(CLAIM_SQL).await?;
    let expired_stmt = client.prepare_cached(EXPIRED_SQL).await?;
    let limit = partitions as i64;
    let batch = shape.batch as i64;
    let claim_params: [&(dyn ToSql + Sync); 7] = [
        &shape.queue_id,
        &shape.group,
        &shape.partition_id,
        &limit,
        &batch,
        &default_lease_seconds,
        &shape.auto_ack,
    ];
    let expired_params: [&(dyn ToSql + Sync); 3] =
        [&shape.queue_id, &shape.group, &shape.partition_id];
    let (expired, rows) = tokio::join!(
        client.query(&expired_stmt, &expired_params),
        client.query(&stmt, &claim_params),
    );
    let expired: Vec<Uuid> = expired?.iter().map(|r| r.get(0)).collect();
    let rows = rows?;
    let mut claims: Vec<Claim> = Vec::new();
    for r in rows {
        let partition_id: Uuid = r.get(0);
        if claims.last().is_none_or(|c| c.partition_id != partition_id) {
            claims.push(Claim {
                partition_id,
                partition: r.get(1),
                lease_id: r.get(2),
                lease_expires_at: r.get(3),
                messages: Vec::new(),
            });
        }
        let claim = claims.last_mut().expect("pushed above");
        claim.messages.push(Delivered {
            pos: r.get(4),
            message_id: r.get(5),
            transaction_id: r.get(6),
            trace_id: r.get(7),
            payload: r.get(8),
            created_at: r.get(9),
            attempt: r.get(10),
        });
    }
    Ok((claims, Some(expired)))
}
