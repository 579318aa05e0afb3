//! `/queues` (every queue, sortable), `/queues/{queue}` (its partitions, each group's lag per
//! partition, its options) and `/queues/{queue}/tail` (the newest messages, read without
//! consuming anything).

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Path, Query, State as AxumState};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;

use super::overview::pending_age;
use super::{AdminApi, chart, enc, figures, respond, unavailable};
use crate::admin::messages::MessageListing;
use crate::admin::resources::{QueueDetail, QueueFigures, QueueList};
use crate::admin::status::Analytics;
use crate::http::State;

#[derive(Template)]
#[template(path = "dashboard/queues.html")]
struct QueuesPage {
    rows: Vec<QueueRow>,
    headers: Vec<SortHeader>,
    note: Option<String>,
}

struct QueueRow {
    name: String,
    href: String,
    depth: String,
    in_flight: String,
    dead: String,
    dead_warn: bool,
    oldest: String,
    partitions: String,
    throughput: String,
    spark: String,
}

/// A column header that sorts the table by itself (and flips the direction when it already
/// does).
struct SortHeader {
    label: &'static str,
    href: String,
    /// `ascending`, `descending` or `none`, for `aria-sort`.
    aria: &'static str,
    numeric: bool,
}

/// The queues table's sort order, from the query string.
#[derive(Deserialize)]
pub(crate) struct Sort {
    sort: Option<String>,
    dir: Option<String>,
}

const COLUMNS: &[(&str, &str, bool)] = &[
    ("name", "Queue", false),
    ("depth", "Pending", true),
    ("inflight", "In flight", true),
    ("dead", "Dead letters", true),
    ("oldest", "Oldest pending", true),
    ("partitions", "Partitions", true),
    ("throughput", "Pushed/s (1 h)", true),
];

