//! A flood of names nobody uses: pops (waiting and not, over a queue and a named partition,
//! with and without a group), batches of acks of random messages, lease extensions of random
//! ids, lookups and listings, every one naming queues, groups, partitions and ids that exist
//! nowhere. Judged by the server's own registry sizes (`comb_registry_entries` in `/metrics`)
//! before and after, never by timing: afterwards none may hold more than before, and no pop
//! waits. The resident memory before and after is reported for `docs/reliability.md`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::task::JoinSet;

use super::wire::{Body, Case, send_with};
use crate::rng::Rng;

/// Acks in each batch of random acks: each names a transaction id and a partition id.
const ACKS_PER_BATCH: usize = 32;

/// Requests in flight at once.
const IN_FLIGHT: usize = 32;

/// What a flood did to the server.
#[derive(Debug, Default)]
pub struct FloodReport {
    pub requests: usize,
    /// Random names sent (several per ack batch).
    pub names: usize,
    /// Answers by status.
    pub statuses: BTreeMap<u16, usize>,
    pub registries_before: BTreeMap<String, u64>,
    pub registries_after: BTreeMap<String, u64>,
    /// Resident memory of the server process, in KiB (`VmRSS`).
    pub rss_before_kib: u64,
    pub rss_after_kib: u64,
    pub findings: Vec<String>,
}

impl FloodReport {
    /// A table for people.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "flood: {} requests carrying {} random names; statuses {:?}\n",
            self.requests, self.names, self.statuses
        );
        s.push_str(&format!(
            "resident memory: {:.1} MiB before, {:.1} MiB after\n",
            self.rss_before_kib as f64 / 1024.0,
            self.rss_after_kib as f64 / 1024.0
        ));
        s.push_str("registry                 before   after\n");
        for (name, before) in &self.registries_before {
            let after = self.registries_after.get(name).copied().unwrap_or(0);
            s.push_str(&format!("{name:<22} {before:>8} {after:>7}\n"));
        }
        for f in &self.findings {
            s.push_str(&format!("FINDING: {f}\n"));
        }
        s
    }
}

/// The server's registry sizes, from `/metrics`.
async fn registries(
    addr: SocketAddr,
    token: Option<&[u8]>,
) -> Result<BTreeMap<String, u64>, String> {
    let case = Case {
        name: "metrics".into(),
        method: "GET".into(),
        target: "/metrics".into(),
        body: Body::None,
        expect: Some(200),
    };
    let answer = send_with(addr, &case, token)
        .await
        .map_err(|e| format!("metrics: {e}"))?;
    let text = String::from_utf8_lossy(&answer.body);
    let sizes: BTreeMap<String, u64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("comb_registry_entries{registry=\""))
        .filter_map(|l| {
            let (name, rest) = l.split_once("\"} ")?;
            Some((name.to_string(), rest.trim().parse().ok()?))
        })
        .collect();
    if sizes.is_empty() {
        return Err(format!(
            "no comb_registry_entries in /metrics ({})",
            answer.status
        ));
    }
    Ok(sizes)
}

