//! Consumer groups: their lag per queue and partition, leases, deletion, subscription
//! changes and seeks.
//!
//! A cursor's lag comes from its owner's `cursor::lag_of!` (`comb.cursor_lag`): its latest state, its
//! partition's head and the first unsettled message's time, all index probes. A group's lag
//! on a queue comes from `comb.group_figures` (schema version 12): computed now for the
//! smallest (queue, group) pairs of the answer (up to [`LIVE_PARTITIONS`](crate::backlog::LIVE_PARTITIONS) cursors in all) and
//! for pairs made since the newest per-minute snapshot, read from that snapshot for the
//! others (`figuresAt` says when).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use serde::{Deserialize, Serialize};
use tokio_postgres::{GenericClient, Row};
use utoipa::ToSchema;
use uuid::Uuid;

use super::cursors::{self, Selection, Target};
use super::wire::{iso, iso_opt};
use super::{MAX_LIMIT, Page, Refusal};
use crate::backend::Backend;
use crate::backlog::group_lag;
use crate::catalog::listing::{self, Subscribers, SubscriptionRow};
use crate::catalog::{Catalog, StartFrom};
use crate::code::Code;

/// How old a lag figure is, as columns `figures_at` and `figures_age`, for rows read over
/// [`group_lag`]'s `l`.
const FIGURES_AT: &str = "l.figures_at,
    greatest(extract(epoch FROM now() - l.figures_at), 0)::float8 AS figures_age";

/// Leases held now, summed over every (queue, group) as [`group_lag`] takes them.
pub(crate) async fn leases_held(client: &impl GenericClient) -> Result<i64, Refusal> {
    let subs = listing::subscriptions(client, Subscribers::All).await?;
    Ok(lag_of(client, &subs)
        .await?
        .values()
        .map(|r| r.get::<_, i64>("leased"))
        .sum())
}

/// The lag figures of the given subscriptions (see [`group_lag`]), by (queue id, group):
/// one statement over the pairs.
async fn lag_of(
    client: &impl GenericClient,
    subs: &[SubscriptionRow],
) -> Result<HashMap<(Uuid, String), Row>, Refusal> {
    let (queues, groups): (Vec<Uuid>, Vec<&str>) =
        subs.iter().map(|s| (s.queue_id, s.group.as_str())).unzip();
    let sql = format!(
        "WITH sub AS (SELECT * FROM unnest($1::uuid[], $2::text[]) AS s(queue_id, consumer_group))
         SELECT sub.queue_id, sub.consumer_group, l.partitions, l.lag, l.lag_seconds, l.leased,
                l.oldest_unsettled_at, l.live, {FIGURES_AT}
         FROM sub {lag}",
        lag = group_lag("SELECT queue_id, consumer_group FROM sub")
    );
    Ok(client
        .query(&sql, &[&queues, &groups])
        .await?
        .into_iter()
        .map(|r| ((r.get("queue_id"), r.get("consumer_group")), r))
        .collect())
}

/// When a lag figure was taken: now for pairs computed live, else the per-minute snapshot's
/// time (see the module's documentation).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FiguresAt {
    #[serde(serialize_with = "iso_opt")]
    pub figures_at: Option<DateTime<Utc>>,
    #[serde(serialize_with = "super::wire::num_opt")]
    pub figures_age_seconds: Option<f64>,
}

impl FiguresAt {
    fn from_row(row: &Row) -> FiguresAt {
        FiguresAt {
            figures_at: row.get("figures_at"),
            figures_age_seconds: row.get("figures_age"),
        }
    }
}

/// A group reading one queue, as `GET /api/v1/resources/queues/{queue}` lists it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueGroup {
    pub name: String,
    /// How it subscribed: `all`, `new` or `from`.
    pub mode: String,
    #[serde(serialize_with = "iso")]
    pub subscribed_at: DateTime<Utc>,
    /// Cursors it has on the queue.
    pub partitions: i64,
    /// Messages not yet settled.
    pub lag: i64,
    /// Age of the oldest unsettled message.
    #[serde(serialize_with = "super::wire::num")]
    pub lag_seconds: f64,
    pub leased_partitions: i64,
    #[serde(flatten)]
    pub figures: FiguresAt,
}

