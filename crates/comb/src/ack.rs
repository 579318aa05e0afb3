//! Ack: settle leased messages and move the group's position.
//!
//! The rules live in [`Cursor::apply`], a pure function over one (partition, group) cursor:
//! acks may arrive in any order; the position moves over the longest run of settled messages;
//! a failure ends the lease and counts an attempt for that message only; at the retry limit
//! the message is dead-lettered, which settles it for the group so the partition moves on.
//!
//! Fused acks run as one transaction in two round trips: look up the messages, lock their
//! cursor rows (in a stable order) and read the cursors' latest state after the lock; then
//! append each changed cursor's next state version and the dead letters, and commit.

use std::collections::HashMap;
use std::sync::Arc;

use deadpool_postgres::{GenericClient, Pool, Transaction};
use tokio::sync::oneshot;
use tokio_postgres::Statement;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::db::{self, DbError};
use crate::fusion::{Fuser, Runner};
use crate::metrics::Stage;
use crate::queue::QueueOptions;

/// What the consumer says of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckStatus {
    /// Done: settle it.
    Completed,
    /// Processing failed: count an attempt, hand it out again after `retryDelay`.
    Failed,
    /// Give it back without counting an attempt.
    Retry,
    /// Dead-letter it now.
    Dlq,
}

/// One ack, validated.
#[derive(Debug, Clone)]
pub struct AckItem {
    pub partition_id: Uuid,
    pub transaction_id: String,
    pub group: String,
    pub status: AckStatus,
    pub lease_id: Option<Uuid>,
    pub error: Option<String>,
}

/// Why an ack was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckRefusal {
    /// No message with that transaction id in that partition.
    MessageNotFound,
    /// The group never read that partition.
    NotConsumed,
    /// The lease named is not the live lease of the partition.
    LeaseInvalid,
    /// The message was never handed out to the group.
    NotDelivered,
}

impl AckRefusal {
    /// Stable machine code.
    pub fn code(self) -> &'static str {
        match self {
            AckRefusal::MessageNotFound => "message_not_found",
            AckRefusal::NotConsumed => "consumer_group_not_found",
            AckRefusal::LeaseInvalid => "lease_invalid",
            AckRefusal::NotDelivered => "message_not_delivered",
        }
    }

    /// Human text.
    pub fn message(self) -> &'static str {
        match self {
            AckRefusal::MessageNotFound => "no message with this transactionId in this partition",
            AckRefusal::NotConsumed => "the consumer group has not consumed this partition",
            AckRefusal::LeaseInvalid => "the lease is not the current lease of this partition",
            AckRefusal::NotDelivered => "the message has not been delivered to this group",
        }
    }
}

/// What became of one ack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckOutcome {
    pub result: Result<(), AckRefusal>,
    pub queue_name: Option<String>,
    pub partition_name: Option<String>,
    pub lease_released: bool,
    pub dlq: bool,
}

/// The state of one (partition, group) cursor, as the ack rules see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub cursor_pos: i64,
    pub cursor_seg: i32,
    /// Settled positions above `cursor_pos`, sorted.
    pub settled: Vec<i64>,
    /// (position, failed attempts) above `cursor_pos`, sorted by position.
    pub attempts: Vec<(i64, i32)>,
    pub lease_id: Option<Uuid>,
    /// The lease has not expired.
    pub lease_live: bool,
    /// The lease acks of this request are judged against: the live lease as the request found
    /// it. A failure in the middle of a batch ends the lease for later requests, not for the
    /// rest of its own batch.
    pub request_lease: Option<Uuid>,
    pub lease_upto: i64,
    /// Set when a failure asks for the partition to rest this many milliseconds.
    pub rest_ms: Option<u64>,
}

/// What applying one ack did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Applied {
    pub lease_released: bool,
    /// The message must be copied to the dead letters, after this many failed attempts.
    pub dead_letter: Option<i32>,
}

impl Cursor {
    /// Applies one ack of the message at `pos` (in segment `seg`).
    /// With `strict`, the message must be under the live lease even when no lease id is
    /// given, and acking a settled message is refused: exactly-once pipelines rely on it.
    pub fn apply(
        &mut self,
        pos: i64,
        seg: i32,
        status: AckStatus,
        lease_id: Option<Uuid>,
        opts: &QueueOptions,
        strict: bool,
    ) -> Result<Applied, AckRefusal> {
        let settled = pos <= self.cursor_pos || self.settled.binary_search(&pos).is_ok();
        if settled && !strict {
            // Already settled: acking again changes nothing and is not an error.
            return Ok(Applied::default());
        }
        let under_live_lease = self.request_lease.is_some() && pos <= self.lease_upto;
        match lease_id {
            Some(l) if self.request_lease != Some(l) || settled => {
                return Err(AckRefusal::LeaseInvalid);
            }
            None if strict && (settled || !under_live_lease) => {
                return Err(AckRefusal::LeaseInvalid);
            }
            _ if pos > self.lease_upto => return Err(AckRefusal::NotDelivered),
            _ => {}
        }
        let mut applied = Applied::default();
        match status {
            AckStatus::Completed => self.settle(pos, seg),
            AckStatus::Retry => self.end_lease(&mut applied),
            AckStatus::Dlq => {
                applied.dead_letter = Some(self.attempts_of(pos));
                self.settle(pos, seg);
            }
            AckStatus::Failed => {
                let attempts = self.attempts_of(pos) + 1;
                if attempts as i64 >= opts.retry_limit as i64 {
                    applied.dead_letter = Some(attempts);
                    self.settle(pos, seg);
                } else {
                    self.set_attempts(pos, attempts);
                    self.rest_ms = Some(opts.retry_delay);
                }
                self.end_lease(&mut applied);
            }
        }
        if self.lease_id.is_some() && self.cursor_pos >= self.lease_upto {
            self.end_lease(&mut applied);
        }
        Ok(applied)
    }

