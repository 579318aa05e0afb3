//! `/groups`: every consumer group with its lag (messages and seconds) per queue, the leases
//! it holds, and a seek form.

use askama::Template;
use axum::Form;
use axum::extract::{Path, State as AxumState};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::Deserialize;
use serde_json::json;

use super::{AdminApi, Notice, Viewer, access, enc, figures, respond, unavailable};
use crate::admin::groups::{GroupSummary, Sought};
use crate::http::State;

#[derive(Template)]
#[template(path = "dashboard/groups.html")]
struct GroupsPage {
    rows: Vec<GroupRow>,
    viewer: Viewer,
    note: Option<String>,
}

struct GroupRow {
    group: String,
    group_enc: String,
    queue: String,
    queue_href: String,
    lag: String,
    lag_seconds: String,
    leases: String,
    partitions: String,
    lagging: bool,
}

/// `GET /groups`.
pub(crate) async fn list(AxumState(state): AxumState<State>, headers: HeaderMap) -> Response {
    let api = AdminApi::new(&state, &headers);
    let mut note = None;
    let mut rows = Vec::new();
    match api
        .get_as::<Vec<GroupSummary>>("/api/v1/consumer-groups")
        .await
    {
        Ok(groups) => {
            for g in groups {
                for q in g.queues {
                    let lag_seconds = (q.lag > 0).then_some(q.lag_seconds);
                    rows.push(GroupRow {
                        group_enc: enc(&g.name),
                        group: g.name.clone(),
                        queue_href: format!("/queues/{}", enc(&q.queue)),
                        lag: figures::count(q.lag),
                        lag_seconds: figures::age(lag_seconds),
                        leases: figures::count(q.leased_partitions),
                        partitions: figures::count(q.partitions),
                        lagging: lag_seconds.is_some_and(|s| s > 60.0),
                        queue: q.queue,
                    });
                }
            }
        }
        Err(e) => note = Some(unavailable("Consumer groups", &e)),
    }
    let page = GroupsPage {
        rows,
        viewer: access::viewer(&headers),
        note,
    };
    respond(
        page.render(),
        "Consumer groups",
        "groups",
        Some(("/groups".into(), 5)),
        &headers,
    )
}

/// The seek form: which queue, and where to.
#[derive(Deserialize)]
pub(crate) struct Seek {
    queue: String,
    /// `end`, `start` or `time`.
    to: String,
    /// With `to=time`: an RFC 3339 time, or the browser's `datetime-local` value (UTC).
    #[serde(default)]
    timestamp: String,
}

/// `POST /groups/{group}/seek`: moves the group's cursors on a queue.
pub(crate) async fn seek(
    AxumState(state): AxumState<State>,
    headers: HeaderMap,
    Path(group): Path<String>,
    Form(form): Form<Seek>,
) -> Response {
    if let Err(refusal) = access::check_action(&headers) {
        return Notice::refused(refusal);
    }
    let body = match form.to.as_str() {
        "end" => json!({"toEnd": true}),
        "start" => json!({"toStart": true}),
        "time" => {
            let ts = form.timestamp.trim();
            let parsed = chrono::DateTime::parse_from_rfc3339(ts)
                .map(|t| t.with_timezone(&chrono::Utc))
                .or_else(|_| {
                    chrono::NaiveDateTime::parse_from_str(ts, "%Y-%m-%dT%H:%M").map(|t| t.and_utc())
                });
            match parsed {
                Ok(t) => json!({"timestamp": t.to_rfc3339()}),
                Err(_) => {
                    return Notice {
                        ok: false,
                        text: "seek: give a time such as 2026-01-31T12:00".into(),
                    }
                    .respond(StatusCode::BAD_REQUEST);
                }
            }
        }
        _ => {
            return Notice {
                ok: false,
                text: "seek: choose end, start or a time".into(),
            }
            .respond(StatusCode::BAD_REQUEST);
        }
    };
    let api = AdminApi::new(&state, &headers);
    let path = format!(
        "/api/v1/consumer-groups/{}/queues/{}/seek",
        enc(&group),
        enc(&form.queue)
    );
    match api.post_as::<Sought>(&path, &body).await {
        Ok(_) => Notice {
            ok: true,
            text: format!("Group {group} moved on {}.", form.queue),
        }
        .respond(StatusCode::OK),
        Err(e) => Notice::failed("seek", &e),
    }
}
