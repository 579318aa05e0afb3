//! Upgrades under traffic: each release calls its own set of data-path functions (versioned
//! names, made once, never replaced; a set no registered server calls is dropped), a server
//! starts on a newer schema that still serves its release and refuses one that does not, and
//! servers starting together migrate once.

use std::time::Duration;

use serde_json::json;

use crate::common::{self, Env};

/// The data-path functions in `comb`, as `name` sorted, joined by commas.
fn functions(env: &Env, like: &str) -> String {
    env.sql(&format!(
        "SELECT coalesce(string_agg(proname, ',' ORDER BY proname), '') FROM pg_proc
         WHERE pronamespace = 'comb'::regnamespace AND proname LIKE '{like}'"
    ))
}

#[tokio::test]
async fn a_release_makes_its_set_of_functions_once_and_unused_sets_are_dropped() {
    let env = Env::start_with(&["--maintenance-interval-ms", "300"]).await;
    let set = functions(&env, "%\\_v2");
    assert!(
        set.contains("store_batch_v2") || set.contains("claim_partition_v2"),
        "{set}"
    );
    // Made once: a second server of the same release leaves the set as it is.
    let made = |env: &Env| {
        env.sql(
            "SELECT string_agg(xmin::text, ',' ORDER BY proname) FROM pg_proc
             WHERE pronamespace = 'comb'::regnamespace AND proname LIKE '%\\_v2'",
        )
    };
    let before = made(&env);
    let _second = env.second_server().await;
    assert_eq!(made(&env), before, "the set was made again");
    // Traffic runs through the set.
    env.push(json!([{"queue": "q", "partition": "p", "payload": {"n": 1}}]))
        .await;
    let popped = env.pop("/api/v1/pop/queue/q?wait=false").await.unwrap();
    assert_eq!(env.ack_all(&popped, "completed", None).await.len(), 1);

    // Another release's set, called by a registered server of that release, and 0.1.0's
    // unversioned functions (its servers do not register).
    env.sql(
        "CREATE FUNCTION comb.hand_off_v9() RETURNS integer LANGUAGE sql AS 'SELECT 9';
         CREATE FUNCTION comb.hand_off() RETURNS integer LANGUAGE sql AS 'SELECT 1';
         INSERT INTO comb.servers (id, host, listen, pid, version, functions_version,
                                   schema_version)
         VALUES (gen_random_uuid(), 'elsewhere', '10.0.0.9:6632', 1, '9.0.0', 9, 99)",
    );
    // Several maintenance cycles pass: a set a registered server calls stays.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(functions(&env, "hand\\_off\\_v9"), "hand_off_v9");
    // Its server falls silent: forgotten after three missed beats, and its set dropped. This
    // release's set and 0.1.0's functions stay.
    env.sql("UPDATE comb.servers SET heartbeat_at = now() - interval '1 minute' WHERE functions_version = 9");
    common::until("the silent release's set dropped", || async {
        functions(&env, "hand\\_off\\_v9").is_empty()
    })
    .await;
    assert_eq!(functions(&env, "%\\_v2"), set);
    assert_eq!(functions(&env, "hand\\_off"), "hand_off");
}

/// A server of this release on a schema a newer release migrated, which still serves this
/// release (`min_server_version`), starts without migrating anything and serves.
#[tokio::test]
async fn a_server_starts_on_a_newer_schema_that_still_serves_its_release() {
    let env = Env::start().await;
    env.sql(
        "INSERT INTO comb.migrations (version, name) VALUES (999, 'from a later release');
         UPDATE comb.schema_settings SET value = '0.1.0' WHERE name = 'min_server_version'",
    );
    let second = env.second_server().await;
    let (s, health) = common::get_url(&env.http, &format!("{}/health", second.base_url())).await;
    assert_eq!(s, 200, "{health}");
    assert_eq!(env.sql("SELECT max(version) FROM comb.migrations"), "999");
    // It serves: a push through it is popped through the first server.
    let (s, pushed) = env
        .http
        .post(format!("{}/api/v1/push", second.base_url()))
        .json(&json!({"items": [{"queue": "q", "payload": {"n": 1}}]}))
        .send()
        .await
        .map(|r| (r.status(), r))
        .unwrap();
    assert!(s.is_success(), "{:?}", pushed.text().await);
    let popped = env.pop("/api/v1/pop/queue/q?wait=false").await.unwrap();
    assert_eq!(popped["messages"][0]["data"], json!({"n": 1}), "{popped}");
}

