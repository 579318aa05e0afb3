-- The servers running on this database: each registers itself at start, beats every few
-- seconds and leaves when it stops; the maintenance leader forgets one that missed three
-- beats. A server's release and its set of data-path functions say which functions may be
-- dropped (none that a registered server calls) and let operators see a rolling upgrade.
-- A row per server, updated by its heartbeat: a handful of rows, never on the data path.
CREATE TABLE comb.servers (
    id                uuid PRIMARY KEY,
    host              text NOT NULL,
    listen            text NOT NULL,
    pid               integer NOT NULL,
    version           text NOT NULL,
    functions_version integer NOT NULL,
    schema_version    integer NOT NULL,
    started_at        timestamptz NOT NULL DEFAULT now(),
    heartbeat_at      timestamptz NOT NULL DEFAULT now()
);