/// Resident memory of a process in KiB, from `/proc`.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// One request of the flood, on names of its own.
fn request(i: usize, rng: &mut Rng) -> (Case, usize) {
    let name = format!("flood{:016x}", rng.next_u64());
    let mut id = || {
        let (a, b) = (rng.next_u64(), rng.next_u64());
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            (b >> 48) & 0xfff,
            b & 0xffff_ffff_ffff
        )
    };
    let get = |target: String| Case {
        name: format!("flood {i}"),
        method: "GET".into(),
        target,
        body: Body::None,
        expect: None,
    };
    let post = |target: String, body: String| Case {
        name: format!("flood {i}"),
        method: "POST".into(),
        target,
        body: Body::Sized(body.into_bytes()),
        expect: None,
    };
    match i % 10 {
        0 => (
            get(format!("/api/v1/pop/queue/{name}?wait=true&timeout=1")),
            1,
        ),
        1 => (
            get(format!(
                "/api/v1/pop/queue/{name}?consumerGroup={name}g&wait=true&timeout=1"
            )),
            2,
        ),
        2 => (
            get(format!("/api/v1/pop/queue/{name}?consumerGroup={name}g")),
            2,
        ),
        3 => (
            get(format!(
                "/api/v1/pop/queue/{name}/partition/{name}p?wait=true&timeout=1"
            )),
            2,
        ),
        4 => {
            let acks: Vec<String> = (0..ACKS_PER_BATCH)
                .map(|k| {
                    format!(
                        r#"{{"transactionId":"{name}-{k}","partitionId":"{}","status":"completed"}}"#,
                        id()
                    )
                })
                .collect();
            (
                post(
                    "/api/v1/ack/batch".into(),
                    format!(
                        r#"{{"consumerGroup":"{name}g","acknowledgments":[{}]}}"#,
                        acks.join(",")
                    ),
                ),
                1 + ACKS_PER_BATCH,
            )
        }
        5 => (
            post(
                format!("/api/v1/lease/{}/extend", id()),
                r#"{"seconds":30}"#.into(),
            ),
            1,
        ),
        6 => (get(format!("/api/v1/resources/queues/{name}")), 1),
        7 => (get(format!("/api/v1/messages?queue={name}")), 1),
        8 => (get(format!("/api/v1/dlq?queue={name}")), 1),
        _ => (get(format!("/api/v1/consumer-groups/{name}")), 1),
    }
}

/// Sends `requests` requests of random names to the server at `addr` (process `pid`) and
/// judges its registries afterwards.
pub async fn flood(
    addr: SocketAddr,
    pid: u32,
    requests: usize,
    seed: u64,
    token: Option<Vec<u8>>,
) -> Result<FloodReport, String> {
    let mut report = FloodReport {
        registries_before: registries(addr, token.as_deref()).await?,
        rss_before_kib: rss_kib(pid),
        requests,
        ..FloodReport::default()
    };
    let token = Arc::new(token);
    let mut rng = Rng::new(seed);
    let mut running = JoinSet::new();
    for i in 0..requests {
        let (case, names) = request(i, &mut rng);
        report.names += names;
        if running.len() >= IN_FLIGHT
            && let Some(done) = running.join_next().await
        {
            tally(&mut report, done);
        }
        let token = token.clone();
        running.spawn(async move {
            send_with(addr, &case, token.as_deref())
                .await
                .map(|a| a.status)
                .map_err(|e| format!("{}: {e}", case.target))
        });
    }
    while let Some(done) = running.join_next().await {
        tally(&mut report, done);
    }
    report.registries_after = registries(addr, token.as_deref()).await?;
    report.rss_after_kib = rss_kib(pid);
    for (name, before) in &report.registries_before {
        let after = report.registries_after.get(name).copied().unwrap_or(0);
        // Per-queue counters empty at each per-minute record; the catalog forgets everything
        // when its relay reconnects: none may grow.
        if after > *before {
            report.findings.push(format!(
                "registry {name} grew from {before} to {after} with names that exist nowhere"
            ));
        }
    }
    // Once the flood's pops are answered, its names leave nothing behind. Entries the server
    // held before the flood may stay: a (queue, group) whose partition waits for a lease to
    // end keeps its entry until then (`wake::Wake::ready`), and the generated cases that ran
    // before leave such leases.
    for waiting in ["wake_groups", "wake_queues"] {
        let before = report.registries_before.get(waiting).copied().unwrap_or(0);
        let after = report.registries_after.get(waiting).copied().unwrap_or(0);
        if after > before {
            report.findings.push(format!(
                "{waiting} holds {} entries more than before the flood, with no pop waiting",
                after - before
            ));
        }
    }
    Ok(report)
}

fn tally(report: &mut FloodReport, done: Result<Result<u16, String>, tokio::task::JoinError>) {
    match done {
        Ok(Ok(status)) => {
            *report.statuses.entry(status).or_default() += 1;
            if status >= 500 && status != 503 {
                report
                    .findings
                    .push(format!("a flood request answered {status}"));
            }
        }
        Ok(Err(e)) => report.findings.push(format!("no answer: {e}")),
        Err(e) => report.findings.push(format!("request task: {e}")),
    }
}
