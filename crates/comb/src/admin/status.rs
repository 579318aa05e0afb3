//! Status and analytics: the dashboard's overview, queue statistics, per-minute throughput,
//! depth, lag and errors over a time range, PostgreSQL's own statistics, and this server's.
//!
//! Per-minute figures come from two tables kept by the day (`maintenance::days`): every
//! server adds what its counters did to `comb.server_minutes` each `COMB_STATS_INTERVAL_MS`
//! (rows are summed per minute when read), and one server per minute writes each queue's
//! figures to `comb.queue_minutes` and each group's lag per queue to `comb.group_minutes`
//! (the snapshot listings serve large queues' totals from). All only ever receive inserts.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use std::collections::HashMap;

use uuid::Uuid;

use super::resources::{Overview, QueueDetail, QueueList};
use super::wire::{iso, iso_opt};
use super::{Page, Refusal};
use crate::catalog::listing;
use crate::code::Code;
use crate::metrics::{Metrics, QueueCounts};

/// Most buckets one analytics answer holds; longer ranges get wider buckets.
pub const MAX_BUCKETS: i64 = 1440;

/// Longest range analytics answers: the daily tables' retention.
pub const MAX_RANGE: chrono::TimeDelta = chrono::TimeDelta::days(7);

/// Advisory lock key of the minute's queue snapshot, so one server writes it.
const SNAPSHOT_LOCK: i64 = 0x636f_6d62_0003;

/// A time range, defaulting to the last hour.
#[derive(Debug, Clone, Copy)]
pub struct Range {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
}

impl Range {
    /// The range asked for; refuses an empty or reversed one, or one over [`MAX_RANGE`].
    pub fn new(from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> Result<Range, Refusal> {
        let to = to.unwrap_or_else(Utc::now);
        let from = from.unwrap_or(to - chrono::TimeDelta::hours(1));
        if from >= to {
            return Err(Refusal::invalid(
                Code::RangeInvalid,
                "`from` must be before `to`",
            ));
        }
        if to - from > MAX_RANGE {
            return Err(Refusal::invalid(
                Code::RangeInvalid,
                "the range may span at most 7 days",
            ));
        }
        Ok(Range { from, to })
    }

    /// Minutes per bucket, so that the range holds at most [`MAX_BUCKETS`].
    fn bucket_minutes(&self) -> i64 {
        let minutes = (self.to - self.from).num_minutes().max(1);
        (minutes + MAX_BUCKETS - 1) / MAX_BUCKETS
    }
}

/// Per-bucket throughput, errors, depth and lag over the range (of one queue's depth and
/// lag when `queue_id` is given; throughput is counted per server, for all queues).
const SERIES_SQL: &str = "
WITH counts AS (
    -- Every queue: the servers' totals. One queue ($4): its own counts.
    SELECT minute, pushed, popped, acked, failed, dead_lettered FROM comb.server_minutes
    WHERE $4::uuid IS NULL
      AND day >= ($1 AT TIME ZONE 'UTC')::date AND day <= ($2 AT TIME ZONE 'UTC')::date
      AND minute >= date_trunc('minute', $1) AND minute < $2
    UNION ALL
    SELECT minute, pushed, popped, acked, failed, dead_lettered FROM comb.queue_counts
    WHERE queue_id = $4
      AND day >= ($1 AT TIME ZONE 'UTC')::date AND day <= ($2 AT TIME ZONE 'UTC')::date
      AND minute >= date_trunc('minute', $1) AND minute < $2
), s AS (
    SELECT date_bin(make_interval(mins => $3), minute, $1) AS b,
           sum(pushed)::bigint AS pushed, sum(popped)::bigint AS popped,
           sum(acked)::bigint AS acked, sum(failed)::bigint AS failed,
           sum(dead_lettered)::bigint AS dead_lettered
    FROM counts
    GROUP BY 1
), per_minute AS (
    SELECT minute, sum(total) AS total, sum(pending) AS pending,
           sum(processing) AS processing, sum(dead_letters) AS dead_letters,
           max(lag_seconds) AS lag_seconds
    FROM comb.queue_minutes
    WHERE day >= ($1 AT TIME ZONE 'UTC')::date AND day <= ($2 AT TIME ZONE 'UTC')::date
      AND minute >= date_trunc('minute', $1) AND minute < $2
      AND ($4::uuid IS NULL OR queue_id = $4)
    GROUP BY minute
), q AS (
    SELECT date_bin(make_interval(mins => $3), minute, $1) AS b,
           max(total)::bigint AS total, max(pending)::bigint AS pending,
           max(processing)::bigint AS processing, max(dead_letters)::bigint AS dead_letters,
           max(lag_seconds) AS lag_seconds
    FROM per_minute GROUP BY 1
)
SELECT coalesce(s.b, q.b) AS at,
       coalesce(s.pushed, 0) AS pushed, coalesce(s.popped, 0) AS popped,
       coalesce(s.acked, 0) AS acked, coalesce(s.failed, 0) AS failed,
       coalesce(s.dead_lettered, 0) AS dead_lettered,
       (coalesce(s.pushed, 0) / ($3 * 60.0))::float8 AS pushed_per_second,
       (coalesce(s.acked, 0) / ($3 * 60.0))::float8 AS acked_per_second,
       q.total, q.pending, q.processing, q.dead_letters, q.lag_seconds
FROM s FULL JOIN q ON q.b = s.b
ORDER BY 1";

/// One bucket of a time series: what the servers (or one queue) did in it, and the depth and
/// lag the per-minute snapshots saw.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Bucket {
    #[serde(serialize_with = "iso")]
    pub timestamp: DateTime<Utc>,
    pub pushed: i64,
    pub popped: i64,
    pub acked: i64,
    pub failed: i64,
    pub dead_lettered: i64,
    #[serde(serialize_with = "super::wire::num")]
    pub pushed_per_second: f64,
    #[serde(serialize_with = "super::wire::num")]
    pub acked_per_second: f64,
    pub messages: Option<i64>,
    pub pending: Option<i64>,
    pub processing: Option<i64>,
    pub dead_letters: Option<i64>,
    #[serde(serialize_with = "super::wire::num_opt")]
    pub lag_seconds: Option<f64>,
}

