//! What must hold the same on plain PostgreSQL and on Citus, written to fail on either: run
//! on both by `make test` (`COMB_TEST_BACKEND`, `scripts/test-citus.sh`). Wake-ups that only
//! a notification can deliver in time, the global cap of a pop over several partitions,
//! every subscription option, and names holding what SQL text would misread (`$1`, quotes,
//! backslashes) through push, pop, ack and the group's administration.

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{self, Env, numbers};

/// A poll fallback of 30 s: a pop answered within 10 s was woken, not found by the periodic
/// look.
const SLOW_FALLBACK: [&str; 2] = ["--poll-fallback-ms", "30000"];

/// How long a woken pop may take: a third of the fallback, so the fallback cannot pass.
const WOKEN_WITHIN: Duration = Duration::from_secs(10);

/// Percent-encodes a name for a path segment or a query value.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Posts `body` to `url` (a server other than the test's own); the status and the body.
async fn post_url(http: &reqwest::Client, url: &str, body: &Value) -> (StatusCode, Value) {
    let r = http.post(url).json(body).send().await.expect("request");
    let status = r.status();
    let body = r.json().await.unwrap_or(Value::Null);
    (status, body)
}

/// A pop waiting on `path` (a minute at most) is answered with message `n` within
/// [`WOKEN_WITHIN`] of the push `push` makes once the pop waits on `server`.
async fn woken_by<F: std::future::Future<Output = ()>>(
    env: &Env,
    server: &str,
    path: &str,
    n: i64,
    push: F,
) {
    let waiter = common::waiting_pop(format!("{server}{path}"));
    // Counted by the server once it waits (a probing pop would compete for the message).
    loop {
        assert!(
            !waiter.is_finished(),
            "the pop on {path} ended before the push"
        );
        if common::metric_at(&env.http, server, "comb_pops_waiting").await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    push.await;
    let pushed = std::time::Instant::now();
    let (s, b, _) = waiter.await.unwrap();
    let after_push = pushed.elapsed();
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(numbers(&b), vec![n], "{b}");
    assert!(
        after_push < WOKEN_WITHIN,
        "answered {after_push:?} after the push: not woken (the fallback is 30 s)"
    );
}

#[tokio::test]
async fn a_pop_waiting_on_a_partition_is_woken_by_a_push_here_and_through_another_server() {
    let env = Env::start_with(&SLOW_FALLBACK).await;
    let other = env.second_server_with(&SLOW_FALLBACK).await;
    let partition = "p";
    // The queue, the partition and the group's cursor exist before the pops wait.
    env.push(json!([{"queue": "q", "partition": partition, "payload": {"n": 0}}]))
        .await;
    env.pop("/api/v1/pop/queue/q/partition/p?autoAck=true")
        .await
        .unwrap();
    let here = env.server.base_url();
    let wait = "/api/v1/pop/queue/q/partition/p?wait=true&timeout=60000&autoAck=true";

    woken_by(&env, &here, wait, 1, async {
        env.push(json!([{"queue": "q", "partition": partition, "payload": {"n": 1}}]))
            .await;
    })
    .await;

    // Pushed through another server: only its notification can reach this one.
    let there = other.base_url();
    woken_by(&env, &here, wait, 2, async {
        let (s, b) = post_url(
            &env.http,
            &format!("{there}/api/v1/push"),
            &json!({"items": [{"queue": "q", "partition": partition, "payload": {"n": 2}}]}),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    })
    .await;

    // A pop of the whole queue, woken through another server too.
    let wait_queue = "/api/v1/pop/queue/q?wait=true&timeout=60000&autoAck=true";
    woken_by(&env, &here, wait_queue, 3, async {
        let (s, b) = post_url(
            &env.http,
            &format!("{there}/api/v1/push"),
            &json!({"items": [{"queue": "q", "partition": "other", "payload": {"n": 3}}]}),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    })
    .await;
}

#[tokio::test]
async fn a_pop_of_several_partitions_never_answers_more_than_its_batch() {
    let env = Env::start().await;
    // 6 partitions of 20 messages: enough on every worker for any cap to be overrun.
    let mut items = Vec::new();
    for p in 0..6 {
        for k in 0..20 {
            items.push(json!({"queue": "q", "partition": format!("p{p}"),
                              "payload": {"n": p * 100 + k}}));
        }
    }
    env.push(Value::Array(items)).await;

    for (group, batch) in [("ten", 10usize), ("twenty", 20), ("one", 1), ("big", 45)] {
        let mut seen: BTreeSet<i64> = BTreeSet::new();
        loop {
            let path =
                format!("/api/v1/pop/queue/q?consumerGroup={group}&partitions=6&batch={batch}");
            let Some(pop) = env.pop(&path).await else {
                break;
            };
            let messages = pop["messages"].as_array().unwrap();
            assert!(
                !messages.is_empty() && messages.len() <= batch,
                "a pop of 6 partitions with batch {batch} answered {} messages",
                messages.len()
            );
            // Each partition hands out a prefix of what it holds, in order.
            let mut per_partition: Vec<(String, i64)> = Vec::new();
            for m in messages {
                let n = m["data"]["n"].as_i64().unwrap();
                per_partition.push((m["partition"].as_str().unwrap().to_string(), n));
                assert!(seen.insert(n), "message {n} delivered twice to {group}");
            }
            for w in per_partition.windows(2) {
                if w[0].0 == w[1].0 {
                    assert!(w[0].1 < w[1].1, "out of order in {group}: {pop}");
                }
            }
            let results = env.ack_all(&pop, "completed", Some(group)).await;
            assert!(results.iter().all(|r| r["success"] == true), "{results:?}");
        }
        assert_eq!(
            seen.len(),
            120,
            "group {group} with batch {batch} read everything"
        );
    }
}

#[tokio::test]
async fn every_subscription_option_starts_a_new_group_where_it_says() {
    let env = Env::start().await;
    let push = |partition: &'static str, ns: std::ops::Range<i64>| {
        let items: Vec<Value> = ns
            .map(|n| json!({"queue": "q", "partition": partition, "payload": {"n": n}}))
            .collect();
        env.push(Value::Array(items))
    };
    push("a", 0..3).await;
    push("b", 10..13).await;
    // Timestamps have microseconds in the database: a moment clearly between two pushes.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let between = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    tokio::time::sleep(Duration::from_millis(50)).await;
    push("a", 3..5).await;
    push("b", 13..15).await;

    let env = &env;
    let drain = |path: String| async move { env.drain(&path).await };
    let ns = |ms: Vec<Value>| -> BTreeSet<i64> {
        ms.iter()
            .map(|m| m["data"]["n"].as_i64().unwrap())
            .collect()
    };
    let from = enc(&between);
    let cases: Vec<(&str, String, BTreeSet<i64>)> = vec![
        (
            "all, queue-wide",
            "/api/v1/pop/queue/q?consumerGroup=all&subscriptionMode=all".into(),
            (0..5).chain(10..15).collect(),
        ),
        (
            "a timestamp, queue-wide",
            format!("/api/v1/pop/queue/q?consumerGroup=ts&subscriptionFrom={from}"),
            (3..5).chain(13..15).collect(),
        ),
        (
            "a timestamp, a named partition",
            format!("/api/v1/pop/queue/q/partition/a?consumerGroup=tsp&subscriptionFrom={from}"),
            (3..5).collect(),
        ),
        (
            "new, queue-wide",
            "/api/v1/pop/queue/q?consumerGroup=new&subscriptionMode=new".into(),
            BTreeSet::new(),
        ),
        (
            "now, queue-wide",
            "/api/v1/pop/queue/q?consumerGroup=now&subscriptionFrom=now".into(),
            BTreeSet::new(),
        ),
        (
            "now, a named partition",
            "/api/v1/pop/queue/q/partition/b?consumerGroup=nowp&subscriptionFrom=now".into(),
            BTreeSet::new(),
        ),
    ];
    let suffix = "&autoAck=true&batch=100&partitions=10";
    let named_suffix = "&autoAck=true&batch=100";
    for (what, path, expected) in &cases {
        let s = if path.contains("/partition/") {
            named_suffix
        } else {
            suffix
        };
        assert_eq!(&ns(drain(format!("{path}{s}")).await), expected, "{what}");
    }
    // What comes after the subscription reaches every group, new and `now` ones included.
    push("a", 5..6).await;
    push("b", 15..16).await;
    for (what, path, _) in &cases {
        let s = if path.contains("/partition/") {
            named_suffix
        } else {
            suffix
        };
        let got = ns(drain(format!("{path}{s}")).await);
        let want: BTreeSet<i64> = if path.contains("/partition/a") {
            [5].into()
        } else if path.contains("/partition/b") {
            [15].into()
        } else {
            [5, 15].into()
        };
        assert_eq!(got, want, "{what}, after subscribing");
    }
}

/// Names that a statement written with its parameters in the text would misread.
const AWKWARD: &[&str] = &["$1", "it's", r"back\slash", r"$2'\$1"];

#[tokio::test]
async fn names_holding_dollar_signs_quotes_and_backslashes_are_names() {
    let env = Env::start().await;
    let mut items = Vec::new();
    for (k, p) in AWKWARD.iter().enumerate() {
        for j in 0..3 {
            items.push(json!({"queue": "q", "partition": p, "payload": {"n": k as i64 * 10 + j}}));
        }
    }
    env.push(Value::Array(items)).await;

    // Each awkward name as a group, over the whole queue: everything, once, and acked.
    for g in AWKWARD {
        let mut seen = HashSet::new();
        loop {
            let path = format!("/api/v1/pop/queue/q?consumerGroup={}&batch=5", enc(g));
            let Some(pop) = env.pop(&path).await else {
                break;
            };
            for m in pop["messages"].as_array().unwrap() {
                assert_eq!(m["consumerGroup"], *g, "{pop}");
                assert!(AWKWARD.contains(&m["partition"].as_str().unwrap()), "{pop}");
                assert!(seen.insert(m["data"]["n"].as_i64().unwrap()), "{pop}");
            }
            let results = env.ack_all(&pop, "completed", Some(g)).await;
            assert!(
                results.iter().all(|r| r["success"] == true),
                "{g}: {results:?}"
            );
        }
        assert_eq!(seen.len(), 12, "group {g:?}");
    }

    // Each awkward partition by name, under a new awkward group.
    for (k, p) in AWKWARD.iter().enumerate() {
        let group = format!("by name {}", AWKWARD[3 - k]);
        let path = format!(
            "/api/v1/pop/queue/q/partition/{}?consumerGroup={}&batch=10",
            enc(p),
            enc(&group)
        );
        let pop = env.pop(&path).await.unwrap();
        let got: Vec<i64> = numbers(&pop);
        assert_eq!(
            got,
            vec![k as i64 * 10, k as i64 * 10 + 1, k as i64 * 10 + 2],
            "{p:?}"
        );
        assert!(
            pop["messages"]
                .as_array()
                .unwrap()
                .iter()
                .all(|m| m["partition"] == *p)
        );
        let results = env.ack_all(&pop, "failed", Some(&group)).await;
        assert!(results.iter().all(|r| r["success"] == true), "{results:?}");
    }

    // The administration finds the groups by those names.
    let (s, groups) = env.get("/api/v1/consumer-groups").await;
    assert_eq!(s, StatusCode::OK, "{groups}");
    let text = groups.to_string();
    for g in AWKWARD {
        assert!(
            text.contains(&serde_json::to_string(g).unwrap()),
            "group {g:?} not listed: {groups}"
        );
    }
}
