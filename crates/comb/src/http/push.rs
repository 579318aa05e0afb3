//! `POST /api/v1/push`: validate every item, resolve names, hand the batch to the push fuser.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::State as AxState;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use super::body::{LimitedBody, parse_json};
use super::{Problem, State};
use crate::push::{NewMessage, PushJob, Stored, TransactionId};
use crate::queue::{DEFAULT_PARTITION, validate_partition_name, validate_queue_name};

/// Longest transaction or trace id.
const MAX_ID_LEN: usize = 255;

/// The push request body, decoded borrowing from the request's bytes.
#[derive(Deserialize)]
pub struct PushBody<'a> {
    #[serde(borrow)]
    items: Vec<PushItem<'a>>,
}

/// One message to push. Its strings and payload point into the request body; only strings
/// with JSON escapes are copied.
#[derive(Deserialize)]
pub struct PushItem<'a> {
    #[serde(borrow)]
    queue: Text<'a>,
    #[serde(borrow)]
    partition: Option<Text<'a>>,
    #[serde(borrow)]
    payload: &'a RawValue,
    #[serde(rename = "transactionId", borrow)]
    transaction_id: Option<Text<'a>>,
    #[serde(rename = "traceId", borrow)]
    trace_id: Option<Text<'a>>,
}

/// A string of the request body: borrowed when it holds no escapes, decoded otherwise.
pub struct Text<'a>(Cow<'a, str>);

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
#[derive(Serialize)]
pub(super) struct PushResult<'a> {
    index: usize,
    transaction_id: TransactionId<'a>,
    message_id: Uuid,
    partition_id: Uuid,
    status: &'static str,
    #[serde(rename = "queueName")]
    queue_name: &'a str,
    trace_id: Option<&'a str>,
}

/// Stores a batch of messages and answers only after they are committed.
pub async fn push(
    AxState(app): AxState<State>,
    LimitedBody(bytes): LimitedBody,
) -> Result<Response, Problem> {
    let items = parse_json::<PushBody>(&bytes)?.items;
    validate(&items, app.config.max_batch)?;
    refuse_in_maintenance(&app).await?;
    check_capacity(&app, &items).await?;
    let messages = resolve(&app, items, &bytes).await?;
    let (messages, stored) = store(&app, messages).await?;
    app.metrics.messages.stored(&stored);
    Ok((
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        answer_json(&results(&messages, &stored)),
    )
        .into_response())
}

