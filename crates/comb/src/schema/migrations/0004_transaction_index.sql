-- Comb schema, version 4: transaction ids indexed by id first.
--
-- Version 1 indexed message transaction ids as (partition_id, transaction_id). Its leading
-- partition_id let the planner take it for position scans of one partition (the newest
-- position of a partition, the first unread message), which then read every message of the
-- partition instead of one entry of the primary key. Led by the transaction id, the index
-- serves only what it is for: finding one transaction id in one partition.
--
-- Building the index takes a SHARE lock on every segment table, which holds pushes back for
-- the time of the build.

CREATE INDEX messages_transaction_id ON comb.messages (transaction_id, partition_id);
DROP INDEX comb.messages_transaction;
