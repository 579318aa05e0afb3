//! `GET /metrics`: this process's counters and its database pool, in the Prometheus text
//! format, and the depth of each queue and lag of each consumer group as the database has
//! them now. Those come from one statement under a short timeout; when it fails the rest is
//! still served, with `comb_queue_stats_success` 0, so a scrape shows a struggling database
//! rather than failing with it.

use axum::extract::State as AxState;
use axum::http::header;
use axum::response::IntoResponse;

use super::State;
use crate::backlog;
use crate::metrics::{CONTENT_TYPE, Durations, Text};

/// Renders every metric at the moment of the scrape.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    operation_id = "metrics",
    responses((status = 200, description = "Every metric, in the Prometheus text format.", body = String, content_type = "text/plain; version=0.0.4; charset=utf-8"))
)]
pub(crate) async fn metrics(AxState(app): AxState<State>) -> impl IntoResponse {
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
    let pool = app.pools.status();
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
    let (waiting, max_waiting) = app.popper.waiting();
    out.gauge(
        "comb_pops_waiting",
        "Pops waiting for messages on this server (long polls).",
        waiting as f64,
    );
    out.gauge(
        "comb_pops_waiting_max",
        "Most pops that may wait at once on this server; more are answered 429.",
        max_waiting as f64,
    );
    let (wake_groups, wake_queues) = app.wake.sizes();
    let mut registries: Vec<(&str, usize)> = vec![
        ("wake_groups", wake_groups),
        ("wake_queues", wake_queues),
        ("wake_offers", app.wake.offer_entries()),
        ("queue_counters", app.metrics.queues.len()),
        ("leases_granted", crate::lease::granted_entries()),
    ];
    registries.extend(app.catalog.sizes());
    let labels: Vec<[(&str, &str); 1]> =
        registries.iter().map(|(r, _)| [("registry", *r)]).collect();
    let entries: Vec<(&[(&str, &str)], f64)> = labels
        .iter()
        .zip(&registries)
        .map(|(l, (_, n))| (&l[..], *n as f64))
        .collect();
    out.gauge_labelled(
        "comb_registry_entries",
        "Entries of this server's in-memory registries keyed by names clients send: each holds only what exists in the database or what a waiting pop uses, under a cap (see docs/bounded-memory.md).",
        &entries,
    );
    // The pool refuses at once while the database is known to be down; the timeout covers
    // a database that stops answering mid-statement.
    let stats = tokio::time::timeout(backlog::TIMEOUT, backlog::measure(&app.pool)).await;
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

fn render_operator_stats(out: &mut Text, stats: &backlog::Backlog) {
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

fn render_stats(out: &mut Text, stats: &backlog::Backlog) {
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
