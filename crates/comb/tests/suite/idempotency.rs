//! Guarantee 5: a transaction id is stored once per partition.

use crate::common::{self, Env};
use serde_json::json;

#[tokio::test]
async fn the_same_transaction_id_twice_is_a_duplicate_of_the_first() {
    let env = Env::start().await;
    let first = env
        .push(json!([{"queue": "q", "partition": "p", "payload": {"v": 1}, "transactionId": "order-7"}]))
        .await;
    assert_eq!(first[0]["status"], "queued");
    let second = env
        .push(json!([{"queue": "q", "partition": "p", "payload": {"v": 2}, "transactionId": "order-7"}]))
        .await;
    assert_eq!(second[0]["status"], "duplicate");
    assert_eq!(second[0]["message_id"], first[0]["message_id"]);
    assert_eq!(env.sql("SELECT count(*) FROM comb.messages"), "1");
    // What is stored is the first payload.
    let pop = env.pop("/api/v1/pop/queue/q?batch=10").await.unwrap();
    assert_eq!(pop["messages"].as_array().unwrap().len(), 1);
    assert_eq!(pop["messages"][0]["data"]["v"], 1);
}

#[tokio::test]
async fn duplicates_within_one_request_and_across_concurrent_requests() {
    let env = Env::start().await;
    let r = env
        .push(json!([
            {"queue": "q", "partition": "p", "payload": 1, "transactionId": "x"},
            {"queue": "q", "partition": "p", "payload": 2, "transactionId": "x"},
        ]))
        .await;
    assert_eq!(r[0]["status"], "queued");
    assert_eq!(r[1]["status"], "duplicate");
    assert_eq!(r[1]["message_id"], r[0]["message_id"]);

    // Twenty concurrent pushes of one id: exactly one is stored, all answer its id.
    let mut tasks = Vec::new();
    for i in 0..20 {
        let http = common::client();
        let url = env.url("/api/v1/push");
        tasks.push(tokio::spawn(async move {
            let body = json!({"items": [{"queue": "q", "partition": "p", "payload": i, "transactionId": "y"}]});
            let r: serde_json::Value = http.post(url).json(&body).send().await.unwrap().json().await.unwrap();
            (r[0]["status"].as_str().unwrap().to_string(), r[0]["message_id"].clone())
        }));
    }
    let mut queued = 0;
    let mut ids = std::collections::HashSet::new();
    for t in tasks {
        let (status, id) = t.await.unwrap();
        queued += (status == "queued") as usize;
        ids.insert(id.to_string());
    }
    assert_eq!(queued, 1);
    assert_eq!(ids.len(), 1);
    assert_eq!(
        env.sql("SELECT count(*) FROM comb.messages WHERE transaction_id = 'y'"),
        "1"
    );
}

#[tokio::test]
async fn the_same_transaction_id_in_two_partitions_is_two_messages() {
    let env = Env::start().await;
    let r = env
        .push(json!([
            {"queue": "q", "partition": "a", "payload": 1, "transactionId": "same"},
            {"queue": "q", "partition": "b", "payload": 2, "transactionId": "same"},
        ]))
        .await;
    assert_eq!(r[0]["status"], "queued");
    assert_eq!(r[1]["status"], "queued");
    assert_ne!(r[0]["message_id"], r[1]["message_id"]);
    let r = env
        .push(json!([{"queue": "other", "partition": "a", "payload": 3, "transactionId": "same"}]))
        .await;
    assert_eq!(
        r[0]["status"], "queued",
        "another queue is another partition"
    );
    assert_eq!(env.sql("SELECT count(*) FROM comb.messages"), "3");
}
