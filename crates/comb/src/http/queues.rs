//! Queue resources: `DELETE /api/v1/resources/queues/{queue}` (see `admin::resources::delete_queue`).

use axum::extract::State as AxState;

use super::params::PathParams;

use super::{Problem, State};
use crate::admin::resources::QueueDeleted;
use crate::queue::QueueName;

/// Deletes a queue and everything the catalog knows of it.
#[utoipa::path(
    delete,
    path = "/api/v1/resources/queues/{queue}",
    params(
        ("queue" = String, Path, description = "Queue name"),
    ),
    responses(
        (status = 200, description = "The answer", body = QueueDeleted),
        crate::http::admin_api::Refused,
    )
)]
pub(crate) async fn delete_queue(
    AxState(app): AxState<State>,
    PathParams(queue): PathParams<String>,
) -> Result<axum::Json<QueueDeleted>, Problem> {
    let queue = QueueName::parse(queue)?;
    Ok(axum::Json(
        crate::admin::resources::delete_queue(&app.pool, &app.catalog, &queue).await?,
    ))
}
