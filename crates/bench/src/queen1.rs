//! The `queen1` cells: the shape of Queen MQ 1.0's published 24-hour soak, run on Comb.
//!
//! Queen 1.0's soak: one queue of 200 partitions; producers push batches of 100 messages,
//! each with a producer's `transactionId` (so the duplicate check runs on every insert);
//! consumers pop up to 1,000 under a lease and ack asynchronously; 256-byte payloads; 60 s
//! retention, which is also how far back duplicates are found (Comb finds a duplicate among
//! the messages its partition holds, so the duplicate window is the retained window);
//! PostgreSQL with `synchronous_commit=on` and `commit_delay=200`.
//!
//! The cell does not offer a fixed rate: it searches for the highest rate at which consumers
//! keep up ([`search`]), then measures one window at that rate with the suite's accounting.
//! `queen1-enc` is the same with `encryptionEnabled` on the queue. The soak at a share of
//! that rate, with an audit of every message, is [`soak`] (`comb-bench queen1-soak`).

pub mod soak;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use hyper::Method;

use crate::http::{BoxError, Conn};
use crate::load::{self, QUEUE};
use crate::load::{PopAnswer, ack_body};
use crate::nodes::Node;
use crate::report::Row;
use crate::run::{Options, sample_backlog, set_backlog, set_nodes, set_usage, start_window};
use crate::stats::{Window, histogram, now_us, quantile_ms, slope};

/// Partitions of the queue.
pub const PARTITIONS: usize = 200;
/// Messages per push request.
pub const PUSH_BATCH: usize = 100;
/// Most messages one pop returns (over all the partitions it leases).
pub const POP_BATCH: usize = 1_000;
/// Partitions one pop may lease: at the rates a small machine sustains a single partition
/// holds a few dozen messages between two pops, so a pop leases several to fill its batch.
pub const POP_PARTITIONS: usize = 10;
/// Consumer connections (each with a second connection for its acks).
pub const CONSUMERS: usize = 8;
/// Producer connections sharing the fixed-rate schedule.
pub const PRODUCERS: usize = 32;
/// Payload size, bytes of JSON.
pub const PAYLOAD_BYTES: usize = 256;
/// `retentionSeconds` of the queue, and so the window of the duplicate check.
pub const RETENTION_S: u64 = 60;
/// `comb serve --segment-seconds` for these cells: short enough that retention drops whole
/// segments while a run lasts (the default period is an hour).
pub const SEGMENT_SECONDS: u64 = 30;
/// PostgreSQL settings of Queen 1.0's soak that differ from the suite's: set on the cell's
/// database only (`ALTER DATABASE … SET`), so the other cells keep the suite's settings.
pub const DATABASE_SETTINGS: &[(&str, &str)] =
    &[("synchronous_commit", "on"), ("commit_delay", "200")];
/// A fixed key for `queen1-enc`: the benchmark's data is thrown away with its database.
pub const BENCH_KEY: &str = "6b1f0c3a9d2e4f5061728394a5b6c7d8e9f00112233445566778899aabbccdd0";

/// The queue options of the cells.
pub fn queue_options(encrypted: bool) -> String {
    format!("{{\"retentionSeconds\":{RETENTION_S},\"encryptionEnabled\":{encrypted}}}")
}

