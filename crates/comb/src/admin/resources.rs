//! Resources: queues, partitions, namespaces and tasks with their depth, and clearing what a
//! queue holds pending.
//!
//! A partition's figures are exact: `comb.partition_stats` (schema version 9), the
//! partition's head, its cursors' latest states and the one message after the slowest cursor,
//! all index probes, computed for the page of partitions shown. A queue's totals come from
//! `comb.queue_figures` (schema version 12): computed now for the smallest queues of the
//! answer (up to [`LIVE_PARTITIONS`](crate::backlog::LIVE_PARTITIONS) partitions in all) and for queues made since the newest
//! per-minute snapshot, read from that snapshot for the others; `figuresAt` says when they
//! were taken. A listing pages over catalog rows first (`catalog::listing`) and takes figures
//! for that page only, over the page's ids.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use serde::{Deserialize, Serialize};
use tokio_postgres::{GenericClient, Row};
use utoipa::ToSchema;
use uuid::Uuid;

use super::cursors::{self, Selection, Target};
use super::groups::QueueGroup;
use super::wire::{iso, iso_opt};
use super::{Page, Refusal};
use crate::backend::Backend;
use crate::backlog::queue_figures;
use crate::catalog::Catalog;
use crate::catalog::listing::{self, QueueRow};
pub(crate) use crate::catalog::listing::{Grouping, QueueFilter};

/// Messages of a queue (or of all) by state.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageCounts {
    pub total: Option<i64>,
    pub pending: Option<i64>,
    pub processing: Option<i64>,
    pub completed: Option<i64>,
    pub dead_letters: Option<i64>,
}

/// A queue with its figures, as every queue listing shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueFigures {
    pub id: Uuid,
    pub name: String,
    pub namespace: Option<String>,
    pub task: Option<String>,
    #[serde(serialize_with = "iso")]
    pub created_at: DateTime<Utc>,
    /// The queue's options as stored.
    pub options: serde_json::Value,
    pub partitions: Option<i64>,
    pub messages: MessageCounts,
    pub dead_letters: Option<i64>,
    #[serde(serialize_with = "iso_opt")]
    pub oldest_pending_at: Option<DateTime<Utc>>,
    #[serde(serialize_with = "super::wire::num")]
    pub oldest_pending_age_seconds: f64,
    #[serde(serialize_with = "iso_opt")]
    pub last_message_at: Option<DateTime<Utc>>,
    #[serde(serialize_with = "iso_opt")]
    pub figures_at: Option<DateTime<Utc>>,
    #[serde(serialize_with = "super::wire::num_opt")]
    pub figures_age_seconds: Option<f64>,
    /// Whether the figures were computed now rather than read from the snapshot.
    pub figures_live: Option<bool>,
}

/// The figures of the queues whose ids are given, by id: one statement over the ids.
async fn figures_of(
    client: &impl GenericClient,
    queues: Vec<QueueRow>,
) -> Result<Vec<QueueFigures>, Refusal> {
    let ids: Vec<Uuid> = queues.iter().map(|q| q.id).collect();
    let sql = format!(
        "SELECT q.id, st.partitions, st.total, st.pending, st.processing,
                greatest(st.total - st.pending - st.processing, 0) AS completed,
                st.dead_letters, st.oldest_pending_at,
                coalesce(extract(epoch FROM now() - st.oldest_pending_at), 0)::float8
                    AS oldest_pending_age,
                st.last_message_at, st.figures_at,
                greatest(extract(epoch FROM now() - st.figures_at), 0)::float8 AS figures_age,
                st.live
         FROM unnest($1::uuid[]) AS q(id) {figures}",
        figures = queue_figures("$1::uuid[]")
    );
    let mut figures: HashMap<Uuid, Row> = client
        .query(&sql, &[&ids])
        .await?
        .into_iter()
        .map(|r| (r.get("id"), r))
        .collect();
    Ok(queues
        .into_iter()
        .filter_map(|q| {
            let st = figures.remove(&q.id)?;
            Some(QueueFigures {
                id: q.id,
                name: q.name,
                namespace: q.namespace,
                task: q.task,
                created_at: q.created_at,
                options: q.options,
                partitions: st.get("partitions"),
                messages: MessageCounts {
                    total: st.get("total"),
                    pending: st.get("pending"),
                    processing: st.get("processing"),
                    completed: st.get("completed"),
                    dead_letters: st.get("dead_letters"),
                },
                dead_letters: st.get("dead_letters"),
                oldest_pending_at: st.get("oldest_pending_at"),
                oldest_pending_age_seconds: st.get("oldest_pending_age"),
                last_message_at: st.get("last_message_at"),
                figures_at: st.get("figures_at"),
                figures_age_seconds: st.get("figures_age"),
                figures_live: st.get("live"),
            })
        })
        .collect())
}

