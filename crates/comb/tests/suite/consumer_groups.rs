//! Consumer groups: every group reads every message of a queue on its own (fan-out), starting
//! where its subscription says (`all`, `new`, or a point in time), and partitions created
//! after a group subscribed are read in full by it. Consumers that name no group share the
//! one reserved group `__QUEUE_MODE__` and split the messages between them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::common::{self, Env};
use chrono::{SecondsFormat, Utc};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// `n` of each message, checking on the way that each partition's messages came in order and
/// that no message came twice.
fn received(messages: &[Value]) -> BTreeSet<i64> {
    let mut per_partition: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut all = BTreeSet::new();
    for m in messages {
        let n = m["data"]["n"].as_i64().unwrap();
        assert!(all.insert(n), "message {n} delivered twice");
        per_partition
            .entry(m["partition"].as_str().unwrap().to_string())
            .or_default()
            .push(n);
    }
    for (p, ns) in per_partition {
        assert!(ns.is_sorted(), "partition {p} out of order: {ns:?}");
    }
    all
}

fn items(partition: &str, ns: impl IntoIterator<Item = i64>) -> Vec<Value> {
    ns.into_iter()
        .map(|n| json!({"queue": "fan", "partition": partition, "payload": {"n": n}}))
        .collect()
}

#[tokio::test]
async fn groups_start_where_their_subscription_says_and_read_new_partitions_in_full() {
    let env = Env::start().await;

    // Phase 1, before any group exists: 50 partitions with 2 messages each (n 0..100).
    let mut phase1 = Vec::new();
    for p in 0..50 {
        phase1.extend(items(&format!("p{p:02}"), [2 * p, 2 * p + 1]));
    }
    env.push(Value::Array(phase1)).await;

    // A moment strictly between the two push phases.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let between = Utc::now().to_rfc3339_opts(SecondsFormat::Micros, true);
    tokio::time::sleep(Duration::from_millis(20)).await;

    // Phase 2: one more message in each partition (n 100..150).
    let mut phase2 = Vec::new();
    for p in 0..50 {
        phase2.extend(items(&format!("p{p:02}"), [100 + p]));
    }
    env.push(Value::Array(phase2)).await;

    // The groups appear now. Every pop of a group carries its subscription options, as a
    // client would; only the first one decides.
    let common = "autoAck=true&partitions=10&batch=100";
    let path_a = format!("/api/v1/pop/queue/fan?consumerGroup=A&{common}");
    let path_b = format!("/api/v1/pop/queue/fan?consumerGroup=B&subscriptionMode=new&{common}");
    let path_c =
        format!("/api/v1/pop/queue/fan?consumerGroup=C&subscriptionFrom={between}&{common}");
    let mut got_a: Vec<Value> = Vec::new();
    let mut got_c: Vec<Value> = Vec::new();
    if let Some(pop) = env.pop(&path_a).await {
        got_a.extend(pop["messages"].as_array().unwrap().iter().cloned());
    }
    // B subscribes at the head of every partition: nothing is there for it yet.
    assert!(
        env.pop(&path_b).await.is_none(),
        "a group subscribing with mode `new` got messages pushed before it existed"
    );
    if let Some(pop) = env.pop(&path_c).await {
        got_c.extend(pop["messages"].as_array().unwrap().iter().cloned());
    }

    // Phase 3, after every group subscribed: one more message in each old partition
    // (n 200..250) and 10 partitions that did not exist before, 3 messages each (n 300..330).
    let mut phase3 = Vec::new();
    for p in 0..50 {
        phase3.extend(items(&format!("p{p:02}"), [200 + p]));
    }
    for p in 0..10 {
        phase3.extend(items(&format!("new{p}"), (0..3).map(|k| 300 + 3 * p + k)));
    }
    env.push(Value::Array(phase3)).await;

    got_a.extend(env.drain(&path_a).await);
    let got_b = env.drain(&path_b).await;
    got_c.extend(env.drain(&path_c).await);

    let phase1: BTreeSet<i64> = (0..100).collect();
    let phase2: BTreeSet<i64> = (100..150).collect();
    let phase3: BTreeSet<i64> = (200..250).chain(300..330).collect();
    let new_partitions: BTreeSet<i64> = (300..330).collect();

    let a = received(&got_a);
    let b = received(&got_b);
    let c = received(&got_c);
    let union = |sets: &[&BTreeSet<i64>]| -> BTreeSet<i64> {
        sets.iter().flat_map(|s| s.iter().copied()).collect()
    };
    assert_eq!(
        a,
        union(&[&phase1, &phase2, &phase3]),
        "mode `all` reads everything"
    );
    assert_eq!(
        b, phase3,
        "mode `new` reads only what was pushed after the group's first pop"
    );
    assert_eq!(
        c,
        union(&[&phase2, &phase3]),
        "subscriptionFrom={between} reads what was pushed at or after that time"
    );
    for (name, set) in [("A", &a), ("B", &b), ("C", &c)] {
        assert!(
            new_partitions.is_subset(set),
            "group {name} missed messages of partitions created after it subscribed"
        );
    }
    for m in got_b.iter() {
        assert_eq!(m["consumerGroup"], "B");
    }
}

