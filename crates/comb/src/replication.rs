//! Whether an acknowledged write would survive a failover of the database.
//!
//! A push is answered `201` once its commit returns. On a lone PostgreSQL that means the WAL
//! is on its disk; on a replicated one, whether the commit also waited for a standby depends
//! on `synchronous_standby_names` (which Patroni's `synchronous_mode` maintains), on whether
//! such a standby is connected and streaming, and on `synchronous_commit`. When the commit did
//! not wait, a failover promotes a standby that may lack the last acknowledged messages. Comb
//! cannot change that, but it says so: at start-up in the log, in `/ready`'s detail and in
//! the `comb_database_sync_replication` gauge, checked again every [`CHECK_EVERY`].

use std::sync::Mutex;
use std::time::Duration;

use deadpool_postgres::Pool;
use serde::Serialize;

use crate::db::DbError;
use crate::metrics::{Gauge, Text};

/// How often the replication state is read again.
pub const CHECK_EVERY: Duration = Duration::from_secs(10);

/// What the primary says about its standbys, and the verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Durability {
    /// The primary's `synchronous_standby_names` (empty: no commit waits for a standby).
    pub synchronous_standby_names: String,
    /// `synchronous_commit` of Comb's sessions: `on`, `remote_write` and `remote_apply`
    /// wait for the synchronous standbys; `local` and `off` do not.
    pub synchronous_commit: String,
    /// Standbys connected to the primary.
    pub standbys: i64,
    /// Of those, the ones streaming in `sync` or `quorum` state.
    pub synchronous_standbys: i64,
    /// Whether the replication view was visible (it needs `pg_read_all_stats`).
    pub visible: bool,
    /// Whether a commit Comb acknowledges is known to be on a standby too.
    pub survives_failover: bool,
}

impl Durability {
    fn judge(mut self) -> Durability {
        let waits = matches!(
            self.synchronous_commit.as_str(),
            "on" | "remote_write" | "remote_apply"
        );
        self.survives_failover = waits
            && !self.synchronous_standby_names.trim().is_empty()
            && self.synchronous_standbys > 0;
        self
    }

    /// One line for the log.
    pub fn describe(&self) -> String {
        if self.survives_failover {
            format!(
                "commits wait for {} synchronous standby(s): acknowledged writes survive a failover",
                self.synchronous_standbys
            )
        } else if !self.visible {
            "the replication state is not visible to this role (grant pg_read_all_stats): \
             whether acknowledged writes survive a failover is unknown"
                .to_string()
        } else if self.standbys == 0 {
            "no standby is connected: a failover, if one is configured, would lose acknowledged writes"
                .to_string()
        } else {
            format!(
                "{} standby(s) replicate asynchronously (synchronous_standby_names '{}', \
                 synchronous_commit {}): a failover may lose acknowledged writes",
                self.standbys, self.synchronous_standby_names, self.synchronous_commit
            )
        }
    }

    /// The gauge's value: 1 durable on a standby, 0 not, -1 unknown.
    fn gauge(&self) -> f64 {
        if self.survives_failover {
            1.0
        } else if self.visible {
            0.0
        } else {
            -1.0
        }
    }
}

/// Reads the replication state on one pooled connection (so on the primary, and with the
/// `synchronous_commit` Comb's own sessions have).
pub async fn check(pool: &Pool) -> Result<Durability, DbError> {
    let client = pool.get().await?;
    let row = client
        .query_one(
            "SELECT current_setting('synchronous_standby_names') AS synchronous_standby_names,
                    current_setting('synchronous_commit') AS synchronous_commit,
                    (SELECT count(*) FROM pg_stat_replication) AS standbys,
                    (SELECT count(*) FROM pg_stat_replication
                      WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum'))
                      AS synchronous_standbys,
                    NOT EXISTS (SELECT 1 FROM pg_stat_replication WHERE sync_state IS NULL)
                      AS visible",
            &[],
        )
        .await?;
    Ok(Durability {
        synchronous_standby_names: row.get("synchronous_standby_names"),
        synchronous_commit: row.get("synchronous_commit"),
        standbys: row.get("standbys"),
        synchronous_standbys: row.get("synchronous_standbys"),
        visible: row.get("visible"),
        survives_failover: false,
    }
    .judge())
}

/// The last verdict, for `/ready` and `/metrics`.
#[derive(Debug, Default)]
pub struct Status {
    last: Mutex<Option<Durability>>,
    gauge: Gauge,
    standbys: Gauge,
}

impl Status {
    /// The last verdict (`None` before the first check succeeded).
    pub fn last(&self) -> Option<Durability> {
        self.last.lock().expect("replication status").clone()
    }

    fn set(&self, d: Durability) -> bool {
        self.gauge.set(d.gauge());
        self.standbys.set(d.synchronous_standbys as f64);
        let mut last = self.last.lock().expect("replication status");
        let changed = last.as_ref() != Some(&d);
        *last = Some(d);
        changed
    }

    /// The gauges, for `/metrics`.
    pub fn render(&self, out: &mut Text) {
        let known = self.last.lock().expect("replication status").is_some();
        out.gauge(
            "comb_database_sync_replication",
            "1 when commits wait for a streaming synchronous standby (acknowledged writes survive a failover), 0 when they do not, -1 when unknown.",
            if known { self.gauge.get() } else { -1.0 },
        );
        out.gauge(
            "comb_database_synchronous_standbys",
            "Standbys streaming in sync or quorum state, as the primary last said.",
            self.standbys.get(),
        );
    }
}

/// Checks now and every [`CHECK_EVERY`], logging the verdict at first and whenever it
/// changes (a warning when acknowledged writes would not survive a failover).
pub async fn watch(pool: Pool, status: std::sync::Arc<Status>) {
    loop {
        match check(&pool).await {
            Ok(d) => {
                let line = d.describe();
                let safe = d.survives_failover;
                if status.set(d) {
                    if safe {
                        tracing::info!("durability: {line}");
                    } else {
                        tracing::warn!("durability: {line}");
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "replication state not read"),
        }
        tokio::time::sleep(CHECK_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(names: &str, commit: &str, standbys: i64, sync: i64) -> Durability {
        Durability {
            synchronous_standby_names: names.into(),
            synchronous_commit: commit.into(),
            standbys,
            synchronous_standbys: sync,
            visible: true,
            survives_failover: false,
        }
        .judge()
    }

    #[test]
    fn only_a_streaming_synchronous_standby_and_a_waiting_commit_survive_failover() {
        assert!(state("\"node2\"", "on", 2, 1).survives_failover);
        assert!(state("ANY 1 (a, b)", "remote_apply", 2, 2).survives_failover);
        assert!(!state("", "on", 2, 0).survives_failover);
        assert!(!state("\"node2\"", "on", 1, 0).survives_failover);
        assert!(!state("\"node2\"", "local", 2, 1).survives_failover);
        assert!(!state("\"node2\"", "off", 2, 1).survives_failover);
        assert_eq!(state("", "on", 0, 0).gauge(), 0.0);
    }
}
