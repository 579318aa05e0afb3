//! Resources: queues, partitions, namespaces and tasks with their depth, and clearing what a
//! queue holds pending.
//!
//! A partition's figures are exact: `comb.partition_stats` (schema version 9), the
//! partition's head, its cursors' latest states and the one message after the slowest cursor,
//! all index probes, computed for the page of partitions shown. A queue's totals come from
//! `comb.queue_figures` (schema version 12): computed now for the smallest queues of the
//! answer (up to [`LIVE_PARTITIONS`](crate::backlog::LIVE_PARTITIONS) partitions in all) and for queues made since the newest
//! per-minute snapshot, read from that snapshot for the others; `figuresAt` says when they
//! were taken. A listing pages over catalog rows first and takes figures for that page only.

use deadpool_postgres::Pool;
use serde_json::{Value, json};

use super::cursors::{self, Selection, Target};
use super::{Page, Refusal};
use crate::backlog::queue_figures;
use crate::catalog::Catalog;

/// A queue's figures as a JSON object, for a query over `comb.queues q` joined with
/// [`queue_figures`].
pub(crate) const QUEUE_JSON: &str = "jsonb_build_object(
    'id', q.id, 'name', q.name, 'namespace', q.namespace, 'task', q.task,
    'createdAt', comb.iso(q.created_at), 'options', q.options,
    'partitions', st.partitions,
    'messages', jsonb_build_object('total', st.total, 'pending', st.pending,
                                   'processing', st.processing,
                                   'completed', greatest(st.total - st.pending - st.processing, 0),
                                   'deadLetters', st.dead_letters),
    'deadLetters', st.dead_letters,
    'oldestPendingAt', comb.iso(st.oldest_pending_at),
    'oldestPendingAgeSeconds', coalesce(extract(epoch FROM now() - st.oldest_pending_at), 0)::float8,
    'lastMessageAt', comb.iso(st.last_message_at),
    'figuresAt', comb.iso(st.figures_at),
    'figuresAgeSeconds', greatest(extract(epoch FROM now() - st.figures_at), 0)::float8,
    'figuresLive', st.live)";

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

/// `GET /api/v1/resources/overview`: counts and depth of everything. `figuresAt` is when the
/// oldest of the queue totals summed was taken.
pub async fn overview(pool: &Pool) -> Result<Value, Refusal> {
    let client = pool.get().await?;
    let sql = format!(
        "SELECT jsonb_build_object(
            'queues', (SELECT count(*) FROM comb.queues),
            'partitions', (SELECT count(*) FROM comb.partitions),
            'namespaces', (SELECT count(DISTINCT namespace) FROM comb.queues),
            'tasks', (SELECT count(DISTINCT task) FROM comb.queues),
            'consumerGroups', (SELECT count(DISTINCT consumer_group) FROM comb.subscriptions),
            'messages', jsonb_build_object(
                'total', t.total, 'pending', t.pending, 'processing', t.processing,
                'completed', greatest(t.total - t.pending - t.processing, 0),
                'deadLetters', t.dead_letters),
            'oldestPendingAt', comb.iso(t.oldest),
            'oldestPendingAgeSeconds', coalesce(extract(epoch FROM now() - t.oldest), 0)::float8,
            'figuresAt', comb.iso(t.figures_at),
            'figuresAgeSeconds', greatest(extract(epoch FROM now() - t.figures_at), 0)::float8,
            'timestamp', comb.iso(now()))
         FROM (
            SELECT coalesce(sum(st.total), 0)::bigint AS total,
                   coalesce(sum(st.pending), 0)::bigint AS pending,
                   coalesce(sum(st.processing), 0)::bigint AS processing,
                   coalesce(sum(st.dead_letters), 0)::bigint AS dead_letters,
                   min(st.oldest_pending_at) AS oldest,
                   coalesce(min(st.figures_at), now()) AS figures_at
            FROM comb.queues q {figures}
         ) t",
        figures = queue_figures("ARRAY(SELECT id FROM comb.queues)")
    );
    let row = client.query_one(&sql, &[]).await?;
    Ok(row.get(0))
}

