//! Pop: the whole story of handing messages to a consumer.
//!
//! [`Popper::pop`] finds the queue (and partition), subscribes the group on first sight,
//! claims through the pop fuser's lane of its (queue, group) ([`claim`]) and, when asked to
//! wait, waits for a push to the queue — holding no database connection — and claims again.
//! The HTTP edge only parses the options and writes the answer.

mod by_worker;
mod claim;
mod unreadable;
mod waiting;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::watch;
use tokio::time::Instant;
use uuid::Uuid;

use crate::catalog::{Catalog, StartFrom};
use crate::code::Code;
use crate::fusion::Fuser;
use crate::metrics::{Metrics, QueueCounts};
use crate::queue::{GroupName, PartitionName, QueueName};
use crate::refusal::{Kind, Refusal};
use crate::wake::{Ready, Wake, WalkDue};

/// The claim's statements, public for the test suite's plan checks.
pub use claim::{
    CANDIDATES_CITUS_SQL, CANDIDATES_SQL, CLAIM_CITUS_CALL, CLAIM_SQL, SHARED_CLAIM_SQL,
    begin_claim,
};
pub(crate) use claim::{CLAIM_CITUS_FUNCTION, CLAIM_CITUS_SIGNATURE, Claim, PopJob, PopShape};
use waiting::WaitingPops;

/// A pop as the edge validated it.
pub(crate) struct Request {
    pub(crate) queue: QueueName<'static>,
    /// Only this partition, when the consumer named one.
    pub(crate) partition: Option<PartitionName<'static>>,
    pub(crate) group: GroupName<'static>,
    /// Most messages: per partition, or over all of them when `partitions` > 1.
    pub(crate) batch: i32,
    /// Most partitions one pop may lease (all under one lease).
    pub(crate) partitions: usize,
    /// Wait for messages until `timeout` when none are there.
    pub(crate) wait: bool,
    pub(crate) timeout: Duration,
    pub(crate) auto_ack: bool,
    /// Where a group seen for the first time starts.
    pub(crate) start: StartFrom,
}

/// How pops wait: settings of the server they run in.
pub(crate) struct Waits {
    /// Most pops waiting at once on this server.
    pub(crate) max_waiting: usize,
    /// A waiting pop looks again this often even when no push woke it.
    pub(crate) poll_fallback: Duration,
    /// Turns true when the server begins to stop: waiting pops answer at once.
    pub(crate) stopping: watch::Receiver<bool>,
    /// Whether waiting pops offer themselves to pushes (`--handoff`).
    pub(crate) handoff: bool,
}

/// The handle every route that pops goes through.
pub(crate) struct Popper {
    /// The general pool, for the catalog's lookups; claims run on the consumer pool.
    pool: Pool,
    catalog: Arc<Catalog>,
    wake: Arc<Wake>,
    fuser: Fuser<PopJob>,
    metrics: Arc<Metrics>,
    waiting: WaitingPops,
    poll_fallback: Duration,
    stopping: watch::Receiver<bool>,
    /// Opens payloads a push hands over (sealed in queues that encrypt).
    keys: Arc<crate::encryption::Keys>,
    /// A lease's length in queues that set no `leaseTime`.
    default_lease_seconds: f64,
    /// Whether waiting pops offer themselves to pushes (`--handoff`).
    handoff: bool,
}

impl Popper {
    /// Pops waiting for messages on this server now (long polls), and the most that may
    /// (`--max-waiting-pops`): what operators watch and tests wait for.
    pub(crate) fn waiting(&self) -> (usize, usize) {
        self.waiting.count()
    }

