//! Queue totals and group lag in the listings: exact (computed at request time) for small
//! queues and for queues the per-minute snapshot does not hold yet, read from the snapshot for
//! queues beyond the request's budget of partitions, dated by `figuresAt`; a partition's own
//! figures always exact. And no listing reads message storage with a sequential scan.

use std::time::Duration;

use crate::common::{self, Env, eventually, get_url};
use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Partitions of the large queue: more than the listings compute at request time (1,000).
const WIDE: usize = 1_200;

/// Pushes one message into each of `WIDE` partitions of `queue`, and `extra` more into its
/// first partition.
async fn wide_queue(env: &Env, queue: &str, extra: usize) {
    let mut items: Vec<Value> = (0..WIDE)
        .map(|i| json!({"queue": queue, "partition": format!("p{i:04}"), "payload": {"n": i}}))
        .collect();
    items.extend(
        (0..extra).map(|i| json!({"queue": queue, "partition": "p0000", "payload": {"x": i}})),
    );
    env.push(json!(items)).await;
}

async fn ok(env: &Env, path: &str) -> Value {
    let (s, body) = env.get(path).await;
    assert_eq!(s, StatusCode::OK, "{path}: {body}");
    body
}

/// Every partition of `queue` with its figures and each group's lag there, page by page.
async fn all_partitions(env: &Env, queue: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for offset in (0..WIDE).step_by(1000) {
        let page = ok(
            env,
            &format!("/api/v1/resources/queues/{queue}?limit=1000&offset={offset}"),
        )
        .await;
        out.extend(page["partitionList"].as_array().unwrap().iter().cloned());
    }
    assert_eq!(out.len(), WIDE);
    out
}

fn sum(parts: &[Value], f: impl Fn(&Value) -> i64) -> i64 {
    parts.iter().map(f).sum()
}

/// Deletes every snapshot, so that the next minute's is taken at the next tick.
/// The database's clock, which stamps snapshots.
fn database_now(env: &Env) -> DateTime<Utc> {
    let text = env.sql(
        "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
    );
    text.parse().expect("a timestamp")
}

/// Whether figures were taken after `instant`, by more than the millisecond they are
/// rounded to.
fn taken_after(figures: &Value, instant: DateTime<Utc>) -> bool {
    figures["figuresAt"]
        .as_str()
        .and_then(|t| t.parse::<DateTime<Utc>>().ok())
        .is_some_and(|at| at > instant + chrono::Duration::milliseconds(1))
}

fn forget_snapshots(env: &Env) {
    env.sql("DELETE FROM comb.queue_minutes; DELETE FROM comb.group_minutes");
}

async fn queue_entry(env: &Env, name: &str) -> Value {
    let list = ok(env, "/api/v1/resources/queues").await;
    list["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} not listed: {list}"))
}

#[tokio::test]
async fn a_new_large_queue_has_exact_figures_before_the_first_snapshot() {
    // The default interval writes the first snapshot a minute after start: none here.
    let env = Env::start().await;
    wide_queue(&env, "big", 5).await;
    let big = queue_entry(&env, "big").await;
    assert_eq!(big["partitions"], WIDE, "{big}");
    assert_eq!(big["messages"]["total"], WIDE + 5);
    assert_eq!(big["messages"]["pending"], WIDE + 5);
    assert_eq!(big["figuresLive"], true);
    assert!(big["figuresAgeSeconds"].as_f64().unwrap() < 1.0, "{big}");
    let overview = ok(&env, "/api/v1/resources/overview").await;
    assert_eq!(overview["messages"]["total"], WIDE + 5);
    assert!(overview["figuresAt"].is_string(), "{overview}");
    assert_eq!(env.sql("SELECT count(*) FROM comb.queue_minutes"), "0");
}

