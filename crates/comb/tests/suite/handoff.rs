//! Hand-off: a push leases what it stores to a pop waiting on its server, in its own
//! transaction, and answers that pop in memory. Every test reads `comb_handoffs_total` (or
//! its companions) from `/metrics`, so that none passes on the claim path by accident, and
//! checks a guarantee of the claim path on the new one: order under racing pushers, nothing
//! skipped, no lease leaked by a pop that went away, expiry counting an attempt, messages held
//! back by queue options, sealed payloads, fan-out, and other servers' pops.
//!
//! Servers run with a poll fallback of two minutes, so only a push (or its hand-off) answers a
//! waiting pop within a test; `comb_pops_waiting` shows the test's pops wait before it pushes
//! (a probing pop of the same group could claim what a test pushes).

use std::time::{Duration, Instant};

use crate::common::{self, Env, numbers};
use reqwest::StatusCode;
use serde_json::{Value, json};

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

const ARGS: [&str; 2] = ["--poll-fallback-ms", "120000"];

/// Hand-off is switched on by this variable.
const ON: (&str, &str) = ("COMB_HANDOFF", "on");

/// Waits until `n` pops wait on the server at `base`.
async fn until_waiting(http: &reqwest::Client, base: &str, n: u64) {
    common::until("the pops wait", || async {
        common::metric_at(http, base, "comb_pops_waiting").await == n
    })
    .await;
}

/// How many hand-offs a scenario makes on this run's backend: `n` on PostgreSQL, none on
/// Citus, where a push stores through statements sent to the partition's worker and hands
/// nothing off (`docs/scale-out.md`). There the same scenario runs through wake-ups and
/// claims, and every other assertion of the test holds as it is.
fn handoffs(n: u64) -> u64 {
    if common::on_citus() { 0 } else { n }
}

/// A counter of `/metrics` (0 when absent).
async fn counter(env: &Env, name: &str) -> u64 {
    common::metric_at(&env.http, &env.server.base_url(), name).await
}

/// Starts a pop of `queue` waiting a minute (`extra`: more query parameters) and returns once
/// it waits.
async fn waiter(
    env: &Env,
    queue: &str,
    extra: &str,
) -> tokio::task::JoinHandle<(StatusCode, Value, Duration)> {
    let w = common::waiting_pop(env.url(&format!(
        "/api/v1/pop/queue/{queue}?wait=true&timeout=60000{extra}"
    )));
    until_waiting(&env.http, &env.server.base_url(), 1).await;
    w
}

async fn answered(w: tokio::task::JoinHandle<(StatusCode, Value, Duration)>) -> Value {
    let (s, b, _) = w.await.unwrap();
    assert_eq!(s, StatusCode::OK, "{b}");
    b
}

#[tokio::test]
async fn a_push_hands_its_message_to_a_waiting_pop_under_a_lease_it_acks() {
    let env = Env::start_with_env(&ARGS, &[ON]).await;
    env.configure("q", json!({})).await;
    let w = waiter(&env, "q", "").await;
    env.push(json!([{"queue": "q", "payload": {"n": 1}}])).await;
    let pop = answered(w).await;
    assert_eq!(numbers(&pop), vec![1]);
    assert_eq!(
        counter(&env, "comb_handoffs_total").await,
        handoffs(1),
        "{pop}"
    );
    let m = common::one(&pop);
    assert!(m["leaseId"].is_string(), "{pop}");
    assert_eq!(m["attempt"], 1, "{pop}");
    assert_eq!(m["consumerGroup"], "__QUEUE_MODE__", "{pop}");
    // The lease is the cursor's: the message is not handed out again while it lives, and
    // the ack settles it.
    assert!(env.pop("/api/v1/pop/queue/q").await.is_none());
    env.ack_ok(m, "completed", None, None).await;
    assert!(env.pop("/api/v1/pop/queue/q").await.is_none());
    assert_eq!(counter(&env, "comb_handoffs_released_total").await, 0);
}

