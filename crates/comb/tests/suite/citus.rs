//! Comb on a Citus cluster (`comb_harness::Citus`: a coordinator and two workers on
//! loopback, `scripts/install-citus.sh`): what `comb migrate` distributes, and by what
//! (`docs/scale-out.md`). Without Citus the schema is left as the migrations make it.

use std::process::Command;
use std::time::Duration;

use comb_harness::{Citus, Postgres, Server};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{self, Env, numbers, one};

/// Runs `comb migrate` against `url` and returns its combined output; panics if it fails.
fn migrate(url: &str) -> String {
    let out = Command::new(common::comb_bin())
        .arg("migrate")
        .env("DATABASE_URL", url)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "comb migrate failed:\n{text}");
    text
}

/// Every table of schema `comb` with its Citus kind, distribution column and co-location.
fn layout(citus: &Citus, db: &str) -> Vec<(String, String, String, String)> {
    let rows = citus
        .coordinator()
        .psql(
            db,
            "SELECT c.oid::regclass::text, coalesce(t.citus_table_type, 'none'),
                    coalesce(t.distribution_column, ''), coalesce(t.colocation_id::text, '')
             FROM pg_class c
             LEFT JOIN citus_tables t ON t.table_name = c.oid::regclass
             WHERE c.relnamespace = 'comb'::regnamespace AND c.relkind IN ('r', 'p')
               AND NOT c.relispartition
             ORDER BY 1",
        )
        .unwrap();
    rows.lines()
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            (f[0].into(), f[1].into(), f[2].into(), f[3].into())
        })
        .collect()
}

#[tokio::test]
async fn migrate_distributes_by_partition_co_located_with_catalogs_as_reference_tables() {
    let (citus, url) = tokio::task::spawn_blocking(|| {
        let citus = Citus::shared();
        let url = citus.create_database("citus_layout").unwrap();
        (citus, url)
    })
    .await
    .unwrap();
    let db = url.rsplit('/').next().unwrap().to_string();
    let first = migrate(&url);
    assert!(first.contains("distributed on Citus"), "{first}");

    let layout = layout(citus, &db);
    let of = |t: &str| {
        layout
            .iter()
            .find(|r| r.0 == t)
            .unwrap_or_else(|| panic!("{t} is not in {layout:?}"))
            .clone()
    };
    let anchor = of("comb.partitions");
    assert_eq!(
        (anchor.1.as_str(), anchor.2.as_str()),
        ("distributed", "id")
    );
    for t in [
        "comb.messages",
        "comb.cursor_states",
        "comb.cursors",
        "comb.segment_partitions",
        "comb.dead_letters",
        "comb.dead_letter_requeues",
        "comb.traces",
        "comb.stream_partitions",
        "comb.stream_states",
        "comb.stream_state_keys",
    ] {
        let r = of(t);
        assert_eq!(
            (r.1.as_str(), r.2.as_str(), r.3.as_str()),
            ("distributed", "partition_id", anchor.3.as_str()),
            "{t}: distributed by partition, co-located with comb.partitions"
        );
    }
    for t in [
        "comb.queues",
        "comb.subscriptions",
        "comb.segments",
        "comb.cursor_gens",
        "comb.system_modes",
        "comb.stream_queries",
        "comb.partition_ids",
    ] {
        assert_eq!(of(t).1, "reference", "{t}");
    }
    // Written once a minute or by maintenance, read by listings: on the coordinator.
    for t in [
        "comb.migrations",
        "comb.maintenance_runs",
        "comb.server_minutes",
        "comb.queue_minutes",
        "comb.group_minutes",
        "comb.queue_counts",
    ] {
        assert_eq!(of(t).1, "none", "{t} stays a table of the coordinator");
    }
    // Every leaf of a distributed partitioned table is distributed too (segments and
    // generations made by maintenance are attached to these parents).
    let leaves = citus
        .coordinator()
        .psql(
            &db,
            "SELECT count(*) FROM pg_inherits i
             WHERE i.inhparent IN ('comb.messages'::regclass, 'comb.cursor_states'::regclass,
                                   'comb.stream_states'::regclass,
                                   'comb.stream_state_keys'::regclass)
               AND NOT EXISTS (SELECT 1 FROM pg_dist_partition d
                               WHERE d.logicalrelid = i.inhrelid)",
        )
        .unwrap();
    assert_eq!(leaves, "0");
    // Functions of one partition run beside its rows.
    let functions = citus
        .coordinator()
        .psql(
            &db,
            "SELECT string_agg(objid::regprocedure::text, ',' ORDER BY 1) FROM pg_dist_object
             WHERE classid = 'pg_proc'::regclass AND distribution_argument_index = 0
               AND colocationid::text = (SELECT colocation_id::text FROM citus_tables
                                         WHERE table_name = 'comb.partitions'::regclass)",
        )
        .unwrap();
    assert!(
        functions.contains("comb.partition_head(uuid)"),
        "{functions}"
    );
    assert!(functions.contains("comb.claimable_now("), "{functions}");
    assert!(functions.contains("comb.create_partition_v"), "{functions}");
    // The state view was set aside and made again.
    assert_eq!(
        citus
            .coordinator()
            .psql(&db, "SELECT count(*) FROM comb.cursors_now")
            .unwrap(),
        "0"
    );

    // A second start finds everything distributed and does nothing.
    let again = migrate(&url);
    assert!(!again.contains("distributed on Citus"), "{again}");
}

#[tokio::test]
async fn without_citus_the_schema_keeps_its_keys() {
    let url = tokio::task::spawn_blocking(|| Postgres::shared().create_database("no_citus"))
        .await
        .unwrap()
        .unwrap();
    let out = migrate(&url);
    assert!(!out.contains("distributed on Citus"), "{out}");
    let db = url.rsplit('/').next().unwrap();
    let keys = Postgres::shared()
        .psql(
            db,
            "SELECT string_agg(conname, ',' ORDER BY conname) FROM pg_constraint
             WHERE conname IN ('partitions_queue_id_name_key', 'dead_letters_pkey',
                               'dead_letter_requeues_pkey')",
        )
        .unwrap();
    assert_eq!(
        keys,
        "dead_letter_requeues_pkey,dead_letters_pkey,partitions_queue_id_name_key"
    );
}

/// A `comb serve` on a fresh database of the shared Citus cluster, its URL the coordinator's
/// (`sslmode` left to its default, `prefer`: Citus serves TLS with a self-signed version 1
/// certificate).
async fn on_citus(prefix: &'static str) -> Env {
    on_citus_with(prefix, &[]).await
}

