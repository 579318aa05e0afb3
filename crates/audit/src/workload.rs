//! The audit's traffic: producers that push numbered messages until every push is answered,
//! and consumers in several groups that pop with leases, ack, fail some messages on purpose
//! and sometimes die holding a batch.
//!
//! Everything they see goes into a [`History`]; [`Audit::finish`] drains the queue and hands
//! the history to [`crate::ledger::check`]. Every loop here is bounded: producers by their
//! quota and a deadline per push, consumers by the drain deadline.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::ledger::{self, Delivery, Fault, History, MessageNumber, Report, partition_name};
use crate::rng::Rng;

/// What to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// Prefix of every transaction id: keeps runs on one database apart.
    pub run: String,
    pub queue: String,
    pub partitions: u32,
    /// Consumer group names; every group must receive every message.
    pub groups: Vec<String>,
    pub producers: u32,
    /// Most items per push request (each request carries 1..=this many).
    pub push_batch: usize,
    /// Messages to push in all.
    pub messages: u64,
    /// Messages per second over all producers; `None` pushes as fast as answers come.
    pub rate: Option<f64>,
    pub consumers_per_group: usize,
    pub pop_batch: u32,
    /// Share of deliveries acked `failed` on purpose.
    pub fail_rate: f64,
    /// Share of batches whose consumer dies after acking only part of it.
    pub death_rate: f64,
    /// Consumer 0 of every group dies on this batch (1-based), so a short run sees a death.
    pub forced_death_at: Option<u64>,
    pub lease_secs: u32,
    pub retry_delay_ms: u64,
    /// Pop with `autoAck=true` (at-most-once) instead of leases and acks. With consumer
    /// deaths this must lose messages: it shows the audit notices loss.
    pub auto_ack: bool,
    /// How long a producer keeps retrying one push before it counts it unconfirmed.
    pub push_give_up: Duration,
    /// How long [`Audit::finish`] waits for every accepted message to be settled.
    pub drain_timeout: Duration,
    pub seed: u64,
}

impl Config {
    /// A configuration with the shape: 100 partitions, two groups, 1 % failed acks.
    pub fn standard(run: &str, messages: u64) -> Config {
        Config {
            run: run.to_string(),
            queue: format!("audit-{run}"),
            partitions: 100,
            groups: vec!["audit-a".into(), "audit-b".into()],
            producers: 4,
            push_batch: 20,
            messages,
            rate: None,
            consumers_per_group: 3,
            pop_batch: 10,
            fail_rate: 0.01,
            death_rate: 0.002,
            forced_death_at: Some(3),
            lease_secs: 4,
            retry_delay_ms: 200,
            auto_ack: false,
            push_give_up: Duration::from_secs(120),
            drain_timeout: Duration::from_secs(60),
            seed: 1,
        }
    }
}

/// The servers the audit talks to. Scenarios replace a server's address when they restart
/// it (it comes back on a new port).
#[derive(Debug, Default)]
pub struct Endpoints(RwLock<Vec<String>>);

impl Endpoints {
    /// Endpoints with these base URLs.
    pub fn new(urls: Vec<String>) -> Arc<Endpoints> {
        Arc::new(Endpoints(RwLock::new(urls)))
    }

    /// Replaces the URL in slot `i`.
    pub fn set(&self, i: usize, url: String) {
        self.0.write().expect("endpoints")[i] = url;
    }

    /// Drops a server for good (after a scenario killed it without restart).
    pub fn remove(&self, url: &str) {
        self.0.write().expect("endpoints").retain(|u| u != url);
    }

    /// The URL for an actor's `k`-th choice.
    pub fn pick(&self, k: usize) -> String {
        let urls = self.0.read().expect("endpoints");
        urls[k % urls.len()].clone()
    }
}

/// Counters of what went wrong on the wire; not failures by themselves (faults cause them),
/// but 500s and 4xx are worth a look.
#[derive(Debug, Default)]
pub struct Stats {
    pub push_requests: AtomicU64,
    pub push_retries: AtomicU64,
    pub pops: AtomicU64,
    pub acks: AtomicU64,
    /// Pops answered with messages, and ack requests answered 200: what was served (a
    /// scenario compares them before and after a fault).
    pub pops_served: AtomicU64,
    pub acks_served: AtomicU64,
    pub transport_errors: AtomicU64,
    pub status_503: AtomicU64,
    pub status_429: AtomicU64,
    pub status_500: AtomicU64,
    pub ack_refused_items: AtomicU64,
    pub deaths: AtomicU64,
    pub failed_on_purpose: AtomicU64,
    /// A few bodies of 5xx answers other than 503, for reports.
    pub samples: Mutex<Vec<String>>,
}

