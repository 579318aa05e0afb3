//! Queen's streams routes (`/streams/v1/…`, in Queen's shapes) and their listing
//! (`GET /api/v1/streams/queries`): decode, check, call [`crate::streams`], answer.

use crate::code::Code;
use axum::Extension;
use axum::extract::State as AxState;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use uuid::Uuid;

use super::body::{JsonBody, LimitedBody, parse_json};
use super::push::{PushItem, PushResult, results};
use super::{Problem, State};
use crate::auth::Principal;
use crate::queue::{GroupName, QUEUE_MODE_GROUP, QueueName};
use crate::streams::{
    Cycle, CycleAck, Registration, STATE_KEY_MAX_BYTES, STATE_VALUE_MAX_BYTES, StateOp, StateQuery,
};

/// Longest query name and config hash.
const MAX_NAME_LEN: usize = 255;

/// A stream query to register.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = StreamQueryRequest)]
pub(crate) struct RegisterIn {
    /// Required.
    pub(crate) name: Option<String>,
    /// Required: the queue the query reads.
    pub(crate) source_queue: Option<String>,
    /// The queue its cycles push to.
    pub(crate) sink_queue: Option<String>,
    /// Required: a registration with another hash under the same name is refused, unless `reset`.
    pub(crate) config_hash: Option<String>,
    /// Start the query afresh: its state is forgotten (false when null or absent).
    pub(crate) reset: Option<bool>,
}

/// A registered query.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = StreamQueryRegistered)]
pub(crate) struct RegisterOut {
    pub(crate) success: bool,
    pub(crate) query_id: Uuid,
    pub(crate) name: String,
    pub(crate) config_hash: String,
    /// Registered by this request.
    pub(crate) fresh: bool,
    /// Reset by this request.
    pub(crate) reset: bool,
}

/// Register a stream query (idempotent for the same config hash).
#[utoipa::path(
    post,
    path = "/streams/v1/queries",
    tag = "streams",
    operation_id = "registerStreamQuery",
    request_body = RegisterIn,
    responses((status = 200, description = "Registered.", body = RegisterOut))
)]
pub(crate) async fn register(
    AxState(app): AxState<State>,
    JsonBody(body): JsonBody<RegisterIn>,
) -> Result<axum::Json<RegisterOut>, Problem> {
    let text = |v: Option<String>, field: &str| -> Result<String, Problem> {
        match v {
            Some(s) if !s.is_empty() && s.len() <= MAX_NAME_LEN && !s.contains('\0') => Ok(s),
            _ => Err(Problem::bad_request(
                Code::StreamQueryInvalid,
                format!("{field} is required: 1-{MAX_NAME_LEN} bytes"),
            )),
        }
    };
    let name = text(body.name, "name")?;
    let source_queue = text(body.source_queue, "source_queue")?;
    let config_hash = text(body.config_hash, "config_hash")?;
    let named = |field: &str, text: String| {
        QueueName::parse(text)
            .map_err(|e| Problem::bad_request(e.code, format!("{field}: {}", e.message)))
    };
    let source_queue = named("source_queue", source_queue)?;
    let sink_queue = body
        .sink_queue
        .filter(|s| !s.is_empty())
        .map(|s| named("sink_queue", s))
        .transpose()?;
    let r = app
        .streams
        .register(&Registration {
            name,
            source_queue,
            sink_queue,
            config_hash,
            reset: body.reset.unwrap_or(false),
        })
        .await?;
    Ok(axum::Json(RegisterOut {
        success: true,
        query_id: r.query_id,
        name: r.name,
        config_hash: r.config_hash,
        fresh: r.fresh,
        reset: r.reset,
    }))
}

