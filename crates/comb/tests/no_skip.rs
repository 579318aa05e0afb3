//! Guarantee 2, "nothing skipped": concurrent pushers racing into one partition while a
//! consumer pops and acks; every message is delivered exactly once and each pusher's
//! messages arrive in its own push order.
//!
//! This is the defect of cursors taken at transaction start: a slow commit lands behind a
//! consumer's position and is never delivered. Positions in Comb are assigned under the
//! partition lock, so commit order and position order agree.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{Env, client};
use reqwest::StatusCode;
use serde_json::{Value, json};

const PUSHERS: u64 = 8;
const PER_PUSHER: u64 = 2_600; // 20,800 messages in all

/// A tiny deterministic generator: batch sizes vary without a dependency.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_pushers_never_lose_or_reorder_a_message() {
    let env = Arc::new(Env::start_with(&["--push-workers", "6"]).await);
    let done = Arc::new(AtomicBool::new(false));

    let mut pushers = Vec::new();
    for p in 0..PUSHERS {
        let env = env.clone();
        pushers.push(tokio::spawn(async move {
            // Each pusher has its own HTTP connection pool.
            let http = client();
            let mut seed = 0x9E37_79B9_7F4A_7C15 ^ (p + 1);
            let mut seq = 0;
            while seq < PER_PUSHER {
                let n = (1 + next(&mut seed) % 20).min(PER_PUSHER - seq);
                let items: Vec<Value> = (seq..seq + n)
                    .map(|s| json!({"queue": "race", "partition": "one", "payload": {"p": p, "s": s}}))
                    .collect();
                let r = http
                    .post(env.url("/api/v1/push"))
                    .json(&json!({"items": items}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), StatusCode::CREATED);
                seq += n;
            }
        }));
    }

    let consumer = {
        let env = env.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let mut seen: Vec<(u64, u64)> = Vec::new();
            let total = (PUSHERS * PER_PUSHER) as usize;
            let mut idle_after_done = 0;
            while seen.len() < total {
                let (status, pop) = env
                    .get("/api/v1/pop/queue/race?batch=100&wait=true&timeout=200")
                    .await;
                if status == StatusCode::NO_CONTENT {
                    if done.load(Ordering::SeqCst) {
                        idle_after_done += 1;
                        if idle_after_done > 25 {
                            break; // 5 s without anything after all pushes committed
                        }
                    }
                    continue;
                }
                assert_eq!(status, StatusCode::OK, "{pop}");
                for m in pop["messages"].as_array().unwrap() {
                    seen.push((
                        m["data"]["p"].as_u64().unwrap(),
                        m["data"]["s"].as_u64().unwrap(),
                    ));
                }
                let results = env.ack_all(&pop, "completed", None).await;
                assert!(results.iter().all(|r| r["success"] == true));
            }
            seen
        })
    };

    for p in pushers {
        p.await.unwrap();
    }
    done.store(true, Ordering::SeqCst);
    let seen = consumer.await.unwrap();

    let mut count: HashMap<(u64, u64), usize> = HashMap::new();
    let mut last: HashMap<u64, i64> = HashMap::new();
    let mut out_of_order = 0;
    for &(p, s) in &seen {
        *count.entry((p, s)).or_default() += 1;
        let l = last.entry(p).or_insert(-1);
        if s as i64 != *l + 1 {
            out_of_order += 1;
        }
        *l = s as i64;
    }
    let missing: Vec<(u64, u64)> = (0..PUSHERS)
        .flat_map(|p| (0..PER_PUSHER).map(move |s| (p, s)))
        .filter(|k| !count.contains_key(k))
        .collect();
    let duplicated = count.values().filter(|c| **c > 1).count();
    assert!(
        missing.is_empty(),
        "{} messages never delivered, first: {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert_eq!(duplicated, 0, "messages delivered twice");
    assert_eq!(out_of_order, 0, "a pusher's messages arrived out of order");
    assert_eq!(seen.len(), (PUSHERS * PER_PUSHER) as usize);
    assert_eq!(
        env.sql("SELECT count(*) FROM comb.messages"),
        (PUSHERS * PER_PUSHER).to_string()
    );
}
