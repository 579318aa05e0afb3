-- The whole schema `comb` as the migrations in `migrations/` leave it: every table, index,
-- function and view once, in its current form. Generated, never edited by hand: a new
-- migration changes it, and `cargo test -p comb --test suite -- migrate::schema_sql` fails
-- until it is written again with
--     COMB_WRITE_SCHEMA=1 cargo test -p comb --test suite -- migrate::schema_sql
-- It is `pg_dump --schema-only --schema=comb` of a freshly migrated database without owners,
-- privileges, session settings and pg_dump's own comments. Left out: the leaf tables of the
-- partitioned tables (`messages_<seg>`, `cursor_states_<gen>`, `<table>_<yyyymmdd>`), which
-- maintenance makes and drops as time passes.
CREATE SCHEMA comb;

CREATE FUNCTION comb.claimable_now(p uuid, after bigint, from_seg integer, window_secs double precision, retention_secs double precision, delay_secs double precision) RETURNS boolean
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    head_at timestamptz;
    next_at timestamptz;
BEGIN
    IF window_secs > 0 OR retention_secs > 0 THEN
        SELECT h.at INTO head_at FROM comb.partition_head(p) h;
        IF window_secs > 0
           AND (head_at <= now() - make_interval(secs => window_secs)) IS NOT TRUE THEN
            RETURN false;
        END IF;
        IF retention_secs > 0
           AND (head_at > now() - make_interval(secs => retention_secs)) IS NOT TRUE THEN
            RETURN false;
        END IF;
    END IF;
    IF delay_secs > 0 THEN
        SELECT m.created_at INTO next_at FROM comb.messages m
        WHERE m.partition_id = p AND m.pos > after AND m.seg >= from_seg
        ORDER BY m.pos LIMIT 1;
        IF (next_at <= now() - make_interval(secs => delay_secs)) IS NOT TRUE THEN
            RETURN false;
        END IF;
    END IF;
    RETURN true;
END $$;

CREATE FUNCTION comb.complete_acks_v4(a_partitions uuid[], a_groups text[], a_leases uuid[], a_txids text[], a_lo integer[], a_hi integer[], a_digests bytea[]) RETURNS TABLE(partition_id uuid, consumer_group text, released boolean, partition text, queue text)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_bitmapscan TO 'off'
    AS $_$
#variable_conflict use_column
DECLARE
    st record;
    found_n bigint;
    acked_pos bigint;
    acked_seg integer;
    next_pos bigint;
BEGIN
    IF cardinality(a_txids) = 1 THEN
        PERFORM 1 FROM comb.cursors WHERE partition_id = a_partitions[1] AND consumer_group = a_groups[1]
FOR NO KEY UPDATE;
        SELECT s.* INTO st FROM comb.cursor_state(a_partitions[1], a_groups[1]) s;
        IF FOUND AND st.lease_id IS NOT NULL AND st.lease_expires_at > now()
           AND (a_leases[1] IS NULL OR a_leases[1] = st.lease_id)
           AND cardinality(st.settled) = 0 AND cardinality(st.attempt_pos) = 0 THEN
            SELECT count(*), min(m.pos), min(m.seg) INTO found_n, acked_pos, acked_seg
            FROM comb.messages m WHERE m.partition_id = a_partitions[1]
              AND m.transaction_id = a_txids[1]
              AND m.pos > st.cursor_pos AND m.pos <= st.lease_upto AND m.seg >= st.cursor_seg;
            IF found_n = 1 THEN
                next_pos := CASE WHEN acked_pos = st.cursor_pos + 1 THEN acked_pos
                                 ELSE st.cursor_pos END;
                INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at)
                VALUES (st.partition_id, st.consumer_group, (SELECT max(gen) FROM comb.cursor_gens), st.ver + 1,
                        next_pos,
                        CASE WHEN acked_pos <= next_pos THEN greatest(st.cursor_seg, acked_seg)
                             ELSE st.cursor_seg END,
                        CASE WHEN acked_pos > next_pos THEN ARRAY[acked_pos]
                             ELSE st.settled END,
                        st.attempt_pos, st.attempt_cnt,
                        CASE WHEN next_pos >= st.lease_upto THEN NULL ELSE st.lease_id END,
                        CASE WHEN next_pos >= st.lease_upto THEN NULL
                             ELSE st.lease_expires_at END,
                        st.lease_upto, st.available_at, st.last_claimed_at);
                RETURN QUERY SELECT st.partition_id, st.consumer_group,
                                    next_pos >= st.lease_upto, p.name, q.name
                    FROM (SELECT st.partition_id) AS w(partition_id)
                    JOIN comb.partitions p ON p.id = w.partition_id
JOIN comb.queues q ON q.id = p.queue_id;
                RETURN;
            END IF;
        END IF;
    END IF;
    PERFORM 1 FROM (
SELECT c.partition_id FROM comb.cursors c
WHERE (c.partition_id, c.consumer_group) IN (SELECT * FROM unnest($1::uuid[], $2::text[]))
ORDER BY c.partition_id, c.consumer_group
FOR NO KEY UPDATE OF c) l;
    RETURN QUERY
