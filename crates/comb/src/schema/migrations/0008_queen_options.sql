-- Comb schema, version 8: Queen's retention options, and dead letters listed by queue.
--
-- Queen's clients send `ttl` and `retentionEnabled` with their queues. `ttl` expires a message
-- not consumed in time, as `retentionSeconds` does (the shorter of the two applies);
-- `retentionEnabled: false` keeps the time-based retention options but turns them off. Both
-- the claim and maintenance read a queue's retention through these functions, so the rule
-- lives in one place. They are plain SQL and immutable: the planner inlines them.

CREATE FUNCTION comb.retention_secs(options jsonb) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN (options->>'retentionEnabled')::boolean IS FALSE THEN 0::float8
                ELSE coalesce(least(nullif((options->>'retentionSeconds')::float8, 0),
                                    nullif((options->>'ttl')::float8, 0)), 0) END
$$;

CREATE FUNCTION comb.completed_retention_secs(options jsonb) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN (options->>'retentionEnabled')::boolean IS FALSE THEN 0::float8
                ELSE coalesce((options->>'completedRetentionSeconds')::float8, 0) END
$$;

-- `GET /api/v1/dlq` lists a queue's dead letters newest first, with or without a group: the
-- existing (queue_id, consumer_group, dead_at) index serves the first, this one the second.
CREATE INDEX dead_letters_queue_dead_at ON comb.dead_letters (queue_id, dead_at, id);
