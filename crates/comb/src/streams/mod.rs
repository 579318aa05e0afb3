//! Streams: the server side of Queen's streams SDK (`Stream.from_(…).window_…().reduce()…`).
//!
//! The SDK runs the operators in the client; the server keeps what makes the result exact.
//! A query is registered by name with the hash of its operator chain ([`Streams::register`]).
//! Each cycle of a running query commits, in one PostgreSQL transaction, the acks of the
//! source messages it read, the new version of its operator state and the messages it emits
//! to its sink queue ([`Streams::cycle`]): all of it or nothing. The acks are judged by the
//! ack rules in strict mode (every one under the live lease of its partition), so a cycle
//! whose lease ended — its messages may be with another runner by now — commits nothing.
//!
//! State belongs to a (query, source partition) pair. Each change is a new version of the
//! pair's whole state (`comb.stream_states`, insert-only); a reset registers the query again
//! under a new id, so the old state is simply no longer read. Cycles of one pair run one after
//! another: each locks the pair's `comb.stream_partitions` row first, then reads the newest
//! version.

pub(crate) mod generations;
mod store;

use crate::code::Code;
use crate::queue::{GroupName, QueueName};
use std::sync::Arc;

use bytes::Bytes;
use deadpool_postgres::Pool;
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::ack::{AckOutcome, AckStatus, Acker, settle_run_in};
use crate::db::DbError;
use crate::fusion::{Fuser, Reply};
use crate::push::{Item, NewMessage, Pusher, Stored, store_in};
use crate::refusal::Refusal;
use crate::wake::Wake;

/// The largest state value, as JSON text: a value is one window's accumulator or one
/// gate's bucket, and a bigger one is a mistake in the pipeline rather than state.
pub(crate) const STATE_VALUE_MAX_BYTES: usize = 64 * 1024;

/// The largest state key, in bytes.
pub(crate) const STATE_KEY_MAX_BYTES: usize = 1024;

/// The largest state of one (query, partition) pair, as JSON text: each change writes the
/// pair's whole state again, so it must stay small.
pub(crate) const STATE_MAX_BYTES: usize = 4 * 1024 * 1024;

/// A query to register, as the SDK describes it.
pub(crate) struct Registration {
    pub(crate) name: String,
    pub(crate) source_queue: QueueName<'static>,
    pub(crate) sink_queue: Option<QueueName<'static>>,
    pub(crate) config_hash: String,
    /// The caller's consent to drop the state of a query whose operator chain changed.
    pub(crate) reset: bool,
}

/// A registered query.
pub(crate) struct Registered {
    pub(crate) query_id: Uuid,
    pub(crate) name: String,
    pub(crate) config_hash: String,
    /// Registered just now, for the first time or again after a reset.
    pub(crate) fresh: bool,
    /// The query's state was dropped (a reset of a changed operator chain).
    pub(crate) reset: bool,
}

/// A change of one state key.
pub(crate) enum StateOp {
    Upsert { key: String, value: Value },
    Delete { key: String },
}

/// The source ack of a cycle: the first `count` unsettled messages of the live lease, the
/// last of which is `transaction_id`.
pub(crate) struct CycleAck {
    pub(crate) transaction_id: String,
    pub(crate) lease_id: Option<Uuid>,
    pub(crate) count: usize,
}

/// One cycle of a query on one source partition.
pub(crate) struct Cycle<'a> {
    pub(crate) query_id: Uuid,
    pub(crate) partition_id: Uuid,
    pub(crate) group: GroupName<'static>,
    pub(crate) state_ops: Vec<StateOp>,
    pub(crate) items: Vec<Item<'a>>,
    pub(crate) ack: Option<CycleAck>,
    /// With false, messages of the lease left unacked stay away until it would have ended.
    pub(crate) release_lease: bool,
}

/// What a committed cycle did.
pub(crate) struct CycleDone {
    pub(crate) source_queue: String,
    pub(crate) state_ops_applied: usize,
    pub(crate) messages: Vec<NewMessage>,
    pub(crate) stored: Vec<Stored>,
    /// Messages acked and whether the lease ended, when the cycle acked.
    pub(crate) acked: Option<(usize, bool)>,
}

/// Which state rows to read.
pub(crate) struct StateQuery {
    pub(crate) query_id: Uuid,
    pub(crate) partition_id: Uuid,
    /// Only these keys (all when empty).
    pub(crate) keys: Vec<String>,
    /// Only keys starting with this.
    pub(crate) key_prefix: Option<String>,
    /// Only values whose numeric `windowEnd` is at most this (ms since the epoch).
    pub(crate) ripe_at_or_before: Option<i64>,
}

