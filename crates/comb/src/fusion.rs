//! Request fusion: concurrent requests of one kind become one database round trip.
//!
//! Each kind (push, pop, ack) has a few workers, each running one fused batch at a time.
//! A worker that is free takes the first waiting job at once and, without waiting for more,
//! everything else already queued behind it (up to a weight limit). So a lone request is
//! never held back, and under load batches grow by themselves: the busier the database, the
//! more requests arrive while a batch is in flight and the larger the next one is.
//!
//! A fuser is either *shared* (several workers drain one queue) or *keyed* (one queue and
//! one worker per shard, jobs routed by a key). Each use case chooses its keys and says why
//! where it does (`push::store::shard_key`, `pop::PopShape::lane`).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures_util::FutureExt;
use tokio::sync::{Mutex, mpsc};

use crate::db::DbError;
use crate::metrics::Stage;
use crate::refusal::Refusal;

/// The channel a fused job answers on: its own result, or the batch's database failure.
pub(crate) type Reply<T> = tokio::sync::oneshot::Sender<Result<T, Arc<DbError>>>;

/// Runs one fused batch.
pub(crate) type Runner<J> =
    Arc<dyn Fn(Vec<J>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// The queues in front of one kind of worker.
pub(crate) struct Fuser<J> {
    /// Each job with the moment it was queued.
    shards: Vec<mpsc::Sender<(Instant, J)>>,
}

impl<J> Clone for Fuser<J> {
    fn clone(&self) -> Self {
        Fuser {
            shards: self.shards.clone(),
        }
    }
}

/// The fuser stopped (the server is shutting down).
#[derive(Debug)]
pub(crate) struct Closed;

impl<J: Send + 'static> Fuser<J> {
    /// Starts `workers` workers on one shared queue; a batch stops growing once its jobs weigh
    /// `max_weight`. `stage` records the jobs' waits and the batches' turns.
    pub(crate) fn start(
        workers: usize,
        max_weight: usize,
        weight: fn(&J) -> usize,
        run: Runner<J>,
        stage: Arc<Stage>,
    ) -> Fuser<J> {
        Fuser {
            shards: vec![Self::shard(workers, max_weight, weight, run, stage)],
        }
    }

    /// Starts `shards` queues with one worker each; [`Fuser::submit_keyed`] routes jobs.
    pub(crate) fn start_keyed(
        shards: usize,
        max_weight: usize,
        weight: fn(&J) -> usize,
        run: Runner<J>,
        stage: Arc<Stage>,
    ) -> Fuser<J> {
        Fuser {
            shards: (0..shards.max(1))
                .map(|_| Self::shard(1, max_weight, weight, run.clone(), stage.clone()))
                .collect(),
        }
    }

    fn shard(
        workers: usize,
        max_weight: usize,
        weight: fn(&J) -> usize,
        run: Runner<J>,
        stage: Arc<Stage>,
    ) -> mpsc::Sender<(Instant, J)> {
        let (tx, rx) = mpsc::channel::<(Instant, J)>(65_536);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..workers.max(1) {
            let rx = rx.clone();
            let run = run.clone();
            let stage = stage.clone();
            tokio::spawn(async move {
                loop {
                    let (started, batch) = {
                        let mut rx = rx.lock().await;
                        let Some((queued, first)) = rx.recv().await else {
                            return;
                        };
                        let started = Instant::now();
                        stage.waited.observe(started - queued);
                        let mut total = weight(&first);
                        let mut batch = vec![first];
                        while total < max_weight {
                            match rx.try_recv() {
                                Ok((queued, job)) => {
                                    stage
                                        .waited
                                        .observe(started.saturating_duration_since(queued));
                                    total += weight(&job);
                                    batch.push(job);
                                }
                                Err(_) => break,
                            }
                        }
                        (started, batch)
                    };
                    // A batch that panics drops its jobs' reply channels unanswered (each
                    // requester hears an internal error); the worker goes on to the next.
                    if AssertUnwindSafe(run(batch)).catch_unwind().await.is_err() {
                        tracing::error!("a fused batch panicked; its requests were answered 500");
                    }
                    stage.ran.observe(started.elapsed());
                }
            });
        }
        tx
    }

    /// Hands a job to the shard of `key` and waits for its answer: what a use case calls.
    /// A fuser that no longer takes jobs is a server shutting down; a reply channel closed
    /// unanswered is a batch that panicked (a defect, answered as an internal error, not as
    /// a shutdown clients would retry elsewhere).
    pub(crate) async fn ask<T>(
        &self,
        key: u64,
        job: impl FnOnce(Reply<T>) -> J,
    ) -> Result<T, Refusal> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.submit_keyed(key, job(reply))
            .await
            .map_err(|_| Refusal::shutting_down())?;
        rx.await
            .map_err(|_| Refusal::internal("a fused batch ended without answering its job"))?
            .map_err(|e| Refusal::from(&*e))
    }

    /// Queues a job on the shard its key maps to: jobs with equal keys go to the same worker.
    pub(crate) async fn submit_keyed(&self, key: u64, job: J) -> Result<(), Closed> {
        let shard = &self.shards[(key % self.shards.len() as u64) as usize];
        shard.send((Instant::now(), job)).await.map_err(|_| Closed)
    }
}