    /// Starts judging a new request's acks against the lease as it is now.
    pub fn begin_request(&mut self) {
        self.request_lease = self.lease_id.filter(|_| self.lease_live);
    }

    /// Ends an expired lease: every message it handed out and nobody settled counts an
    /// attempt; those at the retry limit are dead-lettered (returned with their attempts).
    pub fn expire(&mut self, opts: &QueueOptions) -> Vec<(i64, i32)> {
        let mut dead = Vec::new();
        for pos in (self.cursor_pos + 1)..=self.lease_upto {
            if pos <= self.cursor_pos || self.settled.binary_search(&pos).is_ok() {
                continue;
            }
            let attempts = self.attempts_of(pos) + 1;
            if attempts as i64 >= opts.retry_limit as i64 {
                dead.push((pos, attempts));
                self.settle(pos, self.cursor_seg);
            } else {
                self.set_attempts(pos, attempts);
            }
        }
        self.lease_id = None;
        self.lease_live = false;
        dead
    }

    /// Failed attempts recorded for `pos`.
    pub fn attempts_of(&self, pos: i64) -> i32 {
        match self.attempts.binary_search_by_key(&pos, |a| a.0) {
            Ok(i) => self.attempts[i].1,
            Err(_) => 0,
        }
    }

    fn set_attempts(&mut self, pos: i64, n: i32) {
        match self.attempts.binary_search_by_key(&pos, |a| a.0) {
            Ok(i) => self.attempts[i].1 = n,
            Err(i) => self.attempts.insert(i, (pos, n)),
        }
    }

    fn end_lease(&mut self, applied: &mut Applied) {
        if self.lease_id.is_some() {
            applied.lease_released = true;
        }
        self.lease_id = None;
        self.lease_live = false;
    }

    /// Marks `pos` settled and moves the position over the settled run.
    pub(crate) fn settle(&mut self, pos: i64, seg: i32) {
        if let Err(i) = self.settled.binary_search(&pos) {
            self.settled.insert(i, pos);
        }
        let run = self
            .settled
            .iter()
            .enumerate()
            .take_while(|(i, p)| **p == self.cursor_pos + 1 + *i as i64)
            .count();
        if run > 0 {
            self.cursor_pos += run as i64;
            self.settled.drain(..run);
            if pos <= self.cursor_pos {
                self.cursor_seg = self.cursor_seg.max(seg);
            }
            let cut = self.cursor_pos;
            self.attempts.retain(|a| a.0 > cut);
        }
    }
}

/// An ack request (one or many items) waiting for its batch.
pub struct AckJob {
    pub items: Vec<AckItem>,
    pub reply: oneshot::Sender<Result<Vec<AckOutcome>, Arc<DbError>>>,
}

/// Positions of acked messages, found by transaction id: one descent of the transaction id
/// index per message. Acks read positions from their cursor's delivered range instead
/// ([`ACK_STATE_SQL`]); this finds the few that are not there.
pub const LOOKUP_SQL: &str = "
SELECT i.ord, m.pos, m.seg
FROM unnest($1::uuid[], $2::text[]) WITH ORDINALITY AS i(partition_id, transaction_id, ord)
CROSS JOIN LATERAL (
    -- No ORDER BY: a transaction id is stored once per partition, and ordering by position
    -- would make the planner walk the partition in position order instead of using the
    -- (transaction_id, partition_id) index.
    SELECT m.pos, m.seg FROM comb.messages m
    WHERE m.partition_id = i.partition_id AND m.transaction_id = i.transaction_id
    LIMIT 1
) m";

/// Locks cursor rows in a stable order (acks of one batch never deadlock with another's).
/// The rows only serialise writers; the state is read by a later statement ([`STATE_SQL`]),
/// whose snapshot then holds every version written before the lock was granted.
pub const LOCK_SQL: &str = "
SELECT c.partition_id FROM comb.cursors c
WHERE (c.partition_id, c.consumer_group) IN (SELECT * FROM unnest($1::uuid[], $2::text[]))
ORDER BY c.partition_id, c.consumer_group
FOR NO KEY UPDATE OF c";