/// The groups reading one queue, with their lag.
pub(crate) async fn of_queue(
    client: &impl GenericClient,
    queue_id: Uuid,
) -> Result<Vec<QueueGroup>, Refusal> {
    let subs = listing::subscriptions(client, Subscribers::OfQueue(queue_id, MAX_LIMIT)).await?;
    let mut lags = lag_of(client, &subs).await?;
    Ok(subs
        .into_iter()
        .filter_map(|s| {
            let r = lags.remove(&(s.queue_id, s.group.clone()))?;
            Some(QueueGroup {
                name: s.group,
                mode: s.mode,
                subscribed_at: s.created_at,
                partitions: r.get("partitions"),
                lag: r.get("lag"),
                lag_seconds: r.get("lag_seconds"),
                leased_partitions: r.get("leased"),
                figures: FiguresAt::from_row(&r),
            })
        })
        .collect())
}

/// A group in `GET /api/v1/consumer-groups`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupSummary {
    pub name: String,
    /// The queues it reads, by name.
    pub queues: Vec<GroupQueueLag>,
    pub queue_count: i64,
    pub total_lag: i64,
    #[serde(serialize_with = "super::wire::num")]
    pub max_lag_seconds: f64,
    /// `Stable` with nothing unsettled, else `Lagging`.
    pub state: String,
}

/// A queue a group reads, with the group's lag on it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupQueueLag {
    pub queue: String,
    pub mode: String,
    pub partitions: i64,
    pub lag: i64,
    #[serde(serialize_with = "super::wire::num")]
    pub lag_seconds: f64,
    pub leased_partitions: i64,
    #[serde(flatten)]
    pub figures: FiguresAt,
}

/// `GET /api/v1/consumer-groups`: every group with its queues and their lag (messages and
/// seconds), as Queen answers it: a JSON array, groups and their queues by name.
pub async fn list(pool: &Pool) -> Result<Vec<GroupSummary>, Refusal> {
    let client = pool.get().await?;
    let subs = listing::subscriptions(&**client, Subscribers::First(MAX_LIMIT)).await?;
    let mut lags = lag_of(&**client, &subs).await?;
    let mut groups: Vec<GroupSummary> = Vec::new();
    for s in subs {
        let Some(r) = lags.remove(&(s.queue_id, s.group.clone())) else {
            continue;
        };
        let queue = GroupQueueLag {
            queue: s.queue,
            mode: s.mode,
            partitions: r.get("partitions"),
            lag: r.get("lag"),
            lag_seconds: r.get("lag_seconds"),
            leased_partitions: r.get("leased"),
            figures: FiguresAt::from_row(&r),
        };
        match groups.last_mut() {
            Some(g) if g.name == s.group => g.queues.push(queue),
            _ => groups.push(GroupSummary {
                name: s.group,
                queues: vec![queue],
                queue_count: 0,
                total_lag: 0,
                max_lag_seconds: 0.0,
                state: String::new(),
            }),
        }
    }
    for g in &mut groups {
        g.queue_count = g.queues.len() as i64;
        g.total_lag = g.queues.iter().map(|q| q.lag).sum();
        g.max_lag_seconds = g
            .queues
            .iter()
            .map(|q| q.lag_seconds)
            .fold(f64::NEG_INFINITY, f64::max);
        g.state = if g.total_lag == 0 {
            "Stable"
        } else {
            "Lagging"
        }
        .into();
    }
    Ok(groups)
}

/// `GET /api/v1/consumer-groups/{group}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GroupDetail {
    pub name: String,
    pub queues: Vec<GroupQueueDetail>,
    pub limit: i64,
    pub offset: i64,
}

/// A queue a group reads, with a page of its partitions.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GroupQueueDetail {
    pub queue: String,
    pub mode: String,
    #[serde(serialize_with = "iso")]
    pub subscribed_at: DateTime<Utc>,
    pub lag: i64,
    #[serde(serialize_with = "super::wire::num")]
    pub lag_seconds: f64,
    #[serde(flatten)]
    pub figures: FiguresAt,
    /// The group's cursors on the queue; `partitions` is one page of them.
    pub partitions_total: i64,
    pub partitions: Vec<GroupPartition>,
}

/// One cursor of a group: where it is, the partition's head, its lag and lease.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GroupPartition {
    pub partition_id: Uuid,
    pub partition: String,
    pub cursor: Option<i64>,
    pub head: Option<i64>,
    pub lag: Option<i64>,
    #[serde(serialize_with = "super::wire::num")]
    pub lag_seconds: f64,
    pub lease_id: Option<Uuid>,
    #[serde(serialize_with = "iso_opt")]
    pub lease_expires_at: Option<DateTime<Utc>>,
    #[serde(serialize_with = "iso_opt")]
    pub last_claimed_at: Option<DateTime<Utc>>,
}

