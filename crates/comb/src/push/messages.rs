//! What a queue holds pending, which `maxSize` limits: its partitions' heads (from message
//! storage, `crate::messages`) less its slowest group's positions.

use deadpool_postgres::Pool;
use uuid::Uuid;

use crate::backend::{Backend, Forms};
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

/// [`PENDING_SQL`] on Citus, which refuses it: there each function call over the partitions
/// would run on a worker beside the partition's rows, and the function's own query would be a
/// distributed query from a shard. The queue's partitions and its cursors are read first
/// (`MATERIALIZED`: one read over the shards each, kept on the coordinator as intermediate
/// results), then each partition's head and each cursor's latest state are read by their
/// functions on the coordinator, each a router query on the partition's worker: about a round
/// trip per partition and per cursor. A cursor without state counts as in [`PENDING_SQL`]:
/// not at all.
const PENDING_CITUS_SQL: &str = concat!(
    "WITH k AS MATERIALIZED (SELECT p.id FROM ",
    crate::catalog::partitions_of!("$1"),
    "),
     g AS MATERIALIZED (",
    crate::cursor::cursors_of_queue!("$1"),
    ")
SELECT coalesce(sum(h.pos - coalesce(sl.slowest, 0)), 0)::bigint AS pending
FROM k CROSS JOIN LATERAL ",
    crate::messages::head_of!("k.id"),
    " h
LEFT JOIN (SELECT g.partition_id, min(s.cursor_pos) AS slowest
           FROM g CROSS JOIN LATERAL ",
    crate::cursor::state_of!("g.partition_id", "g.consumer_group"),
    " s
           GROUP BY g.partition_id) sl ON sl.partition_id = k.id"
);

/// The pending count in the form each storage runs.
const PENDING: Forms = Forms {
    postgres: PENDING_SQL,
    citus: PENDING_CITUS_SQL,
};

/// Messages of a queue not yet passed by its slowest consumer group.
pub(crate) async fn pending(pool: &Pool, backend: Backend, queue_id: Uuid) -> Result<u64, DbError> {
    let sql = backend.sql(&PENDING);
    let client = pool.get().await?;
    let row = client.query_one(sql, &[&queue_id]).await?;
    Ok(row.get::<_, i64>("pending").max(0) as u64)
}