/// Like [`LOCK_SQL`] for the cursors of one group whose lease ended, skipping busy ones.
const EXPIRED_LOCK_SQL: &str = "
SELECT c.partition_id FROM comb.cursors c
CROSS JOIN LATERAL comb.cursor_state(c.partition_id, c.consumer_group) s
WHERE c.partition_id = ANY($1) AND c.consumer_group = $2
  AND s.lease_id IS NOT NULL AND s.lease_expires_at <= now()
ORDER BY c.partition_id
FOR NO KEY UPDATE OF c SKIP LOCKED";

/// The columns [`locked_cursors`] reads, of a cursor's state `s` and its queue `q`, shared
/// by the statements that read locked cursors.
macro_rules! locked_columns {
    () => {
        "
SELECT s.partition_id, s.consumer_group, s.cursor_pos, s.cursor_seg, s.settled,
       s.attempt_pos, s.attempt_cnt, s.lease_id,
       coalesce(s.lease_expires_at > now(), false), s.lease_upto,
       q.options, q.id"
    };
}

/// The latest state of locked cursors, in the columns [`locked_cursors`] reads.
pub const STATE_SQL: &str = concat!(
    locked_columns!(),
    "
FROM (SELECT DISTINCT * FROM unnest($1::uuid[], $2::text[])) AS u(partition_id, consumer_group)
JOIN comb.cursors c
  ON c.partition_id = u.partition_id AND c.consumer_group = u.consumer_group
JOIN comb.queues q ON q.id = c.queue_id
CROSS JOIN LATERAL comb.cursor_state(u.partition_id, u.consumer_group) s"
);

/// [`STATE_SQL`] for acks, given each cursor once with the number of acks it receives: each
/// locked cursor's state, and the position, segment and
/// transaction id of its messages from just after its position up to the last one handed
/// out, the acked messages among them. One ordered read of the primary key per cursor costs
/// the database several times less than a descent of the transaction id index per acked
/// message. The read stops a little beyond as many messages as the request acks on that
/// cursor (and those already settled above its position), so acking one message of a large
/// lease reads a few rows; acks not found there are looked up by [`LOOKUP_SQL`].
pub const ACK_STATE_SQL: &str = concat!(
    locked_columns!(),
    ", r.pos, r.seg, r.transaction_id
FROM unnest($1::uuid[], $2::text[], $3::bigint[]) AS u(partition_id, consumer_group, acks)
-- One probe of the cursor's key each (LIMIT keeps the subquery from becoming a join the
-- planner could answer by reading every cursor of the queue).
CROSS JOIN LATERAL (
    SELECT c.queue_id FROM comb.cursors c
    WHERE c.partition_id = u.partition_id AND c.consumer_group = u.consumer_group
    LIMIT 1
) c
JOIN comb.queues q ON q.id = c.queue_id
CROSS JOIN LATERAL comb.cursor_state(u.partition_id, u.consumer_group) s
CROSS JOIN LATERAL (
    SELECT array_agg(m.pos) AS pos, array_agg(m.seg) AS seg,
           array_agg(m.transaction_id) AS transaction_id
    FROM comb.messages m
    WHERE m.partition_id = u.partition_id
      AND m.pos > s.cursor_pos
      AND m.pos <= least(s.lease_upto,
                         s.cursor_pos + 2 * u.acks + 8 + cardinality(s.settled))
      AND m.seg >= s.cursor_seg
) r"
);

const NAMES_SQL: &str = "
SELECT p.id, p.name, q.name FROM comb.partitions p JOIN comb.queues q ON q.id = p.queue_id
WHERE p.id = ANY($1)";

/// Appends the next version of changed cursors. What the rules do not decide (lease expiry,
/// last claim) is carried over from the version it follows.
const WRITE_SQL: &str = "
INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at)
SELECT u.partition_id, u.consumer_group, (SELECT max(gen) FROM comb.cursor_gens), s.ver + 1,
       u.cursor_pos, u.cursor_seg, u.settled::bigint[], u.attempt_pos::bigint[],
       u.attempt_cnt::integer[], u.lease_id,
       CASE WHEN u.lease_id IS NULL THEN NULL ELSE s.lease_expires_at END,
       s.lease_upto,
       CASE WHEN u.rest_ms IS NULL THEN s.available_at
           ELSE now() + make_interval(secs => u.rest_ms / 1000.0) END,
       s.last_claimed_at
FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::integer[], $5::text[], $6::text[],
            $7::text[], $8::uuid[], $9::bigint[])
    AS u(partition_id, consumer_group, cursor_pos, cursor_seg, settled, attempt_pos,
         attempt_cnt, lease_id, rest_ms)
CROSS JOIN LATERAL comb.cursor_state(u.partition_id, u.consumer_group) s";

const DEAD_LETTER_SQL: &str = "
INSERT INTO comb.dead_letters
    (id, queue_id, partition_id, consumer_group, pos, message_id, transaction_id, trace_id,
     payload, created_at, attempts, error)
