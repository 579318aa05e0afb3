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
use serde_json::{Value, json};

use super::{Page, Refusal};
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
SELECT coalesce(jsonb_agg(jsonb_build_object(
           'timestamp', comb.iso(coalesce(s.b, q.b)),
           'pushed', coalesce(s.pushed, 0), 'popped', coalesce(s.popped, 0),
           'acked', coalesce(s.acked, 0), 'failed', coalesce(s.failed, 0),
           'deadLettered', coalesce(s.dead_lettered, 0),
           'pushedPerSecond', coalesce(s.pushed, 0) / ($3 * 60.0),
           'ackedPerSecond', coalesce(s.acked, 0) / ($3 * 60.0),
           'messages', q.total, 'pending', q.pending, 'processing', q.processing,
           'deadLetters', q.dead_letters, 'lagSeconds', q.lag_seconds)
       ORDER BY coalesce(s.b, q.b)), '[]')
FROM s FULL JOIN q ON q.b = s.b";

async fn series(
    client: &deadpool_postgres::Client,
    range: Range,
    queue_id: Option<uuid::Uuid>,
) -> Result<(Value, i64), Refusal> {
    let minutes = range.bucket_minutes();
    let m = minutes as i32;
    let v: Value = client
        .query_one(SERIES_SQL, &[&range.from, &range.to, &m, &queue_id])
        .await?
        .get(0);
    Ok((v, minutes))
}

/// `GET /api/v1/status/analytics`: throughput, errors, depth and lag per bucket.
pub async fn analytics(pool: &Pool, range: Range, queue: Option<&str>) -> Result<Value, Refusal> {
    let client = pool.get().await?;
    let queue_id = match queue {
        Some(q) => Some(super::queue_id(&**client, q).await?),
        None => None,
    };
    let (buckets, minutes) = series(&client, range, queue_id).await?;
    let totals = totals(&buckets);
    Ok(json!({
        "from": range.from.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "to": range.to.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "queue": queue,
        "bucketMinutes": minutes,
        "timeSeries": buckets,
        "totals": totals,
    }))
}

fn totals(buckets: &Value) -> Value {
    let sum = |k: &str| -> i64 {
        buckets
            .as_array()
            .map(|b| b.iter().filter_map(|x| x[k].as_i64()).sum())
            .unwrap_or(0)
    };
    json!({
        "pushed": sum("pushed"),
        "popped": sum("popped"),
        "acked": sum("acked"),
        "failed": sum("failed"),
        "deadLettered": sum("deadLettered"),
    })
}

/// `GET /api/v1/status`: the overview of resources with the range's throughput.
pub async fn status(pool: &Pool, range: Range) -> Result<Value, Refusal> {
    let mut out = super::resources::overview(pool).await?;
    let client = pool.get().await?;
    let (buckets, minutes) = series(&client, range, None).await?;
    out["totals"] = totals(&buckets);
    out["throughput"] = buckets;
    out["bucketMinutes"] = json!(minutes);
    let leases: i64 = client
        .query_one(&super::groups::leases_sql(), &[])
        .await?
        .get(0);
    out["leases"] = json!({ "active": leases });
    Ok(out)
}

/// `GET /api/v1/status/queues`: a page of queues with their figures (as the resources
/// listing).
pub async fn queues(pool: &Pool, page: Page) -> Result<Value, Refusal> {
    super::resources::queues(pool, &Default::default(), page).await
}

/// `GET /api/v1/status/queues/{queue}`: the queue's figures, partitions and groups, with its
/// depth and lag per bucket over the range.
pub async fn queue(pool: &Pool, name: &str, range: Range, page: Page) -> Result<Value, Refusal> {
    let mut out = super::resources::queue(pool, name, page).await?;
    let client = pool.get().await?;
    let id = super::queue_id(&**client, name).await?;
    let (buckets, minutes) = series(&client, range, Some(id)).await?;
    out["timeSeries"] = buckets;
    out["bucketMinutes"] = json!(minutes);
    Ok(out)
}

/// `GET /api/v1/analytics/worker-metrics`: what each server did over the range, from the
/// per-minute counters every server writes.
pub async fn servers(pool: &Pool, range: Range) -> Result<Value, Refusal> {
    let client = pool.get().await?;
    let v: Value = client
        .query_one(
            "SELECT coalesce(jsonb_agg(jsonb_build_object(
                        'server', s.server, 'pushed', s.pushed, 'popped', s.popped,
                        'acked', s.acked, 'failed', s.failed, 'deadLettered', s.dead_lettered,
                        'lastSeen', comb.iso(s.last_minute)) ORDER BY s.server), '[]')
             FROM (
                SELECT server, sum(pushed)::bigint AS pushed, sum(popped)::bigint AS popped,
                       sum(acked)::bigint AS acked, sum(failed)::bigint AS failed,
                       sum(dead_lettered)::bigint AS dead_lettered, max(minute) AS last_minute
                FROM comb.server_minutes
                WHERE day >= ($1 AT TIME ZONE 'UTC')::date AND day <= ($2 AT TIME ZONE 'UTC')::date
                  AND minute >= date_trunc('minute', $1) AND minute < $2
                GROUP BY server
                ORDER BY server LIMIT 1000
             ) s",
            &[&range.from, &range.to],
        )
        .await?
        .get(0);
    Ok(json!({
        "from": range.from.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "to": range.to.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "workers": v,
    }))
}

