//! The administration API over HTTP against a real server and PostgreSQL: resources, clear,
//! consumer groups and seeks, messages, dead-letter requeue and purge, maintenance modes,
//! and the problems bad requests get.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::common::{self, Env, numbers};
use reqwest::StatusCode;
use serde_json::{Value, json};

fn items(queue: &str, partition: &str, from: i64, to: i64) -> Value {
    json!(
        (from..to)
            .map(
                |n| json!({"queue": queue, "partition": partition, "payload": {"n": n},
                             "transactionId": format!("{partition}-{n}")})
            )
            .collect::<Vec<_>>()
    )
}

fn queue_entry<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == name)
        .unwrap_or_else(|| panic!("{name} not listed: {list}"))
}

async fn ok(env: &Env, path: &str) -> Value {
    let (s, body) = env.get(path).await;
    assert_eq!(s, StatusCode::OK, "{path}: {body}");
    body
}

#[tokio::test]
async fn resources_show_depth_in_flight_dead_letters_and_oldest_pending() {
    let env = Env::start().await;
    let (s, body) = env
        .post(
            "/api/v1/configure",
            &json!({"queue": "orders", "namespace": "billing", "task": "invoice",
                    "options": {"retryLimit": 0}}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    env.push(items("orders", "p1", 0, 5)).await;
    env.push(items("orders", "p2", 0, 3)).await;
    env.push(items("other", "Default", 0, 1)).await;

    // Two of p1 leased out.
    let pop = env
        .pop("/api/v1/pop/queue/orders/partition/p1?batch=2")
        .await
        .unwrap();
    assert_eq!(numbers(&pop), vec![0, 1]);

    let list = ok(&env, "/api/v1/resources/queues").await;
    assert_eq!(list["total"], 2);
    let orders = queue_entry(&list, "orders");
    assert_eq!(orders["namespace"], "billing");
    assert_eq!(orders["partitions"], 2);
    assert_eq!(orders["messages"]["total"], 8);
    assert_eq!(orders["messages"]["processing"], 2);
    assert_eq!(orders["messages"]["pending"], 6);
    assert_eq!(orders["deadLetters"], 0);
    assert!(orders["oldestPendingAt"].is_string(), "{orders}");
    assert!(orders["oldestPendingAgeSeconds"].as_f64().unwrap() >= 0.0);

    // Filters and paging.
    let billing = ok(&env, "/api/v1/resources/queues?namespace=billing").await;
    assert_eq!(billing["total"], 1);
    let page = ok(&env, "/api/v1/resources/queues?limit=1&offset=1").await;
    assert_eq!(page["queues"].as_array().unwrap().len(), 1);
    assert_eq!(page["queues"][0]["name"], "other");

    // The first message fails once: at retryLimit 0 it is a dead letter.
    let first = &pop["messages"][0];
    let (s, body) = env.ack(first, "failed", None, Some("boom")).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let detail = ok(&env, "/api/v1/resources/queues/orders").await;
    assert_eq!(detail["deadLetters"], 1, "{detail}");
    assert_eq!(env.sql("SELECT count(*) FROM comb.dead_letters"), "1");
    let parts = detail["partitionList"].as_array().unwrap();
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0]["name"], "p1");
    assert_eq!(parts[0]["messages"]["total"], 5);
    assert_eq!(parts[1]["messages"]["pending"], 3);
    let groups = detail["consumerGroups"].as_array().unwrap();
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0]["name"], "__QUEUE_MODE__");

    let partitions = ok(&env, "/api/v1/resources/partitions?queue=orders&limit=1").await;
    assert_eq!(partitions["total"], 2);
    assert_eq!(partitions["partitions"].as_array().unwrap().len(), 1);
    assert_eq!(partitions["partitions"][0]["queue"], "orders");
    let all = ok(&env, "/api/v1/resources/partitions").await;
    assert_eq!(all["total"], 3);

    let namespaces = ok(&env, "/api/v1/resources/namespaces").await;
    assert_eq!(namespaces["namespaces"][0]["namespace"], "billing");
    assert_eq!(namespaces["namespaces"][0]["queues"], 1);
    assert_eq!(namespaces["namespaces"][0]["messages"]["total"], 8);
    let tasks = ok(&env, "/api/v1/resources/tasks").await;
    assert_eq!(tasks["tasks"][0]["task"], "invoice");

    let overview = ok(&env, "/api/v1/resources/overview").await;
    assert_eq!(overview["queues"], 2);
    assert_eq!(overview["partitions"], 3);
    assert_eq!(overview["namespaces"], 1);
    assert_eq!(overview["messages"]["total"], 9);
    assert_eq!(overview["messages"]["deadLetters"], 1);
}

#[tokio::test]
async fn clear_passes_what_is_pending_by_moving_cursors_and_keeps_every_row() {
    let env = Env::start().await;
    env.push(items("c", "p1", 0, 4)).await;
    env.push(items("c", "p2", 0, 2)).await;

    // No group reads the queue yet: clearing one partition still sticks.
    let (s, body) = env.delete("/api/v1/queues/c/clear?partition=p2").await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["messagesCleared"], 2);
    let got: Vec<i64> = env
        .drain("/api/v1/pop/queue/c?batch=10&autoAck=true")
        .await
        .iter()
        .map(|m| m["data"]["n"].as_i64().unwrap())
        .collect();
    assert_eq!(got, vec![0, 1, 2, 3], "p2 was cleared, p1 was not");

    env.push(items("c", "p1", 10, 12)).await;
    env.push(items("c", "p2", 10, 11)).await;
    let (s, body) = env.delete("/api/v1/queues/c/clear").await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["messagesCleared"], 3);
    assert!(env.pop("/api/v1/pop/queue/c?autoAck=true").await.is_none());
    // Rows are never deleted row by row.
    assert_eq!(env.message_count(), 9);
    env.push(items("c", "p2", 20, 21)).await;
    let pop = env.pop("/api/v1/pop/queue/c?autoAck=true").await.unwrap();
    assert_eq!(numbers(&pop), vec![20]);

    let (s, body) = env.delete("/api/v1/queues/nope/clear").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(body["code"], "queue_not_found");
    let (s, body) = env.delete("/api/v1/queues/c/clear?partition=nope").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(body["code"], "partition_not_found");
}