SELECT d.id, d.queue_id, m.partition_id, d.consumer_group, m.pos, m.message_id,
       m.transaction_id, m.trace_id, m.payload, m.created_at, d.attempts, d.error
FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::bigint[], $6::integer[], $7::text[])
    AS d(id, queue_id, partition_id, consumer_group, pos, attempts, error)
JOIN comb.messages m ON m.partition_id = d.partition_id AND m.pos = d.pos";

/// Starts the ack workers.
pub fn start(pool: Pool, workers: usize, max_items: usize, stage: Arc<Stage>) -> Fuser<AckJob> {
    let run: Runner<AckJob> = Arc::new(move |jobs| {
        let pool = pool.clone();
        Box::pin(async move {
            let items: Vec<&AckItem> = jobs.iter().flat_map(|j| j.items.iter()).collect();
            match settle(&pool, &items).await {
                Ok(outcomes) => {
                    let mut it = outcomes.into_iter();
                    for job in jobs {
                        let mine: Vec<AckOutcome> = it.by_ref().take(job.items.len()).collect();
                        let _ = job.reply.send(Ok(mine));
                    }
                }
                Err(e) => {
                    let e = Arc::new(e);
                    for job in jobs {
                        let _ = job.reply.send(Err(e.clone()));
                    }
                }
            }
        })
    });
    Fuser::start(workers, max_items, |j: &AckJob| j.items.len(), run, stage)
}

/// A cursor locked for update, with what the rules need to know about its queue.
pub(crate) struct Locked {
    pub(crate) cursor: Cursor,
    pub(crate) queue_id: Uuid,
    pub(crate) options: QueueOptions,
    pub(crate) changed: bool,
}

/// A message to dead-letter, gathered while acks are applied.
pub(crate) struct DeadLetter {
    pub(crate) queue_id: Uuid,
    pub(crate) partition_id: Uuid,
    pub(crate) group: String,
    pub(crate) pos: i64,
    pub(crate) attempts: i32,
    pub(crate) error: Option<String>,
}

/// How an ack transaction of its own begins: with the consumer path's plans
/// ([`db::consumer_plans`]).
pub const BEGIN: &str = concat!("BEGIN; ", db::consumer_plans!());

/// Applies acks in one transaction of their own, in two round trips: BEGIN with the reads,
/// then the writes with COMMIT. One outcome per item, in order.
async fn settle(pool: &Pool, items: &[&AckItem]) -> Result<Vec<AckOutcome>, DbError> {
    let client = pool.get().await?;
    // Everything is prepared before the pipelines: a statement still being prepared when
    // COMMIT is sent would run after it, outside the transaction.
    let reads = ReadStatements::prepare(&client).await?;
    let writes = WriteStatements::prepare(&client).await?;
    let (begin, read) = tokio::join!(
        client.batch_execute(BEGIN),
        judge(&client, &reads, items, false),
    );
    let judged = match begin.map_err(DbError::from).and(read) {
        Ok(judged) => judged,
        Err(e) => {
            db::roll_back(&client).await;
            return Err(e);
        }
    };
    // A failed write makes the pipelined COMMIT roll back.
    let (written, commit) = tokio::join!(
        write_back(&client, &writes, &judged.cursors, &judged.dead),
        client.batch_execute("COMMIT"),
    );
    written?;
    commit?;
    Ok(judged.outcomes)
}

/// Applies acks inside the caller's transaction; one outcome per item, in order.
/// Refused items change nothing; the caller decides whether to commit the rest. The rest
/// of the transaction runs with the consumer path's plans ([`db::consumer_plans`]).
pub async fn settle_in(
    tx: &Transaction<'_>,
    items: &[&AckItem],
    strict: bool,
) -> Result<Vec<AckOutcome>, DbError> {
    // Cached plans of these statements are shared with the ack path's own transactions:
    // they are made under the same settings wherever they are made.
    tx.batch_execute(db::consumer_plans!()).await?;
    let reads = ReadStatements::prepare(tx).await?;
    let writes = WriteStatements::prepare(tx).await?;
    let judged = judge(tx, &reads, items, strict).await?;
    write_back(tx, &writes, &judged.cursors, &judged.dead).await?;
    Ok(judged.outcomes)
}

/// The statements that read what acks are judged against.
struct ReadStatements {
    lookup: Statement,
    lock: Statement,
    state: Statement,
    names: Statement,
}

impl ReadStatements {
    async fn prepare<C: GenericClient>(client: &C) -> Result<ReadStatements, DbError> {
        Ok(ReadStatements {
            lookup: client.prepare_cached(LOOKUP_SQL).await?,
            lock: client.prepare_cached(LOCK_SQL).await?,
            state: client.prepare_cached(ACK_STATE_SQL).await?,
            names: client.prepare_cached(NAMES_SQL).await?,
        })
    }
}

/// Acks judged: their outcomes, and the cursor versions and dead letters to write.
struct Judged {
    outcomes: Vec<AckOutcome>,
    cursors: HashMap<(Uuid, String), Locked>,
    dead: Vec<DeadLetter>,
}

