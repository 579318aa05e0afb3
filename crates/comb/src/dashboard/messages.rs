//! `/messages/{partitionId}/{transactionId}`: one message — its payload, where it is, its
//! attempts and errors, and the traces consumers recorded on it.

use askama::Template;
use axum::extract::{Path, State as AxumState};
use axum::http::HeaderMap;
use axum::response::Response;

use chrono::{DateTime, SecondsFormat, Utc};

use super::{AdminApi, enc, figures, respond, unavailable};
use crate::admin::messages::MessageDetail;
use crate::admin::traces::MessageTraces;
use crate::http::State;

#[derive(Template)]
#[template(path = "dashboard/message.html")]
struct MessagePage {
    transaction_id: String,
    facts: Vec<(&'static str, String)>,
    queue_href: Option<String>,
    payload: String,
    groups: Vec<GroupState>,
    errors: Vec<ErrorRow>,
    traces: Vec<TraceRow>,
    notes: Vec<String>,
}

struct GroupState {
    name: String,
    status: String,
    attempts: String,
}

struct ErrorRow {
    at: String,
    group: String,
    error: String,
    attempts: String,
    requeued: Option<String>,
}

struct TraceRow {
    at: String,
    name: String,
    event: String,
    group: String,
    data: String,
}

/// `GET /messages/{partitionId}/{transactionId}`.
pub(crate) async fn detail(
    AxumState(state): AxumState<State>,
    headers: HeaderMap,
    Path((partition_id, transaction_id)): Path<(String, String)>,
) -> Response {
    let api = AdminApi::new(&state, &headers);
    let ids = format!("{}/{}", enc(&partition_id), enc(&transaction_id));
    let (message, traces) = tokio::join!(
        api.get_as::<MessageDetail>(format!("/api/v1/messages/{ids}")),
        api.get_as::<MessageTraces>(format!("/api/v1/traces/{ids}")),
    );
    let mut notes = Vec::new();
    let message = message
        .map_err(|e| notes.push(unavailable("This message", &e)))
        .ok();
    let m = message.as_ref();
    let fact = |f: &dyn Fn(&MessageDetail) -> Option<String>, absent: &str| {
        m.and_then(f).unwrap_or_else(|| absent.into())
    };
    let facts = vec![
        ("Queue", fact(&|m| Some(m.queue.clone()), "—")),
        ("Partition", fact(&|m| Some(m.partition.clone()), "—")),
        ("Position", fact(&|m| Some(m.position.to_string()), "—")),
        ("Created", fact(&|m| Some(iso(&m.created_at)), "—")),
        ("Trace id", fact(&|m| m.trace_id.clone(), "—")),
        ("Message id", fact(&|m| Some(m.id.to_string()), "—")),
        (
            "Producer",
            fact(&|m| m.producer_sub.clone(), "— (pushed without a token)"),
        ),
    ];
    // Where each group is with it: status and attempts.
    let groups = m
        .map(|m| m.consumer_groups.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|g| GroupState {
            name: g.name.clone(),
            status: g.status.clone(),
            attempts: figures::count(g.attempts.into()),
        })
        .collect();
    // Its error history: each time a group dead-lettered it, and whether it was requeued.
    let errors = m
        .map(|m| m.dead_letters.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|d| ErrorRow {
            at: iso(&d.moved_to_dlq_at),
            group: d.consumer_group.clone(),
            error: d
                .error_message
                .clone()
                .unwrap_or_else(|| "(no error given)".into()),
            attempts: figures::count(d.retry_count.into()),
            requeued: d.requeued_at.as_ref().map(iso),
        })
        .collect();
    let traces = match traces {
        Ok(t) => t
            .traces
            .into_iter()
            .map(|t| TraceRow {
                at: iso(&t.created_at),
                name: t.trace_names.join(", "),
                event: t.event_type,
                group: t.consumer_group,
                data: t.data.to_string(),
            })
            .collect(),
        Err(e) => {
            notes.push(unavailable("Traces", &e));
            Vec::new()
        }
    };
    let page = MessagePage {
        transaction_id: transaction_id.clone(),
        facts,
        queue_href: m.map(|m| format!("/queues/{}", enc(&m.queue))),
        payload: m
            .map(|m| serde_json::to_string_pretty(&m.data).unwrap_or_default())
            .unwrap_or_else(|| "null".into()),
        groups,
        errors,
        traces,
        notes,
    };
    respond(
        page.render(),
        &format!("Message {transaction_id}"),
        "queues",
        None,
        &headers,
    )
}

/// A time as the answers write it (UTC, milliseconds, `Z`).
fn iso(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}
