//! Versioned schema migrations, embedded in the binary and applied in order at start.
//!
//! The applied versions are recorded in `comb.migrations`. A server refuses to run against a
//! database whose schema is newer than the newest migration it carries: it would not know the
//! invariants that schema relies on.

use crate::backend::Backend;
use tokio_postgres::Client;

pub(crate) mod citus;
pub(crate) mod servers;

/// This server's release, as `comb --version` and `GET /health` say it.
pub(crate) const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The version of this build's set of data-path functions (`comb.store_batch_v4`, …): a
/// function's body changes only with this version (a test pins each body to it). Servers of
/// other releases call their own set, so this build's never changes what they run. The
/// unversioned set of 0.1.0 is version 1.
macro_rules! functions_version {
    () => {
        4
    };
}

pub(crate) use functions_version;

/// [`functions_version!`] as a value, for the server registry.
pub(crate) const FUNCTIONS_VERSION: i32 = functions_version!();

/// The name of a data-path function in this build's set: `versioned!("comb.store_batch")` is
/// `"comb.store_batch_v4"`, a literal, so statements calling it stay `&'static str`.
macro_rules! versioned {
    ($name:literal) => {
        concat!($name, "_v", $crate::schema::functions_version!())
    };
}
pub(crate) use versioned;

/// The data-path functions of a versioned set, by their names without the version: what
/// [`drop_unused_functions`] may drop. (The unversioned functions of 0.1.0 are none of them.)
const FUNCTION_SET: &[&str] = &[
    "store_batch",
    "hand_off",
    "complete_acks",
    "claim_partition",
    "judge_acks",
    "extend_lease",
    "create_partition",
];

/// One schema change, identified by a version that only grows.
pub(crate) struct Migration {
    /// Monotonic version number; also the file's numeric prefix.
    pub(crate) version: i32,
    /// Short name, recorded with the version.
    pub(crate) name: &'static str,
    /// The SQL, run in one transaction.
    pub(crate) sql: &'static str,
}

/// Every migration this binary knows, oldest first.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("migrations/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "segments",
        sql: include_str!("migrations/0002_segments.sql"),
    },
    Migration {
        version: 3,
        name: "insert_only_state",
        sql: include_str!("migrations/0003_insert_only_state.sql"),
    },
    Migration {
        version: 4,
        name: "transaction_index",
        sql: include_str!("migrations/0004_transaction_index.sql"),
    },
    Migration {
        version: 5,
        name: "partition_depth",
        sql: include_str!("migrations/0005_partition_depth.sql"),
    },
    Migration {
        version: 6,
        name: "newest_state_first",
        sql: include_str!("migrations/0006_newest_state_first.sql"),
    },
    Migration {
        version: 7,
        name: "timed_walk",
        sql: include_str!("migrations/0007_timed_walk.sql"),
    },
    Migration {
        version: 8,
        name: "queen_options",
        sql: include_str!("migrations/0008_queen_options.sql"),
    },
    Migration {
        version: 9,
        name: "producer_sub",
        sql: include_str!("migrations/0009_producer_sub.sql"),
    },
    Migration {
        version: 10,
        name: "administration",
        sql: include_str!("migrations/0010_administration.sql"),
    },
    Migration {
        version: 11,
        name: "payload_json",
        sql: include_str!("migrations/0011_payload_json.sql"),
    },
    Migration {
        version: 12,
        name: "figures",
        sql: include_str!("migrations/0012_figures.sql"),
    },
    Migration {
        version: 13,
        name: "dead_letter_producer",
        sql: include_str!("migrations/0013_dead_letter_producer.sql"),
    },
    Migration {
        version: 14,
        name: "queue_counts",
        sql: include_str!("migrations/0014_queue_counts.sql"),
    },
    Migration {
        version: 15,
        name: "sealed_claims",
        sql: include_str!("migrations/0015_sealed_claims.sql"),
    },
    Migration {
        version: 16,
        name: "streams",
        sql: include_str!("migrations/0016_streams.sql"),
    },
    Migration {
        version: 17,
        name: "partition_ids",
        sql: include_str!("migrations/0017_partition_ids.sql"),
    },
    Migration {
        version: 18,
        name: "stream_state_keys",
        sql: include_str!("migrations/0018_stream_state_keys.sql"),
    },
    Migration {
        version: 19,
        name: "servers",
        sql: include_str!("migrations/0019_servers.sql"),
    },
    Migration {
        version: 20,
        name: "min_server_version",
        sql: include_str!("migrations/0020_min_server_version.sql"),
    },
    Migration {
        version: 21,
        name: "lease_digest",
        sql: include_str!("migrations/0021_lease_digest.sql"),
    },
];