async fn drained(env: &Env, queue: &str, group: &str) -> Vec<i64> {
    env.drain(&format!(
        "/api/v1/pop/queue/{queue}?batch=10&autoAck=true&consumerGroup={group}"
    ))
    .await
    .iter()
    .map(|m| m["data"]["n"].as_i64().unwrap())
    .collect()
}

fn sorted(mut v: Vec<i64>) -> Vec<i64> {
    v.sort();
    v
}

#[tokio::test]
async fn a_groups_detail_pages_the_partitions_of_each_queue() {
    let env = Env::start().await;
    for (k, partition) in ["p1", "p2", "p3", "p4", "p5"].iter().enumerate() {
        env.push(items("wide", partition, k as i64, k as i64 + 1))
            .await;
    }
    env.push(items("narrow", "only", 10, 11)).await;
    for queue in ["wide", "narrow"] {
        let (s, body) = env
            .post(
                &format!("/api/v1/consumer-groups/g/queues/{queue}/seek"),
                &json!({"toStart": true}),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{body}");
    }
    let names = |queue: &Value| -> Vec<String> {
        queue["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["partition"].as_str().unwrap().to_string())
            .collect()
    };
    // A page of each queue's partitions, in name order, with how many there are.
    let page = ok(&env, "/api/v1/consumer-groups/g?limit=2&offset=2").await;
    assert_eq!(
        (page["limit"].clone(), page["offset"].clone()),
        (json!(2), json!(2))
    );
    let queues = page["queues"].as_array().unwrap();
    assert_eq!(queues.len(), 2, "{page}");
    let wide = queues.iter().find(|q| q["queue"] == "wide").unwrap();
    assert_eq!(names(wide), ["p3", "p4"]);
    assert_eq!(wide["partitionsTotal"], 5);
    assert_eq!(
        wide["lag"], 5,
        "the group's lag covers every partition: {wide}"
    );
    let narrow = queues.iter().find(|q| q["queue"] == "narrow").unwrap();
    assert_eq!(names(narrow), Vec::<String>::new());
    assert_eq!(narrow["partitionsTotal"], 1);
    // The default page holds up to 100; `queue` keeps one queue.
    let one = ok(&env, "/api/v1/consumer-groups/g?queue=wide").await;
    assert_eq!(one["queues"].as_array().unwrap().len(), 1, "{one}");
    assert_eq!(names(&one["queues"][0]), ["p1", "p2", "p3", "p4", "p5"]);
    assert_eq!(one["limit"], 100);
    let (s, body) = env.get("/api/v1/consumer-groups/g?queue=elsewhere").await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["code"], "consumer_group_not_found");
    for (query, code) in [
        ("limit=0", "limit_invalid"),
        ("limit=1001", "limit_invalid"),
        ("offset=-1", "parameter_invalid"),
        ("queue=bad%20name", "queue_name_invalid"),
    ] {
        let (s, body) = env.get(&format!("/api/v1/consumer-groups/g?{query}")).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["code"], code, "{query}: {body}");
    }
}

