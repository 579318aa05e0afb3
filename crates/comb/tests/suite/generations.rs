//! Cursor state lives in generations of insert-only tables: maintenance carries each
//! cursor's latest version into the newest generation and drops older ones whole. Positions,
//! out-of-order acks, attempts and leases survive every rotation, concurrent pops and acks
//! lose nothing, deleted queues leave nothing behind, and no row is ever updated or deleted.
//! Partition heads, no longer stored, outlive the segments their messages were in.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::common::{Env, PATIENCE, assert_ordered_read, eventually, numbers};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A new generation every second, maintenance every 200 ms.
const FAST: &[&str] = &[
    "--generation-seconds",
    "1",
    "--maintenance-interval-ms",
    "200",
];

/// Every cursor's state but the generation it sits in, one line per cursor.
const STATES: &str = "SELECT string_agg(concat_ws('|', q.name, p.name, s.consumer_group, s.ver,
        s.cursor_pos, s.cursor_seg, s.settled, s.attempt_pos, s.attempt_cnt, s.lease_id,
        s.lease_expires_at, s.lease_upto, s.available_at, s.last_claimed_at), E'\\n'
        ORDER BY q.name, p.name, s.consumer_group)
    FROM comb.cursors_now s
    JOIN comb.partitions p ON p.id = s.partition_id
    JOIN comb.queues q ON q.id = s.queue_id";

fn int(env: &Env, sql: &str) -> i64 {
    env.sql(sql).parse().unwrap()
}

fn cycles_that_dropped(env: &Env) -> i64 {
    int(
        env,
        "SELECT count(*) FROM comb.maintenance_runs WHERE generations_dropped > 0",
    )
}

/// Waits until maintenance has dropped generations in `n` more cycles.
async fn rotations(env: &Env, n: i64) {
    let target = cycles_that_dropped(env) + n;
    eventually(PATIENCE, "generations dropped", || {
        cycles_that_dropped(env) >= target
    })
    .await;
}

fn leaf_tables(env: &Env) -> i64 {
    int(
        env,
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'comb' AND c.relkind = 'r' AND c.relname LIKE 'cursor\\_states\\_%'",
    )
}

async fn pop_partition(env: &Env, partition: &str, query: &str) -> Option<Value> {
    env.pop(&format!(
        "/api/v1/pop/queue/q/partition/{partition}?{query}"
    ))
    .await
}

async fn ack(env: &Env, message: &Value, status: &str, group: Option<&str>) {
    let (s, body) = env.ack(message, status, group, None).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body[0]["success"], true, "{status}: {body}");
}

