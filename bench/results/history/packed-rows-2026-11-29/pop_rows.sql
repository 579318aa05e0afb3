\set p random(1, 200)
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT 1 FROM pk.cursors WHERE partition_id = :p AND grp = 'g' FOR NO KEY UPDATE;
WITH st AS (SELECT * FROM pk.row_states WHERE partition_id = :p AND grp = 'g' ORDER BY ver DESC LIMIT 1),
m AS MATERIALIZED (SELECT m.* FROM st CROSS JOIN LATERAL (SELECT * FROM pk.messages m WHERE m.partition_id = :p AND m.pos > st.pos ORDER BY m.pos LIMIT 1000) m WHERE st.lease_id IS NULL),
ins AS (INSERT INTO pk.row_states SELECT :p, 'g', st.ver + 1, st.pos, max(m.pos), gen_random_uuid(), now() + interval '30 s' FROM st, m GROUP BY st.ver, st.pos RETURNING lease_id)
SELECT count(*), sum(get_byte(m.payload, 0)), count(m.transaction_id), count(m.message_id), max(m.created_at), (SELECT lease_id FROM ins) FROM m;
COMMIT;
BEGIN;
SELECT 1 FROM pk.cursors WHERE partition_id = :p AND grp = 'g' FOR NO KEY UPDATE;
INSERT INTO pk.row_states SELECT partition_id, grp, ver + 1, lease_upto, NULL, NULL, NULL FROM (SELECT * FROM pk.row_states WHERE partition_id = :p AND grp = 'g' ORDER BY ver DESC LIMIT 1) s WHERE s.lease_id IS NOT NULL;
COMMIT;
