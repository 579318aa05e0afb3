//! Acks that complete messages in any order, in any grouping, with or without the lease id
//! and repeated: the cursor ends where the ack rules put it. Such acks are judged in SQL
//! when they can be (every message of the request in the live lease, none settled before)
//! and by the general path otherwise; both must agree with the rules, checked here against
//! a model of them.

use std::collections::BTreeSet;

use crate::common::{Env, xorshift};
use serde_json::{Value, json};

/// The rules for completing acks under one live lease over positions 1..=`leased`: acking a
/// settled message changes nothing; otherwise it is settled and the position moves over the
/// run of settled messages after it; the lease ends when the position reaches the last.
#[derive(Debug, Default)]
struct Model {
    position: i64,
    settled: BTreeSet<i64>,
}

impl Model {
    fn complete(&mut self, pos: i64) {
        if pos <= self.position {
            return;
        }
        self.settled.insert(pos);
        while self.settled.remove(&(self.position + 1)) {
            self.position += 1;
        }
    }
}

#[tokio::test]
async fn completing_acks_move_the_cursor_as_the_rules_say_in_any_order_and_grouping() {
    let env = Env::start().await;
    env.configure("q", json!({"leaseTime": 300})).await;
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    for lane in 0..40 {
        let partition = format!("p{lane}");
        let leased = 1 + (xorshift(&mut seed) % 8) as i64;
        let messages = leased_messages(&env, &partition, leased as usize).await;

        let mut model = Model::default();
        // Requests of one to four acks each, picked at random among the leased messages (so
        // some repeat and some were settled by an earlier request), until every message has
        // been acked once; each ack with the lease id or without it.
        let mut acked = BTreeSet::new();
        while acked.len() < messages.len() {
            let size = 1 + (xorshift(&mut seed) % 4) as usize;
            let mut request = Vec::new();
            for _ in 0..size {
                let k = (xorshift(&mut seed) % leased as u64) as usize;
                let m = &messages[k];
                let with_lease = xorshift(&mut seed).is_multiple_of(2);
                request.push(json!({
                    "transactionId": m["transactionId"],
                    "partitionId": m["partitionId"],
                    "leaseId": if with_lease { m["leaseId"].clone() } else { Value::Null },
                    "status": "completed",
                }));
                model.complete(k as i64 + 1);
                acked.insert(k);
            }
            let (s, body) = env
                .post("/api/v1/ack/batch", &json!({"acknowledgments": request}))
                .await;
            assert_eq!(s, reqwest::StatusCode::OK, "{body}");
            for r in body.as_array().unwrap() {
                assert_eq!(r["success"], true, "lane {lane}: {request:?} -> {body}");
            }
            let state = cursor_of(&env, &partition);
            let settled: Vec<String> = model.settled.iter().map(i64::to_string).collect();
            let expected = format!(
                "{} {} {}",
                model.position,
                settled.join(","),
                model.position == leased
            );
            assert_eq!(state, expected, "lane {lane} of {leased} after {request:?}");
        }
        assert_eq!(model.position, leased);
    }
    // Every message was acked: nothing comes back.
    assert!(env.pop("/api/v1/pop/queue/q?batch=100").await.is_none());
}

/// Pushes `n` messages to `partition` of queue `q` and pops them under one lease.
async fn leased_messages(env: &Env, partition: &str, n: usize) -> Vec<Value> {
    let items: Vec<Value> = (0..n)
        .map(|k| json!({"queue": "q", "partition": partition, "payload": {"n": k}}))
        .collect();
    env.push(json!(items)).await;
    let pop = env
        .pop(&format!(
            "/api/v1/pop/queue/q/partition/{partition}?batch={n}"
        ))
        .await
        .expect("the leased messages");
    let messages = pop["messages"].as_array().unwrap().clone();
    assert_eq!(messages.len(), n, "{pop}");
    messages
}

/// The cursor of partition `partition` as `position settled released`.
fn cursor_of(env: &Env, partition: &str) -> String {
    env.sql(&format!(
        "SELECT s.cursor_pos || ' ' || array_to_string(s.settled, ',') || ' '
                || (s.lease_id IS NULL)
         FROM comb.cursors_now s JOIN comb.partitions p ON p.id = s.partition_id
         WHERE p.name = '{partition}'"
    ))
}

