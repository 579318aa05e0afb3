-- Comb schema, version 9: administration.
--
-- What operators read (depth, lag, oldest pending message) is computed from heads and cursor
-- states by index probes per partition and cursor, never by reading message storage. What
-- operators change is written the way the data path writes: cursor moves are new cursor state
-- versions, a requeued dead letter is a row of its own, modes are a handful of rows.

-- Timestamps as Queen's clients read them: ISO 8601 in UTC with milliseconds.
CREATE FUNCTION comb.iso(t timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
$$;

-- A partition as operators see it: its head, what its slowest group has not settled
-- (pending, not counting what is leased out), what is leased out now (processing), and when
-- the oldest message its slowest group has not passed was pushed. Index probes only: the
-- head, each cursor's latest state, and the one message after the slowest cursor.
CREATE FUNCTION comb.partition_stats(p uuid)
RETURNS TABLE (head bigint, head_at timestamptz, pending bigint, processing bigint,
               oldest_pending_at timestamptz, groups bigint)
LANGUAGE sql STABLE AS $$
    WITH h AS (SELECT pos, at FROM comb.partition_head(p)),
    c AS (
        SELECT s.cursor_pos, s.cursor_seg,
               CASE WHEN s.lease_id IS NOT NULL AND s.lease_expires_at > now()
                    THEN greatest(s.lease_upto - s.cursor_pos
                                  - cardinality(ARRAY(SELECT 1 FROM unnest(s.settled) x
                                                      WHERE x <= s.lease_upto)), 0)
                    ELSE 0 END AS processing
        FROM comb.cursors cu
        CROSS JOIN LATERAL comb.cursor_state(cu.partition_id, cu.consumer_group) s
        WHERE cu.partition_id = p
    ),
    slow AS (
        SELECT coalesce(min(cursor_pos), 0) AS pos, coalesce(min(cursor_seg), 0) AS seg,
               coalesce(max(processing), 0) AS processing, count(*) AS groups
        FROM c
    )
    SELECT h.pos, h.at,
           greatest(h.pos - slow.pos - slow.processing, 0),
           slow.processing,
           CASE WHEN h.pos > slow.pos THEN (
               SELECT m.created_at FROM comb.messages m
               WHERE m.partition_id = p AND m.pos > slow.pos AND m.seg >= slow.seg
               ORDER BY m.pos LIMIT 1) END,
           slow.groups
    FROM h, slow
$$;

-- One consumer group's cursor on one partition as operators see it: position, head, what it
-- has not settled (lag), since when (the first unsettled message's time), and its lease.
CREATE FUNCTION comb.cursor_lag(p uuid, g text)
RETURNS TABLE (cursor_pos bigint, head bigint, lag bigint, oldest_unsettled_at timestamptz,
               lease_id uuid, lease_expires_at timestamptz, last_claimed_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT s.cursor_pos, h.pos,
           greatest(h.pos - s.cursor_pos - cardinality(s.settled), 0),
           CASE WHEN h.pos > s.cursor_pos THEN (
               SELECT m.created_at FROM comb.messages m
               WHERE m.partition_id = p AND m.pos > s.cursor_pos AND m.seg >= s.cursor_seg
                 AND m.pos <> ALL (s.settled)
               ORDER BY m.pos LIMIT 1) END,
           CASE WHEN s.lease_expires_at > now() THEN s.lease_id END,
           CASE WHEN s.lease_expires_at > now() THEN s.lease_expires_at END,
           nullif(s.last_claimed_at, '-infinity')
    FROM comb.cursor_state(p, g) s, comb.partition_head(p) h
$$;

CREATE INDEX dead_letters_partition ON comb.dead_letters (partition_id, transaction_id);

-- A dead letter sent back to its partition: insert-only, one row per requeued entry, naming
-- the position the message was stored at again. The entry itself is never updated.
CREATE TABLE comb.dead_letter_requeues (
    dead_letter_id uuid PRIMARY KEY,
    partition_id   uuid NOT NULL,
    pos            bigint NOT NULL,
    requeued_at    timestamptz NOT NULL DEFAULT now()
);

-- Maintenance modes shared by every server on the database: `push` (pushes answered 503)
-- and `pop` (pops answered 204). Changed by operators, rarely; read at most once a second
-- per server.
CREATE TABLE comb.system_modes (
    mode       text PRIMARY KEY CHECK (mode IN ('push', 'pop')),
    enabled    boolean NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT now()
);

-- Tables kept by the day: range-partitioned by `day` (UTC), one table per day, made ahead
-- and dropped whole by maintenance once past their retention (`maintenance::days`). Rows are
-- only ever inserted, so a held snapshot leaves nothing behind in them, and months of
-- traffic never pile up.

-- Events consumers record on messages (`POST /api/v1/traces`): one row per (event, name),
-- or one without a name.
CREATE TABLE comb.traces (
    day            date NOT NULL,
    id             uuid NOT NULL,
    name           text,
    partition_id   uuid NOT NULL,
    transaction_id text NOT NULL,
    consumer_group text NOT NULL,
    event_type     text NOT NULL,
    data           jsonb NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
) PARTITION BY RANGE (day);
CREATE INDEX traces_message ON comb.traces (partition_id, transaction_id, created_at);
CREATE INDEX traces_name ON comb.traces (name, created_at);

-- What each server did per minute (its counters' increase), written by the server itself.
CREATE TABLE comb.server_minutes (
    day           date NOT NULL,
    minute        timestamptz NOT NULL,
    server        text NOT NULL,
    pushed        bigint NOT NULL,
    popped        bigint NOT NULL,
    acked         bigint NOT NULL,
    failed        bigint NOT NULL,
    dead_lettered bigint NOT NULL
) PARTITION BY RANGE (day);
CREATE INDEX server_minutes_minute ON comb.server_minutes (minute);

-- Each queue's depth and lag once a minute, written by one server per minute.
CREATE TABLE comb.queue_minutes (
    day          date NOT NULL,
    minute       timestamptz NOT NULL,
    queue_id     uuid NOT NULL,
    total        bigint NOT NULL,
    pending      bigint NOT NULL,
    processing   bigint NOT NULL,
    dead_letters bigint NOT NULL,
    lag_seconds  float8 NOT NULL,
    PRIMARY KEY (day, minute, queue_id)
) PARTITION BY RANGE (day);

DO $$
DECLARE
    t text;
    d date;
BEGIN
    FOREACH t IN ARRAY ARRAY['traces', 'server_minutes', 'queue_minutes'] LOOP
        FOR i IN 0..2 LOOP
            d := (now() AT TIME ZONE 'UTC')::date + i;
            EXECUTE format('CREATE TABLE comb.%I PARTITION OF comb.%I FOR VALUES FROM (%L) TO (%L)',
                           t || '_' || to_char(d, 'YYYYMMDD'), t, d, d + 1);
        END LOOP;
    END LOOP;
END $$;
