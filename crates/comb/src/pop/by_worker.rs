//! The candidate listing of a pop over a whole queue on Citus, one worker at a time.
//!
//! The coordinator's listing ([`super::claim::CANDIDATES_LIST_CITUS_SQL`]) reads every shard
//! at once: its cost grows with the worker count, it runs on the coordinator, and one worker
//! down fails it. Two ways round it, both running the same listing over one worker's own
//! shards, on that worker, with the parameters bound as parameters. The shards' tables are
//! named by identifiers the coordinator's catalog gave, quoted (`format('%I.%I', …)`), never
//! by anything a client sent.
//!
//! - **On the direct route** ([`list_direct`]), every queue-wide listing asks one worker:
//!   the next in turn. Only when it has fewer candidates than the pop wants are the others
//!   asked, at once. With a backlog spread over the workers, a pop costs one statement on
//!   one worker whatever their count; an empty queue costs one statement per worker (pops
//!   that wait are woken by pushes with the partitions to claim, see `wake`). Where each
//!   worker's shards are ([`Layout`]) is read from the coordinator once a minute.
//! - **On the coordinator route, when a worker cannot be reached** ([`list`]): the
//!   coordinator answers its listing with a connection error (SQLSTATE class 08), and the
//!   listing is asked again one worker at a time, over connections of this server's own.
//!   Workers that cannot be reached are skipped. Cost, while a worker is down: each
//!   queue-wide claim pays the failed listing, one read of the coordinator's shard metadata,
//!   and per worker one connection and one statement.
//!
//! Either way the candidates then go through the named-partition claims, router statements
//! on their live workers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::db::route::{Node, Router};
use crate::db::{Connector, DbError};

/// Placements of the listing's three tables, one row per shard index and its worker: the
/// coordinator's own metadata, read without reaching any worker. Co-located shards share
/// their hash range (`shardminvalue`). `$1` holds the three tables' names; each shard's table
/// comes back as a qualified name, quoted (a shard of `s.t` is `s.t_<shard id>`).
const PLACEMENTS_SQL: &str = "
SELECT n.nodename, n.nodeport,
       format('%I.%I', cn.nspname, cr.relname || '_' || c.shardid) AS c,
       format('%I.%I', sn.nspname, sr.relname || '_' || s.shardid) AS s,
       format('%I.%I', mn.nspname, mr.relname || '_' || m.shardid) AS m
FROM pg_dist_shard c
JOIN pg_dist_shard s ON s.logicalrelid = ($1::text[])[2]::regclass
                    AND s.shardminvalue = c.shardminvalue
JOIN pg_dist_shard m ON m.logicalrelid = ($1::text[])[3]::regclass
                    AND m.shardminvalue = c.shardminvalue
JOIN pg_class cr ON cr.oid = c.logicalrelid JOIN pg_namespace cn ON cn.oid = cr.relnamespace
JOIN pg_class sr ON sr.oid = s.logicalrelid JOIN pg_namespace sn ON sn.oid = sr.relnamespace
JOIN pg_class mr ON mr.oid = m.logicalrelid JOIN pg_namespace mn ON mn.oid = mr.relnamespace
JOIN pg_dist_placement pl ON pl.shardid = c.shardid
JOIN pg_dist_node n ON n.groupid = pl.groupid AND n.isactive
WHERE c.logicalrelid = ($1::text[])[1]::regclass
ORDER BY n.nodename, n.nodeport, c.shardid";

/// One shard of each of the listing's tables (cursors, their states, messages), quoted.
type Shards = [String; 3];

/// Whether `e` is Citus telling that a worker could not be reached: the coordinator answered
/// (its connection is alive) with a connection exception.
pub(super) fn worker_unreachable(e: &tokio_postgres::Error) -> bool {
    !e.is_closed()
        && e.as_db_error()
            .is_some_and(|d| d.code().code().starts_with("08"))
}

/// [`super::claim::CANDIDATES_LIST_CITUS_SQL`] over the tables `cursors`, `states` and `messages`: the
/// distributed tables on the coordinator, or one shard of each on a worker
/// ([`list`], quoted names its catalog gave). Parameters stay parameters.
pub(super) fn candidates_list(cursors: &str, states: &str, messages: &str) -> String {
    select_candidates(
        [cursors, states, messages],
        "",
        "c.partition_id <= $3, c.partition_id",
    )
}