/// `GET /api/v1/analytics/postgres-stats`: the database as PostgreSQL sees it: size,
/// connections by state, cache hits, transactions, and per Comb table its size, live and
/// dead rows and last vacuum.
pub async fn postgres_stats(pool: &Pool) -> Result<Value, Refusal> {
    let client = pool.get().await?;
    let row = client
        .query_one(
            "SELECT jsonb_build_object(
                'version', current_setting('server_version'),
                'database', current_database(),
                'databaseSizeBytes', pg_database_size(current_database()),
                'connections', (SELECT coalesce(jsonb_object_agg(coalesce(state, 'other'), n), '{}')
                                FROM (SELECT state, count(*) AS n FROM pg_stat_activity
                                      WHERE datname = current_database() GROUP BY state) a),
                'maxConnections', current_setting('max_connections')::int,
                'cacheHitRatio', (SELECT round(blks_hit::numeric / nullif(blks_hit + blks_read, 0), 4)
                                  FROM pg_stat_database WHERE datname = current_database()),
                'transactions', (SELECT jsonb_build_object('committed', xact_commit,
                                                           'rolledBack', xact_rollback,
                                                           'deadlocks', deadlocks)
                                 FROM pg_stat_database WHERE datname = current_database()),
                'oldestTransactionSeconds', (SELECT extract(epoch FROM now() - min(xact_start))::float8
                                             FROM pg_stat_activity
                                             WHERE datname = current_database()
                                               AND xact_start IS NOT NULL),
                'tables', (
                    SELECT coalesce(jsonb_agg(jsonb_build_object(
                               'table', t.name, 'sizeBytes', t.size, 'liveRows', t.live,
                               'deadRows', t.dead, 'lastAutovacuum', comb.iso(t.vac))
                           ORDER BY t.size DESC), '[]')
                    FROM (
                        SELECT coalesce(parent.relname, c.relname) AS name,
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
                    ) t))",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// The minute's snapshot: each queue's figures and each group's lag on each queue, computed
/// now over every partition and cursor (exact), for the listings that serve the figures of
/// large queues from it (`comb.queue_figures`, `comb.group_figures`).
const SNAPSHOT_SQL: &str = "
INSERT INTO comb.queue_minutes
    (day, minute, queue_id, total, pending, processing, dead_letters, lag_seconds,
     partitions, oldest_pending_at, last_message_at, taken_at)
SELECT (now() AT TIME ZONE 'UTC')::date, date_trunc('minute', now()), q.id,
       l.total, l.pending, l.processing, l.dead_letters,
       coalesce(extract(epoch FROM now() - l.oldest_pending_at), 0)::float8,
       l.partitions, l.oldest_pending_at, l.last_message_at, now()
FROM comb.queues q CROSS JOIN LATERAL comb.queue_live(q.id) l
ON CONFLICT DO NOTHING;
INSERT INTO comb.group_minutes
    (day, minute, queue_id, consumer_group, partitions, lag, oldest_unsettled_at, leased,
     taken_at)
SELECT (now() AT TIME ZONE 'UTC')::date, date_trunc('minute', now()), s.queue_id,
       s.consumer_group, l.partitions, l.lag, l.oldest_unsettled_at, l.leased, now()
FROM comb.subscriptions s CROSS JOIN LATERAL comb.group_live(s.queue_id, s.consumer_group) l
ON CONFLICT DO NOTHING";

/// Writes what this server did to `comb.server_minutes` every `interval`, and, once a
/// minute, on whichever server gets there first, the snapshot of [`SNAPSHOT_SQL`]. Runs
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
        pool.get()
            .await?
            .execute(
                "INSERT INTO comb.queue_counts
                     (day, minute, server, queue_id, pushed, popped, acked, failed, dead_lettered)
                 SELECT (now() AT TIME ZONE 'UTC')::date, date_trunc('minute', now()), $1, q.id,
                        u.pushed, u.popped, u.acked, u.failed, u.dead_lettered
                 FROM unnest($2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[],
                             $7::bigint[])
                     AS u(name, pushed, popped, acked, failed, dead_lettered)
                 JOIN comb.queues q ON q.name = u.name",
                &[
                    &server,
                    &names,
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
        tx.batch_execute(SNAPSHOT_SQL).await?;
    }
    tx.commit().await?;
    Ok(())
}
