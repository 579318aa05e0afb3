//! Following the primary: a database URL naming several servers, the first of them down and
//! one a read-only standby; a switchover that makes the primary read-only under a running
//! server; and no primary at all. Two clusters of their own stand in for a primary and a
//! standby: `default_transaction_read_only` makes a server refuse writes exactly as a hot
//! standby does (SQLSTATE 25006), and a reload flips it under open connections, as a
//! demotion would. And a push that the database undoes to break a deadlock, which the
//! server stores again rather than failing.

use std::time::{Duration, Instant};

use crate::common;

use comb_harness::{Postgres, Server};
use serde_json::{Value, json};

fn read_only(pg: &Postgres, on: bool) {
    let value = if on { "on" } else { "off" };
    pg.psql(
        "postgres",
        &format!("ALTER SYSTEM SET default_transaction_read_only = {value}"),
    )
    .unwrap();
    pg.psql("postgres", "SELECT pg_reload_conf()").unwrap();
}

fn stored(pg: &Postgres, queue: &str) -> i64 {
    pg.psql(
        "failover",
        &format!(
            "SELECT count(*) FROM comb.messages m JOIN comb.partitions p ON p.id = m.partition_id \
             JOIN comb.queues q ON q.id = p.queue_id WHERE q.name = '{queue}'"
        ),
    )
    .unwrap()
    .parse()
    .unwrap()
}

