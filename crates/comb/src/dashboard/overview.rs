//! `/`: how the system is doing — throughput and errors over the last hour, total depth, the
//! oldest pending message, the servers connected.

use askama::Template;
use axum::extract::State as AxumState;
use axum::http::HeaderMap;
use axum::response::Response;
use chrono::{Duration, Utc};

use super::chart::{self, Series};
use super::{AdminApi, enc, figures, respond, unavailable};
use crate::admin::resources::{QueueFigures, QueueList};
use crate::admin::servers::ServerList;
use crate::admin::status::Status;
use crate::http::State;
use crate::http::streams::QueriesOut;

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
    let hour_ago = now - Duration::hours(1);
    let (status, workers, queues, streams) = tokio::join!(
        api.get_as::<Status>(format!(
            "/api/v1/status?from={}&to={}",
            enc(&hour_ago.to_rfc3339()),
            enc(&now.to_rfc3339())
        )),
        api.get_as::<ServerList>("/api/v1/system/servers"),
        api.get_as::<QueueList>("/api/v1/resources/queues?limit=1000"),
        api.get_as::<QueriesOut>("/api/v1/streams/queries"),
    );
    let mut notes = Vec::new();
    let mut throughput_note = None;
    let status = status
        .map_err(|e| {
            throughput_note = Some(unavailable("Throughput", &e));
            notes.push(unavailable("Totals", &e));
        })
        .ok();
    let queues = queues.map(|q| q.queues).unwrap_or_else(|e| {
        notes.push(unavailable("Queues", &e));
        Vec::new()
    });
    let overview = status.as_ref().map(|s| &s.overview);
    let depth_total = overview.and_then(|o| o.messages.pending).unwrap_or(0);
    let oldest =
        overview.and_then(|o| pending_age(o.oldest_pending_at, o.oldest_pending_age_seconds));
    let dead = overview.and_then(|o| o.messages.dead_letters).unwrap_or(0);
    let queue_count = overview.map_or(0, |o| o.queues);
    // Streams queries registered (Queen's streams SDK), with the source partitions they run on.
    let streams = streams
        .map(|s| {
            let queries = s.queries;
            let partitions: usize = queries.iter().map(|q| q.partitions.len()).sum();
            format!(
                "{} ({} partitions)",
                figures::count(queries.len() as i64),
                figures::count(partitions as i64)
            )
        })
        .unwrap_or_else(|_| "—".to_string());
    // Servers in the registry: each registers as it starts and beats every few seconds.
    let servers = workers
        .map(|w| figures::count(w.servers.len() as i64))
        .unwrap_or_else(|_| "—".to_string());

    // Sixty one-minute slots ending now; the API lists only minutes that saw something.
    let mut pushed = vec![0.0; 60];
    let mut done = vec![0.0; 60];
    let mut errors = vec![0.0; 60];
    for b in status.iter().flat_map(|s| &s.throughput) {
        let slot = (b.timestamp - hour_ago).num_minutes();
        if let Ok(slot @ 0..60) = usize::try_from(slot) {
            pushed[slot] += b.pushed as f64;
            done[slot] += b.acked as f64;
            errors[slot] += b.failed as f64;
        }
    }
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
        "{} pushed · {} completed · {} errors in the last hour ({} pushed on average)",
        figures::count(sum(&pushed) as i64),
        figures::count(sum(&done) as i64),
        figures::count(sum(&errors) as i64),
        figures::rate(sum(&pushed) / 3600.0),
    );

    let depth = |q: &QueueFigures| q.messages.pending.unwrap_or(0);
    let mut deepest: Vec<&QueueFigures> = queues.iter().collect();
    deepest.sort_by_key(|q| std::cmp::Reverse(depth(q)));
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
                label: "Stream queries",
                value: streams,
                id: "stream-queries",
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
                name: q.name.clone(),
                depth: figures::count(depth(q)),
                oldest: figures::age(pending_age(
                    q.oldest_pending_at,
                    q.oldest_pending_age_seconds,
                )),
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

/// Age of the oldest pending message of a queue, partition or the whole system; none when
/// nothing is pending.
pub(crate) fn pending_age(at: Option<chrono::DateTime<Utc>>, age_seconds: f64) -> Option<f64> {
    at.map(|_| age_seconds)
}
