//! Guarantee 5: a transaction id is stored once per partition.

use crate::common::{self, Env};
use serde_json::json;

#[tokio::test]
async fn the_same_transaction_id_twice_is_a_duplicate_of_the_first() {
    let env = Env::start().await;
    let first = env
        .push(json!([{"queue": "q", "partition": "p", "payload": {"v": 1}, "transactionId": "order-7"}]))
        .await;
    assert_eq!(first[0]["status"], "queued");
    let second = env
        .push(json!([{"queue": "q", "partition": "p", "payload": {"v": 2}, "transactionId": "order-7"}]))
        .await;
    assert_eq!(second[0]["status"], "duplicate");
    assert_eq!(second[0]["message_id"], first[0]["message_id"]);
    assert_eq!(env.sql("SELECT count(*) FROM comb.messages"), "1");
    // What is stored is the first payload.
    let pop = env.pop("/api/v1/pop/queue/q?batch=10").await.unwrap();
    assert_eq!(pop["messages"].as_array().unwrap().len(), 1);
    assert_eq!(pop["messages"][0]["data"]["v"], 1);
}

#[tokio::test]
async fn duplicates_within_one_request_and_across_concurrent_requests() {
    let env = Env::start().await;
    let r = env
        .push(json!([
            {"queue": "q", "partition": "p", "payload": 1, "transactionId": "x"},
            {"queue": "q", "partition": "p", "payload": 2, "transactionId": "x"},
        ]))
        .await;
    assert_eq!(r[0]["status"], "queued");
    assert_eq!(r[1]["status"], "duplicate");
    assert_eq!(r[1]["message_id"], r[0]["message_id"]);

    // Twenty concurrent pushes of one id: exactly one is stored, all answer its id.
    let mut tasks = Vec::new();
    for i in 0..20 {
        let http = common::client();
        let url = env.url("/api/v1/push");
        tasks.push(tokio::spawn(async move {
            let body = json!({"items": [{"queue": "q", "partition": "p", "payload": i, "transactionId": "y"}]});
            let r: serde_json::Value = http.post(url).json(&body).send().await.unwrap().json().await.unwrap();
            (r[0]["status"].as_str().unwrap().to_string(), r[0]["message_id"].clone())
        }));
    }
    let mut queued = 0;
    let mut ids = std::collections::HashSet::new();
    for t in tasks {
        let (status, id) = t.await.unwrap();
        queued += (status == "queued") as usize;
        ids.insert(id.to_string());
    }
    assert_eq!(queued, 1);
    assert_eq!(ids.len(), 1);
    assert_eq!(
        env.sql("SELECT count(*) FROM comb.messages WHERE transaction_id = 'y'"),
        "1"
    );
}

#[tokio::test]
async fn the_same_transaction_id_in_two_partitions_is_two_messages() {
    let env = Env::start().await;
    let r = env
        .push(json!([
            {"queue": "q", "partition": "a", "payload": 1, "transactionId": "same"},
            {"queue": "q", "partition": "b", "payload": 2, "transactionId": "same"},
        ]))
        .await;
    assert_eq!(r[0]["status"], "queued");
    assert_eq!(r[1]["status"], "queued");
    assert_ne!(r[0]["message_id"], r[1]["message_id"]);
    let r = env
        .push(json!([{"queue": "other", "partition": "a", "payload": 3, "transactionId": "same"}]))
        .await;
    assert_eq!(
        r[0]["status"], "queued",
        "another queue is another partition"
    );
    assert_eq!(env.sql("SELECT count(*) FROM comb.messages"), "3");
}