/// `GET /api/v1/consumer-groups/{group}`: the group's queues (or the one named), each with
/// a page of its partitions in name order (cursor, head, lag and lease, exact) and how many
/// it has: a group reading many wide queues costs a page of cursors per queue, not every one.
pub async fn detail(
    pool: &Pool,
    backend: Backend,
    group: &str,
    queue: Option<&str>,
    page: Page,
) -> Result<GroupDetail, Refusal> {
    let client = pool.get().await?;
    let subs = listing::subscriptions(&**client, Subscribers::OfGroup(group, queue)).await?;
    let mut lags = lag_of(&**client, &subs).await?;
    let queue_ids: Vec<Uuid> = subs.iter().map(|s| s.queue_id).collect();
    let pages =
        listing::partition_pages(&**client, backend, &queue_ids, page.limit, page.offset).await?;
    // Each cursor of the pages, exact; a partition the group has no cursor in is left out.
    let partition_ids: Vec<Uuid> = pages.iter().map(|(_, p, _)| *p).collect();
    let mut cursors: HashMap<Uuid, Row> = client
        .query(
            concat!(
                "SELECT k.p, x.cursor_pos, x.head, x.lag,
                        coalesce(extract(epoch FROM now() - x.oldest_unsettled_at), 0)::float8
                            AS lag_seconds,
                        x.lease_id, x.lease_expires_at, x.last_claimed_at
                 FROM unnest($1::uuid[]) AS k(p)
                 CROSS JOIN LATERAL ",
                crate::cursor::lag_of!("k.p", "$2"),
                " x"
            ),
            &[&partition_ids, &group],
        )
        .await?
        .into_iter()
        .map(|r| (r.get("p"), r))
        .collect();
    let mut by_queue: HashMap<Uuid, Vec<GroupPartition>> = HashMap::new();
    for (queue_id, partition_id, name) in pages {
        let Some(x) = cursors.remove(&partition_id) else {
            continue;
        };
        by_queue.entry(queue_id).or_default().push(GroupPartition {
            partition_id,
            partition: name,
            cursor: x.get("cursor_pos"),
            head: x.get("head"),
            lag: x.get("lag"),
            lag_seconds: x.get("lag_seconds"),
            lease_id: x.get("lease_id"),
            lease_expires_at: x.get("lease_expires_at"),
            last_claimed_at: x.get("last_claimed_at"),
        });
    }
    let queues: Vec<GroupQueueDetail> = subs
        .into_iter()
        .filter_map(|s| {
            let r = lags.remove(&(s.queue_id, s.group.clone()))?;
            Some(GroupQueueDetail {
                partitions: by_queue.remove(&s.queue_id).unwrap_or_default(),
                queue: s.queue,
                mode: s.mode,
                subscribed_at: s.created_at,
                lag: r.get("lag"),
                lag_seconds: r.get("lag_seconds"),
                figures: FiguresAt::from_row(&r),
                partitions_total: r.get("partitions"),
            })
        })
        .collect();
    if queues.is_empty() {
        return Err(match queue {
            Some(queue) => Refusal::not_found(
                Code::ConsumerGroupNotFound,
                format!("consumer group `{group}` does not read queue `{queue}`"),
            ),
            None => Refusal::not_found(
                Code::ConsumerGroupNotFound,
                format!("consumer group `{group}` reads no queue"),
            ),
        });
    }
    Ok(GroupDetail {
        name: group.to_string(),
        queues,
        limit: page.limit,
        offset: page.offset,
    })
}

/// A cursor (or, for pairs served from the snapshot, a whole queue) whose oldest unsettled
/// message waits long.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LaggingCursor {
    pub consumer_group: String,
    pub queue: String,
    /// NULL for a whole queue's row.
    pub partition: Option<String>,
    pub partition_id: Option<Uuid>,
    pub lag: i64,
    #[serde(serialize_with = "super::wire::num_opt")]
    pub lag_seconds: Option<f64>,
    #[serde(serialize_with = "iso_opt")]
    pub oldest_unsettled_at: Option<DateTime<Utc>>,
    /// Only on a whole queue's row: its cursors and when its figures were taken.
    #[serde(flatten)]
    pub snapshot: Option<LaggingSnapshot>,
}

