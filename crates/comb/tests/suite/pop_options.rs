//! Pop options and the queue options that shape what a pop may take: one pop leasing several
//! partitions (under one lease), fair partition selection under load, `delayedProcessing`, `windowBuffer`, and
//! `maxSize` back-pressure.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{self, Env, client, get_url, numbers, xorshift};
use reqwest::StatusCode;
use serde_json::{Value, json};

#[tokio::test]
async fn one_pop_leases_several_partitions_under_one_lease() {
    let env = Env::start().await;
    let mut items = Vec::new();
    for p in 0..5 {
        for k in 0..2 {
            items.push(
                json!({"queue": "q", "partition": format!("p{p}"), "payload": {"n": p * 10 + k}}),
            );
        }
    }
    env.push(Value::Array(items)).await;

    let pop = env
        .pop("/api/v1/pop/queue/q?partitions=3&batch=10")
        .await
        .unwrap();
    assert_eq!(pop["partitionsClaimed"], 3, "{pop}");
    let messages = pop["messages"].as_array().unwrap();
    assert_eq!(
        messages.len(),
        6,
        "both messages of each of 3 partitions: {pop}"
    );
    let mut lease_of: HashMap<String, String> = HashMap::new();
    for m in messages {
        let partition = m["partition"].as_str().unwrap().to_string();
        let lease = m["leaseId"]
            .as_str()
            .expect("every message carries its lease")
            .to_string();
        let known = lease_of.entry(partition.clone()).or_insert(lease.clone());
        assert_eq!(*known, lease, "one lease per partition: {pop}");
    }
    assert_eq!(lease_of.len(), 3, "3 distinct partitions: {pop}");
    // Queen's contract: every partition of the pop under the pop's one lease.
    let leases: HashSet<&String> = lease_of.values().collect();
    assert_eq!(leases.len(), 1, "one lease for the whole pop: {pop}");
    assert_eq!(
        pop["leaseId"].as_str(),
        leases.iter().next().map(|l| l.as_str())
    );
    // Messages of one partition keep their order.
    for p in lease_of.keys() {
        let ns: Vec<i64> = messages
            .iter()
            .filter(|m| m["partition"] == p.as_str())
            .map(|m| m["data"]["n"].as_i64().unwrap())
            .collect();
        assert!(ns.is_sorted() && ns.len() == 2, "{p}: {ns:?}");
    }

    // Each message acks under the shared lease.
    let results = env.ack_all(&pop, "completed", None).await;
    assert!(results.iter().all(|r| r["success"] == true), "{results:?}");

    // The other two partitions are what is left.
    let rest = env
        .pop("/api/v1/pop/queue/q?partitions=3&batch=10")
        .await
        .unwrap();
    assert_eq!(rest["partitionsClaimed"], 2, "{rest}");
    let rest_partitions: BTreeSet<&str> = rest["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["partition"].as_str().unwrap())
        .collect();
    assert!(rest_partitions.iter().all(|p| !lease_of.contains_key(*p)));
    assert_eq!(rest_partitions.len(), 2);
}

/// A claim takes the free cursors its last walk saw beyond the one it leased without walking
/// again. One of them leased since through another server is passed over, and the claim walks
/// on to the next free partition instead of coming back empty.
#[tokio::test]
async fn a_claim_of_cursors_seen_ahead_passes_one_leased_since_and_walks_on() {
    let env = Env::start().await;
    let other = env.second_server().await;
    let items: Vec<Value> = (0..10)
        .map(|p| json!({"queue": "ahead", "partition": format!("p{p}"), "payload": {"n": p}}))
        .collect();
    env.push(Value::Array(items)).await;
    let partition = |pop: &Value| {
        pop["messages"][0]["partition"]
            .as_str()
            .unwrap()
            .to_string()
    };

    // The first claim here walks from the first partition in walk order, leases it and keeps
    // the free ones it saw beyond it.
    let first = env.pop("/api/v1/pop/queue/ahead?batch=1").await.unwrap();
    // The other server walks from its own start: it passes the leased partition and leases
    // the next, the first one seen ahead here.
    let url = format!("{}/api/v1/pop/queue/ahead?batch=1", other.base_url());
    let (s, second) = get_url(&env.http, &url).await;
    assert_eq!(s, StatusCode::OK, "{second}");
    // The next claim here tries that one first and finds it leased.
    let third = env
        .pop("/api/v1/pop/queue/ahead?batch=1")
        .await
        .expect("the next free partition, not an empty answer");
    let leased: HashSet<String> = [&first, &second, &third]
        .map(partition)
        .into_iter()
        .collect();
    assert_eq!(
        leased.len(),
        3,
        "three partitions leased once each: {leased:?}"
    );
}

/// Multi-partition pops one after another: the first walks, the next take the cursors it saw
/// ahead. Each still leases its own partitions under one lease of its own, its `batch` caps
/// the messages over them (the first partition's first), no partition is leased twice, and
/// what the cap left behind comes next, in order.
#[tokio::test]
async fn multi_partition_pops_of_cursors_seen_ahead_keep_one_lease_and_one_cap_each() {
    let env = Env::start().await;
    let mut items = Vec::new();
    for p in 0..8 {
        for k in 0..3 {
            items.push(
                json!({"queue": "wide", "partition": format!("p{p}"), "payload": {"n": p * 10 + k}}),
            );
        }
    }
    env.push(Value::Array(items)).await;
    let by_partition = |pop: &Value| {
        let mut out: HashMap<String, Vec<i64>> = HashMap::new();
        for m in pop["messages"].as_array().unwrap() {
            out.entry(m["partition"].as_str().unwrap().to_string())
                .or_default()
                .push(m["data"]["n"].as_i64().unwrap());
        }
        out
    };

    let mut pops = Vec::new();
    for _ in 0..4 {
        pops.push(
            env.pop("/api/v1/pop/queue/wide?partitions=2&batch=4")
                .await
                .expect("two partitions free"),
        );
    }
    let mut leased: HashSet<String> = HashSet::new();
    let mut leases: HashSet<String> = HashSet::new();
    for pop in &pops {
        let lease = pop["leaseId"].as_str().unwrap().to_string();
        assert!(
            pop["messages"]
                .as_array()
                .unwrap()
                .iter()
                .all(|m| m["leaseId"] == lease.as_str()),
            "one lease per pop: {pop}"
        );
        assert!(leases.insert(lease), "a lease of its own: {pop}");
        let parts = by_partition(pop);
        let mut sizes: Vec<usize> = parts.values().map(Vec::len).collect();
        sizes.sort_unstable();
        assert_eq!(sizes, vec![1, 3], "batch=4 over two partitions: {pop}");
        for (p, ns) in parts {
            assert!(
                ns.is_sorted() && ns[0] % 10 == 0,
                "{p} from its first: {ns:?}"
            );
            assert!(leased.insert(p.clone()), "{p} leased twice");
        }
    }
    assert_eq!(leased.len(), 8);
    assert!(
        env.pop("/api/v1/pop/queue/wide?partitions=2&batch=4")
            .await
            .is_none(),
        "every partition is leased"
    );

    for pop in &pops {
        let results = env.ack_all(pop, "completed", None).await;
        assert!(results.iter().all(|r| r["success"] == true), "{results:?}");
    }
    // What the caps left: the last two messages of one partition of each pop.
    let mut rest: Vec<i64> = Vec::new();
    while let Some(pop) = env.pop("/api/v1/pop/queue/wide?partitions=2&batch=4").await {
        for (p, ns) in by_partition(&pop) {
            assert_eq!(
                ns.iter().map(|n| n % 10).collect::<Vec<_>>(),
                vec![1, 2],
                "{p}"
            );
            rest.extend(ns);
        }
        env.ack_all(&pop, "completed", None).await;
    }
    assert_eq!(rest.len(), 8, "{rest:?}");
}

const FAIR_PARTITIONS: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_steady_load_every_partition_is_served() {
    let env = Arc::new(Env::start().await);
    let items: Vec<Value> = (0..FAIR_PARTITIONS)
        .map(|p| json!({"queue": "fair", "partition": format!("p{p:03}"), "payload": {"n": p}}))
        .collect();
    env.push(Value::Array(items)).await;

    let stop = Arc::new(AtomicBool::new(false));
    // Keeps pushing one message at a time to random partitions, so some partitions always
    // have more waiting and would be picked again and again by an unfair selection.
    let pusher = {
        let env = env.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let http = client();
            let mut seed = 0x2545_F491_4F6C_DD1D_u64;
            let mut pushed = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let p = xorshift(&mut seed) % FAIR_PARTITIONS as u64;
                let r = http
                    .post(env.url("/api/v1/push"))
                    .json(&json!({"items": [{"queue": "fair", "partition": format!("p{p:03}"), "payload": {"n": 1000 + p}}]}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), StatusCode::CREATED);
                pushed += 1;
            }
            pushed
        })
    };

    // Claims walk the partitions round robin, so every partition with pending messages is
    // served within one round over all partitions plus the claims in flight.
    // 2 × 200 pops leaves a round's worth of slack for that.
    let bound = 2 * FAIR_PARTITIONS;
    let pops = Arc::new(AtomicUsize::new(0));
    let served: Arc<Mutex<HashSet<String>>> = Arc::new(Mutex::new(HashSet::new()));
    let mut consumers = Vec::new();
    for _ in 0..4 {
        let env = env.clone();
        let pops = pops.clone();
        let served = served.clone();
        consumers.push(tokio::spawn(async move {
            let http = client();
            let url = env.url("/api/v1/pop/queue/fair?partitions=1&batch=1&autoAck=true");
            let deadline = Instant::now() + common::PATIENCE;
            while Instant::now() < deadline {
                if served.lock().unwrap().len() == FAIR_PARTITIONS
                    || pops.load(Ordering::SeqCst) >= bound
                {
                    break;
                }
                let (s, b) = get_url(&http, &url).await;
                if s == StatusCode::NO_CONTENT {
                    continue;
                }
                assert_eq!(s, StatusCode::OK, "{b}");
                if pops.fetch_add(1, Ordering::SeqCst) < bound {
                    served
                        .lock()
                        .unwrap()
                        .insert(b["partition"].as_str().unwrap().to_string());
                }
            }
        }));
    }
    for c in consumers {
        c.await.unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let pushed = pusher.await.unwrap();

    let served = served.lock().unwrap();
    let missing: Vec<String> = (0..FAIR_PARTITIONS)
        .map(|p| format!("p{p:03}"))
        .filter(|p| !served.contains(p))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {FAIR_PARTITIONS} partitions not served within {bound} pops \
         ({} pops made, {pushed} extra messages pushed meanwhile); first: {:?}",
        missing.len(),
        pops.load(Ordering::SeqCst),
        &missing[..missing.len().min(10)]
    );
}

