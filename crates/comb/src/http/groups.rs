//! Consumer groups: `/api/v1/consumer-groups…` listings, deletion, subscription and seeks.

use axum::Json;
use axum::extract::State as AxState;
use serde_json::{Map, Value};

use super::body::JsonBody;
use super::params::{Params, PathParams, QueryString, parse_time, query};
use super::resources::optional_queue;
use super::{Problem, State};
use crate::admin::cursors::Target;
use crate::admin::groups;
use crate::code::Code;
use crate::queue::{GroupName, PartitionName, QueueName};

/// Every group with its queues' lag.
#[utoipa::path(
    get,
    path = "/api/v1/consumer-groups",
    responses(
        (status = 200, description = "The answer", body = Vec<groups::GroupSummary>),
        crate::http::admin_api::Refused,
    )
)]
pub async fn list(
    AxState(app): AxState<State>,
) -> Result<Json<Vec<groups::GroupSummary>>, Problem> {
    Ok(Json(groups::list(&app.pool).await?))
}

/// One group: per queue (or the one `queue` names) a page of partitions (`limit`,
/// `offset`) with cursor, head, lag and lease.
#[utoipa::path(
    get,
    path = "/api/v1/consumer-groups/{group}",
    params(
        ("group" = String, Path, description = "Consumer group name"),
        ("queue" = Option<String>, Query, description = "Only this queue"),
        crate::http::admin_api::PageParams,
    ),
    responses(
        (status = 200, description = "The answer", body = groups::GroupDetail),
        crate::http::admin_api::Refused,
    )
)]
pub async fn detail(
    AxState(app): AxState<State>,
    PathParams(group): PathParams<String>,
    q: QueryString,
) -> Result<Json<groups::GroupDetail>, Problem> {
    let group = GroupName::parse(group)?;
    let params = query(q)?;
    let queue = optional_queue(&params)?;
    let page = params.page()?;
    Ok(Json(
        groups::detail(&app.pool, app.backend, &group, queue.as_deref(), page).await?,
    ))
}

/// Cursors whose oldest unsettled message waits at least `minLagSeconds` (default 3600, as
/// Queen).
#[utoipa::path(
    get,
    path = "/api/v1/consumer-groups/lagging",
    params(
        ("minLagSeconds" = Option<u64>, Query, description = "Least wait of the oldest unsettled message (default 3600)"),
    ),
    responses(
        (status = 200, description = "The answer", body = Vec<groups::LaggingCursor>),
        crate::http::admin_api::Refused,
    )
)]
pub async fn lagging(
    AxState(app): AxState<State>,
    q: QueryString,
) -> Result<Json<Vec<groups::LaggingCursor>>, Problem> {
    let min = query(q)?
        .uint("minLagSeconds")?
        .unwrap_or(3600)
        .min(10 * 365 * 86_400);
    Ok(Json(groups::lagging(&app.pool, min as f64).await?))
}

/// Deletes a group's reading of one queue (`deleteMetadata`, default true).
#[utoipa::path(
    delete,
    path = "/api/v1/consumer-groups/{group}/queues/{queue}",
    params(
        ("group" = String, Path, description = "Consumer group name"),
        ("queue" = String, Path, description = "Queue name"),
        ("deleteMetadata" = Option<bool>, Query, description = "Forget cursors and subscription (default true)"),
    ),
    responses(
        (status = 200, description = "The answer", body = groups::GroupDeleted),
        crate::http::admin_api::Refused,
    )
)]
pub async fn delete_for_queue(
    AxState(app): AxState<State>,
    PathParams((group, queue)): PathParams<(String, String)>,
    q: QueryString,
) -> Result<Json<groups::GroupDeleted>, Problem> {
    let group = GroupName::parse(group)?;
    let queue = QueueName::parse(queue)?;
    let delete_metadata = query(q)?.flag("deleteMetadata")?.unwrap_or(true);
    Ok(Json(
        groups::delete_for_queue(
            &app.pool,
            app.backend,
            &app.catalog,
            &group,
            &queue,
            delete_metadata,
        )
        .await?,
    ))
}

