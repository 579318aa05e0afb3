//! Claims and acks run generic plans, kept until something invalidates them. One made from
//! the statistics of young tables must still read by index once the tables have filled: a
//! cursor's state, a partition's next messages and an acked message's position are a few
//! index entries, however many rows the generation, the segment and the queue hold.

use crate::common::{Env, assert_scans_return_at_most};
use comb::{ack, pop};
use serde_json::json;

/// Rows added to the partition and to the cursor's history after the plans are made.
const FILL: u32 = 5_000;

/// Most rows any scan of these statements may return here: a claim reads a batch of 10.
const FEW: u32 = 50;

/// How a test's transaction gets the settings the consumer path's connections start with.
fn begin_with_plans() -> String {
    format!("BEGIN; {}", ack::PLANS)
}

/// Prepares `statement` in a transaction begun with `begin`, runs it once (making its
/// plan from the young tables), fills the partition with `FILL` messages and the cursor's
/// history with `FILL` versions, and returns `EXPLAIN ANALYZE` of running it again with the
/// same plan.
fn plan_after_filling(env: &Env, begin: &str, statement: &str, args: &str) -> String {
    let (partition, group) = ids(env);
    let fill = fill_messages(&partition);
    env.sql(&format!(
        "{begin};
         PREPARE s AS {statement};
         EXECUTE s({args});
         {fill}
         INSERT INTO comb.cursor_states
             (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg)
         SELECT s.partition_id, s.consumer_group, (SELECT max(gen) FROM comb.cursor_gens),
                s.ver + g, s.cursor_pos, s.cursor_seg
         FROM comb.cursor_state('{partition}', '{group}') s, generate_series(1, {FILL}) g;
         EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) EXECUTE s({args})"
    ))
}

/// Stores `FILL` messages in the partition at positions 1..=FILL.
fn fill_messages(partition: &str) -> String {
    format!(
        "INSERT INTO comb.messages
             (partition_id, pos, seg, message_id, transaction_id, payload, created_at)
         SELECT '{partition}', 1 + g, (SELECT max(seg) FROM comb.segments), gen_random_uuid(),
                'fill-' || g, '{{}}', now()
         FROM generate_series(1, {FILL}) g;"
    )
}

/// Partition `p`'s id and the queue-mode group's name.
fn ids(env: &Env) -> (String, String) {
    let row = env.sql(
        "SELECT c.partition_id || ' ' || c.consumer_group FROM comb.cursors c
         JOIN comb.partitions p ON p.id = c.partition_id WHERE p.name = 'p'",
    );
    let (id, group) = row.split_once(' ').expect("one cursor");
    (id.to_string(), group.to_string())
}

/// A queue of 100 partitions holding one message each, the one of partition `p` delivered
/// and acked, and statistics taken of the tables as they are now (as autovacuum or a
/// database-wide `ANALYZE` takes them of young tables). Returns the queue's id.
async fn young_queue(env: &Env) -> String {
    let items: Vec<_> = (0..100)
        .map(|k| {
            let name = if k == 0 {
                "p".to_string()
            } else {
                format!("p{k}")
            };
            json!({"queue": "q", "partition": name, "payload": {"n": k}})
        })
        .collect();
    env.push(json!(items)).await;
    let pop = env
        .pop("/api/v1/pop/queue/q/partition/p?batch=1")
        .await
        .expect("one message");
    env.ack_all(&pop, "completed", None).await;
    env.sql("ANALYZE");
    env.sql("SELECT id FROM comb.queues WHERE name = 'q'")
}

fn assert_read_by_index(what: &str, plan: &str) {
    for table in ["messages_", "cursor_states_", "cursors ", "partitions "] {
        assert!(
            !plan.contains(&format!("Seq Scan on {table}")),
            "{what} reads {table}… sequentially:\n{plan}"
        );
    }
    assert_scans_return_at_most(what, plan, FEW);
}

/// The plan of one of a claim's statements, made on a young queue and run after filling;
/// `args` makes its arguments from the queue's id, partition `p`'s id and the group.
async fn claim_plan(statement: &str, args: impl Fn(&str, &str, &str) -> String) -> String {
    let env = Env::start().await;
    let queue = young_queue(&env).await;
    let (partition, group) = ids(&env);
    let args = args(&queue, &partition, &group);
    plan_after_filling(&env, &begin_with_plans(), statement, &args)
}

