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
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[tokio::test]
async fn connections_beyond_the_cap_are_refused_with_503() {
    let env = Env::start_with(&["--max-connections", "3"]).await;
    let addr = env.server.addr();
    let answer = tokio::task::spawn_blocking(move || {
        // Three idle connections hold every slot.
        let held: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(200));
        let refused = raw_get(addr, "/health");
        drop(held);
        std::thread::sleep(Duration::from_millis(200));
        let admitted = raw_get(addr, "/health");
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
    let url = env.url("/api/v1/pop/queue/q?wait=true&timeout=3000");
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let http = common::client();
        let url = url.clone();
        waiting.push(tokio::spawn(async move {
            http.get(url).send().await.unwrap().status()
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = env.http.get(&url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["retry-after"], "1");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["code"], "waiting_pops_exhausted");
    // A pop that does not wait is still served.
    let (s, _) = env.get("/api/v1/pop/queue/q").await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    for w in waiting {
        assert_eq!(w.await.unwrap(), StatusCode::NO_CONTENT);
    }
    // The places came back.
    let (s, _) = env.get("/api/v1/pop/queue/q?wait=true&timeout=100").await;
    assert_eq!(s, StatusCode::NO_CONTENT);
}