#[tokio::test]
async fn consumer_groups_show_lag_and_leases_and_seek_moves_every_partition() {
    let env = Env::start().await;
    env.push(items("g", "p1", 0, 2)).await;
    env.push(items("g", "p2", 2, 3)).await;
    // Group a holds a lease on one partition; group b read everything.
    let leased = env
        .pop("/api/v1/pop/queue/g/partition/p1?batch=1&consumerGroup=a")
        .await
        .unwrap();
    assert_eq!(sorted(drained(&env, "g", "b").await), vec![0, 1, 2]);

    let list = ok(&env, "/api/v1/consumer-groups").await;
    let list = list.as_array().unwrap();
    let a = list.iter().find(|g| g["name"] == "a").unwrap();
    let b = list.iter().find(|g| g["name"] == "b").unwrap();
    assert_eq!(a["totalLag"], 3, "{a}");
    assert_eq!(a["queues"][0]["queue"], "g");
    assert_eq!(a["queues"][0]["leasedPartitions"], 1);
    assert!(a["maxLagSeconds"].as_f64().unwrap() >= 0.0);
    assert_eq!(b["totalLag"], 0, "{b}");

    let detail = ok(&env, "/api/v1/consumer-groups/a").await;
    let parts = detail["queues"][0]["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0]["partition"], "p1");
    assert_eq!(parts[0]["leaseId"], leased["messages"][0]["leaseId"]);
    assert_eq!(parts[0]["head"], 2);
    assert_eq!(parts[1]["leaseId"], Value::Null);
    let (s, body) = env.get("/api/v1/consumer-groups/nobody").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(body["code"], "consumer_group_not_found");

    let lagging = ok(&env, "/api/v1/consumer-groups/lagging?minLagSeconds=0").await;
    let lagging = lagging.as_array().unwrap();
    assert_eq!(lagging.len(), 2, "a lags in both partitions: {lagging:?}");
    assert!(lagging.iter().all(|l| l["consumerGroup"] == "a"));
    let none = ok(&env, "/api/v1/consumer-groups/lagging?minLagSeconds=3600").await;
    assert_eq!(none, json!([]));

    // Seeks: to the start, to the end, one partition, a time.
    let seek = |g: &str, body: Value| {
        let path = format!("/api/v1/consumer-groups/{g}/queues/g/seek");
        let env = &env;
        async move { env.post(&path, &body).await }
    };
    let (s, body) = seek("b", json!({"toStart": true})).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["partitionsMoved"], 2);
    assert_eq!(sorted(drained(&env, "g", "b").await), vec![0, 1, 2]);
    let (s, body) = env
        .post(
            "/api/v1/consumer-groups/b/queues/g/partitions/p1/seek",
            &json!({"toStart": true}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["partitionsMoved"], 1);
    assert_eq!(drained(&env, "g", "b").await, vec![0, 1]);
    // A group that never read the queue: every partition moves.
    let (s, body) = seek("c", json!({"toEnd": true})).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["partitionsMoved"], 2);
    assert!(drained(&env, "g", "c").await.is_empty());
    let between =
        env.sql("SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')");
    env.push(items("g", "p1", 3, 4)).await;
    env.push(items("g", "p2", 4, 5)).await;
    assert_eq!(sorted(drained(&env, "g", "c").await), vec![3, 4]);
    let (s, body) = seek("c", json!({"timestamp": between})).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(sorted(drained(&env, "g", "c").await), vec![3, 4]);
    let (s, body) = seek("c", json!({"toEnd": true, "timestamp": "2026-01-01"})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(body["code"], "seek_target_invalid");

    // Subscription moved forward: a's older messages are passed, not the new ones.
    let (s, body) = env
        .post(
            "/api/v1/consumer-groups/a/subscription",
            &json!({"subscriptionTimestamp": between}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["queuesUpdated"], 1);
    assert_eq!(sorted(drained(&env, "g", "a").await), vec![3, 4]);

    // Deleting b's reading of the queue: gone from the listing; its next pop starts anew
    // (its old cursor versions must not win over the new ones).
    let (s, body) = env
        .delete("/api/v1/consumer-groups/b/queues/g?deleteMetadata=true")
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["deletedPartitions"], 2);
    let (s, _) = env.get("/api/v1/consumer-groups/b").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(sorted(drained(&env, "g", "b").await), vec![0, 1, 2, 3, 4]);
    // Without deleteMetadata the group starts again where it subscribed.
    let (s, body) = env
        .delete("/api/v1/consumer-groups/b/queues/g?deleteMetadata=false")
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(sorted(drained(&env, "g", "b").await), vec![0, 1, 2, 3, 4]);
}

#[tokio::test]
async fn messages_are_listed_by_status_and_deleted_retried_or_dead_lettered_one_by_one() {
    let env = Env::start().await;
    env.configure("m", json!({"retryLimit": 3})).await;
    let pushed = env.push(items("m", "p1", 0, 4)).await;
    let pid = pushed[0]["partition_id"].as_str().unwrap().to_string();
    let leased = env.pop("/api/v1/pop/queue/m?batch=1").await.unwrap();
    assert_eq!(numbers(&leased), vec![0]);

    let list = ok(&env, "/api/v1/messages?queue=m").await;
    let statuses: BTreeMap<String, String> = list["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["transactionId"].as_str().unwrap().to_string(),
                m["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(statuses.len(), 4);
    assert_eq!(statuses["p1-0"], "processing");
    assert_eq!(statuses["p1-1"], "pending");
    let pending = ok(&env, "/api/v1/messages?queue=m&status=pending").await;
    assert_eq!(pending["messages"].as_array().unwrap().len(), 3);
    let paged = ok(&env, "/api/v1/messages?queue=m&partition=p1&limit=2").await;
    assert_eq!(paged["messages"].as_array().unwrap().len(), 2);

    let one = ok(&env, &format!("/api/v1/messages/{pid}/p1-1")).await;
    assert_eq!(one["data"]["n"], 1);
    assert_eq!(one["consumerGroups"][0]["status"], "pending");

    // Delete p1-1: settled for the group, never handed out.
    let (s, body) = env.delete(&format!("/api/v1/messages/{pid}/p1-1")).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["consumerGroups"], json!(["__QUEUE_MODE__"]));
    // p1-0 fails once: pending again with an attempt; retry resets it.
    let (s, _) = env.ack(&leased["messages"][0], "failed", None, None).await;
    assert_eq!(s, StatusCode::OK);
    let one = ok(&env, &format!("/api/v1/messages/{pid}/p1-0")).await;
    assert_eq!(one["consumerGroups"][0]["attempts"], 1, "{one}");
    let (s, body) = env
        .post(&format!("/api/v1/messages/{pid}/p1-0/retry"), &json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let one = ok(&env, &format!("/api/v1/messages/{pid}/p1-0")).await;
    assert_eq!(one["consumerGroups"][0]["attempts"], 0, "{one}");

    // p1-3 to the dead letters by hand.
    let (s, body) = env
        .post(&format!("/api/v1/messages/{pid}/p1-3/dlq"), &json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let dead = ok(&env, "/api/v1/messages?queue=m&status=dead_letter").await;
    assert_eq!(dead["messages"][0]["transactionId"], "p1-3");
    assert_eq!(dead["messages"][0]["status"], "dead_letter");
    assert_eq!(dead["messages"][0]["retryCount"], 0, "{dead}");
    let one = ok(&env, &format!("/api/v1/messages/{pid}/p1-3")).await;
    assert_eq!(one["consumerGroups"][0]["status"], "dead_letter", "{one}");
    assert_eq!(one["deadLetters"][0]["consumerGroup"], "__QUEUE_MODE__");
    assert_eq!(one["deadLetters"][0]["requeuedAt"], Value::Null, "{one}");
    assert_eq!(
        sorted(drained(&env, "m", "__QUEUE_MODE__").await),
        vec![0, 2],
        "deleted and dead-lettered messages are not handed out"
    );
    let completed = ok(&env, "/api/v1/messages?queue=m&status=completed").await;
    assert_eq!(completed["messages"].as_array().unwrap().len(), 3);

    // Retrying a dead letter requeues it.
    let (s, body) = env
        .post(&format!("/api/v1/messages/{pid}/p1-3/retry"), &json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["requeued"], 1);
    assert_eq!(drained(&env, "m", "__QUEUE_MODE__").await, vec![3]);
    let one = ok(&env, &format!("/api/v1/messages/{pid}/p1-3")).await;
    assert_eq!(one["consumerGroups"][0]["status"], "completed");
    assert!(one["deadLetters"][0]["requeuedAt"].is_string(), "{one}");

    // A settled message cannot be retried or dead-lettered.
    let (s, body) = env
        .post(&format!("/api/v1/messages/{pid}/p1-2/retry"), &json!({}))
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert_eq!(body["code"], "message_not_failed");
    let (s, body) = env.get(&format!("/api/v1/messages/{pid}/nope")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(body["code"], "message_not_found");
    let (s, body) = env.get("/api/v1/messages/not-a-uuid/x").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(body["code"], "partition_id_invalid");
}

#[tokio::test]
async fn a_message_deleted_or_dead_lettered_before_any_group_reads_it_stays_so() {
    let env = Env::start().await;
    let pushed = env.push(items("u", "p1", 0, 3)).await;
    let pid = pushed[0]["partition_id"].as_str().unwrap().to_string();
    // No group has read the queue: the queue-mode group is subscribed to record the change.
    let (s, body) = env.delete(&format!("/api/v1/messages/{pid}/p1-0")).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["consumerGroups"], json!(["__QUEUE_MODE__"]));
    let (s, body) = env
        .post(&format!("/api/v1/messages/{pid}/p1-1/dlq"), &json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["consumerGroups"], json!(["__QUEUE_MODE__"]));
    let dead = ok(&env, "/api/v1/messages?queue=u&status=dead_letter").await;
    assert_eq!(dead["messages"][0]["transactionId"], "p1-1");
    assert_eq!(drained(&env, "u", "__QUEUE_MODE__").await, vec![2]);
}

/// Makes every third message of each partition a dead letter of group `w`.
async fn dead_letter_every_third(env: &Env, queue: &str, partitions: usize, per: i64) {
    env.configure(queue, json!({"retryLimit": 0})).await;
    for p in 0..partitions {
        env.push(items(queue, &format!("p{p}"), 0, per)).await;
    }
    loop {
        let Some(pop) = env
            .pop(&format!(
                "/api/v1/pop/queue/{queue}?batch=50&consumerGroup=w"
            ))
            .await
        else {
            break;
        };
        // One request: a failure ends the lease only for later requests.
        let acks: Vec<Value> = pop["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let n = m["data"]["n"].as_i64().unwrap();
                json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                       "leaseId": m["leaseId"], "consumerGroup": "w", "error": "bad",
                       "status": if n % 3 == 0 { "failed" } else { "completed" }})
            })
            .collect();
        let (s, body) = env
            .post(
                "/api/v1/ack/batch",
                &json!({"consumerGroup": "w", "acknowledgments": acks}),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{body}");
    }
}

#[tokio::test]
async fn requeue_sends_dead_letters_back_in_order_to_their_group_only_under_racing_consumers() {
    let env = Env::start().await;
    let (partitions, per) = (4, 30);
    dead_letter_every_third(&env, "r", partitions, per).await;
    let expected = partitions * (per as usize).div_ceil(3);
    assert_eq!(
        env.sql("SELECT count(*) FROM comb.dead_letters"),
        expected.to_string()
    );
    // Another group has read everything.
    assert_eq!(
        drained(&env, "r", "other").await.len(),
        partitions * per as usize
    );

    // Four consumers of w pop while the requeue runs.
    let seen: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut consumers = Vec::new();
    for _ in 0..4 {
        let (http, url, seen, done) = (
            common::client(),
            env.url("/api/v1/pop/queue/r?batch=3&autoAck=true&consumerGroup=w"),
            seen.clone(),
            done.clone(),
        );
        consumers.push(tokio::spawn(async move {
            let mut empty_after_done = 0;
            loop {
                let (s, body) = common::get_url(&http, &url).await;
                if s == StatusCode::NO_CONTENT {
                    if done.load(std::sync::atomic::Ordering::SeqCst) {
                        empty_after_done += 1;
                        if empty_after_done > 2 {
                            return;
                        }
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    continue;
                }
                assert_eq!(s, StatusCode::OK, "{body}");
                let batch: Vec<(String, i64)> = body["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| {
                        (
                            m["partitionId"].as_str().unwrap().to_string(),
                            m["data"]["n"].as_i64().unwrap(),
                        )
                    })
                    .collect();
                // A batch comes from one partition, in the original order.
                assert!(
                    batch
                        .windows(2)
                        .all(|w| w[0].0 == w[1].0 && w[0].1 < w[1].1),
                    "{batch:?}"
                );
                seen.lock().unwrap().extend(batch);
            }
        }));
    }
    let (s, body) = env
        .post(
            "/api/v1/dlq/requeue",
            &json!({"queue": "r", "consumerGroup": "w"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["requeued"], expected);
    assert_eq!(body["messages"], expected);
    assert_eq!(body["remaining"], 0);
    assert_eq!(body["consumerGroups"], json!(["w"]));
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    for c in consumers {
        c.await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), expected, "each requeued message once: {seen:?}");
    let distinct: HashSet<_> = seen.iter().cloned().collect();
    assert_eq!(distinct.len(), expected);
    assert!(seen.iter().all(|(_, n)| n % 3 == 0));
    // Stored again in original order, per partition.
    assert_eq!(
        env.sql(
            "SELECT count(*) FROM (
                SELECT r.pos - lag(r.pos) OVER (PARTITION BY d.partition_id ORDER BY d.pos) AS step
                FROM comb.dead_letters d JOIN comb.dead_letter_requeues r ON r.dead_letter_id = d.id
             ) s WHERE step <> 1"
        ),
        "0"
    );
    // The other group never sees the copies; a second requeue finds nothing.
    assert!(drained(&env, "r", "other").await.is_empty());
    let (s, body) = env
        .post(
            "/api/v1/dlq/requeue",
            &json!({"queue": "r", "consumerGroup": "w"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["requeued"], 0);
    // Each entry records it was requeued.
    let entry =
        env.sql("SELECT partition_id || '/' || transaction_id FROM comb.dead_letters LIMIT 1");
    let one = ok(&env, &format!("/api/v1/messages/{entry}")).await;
    assert!(one["deadLetters"][0]["requeuedAt"].is_string(), "{one}");
    assert_eq!(
        env.sql("SELECT count(*) FROM comb.dead_letter_requeues"),
        expected.to_string()
    );
    let (s, listed) = env.get("/api/v1/resources/queues/r").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(listed["deadLetters"], 0, "requeued entries are not counted");
}

#[tokio::test]
async fn dead_letters_are_requeued_one_by_id_and_purged_by_filter() {
    let env = Env::start().await;
    dead_letter_every_third(&env, "d", 2, 6).await;
    let ids: Vec<String> = env
        .sql("SELECT id FROM comb.dead_letters ORDER BY partition_id, pos")
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(ids.len(), 4);
    let (s, body) = env
        .post(
            "/api/v1/dlq/requeue",
            &json!({"queue": "d", "ids": [ids[0]]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["requeued"], 1);
    assert_eq!(drained(&env, "d", "w").await, vec![0]);

    let (s, body) = env
        .post(
            "/api/v1/dlq/purge",
            &json!({"queue": "d", "partition": "p1"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["purged"], 2);
    let (s, body) = env
        .post(
            "/api/v1/dlq/purge",
            &json!({"queue": "d", "consumerGroup": "w"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["purged"], 2, "the requeued entry too");
    assert_eq!(env.sql("SELECT count(*) FROM comb.dead_letters"), "0");
    assert_eq!(
        env.sql("SELECT count(*) FROM comb.dead_letter_requeues"),
        "0"
    );

    for (body, code) in [
        (json!({}), "queue_name_invalid"),
        (json!({"queue": "d", "ids": "x"}), "ids_invalid"),
        (json!({"queue": "d", "ids": ["not-a-uuid"]}), "ids_invalid"),
        (
            json!({"queue": "d", "from": "yesterday"}),
            "parameter_invalid",
        ),
    ] {
        let (s, answer) = env.post("/api/v1/dlq/requeue", &body).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["code"], code, "{body}: {answer}");
    }
    let (s, answer) = env
        .post("/api/v1/dlq/purge", &json!({"queue": "nope"}))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(answer["code"], "queue_not_found");
}

#[tokio::test]
async fn maintenance_modes_hold_pushes_and_pops_on_every_server() {
    let env = Env::start().await;
    env.push(items("mm", "p", 0, 1)).await;
    let other = env.second_server().await;

    let (s, body) = env
        .post("/api/v1/system/maintenance", &json!({"enabled": true}))
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["maintenanceMode"], true);
    let (s, r, body) = env
        .post_full("/api/v1/push", &json!({"items": items("mm", "p", 1, 2)}))
        .await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["code"], "maintenance_mode");
    assert!(r.get("retry-after").is_some());
    assert_eq!(env.message_count(), 1, "nothing stored");
    // The other server sees the mode within about a second (on a loaded machine, later).
    let url = format!("{}/api/v1/push", other.base_url());
    common::until("the other server refuses pushes too", || async {
        let r = env
            .http
            .post(&url)
            .json(&json!({"items": items("mm", "p", 2, 3)}))
            .send()
            .await
            .unwrap();
        if r.status() != StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(r.status(), StatusCode::CREATED);
        }
        r.status() == StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    let (s, body) = env.get("/api/v1/system/maintenance").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(body["enabled"], true);
    let (s, _) = env
        .post("/api/v1/system/maintenance", &json!({"enabled": false}))
        .await;
    assert_eq!(s, StatusCode::OK);
    env.push(items("mm", "p", 3, 4)).await;

    let (s, body) = env
        .post("/api/v1/system/maintenance/pop", &json!({"enabled": true}))
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert!(env.pop("/api/v1/pop/queue/mm?autoAck=true").await.is_none());
    let (_, body) = env.get("/api/v1/system/maintenance/pop").await;
    assert_eq!(body["enabled"], true);
    env.post("/api/v1/system/maintenance/pop", &json!({"enabled": false}))
        .await;
    assert!(env.pop("/api/v1/pop/queue/mm?autoAck=true").await.is_some());

    let (s, body) = env.post("/api/v1/system/maintenance", &json!({})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(body["code"], "parameter_missing");
}

#[tokio::test]
async fn bad_administrative_requests_get_problems() {
    let env = Env::start().await;
    env.push(items("e", "p", 0, 1)).await;
    for (path, status, code) in [
        ("/api/v1/resources/queues?limit=0", 400, "limit_invalid"),
        ("/api/v1/resources/queues?limit=5000", 400, "limit_invalid"),
        (
            "/api/v1/resources/queues?offset=-1",
            400,
            "parameter_invalid",
        ),
        ("/api/v1/resources/queues/nope", 404, "queue_not_found"),
        (
            "/api/v1/resources/partitions?queue=nope",
            404,
            "queue_not_found",
        ),
        ("/api/v1/messages?status=lost", 400, "status_invalid"),
        ("/api/v1/messages?partition=p", 400, "queue_required"),
        (
            "/api/v1/messages?queue=e&from=soon",
            400,
            "parameter_invalid",
        ),
        (
            "/api/v1/consumer-groups/lagging?minLagSeconds=x",
            400,
            "parameter_invalid",
        ),
    ] {
        let (s, body) = env.get(path).await;
        assert_eq!(s.as_u16(), status, "{path}: {body}");
        assert_eq!(body["code"], code, "{path}: {body}");
    }
    let (s, body) = env
        .post(
            "/api/v1/consumer-groups/g/queues/nope/seek",
            &json!({"toEnd": true}),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(body["code"], "queue_not_found");
    let (s, body) = env
        .post("/api/v1/consumer-groups/g/queues/e/seek", &json!({}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(body["code"], "seek_target_invalid");
    let (s, body) = env
        .post_raw("/api/v1/consumer-groups/g/queues/e/seek", b"{".to_vec())
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(body["code"], "json_invalid");
    let (s, body) = env
        .post("/api/v1/consumer-groups/g/subscription", &json!({}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(body["code"], "parameter_missing");
}

#[tokio::test]
async fn traces_are_recorded_and_read_by_message_by_name_and_as_names() {
    let env = Env::start().await;
    let pushed = env.push(items("t", "p", 0, 2)).await;
    let pid = pushed[0]["partition_id"].as_str().unwrap();
    for (tx, names, event) in [
        ("p-0", json!(["order-1", "checkout"]), "started"),
        ("p-0", json!("order-1"), "done"),
        ("p-1", json!(null), "info"),
    ] {
        let (s, body) = env
            .post(
                "/api/v1/traces",
                &json!({"partitionId": pid, "transactionId": tx, "traceNames": names,
                        "eventType": event, "data": {"step": event}}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
        assert_eq!(body["success"], true);
    }
    let of = ok(&env, &format!("/api/v1/traces/{pid}/p-0")).await;
    let of = of["traces"].as_array().unwrap();
    assert_eq!(of.len(), 2);
    assert_eq!(of[0]["eventType"], "started");
    assert_eq!(of[0]["traceNames"], json!(["checkout", "order-1"]));
    assert_eq!(of[1]["data"]["step"], "done");
    let by = ok(&env, "/api/v1/traces/by-name/order-1").await;
    let by = by["traces"].as_array().unwrap();
    assert_eq!(by.len(), 2);
    assert_eq!(by[0]["eventType"], "done", "newest first");
    assert_eq!(by[0]["queue"], "t");
    let names = ok(&env, "/api/v1/traces/names").await;
    let names: Vec<&str> = names["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["checkout", "order-1"]);
    let one = ok(&env, "/api/v1/traces/names?limit=1&offset=1").await;
    assert_eq!(one["names"][0]["name"], "order-1");

    for (body, status, code) in [
        (
            json!({"partitionId": pid, "transactionId": "p-0"}),
            400,
            "parameter_missing",
        ),
        (
            json!({"partitionId": "x", "transactionId": "p-0", "data": 1}),
            400,
            "partition_id_invalid",
        ),
        (
            json!({"partitionId": pid, "transactionId": "", "data": 1}),
            400,
            "field_invalid",
        ),
        (
            json!({"partitionId": pid, "transactionId": "p-0", "data": 1, "traceNames": [1]}),
            400,
            "field_invalid",
        ),
        (
            json!({"partitionId": pid, "transactionId": "p-0", "data": "x".repeat(70_000)}),
            400,
            "data_too_large",
        ),
        (
            json!({"partitionId": pid, "transactionId": "nope", "data": 1}),
            404,
            "message_not_found",
        ),
    ] {
        let (s, answer) = env.post("/api/v1/traces", &body).await;
        assert_eq!(s.as_u16(), status, "{answer}");
        assert_eq!(answer["code"], code, "{answer}");
    }
}

#[tokio::test]
async fn status_and_analytics_count_per_minute_from_every_server() {
    let env = Env::start_with(&["--stats-interval-ms", "200"]).await;
    env.configure("s", json!({"retryLimit": 0})).await;
    env.push(items("s", "p", 0, 5)).await;
    // Another queue's traffic, which analytics of `s` alone must not count.
    env.push(items("t", "p", 0, 2)).await;
    let pop = env.pop("/api/v1/pop/queue/s?batch=5").await.unwrap();
    let acks: Vec<Value> = pop["messages"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, m)| {
            json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                   "leaseId": m["leaseId"], "status": if i == 0 { "failed" } else { "completed" }})
        })
        .collect();
    let (s, _) = env
        .post("/api/v1/ack/batch", &json!({"acknowledgments": acks}))
        .await;
    assert_eq!(s, StatusCode::OK);
    // Wait for the counters of the acks, and a snapshot of `s` holding all five, to reach
    // the tables.
    common::until("the acks counted and the depth of s recorded", || async {
        let all = ok(&env, "/api/v1/status/analytics").await;
        let of_s = ok(&env, "/api/v1/status/analytics?queue=s").await;
        let depth_seen = of_s["timeSeries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["messages"] == 5);
        all["totals"]["acked"] == 4 && of_s["totals"]["acked"] == 4 && depth_seen
    })
    .await;
    let analytics = ok(&env, "/api/v1/status/analytics").await;
    assert_eq!(analytics["totals"]["pushed"], 7, "{analytics}");
    assert_eq!(analytics["totals"]["popped"], 5);
    assert_eq!(analytics["totals"]["failed"], 1);
    assert_eq!(analytics["totals"]["deadLettered"], 1);
    // One queue: its own throughput, from the per-queue counters each server writes.
    let of_t = ok(&env, "/api/v1/status/analytics?queue=t").await;
    assert_eq!(
        of_t["totals"],
        json!({"pushed": 2, "popped": 0, "acked": 0, "failed": 0, "deadLettered": 0}),
        "{of_t}"
    );
    let analytics = ok(&env, "/api/v1/status/analytics?queue=s").await;
    assert_eq!(
        analytics["totals"],
        json!({"pushed": 5, "popped": 5, "acked": 4, "failed": 1, "deadLettered": 1}),
        "{analytics}"
    );
    assert_eq!(analytics["totals"]["pushed"], 5, "{analytics}");
    assert_eq!(analytics["totals"]["popped"], 5);
    assert_eq!(analytics["totals"]["failed"], 1);
    assert_eq!(analytics["totals"]["deadLettered"], 1);
    assert_eq!(analytics["bucketMinutes"], 1);
    let series = analytics["timeSeries"].as_array().unwrap();
    assert!(series.iter().any(|b| b["messages"] == 5), "{analytics}");

    let status = ok(&env, "/api/v1/status").await;
    assert_eq!(status["queues"], 2);
    assert_eq!(status["totals"]["pushed"], 7);
    assert_eq!(status["leases"]["active"], 0);
    let queues = ok(&env, "/api/v1/status/queues").await;
    assert_eq!(queues["queues"][0]["name"], "s");
    let queue = ok(&env, "/api/v1/status/queues/s").await;
    assert_eq!(queue["deadLetters"], 1);
    assert!(queue["timeSeries"].is_array());
    let workers = ok(&env, "/api/v1/analytics/worker-metrics").await;
    assert_eq!(workers["workers"][0]["pushed"], 7, "{workers}");

    let pg = ok(&env, "/api/v1/analytics/postgres-stats").await;
    assert!(pg["databaseSizeBytes"].as_i64().unwrap() > 0);
    let tables: Vec<&str> = pg["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["table"].as_str().unwrap())
        .collect();
    assert!(
        tables.contains(&"messages") && tables.contains(&"cursor_states"),
        "{tables:?}"
    );
    let system = ok(&env, "/api/v1/analytics/system-metrics").await;
    assert!(system["requests"].as_u64().unwrap() > 0);
    assert!(system["uptimeSeconds"].as_f64().unwrap() > 0.0);
    let (s, body) = env.post("/api/v1/stats/refresh", &json!({})).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(body["success"], true);

    for path in [
        "/api/v1/status/analytics?from=2026-01-02&to=2026-01-01",
        "/api/v1/status/analytics?from=2026-01-01&to=2026-02-01",
        "/api/v1/status?from=later",
    ] {
        let (s, body) = env.get(path).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{path}: {body}");
    }
    let (s, body) = env.get("/api/v1/status/analytics?queue=nope").await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{body}");
}

#[tokio::test]
async fn a_dead_letter_from_an_expired_lease_counts_for_its_queue() {
    let env = Env::start_with(&["--stats-interval-ms", "200"]).await;
    env.configure("x", json!({"retryLimit": 0, "leaseTime": 1}))
        .await;
    env.push(items("x", "p", 0, 1)).await;
    env.push(items("y", "p", 0, 1)).await;
    env.pop("/api/v1/pop/queue/x?batch=1")
        .await
        .expect("a message");
    // The lease ends unsettled; a later claim dead-letters the message (retryLimit 0).
    let mut dead = false;
    for _ in 0..600 {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(env.pop("/api/v1/pop/queue/x?batch=1").await.is_none());
        if env.sql("SELECT count(*) FROM comb.dead_letters") == "1" {
            dead = true;
            break;
        }
    }
    assert!(dead, "the expired lease dead-lettered its message");
    let mut of_x = Value::Null;
    for _ in 0..600 {
        of_x = ok(&env, "/api/v1/status/analytics?queue=x").await;
        if of_x["totals"]["deadLettered"] != 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(
        of_x["totals"],
        json!({"pushed": 1, "popped": 1, "acked": 0, "failed": 0, "deadLettered": 1}),
        "{of_x}"
    );
    let of_y = ok(&env, "/api/v1/status/analytics?queue=y").await;
    assert_eq!(of_y["totals"]["deadLettered"], 0, "{of_y}");
}

#[tokio::test]
async fn daily_tables_are_made_ahead_and_dropped_whole_after_retention() {
    let env = Env::start_with(&["--maintenance-interval-ms", "200"]).await;
    env.sql(
        "CREATE TABLE comb.traces_20200101 PARTITION OF comb.traces
         FOR VALUES FROM ('2020-01-01') TO ('2020-01-02')",
    );
    let ahead = "SELECT count(*) FROM pg_inherits WHERE inhparent = 'comb.queue_minutes'::regclass";
    common::eventually(common::PATIENCE, "the expired day dropped", || {
        env.sql("SELECT to_regclass('comb.traces_20200101') IS NULL") == "t"
    })
    .await;
    assert!(
        env.sql(ahead).parse::<i64>().unwrap() >= 3,
        "today and two days ahead"
    );
}

/// Dead row versions in Comb's tables, by pgstattuple (exact, whatever the statistics say),
/// leaving out maintenance's bounded bookkeeping (segments, generations, runs) and the
/// modes operators toggle.
fn dead_tuples(env: &Env) -> i64 {
    env.sql(
        "SELECT coalesce(sum((pgstattuple(c.oid)).dead_tuple_count), 0)
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'comb' AND c.relkind = 'r'
           AND c.relname NOT IN ('segments', 'cursor_gens', 'maintenance_runs', 'system_modes',
                                 'migrations')",
    )
    .parse()
    .unwrap()
}

#[tokio::test]
async fn administration_under_a_held_snapshot_leaves_no_dead_rows() {
    let env = Env::start().await;
    env.sql("CREATE EXTENSION IF NOT EXISTS pgstattuple");
    env.configure("h", json!({"retryLimit": 0})).await;
    env.push(items("h", "p1", 0, 6)).await;
    let pushed = env.push(items("h", "p2", 0, 3)).await;
    let pid = pushed[0]["partition_id"].as_str().unwrap().to_string();
    let before = dead_tuples(&env);

    // A snapshot held open for the whole test.
    let (holder, conn) = tokio_postgres::connect(&env.db_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    holder
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM comb.queues")
        .await
        .unwrap();

    for path in [
        "/api/v1/resources/overview",
        "/api/v1/resources/queues",
        "/api/v1/resources/queues/h",
        "/api/v1/resources/partitions",
        "/api/v1/consumer-groups",
        "/api/v1/messages?queue=h",
        "/api/v1/status",
        "/api/v1/status/analytics",
    ] {
        ok(&env, path).await;
    }
    let pop = env
        .pop("/api/v1/pop/queue/h/partition/p1?batch=3")
        .await
        .unwrap();
    let (s, _) = env.ack(&pop["messages"][0], "failed", None, None).await;
    assert_eq!(s, StatusCode::OK);
    for (path, body) in [
        (
            "/api/v1/consumer-groups/x/queues/h/seek",
            json!({"toEnd": true}),
        ),
        (
            "/api/v1/consumer-groups/x/queues/h/seek",
            json!({"toStart": true}),
        ),
        (&format!("/api/v1/messages/{pid}/p2-1/dlq"), json!({})),
        ("/api/v1/dlq/requeue", json!({"queue": "h"})),
        (
            "/api/v1/traces",
            json!({"partitionId": pid, "transactionId": "p2-0", "data": {"a": 1}, "traceNames": ["n"]}),
        ),
    ] {
        let (s, answer) = env.post(path, &body).await;
        assert!(s.is_success(), "{path}: {answer}");
    }
    let (s, _) = env.delete(&format!("/api/v1/messages/{pid}/p2-2")).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = env.delete("/api/v1/queues/h/clear?partition=p1").await;
    assert_eq!(s, StatusCode::OK);
    ok(&env, "/api/v1/traces/by-name/n").await;
    ok(&env, "/api/v1/traces/names").await;

    assert_eq!(dead_tuples(&env), before, "no row was updated or deleted");
    holder.batch_execute("COMMIT").await.unwrap();
}

fn metric(text: &str, line_start: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn metrics_show_oldest_pending_age_dead_letters_from_expired_leases_and_lag_seconds() {
    let env = Env::start().await;
    env.configure("x", json!({"retryLimit": 0, "leaseTime": 1}))
        .await;
    env.push(items("x", "p", 0, 2)).await;
    let pop = env.pop("/api/v1/pop/queue/x?batch=1").await.unwrap();
    assert_eq!(numbers(&pop), vec![0]);
    // The lease ends unsettled; the next claim dead-letters the message (retryLimit 0).
    common::until("the expired lease dead-lettered its message", || async {
        let _ = env.pop("/api/v1/pop/queue/x?batch=1&autoAck=true").await;
        env.sql("SELECT count(*) FROM comb.dead_letters") == "1"
    })
    .await;
    let text = env.metrics_text().await;
    assert_eq!(
        metric(&text, "comb_messages_dead_lettered_total "),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "comb_dead_letters{queue=\"x\",group=\"__QUEUE_MODE__\"}"
        ),
        Some(1.0),
        "{text}"
    );
    assert!(
        metric(&text, "comb_queue_oldest_pending_seconds{queue=\"x\"}").is_some(),
        "{text}"
    );
    assert!(
        metric(
            &text,
            "comb_group_lag_seconds{queue=\"x\",group=\"__QUEUE_MODE__\"}"
        )
        .is_some(),
        "{text}"
    );
}
