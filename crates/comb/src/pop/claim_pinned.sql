-- @CANDIDATES_SQL
WITH q AS (
    SELECT coalesce((options->>'leaseTime')::float8, $5) AS lease_secs,
           coalesce((options->>'delayedProcessing')::float8, 0) AS delay_secs,
           coalesce((options->>'windowBuffer')::float8, 0) AS window_secs,
           comb.retention_secs(options) AS retention_secs
    FROM comb.queues WHERE id = $1),
walk AS (
    (SELECT c.partition_id, false AS wrapped FROM comb.cursors c
     WHERE c.queue_id = $1 AND c.consumer_group = $2
       AND ($3::uuid IS NULL OR c.partition_id = $3) AND c.partition_id > $6
     ORDER BY c.partition_id)
    UNION ALL
    (SELECT c.partition_id, true FROM comb.cursors c
     WHERE c.queue_id = $1 AND c.consumer_group = $2
       AND ($3::uuid IS NULL OR c.partition_id = $3) AND c.partition_id <= $6
     ORDER BY c.partition_id)
),
cs AS (
    SELECT w.wrapped, s.*
    FROM walk w
    CROSS JOIN LATERAL comb.cursor_state(w.partition_id, $2) s
),
-- Cursors to claim (free, with messages to hand out) and cursors whose lease ended, in walk
-- order; the walk stops a few beyond what is wanted ($7). This server's claims of one group
-- run one at a time (their lane), so only other servers' claims lock some of these first.
-- The queue's options are read through scalar subqueries, not a join: joined, the planner
-- would copy the free-cursor test into a filter of its own and probe each cursor's next
-- message twice.
seen AS (
    SELECT f.partition_id, f.wrapped, f.lease_id IS NOT NULL AS expired
    FROM cs f
    WHERE (f.lease_id IS NOT NULL AND f.lease_expires_at <= now())
       OR (f.lease_id IS NULL AND f.available_at <= now()
           -- Not EXISTS: the planner drops an EXISTS's ORDER BY and may then walk the
           -- partition in any order; in position order it reads one index entry.
           AND (SELECT m.pos FROM comb.messages m WHERE m.partition_id = f.partition_id
                  AND m.pos > f.cursor_pos AND m.seg >= f.cursor_seg
                ORDER BY m.pos LIMIT 1) IS NOT NULL
           -- windowBuffer, retentionSeconds and delayedProcessing, checked by a function
           -- called only for queues that set one: inline, their plan nodes would be
           -- initialised by every walk of every queue.
           AND ((SELECT window_secs + retention_secs + delay_secs FROM q) = 0
                OR comb.claimable_now(f.partition_id, f.cursor_pos, f.cursor_seg,
                                      (SELECT window_secs FROM q),
                                      (SELECT retention_secs FROM q),
                                      (SELECT delay_secs FROM q))))
    LIMIT $4::bigint + $7::bigint
),
cand AS (
    SELECT c.partition_id
    FROM seen e
    JOIN comb.cursors c ON c.partition_id = e.partition_id AND c.consumer_group = $2
    WHERE NOT e.expired
    ORDER BY e.wrapped, e.partition_id
    LIMIT $4
    FOR NO KEY UPDATE OF c SKIP LOCKED
)
SELECT partition_id, false AS wrapped, 0::int2 AS kind FROM cand
UNION ALL
SELECT partition_id, wrapped, 1::int2 FROM seen WHERE expired
UNION ALL
SELECT e.partition_id, e.wrapped, 2::int2 FROM seen e
WHERE NOT e.expired AND NOT EXISTS (SELECT 1 FROM cand c WHERE c.partition_id = e.partition_id)

-- @CANDIDATES_CITUS_SQL
WITH q AS (
    SELECT coalesce((options->>'leaseTime')::float8, $5) AS lease_secs,
           coalesce((options->>'delayedProcessing')::float8, 0) AS delay_secs,
           coalesce((options->>'windowBuffer')::float8, 0) AS window_secs,
           comb.retention_secs(options) AS retention_secs
    FROM comb.queues WHERE id = $1),
walk AS (
    (SELECT c.partition_id, false AS wrapped FROM comb.cursors c
     WHERE c.queue_id = $1 AND c.consumer_group = $2
       AND c.partition_id = $3 AND c.partition_id > $6
     ORDER BY c.partition_id)
    UNION ALL
    (SELECT c.partition_id, true FROM comb.cursors c
     WHERE c.queue_id = $1 AND c.consumer_group = $2
       AND c.partition_id = $3 AND c.partition_id <= $6
     ORDER BY c.partition_id)
),
cs AS (
    SELECT w.wrapped, s.*
    FROM walk w
    CROSS JOIN LATERAL (SELECT * FROM comb.cursor_states s
          WHERE s.partition_id = w.partition_id AND s.partition_id = $3
            AND s.consumer_group = $2
          ORDER BY s.gen DESC, s.ver DESC LIMIT 1) s
),
-- Cursors to claim (free, with messages to hand out) and cursors whose lease ended, in walk
-- order; the walk stops a few beyond what is wanted ($7). This server's claims of one group
-- run one at a time (their lane), so only other servers' claims lock some of these first.
-- The queue's options are read through scalar subqueries, not a join: joined, the planner
-- would copy the free-cursor test into a filter of its own and probe each cursor's next
-- message twice.
seen AS (
    SELECT f.partition_id, f.wrapped, f.lease_id IS NOT NULL AS expired
    FROM cs f
    WHERE (f.lease_id IS NOT NULL AND f.lease_expires_at <= now())
       OR (f.lease_id IS NULL AND f.available_at <= now()
           -- Not EXISTS: the planner drops an EXISTS's ORDER BY and may then walk the
           -- partition in any order; in position order it reads one index entry.
           AND (SELECT m.pos FROM comb.messages m WHERE m.partition_id = f.partition_id AND m.partition_id = $3
                  AND m.pos > f.cursor_pos AND m.seg >= f.cursor_seg
                ORDER BY m.pos LIMIT 1) IS NOT NULL
           -- windowBuffer, retentionSeconds and delayedProcessing, checked by a function
           -- called only for queues that set one: inline, their plan nodes would be
           -- initialised by every walk of every queue.
           AND ((SELECT window_secs + retention_secs + delay_secs FROM q) = 0
                OR (
    ((SELECT window_secs FROM q) = 0
     OR ((SELECT h.at FROM (
              (SELECT m.pos, m.created_at AS at FROM comb.messages m WHERE m.partition_id = $3
                 AND m.seg >= (SELECT min(s.seg) FROM comb.segments s WHERE NOT s.summarized)
               ORDER BY m.pos DESC LIMIT 1)
              UNION ALL
              (SELECT sp.max_pos, sp.max_created_at FROM comb.segment_partitions sp
               WHERE sp.partition_id = $3 ORDER BY sp.seg DESC LIMIT 1)) h
          ORDER BY h.pos DESC LIMIT 1)
         <= now() - make_interval(secs => (SELECT window_secs FROM q))) IS TRUE)
    AND ((SELECT retention_secs FROM q) = 0
     OR ((SELECT h.at FROM (
              (SELECT m.pos, m.created_at AS at FROM comb.messages m WHERE m.partition_id = $3
                 AND m.seg >= (SELECT min(s.seg) FROM comb.segments s WHERE NOT s.summarized)
               ORDER BY m.pos DESC LIMIT 1)
              UNION ALL
              (SELECT sp.max_pos, sp.max_created_at FROM comb.segment_partitions sp
               WHERE sp.partition_id = $3 ORDER BY sp.seg DESC LIMIT 1)) h
          ORDER BY h.pos DESC LIMIT 1)
         > now() - make_interval(secs => (SELECT retention_secs FROM q))) IS TRUE)
    AND ((SELECT delay_secs FROM q) = 0
     OR ((SELECT m.created_at FROM comb.messages m WHERE m.partition_id = $3 AND m.pos > f.cursor_pos AND m.seg >= f.cursor_seg
          ORDER BY m.pos LIMIT 1)
         <= now() - make_interval(secs => (SELECT delay_secs FROM q))) IS TRUE))))
    LIMIT $4::bigint + $7::bigint
),
cand AS (
    SELECT c.partition_id
    FROM seen e
    JOIN comb.cursors c ON c.partition_id = e.partition_id AND c.consumer_group = $2 AND c.partition_id = $3
    WHERE NOT e.expired
    ORDER BY e.wrapped, e.partition_id
    LIMIT $4
    FOR NO KEY UPDATE OF c SKIP LOCKED
)
SELECT partition_id, false AS wrapped, 0::int2 AS kind FROM cand
UNION ALL
SELECT partition_id, wrapped, 1::int2 FROM seen WHERE expired
UNION ALL
SELECT e.partition_id, e.wrapped, 2::int2 FROM seen e
WHERE NOT e.expired AND NOT EXISTS (SELECT 1 FROM cand c WHERE c.partition_id = e.partition_id)

-- @CANDIDATES_LIST_CITUS_SQL
SELECT c.partition_id
FROM comb.cursors c
CROSS JOIN LATERAL (SELECT * FROM comb.cursor_states s
          WHERE s.partition_id = c.partition_id
            AND s.consumer_group = c.consumer_group
          ORDER BY s.gen DESC, s.ver DESC LIMIT 1) f
