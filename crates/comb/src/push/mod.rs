//! Push: the whole story of storing messages, from names to a committed answer.
//!
//! [`Pusher::push`] checks queue capacity, resolves queue and partition names (creating what
//! a first push creates), hands the messages to the push fuser ([`store`]) and, when a queue
//! was deleted under the push, resolves it again and retries. The HTTP edge only decodes and
//! validates the request and writes the answer; `/transaction` and anything else that pushes
//! uses the same handle.

mod handoff;
mod messages;
mod store;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use deadpool_postgres::Pool;
use uuid::Uuid;

use crate::catalog::Catalog;
use crate::code::Code;
use crate::db::DbError;
use crate::encryption::Keys;
use crate::fusion::Fuser;
use crate::metrics::{Metrics, QueueCounts, Stage};
use crate::queue::{DEFAULT_PARTITION, PartitionName, QueueName};
use crate::refusal::{Kind, Refusal};
use crate::schema::citus::Lane;
use crate::wake::Wake;

pub(crate) use handoff::{HAND_OFF_FUNCTION, HAND_OFF_NAME};
pub(crate) use store::{NewMessage, PushJob, Stored, TransactionId, announce, store_in};
pub(crate) use store::{STORE_FUNCTION, STORE_NAME};

/// One message to push, as the edge decoded and validated it. Names and strings borrow from
/// the request where they can; `payload` is JSON text inside the request's bytes.
pub(crate) struct Item<'a> {
    pub(crate) queue: QueueName<'a>,
    pub(crate) partition: Option<PartitionName<'a>>,
    pub(crate) payload: &'a str,
    pub(crate) transaction_id: Option<Cow<'a, str>>,
    pub(crate) trace_id: Option<Cow<'a, str>>,
}

impl Item<'_> {
    /// The partition the item names, or the default one.
    fn partition(&self) -> &str {
        self.partition
            .as_ref()
            .map_or(DEFAULT_PARTITION, PartitionName::as_str)
    }
}

/// What a push stored: the messages as resolved, and what became of each, in order.
pub(crate) struct Pushed {
    pub(crate) messages: Arc<Vec<NewMessage>>,
    pub(crate) stored: Vec<Stored>,
}

/// The handle every route that pushes goes through.
pub(crate) struct Pusher {
    pool: Pool,
    catalog: Arc<Catalog>,
    fuser: Fuser<PushJob>,
    metrics: Arc<Metrics>,
    /// Seals the payloads of queues with `encryptionEnabled`.
    keys: Arc<Keys>,
    /// On Citus: which shard holds which partition, and a fuser per shard (below).
    per_shard: PerShard,
}

/// On Citus, a fused batch of pushes sent through the coordinator to partitions of different
/// shards would commit in two phases (the coordinator does so for a transaction that wrote
/// several shards, even of one worker), on several nodes when the shards are: N requests of
/// one shard each made into one of many. So there a push whose partitions all sit in one
/// shard goes to that shard's own fuser, started on first use, and its batches commit on
/// that shard's worker alone. On the direct route ([`crate::db::route`]) a push whose
/// partitions all sit on one worker goes to that worker's fuser, whose batches are one
/// transaction of the worker over its shards ([`store::start_on_worker`]): run by the worker
/// itself, with no other node in it, it commits in one phase. A push naming partitions of
/// several shards (coordinator route) or workers (direct route) is such a request by itself;
/// it goes to the shared fuser. On PostgreSQL none of this is used.
struct PerShard {
    placement: Arc<crate::schema::citus::Placement>,
    /// Where a shard's batch goes: its worker on the direct route.
    router: crate::db::route::Router,
    /// A fuser per lane, started on first use.
    fusers: Mutex<HashMap<Lane, Fuser<PushJob>>>,
    wake: Arc<Wake>,
    stage: Arc<Stage>,
    workers: usize,
    max_items: usize,
}

