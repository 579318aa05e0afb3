//! Messages as operators see them: listed by queue, partition, status and time, looked up
//! one at a time, and settled, retried or dead-lettered by hand.
//!
//! A message's status is relative to one consumer group (Queen's queue mode unless the
//! request names another): completed when its cursor passed or settled it, processing when a
//! live lease handed it out, dead_letter when the group gave up on it, else pending. Listings
//! read each partition in position order through its primary key, at most a page per
//! partition and at most [`MAX_PARTITIONS`] partitions, so no request reads message storage
//! in bulk. Nothing here updates or deletes a message row: an operator's delete is a settled
//! position in every group's cursor.

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use serde_json::{Value, json};
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::{Page, Refusal};
use crate::catalog::Catalog;
use crate::code::Code;
use crate::queue::QUEUE_MODE_GROUP;

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
    pub queue: Option<String>,
    pub partition: Option<String>,
    pub group: Option<String>,
    pub status: Option<Status>,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
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

/// A message as JSON, over `m` (a message row) and `p` (its partition with `queue`).
const MESSAGE_JSON: &str = "jsonb_build_object(
    'id', m.message_id, 'messageId', m.message_id, 'transactionId', m.transaction_id,
    'partitionId', m.partition_id, 'partition', p.name, 'queue', p.queue,
    'traceId', m.trace_id, 'producerSub', m.producer_sub, 'data', comb.payload_json(m.payload),
    'createdAt', comb.iso(m.created_at), 'position', m.pos)";

/// Joins the partition of message `m` as `p`, with its queue's name: what [`MESSAGE_JSON`]
/// reads.
const JOIN_PARTITION: &str = "JOIN (SELECT p.id, p.name, q.name AS queue FROM comb.partitions p
      JOIN comb.queues q ON q.id = p.queue_id) p ON p.id = m.partition_id";

