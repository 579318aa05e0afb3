//! Guarantee 7, "poison messages end": every message counts its own delivery attempts — a
//! failed ack and a lease that ran out both count — a failed message comes back only after
//! `retryDelay`, and once its first attempt and `retryLimit` retries have failed (Queen's
//! meaning: at most `1 + retryLimit` hand-outs) it goes to the dead-letter queue of that
//! consumer group while the partition moves on. `retry` gives a message back without counting
//! and `dlq` dead-letters it at once.

use std::time::{Duration, Instant};

use crate::common::{Env, numbers, one};
use serde_json::json;

#[tokio::test]
async fn a_failed_message_comes_back_after_the_retry_delay_then_goes_to_the_dead_letters() {
    let env = Env::start().await;
    env.configure("q", json!({"retryLimit": 1, "retryDelay": 300}))
        .await;
    env.push(json!([
        {"queue": "q", "partition": "p", "payload": {"n": 1}, "transactionId": "first"},
        {"queue": "q", "partition": "p", "payload": {"n": 2}},
    ]))
    .await;

    let pop = env.pop("/api/v1/pop/queue/q").await.unwrap();
    let m = one(&pop);
    assert_eq!(
        (m["data"]["n"].as_i64(), m["attempt"].as_i64()),
        (Some(1), Some(1))
    );
    // Taken before the failure is sent, so no later than the moment it was stored.
    let failed_at = Instant::now();
    let r = env.ack_ok(m, "failed", None, Some("boom")).await;
    assert_eq!(r["dlq"], false, "{r}");

    // Not before retryDelay: neither the failed message nor the one behind it. A machine
    // too slow to look within retryDelay may find it already back, which is checked below.
    let early = env.pop("/api/v1/pop/queue/q").await;
    if early.is_none() {
        tokio::time::sleep(Duration::from_millis(450)).await;
    }
    let pop = match early {
        Some(pop) => pop,
        None => env
            .pop("/api/v1/pop/queue/q?wait=true&timeout=30000")
            .await
            .expect("the failed message is back"),
    };
    assert!(
        failed_at.elapsed() >= Duration::from_millis(300),
        "the failed message came back {:?} after the failure, before retryDelay: {pop}",
        failed_at.elapsed()
    );
    let m = one(&pop);
    assert_eq!(m["data"]["n"], 1);
    assert_eq!(m["attempt"], 2);

    // The retry failed too: retryLimit 1 is spent, dead-lettered.
    let r = env.ack_ok(m, "failed", None, Some("boom")).await;
    assert_eq!(r["dlq"], true, "{r}");
    assert_eq!(
        env.sql(
            "SELECT attempts || '|' || coalesce(error, '') || '|' || consumer_group || '|' || transaction_id \
             FROM comb.dead_letters"
        ),
        "2|boom|__QUEUE_MODE__|first"
    );

    // The partition moves on.
    let pop = env
        .pop("/api/v1/pop/queue/q?wait=true&timeout=3000")
        .await
        .expect("the next message after the dead letter");
    let m = one(&pop);
    assert_eq!(m["data"]["n"], 2);
    assert_eq!(m["attempt"], 1);
    env.ack_ok(m, "completed", None, None).await;
    assert!(env.pop("/api/v1/pop/queue/q").await.is_none());
}

#[tokio::test]
async fn a_lease_that_runs_out_counts_as_an_attempt_and_a_poison_message_ends() {
    let env = Env::start().await;
    env.configure(
        "q",
        json!({"retryLimit": 2, "retryDelay": 0, "leaseTime": 1}),
    )
    .await;
    env.push(json!([
        {"queue": "q", "partition": "p", "payload": {"n": 1}, "transactionId": "poison"},
        {"queue": "q", "partition": "p", "payload": {"n": 2}},
    ]))
    .await;

    // A consumer that takes the message and never answers, three times (1 + retryLimit).
    for attempt in 1..=3 {
        let pop = env
            .pop("/api/v1/pop/queue/q?wait=true&timeout=3000")
            .await
            .unwrap_or_else(|| panic!("delivery {attempt} of the poison message"));
        let m = one(&pop);
        assert_eq!(m["data"]["n"], 1, "{pop}");
        assert_eq!(
            m["attempt"], attempt,
            "attempt counts lease expiries: {pop}"
        );
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }

    // Three attempts ran out: the message is dead and the next one is delivered.
    let pop = env
        .pop("/api/v1/pop/queue/q?wait=true&timeout=3000")
        .await
        .expect("the partition moves on after the poison message");
    let m = one(&pop);
    assert_eq!(m["data"]["n"], 2, "{pop}");
    assert_eq!(m["attempt"], 1);
    assert_eq!(
        env.sql(
            "SELECT attempts || '|' || consumer_group || '|' || transaction_id FROM comb.dead_letters"
        ),
        "3|__QUEUE_MODE__|poison"
    );
    let error = env.sql("SELECT coalesce(error, '') FROM comb.dead_letters");
    assert!(
        error.to_lowercase().contains("lease"),
        "the dead letter says why: {error:?}"
    );
}

