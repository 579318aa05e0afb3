//! Dead letters: `POST /api/v1/dlq/requeue` and `POST /api/v1/dlq/purge`.
//!
//! Both take a JSON body naming the queue and, optionally, `consumerGroup`, `partition`,
//! `ids` (entries), `from` and `to` (when they were dead-lettered).

use axum::Json;
use axum::extract::State as AxState;
use serde_json::{Map, Value};
use uuid::Uuid;

use super::body::JsonBody;
use super::params::Params;
use super::{Problem, State};
use crate::admin::dead_letters::{self, PurgeAnswer, RequeueAnswer, Selection};
use crate::admin::{partition_id, queue_id};
use crate::code::Code;
use crate::queue::{GroupName, PartitionName, QueueName};
use crate::refusal::Refusal;

/// Most entry ids one request names.
const MAX_IDS: usize = 10_000;

async fn selection(
    app: &State,
    body: Map<String, Value>,
) -> Result<(QueueName<'static>, Selection), Problem> {
    let ids = match body.get("ids") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => {
            if items.len() > MAX_IDS {
                return Err(Problem::bad_request(
                    Code::IdsTooMany,
                    format!("at most {MAX_IDS} ids per request"),
                ));
            }
            let mut ids = Vec::with_capacity(items.len());
            for i in items {
                ids.push(
                    i.as_str()
                        .and_then(|s| Uuid::parse_str(s).ok())
                        .ok_or_else(|| {
                            Problem::bad_request(
                                Code::IdsInvalid,
                                "`ids` must be dead letter ids (UUIDs)",
                            )
                        })?,
                );
            }
            Some(ids)
        }
        Some(_) => {
            return Err(Problem::bad_request(
                Code::IdsInvalid,
                "`ids` must be an array of dead letter ids",
            ));
        }
    };
    let params = Params::Json(body);
    let queue = params
        .text("queue")?
        .ok_or_else(|| Problem::bad_request(Code::QueueNameInvalid, "`queue` is required"))?;
    let queue = QueueName::parse(queue)?;
    let group = params
        .text("consumerGroup")?
        .map(GroupName::parse)
        .transpose()?;
    let partition = params
        .text("partition")?
        .map(PartitionName::parse)
        .transpose()?;
    let client = app.pool.get().await.map_err(crate::db::DbError::from)?;
    let qid = queue_id(&**client, &queue).await?;
    let pid = match &partition {
        Some(p) => Some(partition_id(&**client, app.backend, qid, &queue, p).await?),
        None => None,
    };
    Ok((
        queue,
        Selection {
            queue_id: qid,
            group,
            ids,
            partition: pid,
            from: params.time("from")?,
            to: params.time("to")?,
        },
    ))
}

/// Stores the selected dead letters again at the end of their partitions, in their order.
#[utoipa::path(
    post,
    path = "/api/v1/dlq/requeue",
    request_body(content = crate::http::admin_api::DeadLetterSelection, content_type = "application/json"),
    responses(
        (status = 200, description = "The answer", body = RequeueAnswer),
        crate::http::admin_api::Refused,
    )
)]
pub async fn requeue(
    AxState(app): AxState<State>,
    JsonBody(body): JsonBody<Map<String, Value>>,
) -> Result<Json<RequeueAnswer>, Problem> {
    let (queue, selection) = selection(&app, body).await?;
    let done = dead_letters::requeue(&app.pool, app.backend, &selection)
        .await
        .map_err(Problem::from)?;
    if done.stored > 0 {
        app.wake.requeued(&queue);
    }
    Ok(Json(RequeueAnswer {
        requeued: done.requeued,
        messages: done.stored,
        consumer_groups: done.groups,
        remaining: done.remaining,
        queue: queue.to_string(),
    }))
}

/// Deletes the selected dead letters.
#[utoipa::path(
    post,
    path = "/api/v1/dlq/purge",
    request_body(content = crate::http::admin_api::DeadLetterSelection, content_type = "application/json"),
    responses(
        (status = 200, description = "The answer", body = PurgeAnswer),
        crate::http::admin_api::Refused,
    )
)]
pub async fn purge(
    AxState(app): AxState<State>,
    JsonBody(body): JsonBody<Map<String, Value>>,
) -> Result<Json<PurgeAnswer>, Problem> {
    let (queue, selection) = selection(&app, body).await?;
    let purged = dead_letters::purge(&app.pool, &selection)
        .await
        .map_err(|e: Refusal| Problem::from(e))?;
    Ok(Json(PurgeAnswer {
        purged,
        queue: queue.to_string(),
    }))
}
