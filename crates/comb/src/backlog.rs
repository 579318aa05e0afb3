//! Backlog: how much is pending in each queue and how far each group is behind, as the
//! database has it now. Heads and cursor states are index probes per partition and cursor;
//! no message is read.

use std::time::Duration;

use deadpool_postgres::Pool;

use crate::db::DbError;

/// How long the depth and lag statement may run; a scrape must stay cheap.
const STATS_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a caller waits for [`measure`] at most: the statement's own timeout and a second
/// to get a connection and hear the answer.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(3);

/// Pending messages per queue (what `maxSize` limits: not yet passed by the slowest group),
/// then unsettled messages per (queue, group), in one round trip. Heads and cursor states are
/// index probes per partition and cursor; no message is read.
const STATS: &str = "
WITH heads AS (
    SELECT p.id, p.queue_id, h.pos
    FROM comb.partitions p CROSS JOIN LATERAL comb.partition_head(p.id) h
), cursors AS (
    SELECT c.queue_id, c.partition_id, c.consumer_group, c.cursor_pos,
           cardinality(c.settled) AS settled
    FROM comb.cursors_now c
)
SELECT q.name, NULL::text,
       coalesce(sum(h.pos - coalesce((SELECT min(c.cursor_pos) FROM cursors c
                                      WHERE c.partition_id = h.id), 0)), 0)::bigint
FROM comb.queues q LEFT JOIN heads h ON h.queue_id = q.id
GROUP BY q.name
UNION ALL
SELECT q.name, c.consumer_group, sum(greatest(h.pos - c.cursor_pos - c.settled, 0))::bigint
FROM cursors c JOIN heads h ON h.id = c.partition_id JOIN comb.queues q ON q.id = c.queue_id
GROUP BY q.name, c.consumer_group
ORDER BY 1, 2 NULLS FIRST";

/// What operators alert on, in the same transaction: per queue, the age of the oldest
/// message its slowest group has not passed; per (queue, group), dead letters not requeued
/// (from acks, expired leases, `maxWaitTimeSeconds` and operators alike) and the age of the
/// oldest unsettled message. Index probes per partition and cursor (`comb.partition_stats`,
/// `comb.cursor_lag`), and the dead letters.
const OPERATOR_STATS: &str = "
SELECT 'oldest', q.name, NULL::text,
       coalesce(extract(epoch FROM now() - min(s.oldest_pending_at)), 0)::float8
FROM comb.queues q JOIN comb.partitions p ON p.queue_id = q.id
CROSS JOIN LATERAL comb.partition_stats(p.id) s
GROUP BY q.name
UNION ALL
SELECT 'dead', q.name, d.consumer_group, count(*)::float8
FROM comb.dead_letters d JOIN comb.queues q ON q.id = d.queue_id
WHERE NOT EXISTS (SELECT 1 FROM comb.dead_letter_requeues r WHERE r.dead_letter_id = d.id)
GROUP BY q.name, d.consumer_group
UNION ALL
SELECT 'lag', q.name, c.consumer_group,
       coalesce(extract(epoch FROM now() - min(x.oldest_unsettled_at)), 0)::float8
FROM comb.cursors c JOIN comb.queues q ON q.id = c.queue_id
CROSS JOIN LATERAL comb.cursor_lag(c.partition_id, c.consumer_group) x
GROUP BY q.name, c.consumer_group
ORDER BY 1, 2, 3";

/// Depth per queue and lag per (queue, group), and what [`OPERATOR_STATS`] reads.
pub(crate) struct Backlog {
    /// Pending messages per queue.
    pub(crate) depth: Vec<(String, f64)>,
    /// Unsettled messages per (queue, group).
    pub(crate) lag: Vec<(String, String, f64)>,
    /// Seconds since the oldest message the slowest group has not passed, per queue.
    pub(crate) oldest: Vec<(String, f64)>,
    /// Dead letters not requeued per (queue, group).
    pub(crate) dead: Vec<(String, String, f64)>,
    /// Seconds since the oldest unsettled message per (queue, group).
    pub(crate) lag_seconds: Vec<(String, String, f64)>,
}

/// Reads the backlog of every queue and group in one statement under a short timeout.
pub(crate) async fn measure(pool: &Pool) -> Result<Backlog, DbError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    tx.batch_execute(&format!(
        "SET LOCAL statement_timeout = {}",
        STATS_TIMEOUT.as_millis()
    ))
    .await?;
    let rows = tx.query(STATS, &[]).await?;
    let operator = tx.query(OPERATOR_STATS, &[]).await?;
    tx.commit().await?;
    let mut out = Backlog {
        depth: Vec::new(),
        lag: Vec::new(),
        oldest: Vec::new(),
        dead: Vec::new(),
        lag_seconds: Vec::new(),
    };
    for row in operator {
        let (kind, queue, group): (&str, String, Option<String>) =
            (row.get(0), row.get(1), row.get(2));
        let value: f64 = row.get::<_, f64>(3).max(0.0);
        match (kind, group) {
            ("oldest", _) => out.oldest.push((queue, value)),
            ("dead", Some(g)) => out.dead.push((queue, g, value)),
            ("lag", Some(g)) => out.lag_seconds.push((queue, g, value)),
            _ => {}
        }
    }
    for row in rows {
        let queue: String = row.get(0);
        let value = row.get::<_, i64>(2).max(0) as f64;
        match row.get::<_, Option<String>>(1) {
            None => out.depth.push((queue, value)),
            Some(group) => out.lag.push((queue, group, value)),
        }
    }
    Ok(out)
}
