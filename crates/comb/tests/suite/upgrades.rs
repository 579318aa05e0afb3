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
    let set = functions(&env, "%\\_v4");
    assert!(
        set.contains("store_batch_v4") || set.contains("claim_partition_v4"),
        "{set}"
    );
    // Made once: a second server of the same release leaves the set as it is.
    let made = |env: &Env| {
        env.sql(
            "SELECT string_agg(xmin::text, ',' ORDER BY proname) FROM pg_proc
             WHERE pronamespace = 'comb'::regnamespace AND proname LIKE '%\\_v4'",
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
    assert_eq!(functions(&env, "%\\_v4"), set);
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
    // A database nothing has migrated (on Citus, not the suite's template).
    let url = if common::on_citus() {
        comb_harness::Citus::shared().create_database("t")
    } else {
        comb_harness::Postgres::shared().create_database("t")
    }
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
    let count = if common::on_citus() {
        comb_harness::Citus::shared()
            .coordinator()
            .psql(db, "SELECT count(*) FROM comb.migrations")
    } else {
        comb_harness::Postgres::shared().psql(db, "SELECT count(*) FROM comb.migrations")
    }
    .unwrap();
    assert_eq!(count.trim(), "21");
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
    // A statement of its own: Citus refuses to propagate a column's drop sent with other
    // commands in one query string (as `psql -c` sends them).
    env.sql("ALTER TABLE comb.cursor_states DROP COLUMN lease_digest");
    env.sql(
        "BEGIN;
         DROP FUNCTION IF EXISTS comb.store_batch_v4, comb.hand_off_v4, comb.complete_acks_v4,
             comb.claim_partition_v4, comb.judge_acks_v4, comb.extend_lease_v4,
             comb.create_partition_v4;
         DROP TABLE comb.servers, comb.schema_settings;
         DELETE FROM comb.migrations WHERE version IN (19, 20, 21);
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
    assert_eq!(env.sql("SELECT max(version) FROM comb.migrations"), "21");
    assert_eq!(
        env.sql("SELECT count(*) FROM comb.servers"),
        "1",
        "the new server registered"
    );
    let (s, health) = common::get_url(&env.http, &format!("{}/health", next.base_url())).await;
    assert_eq!(s, 200, "{health}");
}

/// The release before this one, as `scripts/build-release.sh` builds it (once; kept under
/// `target/releases`). Blocking. Fails, never skips, when it cannot be built.
fn previous_release() -> std::path::PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let release = std::fs::read_to_string(root.join("releases.txt"))
        .unwrap()
        .lines()
        .rfind(|l| l.starts_with('v'))
        .and_then(|l| l.split_whitespace().next())
        .expect("a release in releases.txt")
        .to_string();
    let built = std::process::Command::new(root.join("scripts/build-release.sh"))
        .arg(&release)
        .current_dir(&root)
        .output()
        .expect("scripts/build-release.sh runs");
    assert!(
        built.status.success(),
        "the previous release {release} could not be built:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    root.join("target/releases").join(&release).join("comb")
}

/// What the load of the upgrade test saw: messages accepted, deliveries, and every answer that
/// was not a success.
#[derive(Default)]
struct Ledger {
    accepted: std::collections::HashSet<String>,
    delivered: std::collections::HashMap<String, usize>,
    acked: std::collections::HashSet<String>,
    errors: Vec<String>,
}

/// Pushes batches of 5 to random partitions of `up` through `base` until `stop`.
async fn produce(
    base: String,
    name: &'static str,
    ledger: std::sync::Arc<std::sync::Mutex<Ledger>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    let http = common::client();
    let mut k = 0u64;
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let ids: Vec<String> = (0..5).map(|i| format!("{name}-{k}-{i}")).collect();
        let items: Vec<serde_json::Value> = ids
            .iter()
            .map(|id| json!({"queue": "up", "partition": format!("p{}", k % 8), "transactionId": id, "payload": {"id": id}}))
            .collect();
        k += 1;
        let r = http
            .post(format!("{base}/api/v1/push"))
            .json(&json!({ "items": items }))
            .send()
            .await;
        let mut l = ledger.lock().unwrap();
        match r {
            Ok(r) if r.status() == reqwest::StatusCode::CREATED => l.accepted.extend(ids),
            Ok(r) => l
                .errors
                .push(format!("push through {name}: {}", r.status())),
            Err(e) => l.errors.push(format!("push through {name}: {e}")),
        }
    }
}

/// Pops `up` through `base` and acks what it gets, until `stop` and then until the queue
/// stays empty.
async fn consume(
    base: String,
    name: &'static str,
    ledger: std::sync::Arc<std::sync::Mutex<Ledger>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    let http = common::client();
    let mut empty = 0;
    while empty < 3 {
        let r = http
            .get(format!(
                "{base}/api/v1/pop/queue/up?batch=10&wait=true&timeout=500"
            ))
            .send()
            .await;
        let pop: serde_json::Value = match r {
            Ok(r) if r.status() == reqwest::StatusCode::NO_CONTENT => {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    empty += 1;
                }
                continue;
            }
            Ok(r) if r.status() == reqwest::StatusCode::OK => r.json().await.unwrap(),
            Ok(r) => {
                ledger
                    .lock()
                    .unwrap()
                    .errors
                    .push(format!("pop through {name}: {}", r.status()));
                continue;
            }
            Err(e) => {
                ledger
                    .lock()
                    .unwrap()
                    .errors
                    .push(format!("pop through {name}: {e}"));
                continue;
            }
        };
        empty = 0;
        let messages = pop["messages"].as_array().unwrap().clone();
        {
            let mut l = ledger.lock().unwrap();
            for m in &messages {
                *l.delivered
                    .entry(m["transactionId"].as_str().unwrap().to_string())
                    .or_default() += 1;
            }
        }
        let acks: Vec<serde_json::Value> = messages
            .iter()
            .map(|m| {
                json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                           "leaseId": m["leaseId"], "status": "completed"})
            })
            .collect();
        let r = http
            .post(format!("{base}/api/v1/ack/batch"))
            .json(&json!({ "acknowledgments": acks }))
            .send()
            .await;
        let answered = match r {
            Ok(r) if r.status() == reqwest::StatusCode::OK => {
                Ok(r.json::<serde_json::Value>().await.unwrap())
            }
            Ok(r) => Err(format!("ack through {name}: {}", r.status())),
            Err(e) => Err(format!("ack through {name}: {e}")),
        };
        let mut l = ledger.lock().unwrap();
        match answered {
            Ok(body) => {
                for (m, a) in messages.iter().zip(body.as_array().unwrap()) {
                    if a["success"] == true {
                        l.acked
                            .insert(m["transactionId"].as_str().unwrap().to_string());
                    } else {
                        l.errors.push(format!("ack through {name}: {a}"));
                    }
                }
            }
            Err(e) => l.errors.push(e),
        }
    }
}

