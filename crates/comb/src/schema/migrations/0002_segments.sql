-- Comb schema, version 2: the lifecycle of message segments.
--
-- Maintenance makes the next segment table ahead of need, rolls pushes over to it, summarises
-- a segment once it is closed (which partitions it holds, up to which position), and drops it
-- whole when every queue with messages in it allows. Nothing is ever deleted row by row.

ALTER TABLE comb.segments
    ADD COLUMN closed_at  timestamptz,
    ADD COLUMN summarized boolean NOT NULL DEFAULT false;

-- What a closed segment holds, per partition: enough to decide, from consumer positions and
-- ages alone, whether the whole table may go.
CREATE TABLE comb.segment_partitions (
    seg            integer NOT NULL,
    partition_id   uuid NOT NULL,
    max_pos        bigint NOT NULL,
    max_created_at timestamptz NOT NULL,
    PRIMARY KEY (seg, partition_id)
);

-- What maintenance did, for operators (and the metrics endpoint).
CREATE TABLE comb.maintenance_runs (
    id           bigserial PRIMARY KEY,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz NOT NULL DEFAULT now(),
    server       text NOT NULL,
    created      integer NOT NULL,
    rolled       integer NOT NULL,
    summarized   integer NOT NULL,
    dropped      integer NOT NULL,
    drop_retries integer NOT NULL,
    dead_lettered bigint NOT NULL
);
