//! Load against Comb's HTTP API: producers (closed loop and fixed rate), consumers with
//! explicit acks, and the set-up pushes that create partitions and pre-fill queues.
//!
//! Closed loop: each of N connections sends its next request as soon as the previous one is
//! answered, which finds the highest rate the broker sustains at that concurrency. Fixed
//! rate (open loop): request `i` is due at `start + i / rate` whatever happened before, so a
//! slow broker shows up as a lower achieved rate and a growing backlog rather than as a
//! quietly lower offered load.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use hyper::Method;
use serde::Deserialize;

use crate::http::{Answer, BoxError, Conn};
use crate::stats::{Tally, Window, histogram, now_us};

/// The queue every cell uses (each cell has a database of its own).
pub const QUEUE: &str = "bench";

/// Filler that brings each payload to about 100 bytes of JSON.
const PAD: &str =
    "comb-benchmark-payload-padding-0123456789abcdefghijklmnopqrstuvwxyz-0123456789abcdef";

/// A payload: the send stamp (µs, see [`now_us`]) and padding.
pub fn payload(t_us: u64) -> String {
    format!("{{\"t\":{t_us},\"pad\":\"{PAD}\"}}")
}

/// A push body with one item per entry of `partitions`, all stamped `t_us`.
pub fn push_body(partitions: impl IntoIterator<Item = usize>, t_us: u64) -> Bytes {
    let mut s = String::with_capacity(160);
    s.push_str("{\"items\":[");
    for (k, p) in partitions.into_iter().enumerate() {
        if k > 0 {
            s.push(',');
        }
        let _ = write!(
            s,
            "{{\"queue\":\"{QUEUE}\",\"partition\":\"p{p}\",\"payload\":{{\"t\":{t_us},\"pad\":\"{PAD}\"}}}}"
        );
    }
    s.push_str("]}");
    Bytes::from(s)
}

/// Closed-loop producers: `conns` connections, each pushing `msgs` messages per request into
/// one partition chosen at random among `partitions`.
pub async fn closed_push(
    addr: SocketAddr,
    conns: usize,
    msgs: usize,
    partitions: usize,
    window: Window,
) -> Tally {
    let pushed = Arc::new(AtomicU64::new(0));
    closed_push_counted(addr, conns, msgs, partitions, window, pushed).await
}

/// [`closed_push`] that also counts every accepted message in `pushed` as it goes, for runs
/// that sample the backlog while the producers run.
pub async fn closed_push_counted(
    addr: SocketAddr,
    conns: usize,
    msgs: usize,
    partitions: usize,
    window: Window,
    pushed: Arc<AtomicU64>,
) -> Tally {
    let tasks: Vec<_> = (0..conns)
        .map(|_| {
            let pushed = pushed.clone();
            tokio::spawn(async move {
                let mut conn = Conn::new(addr);
                let mut tally = Tally::default();
                let _ = conn.open().await;
                let mut rng = fastrand::Rng::new();
                while Instant::now() < window.end {
                    let p = rng.usize(..partitions);
                    let body = push_body(std::iter::repeat_n(p, msgs), now_us());
                    let t0 = Instant::now();
                    let ok = matches!(
                        conn.send(Method::POST, "/api/v1/push", Some(body)).await,
                        Ok(a) if pushed_ok(a.status)
                    );
                    let t1 = Instant::now();
                    if !ok {
                        tally.errors += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                    pushed.fetch_add(msgs as u64, Ordering::Relaxed);
                    if window.contains(t1) {
                        tally.record(t1 - t0, msgs as u64);
                    }
                }
                tally
            })
        })
        .collect();
    merge(tasks).await
}

/// A fixed-rate producer's plan.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    /// Messages per second to offer.
    pub msgs_per_sec: f64,
    /// Messages per push request.
    pub msgs_per_req: usize,
    /// Connections that share the schedule.
    pub conns: usize,
    /// Partitions to spread requests over.
    pub partitions: usize,
}