/// Batches large enough to be copied in are checked like small ones: ids a partition holds
/// answer as duplicates of the stored message, repeats within the batch as duplicates of
/// their first occurrence, and concurrent batches of the same ids store each id once.
#[tokio::test]
async fn copied_batches_are_checked_for_duplicates_too() {
    let env = Env::start().await;
    let item = |partition: &str, txid: String, n: usize| json!({"queue": "q", "partition": partition, "payload": {"n": n}, "transactionId": txid});
    let first: Vec<_> = (0..30).map(|k| item("a", format!("t{k}"), k)).collect();
    let first = env.push(json!(first)).await;
    let mut batch: Vec<_> = (0..100).map(|k| item("a", format!("t{k}"), k)).collect();
    batch.extend((0..100).map(|k| item("b", format!("t{k}"), k)));
    batch.extend((50..60).map(|k| item("a", format!("t{k}"), 1000 + k)));
    let r = env.push(json!(batch)).await;
    assert_eq!(r.len(), 210);
    for (k, answer) in r.iter().enumerate() {
        match k {
            0..30 => {
                assert_eq!(answer["status"], "duplicate", "{answer}");
                assert_eq!(answer["message_id"], first[k]["message_id"]);
            }
            30..200 => assert_eq!(answer["status"], "queued", "{k}: {answer}"),
            _ => {
                assert_eq!(answer["status"], "duplicate", "{answer}");
                assert_eq!(answer["message_id"], r[k - 150]["message_id"]);
            }
        }
    }
    // Partition a holds t0..t99 once each, in order: the first push's, then the batch's.
    let a = env
        .drain("/api/v1/pop/queue/q/partition/a?batch=1000&autoAck=true")
        .await;
    let ns: Vec<i64> = a.iter().map(|m| m["data"]["n"].as_i64().unwrap()).collect();
    assert_eq!(ns, (0..100).collect::<Vec<i64>>());
    assert_eq!(
        env.sql("SELECT count(*) FROM comb.messages m JOIN comb.partitions p ON p.id = m.partition_id WHERE p.name = 'b'"),
        "100"
    );

    // Eight batches of the same 100 ids at once: each id stored once, and every answer for
    // an id names that message.
    let mut tasks = Vec::new();
    for round in 0..8 {
        let http = common::client();
        let url = env.url("/api/v1/push");
        let items: Vec<_> = (0..100)
            .map(|k| item("c", format!("c{k}"), round * 100 + k))
            .collect();
        tasks.push(tokio::spawn(async move {
            let r: serde_json::Value = http
                .post(url)
                .json(&json!({ "items": items }))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            r
        }));
    }
    let mut ids: Vec<std::collections::HashSet<String>> = vec![Default::default(); 100];
    let mut queued = 0;
    for t in tasks {
        let r = t.await.unwrap();
        for (k, answer) in r.as_array().unwrap().iter().enumerate() {
            queued += (answer["status"] == "queued") as usize;
            ids[k].insert(answer["message_id"].to_string());
        }
    }
    assert_eq!(queued, 100);
    assert!(ids.iter().all(|s| s.len() == 1), "{ids:?}");
    assert_eq!(
        env.sql("SELECT count(*), count(DISTINCT transaction_id) FROM comb.messages m JOIN comb.partitions p ON p.id = m.partition_id WHERE p.name = 'c'"),
        "100|100"
    );
}

/// The duplicate check of a copied batch reads the segment being written by its index of
/// transaction ids, even
/// with a plan made while the segment was empty: a plan kept from then would read the whole
/// segment for every batch until its statistics caught up (up to a maintenance interval
/// after each segment switch, while the segment grows by every push).
#[tokio::test]
async fn the_duplicate_check_of_a_copied_batch_never_reads_the_segment_whole() {
    // No maintenance cycle within the test: the segment's statistics stay those of a young
    // table, as they are after a switch.
    let env = Env::start_with(&["--maintenance-interval-ms", "600000"]).await;
    let segment = env.sql("SELECT 'comb.messages_' || max(seg) FROM comb.segments");
    let seq_scans = || {
        env.sql(&format!(
            "SELECT seq_scan FROM pg_stat_user_tables WHERE relid = '{segment}'::regclass"
        ))
        .parse::<i64>()
        .unwrap()
    };
    // Analysed while empty, as a segment made ahead of its turn can be.
    env.sql(&format!("ANALYZE {segment}"));
    // The scans of the segment's index of transaction ids.
    let id_scans = || {
        env.sql(&format!(
            "SELECT idx_scan FROM pg_stat_user_indexes
             WHERE relid = '{segment}'::regclass AND indexrelname LIKE '%transaction_id%'"
        ))
        .parse::<i64>()
        .unwrap()
    };
    let before = seq_scans();
    let ids_before = id_scans();
    // More pushes than a statement runs before PostgreSQL settles on a generic plan, each
    // of a batch large enough to be copied.
    for round in 0..12 {
        let items: Vec<serde_json::Value> = (0..100)
            .map(|n| {
                json!({"queue": "q", "partition": "p", "payload": {"n": n},
                       "transactionId": format!("r{round}-{n}")})
            })
            .collect();
        let stored = env.push(json!(items)).await;
        assert!(stored.iter().all(|s| s["status"] == "queued"), "{stored:?}");
    }
    // Each server connection reports its counts a little after its transactions end; its
    // inserts and its scans together.
    common::until("the pushes' counts reported", || async {
        env.sql(&format!(
            "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relid = '{segment}'::regclass"
        )) == "1200"
    })
    .await;
    assert_eq!(seq_scans(), before, "the segment was read whole by a push");
    // Every push's check took the index of transaction ids (not the partition's run of the
    // primary key).
    assert!(
        id_scans() - ids_before >= 12,
        "{} of 12",
        id_scans() - ids_before
    );
}

