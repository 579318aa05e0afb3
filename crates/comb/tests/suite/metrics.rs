//! `GET /metrics`: valid Prometheus text, message counters that match what this server
//! answered, maintenance counters that match what the leader recorded in the database, and
//! a leader gauge set on exactly one of the servers sharing a database.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::common::{self, Env, PATIENCE, until};
use comb_harness::{Postgres, Server};
use reqwest::StatusCode;
use serde_json::json;

/// Fast segment turnover: a new segment every second, maintenance every 200 ms.
const FAST: &[&str] = &["--segment-seconds", "1", "--maintenance-interval-ms", "200"];

/// Samples by name (with labels, as written), after checking the text is well formed: every
/// sample follows the `# HELP` and `# TYPE` of its family, each family appears once, names are
/// `comb_*`, counters end in `_total` and values are numbers.
fn parse(text: &str) -> BTreeMap<String, f64> {
    let mut help = BTreeSet::new();
    let mut kinds: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = BTreeMap::new();
    let mut current = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').expect("HELP has a text");
            assert!(!text.is_empty(), "{line}");
            assert!(help.insert(name.to_string()), "HELP twice: {line}");
            current = name.to_string();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE has a kind");
            assert_eq!(name, current, "TYPE right after its HELP: {line}");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            assert!(
                kinds.insert(name.into(), kind.into()).is_none(),
                "TYPE twice: {line}"
            );
            if kind == "counter" {
                assert!(name.ends_with("_total"), "{line}");
            }
        } else {
            assert!(!line.starts_with('#') && !line.is_empty(), "{line:?}");
            let (series, value) = line.rsplit_once(' ').expect("sample has a value");
            let sample = series.split('{').next().unwrap();
            // A histogram's samples are its buckets, sum and count.
            let name = match kinds.get(&current).map(String::as_str) {
                Some("histogram") => ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| sample.strip_suffix(suffix))
                    .unwrap_or(sample),
                _ => sample,
            };
            assert_eq!(name, current, "sample under its own family: {line}");
            assert!(kinds.contains_key(name), "sample before TYPE: {line}");
            assert!(name.starts_with("comb_"), "{line}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{line}"
            );
            if let Some(labels) = series.strip_prefix(sample) {
                assert!(
                    labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')),
                    "{line}"
                );
            }
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("{line}"));
            assert!(
                samples.insert(series.to_string(), value).is_none(),
                "{line}"
            );
        }
    }
    for name in kinds.keys() {
        assert!(
            samples.keys().any(|s| {
                let sample = s.split('{').next().unwrap();
                sample == name || sample == format!("{name}_count")
            }),
            "family {name} without samples"
        );
    }
    samples
}

async fn scrape(http: &reqwest::Client, base_url: &str) -> BTreeMap<String, f64> {
    let r = http
        .get(format!("{base_url}/metrics"))
        .send()
        .await
        .expect("scrape");
    assert_eq!(r.status(), StatusCode::OK);
    let ct = r.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    parse(&r.text().await.unwrap())
}

fn get(m: &BTreeMap<String, f64>, series: &str) -> f64 {
    *m.get(series)
        .unwrap_or_else(|| panic!("no {series} in {m:#?}"))
}

/// The series of a request duration histogram for one route, `part` being `bucket` (with
/// its `le`), `sum` or `count`.
fn duration(method: &str, route: &str, part: &str, le: Option<&str>) -> String {
    let le = le.map(|le| format!(",le=\"{le}\"")).unwrap_or_default();
    format!(
        "comb_http_request_duration_seconds_{part}{{method=\"{method}\",route=\"{route}\"{le}}}"
    )
}