WITH c AS (
    SELECT i.partition_id, i.consumer_group, i.lease_id, ($4::text[])[i.lo:i.hi] AS txids,
           i.digest
    FROM unnest($1::uuid[], $2::text[], $3::uuid[], $5::int[], $6::int[], $7::bytea[])
        AS i(partition_id, consumer_group, lease_id, lo, hi, digest)
),
judged AS MATERIALIZED (
    SELECT c.partition_id, c.consumer_group, s.ver, s.cursor_pos, s.cursor_seg, s.settled,
           s.attempt_pos, s.attempt_cnt, s.lease_id, s.lease_expires_at, s.lease_upto,
           s.available_at, s.last_claimed_at, f.pos AS acked, f.seg AS acked_seg, f.base,
           CASE WHEN f.whole THEN ARRAY(SELECT x FROM unnest(s.settled) x
                                         WHERE x > s.lease_upto ORDER BY x)
                WHEN cardinality(s.settled) = 0 THEN f.pos
                ELSE ARRAY(SELECT DISTINCT x FROM unnest(s.settled || f.pos) x ORDER BY x)
           END AS merged
    FROM c
    CROSS JOIN LATERAL comb.cursor_state(c.partition_id, c.consumer_group) s
    CROSS JOIN LATERAL (
        -- The lease's digest, set by its claim, kept only while nothing moved the cursor:
        -- the acked ids are
        -- exactly the lease's, every message of it is settled, and the position moves from
        -- its last one (`base`, with its segment) over what was settled beyond. No message
        -- is read but that last one's segment, and the branches below never run.
        SELECT ARRAY[s.lease_upto] AS pos,
               ARRAY[coalesce((SELECT m.seg FROM comb.messages m WHERE m.partition_id = c.partition_id
                                 AND m.pos = s.lease_upto AND m.seg >= s.cursor_seg LIMIT 1),
                              s.cursor_seg)] AS seg,
               cardinality(c.txids)::bigint AS found, s.lease_upto AS base, true AS whole
        WHERE s.lease_digest = c.digest
        UNION ALL
        -- The lease's whole range, read when the ack names as many messages as it spans:
        -- taken when its messages are exactly the acked ones (compared sorted), and then
        -- the probe below never runs (`LIMIT 1`).
        SELECT w.pos, w.seg, w.found, s.cursor_pos, false FROM (
            SELECT array_agg(m.pos) AS pos, array_agg(m.seg) AS seg, count(*) AS found,
                   array_agg(m.transaction_id ORDER BY m.transaction_id COLLATE "C") AS txids
            FROM (
                SELECT m.pos, m.seg, m.transaction_id FROM comb.messages m WHERE m.partition_id = c.partition_id
                  AND m.pos > s.cursor_pos AND m.pos <= s.lease_upto AND m.seg >= s.cursor_seg
                  AND cardinality(c.txids) = s.lease_upto - s.cursor_pos
                ORDER BY m.pos
            ) m
        ) w WHERE w.txids = c.txids
        UNION ALL
        -- Aggregated in the order the subquery sorts them: one sort for both arrays.
        SELECT array_agg(m.pos) AS pos, array_agg(m.seg) AS seg, count(*) AS found,
               s.cursor_pos, false
        FROM (
            SELECT m.pos, m.seg FROM comb.messages m WHERE m.partition_id = c.partition_id AND m.transaction_id = ANY (c.txids)
              AND m.pos > s.cursor_pos AND m.pos <= s.lease_upto AND m.seg >= s.cursor_seg
            ORDER BY m.pos
        ) m
        LIMIT 1
    ) f
    WHERE s.lease_id IS NOT NULL AND s.lease_expires_at > now()
      AND (c.lease_id IS NULL OR s.lease_id = c.lease_id)
      AND f.found = cardinality(c.txids)
      AND NOT (f.pos && s.settled)
),
moved AS (
    SELECT j.*, j.base + r.run AS next_pos
    FROM judged j
    CROSS JOIN LATERAL (
        -- Settled positions are distinct and above the base (the position, or the lease's
        -- last message when it is settled whole), so the k-th equals base + k exactly along
        -- the run that starts right after it.
        SELECT coalesce(max(x.k), 0) AS run
        FROM unnest(j.merged) WITH ORDINALITY AS x(p, k)
        WHERE x.p = j.base + x.k
    ) r
),
written AS (
    INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at)
    SELECT m.partition_id, m.consumer_group, (SELECT max(gen) FROM comb.cursor_gens), m.ver + 1,
           m.next_pos,
           greatest(m.cursor_seg, (SELECT max(a.seg) FROM unnest(m.acked, m.acked_seg)
                                       AS a(pos, seg) WHERE a.pos <= m.next_pos)),
           ARRAY(SELECT x FROM unnest(m.merged) x WHERE x > m.next_pos),
           ARRAY(SELECT a FROM unnest(m.attempt_pos) a WHERE a > m.next_pos),
           ARRAY(SELECT n FROM unnest(m.attempt_pos, m.attempt_cnt) AS x(a, n)
                 WHERE a > m.next_pos),
           CASE WHEN m.next_pos >= m.lease_upto THEN NULL ELSE m.lease_id END,
           CASE WHEN m.next_pos >= m.lease_upto THEN NULL ELSE m.lease_expires_at END,
           m.lease_upto, m.available_at, m.last_claimed_at
    FROM moved m
    RETURNING partition_id, consumer_group, lease_id IS NULL AS released
)
SELECT w.partition_id, w.consumer_group, w.released, p.name AS partition, q.name AS queue
FROM written w
JOIN comb.partitions p ON p.id = w.partition_id
JOIN comb.queues q ON q.id = p.queue_id;
END $_$;

CREATE FUNCTION comb.completed_retention_secs(options jsonb) RETURNS double precision
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN (options->>'retentionEnabled')::boolean IS FALSE THEN 0::float8
                ELSE coalesce((options->>'completedRetentionSeconds')::float8, 0) END
$$;

CREATE FUNCTION comb.cursor_lag(p uuid, g text) RETURNS TABLE(cursor_pos bigint, head bigint, lag bigint, oldest_unsettled_at timestamp with time zone, lease_id uuid, lease_expires_at timestamp with time zone, last_claimed_at timestamp with time zone)
    LANGUAGE sql STABLE
    AS $$
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

CREATE TABLE comb.cursor_states (
    partition_id uuid NOT NULL,
    consumer_group text NOT NULL,
    gen integer NOT NULL,
    ver bigint NOT NULL,
    cursor_pos bigint DEFAULT 0 NOT NULL,
    cursor_seg integer DEFAULT 0 NOT NULL,
    settled bigint[] DEFAULT '{}'::bigint[] NOT NULL,
    attempt_pos bigint[] DEFAULT '{}'::bigint[] NOT NULL,
    attempt_cnt integer[] DEFAULT '{}'::integer[] NOT NULL,
    lease_id uuid,
    lease_expires_at timestamp with time zone,
    lease_upto bigint DEFAULT 0 NOT NULL,
    available_at timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL,
    last_claimed_at timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL,
    lease_digest bytea
)
PARTITION BY RANGE (gen);
ALTER TABLE ONLY comb.cursor_states ALTER COLUMN partition_id SET (n_distinct=1);

