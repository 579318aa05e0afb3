-- What this schema says of itself to the servers that start on it: `min_server_version`, the
-- oldest release of Comb that can still run on it. A server newer than the schema migrates
-- it; one older than the schema starts only when its release is at least this one (it then
-- runs on a schema it does not know, which only added what it does not use), and otherwise
-- refuses, naming both. A migration that changes what older servers read or write raises it.
--
-- 0.1.0 is the oldest release: schema 18 made `comb.stream_states.state` and `updated`
-- NULL-able (a pair's versions hold only their size since, the keys the state), which a build
-- from before schema 18 reads as always set; 0.1.0 knows schema 18. Schemas 19 and 20 only add
-- (the server registry, this table), nothing 0.1.0 reads.
CREATE TABLE comb.schema_settings (
    name  text PRIMARY KEY,
    value text NOT NULL,
    why   text NOT NULL
);
INSERT INTO comb.schema_settings (name, value, why) VALUES (
    'min_server_version', '0.1.0',
    'schema 18 made comb.stream_states.state NULL-able, which builds before it read as set; '
    'schemas 19 and 20 only add'
);