/// Fixed-rate producers from now until `window.end`. `pushed` counts every message the
/// broker accepted (for the backlog trend); the tally counts requests inside the window.
pub async fn open_push(
    addr: SocketAddr,
    rate: Rate,
    window: Window,
    pushed: Arc<AtomicU64>,
) -> Tally {
    let start = Instant::now();
    let interval = rate.msgs_per_req as f64 / rate.msgs_per_sec;
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..rate.conns)
        .map(|_| {
            let next = next.clone();
            let pushed = pushed.clone();
            tokio::spawn(async move {
                let mut conn = Conn::new(addr);
                let _ = conn.open().await;
                let mut tally = Tally::default();
                let mut rng = fastrand::Rng::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let due = start + Duration::from_secs_f64(i as f64 * interval);
                    if due >= window.end {
                        break;
                    }
                    tokio::time::sleep_until(due.into()).await;
                    let p = rng.usize(..rate.partitions);
                    let body = push_body(std::iter::repeat_n(p, rate.msgs_per_req), now_us());
                    let t0 = Instant::now();
                    let ok = matches!(
                        conn.send(Method::POST, "/api/v1/push", Some(body)).await,
                        Ok(a) if pushed_ok(a.status)
                    );
                    let t1 = Instant::now();
                    if ok {
                        pushed.fetch_add(rate.msgs_per_req as u64, Ordering::Relaxed);
                        if window.contains(t1) {
                            tally.record(t1 - t0, rate.msgs_per_req as u64);
                        }
                    } else {
                        tally.errors += 1;
                    }
                }
                tally
            })
        })
        .collect();
    merge(tasks).await
}

/// A path no route serves: the broker answers it 404 without the database.
pub const UNSERVED_PATH: &str = "/api/v1/no-such-route";

/// Fixed-rate `GET`s of [`UNSERVED_PATH`] (`rate` a second over `conns` connections) until
/// `window.end`; a 404 answer is the one expected, anything else counts as an error.
pub async fn open_exchange(addr: SocketAddr, rate: f64, conns: usize, window: Window) -> Tally {
    let start = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..conns)
        .map(|_| {
            let next = next.clone();
            tokio::spawn(async move {
                let mut conn = Conn::new(addr);
                let _ = conn.open().await;
                let mut tally = Tally::default();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let due = start + Duration::from_secs_f64(i as f64 / rate);
                    if due >= window.end {
                        break;
                    }
                    tokio::time::sleep_until(due.into()).await;
                    let t0 = Instant::now();
                    let ok = matches!(
                        conn.send(Method::GET, UNSERVED_PATH, None).await,
                        Ok(a) if a.status == 404
                    );
                    let t1 = Instant::now();
                    if !ok {
                        tally.errors += 1;
                    } else if window.contains(t1) {
                        tally.record(t1 - t0, 1);
                    }
                }
                tally
            })
        })
        .collect();
    merge(tasks).await
}

/// How consumers pop.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    /// Consumer group (`None`: the queue mode group, competing consumers).
    pub group: Option<String>,
    /// Connections (each pops, then acks what it got, then pops again).
    pub conns: usize,
    /// Messages per partition of each pop (a pop asks for `batch` × `partitions` in all).
    pub batch: usize,
    /// `partitions` of each pop: how many partitions one pop may lease.
    pub partitions: usize,
}

/// What a set of consumers did.
#[derive(Debug)]
pub struct Consumed {
    /// Pop requests that returned messages, and the messages they returned.
    pub pops: Tally,
    /// Pops that found nothing (204).
    pub empty_pops: u64,
    /// Ack batch requests.
    pub acks: Tally,
    /// End-to-end delivery latency (push sent → pop answered) of messages in the window, µs.
    pub e2e: Histogram<u64>,
    /// When the last message inside the window arrived.
    pub last_delivery: Option<Instant>,
}

