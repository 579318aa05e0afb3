//! `/messages/{partitionId}/{transactionId}`: one message — its payload, where it is, its
//! attempts and errors, and the traces consumers recorded on it.

use askama::Template;
use axum::extract::{Path, State as AxumState};
use axum::http::HeaderMap;
use axum::response::Response;

use super::{AdminApi, Json, enc, figures, respond, unavailable};
use crate::http::State;

#[derive(Template)]
#[template(path = "dashboard/message.html")]
struct MessagePage {
    transaction_id: String,
    facts: Vec<(&'static str, String)>,
    queue_href: Option<String>,
    payload: String,
    errors: Vec<(String, String)>,
    traces: Vec<TraceRow>,
    notes: Vec<String>,
}

struct TraceRow {
    at: String,
    name: String,
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
        api.get(format!("/api/v1/messages/{ids}")),
        api.get(format!("/api/v1/traces/{ids}")),
    );
    let mut notes = Vec::new();
    let message = message.unwrap_or_else(|e| {
        notes.push(unavailable("This message", &e));
        Json::default()
    });
    let m = if message.at("message").is_object() {
        message.get("message")
    } else {
        message.clone()
    };
    let queue = m.text(&["queue", "queueName"]);
    let payload = {
        let p = m.at("payload");
        if p.is_null() { m.at("data") } else { p }
    };
    let fact = |label: &'static str, paths: &[&str]| {
        (label, m.text(paths).unwrap_or_else(|| "—".to_string()))
    };
    let facts = vec![
        fact("Queue", &["queue", "queueName"]),
        fact("Partition", &["partition", "partitionName"]),
        fact("Status", &["status"]),
        fact("Created", &["createdAt", "created_at"]),
        fact("Trace id", &["traceId"]),
        fact("Producer", &["producerSub"]),
        (
            "Attempts",
            figures::count(m.count(&["attempts", "retryCount", "retry_count"])),
        ),
    ];
    // Errors: the message's own, then each dead-letter entry's.
    let mut errors = Vec::new();
    if let Some(e) = m.text(&["errorMessage", "error", "lastError"]) {
        errors.push((m.text(&["failedAt", "movedToDlqAt"]).unwrap_or_default(), e));
    }
    for d in m.list(&["deadLetters", "dlq", "errors"]) {
        if let Some(e) = d.text(&["errorMessage", "error", "message"]) {
            let at = d.text(&["movedToDlqAt", "at", "failedAt"]).unwrap_or_default();
            let group = d.text(&["consumerGroup"]).unwrap_or_default();
            errors.push((format!("{at} {group}").trim().to_string(), e));
        }
    }
    let traces = match traces {
        Ok(t) => t
            .list(&["traces"])
            .iter()
            .map(|t| TraceRow {
                at: t.text(&["createdAt", "at", "timestamp"]).unwrap_or_default(),
                name: t.text(&["traceName", "name", "traceNames.0"]).unwrap_or_default(),
                group: t.text(&["consumerGroup"]).unwrap_or_default(),
                data: t.at("data").to_string(),
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
        queue_href: queue.map(|q| format!("/queues/{}", enc(&q))),
        payload: serde_json::to_string_pretty(payload).unwrap_or_default(),
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