#[tokio::test]
async fn racing_pushers_into_one_partition_hand_off_in_order_and_skip_nothing() {
    let env = Env::start_with_env(&ARGS, &[ON]).await;
    env.configure("q", json!({})).await;
    const ROUNDS: i64 = 12;
    const EACH: i64 = 2 * ROUNDS;
    let consumer = {
        let url = env.url("/api/v1/pop/queue/q?wait=true&timeout=60000&batch=3");
        let http = common::client();
        let base = env.server.base_url();
        tokio::spawn(async move {
            let mut got: Vec<i64> = Vec::new();
            while got.len() < 2 * EACH as usize {
                let (s, b) = common::get_url(&http, &url).await;
                assert_eq!(s, StatusCode::OK, "a pop ran dry after {got:?}: {b}");
                let acks: Vec<Value> = b["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| {
                        json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                               "leaseId": m["leaseId"], "status": "completed"})
                    })
                    .collect();
                got.extend(numbers(&b));
                let r = http
                    .post(format!("{base}/api/v1/ack/batch"))
                    .json(&json!({"acknowledgments": acks}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), StatusCode::OK);
            }
            got
        })
    };
    let push = |n: i64| {
        let url = env.url("/api/v1/push");
        async move {
            let r = common::client()
                .post(&url)
                .json(&json!({"items": [{"queue": "q", "payload": {"n": n}},
                                        {"queue": "q", "payload": {"n": n + 1}}]}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::CREATED);
        }
    };
    // Each round, once the consumer waits, two pushers race into the partition.
    for round in 0..ROUNDS {
        until_waiting(&env.http, &env.server.base_url(), 1).await;
        tokio::join!(push(1000 + 2 * round), push(2000 + 2 * round));
    }
    let got = consumer.await.unwrap();
    // Each pusher's messages come out in the order it pushed them, once each.
    for from in [1000, 2000] {
        let mine: Vec<i64> = got
            .iter()
            .copied()
            .filter(|n| (from..from + EACH).contains(n))
            .collect();
        assert_eq!(mine, (from..from + EACH).collect::<Vec<_>>(), "{got:?}");
    }
    assert_eq!(got.len(), 2 * EACH as usize, "{got:?}");
    // And in position order overall: what the database holds, read in order.
    let stored: Vec<i64> = env
        .sql("SELECT (convert_from(payload, 'UTF8')::jsonb->>'n') FROM comb.messages ORDER BY pos")
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(got, stored);
    assert!(
        counter(&env, "comb_handoffs_total").await >= handoffs(1),
        "no push handed off: the test ran on the claim path alone"
    );
}