/// Key of the advisory lock that serialises migrations among servers starting together.
const MIGRATION_LOCK: i64 = 0x636f_6d62_0001;

/// Why the schema could not be brought up to date.
#[derive(Debug)]
pub(crate) enum MigrateError {
    /// The database holds a schema version this binary does not know, and does not serve
    /// this release (`min`: the oldest release it serves, when it says).
    TooNew {
        database: i32,
        known: i32,
        min: Option<String>,
    },
    /// The database refused a statement.
    Postgres(tokio_postgres::Error),
}

impl std::fmt::Display for MigrateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MigrateError::TooNew {
                database,
                known,
                min: Some(min),
            } => write!(
                f,
                "database schema is at version {database}, newer than this server knows ({known}), and serves comb {min} or newer; this is comb {SERVER_VERSION}: upgrade comb"
            ),
            MigrateError::TooNew {
                database,
                known,
                min: None,
            } => write!(
                f,
                "database schema is at version {database}, newer than this server knows ({known}); upgrade comb"
            ),
            MigrateError::Postgres(e) => match e.as_db_error() {
                // tokio-postgres says only "db error"; the server's words say what to fix.
                Some(db) => write!(
                    f,
                    "migration failed: {}{}",
                    db.message(),
                    db.detail().map(|d| format!(" ({d})")).unwrap_or_default()
                ),
                None => write!(f, "migration failed: {e}"),
            },
        }
    }
}

impl std::error::Error for MigrateError {}

impl From<tokio_postgres::Error> for MigrateError {
    fn from(e: tokio_postgres::Error) -> Self {
        MigrateError::Postgres(e)
    }
}

/// The newest schema version this binary knows.
pub(crate) fn latest_version() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// Whether a schema whose oldest release served is `min` serves release `version`: compared
/// as `major.minor.patch` numbers (anything after a `-` or `+` ignored); a version that does
/// not read as one is not served.
fn serves(min: &str, version: &str) -> bool {
    fn parts(v: &str) -> Option<(u64, u64, u64)> {
        let core = v.split(['-', '+']).next()?;
        let mut it = core.split('.').map(|p| p.parse::<u64>().ok());
        let parts = (it.next()??, it.next()??, it.next()??);
        it.next().is_none().then_some(parts)
    }
    matches!((parts(min), parts(version)), (Some(m), Some(v)) if m <= v)
}

/// Applies every pending migration and returns the versions applied (empty when up to date),
/// and the storage the database is ([`Backend::detect`]: read here, once per start).
pub(crate) async fn migrate(client: &mut Client) -> Result<(Vec<i32>, Backend), MigrateError> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(
        "CREATE SCHEMA IF NOT EXISTS comb;
         CREATE TABLE IF NOT EXISTS comb.migrations (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );",
    )
    .await?;
    let current: i32 = tx
        .query_one("SELECT coalesce(max(version), 0) FROM comb.migrations", &[])
        .await?
        .get(0);
    let known = latest_version();
    if current > known {
        // A newer schema: this server runs on it if it still serves this release.
        let min: Option<String> = tx
            .query_opt(
                "SELECT s.value FROM comb.schema_settings s WHERE s.name = 'min_server_version'",
                &[],
            )
            .await?
            .map(|r| r.get(0));
        match min {
            Some(min) if serves(&min, SERVER_VERSION) => {
                tracing::info!(
                    database = current,
                    known,
                    min_server_version = %min,
                    "the schema is newer than this server knows and still serves its release"
                );
                tx.commit().await?;
                let backend = Backend::detect(client).await?;
                return Ok((Vec::new(), backend));
            }
            min => {
                return Err(MigrateError::TooNew {
                    database: current,
                    known,
                    min,
                });
            }
        }
    }
    let mut applied = Vec::new();
    for m in MIGRATIONS.iter().filter(|m| m.version > current) {
        tx.batch_execute(m.sql).await?;
        tx.execute(
            "INSERT INTO comb.migrations (version, name) VALUES ($1, $2)",
            &[&m.version, &m.name],
        )
        .await?;
        applied.push(m.version);
    }
    tx.commit().await?;
    let backend = Backend::detect(client).await?;
    let distributed = citus::distribute(client, backend).await?;
    if !distributed.is_empty() {
        tracing::info!(?distributed, "distributed on Citus");
    }
    Ok((applied, backend))
}