/// One cycle of a stream query on one partition: state ops, sink pushes and the source ack,
/// committed together or not at all.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = StreamCycleRequest)]
pub(crate) struct CycleIn<'a> {
    #[schema(value_type = String, format = Uuid)]
    query_id: Option<String>,
    #[schema(value_type = String, format = Uuid)]
    partition_id: Option<String>,
    consumer_group: Option<String>,
    /// None when null or absent (Queen's Go SDK sends `null` for an empty list).
    #[serde(default, borrow)]
    #[schema(value_type = Option<Vec<StateOpIn>>)]
    state_ops: Option<Vec<&'a RawValue>>,
    /// None when null or absent.
    #[serde(default, borrow)]
    push_items: Option<Vec<PushItem<'a>>>,
    ack: Option<AckIn>,
    /// End the lease after the ack (true by default).
    release_lease: Option<bool>,
}

/// The cycle's ack of its source messages: the next `count` of the lease, completed.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = StreamCycleAck)]
struct AckIn {
    transaction_id: Option<String>,
    lease_id: Option<String>,
    /// `completed` (or `success`) only.
    status: Option<String>,
    count: Option<u64>,
}

/// A change to the query's state on the partition.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = StreamStateOp)]
struct StateOpIn<'a> {
    /// `upsert` or `delete`.
    #[serde(rename = "type")]
    kind: Option<String>,
    key: Option<String>,
    /// Absent: an empty object; present, `null` included: stored as sent (as Queen does).
    #[serde(default, borrow, deserialize_with = "present")]
    #[schema(value_type = Option<Value>)]
    value: Option<&'a RawValue>,
}

/// A field that is present, `null` included (serde's `Option` would read `null` as absent).
fn present<'de: 'a, 'a, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<&'a RawValue>, D::Error> {
    <&'a RawValue as Deserialize>::deserialize(d).map(Some)
}

/// The answer of a committed cycle.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = StreamCycleResult)]
pub(crate) struct CycleOut<'a> {
    success: bool,
    query_id: Uuid,
    partition_id: Uuid,
    #[serde(rename = "queueName")]
    queue_name: String,
    state_ops_applied: usize,
    push_results: Vec<PushResult<'a>>,
    /// The source ack, when the cycle had one.
    ack_result: Option<CycleAckOut>,
}

/// What the cycle's ack did.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = StreamCycleAckResult)]
pub(crate) struct CycleAckOut {
    pub(crate) success: bool,
    pub(crate) count: usize,
    pub(crate) lease_released: bool,
    pub(crate) dlq: bool,
}

fn uuid_field(v: Option<&str>, field: &str) -> Result<Uuid, Problem> {
    v.and_then(|s| Uuid::parse_str(s).ok()).ok_or_else(|| {
        Problem::bad_request(
            if field == "query_id" {
                Code::QueryIdInvalid
            } else {
                Code::PartitionIdInvalid
            },
            format!("{field} is required: a UUID"),
        )
    })
}

/// Decodes one state op; every malformed op is refused before anything reaches the database.
fn state_op(i: usize, raw: &RawValue) -> Result<StateOp, Problem> {
    let bad = |detail: String| Problem::bad_request(Code::StateOpInvalid, detail);
    let op: StateOpIn =
        serde_json::from_str(raw.get()).map_err(|e| bad(format!("state_ops[{i}]: {e}")))?;
    let key = match op.key {
        Some(k) if !k.is_empty() && k.len() <= STATE_KEY_MAX_BYTES && !k.contains('\0') => k,
        _ => {
            return Err(bad(format!(
                "state_ops[{i}]: key is required: 1-{STATE_KEY_MAX_BYTES} bytes"
            )));
        }
    };
    match op.kind.as_deref() {
        Some("upsert") => {
            let value = match op.value {
                // Queen stores an upsert without a value as an empty object.
                None => Value::Object(Default::default()),
                Some(v) if v.get().len() > STATE_VALUE_MAX_BYTES => {
                    return Err(Problem::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        Code::StateValueTooLarge,
                        format!(
                            "state_ops[{i}]: the value of `{key}` holds {} bytes of JSON; \
                             a state value may hold at most {STATE_VALUE_MAX_BYTES}",
                            v.get().len()
                        ),
                    ));
                }
                Some(v) => serde_json::from_str(v.get())
                    .map_err(|e| bad(format!("state_ops[{i}]: {e}")))?,
            };
            Ok(StateOp::Upsert { key, value })
        }
        Some("delete") => Ok(StateOp::Delete { key }),
        other => Err(bad(format!(
            "state_ops[{i}]: type must be \"upsert\" or \"delete\", got {other:?}"
        ))),
    }
}

