//! Fragments of message storage (`comb.messages`, `comb.partition_head`) for the statements of
//! other modules that read messages beside their own tables in one round trip: acks reading
//! what a lease handed out, dead letters copying messages, maintenance finding overdue ones.
//! Every fragment reads one partition's messages, so each statement that uses one stays on
//! that partition (and, on Citus, on its worker).

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

/// The head of partition `$p` (an SQL expression): a call of `comb.partition_head`, one row
/// of the newest position stored (`pos`, 0 if it never held a message) and its time (`at`).
macro_rules! head_of {
    ($p:literal) => {
        concat!("comb.partition_head(", $p, ")")
    };
}
pub(crate) use head_of;
