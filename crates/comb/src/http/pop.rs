//! Pop routes: validate options, subscribe the group on first sight, claim, and long-poll.

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::{Query, State as AxState};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::value::RawValue;
use uuid::Uuid;

use super::body::JsonBody;
use super::params::{Params, PathParams};
use super::{Problem, State};
use crate::catalog::StartFrom;
use crate::code::Code;
use crate::pop::Claim;
use crate::queue::{GroupName, MAX_NAME_LEN, PartitionName, QueueName};

/// Most partitions one pop may lease.
const MAX_PARTITIONS_PER_POP: u64 = 100;

/// A pop request after validation.
type PopRequest = crate::pop::Request;

/// Pop from any partition of a queue that has messages for the group.
///
/// Leases the partition(s) to the group and hands out their next messages, or answers 204
/// when none came before the timeout (or pop maintenance mode is on).
#[utoipa::path(
    get,
    path = "/api/v1/pop/queue/{queue}",
    tag = "messages",
    operation_id = "popQueue",
    params(
        ("queue" = String, Path, description = "The queue."),
        ("consumerGroup" = Option<String>, Query, description = "The consumer group; the queue-mode group when absent."),
        ("batch" = Option<u32>, Query, description = "Most messages to take (1 to the server's `COMB_MAX_POP_BATCH`; 1 by default)."),
        ("partitions" = Option<u32>, Query, description = "Most partitions to lease at once (1-100; 1 by default)."),
        ("wait" = Option<bool>, Query, description = "Wait for messages when none are ready."),
        ("timeout" = Option<u64>, Query, description = "Longest wait, in milliseconds (30000 by default, capped by the server)."),
        ("autoAck" = Option<bool>, Query, description = "Settle the messages as they are handed out."),
        ("subscriptionMode" = Option<String>, Query, description = "Where a new group starts: `new` (or `new-only`) at the end, anything else at the start."),
        ("subscriptionFrom" = Option<String>, Query, description = "Where a new group starts: `now`, or an RFC 3339 time."),
    ),
    responses(
        (status = 200, description = "Messages, under a lease.", body = PopResponse),
        (status = 204, description = "No message came in time."),
    )
)]
pub(crate) async fn pop_queue(
    AxState(app): AxState<State>,
    PathParams(queue): PathParams<String>,
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Problem> {
    let params = Params::Query(query_params(query)?);
    let req = parse(&app, queue, None, &params)?;
    serve(&app, req).await
}

/// Pop from one named partition.
#[utoipa::path(
    get,
    path = "/api/v1/pop/queue/{queue}/partition/{partition}",
    tag = "messages",
    operation_id = "popPartition",
    params(
        ("queue" = String, Path, description = "The queue."),
        ("partition" = String, Path, description = "The partition."),
        ("consumerGroup" = Option<String>, Query, description = "The consumer group; the queue-mode group when absent."),
        ("batch" = Option<u32>, Query, description = "Most messages to take (1 to the server's `COMB_MAX_POP_BATCH`; 1 by default)."),
        ("partitions" = Option<u32>, Query, description = "Most partitions to lease at once (1-100; 1 by default)."),
        ("wait" = Option<bool>, Query, description = "Wait for messages when none are ready."),
        ("timeout" = Option<u64>, Query, description = "Longest wait, in milliseconds (30000 by default, capped by the server)."),
        ("autoAck" = Option<bool>, Query, description = "Settle the messages as they are handed out."),
        ("subscriptionMode" = Option<String>, Query, description = "Where a new group starts: `new` (or `new-only`) at the end, anything else at the start."),
        ("subscriptionFrom" = Option<String>, Query, description = "Where a new group starts: `now`, or an RFC 3339 time."),
    ),
    responses(
        (status = 200, description = "Messages, under a lease.", body = PopResponse),
        (status = 204, description = "No message came in time."),
    )
)]
pub(crate) async fn pop_partition(
    AxState(app): AxState<State>,
    PathParams((queue, partition)): PathParams<(String, String)>,
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Problem> {
    let params = Params::Query(query_params(query)?);
    let req = parse(&app, queue, Some(partition), &params)?;
    serve(&app, req).await
}

/// Pop with options in a JSON body, for clients that must not send state-changing GETs.
#[utoipa::path(
    post,
    path = "/api/v1/pop",
    tag = "messages",
    operation_id = "popBody",
    request_body = PopBody,
    responses(
        (status = 200, description = "Messages, under a lease.", body = PopResponse),
        (status = 204, description = "No message came in time."),
    )
)]
pub(crate) async fn pop_body(
    AxState(app): AxState<State>,
    principal: Option<axum::Extension<crate::auth::Principal>>,
    JsonBody(body): JsonBody<serde_json::Map<String, serde_json::Value>>,
) -> Result<Response, Problem> {
    let params = Params::Json(body);
    let queue = params
        .text("queue")?
        .ok_or_else(|| Problem::bad_request(Code::QueueNameInvalid, "`queue` is required"))?;
    super::guard::check_queues(principal.as_deref(), std::iter::once(queue.as_str()))?;
    let partition = params.text("partition")?;
    let req = parse(&app, queue, partition, &params)?;
    serve(&app, req).await
}

