//! Reads and changes of the catalog for the administration: ids by name without the cache
//! (an operator's request must see a queue another server just deleted as gone), and the
//! subscription rows a group's deletion or new start point changes. Each takes the caller's
//! client or transaction, so the administration composes them into its own transactions.

use chrono::{DateTime, Utc};
use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::db::DbError;

/// The id of the queue named `queue`, if it exists.
pub(crate) async fn queue_id(
    client: &impl GenericClient,
    queue: &str,
) -> Result<Option<Uuid>, DbError> {
    Ok(client
        .query_opt("SELECT id FROM comb.queues WHERE name = $1", &[&queue])
        .await?
        .map(|r| r.get("id")))
}

/// The id of the partition named `partition` of the queue `queue_id`, if it exists.
pub(crate) async fn partition_id(
    client: &impl GenericClient,
    queue_id: Uuid,
    partition: &str,
) -> Result<Option<Uuid>, DbError> {
    Ok(client
        .query_opt(
            "SELECT id FROM comb.partitions WHERE queue_id = $1 AND name = $2",
            &[&queue_id, &partition],
        )
        .await?
        .map(|r| r.get("id")))
}

/// Whether any group reads the queue.
pub(crate) async fn is_subscribed(
    client: &impl GenericClient,
    queue_id: Uuid,
) -> Result<bool, DbError> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM comb.subscriptions WHERE queue_id = $1) AS subscribed",
            &[&queue_id],
        )
        .await?
        .get("subscribed"))
}

/// How a group subscribed to a queue.
#[derive(Debug, Clone)]
pub(crate) struct Subscription {
    /// `all`, `new` or `from`.
    pub mode: String,
    /// With `from`: the time it reads from.
    pub start_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

/// The group's subscription to the queue, locked until the transaction ends, if it has one.
pub(crate) async fn lock_subscription(
    client: &impl GenericClient,
    queue_id: Uuid,
    group: &str,
) -> Result<Option<Subscription>, DbError> {
    Ok(client
        .query_opt(
            "SELECT mode, start_at, created_at FROM comb.subscriptions
             WHERE queue_id = $1 AND consumer_group = $2 FOR UPDATE",
            &[&queue_id, &group],
        )
        .await?
        .map(|r| Subscription {
            mode: r.get("mode"),
            start_at: r.get("start_at"),
            created_at: r.get("created_at"),
        }))
}

/// Deletes the group's subscription to the queue (its cursors go through `cursor`).
pub(crate) async fn delete_subscription(
    client: &impl GenericClient,
    queue_id: Uuid,
    group: &str,
) -> Result<(), DbError> {
    client
        .execute(
            "DELETE FROM comb.subscriptions WHERE queue_id = $1 AND consumer_group = $2",
            &[&queue_id, &group],
        )
        .await?;
    Ok(())
}

/// Records that the group reads every queue it is subscribed to from `at`; answers those
/// queues' ids (none when the group reads no queue).
pub(crate) async fn subscribe_from(
    client: &impl GenericClient,
    group: &str,
    at: DateTime<Utc>,
) -> Result<Vec<Uuid>, DbError> {
    Ok(client
        .query(
            "UPDATE comb.subscriptions SET mode = 'from', start_at = $2
             WHERE consumer_group = $1 RETURNING queue_id",
            &[&group, &at],
        )
        .await?
        .iter()
        .map(|r| r.get("queue_id"))
        .collect())
}
