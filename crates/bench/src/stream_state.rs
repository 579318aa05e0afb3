//! The `streams-state10`, `streams-state10k` and `streams-state10k-hot` cells: what one
//! streams cycle costs by the size of the state it changes.
//!
//! Each partition's state is built to `keys` keys first (set-up, outside the window); then
//! cycles come at a fixed rate, each upserting `changed` keys of one partition's state: the
//! next keys in turn, so that with 10,000 keys every cycle changes keys no recent cycle
//! touched, or in the `-hot` cell the same `changed` keys every time, so that every other
//! key stays as set up (the case where maintenance carries the most unchanged keys). The cycles carry no ack: what is measured is the state's part of a cycle, which
//! is the part that could grow with the state (a cycle's ack and sink pushes do not depend on
//! it). A cycle is the cell's "message": WAL and all-in CPU per message are per cycle, and the
//! check [`check`] divides the 10,000-key cell's by the 10-key cell's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::Method;
use serde_json::{Value, json};

use crate::http::{BoxError, Conn};
use crate::load::{self, QUEUE};
use crate::report::{Check, Row, Verdict};
use crate::stats::{Tally, Window};

/// What a state cell does.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// Keys of each partition's state.
    pub keys: usize,
    /// Keys each cycle upserts.
    pub changed: usize,
    /// Partitions (each with its own state).
    pub partitions: usize,
    /// Cycles per second, fixed.
    pub rate: f64,
    /// Connections that share the schedule.
    pub conns: usize,
    /// Whether every cycle changes the same keys (else the next ones in turn).
    pub hot: bool,
}

/// The cell with the small state, and the one with the large.
pub const SMALL: &str = "streams-state10";
/// See [`SMALL`].
pub const LARGE: &str = "streams-state10k";
/// The large state whose cycles change the same 10 keys every time.
pub const LARGE_HOT: &str = "streams-state10k-hot";

/// The two cells' specs: the same load over 10 and 10,000 keys of state per partition.
pub fn spec(keys: usize) -> Spec {
    Spec {
        keys,
        changed: 10,
        partitions: 4,
        rate: 200.0,
        conns: 4,
        hot: false,
    }
}

/// [`LARGE`] with every cycle changing the same keys.
pub fn spec_hot(keys: usize) -> Spec {
    Spec {
        hot: true,
        ..spec(keys)
    }
}

/// The group the cycles name; nothing pops with it, so no lease ever holds a partition.
const GROUP: &str = "streams.bench.window_count";

/// Keys a set-up cycle upserts at once.
const SETUP_KEYS_PER_CYCLE: usize = 1_000;

/// The query and the source partitions whose states the cycles change.
#[derive(Debug, Clone)]
pub struct Prepared {
    query: Arc<str>,
    partitions: Arc<[String]>,
}

/// Set-up: one message in each partition of [`QUEUE`] (so they exist), the query, the
/// partitions' ids (popped with a group of their own), and every partition's state built to
/// `spec.keys` keys.
pub async fn prepare(addr: SocketAddr, spec: &Spec) -> Result<Prepared, BoxError> {
    load::fill(addr, spec.partitions, 1, 1).await?;
    let query = load::register_stream(addr).await?;
    let mut conn = Conn::new(addr);
    conn.open().await?;
    let mut partitions: Vec<String> = Vec::new();
    let pop = format!("/api/v1/pop/queue/{QUEUE}?batch=1&wait=false&consumerGroup=bench-ids");
    for _ in 0..spec.partitions * 4 {
        if partitions.len() == spec.partitions {
            break;
        }
        let a = conn.send(Method::GET, &pop, None).await?;
        if a.status != 200 {
            continue;
        }
        let v: Value = serde_json::from_slice(&a.body)?;
        if let Some(id) = v["messages"][0]["partitionId"].as_str()
            && !partitions.iter().any(|p| p == id)
        {
            partitions.push(id.to_string());
        }
    }
    if partitions.len() != spec.partitions {
        return Err(format!(
            "found {} of {} partitions' ids",
            partitions.len(),
            spec.partitions
        )
        .into());
    }
    for p in &partitions {
        let mut built = 0;
        while built < spec.keys {
            let n = (spec.keys - built).min(SETUP_KEYS_PER_CYCLE);
            let ops: Vec<Value> = (built..built + n).map(|k| upsert(k, 0)).collect();
            cycle(&mut conn, &query, p, ops).await?;
            built += n;
        }
    }
    Ok(Prepared {
        query,
        partitions: partitions.into(),
    })
}

/// A state upsert of key number `k`, shaped as Queen's SDK writes an open window's
/// accumulator.
fn upsert(k: usize, v: u64) -> Value {
    json!({"type": "upsert", "key": format!("tumb:1\u{1f}2026-11-29T00:00:00.000Z\u{1f}k{k:05}"),
           "value": {"acc": {"count": v, "sum": v * 3},
                     "windowStart": 1_795_910_400_000u64, "windowEnd": 1_795_910_401_000u64}})
}

/// Sends one cycle of `ops` without an ack; an answer other than 200 is an error.
async fn cycle(
    conn: &mut Conn,
    query: &str,
    partition: &str,
    ops: Vec<Value>,
) -> Result<(), BoxError> {
    let body = json!({"query_id": query, "partition_id": partition, "consumer_group": GROUP,
                      "state_ops": ops});
    let a = conn
        .send(
            Method::POST,
            "/streams/v1/cycle",
            Some(Bytes::from(body.to_string())),
        )
        .await?;
    if a.status != 200 {
        return Err(format!(
            "cycle answered {}: {}",
            a.status,
            String::from_utf8_lossy(&a.body)
        )
        .into());
    }
    Ok(())
}

