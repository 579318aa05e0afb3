//! `POST /api/v1/push`: validate every item, resolve names, hand the batch to the push fuser.

use std::borrow::Cow;

use axum::Extension;
use axum::extract::State as AxState;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use super::body::{LimitedBody, parse_json};
use super::{Problem, State};
use crate::auth::Principal;
use crate::code::Code;
use crate::push::{Item, NewMessage, Stored, TransactionId};
use crate::queue::{NameInvalid, PartitionName, QueueName};

/// Longest transaction or trace id.
const MAX_ID_LEN: usize = 255;

/// The push request body, decoded borrowing from the request's bytes.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = PushRequest)]
pub(crate) struct PushBody<'a> {
    #[serde(borrow)]
    items: Vec<PushItem<'a>>,
}

/// One message to push. Its strings and payload point into the request body; only strings
/// with JSON escapes are copied.
#[derive(Deserialize, utoipa::ToSchema)]
pub(crate) struct PushItem<'a> {
    /// The queue, created on first use.
    #[serde(borrow)]
    #[schema(value_type = String)]
    queue: Text<'a>,
    /// The partition, created on first use; `Default` when absent.
    #[serde(borrow)]
    #[schema(value_type = Option<String>)]
    partition: Option<Text<'a>>,
    /// Any JSON value, stored and delivered as sent.
    #[serde(borrow)]
    #[schema(value_type = Value)]
    payload: &'a RawValue,
    /// The producer's id for the message: a partition stores one message per id.
    #[serde(rename = "transactionId", borrow)]
    #[schema(value_type = Option<String>)]
    transaction_id: Option<Text<'a>>,
    /// Carried with the message to its consumers.
    #[serde(rename = "traceId", borrow)]
    #[schema(value_type = Option<String>)]
    trace_id: Option<Text<'a>>,
}

/// A string of the request body: borrowed when it holds no escapes, decoded otherwise.
pub(crate) struct Text<'a>(Cow<'a, str>);

impl std::ops::Deref for Text<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a str>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Text<'a>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }

            fn visit_str<E>(self, v: &str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }

            fn visit_string<E>(self, v: String) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(Visit(std::marker::PhantomData))
    }
}

/// The answer for one pushed message.
// Read back by clients (`comb::wire`), its strings borrow from the answer's bytes.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
pub struct PushResult<'a> {
    /// The item's place in the request.
    index: usize,
    /// The item's `transactionId`, or the message id when it had none.
    #[serde(borrow)]
    #[schema(value_type = String)]
    transaction_id: TransactionId<'a>,
    /// The stored message; for a duplicate, the message first stored under its id.
    message_id: Uuid,
    partition_id: Uuid,
    /// `queued`, or `duplicate` when the partition already held the `transactionId`.
    status: PushStatus,
    #[serde(rename = "queueName")]
    queue_name: &'a str,
    trace_id: Option<&'a str>,
}

impl PushResult<'_> {
    /// The item's `transactionId`, or the message id when it had none.
    pub fn transaction_id(&self) -> String {
        self.transaction_id.with_str(str::to_string)
    }

    /// The stored message.
    pub fn message_id(&self) -> Uuid {
        self.message_id
    }

    /// The partition it was stored in.
    pub fn partition_id(&self) -> Uuid {
        self.partition_id
    }

    /// What became of it.
    pub fn status(&self) -> PushStatus {
        self.status
    }
}

/// What became of a pushed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PushStatus {
    /// Stored now.
    Queued,
    /// Already stored under its `transactionId`.
    Duplicate,
}

impl PushStatus {
    /// As on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            PushStatus::Queued => "queued",
            PushStatus::Duplicate => "duplicate",
        }
    }
}

/// A transaction id read back from an answer: the text as given (ids in answers are either
/// a producer's, which Queen's clients read as text, or a UUID's text).
impl<'de: 'a, 'a> Deserialize<'de> for TransactionId<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'a str>::deserialize(d).map(TransactionId::Client)
    }
}

