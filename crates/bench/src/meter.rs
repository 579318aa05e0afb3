//! Resource snapshots at the edges of a cell's window: CPU of the broker, of PostgreSQL and
//! of the load generator, the machine's busy and stolen time, and PostgreSQL's commit and
//! WAL counters.

use std::time::Instant;

use tokio_postgres::Client;

use crate::procstat::{self, SysCpu};

/// Counters at one instant.
#[derive(Debug, Clone)]
pub struct Snapshot {
    at: Instant,
    broker: Option<u64>,
    pg: u64,
    me: u64,
    sys: SysCpu,
    db: Option<DbCounters>,
}

/// PostgreSQL's own counters.
#[derive(Debug, Clone, Copy)]
struct DbCounters {
    commits: i64,
    wal_bytes: i64,
    wal_syncs: i64,
    wal_sync_ms: f64,
}

/// What happened between two snapshots.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    /// Seconds between the snapshots.
    pub secs: f64,
    /// Broker CPU seconds.
    pub broker_cpu: Option<f64>,
    /// PostgreSQL CPU seconds (postmaster and all its children).
    pub pg_cpu: f64,
    /// Load generator CPU seconds.
    pub loadgen_cpu: f64,
    /// CPU seconds used by processes other than the broker, PostgreSQL and the load
    /// generator.
    pub other_cpu: f64,
    /// Fraction of the machine's CPU time that was busy (0–1).
    pub machine_busy: f64,
    /// Fraction of the machine's CPU time stolen by the hypervisor (0–1).
    pub machine_steal: f64,
    /// Transactions committed cluster-wide.
    pub commits: Option<f64>,
    /// WAL bytes written.
    pub wal_bytes: Option<f64>,
    /// WAL flushes to disk (fsync/fdatasync calls).
    pub wal_syncs: Option<f64>,
    /// Milliseconds spent in those flushes (0 unless `track_wal_io_timing` is on).
    pub wal_sync_ms: Option<f64>,
}

/// Takes snapshots for one cell.
pub struct Meter {
    broker_pid: Option<u32>,
    postmaster_pid: u32,
    client: Client,
}

const COUNTERS_SQL: &str = "SELECT (SELECT sum(xact_commit)::int8 FROM pg_stat_database), \
    wal_bytes::int8, wal_sync, wal_sync_time FROM pg_stat_wal";

impl Meter {
    /// A meter for a broker process (if any) and the cluster `client` is connected to.
    pub async fn new(
        broker_pid: Option<u32>,
        client: Client,
    ) -> Result<Meter, tokio_postgres::Error> {
        // Our own backend's parent is the postmaster.
        let backend: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0);
        let postmaster_pid = procstat::read_stat(backend as u32)
            .map(|s| s.ppid)
            .unwrap_or(0);
        Ok(Meter {
            broker_pid,
            postmaster_pid,
            client,
        })
    }

    /// Reads every counter now.
    pub async fn snapshot(&self) -> Snapshot {
        let db = self
            .client
            .query_one(COUNTERS_SQL, &[])
            .await
            .ok()
            .map(|r| DbCounters {
                commits: r.get(0),
                wal_bytes: r.get(1),
                wal_syncs: r.get(2),
                wal_sync_ms: r.get(3),
            });
        Snapshot {
            at: Instant::now(),
            broker: self
                .broker_pid
                .and_then(|p| procstat::read_stat(p).ok())
                .map(|s| s.own()),
            pg: procstat::tree_cpu(self.postmaster_pid),
            me: procstat::self_cpu(),
            sys: procstat::sys_cpu(),
            db,
        }
    }

    /// The connection the meter uses, for other queries against the cell's database.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

/// The difference between two snapshots.
pub fn usage(a: &Snapshot, b: &Snapshot) -> Usage {
    let secs = (b.at - a.at).as_secs_f64();
    let t = |x: u64, y: u64| procstat::ticks_to_secs(y.saturating_sub(x));
    let total = b.sys.total.saturating_sub(a.sys.total).max(1) as f64;
    let idle = b.sys.idle.saturating_sub(a.sys.idle) as f64;
    let steal = b.sys.steal.saturating_sub(a.sys.steal) as f64;
    let db = |f: fn(&DbCounters) -> i64| match (&a.db, &b.db) {
        (Some(x), Some(y)) => Some((f(y) - f(x)) as f64),
        _ => None,
    };
    let broker_cpu = match (a.broker, b.broker) {
        (Some(x), Some(y)) => Some(t(x, y)),
        _ => None,
    };
    let busy = t(0, (total - idle - steal).max(0.0) as u64);
    let ours = broker_cpu.unwrap_or(0.0) + t(a.pg, b.pg) + t(a.me, b.me);
    Usage {
        secs,
        broker_cpu,
        pg_cpu: t(a.pg, b.pg),
        loadgen_cpu: t(a.me, b.me),
        other_cpu: (busy - ours).max(0.0),
        machine_busy: (total - idle - steal).max(0.0) / total,
        machine_steal: steal / total,
        commits: db(|c| c.commits),
        wal_bytes: db(|c| c.wal_bytes),
        wal_syncs: db(|c| c.wal_syncs),
        wal_sync_ms: match (&a.db, &b.db) {
            (Some(x), Some(y)) => Some(y.wal_sync_ms - x.wal_sync_ms),
            _ => None,
        },
    }
}
