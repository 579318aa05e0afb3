//! `POST /api/v1/transaction`: decode and check the operations, commit them through
//! [`crate::transaction`], answer per operation.

use axum::extract::State as AxState;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use super::ack::{AckIn, AckOut, out};
use super::body::{LimitedBody, parse_json};
use super::push::{PushItem, PushResult, results};
use super::{Problem, State};
use crate::ack::AckItem;
use crate::code::Code;

/// The transaction request body. Operations are kept raw until their `type` is known:
/// push payloads are captured verbatim, which serde's tagged-enum buffering cannot do.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = TransactionRequest)]
pub(crate) struct TransactionIn<'a> {
    /// Acks and pushes, committed together or not at all.
    #[serde(borrow)]
    #[schema(value_type = Vec<OperationIn>)]
    operations: Vec<&'a RawValue>,
}

/// One operation of a transaction, as the document describes it (read by [`Operation::parse`]).
#[derive(utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
#[schema(as = TransactionOperation)]
#[allow(dead_code)]
pub(crate) enum OperationIn {
    /// Acknowledge a message: strictly, under its live lease.
    Ack(#[schema(inline)] AckIn),
    /// Push messages.
    Push { items: Vec<PushItem<'static>> },
}

/// One operation of a transaction; pushed items borrow from the request body.
pub(crate) enum Operation<'a> {
    Ack(AckIn),
    Push { items: Vec<PushItem<'a>> },
}

#[derive(Deserialize)]
struct Kind {
    #[serde(rename = "type")]
    kind: Option<String>,
}

#[derive(Deserialize)]
struct PushOp<'a> {
    #[serde(borrow)]
    items: Vec<PushItem<'a>>,
}

impl<'a> Operation<'a> {
    fn parse(i: usize, raw: &'a RawValue) -> Result<Operation<'a>, Problem> {
        let text = raw.get();
        let invalid = |e: serde_json::Error| {
            Problem::bad_request(Code::FieldInvalid, format!("operations[{i}]: {e}"))
        };
        let kind: Kind = serde_json::from_str(text).map_err(invalid)?;
        match kind.kind.as_deref() {
            Some("ack") => Ok(Operation::Ack(serde_json::from_str(text).map_err(invalid)?)),
            Some("push") => {
                let op: PushOp = serde_json::from_str(text).map_err(invalid)?;
                Ok(Operation::Push { items: op.items })
            }
            other => Err(Problem::bad_request(
                Code::OperationInvalid,
                format!("operations[{i}]: type must be \"ack\" or \"push\", got {other:?}"),
            )),
        }
    }
}

/// The answer of a committed transaction: one result per operation, in request order.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = TransactionResponse)]
pub(crate) struct TransactionOut<'a> {
    transaction_id: Uuid,
    success: bool,
    results: Vec<OperationOut<'a>>,
}

/// The result of one operation of a transaction.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
#[schema(as = TransactionOperationResult)]
pub(crate) enum OperationOut<'a> {
    Ack(AckOut),
    Push { results: Vec<PushResult<'a>> },
}

/// Where each operation's items landed in the flattened lists.
enum Slot {
    Ack(usize),
    Push(std::ops::Range<usize>),
}

/// Acknowledge and push in one transaction.
///
/// Validates every operation, then runs them all in one PostgreSQL transaction: every ack
/// must hold under its live lease, and nothing is committed unless everything is.
#[utoipa::path(
    post,
    path = "/api/v1/transaction",
    tag = "messages",
    operation_id = "transaction",
    request_body = TransactionIn,
    responses((status = 200, description = "Committed.", body = TransactionOut))
)]
pub(crate) async fn transaction(
    AxState(app): AxState<State>,
    principal: Option<axum::Extension<crate::auth::Principal>>,
    LimitedBody(bytes): LimitedBody,
) -> Result<axum::response::Response, Problem> {
    let principal = principal.map(|p| p.0);
    let body: TransactionIn = parse_json(&bytes)?;
    if body.operations.is_empty() {
        return Err(Problem::bad_request(
            Code::ItemsEmpty,
            "`operations` must hold at least one operation",
        ));
    }
    let mut acks: Vec<AckItem> = Vec::new();
    let mut push_items: Vec<PushItem> = Vec::new();
    let mut slots = Vec::with_capacity(body.operations.len());
    for (i, raw) in body.operations.iter().enumerate() {
        match Operation::parse(i, raw)? {
            Operation::Ack(a) => {
                slots.push(Slot::Ack(acks.len()));
                acks.push(super::ack::validate(
                    a,
                    None,
                    &format!("operations[{i}]: "),
                )?);
            }
            Operation::Push { items } => {
                if items.is_empty() {
                    return Err(Problem::bad_request(
                        Code::ItemsEmpty,
                        format!("operations[{i}]: `items` must hold at least one message"),
                    ));
                }
                let start = push_items.len();
                push_items.extend(items);
                slots.push(Slot::Push(start..push_items.len()));
            }
        }
    }
    let max = app.config.max_batch;
    if acks.len() + push_items.len() > max {
        return Err(Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            Code::BatchTooLarge,
            format!("a transaction may hold at most {max} acks and messages together"),
        ));
    }
    super::guard::check_partitions(
        &app,
        principal.as_ref(),
        acks.iter().map(|a| a.partition_id),
    )
    .await?;
    let push_items = if push_items.is_empty() {
        Vec::new()
    } else {
        let items = super::push::validate(push_items, max, principal.as_ref())?;
        app.modes.admit_push(&app.pool).await?;
        items
    };
    let ack_txids: Vec<String> = acks.iter().map(|a| a.transaction_id.clone()).collect();
    let committed = app
        .transactions
        .commit(&acks, push_items, &bytes, principal.and_then(|p| p.sub))
        .await?;
    let (ack_outcomes, messages, stored) = (committed.acks, committed.messages, committed.stored);

    let mut ack_outcomes = ack_outcomes.into_iter().map(Some).collect::<Vec<_>>();
    let results = slots
        .into_iter()
        .map(|slot| match slot {
            Slot::Ack(k) => OperationOut::Ack(out(
                k,
                ack_txids[k].clone(),
                ack_outcomes[k].take().expect("each ack answered once"),
            )),
            Slot::Push(range) => OperationOut::Push {
                results: results(&messages[range.clone()], &stored[range]),
            },
        })
        .collect();
    let body = TransactionOut {
        transaction_id: Uuid::now_v7(),
        success: true,
        results,
    };
    Ok(axum::response::IntoResponse::into_response(axum::Json(
        body,
    )))
}
