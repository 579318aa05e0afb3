//! Consumer groups: their lag per queue and partition, leases, deletion, subscription
//! changes and seeks.
//!
//! A cursor's lag comes from `comb.cursor_lag` (schema version 9): its latest state, its
//! partition's head and the first unsettled message's time, all index probes. A group's lag
//! on a queue comes from `comb.group_figures` (schema version 12): computed now for the
//! smallest (queue, group) pairs of the answer (up to [`LIVE_PARTITIONS`](crate::backlog::LIVE_PARTITIONS) cursors in all) and
//! for pairs made since the newest per-minute snapshot, read from that snapshot for the
//! others (`figuresAt` says when).

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use serde_json::{Value, json};
use tokio_postgres::GenericClient;
use uuid::Uuid;

use super::cursors::{self, Selection, Target};
use super::{MAX_LIMIT, Page, Refusal};
use crate::backlog::group_lag;
use crate::catalog::{Catalog, StartFrom};
use crate::code::Code;

/// How old a lag figure is, as JSON members, for objects built over [`group_lag`]'s `l`.
const FIGURES_AT: &str = "'figuresAt', comb.iso(l.figures_at),
    'figuresAgeSeconds', greatest(extract(epoch FROM now() - l.figures_at), 0)::float8";

/// Leases held now, summed over every (queue, group) as [`group_lag`] takes them.
pub(crate) fn leases_sql() -> String {
    format!(
        "SELECT coalesce(sum(l.leased), 0)::bigint FROM comb.subscriptions sub {lag}",
        lag = group_lag("SELECT queue_id, consumer_group FROM comb.subscriptions")
    )
}

/// The groups reading one queue, with their lag.
pub(crate) async fn of_queue(
    client: &impl GenericClient,
    queue_id: Uuid,
) -> Result<Value, Refusal> {
    let sql = format!(
        "WITH sub AS (SELECT * FROM comb.subscriptions WHERE queue_id = $1
                      ORDER BY consumer_group LIMIT {MAX_LIMIT})
         SELECT coalesce(jsonb_agg(jsonb_build_object(
                    'name', sub.consumer_group, 'mode', sub.mode,
                    'subscribedAt', comb.iso(sub.created_at), 'partitions', l.partitions,
                    'lag', l.lag, 'lagSeconds', l.lag_seconds, 'leasedPartitions', l.leased,
                    {FIGURES_AT})
                ORDER BY sub.consumer_group), '[]')
         FROM sub {lag}",
        lag = group_lag("SELECT queue_id, consumer_group FROM sub")
    );
    Ok(client.query_one(&sql, &[&queue_id]).await?.get(0))
}

/// `GET /api/v1/consumer-groups`: every group with its queues and their lag (messages and
/// seconds), as Queen answers it: a JSON array.
pub async fn list(pool: &Pool) -> Result<Value, Refusal> {
    let client = pool.get().await?;
    let sql = format!(
        "WITH sub AS (SELECT * FROM comb.subscriptions
                      ORDER BY consumer_group, queue_id LIMIT {MAX_LIMIT})
         SELECT coalesce(jsonb_agg(jsonb_build_object(
                    'name', g.name, 'queues', g.queues, 'queueCount', g.n,
                    'totalLag', g.lag, 'maxLagSeconds', g.lag_seconds,
                    'state', CASE WHEN g.lag = 0 THEN 'Stable' ELSE 'Lagging' END)
                ORDER BY g.name), '[]')
         FROM (
            SELECT sub.consumer_group AS name, count(*) AS n, sum(l.lag)::bigint AS lag,
                   max(l.lag_seconds) AS lag_seconds,
                   jsonb_agg(jsonb_build_object(
                       'queue', q.name, 'mode', sub.mode, 'partitions', l.partitions,
                       'lag', l.lag, 'lagSeconds', l.lag_seconds,
                       'leasedPartitions', l.leased, {FIGURES_AT}) ORDER BY q.name) AS queues
            FROM sub
            JOIN comb.queues q ON q.id = sub.queue_id
            {lag}
            GROUP BY sub.consumer_group
         ) g",
        lag = group_lag("SELECT queue_id, consumer_group FROM sub")
    );
    Ok(client.query_one(&sql, &[]).await?.get(0))
}