/// Pops arriving together for one group each get a partition while there are enough: a
/// server's claims of one group never race each other for the same cursors, however little
/// beyond what it wants a claim's walk looks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pops_arriving_together_each_get_a_partition() {
    const POPS: usize = 60;
    let env = Env::start().await;
    let items: Vec<Value> = (0..POPS)
        .map(|p| json!({"queue": "together", "partition": format!("p{p:02}"), "payload": {"n": p}}))
        .collect();
    env.push(Value::Array(items)).await;
    // Subscribe the group first, so that every pop below is a claim.
    assert!(
        env.pop("/api/v1/pop/queue/together?batch=1")
            .await
            .is_some()
    );
    let http = client();
    let url = env.url("/api/v1/pop/queue/together?batch=1");
    let answers = futures_util::future::join_all((1..POPS).map(|_| get_url(&http, &url))).await;
    let mut partitions = BTreeSet::new();
    for (s, b) in &answers {
        assert_eq!(
            *s,
            StatusCode::OK,
            "a pop got nothing while partitions were free: {b}"
        );
        partitions.insert(b["partition"].as_str().unwrap().to_string());
    }
    assert_eq!(partitions.len(), POPS - 1, "each pop its own partition");
}

#[tokio::test]
async fn delayed_processing_hides_a_message_until_its_delay_has_passed() {
    let env = Env::start().await;
    env.configure("late", json!({"delayedProcessing": 1})).await;
    // Taken before the push is sent, so no later than the moment it was stored.
    let before_push = Instant::now();
    env.push(json!([{"queue": "late", "payload": {"n": 1}}]))
        .await;
    // Nothing right after the push; delivered once the delay has passed.
    let pop = env.pop_now_or_wait("late").await;
    let waited = before_push.elapsed();
    assert_eq!(numbers(&pop), vec![1]);
    assert!(
        waited >= Duration::from_secs(1),
        "delivered {waited:?} after the push, before delayedProcessing = 1 s"
    );
}

