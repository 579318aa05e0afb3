//! Fault scenarios: each starts its own PostgreSQL and Comb servers, runs the delivery audit
//! throughout, injects one kind of fault, and returns the audit's counts plus what it
//! measured about the fault itself.
//!
//! The clusters run with `synchronous_commit=on`: a push is answered after its commit, and a
//! crash of PostgreSQL must not take back a commit it confirmed. (The test default `off`
//! would let an immediate stop lose the last confirmed commits, which is PostgreSQL doing what
//! it was told, not a Comb defect.)

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use comb_harness::{Citus, Postgres, Server};
use serde_json::json;

use crate::ledger::Report;
use crate::pg;
use crate::workload::{Audit, Config, Endpoints};

/// What a scenario found.
#[derive(Debug)]
pub struct Outcome {
    pub name: String,
    pub report: Report,
    /// Wire counters of the audit's clients.
    pub stats: String,
    /// Measurements worth recording (latencies, recovery times).
    pub notes: Vec<String>,
    /// Everything besides the audit's counts that makes the scenario fail.
    pub problems: Vec<String>,
    pub elapsed: Duration,
}

impl Outcome {
    /// Whether the audit and the scenario's own checks passed.
    pub fn passed(&self) -> bool {
        self.report.failures().is_empty() && self.problems.is_empty()
    }

    /// A block of text for people.
    pub fn render(&self) -> String {
        let mut s = format!(
            "=== {} ({:.0} s): {}\n{}\n{}\n",
            self.name,
            self.elapsed.as_secs_f64(),
            if self.passed() { "PASS" } else { "FAIL" },
            self.report.summary(),
            self.stats
        );
        for n in &self.notes {
            s.push_str(&format!("note: {n}\n"));
        }
        for f in self.report.failures().iter().chain(&self.problems) {
            s.push_str(&format!("FAILURE: {f}\n"));
        }
        s
    }
}

/// Whether process `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().next())
            .is_some_and(|state| state != "Z")
    })
}

pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

/// A cluster of the scenario's own, durable enough for crash tests.
async fn cluster() -> Arc<Postgres> {
    let pg = blocking(|| Postgres::start_with(&[("synchronous_commit", "on")]))
        .await
        .expect("PostgreSQL starts");
    Arc::new(pg)
}

pub(crate) async fn start_server(bin: &Path, url: &str) -> Server {
    let (bin, url) = (bin.to_path_buf(), url.to_string());
    blocking(move || Server::start(&bin, &url, &[]))
        .await
        .expect("comb starts")
}

/// Notes panics in a server's log as problems.
pub(crate) fn check_log(server: &Server, what: &str, problems: &mut Vec<String>) {
    let log = server.log_tail(100_000);
    if let Some(line) = log.lines().find(|l| l.contains("panicked")) {
        problems.push(format!("{what} panicked: {line}"));
    }
}

/// When messages were left unsettled, adds the state of their partitions' cursors to the
/// notes: that is where a stuck partition shows.
async fn dump_cursors(pg: &Arc<Postgres>, url: &str, out: &mut Outcome) {
    let partitions: Vec<String> = out
        .report
        .groups
        .iter()
        .flat_map(|g| g.unsettled_partitions.iter())
        .map(|p| format!("'{}'", crate::ledger::partition_name(*p)))
        .collect();
    if partitions.is_empty() {
        return;
    }
    let db = url.rsplit('/').next().unwrap_or_default().to_string();
    let sql = format!(
        "SELECT string_agg(concat_ws(' ', p.name, c.consumer_group, 'head', (SELECT h.pos FROM comb.partition_head(p.id) h), 'cursor', \
         c.cursor_pos, 'settled', c.settled::text, 'lease', c.lease_id, c.lease_expires_at - now(), \
         'upto', c.lease_upto, 'available in', c.available_at - now()), E'\\n') \
         FROM comb.cursors_now c JOIN comb.partitions p ON p.id = c.partition_id \
         WHERE p.name IN ({})",
        partitions.join(",")
    );
    let pg = pg.clone();
    let dump = blocking(move || pg.psql(&db, &sql)).await;
    out.notes.push(format!(
        "cursors of unsettled partitions:\n{}",
        dump.unwrap_or_else(|e| e.to_string())
    ));
}