/// Reads the cursors' state (locked first) with the positions of the messages they handed
/// out, in one pipelined round trip (a second looks up acked messages not found there), and
/// applies the acks to the cursors in memory.
async fn judge<C: GenericClient>(
    tx: &C,
    statements: &ReadStatements,
    items: &[&AckItem],
    strict: bool,
) -> Result<Judged, DbError> {
    // Each cursor once, with its acks counted: a batch acks many messages of few cursors.
    let mut acks: HashMap<(Uuid, &str), i64> = HashMap::new();
    for i in items {
        *acks.entry((i.partition_id, i.group.as_str())).or_default() += 1;
    }
    let pids: Vec<Uuid> = acks.keys().map(|k| k.0).collect();
    let groups: Vec<&str> = acks.keys().map(|k| k.1).collect();
    let counts: Vec<i64> = acks.values().copied().collect();
    let mut partitions = pids.clone();
    partitions.sort_unstable();
    partitions.dedup();
    let lock_params: [&(dyn ToSql + Sync); 2] = [&pids, &groups];
    let state_params: [&(dyn ToSql + Sync); 3] = [&pids, &groups, &counts];
    let names_params: [&(dyn ToSql + Sync); 1] = [&partitions];
    // Pipelined: one round trip. The state is read after the lock statement has finished.
    let (lock, locked, named) = tokio::join!(
        tx.query(&statements.lock, &lock_params),
        tx.query(&statements.state, &state_params),
        tx.query(&statements.names, &names_params),
    );
    lock?;
    let locked = locked?;
    let position = positions(tx, &statements.lookup, items, &locked).await?;
    let mut cursors = locked_cursors(&locked);
    for state in cursors.values_mut() {
        state.cursor.begin_request();
    }
    let mut partition_names: HashMap<Uuid, (String, String)> = HashMap::new();
    for r in named? {
        partition_names.insert(r.get(0), (r.get(1), r.get(2)));
    }

    let mut outcomes = Vec::with_capacity(items.len());
    let mut dead: Vec<DeadLetter> = Vec::new();
    for (k, item) in items.iter().enumerate() {
        let names = partition_names.get(&item.partition_id);
        let mut outcome = AckOutcome {
            result: Ok(()),
            queue_name: names.map(|n| n.1.clone()),
            partition_name: names.map(|n| n.0.clone()),
            lease_released: false,
            dlq: false,
        };
        let Some((pos, seg)) = position[k] else {
            outcome.result = Err(AckRefusal::MessageNotFound);
            outcomes.push(outcome);
            continue;
        };
        let Some(state) = cursors.get_mut(&(item.partition_id, item.group.clone())) else {
            outcome.result = Err(AckRefusal::NotConsumed);
            outcomes.push(outcome);
            continue;
        };
        match state
            .cursor
            .apply(pos, seg, item.status, item.lease_id, &state.options, strict)
        {
            Ok(applied) => {
                state.changed = true;
                outcome.lease_released = applied.lease_released;
                if let Some(attempts) = applied.dead_letter {
                    outcome.dlq = true;
                    dead.push(DeadLetter {
                        queue_id: state.queue_id,
                        partition_id: item.partition_id,
                        group: item.group.clone(),
                        pos,
                        attempts,
                        error: item.error.clone(),
                    });
                }
            }
            Err(refusal) => outcome.result = Err(refusal),
        }
        outcomes.push(outcome);
    }
    Ok(Judged {
        outcomes,
        cursors,
        dead,
    })
}

/// The position and segment of each acked message (`None`: no such message in its
/// partition): from the delivered ranges read with the cursors' state, else looked up by
/// transaction id, all missing ones in one statement.
async fn positions<C: GenericClient>(
    tx: &C,
    lookup: &Statement,
    items: &[&AckItem],
    locked: &[tokio_postgres::Row],
) -> Result<Vec<Option<(i64, i32)>>, DbError> {
    let mut delivered: HashMap<(Uuid, &str), (i64, i32)> = HashMap::new();
    for r in locked {
        let partition_id: Uuid = r.get(0);
        // NULL when the range is empty.
        let (Some(pos), Some(seg), Some(txids)) = (
            r.get::<_, Option<Vec<i64>>>(12),
            r.get::<_, Option<Vec<i32>>>(13),
            r.get::<_, Option<Vec<&str>>>(14),
        ) else {
            continue;
        };
        for ((p, s), t) in pos.into_iter().zip(seg).zip(txids) {
            delivered.insert((partition_id, t), (p, s));
        }
    }
    let mut position: Vec<Option<(i64, i32)>> = items
        .iter()
        .map(|i| {
            delivered
                .get(&(i.partition_id, i.transaction_id.as_str()))
                .copied()
        })
        .collect();
    let missing: Vec<usize> = (0..items.len())
        .filter(|&k| position[k].is_none())
        .collect();
    if missing.is_empty() {
        return Ok(position);
    }
    let pids: Vec<Uuid> = missing.iter().map(|&k| items[k].partition_id).collect();
    let txids: Vec<&str> = missing
        .iter()
        .map(|&k| items[k].transaction_id.as_str())
        .collect();
    let params: [&(dyn ToSql + Sync); 2] = [&pids, &txids];
    for r in tx.query(lookup, &params).await? {
        let ord: i64 = r.get(0);
        position[missing[(ord - 1) as usize]] = Some((r.get(1), r.get(2)));
    }
    Ok(position)
}

