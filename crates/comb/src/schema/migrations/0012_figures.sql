-- Comb schema, version 12: queue and group figures whose cost does not grow with partitions.
--
-- A queue's totals (depth, in flight, oldest pending message) and a group's lag on a queue
-- sum figures of every partition and cursor: a few index probes each, 10–25 µs per
-- partition, so a queue of 10,000 partitions costs tenths of a second per figure. Listings read
-- them from the newest per-minute snapshot instead (`comb.queue_minutes` and, new here,
-- `comb.group_minutes`, written once a minute by one server), dated by `taken_at`, and
-- compute them at request time only for the smallest queues of the answer, up to a budget of
-- partitions, and for queues and groups the snapshot does not hold (made since it was taken).

ALTER TABLE comb.queue_minutes
    ADD COLUMN partitions        bigint,
    ADD COLUMN oldest_pending_at timestamptz,
    ADD COLUMN last_message_at   timestamptz,
    ADD COLUMN taken_at          timestamptz;

-- Each consumer group's lag on each queue once a minute, written with the queues' figures.
CREATE TABLE comb.group_minutes (
    day                 date NOT NULL,
    minute              timestamptz NOT NULL,
    queue_id            uuid NOT NULL,
    consumer_group      text NOT NULL,
    partitions          bigint NOT NULL,
    lag                 bigint NOT NULL,
    oldest_unsettled_at timestamptz,
    leased              bigint NOT NULL,
    taken_at            timestamptz NOT NULL,
    PRIMARY KEY (day, minute, queue_id, consumer_group)
) PARTITION BY RANGE (day);

DO $$
DECLARE
    d date;
BEGIN
    FOR i IN 0..2 LOOP
        d := (now() AT TIME ZONE 'UTC')::date + i;
        EXECUTE format('CREATE TABLE comb.%I PARTITION OF comb.group_minutes FOR VALUES FROM (%L) TO (%L)',
                       'group_minutes_' || to_char(d, 'YYYYMMDD'), d, d + 1);
    END LOOP;
END $$;

-- A queue's figures as they are now: sums of `comb.partition_stats` over its partitions, and
-- its dead letters not requeued. Index probes per partition.
CREATE FUNCTION comb.queue_live(q uuid)
RETURNS TABLE (partitions bigint, total bigint, pending bigint, processing bigint,
               oldest_pending_at timestamptz, last_message_at timestamptz, dead_letters bigint)
LANGUAGE sql STABLE AS $$
    SELECT count(*), coalesce(sum(s.head), 0)::bigint, coalesce(sum(s.pending), 0)::bigint,
           coalesce(sum(s.processing), 0)::bigint, min(s.oldest_pending_at), max(s.head_at),
           (SELECT count(*) FROM comb.dead_letters d
            WHERE d.queue_id = q
              AND NOT EXISTS (SELECT 1 FROM comb.dead_letter_requeues r
                              WHERE r.dead_letter_id = d.id))
    FROM comb.partitions p CROSS JOIN LATERAL comb.partition_stats(p.id) s
    WHERE p.queue_id = q
$$;

-- A group's lag on a queue as it is now: sums of `comb.cursor_lag` over its cursors there.
-- Index probes per cursor.
CREATE FUNCTION comb.group_live(q uuid, g text)
RETURNS TABLE (partitions bigint, lag bigint, oldest_unsettled_at timestamptz, leased bigint)
LANGUAGE sql STABLE AS $$
    SELECT count(*), coalesce(sum(x.lag), 0)::bigint, min(x.oldest_unsettled_at),
           count(x.lease_id)
    FROM comb.cursors c CROSS JOIN LATERAL comb.cursor_lag(c.partition_id, c.consumer_group) x
    WHERE c.queue_id = q AND c.consumer_group = g
$$;