/// `GET /api/v1/resources/overview`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Overview {
    pub queues: i64,
    pub partitions: i64,
    pub namespaces: i64,
    pub tasks: i64,
    pub consumer_groups: i64,
    pub messages: MessageCounts,
    #[serde(serialize_with = "iso_opt")]
    pub oldest_pending_at: Option<DateTime<Utc>>,
    #[serde(serialize_with = "super::wire::num")]
    pub oldest_pending_age_seconds: f64,
    /// When the oldest of the queue totals summed was taken.
    #[serde(serialize_with = "iso")]
    pub figures_at: DateTime<Utc>,
    #[serde(serialize_with = "super::wire::num")]
    pub figures_age_seconds: f64,
    #[serde(serialize_with = "iso")]
    pub timestamp: DateTime<Utc>,
}

/// `GET /api/v1/resources/overview`: counts and depth of everything. `figuresAt` is when the
/// oldest of the queue totals summed was taken.
pub async fn overview(pool: &Pool) -> Result<Overview, Refusal> {
    let client = pool.get().await?;
    let counts = listing::counts(&**client).await?;
    let sql = format!(
        "SELECT t.*, now() AS now,
                coalesce(extract(epoch FROM now() - t.oldest), 0)::float8 AS oldest_age,
                greatest(extract(epoch FROM now() - t.figures_at), 0)::float8 AS figures_age
         FROM (
            SELECT coalesce(sum(st.total), 0)::bigint AS total,
                   coalesce(sum(st.pending), 0)::bigint AS pending,
                   coalesce(sum(st.processing), 0)::bigint AS processing,
                   coalesce(sum(st.dead_letters), 0)::bigint AS dead_letters,
                   min(st.oldest_pending_at) AS oldest,
                   coalesce(min(st.figures_at), now()) AS figures_at
            FROM unnest($1::uuid[]) AS q(id) {figures}
         ) t",
        figures = queue_figures("$1::uuid[]")
    );
    let t = client.query_one(&sql, &[&counts.queue_ids]).await?;
    let (total, pending, processing): (i64, i64, i64) =
        (t.get("total"), t.get("pending"), t.get("processing"));
    Ok(Overview {
        queues: counts.queues,
        partitions: counts.partitions,
        namespaces: counts.namespaces,
        tasks: counts.tasks,
        consumer_groups: counts.consumer_groups,
        messages: MessageCounts {
            total: Some(total),
            pending: Some(pending),
            processing: Some(processing),
            completed: Some((total - pending - processing).max(0)),
            dead_letters: t.get("dead_letters"),
        },
        oldest_pending_at: t.get("oldest"),
        oldest_pending_age_seconds: t.get("oldest_age"),
        figures_at: t.get("figures_at"),
        figures_age_seconds: t.get("figures_age"),
        timestamp: t.get("now"),
    })
}

/// `GET /api/v1/resources/queues` (and `/api/v1/status/queues`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueList {
    pub queues: Vec<QueueFigures>,
    /// Queues the filter selects in all.
    pub total: i64,
    pub limit: i64,
    pub offset: i64,
}

