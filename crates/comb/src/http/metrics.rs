//! `GET /metrics`: this process's counters and its database pool, in the Prometheus text
//! format, and the depth of each queue and lag of each consumer group as the database has
//! them now. Those come from one statement under a short timeout; when it fails the rest is
//! still served, with `comb_queue_stats_success` 0, so a scrape shows a struggling database
//! rather than failing with it.

use std::time::Duration;

use axum::extract::State as AxState;
use axum::http::header;
use axum::response::IntoResponse;

use super::State;
use crate::db::DbError;
use crate::metrics::{CONTENT_TYPE, Durations, Text};

/// How long the depth and lag statement may run; a scrape must stay cheap.
const STATS_TIMEOUT: Duration = Duration::from_secs(2);

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

/// What operators alert on, in one more round trip: per queue, the age of the oldest
/// message its slowest group has not passed; per (queue, group), dead letters not requeued
/// (from acks, expired leases, `maxWaitTimeSeconds` and operators alike) and the age of the
/// oldest unsettled message. Index probes per partition and cursor, and the dead letters.
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
struct Stats {
    depth: Vec<(String, f64)>,
    lag: Vec<(String, String, f64)>,
    oldest: Vec<(String, f64)>,
    dead: Vec<(String, String, f64)>,
    lag_seconds: Vec<(String, String, f64)>,
}

async fn stats(app: &State) -> Result<Stats, DbError> {
    let mut client = app.pool.get().await?;
    let tx = client.transaction().await?;
    tx.batch_execute(&format!(
        "SET LOCAL statement_timeout = {}",
        STATS_TIMEOUT.as_millis()
    ))
    .await?;
    let rows = tx.query(STATS, &[]).await?;
    let operator = tx.query(OPERATOR_STATS, &[]).await?;
    tx.commit().await?;
    let mut out = Stats {
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

/// Renders every metric at the moment of the scrape.
pub async fn metrics(AxState(app): AxState<State>) -> impl IntoResponse {
    let mut out = Text::default();
    app.metrics.render(&mut out);
    let routes = super::routes();
    let labels: Vec<[(&str, &str); 2]> = routes
        .iter()
        .map(|(method, path, _)| [("method", method.as_str()), ("route", *path)])
        .collect();
    let series: Vec<(&[(&str, &str)], &Durations)> = labels
        .iter()
        .zip(&app.durations)
        .map(|(l, d)| (&l[..], d))
        .collect();
    out.histogram(
        "comb_http_request_duration_seconds",
        "Time from routing a request to its response's head, by route (a long poll's wait included).",
        &series,
    );
    let pool = app.pool.status();
    let in_use = pool.size.saturating_sub(pool.available);
    out.gauge_labelled(
        "comb_db_pool_connections",
        "Connections of the request pool, open and idle or handed out to a request.",
        &[
            (&[("state", "idle")], pool.available as f64),
            (&[("state", "in_use")], in_use as f64),
        ],
    );
    out.gauge(
        "comb_db_pool_max_connections",
        "Most connections the request pool opens.",
        pool.max_size as f64,
    );
    out.gauge(
        "comb_db_pool_waiting",
        "Requests waiting for a connection of the request pool.",
        pool.waiting as f64,
    );
    // The pool refuses at once while the database is known to be down; the timeout covers
    // a database that stops answering mid-statement.
    let stats = tokio::time::timeout(STATS_TIMEOUT + Duration::from_secs(1), stats(&app)).await;
    let stats = match stats {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "metrics: queue statistics unavailable");
            None
        }
        Err(_) => None,
    };
    out.gauge(
        "comb_queue_stats_success",
        "1 when the depth and lag statement of this scrape answered, else 0.",
        if stats.is_some() { 1.0 } else { 0.0 },
    );
    if let Some(stats) = stats {
        render_stats(&mut out, &stats);
    }
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], out.finish())
}

fn by_queue(out: &mut Text, name: &str, help: &str, values: &[(String, f64)]) {
    if values.is_empty() {
        return;
    }
    let samples: Vec<([(&str, &str); 1], f64)> = values
        .iter()
        .map(|(q, v)| ([("queue", q.as_str())], *v))
        .collect();
    let samples: Vec<(&[(&str, &str)], f64)> = samples.iter().map(|(l, v)| (&l[..], *v)).collect();
    out.gauge_labelled(name, help, &samples);
}

fn by_group(out: &mut Text, name: &str, help: &str, values: &[(String, String, f64)]) {
    if values.is_empty() {
        return;
    }
    let samples: Vec<([(&str, &str); 2], f64)> = values
        .iter()
        .map(|(q, g, v)| ([("queue", q.as_str()), ("group", g.as_str())], *v))
        .collect();
    let samples: Vec<(&[(&str, &str)], f64)> = samples.iter().map(|(l, v)| (&l[..], *v)).collect();
    out.gauge_labelled(name, help, &samples);
}

fn render_operator_stats(out: &mut Text, stats: &Stats) {
    by_queue(
        out,
        "comb_queue_oldest_pending_seconds",
        "Age of the oldest message of the queue its slowest consumer group has not passed (0 when none). Database-wide.",
        &stats.oldest,
    );
    by_group(
        out,
        "comb_dead_letters",
        "Dead letters of the consumer group in the queue, not requeued: from acks, expired leases, maxWaitTimeSeconds and operators. Database-wide.",
        &stats.dead,
    );
    by_group(
        out,
        "comb_group_lag_seconds",
        "Age of the oldest message the consumer group has not settled in the queue (0 when none). Database-wide.",
        &stats.lag_seconds,
    );
}

fn render_stats(out: &mut Text, stats: &Stats) {
    render_operator_stats(out, stats);
    if !stats.depth.is_empty() {
        let samples: Vec<([(&str, &str); 1], f64)> = stats
            .depth
            .iter()
            .map(|(q, v)| ([("queue", q.as_str())], *v))
            .collect();
        let samples: Vec<(&[(&str, &str)], f64)> =
            samples.iter().map(|(l, v)| (&l[..], *v)).collect();
        out.gauge_labelled(
            "comb_queue_depth_messages",
            "Messages of the queue not yet passed by its slowest consumer group (what maxSize limits). Database-wide: the same on every server.",
            &samples,
        );
    }
    if !stats.lag.is_empty() {
        let samples: Vec<([(&str, &str); 2], f64)> = stats
            .lag
            .iter()
            .map(|(q, g, v)| ([("queue", q.as_str()), ("group", g.as_str())], *v))
            .collect();
        let samples: Vec<(&[(&str, &str)], f64)> =
            samples.iter().map(|(l, v)| (&l[..], *v)).collect();
        out.gauge_labelled(
            "comb_group_lag_messages",
            "Messages of the queue the consumer group has not settled yet. Database-wide: the same on every server.",
            &samples,
        );
    }
}