impl Pusher {
    /// Starts the push workers and returns the handle in front of them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        pool: Pool,
        catalog: Arc<Catalog>,
        wake: Arc<Wake>,
        metrics: Arc<Metrics>,
        keys: Arc<Keys>,
        router: crate::db::route::Router,
        workers: usize,
        max_items: usize,
    ) -> Pusher {
        let stage = metrics.fusion.push.clone();
        let backend = catalog.backend();
        let fuser = store::start(
            pool.clone(),
            backend,
            wake.clone(),
            workers,
            max_items,
            stage.clone(),
        );
        Pusher {
            pool,
            catalog,
            fuser,
            metrics,
            keys,
            per_shard: PerShard {
                placement: Default::default(),
                router,
                fusers: Mutex::default(),
                wake,
                stage,
                workers,
                max_items,
            },
        }
    }

    /// Stores `items` and answers only after they are committed. `body` holds the bytes the
    /// items were decoded from: payloads stay slices of it. `producer_sub` is the subject of
    /// the pusher's verified token, stamped on every message.
    pub(crate) async fn push(
        &self,
        items: Vec<Item<'_>>,
        body: &Bytes,
        producer_sub: Option<Arc<str>>,
    ) -> Result<Pushed, Refusal> {
        self.check_capacity(&items).await?;
        let messages = self.resolve(items, body, producer_sub).await?;
        let pushed = self.store(messages).await?;
        self.record(&pushed.messages, &pushed.stored);
        Ok(pushed)
    }

    /// Counts a committed push in this server's metrics, in all and per queue. `stored` holds
    /// what became of each of `messages`, in order.
    pub(crate) fn record(&self, messages: &[NewMessage], stored: &[Stored]) {
        let mut run: Option<(&str, u64)> = None;
        for (m, s) in messages.iter().zip(stored) {
            if !matches!(s, Stored::Queued(_)) {
                continue;
            }
            match &mut run {
                Some((queue, n)) if *queue == &*m.queue => *n += 1,
                _ => {
                    if let Some((queue, n)) = run.replace((&m.queue, 1)) {
                        self.count_pushed(queue, n);
                    }
                }
            }
        }
        if let Some((queue, n)) = run {
            self.count_pushed(queue, n);
        }
        let queued = stored
            .iter()
            .filter(|s| matches!(s, Stored::Queued(_)))
            .count();
        let duplicates = stored
            .iter()
            .filter(|s| matches!(s, Stored::Duplicate(_)))
            .count();
        self.metrics
            .messages
            .stored(queued as u64, duplicates as u64);
    }

    fn count_pushed(&self, queue: &str, pushed: u64) {
        let counts = QueueCounts {
            pushed,
            ..QueueCounts::default()
        };
        self.metrics.queues.add(queue, counts);
    }

    /// Refuses a push that would take a queue with `maxSize` past that many pending messages
    /// (pending: not yet passed by its slowest consumer group). Checked before anything is
    /// created, so a refused push leaves no trace; a queue that does not exist yet has no
    /// limit. The count is taken before the push, so concurrent pushes may overshoot by what
    /// they carry.
    pub(crate) async fn check_capacity(&self, items: &[Item<'_>]) -> Result<(), Refusal> {
        let mut incoming: HashMap<&str, u64> = HashMap::new();
        for item in items {
            *incoming.entry(item.queue.as_str()).or_default() += 1;
        }
        for (queue, n) in incoming {
            let Some(queue_id) = self.catalog.find_queue(&self.pool, queue).await? else {
                continue;
            };
            let max = self.catalog.options(&self.pool, queue_id).await?.max_size;
            if max == 0 {
                continue;
            }
            let pending = messages::pending(&self.pool, self.backend(), queue_id).await?;
            if pending + n > max {
                return Err(Refusal::new(
                    Kind::Full,
                    Code::QueueFull,
                    format!(
                        "queue `{queue}` holds {pending} pending messages; its maxSize is {max}"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Turns queue and partition names into ids, creating what does not exist yet. Each
    /// distinct (queue, partition) of the request is resolved once: a batch usually names a
    /// few partitions many times, and every look-up of the catalog hashes and copies its
    /// names. Payloads stay slices of `body`, the bytes the items were decoded from. Every
    /// message is stamped with `producer_sub` (what the body says plays no part).
    pub(crate) async fn resolve(
        &self,
        items: Vec<Item<'_>>,
        body: &Bytes,
        producer_sub: Option<Arc<str>>,
    ) -> Result<Vec<NewMessage>, Refusal> {
        let mut target_of: HashMap<(&str, &str), usize> = HashMap::new();
        let mut targets: Vec<(&str, &str)> = Vec::new();
        let slots: Vec<usize> = items
            .iter()
            .map(|i| {
                *target_of
                    .entry((i.queue.as_str(), i.partition()))
                    .or_insert_with_key(|&key| {
                        targets.push(key);
                        targets.len() - 1
                    })
            })
            .collect();
        let mut names: Vec<&str> = targets.iter().map(|t| t.0).collect();
        names.sort_unstable();
        names.dedup();
        let queues = self.catalog.ensure_queues(&self.pool, &names).await?;
        let wanted: Vec<(Uuid, &str)> = targets.iter().map(|t| (queues[t.0], t.1)).collect();
        let partitions = self.catalog.ensure_partitions(&self.pool, &wanted).await?;
        let mut queue_names: HashMap<&str, Arc<str>> = HashMap::new();
        let resolved: Vec<(Arc<str>, Uuid, Uuid)> = targets
            .iter()
            .zip(&wanted)
            .map(|(&(queue, partition), &(queue_id, _))| {
                let name = queue_names.entry(queue).or_insert_with(|| Arc::from(queue));
                let partition_id = partitions[&(queue_id, partition.to_string())];
                (name.clone(), queue_id, partition_id)
            })
            .collect();
        let partition_names: Vec<Arc<str>> = targets.iter().map(|t| Arc::from(t.1)).collect();
        // Queues that encrypt (options are cached: one look-up per queue of the request).
        let mut sealing: HashMap<Uuid, bool> = HashMap::new();
        for queue_id in queues.values() {
            let encrypts = self
                .catalog
                .options(&self.pool, *queue_id)
                .await?
                .encryption_enabled;
            if encrypts && !self.keys.can_seal() {
                return Err(Refusal::new(
                    Kind::Unavailable,
                    Code::EncryptionUnavailable,
                    "this queue encrypts its payloads, and this server has no encryption key (COMB_ENCRYPTION_KEY); nothing was stored",
                ));
            }
            sealing.insert(*queue_id, encrypts);
        }
        let mut out = Vec::with_capacity(items.len());
        for (item, slot) in items.into_iter().zip(slots) {
            let (queue, queue_id, partition_id) = &resolved[slot];
            let payload = if sealing[queue_id] {
                Bytes::from(
                    self.keys
                        .seal(item.payload.as_bytes())
                        .expect("checked above"),
                )
            } else {
                slice_of(body, item.payload)
            };
            out.push(NewMessage {
                queue: queue.clone(),
                queue_id: *queue_id,
                partition: partition_names[slot].clone(),
                partition_id: *partition_id,
                client_transaction_id: item.transaction_id.map(Cow::into_owned),
                message_id: Uuid::now_v7(),
                trace_id: item.trace_id.map(Cow::into_owned),
                producer_sub: producer_sub.clone(),
                payload,
            });
        }
        Ok(out)
    }

    /// Stores messages through the push fuser. Messages whose partition vanished meanwhile
    /// (its queue was deleted through any server) are resolved again — which creates the
    /// queue anew, as a first push does — and stored in a second round; nothing is stored
    /// twice.
    async fn store(&self, messages: Vec<NewMessage>) -> Result<Pushed, Refusal> {
        let messages = Arc::new(messages);
        let stored = self.submit(messages.clone()).await?;
        let gone: Vec<usize> = (0..stored.len())
            .filter(|&i| stored[i] == Stored::PartitionGone)
            .collect();
        if gone.is_empty() {
            return Ok(Pushed { messages, stored });
        }
        let mut messages = Arc::try_unwrap(messages).unwrap_or_else(|m| (*m).clone());
        let mut stored = stored;
        for &i in &gone {
            self.catalog.forget_queue(&messages[i].queue);
        }
        let names: Vec<&str> = gone.iter().map(|&i| &*messages[i].queue).collect();
        let queues = self.catalog.ensure_queues(&self.pool, &names).await?;
        let wanted: Vec<(Uuid, &str)> = gone
            .iter()
            .map(|&i| (queues[&*messages[i].queue], &*messages[i].partition))
            .collect();
        let partitions = self.catalog.ensure_partitions(&self.pool, &wanted).await?;
        let retry: Vec<NewMessage> = gone
            .iter()
            .map(|&i| {
                let mut m = messages[i].clone();
                m.queue_id = queues[&*m.queue];
                m.partition_id = partitions[&(m.queue_id, m.partition.to_string())];
                m
            })
            .collect();
        let again = self.submit(Arc::new(retry.clone())).await?;
        for ((&i, m), s) in gone.iter().zip(retry).zip(again) {
            if s == Stored::PartitionGone {
                return Err(queue_deleted(&m.queue));
            }
            messages[i] = m;
            stored[i] = s;
        }
        Ok(Pushed {
            messages: Arc::new(messages),
            stored,
        })
    }

    async fn submit(&self, messages: Arc<Vec<NewMessage>>) -> Result<Vec<Stored>, Refusal> {
        let (fuser, key) = self.fuser_for(&messages).await?;
        fuser.ask(key, |reply| PushJob { messages, reply }).await
    }

    /// The fuser a push goes to: the shared one, or on Citus the one of the worker (direct
    /// route) or the shard holding every partition the push names ([`PerShard`]).
    /// With it, the key that picks the fuser's queue ([`store::shard_key`], or in a worker's
    /// fuser [`store::worker_key`]).
    async fn fuser_for(&self, messages: &[NewMessage]) -> Result<(Fuser<PushJob>, u64), Refusal> {
        let shared = || Ok((self.fuser.clone(), store::shard_key(messages)));
        if !self.catalog.backend().fuses_per_shard() {
            return shared();
        }
        let mut ids: Vec<Uuid> = messages.iter().map(|m| m.partition_id).collect();
        ids.sort_unstable();
        ids.dedup();
        let n = &self.per_shard;
        let lane = n
            .placement
            .lane(&self.pool, &ids, n.router.is_direct())
            .await
            .map_err(DbError::from)?;
        let (lane, pool) = match lane {
            Some(Lane::Worker(node)) => match n.router.worker(&node) {
                Some(w) => (Lane::Worker(node), w.general),
                // No pools for the worker: through the coordinator, a shard at a time.
                None => match n.placement.lane(&self.pool, &ids, false).await {
                    Ok(Some(lane)) => (lane, self.pool.clone()),
                    _ => return shared(),
                },
            },
            Some(lane) => (lane, self.pool.clone()),
            None => return shared(),
        };
        let key = match lane {
            Lane::Worker(_) => {
                let (shards, _) = n.placement.known(&ids);
                store::worker_key(messages, shards.values().copied().min().unwrap_or(0))
            }
            Lane::Shard(_) => store::shard_key(messages),
        };
        let mut fusers = n.fusers.lock().unwrap();
        let fuser = fusers
            .entry(lane.clone())
            .or_insert_with(|| match lane {
                Lane::Worker(_) => store::start_on_worker(
                    pool,
                    self.catalog.backend(),
                    n.wake.clone(),
                    n.placement.clone(),
                    n.workers,
                    n.max_items,
                    n.stage.clone(),
                ),
                Lane::Shard(_) => store::start(
                    pool,
                    self.catalog.backend(),
                    n.wake.clone(),
                    n.workers,
                    n.max_items,
                    n.stage.clone(),
                ),
            })
            .clone();
        Ok((fuser, key))
    }

    /// The storage pushes go to.
    pub(crate) fn backend(&self) -> crate::backend::Backend {
        self.catalog.backend()
    }

    /// Forgets a queue found deleted under a push, so its next push resolves it anew.
    pub(crate) fn forget_queue(&self, name: &str) {
        self.catalog.forget_queue(name);
    }
}

/// The refusal of a push whose queue was deleted and recreated under it twice.
pub(crate) fn queue_deleted(queue: &str) -> Refusal {
    Refusal::conflict(
        Code::QueueDeleted,
        format!("queue `{queue}` is being deleted and recreated; retry the push"),
    )
}

/// `text` as a slice of `body` when it lies inside it (no copy), else a copy of it.
fn slice_of(body: &Bytes, text: &str) -> Bytes {
    let range = body.as_ptr_range();
    let inside = range.start <= text.as_ptr() && text.as_bytes().as_ptr_range().end <= range.end;
    if inside {
        body.slice_ref(text.as_bytes())
    } else {
        Bytes::copy_from_slice(text.as_bytes())
    }
}
