//! Graceful stop: on SIGTERM the server answers its waiting pops with 204 at once, finishes
//! the requests in flight, and exits with status 0; every push it answered 201 is stored.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::{self, Env, client};
use reqwest::StatusCode;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_answers_waiting_pops_finishes_pushes_and_exits_cleanly() {
    // One waiting place: once a probe is refused, the pop below holds it.
    let mut env = Env::start_with(&["--max-waiting-pops", "1"]).await;
    env.push(json!([{"queue": "busy", "payload": 0}])).await;

    // A pop that would wait 60 s on a queue nobody pushes to.
    let waiting_pop =
        common::waiting_pop(env.url("/api/v1/pop/queue/idle?wait=true&timeout=60000"));

    // Pushes one after another until the server stops answering; records what was answered 201.
    let stopped = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let push_url = env.url("/api/v1/push");
    let pusher = {
        let stopped = stopped.clone();
        let answered = answered.clone();
        tokio::spawn(async move {
            let http = client();
            let mut acknowledged: Vec<String> = Vec::new();
            for round in 0.. {
                let items: Vec<Value> = (0..50)
                    .map(|i| json!({"queue": "busy", "transactionId": format!("t{round}-{i}"), "payload": i}))
                    .collect();
                match http
                    .post(&push_url)
                    .json(&json!({"items": items}))
                    .send()
                    .await
                {
                    Ok(r) if r.status() == StatusCode::CREATED => {
                        acknowledged.extend((0..50).map(|i| format!("t{round}-{i}")));
                        answered.fetch_add(1, Ordering::SeqCst);
                    }
                    // Refused while stopping (503) or the connection closed: the server is done.
                    _ if stopped.load(Ordering::SeqCst) => break,
                    Ok(r) => panic!("push answered {} before the stop", r.status()),
                    Err(e) => panic!("push failed before the stop: {e}"),
                }
            }
            acknowledged
        })
    };

    // The stop comes once the pop is waiting and pushes are being answered.
    common::until_waiting_places_are_taken(&env.http, &env.server.base_url(), "idle").await;
    common::until("a push answered", || async {
        answered.load(Ordering::SeqCst) > 0
    })
    .await;
    assert!(
        !waiting_pop.is_finished(),
        "the pop should still be waiting"
    );

    stopped.store(true, Ordering::SeqCst);
    let status = tokio::task::block_in_place(|| env.server.terminate(Duration::from_secs(60)));

    let (pop_status, body, waited) = waiting_pop.await.unwrap();
    assert_eq!(pop_status, StatusCode::NO_CONTENT, "{body}");
    assert!(
        waited < Duration::from_secs(30),
        "the waiting pop was answered only after {waited:?} (its timeout is 60 s)"
    );
    let status = status.expect("the server exits within 60 s of SIGTERM");
    assert!(
        status.success(),
        "exit status {status:?}; log:\n{}",
        env.server.log_tail(20)
    );

    let acknowledged = pusher.await.unwrap();
    assert!(
        !acknowledged.is_empty(),
        "some pushes were answered before the stop"
    );
    let stored: HashSet<String> = env
        .sql("SELECT transaction_id FROM comb.messages")
        .lines()
        .map(str::to_string)
        .collect();
    let lost: Vec<&String> = acknowledged
        .iter()
        .filter(|t| !stored.contains(*t))
        .collect();
    assert!(
        lost.is_empty(),
        "{} messages answered 201 are not stored, first: {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
}