/// `GET /api/v1/consumer-groups/{group}`: the group's queues (or the one named), each with
/// a page of its partitions in name order (cursor, head, lag and lease, exact) and how many
/// it has: a group reading many wide queues costs a page of cursors per queue, not every one.
pub async fn detail(
    pool: &Pool,
    group: &str,
    queue: Option<&str>,
    page: Page,
) -> Result<Value, Refusal> {
    let client = pool.get().await?;
    let sql = format!(
        "SELECT jsonb_agg(jsonb_build_object(
                    'queue', q.name, 'mode', sub.mode, 'subscribedAt', comb.iso(sub.created_at),
                    'lag', l.lag, 'lagSeconds', l.lag_seconds, {FIGURES_AT},
                    'partitionsTotal', l.partitions,
                    'partitions', (
                        SELECT coalesce(jsonb_agg(jsonb_build_object(
                                   'partitionId', p.id, 'partition', p.name,
                                   'cursor', x.cursor_pos, 'head', x.head, 'lag', x.lag,
                                   'lagSeconds', coalesce(extract(epoch FROM now() - x.oldest_unsettled_at), 0)::float8,
                                   'leaseId', x.lease_id,
                                   'leaseExpiresAt', comb.iso(x.lease_expires_at),
                                   'lastClaimedAt', comb.iso(x.last_claimed_at))
                               ORDER BY p.name), '[]')
                        FROM (SELECT p.* FROM comb.partitions p
                              WHERE p.queue_id = sub.queue_id
                              ORDER BY p.name LIMIT $2 OFFSET $3) p
                        CROSS JOIN LATERAL comb.cursor_lag(p.id, sub.consumer_group) x))
                ORDER BY q.name)
         FROM comb.subscriptions sub
         JOIN comb.queues q ON q.id = sub.queue_id
         {lag}
         WHERE sub.consumer_group = $1 AND ($4::text IS NULL OR q.name = $4)",
        lag = group_lag(
            "SELECT s.queue_id, s.consumer_group FROM comb.subscriptions s
             JOIN comb.queues q ON q.id = s.queue_id
             WHERE s.consumer_group = $1 AND ($4::text IS NULL OR q.name = $4)"
        )
    );
    let queues: Option<Value> = client
        .query_one(&sql, &[&group, &page.limit, &page.offset, &queue])
        .await?
        .get(0);
    let queues = queues.ok_or_else(|| match queue {
        Some(queue) => Refusal::not_found(
            Code::ConsumerGroupNotFound,
            format!("consumer group `{group}` does not read queue `{queue}`"),
        ),
        None => Refusal::not_found(
            Code::ConsumerGroupNotFound,
            format!("consumer group `{group}` reads no queue"),
        ),
    })?;
    Ok(json!({"name": group, "queues": queues, "limit": page.limit, "offset": page.offset}))
}

/// `GET /api/v1/consumer-groups/lagging`: where a group's oldest unsettled message waits
/// for at least `min_seconds`, the longest first. Pairs of (queue, group) whose lag is
/// computed now (see [`group_lag`]) are listed per partition, each cursor exact; pairs served
/// from the snapshot are listed once, for the whole queue (`partition` null, `partitions`
/// their count, `figuresAt` the snapshot's time): per cursor they would cost a probe of every
/// partition.
pub async fn lagging(pool: &Pool, min_seconds: f64) -> Result<Value, Refusal> {
    let client = pool.get().await?;
    let sql = format!(
        "WITH sub AS (SELECT queue_id, consumer_group FROM comb.subscriptions), pairs AS (
            SELECT l.* FROM sub {lag}
         )
         SELECT coalesce(jsonb_agg(r.j ORDER BY r.secs DESC), '[]') FROM (
            SELECT * FROM (
                SELECT jsonb_build_object(
                           'consumerGroup', l.consumer_group, 'queue', q.name,
                           'partition', p.name, 'partitionId', p.id, 'lag', x.lag,
                           'lagSeconds', extract(epoch FROM now() - x.oldest_unsettled_at)::float8,
                           'oldestUnsettledAt', comb.iso(x.oldest_unsettled_at)) AS j,
                       extract(epoch FROM now() - x.oldest_unsettled_at) AS secs
                FROM pairs l
                CROSS JOIN LATERAL comb.lagging_cursors(
                    CASE WHEN l.live THEN l.queue_id END, l.consumer_group, $1) x
                JOIN comb.partitions p ON p.id = x.partition_id
                JOIN comb.queues q ON q.id = l.queue_id
                UNION ALL
                SELECT jsonb_build_object(
                           'consumerGroup', l.consumer_group, 'queue', q.name,
                           'partition', NULL, 'partitionId', NULL, 'partitions', l.partitions,
                           'lag', l.lag, 'lagSeconds', l.lag_seconds,
                           'oldestUnsettledAt', comb.iso(l.oldest_unsettled_at), {FIGURES_AT}),
                       extract(epoch FROM now() - l.oldest_unsettled_at)
                FROM pairs l JOIN comb.queues q ON q.id = l.queue_id
                WHERE NOT l.live AND l.lag > 0
                  AND l.oldest_unsettled_at <= now() - make_interval(secs => $1)
            ) u
            ORDER BY secs DESC LIMIT {MAX_LIMIT}
         ) r",
        lag = group_lag("SELECT queue_id, consumer_group FROM sub")
    );
    Ok(client.query_one(&sql, &[&min_seconds]).await?.get(0))
}