#[tokio::test]
async fn retry_gives_the_message_back_at_once_without_counting() {
    let env = Env::start().await;
    // retryLimit 0: a single counted attempt would dead-letter it.
    env.configure("q", json!({"retryLimit": 0, "retryDelay": 5000}))
        .await;
    env.push(json!([{"queue": "q", "payload": {"n": 1}}])).await;
    for _ in 0..3 {
        let pop = env
            .pop("/api/v1/pop/queue/q")
            .await
            .expect("given back at once");
        let m = one(&pop);
        assert_eq!(m["data"]["n"], 1);
        assert_eq!(m["attempt"], 1, "retry does not count an attempt");
        let r = env.ack_ok(m, "retry", None, None).await;
        assert_eq!(r["dlq"], false, "{r}");
    }
    assert_eq!(env.sql("SELECT count(*) FROM comb.dead_letters"), "0");
    let pop = env.pop("/api/v1/pop/queue/q").await.unwrap();
    env.ack_ok(one(&pop), "completed", None, None).await;
    assert!(env.pop("/api/v1/pop/queue/q").await.is_none());
}

#[tokio::test]
async fn dlq_dead_letters_at_once() {
    let env = Env::start().await;
    env.configure("q", json!({"retryLimit": 5})).await;
    env.push(json!([
        {"queue": "q", "payload": {"n": 1}, "transactionId": "bad"},
        {"queue": "q", "payload": {"n": 2}},
    ]))
    .await;
    let pop = env.pop("/api/v1/pop/queue/q").await.unwrap();
    let r = env
        .ack_ok(one(&pop), "dlq", None, Some("cannot parse"))
        .await;
    assert_eq!(r["dlq"], true, "{r}");
    assert_eq!(
        env.sql("SELECT transaction_id || '|' || coalesce(error, '') FROM comb.dead_letters"),
        "bad|cannot parse"
    );
    let pop = env
        .pop("/api/v1/pop/queue/q")
        .await
        .expect("the partition moves on");
    assert_eq!(numbers(&pop), vec![2]);
    assert_eq!(one(&pop)["attempt"], 1);
}

#[tokio::test]
async fn a_failed_ack_inside_a_batch_holds_the_position_at_the_failed_message() {
    let env = Env::start().await;
    env.configure("q", json!({"retryDelay": 200, "leaseTime": 30}))
        .await;
    env.push(json!([
        {"queue": "q", "partition": "p", "payload": {"n": 1}},
        {"queue": "q", "partition": "p", "payload": {"n": 2}},
        {"queue": "q", "partition": "p", "payload": {"n": 3}},
        {"queue": "q", "partition": "p", "payload": {"n": 4}},
    ]))
    .await;
    let pop = env.pop("/api/v1/pop/queue/q?batch=3").await.unwrap();
    assert_eq!(numbers(&pop), vec![1, 2, 3]);
    let m = pop["messages"].as_array().unwrap();
    // Acks in any order while the lease holds: the completed ones first, the failure last.
    env.ack_ok(&m[2], "completed", None, None).await;
    env.ack_ok(&m[0], "completed", None, None).await;
    let r = env.ack_ok(&m[1], "failed", None, Some("boom")).await;
    assert_eq!(r["dlq"], false);
    assert_eq!(r["leaseReleased"], true, "a failure ends the lease: {r}");

    tokio::time::sleep(Duration::from_millis(300)).await;
    let pop = env
        .pop("/api/v1/pop/queue/q?batch=10")
        .await
        .expect("2 comes back");
    // The failed message first, then what was never completed; 3 was completed and stays done.
    assert_eq!(numbers(&pop), vec![2, 4]);
    let m = pop["messages"].as_array().unwrap();
    assert_eq!(m[0]["attempt"], 2);
    assert_eq!(m[1]["attempt"], 1);
    env.ack_all(&pop, "completed", None).await;
    assert!(env.pop("/api/v1/pop/queue/q?batch=10").await.is_none());
}

