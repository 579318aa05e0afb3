//! The administration routes' OpenAPI description, generated from their handlers'
//! `#[utoipa::path]` annotations and the answer types the administration returns, so the
//! description cannot say other than what the handlers answer. The administration routes
//! are those under [`ADMIN_PREFIXES`]; a test holds [`AdminApi`] to exactly those of
//! [`super::routes`].

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, IntoResponses, OpenApi, ToSchema};

use super::{dead_letters, dlq, groups, messages, queues, resources, status, system, traces};

/// Paths whose routes belong to the administration (every other route is the data path,
/// streams, health, metrics or the document itself).
#[allow(dead_code)] // read by the tests and by the served document's assembly
pub(crate) const ADMIN_PREFIXES: &[&str] = &[
    "/api/v1/resources/",
    "/api/v1/queues/",
    "/api/v1/consumer-groups",
    "/api/v1/messages",
    "/api/v1/dlq",
    "/api/v1/system/",
    "/api/v1/traces",
    "/api/v1/status",
    "/api/v1/analytics/",
    "/api/v1/stats/",
];

/// A refusal or failure, as every route answers one (`application/problem+json`, RFC 9457).
/// Only described here: `http::problem` writes it.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = Problem)]
pub(crate) struct ProblemBody {
    /// `urn:comb:problem:{code}`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The HTTP status's reason phrase.
    pub title: String,
    pub status: u16,
    /// What was wrong, for a person.
    pub detail: String,
    /// Stable machine-readable code (`docs/errors.md`).
    pub code: String,
    /// Same as `detail`, for Queen's clients that read `error`.
    pub error: String,
    /// The request's id, as in the server's log.
    pub request_id: Option<String>,
}

/// The refusals every administration route may answer.
#[derive(IntoResponses)]
#[allow(dead_code)]
pub(crate) enum Refused {
    /// A parameter or body member is missing or malformed; nothing was changed.
    #[response(status = 400, content_type = "application/problem+json")]
    BadRequest(ProblemBody),
    /// The queue, partition, group or message named does not exist.
    #[response(status = 404, content_type = "application/problem+json")]
    NotFound(ProblemBody),
    /// The database is unreachable or busy; try again.
    #[response(status = 503, content_type = "application/problem+json")]
    Unavailable(ProblemBody),
}

/// A page of a listing (`limit` 1..=1000, default 100; `offset` at most 100,000).
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(crate) struct PageParams {
    /// Rows to answer, 1 to 1000 (default 100).
    pub limit: Option<u64>,
    /// Rows to skip, at most 100,000 (default 0).
    pub offset: Option<u64>,
}

/// A time range (RFC 3339); the last hour when neither is given.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(crate) struct RangeParams {
    /// Start of the range (RFC 3339).
    pub from: Option<String>,
    /// End of the range (RFC 3339).
    pub to: Option<String>,
}

/// `POST /api/v1/consumer-groups/{group}/subscription`'s body.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
pub(crate) struct SubscriptionBody {
    /// Where the group reads its queues from (RFC 3339).
    pub subscription_timestamp: String,
}

/// A seek's body: exactly one of `toEnd: true`, `toStart: true` or `timestamp`.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
pub(crate) struct SeekBody {
    pub to_end: Option<bool>,
    pub to_start: Option<bool>,
    /// RFC 3339.
    pub timestamp: Option<String>,
}

/// The dead letters a requeue or purge selects: those of `queue`, narrowed by the others.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
pub(crate) struct DeadLetterSelection {
    pub queue: String,
    pub consumer_group: Option<String>,
    pub partition: Option<String>,
    /// Dead letter ids (at most 10,000).
    pub ids: Option<Vec<uuid::Uuid>>,
    /// Dead-lettered at or after (RFC 3339).
    pub from: Option<String>,
    /// Dead-lettered at or before (RFC 3339).
    pub to: Option<String>,
}

