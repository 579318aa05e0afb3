//! Message storage: the tables `comb.messages` (a leaf table per segment), `comb.segments`
//! and `comb.segment_partitions`, and the function `comb.partition_head`.
//!
//! Its fragments serve the statements of other modules that read messages beside their own
//! tables in one round trip: acks reading what a lease handed out, dead letters copying
//! messages, maintenance finding overdue ones, a subscription or a seek starting at the head
//! or at a time. Every fragment reads one partition's messages, so each statement that uses
//! one stays on that partition (and, on Citus, on its worker). [`segments`] holds the
//! statements maintenance runs on segments, [`listing`] the administration's reads.
//!
//! It sits in the foundation, below every module that reads messages (the catalog too).

pub(crate) mod insert;
pub(crate) mod listing;
pub(crate) mod segments;

/// The messages `m` of partition `$p` (an SQL expression), for a `FROM`: conditions on `m`
/// follow with `AND`. Reads go by the primary key (partition, position, segment) or the
/// (transaction id, partition) index.
macro_rules! partition_messages {
    ($p:literal) => {
        concat!("comb.messages m WHERE m.partition_id = ", $p)
    };
}
pub(crate) use partition_messages;

/// The messages' table, for statements that must name one of its shards.
pub(crate) const MESSAGES: &str = "comb.messages";

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
            crate::messages::partition_messages!($p),
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

/// The newest position stored in partition `$p` (0 if it never held a message), as an SQL
/// expression for the push statements. It is what `comb.partition_head` answers, written out:
/// a message in a segment not yet summarised is always newer than any summary, so the summary
/// is read only when those segments hold none. Inline, each lookup is one index descent per
/// live segment (about 2 µs); through the function, whose union and sort are planned per call,
/// it cost 21 µs. The segment made ahead of the roll-over holds no message yet (pushes write
/// into the newest segment in `comb.segments`, and the snapshot that reads the head sees that
/// segment's row), so it is pruned from the descent.
macro_rules! head_pos {
    ($p:literal) => {
        $crate::messages::head_pos!($p, among "", "")
    };
    // With `among`, each table's reads also name the partitions `$ids` (an SQL array) in so
    // many words: Citus then reads only their shards.
    ($p:literal, among $ids:literal) => {
        $crate::messages::head_pos!(
            $p,
            among concat!(" AND m.partition_id = ANY(", $ids, ")"),
            concat!(" AND sp.partition_id = ANY(", $ids, ")")
        )
    };
    ($p:literal, among $in_messages:expr, $in_summaries:expr) => {
        concat!(
            "coalesce((SELECT m.pos FROM comb.messages m WHERE m.partition_id = ",
            $p,
            $in_messages,
            " AND m.seg >= (SELECT min(s.seg) FROM comb.segments s WHERE NOT s.summarized)",
            " AND m.seg <= (SELECT max(s.seg) FROM comb.segments s)",
            " ORDER BY m.pos DESC LIMIT 1), (SELECT sp.max_pos FROM comb.segment_partitions sp",
            " WHERE sp.partition_id = ",
            $p,
            $in_summaries,
            " ORDER BY sp.seg DESC LIMIT 1), 0)"
        )
    };
}
pub(crate) use head_pos;

/// The position of the newest message of partition `$p` stored before time `$t` (SQL
/// expressions), 0 if none: where a reader starting at `$t` stands. A walk of the partition's
/// positions from the newest, by the primary key.
macro_rules! position_before {
    ($p:literal, $t:literal) => {
        concat!(
            "coalesce((SELECT m.pos FROM comb.messages m WHERE m.partition_id = ",
            $p,
            " AND m.created_at < ",
            $t,
            " ORDER BY m.pos DESC LIMIT 1), 0)"
        )
    };
}
pub(crate) use position_before;

/// `INSERT INTO comb.messages (…)`, for statements that store messages beside their own
/// tables (a requeued dead letter); the `SELECT` that follows gives, in this order: partition,
/// position, segment, message id, transaction id, trace id, payload, time, producer's subject.
macro_rules! insert_messages {
    () => {
        "INSERT INTO comb.messages
        (partition_id, pos, seg, message_id, transaction_id, trace_id, payload, created_at,
         producer_sub)"
    };
}
pub(crate) use insert_messages;

#[cfg(test)]
mod tests {
    /// The head written inline for the push statements answers what `comb.partition_head`
    /// answers: from live messages, from a closed segment's summary, and 0 for a partition
    /// that never held a message.
    #[tokio::test]
    async fn the_inline_head_is_the_functions() {
        let url = tokio::task::spawn_blocking(|| {
            comb_harness::Postgres::shared()
                .create_database("heads")
                .unwrap()
        })
        .await
        .unwrap();
        let (mut client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        crate::schema::migrate(&mut client).await.unwrap();
        client
            .batch_execute(
                "-- Four partitions by name: messages and summaries need no catalog rows.
                 CREATE TEMP TABLE p (name text, id uuid);
                 INSERT INTO p SELECT n, gen_random_uuid()
                 FROM unnest('{live,summary,both,empty}'::text[]) n;
                 -- Segment 1 is closed and summarised; segment 2 is written now.
                 UPDATE comb.segments SET summarized = true WHERE seg = 1;
                 INSERT INTO comb.segments (seg) VALUES (2);
                 CREATE TABLE comb.messages_2 PARTITION OF comb.messages FOR VALUES FROM (2) TO (3);
                 INSERT INTO comb.segment_partitions (seg, partition_id, max_pos, max_created_at)
                 SELECT 1, id, 7, now() FROM p WHERE name IN ('summary', 'both');
                 INSERT INTO comb.messages
                     (partition_id, pos, seg, message_id, transaction_id, payload, created_at)
                 SELECT p.id, x, 2, gen_random_uuid(), x::text, '1'::bytea, now()
                 FROM p, generate_series(1, 3) x WHERE p.name = 'live'
                 UNION ALL
                 SELECT p.id, x, 2, gen_random_uuid(), x::text, '1'::bytea, now()
                 FROM p, generate_series(8, 9) x WHERE p.name = 'both';",
            )
            .await
            .unwrap();
        let sql = concat!(
            "SELECT p.name, ",
            head_pos!("p.id"),
            " AS inline, (SELECT h.pos FROM comb.partition_head(p.id) h) AS function
             FROM p ORDER BY p.name"
        );
        let rows = client.query(sql, &[]).await.unwrap();
        let heads: Vec<(String, i64, i64)> = rows
            .iter()
            .map(|r| (r.get("name"), r.get("inline"), r.get("function")))
            .collect();
        assert_eq!(
            heads,
            vec![
                ("both".to_string(), 9, 9),
                ("empty".to_string(), 0, 0),
                ("live".to_string(), 3, 3),
                ("summary".to_string(), 7, 7),
            ]
        );
    }
}
