//! Traces: events consumers record on messages, read back by message, by name, and as the
//! list of names.
//!
//! Stored in `comb.traces`, kept by the day (`maintenance::days`): rows are only inserted and
//! whole days are dropped once past retention, so neither a held snapshot nor months of
//! traffic make them grow beyond their days. A trace with several names is a row per name.

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_postgres::Row;
use utoipa::ToSchema;
use uuid::Uuid;

use super::wire::{iso, iso_opt};
use super::{MAX_LIMIT, Page, Refusal};
use crate::backend::Backend;
use crate::code::Code;
use crate::queue::GroupName;

/// Most names one trace carries.
pub const MAX_NAMES: usize = 16;

/// Most bytes of a trace's `data` as JSON text.
pub const MAX_DATA_BYTES: usize = 64 * 1024;

/// One event recorded on a message.
#[derive(Debug, Clone)]
pub struct NewTrace {
    pub partition_id: Uuid,
    pub transaction_id: String,
    pub consumer_group: GroupName<'static>,
    pub event_type: String,
    pub data: Value,
    pub names: Vec<String>,
}

/// `POST /api/v1/traces`: records the event; the message must exist.
pub async fn record(pool: &Pool, trace: &NewTrace) -> Result<TraceRecorded, Refusal> {
    let client = pool.get().await?;
    let (p, t) = (trace.partition_id, trace.transaction_id.as_str());
    let known = crate::messages::listing::message_exists(&**client, p, t).await?
        || crate::dead_letter::exists_for(&**client, p, t).await?;
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
    Ok(TraceRecorded { success: true, id })
}

/// What `POST /api/v1/traces` recorded.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct TraceRecorded {
    pub success: bool,
    /// The event's id.
    pub id: Uuid,
}

/// An event recorded on a message.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Trace {
    pub id: Uuid,
    pub partition_id: Uuid,
    pub transaction_id: String,
    pub consumer_group: String,
    pub event_type: String,
    /// The event's data as recorded.
    pub data: Value,
    pub trace_names: Vec<String>,
    #[serde(serialize_with = "iso")]
    pub created_at: DateTime<Utc>,
}

impl Trace {
    fn from_row(r: &Row) -> Trace {
        Trace {
            id: r.get("id"),
            partition_id: r.get("partition_id"),
            transaction_id: r.get("transaction_id"),
            consumer_group: r.get("consumer_group"),
            event_type: r.get("event_type"),
            data: r.get("data"),
            trace_names: r.get("names"),
            created_at: r.get("created_at"),
        }
    }
}

/// `GET /api/v1/traces/{partitionId}/{transactionId}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct MessageTraces {
    pub traces: Vec<Trace>,
}

/// An event with one name, with where its message is.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct NamedTrace {
    #[serde(flatten)]
    pub trace: Trace,
    /// Null once the queue is gone.
    pub queue: Option<String>,
    pub partition: Option<String>,
}

/// `GET /api/v1/traces/by-name/{traceName}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct NamedTraces {
    pub traces: Vec<NamedTrace>,
    pub limit: i64,
    pub offset: i64,
}

/// A trace name in use, with its newest event's time.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TraceName {
    pub name: String,
    #[serde(serialize_with = "iso_opt")]
    pub last_seen: Option<DateTime<Utc>>,
}

/// `GET /api/v1/traces/names`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct TraceNames {
    pub names: Vec<TraceName>,
    pub limit: i64,
    pub offset: i64,
}

/// `GET /api/v1/traces/{partitionId}/{transactionId}`: the message's events, oldest first.
pub async fn of_message(
    pool: &Pool,
    partition: Uuid,
    transaction: &str,
) -> Result<MessageTraces, Refusal> {
    let client = pool.get().await?;
    let sql = format!(
        "SELECT id, partition_id, transaction_id, consumer_group, event_type, data, created_at,
                coalesce(array_agg(name ORDER BY name) FILTER (WHERE name IS NOT NULL), '{{}}')
                    AS names
         FROM comb.traces
         WHERE partition_id = $1 AND transaction_id = $2
         GROUP BY id, partition_id, transaction_id, consumer_group, event_type, data, created_at
         ORDER BY created_at, id LIMIT {MAX_LIMIT}"
    );
    Ok(MessageTraces {
        traces: client
            .query(&sql, &[&partition, &transaction])
            .await?
            .iter()
            .map(Trace::from_row)
            .collect(),
    })
}

/// `GET /api/v1/traces/by-name/{name}`: a page of the events with this name, newest first,
/// each with its queue's and partition's names (from the catalog).
pub async fn by_name(pool: &Pool, name: &str, page: Page) -> Result<NamedTraces, Refusal> {
    let client = pool.get().await?;
    let rows = client
        .query(
            "SELECT x.*, ARRAY[x.name] AS names FROM comb.traces x
             WHERE x.name = $1 ORDER BY x.created_at DESC, x.id LIMIT $2 OFFSET $3",
            &[&name, &page.limit, &page.offset],
        )
        .await?;
    let ids: Vec<Uuid> = rows.iter().map(|r| r.get("partition_id")).collect();
    let places = crate::catalog::listing::partition_names(&**client, &ids).await?;
    Ok(NamedTraces {
        traces: rows
            .iter()
            .map(|r| {
                let trace = Trace::from_row(r);
                let place = places.get(&trace.partition_id);
                NamedTrace {
                    queue: place.map(|(q, _)| q.clone()),
                    partition: place.map(|(_, p)| p.clone()),
                    trace,
                }
            })
            .collect(),
        limit: page.limit,
        offset: page.offset,
    })
}

/// `GET /api/v1/traces/names`: the names in use, each once (a walk of the name index, one
/// descent per name, not a read of every trace), with the newest event's time.
pub async fn names(pool: &Pool, backend: Backend, page: Page) -> Result<TraceNames, Refusal> {
    let client = pool.get().await?;
    let sql = "
        WITH RECURSIVE walk(name, n) AS (
            (SELECT name, 1 FROM comb.traces WHERE name IS NOT NULL ORDER BY name LIMIT 1)
            UNION ALL
            SELECT (SELECT t.name FROM comb.traces t WHERE t.name > w.name ORDER BY t.name LIMIT 1),
                   w.n + 1
            FROM walk w WHERE w.name IS NOT NULL AND w.n < $1::bigint + $2::bigint
        )
        SELECT n.name,
               (SELECT max(t.created_at) FROM comb.traces t WHERE t.name = n.name) AS last_seen
        FROM (SELECT name FROM walk WHERE name IS NOT NULL ORDER BY name LIMIT $1 OFFSET $2) n
        ORDER BY n.name";
    // Citus plans a recursive walk only over one shard: on the cluster each worker groups
    // its shards' names (an index scan of `traces_name` per shard) and the coordinator merges
    // the pages; the cost grows with the traces kept, not with the page.
    let sql = if !backend.joins_across_partitions() {
        "SELECT t.name, max(t.created_at) AS last_seen FROM comb.traces t
         WHERE t.name IS NOT NULL
         GROUP BY t.name ORDER BY t.name LIMIT $1 OFFSET $2"
    } else {
        sql
    };
    Ok(TraceNames {
        names: client
            .query(sql, &[&page.limit, &page.offset])
            .await?
            .iter()
            .map(|r| TraceName {
                name: r.get("name"),
                last_seen: r.get("last_seen"),
            })
            .collect(),
        limit: page.limit,
        offset: page.offset,
    })
}
