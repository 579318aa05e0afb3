//! Messages as operators see them: listed by queue, partition, status and time, looked up
//! one at a time, and settled, retried or dead-lettered by hand.
//!
//! A message's status is relative to one consumer group (Queen's queue mode unless the
//! request names another): completed when its cursor passed or settled it, processing when a
//! live lease handed it out, dead_letter when the group gave up on it, else pending. Listings
//! read each partition in position order through its primary key, at most a page per
//! partition and at most [`MAX_PARTITIONS`] partitions, so no request reads message storage
//! in bulk. Nothing here updates or deletes a message row: an operator's delete is a settled
//! position in every group's cursor. The statements live with their tables' owners (`push`,
//! `cursor`, `dead_letter`); answers are the types below, and only payloads come from the
//! database as JSON (`comb.payload_json`, stored data).

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use super::{Page, Refusal};
use crate::backend::Backend;
use crate::catalog::Catalog;
use crate::catalog::listing::{PartitionPlace, partition_places};
use crate::code::Code;
use crate::cursor::GroupAtMessage;
use crate::dead_letter::{self, DeadMessageRow, LetterOfMessage, NewDeadLetter};
use crate::messages::listing::{self as stored, MessageRow};
use crate::queue::{GroupName, PartitionName, QUEUE_MODE_GROUP, QueueName};

/// Most partitions one listing visits.
pub const MAX_PARTITIONS: i64 = 1000;

/// Status of a message in a listing or a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Pending,
    Processing,
    Completed,
    DeadLetter,
}

impl Status {
    /// Parses Queen's status names (`failed` is Queen's word for dead letters).
    pub fn parse(s: &str) -> Option<Status> {
        Some(match s {
            "pending" => Status::Pending,
            "processing" => Status::Processing,
            "completed" => Status::Completed,
            "dead_letter" | "failed" | "dlq" => Status::DeadLetter,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Processing => "processing",
            Status::Completed => "completed",
            Status::DeadLetter => "dead_letter",
        }
    }
}

/// What a listing shows.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    pub queue: Option<QueueName<'static>>,
    pub partition: Option<PartitionName<'static>>,
    pub group: Option<GroupName<'static>>,
    pub status: Option<Status>,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
}

/// A message of a listing, with its status for the listing's group. A dead-lettered one
/// (listed from the dead letter's copy) also says why and when the group gave up on it;
/// those fields are absent from the others.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListedMessage {
    /// The message id (Queen's name for it).
    pub id: Uuid,
    pub message_id: Uuid,
    pub transaction_id: String,
    pub partition_id: Uuid,
    pub partition: String,
    pub queue: String,
    pub trace_id: Option<String>,
    pub producer_sub: Option<String>,
    /// The payload as JSON; `{"encrypted": true}` when sealed at rest, or a string saying
    /// why it is not shown.
    pub data: Value,
    #[serde(serialize_with = "super::wire::iso")]
    pub created_at: DateTime<Utc>,
    pub position: i64,
    /// `pending`, `processing`, `completed` or `dead_letter`.
    pub status: String,
    /// Dead-lettered only: the error the group gave (`null` when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub error_message: Option<Option<String>>,
    /// Dead-lettered only: deliveries before the group gave up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_count: Option<i32>,
    /// Dead-lettered only: when the group gave up.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "super::wire::iso_opt"
    )]
    pub moved_to_dlq_at: Option<DateTime<Utc>>,
}

/// `GET /api/v1/messages`: a page of messages.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageListing {
    pub messages: Vec<ListedMessage>,
    /// The group whose status the listing shows.
    pub consumer_group: String,
    pub limit: i64,
    pub offset: i64,
}

/// Where one group reading the message's queue stands with it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MessageGroup {
    pub name: String,
    /// `pending`, `processing`, `completed` or `dead_letter`.
    pub status: String,
    /// Deliveries to the group so far.
    pub attempts: i32,
}

/// One time a group gave up on the message.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageDeadLetter {
    pub id: Uuid,
    pub consumer_group: String,
    pub error_message: Option<String>,
    pub retry_count: i32,
    #[serde(serialize_with = "super::wire::iso")]
    pub moved_to_dlq_at: DateTime<Utc>,
    /// When an operator requeued it; `null` while it is kept.
    #[serde(serialize_with = "super::wire::iso_opt")]
    pub requeued_at: Option<DateTime<Utc>>,
}