fn query_params(
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
) -> Result<HashMap<String, String>, Problem> {
    query
        .map(|q| q.0)
        .map_err(|e| Problem::bad_request(Code::ParameterInvalid, e.body_text()))
}

fn parse(
    app: &State,
    queue: String,
    partition: Option<String>,
    params: &Params,
) -> Result<PopRequest, Problem> {
    let queue = QueueName::parse(queue)?.into_owned();
    let partition = partition
        .map(PartitionName::parse)
        .transpose()?
        .map(PartitionName::into_owned);
    let group = match params.text("consumerGroup")? {
        Some(group) => GroupName::parse(group)?.into_owned(),
        None => GroupName::queue_mode(),
    };
    let max_batch = app.config.max_pop_batch as u64;
    let batch = params.uint("batch")?.unwrap_or(1);
    if !(1..=max_batch).contains(&batch) {
        return Err(Problem::bad_request(
            Code::ParameterInvalid,
            format!("parameter `batch` must be between 1 and {max_batch}"),
        ));
    }
    let partitions = params.uint("partitions")?.unwrap_or(1);
    if !(1..=MAX_PARTITIONS_PER_POP).contains(&partitions) {
        return Err(Problem::bad_request(
            Code::ParameterInvalid,
            format!("parameter `partitions` must be between 1 and {MAX_PARTITIONS_PER_POP}"),
        ));
    }
    let timeout_ms = params.uint("timeout")?.unwrap_or(30_000);
    let timeout = Duration::from_millis(timeout_ms).min(app.config.max_poll_timeout());
    let start = match (
        params.text("subscriptionFrom")?,
        params.text("subscriptionMode")?,
    ) {
        (Some(from), _) if from == "now" => StartFrom::New,
        (Some(from), _) => StartFrom::Time(
            DateTime::parse_from_rfc3339(&from)
                .map_err(|_| {
                    Problem::bad_request(
                        Code::SubscriptionFromInvalid,
                        format!(
                            "subscriptionFrom must be `now` or an RFC 3339 time such as 2026-01-31T12:00:00Z, got {from:?}"
                        ),
                    )
                })?
                .with_timezone(&Utc),
        ),
        (None, None) => StartFrom::All,
        // As Queen reads it: `new` and `new-only` start at the end, anything else (`all`,
        // `from_beginning`, …) at the start.
        (None, Some(mode)) if mode.len() > MAX_NAME_LEN || mode.chars().any(char::is_control) => {
            return Err(Problem::bad_request(
                Code::SubscriptionModeInvalid,
                format!(
                    "subscriptionMode must be at most {MAX_NAME_LEN} bytes without control characters"
                ),
            ));
        }
        (None, Some(mode)) => match mode.as_str() {
            "new" | "new-only" => StartFrom::New,
            _ => StartFrom::All,
        },
    };
    Ok(PopRequest {
        queue,
        partition,
        group,
        batch: batch as i32,
        partitions: partitions as usize,
        wait: params.flag("wait")?.unwrap_or(false),
        timeout,
        auto_ack: params.flag("autoAck")?.unwrap_or(false),
        start,
    })
}