async fn series(
    client: &deadpool_postgres::Client,
    range: Range,
    queue_id: Option<uuid::Uuid>,
) -> Result<(Vec<Bucket>, i64), Refusal> {
    let minutes = range.bucket_minutes();
    let m = minutes as i32;
    let buckets = client
        .query(SERIES_SQL, &[&range.from, &range.to, &m, &queue_id])
        .await?
        .iter()
        .map(|r| Bucket {
            timestamp: r.get("at"),
            pushed: r.get("pushed"),
            popped: r.get("popped"),
            acked: r.get("acked"),
            failed: r.get("failed"),
            dead_lettered: r.get("dead_lettered"),
            pushed_per_second: r.get("pushed_per_second"),
            acked_per_second: r.get("acked_per_second"),
            messages: r.get("total"),
            pending: r.get("pending"),
            processing: r.get("processing"),
            dead_letters: r.get("dead_letters"),
            lag_seconds: r.get("lag_seconds"),
        })
        .collect();
    Ok((buckets, minutes))
}

/// `GET /api/v1/status/analytics`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Analytics {
    #[serde(serialize_with = "iso")]
    pub from: DateTime<Utc>,
    #[serde(serialize_with = "iso")]
    pub to: DateTime<Utc>,
    pub queue: Option<String>,
    pub bucket_minutes: i64,
    pub time_series: Vec<Bucket>,
    pub totals: Totals,
}

/// `GET /api/v1/status/analytics`: throughput, errors, depth and lag per bucket.
pub async fn analytics(
    pool: &Pool,
    range: Range,
    queue: Option<&str>,
) -> Result<Analytics, Refusal> {
    let client = pool.get().await?;
    let queue_id = match queue {
        Some(q) => Some(super::queue_id(&**client, q).await?),
        None => None,
    };
    let (buckets, minutes) = series(&client, range, queue_id).await?;
    Ok(Analytics {
        from: range.from,
        to: range.to,
        queue: queue.map(str::to_string),
        bucket_minutes: minutes,
        totals: Totals::of(&buckets),
        time_series: buckets,
    })
}

