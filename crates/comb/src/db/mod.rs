//! The connection pool and the errors that come back from the database.
//!
//! Errors come in two kinds that callers treat differently: the database is unavailable
//! (answer 503 and let the client retry) or it refused a statement (a real error). Pooled
//! connections run over the watched streams of [`watch`], so a database that goes silent is
//! noticed within seconds instead of hanging requests.

use std::sync::Arc;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

mod watch;

use watch::{Liveness, WatchedConnect, targets};

/// Planner settings for the consumer path's transactions (claims and acks), as statements
/// to run right after `BEGIN`.
///
/// Their statements take arrays (the partitions of a fused batch). Planned for the array at
/// hand, each custom plan looks cheaper than the generic one, so PostgreSQL would plan them
/// again on every execution (about a millisecond of CPU per claim, more than running it):
/// generic plans are forced. A generic plan is kept until something invalidates it, and one
/// made from the statistics of young tables (a generation or segment a few pages long, a
/// queue's first hundred cursors) reads them whole: sequentially, or through a bitmap and a
/// sort, which becomes thousands of rows per cursor as the tables fill. Every read of these
/// statements wants a few entries of an index in index order, so both are priced out.
macro_rules! consumer_plans {
    () => {
        "SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL enable_seqscan = off; \
         SET LOCAL enable_bitmapscan = off"
    };
}
pub(crate) use consumer_plans;

/// Why a database operation did not complete.
#[derive(Debug)]
pub(crate) enum DbError {
    /// No connection could be had (database down, unreachable, or pool closed).
    Unavailable(String),
    /// The database answered with an error.
    Postgres(tokio_postgres::Error),
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DbError::Unavailable(m) => write!(f, "database unavailable: {m}"),
            DbError::Postgres(e) => write!(f, "database error: {e}"),
        }
    }
}

impl std::error::Error for DbError {}

impl From<tokio_postgres::Error> for DbError {
    fn from(e: tokio_postgres::Error) -> Self {
        // A closed connection or an I/O error means the database went away, and so do the
        // SQLSTATEs of a server that is starting, stopping or full; anything else the server
        // answered with a SQLSTATE is a real error of the statement. So is what the client
        // refuses before anything reaches the server (a parameter it cannot encode, a column
        // it cannot decode: an error with a cause that is not I/O): a bug, not an outage.
        let client_side =
            std::error::Error::source(&e).is_some_and(|cause| !cause.is::<std::io::Error>());
        if e.is_closed()
            || e.as_db_error().is_none() && e.code().is_none() && !client_side
            || e.code().is_some_and(means_unavailable)
        {
            DbError::Unavailable(e.to_string())
        } else {
            DbError::Postgres(e)
        }
    }
}

/// SQLSTATEs that say the database cannot serve now, not that the statement was wrong:
/// connection exceptions (class 08), the server shutting down or crashed (57P01, 57P02),
/// starting up or in recovery (57P03), a session ended by the server (57P05), and no free
/// connection slot (53300). They come with a 503 and `Retry-After`, like a refused
/// connection, and the client retries.
pub(crate) fn means_unavailable(code: &tokio_postgres::error::SqlState) -> bool {
    let c = code.code();
    c.starts_with("08") || c.starts_with("57P0") || c == "53300"
}

impl From<deadpool_postgres::PoolError> for DbError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            deadpool_postgres::PoolError::Backend(e) => DbError::from(e),
            other => DbError::Unavailable(other.to_string()),
        }
    }
}

/// Builds the pool every worker and handler draws from. Its connections fail promptly when
/// the database stops answering (see the module documentation).
pub(crate) fn pool(database_url: &str, size: usize) -> Result<Pool, String> {
    let pg: tokio_postgres::Config = database_url
        .parse()
        .map_err(|e| format!("invalid database URL: {e}"))?;
    let targets = targets(&pg);
    if targets.is_empty() {
        return Err("the database URL names no host".into());
    }
    let connect = WatchedConnect {
        targets,
        liveness: Arc::new(Liveness::default()),
    };
    let mgr = Manager::from_connect(
        pg,
        connect,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(mgr)
        .max_size(size)
        .wait_timeout(Some(std::time::Duration::from_secs(10)))
        .create_timeout(Some(std::time::Duration::from_secs(5)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|e| e.to_string())
}

/// Ends a transaction that failed before its COMMIT was sent, so that the connection goes
/// back to the pool outside any transaction. (A COMMIT pipelined behind a failed statement
/// rolls back by itself and needs no help.)
pub(crate) async fn roll_back(pg: &tokio_postgres::Client) {
    if !pg.is_closed() {
        let _ = pg.batch_execute("ROLLBACK").await;
    }
}

/// Whether the database answers a trivial statement within `within`: what health and
/// readiness report.
pub(crate) async fn answers(pool: &Pool, within: std::time::Duration) -> bool {
    let probe = async {
        let client = pool.get().await.ok()?;
        client.query_one("SELECT 1", &[]).await.ok()
    };
    matches!(tokio::time::timeout(within, probe).await, Ok(Some(_)))
}

/// A client connected outside the pool, for migrations at start.
pub(crate) async fn connect(
    database_url: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(database_url, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::warn!(error = %e, "migration connection ended");
        }
    });
    Ok(client)
}