#[tokio::test]
async fn a_group_not_right_before_the_push_is_not_handed_off_and_skips_nothing() {
    let env = Env::start_with_env(&ARGS, &[ON]).await;
    env.push(json!([{"queue": "q", "payload": {"n": 1}}, {"queue": "q", "payload": {"n": 2}}]))
        .await;
    let pop = env.pop("/api/v1/pop/queue/q?batch=10").await.unwrap();
    env.ack_all(&pop, "completed", None).await;
    let w = waiter(&env, "q", "&batch=10").await;
    // The group moves back to the start while its pop waits (a seek wakes nobody): its
    // next message is 1, not the one pushed next.
    let (s, b) = env
        .post(
            "/api/v1/consumer-groups/__QUEUE_MODE__/queues/q/seek",
            &json!({"toStart": true}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    env.push(json!([{"queue": "q", "payload": {"n": 3}}])).await;
    let pop = answered(w).await;
    assert_eq!(numbers(&pop), vec![1, 2, 3]);
    assert_eq!(counter(&env, "comb_handoffs_total").await, 0);
    // Nor was a lease made over messages the push did not store (the broker would give such
    // a lease back rather than hand it over).
    assert_eq!(counter(&env, "comb_handoffs_released_total").await, 0);
}

#[tokio::test]
async fn a_cursor_a_claim_holds_is_not_handed_off_and_its_push_does_not_wait() {
    let env = Env::start_with_env(&ARGS, &[ON]).await;
    env.push(json!([{"queue": "q", "payload": {"n": 1}}])).await;
    let pop = env.pop("/api/v1/pop/queue/q").await.unwrap();
    env.ack_all(&pop, "completed", None).await;
    let w = waiter(&env, "q", "&batch=10").await;
    // A session holds the group's cursor, as a claim in flight does.
    let holder = {
        let db = env.sql("SELECT current_database()");
        tokio::task::spawn_blocking(move || {
            common::database_node().psql(
                &db,
                "BEGIN; SELECT 1 FROM comb.cursors FOR NO KEY UPDATE; SELECT pg_sleep(60); COMMIT;",
            )
        })
    };
    let sleeping = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
           AND query LIKE '%pg_sleep(60)%' AND state = 'active' AND pid <> pg_backend_pid()";
    common::until("the cursor's holder sleeps", || async {
        env.sql(sleeping) == "1"
    })
    .await;
    // The push skips the held cursor: it is answered while the cursor is still held, and
    // leases nothing.
    env.push(json!([{"queue": "q", "payload": {"n": 2}}])).await;
    assert_eq!(env.sql(sleeping), "1", "the push waited for the cursor");
    assert_eq!(counter(&env, "comb_handoffs_total").await, 0);
    env.sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND query LIKE '%pg_sleep(60)%'
           AND pid <> pg_backend_pid()",
    );
    let _ = holder.await;
    // The group's next message is 2, not the next push's: that push hands off nothing
    // either, and the waiting pop claims 2 first (3 with it, or next).
    env.push(json!([{"queue": "q", "payload": {"n": 3}}])).await;
    let first = answered(w).await;
    let mut got = numbers(&first);
    if got.len() < 2 {
        env.ack_all(&first, "completed", None).await;
        got.extend(numbers(
            &env.pop("/api/v1/pop/queue/q?batch=10").await.unwrap(),
        ));
    }
    assert_eq!(got, vec![2, 3]);
    assert_eq!(counter(&env, "comb_handoffs_total").await, 0);
}

#[tokio::test]
async fn a_lease_made_for_a_pop_that_went_away_is_given_back_at_once() {
    let env = Env::start_with_env(&ARGS, &[ON]).await;
    env.push(json!([{"queue": "q", "payload": {"n": 0}}])).await;
    let pop = env.pop("/api/v1/pop/queue/q").await.unwrap();
    env.ack_all(&pop, "completed", None).await;
    // The pop waits on a client of its own, which the test drops.
    let gone = common::waiting_pop(env.url("/api/v1/pop/queue/q?wait=true&timeout=60000"));
    until_waiting(&env.http, &env.server.base_url(), 1).await;
    // A session holds the partition's row, so the push reserves the waiting pop and then
    // waits for that lock inside its transaction.
    let holder = {
        let db = env.sql("SELECT current_database()");
        tokio::task::spawn_blocking(move || {
            common::database_node()
                .psql(
                    &db,
                    "BEGIN; SELECT 1 FROM comb.partitions FOR UPDATE; SELECT pg_sleep(4); COMMIT;",
                )
                .expect("psql")
        })
    };
    common::until("the lock holder sleeps", || async {
        env.sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
               AND query LIKE '%pg_sleep(4)%' AND state = 'active' AND pid <> pg_backend_pid()",
        ) == "1"
    })
    .await;
    let push = {
        let url = env.url("/api/v1/push");
        tokio::spawn(async move {
            common::client()
                .post(url)
                .json(&json!({"items": [{"queue": "q", "payload": {"n": 1}}]}))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    common::until("the push waits for the partition", || async {
        env.sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
               AND wait_event_type = 'Lock'",
        ) == "1"
    })
    .await;
    // Its client leaves before the push commits.
    gone.abort();
    let _ = gone.await;
    assert_eq!(push.await.unwrap(), StatusCode::CREATED);
    holder.await.unwrap();
    common::until("the lease goes back", || async {
        counter(&env, "comb_handoffs_released_total").await == 1
    })
    .await;
    // Not leased: the next pop gets it at once, on its first attempt.
    let pop = env
        .pop("/api/v1/pop/queue/q")
        .await
        .expect("a leaked lease");
    assert_eq!(numbers(&pop), vec![1]);
    assert_eq!(common::one(&pop)["attempt"], 1, "{pop}");
    assert_eq!(counter(&env, "comb_handoffs_total").await, 0);
}

#[tokio::test]
async fn a_handed_off_lease_that_expires_hands_the_message_out_again_with_its_attempt() {
    let env = Env::start_with_env(&ARGS, &[ON]).await;
    env.configure("q", json!({"leaseTime": 1, "retryLimit": 5}))
        .await;
    let w = waiter(&env, "q", "").await;
    env.push(json!([{"queue": "q", "payload": {"n": 1}}])).await;
    let first = answered(w).await;
    assert_eq!(counter(&env, "comb_handoffs_total").await, handoffs(1));
    assert_eq!(common::one(&first)["attempt"], 1);
    // Not acked: once the lease ends, a pop gets it again, its attempt counted.
    let started = Instant::now();
    let again = loop {
        if let Some(pop) = env.pop("/api/v1/pop/queue/q").await {
            break pop;
        }
        assert!(
            started.elapsed() < common::PATIENCE,
            "the message never came back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(numbers(&again), vec![1]);
    assert_eq!(common::one(&again)["attempt"], 2, "{again}");
    assert_ne!(
        common::one(&again)["leaseId"],
        common::one(&first)["leaseId"]
    );
}

/// A queue whose option holds messages back: a waiting pop gets the message only once the
/// option lets it, through a claim, never handed off at once.
async fn held_back(options: Value, hold: Duration) {
    let env = Env::start_with_env(&ARGS, &[ON]).await;
    env.configure("q", options).await;
    let w = common::waiting_pop(env.url("/api/v1/pop/queue/q?wait=true&timeout=5000"));
    until_waiting(&env.http, &env.server.base_url(), 1).await;
    let pushed = Instant::now();
    env.push(json!([{"queue": "q", "payload": {"n": 1}}])).await;
    // The waiting pop may end empty (its fallback is two minutes); a later pop then finds it.
    let (s, b, _) = w.await.unwrap();
    let pop = if s == StatusCode::OK {
        b
    } else {
        env.pop_now_or_wait("q").await
    };
    assert!(
        pushed.elapsed() >= hold,
        "delivered before it was due: {pop}"
    );
    assert_eq!(numbers(&pop), vec![1]);
    assert_eq!(counter(&env, "comb_handoffs_total").await, 0);
}

#[tokio::test]
async fn delayed_processing_is_not_handed_off_early() {
    held_back(json!({"delayedProcessing": 2}), Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_window_buffer_is_not_handed_off_early() {
    held_back(json!({"windowBuffer": 2}), Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_failed_message_resting_for_its_retry_delay_is_not_passed_by_a_hand_off() {
    let env = Env::start_with_env(&ARGS, &[ON]).await;
    env.configure("q", json!({"retryDelay": 1500, "retryLimit": 5}))
        .await;
    let w = waiter(&env, "q", "").await;
    env.push(json!([{"queue": "q", "payload": {"n": 1}}])).await;
    let first = answered(w).await;
    assert_eq!(counter(&env, "comb_handoffs_total").await, handoffs(1));
    env.ack_ok(common::one(&first), "failed", None, Some("boom"))
        .await;
    let failed_at = Instant::now();
    let w = common::waiting_pop(env.url("/api/v1/pop/queue/q?wait=true&timeout=30000&batch=10"));
    until_waiting(&env.http, &env.server.base_url(), 1).await;
    env.push(json!([{"queue": "q", "payload": {"n": 2}}])).await;
    let (s, b, _) = w.await.unwrap();
    let pop = if s == StatusCode::OK {
        b
    } else {
        env.pop_now_or_wait("q").await
    };
    // The failed message comes first, after its rest; 2 is never handed out before it.
    assert_eq!(numbers(&pop)[0], 1, "{pop}");
    assert!(failed_at.elapsed() >= Duration::from_millis(1500), "{pop}");
    assert_eq!(counter(&env, "comb_handoffs_total").await, handoffs(1));
}

#[tokio::test]
async fn a_sealed_queue_hands_off_its_payload_opened() {
    let env = Env::start_with_env(&ARGS, &[ON, ("COMB_ENCRYPTION_KEY", KEY)]).await;
    env.configure("secret", json!({"encryptionEnabled": true}))
        .await;
    let w = waiter(&env, "secret", "").await;
    env.push(json!([{"queue": "secret", "payload": {"n": 5, "card": "4111"}}]))
        .await;
    let pop = answered(w).await;
    assert_eq!(counter(&env, "comb_handoffs_total").await, handoffs(1));
    assert_eq!(
        common::one(&pop)["data"],
        json!({"n": 5, "card": "4111"}),
        "{pop}"
    );
    assert_eq!(
        env.sql("SELECT get_byte(payload, 0) FROM comb.messages"),
        "0",
        "stored sealed"
    );
    env.ack_ok(common::one(&pop), "completed", None, None).await;
}

#[tokio::test]
async fn one_push_hands_off_to_a_waiting_pop_of_each_group() {
    let env = Env::start_with_env(&ARGS, &[ON]).await;
    let mut waiters = Vec::new();
    env.push(json!([{"queue": "q", "payload": {"n": 0}}])).await;
    // The probe that sees the pops waiting pops as the queue's own group: caught up too.
    let pop = env.pop("/api/v1/pop/queue/q").await.unwrap();
    env.ack_all(&pop, "completed", None).await;
    for g in ["a", "b", "c"] {
        // Each group subscribed and caught up first, so the push finds its cursor ready.
        let pop = env
            .pop(&format!("/api/v1/pop/queue/q?consumerGroup={g}"))
            .await
            .unwrap();
        env.ack_all(&pop, "completed", Some(g)).await;
    }
    for g in ["a", "b", "c"] {
        waiters.push(common::waiting_pop(env.url(&format!(
            "/api/v1/pop/queue/q?wait=true&timeout=60000&consumerGroup={g}"
        ))));
    }
    until_waiting(&env.http, &env.server.base_url(), 3).await;
    env.push(json!([{"queue": "q", "payload": {"n": 1}}])).await;
    for (w, g) in waiters.into_iter().zip(["a", "b", "c"]) {
        let pop = answered(w).await;
        assert_eq!(numbers(&pop), vec![1]);
        let m = common::one(&pop);
        assert_eq!(m["consumerGroup"], g);
        env.ack_ok(m, "completed", Some(g), None).await;
    }
    assert_eq!(counter(&env, "comb_handoffs_total").await, handoffs(3));
}

#[tokio::test]
async fn a_pop_waiting_on_another_server_is_woken_as_before() {
    let env = Env::start_with_env(&ARGS, &[ON]).await;
    let other = env.second_server_with(&ARGS).await;
    env.push(json!([{"queue": "q", "payload": {"n": 0}}])).await;
    let pop = env.pop("/api/v1/pop/queue/q").await.unwrap();
    env.ack_all(&pop, "completed", None).await;
    // Twice: the first may be answered by the other server's relay beginning to listen
    // (its pops then look again); by the second it listens, so only the push's
    // notification can wake the pop.
    for n in [8, 9] {
        let w = common::waiting_pop(format!(
            "{}/api/v1/pop/queue/q?wait=true&timeout=60000",
            other.base_url()
        ));
        until_waiting(&env.http, &other.base_url(), 1).await;
        env.push(json!([{"queue": "q", "payload": {"n": n}}])).await;
        // A pop looks once more when its wait ends: only within half of it is it woken.
        let (s, pop, waited) = w.await.unwrap();
        assert_eq!(s, StatusCode::OK, "{pop}");
        assert!(
            waited < Duration::from_secs(30),
            "answered only after {waited:?} of its 60 s wait: not woken by the push"
        );
        assert_eq!(numbers(&pop), vec![n]);
        env.ack_all(&pop, "completed", None).await;
    }
    assert_eq!(counter(&env, "comb_handoffs_total").await, 0);
    assert_eq!(
        common::metric_at(&env.http, &other.base_url(), "comb_handoffs_total").await,
        0
    );
}

/// With `--handoff off` a waiting pop claims for itself: it still gets the message, and no
/// push hands one over.
#[tokio::test]
async fn with_handoff_off_a_waiting_pop_claims_for_itself() {
    let env = Env::start_with_env(&ARGS, &[("COMB_HANDOFF", "off")]).await;
    env.configure("q", json!({})).await;
    let w = waiter(&env, "q", "").await;
    env.push(json!([{"queue": "q", "payload": {"n": 1}}])).await;
    let pop = answered(w).await;
    assert_eq!(numbers(&pop), vec![1]);
    assert_eq!(counter(&env, "comb_handoffs_total").await, 0, "{pop}");
    assert_eq!(
        common::metric_at(
            &env.http,
            &env.server.base_url(),
            "comb_registry_entries{registry=\"wake_offers\"}"
        )
        .await,
        0
    );
}
