//! What each PostgreSQL node of a run does per message: CPU of its processes, statements,
//! transactions, WAL, and on a Citus cluster the distributed work (two-phase commits and
//! multi-shard statements), read at the window's edges like [`crate::meter`].
//!
//! A cell of `comb-bench --citus` runs once on plain PostgreSQL (one node, `postgres`) and
//! once on a coordinator and its workers; both get this accounting, so their per-message
//! costs sit side by side in one table ([`table`]).
//!
//! Statements are `pg_stat_statements` calls of the cell's database, utility statements
//! (`BEGIN`, `COMMIT`, `PREPARE TRANSACTION`) left out (`pg_stat_statements.track_utility =
//! off`: every two-phase commit has a text of its own, which would flood the view).
//! Transactions are the database's commits. Two-phase commits are the coordinator's
//! `pg_dist_transaction` records, kept for the whole run by turning Citus's recovery of them
//! off (`citus.recover_2pc_interval = -1`). Single- and multi-shard executions are Citus's
//! `citus_stat_counters` of the database on each node.

use serde::{Deserialize, Serialize};
use tokio_postgres::Client;

use crate::http::BoxError;
use crate::peers;
use crate::procstat;

/// Settings every node needs for this accounting (plain PostgreSQL and Citus alike).
pub const PG_SETTINGS: &[(&str, &str)] = &[
    ("shared_preload_libraries", "pg_stat_statements"),
    ("pg_stat_statements.track_utility", "off"),
    ("pg_stat_statements.max", "10000"),
];

/// The same, for Citus nodes: Citus first in the preload list, its counters on, and the
/// two-phase commit records left in place for counting.
pub const CITUS_SETTINGS: &[(&str, &str)] = &[
    ("shared_preload_libraries", "citus,pg_stat_statements"),
    ("pg_stat_statements.track_utility", "off"),
    ("pg_stat_statements.max", "10000"),
    ("citus.enable_stat_counters", "on"),
    ("citus.recover_2pc_interval", "-1"),
];

/// One node of a run: what it is called in the table, and its URL of the cell's database.
#[derive(Debug, Clone)]
pub struct Node {
    /// `postgres`, `coordinator`, `worker1`, …
    pub role: String,
    /// The node's URL of the cell's database.
    pub url: String,
    /// Whether the node runs Citus (and has its counters).
    pub citus: bool,
}

/// The counters of one node at one instant.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    cpu_ticks: u64,
    commits: i64,
    wal_bytes: i64,
    statements: i64,
    two_phase: i64,
    single_shard: i64,
    multi_shard: i64,
}

/// A node's connection and process, for snapshots.
struct Probe {
    node: Node,
    client: Client,
    postmaster: u32,
}

/// Snapshots the counters of every node of a cell.
pub struct NodeMeter {
    probes: Vec<Probe>,
}

/// The counters of every node at one instant, in node order.
#[derive(Debug, Clone, Default)]
pub struct NodeSnapshot(Vec<Counters>);

/// What one node did in a cell's window, per message (and CPU in cores).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct NodeRow {
    /// `postgres`, `coordinator`, `worker1`, …
    pub node: String,
    /// CPU of the node's PostgreSQL processes, in cores.
    pub cpu_cores: f64,
    /// The same per message, µs.
    pub cpu_us_per_msg: Option<f64>,
    /// Statements executed per message (utility statements left out).
    pub statements_per_msg: Option<f64>,
    /// Transactions committed per message.
    pub commits_per_msg: Option<f64>,
    /// WAL bytes written per message.
    pub wal_bytes_per_msg: Option<f64>,
    /// Two-phase commits started by this node (a coordinator) per message.
    pub two_phase_per_msg: Option<f64>,
    /// Statements this node ran as one-shard (router) executions, per message.
    pub single_shard_per_msg: Option<f64>,
    /// Statements this node ran over several shards, per message.
    pub multi_shard_per_msg: Option<f64>,
}

