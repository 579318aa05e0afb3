//! Long-poll: a waiting pop is answered as soon as a message arrives — woken by a push on the
//! same server, by a push through another server on the same database, and for a queue that
//! did not exist when it began waiting — and a requested wait longer than the server's cap is
//! cut to the cap.
//!
//! The servers run with a periodic re-check of one minute, so only a wake-up can answer these
//! pops early.

use std::time::{Duration, Instant};

use crate::common::{self, Env, get_url, numbers};
use reqwest::StatusCode;
use serde_json::{Value, json};

const NO_FALLBACK: [&str; 2] = ["--poll-fallback-ms", "60000"];

/// Starts a waiting pop on `url` in the background; resolves to its status, body and duration.
fn wait_in_background(url: String) -> tokio::task::JoinHandle<(StatusCode, Value, Duration)> {
    tokio::spawn(async move {
        let http = common::client();
        let started = Instant::now();
        let (s, b) = get_url(&http, &url).await;
        (s, b, started.elapsed())
    })
}

#[tokio::test]
async fn a_push_wakes_a_waiting_pop_on_the_same_server() {
    let env = Env::start_with(&NO_FALLBACK).await;
    env.push(json!([{"queue": "q", "payload": {"n": 0}}])).await;
    env.pop("/api/v1/pop/queue/q?autoAck=true").await.unwrap();

    let waiter =
        wait_in_background(env.url("/api/v1/pop/queue/q?wait=true&timeout=20000&autoAck=true"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    env.push(json!([{"queue": "q", "payload": {"n": 7}}])).await;
    let (s, b, elapsed) = waiter.await.unwrap();
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(numbers(&b), vec![7]);
    assert!(
        elapsed < Duration::from_secs(10),
        "returned only after {elapsed:?} of its 20 s timeout"
    );
}

#[tokio::test]
async fn a_push_wakes_a_waiting_pop_on_a_queue_created_by_that_push() {
    let env = Env::start_with(&NO_FALLBACK).await;
    let waiter = wait_in_background(env.url("/api/v1/pop/queue/fresh?wait=true&timeout=20000"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    env.push(json!([{"queue": "fresh", "payload": {"n": 1}}]))
        .await;
    let (s, b, elapsed) = waiter.await.unwrap();
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(numbers(&b), vec![1]);
    assert!(
        elapsed < Duration::from_secs(10),
        "returned only after {elapsed:?} of its 20 s timeout"
    );
}

#[tokio::test]
async fn a_push_through_another_server_wakes_a_waiting_pop() {
    let env = Env::start_with(&NO_FALLBACK).await;
    let other = env.second_server_with(&NO_FALLBACK).await;
    env.push(json!([{"queue": "q", "payload": {"n": 0}}])).await;
    env.pop("/api/v1/pop/queue/q?autoAck=true").await.unwrap();

    // Waits on server 2; the push goes through server 1.
    let waiter = wait_in_background(format!(
        "{}/api/v1/pop/queue/q?wait=true&timeout=20000&autoAck=true",
        other.base_url()
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    env.push(json!([{"queue": "q", "payload": {"n": 9}}])).await;
    let (s, b, elapsed) = waiter.await.unwrap();
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(numbers(&b), vec![9]);
    assert!(
        elapsed < Duration::from_secs(10),
        "server 2 answered only after {elapsed:?} of its 20 s timeout: \
         pushes through another server do not wake it"
    );
}

#[tokio::test]
async fn a_timeout_above_the_servers_cap_is_cut_to_the_cap() {
    let env = Env::start_with(&["--max-poll-timeout-ms", "500"]).await;
    let started = Instant::now();
    let (s, b) = env
        .get("/api/v1/pop/queue/empty?wait=true&timeout=60000")
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "a 60 s wait was not capped at 500 ms: {:?}",
        started.elapsed()
    );
}
