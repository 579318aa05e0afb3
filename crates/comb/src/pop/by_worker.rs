//! The candidate listing of a pop over a whole queue on Citus when a worker cannot be
//! reached.
//!
//! The listing ([`super::claim::CANDIDATES_LIST_CITUS_SQL`]) reads every shard at once, so
//! one worker down fails it, and with it every queue-wide pop, also of queues whose
//! partitions are all on live workers. When Citus answers it with a connection error
//! (SQLSTATE class 08: the coordinator could not reach a worker; the coordinator's own
//! connection is fine), the listing is asked again one worker at a time: this server
//! connects to each worker the coordinator's metadata names (the database URL's database,
//! credentials and TLS settings at the worker's host and port) and runs the listing there
//! over that worker's own shards, its parameters bound as parameters. The shards' tables are
//! named by identifiers the coordinator's catalog gave, quoted (`format('%I.%I', …)`), never
//! by anything a client sent. Workers that cannot be reached are skipped. The candidates
//! then go through the same named-partition claims, router statements on their live
//! workers. Nothing here runs while every worker answers.
//!
//! Cost, while a worker is down: each queue-wide claim pays the failed listing, one read of
//! the coordinator's shard metadata, and per worker one connection and one statement.

use uuid::Uuid;

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

/// A worker as the coordinator's metadata names it: host and port.
type Node = (String, i32);

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
    format!(
        "
SELECT c.partition_id
FROM {cursors} c
CROSS JOIN LATERAL {state} f
WHERE c.queue_id = $1 AND c.consumer_group = $2
  AND ((f.lease_id IS NOT NULL AND f.lease_expires_at <= now())
       OR (f.lease_id IS NULL AND f.available_at <= now()
           AND EXISTS (SELECT 1 FROM {messages} m WHERE m.partition_id = c.partition_id
                         AND m.pos > f.cursor_pos AND m.seg >= f.cursor_seg)))
ORDER BY c.partition_id <= $3, c.partition_id
LIMIT $4",
        state = crate::cursor::latest_state_in(states, "c.partition_id", "c.consumer_group"),
    )
}

/// One worker's listing: the listing of each of its shards, in one statement.
fn worker_listing(shards: &[Shards]) -> String {
    let each: Vec<String> = shards
        .iter()
        .map(|[c, s, m]| format!("({})", candidates_list(c, s, m)))
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
    let tables = vec![
        crate::cursor::CURSORS,
        crate::cursor::STATES,
        crate::messages::MESSAGES,
    ];
    let placements = client.query(PLACEMENTS_SQL, &[&tables]).await?;
    let mut by_node: Vec<(Node, Vec<Shards>)> = Vec::new();
    for row in &placements {
        let node: Node = (row.get("nodename"), row.get("nodeport"));
        let shards = [row.get("c"), row.get("s"), row.get("m")];
        match by_node.last_mut() {
            Some((n, all)) if *n == node => all.push(shards),
            _ => by_node.push((node, vec![shards])),
        }
    }
    let mut found: Vec<Uuid> = Vec::new();
    let (total, mut answered) = (by_node.len(), 0);
    for ((host, port), shards) in by_node {
        let Ok(port16) = u16::try_from(port) else {
            continue;
        };
        match on_worker(
            workers, &host, port16, &shards, queue_id, group, rover, limit,
        )
        .await
        {
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
    // The listing's order: after the rover first, then from the start.
    found.sort_by_key(|id| (*id <= rover, *id));
    found.truncate(limit.max(0) as usize);
    Ok(Some(found))
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