/// `GET /api/v1/messages/{partitionId}/{transactionId}`: one message.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageDetail {
    /// The message id (Queen's name for it).
    pub id: Uuid,
    pub message_id: Uuid,
    pub transaction_id: String,
    pub partition_id: Uuid,
    pub partition: String,
    pub queue: String,
    pub trace_id: Option<String>,
    pub producer_sub: Option<String>,
    /// The payload as JSON; `{"encrypted": true}` when sealed at rest, or a string saying
    /// why it is not shown.
    pub data: Value,
    #[serde(serialize_with = "super::wire::iso")]
    pub created_at: DateTime<Utc>,
    pub position: i64,
    /// Every group reading the partition, by name.
    pub consumer_groups: Vec<MessageGroup>,
    /// Every time a group gave up on it, oldest first.
    pub dead_letters: Vec<MessageDeadLetter>,
}

/// `DELETE /api/v1/messages/{partitionId}/{transactionId}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageDeleted {
    /// Always `true`.
    pub deleted: bool,
    pub partition_id: Uuid,
    pub transaction_id: String,
    /// The groups it was settled for.
    pub consumer_groups: Vec<String>,
}

/// `POST /api/v1/messages/{partitionId}/{transactionId}/retry`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageRetried {
    /// Always `true`.
    pub retried: bool,
    pub queue: String,
    pub partition_id: Uuid,
    pub transaction_id: String,
    /// Dead letters requeued (0 when a failed, pending message had its attempts reset).
    pub requeued: u64,
    /// The groups that receive it again.
    pub consumer_groups: Vec<String>,
}

/// `POST /api/v1/messages/{partitionId}/{transactionId}/dlq`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageDeadLettered {
    /// Always `true`.
    pub success: bool,
    pub partition_id: Uuid,
    pub transaction_id: String,
    /// The groups that gave up on it.
    pub consumer_groups: Vec<String>,
}

/// The payloads as JSON, in order: `comb.payload_json` shows a sealed payload as
/// `{"encrypted": true}` and one PostgreSQL cannot parse as a string saying why, as the
/// answers always have. One statement for a whole page.
async fn payloads_json(
    client: &impl tokio_postgres::GenericClient,
    payloads: Vec<&[u8]>,
) -> Result<Vec<Value>, Refusal> {
    if payloads.is_empty() {
        return Ok(Vec::new());
    }
    Ok(client
        .query(
            "SELECT comb.payload_json(u.p) AS data
             FROM unnest($1::bytea[]) WITH ORDINALITY AS u(p, n) ORDER BY u.n",
            &[&payloads],
        )
        .await?
        .iter()
        .map(|r| r.get("data"))
        .collect())
}