WHERE c.queue_id = $1 AND c.consumer_group = $2
  AND ((f.lease_id IS NOT NULL AND f.lease_expires_at <= now())
       OR (f.lease_id IS NULL AND f.available_at <= now()
           AND EXISTS (SELECT 1 FROM comb.messages m WHERE m.partition_id = c.partition_id
                         AND m.pos > f.cursor_pos AND m.seg >= f.cursor_seg)))
ORDER BY c.partition_id <= $3, c.partition_id
LIMIT $4

-- @CLAIM_SQL
WITH q AS (
    SELECT coalesce((options->>'leaseTime')::float8, $5) AS lease_secs,
           coalesce((options->>'delayedProcessing')::float8, 0) AS delay_secs,
           coalesce((options->>'windowBuffer')::float8, 0) AS window_secs,
           comb.retention_secs(options) AS retention_secs
    FROM comb.queues WHERE id = $1),
st AS MATERIALIZED (
    SELECT s.*, (SELECT p.name FROM comb.partitions p WHERE p.id = c.partition_id) AS name
    FROM unnest($3::uuid[]) AS c(partition_id)
    CROSS JOIN LATERAL comb.cursor_state(c.partition_id, $2) s
    WHERE s.lease_id IS NULL AND s.available_at <= now()
),
msgs AS MATERIALIZED (
    SELECT st.partition_id, m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload,
           m.created_at, m.producer_sub,
           1 + coalesce(st.attempt_cnt[array_position(st.attempt_pos, m.pos)], 0) AS attempt
    FROM st
    CROSS JOIN q
    CROSS JOIN LATERAL (
        SELECT m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at,
               m.producer_sub
        FROM comb.messages m WHERE m.partition_id = st.partition_id
          AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
          AND m.pos <> ALL (st.settled)
          AND (q.delay_secs = 0 OR m.created_at <= now() - make_interval(secs => q.delay_secs))
          AND (q.retention_secs = 0
               OR m.created_at > now() - make_interval(secs => q.retention_secs))
        ORDER BY m.pos
        LIMIT $4
    ) m
),

span AS (
    -- Messages before the first one handed out that are not settled are past their queue's
    -- retention: the position moves over them.
    SELECT partition_id, max(pos) AS upto,
           CASE WHEN $6 THEN max(pos) ELSE min(pos) - 1 END AS cut,
           -- The leased ids, for the lease's digest: aggregated as they come, so the
           -- messages are grouped by hashing, not sorted (the digest sorts each lease's ids).
           array_agg(transaction_id) FILTER (WHERE NOT $6) AS ids
    FROM msgs GROUP BY partition_id
),
claimed AS (
    INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at,
     lease_digest)
    SELECT st.partition_id, $2, (SELECT max(gen) FROM comb.cursor_gens), st.ver + 1,
           greatest(st.cursor_pos, span.cut), st.cursor_seg,
           ARRAY(SELECT x FROM unnest(st.settled) x WHERE x > span.cut),
           ARRAY(SELECT a FROM unnest(st.attempt_pos) a WHERE a > span.cut),
           ARRAY(SELECT n FROM unnest(st.attempt_pos, st.attempt_cnt) AS x(a, n)
                 WHERE a > span.cut),
           CASE WHEN $6 THEN NULL ELSE gen_random_uuid() END,
           CASE WHEN $6 THEN NULL ELSE now() + make_interval(secs => q.lease_secs) END,
           span.upto, st.available_at, clock_timestamp(),
           (SELECT sha256(convert_to(string_agg(octet_length(x)::text || ':' || x, '' ORDER BY x COLLATE "C") , 'UTF8')) FROM unnest(span.ids) x)
    FROM st
    JOIN span ON span.partition_id = st.partition_id
    CROSS JOIN q
    RETURNING partition_id, lease_id, lease_expires_at
),
leased AS MATERIALIZED (
    SELECT cl.partition_id, st.name, cl.lease_id, cl.lease_expires_at
    FROM claimed cl
    JOIN st ON st.partition_id = cl.partition_id
)
SELECT l.partition_id, l.name, l.lease_id, l.lease_expires_at,
       m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at, m.attempt,
       m.producer_sub,
       CASE WHEN substr(m.payload, 1, 1) = '\x00'::bytea THEN comb.refuse_sealed_payload() END
FROM msgs m
JOIN leased l ON l.partition_id = m.partition_id

-- @SHARED_CLAIM_SQL
WITH q AS (
    SELECT coalesce((options->>'leaseTime')::float8, $5) AS lease_secs,
           coalesce((options->>'delayedProcessing')::float8, 0) AS delay_secs,
           coalesce((options->>'windowBuffer')::float8, 0) AS window_secs,
           comb.retention_secs(options) AS retention_secs
    FROM comb.queues WHERE id = $1),
st AS MATERIALIZED (
    SELECT s.*, (SELECT p.name FROM comb.partitions p WHERE p.id = c.partition_id) AS name
    FROM unnest($3::uuid[]) AS c(partition_id)
    CROSS JOIN LATERAL comb.cursor_state(c.partition_id, $2) s
    WHERE s.lease_id IS NULL AND s.available_at <= now()
),
picked AS MATERIALIZED (
    SELECT st.partition_id, m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload,
           m.created_at, m.producer_sub,
           1 + coalesce(st.attempt_cnt[array_position(st.attempt_pos, m.pos)], 0) AS attempt
    FROM st
    CROSS JOIN q
    CROSS JOIN LATERAL (
        SELECT m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at,
               m.producer_sub
        FROM comb.messages m WHERE m.partition_id = st.partition_id
          AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
          AND m.pos <> ALL (st.settled)
          AND (q.delay_secs = 0 OR m.created_at <= now() - make_interval(secs => q.delay_secs))
          AND (q.retention_secs = 0
               OR m.created_at > now() - make_interval(secs => q.retention_secs))
        ORDER BY m.pos
        LIMIT $4
    ) m
),
msgs AS MATERIALIZED (
    SELECT * FROM (
        SELECT p.*, row_number() OVER (
                   ORDER BY array_position($3::uuid[], p.partition_id), p.pos) AS rank
        FROM picked p) r
    WHERE rank <= $8
),
span AS (
    -- Messages before the first one handed out that are not settled are past their queue's
    -- retention: the position moves over them.
    SELECT partition_id, max(pos) AS upto,
           CASE WHEN $6 THEN max(pos) ELSE min(pos) - 1 END AS cut,
           -- The leased ids, for the lease's digest: aggregated as they come, so the
           -- messages are grouped by hashing, not sorted (the digest sorts each lease's ids).
           array_agg(transaction_id) FILTER (WHERE NOT $6) AS ids
    FROM msgs GROUP BY partition_id
),
claimed AS (
    INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at,
     lease_digest)
    SELECT st.partition_id, $2, (SELECT max(gen) FROM comb.cursor_gens), st.ver + 1,
           greatest(st.cursor_pos, span.cut), st.cursor_seg,
           ARRAY(SELECT x FROM unnest(st.settled) x WHERE x > span.cut),
           ARRAY(SELECT a FROM unnest(st.attempt_pos) a WHERE a > span.cut),
           ARRAY(SELECT n FROM unnest(st.attempt_pos, st.attempt_cnt) AS x(a, n)
                 WHERE a > span.cut),
           CASE WHEN $6 THEN NULL ELSE $7::uuid END,
           CASE WHEN $6 THEN NULL ELSE now() + make_interval(secs => q.lease_secs) END,
           span.upto, st.available_at, clock_timestamp(),
           (SELECT sha256(convert_to(string_agg(octet_length(x)::text || ':' || x, '' ORDER BY x COLLATE "C") , 'UTF8')) FROM unnest(span.ids) x)
    FROM st
    JOIN span ON span.partition_id = st.partition_id
    CROSS JOIN q
    RETURNING partition_id, lease_id, lease_expires_at
),
leased AS MATERIALIZED (
    SELECT cl.partition_id, st.name, cl.lease_id, cl.lease_expires_at
    FROM claimed cl
    JOIN st ON st.partition_id = cl.partition_id
)
SELECT l.partition_id, l.name, l.lease_id, l.lease_expires_at,
       m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at, m.attempt,
       m.producer_sub,
       CASE WHEN substr(m.payload, 1, 1) = '\x00'::bytea THEN comb.refuse_sealed_payload() END
FROM msgs m
JOIN leased l ON l.partition_id = m.partition_id

-- @OPENING_CLAIM_SQL
WITH q AS (
    SELECT coalesce((options->>'leaseTime')::float8, $5) AS lease_secs,
           coalesce((options->>'delayedProcessing')::float8, 0) AS delay_secs,
           coalesce((options->>'windowBuffer')::float8, 0) AS window_secs,
           comb.retention_secs(options) AS retention_secs
    FROM comb.queues WHERE id = $1),
st AS MATERIALIZED (
    SELECT s.*, (SELECT p.name FROM comb.partitions p WHERE p.id = c.partition_id) AS name
    FROM unnest($3::uuid[]) AS c(partition_id)
    CROSS JOIN LATERAL comb.cursor_state(c.partition_id, $2) s
    WHERE s.lease_id IS NULL AND s.available_at <= now()
),
msgs AS MATERIALIZED (
    SELECT st.partition_id, m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload,
           m.created_at, m.producer_sub,
           1 + coalesce(st.attempt_cnt[array_position(st.attempt_pos, m.pos)], 0) AS attempt
    FROM st
    CROSS JOIN q
    CROSS JOIN LATERAL (
        SELECT m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at,
               m.producer_sub
        FROM comb.messages m WHERE m.partition_id = st.partition_id
          AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
          AND m.pos <> ALL (st.settled)
          AND (q.delay_secs = 0 OR m.created_at <= now() - make_interval(secs => q.delay_secs))
          AND (q.retention_secs = 0
               OR m.created_at > now() - make_interval(secs => q.retention_secs))
        ORDER BY m.pos
        LIMIT $4
    ) m
),

