-- Streams' state by key: a cycle writes only the keys it changes, each as a new version of
-- that key, instead of the pair's whole state again.

-- One row per change of one key of a (source partition, query) pair: `ver` is the pair's
-- version the change made (`comb.stream_states`), `value` the key's new value, NULL for a
-- delete (a JSON null is a value). The highest (gen, ver) of a key is its value now, read by
-- one descent of the index. Insert-only, in the cursor state generations like the pair's
-- versions: maintenance carries each current key's newest version forward (deleted keys are
-- left behind) and drops the old generation's table whole.
CREATE TABLE comb.stream_state_keys (
    partition_id uuid NOT NULL,
    query_id     uuid NOT NULL,
    gen          integer NOT NULL,
    key          text NOT NULL,
    ver          bigint NOT NULL,
    value        jsonb,
    bytes        integer NOT NULL,
    written_at   timestamptz NOT NULL DEFAULT now()
) PARTITION BY RANGE (gen);
CREATE INDEX stream_state_keys_latest
    ON comb.stream_state_keys (partition_id, query_id, key, gen DESC, ver DESC);

-- A table for every generation `comb.stream_states` has one for.
DO $$
DECLARE
    g integer;
BEGIN
    FOR g IN SELECT substr(c.relname, length('stream_states_') + 1)::integer
             FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'comb.stream_states'::regclass LOOP
        EXECUTE format('CREATE TABLE comb.%I PARTITION OF comb.stream_state_keys FOR VALUES FROM (%s) TO (%s)',
                       'stream_state_keys_' || g, g, g + 1);
    END LOOP;
END $$;

-- The state there is: each pair's newest whole version, a row per key.
INSERT INTO comb.stream_state_keys (partition_id, query_id, gen, key, ver, value, bytes, written_at)
SELECT s.partition_id, s.query_id, s.gen, e.key, s.ver, e.value,
       octet_length(to_jsonb(e.key)::text) + octet_length(e.value::text) + 2,
       coalesce(to_timestamp((s.updated ->> e.key)::double precision / 1000), s.written_at)
FROM comb.stream_partitions p
CROSS JOIN LATERAL (
    SELECT v.* FROM comb.stream_states v
    WHERE v.partition_id = p.partition_id AND v.query_id = p.query_id
    ORDER BY v.gen DESC, v.ver DESC LIMIT 1
) s
CROSS JOIN LATERAL jsonb_each(s.state) e;

-- A pair's version row now holds only its size: the keys hold the state.
ALTER TABLE comb.stream_states ALTER COLUMN state DROP NOT NULL,
                               ALTER COLUMN updated DROP NOT NULL;

-- The state as rows, one per (query, partition, key), as Queen keeps it.
CREATE OR REPLACE VIEW comb.stream_state_now AS
SELECT q.name AS query, p.partition_id, k.key, k.value, k.written_at AS updated_at
FROM comb.stream_partitions p
JOIN comb.stream_queries q ON q.id = p.query_id
CROSS JOIN LATERAL (
    SELECT DISTINCT ON (s.key) s.key, s.value, s.written_at
    FROM comb.stream_state_keys s
    WHERE s.partition_id = p.partition_id AND s.query_id = p.query_id
    ORDER BY s.key, s.gen DESC, s.ver DESC
) k
WHERE k.value IS NOT NULL;
