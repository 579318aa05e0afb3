//! Background maintenance: message segments (make ahead, roll over, summarise, drop whole),
//! generations of cursor state (make ahead, rotate, carry forward, drop whole), planner
//! statistics of the tables being written, and dead-lettering of messages pending past
//! `maxWaitTimeSeconds`.
//!
//! Every server runs the loop, but only the holder of a session-level advisory lock does the
//! work, so it runs once per cluster however many servers share the database. When the
//! holder dies its connection closes, the lock is released, and another server takes over on
//! its next tick. On a failover the lock dies with the old primary's sessions: every server's
//! maintenance connection fails, reconnects to the new primary (the pool only connects to a
//! server that takes writes) and asks again. Each statement carries its own `statement_timeout` and every exclusive lock
//! is asked for with a short `lock_timeout`: maintenance gives way to traffic, never the
//! reverse.

mod days;
mod generations;
mod locks;
mod max_wait;
mod segments;
mod statistics;

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Client;

use crate::db::DbError;
use crate::metrics::Metrics;

/// Key of the advisory lock whose holder runs maintenance.
const LEADER_LOCK: i64 = 0x636f_6d62_0002;

/// How maintenance runs; from the server configuration.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// How long pushes write into one segment before the next takes over.
    pub(crate) segment_seconds: u64,
    /// How long cursor state versions go into one generation before the next takes over.
    pub(crate) generation_seconds: u64,
    /// How many generations stream state versions stay in before the oldest is carried
    /// forward and dropped (at least 1).
    pub(crate) stream_state_generations: u32,
    /// Pause between cycles.
    pub(crate) interval: Duration,
    /// How long a drop or summary may wait for a lock before it gives up until next cycle.
    pub(crate) lock_timeout: Duration,
    /// Name of this server in logs and `comb.maintenance_runs`.
    pub(crate) server: String,
    /// The storage maintained.
    pub(crate) backend: crate::backend::Backend,
}

/// What one cycle did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Report {
    pub(crate) created: i32,
    pub(crate) rolled: i32,
    pub(crate) summarized: i32,
    pub(crate) dropped: i32,
    /// Drops (of segments or generations) that could not get their lock in time and wait
    /// for the next cycle.
    pub(crate) drop_retries: i32,
    pub(crate) dead_lettered: i64,
    /// Generation tables made (ahead of their use).
    pub(crate) generations_created: i32,
    pub(crate) generations_dropped: i32,
    /// Cursor states copied into the newest generation from the ones dropped.
    pub(crate) states_carried: i64,
    /// Tables kept by the day (traces, per-minute counters) made ahead and dropped.
    pub(crate) daily_created: i32,
    pub(crate) daily_dropped: i32,
}

impl Report {
    fn did_anything(&self) -> bool {
        *self != Report::default()
    }

    /// Adds this finished cycle to the maintenance metrics.
    fn record(&self, metrics: &crate::metrics::Maintenance, took: std::time::Duration) {
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        metrics.cycles.add(1);
        metrics.cycle_seconds.set(took.as_secs_f64());
        metrics.segments_created.add(n(self.created.into()));
        metrics.segments_rolled.add(n(self.rolled.into()));
        metrics.segments_summarized.add(n(self.summarized.into()));
        metrics.segments_dropped.add(n(self.dropped.into()));
        metrics.drop_retries.add(n(self.drop_retries.into()));
        metrics.dead_lettered.add(n(self.dead_lettered));
        metrics
            .generations_created
            .add(n(self.generations_created.into()));
        metrics
            .generations_dropped
            .add(n(self.generations_dropped.into()));
        metrics.states_carried.add(n(self.states_carried));
    }
}