/// Two servers started at once on an empty database: one migrates while the other waits on
/// the migrations' lock; both serve, and neither logs an error. (On one
/// PostgreSQL: a Citus test database is a copy of one migrated already.)
#[tokio::test]
async fn two_servers_starting_together_on_an_empty_database_migrate_once() {
    let url = comb_harness::Postgres::shared()
        .create_database("t")
        .unwrap();
    let starts: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                comb_harness::Server::start(common::comb_bin(), &url, &[]).expect("starts")
            })
        })
        .collect();
    let servers: Vec<_> = starts.into_iter().map(|t| t.join().unwrap()).collect();
    for s in &servers {
        let (status, health) =
            common::get_url(&common::client(), &format!("{}/health", s.base_url())).await;
        assert_eq!(status, 200, "{health}");
        let log = std::fs::read_to_string(s.log_path()).unwrap();
        let problems: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
        assert!(
            problems.is_empty(),
            "a server logged an error: {problems:#?}"
        );
    }
    let migrated: usize = servers
        .iter()
        .filter(|s| s.log_tail(200).contains("schema migrated"))
        .count();
    assert_eq!(migrated, 1, "exactly one server migrates");
    let db = url.rsplit('/').next().unwrap();
    let count = comb_harness::Postgres::shared()
        .psql(db, "SELECT count(*) FROM comb.migrations")
        .unwrap();
    assert_eq!(count.trim(), "20");
}

/// A server killed in the middle of a migration leaves nothing of it: the pending migrations
/// run in one transaction, which PostgreSQL rolls back when its connection goes; the next
/// start applies them all. The database is taken back to schema 18 as `docs/upgrading.md`
/// says ("From 0.2.0 back to 0.1.0"), and the record of migration 19 is held by another
/// transaction, so that the migrating server waits after running migration 19's statements.
#[tokio::test]
async fn a_server_killed_mid_migration_leaves_nothing_and_the_next_start_finishes() {
    let mut env = Env::start().await;
    assert!(env.server.terminate(common::PATIENCE).is_some());
    env.sql(
        "BEGIN;
         DROP FUNCTION IF EXISTS comb.store_batch_v2, comb.hand_off_v2, comb.complete_acks_v2,
             comb.claim_partition_v2, comb.judge_acks_v2, comb.extend_lease_v2,
             comb.create_partition_v2;
         DROP TABLE comb.servers, comb.schema_settings;
         DELETE FROM comb.migrations WHERE version IN (19, 20);
         COMMIT;",
    );
    let (blocker, connection) = tokio_postgres::connect(&env.db_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    blocker
        .batch_execute(
            "BEGIN; INSERT INTO comb.migrations (version, name) VALUES (19, 'held elsewhere')",
        )
        .await
        .unwrap();
    let mut server = std::process::Command::new(common::comb_bin())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("DATABASE_URL", &env.db_url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The server has run migration 19's statements and waits to record it.
    let waiting = "SELECT pid FROM pg_stat_activity
                   WHERE datname = current_database() AND wait_event_type = 'Lock'
                     AND query LIKE 'INSERT INTO comb.migrations%'";
    common::until("the migration waits on its record", || async {
        !env.sql(waiting).is_empty()
    })
    .await;
    assert_eq!(
        env.sql("SELECT count(*) FROM pg_class WHERE relname = 'servers'"),
        "0",
        "uncommitted: nobody else sees migration 19's table"
    );
    server.kill().unwrap();
    server.wait().unwrap();
    // Its connection is gone, and with it the migration's transaction.
    env.sql(&format!(
        "SELECT pg_terminate_backend(pid) FROM ({waiting}) w"
    ));
    blocker.batch_execute("ROLLBACK").await.unwrap();
    common::until("the killed migration rolled back", || async {
        env.sql(waiting).is_empty()
    })
    .await;
    assert_eq!(env.sql("SELECT max(version) FROM comb.migrations"), "18");
    assert_eq!(env.sql("SELECT to_regclass('comb.servers') IS NULL"), "t");

    // The next start finishes the job, and serves.
    let next = env.second_server().await;
    assert_eq!(env.sql("SELECT max(version) FROM comb.migrations"), "20");
    assert_eq!(
        env.sql("SELECT count(*) FROM comb.servers"),
        "1",
        "the new server registered"
    );
    let (s, health) = common::get_url(&env.http, &format!("{}/health", next.base_url())).await;
    assert_eq!(s, 200, "{health}");
}
