//! A Citus worker lost under load, on the direct route (`--citus-route direct`: a partition's
//! hot-path statements go to the worker holding its shard). `citus.rs` stops a worker while
//! the servers are idle; here producers and consumers run throughout the stop and the
//! restart, and every request and delivery is recorded, so the test can tell what was lost,
//! handed out twice, reordered or refused, and for how long. Everything is judged from the
//! HTTP answers alone.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::citus::{DIRECT, placements, private_cluster_with};

const QUEUE: &str = "lost_load";
/// Partitions of the queue, spread over both workers by their ids' shards.
const PARTITIONS: usize = 16;
/// Producer tasks; each owns the partitions `p` with `p % PRODUCERS` its own, so a
/// partition's messages are pushed one request after another, in their numbers' order.
const PRODUCERS: usize = 4;
/// Messages per push (one partition's).
const PUSH_BATCH: i64 = 3;
/// Consumer tasks, half on each server.
const CONSUMERS: usize = 4;
/// The queue's lease: short enough that a delivery whose ack never got through (refused
/// while the worker was down, given up by the consumer) is handed out again within the run.
const LEASE_SECONDS: u64 = 10;
/// How long the load runs before the stop, with the worker down, and after its restart.
const BEFORE: Duration = Duration::from_secs(5);
const OUTAGE: Duration = Duration::from_secs(14);
const AFTER: Duration = Duration::from_secs(8);
/// The longest run of failed requests a partition of the live worker may see (from the
/// first failure sent to the next success answered). The live worker's partitions should
/// never fail at all; the bound is a correctness bound of availability, not a latency
/// figure: it is shorter than the outage, so a server that stops serving them while the other
/// worker is down (for its whole outage) fails it, and long enough not to flake on a loaded
/// 2-core machine, where three PostgreSQL nodes, two debug-built servers and this test share
/// the cores with whatever else runs, `pg_ctl stop` and `start` take seconds, and one slow
/// request can take several.
const LONGEST_FAILURE_OF_LIVE: Duration = Duration::from_secs(10);

/// Each node's settings beyond the harness's: Citus's recovery of two-phase commits on (the
/// harness turns it off), more often than its default minute so that the run sees it. A
/// request that committed in two phases as the worker went away can be left prepared on it,
/// its rows locked until recovery finishes it (`docs/scale-out-operations.md`).
const SETTINGS: &[(&str, &str)] = &[("citus.recover_2pc_interval", "2s")];

/// One HTTP exchange: when it was sent and answered, and the answer (`None`: no answer, a
/// transport error or a timeout).
struct Answer {
    sent: Instant,
    answered: Instant,
    status: Option<StatusCode>,
    retry_after: bool,
    body: Value,
}

async fn send(request: reqwest::RequestBuilder) -> Answer {
    let sent = Instant::now();
    match request.send().await {
        Ok(r) => {
            let status = r.status();
            let retry_after = r.headers().contains_key("retry-after");
            let body = r.json().await.unwrap_or(Value::Null);
            Answer {
                sent,
                answered: Instant::now(),
                status: Some(status),
                retry_after,
                body,
            }
        }
        Err(e) => Answer {
            sent,
            answered: Instant::now(),
            status: None,
            retry_after: false,
            body: Value::String(e.to_string()),
        },
    }
}

/// A request as recorded: what it was, which partition it named (`None`: a pop of the whole
/// queue), and its answer.
struct Request {
    what: &'static str,
    server: usize,
    partition: Option<String>,
    sent: Instant,
    answered: Instant,
    status: Option<StatusCode>,
    retry_after: bool,
    code: String,
}

impl Request {
    fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.is_success())
    }
}

/// What the push of one message was answered.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Pushed {
    /// 201, item `queued`: the message must be delivered.
    Accepted,
    /// An error status: it may or may not be there.
    Refused(StatusCode),
    /// No answer: in flight, it may or may not be there.
    Unanswered,
}

/// What became of one delivery's ack.
#[derive(Clone, PartialEq, Debug)]
enum Ack {
    /// Not answered yet.
    Pending,
    /// Answered 200 with `success: true`: the message must never be handed out again.
    Succeeded,
    /// Answered `success: false`, or refused until the consumer gave up.
    Failed(String),
}

struct Delivery {
    transaction_id: String,
    partition: String,
    n: i64,
    at: Instant,
    ack: Ack,
}