/// `GET /api/v1/messages`.
pub async fn list(
    pool: &Pool,
    backend: Backend,
    filter: &Filter,
    page: Page,
) -> Result<MessageListing, Refusal> {
    let client = pool.get().await?;
    let queue_id = match &filter.queue {
        Some(q) => Some(super::queue_id(&**client, q).await?),
        None => None,
    };
    let partition_id = match (&filter.partition, queue_id) {
        (Some(p), Some(id)) => Some(
            super::partition_id(
                &**client,
                backend,
                id,
                filter.queue.as_deref().unwrap_or(""),
                p,
            )
            .await?,
        ),
        (Some(_), None) => {
            return Err(Refusal::invalid(
                Code::QueueRequired,
                "a partition filter needs the queue",
            ));
        }
        _ => None,
    };
    let group = filter.group.as_deref().unwrap_or(QUEUE_MODE_GROUP);
    let messages = if filter.status == Some(Status::DeadLetter) {
        let rows = dead_letter::dead_messages_page(
            &**client,
            queue_id,
            partition_id,
            group,
            filter.from,
            filter.to,
            page.limit,
            page.offset,
        )
        .await?;
        // The names of the partitions listed; a letter whose partition is gone meanwhile is
        // left out, as the queue's deletion takes its dead letters with it.
        let mut ids: Vec<Uuid> = rows.iter().map(|r| r.partition_id).collect();
        ids.sort();
        ids.dedup();
        let places = partition_places(&**client, &ids).await?;
        let rows: Vec<(DeadMessageRow, &PartitionPlace)> = rows
            .into_iter()
            .filter_map(|r| places.get(&r.partition_id).map(|p| (r, p)))
            .collect();
        let data = payloads_json(
            &**client,
            rows.iter().map(|(r, _)| &r.payload[..]).collect(),
        )
        .await?;
        rows.into_iter()
            .zip(data)
            .map(|((m, place), data)| listed_dead(m, place, data))
            .collect()
    } else {
        let of = MessagesOf {
            queue_id,
            partition_id,
            group,
            status: filter.status.map(Status::name),
            from: filter.from,
            to: filter.to,
            limit: page.limit,
            offset: page.offset,
            max_partitions: MAX_PARTITIONS,
        };
        let rows = messages_page(&**client, backend, &of).await?;
        let data = payloads_json(
            &**client,
            rows.iter().map(|r| &r.message.payload[..]).collect(),
        )
        .await?;
        rows.into_iter()
            .zip(data)
            .map(|(r, data)| listed(r, data))
            .collect()
    };
    Ok(MessageListing {
        messages,
        consumer_group: group.to_string(),
        limit: page.limit,
        offset: page.offset,
    })
}

/// A stored message of a listing.
fn listed(r: ListedRow, data: Value) -> ListedMessage {
    let m = r.message;
    ListedMessage {
        id: m.message_id,
        message_id: m.message_id,
        transaction_id: m.transaction_id,
        partition_id: m.partition_id,
        partition: r.partition,
        queue: r.queue,
        trace_id: m.trace_id,
        producer_sub: m.producer_sub,
        data,
        created_at: m.created_at,
        position: m.pos,
        status: r.status,
        error_message: None,
        retry_count: None,
        moved_to_dlq_at: None,
    }
}

/// A dead letter's copy of a message in a listing.
fn listed_dead(m: DeadMessageRow, place: &PartitionPlace, data: Value) -> ListedMessage {
    ListedMessage {
        id: m.message_id,
        message_id: m.message_id,
        transaction_id: m.transaction_id,
        partition_id: m.partition_id,
        partition: place.partition.clone(),
        queue: place.queue.clone(),
        trace_id: m.trace_id,
        producer_sub: m.producer_sub,
        data,
        created_at: m.created_at,
        position: m.pos,
        status: Status::DeadLetter.name().to_string(),
        error_message: Some(m.error),
        retry_count: Some(m.attempts),
        moved_to_dlq_at: Some(m.dead_at),
    }
}

/// A message of [`messages_page`].
#[derive(Debug, Clone)]
struct ListedRow {
    message: MessageRow,
    partition: String,
    queue: String,
    /// The group's status of the message.
    status: String,
}

/// What [`messages_page`] lists: partitions of a queue or one partition (every queue's when
/// neither is given), the group whose status is shown, a status and a creation window.
#[derive(Debug, Clone)]
struct MessagesOf<'a> {
    queue_id: Option<Uuid>,
    partition_id: Option<Uuid>,
    group: &'a str,
    /// `pending`, `processing`, `completed` or `dead_letter`; any when absent.
    status: Option<&'a str>,
    from: Option<chrono::DateTime<chrono::Utc>>,
    to: Option<chrono::DateTime<chrono::Utc>>,
    limit: i64,
    offset: i64,
    /// Most partitions visited.
    max_partitions: i64,
}

