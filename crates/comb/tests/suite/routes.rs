//! Round trips through every route of the API against a real server and PostgreSQL.

use crate::common::{Env, numbers};
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test]
async fn push_answers_one_result_per_item_in_order() {
    let env = Env::start().await;
    let results = env
        .push(json!([
            {"queue": "orders", "partition": "c1", "payload": {"n": 1}, "transactionId": "a", "traceId": "tr-1"},
            {"queue": "orders", "payload": {"n": 2}},
            {"queue": "audit", "partition": "c1", "payload": [1, "two", null]},
        ]))
        .await;
    assert_eq!(results.len(), 3);
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["index"], i);
        assert_eq!(r["status"], "queued");
        assert!(uuid::Uuid::parse_str(r["message_id"].as_str().unwrap()).is_ok());
        assert!(uuid::Uuid::parse_str(r["partition_id"].as_str().unwrap()).is_ok());
    }
    assert_eq!(results[0]["transaction_id"], "a");
    assert_eq!(results[0]["trace_id"], "tr-1");
    assert_eq!(results[0]["queueName"], "orders");
    assert_eq!(results[2]["queueName"], "audit");
    // Generated transaction ids are unique.
    assert_ne!(results[1]["transaction_id"], results[2]["transaction_id"]);
    // "Default" is a different partition from "c1".
    assert_ne!(results[0]["partition_id"], results[1]["partition_id"]);
    assert_eq!(
        env.sql("SELECT count(*) FROM comb.messages"),
        "3",
        "all three stored"
    );
}

#[tokio::test]
async fn a_push_naming_partitions_many_times_stores_each_item_in_its_own() {
    let env = Env::start().await;
    let targets = [
        ("orders", "c1"),
        ("audit", "c1"),
        ("orders", "c1"),
        ("orders", "c2"),
        ("audit", "c1"),
        ("orders", "c1"),
    ];
    let items: Vec<_> = targets
        .iter()
        .enumerate()
        .map(|(n, (q, p))| json!({"queue": q, "partition": p, "payload": {"n": n}}))
        .collect();
    let results = env.push(json!(items)).await;
    assert_eq!(results.len(), targets.len());
    for (i, (q, p)) in targets.iter().enumerate() {
        let r = &results[i];
        assert_eq!(r["queueName"], *q, "item {i}");
        // The answer's partition is the item's: its name and queue, and the message in it.
        let stored = env.sql(&format!(
            "SELECT q.name || '/' || p.name || '/' || (convert_from(m.payload, 'UTF8')::jsonb->>'n')
             FROM comb.messages m JOIN comb.partitions p ON p.id = m.partition_id
             JOIN comb.queues q ON q.id = p.queue_id
             WHERE m.message_id = '{}' AND p.id = '{}'",
            r["message_id"].as_str().unwrap(),
            r["partition_id"].as_str().unwrap()
        ));
        assert_eq!(stored, format!("{q}/{p}/{i}"), "item {i}");
    }
    assert_eq!(results[0]["partition_id"], results[2]["partition_id"]);
    assert_eq!(results[1]["partition_id"], results[4]["partition_id"]);
    assert_ne!(results[0]["partition_id"], results[1]["partition_id"]);
    assert_ne!(results[0]["partition_id"], results[3]["partition_id"]);
    // Positions follow the items' order within each partition.
    let orders_c1 = env.sql(
        "SELECT string_agg(convert_from(m.payload, 'UTF8')::jsonb->>'n', ',' ORDER BY m.pos) FROM comb.messages m
         JOIN comb.partitions p ON p.id = m.partition_id JOIN comb.queues q ON q.id = p.queue_id
         WHERE q.name = 'orders' AND p.name = 'c1'",
    );
    assert_eq!(orders_c1, "0,2,5");
}

#[tokio::test]
async fn pop_returns_messages_in_order_with_every_field() {
    let env = Env::start().await;
    let pushed = env
        .push(json!([
            {"queue": "q", "partition": "p", "payload": {"n": 1}, "traceId": "t"},
            {"queue": "q", "partition": "p", "payload": {"n": 2}},
            {"queue": "q", "partition": "p", "payload": {"n": 3}},
        ]))
        .await;
    let pop = env
        .pop("/api/v1/pop/queue/q?batch=2")
        .await
        .expect("messages");
    assert_eq!(pop["success"], true);
    assert_eq!(pop["queue"], "q");
    assert_eq!(pop["partition"], "p");
    assert_eq!(pop["partitionId"], pushed[0]["partition_id"]);
    assert_eq!(pop["consumerGroup"], "__QUEUE_MODE__");
    assert_eq!(pop["partitionsClaimed"], 1);
    assert_eq!(numbers(&pop), vec![1, 2]);
    let m = &pop["messages"][0];
    assert_eq!(m["id"], pushed[0]["message_id"]);
    assert_eq!(m["transactionId"], pushed[0]["transaction_id"]);
    assert_eq!(m["traceId"], "t");
    assert_eq!(m["partition"], "p");
    assert_eq!(m["partitionId"], pushed[0]["partition_id"]);
    assert_eq!(m["leaseId"], pop["leaseId"]);
    assert_eq!(m["consumerGroup"], "__QUEUE_MODE__");
    assert_eq!(m["attempt"], 1);
    assert!(chrono::DateTime::parse_from_rfc3339(m["createdAt"].as_str().unwrap()).is_ok());
}