#[tokio::test]
async fn every_group_sees_every_message_and_the_default_group_is_shared() {
    let env = Env::start().await;
    let mut all_items = Vec::new();
    for p in 0..20 {
        for k in 0..10 {
            all_items.push(json!({"queue": "shared", "partition": format!("p{p}"), "payload": {"n": p * 10 + k}}));
        }
    }
    env.push(Value::Array(all_items)).await;
    let everything: BTreeSet<i64> = (0..200).collect();

    // Two named groups drain the queue at the same time; each gets all of it.
    let (g1, g2) = tokio::join!(
        env.drain("/api/v1/pop/queue/shared?consumerGroup=g1&autoAck=true&batch=7"),
        env.drain("/api/v1/pop/queue/shared?consumerGroup=g2&autoAck=true&batch=7"),
    );
    assert_eq!(received(&g1), everything, "group g1");
    assert_eq!(received(&g2), everything, "group g2");

    // Two consumers without a group pop side by side: they split the messages.
    let path = "/api/v1/pop/queue/shared?autoAck=true&batch=5";
    let (mut first, mut second) = (Vec::new(), Vec::new());
    loop {
        let (x, y) = tokio::join!(env.pop(path), env.pop(path));
        if x.is_none() && y.is_none() {
            break;
        }
        for (pop, into) in [(x, &mut first), (y, &mut second)] {
            if let Some(pop) = pop {
                assert_eq!(pop["consumerGroup"], "__QUEUE_MODE__");
                into.extend(pop["messages"].as_array().unwrap().iter().cloned());
            }
        }
    }
    assert!(
        !first.is_empty() && !second.is_empty(),
        "both consumers got work: {} and {}",
        first.len(),
        second.len()
    );
    let a = received(&first);
    let b = received(&second);
    assert!(
        a.is_disjoint(&b),
        "a message went to both default consumers"
    );
    // Each consumer's share is in order per partition (checked by `received`); together
    // they are everything.
    let both: BTreeSet<i64> = a.union(&b).copied().collect();
    assert_eq!(both, everything);

    // Naming the reserved group is the same group: nothing is left in it.
    assert!(
        env.pop("/api/v1/pop/queue/shared?consumerGroup=__QUEUE_MODE__")
            .await
            .is_none()
    );
    // A group that appears now still reads everything (mode `all` is the default).
    let late = env
        .drain("/api/v1/pop/queue/shared?consumerGroup=late&autoAck=true&batch=100&partitions=20")
        .await;
    assert_eq!(received(&late), everything);
}

#[tokio::test]
async fn an_invalid_subscription_is_refused_and_subscribes_nothing() {
    let env = Env::start().await;
    env.push(json!([{"queue": "q", "payload": {"n": 1}}])).await;
    for bad in ["yesterday", "2026-13-45T00:00:00Z", "12345"] {
        let (s, b) = env
            .get(&format!(
                "/api/v1/pop/queue/q?consumerGroup=g&subscriptionFrom={bad}"
            ))
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {b}");
        assert_eq!(b["code"], "subscription_from_invalid", "{bad}: {b}");
    }
    let (s, b) = env
        .get(&format!(
            "/api/v1/pop/queue/q?consumerGroup=g&subscriptionMode={}",
            "x".repeat(300)
        ))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
    assert_eq!(b["code"], "subscription_mode_invalid", "{b}");
    assert_eq!(
        env.sql("SELECT count(*) FROM comb.subscriptions WHERE consumer_group = 'g'"),
        "0"
    );
    // The group can still subscribe properly afterwards and reads from the start.
    let pop = env
        .pop("/api/v1/pop/queue/q?consumerGroup=g&autoAck=true")
        .await
        .expect("message for a fresh group");
    assert_eq!(common::numbers(&pop), vec![1]);
}
