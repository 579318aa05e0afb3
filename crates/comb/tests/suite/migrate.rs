//! Schema migrations: `comb migrate` applies them once; a server refuses a database whose
//! schema is newer than it knows.

use std::process::Command;

use crate::common::comb_bin;
use comb_harness::Postgres;
use serde_json::{Value, json};

fn comb(args: &[&str], database_url: &str) -> std::process::Output {
    Command::new(comb_bin())
        .args(args)
        .env("DATABASE_URL", database_url)
        .env("COMB_LISTEN", "127.0.0.1:0")
        .output()
        .expect("comb runs")
}

#[test]
fn migrate_applies_every_version_once() {
    let pg = Postgres::shared();
    let url = pg.create_database("m").unwrap();
    let db = url.rsplit('/').next().unwrap().to_string();
    migrate(&url);
    let versions = pg
        .psql(
            &db,
            "SELECT string_agg(version::text, ',' ORDER BY version) FROM comb.migrations",
        )
        .unwrap();
    assert_eq!(
        versions.trim(),
        "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21"
    );
    // Running it again changes nothing.
    let out = comb(&["migrate"], &url);
    assert!(out.status.success());
    assert_eq!(
        pg.psql(&db, "SELECT count(*) FROM comb.migrations")
            .unwrap()
            .trim(),
        "21"
    );
    assert_eq!(
        pg.psql(&db, "SELECT count(*) FROM comb.segments")
            .unwrap()
            .trim(),
        "1"
    );
}

#[test]
fn a_server_refuses_a_schema_newer_than_it_knows() {
    let pg = Postgres::shared();
    let url = pg.create_database("m").unwrap();
    let db = url.rsplit('/').next().unwrap().to_string();
    assert!(comb(&["migrate"], &url).status.success());
    // A future migration that no longer serves this release.
    pg.psql(
        &db,
        "INSERT INTO comb.migrations (version, name) VALUES (999, 'from the future');
         UPDATE comb.schema_settings SET value = '9.0.0' WHERE name = 'min_server_version'",
    )
    .unwrap();
    for args in [&["migrate"][..], &["serve"][..]] {
        let out = comb(args, &url);
        assert!(!out.status.success(), "{args:?} must refuse");
        let err = String::from_utf8_lossy(&out.stderr);
        // One line naming the schema's version, the release it needs and this one.
        let line = format!(
            "comb: database schema is at version 999, newer than this server knows (21), and \
             serves comb 9.0.0 or newer; this is comb {}: upgrade comb",
            env!("CARGO_PKG_VERSION")
        );
        assert!(err.lines().any(|l| l == line), "{args:?}: {err}");
    }
}

/// A database at version 2 keeps every head and position through the move to insert-only
/// state: the next message of a partition takes the position after its old head, and a
/// group resumes where it was.
#[test]
fn upgrade_to_insert_only_state_keeps_heads_and_positions() {
    let pg = Postgres::shared();
    let url = pg.create_database("m_up").unwrap();
    let db = url.rsplit('/').next().unwrap().to_string();
    let v12 = schema_through_v2();
    pg.psql(
        &db,
        &format!(
            "{v12}
         INSERT INTO comb.migrations (version, name) VALUES (1, 'init'), (2, 'segments');
         INSERT INTO comb.queues (id, name) VALUES ('00000000-0000-0000-0000-000000000001', 'q');
         -- Partition p held 7 messages, whose segment is gone; group g settled 5 of them.
         INSERT INTO comb.partitions (id, queue_id, name, head_pos, last_push_at)
         VALUES ('00000000-0000-0000-0000-0000000000a1', '00000000-0000-0000-0000-000000000001',
                 'p', 7, now());
         INSERT INTO comb.subscriptions (queue_id, consumer_group, mode)
         VALUES ('00000000-0000-0000-0000-000000000001', 'g', 'all');
         INSERT INTO comb.cursors (partition_id, consumer_group, queue_id, cursor_pos, settled)
         VALUES ('00000000-0000-0000-0000-0000000000a1', 'g',
                 '00000000-0000-0000-0000-000000000001', 5, '{{7}}');"
        ),
    )
    .unwrap();
    migrate(&url);
    let got = pg
        .psql(
            &db,
            "SELECT (SELECT pos FROM comb.partition_head('00000000-0000-0000-0000-0000000000a1')),
                    c.cursor_pos, c.settled::text, c.ver
             FROM comb.cursors_now c",
        )
        .unwrap();
    assert_eq!(got.trim(), "7|5|{7}|1");
}

