//! Resources: `GET /api/v1/resources/…` listings and `DELETE /api/v1/queues/{queue}/clear`.

use axum::Json;
use axum::extract::State as AxState;

use super::params::{PathParams, QueryString, query};
use super::{Problem, State};
use crate::admin::resources::{self, Grouping, QueueFilter};
use crate::queue::{PartitionName, QueueName};

/// The optional `queue` parameter of a listing, parsed like a queue name in a path.
pub(super) fn optional_queue(
    params: &super::params::Params,
) -> Result<Option<QueueName<'static>>, Problem> {
    Ok(params.text("queue")?.map(QueueName::parse).transpose()?)
}

/// The optional `partition` parameter of a request, parsed as a partition's name.
pub(super) fn optional_partition(
    params: &super::params::Params,
) -> Result<Option<PartitionName<'static>>, Problem> {
    Ok(params
        .text("partition")?
        .map(PartitionName::parse)
        .transpose()?)
}

/// Counts and depth of everything.
#[utoipa::path(
    get,
    path = "/api/v1/resources/overview",
    responses(
        (status = 200, description = "The answer", body = resources::Overview),
        crate::http::admin_api::Refused,
    )
)]
pub async fn overview(AxState(app): AxState<State>) -> Result<Json<resources::Overview>, Problem> {
    Ok(Json(resources::overview(&app.pool).await?))
}

/// A page of queues with their depth, in flight, dead letters and oldest pending age.
#[utoipa::path(
    get,
    path = "/api/v1/resources/queues",
    params(
        ("namespace" = Option<String>, Query, description = "Only queues of this namespace"),
        ("task" = Option<String>, Query, description = "Only queues of this task"),
        ("search" = Option<String>, Query, description = "Only queues whose name contains this"),
        crate::http::admin_api::PageParams,
    ),
    responses(
        (status = 200, description = "The answer", body = resources::QueueList),
        crate::http::admin_api::Refused,
    )
)]
pub async fn queues(
    AxState(app): AxState<State>,
    q: QueryString,
) -> Result<Json<resources::QueueList>, Problem> {
    let params = query(q)?;
    let filter = QueueFilter {
        namespace: params.text("namespace")?,
        task: params.text("task")?,
        search: params.text("search")?,
    };
    Ok(Json(
        resources::queues(&app.pool, &filter, params.page()?).await?,
    ))
}

/// One queue with a page of its partitions and its groups' lag.
#[utoipa::path(
    get,
    path = "/api/v1/resources/queues/{queue}",
    params(
        ("queue" = String, Path, description = "Queue name"),
        crate::http::admin_api::PageParams,
    ),
    responses(
        (status = 200, description = "The answer", body = resources::QueueDetail),
        crate::http::admin_api::Refused,
    )
)]
pub async fn queue(
    AxState(app): AxState<State>,
    PathParams(queue): PathParams<String>,
    q: QueryString,
) -> Result<Json<resources::QueueDetail>, Problem> {
    let queue = QueueName::parse(queue)?;
    let page = query(q)?.page()?;
    Ok(Json(resources::queue(&app.pool, &queue, page).await?))
}

/// A page of partitions (of `queue` if given).
#[utoipa::path(
    get,
    path = "/api/v1/resources/partitions",
    params(
        ("queue" = Option<String>, Query, description = "Only partitions of this queue"),
        crate::http::admin_api::PageParams,
    ),
    responses(
        (status = 200, description = "The answer", body = resources::PartitionList),
        crate::http::admin_api::Refused,
    )
)]
pub async fn partitions(
    AxState(app): AxState<State>,
    q: QueryString,
) -> Result<Json<resources::PartitionList>, Problem> {
    let params = query(q)?;
    let queue = optional_queue(&params)?;
    Ok(Json(
        resources::partitions(&app.pool, queue.as_deref(), params.page()?).await?,
    ))
}

/// Namespaces with their queues' counts and depth.
#[utoipa::path(
    get,
    path = "/api/v1/resources/namespaces",
    responses(
        (status = 200, description = "The answer", body = resources::GroupingList),
        crate::http::admin_api::Refused,
    )
)]
pub async fn namespaces(
    AxState(app): AxState<State>,
) -> Result<Json<resources::GroupingList>, Problem> {
    Ok(Json(
        resources::groupings(&app.pool, Grouping::Namespace).await?,
    ))
}

/// Tasks with their queues' counts and depth.
#[utoipa::path(
    get,
    path = "/api/v1/resources/tasks",
    responses(
        (status = 200, description = "The answer", body = resources::GroupingList),
        crate::http::admin_api::Refused,
    )
)]
pub async fn tasks(AxState(app): AxState<State>) -> Result<Json<resources::GroupingList>, Problem> {
    Ok(Json(resources::groupings(&app.pool, Grouping::Task).await?))
}

/// Passes everything pending in a queue (or `?partition=`) for every group.
#[utoipa::path(
    delete,
    path = "/api/v1/queues/{queue}/clear",
    params(
        ("queue" = String, Path, description = "Queue name"),
        ("partition" = Option<String>, Query, description = "Only this partition"),
    ),
    responses(
        (status = 200, description = "The answer", body = resources::Cleared),
        crate::http::admin_api::Refused,
    )
)]
pub async fn clear(
    AxState(app): AxState<State>,
    PathParams(queue): PathParams<String>,
    q: QueryString,
) -> Result<Json<resources::Cleared>, Problem> {
    let queue = QueueName::parse(queue)?;
    let partition = optional_partition(&query(q)?)?;
    Ok(Json(
        resources::clear(
            &app.pool,
            app.backend,
            &app.catalog,
            &queue,
            partition.as_deref(),
        )
        .await?,
    ))
}