/// Push messages to queues and partitions.
///
/// Stores a batch of messages durably, each in its queue and partition (both created on first
/// use), and answers with one result per item, in request order, once they are committed.
/// Pushing is idempotent per partition: an item whose `transactionId` the partition already
/// holds is reported as `duplicate` with the first message's id. Every item is validated before
/// anything is stored. A queue with a `maxSize` refuses a push that would take it past that
/// many pending messages (429 `queue_full`).
#[utoipa::path(
    post,
    path = "/api/v1/push",
    tag = "messages",
    operation_id = "push",
    request_body = PushBody,
    responses((status = 201, description = "Stored: one result per item, in request order.", body = [PushResult]))
)]
pub(crate) async fn push(
    AxState(app): AxState<State>,
    principal: Option<Extension<Principal>>,
    LimitedBody(bytes): LimitedBody,
) -> Result<Response, Problem> {
    let principal = principal.map(|p| p.0);
    let items = parse_json::<PushBody>(&bytes)?.items;
    if items.is_empty() {
        // Queen answers a push of nothing with an empty list; its clients rely on it.
        return Ok((
            StatusCode::CREATED,
            [(header::CONTENT_TYPE, "application/json")],
            "[]",
        )
            .into_response());
    }
    let items = validate(items, app.config.max_batch, principal.as_ref())?;
    app.modes.admit_push(&app.pool).await?;
    let sub = principal.and_then(|p| p.sub);
    let pushed = app.pusher.push(items, &bytes, sub).await?;
    Ok((
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        answer_json(&results(&pushed.messages, &pushed.stored)),
    )
        .into_response())
}

/// The push answer as JSON, written out by hand: keys and ids never need escaping, and
/// escaping them byte by byte was most of the cost of serialising a large push's answer.
/// What producers named (transaction and trace ids, queue names) is still escaped by
/// serde_json. The bytes are those `serde_json::to_vec(results)` would give.
pub(super) fn answer_json(results: &[PushResult<'_>]) -> Vec<u8> {
    use std::io::Write as _;
    let mut out = Vec::with_capacity(16 + results.len() * 200);
    let mut id = Uuid::encode_buffer();
    out.push(b'[');
    for (i, r) in results.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = write!(out, "{{\"index\":{},\"transaction_id\":", r.index);
        match r.transaction_id {
            TransactionId::Client(t) => {
                let _ = serde_json::to_writer(&mut out, t);
            }
            TransactionId::Own(t) => {
                out.push(b'"');
                out.extend_from_slice(t.hyphenated().encode_lower(&mut id).as_bytes());
                out.push(b'"');
            }
        }
        out.extend_from_slice(b",\"message_id\":\"");
        out.extend_from_slice(r.message_id.hyphenated().encode_lower(&mut id).as_bytes());
        out.extend_from_slice(b"\",\"partition_id\":\"");
        out.extend_from_slice(r.partition_id.hyphenated().encode_lower(&mut id).as_bytes());
        out.extend_from_slice(b"\",\"status\":\"");
        out.extend_from_slice(r.status.as_str().as_bytes());
        out.extend_from_slice(b"\",\"queueName\":");
        let _ = serde_json::to_writer(&mut out, r.queue_name);
        out.extend_from_slice(b",\"trace_id\":");
        let _ = serde_json::to_writer(&mut out, &r.trace_id);
        out.push(b'}');
    }
    out.push(b']');
    out
}

/// The answer for each pushed message, in order.
pub(super) fn results<'a>(messages: &'a [NewMessage], stored: &[Stored]) -> Vec<PushResult<'a>> {
    messages
        .iter()
        .zip(stored)
        .enumerate()
        .map(|(index, (m, s))| {
            let (status, message_id) = match s {
                Stored::Queued(id) => (PushStatus::Queued, *id),
                Stored::Duplicate(id) => (PushStatus::Duplicate, *id),
                Stored::PartitionGone => unreachable!("refused in store()"),
            };
            PushResult {
                index,
                transaction_id: m.transaction_id(),
                message_id,
                partition_id: m.partition_id,
                status,
                queue_name: &m.queue,
                trace_id: m.trace_id.as_deref(),
            }
        })
        .collect()
}