#[tokio::test]
async fn the_candidate_walk_planned_on_young_tables_reads_by_index() {
    let plan = claim_plan(pop::CANDIDATES_SQL, |queue, _, group| {
        format!("'{queue}', '{group}', NULL, 1, 30, '00000000-0000-0000-0000-000000000000', 2")
    })
    .await;
    // The walk found and locked a cursor with messages.
    assert!(plan.contains("LockRows (actual rows=1 "), "{plan}");
    // The queue sets no time-based option, and its walk carries none of their head lookups.
    assert!(!plan.contains("segment_partitions"), "{plan}");
    assert_read_by_index("the candidate walk", &plan);
    // Each cursor walked has its next message looked for once (in the first segment
    // table: the others are probed as often).
    let nodes = executed_nodes(&plan);
    let walked: u32 = nodes
        .iter()
        .filter(|(node, _)| node.contains("using cursors_walk"))
        .map(|(node, _)| actual(node, "rows="))
        .sum();
    let probes: u32 = nodes
        .iter()
        .filter(|(node, cond)| node.contains("on messages_1 ") && cond.contains("(pos > s"))
        .map(|(node, _)| actual(node, "loops="))
        .sum();
    assert!(walked > 0, "{plan}");
    assert!(
        probes <= walked,
        "{probes} probes for {walked} cursors:\n{plan}"
    );
}

/// The executed nodes of an `EXPLAIN ANALYZE` plan, each with the line below it (its
/// condition, when it has one).
fn executed_nodes(plan: &str) -> Vec<(&str, &str)> {
    let lines: Vec<&str> = plan.lines().collect();
    lines
        .iter()
        .enumerate()
        .filter(|(_, line)| line.contains("(actual "))
        .map(|(k, line)| (*line, lines.get(k + 1).copied().unwrap_or("")))
        .collect()
}