#[tokio::test]
async fn request_durations_are_recorded_by_route() {
    let env = Env::start().await;
    let base = env.server.base_url();
    for n in 0..3 {
        env.push(json!([{"queue": "d", "payload": {"n": n}}])).await;
    }
    // A long poll of an empty queue waits its whole timeout before answering.
    let waited = env
        .http
        .get(format!(
            "{base}/api/v1/pop/queue/d?consumerGroup=g&subscriptionMode=new&wait=true&timeout=300"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(waited.status(), StatusCode::NO_CONTENT);
    let m = scrape(&env.http, &base).await;

    let push = "/api/v1/push";
    assert_eq!(get(&m, &duration("POST", push, "count", None)), 3.0);
    assert_eq!(
        get(&m, &duration("POST", push, "bucket", Some("+Inf"))),
        3.0
    );
    assert!(get(&m, &duration("POST", push, "sum", None)) > 0.0);
    let pop = "/api/v1/pop/queue/{queue}";
    assert_eq!(get(&m, &duration("GET", pop, "count", None)), 1.0);
    assert_eq!(get(&m, &duration("GET", pop, "bucket", Some("0.25"))), 0.0);
    assert_eq!(get(&m, &duration("GET", pop, "bucket", Some("+Inf"))), 1.0);
    assert!(get(&m, &duration("GET", pop, "sum", None)) >= 0.3);
    assert_eq!(
        get(&m, &duration("POST", "/api/v1/ack", "count", None)),
        0.0
    );
    // Buckets are cumulative.
    let bounds = [
        "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1",
        "2.5", "5", "10", "30", "+Inf",
    ];
    for (method, route) in [("POST", push), ("GET", pop)] {
        let counts: Vec<f64> = bounds
            .iter()
            .map(|le| get(&m, &duration(method, route, "bucket", Some(le))))
            .collect();
        assert!(
            counts.windows(2).all(|w| w[0] <= w[1]),
            "{route}: {counts:?}"
        );
    }
}

/// A series of the fused stage histograms (`wait` or `batch`) for one kind of request.
fn stage(family: &str, kind: &str, part: &str) -> String {
    format!("comb_fused_{family}_seconds_{part}{{kind=\"{kind}\"}}")
}

#[tokio::test]
async fn fused_requests_record_their_wait_and_their_batch() {
    let env = Env::start().await;
    let base = env.server.base_url();
    let before = scrape(&env.http, &base).await;
    for kind in ["push", "pop", "ack"] {
        assert_eq!(get(&before, &stage("wait", kind, "count")), 0.0, "{kind}");
        assert_eq!(get(&before, &stage("batch", kind, "count")), 0.0, "{kind}");
    }

    // One at a time, each push is a batch of its own.
    for n in 0..3 {
        env.push(json!([{"queue": "f", "partition": "p", "payload": {"n": n}}]))
            .await;
    }
    let one_by_one = scrape(&env.http, &base).await;
    assert_eq!(get(&one_by_one, &stage("wait", "push", "count")), 3.0);
    assert_eq!(get(&one_by_one, &stage("batch", "push", "count")), 3.0);

    // Sent together, 40 pushes are each counted once as waiting; batches never outnumber them.
    let bodies: Vec<_> = (0..40)
        .map(|n| json!({"items": [{"queue": "f", "partition": format!("q{n}"), "payload": n}]}))
        .collect();
    let pushes = bodies.iter().map(|b| env.post("/api/v1/push", b));
    for (s, _) in futures_util::future::join_all(pushes).await {
        assert_eq!(s, StatusCode::CREATED);
    }
    let together = scrape(&env.http, &base).await;
    assert_eq!(get(&together, &stage("wait", "push", "count")), 43.0);
    let batches = get(&together, &stage("batch", "push", "count"));
    assert!((4.0..=43.0).contains(&batches), "{batches}");
    assert!(get(&together, &stage("batch", "push", "sum")) > 0.0);

    let pop = env
        .pop("/api/v1/pop/queue/f/partition/p?batch=3")
        .await
        .expect("messages");
    env.ack_all(&pop, "completed", None).await;
    let consumed = scrape(&env.http, &base).await;
    for kind in ["pop", "ack"] {
        assert_eq!(get(&consumed, &stage("wait", kind, "count")), 1.0, "{kind}");
        assert_eq!(
            get(&consumed, &stage("batch", kind, "count")),
            1.0,
            "{kind}"
        );
        let all = format!("comb_fused_wait_seconds_bucket{{kind=\"{kind}\",le=\"+Inf\"}}");
        assert_eq!(get(&consumed, &all), 1.0, "{kind}");
    }
}

#[tokio::test]
async fn message_counters_count_what_this_server_answered() {
    let env = Env::start_with(&["--push-workers", "2"]).await;
    let base = env.server.base_url();
    let before = scrape(&env.http, &base).await;
    for name in [
        "comb_messages_pushed_total",
        "comb_messages_push_duplicates_total",
        "comb_messages_popped_total",
        "comb_messages_acked_total",
        "comb_messages_failed_total",
        "comb_messages_retried_total",
        "comb_messages_dead_lettered_total",
    ] {
        assert_eq!(get(&before, name), 0.0, "{name}");
    }
    // Pool size is the workers' connections plus admin ones: 2 push + 4 pop + 1 ack + 4.
    assert_eq!(get(&before, "comb_db_pool_max_connections"), 11.0);

    env.push(json!([
        {"queue": "m", "partition": "p", "payload": {"n": 1}, "transactionId": "t1"},
        {"queue": "m", "partition": "p", "payload": {"n": 2}, "transactionId": "t2"},
        {"queue": "m", "partition": "p", "payload": {"n": 3}, "transactionId": "t3"},
        {"queue": "m", "partition": "p", "payload": {"n": 4}, "transactionId": "t4"},
    ]))
    .await;
    let again = env
        .push(json!([
            {"queue": "m", "partition": "p", "payload": {"n": 1}, "transactionId": "t1"},
            {"queue": "m", "partition": "p2", "payload": {"n": 5}, "transactionId": "t5"},
        ]))
        .await;
    assert_eq!(again[0]["status"], "duplicate");
    // A refused push counts nothing.
    let (s, _) = env
        .post(
            "/api/v1/push",
            &json!({"items": [{"queue": "", "payload": 1}]}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);

    let pushed = scrape(&env.http, &base).await;
    assert_eq!(get(&pushed, "comb_queue_stats_success"), 1.0);
    assert_eq!(get(&pushed, "comb_queue_depth_messages{queue=\"m\"}"), 5.0);
    assert!(
        !pushed
            .keys()
            .any(|k| k.starts_with("comb_group_lag_messages")),
        "no group has popped yet"
    );

    let pop = env
        .pop("/api/v1/pop/queue/m/partition/p?batch=4")
        .await
        .expect("messages");
    let messages = pop["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 4);
    let statuses = ["completed", "failed", "retry", "dlq"];
    let acks: Vec<_> = messages
        .iter()
        .zip(statuses)
        .map(|(m, status)| {
            json!({
                "transactionId": m["transactionId"],
                "partitionId": m["partitionId"],
                "leaseId": m["leaseId"],
                "status": status,
            })
        })
        .collect();
    let (s, body) = env
        .post("/api/v1/ack/batch", &json!({ "acknowledgments": acks }))
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert!(
        body.as_array()
            .unwrap()
            .iter()
            .all(|a| a["success"] == true),
        "{body}"
    );
    // A refused ack (nothing was delivered under that id) counts nothing.
    let (s, _) = env
        .ack(
            &json!({"transactionId": "nope", "partitionId": messages[0]["partitionId"],
                    "leaseId": null}),
            "completed",
            None,
            None,
        )
        .await;
    assert!(s.is_client_error(), "{s}");
    // The fifth message, in another partition, auto-acked by its pop: one more popped.
    let rest = env
        .drain("/api/v1/pop/queue/m/partition/p2?batch=10&autoAck=true")
        .await;
    assert_eq!(rest.len(), 1, "{rest:?}");

    let after = scrape(&env.http, &base).await;
    let expect = [
        ("comb_messages_pushed_total", 5.0),
        ("comb_messages_push_duplicates_total", 1.0),
        ("comb_messages_popped_total", 5.0),
        ("comb_messages_acked_total", 1.0),
        ("comb_messages_failed_total", 1.0),
        ("comb_messages_retried_total", 1.0),
        ("comb_messages_dead_lettered_total", 1.0),
    ];
    for (name, value) in expect {
        assert_eq!(get(&after, name), value, "{name}");
    }
    // In partition p the first is completed, the fourth dead-lettered, the second and third
    // wait for a retry: 2 unsettled, 3 not yet passed. Partition p2 is done.
    assert_eq!(
        get(
            &after,
            "comb_group_lag_messages{queue=\"m\",group=\"__QUEUE_MODE__\"}"
        ),
        2.0
    );
    assert_eq!(get(&after, "comb_queue_depth_messages{queue=\"m\"}"), 3.0);
    assert_eq!(
        env.sql("SELECT count(*) FROM comb.dead_letters"),
        "1",
        "the counter agrees with the table"
    );
    let idle = get(&after, "comb_db_pool_connections{state=\"idle\"}");
    let in_use = get(&after, "comb_db_pool_connections{state=\"in_use\"}");
    assert!(idle >= 1.0 && idle + in_use <= 11.0, "{idle} {in_use}");

    // What a transaction commits counts like a push and an ack.
    env.push(json!([{"queue": "t", "payload": {"n": 6}}])).await;
    let pop = env.pop("/api/v1/pop/queue/t").await.expect("a message");
    let m = &pop["messages"][0];
    let (s, body) = env
        .post(
            "/api/v1/transaction",
            &json!({"operations": [
                {"type": "ack", "transactionId": m["transactionId"],
                 "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                 "status": "completed"},
                {"type": "push", "items": [{"queue": "out", "payload": {"n": 7}}]},
            ]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let tx = scrape(&env.http, &base).await;
    assert_eq!(get(&tx, "comb_messages_pushed_total"), 7.0);
    assert_eq!(get(&tx, "comb_messages_popped_total"), 6.0);
    assert_eq!(get(&tx, "comb_messages_acked_total"), 2.0);
}

/// Sums of `comb.maintenance_runs` columns, as recorded by the leader.
fn recorded(env: &Env) -> BTreeMap<&'static str, f64> {
    let columns = [
        ("comb_maintenance_segments_created_total", "created"),
        ("comb_maintenance_segments_rolled_total", "rolled"),
        ("comb_maintenance_segments_summarized_total", "summarized"),
        ("comb_maintenance_segments_dropped_total", "dropped"),
        ("comb_maintenance_drop_retries_total", "drop_retries"),
        ("comb_maintenance_dead_lettered_total", "dead_lettered"),
        (
            "comb_maintenance_generations_created_total",
            "generations_created",
        ),
        (
            "comb_maintenance_generations_dropped_total",
            "generations_dropped",
        ),
        ("comb_maintenance_states_carried_total", "states_carried"),
    ];
    let select: Vec<String> = columns
        .iter()
        .map(|(_, c)| format!("coalesce(sum({c}), 0)"))
        .collect();
    let row = env.sql(&format!(
        "SELECT {} FROM comb.maintenance_runs",
        select.join(", ")
    ));
    columns
        .iter()
        .zip(row.split('|'))
        .map(|((metric, _), v)| (*metric, v.parse().unwrap()))
        .collect()
}

#[tokio::test]
async fn maintenance_counters_match_what_the_leader_recorded() {
    let env = Env::start_with(FAST).await;
    let base = env.server.base_url();
    env.push(json!([
        {"queue": "short", "payload": {"n": 1}},
        {"queue": "short", "payload": {"n": 2}},
    ]))
    .await;
    let seg: i32 = env
        .sql("SELECT DISTINCT seg FROM comb.messages")
        .parse()
        .unwrap();
    // Retention is set once the segment is known, so it cannot be gone before.
    env.configure("short", json!({"retentionSeconds": 1})).await;
    // Wait until retention dropped the segment holding those messages.
    until("segment dropped", || async {
        env.sql(&format!(
            "SELECT to_regclass('comb.messages_{seg}') IS NULL"
        )) == "t"
    })
    .await;
    // The drop is counted once its cycle ends.
    until("the drop counted", || async {
        get(
            &scrape(&env.http, &base).await,
            "comb_maintenance_segments_dropped_total",
        ) >= 1.0
    })
    .await;

    let first = scrape(&env.http, &base).await;
    assert_eq!(get(&first, "comb_maintenance_leader"), 1.0);
    assert_eq!(get(&first, "comb_maintenance_failures_total"), 0.0);
    let cycles = get(&first, "comb_maintenance_cycles_total");
    assert!(cycles >= 2.0, "{cycles}");
    let took = get(&first, "comb_maintenance_cycle_seconds");
    assert!(took > 0.0 && took < 10.0, "{took}");
    assert!(get(&first, "comb_maintenance_generations_created_total") >= 1.0);

    // Every counter equals the sums the leader wrote to `comb.maintenance_runs`. A cycle is
    // counted just before its row is written, so look until a scrape falls between cycles.
    let start = Instant::now();
    loop {
        let db_before = recorded(&env);
        let m = scrape(&env.http, &base).await;
        let db_after = recorded(&env);
        let ours: BTreeMap<&str, f64> = db_before.keys().map(|k| (*k, get(&m, k))).collect();
        if db_before == db_after && ours == db_before {
            break;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "counters never matched the runs table: ours {ours:?}, recorded {db_after:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Cycles go on, and are counted.
    until("more cycles", || async {
        get(
            &scrape(&env.http, &base).await,
            "comb_maintenance_cycles_total",
        ) >= cycles + 3.0
    })
    .await;
}

#[tokio::test]
async fn one_leader_among_servers_sharing_a_database_and_a_successor_when_it_dies() {
    let mut env = Env::start_with(FAST).await;
    let mut other = env.second_server_with(FAST).await;
    let a = env.server.base_url();
    let b = other.base_url();
    // Wait until some server has completed a few cycles as leader.
    until("a leader at work", || async {
        let ma = scrape(&env.http, &a).await;
        let mb = scrape(&env.http, &b).await;
        get(&ma, "comb_maintenance_cycles_total") + get(&mb, "comb_maintenance_cycles_total") >= 3.0
    })
    .await;
    let ma = scrape(&env.http, &a).await;
    let mb = scrape(&env.http, &b).await;
    let leaders = [&ma, &mb].map(|m| get(m, "comb_maintenance_leader"));
    assert_eq!(
        leaders.iter().sum::<f64>(),
        1.0,
        "exactly one leader: {leaders:?}"
    );
    let (follower, leader_is_a) = if leaders[0] == 1.0 {
        (&mb, true)
    } else {
        (&ma, false)
    };
    for (series, value) in follower
        .iter()
        .filter(|(s, _)| s.starts_with("comb_maintenance_"))
    {
        assert_eq!(*value, 0.0, "the follower did no maintenance: {series}");
    }

    // Pushes are counted where they were answered; the sum is the cluster's.
    env.push(json!([{"queue": "q", "payload": 1}, {"queue": "q", "payload": 2}]))
        .await;
    let (s, body) = common::get_url(&env.http, &format!("{b}/health")).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let r = env
        .http
        .post(format!("{b}/api/v1/push"))
        .json(&json!({"items": [{"queue": "q", "payload": 3}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let ma = scrape(&env.http, &a).await;
    let mb = scrape(&env.http, &b).await;
    assert_eq!(get(&ma, "comb_messages_pushed_total"), 2.0);
    assert_eq!(get(&mb, "comb_messages_pushed_total"), 1.0);

    // The leader dies; the other server takes the lock over and starts counting cycles.
    let survivor = if leader_is_a {
        env.server.kill();
        b.clone()
    } else {
        other.kill();
        a.clone()
    };
    until("the survivor leads", || async {
        let m = scrape(&env.http, &survivor).await;
        get(&m, "comb_maintenance_leader") == 1.0 && get(&m, "comb_maintenance_cycles_total") >= 1.0
    })
    .await;
}

#[tokio::test]
async fn a_scrape_without_its_database_still_answers_from_memory() {
    let (pg, mut server) = tokio::task::spawn_blocking(|| {
        let pg = Postgres::start().expect("own cluster");
        let url = pg.create_database("t").unwrap();
        let server = Server::start(common::comb_bin(), &url, FAST).unwrap();
        (pg, server)
    })
    .await
    .unwrap();
    let http = common::client();
    let base = server.base_url();
    let r = http
        .post(format!("{base}/api/v1/push"))
        .json(&json!({"items": [{"queue": "q", "payload": 1}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    until("leading", || async {
        get(&scrape(&http, &base).await, "comb_maintenance_leader") == 1.0
    })
    .await;

    let pg = tokio::task::spawn_blocking(move || {
        pg.stop("immediate").unwrap();
        pg
    })
    .await
    .unwrap();
    let started = Instant::now();
    let m = scrape(&http, &base).await;
    // Answered from memory, not after waiting for the database (a bound generous enough for
    // a loaded machine).
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "a scrape stays quick"
    );
    assert_eq!(get(&m, "comb_queue_stats_success"), 0.0);
    assert_eq!(get(&m, "comb_messages_pushed_total"), 1.0);
    assert!(!m.keys().any(|k| k.starts_with("comb_queue_depth_messages")));
    // Maintenance loses its connection, and with it the lock: no longer leader.
    until("leadership lost", || async {
        let m = scrape(&http, &base).await;
        get(&m, "comb_maintenance_leader") == 0.0
            && get(&m, "comb_maintenance_failures_total") >= 1.0
    })
    .await;
    server.kill();
    drop(pg);
}

#[tokio::test]
async fn waiting_pops_are_counted_while_they_wait() {
    let env = Env::start_with(&["--max-waiting-pops", "7"]).await;
    let base = env.server.base_url();
    let http = common::client();
    let before = scrape(&http, &base).await;
    assert_eq!(get(&before, "comb_pops_waiting"), 0.0);
    assert_eq!(get(&before, "comb_pops_waiting_max"), 7.0);
    let waiting = common::waiting_pop(env.url("/api/v1/pop/queue/q?wait=true&timeout=60000"));
    until("the pop counted as waiting", || async {
        get(&scrape(&http, &base).await, "comb_pops_waiting") == 1.0
    })
    .await;
    env.push(json!([{"queue": "q", "payload": {"n": 1}}])).await;
    let (status, body, _) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    until("the answered pop no longer counted", || async {
        get(&scrape(&http, &base).await, "comb_pops_waiting") == 0.0
    })
    .await;
}
