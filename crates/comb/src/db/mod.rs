//! The connection pool and the errors that come back from the database.
//!
//! Errors come in two kinds that callers treat differently: the database is unavailable
//! (answer 503 and let the client retry) or it refused a statement (a real error). Every
//! connection goes to the primary among the servers the URL names ([`primary`]) and runs over
//! the watched streams of [`watch`], so a database that goes silent is noticed within seconds
//! instead of hanging requests, and a demoted one is left.

use std::sync::Arc;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};

mod pipeline;
pub(crate) mod tls;

mod primary;
pub(crate) mod route;
mod watch;

pub(crate) use pipeline::{Pipelined, Prepared};
pub(crate) use primary::Connector;

/// Planner settings for the consumer path's statements (claims, acks, lease expiry), as
/// statements for one transaction.
///
/// Their statements take arrays (the partitions of a fused batch). Planned for the array at
/// hand, each custom plan looks cheaper than the generic one, so PostgreSQL would plan them
/// again on every execution (about a millisecond of CPU per claim, more than running it):
/// generic plans are forced. A generic plan is kept until something invalidates it, and one
/// made from the statistics of young tables (a generation or segment a few pages long, a
/// queue's first hundred cursors) reads them whole: sequentially, or through a bitmap and a
/// sort, which becomes thousands of rows per cursor as the tables fill. Every read of these
/// statements wants a few entries of an index in index order, so both are priced out.
///
/// The consumer path's own connections ([`Pools::consumer`]) hold these settings from their
/// start (see [`session_settings`]): set per transaction, their three statements cost
/// PostgreSQL more than some of the statements they plan. Acks inside a client's transaction,
/// on the general pool, set them for that transaction.
macro_rules! consumer_plans {
    () => {
        $crate::db::consumer_plans!("SET LOCAL ", "; ")
    };
    ($set:literal, $sep:literal) => {
        concat!(
            $set,
            "plan_cache_mode = force_generic_plan",
            $sep,
            $set,
            "enable_seqscan = off",
            $sep,
            $set,
            "enable_bitmapscan = off"
        )
    };
}
pub(crate) use consumer_plans;

/// [`consumer_plans`] as the `SET` clauses of a function's definition: the consumer path's
/// plans for the statements of a function called on any connection.
pub(crate) fn function_plans() -> &'static str {
    consumer_plans!("SET ", " ")
}

/// [`consumer_plans`] for a whole session: what the consumer pool's connections start with.
const CONSUMER_SESSION_PLANS: &str = consumer_plans!("SET ", "; ");

/// What every request connection sets first: no JIT compilation. Requests run short
/// statements; an estimate that crosses the JIT threshold (a listing over a large queue, say)
/// would otherwise spend up to a second compiling a plan that reads a few index entries.
const REQUEST_SETTINGS: &str = "SET jit = off";

/// The session settings a request connection starts with: [`REQUEST_SETTINGS`], and for the
/// consumer pool [`consumer_plans`]; with `custom_plans` (the storage plans each execution:
/// `Backend::plans_for_each_execution`) custom plans last. Set by statements rather than
/// startup options, which a pooler in session mode may refuse.
fn session_settings(consumer: bool, custom_plans: bool) -> String {
    let mut settings = REQUEST_SETTINGS.to_string();
    if consumer {
        settings.push_str("; ");
        settings.push_str(CONSUMER_SESSION_PLANS);
    }
    if custom_plans {
        // Citus routes a statement with parameters to one worker only in a custom plan: a
        // generic plan of the claim's statements is refused ("could not create distributed
        // plan").
        settings.push_str("; SET plan_cache_mode = force_custom_plan");
    }
    settings
}

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
        if unavailable(&e) {
            // The cause (which servers were tried and what each said, or the database's own
            // words: on Citus, which worker could not be reached) is worth telling; a
            // database error displays as "db error" alone.
            match (e.as_db_error(), std::error::Error::source(&e)) {
                (Some(db), _) => DbError::Unavailable(format!(
                    "{} ({}): {}",
                    db.severity(),
                    db.code().code(),
                    db.message()
                )),
                (None, Some(cause)) => DbError::Unavailable(format!("{e}: {cause}")),
                (None, None) => DbError::Unavailable(e.to_string()),
            }
        } else {
            DbError::Postgres(e)
        }
    }
}