/// `GET /api/v1/resources/queues`: a page of queues by name, with their figures.
pub async fn queues(pool: &Pool, filter: &QueueFilter, page: Page) -> Result<QueueList, Refusal> {
    let client = pool.get().await?;
    let (rows, total) = listing::queue_page(&**client, filter, page.limit, page.offset).await?;
    Ok(QueueList {
        queues: figures_of(&**client, rows).await?,
        total,
        limit: page.limit,
        offset: page.offset,
    })
}

/// A partition with its figures, exact.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PartitionFigures {
    pub id: Uuid,
    pub name: String,
    #[serde(serialize_with = "iso")]
    pub created_at: DateTime<Utc>,
    pub messages: PartitionMessages,
    /// Groups with a cursor here.
    pub consumer_groups: Option<i64>,
    #[serde(serialize_with = "iso_opt")]
    pub oldest_pending_at: Option<DateTime<Utc>>,
    #[serde(serialize_with = "super::wire::num")]
    pub oldest_pending_age_seconds: f64,
    #[serde(serialize_with = "iso_opt")]
    pub last_message_at: Option<DateTime<Utc>>,
}

/// A partition's messages: `total` is its head, the newest position stored.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PartitionMessages {
    pub total: Option<i64>,
    pub pending: Option<i64>,
    pub processing: Option<i64>,
}

/// `comb.partition_stats` of each partition given, by id.
async fn partition_stats(
    client: &impl GenericClient,
    partitions: &[Uuid],
) -> Result<HashMap<Uuid, Row>, Refusal> {
    Ok(client
        .query(
            "SELECT k.id, s.head, s.head_at, s.pending, s.processing, s.oldest_pending_at,
                    coalesce(extract(epoch FROM now() - s.oldest_pending_at), 0)::float8
                        AS oldest_pending_age,
                    s.groups
             FROM unnest($1::uuid[]) AS k(id)
             CROSS JOIN LATERAL comb.partition_stats(k.id) s",
            &[&partitions],
        )
        .await?
        .into_iter()
        .map(|r| (r.get("id"), r))
        .collect())
}

fn partition_figures(p: &listing::PartitionRow, s: &Row) -> PartitionFigures {
    PartitionFigures {
        id: p.id,
        name: p.name.clone(),
        created_at: p.created_at,
        messages: PartitionMessages {
            total: s.get("head"),
            pending: s.get("pending"),
            processing: s.get("processing"),
        },
        consumer_groups: s.get("groups"),
        oldest_pending_at: s.get("oldest_pending_at"),
        oldest_pending_age_seconds: s.get("oldest_pending_age"),
        last_message_at: s.get("head_at"),
    }
}

/// A partition of a queue's page, with every group's exact lag there.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueuePartition {
    #[serde(flatten)]
    pub figures: PartitionFigures,
    pub group_lag: Vec<PartitionGroupLag>,
}

/// A group's cursor on one partition.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PartitionGroupLag {
    pub consumer_group: String,
    pub cursor: Option<i64>,
    pub lag: Option<i64>,
    #[serde(serialize_with = "super::wire::num")]
    pub lag_seconds: f64,
    #[serde(serialize_with = "iso_opt")]
    pub lease_expires_at: Option<DateTime<Utc>>,
}

/// `GET /api/v1/resources/queues/{queue}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueDetail {
    #[serde(flatten)]
    pub queue: QueueFigures,
    pub partition_list: Vec<QueuePartition>,
    pub consumer_groups: Vec<QueueGroup>,
    pub limit: i64,
    pub offset: i64,
}