/// What the buckets of a series add up to.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Totals {
    pub pushed: i64,
    pub popped: i64,
    pub acked: i64,
    pub failed: i64,
    pub dead_lettered: i64,
}

impl Totals {
    fn of(buckets: &[Bucket]) -> Totals {
        let sum = |f: fn(&Bucket) -> i64| buckets.iter().map(f).sum();
        Totals {
            pushed: sum(|b| b.pushed),
            popped: sum(|b| b.popped),
            acked: sum(|b| b.acked),
            failed: sum(|b| b.failed),
            dead_lettered: sum(|b| b.dead_lettered),
        }
    }
}

/// Leases held now.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct Leases {
    pub active: i64,
}

/// `GET /api/v1/status`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Status {
    #[serde(flatten)]
    pub overview: Overview,
    pub totals: Totals,
    pub throughput: Vec<Bucket>,
    pub bucket_minutes: i64,
    pub leases: Leases,
}

/// `GET /api/v1/status/queues/{queue}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct QueueStatus {
    #[serde(flatten)]
    pub queue: QueueDetail,
    pub time_series: Vec<Bucket>,
    pub bucket_minutes: i64,
}

/// `GET /api/v1/status`: the overview of resources with the range's throughput.
pub async fn status(pool: &Pool, range: Range) -> Result<Status, Refusal> {
    let overview = super::resources::overview(pool).await?;
    let client = pool.get().await?;
    let (buckets, minutes) = series(&client, range, None).await?;
    let leases = super::groups::leases_held(&**client).await?;
    Ok(Status {
        overview,
        totals: Totals::of(&buckets),
        throughput: buckets,
        bucket_minutes: minutes,
        leases: Leases { active: leases },
    })
}

/// `GET /api/v1/status/queues`: a page of queues with their figures (as the resources
/// listing).
pub async fn queues(pool: &Pool, page: Page) -> Result<QueueList, Refusal> {
    super::resources::queues(pool, &Default::default(), page).await
}

/// `GET /api/v1/status/queues/{queue}`: the queue's figures, partitions and groups, with its
/// depth and lag per bucket over the range.
pub async fn queue(
    pool: &Pool,
    name: &str,
    range: Range,
    page: Page,
) -> Result<QueueStatus, Refusal> {
    let queue = super::resources::queue(pool, name, page).await?;
    let client = pool.get().await?;
    let (buckets, minutes) = series(&client, range, Some(queue.queue.id)).await?;
    Ok(QueueStatus {
        queue,
        time_series: buckets,
        bucket_minutes: minutes,
    })
}

/// `GET /api/v1/analytics/worker-metrics`: what each server did over the range, from the
/// per-minute counters every server writes.
pub async fn servers(pool: &Pool, range: Range) -> Result<Servers, Refusal> {
    let client = pool.get().await?;
    let workers = client
        .query(
            "SELECT server, sum(pushed)::bigint AS pushed, sum(popped)::bigint AS popped,
                    sum(acked)::bigint AS acked, sum(failed)::bigint AS failed,
                    sum(dead_lettered)::bigint AS dead_lettered, max(minute) AS last_minute
             FROM comb.server_minutes
             WHERE day >= ($1 AT TIME ZONE 'UTC')::date AND day <= ($2 AT TIME ZONE 'UTC')::date
               AND minute >= date_trunc('minute', $1) AND minute < $2
             GROUP BY server
             ORDER BY server LIMIT 1000",
            &[&range.from, &range.to],
        )
        .await?
        .iter()
        .map(|r| ServerFigures {
            server: r.get("server"),
            pushed: r.get("pushed"),
            popped: r.get("popped"),
            acked: r.get("acked"),
            failed: r.get("failed"),
            dead_lettered: r.get("dead_lettered"),
            last_seen: r.get("last_minute"),
        })
        .collect();
    Ok(Servers {
        from: range.from,
        to: range.to,
        workers,
    })
}