/// The lines of a server's log that report an error.
fn error_lines(server: &comb_harness::Server) -> Vec<String> {
    server
        .log_tail(100_000)
        .lines()
        .filter(|l| l.contains("ERROR"))
        .map(str::to_string)
        .collect()
}

/// An upgrade under traffic from the previous release (`releases.txt`, built from its tag by
/// `scripts/build-release.sh`): its server makes a fresh database and holds messages in
/// flight, leases, a group's cursor, a dead letter and stream state; the current server
/// starts beside it and upgrades the schema while the old one keeps serving pushes, pops and
/// acks. Nothing pushed is lost, nothing is delivered twice (no lease ends in the test), the
/// old state reads the same through the new server, and neither server answers or logs an
/// error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_upgrades_under_traffic_from_the_previous_one() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let old_bin = tokio::task::spawn_blocking(previous_release).await.unwrap();
    let (old, db_url) = tokio::task::spawn_blocking(move || {
        // A database the old release makes and migrates itself (not the suite's template).
        let db_url = if common::on_citus() {
            comb_harness::Citus::shared().create_database("upgrade")
        } else {
            comb_harness::Postgres::shared().create_database("upgrade")
        }
        .unwrap();
        let old =
            comb_harness::Server::start(&old_bin, &db_url, &[]).expect("the old release starts");
        (old, db_url)
    })
    .await
    .unwrap();
    let old = Env {
        server: old,
        db_name: db_url.rsplit('/').next().unwrap().to_string(),
        db_url,
        http: common::client(),
    };
    let (s, health) = old.get("/health").await;
    assert_eq!(s, reqwest::StatusCode::OK, "{health}");
    assert!(
        health.get("version").is_none(),
        "not the previous release: {health}"
    );

    // State the old release leaves: a group's cursor part-way, leases held, a dead letter,
    // stream state.
    let numbered = |q: &str, n: i64| -> serde_json::Value {
        json!(
            (1..=n)
                .map(|i| json!({"queue": q, "partition": "p", "payload": {"n": i}}))
                .collect::<Vec<_>>()
        )
    };
    old.push(numbered("grp", 10)).await;
    let first = old
        .pop("/api/v1/pop/queue/grp?consumerGroup=g1&batch=4")
        .await
        .unwrap();
    assert_eq!(common::numbers(&first), vec![1, 2, 3, 4]);
    old.ack_all(&first, "completed", Some("g1")).await;
    old.push(numbered("held", 3)).await;
    let held = old.pop("/api/v1/pop/queue/held?batch=3").await.unwrap();
    old.configure("dl", json!({"retryLimit": 0})).await;
    old.push(numbered("dl", 1)).await;
    let dl = old.pop("/api/v1/pop/queue/dl").await.unwrap();
    old.ack_all(&dl, "failed", None).await;
    let (s, query) = old
        .post(
            "/streams/v1/queries",
            &json!({"name": "q", "source_queue": "src", "sink_queue": "sink", "config_hash": "h"}),
        )
        .await;
    assert_eq!(s, reqwest::StatusCode::OK, "{query}");
    let query = query["query_id"].clone();
    old.push(json!([{"queue": "src", "partition": "p", "payload": 1, "transactionId": "s1"}]))
        .await;
    let src = old
        .pop("/api/v1/pop/queue/src?consumerGroup=streams.q")
        .await
        .unwrap();
    let m = &src["messages"][0];
    let (s, body) = old
        .post(
            "/streams/v1/cycle",
            &json!({"query_id": query, "partition_id": src["partitionId"], "consumer_group": "streams.q",
                    "state_ops": [{"type": "upsert", "key": "k", "value": {"acc": 7}}],
                    "push_items": [],
                    "ack": {"transactionId": m["transactionId"], "leaseId": m["leaseId"],
                            "status": "completed", "count": 1}}),
        )
        .await;
    assert_eq!(s, reqwest::StatusCode::OK, "{body}");

    // Traffic through the old release, then the current one starts beside it and upgrades.
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let (stop, drained) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let old_base = old.server.base_url();
    let mut tasks = vec![
        tokio::spawn(produce(
            old_base.clone(),
            "old",
            ledger.clone(),
            stop.clone(),
        )),
        tokio::spawn(consume(
            old_base.clone(),
            "old",
            ledger.clone(),
            drained.clone(),
        )),
    ];
    tokio::time::sleep(Duration::from_secs(2)).await;
    let new = Env {
        server: old.second_server().await,
        db_url: old.db_url.clone(),
        db_name: old.db_name.clone(),
        http: common::client(),
    };
    let new_base = new.server.base_url();
    let (s, health) = new.get("/health").await;
    assert_eq!(s, reqwest::StatusCode::OK, "{health}");
    assert_eq!(health["version"], env!("CARGO_PKG_VERSION"), "{health}");
    tasks.push(tokio::spawn(produce(
        new_base.clone(),
        "new",
        ledger.clone(),
        stop.clone(),
    )));
    tasks.push(tokio::spawn(consume(
        new_base.clone(),
        "new",
        ledger.clone(),
        drained.clone(),
    )));
    tokio::time::sleep(Duration::from_secs(4)).await;
    // The old release still serves after the upgrade: its own pushes, pops and acks went on.
    stop.store(true, Ordering::SeqCst);
    drained.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }

    {
        let l = ledger.lock().unwrap();
        assert!(l.errors.is_empty(), "answers that failed: {:?}", l.errors);
        let lost: Vec<&String> = l
            .accepted
            .iter()
            .filter(|id| !l.acked.contains(*id))
            .collect();
        assert!(
            lost.is_empty(),
            "{} of {} accepted not delivered and acked: {:?}",
            lost.len(),
            l.accepted.len(),
            &lost[..lost.len().min(5)]
        );
        let twice: Vec<(&String, &usize)> = l.delivered.iter().filter(|(_, n)| **n > 1).collect();
        assert!(twice.is_empty(), "delivered more than once: {twice:?}");
        let by = |who: &str| l.accepted.iter().filter(|id| id.starts_with(who)).count();
        assert!(by("old-") > 0 && by("new-") > 0, "both servers took pushes");
    }

    // The old release's state, read and moved on through the new server.
    let next = new
        .pop("/api/v1/pop/queue/grp?consumerGroup=g1&batch=10")
        .await
        .expect("the group's cursor went on");
    assert_eq!(common::numbers(&next), (5..=10).collect::<Vec<_>>());
    let acked = new.ack_all(&held, "completed", None).await;
    assert!(
        acked.iter().all(|a| a["success"] == true),
        "a lease the old release granted, acked through the new one: {acked:?}"
    );
    let (_, dlq) = new.get("/api/v1/dlq?queue=dl").await;
    assert_eq!(dlq["total"], 1, "{dlq}");
    let (s, state) = new
        .post(
            "/streams/v1/state/get",
            &json!({"query_id": query, "partition_id": src["partitionId"], "keys": []}),
        )
        .await;
    assert_eq!(s, reqwest::StatusCode::OK, "{state}");
    assert_eq!(state["rows"][0]["value"], json!({"acc": 7}), "{state}");

    let errors: Vec<String> = error_lines(&old.server)
        .into_iter()
        .chain(error_lines(&new.server))
        .collect();
    assert!(errors.is_empty(), "errors logged: {errors:#?}");
}
