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
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
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
        let only = (!q.keys.is_empty()).then_some(q.keys.as_slice());
        let mut rows: Vec<StateRow> = store::keys_now(&client, q.partition_id, q.query_id, only)
            .await?
            .into_iter()
            .filter(|k| q.key_prefix.as_deref().is_none_or(|p| k.key.starts_with(p)))
            .filter(|k| {
                q.ripe_at_or_before.is_none_or(|ripe| {
                    k.value
                        .get("windowEnd")
                        .and_then(Value::as_f64)
                        .is_some_and(|end| end <= ripe as f64)
                })
            })
            .map(|k| StateRow {
                updated_ms: Some(k.written_at.timestamp_millis()),
                key: k.key,
                value: k.value,
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
        let listed = store::list(&client, self.pusher.backend()).await?;
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
    // A cycle without an ack (the SDK's idle flush) is computed from state read outside any
    // lease: while the group holds a lease on the partition, the holder has read the state
    // and its cycle must find it as it read it.
    if cycle.ack.is_none()
        && !cycle.state_ops.is_empty()
        && crate::ack::lease_live_in(tx, backend, cycle.partition_id, &cycle.group).await?
    {
        return Ok(Err(Refusal::conflict(
            Code::StreamPartitionLeased,
            format!(
                "group `{}` holds a lease on partition {}: a cycle without an ack may \
                 change its state only between leases",
                cycle.group, cycle.partition_id
            ),
        )));
    }
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
        let keys = changed_keys(&cycle.state_ops);
        let found: HashMap<String, i64> =
            store::keys_now(tx, cycle.partition_id, cycle.query_id, Some(&keys))
                .await?
                .into_iter()
                .map(|k| (k.key, k.bytes))
                .collect();
        if cycle.ack.is_none() {
            match replayed(&cycle.state_ops, |k| found.contains_key(k)) {
                Replay::Fresh => {}
                Replay::Applied => {
                    return Ok(Ok(Committed {
                        state_ops_applied: 0,
                        stored: Vec::new(),
                        run: None,
                    }));
                }
                Replay::Stale(key) => {
                    return Ok(Err(Refusal::conflict(
                        Code::StreamStateStale,
                        format!(
                            "state_ops delete `{key}`, which another cycle deleted already: \
                             this cycle was computed from older state"
                        ),
                    )));
                }
            }
        }
        let before = store::pair(tx, cycle.partition_id, cycle.query_id)
            .await?
            .unwrap_or_default();
        let merged = merge(&cycle.state_ops, &found, before);
        if merged.bytes > STATE_MAX_BYTES as i64 {
            return Ok(Err(Refusal::invalid(
                Code::StreamStateTooLarge,
                format!(
                    "the state of this query on this partition would hold {} bytes; \
                     at most {STATE_MAX_BYTES} are kept per partition",
                    merged.bytes
                ),
            )));
        }
        store::insert_version(tx, cycle.partition_id, cycle.query_id, &merged).await?;
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

/// What a cycle without an ack is, judged by the keys it deletes (such a cycle emits what it
/// deletes: the SDK's flush of ripe windows).
#[derive(Debug, PartialEq)]
pub(crate) enum Replay<'a> {
    /// Every key it deletes is there (or it deletes none): apply it.
    Fresh,
    /// It deletes keys and none is there any more: it was applied already (an answer lost and
    /// the request sent again) or another cycle emitted them. Applying nothing is exact.
    Applied,
    /// Some of its keys are there and some are gone: computed from state older than the
    /// current one; refused whole.
    Stale(&'a str),
}

/// Judges a cycle without an ack against the current keys (`there`: whether a key is).
pub(crate) fn replayed<'a>(ops: &'a [StateOp], there: impl Fn(&str) -> bool) -> Replay<'a> {
    let deleted: Vec<&str> = ops
        .iter()
        .filter_map(|op| match op {
            StateOp::Delete { key } => Some(key.as_str()),
            StateOp::Upsert { .. } => None,
        })
        .collect();
    match deleted.iter().find(|k| !there(k)) {
        None => Replay::Fresh,
        Some(_) if deleted.iter().all(|k| !there(k)) => Replay::Applied,
        Some(gone) => Replay::Stale(gone),
    }
}

