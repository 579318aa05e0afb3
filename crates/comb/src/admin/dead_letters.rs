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

/// Most entries one request requeues; the answer says how many are left.
pub const MAX_REQUEUE: i64 = 10_000;

/// Which dead letters of a queue a request takes.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub queue_id: Uuid,
    /// One group's, or every group's.
    pub group: Option<String>,
    /// These entries only.
    pub ids: Option<Vec<Uuid>>,
    pub partition: Option<Uuid>,
    /// Dead-lettered at or after.
    pub from: Option<DateTime<Utc>>,
    /// Dead-lettered before.
    pub to: Option<DateTime<Utc>>,
}

impl Selection {
    /// The parameters of [`SELECTED`], in its order.
    fn args(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 6] {
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

const SELECTED: &str = "d.queue_id = $1 AND ($2::text IS NULL OR d.consumer_group = $2)
  AND ($3::uuid[] IS NULL OR d.id = ANY ($3))
  AND ($4::uuid IS NULL OR d.partition_id = $4)
  AND ($5::timestamptz IS NULL OR d.dead_at >= $5)
  AND ($6::timestamptz IS NULL OR d.dead_at < $6)";

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

/// Stores the positions each requeued message gets: per partition, after the head, in the
/// order of the original positions.
const STORE_SQL: &str = "
WITH src AS (
    SELECT DISTINCT ON (d.partition_id, d.pos)
           d.partition_id, d.pos, d.transaction_id, d.trace_id, d.payload, d.producer_sub
    FROM comb.dead_letters d WHERE d.id = ANY ($1)
    ORDER BY d.partition_id, d.pos
), numbered AS (
    SELECT s.*, row_number() OVER (PARTITION BY s.partition_id ORDER BY s.pos) AS rn FROM src s
), heads AS (
    SELECT p.partition_id, h.pos AS head
    FROM (SELECT DISTINCT partition_id FROM numbered) p
    CROSS JOIN LATERAL comb.partition_head(p.partition_id) h
), placed AS (
    SELECT n.*, hd.head + n.rn AS new_pos FROM numbered n JOIN heads hd USING (partition_id)
), stored AS (
    INSERT INTO comb.messages
        (partition_id, pos, seg, message_id, transaction_id, trace_id, payload, created_at,
         producer_sub)
    SELECT pl.partition_id, pl.new_pos, (SELECT max(seg) FROM comb.segments), gen_random_uuid(),
           pl.transaction_id, pl.trace_id, pl.payload, statement_timestamp(), pl.producer_sub
    FROM placed pl
    RETURNING 1
), marked AS (
    INSERT INTO comb.dead_letter_requeues (dead_letter_id, partition_id, pos)
    SELECT d.id, d.partition_id, pl.new_pos
    FROM comb.dead_letters d JOIN placed pl ON pl.partition_id = d.partition_id AND pl.pos = d.pos
    WHERE d.id = ANY ($1)
    RETURNING 1
)
SELECT pl.partition_id, pl.pos, pl.new_pos, (SELECT count(*) FROM stored), (SELECT count(*) FROM marked)
FROM placed pl";

/// Requeues the selected dead letters (at most [`MAX_REQUEUE`]) in one transaction.
pub async fn requeue(pool: &Pool, selection: &Selection) -> Result<Requeued, Refusal> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let args = selection.args();
    // Entries another request is requeueing now are skipped, not waited for.
    let rows = tx
        .query(
            &format!(
                "SELECT d.id, d.partition_id, d.pos, d.consumer_group FROM comb.dead_letters d
                 WHERE {SELECTED}
                   AND NOT EXISTS (SELECT 1 FROM comb.dead_letter_requeues r WHERE r.dead_letter_id = d.id)
                 ORDER BY d.partition_id, d.pos
                 LIMIT {MAX_REQUEUE}
                 FOR UPDATE OF d SKIP LOCKED"
            ),
            &args,
        )
        .await?;
    let left: i64 = tx
        .query_one(
            &format!(
                "SELECT count(*) FROM comb.dead_letters d WHERE {SELECTED}
                   AND NOT EXISTS (SELECT 1 FROM comb.dead_letter_requeues r WHERE r.dead_letter_id = d.id)"
            ),
            &args,
        )
        .await?
        .get(0);
    if rows.is_empty() {
        return Ok(Requeued {
            remaining: left.max(0) as u64,
            ..Requeued::default()
        });
    }
    let ids: Vec<Uuid> = rows.iter().map(|r| r.get(0)).collect();
    // Which groups get each (partition, original position) back.
    let mut receivers: HashMap<(Uuid, i64), HashSet<String>> = HashMap::new();
    let mut groups: Vec<String> = Vec::new();
    for r in &rows {
        let group: String = r.get(3);
        if !groups.contains(&group) {
            groups.push(group.clone());
        }
        receivers
            .entry((r.get(1), r.get(2)))
            .or_default()
            .insert(group);
    }
    let partitions: Vec<Uuid> = {
        let mut p: Vec<Uuid> = receivers.keys().map(|k| k.0).collect();
        p.sort();
        p.dedup();
        p
    };
    // Cursors first, then partitions: the order of `/transaction` (acks, then pushes).
    tx.query(
        "SELECT 1 FROM comb.cursors WHERE partition_id = ANY ($1)
         ORDER BY partition_id, consumer_group FOR NO KEY UPDATE",
        &[&partitions],
    )
    .await?;
    tx.query(
        "SELECT id FROM comb.partitions WHERE id = ANY ($1) ORDER BY id FOR NO KEY UPDATE",
        &[&partitions],
    )
    .await?;
    let placed = tx.query(STORE_SQL, &[&ids]).await?;
    let (stored, marked) = placed
        .first()
        .map(|r| (r.get::<_, i64>(3), r.get::<_, i64>(4)))
        .unwrap_or((0, 0));
    // New positions the other groups of each partition must not see.
    let mut hide: BTreeMap<Uuid, Vec<(i64, HashSet<String>)>> = BTreeMap::new();
    for r in &placed {
        let (partition, pos, new_pos): (Uuid, i64, i64) = (r.get(0), r.get(1), r.get(2));
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
    let args = selection.args();
    let ids: Vec<Uuid> = tx
        .query(
            &format!("DELETE FROM comb.dead_letters d WHERE {SELECTED} RETURNING d.id"),
            &args,
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    tx.execute(
        "DELETE FROM comb.dead_letter_requeues WHERE dead_letter_id = ANY ($1)",
        &[&ids],
    )
    .await?;
    tx.commit().await?;
    Ok(ids.len() as u64)
}

/// What `POST /api/v1/dlq/requeue` did.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RequeueAnswer {
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
pub(crate) struct PurgeAnswer {
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
