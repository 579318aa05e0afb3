//! Queen compatibility at the HTTP level: Queen's option vocabulary with Queen's meaning,
//! its subscription modes, the dead-letter listing, encryption at rest and lease extension
//! as Queen's clients send it. (Queen's own Python client drives the same routes in
//! `queen_python`.)

use crate::common::{self, Env};
use reqwest::StatusCode;
use serde_json::{Value, json};

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const KEY2: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

/// Every option Queen's configure route knows, as its JavaScript client sends them.
fn queen_options() -> Value {
    json!({
        "leaseTime": 120, "maxSize": 0, "ttl": 0, "retryLimit": 4, "retryDelay": 500,
        "deadLetterQueue": false, "dlqAfterMaxRetries": false, "priority": 5,
        "delayedProcessing": 0, "windowBuffer": 0, "retentionSeconds": 0,
        "completedRetentionSeconds": 0, "retentionEnabled": false,
        "encryptionEnabled": false, "maxWaitTimeSeconds": 0
    })
}

async fn metric(env: &Env, name: &str) -> f64 {
    let text = env.metrics_text().await;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} not in /metrics"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn queen_option_vocabulary_is_accepted_echoed_and_kept() {
    let env = Env::start().await;
    let first = env.configure("q", queen_options()).await;
    for (name, value) in queen_options().as_object().unwrap() {
        assert_eq!(&first["options"][name], value, "{name}: {first}");
    }
    // Options left out keep their values.
    let second = env.configure("q", json!({"retryLimit": 9})).await;
    assert_eq!(second["options"]["priority"], 5);
    assert_eq!(second["options"]["dlqAfterMaxRetries"], false);
    assert_eq!(second["options"]["retentionEnabled"], false);
    assert_eq!(second["options"]["retryLimit"], 9);
    // Defaults of a queue created without them: Comb dead-letters and retains as set.
    let fresh = env.configure("fresh", json!({})).await;
    assert_eq!(fresh["options"]["priority"], 0);
    assert_eq!(fresh["options"]["ttl"], 0);
    assert_eq!(fresh["options"]["deadLetterQueue"], true);
    assert_eq!(fresh["options"]["dlqAfterMaxRetries"], true);
    assert_eq!(fresh["options"]["retentionEnabled"], true);
    // A name no Queen version knows is refused, naming it; so is a bad value, naming its
    // option.
    let (s, b) = env
        .post(
            "/api/v1/configure",
            &json!({"queue": "q", "options": {"dlqAfterMaxRetry": true}}),
        )
        .await;
    assert_eq!(
        (s, b["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("option_unknown"))
    );
    assert!(
        b["error"].as_str().unwrap().contains("dlqAfterMaxRetry"),
        "{b}"
    );
    for (name, bad) in [
        ("priority", json!("high")),
        ("ttl", json!(-1)),
        ("deadLetterQueue", json!("yes")),
        ("dlqAfterMaxRetries", json!(1)),
        ("retentionEnabled", json!([])),
    ] {
        let (s, b) = env
            .post(
                "/api/v1/configure",
                &json!({"queue": "q", "options": {name: bad}}),
            )
            .await;
        assert_eq!(
            (s, b["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("option_invalid")),
            "{name}"
        );
        assert!(b["error"].as_str().unwrap().contains(name), "{name}: {b}");
    }
    // Nothing refused changed the queue.
    let again = env.configure("q", json!({})).await;
    assert_eq!(again["options"]["priority"], 5);
}

#[tokio::test]
async fn without_dead_letters_an_exhausted_message_is_skipped_and_counted() {
    let env = Env::start().await;
    env.configure(
        "q",
        json!({"retryLimit": 0, "retryDelay": 0, "dlqAfterMaxRetries": false}),
    )
    .await;
    env.configure("kept", json!({"retryLimit": 0, "retryDelay": 0}))
        .await;
    for q in ["q", "kept"] {
        env.push(json!([{"queue": q, "payload": 1}, {"queue": q, "payload": 2}]))
            .await;
        let pop = env.pop(&format!("/api/v1/pop/queue/{q}")).await.unwrap();
        let (s, b) = env
            .ack(&pop["messages"][0], "failed", None, Some("boom"))
            .await;
        assert_eq!(s, StatusCode::OK, "{b}");
        assert_eq!(b[0]["dlq"], q == "kept", "{q}: {b}");
        // The partition moves on to the next message either way.
        let next = env.pop(&format!("/api/v1/pop/queue/{q}")).await.unwrap();
        assert_eq!(next["messages"][0]["data"], 2, "{q}");
        env.ack_all(&next, "completed", None).await;
    }
    let (_, skipped) = env.get("/api/v1/dlq?queue=q").await;
    assert_eq!(skipped["total"], 0, "{skipped}");
    let (_, kept) = env.get("/api/v1/dlq?queue=kept").await;
    assert_eq!(kept["total"], 1, "{kept}");
    assert_eq!(kept["messages"][0]["errorMessage"], "boom");
    assert_eq!(metric(&env, "comb_messages_discarded_total").await, 1.0);
    // A lease that ends unsettled counts too: skipped when it exhausts the limit.
    env.configure("q", json!({"leaseTime": 1})).await;
    env.push(json!([{"queue": "q", "payload": 3}])).await;
    env.pop("/api/v1/pop/queue/q").await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert!(env.pop("/api/v1/pop/queue/q").await.is_none());
    assert_eq!(metric(&env, "comb_messages_discarded_total").await, 2.0);
    let (_, skipped) = env.get("/api/v1/dlq?queue=q").await;
    assert_eq!(skipped["total"], 0, "{skipped}");
}

#[tokio::test]
async fn ttl_expires_unconsumed_messages_unless_retention_is_off() {
    let env = Env::start().await;
    env.configure("short", json!({"ttl": 1})).await;
    env.configure("off", json!({"ttl": 1, "retentionEnabled": false}))
        .await;
    for q in ["short", "off"] {
        env.push(json!([{"queue": q, "payload": q}])).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert!(
        env.pop("/api/v1/pop/queue/short?autoAck=true")
            .await
            .is_none()
    );
    let kept = env.pop("/api/v1/pop/queue/off?autoAck=true").await.unwrap();
    assert_eq!(kept["messages"][0]["data"], "off");
}

#[tokio::test]
async fn subscription_modes_are_read_as_queen_reads_them() {
    let env = Env::start().await;
    env.push(json!([{"queue": "q", "payload": "old"}])).await;
    for (group, mode, sees_old) in [
        ("a", "from_beginning", true),
        ("b", "all", true),
        ("c", "anything", true),
        ("d", "new", false),
        ("e", "new-only", false),
    ] {
        let pop = env
            .pop(&format!(
                "/api/v1/pop/queue/q?consumerGroup={group}&subscriptionMode={mode}&autoAck=true"
            ))
            .await;
        assert_eq!(pop.is_some(), sees_old, "{mode}");
    }
    env.push(json!([{"queue": "q", "payload": "fresh"}])).await;
    for group in ["d", "e"] {
        let pop = env
            .pop(&format!(
                "/api/v1/pop/queue/q?consumerGroup={group}&autoAck=true"
            ))
            .await
            .unwrap();
        assert_eq!(pop["messages"][0]["data"], "fresh");
    }
}

#[tokio::test]
async fn dead_letters_are_listed_in_queens_shape() {
    let env = Env::start().await;
    env.configure("q", json!({"retryLimit": 0, "retryDelay": 0}))
        .await;
    env.configure("other", json!({})).await;
    let items: Vec<Value> = (0..5)
        .map(|i| json!({"queue": "q", "partition": format!("p{}", i % 2), "payload": {"n": i}, "traceId": format!("t{i}")}))
        .collect();
    env.push(Value::Array(items)).await;
    // Group g1 dead-letters everything, g2 only what it fails; `dlq` acks dead-letter at once.
    for group in ["g1", "g2"] {
        loop {
            let Some(pop) = env
                .pop(&format!(
                    "/api/v1/pop/queue/q?consumerGroup={group}&batch=10"
                ))
                .await
            else {
                break;
            };
            for m in pop["messages"].as_array().unwrap() {
                let n = m["data"]["n"].as_i64().unwrap();
                let status = if group == "g1" || n == 0 {
                    "dlq"
                } else {
                    "completed"
                };
                let (s, b) = env.ack(m, status, Some(group), Some("bad")).await;
                assert_eq!(s, StatusCode::OK, "{b}");
            }
        }
    }
    let (s, all) = env.get("/api/v1/dlq?queue=q").await;
    assert_eq!(s, StatusCode::OK, "{all}");
    assert_eq!(all["total"], 6);
    assert_eq!(all["limit"], 100);
    assert_eq!(all["offset"], 0);
    let first = &all["messages"][0];
    for field in [
        "id",
        "messageId",
        "partitionId",
        "transactionId",
        "consumerGroup",
        "errorMessage",
        "retryCount",
        "originalCreatedAt",
        "movedToDlqAt",
        "messageCreatedAt",
        "queueName",
        "partitionName",
        "data",
        "traceId",
    ] {
        assert!(!first[field].is_null(), "{field}: {first}");
    }
    assert_eq!(first["queueName"], "q");
    assert_eq!(first["errorMessage"], "bad");
    // Newest first.
    let times: Vec<&str> = all["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["movedToDlqAt"].as_str().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{times:?}");
    let (_, g2) = env.get("/api/v1/dlq?queue=q&consumerGroup=g2").await;
    assert_eq!(g2["total"], 1);
    assert_eq!(g2["messages"][0]["data"], json!({"n": 0}));
    assert_eq!(g2["messages"][0]["traceId"], "t0");
    let (_, p1) = env
        .get("/api/v1/dlq?queue=q&consumerGroup=g1&partition=p1")
        .await;
    assert_eq!(p1["total"], 2);
    assert!(
        p1["messages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["partitionName"] == "p1")
    );
    // Pages: limit and offset walk the same order without overlap.
    let (_, page1) = env.get("/api/v1/dlq?queue=q&limit=4").await;
    let (_, page2) = env.get("/api/v1/dlq?queue=q&limit=4&offset=4").await;
    assert_eq!(page1["messages"].as_array().unwrap().len(), 4);
    assert_eq!(page2["messages"].as_array().unwrap().len(), 2);
    let ids: std::collections::HashSet<String> = page1["messages"]
        .as_array()
        .unwrap()
        .iter()
        .chain(page2["messages"].as_array().unwrap())
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 6);
    // A time window after everything is empty; a queue without dead letters too.
    let (_, later) = env.get("/api/v1/dlq?queue=q&from=2999-01-01").await;
    assert_eq!(later["total"], 0);
    let (_, none) = env.get("/api/v1/dlq?queue=other").await;
    assert_eq!(
        (none["total"].clone(), none["messages"].clone()),
        (json!(0), json!([]))
    );
    // Bad requests.
    for (q, status, code) in [
        ("", StatusCode::BAD_REQUEST, "queue_name_invalid"),
        (
            "?queue=a%20b",
            StatusCode::BAD_REQUEST,
            "queue_name_invalid",
        ),
        (
            "?queue=q&limit=0",
            StatusCode::BAD_REQUEST,
            "parameter_invalid",
        ),
        (
            "?queue=q&limit=5000",
            StatusCode::BAD_REQUEST,
            "parameter_invalid",
        ),
        (
            "?queue=q&offset=-1",
            StatusCode::BAD_REQUEST,
            "parameter_invalid",
        ),
        (
            "?queue=q&offset=999999999",
            StatusCode::BAD_REQUEST,
            "parameter_invalid",
        ),
        (
            "?queue=q&from=yesterday",
            StatusCode::BAD_REQUEST,
            "parameter_invalid",
        ),
        ("?queue=nowhere", StatusCode::NOT_FOUND, "queue_not_found"),
    ] {
        let (s, b) = env.get(&format!("/api/v1/dlq{q}")).await;
        assert_eq!((s, b["code"].as_str()), (status, Some(code)), "{q}: {b}");
    }
}

#[tokio::test]
async fn encrypted_payloads_are_sealed_at_rest_and_opened_on_the_way_out() {
    let env = Env::start_with_env(&[], &[("COMB_ENCRYPTION_KEY", KEY)]).await;
    let c = env
        .configure(
            "secret",
            json!({"encryptionEnabled": true, "retryLimit": 0}),
        )
        .await;
    assert_eq!(c["options"]["encryptionEnabled"], true);
    // The three ways in: a small push, a large (copied) one, and a transaction's push.
    env.push(json!([{"queue": "secret", "payload": {"card": "4111-small"}}]))
        .await;
    let large: Vec<Value> = (0..100)
        .map(|i| json!({"queue": "secret", "partition": "big", "payload": {"card": format!("4111-large-{i}")}}))
        .collect();
    env.push(Value::Array(large)).await;
    let (s, b) = env
        .post(
            "/api/v1/transaction",
            &json!({"operations": [{"type": "push", "items": [
                {"queue": "secret", "partition": "tx", "payload": {"card": "4111-tx"}}
            ]}]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    // Nothing of the payloads is stored in clear; each is sealed.
    assert_eq!(
        env.sql("SELECT count(*) FROM comb.messages WHERE position('4111'::bytea in payload) > 0"),
        "0"
    );
    assert_eq!(
        env.sql(
            "SELECT count(*) FROM comb.messages WHERE substr(payload, 1, 2) = '\\x0001'::bytea"
        ),
        "102"
    );
    // An unencrypted queue of the same server stores clear JSON.
    env.push(json!([{"queue": "plain", "payload": {"card": "clear"}}]))
        .await;
    assert_eq!(
        env.sql("SELECT convert_from(m.payload, 'UTF8') FROM comb.messages m JOIN comb.partitions p ON p.id = m.partition_id JOIN comb.queues q ON q.id = p.queue_id WHERE q.name = 'plain'"),
        r#"{"card": "clear"}"#.replace(' ', "")
    );
    // Pops open them.
    let pop = env
        .pop("/api/v1/pop/queue/secret/partition/Default")
        .await
        .unwrap();
    assert_eq!(pop["messages"][0]["data"], json!({"card": "4111-small"}));
    // The dead-letter listing opens them too.
    env.ack_all(&pop, "failed", None).await;
    let (_, dlq) = env.get("/api/v1/dlq?queue=secret").await;
    assert_eq!(dlq["messages"][0]["data"], json!({"card": "4111-small"}));
    // Rotation: a server with a new key and the old one reads what the old key sealed, and
    // seals new payloads with the new key.
    let rotated = env
        .second_server_with_env(&[
            ("COMB_ENCRYPTION_KEY", KEY2),
            ("COMB_ENCRYPTION_KEY_OLD", KEY),
        ])
        .await;
    let url = format!("http://{}", rotated.addr());
    let r = env
        .http
        .get(format!(
            "{url}/api/v1/pop/queue/secret/partition/tx?autoAck=true"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["messages"][0]["data"], json!({"card": "4111-tx"}));
    // A server without the key refuses to store into an encrypted queue rather than store in
    // clear, and refuses to create one.
    let keyless = env.second_server().await;
    let url = format!("http://{}", keyless.addr());
    let r = env
        .http
        .post(format!("{url}/api/v1/push"))
        .json(&json!({"items": [{"queue": "secret", "payload": {"card": "4111-nokey"}}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], "encryption_unavailable");
    let r = env
        .http
        .post(format!("{url}/api/v1/configure"))
        .json(&json!({"queue": "another", "options": {"encryptionEnabled": true}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(env.sql("SELECT count(*) FROM comb.messages"), "103");
    // And it cannot read sealed payloads: instead of handing out ciphertext, or consuming
    // them unseen, it dead-letters them with the reason.
    let r = env
        .http
        .get(format!(
            "{url}/api/v1/pop/queue/secret/partition/big?autoAck=true"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let (_, dlq) = env.get("/api/v1/dlq?queue=secret").await;
    let unreadable = dlq["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| {
            m["errorMessage"]
                .as_str()
                .is_some_and(|e| e.starts_with("payload_unreadable"))
        })
        .count();
    assert!(unreadable >= 1, "{dlq}");
}

#[tokio::test]
async fn a_malformed_key_stops_the_server_at_start() {
    let pg = comb_harness::Postgres::shared();
    let db = pg.create_database("t").unwrap();
    let started = comb_harness::Server::start_with_env(
        common::comb_bin(),
        &db,
        &[],
        &[("COMB_ENCRYPTION_KEY", "not-a-key")],
    );
    let err = started.err().expect("refused").to_string();
    assert!(err.contains("COMB_ENCRYPTION_KEY"), "{err}");
}

#[tokio::test]
async fn a_lease_is_extended_with_the_body_queens_clients_send() {
    let env = Env::start().await;
    env.configure("q", json!({"leaseTime": 100})).await;
    env.push(json!([{"queue": "q", "payload": 1}])).await;
    let pop = env.pop("/api/v1/pop/queue/q").await.unwrap();
    let lease = pop["leaseId"].as_str().unwrap();
    let path = format!("/api/v1/lease/{lease}/extend");
    // No body at all (the Python client sends none), then `{}`: the queue's leaseTime.
    let r = env.http.post(env.url(&path)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let (s, b) = env.post(&path, &json!({})).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b[0]["success"], true);
    let left: f64 = env
        .sql("SELECT extract(epoch FROM lease_expires_at - now()) FROM comb.cursors_now")
        .parse()
        .unwrap();
    assert!(left > 50.0 && left <= 100.0, "{left}");
    let (s, b) = env.post(&path, &json!({"seconds": 0})).await;
    assert_eq!(
        (s, b["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("field_invalid"))
    );
}

/// The messages of a pop answer, as (partition, payload n, lease id).
fn handed(pop: &Value) -> Vec<(String, i64, String)> {
    pop["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["partition"].as_str().unwrap().to_string(),
                m["data"]["n"].as_i64().unwrap(),
                m["leaseId"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_multi_partition_pop_shares_one_lease_and_one_batch() {
    let env = Env::start().await;
    let items: Vec<Value> = (0..12)
        .map(|i| json!({"queue": "q", "partition": format!("p{}", i % 4), "payload": {"n": i}}))
        .collect();
    env.push(Value::Array(items)).await;
    let first = env
        .pop("/api/v1/pop/queue/q?partitions=3&batch=5")
        .await
        .unwrap();
    let got = handed(&first);
    // `batch` caps the whole pop; every message carries the pop's one lease id.
    assert_eq!(got.len(), 5, "{first}");
    let lease = first["leaseId"].as_str().unwrap().to_string();
    assert!(got.iter().all(|g| g.2 == lease), "{first}");
    let partitions: std::collections::BTreeSet<&str> = got.iter().map(|g| g.0.as_str()).collect();
    assert!(partitions.len() <= 3 && partitions.len() >= 2, "{first}");
    assert_eq!(first["partitionsClaimed"], partitions.len());
    // Each partition hands out a prefix of what it holds, in order.
    for p in &partitions {
        let ns: Vec<i64> = got.iter().filter(|g| g.0 == *p).map(|g| g.1).collect();
        let k: i64 = p[1..].parse().unwrap();
        let expected: Vec<i64> = (0..ns.len() as i64).map(|j| k + 4 * j).collect();
        assert_eq!(ns, expected, "{p}");
    }
    // The lease holds every partition it claimed: another pop gets only the others.
    let second = env
        .pop("/api/v1/pop/queue/q?partitions=4&batch=100")
        .await
        .unwrap();
    let other = handed(&second);
    assert!(
        other.iter().all(|g| !partitions.contains(g.0.as_str())),
        "{second}"
    );
    assert_eq!(other.len(), 3 * (4 - partitions.len()), "{second}");
    assert!(other.iter().all(|g| g.2 != lease));
    // Extending the one lease extends it on every partition it holds.
    let (s, b) = env
        .post(
            &format!("/api/v1/lease/{lease}/extend"),
            &json!({"seconds": 3000}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(
        env.sql(&format!(
            "SELECT count(*) FROM comb.cursors_now WHERE lease_id = '{lease}' AND lease_expires_at > now() + interval '2000 seconds'"
        )),
        partitions.len().to_string()
    );
    // Acks go message by message, as always.
    for pop in [&first, &second] {
        let results = env.ack_all(pop, "completed", None).await;
        assert!(results.iter().all(|r| r["success"] == true), "{results:?}");
    }
    // Nothing is skipped: the rest comes out afterwards, each message once, in order.
    let mut seen: Vec<(String, i64)> = got
        .iter()
        .chain(&other)
        .map(|g| (g.0.clone(), g.1))
        .collect();
    while let Some(pop) = env
        .pop("/api/v1/pop/queue/q?partitions=2&batch=2&autoAck=true")
        .await
    {
        let h = handed(&pop);
        assert!(h.len() <= 2 && h.iter().all(|g| g.2.is_empty()), "{pop}");
        seen.extend(h.into_iter().map(|g| (g.0, g.1)));
    }
    seen.sort_by_key(|s| s.1);
    let ns: Vec<i64> = seen.iter().map(|s| s.1).collect();
    assert_eq!(ns, (0..12).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_shared_lease_expires_on_every_partition_and_each_message_counts_its_attempt() {
    let env = Env::start().await;
    env.configure("q", json!({"leaseTime": 1, "retryLimit": 5}))
        .await;
    let items: Vec<Value> = (0..4)
        .map(|i| json!({"queue": "q", "partition": format!("p{}", i % 2), "payload": {"n": i}}))
        .collect();
    env.push(Value::Array(items)).await;
    let first = env
        .pop("/api/v1/pop/queue/q?partitions=2&batch=10")
        .await
        .unwrap();
    assert_eq!(handed(&first).len(), 4);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    // The lease ended unsettled on both partitions: both come back, under a new lease,
    // every message on its second attempt. That lease is long enough to be acked below.
    env.configure("q", json!({"leaseTime": 30})).await;
    let again = env
        .pop("/api/v1/pop/queue/q?partitions=2&batch=10")
        .await
        .unwrap();
    let got = handed(&again);
    assert_eq!(got.len(), 4, "{again}");
    assert_ne!(again["leaseId"], first["leaseId"]);
    assert!(
        again["messages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["attempt"] == 2),
        "{again}"
    );
    // An ack under the ended lease is refused; under the new one it succeeds.
    let stale = env.ack_all(&first, "completed", None).await;
    assert!(stale.iter().all(|r| r["success"] == false), "{stale:?}");
    let fresh = env.ack_all(&again, "completed", None).await;
    assert!(fresh.iter().all(|r| r["success"] == true), "{fresh:?}");
}