/// Ends the expired leases of `group` on these partitions: counts the attempts of their
/// unsettled messages and dead-letters those at the retry limit. Cursors another claim or
/// ack holds right now are skipped; they are seen again on a later pop.
pub async fn expire_leases(pool: &Pool, group: &str, partitions: &[Uuid]) -> Result<(), DbError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    tx.batch_execute(db::consumer_plans!()).await?;
    let stmt = tx.prepare_cached(EXPIRED_LOCK_SQL).await?;
    let state = tx.prepare_cached(STATE_SQL).await?;
    let locked: Vec<Uuid> = tx
        .query(&stmt, &[&partitions, &group])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if locked.is_empty() {
        return Ok(());
    }
    let groups: Vec<&str> = locked.iter().map(|_| group).collect();
    let rows = tx.query(&state, &[&locked, &groups]).await?;
    let mut cursors = locked_cursors(&rows);
    // Read again under the lock: only leases still ended are expired.
    cursors.retain(|_, l| l.cursor.lease_id.is_some() && !l.cursor.lease_live);
    let mut dead = Vec::new();
    for ((partition_id, group), state) in cursors.iter_mut() {
        state.changed = true;
        for (pos, attempts) in state.cursor.expire(&state.options) {
            dead.push(DeadLetter {
                queue_id: state.queue_id,
                partition_id: *partition_id,
                group: group.clone(),
                pos,
                attempts,
                error: Some("lease expired without an ack".into()),
            });
        }
    }
    let writes = WriteStatements::prepare(&tx).await?;
    write_back(&tx, &writes, &cursors, &dead).await?;
    tx.commit().await?;
    LEASE_DEAD_LETTERED.add(dead.len() as u64);
    Ok(())
}

/// Messages this process dead-lettered when leases expired unsettled. Kept here rather than
/// in the request's metrics: expiry happens inside a claim, which answers no counters.
pub static LEASE_DEAD_LETTERED: crate::metrics::Counter = crate::metrics::Counter::new();

/// Cursors as read by [`STATE_SQL`].
pub(crate) fn locked_cursors(rows: &[tokio_postgres::Row]) -> HashMap<(Uuid, String), Locked> {
    let mut cursors = HashMap::new();
    for r in rows {
        let attempt_pos: Vec<i64> = r.get(5);
        let attempt_cnt: Vec<i32> = r.get(6);
        let options: serde_json::Value = r.get(10);
        let set = serde_json::from_value(options).unwrap_or_default();
        cursors.insert(
            (r.get(0), r.get(1)),
            Locked {
                cursor: Cursor {
                    cursor_pos: r.get(2),
                    cursor_seg: r.get(3),
                    settled: r.get(4),
                    attempts: attempt_pos.into_iter().zip(attempt_cnt).collect(),
                    lease_id: r.get(7),
                    lease_live: r.get(8),
                    request_lease: None,
                    lease_upto: r.get(9),
                    rest_ms: None,
                },
                options: QueueOptions::from_set(&set),
                queue_id: r.get(11),
                changed: false,
            },
        );
    }
    cursors
}

/// The statements that write cursor versions and dead letters.
pub(crate) struct WriteStatements {
    write: Statement,
    dead: Statement,
}

impl WriteStatements {
    pub(crate) async fn prepare<C: GenericClient>(client: &C) -> Result<WriteStatements, DbError> {
        Ok(WriteStatements {
            write: client.prepare_cached(WRITE_SQL).await?,
            dead: client.prepare_cached(DEAD_LETTER_SQL).await?,
        })
    }
}