/// `GET /queues`.
pub(crate) async fn list(
    AxumState(state): AxumState<State>,
    headers: HeaderMap,
    Query(sort): Query<Sort>,
) -> Response {
    let api = AdminApi::new(&state, &headers);
    let mut note = None;
    let queues = match api
        .get_as::<QueueList>("/api/v1/resources/queues?limit=1000")
        .await
    {
        Ok(q) => q.queues,
        Err(e) => {
            note = Some(unavailable("Queues", &e));
            Vec::new()
        }
    };
    // Throughput per queue over the last hour, from each queue's per-minute figures: the
    // growth of its stored total. One call per queue, for the first THROUGHPUT_QUEUES.
    let to = chrono::Utc::now();
    let from = enc(&(to - chrono::Duration::hours(1)).to_rfc3339());
    let names: Vec<String> = queues
        .iter()
        .take(THROUGHPUT_QUEUES)
        .map(|q| q.name.clone())
        .collect();
    let series = futures_util::future::join_all(names.iter().map(|n| {
        api.get_as::<Analytics>(format!(
            "/api/v1/status/analytics?queue={}&from={from}",
            enc(n)
        ))
    }))
    .await;
    let throughput: BTreeMap<String, (f64, Vec<f64>)> = names
        .into_iter()
        .zip(series)
        .filter_map(|(name, s)| Some((name, pushed_per_minute(&s.ok()?))))
        .collect();

    let key = sort.sort.as_deref().unwrap_or("depth");
    let key = COLUMNS
        .iter()
        .find(|c| c.0 == key)
        .map(|c| c.0)
        .unwrap_or("depth");
    let descending = match sort.dir.as_deref() {
        Some("asc") => false,
        Some("desc") => true,
        _ => key != "name",
    };
    let mut rows: Vec<(&QueueFigures, f64)> = queues
        .iter()
        .map(|q| (q, throughput.get(&q.name).map(|t| t.0).unwrap_or(0.0)))
        .collect();
    rows.sort_by(|(a, ta), (b, tb)| {
        let number = |q: &QueueFigures, t: f64| match key {
            "depth" => depth(q) as f64,
            "inflight" => in_flight(q) as f64,
            "dead" => dead_letters(q) as f64,
            "oldest" => queue_oldest(q).unwrap_or(-1.0),
            "partitions" => q.partitions.unwrap_or(0) as f64,
            _ => t,
        };
        let order = if key == "name" {
            a.name.cmp(&b.name)
        } else {
            number(a, *ta).total_cmp(&number(b, *tb))
        };
        if descending { order.reverse() } else { order }
    });

    let page = QueuesPage {
        headers: COLUMNS
            .iter()
            .map(|(k, label, numeric)| {
                let active = *k == key;
                // A new column sorts its natural way (names A→Z, figures largest first);
                // the current one flips.
                let next = match (active, descending) {
                    (true, true) => "asc",
                    (true, false) => "desc",
                    (false, _) if *k == "name" => "asc",
                    (false, _) => "desc",
                };
                SortHeader {
                    label,
                    href: format!("/queues?sort={k}&dir={next}"),
                    aria: match (active, descending) {
                        (false, _) => "none",
                        (true, true) => "descending",
                        (true, false) => "ascending",
                    },
                    numeric: *numeric,
                }
            })
            .collect(),
        rows: rows
            .into_iter()
            .map(|(q, t)| {
                let name = q.name.clone();
                let spark = throughput
                    .get(&name)
                    .map(|t| chart::sparkline(&t.1))
                    .unwrap_or_else(|| chart::sparkline(&[]));
                let dead = dead_letters(q);
                QueueRow {
                    href: format!("/queues/{}", enc(&name)),
                    depth: figures::count(depth(q)),
                    in_flight: figures::count(in_flight(q)),
                    dead: figures::count(dead),
                    dead_warn: dead > 0,
                    oldest: figures::age(queue_oldest(q)),
                    partitions: figures::count(q.partitions.unwrap_or(0)),
                    throughput: figures::rate(t),
                    spark,
                    name,
                }
            })
            .collect(),
        note,
    };
    let query = format!(
        "/queues?sort={key}&dir={}",
        if descending { "desc" } else { "asc" }
    );
    respond(
        page.render(),
        "Queues",
        "queues",
        Some((query, 5)),
        &headers,
    )
}

/// A queue's pending messages.
fn depth(q: &QueueFigures) -> i64 {
    q.messages.pending.unwrap_or(0)
}

/// A queue's messages handed out under a lease.
fn in_flight(q: &QueueFigures) -> i64 {
    q.messages.processing.unwrap_or(0)
}

/// A queue's dead letters.
fn dead_letters(q: &QueueFigures) -> i64 {
    q.messages.dead_letters.or(q.dead_letters).unwrap_or(0)
}

/// Age of a queue's oldest pending message; none when nothing is pending.
fn queue_oldest(q: &QueueFigures) -> Option<f64> {
    pending_age(q.oldest_pending_at, q.oldest_pending_age_seconds)
}

/// Queues whose throughput the list shows (one analytics call each).
const THROUGHPUT_QUEUES: usize = 100;

/// From a queue's analytics: messages pushed per second over the series, and per bucket (the
/// growth of its stored total between consecutive buckets).
fn pushed_per_minute(analytics: &Analytics) -> (f64, Vec<f64>) {
    let points: Vec<(chrono::DateTime<chrono::Utc>, f64)> = analytics
        .time_series
        .iter()
        .filter_map(|b| Some((b.timestamp, b.messages? as f64)))
        .collect();
    let growth: Vec<f64> = points
        .windows(2)
        .map(|w| (w[1].1 - w[0].1).max(0.0))
        .collect();
    let rate = match (points.first(), points.last()) {
        (Some(a), Some(b)) if b.0 > a.0 => {
            growth.iter().sum::<f64>() / (b.0 - a.0).num_seconds().max(1) as f64
        }
        _ => 0.0,
    };
    (rate, growth)
}