/// `GET /api/v1/resources/queues/{queue}`: the queue's figures, a page of its partitions
/// (each with every group's exact lag there) and its consumer groups' lag.
pub async fn queue(pool: &Pool, name: &str, page: Page) -> Result<QueueDetail, Refusal> {
    let client = pool.get().await?;
    let id = super::queue_id(&**client, name).await?;
    let not_found = || {
        Refusal::not_found(
            crate::code::Code::QueueNotFound,
            format!("queue `{name}` does not exist"),
        )
    };
    let row = listing::queue_row(&**client, id)
        .await?
        .ok_or_else(not_found)?;
    let queue = figures_of(&**client, vec![row])
        .await?
        .pop()
        .ok_or_else(not_found)?;
    let (partitions, _) =
        listing::partition_page(&**client, Some(id), page.limit, page.offset).await?;
    let ids: Vec<Uuid> = partitions.iter().map(|p| p.id).collect();
    let stats = partition_stats(&**client, &ids).await?;
    // Each cursor's lag: the cursors from their owner, their lag over (partition, group).
    let cursors = crate::cursor::cursors_of_partitions(&**client, &ids).await?;
    let (cursor_partitions, cursor_groups): (Vec<Uuid>, Vec<String>) = cursors.into_iter().unzip();
    let mut lags: HashMap<Uuid, Vec<PartitionGroupLag>> = HashMap::new();
    for r in client
        .query(
            concat!(
                "SELECT k.p, k.g, x.cursor_pos, x.lag,
                        coalesce(extract(epoch FROM now() - x.oldest_unsettled_at), 0)::float8
                            AS lag_seconds,
                        x.lease_expires_at
                 FROM unnest($1::uuid[], $2::text[]) WITH ORDINALITY AS k(p, g, i)
                 CROSS JOIN LATERAL ",
                crate::cursor::lag_of!("k.p", "k.g"),
                " x
                 ORDER BY k.i"
            ),
            &[&cursor_partitions, &cursor_groups],
        )
        .await?
    {
        lags.entry(r.get("p")).or_default().push(PartitionGroupLag {
            consumer_group: r.get("g"),
            cursor: r.get("cursor_pos"),
            lag: r.get("lag"),
            lag_seconds: r.get("lag_seconds"),
            lease_expires_at: r.get("lease_expires_at"),
        });
    }
    let partition_list = partitions
        .iter()
        .filter_map(|p| {
            let s = stats.get(&p.id)?;
            Some(QueuePartition {
                figures: partition_figures(p, s),
                group_lag: lags.remove(&p.id).unwrap_or_default(),
            })
        })
        .collect();
    Ok(QueueDetail {
        queue,
        partition_list,
        consumer_groups: super::groups::of_queue(&**client, id).await?,
        limit: page.limit,
        offset: page.offset,
    })
}

/// A partition in `GET /api/v1/resources/partitions`, with its queue's name.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListedPartition {
    #[serde(flatten)]
    pub figures: PartitionFigures,
    pub queue: String,
}

/// `GET /api/v1/resources/partitions`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PartitionList {
    pub partitions: Vec<ListedPartition>,
    pub total: i64,
    pub limit: i64,
    pub offset: i64,
}

/// `GET /api/v1/resources/partitions`: a page of partitions (of one queue, or of all by queue
/// and name) with their figures.
pub async fn partitions(
    pool: &Pool,
    queue: Option<&str>,
    page: Page,
) -> Result<PartitionList, Refusal> {
    let client = pool.get().await?;
    let queue_id = match queue {
        Some(q) => Some(super::queue_id(&**client, q).await?),
        None => None,
    };
    let (rows, total) =
        listing::partition_page(&**client, queue_id, page.limit, page.offset).await?;
    let ids: Vec<Uuid> = rows.iter().map(|p| p.id).collect();
    let stats = partition_stats(&**client, &ids).await?;
    Ok(PartitionList {
        partitions: rows
            .iter()
            .filter_map(|p| {
                Some(ListedPartition {
                    figures: partition_figures(p, stats.get(&p.id)?),
                    queue: p.queue.clone(),
                })
            })
            .collect(),
        total,
        limit: page.limit,
        offset: page.offset,
    })
}

/// A namespace or task with its queues' counts and depth.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GroupingFigures {
    /// Set in a namespace listing.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub namespace: Option<String>,
    /// Set in a task listing.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub task: Option<String>,
    pub queues: i64,
    pub partitions: Option<i64>,
    pub messages: PartitionMessages,
}

/// `GET /api/v1/resources/namespaces` (`namespaces` set) or `/tasks` (`tasks` set).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct GroupingList {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub namespaces: Option<Vec<GroupingFigures>>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub tasks: Option<Vec<GroupingFigures>>,
}