CREATE FUNCTION comb.cursor_state(p uuid, g text) RETURNS SETOF comb.cursor_states
    LANGUAGE sql STABLE
    AS $$
    SELECT * FROM comb.cursor_states s
    WHERE s.partition_id = p AND s.consumer_group = g
    ORDER BY s.gen DESC, s.ver DESC LIMIT 1
$$;

CREATE FUNCTION comb.group_figures(queue_ids uuid[], groups text[], live_budget bigint) RETURNS TABLE(queue_id uuid, consumer_group text, partitions bigint, lag bigint, oldest_unsettled_at timestamp with time zone, leased bigint, figures_at timestamp with time zone, live boolean)
    LANGUAGE sql STABLE
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $$
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

CREATE FUNCTION comb.group_live(q uuid, g text) RETURNS TABLE(partitions bigint, lag bigint, oldest_unsettled_at timestamp with time zone, leased bigint)
    LANGUAGE sql STABLE
    AS $$
    SELECT count(*), coalesce(sum(x.lag), 0)::bigint, min(x.oldest_unsettled_at),
           count(x.lease_id)
    FROM comb.cursors c CROSS JOIN LATERAL comb.cursor_lag(c.partition_id, c.consumer_group) x
    WHERE c.queue_id = q AND c.consumer_group = g
$$;

CREATE FUNCTION comb.hand_off_v4(a_partitions uuid[], a_groups text[], a_leases uuid[], a_lengths double precision[], a_batches bigint[], a_ids uuid[]) RETURNS TABLE(partition_id uuid, consumer_group text, lease_id uuid, pos bigint, message_id uuid, created_at timestamp with time zone)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_bitmapscan TO 'off'
    AS $_$
#variable_conflict use_column
DECLARE
    held_partitions uuid[];
    held_groups text[];
BEGIN
    SELECT array_agg(l.partition_id), array_agg(l.consumer_group)
        INTO held_partitions, held_groups
        FROM (
SELECT c.partition_id, c.consumer_group FROM comb.cursors c
WHERE (c.partition_id, c.consumer_group) IN (SELECT * FROM unnest($1::uuid[], $2::text[]))
ORDER BY c.partition_id, c.consumer_group
FOR NO KEY UPDATE OF c SKIP LOCKED) l;
    IF held_partitions IS NULL THEN
        RETURN;
    END IF;
    SELECT array_agg(w.p), array_agg(w.g), array_agg(w.l), array_agg(w.d), array_agg(w.b)
        INTO a_partitions, a_groups, a_leases, a_lengths, a_batches
        FROM unnest(a_partitions, a_groups, a_leases, a_lengths, a_batches)
            AS w(p, g, l, d, b)
        WHERE (w.p, w.g) IN (SELECT * FROM unnest(held_partitions, held_groups));
    RETURN QUERY
WITH w AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::float8[], $5::int8[])
        AS w(partition_id, consumer_group, lease_id, default_lease, batch)
),
st AS MATERIALIZED (
    SELECT w.lease_id AS new_lease, w.default_lease, w.batch, o.options, s.*
    FROM w
    CROSS JOIN LATERAL comb.cursor_state(w.partition_id, w.consumer_group) s
    CROSS JOIN LATERAL (SELECT (SELECT q.options FROM comb.partitions p JOIN comb.queues q ON q.id = p.queue_id
             WHERE p.id = w.partition_id) AS options) o
    WHERE s.lease_id IS NULL AND s.available_at <= now()
      AND cardinality(s.settled) = 0 AND cardinality(s.attempt_pos) = 0
      AND coalesce((o.options->>'delayedProcessing')::float8, 0) = 0
      AND coalesce((o.options->>'windowBuffer')::float8, 0) = 0
),
picked AS MATERIALIZED (
    SELECT st.partition_id, st.consumer_group, m.pos, m.message_id, m.created_at
    FROM st
    CROSS JOIN LATERAL (
        SELECT m.pos, m.message_id, m.created_at
        FROM comb.messages m WHERE m.partition_id = st.partition_id
          AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
        ORDER BY m.pos
        LIMIT st.batch
    ) m
),
ok AS (
    -- The next message is this push's, so every one after it is too (they are the newest).
    SELECT partition_id, consumer_group, max(pos) AS upto
    FROM picked
    GROUP BY partition_id, consumer_group
    HAVING bool_and(message_id = ANY($6::uuid[]))
),
granted AS (
    INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at)
    SELECT st.partition_id, st.consumer_group, (SELECT max(gen) FROM comb.cursor_gens), st.ver + 1,
           st.cursor_pos, st.cursor_seg, st.settled, st.attempt_pos, st.attempt_cnt,
           st.new_lease,
           now() + make_interval(secs => coalesce((st.options->>'leaseTime')::float8,
                                                  st.default_lease)),
           ok.upto, st.available_at, clock_timestamp()
    FROM st
    JOIN ok ON ok.partition_id = st.partition_id AND ok.consumer_group = st.consumer_group
    RETURNING partition_id, consumer_group, lease_id
)
SELECT g.partition_id, g.consumer_group, g.lease_id, p.pos, p.message_id, p.created_at
FROM granted g
JOIN picked p ON p.partition_id = g.partition_id AND p.consumer_group = g.consumer_group;
END $_$;

CREATE FUNCTION comb.iso(t timestamp with time zone) RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
$$;

CREATE FUNCTION comb.lagging_cursors(q uuid, g text, min_secs double precision) RETURNS TABLE(partition_id uuid, lag bigint, oldest_unsettled_at timestamp with time zone)
    LANGUAGE sql STABLE
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $$
    SELECT c.partition_id, x.lag, x.oldest_unsettled_at
    FROM comb.cursors c CROSS JOIN LATERAL comb.cursor_lag(c.partition_id, c.consumer_group) x
    WHERE c.queue_id = q AND c.consumer_group = g AND x.lag > 0
      AND x.oldest_unsettled_at <= now() - make_interval(secs => min_secs)
$$;