/// The members only a whole queue's row of [`LaggingCursor`] has.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LaggingSnapshot {
    /// Not required in the schema: [`LaggingCursor`] flattens this in only on a whole
    /// queue's row, and a flattened `Option` is described as "this object or null".
    #[schema(required = false)]
    pub partitions: i64,
    #[serde(flatten)]
    pub figures: FiguresAt,
}

/// `GET /api/v1/consumer-groups/lagging`: where a group's oldest unsettled message waits
/// for at least `min_seconds`, the longest first. Pairs of (queue, group) whose lag is
/// computed now (see [`group_lag`]) are listed per partition, each cursor exact; pairs served
/// from the snapshot are listed once, for the whole queue (`partition` null, `partitions`
/// their count, `figuresAt` the snapshot's time): per cursor they would cost a probe of every
/// partition.
pub async fn lagging(pool: &Pool, min_seconds: f64) -> Result<Vec<LaggingCursor>, Refusal> {
    let client = pool.get().await?;
    let subs = listing::subscriptions(&**client, Subscribers::All).await?;
    let lags = lag_of(&**client, &subs).await?;
    // Pairs computed now: each lagging cursor, exact.
    let (live_queues, live_groups): (Vec<Uuid>, Vec<&str>) = subs
        .iter()
        .filter(|s| {
            lags.get(&(s.queue_id, s.group.clone()))
                .is_some_and(|r| r.get::<_, bool>("live"))
        })
        .map(|s| (s.queue_id, s.group.as_str()))
        .unzip();
    let cursors = client
        .query(
            "SELECT k.g, k.q, x.partition_id, x.lag, x.oldest_unsettled_at,
                    extract(epoch FROM now() - x.oldest_unsettled_at)::float8 AS lag_seconds
             FROM unnest($1::uuid[], $2::text[]) AS k(q, g)
             CROSS JOIN LATERAL comb.lagging_cursors(k.q, k.g, $3) x",
            &[&live_queues, &live_groups, &min_seconds],
        )
        .await?;
    let partition_ids: Vec<Uuid> = cursors.iter().map(|r| r.get("partition_id")).collect();
    let places = listing::partition_names(&**client, &partition_ids).await?;
    let mut out: Vec<LaggingCursor> = cursors
        .iter()
        .filter_map(|r| {
            let partition_id: Uuid = r.get("partition_id");
            let (queue, partition) = places.get(&partition_id)?.clone();
            Some(LaggingCursor {
                consumer_group: r.get("g"),
                queue,
                partition: Some(partition),
                partition_id: Some(partition_id),
                lag: r.get("lag"),
                lag_seconds: r.get("lag_seconds"),
                oldest_unsettled_at: r.get("oldest_unsettled_at"),
                snapshot: None,
            })
        })
        .collect();
    // Pairs served from the snapshot: once for the whole queue.
    for s in &subs {
        let Some(r) = lags.get(&(s.queue_id, s.group.clone())) else {
            continue;
        };
        let oldest: Option<DateTime<Utc>> = r.get("oldest_unsettled_at");
        let lag: i64 = r.get("lag");
        let lag_seconds: f64 = r.get("lag_seconds");
        if r.get::<_, bool>("live") || lag <= 0 || oldest.is_none() || lag_seconds < min_seconds {
            continue;
        }
        out.push(LaggingCursor {
            consumer_group: s.group.clone(),
            queue: s.queue.clone(),
            partition: None,
            partition_id: None,
            lag,
            lag_seconds: Some(lag_seconds),
            oldest_unsettled_at: oldest,
            snapshot: Some(LaggingSnapshot {
                partitions: r.get("partitions"),
                figures: FiguresAt::from_row(r),
            }),
        });
    }
    out.sort_by(|a, b| {
        let secs = |c: &LaggingCursor| c.lag_seconds.unwrap_or(f64::NEG_INFINITY);
        secs(b).total_cmp(&secs(a))
    });
    out.truncate(MAX_LIMIT as usize);
    Ok(out)
}

/// What `DELETE /api/v1/consumer-groups/{group}/queues/{queue}` did.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GroupDeleted {
    pub success: bool,
    pub consumer_group: String,
    pub queue_name: String,
    /// Cursors deleted, or moved back to where the group subscribed.
    pub deleted_partitions: u64,
    pub metadata_deleted: bool,
}