/// One state row.
pub(crate) struct StateRow {
    pub(crate) key: String,
    pub(crate) value: Value,
    /// When the key was last written, in ms since the epoch.
    pub(crate) updated_ms: Option<i64>,
}

/// The handle of the streams use case.
pub(crate) struct Streams {
    pool: Pool,
    pusher: Arc<Pusher>,
    acker: Arc<Acker>,
    wake: Arc<Wake>,
    fuser: Fuser<CycleJob>,
}

impl Streams {
    /// A handle running cycles on `pool`, pushing and acking as the other routes do.
    pub(crate) fn new(
        pool: Pool,
        pusher: Arc<Pusher>,
        acker: Arc<Acker>,
        wake: Arc<Wake>,
        stage: Arc<crate::metrics::Stage>,
    ) -> Streams {
        let fuser = store::start(pool.clone(), pusher.backend(), stage);
        Streams {
            pool,
            pusher,
            acker,
            wake,
            fuser,
        }
    }

    /// Registers a query: the same name with the same hash and source is the query as it
    /// is (nothing written); a new name is inserted; a changed one is refused unless the
    /// caller asks for a reset, which registers it again under a new id.
    pub(crate) async fn register(&self, r: &Registration) -> Result<Registered, Refusal> {
        let mut client = self.pool.get().await.map_err(DbError::from)?;
        let tx = client.transaction().await.map_err(DbError::from)?;
        let current = store::lock_query_name(&tx, &r.name).await?;
        let (query_id, fresh, reset) = match current {
            Some(q)
                if q.config_hash == r.config_hash && q.source_queue == r.source_queue.as_str() =>
            {
                (q.id, false, false)
            }
            Some(q) if !r.reset => {
                let what = if q.config_hash != r.config_hash {
                    "its operator chain changed (config_hash)"
                } else {
                    "its source queue changed"
                };
                return Err(Refusal::conflict(
                    Code::StreamConfigChanged,
                    format!(
                        "config_hash mismatch: query `{}` is registered already and {what}; \
                         pass reset:true to drop its state, or use a new query name",
                        r.name
                    ),
                ));
            }
            previous => {
                let id = Uuid::now_v7();
                store::insert_query(&tx, id, r).await?;
                (id, true, previous.is_some())
            }
        };
        tx.commit().await.map_err(DbError::from)?;
        Ok(Registered {
            query_id,
            name: r.name.clone(),
            config_hash: r.config_hash.clone(),
            fresh,
            reset,
        })
    }

    /// Commits one cycle: the acks, the new state version and the sink pushes in one
    /// transaction. Any refusal rolls all of it back. `body` holds the bytes the pushed
    /// items were decoded from. Cycles arriving together are fused: one transaction for all of
    /// them, each under a savepoint of its own, so a refused cycle takes nothing of the others
    /// with it, and one commit (one WAL flush) answers them all.
    pub(crate) async fn cycle(
        &self,
        cycle: Cycle<'_>,
        body: &Bytes,
        producer_sub: Option<Arc<str>>,
    ) -> Result<CycleDone, Refusal> {
        let source_queue = self.source_of(cycle.query_id, cycle.partition_id).await?;
        let messages = if cycle.items.is_empty() {
            Vec::new()
        } else {
            self.pusher.check_capacity(&cycle.items).await?;
            self.pusher.resolve(cycle.items, body, producer_sub).await?
        };
        let fused = Fused {
            query_id: cycle.query_id,
            partition_id: cycle.partition_id,
            group: cycle.group.to_string(),
            state_ops: cycle.state_ops,
            messages: messages.clone(),
            ack: cycle.ack,
            release_lease: cycle.release_lease,
        };
        let committed = self
            .fuser
            .ask(0, |reply| CycleJob {
                cycle: fused,
                reply,
            })
            .await?;
        let (partition, group) = (cycle.partition_id, committed.group.clone());
        let committed = match committed.result {
            Ok(c) => c,
            Err(refusal) => {
                if refusal.code == Code::QueueDeleted
                    && let Some(m) = messages.first()
                {
                    self.pusher.forget_queue(&m.queue);
                }
                return Err(refusal);
            }
        };
        if let Some(run) = &committed.run {
            self.record_acks(partition, &group, run);
        }
        self.pusher.record(&messages, &committed.stored);
        crate::push::announce(&self.wake, messages.iter());
        Ok(CycleDone {
            source_queue,
            state_ops_applied: committed.state_ops_applied,
            messages,
            stored: committed.stored,
            acked: committed.run.map(|r| (r.completed.len(), r.lease_released)),
        })
    }