impl StateOp {
    fn key(&self) -> &str {
        match self {
            StateOp::Upsert { key, .. } | StateOp::Delete { key } => key,
        }
    }
}

/// The distinct keys a cycle changes, sorted.
pub(crate) fn changed_keys(ops: &[StateOp]) -> Vec<String> {
    let keys: BTreeMap<&str, ()> = ops.iter().map(|op| (op.key(), ())).collect();
    keys.into_keys().map(str::to_string).collect()
}

/// The bytes a key and its value count toward a pair's state (its share of the state as one
/// JSON object).
pub(crate) fn entry_bytes(key: &str, value: &Value) -> i64 {
    let text = |v: &Value| serde_json::to_string(v).map_or(0, |s| s.len());
    (text(&Value::from(key)) + text(value) + 2) as i64
}

/// One key a version changes: its new value (`None`: deleted) and bytes.
pub(crate) struct Change<'a> {
    pub(crate) key: String,
    pub(crate) value: Option<&'a Value>,
    pub(crate) bytes: i64,
}

/// A pair's next version: the keys it changes and the state's size after it.
pub(crate) struct Merged<'a> {
    pub(crate) ver: i64,
    pub(crate) changes: Vec<Change<'a>>,
    pub(crate) keys: i64,
    pub(crate) bytes: i64,
}

