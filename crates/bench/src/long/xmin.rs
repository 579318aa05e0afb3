//! `comb-bench xmin`: Comb and the SKIP LOCKED peer under a held snapshot (`make bench-xmin`,
//! see "Held snapshot" in `docs/long-runs.md`).
//!
//! One PostgreSQL cluster with the suite's durable settings and autovacuum at its defaults.
//! Comb and the SKIP LOCKED table run one after the other (or at the same time, with
//! `--side-by-side`), each in a database of its own, each at the same fixed rate (one message
//! per push or `INSERT`). One after the other is the default because under the held snapshot
//! the table's dequeuers take more than a core of a small machine to rescan their dead rows,
//! and side by side that is what Comb's latency would measure. After a clean phase, one session
//! per database opens a `REPEATABLE READ` transaction, takes a snapshot and stays idle in it (vacuum's
//! horizon is per database, so one session per database holds back vacuum of both); after the
//! held phase it commits and the run goes on for a released phase. Every sample interval the
//! tool records, per system: delivered messages per second, end-to-end p99 of the deliveries in
//! the interval, dead tuples (`pg_stat_user_tables.n_dead_tup`) and total size
//! (`pg_total_relation_size`) of all the system's tables, and the CPU its processes used.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio_postgres::Client;

use super::{Common, Counters, Finished, Mark, Report, Session, block_on, machine_load, ticks};
use crate::http::BoxError;
use crate::load::{self, Rate};
use crate::meter::{Meter, Snapshot, usage};
use crate::peers::{self, DEQUEUE_SQL, ENQUEUE_SQL, SKIP_LOCKED_SCHEMA};
use crate::procstat;
use crate::profile;
use crate::report::{Check, Section, Verdict, align, checks_text, num};
use crate::stats::{Window, histogram, mean, now_us, quantile_ms};
use crate::tables::{TableStat, is_message_table, tables};

/// Runs Comb and then the SKIP LOCKED peer (or both at once) through a clean phase, a phase
/// with a `REPEATABLE READ` snapshot held open in each database, and a phase after its release.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Offered rate of each system, messages per second (one message per push / INSERT).
    #[arg(long, default_value_t = 300.0)]
    rate: f64,
    /// Seconds of load before the clean phase starts (not sampled).
    #[arg(long, default_value_t = 10.0)]
    warmup_s: f64,
    /// Seconds without a held snapshot.
    #[arg(long, default_value_t = 180.0)]
    clean_s: f64,
    /// Seconds with a `REPEATABLE READ` snapshot held open in each database.
    #[arg(long, default_value_t = 600.0)]
    held_s: f64,
    /// Seconds after the snapshot is released.
    #[arg(long, default_value_t = 180.0)]
    released_s: f64,
    /// Seconds between samples.
    #[arg(long, default_value_t = 10.0)]
    sample_s: f64,
    /// A quick development run: 5 s warm-up, 20/40/20 s phases, 10 s segments, 20 s
    /// retention, 5 s maintenance. Its numbers mean nothing and nothing is written.
    #[arg(long)]
    smoke: bool,
    /// Which systems to run (comma-separated: comb, skiplocked).
    #[arg(long, default_value = "comb,skiplocked")]
    systems: String,
    /// Partitions of Comb's queue (each push picks one at random).
    #[arg(long, default_value_t = 100)]
    partitions: usize,
    /// Comb producer connections sharing the fixed-rate schedule.
    #[arg(long, default_value_t = 50)]
    producers: usize,
    /// Comb consumer connections (pop with long poll, then ack the batch).
    #[arg(long, default_value_t = 4)]
    consumers: usize,
    /// Pop batch size.
    #[arg(long, default_value_t = 50)]
    batch: usize,
    /// `comb serve --segment-seconds`.
    #[arg(long, default_value_t = 60)]
    segment_seconds: u64,
    /// `comb serve --maintenance-interval-ms`.
    #[arg(long, default_value_t = 10_000)]
    maintenance_interval_ms: u64,
    /// `retentionSeconds` of the queue.
    #[arg(long, default_value_t = 120)]
    retention_s: u64,
    /// SKIP LOCKED enqueue connections sharing the fixed-rate schedule.
    #[arg(long, default_value_t = 8)]
    sl_enqueuers: usize,
    /// SKIP LOCKED dequeue connections (closed loop, one row per transaction).
    #[arg(long, default_value_t = 4)]
    sl_dequeuers: usize,
    /// Milliseconds a SKIP LOCKED dequeuer that found nothing waits before trying again.
    #[arg(long, default_value_t = 1)]
    sl_poll_ms: u64,
    /// The server, the JSON file (the samples), the page section and the record.
    #[command(flatten)]
    common: Common,
    /// Load pg_stat_statements and report the statements of the clean and the held phase
    /// (cluster-wide: with both systems running it mixes their statements). Costs some CPU.
    #[arg(long)]
    statements: bool,
    /// Run both systems at the same time, instead of Comb's phases and then the peer's.
    #[arg(long)]
    side_by_side: bool,
}

const COMB: &str = "comb";
const SKIPLOCKED: &str = "skiplocked";

/// Age in transactions of the oldest snapshot or transaction in this database.
const XMIN_AGE_SQL: &str = "
SELECT max(greatest(age(backend_xmin), age(backend_xid)))::int8
FROM pg_stat_activity WHERE datname = current_database()";

/// Phases of a run, in seconds from the start of the clean phase.
#[derive(Debug, Clone, Copy)]
struct Plan {
    warmup: f64,
    clean: f64,
    held: f64,
    released: f64,
    sample: f64,
}

impl Plan {
    fn hold_start(&self) -> f64 {
        self.clean
    }
    fn hold_end(&self) -> f64 {
        self.clean + self.held
    }
    fn total(&self) -> f64 {
        self.clean + self.held + self.released
    }
    /// The phase an interval ending at `t` belongs to (by its midpoint).
    fn phase(&self, t_end: f64, len: f64) -> &'static str {
        let mid = t_end - len / 2.0;
        if mid < self.hold_start() {
            "clean"
        } else if mid < self.hold_end() {
            "held"
        } else {
            "released"
        }
    }
}

/// Settings of one run after `--smoke` is applied.
#[derive(Debug, Clone)]
struct Setup {
    plan: Plan,
    comb: bool,
    skiplocked: bool,
    segment_seconds: u64,
    maintenance_ms: u64,
    retention_s: u64,
}

