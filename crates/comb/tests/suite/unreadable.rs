//! Nothing consumed that was not delivered: a payload a server cannot open (sealed with a key
//! it does not have, or bytes that are no longer JSON) is dead-lettered with its reason by the
//! pop that met it, the rest of the batch is delivered in order, and once the key is back a
//! requeue delivers it. On a Citus cluster the requeue answers 501 `unsupported_on_cluster`
//! (`docs/scale-out.md`) and the dead letter stays as it was.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{Env, numbers, on_citus};

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const KEY2: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

/// The status and JSON body (null when there is none) of a request.
async fn answer(request: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let r = request.send().await.expect("request");
    let status = r.status();
    let text = r.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn post_to(env: &Env, base: &str, path: &str, body: &Value) -> (StatusCode, Value) {
    answer(env.http.post(format!("{base}{path}")).json(body)).await
}

async fn get_from(env: &Env, base: &str, path: &str) -> (StatusCode, Value) {
    answer(env.http.get(format!("{base}{path}"))).await
}

async fn text_from(env: &Env, url: &str) -> String {
    let r = env.http.get(url).send().await.expect("request");
    r.text().await.expect("text")
}

async fn push_to(env: &Env, base: &str, n: i64) {
    let (s, b) = post_to(
        env,
        base,
        "/api/v1/push",
        &json!({"items": [{"queue": "sealed", "partition": "p", "payload": {"n": n}}]}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
}

/// Messages 1 and 3 sealed with the key of server B, message 2 with a key B does not have.
/// A pop through B hands out 1 and 3 in order and dead-lettering 2, with its reason, counted;
/// acked or auto-acked, nothing is left to hand out; server A (whose key opens 2) requeues it
/// and delivers it (on Citus: the requeue is refused and the dead letter stays listed).
async fn unreadable_in_the_middle(auto_ack: bool, group: Option<&str>) {
    let env = Env::start_with_env(&[], &[("COMB_ENCRYPTION_KEY", KEY)]).await;
    env.configure("sealed", json!({"encryptionEnabled": true}))
        .await;
    let b = env
        .second_server_with_env(&[("COMB_ENCRYPTION_KEY", KEY2)])
        .await;
    let b = format!("http://{}", b.addr());
    let a = env.server.base_url();
    push_to(&env, &b, 1).await;
    push_to(&env, &a, 2).await;
    push_to(&env, &b, 3).await;
    let mut query = format!("batch=10&autoAck={auto_ack}");
    if let Some(g) = group {
        query.push_str(&format!("&consumerGroup={g}"));
    }
    let (s, pop) = get_from(&env, &b, &format!("/api/v1/pop/queue/sealed?{query}")).await;
    assert_eq!(s, StatusCode::OK, "{pop}");
    assert_eq!(numbers(&pop), vec![1, 3], "{pop}");
    if !auto_ack {
        for m in pop["messages"].as_array().unwrap() {
            let mut ack = json!({"transactionId": m["transactionId"],
                                 "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                                 "status": "completed"});
            if let Some(g) = group {
                ack["consumerGroup"] = json!(g);
            }
            let (s, body) = post_to(&env, &b, "/api/v1/ack", &ack).await;
            assert_eq!(s, StatusCode::OK, "{body}");
            assert_eq!(body[0]["success"], true, "{body}");
        }
    }
    // Nothing more to hand out: 2 is settled as dead-lettered, 1 and 3 as delivered.
    let (s, again) = get_from(&env, &b, &format!("/api/v1/pop/queue/sealed?{query}")).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{again}");
    let metrics = text_from(&env, &format!("{b}/metrics")).await;
    assert!(
        metrics.contains("\ncomb_messages_unreadable_total 1\n"),
        "{metrics}"
    );
    let dlq_query = match group {
        Some(g) => format!("/api/v1/dlq?queue=sealed&consumerGroup={g}"),
        None => "/api/v1/dlq?queue=sealed".to_string(),
    };
    let (s, dlq) = get_from(&env, &b, &dlq_query).await;
    assert_eq!(s, StatusCode::OK, "{dlq}");
    assert_eq!(dlq["messages"].as_array().unwrap().len(), 1, "{dlq}");
    let letter = &dlq["messages"][0];
    assert!(
        letter["errorMessage"]
            .as_str()
            .unwrap()
            .starts_with("payload_unreadable"),
        "{letter}"
    );
    assert_eq!(letter["data"], json!({"encrypted": true}), "{letter}");
    // The dashboard's dead-letter page shows it with its reason.
    let page_query = match group {
        Some(g) => format!("/dead-letters?queue=sealed&group={g}"),
        None => "/dead-letters?queue=sealed".to_string(),
    };
    let page = text_from(&env, &format!("{b}{page_query}")).await;
    assert!(page.contains("payload_unreadable"), "{page}");
    // The key is back (server A): requeued, the message is delivered.
    let mut requeue = json!({"queue": "sealed", "ids": [letter["id"]]});
    if let Some(g) = group {
        requeue["consumerGroup"] = json!(g);
    }
    let (s, body) = post_to(&env, &a, "/api/v1/dlq/requeue", &requeue).await;
    if on_citus() {
        assert_eq!(s, StatusCode::NOT_IMPLEMENTED, "{body}");
        assert_eq!(body["code"], "unsupported_on_cluster", "{body}");
        // Listed through B as before (A, with the key, would show the payload opened).
        let (s, still) = get_from(&env, &b, &dlq_query).await;
        assert_eq!(s, StatusCode::OK, "{still}");
        assert_eq!(still["messages"], dlq["messages"], "the dead letter stays");
        let (s, pop) = get_from(&env, &a, &format!("/api/v1/pop/queue/sealed?{query}")).await;
        assert_eq!(s, StatusCode::NO_CONTENT, "nothing was requeued: {pop}");
        return;
    }
    assert_eq!(s, StatusCode::OK, "{body}");
    let (s, pop) = get_from(&env, &a, &format!("/api/v1/pop/queue/sealed?{query}")).await;
    assert_eq!(s, StatusCode::OK, "{pop}");
    assert_eq!(numbers(&pop), vec![2], "{pop}");
}

#[tokio::test]
async fn in_queue_mode_with_explicit_acks() {
    unreadable_in_the_middle(false, None).await;
}

#[tokio::test]
async fn in_queue_mode_with_auto_ack() {
    unreadable_in_the_middle(true, None).await;
}

#[tokio::test]
async fn in_a_group_with_explicit_acks() {
    unreadable_in_the_middle(false, Some("readers")).await;
}

#[tokio::test]
async fn in_a_group_with_auto_ack() {
    unreadable_in_the_middle(true, Some("readers")).await;
}

/// A queue whose encryption was switched off still holds sealed payloads: a server with the
/// key hands them out opened; one without it dead-letters them, also through a pop of
/// several partitions under one lease.
#[tokio::test]
async fn sealed_payloads_in_a_queue_no_longer_encrypted() {
    let env = Env::start_with_env(&[], &[("COMB_ENCRYPTION_KEY", KEY)]).await;
    let a = env.server.base_url();
    for queue in ["sealed", "both"] {
        env.configure(queue, json!({"encryptionEnabled": true}))
            .await;
    }
    push_to(&env, &a, 1).await;
    for (partition, n) in [("x", 10), ("y", 20)] {
        let (s, b) = post_to(
            &env,
            &a,
            "/api/v1/push",
            &json!({"items": [{"queue": "both", "partition": partition, "payload": {"n": n}}]}),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }
    for queue in ["sealed", "both"] {
        env.configure(queue, json!({"encryptionEnabled": false}))
            .await;
    }
    // A plain push after the switch; the server with the key opens the sealed one before it.
    push_to(&env, &a, 2).await;
    let pop = env
        .pop("/api/v1/pop/queue/sealed/partition/p?batch=10&autoAck=true")
        .await
        .expect("messages");
    assert_eq!(numbers(&pop), vec![1, 2], "{pop}");
    // Without the key: one pop of both partitions under one lease has nothing to hand out,
    // and both messages are dead-lettered.
    let keyless = env.second_server().await;
    let k = format!("http://{}", keyless.addr());
    let (s, body) = get_from(&env, &k, "/api/v1/pop/queue/both?batch=10&partitions=2").await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{body}");
    let (_, dlq) = get_from(&env, &k, "/api/v1/dlq?queue=both").await;
    let letters = dlq["messages"].as_array().unwrap();
    assert_eq!(letters.len(), 2, "{dlq}");
    for letter in letters {
        assert!(
            letter["errorMessage"]
                .as_str()
                .unwrap()
                .starts_with("payload_unreadable"),
            "{letter}"
        );
    }
    let (s, body) = get_from(&env, &k, "/api/v1/pop/queue/both?batch=10").await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{body}");
}

/// The same, through claims of the cursors a walk saw ahead: each pop of the whole queue
/// hands out its partition's message opened, the first found by a walk, the next taken by key
/// without walking.
#[tokio::test]
async fn sealed_payloads_no_longer_encrypted_through_claims_of_cursors_seen_ahead() {
    let env = Env::start_with_env(&[], &[("COMB_ENCRYPTION_KEY", KEY)]).await;
    env.configure("ahead", json!({"encryptionEnabled": true}))
        .await;
    let items: Vec<Value> = (0..4)
        .map(|p| json!({"queue": "ahead", "partition": format!("p{p}"), "payload": {"n": p}}))
        .collect();
    env.push(Value::Array(items)).await;
    env.configure("ahead", json!({"encryptionEnabled": false}))
        .await;
    let mut seen = Vec::new();
    for _ in 0..4 {
        let pop = env
            .pop("/api/v1/pop/queue/ahead?batch=1")
            .await
            .expect("a message");
        seen.extend(numbers(&pop));
    }
    seen.sort_unstable();
    assert_eq!(seen, vec![0, 1, 2, 3]);
}