async fn push(http: &reqwest::Client, base: &str, queue: &str) -> (u16, bool, Value) {
    let r = http
        .post(format!("{base}/api/v1/push"))
        .json(&json!({"items": [{"queue": queue, "payload": {"n": 1}}]}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let retry_after = r.headers().contains_key("retry-after");
    (status, retry_after, r.json().await.unwrap_or(Value::Null))
}

/// Pushes until one is answered 201 (within the tests' patience); every other answer must be
/// a 503 with `Retry-After`.
async fn push_until_accepted(http: &reqwest::Client, base: &str, queue: &str) -> u32 {
    let started = Instant::now();
    let mut refused = 0;
    loop {
        let (status, retry_after, body) = push(http, base, queue).await;
        if status == 201 {
            return refused;
        }
        assert_eq!(status, 503, "{body}");
        assert!(retry_after, "503 without Retry-After: {body}");
        refused += 1;
        assert!(
            started.elapsed() < common::PATIENCE,
            "pushes refused for {:?}: {body}",
            common::PATIENCE
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn ready(http: &reqwest::Client, base: &str) -> (u16, Value) {
    let r = http.get(format!("{base}/ready")).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test]
async fn comb_follows_the_primary_among_several_servers() {
    let (a, b) = tokio::task::spawn_blocking(|| {
        let a = Postgres::start().unwrap();
        let b = Postgres::start().unwrap();
        for pg in [&a, &b] {
            pg.psql("postgres", "CREATE DATABASE failover").unwrap();
        }
        (a, b)
    })
    .await
    .unwrap();
    // A has the schema too (as a standby would, by replication); then it is a standby.
    let migrated = std::process::Command::new(common::comb_bin())
        .arg("migrate")
        .env("DATABASE_URL", a.url("failover"))
        .output()
        .unwrap();
    assert!(migrated.status.success(), "{migrated:?}");
    read_only(&a, true);
    let down = comb_harness::free_port();
    let url = format!(
        "postgres://postgres@127.0.0.1:{down},127.0.0.1:{},127.0.0.1:{}/failover?target_session_attrs=read-write",
        a.port(),
        b.port()
    );
    let server = tokio::task::spawn_blocking({
        let url = url.clone();
        move || Server::start(common::comb_bin(), &url, &[]).unwrap()
    })
    .await
    .unwrap();
    let base = server.base_url();
    let http = common::client();

    // The first server is down and the second read-only: pushes go to the third.
    assert_eq!(push_until_accepted(&http, &base, "before").await, 0);
    assert_eq!(stored(&b, "before"), 1);
    assert_eq!(stored(&a, "before"), 0);
    let (status, body) = ready(&http, &base).await;
    assert_eq!(status, 200, "{body}");

    // Switchover: the primary refuses writes on the connections the pool holds, the other
    // server takes writes. Pushes are refused with 503 at most while the pool moves.
    read_only(&b, true);
    read_only(&a, false);
    push_until_accepted(&http, &base, "after").await;
    for _ in 0..20 {
        push_until_accepted(&http, &base, "after").await;
    }
    assert_eq!(stored(&a, "after"), 21);
    assert_eq!(stored(&b, "after"), 0);

    // No primary at all: 503 with Retry-After, and /ready says why.
    read_only(&a, true);
    let started = Instant::now();
    loop {
        let (status, retry_after, body) = push(&http, &base, "none").await;
        if status == 503 {
            assert!(retry_after, "{body}");
            assert_eq!(body["code"], "database_unavailable", "{body}");
            break;
        }
        assert_eq!(status, 201, "{body}");
        assert!(started.elapsed() < common::PATIENCE);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Each connection still open on the demoted server is dropped when found read-only;
    // then no server is the primary, and /ready lists what each said.
    let mut reasons = Vec::new();
    loop {
        let (status, body) = ready(&http, &base).await;
        assert_eq!(status, 503, "{body}");
        let reason = body["reason"].as_str().unwrap_or_default().to_string();
        assert!(reason.contains("read-only"), "{body}");
        reasons.push(reason.clone());
        if reason.contains("no primary among the servers") {
            assert!(reason.contains(&format!("127.0.0.1:{down}")), "{body}");
            break;
        }
        assert!(reasons.len() < 50, "{reasons:?}");
    }
    assert_eq!(stored(&a, "none"), 0);
    assert_eq!(stored(&b, "none"), 0);

    // And back: the first server that takes writes again serves.
    read_only(&b, false);
    push_until_accepted(&http, &base, "back").await;
    assert_eq!(stored(&b, "back"), 1);
    assert!(!server.log_tail(10_000).contains("panicked"));
}

#[tokio::test]
async fn ready_and_metrics_say_acknowledged_writes_would_not_survive_a_failover() {
    // A lone cluster has no standby: a failover (were one configured) would lose writes.
    let env = common::Env::start().await;
    let started = Instant::now();
    let body = loop {
        let (status, body) = ready(&env.http, &env.server.base_url()).await;
        assert_eq!(status, 200, "{body}");
        if body.get("durability").is_some() {
            break body;
        }
        assert!(started.elapsed() < common::PATIENCE, "{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let d = &body["durability"];
    assert_eq!(d["survivesFailover"], false, "{body}");
    assert_eq!(d["standbys"], 0, "{body}");
    assert_eq!(d["synchronousStandbyNames"], "", "{body}");
    assert!(
        d["summary"].as_str().unwrap().contains("no standby"),
        "{body}"
    );
    let metrics = crate::common::metrics_at(&env.http, &env.server.base_url()).await;
    assert!(
        metrics.contains("\ncomb_database_sync_replication 0\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("\ncomb_database_synchronous_standbys 0\n"),
        "{metrics}"
    );
}

/// A push the database rolls back to break a deadlock is stored on the next attempt, once,
/// and its producer gets its answer, not a 500. A session takes the segments' table, the
/// push locks its partition and waits for that table, then the session asks for the
/// partition's row: the push, which waited first, finds the deadlock and is undone.
#[tokio::test]
async fn a_push_undone_to_break_a_deadlock_is_stored_again() {
    let env = common::Env::start().await;
    env.push(json!([{"queue": "q", "partition": "p", "payload": {"n": 0}}]))
        .await;
    let (session, conn) = tokio_postgres::connect(&env.db_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    session
        .batch_execute("BEGIN; LOCK TABLE comb.segments IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let http = common::client();
    let url = env.url("/api/v1/push");
    let push = tokio::spawn(async move {
        let body = json!({"items": [{"queue": "q", "partition": "p", "payload": {"n": 1}}]});
        let r = http.post(url).json(&body).send().await.unwrap();
        let status = r.status();
        (status, r.text().await.unwrap())
    });
    common::eventually(common::PATIENCE, "the push waits for the segments", || {
        env.sql(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE wait_event_type = 'Lock' AND query LIKE '%store_batch%'",
        ) == "1"
    })
    .await;
    let row = tokio::spawn(async move {
        session
            .batch_execute("SELECT 1 FROM comb.partitions WHERE name = 'p' FOR UPDATE; COMMIT")
            .await
    });
    let (status, body) = push.await.unwrap();
    assert_eq!(status, reqwest::StatusCode::CREATED, "{body}");
    row.await.unwrap().unwrap();
    assert_eq!(env.message_count(), 2);
    let log = env.server.log_tail(400);
    assert!(
        log.contains("push batch rolled back by a conflict"),
        "the push was not the one undone: {log}"
    );
}