/// Whether an error means the database cannot serve now rather than that the statement was
/// wrong.
fn unavailable(e: &tokio_postgres::Error) -> bool {
    // A closed connection or an I/O error means the database went away, and so do the
    // SQLSTATEs of a server that is starting, stopping or full; anything else the server
    // answered with a SQLSTATE is a real error of the statement. So is what the client
    // refuses before anything reaches the server (a parameter it cannot encode, a column
    // it cannot decode: an error with a cause that is not I/O): a bug, not an outage.
    let client_side =
        std::error::Error::source(e).is_some_and(|cause| !cause.is::<std::io::Error>());
    e.is_closed()
        || e.as_db_error().is_none() && e.code().is_none() && !client_side
        || e.code().is_some_and(means_unavailable)
        || e.as_db_error()
            .is_some_and(|d| worker_lost(d.code(), d.message()))
}

/// Whether an error is Citus telling that a worker went away mid-transaction. Citus reports
/// a worker it cannot connect to as a connection exception (class 08, above), but one whose
/// connection broke under a transaction as an internal error (XX000) with this text and no
/// code of its own. Either way the coordinator's own connection is fine and stays pooled; the
/// request is answered 503 with `Retry-After` like any other outage.
fn worker_lost(code: &tokio_postgres::error::SqlState, message: &str) -> bool {
    *code == tokio_postgres::error::SqlState::INTERNAL_ERROR
        && message.starts_with("failure on connection marked as essential")
}

/// SQLSTATEs that say the database cannot serve now, not that the statement was wrong:
/// connection exceptions (class 08), the server shutting down or crashed (57P01, 57P02),
/// starting up or in recovery (57P03), a session ended by the server (57P05), no free
/// connection slot (53300), and a server that refuses writes (25006, a standby or a demoted
/// primary: the connection closes itself and the next one goes to the primary). They come
/// with a 503 and `Retry-After`, like a refused connection, and the client retries.
pub(crate) fn means_unavailable(code: &tokio_postgres::error::SqlState) -> bool {
    let c = code.code();
    c.starts_with("08") || c.starts_with("57P0") || c == "53300" || c == READ_ONLY
}

impl DbError {
    /// Whether the database undid the whole transaction to break a deadlock or a
    /// serialization conflict (SQLSTATE 40P01, 40001): nothing of it was committed, so it
    /// may be run again as it was. Maintenance's DDL (a segment made or dropped) can meet a
    /// push that way, and Citus's distributed deadlock detection cancels the younger
    /// transaction, a request's rather than the long-held lock it waited for.
    pub(crate) fn is_rolled_back_conflict(&self) -> bool {
        use tokio_postgres::error::SqlState;
        match self {
            DbError::Postgres(e) => e.code().is_some_and(|c| {
                *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
            }),
            DbError::Unavailable(_) => false,
        }
    }
}

/// SQLSTATE read_only_sql_transaction: a write reached a server that does not accept writes.
const READ_ONLY: &str = "25006";

impl From<deadpool_postgres::PoolError> for DbError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            deadpool_postgres::PoolError::Backend(e) => DbError::from(e),
            other => DbError::Unavailable(other.to_string()),
        }
    }
}

/// The request pools: connections as PostgreSQL starts them, and the consumer path's.
#[derive(Clone)]
pub(crate) struct Pools {
    /// Pushes, the administration API, the dashboard and clients' transactions. Without JIT
    /// ([`REQUEST_SETTINGS`]), like the consumer pool.
    pub(crate) general: Pool,
    /// Pops and acks of their own: connections started with the consumer path's planner
    /// settings ([`consumer_plans`]).
    pub(crate) consumer: Pool,
}

impl Pools {
    /// Both pools, `general` and `consumer` connections at most. Their connections go to the
    /// primary and fail promptly when the database stops answering (see the module
    /// documentation).
    pub(crate) fn new(
        database_url: &str,
        general: usize,
        consumer: usize,
        custom_plans: bool,
    ) -> Result<Pools, String> {
        Pools::of(database_url, None, general, consumer, custom_plans)
    }

    /// [`Pools::new`] at the server `at` (host and port) instead of the URL's, with the
    /// URL's database, credentials and TLS settings: a Citus worker's pools (custom plans).
    pub(crate) fn at(
        database_url: &str,
        at: &route::Node,
        general: usize,
        consumer: usize,
    ) -> Result<Pools, String> {
        Pools::of(database_url, Some(at), general, consumer, true)
    }

