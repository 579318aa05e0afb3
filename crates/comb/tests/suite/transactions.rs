//! Guarantee 6, "exactly-once pipelines": `POST /api/v1/transaction` commits its acks and
//! pushes together or not at all, and every ack in it must hold the live lease of its
//! partition — a wrong or ended lease fails the whole transaction and nothing of it happens.

use std::time::Duration;

use crate::common::{Env, numbers};
use reqwest::StatusCode;
use serde_json::{Value, json};

fn ack_op(m: &Value, lease: Value, group: Option<&str>) -> Value {
    let mut op = json!({
        "type": "ack",
        "transactionId": m["transactionId"],
        "partitionId": m["partitionId"],
        "status": "completed",
    });
    if !lease.is_null() {
        op["leaseId"] = lease;
    }
    if let Some(g) = group {
        op["consumerGroup"] = json!(g);
    }
    op
}

fn push_op(queue: &str, n: i64) -> Value {
    json!({"type": "push", "items": [{"queue": queue, "payload": {"n": n}}]})
}

async fn expect_lease_invalid(env: &Env, operations: Vec<Value>) {
    let (s, b) = env
        .post("/api/v1/transaction", &json!({"operations": operations}))
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{b}");
    assert_eq!(b["code"], "lease_invalid", "{b}");
}