/// Keeps what a pop of `win` delivered; a delivery of "busy" must come at least 1 s
/// (`windowBuffer`) after the last push to it began.
fn served(delivered: &mut Vec<Value>, pop: &Value, last_push: Instant) {
    if pop["partition"] == "busy" {
        assert!(
            last_push.elapsed() >= Duration::from_secs(1),
            "a partition receiving a push every 300 ms was served {:?} after its last push, \
             inside windowBuffer = 1 s: {pop}",
            last_push.elapsed()
        );
    }
    delivered.extend(pop["messages"].as_array().unwrap().iter().cloned());
}

#[tokio::test]
async fn window_buffer_serves_a_partition_only_after_it_has_been_quiet() {
    let env = Env::start().await;
    env.configure("win", json!({"windowBuffer": 1})).await;
    env.push(json!([{"queue": "win", "partition": "quiet", "payload": {"n": 0}}]))
        .await;

    // "busy" gets a message every 300 ms for about 2.4 s; it is never quiet for 1 s (unless
    // the machine is too slow to keep that pace: then it may be served, but never sooner than
    // 1 s after the push before, which is what every delivery of it is checked for).
    let mut delivered: Vec<Value> = Vec::new();
    // Taken before each push is sent, so it is no later than the moment the push committed.
    let mut last_push = Instant::now();
    for k in 1..=8 {
        last_push = Instant::now();
        env.push(json!([{"queue": "win", "partition": "busy", "payload": {"n": k}}]))
            .await;
        let step_end = Instant::now() + Duration::from_millis(300);
        while Instant::now() < step_end {
            if let Some(pop) = env
                .pop("/api/v1/pop/queue/win?autoAck=true&batch=100")
                .await
            {
                served(&mut delivered, &pop, last_push);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // The quiet partition was served meanwhile.
    let of = |delivered: &[Value], partition: &str| -> Vec<i64> {
        delivered
            .iter()
            .filter(|m| m["partition"] == partition)
            .map(|m| m["data"]["n"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(
        of(&delivered, "quiet"),
        vec![0],
        "the quiet partition is served after its window"
    );

    // Once the pushes stop, the busy partition is served with everything it holds.
    while of(&delivered, "busy").len() < 8 {
        let pop = env
            .pop("/api/v1/pop/queue/win?autoAck=true&batch=100&wait=true&timeout=30000")
            .await
            .expect("served once quiet");
        assert_eq!(pop["partition"], "busy");
        served(&mut delivered, &pop, last_push);
    }
    assert_eq!(of(&delivered, "busy"), (1..=8).collect::<Vec<i64>>());
}

#[tokio::test]
async fn max_size_refuses_pushes_beyond_the_pending_limit_until_messages_are_consumed() {
    let env = Env::start().await;
    env.configure("small", json!({"maxSize": 5})).await;
    for n in 1..=5 {
        env.push(json!([{"queue": "small", "payload": {"n": n}}]))
            .await;
    }
    let sixth = json!({"items": [{"queue": "small", "payload": {"n": 6}}]});
    let (s, headers, b) = env.post_full("/api/v1/push", &sixth).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{b}");
    assert_eq!(b["code"], "queue_full", "{b}");
    let retry_after = headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    assert!(
        retry_after.is_some(),
        "429 without a Retry-After header: {headers:?}"
    );
    assert_eq!(env.message_count(), 5, "the refused message was not stored");

    // Consuming two makes room for two.
    let pop = env.pop("/api/v1/pop/queue/small?batch=2").await.unwrap();
    assert_eq!(numbers(&pop), vec![1, 2]);
    env.ack_all(&pop, "completed", None).await;
    env.push(json!([{"queue": "small", "payload": {"n": 6}}]))
        .await;
    env.push(json!([{"queue": "small", "payload": {"n": 7}}]))
        .await;
    let (s, _, b) = env
        .post_full(
            "/api/v1/push",
            &json!({"items": [{"queue": "small", "payload": {"n": 8}}]}),
        )
        .await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{b}");
    assert_eq!(b["code"], "queue_full", "{b}");
}
