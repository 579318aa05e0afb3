//! Resource limits: past the cap on connections or on waiting pops, clients get a clear
//! 503 or 429 with `Retry-After` instead of the server growing without bound.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::common::{self, Env};
use reqwest::StatusCode;

/// Sends one GET over a new connection and returns the raw answer.
fn raw_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // A server past its cap answers 503 and closes at once, maybe before the request is
    // written (a broken pipe): what it sent is still read, and callers ask again.
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Asks `path` on new connections until an answer starts with `status` or the tests'
/// patience runs out, and returns the last answer: the server notices opened and closed
/// connections on its own time, which on a loaded machine is not within any fixed sleep.
fn answer_until(addr: std::net::SocketAddr, path: &str, status: &str) -> String {
    let start = std::time::Instant::now();
    loop {
        let answer = raw_get(addr, path);
        if answer.starts_with(status) || start.elapsed() > common::PATIENCE {
            return answer;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test]
async fn connections_beyond_the_cap_are_refused_with_503() {
    let env = Env::start_with(&["--max-connections", "3"]).await;
    let addr = env.server.addr();
    let answer = tokio::task::spawn_blocking(move || {
        // Three idle connections hold every slot.
        let held: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let refused = answer_until(addr, "/health", "HTTP/1.1 503");
        drop(held);
        let admitted = answer_until(addr, "/health", "HTTP/1.1 200");
        (refused, admitted)
    })
    .await
    .unwrap();
    let (refused, admitted) = answer;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("retry-after: 1"), "{refused}");
    assert!(
        refused.contains("\"code\":\"connections_exhausted\""),
        "{refused}"
    );
    assert!(admitted.starts_with("HTTP/1.1 200"), "{admitted}");
}

#[tokio::test]
async fn waiting_pops_beyond_the_cap_are_refused_with_429() {
    let env = Env::start_with(&["--max-waiting-pops", "2"]).await;
    // Long enough never to end by themselves while the test runs; pushes end them below.
    let url = env.url("/api/v1/pop/queue/q?wait=true&timeout=60000&autoAck=true&batch=1");
    let waiting = [common::waiting_pop(url.clone()), common::waiting_pop(url)];
    // The third pop that would wait is refused once both are waiting.
    let r = common::until_waiting_places_are_taken(&env.http, &env.server.base_url(), "q").await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["retry-after"], "1");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["code"], "waiting_pops_exhausted");
    // A pop that does not wait is still served.
    let (s, _) = env.get("/api/v1/pop/queue/q").await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    // A message for each waiting pop ends both waits.
    env.push(serde_json::json!([
        {"queue": "q", "partition": "a", "payload": 1},
        {"queue": "q", "partition": "b", "payload": 2},
    ]))
    .await;
    let mut got = Vec::new();
    for w in waiting {
        let (s, b, _) = w.await.unwrap();
        assert_eq!(s, StatusCode::OK, "{b}");
        got.push(b["messages"][0]["data"].as_i64().unwrap());
    }
    got.sort();
    assert_eq!(got, [1, 2]);
    // The places came back.
    let (s, _) = env.get("/api/v1/pop/queue/q?wait=true&timeout=100").await;
    assert_eq!(s, StatusCode::NO_CONTENT);
}