/// Appends the next version of changed cursors and writes new dead letters (pipelined: one
/// round trip, no statement prepared on the way, so a COMMIT pipelined after it follows
/// them). The cursors must have been locked in this transaction.
pub(crate) async fn write_back<C: GenericClient>(
    tx: &C,
    statements: &WriteStatements,
    cursors: &HashMap<(Uuid, String), Locked>,
    dead: &[DeadLetter],
) -> Result<(), DbError> {
    let changed: Vec<(&(Uuid, String), &Locked)> =
        cursors.iter().filter(|(_, l)| l.changed).collect();
    if changed.is_empty() {
        return Ok(());
    }
    let u_pid: Vec<Uuid> = changed.iter().map(|(k, _)| k.0).collect();
    let u_group: Vec<&str> = changed.iter().map(|(k, _)| k.1.as_str()).collect();
    let u_pos: Vec<i64> = changed.iter().map(|(_, l)| l.cursor.cursor_pos).collect();
    let u_seg: Vec<i32> = changed.iter().map(|(_, l)| l.cursor.cursor_seg).collect();
    let u_settled: Vec<String> = changed
        .iter()
        .map(|(_, l)| array_literal(l.cursor.settled.iter()))
        .collect();
    let u_apos: Vec<String> = changed
        .iter()
        .map(|(_, l)| array_literal(l.cursor.attempts.iter().map(|a| &a.0)))
        .collect();
    let u_acnt: Vec<String> = changed
        .iter()
        .map(|(_, l)| array_literal(l.cursor.attempts.iter().map(|a| &a.1)))
        .collect();
    let u_lease: Vec<Option<Uuid>> = changed.iter().map(|(_, l)| l.cursor.lease_id).collect();
    let u_rest: Vec<Option<i64>> = changed
        .iter()
        .map(|(_, l)| l.cursor.rest_ms.map(|m| m as i64))
        .collect();
    let d_id: Vec<Uuid> = dead.iter().map(|_| Uuid::now_v7()).collect();
    let d_qid: Vec<Uuid> = dead.iter().map(|d| d.queue_id).collect();
    let d_pid: Vec<Uuid> = dead.iter().map(|d| d.partition_id).collect();
    let d_group: Vec<&str> = dead.iter().map(|d| d.group.as_str()).collect();
    let d_pos: Vec<i64> = dead.iter().map(|d| d.pos).collect();
    let d_att: Vec<i32> = dead.iter().map(|d| d.attempts).collect();
    let d_err: Vec<Option<&str>> = dead.iter().map(|d| d.error.as_deref()).collect();
    let dead_params: [&(dyn ToSql + Sync); 7] =
        [&d_id, &d_qid, &d_pid, &d_group, &d_pos, &d_att, &d_err];
    let update_params: [&(dyn ToSql + Sync); 9] = [
        &u_pid, &u_group, &u_pos, &u_seg, &u_settled, &u_apos, &u_acnt, &u_lease, &u_rest,
    ];
    let write_dead = async {
        if dead.is_empty() {
            return Ok(());
        }
        tx.execute(&statements.dead, &dead_params).await.map(|_| ())
    };
    let (u, d) = tokio::join!(tx.execute(&statements.write, &update_params), write_dead);
    u?;
    d?;
    Ok(())
}