CREATE FUNCTION comb.latest_snapshot(OUT day date, OUT minute timestamp with time zone) RETURNS record
    LANGUAGE sql STABLE
    AS $$
    SELECT m.day, m.minute FROM comb.queue_minutes m
    WHERE m.day >= (now() AT TIME ZONE 'UTC')::date - 1
      AND m.minute > now() - interval '5 minutes'
      AND m.taken_at IS NOT NULL
    ORDER BY m.day DESC, m.minute DESC LIMIT 1
$$;

CREATE FUNCTION comb.partition_head(p uuid) RETURNS TABLE(pos bigint, at timestamp with time zone)
    LANGUAGE sql STABLE
    AS $$
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

CREATE FUNCTION comb.partition_stats(p uuid) RETURNS TABLE(head bigint, head_at timestamp with time zone, pending bigint, processing bigint, oldest_pending_at timestamp with time zone, groups bigint)
    LANGUAGE sql STABLE
    AS $$
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

CREATE FUNCTION comb.payload_json(p bytea) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF length(p) > 0 AND get_byte(p, 0) = 0 THEN
        RETURN jsonb_build_object('encrypted', true);
    END IF;
    RETURN convert_from(p, 'UTF8')::jsonb;
EXCEPTION WHEN OTHERS THEN
    RETURN to_jsonb('payload not shown: ' || SQLERRM);
END
$$;

CREATE FUNCTION comb.queue_figures(ids uuid[], live_budget bigint) RETURNS TABLE(queue_id uuid, partitions bigint, total bigint, pending bigint, processing bigint, dead_letters bigint, oldest_pending_at timestamp with time zone, last_message_at timestamp with time zone, figures_at timestamp with time zone, live boolean)
    LANGUAGE sql STABLE
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $$
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

CREATE FUNCTION comb.queue_live(q uuid) RETURNS TABLE(partitions bigint, total bigint, pending bigint, processing bigint, oldest_pending_at timestamp with time zone, last_message_at timestamp with time zone, dead_letters bigint)
    LANGUAGE sql STABLE
    AS $$
    SELECT count(*), coalesce(sum(s.head), 0)::bigint, coalesce(sum(s.pending), 0)::bigint,
           coalesce(sum(s.processing), 0)::bigint, min(s.oldest_pending_at), max(s.head_at),
           (SELECT count(*) FROM comb.dead_letters d
            WHERE d.queue_id = q
              AND NOT EXISTS (SELECT 1 FROM comb.dead_letter_requeues r
                              WHERE r.dead_letter_id = d.id))
    FROM comb.partitions p CROSS JOIN LATERAL comb.partition_stats(p.id) s
    WHERE p.queue_id = q
$$;

CREATE FUNCTION comb.refuse_sealed_payload() RETURNS boolean
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'a sealed payload in a claim that commits before opening it'
        USING ERRCODE = 'CB001';
END
$$;

CREATE FUNCTION comb.retention_secs(options jsonb) RETURNS double precision
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN (options->>'retentionEnabled')::boolean IS FALSE THEN 0::float8
                ELSE coalesce(least(nullif((options->>'retentionSeconds')::float8, 0),
                                    nullif((options->>'ttl')::float8, 0)), 0) END
$$;

CREATE FUNCTION comb.store_batch_v4(a_lock uuid[], a_partitions uuid[], a_ranks bigint[], a_ids uuid[], a_txids text[], a_traces text[], a_payloads bytea[], a_subs text[], a_checks boolean[], o_partitions uuid[], o_groups text[], o_leases uuid[], o_lengths double precision[], o_batches bigint[]) RETURNS TABLE(partition_id uuid, ord bigint, prior_id uuid, stored boolean, consumer_group text, lease_id uuid, pos bigint, message_id uuid, created_at timestamp with time zone)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_bitmapscan TO 'off'
    AS $$
#variable_conflict use_column
DECLARE
    one_prior uuid;
    st record;
    opts jsonb;
    msg record;
    picked_pos bigint[] := '{}';
    picked_ids uuid[] := '{}';
    picked_at timestamptz[] := '{}';
BEGIN
    IF a_checks IS NULL THEN
        RETURN QUERY SELECT l.id, NULL::bigint, NULL::uuid, NULL::boolean, NULL::text,
            NULL::uuid, NULL::bigint, NULL::uuid, NULL::timestamptz
            FROM (SELECT id FROM comb.partitions WHERE id = ANY(a_lock) ORDER BY id FOR NO KEY UPDATE) l;
        IF cardinality(a_ids) > 1 THEN

INSERT INTO comb.messages
    (partition_id, pos, seg, message_id, transaction_id, trace_id, payload, created_at,
     producer_sub)
SELECT i.partition_id, h.pos + i.rank, s.seg, i.message_id, i.transaction_id, i.trace_id,
       i.payload, statement_timestamp(), i.producer_sub
FROM unnest(a_partitions::uuid[], a_ranks::bigint[], a_ids::uuid[], a_txids::text[], a_traces::text[], a_payloads::bytea[],
            a_subs::text[])
    AS i(partition_id, rank, message_id, transaction_id, trace_id, payload, producer_sub)
JOIN (
    SELECT p.id, coalesce((SELECT m.pos FROM comb.messages m WHERE m.partition_id = p.id AND m.seg >= (SELECT min(s.seg) FROM comb.segments s WHERE NOT s.summarized) AND m.seg <= (SELECT max(s.seg) FROM comb.segments s) ORDER BY m.pos DESC LIMIT 1), (SELECT sp.max_pos FROM comb.segment_partitions sp WHERE sp.partition_id = p.id ORDER BY sp.seg DESC LIMIT 1), 0) AS pos
    FROM comb.partitions p WHERE p.id = ANY(a_lock)
) h ON h.id = i.partition_id
CROSS JOIN (SELECT max(seg) AS seg FROM comb.segments) s;
        ELSIF FOUND THEN
            INSERT INTO comb.messages
    (partition_id, pos, seg, message_id, transaction_id, trace_id, payload, created_at,
     producer_sub)
