-- What each server did per queue, one row per (server, queue) per record: the throughput that
-- `/status/analytics?queue=` answers with (`server_minutes` holds the servers' totals). Only
-- ever receives inserts; kept by the day and dropped whole like the other counters.
CREATE TABLE comb.queue_counts (
    day           date NOT NULL,
    minute        timestamptz NOT NULL,
    server        text NOT NULL,
    queue_id      uuid NOT NULL,
    pushed        bigint NOT NULL,
    popped        bigint NOT NULL,
    acked         bigint NOT NULL,
    failed        bigint NOT NULL,
    dead_lettered bigint NOT NULL
) PARTITION BY RANGE (day);
CREATE INDEX queue_counts_queue_minute ON comb.queue_counts (queue_id, minute);

DO $$
DECLARE
    d date;
BEGIN
    FOR i IN 0..2 LOOP
        d := (now() AT TIME ZONE 'UTC')::date + i;
        EXECUTE format('CREATE TABLE comb.%I PARTITION OF comb.queue_counts FOR VALUES FROM (%L) TO (%L)',
                       'queue_counts_' || to_char(d, 'YYYYMMDD'), d, d + 1);
    END LOOP;
END $$;
