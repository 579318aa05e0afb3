//! Leases: a leased partition is invisible to the rest of the group until the lease ends;
//! then its unacked messages come back, in order.

use std::time::{Duration, Instant};

use crate::common::{Env, numbers};
use reqwest::StatusCode;
use serde_json::json;

/// The lease of [`a_leased_partition_is_not_handed_out_twice_and_comes_back_after_the_lease`]:
/// long enough for its checks while the lease holds (an ack and three pops) on a machine
/// many times slower than usual, short enough to wait for its end.
const HELD: Duration = Duration::from_secs(5);

#[tokio::test]
async fn a_leased_partition_is_not_handed_out_twice_and_comes_back_after_the_lease() {
    let env = Env::start().await;
    let (s, _) = env
        .post(
            "/api/v1/configure",
            &json!({"queue": "q", "options": {"leaseTime": HELD.as_secs()}}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    env.push(json!([
        {"queue": "q", "partition": "p", "payload": {"n": 1}},
        {"queue": "q", "partition": "p", "payload": {"n": 2}},
        {"queue": "q", "partition": "p", "payload": {"n": 3}},
    ]))
    .await;

    let first = env.pop("/api/v1/pop/queue/q?batch=3").await.unwrap();
    let leased_at = Instant::now();
    assert_eq!(numbers(&first), vec![1, 2, 3]);
    // Ack only the first message.
    let only_first = json!({"messages": [first["messages"][0].clone()]});
    env.ack_all(&only_first, "completed", None).await;

    // Another consumer of the same group gets nothing while the lease holds…
    assert!(env.pop("/api/v1/pop/queue/q?batch=3").await.is_none());
    assert!(
        env.pop("/api/v1/pop/queue/q/partition/p?batch=3")
            .await
            .is_none()
    );
    // …but a different group is not blocked by it.
    let other = env
        .pop("/api/v1/pop/queue/q?batch=3&consumerGroup=analytics")
        .await
        .unwrap();
    assert_eq!(numbers(&other), vec![1, 2, 3]);

    // After the lease ends, the unacked messages come back in order under a new lease.
    tokio::time::sleep_until((leased_at + HELD + Duration::from_millis(300)).into()).await;
    let again = env.pop("/api/v1/pop/queue/q?batch=3").await.unwrap();
    assert_eq!(numbers(&again), vec![2, 3]);
    assert_ne!(again["leaseId"], first["leaseId"]);

    // The ended lease can no longer ack.
    let (s, body) = env
        .post(
            "/api/v1/ack",
            &json!({
                "transactionId": first["messages"][1]["transactionId"],
                "partitionId": first["partitionId"],
                "leaseId": first["leaseId"],
                "status": "completed",
            }),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert_eq!(body["code"], "lease_invalid");
    // The current lease can.
    let results = env.ack_all(&again, "completed", None).await;
    assert!(results.iter().all(|r| r["success"] == true));
    assert!(env.pop("/api/v1/pop/queue/q").await.is_none());
}

#[tokio::test]
async fn auto_ack_moves_the_position_inside_the_pop() {
    let env = Env::start().await;
    env.push(json!([
        {"queue": "q", "payload": {"n": 1}},
        {"queue": "q", "payload": {"n": 2}},
    ]))
    .await;
    let pop = env
        .pop("/api/v1/pop/queue/q?batch=1&autoAck=true")
        .await
        .unwrap();
    assert_eq!(numbers(&pop), vec![1]);
    assert!(pop["leaseId"].is_null());
    // Nothing is leased, so the next pop gets the next message at once.
    let pop = env
        .pop("/api/v1/pop/queue/q?batch=1&autoAck=true")
        .await
        .unwrap();
    assert_eq!(numbers(&pop), vec![2]);
    assert!(env.pop("/api/v1/pop/queue/q").await.is_none());
}

#[tokio::test]
async fn partitions_are_independent_lanes() {
    let env = Env::start().await;
    env.push(json!([
        {"queue": "q", "partition": "a", "payload": {"n": 1}},
        {"queue": "q", "partition": "b", "payload": {"n": 2}},
    ]))
    .await;
    // One consumer holds partition a (and never acks); b is still served.
    let a = env.pop("/api/v1/pop/queue/q").await.unwrap();
    let b = env.pop("/api/v1/pop/queue/q").await.unwrap();
    assert_ne!(a["partition"], b["partition"]);
    let mut got = [numbers(&a)[0], numbers(&b)[0]];
    got.sort();
    assert_eq!(got, [1, 2]);
}

#[tokio::test]
async fn a_waiting_pop_returns_when_a_message_arrives() {
    let env = Env::start().await;
    env.push(json!([{"queue": "q", "payload": {"n": 0}}])).await;
    env.pop("/api/v1/pop/queue/q?autoAck=true").await.unwrap();
    let http = env.http.clone();
    let url = env.url("/api/v1/pop/queue/q?wait=true&timeout=60000&autoAck=true");
    let waiter = tokio::spawn(async move {
        let started = std::time::Instant::now();
        let r = http.get(url).send().await.unwrap();
        (
            r.status(),
            r.json::<serde_json::Value>().await.unwrap(),
            started.elapsed(),
        )
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    env.push(json!([{"queue": "q", "payload": {"n": 7}}])).await;
    let (status, body, elapsed) = waiter.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(numbers(&body), vec![7]);
    assert!(
        elapsed < Duration::from_secs(30),
        "returned after {elapsed:?}, not well before its 60 s timeout"
    );
}

#[tokio::test]
async fn a_waiting_pop_answers_204_at_its_timeout() {
    let env = Env::start().await;
    let started = std::time::Instant::now();
    let (s, _) = env
        .get("/api/v1/pop/queue/empty?wait=true&timeout=300")
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn acks_find_their_messages_anywhere_in_a_large_lease_and_outside_it() {
    let env = Env::start().await;
    let items: Vec<_> = (1..=100)
        .map(|n| json!({"queue": "big", "partition": "p", "payload": {"n": n}}))
        .collect();
    env.push(json!(items)).await;
    let pop = env
        .pop("/api/v1/pop/queue/big?batch=100")
        .await
        .expect("messages");
    let messages = pop["messages"].as_array().unwrap().clone();
    assert_eq!(numbers(&pop), (1..=100).collect::<Vec<_>>());
    let ack = |m: &serde_json::Value| {
        json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
               "leaseId": m["leaseId"], "status": "completed"})
    };
    let batch = |acks: Vec<serde_json::Value>| {
        let env = &env;
        async move {
            let (s, body) = env
                .post("/api/v1/ack/batch", &json!({ "acknowledgments": acks }))
                .await;
            assert_eq!(s, StatusCode::OK, "{body}");
            body.as_array().unwrap().clone()
        }
    };

    // One message far ahead of the position, alone.
    let far = batch(vec![ack(&messages[89])]).await;
    assert_eq!(far[0]["success"], true, "{far:?}");
    // The first ten, then every message in reverse order (acking again changes nothing).
    let first: Vec<_> = messages[..10].iter().map(ack).collect();
    let answers = batch(first).await;
    assert!(answers.iter().all(|a| a["success"] == true), "{answers:?}");
    assert_eq!(env.sql("SELECT cursor_pos FROM comb.cursors_now"), "10");

    // A message pushed after the pop was never handed out; another never existed.
    let later = env
        .push(
            json!([{"queue": "big", "partition": "p", "payload": {"n": 101},
                       "transactionId": "later"}]),
        )
        .await;
    let mut rest: Vec<_> = messages.iter().rev().map(ack).collect();
    let lease = pop["leaseId"].clone();
    let pid = later[0]["partition_id"].clone();
    rest.push(
        json!({"transactionId": "later", "partitionId": pid, "leaseId": lease,
                     "status": "completed"}),
    );
    rest.push(
        json!({"transactionId": "never", "partitionId": pid, "leaseId": lease,
                     "status": "completed"}),
    );
    let answers = batch(rest).await;
    assert!(
        answers[..100].iter().all(|a| a["success"] == true),
        "{answers:?}"
    );
    let refused = |a: &serde_json::Value| a["error"].as_str().unwrap_or("").to_string();
    assert!(
        refused(&answers[100]).starts_with("message_not_delivered"),
        "{answers:?}"
    );
    assert!(
        refused(&answers[101]).starts_with("message_not_found"),
        "{answers:?}"
    );
    // In reverse order, the ack of message 11 closes the run (1–10 and 90 were settled).
    let released: Vec<usize> = (0..answers.len())
        .filter(|&k| answers[k]["leaseReleased"] == true)
        .collect();
    assert_eq!(released, vec![89]);
    assert_eq!(env.sql("SELECT cursor_pos FROM comb.cursors_now"), "100");
    let next = env.pop("/api/v1/pop/queue/big?batch=100").await.unwrap();
    assert_eq!(numbers(&next), vec![101]);
}