/// Applies a cycle's ops, in order, to the keys they change: `found` has the bytes of those
/// keys there are now, `before` the pair's (version, keys, bytes). Each key changed once in
/// the new version, as its last op leaves it; a delete of a key that is not there changes
/// nothing.
pub(crate) fn merge<'a>(
    ops: &'a [StateOp],
    found: &HashMap<String, i64>,
    before: (i64, i64, i64),
) -> Merged<'a> {
    let mut last: BTreeMap<&str, Option<&'a Value>> = BTreeMap::new();
    for op in ops {
        match op {
            StateOp::Upsert { key, value } => last.insert(key, Some(value)),
            StateOp::Delete { key } => last.insert(key, None),
        };
    }
    let (ver, mut keys, mut bytes) = before;
    let mut changes = Vec::with_capacity(last.len());
    for (key, value) in last {
        let was = found.get(key).copied();
        if value.is_none() && was.is_none() {
            continue;
        }
        let now = value.map_or(0, |v| entry_bytes(key, v));
        keys += i64::from(value.is_some()) - i64::from(was.is_some());
        bytes += now - was.unwrap_or(0);
        changes.push(Change {
            key: key.to_string(),
            value,
            bytes: now,
        });
    }
    Merged {
        ver: ver + 1,
        changes,
        keys,
        bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn up(key: &str, v: Value) -> StateOp {
        StateOp::Upsert {
            key: key.into(),
            value: v,
        }
    }

    fn del(key: &str) -> StateOp {
        StateOp::Delete { key: key.into() }
    }

    #[test]
    fn a_version_changes_each_key_once_as_its_last_op_leaves_it() {
        let ops = vec![
            up("a", json!(1)),
            del("a"),
            up("b", json!(2)),
            up("b", json!(3)),
        ];
        let found = HashMap::from([("a".to_string(), entry_bytes("a", &json!(0)))]);
        let m = merge(&ops, &found, (4, 1, entry_bytes("a", &json!(0))));
        assert_eq!(m.ver, 5);
        let changes: Vec<(&str, Option<&Value>)> = m
            .changes
            .iter()
            .map(|c| (c.key.as_str(), c.value))
            .collect();
        assert_eq!(changes, vec![("a", None), ("b", Some(&json!(3)))]);
        assert_eq!((m.keys, m.bytes), (1, entry_bytes("b", &json!(3))));
    }

    #[test]
    fn a_delete_of_a_key_not_there_writes_nothing() {
        let ops = vec![del("x")];
        let m = merge(&ops, &HashMap::new(), (0, 0, 0));
        assert!(m.changes.is_empty());
        assert_eq!((m.keys, m.bytes), (0, 0));
    }

    #[test]
    fn entry_bytes_are_the_keys_share_of_the_state_as_one_object() {
        let state = json!({"k\u{1f}1": {"acc": 3}, "other": null});
        let whole = serde_json::to_string(&state).unwrap().len() as i64;
        let shares: i64 = state
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| entry_bytes(k, v))
            .sum();
        // `{`, `}` and one comma fewer than entries: the shares bound the text from above.
        assert_eq!(shares, whole - 2 + 1);
    }

    #[test]
    fn a_flush_is_fresh_applied_or_stale_by_the_keys_it_deletes() {
        let ops = vec![del("a"), del("b"), up("c", json!(1))];
        assert_eq!(replayed(&ops, |_| true), Replay::Fresh);
        assert_eq!(replayed(&ops, |_| false), Replay::Applied);
        assert_eq!(replayed(&ops, |k| k == "a"), Replay::Stale("b"));
        assert_eq!(replayed(&[up("c", json!(1))], |_| false), Replay::Fresh);
    }

    /// The server's side of a partition's cycles, as `run_cycle` judges them, over an
    /// insert-only store of key versions: the lease a cycle's ack needs, no state change
    /// without an ack while a lease is held, a flush judged by the keys it deletes, and
    /// `merge`'s versions appended, never updated.
    #[derive(Default)]
    struct Server {
        /// (key, pair version, value; `None`: deleted), in the order written.
        versions: Vec<(String, i64, Option<Value>)>,
        pair: (i64, i64, i64),
        /// The runner and number of the live lease.
        lease: Option<(usize, u64)>,
        leases: u64,
        /// Events settled.
        cursor: usize,
    }

    impl Server {
        fn now(&self) -> HashMap<String, Value> {
            let mut now = HashMap::new();
            for (k, _, v) in &self.versions {
                match v {
                    Some(v) => now.insert(k.clone(), v.clone()),
                    None => now.remove(k),
                };
            }
            now
        }

        /// Applies a cycle; `Ok(true)`: committed, its emissions stand.
        fn cycle(
            &mut self,
            ops: &[StateOp],
            ack: Option<(usize, u64, usize)>,
        ) -> Result<bool, Code> {
            match ack {
                Some((r, l, _)) if self.lease != Some((r, l)) => return Err(Code::LeaseInvalid),
                None if self.lease.is_some() && !ops.is_empty() => {
                    return Err(Code::StreamPartitionLeased);
                }
                _ => {}
            }
            let now = self.now();
            let found: HashMap<String, i64> = changed_keys(ops)
                .into_iter()
                .filter_map(|k| now.get(&k).map(|v| (k.clone(), entry_bytes(&k, v))))
                .collect();
            if ack.is_none() {
                match replayed(ops, |k| found.contains_key(k)) {
                    Replay::Fresh => {}
                    Replay::Applied => return Ok(false),
                    Replay::Stale(_) => return Err(Code::StreamStateStale),
                }
            }
            let m = merge(ops, &found, self.pair);
            for c in &m.changes {
                self.versions.push((c.key.clone(), m.ver, c.value.cloned()));
            }
            self.pair = (m.ver, m.keys, m.bytes);
            let now = self.now();
            assert_eq!(m.keys, now.len() as i64, "keys counted");
            let bytes: i64 = now.iter().map(|(k, v)| entry_bytes(k, v)).sum();
            assert_eq!(m.bytes, bytes, "bytes counted");
            if let Some((_, _, n)) = ack {
                self.cursor += n;
                self.lease = None;
            }
            Ok(true)
        }
    }

    /// Events per window; events are numbered in the partition's order.
    const PER_WINDOW: usize = 3;
    const EVENTS: usize = 12;

    fn window(event: usize) -> usize {
        event / PER_WINDOW
    }

    /// A runner as Queen's SDK runs: the state it read and the events it holds.
    #[derive(Default, Clone)]
    struct Runner {
        read: HashMap<String, Value>,
        batch: Vec<usize>,
        lease: u64,
        /// What its flush timer read: the windows whose events were all settled then.
        ripe: HashMap<String, Value>,
    }

    #[derive(Debug, Clone)]
    enum Step {
        /// Runner claims the next events and reads the state.
        Pop(usize),
        /// Runner sends its cycle (windows counted from what it read; windows before its last
        /// event's emitted and deleted), twice when the first answer is lost.
        Commit(usize, bool),
        /// The lease ends (its runner killed or too slow).
        Expire,
        /// Runner's flush timer reads the windows whose events are all settled…
        FlushRead(usize),
        /// …and, any time later, emits and deletes them; twice when the first answer is lost.
        FlushCommit(usize, bool),
        /// A flush by the wall clock, read and sent at once: a window is ripe once its end
        /// has passed, which its last event (late) may not have reached yet.
        FlushNow(bool),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0..2usize).prop_map(Step::Pop),
            (0..2usize, any::<bool>()).prop_map(|(r, t)| Step::Commit(r, t)),
            Just(Step::Expire),
            (0..2usize).prop_map(Step::FlushRead),
            (0..2usize, any::<bool>()).prop_map(|(r, t)| Step::FlushCommit(r, t)),
            any::<bool>().prop_map(Step::FlushNow),
        ]
    }

    fn key(w: usize) -> String {
        format!("w{w}")
    }

    fn count(v: Option<&Value>) -> i64 {
        v.and_then(Value::as_i64).unwrap_or(0)
    }

    /// Sends a runner's cycle; the emissions of every committed send are counted.
    fn commit(s: &mut Server, r: usize, runner: &mut Runner, twice: bool, emitted: &mut [i64]) {
        let batch = std::mem::take(&mut runner.batch);
        let Some(&last) = batch.last() else { return };
        let mut acc = runner.read.clone();
        for &e in &batch {
            let c = count(acc.get(&key(window(e)))) + 1;
            acc.insert(key(window(e)), json!(c));
        }
        let mut ops = Vec::new();
        let mut emits = Vec::new();
        for (k, v) in &acc {
            let w: usize = k[1..].parse().unwrap();
            if w < window(last) {
                ops.push(del(k));
                emits.push((w, count(Some(v))));
            } else if batch.iter().any(|&e| window(e) == w) {
                ops.push(up(k, v.clone()));
            }
        }
        for _ in 0..(1 + usize::from(twice)) {
            if let Ok(true) = s.cycle(&ops, Some((r, runner.lease, batch.len()))) {
                for &(w, c) in &emits {
                    emitted[w] += c;
                }
            }
        }
    }

    /// The windows whose events are all settled, as they are now.
    fn ripe(s: &Server) -> HashMap<String, Value> {
        ripe_before(s, s.cursor / PER_WINDOW)
    }

    /// The windows before `settled_windows`, as they are now.
    fn ripe_before(s: &Server, settled_windows: usize) -> HashMap<String, Value> {
        s.now()
            .into_iter()
            .filter(|(k, _)| k[1..].parse::<usize>().unwrap() < settled_windows)
            .collect()
    }

    fn flush(s: &mut Server, ripe: &HashMap<String, Value>, twice: bool, emitted: &mut [i64]) {
        let ops: Vec<StateOp> = ripe.keys().map(|k| del(k)).collect();
        if ops.is_empty() {
            return;
        }
        for _ in 0..(1 + usize::from(twice)) {
            if let Ok(true) = s.cycle(&ops, None) {
                for (k, v) in ripe {
                    emitted[k[1..].parse::<usize>().unwrap()] += count(Some(v));
                }
            }
        }
    }

    proptest! {
        /// Two runners competing for one partition, with lost answers, leases that end under
        /// a runner (killed mid-cycle: it never sends, or sends late), and flushes committed
        /// any time after their read: every event is counted in its window exactly once over
        /// all emissions, and nothing is left in the state.
        #[test]
        fn every_event_counts_once_in_its_window(steps in proptest::collection::vec(step(), 0..40)) {
            let mut s = Server::default();
            let mut runners = [Runner::default(), Runner::default()];
            let mut emitted = vec![0_i64; EVENTS / PER_WINDOW];
            for st in steps {
                match st {
                    Step::Pop(r) => {
                        if s.lease.is_none() && s.cursor < EVENTS {
                            s.leases += 1;
                            s.lease = Some((r, s.leases));
                            runners[r] = Runner {
                                read: s.now(),
                                batch: (s.cursor..(s.cursor + 2).min(EVENTS)).collect(),
                                lease: s.leases,
                                ripe: std::mem::take(&mut runners[r].ripe),
                            };
                        }
                    }
                    Step::Commit(r, twice) => commit(&mut s, r, &mut runners[r], twice, &mut emitted),
                    Step::Expire => s.lease = None,
                    Step::FlushRead(r) => runners[r].ripe = ripe(&s),
                    Step::FlushNow(twice) => {
                        let read = ripe_before(&s, window(s.cursor + 1));
                        flush(&mut s, &read, twice, &mut emitted);
                    }
                    Step::FlushCommit(r, twice) => {
                        let read = std::mem::take(&mut runners[r].ripe);
                        flush(&mut s, &read, twice, &mut emitted);
                    }
                }
            }
            // Drain: whatever is left, by one runner, then a last flush.
            s.lease = None;
            while s.cursor < EVENTS {
                s.leases += 1;
                s.lease = Some((0, s.leases));
                runners[0] = Runner {
                    read: s.now(),
                    batch: (s.cursor..(s.cursor + 2).min(EVENTS)).collect(),
                    lease: s.leases,
                    ..Runner::default()
                };
                commit(&mut s, 0, &mut runners[0], false, &mut emitted);
            }
            s.cursor = EVENTS + PER_WINDOW;
            let last = ripe(&s);
            flush(&mut s, &last, false, &mut emitted);
            prop_assert!(s.now().is_empty(), "{:?}", s.now());
            prop_assert_eq!(emitted, vec![PER_WINDOW as i64; EVENTS / PER_WINDOW]);
        }

        /// Key versions against a plain map: upserts and deletes in order, applied once;
        /// the size kept is the size of what is there.
        #[test]
        fn versions_are_the_plain_map(cycles in proptest::collection::vec(
            proptest::collection::vec((0..6u8, proptest::option::of(0..100i64)), 1..6), 1..20)) {
            let mut s = Server::default();
            let mut model: HashMap<String, Value> = HashMap::new();
            for ops in cycles {
                let ops: Vec<StateOp> = ops
                    .into_iter()
                    .map(|(k, v)| match v {
                        Some(v) => up(&format!("k{k}"), json!(v)),
                        None => del(&format!("k{k}")),
                    })
                    .collect();
                for op in &ops {
                    match op {
                        StateOp::Upsert { key, value } => model.insert(key.clone(), value.clone()),
                        StateOp::Delete { key } => model.remove(key),
                    };
                }
                s.lease = Some((0, 1));
                prop_assert_eq!(s.cycle(&ops, Some((0, 1, 0))), Ok(true));
                prop_assert_eq!(&s.now(), &model);
            }
        }
    }
}