/// A page of messages with their status for the group, partition by partition (by queue and
/// partition name), each with its partition's and queue's names: one statement composed of
/// its tables' owners' fragments, so that the page's limit stops the reads early. Each
/// partition is read in position order through its primary key and yields at most a page's
/// worth (offset included): from the cursor on for pending and processing, newest first
/// otherwise. The status is the group's: dead_letter when it gave up
/// on the message (and did not requeue it), completed when its cursor passed or settled it,
/// processing when a live lease handed it out, else pending.
async fn messages_page(
    client: &impl tokio_postgres::GenericClient,
    backend: Backend,
    of: &MessagesOf<'_>,
) -> Result<Vec<ListedRow>, Refusal> {
    if !backend.joins_across_partitions() {
        return messages_page_by_partition(client, of).await;
    }
    let window = of.limit + of.offset;
    let sql = format!(
        "WITH parts AS ({parts})
         SELECT x.* FROM (
            SELECT m.message_id, m.transaction_id, m.partition_id, p.name AS partition,
                   p.queue_id, p.queue, m.trace_id, m.producer_sub, m.payload, m.created_at,
                   m.pos,
                   CASE WHEN {dead} THEN 'dead_letter'
                        WHEN m.pos <= coalesce(s.cursor_pos, 0) OR m.pos = ANY (s.settled)
                            THEN 'completed'
                        WHEN s.lease_expires_at > now() AND m.pos <= s.lease_upto
                            THEN 'processing'
                        ELSE 'pending' END AS status
            FROM parts p
            LEFT JOIN LATERAL {state} s ON true
            CROSS JOIN LATERAL (
                (SELECT * FROM {messages}
                   AND $8::text IN ('pending', 'processing')
                   AND m.pos > coalesce(s.cursor_pos, 0) AND m.seg >= coalesce(s.cursor_seg, 0)
                 ORDER BY m.pos LIMIT $9)
                UNION ALL
                (SELECT * FROM {messages}
                   AND $8::text IS DISTINCT FROM 'pending'
                   AND $8::text IS DISTINCT FROM 'processing'
                   AND m.pos <= CASE WHEN $8::text = 'completed' THEN greatest(
                            coalesce(s.cursor_pos, 0),
                            coalesce((SELECT max(x) FROM unnest(s.settled) x), 0))
                        ELSE 9223372036854775807 END
                 ORDER BY m.pos DESC LIMIT $9)
            ) m
         ) x
         WHERE ($8::text IS NULL OR x.status = $8)
           AND ($4::timestamptz IS NULL OR x.created_at >= $4)
           AND ($5::timestamptz IS NULL OR x.created_at < $5)
         LIMIT $6 OFFSET $7",
        parts = crate::catalog::listing::partitions_by_name!("$1", "$2", "$10"),
        state = crate::cursor::state_of!("p.id", "$3"),
        messages = crate::messages::partition_messages!("p.id"),
        dead = dead_letter::kept_dead_letter!("m.partition_id", "m.transaction_id", "m.pos", "$3"),
    );
    let rows = client
        .query(
            &sql,
            &[
                &of.queue_id,
                &of.partition_id,
                &of.group,
                &of.from,
                &of.to,
                &of.limit,
                &of.offset,
                &of.status,
                &window,
                &of.max_partitions,
            ],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| ListedRow {
            message: MessageRow::read(r),
            partition: r.get("partition"),
            queue: r.get("queue"),
            status: r.get("status"),
        })
        .collect())
}

/// One partition's part of [`messages_page`] on Citus (`$1` the partition, `$2` the group):
/// the same reads and status, every table named by the one partition, so that the statement
/// runs on the partition's worker. Citus cannot plan the single statement's lateral reads
/// over a list of partitions (nor a cursor state read through `comb.cursor_state` from a
/// worker).
fn partition_page_sql() -> String {
    format!(
        "SELECT x.* FROM (
            SELECT m.message_id, m.transaction_id, m.partition_id, m.trace_id, m.producer_sub,
                   m.payload, m.created_at, m.pos,
                   CASE WHEN {dead} THEN 'dead_letter'
                        WHEN m.pos <= coalesce(s.cursor_pos, 0) OR m.pos = ANY (s.settled)
                            THEN 'completed'
                        WHEN s.lease_expires_at > now() AND m.pos <= s.lease_upto
                            THEN 'processing'
                        ELSE 'pending' END AS status
            FROM (SELECT 1) one
            LEFT JOIN LATERAL {state} s ON true
            CROSS JOIN LATERAL (
                (SELECT * FROM {messages}
                   AND $6::text IN ('pending', 'processing')
                   AND m.pos > coalesce(s.cursor_pos, 0) AND m.seg >= coalesce(s.cursor_seg, 0)
                 ORDER BY m.pos LIMIT $7)
                UNION ALL
                (SELECT * FROM {messages}
                   AND $6::text IS DISTINCT FROM 'pending'
                   AND $6::text IS DISTINCT FROM 'processing'
                   AND m.pos <= CASE WHEN $6::text = 'completed' THEN greatest(
                            coalesce(s.cursor_pos, 0),
                            coalesce((SELECT max(x) FROM unnest(s.settled) x), 0))
                        ELSE 9223372036854775807 END
                 ORDER BY m.pos DESC LIMIT $7)
            ) m
         ) x
         WHERE ($6::text IS NULL OR x.status = $6)
           AND ($3::timestamptz IS NULL OR x.created_at >= $3)
           AND ($4::timestamptz IS NULL OR x.created_at < $4)
         LIMIT $5",
        state = crate::cursor::latest_state("$1", "$2", Some("$1")),
        messages = crate::messages::partition_messages!("$1"),
        dead = dead_letter::kept_dead_letter!("$1", "m.transaction_id", "m.pos", "$2"),
    )
}

