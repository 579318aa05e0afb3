//! Partition ids on one PostgreSQL, where they stay random and time-ordered (version 7; on
//! Citus they are derived from their queue and name, `catalog::ids`): a partition is found by
//! its name whatever its id, and servers racing to make one partition make one.

use reqwest::StatusCode;
use serde_json::json;

use crate::common::{Env, numbers};

/// A partition with an id of its own (as a Citus cluster's migration from one PostgreSQL
/// brings along), added by SQL, takes a push and serves a pop under its own id, also through
/// a server that never saw it; no second partition of its name is made. A new partition gets
/// a time-ordered id (UUID version 7).
#[tokio::test]
async fn a_partition_is_found_by_name_whatever_its_id() {
    let env = Env::start().await;
    env.push(json!([{"queue": "q", "partition": "new", "payload": {"n": 0}}]))
        .await;
    assert_eq!(
        env.sql("SELECT substr(id::text, 15, 1) FROM comb.partitions WHERE name = 'new'"),
        "7"
    );
    let legacy = uuid::Uuid::now_v7();
    env.sql(&format!(
        "INSERT INTO comb.partitions (id, queue_id, name)
         SELECT '{legacy}', id, 'old' FROM comb.queues WHERE name = 'q'"
    ));
    env.push(json!([{"queue": "q", "partition": "old", "payload": {"n": 1}}]))
        .await;
    assert_eq!(
        env.sql("SELECT string_agg(id::text, ',') FROM comb.partitions WHERE name = 'old'"),
        legacy.to_string()
    );
    let second = env.second_server().await;
    let url = format!("{}/api/v1/pop/queue/q/partition/old", second.base_url());
    let r = env.http.get(url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let pop: serde_json::Value = r.json().await.unwrap();
    assert_eq!(numbers(&pop), vec![1]);
    assert_eq!(
        pop["messages"][0]["partitionId"],
        legacy.to_string(),
        "{pop}"
    );
}

/// Two servers pushing at once to the same new partitions (a group already reading the
/// queue) make each partition once, with one cursor of the group, and store every message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_racing_to_make_a_partition_make_one() {
    let env = Env::start().await;
    env.push(json!([{"queue": "race", "partition": "warm", "payload": {"n": 0}}]))
        .await;
    let pop = env.pop("/api/v1/pop/queue/race?batch=1").await.unwrap();
    env.ack_all(&pop, "completed", None).await;
    let second = env.second_server().await;
    const NAMES: usize = 20;
    let mut pushes = Vec::new();
    for base in [env.server.base_url(), second.base_url()] {
        for p in 0..NAMES {
            let http = env.http.clone();
            let url = format!("{base}/api/v1/push");
            pushes.push(tokio::spawn(async move {
                let body = json!({"items": [{"queue": "race", "partition": format!("r{p}"),
                                             "payload": {"n": p}}]});
                http.post(url).json(&body).send().await.unwrap().status()
            }));
        }
    }
    for p in pushes {
        assert_eq!(p.await.unwrap(), StatusCode::CREATED);
    }
    assert_eq!(
        env.sql(
            "SELECT count(*) || ',' || count(DISTINCT name)
             FROM comb.partitions WHERE name LIKE 'r%'"
        ),
        format!("{NAMES},{NAMES}")
    );
    assert_eq!(
        env.sql(
            "SELECT count(*) FROM comb.cursors c JOIN comb.partitions p ON p.id = c.partition_id
             WHERE p.name LIKE 'r%'"
        ),
        NAMES.to_string()
    );
    assert_eq!(
        env.sql(
            "SELECT count(*) FROM comb.messages m JOIN comb.partitions p ON p.id = m.partition_id
             WHERE p.name LIKE 'r%'"
        ),
        (2 * NAMES).to_string()
    );
}
