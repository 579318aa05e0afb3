-- A claim whose COMMIT is pipelined behind it cannot look at what it read before it commits,
-- so it cannot open sealed payloads first. It calls this for a sealed payload instead, which
-- rolls it back; the claim is then made again by the path that opens payloads before its
-- commit and dead-letters those it cannot open (pop::claim, pop::unreadable).
CREATE FUNCTION comb.refuse_sealed_payload() RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'a sealed payload in a claim that commits before opening it'
        USING ERRCODE = 'CB001';
END
$$;