const COUNTERS_SQL: &str = "SELECT \
    (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())::int8 AS commits, \
    (SELECT wal_bytes FROM pg_stat_wal)::int8 AS wal_bytes, \
    (SELECT coalesce(sum(calls), 0) FROM pg_stat_statements \
       WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()))::int8 \
       AS statements";

const CITUS_SQL: &str = "SELECT \
    (SELECT count(*) FROM pg_dist_transaction)::int8 AS two_phase, \
    coalesce((SELECT query_execution_single_shard FROM citus_stat_counters \
       WHERE name = current_database()), 0)::int8 AS single_shard, \
    coalesce((SELECT query_execution_multi_shard FROM citus_stat_counters \
       WHERE name = current_database()), 0)::int8 AS multi_shard";

impl NodeMeter {
    /// Connects to every node's database (creating `pg_stat_statements` in it where missing).
    pub async fn new(nodes: &[Node]) -> Result<NodeMeter, BoxError> {
        let mut probes = Vec::new();
        for node in nodes {
            let client = peers::connect(&node.url).await?;
            // A coordinator (first in `nodes`) propagates the extension to its workers,
            // which refuse to make it themselves.
            client
                .batch_execute(
                    "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_extension \
                     WHERE extname = 'pg_stat_statements') THEN \
                     CREATE EXTENSION pg_stat_statements; END IF; END $$",
                )
                .await
                .map_err(|e| {
                    let text = e
                        .as_db_error()
                        .map_or(e.to_string(), |d| d.message().to_string());
                    format!("{}: pg_stat_statements: {text}", node.role)
                })?;
            let backend: i32 = client
                .query_one("SELECT pg_backend_pid() AS pid", &[])
                .await?
                .get("pid");
            let postmaster = procstat::read_stat(backend as u32)
                .map(|s| s.ppid)
                .unwrap_or(0);
            probes.push(Probe {
                node: node.clone(),
                client,
                postmaster,
            });
        }
        Ok(NodeMeter { probes })
    }

    /// Reads every node's counters now.
    pub async fn snapshot(&self) -> NodeSnapshot {
        let mut out = Vec::with_capacity(self.probes.len());
        for p in &self.probes {
            let mut c = Counters {
                cpu_ticks: procstat::tree_cpu(p.postmaster),
                ..Counters::default()
            };
            if let Ok(r) = p.client.query_one(COUNTERS_SQL, &[]).await {
                c.commits = r.get("commits");
                c.wal_bytes = r.get("wal_bytes");
                c.statements = r.get("statements");
            }
            if p.node.citus
                && let Ok(r) = p.client.query_one(CITUS_SQL, &[]).await
            {
                c.two_phase = r.get("two_phase");
                c.single_shard = r.get("single_shard");
                c.multi_shard = r.get("multi_shard");
            }
            out.push(c);
        }
        NodeSnapshot(out)
    }

    /// Each node's figures between two snapshots `secs` apart, over `msgs` messages. The
    /// meter's own statements (two per node per snapshot) are taken off.
    pub fn rows(&self, a: &NodeSnapshot, b: &NodeSnapshot, secs: f64, msgs: f64) -> Vec<NodeRow> {
        let per = |x: f64| (msgs > 0.0).then(|| x / msgs);
        self.probes
            .iter()
            .zip(a.0.iter().zip(&b.0))
            .map(|(p, (x, y))| {
                let cpu = procstat::ticks_to_secs(y.cpu_ticks.saturating_sub(x.cpu_ticks));
                let own = if p.node.citus { 2 } else { 1 };
                let d = |f: fn(&Counters) -> i64| (f(y) - f(x)) as f64;
                NodeRow {
                    node: p.node.role.clone(),
                    cpu_cores: cpu / secs.max(1e-9),
                    cpu_us_per_msg: per(cpu * 1e6),
                    statements_per_msg: per((d(|c| c.statements) - own as f64).max(0.0)),
                    commits_per_msg: per(d(|c| c.commits)),
                    wal_bytes_per_msg: per(d(|c| c.wal_bytes)),
                    two_phase_per_msg: p.node.citus.then(|| per(d(|c| c.two_phase))).flatten(),
                    single_shard_per_msg: p
                        .node
                        .citus
                        .then(|| per(d(|c| c.single_shard)))
                        .flatten(),
                    multi_shard_per_msg: p.node.citus.then(|| per(d(|c| c.multi_shard))).flatten(),
                }
            })
            .collect()
    }
}