fn setup(args: &Args) -> Result<Setup, BoxError> {
    let mut comb = false;
    let mut skiplocked = false;
    for s in args.systems.split([',', ' ']).filter(|s| !s.is_empty()) {
        match s {
            COMB => comb = true,
            SKIPLOCKED => skiplocked = true,
            other => return Err(format!("unknown system `{other}` (comb, skiplocked)").into()),
        }
    }
    if !comb && !skiplocked {
        return Err("no system to run".into());
    }
    if args.smoke {
        return Ok(Setup {
            plan: Plan {
                warmup: 5.0,
                clean: 20.0,
                held: 40.0,
                released: 20.0,
                sample: 5.0,
            },
            comb,
            skiplocked,
            segment_seconds: 10,
            maintenance_ms: 5_000,
            retention_s: 20,
        });
    }
    if args.sample_s <= 0.0 || args.clean_s <= 0.0 || args.held_s < 0.0 || args.released_s < 0.0 {
        return Err("phase and sample lengths must be positive".into());
    }
    Ok(Setup {
        plan: Plan {
            warmup: args.warmup_s.max(0.0),
            clean: args.clean_s,
            held: args.held_s,
            released: args.released_s,
            sample: args.sample_s,
        },
        comb,
        skiplocked,
        segment_seconds: args.segment_seconds,
        maintenance_ms: args.maintenance_interval_ms,
        retention_s: args.retention_s,
    })
}

/// Runs the held-snapshot comparison and writes its records.
pub fn run(args: Args) -> Result<(), BoxError> {
    let setup = setup(&args)?;
    let extra = if args.statements {
        profile::PG_SETTINGS
    } else {
        &[]
    };
    let session = Session::start(&args.common, setup.comb, extra)?;
    let pg = &session.cluster.pg;
    let comb_url = setup
        .comb
        .then(|| pg.create_database("xmin_comb"))
        .transpose()?;
    let sl_url = setup
        .skiplocked
        .then(|| pg.create_database("xmin_sl"))
        .transpose()?;
    let mut server = match &comb_url {
        Some(url) => Some(session.serve(
            &args.common,
            url,
            setup.segment_seconds,
            setup.maintenance_ms,
        )?),
        None => None,
    };
    let comb_server = server.as_ref().map(|s| (s.addr(), s.pid()));
    let out = if args.side_by_side || comb_url.is_none() || sl_url.is_none() {
        block_on(measure(
            &args,
            &setup,
            comb_url.as_deref(),
            sl_url.as_deref(),
            comb_server,
        ))??
    } else {
        let comb = block_on(measure(
            &args,
            &setup,
            comb_url.as_deref(),
            None,
            comb_server,
        ))??;
        drop(server.take());
        // Autovacuum of Comb's database would run into the table's clean phase: it goes first.
        if let (Some(comb_db), Some(sl_db)) = (&comb_url, &sl_url) {
            let drop_db = format!("DROP DATABASE \"{}\" WITH (FORCE)", db_name(comb_db));
            block_on(async {
                let c = peers::connect(sl_db).await?;
                c.batch_execute(&drop_db).await?;
                Ok::<(), BoxError>(())
            })??;
        }
        eprintln!("Comb's phases done; the SKIP LOCKED table's follow");
        let peer = block_on(measure(&args, &setup, None, sl_url.as_deref(), None))??;
        comb.followed_by(peer)
    };
    drop(server);

    let report = render(&args, &setup, &out);
    session.finish(
        &args.common.out,
        args.smoke,
        Finished {
            report: &report,
            name: "xmin",
            results: &out.samples,
            section: &XMIN_SECTION,
        },
    )
}

/// One sample of one system: the JSON rows of `bench/results/xmin.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Sample {
    /// `comb` or `skiplocked`.
    system: String,
    /// `clean`, `held` or `released`.
    phase: String,
    /// End of the sample interval, seconds from the start of the clean phase.
    t_s: f64,
    /// Messages delivered (Comb: returned by pops; SKIP LOCKED: dequeued) per second.
    msgs_per_sec: f64,
    /// End-to-end p99 (send → receipt) of the messages delivered in the interval, ms.
    e2e_p99_ms: Option<f64>,
    /// `n_dead_tup` of all the system's tables together.
    dead_tuples: i64,
    /// `n_dead_tup` of message storage (Comb: the `messages_*` segment tables).
    message_dead_tuples: i64,
    /// `pg_total_relation_size` of all the system's tables (with indexes and TOAST).
    total_bytes: i64,
    /// Messages accepted per second.
    pushed_per_sec: f64,
    /// Accepted but not yet delivered, at the end of the interval.
    backlog: i64,
    /// CPU cores used by the system: Comb's broker process plus its database's backends;
    /// for SKIP LOCKED its database's backends.
    cpu_cores: f64,
    /// Share of the machine's CPU time that was busy.
    machine_busy: f64,
    /// CPU cores used by processes outside this run (neighbours on a shared machine).
    other_cpu_cores: f64,
    /// Age in transactions of the oldest snapshot in the system's database.
    oldest_xmin_age: Option<i64>,
}

/// What the running load of one system exposes to the sampler.
struct Live {
    name: &'static str,
    /// The schema whose tables are the system's.
    schema: &'static str,
    /// A connection to the system's database for sampling.
    stats: Client,
    datname: String,
    counters: Counters,
    broker_pid: Option<u32>,
}

/// Per-table statistics of one system at the moments that matter.
#[derive(Default)]
struct Snapshots {
    end_clean: Vec<TableStat>,
    end_hold: Vec<TableStat>,
    end_run: Vec<TableStat>,
}

/// Everything a run measured.
struct Outcome {
    samples: Vec<Sample>,
    /// Per system: merged e2e histogram of each phase.
    phase_e2e: HashMap<(&'static str, &'static str), Histogram<u64>>,
    snapshots: HashMap<&'static str, Snapshots>,
    hold_info: Vec<String>,
    errors: HashMap<&'static str, u64>,
    /// pg_stat_statements reports per phase (with `--statements`).
    statements: Vec<(String, String)>,
}

