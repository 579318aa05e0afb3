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
use crate::admin::dead_letters::{PurgeAnswer, RequeueAnswer};
use crate::admin::messages::{MessageDetail, MessageListing, MessageRetried};
use crate::admin::resources::QueueList;
use crate::http::State;
use crate::queue::QUEUE_MODE_GROUP;

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

    /// The group the filter names; queue mode's when it names none.
    fn group(&self) -> &str {
        if self.group.is_empty() {
            QUEUE_MODE_GROUP
        } else {
            &self.group
        }
    }

    /// The listing's query string.
    fn query(&self) -> String {
        let mut q = format!(
            "queue={}&status=dead_letter&consumerGroup={}",
            enc(&self.queue),
            enc(self.group())
        );
        if !self.partition.is_empty() {
            q.push_str(&format!("&partition={}", enc(&self.partition)));
        }
        q
    }

    /// The body of a requeue or purge call for everything the filter shows.
    fn body(&self) -> Value {
        let mut body = json!({"queue": self.queue, "consumerGroup": self.group()});
        if !self.partition.is_empty() {
            body["partition"] = json!(self.partition);
        }
        body
    }

    /// The message of a filter that names one entry.
    fn message_path(&self) -> String {
        format!(
            "/api/v1/messages/{}/{}",
            enc(&self.partition_id),
            enc(&self.transaction_id)
        )
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

/// Entries a page lists.
const LIMIT: usize = 100;

/// `GET /dead-letters`.
pub(crate) async fn list(
    AxumState(state): AxumState<State>,
    headers: HeaderMap,
    Query(filter): Query<Filter>,
) -> Response {
    let api = AdminApi::new(&state, &headers);
    let queues: Vec<String> = match api.get_as::<QueueList>("/api/v1/resources/queues").await {
        Ok(q) => q.queues.into_iter().map(|q| q.name).collect(),
        Err(_) => Vec::new(),
    };
    let mut filter = filter;
    if filter.queue.is_empty() {
        filter.queue = queues.first().cloned().unwrap_or_default();
    }
    let mut note = None;
    let mut rows = Vec::new();
    let mut total = 0usize;
    if !filter.queue.is_empty() {
        match api
            .get_as::<MessageListing>(format!("/api/v1/messages?{}&limit={LIMIT}", filter.query()))
            .await
        {
            Ok(listing) => {
                total = listing.messages.len();
                for m in listing.messages {
                    let one = Filter {
                        queue: m.queue.clone(),
                        group: filter.group().to_string(),
                        partition: String::new(),
                        partition_id: m.partition_id.to_string(),
                        transaction_id: m.transaction_id.clone(),
                    };
                    rows.push(Row {
                        queue: m.queue,
                        partition: m.partition,
                        group: one.group.clone(),
                        error: m.error_message.flatten().unwrap_or_default(),
                        retries: figures::count(m.retry_count.unwrap_or(0).into()),
                        moved_at: m.moved_to_dlq_at.map(figures::iso).unwrap_or_default(),
                        payload: serde_json::to_string_pretty(&m.data).unwrap_or_default(),
                        href: format!("/messages/{}/{}", m.partition_id, enc(&m.transaction_id)),
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
        total: if total == LIMIT {
            format!("{LIMIT}+")
        } else {
            figures::count(total as i64)
        },
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
        let mut w = format!(
            "every dead letter of queue {}, group {}",
            f.queue,
            f.group()
        );
        if !f.partition.is_empty() {
            w.push_str(&format!(", partition {}", f.partition));
        }
        w
    };
    let panel = match c.action.as_str() {
        "requeue" => ConfirmPanel {
            action: "/dead-letters/requeue",
            verb: "Requeue",
            question: if f.one() {
                format!("Requeue {what}? It goes back to its partition, with attempts reset.")
            } else {
                format!(
                    "Requeue {what}? The messages go back to their partitions in their original order, with attempts reset."
                )
            },
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

/// `POST /dead-letters/requeue`: one entry's message (`…/retry`) or everything the filter
/// shows (`/api/v1/dlq/requeue`).
pub(crate) async fn requeue(
    AxumState(state): AxumState<State>,
    headers: HeaderMap,
    Form(filter): Form<Filter>,
) -> Response {
    if let Some(refusal) = refusal(&headers, &filter) {
        return refusal;
    }
    let api = AdminApi::new(&state, &headers);
    let answer = if filter.one() {
        api.post_as::<MessageRetried>(&format!("{}/retry", filter.message_path()), &json!({}))
            .await
            .map(|a| Requeued {
                requeued: a.requeued,
                remaining: 0,
            })
    } else {
        api.post_as::<RequeueAnswer>("/api/v1/dlq/requeue", &filter.body())
            .await
            .map(|a| Requeued {
                requeued: a.requeued,
                remaining: a.remaining,
            })
    };
    match answer {
        Ok(Requeued {
            requeued,
            remaining,
        }) => done("Requeued", requeued as i64, remaining as i64),
        Err(e) => Notice::failed("requeue", &e),
    }
}

/// `POST /dead-letters/purge`: one entry (found by its message) or everything the filter
/// shows.
pub(crate) async fn purge(
    AxumState(state): AxumState<State>,
    headers: HeaderMap,
    Form(filter): Form<Filter>,
) -> Response {
    if let Some(refusal) = refusal(&headers, &filter) {
        return refusal;
    }
    let api = AdminApi::new(&state, &headers);
    let mut body = filter.body();
    if filter.one() {
        // The entry ids of this message's dead letters in the filter's group, not requeued.
        let message = match api.get_as::<MessageDetail>(filter.message_path()).await {
            Ok(m) => m,
            Err(e) => return Notice::failed("purge", &e),
        };
        let ids: Vec<String> = message
            .dead_letters
            .iter()
            .filter(|d| d.consumer_group == filter.group() && d.requeued_at.is_none())
            .map(|d| d.id.to_string())
            .collect();
        if ids.is_empty() {
            return done("Purged", 0, 0);
        }
        body["ids"] = json!(ids);
    }
    match api.post_as::<PurgeAnswer>("/api/v1/dlq/purge", &body).await {
        Ok(a) => done("Purged", a.purged as i64, 0),
        Err(e) => Notice::failed("purge", &e),
    }
}

/// The answer refusing an action: it failed the CSRF or role checks, or names no queue.
fn refusal(headers: &HeaderMap, filter: &Filter) -> Option<Response> {
    if let Err(refusal) = access::check_action(headers) {
        return Some(Notice::refused(refusal));
    }
    filter.queue.is_empty().then(|| {
        Notice {
            ok: false,
            text: "choose a queue first".into(),
        }
        .respond(StatusCode::BAD_REQUEST)
    })
}

/// The notice of a done action.
/// What a requeue did, whether of one message or of what the filter shows.
struct Requeued {
    requeued: u64,
    remaining: u64,
}

fn done(verb: &str, n: i64, remaining: i64) -> Response {
    let mut text = format!(
        "{verb} {} dead letter{}.",
        figures::count(n),
        if n == 1 { "" } else { "s" }
    );
    if remaining > 0 {
        text.push_str(&format!(
            " {} more remain: repeat to take them.",
            figures::count(remaining)
        ));
    }
    Notice { ok: true, text }.respond(StatusCode::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(can_modify: bool) -> String {
        let one = Filter {
            queue: "q".into(),
            partition_id: "p".into(),
            transaction_id: "t".into(),
            ..Filter::default()
        };
        DeadLettersPage {
            filter: Filter::default(),
            queues: vec!["q".into()],
            rows: vec![Row {
                queue: "q".into(),
                partition: "Default".into(),
                group: QUEUE_MODE_GROUP.into(),
                error: "<b>boom</b>".into(),
                retries: "3".into(),
                moved_at: String::new(),
                payload: "{}".into(),
                href: "/messages/p/t".into(),
                vals: one.vals(),
            }],
            total: "1".into(),
            viewer: Viewer {
                can_modify,
                signed_in: false,
            },
            note: None,
            vals: Filter::default().vals(),
        }
        .render()
        .unwrap()
    }

    #[test]
    fn a_read_only_viewer_sees_no_destructive_buttons() {
        let full = page(true);
        assert!(full.contains("class=\"requeue\"") && full.contains("purge-all"));
        let read_only = page(false);
        assert!(!read_only.contains("Requeue") && !read_only.contains("Purge"));
        // What an entry says is escaped, never markup.
        assert!(read_only.contains("&#60;b&#62;boom") || read_only.contains("&lt;b&gt;boom"));
    }
}
