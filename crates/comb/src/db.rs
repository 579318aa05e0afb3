//! The connection pool and the errors that come back from the database.

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

/// Why a database operation did not complete.
#[derive(Debug)]
pub enum DbError {
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
        // A closed connection or an I/O error means the database went away; anything the
        // server answered with a SQLSTATE is a real error of the statement.
        if e.is_closed() || e.as_db_error().is_none() && e.code().is_none() {
            DbError::Unavailable(e.to_string())
        } else {
            DbError::Postgres(e)
        }
    }
}

impl From<deadpool_postgres::PoolError> for DbError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            deadpool_postgres::PoolError::Backend(e) => DbError::from(e),
            other => DbError::Unavailable(other.to_string()),
        }
    }
}

/// Builds the pool every worker and handler draws from.
pub fn pool(database_url: &str, size: usize) -> Result<Pool, String> {
    let pg: tokio_postgres::Config = database_url
        .parse()
        .map_err(|e| format!("invalid database URL: {e}"))?;
    let mgr = Manager::from_config(
        pg,
        NoTls,
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

/// A client connected outside the pool, for migrations at start.
pub async fn connect(database_url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(database_url, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::warn!(error = %e, "migration connection ended");
        }
    });
    Ok(client)
}
