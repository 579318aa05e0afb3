//! The `comb` client commands against a real server: tables, `--json`, exit codes.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use crate::common::{self, Env, comb_bin};
use serde_json::{Value, json};

/// Runs `comb ARGS --url URL`; returns (exit code, stdout, stderr).
async fn comb(env: &Env, args: &[&str]) -> (i32, String, String) {
    comb_with_input(env, args, None).await
}

async fn comb_with_input(env: &Env, args: &[&str], input: Option<&str>) -> (i32, String, String) {
    let mut argv: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    argv.push("--url".into());
    argv.push(env.server.base_url());
    let input = input.map(String::from);
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new(comb_bin())
            .args(&argv)
            .env_remove("COMB_URL")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(i) = input {
            child.stdin.take().unwrap().write_all(i.as_bytes()).unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into(),
            String::from_utf8_lossy(&out.stderr).into(),
        )
    })
    .await
    .unwrap()
}

#[test]
fn comb_version_names_the_release() {
    let out = Command::new(comb_bin()).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("comb {}", env!("CARGO_PKG_VERSION"))
    );
}

/// A value out of a setting's range stops `comb serve` before it touches a database, with
/// one line naming the flag and the range.
#[test]
fn a_stream_state_generations_out_of_range_is_refused_at_start() {
    for bad in ["0", "1001", "x"] {
        let out = Command::new(comb_bin())
            .args(["serve", "--stream-state-generations", bad])
            .env("DATABASE_URL", "postgres://127.0.0.1:1/none")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--stream-state-generations") && err.contains(bad),
            "{bad}: {err}"
        );
    }
}

fn parse(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

#[tokio::test]
async fn the_cli_pushes_lists_and_steers_queues_groups_and_dead_letters() {
    let env = Env::start().await;
    env.configure("orders", json!({"retryLimit": 0})).await;

    let (code, out, err) = comb(
        &env,
        &["push", "orders", "--partition", "p1", r#"{"n": 1}"#],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("STATUS"), "a table: {out}");
    assert!(out.contains("queued"), "{out}");
    let (code, _, err) = comb_with_input(
        &env,
        &["push", "orders", "--partition", "p2", "-"],
        Some(r#"{"n": 2}"#),
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = comb(&env, &["push", "orders", "not json"]).await;
    assert_eq!(code, 4, "{err}");

    let (code, out, _) = comb(&env, &["queues"]).await;
    assert_eq!(code, 0);
    assert!(out.lines().next().unwrap().starts_with("QUEUE"), "{out}");
    assert!(
        !out.contains('\x1b'),
        "no colour when not on a terminal: {out:?}"
    );
    let line = out.lines().find(|l| l.starts_with("orders")).unwrap();
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cols[1], "2", "partitions: {line}");
    assert_eq!(cols[2], "2", "pending: {line}");
    let (code, out, _) = comb(&env, &["queues", "--json"]).await;
    assert_eq!(code, 0);
    assert_eq!(parse(&out)["queues"][0]["name"], "orders");

    let (code, out, _) = comb(&env, &["queue", "orders"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("p1") && out.contains("p2"), "{out}");
    let (code, _, err) = comb(&env, &["queue", "nope"]).await;
    assert_eq!(code, 3, "not found: {err}");
    assert!(err.contains("does not exist"), "{err}");

    let (code, out, _) = comb(
        &env,
        &["messages", "orders", "--status", "pending", "--json"],
    )
    .await;
    assert_eq!(code, 0);
    assert_eq!(parse(&out)["messages"].as_array().unwrap().len(), 2);
    let (code, _, _) = comb(&env, &["messages", "orders", "--status", "lost"]).await;
    assert_eq!(code, 4);

    // A message fails at retryLimit 0: a dead letter.
    let pop = env
        .pop("/api/v1/pop/queue/orders/partition/p1")
        .await
        .unwrap();
    env.ack(&pop["messages"][0], "failed", None, Some("boom"))
        .await;
    let (code, out, _) = comb(&env, &["dlq", "list", "orders"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("boom"), "{out}");
    let (code, out, _) = comb(&env, &["dlq", "requeue", "orders"]).await;
    assert_eq!(code, 0);
    let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        row,
        ["orders", "1", "0"],
        "queue, requeued, remaining: {out}"
    );
    let (code, out, _) = comb(&env, &["dlq", "purge", "orders", "--json"]).await;
    assert_eq!(code, 0);
    assert_eq!(parse(&out)["purged"], 1);

    let (code, out, _) = comb(&env, &["groups"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("__QUEUE_MODE__"), "{out}");
    let (code, out, _) = comb(
        &env,
        &[
            "group",
            "seek",
            "__QUEUE_MODE__",
            "orders",
            "--end",
            "--json",
        ],
    )
    .await;
    assert_eq!(code, 0);
    assert_eq!(parse(&out)["lag"], 0);
    let (code, out, _) = comb(
        &env,
        &["group", "seek", "__QUEUE_MODE__", "orders", "--end"],
    )
    .await;
    assert_eq!(code, 0);
    let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[..2], ["__QUEUE_MODE__", "orders"], "{out}");
    assert_eq!(row[3], "0", "lag after a seek to the end: {out}");
    assert!(
        env.pop("/api/v1/pop/queue/orders?autoAck=true")
            .await
            .is_none()
    );
    let (code, _, _) = comb(&env, &["group", "seek", "g", "orders"]).await;
    assert_eq!(code, 4, "no target");

    // Unreachable server.
    let (code, _, err) = tokio::task::spawn_blocking(|| {
        let out = Command::new(comb_bin())
            .args(["queues", "--url", "http://127.0.0.1:1"])
            .output()
            .unwrap();
        (
            out.status.code().unwrap(),
            (),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 1, "{err}");
}

#[tokio::test]
async fn tail_follows_new_messages_without_consuming_them() {
    let env = Env::start().await;
    env.push(json!([{"queue": "t", "payload": {"n": 0}}])).await;
    let mut child = Command::new(comb_bin())
        .args(["tail", "t", "--json", "--url", &env.server.base_url()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                return;
            }
        }
    });
    // Tail follows from the moment it starts, which is before its first look, answered by
    // the server: pushes made once that is counted are new to it.
    let looked =
        "comb_http_request_duration_seconds_count{method=\"GET\",route=\"/api/v1/messages\"} ";
    common::until("tail's first look", || async {
        env.metrics_text()
            .await
            .lines()
            .any(|l| l.starts_with(looked) && !l.ends_with(" 0"))
    })
    .await;
    // Messages pushed after tail started are printed, one look after another; the one before
    // is not.
    let mut got = Vec::new();
    for n in 1..=3 {
        env.push(json!([{"queue": "t", "payload": {"n": n}}])).await;
        let line = rx
            .recv_timeout(common::PATIENCE)
            .expect("tail prints new messages");
        got.push(
            serde_json::from_str::<Value>(&line).unwrap()["data"]["n"]
                .as_i64()
                .unwrap(),
        );
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(got, vec![1, 2, 3]);
    // Nothing was consumed.
    let drained = env.drain("/api/v1/pop/queue/t?batch=10&autoAck=true").await;
    assert_eq!(drained.len(), 4);
}
