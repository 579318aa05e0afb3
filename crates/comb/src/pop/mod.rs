//! Pop: the whole story of handing messages to a consumer.
//!
//! [`Popper::pop`] finds the queue (and partition), subscribes the group on first sight,
//! claims through the pop fuser's lane of its (queue, group) ([`claim`]) and, when asked to
//! wait, waits for a push to the queue — holding no database connection — and claims again.
//! The HTTP edge only parses the options and writes the answer.

mod claim;
mod waiting;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::catalog::{Catalog, StartFrom};
use crate::fusion::Fuser;
use crate::metrics::Metrics;
use crate::refusal::{Kind, Refusal};
use crate::wake::Wake;

/// The claim's statements, public for the test suite's plan checks.
pub use claim::{CANDIDATES_SQL, CLAIM_SQL, SHARED_CLAIM_SQL, begin_claim};
pub(crate) use claim::{Claim, PopJob, PopShape};
use waiting::WaitingPops;

/// A pop as the edge validated it.
pub(crate) struct Request {
    pub(crate) queue: String,
    /// Only this partition, when the consumer named one.
    pub(crate) partition: Option<String>,
    pub(crate) group: String,
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
}

/// The handle every route that pops goes through.
pub(crate) struct Popper {
    pool: Pool,
    catalog: Arc<Catalog>,
    wake: Arc<Wake>,
    fuser: Fuser<PopJob>,
    metrics: Arc<Metrics>,
    waiting: WaitingPops,
    poll_fallback: Duration,
    stopping: watch::Receiver<bool>,
}

impl Popper {
    /// Starts the pop workers and returns the handle in front of them.
    pub(crate) fn start(
        pool: Pool,
        catalog: Arc<Catalog>,
        wake: Arc<Wake>,
        metrics: Arc<Metrics>,
        workers: usize,
        default_lease_seconds: f64,
        waits: Waits,
    ) -> Popper {
        let stage = metrics.fusion.pop.clone();
        let fuser = claim::start(
            pool.clone(),
            workers,
            default_lease_seconds,
            metrics.clone(),
            stage,
        );
        Popper {
            pool,
            catalog,
            wake,
            fuser,
            metrics,
            waiting: WaitingPops::new(waits.max_waiting),
            poll_fallback: waits.poll_fallback,
            stopping: waits.stopping,
        }
    }

    /// Claims messages; when asked to wait, waits for a push to this queue and claims again.
    /// `None`: nothing to hand out before the wait ended (or the server began to stop).
    pub(crate) async fn pop(&self, req: &Request) -> Result<Option<Vec<Claim>>, Refusal> {
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
            if let Some(claims) = self.attempt(req).await? {
                return Ok(Some(claims));
            }
            let now = Instant::now();
            if now >= deadline || *stop.borrow() {
                return Ok(None);
            }
            if slot.is_none() {
                slot = Some(self.waiting.enter().ok_or_else(|| {
                    Refusal::new(
                        Kind::Full,
                        "waiting_pops_exhausted",
                        "the server holds its maximum number of waiting pops; retry shortly or pop without wait",
                    )
                })?);
            }
            let until = deadline.min(now + self.poll_fallback);
            tokio::select! {
                _ = woken.changed() => {}
                _ = tokio::time::sleep_until(until) => {}
                _ = stop.changed() => {}
            }
        }
    }

    /// One look: the claims made, or `None` when there was nothing to claim.
    async fn attempt(&self, req: &Request) -> Result<Option<Vec<Claim>>, Refusal> {
        let Some(queue_id) = self.catalog.find_queue(&self.pool, &req.queue).await? else {
            if req.partition.is_some() {
                return Err(Refusal::not_found(
                    "queue_not_found",
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
            None => None,
        };
        self.catalog
            .ensure_subscription(&self.pool, queue_id, &req.group, req.start)
            .await?;
        let shape = PopShape {
            queue_id,
            group: req.group.clone(),
            partition_id,
            batch: req.batch,
            auto_ack: req.auto_ack,
            shared_lease: req.partitions > 1,
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
        Ok(Some(claims))
    }
}
