//! `/dead-letters`: the dead-letter queue, filtered by queue, group and partition; each entry's
//! payload and error; requeue and purge (one entry or everything the filter shows), each
//! after a confirmation.

use askama::Template;
use axum::Form;
use axum::extract::{Query, State as AxumState};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{AdminApi, Notice, Viewer, access, enc, figures, rendered, respond, unavailable};
use crate::http::State;

/// Which dead letters: the page's filter, and also what an action applies to.
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
pub(crate) struct Filter {
    #[serde(default)]
    queue: String,
    #[serde(default)]
    group: String,
    #[serde(default)]
    partition: String,
    /// One entry: its partition id and transaction id (both or neither).
    #[serde(default, rename = "partitionId")]
    partition_id: String,
    #[serde(default, rename = "transactionId")]
    transaction_id: String,
}

impl Filter {
    fn one(&self) -> bool {
        !self.partition_id.is_empty() && !self.transaction_id.is_empty()
    }

    /// The listing's query string.
    fn query(&self) -> String {
        let mut q = format!("queue={}", enc(&self.queue));
        if !self.group.is_empty() {
            q.push_str(&format!("&consumerGroup={}", enc(&self.group)));
        }
        if !self.partition.is_empty() {
            q.push_str(&format!("&partition={}", enc(&self.partition)));
        }
        q
    }

    /// The body of a requeue or purge call.
    fn body(&self) -> Value {
        let mut body = json!({"queue": self.queue});
        if !self.group.is_empty() {
            body["consumerGroup"] = json!(self.group);
        }
        if !self.partition.is_empty() {
            body["partition"] = json!(self.partition);
        }
        if self.one() {
            body["partitionId"] = json!(self.partition_id);
            body["transactionId"] = json!(self.transaction_id);
        }
        body
    }