/// `DELETE /api/v1/consumer-groups/{group}/queues/{queue}`: with `delete_metadata` the group
/// stops reading the queue (cursors and subscription go; its next pop subscribes it anew);
/// without, it keeps its subscription and starts again where it first subscribed.
pub async fn delete_for_queue(
    pool: &Pool,
    backend: Backend,
    catalog: &Catalog,
    group: &str,
    queue: &str,
    delete_metadata: bool,
) -> Result<GroupDeleted, Refusal> {
    super::not_on_cluster(backend, "deleting a consumer group's cursors")?;
    let mut client = pool.get().await?;
    let id = super::queue_id(&**client, queue).await?;
    let tx = client.transaction().await?;
    let sub = listing::lock_subscription(&*tx, id, group)
        .await?
        .ok_or_else(|| {
            Refusal::not_found(
                Code::ConsumerGroupNotFound,
                format!("consumer group `{group}` does not read queue `{queue}`"),
            )
        })?;
    let partitions = if delete_metadata {
        let n = crate::cursor::delete_group_cursors(&*tx, id, group).await?;
        listing::delete_subscription(&*tx, id, group).await?;
        // Every server forgets the queue's cached subscriptions.
        crate::wake::announce_queue_deleted(&tx, queue).await?;
        n
    } else {
        let target = match sub.mode.as_str() {
            "from" => Target::Time(sub.start_at.unwrap_or(sub.created_at)),
            "new" => Target::Time(sub.created_at),
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
    Ok(GroupDeleted {
        success: true,
        consumer_group: group.to_string(),
        queue_name: queue.to_string(),
        deleted_partitions: partitions,
        metadata_deleted: delete_metadata,
    })
}

/// What `POST /api/v1/consumer-groups/{group}/subscription` did.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SubscriptionSet {
    pub success: bool,
    pub consumer_group: String,
    #[serde(serialize_with = "iso")]
    pub subscription_timestamp: DateTime<Utc>,
    pub queues_updated: u64,
    pub cursors_moved: u64,
}

/// `POST /api/v1/consumer-groups/{group}/subscription`: the group reads every queue it is
/// subscribed to from `at` on: the subscriptions record it, and cursors still behind it move
/// forward to it (none moves back).
pub async fn set_subscription(
    pool: &Pool,
    backend: Backend,
    group: &str,
    at: DateTime<Utc>,
) -> Result<SubscriptionSet, Refusal> {
    super::not_on_cluster(backend, "moving a consumer group's subscription")?;
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let queues = listing::subscribe_from(&*tx, group, at).await?;
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
    Ok(SubscriptionSet {
        success: true,
        consumer_group: group.to_string(),
        subscription_timestamp: at,
        queues_updated: queues.len() as u64,
        cursors_moved: moved,
    })
}

/// What a seek did.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Sought {
    pub success: bool,
    pub consumer_group: String,
    pub queue_name: String,
    pub partition: Option<String>,
    pub to_end: bool,
    pub to_start: bool,
    #[serde(serialize_with = "iso_opt")]
    pub timestamp: Option<DateTime<Utc>>,
    pub partitions_moved: u64,
    /// Messages left unsettled after the moved cursors.
    pub lag: i64,
}

/// `POST /api/v1/consumer-groups/{group}/queues/{queue}[/partitions/{partition}]/seek`:
/// moves the group's cursors of every partition of the queue (or one) to `target`. A group
/// that never read the queue is subscribed first, so partitions it never read move too.
pub async fn seek(
    pool: &Pool,
    backend: Backend,
    catalog: &Catalog,
    group: &str,
    queue: &str,
    partition: Option<&str>,
    target: Target,
) -> Result<Sought, Refusal> {
    super::not_on_cluster(backend, "seeking a consumer group")?;
    let mut client = pool.get().await?;
    let (id, partition_id) =
        super::queue_and_partition(&**client, backend, queue, partition).await?;
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
    Ok(Sought {
        success: true,
        consumer_group: group.to_string(),
        queue_name: queue.to_string(),
        partition: partition.map(str::to_string),
        to_end: target == Target::End,
        to_start: target == Target::Start,
        timestamp: match target {
            Target::Time(t) => Some(t),
            Target::End | Target::Start => None,
        },
        partitions_moved: moved.cursors,
        lag: moved.unsettled_after,
    })
}
