-- Streams: the server side of Queen's streams SDK. Registered queries and the operator state
-- of each (query, source partition), written only by inserts.

-- One row per registration that changed something; the newest row of a name is the query.
-- A registration with the same config hash writes nothing; a reset (the SDK's consent to
-- drop state) registers the name again under a new id, so the old id's state is no longer
-- read by anyone. Never updated.
CREATE TABLE comb.stream_queries (
    id            uuid PRIMARY KEY,
    name          text NOT NULL,
    source_queue  text NOT NULL,
    sink_queue    text,
    config_hash   text NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX stream_queries_name ON comb.stream_queries (name, registered_at DESC);

-- One row per (source partition, query) that has run a cycle: the row a cycle locks
-- (FOR NO KEY UPDATE) so that cycles of one pair run one after another, each reading the
-- state version the one before wrote. Inserted once, never updated.
CREATE TABLE comb.stream_partitions (
    partition_id uuid NOT NULL,
    query_id     uuid NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, query_id)
);
CREATE INDEX stream_partitions_query ON comb.stream_partitions (query_id);

-- The state of a (source partition, query): each cycle that changes it inserts the whole
-- state as a new version, `ver` one above the last; the highest (gen, ver) is the state, read
-- by one descent of the index. `state` maps each key to its value, `updated` each key to the
-- time (ms since the epoch) it was last written; `keys` and `bytes` are its size, for
-- listings. Keyed by partition first, so it can be distributed with the partition. Versions
-- go into the newest cursor state generation (`comb.cursor_gens`) and are reclaimed with it:
-- maintenance carries each current pair's newest version forward and drops the old
-- generation's table whole.
CREATE TABLE comb.stream_states (
    partition_id uuid NOT NULL,
    query_id     uuid NOT NULL,
    gen          integer NOT NULL,
    ver          bigint NOT NULL,
    state        jsonb NOT NULL,
    updated      jsonb NOT NULL,
    keys         integer NOT NULL,
    bytes        integer NOT NULL,
    written_at   timestamptz NOT NULL DEFAULT now()
) PARTITION BY RANGE (gen);
CREATE INDEX stream_states_latest ON comb.stream_states (partition_id, query_id, gen, ver);

-- A table for every generation there is, and the next (maintenance makes later ones ahead).
DO $$
DECLARE
    g integer;
BEGIN
    FOR g IN SELECT gen FROM comb.cursor_gens
             UNION SELECT coalesce(max(gen), 0) + 1 FROM comb.cursor_gens LOOP
        EXECUTE format('CREATE TABLE comb.%I PARTITION OF comb.stream_states FOR VALUES FROM (%s) TO (%s)',
                       'stream_states_' || g, g, g + 1);
    END LOOP;
END $$;

-- The state as rows, one per (query, partition, key), as Queen keeps it: what an operator
-- queries by hand. Reads each pair's newest version.
CREATE VIEW comb.stream_state_now AS
SELECT q.name AS query, p.partition_id, e.key, e.value,
       to_timestamp((s.updated ->> e.key)::double precision / 1000) AS updated_at
FROM comb.stream_partitions p
JOIN comb.stream_queries q ON q.id = p.query_id
CROSS JOIN LATERAL (
    SELECT v.state, v.updated FROM comb.stream_states v
    WHERE v.partition_id = p.partition_id AND v.query_id = p.query_id
    ORDER BY v.gen DESC, v.ver DESC LIMIT 1
) s
CROSS JOIN LATERAL jsonb_each(s.state) e;
