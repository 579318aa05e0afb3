//! The generations of stream state versions (`comb.stream_states`, a pair's versions, and
//! `comb.stream_state_keys`, the keys each changed; both range-partitioned by the cursor
//! state's generation): the statements maintenance's generation step runs beside the cursor
//! state's, kept here with the tables they touch.

/// The table of one generation.
pub(crate) fn table(generation: i32) -> String {
    format!("comb.stream_states_{generation}")
}

/// The keys' table of one generation.
fn keys_table(generation: i32) -> String {
    format!("comb.stream_state_keys_{generation}")
}

/// The generations whose table exists, oldest first.
pub(crate) const LIST_SQL: &str =
    "SELECT substr(c.relname, length('stream_states_') + 1)::integer AS gen
             FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'comb.stream_states'::regclass
             ORDER BY 1";

/// Makes the tables of generation `next` standalone and attaches them, in one transaction
/// under the lock timeout `lt` (the keys' first: the pair's table is what says the
/// generation is ready).
pub(crate) fn make_ahead_sql(next: i32, lt: &str) -> String {
    let s = table(next);
    let k = keys_table(next);
    format!(
        "BEGIN; {lt};
         CREATE TABLE {k} (LIKE comb.stream_state_keys INCLUDING DEFAULTS INCLUDING STORAGE);
         CREATE INDEX ON {k} (partition_id, query_id, key, gen DESC, ver DESC);
         ALTER TABLE {k} ADD CONSTRAINT stream_state_keys_{next}_gen
             CHECK (gen >= {next} AND gen < {end});
         ALTER TABLE comb.stream_state_keys ATTACH PARTITION {k}
             FOR VALUES FROM ({next}) TO ({end});
         CREATE TABLE {s} (LIKE comb.stream_states INCLUDING DEFAULTS INCLUDING STORAGE);
         CREATE INDEX ON {s} (partition_id, query_id, gen, ver);
         ALTER TABLE {s} ADD CONSTRAINT stream_states_{next}_gen
             CHECK (gen >= {next} AND gen < {end});
         ALTER TABLE comb.stream_states ATTACH PARTITION {s} FOR VALUES FROM ({next}) TO ({end});
         COMMIT;",
        end = next + 1
    )
}

/// Copies the newest version of every current query's pair still living in `generation` into
/// the newest generation, unless a newer version exists there, and so the newest version of
/// each of its keys that is not deleted; then drops the old tables whole: one transaction
/// under the lock timeout `lt`.
pub(crate) fn carry_forward_sql(generation: i32, newest: i32, lt: &str) -> String {
    let t = table(generation);
    format!(
        "BEGIN; {lt}; LOCK TABLE {t} IN SHARE MODE;
         INSERT INTO {into} (partition_id, query_id, gen, ver, state, updated, keys, bytes,
                             written_at)
         SELECT s.partition_id, s.query_id, {newest}, s.ver, s.state, s.updated, s.keys,
                s.bytes, s.written_at
         FROM comb.stream_partitions sp
         JOIN comb.stream_queries q ON q.id = sp.query_id
         CROSS JOIN LATERAL (
             SELECT * FROM {t} s
             WHERE s.partition_id = sp.partition_id AND s.query_id = sp.query_id
             ORDER BY s.gen DESC, s.ver DESC LIMIT 1
         ) s
         WHERE q.id = (SELECT n.id FROM comb.stream_queries n WHERE n.name = q.name
                       ORDER BY n.registered_at DESC LIMIT 1)
           AND {exists}
           AND NOT EXISTS (
             SELECT 1 FROM comb.stream_states n
             WHERE n.gen >= {newer}
               AND n.partition_id = s.partition_id
               AND n.query_id = s.query_id
               AND n.ver >= s.ver);
         LOCK TABLE {kt} IN SHARE MODE;
         INSERT INTO {kinto} (partition_id, query_id, gen, key, ver, value, bytes, written_at)
         SELECT k.partition_id, k.query_id, {newest}, k.key, k.ver, k.value, k.bytes,
                k.written_at
         FROM (
             SELECT DISTINCT ON (s.partition_id, s.query_id, s.key) s.*
             FROM {kt} s
             JOIN comb.stream_partitions sp
               ON sp.partition_id = s.partition_id AND sp.query_id = s.query_id
             JOIN comb.stream_queries q ON q.id = sp.query_id
             WHERE q.id = (SELECT n.id FROM comb.stream_queries n WHERE n.name = q.name
                           ORDER BY n.registered_at DESC LIMIT 1)
               AND {exists}
             ORDER BY s.partition_id, s.query_id, s.key, s.gen DESC, s.ver DESC
         ) k
         WHERE k.value IS NOT NULL
           AND NOT EXISTS (
             SELECT 1 FROM comb.stream_state_keys n
             WHERE n.gen >= {newer}
               AND n.partition_id = k.partition_id
               AND n.query_id = k.query_id
               AND n.key = k.key
               AND n.ver >= k.ver);
         DROP TABLE {kt};
         DROP TABLE {t};
         COMMIT;",
        kt = keys_table(generation),
        kinto = keys_table(newest),
        into = table(newest),
        exists = crate::catalog::partition_exists!("sp.partition_id"),
        newer = generation + 1,
    )
}