/// In a database made with a language's collation, where ids compare and sort in it and not
/// byte by byte, duplicates are found as in a `C` database, a whole lease's ack (whose ids
/// the broker sorts byte by byte) completes, and lookups by id answer.
#[tokio::test]
async fn ids_are_checked_acked_and_found_in_a_database_with_a_language_collation() {
    let url = tokio::task::spawn_blocking(|| {
        comb_harness::Postgres::shared()
            .create_database_with(
                "icu",
                "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C'",
            )
            .expect("an ICU database")
    })
    .await
    .unwrap();
    let env = Env::start_on(url).await;
    assert_eq!(
        env.sql(
            "SELECT datlocprovider::text || ' ' || daticulocale || ' ' || ('a' < 'B')::text
             FROM pg_database WHERE datname = current_database()"
        ),
        "i en-US true",
        "ids sort in en-US here, where 'B' < 'a' byte by byte"
    );

    // Ids that sort one way in en-US and the other byte by byte ('a' < 'B' < 'b' against
    // 'B' < 'a' < 'b'), small batches and one copied in, repeats of each.
    let ids = ["a", "B", "b", "Ä", "z"];
    let item = |txid: String, n: usize| json!({"queue": "q", "partition": "p", "payload": {"n": n}, "transactionId": txid});
    let first = env
        .push(json!(
            ids.iter()
                .enumerate()
                .map(|(n, t)| item(t.to_string(), n))
                .collect::<Vec<_>>()
        ))
        .await;
    assert!(first.iter().all(|a| a["status"] == "queued"), "{first:?}");
    let mut copied: Vec<_> = (0..100).map(|k| item(format!("c{k}"), 100 + k)).collect();
    copied.extend(ids.iter().map(|t| item(t.to_string(), 999)));
    let r = env.push(json!(copied)).await;
    assert!(r[..100].iter().all(|a| a["status"] == "queued"), "{r:?}");
    for (k, answer) in r[100..].iter().enumerate() {
        assert_eq!(answer["status"], "duplicate", "{answer}");
        assert_eq!(answer["message_id"], first[k]["message_id"]);
    }
    let again = env
        .push(json!([item("B".into(), 7), item("c5".into(), 7)]))
        .await;
    assert!(
        again.iter().all(|a| a["status"] == "duplicate"),
        "{again:?}"
    );
    assert_eq!(env.message_count(), 105);

    // Popped in order; the lease acked whole in one request, then one by one (each found by
    // its id).
    let pop = env.pop("/api/v1/pop/queue/q?batch=3").await.unwrap();
    let msgs = pop["messages"].as_array().unwrap();
    let got: Vec<&str> = msgs
        .iter()
        .map(|m| m["transactionId"].as_str().unwrap())
        .collect();
    assert_eq!(got, ["a", "B", "b"]);
    let acked = env.ack_all(&pop, "completed", None).await;
    assert!(acked.iter().all(|a| a["success"] == true), "{acked:?}");
    let pop = env.pop("/api/v1/pop/queue/q?batch=2").await.unwrap();
    let msgs = pop["messages"].as_array().unwrap();
    let got: Vec<&str> = msgs
        .iter()
        .map(|m| m["transactionId"].as_str().unwrap())
        .collect();
    assert_eq!(got.len(), 2);
    assert_eq!(got[1], "z");
    for m in msgs.iter().rev() {
        env.ack_ok(m, "completed", None, None).await;
    }
    let partition = msgs[0]["partitionId"].as_str().unwrap();
    let (status, found) = env.get(&format!("/api/v1/messages/{partition}/B")).await;
    assert_eq!(status, reqwest::StatusCode::OK, "{found}");
    assert_eq!(found["transactionId"], "B");
    let (status, _) = env.get(&format!("/api/v1/messages/{partition}/b2")).await;
    assert_eq!(status, reqwest::StatusCode::NOT_FOUND);
    let rest = env
        .drain("/api/v1/pop/queue/q?batch=1000&autoAck=true")
        .await;
    assert_eq!(rest.len(), 100);
    assert_eq!(rest[0]["transactionId"], "c0");
}