/// Cycles at `spec.rate` until `window.end`; cycle `i` changes partition `i mod P`'s next
/// `spec.changed` keys. Counts the cycles answered inside the window.
pub async fn run(addr: SocketAddr, spec: &Spec, prepared: Prepared, window: Window) -> Tally {
    let start = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..spec.conns)
        .map(|_| {
            let (next, prepared, spec) = (next.clone(), prepared.clone(), spec.clone());
            tokio::spawn(async move {
                let mut conn = Conn::new(addr);
                let _ = conn.open().await;
                let mut tally = Tally::default();
                let parts = prepared.partitions.len();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let due = start + Duration::from_secs_f64(i as f64 / spec.rate);
                    if due >= window.end {
                        break;
                    }
                    tokio::time::sleep_until(due.into()).await;
                    let round = i / parts;
                    let first = if spec.hot { 0 } else { round * spec.changed };
                    let ops = (first..first + spec.changed)
                        .map(|k| upsert(k % spec.keys, round as u64 + 1))
                        .collect();
                    let t0 = Instant::now();
                    let ok = cycle(
                        &mut conn,
                        &prepared.query,
                        &prepared.partitions[i % parts],
                        ops,
                    )
                    .await;
                    let t1 = Instant::now();
                    match ok {
                        Ok(()) if window.contains(t1) => tally.record(t1 - t0, 1),
                        Ok(()) => {}
                        Err(e) => {
                            if tally.errors == 0 {
                                eprintln!("  cycle error: {e}");
                            }
                            tally.errors += 1;
                        }
                    }
                }
                tally
            })
        })
        .collect();
    let mut all = Tally::default();
    for t in tasks {
        if let Ok(t) = t.await {
            all.merge(&t);
        }
    }
    all
}

/// The row's note: what a "message" is here.
pub fn note(spec: &Spec) -> String {
    format!(
        "msg = cycle of {} upserts ({}) into a state of {} keys per partition ({} partitions), \
         no ack; WAL/CPU per msg = per cycle",
        spec.changed,
        if spec.hot {
            "the same keys"
        } else {
            "next keys in turn"
        },
        spec.keys,
        spec.partitions
    )
}

/// The target: a cycle over 10,000 keys of state costs at most 1.5 times what one over 10
/// keys does, in WAL and in all-in CPU alike; judged for each large cell that ran
/// ([`LARGE`], [`LARGE_HOT`]) against [`SMALL`].
pub fn check(rows: &[Row]) -> Check {
    let get = |name: &str| rows.iter().find(|r| r.cell == name && r.system == "comb");
    let mut measured = Vec::new();
    let mut verdicts = Vec::new();
    for large in [LARGE, LARGE_HOT] {
        let Some((s, l)) = get(SMALL).zip(get(large)) else {
            continue;
        };
        let ratio = |f: fn(&Row) -> Option<f64>| f(l).zip(f(s)).map(|(l, s)| l / s);
        let (Some(w), Some(c)) = (
            ratio(|r| r.pg_wal_bytes_per_msg),
            ratio(|r| r.all_in_cpu_us_per_msg),
        ) else {
            continue;
        };
        let prefix = if large == LARGE { "" } else { "hot keys: " };
        measured.push(format!(
            "{prefix}WAL {w:.2}x ({:.0} vs {:.0} B/cycle), CPU {c:.2}x ({:.0} vs {:.0} us/cycle)",
            l.pg_wal_bytes_per_msg.unwrap_or(0.0),
            s.pg_wal_bytes_per_msg.unwrap_or(0.0),
            l.all_in_cpu_us_per_msg.unwrap_or(0.0),
            s.all_in_cpu_us_per_msg.unwrap_or(0.0),
        ));
        verdicts.push(w <= 1.5 && c <= 1.5);
    }
    Check {
        target: "streams cycle over 10,000 keys of state <= 1.5x one over 10 keys (WAL and CPU)",
        measured: measured.join("; "),
        verdict: Verdict::from((!verdicts.is_empty()).then(|| verdicts.iter().all(|&v| v))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cell: &str, wal: f64, cpu: f64) -> Row {
        Row {
            cell: cell.into(),
            system: "comb".into(),
            pg_wal_bytes_per_msg: Some(wal),
            all_in_cpu_us_per_msg: Some(cpu),
            ..Row::default()
        }
    }

    #[test]
    fn the_check_divides_the_large_state_by_the_small() {
        let rows = [row(SMALL, 4000.0, 1000.0), row(LARGE, 5000.0, 1400.0)];
        let c = check(&rows);
        assert_eq!(c.verdict, Verdict::Met);
        assert!(c.measured.starts_with("WAL 1.25x"), "{}", c.measured);
        let rows = [row(SMALL, 4000.0, 1000.0), row(LARGE, 5000.0, 1600.0)];
        assert_eq!(check(&rows).verdict, Verdict::Missed);
        assert_eq!(check(&rows[..1]).verdict, Verdict::NotRun);
        // The hot-key cell is judged too, alone or beside the other.
        let rows = [row(SMALL, 4000.0, 1000.0), row(LARGE_HOT, 6400.0, 1000.0)];
        let c = check(&rows);
        assert_eq!(c.verdict, Verdict::Missed);
        assert!(
            c.measured.starts_with("hot keys: WAL 1.60x"),
            "{}",
            c.measured
        );
        let rows = [
            row(SMALL, 4000.0, 1000.0),
            row(LARGE, 5000.0, 1000.0),
            row(LARGE_HOT, 5200.0, 1100.0),
        ];
        assert_eq!(check(&rows).verdict, Verdict::Met);
    }
}
