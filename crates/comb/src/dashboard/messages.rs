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
        api.get(format!("/api/v1/messages/{ids}")),
        api.get(format!("/api/v1/traces/{ids}")),
    );
    let mut notes = Vec::new();
    let message = message.unwrap_or_else(|e| {
        notes.push(unavailable("This message", &e));
        Json::default()
    });
    let m = message;
    let queue = m.text(&["queue"]);
    let facts = vec![
        ("Queue", m.text(&["queue"]).unwrap_or_else(|| "—".into())),
        (
            "Partition",
            m.text(&["partition"]).unwrap_or_else(|| "—".into()),
        ),
        (
            "Position",
            m.text(&["position"]).unwrap_or_else(|| "—".into()),
        ),
        (
            "Created",
            m.text(&["createdAt"]).unwrap_or_else(|| "—".into()),
        ),
        (
            "Trace id",
            m.text(&["traceId"]).unwrap_or_else(|| "—".into()),
        ),
        ("Message id", m.text(&["id"]).unwrap_or_else(|| "—".into())),
        (
            "Producer",
            m.text(&["producerSub"])
                .unwrap_or_else(|| "— (pushed without a token)".into()),
        ),
    ];
    // Where each group is with it: status and attempts.
    let groups = m
        .list(&["consumerGroups"])
        .iter()
        .map(|g| GroupState {
            name: g.text(&["name"]).unwrap_or_default(),
            status: g.text(&["status"]).unwrap_or_default(),
            attempts: figures::count(g.count(&["attempts"])),
        })
        .collect();
    // Its error history: each time a group dead-lettered it, and whether it was requeued.
    let errors = m
        .list(&["deadLetters"])
        .iter()
        .map(|d| ErrorRow {
            at: d.text(&["movedToDlqAt"]).unwrap_or_default(),
            group: d.text(&["consumerGroup"]).unwrap_or_default(),
            error: d
                .text(&["errorMessage"])
                .unwrap_or_else(|| "(no error given)".into()),
            attempts: figures::count(d.count(&["retryCount"])),
            requeued: d.text(&["requeuedAt"]),
        })
        .collect();
    let traces = match traces {
        Ok(t) => t
            .list(&["traces"])
            .iter()
            .map(|t| TraceRow {
                at: t.text(&["createdAt"]).unwrap_or_default(),
                name: t
                    .list(&["traceNames"])
                    .iter()
                    .filter_map(|n| n.0.as_str().map(str::to_string))
                    .collect::<Vec<_>>()
                    .join(", "),
                event: t.text(&["eventType"]).unwrap_or_default(),
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
        payload: serde_json::to_string_pretty(m.at("data")).unwrap_or_default(),
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