fn attempts(pop: &Value) -> Vec<i64> {
    pop["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["attempt"].as_i64().unwrap())
        .collect()
}

#[tokio::test]
async fn cursor_state_survives_rotations_and_nothing_is_updated_in_place() {
    let env = Env::start_with(FAST).await;
    env.configure("q", json!({"retryDelay": 200, "leaseTime": 300}))
        .await;
    let mut items = Vec::new();
    for p in 0..4 {
        for n in 1..=6 {
            items.push(json!({"queue": "q", "partition": format!("p{p}"), "payload": {"n": n}}));
        }
    }
    env.push(Value::Array(items)).await;

    // p0: two completed.
    let pop = pop_partition(&env, "p0", "batch=2").await.unwrap();
    assert_eq!(numbers(&pop), vec![1, 2]);
    env.ack_all(&pop, "completed", None).await;
    // p1: out of order, and a failure between completions.
    let pop = pop_partition(&env, "p1", "batch=3").await.unwrap();
    let m = pop["messages"].as_array().unwrap();
    ack(&env, &m[2], "completed", None).await;
    ack(&env, &m[0], "completed", None).await;
    ack(&env, &m[1], "failed", None).await;
    // p2: a lease left open.
    let leased = pop_partition(&env, "p2", "batch=2").await.unwrap();
    assert_eq!(numbers(&leased), vec![1, 2]);
    // p3: another group, auto-acking.
    let pop = pop_partition(&env, "p3", "batch=4&consumerGroup=fan&autoAck=true")
        .await
        .unwrap();
    assert_eq!(numbers(&pop), vec![1, 2, 3, 4]);

    let before = env.sql(STATES);
    rotations(&env, 2).await;
    assert_eq!(env.sql(STATES), before, "every cursor as it was");
    assert!(
        int(
            &env,
            "SELECT coalesce(sum(states_carried), 0) FROM comb.maintenance_runs"
        ) > 0,
        "maintenance recorded what it carried"
    );
    let leaves = leaf_tables(&env);
    assert!((1..=2).contains(&leaves), "{leaves} generation tables");

    // Each cursor goes on exactly where it stood.
    let pop = pop_partition(&env, "p0", "batch=10").await.unwrap();
    assert_eq!(numbers(&pop), vec![3, 4, 5, 6]);
    env.ack_all(&pop, "completed", None).await;
    let pop = pop_partition(&env, "p1", "batch=10").await.unwrap();
    assert_eq!(numbers(&pop), vec![2, 4, 5, 6], "3 stays settled");
    assert_eq!(attempts(&pop), vec![2, 1, 1, 1], "the failure still counts");
    env.ack_all(&pop, "completed", None).await;
    assert!(
        pop_partition(&env, "p2", "batch=10").await.is_none(),
        "the lease still holds"
    );
    env.ack_all(&leased, "completed", None).await;
    let pop = pop_partition(&env, "p2", "batch=10").await.unwrap();
    assert_eq!(numbers(&pop), vec![3, 4, 5, 6]);
    env.ack_all(&pop, "completed", None).await;
    let pop = pop_partition(&env, "p3", "batch=10&consumerGroup=fan&autoAck=true")
        .await
        .unwrap();
    assert_eq!(numbers(&pop), vec![5, 6]);
    assert!(
        pop_partition(&env, "p3", "batch=10").await.is_some(),
        "the queue-mode group never read p3"
    );

    // Hot tables only ever see inserts. Statistics arrive from other sessions with a delay:
    // wait until the inserts of this test show, then no update or delete may show with them.
    let hot = "schemaname = 'comb' AND (relname LIKE 'cursor\\_states\\_%'
        OR relname LIKE 'messages\\_%' OR relname = 'partitions')";
    eventually(PATIENCE, "statistics flushed", || {
        int(
            &env,
            &format!(
                "SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables
                 WHERE {hot} AND relname LIKE 'messages%'"
            ),
        ) >= 24
    })
    .await;
    let changed = env.sql(&format!(
        "SELECT coalesce(string_agg(relname || ' ' || n_tup_upd || ' ' || n_tup_del, ', '), '')
         FROM pg_stat_user_tables WHERE {hot} AND n_tup_upd + n_tup_del > 0"
    ));
    assert_eq!(changed, "", "rows updated or deleted in place");
}

/// Pushes, pops and acks in one partition, at least 10 messages and until `enough`; every
/// message must be delivered once, in order. Returns how many were.
async fn consume_in_turn(env: &Env, partition: &str, auto_ack: bool, enough: &AtomicBool) -> i64 {
    let query = if auto_ack {
        "batch=10&consumerGroup=g&autoAck=true"
    } else {
        "batch=10"
    };
    let (mut pushed, mut next) = (0i64, 1i64);
    while pushed < 10 || !enough.load(Ordering::SeqCst) {
        pushed += 1;
        env.push(json!([{"queue": "q", "partition": partition, "payload": {"n": pushed}}]))
            .await;
        let pop = pop_partition(env, partition, query)
            .await
            .unwrap_or_else(|| panic!("{partition}: message {pushed} not delivered"));
        for got in numbers(&pop) {
            assert_eq!(got, next, "{partition}: delivered out of turn");
            next += 1;
        }
        if !auto_ack {
            env.ack_all(&pop, "completed", None).await;
        }
    }
    assert_eq!(next, pushed + 1, "{partition}: every message delivered");
    assert!(pop_partition(env, partition, query).await.is_none());
    pushed
}

