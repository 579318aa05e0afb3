-- Comb schema, version 6: a cursor's state is read from the newest generation first.
--
-- The latest version of a cursor is the first entry of its newest generation's index. With
-- an index on (partition_id, consumer_group, ver) the planner had to merge the generations
-- to find it, and estimating one version per cursor (generation tables live for seconds and
-- are rarely analysed; a table made ahead and analysed while empty looks free to scan) it
-- chose to read every version the cursor has in each generation and sort them: hundreds of
-- rows per read for a busy cursor. With gen in the index, each generation's index yields the
-- cursor's versions in (gen, ver) order, so the generations are read one after another,
-- newest first, and the read stops at the first row.
--
-- The planner takes that path when it expects a cursor to have many versions, so every
-- generation table fixes the number of distinct partition ids at 1: any cursor may own the
-- whole generation, as a busy one does. Generation tables made from now on get the same
-- setting, and maintenance analyses the newest one as it fills.

CREATE INDEX cursor_states_newest ON comb.cursor_states (partition_id, consumer_group, gen, ver);
DROP INDEX comb.cursor_states_latest;

CREATE OR REPLACE FUNCTION comb.cursor_state(p uuid, g text)
RETURNS SETOF comb.cursor_states
LANGUAGE sql STABLE AS $$
    SELECT * FROM comb.cursor_states s
    WHERE s.partition_id = p AND s.consumer_group = g
    ORDER BY s.gen DESC, s.ver DESC LIMIT 1
$$;

ALTER TABLE comb.cursor_states ALTER COLUMN partition_id SET (n_distinct = 1);

DO $$
DECLARE
    leaf regclass;
    held boolean;
BEGIN
    FOR leaf IN SELECT inhrelid::regclass FROM pg_inherits
                WHERE inhparent = 'comb.cursor_states'::regclass
    LOOP
        EXECUTE format('ALTER TABLE %s ALTER COLUMN partition_id SET (n_distinct = 1)', leaf);
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s)', leaf) INTO held;
        IF held THEN
            EXECUTE format('ANALYZE %s', leaf);
        END IF;
    END LOOP;
END $$;
