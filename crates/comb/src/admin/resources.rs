//! Resources: queues, partitions, namespaces and tasks with their depth, and clearing what a
//! queue holds pending.
//!
//! Each figure comes from `comb.partition_stats` (schema version 9): the partition's head,
//! its cursors' latest states and the one message after the slowest cursor, all index
//! probes. A listing pages over catalog rows first and computes figures for that page only.

use deadpool_postgres::Pool;
use serde_json::{Value, json};

use super::cursors::{self, Selection, Target};
use super::{Failure, Page};
use crate::catalog::Catalog;

/// A queue's figures as a JSON object, for a query over `comb.queues q` joined with
/// [`QUEUE_FIGURES`].
pub(crate) const QUEUE_JSON: &str = "jsonb_build_object(
    'id', q.id, 'name', q.name, 'namespace', q.namespace, 'task', q.task,
    'createdAt', comb.iso(q.created_at), 'options', q.options,
    'partitions', st.partitions,
    'messages', jsonb_build_object('total', st.total, 'pending', st.pending,
                                   'processing', st.processing,
                                   'completed', greatest(st.total - st.pending - st.processing, 0),
                                   'deadLetters', dl.n),
    'deadLetters', dl.n,
    'oldestPendingAt', comb.iso(st.oldest),
    'oldestPendingAgeSeconds', coalesce(extract(epoch FROM now() - st.oldest), 0)::float8,
    'lastMessageAt', comb.iso(st.last_at))";

/// The laterals [`QUEUE_JSON`] reads: sums of `comb.partition_stats` over the queue's
/// partitions, and its dead letters not requeued.
pub(crate) const QUEUE_FIGURES: &str = "
CROSS JOIN LATERAL (
    SELECT count(*) AS partitions, coalesce(sum(s.head), 0)::bigint AS total,
           coalesce(sum(s.pending), 0)::bigint AS pending,
           coalesce(sum(s.processing), 0)::bigint AS processing,
           min(s.oldest_pending_at) AS oldest, max(s.head_at) AS last_at
    FROM comb.partitions p CROSS JOIN LATERAL comb.partition_stats(p.id) s
    WHERE p.queue_id = q.id
) st
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM comb.dead_letters d
    WHERE d.queue_id = q.id
      AND NOT EXISTS (SELECT 1 FROM comb.dead_letter_requeues r WHERE r.dead_letter_id = d.id)
) dl";

/// Which queues a listing shows.
#[derive(Debug, Default, Clone)]
pub struct QueueFilter {
    pub namespace: Option<String>,
    pub task: Option<String>,
    /// Part of the name.
    pub search: Option<String>,
}

const QUEUE_WHERE: &str = "($1::text IS NULL OR q.namespace = $1)
  AND ($2::text IS NULL OR q.task = $2)
  AND ($3::text IS NULL OR strpos(q.name, $3) > 0)";

/// `GET /api/v1/resources/overview`: counts and depth of everything.
pub async fn overview(pool: &Pool) -> Result<Value, Failure> {
    let client = pool.get().await?;
    let row = client
        .query_one(
            "SELECT jsonb_build_object(
                'queues', (SELECT count(*) FROM comb.queues),
                'partitions', st.partitions,
                'namespaces', (SELECT count(DISTINCT namespace) FROM comb.queues),
                'tasks', (SELECT count(DISTINCT task) FROM comb.queues),
                'consumerGroups', (SELECT count(DISTINCT consumer_group) FROM comb.subscriptions),
                'messages', jsonb_build_object(
                    'total', st.total, 'pending', st.pending, 'processing', st.processing,
                    'completed', greatest(st.total - st.pending - st.processing, 0),
                    'deadLetters', (SELECT count(*) FROM comb.dead_letters d WHERE NOT EXISTS (
                        SELECT 1 FROM comb.dead_letter_requeues r WHERE r.dead_letter_id = d.id))),
                'oldestPendingAt', comb.iso(st.oldest),
                'oldestPendingAgeSeconds', coalesce(extract(epoch FROM now() - st.oldest), 0)::float8,
                'timestamp', comb.iso(now()))
             FROM (
                SELECT count(*) AS partitions, coalesce(sum(s.head), 0)::bigint AS total,
                       coalesce(sum(s.pending), 0)::bigint AS pending,
                       coalesce(sum(s.processing), 0)::bigint AS processing,
                       min(s.oldest_pending_at) AS oldest
                FROM comb.partitions p CROSS JOIN LATERAL comb.partition_stats(p.id) s
             ) st",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// `GET /api/v1/resources/queues`: a page of queues by name, with their figures.
pub async fn queues(pool: &Pool, filter: &QueueFilter, page: Page) -> Result<Value, Failure> {
    let client = pool.get().await?;
    let args: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
        &filter.namespace,
        &filter.task,
        &filter.search,
        &page.limit,
        &page.offset,
    ];
    let sql = format!(
        "SELECT coalesce(jsonb_agg({QUEUE_JSON} ORDER BY q.name), '[]')
         FROM (SELECT * FROM comb.queues q WHERE {QUEUE_WHERE}
               ORDER BY q.name LIMIT $4 OFFSET $5) q
         {QUEUE_FIGURES}"
    );
    let list: Value = client.query_one(&sql, &args).await?.get(0);
    let total: i64 = client
        .query_one(
            &format!("SELECT count(*) FROM comb.queues q WHERE {QUEUE_WHERE}"),
            &args[..3],
        )
        .await?
        .get(0);
    Ok(json!({"queues": list, "total": total, "limit": page.limit, "offset": page.offset}))
}

