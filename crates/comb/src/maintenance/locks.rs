//! How maintenance asks for locks: with a short `lock_timeout`, giving way to traffic and
//! trying again next cycle rather than queueing readers and writers behind it.

use deadpool_postgres::Client;

use super::Settings;
use crate::db::DbError;

pub(super) fn lock_timeout_sql(settings: &Settings) -> String {
    format!(
        "SET LOCAL lock_timeout = '{}ms'",
        settings.lock_timeout.as_millis().max(1)
    )
}

/// Is this error a lock wait that timed out (to be retried next cycle)?
fn is_lock_timeout(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE)
}

/// Runs a transaction script whose locks are asked for with the lock timeout. `Ok(false)`
/// when a lock could not be had in time: it rolled back and is tried again next cycle.
pub(super) async fn give_way(client: &Client, script: &str) -> Result<bool, DbError> {
    Ok(give_way_counting(client, script).await?.is_some())
}

/// [`give_way`] for scripts whose row counts matter: one count per statement, in script
/// order (0 for statements that touch no rows, such as `BEGIN` or `LOCK`). `None` when a lock
/// could not be had in time.
pub(super) async fn give_way_counting(
    client: &Client,
    script: &str,
) -> Result<Option<Vec<u64>>, DbError> {
    match run_each(client, script).await {
        Ok(counts) => Ok(Some(counts)),
        Err(e) => {
            crate::db::roll_back(client).await;
            if is_lock_timeout(&e) {
                Ok(None)
            } else {
                Err(e.into())
            }
        }
    }
}

/// Sends the script's statements one at a time (in its one transaction): Citus propagates
/// DDL on distributed tables (ATTACH, DROP of a segment) by sending the statement's text to
/// the workers, and refuses a text holding several commands ("cannot insert multiple commands
/// into a prepared statement"). The scripts are the maintenance's own, with no `;` inside a
/// statement.
async fn run_each(client: &Client, script: &str) -> Result<Vec<u64>, tokio_postgres::Error> {
    let mut counts = Vec::new();
    for statement in script.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        for m in client.simple_query(statement).await? {
            if let tokio_postgres::SimpleQueryMessage::CommandComplete(n) = m {
                counts.push(n);
            }
        }
    }
    Ok(counts)
}