/// [`messages_page`] on Citus: the partitions listed first (in the same order, as many),
/// then each read by [`partition_page_sql`] until the page (offset included) is full.
async fn messages_page_by_partition(
    client: &impl tokio_postgres::GenericClient,
    of: &MessagesOf<'_>,
) -> Result<Vec<ListedRow>, Refusal> {
    let window = of.limit + of.offset;
    let parts = client
        .query(
            crate::catalog::listing::partitions_by_name!("$1", "$2", "$3"),
            &[&of.queue_id, &of.partition_id, &of.max_partitions],
        )
        .await?;
    let sql = partition_page_sql();
    let mut out: Vec<ListedRow> = Vec::new();
    for p in &parts {
        let left = window - out.len() as i64;
        if left <= 0 {
            break;
        }
        let id: Uuid = p.get("id");
        let rows = client
            .query(
                &sql,
                &[&id, &of.group, &of.from, &of.to, &left, &of.status, &window],
            )
            .await?;
        out.extend(rows.iter().map(|r| ListedRow {
            message: MessageRow::read(r),
            partition: p.get("name"),
            queue: p.get("queue"),
            status: r.get("status"),
        }));
    }
    Ok(out
        .into_iter()
        .skip(of.offset as usize)
        .take(of.limit as usize)
        .collect())
}

/// Where each group reading `partition` stands on the message at `pos`, on Citus: the
/// partition's groups listed first, then their cursors' latest states read on the
/// partition's worker (`cursor::groups_at_message` reads them through `comb.cursor_state`,
/// which Citus refuses to run from a worker).
async fn groups_at_message_by_partition(
    client: &impl tokio_postgres::GenericClient,
    partition: Uuid,
    pos: i64,
) -> Result<Vec<GroupAtMessage>, Refusal> {
    let groups: Vec<String> = crate::cursor::cursors_of_partitions(client, &[partition])
        .await?
        .into_iter()
        .map(|(_, g)| g)
        .collect();
    let sql = format!(
        "SELECT g.name,
                ($2 <= coalesce(s.cursor_pos, 0) OR $2 = ANY (s.settled)) AS settled,
                coalesce(s.lease_expires_at > now() AND $2 <= s.lease_upto, false) AS leased,
                coalesce((SELECT n FROM unnest(s.attempt_pos, s.attempt_cnt) AS a(pos, n)
                          WHERE a.pos = $2), 0) AS attempts
         FROM unnest($3::text[]) AS g(name)
         CROSS JOIN LATERAL {state} s
         ORDER BY g.name",
        state = crate::cursor::latest_state("$1", "g.name", Some("$1")),
    );
    Ok(client
        .query(&sql, &[&partition, &pos, &groups])
        .await?
        .iter()
        .map(|r| GroupAtMessage {
            group: r.get("name"),
            settled: r.get::<_, Option<bool>>("settled").unwrap_or(false),
            leased: r.get("leased"),
            attempts: r.get("attempts"),
        })
        .collect())
}

