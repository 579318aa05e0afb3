//! `POST /api/v1/lease/{leaseId}/extend`: a live lease can be made longer, and the partition
//! then stays with its consumer past the original end; an ended lease is never revived; bad
//! ids and bad durations are refused.

use std::time::{Duration, Instant};

use crate::common::{Env, numbers};
use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn extend(env: &Env, lease: &str, body: Value) -> (StatusCode, Value) {
    env.post(&format!("/api/v1/lease/{lease}/extend"), &body)
        .await
}

/// The original lease of [`an_extended_lease_keeps_the_partition_past_its_original_end`]:
/// long enough for the extension to reach it while it holds on a machine many times slower
/// than usual, short enough to wait past its end.
const ORIGINAL: Duration = Duration::from_secs(3);

#[tokio::test]
async fn an_extended_lease_keeps_the_partition_past_its_original_end() {
    let env = Env::start().await;
    env.configure("q", json!({"leaseTime": ORIGINAL.as_secs()}))
        .await;
    env.push(json!([
        {"queue": "q", "payload": {"n": 1}},
        {"queue": "q", "payload": {"n": 2}},
    ]))
    .await;
    let pop = env.pop("/api/v1/pop/queue/q").await.unwrap();
    let leased_at = Instant::now();
    let lease = pop["leaseId"].as_str().unwrap().to_string();
    let asked_at = Utc::now();

    let (s, b) = extend(&env, &lease, json!({"seconds": 30})).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let r = &b[0];
    assert_eq!(b.as_array().map(Vec::len), Some(1), "{b}");
    assert_eq!(r["leaseId"], lease.as_str(), "{b}");
    assert_eq!(r["success"], true, "{b}");
    let expires: DateTime<Utc> = r["expiresAt"]
        .as_str()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .unwrap_or_else(|| panic!("expiresAt is an RFC 3339 time: {b}"))
        .with_timezone(&Utc);
    assert!(
        expires > asked_at + chrono::Duration::seconds(29),
        "expiresAt {expires} is about 30 s after {asked_at}"
    );
    assert!(
        expires < asked_at + chrono::Duration::seconds(90),
        "expiresAt {expires} is about 30 s after {asked_at}"
    );

    // Past the original end the partition is still leased: another consumer gets nothing.
    tokio::time::sleep_until((leased_at + ORIGINAL + Duration::from_millis(500)).into()).await;
    assert!(
        env.pop("/api/v1/pop/queue/q").await.is_none(),
        "the partition was handed out although its lease was extended"
    );
    // The lease still acks, and settling the batch releases the partition.
    let results = env.ack_all(&pop, "completed", None).await;
    assert_eq!(results[0]["success"], true, "{results:?}");
    let next = env.pop("/api/v1/pop/queue/q").await.expect("2 is next");
    assert_eq!(numbers(&next), vec![2]);
}

#[tokio::test]
async fn an_ended_lease_cannot_be_revived() {
    let env = Env::start().await;
    env.configure("q", json!({"leaseTime": 1})).await;
    env.push(json!([
        {"queue": "q", "payload": {"n": 1}},
        {"queue": "q", "payload": {"n": 2}},
    ]))
    .await;

    // Ended by running out.
    let pop = env.pop("/api/v1/pop/queue/q").await.unwrap();
    let lease = pop["leaseId"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (s, b) = extend(&env, &lease, json!({"seconds": 5})).await;
    assert_eq!(s, StatusCode::CONFLICT, "{b}");
    assert_eq!(b["code"], "lease_invalid", "{b}");
    // The partition is free for anyone, under a new lease (long enough to be settled below).
    env.configure("q", json!({"leaseTime": 30})).await;
    // Waiting pops: a look that finds the cursor held for a moment (maintenance) waits.
    let again = env
        .pop("/api/v1/pop/queue/q?wait=true&timeout=10000")
        .await
        .expect("1 is back");
    assert_eq!(numbers(&again), vec![1]);
    assert_ne!(again["leaseId"], pop["leaseId"]);

    // Ended by settling every message of the batch.
    let results = env.ack_all(&again, "completed", None).await;
    assert_eq!(results[0]["success"], true, "{results:?}");
    let lease = again["leaseId"].as_str().unwrap();
    let (s, b) = extend(&env, lease, json!({"seconds": 5})).await;
    assert_eq!(s, StatusCode::CONFLICT, "{b}");
    assert_eq!(b["code"], "lease_invalid", "{b}");
    let next = env
        .pop("/api/v1/pop/queue/q?wait=true&timeout=10000")
        .await
        .expect("2 is free");
    assert_eq!(numbers(&next), vec![2]);
}

#[tokio::test]
async fn unknown_and_malformed_ids_and_bad_durations_are_refused() {
    let env = Env::start().await;
    env.push(json!([{"queue": "q", "payload": {"n": 1}}])).await;
    let pop = env.pop("/api/v1/pop/queue/q").await.unwrap();
    let lease = pop["leaseId"].as_str().unwrap().to_string();

    let unknown = uuid::Uuid::new_v4().to_string();
    let (s, b) = extend(&env, &unknown, json!({"seconds": 5})).await;
    assert!(
        (s == StatusCode::CONFLICT && b["code"] == "lease_invalid")
            || (s == StatusCode::NOT_FOUND && b["code"] == "lease_not_found"),
        "{s} {b}"
    );

    let (s, b) = extend(&env, "not-a-lease", json!({"seconds": 5})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
    assert_eq!(b["code"], "lease_id_invalid", "{b}");

    // `{}` (what Queen's clients send) extends by the queue's leaseTime: see queen_compat.rs.
    for body in [
        json!({"seconds": 0}),
        json!({"seconds": -5}),
        json!({"seconds": 10_000_000_000u64}),
        json!({"seconds": "soon"}),
    ] {
        let (s, b) = extend(&env, &lease, body.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body} -> {b}");
    }

    // None of that touched the live lease: it still acks.
    let results = env.ack_all(&pop, "completed", None).await;
    assert_eq!(results[0]["success"], true, "{results:?}");
}
