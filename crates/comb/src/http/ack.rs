//! `POST /api/v1/ack` and `POST /api/v1/ack/batch`.

use axum::Extension;
use axum::extract::State as AxState;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::body::JsonBody;
use super::{Problem, State};
use crate::ack::{AckItem, AckOutcome, AckStatus};
use crate::auth::Principal;
use crate::code::Code;
use crate::queue::GroupName;

/// One acknowledgement as sent by a consumer.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = AckItem)]
pub(crate) struct AckIn {
    /// The message's `transactionId`.
    pub(crate) transaction_id: String,
    /// The message's partition (a UUID).
    pub(crate) partition_id: String,
    /// `completed`, `failed`, `retry` or `dlq`.
    #[schema(value_type = AckStatusName)]
    pub(crate) status: String,
    /// The lease the message was popped under.
    pub(crate) lease_id: Option<String>,
    /// The group that popped it; the queue-mode group when absent.
    pub(crate) consumer_group: Option<String>,
    /// Why processing failed, kept with the message.
    pub(crate) error: Option<String>,
}

/// What became of a message.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum AckStatusName {
    /// Processed.
    Completed,
    /// Processing failed: an attempt is counted, and it is retried or dead-lettered.
    Failed,
    /// As `failed`.
    Retry,
    /// Dead-lettered now.
    Dlq,
}

/// Many acknowledgements.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = AckBatchRequest)]
pub(crate) struct AckBatchIn {
    pub(crate) acknowledgments: Vec<AckIn>,
    /// The group of items that name none.
    pub(crate) consumer_group: Option<String>,
}

/// The answer for one acknowledgement.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = AckResult)]
pub(crate) struct AckOut {
    /// The item's place in the request.
    pub(crate) index: usize,
    pub(crate) transaction_id: String,
    pub(crate) success: bool,
    /// Why not, as `code: sentence`, when `success` is false.
    pub(crate) error: Option<String>,
    pub(crate) queue_name: Option<String>,
    pub(crate) partition_name: Option<String>,
    /// Whether this ack ended the lease (its last message settled).
    pub(crate) lease_released: bool,
    /// Whether the message was dead-lettered.
    pub(crate) dlq: bool,
}

/// Longest error text kept with a failed message.
const MAX_ERROR_LEN: usize = 8192;

/// Acknowledge one message.
///
/// Settles a message popped under a lease: `completed`, or `failed`/`retry` (an attempt is
/// counted; the message is handed out again or dead-lettered past `retryLimit`), or `dlq`.
/// A refused ack is a problem answer with the refusal's code.
#[utoipa::path(
    post,
    path = "/api/v1/ack",
    tag = "messages",
    operation_id = "ack",
    request_body = AckIn,
    responses((status = 200, description = "Settled: one result.", body = [AckOut]))
)]
pub(crate) async fn ack_one(
    AxState(app): AxState<State>,
    principal: Option<Extension<Principal>>,
    JsonBody(body): JsonBody<AckIn>,
) -> Result<axum::Json<Vec<AckOut>>, Problem> {
    let item = validate(body, None, "")?;
    super::guard::check_partitions(
        &app,
        principal.as_deref(),
        std::iter::once(item.partition_id),
    )
    .await?;
    let txid = item.transaction_id.clone();
    let outcome = app
        .acker
        .settle(vec![item])
        .await?
        .pop()
        .expect("one outcome per item");
    if let Err(refusal) = outcome.result {
        return Err(refusal.refusal("").into());
    }
    Ok(axum::Json(vec![out(0, txid, outcome)]))
}