#[tokio::test]
async fn large_queue_totals_come_from_the_snapshot_and_agree_with_every_partition() {
    let env = Env::start_with(&["--stats-interval-ms", "200"]).await;
    wide_queue(&env, "big", 3).await;
    env.push(json!([{"queue": "small", "payload": {"n": 1}}]))
        .await;
    // Groups g and h read the queue from its start; g reads four messages and holds their
    // lease.
    for group in ["g", "h"] {
        let (s, body) = env
            .post(
                &format!("/api/v1/consumer-groups/{group}/queues/big/seek"),
                &json!({"toStart": true}),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{body}");
    }
    let pop = env
        .pop("/api/v1/pop/queue/big/partition/p0000?batch=4&consumerGroup=g")
        .await
        .expect("messages");
    assert_eq!(pop["messages"].as_array().unwrap().len(), 4);

    // The next snapshot is taken after everything above: one begun before the pop may still
    // be written after the forgetting, so its time must be later than the pop's.
    let popped_at = database_now(&env);
    forget_snapshots(&env);
    let mut big = Value::Null;
    for _ in 0..600 {
        big = queue_entry(&env, "big").await;
        if big["figuresLive"] == false && taken_after(&big, popped_at) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        big["figuresLive"], false,
        "never served from a snapshot: {big}"
    );
    assert!(big["figuresAt"].is_string(), "{big}");
    assert!(big["figuresAgeSeconds"].as_f64().unwrap() >= 0.0);
    let small = queue_entry(&env, "small").await;
    assert_eq!(small["figuresLive"], true, "{small}");
    assert_eq!(small["messages"]["total"], 1);

    // The snapshot's totals are the sums of the exact per-partition figures.
    let parts = all_partitions(&env, "big").await;
    let total = sum(&parts, |p| p["messages"]["total"].as_i64().unwrap());
    let pending = sum(&parts, |p| p["messages"]["pending"].as_i64().unwrap());
    let processing = sum(&parts, |p| p["messages"]["processing"].as_i64().unwrap());
    assert_eq!(total, (WIDE + 3) as i64);
    assert_eq!(processing, 4);
    assert_eq!(big["partitions"], WIDE);
    assert_eq!(big["messages"]["total"], total, "{big}");
    assert_eq!(big["messages"]["pending"], pending, "{big}");
    assert_eq!(big["messages"]["processing"], processing, "{big}");
    let oldest = parts
        .iter()
        .filter_map(|p| p["oldestPendingAt"].as_str())
        .min()
        .unwrap();
    assert_eq!(big["oldestPendingAt"], oldest, "{big}");
    let detail = ok(&env, "/api/v1/resources/queues/big").await;
    assert_eq!(detail["messages"]["total"], total);
    assert_eq!(detail["figuresLive"], false);

    // Each group's lag on the queue: the sum of its lag on every partition.
    let lag_of = |group: &str| {
        sum(&parts, |p| {
            p["groupLag"]
                .as_array()
                .unwrap()
                .iter()
                .find(|g| g["consumerGroup"] == group)
                .map_or(0, |g| g["lag"].as_i64().unwrap())
        })
    };
    assert_eq!(lag_of("h"), (WIDE + 3) as i64);
    assert_eq!(lag_of("g"), (WIDE + 3) as i64);
    let groups = ok(&env, "/api/v1/consumer-groups").await;
    for name in ["g", "h"] {
        let g = groups
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["name"] == name)
            .unwrap_or_else(|| panic!("{name} not listed: {groups}"));
        let q = &g["queues"][0];
        assert_eq!(q["queue"], "big");
        assert_eq!(q["lag"], lag_of(name), "{g}");
        assert_eq!(q["partitions"], WIDE);
        assert!(q["figuresAt"].is_string(), "{g}");
    }
    let g = &groups
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "g")
        .unwrap()["queues"][0];
    assert_eq!(g["leasedPartitions"], 1, "{g}");
    let status = ok(&env, "/api/v1/status").await;
    assert_eq!(status["leases"]["active"], 1, "{status}");

    // Lagging: a pair served from the snapshot is listed once, for the whole queue.
    let lagging = ok(&env, "/api/v1/consumer-groups/lagging?minLagSeconds=0").await;
    let rows: Vec<&Value> = lagging
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["queue"] == "big")
        .collect();
    assert_eq!(rows.len(), 2, "{lagging}");
    assert!(
        rows.iter()
            .all(|r| r["partition"].is_null() && r["partitions"] == WIDE)
    );

    // /metrics serves the same figures.
    let metrics = env.metrics_text().await;
    let depth = format!(
        "comb_queue_depth_messages{{queue=\"big\"}} {}\n",
        pending + processing
    );
    assert!(metrics.contains(&depth), "{depth} not in:\n{metrics}");

    // A push after the snapshot: the partition's own figures show it at once, the queue's
    // totals with the next snapshot.
    env.push(json!([{"queue": "big", "partition": "p0001", "payload": {"late": true}}]))
        .await;
    let page = ok(&env, "/api/v1/resources/queues/big?limit=2").await;
    assert_eq!(page["partitionList"][1]["messages"]["total"], 2, "{page}");
    forget_snapshots(&env);
    let mut last = Value::Null;
    for _ in 0..600 {
        last = ok(&env, "/api/v1/resources/queues/big?limit=1").await;
        if last["figuresLive"] == false && last["messages"]["total"] == total + 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(last["figuresLive"], false, "{last}");
    assert_eq!(
        last["messages"]["total"],
        total + 1,
        "the next snapshot counts the push"
    );
}

