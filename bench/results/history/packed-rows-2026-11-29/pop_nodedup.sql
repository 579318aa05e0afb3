\set p random(1, 200)
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT 1 FROM pk.cursors WHERE partition_id = :p AND grp = 'g' FOR NO KEY UPDATE;
WITH st AS (SELECT * FROM pk.cursor_states WHERE partition_id = :p AND grp = 'g' ORDER BY ver DESC LIMIT 1),
b AS MATERIALIZED (SELECT b.* FROM st CROSS JOIN LATERAL (SELECT * FROM pk.batches b WHERE b.partition_id = :p AND b.first_pos > st.pos ORDER BY b.first_pos LIMIT 10) b WHERE st.lease_id IS NULL),
ins AS (INSERT INTO pk.cursor_states SELECT :p, 'g', st.ver + 1, st.pos, max(b.first_pos + b.n - 1), gen_random_uuid(), now() + interval '30 s' FROM st, b GROUP BY st.ver, st.pos RETURNING lease_id)
SELECT count(*), sum(get_byte(b.payloads, 0)), sum(cardinality(b.ids)), sum(cardinality(b.msg_ids)), max(b.created_at), (SELECT lease_id FROM ins) FROM b;
COMMIT;
BEGIN;
SELECT 1 FROM pk.cursors WHERE partition_id = :p AND grp = 'g' FOR NO KEY UPDATE;
INSERT INTO pk.cursor_states SELECT partition_id, grp, ver + 1, lease_upto, NULL, NULL, NULL FROM (SELECT * FROM pk.cursor_states WHERE partition_id = :p AND grp = 'g' ORDER BY ver DESC LIMIT 1) s WHERE s.lease_id IS NOT NULL;
COMMIT;