/// Pops through the pop use case: the messages claimed, or 204 when none came in time.
async fn serve(app: &State, req: PopRequest) -> Result<Response, Problem> {
    // While pop maintenance mode is on, nothing is handed out.
    if app
        .modes
        .is_on(&app.pool, crate::admin::modes::Mode::Pop)
        .await
    {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    match app.popper.pop(&req).await? {
        Some(claims) => Ok(respond(app.backend, &req, claims)),
        None => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

/// The body of `POST /api/v1/pop`: the query parameters of the other pop routes, with the
/// queue and partition. Numbers and flags may also be sent as strings.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // Read as a map by `Params`; this type describes it.
pub(crate) struct PopBody {
    queue: String,
    partition: Option<String>,
    consumer_group: Option<String>,
    batch: Option<u32>,
    partitions: Option<u32>,
    wait: Option<bool>,
    timeout: Option<u64>,
    auto_ack: Option<bool>,
    subscription_mode: Option<String>,
    subscription_from: Option<String>,
}

/// Messages handed out under a lease.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PopResponse<'a> {
    success: bool,
    queue: &'a str,
    partition: &'a str,
    partition_id: Uuid,
    lease_id: Option<Uuid>,
    consumer_group: &'a str,
    messages: Vec<MessageOut<'a>>,
    /// How many partitions the lease holds.
    partitions_claimed: usize,
}

/// A message as a consumer receives it.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = Message)]
pub(crate) struct MessageOut<'a> {
    id: Uuid,
    transaction_id: &'a str,
    trace_id: Option<&'a str>,
    /// Who pushed the message (its token's subject), when tokens were required.
    #[serde(skip_serializing_if = "Option::is_none")]
    producer_sub: Option<&'a str>,
    /// The payload as pushed.
    #[schema(value_type = Value)]
    data: &'a RawValue,
    /// When it was pushed (RFC 3339, milliseconds).
    created_at: String,
    partition_id: Uuid,
    partition: &'a str,
    lease_id: Option<Uuid>,
    consumer_group: &'a str,
    attempt: i32,
}

fn respond(backend: crate::backend::Backend, req: &PopRequest, claims: Vec<Claim>) -> Response {
    let first = &claims[0];
    if let Some(lease) = first.lease_id {
        let partitions: Vec<Uuid> = claims.iter().map(|c| c.partition_id).collect();
        crate::lease::granted(backend, lease, &req.queue, &req.group, &partitions);
    }
    let mut messages = Vec::new();
    for c in &claims {
        for m in &c.messages {
            messages.push(MessageOut {
                id: m.message_id,
                transaction_id: &m.transaction_id,
                trace_id: m.trace_id.as_deref(),
                producer_sub: m.producer_sub.as_deref(),
                data: &m.data,
                created_at: m.created_at.to_rfc3339_opts(SecondsFormat::Millis, true),
                partition_id: c.partition_id,
                partition: &c.partition,
                lease_id: c.lease_id,
                consumer_group: &req.group,
                attempt: m.attempt,
            });
        }
    }
    let body = PopResponse {
        success: true,
        queue: &req.queue,
        partition: &first.partition,
        partition_id: first.partition_id,
        lease_id: first.lease_id,
        consumer_group: &req.group,
        messages,
        partitions_claimed: claims.len(),
    };
    axum::Json(body).into_response()
}
