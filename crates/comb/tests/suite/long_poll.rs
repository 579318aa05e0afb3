//! Long-poll: a waiting pop is answered as soon as a message arrives — woken by a push on the
//! same server, by a push through another server on the same database, and for a queue that
//! did not exist when it began waiting — and a requested wait longer than the server's cap is
//! cut to the cap.
//!
//! The servers run with a periodic re-check of two minutes and the pops wait one minute (the
//! server's cap), so only a wake-up can answer them within half of it, however loaded the
//! machine. Each server has one waiting place: a probe refused with 429 shows that the pop
//! is waiting before the push that should wake it is made.

use std::time::{Duration, Instant};

use crate::common::{self, Env, numbers};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

const NO_FALLBACK: [&str; 4] = ["--poll-fallback-ms", "120000", "--max-waiting-pops", "1"];

/// Awaits a waiting pop (of a minute) and checks that it was answered with message `n`
/// within half of its wait: woken by `by`.
async fn woken(waiter: JoinHandle<(StatusCode, Value, Duration)>, n: i64, by: &str) {
    let (s, b, elapsed) = waiter.await.unwrap();
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(numbers(&b), vec![n]);
    assert!(
        elapsed < Duration::from_secs(30),
        "answered only after {elapsed:?} of its 60 s wait: not woken by {by}"
    );
}

#[tokio::test]
async fn a_push_wakes_a_waiting_pop_on_the_same_server() {
    let env = Env::start_with(&NO_FALLBACK).await;
    env.push(json!([{"queue": "q", "payload": {"n": 0}}])).await;
    env.pop("/api/v1/pop/queue/q?autoAck=true").await.unwrap();

    let waiter =
        common::waiting_pop(env.url("/api/v1/pop/queue/q?wait=true&timeout=60000&autoAck=true"));
    common::until_waiting_places_are_taken(&env.http, &env.server.base_url(), "q").await;
    env.push(json!([{"queue": "q", "payload": {"n": 7}}])).await;
    woken(waiter, 7, "a push on its server").await;
}

#[tokio::test]
async fn a_push_wakes_a_waiting_pop_on_a_queue_created_by_that_push() {
    let env = Env::start_with(&NO_FALLBACK).await;
    let waiter = common::waiting_pop(env.url("/api/v1/pop/queue/fresh?wait=true&timeout=60000"));
    common::until_waiting_places_are_taken(&env.http, &env.server.base_url(), "fresh").await;
    env.push(json!([{"queue": "fresh", "payload": {"n": 1}}]))
        .await;
    woken(waiter, 1, "the push that made its queue").await;
}

#[tokio::test]
async fn a_push_through_another_server_wakes_a_waiting_pop() {
    let env = Env::start_with(&NO_FALLBACK).await;
    let other = env.second_server_with(&NO_FALLBACK).await;
    env.push(json!([{"queue": "q", "payload": {"n": 0}}])).await;
    env.pop("/api/v1/pop/queue/q?autoAck=true").await.unwrap();

    // Waits on server 2; the push goes through server 1.
    let waiter = common::waiting_pop(format!(
        "{}/api/v1/pop/queue/q?wait=true&timeout=60000&autoAck=true",
        other.base_url()
    ));
    common::until_waiting_places_are_taken(&env.http, &other.base_url(), "q").await;
    env.push(json!([{"queue": "q", "payload": {"n": 9}}])).await;
    woken(waiter, 9, "a push through another server").await;
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
        started.elapsed() < Duration::from_secs(30),
        "a 60 s wait was not capped at 500 ms: {:?}",
        started.elapsed()
    );
}

/// The connections that relay pushes between servers: they listen, then ping every 5 s.
const RELAYS: &str = "FROM pg_stat_activity WHERE datname = current_database() \
    AND pid <> pg_backend_pid() AND (query LIKE 'LISTEN %' OR query = 'SELECT 1')";

/// Starts a second server on `env`'s database and, once both relays listen, a pop of queue
/// `q` waiting on it (auto-ack): the server, to keep, and the pop.
async fn beside_a_second_server_waiting(
    env: &Env,
) -> (
    comb_harness::Server,
    JoinHandle<(StatusCode, Value, Duration)>,
) {
    let other = env.second_server_with(&NO_FALLBACK).await;
    common::eventually(common::PATIENCE, "both servers listen", || {
        env.sql(&format!("SELECT count(*) {RELAYS}")) == "2"
    })
    .await;
    let waiter = common::waiting_pop(format!(
        "{}/api/v1/pop/queue/q?wait=true&timeout=60000&autoAck=true",
        other.base_url()
    ));
    common::until_waiting_places_are_taken(&env.http, &other.base_url(), "q").await;
    (other, waiter)
}

#[tokio::test]
async fn a_server_alone_sends_no_push_notification_and_one_beside_another_does() {
    let env = Env::start_with(&NO_FALLBACK).await;
    let base = env.server.base_url();
    common::eventually(common::PATIENCE, "its relay listens", || {
        env.sql(&format!("SELECT count(*) {RELAYS}")) == "1"
    })
    .await;
    env.push(json!([{"queue": "q", "payload": {"n": 0}}])).await;
    common::until("the push's notification is not sent", || async {
        common::metric_at(&env.http, &base, "comb_push_notifications_unsent_total").await == 1
    })
    .await;
    assert_eq!(
        common::metric_at(&env.http, &base, "comb_push_notifications_total").await,
        0
    );
    env.pop("/api/v1/pop/queue/q?autoAck=true").await.unwrap();

    // Beside a second server, server 1's pushes are announced, and wake its pops.
    let (_other, waiter) = beside_a_second_server_waiting(&env).await;
    env.push(json!([{"queue": "q", "payload": {"n": 4}}])).await;
    woken(waiter, 4, "a push through another server").await;
    assert_eq!(
        common::metric_at(&env.http, &base, "comb_push_notifications_total").await,
        1
    );
}

#[tokio::test]
async fn a_push_made_while_the_relay_reconnects_still_wakes_a_waiting_pop() {
    let env = Env::start_with(&NO_FALLBACK).await;
    let (_other, waiter) = beside_a_second_server_waiting(&env).await;

    // The relays lose their connections and wait a second before connecting again; the push
    // through server 1 is made meanwhile, when no server listens for its notification.
    assert_eq!(
        env.sql(&format!(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) {RELAYS}"
        )),
        "2"
    );
    env.push(json!([{"queue": "q", "payload": {"n": 5}}])).await;
    woken(waiter, 5, "a push made while its relay reconnected").await;
}
