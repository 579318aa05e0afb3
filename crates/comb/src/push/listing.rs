//! Reads of stored messages for the administration, each taking the caller's client.

use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::db::DbError;

/// Whether the partition holds a message with this transaction id (an index probe).
pub(crate) async fn message_exists(
    client: &impl GenericClient,
    partition: Uuid,
    transaction: &str,
) -> Result<bool, DbError> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM comb.messages m
                            WHERE m.transaction_id = $2 AND m.partition_id = $1) AS known",
            &[&partition, &transaction],
        )
        .await?
        .get("known"))
}

// Messages, for the administration.

/// A stored message as the administration shows it.
#[derive(Debug, Clone)]
pub(crate) struct MessageRow {
    pub message_id: Uuid,
    pub transaction_id: String,
    pub partition_id: Uuid,
    pub trace_id: Option<String>,
    pub producer_sub: Option<String>,
    /// The payload as stored (sealed when its queue encrypts).
    pub payload: Vec<u8>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub pos: i64,
}

impl MessageRow {
    fn read(r: &tokio_postgres::Row) -> MessageRow {
        MessageRow {
            message_id: r.get("message_id"),
            transaction_id: r.get("transaction_id"),
            partition_id: r.get("partition_id"),
            trace_id: r.get("trace_id"),
            producer_sub: r.get("producer_sub"),
            payload: r.get("payload"),
            created_at: r.get("created_at"),
            pos: r.get("pos"),
        }
    }
}

/// The newest message of a partition with this transaction id (an index probe).
pub(crate) async fn message_by_transaction(
    client: &impl GenericClient,
    partition: Uuid,
    transaction: &str,
) -> Result<Option<MessageRow>, DbError> {
    Ok(client
        .query_opt(
            "SELECT m.message_id, m.transaction_id, m.partition_id, m.trace_id, m.producer_sub,
                    m.payload, m.created_at, m.pos
             FROM comb.messages m
             WHERE m.transaction_id = $2 AND m.partition_id = $1
             ORDER BY m.pos DESC LIMIT 1",
            &[&partition, &transaction],
        )
        .await?
        .as_ref()
        .map(MessageRow::read))
}

/// A message of [`messages_page`].
#[derive(Debug, Clone)]
pub(crate) struct ListedRow {
    pub message: MessageRow,
    pub partition: String,
    pub queue: String,
    /// The group's status of the message.
    pub status: String,
}

/// What [`messages_page`] lists: partitions of a queue or one partition (every queue's when
/// neither is given), the group whose status is shown, a status and a creation window.
#[derive(Debug, Clone)]
pub(crate) struct MessagesOf<'a> {
    pub queue_id: Option<Uuid>,
    pub partition_id: Option<Uuid>,
    pub group: &'a str,
    /// `pending`, `processing`, `completed` or `dead_letter`; any when absent.
    pub status: Option<&'a str>,
    pub from: Option<chrono::DateTime<chrono::Utc>>,
    pub to: Option<chrono::DateTime<chrono::Utc>>,
    pub limit: i64,
    pub offset: i64,
    /// Most partitions visited.
    pub max_partitions: i64,
}

/// A page of messages with their status for the group, partition by partition (by queue and
/// partition name), each with its partition's and queue's names. Each partition is read in position order through its primary key and
/// yields at most a page's worth (offset included): from the cursor on for pending and
/// processing, newest first otherwise. The status is the group's: dead_letter when it gave up
/// on the message (and did not requeue it), completed when its cursor passed or settled it,
/// processing when a live lease handed it out, else pending.
pub(crate) async fn messages_page(
    client: &impl GenericClient,
    of: &MessagesOf<'_>,
) -> Result<Vec<ListedRow>, DbError> {
    let window = of.limit + of.offset;
    let sql = format!(
        "WITH parts AS (
            SELECT p.id, p.name, p.queue_id, q.name AS queue FROM comb.partitions p
            JOIN comb.queues q ON q.id = p.queue_id
            WHERE ($1::uuid IS NULL OR p.queue_id = $1) AND ($2::uuid IS NULL OR p.id = $2)
            ORDER BY q.name, p.name LIMIT {max}
         )
         SELECT x.* FROM (
            SELECT m.message_id, m.transaction_id, m.partition_id, p.name AS partition,
                   p.queue_id, p.queue, m.trace_id, m.producer_sub, m.payload, m.created_at,
                   m.pos, {STATUS} AS status
            FROM parts p
            LEFT JOIN LATERAL comb.cursor_state(p.id, $3) s ON true
            CROSS JOIN LATERAL (
                (SELECT * FROM comb.messages m
                 WHERE m.partition_id = p.id AND $8::text IN ('pending', 'processing')
                   AND m.pos > coalesce(s.cursor_pos, 0) AND m.seg >= coalesce(s.cursor_seg, 0)
                 ORDER BY m.pos LIMIT $9)
                UNION ALL
                (SELECT * FROM comb.messages m
                 WHERE m.partition_id = p.id AND $8::text IS DISTINCT FROM 'pending'
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
        max = of.max_partitions,
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

/// Status of message `m` for the group whose cursor state is `s` (NULL when the group never
/// read the partition), `$3` naming the group.
const STATUS: &str = "CASE
    WHEN EXISTS (SELECT 1 FROM comb.dead_letters d
                 WHERE d.partition_id = m.partition_id AND d.transaction_id = m.transaction_id
                   AND d.pos = m.pos AND d.consumer_group = $3
                   AND NOT EXISTS (SELECT 1 FROM comb.dead_letter_requeues r
                                   WHERE r.dead_letter_id = d.id)) THEN 'dead_letter'
    WHEN m.pos <= coalesce(s.cursor_pos, 0) OR m.pos = ANY (s.settled) THEN 'completed'
    WHEN s.lease_expires_at > now() AND m.pos <= s.lease_upto THEN 'processing'
    ELSE 'pending' END";
