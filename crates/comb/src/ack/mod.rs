//! Ack: settle leased messages and move the group's position.
//!
//! The rules live in [`cursor`]: [`Cursor::apply`](crate::cursor::Cursor::apply), a pure function over one (partition,
//! group) cursor:
//! acks may arrive in any order; the position moves over the longest run of settled messages;
//! a failure ends the lease and counts an attempt for that message only; once its first
//! attempt and `retryLimit` retries have failed the message is dead-lettered, which settles it for the group so the partition moves on.
//!
//! [`completed`] judges the common case in SQL: cursors whose every ack completes a message
//! under their live lease are locked, moved and committed in one call. [`store`] holds
//! the general path's SQL: fused acks run as one transaction in two round trips: look up the
//! messages, lock their cursor rows (in a stable order) and read the cursors' latest state
//! after the lock; then append each changed cursor's next state version and the dead
//! letters, and commit.

mod completed;
mod cursor;
mod store;

use std::sync::Arc;

use deadpool_postgres::Pool;
use uuid::Uuid;

use crate::code::Code;
use crate::db::DbError;
use crate::fusion::{Fuser, Reply};
use crate::metrics::{Metrics, QueueCounts, Settled};
use crate::queue::GroupName;
use crate::refusal::{Kind, Refusal};
use crate::wake::Wake;

pub use crate::catalog::CURSOR_STATE_SQL as STATE_SQL;
pub use crate::cursor::LOCK_SQL;
/// The ack path's statements, public for the test suite's plan checks.
pub use completed::JUDGE_SQL;
pub(crate) use completed::{
    COMPLETE_FUNCTION, COMPLETE_NAME, JUDGE_CITUS_FUNCTION, JUDGE_CITUS_SIGNATURE,
};
pub use store::{ACK_STATE_SQL, LOOKUP_SQL, PLANS};
pub(crate) use store::{
    RunSettled, WriteStatements, lease_live_in, queues_of, settle_in, settle_run_in, write_back,
};

/// What the consumer says of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AckStatus {
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
pub(crate) struct AckItem {
    pub(crate) partition_id: Uuid,
    pub(crate) transaction_id: String,
    pub(crate) group: GroupName<'static>,
    pub(crate) status: AckStatus,
    pub(crate) lease_id: Option<Uuid>,
    pub(crate) error: Option<String>,
}

/// Why an ack was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AckRefusal {
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
    pub(crate) fn code(self) -> Code {
        match self {
            AckRefusal::MessageNotFound => Code::MessageNotFound,
            AckRefusal::NotConsumed => Code::ConsumerGroupNotFound,
            AckRefusal::LeaseInvalid => Code::LeaseInvalid,
            AckRefusal::NotDelivered => Code::MessageNotDelivered,
        }
    }

    /// Human text.
    pub(crate) fn message(self) -> &'static str {
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
pub(crate) struct AckOutcome {
    pub(crate) result: Result<(), AckRefusal>,
    pub(crate) queue_name: Option<String>,
    pub(crate) partition_name: Option<String>,
    pub(crate) lease_released: bool,
    pub(crate) dlq: bool,
    /// The message exhausted `retryLimit` in a queue that keeps no dead letters for that
    /// (`deadLetterQueue` or `dlqAfterMaxRetries` false): skipped and counted.
    pub(crate) discarded: bool,
}

/// An ack request (one or many items) waiting for its batch.
pub(crate) struct AckJob {
    pub(crate) items: Vec<AckItem>,
    pub(crate) reply: Reply<Vec<AckOutcome>>,
}

impl AckRefusal {
    /// The refusal answered for this ack; `at` names the item in a larger request.
    pub(crate) fn refusal(self, at: &str) -> Refusal {
        let kind = match self {
            AckRefusal::MessageNotFound | AckRefusal::NotConsumed => Kind::NotFound,
            AckRefusal::LeaseInvalid | AckRefusal::NotDelivered => Kind::Conflict,
        };
        Refusal::new(kind, self.code(), format!("{at}{}", self.message()))
    }
}

/// Accepted acks counted by what they asked for, for this server's metrics.
pub(crate) fn tally(statuses: &[AckStatus], outcomes: &[AckOutcome]) -> Settled {
    let mut t = Settled::default();
    for (status, o) in statuses.iter().zip(outcomes) {
        if o.result.is_err() {
            continue;
        }
        match status {
            AckStatus::Completed => t.acked += 1,
            AckStatus::Failed => t.failed += 1,
            AckStatus::Retry => t.retried += 1,
            AckStatus::Dlq => {}
        }
        t.dead_lettered += u64::from(o.dlq);
        t.discarded += u64::from(o.discarded);
    }
    t
}

/// The handle every route that acks goes through.
pub(crate) struct Acker {
    fuser: Fuser<AckJob>,
    per_shard: PerShard,
    metrics: Arc<Metrics>,
    wake: Arc<Wake>,
    backend: crate::backend::Backend,
}