#[derive(Template)]
#[template(path = "dashboard/queue.html")]
struct QueuePage {
    name: String,
    name_enc: String,
    summary: Vec<(&'static str, String)>,
    /// When the queue's totals were taken, if not just now.
    figures_note: Option<String>,
    options: Vec<(String, String)>,
    groups: Vec<String>,
    partitions: Vec<PartitionRow>,
    /// Partitions of the queue in all.
    partition_count: i64,
    /// The rows shown: `first`–`last` (1-based), empty when none.
    shown: String,
    previous: Option<String>,
    next: Option<String>,
    notes: Vec<String>,
}

struct PartitionRow {
    name: String,
    depth: String,
    in_flight: String,
    oldest: String,
    /// Lag of each group of `groups`, in its order: messages and age.
    lags: Vec<(String, String)>,
}

/// Partitions a page of a queue shows: their figures and each group's lag there are
/// computed for these rows only, in one administration call.
const PAGE: i64 = 500;

/// Which page of partitions a queue's page shows.
#[derive(Deserialize)]
pub(crate) struct PartitionPage {
    offset: Option<u64>,
}

/// `GET /queues/{queue}[?offset=N]`.
pub(crate) async fn detail(
    AxumState(state): AxumState<State>,
    headers: HeaderMap,
    Path(queue): Path<String>,
    Query(at): Query<PartitionPage>,
) -> Response {
    let api = AdminApi::new(&state, &headers);
    let q = enc(&queue);
    let offset = (at.offset.unwrap_or(0).min(crate::admin::MAX_OFFSET) as i64 / PAGE) * PAGE;
    let mut notes = Vec::new();
    let detail = api
        .get_as::<QueueDetail>(format!(
            "/api/v1/resources/queues/{q}?limit={PAGE}&offset={offset}"
        ))
        .await
        .map_err(|e| notes.push(unavailable("This queue", &e)))
        .ok();
    let totals = detail.as_ref().map(|d| &d.queue);
    let total = totals.and_then(|f| f.partitions).unwrap_or(0).max(0);
    let partitions = detail.as_ref().map_or(&[][..], |d| &d.partition_list[..]);
    let group_names: Vec<String> = detail
        .iter()
        .flat_map(|d| &d.consumer_groups)
        .map(|g| g.name.clone())
        .collect();

    let rows: Vec<PartitionRow> = partitions
        .iter()
        .map(|p| {
            // Each group's exact lag on this partition, by group name.
            let lag: BTreeMap<String, (i64, Option<f64>)> = p
                .group_lag
                .iter()
                .map(|g| {
                    let messages = g.lag.unwrap_or(0);
                    let seconds = (messages > 0).then_some(g.lag_seconds);
                    (g.consumer_group.clone(), (messages, seconds))
                })
                .collect();
            let f = &p.figures;
            PartitionRow {
                depth: figures::count(f.messages.pending.unwrap_or(0)),
                in_flight: figures::count(f.messages.processing.unwrap_or(0)),
                oldest: figures::age(pending_age(
                    f.oldest_pending_at,
                    f.oldest_pending_age_seconds,
                )),
                lags: group_names
                    .iter()
                    .map(|g| match lag.get(g) {
                        Some((m, s)) => (figures::count(*m), figures::age(*s)),
                        None => ("—".into(), "—".into()),
                    })
                    .collect(),
                name: f.name.clone(),
            }
        })
        .collect();
    let options = match totals.and_then(|f| f.options.as_object()) {
        Some(map) => map
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    match v {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    },
                )
            })
            .collect(),
        None => Vec::new(),
    };
    let shown = rows.len() as i64;
    let link = |offset: i64| format!("/queues/{q}?offset={offset}");
    let page = QueuePage {
        name_enc: q.clone(),
        summary: vec![
            ("Pending", figures::count(totals.map_or(0, depth))),
            ("In flight", figures::count(totals.map_or(0, in_flight))),
            (
                "Dead letters",
                figures::count(totals.map_or(0, dead_letters)),
            ),
            (
                "Oldest pending",
                figures::age(totals.and_then(queue_oldest)),
            ),
            ("Partitions", figures::count(total)),
        ],
        figures_note: totals.and_then(figures_note),
        shown: if shown > 0 {
            format!(
                "{}–{}",
                figures::count(offset + 1),
                figures::count(offset + shown)
            )
        } else {
            String::new()
        },
        previous: (offset > 0).then(|| link((offset - PAGE).max(0))),
        next: (offset + shown < total).then(|| link(offset + PAGE)),
        partition_count: total,
        partitions: rows,
        options,
        groups: group_names,
        notes,
        name: queue.clone(),
    };
    // A queue of thousands of partitions is not redrawn every few seconds.
    let refresh = (total <= PAGE).then(|| (format!("/queues/{q}"), 5));
    respond(page.render(), &queue, "queues", refresh, &headers)
}

