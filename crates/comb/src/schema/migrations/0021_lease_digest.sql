-- The digest of the transaction ids a claim leased, written with the lease by the claim
-- (`pop::claim`) and carried by the lease's extensions, by no other writer of a state
-- version: set on a cursor's latest version only while nothing has moved it since its claim. An ack that names exactly those ids
-- (`ack::completed`) is then judged by comparing digests, without reading the messages.
-- NULL-able and without a default, so the column costs nothing to add; servers that do not
-- know it write NULL, and their acks and claims read it not.
ALTER TABLE comb.cursor_states ADD COLUMN lease_digest bytea;

-- 0.1.0 still runs on this schema: its writers name their columns and leave this one NULL.
UPDATE comb.schema_settings
SET why = 'schema 18 made comb.stream_states.state NULL-able, which builds before it read as '
          'set; schemas 19 to 21 only add'
WHERE name = 'min_server_version';
