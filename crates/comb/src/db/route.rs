//! On Citus, which node runs a partition's hot-path statements (`--citus-route`).
//!
//! Citus (11 and later, metadata synced to the workers) runs a statement on distributed
//! tables from any node, and a worker runs a router statement of a shard it holds by local
//! execution. Sent through the coordinator, every statement costs the coordinator its
//! planning and its routing, about as much CPU as the worker's own work (measured in
//! `docs/scale-out.md`): the coordinator becomes the cluster's bottleneck at any worker
//! count. With the direct route, a partition's hot-path transactions (the fused push of a
//! shard, the claim of a named partition, its acks, the extension of its lease) go to the
//! worker holding the partition's shard over pools of their own, the same SQL. Everything
//! else stays on the coordinator: wake-ups (`LISTEN/NOTIFY` is per node), the maintenance
//! leader's advisory lock, DDL, reference-table writes, listings over every shard and the
//! administration.
//!
//! Correctness does not depend on the placement: a statement sent to a worker that no longer
//! holds the shard (after a rebalance) is routed by that worker as the coordinator would,
//! only less cheaply; the placement is read again a minute later
//! ([`Placement`](crate::schema::citus::Placement)).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use deadpool_postgres::Pool;
use uuid::Uuid;

use super::Pools;
use crate::schema::citus::Placement;

pub(crate) use crate::schema::citus::Node;

/// Where a partition's hot-path statements go: read once at start (`--citus-route`) and
/// handed to the use cases as a value. Without the direct route (plain PostgreSQL, or Citus
/// through its coordinator) every statement goes to the pool it was given.
#[derive(Clone, Default)]
pub(crate) struct Router {
    direct: Option<Arc<Route>>,
}

/// The coordinator's pools, the placement of partitions and a pair of pools per worker
/// (opened on first use: a worker added while serving gets its pools when a partition is
/// first found on it).
struct Route {
    coordinator: Pool,
    database_url: String,
    /// Connections per worker: of the general pool and of the consumer pool.
    sizes: (usize, usize),
    placement: Placement,
    workers: Mutex<HashMap<Node, Pools>>,
}

impl Router {
    /// Every statement through the pool it is given (the coordinator's, on Citus).
    pub(crate) fn through_pools() -> Router {
        Router::default()
    }

    /// The direct route (at start, on Citus only): partitions' hot-path statements go to
    /// their workers, each with at most `general` + `consumer` connections from this server,
    /// with `database_url`'s database, credentials and TLS settings.
    pub(crate) fn direct(
        coordinator: &Pools,
        database_url: &str,
        general: usize,
        consumer: usize,
    ) -> Router {
        Router {
            direct: Some(Arc::new(Route {
                coordinator: coordinator.general.clone(),
                database_url: database_url.to_string(),
                sizes: (general, consumer),
                placement: Placement::default(),
                workers: Mutex::default(),
            })),
        }
    }

    /// Whether partitions' hot-path statements go to their workers.
    pub(crate) fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// The pools of worker `node`, when the direct route is on (opened on first use).
    pub(crate) fn worker(&self, node: &Node) -> Option<Pools> {
        let route = self.direct.as_ref()?;
        let mut workers = route.workers.lock().unwrap();
        if let Some(pools) = workers.get(node) {
            return Some(pools.clone());
        }
        let (general, consumer) = route.sizes;
        match Pools::at(&route.database_url, node, general, consumer) {
            Ok(pools) => {
                tracing::info!(worker = %format!("{}:{}", node.0, node.1), "direct route to a Citus worker");
                workers.insert(node.clone(), pools.clone());
                Some(pools)
            }
            Err(e) => {
                tracing::warn!(error = %e, "no pools for a Citus worker; its partitions go through the coordinator");
                None
            }
        }
    }