/// Options shared by the scenarios.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `comb` binary to run.
    pub comb: PathBuf,
    /// Messages per second the producers push while faults happen.
    pub rate: f64,
    pub seed: u64,
}

fn config(name: &str, opts: &Options, seconds: f64) -> Config {
    let mut cfg = Config::standard(name, (opts.rate * seconds) as u64);
    cfg.rate = Some(opts.rate);
    cfg.seed = opts.seed;
    cfg.lease_secs = 5;
    cfg.drain_timeout = Duration::from_secs(90);
    cfg
}

pub(crate) async fn finish(
    name: &str,
    audit: Audit,
    started: Instant,
    notes: Vec<String>,
    problems: Vec<String>,
) -> Outcome {
    let (report, stats) = audit.finish().await;
    let mut notes = notes;
    let mut problems = problems;
    let unsettled: u64 = report.groups.iter().map(|g| g.unsettled).sum();
    if unsettled > 0 {
        // Every accepted message must end settled in every group once the fault is over;
        // one that is not was stuck for the whole drain.
        problems.push(format!(
            "{unsettled} messages still unsettled when the drain ended"
        ));
    }
    let errors = stats.status_500.load(std::sync::atomic::Ordering::Relaxed);
    if errors > 0 {
        // A fault makes the server unavailable (503, retry), never broken (500).
        problems.push(format!(
            "{errors} answers were 5xx other than 503 (samples in the notes)"
        ));
    }
    for s in stats.samples.lock().expect("samples").iter() {
        notes.push(format!("5xx sample: {s}"));
    }
    Outcome {
        name: name.to_string(),
        report,
        stats: stats.summary(),
        notes,
        problems,
        elapsed: started.elapsed(),
    }
}

/// The short audit of `make test`: at least `messages` messages, one `kill -9` of the
/// server once 40 % are accepted (restarted at once), and a forced consumer death in each
/// group. Uses the given database on a cluster the caller owns.
pub async fn short_audit(comb: &Path, database_url: &str, messages: u64) -> Outcome {
    let started = Instant::now();
    let mut server = start_server(comb, database_url).await;
    let endpoints = Endpoints::new(vec![server.base_url()]);
    let mut cfg = Config::standard("short", messages);
    // Long enough that a slow, loaded test machine does not let healthy leases run out.
    cfg.lease_secs = 10;
    cfg.drain_timeout = Duration::from_secs(45);
    Audit::configure(&cfg, &endpoints)
        .await
        .expect("queue configured");
    let audit = Audit::start(cfg, endpoints.clone());
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    if !audit
        .wait_accepted(messages * 2 / 5, Duration::from_secs(60))
        .await
    {
        problems.push(format!(
            "only {} messages accepted before the kill",
            audit.accepted()
        ));
    }
    let fault = Instant::now();
    server.kill();
    server = start_server(comb, database_url).await;
    endpoints.set(0, server.base_url());
    let back = Instant::now();
    audit.record_fault("kill -9 of the server", fault, back);
    notes.push(format!(
        "server killed at {} accepted, serving again after {:.2} s",
        audit.accepted(),
        (back - fault).as_secs_f64()
    ));
    let out = finish("short audit", audit, started, notes, problems).await;
    let mut out = out;
    check_log(&server, "restarted server", &mut out.problems);
    out
}

/// The audit's own check: consumers pop with `autoAck=true` (at-most-once) and die holding
/// batches, so messages are lost for real; the audit must count them and fail.
pub async fn at_most_once_loses(comb: &Path, database_url: &str, messages: u64) -> Outcome {
    let started = Instant::now();
    let server = start_server(comb, database_url).await;
    let endpoints = Endpoints::new(vec![server.base_url()]);
    let mut cfg = Config::standard("amo", messages);
    cfg.auto_ack = true;
    cfg.death_rate = 0.02;
    cfg.drain_timeout = Duration::from_secs(5);
    Audit::configure(&cfg, &endpoints)
        .await
        .expect("queue configured");
    let audit = Audit::start(cfg, endpoints);
    finish(
        "at-most-once consumers that die",
        audit,
        started,
        Vec::new(),
        Vec::new(),
    )
    .await
}

