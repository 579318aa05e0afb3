//! The SQL of streams: queries, the lock of a (partition, query) pair, state versions, the
//! administration listing.

use chrono::{DateTime, SecondsFormat, Utc};
use deadpool_postgres::GenericClient;
use serde_json::{Value, json};
use uuid::Uuid;

use std::sync::Arc;

use deadpool_postgres::Pool;

use super::{CycleJob, Outcome, Registration, run_cycle};
use crate::backend::{Backend, Forms};
use crate::db::DbError;
use crate::fusion::{Fuser, Runner};
use crate::metrics::Stage;

/// Most cycles fused into one transaction.
const MAX_FUSED_CYCLES: usize = 64;

/// Starts the cycle worker: one, so fused batches of cycles never wait on each other's locks,
/// and each batch is one transaction (each cycle under its own savepoint) with one commit.
pub(super) fn start(pool: Pool, backend: Backend, stage: Arc<Stage>) -> Fuser<CycleJob> {
    let run: Runner<CycleJob> = Arc::new(move |jobs| {
        let pool = pool.clone();
        Box::pin(async move { run_batch(&pool, backend, jobs).await })
    });
    Fuser::start(1, MAX_FUSED_CYCLES, |_| 1, run, stage)
}

/// Commits a batch of cycles, in a stable order (partition, query) so that the locks of two
/// batches are taken alike. If the batch fails as a whole (a deadlock with other traffic, a
/// lost connection), each cycle is tried again alone, so that one cycle's trouble is its own.
async fn run_batch(pool: &Pool, backend: Backend, mut jobs: Vec<CycleJob>) {
    jobs.sort_by_key(|j| (j.cycle.partition_id, j.cycle.query_id));
    let outcomes = match commit(pool, backend, &jobs).await {
        Err(_) if jobs.len() > 1 => {
            for job in jobs {
                let result = commit(pool, backend, std::slice::from_ref(&job)).await;
                reply(job, result.map(|mut o| o.pop().expect("one outcome")));
            }
            return;
        }
        other => other,
    };
    match outcomes {
        Ok(outcomes) => {
            for (job, o) in jobs.into_iter().zip(outcomes) {
                reply(job, Ok(o));
            }
        }
        Err(e) => {
            let e = Arc::new(e);
            for job in jobs {
                let _ = job.reply.send(Err(e.clone()));
            }
        }
    }
}

fn reply(job: CycleJob, result: Result<Outcome, DbError>) {
    let _ = job.reply.send(result.map_err(Arc::new));
}

/// One transaction for `jobs`, each cycle under a savepoint: a refused cycle is rolled back
/// to its savepoint and the others go on.
async fn commit(pool: &Pool, backend: Backend, jobs: &[CycleJob]) -> Result<Vec<Outcome>, DbError> {
    let mut client = pool.get().await?;
    let mut tx = client.transaction().await?;
    let touched: Vec<Uuid> = jobs
        .iter()
        .flat_map(|j| {
            std::iter::once(j.cycle.partition_id)
                .chain(j.cycle.messages.iter().map(|m| m.partition_id))
        })
        .collect();
    crate::catalog::enlist_workers(&tx, backend, &touched).await?;
    let mut outcomes = Vec::with_capacity(jobs.len());
    for job in jobs {
        let savepoint = tx.transaction().await?;
        let result = run_cycle(&savepoint, backend, &job.cycle).await?;
        if result.is_ok() {
            savepoint.commit().await?;
        } else {
            savepoint.rollback().await?;
        }
        outcomes.push(Outcome {
            group: job.cycle.group.clone(),
            result,
        });
    }
    tx.commit().await?;
    Ok(outcomes)
}

/// The newest registration of a name, under a transaction-scoped lock of the name, so that
/// two registrations of one name never both insert.
const LOCK_NAME_SQL: &str = "
SELECT pg_advisory_xact_lock(hashtextextended('comb.stream_queries:' || $1, 0))";

const CURRENT_SQL: &str = "
SELECT id, source_queue, config_hash FROM comb.stream_queries
WHERE name = $1 ORDER BY registered_at DESC LIMIT 1";

const INSERT_QUERY_SQL: &str = "
INSERT INTO comb.stream_queries (id, name, source_queue, sink_queue, config_hash)
VALUES ($1, $2, $3, $4, $5)";

