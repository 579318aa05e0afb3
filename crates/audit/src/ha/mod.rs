//! The failover audit (`comb-audit chaos-ha`, run by `make chaos-ha` and `make chaos`):
//! two Comb servers on a Patroni cluster of three PostgreSQL nodes, given the multi-host URL,
//! with the delivery audit running through each fault in turn:
//!
//! 1. a planned switchover (`patronictl switchover`) to the synchronous standby;
//! 2. a crash of the primary (`kill -9` of its postmaster and its Patroni): the leader key
//!    expires and the synchronous standby is promoted;
//! 3. the crashed node coming back, as a standby;
//! 4. the same crash with asynchronous replication (`synchronous_mode` off).
//!
//! Each fault gets an audit of its own (its own queue and transaction ids), so that its
//! counts are its own: lost, out of order, duplicated (and what was in flight), phantoms,
//! 5xx other than 503. Besides the audit, a probe pushes one message every 50 ms through
//! the servers in turn, and a watcher asks the other nodes every 50 ms whether they accept
//! writes: from these come the longest time without a successful push and the time from the
//! promotion to Comb's first successful push.

pub mod cluster;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use comb_harness::Server;
use serde_json::{Value, json};

use crate::scenario::{Options, Outcome, check_log, finish, start_server};
use crate::workload::{Audit, Config, Endpoints};
use cluster::Cluster;

/// The limit the targets set on the time from a new primary to Comb's first push.
pub const BACK_WITHIN: Duration = Duration::from_secs(2);

/// The faults, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Switchover,
    Crash,
    Rejoin,
    CrashAsync,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Switchover => "planned switchover (patronictl switchover)",
            Kind::Crash => "crash of the primary (kill -9 of postmaster and Patroni)",
            Kind::Rejoin => "old primary back, as a standby",
            Kind::CrashAsync => "crash of the primary, asynchronous replication",
        }
    }

    fn synchronous(self) -> bool {
        self != Kind::CrashAsync
    }
}

/// What one fault did.
#[derive(Debug)]
pub struct FaultResult {
    pub outcome: Outcome,
    pub replication: &'static str,
    /// Distinct acknowledged messages never delivered (a group misses each lost message).
    pub lost: u64,
    pub phantoms: u64,
    pub other_5xx: u64,
    /// The longest time after the fault without a successful probe push.
    pub without_service: f64,
    /// From the new primary accepting writes to Comb's first successful push.
    pub promotion_to_push: Option<f64>,
    /// Whether the fault's targets apply (synchronous replication) and must be met.
    pub judged: bool,
}

impl FaultResult {
    pub fn passed(&self) -> bool {
        !self.judged || self.outcome.passed()
    }
}

/// Everything `chaos-ha` found.
#[derive(Debug, Default)]
pub struct HaReport {
    pub faults: Vec<FaultResult>,
    /// The claim path's commit under synchronous replication, measured (see the docs).
    pub commit_latency: Vec<String>,
    pub problems: Vec<String>,
}

impl HaReport {
    pub fn passed(&self) -> bool {
        self.problems.is_empty() && self.faults.iter().all(FaultResult::passed)
    }

    /// The table of `docs/high-availability.md`.
    pub fn table(&self) -> String {
        let mut s = String::from(
            "| fault | replication | accepted | lost | out of order | duplicated (in flight) | phantoms | 5xx other than 503 | s without service | s from promotion to first push | result |\n\
             |---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for f in &self.faults {
            let r = &f.outcome.report;
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} ({}) | {} | {} | {:.2} | {} | {} |\n",
                f.outcome.name,
                f.replication,
                r.accepted,
                f.lost,
                r.out_of_order(),
                r.duplicated(),
                r.in_flight_at_faults,
                f.phantoms,
                f.other_5xx,
                f.without_service,
                f.promotion_to_push
                    .map(|s| format!("{s:.2}"))
                    .unwrap_or_else(|| "–".into()),
                if !f.judged {
                    "measured"
                } else if f.outcome.passed() {
                    "pass"
                } else {
                    "FAIL"
                }
            ));
        }
        s
    }
}

