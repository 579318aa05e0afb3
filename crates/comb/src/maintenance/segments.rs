//! Segments of message storage: one table per period, reclaimed whole.
//!
//! The newest segment takes the pushes. One segment ahead always exists, so that rolling over
//! is a row insert rather than DDL on the hot path. A closed segment is summarised once (per
//! partition: the last position and time it holds); from then on the decision to drop it reads
//! only that summary, consumer positions and queue options — never snapshot horizons. The
//! newest summary of a partition outlives its segment's table: with the messages gone, it is
//! where the partition's head is read from.
//!
//! A closed segment may go when, for every partition with messages in it, its queue was
//! deleted, or the queue's `retentionSeconds` has passed its newest message there, or the
//! queue's `completedRetentionSeconds` has passed it and every consumer group is past it.

use deadpool_postgres::Client;

use super::locks::{give_way, lock_timeout_sql};
use super::statistics::PARTITIONS_PER_SEGMENT;
use super::{Report, Settings};
use crate::db::DbError;

/// Seconds after closing before a segment is summarised: pushes whose statement began before
/// the roll-over may still be writing into it.
const SUMMARY_GRACE_SECONDS: f64 = 2.0;

fn table(seg: i32) -> String {
    format!("comb.messages_{seg}")
}

async fn active(client: &Client) -> Result<(i32, f64), DbError> {
    let row = client
        .query_one(
            "SELECT seg, extract(epoch FROM now() - created_at)::float8
             FROM comb.segments ORDER BY seg DESC LIMIT 1",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// Makes sure the table after the active segment exists.
pub(crate) async fn make_ahead(
    client: &Client,
    settings: &Settings,
    report: &mut Report,
) -> Result<(), DbError> {
    let (seg, _) = active(client).await?;
    let next = seg + 1;
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table(next)])
        .await?
        .get(0);
    if exists {
        return Ok(());
    }
    // Built standalone and then attached: ATTACH takes only SHARE UPDATE EXCLUSIVE on the
    // parent, which neither readers nor writers conflict with, where CREATE … PARTITION OF
    // would queue an ACCESS EXCLUSIVE lock in front of all traffic. The CHECK constraint
    // spares ATTACH a validation scan.
    let t = table(next);
    let sql = format!(
        "BEGIN; {lt};
         CREATE TABLE {t} (LIKE comb.messages INCLUDING DEFAULTS INCLUDING STORAGE);
         ALTER TABLE {t} ADD PRIMARY KEY (partition_id, pos, seg);
         CREATE INDEX ON {t} (transaction_id, partition_id);
         ALTER TABLE {t} ALTER COLUMN partition_id SET (n_distinct = {PARTITIONS_PER_SEGMENT});
         ALTER TABLE {t} ADD CONSTRAINT messages_{next}_seg CHECK (seg >= {next} AND seg < {end});
         ALTER TABLE comb.messages ATTACH PARTITION {t} FOR VALUES FROM ({next}) TO ({end});
         COMMIT;",
        lt = lock_timeout_sql(settings),
        end = next + 1
    );
    if give_way(client, &sql).await? {
        report.created += 1;
    }
    Ok(())
}

/// Starts the next segment once the active one is `segment_seconds` old and its successor
/// table exists.
pub(crate) async fn roll_over(
    client: &Client,
    settings: &Settings,
    report: &mut Report,
) -> Result<(), DbError> {
    let (seg, age) = active(client).await?;
    if age < settings.segment_seconds as f64 {
        return Ok(());
    }
    let next = seg + 1;
    let ready: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table(next)])
        .await?
        .get(0);
    if !ready {
        return Ok(());
    }
    let n = client
        .execute(
            "WITH closed AS (UPDATE comb.segments SET closed_at = now() WHERE seg = $1)
             INSERT INTO comb.segments (seg) VALUES ($2) ON CONFLICT DO NOTHING",
            &[&seg, &next],
        )
        .await?;
    report.rolled += n as i32;
    Ok(())
}