impl Outcome {
    /// This run's figures and those of `next`, run after it on the same timeline (one system
    /// each).
    fn followed_by(mut self, next: Outcome) -> Outcome {
        self.samples.extend(next.samples);
        self.samples.sort_by(|a, b| a.t_s.total_cmp(&b.t_s));
        self.phase_e2e.extend(next.phase_e2e);
        self.snapshots.extend(next.snapshots);
        self.hold_info.extend(next.hold_info);
        for (name, n) in next.errors {
            *self.errors.entry(name).or_default() += n;
        }
        self.statements.extend(next.statements);
        self
    }
}

async fn measure(
    args: &Args,
    setup: &Setup,
    comb_url: Option<&str>,
    sl_url: Option<&str>,
    comb_server: Option<(SocketAddr, u32)>,
) -> Result<Outcome, BoxError> {
    let plan = setup.plan;
    let mut lives: Vec<Live> = Vec::new();
    let mut urls: Vec<&str> = Vec::new();
    let errors: HashMap<&'static str, Arc<AtomicU64>> = [COMB, SKIPLOCKED]
        .into_iter()
        .map(|s| (s, Arc::new(AtomicU64::new(0))))
        .collect();

    // Set-up of both systems before any load starts.
    let mut comb_filled = 0;
    if let (Some(url), Some((addr, _))) = (comb_url, comb_server) {
        load::configure(
            addr,
            &format!("{{\"retentionSeconds\":{}}}", setup.retention_s),
        )
        .await?;
        // One message per partition creates the partitions; they count as pushed.
        comb_filled = load::fill(addr, args.partitions, 1, 4).await?;
        urls.push(url);
    }
    if let Some(url) = sl_url {
        peers::connect(url)
            .await?
            .batch_execute(SKIP_LOCKED_SCHEMA)
            .await?;
        urls.push(url);
    }
    for url in &urls {
        let c = peers::connect(url).await?;
        c.batch_execute("ANALYZE; CHECKPOINT").await?;
        if args.statements {
            profile::prepare(&c).await?;
        }
    }

    let load_start = Instant::now();
    let clean_start = load_start + Duration::from_secs_f64(plan.warmup);
    let end = clean_start + Duration::from_secs_f64(plan.total());
    let whole = Window {
        start: load_start,
        end,
    };
    let mut loads = Vec::new();

    if let (Some(url), Some((addr, pid))) = (comb_url, comb_server) {
        let live = Live {
            name: COMB,
            schema: "comb",
            stats: peers::connect(url).await?,
            datname: db_name(url),
            counters: Counters::new(comb_filled),
            broker_pid: Some(pid),
        };
        let rate = Rate {
            msgs_per_sec: args.rate,
            msgs_per_req: 1,
            conns: args.producers,
            partitions: args.partitions,
        };
        let pushed = live.counters.pushed.clone();
        loads.push(tokio::spawn(async move {
            let t = load::open_push(addr, rate, whole, pushed).await;
            if t.errors > 0 {
                eprintln!("  comb: {} pushes failed", t.errors);
            }
        }));
        for _ in 0..args.consumers {
            loads.push(tokio::spawn(load::consume_live(
                addr,
                args.batch,
                end,
                live.counters.delivered.clone(),
                live.counters.e2e.clone(),
                errors[COMB].clone(),
            )));
        }
        lives.push(live);
    }
    if let Some(url) = sl_url {
        let live = Live {
            name: SKIPLOCKED,
            schema: "public",
            stats: peers::connect(url).await?,
            datname: db_name(url),
            counters: Counters::new(0),
            broker_pid: None,
        };
        let next = Arc::new(AtomicU64::new(0));
        let interval = 1.0 / args.rate;
        for _ in 0..args.sl_enqueuers {
            loads.push(tokio::spawn(sl_enqueuer(
                peers::connect(url).await?,
                load_start,
                interval,
                end,
                next.clone(),
                live.counters.pushed.clone(),
                errors[SKIPLOCKED].clone(),
            )));
        }
        for _ in 0..args.sl_dequeuers {
            loads.push(tokio::spawn(sl_dequeuer(
                peers::connect(url).await?,
                Duration::from_millis(args.sl_poll_ms),
                end,
                live.counters.delivered.clone(),
                live.counters.e2e.clone(),
                errors[SKIPLOCKED].clone(),
            )));
        }
        lives.push(live);
    }
    eprintln!(
        "load started: {} msg/s per system; {:.0} s warm-up, then clean {:.0} s, held {:.0} s, \
         released {:.0} s, a sample every {:.0} s",
        args.rate, plan.warmup, plan.clean, plan.held, plan.released, plan.sample
    );

    // Timeline: sample ticks, and the hold's start and end (after the tick at the same time).
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Event {
        Sample,
        Hold,
        Release,
    }
    let mut events: Vec<(f64, Event)> = ticks(plan.total(), plan.sample)
        .into_iter()
        .map(|t| (t, Event::Sample))
        .collect();
    if plan.held > 0.0 {
        events.push((plan.hold_start(), Event::Hold));
        events.push((plan.hold_end(), Event::Release));
    }
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then((a.1 as u8).cmp(&(b.1 as u8))));

    tokio::time::sleep_until(clean_start.into()).await;
    let broker_pid = lives.iter().find_map(|l| l.broker_pid);
    let meter = Meter::new(broker_pid, peers::connect(urls[0]).await?).await?;
    let mut sampler = Sampler::new(&lives, meter).await;
    let mut out = Outcome {
        samples: Vec::new(),
        phase_e2e: HashMap::new(),
        snapshots: HashMap::new(),
        hold_info: Vec::new(),
        errors: HashMap::new(),
        statements: Vec::new(),
    };
    if args.statements {
        profile::reset(&lives[0].stats).await;
    }
    let mut holders: Vec<Client> = Vec::new();
    let mut last_tick = 0.0;
    for (t, event) in events {
        tokio::time::sleep_until((clean_start + Duration::from_secs_f64(t)).into()).await;
        match event {
            Event::Sample => {
                let rows = sampler
                    .sample(&lives, t, t - last_tick, &plan, &mut out)
                    .await;
                last_tick = t;
                let line: Vec<String> = rows
                    .iter()
                    .map(|s| {
                        format!(
                            "{} {:.0} msg/s p99 {} ms dead {} {:.1} MB",
                            s.system,
                            s.msgs_per_sec,
                            num(s.e2e_p99_ms),
                            s.dead_tuples,
                            s.total_bytes as f64 / 1e6
                        )
                    })
                    .collect();
                eprintln!("  {:>5.0} s {:<8} {}", t, rows[0].phase, line.join(" | "));
            }
            Event::Hold => {
                for live in &lives {
                    let snap = tables(&live.stats, live.schema).await.unwrap_or_default();
                    out.snapshots.entry(live.name).or_default().end_clean = snap;
                }
                if args.statements {
                    let text = profile::statements(&lives[0].stats, plan.hold_start()).await;
                    out.statements
                        .push((format!("{} clean", names(&lives)), text));
                    profile::reset(&lives[0].stats).await;
                }
                for url in &urls {
                    holders.push(hold(url).await?);
                }
                let info = describe_holders(&lives[0].stats).await;
                eprintln!("  snapshot held: {}", info.join("; "));
                out.hold_info = info;
            }
            Event::Release => {
                for live in &lives {
                    let snap = tables(&live.stats, live.schema).await.unwrap_or_default();
                    out.snapshots.entry(live.name).or_default().end_hold = snap;
                }
                if args.statements {
                    let text = profile::statements(&lives[0].stats, plan.held).await;
                    out.statements
                        .push((format!("{} held", names(&lives)), text));
                }
                for h in holders.drain(..) {
                    h.batch_execute("COMMIT").await?;
                }
                eprintln!("  snapshot released");
            }
        }
    }
    for live in &lives {
        let snap = tables(&live.stats, live.schema).await.unwrap_or_default();
        out.snapshots.entry(live.name).or_default().end_run = snap;
    }
    for l in loads {
        let _ = l.await;
    }
    for (name, e) in errors {
        out.errors.insert(name, e.load(Ordering::Relaxed));
    }
    Ok(out)
}