/// Schema versions 5 and 6 on a database that holds messages and cursor states: every
/// segment and generation table gets its planner setting, the tables holding rows are
/// analysed with it, and a cursor's state is still its highest version.
#[test]
fn planner_settings_reach_tables_that_hold_rows() {
    let pg = Postgres::shared();
    let url = pg.create_database("m_stats").unwrap();
    let db = url.rsplit('/').next().unwrap().to_string();
    pg.psql(
        &db,
        &format!(
            "{v12}
         INSERT INTO comb.queues (id, name) VALUES ('00000000-0000-0000-0000-000000000001', 'q');
         INSERT INTO comb.partitions (id, queue_id, name, head_pos, last_push_at)
         VALUES ('00000000-0000-0000-0000-0000000000a1', '00000000-0000-0000-0000-000000000001',
                 'p', 7, now());
         INSERT INTO comb.messages
             (partition_id, pos, seg, message_id, transaction_id, payload, created_at)
         SELECT '00000000-0000-0000-0000-0000000000a1', n, 1, gen_random_uuid(), 't' || n,
                '{{}}', now()
         FROM generate_series(1, 7) n;
         INSERT INTO comb.subscriptions (queue_id, consumer_group, mode)
         VALUES ('00000000-0000-0000-0000-000000000001', 'g', 'all');
         INSERT INTO comb.cursors (partition_id, consumer_group, queue_id, cursor_pos)
         VALUES ('00000000-0000-0000-0000-0000000000a1', 'g',
                 '00000000-0000-0000-0000-000000000001', 5);
         {v3}
         {v4}
         {v5}
         INSERT INTO comb.cursor_states (partition_id, consumer_group, gen, ver, cursor_pos)
         VALUES ('00000000-0000-0000-0000-0000000000a1', 'g', 1, 2, 6);
         INSERT INTO comb.migrations (version, name) VALUES (1, 'init'), (2, 'segments'),
             (3, 'insert_only_state'), (4, 'transaction_index'), (5, 'partition_depth');",
            v12 = schema_through_v2(),
            v3 = migration_sql("0003_insert_only_state.sql"),
            v4 = migration_sql("0004_transaction_index.sql"),
            v5 = migration_sql("0005_partition_depth.sql"),
        ),
    )
    .unwrap();
    migrate(&url);
    let options = |parent: &str| {
        pg.psql(
            &db,
            &format!(
                "SELECT string_agg(DISTINCT coalesce('{{' || (SELECT string_agg(o.option_name || '=' || o.option_value, ',') FROM pg_options_to_table(a.attoptions) o WHERE o.option_name <> 'pg_attver') || '}}', 'none')
                                   || ' analysed ' || EXISTS (
                                       SELECT 1 FROM pg_statistic st WHERE st.starelid = c.oid),
                                   ',')
                 FROM pg_inherits h
                 JOIN pg_class c ON c.oid = h.inhrelid
                 JOIN pg_attribute a ON a.attrelid = h.inhrelid AND a.attname = 'partition_id'
                 WHERE h.inhparent = '{parent}'::regclass"
            ),
        )
        .unwrap()
    };
    assert_eq!(
        options("comb.messages").trim(),
        "{n_distinct=100} analysed true"
    );
    assert_eq!(
        options("comb.cursor_states").trim(),
        "{n_distinct=1} analysed true"
    );
    let state = pg
        .psql(
            &db,
            "SELECT ver, cursor_pos FROM comb.cursor_state(
                 '00000000-0000-0000-0000-0000000000a1', 'g')",
        )
        .unwrap();
    assert_eq!(state.trim(), "2|6");
}