span AS (
    -- Messages before the first one handed out that are not settled are past their queue's
    -- retention: the position moves over them.
    SELECT partition_id, max(pos) AS upto,
           CASE WHEN $6 THEN max(pos) ELSE min(pos) - 1 END AS cut,
           -- The leased ids, for the lease's digest: aggregated as they come, so the
           -- messages are grouped by hashing, not sorted (the digest sorts each lease's ids).
           array_agg(transaction_id) FILTER (WHERE NOT $6) AS ids
    FROM msgs GROUP BY partition_id
),
claimed AS (
    INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at,
     lease_digest)
    SELECT st.partition_id, $2, (SELECT max(gen) FROM comb.cursor_gens), st.ver + 1,
           greatest(st.cursor_pos, span.cut), st.cursor_seg,
           ARRAY(SELECT x FROM unnest(st.settled) x WHERE x > span.cut),
           ARRAY(SELECT a FROM unnest(st.attempt_pos) a WHERE a > span.cut),
           ARRAY(SELECT n FROM unnest(st.attempt_pos, st.attempt_cnt) AS x(a, n)
                 WHERE a > span.cut),
           CASE WHEN $6 THEN NULL ELSE gen_random_uuid() END,
           CASE WHEN $6 THEN NULL ELSE now() + make_interval(secs => q.lease_secs) END,
           span.upto, st.available_at, clock_timestamp(),
           (SELECT sha256(convert_to(string_agg(octet_length(x)::text || ':' || x, '' ORDER BY x COLLATE "C") , 'UTF8')) FROM unnest(span.ids) x)
    FROM st
    JOIN span ON span.partition_id = st.partition_id
    CROSS JOIN q
    RETURNING partition_id, lease_id, lease_expires_at
),
leased AS MATERIALIZED (
    SELECT cl.partition_id, st.name, cl.lease_id, cl.lease_expires_at
    FROM claimed cl
    JOIN st ON st.partition_id = cl.partition_id
)
SELECT l.partition_id, l.name, l.lease_id, l.lease_expires_at,
       m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at, m.attempt,
       m.producer_sub
FROM msgs m
JOIN leased l ON l.partition_id = m.partition_id

-- @OPENING_SHARED_CLAIM_SQL
WITH q AS (
    SELECT coalesce((options->>'leaseTime')::float8, $5) AS lease_secs,
           coalesce((options->>'delayedProcessing')::float8, 0) AS delay_secs,
           coalesce((options->>'windowBuffer')::float8, 0) AS window_secs,
           comb.retention_secs(options) AS retention_secs
    FROM comb.queues WHERE id = $1),
st AS MATERIALIZED (
    SELECT s.*, (SELECT p.name FROM comb.partitions p WHERE p.id = c.partition_id) AS name
    FROM unnest($3::uuid[]) AS c(partition_id)
    CROSS JOIN LATERAL comb.cursor_state(c.partition_id, $2) s
    WHERE s.lease_id IS NULL AND s.available_at <= now()
),
picked AS MATERIALIZED (
    SELECT st.partition_id, m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload,
           m.created_at, m.producer_sub,
           1 + coalesce(st.attempt_cnt[array_position(st.attempt_pos, m.pos)], 0) AS attempt
    FROM st
    CROSS JOIN q
    CROSS JOIN LATERAL (
        SELECT m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at,
               m.producer_sub
        FROM comb.messages m WHERE m.partition_id = st.partition_id
          AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
          AND m.pos <> ALL (st.settled)
          AND (q.delay_secs = 0 OR m.created_at <= now() - make_interval(secs => q.delay_secs))
          AND (q.retention_secs = 0
               OR m.created_at > now() - make_interval(secs => q.retention_secs))
        ORDER BY m.pos
        LIMIT $4
    ) m
),
msgs AS MATERIALIZED (
    SELECT * FROM (
        SELECT p.*, row_number() OVER (
                   ORDER BY array_position($3::uuid[], p.partition_id), p.pos) AS rank
        FROM picked p) r
    WHERE rank <= $8
),
span AS (
    -- Messages before the first one handed out that are not settled are past their queue's
    -- retention: the position moves over them.
    SELECT partition_id, max(pos) AS upto,
           CASE WHEN $6 THEN max(pos) ELSE min(pos) - 1 END AS cut,
           -- The leased ids, for the lease's digest: aggregated as they come, so the
           -- messages are grouped by hashing, not sorted (the digest sorts each lease's ids).
           array_agg(transaction_id) FILTER (WHERE NOT $6) AS ids
    FROM msgs GROUP BY partition_id
),
claimed AS (
    INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at,
     lease_digest)
    SELECT st.partition_id, $2, (SELECT max(gen) FROM comb.cursor_gens), st.ver + 1,
           greatest(st.cursor_pos, span.cut), st.cursor_seg,
           ARRAY(SELECT x FROM unnest(st.settled) x WHERE x > span.cut),
           ARRAY(SELECT a FROM unnest(st.attempt_pos) a WHERE a > span.cut),
           ARRAY(SELECT n FROM unnest(st.attempt_pos, st.attempt_cnt) AS x(a, n)
                 WHERE a > span.cut),
           CASE WHEN $6 THEN NULL ELSE $7::uuid END,
           CASE WHEN $6 THEN NULL ELSE now() + make_interval(secs => q.lease_secs) END,
           span.upto, st.available_at, clock_timestamp(),
           (SELECT sha256(convert_to(string_agg(octet_length(x)::text || ':' || x, '' ORDER BY x COLLATE "C") , 'UTF8')) FROM unnest(span.ids) x)
    FROM st
    JOIN span ON span.partition_id = st.partition_id
    CROSS JOIN q
    RETURNING partition_id, lease_id, lease_expires_at
),
leased AS MATERIALIZED (
    SELECT cl.partition_id, st.name, cl.lease_id, cl.lease_expires_at
    FROM claimed cl
    JOIN st ON st.partition_id = cl.partition_id
)
SELECT l.partition_id, l.name, l.lease_id, l.lease_expires_at,
       m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at, m.attempt,
       m.producer_sub
FROM msgs m
JOIN leased l ON l.partition_id = m.partition_id

-- @CLAIM_CITUS_SQL
WITH q AS (
    SELECT coalesce((options->>'leaseTime')::float8, $5) AS lease_secs,
           coalesce((options->>'delayedProcessing')::float8, 0) AS delay_secs,
           coalesce((options->>'windowBuffer')::float8, 0) AS window_secs,
           comb.retention_secs(options) AS retention_secs
    FROM comb.queues WHERE id = $1),
st AS MATERIALIZED (
    SELECT s.*, (SELECT p.name FROM comb.partitions p WHERE p.id = c.partition_id AND p.id = $9) AS name
    FROM (SELECT $9::uuid WHERE $9::uuid = ANY($3::uuid[])) AS c(partition_id)
    CROSS JOIN LATERAL (SELECT * FROM comb.cursor_states s
          WHERE s.partition_id = c.partition_id AND s.partition_id = $9
            AND s.consumer_group = $2
          ORDER BY s.gen DESC, s.ver DESC LIMIT 1) s
    WHERE s.lease_id IS NULL AND s.available_at <= now()
),
msgs AS MATERIALIZED (
    SELECT st.partition_id, m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload,
           m.created_at, m.producer_sub,
           1 + coalesce(st.attempt_cnt[array_position(st.attempt_pos, m.pos)], 0) AS attempt
    FROM st
    CROSS JOIN q
    CROSS JOIN LATERAL (
        SELECT m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at,
               m.producer_sub
        FROM comb.messages m WHERE m.partition_id = st.partition_id AND m.partition_id = $9
          AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
          AND m.pos <> ALL (st.settled)
          AND (q.delay_secs = 0 OR m.created_at <= now() - make_interval(secs => q.delay_secs))
          AND (q.retention_secs = 0
               OR m.created_at > now() - make_interval(secs => q.retention_secs))
        ORDER BY m.pos
        LIMIT $4
    ) m
),

