-- Comb schema, version 6: a cursor's state is read from the newest generation first.
--
-- The latest version of a cursor is the first entry of its newest generation's index. With
-- an index on (partition_id, consumer_group, ver) the planner had to merge the generations
-- to find it; estimating one version per cursor (generation tables live for seconds and are
-- rarely analysed) it chose to read every version the cursor has in each generation and sort
-- them, hundreds of rows per read for a busy cursor. With gen in the index, each generation's
-- index yields the cursor's versions newest first in (gen, ver) order, so the generations
-- are read one after another, newest first, and the read stops at the first row it finds.

CREATE INDEX cursor_states_newest ON comb.cursor_states (partition_id, consumer_group, gen, ver);
DROP INDEX comb.cursor_states_latest;

CREATE OR REPLACE FUNCTION comb.cursor_state(p uuid, g text)
RETURNS SETOF comb.cursor_states
LANGUAGE sql STABLE AS $$
    SELECT * FROM comb.cursor_states s
    WHERE s.partition_id = p AND s.consumer_group = g
    ORDER BY s.gen DESC, s.ver DESC LIMIT 1
$$;
