//! The candidate listing of a pop over a whole queue on Citus when a worker cannot be
//! reached.
//!
//! The listing ([`super::claim::CANDIDATES_LIST_CITUS_SQL`]) reads every shard at once, so
//! one worker down fails it, and with it every queue-wide pop, also of queues whose
//! partitions are all on live workers. When Citus answers it with a connection error
//! (SQLSTATE class 08: the coordinator could not reach a worker; the coordinator's own
//! connection is fine), the listing is asked again one worker at a time, each worker's
//! listing run by the worker itself over its own shards (`master_run_on_worker`, which
//! reports a worker it cannot reach instead of failing), and the workers that do not answer
//! are skipped. The candidates then go through the same named-partition claims, router
//! statements on their live workers. Nothing here runs while every worker answers.
//!
//! Cost, while a worker is down: each queue-wide claim pays the failed listing, one read of
//! the coordinator's shard metadata, and one statement per worker, each opening a
//! connection from the coordinator to that worker.

use uuid::Uuid;

use crate::db::DbError;

/// Placements of the listing's three tables, one row per shard index and its worker: the
/// coordinator's own metadata, read without reaching any worker. Co-located shards share
/// their hash range (`shardminvalue`). `$1` holds the three tables' names.
const PLACEMENTS_SQL: &str = "
SELECT n.nodename, n.nodeport, c.shardid AS c, s.shardid AS s, m.shardid AS m
FROM pg_dist_shard c
JOIN pg_dist_shard s ON s.logicalrelid = ($1::text[])[2]::regclass
                    AND s.shardminvalue = c.shardminvalue
JOIN pg_dist_shard m ON m.logicalrelid = ($1::text[])[3]::regclass
                    AND m.shardminvalue = c.shardminvalue
JOIN pg_dist_placement pl ON pl.shardid = c.shardid
JOIN pg_dist_node n ON n.groupid = pl.groupid AND n.isactive
WHERE c.logicalrelid = ($1::text[])[1]::regclass
ORDER BY n.nodename, n.nodeport, c.shardid";

/// Runs one worker's listing on that worker; `success` is false when it could not be
/// reached or its listing failed.
const ON_WORKER_SQL: &str = "SELECT success, result FROM master_run_on_worker(ARRAY[$1::text], ARRAY[$2::int], ARRAY[$3::text], false)";

/// The listing's tables, named by their owners' fragments: the cursors `c`, their state
/// versions `s`, the messages `m`.
fn tables() -> [String; 3] {
    let first = |s: &str| s.split_whitespace().next().unwrap_or_default().to_string();
    let state = crate::cursor::latest_state("x", "y", None);
    let states = state
        .split_whitespace()
        .skip_while(|w| *w != "FROM")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    [
        first(crate::cursor::cursors!()),
        states,
        first(crate::messages::partition_messages!("x")),
    ]
}

/// A SQL string literal of `s`.
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Whether `e` is Citus telling that a worker could not be reached: the coordinator answered
/// (its connection is alive) with a connection exception.
pub(super) fn worker_unreachable(e: &tokio_postgres::Error) -> bool {
    !e.is_closed()
        && e.as_db_error()
            .is_some_and(|d| d.code().code().starts_with("08"))
}

/// The candidates of the listing `sql` (parameters `$1` queue, `$2` group, `$3` rover, `$4`
/// limit) from every worker that answers, in the listing's order, at most `limit`. `None`
/// when no worker answered: the caller reports its own error.
pub(super) async fn list(
    client: &deadpool_postgres::Client,
    sql: &str,
    queue_id: Uuid,
    group: &str,
    rover: Uuid,
    limit: i64,
) -> Result<Option<Vec<Uuid>>, DbError> {
    let tables = tables();
    let placements = client.query(PLACEMENTS_SQL, &[&tables.to_vec()]).await?;
    // The listing with its parameters written out (the worker runs text), `$4` first so
    // that no `$1` is read inside a longer number.
    let sql = sql
        .replace("$4", &limit.to_string())
        .replace("$3", &format!("{}::uuid", literal(&rover.to_string())))
        .replace("$2", &literal(group))
        .replace("$1", &format!("{}::uuid", literal(&queue_id.to_string())));
    let mut workers: Vec<((String, i32), Vec<String>)> = Vec::new();
    for row in &placements {
        let node: (String, i32) = (row.get("nodename"), row.get("nodeport"));
        let shard = |col: &str, table: &str| format!("{table}_{}", row.get::<_, i64>(col));
        let one = sql
            .replace(
                &format!("{} c", tables[0]),
                &format!("{} c", shard("c", &tables[0])),
            )
            .replace(
                &format!("{} s", tables[1]),
                &format!("{} s", shard("s", &tables[1])),
            )
            .replace(
                &format!("{} m", tables[2]),
                &format!("{} m", shard("m", &tables[2])),
            );
        match workers.last_mut() {
            Some((n, shards)) if *n == node => shards.push(one),
            _ => workers.push((node, vec![one])),
        }
    }
    let mut found: Vec<Uuid> = Vec::new();
    let (total, mut answered) = (workers.len(), 0);
    for ((host, port), shards) in workers {
        let union: Vec<String> = shards.iter().map(|s| format!("({s})")).collect();
        let command = format!(
            "SELECT coalesce(string_agg(partition_id::text, ','), '') FROM ({}) l",
            union.join(" UNION ALL ")
        );
        let row = client
            .query_one(ON_WORKER_SQL, &[&host, &port, &command])
            .await?;
        let (success, result): (bool, String) = (row.get("success"), row.get("result"));
        if !success {
            tracing::warn!(%host, port, %result, "a worker's candidates could not be listed");
            continue;
        }
        answered += 1;
        found.extend(result.split(',').filter_map(|id| id.parse::<Uuid>().ok()));
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