span AS (
    -- Messages before the first one handed out that are not settled are past their queue's
    -- retention: the position moves over them.
    SELECT partition_id, max(pos) AS upto,
           CASE WHEN $6 THEN max(pos) ELSE min(pos) - 1 END AS cut,
           -- The leased ids, for the lease's digest: aggregated as they come, so the
           -- messages are grouped by hashing, not sorted (the digest sorts each lease's ids).
           array_agg(transaction_id) FILTER (WHERE NOT $6) AS ids
    FROM msgs GROUP BY partition_id
),
claimed AS (
    INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at,
     lease_digest)
    SELECT st.partition_id, $2, (SELECT max(gen) FROM comb.cursor_gens), st.ver + 1,
           greatest(st.cursor_pos, span.cut), st.cursor_seg,
           ARRAY(SELECT x FROM unnest(st.settled) x WHERE x > span.cut),
           ARRAY(SELECT a FROM unnest(st.attempt_pos) a WHERE a > span.cut),
           ARRAY(SELECT n FROM unnest(st.attempt_pos, st.attempt_cnt) AS x(a, n)
                 WHERE a > span.cut),
           CASE WHEN $6 THEN NULL ELSE gen_random_uuid() END,
           CASE WHEN $6 THEN NULL ELSE now() + make_interval(secs => q.lease_secs) END,
           span.upto, st.available_at, clock_timestamp(),
           (SELECT sha256(convert_to(string_agg(octet_length(x)::text || ':' || x, '' ORDER BY x COLLATE "C") , 'UTF8')) FROM unnest(span.ids) x)
    FROM st
    JOIN span ON span.partition_id = st.partition_id
    CROSS JOIN q
    RETURNING partition_id, lease_id, lease_expires_at
),
leased AS MATERIALIZED (
    SELECT cl.partition_id, st.name, cl.lease_id, cl.lease_expires_at
    FROM claimed cl
    JOIN st ON st.partition_id = cl.partition_id
)
SELECT l.partition_id, l.name, l.lease_id, l.lease_expires_at,
       m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at, m.attempt,
       m.producer_sub,
       CASE WHEN substr(m.payload, 1, 1) = '\x00'::bytea THEN comb.refuse_sealed_payload() END
FROM msgs m
JOIN leased l ON l.partition_id = m.partition_id

-- @SHARED_CLAIM_CITUS_SQL
WITH q AS (
    SELECT coalesce((options->>'leaseTime')::float8, $5) AS lease_secs,
           coalesce((options->>'delayedProcessing')::float8, 0) AS delay_secs,
           coalesce((options->>'windowBuffer')::float8, 0) AS window_secs,
           comb.retention_secs(options) AS retention_secs
    FROM comb.queues WHERE id = $1),
st AS MATERIALIZED (
    SELECT s.*, (SELECT p.name FROM comb.partitions p WHERE p.id = c.partition_id AND p.id = $9) AS name
    FROM (SELECT $9::uuid WHERE $9::uuid = ANY($3::uuid[])) AS c(partition_id)
    CROSS JOIN LATERAL (SELECT * FROM comb.cursor_states s
          WHERE s.partition_id = c.partition_id AND s.partition_id = $9
            AND s.consumer_group = $2
          ORDER BY s.gen DESC, s.ver DESC LIMIT 1) s
    WHERE s.lease_id IS NULL AND s.available_at <= now()
),
picked AS MATERIALIZED (
    SELECT st.partition_id, m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload,
           m.created_at, m.producer_sub,
           1 + coalesce(st.attempt_cnt[array_position(st.attempt_pos, m.pos)], 0) AS attempt
    FROM st
    CROSS JOIN q
    CROSS JOIN LATERAL (
        SELECT m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at,
               m.producer_sub
        FROM comb.messages m WHERE m.partition_id = st.partition_id AND m.partition_id = $9
          AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
          AND m.pos <> ALL (st.settled)
          AND (q.delay_secs = 0 OR m.created_at <= now() - make_interval(secs => q.delay_secs))
          AND (q.retention_secs = 0
               OR m.created_at > now() - make_interval(secs => q.retention_secs))
        ORDER BY m.pos
        LIMIT $4
    ) m
),
msgs AS MATERIALIZED (
    SELECT * FROM (
        SELECT p.*, row_number() OVER (
                   ORDER BY array_position($3::uuid[], p.partition_id), p.pos) AS rank
        FROM picked p) r
    WHERE rank <= $8
),
span AS (
    -- Messages before the first one handed out that are not settled are past their queue's
    -- retention: the position moves over them.
    SELECT partition_id, max(pos) AS upto,
           CASE WHEN $6 THEN max(pos) ELSE min(pos) - 1 END AS cut,
           -- The leased ids, for the lease's digest: aggregated as they come, so the
           -- messages are grouped by hashing, not sorted (the digest sorts each lease's ids).
           array_agg(transaction_id) FILTER (WHERE NOT $6) AS ids
    FROM msgs GROUP BY partition_id
),
claimed AS (
    INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at,
     lease_digest)
    SELECT st.partition_id, $2, (SELECT max(gen) FROM comb.cursor_gens), st.ver + 1,
           greatest(st.cursor_pos, span.cut), st.cursor_seg,
           ARRAY(SELECT x FROM unnest(st.settled) x WHERE x > span.cut),
           ARRAY(SELECT a FROM unnest(st.attempt_pos) a WHERE a > span.cut),
           ARRAY(SELECT n FROM unnest(st.attempt_pos, st.attempt_cnt) AS x(a, n)
                 WHERE a > span.cut),
           CASE WHEN $6 THEN NULL ELSE $7::uuid END,
           CASE WHEN $6 THEN NULL ELSE now() + make_interval(secs => q.lease_secs) END,
           span.upto, st.available_at, clock_timestamp(),
           (SELECT sha256(convert_to(string_agg(octet_length(x)::text || ':' || x, '' ORDER BY x COLLATE "C") , 'UTF8')) FROM unnest(span.ids) x)
    FROM st
    JOIN span ON span.partition_id = st.partition_id
    CROSS JOIN q
    RETURNING partition_id, lease_id, lease_expires_at
),
leased AS MATERIALIZED (
    SELECT cl.partition_id, st.name, cl.lease_id, cl.lease_expires_at
    FROM claimed cl
    JOIN st ON st.partition_id = cl.partition_id
)
SELECT l.partition_id, l.name, l.lease_id, l.lease_expires_at,
       m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at, m.attempt,
       m.producer_sub,
       CASE WHEN substr(m.payload, 1, 1) = '\x00'::bytea THEN comb.refuse_sealed_payload() END
FROM msgs m
JOIN leased l ON l.partition_id = m.partition_id

-- @OPENING_CLAIM_CITUS_SQL
WITH q AS (
    SELECT coalesce((options->>'leaseTime')::float8, $5) AS lease_secs,
           coalesce((options->>'delayedProcessing')::float8, 0) AS delay_secs,
           coalesce((options->>'windowBuffer')::float8, 0) AS window_secs,
           comb.retention_secs(options) AS retention_secs
    FROM comb.queues WHERE id = $1),
st AS MATERIALIZED (
    SELECT s.*, (SELECT p.name FROM comb.partitions p WHERE p.id = c.partition_id AND p.id = $9) AS name
    FROM (SELECT $9::uuid WHERE $9::uuid = ANY($3::uuid[])) AS c(partition_id)
    CROSS JOIN LATERAL (SELECT * FROM comb.cursor_states s
          WHERE s.partition_id = c.partition_id AND s.partition_id = $9
            AND s.consumer_group = $2
          ORDER BY s.gen DESC, s.ver DESC LIMIT 1) s
    WHERE s.lease_id IS NULL AND s.available_at <= now()
),
msgs AS MATERIALIZED (
    SELECT st.partition_id, m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload,
           m.created_at, m.producer_sub,
           1 + coalesce(st.attempt_cnt[array_position(st.attempt_pos, m.pos)], 0) AS attempt
    FROM st
    CROSS JOIN q
    CROSS JOIN LATERAL (
        SELECT m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at,
               m.producer_sub
        FROM comb.messages m WHERE m.partition_id = st.partition_id AND m.partition_id = $9
          AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
          AND m.pos <> ALL (st.settled)
          AND (q.delay_secs = 0 OR m.created_at <= now() - make_interval(secs => q.delay_secs))
          AND (q.retention_secs = 0
               OR m.created_at > now() - make_interval(secs => q.retention_secs))
        ORDER BY m.pos
        LIMIT $4
    ) m
),

span AS (
    -- Messages before the first one handed out that are not settled are past their queue's
    -- retention: the position moves over them.
    SELECT partition_id, max(pos) AS upto,
           CASE WHEN $6 THEN max(pos) ELSE min(pos) - 1 END AS cut,
           -- The leased ids, for the lease's digest: aggregated as they come, so the
           -- messages are grouped by hashing, not sorted (the digest sorts each lease's ids).
           array_agg(transaction_id) FILTER (WHERE NOT $6) AS ids
    FROM msgs GROUP BY partition_id
),
claimed AS (
    INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at,
     lease_digest)
    SELECT st.partition_id, $2, (SELECT max(gen) FROM comb.cursor_gens), st.ver + 1,
           greatest(st.cursor_pos, span.cut), st.cursor_seg,
           ARRAY(SELECT x FROM unnest(st.settled) x WHERE x > span.cut),
           ARRAY(SELECT a FROM unnest(st.attempt_pos) a WHERE a > span.cut),
           ARRAY(SELECT n FROM unnest(st.attempt_pos, st.attempt_cnt) AS x(a, n)
                 WHERE a > span.cut),
           CASE WHEN $6 THEN NULL ELSE gen_random_uuid() END,
           CASE WHEN $6 THEN NULL ELSE now() + make_interval(secs => q.lease_secs) END,
           span.upto, st.available_at, clock_timestamp(),
           (SELECT sha256(convert_to(string_agg(octet_length(x)::text || ':' || x, '' ORDER BY x COLLATE "C") , 'UTF8')) FROM unnest(span.ids) x)
    FROM st
    JOIN span ON span.partition_id = st.partition_id
    CROSS JOIN q
    RETURNING partition_id, lease_id, lease_expires_at
),
leased AS MATERIALIZED (
    SELECT cl.partition_id, st.name, cl.lease_id, cl.lease_expires_at
    FROM claimed cl
    JOIN st ON st.partition_id = cl.partition_id
)
SELECT l.partition_id, l.name, l.lease_id, l.lease_expires_at,
       m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at, m.attempt,
       m.producer_sub
