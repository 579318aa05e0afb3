//! The statements of message segments, which `maintenance::segments` runs (when, and under
//! which lock timeout, is its choice): a segment is a leaf table of `comb.messages` (range on
//! `seg`) with its row in `comb.segments`, and once closed a summary per partition in
//! `comb.segment_partitions` (the last position and time it holds).

/// The table of one segment.
pub(crate) fn table(seg: i32) -> String {
    format!("comb.messages_{seg}")
}

/// The newest segment (an SQL expression): the one pushes write into.
macro_rules! newest_segment {
    () => {
        "(SELECT max(seg) FROM comb.segments)"
    };
}
pub(crate) use newest_segment;

/// The newest segment and its age in seconds.
pub(crate) const ACTIVE_SQL: &str =
    "SELECT seg, extract(epoch FROM now() - created_at)::float8 AS age
             FROM comb.segments ORDER BY seg DESC LIMIT 1";

/// Makes segment `next`'s table and attaches it, with `n_distinct` partitions assumed.
/// Built standalone and then attached: ATTACH takes only SHARE UPDATE EXCLUSIVE on the
/// parent, which neither readers nor writers conflict with, where CREATE … PARTITION OF
/// would queue an ACCESS EXCLUSIVE lock in front of all traffic. The CHECK constraint spares
/// ATTACH a validation scan.
pub(crate) fn make_sql(next: i32, n_distinct: u32) -> String {
    let t = table(next);
    let end = next + 1;
    format!(
        "CREATE TABLE {t} (LIKE comb.messages INCLUDING DEFAULTS INCLUDING STORAGE);
         ALTER TABLE {t} ADD PRIMARY KEY (partition_id, pos, seg);
         CREATE INDEX ON {t} (transaction_id, partition_id);
         ALTER TABLE {t} ALTER COLUMN partition_id SET (n_distinct = {n_distinct});
         ALTER TABLE {t} ADD CONSTRAINT messages_{next}_seg CHECK (seg >= {next} AND seg < {end});
         ALTER TABLE comb.messages ATTACH PARTITION {t} FOR VALUES FROM ({next}) TO ({end});"
    )
}

/// Closes segment `$1` and sends pushes to segment `$2` (its table made ahead).
pub(crate) const ROLL_OVER_SQL: &str =
    "WITH closed AS (UPDATE comb.segments SET closed_at = now() WHERE seg = $1)
             INSERT INTO comb.segments (seg) VALUES ($2) ON CONFLICT DO NOTHING";

/// Segments closed more than `$1` seconds ago and not summarised yet, oldest first.
pub(crate) const DUE_SQL: &str = "SELECT seg FROM comb.segments
             WHERE NOT summarized AND closed_at < now() - make_interval(secs => $1)
             ORDER BY seg";

/// Summarises segment `seg`: SHARE waits for any push still inserting into it and lets
/// readers be.
pub(crate) fn summarize_sql(seg: i32) -> String {
    format!(
        "LOCK TABLE {t} IN SHARE MODE;
             INSERT INTO comb.segment_partitions (seg, partition_id, max_pos, max_created_at)
             SELECT {seg}, partition_id, max(pos), max(created_at) FROM {t} GROUP BY partition_id
             ON CONFLICT DO NOTHING;
             UPDATE comb.segments SET summarized = true WHERE seg = {seg};",
        t = table(seg),
    )
}

/// Segments every queue with messages in them has let go of: closed and summarised, not the
/// newest, and for every partition with messages in them, its queue was deleted, or the
/// queue's retention has passed its newest message there, or its completed retention has
/// and every consumer group is past it.
///
/// The test of a segment is written once ([`held_by`]) and asked two ways: per segment on
/// PostgreSQL, as the set of held segments on Citus (`citus`), which refuses a subquery
/// correlated with a reference table (`comb.segments`): the held segments first (a query of
/// the workers, every subquery correlated by partition), then the segments not among them.
///
/// What holds a segment is asked of the owners of the other tables, whose fragments the
/// caller passes: `partition` joins `sp.partition_id` to its partition and its queue `q`
/// (`comb.partitions`, `comb.queues`), `passed` says whether every consumer group is past
/// `sp.max_pos` there (the cursors).
pub(crate) fn reclaimable_sql(citus: bool, partition: &str, passed: &str) -> String {
    if citus {
        format!(
            "WITH held AS (SELECT DISTINCT sp.seg {held})
         SELECT s.seg FROM comb.segments s
         WHERE s.summarized
           AND s.seg < (SELECT max(seg) FROM comb.segments)
           AND s.seg NOT IN (SELECT seg FROM held)
         ORDER BY s.seg",
            held = held_by(partition, passed)
        )
    } else {
        format!(
            "SELECT s.seg FROM comb.segments s
         WHERE s.summarized
           AND s.seg < (SELECT max(seg) FROM comb.segments)
           AND NOT EXISTS (SELECT 1 {held} AND sp.seg = s.seg)
         ORDER BY s.seg",
            held = held_by(partition, passed)
        )
    }
}

/// The rows of `comb.segment_partitions` (`sp`) whose partition still needs its segment (on
/// Citus, in the form Citus runs on its workers: `passed` is written for it).
fn held_by(partition: &str, passed: &str) -> String {
    format!(
        "
      FROM comb.segment_partitions sp
      {partition}
      CROSS JOIN LATERAL (
          SELECT {retention} AS retention,
                 {completed} AS completed
      ) o
      WHERE NOT (
            (o.retention > 0
             AND sp.max_created_at < now() - make_interval(secs => o.retention))
            OR (o.completed > 0
             AND sp.max_created_at < now() - make_interval(secs => o.completed)
             AND {passed})
        )",
        retention = crate::queue::retention_secs!("q.options"),
        completed = crate::queue::completed_retention_secs!("q.options"),
    )
}

/// Summaries of dropped segments that no longer tell anything. Once its messages are gone,
/// the newest summary of a partition is where its head is read from
/// (`comb.partition_head`), so it stays until a newer segment's summary supersedes it or the
/// partition is deleted. Summaries of segments that still exist are what the drop decision
/// reads, and stay with them. Whether the partition `sp.partition_id` still exists is the
/// catalog's fragment, `partition_exists`, which the caller passes.
///
/// Drops segment `seg` whole and forgets it, with the summaries that no longer tell anything.
pub(crate) fn drop_sql(seg: i32, partition_exists: &str) -> String {
    format!(
        "DROP TABLE IF EXISTS {t};
             DELETE FROM comb.segments WHERE seg = {seg};
             DELETE FROM comb.segment_partitions sp
             WHERE sp.seg <> ALL (ARRAY(SELECT seg FROM comb.segments))
               AND (EXISTS (SELECT 1 FROM comb.segment_partitions n
                            WHERE n.partition_id = sp.partition_id AND n.seg > sp.seg)
                    OR NOT {partition_exists});",
        t = table(seg)
    )
}
