//! `/`: how the system is doing — throughput and errors over the last hour, total depth, the
//! oldest pending message, the servers connected.

use askama::Template;
use axum::extract::State as AxumState;
use axum::http::HeaderMap;
use axum::response::Response;
use chrono::{Duration, Utc};

use super::chart::{self, Series};
use super::{AdminApi, Json, figures, respond, unavailable};
use crate::http::State;

#[derive(Template)]
#[template(path = "dashboard/overview.html")]
struct Overview {
    cards: Vec<Card>,
    chart: String,
    totals: String,
    /// Why there is no chart, when there is none.
    throughput_note: Option<String>,
    queues: Vec<QueueLine>,
    notes: Vec<String>,
}

/// A headline number.
struct Card {
    label: &'static str,
    value: String,
    id: &'static str,
    warn: bool,
}

/// The deepest queues, linked.
struct QueueLine {
    name: String,
    depth: String,
    oldest: String,
}

/// `GET /`.
pub(crate) async fn page(AxumState(state): AxumState<State>, headers: HeaderMap) -> Response {
    let api = AdminApi::new(&state, &headers);
    let now = Utc::now();
    let from = (now - Duration::hours(1)).to_rfc3339();
    let to = now.to_rfc3339();
    let analytics_path = format!(
        "/api/v1/status/analytics?from={}&to={}&interval=minute",
        super::enc(&from),
        super::enc(&to)
    );
    let (overview, analytics, status, queues) = tokio::join!(
        api.get("/api/v1/resources/overview"),
        api.get(&analytics_path),
        api.get("/api/v1/status"),
        api.get("/api/v1/resources/queues?limit=1000"),
    );
    let mut notes = Vec::new();

    let overview = overview.unwrap_or_else(|e| {
        notes.push(unavailable("Totals", &e));
        Json::default()
    });
    let queues = queues.map(|q| q.list(&["queues"])).unwrap_or_else(|e| {
        notes.push(unavailable("Queues", &e));
        Vec::new()
    });
    let depth_total = overview.count(DEPTH);
    let oldest = oldest_pending(&overview);
    let dead = overview.count(DEAD);
    let queue_count = overview.count(&["queues"]);
    let servers = status
        .as_ref()
        .ok()
        .and_then(|s| {
            s.num(&["servers.connected", "servers", "workers.connected"])
                .or_else(|| {
                    let list = s.list(&["servers", "workers"]);
                    (!list.is_empty()).then_some(list.len() as f64)
                })
        })
        .map(|n| figures::count(n as i64))
        .unwrap_or_else(|| "—".to_string());

    let buckets = analytics
        .as_ref()
        .map(|a| {
            a.list(&[
                "throughput.timeSeries",
                "timeSeries",
                "throughput",
                "buckets",
                "series",
            ])
        })
        .unwrap_or_default();
    let throughput_note = analytics
        .as_ref()
        .err()
        .map(|e| unavailable("Throughput", e));
    let pushed: Vec<f64> = buckets
        .iter()
        .map(|b| b.num(PUSHED).unwrap_or(0.0))
        .collect();
    let done: Vec<f64> = buckets.iter().map(|b| b.num(DONE).unwrap_or(0.0)).collect();
    let errors: Vec<f64> = buckets
        .iter()
        .map(|b| b.num(ERRORS).unwrap_or(0.0))
        .collect();
    let minutes = buckets.len().max(1) as f64;
    let chart = chart::bars(
        "Messages per minute over the last hour",
        &[
            Series {
                name: "pushed",
                class: "s-in",
                values: &pushed,
            },
            Series {
                name: "completed",
                class: "s-out",
                values: &done,
            },
            Series {
                name: "errors",
                class: "s-err",
                values: &errors,
            },
        ],
        ["−60 min", "−30 min", "now"],
    );
    let sum = |v: &[f64]| v.iter().sum::<f64>();
    let totals = format!(
        "{} pushed · {} completed · {} errors in the last hour ({} pushed per second)",
        figures::count(sum(&pushed) as i64),
        figures::count(sum(&done) as i64),
        figures::count(sum(&errors) as i64),
        figures::rate(sum(&pushed) / (minutes * 60.0)),
    );

    let mut deepest: Vec<&Json> = queues.iter().collect();
    deepest.sort_by_key(|q| std::cmp::Reverse(queue_depth(q)));
    let page = Overview {
        cards: vec![
            Card {
                label: "Pending messages",
                value: figures::count(depth_total),
                id: "total-depth",
                warn: false,
            },
            Card {
                label: "Oldest pending",
                value: figures::age(oldest),
                id: "oldest-pending",
                warn: oldest.is_some_and(|s| s > 300.0),
            },
            Card {
                label: "Dead letters",
                value: figures::count(dead),
                id: "dead-letters",
                warn: dead > 0,
            },
            Card {
                label: "Queues",
                value: figures::count(queue_count),
                id: "queue-count",
                warn: false,
            },
            Card {
                label: "Servers connected",
                value: servers,
                id: "servers",
                warn: false,
            },
        ],
        chart,
        totals,
        throughput_note,
        queues: deepest
            .into_iter()
            .take(10)
            .map(|q| QueueLine {
                name: q.text(&["name"]).unwrap_or_default(),
                depth: figures::count(queue_depth(q)),
                oldest: figures::age(oldest_pending(q)),
            })
            .collect(),
        notes,
    };
    respond(
        page.render(),
        "Overview",
        "overview",
        Some(("/".into(), 5)),
        &headers,
    )
}

/// Where the administration API's answers hold the figures pages show.
pub(crate) const DEPTH: &[&str] = &["messages.pending"];
pub(crate) const IN_FLIGHT: &[&str] = &["messages.processing"];
pub(crate) const DEAD: &[&str] = &["messages.deadLetters", "deadLetters"];

/// Age of the oldest pending message of a queue, partition or the whole system; none when
/// nothing is pending.
pub(crate) fn oldest_pending(q: &Json) -> Option<f64> {
    if q.at("oldestPendingAt").is_null() {
        return None;
    }
    q.num(&["oldestPendingAgeSeconds"])
}
pub(crate) const PUSHED: &[&str] = &["ingested", "pushed", "messagesIn", "in"];
pub(crate) const DONE: &[&str] = &["processed", "completed", "acked", "messagesOut", "out"];
pub(crate) const ERRORS: &[&str] = &["failed", "errors", "deadLettered", "dlq"];

/// A queue's pending messages.
pub(crate) fn queue_depth(q: &Json) -> i64 {
    q.count(DEPTH)
}