/// The group's cursors (queue `$1`, group `$2`) that pass `also` and have something to hand
/// out (a lease ended, or a message past the cursor), in `order`, at most `$4`.
fn select_candidates([cursors, states, messages]: [&str; 3], also: &str, order: &str) -> String {
    format!(
        "
SELECT c.partition_id
FROM {cursors} c
CROSS JOIN LATERAL {state} f
WHERE c.queue_id = $1 AND c.consumer_group = $2{also}
  AND ((f.lease_id IS NOT NULL AND f.lease_expires_at <= now())
       OR (f.lease_id IS NULL AND f.available_at <= now()
           AND EXISTS (SELECT 1 FROM {messages} m WHERE m.partition_id = c.partition_id
                         AND m.pos > f.cursor_pos AND m.seg >= f.cursor_seg)))
ORDER BY {order}
LIMIT $4",
        state = crate::cursor::latest_state_in(states, "c.partition_id", "c.consumer_group"),
    )
}

/// The listing of one shard of each table on its worker ([`candidates_list`]'s test), as a
/// lazy walk: the shard's cursors after the rover (`$3`) in partition order, then from the
/// start, each half stopping at `$4` found. Ordered by a comparison with the rover, the
/// listing read every cursor's state and sorted them all, so a pop cost as much as the
/// group's partitions on the worker; walked along the cursors' index (`cursors_walk`), it
/// reads a few more than it finds.
fn shard_walk(tables: [&str; 3]) -> String {
    let half = |side: &str| {
        let also = format!(" AND c.partition_id {side} $3");
        format!("({})", select_candidates(tables, &also, "c.partition_id"))
    };
    format!("{}\nUNION ALL\n{}", half(">"), half("<="))
}

/// One worker's listing: the walk of each of its shards, in one statement.
fn worker_listing(shards: &[Shards]) -> String {
    let each: Vec<String> = shards
        .iter()
        .map(|[c, s, m]| format!("({})", shard_walk([c, s, m])))
        .collect();
    each.join("\nUNION ALL\n")
}

/// The candidates of the listing (parameters: queue, group, rover, limit) from every worker
/// that answers, in the listing's order, at most `limit`. `workers` connects to a worker (the
/// database URL's settings at another host). `None` when no worker answered: the caller
/// reports its own error.
pub(super) async fn list(
    client: &deadpool_postgres::Client,
    workers: &Connector,
    queue_id: Uuid,
    group: &str,
    rover: Uuid,
    limit: i64,
) -> Result<Option<Vec<Uuid>>, DbError> {
    let by_node = shards_by_node(client).await?;
    let mut found: Vec<Uuid> = Vec::new();
    let (total, mut answered) = (by_node.len(), 0);
    for ((host, port), shards) in by_node {
        match on_worker(workers, &host, port, &shards, queue_id, group, rover, limit).await {
            Ok(ids) => {
                answered += 1;
                found.extend(ids);
            }
            Err(e) => {
                tracing::warn!(%host, port, error = %e, "a worker's candidates could not be listed");
            }
        }
    }
    tracing::info!(
        "candidates listed per worker: {answered} of {total} workers answered, {} candidates",
        found.len()
    );
    if answered == 0 {
        return Ok(None);
    }
    Ok(Some(in_walk_order(found, rover, limit)))
}

/// Candidates of several workers in the listing's order (after the rover first, then from
/// the start), at most `limit`.
fn in_walk_order(mut found: Vec<Uuid>, rover: Uuid, limit: i64) -> Vec<Uuid> {
    found.sort_by_key(|id| (*id <= rover, *id));
    found.truncate(limit.max(0) as usize);
    found
}

/// A mark of the placements in the coordinator's metadata that changes when a shard moves
/// (a moved shard gets a placement of a new id): a read of a catalog table, on the
/// coordinator alone.
const PLACEMENTS_MARK_SQL: &str = "SELECT coalesce(max(placementid), 0)::bigint AS top, count(*)::bigint AS n FROM pg_dist_placement";

async fn placements_mark(client: &tokio_postgres::Client) -> Result<(i64, i64), DbError> {
    let row = client.query_one(PLACEMENTS_MARK_SQL, &[]).await?;
    Ok((row.get("top"), row.get("n")))
}