/// `GET /api/v1/analytics/worker-metrics`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct Servers {
    #[serde(serialize_with = "iso")]
    pub from: DateTime<Utc>,
    #[serde(serialize_with = "iso")]
    pub to: DateTime<Utc>,
    pub workers: Vec<ServerFigures>,
}

/// What one server did over the range.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ServerFigures {
    pub server: String,
    pub pushed: Option<i64>,
    pub popped: Option<i64>,
    pub acked: Option<i64>,
    pub failed: Option<i64>,
    pub dead_lettered: Option<i64>,
    /// The last minute it wrote counters for.
    #[serde(serialize_with = "iso_opt")]
    pub last_seen: Option<DateTime<Utc>>,
}

/// `GET /api/v1/analytics/postgres-stats`: the database as PostgreSQL sees it: size,
/// connections by state, cache hits, transactions, and per Comb table its size, live and
/// dead rows and last vacuum.
pub async fn postgres_stats(pool: &Pool) -> Result<PostgresStats, Refusal> {
    let client = pool.get().await?;
    let db = client
        .query_one(
            "SELECT current_setting('server_version') AS version,
                    current_database() AS database,
                    pg_database_size(current_database()) AS size,
                    current_setting('max_connections')::int AS max_connections,
                    round(d.blks_hit::numeric / nullif(d.blks_hit + d.blks_read, 0), 4)::float8
                        AS cache_hit_ratio,
                    d.xact_commit AS committed, d.xact_rollback AS rolled_back, d.deadlocks,
                    (SELECT extract(epoch FROM now() - min(xact_start))::float8
                     FROM pg_stat_activity
                     WHERE datname = current_database() AND xact_start IS NOT NULL)
                        AS oldest_transaction
             FROM pg_stat_database d WHERE d.datname = current_database()",
            &[],
        )
        .await?;
    let connections = client
        .query(
            "SELECT coalesce(state, 'other') AS state, count(*) AS n FROM pg_stat_activity
             WHERE datname = current_database() GROUP BY state",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get("state"), r.get("n")))
        .collect();
    let tables = client
        .query(
            "SELECT coalesce(parent.relname, c.relname)::text AS name,
                    sum(pg_total_relation_size(c.oid))::bigint AS size,
                    sum(s.n_live_tup)::bigint AS live, sum(s.n_dead_tup)::bigint AS dead,
                    max(s.last_autovacuum) AS vac
             FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'comb'
             LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
             LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
             LEFT JOIN pg_class parent ON parent.oid = i.inhparent
             WHERE c.relkind = 'r'
             GROUP BY 1
             ORDER BY size DESC",
            &[],
        )
        .await?
        .iter()
        .map(|r| TableStats {
            table: r.get("name"),
            size_bytes: r.get("size"),
            live_rows: r.get("live"),
            dead_rows: r.get("dead"),
            last_autovacuum: r.get("vac"),
        })
        .collect();
    Ok(PostgresStats {
        version: db.get("version"),
        database: db.get("database"),
        database_size_bytes: db.get("size"),
        connections,
        max_connections: db.get("max_connections"),
        cache_hit_ratio: db.get("cache_hit_ratio"),
        transactions: Transactions {
            committed: db.get("committed"),
            rolled_back: db.get("rolled_back"),
            deadlocks: db.get("deadlocks"),
        },
        oldest_transaction_seconds: db.get("oldest_transaction"),
        tables,
    })
}

/// `GET /api/v1/analytics/postgres-stats`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PostgresStats {
    pub version: String,
    pub database: String,
    pub database_size_bytes: i64,
    /// Connections to the database by state (`active`, `idle`, …; `other` without one).
    pub connections: std::collections::BTreeMap<String, i64>,
    pub max_connections: i32,
    #[serde(serialize_with = "super::wire::num_opt")]
    pub cache_hit_ratio: Option<f64>,
    pub transactions: Transactions,
    #[serde(serialize_with = "super::wire::num_opt")]
    pub oldest_transaction_seconds: Option<f64>,
    /// Comb's tables, the largest first (a partitioned table with its parts).
    pub tables: Vec<TableStats>,
}