/// A query as a cycle needs it: whether it is the newest registration of its name and
/// whether `partition` belongs to its source queue.
const QUERY_READS_SQL: &str = concat!(
    "
SELECT q.name, q.source_queue,
       q.id = (SELECT n.id FROM comb.stream_queries n WHERE n.name = q.name
               ORDER BY n.registered_at DESC LIMIT 1) AS current,
       ",
    crate::catalog::partition_in_queue!("$2", "q.source_queue"),
    " AS reads
FROM comb.stream_queries q WHERE q.id = $1"
);

const ENSURE_PAIR_SQL: &str = "
INSERT INTO comb.stream_partitions (partition_id, query_id) VALUES ($1, $2)
ON CONFLICT DO NOTHING";

const LOCK_PAIR_SQL: &str = "
SELECT 1 FROM comb.stream_partitions WHERE partition_id = $1 AND query_id = $2
FOR NO KEY UPDATE";

/// The newest version of a pair: its number and size (one descent of the index, newest
/// generation first: ordered by (gen, ver) as the index is).
const PAIR_SQL: &str = "
SELECT ver, keys, bytes FROM comb.stream_states
WHERE partition_id = $1 AND query_id = $2
ORDER BY gen DESC, ver DESC LIMIT 1";

/// The newest version of each named key (deleted ones too, with a NULL value): one descent
/// of the index per key, however many keys the pair holds.
const KEYS_NOW_SQL: &str = "
SELECT k.key, v.value, v.bytes, v.written_at
FROM unnest($3::text[]) AS k(key)
CROSS JOIN LATERAL (
    SELECT s.value, s.bytes, s.written_at FROM comb.stream_state_keys s
    WHERE s.partition_id = $1 AND s.query_id = $2 AND s.key = k.key
    ORDER BY s.gen DESC, s.ver DESC LIMIT 1
) v";

/// Every key of a pair there is now, with its value and when it was written.
const ALL_KEYS_SQL: &str = "
SELECT key, value, bytes, written_at FROM (
    SELECT DISTINCT ON (s.key) s.key, s.value, s.bytes, s.written_at
    FROM comb.stream_state_keys s
    WHERE s.partition_id = $1 AND s.query_id = $2
    ORDER BY s.key, s.gen DESC, s.ver DESC
) k WHERE value IS NOT NULL";

/// A new version of a pair: its number and size, into the newest generation (read inside
/// the statement, as cursor state writers do).
const INSERT_PAIR_SQL: &str = concat!(
    "
INSERT INTO comb.stream_states (partition_id, query_id, gen, ver, keys, bytes)
SELECT $1::uuid, $2::uuid, ",
    crate::cursor::newest_gen!(),
    ", $3::bigint, $4::integer, $5::integer"
);

/// The keys a version changed, each a row of its own (a NULL value: deleted).
const INSERT_KEYS_SQL: &str = concat!(
    "
INSERT INTO comb.stream_state_keys (partition_id, query_id, gen, key, ver, value, bytes)
SELECT $1::uuid, $2::uuid, ",
    crate::cursor::newest_gen!(),
    ", k, $3::bigint, v, b
FROM unnest($4::text[], $5::jsonb[], $6::integer[]) AS u(k, v, b)"
);

