//! Dead letters: the messages a consumer group gave up on (retries exhausted, `dlq` acks,
//! `maxWaitTimeSeconds`), kept as copies in `comb.dead_letters`. This module writes them (for acks,
//! lease expiry and maintenance) and reads them back.

use chrono::{DateTime, Utc};
use deadpool_postgres::{GenericClient, Pool};
use tokio_postgres::Statement;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::backend::{Backend, Forms};
use crate::db::DbError;
use crate::queue::{GroupName, PartitionName, QueueName};

/// A message to dead-letter, gathered while acks, lease expiry or maintenance settle cursors.
pub(crate) struct NewDeadLetter {
    pub(crate) queue_id: Uuid,
    pub(crate) partition_id: Uuid,
    pub(crate) group: String,
    pub(crate) pos: i64,
    pub(crate) attempts: i32,
    pub(crate) error: Option<String>,
}

/// Copies messages into the dead letters, each with its group, attempts and last error; the
/// messages joined by what follows (`$join`).
macro_rules! write_sql {
    ($($join:tt)*) => { concat!(
    "
INSERT INTO comb.dead_letters
    (id, queue_id, partition_id, consumer_group, pos, message_id, transaction_id, trace_id,
     payload, created_at, attempts, error, producer_sub)
SELECT d.id, d.queue_id, m.partition_id, d.consumer_group, m.pos, m.message_id,
       m.transaction_id, m.trace_id, m.payload, m.created_at, d.attempts, d.error,
       m.producer_sub
FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::bigint[], $6::integer[], $7::text[])
    AS d(id, queue_id, partition_id, consumer_group, pos, attempts, error)
",
    $($join)*
    ) };
}

/// Copies messages into the dead letters; on Citus, of messages all of one partition (`$8`),
/// named to the messages so that Citus plans it on that partition's worker.
const WRITE: Forms = Forms {
    postgres: write_sql!(crate::messages::join_message!("d.partition_id", "d.pos")),
    citus: write_sql!(
        crate::messages::join_message!("d.partition_id", "d.pos"),
        " AND m.partition_id = $8"
    ),
};

/// The prepared statement that writes dead letters.
pub(crate) struct Writes {
    dead: Statement,
    backend: Backend,
}

impl Writes {
    pub(crate) async fn prepare<C: GenericClient>(
        client: &C,
        backend: Backend,
    ) -> Result<Writes, DbError> {
        Ok(Writes {
            dead: client.prepare_cached(backend.sql(&WRITE)).await?,
            backend,
        })
    }

    /// Copies `dead` into the dead letters (none: nothing is sent). No statement is prepared
    /// on the way, so whatever the caller pipelines with it follows it. On Citus, one
    /// statement per partition, each a router statement on its worker.
    pub(crate) async fn write<C: crate::db::Prepared>(
        &self,
        tx: &C,
        dead: &[NewDeadLetter],
    ) -> Result<(), DbError> {
        if dead.is_empty() {
            return Ok(());
        }
        if self.backend.statements_span_partitions() {
            return self.write_one(tx, dead, None).await;
        }
        for (partition, ks) in crate::schema::citus::by_partition(dead, |d| d.partition_id) {
            let mine: Vec<&NewDeadLetter> = ks.iter().map(|&k| &dead[k]).collect();
            self.write_one(tx, &mine, self.backend.one_partition(partition))
                .await?;
        }
        Ok(())
    }

    /// [`Writes::write`] of dead letters all of `one` partition on Citus (`None`: any, on
    /// PostgreSQL).
    async fn write_one<C: crate::db::Prepared, D: std::borrow::Borrow<NewDeadLetter>>(
        &self,
        tx: &C,
        dead: &[D],
        one: Option<Uuid>,
    ) -> Result<(), DbError> {
        let dead: Vec<&NewDeadLetter> = dead.iter().map(|d| d.borrow()).collect();
        let d_id: Vec<Uuid> = dead.iter().map(|_| Uuid::now_v7()).collect();
        let d_qid: Vec<Uuid> = dead.iter().map(|d| d.queue_id).collect();
        let d_pid: Vec<Uuid> = dead.iter().map(|d| d.partition_id).collect();
        let d_group: Vec<&str> = dead.iter().map(|d| d.group.as_str()).collect();
        let d_pos: Vec<i64> = dead.iter().map(|d| d.pos).collect();
        let d_att: Vec<i32> = dead.iter().map(|d| d.attempts).collect();
        let d_err: Vec<Option<&str>> = dead.iter().map(|d| d.error.as_deref()).collect();
        let params = crate::schema::citus::with_partition(
            &[&d_id, &d_qid, &d_pid, &d_group, &d_pos, &d_att, &d_err],
            &one,
        );
        tx.execute(&self.dead, &params).await?;
        Ok(())
    }
}