/// The shards of the listing's tables on each worker, from the coordinator's metadata
/// ([`PLACEMENTS_SQL`]), in the workers' order.
async fn shards_by_node(
    client: &tokio_postgres::Client,
) -> Result<Vec<(Node, Vec<Shards>)>, DbError> {
    let tables = vec![
        crate::cursor::CURSORS,
        crate::cursor::STATES,
        crate::messages::MESSAGES,
    ];
    let placements = client.query(PLACEMENTS_SQL, &[&tables]).await?;
    let mut by_node: Workers = Vec::new();
    for row in &placements {
        let Ok(port) = u16::try_from(row.get::<_, i32>("nodeport")) else {
            continue;
        };
        let node: Node = (row.get("nodename"), port);
        let shards = [row.get("c"), row.get("s"), row.get("m")];
        match by_node.last_mut() {
            Some((n, all)) if *n == node => all.push(shards),
            _ => by_node.push((node, vec![shards])),
        }
    }
    Ok(by_node)
}

/// The listing's shards on each worker, in the workers' order.
type Workers = Vec<(Node, Vec<Shards>)>;

/// A layout as read: when, the placements' mark then, and the workers' shards.
type Read = (Instant, (i64, i64), Arc<Workers>);

/// Where the listing's shards are, by worker, as last read from the coordinator, and whose
/// turn it is to be asked first.
#[derive(Default)]
pub(super) struct Layout {
    /// When it was read, the placements' mark then ([`PLACEMENTS_MARK_SQL`]) and the layout.
    read: Mutex<Option<Read>>,
    turn: AtomicUsize,
    /// Workers that could not be reached, and when: asked last for [`Layout::RESTING`], so
    /// that a worker down does not cost every other pop a failed connection first.
    unreachable: Mutex<std::collections::HashMap<Node, Instant>>,
    /// Where each (queue, group)'s walk over each worker's partitions goes on: after the last
    /// partition taken from that worker. One rover over the workers together would starve a
    /// worker's partitions whose ids lie below another worker's last one (its walk would
    /// wrap to its first partition again and again).
    rovers: Mutex<std::collections::HashMap<(Uuid, String, Node), Uuid>>,
}

impl Layout {
    /// How long a read of the shards' places is used: a shard moved meanwhile (a rebalance)
    /// is found sooner, by its table missing on the worker ([`list_direct`]).
    const TTL: Duration = Duration::from_secs(60);

    async fn workers(&self, coordinator: &tokio_postgres::Client) -> Result<Arc<Workers>, DbError> {
        if let Some((at, _, read)) = &*self.read.lock().unwrap()
            && at.elapsed() < Self::TTL
        {
            return Ok(read.clone());
        }
        let mark = placements_mark(coordinator).await?;
        let read = Arc::new(shards_by_node(coordinator).await?);
        *self.read.lock().unwrap() = Some((Instant::now(), mark, read.clone()));
        Ok(read)
    }

    /// Whether shards moved since the layout was read (a rebalance, a worker added).
    async fn moved(&self, coordinator: &tokio_postgres::Client) -> Result<bool, DbError> {
        let Some(then) = self.read.lock().unwrap().as_ref().map(|(_, mark, _)| *mark) else {
            return Ok(true);
        };
        Ok(placements_mark(coordinator).await? != then)
    }

    /// How long a worker that could not be reached is asked last.
    const RESTING: Duration = Duration::from_secs(5);

    fn forget(&self) {
        *self.read.lock().unwrap() = None;
    }

    /// The workers' indexes in the order to ask them: from the next in turn, those that
    /// could not be reached lately last.
    fn order(&self, workers: &Workers) -> Vec<usize> {
        let first = self.turn.fetch_add(1, Ordering::Relaxed);
        let mut order: Vec<usize> = (0..workers.len())
            .map(|i| (first + i) % workers.len())
            .collect();
        let mut unreachable = self.unreachable.lock().unwrap();
        unreachable.retain(|_, at| at.elapsed() < Self::RESTING);
        order.sort_by_key(|&k| unreachable.contains_key(&workers[k].0));
        order
    }

    /// Most rovers kept; beyond, they start again from the first partitions.
    const ROVERS: usize = 100_000;

    fn rover(&self, queue_id: Uuid, group: &str, node: &Node) -> Uuid {
        let rovers = self.rovers.lock().unwrap();
        rovers
            .get(&(queue_id, group.to_string(), node.clone()))
            .copied()
            .unwrap_or(Uuid::nil())
    }

    fn set_rover(&self, queue_id: Uuid, group: &str, node: &Node, after: Uuid) {
        let mut rovers = self.rovers.lock().unwrap();
        if rovers.len() >= Self::ROVERS {
            rovers.clear();
        }
        rovers.insert((queue_id, group.to_string(), node.clone()), after);
    }

