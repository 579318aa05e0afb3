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
use crate::messages::segments as statements;

/// Seconds after closing before a segment is summarised: pushes whose statement began before
/// the roll-over may still be writing into it.
const SUMMARY_GRACE_SECONDS: f64 = 2.0;

/// The newest segment and its age in seconds.
async fn active(client: &Client) -> Result<(i32, f64), DbError> {
    let row = client.query_one(statements::ACTIVE_SQL, &[]).await?;
    Ok((row.get("seg"), row.get("age")))
}

/// Whether a table exists.
async fn exists(client: &Client, table: &str) -> Result<bool, DbError> {
    Ok(client
        .query_one("SELECT to_regclass($1) IS NOT NULL AS found", &[&table])
        .await?
        .get("found"))
}

/// Makes sure the table after the active segment exists.
pub(crate) async fn make_ahead(
    client: &Client,
    settings: &Settings,
    report: &mut Report,
) -> Result<(), DbError> {
    let (seg, _) = active(client).await?;
    let next = seg + 1;
    if exists(client, &statements::table(next)).await? {
        return Ok(());
    }
    let sql = format!(
        "BEGIN; {lt};
         {make}
         COMMIT;",
        lt = lock_timeout_sql(settings),
        make = statements::make_sql(next, PARTITIONS_PER_SEGMENT),
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
    if !exists(client, &statements::table(next)).await? {
        return Ok(());
    }
    let n = client
        .execute(statements::ROLL_OVER_SQL, &[&seg, &next])
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
        .query(statements::DUE_SQL, &[&SUMMARY_GRACE_SECONDS])
        .await?
        .iter()
        .map(|r| r.get("seg"))
        .collect();
    for seg in due {
        let sql = format!(
            "BEGIN; {lt}; {summarize}
             COMMIT;",
            lt = lock_timeout_sql(settings),
            summarize = statements::summarize_sql(seg),
        );
        if give_way(client, &sql).await? {
            report.summarized += 1;
        }
    }
    Ok(())
}

/// Segments every queue with messages in them has let go of.
static RECLAIMABLE_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    statements::reclaimable_sql(
        false,
        crate::catalog::join_partition_and_queue!("sp.partition_id"),
        &crate::cursor::all_passed("sp.partition_id", "sp.max_pos", false),
    )
});

/// [`RECLAIMABLE_SQL`] as Citus plans it.
static RECLAIMABLE_CITUS_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    statements::reclaimable_sql(
        true,
        crate::catalog::join_partition_and_queue!("sp.partition_id"),
        &crate::cursor::all_passed("sp.partition_id", "sp.max_pos", true),
    )
});

/// Drops every reclaimable segment whose lock can be had within the lock timeout.
pub(crate) async fn drop_reclaimable(
    client: &Client,
    settings: &Settings,
    report: &mut Report,
) -> Result<(), DbError> {
    let segs: Vec<i32> = client
        .query(
            if !settings.backend.joins_across_partitions() {
                RECLAIMABLE_CITUS_SQL.as_str()
            } else {
                RECLAIMABLE_SQL.as_str()
            },
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get("seg"))
        .collect();
    for seg in segs {
        let sql = format!(
            "BEGIN; {}; {}
             COMMIT;",
            lock_timeout_sql(settings),
            statements::drop_sql(seg, crate::catalog::partition_exists!("sp.partition_id"))
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