/// On Citus, a fuser per worker (direct route) or per shard (through the coordinator): acks
/// of one worker's partitions are fused only with acks of that worker, so a fused batch runs
/// on that worker alone, as each request did (fused over workers, a worker lost would fail
/// the acks of the live workers fused with its own). Through the coordinator, a batch keeps
/// to one shard: the coordinator commits a transaction that wrote several shards in two
/// phases. An ack request naming partitions of several workers (or shards) goes to the
/// shared fuser, as one batch, as it asks.
struct PerShard {
    placement: crate::schema::citus::Placement,
    /// Where a lane's acks go: its worker on the direct route.
    router: crate::db::route::Router,
    fusers: std::sync::Mutex<std::collections::HashMap<crate::schema::citus::Lane, Fuser<AckJob>>>,
    pool: Pool,
    stage: Arc<crate::metrics::Stage>,
    workers: usize,
    max_items: usize,
}

impl Acker {
    /// Starts the ack workers and returns the handle in front of them.
    pub(crate) fn start(
        pool: Pool,
        backend: crate::backend::Backend,
        router: crate::db::route::Router,
        metrics: Arc<Metrics>,
        wake: Arc<Wake>,
        workers: usize,
        max_items: usize,
    ) -> Acker {
        let stage = metrics.fusion.ack.clone();
        let fuser = store::start(
            pool.clone(),
            backend,
            router.clone(),
            workers,
            max_items,
            stage.clone(),
        );
        Acker {
            fuser,
            per_shard: PerShard {
                placement: Default::default(),
                router,
                fusers: Default::default(),
                pool,
                stage,
                workers,
                max_items,
            },
            metrics,
            wake,
            backend,
        }
    }

    /// The fuser an ack request goes to: the shared one, or on Citus the one of the worker
    /// (direct route) or shard holding every partition it names ([`PerShard`]).
    async fn fuser_for(&self, items: &[AckItem]) -> Result<Fuser<AckJob>, Refusal> {
        if !self.backend.fuses_per_shard() {
            return Ok(self.fuser.clone());
        }
        let mut ids: Vec<Uuid> = items.iter().map(|i| i.partition_id).collect();
        ids.sort_unstable();
        ids.dedup();
        let n = &self.per_shard;
        let lane = n
            .placement
            .lane(&n.pool, &ids, n.router.is_direct())
            .await
            .map_err(DbError::from)?;
        let Some(lane) = lane else {
            return Ok(self.fuser.clone());
        };
        let mut fusers = n.fusers.lock().unwrap();
        Ok(fusers
            .entry(lane)
            .or_insert_with(|| {
                store::start(
                    n.pool.clone(),
                    self.backend,
                    n.router.clone(),
                    n.workers,
                    n.max_items,
                    n.stage.clone(),
                )
            })
            .clone())
    }

    /// Settles acks in the next fused ack transaction; one outcome per item, in order.
    /// Each item succeeds or fails on its own.
    pub(crate) async fn settle(&self, items: Vec<AckItem>) -> Result<Vec<AckOutcome>, Refusal> {
        let released: Vec<(Uuid, String, AckStatus)> = items
            .iter()
            .map(|i| (i.partition_id, i.group.to_string(), i.status))
            .collect();
        let fuser = self.fuser_for(&items).await?;
        let outcomes = fuser.ask(0, |reply| AckJob { items, reply }).await?;
        self.record(&released, &outcomes);
        Ok(outcomes)
    }

    /// After the acks' commit: counts accepted acks in this server's metrics, and tells the
    /// waiting pops of each partition whose lease they ended that it may be claimed again.
    /// `acked` holds each ack's (partition, group, status), in the order of `outcomes`.
    pub(crate) fn record(&self, acked: &[(Uuid, String, AckStatus)], outcomes: &[AckOutcome]) {
        let statuses: Vec<AckStatus> = acked.iter().map(|a| a.2).collect();
        self.metrics.messages.settled(&tally(&statuses, outcomes));
        for (status, o) in statuses.iter().zip(outcomes) {
            if let (Ok(()), Some(queue)) = (&o.result, &o.queue_name) {
                let counts = QueueCounts {
                    acked: u64::from(*status == AckStatus::Completed),
                    failed: u64::from(*status == AckStatus::Failed),
                    dead_lettered: u64::from(o.dlq),
                    ..QueueCounts::default()
                };
                self.metrics.queues.add(queue, counts);
            }
        }
        for ((partition, group, status), o) in acked.iter().zip(outcomes) {
            if let (Ok(()), true, Some(queue)) = (&o.result, o.lease_released, &o.queue_name) {
                let returned = matches!(status, AckStatus::Failed | AckStatus::Retry);
                self.wake.released(queue, group, *partition, returned);
            }
        }
    }
}