/// Commit one cycle of a stream query.
///
/// State ops, sink pushes and the source ack of one cycle, all committed or none.
#[utoipa::path(
    post,
    path = "/streams/v1/cycle",
    tag = "streams",
    operation_id = "streamCycle",
    request_body = CycleIn,
    responses((status = 200, description = "Committed.", body = CycleOut))
)]
pub(crate) async fn cycle(
    AxState(app): AxState<State>,
    principal: Option<Extension<Principal>>,
    LimitedBody(bytes): LimitedBody,
) -> Result<axum::response::Response, Problem> {
    let principal = principal.map(|p| p.0);
    let body: CycleIn = parse_json(&bytes)?;
    let query_id = uuid_field(body.query_id.as_deref(), "query_id")?;
    let partition_id = uuid_field(body.partition_id.as_deref(), "partition_id")?;
    let group = body
        .consumer_group
        .filter(|g| !g.is_empty())
        .unwrap_or_else(|| QUEUE_MODE_GROUP.to_string());
    let group = GroupName::parse(group)?;
    let state_ops = body
        .state_ops
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, raw)| state_op(i, raw))
        .collect::<Result<Vec<_>, _>>()?;
    let ack = body.ack.map(validate_ack).transpose()?;
    let push_items = body.push_items.unwrap_or_default();
    let max = app.config.max_batch;
    if state_ops.len() + push_items.len() > max {
        return Err(Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            Code::BatchTooLarge,
            format!("a cycle may hold at most {max} state ops and messages together"),
        ));
    }
    let items = if push_items.is_empty() {
        Vec::new()
    } else {
        let items = super::push::validate(push_items, max, principal.as_ref())?;
        app.modes.admit_push(&app.pool).await?;
        items
    };
    let done = app
        .streams
        .cycle(
            Cycle {
                query_id,
                partition_id,
                group,
                state_ops,
                items,
                ack,
                release_lease: body.release_lease.unwrap_or(true),
            },
            &bytes,
            principal.and_then(|p| p.sub),
        )
        .await?;
    let body = CycleOut {
        success: true,
        query_id,
        partition_id,
        queue_name: done.source_queue.clone(),
        state_ops_applied: done.state_ops_applied,
        push_results: results(&done.messages, &done.stored),
        ack_result: done.acked.map(|(count, released)| CycleAckOut {
            success: true,
            count,
            lease_released: released,
            dlq: false,
        }),
    };
    Ok(axum::response::IntoResponse::into_response(axum::Json(
        body,
    )))
}

/// The cycle's source ack. Only completions: a cycle that cannot process its messages
/// commits nothing and lets the lease end, which counts the attempt.
fn validate_ack(a: AckIn) -> Result<CycleAck, Problem> {
    let bad = |detail: &str| Problem::bad_request(Code::AckInvalid, format!("ack: {detail}"));
    let transaction_id = match a.transaction_id {
        Some(t) if !t.is_empty() && t.len() <= 255 && !t.chars().any(char::is_control) => t,
        _ => return Err(bad("transactionId is required: 1-255 bytes")),
    };
    match a.status.as_deref() {
        None | Some("completed") | Some("success") => {}
        Some(other) => {
            return Err(Problem::bad_request(
                Code::AckStatusInvalid,
                format!("ack: status must be completed, got {other:?}"),
            ));
        }
    }
    let lease_id = match a.lease_id.as_deref() {
        None | Some("") => None,
        Some(l) => Some(Uuid::parse_str(l).map_err(|_| {
            Problem::bad_request(
                Code::LeaseIdInvalid,
                format!("ack: leaseId must be a UUID, got {l:?}"),
            )
        })?),
    };
    let count = match a.count {
        None => 1,
        Some(n) if (1..=100_000).contains(&n) => n as usize,
        Some(_) => return Err(bad("count must be 1-100000")),
    };
    Ok(CycleAck {
        transaction_id,
        lease_id,
        count,
    })
}