/// `GET /api/v1/resources/queues`: a page of queues by name, with their figures.
pub async fn queues(pool: &Pool, filter: &QueueFilter, page: Page) -> Result<Value, Refusal> {
    let client = pool.get().await?;
    let args: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
        &filter.namespace,
        &filter.task,
        &filter.search,
        &page.limit,
        &page.offset,
    ];
    let sql = format!(
        "WITH page AS (SELECT * FROM comb.queues q WHERE {QUEUE_WHERE}
                       ORDER BY q.name LIMIT $4 OFFSET $5)
         SELECT coalesce(jsonb_agg({QUEUE_JSON} ORDER BY q.name), '[]')
         FROM page q {figures}",
        figures = queue_figures("ARRAY(SELECT id FROM page)")
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

/// Each group's lag on partition `p`, exact, as the lateral `gl`: index probes per cursor.
const PARTITION_GROUP_LAG: &str = "
CROSS JOIN LATERAL (
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'consumerGroup', c.consumer_group, 'cursor', x.cursor_pos, 'lag', x.lag,
               'lagSeconds', coalesce(extract(epoch FROM now() - x.oldest_unsettled_at), 0)::float8,
               'leaseExpiresAt', comb.iso(x.lease_expires_at))
           ORDER BY c.consumer_group), '[]') AS groups
    FROM comb.cursors c CROSS JOIN LATERAL comb.cursor_lag(c.partition_id, c.consumer_group) x
    WHERE c.partition_id = p.id
) gl";

/// `GET /api/v1/resources/queues/{queue}`: the queue's figures, a page of its partitions
/// (each with every group's exact lag there) and its consumer groups' lag.
pub async fn queue(pool: &Pool, name: &str, page: Page) -> Result<Value, Refusal> {
    let client = pool.get().await?;
    let id = super::queue_id(&**client, name).await?;
    let sql = format!(
        "SELECT {QUEUE_JSON} FROM comb.queues q {figures} WHERE q.id = $1",
        figures = queue_figures("ARRAY[$1::uuid]")
    );
    let mut out: Value = client.query_one(&sql, &[&id]).await?.get(0);
    let sql = format!(
        "SELECT coalesce(jsonb_agg({PARTITION_JSON} || jsonb_build_object('groupLag', gl.groups)
                                   ORDER BY p.name), '[]')
         FROM (SELECT * FROM comb.partitions WHERE queue_id = $1
               ORDER BY name LIMIT $2 OFFSET $3) p
         CROSS JOIN LATERAL comb.partition_stats(p.id) s
         {PARTITION_GROUP_LAG}"
    );
    let partitions: Value = client
        .query_one(&sql, &[&id, &page.limit, &page.offset])
        .await?
        .get(0);
    let groups = super::groups::of_queue(&**client, id).await?;
    out["partitionList"] = partitions;
    out["consumerGroups"] = json!(groups);
    out["limit"] = json!(page.limit);
    out["offset"] = json!(page.offset);
    Ok(out)
}

/// `GET /api/v1/resources/partitions`: a page of partitions (of one queue, or of all by queue
/// and name) with their figures.
pub async fn partitions(pool: &Pool, queue: Option<&str>, page: Page) -> Result<Value, Refusal> {
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
pub async fn groupings(pool: &Pool, column: Grouping) -> Result<Value, Refusal> {
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
            FROM comb.queues q {figures}
            WHERE q.{col} IS NOT NULL
            GROUP BY q.{col}
            ORDER BY q.{col} LIMIT {max}
         ) g",
        max = super::MAX_LIMIT,
        figures = queue_figures(&format!(
            "ARRAY(SELECT id FROM comb.queues WHERE {col} IS NOT NULL)"
        )),
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
) -> Result<Value, Refusal> {
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