/// Leaves of `comb.messages` (the segment tables) as plans name them.
fn message_leaves(env: &Env) -> Vec<String> {
    env.sql(
        "SELECT string_agg(c.relname, ',') FROM pg_inherits i
         JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'comb.messages'::regclass",
    )
    .split(',')
    .map(str::to_string)
    .collect()
}

/// Sequential scans of message storage that read rows, in `plans` (auto_explain's text
/// output): each scan line with what it returned and what its filter removed.
fn sequential_reads(plans: &str, leaves: &[String]) -> Vec<String> {
    let lines: Vec<&str> = plans.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.split("Seq Scan on ").nth(1) else {
            continue;
        };
        let table = rest.split([' ', '(']).next().unwrap_or_default();
        if !leaves.iter().any(|l| l == table) {
            continue;
        }
        let number = |s: &str, key: &str| -> u64 {
            s.split(key)
                .nth(1)
                .and_then(|r| r.split([' ', ')']).next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        let returned = number(line, "actual rows=");
        let removed: u64 = lines[i + 1..]
            .iter()
            .take_while(|l| !l.contains("->") && !l.contains("Query Text"))
            .map(|l| number(l, "Rows Removed by Filter: "))
            .sum();
        if returned + removed > 0 {
            found.push(line.trim().to_string());
        }
    }
    found
}

#[tokio::test]
async fn no_listing_reads_message_storage_with_a_sequential_scan() {
    let env = Env::start_with(&["--stats-interval-ms", "200"]).await;
    wide_queue(&env, "big", 0).await;
    // Depth in one partition, so that the planner sees a segment worth indexing.
    for chunk in 0..5 {
        let items: Vec<Value> = (0..1000)
            .map(|i| json!({"queue": "big", "partition": "p0000", "payload": {"n": chunk * 1000 + i}}))
            .collect();
        env.push(json!(items)).await;
    }
    env.push(json!([{"queue": "small", "payload": {"n": 1}}]))
        .await;
    env.pop("/api/v1/pop/queue/big?batch=10")
        .await
        .expect("messages");
    let (s, body) = env
        .post(
            "/api/v1/consumer-groups/g/queues/big/seek",
            &json!({"toStart": true}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    env.pop("/api/v1/pop/queue/small?batch=1")
        .await
        .expect("a message");
    env.sql("ANALYZE");
    let leaves = message_leaves(&env);

    // Every session a server opens from now on logs the plan of every statement it runs,
    // nested ones (inside SQL functions) included, with the rows each node read.
    let db = &env.db_name;
    env.sql(&format!(
        "ALTER DATABASE \"{db}\" SET session_preload_libraries = 'auto_explain';
         ALTER DATABASE \"{db}\" SET auto_explain.log_min_duration = 0;
         ALTER DATABASE \"{db}\" SET auto_explain.log_nested_statements = on;
         ALTER DATABASE \"{db}\" SET auto_explain.log_analyze = on;
         ALTER DATABASE \"{db}\" SET auto_explain.log_timing = off"
    ));
    let log = std::path::PathBuf::from(env.sql("SHOW data_directory")).join("postgres.log");
    let start = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let server = env.second_server().await;
    let base = server.base_url();

    // Both with figures computed now (no snapshot yet) and served from a snapshot.
    let routes = [
        "/api/v1/resources/overview",
        "/api/v1/resources/queues",
        "/api/v1/resources/queues/big",
        "/api/v1/resources/queues/big?limit=1000&offset=1000",
        "/api/v1/resources/partitions?limit=100",
        "/api/v1/resources/partitions?queue=big&limit=1000&offset=200",
        "/api/v1/resources/namespaces",
        "/api/v1/resources/tasks",
        "/api/v1/consumer-groups",
        "/api/v1/consumer-groups/g",
        "/api/v1/consumer-groups/lagging?minLagSeconds=0",
        "/api/v1/status",
        "/api/v1/status/queues",
        "/api/v1/status/queues/big",
        "/metrics",
        "/",
        "/queues",
        "/queues/big",
        "/groups",
    ];
    let fetch_all = || async {
        for route in routes {
            let r = env.http.get(format!("{base}{route}")).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{route}");
        }
    };
    fetch_all().await;
    forget_snapshots(&env);
    eventually(common::PATIENCE, "a snapshot", || {
        env.sql("SELECT count(*) FROM comb.group_minutes") != "0"
    })
    .await;
    fetch_all().await;
    let (_, big) = get_url(&env.http, &format!("{base}/api/v1/resources/queues/big")).await;
    assert_eq!(big["figuresLive"], false, "{big}");

    let bytes = std::fs::read(&log).expect("the cluster's log");
    let plans = String::from_utf8_lossy(&bytes[start as usize..]).to_string();
    // The log holds the nested statements' plans: the probes of message storage by index.
    assert!(
        leaves.iter().any(|l| plans.contains(&format!(" on {l} "))),
        "no plan touching {leaves:?} was logged"
    );
    let seq = sequential_reads(&plans, &leaves);
    assert!(
        seq.is_empty(),
        "sequential scans of message storage:\n{}",
        seq.join("\n")
    );
}

#[test]
fn a_sequential_scan_that_read_a_segment_is_found() {
    let leaves = vec!["messages_1".to_string(), "messages_2".to_string()];
    let plans = "LOG:  duration: 0.050 ms  plan:
\tQuery Text: SELECT 1
\tAppend  (actual rows=0 loops=1)
\t  ->  Seq Scan on messages_1 m  (cost=0.00..1.01 rows=1 width=8) (actual rows=0 loops=1)
\t        Filter: (partition_id = $1)
\t        Rows Removed by Filter: 42
\t  ->  Seq Scan on messages_2 m_1  (cost=0.00..1.01 rows=1 width=8) (actual rows=0 loops=1)
\t        Filter: (partition_id = $1)
\t  ->  Index Scan Backward using messages_1_pkey on messages_1 m  (actual rows=1 loops=1)
\t  ->  Seq Scan on cursors c  (actual rows=7 loops=1)
";
    let found = sequential_reads(plans, &leaves);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("messages_1 m "), "{found:?}");
}