/// [`on_citus`] with extra `comb serve` flags.
async fn on_citus_with(prefix: &'static str, args: &'static [&'static str]) -> Env {
    tokio::task::spawn_blocking(move || {
        let db_url = Citus::shared().create_database(prefix).unwrap();
        let db_name = db_url.rsplit('/').next().unwrap().to_string();
        let server = Server::start(common::comb_bin(), &db_url, args).expect("server starts");
        Env {
            server,
            db_url,
            db_name,
            http: common::client(),
        }
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn push_pop_ack_in_order_by_partition_and_over_the_queue() {
    let env = on_citus("citus_basic").await;
    let items: Vec<Value> = (1..=3)
        .map(|n| json!({"queue": "q", "partition": "p1", "payload": {"n": n}}))
        .chain((10..=11).map(|n| json!({"queue": "q", "partition": "p2", "payload": {"n": n}})))
        .collect();
    let pushed = env.push(json!(items)).await;
    assert!(pushed.iter().all(|r| r["status"] == "queued"), "{pushed:?}");

    // A named partition: its messages in order, under one lease.
    let pop = env
        .pop("/api/v1/pop/queue/q/partition/p1?batch=10")
        .await
        .expect("p1 has messages");
    assert_eq!(numbers(&pop), vec![1, 2, 3]);
    // Held by the lease until acked.
    assert!(env.pop("/api/v1/pop/queue/q/partition/p1").await.is_none());
    let acked = env.ack_all(&pop, "completed", None).await;
    assert_eq!(acked.len(), 3, "{acked:?}");
    assert!(env.pop("/api/v1/pop/queue/q/partition/p1").await.is_none());

    // The whole queue: the partition that still has messages.
    let pop = env
        .pop("/api/v1/pop/queue/q?batch=10")
        .await
        .expect("p2 has messages");
    assert_eq!(numbers(&pop), vec![10, 11]);
    env.ack_all(&pop, "completed", None).await;
    assert!(env.pop("/api/v1/pop/queue/q").await.is_none());

    // More pushed to p1 come after what was acked, in order.
    env.push(json!([
        {"queue": "q", "partition": "p1", "payload": {"n": 4}},
        {"queue": "q", "partition": "p1", "payload": {"n": 5}},
    ]))
    .await;
    let pop = env.pop("/api/v1/pop/queue/q?batch=10").await.unwrap();
    assert_eq!(numbers(&pop), vec![4, 5]);
    assert!(
        env.pop("/api/v1/pop/queue/q/partition/p1").await.is_none(),
        "p1 is leased"
    );
}

#[tokio::test]
async fn every_consumer_group_reads_every_message() {
    let env = on_citus("citus_groups").await;
    let items: Vec<Value> = (1..=4)
        .map(|n| json!({"queue": "fan", "partition": format!("p{}", n % 2), "payload": {"n": n}}))
        .collect();
    env.push(json!(items)).await;
    for group in ["a", "b"] {
        let mut seen = Vec::new();
        for _ in 0..4 {
            match env
                .pop(&format!(
                    "/api/v1/pop/queue/fan?consumerGroup={group}&autoAck=true&batch=10"
                ))
                .await
            {
                Some(pop) => seen.extend(numbers(&pop)),
                None => break,
            }
        }
        seen.sort();
        assert_eq!(seen, vec![1, 2, 3, 4], "group {group}");
    }
}

#[tokio::test]
async fn a_failed_message_is_retried_then_dead_lettered() {
    let env = on_citus("citus_retries").await;
    env.configure("q", json!({"retryLimit": 1, "retryDelay": 0}))
        .await;
    env.push(json!([
        {"queue": "q", "partition": "p", "payload": {"n": 1}},
        {"queue": "q", "partition": "p", "payload": {"n": 2}},
    ]))
    .await;
    // retryLimit 1: handed out twice (one retry), then dead-lettered.
    for attempt in 1..=2 {
        let pop = env.pop("/api/v1/pop/queue/q/partition/p").await.unwrap();
        let m = one(&pop);
        assert_eq!(
            (m["data"]["n"].as_i64(), m["attempt"].as_i64()),
            (Some(1), Some(attempt))
        );
        let r = env.ack_ok(m, "failed", None, Some("boom")).await;
        assert_eq!(r["dlq"], attempt == 2, "{r}");
    }
    // The dead letter is kept and the next message is delivered.
    let pop = env.pop("/api/v1/pop/queue/q/partition/p").await.unwrap();
    assert_eq!(one(&pop)["data"]["n"], 2);
    let count = Citus::shared()
        .coordinator()
        .psql(&env.db_name, "SELECT count(*) FROM comb.dead_letters")
        .unwrap();
    assert_eq!(count, "1");
}

#[tokio::test]
async fn a_waiting_pop_wakes_up_on_a_push() {
    let env = on_citus("citus_wait").await;
    let waiting = common::waiting_pop(env.url("/api/v1/pop/queue/w?wait=true&timeout=30000"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.push(json!([{"queue": "w", "partition": "p", "payload": {"n": 7}}]))
        .await;
    let (status, body, _) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(numbers(&body), vec![7]);
}

#[tokio::test]
async fn a_lease_that_ends_unsettled_hands_the_message_out_again() {
    let env = on_citus("citus_lease").await;
    env.configure("q", json!({"leaseTime": 1, "retryLimit": 5}))
        .await;
    env.push(json!([
        {"queue": "q", "partition": "a", "payload": {"n": 1}},
        {"queue": "q", "partition": "b", "payload": {"n": 2}},
    ]))
    .await;
    let first = env.pop("/api/v1/pop/queue/q?batch=10").await.unwrap();
    let second = env.pop("/api/v1/pop/queue/q?batch=10").await.unwrap();
    let mut got = [numbers(&first), numbers(&second)].concat();
    got.sort();
    assert_eq!(got, vec![1, 2]);
    // Not acked: once the leases end, both come back with their second attempt.
    let mut again = Vec::new();
    let start = std::time::Instant::now();
    while again.len() < 2 && start.elapsed() < common::PATIENCE {
        match env.pop("/api/v1/pop/queue/q?batch=10").await {
            Some(pop) => {
                for m in pop["messages"].as_array().unwrap() {
                    again.push((
                        m["data"]["n"].as_i64().unwrap(),
                        m["attempt"].as_i64().unwrap(),
                    ));
                }
            }
            None => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    again.sort();
    assert_eq!(again, vec![(1, 2), (2, 2)]);
}

/// The plan Citus makes of `statement` (prepared, custom plan, not run) with `args`.
fn citus_plan(db: &str, statement: &str, args: &str) -> String {
    Citus::shared()
        .coordinator()
        .psql(
            db,
            &format!(
                "SET plan_cache_mode = force_custom_plan;
                 PREPARE s AS {statement};
                 EXPLAIN (COSTS OFF) EXECUTE s({args})"
            ),
        )
        .unwrap()
}

/// Every distributed step of `plan` is one task: no step reads or writes every shard.
fn assert_single_shard_steps(what: &str, plan: &str) {
    let counts: Vec<&str> = plan
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Task Count: "))
        .collect();
    assert!(
        !counts.is_empty(),
        "{what}: not a distributed plan:\n{plan}"
    );
    assert!(
        counts.iter().all(|c| *c == "1"),
        "{what}: {counts:?}\n{plan}"
    );
}

/// `plan` is one task, sent whole to one worker: a router statement.
fn assert_one_task(what: &str, plan: &str) {
    assert_single_shard_steps(what, plan);
    assert!(
        !plan.contains("Distributed Subplan"),
        "{what}: planned in steps\n{plan}"
    );
}

#[tokio::test]
async fn a_claims_walk_and_its_claim_are_one_task_each() {
    let env = on_citus("citus_plans").await;
    env.push(json!([{"queue": "q", "partition": "p", "payload": {"n": 1}}]))
        .await;
    // The first pop subscribes the queue-mode group: its cursor exists from now on.
    let pop = env.pop("/api/v1/pop/queue/q/partition/p").await.unwrap();
    env.ack_all(&pop, "completed", None).await;
    env.push(json!([{"queue": "q", "partition": "p", "payload": {"n": 2}}]))
        .await;
    let row = Citus::shared()
        .coordinator()
        .psql(
            &env.db_name,
            "SELECT c.queue_id || ' ' || c.partition_id || ' ' || c.consumer_group
             FROM comb.cursors c",
        )
        .unwrap();
    let f: Vec<&str> = row.split(' ').collect();
    let (queue, partition, group) = (f[0], f[1], f[2]);
    let walk = citus_plan(
        &env.db_name,
        comb::pop::CANDIDATES_CITUS_SQL,
        &format!(
            "'{queue}', '{group}', '{partition}', 1, 30, \
             '00000000-0000-0000-0000-000000000000', 2"
        ),
    );
    assert_one_task("the walk", &walk);
    // Inside the claim's transaction (a transaction block, as the server runs it), the call
    // of the claim function is delegated whole to the partition's worker: one task.
    let claim = Citus::shared()
        .coordinator()
        .psql(
            &env.db_name,
            &format!(
                "BEGIN;
                 SET LOCAL plan_cache_mode = force_custom_plan;
                 PREPARE s AS {};
                 EXPLAIN (COSTS OFF) EXECUTE s('{queue}', '{group}', ARRAY['{partition}']::uuid[],
                     10, 30, false, NULL, 0, '{partition}', false, false);
                 ROLLBACK",
                comb::pop::CLAIM_CITUS_CALL
            ),
        )
        .unwrap();
    assert_one_task("the claim", &claim);
}

#[tokio::test]
async fn a_delayed_message_waits_for_its_delay() {
    let env = on_citus("citus_delay").await;
    env.configure("d", json!({"delayedProcessing": 2})).await;
    env.push(json!([{"queue": "d", "partition": "p", "payload": {"n": 1}}]))
        .await;
    let pushed_at = std::time::Instant::now();
    let pop = env.pop_now_or_wait("d").await;
    assert_eq!(numbers(&pop), vec![1]);
    assert!(
        pushed_at.elapsed() >= Duration::from_secs(2),
        "handed out {:?} after the push, before its delay",
        pushed_at.elapsed()
    );
}

#[tokio::test]
async fn messages_pending_past_max_wait_are_dead_lettered() {
    let env = on_citus_with("citus_max_wait", &["--maintenance-interval-ms", "200"]).await;
    env.push(json!([
        {"queue": "slow", "partition": "p", "payload": {"n": 1}},
        {"queue": "slow", "partition": "p", "payload": {"n": 2}},
    ]))
    .await;
    let first = env
        .pop("/api/v1/pop/queue/slow?consumerGroup=g&autoAck=true")
        .await
        .unwrap();
    assert_eq!(numbers(&first), vec![1]);
    env.configure("slow", json!({"maxWaitTimeSeconds": 1}))
        .await;
    let dead = || {
        Citus::shared()
            .coordinator()
            .psql(
                &env.db_name,
                "SELECT count(*) FROM comb.dead_letters WHERE consumer_group = 'g'",
            )
            .unwrap()
    };
    common::eventually(common::PATIENCE, "dead-lettered", || dead() == "1").await;
    assert!(
        env.pop("/api/v1/pop/queue/slow?consumerGroup=g")
            .await
            .is_none()
    );
}

#[tokio::test]
async fn retention_drops_whole_segments_on_the_cluster() {
    let env = on_citus_with(
        "citus_retention",
        &["--segment-seconds", "1", "--maintenance-interval-ms", "200"],
    )
    .await;
    let sql = |q: &str| Citus::shared().coordinator().psql(&env.db_name, q).unwrap();
    env.push(json!([
        {"queue": "short", "partition": "p", "payload": {"n": 1}},
        {"queue": "short", "partition": "p", "payload": {"n": 2}},
    ]))
    .await;
    let seg: i32 = sql("SELECT DISTINCT seg FROM comb.messages")
        .parse()
        .unwrap();
    env.configure("short", json!({"retentionSeconds": 1})).await;
    let start = std::time::Instant::now();
    // The segment is rolled over, summarised and dropped as a whole table, shards and all.
    while sql(&format!(
        "SELECT to_regclass('comb.messages_{seg}') IS NOT NULL"
    )) == "t"
    {
        assert!(
            start.elapsed() < common::PATIENCE,
            "segment {seg} not dropped"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let shards = sql(&format!(
        "SELECT count(*) FROM pg_dist_shard WHERE logicalrelid::text = 'comb.messages_{seg}'"
    ));
    assert_eq!(shards, "0");
    // Newer segments made since are distributed like their parent.
    assert_eq!(
        sql(
            "SELECT count(*) FROM pg_inherits i WHERE i.inhparent = 'comb.messages'::regclass
             AND NOT EXISTS (SELECT 1 FROM pg_dist_partition d WHERE d.logicalrelid = i.inhrelid)"
        ),
        "0"
    );
    // The summary outlives the segment: the partition's head, so new messages come after.
    env.configure("short", json!({"retentionSeconds": 0})).await;
    env.push(json!([{"queue": "short", "partition": "p", "payload": {"n": 3}}]))
        .await;
    assert_eq!(sql("SELECT max(pos) FROM comb.messages"), "3");
    let pop = env.pop("/api/v1/pop/queue/short?batch=10").await.unwrap();
    assert_eq!(numbers(&pop), vec![3]);
}

#[tokio::test]
async fn a_push_through_one_server_wakes_a_pop_waiting_on_another() {
    let env = on_citus("citus_two").await;
    let url = env.db_url.clone();
    let other = tokio::task::spawn_blocking(move || {
        Server::start(common::comb_bin(), &url, &[]).expect("second server")
    })
    .await
    .unwrap();
    let waiting = common::waiting_pop(format!(
        "{}/api/v1/pop/queue/w?wait=true&timeout=60000",
        other.base_url()
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.push(json!([{"queue": "w", "partition": "p", "payload": {"n": 9}}]))
        .await;
    let (status, body, _) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(numbers(&body), vec![9]);
    // One maintenance leader between them: the advisory lock lives on the coordinator.
    let leaders = Citus::shared()
        .coordinator()
        .psql(
            &env.db_name,
            // The leader lock's key, 0x636f_6d62_0002, as pg_locks splits it.
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
             WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database()
               AND l.classid = x'636f'::int AND l.objid = x'6d620002'::bigint",
        )
        .unwrap();
    assert_eq!(leaders, "1", "one maintenance leader on the coordinator");
}

#[tokio::test]
async fn a_transaction_acks_and_pushes_across_partitions() {
    let env = on_citus("citus_tx").await;
    env.push(json!([{"queue": "in", "partition": "a", "payload": {"n": 1}}]))
        .await;
    let pop = env.pop("/api/v1/pop/queue/in").await.unwrap();
    let m = one(&pop);
    let (status, body) = env
        .post(
            "/api/v1/transaction",
            &json!({"operations": [
                {"type": "ack", "transactionId": m["transactionId"],
                 "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                 "status": "completed"},
                {"type": "push", "items": [{"queue": "out", "partition": "b", "payload": {"n": 2}}]},
            ]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["success"], true, "{body}");
    // The ack took: nothing left in `in`; the push took: `out` holds its message.
    assert!(env.pop("/api/v1/pop/queue/in").await.is_none());
    let out = env.pop("/api/v1/pop/queue/out").await.unwrap();
    assert_eq!(numbers(&out), vec![2]);
}

/// Streams' tables are distributed with the partitions they are about (`stream_partitions`,
/// `stream_states` by partition, `stream_queries` a reference table): a cycle commits its
/// state, its sink push and its source ack together on the cluster, in two phases when the
/// sink's partition lies on another worker than the source's.
#[tokio::test]
async fn a_stream_cycle_commits_state_sink_and_ack_together() {
    let env = on_citus_quiet("citus_streams").await;
    let db = env.db_name.clone();
    let (s, registered) = env
        .post(
            "/streams/v1/queries",
            &json!({"name": "q", "source_queue": "src", "sink_queue": "sink",
                    "config_hash": "h", "reset": false}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{registered}");
    let query = registered["query_id"].clone();
    let items: Vec<Value> = (0..3)
        .map(|i| json!({"queue": "src", "partition": "p", "payload": {"n": i}}))
        .collect();
    env.push(json!(items)).await;
    let sinks: Vec<String> = (0..16).map(|i| format!("s{i}")).collect();
    for p in &sinks {
        env.push(json!([{"queue": "sink", "partition": p, "payload": {"sum": 0}}]))
            .await;
    }
    let mut names = vec!["p".to_string()];
    names.extend(sinks.iter().cloned());
    let placed = workers_of(&db, &names);
    let sink = sinks[placed[1..]
        .iter()
        .position(|w| *w != placed[0])
        .expect("sink partitions on both workers")]
    .clone();
    let group = "streams.q";
    let pop = env
        .pop(&format!(
            "/api/v1/pop/queue/src?consumerGroup={group}&batch=10"
        ))
        .await
        .expect("the pushed messages");
    let last = &pop["messages"][2];
    let before = two_phase_commits(&db);
    let (s, done) = env
        .post(
            "/streams/v1/cycle",
            &json!({
                "query_id": query, "partition_id": pop["partitionId"], "consumer_group": group,
                "state_ops": [{"type": "upsert", "key": "sum", "value": 3}],
                "push_items": [{"queue": "sink", "partition": sink, "payload": {"sum": 3}}],
                "ack": {"transactionId": last["transactionId"], "leaseId": last["leaseId"],
                        "status": "completed", "count": 3},
            }),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{done}\n{}", env.server.log_tail(30));
    assert_eq!(done["ack_result"]["count"], 3, "{done}");
    assert_eq!(
        two_phase_commits(&db) - before,
        2,
        "a cycle over two workers commits in two phases, one prepared transaction each"
    );
    let (s, read) = env
        .post(
            "/streams/v1/state/get",
            &json!({"query_id": query, "partition_id": pop["partitionId"], "keys": []}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{read}");
    assert_eq!(read["rows"][0]["value"], 3, "{read}");
    let out = env
        .pop(&format!(
            "/api/v1/pop/queue/sink/partition/{sink}?autoAck=true&batch=10"
        ))
        .await
        .expect("the sink push");
    assert_eq!(out["messages"][1]["data"]["sum"], 3, "{out}");
    assert!(
        env.pop(&format!("/api/v1/pop/queue/src?consumerGroup={group}"))
            .await
            .is_none(),
        "the source is settled for the query's group"
    );
}

/// Failed acks of several partitions (on both workers) in one request: each cursor moves on
/// and each message is dead-lettered in its own partition.
#[tokio::test]
async fn failed_acks_of_several_partitions_in_one_request_dead_letter_each() {
    let env = on_citus("citus_many_failed").await;
    env.configure("q", json!({"retryLimit": 0, "retryDelay": 0}))
        .await;
    let items: Vec<Value> = (1..=4)
        .map(|n| json!({"queue": "q", "partition": format!("p{n}"), "payload": {"n": n}}))
        .collect();
    env.push(json!(items)).await;
    let mut acks = Vec::new();
    for n in 1..=4 {
        let pop = env
            .pop(&format!("/api/v1/pop/queue/q/partition/p{n}"))
            .await
            .unwrap();
        let m = one(&pop);
        acks.push(json!({
            "transactionId": m["transactionId"], "partitionId": m["partitionId"],
            "leaseId": m["leaseId"], "status": "failed", "error": "boom",
        }));
    }
    let (s, body) = env
        .post("/api/v1/ack/batch", &json!({"acknowledgments": acks}))
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    for r in body.as_array().unwrap() {
        assert_eq!(
            (r["success"].as_bool(), r["dlq"].as_bool()),
            (Some(true), Some(true)),
            "{body}"
        );
    }
    let count = Citus::shared()
        .coordinator()
        .psql(
            &env.db_name,
            "SELECT count(DISTINCT partition_id) FROM comb.dead_letters",
        )
        .unwrap();
    assert_eq!(count, "4");
    for n in 1..=4 {
        assert!(
            env.pop(&format!("/api/v1/pop/queue/q/partition/p{n}"))
                .await
                .is_none(),
            "p{n} moved past its dead letter"
        );
    }
}

/// Two-phase commits this database's nodes have recorded (`pg_dist_transaction`; the harness
/// keeps the rows, see `comb_harness::Citus`): the coordinator's, and every worker's, which a
/// worker records when a call delegated to it coordinates work of its own over other nodes.
fn two_phase_commits(db: &str) -> i64 {
    let citus = Citus::shared();
    std::iter::once(citus.coordinator())
        .chain(citus.workers())
        .map(|node| {
            node.psql(db, "SELECT count(*) FROM pg_dist_transaction")
                .unwrap()
                .parse::<i64>()
                .unwrap()
        })
        .sum()
}

/// A server on the cluster whose maintenance ran its first cycle and runs no other, and
/// whose per-minute statistics wait an hour: maintenance's DDL (segments made ahead,
/// generations) commits on every node, and both read every shard, which the tests counting
/// two-phase commits and multi-shard statements must not see. Citus counts the database's single- and multi-shard
/// executions on every node (`citus_stat_counters`).
async fn on_citus_quiet(prefix: &'static str) -> Env {
    on_citus_quiet_with(prefix, &[]).await
}

/// [`on_citus_quiet`] with extra `comb serve` flags.
async fn on_citus_quiet_with(prefix: &'static str, args: &'static [&'static str]) -> Env {
    let env = tokio::task::spawn_blocking(move || {
        let citus = Citus::shared();
        let db_url = citus.create_database(prefix).unwrap();
        let db_name = db_url.rsplit('/').next().unwrap().to_string();
        for node in std::iter::once(citus.coordinator()).chain(citus.workers()) {
            node.psql(
                "postgres",
                &format!("ALTER DATABASE \"{db_name}\" SET citus.enable_stat_counters = on"),
            )
            .unwrap();
        }
        let mut all = vec![
            "--maintenance-interval-ms",
            "3600000",
            "--stats-interval-ms",
            "3600000",
        ];
        all.extend_from_slice(args);
        let server = Server::start(common::comb_bin(), &db_url, &all).expect("server starts");
        Env {
            server,
            db_url,
            db_name,
            http: common::client(),
        }
    })
    .await
    .unwrap();
    let db = env.db_name.clone();
    common::until("the first maintenance cycle", || {
        let db = db.clone();
        async move {
            let runs = Citus::shared()
                .coordinator()
                .psql(&db, "SELECT count(*) FROM comb.maintenance_runs")
                .unwrap();
            runs != "0"
        }
    })
    .await;
    env
}

/// Statements this database's nodes ran on several shards, and on one: the coordinator's,
/// and every worker's (statements of the calls delegated to it).
fn executions(db: &str) -> (i64, i64) {
    executions_per_node(db)
        .into_iter()
        .fold((0, 0), |(m, s), (_, (multi, single))| {
            (m + multi, s + single)
        })
}

/// The hot path of one partition on the cluster — a push (with and without producers'
/// transaction ids), a pop of the named partition, a lease extension naming its partition and
/// an ack — runs no statement over several shards: every statement is a router statement on
/// the partition's worker, or a coordinator function running such statements. Each request
/// commits on that worker in one phase: none leaves a two-phase commit (`pg_dist_transaction`
/// of any node: the coordinator records those it coordinates, a worker those a call delegated
/// to it coordinates). Through the coordinator route.
#[tokio::test]
async fn push_pop_extend_and_ack_of_one_partition_run_on_one_shard() {
    let env = on_citus_quiet("citus_router").await;
    let db = env.db_name.clone();
    // The first push makes queue and partition, the first pop subscribes the group: catalog
    // writes, of reference tables, committed on every node.
    env.push(json!([{"queue": "q", "partition": "p", "payload": {"n": 0}}]))
        .await;
    let pop = env.pop("/api/v1/pop/queue/q/partition/p").await.unwrap();
    env.ack_all(&pop, "completed", None).await;
    let (multi, single) = executions(&db);
    let two_phase = std::cell::Cell::new(two_phase_commits(&db));
    let one_phase = |what: &str| {
        let now = two_phase_commits(&db);
        assert_eq!(now - two_phase.get(), 0, "{what} committed in two phases");
        two_phase.set(now);
    };
    env.push(json!([{"queue": "q", "partition": "p", "payload": {"n": 1}}]))
        .await;
    one_phase("a push of one partition");
    env.push(json!([
        {"queue": "q", "partition": "p", "payload": {"n": 2}, "transactionId": "t-2"},
    ]))
    .await;
    one_phase("a push with a transaction id");
    let pop = env
        .pop("/api/v1/pop/queue/q/partition/p?batch=10")
        .await
        .unwrap();
    assert_eq!(numbers(&pop), vec![1, 2]);
    one_phase("a pop of a named partition");
    let lease = pop["leaseId"].as_str().unwrap().to_string();
    // With its partition named (by the lease id alone:
    // `a_lease_extended_by_its_id_alone_runs_on_one_shard`).
    let partition = &pop["messages"][0]["partitionId"];
    let (status, body) = env
        .post(
            &format!("/api/v1/lease/{lease}/extend"),
            &json!({"seconds": 30, "partitionId": partition}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    one_phase("a lease extension");
    env.ack_all(&pop, "completed", None).await;
    one_phase("an ack");

    let (multi_after, single_after) = executions(&db);
    assert!(
        single_after > single,
        "the counters count: {single} {single_after}"
    );
    assert_eq!(
        multi_after - multi,
        0,
        "statements of the hot path ran on several shards"
    );
}

/// Acks that fail or mix statuses and a lease's expiry, of one partition on the cluster,
/// commit in one phase (no `pg_dist_transaction` row): their cursors are locked by the
/// coordinator (`comb.lock_cursors`, `comb.lock_expired`) and their new versions written by
/// router statements (`cursor::StateWrites`), every statement of the partition's shard. A new
/// group's first pop, which writes a reference table in two phases, shows that the count counts.
#[tokio::test]
async fn failed_and_mixed_acks_and_a_lease_expiry_of_one_partition_commit_in_one_phase() {
    let env = on_citus_quiet("citus_failed_acks").await;
    let db = env.db_name.clone();
    env.configure("q", json!({"leaseTime": 1, "retryLimit": 5}))
        .await;
    env.push(json!([{"queue": "q", "partition": "p", "payload": {"n": 0}}]))
        .await;
    let pop = env.pop("/api/v1/pop/queue/q/partition/p").await.unwrap();
    env.ack_all(&pop, "completed", None).await;
    let mut seen = Vec::new();
    let mut before = two_phase_commits(&db);
    let mut count = |what: &str| {
        let now = two_phase_commits(&db);
        seen.push((what.to_string(), now - before));
        before = now;
    };
    for n in 1..=2 {
        env.push(json!([{"queue": "q", "partition": "p", "payload": {"n": n}}]))
            .await;
    }
    count("pushes");
    let pop = env
        .pop("/api/v1/pop/queue/q/partition/p?batch=1")
        .await
        .unwrap();
    count("a pop");
    env.ack_all(&pop, "failed", None).await;
    count("a failed ack");
    let pop = env
        .pop("/api/v1/pop/queue/q/partition/p?wait=true&timeout=10000&batch=2")
        .await
        .unwrap();
    count("a pop after a failure");
    let m = &pop["messages"];
    let (status, body) = env
        .post(
            "/api/v1/ack/batch",
            &json!({"acknowledgments": [
                {"transactionId": m[0]["transactionId"], "partitionId": m[0]["partitionId"],
                 "leaseId": m[0]["leaseId"], "status": "completed"},
                {"transactionId": m[1]["transactionId"], "partitionId": m[1]["partitionId"],
                 "leaseId": m[1]["leaseId"], "status": "failed"},
            ]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    count("a mixed ack");
    let pop = env
        .pop("/api/v1/pop/queue/q/partition/p?wait=true&timeout=10000")
        .await
        .unwrap();
    count("a pop after a mixed ack");
    // The lease (1 s) ends unsettled; the next pop ends it and hands the message out again.
    let again = env
        .pop("/api/v1/pop/queue/q/partition/p?wait=true&timeout=10000")
        .await
        .unwrap();
    assert_eq!(numbers(&again), numbers(&pop));
    count("a pop with a lease's expiry");
    // The control, which commits in two phases: a new group's first pop writes its
    // subscription, a reference table on every node.
    env.pop("/api/v1/pop/queue/q/partition/p?consumerGroup=fresh")
        .await
        .unwrap();
    count("a new group's first pop");
    let (control, rest) = seen.split_last().unwrap();
    assert!(control.1 > 0, "{seen:?}");
    assert!(
        rest.iter().all(|(_, n)| *n == 0),
        "two-phase commits: {seen:?}"
    );
}

/// The worker port holding each of `partitions` (names of queue `q`), in their order.
fn workers_of(db: &str, partitions: &[String]) -> Vec<String> {
    let rows = placements(Citus::shared(), db, partitions);
    let of: std::collections::HashMap<&str, &str> =
        rows.lines().filter_map(|l| l.split_once(' ')).collect();
    partitions
        .iter()
        .map(|p| of.get(p.as_str()).expect("placed").to_string())
        .collect()
}

/// One server fuses concurrent pushes into one transaction. On the cluster it fuses only the
/// pushes of one worker's partitions: a batch of partitions on two workers would commit on
/// both (a two-phase commit). Single-partition pushes racing over partitions of both workers
/// leave no two-phase commit, and each partition keeps its order. Fusion depends on timing,
/// so the pushers race in rounds until the server has fused some pushes (a round without any
/// would prove nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fused_pushes_of_partitions_on_two_workers_commit_on_one_node_each() {
    const ROUND: i64 = 20;
    let env = on_citus_quiet("citus_fusion").await;
    let names = partitions_over_both_workers(&env).await;
    let before = two_phase_commits(&env.db_name);
    let env = std::sync::Arc::new(env);
    let mut pushed = names.len() as f64;
    let mut last = 0;
    let mut batches = push_batches(&env).await;
    for round in 0..10 {
        let mut tasks = tokio::task::JoinSet::new();
        for p in names.clone() {
            let env = env.clone();
            tasks.spawn(async move {
                for n in round * ROUND + 1..=(round + 1) * ROUND {
                    env.push(json!([{"queue": "q", "partition": p, "payload": {"n": n}}]))
                        .await;
                }
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
        pushed += (names.len() as i64 * ROUND) as f64;
        last = (round + 1) * ROUND;
        batches = push_batches(&env).await;
        if batches < pushed {
            break;
        }
    }
    // Fewer batches than pushes: some were fused.
    assert!(
        batches < pushed,
        "no push was fused: {batches} batches of {pushed} pushes"
    );
    let after = two_phase_commits(&env.db_name);
    assert_eq!(
        after - before,
        0,
        "fused single-partition pushes committed across workers ({batches} batches of {pushed})"
    );
    for p in &names {
        let pop = env
            .pop(&format!("/api/v1/pop/queue/q/partition/{p}?batch=1000"))
            .await
            .unwrap();
        assert_eq!(numbers(&pop), (0..=last).collect::<Vec<i64>>(), "{p}");
    }
}

/// What became of each message of a push, in order (`queued`, `duplicate`).
fn statuses(pushed: &[Value]) -> Vec<String> {
    pushed
        .iter()
        .map(|m| m["status"].as_str().unwrap().to_string())
        .collect()
}

/// The shard of each of `partitions` (names of queue `q`), in their order.
fn shards_of(db: &str, partitions: &[String]) -> Vec<i64> {
    let list: Vec<String> = partitions.iter().map(|p| format!("'{p}'")).collect();
    let rows = Citus::shared()
        .coordinator()
        .psql(
            db,
            &format!(
                "SELECT name || ' ' || get_shard_id_for_distribution_column('comb.partitions', id)
                 FROM comb.partitions WHERE name IN ({})",
                list.join(",")
            ),
        )
        .unwrap();
    let of: std::collections::HashMap<&str, i64> = rows
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(p, s)| (p, s.parse().unwrap()))
        .collect();
    partitions.iter().map(|p| of[p.as_str()]).collect()
}

/// On the direct route a worker's pushes are fused over all its shards: one push naming
/// partitions of three shards of one worker (and one with producers' transaction ids, which
/// reads the held ids first) is one transaction of that worker, its statements router
/// statements of each shard run by the worker: no node commits in two phases, no node runs a
/// statement over several shards, the coordinator opens no connection to a worker, and every
/// partition keeps its order and its duplicates answered. A push with a shard's part heavy
/// enough to be copied in stores each shard's part apart, in order too.
#[tokio::test]
async fn a_push_over_several_shards_of_one_worker_is_one_transaction_of_that_worker() {
    let env = on_citus_quiet("citus_worker_fusion").await;
    let db = env.db_name.clone();
    let names = partitions_over_both_workers(&env).await;
    let (workers, shards) = (workers_of(&db, &names), shards_of(&db, &names));
    // Partitions of one worker, each of another shard (3 of its 4).
    let mut chosen: Vec<usize> = Vec::new();
    for (k, _) in names.iter().enumerate() {
        if workers[k] == workers[0] && chosen.iter().all(|&c| shards[c] != shards[k]) {
            chosen.push(k);
        }
    }
    assert!(
        chosen.len() >= 3,
        "shards of one worker: {shards:?} {workers:?}"
    );
    let chosen: Vec<&String> = chosen[..3].iter().map(|&k| &names[k]).collect();
    // Warm: the server learns each partition's shard and worker.
    let warm: Vec<Value> = chosen
        .iter()
        .map(|p| json!({"queue": "q", "partition": p, "payload": {"n": 1}}))
        .collect();
    env.push(Value::Array(warm)).await;
    let (before, two_phase) = (counters_per_node(&db), two_phase_commits(&db));

    let plain: Vec<Value> = (2..=3)
        .flat_map(|n| {
            chosen
                .iter()
                .map(move |p| json!({"queue": "q", "partition": p, "payload": {"n": n}}))
        })
        .collect();
    let stored = env.push(Value::Array(plain)).await;
    assert!(stored.iter().all(|m| m["status"] == "queued"), "{stored:?}");
    let checked: Vec<Value> = chosen
        .iter()
        .flat_map(|p| {
            [
                json!({"queue": "q", "partition": p, "payload": {"n": 4}, "transactionId": "t-4"}),
                json!({"queue": "q", "partition": p, "payload": {"n": 5}, "transactionId": "t-4"}),
            ]
        })
        .collect();
    let first = env.push(Value::Array(checked.clone())).await;
    let again = env.push(Value::Array(checked)).await;
    assert_eq!(
        statuses(&first),
        ["queued", "duplicate"].repeat(3),
        "{first:?}"
    );
    assert_eq!(statuses(&again), ["duplicate"; 6], "{again:?}");
    for k in 0..3 {
        assert_eq!(first[2 * k + 1]["message_id"], first[2 * k]["message_id"]);
        assert_eq!(again[2 * k]["message_id"], first[2 * k]["message_id"]);
    }
    // A shard's part big enough to be copied in (70 messages) beside a small one: each
    // commits apart, on the worker, in order.
    let mut heavy: Vec<Value> = (5..75)
        .map(|n| json!({"queue": "q", "partition": chosen[0], "payload": {"n": n}}))
        .collect();
    heavy.push(json!({"queue": "q", "partition": chosen[1], "payload": {"n": 5}}));
    let stored = env.push(Value::Array(heavy)).await;
    assert!(stored.iter().all(|m| m["status"] == "queued"), "{stored:?}");

    assert_eq!(
        two_phase_commits(&db) - two_phase,
        0,
        "a push over shards of one worker committed in two phases"
    );
    let after = counters_per_node(&db);
    for ((port, b), (_, a)) in before.iter().zip(&after) {
        assert_eq!(
            a[0], b[0],
            "node {port} ran a statement over several shards"
        );
    }
    assert_eq!(
        after[0].1[2], before[0].1[2],
        "the coordinator used connections to workers: {before:?} {after:?}"
    );
    for (k, p) in chosen.iter().enumerate() {
        let pop = env
            .pop(&format!("/api/v1/pop/queue/q/partition/{p}?batch=100"))
            .await
            .unwrap();
        let last = [74, 5, 4][k];
        assert_eq!(numbers(&pop), (0..=last).collect::<Vec<i64>>(), "{p}");
    }
}

/// Executions on distributed tables in this database, per node (port, then the counts on
/// several shards and on one): the coordinator first, then the workers.
fn executions_per_node(db: &str) -> Vec<(String, (i64, i64))> {
    counters_per_node(db)
        .into_iter()
        .map(|(port, [multi, single, _])| (port, (multi, single)))
        .collect()
}

/// Per node (the coordinator first): executions on several shards, on one, and connections
/// the node used to other nodes (opened or reused) in this database (`citus_stat_counters`).
fn counters_per_node(db: &str) -> Vec<(String, [i64; 3])> {
    let citus = Citus::shared();
    std::iter::once(citus.coordinator())
        .chain(citus.workers())
        .map(|node| {
            let row = node
                .psql(
                    db,
                    "SELECT query_execution_multi_shard || ' ' || query_execution_single_shard
                       || ' ' || (connection_establishment_succeeded + connection_reused)
                     FROM citus_stat_counters WHERE name = current_database()",
                )
                .unwrap();
            let n: Vec<i64> = row.split(' ').map(|v| v.parse().unwrap()).collect();
            (node.port().to_string(), [n[0], n[1], n[2]])
        })
        .collect()
}

/// `comb serve`'s flag for the direct route (`db::route`).
pub(super) const DIRECT: &[&str] = &["--citus-route", "direct"];

/// With `--citus-route direct`, a partition's hot path — pushes (with and
/// without producers' transaction ids), a pop of the named partition, a lease extension
/// naming it and an ack — sends no statement through the coordinator: the server sends them
/// to the worker holding the partition's shard, which runs them. The coordinator runs no
/// statement over several shards and uses no connection to a worker (it still answers the
/// server's re-reads of cached queue options, reads of a reference table's local copy). What
/// was pushed is delivered once, in order, as through the coordinator.
#[tokio::test]
async fn the_direct_route_runs_a_partitions_hot_path_on_its_worker_not_the_coordinator() {
    let env = on_citus_quiet_with("citus_direct", DIRECT).await;
    let db = env.db_name.clone();
    // The first push makes queue and partition, the first pop subscribes the group, and the
    // server learns the partition's id and worker: coordinator work, done once.
    env.push(json!([{"queue": "q", "partition": "p", "payload": {"n": 0}}]))
        .await;
    let pop = env.pop("/api/v1/pop/queue/q/partition/p").await.unwrap();
    env.ack_all(&pop, "completed", None).await;
    let worker = workers_of(&db, &["p".to_string()]).remove(0);
    let before = counters_per_node(&db);

    env.push(json!([{"queue": "q", "partition": "p", "payload": {"n": 1}}]))
        .await;
    env.push(json!([
        {"queue": "q", "partition": "p", "payload": {"n": 2}, "transactionId": "t-2"},
    ]))
    .await;
    // Counted from here: the pop, the extension and the ack commit in two phases on no node
    // (the pushes' phases are counted by `push_pop_extend_and_ack_of_one_partition_…`).
    let two_phase = two_phase_commits(&db);
    let pop = env
        .pop("/api/v1/pop/queue/q/partition/p?batch=10")
        .await
        .unwrap();
    assert_eq!(numbers(&pop), vec![1, 2]);
    let lease = pop["leaseId"].as_str().unwrap().to_string();
    let partition = &pop["messages"][0]["partitionId"];
    let (status, body) = env
        .post(
            &format!("/api/v1/lease/{lease}/extend"),
            &json!({"seconds": 30, "partitionId": partition}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let acked = env.ack_all(&pop, "completed", None).await;
    assert!(acked.iter().all(|a| a["success"] == true), "{acked:?}");
    assert_eq!(
        two_phase_commits(&db) - two_phase,
        0,
        "a pop, extension or ack of one partition committed in two phases on some node"
    );
    assert!(env.pop("/api/v1/pop/queue/q/partition/p").await.is_none());

    let after = counters_per_node(&db);
    let ([multi, _, connections], [multi_after, _, connections_after]) = (before[0].1, after[0].1);
    assert_eq!(
        (multi_after, connections_after),
        (multi, connections),
        "the coordinator ran statements of the hot path: {before:?} {after:?}"
    );
    let (k, _) = before
        .iter()
        .enumerate()
        .find(|(_, (port, _))| *port == worker)
        .expect("the partition's worker");
    let (single_before, single_after) = (before[k].1[1], after[k].1[1]);
    assert!(
        single_after > single_before,
        "the partition's worker ran nothing: {before:?} {after:?}"
    );
}

/// On the direct route (the default), the rest of the data path runs on the workers too:
/// pops of the whole queue (their listing asks one worker at a time, over its own shards),
/// a batch of acks over partitions of both workers, a lease extended by its id alone, and a
/// transaction whose partitions one worker holds. The coordinator runs no statement over
/// several shards and opens no connection to a worker for any of them, and no node commits
/// in two phases.
#[tokio::test]
async fn the_direct_route_runs_queue_wide_pops_acks_extensions_and_transactions_on_workers() {
    let env = on_citus_quiet("citus_direct_all").await;
    let db = env.db_name.clone();
    let names = partitions_over_both_workers(&env).await;
    let placed = workers_of(&db, &names);
    // Warm: every partition's id and worker learned by a named pop (its message acked), and
    // the listing's layout read by one pop of the queue that finds nothing.
    for p in &names {
        let pop = env.pop(&format!("/api/v1/pop/queue/q/partition/{p}")).await;
        env.ack_all(&pop.expect("the first message"), "completed", None)
            .await;
    }
    assert!(env.pop("/api/v1/pop/queue/q").await.is_none());
    for (n, p) in names.iter().enumerate() {
        env.push(json!([{"queue": "q", "partition": p, "payload": {"n": n + 1}}]))
            .await;
    }
    let before = counters_per_node(&db);
    let two_phase = two_phase_commits(&db);

    // Pops of the whole queue until partitions of both workers were handed out.
    let mut pops = Vec::new();
    let mut seen = std::collections::HashSet::new();
    while seen.len() < 2 {
        let pop = env.pop("/api/v1/pop/queue/q").await.expect("work left");
        let p = pop["partition"].as_str().unwrap().to_string();
        let k = names.iter().position(|n| *n == p).unwrap();
        seen.insert(placed[k].clone());
        pops.push(pop);
        assert!(
            pops.len() < names.len(),
            "pops of one worker only: {seen:?}"
        );
    }
    // The first lease extended by its id alone, as Queen's clients send it.
    let lease = pops[0]["leaseId"].as_str().unwrap().to_string();
    let (status, body) = env
        .post(
            &format!("/api/v1/lease/{lease}/extend"),
            &json!({"seconds": 30}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // All but the last acked in one request, over both workers' partitions.
    let (last, acked) = pops.split_last().unwrap();
    let acks: Vec<Value> = acked
        .iter()
        .map(|pop| {
            let m = one(pop);
            json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                   "leaseId": m["leaseId"], "status": "completed"})
        })
        .collect();
    let (status, body) = env
        .post("/api/v1/ack/batch", &json!({"acknowledgments": acks}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body.as_array()
            .unwrap()
            .iter()
            .all(|r| r["success"] == true),
        "{body}"
    );
    // The last acked in a transaction that pushes to another partition of its worker.
    let m = one(last);
    let from = last["partition"].as_str().unwrap();
    let k = names.iter().position(|n| n == from).unwrap();
    let to = names
        .iter()
        .zip(&placed)
        .find(|(n, w)| *n != from && **w == placed[k])
        .map(|(n, _)| n.clone())
        .expect("another partition of the worker");
    let (status, body) = env
        .post(
            "/api/v1/transaction",
            &json!({"operations": [
                {"type": "ack", "transactionId": m["transactionId"],
                 "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                 "status": "completed"},
                {"type": "push", "items": [{"queue": "q", "partition": to, "payload": {"n": 99}}]},
            ]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["success"], true, "{body}");

    let after = counters_per_node(&db);
    let ([multi, _, connections], [multi_after, _, connections_after]) = (before[0].1, after[0].1);
    assert_eq!(
        (multi_after, connections_after),
        (multi, connections),
        "the coordinator ran statements of the data path: {before:?} {after:?}"
    );
    assert_eq!(
        two_phase_commits(&db) - two_phase,
        0,
        "the data path committed in two phases on some node"
    );
    // Everything acked stays acked; the transaction's push is there.
    let mut left = Vec::new();
    while let Some(pop) = env.pop("/api/v1/pop/queue/q?batch=10").await {
        left.extend(numbers(&pop));
        env.ack_all(&pop, "completed", None).await;
    }
    let handed: Vec<i64> = pops.iter().flat_map(numbers).collect();
    assert!(left.contains(&99), "{left:?}");
    assert!(
        handed.iter().all(|n| !left.contains(n)),
        "acked messages came back: {handed:?} {left:?}"
    );
    assert_eq!(
        left.len() + handed.len(),
        names.len() + 1,
        "{left:?} {handed:?}"
    );
}

/// A push sent to its partition's worker still wakes the pops waiting for it, on this server
/// and on another: wake-ups do not depend on where the push ran (this server wakes its own
/// pops in process, and sends its `NOTIFY` on a coordinator connection, where the other
/// server listens).
#[tokio::test]
async fn a_push_routed_to_its_worker_wakes_pops_waiting_here_and_on_another_server() {
    let env = on_citus_with("citus_direct_wake", DIRECT).await;
    let url = env.db_url.clone();
    let other = tokio::task::spawn_blocking(move || {
        Server::start(common::comb_bin(), &url, DIRECT).expect("second server")
    })
    .await
    .unwrap();
    // The partition exists and the server knows its worker before anyone waits.
    env.push(json!([{"queue": "w", "partition": "p", "payload": {"n": 0}}]))
        .await;
    for group in ["here", "there"] {
        let pop = env
            .pop(&format!(
                "/api/v1/pop/queue/w?consumerGroup={group}&autoAck=true"
            ))
            .await
            .unwrap();
        assert_eq!(numbers(&pop), vec![0]);
    }
    let here = common::waiting_pop(
        env.url("/api/v1/pop/queue/w/partition/p?consumerGroup=here&wait=true&timeout=30000"),
    );
    let there = common::waiting_pop(format!(
        "{}/api/v1/pop/queue/w?consumerGroup=there&wait=true&timeout=30000",
        other.base_url()
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.push(json!([{"queue": "w", "partition": "p", "payload": {"n": 9}}]))
        .await;
    for waiting in [here, there] {
        let (status, body, _) = waiting.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(numbers(&body), vec![9]);
    }
}

/// A partition's shard moved to the other worker while the server serves: the server's
/// placement is stale for up to a minute, so its requests reach the old worker, which routes
/// them to the new one. Pushes, pops, a lease extension and acks go on, nothing lost or
/// reordered.
#[tokio::test]
async fn after_a_partitions_shard_moves_its_requests_still_succeed() {
    let env = on_citus_with("citus_direct_move", DIRECT).await;
    let db = env.db_name.clone();
    env.push(json!([{"queue": "q", "partition": "p", "payload": {"n": 1}}]))
        .await;
    let pop = env.pop("/api/v1/pop/queue/q/partition/p").await.unwrap();
    assert_eq!(numbers(&pop), vec![1]);
    env.ack_all(&pop, "completed", None).await;
    env.push(json!([{"queue": "q", "partition": "p", "payload": {"n": 2}}]))
        .await;
    let from = workers_of(&db, &["p".to_string()]).remove(0);
    let to = Citus::shared()
        .workers()
        .iter()
        .map(|w| w.port().to_string())
        .find(|port| *port != from)
        .expect("another worker");
    let moved = db.clone();
    let (from_port, to_port) = (from.clone(), to.clone());
    tokio::task::spawn_blocking(move || {
        let coordinator = Citus::shared().coordinator();
        let shard = coordinator
            .psql(
                &moved,
                "SELECT get_shard_id_for_distribution_column('comb.partitions', id)
                 FROM comb.partitions WHERE name = 'p'",
            )
            .unwrap();
        coordinator
            .psql(
                &moved,
                &format!(
                    "SELECT citus_move_shard_placement({shard}, '127.0.0.1', {from_port},
                       '127.0.0.1', {to_port}, shard_transfer_mode => 'block_writes')"
                ),
            )
            .unwrap();
    })
    .await
    .unwrap();
    assert_eq!(workers_of(&db, &["p".to_string()]), vec![to]);

    env.push(json!([{"queue": "q", "partition": "p", "payload": {"n": 3}}]))
        .await;
    let pop = env
        .pop("/api/v1/pop/queue/q/partition/p?batch=10")
        .await
        .unwrap();
    assert_eq!(numbers(&pop), vec![2, 3]);
    let lease = pop["leaseId"].as_str().unwrap().to_string();
    let (status, body) = env
        .post(
            &format!("/api/v1/lease/{lease}/extend"),
            &json!({"seconds": 30, "partitionId": pop["messages"][0]["partitionId"]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let acked = env.ack_all(&pop, "completed", None).await;
    assert!(acked.iter().all(|a| a["success"] == true), "{acked:?}");
    assert!(env.pop("/api/v1/pop/queue/q/partition/p").await.is_none());
}

/// 24 partitions of queue `q`, each holding message 0, which fall on both workers.
async fn partitions_over_both_workers(env: &Env) -> Vec<String> {
    let names: Vec<String> = (0..24).map(|i| format!("p{i}")).collect();
    for p in &names {
        env.push(json!([{"queue": "q", "partition": p, "payload": {"n": 0}}]))
            .await;
    }
    let placed = workers_of(&env.db_name, &names);
    let mut distinct = placed.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 2, "partitions on both workers: {placed:?}");
    names
}

/// The batches of `kind` (`push`, `ack`) this server has run.
async fn fused_batches(env: &Env, kind: &str) -> f64 {
    let prefix = format!("comb_fused_batch_seconds_count{{kind=\"{kind}\"}} ");
    env.metrics_text()
        .await
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()).map(str::to_string))
        .expect("the batches counted")
        .parse()
        .unwrap()
}

/// The push batches this server has run.
async fn push_batches(env: &Env) -> f64 {
    fused_batches(env, "push").await
}

/// Fused acks stay off the distributed path: failed acks (each writes its partition's new
/// cursor state from the coordinator) racing over partitions of both workers, fused by the
/// server, run no statement over several shards and leave no two-phase commit, and every
/// failed message is handed out again (the pops, one after another, are not counted). As with pushes, the acks race in rounds until the
/// server has fused some. (Acks are fused per worker, as pushes are; fused over both
/// workers Citus was seen committing each worker in one phase too, so this does not tell the
/// two apart.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fused_acks_of_partitions_on_two_workers_commit_on_one_node_each() {
    let env = on_citus_quiet("citus_ack_fusion").await;
    env.configure("q", json!({"retryLimit": 100, "retryDelay": 0}))
        .await;
    let names = partitions_over_both_workers(&env).await;
    // The group's first pop subscribes it (a write of a reference table, on every node), and
    // a server's first pop naming a partition looks its name up over every shard: one round
    // before counting.
    for p in &names {
        let pop = env
            .pop(&format!("/api/v1/pop/queue/q/partition/{p}"))
            .await
            .unwrap();
        env.ack_ok(one(&pop), "failed", None, Some("again")).await;
    }
    let before = two_phase_commits(&env.db_name);
    let mut multi = 0;
    let env = std::sync::Arc::new(env);
    let start = fused_batches(&env, "ack").await;
    let (mut acked, mut batches) = (0.0, 0.0);
    for _ in 0..10 {
        let mut pops = Vec::new();
        for p in &names {
            pops.push(
                env.pop(&format!("/api/v1/pop/queue/q/partition/{p}"))
                    .await
                    .unwrap_or_else(|| panic!("{p}: the failed message again")),
            );
        }
        let (m0, _) = executions(&env.db_name);
        let mut tasks = tokio::task::JoinSet::new();
        for pop in pops {
            let env = env.clone();
            tasks.spawn(async move {
                env.ack_ok(one(&pop), "failed", None, Some("again")).await;
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
        multi += executions(&env.db_name).0 - m0;
        acked += names.len() as f64;
        batches = fused_batches(&env, "ack").await - start;
        if batches < acked {
            break;
        }
    }
    assert!(
        batches < acked,
        "no ack was fused: {batches} batches of {acked} acks"
    );
    assert_eq!(
        two_phase_commits(&env.db_name) - before,
        0,
        "fused single-partition acks committed across workers ({batches} batches of {acked})"
    );
    assert_eq!(multi, 0, "fused acks ran a statement over several shards");
    for p in &names {
        let pop = env
            .pop(&format!("/api/v1/pop/queue/q/partition/{p}"))
            .await
            .unwrap_or_else(|| panic!("{p}: the failed message kept"));
        assert_eq!(numbers(&pop), vec![0], "{p}");
    }
}

/// A push with producers' transaction ids on the cluster answers as on one PostgreSQL — a
/// repeat within the request and an id the partition already holds are `duplicate` of the
/// first message, nothing stored twice, order kept — and every push of one partition commits
/// on its worker in one phase, no statement over several shards.
#[tokio::test]
async fn pushes_with_transaction_ids_answer_duplicates_and_commit_in_one_phase() {
    let env = on_citus_quiet("citus_txids").await;
    let db = env.db_name.clone();
    env.push(json!([{"queue": "q", "partition": "p", "payload": {"n": 0}}]))
        .await;
    let (multi, _) = executions(&db);
    let two_phase = two_phase_commits(&db);
    let first = env
        .push(json!([
            {"queue": "q", "partition": "p", "payload": {"n": 1}, "transactionId": "t-1"},
            {"queue": "q", "partition": "p", "payload": {"n": 2}, "transactionId": "t-2"},
            {"queue": "q", "partition": "p", "payload": {"n": 3}, "transactionId": "t-1"},
            {"queue": "q", "partition": "p", "payload": {"n": 4}},
        ]))
        .await;
    assert_eq!(
        statuses(&first),
        ["queued", "queued", "duplicate", "queued"],
        "{first:?}"
    );
    assert_eq!(first[2]["message_id"], first[0]["message_id"]);
    let second = env
        .push(json!([
            {"queue": "q", "partition": "p", "payload": {"n": 5}, "transactionId": "t-2"},
            {"queue": "q", "partition": "p", "payload": {"n": 6}, "transactionId": "t-3"},
        ]))
        .await;
    assert_eq!(statuses(&second), ["duplicate", "queued"], "{second:?}");
    assert_eq!(second[0]["message_id"], first[1]["message_id"]);
    let again = env
        .push(json!([
            {"queue": "q", "partition": "p", "payload": {"n": 7}, "transactionId": "t-3"},
        ]))
        .await;
    assert_eq!(statuses(&again), ["duplicate"], "{again:?}");
    assert_eq!(
        two_phase_commits(&db) - two_phase,
        0,
        "pushes with transaction ids committed in two phases"
    );
    let (multi_after, _) = executions(&db);
    assert_eq!(
        multi_after - multi,
        0,
        "a push read or wrote several shards"
    );
    let pop = env
        .pop("/api/v1/pop/queue/q/partition/p?batch=100")
        .await
        .unwrap();
    assert_eq!(numbers(&pop), vec![0, 1, 2, 4, 6]);
}

/// With tokens, a push whose producer transaction ids repeat stored ones stores the others
/// with its producer: on Citus the new messages are appended apart from the repeats.
#[tokio::test]
async fn pushes_with_transaction_ids_and_tokens_store_each_new_message_with_its_producer() {
    use crate::auth::{HS256_ARGS, claims, expect, hs256};
    let env = on_citus_with("citus_subs", HS256_ARGS).await;
    let alice = hs256(&claims("alice", "read-write"));
    let item = |n: i64, t: &str| json!({"queue": "q", "partition": "p", "payload": {"n": n}, "transactionId": t});
    let push = |items: Vec<Value>| {
        expect(
            &env,
            "POST",
            "/api/v1/push",
            Some(&alice),
            Some(json!({"items": items})),
            StatusCode::CREATED,
        )
    };
    push(vec![item(1, "t-1")]).await;
    let second = push(vec![item(2, "t-1"), item(3, "t-2"), item(4, "t-3")]).await;
    let answer = second.json();
    let statuses: Vec<&str> = answer
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        ["duplicate", "queued", "queued"],
        "{}",
        second.text
    );
    let pop = expect(
        &env,
        "GET",
        "/api/v1/pop/queue/q/partition/p?batch=10&autoAck=true",
        Some(&alice),
        None,
        StatusCode::OK,
    )
    .await;
    let messages = pop.json()["messages"].as_array().unwrap().clone();
    assert_eq!(numbers(&pop.json()), vec![1, 3, 4], "{}", pop.text);
    assert!(
        messages.iter().all(|m| m["producerSub"] == "alice"),
        "{}",
        pop.text
    );
}

/// Two partitions of queue `q` on different workers, made by pushing to them.
async fn partitions_on_two_workers(env: &Env) -> (String, String) {
    let names: Vec<String> = (0..16).map(|i| format!("w{i}")).collect();
    for p in &names {
        env.push(json!([{"queue": "q", "partition": p, "payload": {"n": 0}}]))
            .await;
    }
    let placed = workers_of(&env.db_name, &names);
    let other = placed
        .iter()
        .position(|w| *w != placed[0])
        .expect("partitions on both workers");
    (names[0].clone(), names[other].clone())
}

/// `POST /transaction` acking and pushing on one partition (with and without transaction
/// ids) commits on the partition's worker in one phase, no statement over several shards;
/// one touching partitions of two workers commits in two phases, and is answered and stored
/// alike.
#[tokio::test]
async fn a_transaction_of_one_partition_commits_in_one_phase() {
    let env = on_citus_quiet("citus_tx_one").await;
    let db = env.db_name.clone();
    let (a, b) = partitions_on_two_workers(&env).await;
    let transact = |pop: Value, to: String, n: i64| {
        let env = &env;
        async move {
            let m = one(&pop).clone();
            let (status, body) = env
                .post(
                    "/api/v1/transaction",
                    &json!({"operations": [
                        {"type": "ack", "transactionId": m["transactionId"],
                         "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                         "status": "completed"},
                        {"type": "push", "items": [
                            {"queue": "q", "partition": to, "payload": {"n": n},
                             "transactionId": format!("tx-{n}")},
                            {"queue": "q", "partition": to, "payload": {"n": n + 1}},
                        ]},
                    ]}),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            assert_eq!(body["success"], true, "{body}");
        }
    };
    let pop = env
        .pop(&format!("/api/v1/pop/queue/q/partition/{a}"))
        .await
        .unwrap();
    let (multi, _) = executions(&db);
    let before = two_phase_commits(&db);
    transact(pop, a.clone(), 1).await;
    let one_partition = two_phase_commits(&db) - before;
    let (multi_after, _) = executions(&db);
    assert_eq!(
        one_partition, 0,
        "a transaction of one partition committed in two phases"
    );
    assert_eq!(
        multi_after - multi,
        0,
        "a transaction read or wrote several shards"
    );
    let pop = env
        .pop(&format!("/api/v1/pop/queue/q/partition/{a}"))
        .await
        .unwrap();
    assert_eq!(
        numbers(&pop),
        vec![1],
        "the ack took, the push stored in order"
    );
    // Over partitions of two workers it commits in two phases (`catalog::enlist_workers`),
    // so a worker lost between the commits cannot keep the ack without the push.
    let before = two_phase_commits(&db);
    transact(pop, b.clone(), 3).await;
    assert_eq!(
        two_phase_commits(&db) - before,
        2,
        "a transaction over two workers commits in two phases, one prepared transaction each"
    );
    assert!(
        env.pop(&format!("/api/v1/pop/queue/q/partition/{a}"))
            .await
            .is_some()
    );
    let pop = env
        .pop(&format!("/api/v1/pop/queue/q/partition/{b}?batch=10"))
        .await
        .unwrap();
    assert_eq!(numbers(&pop), vec![0, 3, 4]);
}

/// The lease extension by the lease id alone (as Queen's clients send it) on the cluster: the
/// server that granted the lease finds its cursors in memory, so no statement reads every
/// shard and the extension commits in one phase; a server that did not grant it looks the
/// lease up over every shard once (`comb_lease_lookups_all_shards_total`) and extends it
/// too. An ended lease is refused either way.
#[tokio::test]
async fn a_lease_extended_by_its_id_alone_runs_on_one_shard() {
    let env = on_citus_quiet("citus_lease_id").await;
    let db = env.db_name.clone();
    let other = env
        .second_server_with(&[
            "--maintenance-interval-ms",
            "3600000",
            "--stats-interval-ms",
            "3600000",
        ])
        .await;
    env.push(json!([{"queue": "q", "partition": "p", "payload": {"n": 1}}]))
        .await;
    let pop = env.pop("/api/v1/pop/queue/q/partition/p").await.unwrap();
    let lease = pop["leaseId"].as_str().unwrap().to_string();
    let lookups = |text: String| -> i64 {
        text.lines()
            .find_map(|l| l.strip_prefix("comb_lease_lookups_all_shards_total "))
            .expect("the look-ups counted")
            .parse()
            .unwrap()
    };
    let (multi, _) = executions(&db);
    let two_phase = two_phase_commits(&db);
    let (status, body) = env
        .post(
            &format!("/api/v1/lease/{lease}/extend"),
            &json!({"seconds": 60}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body[0]["success"], true, "{body}");
    assert_eq!(
        two_phase_commits(&db) - two_phase,
        0,
        "the extension's phases"
    );
    let (multi_after, _) = executions(&db);
    assert_eq!(
        multi_after - multi,
        0,
        "an extension by id read every shard"
    );
    assert_eq!(lookups(env.metrics_text().await), 0);
    // Through the server that did not grant it: one look-up over every shard.
    let metrics = format!("{}/metrics", other.base_url());
    let read_other = || async {
        let r = env.http.get(&metrics).send().await.unwrap();
        lookups(r.text().await.unwrap())
    };
    let before = read_other().await;
    let r = env
        .http
        .post(format!("{}/api/v1/lease/{lease}/extend", other.base_url()))
        .json(&json!({"seconds": 60}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(read_other().await - before, 1);
    // Acked, the lease ended: refused, though remembered.
    env.ack_all(&pop, "completed", None).await;
    let (status, body) = env
        .post(&format!("/api/v1/lease/{lease}/extend"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["code"], "lease_invalid", "{body}");
}

/// The key of the cluster's sealing server.
const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

/// A queue with `encryptionEnabled` on the cluster: payloads are sealed at rest on the
/// workers, opened by the claim (named partition and whole queue), and an unreadable one
/// is dead-lettered on its failure.
#[tokio::test]
async fn sealed_payloads_are_stored_sealed_and_opened_by_pops() {
    let env = tokio::task::spawn_blocking(|| {
        let db_url = Citus::shared().create_database("citus_sealed").unwrap();
        let db_name = db_url.rsplit('/').next().unwrap().to_string();
        let server = Server::start_with_env(
            common::comb_bin(),
            &db_url,
            &[],
            &[("COMB_ENCRYPTION_KEY", KEY)],
        )
        .expect("server starts");
        Env {
            server,
            db_url,
            db_name,
            http: common::client(),
        }
    })
    .await
    .unwrap();
    env.configure(
        "secret",
        json!({"encryptionEnabled": true, "retryLimit": 0}),
    )
    .await;
    env.push(json!([{"queue": "secret", "partition": "a", "payload": {"n": 1, "card": "4111"}}]))
        .await;
    // A large push is copied in (`COPY`), sealed the same.
    let large: Vec<Value> = (1..=100)
        .map(|n| json!({"queue": "secret", "partition": "b", "payload": {"n": n, "card": "4111"}}))
        .collect();
    env.push(Value::Array(large)).await;
    let sql = |q: &str| Citus::shared().coordinator().psql(&env.db_name, q).unwrap();
    assert_eq!(
        sql("SELECT count(*) FROM comb.messages WHERE position('4111'::bytea in payload) > 0"),
        "0"
    );
    assert_eq!(
        sql("SELECT count(*) FROM comb.messages WHERE substr(payload, 1, 2) = '\\x0001'::bytea"),
        "101"
    );
    let pop = env
        .pop("/api/v1/pop/queue/secret/partition/a")
        .await
        .unwrap();
    assert_eq!(one(&pop)["data"], json!({"n": 1, "card": "4111"}));
    env.ack_all(&pop, "completed", None).await;
    let pop = env.pop("/api/v1/pop/queue/secret?batch=100").await.unwrap();
    assert_eq!(numbers(&pop), (1..=100).collect::<Vec<i64>>());
    // A failed one goes to the dead letters, opened there too.
    env.ack_all(&pop, "failed", None).await;
    let (status, dlq) = env.get("/api/v1/dlq?queue=secret").await;
    assert_eq!(status, StatusCode::OK, "{dlq}");
    assert!(dlq.to_string().contains("4111"), "{dlq}");
}

/// `windowBuffer` on the cluster: a partition is served only once no push came for the
/// window.
#[tokio::test]
async fn window_buffer_holds_a_partition_until_it_is_quiet() {
    let env = on_citus("citus_window").await;
    env.configure("win", json!({"windowBuffer": 2})).await;
    let pushed = std::time::Instant::now();
    env.push(json!([{"queue": "win", "partition": "p", "payload": {"n": 1}}]))
        .await;
    for path in ["/api/v1/pop/queue/win/partition/p", "/api/v1/pop/queue/win"] {
        if let Some(pop) = env.pop(path).await {
            assert!(
                pushed.elapsed() >= Duration::from_secs(2),
                "{path} served inside the window: {pop}"
            );
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pop = env.pop_now_or_wait("win").await;
    assert_eq!(numbers(&pop), vec![1]);
}

/// `retentionSeconds` on the cluster: messages older than it are not handed out; newer ones
/// are.
#[tokio::test]
async fn retention_seconds_hides_messages_past_it() {
    let env = on_citus("citus_retained").await;
    env.configure("old", json!({"retentionSeconds": 1})).await;
    env.push(json!([{"queue": "old", "partition": "p", "payload": {"n": 1}}]))
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(env.pop("/api/v1/pop/queue/old/partition/p").await.is_none());
    assert!(env.pop("/api/v1/pop/queue/old").await.is_none());
    env.push(json!([{"queue": "old", "partition": "p", "payload": {"n": 2}}]))
        .await;
    let pop = env
        .pop("/api/v1/pop/queue/old/partition/p")
        .await
        .expect("the new message");
    assert_eq!(numbers(&pop), vec![2]);
}

/// A worker added while Comb serves, and the shards rebalanced onto it
/// (`citus_rebalance_start`): pushes and consumers run throughout, and afterwards every
/// partition has handed out each of its messages once, in order. Some shards end on the new
/// worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_added_and_rebalanced_while_serving_loses_and_reorders_nothing() {
    let env = std::sync::Arc::new(on_citus("citus_grow").await);
    let db = env.db_name.clone();
    let third = tokio::task::spawn_blocking(|| Postgres::start_with(Citus::node_settings()))
        .await
        .unwrap()
        .expect("the third worker starts");
    const PARTITIONS: usize = 8;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The producer: numbered messages into each partition in turn, retried until accepted
    // (a push answered with an error stores nothing).
    let producer = {
        let (env, stop) = (env.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0i64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || n < 40 {
                n += 1;
                let items: Vec<Value> = (0..PARTITIONS)
                    .map(|p| json!({"queue": "grow", "partition": format!("p{p}"), "payload": {"n": n}}))
                    .collect();
                loop {
                    let (status, body) = env.post("/api/v1/push", &json!({"items": items})).await;
                    if status == StatusCode::CREATED {
                        break;
                    }
                    eprintln!("push answered {status}: {body}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            n
        })
    };
    // The consumer: pops of the queue, acked; every delivery kept.
    let consumer = {
        let (env, stop) = (env.clone(), stop.clone());
        tokio::spawn(async move {
            let mut got: std::collections::HashMap<String, Vec<i64>> = Default::default();
            let mut idle = 0;
            loop {
                let (status, pop) = env.get("/api/v1/pop/queue/grow?batch=20").await;
                match status {
                    StatusCode::OK => {
                        idle = 0;
                        let p = pop["partition"].as_str().unwrap().to_string();
                        got.entry(p.clone()).or_default().extend(numbers(&pop));
                        let acked = env.ack_all(&pop, "completed", None).await;
                        assert!(!acked.is_empty(), "ack answered nothing: {pop}");
                        // A failed ack leaves its lease holding the partition past the
                        // consumer's patience: said as such, not as messages missing.
                        let failed: Vec<&Value> =
                            acked.iter().filter(|a| a["success"] != true).collect();
                        assert!(failed.is_empty(), "{p}: an ack failed: {failed:?}");
                    }
                    StatusCode::NO_CONTENT => {
                        if stop.load(std::sync::atomic::Ordering::Relaxed) {
                            idle += 1;
                            if idle > 20 {
                                return got;
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    other => {
                        eprintln!("pop answered {other}: {pop}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let moved = tokio::task::spawn_blocking({
        let db = db.clone();
        move || {
            let citus = Citus::shared();
            citus.add_worker(&db, &third).unwrap();
            let c = citus.coordinator();
            c.psql(
                &db,
                "SELECT citus_rebalance_start(shard_transfer_mode => 'block_writes')",
            )
            .unwrap();
            c.psql(&db, "SELECT citus_rebalance_wait()").unwrap();
            let on_third = c
                .psql(
                    &db,
                    &format!(
                        "SELECT count(*) FROM citus_shards
                         WHERE table_name = 'comb.partitions'::regclass AND nodeport = {}",
                        third.port()
                    ),
                )
                .unwrap();
            (third, on_third)
        }
    })
    .await
    .unwrap();
    let (_third, on_third) = moved;
    assert_ne!(on_third, "0", "no shard moved to the new worker");
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let pushed = producer.await.unwrap();
    let got = consumer.await.unwrap();
    for p in 0..PARTITIONS {
        let name = format!("p{p}");
        assert_eq!(
            got.get(&name).cloned().unwrap_or_default(),
            (1..=pushed).collect::<Vec<i64>>(),
            "{name}: every message once, in order"
        );
    }
}

// The administration on the cluster

/// `count` messages `from..` of `queue`'s `partition`, with transaction ids `partition-n`.
fn admin_items(queue: &str, partition: &str, from: i64, count: i64) -> Value {
    json!(
        (from..from + count)
            .map(
                |n| json!({"queue": queue, "partition": partition, "payload": {"n": n},
                            "transactionId": format!("{partition}-{n}")})
            )
            .collect::<Vec<_>>()
    )
}

/// `GET path`, which must answer 200.
async fn admin_ok(env: &Env, path: &str) -> Value {
    let (s, body) = env.get(path).await;
    assert_eq!(s, StatusCode::OK, "{path}: {body}");
    body
}

/// The transaction ids and statuses of a message listing.
fn listed(list: &Value) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = list["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["transactionId"].as_str().unwrap().to_string(),
                m["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Every listing a dashboard or the CLI reads answers on the cluster with the figures the
/// plain-PostgreSQL tests (`admin.rs`) assert for the same traffic; the actions that move
/// cursors or requeue are refused with `unsupported_on_cluster` and change nothing.
#[tokio::test]
async fn administration_listings_count_right_and_unsupported_actions_are_refused() {
    let env = on_citus("citus_admin").await;
    let (s, body) = env
        .post(
            "/api/v1/configure",
            &json!({"queue": "orders", "namespace": "billing", "task": "invoice",
                    "options": {"retryLimit": 0}}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let pushed = env.push(admin_items("orders", "p1", 0, 5)).await;
    let p1 = pushed[0]["partition_id"].as_str().unwrap().to_string();
    let pushed = env.push(admin_items("orders", "p2", 0, 3)).await;
    let p2 = pushed[0]["partition_id"].as_str().unwrap().to_string();
    env.push(admin_items("other", "Default", 0, 1)).await;
    // Two of p1 leased out.
    let pop = env
        .pop("/api/v1/pop/queue/orders/partition/p1?batch=2")
        .await
        .unwrap();
    assert_eq!(numbers(&pop), vec![0, 1]);

    let list = admin_ok(&env, "/api/v1/resources/queues").await;
    assert_eq!(list["total"], 2, "{list}");
    let orders = list["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == "orders")
        .unwrap_or_else(|| panic!("orders is listed: {list}"));
    assert_eq!(orders["namespace"], "billing");
    assert_eq!(orders["partitions"], 2);
    assert_eq!(orders["messages"]["total"], 8, "{orders}");
    assert_eq!(orders["messages"]["processing"], 2);
    assert_eq!(orders["messages"]["pending"], 6);
    assert_eq!(orders["deadLetters"], 0);
    assert!(orders["oldestPendingAt"].is_string(), "{orders}");
    let leased = admin_ok(&env, "/api/v1/messages?queue=orders&status=processing").await;
    assert_eq!(
        listed(&leased),
        vec![
            ("p1-0".into(), "processing".into()),
            ("p1-1".into(), "processing".into())
        ]
    );
    let one = admin_ok(&env, &format!("/api/v1/messages/{p1}/p1-1")).await;
    assert_eq!(one["data"]["n"], 1);
    assert_eq!(one["consumerGroups"][0]["status"], "processing", "{one}");
    let status = admin_ok(&env, "/api/v1/status").await;
    assert_eq!(status["leases"]["active"], 1, "{status}");

    // The first message fails: at retryLimit 0 it is a dead letter.
    let (s, body) = env
        .ack(&pop["messages"][0], "failed", None, Some("boom"))
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let detail = admin_ok(&env, "/api/v1/resources/queues/orders").await;
    assert_eq!(detail["deadLetters"], 1, "{detail}");
    let parts = detail["partitionList"].as_array().unwrap();
    assert_eq!(parts.len(), 2, "{detail}");
    assert_eq!(parts[0]["name"], "p1");
    assert_eq!(parts[0]["messages"]["total"], 5);
    assert_eq!(parts[1]["messages"]["pending"], 3);
    assert_eq!(detail["consumerGroups"][0]["name"], "__QUEUE_MODE__");
    let partitions = admin_ok(&env, "/api/v1/resources/partitions?queue=orders&limit=1").await;
    assert_eq!(partitions["total"], 2);
    assert_eq!(partitions["partitions"].as_array().unwrap().len(), 1);
    assert_eq!(
        admin_ok(&env, "/api/v1/resources/partitions").await["total"],
        3
    );
    let namespaces = admin_ok(&env, "/api/v1/resources/namespaces").await;
    assert_eq!(namespaces["namespaces"][0]["namespace"], "billing");
    assert_eq!(namespaces["namespaces"][0]["messages"]["total"], 8);
    let tasks = admin_ok(&env, "/api/v1/resources/tasks").await;
    assert_eq!(tasks["tasks"][0]["task"], "invoice");
    let overview = admin_ok(&env, "/api/v1/resources/overview").await;
    assert_eq!(overview["queues"], 2);
    assert_eq!(overview["partitions"], 3);
    assert_eq!(overview["messages"]["total"], 9, "{overview}");
    assert_eq!(overview["messages"]["deadLetters"], 1);

    // A second group reads all of p2 (a pop of the queue takes one partition).
    let read = env
        .pop("/api/v1/pop/queue/orders/partition/p2?consumerGroup=g&autoAck=true&batch=10")
        .await
        .unwrap();
    assert_eq!(numbers(&read), vec![0, 1, 2]);
    let groups = admin_ok(&env, "/api/v1/consumer-groups").await;
    let g = groups
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "g")
        .unwrap_or_else(|| panic!("g is listed: {groups}"));
    assert_eq!(g["totalLag"], 5, "{g}");
    let g = admin_ok(&env, "/api/v1/consumer-groups/g").await;
    let cursors: Vec<(String, i64)> = g["queues"][0]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["partition"].as_str().unwrap().into(),
                p["lag"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(cursors, vec![("p1".into(), 5), ("p2".into(), 0)], "{g}");
    let lagging = admin_ok(&env, "/api/v1/consumer-groups/lagging?minLagSeconds=0").await;
    let of_g: Vec<&Value> = lagging
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["consumerGroup"] == "g")
        .collect();
    assert_eq!(of_g.len(), 1, "{lagging}");
    assert_eq!(
        (&of_g[0]["partition"], &of_g[0]["lag"]),
        (&json!("p1"), &json!(5))
    );

    // Messages: by status for the queue-mode group, one by one, and the dead letters.
    let all = admin_ok(&env, "/api/v1/messages?queue=orders").await;
    let all = listed(&all);
    assert_eq!(all.len(), 8, "{all:?}");
    assert!(
        all.contains(&("p1-0".into(), "dead_letter".into())),
        "{all:?}"
    );
    assert!(all.contains(&("p2-2".into(), "pending".into())), "{all:?}");
    let pending = admin_ok(&env, "/api/v1/messages?queue=orders&status=pending").await;
    assert_eq!(listed(&pending).len(), 7, "{pending}");
    let paged = admin_ok(&env, "/api/v1/messages?queue=orders&limit=3&offset=4").await;
    assert_eq!(listed(&paged).len(), 3);
    let of_g = admin_ok(
        &env,
        "/api/v1/messages?queue=orders&partition=p2&consumerGroup=g",
    )
    .await;
    assert!(
        listed(&of_g).iter().all(|(_, s)| s == "completed"),
        "{of_g}"
    );
    let one = admin_ok(&env, &format!("/api/v1/messages/{p2}/p2-1")).await;
    let statuses: Vec<(&str, &str)> = one["consumerGroups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| (x["name"].as_str().unwrap(), x["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        statuses,
        vec![("__QUEUE_MODE__", "pending"), ("g", "completed")],
        "{one}"
    );
    let dead = admin_ok(&env, "/api/v1/messages?queue=orders&status=dead_letter").await;
    assert_eq!(listed(&dead), vec![("p1-0".into(), "dead_letter".into())]);
    let dlq = admin_ok(&env, "/api/v1/dlq?queue=orders").await;
    assert_eq!(dlq["messages"].as_array().unwrap().len(), 1, "{dlq}");

    // Traces: by message, by name, and the names.
    for (tx, names) in [
        ("p1-1", json!(["order-1", "checkout"])),
        ("p1-2", json!("order-1")),
    ] {
        let (s, body) = env
            .post(
                "/api/v1/traces",
                &json!({"partitionId": p1, "transactionId": tx, "traceNames": names,
                        "eventType": "info", "data": {"tx": tx}}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
    }
    let of = admin_ok(&env, &format!("/api/v1/traces/{p1}/p1-1")).await;
    assert_eq!(of["traces"].as_array().unwrap().len(), 1, "{of}");
    let by = admin_ok(&env, "/api/v1/traces/by-name/order-1").await;
    assert_eq!(by["traces"].as_array().unwrap().len(), 2, "{by}");
    let names = admin_ok(&env, "/api/v1/traces/names").await;
    let names: Vec<&str> = names["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["checkout", "order-1"]);
    let second = admin_ok(&env, "/api/v1/traces/names?limit=1&offset=1").await;
    assert_eq!(second["names"][0]["name"], "order-1");

    // Status.
    let status = admin_ok(&env, "/api/v1/status").await;
    assert_eq!(status["queues"], 2, "{status}");
    let queue = admin_ok(&env, "/api/v1/status/queues/orders").await;
    assert_eq!(queue["deadLetters"], 1, "{queue}");
    let queues = admin_ok(&env, "/api/v1/status/queues").await;
    assert_eq!(queues["queues"].as_array().unwrap().len(), 2, "{queues}");
    for path in [
        "/api/v1/status/analytics",
        "/api/v1/analytics/postgres-stats",
        "/api/v1/analytics/system-metrics",
        "/api/v1/analytics/worker-metrics",
    ] {
        admin_ok(&env, path).await;
    }
    // The scrape's depth and lag statement (`backlog`) answers too.
    let metrics = env.metrics_text().await;
    assert!(
        metrics.lines().any(|l| l == "comb_queue_stats_success 1"),
        "{metrics}"
    );
    let depth = metrics
        .lines()
        .find_map(|l| l.strip_prefix("comb_queue_depth_messages{queue=\"orders\"} "));
    let figures = admin_ok(&env, "/api/v1/resources/queues/orders").await;
    let pending_now = figures["messages"]["pending"].as_i64().unwrap()
        + figures["messages"]["processing"].as_i64().unwrap();
    assert_eq!(depth, Some(pending_now.to_string().as_str()), "{metrics}");
    let (s, body) = env.post("/api/v1/stats/refresh", &json!({})).await;
    assert_eq!(
        (s, &body["success"]),
        (StatusCode::OK, &json!(true)),
        "{body}"
    );

    // Actions that move cursors or requeue: refused, nothing changed.
    let refused: Vec<(StatusCode, Value)> = vec![
        env.post(
            "/api/v1/consumer-groups/g/queues/orders/seek",
            &json!({"toEnd": true}),
        )
        .await,
        env.post(
            "/api/v1/consumer-groups/g/queues/orders/partitions/p1/seek",
            &json!({"toEnd": true}),
        )
        .await,
        env.post(
            "/api/v1/consumer-groups/g/subscription",
            &json!({"subscriptionTimestamp": "2026-01-01T00:00:00Z"}),
        )
        .await,
        env.post("/api/v1/dlq/requeue", &json!({"queue": "orders"}))
            .await,
        env.post(&format!("/api/v1/messages/{p1}/p1-0/retry"), &json!({}))
            .await,
        env.post(&format!("/api/v1/messages/{p1}/p1-3/dlq"), &json!({}))
            .await,
        env.delete(&format!("/api/v1/messages/{p1}/p1-3")).await,
        env.delete("/api/v1/queues/orders/clear").await,
        env.delete("/api/v1/queues/orders/clear?partition=p2").await,
        env.delete("/api/v1/consumer-groups/g/queues/orders").await,
    ];
    for (s, body) in refused {
        assert_eq!(s, StatusCode::NOT_IMPLEMENTED, "{body}");
        assert_eq!(body["code"], "unsupported_on_cluster", "{body}");
    }
    let after = admin_ok(&env, "/api/v1/messages?queue=orders").await;
    assert_eq!(listed(&after), all, "the refused actions changed nothing");
    assert_eq!(
        admin_ok(&env, "/api/v1/consumer-groups/g").await["queues"][0]["partitions"][0]["lag"],
        5
    );

    // Purging dead letters and deleting a queue work.
    let (s, body) = env
        .post("/api/v1/dlq/purge", &json!({"queue": "orders"}))
        .await;
    assert_eq!((s, &body["purged"]), (StatusCode::OK, &json!(1)), "{body}");
    assert_eq!(
        admin_ok(&env, "/api/v1/resources/queues/orders").await["deadLetters"],
        0
    );
    assert_eq!(env.delete_queue("other").await, StatusCode::OK);
    assert_eq!(admin_ok(&env, "/api/v1/resources/queues").await["total"], 1);
}

/// The maintenance modes switch on, again, and off on the cluster (`comb.system_modes` is a
/// reference table there, whose upsert Citus plans only without a function in `DO UPDATE
/// SET`), each switch answering with the mode as stored, and they hold pushes and pops while
/// on.
#[tokio::test]
async fn maintenance_modes_switch_on_and_off_and_hold_traffic_on_the_cluster() {
    let env = on_citus("citus_modes").await;
    env.push(admin_items("mm", "p", 0, 1)).await;
    for (path, held) in [
        ("/api/v1/system/maintenance", "push"),
        ("/api/v1/system/maintenance/pop", "pop"),
    ] {
        // On twice: the second switch updates the row the first inserted.
        for enabled in [true, true, false, true, false] {
            let (s, body) = env.post(path, &json!({"enabled": enabled})).await;
            assert_eq!(s, StatusCode::OK, "{path} {enabled}: {body}");
            assert_eq!(
                (&body["enabled"], &body["mode"]),
                (&json!(enabled), &json!(held)),
                "{body}"
            );
            assert!(body["changedAt"].is_string(), "{body}");
            let (s, stored) = env.get(path).await;
            assert_eq!(s, StatusCode::OK, "{stored}");
            assert_eq!(stored["enabled"], enabled, "{stored}");
            if !enabled {
                continue;
            }
            if held == "push" {
                let (s, _, body) = env
                    .post_full(
                        "/api/v1/push",
                        &json!({"items": admin_items("mm", "p", 1, 1)}),
                    )
                    .await;
                assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
                assert_eq!(body["code"], "maintenance_mode", "{body}");
            } else {
                assert!(env.pop("/api/v1/pop/queue/mm").await.is_none());
            }
        }
    }
    // Both off: pushes are stored and pops hand them out again.
    env.push(admin_items("mm", "p", 1, 1)).await;
    let pop = env.pop("/api/v1/pop/queue/mm?batch=10").await.unwrap();
    assert_eq!(numbers(&pop), vec![0, 1]);
}

/// Runs `sql` on the coordinator in the test's database; psql's unaligned output.
fn on_coordinator(env: &Env, sql: &str) -> String {
    Citus::shared()
        .coordinator()
        .psql(&env.db_name, sql)
        .unwrap()
        .trim()
        .to_string()
}

/// The per-minute statistics are written on the cluster: each server's counts, each queue's
/// counts, and the minute's snapshot of every queue's figures and every group's lag (read
/// over the distributed tables by the PL/pgSQL figures), with no warning logged.
#[tokio::test]
async fn the_per_minute_statistics_are_written_on_the_cluster() {
    let env = on_citus_with("citus_stats", &["--stats-interval-ms", "500"]).await;
    env.configure("s", json!({"retryLimit": 0})).await;
    env.push(admin_items("s", "p", 0, 5)).await;
    env.push(admin_items("t", "p", 0, 2)).await;
    let pop = env.pop("/api/v1/pop/queue/s?batch=5").await.unwrap();
    let acks: Vec<Value> = pop["messages"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, m)| {
            json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                   "leaseId": m["leaseId"], "status": if i == 0 { "failed" } else { "completed" }})
        })
        .collect();
    let (s, body) = env
        .post("/api/v1/ack/batch", &json!({"acknowledgments": acks}))
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");

    let servers = "SELECT concat_ws(',', sum(pushed), sum(popped), sum(acked), sum(failed),
                                    sum(dead_lettered))
                   FROM comb.server_minutes";
    // The snapshot of this minute (or, when the minute turned before the acks, of the next).
    let snapshot = "SELECT concat_ws(',', m.partitions, m.total, m.pending, m.processing,
                                     m.dead_letters)
                    FROM comb.queue_minutes m JOIN comb.queues q ON q.id = m.queue_id
                    WHERE q.name = 's' ORDER BY m.minute DESC LIMIT 1";
    common::until("the counts and the snapshot of s written", || async {
        on_coordinator(&env, servers) == "7,5,4,1,1"
            && on_coordinator(&env, snapshot) == "1,5,0,0,1"
    })
    .await;
    let of_s = on_coordinator(
        &env,
        "SELECT concat_ws(',', sum(c.pushed), sum(c.popped), sum(c.acked), sum(c.failed),
                          sum(c.dead_lettered))
         FROM comb.queue_counts c JOIN comb.queues q ON q.id = c.queue_id WHERE q.name = 's'",
    );
    assert_eq!(of_s, "5,5,4,1,1");
    // The queue-mode group has settled all of s.
    let lag = on_coordinator(
        &env,
        "SELECT concat_ws(',', g.consumer_group, g.partitions, g.lag, g.leased)
         FROM comb.group_minutes g JOIN comb.queues q ON q.id = g.queue_id
         WHERE q.name = 's' ORDER BY g.minute DESC LIMIT 1",
    );
    assert_eq!(lag, "__QUEUE_MODE__,1,0,0");
    // What the listings serve from: the analytics of s.
    let analytics = admin_ok(&env, "/api/v1/status/analytics?queue=s").await;
    assert_eq!(
        analytics["totals"],
        json!({"pushed": 5, "popped": 5, "acked": 4, "failed": 1, "deadLettered": 1}),
        "{analytics}"
    );
    let log = std::fs::read_to_string(env.server.log_path()).unwrap();
    assert!(
        !log.contains("counters not written"),
        "the statistics writer warned:\n{log}"
    );
}

// A worker lost

/// Through the coordinator, whose listing over every shard fails while a worker is down (the
/// direct route lists one worker at a time anyway: `citus_lost`).
const COORDINATOR: &[&str] = &["--citus-route", "coordinator"];

/// The server's log lines that tell why requests were refused.
fn refusals(server: &Server) -> String {
    let log = server.log_tail(100_000);
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("request refused"))
        .collect();
    lines.join("\n")
}

/// A request's status and whether it came with `Retry-After`.
async fn status_and_retry(r: reqwest::RequestBuilder) -> (StatusCode, bool, Value) {
    let r = r.send().await.expect("request");
    let retry = r.headers().contains_key("retry-after");
    let status = r.status();
    (status, retry, r.json().await.unwrap_or(Value::Null))
}

/// A private cluster (its workers may be stopped), database `name` on it, and a server.
async fn private_cluster(name: &'static str) -> (Citus, Env) {
    private_cluster_with(name, &[], &[]).await
}

/// [`private_cluster`] with `settings` on every node (after the harness's own) and extra
/// `comb serve` flags.
pub(super) async fn private_cluster_with(
    name: &'static str,
    settings: &'static [(&'static str, &'static str)],
    args: &'static [&'static str],
) -> (Citus, Env) {
    tokio::task::spawn_blocking(move || {
        let citus = Citus::start_with(settings).expect("a private cluster starts");
        let db_url = citus.create_database(name).unwrap();
        let db_name = db_url.rsplit('/').next().unwrap().to_string();
        let server = Server::start(common::comb_bin(), &db_url, args).expect("server starts");
        let env = Env {
            server,
            db_url,
            db_name,
            http: common::client(),
        };
        (citus, env)
    })
    .await
    .unwrap()
}

/// One worker of a private cluster stopped while two servers serve: partitions on the other
/// worker take pushes and serve pops, named and of the whole queue (a server that had not
/// seen the group reads the subscription rather than writing it, and lists the live
/// worker's candidates one worker at a time); requests naming a partition of the stopped
/// worker answer 503 with `Retry-After`, never 500. Once the worker is back, every partition
/// delivers what it had, in order, and holds everything acknowledged as pushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_lost_holds_its_partitions_while_the_others_serve() {
    let (citus, env) = private_cluster_with("citus_lost", &[], COORDINATOR).await;
    const PARTITIONS: usize = 12;
    let names: Vec<String> = (0..PARTITIONS).map(|p| format!("p{p}")).collect();
    let push_one = |p: &str, n: i64| json!({"queue": "lost", "partition": p, "payload": {"n": n}});
    for n in 1..=2 {
        env.push(json!(
            names.iter().map(|p| push_one(p, n)).collect::<Vec<_>>()
        ))
        .await;
    }
    // Every partition's first message acknowledged while the cluster is whole.
    for p in &names {
        let url = env.url(&format!("/api/v1/pop/queue/lost/partition/{p}?batch=1"));
        let (status, _, pop) = status_and_retry(env.http.get(url)).await;
        assert_eq!(status, StatusCode::OK, "{pop}\n{}", refusals(&env.server));
        assert_eq!(numbers(&pop), vec![1]);
        assert_eq!(env.ack_all(&pop, "completed", None).await.len(), 1);
    }
    env.push(json!(
        names.iter().map(|p| push_one(p, 3)).collect::<Vec<_>>()
    ))
    .await;
    // Which worker holds each partition.
    let placed = placements(&citus, &env.db_name, &names);
    let lost_port = citus.workers()[1].port().to_string();
    let (mut held, mut live): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
    for line in placed.lines() {
        let (name, port) = line.split_once(' ').unwrap();
        if port == lost_port {
            held.push(name.to_string());
        } else {
            live.push(name.to_string());
        }
    }
    held.sort();
    live.sort();
    assert!(
        !held.is_empty() && live.len() >= 2,
        "partitions on both workers: {placed}"
    );
    // A second server that has not popped yet: its first pop of the group finds the
    // subscription rather than writing it.
    let second = env.second_server_with(COORDINATOR).await;

    let worker = &citus.workers()[1];
    tokio::task::block_in_place(|| worker.stop("fast")).expect("the worker stops");

    // Live partitions take pushes.
    for p in &live {
        env.push(json!([push_one(p, 4)])).await;
    }
    // The stopped worker's partitions: 503 with Retry-After, for pushes and pops.
    let refused = |what: String, (status, retry, body): (StatusCode, bool, Value)| {
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{what}: {body}");
        assert!(retry, "{what}: no Retry-After");
        assert_eq!(body["code"], "database_unavailable", "{what}: {body}");
    };
    let held_requests = || async {
        for p in &held {
            let push = env
                .http
                .post(env.url("/api/v1/push"))
                .json(&json!({"items": [push_one(p, 99)]}));
            refused(format!("push to {p}"), status_and_retry(push).await);
            let pop = env
                .http
                .get(env.url(&format!("/api/v1/pop/queue/lost/partition/{p}")));
            refused(format!("pop of {p}"), status_and_retry(pop).await);
        }
    };
    held_requests().await;
    let logs = || {
        format!(
            "{}\n--- the second server ---\n{}",
            env.server.log_tail(60),
            second.log_tail(60)
        )
    };
    // Partitions of the live worker serve pops: a named pop, and a pop of the whole queue on
    // the server that has not seen the group (it reads the subscription, its listing over
    // every shard fails, and the listing per worker finds the live worker's candidates).
    let url = env.url(&format!(
        "/api/v1/pop/queue/lost/partition/{}?batch=10",
        live[0]
    ));
    let (status, _, named) = status_and_retry(env.http.get(url)).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "pop of {}: {named}\n{}",
        live[0],
        logs()
    );
    assert_eq!(numbers(&named), vec![2, 3, 4], "{}", live[0]);
    let url = format!("{}/api/v1/pop/queue/lost?batch=10", second.base_url());
    let (status, _, whole) = status_and_retry(env.http.get(url)).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a pop of the queue: {whole}\n{}",
        logs()
    );
    let p = whole["partition"].as_str().unwrap_or_default().to_string();
    assert!(live.contains(&p) && p != live[0], "{p}: {whole}");
    assert_eq!(numbers(&whole), vec![2, 3, 4], "{p}");
    let log = second.log_tail(200);
    assert!(
        log.contains("candidates listed per worker: 1 of 2 workers answered")
            && !log.contains("workers answered, 0 candidates"),
        "{log}"
    );
    // Their acks: answered, or refused with 503 and Retry-After (then sent again once the
    // worker is back, under the same lease), never failed.
    let ack_request = |pop: &Value| {
        let acks: Vec<Value> = pop["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                       "leaseId": m["leaseId"], "status": "completed"})
            })
            .collect();
        env.http
            .post(env.url("/api/v1/ack/batch"))
            .json(&json!({ "acknowledgments": acks }))
    };
    let mut unacked = Vec::new();
    for pop in [&named, &whole] {
        let (status, retry, body) = status_and_retry(ack_request(pop)).await;
        eprintln!("an ack of a live partition while a worker is down: {status}");
        match status {
            StatusCode::OK => assert!(
                body.as_array()
                    .unwrap()
                    .iter()
                    .all(|r| r["success"] == true),
                "{body}"
            ),
            _ => {
                refused("an ack of a live partition".into(), (status, retry, body));
                unacked.push(pop.clone());
            }
        }
    }
    tokio::task::block_in_place(|| worker.restart()).expect("the worker restarts");
    // Everything pushed is delivered once the worker is back: the live partitions their
    // messages in order, the held ones what they had.
    for pop in &unacked {
        let (status, _, body) = status_and_retry(ack_request(pop)).await;
        assert_eq!(status, StatusCode::OK, "an ack sent again: {body}");
    }
    let served = [live[0].clone(), p.clone()];
    let mut delivered: Vec<String> = served.to_vec();
    for _ in 0..(2 * PARTITIONS) {
        let url = format!("{}/api/v1/pop/queue/lost?batch=10", second.base_url());
        let (status, _, pop) = status_and_retry(env.http.get(url)).await;
        if status == StatusCode::NO_CONTENT {
            break;
        }
        assert_eq!(status, StatusCode::OK, "a pop of the queue: {pop}");
        let p = pop["partition"].as_str().unwrap().to_string();
        let want = if live.contains(&p) {
            vec![2, 3, 4]
        } else {
            vec![2, 3]
        };
        assert_eq!(numbers(&pop), want, "{p}");
        assert_eq!(env.ack_all(&pop, "completed", None).await.len(), want.len());
        delivered.push(p);
    }
    delivered.sort();
    let mut all = names.clone();
    all.sort();
    assert_eq!(delivered, all);
    assert!(env.pop("/api/v1/pop/queue/lost").await.is_none());
    // Everything acknowledged as pushed is there, in order: a new group reads it all.
    for p in &names {
        let pop = env
            .pop(&format!(
                "/api/v1/pop/queue/lost/partition/{p}?batch=10&consumerGroup=audit"
            ))
            .await
            .expect("the audit group reads");
        let want: Vec<i64> = if live.contains(p) {
            vec![1, 2, 3, 4]
        } else {
            vec![1, 2, 3]
        };
        assert_eq!(numbers(&pop), want, "{p}");
    }
    drop(second);
    drop(env);
    drop(citus);
}

/// Which worker holds each of the partitions `names`: a line `name port` each.
pub(super) fn placements(citus: &Citus, db: &str, names: &[String]) -> String {
    let list: Vec<String> = names.iter().map(|p| format!("'{p}'")).collect();
    citus
        .coordinator()
        .psql(
            db,
            &format!(
                "SELECT p.name || ' ' || n.nodeport FROM comb.partitions p
                 JOIN pg_dist_placement pl
                   ON pl.shardid = get_shard_id_for_distribution_column('comb.partitions', p.id)
                 JOIN pg_dist_node n ON n.groupid = pl.groupid
                 WHERE p.name IN ({})",
                list.join(",")
            ),
        )
        .unwrap()
}

/// With a worker stopped, a pop of the whole queue by a group whose name holds `$1`, a quote
/// and a backslash lists the live worker's candidates one worker at a time and is served:
/// the per-worker listing binds the group as a parameter, never as text of the statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_lost_lists_candidates_of_a_group_named_like_sql_by_parameters() {
    let (citus, env) = private_cluster_with("citus_lost_named", &[], COORDINATOR).await;
    const GROUP: &str = r"g$1'x\y $2";
    // Enough partitions that the live worker holds at least two (their ids, and so their
    // shards, follow the queue's random id): one for the named pop, one for the queue's.
    const PARTITIONS: usize = 24;
    let names: Vec<String> = (0..PARTITIONS).map(|p| format!("p{p}")).collect();
    let push_one = |p: &str, n: i64| json!({"queue": "named", "partition": p, "payload": {"n": n}});
    env.push(json!(
        names.iter().map(|p| push_one(p, 1)).collect::<Vec<_>>()
    ))
    .await;
    let placed = placements(&citus, &env.db_name, &names);
    let lost_port = citus.workers()[1].port().to_string();
    let live: Vec<String> = placed
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, port)| *port != lost_port)
        .map(|(name, _)| name.to_string())
        .collect();
    assert!(
        live.len() >= 2 && live.len() < PARTITIONS,
        "partitions on both workers, two on the live one: {placed}"
    );
    // The group subscribes while the cluster is whole (the subscription is a reference
    // table's row, written on every node), by a named pop of a live partition.
    let named = env
        .http
        .get(env.url(&format!("/api/v1/pop/queue/named/partition/{}", live[0])))
        .query(&[("consumerGroup", GROUP), ("batch", "10")]);
    let (status, _, first) = status_and_retry(named).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["consumerGroup"].as_str(), Some(GROUP), "{first}");
    assert_eq!(numbers(&first), vec![1]);

    let worker = &citus.workers()[1];
    tokio::task::block_in_place(|| worker.stop("fast")).expect("the worker stops");
    let whole = env
        .http
        .get(env.url("/api/v1/pop/queue/named"))
        .query(&[("consumerGroup", GROUP), ("batch", "10")]);
    let (status, _, pop) = status_and_retry(whole).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a pop of the queue: {pop}\n{}",
        env.server.log_tail(60)
    );
    let p = pop["partition"].as_str().unwrap_or_default().to_string();
    assert!(live.contains(&p) && p != live[0], "{p}: {pop}");
    assert_eq!(numbers(&pop), vec![1], "{p}");
    let log = env.server.log_tail(200);
    assert!(
        log.contains("candidates listed per worker: 1 of 2 workers answered")
            && !log.contains("workers answered, 0 candidates"),
        "{log}"
    );
    tokio::task::block_in_place(|| worker.restart()).expect("the worker restarts");
    drop(env);
    drop(citus);
}

// Partition ids derived from their queue and name

/// The id Comb derives for partition `name` of queue `queue_id` (`catalog::ids`): pinned
/// here too, since changing it would lose every partition made before the change.
fn derived_id(queue_id: &str, name: &str) -> uuid::Uuid {
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x5e1c_7a0b_93d4_4c2e_8f61_2b7d_0a9e_c3f4);
    let queue: uuid::Uuid = queue_id.parse().unwrap();
    let mut bytes = queue.as_bytes().to_vec();
    bytes.extend_from_slice(name.as_bytes());
    uuid::Uuid::new_v5(&NAMESPACE, &bytes)
}

/// A push to a partition that does not exist yet makes it with one statement of its shard (its
/// id derived from its name, no lock of the queue's row), and a named pop of it by a server
/// that has never seen it finds it by that id: neither runs a statement over several shards
/// nor commits in two phases.
#[tokio::test]
async fn a_push_to_a_new_partition_and_a_named_pop_of_an_unseen_one_run_on_one_shard() {
    let env = on_citus_quiet("citus_pids").await;
    let db = env.db_name.clone();
    env.push(json!([{"queue": "q", "partition": "warm", "payload": {"n": 0}}]))
        .await;
    let pop = env.pop("/api/v1/pop/queue/q/partition/warm").await.unwrap();
    env.ack_all(&pop, "completed", None).await;
    // Started before the counts: its `comb migrate` reads every shard.
    let second = env
        .second_server_with(&[
            "--maintenance-interval-ms",
            "3600000",
            "--stats-interval-ms",
            "3600000",
        ])
        .await;
    let (multi, single) = executions(&db);
    let two_phase = two_phase_commits(&db);

    env.push(json!([{"queue": "q", "partition": "fresh", "payload": {"n": 1}}]))
        .await;
    assert_eq!(
        two_phase_commits(&db),
        two_phase,
        "the push committed in two phases"
    );
    let url = format!("{}/api/v1/pop/queue/q/partition/fresh", second.base_url());
    let r = env.http.get(url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let pop: Value = r.json().await.unwrap();
    assert_eq!(numbers(&pop), vec![1], "{pop}");
    assert_eq!(
        two_phase_commits(&db),
        two_phase,
        "the pop committed in two phases"
    );
    let (multi_after, single_after) = executions(&db);
    assert!(single_after > single, "the counters count");
    assert_eq!(
        multi_after - multi,
        0,
        "the first push and pop of a partition ran statements on several shards"
    );

    let on = |sql: &str| Citus::shared().coordinator().psql(&db, sql).unwrap();
    let queue_id = on("SELECT id FROM comb.queues WHERE name = 'q'");
    assert_eq!(
        pop["messages"][0]["partitionId"],
        derived_id(&queue_id, "fresh").to_string()
    );
    assert_eq!(on("SELECT legacy FROM comb.partition_ids"), "f");
}

/// Servers racing to make the same partitions on the cluster, while a new group subscribes to
/// the queue, make each partition once and give every (partition, group) pair its cursor:
/// creations hold their queue's creation lock shared, the subscription exclusive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_creators_and_a_new_group_get_one_partition_and_a_cursor_each() {
    let env = on_citus("citus_pids_race").await;
    env.push(json!([{"queue": "race", "partition": "warm", "payload": {"n": 0}}]))
        .await;
    let second = env.second_server().await;
    const NAMES: usize = 16;
    let mut tasks = Vec::new();
    for base in [env.server.base_url(), second.base_url()] {
        for p in 0..NAMES {
            let http = env.http.clone();
            let url = format!("{base}/api/v1/push");
            tasks.push(tokio::spawn(async move {
                let body = json!({"items": [{"queue": "race", "partition": format!("r{p}"),
                                             "payload": {"n": p}}]});
                http.post(url).json(&body).send().await.unwrap().status()
            }));
        }
        if tasks.len() == NAMES {
            let http = env.http.clone();
            let url = format!("{base}/api/v1/pop/queue/race?consumerGroup=late&batch=1");
            tasks.push(tokio::spawn(async move {
                http.get(url).send().await.unwrap().status()
            }));
        }
    }
    for t in tasks {
        let status = t.await.unwrap();
        assert!(
            status == StatusCode::CREATED || status == StatusCode::OK,
            "{status}"
        );
    }
    let on = |sql: &str| {
        Citus::shared()
            .coordinator()
            .psql(&env.db_name, sql)
            .unwrap()
    };
    assert_eq!(
        on("SELECT count(*) || ',' || count(DISTINCT name) FROM comb.partitions"),
        format!("{},{}", NAMES + 1, NAMES + 1)
    );
    assert_eq!(
        on("SELECT count(*) FROM comb.cursors WHERE consumer_group = 'late'"),
        (NAMES + 1).to_string(),
        "a partition without the new group's cursor"
    );
    assert_eq!(
        on("SELECT count(*) FROM comb.messages"),
        (2 * NAMES + 1).to_string()
    );
}

/// With a worker stopped, a server that had never seen the queue's partitions pushes to and
/// pops partitions of the live worker: one made before the stop, and one it makes now. Their
/// look-up by name is a look-up of their derived id on their shard; a partition of the
/// stopped worker answers 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_worker_lost_a_fresh_server_finds_and_makes_partitions_of_the_live_one() {
    let (citus, env) = private_cluster("citus_pids_lost").await;
    let db = env.db_name.clone();
    const OLD: usize = 8;
    let items: Vec<Value> = (0..OLD)
        .map(|p| json!({"queue": "lost", "partition": format!("a{p}"), "payload": {"n": 1}}))
        .collect();
    env.push(json!(items)).await;
    // The group subscribed while the cluster is whole (a new group needs every node).
    let pop = env
        .pop("/api/v1/pop/queue/lost/partition/a0")
        .await
        .unwrap();
    env.ack_all(&pop, "completed", None).await;
    let queue_id = citus
        .coordinator()
        .psql(&db, "SELECT id FROM comb.queues WHERE name = 'lost'")
        .unwrap();
    let port = |name: &str| {
        let id = derived_id(&queue_id, name);
        citus
            .coordinator()
            .psql(
                &db,
                &format!(
                    "SELECT n.nodeport FROM pg_dist_placement pl
                     JOIN pg_dist_node n ON n.groupid = pl.groupid
                     WHERE pl.shardid =
                           get_shard_id_for_distribution_column('comb.partitions', '{id}')"
                ),
            )
            .unwrap()
    };
    let lost_port = citus.workers()[1].port().to_string();
    let old_live = (1..OLD)
        .map(|p| format!("a{p}"))
        .find(|n| port(n) != lost_port)
        .expect("a partition on the live worker");
    let new_names: Vec<String> = (0..32).map(|p| format!("b{p}")).collect();
    let new_live = new_names
        .iter()
        .find(|n| port(n) != lost_port)
        .expect("a name on the live worker")
        .clone();
    let new_held = new_names
        .iter()
        .find(|n| port(n) == lost_port)
        .expect("a name on the stopped worker")
        .clone();
    let second = env.second_server().await;

    let worker = &citus.workers()[1];
    tokio::task::block_in_place(|| worker.stop("fast")).expect("the worker stops");

    let base = second.base_url();
    let push = |p: &str, n: i64| {
        env.http
            .post(format!("{base}/api/v1/push"))
            .json(&json!({"items": [{"queue": "lost", "partition": p, "payload": {"n": n}}]}))
    };
    let pop = |p: &str| {
        env.http.get(format!(
            "{base}/api/v1/pop/queue/lost/partition/{p}?batch=10"
        ))
    };
    let logs = || second.log_tail(60);
    for (p, want) in [(&old_live, vec![1, 2]), (&new_live, vec![2])] {
        let (status, _, body) = status_and_retry(push(p, 2)).await;
        assert_eq!(
            status,
            StatusCode::CREATED,
            "push to {p}: {body}\n{}",
            logs()
        );
        let (status, _, body) = status_and_retry(pop(p)).await;
        assert_eq!(status, StatusCode::OK, "pop of {p}: {body}\n{}", logs());
        assert_eq!(numbers(&body), want, "{p}");
    }
    let (status, retry, body) = status_and_retry(push(&new_held, 2)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(retry);
    drop(second);
    drop(env);
    drop(citus);
}

/// A push's partition lock, its heads' read and its insert on a worker are one transaction
/// of that worker: committed at once, so the next push of the partition, which waits for the
/// lock, reads a head that counts every message of the first. (Inserted over a second
/// connection of the worker, the insert can still be uncommitted, or prepared, when the lock
/// is released: the next push then takes the same positions.) A session on the partition's
/// worker holds its messages' shard in SHARE mode, so the push's insert waits there; the
/// worker's backend that waits must be the one holding the partition row's lock. Pushes with
/// transaction ids, of one partition and of partitions on both workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushs_lock_and_insert_are_one_transaction_on_the_worker() {
    let env = on_citus_quiet("citus_push_one_xact").await;
    let db = env.db_name.clone();
    let (a, b) = partitions_on_two_workers(&env).await;
    let port = workers_of(&db, std::slice::from_ref(&a)).remove(0);
    let worker = Citus::shared()
        .workers()
        .iter()
        .find(|w| w.port().to_string() == port)
        .expect("the partition's worker");
    let names = Citus::shared()
        .coordinator()
        .psql(
            &db,
            &format!(
                "SELECT 'comb.partitions_'
                     || get_shard_id_for_distribution_column('comb.partitions', p.id)
                     || ' comb.messages_'
                     || get_shard_id_for_distribution_column('comb.messages', p.id)
                 FROM comb.partitions p WHERE p.name = '{a}'"
            ),
        )
        .unwrap();
    let names: Vec<&str> = names.split(' ').collect();
    let (partitions, messages) = (names[0].to_string(), names[1].to_string());
    let (holder, conn) = tokio_postgres::connect(&worker.url(&db), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    holder
        .batch_execute("SET citus.enable_manual_changes_to_shards TO on")
        .await
        .unwrap();
    for (round, to) in [vec![a.clone()], vec![a.clone(), b.clone()]]
        .into_iter()
        .enumerate()
    {
        holder
            .batch_execute(&format!("BEGIN; LOCK TABLE {messages} IN SHARE MODE"))
            .await
            .unwrap();
        let items: Vec<Value> = to
            .iter()
            .map(|p| {
                json!({"queue": "q", "partition": p, "payload": {"round": round},
                       "transactionId": format!("one-xact-{round}-{p}")})
            })
            .collect();
        let push = env
            .http
            .post(env.url("/api/v1/push"))
            .json(&json!({ "items": items }))
            .send();
        let push = tokio::spawn(async move {
            let r = push.await.unwrap();
            (r.status(), r.text().await.unwrap())
        });
        let inserting: i32 = loop {
            let waiting = holder
                .query(
                    "SELECT pid FROM pg_locks
                     WHERE NOT granted AND relation = $1::text::regclass",
                    &[&messages],
                )
                .await
                .unwrap();
            if let Some(row) = waiting.first() {
                break row.get(0);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let lockers: Vec<i32> = holder
            .query(
                "SELECT pid FROM pg_locks
                 WHERE granted AND mode = 'RowShareLock' AND relation = $1::text::regclass",
                &[&partitions],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let all: Vec<String> = holder
            .query(
                "SELECT pid || ' ' || relation::regclass || ' ' || mode || ' ' || granted
                 FROM pg_locks WHERE relation::regclass::text LIKE 'comb.%' ORDER BY pid",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        holder.batch_execute("ROLLBACK").await.unwrap();
        let (status, body) = push.await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert!(
            lockers.contains(&inserting),
            "push to {to:?}: the insert (backend {inserting}) runs outside the worker's \
             transaction holding the partition's lock (backends {lockers:?}); locks: {all:#?}"
        );
    }
}

/// Lock requests waiting on `worker` for relations whose name starts with `name` (a table's
/// shell or shards; Citus hides shards from `pg_class`).
async fn waiting_for(worker: &tokio_postgres::Client, name: &str) -> i64 {
    worker
        .query_one(
            "SELECT count(*) FROM pg_locks l
             WHERE NOT l.granted AND l.relation::regclass::text LIKE $1 || '%'",
            &[&name],
        )
        .await
        .unwrap()
        .get(0)
}

/// Maintenance dropping an old generation of cursor state meets an ack in flight on the
/// partition's worker (a call of `comb.judge_acks`, delegated there, which reads the state,
/// then inserts the new version, when Citus locks every generation). Maintenance locks the
/// whole state table first, so the call waits for the drop (or the drop for the call) and
/// the ack succeeds. (Locked the old generation first, the drop waited on the worker for the
/// call's lock on the table while the call waited for the old generation, and the worker
/// cancelled the call: a failed ack.) A session on the worker holds maintenance's copy into
/// the newest generation (that generation's shard, in `SHARE` mode) until the call waits
/// too, then lets go: the drop follows within the worker's `deadlock_timeout` of the call's
/// wait, so a deadlock would be found by the call's own check and fall to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_dropped_while_an_ack_runs_on_its_worker_does_not_deadlock_with_it() {
    let env = on_citus_with(
        "citus_generation_drop",
        &[
            "--generation-seconds",
            "3600",
            "--maintenance-interval-ms",
            "200",
        ],
    )
    .await;
    let db = env.db_name.clone();
    env.push(json!([{"queue": "q", "partition": "p", "payload": {"n": 0}}]))
        .await;
    let first = env.pop("/api/v1/pop/queue/q/partition/p").await.unwrap();
    env.ack_all(&first, "completed", None).await;
    env.push(json!([{"queue": "q", "partition": "p", "payload": {"n": 1}}]))
        .await;
    let pop = env.pop("/api/v1/pop/queue/q/partition/p").await.unwrap();
    assert_eq!(numbers(&pop), vec![1]);
    let coordinator = Citus::shared().coordinator();
    let newest: i32 = coordinator
        .psql(&db, "SELECT max(gen) FROM comb.cursor_gens")
        .unwrap()
        .parse()
        .unwrap();
    let next = newest + 1;
    common::until("the next generation made ahead", || {
        let db = db.clone();
        async move {
            Citus::shared()
                .coordinator()
                .psql(
                    &db,
                    &format!(
                        "SELECT to_regclass('comb.cursor_states_{next}') IS NOT NULL
                            AND to_regclass('comb.stream_states_{next}') IS NOT NULL"
                    ),
                )
                .unwrap()
                == "t"
        }
    })
    .await;
    let port = workers_of(&db, &["p".to_string()]).remove(0);
    let worker = Citus::shared()
        .workers()
        .iter()
        .find(|w| w.port().to_string() == port)
        .expect("the partition's worker");
    let shard = coordinator
        .psql(
            &db,
            &format!(
                "SELECT 'comb.cursor_states_{next}_'
                     || get_shard_id_for_distribution_column('comb.cursor_states_{next}', p.id)
                 FROM comb.partitions p WHERE p.name = 'p'"
            ),
        )
        .unwrap();
    let (holder, conn) = tokio_postgres::connect(&worker.url(&db), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    holder
        .batch_execute("SET citus.enable_manual_changes_to_shards TO on")
        .await
        .unwrap();
    holder
        .batch_execute(&format!("BEGIN; LOCK TABLE {shard} IN SHARE MODE"))
        .await
        .unwrap();
    // Generation `next` takes over; maintenance's next cycle carries `newest` forward into
    // it, and waits for the session there.
    coordinator
        .psql(
            &db,
            &format!("INSERT INTO comb.cursor_gens (gen) VALUES ({next})"),
        )
        .unwrap();
    while waiting_for(&holder, &shard).await == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ack = env
        .http
        .post(env.url("/api/v1/ack/batch"))
        .json(&json!({"acknowledgments": [{
            "transactionId": pop["messages"][0]["transactionId"],
            "partitionId": pop["messages"][0]["partitionId"],
            "leaseId": pop["messages"][0]["leaseId"],
            "status": "completed",
        }]}))
        .send();
    let ack = tokio::spawn(async move {
        let r = ack.await.unwrap();
        (r.status(), r.text().await.unwrap())
    });
    // The call waits too (for the old generation, or for the whole table).
    while waiting_for(&holder, "comb.cursor_states").await < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    holder.batch_execute("ROLLBACK").await.unwrap();
    let (status, body) = ack.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body[0]["success"], true, "{body}");
    common::until("the old generation dropped", || {
        let db = db.clone();
        async move {
            Citus::shared()
                .coordinator()
                .psql(
                    &db,
                    &format!("SELECT count(*) FROM comb.cursor_gens WHERE gen = {newest}"),
                )
                .unwrap()
                == "0"
        }
    })
    .await;
    // The ack's version was carried forward: message 1 stays settled.
    env.push(json!([{"queue": "q", "partition": "p", "payload": {"n": 2}}]))
        .await;
    let after = env.pop("/api/v1/pop/queue/q/partition/p").await.unwrap();
    assert_eq!(numbers(&after), vec![2]);
}

/// Pops of retried messages (after a `failed` ack; `retryDelay` 0) of partitions on both
/// workers run no statement over several shards on any node and commit in one phase: the
/// retry's attempt count, the lease and the state all live in the cursor's state, read and
/// written by the partition's claim.
#[tokio::test]
async fn a_pop_of_a_retried_message_runs_no_multi_shard_statement() {
    let env = on_citus_quiet("citus_retried_pop").await;
    env.configure("q", json!({"retryLimit": 100, "retryDelay": 0}))
        .await;
    let names = partitions_over_both_workers(&env).await;
    // The group's first pop subscribes it and the server looks each name up once.
    for p in &names {
        let pop = env
            .pop(&format!("/api/v1/pop/queue/q/partition/{p}"))
            .await
            .unwrap();
        env.ack_ok(one(&pop), "failed", None, Some("again")).await;
    }
    let mut ran_multi = Vec::new();
    let before = two_phase_commits(&env.db_name);
    for round in 0..3 {
        for p in &names {
            let (m0, _) = executions(&env.db_name);
            let pop = env
                .pop(&format!("/api/v1/pop/queue/q/partition/{p}"))
                .await
                .unwrap_or_else(|| panic!("{p}: the failed message again"));
            let (m1, _) = executions(&env.db_name);
            if m1 > m0 {
                ran_multi.push(format!("{p} round {round}: {}", m1 - m0));
            }
            assert_eq!(numbers(&pop), vec![0], "{p}");
            assert_eq!(
                pop["messages"][0]["attempt"],
                json!(round + 2),
                "{p}: {pop}"
            );
            env.ack_ok(one(&pop), "failed", None, Some("again")).await;
        }
    }
    assert_eq!(
        ran_multi,
        Vec::<String>::new(),
        "pops of retried messages ran statements over several shards"
    );
    assert_eq!(
        two_phase_commits(&env.db_name) - before,
        0,
        "pops and failed acks of one partition committed in two phases"
    );
}
