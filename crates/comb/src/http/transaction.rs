//! `POST /api/v1/transaction`: acks and pushes committed together, or not at all.
//!
//! This is what makes exactly-once pipelines possible: a consumer acks what it read and pushes
//! what it produced in one PostgreSQL transaction. Every ack must be under the live lease of
//! its partition (named or not); one refused ack fails the whole transaction.

use axum::extract::State as AxState;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use super::ack::{AckIn, AckOut, out, refused};
use super::body::{LimitedBody, parse_json};
use super::push::{PushItem, PushResult, check_capacity, resolve, results};
use super::{Problem, State};
use crate::ack::{AckItem, settle_in};
use crate::db::DbError;
use crate::push::{NewMessage, Stored, store_in};

/// The transaction request body. Operations are kept raw until their `type` is known:
/// push payloads are captured verbatim, which serde's tagged-enum buffering cannot do.
#[derive(Deserialize)]
pub struct TransactionIn<'a> {
    #[serde(borrow)]
    operations: Vec<&'a RawValue>,
}

/// One operation of a transaction; pushed items borrow from the request body.
pub enum Operation<'a> {
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
            Problem::bad_request("field_invalid", format!("operations[{i}]: {e}"))
        };
        let kind: Kind = serde_json::from_str(text).map_err(invalid)?;
        match kind.kind.as_deref() {
            Some("ack") => Ok(Operation::Ack(serde_json::from_str(text).map_err(invalid)?)),
            Some("push") => {
                let op: PushOp = serde_json::from_str(text).map_err(invalid)?;
                Ok(Operation::Push { items: op.items })
            }
            other => Err(Problem::bad_request(
                "operation_invalid",
                format!("operations[{i}]: type must be \"ack\" or \"push\", got {other:?}"),
            )),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TransactionOut<'a> {
    transaction_id: Uuid,
    success: bool,
    results: Vec<OperationOut<'a>>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum OperationOut<'a> {
    Ack(AckOut),
    Push { results: Vec<PushResult<'a>> },
}

/// Where each operation's items landed in the flattened lists.
enum Slot {
    Ack(usize),
    Push(std::ops::Range<usize>),
}

/// Validates every operation, then runs them all in one PostgreSQL transaction.
pub async fn transaction(
    AxState(app): AxState<State>,
    LimitedBody(bytes): LimitedBody,
) -> Result<axum::response::Response, Problem> {
    let body: TransactionIn = parse_json(&bytes)?;
    if body.operations.is_empty() {
        return Err(Problem::bad_request(
            "items_empty",
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
                        "items_empty",
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
            "batch_too_large",
            format!("a transaction may hold at most {max} acks and messages together"),
        ));
    }
    let messages = if push_items.is_empty() {
        Vec::new()
    } else {
        super::push::validate(&push_items, max)?;
        super::push::refuse_in_maintenance(&app).await?;
        check_capacity(&app, &push_items).await?;
        resolve(&app, push_items, &bytes).await?
    };

    let ack_txids: Vec<String> = acks.iter().map(|a| a.transaction_id.clone()).collect();
    let (ack_outcomes, stored) = run(&app, &acks, &messages).await?;
    for q in messages.iter().map(|m| &*m.queue) {
        app.wake.pushed(q);
    }

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

/// Runs acks, then pushes, in one transaction; any refusal rolls everything back.
async fn run(
    app: &State,
    acks: &[AckItem],
    messages: &[NewMessage],
) -> Result<(Vec<crate::ack::AckOutcome>, Vec<Stored>), Problem> {
    let mut client = app.pool.get().await.map_err(DbError::from)?;
    let tx = client.transaction().await.map_err(DbError::from)?;
    let ack_refs: Vec<&AckItem> = acks.iter().collect();
    let outcomes = if acks.is_empty() {
        Vec::new()
    } else {
        settle_in(&tx, &ack_refs, true).await?
    };
    if let Some((i, refusal)) = outcomes
        .iter()
        .enumerate()
        .find_map(|(i, o)| o.result.err().map(|r| (i, r)))
    {
        // Dropping the transaction rolls it back: nothing of this request happened.
        return Err(refused(refusal, &format!("ack {i}: ")));
    }
    let msg_refs: Vec<&NewMessage> = messages.iter().collect();
    let stored = if messages.is_empty() {
        Vec::new()
    } else {
        store_in(&tx, &msg_refs).await?
    };
    if let Some(i) = stored.iter().position(|s| *s == Stored::PartitionGone) {
        app.catalog.forget_queue(&messages[i].queue);
        return Err(Problem::conflict(
            "queue_deleted",
            format!(
                "queue `{}` was deleted while the transaction was in flight; retry it",
                messages[i].queue
            ),
        ));
    }
    tx.commit().await.map_err(DbError::from)?;
    let statuses: Vec<_> = acks.iter().map(|a| a.status).collect();
    app.metrics.messages.settled(&statuses, &outcomes);
    app.metrics.messages.stored(&stored);
    Ok((outcomes, stored))
}
