\set p random(1, 200)
BEGIN;
SELECT 1 FROM pk.partitions WHERE id = :p FOR UPDATE;
WITH ids AS (SELECT array_agg('t' || nextval('pk.txn')) AS a FROM generate_series(1, 100)),
held AS (SELECT x FROM pk.batches b, ids, unnest(b.ids) x WHERE b.ids && ids.a AND b.partition_id = :p AND x = ANY (ids.a)),
fresh AS (SELECT array_agg(t) AS ids, count(*) AS n FROM ids, unnest(ids.a) t WHERE t NOT IN (SELECT x FROM held)),
head AS (SELECT coalesce((SELECT first_pos + n - 1 FROM pk.batches WHERE partition_id = :p ORDER BY first_pos DESC LIMIT 1), 0) AS h)
INSERT INTO pk.batches (partition_id, first_pos, n, ids, msg_ids, payloads)
SELECT :p, head.h + 1, f.n, f.ids, c.msg_ids, convert_to(c.payloads, 'UTF8')
FROM head, fresh f, pk.corpus c;
COMMIT;