VALUES (a_partitions[1], coalesce((SELECT m.pos FROM comb.messages m WHERE m.partition_id = a_partitions[1] AND m.seg >= (SELECT min(s.seg) FROM comb.segments s WHERE NOT s.summarized) AND m.seg <= (SELECT max(s.seg) FROM comb.segments s) ORDER BY m.pos DESC LIMIT 1), (SELECT sp.max_pos FROM comb.segment_partitions sp WHERE sp.partition_id = a_partitions[1] ORDER BY sp.seg DESC LIMIT 1), 0) + a_ranks[1], (SELECT max(seg) FROM comb.segments), a_ids[1], a_txids[1], a_traces[1], a_payloads[1], statement_timestamp(), a_subs[1]);
        END IF;
    ELSE
        PERFORM 1 FROM (SELECT id FROM comb.partitions WHERE id = ANY(a_lock) ORDER BY id FOR NO KEY UPDATE) l;
        IF cardinality(a_ids) > 1 THEN
            RETURN QUERY
WITH input AS (
    SELECT * FROM unnest(a_partitions::uuid[], a_txids::text[], a_ids::uuid[], a_traces::text[], a_payloads::bytea[], a_checks::bool[],
                         a_subs::text[])
        WITH ORDINALITY AS t(partition_id, transaction_id, message_id, trace_id, payload, check_dup,
                             producer_sub, ord)
),
prior AS (
    SELECT i.ord, m.message_id
    FROM input i
    CROSS JOIN LATERAL (
        SELECT m.message_id FROM comb.messages m
        WHERE m.partition_id = i.partition_id AND m.transaction_id = i.transaction_id
        LIMIT 1
    ) m
    WHERE i.check_dup
),
fresh AS (
    SELECT i.*, row_number() OVER (PARTITION BY i.partition_id ORDER BY i.ord) AS rn
    FROM input i
    WHERE NOT EXISTS (SELECT 1 FROM prior p WHERE p.ord = i.ord)
),
segment AS (SELECT max(seg) AS seg FROM comb.segments),
heads AS (
    SELECT d.partition_id, coalesce((SELECT m.pos FROM comb.messages m WHERE m.partition_id = d.partition_id AND m.seg >= (SELECT min(s.seg) FROM comb.segments s WHERE NOT s.summarized) AND m.seg <= (SELECT max(s.seg) FROM comb.segments s) ORDER BY m.pos DESC LIMIT 1), (SELECT sp.max_pos FROM comb.segment_partitions sp WHERE sp.partition_id = d.partition_id ORDER BY sp.seg DESC LIMIT 1), 0) AS pos
    FROM (SELECT DISTINCT partition_id FROM fresh) d
),
stored AS (
    INSERT INTO comb.messages
    (partition_id, pos, seg, message_id, transaction_id, trace_id, payload, created_at,
     producer_sub)
    SELECT f.partition_id, h.pos + f.rn, s.seg, f.message_id, f.transaction_id,
           f.trace_id, f.payload, statement_timestamp(), f.producer_sub
    FROM fresh f
    JOIN heads h ON h.partition_id = f.partition_id
    CROSS JOIN segment s
    RETURNING message_id
)
SELECT NULL::uuid, i.ord, pr.message_id, s.message_id IS NOT NULL, NULL::text,
       NULL::uuid, NULL::bigint, NULL::uuid, NULL::timestamptz
FROM input i
LEFT JOIN prior pr ON pr.ord = i.ord
LEFT JOIN stored s ON s.message_id = i.message_id
ORDER BY i.ord;
        ELSE
            IF a_checks[1] THEN
                one_prior := (SELECT m.message_id FROM comb.messages m
        WHERE m.partition_id = a_partitions[1] AND m.transaction_id = a_txids[1]
        LIMIT 1);
            END IF;
            IF one_prior IS NULL THEN
                INSERT INTO comb.messages
    (partition_id, pos, seg, message_id, transaction_id, trace_id, payload, created_at,
     producer_sub)
VALUES (a_partitions[1], coalesce((SELECT m.pos FROM comb.messages m WHERE m.partition_id = a_partitions[1] AND m.seg >= (SELECT min(s.seg) FROM comb.segments s WHERE NOT s.summarized) AND m.seg <= (SELECT max(s.seg) FROM comb.segments s) ORDER BY m.pos DESC LIMIT 1), (SELECT sp.max_pos FROM comb.segment_partitions sp WHERE sp.partition_id = a_partitions[1] ORDER BY sp.seg DESC LIMIT 1), 0) + a_ranks[1], (SELECT max(seg) FROM comb.segments), a_ids[1], a_txids[1], a_traces[1], a_payloads[1], statement_timestamp(), a_subs[1]);
            END IF;
            RETURN QUERY SELECT NULL::uuid, 1::bigint, one_prior, one_prior IS NULL,
                NULL::text, NULL::uuid, NULL::bigint, NULL::uuid, NULL::timestamptz;
        END IF;
    END IF;
    IF cardinality(o_partitions) = 1 THEN
        PERFORM 1 FROM comb.cursors WHERE partition_id = o_partitions[1] AND consumer_group = o_groups[1]