/// Deletes the dead letters of a deleted queue (in the queue deletion's transaction); returns
/// how many.
pub(crate) async fn delete_of_queue<C: GenericClient>(
    tx: &C,
    queue_id: Uuid,
) -> Result<u64, tokio_postgres::Error> {
    tx.execute(
        "DELETE FROM comb.dead_letters WHERE queue_id = $1",
        &[&queue_id],
    )
    .await
}

// Requeue and purge, for the administration (`admin::dead_letters`).

/// The dead letters `d` a requeue or purge selects: parameters queue `$1`, group `$2`, ids
/// `$3`, partition `$4`, dead-lettered from `$5` and before `$6` (each but the queue may be
/// NULL).
const SELECTED: &str = "d.queue_id = $1 AND ($2::text IS NULL OR d.consumer_group = $2)
  AND ($3::uuid[] IS NULL OR d.id = ANY ($3))
  AND ($4::uuid IS NULL OR d.partition_id = $4)
  AND ($5::timestamptz IS NULL OR d.dead_at >= $5)
  AND ($6::timestamptz IS NULL OR d.dead_at < $6)";

/// The parameters of a selection, in [`SELECTED`]'s order.
pub(crate) type SelectionArgs<'a> = [&'a (dyn ToSql + Sync); 6];

/// One dead letter a requeue takes.
pub(crate) struct ToRequeue {
    pub(crate) id: Uuid,
    pub(crate) partition_id: Uuid,
    pub(crate) pos: i64,
    pub(crate) group: String,
}

/// Locks up to `limit` selected dead letters not requeued yet, in (partition, position) order;
/// entries another request is requeueing now are skipped, not waited for. Also returns how
/// many selected entries are not requeued (locked or not).
pub(crate) async fn lock_for_requeue<C: GenericClient>(
    tx: &C,
    args: &SelectionArgs<'_>,
    limit: i64,
) -> Result<(Vec<ToRequeue>, i64), tokio_postgres::Error> {
    let rows = tx
        .query(
            &format!(
                "SELECT d.id, d.partition_id, d.pos, d.consumer_group FROM comb.dead_letters d
                 WHERE {SELECTED}
                   AND NOT EXISTS (SELECT 1 FROM comb.dead_letter_requeues r WHERE r.partition_id = d.partition_id AND r.dead_letter_id = d.id)
                 ORDER BY d.partition_id, d.pos
                 LIMIT {limit}
                 FOR UPDATE OF d SKIP LOCKED"
            ),
            args,
        )
        .await?;
    let left: i64 = tx
        .query_one(
            &format!(
                "SELECT count(*) AS left FROM comb.dead_letters d WHERE {SELECTED}
                   AND NOT EXISTS (SELECT 1 FROM comb.dead_letter_requeues r WHERE r.partition_id = d.partition_id AND r.dead_letter_id = d.id)"
            ),
            args,
        )
        .await?
        .get("left");
    let taken = rows
        .iter()
        .map(|r| ToRequeue {
            id: r.get("id"),
            partition_id: r.get("partition_id"),
            pos: r.get("pos"),
            group: r.get("consumer_group"),
        })
        .collect();
    Ok((taken, left))
}

/// Stores the requeued messages at the positions each gets (per partition, after the head, in
/// the order of the original positions) and marks the entries requeued. Rows: `partition_id`,
/// `pos` (the original), `new_pos`, and on each `stored` and `marked` (how many).
const STORE_SQL: &str = concat!(
    "
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
    CROSS JOIN LATERAL ",
    crate::messages::head_of!("p.partition_id"),
    " h
), placed AS (
    SELECT n.*, hd.head + n.rn AS new_pos FROM numbered n JOIN heads hd USING (partition_id)
), stored AS (
    ",
    crate::messages::insert_messages!(),
    "
    SELECT pl.partition_id, pl.new_pos, ",
    crate::messages::segments::newest_segment!(),
    ", gen_random_uuid(),
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
SELECT pl.partition_id, pl.pos, pl.new_pos, (SELECT count(*) FROM stored) AS stored,
       (SELECT count(*) FROM marked) AS marked
FROM placed pl"
);

/// What [`store_requeued`] did: each message's (partition, original position, new position),
/// how many messages were stored and how many entries marked.
pub(crate) struct Stored {
    pub(crate) placed: Vec<(Uuid, i64, i64)>,
    pub(crate) stored: i64,
    pub(crate) marked: i64,
}