/// "Totals as of 12:03:10 UTC (41 s ago)" when a queue's totals come from the per-minute
/// snapshot rather than from now.
fn figures_note(detail: &QueueFigures) -> Option<String> {
    if detail.figures_live != Some(false) {
        return None;
    }
    let at = detail.figures_at?;
    let age = detail.figures_age_seconds;
    Some(format!(
        "Totals as of {} UTC ({} ago): a queue this large is summed once a minute; each \
         partition below is exact.",
        at.format("%H:%M:%S"),
        figures::age(age)
    ))
}

#[derive(Template)]
#[template(path = "dashboard/tail.html")]
struct TailPage {
    name: String,
    messages: Vec<TailRow>,
    note: Option<String>,
}

pub(crate) struct TailRow {
    pub partition: String,
    pub status: String,
    pub created: String,
    pub href: String,
    pub transaction_id: String,
    pub payload: String,
}

/// Messages of a listing, for a table.
pub(crate) fn message_rows(listing: MessageListing) -> Vec<TailRow> {
    listing
        .messages
        .into_iter()
        .map(|m| {
            let mut payload = m.data.to_string();
            if payload.len() > 200 {
                let cut = (0..=200)
                    .rev()
                    .find(|i| payload.is_char_boundary(*i))
                    .unwrap_or(0);
                payload.truncate(cut);
                payload.push('…');
            }
            TailRow {
                partition: m.partition,
                status: m.status,
                created: figures::iso(m.created_at),
                href: format!("/messages/{}/{}", m.partition_id, enc(&m.transaction_id)),
                transaction_id: m.transaction_id,
                payload,
            }
        })
        .collect()
}

/// `GET /queues/{queue}/tail`: the newest 50 messages of the queue, refreshed every two
/// seconds. Reading a listing moves no cursor: the tail consumes nothing.
pub(crate) async fn tail(
    AxumState(state): AxumState<State>,
    headers: HeaderMap,
    Path(queue): Path<String>,
) -> Response {
    let api = AdminApi::new(&state, &headers);
    let mut note = None;
    let messages = match api
        .get_as::<MessageListing>(format!("/api/v1/messages?queue={}&limit=50", enc(&queue)))
        .await
    {
        Ok(listing) => {
            let mut rows = message_rows(listing);
            // The listing walks partitions in turn; the tail reads newest first.
            rows.sort_by(|a, b| b.created.cmp(&a.created));
            rows
        }
        Err(e) => {
            note = Some(unavailable("Messages", &e));
            Vec::new()
        }
    };
    let page = TailPage {
        name: queue.clone(),
        messages,
        note,
    };
    let href = format!("/queues/{}/tail", enc(&queue));
    respond(
        page.render(),
        &format!("Tail of {queue}"),
        "queues",
        Some((href, 2)),
        &headers,
    )
}