    /// Counts a cycle's acks like any others and hands an ended lease's partition back to
    /// waiting pops.
    fn record_acks(&self, partition: Uuid, group: &str, run: &crate::ack::RunSettled) {
        let outcome = |released: bool| AckOutcome {
            result: Ok(()),
            queue_name: run.queue_name.clone(),
            partition_name: None,
            lease_released: released,
            dlq: false,
            discarded: false,
        };
        let mut acked: Vec<(Uuid, String, AckStatus)> = run
            .completed
            .iter()
            .map(|_| (partition, group.to_string(), AckStatus::Completed))
            .collect();
        let mut outcomes: Vec<AckOutcome> = acked.iter().map(|_| outcome(false)).collect();
        if run.lease_released
            && let Some(last) = outcomes.last_mut()
        {
            last.lease_released = true;
        }
        if acked.is_empty() && run.lease_released {
            acked.push((partition, group.to_string(), AckStatus::Retry));
            outcomes.push(outcome(true));
        }
        self.acker.record(&acked, &outcomes);
    }

    /// The state rows of a query on a partition, by key.
    pub(crate) async fn state(&self, q: &StateQuery) -> Result<Vec<StateRow>, Refusal> {
        self.source_of(q.query_id, q.partition_id).await?;
        let client = self.pool.get().await.map_err(DbError::from)?;
        let Some((_, state, updated)) =
            store::newest_state(&client, q.partition_id, q.query_id).await?
        else {
            return Ok(Vec::new());
        };
        let mut rows: Vec<StateRow> = state
            .into_iter()
            .filter(|(k, _)| q.keys.is_empty() || q.keys.iter().any(|w| w == k))
            .filter(|(k, _)| q.key_prefix.as_deref().is_none_or(|p| k.starts_with(p)))
            .filter(|(_, v)| {
                q.ripe_at_or_before.is_none_or(|ripe| {
                    v.get("windowEnd")
                        .and_then(Value::as_f64)
                        .is_some_and(|end| end <= ripe as f64)
                })
            })
            .map(|(key, value)| StateRow {
                updated_ms: updated.get(&key).and_then(Value::as_i64),
                key,
                value,
            })
            .collect();
        rows.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(rows)
    }

    /// The source queue of a query that may run a cycle on `partition`: the query must be
    /// registered (and not replaced by a reset), and the partition must be one of its
    /// source queue's.
    async fn source_of(&self, query: Uuid, partition: Uuid) -> Result<String, Refusal> {
        let client = self.pool.get().await.map_err(DbError::from)?;
        match store::query_reads(&client, query, partition).await? {
            None => Err(Refusal::not_found(
                Code::StreamQueryNotFound,
                format!("no stream query with id {query} is registered"),
            )),
            Some(q) if !q.current => Err(Refusal::conflict(
                Code::StreamQueryReplaced,
                format!(
                    "stream query `{}` was registered again (reset) under a new id; \
                     register it again to continue",
                    q.name
                ),
            )),
            Some(q) if !q.reads => Err(Refusal::invalid(
                Code::StreamPartitionNotRead,
                format!(
                    "partition {partition} is not a partition of `{}`, the source queue of \
                     stream query `{}`",
                    q.source_queue, q.name
                ),
            )),
            Some(q) => Ok(q.source_queue),
        }
    }

    /// Every registered query with its partitions and the size of their state.
    pub(crate) async fn list(&self) -> Result<Vec<QueryListed>, Refusal> {
        let client = self.pool.get().await.map_err(DbError::from)?;
        let listed = store::list(&client).await?;
        serde_json::from_value(listed).map_err(|e| Refusal {
            cause: Some(format!("stream queries as listed: {e}")),
            ..Refusal::new(
                crate::refusal::Kind::Internal,
                Code::DatabaseError,
                "the listing could not be read",
            )
        })
    }
}

/// A registered query as the administration lists it.
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = StreamQuery)]
pub(crate) struct QueryListed {
    pub(crate) query_id: Uuid,
    pub(crate) name: String,
    pub(crate) source_queue: String,
    pub(crate) sink_queue: Option<String>,
    pub(crate) config_hash: String,
    /// RFC 3339.
    pub(crate) registered_at: String,
    pub(crate) partitions: Vec<PartitionListed>,
}

