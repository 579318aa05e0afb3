-- Comb schema, version 7: the claim walk's time-based checks in a function of their own.
--
-- A claim's walk skips cursors whose partition is still inside its queue's windowBuffer,
-- past its retention, or whose next message is still delayed. Written inline, those checks
-- put a dozen plan nodes into every walk (two inlined comb.partition_head calls and a
-- message probe), and every execution initialises them, although most queues use none of
-- these options. Called only for queues that set one, the function costs nothing to the
-- others.

-- Whether the cursor of partition p, positioned at `after` in segment `from_seg`, may be
-- claimed now under these options: the head's time (comb.partition_head) decides for
-- windowBuffer and retentionSeconds, the next message's time for delayedProcessing; an
-- unknown time never allows a claim.
CREATE FUNCTION comb.claimable_now(p uuid, after bigint, from_seg integer,
                                   window_secs float8, retention_secs float8,
                                   delay_secs float8)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    head_at timestamptz;
    next_at timestamptz;
BEGIN
    IF window_secs > 0 OR retention_secs > 0 THEN
        SELECT h.at INTO head_at FROM comb.partition_head(p) h;
        IF window_secs > 0
           AND (head_at <= now() - make_interval(secs => window_secs)) IS NOT TRUE THEN
            RETURN false;
        END IF;
        IF retention_secs > 0
           AND (head_at > now() - make_interval(secs => retention_secs)) IS NOT TRUE THEN
            RETURN false;
        END IF;
    END IF;
    IF delay_secs > 0 THEN
        SELECT m.created_at INTO next_at FROM comb.messages m
        WHERE m.partition_id = p AND m.pos > after AND m.seg >= from_seg
        ORDER BY m.pos LIMIT 1;
        IF (next_at <= now() - make_interval(secs => delay_secs)) IS NOT TRUE THEN
            RETURN false;
        END IF;
    END IF;
    RETURN true;
END $$;
