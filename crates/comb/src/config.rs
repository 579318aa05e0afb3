//! Server configuration: command-line flags, each with a `COMB_*` environment variable.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// The `comb` command line.
#[derive(Debug, Parser)]
#[command(
    name = "comb",
    version,
    about = "A partitioned message queue on PostgreSQL"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// What the binary is asked to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply pending schema migrations, then serve the HTTP API.
    Serve(ServeConfig),
    /// Apply pending schema migrations and exit.
    Migrate(DatabaseConfig),
    #[command(flatten)]
    Client(crate::cli::ClientCommand),
}

/// Where the database is. Shared by every subcommand.
#[derive(Debug, Clone, Args)]
pub struct DatabaseConfig {
    /// PostgreSQL connection string.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:6633/comb"
    )]
    pub database_url: String,
}

/// Everything `comb serve` can be told.
#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    #[command(flatten)]
    pub database: DatabaseConfig,

    /// Address to serve HTTP on.
    #[arg(long, env = "COMB_LISTEN", default_value = "127.0.0.1:6632")]
    pub listen: SocketAddr,

    /// Largest request body accepted, in bytes.
    #[arg(long, env = "COMB_MAX_BODY_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Most items in one push, ack batch or transaction.
    #[arg(long, env = "COMB_MAX_BATCH", default_value_t = 10_000)]
    pub max_batch: usize,

    /// Most messages one pop may ask for.
    #[arg(long, env = "COMB_MAX_POP_BATCH", default_value_t = 10_000)]
    pub max_pop_batch: usize,

    /// Cap on a long-poll pop's `timeout`, in milliseconds.
    #[arg(long, env = "COMB_MAX_POLL_TIMEOUT_MS", default_value_t = 60_000)]
    pub max_poll_timeout_ms: u64,

    /// Most HTTP connections held open at once; more are answered 503 and closed.
    #[arg(long, env = "COMB_MAX_CONNECTIONS", default_value_t = 4_096)]
    pub max_connections: usize,

    /// Most pops waiting for messages at once; more are answered 429.
    #[arg(long, env = "COMB_MAX_WAITING_POPS", default_value_t = 10_000)]
    pub max_waiting_pops: usize,

    /// Push workers, each with its own database connection and its own share of the
    /// partitions (pushes to one partition always go to the same worker).
    #[arg(long, env = "COMB_PUSH_WORKERS", default_value_t = 4)]
    pub push_workers: usize,

    /// Database connections used to run fused pops.
    #[arg(long, env = "COMB_POP_WORKERS", default_value_t = 4)]
    pub pop_workers: usize,

    /// Database connections used to run fused acks. One by default: every ack transaction
    /// waits for its own WAL flush, and one worker taking every waiting ack at once commits
    /// far less often than several splitting them; more suit machines with many cores.
    #[arg(long, env = "COMB_ACK_WORKERS", default_value_t = 1)]
    pub ack_workers: usize,

    /// Database connections for everything else (configuration, catalog, health).
    #[arg(long, env = "COMB_ADMIN_CONNECTIONS", default_value_t = 4)]
    pub admin_connections: usize,

    /// Most push items fused into one database statement.
    #[arg(long, env = "COMB_FUSE_MAX_ITEMS", default_value_t = 5_000)]
    pub fuse_max_items: usize,

    /// How long pushes write into one message segment (table) before the next takes over.
    /// Retention reclaims storage a whole segment at a time.
    #[arg(long, env = "COMB_SEGMENT_SECONDS", default_value_t = 3_600)]
    pub segment_seconds: u64,

    /// How long pops and acks write cursor state into one generation (table) before the next
    /// takes over. Maintenance then carries the latest state of each cursor forward and drops
    /// the older generation whole: superseded versions outlive this by about one maintenance
    /// interval. Shorter keeps the state tables small (their size follows the pop and ack
    /// rate times this period); each switch costs one short exclusive lock.
    #[arg(long, env = "COMB_GENERATION_SECONDS", default_value_t = 20)]
    pub generation_seconds: u64,

    /// Pause between maintenance cycles, in milliseconds.
    #[arg(long, env = "COMB_MAINTENANCE_INTERVAL_MS", default_value_t = 10_000)]
    pub maintenance_interval_ms: u64,

    /// How often this server writes what it did to the per-minute counters of
    /// `/api/v1/status/analytics` (and one server each queue's depth and lag, once a minute),
    /// in milliseconds.
    #[arg(long, env = "COMB_STATS_INTERVAL_MS", default_value_t = 60_000)]
    pub stats_interval_ms: u64,

    /// How long maintenance waits for a table lock before it gives way to traffic and tries
    /// again next cycle, in milliseconds.
    #[arg(long, env = "COMB_MAINTENANCE_LOCK_TIMEOUT_MS", default_value_t = 100)]
    pub maintenance_lock_timeout_ms: u64,

    /// How often a waiting pop re-checks the database when no wake-up arrives, in milliseconds.
    /// Wake-ups come from pushes on this server and, through the database, on others; this is
    /// only the safety net.
    #[arg(long, env = "COMB_POLL_FALLBACK_MS", default_value_t = 2_000)]
    pub poll_fallback_ms: u64,
}

impl ServeConfig {
    /// The cap on long-poll waits as a duration.
    pub fn max_poll_timeout(&self) -> Duration {
        Duration::from_millis(self.max_poll_timeout_ms)
    }

    /// Connections the shared pool must hold for all workers plus admin work.
    pub fn pool_size(&self) -> usize {
        self.push_workers + self.pop_workers + self.ack_workers + self.admin_connections
    }
}
