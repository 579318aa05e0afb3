//! A throwaway Citus cluster: a coordinator and two workers on loopback, each a [`Postgres`]
//! with Citus preloaded, for the tests that check Comb on a distributed database.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::{Postgres, sanitize_db_prefix};

/// Settings of every node: Citus preloaded, memory small enough that three nodes and the
/// plain cluster fit beside the tests on a small machine.
const CITUS_SETTINGS: &[(&str, &str)] = &[
    ("shared_preload_libraries", "citus"),
    ("shared_buffers", "32MB"),
    ("work_mem", "4MB"),
    ("maintenance_work_mem", "32MB"),
    ("max_connections", "300"),
    // Citus runs a maintenance daemon (a background worker) per database, and the suite's
    // tests each make a database on the shared cluster: with too few, a rebalance's
    // background task never starts.
    ("max_worker_processes", "64"),
    // Rebalancing moves shards by logical replication.
    ("wal_level", "logical"),
    // Few shards per table keep DDL (migrations make and drop tables) quick; the tests need
    // several shards per worker, not Citus's default 32.
    ("citus.shard_count", "8"),
    ("citus.log_remote_commands", "off"),
    // Every two-phase commit leaves a row in `pg_dist_transaction` until recovery, which
    // would run every minute, removes it: the tests count those rows to show that a request
    // committed on one node, so the rows stay. (Recovery is for nodes that fail mid-commit;
    // the test clusters' nodes do not.)
    ("citus.recover_2pc_interval", "-1"),
];

/// A Citus cluster of a coordinator and (by default) two workers, each on a free port of 127.0.0.1 with
/// trust authentication for `postgres`, stopped and removed when dropped.
///
/// Databases are made by [`Citus::create_database`]: Citus is set up per database (the
/// extension in it on every node, the workers added from the coordinator), so tests sharing
/// the cluster do not see each other's tables.
pub struct Citus {
    coordinator: Postgres,
    workers: Vec<Postgres>,
}

impl Citus {
    /// Starts the three nodes (at once) and returns when every one accepts connections.
    pub fn start() -> io::Result<Citus> {
        Self::start_with(&[])
    }

    /// Like [`Citus::start`], with `settings` applied on every node after the cluster's own,
    /// so they win (benchmarks use it for durable, roomier settings).
    pub fn start_with(settings: &[(&str, &str)]) -> io::Result<Citus> {
        Self::start_workers(2, settings)
    }

    /// A coordinator and `workers` workers (at least one), with `settings` as in
    /// [`Citus::start_with`]: benchmarks compare clusters of one and two workers.
    pub fn start_workers(workers: usize, settings: &[(&str, &str)]) -> io::Result<Citus> {
        let all: Vec<(&str, &str)> = CITUS_SETTINGS.iter().chain(settings).copied().collect();
        let mut nodes = std::thread::scope(|s| {
            let started: Vec<_> = (0..1 + workers.max(1))
                .map(|_| s.spawn(|| Postgres::start_with(&all)))
                .collect();
            started
                .into_iter()
                .map(|h| h.join().expect("a node's start panicked"))
                .collect::<io::Result<Vec<Postgres>>>()
        })?;
        let coordinator = nodes.remove(0);
        Ok(Citus {
            coordinator,
            workers: nodes,
        })
    }