/// Summarises closed segments once no push can still be writing into them.
pub(crate) async fn summarize(
    client: &Client,
    settings: &Settings,
    report: &mut Report,
) -> Result<(), DbError> {
    let due: Vec<i32> = client
        .query(
            "SELECT seg FROM comb.segments
             WHERE NOT summarized AND closed_at < now() - make_interval(secs => $1)
             ORDER BY seg",
            &[&SUMMARY_GRACE_SECONDS],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for seg in due {
        // SHARE waits for any push still inserting into the segment and lets readers be.
        let sql = format!(
            "BEGIN; {lt}; LOCK TABLE {t} IN SHARE MODE;
             INSERT INTO comb.segment_partitions (seg, partition_id, max_pos, max_created_at)
             SELECT {seg}, partition_id, max(pos), max(created_at) FROM {t} GROUP BY partition_id
             ON CONFLICT DO NOTHING;
             UPDATE comb.segments SET summarized = true WHERE seg = {seg};
             COMMIT;",
            lt = lock_timeout_sql(settings),
            t = table(seg),
        );
        if give_way(client, &sql).await? {
            report.summarized += 1;
        }
    }
    Ok(())
}

/// Segments every queue with messages in them has let go of.
///
/// The test of a segment is written once ([`held_by`]) and asked two ways: per segment on
/// PostgreSQL, as the set of held segments on Citus, which refuses a subquery correlated
/// with a reference table (`comb.segments`).
static RECLAIMABLE_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT s.seg FROM comb.segments s
         WHERE s.summarized
           AND s.seg < (SELECT max(seg) FROM comb.segments)
           AND NOT EXISTS (SELECT 1 {held} AND sp.seg = s.seg)
         ORDER BY s.seg",
        held = held_by(false)
    )
});

/// The rows of `comb.segment_partitions` (`sp`) whose partition still needs its segment (on
/// Citus, `citus`, in the form Citus runs on its workers).
fn held_by(citus: bool) -> String {
    format!(
        "
      FROM comb.segment_partitions sp
      {partition}
      CROSS JOIN LATERAL (
          SELECT {retention} AS retention,
                 comb.completed_retention_secs(q.options) AS completed
      ) o
      WHERE NOT (
            (o.retention > 0
             AND sp.max_created_at < now() - make_interval(secs => o.retention))
            OR (o.completed > 0
             AND sp.max_created_at < now() - make_interval(secs => o.completed)
             AND {passed})
        )",
        partition = crate::catalog::join_partition_and_queue!("sp.partition_id"),
        retention = crate::queue::retention_secs!("q.options"),
        passed = crate::cursor::all_passed("sp.partition_id", "sp.max_pos", citus)
    )
}

/// [`RECLAIMABLE_SQL`] as Citus plans it: the held segments first (a query of the workers,
/// every subquery correlated by partition), then the segments not among them.
static RECLAIMABLE_CITUS_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH held AS (SELECT DISTINCT sp.seg {held})
         SELECT s.seg FROM comb.segments s
         WHERE s.summarized
           AND s.seg < (SELECT max(seg) FROM comb.segments)
           AND s.seg NOT IN (SELECT seg FROM held)
         ORDER BY s.seg",
        held = held_by(true)
    )
});

/// Summaries of dropped segments that no longer tell anything. Once its messages are gone,
/// the newest summary of a partition is where its head is read from
/// (`comb.partition_head`), so it stays until a newer segment's summary supersedes it or the
/// partition is deleted. Summaries of segments that still exist are what the drop decision
/// reads, and stay with them.
const FORGET_SUMMARIES_SQL: &str = concat!(
    "
DELETE FROM comb.segment_partitions sp
WHERE sp.seg <> ALL (ARRAY(SELECT seg FROM comb.segments))
  AND (EXISTS (SELECT 1 FROM comb.segment_partitions n
               WHERE n.partition_id = sp.partition_id AND n.seg > sp.seg)
       OR NOT ",
    crate::catalog::partition_exists!("sp.partition_id"),
    ")"
);

/// Drops every reclaimable segment whose lock can be had within the lock timeout.
pub(crate) async fn drop_reclaimable(
    client: &Client,
    settings: &Settings,
    report: &mut Report,
) -> Result<(), DbError> {
    let segs: Vec<i32> = client
        .query(
            if crate::schema::citus::on() {
                RECLAIMABLE_CITUS_SQL.as_str()
            } else {
                RECLAIMABLE_SQL.as_str()
            },
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for seg in segs {
        let sql = format!(
            "BEGIN; {}; DROP TABLE IF EXISTS {};
             DELETE FROM comb.segments WHERE seg = {seg};
             {FORGET_SUMMARIES_SQL};
             COMMIT;",
            lock_timeout_sql(settings),
            table(seg)
        );
        if give_way(client, &sql).await? {
            tracing::info!(seg, "dropped message segment");
            report.dropped += 1;
        } else {
            tracing::info!(seg, "segment busy; dropping it next cycle");
            report.drop_retries += 1;
        }
    }
    Ok(())
}