/// Every current query (the newest registration of each name) with its partitions, the size
/// of each one's newest state version, and the lag (messages not yet settled) of the SDK's
/// consumer group on it (`streams.<name>`, the group Queen's SDKs read with unless told
/// otherwise): a row per (query, partition), a query without partitions once with NULLs,
/// ordered by query name and partition name.
const LIST_SQL: &str = concat!(
    "
SELECT q.id, q.name, q.source_queue, q.sink_queue, q.config_hash, q.registered_at,
       sp.partition_id, ",
    crate::catalog::partition_name!("sp.partition_id"),
    " AS partition_name,
       s.ver, s.keys, s.bytes, s.written_at,
       (SELECT l.lag FROM ",
    crate::cursor::lag_of!("sp.partition_id", "'streams.' || q.name"),
    " l) AS lag
FROM (SELECT DISTINCT ON (name) * FROM comb.stream_queries ORDER BY name, registered_at DESC) q
LEFT JOIN comb.stream_partitions sp ON sp.query_id = q.id
LEFT JOIN LATERAL (
    SELECT v.ver, v.keys, v.bytes, v.written_at FROM comb.stream_states v
    WHERE v.partition_id = sp.partition_id AND v.query_id = sp.query_id
    ORDER BY v.gen DESC, v.ver DESC LIMIT 1
) s ON true
ORDER BY q.name, partition_name"
);

/// [`LIST_SQL`] on Citus, which plans no join of a reference table's subquery to the
/// distributed pairs with per-row subqueries of other shards ("complex joins are only
/// supported when all distributed tables are co-located and joined on their distribution
/// columns"). The queries and the pairs (each with its partition's name and newest state
/// version, read beside it on its worker: everything joined by partition) are read first,
/// as results kept on the coordinator; the groups' lag is then read by a function call per
/// pair there, a router statement on the pair's worker. Same rows as [`LIST_SQL`].
const LIST_CITUS_SQL: &str = concat!(
    "
WITH q AS MATERIALIZED (
    SELECT DISTINCT ON (name) id, name, source_queue, sink_queue, config_hash, registered_at
    FROM comb.stream_queries ORDER BY name, registered_at DESC
),
pairs AS MATERIALIZED (
    SELECT DISTINCT ON (sp.partition_id, sp.query_id)
           sp.partition_id, sp.query_id, ",
    crate::catalog::partition_name!("sp.partition_id"),
    " AS partition_name,
           v.ver, v.keys, v.bytes, v.written_at
    FROM comb.stream_partitions sp
    LEFT JOIN comb.stream_states v
           ON v.partition_id = sp.partition_id AND v.query_id = sp.query_id
    ORDER BY sp.partition_id, sp.query_id, v.gen DESC, v.ver DESC
)
SELECT q.id, q.name, q.source_queue, q.sink_queue, q.config_hash, q.registered_at,
       sp.partition_id, sp.partition_name, sp.ver, sp.keys, sp.bytes, sp.written_at,
       (SELECT l.lag FROM ",
    crate::cursor::lag_of!("sp.partition_id", "'streams.' || q.name"),
    " l) AS lag
FROM q LEFT JOIN pairs sp ON sp.query_id = q.id
ORDER BY q.name, sp.partition_name"
);

/// The listing in the form each storage runs.
const LIST: Forms = Forms {
    postgres: LIST_SQL,
    citus: LIST_CITUS_SQL,
};

/// A registered query as its name's newest row has it.
pub(super) struct Current {
    pub(super) id: Uuid,
    pub(super) source_queue: String,
    pub(super) config_hash: String,
}

/// Locks `name` for this transaction and reads its newest registration.
pub(super) async fn lock_query_name<C: GenericClient>(
    tx: &C,
    name: &str,
) -> Result<Option<Current>, DbError> {
    tx.execute(LOCK_NAME_SQL, &[&name]).await?;
    Ok(tx.query_opt(CURRENT_SQL, &[&name]).await?.map(|r| Current {
        id: r.get("id"),
        source_queue: r.get("source_queue"),
        config_hash: r.get("config_hash"),
    }))
}

/// Registers `r` under `id`.
pub(super) async fn insert_query<C: GenericClient>(
    tx: &C,
    id: Uuid,
    r: &Registration,
) -> Result<(), DbError> {
    tx.execute(
        INSERT_QUERY_SQL,
        &[&id, &r.name, &r.source_queue, &r.sink_queue, &r.config_hash],
    )
    .await?;
    Ok(())
}

/// What a cycle checks of its query.
pub(super) struct QueryReads {
    pub(super) name: String,
    pub(super) source_queue: String,
    pub(super) current: bool,
    pub(super) reads: bool,
}

/// The query `query` and whether it reads `partition` (`None`: no such query).
pub(super) async fn query_reads<C: GenericClient>(
    client: &C,
    query: Uuid,
    partition: Uuid,
) -> Result<Option<QueryReads>, DbError> {
    let statement = client.prepare_cached(QUERY_READS_SQL).await?;
    Ok(client
        .query_opt(&statement, &[&query, &partition])
        .await?
        .map(|r| QueryReads {
            name: r.get("name"),
            source_queue: r.get("source_queue"),
            current: r.get("current"),
            reads: r.get("reads"),
        }))
}

/// Locks the (partition, query) pair for this transaction, making its row on first use.
pub(super) async fn lock_pair<C: GenericClient>(
    tx: &C,
    partition: Uuid,
    query: Uuid,
) -> Result<(), DbError> {
    let ensure = tx.prepare_cached(ENSURE_PAIR_SQL).await?;
    let lock = tx.prepare_cached(LOCK_PAIR_SQL).await?;
    tx.execute(&ensure, &[&partition, &query]).await?;
    tx.execute(&lock, &[&partition, &query]).await?;
    Ok(())
}

/// The newest version of a pair: its number, keys and bytes (`None`: no state yet).
pub(super) async fn pair<C: GenericClient>(
    client: &C,
    partition: Uuid,
    query: Uuid,
) -> Result<Option<(i64, i64, i64)>, DbError> {
    let statement = client.prepare_cached(PAIR_SQL).await?;
    Ok(client
        .query_opt(&statement, &[&partition, &query])
        .await?
        .map(|r| {
            (
                r.get("ver"),
                i64::from(r.get::<_, i32>("keys")),
                i64::from(r.get::<_, i32>("bytes")),
            )
        }))
}

/// The keys of a pair there are now: all of them, or those of `only`.
pub(super) async fn keys_now<C: GenericClient>(
    client: &C,
    partition: Uuid,
    query: Uuid,
    only: Option<&[String]>,
) -> Result<Vec<KeyNow>, DbError> {
    let rows = match only {
        Some(keys) => {
            let statement = client.prepare_cached(KEYS_NOW_SQL).await?;
            client
                .query(&statement, &[&partition, &query, &keys])
                .await?
        }
        None => {
            let statement = client.prepare_cached(ALL_KEYS_SQL).await?;
            client.query(&statement, &[&partition, &query]).await?
        }
    };
    Ok(rows
        .iter()
        .filter_map(|r| {
            let value: Option<Value> = r.get("value");
            Some(KeyNow {
                key: r.get("key"),
                value: value?,
                bytes: i64::from(r.get::<_, i32>("bytes")),
                written_at: r.get("written_at"),
            })
        })
        .collect())
}

/// One key of a pair as it is now.
pub(super) struct KeyNow {
    pub(super) key: String,
    pub(super) value: Value,
    pub(super) bytes: i64,
    pub(super) written_at: DateTime<Utc>,
}

/// Inserts version `ver` of a pair: its size, and the keys it changed.
pub(super) async fn insert_version<C: GenericClient>(
    tx: &C,
    partition: Uuid,
    query: Uuid,
    merged: &super::Merged<'_>,
) -> Result<(), DbError> {
    let pair = tx.prepare_cached(INSERT_PAIR_SQL).await?;
    let keys = tx.prepare_cached(INSERT_KEYS_SQL).await?;
    let names: Vec<&str> = merged.changes.iter().map(|c| c.key.as_str()).collect();
    let values: Vec<Option<&Value>> = merged.changes.iter().map(|c| c.value).collect();
    let bytes: Vec<i32> = merged.changes.iter().map(|c| c.bytes as i32).collect();
    tx.execute(
        &pair,
        &[
            &partition,
            &query,
            &merged.ver,
            &(merged.keys as i32),
            &(merged.bytes as i32),
        ],
    )
    .await?;
    tx.execute(
        &keys,
        &[&partition, &query, &merged.ver, &names, &values, &bytes],
    )
    .await?;
    Ok(())
}

/// The administration listing of queries, in Queen's shape: an array of queries, each with
/// its partitions (times in UTC to the millisecond, as every answer gives them).
pub(super) async fn list<C: GenericClient>(client: &C, backend: Backend) -> Result<Value, DbError> {
    let time = |t: Option<DateTime<Utc>>| {
        t.map_or(Value::Null, |t| {
            Value::from(t.to_rfc3339_opts(SecondsFormat::Millis, true))
        })
    };
    let mut queries: Vec<Value> = Vec::new();
    let mut last: Option<Uuid> = None;
    for r in client.query(backend.sql(&LIST), &[]).await? {
        let id: Uuid = r.get("id");
        if last != Some(id) {
            last = Some(id);
            queries.push(json!({
                "queryId": id,
                "name": r.get::<_, String>("name"),
                "sourceQueue": r.get::<_, String>("source_queue"),
                "sinkQueue": r.get::<_, Option<String>>("sink_queue"),
                "configHash": r.get::<_, String>("config_hash"),
                "registeredAt": time(Some(r.get("registered_at"))),
                "partitions": [],
            }));
        }
        let Some(partition) = r.get::<_, Option<Uuid>>("partition_id") else {
            continue;
        };
        let query = queries.last_mut().expect("a query row came first");
        query["partitions"]
            .as_array_mut()
            .expect("an array")
            .push(json!({
                "partitionId": partition,
                "partition": r.get::<_, Option<String>>("partition_name"),
                "stateKeys": r.get::<_, Option<i32>>("keys").unwrap_or(0),
                "stateBytes": r.get::<_, Option<i32>>("bytes").unwrap_or(0),
                "stateVersion": r.get::<_, Option<i64>>("ver").unwrap_or(0),
                "updatedAt": time(r.get("written_at")),
                "lag": r.get::<_, Option<i64>>("lag"),
            }));
    }
    Ok(Value::Array(queries))
}