    /// Starts the pop workers and returns the handle in front of them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        pools: &crate::db::Pools,
        database_url: &str,
        catalog: Arc<Catalog>,
        wake: Arc<Wake>,
        metrics: Arc<Metrics>,
        keys: Arc<crate::encryption::Keys>,
        router: crate::db::route::Router,
        workers: usize,
        default_lease_seconds: f64,
        waits: Waits,
    ) -> Popper {
        let stage = metrics.fusion.pop.clone();
        let to_workers = if catalog.backend().rows_lock_in_one_shard_only() {
            crate::db::Connector::new(database_url).ok().map(Arc::new)
        } else {
            None
        };
        let fuser = claim::start(
            pools.consumer.clone(),
            catalog.backend(),
            router,
            to_workers,
            workers,
            default_lease_seconds,
            metrics.clone(),
            keys.clone(),
            stage,
        );
        Popper {
            pool: pools.general.clone(),
            catalog,
            wake,
            fuser,
            metrics,
            waiting: WaitingPops::new(waits.max_waiting),
            poll_fallback: waits.poll_fallback,
            stopping: waits.stopping,
            keys,
            default_lease_seconds,
            handoff: waits.handoff,
        }
    }

    /// Claims messages; when asked to wait, waits for a push to this queue and claims again.
    /// `None`: nothing to hand out before the wait ended (or the server began to stop).
    pub(crate) async fn pop(&self, req: &Request) -> Result<Option<Vec<Claim>>, Refusal> {
        if req.wait && req.partition.is_none() {
            return self.pop_waiting(req).await;
        }
        let deadline = Instant::now()
            + if req.wait {
                req.timeout
            } else {
                Duration::ZERO
            };
        let mut stop = self.stopping.clone();
        let mut slot = None;
        loop {
            // Listen before looking, so a push that commits after the look still wakes us.
            let mut woken = self.wake.listen(&req.queue);
            if let Some(claims) = self.attempt(req, None).await? {
                return Ok(Some(claims));
            }
            let Some(until) = self.wait_until(deadline, &stop, &mut slot)? else {
                return Ok(None);
            };
            tokio::select! {
                _ = woken.changed() => {}
                _ = tokio::time::sleep_until(until) => {}
                _ = stop.changed() => {}
            }
        }
    }

    /// A long poll of a group over the whole queue. Pushes on this server name the partitions
    /// they filled and wake one waiting pop per partition, which claims those alone; the
    /// group's cursors are walked only when something the hints do not name may have changed
    /// (a push through another server, a new group, notifications missed) and on the
    /// fallback timer, which also finds leases that ended unsettled. A pop that found
    /// nothing therefore costs nothing until a push, and a push wakes one pop, not all.
    async fn pop_waiting(&self, req: &Request) -> Result<Option<Vec<Claim>>, Refusal> {
        let deadline = Instant::now() + req.timeout;
        let ready = self.wake.ready(&req.queue, &req.group);
        let mut stop = self.stopping.clone();
        let mut slot = None;
        let mut walk = false;
        loop {
            // Enabled before looking, so a hint given after the look still wakes this pop.
            let woken = ready.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // The walk comes first when due, so that partitions no hint names (ended leases,
            // other servers' pushes) never wait behind a stream of hinted ones.
            let due = ready.walk_due_or_timer(self.poll_fallback, walk);
            if let Some(due) = due {
                let mark = ready.mark();
                match self.attempt(req, None).await? {
                    Some(claims) => {
                        if due == WalkDue::Aged {
                            let claimed: Vec<Uuid> =
                                claims.iter().map(|c| c.partition_id).collect();
                            ready.walked_hinted(mark, &claimed);
                        }
                        note_claims(&ready, req, &claims, None);
                        // More may be waiting: let another pop look.
                        ready.pass_on();
                        return Ok(Some(claims));
                    }
                    None => ready.walked_empty(mark),
                }
            }
            while let Some(partition) = ready.take_one() {
                // Marked first: a lease on it that ends while this claim runs hints it again.
                let mark = ready.may_be_blocked(partition);
                if let Some(claims) = self.attempt(req, Some(partition)).await? {
                    note_claims(&ready, req, &claims, Some(mark));
                    if ready.has_hints() {
                        ready.pass_on();
                    }
                    return Ok(Some(claims));
                }
            }
            // While it waits, the pop offers itself to this server's pushes: one may lease it
            // messages in its own transaction and hand them over ([`crate::wake::Wake::offer`]).
            // Made before it counts as waiting, so that a pop seen waiting is on offer.
            let mut offer = self.offer(req);
            let Some(until) = self.wait_until(deadline, &stop, &mut slot)? else {
                return Ok(None);
            };
            let waited = {
                let handed = async {
                    match &mut offer {
                        Some(o) => o.handed().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    h = handed => Waited::Handed(h),
                    _ = &mut woken => Waited::Woken,
                    _ = tokio::time::sleep_until(until) => Waited::Timer,
                    _ = stop.changed() => Waited::Woken,
                }
            };
            walk = match waited {
                Waited::Handed(Some(h)) => {
                    if ready.has_hints() {
                        ready.pass_on();
                    }
                    return Ok(Some(self.handed(req, h)));
                }
                Waited::Handed(None) => false,
                Waited::Woken => false,
                Waited::Timer => true,
            };
            // A push that reserved the offer meanwhile is waited for: what it leased is this
            // pop's.
            if let Some(o) = offer
                && let Some(h) = o.withdraw().await
            {
                // The hint that woke this pop is another's to take.
                ready.pass_on();
                return Ok(Some(self.handed(req, h)));
            }
        }
    }

    /// The offer a waiting pop makes to this server's pushes, if it is one a hand-off can
    /// serve: a pop of one partition under a lease of its own (auto-ack and multi-partition
    /// pops claim for themselves), not on Citus.
    fn offer(&self, req: &Request) -> Option<crate::wake::Offer<'_>> {
        if !self.handoff
            || req.auto_ack
            || req.partitions != 1
            || !self.catalog.backend().hands_off_in_push()
        {
            return None;
        }
        let wants = crate::wake::Wants {
            batch: req.batch,
            default_lease_secs: self.default_lease_seconds,
        };
        Some(self.wake.offer(&req.queue, &req.group, wants))
    }

    /// The answer of a pop a push handed messages to: the claim's shape, payloads opened. A
    /// payload that does not open (never expected: this server stored it) is left out; its
    /// lease expires and a claim then dead-letters it as unreadable.
    fn handed(&self, req: &Request, h: crate::wake::HandedOff) -> Vec<Claim> {
        let messages: Vec<claim::Delivered> = h
            .messages
            .into_iter()
            .filter_map(|m| {
                let data = self.keys.open_json(&m.payload).ok()?;
                Some(claim::Delivered {
                    pos: m.pos,
                    message_id: m.message_id,
                    transaction_id: m.transaction_id,
                    trace_id: m.trace_id,
                    producer_sub: m.producer_sub,
                    data,
                    created_at: m.created_at,
                    attempt: 1,
                })
            })
            .collect();
        let n = messages.len() as u64;
        self.metrics.messages.delivered(n);
        let counts = QueueCounts {
            popped: n,
            ..QueueCounts::default()
        };
        self.metrics.queues.add(&req.queue, counts);
        vec![Claim {
            partition_id: h.partition_id,
            partition: h.partition.to_string(),
            lease_id: Some(h.lease_id),
            messages,
        }]
    }

    /// After a look that found nothing: `None` when the pop ends now (its time is up, or the
    /// server stops), else until when it waits before looking again, holding a waiting place.
    fn wait_until<'a>(
        &'a self,
        deadline: Instant,
        stop: &watch::Receiver<bool>,
        slot: &mut Option<waiting::WaitSlot<'a>>,
    ) -> Result<Option<Instant>, Refusal> {
        let now = Instant::now();
        if now >= deadline || *stop.borrow() {
            return Ok(None);
        }
        if slot.is_none() {
            *slot = Some(self.wait_slot()?);
        }
        Ok(Some(deadline.min(now + self.poll_fallback)))
    }

    fn wait_slot(&self) -> Result<waiting::WaitSlot<'_>, Refusal> {
        self.waiting.enter().ok_or_else(|| {
            Refusal::new(
                Kind::Full,
                Code::WaitingPopsExhausted,
                "the server holds its maximum number of waiting pops; retry shortly or pop without wait",
            )
        })
    }

    /// One look: the claims made, or `None` when there was nothing to claim. `hinted`: look
    /// at this partition only (a push or an ended lease named it).
    async fn attempt(
        &self,
        req: &Request,
        hinted: Option<Uuid>,
    ) -> Result<Option<Vec<Claim>>, Refusal> {
        let Some(queue_id) = self.catalog.find_queue(&self.pool, &req.queue).await? else {
            if req.partition.is_some() {
                return Err(Refusal::not_found(
                    Code::QueueNotFound,
                    format!("queue `{}` does not exist", req.queue),
                ));
            }
            return Ok(None);
        };
        let partition_id = match &req.partition {
            Some(name) => match self
                .catalog
                .find_partition(&self.pool, queue_id, name)
                .await?
            {
                Some(id) => Some(id),
                None => return Ok(None),
            },
            None => hinted,
        };
        self.catalog
            .ensure_subscription(&self.pool, queue_id, &req.group, req.start)
            .await?;
        let options = self.catalog.options(&self.pool, queue_id).await?;
        // Payloads of a queue that seals them are opened before the claim commits.
        let sealed = options.encryption_enabled;
        let claims_ahead = options.window_buffer == 0 && options.delayed_processing == 0;
        let shape = PopShape {
            queue_id,
            queue: req.queue.to_string(),
            group: req.group.to_string(),
            partition_id,
            batch: req.batch,
            auto_ack: req.auto_ack,
            shared_lease: req.partitions > 1,
            sealed,
            claims_ahead,
        };
        let partitions = req.partitions;
        let lane = shape.lane();
        let claims = self
            .fuser
            .ask(lane, |reply| PopJob {
                shape,
                partitions,
                reply,
            })
            .await?;
        if claims.is_empty() {
            return Ok(None);
        }
        let n: usize = claims.iter().map(|c| c.messages.len()).sum();
        self.metrics.messages.delivered(n as u64);
        let counts = QueueCounts {
            popped: n as u64,
            ..QueueCounts::default()
        };
        self.metrics.queues.add(&req.queue, counts);
        Ok(Some(claims))
    }
}

/// How a waiting pop's wait ended.
enum Waited {
    /// A push handed it messages (`Some`), or reserved it and leased nothing (`None`).
    Handed(Option<crate::wake::HandedOff>),
    /// A hint, a change, or the server stopping.
    Woken,
    /// Its fallback timer.
    Timer,
}

/// What a claim tells the group's hints: a partition that handed out a full batch may hold
/// more (behind its new lease, or at once without one); one that handed out less through a
/// hinted claim (`mark`) held nothing more when it was read.
fn note_claims(ready: &Ready, req: &Request, claims: &[Claim], mark: Option<u64>) {
    for c in claims {
        // With several partitions the batch caps them all: any of them may hold more.
        let full = req.partitions > 1
            || c.messages.len() >= usize::try_from(req.batch).unwrap_or(usize::MAX);
        match (full, c.lease_id, mark) {
            (true, Some(_), _) => {
                ready.may_be_blocked(c.partition_id);
            }
            (true, None, _) => ready.again(c.partition_id),
            (false, _, Some(mark)) => ready.unblocked(c.partition_id, mark),
            (false, _, None) => {}
        }
    }
}