FROM msgs m
JOIN leased l ON l.partition_id = m.partition_id

-- @OPENING_SHARED_CLAIM_CITUS_SQL
WITH q AS (
    SELECT coalesce((options->>'leaseTime')::float8, $5) AS lease_secs,
           coalesce((options->>'delayedProcessing')::float8, 0) AS delay_secs,
           coalesce((options->>'windowBuffer')::float8, 0) AS window_secs,
           comb.retention_secs(options) AS retention_secs
    FROM comb.queues WHERE id = $1),
st AS MATERIALIZED (
    SELECT s.*, (SELECT p.name FROM comb.partitions p WHERE p.id = c.partition_id AND p.id = $9) AS name
    FROM (SELECT $9::uuid WHERE $9::uuid = ANY($3::uuid[])) AS c(partition_id)
    CROSS JOIN LATERAL (SELECT * FROM comb.cursor_states s
          WHERE s.partition_id = c.partition_id AND s.partition_id = $9
            AND s.consumer_group = $2
          ORDER BY s.gen DESC, s.ver DESC LIMIT 1) s
    WHERE s.lease_id IS NULL AND s.available_at <= now()
),
picked AS MATERIALIZED (
    SELECT st.partition_id, m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload,
           m.created_at, m.producer_sub,
           1 + coalesce(st.attempt_cnt[array_position(st.attempt_pos, m.pos)], 0) AS attempt
    FROM st
    CROSS JOIN q
    CROSS JOIN LATERAL (
        SELECT m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at,
               m.producer_sub
        FROM comb.messages m WHERE m.partition_id = st.partition_id AND m.partition_id = $9
          AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
          AND m.pos <> ALL (st.settled)
          AND (q.delay_secs = 0 OR m.created_at <= now() - make_interval(secs => q.delay_secs))
          AND (q.retention_secs = 0
               OR m.created_at > now() - make_interval(secs => q.retention_secs))
        ORDER BY m.pos
        LIMIT $4
    ) m
),
msgs AS MATERIALIZED (
    SELECT * FROM (
        SELECT p.*, row_number() OVER (
                   ORDER BY array_position($3::uuid[], p.partition_id), p.pos) AS rank
        FROM picked p) r
    WHERE rank <= $8
),
span AS (
    -- Messages before the first one handed out that are not settled are past their queue's
    -- retention: the position moves over them.
    SELECT partition_id, max(pos) AS upto,
           CASE WHEN $6 THEN max(pos) ELSE min(pos) - 1 END AS cut,
           -- The leased ids, for the lease's digest: aggregated as they come, so the
           -- messages are grouped by hashing, not sorted (the digest sorts each lease's ids).
           array_agg(transaction_id) FILTER (WHERE NOT $6) AS ids
    FROM msgs GROUP BY partition_id
),
claimed AS (
    INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at,
     lease_digest)
    SELECT st.partition_id, $2, (SELECT max(gen) FROM comb.cursor_gens), st.ver + 1,
           greatest(st.cursor_pos, span.cut), st.cursor_seg,
           ARRAY(SELECT x FROM unnest(st.settled) x WHERE x > span.cut),
           ARRAY(SELECT a FROM unnest(st.attempt_pos) a WHERE a > span.cut),
           ARRAY(SELECT n FROM unnest(st.attempt_pos, st.attempt_cnt) AS x(a, n)
                 WHERE a > span.cut),
           CASE WHEN $6 THEN NULL ELSE $7::uuid END,
           CASE WHEN $6 THEN NULL ELSE now() + make_interval(secs => q.lease_secs) END,
           span.upto, st.available_at, clock_timestamp(),
           (SELECT sha256(convert_to(string_agg(octet_length(x)::text || ':' || x, '' ORDER BY x COLLATE "C") , 'UTF8')) FROM unnest(span.ids) x)
    FROM st
    JOIN span ON span.partition_id = st.partition_id
    CROSS JOIN q
    RETURNING partition_id, lease_id, lease_expires_at
),
leased AS MATERIALIZED (
    SELECT cl.partition_id, st.name, cl.lease_id, cl.lease_expires_at
    FROM claimed cl
    JOIN st ON st.partition_id = cl.partition_id
)
SELECT l.partition_id, l.name, l.lease_id, l.lease_expires_at,
       m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at, m.attempt,
       m.producer_sub
FROM msgs m
JOIN leased l ON l.partition_id = m.partition_id

-- @CLAIM_CITUS_FUNCTION
CREATE FUNCTION comb.claim_partition_v4(a_queue uuid, a_group text, a_ids uuid[], a_batch bigint, a_lease_secs float8, a_auto_ack boolean, a_lease uuid, a_cap bigint, a_partition uuid, a_shared boolean, a_opening boolean)
RETURNS TABLE (partition_id uuid, name text, lease_id uuid, lease_expires_at timestamptz, pos bigint, message_id uuid, transaction_id text, trace_id text, payload bytea, created_at timestamptz, attempt integer, producer_sub text, refused boolean)
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $body$
#variable_conflict use_column
BEGIN

DECLARE
    claim_partition_id comb.cursor_states.partition_id%TYPE;
    claim_consumer_group comb.cursor_states.consumer_group%TYPE;
    claim_gen comb.cursor_states.gen%TYPE;
    claim_ver comb.cursor_states.ver%TYPE;
    claim_cursor_pos comb.cursor_states.cursor_pos%TYPE;
    claim_cursor_seg comb.cursor_states.cursor_seg%TYPE;
    claim_settled comb.cursor_states.settled%TYPE;
    claim_attempt_pos comb.cursor_states.attempt_pos%TYPE;
    claim_attempt_cnt comb.cursor_states.attempt_cnt%TYPE;
    claim_lease_id comb.cursor_states.lease_id%TYPE;
    claim_lease_expires_at comb.cursor_states.lease_expires_at%TYPE;
    claim_lease_upto comb.cursor_states.lease_upto%TYPE;
    claim_available_at comb.cursor_states.available_at%TYPE;
    claim_last_claimed_at comb.cursor_states.last_claimed_at%TYPE;
    claim_lease_digest comb.cursor_states.lease_digest%TYPE;
    claim_newest_gen comb.cursor_states.gen%TYPE;
    claim_q_lease_secs float8;
    claim_q_delay_secs float8;
    claim_q_window_secs float8;
    claim_q_retention_secs float8;
BEGIN
    IF a_shared AND a_opening THEN
SELECT lease_secs, delay_secs, window_secs, retention_secs
FROM (SELECT coalesce((options->>'leaseTime')::float8, $5) AS lease_secs,
           coalesce((options->>'delayedProcessing')::float8, 0) AS delay_secs,
           coalesce((options->>'windowBuffer')::float8, 0) AS window_secs,
           comb.retention_secs(options) AS retention_secs
    FROM comb.queues WHERE id = $1) o
INTO claim_q_lease_secs, claim_q_delay_secs, claim_q_window_secs, claim_q_retention_secs;
IF NOT FOUND THEN
    RETURN;
