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

/// Depth per queue and lag per (queue, group).
struct Stats {
    depth: Vec<(String, f64)>,
    lag: Vec<(String, String, f64)>,
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
    tx.commit().await?;
    let mut out = Stats {
        depth: Vec::new(),
        lag: Vec::new(),
    };
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
    app.replication.render(&mut out);
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

fn render_stats(out: &mut Text, stats: &Stats) {
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