/// The per-node table of every row that has node figures: a line per (cell, system, node),
/// and for a Citus row a `cluster` line summing its nodes.
pub fn table(rows: &[crate::report::Row]) -> String {
    let header: Vec<String> = [
        "cell",
        "system",
        "node",
        "msg/s",
        "CPU cores",
        "CPU µs/msg",
        "stmts/msg",
        "xacts/msg",
        "WAL B/msg",
        "2PC/msg",
        "1-shard/msg",
        "multi-shard/msg",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let f =
        |v: Option<f64>, digits: usize| v.map_or("–".to_string(), |x| format!("{x:.digits$}"));
    let mut lines = Vec::new();
    for r in rows.iter().filter(|r| !r.nodes.is_empty()) {
        let mut push = |n: &NodeRow| {
            lines.push(vec![
                r.cell.clone(),
                r.system.clone(),
                n.node.clone(),
                format!("{:.0}", r.msgs_per_sec),
                format!("{:.2}", n.cpu_cores),
                f(n.cpu_us_per_msg, 0),
                f(n.statements_per_msg, 2),
                f(n.commits_per_msg, 2),
                f(n.wal_bytes_per_msg, 0),
                f(n.two_phase_per_msg, 3),
                f(n.single_shard_per_msg, 2),
                f(n.multi_shard_per_msg, 3),
            ]);
        };
        for n in &r.nodes {
            push(n);
        }
        if r.nodes.len() > 1 {
            push(&sum(&r.nodes));
        }
    }
    if lines.is_empty() {
        return String::new();
    }
    crate::report::align(&header, &lines)
}

/// The nodes' figures added up, as a `cluster` line.
pub fn sum(nodes: &[NodeRow]) -> NodeRow {
    let add = |f: fn(&NodeRow) -> Option<f64>| -> Option<f64> {
        nodes
            .iter()
            .filter_map(f)
            .fold(None, |acc, v| Some(acc.unwrap_or(0.0) + v))
    };
    NodeRow {
        node: "cluster".into(),
        cpu_cores: nodes.iter().map(|n| n.cpu_cores).sum(),
        cpu_us_per_msg: add(|n| n.cpu_us_per_msg),
        statements_per_msg: add(|n| n.statements_per_msg),
        commits_per_msg: add(|n| n.commits_per_msg),
        wal_bytes_per_msg: add(|n| n.wal_bytes_per_msg),
        two_phase_per_msg: add(|n| n.two_phase_per_msg),
        single_shard_per_msg: add(|n| n.single_shard_per_msg),
        multi_shard_per_msg: add(|n| n.multi_shard_per_msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_line_adds_its_nodes_and_keeps_what_none_has_empty() {
        let a = NodeRow {
            node: "coordinator".into(),
            cpu_cores: 0.5,
            cpu_us_per_msg: Some(10.0),
            two_phase_per_msg: Some(0.0),
            ..NodeRow::default()
        };
        let b = NodeRow {
            node: "worker1".into(),
            cpu_cores: 0.25,
            cpu_us_per_msg: Some(30.0),
            two_phase_per_msg: None,
            ..NodeRow::default()
        };
        let s = sum(&[a, b]);
        assert_eq!(s.node, "cluster");
        assert_eq!(s.cpu_cores, 0.75);
        assert_eq!(s.cpu_us_per_msg, Some(40.0));
        assert_eq!(s.two_phase_per_msg, Some(0.0));
        assert_eq!(s.wal_bytes_per_msg, None);
    }
}
