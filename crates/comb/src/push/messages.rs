//! What a queue holds pending, which `maxSize` limits: its partitions' heads (from message
//! storage, `crate::messages`) less its slowest group's positions.

use deadpool_postgres::Pool;
use uuid::Uuid;

use crate::db::DbError;

/// Messages of queue `$1` not yet passed by its slowest consumer group (all retained messages
/// while no group reads it): what `maxSize` limits.
const PENDING_SQL: &str = concat!(
    "SELECT coalesce(sum((SELECT h.pos FROM ",
    crate::messages::head_of!("p.id"),
    " h) - coalesce(",
    crate::cursor::slowest_position!("p.id"),
    ", 0)), 0)::bigint AS pending
FROM ",
    crate::catalog::partitions_of!("$1")
);

/// Messages of a queue not yet passed by its slowest consumer group.
pub(crate) async fn pending(pool: &Pool, queue_id: Uuid) -> Result<u64, DbError> {
    let client = pool.get().await?;
    let row = client.query_one(PENDING_SQL, &[&queue_id]).await?;
    Ok(row.get::<_, i64>("pending").max(0) as u64)
}
