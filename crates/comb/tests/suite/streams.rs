//! Queen's streams routes over HTTP: registration, cycles committed whole or not at all (with
//! Comb's lease check, stricter than Queen's), the gate's ordered partial ack, state reads, bad
//! input refused with nothing committed, and the listing. Queen's own SDK drives the same
//! routes in `clients/queen-python/test_streams.py`.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{Env, numbers};

const GROUP: &str = "streams.q";

/// Registers query `q` reading `src` into `sink`; returns its id.
async fn register(env: &Env, hash: &str, reset: bool) -> (StatusCode, Value) {
    env.post(
        "/streams/v1/queries",
        &json!({"name": "q", "source_queue": "src", "sink_queue": "sink",
                "config_hash": hash, "reset": reset}),
    )
    .await
}

/// Pushes `n` messages into `src` partition `p` and pops them for the query's group.
async fn leased(env: &Env, n: i64, batch: i64) -> Value {
    let items: Vec<Value> = (0..n)
        .map(|i| json!({"queue": "src", "partition": "p", "payload": {"n": i}, "transactionId": format!("m{i}")}))
        .collect();
    env.push(Value::Array(items)).await;
    env.pop(&format!(
        "/api/v1/pop/queue/src?consumerGroup={GROUP}&batch={batch}"
    ))
    .await
    .expect("the pushed messages")
}

/// A cycle on the popped partition: state ops, one sink push, and the ack of `count`.
fn cycle(query: &Value, pop: &Value, count: usize, state_ops: Value) -> Value {
    let m = &pop["messages"][count - 1];
    json!({
        "query_id": query, "partition_id": pop["partitionId"], "consumer_group": GROUP,
        "state_ops": state_ops,
        "push_items": [{"queue": "sink", "partition": "p", "payload": {"sum": count}}],
        "ack": {"transactionId": m["transactionId"], "leaseId": m["leaseId"],
                "status": "completed", "count": count},
    })
}