/// The database's transactions since its statistics were reset.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Transactions {
    pub committed: i64,
    pub rolled_back: i64,
    pub deadlocks: i64,
}

/// One of Comb's tables as PostgreSQL sees it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TableStats {
    pub table: String,
    pub size_bytes: Option<i64>,
    pub live_rows: Option<i64>,
    pub dead_rows: Option<i64>,
    #[serde(serialize_with = "iso_opt")]
    pub last_autovacuum: Option<DateTime<Utc>>,
}

/// The minute's snapshot of each queue's figures, computed now over every partition (exact),
/// for the queues whose ids are `$1`: what the listings serve large queues' totals from
/// (`comb.queue_figures`).
const QUEUE_SNAPSHOT_SQL: &str = "
INSERT INTO comb.queue_minutes
    (day, minute, queue_id, total, pending, processing, dead_letters, lag_seconds,
     partitions, oldest_pending_at, last_message_at, taken_at)
SELECT (now() AT TIME ZONE 'UTC')::date, date_trunc('minute', now()), q.id,
       l.total, l.pending, l.processing, l.dead_letters,
       coalesce(extract(epoch FROM now() - l.oldest_pending_at), 0)::float8,
       l.partitions, l.oldest_pending_at, l.last_message_at, now()
FROM unnest($1::uuid[]) AS q(id) CROSS JOIN LATERAL comb.queue_live(q.id) l
ON CONFLICT DO NOTHING";

/// The minute's snapshot of each group's lag on each queue it reads, for the (queue, group)
/// pairs `$1`, `$2` (`comb.group_figures`).
const GROUP_SNAPSHOT_SQL: &str = "
INSERT INTO comb.group_minutes
    (day, minute, queue_id, consumer_group, partitions, lag, oldest_unsettled_at, leased,
     taken_at)
SELECT (now() AT TIME ZONE 'UTC')::date, date_trunc('minute', now()), s.queue_id,
       s.consumer_group, l.partitions, l.lag, l.oldest_unsettled_at, l.leased, now()
FROM unnest($1::uuid[], $2::text[]) AS s(queue_id, consumer_group)
CROSS JOIN LATERAL comb.group_live(s.queue_id, s.consumer_group) l
ON CONFLICT DO NOTHING";

/// Writes what this server did to `comb.server_minutes` every `interval`, and, once a
/// minute, on whichever server gets there first, the snapshot of [`QUEUE_SNAPSHOT_SQL`] and
/// [`GROUP_SNAPSHOT_SQL`]. Runs
/// forever; failures are logged and the next tick tries again.
pub async fn record(pool: Pool, metrics: Arc<Metrics>, server: String, interval: Duration) {
    let mut last = [0u64; 5];
    let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(100)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let m = &metrics.messages;
        let now = [
            m.pushed.get(),
            m.popped.get(),
            m.acked.get(),
            m.failed.get(),
            m.dead_lettered.get()
                + crate::metrics::LEASE_DEAD_LETTERED.get()
                + metrics.maintenance.dead_lettered.get(),
        ];
        let delta: Vec<i64> = now
            .iter()
            .zip(&last)
            .map(|(n, l)| n.saturating_sub(*l) as i64)
            .collect();
        write_queue_counts(&pool, &server, &metrics).await;
        match write_minute(&pool, &server, &delta).await {
            Ok(()) => last = now,
            Err(e) => tracing::warn!(error = ?e, "per-minute counters not written"),
        }
    }
}

