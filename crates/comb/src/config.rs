//! Server configuration: command-line flags, each with a `COMB_*` environment variable.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;

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

    /// Push workers, each running one push transaction at a time on its own connection.
    /// Which worker takes a push is `push::store::shard_key`'s choice.
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

    /// How many generations a streams query's state versions stay in before maintenance
    /// carries the keys still current out of the oldest and drops it. A key no cycle rewrote
    /// is copied once per this many generations, so large states that change a little at a
    /// time cost about 1/this of their keys per period; superseded versions are kept this
    /// many periods longer.
    #[arg(long, env = "COMB_STREAM_STATE_GENERATIONS", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub stream_state_generations: u32,

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

    /// Whether a push hands its messages to pops waiting on this server (`on`), or waiting
    /// pops always claim for themselves (`off`): the way back should a deployment need it.
    #[arg(long, env = "COMB_HANDOFF", default_value = "on", value_parser = ["on", "off"])]
    pub handoff: String,

    /// On a Citus coordinator, where the data path's statements go: `direct` (the default)
    /// to the worker holding each partition's shard, over pools of their own (pushes, pops
    /// named and over a whole queue, acks, lease extension, transactions within one worker);
    /// `coordinator` through the coordinator, which routes them: for clusters whose workers
    /// this server cannot reach (managed services that keep the workers' addresses private).
    /// See `docs/scale-out.md`. Ignored without Citus.
    #[arg(long, env = "COMB_CITUS_ROUTE", default_value = "direct", value_parser = ["direct", "coordinator"])]
    pub citus_route: String,

    /// With `--citus-route direct`, connections to each worker, per pool (the general pool's
    /// and the consumer pool's); by default as many as the coordinator's pools have.
    #[arg(long, env = "COMB_CITUS_WORKER_POOL_SIZE")]
    pub citus_worker_pool_size: Option<usize>,

    #[command(flatten)]
    pub auth: AuthConfig,

    #[command(flatten)]
    pub tls: TlsConfig,
}

/// Bearer tokens (see `docs/security.md`). Every setting is also read from Queen's variable
/// of the same meaning (`JWT_ENABLED`, `JWT_SECRET`, …) when neither the flag nor its
/// `COMB_*` variable is given, so a deployment moving from Queen keeps its protection.
#[derive(Debug, Clone, Default, Args)]
pub struct AuthConfig {
    /// Require a bearer token (JWT) on every route but `/health`, `/ready` (and `/metrics`
    /// unless `--jwt-protect-metrics`). Queen: `JWT_ENABLED`.
    #[arg(long, env = "COMB_JWT_ENABLED", num_args = 0..=1, default_missing_value = "true")]
    pub jwt_enabled: Option<bool>,

    /// `HS256`, `RS256`, `EdDSA` or `auto` (any of them for which a key is configured).
    /// Default `HS256`. Queen: `JWT_ALGORITHM`.
    #[arg(long, env = "COMB_JWT_ALGORITHM")]
    pub jwt_algorithm: Option<String>,

    /// Shared secret for HS256. Queen: `JWT_SECRET`.
    #[arg(long, env = "COMB_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,

    /// Public key for RS256 or EdDSA: PEM text, or the path of a PEM file. Queen:
    /// `JWT_PUBLIC_KEY`.
    #[arg(long, env = "COMB_JWT_PUBLIC_KEY")]
    pub jwt_public_key: Option<String>,

    /// URL of a JSON Web Key Set, fetched at start and refreshed in the background; the last
    /// set fetched stays in use while the URL does not answer. Queen: `JWT_JWKS_URL`.
    #[arg(long, env = "COMB_JWT_JWKS_URL")]
    pub jwt_jwks_url: Option<String>,

    /// Seconds between refreshes of the key set (default 3600). A token naming a key id
    /// the set lacks triggers an early refresh, at most once per 30 s. Queen:
    /// `JWT_JWKS_REFRESH_INTERVAL`.
    #[arg(long, env = "COMB_JWT_JWKS_REFRESH_SECONDS")]
    pub jwt_jwks_refresh_seconds: Option<u64>,