/// The number after `key` in a node's `(actual …)` figures.
fn actual(line: &str, key: &str) -> u32 {
    line.split(key)
        .nth(1)
        .and_then(|r| r.split([' ', ')']).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

#[tokio::test]
async fn the_claim_planned_on_young_tables_reads_by_index() {
    let plan = claim_plan(pop::CLAIM_SQL, |queue, partition, group| {
        format!("'{queue}', '{group}', ARRAY['{partition}']::uuid[], 10, 30, false")
    })
    .await;
    // The second run claims the first ten of the messages added after the first, and
    // neither sorts them nor reads the partition's name once per message.
    let top = plan.lines().next().unwrap_or("");
    assert!(top.contains("(actual rows=10 loops=1)"), "{plan}");
    assert!(!plan.contains("Sort Method"), "{plan}");
    assert!(
        plan.lines()
            .filter(|l| l.contains("on partitions "))
            .all(|l| l.contains("loops=1)")),
        "{plan}"
    );
    assert_read_by_index("the claim", &plan);
}

#[tokio::test]
async fn the_acks_reads_planned_on_young_tables_read_by_index() {
    let env = Env::start().await;
    young_queue(&env).await;
    let (partition, group) = ids(&env);
    let cursor = format!("ARRAY['{partition}']::uuid[], ARRAY['{group}']::text[]");
    let reads = [
        (
            "the message lookup",
            ack::LOOKUP_SQL,
            format!("ARRAY['{partition}']::uuid[], ARRAY['fill-4000']::text[]"),
        ),
        ("the cursor lock", ack::LOCK_SQL, cursor.clone()),
        ("the state read", ack::STATE_SQL, cursor.clone()),
        (
            "the state read with the delivered range",
            ack::ACK_STATE_SQL,
            format!("{cursor}, ARRAY[1]::bigint[]"),
        ),
    ];
    for (what, statement, args) in reads {
        let plan = plan_after_filling(&env, &begin_with_plans(), statement, &args);
        assert!(plan.contains("(actual rows=1 loops=1)"), "{what}:\n{plan}");
        assert_read_by_index(what, &plan);
    }
}

#[tokio::test]
async fn an_ack_reads_only_the_start_of_a_large_delivered_range() {
    let env = Env::start().await;
    young_queue(&env).await;
    let (partition, group) = ids(&env);
    // The partition's next FILL messages, all handed out under one lease.
    let fill = fill_messages(&partition);
    let plan = env.sql(&format!(
        "{begin};
         {fill}
         INSERT INTO comb.cursor_states
             (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, lease_id,
              lease_expires_at, lease_upto)
         SELECT s.partition_id, s.consumer_group, (SELECT max(gen) FROM comb.cursor_gens),
                s.ver + 1, s.cursor_pos, s.cursor_seg, gen_random_uuid(),
                now() + interval '1 minute', s.cursor_pos + {FILL}
         FROM comb.cursor_state('{partition}', '{group}') s;
         PREPARE s AS {statement};
         EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF)
             EXECUTE s(ARRAY['{partition}']::uuid[], ARRAY['{group}']::text[], ARRAY[1])",
        begin = begin_with_plans(),
        statement = ack::ACK_STATE_SQL,
    ));
    assert!(plan.contains("(actual rows=1 loops=1)"), "{plan}");
    assert_read_by_index("the state read with the delivered range", &plan);
    // One ack reads the first ten messages of the range (2 per ack, 8 more), by index.
    let read: u32 = executed_nodes(&plan)
        .iter()
        .filter(|(node, _)| node.contains("on messages_1 "))
        .map(|(node, _)| actual(node, "rows="))
        .sum();
    assert_eq!(read, 10, "{plan}");
}

/// The plans a server's statements were run with: auto_explain's entries (query text, plan
/// and the planner settings that differ from the defaults) logged from `start` on, for this
/// test's database only (the others log no settings).
fn logged_plans(log: &std::path::Path, start: u64) -> Vec<String> {
    let bytes = std::fs::read(log).expect("the cluster's log");
    let text = String::from_utf8_lossy(&bytes[start as usize..]).to_string();
    text.split("LOG:  duration:")
        .skip(1)
        .filter(|entry| entry.contains("Settings: "))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn claims_and_acks_run_on_connections_started_with_the_consumer_settings() {
    let env = Env::start().await;
    env.push(json!([{"queue": "q", "partition": "p", "payload": {"n": 1}}]))
        .await;
    // Every session a server opens from now on logs each plan with its non-default settings.
    let db = &env.db_name;
    env.sql(&format!(
        "ALTER DATABASE \"{db}\" SET session_preload_libraries = 'auto_explain';
         ALTER DATABASE \"{db}\" SET auto_explain.log_min_duration = 0;
         ALTER DATABASE \"{db}\" SET auto_explain.log_settings = on;
         ALTER DATABASE \"{db}\" SET auto_explain.log_nested_statements = on"
    ));
    let log = std::path::PathBuf::from(env.sql("SHOW data_directory")).join("postgres.log");
    let start = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let server = env.second_server().await;
    let http = crate::common::client();
    let push = http
        .post(format!("{}/api/v1/push", server.base_url()))
        .json(
            &json!({"items": [{"queue": "q", "partition": "p", "payload": {"n": 2}},
                                  {"queue": "q", "partition": "p", "payload": {"n": 3}},
                                  {"queue": "q", "partition": "p", "payload": {"n": 4}}]}),
        )
        .send()
        .await
        .unwrap();
    assert!(push.status().is_success(), "{}", push.status());
    let pop: serde_json::Value = http
        .get(format!("{}/api/v1/pop/queue/q?batch=4", server.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let messages = pop["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 4, "{pop}");
    // The first completes alone (judged in SQL, one ack), the next two together (judged in
    // SQL, several), the last fails (judged by the general path).
    let item = |m: &serde_json::Value, status: &str| {
        json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
               "leaseId": m["leaseId"], "status": status})
    };
    for body in [
        item(&messages[0], "completed"),
        json!({"acknowledgments": [item(&messages[1], "completed"),
                                   item(&messages[2], "completed")]}),
        item(&messages[3], "failed"),
    ] {
        let route = if body.get("acknowledgments").is_some() {
            "ack/batch"
        } else {
            "ack"
        };
        let ack = http
            .post(format!("{}/api/v1/{route}", server.base_url()))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(ack.status().is_success(), "{}", ack.status());
    }

    let plans = logged_plans(&log, start);
    let settings_of = |statement: &str| -> Vec<&String> {
        plans
            .iter()
            .filter(|p| p.contains(statement.trim().lines().next().unwrap().trim()))
            .collect()
    };
    let consumer = [
        ("the claim's walk", pop::CANDIDATES_SQL),
        ("the cursor lock", ack::LOCK_SQL),
        ("the state read", ack::ACK_STATE_SQL),
        ("the completing acks' judgement", ack::JUDGE_SQL),
        (
            "a single completing ack's message read",
            "SELECT count(*), min(m.pos), min(m.seg)",
        ),
    ];
    for (what, statement) in consumer {
        let found = settings_of(statement);
        assert!(!found.is_empty(), "{what} was not logged:\n{plans:#?}");
        for plan in found {
            for setting in [
                "plan_cache_mode = 'force_generic_plan'",
                "enable_seqscan = 'off'",
                "enable_bitmapscan = 'off'",
                "jit = 'off'",
            ] {
                assert!(
                    plan.contains(setting),
                    "{what} ran without {setting}:\n{plan}"
                );
            }
        }
    }
    // A push runs on the general pool, without JIT; its statements run in one call
    // (`comb.store_batch`) with the consumer path's plans, the partitions' lock included.
    for (what, first_line) in [
        ("the push's insert", "INSERT INTO comb.messages"),
        ("the partitions' lock", "SELECT id FROM comb.partitions"),
    ] {
        let found: Vec<&String> = plans.iter().filter(|p| p.contains(first_line)).collect();
        assert!(!found.is_empty(), "{what} was not logged:\n{plans:#?}");
        for plan in found {
            for setting in ["plan_cache_mode = 'force_generic_plan'", "jit = 'off'"] {
                assert!(
                    plan.contains(setting),
                    "{what} ran without {setting}:\n{plan}"
                );
            }
        }
    }
}