/// The systems running, for labels.
fn names(lives: &[Live]) -> String {
    lives
        .iter()
        .map(|l| l.name)
        .collect::<Vec<_>>()
        .join(" and ")
}

fn db_name(url: &str) -> String {
    url.rsplit('/').next().unwrap_or_default().to_string()
}

/// Opens a `REPEATABLE READ` transaction, takes its snapshot, and leaves it idle.
async fn hold(url: &str) -> Result<Client, BoxError> {
    let c = peers::connect(url).await?;
    c.batch_execute(
        "SET application_name = 'xmin holder';
         BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1; SELECT count(*) FROM pg_class;",
    )
    .await?;
    Ok(c)
}

/// The holders as PostgreSQL sees them (database, state, snapshot xmin).
async fn describe_holders(client: &Client) -> Vec<String> {
    match client
        .query(
            "SELECT datname::text, state, backend_xmin::text FROM pg_stat_activity
             WHERE application_name = 'xmin holder' ORDER BY datname",
            &[],
        )
        .await
    {
        Ok(rows) => rows
            .iter()
            .map(|r| {
                format!(
                    "{}: {}, backend_xmin {}",
                    r.get::<_, Option<String>>(0).unwrap_or_default(),
                    r.get::<_, Option<String>>(1).unwrap_or_default(),
                    r.get::<_, Option<String>>(2)
                        .unwrap_or_else(|| "none".into())
                )
            })
            .collect(),
        Err(e) => vec![format!("could not read pg_stat_activity: {e}")],
    }
}

/// A fixed-rate enqueuer: row `i` of the shared schedule is due at `start + i * interval`.
async fn sl_enqueuer(
    client: Client,
    start: Instant,
    interval: f64,
    end: Instant,
    next: Arc<AtomicU64>,
    pushed: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
) {
    let Ok(stmt) = client.prepare(ENQUEUE_SQL).await else {
        errors.fetch_add(1, Ordering::Relaxed);
        return;
    };
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let due = start + Duration::from_secs_f64(i as f64 * interval);
        if due >= end {
            break;
        }
        tokio::time::sleep_until(due.into()).await;
        match client.execute(&stmt, &[&load::payload(now_us())]).await {
            Ok(_) => {
                pushed.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                if errors.fetch_add(1, Ordering::Relaxed) < 5 {
                    eprintln!("  skiplocked enqueue error: {e}");
                }
            }
        }
    }
}