FOR NO KEY UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        SELECT s.* INTO st FROM comb.cursor_state(o_partitions[1], o_groups[1]) s;
        IF NOT FOUND OR st.lease_id IS NOT NULL OR st.available_at > now()
           OR cardinality(st.settled) > 0 OR cardinality(st.attempt_pos) > 0 THEN
            RETURN;
        END IF;
        opts := (SELECT q.options FROM comb.partitions p JOIN comb.queues q ON q.id = p.queue_id
             WHERE p.id = o_partitions[1]);
        IF coalesce((opts->>'delayedProcessing')::float8, 0) <> 0
           OR coalesce((opts->>'windowBuffer')::float8, 0) <> 0 THEN
            RETURN;
        END IF;
        FOR msg IN SELECT m.pos, m.message_id, m.created_at FROM comb.messages m WHERE m.partition_id = o_partitions[1]
                AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
                ORDER BY m.pos LIMIT o_batches[1] LOOP
            -- The next message is this push's, so every one after it is too.
            IF NOT (msg.message_id = ANY (a_ids)) THEN
                RETURN;
            END IF;
            picked_pos := picked_pos || msg.pos;
            picked_ids := picked_ids || msg.message_id;
            picked_at := picked_at || msg.created_at;
        END LOOP;
        IF cardinality(picked_pos) = 0 THEN
            RETURN;
        END IF;
        INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at)
        VALUES (st.partition_id, st.consumer_group, (SELECT max(gen) FROM comb.cursor_gens), st.ver + 1,
                st.cursor_pos, st.cursor_seg, st.settled, st.attempt_pos, st.attempt_cnt,
                o_leases[1],
                now() + make_interval(secs => coalesce((opts->>'leaseTime')::float8,
                                                       o_lengths[1])),
                picked_pos[cardinality(picked_pos)], st.available_at, clock_timestamp());
        FOR k IN 1 .. cardinality(picked_pos) LOOP
            partition_id := st.partition_id;
            consumer_group := st.consumer_group;
            lease_id := o_leases[1];
            pos := picked_pos[k];
            message_id := picked_ids[k];
            created_at := picked_at[k];
            RETURN NEXT;
        END LOOP;
        RETURN;
    ELSIF cardinality(o_partitions) > 0 THEN
        RETURN QUERY SELECT h.partition_id, NULL::bigint, NULL::uuid, NULL::boolean,
            h.consumer_group, h.lease_id, h.pos, h.message_id, h.created_at
            FROM comb.hand_off_v4(o_partitions, o_groups, o_leases, o_lengths, o_batches, a_ids) h;
    END IF;
END $$;