/// A PostgreSQL array literal such as `{1,2,3}`.
fn array_literal<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
    let mut s = String::from("{");
    for (i, v) in items.enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&v.to_string());
    }
    s.push('}');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leased(upto: i64) -> (Cursor, Uuid) {
        let lease = Uuid::new_v4();
        (
            Cursor {
                cursor_pos: 0,
                cursor_seg: 1,
                settled: vec![],
                attempts: vec![],
                lease_id: Some(lease),
                lease_live: true,
                request_lease: Some(lease),
                lease_upto: upto,
                rest_ms: None,
            },
            lease,
        )
    }

    fn opts() -> QueueOptions {
        QueueOptions::default()
    }

    #[test]
    fn out_of_order_acks_move_the_position_over_the_settled_run() {
        let (mut c, l) = leased(3);
        c.apply(2, 1, AckStatus::Completed, Some(l), &opts(), false)
            .unwrap();
        assert_eq!(c.cursor_pos, 0);
        assert_eq!(c.settled, vec![2]);
        c.apply(1, 1, AckStatus::Completed, Some(l), &opts(), false)
            .unwrap();
        assert_eq!(c.cursor_pos, 2);
        assert!(c.settled.is_empty());
        let a = c
            .apply(3, 1, AckStatus::Completed, Some(l), &opts(), false)
            .unwrap();
        assert_eq!(c.cursor_pos, 3);
        assert!(a.lease_released, "the whole batch is settled");
        assert_eq!(c.lease_id, None);
    }

    #[test]
    fn failed_between_completed_does_not_move_past_the_failure() {
        let (mut c, l) = leased(3);
        c.apply(1, 1, AckStatus::Completed, Some(l), &opts(), false)
            .unwrap();
        let f = c
            .apply(2, 1, AckStatus::Failed, Some(l), &opts(), false)
            .unwrap();
        assert!(f.lease_released);
        assert_eq!(c.cursor_pos, 1);
        assert_eq!(c.attempts_of(2), 1);
        assert_eq!(c.rest_ms, Some(1000));
        // The rest of the same request still counts against the lease it found…
        c.apply(3, 1, AckStatus::Completed, Some(l), &opts(), false)
            .unwrap();
        assert_eq!(c.cursor_pos, 1, "message 2 still pending");
        assert_eq!(c.settled, vec![3]);
        // …but in a later request the ended lease is no longer valid.
        c.begin_request();
        assert_eq!(
            c.apply(3, 1, AckStatus::Failed, Some(l), &opts(), false),
            Ok(Applied::default()),
            "settled already: a no-op"
        );
        let (mut c, l) = leased(3);
        c.apply(1, 1, AckStatus::Failed, Some(l), &opts(), false)
            .unwrap();
        c.begin_request();
        assert_eq!(
            c.apply(2, 1, AckStatus::Completed, Some(l), &opts(), false),
            Err(AckRefusal::LeaseInvalid)
        );
        // An ack without a lease id still settles a delivered message.
        c.apply(2, 1, AckStatus::Completed, None, &opts(), false)
            .unwrap();
        assert_eq!(c.settled, vec![2]);
    }

    #[test]
    fn retry_limit_dead_letters_and_moves_on() {
        let o = QueueOptions {
            retry_limit: 2,
            ..opts()
        };
        let (mut c, l) = leased(2);
        let a = c
            .apply(1, 1, AckStatus::Failed, Some(l), &o, false)
            .unwrap();
        assert_eq!(a.dead_letter, None);
        c.lease_id = Some(l);
        c.lease_live = true;
        let a = c
            .apply(1, 1, AckStatus::Failed, Some(l), &o, false)
            .unwrap();
        assert_eq!(a.dead_letter, Some(2));
        assert_eq!(c.cursor_pos, 1);
        assert!(c.attempts.is_empty());
    }

    #[test]
    fn retry_does_not_count() {
        let (mut c, l) = leased(1);
        let a = c
            .apply(1, 1, AckStatus::Retry, Some(l), &opts(), false)
            .unwrap();
        assert!(a.lease_released);
        assert_eq!(c.attempts_of(1), 0);
        assert_eq!(c.rest_ms, None);
        assert_eq!(c.cursor_pos, 0);
    }

    #[test]
    fn dlq_settles_at_once() {
        let (mut c, l) = leased(2);
        let a = c
            .apply(1, 1, AckStatus::Dlq, Some(l), &opts(), false)
            .unwrap();
        assert_eq!(a.dead_letter, Some(0));
        assert_eq!(c.cursor_pos, 1);
        assert!(!a.lease_released, "message 2 is still leased");
    }

    #[test]
    fn wrong_or_expired_lease_is_refused() {
        let (mut c, _) = leased(1);
        assert_eq!(
            c.apply(
                1,
                1,
                AckStatus::Completed,
                Some(Uuid::new_v4()),
                &opts(),
                false
            ),
            Err(AckRefusal::LeaseInvalid)
        );
        let (mut c, l) = leased(1);
        c.lease_live = false;
        c.begin_request();
        assert_eq!(
            c.apply(1, 1, AckStatus::Completed, Some(l), &opts(), false),
            Err(AckRefusal::LeaseInvalid)
        );
    }

    #[test]
    fn undelivered_message_is_refused_and_settled_one_is_a_no_op() {
        let (mut c, l) = leased(1);
        assert_eq!(
            c.apply(5, 1, AckStatus::Completed, None, &opts(), false),
            Err(AckRefusal::NotDelivered)
        );
        c.apply(1, 1, AckStatus::Completed, Some(l), &opts(), false)
            .unwrap();
        assert_eq!(
            c.apply(
                1,
                1,
                AckStatus::Completed,
                Some(Uuid::new_v4()),
                &opts(),
                false
            ),
            Ok(Applied::default())
        );
    }

    #[test]
    fn an_expired_lease_counts_an_attempt_for_each_unsettled_message() {
        let o = QueueOptions {
            retry_limit: 2,
            ..opts()
        };
        let (mut c, l) = leased(3);
        c.apply(2, 1, AckStatus::Completed, Some(l), &o, false)
            .unwrap();
        assert!(c.expire(&o).is_empty());
        assert_eq!(
            (c.attempts_of(1), c.attempts_of(2), c.attempts_of(3)),
            (1, 0, 1)
        );
        assert_eq!(c.lease_id, None);
        // Second expiry reaches the limit: 1 and 3 are dead-lettered, the position moves on.
        c.lease_id = Some(l);
        let dead = c.expire(&o);
        assert_eq!(dead, vec![(1, 2), (3, 2)]);
        assert_eq!(c.cursor_pos, 3);
        assert!(c.settled.is_empty() && c.attempts.is_empty());
    }

    #[test]
    fn strict_acks_need_the_live_lease() {
        let (mut c, l) = leased(2);
        assert_eq!(
            c.apply(1, 1, AckStatus::Completed, None, &opts(), true),
            Ok(Applied::default())
        );
        assert_eq!(c.cursor_pos, 1);
        // Settled already: a transaction may not count it twice.
        assert_eq!(
            c.apply(1, 1, AckStatus::Completed, Some(l), &opts(), true),
            Err(AckRefusal::LeaseInvalid)
        );
        c.lease_live = false;
        c.begin_request();
        assert_eq!(
            c.apply(2, 1, AckStatus::Completed, None, &opts(), true),
            Err(AckRefusal::LeaseInvalid)
        );
    }

    #[test]
    fn array_literals() {
        assert_eq!(array_literal([1i64, 2, 3].iter()), "{1,2,3}");
        assert_eq!(array_literal(Vec::<i64>::new().iter()), "{}");
    }
}
