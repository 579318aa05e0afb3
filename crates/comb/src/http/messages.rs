//! Messages: `GET /api/v1/messages` and one message's lookup, delete, retry and dead-lettering.

use axum::Json;
use axum::extract::State as AxState;
use uuid::Uuid;

use super::params::{PathParams, QueryString, query};
use super::resources::{optional_partition, optional_queue};
use super::{Problem, State};
use crate::admin::messages::{self, Filter, Status};
use crate::code::Code;
use crate::queue::GroupName;

/// A page of messages by queue, partition, status (for `consumerGroup`) and time.
#[utoipa::path(
    get,
    path = "/api/v1/messages",
    params(
        ("queue" = Option<String>, Query, description = "Only this queue"),
        ("partition" = Option<String>, Query, description = "Only this partition"),
        ("consumerGroup" = Option<String>, Query, description = "Status as this group sees it"),
        ("status" = Option<String>, Query, description = "pending, processing, completed or dead_letter"),
        ("from" = Option<String>, Query, description = "Stored at or after (RFC 3339)"),
        ("to" = Option<String>, Query, description = "Stored at or before (RFC 3339)"),
        crate::http::admin_api::PageParams,
    ),
    responses(
        (status = 200, description = "The answer", body = messages::MessageListing),
        crate::http::admin_api::Refused,
    )
)]
pub async fn list(
    AxState(app): AxState<State>,
    q: QueryString,
) -> Result<Json<messages::MessageListing>, Problem> {
    let params = query(q)?;
    let status = match params.text("status")? {
        None => None,
        Some(s) => Some(Status::parse(&s).ok_or_else(|| {
            Problem::bad_request(
                Code::StatusInvalid,
                format!("status must be pending, processing, completed or dead_letter, got {s:?}"),
            )
        })?),
    };
    let filter = Filter {
        queue: optional_queue(&params)?,
        partition: optional_partition(&params)?,
        group: params
            .text("consumerGroup")?
            .map(GroupName::parse)
            .transpose()?,
        status,
        from: params.time("from")?,
        to: params.time("to")?,
    };
    Ok(Json(
        messages::list(&app.pool, app.backend, &filter, params.page()?).await?,
    ))
}

fn ids(partition: &str, transaction: String) -> Result<(Uuid, String), Problem> {
    let partition = Uuid::parse_str(partition).map_err(|_| {
        Problem::bad_request(
            Code::PartitionIdInvalid,
            format!("partitionId must be a UUID, got {partition:?}"),
        )
    })?;
    // A control character (NUL above all, which PostgreSQL text cannot hold) is in no stored
    // transaction id: pushes refuse them.
    if transaction.is_empty()
        || transaction.len() > crate::queue::MAX_NAME_LEN
        || transaction.chars().any(char::is_control)
    {
        return Err(Problem::bad_request(
            Code::TransactionIdInvalid,
            "transactionId must hold 1 to 255 bytes without control characters",
        ));
    }
    Ok((partition, transaction))
}

/// One message with its status per group and its dead letters.
#[utoipa::path(
    get,
    path = "/api/v1/messages/{partitionId}/{transactionId}",
    params(
        ("partitionId" = String, Path, description = "Partition id (UUID)"),
        ("transactionId" = String, Path, description = "Message transaction id"),
    ),
    responses(
        (status = 200, description = "The answer", body = messages::MessageDetail),
        crate::http::admin_api::Refused,
    )
)]
pub async fn get(
    AxState(app): AxState<State>,
    PathParams((partition, transaction)): PathParams<(String, String)>,
) -> Result<Json<messages::MessageDetail>, Problem> {
    let (p, t) = ids(&partition, transaction)?;
    Ok(Json(messages::get(&app.pool, app.backend, p, &t).await?))
}

/// Settles the message for every group.
#[utoipa::path(
    delete,
    path = "/api/v1/messages/{partitionId}/{transactionId}",
    params(
        ("partitionId" = String, Path, description = "Partition id (UUID)"),
        ("transactionId" = String, Path, description = "Message transaction id"),
    ),
    responses(
        (status = 200, description = "The answer", body = messages::MessageDeleted),
        crate::http::admin_api::Refused,
    )
)]
pub async fn delete(
    AxState(app): AxState<State>,
    PathParams((partition, transaction)): PathParams<(String, String)>,
) -> Result<Json<messages::MessageDeleted>, Problem> {
    let (p, t) = ids(&partition, transaction)?;
    Ok(Json(
        messages::delete(&app.pool, app.backend, &app.catalog, p, &t).await?,
    ))
}

/// Requeues a dead-lettered message, or resets a failed one's attempts.
#[utoipa::path(
    post,
    path = "/api/v1/messages/{partitionId}/{transactionId}/retry",
    params(
        ("partitionId" = String, Path, description = "Partition id (UUID)"),
        ("transactionId" = String, Path, description = "Message transaction id"),
    ),
    responses(
        (status = 200, description = "The answer", body = messages::MessageRetried),
        crate::http::admin_api::Refused,
    )
)]
pub async fn retry(
    AxState(app): AxState<State>,
    PathParams((partition, transaction)): PathParams<(String, String)>,
) -> Result<Json<messages::MessageRetried>, Problem> {
    let (p, t) = ids(&partition, transaction)?;
    let out = messages::retry(&app.pool, app.backend, p, &t).await?;
    app.wake.pushed(&out.queue, &[p]);
    Ok(Json(out))
}

/// Dead-letters the message for every group that has not settled it.
#[utoipa::path(
    post,
    path = "/api/v1/messages/{partitionId}/{transactionId}/dlq",
    params(
        ("partitionId" = String, Path, description = "Partition id (UUID)"),
        ("transactionId" = String, Path, description = "Message transaction id"),
    ),
    responses(
        (status = 200, description = "The answer", body = messages::MessageDeadLettered),
        crate::http::admin_api::Refused,
    )
)]
pub async fn dead_letter(
    AxState(app): AxState<State>,
    PathParams((partition, transaction)): PathParams<(String, String)>,
) -> Result<Json<messages::MessageDeadLettered>, Problem> {
    let (p, t) = ids(&partition, transaction)?;
    Ok(Json(
        messages::dead_letter(&app.pool, app.backend, &app.catalog, p, &t).await?,
    ))
}
