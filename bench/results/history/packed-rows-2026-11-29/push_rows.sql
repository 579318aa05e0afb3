\set p random(1, 200)
BEGIN;
SELECT 1 FROM pk.partitions WHERE id = :p FOR UPDATE;
WITH ids AS (SELECT 't' || nextval('pk.txn') AS t, k FROM generate_series(1, 100) k),
fresh AS (SELECT i.t, i.k FROM ids i WHERE NOT EXISTS (SELECT 1 FROM pk.messages m WHERE m.partition_id = :p AND m.transaction_id = i.t)),
head AS (SELECT coalesce((SELECT pos FROM pk.messages WHERE partition_id = :p ORDER BY pos DESC LIMIT 1), 0) AS h)
INSERT INTO pk.messages (partition_id, pos, message_id, transaction_id, payload)
SELECT :p, head.h + row_number() OVER (ORDER BY f.k), c.msg_ids[f.k], f.t, c.payloads[f.k]
FROM head, fresh f, pk.corpus_rows c;
COMMIT;