#[tokio::test]
async fn pops_and_acks_racing_rotations_lose_no_version() {
    let env = Env::start_with(FAST).await;
    env.configure("q", json!({"leaseTime": 60})).await;
    // Traffic goes on until three rotations happened under it, however long that takes.
    let enough = AtomicBool::new(false);
    let rotated = async {
        rotations(&env, 3).await;
        enough.store(true, Ordering::SeqCst);
    };
    let ((), a, b, c, d) = tokio::join!(
        rotated,
        consume_in_turn(&env, "auto1", true, &enough),
        consume_in_turn(&env, "auto2", true, &enough),
        consume_in_turn(&env, "leased1", false, &enough),
        consume_in_turn(&env, "leased2", false, &enough),
    );
    assert!(
        a.min(b).min(c).min(d) >= 10,
        "traffic flowed: {a} {b} {c} {d}"
    );
}

#[tokio::test]
async fn a_deleted_queues_cursor_states_go_with_a_rotation() {
    let env = Env::start_with(FAST).await;
    for queue in ["gone", "kept"] {
        env.push(json!([
            {"queue": queue, "partition": "a", "payload": {"n": 1}},
            {"queue": queue, "partition": "b", "payload": {"n": 1}},
        ]))
        .await;
        for g in ["x", "y"] {
            env.drain(&format!(
                "/api/v1/pop/queue/{queue}?consumerGroup={g}&autoAck=true&batch=10"
            ))
            .await;
        }
    }
    let gone = partition_ids(&env, "gone");
    let states_of_gone = || {
        int(
            &env,
            &format!("SELECT count(*) FROM comb.cursor_states WHERE partition_id IN ({gone})"),
        )
    };
    assert!(states_of_gone() >= 4);
    assert_eq!(env.delete_queue("gone").await, StatusCode::OK);
    rotations(&env, 2).await;
    assert_eq!(
        states_of_gone(),
        0,
        "the deleted queue's states were not carried"
    );
    assert_eq!(
        int(
            &env,
            "SELECT count(*) FROM comb.cursors_now s JOIN comb.queues q ON q.id = s.queue_id
             WHERE q.name = 'kept' AND s.cursor_pos = 1"
        ),
        4,
        "the other queue's cursors were carried"
    );
}

/// The queue's partition ids as a SQL list.
fn partition_ids(env: &Env, queue: &str) -> String {
    env.sql(&format!(
        "SELECT string_agg(quote_literal(p.id), ',') FROM comb.partitions p
         JOIN comb.queues q ON q.id = p.queue_id WHERE q.name = '{queue}'"
    ))
}

#[tokio::test]
async fn a_partitions_head_outlives_its_dropped_segments() {
    let env = Env::start_with(&[
        "--segment-seconds",
        "1",
        "--generation-seconds",
        "1",
        "--maintenance-interval-ms",
        "200",
    ])
    .await;
    env.configure("short", json!({"retentionSeconds": 1})).await;
    let push =
        |n: i64| env.push(json!([{"queue": "short", "partition": "p", "payload": {"n": n}}]));
    push(1).await;
    push(2).await;
    let id = partition_ids(&env, "short");
    let summaries = || {
        env.sql(&format!(
            "SELECT coalesce(string_agg(max_pos::text, ',' ORDER BY seg), '')
             FROM comb.segment_partitions WHERE partition_id = {id}"
        ))
    };
    let stored = || {
        int(
            &env,
            &format!("SELECT count(*) FROM comb.messages WHERE partition_id = {id}"),
        )
    };
    eventually(PATIENCE, "messages dropped", || stored() == 0).await;
    // The newest summary stays; were the two pushes in two segments, the older one's goes.
    eventually(PATIENCE, "the newest summary alone", || summaries() == "2").await;
    assert_eq!(
        env.sql(&format!("SELECT pos FROM comb.partition_head({id})")),
        "2"
    );
    // Positions go on from the head, not from scratch: 3 is stored at 3 (and summarised so,
    // should its segment be dropped already).
    push(3).await;
    assert_eq!(
        env.sql(&format!(
            "SELECT max(pos) FROM (SELECT pos FROM comb.messages WHERE partition_id = {id} \
             UNION ALL SELECT max_pos FROM comb.segment_partitions WHERE partition_id = {id}) s"
        )),
        "3"
    );
    eventually(PATIENCE, "message 3 dropped", || stored() == 0).await;
    eventually(PATIENCE, "superseded summary forgotten", || {
        summaries() == "3"
    })
    .await;
    // A deleted partition's summary goes with the next drop.
    assert_eq!(env.delete_queue("short").await, StatusCode::OK);
    eventually(PATIENCE, "summary of a deleted partition forgotten", || {
        summaries().is_empty()
    })
    .await;
}