/// `ALTER DATABASE` statements giving `db` the cells' PostgreSQL settings.
pub fn database_sql(db: &str) -> String {
    DATABASE_SETTINGS
        .iter()
        .map(|(k, v)| format!("ALTER DATABASE \"{db}\" SET {k} = '{v}';"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Extra `comb serve` flags of the cells.
pub fn serve_args() -> Vec<String> {
    vec!["--segment-seconds".into(), SEGMENT_SECONDS.to_string()]
}

/// Environment of `comb serve` for the cells: the key that `encryptionEnabled` needs.
pub fn serve_env() -> Vec<(&'static str, &'static str)> {
    vec![("COMB_ENCRYPTION_KEY", BENCH_KEY)]
}

/// Words of the payload text: a small vocabulary, as event payloads have.
const WORDS: &[&str] = &[
    "order",
    "created",
    "shipped",
    "customer",
    "account",
    "payment",
    "refund",
    "invoice",
    "warehouse",
    "eu-west-1",
    "us-east-2",
    "priority",
    "standard",
    "express",
    "pending",
    "settled",
    "basket",
    "item",
    "sku",
    "quantity",
    "discount",
    "coupon",
    "mobile",
    "web",
    "session",
    "checkout",
    "retry",
    "notify",
    "email",
    "sms",
    "ledger",
    "balance",
];

/// Records of the payload corpus.
const CORPUS_LEN: usize = 512;

/// The fixed payload corpus: `CORPUS_LEN` JSON member lists (without braces and the stamp),
/// each longer than any payload needs, from a seeded generator so every run sends the same
/// bytes. A record is event-shaped: repeated keys and a small vocabulary (which compress),
/// hex ids, amounts and free text (which compress less), in proportions that make zstd
/// roughly halve the corpus (checked by a test).
fn corpus() -> &'static [String] {
    static CORPUS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    CORPUS.get_or_init(|| {
        let mut rng = fastrand::Rng::with_seed(0x5175_6565_6e31);
        let hex = |rng: &mut fastrand::Rng, n: usize| -> String {
            (0..n)
                .map(|_| char::from_digit(rng.u32(..16), 16).unwrap())
                .collect()
        };
        (0..CORPUS_LEN)
            .map(|_| {
                let mut s = String::with_capacity(400);
                let _ = write!(
                    s,
                    "\"type\":\"{}.{}\",\"user\":\"u-{}\",\"order\":\"{}\",\"amount\":{}.{:02},\
                     \"region\":\"{}\",\"ref\":\"{}\",\"text\":\"",
                    WORDS[rng.usize(..WORDS.len())],
                    WORDS[rng.usize(..WORDS.len())],
                    hex(&mut rng, 12),
                    hex(&mut rng, 16),
                    rng.u32(1..10_000),
                    rng.u32(..100),
                    WORDS[rng.usize(..WORDS.len())],
                    hex(&mut rng, 20),
                );
                // Free text: made-up words of random letters, as varied as user-written text.
                while s.len() < 480 {
                    for _ in 0..rng.usize(3..=8) {
                        s.push(rng.lowercase());
                    }
                    s.push(' ');
                }
                s
            })
            .collect()
    })
}

/// The payload of message `n` sent at `t_us`: exactly [`PAYLOAD_BYTES`] of JSON, the send
/// stamp first, then corpus record `n mod CORPUS_LEN` cut to fit.
pub fn payload(t_us: u64, n: u64) -> String {
    let mut s = String::with_capacity(PAYLOAD_BYTES);
    let _ = write!(s, "{{\"t\":{t_us},\"n\":{n},");
    let record = &corpus()[(n % CORPUS_LEN as u64) as usize];
    let room = PAYLOAD_BYTES - s.len() - 2;
    s.push_str(&record[..room.min(record.len())]);
    s.push_str("\"}");
    s
}

/// The transaction id of message `n`: unique over the run, so that no push is a duplicate
/// and every message can be audited.
fn transaction_id(n: u64) -> String {
    format!("q1-{n}")
}

/// Message `n` back from its transaction id.
fn message_number(tx: &str) -> Option<u64> {
    tx.strip_prefix("q1-")?.parse().ok()
}

/// A push of messages `first..first + count` into partition `p`, each with its transaction
/// id and payload.
pub fn push_body(p: usize, first: u64, count: usize, t_us: u64) -> Bytes {
    let mut s = String::with_capacity(count * (PAYLOAD_BYTES + 80) + 16);
    s.push_str("{\"items\":[");
    for k in 0..count as u64 {
        if k > 0 {
            s.push(',');
        }
        let n = first + k;
        let _ = write!(
            s,
            "{{\"queue\":\"{QUEUE}\",\"partition\":\"p{p}\",\"transactionId\":\"{}\",\"payload\":{}}}",
            transaction_id(n),
            payload(t_us, n)
        );
    }
    s.push_str("]}");
    Bytes::from(s)
}

/// Which messages were accepted and which delivered: one bit per message number.
#[derive(Debug, Default)]
pub struct Audit {
    accepted: Vec<u64>,
    delivered: Vec<u64>,
    /// Deliveries of a message already delivered (lease expiries, redeliveries).
    pub redelivered: u64,
    /// Push items answered `duplicate` (none should be: every id is new).
    pub duplicates: u64,
}

fn set_bit(bits: &mut Vec<u64>, n: u64) -> bool {
    let (w, b) = ((n / 64) as usize, n % 64);
    if bits.len() <= w {
        bits.resize(w + 1 + w / 2, 0);
    }
    let was = bits[w] & (1 << b) != 0;
    bits[w] |= 1 << b;
    was
}

fn count_bits(bits: &[u64]) -> u64 {
    bits.iter().map(|w| u64::from(w.count_ones())).sum()
}

impl Audit {
    /// Notes messages `first..first + count` as accepted.
    pub fn accept(&mut self, first: u64, count: u64) {
        for n in first..first + count {
            set_bit(&mut self.accepted, n);
        }
    }

    /// Notes one delivery of message `n`.
    pub fn deliver(&mut self, n: u64) {
        if set_bit(&mut self.delivered, n) {
            self.redelivered += 1;
        }
    }

    /// Messages accepted.
    pub fn accepted(&self) -> u64 {
        count_bits(&self.accepted)
    }

    /// Distinct messages delivered.
    pub fn delivered(&self) -> u64 {
        count_bits(&self.delivered)
    }

    /// Accepted messages never delivered.
    pub fn lost(&self) -> u64 {
        self.accepted
            .iter()
            .enumerate()
            .map(|(i, a)| {
                u64::from((a & !self.delivered.get(i).copied().unwrap_or(0)).count_ones())
            })
            .sum()
    }

    /// Delivered messages never accepted (phantoms; a push whose answer was lost is one).
    pub fn unaccepted(&self) -> u64 {
        self.delivered
            .iter()
            .enumerate()
            .map(|(i, d)| u64::from((d & !self.accepted.get(i).copied().unwrap_or(0)).count_ones()))
            .sum()
    }
}

/// What the load counts while it runs; samplers read it at the edges of their intervals.
pub struct Live {
    /// Messages accepted.
    pub pushed: Arc<AtomicU64>,
    /// Messages delivered (pops' messages, redeliveries included).
    pub consumed: Arc<AtomicU64>,
    /// Pops that returned messages.
    pub pops: AtomicU64,
    /// Pops that found nothing.
    pub empty_pops: AtomicU64,
    /// Ack requests answered 200.
    pub acks: AtomicU64,
    /// Push requests answered.
    pub pushes: AtomicU64,
    /// Failed requests of any kind.
    pub errors: AtomicU64,
    /// Latencies since the last [`Live::take`]: end to end, pop and ack, µs.
    pub e2e: Mutex<Histogram<u64>>,
    /// Pop request latency.
    pub pop_latency: Mutex<Histogram<u64>>,
    /// Ack request latency.
    pub ack_latency: Mutex<Histogram<u64>>,
    /// Push request latency.
    pub push_latency: Mutex<Histogram<u64>>,
    /// The message numbers.
    pub audit: Mutex<Audit>,
    next: AtomicU64,
    stop: AtomicBool,
}

impl Default for Live {
    fn default() -> Self {
        Live {
            pushed: Arc::new(AtomicU64::new(0)),
            consumed: Arc::new(AtomicU64::new(0)),
            pops: AtomicU64::new(0),
            empty_pops: AtomicU64::new(0),
            acks: AtomicU64::new(0),
            pushes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            e2e: Mutex::new(histogram()),
            pop_latency: Mutex::new(histogram()),
            ack_latency: Mutex::new(histogram()),
            push_latency: Mutex::new(histogram()),
            audit: Mutex::new(Audit::default()),
            next: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        }
    }
}

/// The requests counted so far: pushes, pops, empty pops, acks.
fn requests(live: &Live) -> u64 {
    live.pushes.load(Ordering::Relaxed)
        + live.pops.load(Ordering::Relaxed)
        + live.empty_pops.load(Ordering::Relaxed)
        + live.acks.load(Ordering::Relaxed)
}

impl Live {
    /// Accepted but not yet delivered.
    pub fn backlog(&self) -> i64 {
        self.pushed.load(Ordering::Relaxed) as i64 - self.consumed.load(Ordering::Relaxed) as i64
    }

    /// Empties the latency histograms, returning (e2e, pop, ack).
    pub fn take(&self) -> (Histogram<u64>, Histogram<u64>, Histogram<u64>) {
        let take = |m: &Mutex<Histogram<u64>>| {
            std::mem::replace(&mut *m.lock().expect("not poisoned"), histogram())
        };
        (
            take(&self.e2e),
            take(&self.pop_latency),
            take(&self.ack_latency),
        )
    }
}

/// Fixed-rate producers: `rate` messages a second in pushes of [`PUSH_BATCH`] to a random
/// partition, over [`PRODUCERS`] connections sharing the schedule, from now until `end`.
pub async fn produce(addr: SocketAddr, live: Arc<Live>, rate: f64, end: Instant) {
    let start = Instant::now();
    let interval = PUSH_BATCH as f64 / rate;
    let slot = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..PRODUCERS)
        .map(|_| {
            let (live, slot) = (live.clone(), slot.clone());
            tokio::spawn(async move {
                let mut conn = Conn::new(addr);
                let _ = conn.open().await;
                let mut rng = fastrand::Rng::new();
                loop {
                    let i = slot.fetch_add(1, Ordering::Relaxed);
                    let due = start + Duration::from_secs_f64(i as f64 * interval);
                    if due >= end {
                        break;
                    }
                    tokio::time::sleep_until(due.into()).await;
                    let first = live.next.fetch_add(PUSH_BATCH as u64, Ordering::Relaxed);
                    let body = push_body(rng.usize(..PARTITIONS), first, PUSH_BATCH, now_us());
                    let t0 = Instant::now();
                    match conn.send(Method::POST, "/api/v1/push", Some(body)).await {
                        Ok(a) if a.status == 201 || a.status == 200 => {
                            live.push_latency
                                .lock()
                                .expect("not poisoned")
                                .saturating_record((t0.elapsed().as_micros() as u64).max(1));
                            let dups = count(&a.body, b"\"duplicate\"");
                            live.pushes.fetch_add(1, Ordering::Relaxed);
                            live.pushed.fetch_add(PUSH_BATCH as u64, Ordering::Relaxed);
                            let mut audit = live.audit.lock().expect("not poisoned");
                            audit.accept(first, PUSH_BATCH as u64);
                            audit.duplicates += dups;
                        }
                        _ => {
                            live.errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
}

/// Occurrences of `needle` in `hay`.
fn count(hay: &[u8], needle: &[u8]) -> u64 {
    hay.windows(needle.len()).filter(|w| *w == needle).count() as u64
}

/// Starts [`CONSUMERS`] consumers that run until [`stop`]: each pops up to [`POP_BATCH`] over
/// up to [`POP_PARTITIONS`] leased partitions (long poll), and acks the batch on a second
/// connection while it pops the next one; before acking a batch it waits for the previous
/// ack, so one ack is in flight per consumer.
pub fn consume(addr: SocketAddr, live: Arc<Live>) -> Vec<tokio::task::JoinHandle<()>> {
    let path: Arc<str> = format!(
        "/api/v1/pop/queue/{QUEUE}?batch={POP_BATCH}&partitions={POP_PARTITIONS}&wait=true&timeout=500"
    )
    .into();
    (0..CONSUMERS)
        .map(|_| {
            let (live, path) = (live.clone(), path.clone());
            tokio::spawn(async move {
                let mut conn = Conn::new(addr);
                let _ = conn.open().await;
                let mut ack_conn = Some(Conn::new(addr));
                let mut pending: Option<tokio::task::JoinHandle<Conn>> = None;
                while !live.stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    let answer = match conn.send(Method::GET, &path, None).await {
                        Ok(a) if a.status == 204 => {
                            live.empty_pops.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        Ok(a) if a.status == 200 => a,
                        _ => {
                            live.errors.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    };
                    let took = t0.elapsed();
                    let Ok(got) = serde_json::from_slice::<PopAnswer>(&answer.body) else {
                        live.errors.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    if got.messages.is_empty() {
                        live.empty_pops.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let now = now_us();
                    live.pops.fetch_add(1, Ordering::Relaxed);
                    live.pop_latency
                        .lock()
                        .expect("not poisoned")
                        .saturating_record((took.as_micros() as u64).max(1));
                    {
                        let mut e2e = live.e2e.lock().expect("not poisoned");
                        for m in &got.messages {
                            e2e.saturating_record(now.saturating_sub(m.data.t).max(1));
                        }
                    }
                    {
                        let mut audit = live.audit.lock().expect("not poisoned");
                        for n in got
                            .messages
                            .iter()
                            .filter_map(|m| message_number(m.transaction_id))
                        {
                            audit.deliver(n);
                        }
                    }
                    live.consumed
                        .fetch_add(got.messages.len() as u64, Ordering::Relaxed);
                    let body = ack_body("", &got.messages);
                    if let Some(p) = pending.take() {
                        ack_conn = p.await.ok();
                    }
                    let mut c = ack_conn.take().unwrap_or_else(|| Conn::new(addr));
                    let live = live.clone();
                    pending = Some(tokio::spawn(async move {
                        let t0 = Instant::now();
                        match c.send(Method::POST, "/api/v1/ack/batch", Some(body)).await {
                            Ok(a) if a.status == 200 => {
                                live.acks.fetch_add(1, Ordering::Relaxed);
                                live.ack_latency
                                    .lock()
                                    .expect("not poisoned")
                                    .saturating_record((t0.elapsed().as_micros() as u64).max(1));
                            }
                            _ => {
                                live.errors.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        c
                    }));
                }
                if let Some(p) = pending.take() {
                    let _ = p.await;
                }
            })
        })
        .collect()
}

/// Stops the consumers after their current pop and waits for their last acks.
pub async fn stop(live: &Live, consumers: Vec<tokio::task::JoinHandle<()>>) {
    live.stop.store(true, Ordering::Relaxed);
    for c in consumers {
        let _ = c.await;
    }
}

/// One probe of the rate search.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Probe {
    /// Offered, msgs/s.
    pub offered: f64,
    /// Accepted, msgs/s.
    pub pushed: f64,
    /// Delivered, msgs/s.
    pub consumed: f64,
    /// Backlog slope, msgs/s per s.
    pub slope: f64,
    /// Whether it kept up.
    pub keeps_up: bool,
}

/// Whether a load keeps up: producers met the offered rate (within 3 %), consumers took at
/// least 98 % of what was pushed, and the backlog did not grow (within 2 % of the offered
/// rate per second, the noise of batches of up to 1,000 in flight; the suite's criterion).
pub fn keeps_up(offered: f64, pushed: f64, consumed: f64, slope: f64) -> bool {
    pushed >= 0.97 * offered && consumed >= 0.98 * pushed && slope <= 0.02 * offered
}

/// Offers `rate` for `warmup + secs` seconds and judges the last `secs`.
async fn probe(addr: SocketAddr, live: &Arc<Live>, rate: f64, warmup: f64, secs: f64) -> Probe {
    let window = Window::after(
        Duration::from_secs_f64(warmup),
        Duration::from_secs_f64(secs),
    );
    let sampler = tokio::spawn(sample_backlog(
        window,
        live.pushed.clone(),
        vec![live.consumed.clone()],
    ));
    produce(addr, live.clone(), rate, window.end).await;
    let samples = sampler.await.unwrap_or_default();
    let (first, last) = (samples.first(), samples.last());
    let (pushed, consumed) = match (first, last) {
        (Some(a), Some(b)) if b.0 > a.0 => (
            (b.1 - a.1) as f64 / (b.0 - a.0),
            (b.2[0] - a.2[0]) as f64 / (b.0 - a.0),
        ),
        _ => (0.0, 0.0),
    };
    let pts: Vec<(f64, f64)> = samples
        .iter()
        .map(|(t, p, c)| (*t, *p as f64 - c[0] as f64))
        .collect();
    let slope = slope(&pts).unwrap_or(f64::INFINITY);
    Probe {
        offered: rate,
        pushed,
        consumed,
        slope,
        keeps_up: keeps_up(rate, pushed, consumed, slope),
    }
}

/// Waits, producers stopped, until at most `left` messages wait, or `max` has passed.
pub async fn drain(live: &Live, left: f64, max: Duration) {
    let until = Instant::now() + max;
    while (live.backlog() as f64) > left && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the rate search found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Search {
    /// The highest probed rate that kept up (the lowest probed, if none did).
    pub rate: f64,
    /// Every probe, in order.
    pub probes: Vec<Probe>,
}

/// How the search probes.
#[derive(Debug, Clone, Copy)]
pub struct SearchPlan {
    /// First rate tried, msgs/s.
    pub start: f64,
    /// Warm-up seconds of each probe.
    pub warmup: f64,
    /// Judged seconds of each probe.
    pub secs: f64,
    /// Most probes.
    pub probes: usize,
    /// The search ends once the lowest failing rate is within this factor of the highest
    /// rate that kept up.
    pub resolution: f64,
}

/// The next rate to probe, or `None` when the bracket is narrow enough: double until a probe
/// fails, halve until one keeps up, then bisect (geometrically) between the two.
pub fn next_rate(good: Option<f64>, bad: Option<f64>, resolution: f64) -> Option<f64> {
    match (good, bad) {
        (Some(g), None) => Some(g * 2.0),
        (None, Some(b)) => Some(b / 2.0),
        (Some(g), Some(b)) if b / g > resolution => Some((g * b).sqrt()),
        _ => None,
    }
}

/// Finds the highest rate at which the consumers keep up ([`keeps_up`]); the consumers must
/// be running. Reuses the suite's notion of keeping up: the same judgement as every
/// fixed-rate cell, over probes short enough that a search takes about a minute.
pub async fn search(addr: SocketAddr, live: &Arc<Live>, plan: SearchPlan) -> Search {
    let (mut good, mut bad) = (None::<f64>, None::<f64>);
    let mut rate = plan.start.max(100.0);
    let mut probes = Vec::new();
    for _ in 0..plan.probes {
        let p = probe(addr, live, rate, plan.warmup, plan.secs).await;
        eprintln!(
            "  probe {:>7.0} msg/s: pushed {:>7.0}, consumed {:>7.0}, backlog slope {:>7.0}/s: {}",
            p.offered,
            p.pushed,
            p.consumed,
            p.slope,
            if p.keeps_up {
                "keeps up"
            } else {
                "falls behind"
            }
        );
        if p.keeps_up {
            good = Some(good.map_or(rate, |g: f64| g.max(rate)));
        } else {
            bad = Some(bad.map_or(rate, |b: f64| b.min(rate)));
        }
        probes.push(p);
        drain(live, rate * 0.5, Duration::from_secs(30)).await;
        match next_rate(good, bad, plan.resolution) {
            Some(r) => rate = r,
            None => break,
        }
    }
    Search {
        rate: good.unwrap_or_else(|| {
            probes
                .iter()
                .map(|p| p.offered)
                .fold(f64::INFINITY, f64::min)
        }),
        probes,
    }
}

/// Runs a `queen1` cell on a started server: queue and partitions, consumers, the rate
/// search, then the suite's measured window at the rate found.
#[allow(clippy::too_many_arguments)]
pub async fn run_cell(
    addr: SocketAddr,
    pid: u32,
    url: &str,
    name: &'static str,
    system: String,
    encrypted: bool,
    start_rate: f64,
    opts: &Options,
    nodes: Vec<Node>,
) -> Result<Row, BoxError> {
    load::configure(addr, &queue_options(encrypted)).await?;
    let live = Arc::new(Live::default());
    // One message per partition creates them; those have no producer id and are not audited.
    let filled = load::fill(addr, PARTITIONS, 1, 4).await?;
    live.pushed.fetch_add(filled, Ordering::Relaxed);
    let consumers = consume(addr, live.clone());
    let smoke = opts.duration < Duration::from_secs(5);
    let plan = SearchPlan {
        start: start_rate,
        warmup: if smoke { 1.0 } else { 3.0 },
        secs: if smoke { 2.0 } else { 8.0 },
        probes: if smoke { 2 } else { 7 },
        resolution: 1.15,
    };
    eprintln!("  rate search from {:.0} msg/s", plan.start);
    let found = search(addr, &live, plan).await;
    let rate = found.rate;

    let (window, measuring) = start_window(url, Some(pid), name, opts, nodes).await?;
    let mut row = Row {
        cell: name.to_string(),
        system,
        window_s: window.secs(),
        ..Row::default()
    };
    let edges = {
        let live = live.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(window.start.into()).await;
            let _ = live.take();
            let _ = std::mem::replace(
                &mut *live.push_latency.lock().expect("not poisoned"),
                histogram(),
            );
            let a = (
                live.pushed.load(Ordering::Relaxed),
                live.consumed.load(Ordering::Relaxed),
                requests(&live),
                live.errors.load(Ordering::Relaxed),
            );
            tokio::time::sleep_until(window.end.into()).await;
            let b = (
                live.pushed.load(Ordering::Relaxed),
                live.consumed.load(Ordering::Relaxed),
                requests(&live),
                live.errors.load(Ordering::Relaxed),
            );
            let push = std::mem::replace(
                &mut *live.push_latency.lock().expect("not poisoned"),
                histogram(),
            );
            (a, b, live.take(), push)
        })
    };
    let sampler = tokio::spawn(sample_backlog(
        window,
        live.pushed.clone(),
        vec![live.consumed.clone()],
    ));
    produce(addr, live.clone(), rate, window.end).await;
    let (a, b, (e2e, pops, acks), push) = edges.await?;
    let samples = sampler.await?;
    stop(&live, consumers).await;

    let secs = window.secs();
    row.offered_per_sec = Some(rate);
    row.pushed_per_sec = Some((b.0 - a.0) as f64 / secs);
    row.msgs_per_sec = (b.1 - a.1) as f64 / secs;
    row.consumed_per_sec = Some(row.msgs_per_sec);
    row.errors = b.3 - a.3;
    // The request latency columns are the pushes'.
    row.p50_ms = quantile_ms(&push, 0.5);
    row.p99_ms = quantile_ms(&push, 0.99);
    row.e2e_p50_ms = quantile_ms(&e2e, 0.5);
    row.e2e_p99_ms = quantile_ms(&e2e, 0.99);
    row.pop_p99_ms = quantile_ms(&pops, 0.99);
    row.ack_p99_ms = quantile_ms(&acks, 0.99);
    set_backlog(&mut row, &samples, rate);
    let consumed_ok = row.msgs_per_sec >= 0.98 * row.pushed_per_sec.unwrap_or(0.0);
    row.keeps_up = row.keeps_up.map(|k| k && consumed_ok);
    let probes: Vec<String> = found
        .probes
        .iter()
        .map(|p| format!("{:.0}{}", p.offered, if p.keeps_up { "+" } else { "-" }))
        .collect();
    row.note = Some(format!(
        "rate = highest kept up in a search (probes {}; + kept up); {} B payloads, push {PUSH_BATCH}, \
         pop {POP_BATCH} over {POP_PARTITIONS} partitions, async acks; {} msgs/pop",
        probes.join(" "),
        PAYLOAD_BYTES,
        num_or_dash((b.1 - a.1) as f64 / (pops.len().max(1)) as f64),
    ));
    let measured = measuring.await?;
    set_usage(&mut row, &measured.usage, b.2 - a.2);
    set_nodes(&mut row, measured);
    Ok(row)
}

fn num_or_dash(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.0}")
    } else {
        "-".into()
    }
}

/// Current resident set size of a process, MiB.
pub fn rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_256_bytes_of_json_with_their_stamp() {
        for (t, n) in [
            (0, 0),
            (7, 1),
            (123_456_789_012, 9_999_999),
            (u64::MAX, u64::MAX),
        ] {
            let p = payload(t, n);
            assert_eq!(p.len(), PAYLOAD_BYTES, "{p}");
            let v: serde_json::Value = serde_json::from_str(&p).unwrap();
            assert_eq!(v["t"], t);
            assert_eq!(v["n"], n);
        }
        // Different messages, different bytes.
        assert_ne!(payload(1, 1)[20..], payload(1, 2)[20..]);
    }

    #[test]
    fn push_bodies_carry_a_transaction_id_per_message() {
        let body = push_body(7, 500, 3, 42);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let items = v["items"].as_array().unwrap();
        assert_eq!(items.len(), 3);
        assert_eq!(items[2]["transactionId"], "q1-502");
        assert_eq!(items[0]["partition"], "p7");
        assert_eq!(items[1]["payload"]["t"], 42);
        assert_eq!(message_number("q1-502"), Some(502));
        assert_eq!(message_number("x-1"), None);
    }

    /// The corpus compresses about 2:1 under zstd (level 3): every record once, as one
    /// stream, so that what is measured is the records' redundancy, not their repetition.
    /// (A single 256-byte payload compressed alone gains less, ~1.3x: the frame and the lack
    /// of context weigh on so few bytes.) Uses the `zstd` program when the machine has it.
    #[test]
    fn the_corpus_compresses_about_two_to_one() {
        use std::io::Write;
        let text: String = (0..CORPUS_LEN as u64)
            .map(|n| payload(1_700_000_000_000 + n * 997, n))
            .collect();
        let Ok(mut child) = std::process::Command::new("zstd")
            .args(["-3", "-c", "-q"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
        else {
            eprintln!("no zstd program: ratio not checked");
            return;
        };
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let ratio = text.len() as f64 / out.stdout.len() as f64;
        eprintln!("zstd ratio of the corpus {ratio:.2}");
        assert!((1.7..=2.6).contains(&ratio), "ratio {ratio:.2}");
    }

    #[test]
    fn the_audit_finds_lost_redelivered_and_phantom_messages() {
        let mut a = Audit::default();
        a.accept(0, 100);
        a.accept(200, 10);
        for n in 0..100 {
            a.deliver(n);
        }
        a.deliver(5);
        a.deliver(150);
        assert_eq!(a.accepted(), 110);
        assert_eq!(a.delivered(), 101);
        assert_eq!(a.lost(), 10);
        assert_eq!(a.redelivered, 1);
        assert_eq!(a.unaccepted(), 1);
    }

    #[test]
    fn the_search_doubles_halves_then_bisects() {
        assert_eq!(next_rate(Some(1000.0), None, 1.15), Some(2000.0));
        assert_eq!(next_rate(None, Some(1000.0), 1.15), Some(500.0));
        let mid = next_rate(Some(1000.0), Some(4000.0), 1.15).unwrap();
        assert!((mid - 2000.0).abs() < 1e-6);
        assert_eq!(next_rate(Some(1000.0), Some(1100.0), 1.15), None);
        assert!(keeps_up(1000.0, 990.0, 980.0, 10.0));
        assert!(!keeps_up(1000.0, 990.0, 900.0, 0.0));
        assert!(!keeps_up(1000.0, 990.0, 990.0, 50.0));
        assert!(!keeps_up(1000.0, 900.0, 900.0, 0.0));
    }

    #[test]
    fn the_cells_database_gets_queens_commit_settings() {
        let sql = database_sql("queen1_x");
        assert!(sql.contains("ALTER DATABASE \"queen1_x\" SET commit_delay = '200'"));
        assert!(sql.contains("synchronous_commit = 'on'"));
        let v: serde_json::Value = serde_json::from_str(&queue_options(true)).unwrap();
        assert_eq!(v["retentionSeconds"], 60);
        assert_eq!(v["encryptionEnabled"], true);
        assert_eq!(BENCH_KEY.len(), 64);
    }
}