/// While push maintenance mode is on, pushes are refused before anything is stored: 503 with
/// `Retry-After`, so producers retry later and nothing is lost.
pub(super) async fn refuse_in_maintenance(app: &State) -> Result<(), Problem> {
    if app
        .modes
        .is_on(&app.pool, crate::admin::modes::Mode::Push)
        .await
    {
        return Err(Problem::unavailable(
            "maintenance_mode",
            "pushes are paused by maintenance mode; retry later",
        ));
    }
    Ok(())
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
        out.extend_from_slice(r.status.as_bytes());
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
                Stored::Queued(id) => ("queued", *id),
                Stored::Duplicate(id) => ("duplicate", *id),
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

/// Refuses a push that would take a queue with `maxSize` past that many pending messages
/// (pending: not yet passed by its slowest consumer group). Checked before anything is
/// created, so a refused push leaves no trace; a queue that does not exist yet has no limit.
/// The count is taken before the push, so concurrent pushes may overshoot by what they carry.
pub(super) async fn check_capacity(app: &State, items: &[PushItem<'_>]) -> Result<(), Problem> {
    let mut incoming: HashMap<&str, u64> = HashMap::new();
    for item in items {
        *incoming.entry(&item.queue).or_default() += 1;
    }
    for (queue, n) in incoming {
        let Some(queue_id) = app.catalog.find_queue(&app.pool, queue).await? else {
            continue;
        };
        let max = app.catalog.options(&app.pool, queue_id).await?.max_size;
        if max == 0 {
            continue;
        }
        let pending = app.catalog.pending(&app.pool, queue_id).await?;
        if pending + n > max {
            return Err(Problem {
                retry_after: Some(1),
                ..Problem::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "queue_full",
                    format!(
                        "queue `{queue}` holds {pending} pending messages; its maxSize is {max}"
                    ),
                )
            });
        }
    }
    Ok(())
}

/// Checks every item before anything is stored, so one bad item fails only its own request.
pub(super) fn validate(items: &[PushItem<'_>], max_batch: usize) -> Result<(), Problem> {
    if items.is_empty() {
        return Err(Problem::bad_request(
            "items_empty",
            "`items` must hold at least one message",
        ));
    }
    if items.len() > max_batch {
        return Err(Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "batch_too_large",
            format!(
                "a push may hold at most {max_batch} items, got {}",
                items.len()
            ),
        ));
    }
    for (i, item) in items.iter().enumerate() {
        validate_queue_name(&item.queue)
            .map_err(|e| Problem::bad_request("queue_name_invalid", format!("items[{i}]: {e}")))?;
        if let Some(p) = &item.partition {
            validate_partition_name(p).map_err(|e| {
                Problem::bad_request("partition_name_invalid", format!("items[{i}]: {e}"))
            })?;
        }
        if let Some(t) = &item.transaction_id
            && (t.is_empty() || t.len() > MAX_ID_LEN || t.chars().any(char::is_control))
        {
            return Err(Problem::bad_request(
                "transaction_id_invalid",
                format!(
                    "items[{i}]: transactionId must be 1-{MAX_ID_LEN} bytes without control characters"
                ),
            ));
        }
        if let Some(t) = &item.trace_id
            && (t.len() > MAX_ID_LEN || t.chars().any(char::is_control))
        {
            return Err(Problem::bad_request(
                "trace_id_invalid",
                format!(
                    "items[{i}]: traceId must be at most {MAX_ID_LEN} bytes without control characters"
                ),
            ));
        }
    }
    Ok(())
}

/// Turns queue and partition names into ids, creating what does not exist yet. Each distinct
/// (queue, partition) of the request is resolved once: a batch usually names a few partitions
/// many times, and every look-up of the catalog hashes and copies its names. Payloads stay
/// slices of `body`, the bytes the items were decoded from.
pub(super) async fn resolve(
    app: &State,
    items: Vec<PushItem<'_>>,
    body: &Bytes,
) -> Result<Vec<NewMessage>, Problem> {
    let mut target_of: HashMap<(&str, &str), usize> = HashMap::new();
    let mut targets: Vec<(&str, &str)> = Vec::new();
    let slots: Vec<usize> = items
        .iter()
        .map(|i| {
            *target_of
                .entry((&i.queue, partition_of(i)))
                .or_insert_with_key(|&key| {
                    targets.push(key);
                    targets.len() - 1
                })
        })
        .collect();
    let mut names: Vec<&str> = targets.iter().map(|t| t.0).collect();
    names.sort_unstable();
    names.dedup();
    let queues = app.catalog.ensure_queues(&app.pool, &names).await?;
    let wanted: Vec<(Uuid, &str)> = targets.iter().map(|t| (queues[t.0], t.1)).collect();
    let partitions = app.catalog.ensure_partitions(&app.pool, &wanted).await?;
    let mut queue_names: HashMap<&str, Arc<str>> = HashMap::new();
    let resolved: Vec<(Arc<str>, Uuid, Uuid)> = targets
        .iter()
        .zip(&wanted)
        .map(|(&(queue, partition), &(queue_id, _))| {
            let name = queue_names.entry(queue).or_insert_with(|| Arc::from(queue));
            let partition_id = partitions[&(queue_id, partition.to_string())];
            (name.clone(), queue_id, partition_id)
        })
        .collect();
    let partition_names: Vec<Arc<str>> = targets.iter().map(|t| Arc::from(t.1)).collect();
    let mut out = Vec::with_capacity(items.len());
    for (item, slot) in items.into_iter().zip(slots) {
        let (queue, queue_id, partition_id) = &resolved[slot];
        out.push(NewMessage {
            queue: queue.clone(),
            queue_id: *queue_id,
            partition: partition_names[slot].clone(),
            partition_id: *partition_id,
            client_transaction_id: item.transaction_id.map(|t| t.0.into_owned()),
            message_id: Uuid::now_v7(),
            trace_id: item.trace_id.map(|t| t.0.into_owned()),
            payload: slice_of(body, item.payload.get()),
        });
    }
    Ok(out)
}

/// `text` as a slice of `body` when it lies inside it (no copy), else a copy of it.
fn slice_of(body: &Bytes, text: &str) -> Bytes {
    let range = body.as_ptr_range();
    let inside = range.start <= text.as_ptr() && text.as_bytes().as_ptr_range().end <= range.end;
    if inside {
        body.slice_ref(text.as_bytes())
    } else {
        Bytes::copy_from_slice(text.as_bytes())
    }
}

/// The partition an item names, or the default one.
fn partition_of<'i>(item: &'i PushItem<'_>) -> &'i str {
    item.partition.as_deref().unwrap_or(DEFAULT_PARTITION)
}

/// Stores messages through the push fuser. Messages whose partition vanished meanwhile (its
/// queue was deleted through any server) are resolved again — which creates the queue anew,
/// as a first push does — and stored in a second round; nothing is stored twice.
async fn store(
    app: &State,
    messages: Vec<NewMessage>,
) -> Result<(Arc<Vec<NewMessage>>, Vec<Stored>), Problem> {
    let messages = Arc::new(messages);
    let stored = submit(app, messages.clone()).await?;
    let gone: Vec<usize> = (0..stored.len())
        .filter(|&i| stored[i] == Stored::PartitionGone)
        .collect();
    if gone.is_empty() {
        return Ok((messages, stored));
    }
    let mut messages = Arc::try_unwrap(messages).unwrap_or_else(|m| (*m).clone());
    let mut stored = stored;
    for &i in &gone {
        app.catalog.forget_queue(&messages[i].queue);
    }
    let names: Vec<&str> = gone.iter().map(|&i| &*messages[i].queue).collect();
    let queues = app.catalog.ensure_queues(&app.pool, &names).await?;
    let wanted: Vec<(Uuid, &str)> = gone
        .iter()
        .map(|&i| (queues[&*messages[i].queue], &*messages[i].partition))
        .collect();
    let partitions = app.catalog.ensure_partitions(&app.pool, &wanted).await?;
    let retry: Vec<NewMessage> = gone
        .iter()
        .map(|&i| {
            let mut m = messages[i].clone();
            m.queue_id = queues[&*m.queue];
            m.partition_id = partitions[&(m.queue_id, m.partition.to_string())];
            m
        })
        .collect();
    let again = submit(app, Arc::new(retry.clone())).await?;
    for ((&i, m), s) in gone.iter().zip(retry).zip(again) {
        if s == Stored::PartitionGone {
            return Err(Problem::conflict(
                "queue_deleted",
                format!(
                    "queue `{}` is being deleted and recreated; retry the push",
                    m.queue
                ),
            ));
        }
        messages[i] = m;
        stored[i] = s;
    }
    Ok((Arc::new(messages), stored))
}

async fn submit(app: &State, messages: Arc<Vec<NewMessage>>) -> Result<Vec<Stored>, Problem> {
    let key = crate::push::shard_key(&messages);
    super::ask_keyed(&app.push, key, |reply| PushJob { messages, reply }).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_written_answer_is_what_serde_would_write() {
        let ids = [Uuid::now_v7(), Uuid::now_v7(), Uuid::new_v4()];
        let results = [
            PushResult {
                index: 0,
                transaction_id: TransactionId::Client("plain"),
                message_id: ids[0],
                partition_id: ids[1],
                status: "queued",
                queue_name: "orders",
                trace_id: None,
            },
            PushResult {
                index: 1,
                transaction_id: TransactionId::Client("quote \" backslash \\ tab \t é ✓ \u{1F600}"),
                message_id: ids[2],
                partition_id: ids[1],
                status: "duplicate",
                queue_name: "q.with-dash_1",
                trace_id: Some("trace \"x\" \u{7f} /"),
            },
            PushResult {
                index: 2,
                transaction_id: TransactionId::Own(ids[0]),
                message_id: ids[0],
                partition_id: ids[1],
                status: "queued",
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
