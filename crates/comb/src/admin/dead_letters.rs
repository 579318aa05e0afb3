//! Dead letters sent back or let go: requeue and purge (Queen has neither).
//!
//! A requeued dead letter is stored again at the end of its partition, the messages of one
//! request in their original order, with no attempts counted. Only the groups whose dead
//! letters were requeued receive it: every other group reading the partition has the new
//! position settled in the same transaction, so it never sees the copy. The entry is marked
//! by a row in `comb.dead_letter_requeues`, never updated; an entry is requeued once.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use uuid::Uuid;

use super::Refusal;
use crate::backend::Backend;
use crate::dead_letter;
use crate::queue::GroupName;

/// Most entries one request requeues; the answer says how many are left.
pub const MAX_REQUEUE: i64 = 10_000;

/// Which dead letters of a queue a request takes.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub queue_id: Uuid,
    /// One group's, or every group's.
    pub group: Option<GroupName<'static>>,
    /// These entries only.
    pub ids: Option<Vec<Uuid>>,
    pub partition: Option<Uuid>,
    /// Dead-lettered at or after.
    pub from: Option<DateTime<Utc>>,
    /// Dead-lettered before.
    pub to: Option<DateTime<Utc>>,
}

impl Selection {
    /// The parameters of the owner's selection (`dead_letter::SelectionArgs`), in its order.
    fn args(&self) -> crate::dead_letter::SelectionArgs<'_> {
        [
            &self.queue_id,
            &self.group,
            &self.ids,
            &self.partition,
            &self.from,
            &self.to,
        ]
    }
}

/// What a requeue did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requeued {
    /// Entries requeued.
    pub requeued: u64,
    /// Messages stored again (one per message, however many groups' entries named it).
    pub stored: u64,
    /// Groups that receive the messages again.
    pub groups: Vec<String>,
    /// Selected entries left for another request (beyond [`MAX_REQUEUE`], or being
    /// requeued by another request right now).
    pub remaining: u64,
}

/// Requeues the selected dead letters (at most [`MAX_REQUEUE`]) in one transaction.
pub async fn requeue(
    pool: &Pool,
    backend: Backend,
    selection: &Selection,
) -> Result<Requeued, Refusal> {
    super::not_on_cluster(backend, "requeueing dead letters")?;
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let args = selection.args();
    let (rows, left) = dead_letter::lock_for_requeue(&tx, &args, MAX_REQUEUE).await?;
    if rows.is_empty() {
        return Ok(Requeued {
            remaining: left.max(0) as u64,
            ..Requeued::default()
        });
    }
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    // Which groups get each (partition, original position) back.
    let mut receivers: HashMap<(Uuid, i64), HashSet<String>> = HashMap::new();
    let mut groups: Vec<String> = Vec::new();
    for r in rows {
        if !groups.contains(&r.group) {
            groups.push(r.group.clone());
        }
        receivers
            .entry((r.partition_id, r.pos))
            .or_default()
            .insert(r.group);
    }
    let partitions: Vec<Uuid> = {
        let mut p: Vec<Uuid> = receivers.keys().map(|k| k.0).collect();
        p.sort();
        p.dedup();
        p
    };
    // Cursors first, then partitions: the order of `/transaction` (acks, then pushes).
    crate::cursor::lock_of_partitions(&tx, &partitions).await?;
    tx.query(
        backend.sql(&crate::catalog::LOCK_PARTITIONS),
        &[&partitions],
    )
    .await?;
    let dead_letter::Stored {
        placed,
        stored,
        marked,
    } = dead_letter::store_requeued(&tx, &ids).await?;
    // New positions the other groups of each partition must not see.
    let mut hide: BTreeMap<Uuid, Vec<(i64, HashSet<String>)>> = BTreeMap::new();
    for (partition, pos, new_pos) in placed {
        let to = receivers.remove(&(partition, pos)).unwrap_or_default();
        hide.entry(partition).or_default().push((new_pos, to));
    }
    for (partition, news) in &hide {
        super::cursors::edit_in(&tx, *partition, None, false, |group, c| {
            let mut changed = false;
            for (pos, to) in news {
                if !to.contains(group) && *pos > c.cursor_pos {
                    c.settle(*pos, c.cursor_seg);
                    changed = true;
                }
            }
            changed
        })
        .await?;
    }
    tx.commit().await?;
    groups.sort();
    Ok(Requeued {
        requeued: marked as u64,
        stored: stored as u64,
        groups,
        remaining: (left - marked).max(0) as u64,
    })
}

/// Deletes the selected dead letters (and the marks of those requeued). Dead letters are
/// copies kept for operators; purging them touches no message or cursor.
pub async fn purge(pool: &Pool, selection: &Selection) -> Result<u64, Refusal> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let purged = dead_letter::purge(&tx, &selection.args()).await?;
    tx.commit().await?;
    Ok(purged)
}

/// What `POST /api/v1/dlq/requeue` did.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequeueAnswer {
    /// Entries requeued.
    pub requeued: u64,
    /// Messages stored again.
    pub messages: u64,
    /// Groups that receive them.
    pub consumer_groups: Vec<String>,
    /// Selected entries left for another request.
    pub remaining: u64,
    pub queue: String,
}

/// What `POST /api/v1/dlq/purge` did.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct PurgeAnswer {
    /// Entries deleted.
    pub purged: u64,
    pub queue: String,
}

/// `GET /api/v1/dlq`: a page of a queue's dead letters, newest first, in Queen's shape.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub(crate) struct DeadLetterList {
    pub messages: Vec<DeadLetterEntry>,
    /// Entries the filter selects (counted up to a cap).
    pub total: i64,
    pub limit: i64,
    pub offset: i64,
}

/// One dead letter.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DeadLetterEntry {
    pub id: Uuid,
    pub message_id: Uuid,
    pub partition_id: Uuid,
    pub transaction_id: String,
    pub consumer_group: String,
    pub error_message: Option<String>,
    pub retry_count: i32,
    #[serde(serialize_with = "super::wire::iso")]
    pub original_created_at: DateTime<Utc>,
    #[serde(serialize_with = "super::wire::iso")]
    pub moved_to_dlq_at: DateTime<Utc>,
    #[serde(serialize_with = "super::wire::iso")]
    pub message_created_at: DateTime<Utc>,
    pub queue_name: String,
    pub namespace: Option<String>,
    pub task: Option<String>,
    pub partition_name: String,
    /// The payload as JSON; `{"encrypted": true}` when no key opens it, or a string saying it
    /// is not JSON.
    pub data: serde_json::Value,
    pub trace_id: Option<String>,
    pub producer_sub: Option<String>,
}
