//! Fragments of message storage (`comb.messages`, `comb.partition_head`) for the statements of
//! other modules that read messages beside their own tables in one round trip: acks reading
//! what a lease handed out, dead letters copying messages, maintenance finding overdue ones.
//! Every fragment reads one partition's messages, so each statement that uses one stays on
//! that partition (and, on Citus, on its worker). Here too, what a queue holds pending.

use deadpool_postgres::Pool;
use uuid::Uuid;

use crate::db::DbError;

/// Messages of queue `$1` not yet passed by its slowest consumer group (all retained messages
/// while no group reads it): what `maxSize` limits.
const PENDING_SQL: &str = concat!(
    "SELECT coalesce(sum((SELECT h.pos FROM comb.partition_head(p.id) h) - coalesce(",
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

/// The messages `m` of partition `$p` (an SQL expression), for a `FROM`: conditions on `m`
/// follow with `AND`. Reads go by the primary key (partition, position, segment) or the
/// (transaction id, partition) index.
macro_rules! partition_messages {
    ($p:literal) => {
        concat!("comb.messages m WHERE m.partition_id = ", $p)
    };
}
pub(crate) use partition_messages;

/// Joins the message `m` at position `$pos` of partition `$p` (SQL expressions).
macro_rules! join_message {
    ($p:literal, $pos:literal) => {
        concat!(
            "JOIN comb.messages m ON m.partition_id = ",
            $p,
            " AND m.pos = ",
            $pos
        )
    };
}
pub(crate) use join_message;

/// The time of the head of partition `$p` (an SQL expression) as a scalar subquery: the body
/// of `comb.partition_head` written out, for statements run on a Citus worker, where the
/// function's own queries would be distributed queries from a shard (which Citus refuses).
/// The newest message still held unsummarised, or else the last segment summary of the
/// partition; NULL for a partition that never held a message.
macro_rules! head_at_written_out {
    ($p:literal) => {
        concat!(
            "(SELECT h.at FROM (
              (SELECT m.pos, m.created_at AS at FROM ",
            crate::push::partition_messages!($p),
            "
                 AND m.seg >= (SELECT min(s.seg) FROM comb.segments s WHERE NOT s.summarized)
               ORDER BY m.pos DESC LIMIT 1)
              UNION ALL
              (SELECT sp.max_pos, sp.max_created_at FROM comb.segment_partitions sp
               WHERE sp.partition_id = ",
            $p,
            " ORDER BY sp.seg DESC LIMIT 1)) h
          ORDER BY h.pos DESC LIMIT 1)"
        )
    };
}
pub(crate) use head_at_written_out;

/// The head of partition `$p` (an SQL expression): a call of `comb.partition_head`, one row
/// of the newest position stored (`pos`, 0 if it never held a message) and its time (`at`).
macro_rules! head_of {
    ($p:literal) => {
        concat!("comb.partition_head(", $p, ")")
    };
}
pub(crate) use head_of;
