//! Storage lifecycle: retention reclaims whole segment tables — never rows — and only what
//! every queue and every consumer group has let go of; `maxWaitTimeSeconds` dead-letters;
//! maintenance runs once per cluster; a drop that cannot get its lock gives way to traffic.

use std::time::{Duration, Instant};

use crate::common::{self, Env, PATIENCE, assert_ordered_read, eventually};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Fast segment turnover for tests: a new segment every second, maintenance every 200 ms.
const FAST: &[&str] = &["--segment-seconds", "1", "--maintenance-interval-ms", "200"];

fn segments(env: &Env) -> Vec<i32> {
    let s =
        env.sql("SELECT coalesce(string_agg(seg::text, ',' ORDER BY seg), '') FROM comb.segments");
    s.split(',')
        .filter(|x| !x.is_empty())
        .map(|x| x.parse().unwrap())
        .collect()
}

fn table_exists(env: &Env, seg: i32) -> bool {
    env.sql(&format!(
        "SELECT to_regclass('comb.messages_{seg}') IS NOT NULL"
    )) == "t"
}

/// The segment holding a queue's messages (they were pushed together).
fn segment_of(env: &Env, queue: &str) -> i32 {
    env.sql(&format!(
        "SELECT DISTINCT m.seg FROM comb.messages m JOIN comb.partitions p ON p.id = m.partition_id
         JOIN comb.queues q ON q.id = p.queue_id WHERE q.name = '{queue}'"
    ))
    .parse()
    .unwrap()
}

#[tokio::test]
async fn retention_drops_whole_segments_once_every_queue_in_them_allows() {
    let env = Env::start_with(FAST).await;
    env.push(json!([
        {"queue": "short", "payload": {"n": 1}},
        {"queue": "short", "payload": {"n": 2}},
    ]))
    .await;
    let seg = segment_of(&env, "short");
    // Retention is set once the segment is known, so it cannot be gone before.
    env.configure("short", json!({"retentionSeconds": 1})).await;
    // Expired messages are not handed out, even while their segment still exists.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(env.pop("/api/v1/pop/queue/short?batch=10").await.is_none());
    // The segment is rolled over, summarised and dropped as a whole table.
    eventually(PATIENCE, "segment dropped", || !table_exists(&env, seg)).await;
    assert!(!segments(&env).contains(&seg));
    // The segment's summary outlives it: it is now the partition's head.
    assert_eq!(
        env.sql(&format!(
            "SELECT max_pos FROM comb.segment_partitions WHERE seg = {seg}"
        )),
        "2"
    );
    // New messages still flow, after the position of the dropped ones (kept now, so that
    // they are still there when looked at).
    env.configure("short", json!({"retentionSeconds": 0})).await;
    env.push(json!([{"queue": "short", "payload": {"n": 3}}]))
        .await;
    assert_eq!(
        env.sql(
            "SELECT pos FROM comb.messages WHERE convert_from(payload, 'UTF8')::jsonb->>'n' = '3'"
        ),
        "3"
    );
    let pop = env.pop("/api/v1/pop/queue/short?batch=10").await.unwrap();
    assert_eq!(common::numbers(&pop), vec![3]);
    let dropped: i64 = env
        .sql("SELECT coalesce(sum(dropped), 0) FROM comb.maintenance_runs")
        .parse()
        .unwrap();
    assert!(dropped >= 1, "maintenance recorded its drops");
    // Segment tables made since carry exactly the parent's two indexes (an index that did
    // not match the parent's would have been added by ATTACH, a third one to write).
    let made: i64 = env
        .sql("SELECT coalesce(sum(created), 0) FROM comb.maintenance_runs")
        .parse()
        .unwrap();
    assert!(made >= 1, "maintenance made segment tables");
    assert_eq!(
        env.sql(
            "SELECT string_agg(DISTINCT n::text, ',') FROM ( \
               SELECT c.relname, count(i.indexrelid) AS n \
               FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid \
               LEFT JOIN pg_index i ON i.indrelid = c.oid \
               WHERE h.inhparent = 'comb.messages'::regclass GROUP BY c.relname) t"
        ),
        "2"
    );
    // One snapshot for both counts: maintenance keeps making tables meanwhile.
    assert_eq!(
        env.sql(
            "SELECT (SELECT count(*) FROM pg_indexes WHERE schemaname = 'comb' \
                     AND indexdef LIKE '%(transaction_id, partition_id)%') \
                  = (SELECT 1 + count(*) FROM pg_inherits \
                     WHERE inhparent = 'comb.messages'::regclass)"
        ),
        "t"
    ); // Every segment table, the first and those made since, tells the planner partitions are
    // deep (schema version 5).
    assert_eq!(
        env.partition_id_options("comb.messages"),
        "{n_distinct=100}"
    );
}

