//! The peers Comb is measured against, on the same PostgreSQL in the same run.
//!
//! * **Ceiling**: Comb's own message rows written straight into `comb.messages` with binary
//!   `COPY`, 1,000 rows per statement (each its own durable transaction) over a few
//!   connections. No queue can store these rows faster through SQL, so this is the
//!   database's limit for this payload on this machine.
//! * **SKIP LOCKED**: the classic single-table queue: one `INSERT` per transaction to
//!   enqueue, `DELETE … WHERE id = (SELECT … ORDER BY time FOR UPDATE SKIP LOCKED LIMIT 1)
//!   RETURNING` to dequeue.

use std::time::{Duration, Instant, SystemTime};

use futures_util::pin_mut;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls};
use uuid::Uuid;

use crate::http::BoxError;
use crate::load::payload;
use crate::stats::{Tally, Window, histogram, now_us};

/// Connects one tokio-postgres client, driving its connection on a task of its own.
pub async fn connect(url: &str) -> Result<Client, BoxError> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

const COPY_SQL: &str = "COPY comb.messages \
    (partition_id, pos, seg, message_id, transaction_id, trace_id, payload, created_at) \
    FROM STDIN (FORMAT binary)";

/// The ceiling: `conns` connections, each copying batches of `batch` rows until the window
/// ends. Rows are shaped like Comb's (same table, indexes and payload); each connection
/// writes its own partitions so positions never collide. One request = one `COPY`.
pub async fn ceiling(
    url: &str,
    conns: usize,
    batch: usize,
    partitions_per_conn: usize,
    window: Window,
) -> Result<Tally, BoxError> {
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let client = connect(url).await?;
        tasks.push(tokio::spawn(async move {
            let parts: Vec<Uuid> = (0..partitions_per_conn).map(|_| Uuid::now_v7()).collect();
            let mut pos = vec![0i64; parts.len()];
            let mut tally = Tally::default();
            let mut k = 0usize;
            while Instant::now() < window.end {
                let t0 = Instant::now();
                match copy_batch(&client, &parts, &mut pos, &mut k, batch).await {
                    Ok(()) => {
                        let t1 = Instant::now();
                        if window.contains(t1) {
                            tally.record(t1 - t0, batch as u64);
                        }
                    }
                    Err(e) => {
                        tally.errors += 1;
                        eprintln!("  ceiling copy failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            tally
        }));
    }
    let mut all = Tally::default();
    for t in tasks {
        all.merge(&t.await?);
    }
    Ok(all)
}

async fn copy_batch(
    client: &Client,
    parts: &[Uuid],
    pos: &mut [i64],
    k: &mut usize,
    batch: usize,
) -> Result<(), BoxError> {
    let sink = client.copy_in(COPY_SQL).await?;
    let writer = BinaryCopyInWriter::new(
        sink,
        &[
            Type::UUID,
            Type::INT8,
            Type::INT4,
            Type::UUID,
            Type::TEXT,
            Type::TEXT,
            Type::BYTEA,
            Type::TIMESTAMPTZ,
        ],
    );
    pin_mut!(writer);
    let now = SystemTime::now();
    let seg = 1i32;
    let trace: Option<&str> = None;
    for _ in 0..batch {
        let p = *k % parts.len();
        *k += 1;
        pos[p] += 1;
        let message_id = Uuid::now_v7();
        let txid = message_id.to_string();
        let body = payload(now_us()).into_bytes();
        let row: [&(dyn ToSql + Sync); 8] = [
            &parts[p],
            &pos[p],
            &seg,
            &message_id,
            &txid,
            &trace,
            &body,
            &now,
        ];
        writer.as_mut().write(&row).await?;
    }
    writer.finish().await?;
    Ok(())
}

/// The classic queue table, with the index its dequeue query needs.
pub const SKIP_LOCKED_SCHEMA: &str = "
CREATE TABLE sl_queue (
    id      bigserial PRIMARY KEY,
    time    timestamptz NOT NULL DEFAULT now(),
    payload jsonb NOT NULL
);
CREATE INDEX sl_queue_time ON sl_queue (time);";

/// One message into the SKIP LOCKED queue (its payload as text).
pub const ENQUEUE_SQL: &str = "INSERT INTO sl_queue (payload) VALUES ($1::text::jsonb)";

/// One message out of the SKIP LOCKED queue, in one transaction; returns its send time (µs).
pub const DEQUEUE_SQL: &str = "DELETE FROM sl_queue WHERE id = (
    SELECT id FROM sl_queue ORDER BY time FOR UPDATE SKIP LOCKED LIMIT 1
) RETURNING (payload->>'t')::int8";

/// What the SKIP LOCKED queue did in a cell.
pub struct SkipLocked {
    /// Enqueue transactions (one row each).
    pub enqueued: Tally,
    /// Dequeue transactions that returned a row.
    pub dequeued: Tally,
    /// Dequeues that found the queue empty.
    pub empty: u64,
    /// Enqueue → dequeue latency of rows dequeued in the window, µs.
    pub e2e: hdrhistogram::Histogram<u64>,
}

/// `enq` connections inserting one row per transaction and `deq` connections deleting one
/// row per transaction, closed loop, until the window ends. A dequeuer that finds the queue
/// empty polls again after 1 ms, as such workers do.
pub async fn skip_locked(
    url: &str,
    enq: usize,
    deq: usize,
    window: Window,
) -> Result<SkipLocked, BoxError> {
    let mut enqs = Vec::new();
    for _ in 0..enq {
        let client = connect(url).await?;
        enqs.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let Ok(stmt) = client.prepare(ENQUEUE_SQL).await else {
                tally.errors += 1;
                return tally;
            };
            while Instant::now() < window.end {
                let body = payload(now_us());
                let t0 = Instant::now();
                match client.execute(&stmt, &[&body]).await {
                    Ok(_) => {
                        let t1 = Instant::now();
                        if window.contains(t1) {
                            tally.record(t1 - t0, 1);
                        }
                    }
                    Err(_) => tally.errors += 1,
                }
            }
            tally
        }));
    }
    let mut deqs = Vec::new();
    for _ in 0..deq {
        let client = connect(url).await?;
        deqs.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let mut e2e = histogram();
            let mut empty = 0u64;
            let Ok(stmt) = client.prepare(DEQUEUE_SQL).await else {
                tally.errors += 1;
                return (tally, e2e, empty);
            };
            while Instant::now() < window.end {
                let t0 = Instant::now();
                match client.query_opt(&stmt, &[]).await {
                    Ok(Some(row)) => {
                        let t1 = Instant::now();
                        if window.contains(t1) {
                            tally.record(t1 - t0, 1);
                            let sent: i64 = row.get(0);
                            e2e.saturating_record(now_us().saturating_sub(sent as u64).max(1));
                        }
                    }
                    Ok(None) => {
                        empty += 1;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Err(_) => tally.errors += 1,
                }
            }
            (tally, e2e, empty)
        }));
    }
    let mut out = SkipLocked {
        enqueued: Tally::default(),
        dequeued: Tally::default(),
        empty: 0,
        e2e: histogram(),
    };
    for t in enqs {
        out.enqueued.merge(&t.await?);
    }
    for t in deqs {
        let (tally, e2e, empty) = t.await?;
        out.dequeued.merge(&tally);
        out.e2e.add(&e2e).expect("same bounds");
        out.empty += empty;
    }
    Ok(out)
}
