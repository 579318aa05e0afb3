//! Traces: events consumers record on messages, read back by message, by name, and as the
//! list of names.
//!
//! Stored in `comb.traces`, kept by the day (`maintenance::days`): rows are only inserted and
//! whole days are dropped once past retention, so neither a held snapshot nor months of
//! traffic make them grow beyond their days. A trace with several names is a row per name.

use crate::code::Code;
use deadpool_postgres::Pool;
use serde_json::{Value, json};
use uuid::Uuid;

use super::{MAX_LIMIT, Page, Refusal};

/// Most names one trace carries.
pub const MAX_NAMES: usize = 16;

/// Most bytes of a trace's `data` as JSON text.
pub const MAX_DATA_BYTES: usize = 64 * 1024;

/// One event recorded on a message.
#[derive(Debug, Clone)]
pub struct NewTrace {
    pub partition_id: Uuid,
    pub transaction_id: String,
    pub consumer_group: String,
    pub event_type: String,
    pub data: Value,
    pub names: Vec<String>,
}

/// `POST /api/v1/traces`: records the event; the message must exist.
pub async fn record(pool: &Pool, trace: &NewTrace) -> Result<Value, Refusal> {
    let client = pool.get().await?;
    let known: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM comb.messages m
                            WHERE m.transaction_id = $2 AND m.partition_id = $1)
                 OR EXISTS (SELECT 1 FROM comb.dead_letters d
                            WHERE d.partition_id = $1 AND d.transaction_id = $2)",
            &[&trace.partition_id, &trace.transaction_id],
        )
        .await?
        .get(0);
    if !known {
        return Err(Refusal::not_found(
            Code::MessageNotFound,
            format!(
                "partition {} holds no message with transaction id `{}`",
                trace.partition_id, trace.transaction_id
            ),
        ));
    }
    let id = Uuid::now_v7();
    let names: Vec<Option<&str>> = if trace.names.is_empty() {
        vec![None]
    } else {
        trace.names.iter().map(|n| Some(n.as_str())).collect()
    };
    client
        .execute(
            "INSERT INTO comb.traces (day, id, name, partition_id, transaction_id, consumer_group,
                                      event_type, data)
             SELECT (now() AT TIME ZONE 'UTC')::date, $1, n, $3, $4, $5, $6, $7
             FROM unnest($2::text[]) AS n",
            &[
                &id,
                &names,
                &trace.partition_id,
                &trace.transaction_id,
                &trace.consumer_group,
                &trace.event_type,
                &trace.data,
            ],
        )
        .await?;
    Ok(json!({"success": true, "id": id}))
}

/// A trace as JSON over rows `t` grouped by id, with `names` aggregated.
const TRACE_JSON: &str = "jsonb_build_object(
    'id', t.id, 'partitionId', t.partition_id, 'transactionId', t.transaction_id,
    'consumerGroup', t.consumer_group, 'eventType', t.event_type, 'data', t.data,
    'traceNames', t.names, 'createdAt', comb.iso(t.created_at))";

/// `GET /api/v1/traces/{partitionId}/{transactionId}`: the message's events, oldest first.
pub async fn of_message(pool: &Pool, partition: Uuid, transaction: &str) -> Result<Value, Refusal> {
    let client = pool.get().await?;
    let sql = format!(
        "SELECT coalesce(jsonb_agg({TRACE_JSON} ORDER BY t.created_at, t.id), '[]')
         FROM (SELECT id, partition_id, transaction_id, consumer_group, event_type, data,
                      created_at, coalesce(array_agg(name ORDER BY name) FILTER (WHERE name IS NOT NULL), '{{}}') AS names
               FROM comb.traces
               WHERE partition_id = $1 AND transaction_id = $2
               GROUP BY id, partition_id, transaction_id, consumer_group, event_type, data, created_at
               ORDER BY created_at LIMIT {MAX_LIMIT}) t"
    );
    let traces: Value = client
        .query_one(&sql, &[&partition, &transaction])
        .await?
        .get(0);
    Ok(json!({ "traces": traces }))
}

/// `GET /api/v1/traces/by-name/{name}`: a page of the events with this name, newest first.
pub async fn by_name(pool: &Pool, name: &str, page: Page) -> Result<Value, Refusal> {
    let client = pool.get().await?;
    let sql = format!(
        "SELECT coalesce(jsonb_agg({TRACE_JSON} || jsonb_build_object('queue', q.name, 'partition', p.name)
                                   ORDER BY t.created_at DESC, t.id), '[]')
         FROM (SELECT x.*, ARRAY[x.name] AS names FROM comb.traces x
               WHERE x.name = $1 ORDER BY x.created_at DESC LIMIT $2 OFFSET $3) t
         LEFT JOIN comb.partitions p ON p.id = t.partition_id
         LEFT JOIN comb.queues q ON q.id = p.queue_id"
    );
    let traces: Value = client
        .query_one(&sql, &[&name, &page.limit, &page.offset])
        .await?
        .get(0);
    Ok(json!({"traces": traces, "limit": page.limit, "offset": page.offset}))
}

/// `GET /api/v1/traces/names`: the names in use, each once (a walk of the name index, one
/// descent per name, not a read of every trace), with the newest event's time.
pub async fn names(pool: &Pool, page: Page) -> Result<Value, Refusal> {
    let client = pool.get().await?;
    let sql = "
        WITH RECURSIVE walk(name, n) AS (
            (SELECT name, 1 FROM comb.traces WHERE name IS NOT NULL ORDER BY name LIMIT 1)
            UNION ALL
            SELECT (SELECT t.name FROM comb.traces t WHERE t.name > w.name ORDER BY t.name LIMIT 1),
                   w.n + 1
            FROM walk w WHERE w.name IS NOT NULL AND w.n < $1::bigint + $2::bigint
        )
        SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'name', n.name,
                   'lastSeen', comb.iso((SELECT max(t.created_at) FROM comb.traces t WHERE t.name = n.name)))
               ORDER BY n.name), '[]')
        FROM (SELECT name FROM walk WHERE name IS NOT NULL ORDER BY name LIMIT $1 OFFSET $2) n";
    let names: Value = client
        .query_one(sql, &[&page.limit, &page.offset])
        .await?
        .get(0);
    Ok(json!({"names": names, "limit": page.limit, "offset": page.offset}))
}
