-- A partition's id is now derived from its queue's id and its name (a name-based UUID,
-- version 5), so that finding a partition by name is finding it by id. Partitions made before
-- have random ids (version 7). `comb migrate` records here whether any is left: while one is,
-- a look-up on Citus that misses the derived id also looks by name (every shard); once none
-- is, it does not. One row; a reference table on Citus (read on the coordinator alone).
CREATE TABLE comb.partition_ids (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    legacy boolean NOT NULL,
    checked_at timestamptz NOT NULL DEFAULT now()
);