/// Answers every job of a fused batch from the batch's one result: each job, in order, gets
/// the next rows of `result` up to its share (fewer, or none, when the batch yielded less
/// than was asked, as a claim may), or every job gets the batch's failure. `split` gives a
/// job's share and its reply channel. A job whose requester stopped waiting is skipped.
/// Written once because every fused use case answers this way: rows come back in the jobs'
/// order, and one transaction failing fails all the jobs it carried.
pub(crate) fn reply_all<J, T>(
    jobs: Vec<J>,
    result: Result<Vec<T>, DbError>,
    split: impl Fn(J) -> (usize, Reply<Vec<T>>),
) {
    match result {
        Ok(rows) => {
            let mut rows = rows.into_iter();
            for job in jobs {
                let (share, reply) = split(job);
                let _ = reply.send(Ok(rows.by_ref().take(share).collect()));
            }
        }
        Err(e) => {
            let e = Arc::new(e);
            for job in jobs {
                let _ = split(job).1.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::oneshot;

    /// A job of the fan-out tests: its share and where it is answered.
    type Job = (usize, Reply<Vec<u32>>);
    type Answer = oneshot::Receiver<Result<Vec<u32>, Arc<DbError>>>;

    fn jobs(shares: &[usize]) -> (Vec<Job>, Vec<Answer>) {
        shares
            .iter()
            .map(|&n| {
                let (tx, rx) = oneshot::channel();
                ((n, tx), rx)
            })
            .unzip()
    }

    #[test]
    fn each_job_gets_its_share_in_order() {
        let (jobs, mut rxs) = jobs(&[2, 1, 3]);
        reply_all(jobs, Ok(vec![10, 11, 20, 30, 31, 32]), |j| j);
        let got: Vec<Vec<u32>> = rxs
            .iter_mut()
            .map(|rx| rx.try_recv().unwrap().unwrap())
            .collect();
        assert_eq!(got, vec![vec![10, 11], vec![20], vec![30, 31, 32]]);
    }

    #[test]
    fn a_short_result_leaves_the_later_jobs_less() {
        let (jobs, mut rxs) = jobs(&[2, 2, 1]);
        reply_all(jobs, Ok(vec![1, 2, 3]), |j| j);
        let got: Vec<Vec<u32>> = rxs
            .iter_mut()
            .map(|rx| rx.try_recv().unwrap().unwrap())
            .collect();
        assert_eq!(got, vec![vec![1, 2], vec![3], vec![]]);
    }

    #[test]
    fn a_failure_reaches_every_job_and_gone_requesters_are_skipped() {
        let (jobs, mut rxs) = jobs(&[1, 1, 1]);
        drop(rxs.remove(1));
        reply_all(jobs, Err(DbError::Unavailable("down".into())), |j| j);
        let errors: Vec<Arc<DbError>> = rxs
            .iter_mut()
            .map(|rx| rx.try_recv().unwrap().unwrap_err())
            .collect();
        assert!(Arc::ptr_eq(&errors[0], &errors[1]));
    }

    #[tokio::test]
    async fn lone_job_runs_and_queued_jobs_fuse() {
        let batches = Arc::new(std::sync::Mutex::new(Vec::<usize>::new()));
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let b2 = batches.clone();
        let g2 = gate.clone();
        let runs = Arc::new(AtomicUsize::new(0));
        let r2 = runs.clone();
        let run: Runner<(u32, oneshot::Sender<u32>)> = Arc::new(move |batch| {
            let b = b2.clone();
            let g = g2.clone();
            let r = r2.clone();
            Box::pin(async move {
                // The first batch waits for the gate, so later jobs pile up behind it.
                if r.fetch_add(1, Ordering::SeqCst) == 0 {
                    g.acquire().await.unwrap().forget();
                }
                b.lock().unwrap().push(batch.len());
                for (v, reply) in batch {
                    let _ = reply.send(v * 2);
                }
            })
        });
        let fuser = Fuser::start(1, 100, |_| 1, run, Arc::default());
        let (tx, first) = oneshot::channel();
        fuser.submit_keyed(0, (1, tx)).await.unwrap();
        tokio::task::yield_now().await;
        let mut rest = Vec::new();
        for i in 2..=6 {
            let (tx, rx) = oneshot::channel();
            fuser.submit_keyed(0, (i, tx)).await.unwrap();
            rest.push(rx);
        }
        gate.add_permits(1);
        assert_eq!(first.await.unwrap(), 2);
        for (i, rx) in rest.into_iter().enumerate() {
            assert_eq!(rx.await.unwrap(), (i as u32 + 2) * 2);
        }
        assert_eq!(*batches.lock().unwrap(), vec![1, 5]);
    }

    #[tokio::test]
    async fn keyed_jobs_go_to_their_own_worker() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::<Vec<u64>>::new()));
        let s2 = seen.clone();
        let run: Runner<(u64, oneshot::Sender<()>)> = Arc::new(move |batch| {
            let s = s2.clone();
            Box::pin(async move {
                s.lock().unwrap().push(batch.iter().map(|j| j.0).collect());
                for (_, reply) in batch {
                    let _ = reply.send(());
                }
            })
        });
        let fuser = Fuser::start_keyed(2, 100, |_| 1, run, Arc::default());
        let mut waits = Vec::new();
        for key in [0u64, 1, 2, 3, 4, 5] {
            let (tx, rx) = oneshot::channel();
            fuser.submit_keyed(key, (key, tx)).await.unwrap();
            waits.push(rx);
        }
        for w in waits {
            w.await.unwrap();
        }
        // Every batch holds keys of one parity only: one shard each.
        for batch in seen.lock().unwrap().iter() {
            assert!(batch.iter().all(|k| k % 2 == batch[0] % 2), "{batch:?}");
        }
    }

    #[tokio::test]
    async fn batches_stop_at_the_weight_limit() {
        let batches = Arc::new(std::sync::Mutex::new(Vec::<usize>::new()));
        let b2 = batches.clone();
        let run: Runner<oneshot::Sender<()>> = Arc::new(move |batch| {
            let b = b2.clone();
            Box::pin(async move {
                b.lock().unwrap().push(batch.len());
                for reply in batch {
                    let _ = reply.send(());
                }
            })
        });
        let fuser = Fuser::start(1, 3, |_| 1, run, Arc::default());
        let mut waits = Vec::new();
        // Submit while the worker cannot run: a current-thread runtime only runs it when we yield.
        for _ in 0..7 {
            let (tx, rx) = oneshot::channel();
            fuser.submit_keyed(0, tx).await.unwrap();
            waits.push(rx);
        }
        for w in waits {
            w.await.unwrap();
        }
        let seen = batches.lock().unwrap().clone();
        assert_eq!(seen.iter().sum::<usize>(), 7);
        assert!(seen.iter().all(|n| *n <= 3), "{seen:?}");
    }

    /// A batch that panics answers its requester 500 `internal` (not 503 `shutting_down`,
    /// which would send clients to another server), and its worker serves the next job.
    #[tokio::test]
    async fn a_panicking_batch_answers_internal_and_its_worker_serves_on() {
        let run: Runner<(bool, Reply<u32>)> = Arc::new(|batch| {
            Box::pin(async move {
                for (panics, reply) in batch {
                    assert!(!panics, "a defect in a fused batch");
                    let _ = reply.send(Ok(7));
                }
            })
        });
        // One worker: were it gone, the next job would never be answered.
        let fuser = Fuser::start(1, 1, |_| 1, run, Arc::default());
        let refused = fuser.ask(0, |reply| (true, reply)).await.unwrap_err();
        assert_eq!(
            (refused.kind, refused.code),
            (crate::refusal::Kind::Internal, crate::code::Code::Internal)
        );
        let next = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            fuser.ask(0, |reply| (false, reply)),
        )
        .await
        .expect("the worker still serves");
        assert_eq!(next.unwrap(), 7);
    }
}
