\set p random(1, 200)
BEGIN;
SELECT 1 FROM pk.partitions WHERE id = :p FOR UPDATE;
WITH ids AS (SELECT 't' || nextval('pk.txn') AS t FROM generate_series(1, 100)),
fresh AS (SELECT t AS transaction_id FROM ids),
head AS (SELECT coalesce((SELECT first_pos + n - 1 FROM pk.batches WHERE partition_id = :p ORDER BY first_pos DESC LIMIT 1), 0) AS h)
INSERT INTO pk.batches (partition_id, first_pos, n, ids, msg_ids, payloads)
SELECT :p, head.h + 1, f.n, f.ids, c.msg_ids, convert_to(c.payloads, 'UTF8')
FROM head, (SELECT count(*) AS n, array_agg(transaction_id) AS ids FROM fresh) f, pk.corpus c;
COMMIT;