/// Stores the dead letters `ids` again at the end of their partitions and marks them
/// requeued, in the caller's transaction (which holds their partitions' and cursors' locks).
pub(crate) async fn store_requeued<C: GenericClient>(
    tx: &C,
    ids: &[Uuid],
) -> Result<Stored, tokio_postgres::Error> {
    let rows = tx.query(STORE_SQL, &[&ids]).await?;
    let (stored, marked) = rows
        .first()
        .map(|r| (r.get("stored"), r.get("marked")))
        .unwrap_or((0, 0));
    Ok(Stored {
        placed: rows
            .iter()
            .map(|r| (r.get("partition_id"), r.get("pos"), r.get("new_pos")))
            .collect(),
        stored,
        marked,
    })
}

/// Deletes the selected dead letters and the marks of those requeued; returns how many.
pub(crate) async fn purge<C: GenericClient>(
    tx: &C,
    args: &SelectionArgs<'_>,
) -> Result<u64, tokio_postgres::Error> {
    let ids: Vec<Uuid> = tx
        .query(
            &format!("DELETE FROM comb.dead_letters d WHERE {SELECTED} RETURNING d.id"),
            args,
        )
        .await?
        .iter()
        .map(|r| r.get("id"))
        .collect();
    tx.execute(
        "DELETE FROM comb.dead_letter_requeues WHERE dead_letter_id = ANY ($1)",
        &[&ids],
    )
    .await?;
    Ok(ids.len() as u64)
}

/// Dead letters not requeued, counted per (queue, group): a subquery of rows `queue_id`,
/// `consumer_group`, `dead`.
macro_rules! counts_by_group {
    () => {
        "(SELECT d.queue_id, d.consumer_group, count(*) AS dead
  FROM comb.dead_letters d
  WHERE NOT EXISTS (SELECT 1 FROM comb.dead_letter_requeues r WHERE r.partition_id = d.partition_id AND r.dead_letter_id = d.id)
  GROUP BY d.queue_id, d.consumer_group)"
    };
}
pub(crate) use counts_by_group;

/// Most dead letters one listing returns.
pub(crate) const MAX_LIMIT: i64 = 1000;
/// Deepest offset a listing may start at: pages are read through an index, and an offset
/// costs a step per row skipped.
pub(crate) const MAX_OFFSET: i64 = 100_000;
/// A listing's `total` counts at most this many rows (more are reported as this number), so
/// the count stays a bounded walk of an index.
pub(crate) const MAX_TOTAL: i64 = 10_000;

/// What to list: one queue's dead letters, optionally of one group or partition and within a
/// time range of their dead-lettering, newest first.
#[derive(Debug, Clone)]
pub(crate) struct Filter {
    pub(crate) queue: QueueName<'static>,
    pub(crate) group: Option<GroupName<'static>>,
    pub(crate) partition: Option<PartitionName<'static>>,
    pub(crate) from: Option<DateTime<Utc>>,
    pub(crate) to: Option<DateTime<Utc>>,
    pub(crate) limit: i64,
    pub(crate) offset: i64,
}

/// One dead letter, with its original message.
#[derive(Debug, Clone)]
pub(crate) struct DeadLetter {
    pub(crate) id: Uuid,
    pub(crate) message_id: Uuid,
    pub(crate) partition_id: Uuid,
    pub(crate) partition: String,
    pub(crate) transaction_id: String,
    pub(crate) trace_id: Option<String>,
    pub(crate) group: String,
    pub(crate) error: Option<String>,
    pub(crate) attempts: i32,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) dead_at: DateTime<Utc>,
    /// The payload as stored (sealed when its queue encrypts).
    pub(crate) payload: Vec<u8>,
    /// The subject of the token the message was pushed with (Queen's `producerSub`).
    pub(crate) producer_sub: Option<String>,
}

/// A page of dead letters and how many match in all (up to [`MAX_TOTAL`]).
#[derive(Debug, Clone)]
pub(crate) struct Page {
    pub(crate) namespace: Option<String>,
    pub(crate) task: Option<String>,
    pub(crate) letters: Vec<DeadLetter>,
    pub(crate) total: i64,
}