/// `GET /api/v1/messages`.
pub async fn list(pool: &Pool, filter: &Filter, page: Page) -> Result<Value, Refusal> {
    let client = pool.get().await?;
    let queue_id = match &filter.queue {
        Some(q) => Some(super::queue_id(&**client, q).await?),
        None => None,
    };
    let partition_id = match (&filter.partition, queue_id) {
        (Some(p), Some(id)) => Some(
            super::partition_id(&**client, id, filter.queue.as_deref().unwrap_or(""), p).await?,
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
    // $1 to $7, shared by both listings; the message listing adds its status and window.
    let shared: [&(dyn ToSql + Sync); 7] = [
        &queue_id,
        &partition_id,
        &group,
        &filter.from,
        &filter.to,
        &page.limit,
        &page.offset,
    ];
    if filter.status == Some(Status::DeadLetter) {
        let list = one_json(&**client, &dead_lettered_sql(), &shared).await?;
        return Ok(listing(list, group, page));
    }
    let status = filter.status.map(Status::name);
    // Each partition yields at most a page's worth (offset included) in its window: from the
    // cursor on for pending and processing, newest first otherwise.
    let window = page.limit + page.offset;
    let sql = format!(
        "WITH parts AS (
            SELECT p.id, p.name, q.name AS queue FROM comb.partitions p
            JOIN comb.queues q ON q.id = p.queue_id
            WHERE ($1::uuid IS NULL OR p.queue_id = $1) AND ($2::uuid IS NULL OR p.id = $2)
            ORDER BY q.name, p.name LIMIT {MAX_PARTITIONS}
         )
         SELECT coalesce(jsonb_agg(r.j ORDER BY r.n), '[]') FROM (
            SELECT x.j || jsonb_build_object('status', x.status) AS j,
                   row_number() OVER () AS n
            FROM parts p
            LEFT JOIN LATERAL comb.cursor_state(p.id, $3) s ON true
            CROSS JOIN LATERAL (
                SELECT {MESSAGE_JSON} AS j, {STATUS} AS status, m.created_at
                FROM (
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
            LIMIT $6 OFFSET $7
         ) r"
    );
    let mut params = shared.to_vec();
    params.extend_from_slice(&[&status, &window]);
    let list = one_json(&**client, &sql, &params).await?;
    Ok(listing(list, group, page))
}

/// Runs a statement whose one row is one JSON value.
async fn one_json(
    client: &impl tokio_postgres::GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Value, Refusal> {
    Ok(client.query_one(sql, params).await?.get(0))
}

/// A listing's answer.
fn listing(messages: Value, group: &str, page: Page) -> Value {
    json!({
        "messages": messages,
        "consumerGroup": group,
        "limit": page.limit,
        "offset": page.offset,
    })
}

/// Dead-lettered messages of a listing, from the dead letters' own copies, over the listing's
/// shared parameters.
fn dead_lettered_sql() -> String {
    format!(
        "SELECT coalesce(jsonb_agg(r.j ORDER BY r.dead_at DESC, r.pos), '[]') FROM (
            SELECT {MESSAGE_JSON} || jsonb_build_object(
                       'status', 'dead_letter', 'errorMessage', m.error,
                       'retryCount', m.attempts, 'movedToDlqAt', comb.iso(m.dead_at)) AS j,
                   m.dead_at, m.pos
            FROM comb.dead_letters m {JOIN_PARTITION}
            WHERE ($1::uuid IS NULL OR m.queue_id = $1) AND ($2::uuid IS NULL OR m.partition_id = $2)
              AND m.consumer_group = $3
              AND ($4::timestamptz IS NULL OR m.created_at >= $4)
              AND ($5::timestamptz IS NULL OR m.created_at < $5)
              AND NOT EXISTS (SELECT 1 FROM comb.dead_letter_requeues q WHERE q.dead_letter_id = m.id)
            ORDER BY m.dead_at DESC, m.pos LIMIT $6 OFFSET $7
         ) r"
    )
}

/// The newest message of a partition with this transaction id: (position, queue id, queue
/// name).
async fn find(
    client: &impl tokio_postgres::GenericClient,
    partition: Uuid,
    transaction: &str,
) -> Result<(i64, Uuid, String), Refusal> {
    client
        .query_opt(
            "SELECT m.pos, p.queue_id, q.name FROM comb.messages m
             JOIN comb.partitions p ON p.id = m.partition_id
             JOIN comb.queues q ON q.id = p.queue_id
             WHERE m.transaction_id = $2 AND m.partition_id = $1
             ORDER BY m.pos DESC LIMIT 1",
            &[&partition, &transaction],
        )
        .await?
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .ok_or_else(|| not_found(partition, transaction))
}

fn not_found(partition: Uuid, transaction: &str) -> Refusal {
    Refusal::not_found(
        Code::MessageNotFound,
        format!("partition {partition} holds no message with transaction id `{transaction}`"),
    )
}

/// `GET /api/v1/messages/{partitionId}/{transactionId}`: the message with its status for
/// every group reading its queue, its attempts, and its dead letters.
pub async fn get(pool: &Pool, partition: Uuid, transaction: &str) -> Result<Value, Refusal> {
    let client = pool.get().await?;
    let sql = format!(
        "SELECT {MESSAGE_JSON} || jsonb_build_object(
                'consumerGroups', (
                    SELECT coalesce(jsonb_agg(jsonb_build_object(
                               'name', g.consumer_group, 'status', g.status,
                               'attempts', g.attempts) ORDER BY g.consumer_group), '[]')
                    FROM (
                        SELECT c.consumer_group,
                               {status} AS status,
                               coalesce((SELECT n FROM unnest(s.attempt_pos, s.attempt_cnt) AS a(pos, n)
                                         WHERE a.pos = m.pos), 0) AS attempts
                        FROM comb.cursors c
                        CROSS JOIN LATERAL comb.cursor_state(c.partition_id, c.consumer_group) s
                        WHERE c.partition_id = m.partition_id
                    ) g),
                'deadLetters', (
                    SELECT coalesce(jsonb_agg(jsonb_build_object(
                               'id', d.id, 'consumerGroup', d.consumer_group,
                               'errorMessage', d.error, 'retryCount', d.attempts,
                               'movedToDlqAt', comb.iso(d.dead_at),
                               'requeuedAt', comb.iso(r.requeued_at)) ORDER BY d.dead_at), '[]')
                    FROM comb.dead_letters d
                    LEFT JOIN comb.dead_letter_requeues r ON r.dead_letter_id = d.id
                    WHERE d.partition_id = m.partition_id AND d.transaction_id = m.transaction_id))
         FROM comb.messages m {JOIN_PARTITION}
         WHERE m.transaction_id = $2 AND m.partition_id = $1
         ORDER BY m.pos DESC LIMIT 1",
        status = STATUS.replace("$3", "c.consumer_group"),
    );
    let row = client.query_opt(&sql, &[&partition, &transaction]).await?;
    row.map(|r| r.get(0))
        .ok_or_else(|| not_found(partition, transaction))
}

/// `DELETE /api/v1/messages/{partitionId}/{transactionId}`: the message is settled for every
/// group reading its partition (as if acked; the queue-mode group when none reads it yet),
/// so no group is handed it again. The row stays
/// until its segment is dropped.
pub async fn delete(
    pool: &Pool,
    catalog: &Catalog,
    partition: Uuid,
    transaction: &str,
) -> Result<Value, Refusal> {
    let mut client = pool.get().await?;
    let (pos, queue_id, _) = find(&**client, partition, transaction).await?;
    super::ensure_a_reader(pool, catalog, queue_id).await?;
    let tx = client.transaction().await?;
    let groups = settle_for_every_group(&tx, partition, pos, |_| {}).await?;
    tx.commit().await?;
    Ok(json!({
        "deleted": true,
        "partitionId": partition,
        "transactionId": transaction,
        "consumerGroups": groups,
    }))
}

/// `POST /api/v1/messages/{partitionId}/{transactionId}/retry`: a dead-lettered message is
/// requeued (stored again at the end of its partition for the groups that gave up on it);
/// one that failed but is still pending has its attempts reset and is available at once.
pub async fn retry(pool: &Pool, partition: Uuid, transaction: &str) -> Result<Value, Refusal> {
    let mut client = pool.get().await?;
    let (pos, queue_id, queue) = find(&**client, partition, transaction).await?;
    let dead: Vec<Uuid> = client
        .query(
            "SELECT d.id FROM comb.dead_letters d
             WHERE d.partition_id = $1 AND d.transaction_id = $2 AND d.pos = $3
               AND NOT EXISTS (SELECT 1 FROM comb.dead_letter_requeues r WHERE r.dead_letter_id = d.id)",
            &[&partition, &transaction, &pos],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if !dead.is_empty() {
        let requeued = super::dead_letters::requeue(
            pool,
            &super::dead_letters::Selection {
                queue_id,
                group: None,
                ids: Some(dead),
                ..Default::default()
            },
        )
        .await?;
        return Ok(json!({
            "retried": true,
            "queue": queue,
            "partitionId": partition,
            "transactionId": transaction,
            "requeued": requeued.requeued,
            "consumerGroups": requeued.groups,
        }));
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
    Ok(json!({
        "retried": true,
        "queue": queue,
        "partitionId": partition,
        "transactionId": transaction,
        "requeued": 0,
        "consumerGroups": groups,
    }))
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
    catalog: &Catalog,
    partition: Uuid,
    transaction: &str,
) -> Result<Value, Refusal> {
    let mut client = pool.get().await?;
    let (pos, queue_id, _) = find(&**client, partition, transaction).await?;
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
    tx.execute(
        "INSERT INTO comb.dead_letters
             (id, queue_id, partition_id, consumer_group, pos, message_id, transaction_id,
              trace_id, payload, created_at, attempts, error, producer_sub)
         SELECT gen_random_uuid(), $1, m.partition_id, g.name, m.pos, m.message_id,
                m.transaction_id, m.trace_id, m.payload, m.created_at, g.attempts,
                'moved to the dead letters by an operator', m.producer_sub
         FROM unnest($4::text[], $5::integer[]) AS g(name, attempts)
         JOIN comb.messages m ON m.partition_id = $2 AND m.pos = $3",
        &[&queue_id, &partition, &pos, &groups, &attempts],
    )
    .await?;
    tx.commit().await?;
    Ok(json!({
        "success": true,
        "partitionId": partition,
        "transactionId": transaction,
        "consumerGroups": groups,
    }))
}