/// Checks every item before anything is stored, so one bad item fails only its own request,
/// and turns them into the items the push use case takes: names parsed, nothing copied
/// (strings move over). A token limited to some queues may push only to those.
pub(super) fn validate<'a>(
    items: Vec<PushItem<'a>>,
    max_batch: usize,
    principal: Option<&Principal>,
) -> Result<Vec<Item<'a>>, Problem> {
    if items.is_empty() {
        return Err(Problem::bad_request(
            Code::ItemsEmpty,
            "`items` must hold at least one message",
        ));
    }
    if items.len() > max_batch {
        return Err(Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            Code::BatchTooLarge,
            format!(
                "a push may hold at most {max_batch} items, got {}",
                items.len()
            ),
        ));
    }
    let mut valid = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let at =
            |e: NameInvalid| Problem::bad_request(e.code, format!("items[{i}]: {}", e.message));
        let queue = QueueName::parse(item.queue.0).map_err(at)?;
        let partition = item
            .partition
            .map(|p| PartitionName::parse(p.0))
            .transpose()
            .map_err(at)?;
        if let Some(t) = &item.transaction_id
            && (t.is_empty() || t.len() > MAX_ID_LEN || t.chars().any(char::is_control))
        {
            return Err(Problem::bad_request(
                Code::TransactionIdInvalid,
                format!(
                    "items[{i}]: transactionId must be 1-{MAX_ID_LEN} bytes without control characters"
                ),
            ));
        }
        if let Some(t) = &item.trace_id
            && (t.len() > MAX_ID_LEN || t.chars().any(char::is_control))
        {
            return Err(Problem::bad_request(
                Code::TraceIdInvalid,
                format!(
                    "items[{i}]: traceId must be at most {MAX_ID_LEN} bytes without control characters"
                ),
            ));
        }
        valid.push(Item {
            queue,
            partition,
            payload: item.payload.get(),
            transaction_id: item.transaction_id.map(|t| t.0),
            trace_id: item.trace_id.map(|t| t.0),
        });
    }
    super::guard::check_queues(principal, valid.iter().map(|i| i.queue.as_str()))?;
    Ok(valid)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names and payloads of a decoded push point into the body; only a name with an escape
    /// is a copy. Bad names are refused with their code and the item's place.
    #[test]
    fn decoded_names_borrow_the_body() {
        let body = br#"{"items": [
            {"queue": "orders", "partition": "p1", "payload": {"a": 1}},
            {"queue": "or\u0064ers", "payload": 2}
        ]}"#;
        let inside = |t: &str| body.as_ptr_range().contains(&t.as_ptr());
        let items = parse_json::<PushBody>(body).unwrap().items;
        let items = validate(items, 10, None).unwrap();
        assert!(inside(&items[0].queue));
        assert!(inside(items[0].partition.as_deref().unwrap()));
        assert!(inside(items[0].payload));
        assert_eq!(&*items[1].queue, "orders");
        assert!(
            !inside(&items[1].queue),
            "an escaped name is decoded into a copy"
        );
        assert!(inside(items[1].payload));

        let bad = br#"{"items": [{"queue": "q", "payload": 1}, {"queue": "q", "partition": "", "payload": 1}]}"#;
        let Err(refused) = validate(parse_json::<PushBody>(bad).unwrap().items, 10, None) else {
            panic!("an empty partition name passed");
        };
        assert_eq!(refused.code, Code::PartitionNameInvalid);
        assert!(
            refused.detail.starts_with("items[1]: "),
            "{}",
            refused.detail
        );
    }

    #[test]
    fn the_written_answer_is_what_serde_would_write() {
        let ids = [Uuid::now_v7(), Uuid::now_v7(), Uuid::new_v4()];
        let results = [
            PushResult {
                index: 0,
                transaction_id: TransactionId::Client("plain"),
                message_id: ids[0],
                partition_id: ids[1],
                status: PushStatus::Queued,
                queue_name: "orders",
                trace_id: None,
            },
            PushResult {
                index: 1,
                transaction_id: TransactionId::Client("quote \" backslash \\ tab \t é ✓ \u{1F600}"),
                message_id: ids[2],
                partition_id: ids[1],
                status: PushStatus::Duplicate,
                queue_name: "q.with-dash_1",
                trace_id: Some("trace \"x\" \u{7f} /"),
            },
            PushResult {
                index: 2,
                transaction_id: TransactionId::Own(ids[0]),
                message_id: ids[0],
                partition_id: ids[1],
                status: PushStatus::Queued,
                queue_name: "orders",
                trace_id: None,
            },
        ];
        let written = answer_json(&results);
        assert_eq!(
            String::from_utf8(written).unwrap(),
            serde_json::to_string(&results[..]).unwrap()
        );
        assert_eq!(answer_json(&[]), b"[]");
    }
}