END IF;
SELECT (SELECT max(gen) FROM comb.cursor_gens) INTO claim_newest_gen;
WITH q AS (SELECT claim_q_lease_secs AS lease_secs, claim_q_delay_secs AS delay_secs, claim_q_window_secs AS window_secs, claim_q_retention_secs AS retention_secs),
st AS MATERIALIZED (
    SELECT s.*, (SELECT p.name FROM comb.partitions p WHERE p.id = c.partition_id AND p.id = $9) AS name
    FROM (SELECT $9::uuid WHERE $9::uuid = ANY($3::uuid[])) AS c(partition_id)
    CROSS JOIN LATERAL (SELECT * FROM comb.cursor_states s
          WHERE s.partition_id = c.partition_id AND s.partition_id = $9
            AND s.consumer_group = $2
          ORDER BY s.gen DESC, s.ver DESC LIMIT 1) s
    WHERE s.lease_id IS NULL AND s.available_at <= now()
),
picked AS MATERIALIZED (
    SELECT st.partition_id, m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload,
           m.created_at, m.producer_sub,
           1 + coalesce(st.attempt_cnt[array_position(st.attempt_pos, m.pos)], 0) AS attempt
    FROM st
    CROSS JOIN q
    CROSS JOIN LATERAL (
        SELECT m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at,
               m.producer_sub
        FROM comb.messages m WHERE m.partition_id = st.partition_id AND m.partition_id = $9
          AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
          AND m.pos <> ALL (st.settled)
          AND (q.delay_secs = 0 OR m.created_at <= now() - make_interval(secs => q.delay_secs))
          AND (q.retention_secs = 0
               OR m.created_at > now() - make_interval(secs => q.retention_secs))
        ORDER BY m.pos
        LIMIT $4
    ) m
),
msgs AS MATERIALIZED (
    SELECT * FROM (
        SELECT p.*, row_number() OVER (
                   ORDER BY array_position($3::uuid[], p.partition_id), p.pos) AS rank
        FROM picked p) r
    WHERE rank <= $8
),
span AS (
    -- Messages before the first one handed out that are not settled are past their queue's
    -- retention: the position moves over them.
    SELECT partition_id, max(pos) AS upto,
           CASE WHEN $6 THEN max(pos) ELSE min(pos) - 1 END AS cut,
           -- The leased ids, for the lease's digest: aggregated as they come, so the
           -- messages are grouped by hashing, not sorted (the digest sorts each lease's ids).
           array_agg(transaction_id) FILTER (WHERE NOT $6) AS ids
    FROM msgs GROUP BY partition_id
)
SELECT st.partition_id, $2, claim_newest_gen, st.ver + 1,
           greatest(st.cursor_pos, span.cut), st.cursor_seg,
           ARRAY(SELECT x FROM unnest(st.settled) x WHERE x > span.cut),
           ARRAY(SELECT a FROM unnest(st.attempt_pos) a WHERE a > span.cut),
           ARRAY(SELECT n FROM unnest(st.attempt_pos, st.attempt_cnt) AS x(a, n)
                 WHERE a > span.cut),
           CASE WHEN $6 THEN NULL ELSE $7::uuid END,
           CASE WHEN $6 THEN NULL ELSE now() + make_interval(secs => q.lease_secs) END,
           span.upto, st.available_at, clock_timestamp(),
           (SELECT sha256(convert_to(string_agg(octet_length(x)::text || ':' || x, '' ORDER BY x COLLATE "C") , 'UTF8')) FROM unnest(span.ids) x)
    FROM st
    JOIN span ON span.partition_id = st.partition_id
    CROSS JOIN q
INTO claim_partition_id, claim_consumer_group, claim_gen, claim_ver, claim_cursor_pos, claim_cursor_seg, claim_settled, claim_attempt_pos, claim_attempt_cnt, claim_lease_id, claim_lease_expires_at, claim_lease_upto, claim_available_at, claim_last_claimed_at, claim_lease_digest;
IF NOT FOUND THEN
    RETURN;
END IF;
RETURN QUERY
WITH q AS (SELECT claim_q_lease_secs AS lease_secs, claim_q_delay_secs AS delay_secs, claim_q_window_secs AS window_secs, claim_q_retention_secs AS retention_secs),
st AS MATERIALIZED (
    SELECT s.*, (SELECT p.name FROM comb.partitions p WHERE p.id = c.partition_id AND p.id = $9) AS name
    FROM (SELECT $9::uuid WHERE $9::uuid = ANY($3::uuid[])) AS c(partition_id)
    CROSS JOIN LATERAL (SELECT * FROM comb.cursor_states s
          WHERE s.partition_id = c.partition_id AND s.partition_id = $9
            AND s.consumer_group = $2
          ORDER BY s.gen DESC, s.ver DESC LIMIT 1) s
    WHERE s.lease_id IS NULL AND s.available_at <= now()
),
picked AS MATERIALIZED (
    SELECT st.partition_id, m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload,
           m.created_at, m.producer_sub,
           1 + coalesce(st.attempt_cnt[array_position(st.attempt_pos, m.pos)], 0) AS attempt
    FROM st
    CROSS JOIN q
    CROSS JOIN LATERAL (
        SELECT m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at,
               m.producer_sub
        FROM comb.messages m WHERE m.partition_id = st.partition_id AND m.partition_id = $9
          AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
          AND m.pos <> ALL (st.settled)
          AND (q.delay_secs = 0 OR m.created_at <= now() - make_interval(secs => q.delay_secs))
          AND (q.retention_secs = 0
               OR m.created_at > now() - make_interval(secs => q.retention_secs))
          AND m.pos <= claim_lease_upto
        ORDER BY m.pos
        LIMIT $4
    ) m
),
msgs AS MATERIALIZED (
    SELECT * FROM (
        SELECT p.*, row_number() OVER (
                   ORDER BY array_position($3::uuid[], p.partition_id), p.pos) AS rank
        FROM picked p) r
    WHERE rank <= $8
),
span AS (
    -- Messages before the first one handed out that are not settled are past their queue's
    -- retention: the position moves over them.
    SELECT partition_id, max(pos) AS upto,
           CASE WHEN $6 THEN max(pos) ELSE min(pos) - 1 END AS cut,
           -- The leased ids, for the lease's digest: aggregated as they come, so the
           -- messages are grouped by hashing, not sorted (the digest sorts each lease's ids).
           array_agg(transaction_id) FILTER (WHERE NOT $6) AS ids
    FROM msgs GROUP BY partition_id
)
SELECT st.partition_id, st.name, claim_lease_id, claim_lease_expires_at,
       m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at, m.attempt,
       m.producer_sub,
       NULL::boolean
FROM msgs m
JOIN st ON st.partition_id = m.partition_id
ORDER BY m.pos;
INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at,
     lease_digest)
VALUES (claim_partition_id, claim_consumer_group, claim_gen, claim_ver, claim_cursor_pos, claim_cursor_seg, claim_settled, claim_attempt_pos, claim_attempt_cnt, claim_lease_id, claim_lease_expires_at, claim_lease_upto, claim_available_at, claim_last_claimed_at, claim_lease_digest);
    ELSIF a_shared THEN
SELECT lease_secs, delay_secs, window_secs, retention_secs
FROM (SELECT coalesce((options->>'leaseTime')::float8, $5) AS lease_secs,
           coalesce((options->>'delayedProcessing')::float8, 0) AS delay_secs,
           coalesce((options->>'windowBuffer')::float8, 0) AS window_secs,
           comb.retention_secs(options) AS retention_secs
    FROM comb.queues WHERE id = $1) o
INTO claim_q_lease_secs, claim_q_delay_secs, claim_q_window_secs, claim_q_retention_secs;
IF NOT FOUND THEN
    RETURN;
END IF;
SELECT (SELECT max(gen) FROM comb.cursor_gens) INTO claim_newest_gen;
WITH q AS (SELECT claim_q_lease_secs AS lease_secs, claim_q_delay_secs AS delay_secs, claim_q_window_secs AS window_secs, claim_q_retention_secs AS retention_secs),
st AS MATERIALIZED (
    SELECT s.*, (SELECT p.name FROM comb.partitions p WHERE p.id = c.partition_id AND p.id = $9) AS name
    FROM (SELECT $9::uuid WHERE $9::uuid = ANY($3::uuid[])) AS c(partition_id)
    CROSS JOIN LATERAL (SELECT * FROM comb.cursor_states s
          WHERE s.partition_id = c.partition_id AND s.partition_id = $9
            AND s.consumer_group = $2
          ORDER BY s.gen DESC, s.ver DESC LIMIT 1) s
    WHERE s.lease_id IS NULL AND s.available_at <= now()
),
picked AS MATERIALIZED (
    SELECT st.partition_id, m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload,
           m.created_at, m.producer_sub,
           1 + coalesce(st.attempt_cnt[array_position(st.attempt_pos, m.pos)], 0) AS attempt
    FROM st
    CROSS JOIN q
    CROSS JOIN LATERAL (
        SELECT m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at,
               m.producer_sub
        FROM comb.messages m WHERE m.partition_id = st.partition_id AND m.partition_id = $9
          AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
          AND m.pos <> ALL (st.settled)
          AND (q.delay_secs = 0 OR m.created_at <= now() - make_interval(secs => q.delay_secs))
          AND (q.retention_secs = 0
               OR m.created_at > now() - make_interval(secs => q.retention_secs))
        ORDER BY m.pos
        LIMIT $4
    ) m
),
msgs AS MATERIALIZED (
    SELECT * FROM (
        SELECT p.*, row_number() OVER (
                   ORDER BY array_position($3::uuid[], p.partition_id), p.pos) AS rank
        FROM picked p) r
    WHERE rank <= $8
),
span AS (
    -- Messages before the first one handed out that are not settled are past their queue's
    -- retention: the position moves over them.
    SELECT partition_id, max(pos) AS upto,
           CASE WHEN $6 THEN max(pos) ELSE min(pos) - 1 END AS cut,
           -- The leased ids, for the lease's digest: aggregated as they come, so the
           -- messages are grouped by hashing, not sorted (the digest sorts each lease's ids).
           array_agg(transaction_id) FILTER (WHERE NOT $6) AS ids
    FROM msgs GROUP BY partition_id
)
SELECT st.partition_id, $2, claim_newest_gen, st.ver + 1,
           greatest(st.cursor_pos, span.cut), st.cursor_seg,
           ARRAY(SELECT x FROM unnest(st.settled) x WHERE x > span.cut),
           ARRAY(SELECT a FROM unnest(st.attempt_pos) a WHERE a > span.cut),
           ARRAY(SELECT n FROM unnest(st.attempt_pos, st.attempt_cnt) AS x(a, n)
                 WHERE a > span.cut),
           CASE WHEN $6 THEN NULL ELSE $7::uuid END,
           CASE WHEN $6 THEN NULL ELSE now() + make_interval(secs => q.lease_secs) END,
           span.upto, st.available_at, clock_timestamp(),
           (SELECT sha256(convert_to(string_agg(octet_length(x)::text || ':' || x, '' ORDER BY x COLLATE "C") , 'UTF8')) FROM unnest(span.ids) x)
    FROM st
    JOIN span ON span.partition_id = st.partition_id
    CROSS JOIN q
INTO claim_partition_id, claim_consumer_group, claim_gen, claim_ver, claim_cursor_pos, claim_cursor_seg, claim_settled, claim_attempt_pos, claim_attempt_cnt, claim_lease_id, claim_lease_expires_at, claim_lease_upto, claim_available_at, claim_last_claimed_at, claim_lease_digest;
IF NOT FOUND THEN
    RETURN;
END IF;
RETURN QUERY
WITH q AS (SELECT claim_q_lease_secs AS lease_secs, claim_q_delay_secs AS delay_secs, claim_q_window_secs AS window_secs, claim_q_retention_secs AS retention_secs),
st AS MATERIALIZED (
    SELECT s.*, (SELECT p.name FROM comb.partitions p WHERE p.id = c.partition_id AND p.id = $9) AS name
    FROM (SELECT $9::uuid WHERE $9::uuid = ANY($3::uuid[])) AS c(partition_id)
    CROSS JOIN LATERAL (SELECT * FROM comb.cursor_states s
          WHERE s.partition_id = c.partition_id AND s.partition_id = $9
            AND s.consumer_group = $2
          ORDER BY s.gen DESC, s.ver DESC LIMIT 1) s
    WHERE s.lease_id IS NULL AND s.available_at <= now()
),
picked AS MATERIALIZED (
    SELECT st.partition_id, m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload,
           m.created_at, m.producer_sub,
           1 + coalesce(st.attempt_cnt[array_position(st.attempt_pos, m.pos)], 0) AS attempt
    FROM st
    CROSS JOIN q
    CROSS JOIN LATERAL (
        SELECT m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at,
               m.producer_sub
        FROM comb.messages m WHERE m.partition_id = st.partition_id AND m.partition_id = $9
          AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
          AND m.pos <> ALL (st.settled)
          AND (q.delay_secs = 0 OR m.created_at <= now() - make_interval(secs => q.delay_secs))
          AND (q.retention_secs = 0
               OR m.created_at > now() - make_interval(secs => q.retention_secs))
          AND m.pos <= claim_lease_upto
        ORDER BY m.pos
        LIMIT $4
    ) m
),
msgs AS MATERIALIZED (
    SELECT * FROM (
        SELECT p.*, row_number() OVER (
                   ORDER BY array_position($3::uuid[], p.partition_id), p.pos) AS rank
        FROM picked p) r
    WHERE rank <= $8
),
span AS (
    -- Messages before the first one handed out that are not settled are past their queue's
    -- retention: the position moves over them.
    SELECT partition_id, max(pos) AS upto,
           CASE WHEN $6 THEN max(pos) ELSE min(pos) - 1 END AS cut,
           -- The leased ids, for the lease's digest: aggregated as they come, so the
           -- messages are grouped by hashing, not sorted (the digest sorts each lease's ids).
           array_agg(transaction_id) FILTER (WHERE NOT $6) AS ids
    FROM msgs GROUP BY partition_id
)
SELECT st.partition_id, st.name, claim_lease_id, claim_lease_expires_at,
       m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at, m.attempt,
       m.producer_sub,
       CASE WHEN substr(m.payload, 1, 1) = '\x00'::bytea THEN comb.refuse_sealed_payload() END
FROM msgs m
JOIN st ON st.partition_id = m.partition_id
ORDER BY m.pos;
INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at,
     lease_digest)
VALUES (claim_partition_id, claim_consumer_group, claim_gen, claim_ver, claim_cursor_pos, claim_cursor_seg, claim_settled, claim_attempt_pos, claim_attempt_cnt, claim_lease_id, claim_lease_expires_at, claim_lease_upto, claim_available_at, claim_last_claimed_at, claim_lease_digest);
    ELSIF a_opening THEN
SELECT lease_secs, delay_secs, window_secs, retention_secs
FROM (SELECT coalesce((options->>'leaseTime')::float8, $5) AS lease_secs,
           coalesce((options->>'delayedProcessing')::float8, 0) AS delay_secs,
           coalesce((options->>'windowBuffer')::float8, 0) AS window_secs,
           comb.retention_secs(options) AS retention_secs
    FROM comb.queues WHERE id = $1) o
INTO claim_q_lease_secs, claim_q_delay_secs, claim_q_window_secs, claim_q_retention_secs;
IF NOT FOUND THEN
    RETURN;
END IF;
SELECT (SELECT max(gen) FROM comb.cursor_gens) INTO claim_newest_gen;
WITH q AS (SELECT claim_q_lease_secs AS lease_secs, claim_q_delay_secs AS delay_secs, claim_q_window_secs AS window_secs, claim_q_retention_secs AS retention_secs),
st AS MATERIALIZED (
    SELECT s.*, (SELECT p.name FROM comb.partitions p WHERE p.id = c.partition_id AND p.id = $9) AS name
    FROM (SELECT $9::uuid WHERE $9::uuid = ANY($3::uuid[])) AS c(partition_id)
    CROSS JOIN LATERAL (SELECT * FROM comb.cursor_states s
          WHERE s.partition_id = c.partition_id AND s.partition_id = $9
            AND s.consumer_group = $2
          ORDER BY s.gen DESC, s.ver DESC LIMIT 1) s
    WHERE s.lease_id IS NULL AND s.available_at <= now()
),
msgs AS MATERIALIZED (
    SELECT st.partition_id, m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload,
           m.created_at, m.producer_sub,
           1 + coalesce(st.attempt_cnt[array_position(st.attempt_pos, m.pos)], 0) AS attempt
    FROM st
    CROSS JOIN q
    CROSS JOIN LATERAL (
        SELECT m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at,
               m.producer_sub
        FROM comb.messages m WHERE m.partition_id = st.partition_id AND m.partition_id = $9
          AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
          AND m.pos <> ALL (st.settled)
          AND (q.delay_secs = 0 OR m.created_at <= now() - make_interval(secs => q.delay_secs))
          AND (q.retention_secs = 0
               OR m.created_at > now() - make_interval(secs => q.retention_secs))
        ORDER BY m.pos
        LIMIT $4
    ) m
),

span AS (
    -- Messages before the first one handed out that are not settled are past their queue's
    -- retention: the position moves over them.
    SELECT partition_id, max(pos) AS upto,
           CASE WHEN $6 THEN max(pos) ELSE min(pos) - 1 END AS cut,
           -- The leased ids, for the lease's digest: aggregated as they come, so the
           -- messages are grouped by hashing, not sorted (the digest sorts each lease's ids).
           array_agg(transaction_id) FILTER (WHERE NOT $6) AS ids
    FROM msgs GROUP BY partition_id
)
SELECT st.partition_id, $2, claim_newest_gen, st.ver + 1,
           greatest(st.cursor_pos, span.cut), st.cursor_seg,
           ARRAY(SELECT x FROM unnest(st.settled) x WHERE x > span.cut),
           ARRAY(SELECT a FROM unnest(st.attempt_pos) a WHERE a > span.cut),
           ARRAY(SELECT n FROM unnest(st.attempt_pos, st.attempt_cnt) AS x(a, n)
                 WHERE a > span.cut),
           CASE WHEN $6 THEN NULL ELSE gen_random_uuid() END,
           CASE WHEN $6 THEN NULL ELSE now() + make_interval(secs => q.lease_secs) END,
           span.upto, st.available_at, clock_timestamp(),
           (SELECT sha256(convert_to(string_agg(octet_length(x)::text || ':' || x, '' ORDER BY x COLLATE "C") , 'UTF8')) FROM unnest(span.ids) x)
    FROM st
    JOIN span ON span.partition_id = st.partition_id
    CROSS JOIN q
INTO claim_partition_id, claim_consumer_group, claim_gen, claim_ver, claim_cursor_pos, claim_cursor_seg, claim_settled, claim_attempt_pos, claim_attempt_cnt, claim_lease_id, claim_lease_expires_at, claim_lease_upto, claim_available_at, claim_last_claimed_at, claim_lease_digest;
IF NOT FOUND THEN
    RETURN;
END IF;
RETURN QUERY
WITH q AS (SELECT claim_q_lease_secs AS lease_secs, claim_q_delay_secs AS delay_secs, claim_q_window_secs AS window_secs, claim_q_retention_secs AS retention_secs),
st AS MATERIALIZED (
    SELECT s.*, (SELECT p.name FROM comb.partitions p WHERE p.id = c.partition_id AND p.id = $9) AS name
    FROM (SELECT $9::uuid WHERE $9::uuid = ANY($3::uuid[])) AS c(partition_id)
    CROSS JOIN LATERAL (SELECT * FROM comb.cursor_states s
          WHERE s.partition_id = c.partition_id AND s.partition_id = $9
            AND s.consumer_group = $2
          ORDER BY s.gen DESC, s.ver DESC LIMIT 1) s
    WHERE s.lease_id IS NULL AND s.available_at <= now()
),
msgs AS MATERIALIZED (
    SELECT st.partition_id, m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload,
           m.created_at, m.producer_sub,
           1 + coalesce(st.attempt_cnt[array_position(st.attempt_pos, m.pos)], 0) AS attempt
    FROM st
    CROSS JOIN q
    CROSS JOIN LATERAL (
        SELECT m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at,
               m.producer_sub
        FROM comb.messages m WHERE m.partition_id = st.partition_id AND m.partition_id = $9
          AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
          AND m.pos <> ALL (st.settled)
          AND (q.delay_secs = 0 OR m.created_at <= now() - make_interval(secs => q.delay_secs))
          AND (q.retention_secs = 0
               OR m.created_at > now() - make_interval(secs => q.retention_secs))
          AND m.pos <= claim_lease_upto
        ORDER BY m.pos
        LIMIT $4
    ) m
),

span AS (
    -- Messages before the first one handed out that are not settled are past their queue's
    -- retention: the position moves over them.
    SELECT partition_id, max(pos) AS upto,
           CASE WHEN $6 THEN max(pos) ELSE min(pos) - 1 END AS cut,
           -- The leased ids, for the lease's digest: aggregated as they come, so the
           -- messages are grouped by hashing, not sorted (the digest sorts each lease's ids).
           array_agg(transaction_id) FILTER (WHERE NOT $6) AS ids
    FROM msgs GROUP BY partition_id
)
SELECT st.partition_id, st.name, claim_lease_id, claim_lease_expires_at,
       m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at, m.attempt,
       m.producer_sub,
       NULL::boolean
FROM msgs m
JOIN st ON st.partition_id = m.partition_id
ORDER BY m.pos;
INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at,
     lease_digest)
VALUES (claim_partition_id, claim_consumer_group, claim_gen, claim_ver, claim_cursor_pos, claim_cursor_seg, claim_settled, claim_attempt_pos, claim_attempt_cnt, claim_lease_id, claim_lease_expires_at, claim_lease_upto, claim_available_at, claim_last_claimed_at, claim_lease_digest);
    ELSE
SELECT lease_secs, delay_secs, window_secs, retention_secs
FROM (SELECT coalesce((options->>'leaseTime')::float8, $5) AS lease_secs,
           coalesce((options->>'delayedProcessing')::float8, 0) AS delay_secs,
           coalesce((options->>'windowBuffer')::float8, 0) AS window_secs,
           comb.retention_secs(options) AS retention_secs
    FROM comb.queues WHERE id = $1) o
INTO claim_q_lease_secs, claim_q_delay_secs, claim_q_window_secs, claim_q_retention_secs;
IF NOT FOUND THEN
    RETURN;
END IF;
SELECT (SELECT max(gen) FROM comb.cursor_gens) INTO claim_newest_gen;
WITH q AS (SELECT claim_q_lease_secs AS lease_secs, claim_q_delay_secs AS delay_secs, claim_q_window_secs AS window_secs, claim_q_retention_secs AS retention_secs),
st AS MATERIALIZED (
    SELECT s.*, (SELECT p.name FROM comb.partitions p WHERE p.id = c.partition_id AND p.id = $9) AS name
    FROM (SELECT $9::uuid WHERE $9::uuid = ANY($3::uuid[])) AS c(partition_id)
    CROSS JOIN LATERAL (SELECT * FROM comb.cursor_states s
          WHERE s.partition_id = c.partition_id AND s.partition_id = $9
            AND s.consumer_group = $2
          ORDER BY s.gen DESC, s.ver DESC LIMIT 1) s
    WHERE s.lease_id IS NULL AND s.available_at <= now()
),
msgs AS MATERIALIZED (
    SELECT st.partition_id, m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload,
           m.created_at, m.producer_sub,
           1 + coalesce(st.attempt_cnt[array_position(st.attempt_pos, m.pos)], 0) AS attempt
    FROM st
    CROSS JOIN q
    CROSS JOIN LATERAL (
        SELECT m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at,
               m.producer_sub
        FROM comb.messages m WHERE m.partition_id = st.partition_id AND m.partition_id = $9
          AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
          AND m.pos <> ALL (st.settled)
          AND (q.delay_secs = 0 OR m.created_at <= now() - make_interval(secs => q.delay_secs))
          AND (q.retention_secs = 0
               OR m.created_at > now() - make_interval(secs => q.retention_secs))
        ORDER BY m.pos
        LIMIT $4
    ) m
),

span AS (
    -- Messages before the first one handed out that are not settled are past their queue's
    -- retention: the position moves over them.
    SELECT partition_id, max(pos) AS upto,
           CASE WHEN $6 THEN max(pos) ELSE min(pos) - 1 END AS cut,
           -- The leased ids, for the lease's digest: aggregated as they come, so the
           -- messages are grouped by hashing, not sorted (the digest sorts each lease's ids).
           array_agg(transaction_id) FILTER (WHERE NOT $6) AS ids
    FROM msgs GROUP BY partition_id
)
SELECT st.partition_id, $2, claim_newest_gen, st.ver + 1,
           greatest(st.cursor_pos, span.cut), st.cursor_seg,
           ARRAY(SELECT x FROM unnest(st.settled) x WHERE x > span.cut),
           ARRAY(SELECT a FROM unnest(st.attempt_pos) a WHERE a > span.cut),
           ARRAY(SELECT n FROM unnest(st.attempt_pos, st.attempt_cnt) AS x(a, n)
                 WHERE a > span.cut),
           CASE WHEN $6 THEN NULL ELSE gen_random_uuid() END,
           CASE WHEN $6 THEN NULL ELSE now() + make_interval(secs => q.lease_secs) END,
           span.upto, st.available_at, clock_timestamp(),
           (SELECT sha256(convert_to(string_agg(octet_length(x)::text || ':' || x, '' ORDER BY x COLLATE "C") , 'UTF8')) FROM unnest(span.ids) x)
    FROM st
    JOIN span ON span.partition_id = st.partition_id
    CROSS JOIN q
INTO claim_partition_id, claim_consumer_group, claim_gen, claim_ver, claim_cursor_pos, claim_cursor_seg, claim_settled, claim_attempt_pos, claim_attempt_cnt, claim_lease_id, claim_lease_expires_at, claim_lease_upto, claim_available_at, claim_last_claimed_at, claim_lease_digest;
IF NOT FOUND THEN
    RETURN;
END IF;
RETURN QUERY
WITH q AS (SELECT claim_q_lease_secs AS lease_secs, claim_q_delay_secs AS delay_secs, claim_q_window_secs AS window_secs, claim_q_retention_secs AS retention_secs),
st AS MATERIALIZED (
    SELECT s.*, (SELECT p.name FROM comb.partitions p WHERE p.id = c.partition_id AND p.id = $9) AS name
    FROM (SELECT $9::uuid WHERE $9::uuid = ANY($3::uuid[])) AS c(partition_id)
    CROSS JOIN LATERAL (SELECT * FROM comb.cursor_states s
          WHERE s.partition_id = c.partition_id AND s.partition_id = $9
            AND s.consumer_group = $2
          ORDER BY s.gen DESC, s.ver DESC LIMIT 1) s
    WHERE s.lease_id IS NULL AND s.available_at <= now()
),
msgs AS MATERIALIZED (
    SELECT st.partition_id, m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload,
           m.created_at, m.producer_sub,
           1 + coalesce(st.attempt_cnt[array_position(st.attempt_pos, m.pos)], 0) AS attempt
    FROM st
    CROSS JOIN q
    CROSS JOIN LATERAL (
        SELECT m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at,
               m.producer_sub
        FROM comb.messages m WHERE m.partition_id = st.partition_id AND m.partition_id = $9
          AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
          AND m.pos <> ALL (st.settled)
          AND (q.delay_secs = 0 OR m.created_at <= now() - make_interval(secs => q.delay_secs))
          AND (q.retention_secs = 0
               OR m.created_at > now() - make_interval(secs => q.retention_secs))
          AND m.pos <= claim_lease_upto
        ORDER BY m.pos
        LIMIT $4
    ) m
),

span AS (
    -- Messages before the first one handed out that are not settled are past their queue's
    -- retention: the position moves over them.
    SELECT partition_id, max(pos) AS upto,
           CASE WHEN $6 THEN max(pos) ELSE min(pos) - 1 END AS cut,
           -- The leased ids, for the lease's digest: aggregated as they come, so the
           -- messages are grouped by hashing, not sorted (the digest sorts each lease's ids).
           array_agg(transaction_id) FILTER (WHERE NOT $6) AS ids
    FROM msgs GROUP BY partition_id
)
SELECT st.partition_id, st.name, claim_lease_id, claim_lease_expires_at,
       m.pos, m.message_id, m.transaction_id, m.trace_id, m.payload, m.created_at, m.attempt,
       m.producer_sub,
       CASE WHEN substr(m.payload, 1, 1) = '\x00'::bytea THEN comb.refuse_sealed_payload() END
FROM msgs m
JOIN st ON st.partition_id = m.partition_id
ORDER BY m.pos;
INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at,
     lease_digest)
VALUES (claim_partition_id, claim_consumer_group, claim_gen, claim_ver, claim_cursor_pos, claim_cursor_seg, claim_settled, claim_attempt_pos, claim_attempt_cnt, claim_lease_id, claim_lease_expires_at, claim_lease_upto, claim_available_at, claim_last_claimed_at, claim_lease_digest);
    END IF;
END;
END $body$

-- @CLAIM_CITUS_CALL
SELECT * FROM comb.claim_partition_v4(
    $1::uuid, $2::text, $3::uuid[], $4::bigint, $5::float8, $6::boolean, $7::uuid, $8::bigint,
    $9::uuid, $10::boolean, $11::boolean)

-- @RELOCK_SQL
SELECT c.partition_id FROM comb.cursors c
WHERE c.partition_id = ANY($1) AND c.consumer_group = $2
ORDER BY c.partition_id
FOR NO KEY UPDATE OF c SKIP LOCKED

-- @RELOCK_CITUS_SQL
SELECT c.partition_id FROM comb.cursors c
WHERE c.partition_id = ANY($1) AND c.partition_id = $3 AND c.consumer_group = $2
ORDER BY c.partition_id
FOR NO KEY UPDATE OF c SKIP LOCKED