/// The rows' conditions. With a group, the (queue_id, consumer_group, dead_at) index serves
/// the order; without, (queue_id, dead_at, id). The partition and time filters narrow what
/// those ordered scans return.
fn conditions(with_group: bool) -> &'static str {
    if with_group {
        concat!(
            "d.queue_id = $1 AND d.consumer_group = $2
         AND ($3::text IS NULL OR d.partition_id IN ",
            crate::catalog::partition_named!("$1", "$3"),
            ")
         AND ($4::timestamptz IS NULL OR d.dead_at >= $4)
         AND ($5::timestamptz IS NULL OR d.dead_at <= $5)"
        )
    } else {
        concat!(
            "d.queue_id = $1 AND $2::text IS NULL
         AND ($3::text IS NULL OR d.partition_id IN ",
            crate::catalog::partition_named!("$1", "$3"),
            ")
         AND ($4::timestamptz IS NULL OR d.dead_at >= $4)
         AND ($5::timestamptz IS NULL OR d.dead_at <= $5)"
        )
    }
}

fn list_sql(with_group: bool) -> String {
    format!(
        "SELECT d.id, d.message_id, d.partition_id, {partition} AS partition,
                d.transaction_id, d.trace_id, d.consumer_group, d.error, d.attempts,
                d.created_at, d.dead_at, d.payload, d.producer_sub
         FROM comb.dead_letters d
         WHERE {}
         ORDER BY d.dead_at DESC, d.id DESC
         LIMIT $6 OFFSET $7",
        conditions(with_group),
        partition = crate::catalog::partition_name!("d.partition_id"),
    )
}

fn count_sql(with_group: bool) -> String {
    format!(
        "SELECT count(*) FROM (SELECT 1 FROM comb.dead_letters d WHERE {} LIMIT {MAX_TOTAL}) t",
        conditions(with_group)
    )
}

/// Lists dead letters; `None` when the queue does not exist.
pub(crate) async fn list(pool: &Pool, filter: &Filter) -> Result<Option<Page>, DbError> {
    let client = pool.get().await?;
    let Some(queue) = crate::catalog::queue_named(&client, &filter.queue).await? else {
        return Ok(None);
    };
    let queue_id = queue.id;
    let with_group = filter.group.is_some();
    let params: [&(dyn ToSql + Sync); 7] = [
        &queue_id,
        &filter.group,
        &filter.partition,
        &filter.from,
        &filter.to,
        &filter.limit,
        &filter.offset,
    ];
    let list = client.prepare_cached(&list_sql(with_group)).await?;
    let count = client.prepare_cached(&count_sql(with_group)).await?;
    let (rows, total) = tokio::join!(
        client.query(&list, &params),
        client.query_one(&count, &params[..5])
    );
    let letters = rows?
        .iter()
        .map(|r| DeadLetter {
            id: r.get("id"),
            message_id: r.get("message_id"),
            partition_id: r.get("partition_id"),
            partition: r.get::<_, Option<String>>("partition").unwrap_or_default(),
            transaction_id: r.get("transaction_id"),
            trace_id: r.get("trace_id"),
            group: r.get("consumer_group"),
            error: r.get("error"),
            attempts: r.get("attempts"),
            created_at: r.get("created_at"),
            dead_at: r.get("dead_at"),
            payload: r.get("payload"),
            producer_sub: r.get("producer_sub"),
        })
        .collect();
    Ok(Some(Page {
        namespace: queue.namespace,
        task: queue.task,
        letters,
        total: total?.get("count"),
    }))
}

// Reads for the administration.

/// Whether a dead letter of the partition's message with this transaction id is kept.
pub(crate) async fn exists_for(
    client: &impl tokio_postgres::GenericClient,
    partition: Uuid,
    transaction: &str,
) -> Result<bool, DbError> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM comb.dead_letters d
                            WHERE d.partition_id = $1 AND d.transaction_id = $2) AS known",
            &[&partition, &transaction],
        )
        .await?
        .get("known"))
}

// Messages, for the administration.

/// Whether group `$g` gave up on the message at `$pos` of partition `$p` with transaction id
/// `$t` (SQL expressions) and kept the dead letter (no requeue): an SQL condition, for the
/// message listing's statement.
macro_rules! kept_dead_letter {
    ($p:literal, $t:literal, $pos:literal, $g:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM comb.dead_letters d
                WHERE d.partition_id = ",
            $p,
            " AND d.transaction_id = ",
            $t,
            " AND d.pos = ",
            $pos,
            " AND d.consumer_group = ",
            $g,
            "
                  AND NOT EXISTS (SELECT 1 FROM comb.dead_letter_requeues r
                                  WHERE r.partition_id = d.partition_id AND r.dead_letter_id = d.id))"
        )
    };
}
pub(crate) use kept_dead_letter;

