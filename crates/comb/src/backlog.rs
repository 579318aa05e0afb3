//! Backlog: how much is pending in each queue and how far each group is behind. Figures of
//! small queues are computed now (index probes per partition and cursor; no message is read
//! in bulk); those of queues beyond [`LIVE_PARTITIONS`] come from the newest per-minute
//! snapshot (`comb.queue_figures`, `comb.group_figures`, schema version 12), at most about a
//! minute old, so their cost does not grow with the number of partitions.

use std::time::Duration;

use deadpool_postgres::Pool;

use crate::db::DbError;

/// Partitions (or, for groups, cursors) whose figures one answer computes at request time:
/// the smallest queues first, up to this many partitions in all (10–25 µs each); the
/// rest are read from the newest per-minute snapshot. Queues and groups the snapshot does not
/// hold yet are always computed.
pub(crate) const LIVE_PARTITIONS: i64 = 1_000;

/// How long the depth and lag statement may run; a scrape must stay cheap.
const STATS_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a caller waits for [`measure`] at most: the statement's own timeout and a second
/// to get a connection and hear the answer.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(3);

/// Per queue: pending messages (what `maxSize` limits: not yet passed by the slowest group)
/// and the age of the oldest of them; per (queue, group): unsettled messages and the age of
/// the oldest of them. One round trip.
fn stats_sql() -> String {
    format!(
        "
WITH qf AS (
    SELECT q.name, f.* FROM comb.queue_figures({queue_ids}, {LIVE_PARTITIONS}) f
    {queue_of_figures}
), gf AS (
    SELECT q.name, f.* FROM {subscriptions} s
    CROSS JOIN LATERAL comb.group_figures(s.queue_ids, s.groups, {LIVE_PARTITIONS}) f
    {queue_of_figures}
    WHERE f.partitions > 0
)
SELECT 'depth' AS kind, name, NULL::text AS consumer_group,
       (pending + processing)::float8 AS value FROM qf
UNION ALL
SELECT 'oldest', name, NULL::text,
       coalesce(extract(epoch FROM now() - oldest_pending_at), 0)::float8
FROM qf WHERE partitions > 0
UNION ALL
SELECT 'lag', name, consumer_group, lag::float8 FROM gf
UNION ALL
SELECT 'lag_seconds', name, consumer_group,
       coalesce(extract(epoch FROM now() - oldest_unsettled_at), 0)::float8
FROM gf
UNION ALL
SELECT 'dead', q.name, d.consumer_group, d.dead::float8
FROM {dead} d
{queue_of_dead}
ORDER BY 1, 2, 3",
        queue_ids = crate::catalog::queue_ids!(),
        subscriptions = crate::catalog::subscriptions!(),
        queue_of_figures = crate::catalog::join_queue!("f.queue_id"),
        dead = crate::dead_letter::counts_by_group!(),
        queue_of_dead = crate::catalog::join_queue!("d.queue_id"),
    )
}

/// Depth and oldest pending age per queue; lag, its age and dead letters per (queue, group).
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
    let rows = tx.query(&stats_sql(), &[]).await?;
    tx.commit().await?;
    let mut out = Backlog {
        depth: Vec::new(),
        lag: Vec::new(),
        oldest: Vec::new(),
        dead: Vec::new(),
        lag_seconds: Vec::new(),
    };
    for row in rows {
        let (kind, queue, group): (&str, String, Option<String>) =
            (row.get("kind"), row.get("name"), row.get("consumer_group"));
        let value: f64 = row.get::<_, f64>("value").max(0.0);
        match (kind, group) {
            ("depth", _) => out.depth.push((queue, value)),
            ("oldest", _) => out.oldest.push((queue, value)),
            ("lag", Some(g)) => out.lag.push((queue, g, value)),
            ("lag_seconds", Some(g)) => out.lag_seconds.push((queue, g, value)),
            ("dead", Some(g)) => out.dead.push((queue, g, value)),
            _ => {}
        }
    }
    Ok(out)
}

/// Joins `st`, the figures of the queue `q` ranges over, taken together for the queues whose
/// ids the SQL array expression `ids` lists (which must include `q`'s).
pub(crate) fn queue_figures(ids: &str) -> String {
    format!("JOIN comb.queue_figures({ids}, {LIVE_PARTITIONS}) st ON st.queue_id = q.id")
}

/// Lag of the (queue, group) pairs of the subscriptions `sub` ranges over, as columns of `l`,
/// taken together for the pairs the query `pairs` lists (a select of `queue_id,
/// consumer_group` rows from `comb.subscriptions`, which must include `sub`'s).
pub(crate) fn group_lag(pairs: &str) -> String {
    format!(
        "
JOIN (
    SELECT f.queue_id, f.consumer_group, f.partitions, f.lag, f.leased AS leased,
           f.oldest_unsettled_at, f.figures_at, f.live,
           coalesce(extract(epoch FROM now() - f.oldest_unsettled_at), 0)::float8 AS lag_seconds
    FROM (SELECT array_agg(x.queue_id) AS queue_ids, array_agg(x.consumer_group) AS groups
          FROM ({pairs}) x) a
    CROSS JOIN LATERAL comb.group_figures(a.queue_ids, a.groups, {LIVE_PARTITIONS}) f
) l ON l.queue_id = sub.queue_id AND l.consumer_group = sub.consumer_group"
    )
}
