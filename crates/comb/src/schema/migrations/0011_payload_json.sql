-- A stored payload as JSON for the administration API's listings, which build their answers
-- in SQL. Never fails the listing: a payload sealed by encryption at rest (it starts with a
-- NUL byte) is opened only by the server holding the key, so it shows as {"encrypted": true};
-- a payload PostgreSQL cannot parse (nested deeper than its stack allows) shows as a string
-- saying why.
CREATE FUNCTION comb.payload_json(p bytea) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF length(p) > 0 AND get_byte(p, 0) = 0 THEN
        RETURN jsonb_build_object('encrypted', true);
    END IF;
    RETURN convert_from(p, 'UTF8')::jsonb;
EXCEPTION WHEN OTHERS THEN
    RETURN to_jsonb('payload not shown: ' || SQLERRM);
END
$$;