    /// Form fields (for `hx-vals`) that name this filter again.
    fn vals(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[derive(Template)]
#[template(path = "dashboard/dead_letters.html")]
struct DeadLettersPage {
    filter: Filter,
    queues: Vec<String>,
    rows: Vec<Row>,
    total: String,
    viewer: Viewer,
    note: Option<String>,
    vals: String,
}

struct Row {
    queue: String,
    partition: String,
    group: String,
    error: String,
    retries: String,
    moved_at: String,
    payload: String,
    href: String,
    vals: String,
}

/// `GET /dead-letters`.
pub(crate) async fn list(
    AxumState(state): AxumState<State>,
    headers: HeaderMap,
    Query(filter): Query<Filter>,
) -> Response {
    let api = AdminApi::new(&state, &headers);
    let queues: Vec<String> = match api.get("/api/v1/resources/queues").await {
        Ok(q) => q
            .list(&["queues"])
            .iter()
            .filter_map(|q| q.text(&["name"]))
            .collect(),
        Err(_) => Vec::new(),
    };
    let mut filter = filter;
    if filter.queue.is_empty() {
        filter.queue = queues.first().cloned().unwrap_or_default();
    }
    let mut note = None;
    let mut rows = Vec::new();
    let mut total = 0;
    if !filter.queue.is_empty() {
        match api
            .get(&format!("/api/v1/dlq?{}&limit=100", filter.query()))
            .await
        {
            Ok(listing) => {
                let entries = listing.list(&["messages"]);
                total = listing.count(&["total"]).max(entries.len() as i64);
                for m in entries {
                    let partition_id = m.text(&["partitionId"]).unwrap_or_default();
                    let transaction_id = m.text(&["transactionId"]).unwrap_or_default();
                    let one = Filter {
                        queue: m.text(&["queueName", "queue"]).unwrap_or(filter.queue.clone()),
                        group: m.text(&["consumerGroup"]).unwrap_or_default(),
                        partition: String::new(),
                        partition_id: partition_id.clone(),
                        transaction_id: transaction_id.clone(),
                    };
                    let payload = m.at("data");
                    let payload = if payload.is_null() { m.at("payload") } else { payload };
                    rows.push(Row {
                        queue: one.queue.clone(),
                        partition: m.text(&["partitionName", "partition"]).unwrap_or_default(),
                        group: one.group.clone(),
                        error: m.text(&["errorMessage", "error"]).unwrap_or_default(),
                        retries: figures::count(m.count(&["retryCount", "attempts"])),
                        moved_at: m.text(&["movedToDlqAt", "failedAt"]).unwrap_or_default(),
                        payload: serde_json::to_string_pretty(payload).unwrap_or_default(),
                        href: format!("/messages/{}/{}", enc(&partition_id), enc(&transaction_id)),
                        vals: one.vals(),
                    });
                }
            }
            Err(e) => note = Some(unavailable("Dead letters", &e)),
        }
    }
    let mut whole = filter.clone();
    whole.partition_id.clear();
    whole.transaction_id.clear();
    let page = DeadLettersPage {
        vals: whole.vals(),
        filter: whole.clone(),
        queues,
        rows,
        total: figures::count(total),
        viewer: access::viewer(&headers),
        note,
    };
    respond(
        page.render(),
        "Dead letters",
        "dead-letters",
        Some((format!("/dead-letters?{}", whole.query_for_page()), 10)),
        &headers,
    )
}

impl Filter {
    /// The page's own query string (its parameter names, not the API's).
    fn query_for_page(&self) -> String {
        format!(
            "queue={}&group={}&partition={}",
            enc(&self.queue),
            enc(&self.group),
            enc(&self.partition)
        )
    }
}

/// What a confirmation asks about.
#[derive(Deserialize)]
pub(crate) struct Confirm {
    action: String,
    #[serde(flatten)]
    filter: Filter,
}

#[derive(Template)]
#[template(path = "dashboard/confirm.html")]
struct ConfirmPanel {
    action: &'static str,
    verb: &'static str,
    question: String,
    vals: String,
    danger: bool,
}

/// `GET /dead-letters/confirm?action=requeue|purge&…`: the confirmation panel of an action.
/// Changes nothing.
pub(crate) async fn confirm(headers: HeaderMap, Query(c): Query<Confirm>) -> Response {
    if !access::viewer(&headers).can_modify {
        return Notice::refused(access::Refusal::ReadOnly);
    }
    let f = &c.filter;
    let what = if f.one() {
        format!("dead letter {} of queue {}", f.transaction_id, f.queue)
    } else {
        let mut w = format!("every dead letter of queue {}", f.queue);
        if !f.group.is_empty() {
            w.push_str(&format!(", group {}", f.group));
        }
        if !f.partition.is_empty() {
            w.push_str(&format!(", partition {}", f.partition));
        }
        w
    };
    let panel = match c.action.as_str() {
        "requeue" => ConfirmPanel {
            action: "/dead-letters/requeue",
            verb: "Requeue",
            question: format!(
                "Requeue {what}? The messages go back to their partitions in their original order, with attempts reset."
            ),
            vals: f.vals(),
            danger: false,
        },
        "purge" => ConfirmPanel {
            action: "/dead-letters/purge",
            verb: "Purge",
            question: format!("Purge {what}? This cannot be undone."),
            vals: f.vals(),
            danger: true,
        },
        _ => {
            return Notice {
                ok: false,
                text: "unknown action".into(),
            }
            .respond(StatusCode::BAD_REQUEST);
        }
    };
    rendered(panel.render())
}

/// `POST /dead-letters/requeue`.
pub(crate) async fn requeue(
    AxumState(state): AxumState<State>,
    headers: HeaderMap,
    Form(filter): Form<Filter>,
) -> Response {
    act(state, headers, filter, "/api/v1/dlq/requeue", "Requeued").await
}

/// `POST /dead-letters/purge`.
pub(crate) async fn purge(
    AxumState(state): AxumState<State>,
    headers: HeaderMap,
    Form(filter): Form<Filter>,
) -> Response {
    act(state, headers, filter, "/api/v1/dlq/purge", "Purged").await
}

async fn act(
    state: State,
    headers: HeaderMap,
    filter: Filter,
    path: &str,
    done: &str,
) -> Response {
    if let Err(refusal) = access::check_action(&headers) {
        return Notice::refused(refusal);
    }
    if filter.queue.is_empty() {
        return Notice {
            ok: false,
            text: "choose a queue first".into(),
        }
        .respond(StatusCode::BAD_REQUEST);
    }
    let api = AdminApi::new(&state, &headers);
    match api.post(path, &filter.body()).await {
        Ok(answer) => {
            let n = answer.count(&["requeued", "purged", "count", "affected"]);
            Notice {
                ok: true,
                text: format!(
                    "{done} {} dead letter{}.",
                    figures::count(n),
                    if n == 1 { "" } else { "s" }
                ),
            }
            .respond(StatusCode::OK)
        }
        Err(e) => Notice::failed(&done.to_lowercase(), &e),
    }
}