    /// How long one key set fetch may take, in milliseconds (default 5000). Queen:
    /// `JWT_JWKS_TIMEOUT_MS`.
    #[arg(long, env = "COMB_JWT_JWKS_TIMEOUT_MS")]
    pub jwt_jwks_timeout_ms: Option<u64>,

    /// Required `iss` claim (unset: any). Queen: `JWT_ISSUER`.
    #[arg(long, env = "COMB_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,

    /// Required `aud` claim (unset: any). Queen: `JWT_AUDIENCE`.
    #[arg(long, env = "COMB_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,

    /// Seconds of tolerance on `exp` and `nbf` (default 30). Queen: `JWT_CLOCK_SKEW`.
    #[arg(long, env = "COMB_JWT_CLOCK_SKEW")]
    pub jwt_clock_skew: Option<u64>,

    /// Claim holding one role name (default `role`). Queen: `JWT_ROLES_CLAIM`.
    #[arg(long, env = "COMB_JWT_ROLES_CLAIM")]
    pub jwt_roles_claim: Option<String>,

    /// Claim holding an array of role names (default `roles`). Queen: `JWT_ROLES_ARRAY_CLAIM`.
    #[arg(long, env = "COMB_JWT_ROLES_ARRAY_CLAIM")]
    pub jwt_roles_array_claim: Option<String>,

    /// Role name of administrators (default `admin`). Queen: `JWT_ROLE_ADMIN`.
    #[arg(long, env = "COMB_JWT_ROLE_ADMIN")]
    pub jwt_role_admin: Option<String>,

    /// Role name of producers and consumers (default `read-write`). Queen:
    /// `JWT_ROLE_READ_WRITE`.
    #[arg(long, env = "COMB_JWT_ROLE_READ_WRITE")]
    pub jwt_role_read_write: Option<String>,

    /// Role name of readers (default `read-only`). Queen: `JWT_ROLE_READ_ONLY`.
    #[arg(long, env = "COMB_JWT_ROLE_READ_ONLY")]
    pub jwt_role_read_only: Option<String>,

    /// Role name of producers that may only push (default `write-only`). Queen:
    /// `JWT_ROLE_WRITE_ONLY`.
    #[arg(long, env = "COMB_JWT_ROLE_WRITE_ONLY")]
    pub jwt_role_write_only: Option<String>,

    /// Claim limiting a token to queues whose names start with one of its prefixes (a
    /// string or an array of strings). Tokens without the claim are not limited. Unset: no
    /// scoping.
    #[arg(long, env = "COMB_JWT_QUEUES_CLAIM")]
    pub jwt_queues_claim: Option<String>,

    /// Require a reader's token on `GET /metrics` too (Queen leaves it open).
    #[arg(long, env = "COMB_JWT_PROTECT_METRICS", num_args = 0..=1, default_missing_value = "true")]
    pub jwt_protect_metrics: Option<bool>,

    /// Comma-separated paths answered without a token (exact paths, any method), beside
    /// `/health`, `/ready` and `/metrics`. The dashboard's pages always ask for a token.
    /// Queen: `JWT_SKIP_PATHS`.
    #[arg(long, env = "COMB_JWT_SKIP_PATHS")]
    pub jwt_skip_paths: Option<String>,
}

/// TLS on the listener. Both files are read again on SIGHUP.
#[derive(Debug, Clone, Default, Args)]
pub struct TlsConfig {
    /// PEM file with the server's certificate chain; with `--tls-key`, serves HTTPS only.
    #[arg(long, env = "COMB_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,

    /// PEM file with the server's private key (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "COMB_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
}

impl ServeConfig {
    /// The cap on long-poll waits as a duration.
    pub fn max_poll_timeout(&self) -> Duration {
        Duration::from_millis(self.max_poll_timeout_ms)
    }

    /// Connections of the general pool: the push workers' plus admin work.
    pub fn general_pool_size(&self) -> usize {
        self.push_workers + self.admin_connections
    }

    /// Connections of the consumer path's pool: the pop and ack workers'.
    pub fn consumer_pool_size(&self) -> usize {
        self.pop_workers + self.ack_workers
    }
}