/// A message a group gave up on, from the dead letter's own copy.
#[derive(Debug, Clone)]
pub(crate) struct DeadMessageRow {
    pub message_id: Uuid,
    pub transaction_id: String,
    pub partition_id: Uuid,
    pub trace_id: Option<String>,
    pub producer_sub: Option<String>,
    /// The payload as stored (sealed when its queue encrypts).
    pub payload: Vec<u8>,
    pub created_at: DateTime<Utc>,
    pub pos: i64,
    pub error: Option<String>,
    pub attempts: i32,
    pub dead_at: DateTime<Utc>,
}

/// A page of the messages a group gave up on and did not requeue, in a queue or one of its
/// partitions (every queue's when neither is given), created in `[from, to)`: the latest
/// given up first.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn dead_messages_page(
    client: &impl tokio_postgres::GenericClient,
    queue_id: Option<Uuid>,
    partition_id: Option<Uuid>,
    group: &str,
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
    limit: i64,
    offset: i64,
) -> Result<Vec<DeadMessageRow>, DbError> {
    let rows = client
        .query(
            "SELECT m.message_id, m.transaction_id, m.partition_id, m.trace_id, m.producer_sub,
                    m.payload, m.created_at, m.pos, m.error, m.attempts, m.dead_at
             FROM comb.dead_letters m
             WHERE ($1::uuid IS NULL OR m.queue_id = $1) AND ($2::uuid IS NULL OR m.partition_id = $2)
               AND m.consumer_group = $3
               AND ($4::timestamptz IS NULL OR m.created_at >= $4)
               AND ($5::timestamptz IS NULL OR m.created_at < $5)
               AND NOT EXISTS (SELECT 1 FROM comb.dead_letter_requeues r WHERE r.partition_id = m.partition_id AND r.dead_letter_id = m.id)
             ORDER BY m.dead_at DESC, m.pos LIMIT $6 OFFSET $7",
            &[&queue_id, &partition_id, &group, &from, &to, &limit, &offset],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| DeadMessageRow {
            message_id: r.get("message_id"),
            transaction_id: r.get("transaction_id"),
            partition_id: r.get("partition_id"),
            trace_id: r.get("trace_id"),
            producer_sub: r.get("producer_sub"),
            payload: r.get("payload"),
            created_at: r.get("created_at"),
            pos: r.get("pos"),
            error: r.get("error"),
            attempts: r.get("attempts"),
            dead_at: r.get("dead_at"),
        })
        .collect())
}

/// One dead letter of a message: the group's, why and when, and when it was requeued.
#[derive(Debug, Clone)]
pub(crate) struct LetterOfMessage {
    pub id: Uuid,
    pub group: String,
    pub pos: i64,
    pub error: Option<String>,
    pub attempts: i32,
    pub dead_at: DateTime<Utc>,
    pub requeued_at: Option<DateTime<Utc>>,
}

/// Every dead letter of the partition's messages with this transaction id, oldest first.
pub(crate) async fn letters_of_message(
    client: &impl tokio_postgres::GenericClient,
    partition: Uuid,
    transaction: &str,
) -> Result<Vec<LetterOfMessage>, DbError> {
    let rows = client
        .query(
            "SELECT d.id, d.consumer_group, d.pos, d.error, d.attempts, d.dead_at, r.requeued_at
             FROM comb.dead_letters d
             LEFT JOIN comb.dead_letter_requeues r ON r.partition_id = d.partition_id AND r.dead_letter_id = d.id
             WHERE d.partition_id = $1 AND d.transaction_id = $2
             ORDER BY d.dead_at",
            &[&partition, &transaction],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| LetterOfMessage {
            id: r.get("id"),
            group: r.get("consumer_group"),
            pos: r.get("pos"),
            error: r.get("error"),
            attempts: r.get("attempts"),
            dead_at: r.get("dead_at"),
            requeued_at: r.get("requeued_at"),
        })
        .collect())
}

/// Ids of the dead letters of the message at `pos` not requeued yet.
pub(crate) async fn unrequeued_of_message(
    client: &impl tokio_postgres::GenericClient,
    partition: Uuid,
    transaction: &str,
    pos: i64,
) -> Result<Vec<Uuid>, DbError> {
    Ok(client
        .query(
            "SELECT d.id FROM comb.dead_letters d
             WHERE d.partition_id = $1 AND d.transaction_id = $2 AND d.pos = $3
               AND NOT EXISTS (SELECT 1 FROM comb.dead_letter_requeues r WHERE r.partition_id = d.partition_id AND r.dead_letter_id = d.id)",
            &[&partition, &transaction, &pos],
        )
        .await?
        .iter()
        .map(|r| r.get("id"))
        .collect())
}