/// `kill -9` of the only server every `every`, for `total`, restarted each time.
pub async fn server_kills(opts: &Options, every: Duration, total: Duration) -> Outcome {
    let name = "kill -9 of the server every 20 s for 3 minutes";
    let started = Instant::now();
    let pg = cluster().await;
    let url = blocking({
        let pg = pg.clone();
        move || pg.create_database("kills")
    })
    .await
    .expect("database");
    let mut server = start_server(&opts.comb, &url).await;
    let endpoints = Endpoints::new(vec![server.base_url()]);
    let cfg = config("kills", opts, total.as_secs_f64());
    Audit::configure(&cfg, &endpoints)
        .await
        .expect("queue configured");
    let audit = Audit::start(cfg, endpoints.clone());
    let mut notes = Vec::new();
    let mut problems = Vec::new();
    let mut restarts = Vec::new();
    let t0 = Instant::now();
    let mut next = t0 + every;
    while next <= t0 + total {
        tokio::time::sleep_until(next.into()).await;
        check_log(&server, "server", &mut problems);
        let fault = Instant::now();
        server.kill();
        server = start_server(&opts.comb, &url).await;
        endpoints.set(0, server.base_url());
        let back = Instant::now();
        audit.record_fault("kill -9", fault, back);
        restarts.push((back - fault).as_secs_f64());
        next += every;
    }
    audit.stop_producing();
    notes.push(format!(
        "{} kills; restart to ready took {}",
        restarts.len(),
        restarts
            .iter()
            .map(|s| format!("{s:.2}s"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let mut out = finish(name, audit, started, notes, problems).await;
    check_log(&server, "server", &mut out.problems);
    dump_cursors(&pg, &url, &mut out).await;
    out
}

/// Polls a push until it is accepted; returns how long that took, or `None` after `limit`.
async fn until_push_works(http: &reqwest::Client, base: &str, limit: Duration) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < limit {
        let r = http
            .post(format!("{base}/api/v1/push"))
            .json(&json!({"items": [{"queue": "probe", "payload": {"probe": true}}]}))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        if r.is_ok_and(|r| r.status().as_u16() == 201) {
            return Some(t.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// PostgreSQL stopped with `-m immediate` (a crash) under load, restarted after 10 s.
pub async fn postgres_crash(opts: &Options) -> Outcome {
    let name = "PostgreSQL stopped with -m immediate under load, restarted after 10 s";
    let started = Instant::now();
    let pg = cluster().await;
    let url = blocking({
        let pg = pg.clone();
        move || pg.create_database("crash")
    })
    .await
    .expect("database");
    let server = start_server(&opts.comb, &url).await;
    let endpoints = Endpoints::new(vec![server.base_url()]);
    let cfg = config("crash", opts, 50.0);
    Audit::configure(&cfg, &endpoints)
        .await
        .expect("queue configured");
    let audit = Audit::start(cfg, endpoints.clone());
    let mut notes = Vec::new();
    let mut problems = Vec::new();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let fault = Instant::now();
    let accepted_before = audit.accepted();
    blocking({
        let pg = pg.clone();
        move || pg.stop("immediate")
    })
    .await
    .expect("PostgreSQL stops");
    tokio::time::sleep(Duration::from_secs(10)).await;
    if !alive(server.pid()) {
        problems.push("comb exited while PostgreSQL was down".into());
    }
    let (ready, _) = get(&server.base_url(), "/ready").await;
    notes.push(format!("/ready while PostgreSQL was down: {ready}"));
    if ready != 503 {
        problems.push(format!("/ready answered {ready} while PostgreSQL was down"));
    }
    let restart = Instant::now();
    blocking({
        let pg = pg.clone();
        move || pg.restart()
    })
    .await
    .expect("PostgreSQL restarts");
    let http = reqwest::Client::new();
    let up = Instant::now();
    match until_push_works(&http, &server.base_url(), Duration::from_secs(30)).await {
        Some(d) => notes.push(format!(
            "PostgreSQL restart (with crash recovery) took {:.2} s; pushes accepted {:.2} s after it was up",
            (up - restart).as_secs_f64(),
            d.as_secs_f64()
        )),
        None => problems.push("pushes still failing 30 s after PostgreSQL restarted".into()),
    }
    audit.record_fault("PostgreSQL crash", fault, Instant::now());
    notes.push(format!("crash at {accepted_before} accepted"));
    let mut out = finish(name, audit, started, notes, problems).await;
    check_log(&server, "server", &mut out.problems);
    dump_cursors(&pg, &url, &mut out).await;
    out
}

async fn get(base: &str, path: &str) -> (u16, Duration) {
    let t = Instant::now();
    let status = reqwest::Client::new()
        .get(format!("{base}{path}"))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0);
    (status, t.elapsed())
}

/// One request made while the database was unreachable, and what came back.
#[derive(Debug)]
struct Probe {
    what: &'static str,
    status: u16,
    took: Duration,
    retry_after: bool,
    problem_json: bool,
}

async fn probe(http: &reqwest::Client, base: &str, what: &'static str) -> Probe {
    let t = Instant::now();
    let req = match what {
        "push" => http
            .post(format!("{base}/api/v1/push"))
            .json(&json!({"items": [{"queue": "probe", "payload": 1}]})),
        "pop" => http.get(format!("{base}/api/v1/pop/queue/probe")),
        "ack" => http.post(format!("{base}/api/v1/ack")).json(&json!({
            "transactionId": "t", "partitionId": "00000000-0000-0000-0000-000000000000",
            "status": "completed"})),
        "configure" => http
            .post(format!("{base}/api/v1/configure"))
            .json(&json!({"queue": "probe", "options": {"retryDelay": 10}})),
        _ => http.get(format!("{base}/ready")),
    };
    let r = req.timeout(Duration::from_secs(30)).send().await;
    let took = t.elapsed();
    match r {
        Ok(r) => {
            let retry_after = r.headers().contains_key("retry-after");
            let problem_json = r
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("application/problem+json"));
            Probe {
                what,
                status: r.status().as_u16(),
                took,
                retry_after,
                problem_json,
            }
        }
        Err(_) => Probe {
            what,
            status: 0,
            took,
            retry_after: false,
            problem_json: false,
        },
    }
}

/// PostgreSQL unreachable (frozen with SIGSTOP) for `outage`: Comb must stay up, answer
/// `/ready` with 503 and requests promptly with a problem+json 503 and `Retry-After`, and
/// serve again within 5 s of the database's return.
pub async fn postgres_unreachable(opts: &Options, outage: Duration) -> Outcome {
    let name = "PostgreSQL unreachable (SIGSTOP) for 30 s";
    let prompt = Duration::from_secs(5);
    let started = Instant::now();
    let pg = cluster().await;
    let url = blocking({
        let pg = pg.clone();
        move || pg.create_database("frozen")
    })
    .await
    .expect("database");
    let server = start_server(&opts.comb, &url).await;
    let base = server.base_url();
    let endpoints = Endpoints::new(vec![base.clone()]);
    let cfg = config("frozen", opts, 30.0 + outage.as_secs_f64());
    Audit::configure(&cfg, &endpoints)
        .await
        .expect("queue configured");
    let http = reqwest::Client::new();
    if until_push_works(&http, &base, Duration::from_secs(10))
        .await
        .is_none()
    {
        panic!("the probe queue cannot be created");
    }
    let audit = Audit::start(cfg, endpoints.clone());
    let mut notes = Vec::new();
    let mut problems = Vec::new();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let fault = Instant::now();
    let frozen = blocking({
        let pg = pg.clone();
        move || pg::freeze(&pg)
    })
    .await
    .expect("PostgreSQL freezes");
    notes.push(format!("froze {} PostgreSQL processes", frozen.processes()));
    let mut probes = Vec::new();
    let kinds = ["ready", "push", "pop", "ack", "configure"];
    let mut i = 0;
    while fault.elapsed() + Duration::from_secs(1) < outage {
        probes.push(probe(&http, &base, kinds[i % kinds.len()]).await);
        i += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if let Some(rest) = outage.checked_sub(fault.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    if !alive(server.pid()) {
        problems.push("comb exited while PostgreSQL was unreachable".into());
    }
    blocking(move || frozen.thaw())
        .await
        .expect("PostgreSQL thaws");
    match until_push_works(&http, &base, Duration::from_secs(30)).await {
        Some(d) => {
            notes.push(format!(
                "service resumed {:.2} s after PostgreSQL returned",
                d.as_secs_f64()
            ));
            if d > Duration::from_secs(5) {
                problems.push(format!(
                    "service resumed only {:.2} s after PostgreSQL returned (limit 5 s)",
                    d.as_secs_f64()
                ));
            }
        }
        None => problems.push("service did not resume within 30 s".into()),
    }
    audit.record_fault("PostgreSQL unreachable", fault, Instant::now());
    // Judge the probes: the first second may still be in flight to the database.
    let slowest = probes.iter().map(|p| p.took).max().unwrap_or_default();
    let mut by_kind: Vec<String> = Vec::new();
    for k in kinds {
        let ps: Vec<&Probe> = probes.iter().filter(|p| p.what == k).collect();
        let statuses: Vec<String> = ps.iter().map(|p| p.status.to_string()).collect();
        let max = ps.iter().map(|p| p.took).max().unwrap_or_default();
        by_kind.push(format!(
            "{k}: {} (max {:.2} s)",
            statuses.join(","),
            max.as_secs_f64()
        ));
    }
    notes.push(format!(
        "{} requests during the outage, slowest answer {:.2} s; {}",
        probes.len(),
        slowest.as_secs_f64(),
        by_kind.join("; ")
    ));
    for p in &probes {
        if p.status != 503 {
            problems.push(format!(
                "{} answered {} during the outage",
                p.what, p.status
            ));
        } else if p.what != "ready" && !(p.retry_after && p.problem_json) {
            problems.push(format!(
                "{} answered 503 without problem+json and Retry-After",
                p.what
            ));
        }
        if p.took > prompt {
            problems.push(format!(
                "{} took {:.2} s to answer during the outage",
                p.what,
                p.took.as_secs_f64()
            ));
        }
    }
    let mut out = finish(name, audit, started, notes, problems).await;
    check_log(&server, "server", &mut out.problems);
    dump_cursors(&pg, &url, &mut out).await;
    out
}

/// Two servers on one database, consumers spread over both; one is killed mid-run and not
/// restarted, so its clients move to the other.
pub async fn two_servers(opts: &Options) -> Outcome {
    let name = "two servers on one database, one killed mid-run";
    let started = Instant::now();
    let pg = cluster().await;
    let url = blocking({
        let pg = pg.clone();
        move || pg.create_database("pair")
    })
    .await
    .expect("database");
    let a = start_server(&opts.comb, &url).await;
    let mut b = start_server(&opts.comb, &url).await;
    let endpoints = Endpoints::new(vec![a.base_url(), b.base_url()]);
    let mut cfg = config("pair", opts, 50.0);
    cfg.consumers_per_group = 4;
    Audit::configure(&cfg, &endpoints)
        .await
        .expect("queue configured");
    let audit = Audit::start(cfg, endpoints.clone());
    tokio::time::sleep(Duration::from_secs(20)).await;
    let fault = Instant::now();
    let accepted = audit.accepted();
    check_log(&b, "killed server", &mut Vec::new());
    // Not removed from the endpoints: its clients find out from refused connections and
    // move on, as real clients would.
    b.kill();
    audit.record_fault("kill -9 of one of two servers", fault, Instant::now());
    let notes = vec![format!("second server killed at {accepted} accepted")];
    let mut out = finish(name, audit, started, notes, Vec::new()).await;
    check_log(&a, "surviving server", &mut out.problems);
    if !alive(a.pid()) {
        out.problems.push("the surviving server exited".into());
    }
    out
}

/// One worker of a Citus cluster (coordinator and two workers) stopped under load for
/// `outage`, then started again. Producers push one message at a time and retry it until it
/// is accepted (each keeps its order), so each soon waits on a partition of the stopped
/// worker; consumers pop the queue, served by the live worker's partitions while it is down
/// (docs/scale-out.md, "A worker lost"; what they served meanwhile is counted).
/// Requests that need the stopped worker must be answered 503 (counted), never 500, and once
/// it is back every accepted message must be delivered, in order, with nothing lost.
pub async fn worker_lost(opts: &Options, outage: Duration) -> Outcome {
    let name = format!(
        "a Citus worker stopped for {} s under load, then restarted",
        outage.as_secs()
    );
    let started = Instant::now();
    // Citus's recovery of two-phase commits as it runs by default (the harness turns it off
    // for tests that count them): a transaction prepared on the worker when it stopped
    // holds its locks, and its partitions wait, until recovery finishes it.
    let settings = [
        ("synchronous_commit", "on"),
        ("citus.recover_2pc_interval", "10s"),
    ];
    let citus = blocking(move || Citus::start_with(&settings))
        .await
        .expect("the Citus cluster starts");
    let citus = Arc::new(citus);
    let url = blocking({
        let citus = citus.clone();
        move || citus.create_database("lost")
    })
    .await
    .expect("database");
    let server = start_server(&opts.comb, &url).await;
    let endpoints = Endpoints::new(vec![server.base_url()]);
    let mut cfg = config("lost", opts, 40.0 + outage.as_secs_f64());
    // One message a push: a push names one partition, so only the stopped worker's wait.
    cfg.push_batch = 1;
    cfg.producers = 8;
    Audit::configure(&cfg, &endpoints)
        .await
        .expect("queue configured");
    let audit = Audit::start(cfg, endpoints.clone());
    let mut notes = Vec::new();
    let mut problems = Vec::new();
    tokio::time::sleep(Duration::from_secs(15)).await;
    // Accepted, delivered, answered 503, pops that delivered and acks answered 200 so far.
    let count = |audit: &Audit| {
        let stats = audit.stats();
        let n = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        [
            audit.accepted(),
            audit.delivered(),
            n(&stats.status_503),
            n(&stats.pops_served),
            n(&stats.acks_served),
        ]
    };
    let at_stop = count(&audit);
    let fault = Instant::now();
    blocking({
        let citus = citus.clone();
        move || citus.workers()[1].stop("fast")
    })
    .await
    .expect("the worker stops");
    tokio::time::sleep(outage).await;
    let at_return = count(&audit);
    if !alive(server.pid()) {
        problems.push("comb exited while a worker was down".into());
    }
    blocking({
        let citus = citus.clone();
        move || citus.workers()[1].restart()
    })
    .await
    .expect("the worker restarts");
    // What Citus's maintenance does every `citus.recover_2pc_interval`, at once: commit or
    // roll back what was left prepared on the worker, whose locks hold its partitions.
    let db = url.rsplit('/').next().unwrap_or_default().to_string();
    let recovered = blocking({
        let citus = citus.clone();
        move || {
            citus
                .coordinator()
                .psql(&db, "SELECT recover_prepared_transactions()")
        }
    })
    .await;
    match recovered {
        Ok(n) => notes.push(format!(
            "{n} transactions left prepared on the worker, recovered"
        )),
        Err(e) => problems.push(format!("recovery of prepared transactions failed: {e}")),
    }
    audit.record_fault("Citus worker stopped", fault, Instant::now());
    notes.push(format!(
        "worker stopped at {} accepted; while it was down: {} accepted, {} delivered, {} \
         answers 503",
        at_stop[0],
        at_return[0] - at_stop[0],
        at_return[1] - at_stop[1],
        at_return[2] - at_stop[2]
    ));
    // Every partition of the stopped worker waits for it, so whatever was served meanwhile
    // was served by the live worker's partitions.
    let served = [at_return[3] - at_stop[3], at_return[4] - at_stop[4]];
    notes.push(format!(
        "served on the live worker's partitions while it was down: {} pops delivered, {} ack \
         requests answered 200",
        served[0], served[1]
    ));
    let mut out = finish(&name, audit, started, notes, problems).await;
    check_log(&server, "server", &mut out.problems);
    if !out.passed() {
        keep_log(&server, "worker-lost", &mut out);
    }
    out
}

/// Keeps a failed scenario's server log (the server's own goes with it): copied to
/// `target/chaos-<what>-comb.log`, and the lines naming the request ids of the 5xx samples
/// added to the notes, so a failure's cause can be read after the run.
fn keep_log(server: &Server, what: &str, out: &mut Outcome) {
    let log = server.log_tail(usize::MAX);
    let path = format!("target/chaos-{what}-comb.log");
    match std::fs::write(&path, &log) {
        Ok(()) => out.notes.push(format!("server log kept in {path}")),
        Err(e) => out
            .notes
            .push(format!("server log not kept in {path}: {e}")),
    }
    let ids: Vec<String> = out
        .notes
        .iter()
        .filter(|n| n.starts_with("5xx sample:"))
        .filter_map(|n| {
            let (_, rest) = n.split_once("\"requestId\":\"")?;
            Some(rest.split('"').next()?.to_string())
        })
        .collect();
    for id in ids {
        for line in log.lines().filter(|l| l.contains(&id)) {
            out.notes.push(format!("server log: {line}"));
        }
    }
}
