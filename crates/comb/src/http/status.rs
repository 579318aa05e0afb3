//! Status and analytics: `/api/v1/status…`, `/api/v1/analytics/…` and `/api/v1/stats/refresh`.

use axum::Json;
use axum::extract::State as AxState;

use super::params::{Params, PathParams, QueryString, query};
use super::resources::optional_queue;
use super::{Problem, State};
use crate::admin::status::{self, Range};
use crate::queue::QueueName;

fn range(params: &Params) -> Result<Range, Problem> {
    Ok(Range::new(params.time("from")?, params.time("to")?)?)
}

/// Overview with throughput over `from`..`to` (default the last hour).
#[utoipa::path(
    get,
    path = "/api/v1/status",
    params(
        crate::http::admin_api::RangeParams,
    ),
    responses(
        (status = 200, description = "The answer", body = status::Status),
        crate::http::admin_api::Refused,
    )
)]
pub async fn status(
    AxState(app): AxState<State>,
    q: QueryString,
) -> Result<Json<status::Status>, Problem> {
    let params = query(q)?;
    Ok(Json(status::status(&app.pool, range(&params)?).await?))
}

/// A page of queues with their figures.
#[utoipa::path(
    get,
    path = "/api/v1/status/queues",
    params(
        crate::http::admin_api::PageParams,
    ),
    responses(
        (status = 200, description = "The answer", body = crate::admin::resources::QueueList),
        crate::http::admin_api::Refused,
    )
)]
pub async fn queues(
    AxState(app): AxState<State>,
    q: QueryString,
) -> Result<Json<crate::admin::resources::QueueList>, Problem> {
    let page = query(q)?.page()?;
    Ok(Json(status::queues(&app.pool, page).await?))
}

/// One queue with its partitions, groups and depth and lag over the range.
#[utoipa::path(
    get,
    path = "/api/v1/status/queues/{queue}",
    params(
        ("queue" = String, Path, description = "Queue name"),
        crate::http::admin_api::RangeParams,
        crate::http::admin_api::PageParams,
    ),
    responses(
        (status = 200, description = "The answer", body = status::QueueStatus),
        crate::http::admin_api::Refused,
    )
)]
pub async fn queue(
    AxState(app): AxState<State>,
    PathParams(queue): PathParams<String>,
    q: QueryString,
) -> Result<Json<status::QueueStatus>, Problem> {
    let queue = QueueName::parse(queue)?;
    let params = query(q)?;
    Ok(Json(
        status::queue(&app.pool, &queue, range(&params)?, params.page()?).await?,
    ))
}

/// Throughput, errors, depth and lag per bucket over the range, of every queue or of `queue`.
#[utoipa::path(
    get,
    path = "/api/v1/status/analytics",
    params(
        crate::http::admin_api::RangeParams,
        ("queue" = Option<String>, Query, description = "Only this queue"),
    ),
    responses(
        (status = 200, description = "The answer", body = status::Analytics),
        crate::http::admin_api::Refused,
    )
)]
pub async fn analytics(
    AxState(app): AxState<State>,
    q: QueryString,
) -> Result<Json<status::Analytics>, Problem> {
    let params = query(q)?;
    let queue = optional_queue(&params)?;
    Ok(Json(
        status::analytics(&app.pool, range(&params)?, queue.as_deref()).await?,
    ))
}

/// PostgreSQL's statistics of the database and Comb's tables.
#[utoipa::path(
    get,
    path = "/api/v1/analytics/postgres-stats",
    responses(
        (status = 200, description = "The answer", body = status::PostgresStats),
        crate::http::admin_api::Refused,
    )
)]
pub async fn postgres_stats(
    AxState(app): AxState<State>,
) -> Result<Json<status::PostgresStats>, Problem> {
    Ok(Json(status::postgres_stats(&app.pool).await?))
}

/// This server: process, uptime, request pool and requests served.
#[utoipa::path(
    get,
    path = "/api/v1/analytics/system-metrics",
    responses(
        (status = 200, description = "The answer", body = status::SystemMetrics),
        crate::http::admin_api::Refused,
    )
)]
pub async fn system_metrics(
    AxState(app): AxState<State>,
) -> Result<Json<status::SystemMetrics>, Problem> {
    let pool = app.pools.status();
    let rss_kb = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            })
        });
    let requests: u64 = app.durations.iter().map(|d| d.count()).sum();
    Ok(Json(status::SystemMetrics {
        server: app.config.listen.to_string(),
        pid: std::process::id(),
        uptime_seconds: app.started.elapsed().as_secs_f64(),
        memory: status::Memory {
            resident_bytes: rss_kb.map(|k| k * 1024),
        },
        database: status::PoolFigures {
            pool_size: pool.size,
            pool_idle: pool.available,
            pool_max: pool.max_size,
            waiting: pool.waiting,
        },
        requests,
        maintenance_leader: app.metrics.maintenance.leader.get() > 0.0,
    }))
}

/// What each server did over the range, from the per-minute counters every server writes.
#[utoipa::path(
    get,
    path = "/api/v1/analytics/worker-metrics",
    params(
        crate::http::admin_api::RangeParams,
    ),
    responses(
        (status = 200, description = "The answer", body = status::Servers),
        crate::http::admin_api::Refused,
    )
)]
pub async fn worker_metrics(
    AxState(app): AxState<State>,
    q: QueryString,
) -> Result<Json<status::Servers>, Problem> {
    let params = query(q)?;
    Ok(Json(status::servers(&app.pool, range(&params)?).await?))
}

/// Comb's figures are computed when asked, from heads and cursors: nothing to refresh. Answers
/// when they were computed, for Queen's clients that ask.
#[utoipa::path(
    post,
    path = "/api/v1/stats/refresh",
    responses(
        (status = 200, description = "The answer", body = status::Refreshed),
        crate::http::admin_api::Refused,
    )
)]
pub async fn refresh(AxState(app): AxState<State>) -> Result<Json<status::Refreshed>, Problem> {
    let overview = crate::admin::resources::overview(&app.pool).await?;
    Ok(Json(status::Refreshed {
        success: true,
        refreshed: true,
        computed_at: overview.timestamp,
        queues: overview.queues,
    }))
}