/// Makes this build's data-path functions on one PostgreSQL, each `(name, create)` a
/// `CREATE FUNCTION` of a versioned name ([`versioned!`]) composed from its owners'
/// statements, made only when absent and never replaced: servers of another release call
/// their own set, and a body changes only with [`FUNCTIONS_VERSION`]. Under the migrations'
/// lock, so that servers starting together make each once, and [`drop_unused_functions`]
/// never drops one being made. Nothing on Citus, whose data-path functions
/// [`citus::delegate`] makes.
pub(crate) async fn install_functions(
    client: &mut Client,
    backend: Backend,
    functions: &[(&str, &str)],
) -> Result<(), tokio_postgres::Error> {
    if !backend.runs_data_path_functions() {
        return Ok(());
    }
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    for (name, create) in functions {
        let made: bool = tx
            .query_one("SELECT to_regproc($1) IS NOT NULL", &[name])
            .await?
            .get(0);
        if !made {
            tx.batch_execute(create).await?;
        }
    }
    tx.commit().await
}

/// Drops the sets of data-path functions that no registered server calls (their servers
/// stopped, or were forgotten after missing their beats): every versioned set but this
/// build's and those of the servers in `comb.servers`. The unversioned functions of 0.1.0,
/// whose servers do not register, are left alone: a later migration drops them once the
/// schema no longer serves 0.1.0. Skipped when the migrations' lock is held (a server is
/// starting and may be making a set). Returns the functions dropped.
pub(crate) async fn drop_unused_functions(
    client: &mut Client,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let locked: bool = tx
        .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?
        .get(0);
    if !locked {
        return Ok(Vec::new());
    }
    tx.batch_execute("SET LOCAL lock_timeout = '2s'").await?;
    let unused: Vec<String> = tx
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p
             WHERE p.pronamespace = 'comb'::regnamespace
               AND substring(p.proname FROM '^(.*)_v[0-9]+$') = ANY ($1)
               AND substring(p.proname FROM '_v([0-9]+)$')::integer <> $2
               AND substring(p.proname FROM '_v([0-9]+)$')::integer
                   NOT IN (SELECT s.functions_version FROM comb.servers s)
             ORDER BY 1",
            &[&FUNCTION_SET, &FUNCTIONS_VERSION],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for f in &unused {
        // A name PostgreSQL wrote (`regprocedure`, quoted as needed), not a client's value.
        tx.batch_execute(&format!("DROP FUNCTION IF EXISTS {f}"))
            .await?;
    }
    tx.commit().await?;
    Ok(unused)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_serves_releases_from_its_minimum_on() {
        assert!(serves("0.1.0", "0.2.0"));
        assert!(serves("0.2.0", "0.2.0"));
        assert!(serves("0.2.0", "0.10.0"));
        assert!(serves("0.2.0", "1.0.0-rc.1"));
        assert!(!serves("0.3.0", "0.2.0"));
        assert!(!serves("1.0.0", "0.9.9"));
        assert!(!serves("unknown", "0.2.0"));
        assert!(!serves("0.1", "0.2.0"));
    }

    #[test]
    fn versions_are_strictly_increasing() {
        let versions: Vec<i32> = MIGRATIONS.iter().map(|m| m.version).collect();
        assert!(versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
        assert_eq!(versions.first(), Some(&1));
    }
}