/// Which state to read.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = StreamStateRequest)]
pub(crate) struct StateGetIn {
    #[schema(value_type = String, format = Uuid)]
    pub(crate) query_id: Option<String>,
    #[schema(value_type = String, format = Uuid)]
    pub(crate) partition_id: Option<String>,
    /// These keys (all when empty, null or absent).
    #[serde(default)]
    pub(crate) keys: Option<Vec<String>>,
    /// Only keys starting with this.
    pub(crate) key_prefix: Option<String>,
    /// Only keys whose value's `ripe_at` (ms since the epoch) is at or before this.
    pub(crate) ripe_at_or_before: Option<Value>,
}

/// A query's state on one partition.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = StreamState)]
pub(crate) struct StateGetOut {
    pub(crate) success: bool,
    pub(crate) rows: Vec<StateRowOut>,
}

/// One key of a query's state.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = StreamStateRow)]
pub(crate) struct StateRowOut {
    pub(crate) key: String,
    pub(crate) value: Value,
    /// When it was written (RFC 3339, milliseconds).
    pub(crate) updated_at: Option<String>,
}

/// Read a stream query's state on one partition, by key.
#[utoipa::path(
    post,
    path = "/streams/v1/state/get",
    tag = "streams",
    operation_id = "streamStateGet",
    request_body = StateGetIn,
    responses((status = 200, description = "The state.", body = StateGetOut))
)]
pub(crate) async fn state_get(
    AxState(app): AxState<State>,
    JsonBody(body): JsonBody<StateGetIn>,
) -> Result<axum::Json<StateGetOut>, Problem> {
    let query_id = uuid_field(body.query_id.as_deref(), "query_id")?;
    let partition_id = uuid_field(body.partition_id.as_deref(), "partition_id")?;
    // Queen ignores a bound that is not a number.
    let ripe_at_or_before = body
        .ripe_at_or_before
        .as_ref()
        .and_then(|v| v.as_i64().or_else(|| v.as_f64().map(|f| f.floor() as i64)));
    let rows = app
        .streams
        .state(&StateQuery {
            query_id,
            partition_id,
            keys: body.keys.unwrap_or_default(),
            key_prefix: body.key_prefix.filter(|p| !p.is_empty()),
            ripe_at_or_before,
        })
        .await?;
    let rows = rows
        .into_iter()
        .map(|r| StateRowOut {
            updated_at: r
                .updated_ms
                .and_then(chrono::DateTime::from_timestamp_millis)
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
            key: r.key,
            value: r.value,
        })
        .collect();
    Ok(axum::Json(StateGetOut {
        success: true,
        rows,
    }))
}

/// Every registered stream query.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = StreamQueries)]
pub(crate) struct QueriesOut {
    pub(crate) queries: Vec<crate::streams::QueryListed>,
}

/// List stream queries: every registered query, its partitions and their state.
#[utoipa::path(
    get,
    path = "/api/v1/streams/queries",
    tag = "streams",
    operation_id = "listStreamQueries",
    responses((status = 200, description = "Every registered query.", body = QueriesOut))
)]
pub(crate) async fn list(AxState(app): AxState<State>) -> Result<axum::Json<QueriesOut>, Problem> {
    let queries = app.streams.list().await?;
    Ok(axum::Json(QueriesOut { queries }))
}