#[tokio::test]
async fn pop_of_a_named_partition_and_pop_by_post() {
    let env = Env::start().await;
    env.push(json!([
        {"queue": "q", "partition": "a", "payload": {"n": 1}},
        {"queue": "q", "partition": "b", "payload": {"n": 2}},
    ]))
    .await;
    let b = env
        .pop("/api/v1/pop/queue/q/partition/b?autoAck=true")
        .await
        .unwrap();
    assert_eq!(b["partition"], "b");
    assert_eq!(numbers(&b), vec![2]);
    assert!(env.pop("/api/v1/pop/queue/q/partition/b").await.is_none());
    assert!(
        env.pop("/api/v1/pop/queue/q/partition/missing")
            .await
            .is_none()
    );
    let (status, a) = env
        .post(
            "/api/v1/pop",
            &json!({"queue": "q", "partition": "a", "batch": 5, "autoAck": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{a}");
    assert_eq!(numbers(&a), vec![1]);
    let (status, _) = env.post("/api/v1/pop", &json!({"queue": "q"})).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn ack_single_and_batch_move_the_position() {
    let env = Env::start().await;
    env.push(json!([
        {"queue": "q", "payload": {"n": 1}},
        {"queue": "q", "payload": {"n": 2}},
        {"queue": "q", "payload": {"n": 3}},
    ]))
    .await;
    let pop = env.pop("/api/v1/pop/queue/q?batch=3").await.unwrap();
    let msgs = pop["messages"].as_array().unwrap();
    // Single ack of the last one first: out of order, position cannot move yet.
    let (s, one) = env
        .post(
            "/api/v1/ack",
            &json!({
                "transactionId": msgs[2]["transactionId"],
                "partitionId": msgs[2]["partitionId"],
                "leaseId": msgs[2]["leaseId"],
                "status": "completed",
            }),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{one}");
    assert_eq!(one[0]["success"], true);
    assert_eq!(one[0]["queueName"], "q");
    assert_eq!(one[0]["partitionName"], "Default");
    assert_eq!(one[0]["leaseReleased"], false);
    assert_eq!(env.sql("SELECT cursor_pos FROM comb.cursors_now"), "0");
    // The batch settles the rest and releases the lease.
    let first_two = json!({"messages": [msgs[0].clone(), msgs[1].clone()]});
    let results = env.ack_all(&first_two, "completed", None).await;
    assert!(results.iter().all(|r| r["success"] == true), "{results:?}");
    assert_eq!(results[1]["leaseReleased"], true);
    assert_eq!(env.sql("SELECT cursor_pos FROM comb.cursors_now"), "3");
    assert!(env.pop("/api/v1/pop/queue/q").await.is_none());
}

#[tokio::test]
async fn configure_merges_options() {
    let env = Env::start().await;
    let (s, first) = env
        .post(
            "/api/v1/configure",
            &json!({"queue": "q", "options": {"leaseTime": 30, "retryLimit": 5}}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{first}");
    assert_eq!(first["configured"], true);
    assert_eq!(first["options"]["leaseTime"], 30);
    assert_eq!(first["options"]["retryDelay"], 1000, "defaults filled in");
    let (_, second) = env
        .post(
            "/api/v1/configure",
            &json!({"queue": "q", "options": {"retryLimit": 7}}),
        )
        .await;
    assert_eq!(second["options"]["leaseTime"], 30, "kept: {second}");
    assert_eq!(second["options"]["retryLimit"], 7);
    // A configured queue's lease time is the one a pop takes.
    env.push(json!([{"queue": "q", "payload": 1}])).await;
    env.pop("/api/v1/pop/queue/q").await.unwrap();
    let secs: f64 = env
        .sql("SELECT extract(epoch FROM lease_expires_at - now()) FROM comb.cursors_now")
        .parse()
        .unwrap();
    assert!(secs > 20.0 && secs <= 30.0, "lease of {secs}s");
}

#[tokio::test]
async fn health_ready_and_openapi() {
    let env = Env::start().await;
    let (s, h) = env.get("/health").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(h["database"], "connected");
    // Which build answered and the schema it knows, for rolling upgrades.
    assert_eq!(h["status"], "healthy");
    assert_eq!(h["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        h["schemaVersion"].to_string(),
        env.sql("SELECT max(version) FROM comb.migrations")
    );
    let (s, r) = env.get("/ready").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(r["ready"], true);
    let (s, doc) = env.get("/api/v1/openapi.json").await;
    assert_eq!(s, StatusCode::OK);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    assert!(doc["paths"]["/api/v1/push"]["post"].is_object());
}