/// Runs maintenance forever on a connection of its own (reconnecting as needed): the leader
/// lock lives and dies with that connection. What it does is added to `metrics`.
pub(crate) async fn run(database_url: String, settings: Settings, metrics: Arc<Metrics>) {
    let pool = match crate::db::pool(&database_url, 1) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "maintenance disabled");
            return;
        }
    };
    loop {
        match pool.get().await {
            Ok(mut client) => {
                if let Err(e) = lead(&mut client, &settings, &metrics).await {
                    metrics.maintenance.set_leader(false);
                    metrics.maintenance.failures.add(1);
                    tracing::warn!(error = %e, "maintenance failed; retrying");
                    // The session may hold the leader lock in an unknown state: start afresh.
                    let _ = deadpool_postgres::Object::take(client);
                }
            }
            Err(e) => tracing::debug!(error = %e, "maintenance cannot connect yet"),
        }
        tokio::time::sleep(settings.interval).await;
    }
}

/// Tries to become the leader and, while leading, runs a cycle every interval.
async fn lead(client: &mut Client, settings: &Settings, metrics: &Metrics) -> Result<(), DbError> {
    client
        .batch_execute("SET application_name = 'comb maintenance'; SET statement_timeout = '60s'")
        .await?;
    loop {
        let leader: bool = client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&LEADER_LOCK])
            .await?
            .get(0);
        metrics.maintenance.set_leader(leader);
        if leader {
            let started = chrono::Utc::now();
            let clock = Instant::now();
            let report = cycle(client, settings).await?;
            report.record(&metrics.maintenance, clock.elapsed());
            if report.did_anything() {
                tracing::info!(?report, "maintenance");
                client
                    .execute(
                        "INSERT INTO comb.maintenance_runs (started_at, server, created, rolled,
                             summarized, dropped, drop_retries, dead_lettered,
                             generations_created, generations_dropped, states_carried)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                        &[
                            &started,
                            &settings.server,
                            &report.created,
                            &report.rolled,
                            &report.summarized,
                            &report.dropped,
                            &report.drop_retries,
                            &report.dead_lettered,
                            &report.generations_created,
                            &report.generations_dropped,
                            &report.states_carried,
                        ],
                    )
                    .await?;
            }
        }
        tokio::time::sleep(settings.interval).await;
    }
}

/// One pass over everything maintenance looks after.
pub(crate) async fn cycle(client: &mut Client, settings: &Settings) -> Result<Report, DbError> {
    let mut report = Report::default();
    segments::make_ahead(client, settings, &mut report).await?;
    segments::roll_over(client, settings, &mut report).await?;
    segments::summarize(client, settings, &mut report).await?;
    segments::drop_reclaimable(client, settings, &mut report).await?;
    // Older generations are carried before a new one starts, so that the generation just
    // replaced is left a whole cycle for writers that chose it to finish; the next one is
    // made after the switch, so that it is attached a whole cycle before writers go to it.
    generations::carry_forward_and_drop(client, settings, &mut report).await?;
    generations::carry_streams_forward_and_drop(client, settings).await?;
    generations::rotate(client, settings).await?;
    generations::make_ahead(client, settings, &mut report).await?;
    let analysed = statistics::refresh(client, settings).await?;
    if analysed > 0 {
        tracing::debug!(analysed, "statistics of the tables being written refreshed");
    }
    report.dead_lettered += max_wait::dead_letter_overdue(client, settings.backend).await?;
    report.daily_created = days::make_ahead(client, settings).await?;
    report.daily_dropped = days::drop_expired(client, settings).await?;
    let forgotten = crate::schema::servers::forget_silent(client).await?;
    if forgotten > 0 {
        tracing::info!(forgotten, "servers that missed their heartbeats forgotten");
    }
    let dropped = crate::schema::drop_unused_functions(client).await?;
    if !dropped.is_empty() {
        tracing::info!(?dropped, "functions no registered server calls dropped");
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_report_fields_do_not_wrap() {
        let m = crate::metrics::Maintenance::default();
        Report::record(
            &Report {
                created: -1,
                ..Report::default()
            },
            &m,
            std::time::Duration::ZERO,
        );
        assert_eq!(m.segments_created.get(), 0);
    }
}