#[derive(Default)]
struct Log {
    requests: Vec<Request>,
    pushed: HashMap<String, (String, i64, Pushed, Instant)>,
    /// In the order the consumers received them: a partition is leased to one consumer at
    /// a time, and each delivery is recorded before it is acked, so a partition's deliveries
    /// are in the order it handed them out.
    deliveries: Vec<Delivery>,
    /// Answers that should never be: 201 bodies not of one `queued` item per message, pops
    /// answered 200 without messages.
    odd: Vec<String>,
}

impl Log {
    fn record(&mut self, what: &'static str, server: usize, partition: Option<&str>, a: &Answer) {
        self.requests.push(Request {
            what,
            server,
            partition: partition.map(str::to_string),
            sent: a.sent,
            answered: a.answered,
            status: a.status,
            retry_after: a.retry_after,
            code: a.body["code"].as_str().unwrap_or_default().to_string(),
        });
    }
}

/// The longest run of failures among `requests` (in the order they were answered): from
/// the first failure's sending to the answer of the next success, or to the last failure's
/// answer when no success followed.
fn longest_failure(requests: &[&Request]) -> Duration {
    let mut sorted: Vec<&&Request> = requests.iter().collect();
    sorted.sort_by_key(|r| r.answered);
    let (mut longest, mut since, mut last_failure) = (Duration::ZERO, None::<Instant>, None);
    for r in sorted {
        if r.ok() {
            if let Some(s) = since.take() {
                longest = longest.max(r.answered.saturating_duration_since(s));
            }
        } else {
            since.get_or_insert(r.sent);
            last_failure = Some(r.answered);
        }
    }
    if let (Some(s), Some(l)) = (since, last_failure) {
        longest = longest.max(l.saturating_duration_since(s));
    }
    longest
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// Pushes numbered messages (transaction id `<partition>-<n>`) to `mine`, one partition's
/// batch per request, until `stop`; never sends a message again.
async fn produce(
    base: String,
    server: usize,
    mine: Vec<String>,
    log: Arc<Mutex<Log>>,
    stop: Arc<AtomicBool>,
) {
    let http = http();
    let mut next: HashMap<String, i64> = mine.iter().map(|p| (p.clone(), 1)).collect();
    while !stop.load(Ordering::Relaxed) {
        for p in &mine {
            let first = next[p];
            next.insert(p.clone(), first + PUSH_BATCH);
            let items: Vec<Value> = (first..first + PUSH_BATCH)
                .map(|n| {
                    json!({"queue": QUEUE, "partition": p, "transactionId": format!("{p}-{n}"),
                           "payload": {"n": n}})
                })
                .collect();
            let a = send(
                http.post(format!("{base}/api/v1/push"))
                    .json(&json!({ "items": items })),
            )
            .await;
            let pushed = match a.status {
                Some(StatusCode::CREATED) => Pushed::Accepted,
                Some(s) => Pushed::Refused(s),
                None => Pushed::Unanswered,
            };
            {
                let mut log = log.lock().unwrap();
                log.record("push", server, Some(p), &a);
                if pushed == Pushed::Accepted {
                    let queued = a.body.as_array().is_some_and(|r| {
                        r.len() == PUSH_BATCH as usize && r.iter().all(|i| i["status"] == "queued")
                    });
                    if !queued {
                        log.odd
                            .push(format!("push to {p} answered 201: {}", a.body));
                    }
                }
                for n in first..first + PUSH_BATCH {
                    log.pushed
                        .insert(format!("{p}-{n}"), (p.clone(), n, pushed, a.sent));
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Pops the whole queue (waiting up to a second) until `stop`, records every delivery, and
/// acks each pop's messages in a task of their own, so a refused ack (sent again until it is
/// answered, or the lease has run out) does not stop the consumer.
async fn consume(
    base: String,
    server: usize,
    log: Arc<Mutex<Log>>,
    stop: Arc<AtomicBool>,
    acking: Arc<AtomicUsize>,
) {
    let http = http();
    let url = format!("{base}/api/v1/pop/queue/{QUEUE}?batch=10&wait=true&timeout=1000");
    while !stop.load(Ordering::Relaxed) {
        let a = send(http.get(&url)).await;
        log.lock().unwrap().record("pop", server, None, &a);
        match a.status {
            Some(StatusCode::OK) => {}
            Some(StatusCode::NO_CONTENT) => continue,
            _ => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        }
        let messages = a.body["messages"].as_array().cloned().unwrap_or_default();
        let mut by_lease: BTreeMap<(String, String), Vec<(usize, Value)>> = BTreeMap::new();
        {
            let mut log = log.lock().unwrap();
            if messages.is_empty() {
                log.odd
                    .push(format!("a pop answered 200 without messages: {}", a.body));
            }
            for m in messages {
                let i = log.deliveries.len();
                log.deliveries.push(Delivery {
                    transaction_id: m["transactionId"].as_str().unwrap_or_default().into(),
                    partition: m["partition"].as_str().unwrap_or_default().into(),
                    n: m["data"]["n"].as_i64().unwrap_or(-1),
                    at: a.answered,
                    ack: Ack::Pending,
                });
                let key = (
                    m["partition"].as_str().unwrap_or_default().to_string(),
                    m["leaseId"].to_string(),
                );
                by_lease.entry(key).or_default().push((i, m));
            }
        }
        for ((partition, _), batch) in by_lease {
            acking.fetch_add(1, Ordering::SeqCst);
            let (http, base, log, acking) =
                (http.clone(), base.clone(), log.clone(), acking.clone());
            let popped = a.answered;
            tokio::spawn(async move {
                ack(&http, &base, server, &partition, &batch, popped, &log).await;
                acking.fetch_sub(1, Ordering::SeqCst);
            });
        }
    }
}

/// Acks `batch` (deliveries of one partition under one lease) as completed, sending the
/// request again while it is refused, until the lease has run out; records each item's
/// outcome on its delivery.
async fn ack(
    http: &reqwest::Client,
    base: &str,
    server: usize,
    partition: &str,
    batch: &[(usize, Value)],
    popped: Instant,
    log: &Mutex<Log>,
) {
    let items: Vec<Value> = batch
        .iter()
        .map(|(_, m)| {
            json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                   "leaseId": m["leaseId"], "status": "completed"})
        })
        .collect();
    let give_up = popped + Duration::from_secs(LEASE_SECONDS + 2);
    loop {
        let a = send(
            http.post(format!("{base}/api/v1/ack/batch"))
                .json(&json!({ "acknowledgments": items })),
        )
        .await;
        {
            let mut log = log.lock().unwrap();
            log.record("ack", server, Some(partition), &a);
            if a.status == Some(StatusCode::OK) {
                let results = a.body.as_array().cloned().unwrap_or_default();
                for (k, (i, _)) in batch.iter().enumerate() {
                    let result = results.iter().find(|r| r["index"] == k);
                    log.deliveries[*i].ack = match result {
                        Some(r) if r["success"] == true => Ack::Succeeded,
                        Some(r) => Ack::Failed(r["error"].to_string()),
                        None => Ack::Failed(format!("no result for item {k}: {}", a.body)),
                    };
                }
                return;
            }
            if Instant::now() > give_up {
                let why = format!("refused until the lease ran out: {:?} {}", a.status, a.body);
                for (i, _) in batch {
                    log.deliveries[*i].ack = Ack::Failed(why.clone());
                }
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One worker of a private cluster stopped under load while two servers serve on the direct
/// route, for longer than [`LONGEST_FAILURE_OF_LIVE`], then restarted. Producers push numbered
/// messages with unique transaction ids to 16 partitions on both workers; consumers pop the
/// whole queue and ack everything. Then:
/// - nothing answered 201 is lost: every such message is delivered and its ack succeeds;
/// - a message is handed out again only when no ack of an earlier delivery succeeded (it was
///   refused, or its lease ran out), and nothing is handed out that was not pushed;
/// - each partition hands out its messages for the first time in the order they were pushed;
/// - no request answers 500 (a 503 always carries `Retry-After`);
/// - no partition of the live worker, and no server's pops of the queue, fail for longer than
///   [`LONGEST_FAILURE_OF_LIVE`] in a row, and each live partition takes pushes and hands
///   out messages while the other worker is down;
/// - while it is down every request naming one of its partitions answers 503
///   `database_unavailable` with `Retry-After`;
/// - once it is back, its partitions take pushes again and hand them out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_lost_under_load_on_the_direct_route_loses_nothing() {
    let (citus, env) = private_cluster_with("citus_lost_load", SETTINGS, DIRECT).await;
    let second = env.second_server_with(DIRECT).await;
    let bases = [env.server.base_url(), second.base_url()];
    env.configure(QUEUE, json!({"leaseTime": LEASE_SECONDS}))
        .await;
    let names: Vec<String> = (0..PARTITIONS).map(|p| format!("p{p}")).collect();
    // Every partition made (message 0, consumed below like the rest), so their placement
    // can be read.
    env.push(json!(
        names
            .iter()
            .map(
                |p| json!({"queue": QUEUE, "partition": p, "transactionId": format!("{p}-0"),
                            "payload": {"n": 0}})
            )
            .collect::<Vec<_>>()
    ))
    .await;
    let lost_port = citus.workers()[1].port().to_string();
    let placed = placements(&citus, &env.db_name, &names);
    let (mut lost, mut live): (HashSet<String>, HashSet<String>) = Default::default();
    for line in placed.lines() {
        let (name, port) = line.split_once(' ').unwrap();
        if port == lost_port {
            lost.insert(name.to_string());
        } else {
            live.insert(name.to_string());
        }
    }
    assert!(
        !lost.is_empty() && !live.is_empty() && lost.len() + live.len() == PARTITIONS,
        "partitions on both workers: {placed}"
    );

    let log = Arc::new(Mutex::new(Log::default()));
    let started = Instant::now();
    {
        let mut log = log.lock().unwrap();
        for p in &names {
            log.pushed
                .insert(format!("{p}-0"), (p.clone(), 0, Pushed::Accepted, started));
        }
    }
    let stop_producers = Arc::new(AtomicBool::new(false));
    let stop_consumers = Arc::new(AtomicBool::new(false));
    let acking = Arc::new(AtomicUsize::new(0));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|i| {
            let mine = names
                .iter()
                .enumerate()
                .filter(|(p, _)| p % PRODUCERS == i)
                .map(|(_, n)| n.clone())
                .collect();
            tokio::spawn(produce(
                bases[i % 2].clone(),
                i % 2,
                mine,
                log.clone(),
                stop_producers.clone(),
            ))
        })
        .collect();
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|i| {
            tokio::spawn(consume(
                bases[i % 2].clone(),
                i % 2,
                log.clone(),
                stop_consumers.clone(),
                acking.clone(),
            ))
        })
        .collect();

    tokio::time::sleep(BEFORE).await;
    let worker = &citus.workers()[1];
    let stopping = Instant::now();
    tokio::task::block_in_place(|| worker.stop("fast")).expect("the worker stops");
    let stopped = Instant::now();
    tokio::time::sleep(OUTAGE).await;
    let restarting = Instant::now();
    tokio::task::block_in_place(|| worker.restart()).expect("the worker restarts");
    let restarted = Instant::now();
    tokio::time::sleep(AFTER).await;
    stop_producers.store(true, Ordering::Relaxed);
    for p in producers {
        p.await.unwrap();
    }
    let produced = Instant::now();

    // The drain: until every message answered 201 has a delivery whose ack succeeded (or a
    // minute has passed), then two seconds more for what else comes out.
    let all_acked = |log: &Log| {
        let succeeded: HashSet<&str> = log
            .deliveries
            .iter()
            .filter(|d| d.ack == Ack::Succeeded)
            .map(|d| d.transaction_id.as_str())
            .collect();
        log.pushed
            .iter()
            .filter(|(_, (_, _, pushed, _))| *pushed == Pushed::Accepted)
            .all(|(t, _)| succeeded.contains(t.as_str()))
    };
    while produced.elapsed() < Duration::from_secs(60) && !all_acked(&log.lock().unwrap()) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_consumers.store(true, Ordering::Relaxed);
    for c in consumers {
        c.await.unwrap();
    }
    while acking.load(Ordering::SeqCst) > 0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ended = Instant::now();

    let log = log.lock().unwrap();
    let at = |t: Instant| {
        format!(
            "{:.1} s",
            t.saturating_duration_since(started).as_secs_f64()
        )
    };
    let logs = || {
        format!(
            "--- first server ---\n{}\n--- second server ---\n{}",
            env.server.log_tail(40),
            second.log_tail(40)
        )
    };

    // What happened, for the record and for every failure's message.
    let accepted = log
        .pushed
        .values()
        .filter(|v| v.2 == Pushed::Accepted)
        .count();
    let refused_pushes = log
        .pushed
        .values()
        .filter(|v| matches!(v.2, Pushed::Refused(_)))
        .count();
    let unanswered = log
        .pushed
        .values()
        .filter(|v| v.2 == Pushed::Unanswered)
        .count();
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    for r in &log.requests {
        let s = r
            .status
            .map_or("none".to_string(), |s| s.as_u16().to_string());
        *statuses.entry(format!("{} {s}", r.what)).or_default() += 1;
    }
    let longest = |of: &dyn Fn(&Request) -> bool| {
        let picked: Vec<&Request> = log.requests.iter().filter(|r| of(r)).collect();
        longest_failure(&picked)
    };
    let mut live_sorted: Vec<&String> = live.iter().collect();
    live_sorted.sort();
    let live_longest: Vec<(String, Duration)> = live_sorted
        .iter()
        .map(|p| {
            (
                p.to_string(),
                longest(&|r: &Request| r.partition.as_deref() == Some(p.as_str())),
            )
        })
        .chain((0..2).map(|s| {
            (
                format!("pops of the queue on server {s}"),
                longest(&|r: &Request| r.partition.is_none() && r.server == s),
            )
        }))
        .collect();
    let failed_pops: Vec<String> = log
        .requests
        .iter()
        .filter(|r| r.partition.is_none() && !r.ok())
        .map(|r| format!("{} {:?} {}", at(r.sent), r.status, r.code))
        .collect();
    let report = format!(
        "stopped at {}..{}, restarted at {}..{}, producers stopped at {}, ended at {}; \
         lost worker's partitions {:?}; {accepted} messages accepted, {refused_pushes} refused, \
         {unanswered} unanswered; {} deliveries; requests: {statuses:?}; longest failure runs: \
         {live_longest:?}; failed pops of the queue: {failed_pops:?}",
        at(stopping),
        at(stopped),
        at(restarting),
        at(restarted),
        at(produced),
        at(ended),
        {
            let mut l: Vec<&String> = lost.iter().collect();
            l.sort();
            l
        },
        log.deliveries.len(),
    );
    eprintln!("{report}");
    assert!(log.odd.is_empty(), "{:?}\n{report}", log.odd);

    // No 500: every error is a 503 with Retry-After (or, never seen, a 4xx, which is wrong too).
    let wrong: Vec<String> = log
        .requests
        .iter()
        .filter(|r| {
            r.status.is_some_and(|s| {
                (s.is_server_error() && s != StatusCode::SERVICE_UNAVAILABLE)
                    || (s == StatusCode::SERVICE_UNAVAILABLE && !r.retry_after)
                    || s.is_client_error()
            })
        })
        .map(|r| {
            format!(
                "{} of {:?} at {}: {:?} {} retry-after {}",
                r.what,
                r.partition,
                at(r.sent),
                r.status,
                r.code,
                r.retry_after
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "answers other than 2xx or 503 with Retry-After: {wrong:?}\n{report}\n{}",
        logs()
    );

    // Nothing accepted is lost.
    let succeeded: HashSet<&str> = log
        .deliveries
        .iter()
        .filter(|d| d.ack == Ack::Succeeded)
        .map(|d| d.transaction_id.as_str())
        .collect();
    let mut missing: Vec<&String> = log
        .pushed
        .iter()
        .filter(|(t, v)| v.2 == Pushed::Accepted && !succeeded.contains(t.as_str()))
        .map(|(t, _)| t)
        .collect();
    missing.sort();
    assert!(
        missing.is_empty(),
        "{} messages answered 201 were never delivered and acked: {:?}\n{report}\n{}",
        missing.len(),
        &missing[..missing.len().min(20)],
        logs()
    );

    // Handed out again only after no ack succeeded; nothing handed out that was not pushed.
    let mut by_message: HashMap<&str, Vec<&Delivery>> = HashMap::new();
    for d in &log.deliveries {
        by_message.entry(&d.transaction_id).or_default().push(d);
    }
    let mut phantoms = Vec::new();
    let mut duplicates = Vec::new();
    let mut redelivered = 0;
    for (t, ds) in &by_message {
        match log.pushed.get(*t) {
            Some((p, n, _, _)) if *p == ds[0].partition && *n == ds[0].n => {}
            other => phantoms.push(format!("{t}: pushed {other:?}")),
        }
        redelivered += ds.len() - 1;
        if let Some(k) = ds[..ds.len() - 1]
            .iter()
            .position(|d| d.ack == Ack::Succeeded)
        {
            duplicates.push(format!(
                "{t}: delivered at {} and acked, delivered again at {}",
                at(ds[k].at),
                at(ds[k + 1].at)
            ));
        }
    }
    duplicates.sort();
    assert!(phantoms.is_empty(), "not pushed: {phantoms:?}\n{report}");
    assert!(
        duplicates.is_empty(),
        "{} messages handed out again after an ack succeeded: {:?}\n{report}\n{}",
        duplicates.len(),
        &duplicates[..duplicates.len().min(20)],
        logs()
    );
    eprintln!(
        "{redelivered} deliveries of messages handed out before, none after a successful ack"
    );

    // Each partition's first deliveries follow its numbers (of messages answered 201; one not
    // answered may have been stored after the next).
    let mut seen: HashSet<&str> = HashSet::new();
    let mut last: HashMap<&str, i64> = HashMap::new();
    let mut out_of_order = Vec::new();
    for d in &log.deliveries {
        if !seen.insert(&d.transaction_id) {
            continue;
        }
        if log.pushed.get(&d.transaction_id).map(|v| v.2) != Some(Pushed::Accepted) {
            continue;
        }
        if let Some(before) = last.insert(&d.partition, d.n)
            && before >= d.n
        {
            out_of_order.push(format!("{}: {before} then {}", d.partition, d.n));
        }
    }
    assert!(out_of_order.is_empty(), "{out_of_order:?}\n{report}");

    // The live worker's partitions and the pops of the queue kept serving.
    let too_long: Vec<&(String, Duration)> = live_longest
        .iter()
        .filter(|(_, d)| *d > LONGEST_FAILURE_OF_LIVE)
        .collect();
    assert!(
        too_long.is_empty(),
        "failing longer than {LONGEST_FAILURE_OF_LIVE:?} in a row: {too_long:?}\n{report}\n{}",
        logs()
    );
    let down = |t: Instant| t >= stopped && t < restarting;
    for p in &live_sorted {
        let pushed = log
            .pushed
            .values()
            .any(|v| &v.0 == *p && v.2 == Pushed::Accepted && down(v.3));
        let delivered = log
            .deliveries
            .iter()
            .any(|d| &d.partition == *p && down(d.at));
        assert!(
            pushed && delivered,
            "{p}, on the live worker, while the other was down: took a push {pushed}, \
             handed out messages {delivered}\n{report}\n{}",
            logs()
        );
    }

    // While the worker was down, its partitions were refused with 503 and Retry-After.
    let held: Vec<&Request> = log
        .requests
        .iter()
        .filter(|r| {
            r.partition.as_ref().is_some_and(|p| lost.contains(p))
                && r.sent >= stopped
                && r.answered < restarting
        })
        .collect();
    let not_refused: Vec<String> = held
        .iter()
        .filter(|r| {
            !(r.status == Some(StatusCode::SERVICE_UNAVAILABLE)
                && r.retry_after
                && r.code == "database_unavailable")
        })
        .map(|r| {
            format!(
                "{} of {:?} at {}: {:?} {}",
                r.what,
                r.partition,
                at(r.sent),
                r.status,
                r.code
            )
        })
        .collect();
    assert!(
        not_refused.is_empty(),
        "requests to the stopped worker's partitions not refused with 503: {not_refused:?}\n{report}"
    );
    for p in &lost {
        assert!(
            held.iter()
                .any(|r| r.what == "push" && r.partition.as_deref() == Some(p)),
            "no push to {p} while its worker was down\n{report}"
        );
        // Once it is back, they take pushes again and hand them out.
        let after: Vec<&String> = log
            .pushed
            .iter()
            .filter(|(_, v)| &v.0 == p && v.2 == Pushed::Accepted && v.3 >= restarted)
            .map(|(t, _)| t)
            .collect();
        assert!(
            !after.is_empty(),
            "{p}: no push accepted after its worker came back\n{report}\n{}",
            logs()
        );
        assert!(after.iter().all(|t| succeeded.contains(t.as_str())));
    }
    drop(log);
    drop(second);
    drop(env);
    drop(citus);
}