#[tokio::test]
async fn a_queue_that_keeps_its_messages_pins_the_segment() {
    let env = Env::start_with(FAST).await;
    env.configure("short", json!({"retentionSeconds": 1})).await;
    env.push(json!([
        {"queue": "short", "payload": {"n": 1}},
        {"queue": "keep", "payload": {"n": 10}},
        {"queue": "keep", "payload": {"n": 11}},
    ]))
    .await;
    let seg = segment_of(&env, "keep");
    assert_eq!(seg, segment_of(&env, "short"));
    // Wait until the segment is summarised and several drop decisions have been made.
    eventually(PATIENCE, "segment summarised", || {
        env.sql(&format!(
            "SELECT summarized FROM comb.segments WHERE seg = {seg}"
        )) == "t"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        table_exists(&env, seg),
        "`keep` has no retention: its segment stays"
    );
    // The queue with retention no longer hands out its expired message…
    assert!(env.pop("/api/v1/pop/queue/short").await.is_none());
    // …and the other queue still has everything.
    let pop = env.pop("/api/v1/pop/queue/keep?batch=10").await.unwrap();
    assert_eq!(common::numbers(&pop), vec![10, 11]);
}

#[tokio::test]
async fn completed_retention_waits_for_the_slowest_group() {
    let env = Env::start_with(FAST).await;
    env.configure("done", json!({"completedRetentionSeconds": 1}))
        .await;
    // Both groups exist before the messages arrive.
    for g in ["fast", "slow"] {
        assert!(
            env.pop(&format!("/api/v1/pop/queue/done?consumerGroup={g}"))
                .await
                .is_none()
        );
    }
    env.push(json!([
        {"queue": "done", "partition": "p", "payload": {"n": 1}},
        {"queue": "done", "partition": "p", "payload": {"n": 2}},
    ]))
    .await;
    let seg = segment_of(&env, "done");
    let fast = env
        .drain("/api/v1/pop/queue/done?consumerGroup=fast&autoAck=true&batch=10")
        .await;
    assert_eq!(fast.len(), 2);
    eventually(PATIENCE, "segment summarised", || {
        env.sql(&format!(
            "SELECT summarized FROM comb.segments WHERE seg = {seg}"
        )) == "t"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(
        table_exists(&env, seg),
        "the slow group has not read it: kept"
    );
    // The lagging group still gets every message.
    let slow = env
        .drain("/api/v1/pop/queue/done?consumerGroup=slow&autoAck=true&batch=10")
        .await;
    assert_eq!(slow.len(), 2);
    // Now every group has passed it: the whole table goes.
    eventually(PATIENCE, "segment dropped", || !table_exists(&env, seg)).await;
}

#[tokio::test]
async fn deleting_a_queue_frees_its_segments() {
    let env = Env::start_with(FAST).await;
    env.push(json!([{"queue": "gone", "payload": {"n": 1}}]))
        .await;
    let seg = segment_of(&env, "gone");
    assert_eq!(env.delete_queue("gone").await, StatusCode::OK);
    assert_eq!(env.delete_queue("gone").await, StatusCode::NOT_FOUND);
    assert_eq!(env.sql("SELECT count(*) FROM comb.partitions"), "0");
    eventually(PATIENCE, "segment dropped", || !table_exists(&env, seg)).await;
    // The name can be used again, for a new and empty queue.
    env.push(json!([{"queue": "gone", "payload": {"n": 2}}]))
        .await;
    let pop = env.pop("/api/v1/pop/queue/gone?batch=10").await.unwrap();
    assert_eq!(common::numbers(&pop), vec![2]);
}

/// Deleting a queue deletes, in its one transaction, what every owner holds of it: its
/// partitions, its cursors and its dead letters; another queue's stay.
#[tokio::test]
async fn deleting_a_queue_deletes_its_cursors_and_dead_letters() {
    let env = Env::start().await;
    for q in ["gone", "kept"] {
        env.push(json!([{"queue": q, "payload": {"n": 1}}])).await;
        let pop = env
            .pop(&format!("/api/v1/pop/queue/{q}?consumerGroup=g"))
            .await
            .unwrap();
        let r = env
            .ack_ok(common::one(&pop), "dlq", Some("g"), Some("no"))
            .await;
        assert_eq!(r["dlq"], true, "{r}");
    }
    let count = |table: &str| {
        env.sql(&format!(
            "SELECT count(*) FROM comb.{table} t JOIN comb.queues q ON q.id = t.queue_id
             WHERE q.name = 'kept'"
        ))
    };
    assert_eq!(env.sql("SELECT count(*) FROM comb.dead_letters"), "2");
    assert_eq!(env.sql("SELECT count(*) FROM comb.cursors"), "2");
    assert_eq!(env.delete_queue("gone").await, StatusCode::OK);
    assert_eq!(env.sql("SELECT count(*) FROM comb.dead_letters"), "1");
    assert_eq!(env.sql("SELECT count(*) FROM comb.cursors"), "1");
    assert_eq!(count("dead_letters"), "1");
    assert_eq!(count("cursors"), "1");
}

#[tokio::test]
async fn a_push_through_another_server_after_a_delete_lands_in_the_new_queue() {
    let env = Env::start().await;
    let other = env.second_server().await;
    let other_push = |n: i64| {
        let http = env.http.clone();
        let url = format!("{}/api/v1/push", other.base_url());
        async move {
            let r = http
                .post(url)
                .json(&json!({"items": [{"queue": "q", "partition": "p", "payload": {"n": n}}]}))
                .send()
                .await
                .unwrap();
            r.status()
        }
    };
    // The other server learns (and caches) the queue's ids.
    assert_eq!(other_push(1).await, StatusCode::CREATED);
    assert_eq!(env.delete_queue("q").await, StatusCode::OK);
    // Its next push goes to a new queue, not to the deleted partition.
    assert_eq!(other_push(2).await, StatusCode::CREATED);
    let pop = env.pop("/api/v1/pop/queue/q?batch=10").await.unwrap();
    assert_eq!(common::numbers(&pop), vec![2]);
}

/// A queue deleted behind the server's back (its cached ids stale, no broadcast) takes no
/// message into its deleted partition, whichever way a batch is stored: appended (one
/// message) or copied in (100). The push resolves the names again and lands in a new queue.
#[tokio::test]
async fn a_push_to_a_partition_deleted_unannounced_lands_in_a_new_one() {
    let env = Env::start().await;
    for (round, size) in [1usize, 100].into_iter().enumerate() {
        let queue = format!("stale{round}");
        let first = env
            .push(json!([{"queue": queue, "partition": "p", "payload": {"n": 0}}]))
            .await;
        let old = first[0]["partition_id"].as_str().unwrap().to_string();
        env.sql(&format!("DELETE FROM comb.queues WHERE name = '{queue}'"));
        let items: Vec<Value> = (1..=size)
            .map(|n| json!({"queue": queue, "partition": "p", "payload": {"n": n}}))
            .collect();
        let results = env.push(json!(items)).await;
        assert_eq!(results.len(), size);
        let new = results[0]["partition_id"].as_str().unwrap().to_string();
        assert_ne!(new, old, "stored into the deleted partition");
        assert!(
            results
                .iter()
                .all(|r| r["status"] == "queued" && r["partition_id"] == new.as_str()),
            "{results:?}"
        );
        assert_eq!(
            env.sql(&format!(
                "SELECT count(*) FILTER (WHERE partition_id = '{old}'), \
                        count(*) FILTER (WHERE partition_id = '{new}') FROM comb.messages"
            )),
            format!("1|{size}")
        );
    }
}

#[tokio::test]
async fn messages_pending_past_max_wait_are_dead_lettered() {
    let env = Env::start_with(&["--maintenance-interval-ms", "200"]).await;
    env.push(json!([
        {"queue": "slow", "partition": "p", "payload": {"n": 1}},
        {"queue": "slow", "partition": "p", "payload": {"n": 2}},
        {"queue": "slow", "partition": "p", "payload": {"n": 3}},
    ]))
    .await;
    // The group takes the first message and leaves the rest pending.
    let first = env
        .pop("/api/v1/pop/queue/slow?consumerGroup=g&autoAck=true")
        .await
        .unwrap();
    assert_eq!(common::numbers(&first), vec![1]);
    // The limit is set once the group has its message, so that one cannot be dead first.
    env.configure("slow", json!({"maxWaitTimeSeconds": 1}))
        .await;
    eventually(PATIENCE, "dead-lettered", || {
        env.sql("SELECT count(*) FROM comb.dead_letters WHERE consumer_group = 'g'") == "2"
    })
    .await;
    let errors = env.sql("SELECT DISTINCT error FROM comb.dead_letters");
    assert!(errors.contains("maxWaitTimeSeconds"), "{errors}");
    // The position moved on: nothing is left to deliver, and new messages are delivered.
    assert!(
        env.pop("/api/v1/pop/queue/slow?consumerGroup=g")
            .await
            .is_none()
    );
    // Off again, so that the next message waits for the pop below however slow it is.
    env.configure("slow", json!({"maxWaitTimeSeconds": 0}))
        .await;
    env.push(json!([{"queue": "slow", "partition": "p", "payload": {"n": 4}}]))
        .await;
    let pop = env
        .pop("/api/v1/pop/queue/slow?consumerGroup=g&autoAck=true")
        .await
        .unwrap();
    assert_eq!(common::numbers(&pop), vec![4]);
    // Messages are kept, not deleted.
    assert_eq!(env.message_count(), 4);
}

#[tokio::test]
async fn two_servers_run_maintenance_once() {
    let env = Env::start_with(FAST).await;
    let _other = env.second_server_with(FAST).await;
    eventually(PATIENCE, "several maintenance runs", || {
        env.sql("SELECT count(*) FROM comb.maintenance_runs")
            .parse::<i64>()
            .unwrap()
            >= 5
    })
    .await;
    assert_eq!(
        env.sql("SELECT count(DISTINCT server) FROM comb.maintenance_runs"),
        "1",
        "one leader at a time"
    );
    // Segments roll over exactly once per period: numbers are consecutive, none skipped.
    let segs = segments(&env);
    assert!(segs.windows(2).all(|w| w[1] == w[0] + 1), "{segs:?}");
}

#[tokio::test]
async fn a_drop_blocked_by_a_long_reader_does_not_stall_pushes() {
    let env = Env::start_with(FAST).await;
    env.push(json!([{"queue": "short", "payload": {"n": 1}}]))
        .await;
    let seg = segment_of(&env, "short");
    // A long reader holds a lock on the segment table, as a report or a backup would.
    let (reader, conn) = tokio_postgres::connect(&env.db_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    reader
        .batch_execute(&format!("BEGIN; SELECT count(*) FROM comb.messages_{seg};"))
        .await
        .unwrap();
    // Retention is set once the reader holds the segment, so it cannot be gone before.
    env.configure("short", json!({"retentionSeconds": 1})).await;
    // Only once that segment is closed may pushes go on, or they would share (and pin) it.
    eventually(PATIENCE, "segment closed", || {
        env.sql(&format!(
            "SELECT closed_at IS NOT NULL FROM comb.segments WHERE seg = {seg}"
        )) == "t"
    })
    .await;
    // While it holds the lock, maintenance wants to drop the segment and cannot; pushes
    // must go on (each answered within the client's 30 s timeout, where a push waiting for
    // the drop would wait as long as the reader holds it), until the drop has given way and
    // segments have rolled over meanwhile.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let started = Instant::now();
    let mut looked = Instant::now();
    let (mut pushed, mut retries, mut rolled) = (0, 0i64, 0i64);
    while pushed < 10 || retries < 1 || rolled < 4 {
        assert!(
            started.elapsed() < PATIENCE,
            "the drop never gave way ({retries} retries) or segments never rolled ({rolled})"
        );
        let r = http
            .post(env.url("/api/v1/push"))
            .json(&json!({"items": [{"queue": "busy", "payload": {"n": pushed}}]}))
            .send()
            .await
            .expect("push answered while the drop waits");
        assert_eq!(r.status(), StatusCode::CREATED);
        pushed += 1;
        if looked.elapsed() >= Duration::from_millis(250) {
            looked = Instant::now();
            let runs = env.sql(
                "SELECT coalesce(sum(drop_retries), 0) || '|' || coalesce(sum(rolled), 0) \
                 FROM comb.maintenance_runs",
            );
            let (r, s) = runs.split_once('|').unwrap();
            (retries, rolled) = (r.parse().unwrap(), s.parse().unwrap());
        }
    }
    assert!(table_exists(&env, seg), "the reader still holds it");
    reader.batch_execute("COMMIT").await.unwrap();
    eventually(PATIENCE, "dropped after the reader left", || {
        !table_exists(&env, seg)
    })
    .await;
    assert_eq!(env.sql("SELECT count(*) FROM comb.messages m JOIN comb.partitions p ON p.id = m.partition_id JOIN comb.queues q ON q.id = p.queue_id WHERE q.name = 'busy'"), pushed.to_string());
}

/// Maintenance keeps the statistics of the segment being written current (reads of a
/// partition in position order are planned from them), once enough of it changed.
#[tokio::test]
async fn maintenance_analyses_the_growing_segment() {
    let env = Env::start_with(&["--maintenance-interval-ms", "200"]).await;
    let current = || {
        env.sql(
            "SELECT coalesce(max(t.last_analyze)::text, 'never') FROM pg_stat_user_tables t \
             WHERE t.schemaname = 'comb' \
               AND t.relname = 'messages_' || (SELECT max(seg) FROM comb.segments)",
        )
    };
    env.push(json!([{"queue": "stats", "payload": {"n": 0}}]))
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(current(), "never", "analysed before 1,000 rows changed");
    for chunk in 0..3 {
        let items: Vec<serde_json::Value> = (0..500)
            .map(|n| json!({"queue": "stats", "payload": {"n": chunk * 500 + n}}))
            .collect();
        env.push(json!(items)).await;
    }
    eventually(PATIENCE, "newest segment analysed", || current() != "never").await;
    // From a small sample: 1,501 distinct positions give a histogram of 101 bounds at the
    // default statistics target, at most 11 at the sample maintenance takes.
    let bounds: usize = env
        .sql(
            "SELECT array_length(histogram_bounds::text::int8[], 1) FROM pg_stats \
             WHERE schemaname = 'comb' AND attname = 'pos' \
               AND tablename = 'messages_' || (SELECT max(seg) FROM comb.segments)",
        )
        .parse()
        .unwrap();
    assert!((2..=11).contains(&bounds), "{bounds} histogram bounds");
}

/// Statistics taken while a thousand partitions held one message each say every partition
/// holds one row. Read from such statistics, the newest position of a partition that has
/// since grown to 2,000 messages, and the next messages of a claim, must still be ordered
/// scans of the primary key that stop after the rows they return, not a read and sort of the
/// whole partition (which is what the planner does without schema version 5's setting).
#[tokio::test]
async fn reads_of_a_grown_partition_stay_ordered_under_old_statistics() {
    let env = Env::start().await;
    let wide: Vec<serde_json::Value> = (0..1000)
        .map(|n| json!({"queue": "wide", "partition": format!("p{n}"), "payload": {"n": n}}))
        .collect();
    env.push(json!(wide)).await;
    env.sql("ANALYZE comb.messages");
    for chunk in 0..4 {
        let deep: Vec<serde_json::Value> = (0..500)
            .map(|n| json!({"queue": "wide", "partition": "deep", "payload": {"n": chunk * 500 + n}}))
            .collect();
        env.push(json!(deep)).await;
    }
    let id = env.sql("SELECT id FROM comb.partitions WHERE name = 'deep'");
    let generic = "SET plan_cache_mode = force_generic_plan";
    let plan = |prepare: &str, execute: &str| {
        env.sql(&format!(
            "{prepare}; {generic}; \
             EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) EXECUTE {execute}"
        ))
    };
    let head = plan(
        "PREPARE head(uuid) AS SELECT m.pos FROM comb.messages m \
         WHERE m.partition_id = $1 AND m.seg >= 1 ORDER BY m.pos DESC LIMIT 1",
        &format!("head('{id}')"),
    );
    let next = plan(
        "PREPARE next(uuid, bigint, int) AS SELECT m.pos FROM comb.messages m \
         WHERE m.partition_id = $1 AND m.pos > $2 AND m.seg >= 1 ORDER BY m.pos LIMIT $3",
        &format!("next('{id}', 100, 50)"),
    );
    for (what, plan, rows) in [("newest position", head, 1), ("next messages", next, 50)] {
        assert_ordered_read(what, &plan, rows);
    }
}