-- The newest snapshot listings may serve: taken in the last five minutes (an older one means
-- no server writes snapshots; figures are then computed at request time). A backward descent
-- of the primary key of today's and yesterday's tables.
CREATE FUNCTION comb.latest_snapshot(OUT day date, OUT minute timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT m.day, m.minute FROM comb.queue_minutes m
    WHERE m.day >= (now() AT TIME ZONE 'UTC')::date - 1
      AND m.minute > now() - interval '5 minutes'
      AND m.taken_at IS NOT NULL
    ORDER BY m.day DESC, m.minute DESC LIMIT 1
$$;

-- Figures of the queues `ids`: from the newest snapshot, except, computed now, for queues it
-- does not hold and for the smallest queues (by partitions) while their partitions add up to
-- at most `live_budget`. `figures_at` is when a figure was taken (now() when computed now);
-- `partitions` is always the catalog's count. Reads by index only: one queue's statistics
-- (a queue holding most partitions) must not make every queue's lookup a scan of the table.
-- Without JIT: the estimate of summing a large queue (never run when it is not computed now)
-- would otherwise cost a second of compiling per call.
-- A queue not computed now is handed to `comb.queue_live` as NULL, which finds nothing.
CREATE FUNCTION comb.queue_figures(ids uuid[], live_budget bigint)
RETURNS TABLE (queue_id uuid, partitions bigint, total bigint, pending bigint,
               processing bigint, dead_letters bigint, oldest_pending_at timestamptz,
               last_message_at timestamptz, figures_at timestamptz, live boolean)
LANGUAGE sql STABLE SET enable_seqscan = off SET jit = off AS $$
    WITH snap AS (SELECT * FROM comb.latest_snapshot()),
    counted AS (
        SELECT p.queue_id AS id, count(*) AS n FROM comb.partitions p
        WHERE p.queue_id = ANY (ids) GROUP BY p.queue_id
    ),
    sized AS (
        SELECT i.id, coalesce(k.n, 0) AS n
        FROM unnest(ids) AS i(id) LEFT JOIN counted k ON k.id = i.id
    ),
    chosen AS MATERIALIZED (
        SELECT s.id, s.n, m.total, m.pending, m.processing, m.dead_letters,
               m.oldest_pending_at, m.last_message_at, m.taken_at,
               m.taken_at IS NULL OR sum(s.n) OVER (ORDER BY s.n, s.id) <= live_budget AS live
        FROM sized s
        LEFT JOIN snap ON true
        LEFT JOIN comb.queue_minutes m
               ON m.day = snap.day AND m.minute = snap.minute AND m.queue_id = s.id
    )
    SELECT c.id, c.n,
           CASE WHEN c.live THEN l.total ELSE c.total END,
           CASE WHEN c.live THEN l.pending ELSE c.pending END,
           CASE WHEN c.live THEN l.processing ELSE c.processing END,
           CASE WHEN c.live THEN l.dead_letters ELSE c.dead_letters END,
           CASE WHEN c.live THEN l.oldest_pending_at ELSE c.oldest_pending_at END,
           CASE WHEN c.live THEN l.last_message_at ELSE c.last_message_at END,
           CASE WHEN c.live THEN now() ELSE c.taken_at END,
           c.live
    FROM chosen c
    CROSS JOIN LATERAL comb.queue_live(CASE WHEN c.live THEN c.id END) l
$$;

-- Lag of the (queue, group) pairs `queue_ids[i]`, `groups[i]`, chosen the same way: from the
-- newest snapshot, except for pairs it does not hold and the smallest pairs (by cursors)
-- within `live_budget`.
CREATE FUNCTION comb.group_figures(queue_ids uuid[], groups text[], live_budget bigint)
RETURNS TABLE (queue_id uuid, consumer_group text, partitions bigint, lag bigint,
               oldest_unsettled_at timestamptz, leased bigint, figures_at timestamptz,
               live boolean)
LANGUAGE sql STABLE SET enable_seqscan = off SET jit = off AS $$
    WITH snap AS (SELECT * FROM comb.latest_snapshot()),
    counted AS (
        SELECT c.queue_id AS q, c.consumer_group AS g, count(*) AS n FROM comb.cursors c
        WHERE c.queue_id = ANY (queue_ids) GROUP BY c.queue_id, c.consumer_group
    ),
    sized AS (
        SELECT i.q, i.g, coalesce(k.n, 0) AS n
        FROM unnest(queue_ids, groups) AS i(q, g) LEFT JOIN counted k ON k.q = i.q AND k.g = i.g
    ),
    chosen AS MATERIALIZED (
        SELECT s.q, s.g, s.n, m.lag, m.oldest_unsettled_at, m.leased, m.taken_at,
               m.taken_at IS NULL OR sum(s.n) OVER (ORDER BY s.n, s.q, s.g) <= live_budget AS live
        FROM sized s
        LEFT JOIN snap ON true
        LEFT JOIN comb.group_minutes m
               ON m.day = snap.day AND m.minute = snap.minute AND m.queue_id = s.q
              AND m.consumer_group = s.g
    )
    SELECT c.q, c.g, c.n,
           CASE WHEN c.live THEN l.lag ELSE c.lag END,
           CASE WHEN c.live THEN l.oldest_unsettled_at ELSE c.oldest_unsettled_at END,
           CASE WHEN c.live THEN l.leased ELSE c.leased END,
           CASE WHEN c.live THEN now() ELSE c.taken_at END,
           c.live
    FROM chosen c
    CROSS JOIN LATERAL comb.group_live(CASE WHEN c.live THEN c.q END, c.g) l
$$;

-- The cursors of one (queue, group) whose oldest unsettled message waits at least
-- `min_secs`, with their lag (`comb.cursor_lag`): the per-partition rows of the lagging
-- listing, for the pairs it computes now. By index only, as `comb.queue_figures`.
CREATE FUNCTION comb.lagging_cursors(q uuid, g text, min_secs float8)
RETURNS TABLE (partition_id uuid, lag bigint, oldest_unsettled_at timestamptz)
LANGUAGE sql STABLE SET enable_seqscan = off SET jit = off AS $$
    SELECT c.partition_id, x.lag, x.oldest_unsettled_at
    FROM comb.cursors c CROSS JOIN LATERAL comb.cursor_lag(c.partition_id, c.consumer_group) x
    WHERE c.queue_id = q AND c.consumer_group = g AND x.lag > 0
      AND x.oldest_unsettled_at <= now() - make_interval(secs => min_secs)
$$;