    /// The pools of the worker holding `partition`, when the direct route is on and the
    /// worker is known (its placement cached, or read now from the coordinator). `None`: use
    /// the coordinator's pools, as without the route. A placement that cannot be read (the
    /// coordinator unreachable) is `None` too: the request then meets the coordinator's
    /// outage and answers it as always.
    async fn of_partition(&self, partition: Uuid) -> Option<Pools> {
        let route = self.direct.as_ref()?;
        self.worker(&self.node_of(route, partition).await?)
    }

    /// The worker holding `partition`, cached or read now from the coordinator.
    async fn node_of(&self, route: &Route, partition: Uuid) -> Option<Node> {
        match route.placement.node(partition) {
            Some(node) => node,
            None => {
                let client = route.coordinator.get().await.ok()?;
                route.placement.look_up(&client, &[partition]).await.ok()?;
                route.placement.node(partition)?
            }
        }
    }

    /// `partitions` grouped by the worker holding them, each group with its worker's consumer
    /// pool (on the direct route), or all in one group with `pool`: what a batch of acks over
    /// several partitions sends to each worker.
    pub(crate) async fn consumers_of_each(
        &self,
        pool: &Pool,
        partitions: impl IntoIterator<Item = Uuid>,
    ) -> Vec<(Pool, Vec<Uuid>)> {
        let mut groups: Vec<(Option<Node>, Pool, Vec<Uuid>)> = Vec::new();
        for p in partitions {
            let node = match &self.direct {
                Some(route) => self.node_of(route, p).await,
                None => None,
            };
            match groups.iter_mut().find(|(n, _, _)| *n == node) {
                Some((_, _, ps)) => ps.push(p),
                None => {
                    let pool = node
                        .as_ref()
                        .and_then(|n| self.worker(n))
                        .map_or_else(|| pool.clone(), |w| w.consumer);
                    groups.push((node, pool, vec![p]));
                }
            }
        }
        groups.into_iter().map(|(_, pool, ps)| (pool, ps)).collect()
    }

    /// The general pool for a transaction over `partitions`: on the direct route, the worker's
    /// when one worker holds them all (the transaction then commits on that node alone),
    /// else `pool` (the coordinator's, which commits over several workers in two phases).
    pub(crate) async fn general_of_all(&self, pool: &Pool, partitions: &[Uuid]) -> Pool {
        let Some(route) = &self.direct else {
            return pool.clone();
        };
        let mut node = None;
        for &p in partitions {
            let Some(n) = self.node_of(route, p).await else {
                return pool.clone();
            };
            if node.get_or_insert_with(|| n.clone()) != &n {
                return pool.clone();
            }
        }
        node.and_then(|n| self.worker(&n))
            .map_or_else(|| pool.clone(), |w| w.general)
    }

    /// The consumer pool for `partition`'s claim or acks: its worker's on the direct route,
    /// else `pool` (the coordinator's).
    pub(crate) async fn consumer(&self, pool: &Pool, partition: Option<Uuid>) -> Pool {
        match partition {
            Some(p) => self
                .of_partition(p)
                .await
                .map_or_else(|| pool.clone(), |w| w.consumer),
            None => pool.clone(),
        }
    }

    /// The general pool for `partition`'s statements (a lease's extension): its worker's on
    /// the direct route, else `pool` (the coordinator's).
    pub(crate) async fn general(&self, pool: &Pool, partition: Option<Uuid>) -> Pool {
        match partition {
            Some(p) => self
                .of_partition(p)
                .await
                .map_or_else(|| pool.clone(), |w| w.general),
            None => pool.clone(),
        }
    }
}

/// The one partition every item names, if they name one only: a fused batch of acks of one
/// partition goes to that partition's worker; a batch over several stays on the coordinator.
pub(crate) fn only<T>(items: &[T], of: impl Fn(&T) -> Uuid) -> Option<Uuid> {
    let first = of(items.first()?);
    items.iter().all(|i| of(i) == first).then_some(first)
}