/// The newest message of a partition with this transaction id, and where its partition sits.
async fn find(
    client: &impl tokio_postgres::GenericClient,
    partition: Uuid,
    transaction: &str,
) -> Result<(MessageRow, PartitionPlace), Refusal> {
    let m = stored::message_by_transaction(client, partition, transaction).await?;
    let mut places = partition_places(client, &[partition]).await?;
    match (m, places.remove(&partition)) {
        (Some(m), Some(place)) => Ok((m, place)),
        _ => Err(not_found(partition, transaction)),
    }
}

fn not_found(partition: Uuid, transaction: &str) -> Refusal {
    Refusal::not_found(
        Code::MessageNotFound,
        format!("partition {partition} holds no message with transaction id `{transaction}`"),
    )
}

/// The group's status for the message at `pos`: dead_letter when it gave up on it (and no
/// operator requeued that), completed when its cursor passed or settled it, processing when a
/// live lease handed it out, else pending.
fn status_of(g: &GroupAtMessage, pos: i64, letters: &[LetterOfMessage]) -> Status {
    if letters
        .iter()
        .any(|d| d.group == g.group && d.pos == pos && d.requeued_at.is_none())
    {
        Status::DeadLetter
    } else if g.settled {
        Status::Completed
    } else if g.leased {
        Status::Processing
    } else {
        Status::Pending
    }
}

/// `GET /api/v1/messages/{partitionId}/{transactionId}`: the message with its status for
/// every group reading its queue, its attempts, and its dead letters.
pub async fn get(
    pool: &Pool,
    backend: Backend,
    partition: Uuid,
    transaction: &str,
) -> Result<MessageDetail, Refusal> {
    let client = pool.get().await?;
    let (m, place) = find(&**client, partition, transaction).await?;
    let groups = if !backend.joins_across_partitions() {
        groups_at_message_by_partition(&**client, partition, m.pos).await?
    } else {
        crate::cursor::groups_at_message(&**client, partition, m.pos).await?
    };
    let letters = dead_letter::letters_of_message(&**client, partition, transaction).await?;
    let data = payloads_json(&**client, vec![&m.payload[..]])
        .await?
        .pop()
        .unwrap_or(Value::Null);
    let consumer_groups = groups
        .iter()
        .map(|g| MessageGroup {
            name: g.group.clone(),
            status: status_of(g, m.pos, &letters).name().to_string(),
            attempts: g.attempts,
        })
        .collect();
    let dead_letters = letters
        .into_iter()
        .map(|d| MessageDeadLetter {
            id: d.id,
            consumer_group: d.group,
            error_message: d.error,
            retry_count: d.attempts,
            moved_to_dlq_at: d.dead_at,
            requeued_at: d.requeued_at,
        })
        .collect();
    Ok(MessageDetail {
        id: m.message_id,
        message_id: m.message_id,
        transaction_id: m.transaction_id,
        partition_id: m.partition_id,
        partition: place.partition,
        queue: place.queue,
        trace_id: m.trace_id,
        producer_sub: m.producer_sub,
        data,
        created_at: m.created_at,
        position: m.pos,
        consumer_groups,
        dead_letters,
    })
}

/// `DELETE /api/v1/messages/{partitionId}/{transactionId}`: the message is settled for every
/// group reading its partition (as if acked; the queue-mode group when none reads it yet),
/// so no group is handed it again. The row stays
/// until its segment is dropped.
pub async fn delete(
    pool: &Pool,
    backend: Backend,
    catalog: &Catalog,
    partition: Uuid,
    transaction: &str,
) -> Result<MessageDeleted, Refusal> {
    super::not_on_cluster(backend, "deleting a message")?;
    let mut client = pool.get().await?;
    let (m, place) = find(&**client, partition, transaction).await?;
    super::ensure_a_reader(pool, catalog, place.queue_id).await?;
    let tx = client.transaction().await?;
    let groups = settle_for_every_group(&tx, partition, m.pos, |_| {}).await?;
    tx.commit().await?;
    Ok(MessageDeleted {
        deleted: true,
        partition_id: partition,
        transaction_id: transaction.to_string(),
        consumer_groups: groups,
    })
}