#[tokio::test]
async fn an_ack_and_a_push_commit_together() {
    let env = Env::start().await;
    env.push(json!([
        {"queue": "in", "partition": "p", "payload": {"n": 1}},
        {"queue": "in", "partition": "p", "payload": {"n": 2}},
    ]))
    .await;
    let pop = env
        .pop("/api/v1/pop/queue/in?consumerGroup=workers")
        .await
        .unwrap();
    assert_eq!(numbers(&pop), vec![1]);
    let m = &pop["messages"][0];

    let (s, b) = env
        .post(
            "/api/v1/transaction",
            &json!({"operations": [
                ack_op(m, m["leaseId"].clone(), Some("workers")),
                push_op("out", 10),
            ]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["success"], true, "{b}");
    assert!(b["transactionId"].is_string(), "{b}");
    assert_eq!(
        b["results"].as_array().map(Vec::len),
        Some(2),
        "one result per operation: {b}"
    );

    // The pushed message is there…
    let out = env.pop("/api/v1/pop/queue/out").await.expect("pushed");
    assert_eq!(numbers(&out), vec![10]);
    // …and the acked one is gone: the lease was released and the position moved past it.
    let next = env
        .pop("/api/v1/pop/queue/in?consumerGroup=workers")
        .await
        .expect("the partition is free again");
    assert_eq!(numbers(&next), vec![2]);
}

#[tokio::test]
async fn a_wrong_or_ended_lease_fails_the_whole_transaction() {
    let env = Env::start().await;
    env.configure("in", json!({"leaseTime": 1})).await;
    env.push(json!([
        {"queue": "in", "partition": "a", "payload": {"n": 1}},
        {"queue": "in", "partition": "b", "payload": {"n": 2}},
    ]))
    .await;
    let first = env.pop("/api/v1/pop/queue/in").await.unwrap();
    let second = env.pop("/api/v1/pop/queue/in").await.unwrap();
    let (ma, mb) = (&first["messages"][0], &second["messages"][0]);
    assert_ne!(ma["partitionId"], mb["partitionId"]);
    let stored = env.message_count();

    // One good ack, one ack under a lease id that is not the partition's, one push.
    expect_lease_invalid(
        &env,
        vec![
            ack_op(ma, ma["leaseId"].clone(), None),
            ack_op(mb, json!(uuid::Uuid::new_v4()), None),
            push_op("out", 10),
        ],
    )
    .await;
    assert_eq!(env.message_count(), stored, "the push was not stored");

    // Both leases run out. An ack under an ended lease fails the transaction just the same.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    expect_lease_invalid(
        &env,
        vec![ack_op(ma, ma["leaseId"].clone(), None), push_op("out", 11)],
    )
    .await;
    assert_eq!(env.message_count(), stored, "the push was not stored");
    assert!(env.pop("/api/v1/pop/queue/out").await.is_none());

    // Neither ack happened: both messages are handed out again (under leases that outlast
    // the pops below).
    env.configure("in", json!({"leaseTime": 30})).await;
    let mut again = Vec::new();
    while let Some(pop) = env.pop("/api/v1/pop/queue/in").await {
        again.extend(numbers(&pop));
    }
    again.sort();
    assert_eq!(
        again,
        vec![1, 2],
        "an ack of a failed transaction took effect"
    );
}

#[tokio::test]
async fn an_ack_without_a_lease_id_still_needs_a_live_lease() {
    let env = Env::start().await;
    env.configure("in", json!({"leaseTime": 1})).await;
    env.push(json!([
        {"queue": "in", "payload": {"n": 1}},
        {"queue": "in", "payload": {"n": 2}},
    ]))
    .await;
    let pop = env.pop("/api/v1/pop/queue/in").await.unwrap();
    let m = pop["messages"][0].clone();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let stored = env.message_count();
    expect_lease_invalid(
        &env,
        vec![ack_op(&m, Value::Null, None), push_op("out", 10)],
    )
    .await;
    assert_eq!(env.message_count(), stored);

    // Under a live lease the same transaction goes through.
    env.configure("in", json!({"leaseTime": 30})).await;
    let pop = env.pop("/api/v1/pop/queue/in").await.expect("1 is back");
    assert_eq!(numbers(&pop), vec![1]);
    let (s, b) = env
        .post(
            "/api/v1/transaction",
            &json!({"operations": [ack_op(&pop["messages"][0], Value::Null, None), push_op("out", 10)]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(env.message_count(), stored + 1);
    let next = env.pop("/api/v1/pop/queue/in").await.expect("2 is next");
    assert_eq!(numbers(&next), vec![2]);
}

#[tokio::test]
async fn bad_input_is_refused_and_nothing_of_it_happens() {
    let env = Env::start().await;
    env.push(json!([{"queue": "in", "payload": {"n": 1}}]))
        .await;
    let pop = env.pop("/api/v1/pop/queue/in").await.unwrap();
    let m = pop["messages"][0].clone();
    let stored = env.message_count();

    let (s, b) = env
        .post("/api/v1/transaction", &json!({"operations": []}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");

    let (s, b) = env.post("/api/v1/transaction", &json!({"items": []})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");

    let (s, b) = env
        .post(
            "/api/v1/transaction",
            &json!({"operations": [ack_op(&m, m["leaseId"].clone(), None), {"type": "delete", "queue": "in"}]}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
    assert!(
        b["code"] == "field_invalid" || b["code"] == "operation_invalid",
        "{b}"
    );

    let (s, b) = env
        .post(
            "/api/v1/transaction",
            &json!({"operations": [
                ack_op(&m, m["leaseId"].clone(), None),
                {"type": "push", "items": [
                    {"queue": "out", "payload": {"n": 2}},
                    {"queue": "bad queue", "payload": {"n": 3}},
                ]},
            ]}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
    assert_eq!(b["code"], "queue_name_invalid", "{b}");
    assert_eq!(
        env.message_count(),
        stored,
        "nothing of a refused transaction is stored"
    );
    assert_eq!(
        env.sql("SELECT count(*) FROM comb.queues WHERE name = 'out'"),
        "0"
    );

    // The ack in the refused transactions did not happen: the lease still holds it, and it
    // still acks (and then the partition is done).
    assert_eq!(
        env.sql("SELECT max(cursor_pos) FROM comb.cursors_now"),
        "0",
        "a refused transaction moved a position"
    );
    let results = env.ack_all(&pop, "completed", None).await;
    assert_eq!(results[0]["success"], true);
    assert!(env.pop("/api/v1/pop/queue/in").await.is_none());
}