/// An ack naming as many messages as its lease spans completes the lease whole only when
/// they are exactly the lease's messages, in whatever order: the judgement reads the lease's
/// range once for such an ack, and an id that is not the lease's (another message, or one
/// named twice) leaves it to the rules message by message.
#[tokio::test]
async fn an_ack_as_large_as_its_lease_completes_it_only_with_exactly_its_messages() {
    let env = Env::start().await;
    env.configure("q", json!({"leaseTime": 300})).await;
    let leased = 6;
    let ack = |messages: &[Value], ids: &[String]| {
        json!({"acknowledgments": ids.iter().map(|id| json!({
            "transactionId": id,
            "partitionId": messages[0]["partitionId"],
            "leaseId": messages[0]["leaseId"],
            "status": "completed",
        })).collect::<Vec<_>>()})
    };
    // Three lanes: the lease's messages in reverse order; five of them and another
    // partition's message; five of them and one named twice.
    for (lane, case) in ["whole", "foreign", "twice"].iter().enumerate() {
        let partition = format!("p{lane}");
        let messages = leased_messages(&env, &partition, leased).await;
        let mut ids: Vec<String> = messages
            .iter()
            .rev()
            .map(|m| m["transactionId"].as_str().unwrap().to_string())
            .collect();
        match *case {
            "whole" => {}
            "foreign" => {
                // The message first pushed (position 1) is left out; another partition's
                // message takes its place.
                env.push(json!([{"queue": "q", "partition": "elsewhere", "payload": {}}]))
                    .await;
                let other = env
                    .sql("SELECT m.transaction_id FROM comb.messages m JOIN comb.partitions p ON p.id = m.partition_id WHERE p.name = 'elsewhere'");
                ids[leased - 1] = other;
            }
            _ => ids[leased - 1] = ids[0].clone(),
        }
        let (s, body) = env.post("/api/v1/ack/batch", &ack(&messages, &ids)).await;
        assert_eq!(s, reqwest::StatusCode::OK, "{body}");
        let answers = body.as_array().unwrap();
        assert_eq!(answers.len(), leased, "{body}");
        if *case == "whole" {
            assert!(answers.iter().all(|r| r["success"] == true), "{body}");
            assert_eq!(cursor_of(&env, &partition), format!("{leased}  true"));
        } else {
            // Position 1 is not acked: the others are settled above it, the lease holds.
            let settled: Vec<String> = (2..=leased).map(|p| p.to_string()).collect();
            assert_eq!(
                cursor_of(&env, &partition),
                format!("0 {} false", settled.join(",")),
                "{case}: {body}"
            );
        }
    }
}

/// An ack of a whole lease that nothing moved since its claim is judged by the digest of the
/// ids the claim leased, without reading the messages: here the stored ids are changed under
/// the lease, and the ack of the ids handed out still completes it (ids of several bytes per
/// character, a separator among them, in another order), also after the lease was extended.
/// Once an ack has moved the cursor, the digest is gone and the messages are read: the same
/// change then leaves the rest of the lease unacked.
#[tokio::test]
async fn a_whole_lease_is_acked_by_its_claims_digest_until_the_cursor_moves() {
    let env = Env::start().await;
    env.configure("q", json!({"leaseTime": 300})).await;
    let ids = ["é-1", "日本:2", "a:b", "10", "9"];
    for (lane, case) in ["claimed", "extended", "partial"].into_iter().enumerate() {
        let partial = case == "partial";
        let partition = format!("d{lane}");
        let items: Vec<Value> = ids
            .iter()
            .map(|id| json!({"queue": "q", "partition": partition, "transactionId": format!("{id}/{lane}"), "payload": {}}))
            .collect();
        env.push(json!(items)).await;
        let pop = env
            .pop(&format!(
                "/api/v1/pop/queue/q/partition/{partition}?batch=10"
            ))
            .await
            .expect("the leased messages");
        let messages = pop["messages"].as_array().unwrap().clone();
        assert_eq!(messages.len(), ids.len(), "{pop}");
        let id = env.sql(&format!(
            "SELECT id FROM comb.partitions WHERE name = '{partition}'"
        ));
        // The latest version, read as one partition's rows (a router query on Citus).
        let digest = format!(
            "SELECT s.lease_digest IS NOT NULL FROM comb.cursor_states s
             WHERE s.partition_id = '{id}' ORDER BY s.gen DESC, s.ver DESC LIMIT 1"
        );
        assert_eq!(env.sql(&digest), "t", "the claim writes its lease's digest");
        let ack = |ms: &[Value]| {
            json!({"acknowledgments": ms.iter().map(|m| json!({
                "transactionId": m["transactionId"],
                "partitionId": m["partitionId"],
                "leaseId": m["leaseId"],
                "status": "completed",
            })).collect::<Vec<_>>()})
        };
        let mut rest = &messages[..];
        if case == "extended" {
            let lease = messages[0]["leaseId"].as_str().unwrap();
            let (s, body) = env
                .post(
                    &format!("/api/v1/lease/{lease}/extend"),
                    &json!({"seconds": 600}),
                )
                .await;
            assert_eq!(s, reqwest::StatusCode::OK, "{body}");
            assert_eq!(env.sql(&digest), "t", "an extension carries the digest");
        }
        if partial {
            let (s, body) = env.post("/api/v1/ack/batch", &ack(&messages[..1])).await;
            assert_eq!(s, reqwest::StatusCode::OK, "{body}");
            assert_eq!(env.sql(&digest), "f", "an ack's version carries no digest");
            rest = &messages[1..];
        }
        env.sql(&format!(
            "UPDATE comb.messages m SET transaction_id = m.transaction_id || '~'
             FROM comb.partitions p WHERE p.id = m.partition_id AND p.name = '{partition}'"
        ));
        let mut shuffled = rest.to_vec();
        shuffled.reverse();
        let (s, body) = env.post("/api/v1/ack/batch", &ack(&shuffled)).await;
        assert_eq!(s, reqwest::StatusCode::OK, "{body}");
        let answers = body.as_array().unwrap();
        if partial {
            assert!(answers.iter().all(|r| r["success"] == false), "{body}");
            assert_eq!(cursor_of(&env, &partition), "1  false");
        } else {
            assert!(answers.iter().all(|r| r["success"] == true), "{body}");
            assert_eq!(cursor_of(&env, &partition), format!("{}  true", ids.len()));
        }
    }
}