/// A partition's figures as JSON, over `comb.partitions p` and its `comb.partition_stats s`.
const PARTITION_JSON: &str = "jsonb_build_object(
    'id', p.id, 'name', p.name, 'createdAt', comb.iso(p.created_at),
    'messages', jsonb_build_object('total', s.head, 'pending', s.pending,
                                   'processing', s.processing),
    'consumerGroups', s.groups,
    'oldestPendingAt', comb.iso(s.oldest_pending_at),
    'oldestPendingAgeSeconds', coalesce(extract(epoch FROM now() - s.oldest_pending_at), 0)::float8,
    'lastMessageAt', comb.iso(s.head_at))";

/// `GET /api/v1/resources/queues/{queue}`: the queue's figures, a page of its partitions
/// and its consumer groups' lag.
pub async fn queue(pool: &Pool, name: &str, page: Page) -> Result<Value, Failure> {
    let client = pool.get().await?;
    let id = super::queue_id(&**client, name).await?;
    let sql = format!("SELECT {QUEUE_JSON} FROM comb.queues q {QUEUE_FIGURES} WHERE q.id = $1");
    let mut out: Value = client.query_one(&sql, &[&id]).await?.get(0);
    let sql = format!(
        "SELECT coalesce(jsonb_agg({PARTITION_JSON} ORDER BY p.name), '[]')
         FROM (SELECT * FROM comb.partitions WHERE queue_id = $1
               ORDER BY name LIMIT $2 OFFSET $3) p
         CROSS JOIN LATERAL comb.partition_stats(p.id) s"
    );
    let partitions: Value = client
        .query_one(&sql, &[&id, &page.limit, &page.offset])
        .await?
        .get(0);
    let groups = super::groups::of_queue(&**client, id).await?;
    out["partitionList"] = partitions;
    out["consumerGroups"] = groups;
    out["limit"] = json!(page.limit);
    out["offset"] = json!(page.offset);
    Ok(out)
}

/// `GET /api/v1/resources/partitions`: a page of partitions (of one queue, or of all by queue
/// and name) with their figures.
pub async fn partitions(pool: &Pool, queue: Option<&str>, page: Page) -> Result<Value, Failure> {
    let client = pool.get().await?;
    let queue_id = match queue {
        Some(q) => Some(super::queue_id(&**client, q).await?),
        None => None,
    };
    let sql = format!(
        "SELECT coalesce(jsonb_agg({PARTITION_JSON} || jsonb_build_object('queue', p.queue)
                                   ORDER BY p.queue, p.name), '[]')
         FROM (SELECT p.*, q.name AS queue FROM comb.partitions p
               JOIN comb.queues q ON q.id = p.queue_id
               WHERE $1::uuid IS NULL OR p.queue_id = $1
               ORDER BY q.name, p.name LIMIT $2 OFFSET $3) p
         CROSS JOIN LATERAL comb.partition_stats(p.id) s"
    );
    let list: Value = client
        .query_one(&sql, &[&queue_id, &page.limit, &page.offset])
        .await?
        .get(0);
    let total: i64 = client
        .query_one(
            "SELECT count(*) FROM comb.partitions WHERE $1::uuid IS NULL OR queue_id = $1",
            &[&queue_id],
        )
        .await?
        .get(0);
    Ok(json!({"partitions": list, "total": total, "limit": page.limit, "offset": page.offset}))
}

/// `GET /api/v1/resources/namespaces` and `/tasks`: each value of the queue column with its
/// queues' counts and depth.
pub async fn groupings(pool: &Pool, column: Grouping) -> Result<Value, Failure> {
    let (col, key) = match column {
        Grouping::Namespace => ("namespace", "namespaces"),
        Grouping::Task => ("task", "tasks"),
    };
    let client = pool.get().await?;
    let sql = format!(
        "SELECT coalesce(jsonb_agg(jsonb_build_object(
                    '{col}', g.v, 'queues', g.queues, 'partitions', g.partitions,
                    'messages', jsonb_build_object('total', g.total, 'pending', g.pending,
                                                   'processing', g.processing))
                ORDER BY g.v), '[]')
         FROM (
            SELECT q.{col} AS v, count(DISTINCT q.id) AS queues, sum(st.partitions)::bigint AS partitions,
                   sum(st.total)::bigint AS total, sum(st.pending)::bigint AS pending,
                   sum(st.processing)::bigint AS processing
            FROM comb.queues q {QUEUE_FIGURES}
            WHERE q.{col} IS NOT NULL
            GROUP BY q.{col}
            ORDER BY q.{col} LIMIT {max}
         ) g",
        max = super::MAX_LIMIT
    );
    let list: Value = client.query_one(&sql, &[]).await?.get(0);
    Ok(json!({ key: list }))
}

/// The queue column a grouping listing groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    Namespace,
    Task,
}

/// `DELETE /api/v1/queues/{queue}/clear`: passes everything pending in the queue (or one
/// partition) for every consumer group, by moving their cursors to the heads. A queue no
/// group reads yet gets the queue-mode group first, so what is cleared stays cleared for it.
pub async fn clear(
    pool: &Pool,
    catalog: &Catalog,
    queue: &str,
    partition: Option<&str>,
) -> Result<Value, Failure> {
    let mut client = pool.get().await?;
    let (id, partition_id) = super::queue_and_partition(&**client, queue, partition).await?;
    super::ensure_a_reader(pool, catalog, id).await?;
    let tx = client.transaction().await?;
    let moved = cursors::move_in(
        &tx,
        Selection {
            queue_id: id,
            group: None,
            partition: partition_id,
            forward_only: false,
        },
        Target::End,
    )
    .await?;
    tx.commit().await?;
    Ok(json!({
        "cleared": true,
        "queue": queue,
        "partition": partition,
        "cursorsMoved": moved.cursors,
        "messagesCleared": moved.unsettled_before,
    }))
}