/// Acknowledge many messages.
///
/// Each item succeeds or fails on its own (`success`, `error`); an invalid item fails the
/// whole request before anything is settled.
#[utoipa::path(
    post,
    path = "/api/v1/ack/batch",
    tag = "messages",
    operation_id = "ackBatch",
    request_body = AckBatchIn,
    responses((status = 200, description = "One result per item, in request order.", body = [AckOut]))
)]
pub(crate) async fn ack_batch(
    AxState(app): AxState<State>,
    principal: Option<Extension<Principal>>,
    JsonBody(body): JsonBody<AckBatchIn>,
) -> Result<axum::Json<Vec<AckOut>>, Problem> {
    if body.acknowledgments.is_empty() {
        // Queen accepts an empty list and acks nothing.
        return Ok(axum::Json(Vec::new()));
    }
    let max = app.config.max_batch;
    if body.acknowledgments.len() > max {
        return Err(Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            Code::BatchTooLarge,
            format!(
                "an ack batch may hold at most {max} items, got {}",
                body.acknowledgments.len()
            ),
        ));
    }
    let default_group = body.consumer_group;
    let items = body
        .acknowledgments
        .into_iter()
        .enumerate()
        .map(|(i, a)| {
            validate(
                a,
                default_group.as_deref(),
                &format!("acknowledgments[{i}]: "),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    super::guard::check_partitions(
        &app,
        principal.as_deref(),
        items.iter().map(|i| i.partition_id),
    )
    .await?;
    let txids: Vec<String> = items.iter().map(|i| i.transaction_id.clone()).collect();
    let outcomes = app.acker.settle(items).await?;
    Ok(axum::Json(
        outcomes
            .into_iter()
            .zip(txids)
            .enumerate()
            .map(|(i, (o, t))| out(i, t, o))
            .collect(),
    ))
}

/// Validates one ack; `at` prefixes messages with the item's place in a batch.
pub(super) fn validate(
    a: AckIn,
    default_group: Option<&str>,
    at: &str,
) -> Result<AckItem, Problem> {
    let partition_id = Uuid::parse_str(&a.partition_id).map_err(|_| {
        Problem::bad_request(
            Code::PartitionIdInvalid,
            format!("{at}partitionId must be a UUID, got {:?}", a.partition_id),
        )
    })?;
    let status = match a.status.as_str() {
        "completed" => AckStatus::Completed,
        "failed" => AckStatus::Failed,
        "retry" => AckStatus::Retry,
        "dlq" => AckStatus::Dlq,
        other => {
            return Err(Problem::bad_request(
                Code::AckStatusInvalid,
                format!("{at}status must be completed, failed, retry or dlq, got {other:?}"),
            ));
        }
    };
    let lease_id = a
        .lease_id
        .map(|l| {
            Uuid::parse_str(&l).map_err(|_| {
                Problem::bad_request(
                    Code::LeaseIdInvalid,
                    format!("{at}leaseId must be a UUID, got {l:?}"),
                )
            })
        })
        .transpose()?;
    let group = match a
        .consumer_group
        .or_else(|| default_group.map(str::to_string))
    {
        Some(group) => GroupName::parse(group)
            .map_err(|e| Problem::bad_request(e.code, format!("{at}{}", e.message)))?
            .into_owned(),
        None => GroupName::queue_mode(),
    };
    if a.transaction_id.is_empty()
        || a.transaction_id.len() > 255
        || a.transaction_id.chars().any(char::is_control)
    {
        return Err(Problem::bad_request(
            Code::TransactionIdInvalid,
            format!("{at}transactionId must be 1-255 bytes without control characters"),
        ));
    }
    // Error texts are free-form (stack traces with newlines and tabs are welcome); only NUL,
    // which PostgreSQL text cannot hold, is replaced.
    let error = a.error.map(|e| e.replace('\0', "\u{FFFD}")).map(|mut e| {
        if e.len() > MAX_ERROR_LEN {
            let mut cut = MAX_ERROR_LEN;
            while !e.is_char_boundary(cut) {
                cut -= 1;
            }
            e.truncate(cut);
        }
        e
    });
    Ok(AckItem {
        partition_id,
        transaction_id: a.transaction_id,
        group,
        status,
        lease_id,
        error,
    })
}

/// The answer for one ack, in the shape Queen's clients read.
pub(super) fn out(index: usize, transaction_id: String, o: AckOutcome) -> AckOut {
    let (success, error) = match o.result {
        Ok(()) => (true, None),
        Err(r) => (false, Some(format!("{}: {}", r.code(), r.message()))),
    };
    AckOut {
        index,
        transaction_id,
        success,
        error,
        queue_name: o.queue_name,
        partition_name: o.partition_name,
        lease_released: o.lease_released,
        dlq: o.dlq,
    }
}
