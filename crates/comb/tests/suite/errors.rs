//! Bad input gets a problem+json answer with a stable code, and nothing of it is stored.
//! (`common::read` checks the problem+json shape of every error answer.)

use crate::common::{self, Env};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn expect(env: &Env, path: &str, body: Value, status: StatusCode, code: &str) {
    let (s, b) = env.post(path, &body).await;
    assert_eq!(s, status, "{path} {body} -> {b}");
    assert_eq!(b["code"], code, "{path} {body} -> {b}");
}

fn nothing_stored(env: &Env) {
    assert_eq!(env.sql("SELECT count(*) FROM comb.messages"), "0");
    assert_eq!(env.sql("SELECT count(*) FROM comb.partitions"), "0");
}

#[tokio::test]
async fn malformed_bodies() {
    let env = Env::start().await;
    for path in [
        "/api/v1/push",
        "/api/v1/ack",
        "/api/v1/ack/batch",
        "/api/v1/configure",
        "/api/v1/pop",
    ] {
        let (s, b) = env.post_raw(path, b"{\"items\": [".to_vec()).await;
        assert_eq!(
            (s, b["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("json_invalid")),
            "{path}"
        );
        let (s, b) = env.post_raw(path, Vec::new()).await;
        assert_eq!(
            (s, b["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("body_missing")),
            "{path}"
        );
        let (s, b) = env.post_raw(path, vec![0xff, 0xfe, b'{']).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{path}: {b}");
    }
    expect(
        &env,
        "/api/v1/push",
        json!({"items": "no"}),
        StatusCode::BAD_REQUEST,
        "field_invalid",
    )
    .await;
    expect(
        &env,
        "/api/v1/push",
        json!({"items": [{"queue": 5, "payload": 1}]}),
        StatusCode::BAD_REQUEST,
        "field_invalid",
    )
    .await;
    expect(
        &env,
        "/api/v1/push",
        json!({"items": [{"queue": "q"}]}),
        StatusCode::BAD_REQUEST,
        "field_invalid",
    )
    .await;
    // Every string field of an item refuses other types, in pushes and in transactions.
    for (field, value) in [
        ("partition", json!(5)),
        ("transactionId", json!(["t"])),
        ("traceId", json!({"id": 1})),
    ] {
        let mut item = json!({"queue": "q", "payload": 1});
        item[field] = value;
        expect(
            &env,
            "/api/v1/push",
            json!({ "items": [item.clone()] }),
            StatusCode::BAD_REQUEST,
            "field_invalid",
        )
        .await;
        expect(
            &env,
            "/api/v1/transaction",
            json!({"operations": [{"type": "push", "items": [item]}]}),
            StatusCode::BAD_REQUEST,
            "field_invalid",
        )
        .await;
    }
    // As Queen does, an empty push stores nothing and answers an empty list.
    let (s, b) = env.post("/api/v1/push", &json!({"items": []})).await;
    assert_eq!((s, b), (StatusCode::CREATED, json!([])));
    nothing_stored(&env);
}

#[tokio::test]
async fn bad_names_and_ids() {
    let env = Env::start().await;
    for bad in ["", "has space", "slash/es", "quote'd", "semi;colon", "é"] {
        expect(
            &env,
            "/api/v1/push",
            json!({"items": [{"queue": bad, "payload": 1}]}),
            StatusCode::BAD_REQUEST,
            "queue_name_invalid",
        )
        .await;
        expect(
            &env,
            "/api/v1/configure",
            json!({"queue": bad}),
            StatusCode::BAD_REQUEST,
            "queue_name_invalid",
        )
        .await;
    }
    let long = "x".repeat(256);
    expect(
        &env,
        "/api/v1/push",
        json!({"items": [{"queue": long, "payload": 1}]}),
        StatusCode::BAD_REQUEST,
        "queue_name_invalid",
    )
    .await;
    expect(
        &env,
        "/api/v1/push",
        json!({"items": [{"queue": "q", "partition": "a\u{0}b", "payload": 1}]}),
        StatusCode::BAD_REQUEST,
        "partition_name_invalid",
    )
    .await;
    expect(
        &env,
        "/api/v1/push",
        json!({"items": [{"queue": "q", "partition": "", "payload": 1}]}),
        StatusCode::BAD_REQUEST,
        "partition_name_invalid",
    )
    .await;
    expect(
        &env,
        "/api/v1/push",
        json!({"items": [{"queue": "q", "payload": 1, "transactionId": ""}]}),
        StatusCode::BAD_REQUEST,
        "transaction_id_invalid",
    )
    .await;
    expect(
        &env,
        "/api/v1/push",
        json!({"items": [{"queue": "q", "payload": 1, "transactionId": "x".repeat(256)}]}),
        StatusCode::BAD_REQUEST,
        "transaction_id_invalid",
    )
    .await;
    expect(
        &env,
        "/api/v1/push",
        json!({"items": [{"queue": "q", "payload": 1, "traceId": "t\n"}]}),
        StatusCode::BAD_REQUEST,
        "trace_id_invalid",
    )
    .await;
    // One bad item fails its whole request, and nothing of it is stored.
    expect(
        &env,
        "/api/v1/push",
        json!({"items": [
            {"queue": "good", "payload": 1},
            {"queue": "bad queue", "payload": 2},
        ]}),
        StatusCode::BAD_REQUEST,
        "queue_name_invalid",
    )
    .await;
    let (s, b) = env.get("/api/v1/pop/queue/bad%20queue").await;
    assert_eq!(
        (s, b["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("queue_name_invalid"))
    );
    nothing_stored(&env);
    assert_eq!(env.sql("SELECT count(*) FROM comb.queues"), "0");
}

#[tokio::test]
async fn limits_on_body_and_batch() {
    let env = Env::start_with(&["--max-body-bytes", "4096", "--max-batch", "10"]).await;
    let big = json!({"items": [{"queue": "q", "payload": "x".repeat(5000)}]});
    expect(
        &env,
        "/api/v1/push",
        big,
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
    )
    .await;
    let items: Vec<Value> = (0..11)
        .map(|i| json!({"queue": "q", "payload": i}))
        .collect();
    expect(
        &env,
        "/api/v1/push",
        json!({"items": items}),
        StatusCode::PAYLOAD_TOO_LARGE,
        "batch_too_large",
    )
    .await;
    let acks: Vec<Value> = (0..11)
        .map(|_| json!({"transactionId": "t", "partitionId": uuid::Uuid::nil(), "status": "completed"}))
        .collect();
    expect(
        &env,
        "/api/v1/ack/batch",
        json!({"acknowledgments": acks}),
        StatusCode::PAYLOAD_TOO_LARGE,
        "batch_too_large",
    )
    .await;
    // A body sent without Content-Length (chunked) is cut off at the limit too.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = vec![
        Ok(b"{\"items\":[{\"queue\":\"q\",\"payload\":\"".to_vec()),
        Ok(vec![b'y'; 8000]),
        Ok(b"\"}]}".to_vec()),
    ];
    let r = env
        .http
        .post(env.url("/api/v1/push"))
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // The rest of the body is left unread: the connection is not reused.
    assert_eq!(r.headers()["connection"], "close");
    let (s, b) = env.get("/api/v1/pop/queue/q?batch=100000").await;
    assert_eq!(
        (s, b["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("parameter_invalid"))
    );
    nothing_stored(&env);
}

#[tokio::test]
async fn default_limits_are_16_mib_and_10000_items() {
    let env = Env::start().await;
    // Refused from the declared length alone, before a byte of the body is read.
    let head = format!(
        "POST /api/v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        16 * 1024 * 1024 + 1
    );
    let addr = env.server.addr();
    let (s, b) = tokio::task::spawn_blocking(move || common::raw_head_only(addr, &head))
        .await
        .unwrap();
    assert_eq!(
        (s, b["code"].as_str()),
        (413, Some("body_too_large")),
        "{b}"
    );
    // Exactly 16 MiB of body passes the size check (and then fails as JSON, not as size).
    let mut exact = vec![b' '; 16 * 1024 * 1024];
    exact[0] = b'{';
    let (s, b) = env.post_raw("/api/v1/push", exact).await;
    assert_eq!(
        (s, b["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("json_invalid"))
    );
    let items: Vec<Value> = (0..10_001)
        .map(|i| json!({"queue": "q", "payload": i}))
        .collect();
    expect(
        &env,
        "/api/v1/push",
        json!({"items": items}),
        StatusCode::PAYLOAD_TOO_LARGE,
        "batch_too_large",
    )
    .await;
    nothing_stored(&env);
    // Exactly at the limit is accepted.
    let items: Vec<Value> = (0..10_000)
        .map(|i| json!({"queue": "q", "payload": i}))
        .collect();
    let r = env.push(json!(items)).await;
    assert_eq!(r.len(), 10_000);
}

#[tokio::test]
async fn pop_options() {
    let env = Env::start().await;
    let (s, b) = env.get("/api/v1/pop/queue/nowhere/partition/p").await;
    assert_eq!(
        (s, b["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("queue_not_found"))
    );
    for (q, code) in [
        ("batch=0", "parameter_invalid"),
        ("batch=abc", "parameter_invalid"),
        ("wait=maybe", "parameter_invalid"),
        ("timeout=-5", "parameter_invalid"),
        ("partitions=0", "parameter_invalid"),
        (
            &format!("subscriptionMode={}", "x".repeat(300)),
            "subscription_mode_invalid",
        ),
        ("subscriptionFrom=yesterday", "subscription_from_invalid"),
        ("consumerGroup=", "consumer_group_invalid"),
    ] {
        let (s, b) = env.get(&format!("/api/v1/pop/queue/q?{q}")).await;
        assert_eq!(
            (s, b["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some(code)),
            "{q}"
        );
    }
    expect(
        &env,
        "/api/v1/pop",
        json!({"queue": "q", "batch": "many"}),
        StatusCode::BAD_REQUEST,
        "parameter_invalid",
    )
    .await;
    expect(
        &env,
        "/api/v1/pop",
        json!({"batch": 1}),
        StatusCode::BAD_REQUEST,
        "queue_name_invalid",
    )
    .await;
    let (s, b) = env.get("/api/v1/nope").await;
    assert_eq!(
        (s, b["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("route_not_found"))
    );
    assert_eq!(env.sql("SELECT count(*) FROM comb.subscriptions"), "0");
}

#[tokio::test]
async fn ack_errors() {
    let env = Env::start().await;
    let pushed = env
        .push(json!([{"queue": "q", "payload": 1, "transactionId": "t1"}]))
        .await;
    let pid = pushed[0]["partition_id"].clone();
    let pop = env.pop("/api/v1/pop/queue/q").await.unwrap();
    let lease = pop["leaseId"].clone();
    let ack = |over: Value| {
        let mut a = json!({"transactionId": "t1", "partitionId": pid, "leaseId": lease, "status": "completed"});
        for (k, v) in over.as_object().unwrap() {
            a[k] = v.clone();
        }
        a
    };
    expect(
        &env,
        "/api/v1/ack",
        ack(json!({"leaseId": uuid::Uuid::new_v4()})),
        StatusCode::CONFLICT,
        "lease_invalid",
    )
    .await;
    expect(
        &env,
        "/api/v1/ack",
        ack(json!({"leaseId": "not-a-uuid"})),
        StatusCode::BAD_REQUEST,
        "lease_id_invalid",
    )
    .await;
    expect(
        &env,
        "/api/v1/ack",
        ack(json!({"partitionId": "p"})),
        StatusCode::BAD_REQUEST,
        "partition_id_invalid",
    )
    .await;
    expect(
        &env,
        "/api/v1/ack",
        ack(json!({"status": "done"})),
        StatusCode::BAD_REQUEST,
        "ack_status_invalid",
    )
    .await;
    expect(
        &env,
        "/api/v1/ack",
        ack(json!({"transactionId": "nope"})),
        StatusCode::NOT_FOUND,
        "message_not_found",
    )
    .await;
    expect(
        &env,
        "/api/v1/ack",
        ack(json!({"consumerGroup": "never-read"})),
        StatusCode::NOT_FOUND,
        "consumer_group_not_found",
    )
    .await;
    expect(
        &env,
        "/api/v1/ack",
        ack(json!({"consumerGroup": ""})),
        StatusCode::BAD_REQUEST,
        "consumer_group_invalid",
    )
    .await;
    // A group that is no name fails the whole batch, naming its item.
    let (s, b) = env
        .post(
            "/api/v1/ack/batch",
            &json!({"acknowledgments": [ack(json!({})), ack(json!({"consumerGroup": "a\nb"}))]}),
        )
        .await;
    assert_eq!(
        (s, b["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("consumer_group_invalid"))
    );
    assert!(
        b["detail"]
            .as_str()
            .unwrap()
            .starts_with("acknowledgments[1]: "),
        "{b}"
    );
    // An empty ack list is accepted and acks nothing, as Queen does.
    let (s, b) = env
        .post("/api/v1/ack/batch", &json!({"acknowledgments": []}))
        .await;
    assert_eq!((s, b), (StatusCode::OK, json!([])));
    // In a batch, a bad lease fails only its own item.
    let (s, b) = env
        .post(
            "/api/v1/ack/batch",
            &json!({"acknowledgments": [
                ack(json!({"leaseId": uuid::Uuid::new_v4()})),
                ack(json!({})),
            ]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b[0]["success"], false);
    assert!(b[0]["error"].as_str().unwrap().starts_with("lease_invalid"));
    assert_eq!(b[1]["success"], true);
    // None of the refused acks moved anything before the good one.
    assert_eq!(env.sql("SELECT cursor_pos FROM comb.cursors_now"), "1");
}

#[tokio::test]
async fn configure_errors() {
    let env = Env::start().await;
    expect(
        &env,
        "/api/v1/configure",
        json!({"queue": "q", "options": {"priorty": 1}}),
        StatusCode::BAD_REQUEST,
        "option_unknown",
    )
    .await;
    expect(
        &env,
        "/api/v1/configure",
        json!({"queue": "q", "options": {"leaseTime": -1}}),
        StatusCode::BAD_REQUEST,
        "option_invalid",
    )
    .await;
    expect(
        &env,
        "/api/v1/configure",
        json!({"queue": "q", "options": {"leaseTime": 0}}),
        StatusCode::BAD_REQUEST,
        "option_invalid",
    )
    .await;
    expect(
        &env,
        "/api/v1/configure",
        json!({"queue": "q", "options": {"retryLimit": "3"}}),
        StatusCode::BAD_REQUEST,
        "option_invalid",
    )
    .await;
    expect(
        &env,
        "/api/v1/configure",
        json!({"queue": "q", "options": {"encryptionEnabled": true}}),
        StatusCode::BAD_REQUEST,
        "encryption_unavailable",
    )
    .await;
    assert_eq!(env.sql("SELECT count(*) FROM comb.queues"), "0");
}

#[tokio::test]
async fn one_bad_request_does_not_fail_requests_fused_with_it() {
    let env = Env::start_with(&["--push-workers", "1"]).await;
    let mut tasks = Vec::new();
    for i in 0..60 {
        let http = common::client();
        let url = env.url("/api/v1/push");
        tasks.push(tokio::spawn(async move {
            // Every third request carries a payload that a jsonb column would refuse
            // (a NUL escape) or a bad name; the others are fine.
            let body = match i % 3 {
                0 => json!({"items": [{"queue": "q bad", "payload": i}]}),
                1 => json!({"items": [{"queue": "q", "payload": {"s": "nul\u{0}inside", "i": i}}]}),
                _ => json!({"items": [{"queue": "q", "payload": {"i": i}}]}),
            };
            (i, http.post(url).json(&body).send().await.unwrap().status())
        }));
    }
    for t in tasks {
        let (i, s) = t.await.unwrap();
        let want = if i % 3 == 0 {
            StatusCode::BAD_REQUEST
        } else {
            StatusCode::CREATED
        };
        assert_eq!(s, want, "request {i}");
    }
    assert_eq!(env.sql("SELECT count(*) FROM comb.messages"), "40");
}

#[tokio::test]
async fn a_path_that_is_not_utf8_is_a_problem_not_plain_text() {
    let env = Env::start().await;
    for path in [
        "/api/v1/pop/queue/%FF",
        "/api/v1/pop/queue/q/partition/%FF%FE",
        "/api/v1/lease/%FF/extend",
    ] {
        let (s, b) = if path.ends_with("extend") {
            env.post(path, &json!({"seconds": 5})).await
        } else {
            env.get(path).await
        };
        assert_eq!(
            (s, b["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("parameter_invalid")),
            "{path}"
        );
    }
    let r = env
        .http
        .delete(env.url("/api/v1/resources/queues/%FF"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
}

#[tokio::test]
async fn nul_characters_never_reach_the_database() {
    let env = Env::start().await;
    let pushed = env
        .push(json!([{"queue": "q", "payload": 1, "transactionId": "t1"}]))
        .await;
    let pid = pushed[0]["partition_id"].clone();
    let pop = env.pop("/api/v1/pop/queue/q").await.unwrap();
    expect(
        &env,
        "/api/v1/ack",
        json!({"transactionId": "t\u{0}1", "partitionId": pid, "status": "completed"}),
        StatusCode::BAD_REQUEST,
        "transaction_id_invalid",
    )
    .await;
    // A failure text may hold anything; a NUL in it is replaced, not refused.
    let (s, b) = env
        .post(
            "/api/v1/ack",
            &json!({
                "transactionId": "t1", "partitionId": pid, "leaseId": pop["leaseId"],
                "status": "dlq", "error": "line 1\nline\t2 \u{0} end",
            }),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b[0]["dlq"], true);
    assert_eq!(
        env.sql("SELECT error FROM comb.dead_letters"),
        "line 1\nline\t2 \u{FFFD} end"
    );
    // A transaction id in a path: refused before any statement, on every message route.
    let pid = pid.as_str().unwrap();
    for (method, path) in [
        ("GET", format!("/api/v1/messages/{pid}/nul%00inside")),
        ("DELETE", format!("/api/v1/messages/{pid}/nul%00inside")),
        ("POST", format!("/api/v1/messages/{pid}/nul%00inside/retry")),
        ("POST", format!("/api/v1/messages/{pid}/nul%00inside/dlq")),
    ] {
        let r = env
            .http
            .request(method.parse().unwrap(), env.url(&path))
            .send()
            .await
            .unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap();
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {path}: {body}");
        assert_eq!(
            body["code"], "transaction_id_invalid",
            "{method} {path}: {body}"
        );
    }
}

/// A NUL byte in a query string is refused at the edge on every route, before any statement.
#[tokio::test]
async fn nul_in_a_query_string_is_refused_on_every_route() {
    let env = Env::start().await;
    for path in [
        "/api/v1/resources/queues?namespace=nul%00inside",
        "/api/v1/messages?queue=q%00",
        "/api/v1/pop/queue/q?consumerGroup=g%00",
        "/api/v1/dlq?queue=q&consumerGroup=%00",
    ] {
        let (s, b) = env.get(path).await;
        assert_eq!(
            (s, b["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("parameter_invalid")),
            "{path}: {b}"
        );
    }
}

/// The message listing builds its answer in SQL; a payload nested deeper than PostgreSQL's
/// parser allows, or sealed by encryption, never fails it.
#[tokio::test]
async fn a_payload_the_database_cannot_parse_does_not_fail_the_listing() {
    let env = Env::start().await;
    env.push(json!([{"queue": "deep", "payload": 1}])).await;
    // Stored behind Comb's back: deeper than PostgreSQL's jsonb parser's stack, and sealed.
    env.sql(
        "INSERT INTO comb.messages (partition_id, pos, seg, message_id, transaction_id, payload, created_at)
         SELECT partition_id, 2, seg, gen_random_uuid(), 'deep',
                convert_to(repeat('[', 200000) || repeat(']', 200000), 'UTF8'), now()
         FROM comb.messages;
         INSERT INTO comb.messages (partition_id, pos, seg, message_id, transaction_id, payload, created_at)
         SELECT partition_id, 3, seg, gen_random_uuid(), 'sealed', decode('00ff', 'hex'), now()
         FROM comb.messages WHERE pos = 1",
    );
    let (s, b) = env.get("/api/v1/messages?queue=deep").await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let messages = b["messages"].as_array().expect("a list");
    let data = |t: &str| {
        messages
            .iter()
            .find(|m| m["transactionId"] == t)
            .map(|m| m["data"].clone())
            .unwrap_or_else(|| panic!("{t} listed: {b}"))
    };
    assert_eq!(data("sealed"), json!({"encrypted": true}));
    assert!(
        data("deep")
            .as_str()
            .is_some_and(|t| t.starts_with("payload not shown")),
        "{b}"
    );
    assert_eq!(messages.len(), 3, "{b}");
}

#[tokio::test]
async fn a_push_refused_for_max_size_leaves_no_trace() {
    let env = Env::start().await;
    env.configure("small", json!({"maxSize": 1})).await;
    env.push(json!([{"queue": "small", "payload": 1}])).await;
    let partitions = env.sql("SELECT count(*) FROM comb.partitions");
    let queues = env.sql("SELECT count(*) FROM comb.queues");
    // A new partition of the full queue and a brand-new queue in the same refused request.
    expect(
        &env,
        "/api/v1/push",
        json!({"items": [
            {"queue": "small", "partition": "new", "payload": 2},
            {"queue": "brand-new", "payload": 3},
        ]}),
        StatusCode::TOO_MANY_REQUESTS,
        "queue_full",
    )
    .await;
    assert_eq!(env.sql("SELECT count(*) FROM comb.partitions"), partitions);
    assert_eq!(env.sql("SELECT count(*) FROM comb.queues"), queues);
    assert_eq!(env.message_count(), 1);
}

#[tokio::test]
async fn deleting_a_queue_with_a_bad_or_unknown_name() {
    let env = Env::start().await;
    env.push(json!([{"queue": "kept", "payload": 1}])).await;
    for (path, status, code) in [
        (
            "/api/v1/resources/queues/bad%20name",
            StatusCode::BAD_REQUEST,
            "queue_name_invalid",
        ),
        (
            "/api/v1/resources/queues/nowhere",
            StatusCode::NOT_FOUND,
            "queue_not_found",
        ),
    ] {
        let r = env.http.delete(env.url(path)).send().await.unwrap();
        assert_eq!(r.status(), status, "{path}");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        let b: serde_json::Value = r.json().await.unwrap();
        assert_eq!(b["code"], code, "{path}");
    }
    // Nothing else was touched.
    assert_eq!(env.sql("SELECT count(*) FROM comb.queues"), "1");
    assert_eq!(env.message_count(), 1);
}

/// A stored payload that is no longer JSON (changed behind Comb's back) is not handed out and
/// not lost: the pop dead-letters it with its reason and hands out the next message.
#[tokio::test]
async fn a_stored_payload_that_is_not_json_is_dead_lettered_and_the_next_delivered() {
    let env = Env::start().await;
    env.push(json!([{"queue": "bent", "payload": {"n": 1}}]))
        .await;
    env.sql("UPDATE comb.messages SET payload = convert_to('{\"n\": 1', 'UTF8')");
    env.push(json!([{"queue": "bent", "payload": {"n": 2}}]))
        .await;
    for auto_ack in [false, true] {
        let group = if auto_ack { "auto" } else { "leased" };
        let pop = env
            .pop(&format!(
                "/api/v1/pop/queue/bent?batch=10&autoAck={auto_ack}&consumerGroup={group}"
            ))
            .await
            .expect("the readable message");
        assert_eq!(common::numbers(&pop), vec![2], "{pop}");
        let (s, dlq) = env
            .get(&format!("/api/v1/dlq?queue=bent&consumerGroup={group}"))
            .await;
        assert_eq!(s, StatusCode::OK, "{dlq}");
        let letter = &dlq["messages"][0];
        assert_eq!(
            letter["errorMessage"], "payload_unreadable: the stored payload is not valid JSON",
            "{dlq}"
        );
    }
}

/// A database error reaches the client as a stable code, a general sentence and the request's
/// id, never as PostgreSQL's text; the server's log line with that id carries the whole cause.
#[tokio::test]
async fn an_internal_error_says_nothing_internal_and_the_log_says_all() {
    let env = Env::start().await;
    env.push(json!([{"queue": "broken", "payload": 1}])).await;
    // Something an operator might do by mistake: a table the listing reads is gone.
    env.sql("ALTER TABLE comb.dead_letters RENAME TO dead_letters_moved");
    let r = env
        .http
        .get(env.url("/api/v1/dlq?queue=broken"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let header_id = r
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .expect("x-request-id");
    let text = r.text().await.unwrap();
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["code"], "database_error", "{body}");
    assert_eq!(body["requestId"], header_id.as_str(), "{body}");
    for internal in [
        "dead_letters",
        "comb.",
        "relation",
        "does not exist",
        "SELECT",
    ] {
        assert!(!text.contains(internal), "{internal:?} in {text}");
    }
    let log = std::fs::read_to_string(env.server.log_path()).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains(&header_id))
        .unwrap_or_else(|| panic!("no log line with {header_id}:\n{log}"));
    assert!(
        line.contains("dead_letters") && line.contains("does not exist"),
        "{line}"
    );
    // Every answer carries an id, the successful ones too.
    let r = env.http.get(env.url("/health")).send().await.unwrap();
    assert!(r.headers().contains_key("x-request-id"));
}

/// The dead letters' requeue and purge parse the group and partition they are given: a name
/// that is no name is refused with its own code, and the dead letter stays where it was.
#[tokio::test]
async fn dead_letter_actions_refuse_bad_names_and_move_nothing() {
    let env = Env::start().await;
    env.configure("q", json!({"retryLimit": 0})).await;
    env.push(json!([{"queue": "q", "partition": "p", "payload": {"n": 1}}]))
        .await;
    let pop = env
        .pop("/api/v1/pop/queue/q?consumerGroup=g")
        .await
        .unwrap();
    let (s, _) = env
        .ack(&pop["messages"][0], "failed", Some("g"), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    let listed = || env.sql("SELECT count(*) FROM comb.dead_letters");
    assert_eq!(listed(), "1", "the failed message was dead-lettered");
    for path in ["/api/v1/dlq/requeue", "/api/v1/dlq/purge"] {
        for (body, code) in [
            (
                json!({"queue": "q", "consumerGroup": "g\u{1}"}),
                "consumer_group_invalid",
            ),
            (
                json!({"queue": "q", "partition": "p\u{7}"}),
                "partition_name_invalid",
            ),
            (json!({"queue": "q q"}), "queue_name_invalid"),
        ] {
            expect(&env, path, body, StatusCode::BAD_REQUEST, code).await;
        }
    }
    assert_eq!(listed(), "1", "nothing was requeued or purged");
    assert_eq!(
        env.sql("SELECT count(*) FROM comb.dead_letter_requeues"),
        "0"
    );
}