#[tokio::test]
async fn dead_letters_belong_to_one_group() {
    let env = Env::start().await;
    env.configure("q", json!({"retryLimit": 0, "retryDelay": 0}))
        .await;
    env.push(json!([
        {"queue": "q", "payload": {"n": 1}},
        {"queue": "q", "payload": {"n": 2}},
    ]))
    .await;
    let x = env
        .pop("/api/v1/pop/queue/q?consumerGroup=x")
        .await
        .unwrap();
    let r = env
        .ack_ok(one(&x), "failed", Some("x"), Some("x cannot"))
        .await;
    assert_eq!(
        r["dlq"], true,
        "retryLimit 0: the first failure is the last: {r}"
    );

    // Group y still gets message 1, as a first attempt.
    let y = env
        .pop("/api/v1/pop/queue/q?consumerGroup=y")
        .await
        .unwrap();
    assert_eq!(numbers(&y), vec![1]);
    assert_eq!(one(&y)["attempt"], 1);
    env.ack_ok(one(&y), "completed", Some("y"), None).await;

    // Group x moved on to message 2.
    let x = env
        .pop("/api/v1/pop/queue/q?consumerGroup=x&wait=true&timeout=3000")
        .await
        .unwrap();
    assert_eq!(numbers(&x), vec![2]);
    assert_eq!(
        env.sql("SELECT string_agg(consumer_group, ',') FROM comb.dead_letters"),
        "x"
    );
}

/// How a consumer lets an attempt fail.
#[derive(Clone, Copy, Debug)]
enum Failure {
    /// An ack with status `failed`.
    Ack,
    /// No answer until the lease ends.
    Expiry,
}

/// Pushes a message and one behind it into `queue`, fails every hand-out of the first in the
/// way given, and returns how many times it was handed out before the partition moved on to
/// the second, with the attempts its dead letter records.
async fn hand_outs(env: &Env, queue: &str, retry_limit: u32, failure: Failure) -> (i64, String) {
    env.configure(
        queue,
        json!({"retryLimit": retry_limit, "retryDelay": 0, "leaseTime": 1}),
    )
    .await;
    env.push(json!([
        {"queue": queue, "partition": "p", "payload": {"n": 1}, "transactionId": "poison"},
        {"queue": queue, "partition": "p", "payload": {"n": 2}},
    ]))
    .await;
    let path = format!("/api/v1/pop/queue/{queue}?wait=true&timeout=5000");
    let mut handed = 0;
    loop {
        let pop = env
            .pop(&path)
            .await
            .unwrap_or_else(|| panic!("{queue}: something after {handed} hand-outs"));
        let m = one(&pop);
        if m["data"]["n"] == 2 {
            break;
        }
        handed += 1;
        assert_eq!(m["attempt"], handed, "{queue}: {pop}");
        assert!(handed <= 10, "{queue}: handed out {handed} times");
        match failure {
            Failure::Ack => {
                let r = env.ack_ok(m, "failed", None, Some("boom")).await;
                assert_eq!(
                    r["dlq"],
                    handed > i64::from(retry_limit),
                    "{queue}: hand-out {handed}: {r}"
                );
            }
            Failure::Expiry => tokio::time::sleep(Duration::from_millis(1100)).await,
        }
    }
    let dead = env.sql(&format!(
        "SELECT d.attempts FROM comb.dead_letters d JOIN comb.queues q ON q.id = d.queue_id \
         WHERE q.name = '{queue}'"
    ));
    (handed, dead)
}

#[tokio::test]
async fn retry_limit_counts_retries_after_a_failed_ack() {
    let env = Env::start().await;
    for limit in [0, 1, 3] {
        let (handed, dead) = hand_outs(&env, &format!("ack{limit}"), limit, Failure::Ack).await;
        assert_eq!(
            handed,
            1 + i64::from(limit),
            "retryLimit {limit}: handed out 1 + retryLimit times"
        );
        assert_eq!(dead, (1 + limit).to_string(), "retryLimit {limit}");
    }
}

#[tokio::test]
async fn retry_limit_counts_retries_after_a_lease_ends() {
    let env = Env::start().await;
    for limit in [0, 1, 3] {
        let (handed, dead) =
            hand_outs(&env, &format!("lease{limit}"), limit, Failure::Expiry).await;
        assert_eq!(
            handed,
            1 + i64::from(limit),
            "retryLimit {limit}: handed out 1 + retryLimit times"
        );
        assert_eq!(dead, (1 + limit).to_string(), "retryLimit {limit}");
    }
}