/// One partition a query reads, with the size of its state there.
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = StreamQueryPartition)]
pub(crate) struct PartitionListed {
    pub(crate) partition_id: Uuid,
    /// The partition's name; null once its queue was deleted.
    pub(crate) partition: Option<String>,
    pub(crate) state_keys: i64,
    pub(crate) state_bytes: i64,
    pub(crate) state_version: i64,
    /// When the state was last written (RFC 3339).
    pub(crate) updated_at: Option<String>,
    /// Messages of the partition the query has not consumed yet.
    pub(crate) lag: Option<i64>,
}

/// The state of one pair: its keys' values and when each was written.
pub(crate) type StateMaps = (i64, Map<String, Value>, Map<String, Value>);

/// A cycle as the fused transaction runs it: names resolved, pushed messages ready.
pub(crate) struct Fused {
    query_id: Uuid,
    partition_id: Uuid,
    group: String,
    state_ops: Vec<StateOp>,
    messages: Vec<NewMessage>,
    ack: Option<CycleAck>,
    release_lease: bool,
}

/// A cycle waiting for its fused transaction.
pub(crate) struct CycleJob {
    cycle: Fused,
    reply: Reply<Outcome>,
}

/// What became of one fused cycle: committed, or refused with nothing of it kept.
pub(crate) struct Outcome {
    group: String,
    result: Result<Committed, Refusal>,
}

/// What a committed cycle wrote.
pub(crate) struct Committed {
    state_ops_applied: usize,
    stored: Vec<Stored>,
    run: Option<crate::ack::RunSettled>,
}

/// Runs one cycle inside `tx` (a savepoint of the fused transaction): lock the pair, the
/// ack, the new state version, the pushes. A refusal is returned for the caller to roll the
/// savepoint back.
async fn run_cycle(
    tx: &deadpool_postgres::Transaction<'_>,
    backend: crate::backend::Backend,
    cycle: &Fused,
) -> Result<Result<Committed, Refusal>, DbError> {
    store::lock_pair(tx, cycle.partition_id, cycle.query_id).await?;
    let mut run = None;
    if let Some(ack) = &cycle.ack {
        let settled = match settle_run_in(
            tx,
            backend,
            cycle.partition_id,
            &cycle.group,
            ack.count,
            ack.lease_id,
            cycle.release_lease,
        )
        .await?
        {
            Ok(s) => s,
            Err(r) => return Ok(Err(r.refusal("ack: "))),
        };
        if !settled.completed.contains(&ack.transaction_id) {
            return Ok(Err(Refusal::conflict(
                Code::StreamAckMismatch,
                format!(
                    "ack: transactionId `{}` is not among the first {} unsettled messages \
                     of the lease",
                    ack.transaction_id, ack.count
                ),
            )));
        }
        run = Some(settled);
    }
    if !cycle.state_ops.is_empty() {
        let (ver, mut state, mut updated) =
            store::newest_state(tx, cycle.partition_id, cycle.query_id)
                .await?
                .unwrap_or_default();
        let now = store::now_ms();
        for op in &cycle.state_ops {
            match op {
                StateOp::Upsert { key, value } => {
                    updated.insert(key.clone(), Value::from(now));
                    state.insert(key.clone(), value.clone());
                }
                StateOp::Delete { key } => {
                    state.remove(key);
                    updated.remove(key);
                }
            }
        }
        let state = Value::Object(state);
        let bytes = serde_json::to_string(&state).map_or(0, |s| s.len());
        if bytes > STATE_MAX_BYTES {
            return Ok(Err(Refusal::invalid(
                Code::StreamStateTooLarge,
                format!(
                    "the state of this query on this partition would hold {bytes} bytes; \
                     at most {STATE_MAX_BYTES} are kept per partition"
                ),
            )));
        }
        store::insert_state(
            tx,
            cycle.partition_id,
            cycle.query_id,
            ver + 1,
            &state,
            &Value::Object(updated),
            bytes,
        )
        .await?;
    }
    let refs: Vec<&NewMessage> = cycle.messages.iter().collect();
    let stored = if refs.is_empty() {
        Vec::new()
    } else {
        store_in(tx, backend, &refs).await?
    };
    if let Some(i) = stored.iter().position(|s| *s == Stored::PartitionGone) {
        return Ok(Err(crate::push::queue_deleted(&cycle.messages[i].queue)));
    }
    Ok(Ok(Committed {
        state_ops_applied: cycle.state_ops.len(),
        stored,
        run,
    }))
}