/// Sets where the group reads its queues from (`subscriptionTimestamp`).
#[utoipa::path(
    post,
    path = "/api/v1/consumer-groups/{group}/subscription",
    params(
        ("group" = String, Path, description = "Consumer group name"),
    ),
    request_body(content = crate::http::admin_api::SubscriptionBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The answer", body = groups::SubscriptionSet),
        crate::http::admin_api::Refused,
    )
)]
pub async fn subscription(
    AxState(app): AxState<State>,
    PathParams(group): PathParams<String>,
    JsonBody(body): JsonBody<Map<String, Value>>,
) -> Result<Json<groups::SubscriptionSet>, Problem> {
    let group = GroupName::parse(group)?;
    let params = Params::Json(body);
    let at = params.time("subscriptionTimestamp")?.ok_or_else(|| {
        Problem::bad_request(
            Code::ParameterMissing,
            "`subscriptionTimestamp` is required",
        )
    })?;
    Ok(Json(
        groups::set_subscription(&app.pool, app.backend, &group, at).await?,
    ))
}

/// Where a seek body points: `{"toEnd": true}`, `{"toStart": true}` or
/// `{"timestamp": "…"}`.
fn target(body: Map<String, Value>) -> Result<Target, Problem> {
    let params = Params::Json(body);
    let to_end = params.flag("toEnd")?.unwrap_or(false);
    let to_start = params.flag("toStart")?.unwrap_or(false);
    let at = match params.text("timestamp")? {
        Some(t) => Some(parse_time("timestamp", &t)?),
        None => None,
    };
    match (to_end, to_start, at) {
        (true, false, None) => Ok(Target::End),
        (false, true, None) => Ok(Target::Start),
        (false, false, Some(t)) => Ok(Target::Time(t)),
        _ => Err(Problem::bad_request(
            Code::SeekTargetInvalid,
            "give exactly one of toEnd=true, toStart=true or a timestamp",
        )),
    }
}

/// Moves the group's cursors of every partition of the queue.
#[utoipa::path(
    post,
    path = "/api/v1/consumer-groups/{group}/queues/{queue}/seek",
    params(
        ("group" = String, Path, description = "Consumer group name"),
        ("queue" = String, Path, description = "Queue name"),
    ),
    request_body(content = crate::http::admin_api::SeekBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The answer", body = groups::Sought),
        crate::http::admin_api::Refused,
    )
)]
pub async fn seek(
    AxState(app): AxState<State>,
    PathParams((group, queue)): PathParams<(String, String)>,
    JsonBody(body): JsonBody<Map<String, Value>>,
) -> Result<Json<groups::Sought>, Problem> {
    let group = GroupName::parse(group)?;
    let queue = QueueName::parse(queue)?;
    let target = target(body)?;
    Ok(Json(
        groups::seek(
            &app.pool,
            app.backend,
            &app.catalog,
            &group,
            &queue,
            None,
            target,
        )
        .await?,
    ))
}

/// Moves the group's cursor of one partition.
#[utoipa::path(
    post,
    path = "/api/v1/consumer-groups/{group}/queues/{queue}/partitions/{partition}/seek",
    params(
        ("group" = String, Path, description = "Consumer group name"),
        ("queue" = String, Path, description = "Queue name"),
        ("partition" = String, Path, description = "Partition name"),
    ),
    request_body(content = crate::http::admin_api::SeekBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The answer", body = groups::Sought),
        crate::http::admin_api::Refused,
    )
)]
pub async fn seek_partition(
    AxState(app): AxState<State>,
    PathParams((group, queue, partition)): PathParams<(String, String, String)>,
    JsonBody(body): JsonBody<Map<String, Value>>,
) -> Result<Json<groups::Sought>, Problem> {
    let group = GroupName::parse(group)?;
    let queue = QueueName::parse(queue)?;
    let partition = PartitionName::parse(partition)?;
    let target = target(body)?;
    Ok(Json(
        groups::seek(
            &app.pool,
            app.backend,
            &app.catalog,
            &group,
            &queue,
            Some(&partition),
            target,
        )
        .await?,
    ))
}