/// `POST /api/v1/messages/{partitionId}/{transactionId}/retry`: a dead-lettered message is
/// requeued (stored again at the end of its partition for the groups that gave up on it);
/// one that failed but is still pending has its attempts reset and is available at once.
pub async fn retry(
    pool: &Pool,
    backend: Backend,
    partition: Uuid,
    transaction: &str,
) -> Result<MessageRetried, Refusal> {
    super::not_on_cluster(backend, "retrying a message")?;
    let mut client = pool.get().await?;
    let (m, place) = find(&**client, partition, transaction).await?;
    let (pos, queue_id) = (m.pos, place.queue_id);
    let dead = dead_letter::unrequeued_of_message(&**client, partition, transaction, pos).await?;
    if !dead.is_empty() {
        let requeued = super::dead_letters::requeue(
            pool,
            backend,
            &super::dead_letters::Selection {
                queue_id,
                group: None,
                ids: Some(dead),
                ..Default::default()
            },
        )
        .await?;
        return Ok(MessageRetried {
            retried: true,
            queue: place.queue.clone(),
            partition_id: partition,
            transaction_id: transaction.to_string(),
            requeued: requeued.requeued,
            consumer_groups: requeued.groups,
        });
    }
    let tx = client.transaction().await?;
    let groups = super::cursors::edit_in(&tx, partition, None, true, |_, c| {
        if pos <= c.cursor_pos || c.settled.binary_search(&pos).is_ok() {
            return false;
        }
        let before = c.attempts.len();
        c.attempts.retain(|a| a.0 != pos);
        before != c.attempts.len()
    })
    .await?;
    tx.commit().await?;
    if groups.is_empty() {
        return Err(Refusal::conflict(
            Code::MessageNotFailed,
            "the message is neither dead-lettered nor failed for any group",
        ));
    }
    Ok(MessageRetried {
        retried: true,
        queue: place.queue,
        partition_id: partition,
        transaction_id: transaction.to_string(),
        requeued: 0,
        consumer_groups: groups,
    })
}

/// Settles the message at `pos` for every group of `partition` that has not settled it yet,
/// showing each such cursor to `before` first; the groups it was settled for.
async fn settle_for_every_group(
    tx: &deadpool_postgres::Transaction<'_>,
    partition: Uuid,
    pos: i64,
    mut before: impl FnMut(&crate::cursor::Cursor),
) -> Result<Vec<String>, Refusal> {
    super::cursors::edit_in(tx, partition, None, false, |_, c| {
        if pos <= c.cursor_pos || c.settled.binary_search(&pos).is_ok() {
            return false;
        }
        before(c);
        c.settle(pos, c.cursor_seg);
        c.attempts.retain(|a| a.0 != pos);
        true
    })
    .await
}

/// `POST /api/v1/messages/{partitionId}/{transactionId}/dlq`: every group that has not
/// settled the message (the queue-mode group when none reads it yet) gives up on it: a dead
/// letter for each, and the message settled.
pub async fn dead_letter(
    pool: &Pool,
    backend: Backend,
    catalog: &Catalog,
    partition: Uuid,
    transaction: &str,
) -> Result<MessageDeadLettered, Refusal> {
    super::not_on_cluster(backend, "dead-lettering a message")?;
    let mut client = pool.get().await?;
    let (m, place) = find(&**client, partition, transaction).await?;
    let (pos, queue_id) = (m.pos, place.queue_id);
    super::ensure_a_reader(pool, catalog, queue_id).await?;
    let tx = client.transaction().await?;
    let mut attempts = Vec::new();
    let groups =
        settle_for_every_group(&tx, partition, pos, |c| attempts.push(c.attempts_of(pos))).await?;
    if groups.is_empty() {
        return Err(Refusal::conflict(
            Code::MessageSettled,
            "every group reading the partition has already settled the message",
        ));
    }
    let letters: Vec<NewDeadLetter> = groups
        .iter()
        .zip(attempts)
        .map(|(group, attempts)| NewDeadLetter {
            queue_id,
            partition_id: partition,
            group: group.clone(),
            pos,
            attempts,
            error: Some("moved to the dead letters by an operator".into()),
        })
        .collect();
    let writes = dead_letter::Writes::prepare(&tx, backend).await?;
    writes.write(&tx, &letters).await?;
    tx.commit().await?;
    Ok(MessageDeadLettered {
        success: true,
        partition_id: partition,
        transaction_id: transaction.to_string(),
        consumer_groups: groups,
    })
}
