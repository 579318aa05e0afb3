-- Comb schema, version 1.
--
-- Message rows are append-only: no UPDATE or DELETE ever touches comb.messages on the data
-- path. Everything that changes per pop or ack lives in small rows (comb.partitions heads and
-- comb.cursors) whose changing columns carry no index, so their updates stay HOT.

CREATE TABLE comb.queues (
    id          uuid PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    namespace   text,
    task        text,
    -- Only the options a user set explicitly; defaults are applied by the server, so that a
    -- later change of a default reaches queues that never chose a value.
    options     jsonb NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE comb.partitions (
    id           uuid PRIMARY KEY,
    queue_id     uuid NOT NULL REFERENCES comb.queues (id) ON DELETE CASCADE,
    name         text NOT NULL,
    -- Position of the newest committed message. Pushes lock this row before they assign
    -- positions, which is what makes positions commit in order.
    head_pos     bigint NOT NULL DEFAULT 0,
    last_push_at timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (queue_id, name)
) WITH (fillfactor = 50);

-- Message storage is split into segments so that reclamation can drop whole tables.
-- Pushes write into the newest segment; within a partition `seg` never decreases as `pos` grows.
CREATE TABLE comb.segments (
    seg        integer PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE comb.messages (
    partition_id   uuid NOT NULL,
    pos            bigint NOT NULL,
    seg            integer NOT NULL,
    message_id     uuid NOT NULL,
    transaction_id text NOT NULL,
    trace_id       text,
    -- The JSON payload exactly as the producer sent it (validated at the edge).
    payload        bytea NOT NULL,
    created_at     timestamptz NOT NULL,
    PRIMARY KEY (partition_id, pos, seg)
) PARTITION BY RANGE (seg);

CREATE INDEX messages_transaction ON comb.messages (partition_id, transaction_id);

CREATE TABLE comb.messages_1 PARTITION OF comb.messages FOR VALUES FROM (1) TO (2);
INSERT INTO comb.segments (seg) VALUES (1);

-- A consumer group reading a queue. Created on the group's first pop; its mode decides where
-- the group starts in partitions that exist at that moment.
CREATE TABLE comb.subscriptions (
    queue_id       uuid NOT NULL REFERENCES comb.queues (id) ON DELETE CASCADE,
    consumer_group text NOT NULL,
    mode           text NOT NULL,
    start_at       timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_id, consumer_group)
);

-- One row per (partition, consumer group): the group's position and its lease on the partition.
CREATE TABLE comb.cursors (
    partition_id     uuid NOT NULL,
    consumer_group   text NOT NULL,
    queue_id         uuid NOT NULL,
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
    last_claimed_at  timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (partition_id, consumer_group)
) WITH (fillfactor = 50);

CREATE INDEX cursors_queue_group ON comb.cursors (queue_id, consumer_group);

-- Messages a consumer group gave up on. A copy of the message, so that the group's dead
-- letters outlive the retention of the message storage.
CREATE TABLE comb.dead_letters (
    id             uuid PRIMARY KEY,
    queue_id       uuid NOT NULL,
    partition_id   uuid NOT NULL,
    consumer_group text NOT NULL,
    pos            bigint NOT NULL,
    message_id     uuid NOT NULL,
    transaction_id text NOT NULL,
    trace_id       text,
    payload        bytea NOT NULL,
    created_at     timestamptz NOT NULL,
    attempts       integer NOT NULL,
    error          text,
    dead_at        timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX dead_letters_queue_group ON comb.dead_letters (queue_id, consumer_group, dead_at);