    /// One cluster per test process, started on first use (stopped by the nodes' watchdogs
    /// once the process exits). Panics if it cannot be started.
    pub fn shared() -> &'static Citus {
        static SHARED: OnceLock<Citus> = OnceLock::new();
        SHARED.get_or_init(|| match Citus::start() {
            Ok(c) => c,
            Err(e) => panic!("could not start the shared Citus cluster: {e}"),
        })
    }

    /// The coordinator: where Comb connects and where distributed tables are queried.
    pub fn coordinator(&self) -> &Postgres {
        &self.coordinator
    }

    /// The workers, holding the shards.
    pub fn workers(&self) -> &[Postgres] {
        &self.workers
    }

    /// Creates a database on every node with Citus set up in it — the extension on each node,
    /// the coordinator registered and both workers added — and returns the coordinator's URL
    /// of it.
    pub fn create_database(&self, prefix: &str) -> io::Result<String> {
        static COUNTER: AtomicU64 = AtomicU64::new(1);
        // Citus changes its catalogs on every node when a database joins: one at a time
        // ("tuple concurrently updated" otherwise).
        static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{}_{n}_{}", sanitize_db_prefix(prefix), std::process::id());
        for node in std::iter::once(&self.coordinator).chain(&self.workers) {
            node.psql("postgres", &format!("CREATE DATABASE \"{name}\""))?;
            node.psql(&name, "CREATE EXTENSION citus")?;
        }
        self.coordinator.psql(
            &name,
            &format!(
                "SELECT citus_set_coordinator_host('127.0.0.1', {})",
                self.coordinator.port()
            ),
        )?;
        for w in &self.workers {
            self.add_worker(&name, w)?;
        }
        Ok(self.coordinator.url(&name))
    }

    /// Makes database `db` (made by [`Citus::create_database`] and prepared by the caller, for
    /// example migrated) a template: connections to it are refused from now on and the open
    /// ones (Citus's maintenance daemon, cached connections between nodes) are ended, on every
    /// node, so that [`Citus::create_database_from`] can copy it.
    pub fn freeze_template(&self, db: &str) -> io::Result<()> {
        for node in std::iter::once(&self.coordinator).chain(&self.workers) {
            node.psql(
                "postgres",
                &format!("ALTER DATABASE \"{db}\" WITH ALLOW_CONNECTIONS false"),
            )?;
        }
        for node in std::iter::once(&self.coordinator).chain(&self.workers) {
            node.psql(
                "postgres",
                &format!(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE datname = '{db}'"
                ),
            )?;
        }
        Ok(())
    }

    /// Creates a database on every node as a copy of that node's `template` (see
    /// [`Citus::freeze_template`]) and returns the coordinator's URL of it. Every node copies
    /// its own, so the copy's shards, metadata and nodes are the template's: a distributed
    /// schema in the time of a `CREATE DATABASE`, where distributing it again takes seconds.
    pub fn create_database_from(&self, template: &str, prefix: &str) -> io::Result<String> {
        static COUNTER: AtomicU64 = AtomicU64::new(1);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{}_c{n}_{}", sanitize_db_prefix(prefix), std::process::id());
        for node in std::iter::once(&self.coordinator).chain(&self.workers) {
            // A copy fails while anything is connected to the template; a node's daemon may
            // still be leaving it.
            let mut tries = 0;
            loop {
                match node.psql(
                    "postgres",
                    &format!("CREATE DATABASE \"{name}\" TEMPLATE \"{template}\""),
                ) {
                    Ok(_) => break,
                    Err(e) if tries < 50 && e.to_string().contains("being accessed") => {
                        tries += 1;
                        std::thread::sleep(std::time::Duration::from_millis(100));
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(self.coordinator.url(&name))
    }

    /// Adds `worker` (a node started by the caller with [`Citus::node_settings`]) to
    /// database `db`'s cluster, creating the database and the extension on it first when
    /// missing. Tests that grow a cluster use it.
    pub fn add_worker(&self, db: &str, worker: &Postgres) -> io::Result<()> {
        let exists = worker.psql(
            "postgres",
            &format!("SELECT count(*) FROM pg_database WHERE datname = '{db}'"),
        )?;
        if exists == "0" {
            worker.psql("postgres", &format!("CREATE DATABASE \"{db}\""))?;
            worker.psql(db, "CREATE EXTENSION citus")?;
        }
        self.coordinator.psql(
            db,
            &format!("SELECT citus_add_node('127.0.0.1', {})", worker.port()),
        )?;
        Ok(())
    }

    /// The settings every node of a cluster gets, for a node started separately.
    pub fn node_settings() -> &'static [(&'static str, &'static str)] {
        CITUS_SETTINGS
    }
}
