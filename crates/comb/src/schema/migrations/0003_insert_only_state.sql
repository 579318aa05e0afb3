-- Comb schema, version 3: hot state written by inserts only.
--
-- While any snapshot is held open, every UPDATE leaves a row version vacuum cannot remove, and
-- readers walk those versions. Version 3 takes the last in-place updates off the data path:
--
-- * A partition's head is no longer a counter moved by every push. It is the newest position
--   in message storage: in the segments not yet summarised, else in the newest summary
--   (comb.partition_head). Pushes still lock the partition row, only to order themselves.
-- * A cursor's state is a series of versions in comb.cursor_states, one row per change, in
--   tables per generation. Whoever writes a version first locks the cursor's row in
--   comb.cursors, so versions of one cursor are written one at a time, each from the one
--   before. Maintenance carries every cursor's latest version forward into the newest
--   generation and drops older generations whole.

-- Heads --------------------------------------------------------------------------------------

CREATE INDEX segment_partitions_partition ON comb.segment_partitions (partition_id, seg);

-- Heads that messages no longer show (their segments were dropped before this version kept
-- summaries): seg 0 is never a segment, so these rows are never reclaimed with one.
INSERT INTO comb.segment_partitions (seg, partition_id, max_pos, max_created_at)
SELECT 0, id, head_pos, coalesce(last_push_at, created_at)
FROM comb.partitions WHERE head_pos > 0;

-- The newest position of a partition and when it was pushed (0 and NULL when it never held a
-- message). Segments not yet summarised are searched; summarised ones are read from their
-- summary, which outlives the segment's table.
CREATE FUNCTION comb.partition_head(p uuid)
RETURNS TABLE (pos bigint, at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT h.pos, h.at FROM (
        (SELECT m.pos, m.created_at AS at FROM comb.messages m
         WHERE m.partition_id = p
           AND m.seg >= (SELECT min(s.seg) FROM comb.segments s WHERE NOT s.summarized)
         ORDER BY m.pos DESC LIMIT 1)
        UNION ALL
        (SELECT sp.max_pos, sp.max_created_at FROM comb.segment_partitions sp
         WHERE sp.partition_id = p ORDER BY sp.seg DESC LIMIT 1)
        UNION ALL
        SELECT 0::bigint, NULL::timestamptz
    ) h
    ORDER BY h.pos DESC LIMIT 1
$$;

ALTER TABLE comb.partitions DROP COLUMN head_pos, DROP COLUMN last_push_at;
ALTER TABLE comb.partitions SET (fillfactor = 100);

-- Cursors ------------------------------------------------------------------------------------

-- Generations of cursor state; writers write into the newest.
CREATE TABLE comb.cursor_gens (
    gen        integer PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE comb.cursor_states (
    partition_id     uuid NOT NULL,
    consumer_group   text NOT NULL,
    gen              integer NOT NULL,
    -- One more than the version it was written from; the highest is the cursor's state.
    -- A version carried forward by maintenance keeps its number.
    ver              bigint NOT NULL,
    -- Every message at or below cursor_pos is settled for this group.
    cursor_pos       bigint NOT NULL DEFAULT 0,
    -- A lower bound of the segment of the message after cursor_pos (prunes old segments).
    cursor_seg       integer NOT NULL DEFAULT 0,
    -- Settled positions above cursor_pos (acks that arrived out of order, dead-lettered messages).
    settled          bigint[] NOT NULL DEFAULT '{}',
    -- Delivery attempts of unsettled messages above cursor_pos: attempt_pos[i] failed attempt_cnt[i] times.
    attempt_pos      bigint[] NOT NULL DEFAULT '{}',
    attempt_cnt      integer[] NOT NULL DEFAULT '{}',
    lease_id         uuid,
    lease_expires_at timestamptz,
    -- Last position handed out under the most recent lease (kept after the lease ends).
    lease_upto       bigint NOT NULL DEFAULT 0,
    -- Not handed out before this moment (retryDelay after a failure).
    available_at     timestamptz NOT NULL DEFAULT '-infinity',
    last_claimed_at  timestamptz NOT NULL DEFAULT '-infinity'
) PARTITION BY RANGE (gen);

CREATE INDEX cursor_states_latest ON comb.cursor_states (partition_id, consumer_group, ver);
CREATE INDEX cursor_states_lease ON comb.cursor_states (lease_id) WHERE lease_id IS NOT NULL;

CREATE TABLE comb.cursor_states_1 PARTITION OF comb.cursor_states FOR VALUES FROM (1) TO (2);
INSERT INTO comb.cursor_gens (gen) VALUES (1);

INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at)
SELECT partition_id, consumer_group, 1, 1, cursor_pos, cursor_seg, settled, attempt_pos,
       attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at
FROM comb.cursors;

-- What is left of a cursor row: its identity, and the lock its writers take.
ALTER TABLE comb.cursors
    DROP COLUMN cursor_pos, DROP COLUMN cursor_seg, DROP COLUMN settled,
    DROP COLUMN attempt_pos, DROP COLUMN attempt_cnt, DROP COLUMN lease_id,
    DROP COLUMN lease_expires_at, DROP COLUMN lease_upto, DROP COLUMN available_at,
    DROP COLUMN last_claimed_at;
ALTER TABLE comb.cursors SET (fillfactor = 100);
-- Claims walk a group's cursors of a queue in partition order, from where the last claim
-- stopped (round robin).
DROP INDEX comb.cursors_queue_group;
CREATE INDEX cursors_walk ON comb.cursors (queue_id, consumer_group, partition_id);

-- The latest version of a cursor's state.
CREATE FUNCTION comb.cursor_state(p uuid, g text)
RETURNS SETOF comb.cursor_states
LANGUAGE sql STABLE AS $$
    SELECT * FROM comb.cursor_states s
    WHERE s.partition_id = p AND s.consumer_group = g
    ORDER BY s.ver DESC LIMIT 1
$$;

-- Every cursor as it stands now (for operators and tests; the data path reads versions
-- directly).
CREATE VIEW comb.cursors_now AS
SELECT c.queue_id, s.*
FROM comb.cursors c
CROSS JOIN LATERAL comb.cursor_state(c.partition_id, c.consumer_group) s;

-- What maintenance did with cursor generations.
ALTER TABLE comb.maintenance_runs
    ADD COLUMN generations_created integer NOT NULL DEFAULT 0,
    ADD COLUMN generations_dropped integer NOT NULL DEFAULT 0,
    ADD COLUMN states_carried      bigint NOT NULL DEFAULT 0;