/// A maintenance mode's body.
#[derive(Deserialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ModeBody {
    /// Whether the mode holds requests back.
    pub enabled: bool,
}

/// `POST /api/v1/traces`' body.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
pub(crate) struct TraceBody {
    pub transaction_id: String,
    /// UUID.
    pub partition_id: String,
    /// Any JSON, at most 64 KiB.
    pub data: serde_json::Value,
    /// Default: the queue-mode group.
    pub consumer_group: Option<String>,
    /// Default `info`.
    pub event_type: Option<String>,
    /// A name or a list of names.
    pub trace_names: Option<serde_json::Value>,
}

/// Every administration route, with its parameters, answer and refusals.
#[derive(OpenApi)]
#[allow(dead_code)] // merged into the served document by `http::openapi`
#[openapi(
    paths(
        queues::delete_queue,
        resources::overview,
        resources::queues,
        resources::queue,
        resources::partitions,
        resources::namespaces,
        resources::tasks,
        resources::clear,
        groups::list,
        groups::lagging,
        groups::detail,
        groups::delete_for_queue,
        groups::subscription,
        groups::seek,
        groups::seek_partition,
        messages::list,
        messages::get,
        messages::delete,
        messages::retry,
        messages::dead_letter,
        dead_letters::requeue,
        dead_letters::purge,
        system::get_push,
        system::set_push,
        system::get_pop,
        system::set_pop,
        system::servers,
        traces::record,
        traces::names,
        traces::by_name,
        traces::of_message,
        status::status,
        status::queues,
        status::queue,
        status::analytics,
        status::postgres_stats,
        status::system_metrics,
        status::worker_metrics,
        status::refresh,
        dlq::list,
    ),
    components(schemas(
        ProblemBody,
        SubscriptionBody,
        SeekBody,
        DeadLetterSelection,
        ModeBody,
        TraceBody
    ))
)]
pub(crate) struct AdminApi;

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use axum::http::Method;
    use utoipa::OpenApi;

    use super::{ADMIN_PREFIXES, AdminApi};

    fn documented() -> BTreeSet<(String, String)> {
        let doc = AdminApi::openapi();
        let mut out = BTreeSet::new();
        for (path, item) in &doc.paths.paths {
            for (method, op) in [
                (Method::GET, &item.get),
                (Method::POST, &item.post),
                (Method::PUT, &item.put),
                (Method::PATCH, &item.patch),
                (Method::DELETE, &item.delete),
            ] {
                if op.is_some() {
                    out.insert((method.to_string(), path.clone()));
                }
            }
        }
        out
    }

    #[test]
    fn admin_api_documents_exactly_the_administration_routes() {
        let routed: BTreeSet<(String, String)> = crate::http::routes()
            .into_iter()
            .filter(|(_, path, _)| ADMIN_PREFIXES.iter().any(|p| path.starts_with(p)))
            .map(|(method, path, _)| (method.to_string(), path.to_string()))
            .collect();
        let documented = documented();
        let undocumented: Vec<_> = routed.difference(&documented).collect();
        let unrouted: Vec<_> = documented.difference(&routed).collect();
        assert!(
            undocumented.is_empty() && unrouted.is_empty(),
            "routed but not in AdminApi: {undocumented:?}; in AdminApi but not routed: {unrouted:?}"
        );
        assert!(routed.len() >= 39, "{} administration routes", routed.len());
    }

    #[test]
    fn every_admin_operation_documents_its_answer_and_refusals() {
        let doc = AdminApi::openapi();
        for (path, item) in &doc.paths.paths {
            for op in [&item.get, &item.post, &item.delete].into_iter().flatten() {
                let codes: Vec<&String> = op.responses.responses.keys().collect();
                assert!(
                    codes.iter().any(|c| c.starts_with('2')),
                    "{path}: no success answer in {codes:?}"
                );
                assert!(
                    codes.iter().any(|c| *c == "400"),
                    "{path}: no problem answer in {codes:?}"
                );
            }
        }
    }
}