async fn state(env: &Env, query: &Value, partition: &Value) -> Value {
    let (s, body) = env
        .post(
            "/streams/v1/state/get",
            &json!({"query_id": query, "partition_id": partition, "keys": []}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    body["rows"].clone()
}

fn sink_count(env: &Env) -> String {
    env.sql(
        "SELECT count(*) FROM comb.messages m JOIN comb.partitions p ON p.id = m.partition_id \
         JOIN comb.queues q ON q.id = p.queue_id WHERE q.name = 'sink'",
    )
}

#[tokio::test]
async fn a_query_is_registered_once_per_hash_and_a_changed_one_only_with_reset() {
    let env = Env::start().await;
    let (s, first) = register(&env, "h1", false).await;
    assert_eq!(s, StatusCode::OK, "{first}");
    assert_eq!(
        (first["fresh"].as_bool(), first["reset"].as_bool()),
        (Some(true), Some(false))
    );
    let (s, again) = register(&env, "h1", false).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(again["query_id"], first["query_id"], "idempotent");
    assert_eq!(again["fresh"], false);
    assert_eq!(env.sql("SELECT count(*) FROM comb.stream_queries"), "1");

    let (s, changed) = register(&env, "h2", false).await;
    assert_eq!(s, StatusCode::CONFLICT, "{changed}");
    assert_eq!(changed["code"], "stream_config_changed");
    assert!(
        changed["error"]
            .as_str()
            .unwrap()
            .starts_with("config_hash mismatch"),
        "Queen's SDK shows this text: {changed}"
    );
    let (s, reset) = register(&env, "h2", true).await;
    assert_eq!(s, StatusCode::OK, "{reset}");
    assert_eq!(reset["reset"], true);
    assert_ne!(reset["query_id"], first["query_id"]);
    // The old id is replaced: its cycles are refused.
    let pop = leased(&env, 1, 1).await;
    let (s, old) = env
        .post(
            "/streams/v1/cycle",
            &cycle(&first["query_id"], &pop, 1, json!([])),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{old}");
    assert_eq!(old["code"], "stream_query_replaced");
}

#[tokio::test]
async fn a_cycle_commits_state_sink_and_ack_together() {
    let env = Env::start().await;
    let query = register(&env, "h", false).await.1["query_id"].clone();
    let pop = leased(&env, 3, 10).await;
    let ops = json!([
        {"type": "upsert", "key": "win\u{1f}1", "value": {"acc": 3, "windowEnd": 1000}},
        {"type": "upsert", "key": "win\u{1f}2", "value": {"acc": 1, "windowEnd": 2000}},
    ]);
    let (s, done) = env
        .post("/streams/v1/cycle", &cycle(&query, &pop, 3, ops))
        .await;
    assert_eq!(s, StatusCode::OK, "{done}");
    assert_eq!(done["success"], true);
    assert_eq!(done["state_ops_applied"], 2);
    assert_eq!(done["ack_result"]["count"], 3);
    assert_eq!(done["ack_result"]["lease_released"], true);
    assert_eq!(done["push_results"][0]["status"], "queued");
    assert_eq!(sink_count(&env), "1");
    let rows = state(&env, &query, &pop["partitionId"]).await;
    assert_eq!(rows.as_array().unwrap().len(), 2, "{rows}");
    assert_eq!(rows[0]["value"]["acc"], 3);
    // The source is settled for the query's group.
    assert!(
        env.pop(&format!("/api/v1/pop/queue/src?consumerGroup={GROUP}"))
            .await
            .is_none()
    );
    // A delete, and a filtered read: by prefix and by ripeness.
    let (s, _) = env
        .post(
            "/streams/v1/cycle",
            &json!({"query_id": query, "partition_id": pop["partitionId"],
                    "consumer_group": GROUP,
                    "state_ops": [{"type": "delete", "key": "win\u{1f}2"},
                                  {"type": "upsert", "key": "other", "value": 7}]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (_, ripe) = env
        .post(
            "/streams/v1/state/get",
            &json!({"query_id": query, "partition_id": pop["partitionId"],
                    "key_prefix": "win\u{1f}", "ripe_at_or_before": 1500}),
        )
        .await;
    let keys: Vec<&str> = ripe["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, vec!["win\u{1f}1"]);
    // The state as rows, and in the listing.
    assert_eq!(
        env.sql("SELECT string_agg(key || '=' || value::text, ',' ORDER BY key) FROM comb.stream_state_now"),
        "other=7,win\u{1f}1={\"acc\": 3, \"windowEnd\": 1000}"
    );
    let (s, listed) = env.get("/api/v1/streams/queries").await;
    assert_eq!(s, StatusCode::OK);
    let q = &listed["queries"][0];
    assert_eq!(
        (q["name"].as_str(), q["sourceQueue"].as_str()),
        (Some("q"), Some("src"))
    );
    assert_eq!(q["partitions"][0]["partition"], "p");
    assert_eq!(q["partitions"][0]["stateKeys"], 2);
    // Times as every answer gives them: UTC to the millisecond.
    for t in [&q["registeredAt"], &q["partitions"][0]["updatedAt"]] {
        let t = t.as_str().unwrap_or_default();
        let shape: String = t
            .chars()
            .map(|c| if c.is_ascii_digit() { '0' } else { c })
            .collect();
        assert_eq!(shape, "0000-00-00T00:00:00.000Z", "{t}");
    }
    assert_eq!(
        q["partitions"][0]["lag"], 0,
        "every source message settled: {q}"
    );
    // And a line of the dashboard's overview.
    let page = reqwest::get(env.url("/"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains(r#"id="stream-queries">1 (1 partitions)<"#),
        "{page}"
    );
}

/// Queen checks a cycle's lease only when `leaseId` is given; Comb always does, so a cycle
/// whose lease ended (its messages may be with another runner now) commits nothing.
#[tokio::test]
async fn a_cycle_under_an_ended_lease_commits_nothing_with_or_without_a_lease_id() {
    let env = Env::start().await;
    env.configure("src", json!({"leaseTime": 1})).await;
    let query = register(&env, "h", false).await.1["query_id"].clone();
    let pop = leased(&env, 2, 10).await;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let ops = json!([{"type": "upsert", "key": "k", "value": 1}]);
    for with_lease in [true, false] {
        let mut body = cycle(&query, &pop, 2, ops.clone());
        if !with_lease {
            body["ack"].as_object_mut().unwrap().remove("leaseId");
        }
        let (s, refused) = env.post("/streams/v1/cycle", &body).await;
        assert_eq!(s, StatusCode::CONFLICT, "{refused}");
        assert_eq!(refused["code"], "lease_invalid");
    }
    assert_eq!(state(&env, &query, &pop["partitionId"]).await, json!([]));
    assert_eq!(sink_count(&env), "0");
    // The messages come back, to be processed once.
    let again = env
        .pop(&format!(
            "/api/v1/pop/queue/src?consumerGroup={GROUP}&batch=10"
        ))
        .await
        .expect("handed out again");
    assert_eq!(numbers(&again), vec![0, 1]);
}

/// The gate's ordered partial ack: the first messages acked, the rest held back without an
/// attempt counted, and handed out again in order once the lease would have ended.
#[tokio::test]
async fn release_lease_false_acks_a_prefix_and_holds_the_rest_in_order() {
    let env = Env::start().await;
    env.configure("src", json!({"leaseTime": 2, "retryLimit": 0}))
        .await;
    let query = register(&env, "h", false).await.1["query_id"].clone();
    let pop = leased(&env, 5, 10).await;
    let mut body = cycle(&query, &pop, 2, json!([]));
    body["release_lease"] = json!(false);
    let (s, done) = env.post("/streams/v1/cycle", &body).await;
    assert_eq!(s, StatusCode::OK, "{done}");
    assert_eq!(done["ack_result"]["count"], 2);
    // Held back: nobody gets them while the lease would still hold.
    assert!(
        env.pop(&format!("/api/v1/pop/queue/src?consumerGroup={GROUP}"))
            .await
            .is_none(),
        "the rest stays away until the lease ends"
    );
    let again = env
        .pop(&format!(
            "/api/v1/pop/queue/src?consumerGroup={GROUP}&batch=10&wait=true&timeout=10000"
        ))
        .await
        .expect("the rest comes back");
    let ns: Vec<i64> = again["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["data"]["n"].as_i64().unwrap())
        .collect();
    assert_eq!(ns, vec![2, 3, 4], "in order");
    assert!(
        again["messages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["attempt"] == 1),
        "held back, not failed: no attempt counted (retryLimit 0 would dead-letter): {again}"
    );
    assert_eq!(env.sql("SELECT count(*) FROM comb.dead_letters"), "0");

    // With release_lease true, what is left of the lease comes back at once, in order.
    let first = &again["messages"][0];
    let (s, done) = env
        .post(
            "/streams/v1/cycle",
            &json!({"query_id": query, "partition_id": again["partitionId"],
                    "consumer_group": GROUP,
                    "ack": {"transactionId": first["transactionId"], "leaseId": first["leaseId"],
                            "count": 1},
                    "release_lease": true}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{done}");
    assert_eq!(done["ack_result"]["lease_released"], true);
    let rest = env
        .pop(&format!(
            "/api/v1/pop/queue/src?consumerGroup={GROUP}&batch=10"
        ))
        .await
        .expect("the rest at once");
    assert_eq!(numbers(&rest), vec![3, 4]);
}

#[tokio::test]
async fn bad_cycles_are_refused_with_their_code_and_commit_nothing() {
    let env = Env::start().await;
    let query = register(&env, "h", false).await.1["query_id"].clone();
    env.push(json!([{"queue": "elsewhere", "payload": 1}]))
        .await;
    let other_partition = env.sql(
        "SELECT p.id FROM comb.partitions p JOIN comb.queues q ON q.id = p.queue_id \
         WHERE q.name = 'elsewhere'",
    );
    let pop = leased(&env, 2, 10).await;
    let good = cycle(
        &query,
        &pop,
        2,
        json!([{"type": "upsert", "key": "k", "value": 1}]),
    );
    let big = "x".repeat(70 * 1024);
    let cases: Vec<(&str, Value, StatusCode, &str)> = vec![
        (
            "unknown query",
            {
                let mut b = good.clone();
                b["query_id"] = json!("0190a5a0-0000-7000-8000-000000000000");
                b
            },
            StatusCode::NOT_FOUND,
            "stream_query_not_found",
        ),
        (
            "a partition the query does not read",
            {
                let mut b = good.clone();
                b["partition_id"] = json!(other_partition);
                b
            },
            StatusCode::BAD_REQUEST,
            "stream_partition_not_read",
        ),
        (
            "an unknown state op",
            {
                let mut b = good.clone();
                b["state_ops"] = json!([{"type": "upsert", "key": "a", "value": 1},
                                        {"type": "merge", "key": "k", "value": 1}]);
                b
            },
            StatusCode::BAD_REQUEST,
            "state_op_invalid",
        ),
        (
            "a state op without a key",
            {
                let mut b = good.clone();
                b["state_ops"] = json!([{"type": "delete"}]);
                b
            },
            StatusCode::BAD_REQUEST,
            "state_op_invalid",
        ),
        (
            "a state value over the limit",
            {
                let mut b = good.clone();
                b["state_ops"] = json!([{"type": "upsert", "key": "k", "value": {"blob": big}}]);
                b
            },
            StatusCode::PAYLOAD_TOO_LARGE,
            "state_value_too_large",
        ),
        (
            "a state op that is not an object (a malformed window's state)",
            {
                let mut b = good.clone();
                b["state_ops"] = json!(["window:0"]);
                b
            },
            StatusCode::BAD_REQUEST,
            "state_op_invalid",
        ),
        (
            "an ack of more than was handed out",
            {
                let mut b = good.clone();
                b["ack"]["count"] = json!(3);
                b
            },
            StatusCode::CONFLICT,
            "message_not_delivered",
        ),
        (
            "an ack naming a message beyond its count",
            {
                let mut b = good.clone();
                b["ack"]["count"] = json!(1);
                b
            },
            StatusCode::CONFLICT,
            "stream_ack_mismatch",
        ),
        (
            "a failed ack",
            {
                let mut b = good.clone();
                b["ack"]["status"] = json!("failed");
                b
            },
            StatusCode::BAD_REQUEST,
            "ack_status_invalid",
        ),
        (
            "a malformed query id",
            {
                let mut b = good.clone();
                b["query_id"] = json!("nope");
                b
            },
            StatusCode::BAD_REQUEST,
            "query_id_invalid",
        ),
    ];
    for (what, body, status, code) in cases {
        let (s, refused) = env.post("/streams/v1/cycle", &body).await;
        assert_eq!(s, status, "{what}: {refused}");
        assert_eq!(refused["code"], code, "{what}: {refused}");
        assert!(
            refused["error"].is_string(),
            "{what}: problem+json with error"
        );
        assert_eq!(
            state(&env, &query, &pop["partitionId"]).await,
            json!([]),
            "{what}"
        );
        assert_eq!(sink_count(&env), "0", "{what}");
        assert_eq!(
            env.sql("SELECT count(*) FROM comb.stream_states"),
            "0",
            "{what}"
        );
    }
    // Nothing was acked by any of them: the good cycle still commits, once.
    let (s, done) = env.post("/streams/v1/cycle", &good).await;
    assert_eq!(s, StatusCode::OK, "{done}");
    let (s, replay) = env.post("/streams/v1/cycle", &good).await;
    assert_eq!(
        s,
        StatusCode::CONFLICT,
        "a replayed cycle is refused whole: {replay}"
    );
    assert_eq!(sink_count(&env), "1");
    // State reads check the query and the partition too.
    let (s, r) = env
        .post(
            "/streams/v1/state/get",
            &json!({"query_id": query, "partition_id": other_partition}),
        )
        .await;
    assert_eq!(
        (s, r["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("stream_partition_not_read"))
    );
    // The state of a partition is bounded as a whole.
    let value = "y".repeat(60 * 1024);
    let ops: Vec<Value> = (0..80)
        .map(|i| json!({"type": "upsert", "key": format!("k{i}"), "value": value}))
        .collect();
    let (s, r) = env
        .post(
            "/streams/v1/cycle",
            &json!({"query_id": query, "partition_id": pop["partitionId"],
                    "consumer_group": GROUP, "state_ops": ops}),
        )
        .await;
    assert_eq!(
        (s, r["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("stream_state_too_large")),
        "{r}"
    );
    assert_eq!(env.sql("SELECT count(*) FROM comb.stream_states"), "1");
}

/// A server rotating generations every second, keeping stream state tables `kept`
/// generations, with the query registered and its one source message popped and acked (so
/// no lease holds the partition): the server, the query's id and the partition's.
async fn rotating(kept: u32) -> (Env, Value, Value) {
    let kept = kept.to_string();
    let env = Env::start_with(&[
        "--generation-seconds",
        "1",
        "--maintenance-interval-ms",
        "200",
        "--stream-state-generations",
        &kept,
    ])
    .await;
    let query = register(&env, "h", false).await.1["query_id"].clone();
    let pop = leased(&env, 1, 1).await;
    let (s, acked) = env
        .ack(&pop["messages"][0], "completed", Some(GROUP), None)
        .await;
    assert_eq!(s, StatusCode::OK, "{acked}");
    (env, query, pop["partitionId"].clone())
}

/// State versions live in the cursor state generations: a pair's newest version is carried
/// forward and older generations are dropped whole, so versions do not pile up; the state of
/// a query replaced by a reset is left behind.
#[tokio::test]
async fn state_versions_are_carried_forward_and_old_generations_dropped_whole() {
    let (env, query, partition) = rotating(1).await;
    // Cycles without an ack change state between leases.
    // A key deleted is not carried forward.
    let gone = json!({"query_id": query, "partition_id": partition, "consumer_group": GROUP,
                      "state_ops": [{"type": "upsert", "key": "gone", "value": 1}]});
    assert_eq!(env.post("/streams/v1/cycle", &gone).await.0, StatusCode::OK);
    let mut delete = gone.clone();
    delete["state_ops"] = json!([{"type": "delete", "key": "gone"}]);
    assert_eq!(
        env.post("/streams/v1/cycle", &delete).await.0,
        StatusCode::OK
    );
    let set = |n: i64| {
        json!({"query_id": query, "partition_id": partition, "consumer_group": GROUP,
               "state_ops": [{"type": "upsert", "key": "k", "value": n}]})
    };
    for n in 0..20 {
        let (s, body) = env.post("/streams/v1/cycle", &set(n)).await;
        assert_eq!(s, StatusCode::OK, "{body}");
    }
    // Each version wrote the one key it changed (counted in one snapshot: a rotation may
    // carry and drop both tables' old generation meanwhile).
    assert_eq!(
        env.sql(
            "SELECT (SELECT count(*) FROM comb.stream_state_keys WHERE ver > 2) \
                  = (SELECT count(*) FROM comb.stream_states WHERE ver > 2)"
        ),
        "t"
    );
    let first_gen = env.sql("SELECT max(gen) FROM comb.cursor_gens");
    // Two rotations later, only the newest version is left, carried forward.
    crate::common::eventually(crate::common::PATIENCE, "two generations rotated", || {
        let now: i64 = env.sql("SELECT max(gen) FROM comb.cursor_gens").parse().unwrap();
        let older: i64 = env
            .sql("SELECT count(*) FROM pg_tables WHERE schemaname = 'comb' AND tablename LIKE 'stream\\_states\\_%'")
            .parse()
            .unwrap();
        now >= first_gen.parse::<i64>().unwrap() + 2 && older <= 2
    })
    .await;
    assert_eq!(env.sql("SELECT count(*) FROM comb.stream_states"), "1");
    assert_eq!(
        env.sql("SELECT string_agg(key, ',') FROM comb.stream_state_keys"),
        "k",
        "the newest version of the key there is; the deleted one left behind"
    );
    assert_eq!(
        state(&env, &query, &partition).await[0]["value"],
        19,
        "the newest version survives"
    );
    // Writes go on after the rotations, from the carried version.
    let (s, _) = env.post("/streams/v1/cycle", &set(20)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(state(&env, &query, &partition).await[0]["value"], 20);
    // A reset leaves the old query's state behind: it is not carried.
    register(&env, "h2", true).await;
    let gen_now: i64 = env
        .sql("SELECT max(gen) FROM comb.cursor_gens")
        .parse()
        .unwrap();
    crate::common::eventually(
        crate::common::PATIENCE,
        "the replaced state dropped",
        || {
            let now: i64 = env
                .sql("SELECT max(gen) FROM comb.cursor_gens")
                .parse()
                .unwrap();
            now >= gen_now + 2
                && env.sql("SELECT count(*) FROM comb.stream_states") == "0"
                && env.sql("SELECT count(*) FROM comb.stream_state_keys") == "0"
        },
    )
    .await;
}

/// A large state that changes a key at a time keeps its unchanged keys where they were
/// written for `--stream-state-generations` generations: they are carried (copied) forward
/// only when their table is that old, and read the same from whichever table holds them.
#[tokio::test]
async fn unchanged_keys_stay_in_their_generation_for_the_generations_kept() {
    let (env, query, partition) = rotating(3).await;
    let cold: Vec<Value> = (0..50)
        .map(|i| json!({"type": "upsert", "key": format!("cold{i:02}"), "value": i}))
        .collect();
    let write = |ops: Value| {
        json!({"query_id": query, "partition_id": partition, "consumer_group": GROUP,
               "state_ops": ops})
    };
    let (s, body) = env.post("/streams/v1/cycle", &write(json!(cold))).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let written: i64 = env
        .sql("SELECT min(gen) FROM comb.stream_state_keys WHERE key LIKE 'cold%'")
        .parse()
        .unwrap();
    // One snapshot reads the newest generation and where the cold keys are: a carry of
    // their table follows the rotation that makes it 3 old, so it cannot be seen before.
    let at = |env: &Env| -> (i64, i64) {
        let row = env.sql(
            "SELECT (SELECT max(gen) FROM comb.cursor_gens) || '|' || \
                    (SELECT min(gen) FROM comb.stream_state_keys WHERE key LIKE 'cold%')",
        );
        let (newest, cold) = row.split_once('|').unwrap();
        (newest.parse().unwrap(), cold.parse().unwrap())
    };
    let mut hot = 0;
    let mut seen_two_older = false;
    let mut carried = false;
    let deadline = std::time::Instant::now() + crate::common::PATIENCE;
    while !(seen_two_older && carried) {
        assert!(
            std::time::Instant::now() < deadline,
            "rotations did not go on: {:?}",
            at(&env)
        );
        hot += 1;
        let ops = json!([{"type": "upsert", "key": "hot", "value": hot}]);
        let (s, body) = env.post("/streams/v1/cycle", &write(ops)).await;
        assert_eq!(s, StatusCode::OK, "{body}");
        let (newest, cold_gen) = at(&env);
        if newest - written < 3 {
            assert_eq!(
                cold_gen, written,
                "an unchanged key was carried before its table was 3 generations old"
            );
            seen_two_older |= newest - written == 2;
        } else if cold_gen > written {
            carried = true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Its old table is gone once carried, and every key reads its newest value.
    crate::common::eventually(crate::common::PATIENCE, "the old table dropped", || {
        env.sql(&format!(
            "SELECT to_regclass('comb.stream_state_keys_{written}') IS NULL"
        )) == "t"
    })
    .await;
    let rows = state(&env, &query, &partition).await;
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 51, "{rows:?}");
    for row in rows {
        let key = row["key"].as_str().unwrap();
        let expected = match key.strip_prefix("cold") {
            Some(i) => json!(i.parse::<i64>().unwrap()),
            None => json!(hot),
        };
        assert_eq!(row["value"], expected, "{key}");
    }
    // Tables are kept for the generations asked, not more. Maintenance makes the next
    // generation's table and drops the oldest in steps of their own, so more may stand for
    // a moment between them: with one-second generations on a busy cluster, a step can
    // take longer than a generation.
    let tables = || -> i64 {
        env.sql("SELECT count(*) FROM pg_tables WHERE schemaname = 'comb' AND tablename LIKE 'stream\\_state\\_keys\\_%'")
            .parse()
            .unwrap()
    };
    crate::common::eventually(
        crate::common::PATIENCE,
        "at most 5 stream key tables",
        || tables() <= 3 + 2,
    )
    .await;
}

/// Cycles arriving together share one transaction, each under its own savepoint: refused ones
/// keep nothing and take nothing of the others with them.
#[tokio::test]
async fn concurrent_cycles_commit_or_fail_each_on_its_own() {
    let env = Env::start().await;
    let query = register(&env, "h", false).await.1["query_id"].clone();
    let items: Vec<Value> = (0..12)
        .map(|i| json!({"queue": "src", "partition": format!("p{i}"), "payload": {"n": i}}))
        .collect();
    env.push(Value::Array(items)).await;
    let mut bodies = Vec::new();
    for i in 0..12 {
        let pop = env
            .pop(&format!(
                "/api/v1/pop/queue/src/partition/p{i}?consumerGroup={GROUP}"
            ))
            .await
            .expect("one message each");
        let mut body = cycle(
            &query,
            &pop,
            1,
            json!([{"type": "upsert", "key": format!("k{i}"), "value": i}]),
        );
        body["push_items"][0]["partition"] = json!(format!("p{i}"));
        if i % 3 == 0 {
            // Not the live lease: refused.
            body["ack"]["leaseId"] = json!(uuid::Uuid::new_v4().to_string());
        }
        bodies.push(body);
    }
    let answers =
        futures_util::future::join_all(bodies.iter().map(|b| env.post("/streams/v1/cycle", b)))
            .await;
    for (i, (s, body)) in answers.iter().enumerate() {
        if i % 3 == 0 {
            assert_eq!(*s, StatusCode::CONFLICT, "{i}: {body}");
            assert_eq!(body["code"], "lease_invalid", "{i}");
        } else {
            assert_eq!(*s, StatusCode::OK, "{i}: {body}");
        }
    }
    assert_eq!(sink_count(&env), "8");
    assert_eq!(
        env.sql("SELECT string_agg(key, ',' ORDER BY key) FROM comb.stream_state_now"),
        "k1,k10,k11,k2,k4,k5,k7,k8"
    );
    // Every cycle went through the cycle fuser (how many shared a batch is up to timing).
    let text = env.metrics_text().await;
    assert!(
        text.contains("comb_fused_wait_seconds_count{kind=\"cycle\"} 12"),
        "{text}"
    );
}

/// A cycle of one leased message on a fresh query, its body changed by `change` (a field set
/// to `null` or removed), as Queen's SDKs may send it.
async fn cycle_changed(change: impl FnOnce(&mut Value)) -> (Env, StatusCode, Value, Value) {
    let env = Env::start().await;
    let query = register(&env, "h", false).await.1["query_id"].clone();
    let pop = leased(&env, 1, 1).await;
    let mut body = cycle(
        &query,
        &pop,
        1,
        json!([{"type": "upsert", "key": "k", "value": {"acc": 1}}]),
    );
    change(&mut body);
    let (s, done) = env.post("/streams/v1/cycle", &body).await;
    (env, s, done, pop)
}

/// Whether the one source message was settled for the query's group: its lease released, an
/// unsettled message would be handed out again at once.
async fn source_settled(env: &Env) -> bool {
    env.pop(&format!(
        "/api/v1/pop/queue/src?consumerGroup={GROUP}&wait=false"
    ))
    .await
    .is_none()
}

/// Every field of a cycle Queen takes as `null` (or absent), Comb takes the same way: one
/// test per field. Each asserts the cycle committed and what the field's default did.
mod null_fields {
    use super::*;

    #[tokio::test]
    async fn state_ops_null_is_no_state_change() {
        let (env, s, done, pop) = cycle_changed(|b| b["state_ops"] = Value::Null).await;
        assert_eq!(s, StatusCode::OK, "{done}");
        assert_eq!(done["state_ops_applied"], 0);
        assert_eq!(done["ack_result"]["count"], 1);
        let query = done["query_id"].clone();
        assert_eq!(state(&env, &query, &pop["partitionId"]).await, json!([]));
        assert_eq!(sink_count(&env), "1");
    }

    #[tokio::test]
    async fn state_ops_absent_is_no_state_change() {
        let (_env, s, done, _) = cycle_changed(|b| {
            b.as_object_mut().unwrap().remove("state_ops");
        })
        .await;
        assert_eq!(s, StatusCode::OK, "{done}");
        assert_eq!(done["state_ops_applied"], 0);
    }

    #[tokio::test]
    async fn push_items_null_pushes_nothing() {
        let (env, s, done, _) = cycle_changed(|b| b["push_items"] = Value::Null).await;
        assert_eq!(s, StatusCode::OK, "{done}");
        assert_eq!(done["push_results"], json!([]));
        assert_eq!(done["state_ops_applied"], 1);
        assert_eq!(sink_count(&env), "0");
    }

    #[tokio::test]
    async fn ack_null_acks_nothing() {
        // Without state ops: a cycle without an ack changes no state under a lease.
        let (env, s, done, pop) = cycle_changed(|b| {
            b["ack"] = Value::Null;
            b["state_ops"] = json!([]);
        })
        .await;
        assert_eq!(s, StatusCode::OK, "{done}");
        assert_eq!(done["ack_result"], Value::Null);
        assert_eq!(sink_count(&env), "1");
        // The message is still under its lease, unsettled.
        let m = &pop["messages"][0];
        let acked = env.ack(m, "completed", Some(GROUP), None).await;
        assert_eq!(acked.0, StatusCode::OK, "{acked:?}");
    }

    #[tokio::test]
    async fn release_lease_null_releases_it() {
        let (_env, s, done, _) = cycle_changed(|b| b["release_lease"] = Value::Null).await;
        assert_eq!(s, StatusCode::OK, "{done}");
        assert_eq!(done["ack_result"]["lease_released"], true);
    }

    #[tokio::test]
    async fn consumer_group_null_is_queue_mode() {
        // Without an ack: the lease is the query's group's, not queue mode's.
        let (env, s, done, pop) = cycle_changed(|b| {
            b["consumer_group"] = Value::Null;
            b["ack"] = Value::Null;
        })
        .await;
        assert_eq!(s, StatusCode::OK, "{done}");
        let query = done["query_id"].clone();
        assert_eq!(
            state(&env, &query, &pop["partitionId"]).await[0]["value"],
            json!({"acc": 1})
        );
    }

    #[tokio::test]
    async fn ack_lease_id_null_checks_the_live_lease() {
        let (env, s, done, _) = cycle_changed(|b| b["ack"]["leaseId"] = Value::Null).await;
        assert_eq!(s, StatusCode::OK, "{done}");
        assert_eq!(done["ack_result"]["count"], 1);
        assert!(source_settled(&env).await);
    }

    #[tokio::test]
    async fn ack_status_null_is_completed() {
        let (env, s, done, _) = cycle_changed(|b| b["ack"]["status"] = Value::Null).await;
        assert_eq!(s, StatusCode::OK, "{done}");
        assert_eq!(done["ack_result"]["count"], 1);
        assert!(source_settled(&env).await);
    }

    #[tokio::test]
    async fn ack_count_null_is_one() {
        let (env, s, done, _) = cycle_changed(|b| b["ack"]["count"] = Value::Null).await;
        assert_eq!(s, StatusCode::OK, "{done}");
        assert_eq!(done["ack_result"]["count"], 1);
        assert!(source_settled(&env).await);
    }

    #[tokio::test]
    async fn state_op_value_null_is_stored_as_null_and_absent_as_an_empty_object() {
        let (env, s, done, pop) = cycle_changed(|b| {
            b["state_ops"] = json!([{"type": "upsert", "key": "n", "value": null},
                                    {"type": "upsert", "key": "o"}]);
        })
        .await;
        assert_eq!(s, StatusCode::OK, "{done}");
        let rows = state(&env, &done["query_id"], &pop["partitionId"]).await;
        assert_eq!(
            (rows[0]["key"].as_str(), &rows[0]["value"]),
            (Some("n"), &Value::Null),
            "{rows}"
        );
        assert_eq!(
            (rows[1]["key"].as_str(), &rows[1]["value"]),
            (Some("o"), &json!({}))
        );
    }

    #[tokio::test]
    async fn push_item_partition_null_is_default() {
        let (env, s, done, _) =
            cycle_changed(|b| b["push_items"][0]["partition"] = Value::Null).await;
        assert_eq!(s, StatusCode::OK, "{done}");
        assert_eq!(
            env.sql(
                "SELECT p.name FROM comb.messages m JOIN comb.partitions p ON p.id = m.partition_id \
                 JOIN comb.queues q ON q.id = p.queue_id WHERE q.name = 'sink'"
            ),
            "Default"
        );
    }

    #[tokio::test]
    async fn push_item_transaction_id_and_trace_id_null_are_absent() {
        let (env, s, done, _) = cycle_changed(|b| {
            b["push_items"][0]["transactionId"] = Value::Null;
            b["push_items"][0]["traceId"] = Value::Null;
        })
        .await;
        assert_eq!(s, StatusCode::OK, "{done}");
        assert_eq!(done["push_results"][0]["status"], "queued", "{done}");
        assert_eq!(sink_count(&env), "1");
    }

    #[tokio::test]
    async fn register_reset_and_sink_queue_null_are_absent() {
        let env = Env::start().await;
        let (s, r) = env
            .post(
                "/streams/v1/queries",
                &json!({"name": "q", "source_queue": "src", "sink_queue": null,
                        "config_hash": "h", "reset": null}),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{r}");
        assert_eq!(
            (r["fresh"].as_bool(), r["reset"].as_bool()),
            (Some(true), Some(false))
        );
        // A null reset is no consent to drop state.
        let (s, changed) = env
            .post(
                "/streams/v1/queries",
                &json!({"name": "q", "source_queue": "src", "config_hash": "h2", "reset": null}),
            )
            .await;
        assert_eq!(s, StatusCode::CONFLICT, "{changed}");
    }

    #[tokio::test]
    async fn state_get_keys_prefix_and_ripeness_null_read_everything() {
        let (env, s, done, pop) = cycle_changed(|_| {}).await;
        assert_eq!(s, StatusCode::OK, "{done}");
        let (s, got) = env
            .post(
                "/streams/v1/state/get",
                &json!({"query_id": done["query_id"], "partition_id": pop["partitionId"],
                        "keys": null, "key_prefix": null, "ripe_at_or_before": null}),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{got}");
        assert_eq!(got["rows"][0]["key"], "k", "{got}");
    }
}

/// A flush cycle (no ack, as the SDK's idle-flush timer sends it) of the window `key`: its
/// delete and its emission.
fn flush(query: &Value, partition: &Value, key: &str, emitted: Value) -> Value {
    json!({
        "query_id": query, "partition_id": partition, "consumer_group": GROUP,
        "state_ops": [{"type": "delete", "key": key}],
        "push_items": [{"queue": "sink", "partition": "p", "payload": emitted}],
        "ack": null,
    })
}

/// The double count the SDK's idle flush made: its timer runs beside the cycle loop, so a
/// flush could delete (and emit) a window between the loop's read of the state and its cycle,
/// which then wrote the window back with its old contents and the new event, to be emitted a
/// second time. Queen applies both as sent. Comb refuses a cycle without an ack while the
/// group holds a lease on the partition (the holder has read the state), so each event is in
/// one emission.
#[tokio::test]
async fn a_flush_between_a_leased_read_and_its_cycle_is_refused_and_every_event_counts_once() {
    let env = Env::start().await;
    let query = register(&env, "h", false).await.1["query_id"].clone();
    let w = "tumble\u{1f}k\u{1f}0";
    // Event 1 in window w.
    let first = leased(&env, 1, 1).await;
    let partition = first["partitionId"].clone();
    let ops = json!([{"type": "upsert", "key": w, "value": {"acc": {"count": 1, "sum": 1}, "windowEnd": 0}}]);
    let mut body = cycle(&query, &first, 1, ops);
    body["push_items"] = json!([]);
    let (s, done) = env.post("/streams/v1/cycle", &body).await;
    assert_eq!(s, StatusCode::OK, "{done}");
    // Event 2 leased; the loop reads the state (count 1)…
    env.push(
        json!([{"queue": "src", "partition": "p", "payload": {"n": 2}, "transactionId": "m2"}]),
    )
    .await;
    let second = env
        .pop(&format!(
            "/api/v1/pop/queue/src?consumerGroup={GROUP}&batch=10"
        ))
        .await
        .expect("event 2");
    let read = state(&env, &query, &partition).await;
    assert_eq!(read[0]["value"]["acc"]["count"], 1);
    // …the flush timer fires: refused while the lease is held.
    let flushed = flush(&query, &partition, w, json!({"count": 1, "sum": 1}));
    let (s, refused) = env.post("/streams/v1/cycle", &flushed).await;
    assert_eq!(s, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["code"], "stream_partition_leased");
    assert_eq!(sink_count(&env), "0", "nothing emitted");
    // The loop's cycle commits what it read plus event 2.
    let ops = json!([{"type": "upsert", "key": w, "value": {"acc": {"count": 2, "sum": 3}, "windowEnd": 0}}]);
    let mut body = json!({
        "query_id": query, "partition_id": partition, "consumer_group": GROUP,
        "state_ops": ops,
        "ack": {"transactionId": "m2", "leaseId": second["messages"][0]["leaseId"], "count": 1},
    });
    let (s, done) = env.post("/streams/v1/cycle", &body).await;
    assert_eq!(s, StatusCode::OK, "{done}");
    // The next flush emits the window once, with both events.
    let flushed = flush(&query, &partition, w, json!({"count": 2, "sum": 3}));
    let (s, done) = env.post("/streams/v1/cycle", &flushed).await;
    assert_eq!(s, StatusCode::OK, "{done}");
    assert_eq!(done["state_ops_applied"], 1);
    assert_eq!(sink_count(&env), "1");
    assert_eq!(state(&env, &query, &partition).await, json!([]));
    // Its answer lost, the SDK sends it again: nothing is applied twice.
    let (s, again) = env.post("/streams/v1/cycle", &flushed).await;
    assert_eq!(s, StatusCode::OK, "{again}");
    assert_eq!(again["state_ops_applied"], 0);
    assert_eq!(again["push_results"], json!([]));
    assert_eq!(sink_count(&env), "1", "emitted once");
    // The loop's cycle, replayed, cannot bring the deleted window back: its lease ended.
    body["ack"]["count"] = json!(1);
    let (s, replay) = env.post("/streams/v1/cycle", &body).await;
    assert_eq!(s, StatusCode::CONFLICT, "{replay}");
    assert_eq!(state(&env, &query, &partition).await, json!([]));
}

/// A flush computed from older state (some of its windows emitted by another cycle since) is
/// refused whole: it would emit them again.
#[tokio::test]
async fn a_stale_flush_is_refused_whole() {
    let env = Env::start().await;
    let query = register(&env, "h", false).await.1["query_id"].clone();
    let pop = leased(&env, 1, 1).await;
    let partition = pop["partitionId"].clone();
    let ops = json!([{"type": "upsert", "key": "a", "value": 1},
                     {"type": "upsert", "key": "b", "value": 2}]);
    let (s, done) = env
        .post("/streams/v1/cycle", &cycle(&query, &pop, 1, ops))
        .await;
    assert_eq!(s, StatusCode::OK, "{done}");
    let (s, done) = env
        .post(
            "/streams/v1/cycle",
            &flush(&query, &partition, "a", json!({"a": 1})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{done}");
    let mut stale = flush(&query, &partition, "a", json!({"a": 1}));
    stale["state_ops"] = json!([{"type": "delete", "key": "a"}, {"type": "delete", "key": "b"}]);
    let (s, refused) = env.post("/streams/v1/cycle", &stale).await;
    assert_eq!(s, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["code"], "stream_state_stale");
    let rows = state(&env, &query, &partition).await;
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "b stays: {rows}");
    assert_eq!(sink_count(&env), "2");
}

/// What a cycle writes with a small and a large state: WAL bytes and time per cycle of ten
/// changed keys, over 10 and over 10,000 keys (`docs/streams.md`). A measurement, not a test:
/// `cargo test -p comb --test suite streams::cycle_cost -- --ignored --nocapture`.
#[tokio::test]
#[ignore]
async fn cycle_cost() {
    let env = Env::start().await;
    let query = register(&env, "h", false).await.1["query_id"].clone();
    let pop = leased(&env, 1, 1).await;
    let partition = pop["partitionId"].clone();
    env.ack(&pop["messages"][0], "completed", Some(GROUP), None)
        .await;
    let ops = |from: usize, n: usize, v: usize| -> Value {
        (from..from + n)
            .map(|i| {
                json!({"type": "upsert", "key": format!("window\u{1f}k{i}"),
                            "value": {"acc": {"count": v, "sum": v * 3}, "windowEnd": v}})
            })
            .collect()
    };
    let cycle = |ops: Value| {
        json!({"query_id": query, "partition_id": partition, "consumer_group": GROUP,
               "state_ops": ops})
    };
    let mut size = 0;
    for keys in [10, 10_000] {
        while size < keys {
            let n = (keys - size).min(1000);
            let (s, b) = env.post("/streams/v1/cycle", &cycle(ops(size, n, 0))).await;
            assert_eq!(s, StatusCode::OK, "{b}");
            size += n;
        }
        let lsn = || env.sql("SELECT pg_current_wal_lsn()");
        let rounds = 200;
        let (before, started) = (lsn(), std::time::Instant::now());
        for r in 0..rounds {
            let (s, b) = env
                .post("/streams/v1/cycle", &cycle(ops(0, 10, r + 1)))
                .await;
            assert_eq!(s, StatusCode::OK, "{b}");
        }
        let took = started.elapsed();
        let wal = env.sql(&format!(
            "SELECT pg_wal_lsn_diff('{}', '{before}')::bigint",
            lsn()
        ));
        let wal: i64 = wal.parse().unwrap();
        println!(
            "state of {keys} keys, 10 changed per cycle: {} WAL bytes and {:?} per cycle",
            wal / rounds as i64,
            took / rounds as u32
        );
    }
}