/// A busy cursor has many versions in the live generation, generation tables live seconds,
/// and a database-wide ANALYZE (an operator's, or after an upgrade) leaves the table made
/// ahead looking empty and free to scan. Reading the cursor's state must still touch one
/// version: the newest generation's index first, stopping at its first entry, never every
/// version read and sorted.
#[tokio::test]
async fn a_busy_cursors_state_is_read_without_reading_its_history() {
    let env = Env::start_with(&[
        "--generation-seconds",
        "3600",
        "--maintenance-interval-ms",
        "200",
    ])
    .await;
    eventually(PATIENCE, "the next generation made ahead", || {
        leaf_tables(&env) >= 2
    })
    .await;
    // The first generation (made by the schema) and the one made ahead by maintenance both
    // tell the planner a cursor may fill the generation (schema version 6).
    assert_eq!(
        env.partition_id_options("comb.cursor_states"),
        "{n_distinct=1}"
    );
    env.sql("ANALYZE");
    // Autovacuum, which comes by this database when it will, is kept off the live generation:
    // an analysis of its own partway through the writes below would leave fewer than 1,000
    // changes since, too few for maintenance's, and the statistics waited for would then come
    // only with autovacuum's next visit (minutes away on a loaded machine with many databases).
    env.sql(
        "DO $$ BEGIN EXECUTE format('ALTER TABLE comb.%I SET (autovacuum_enabled = false)', \
         'cursor_states_' || (SELECT max(gen) FROM comb.cursor_gens)); END $$",
    );
    let items: Vec<Value> = (1..=520)
        .map(|n| json!({"queue": "q", "partition": "busy", "payload": {"n": n}}))
        .collect();
    env.push(Value::Array(items)).await;
    for n in 1..=520 {
        let pop = pop_partition(&env, "busy", "batch=1").await.unwrap();
        assert_eq!(numbers(&pop), vec![n]);
        env.ack_all(&pop, "completed", None).await;
    }
    let live = "(SELECT c.reltuples FROM pg_class c
                 WHERE c.relnamespace = 'comb'::regnamespace
                   AND c.relname = 'cursor_states_' || (SELECT max(gen) FROM comb.cursor_gens))";
    // Maintenance analyses it; on a loaded machine that can take a while.
    eventually(PATIENCE, "the live generation analysed", || {
        int(&env, &format!("SELECT {live}::bigint")) >= 1000
    })
    .await;

    let (id, group) = {
        let row = env.sql("SELECT partition_id || ' ' || consumer_group FROM comb.cursors");
        let (id, group) = row.split_once(' ').unwrap();
        (id.to_string(), group.to_string())
    };
    let plan = env.sql(&format!(
        "PREPARE st(uuid, text) AS SELECT * FROM comb.cursor_state($1, $2); \
         SET plan_cache_mode = force_generic_plan; \
         EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) EXECUTE st('{id}', '{group}')"
    ));
    assert_ordered_read("the state read", &plan, 1);
    let state = env.sql(&format!(
        "SELECT cursor_pos FROM comb.cursor_state('{id}', '{group}')"
    ));
    assert_eq!(state, "520", "the newest version is the state");
}