/// `GET /api/v1/resources/namespaces` and `/tasks`: each value of the queue column with its
/// queues' counts and depth.
pub async fn groupings(pool: &Pool, column: Grouping) -> Result<GroupingList, Refusal> {
    let client = pool.get().await?;
    let (values, ids): (Vec<String>, Vec<Uuid>) = listing::queues_by(&**client, column)
        .await?
        .into_iter()
        .unzip();
    let sql = format!(
        "SELECT q.v, count(DISTINCT q.id) AS queues, sum(st.partitions)::bigint AS partitions,
                sum(st.total)::bigint AS total, sum(st.pending)::bigint AS pending,
                sum(st.processing)::bigint AS processing
         FROM unnest($1::text[], $2::uuid[]) AS q(v, id)
         {figures}
         GROUP BY q.v
         ORDER BY q.v LIMIT {max}",
        max = super::MAX_LIMIT,
        figures = queue_figures("$2::uuid[]"),
    );
    let list: Vec<GroupingFigures> = client
        .query(&sql, &[&values, &ids])
        .await?
        .iter()
        .map(|r| {
            let v: String = r.get("v");
            GroupingFigures {
                namespace: (column == Grouping::Namespace).then(|| v.clone()),
                task: (column == Grouping::Task).then_some(v),
                queues: r.get("queues"),
                partitions: r.get("partitions"),
                messages: PartitionMessages {
                    total: r.get("total"),
                    pending: r.get("pending"),
                    processing: r.get("processing"),
                },
            }
        })
        .collect();
    Ok(match column {
        Grouping::Namespace => GroupingList {
            namespaces: Some(list),
            tasks: None,
        },
        Grouping::Task => GroupingList {
            namespaces: None,
            tasks: Some(list),
        },
    })
}

/// What `DELETE /api/v1/queues/{queue}/clear` did.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Cleared {
    pub cleared: bool,
    pub queue: String,
    pub partition: Option<String>,
    pub cursors_moved: u64,
    pub messages_cleared: i64,
}

/// `DELETE /api/v1/queues/{queue}/clear`: passes everything pending in the queue (or one
/// partition) for every consumer group, by moving their cursors to the heads. A queue no
/// group reads yet gets the queue-mode group first, so what is cleared stays cleared for it.
pub async fn clear(
    pool: &Pool,
    backend: Backend,
    catalog: &Catalog,
    queue: &str,
    partition: Option<&str>,
) -> Result<Cleared, Refusal> {
    super::not_on_cluster(backend, "clearing a queue")?;
    let mut client = pool.get().await?;
    let (id, partition_id) =
        super::queue_and_partition(&**client, backend, queue, partition).await?;
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
    Ok(Cleared {
        cleared: true,
        queue: queue.to_string(),
        partition: partition.map(str::to_string),
        cursors_moved: moved.cursors,
        messages_cleared: moved.unsettled_before,
    })
}

/// Deletes a queue and everything known of it, in one transaction: its row (with its
/// partitions and subscriptions), its cursors and its dead letters, each through its owner;
/// every server is told when it commits, and this one forgets the queue at once.
pub(crate) async fn delete_queue(
    pool: &Pool,
    catalog: &Catalog,
    queue: &str,
) -> Result<QueueDeleted, Refusal> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let id = Catalog::delete_queue_row(&tx, queue).await?;
    let cursors = crate::cursor::delete_of_queue(&tx, id).await?;
    let dead = crate::dead_letter::delete_of_queue(&tx, id).await?;
    crate::wake::announce_queue_deleted(&tx, queue).await?;
    tx.commit().await?;
    catalog.forget_queue(queue);
    tracing::info!(queue, cursors, dead_letters = dead, "queue deleted");
    Ok(QueueDeleted {
        deleted: true,
        queue: queue.to_string(),
    })
}

/// What `DELETE /api/v1/resources/queues/{queue}` did.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct QueueDeleted {
    pub deleted: bool,
    pub queue: String,
}