/// Writes what this server did per queue since the last record (see [`PerQueue`]); what could
/// not be written is counted again with the next record.
///
/// [`PerQueue`]: crate::metrics::PerQueue
async fn write_queue_counts(pool: &Pool, server: &str, metrics: &Metrics) {
    let counts = metrics.queues.take();
    if counts.is_empty() {
        return;
    }
    let column = |f: fn(&QueueCounts) -> u64| -> Vec<i64> {
        counts.iter().map(|(_, c)| f(c) as i64).collect()
    };
    let names: Vec<&str> = counts.iter().map(|(q, _)| &**q).collect();
    let written = async {
        let client = pool.get().await?;
        // Names to ids through the catalog; counts of a queue deleted since are dropped.
        let ids: HashMap<String, Uuid> = listing::queue_ids_by_name(&**client, &names)
            .await?
            .into_iter()
            .collect();
        let ids: Vec<Option<Uuid>> = names.iter().map(|n| ids.get(*n).copied()).collect();
        client
            .execute(
                "INSERT INTO comb.queue_counts
                     (day, minute, server, queue_id, pushed, popped, acked, failed, dead_lettered)
                 SELECT (now() AT TIME ZONE 'UTC')::date, date_trunc('minute', now()), $1, u.id,
                        u.pushed, u.popped, u.acked, u.failed, u.dead_lettered
                 FROM unnest($2::uuid[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[],
                             $7::bigint[])
                     AS u(id, pushed, popped, acked, failed, dead_lettered)
                 WHERE u.id IS NOT NULL",
                &[
                    &server,
                    &ids,
                    &column(|c| c.pushed),
                    &column(|c| c.popped),
                    &column(|c| c.acked),
                    &column(|c| c.failed),
                    &column(|c| c.dead_lettered),
                ],
            )
            .await
            .map_err(Refusal::from)
    }
    .await;
    if let Err(e) = written {
        tracing::warn!(error = ?e, "per-queue counters not written");
        metrics.queues.give_back(counts);
    }
}

async fn write_minute(pool: &Pool, server: &str, delta: &[i64]) -> Result<(), Refusal> {
    let mut client = pool.get().await?;
    if delta.iter().any(|d| *d > 0) {
        client
            .execute(
                "INSERT INTO comb.server_minutes
                     (day, minute, server, pushed, popped, acked, failed, dead_lettered)
                 VALUES ((now() AT TIME ZONE 'UTC')::date, date_trunc('minute', now()), $1,
                         $2, $3, $4, $5, $6)",
                &[
                    &server, &delta[0], &delta[1], &delta[2], &delta[3], &delta[4],
                ],
            )
            .await?;
    }
    let tx = client.transaction().await?;
    tx.batch_execute("SET LOCAL statement_timeout = '30s'; SET LOCAL jit = off")
        .await?;
    let mine: bool = tx
        .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&SNAPSHOT_LOCK])
        .await?
        .get(0);
    let taken: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM comb.queue_minutes m
                            WHERE m.day = (now() AT TIME ZONE 'UTC')::date
                              AND m.minute = date_trunc('minute', now()))",
            &[],
        )
        .await?
        .get(0);
    if mine && !taken {
        let queues = listing::queue_ids(&*tx).await?;
        tx.execute(QUEUE_SNAPSHOT_SQL, &[&queues]).await?;
        let (queues, groups): (Vec<Uuid>, Vec<String>) =
            listing::subscriptions(&*tx, listing::Subscribers::All)
                .await?
                .into_iter()
                .map(|s| (s.queue_id, s.group))
                .unzip();
        tx.execute(GROUP_SNAPSHOT_SQL, &[&queues, &groups]).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// `GET /api/v1/analytics/system-metrics`: this server's process, pool and requests.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SystemMetrics {
    /// The address it listens on.
    pub server: String,
    pub pid: u32,
    pub uptime_seconds: f64,
    pub memory: Memory,
    pub database: PoolFigures,
    /// Requests served since it started.
    pub requests: u64,
    pub maintenance_leader: bool,
}

/// The process's memory.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Memory {
    /// Resident set size; null where the system does not say.
    pub resident_bytes: Option<u64>,
}

/// The request connection pool.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PoolFigures {
    pub pool_size: usize,
    pub pool_idle: usize,
    pub pool_max: usize,
    pub waiting: usize,
}

/// `POST /api/v1/stats/refresh`: nothing to refresh (figures are computed when asked); says
/// when they were computed, for Queen's clients that ask.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Refreshed {
    pub success: bool,
    pub refreshed: bool,
    #[serde(serialize_with = "iso")]
    pub computed_at: DateTime<Utc>,
    pub queues: i64,
}
