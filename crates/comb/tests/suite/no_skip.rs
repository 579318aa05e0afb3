//! Guarantee 2, "nothing skipped": concurrent pushers racing into one partition while a
//! consumer pops and acks; every message is delivered exactly once and each pusher's
//! messages arrive in its own push order.
//!
//! This is the defect of cursors taken at transaction start: a slow commit lands behind a
//! consumer's position and is never delivered. Positions in Comb are assigned under the
//! partition lock, so commit order and position order agree.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::common::{Env, client, numbers, xorshift};
use reqwest::StatusCode;
use serde_json::{Value, json};

const PUSHERS: u64 = 8;
const PER_PUSHER: u64 = 2_600; // 20,800 messages in all

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
                // Up to 100 per request: fused batches take both ways of storing (inserted
                // below 64 messages, copied in from 64).
                let n = (1 + xorshift(&mut seed) % 100).min(PER_PUSHER - seq);
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

/// Batches are stored three ways (copied in, appended, inserted with a duplicate check); one
/// partition fed by all three holds consecutive positions in push order, and stamps them in
/// the segment and time of their push.
#[tokio::test]
async fn every_way_of_storing_keeps_positions_consecutive() {
    let env = Env::start().await;
    let item = |n: i64, txid: Option<String>| {
        let mut v = json!({"queue": "ways", "partition": "p", "payload": {"n": n}});
        if let Some(t) = txid {
            v["transactionId"] = json!(t);
        }
        v
    };
    let mut n = 0i64;
    let mut batch = |len: i64, txids: bool| {
        let items: Vec<Value> = (n..n + len)
            .map(|k| item(k, txids.then(|| format!("t{k}"))))
            .collect();
        n += len;
        json!(items)
    };
    let sizes = [
        (1, false),
        (150, false),
        (3, true),
        (64, false),
        (63, false),
        (80, true),
    ];
    for (len, txids) in sizes {
        let results = env.push(batch(len, txids)).await;
        assert_eq!(results.len(), len as usize);
        assert!(
            results.iter().all(|r| r["status"] == "queued"),
            "{results:?}"
        );
    }
    // A repeat of transaction ids already stored stores nothing.
    let again: Vec<Value> = (151..154).map(|k| item(k, Some(format!("t{k}")))).collect();
    let results = env.push(json!(again)).await;
    assert!(
        results.iter().all(|r| r["status"] == "duplicate"),
        "{results:?}"
    );

    let total: i64 = sizes.iter().map(|(len, _)| len).sum();
    assert_eq!(
        env.sql("SELECT count(*), min(pos), max(pos), count(DISTINCT pos) FROM comb.messages"),
        format!("{total}|1|{total}|{total}")
    );
    assert_eq!(
        env.sql(
            "SELECT count(*) FROM comb.messages \
             WHERE seg <> (SELECT max(seg) FROM comb.segments) \
                OR created_at > now() OR created_at < now() - interval '1 minute'"
        ),
        "0"
    );
    let popped = env.pop("/api/v1/pop/queue/ways?batch=1000").await.unwrap();
    assert_eq!(numbers(&popped), (0..total).collect::<Vec<_>>());
    // Without a producer's id the message id stands in as the transaction id, in every way.
    let messages = popped["messages"].as_array().unwrap();
    for m in messages {
        let txid = m["transactionId"].as_str().unwrap();
        assert!(txid == m["id"] || txid.starts_with('t'), "{m}");
    }
    assert_eq!(
        env.sql(
            "SELECT count(*) FILTER (WHERE transaction_id = message_id::text), \
                    count(*) FILTER (WHERE transaction_id LIKE 't%') FROM comb.messages"
        ),
        format!("{}|83", total - 83)
    );
}

/// A copied-in batch keeps each message's payload, trace id and transaction id exactly,
/// escapes and all.
#[tokio::test]
async fn copied_batches_keep_every_field() {
    let env = Env::start().await;
    let items: Vec<Value> = (0..100)
        .map(|k| {
            let mut v = json!({
                "queue": "fields",
                "partition": if k % 2 == 0 { "even" } else { "odd!" },
                "payload": {"k": k, "text": "quote \" tab \t é ✓", "nested": [1, {"x": null}]},
            });
            if k % 3 == 0 {
                v["traceId"] = json!(format!("trace-{k} \"q\""));
            }
            v
        })
        .collect();
    // One partition name is sent escaped, so it is decoded rather than borrowed.
    let body = json!({ "items": items })
        .to_string()
        .replace("\"odd!\"", "\"odd\\u0021\"");
    assert!(body.contains("odd\\u0021"));
    let (status, answer) = env.post_raw("/api/v1/push", body.into_bytes()).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let results = answer.as_array().unwrap();
    assert_eq!(results.len(), 100);
    assert_eq!(env.sql("SELECT count(*) FROM comb.messages"), "100");
    let popped = env
        .pop("/api/v1/pop/queue/fields?batch=100&partitions=2")
        .await
        .unwrap();
    let messages = popped["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 100);
    for m in messages {
        let k = m["data"]["k"].as_i64().unwrap();
        assert_eq!(m["data"], items[k as usize]["payload"], "{m}");
        assert_eq!(
            m["traceId"],
            items[k as usize]
                .get("traceId")
                .cloned()
                .unwrap_or(Value::Null)
        );
        assert_eq!(m["transactionId"], m["id"]);
        let partition = if k % 2 == 0 { "even" } else { "odd!" };
        assert_eq!(m["partition"], partition, "{m}");
        let answered = &results[k as usize];
        assert_eq!(answered["message_id"], m["id"]);
        assert_eq!(answered["transaction_id"], m["id"]);
        assert_eq!(answered["partition_id"], m["partitionId"]);
    }
}

/// A copied-in batch larger than one piece of encoded rows arrives whole and in order.
#[tokio::test]
async fn a_copied_batch_of_large_payloads_arrives_whole() {
    let env = Env::start().await;
    let items: Vec<Value> = (0..80)
        .map(|n| json!({"queue": "large", "payload": {"n": n, "text": "x".repeat(20_000 + n)}}))
        .collect();
    let results = env.push(json!(items)).await;
    assert_eq!(results.len(), 80);
    let popped = env.pop("/api/v1/pop/queue/large?batch=100").await.unwrap();
    assert_eq!(numbers(&popped), (0..80).collect::<Vec<_>>());
    for (n, m) in popped["messages"].as_array().unwrap().iter().enumerate() {
        assert_eq!(m["data"]["text"].as_str().unwrap().len(), 20_000 + n);
    }
}