    fn of(
        database_url: &str,
        at: Option<&route::Node>,
        general: usize,
        consumer: usize,
        custom_plans: bool,
    ) -> Result<Pools, String> {
        let started = |consumer: bool| -> Result<Connector, String> {
            let mut connector = Connector::new(database_url)?;
            connector.setup = Some(session_settings(consumer, custom_plans));
            Ok(match at {
                Some((host, port)) => connector.at(host, *port),
                None => connector,
            })
        };
        Ok(Pools {
            general: pool_of(started(false)?, general)?,
            consumer: pool_of(started(true)?, consumer)?,
        })
    }

    /// Both pools' figures added up, as one pool's.
    pub(crate) fn status(&self) -> deadpool_postgres::Status {
        let (a, b) = (self.general.status(), self.consumer.status());
        deadpool_postgres::Status {
            max_size: a.max_size + b.max_size,
            size: a.size + b.size,
            available: a.available + b.available,
            waiting: a.waiting + b.waiting,
        }
    }
}

/// Builds a pool of at most `size` connections of the database URL, to the primary (see
/// the module documentation).
pub(crate) fn pool(database_url: &str, size: usize) -> Result<Pool, String> {
    pool_of(Connector::new(database_url)?, size)
}

fn pool_of(connector: Connector, size: usize) -> Result<Pool, String> {
    let connector = Arc::new(connector);
    let mgr = Manager::from_connect(
        connector.config.clone(),
        primary::PooledConnect(connector),
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
    problem(pool, within).await.is_none()
}

/// Why the database cannot take work now (`None` when a pooled connection to the primary
/// answers within `within`): no server answers, none is the primary, or the probe timed out.
/// A pooled connection whose server no longer takes writes is dropped on the way.
pub(crate) async fn problem(pool: &Pool, within: std::time::Duration) -> Option<String> {
    let probe = async {
        let client = pool.get().await.map_err(|e| DbError::from(e).to_string())?;
        let writable: bool = client
            .query_one(
                "SELECT current_setting('transaction_read_only') = 'off' AS writable",
                &[],
            )
            .await
            .map_err(|e| DbError::from(e).to_string())?
            .get("writable");
        if !writable {
            // Its server was demoted: the connection is of no use to any request.
            drop(deadpool_postgres::Object::take(client));
            return Err("the database server is read-only: no longer the primary".to_string());
        }
        Ok(())
    };
    match tokio::time::timeout(within, probe).await {
        Ok(Ok(())) => None,
        Ok(Err(why)) => Some(why),
        Err(_) => Some(format!(
            "the database did not answer within {} s",
            within.as_secs()
        )),
    }
}

/// A client connected to the primary outside the pool, for migrations at start.
pub(crate) async fn connect(
    database_url: &str,
) -> Result<tokio_postgres::Client, Box<dyn std::error::Error>> {
    let (client, conn) = Connector::new(database_url)?.connect().await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::warn!(error = %e, "migration connection ended");
        }
    });
    Ok(client)
}

/// A placement that could not be read: no connection, or the look-up failed.
impl From<crate::schema::citus::Unplaced> for DbError {
    fn from(e: crate::schema::citus::Unplaced) -> DbError {
        match e {
            crate::schema::citus::Unplaced::Pool(e) => e.into(),
            crate::schema::citus::Unplaced::Query(e) => e.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::session_settings;

    #[test]
    fn request_connections_start_without_jit_and_the_consumers_with_their_plans() {
        assert_eq!(session_settings(false, false), "SET jit = off");
        assert_eq!(
            session_settings(true, false),
            "SET jit = off; SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off; \
             SET enable_bitmapscan = off"
        );
        assert_eq!(
            session_settings(true, true),
            "SET jit = off; SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off; \
             SET enable_bitmapscan = off; SET plan_cache_mode = force_custom_plan"
        );
        assert_eq!(
            super::function_plans(),
            "SET plan_cache_mode = force_generic_plan SET enable_seqscan = off \
             SET enable_bitmapscan = off"
        );
    }
}

#[cfg(test)]
mod worker_lost_tests {
    use tokio_postgres::error::SqlState;

    #[test]
    fn a_citus_worker_lost_mid_transaction_is_an_outage_and_other_internal_errors_are_not() {
        let lost = "failure on connection marked as essential: 127.0.0.1:5433";
        assert!(super::worker_lost(&SqlState::INTERNAL_ERROR, lost));
        assert!(!super::worker_lost(
            &SqlState::INTERNAL_ERROR,
            "cache lookup failed"
        ));
        assert!(!super::worker_lost(&SqlState::UNIQUE_VIOLATION, lost));
    }
}