impl Stats {
    fn note_status(&self, what: &str, status: u16, body: &str) {
        match status {
            503 => self.status_503.fetch_add(1, Ordering::Relaxed),
            429 => self.status_429.fetch_add(1, Ordering::Relaxed),
            _ => self.status_500.fetch_add(1, Ordering::Relaxed),
        };
        if status >= 500 && status != 503 {
            let mut s = self.samples.lock().expect("samples");
            if s.len() < 10 {
                s.push(format!("{what}: {status} {}", truncate(body, 300)));
            }
        }
    }

    /// One line for people.
    pub fn summary(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "push requests {} (retries {}), pops {}, ack requests {}, transport errors {}, \
             503 {}, 429 {}, other 5xx {}, refused ack items {}, consumer deaths {}, failed on \
             purpose {}",
            g(&self.push_requests),
            g(&self.push_retries),
            g(&self.pops),
            g(&self.acks),
            g(&self.transport_errors),
            g(&self.status_503),
            g(&self.status_429),
            g(&self.status_500),
            g(&self.ack_refused_items),
            g(&self.deaths),
            g(&self.failed_on_purpose),
        )
    }
}

fn truncate(s: &str, n: usize) -> &str {
    let mut cut = n.min(s.len());
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

struct Shared {
    cfg: Config,
    endpoints: Arc<Endpoints>,
    history: Mutex<History>,
    /// Per group: messages whose `completed` ack was confirmed.
    completed: Vec<Mutex<HashSet<MessageNumber>>>,
    stop_producers: AtomicBool,
    stop_consumers: AtomicBool,
    stats: Stats,
}

/// A running audit.
pub struct Audit {
    shared: Arc<Shared>,
    producers: Vec<tokio::task::JoinHandle<()>>,
    consumers: Vec<tokio::task::JoinHandle<()>>,
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .connect_timeout(Duration::from_secs(2))
        .pool_max_idle_per_host(4)
        .build()
        .expect("HTTP client")
}

/// Sends a JSON POST and returns the status and body text, or `None` on a transport error.
async fn post(http: &reqwest::Client, url: &str, body: &Value) -> Option<(u16, String)> {
    let r = http.post(url).json(body).send().await.ok()?;
    let status = r.status().as_u16();
    let text = r.text().await.ok()?;
    Some((status, text))
}

impl Audit {
    /// Creates the queue with the audit's options (short leases, retries that never
    /// dead-letter, short retry delay), retrying for up to 60 s.
    pub async fn configure(cfg: &Config, endpoints: &Endpoints) -> Result<(), String> {
        let http = client();
        let body = json!({
            "queue": cfg.queue,
            "options": {
                "leaseTime": cfg.lease_secs,
                "retryLimit": 10_000,
                "retryDelay": cfg.retry_delay_ms,
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut k = 0;
        loop {
            let url = format!("{}/api/v1/configure", endpoints.pick(k));
            match post(&http, &url, &body).await {
                Some((200, _)) => return Ok(()),
                Some((s, b)) if (400..500).contains(&s) => {
                    return Err(format!("configure refused: {s} {b}"));
                }
                _ if Instant::now() > deadline => return Err("configure: no server".into()),
                _ => {
                    k += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// Starts producers and consumers against `endpoints`.
    pub fn start(cfg: Config, endpoints: Arc<Endpoints>) -> Audit {
        let groups = cfg.groups.len();
        let history = History {
            groups,
            lease: Duration::from_secs(cfg.lease_secs as u64),
            ..History::default()
        };
        let shared = Arc::new(Shared {
            completed: (0..groups).map(|_| Mutex::default()).collect(),
            cfg,
            endpoints,
            history: Mutex::new(history),
            stop_producers: AtomicBool::new(false),
            stop_consumers: AtomicBool::new(false),
            stats: Stats::default(),
        });
        let cfg = &shared.cfg;
        let producers = (0..cfg.producers)
            .map(|id| tokio::spawn(produce(shared.clone(), id)))
            .collect();
        let mut consumers = Vec::new();
        for g in 0..groups {
            for c in 0..cfg.consumers_per_group {
                consumers.push(tokio::spawn(consume(shared.clone(), g, c)));
            }
        }
        Audit {
            shared,
            producers,
            consumers,
        }
    }

    /// Messages accepted so far.
    pub fn accepted(&self) -> u64 {
        self.shared.history.lock().expect("history").accepted.len() as u64
    }

    /// Deliveries so far (every group, redeliveries included).
    pub fn delivered(&self) -> u64 {
        self.shared
            .history
            .lock()
            .expect("history")
            .deliveries
            .len() as u64
    }

    /// Waits until at least `n` messages were accepted, or `timeout` passed; returns whether
    /// they were.
    pub async fn wait_accepted(&self, n: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.accepted() < n {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        true
    }

    /// Records a fault the scenario caused, from `start` until service was back.
    pub fn record_fault(&self, name: &str, start: Instant, end: Instant) {
        self.shared
            .history
            .lock()
            .expect("history")
            .faults
            .push(Fault {
                name: name.to_string(),
                start,
                end,
            });
    }

    /// Tells producers to stop after their current push (for time-bound scenarios).
    pub fn stop_producing(&self) {
        self.shared.stop_producers.store(true, Ordering::SeqCst);
    }

    /// Whether every producer has finished.
    pub fn producers_done(&self) -> bool {
        self.producers.iter().all(|p| p.is_finished())
    }

    /// The wire counters so far.
    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    fn all_settled(&self) -> bool {
        let accepted: Vec<MessageNumber> = self
            .shared
            .history
            .lock()
            .expect("history")
            .accepted
            .keys()
            .copied()
            .collect();
        self.shared.completed.iter().all(|done| {
            let done = done.lock().expect("completed");
            accepted.iter().all(|n| done.contains(n))
        })
    }

    /// Waits for the producers, lets consumers drain until every accepted message was
    /// settled in every group (or the drain deadline passed), stops them and judges.
    pub async fn finish(self) -> (Report, Arc<Stats>) {
        for p in &self.producers {
            while !p.is_finished() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let deadline = Instant::now() + self.shared.cfg.drain_timeout;
        while !self.all_settled() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.shared.stop_consumers.store(true, Ordering::SeqCst);
        for c in self.consumers {
            let _ = c.await;
        }
        for p in self.producers {
            let _ = p.await;
        }
        let shared = Arc::try_unwrap(self.shared)
            .ok()
            .expect("every task has ended");
        let history = shared.history.into_inner().expect("history");
        let report = ledger::check(&history);
        (report, Arc::new(shared.stats))
    }
}

async fn produce(shared: Arc<Shared>, id: u32) {
    let cfg = &shared.cfg;
    let http = client();
    let mut rng = Rng::new(cfg.seed ^ (0x5eed_0000 + id as u64));
    let quota = cfg.messages / cfg.producers as u64
        + u64::from((id as u64) < cfg.messages % cfg.producers as u64);
    let per_producer_rate = cfg.rate.map(|r| r / cfg.producers as f64);
    let started = Instant::now();
    let mut seq = 0u64;
    let mut k = id as usize;
    while seq < quota && !shared.stop_producers.load(Ordering::SeqCst) {
        if let Some(rate) = per_producer_rate {
            let due = started + Duration::from_secs_f64(seq as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
        }
        let n_items = (1 + rng.below(cfg.push_batch as u64)).min(quota - seq);
        let mut batch = Vec::with_capacity(n_items as usize);
        for _ in 0..n_items {
            let number = MessageNumber::new(id, seq);
            seq += 1;
            let partition = rng.below(cfg.partitions as u64) as u32;
            batch.push((number, partition));
        }
        let items: Vec<Value> = batch
            .iter()
            .map(|(n, p)| {
                json!({
                    "queue": cfg.queue,
                    "partition": partition_name(*p),
                    "payload": {"n": n.0, "p": p},
                    "transactionId": n.transaction_id(&cfg.run),
                })
            })
            .collect();
        let body = json!({ "items": items });
        let deadline = Instant::now() + cfg.push_give_up;
        let mut backoff = Duration::from_millis(50);
        let outcome = loop {
            shared.stats.push_requests.fetch_add(1, Ordering::Relaxed);
            let url = format!("{}/api/v1/push", shared.endpoints.pick(k));
            match post(&http, &url, &body).await {
                Some((201, text)) => break Some(Ok(text)),
                Some((status, text)) if retryable(status) => {
                    shared.stats.note_status("push", status, &text);
                }
                Some((status, text)) => break Some(Err(format!("{status} {text}"))),
                None => {
                    shared
                        .stats
                        .transport_errors
                        .fetch_add(1, Ordering::Relaxed);
                    k += 1;
                }
            }
            if Instant::now() + backoff > deadline {
                break None;
            }
            shared.stats.push_retries.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        };
        let mut h = shared.history.lock().expect("history");
        match outcome {
            Some(Ok(text)) => {
                let answers: Vec<Value> = serde_json::from_str(&text).unwrap_or_default();
                for (i, (number, partition)) in batch.iter().enumerate() {
                    let a = answers.get(i);
                    let ok = a.is_some_and(|a| {
                        matches!(a["status"].as_str(), Some("queued" | "duplicate"))
                            && a["transaction_id"].as_str()
                                == Some(number.transaction_id(&cfg.run).as_str())
                    });
                    if ok {
                        h.accepted.insert(*number, *partition);
                    } else {
                        h.refused += 1;
                        h.unconfirmed.insert(*number, *partition);
                    }
                }
            }
            Some(Err(e)) => {
                eprintln!("audit: push refused: {}", truncate(&e, 300));
                h.refused += batch.len() as u64;
                for (number, partition) in &batch {
                    h.unconfirmed.insert(*number, *partition);
                }
            }
            None => {
                for (number, partition) in &batch {
                    h.unconfirmed.insert(*number, *partition);
                }
            }
        }
    }
}

/// Answers a client should retry: the server or its database is busy or away.
fn retryable(status: u16) -> bool {
    status == 429 || status == 409 || status >= 500
}

/// One message of a pop answer, as the consumer needs it.
struct Got {
    delivery: usize,
    number: Option<MessageNumber>,
    transaction_id: String,
    partition_id: String,
    lease_id: String,
}

async fn consume(shared: Arc<Shared>, group: usize, id: usize) {
    let cfg = &shared.cfg;
    let mut http = client();
    let mut rng = Rng::new(cfg.seed ^ (0xc0_0000 + (group * 1000 + id) as u64));
    let mut k = group * cfg.consumers_per_group + id;
    let mut batches = 0u64;
    let group_name = &cfg.groups[group];
    let pop_body = json!({
        "queue": cfg.queue,
        "consumerGroup": group_name,
        "batch": cfg.pop_batch,
        "wait": true,
        "timeout": 1000,
        "autoAck": cfg.auto_ack,
    });
    while !shared.stop_consumers.load(Ordering::SeqCst) {
        let url = format!("{}/api/v1/pop", shared.endpoints.pick(k));
        shared.stats.pops.fetch_add(1, Ordering::Relaxed);
        let text = match post(&http, &url, &pop_body).await {
            Some((200, text)) => text,
            Some((204, _)) => continue,
            Some((status, text)) => {
                shared.stats.note_status("pop", status, &text);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            None => {
                shared
                    .stats
                    .transport_errors
                    .fetch_add(1, Ordering::Relaxed);
                k += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let received = Instant::now();
        let Ok(answer) = serde_json::from_str::<Value>(&text) else {
            shared.stats.note_status("pop (unreadable 200)", 200, &text);
            continue;
        };
        let messages = answer["messages"].as_array().cloned().unwrap_or_default();
        if messages.is_empty() {
            continue;
        }
        shared.stats.pops_served.fetch_add(1, Ordering::Relaxed);
        batches += 1;
        let dies = (id == 0 && cfg.forced_death_at == Some(batches)) || rng.chance(cfg.death_rate);
        if cfg.auto_ack && dies {
            // At-most-once: the batch was settled inside the pop, and the consumer died
            // before handling any of it. Nobody ever sees these messages.
            shared.stats.deaths.fetch_add(1, Ordering::Relaxed);
            http = client();
            continue;
        }
        let mut got = Vec::with_capacity(messages.len());
        {
            let mut h = shared.history.lock().expect("history");
            let mut done = shared.completed[group].lock().expect("completed");
            for m in &messages {
                let txid = m["transactionId"].as_str().unwrap_or_default().to_string();
                let number = MessageNumber::from_transaction_id(&cfg.run, &txid);
                let partition = m["partition"]
                    .as_str()
                    .and_then(|p| p.strip_prefix('p'))
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(u32::MAX);
                h.deliveries.push(Delivery {
                    group,
                    partition,
                    number: number.unwrap_or(MessageNumber(u64::MAX)),
                    message_id: m["id"].as_str().unwrap_or_default().to_string(),
                    at: received,
                    abandoned: false,
                    settled_at: cfg.auto_ack.then_some(received),
                });
                if cfg.auto_ack
                    && let Some(n) = number
                {
                    done.insert(n);
                }
                got.push(Got {
                    delivery: h.deliveries.len() - 1,
                    number,
                    transaction_id: txid,
                    partition_id: m["partitionId"].as_str().unwrap_or_default().to_string(),
                    lease_id: m["leaseId"].as_str().unwrap_or_default().to_string(),
                });
            }
        }
        if cfg.auto_ack {
            continue;
        }
        // Which messages get acked, and how.
        let mut acks: Vec<(&Got, &'static str)> = Vec::new();
        let mut abandoned: Vec<usize> = Vec::new();
        if dies {
            let keep = rng.below(got.len() as u64) as usize;
            for (i, g) in got.iter().enumerate() {
                if i < keep {
                    acks.push((g, "completed"));
                } else {
                    abandoned.push(g.delivery);
                }
            }
        } else {
            for g in &got {
                if rng.chance(cfg.fail_rate) {
                    acks.push((g, "failed"));
                    abandoned.push(g.delivery);
                    shared
                        .stats
                        .failed_on_purpose
                        .fetch_add(1, Ordering::Relaxed);
                } else {
                    acks.push((g, "completed"));
                }
            }
        }
        if !abandoned.is_empty() {
            let mut h = shared.history.lock().expect("history");
            for d in &abandoned {
                h.deliveries[*d].abandoned = true;
            }
        }
        if !acks.is_empty() {
            ack(&shared, &http, &mut k, group, &acks, received).await;
        }
        if dies {
            // The process "died": its connections go, its lease is left to expire.
            shared.stats.deaths.fetch_add(1, Ordering::Relaxed);
            http = client();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// How long a consumer keeps retrying one ack request.
const ACK_PATIENCE: Duration = Duration::from_secs(120);

/// Acks a batch, retrying across servers until it gets a definite answer.
async fn ack(
    shared: &Shared,
    http: &reqwest::Client,
    k: &mut usize,
    group: usize,
    acks: &[(&Got, &'static str)],
    received: Instant,
) {
    let cfg = &shared.cfg;
    let items: Vec<Value> = acks
        .iter()
        .map(|(g, status)| {
            json!({
                "transactionId": g.transaction_id,
                "partitionId": g.partition_id,
                "leaseId": g.lease_id,
                "status": status,
            })
        })
        .collect();
    let body = json!({"acknowledgments": items, "consumerGroup": cfg.groups[group]});
    // Retry until the server gives a definite answer, not just while the lease holds: an ack
    // whose answer was lost may still have been committed (its COMMIT sent before the
    // database froze or the server died). Sent again, it answers success if it was (a
    // settled message acks again without error) and lease_invalid if it was not.
    let deadline = received + ACK_PATIENCE;
    loop {
        shared.stats.acks.fetch_add(1, Ordering::Relaxed);
        let url = format!("{}/api/v1/ack/batch", shared.endpoints.pick(*k));
        match post(http, &url, &body).await {
            Some((200, text)) => {
                shared.stats.acks_served.fetch_add(1, Ordering::Relaxed);
                let now = Instant::now();
                let results: Vec<Value> = serde_json::from_str(&text).unwrap_or_default();
                let mut h = shared.history.lock().expect("history");
                let mut done = shared.completed[group].lock().expect("completed");
                for (i, (g, status)) in acks.iter().enumerate() {
                    let ok = results
                        .get(i)
                        .is_some_and(|r| r["success"].as_bool() == Some(true));
                    if !ok {
                        shared
                            .stats
                            .ack_refused_items
                            .fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    if *status == "completed" {
                        h.deliveries[g.delivery].settled_at = Some(now);
                        if let Some(n) = g.number {
                            done.insert(n);
                        }
                    }
                }
                return;
            }
            Some((status, text)) => {
                shared.stats.note_status("ack", status, &text);
                if !retryable(status) {
                    shared
                        .stats
                        .ack_refused_items
                        .fetch_add(acks.len() as u64, Ordering::Relaxed);
                    return;
                }
            }
            None => {
                shared
                    .stats
                    .transport_errors
                    .fetch_add(1, Ordering::Relaxed);
                *k += 1;
            }
        }
        if Instant::now() + Duration::from_millis(200) > deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