/// `DELETE /api/v1/consumer-groups/{group}/queues/{queue}`: with `delete_metadata` the group
/// stops reading the queue (cursors and subscription go; its next pop subscribes it anew);
/// without, it keeps its subscription and starts again where it first subscribed.
pub async fn delete_for_queue(
    pool: &Pool,
    catalog: &Catalog,
    group: &str,
    queue: &str,
    delete_metadata: bool,
) -> Result<Value, Refusal> {
    let mut client = pool.get().await?;
    let id = super::queue_id(&**client, queue).await?;
    let tx = client.transaction().await?;
    let sub = tx
        .query_opt(
            "SELECT mode, start_at, created_at FROM comb.subscriptions
             WHERE queue_id = $1 AND consumer_group = $2 FOR UPDATE",
            &[&id, &group],
        )
        .await?
        .ok_or_else(|| {
            Refusal::not_found(
                Code::ConsumerGroupNotFound,
                format!("consumer group `{group}` does not read queue `{queue}`"),
            )
        })?;
    let partitions = if delete_metadata {
        // Cursor rows are locked before they go, as every writer of cursors does.
        tx.query(
            "SELECT 1 FROM comb.cursors WHERE queue_id = $1 AND consumer_group = $2
             ORDER BY partition_id FOR UPDATE",
            &[&id, &group],
        )
        .await?;
        let n = tx
            .execute(
                "DELETE FROM comb.cursors WHERE queue_id = $1 AND consumer_group = $2",
                &[&id, &group],
            )
            .await?;
        tx.execute(
            "DELETE FROM comb.subscriptions WHERE queue_id = $1 AND consumer_group = $2",
            &[&id, &group],
        )
        .await?;
        // Every server forgets the queue's cached subscriptions.
        crate::wake::announce_queue_deleted(&tx, queue).await?;
        n
    } else {
        let mode: String = sub.get(0);
        let start_at: Option<DateTime<Utc>> = sub.get(1);
        let created_at: DateTime<Utc> = sub.get(2);
        let target = match mode.as_str() {
            "from" => Target::Time(start_at.unwrap_or(created_at)),
            "new" => Target::Time(created_at),
            _ => Target::Start,
        };
        let moved = cursors::move_in(
            &tx,
            Selection {
                queue_id: id,
                group: Some(group),
                partition: None,
                forward_only: false,
            },
            target,
        )
        .await?;
        moved.cursors
    };
    tx.commit().await?;
    if delete_metadata {
        // This server forgets at once; the others when the announcement reaches them.
        catalog.forget_queue(queue);
    }
    Ok(json!({
        "success": true,
        "consumerGroup": group,
        "queueName": queue,
        "deletedPartitions": partitions,
        "metadataDeleted": delete_metadata,
    }))
}

/// `POST /api/v1/consumer-groups/{group}/subscription`: the group reads every queue it is
/// subscribed to from `at` on: the subscriptions record it, and cursors still behind it move
/// forward to it (none moves back).
pub async fn set_subscription(
    pool: &Pool,
    group: &str,
    at: DateTime<Utc>,
) -> Result<Value, Refusal> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let queues: Vec<Uuid> = tx
        .query(
            "UPDATE comb.subscriptions SET mode = 'from', start_at = $2
             WHERE consumer_group = $1 RETURNING queue_id",
            &[&group, &at],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if queues.is_empty() {
        return Err(Refusal::not_found(
            Code::ConsumerGroupNotFound,
            format!("consumer group `{group}` reads no queue"),
        ));
    }
    let mut moved = 0;
    for queue_id in &queues {
        moved += cursors::move_in(
            &tx,
            Selection {
                queue_id: *queue_id,
                group: Some(group),
                partition: None,
                forward_only: true,
            },
            Target::Time(at),
        )
        .await?
        .cursors;
    }
    tx.commit().await?;
    Ok(json!({
        "success": true,
        "consumerGroup": group,
        "subscriptionTimestamp": at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "queuesUpdated": queues.len(),
        "cursorsMoved": moved,
    }))
}

/// `POST /api/v1/consumer-groups/{group}/queues/{queue}[/partitions/{partition}]/seek`:
/// moves the group's cursors of every partition of the queue (or one) to `target`. A group
/// that never read the queue is subscribed first, so partitions it never read move too.
pub async fn seek(
    pool: &Pool,
    catalog: &Catalog,
    group: &str,
    queue: &str,
    partition: Option<&str>,
    target: Target,
) -> Result<Value, Refusal> {
    let mut client = pool.get().await?;
    let (id, partition_id) = super::queue_and_partition(&**client, queue, partition).await?;
    catalog
        .ensure_subscription(pool, id, group, StartFrom::All)
        .await?;
    let tx = client.transaction().await?;
    let moved = cursors::move_in(
        &tx,
        Selection {
            queue_id: id,
            group: Some(group),
            partition: partition_id,
            forward_only: false,
        },
        target,
    )
    .await?;
    tx.commit().await?;
    let (to_end, timestamp) = match target {
        Target::End => (true, None),
        Target::Start => (false, None),
        Target::Time(t) => (
            false,
            Some(t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        ),
    };
    Ok(json!({
        "success": true,
        "consumerGroup": group,
        "queueName": queue,
        "partition": partition,
        "toEnd": to_end,
        "toStart": target == Target::Start,
        "timestamp": timestamp,
        "partitionsMoved": moved.cursors,
        "lag": moved.unsettled_after,
    }))
}