/// A dequeuer: one row per transaction, closed loop; waits `poll` when the queue is empty.
async fn sl_dequeuer(
    client: Client,
    poll: Duration,
    end: Instant,
    delivered: Arc<AtomicU64>,
    e2e: Arc<Mutex<Histogram<u64>>>,
    errors: Arc<AtomicU64>,
) {
    let Ok(stmt) = client.prepare(DEQUEUE_SQL).await else {
        errors.fetch_add(1, Ordering::Relaxed);
        return;
    };
    while Instant::now() < end {
        match client.query_opt(&stmt, &[]).await {
            Ok(Some(row)) => {
                let sent: i64 = row.get(0);
                e2e.lock()
                    .expect("not poisoned")
                    .saturating_record(now_us().saturating_sub(sent as u64).max(1));
                delivered.fetch_add(1, Ordering::Relaxed);
            }
            Ok(None) => tokio::time::sleep(poll).await,
            Err(e) => {
                if errors.fetch_add(1, Ordering::Relaxed) < 5 {
                    eprintln!("  skiplocked dequeue error: {e}");
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Counter readings at the previous sample.
struct Sampler {
    at: Instant,
    /// Where each system's interval began, in the order of the systems.
    marks: Vec<Mark>,
    /// CPU ticks per process (broker and backends) at the previous sample.
    proc_ticks: HashMap<u32, u64>,
    /// The whole machine's CPU: PostgreSQL, the broker, this process and the neighbours.
    meter: Meter,
    snapshot: Snapshot,
}

impl Sampler {
    /// Starts counting now: the warm-up's deliveries and latencies are discarded.
    async fn new(lives: &[Live], meter: Meter) -> Sampler {
        let mut s = Sampler {
            at: Instant::now(),
            marks: lives.iter().map(|l| l.counters.mark()).collect(),
            proc_ticks: HashMap::new(),
            snapshot: meter.snapshot().await,
            meter,
        };
        for live in lives {
            let _ = s.system_ticks(live).await;
        }
        s
    }

    /// CPU ticks used since the previous reading by the system's processes: the broker and
    /// the backends (and autovacuum workers) of its database. Processes that came and went
    /// between two readings are missed.
    async fn system_ticks(&mut self, live: &Live) -> u64 {
        let mut pids: Vec<u32> = live.broker_pid.into_iter().collect();
        if let Ok(rows) = live
            .stats
            .query(
                "SELECT pid FROM pg_stat_activity WHERE datname = $1",
                &[&live.datname],
            )
            .await
        {
            pids.extend(rows.iter().map(|r| r.get::<_, i32>(0) as u32));
        }
        let mut used = 0;
        for pid in pids {
            if let Ok(stat) = procstat::read_stat(pid) {
                let now = stat.own();
                let before = self.proc_ticks.insert(pid, now).unwrap_or(0);
                used += now.saturating_sub(before);
            }
        }
        used
    }

    /// The samples of every system for the interval ending at `t` (seconds from the start
    /// of the clean phase), `len` seconds long.
    async fn sample(
        &mut self,
        lives: &[Live],
        t: f64,
        len: f64,
        plan: &Plan,
        out: &mut Outcome,
    ) -> Vec<Sample> {
        let now = Instant::now();
        let secs = (now - self.at).as_secs_f64().max(1e-3);
        self.at = now;
        let phase = plan.phase(t, len);
        let snapshot = self.meter.snapshot().await;
        let machine = usage(&self.snapshot, &snapshot);
        self.snapshot = snapshot;
        let mut rows = Vec::new();
        for (i, live) in lives.iter().enumerate() {
            let interval = live.counters.interval(&mut self.marks[i]);
            let h = interval.e2e;
            let ticks = self.system_ticks(live).await;
            let stats = tables(&live.stats, live.schema).await.unwrap_or_default();
            let xmin_age = live
                .stats
                .query_one(XMIN_AGE_SQL, &[])
                .await
                .ok()
                .and_then(|r| r.get::<_, Option<i64>>(0));
            let sample = Sample {
                system: live.name.to_string(),
                phase: phase.to_string(),
                t_s: (t * 10.0).round() / 10.0,
                msgs_per_sec: interval.delivered as f64 / secs,
                e2e_p99_ms: quantile_ms(&h, 0.99),
                dead_tuples: stats.iter().map(|s| s.dead).sum(),
                message_dead_tuples: stats
                    .iter()
                    .filter(|s| live.name != COMB || is_message_table(&s.name))
                    .map(|s| s.dead)
                    .sum(),
                total_bytes: stats.iter().map(|s| s.total_bytes).sum(),
                pushed_per_sec: interval.pushed as f64 / secs,
                backlog: interval.backlog,
                cpu_cores: procstat::ticks_to_secs(ticks) / secs,
                machine_busy: machine.machine_busy,
                other_cpu_cores: machine.other_cpu / machine.secs.max(1e-3),
                oldest_xmin_age: xmin_age,
            };
            out.phase_e2e
                .entry((live.name, phase))
                .or_insert_with(histogram)
                .add(&h)
                .expect("same bounds");
            rows.push(sample);
        }
        out.samples.extend(rows.iter().cloned());
        rows
    }
}

/// The held-snapshot section of the benchmarks page.
pub(crate) const XMIN_SECTION: Section = Section {
    heading: "## Held snapshot (make bench-xmin)",
    begin: "<!-- xmin:begin (written by comb-bench xmin; edit outside these markers) -->",
    end: "<!-- xmin:end -->",
};

/// Means and phase-wide p99 of one system.
struct PhaseFigures {
    rate: Option<f64>,
    p99: Option<f64>,
}

fn phase_figures(out: &Outcome, system: &str, phase: &'static str) -> PhaseFigures {
    let xs: Vec<f64> = out
        .samples
        .iter()
        .filter(|s| s.system == system && s.phase == phase)
        .map(|s| s.msgs_per_sec)
        .collect();
    let key = out
        .phase_e2e
        .keys()
        .find(|(s, p)| *s == system && *p == phase)
        .copied();
    PhaseFigures {
        rate: mean(&xs),
        p99: key.and_then(|k| quantile_ms(&out.phase_e2e[&k], 0.99)),
    }
}

fn mb(bytes: i64) -> String {
    format!("{:.1}", bytes as f64 / 1e6)
}

/// The printed report: samples side by side, phase summary, goals, per-table figures.
fn render(args: &Args, setup: &Setup, out: &Outcome) -> Report {
    let plan = setup.plan;
    let mut s = String::new();
    let systems: Vec<&str> = [COMB, SKIPLOCKED]
        .into_iter()
        .filter(|sys| out.samples.iter().any(|x| x.system == *sys))
        .collect();
    let _ = writeln!(
        s,
        "Load: {} msg/s offered to each system, 1 message per push/INSERT. Comb: {} partitions, \
         {} producer connections, {} consumers (pop batch {}, long poll 500 ms, explicit ack), \
         --segment-seconds {} --maintenance-interval-ms {}, retentionSeconds {}. SKIP LOCKED: \
         {} enqueue connections (fixed rate), {} dequeuers (one row per transaction, {} ms poll \
         when empty). Phases: clean {:.0} s, held {:.0} s, released {:.0} s (after {:.0} s \
         warm-up); a sample every {:.0} s; {}.",
        args.rate,
        args.partitions,
        args.producers,
        args.consumers,
        args.batch,
        setup.segment_seconds,
        setup.maintenance_ms,
        setup.retention_s,
        args.sl_enqueuers,
        args.sl_dequeuers,
        args.sl_poll_ms,
        plan.clean,
        plan.held,
        plan.released,
        plan.warmup,
        plan.sample,
        if args.side_by_side || !(setup.comb && setup.skiplocked) {
            "the systems at the same time"
        } else {
            "Comb's phases, then the SKIP LOCKED table's (`busy` and `other`: the first's)"
        },
    );
    if !out.hold_info.is_empty() {
        let _ = writeln!(s, "Held snapshots: {}.", out.hold_info.join("; "));
    }
    let _ = writeln!(s);

    let intro = std::mem::take(&mut s);

    // Side by side: one line per sample time.
    let mut header = vec!["phase".to_string(), "t_s".to_string()];
    for sys in &systems {
        let short = if *sys == COMB { "comb" } else { "sl" };
        for col in [
            "msg/s", "push/s", "e2e p99", "dead", "msg dead", "MB", "backlog", "cpu",
        ] {
            header.push(format!("{short} {col}"));
        }
    }
    header.push("busy".into());
    header.push("other".into());
    let mut lines: Vec<Vec<String>> = Vec::new();
    let mut times: Vec<f64> = out.samples.iter().map(|x| x.t_s).collect();
    times.dedup();
    for t in times {
        let at: Vec<&Sample> = out.samples.iter().filter(|x| x.t_s == t).collect();
        let Some(first) = at.first() else { continue };
        let mut line = vec![first.phase.clone(), format!("{t:.0}")];
        for sys in &systems {
            match at.iter().find(|x| x.system == *sys) {
                Some(x) => {
                    line.push(format!("{:.0}", x.msgs_per_sec));
                    line.push(format!("{:.0}", x.pushed_per_sec));
                    line.push(num(x.e2e_p99_ms));
                    line.push(x.dead_tuples.to_string());
                    line.push(if *sys == COMB {
                        x.message_dead_tuples.to_string()
                    } else {
                        "=".into()
                    });
                    line.push(mb(x.total_bytes));
                    line.push(x.backlog.to_string());
                    line.push(format!("{:.2}", x.cpu_cores));
                }
                None => line.extend(std::iter::repeat_n("-".to_string(), 8)),
            }
        }
        // One after the other, each system's run had the machine to itself: both figures.
        let each = |f: &dyn Fn(&Sample) -> String| {
            let mut v: Vec<String> = at.iter().map(|x| f(x)).collect();
            v.dedup();
            v.join(" / ")
        };
        line.push(each(&|x| format!("{:.0}%", x.machine_busy * 100.0)));
        line.push(each(&|x| format!("{:.2}", x.other_cpu_cores)));
        lines.push(line);
    }
    s.push_str(&align(&header, &lines));
    let _ = writeln!(
        s,
        "(msg/s = delivered; e2e p99 in ms over the interval's deliveries; dead = n_dead_tup of \
         all the system's tables, msg dead = of message storage (for SKIP LOCKED the one table is \
         message storage); MB = pg_total_relation_size of all its tables; cpu = cores used by \
         the broker and the database's backends; busy = whole machine; other = cores used by \
         processes outside this run; \"a / b\": during each system's own run)\n"
    );
    let samples = std::mem::take(&mut s);

    // Phase summary.
    let mut summary = Vec::new();
    for sys in &systems {
        for phase in ["clean", "held", "released"] {
            let f = phase_figures(out, sys, phase);
            let xs: Vec<&Sample> = out
                .samples
                .iter()
                .filter(|x| x.system == *sys && x.phase == phase)
                .collect();
            let Some(last) = xs.last() else { continue };
            let min_rate = xs
                .iter()
                .map(|x| x.msgs_per_sec)
                .fold(f64::INFINITY, f64::min);
            let max_dead = xs.iter().map(|x| x.dead_tuples).max().unwrap_or(0);
            let cpu = mean(&xs.iter().map(|x| x.cpu_cores).collect::<Vec<_>>());
            summary.push(vec![
                sys.to_string(),
                phase.to_string(),
                num(f.rate),
                format!("{min_rate:.0}"),
                num(f.p99),
                max_dead.to_string(),
                last.dead_tuples.to_string(),
                mb(last.total_bytes),
                num(cpu),
            ]);
        }
    }
    let head: Vec<String> = [
        "system",
        "phase",
        "mean msg/s",
        "worst msg/s",
        "e2e p99 ms",
        "max dead",
        "dead at end",
        "MB at end",
        "mean cpu",
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    s.push_str("Per phase:\n\n");
    s.push_str(&align(&head, &summary));
    let busy: Vec<f64> = out.samples.iter().map(|x| x.machine_busy).collect();
    let other: Vec<f64> = out.samples.iter().map(|x| x.other_cpu_cores).collect();
    let _ = writeln!(s, "{}\n", machine_load(&busy, &other));

    if systems.contains(&COMB) {
        s.push_str("Goals (Comb):\n\n");
        s.push_str(&checks_text(&goals(out, setup)));
        s.push('\n');
    }
    if systems.contains(&SKIPLOCKED) {
        s.push_str("SKIP LOCKED under the same load and a hold as long, for comparison:\n\n");
        s.push_str(&peer_lines(out, &plan));
        s.push('\n');
    }
    for sys in &systems {
        if let Some(snap) = out.snapshots.get(sys) {
            let _ = writeln!(
                s,
                "{} tables (pg_stat_user_tables, which lags by up to ~10 s: backends flush their \
                 counters at most once a second while busy, within 10 s when idle):\n",
                if *sys == COMB { "Comb" } else { "SKIP LOCKED" }
            );
            s.push_str(&table_diag(snap));
            s.push('\n');
        }
    }
    for (phase, text) in &out.statements {
        let _ = writeln!(s, "{phase} phase: {text}");
    }
    let errs: Vec<String> = out
        .errors
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| format!("{k}: {n}"))
        .collect();
    if !errs.is_empty() {
        let _ = writeln!(s, "Errors: {}\n", errs.join(", "));
    }
    Report {
        head: intro,
        samples,
        tail: s,
    }
}

/// Per table: dead tuples at the end of the clean phase, at the end of the hold and at the
/// end of the run; updates (and how many were HOT) and deletes during the hold; sizes.
fn table_diag(snap: &Snapshots) -> String {
    let find = |v: &[TableStat], name: &str| v.iter().find(|t| t.name == name).cloned();
    let mut names: Vec<String> = Vec::new();
    for v in [&snap.end_clean, &snap.end_hold, &snap.end_run] {
        for t in v.iter() {
            if !names.contains(&t.name) {
                names.push(t.name.clone());
            }
        }
    }
    names.sort();
    let mut rows = Vec::new();
    // Tables never written nor holding a row at any moment (generations made ahead, a
    // feature the load does not use): counted, not listed.
    let untouched = |t: &Option<TableStat>| {
        t.as_ref()
            .is_none_or(|t| t.live + t.dead + t.ins + t.upd + t.del == 0)
    };
    let mut left_out = 0;
    for name in &names {
        let c = find(&snap.end_clean, name);
        let h = find(&snap.end_hold, name);
        let r = find(&snap.end_run, name);
        if untouched(&c) && untouched(&h) && untouched(&r) {
            left_out += 1;
            continue;
        }
        let dead =
            |t: &Option<TableStat>| t.as_ref().map(|t| t.dead.to_string()).unwrap_or("-".into());
        let size = |t: &Option<TableStat>| {
            t.as_ref()
                .map(|t| format!("{}+{}", mb(t.table_bytes), mb(t.index_bytes)))
                .unwrap_or("-".into())
        };
        let (upd, hot, del, ins) = match (&c, &h) {
            (Some(c), Some(h)) => (
                (h.upd - c.upd).to_string(),
                if h.upd > c.upd {
                    format!(
                        "{:.0}%",
                        100.0 * (h.hot_upd - c.hot_upd) as f64 / (h.upd - c.upd) as f64
                    )
                } else {
                    "-".into()
                },
                (h.del - c.del).to_string(),
                (h.ins - c.ins).to_string(),
            ),
            (None, Some(h)) => (
                h.upd.to_string(),
                "-".into(),
                h.del.to_string(),
                h.ins.to_string(),
            ),
            _ => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        rows.push(vec![
            name.clone(),
            dead(&c),
            dead(&h),
            dead(&r),
            h.as_ref().map(|t| t.live.to_string()).unwrap_or("-".into()),
            ins,
            upd,
            hot,
            del,
            size(&c),
            size(&h),
            size(&r),
            r.as_ref()
                .map(|t| t.vacuums.to_string())
                .unwrap_or("-".into()),
        ]);
    }
    let head: Vec<String> = [
        "table",
        "dead end clean",
        "dead end hold",
        "dead end run",
        "live end hold",
        "ins in hold",
        "upd in hold",
        "HOT",
        "del in hold",
        "MB end clean",
        "MB end hold",
        "MB end run",
        "vacuums",
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    let mut s = align(&head, &rows);
    s.push_str("(MB = heap incl. TOAST + indexes; vacuums = autovacuum and vacuum runs since the table was made; a table missing at a moment shows -)\n");
    if left_out > 0 {
        let _ = writeln!(
            s,
            "({left_out} tables never written and empty at every moment are left out)"
        );
    }
    s
}

/// The goals for Comb, judged from the samples.
fn goals(out: &Outcome, setup: &Setup) -> Vec<Check> {
    let plan = setup.plan;
    let verdict = Verdict::from;
    let comb: Vec<&Sample> = out.samples.iter().filter(|s| s.system == COMB).collect();
    let clean = phase_figures(out, COMB, "clean");
    let held = phase_figures(out, COMB, "held");
    let mut checks = Vec::new();

    // Throughput: the held phase's mean and its last minute, against the clean mean.
    let last_minute: Vec<f64> = comb
        .iter()
        .filter(|s| s.phase == "held" && s.t_s > plan.hold_end() - 60.0)
        .map(|s| s.msgs_per_sec)
        .collect();
    let last = mean(&last_minute);
    let worst = held.rate.zip(last).map(|(a, b)| a.min(b));
    checks.push(Check {
        target: "during the hold Comb keeps >= 95% of its clean throughput",
        measured: match (clean.rate, held.rate, last) {
            (Some(c), Some(h), Some(l)) => format!(
                "clean {c:.0} msg/s; held {h:.0} ({:.0}%), last minute of the hold {l:.0} ({:.0}%)",
                100.0 * h / c,
                100.0 * l / c
            ),
            _ => String::new(),
        },
        verdict: verdict(clean.rate.zip(worst).map(|(c, w)| w >= 0.95 * c)),
    });

    checks.push(Check {
        target: "during the hold Comb's end-to-end p99 <= 2x clean",
        measured: match (clean.p99, held.p99) {
            (Some(c), Some(h)) => format!("clean {c:.1} ms, held {h:.1} ms ({:.2}x)", h / c),
            _ => String::new(),
        },
        verdict: verdict(clean.p99.zip(held.p99).map(|(c, h)| h <= 2.0 * c)),
    });

    let peer = phase_figures(out, SKIPLOCKED, "clean");
    checks.push(Check {
        target: "before the hold Comb's end-to-end p99 <= 2x the SKIP LOCKED table's",
        measured: match (clean.p99, peer.p99) {
            (Some(c), Some(p)) => format!("Comb {c:.1} ms, SKIP LOCKED {p:.1} ms ({:.2}x)", c / p),
            _ => String::new(),
        },
        verdict: verdict(clean.p99.zip(peer.p99).map(|(c, p)| c <= 2.0 * p)),
    });

    let max_msg_dead = comb.iter().map(|s| s.message_dead_tuples).max();
    checks.push(Check {
        target: "message storage shows 0 dead tuples",
        measured: max_msg_dead
            .map(|d| format!("at most {d} in any sample of the run"))
            .unwrap_or_default(),
        verdict: verdict(max_msg_dead.map(|d| d == 0)),
    });

    let end_hold: Option<i64> = out
        .snapshots
        .get(COMB)
        .filter(|s| !s.end_hold.is_empty())
        .map(|s| s.end_hold.iter().map(|t| t.dead).sum());
    let top = out
        .snapshots
        .get(COMB)
        .and_then(|s| s.end_hold.iter().max_by_key(|t| t.dead))
        .map(|t| format!(" (most in {}: {})", t.name, t.dead))
        .unwrap_or_default();
    checks.push(Check {
        target: "all Comb tables together hold <= 10,000 dead tuples at the end of the hold",
        measured: end_hold.map(|d| format!("{d}{top}")).unwrap_or_default(),
        verdict: verdict(end_hold.map(|d| d <= 10_000)),
    });

    // Disk: the steady size is the largest total of the clean phase (segments are made
    // ahead, rolled over and dropped there as in any other phase); from one maintenance
    // cycle after the release on, every sample must be back within 10 % of it.
    let steady = comb
        .iter()
        .filter(|s| s.phase == "clean")
        .map(|s| s.total_bytes)
        .max();
    let cycle = setup.maintenance_ms as f64 / 1000.0;
    let after: Vec<&&Sample> = comb
        .iter()
        .filter(|s| s.phase == "released" && s.t_s >= plan.hold_end() + cycle - 1e-6)
        .collect();
    let end_hold_bytes = comb
        .iter()
        .filter(|s| s.phase == "held")
        .map(|s| s.total_bytes)
        .next_back();
    let largest_after = after.iter().map(|s| s.total_bytes).max();
    checks.push(Check {
        target: "after release, disk returns to its steady size within one maintenance cycle",
        measured: match (steady, after.first(), largest_after) {
            (Some(st), Some(first), Some(big)) => format!(
                "steady (largest clean sample) {} MB; end of hold {} MB; {:.0} s after release {} MB; \
                 largest from then on {} MB ({:.0}% of steady)",
                mb(st),
                end_hold_bytes.map(mb).unwrap_or("-".into()),
                first.t_s - plan.hold_end(),
                mb(first.total_bytes),
                mb(big),
                100.0 * big as f64 / st as f64
            ),
            _ => String::new(),
        },
        verdict: verdict(
            steady
                .zip(largest_after)
                .map(|(st, big)| big as f64 <= 1.10 * st as f64),
        ),
    });
    checks
}

/// The same figures for the SKIP LOCKED table, stated without a verdict.
fn peer_lines(out: &Outcome, plan: &Plan) -> String {
    let clean = phase_figures(out, SKIPLOCKED, "clean");
    let held = phase_figures(out, SKIPLOCKED, "held");
    let released = phase_figures(out, SKIPLOCKED, "released");
    let sl: Vec<&Sample> = out
        .samples
        .iter()
        .filter(|s| s.system == SKIPLOCKED)
        .collect();
    let at = |t: f64| sl.iter().rfind(|s| s.t_s <= t + 1e-6).copied();
    let first_held_min = sl
        .iter()
        .filter(|s| s.phase == "held" && s.t_s <= plan.hold_start() + 180.0)
        .map(|s| s.msgs_per_sec)
        .collect::<Vec<_>>();
    let mut s = String::new();
    let ratio = |a: Option<f64>, b: Option<f64>| {
        a.zip(b)
            .map(|(a, b)| format!("{:.0}%", 100.0 * a / b))
            .unwrap_or("-".into())
    };
    let _ = writeln!(
        s,
        "throughput: clean {} msg/s; held {} ({} of clean), first 3 minutes of the hold {} ({}); released {}",
        num(clean.rate),
        num(held.rate),
        ratio(held.rate, clean.rate),
        num(mean(&first_held_min)),
        ratio(mean(&first_held_min), clean.rate),
        num(released.rate),
    );
    let _ = writeln!(
        s,
        "end-to-end p99: clean {} ms, held {} ms, released {} ms",
        num(clean.p99),
        num(held.p99),
        num(released.p99)
    );
    let line = |t: f64| {
        at(t)
            .map(|x| {
                format!(
                    "{} dead, {} MB, backlog {}",
                    x.dead_tuples,
                    mb(x.total_bytes),
                    x.backlog
                )
            })
            .unwrap_or("-".into())
    };
    let _ = writeln!(
        s,
        "end of clean: {}; end of hold: {}; end of run: {}",
        line(plan.hold_start()),
        line(plan.hold_end()),
        line(plan.total())
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_by_interval_midpoint() {
        let p = Plan {
            warmup: 0.0,
            clean: 180.0,
            held: 600.0,
            released: 180.0,
            sample: 10.0,
        };
        assert_eq!(p.phase(10.0, 10.0), "clean");
        assert_eq!(p.phase(180.0, 10.0), "clean");
        assert_eq!(p.phase(190.0, 10.0), "held");
        assert_eq!(p.phase(780.0, 10.0), "held");
        assert_eq!(p.phase(790.0, 10.0), "released");
        assert_eq!(p.total(), 960.0);
    }

    fn run_of(system: &'static str, clean_ms: u64, held_ms: u64) -> Outcome {
        let sample = |t_s: f64, phase: &str| Sample {
            system: system.into(),
            phase: phase.into(),
            t_s,
            msgs_per_sec: 300.0,
            e2e_p99_ms: None,
            dead_tuples: 0,
            message_dead_tuples: 0,
            total_bytes: 1,
            pushed_per_sec: 300.0,
            backlog: 0,
            cpu_cores: 0.5,
            machine_busy: 0.5,
            other_cpu_cores: 0.0,
            oldest_xmin_age: None,
        };
        let mut phase_e2e = HashMap::new();
        for (phase, ms) in [("clean", clean_ms), ("held", held_ms)] {
            let mut h = histogram();
            h.saturating_record(ms * 1000);
            phase_e2e.insert((system, phase), h);
        }
        Outcome {
            samples: vec![sample(10.0, "clean"), sample(20.0, "held")],
            phase_e2e,
            snapshots: HashMap::new(),
            hold_info: vec![format!("{system} held")],
            errors: [(system, 1)].into_iter().collect(),
            statements: Vec::new(),
        }
    }

    #[test]
    fn runs_one_after_the_other_merge_on_one_timeline_and_judge_comb_against_the_peer() {
        let setup = Setup {
            plan: Plan {
                warmup: 0.0,
                clean: 10.0,
                held: 10.0,
                released: 0.0,
                sample: 10.0,
            },
            comb: true,
            skiplocked: true,
            segment_seconds: 60,
            maintenance_ms: 10_000,
            retention_s: 120,
        };
        let out = run_of(COMB, 12, 20).followed_by(run_of(SKIPLOCKED, 8, 90_000));
        let order: Vec<(f64, &str)> = out
            .samples
            .iter()
            .map(|s| (s.t_s, s.system.as_str()))
            .collect();
        assert_eq!(
            order,
            [
                (10.0, COMB),
                (10.0, SKIPLOCKED),
                (20.0, COMB),
                (20.0, SKIPLOCKED)
            ]
        );
        assert_eq!(out.hold_info.len(), 2);
        assert_eq!(out.errors[COMB] + out.errors[SKIPLOCKED], 2);
        let verdict = |out: &Outcome, t: &str| {
            goals(out, &setup)
                .into_iter()
                .find(|c| c.target.starts_with(t))
                .unwrap()
                .verdict
        };
        // 12 ms against 8: within 2x; held 20 against clean 12: within 2x.
        assert_eq!(verdict(&out, "before the hold"), Verdict::Met);
        assert_eq!(
            verdict(&out, "during the hold Comb's end-to-end"),
            Verdict::Met
        );
        let out = run_of(COMB, 20, 20).followed_by(run_of(SKIPLOCKED, 8, 8));
        assert_eq!(verdict(&out, "before the hold"), Verdict::Missed);
        let alone = run_of(COMB, 12, 20);
        assert_eq!(verdict(&alone, "before the hold"), Verdict::NotRun);
    }

    #[test]
    fn splices_its_own_section() {
        let fresh = XMIN_SECTION.splice("# B\n\n## Latest results\n", "x\n");
        assert!(fresh.ends_with("## Held snapshot (make bench-xmin)\n\n<!-- xmin:begin (written by comb-bench xmin; edit outside these markers) -->\nx\n<!-- xmin:end -->\n"));
    }
}