    fn unreachable(&self, node: &Node) {
        self.unreachable
            .lock()
            .unwrap()
            .insert(node.clone(), Instant::now());
    }
}

/// On the direct route, the candidates of the listing (parameters: queue, group, rover,
/// limit) asked of one worker, the next in turn, and of the others at once only when it
/// has fewer than `wanted`; each worker's in its walk order from its own rover, which moves
/// past the first `wanted` taken; at most `limit`. `None`: the route is
/// not direct, or a worker no longer holds a shard it was said to (the layout is read again
/// next time): the caller lists through the coordinator. A worker that cannot be reached is
/// skipped; when none answers, the last error is the answer.
#[allow(clippy::too_many_arguments)]
pub(super) async fn list_direct(
    coordinator: &tokio_postgres::Client,
    router: &Router,
    layout: &Layout,
    queue_id: Uuid,
    group: &str,
    wanted: usize,
    limit: i64,
) -> Result<Option<Vec<Uuid>>, DbError> {
    if !router.is_direct() {
        return Ok(None);
    }
    let workers = layout.workers(coordinator).await?;
    if workers.is_empty() {
        return Ok(None);
    }
    let order = layout.order(&workers);
    let ask = |k: usize| {
        let (node, shards) = &workers[k];
        async move {
            let rover = layout.rover(queue_id, group, node);
            let asked = async {
                let pools = router.worker(node).ok_or_else(|| {
                    DbError::Unavailable(format!("no pools for worker {}:{}", node.0, node.1))
                })?;
                let client = pools.consumer.get().await?;
                let listing = client.prepare_cached(&worker_listing(shards)).await?;
                let rows = client
                    .query(&listing, &[&queue_id, &group, &rover, &limit])
                    .await?;
                let ids = rows.iter().map(|r| r.get("partition_id")).collect();
                Ok::<Vec<Uuid>, DbError>(in_walk_order(ids, rover, limit))
            };
            let answer = asked.await;
            if matches!(answer, Err(DbError::Unavailable(_))) {
                layout.unreachable(node);
            }
            (node, answer)
        }
    };
    let mut answers = vec![ask(order[0]).await];
    let short = match &answers[0].1 {
        Ok(ids) => ids.len() < wanted,
        Err(_) => true,
    };
    if short && order.len() > 1 {
        let others = order[1..].iter().map(|&k| ask(k));
        answers.extend(futures_util::future::join_all(others).await);
    }
    let mut found: Vec<Uuid> = Vec::new();
    let mut failed = None;
    for (node, answer) in answers {
        match answer {
            Ok(ids) => {
                let taken = wanted.saturating_sub(found.len()).min(ids.len());
                if let Some(&last) = ids[..taken].last() {
                    layout.set_rover(queue_id, group, node, last);
                }
                found.extend(ids);
            }
            Err(DbError::Postgres(e)) if shard_gone(&e) => {
                layout.forget();
                return Ok(None);
            }
            Err(e) => {
                tracing::warn!(error = %e, "a worker's candidates could not be listed");
                failed = Some(e);
            }
        }
    }
    if found.is_empty()
        && let Some(e) = failed
    {
        return Err(e);
    }
    // Short of what was wanted: a shard moved since the layout was read would be missed
    // (its old worker may keep the old table a while, unchanged), so look once more through
    // the coordinator and read the layout again.
    if found.len() < wanted && layout.moved(coordinator).await? {
        layout.forget();
        return Ok(None);
    }
    found.truncate(limit.max(0) as usize);
    Ok(Some(found))
}

/// Whether `e` says a table the listing named is not on the worker: its shard moved.
fn shard_gone(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE)
}

/// Runs the listing of `shards` on the worker at `host:port`, over a connection of its own.
#[allow(clippy::too_many_arguments)]
async fn on_worker(
    workers: &Connector,
    host: &str,
    port: u16,
    shards: &[Shards],
    queue_id: Uuid,
    group: &str,
    rover: Uuid,
    limit: i64,
) -> Result<Vec<Uuid>, tokio_postgres::Error> {
    let (worker, connection) = workers.at(host, port).connect().await?;
    let running = tokio::spawn(async move {
        let _ = connection.await;
    });
    let listed = worker
        .query(
            &worker_listing(shards),
            &[&queue_id, &group, &rover, &limit],
        )
        .await;
    drop(worker);
    let _ = running.await;
    Ok(listed?.iter().map(|r| r.get("partition_id")).collect())
}