/// Pushes one message every 50 ms through the servers in turn, remembering when they
/// succeeded, and the first reason `/ready` gave while they did not.
struct Probe {
    successes: Arc<Mutex<Vec<Instant>>>,
    reasons: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Probe {
    fn start(servers: Vec<String>) -> Probe {
        let successes = Arc::new(Mutex::new(Vec::new()));
        let reasons = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let (successes, reasons, stop) = (successes.clone(), reasons.clone(), stop.clone());
            async move {
                let http = reqwest::Client::builder()
                    .timeout(Duration::from_secs(3))
                    .build()
                    .expect("HTTP client");
                let mut k = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let base = &servers[k % servers.len()];
                    k += 1;
                    let r = http
                        .post(format!("{base}/api/v1/push"))
                        .json(&json!({"items": [{"queue": "ha-probe", "payload": k}]}))
                        .send()
                        .await;
                    match r.map(|r| r.status().as_u16()) {
                        Ok(201) => successes.lock().expect("probe").push(Instant::now()),
                        _ => {
                            let few = reasons.lock().expect("probe").len() < 3;
                            if few
                                && let Ok(r) = http.get(format!("{base}/ready")).send().await
                                && let Ok(v) = r.json::<Value>().await
                                && let Some(why) = v["reason"].as_str()
                            {
                                reasons.lock().expect("probe").push(why.to_string());
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });
        Probe {
            successes,
            reasons,
            stop,
            task,
        }
    }

    /// The first success at or after `t`.
    fn first_success_after(&self, t: Instant) -> Option<Instant> {
        self.successes
            .lock()
            .expect("probe")
            .iter()
            .copied()
            .find(|s| *s >= t)
    }

    async fn stop(self) -> (Vec<Instant>, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        let s = self.successes.lock().expect("probe").clone();
        let r = self.reasons.lock().expect("probe").clone();
        (s, r)
    }
}

/// The longest time after `fault` without a successful push (successes in time order).
fn longest_gap(successes: &[Instant], fault: Instant) -> f64 {
    let mut longest = 0.0f64;
    let mut before = fault;
    for &s in successes.iter().filter(|s| **s > fault) {
        longest = longest.max((s - before).as_secs_f64());
        before = s;
    }
    longest
}

/// Asks every node but `old` every 50 ms whether it accepts writes; the first time one does.
async fn watch_promotion(conninfo: Vec<String>, limit: Duration) -> Option<Instant> {
    let started = Instant::now();
    let mut clients: Vec<Option<tokio_postgres::Client>> = conninfo.iter().map(|_| None).collect();
    while started.elapsed() < limit {
        for (i, info) in conninfo.iter().enumerate() {
            if clients[i].as_ref().is_none_or(|c| c.is_closed()) {
                clients[i] = None;
                if let Ok(Ok((c, conn))) = tokio::time::timeout(
                    Duration::from_millis(500),
                    tokio_postgres::connect(info, tokio_postgres::NoTls),
                )
                .await
                {
                    tokio::spawn(conn);
                    clients[i] = Some(c);
                }
            }
            if let Some(c) = &clients[i]
                && let Ok(Ok(row)) = tokio::time::timeout(
                    Duration::from_millis(500),
                    c.query_one("SELECT pg_is_in_recovery()", &[]),
                )
                .await
                && !row.get::<_, bool>(0)
            {
                return Some(Instant::now());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// What the servers' `/ready` says about durability.
async fn durability(servers: &[String]) -> Vec<String> {
    let http = reqwest::Client::new();
    let mut out = Vec::new();
    for s in servers {
        let v: Value = match http.get(format!("{s}/ready")).send().await {
            Ok(r) => r.json().await.unwrap_or(Value::Null),
            Err(_) => Value::Null,
        };
        out.push(format!(
            "survivesFailover {} ({})",
            v["durability"]["survivesFailover"],
            v["durability"]["summary"]
                .as_str()
                .unwrap_or("not checked yet")
        ));
    }
    out
}

/// The claim path's question: what would waiting for the synchronous standby cost a claim's
/// commit? Times 300 one-row commits with `synchronous_commit = off` (what claims with
/// explicit acks use), `local` (the local flush alone) and `on` (pushes, acks: the flush and
/// the synchronous standby) on the primary.
async fn commit_latency(cluster: &Cluster) -> Result<Vec<String>, String> {
    let p = cluster.primary().await.ok_or("no primary")?;
    let (client, conn) =
        tokio_postgres::connect(&cluster.nodes[p].conninfo(), tokio_postgres::NoTls)
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS ha_commit_probe (x int)")
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for mode in ["off", "local", "on"] {
        let mut times = Vec::new();
        for _ in 0..300 {
            let t = Instant::now();
            client
                .batch_execute(&format!(
                    "BEGIN; SET LOCAL synchronous_commit = {mode}; \
                     INSERT INTO ha_commit_probe VALUES (1); COMMIT"
                ))
                .await
                .map_err(|e| e.to_string())?;
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        times.sort_by(f64::total_cmp);
        out.push(format!(
            "synchronous_commit = {mode}: median {:.2} ms, p99 {:.2} ms",
            times[times.len() / 2],
            times[times.len() * 99 / 100]
        ));
    }
    let _ = client.batch_execute("DROP TABLE ha_commit_probe").await;
    Ok(out)
}

/// The running cluster and servers.
struct Stage {
    opts: Options,
    cluster: Cluster,
    servers: Vec<Server>,
    endpoints: Arc<Endpoints>,
    crashed: Option<usize>,
}

impl Stage {
    fn urls(&self) -> Vec<String> {
        self.servers.iter().map(Server::base_url).collect()
    }

    fn conninfo_except(&self, old: usize) -> Vec<String> {
        (0..self.cluster.nodes.len())
            .filter(|&i| i != old)
            .map(|i| self.cluster.nodes[i].conninfo())
            .collect()
    }

    /// The synchronous standby, as Patroni names it.
    async fn sync_standby(&self) -> Option<usize> {
        let v = self.cluster.describe().await;
        let name = v["members"]
            .as_array()?
            .iter()
            .find(|m| m["role"] == "sync_standby")?["name"]
            .as_str()?
            .to_string();
        self.cluster.nodes.iter().position(|n| n.name == name)
    }

    async fn fault(&mut self, kind: Kind, run: &str) -> FaultResult {
        let started = Instant::now();
        let mut cfg = Config::standard(run, (self.opts.rate * 60.0) as u64);
        cfg.rate = Some(self.opts.rate);
        cfg.seed = self.opts.seed;
        cfg.lease_secs = 5;
        cfg.drain_timeout = Duration::from_secs(if kind.synchronous() { 60 } else { 30 });
        Audit::configure(&cfg, &self.endpoints)
            .await
            .expect("queue configured");
        let audit = Audit::start(cfg, self.endpoints.clone());
        let probe = Probe::start(self.urls());
        let mut notes = Vec::new();
        let mut problems = Vec::new();
        tokio::time::sleep(Duration::from_secs(10)).await;
        let old = self.cluster.primary().await;
        let watcher = old.filter(|_| kind != Kind::Rejoin).map(|old| {
            tokio::spawn(watch_promotion(
                self.conninfo_except(old),
                Duration::from_secs(60),
            ))
        });
        let accepted_before = audit.accepted();
        let fault = Instant::now();
        match (kind, old) {
            (_, None) if kind != Kind::Rejoin => {
                problems.push("no primary before the fault".into())
            }
            (Kind::Switchover, Some(old)) => match self.sync_standby().await {
                Some(candidate) => match self.cluster.switchover(old, candidate) {
                    Ok(out) => notes.push(format!(
                        "switchover {} -> {}: {}",
                        self.cluster.nodes[old].name,
                        self.cluster.nodes[candidate].name,
                        out.lines().last().unwrap_or_default()
                    )),
                    Err(e) => problems.push(format!("switchover failed: {e}")),
                },
                None => problems.push("no synchronous standby to switch over to".into()),
            },
            (Kind::Crash | Kind::CrashAsync, Some(old)) => {
                if let Err(e) = self.cluster.crash(old) {
                    problems.push(format!("crash of {}: {e}", self.cluster.nodes[old].name));
                }
                notes.push(format!("crashed {}", self.cluster.nodes[old].name));
                self.crashed = Some(old);
            }
            (Kind::Rejoin, _) => match self.crashed.take() {
                Some(node) => {
                    if let Err(e) = self.cluster.start_patroni(node) {
                        problems.push(format!("restart of {}: {e}", self.cluster.nodes[node].name));
                    }
                    let t = Instant::now();
                    let mut streaming = false;
                    while t.elapsed() < Duration::from_secs(90) {
                        if self.cluster.replicas_streaming().await == 2 {
                            streaming = true;
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    if streaming {
                        notes.push(format!(
                            "{} streams again as a standby {:.1} s after its restart",
                            self.cluster.nodes[node].name,
                            t.elapsed().as_secs_f64()
                        ));
                    } else {
                        problems.push(format!(
                            "{} did not stream as a standby within 90 s:\n{}",
                            self.cluster.nodes[node].name,
                            self.cluster.nodes[node].log_tail(30)
                        ));
                    }
                }
                None => problems.push("no crashed node to bring back".into()),
            },
            _ => {}
        }
        let promoted = match watcher {
            Some(w) => {
                let p = w.await.ok().flatten();
                if p.is_none() {
                    problems.push("no node accepted writes within 60 s of the fault".into());
                }
                p
            }
            None => None,
        };
        let since = promoted.unwrap_or(fault);
        let t = Instant::now();
        let back = loop {
            if let Some(s) = probe.first_success_after(since) {
                break s;
            }
            if t.elapsed() > Duration::from_secs(60) {
                problems.push("no push succeeded within 60 s of the promotion".into());
                break Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let promotion_to_push = promoted.map(|p| (back.max(p) - p).as_secs_f64());
        if let (Some(p), Some(d)) = (promoted, promotion_to_push) {
            notes.push(format!(
                "new primary accepted writes {:.2} s after the fault; Comb's first push {d:.2} s \
                 after that",
                (p - fault).as_secs_f64()
            ));
        }
        if kind.synchronous()
            && let Some(d) = promotion_to_push
            && d > BACK_WITHIN.as_secs_f64()
        {
            problems.push(format!(
                "first push {d:.2} s after the promotion (target {} s)",
                BACK_WITHIN.as_secs()
            ));
        }
        // Traffic on the new primary for a while, then drain.
        tokio::time::sleep(Duration::from_secs(10)).await;
        audit.stop_producing();
        audit.record_fault(kind.name(), fault, back);
        notes.push(format!("fault at {accepted_before} accepted"));
        for (i, d) in durability(&self.urls()).await.into_iter().enumerate() {
            notes.push(format!("server {i} /ready durability: {d}"));
        }
        let (successes, reasons) = probe.stop().await;
        for r in reasons {
            notes.push(format!("/ready while pushes failed: {r}"));
        }
        let without_service = longest_gap(&successes, fault);
        let mut outcome = finish(kind.name(), audit, started, notes, problems).await;
        for (i, s) in self.servers.iter().enumerate() {
            check_log(s, &format!("server {i}"), &mut outcome.problems);
            if !crate::scenario::alive(s.pid()) {
                outcome.problems.push(format!("server {i} exited"));
            }
        }
        let r = &outcome.report;
        FaultResult {
            replication: if kind.synchronous() {
                "synchronous"
            } else {
                "asynchronous"
            },
            lost: r.groups.iter().map(|g| g.lost).max().unwrap_or(0),
            phantoms: r.groups.iter().map(|g| g.phantom).sum(),
            other_5xx: outcome_5xx(&outcome),
            without_service,
            promotion_to_push,
            judged: kind.synchronous(),
            outcome,
        }
    }
}

/// 5xx answers other than 503, from the audit's wire counters.
fn outcome_5xx(o: &Outcome) -> u64 {
    o.stats
        .split(", ")
        .find_map(|part| part.strip_prefix("other 5xx "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Runs the whole failover audit; each fault's block is printed as it ends.
pub async fn run(comb: PathBuf, rate: f64, seed: u64) -> HaReport {
    let mut report = HaReport::default();
    let pg_bin = match comb_harness::pg_bin_dir() {
        Ok(b) => b,
        Err(e) => {
            report.problems.push(format!("PostgreSQL binaries: {e}"));
            return report;
        }
    };
    let setup = Instant::now();
    let cluster = match Cluster::start(&pg_bin).await {
        Ok(c) => c,
        Err(e) => {
            report
                .problems
                .push(format!("the Patroni cluster did not start: {e}"));
            return report;
        }
    };
    let url = cluster.database_url();
    println!(
        "Patroni cluster up in {:.1} s; Comb's URL: {url}",
        setup.elapsed().as_secs_f64()
    );
    match commit_latency(&cluster).await {
        Ok(lines) => report.commit_latency = lines,
        Err(e) => report.problems.push(format!("commit latency: {e}")),
    }
    for l in &report.commit_latency {
        println!("commit with a synchronous standby, {l}");
    }
    let a = start_server(&comb, &url).await;
    let b = start_server(&comb, &url).await;
    let endpoints = Endpoints::new(vec![a.base_url(), b.base_url()]);
    let mut stage = Stage {
        opts: Options { comb, rate, seed },
        cluster,
        servers: vec![a, b],
        endpoints,
        crashed: None,
    };
    for (kind, run) in [
        (Kind::Switchover, "ha-switchover"),
        (Kind::Crash, "ha-crash"),
        (Kind::Rejoin, "ha-rejoin"),
        (Kind::CrashAsync, "ha-crash-async"),
    ] {
        if kind == Kind::CrashAsync
            && let Err(e) = stage.cluster.set_synchronous(false).await
        {
            report
                .problems
                .push(format!("synchronous_mode could not be turned off: {e}"));
            break;
        }
        let f = stage.fault(kind, run).await;
        println!(
            "{}{}",
            f.outcome.render(),
            if f.judged {
                ""
            } else {
                "(measured, not judged: asynchronous replication)\n"
            }
        );
        report.faults.push(f);
    }
    report
}