/// Whether a push was accepted: Comb answers 201, Queen 200 or 201.
fn pushed_ok(status: u16) -> bool {
    matches!(status, 200 | 201)
}

/// A pop's answer as the load reads it: what to ack and when each message was pushed.
#[derive(Deserialize)]
pub(crate) struct PopAnswer<'a> {
    /// Absent or empty when a server answers an empty pop with 200 (Queen may).
    #[serde(borrow, default)]
    pub(crate) messages: Vec<PopMessage<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PopMessage<'a> {
    pub(crate) transaction_id: &'a str,
    pub(crate) partition_id: &'a str,
    pub(crate) lease_id: Option<&'a str>,
    pub(crate) data: Stamp,
}

/// The push time a payload carries (`t`, µs).
#[derive(Deserialize)]
pub(crate) struct Stamp {
    pub(crate) t: u64,
}

/// Consumers with explicit acks until `window.end`: pop (long poll), note the delivery
/// latency of each message, ack the batch, repeat. `consumed` counts every delivered message.
pub async fn consume(
    addr: SocketAddr,
    spec: ConsumerSpec,
    window: Window,
    consumed: Arc<AtomicU64>,
) -> Consumed {
    let group_param = spec
        .group
        .as_ref()
        .map(|g| format!("&consumerGroup={g}"))
        .unwrap_or_default();
    // `batch` caps a pop over all its partitions (Queen's contract); the cells' batch is per
    // partition, so a pop of several partitions asks for that many times more.
    let pop_path: Arc<str> = format!(
        "/api/v1/pop/queue/{QUEUE}?batch={}&partitions={}&wait=true&timeout=500{group_param}",
        spec.batch * spec.partitions.max(1),
        spec.partitions
    )
    .into();
    let ack_group: Arc<str> = spec
        .group
        .as_ref()
        .map(|g| format!("\"consumerGroup\":\"{g}\","))
        .unwrap_or_default()
        .into();
    let tasks: Vec<_> = (0..spec.conns)
        .map(|_| {
            let consumed = consumed.clone();
            let pop_path = pop_path.clone();
            let ack_group = ack_group.clone();
            tokio::spawn(async move {
                let mut conn = Conn::new(addr);
                let _ = conn.open().await;
                let mut out = Consumed {
                    pops: Tally::default(),
                    empty_pops: 0,
                    acks: Tally::default(),
                    e2e: histogram(),
                    last_delivery: None,
                };
                while Instant::now() < window.end {
                    if let Err(e) = consume_once(
                        &mut conn, &pop_path, &ack_group, window, &consumed, &mut out,
                    )
                    .await
                    {
                        out.pops.errors += 1;
                        tracing_error(&e);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                out
            })
        })
        .collect();
    let mut all = Consumed {
        pops: Tally::default(),
        empty_pops: 0,
        acks: Tally::default(),
        e2e: histogram(),
        last_delivery: None,
    };
    for t in tasks {
        if let Ok(c) = t.await {
            all.pops.merge(&c.pops);
            all.acks.merge(&c.acks);
            all.empty_pops += c.empty_pops;
            all.e2e.add(&c.e2e).expect("same bounds");
            all.last_delivery = all.last_delivery.max(c.last_delivery);
        }
    }
    all
}

/// The streams query of the `streams` cell: its name and the group its runners read with.
const STREAM_QUERY: &str = "bench.window_count";

/// Registers the `streams` cell's query (reading [`QUEUE`], writing `bench-sums`); returns
/// its id.
pub async fn register_stream(addr: SocketAddr) -> Result<Arc<str>, BoxError> {
    let mut conn = Conn::new(addr);
    conn.open().await?;
    let body = serde_json::json!({"name": STREAM_QUERY, "source_queue": QUEUE,
                                  "sink_queue": "bench-sums", "config_hash": "bench", "reset": true});
    let answer = conn
        .send(
            Method::POST,
            "/streams/v1/queries",
            Some(Bytes::from(body.to_string())),
        )
        .await?;
    if answer.status != 200 {
        return Err(format!(
            "registering the streams query answered {}: {}",
            answer.status,
            String::from_utf8_lossy(&answer.body)
        )
        .into());
    }
    let v: serde_json::Value = serde_json::from_slice(&answer.body)?;
    Ok(v["query_id"].as_str().unwrap_or_default().into())
}

/// What streams runners did.
#[derive(Debug, Default, Clone)]
pub struct StreamsRun {
    /// Committed cycles.
    pub cycles: u64,
    /// Source messages acked by them.
    pub messages: u64,
    /// Windows pushed to the sink.
    pub emitted: u64,
    /// HTTP requests sent (pops, state reads, cycles).
    pub requests: u64,
    /// Failed requests.
    pub errors: u64,
}

/// Streams runners until `window.end`, as Queen's SDK runs a tumbling window: pop a batch
/// of one partition for the query's group, read the partition's state, count each message
/// into its one-second window (by its send stamp), and commit one cycle — the windows still
/// open as state upserts, the closed ones pushed to `bench-sums` and deleted, the batch
/// acked.
pub async fn run_streams(
    addr: SocketAddr,
    query: Arc<str>,
    runners: usize,
    batch: usize,
    window: Window,
) -> StreamsRun {
    let pop_path: Arc<str> = format!(
        "/api/v1/pop/queue/{QUEUE}?batch={batch}&wait=true&timeout=500&consumerGroup=streams.{STREAM_QUERY}"
    )
    .into();
    let tasks: Vec<_> = (0..runners)
        .map(|_| {
            let (query, pop_path) = (query.clone(), pop_path.clone());
            tokio::spawn(async move {
                let mut conn = Conn::new(addr);
                let _ = conn.open().await;
                let mut out = StreamsRun::default();
                while Instant::now() < window.end {
                    if let Err(e) = stream_cycle(&mut conn, &pop_path, &query, &mut out).await {
                        out.errors += 1;
                        tracing_error(&e);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                out
            })
        })
        .collect();
    let mut all = StreamsRun::default();
    for t in tasks {
        if let Ok(r) = t.await {
            all.cycles += r.cycles;
            all.messages += r.messages;
            all.emitted += r.emitted;
            all.requests += r.requests;
            all.errors += r.errors;
        }
    }
    all
}

async fn stream_cycle(
    conn: &mut Conn,
    pop_path: &str,
    query: &str,
    out: &mut StreamsRun,
) -> Result<(), BoxError> {
    use serde_json::{Value, json};
    out.requests += 1;
    let answer = conn.send(Method::GET, pop_path, None).await?;
    if !popped(&answer)? {
        return Ok(());
    }
    let got: PopAnswer = serde_json::from_slice(&answer.body)?;
    let Some(last) = got.messages.last() else {
        return Ok(());
    };
    let partition = last.partition_id;
    out.requests += 1;
    let read = conn
        .send(
            Method::POST,
            "/streams/v1/state/get",
            Some(Bytes::from(
                json!({"query_id": query, "partition_id": partition}).to_string(),
            )),
        )
        .await?;
    if read.status != 200 {
        return Err(format!("state/get answered {}", read.status).into());
    }
    let state: Value = serde_json::from_slice(&read.body)?;
    let mut windows: std::collections::BTreeMap<u64, u64> = state["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let second = r["key"].as_str()?.strip_prefix("w:")?.parse().ok()?;
            Some((second, r["value"]["n"].as_u64()?))
        })
        .collect();
    let mut newest = 0;
    for m in &got.messages {
        let second = m.data.t / 1_000_000;
        newest = newest.max(second);
        *windows.entry(second).or_default() += 1;
    }
    let mut ops = Vec::new();
    let mut items = Vec::new();
    for (second, n) in windows {
        let key = format!("w:{second}");
        if second < newest {
            ops.push(json!({"type": "delete", "key": key}));
            items.push(json!({"queue": "bench-sums", "partition": partition,
                              "payload": {"second": second, "n": n}}));
        } else {
            ops.push(json!({"type": "upsert", "key": key, "value": {"n": n}}));
        }
    }
    let emitted = items.len() as u64;
    let body = json!({
        "query_id": query, "partition_id": partition,
        "consumer_group": format!("streams.{STREAM_QUERY}"),
        "state_ops": ops, "push_items": items,
        "ack": {"transactionId": last.transaction_id, "leaseId": last.lease_id,
                "status": "completed", "count": got.messages.len()},
    });
    out.requests += 1;
    let done = conn
        .send(
            Method::POST,
            "/streams/v1/cycle",
            Some(Bytes::from(body.to_string())),
        )
        .await?;
    if done.status != 200 {
        return Err(format!(
            "cycle answered {}: {}",
            done.status,
            String::from_utf8_lossy(&done.body)
        )
        .into());
    }
    out.cycles += 1;
    out.messages += got.messages.len() as u64;
    out.emitted += emitted;
    Ok(())
}

/// Prints the first few consumer errors: they mean the cell's numbers are suspect.
fn tracing_error(e: &BoxError) {
    static SHOWN: AtomicU64 = AtomicU64::new(0);
    if SHOWN.fetch_add(1, Ordering::Relaxed) < 5 {
        eprintln!("  consumer error: {e}");
    }
}

async fn consume_once(
    conn: &mut Conn,
    pop_path: &str,
    ack_group: &str,
    window: Window,
    consumed: &AtomicU64,
    out: &mut Consumed,
) -> Result<(), BoxError> {
    let t0 = Instant::now();
    let answer = conn.send(Method::GET, pop_path, None).await?;
    let t1 = Instant::now();
    if !popped(&answer)? {
        out.empty_pops += 1;
        return Ok(());
    }
    let got: PopAnswer = serde_json::from_slice(&answer.body)?;
    if got.messages.is_empty() {
        out.empty_pops += 1;
        return Ok(());
    }
    let n = got.messages.len() as u64;
    consumed.fetch_add(n, Ordering::Relaxed);
    let now = now_us();
    if window.contains(t1) {
        out.pops.record(t1 - t0, n);
        out.last_delivery = Some(t1);
        for m in &got.messages {
            out.e2e
                .saturating_record(now.saturating_sub(m.data.t).max(1));
        }
    }
    let body = ack_body(ack_group, &got.messages);
    let t2 = Instant::now();
    let answer = conn
        .send(Method::POST, "/api/v1/ack/batch", Some(body))
        .await?;
    let t3 = Instant::now();
    if let Err(e) = acked(&answer) {
        out.acks.errors += 1;
        return Err(e);
    }
    if window.contains(t3) {
        out.acks.record(t3 - t2, n);
    }
    Ok(())
}

/// Whether a pop's answer carries messages (200) or found none (204); any other status is an
/// error.
fn popped(answer: &Answer) -> Result<bool, BoxError> {
    match answer.status {
        204 => Ok(false),
        200 => Ok(true),
        s => Err(format!(
            "pop answered {s}: {}",
            String::from_utf8_lossy(&answer.body)
        )
        .into()),
    }
}

/// The body of an ack batch completing `messages`; `ack_group` is empty or the
/// `"consumerGroup":…,` member.
pub(crate) fn ack_body(ack_group: &str, messages: &[PopMessage]) -> Bytes {
    let mut body = String::with_capacity(40 + messages.len() * 160);
    let _ = write!(body, "{{{ack_group}\"acknowledgments\":[");
    for (k, m) in messages.iter().enumerate() {
        if k > 0 {
            body.push(',');
        }
        let _ = write!(
            body,
            "{{\"transactionId\":\"{}\",\"partitionId\":\"{}\",\"status\":\"completed\"",
            m.transaction_id, m.partition_id
        );
        if let Some(l) = m.lease_id {
            let _ = write!(body, ",\"leaseId\":\"{l}\"");
        }
        body.push('}');
    }
    body.push_str("]}");
    Bytes::from(body)
}

/// An ack batch's answer: anything but 200 is an error.
fn acked(answer: &Answer) -> Result<(), BoxError> {
    if answer.status == 200 {
        return Ok(());
    }
    Err(format!(
        "ack answered {}: {}",
        answer.status,
        String::from_utf8_lossy(&answer.body)
    )
    .into())
}

/// An explicit-ack consumer of the queue mode group until `end` that keeps its counts where a
/// sampler can read them while it runs (long runs report every few seconds, not once at the
/// end): each delivered message adds to `delivered` and its end-to-end latency to `e2e`, which
/// the sampler empties each interval; failed requests add to `errors`.
pub async fn consume_live(
    addr: SocketAddr,
    batch: usize,
    end: Instant,
    delivered: Arc<AtomicU64>,
    e2e: Arc<Mutex<Histogram<u64>>>,
    errors: Arc<AtomicU64>,
) {
    let pop_path = format!("/api/v1/pop/queue/{QUEUE}?batch={batch}&wait=true&timeout=500");
    let mut conn = Conn::new(addr);
    let _ = conn.open().await;
    while Instant::now() < end {
        if let Err(e) = deliver_once(&mut conn, &pop_path, &delivered, &e2e).await {
            if errors.fetch_add(1, Ordering::Relaxed) < 5 {
                eprintln!("  comb consumer error: {e}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn deliver_once(
    conn: &mut Conn,
    pop_path: &str,
    delivered: &AtomicU64,
    e2e: &Mutex<Histogram<u64>>,
) -> Result<(), BoxError> {
    let answer = conn.send(Method::GET, pop_path, None).await?;
    if !popped(&answer)? {
        return Ok(());
    }
    let got: PopAnswer = serde_json::from_slice(&answer.body)?;
    if got.messages.is_empty() {
        return Ok(());
    }
    let now = now_us();
    {
        let mut h = e2e.lock().expect("not poisoned");
        for m in &got.messages {
            h.saturating_record(now.saturating_sub(m.data.t).max(1));
        }
    }
    delivered.fetch_add(got.messages.len() as u64, Ordering::Relaxed);
    let answer = conn
        .send(
            Method::POST,
            "/api/v1/ack/batch",
            Some(ack_body("", &got.messages)),
        )
        .await?;
    acked(&answer)
}

/// Pushes `rounds` messages into each of `partitions` partitions (1,000 items a request,
/// over a few connections): creates the partitions before a cell, or pre-fills a queue.
pub async fn fill(
    addr: SocketAddr,
    partitions: usize,
    rounds: usize,
    conns: usize,
) -> Result<u64, BoxError> {
    fill_in(addr, partitions, rounds, conns, Order::Interleaved).await
}

/// How [`fill_in`] spreads its messages over the requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Message k to partition k mod `partitions`: a request writes up to 1,000 partitions.
    Interleaved,
    /// A partition's `rounds` messages one after another: a request writes as few
    /// partitions as it can. On Citus a request then writes one shard rather than all of
    /// them, in one phase rather than two.
    ByPartition,
}

/// [`fill`], in the given order.
pub async fn fill_in(
    addr: SocketAddr,
    partitions: usize,
    rounds: usize,
    conns: usize,
    order: Order,
) -> Result<u64, BoxError> {
    const PER_REQUEST: usize = 1_000;
    let total = partitions * rounds;
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..conns.max(1))
        .map(|_| {
            let next = next.clone();
            tokio::spawn(async move {
                let mut conn = Conn::new(addr);
                let mut sent = 0u64;
                loop {
                    let from = next.fetch_add(PER_REQUEST as u64, Ordering::Relaxed) as usize;
                    if from >= total {
                        return Ok::<u64, BoxError>(sent);
                    }
                    let to = (from + PER_REQUEST).min(total);
                    let of = |k: usize| match order {
                        Order::Interleaved => k % partitions,
                        Order::ByPartition => k / rounds.max(1),
                    };
                    let body = push_body((from..to).map(of), now_us());
                    let a = conn.send(Method::POST, "/api/v1/push", Some(body)).await?;
                    if !pushed_ok(a.status) {
                        return Err(format!(
                            "set-up push answered {}: {}",
                            a.status,
                            String::from_utf8_lossy(&a.body)
                        )
                        .into());
                    }
                    sent += (to - from) as u64;
                }
            })
        })
        .collect();
    let mut sent = 0;
    for t in tasks {
        sent += t.await??;
    }
    Ok(sent)
}

/// Creates the queue and subscribes `groups` before any partition exists, so that every
/// group gets a cursor in every partition from its first message on.
pub async fn subscribe(addr: SocketAddr, groups: &[String]) -> Result<(), BoxError> {
    configure(addr, "{}").await?;
    let mut conn = Conn::new(addr);
    for g in groups {
        let path = format!("/api/v1/pop/queue/{QUEUE}?consumerGroup={g}");
        let a = conn.send(Method::GET, &path, None).await?;
        if !matches!(a.status, 200 | 204) {
            return Err(format!("subscribing pop answered {}", a.status).into());
        }
    }
    Ok(())
}

/// What idle long-polling consumers did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Polled {
    /// Pops answered (empty or not).
    pub requests: u64,
    /// Pops that returned messages (none are pushed: should stay 0).
    pub deliveries: u64,
    /// Pops that failed.
    pub errors: u64,
}

/// `conns` consumers long-polling `path` (a pop with `wait=true`) until `end`, each pop
/// cut off at `end` rather than waited out, so a long `timeout` does not stretch the cell.
pub async fn long_poll_until(addr: SocketAddr, path: String, conns: usize, end: Instant) -> Polled {
    let path: Arc<str> = path.into();
    let tasks: Vec<_> = (0..conns)
        .map(|_| {
            let path = path.clone();
            tokio::spawn(async move {
                let mut out = Polled::default();
                let mut conn = Conn::new(addr);
                let _ = conn.open().await;
                let polling = async {
                    loop {
                        match conn.send(Method::GET, &path, None).await {
                            Ok(a) if a.status == 200 => {
                                out.requests += 1;
                                out.deliveries += 1;
                            }
                            Ok(a) if a.status == 204 => out.requests += 1,
                            _ => {
                                out.errors += 1;
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        }
                    }
                };
                let _ = tokio::time::timeout_at(end.into(), polling).await;
                out
            })
        })
        .collect();
    let mut all = Polled::default();
    for t in tasks {
        if let Ok(p) = t.await {
            all.requests += p.requests;
            all.deliveries += p.deliveries;
            all.errors += p.errors;
        }
    }
    all
}

/// Creates the queue with `options` (a JSON object of queue options) before any partition
/// exists, so that every message of the run is stored under them.
pub async fn configure(addr: SocketAddr, options: &str) -> Result<(), BoxError> {
    configure_queue(addr, QUEUE, options).await
}

/// [`configure`] for a queue named `queue`.
pub async fn configure_queue(addr: SocketAddr, queue: &str, options: &str) -> Result<(), BoxError> {
    let mut conn = Conn::new(addr);
    let body = Bytes::from(format!("{{\"queue\":\"{queue}\",\"options\":{options}}}"));
    let a = conn
        .send(Method::POST, "/api/v1/configure", Some(body))
        .await?;
    if !matches!(a.status, 200 | 201) {
        return Err(format!(
            "configure answered {}: {}",
            a.status,
            String::from_utf8_lossy(&a.body)
        )
        .into());
    }
    Ok(())
}

async fn merge(tasks: Vec<tokio::task::JoinHandle<Tally>>) -> Tally {
    let mut all = Tally::default();
    for t in tasks {
        if let Ok(t) = t.await {
            all.merge(&t);
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_bodies_are_valid_json() {
        let body = push_body([3, 3, 7], 42);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let items = v["items"].as_array().unwrap();
        assert_eq!(items.len(), 3);
        assert_eq!(items[2]["partition"], "p7");
        assert_eq!(items[0]["queue"], QUEUE);
        assert_eq!(items[0]["payload"]["t"], 42);
        let p = payload(42);
        assert_eq!(
            items[1]["payload"],
            serde_json::from_str::<serde_json::Value>(&p).unwrap()
        );
        assert!((90..=110).contains(&p.len()), "{}", p.len());
    }

    #[test]
    fn pop_answers_parse() {
        let body = r#"{"success":true,"queue":"bench","partition":"p1","partitionId":"x",
            "leaseId":"l","consumerGroup":"g","partitionsClaimed":1,
            "messages":[{"id":"i","transactionId":"tx","traceId":null,
            "data":{"t":17,"pad":"zz"},"createdAt":"2026-01-01T00:00:00.000Z",
            "partitionId":"pid","partition":"p1","leaseId":"lid","consumerGroup":"g","attempt":1}]}"#;
        let a: PopAnswer = serde_json::from_str(body).unwrap();
        assert_eq!(a.messages.len(), 1);
        let m = &a.messages[0];
        assert_eq!(
            (m.transaction_id, m.partition_id, m.lease_id, m.data.t),
            ("tx", "pid", Some("lid"), 17)
        );
    }

    #[test]
    fn queens_answers_are_tolerated() {
        assert!(pushed_ok(200) && pushed_ok(201));
        assert!(!pushed_ok(204) && !pushed_ok(500));
        // An empty pop answered 200, with an empty list or none at all.
        for body in [r#"{"messages":[]}"#, r#"{"success":true}"#] {
            let a: PopAnswer = serde_json::from_str(body).unwrap();
            assert!(a.messages.is_empty());
        }
        let answer = |status| Answer {
            status,
            body: Bytes::new(),
        };
        assert!(!popped(&answer(204)).unwrap());
        assert!(popped(&answer(200)).unwrap());
        assert!(popped(&answer(500)).is_err());
    }

    /// A server answering every request on every connection with `status` and no body.
    async fn answering(status: u16) -> SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = socket.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buf[..n]);
                        while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            seen.drain(..end + 4);
                            let answer =
                                format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n");
                            if socket.write_all(answer.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn exchanges_count_the_404_they_expect_and_nothing_else() {
        let window = || Window::after(Duration::ZERO, Duration::from_millis(300));
        let expected = open_exchange(answering(404).await, 200.0, 2, window()).await;
        assert!(expected.requests > 0);
        assert_eq!(expected.errors, 0);
        let served = open_exchange(answering(200).await, 200.0, 2, window()).await;
        assert_eq!(served.requests, 0);
        assert!(served.errors > 0);
    }

    #[test]
    fn ack_bodies_are_valid_json() {
        let m = |lease| PopMessage {
            transaction_id: "tx",
            partition_id: "pid",
            lease_id: lease,
            data: Stamp { t: 1 },
        };
        let body = ack_body("\"consumerGroup\":\"g\",", &[m(Some("l")), m(None)]);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["consumerGroup"], "g");
        let acks = v["acknowledgments"].as_array().unwrap();
        assert_eq!(acks[0]["leaseId"], "l");
        assert_eq!(acks[1]["status"], "completed");
        assert!(acks[1].get("leaseId").is_none());
        let plain: serde_json::Value = serde_json::from_slice(&ack_body("", &[m(None)])).unwrap();
        assert_eq!(plain["acknowledgments"][0]["transactionId"], "tx");
    }
}
