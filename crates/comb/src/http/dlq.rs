//! `GET /api/v1/dlq`: a queue's dead letters, in Queen's shape.

use std::collections::HashMap;

use axum::extract::{Query, State as AxState};
use chrono::{DateTime, Utc};
use serde_json::json;

use super::params::Params;
use super::{Problem, State};
use crate::admin::dead_letters::{DeadLetterEntry, DeadLetterList};
use crate::code::Code;
use crate::dead_letter::{self, Filter, MAX_LIMIT, MAX_OFFSET};
use crate::queue::{GroupName, PartitionName, QueueName};

/// Lists dead letters of a queue, newest first: `queue` (required), `consumerGroup`,
/// `partition`, `from`, `to` (RFC 3339), `limit` (100), `offset` (0).
#[utoipa::path(
    get,
    path = "/api/v1/dlq",
    params(
        ("queue" = String, Query, description = "Queue name"),
        ("consumerGroup" = Option<String>, Query, description = "Only this group"),
        ("partition" = Option<String>, Query, description = "Only this partition"),
        ("from" = Option<String>, Query, description = "Dead-lettered at or after (RFC 3339 or a date)"),
        ("to" = Option<String>, Query, description = "Dead-lettered at or before (RFC 3339 or a date)"),
        crate::http::admin_api::PageParams,
    ),
    responses(
        (status = 200, description = "The answer", body = DeadLetterList),
        crate::http::admin_api::Refused,
    )
)]
pub async fn list(
    AxState(app): AxState<State>,
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<DeadLetterList>, Problem> {
    let params = Params::Query(
        query
            .map(|q| q.0)
            .map_err(|e| Problem::bad_request(Code::ParameterInvalid, e.body_text()))?,
    );
    let queue = params
        .text("queue")?
        .ok_or_else(|| Problem::bad_request(Code::QueueNameInvalid, "`queue` is required"))?;
    let queue = QueueName::parse(queue)?;
    let group = params
        .text("consumerGroup")?
        .filter(|g| !g.is_empty())
        .map(GroupName::parse)
        .transpose()?;
    let partition = params
        .text("partition")?
        .filter(|p| !p.is_empty())
        .map(PartitionName::parse)
        .transpose()?;
    let limit = params.uint("limit")?.unwrap_or(100) as i64;
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(Problem::bad_request(
            Code::ParameterInvalid,
            format!("parameter `limit` must be between 1 and {MAX_LIMIT}"),
        ));
    }
    let offset = params.uint("offset")?.unwrap_or(0) as i64;
    if offset > MAX_OFFSET {
        return Err(Problem::bad_request(
            Code::ParameterInvalid,
            format!("parameter `offset` must be at most {MAX_OFFSET}"),
        ));
    }
    let filter = Filter {
        queue,
        group,
        partition,
        from: time(&params, "from")?,
        to: time(&params, "to")?,
        limit,
        offset,
    };
    let Some(page) = dead_letter::list(&app.pool, &filter).await? else {
        return Err(Problem::not_found(
            Code::QueueNotFound,
            format!("queue `{}` does not exist", filter.queue),
        ));
    };
    let mut messages = Vec::with_capacity(page.letters.len());
    for d in &page.letters {
        // A dead letter is often there because its payload could not be read: listing it
        // must not fail on that. It shows as the administration listings show a payload no
        // key opens (`{"encrypted": true}`), or as a string saying it is not JSON.
        let data = match app.keys.open_json(&d.payload) {
            Ok(data) => serde_json::to_value(&data).unwrap_or(serde_json::Value::Null),
            Err(crate::encryption::OpenError::NoKey) => json!({"encrypted": true}),
            Err(crate::encryption::OpenError::NotJson) => {
                json!("payload not shown: the stored payload is not valid JSON")
            }
        };
        messages.push(DeadLetterEntry {
            id: d.id,
            message_id: d.message_id,
            partition_id: d.partition_id,
            transaction_id: d.transaction_id.clone(),
            consumer_group: d.group.clone(),
            error_message: d.error.clone(),
            retry_count: d.attempts,
            original_created_at: d.created_at,
            moved_to_dlq_at: d.dead_at,
            message_created_at: d.created_at,
            queue_name: filter.queue.to_string(),
            namespace: page.namespace.clone(),
            task: page.task.clone(),
            partition_name: d.partition.clone(),
            data,
            trace_id: d.trace_id.clone(),
            producer_sub: d.producer_sub.clone(),
        });
    }
    Ok(axum::Json(DeadLetterList {
        messages,
        total: page.total,
        limit: filter.limit,
        offset: filter.offset,
    }))
}

fn time(params: &Params, name: &str) -> Result<Option<DateTime<Utc>>, Problem> {
    let Some(text) = params.text(name)?.filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let parsed = DateTime::parse_from_rfc3339(&text)
        .map(|t| t.with_timezone(&Utc))
        .or_else(|_| {
            // Queen's examples use plain dates (`2024-01-31`): the day's start, UTC.
            chrono::NaiveDate::parse_from_str(&text, "%Y-%m-%d")
                .map(|d| d.and_hms_opt(0, 0, 0).expect("midnight").and_utc())
        })
        .map_err(|_| {
            Problem::bad_request(
                Code::ParameterInvalid,
                format!("parameter `{name}` must be an RFC 3339 time or a date, got {text:?}"),
            )
        })?;
    Ok(Some(parsed))
}