CREATE TABLE comb.cursor_gens (
    gen integer NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE comb.cursors (
    partition_id uuid NOT NULL,
    consumer_group text NOT NULL,
    queue_id uuid NOT NULL
)
WITH (fillfactor='100');

CREATE VIEW comb.cursors_now AS
 SELECT c.queue_id,
    s.partition_id,
    s.consumer_group,
    s.gen,
    s.ver,
    s.cursor_pos,
    s.cursor_seg,
    s.settled,
    s.attempt_pos,
    s.attempt_cnt,
    s.lease_id,
    s.lease_expires_at,
    s.lease_upto,
    s.available_at,
    s.last_claimed_at
   FROM (comb.cursors c
     CROSS JOIN LATERAL comb.cursor_state(c.partition_id, c.consumer_group) s(partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos, attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at));

CREATE TABLE comb.dead_letter_requeues (
    dead_letter_id uuid NOT NULL,
    partition_id uuid NOT NULL,
    pos bigint NOT NULL,
    requeued_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE comb.dead_letters (
    id uuid NOT NULL,
    queue_id uuid NOT NULL,
    partition_id uuid NOT NULL,
    consumer_group text NOT NULL,
    pos bigint NOT NULL,
    message_id uuid NOT NULL,
    transaction_id text NOT NULL,
    trace_id text,
    payload bytea NOT NULL,
    created_at timestamp with time zone NOT NULL,
    attempts integer NOT NULL,
    error text,
    dead_at timestamp with time zone DEFAULT now() NOT NULL,
    producer_sub text
);

CREATE TABLE comb.group_minutes (
    day date NOT NULL,
    minute timestamp with time zone NOT NULL,
    queue_id uuid NOT NULL,
    consumer_group text NOT NULL,
    partitions bigint NOT NULL,
    lag bigint NOT NULL,
    oldest_unsettled_at timestamp with time zone,
    leased bigint NOT NULL,
    taken_at timestamp with time zone NOT NULL
)
PARTITION BY RANGE (day);

CREATE TABLE comb.maintenance_runs (
    id bigint NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone DEFAULT now() NOT NULL,
    server text NOT NULL,
    created integer NOT NULL,
    rolled integer NOT NULL,
    summarized integer NOT NULL,
    dropped integer NOT NULL,
    drop_retries integer NOT NULL,
    dead_lettered bigint NOT NULL,
    generations_created integer DEFAULT 0 NOT NULL,
    generations_dropped integer DEFAULT 0 NOT NULL,
    states_carried bigint DEFAULT 0 NOT NULL
);

CREATE SEQUENCE comb.maintenance_runs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE comb.maintenance_runs_id_seq OWNED BY comb.maintenance_runs.id;

CREATE TABLE comb.messages (
    partition_id uuid NOT NULL,
    pos bigint NOT NULL,
    seg integer NOT NULL,
    message_id uuid NOT NULL,
    transaction_id text NOT NULL,
    trace_id text,
    payload bytea NOT NULL,
    created_at timestamp with time zone NOT NULL,
    producer_sub text
)
PARTITION BY RANGE (seg);
ALTER TABLE ONLY comb.messages ALTER COLUMN partition_id SET (n_distinct=100);

CREATE TABLE comb.migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE comb.partition_ids (
    one boolean DEFAULT true NOT NULL,
    legacy boolean NOT NULL,
    checked_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT partition_ids_one_check CHECK (one)
);

CREATE TABLE comb.partitions (
    id uuid NOT NULL,
    queue_id uuid NOT NULL,
    name text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
)
WITH (fillfactor='100');

CREATE TABLE comb.queue_counts (
    day date NOT NULL,
    minute timestamp with time zone NOT NULL,
    server text NOT NULL,
    queue_id uuid NOT NULL,
    pushed bigint NOT NULL,
    popped bigint NOT NULL,
    acked bigint NOT NULL,
    failed bigint NOT NULL,
    dead_lettered bigint NOT NULL
)
PARTITION BY RANGE (day);

CREATE TABLE comb.queue_minutes (
    day date NOT NULL,
    minute timestamp with time zone NOT NULL,
    queue_id uuid NOT NULL,
    total bigint NOT NULL,
    pending bigint NOT NULL,
    processing bigint NOT NULL,
    dead_letters bigint NOT NULL,
    lag_seconds double precision NOT NULL,
    partitions bigint,
    oldest_pending_at timestamp with time zone,
    last_message_at timestamp with time zone,
    taken_at timestamp with time zone
)
PARTITION BY RANGE (day);

CREATE TABLE comb.queues (
    id uuid NOT NULL,
    name text NOT NULL,
    namespace text,
    task text,
    options jsonb DEFAULT '{}'::jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE comb.schema_settings (
    name text NOT NULL,
    value text NOT NULL,
    why text NOT NULL
);

CREATE TABLE comb.segment_partitions (
    seg integer NOT NULL,
    partition_id uuid NOT NULL,
    max_pos bigint NOT NULL,
    max_created_at timestamp with time zone NOT NULL
);

CREATE TABLE comb.segments (
    seg integer NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    closed_at timestamp with time zone,
    summarized boolean DEFAULT false NOT NULL
);

CREATE TABLE comb.server_minutes (
    day date NOT NULL,
    minute timestamp with time zone NOT NULL,
    server text NOT NULL,
    pushed bigint NOT NULL,
    popped bigint NOT NULL,
    acked bigint NOT NULL,
    failed bigint NOT NULL,
    dead_lettered bigint NOT NULL
)
PARTITION BY RANGE (day);

CREATE TABLE comb.servers (
    id uuid NOT NULL,
    host text NOT NULL,
    listen text NOT NULL,
    pid integer NOT NULL,
    version text NOT NULL,
    functions_version integer NOT NULL,
    schema_version integer NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    heartbeat_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE comb.stream_partitions (
    partition_id uuid NOT NULL,
    query_id uuid NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE comb.stream_queries (
    id uuid NOT NULL,
    name text NOT NULL,
    source_queue text NOT NULL,
    sink_queue text,
    config_hash text NOT NULL,
    registered_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);

CREATE TABLE comb.stream_state_keys (
    partition_id uuid NOT NULL,
    query_id uuid NOT NULL,
    gen integer NOT NULL,
    key text NOT NULL,
    ver bigint NOT NULL,
    value jsonb,
    bytes integer NOT NULL,
    written_at timestamp with time zone DEFAULT now() NOT NULL
)
PARTITION BY RANGE (gen);

CREATE TABLE comb.stream_state_keys_1 (
    partition_id uuid NOT NULL,
    query_id uuid NOT NULL,
    gen integer NOT NULL,
    key text NOT NULL,
    ver bigint NOT NULL,
    value jsonb,
    bytes integer NOT NULL,
    written_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE comb.stream_state_keys_2 (
    partition_id uuid NOT NULL,
    query_id uuid NOT NULL,
    gen integer NOT NULL,
    key text NOT NULL,
    ver bigint NOT NULL,
    value jsonb,
    bytes integer NOT NULL,
    written_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE VIEW comb.stream_state_now AS
 SELECT q.name AS query,
    p.partition_id,
    k.key,
    k.value,
    k.written_at AS updated_at
   FROM ((comb.stream_partitions p
     JOIN comb.stream_queries q ON ((q.id = p.query_id)))
     CROSS JOIN LATERAL ( SELECT DISTINCT ON (s.key) s.key,
            s.value,
            s.written_at
           FROM comb.stream_state_keys s
          WHERE ((s.partition_id = p.partition_id) AND (s.query_id = p.query_id))
          ORDER BY s.key, s.gen DESC, s.ver DESC) k)
  WHERE (k.value IS NOT NULL);

CREATE TABLE comb.stream_states (
    partition_id uuid NOT NULL,
    query_id uuid NOT NULL,
    gen integer NOT NULL,
    ver bigint NOT NULL,
    state jsonb,
    updated jsonb,
    keys integer NOT NULL,
    bytes integer NOT NULL,
    written_at timestamp with time zone DEFAULT now() NOT NULL
)
PARTITION BY RANGE (gen);

CREATE TABLE comb.stream_states_1 (
    partition_id uuid NOT NULL,
    query_id uuid NOT NULL,
    gen integer NOT NULL,
    ver bigint NOT NULL,
    state jsonb,
    updated jsonb,
    keys integer NOT NULL,
    bytes integer NOT NULL,
    written_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE comb.stream_states_2 (
    partition_id uuid NOT NULL,
    query_id uuid NOT NULL,
    gen integer NOT NULL,
    ver bigint NOT NULL,
    state jsonb,
    updated jsonb,
    keys integer NOT NULL,
    bytes integer NOT NULL,
    written_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE comb.subscriptions (
    queue_id uuid NOT NULL,
    consumer_group text NOT NULL,
    mode text NOT NULL,
    start_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE comb.system_modes (
    mode text NOT NULL,
    enabled boolean NOT NULL,
    changed_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT system_modes_mode_check CHECK ((mode = ANY (ARRAY['push'::text, 'pop'::text])))
);

CREATE TABLE comb.traces (
    day date NOT NULL,
    id uuid NOT NULL,
    name text,
    partition_id uuid NOT NULL,
    transaction_id text NOT NULL,
    consumer_group text NOT NULL,
    event_type text NOT NULL,
    data jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
)
PARTITION BY RANGE (day);

ALTER TABLE ONLY comb.stream_state_keys ATTACH PARTITION comb.stream_state_keys_1 FOR VALUES FROM (1) TO (2);

ALTER TABLE ONLY comb.stream_state_keys ATTACH PARTITION comb.stream_state_keys_2 FOR VALUES FROM (2) TO (3);

ALTER TABLE ONLY comb.stream_states ATTACH PARTITION comb.stream_states_1 FOR VALUES FROM (1) TO (2);

ALTER TABLE ONLY comb.stream_states ATTACH PARTITION comb.stream_states_2 FOR VALUES FROM (2) TO (3);

ALTER TABLE ONLY comb.maintenance_runs ALTER COLUMN id SET DEFAULT nextval('comb.maintenance_runs_id_seq'::regclass);

ALTER TABLE ONLY comb.cursor_gens
    ADD CONSTRAINT cursor_gens_pkey PRIMARY KEY (gen);

ALTER TABLE ONLY comb.cursors
    ADD CONSTRAINT cursors_pkey PRIMARY KEY (partition_id, consumer_group);

ALTER TABLE ONLY comb.dead_letter_requeues
    ADD CONSTRAINT dead_letter_requeues_pkey PRIMARY KEY (dead_letter_id);

ALTER TABLE ONLY comb.dead_letters
    ADD CONSTRAINT dead_letters_pkey PRIMARY KEY (id);

ALTER TABLE ONLY comb.group_minutes
    ADD CONSTRAINT group_minutes_pkey PRIMARY KEY (day, minute, queue_id, consumer_group);

ALTER TABLE ONLY comb.maintenance_runs
    ADD CONSTRAINT maintenance_runs_pkey PRIMARY KEY (id);

ALTER TABLE ONLY comb.messages
    ADD CONSTRAINT messages_pkey PRIMARY KEY (partition_id, pos, seg);

ALTER TABLE ONLY comb.migrations
    ADD CONSTRAINT migrations_pkey PRIMARY KEY (version);

ALTER TABLE ONLY comb.partition_ids
    ADD CONSTRAINT partition_ids_pkey PRIMARY KEY (one);

ALTER TABLE ONLY comb.partitions
    ADD CONSTRAINT partitions_pkey PRIMARY KEY (id);

ALTER TABLE ONLY comb.partitions
    ADD CONSTRAINT partitions_queue_id_name_key UNIQUE (queue_id, name);

ALTER TABLE ONLY comb.queue_minutes
    ADD CONSTRAINT queue_minutes_pkey PRIMARY KEY (day, minute, queue_id);

ALTER TABLE ONLY comb.queues
    ADD CONSTRAINT queues_name_key UNIQUE (name);

ALTER TABLE ONLY comb.queues
    ADD CONSTRAINT queues_pkey PRIMARY KEY (id);

ALTER TABLE ONLY comb.schema_settings
    ADD CONSTRAINT schema_settings_pkey PRIMARY KEY (name);

ALTER TABLE ONLY comb.segment_partitions
    ADD CONSTRAINT segment_partitions_pkey PRIMARY KEY (seg, partition_id);

ALTER TABLE ONLY comb.segments
    ADD CONSTRAINT segments_pkey PRIMARY KEY (seg);

ALTER TABLE ONLY comb.servers
    ADD CONSTRAINT servers_pkey PRIMARY KEY (id);

ALTER TABLE ONLY comb.stream_partitions
    ADD CONSTRAINT stream_partitions_pkey PRIMARY KEY (partition_id, query_id);

ALTER TABLE ONLY comb.stream_queries
    ADD CONSTRAINT stream_queries_pkey PRIMARY KEY (id);

ALTER TABLE ONLY comb.subscriptions
    ADD CONSTRAINT subscriptions_pkey PRIMARY KEY (queue_id, consumer_group);

ALTER TABLE ONLY comb.system_modes
    ADD CONSTRAINT system_modes_pkey PRIMARY KEY (mode);

CREATE INDEX cursor_states_lease ON ONLY comb.cursor_states USING btree (lease_id) WHERE (lease_id IS NOT NULL);

CREATE INDEX cursor_states_newest ON ONLY comb.cursor_states USING btree (partition_id, consumer_group, gen, ver);

CREATE INDEX cursors_walk ON comb.cursors USING btree (queue_id, consumer_group, partition_id);

CREATE INDEX dead_letters_partition ON comb.dead_letters USING btree (partition_id, transaction_id);

CREATE INDEX dead_letters_queue_dead_at ON comb.dead_letters USING btree (queue_id, dead_at, id);

CREATE INDEX dead_letters_queue_group ON comb.dead_letters USING btree (queue_id, consumer_group, dead_at);

CREATE INDEX messages_transaction_id ON ONLY comb.messages USING btree (transaction_id, partition_id);

CREATE INDEX queue_counts_queue_minute ON ONLY comb.queue_counts USING btree (queue_id, minute);

CREATE INDEX segment_partitions_partition ON comb.segment_partitions USING btree (partition_id, seg);

CREATE INDEX server_minutes_minute ON ONLY comb.server_minutes USING btree (minute);

CREATE INDEX stream_partitions_query ON comb.stream_partitions USING btree (query_id);

CREATE INDEX stream_queries_name ON comb.stream_queries USING btree (name, registered_at DESC);

CREATE INDEX stream_state_keys_latest ON ONLY comb.stream_state_keys USING btree (partition_id, query_id, key, gen DESC, ver DESC);

CREATE INDEX stream_state_keys_1_partition_id_query_id_key_gen_ver_idx ON comb.stream_state_keys_1 USING btree (partition_id, query_id, key, gen DESC, ver DESC);

CREATE INDEX stream_state_keys_2_partition_id_query_id_key_gen_ver_idx ON comb.stream_state_keys_2 USING btree (partition_id, query_id, key, gen DESC, ver DESC);

CREATE INDEX stream_states_latest ON ONLY comb.stream_states USING btree (partition_id, query_id, gen, ver);

CREATE INDEX stream_states_1_partition_id_query_id_gen_ver_idx ON comb.stream_states_1 USING btree (partition_id, query_id, gen, ver);

CREATE INDEX stream_states_2_partition_id_query_id_gen_ver_idx ON comb.stream_states_2 USING btree (partition_id, query_id, gen, ver);

CREATE INDEX traces_message ON ONLY comb.traces USING btree (partition_id, transaction_id, created_at);

CREATE INDEX traces_name ON ONLY comb.traces USING btree (name, created_at);

ALTER INDEX comb.stream_state_keys_latest ATTACH PARTITION comb.stream_state_keys_1_partition_id_query_id_key_gen_ver_idx;

ALTER INDEX comb.stream_state_keys_latest ATTACH PARTITION comb.stream_state_keys_2_partition_id_query_id_key_gen_ver_idx;

ALTER INDEX comb.stream_states_latest ATTACH PARTITION comb.stream_states_1_partition_id_query_id_gen_ver_idx;

ALTER INDEX comb.stream_states_latest ATTACH PARTITION comb.stream_states_2_partition_id_query_id_gen_ver_idx;

ALTER TABLE ONLY comb.partitions
    ADD CONSTRAINT partitions_queue_id_fkey FOREIGN KEY (queue_id) REFERENCES comb.queues(id) ON DELETE CASCADE;

ALTER TABLE ONLY comb.subscriptions
    ADD CONSTRAINT subscriptions_queue_id_fkey FOREIGN KEY (queue_id) REFERENCES comb.queues(id) ON DELETE CASCADE;
