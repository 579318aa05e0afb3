DROP SCHEMA IF EXISTS pk CASCADE;
CREATE SCHEMA pk;
CREATE TABLE pk.partitions (id int PRIMARY KEY);
INSERT INTO pk.partitions SELECT g FROM generate_series(1, 200) g;
-- One row per pushed batch of one partition: positions first_pos .. first_pos + n - 1.
CREATE TABLE pk.batches (
    partition_id int NOT NULL,
    first_pos bigint NOT NULL,
    n int NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    ids text[] NOT NULL,
    payloads bytea NOT NULL,
    PRIMARY KEY (partition_id, first_pos)
);
ALTER TABLE pk.batches ALTER COLUMN payloads SET COMPRESSION lz4;
ALTER TABLE pk.batches ALTER COLUMN ids SET STORAGE EXTERNAL;
-- Transaction ids for the dedup window: one index entry per message.
CREATE TABLE pk.dedup (partition_id int NOT NULL, transaction_id text NOT NULL, PRIMARY KEY (partition_id, transaction_id));
-- Cursor versions, insert-only as in Comb.
CREATE TABLE pk.cursor_states (
    partition_id int NOT NULL, grp text NOT NULL, ver bigint NOT NULL,
    pos bigint NOT NULL, lease_upto bigint, lease_id uuid, lease_expires_at timestamptz,
    PRIMARY KEY (partition_id, grp, ver));
INSERT INTO pk.cursor_states SELECT id, 'g', 0, 0 FROM pk.partitions;
CREATE SEQUENCE pk.txn;
-- 100 payloads of ~256 B of JSON from a small corpus (compresses about 2x), as one bytea.
CREATE TABLE pk.corpus AS
SELECT string_agg(format('{"id":"evt-%s","user":"u%s","event":"%s","value":%s,"tags":["%s","%s"],"meta":{"src":"%s","ver":%s,"ok":true},"text":"%s"}',
        i, (i * 7919) % 100000, (ARRAY['click','view','buy','share'])[1 + i % 4], (i * 31) % 99991,
        md5(i::text), substr(md5((i*3)::text), 1, 12), (ARRAY['web','ios','android'])[1 + i % 3], i % 9,
        substr(md5((i * 5)::text) || md5((i * 11)::text) || md5((i * 13)::text), 1, 88)), '') AS payloads
FROM generate_series(1, 100) i;
ALTER TABLE pk.corpus ADD COLUMN msg_ids uuid[];
UPDATE pk.corpus SET msg_ids = ARRAY(SELECT gen_random_uuid() FROM generate_series(1, 100));
CREATE TABLE pk.cursors (partition_id int, grp text, PRIMARY KEY (partition_id, grp));
INSERT INTO pk.cursors SELECT id, 'g' FROM pk.partitions;
ALTER TABLE pk.batches ADD COLUMN msg_ids uuid[] NOT NULL;
-- The same messages one row each, as Comb stores them today (for the comparison in one harness).
CREATE TABLE pk.messages (
    partition_id int NOT NULL, pos bigint NOT NULL, message_id uuid NOT NULL,
    transaction_id text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), payload bytea NOT NULL,
    PRIMARY KEY (partition_id, pos));
CREATE INDEX ON pk.messages (partition_id, transaction_id);
CREATE TABLE pk.row_states (LIKE pk.cursor_states INCLUDING ALL);
INSERT INTO pk.row_states SELECT * FROM pk.cursor_states;
CREATE TABLE pk.corpus_rows AS
SELECT array_agg(convert_to(format('{"id":"evt-%s","user":"u%s","event":"%s","value":%s,"tags":["%s","%s"],"meta":{"src":"%s","ver":%s,"ok":true},"text":"%s"}',
        i, (i * 7919) % 100000, (ARRAY['click','view','buy','share'])[1 + i % 4], (i * 31) % 99991,
        md5(i::text), substr(md5((i*3)::text), 1, 12), (ARRAY['web','ios','android'])[1 + i % 3], i % 9,
        substr(md5((i * 5)::text) || md5((i * 11)::text) || md5((i * 13)::text), 1, 88)), 'UTF8') ORDER BY i) AS payloads,
       (SELECT msg_ids FROM pk.corpus) AS msg_ids
FROM generate_series(1, 100) i;
