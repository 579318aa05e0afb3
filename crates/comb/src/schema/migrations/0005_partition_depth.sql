-- Comb schema, version 5: the planner assumes partitions are deep.
--
-- Every read of message storage by partition wants the partition's rows in position order
-- through the primary key, stopping after a few: the newest position, the next unread
-- messages of a claim. Planned from statistics that say a partition holds one row (taken
-- while partitions were young, or while thousands of partitions held a message each), the
-- planner instead reads all of the partition's rows and sorts them, and a lookup that
-- should touch one index entry reads thousands.
--
-- Fixing the number of distinct partition ids a segment is assumed to hold at 100 makes
-- every partition look like a hundredth of its segment, whatever the statistics sampled:
-- ordered index scans win for every such read, which is right for shallow partitions too.
-- Segment tables made from now on get the same setting; ANALYZE applies it.

ALTER TABLE comb.messages ALTER COLUMN partition_id SET (n_distinct = 100);

DO $$
DECLARE
    leaf regclass;
    held boolean;
BEGIN
    FOR leaf IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'comb.messages'::regclass
    LOOP
        EXECUTE format('ALTER TABLE %s ALTER COLUMN partition_id SET (n_distinct = 100)', leaf);
        -- Statistics of segments that hold messages are taken again with the setting.
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s)', leaf) INTO held;
        IF held THEN
            EXECUTE format('ANALYZE %s', leaf);
        END IF;
    END LOOP;
END $$;
