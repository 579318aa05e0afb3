//! Traces: `POST /api/v1/traces` and the reads by message, by name, and of the names.

use axum::Json;
use axum::extract::State as AxState;
use axum::http::StatusCode;
use serde_json::{Map, Value};
use uuid::Uuid;

use super::body::JsonBody;
use super::params::{Params, PathParams, QueryString, query};
use super::{Problem, State};
use crate::admin::traces::{self, MAX_DATA_BYTES, MAX_NAMES, NewTrace};
use crate::code::Code;
use crate::queue::{GroupName, MAX_NAME_LEN, QUEUE_MODE_GROUP};

fn partition_id(text: &str) -> Result<Uuid, Problem> {
    Uuid::parse_str(text).map_err(|_| {
        Problem::bad_request(
            Code::PartitionIdInvalid,
            format!("partitionId must be a UUID, got {text:?}"),
        )
    })
}

fn short_text(name: &str, text: &str) -> Result<(), Problem> {
    if text.is_empty() || text.len() > MAX_NAME_LEN {
        return Err(Problem::bad_request(
            Code::FieldInvalid,
            format!("`{name}` must hold 1 to {MAX_NAME_LEN} bytes"),
        ));
    }
    Ok(())
}

/// Records an event on a message: `transactionId`, `partitionId`, `data` (required),
/// `consumerGroup`, `eventType`, `traceNames` (a name or a list).
#[utoipa::path(
    post,
    path = "/api/v1/traces",
    request_body(content = crate::http::admin_api::TraceBody, content_type = "application/json"),
    responses(
        (status = 201, description = "The event was recorded", body = traces::TraceRecorded),
        crate::http::admin_api::Refused,
    )
)]
pub async fn record(
    AxState(app): AxState<State>,
    JsonBody(mut body): JsonBody<Map<String, Value>>,
) -> Result<(StatusCode, Json<traces::TraceRecorded>), Problem> {
    let data = body
        .remove("data")
        .ok_or_else(|| Problem::bad_request(Code::ParameterMissing, "`data` is required"))?;
    if serde_json::to_vec(&data).map_or(0, |v| v.len()) > MAX_DATA_BYTES {
        return Err(Problem::bad_request(
            Code::DataTooLarge,
            format!("`data` may hold at most {MAX_DATA_BYTES} bytes of JSON"),
        ));
    }
    let names = match body.remove("traceNames") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                _ => Err(Problem::bad_request(
                    Code::FieldInvalid,
                    "`traceNames` must be a name or a list of names",
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(Problem::bad_request(
                Code::FieldInvalid,
                "`traceNames` must be a name or a list of names",
            ));
        }
    };
    if names.len() > MAX_NAMES {
        return Err(Problem::bad_request(
            Code::FieldInvalid,
            format!("at most {MAX_NAMES} trace names"),
        ));
    }
    for n in &names {
        short_text("traceNames", n)?;
    }
    let params = Params::Json(body);
    let transaction_id = params.text("transactionId")?.unwrap_or_default();
    short_text("transactionId", &transaction_id)?;
    let partition = params.text("partitionId")?.unwrap_or_default();
    let consumer_group = params
        .text("consumerGroup")?
        .unwrap_or_else(|| QUEUE_MODE_GROUP.to_string());
    let consumer_group = GroupName::parse(consumer_group)?;
    let event_type = params.text("eventType")?.unwrap_or_else(|| "info".into());
    short_text("eventType", &event_type)?;
    let trace = NewTrace {
        partition_id: partition_id(&partition)?,
        transaction_id,
        consumer_group,
        event_type,
        data,
        names,
    };
    Ok((
        StatusCode::CREATED,
        Json(traces::record(&app.pool, &trace).await?),
    ))
}

/// The events of one message, oldest first.
#[utoipa::path(
    get,
    path = "/api/v1/traces/{partitionId}/{transactionId}",
    params(
        ("partitionId" = String, Path, description = "Partition id (UUID)"),
        ("transactionId" = String, Path, description = "Message transaction id"),
    ),
    responses(
        (status = 200, description = "The answer", body = traces::MessageTraces),
        crate::http::admin_api::Refused,
    )
)]
pub async fn of_message(
    AxState(app): AxState<State>,
    PathParams((partition, transaction)): PathParams<(String, String)>,
) -> Result<Json<traces::MessageTraces>, Problem> {
    let p = partition_id(&partition)?;
    short_text("transactionId", &transaction)?;
    Ok(Json(traces::of_message(&app.pool, p, &transaction).await?))
}

/// A page of the events with one name, newest first.
#[utoipa::path(
    get,
    path = "/api/v1/traces/by-name/{traceName}",
    params(
        ("traceName" = String, Path, description = "Trace name"),
        crate::http::admin_api::PageParams,
    ),
    responses(
        (status = 200, description = "The answer", body = traces::NamedTraces),
        crate::http::admin_api::Refused,
    )
)]
pub async fn by_name(
    AxState(app): AxState<State>,
    PathParams(name): PathParams<String>,
    q: QueryString,
) -> Result<Json<traces::NamedTraces>, Problem> {
    short_text("traceName", &name)?;
    let page = query(q)?.page()?;
    Ok(Json(traces::by_name(&app.pool, &name, page).await?))
}

/// The names in use.
#[utoipa::path(
    get,
    path = "/api/v1/traces/names",
    params(
        crate::http::admin_api::PageParams,
    ),
    responses(
        (status = 200, description = "The answer", body = traces::TraceNames),
        crate::http::admin_api::Refused,
    )
)]
pub async fn names(
    AxState(app): AxState<State>,
    q: QueryString,
) -> Result<Json<traces::TraceNames>, Problem> {
    let page = query(q)?.page()?;
    Ok(Json(traces::names(&app.pool, app.backend, page).await?))
}