/// The SQL that brings an empty database to schema version 2 the way the migrate command
/// did, without recording the versions (tests add data, then record them).
fn schema_through_v2() -> String {
    format!(
        "CREATE SCHEMA comb;
         CREATE TABLE comb.migrations (version integer PRIMARY KEY, name text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now());
         {}
         {}",
        migration_sql("0001_init.sql"),
        migration_sql("0002_segments.sql")
    )
}

/// One migration file's SQL.
fn migration_sql(file: &str) -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/schema/migrations");
    std::fs::read_to_string(format!("{dir}/{file}")).unwrap()
}

/// Runs `comb migrate` against `url` and expects it to succeed.
fn migrate(url: &str) {
    let out = comb(&["migrate"], url);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Where the whole current schema is written down, generated from the migrations.
const SCHEMA_SQL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/schema/schema.sql");

/// What heads `schema.sql`: what it is and how it is made.
const SCHEMA_HEADER: &str = "\
-- The whole schema `comb` as the migrations in `migrations/` leave it: every table, index,
-- function and view once, in its current form. Generated, never edited by hand: a new
-- migration changes it, and `cargo test -p comb --test suite -- migrate::schema_sql` fails
-- until it is written again with
--     COMB_WRITE_SCHEMA=1 cargo test -p comb --test suite -- migrate::schema_sql
-- It is `pg_dump --schema-only --schema=comb` of a freshly migrated database without owners,
-- privileges, session settings and pg_dump's own comments. Left out: the leaf tables of the
-- partitioned tables (`messages_<seg>`, `cursor_states_<gen>`, `<table>_<yyyymmdd>`), which
-- maintenance makes and drops as time passes.
";

/// `pg_dump` of the schema `comb` of database `db`, normalised as [`SCHEMA_HEADER`] says.
fn schema_dump(pg: &Postgres, db: &str) -> String {
    let bin = comb_harness::pg_bin_dir().unwrap().join("pg_dump");
    let mut cmd = Command::new(bin);
    for var in [
        "PGHOST",
        "PGHOSTADDR",
        "PGPORT",
        "PGDATABASE",
        "PGUSER",
        "PGSERVICE",
    ] {
        cmd.env_remove(var);
    }
    let out = cmd
        .args(["-h", "127.0.0.1", "-U", "postgres", "-p"])
        .arg(pg.port().to_string())
        .args([
            "--schema-only",
            "--schema=comb",
            "--no-owner",
            "--no-privileges",
        ])
        .args([
            "-T",
            "comb.messages_[0-9]*",
            "-T",
            "comb.cursor_states_[0-9]*",
        ])
        .args(["-T", "comb.*_[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]"])
        .arg(db)
        .output()
        .expect("pg_dump runs");
    assert!(
        out.status.success(),
        "pg_dump: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dump = String::from_utf8(out.stdout).unwrap();
    let own_lines = |l: &str| {
        l == "--"
            || [
                "-- Name: ",
                "-- Dumped ",
                "-- PostgreSQL database dump",
                "SET ",
                "\\restrict",
                "\\unrestrict",
            ]
            .iter()
            .any(|p| l.starts_with(p))
            || l.starts_with("SELECT pg_catalog.set_config('search_path'")
    };
    let mut text = String::from(SCHEMA_HEADER);
    let mut blank = true;
    for line in dump.lines().filter(|l| !own_lines(l)) {
        let line = line.trim_end();
        if line.is_empty() {
            if !blank {
                text.push('\n');
            }
            blank = true;
        } else {
            text.push_str(line);
            text.push('\n');
            blank = false;
        }
    }
    while text.ends_with("\n\n") {
        text.pop();
    }
    text
}

/// `schema.sql` is what the migrations make; a migration that changes the schema changes it
/// too, so one file shows the schema as it is.
#[test]
fn schema_sql_is_what_the_migrations_make() {
    let pg = Postgres::shared();
    let url = pg.create_database("m_schema").unwrap();
    let db = url.rsplit('/').next().unwrap().to_string();
    migrate(&url);
    let dump = schema_dump(pg, &db);
    if std::env::var_os("COMB_WRITE_SCHEMA").is_some() {
        std::fs::write(SCHEMA_SQL, &dump).unwrap();
    }
    let file = std::fs::read_to_string(SCHEMA_SQL).unwrap_or_default();
    assert!(
        file == dump,
        "crates/comb/src/schema/schema.sql is not what the migrations make; write it again with\n    \
         COMB_WRITE_SCHEMA=1 cargo test -p comb --test suite -- migrate::schema_sql\n\
         and review the difference (git diff)"
    );
}

/// Brings an empty database to schema version `to` the way `comb migrate` does, one file
/// at a time, recording each version (tests add data the old way, then migrate the rest).
fn migrate_to(pg: &Postgres, db: &str, to: u32) {
    pg.psql(
        db,
        "CREATE SCHEMA comb;
         CREATE TABLE comb.migrations (version integer PRIMARY KEY, name text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now());",
    )
    .unwrap();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/schema/migrations");
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|f| f.ends_with(".sql"))
        .collect();
    files.sort();
    for file in files {
        let (number, name) = file.trim_end_matches(".sql").split_once('_').unwrap();
        let version: u32 = number.parse().unwrap();
        if version > to {
            break;
        }
        pg.psql(
            db,
            &format!(
                "{}\nINSERT INTO comb.migrations (version, name) VALUES ({version}, '{name}');",
                migration_sql(&file)
            ),
        )
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    }
}

/// Stream state written as schema 17 kept it (each version the pair's whole state, in
/// `comb.stream_states`) arrives with migration 18 as a row per key of each pair's newest
/// version in `comb.stream_state_keys`, with its value and the time it was written, and reads
/// back through `POST /streams/v1/state/get`; the next cycle goes on from that version.
#[tokio::test]
async fn upgrade_to_per_key_stream_state_carries_every_key_and_value() {
    let pg = Postgres::shared();
    let url = pg.create_database("m_keys").unwrap();
    let db = url.rsplit('/').next().unwrap().to_string();
    migrate_to(pg, &db, 17);
    assert_eq!(
        pg.psql(&db, "SELECT max(version) FROM comb.migrations")
            .unwrap(),
        "17"
    );
    let (queue, query) = (
        "00000000-0000-0000-0000-000000000001",
        "00000000-0000-0000-0000-0000000000f1",
    );
    let (p1, p2) = (
        "00000000-0000-0000-0000-0000000000a1",
        "00000000-0000-0000-0000-0000000000a2",
    );
    // Pair 1: an older version (a key since deleted) and the newest, with a window's
    // accumulator, a JSON null, an array and a key of the SDK's separators; pair 2: one version.
    // Cycles wrote their versions into the newest cursor state generation.
    let window_key = "tumb:1\u{1f}2026-11-29T00:00:00.000Z\u{1f}ann";
    let newest = json!({
        window_key: {"acc": {"count": 2, "sum": 17}, "windowStart": 1, "windowEnd": 2},
        "a": {"n": 2}, "nothing": null, "list": [1, "two", 3.5], "ünïcode ✓": "é",
    });
    let updated = json!({window_key: 1_795_910_400_123i64, "a": 1_795_910_401_000i64,
                         "nothing": 1_795_910_402_000i64, "list": 1_795_910_403_000i64,
                         "ünïcode ✓": 1_795_910_404_000i64});
    let lit = |v: &Value| v.to_string().replace('\'', "''");
    pg.psql(
        &db,
        &format!(
            "INSERT INTO comb.queues (id, name) VALUES ('{queue}', 'src');
             INSERT INTO comb.partitions (id, queue_id, name) VALUES
                 ('{p1}', '{queue}', 'p1'), ('{p2}', '{queue}', 'p2');
             INSERT INTO comb.stream_queries (id, name, source_queue, config_hash)
                 VALUES ('{query}', 'old.q', 'src', 'h');
             INSERT INTO comb.stream_partitions (partition_id, query_id)
                 VALUES ('{p1}', '{query}'), ('{p2}', '{query}');
             INSERT INTO comb.stream_states (partition_id, query_id, gen, ver, state, updated,
                                             keys, bytes)
             SELECT '{p1}'::uuid, '{query}'::uuid, g, 1::bigint,
                    '{{\"gone\": 1, \"a\": {{\"n\": 1}}}}'::jsonb,
                    '{{\"gone\": 0, \"a\": 0}}'::jsonb, 2, 20
             FROM (SELECT min(gen) AS g FROM comb.cursor_gens) gens
             UNION ALL
             SELECT '{p1}', '{query}', g, 2, '{}', '{}', 5, 200
             FROM (SELECT max(gen) AS g FROM comb.cursor_gens) gens
             UNION ALL
             SELECT '{p2}', '{query}', g, 1, '{{\"b\": true}}', '{{\"b\": 1795910405000}}', 1, 9
             FROM (SELECT max(gen) AS g FROM comb.cursor_gens) gens;",
            lit(&newest),
            lit(&updated)
        ),
    )
    .unwrap();
    migrate(&url);

    // Every key of each pair's newest version, with its version, value and time; the key
    // only an older version held is not there.
    let rows = pg
        .psql(
            &db,
            "SELECT partition_id, key, ver, value::text,
                    (extract(epoch FROM written_at) * 1000)::bigint
             FROM comb.stream_state_keys ORDER BY partition_id, key COLLATE \"C\"",
        )
        .unwrap();
    let mut want: Vec<String> = newest
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            let v: Value = serde_json::from_str(&v.to_string()).unwrap();
            format!("{p1}|{k}|2|{}|{}", jsonb_text(&v), updated[k])
        })
        .collect();
    want.sort();
    want.push(format!("{p2}|b|1|true|1795910405000"));
    assert_eq!(rows, want.join("\n"));
    assert_eq!(
        pg.psql(
            &db,
            "SELECT count(*) FROM comb.migrations WHERE version = 18"
        )
        .unwrap(),
        "1"
    );

    // Through the API: the same keys and values, and a cycle continues from version 2.
    let server = comb_harness::Server::start(comb_bin(), &url, &[]).unwrap();
    let http = crate::common::client();
    let base = format!("http://{}", server.addr());
    let state = |partition: &'static str| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let r = http
                .post(format!("{base}/streams/v1/state/get"))
                .json(&json!({"query_id": query, "partition_id": partition}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let body: Value = r.json().await.unwrap();
            body["rows"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| (r["key"].as_str().unwrap().to_string(), r["value"].clone()))
                .collect::<serde_json::Map<String, Value>>()
        }
    };
    assert_eq!(Value::Object(state(p1).await), newest);
    assert_eq!(Value::Object(state(p2).await), json!({"b": true}));
    let r = http
        .post(format!("{base}/streams/v1/cycle"))
        .json(
            &json!({"query_id": query, "partition_id": p1, "consumer_group": "streams.old.q",
                      "state_ops": [{"type": "upsert", "key": "a", "value": {"n": 3}},
                                    {"type": "delete", "key": window_key}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let mut after = newest.clone();
    after["a"] = json!({"n": 3});
    after.as_object_mut().unwrap().remove(window_key);
    assert_eq!(Value::Object(state(p1).await), after);
    assert_eq!(
        pg.psql(
            &db,
            &format!("SELECT max(ver) FROM comb.stream_state_keys WHERE partition_id = '{p1}'")
        )
        .unwrap(),
        "3"
    );
}

/// `value::text` of a jsonb value as PostgreSQL prints it: `", "` and `": "` between items.
fn jsonb_text(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut items: Vec<(&String, &Value)> = m.iter().collect();
            // jsonb orders keys by length, then bytes.
            items.sort_by(|a, b| a.0.len().cmp(&b.0.len()).then(a.0.cmp(b.0)));
            let inner: Vec<String> = items
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::String((*k).clone()), jsonb_text(v)))
                .collect();
            format!("{{{}}}", inner.join(", "))
        }
        Value::Array(a) => {
            let inner: Vec<String> = a.iter().map(jsonb_text).collect();
            format!("[{}]", inner.join(", "))
        }
        other => other.to_string(),
    }
}
