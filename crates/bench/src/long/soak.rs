//! `comb-bench soak`: a long run at a fixed share of the measured peak with retention on
//! (`make bench-soak`, see "Soak" in `docs/long-runs.md`).
//!
//! Short cells cannot show slow growth: storage that retention never gets back, tables that
//! bloat under in-place updates, a backlog that creeps up. This run looks for it. One
//! PostgreSQL cluster with the suite's durable settings, one release `comb serve` with a short
//! segment period, and a queue with `retentionSeconds` and `completedRetentionSeconds`, so that
//! segments are made, rolled over and dropped many times during the run. First the peak:
//! closed-loop pushes of one message per request with explicit-ack consumers, whose delivered
//! rate is the peak; then, once the peak's backlog has drained, fixed-rate pushes at a share of
//! that rate (70 %) with the same consumers for the soak. Every sample interval: pushed and
//! delivered rates, end-to-end p99, backlog, the total size of all Comb tables, dead tuples and
//! segment tables. The verdict rests on the least-squares slope of the total size over the last
//! two thirds of the soak, and on message storage staying under what retention allows.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use tokio_postgres::Client;

use super::{Common, Counters, Finished, Mark, Report, Session, block_on, machine_load, ticks};
use crate::http::BoxError;
use crate::load::{self, Rate};
use crate::meter::{Meter, Snapshot, usage};
use crate::peers;
use crate::report::{Check, Section, Verdict, align, checks_text, num};
use crate::stats::{Window, histogram, mean, quantile_ms, slope};
use crate::tables::{is_message_table, tables};

/// Measures the peak delivered rate, then runs a fixed-rate soak at a share of it with
/// retention on, and judges whether Comb's storage stays flat.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Seconds of the fixed-rate soak.
    #[arg(long, default_value_t = 1800.0)]
    duration_s: f64,
    /// Seconds of closed-loop load that measure the peak (after the warm-up).
    #[arg(long, default_value_t = 60.0)]
    peak_s: f64,
    /// Seconds of closed-loop load before the peak is measured.
    #[arg(long, default_value_t = 10.0)]
    warmup_s: f64,
    /// Most seconds to wait, producers stopped, for the consumers to drain the peak's backlog
    /// before the soak starts.
    #[arg(long, default_value_t = 120.0)]
    drain_max_s: f64,
    /// Share of the peak's delivered rate offered in the soak.
    #[arg(long, default_value_t = 0.7)]
    fraction: f64,
    /// Offer this many messages per second in the soak and skip the peak phase.
    #[arg(long)]
    rate: Option<f64>,
    /// Seconds between samples.
    #[arg(long, default_value_t = 10.0)]
    sample_s: f64,
    /// A quick development run (about 2 minutes): 3 s warm-up, 15 s peak, at most 15 s drain,
    /// 90 s soak, 5 s samples, 20 s segments, 2 s maintenance, retention 30 s (completed
    /// 15 s). Its numbers mean nothing and nothing is written.
    #[arg(long)]
    smoke: bool,
    /// Partitions of the queue (each push picks one at random).
    #[arg(long, default_value_t = 100)]
    partitions: usize,
    /// Producer connections of the closed-loop peak phase.
    #[arg(long, default_value_t = 50)]
    peak_producers: usize,
    /// Producer connections sharing the soak's fixed-rate schedule.
    #[arg(long, default_value_t = 200)]
    producers: usize,
    /// Consumer connections (pop with long poll, then ack the batch), in both phases.
    #[arg(long, default_value_t = 20)]
    consumers: usize,
    /// Pop batch size.
    #[arg(long, default_value_t = 50)]
    batch: usize,
    /// `comb serve --segment-seconds`.
    #[arg(long, default_value_t = 120)]
    segment_seconds: u64,
    /// `comb serve --maintenance-interval-ms`.
    #[arg(long, default_value_t = 5_000)]
    maintenance_interval_ms: u64,
    /// `retentionSeconds` of the queue.
    #[arg(long, default_value_t = 300)]
    retention_s: u64,
    /// `completedRetentionSeconds` of the queue.
    #[arg(long, default_value_t = 120)]
    completed_retention_s: u64,
    /// The server, the JSON file (summary and samples), the page section and the record.
    #[command(flatten)]
    common: Common,
}

/// The horizon over which the fitted slope must stay small.
const FLAT_HORIZON_MIN: f64 = 30.0;
/// How much of the mean size the slope may add or remove over [`FLAT_HORIZON_MIN`].
const FLAT_SHARE: f64 = 0.10;

pub(crate) const SOAK_SECTION: Section = Section {
    heading: "## Soak (make bench-soak)",
    begin: "<!-- soak:begin (written by comb-bench soak; edit outside these markers) -->",
    end: "<!-- soak:end -->",
};

/// Lengths and server settings of one run after `--smoke` is applied.
#[derive(Debug, Clone, Copy)]
struct Setup {
    warmup: f64,
    peak: f64,
    drain_max: f64,
    soak: f64,
    sample: f64,
    segment_seconds: u64,
    maintenance_ms: u64,
    retention_s: u64,
    completed_retention_s: u64,
}

impl Setup {
    /// The longest a message can stay stored: its segment closes at most one segment period
    /// (and a cycle) after it was written, the segment goes whole once its newest message is
    /// `retentionSeconds` old, and roll-over, summary and drop each wait for a maintenance
    /// cycle (the summary's 2-s grace fits in them).
    fn retention_window_s(&self) -> f64 {
        self.retention_s as f64 + self.segment_seconds as f64 + 3.0 * self.maintenance_s()
    }

    fn maintenance_s(&self) -> f64 {
        self.maintenance_ms as f64 / 1000.0
    }
}

fn setup(args: &Args) -> Result<Setup, BoxError> {
    if args.smoke {
        return Ok(Setup {
            warmup: 3.0,
            peak: 15.0,
            drain_max: 15.0,
            soak: 90.0,
            sample: 5.0,
            segment_seconds: 20,
            maintenance_ms: 2_000,
            retention_s: 30,
            completed_retention_s: 15,
        });
    }
    if args.sample_s <= 0.0 || args.duration_s <= 0.0 || args.peak_s <= 0.0 {
        return Err("duration, peak and sample lengths must be positive".into());
    }
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(args.fraction) || args.rate.is_some_and(|r| !positive(r)) {
        return Err("--fraction and --rate must be positive".into());
    }
    Ok(Setup {
        warmup: args.warmup_s.max(0.0),
        peak: args.peak_s,
        drain_max: args.drain_max_s.max(0.0),
        soak: args.duration_s,
        sample: args.sample_s,
        segment_seconds: args.segment_seconds,
        maintenance_ms: args.maintenance_interval_ms,
        retention_s: args.retention_s,
        completed_retention_s: args.completed_retention_s,
    })
}

/// Runs the soak and writes its records.
pub fn run(args: Args) -> Result<(), BoxError> {
    let setup = setup(&args)?;
    let session = Session::start(&args.common, true, &[])?;
    let url = session.cluster.pg.create_database("soak")?;
    let server = session.serve(
        &args.common,
        &url,
        setup.segment_seconds,
        setup.maintenance_ms,
    )?;
    let out = block_on(measure(&args, &setup, &url, server.addr(), server.pid()))??;
    drop(server);

    let summary = summarize(&args, &setup, &out);
    let report = render(&args, &setup, &out, &summary);
    session.finish(
        &args.common.out,
        args.smoke,
        Finished {
            report: &report,
            name: "soak",
            results: &Results {
                summary: &summary,
                samples: &out.samples,
            },
            section: &SOAK_SECTION,
        },
    )
}

/// `bench/results/soak.json`: the summary first, for readers who want the verdict, then every
/// sample.
#[derive(Serialize)]
struct Results<'a> {
    summary: &'a Summary,
    samples: &'a [Sample],
}

/// One sample: the rows of `samples` in `bench/results/soak.json`.
#[derive(Debug, Clone, Serialize)]
struct Sample {
    /// `peak`, `drain` or `soak`.
    phase: &'static str,
    /// End of the interval, seconds from the start of the measured peak (of the soak when
    /// `--rate` skips the peak).
    t_s: f64,
    /// Length of the interval, seconds.
    interval_s: f64,
    /// Messages accepted per second.
    pushed_per_sec: f64,
    /// Messages delivered (returned by pops) per second.
    delivered_per_sec: f64,
    /// End-to-end p99 (send → receipt) of the messages delivered in the interval, ms.
    e2e_p99_ms: Option<f64>,
    /// Accepted but not yet delivered, at the end of the interval.
    backlog: i64,
    /// `pg_total_relation_size` of every table of schema `comb` (segments included).
    total_bytes: i64,
    /// The same for the message segment tables alone.
    message_bytes: i64,
    /// Message segment tables (`comb.messages_<n>`).
    segment_tables: usize,
    /// Tables of schema `comb`.
    tables: usize,
    /// `n_dead_tup` of every table of schema `comb`.
    dead_tuples: i64,
    /// CPU cores used by the broker.
    broker_cpu_cores: Option<f64>,
    /// CPU cores used by PostgreSQL (postmaster and all its children).
    pg_cpu_cores: f64,
    /// CPU cores used by processes outside this run (neighbours on a shared machine).
    other_cpu_cores: f64,
    /// Share of the machine's CPU time that was busy.
    machine_busy: f64,
}

/// Counters the load updates while it runs.
struct Live {
    counters: Counters,
    consumer_errors: Arc<AtomicU64>,
}

/// Everything a run measured.
struct Outcome {
    samples: Vec<Sample>,
    /// Merged end-to-end latency of the soak's deliveries.
    soak_e2e: Histogram<u64>,
    peak_pushed: Option<f64>,
    peak_delivered: Option<f64>,
    offered: f64,
    drain_s: f64,
    soak_start_s: f64,
    push_errors: u64,
    consumer_errors: u64,
    /// Every message segment table seen during the run, and those there at its end.
    segments_seen: BTreeSet<String>,
    segments_at_end: usize,
    /// Rows in message storage and its size, counted right after the last sample.
    stored_at_end: Option<(i64, i64)>,
    /// The other tables of schema `comb` at the end, largest first (name, bytes): where
    /// growth outside message storage sits.
    other_tables_at_end: Vec<(String, i64)>,
}

/// Reads the counters at the end of every interval.
struct Sampler {
    stats: Client,
    meter: Meter,
    origin: Instant,
    at: Instant,
    snapshot: Snapshot,
    mark: Mark,
    segments_seen: BTreeSet<String>,
}

impl Sampler {
    async fn new(stats: Client, meter: Meter, live: &Live) -> Sampler {
        let snapshot = meter.snapshot().await;
        let mut s = Sampler {
            stats,
            meter,
            origin: Instant::now(),
            at: Instant::now(),
            snapshot,
            mark: Mark::default(),
            segments_seen: BTreeSet::new(),
        };
        s.restart(live).await;
        s
    }

    /// Makes now time zero and the start of the next interval; what came before is dropped.
    async fn restart(&mut self, live: &Live) {
        self.origin = Instant::now();
        self.at = self.origin;
        self.snapshot = self.meter.snapshot().await;
        self.mark = live.counters.mark();
    }

    fn t(&self) -> f64 {
        (Instant::now() - self.origin).as_secs_f64()
    }

    async fn sample(&mut self, live: &Live, phase: &'static str, out: &mut Outcome) {
        let now = Instant::now();
        let secs = (now - self.at).as_secs_f64().max(1e-3);
        self.at = now;
        let interval = live.counters.interval(&mut self.mark);
        let snapshot = self.meter.snapshot().await;
        let u = usage(&self.snapshot, &snapshot);
        self.snapshot = snapshot;
        let stats = tables(&self.stats, "comb").await.unwrap_or_default();
        let messages: Vec<_> = stats.iter().filter(|t| is_message_table(&t.name)).collect();
        for t in &messages {
            self.segments_seen.insert(t.name.clone());
        }
        let cores = |cpu: f64| cpu / u.secs.max(1e-3);
        let sample = Sample {
            phase,
            t_s: ((now - self.origin).as_secs_f64() * 10.0).round() / 10.0,
            interval_s: (secs * 10.0).round() / 10.0,
            pushed_per_sec: interval.pushed as f64 / secs,
            delivered_per_sec: interval.delivered as f64 / secs,
            e2e_p99_ms: quantile_ms(&interval.e2e, 0.99),
            backlog: interval.backlog,
            total_bytes: stats.iter().map(|t| t.total_bytes).sum(),
            message_bytes: messages.iter().map(|t| t.total_bytes).sum(),
            segment_tables: messages.len(),
            tables: stats.len(),
            dead_tuples: stats.iter().map(|t| t.dead).sum(),
            broker_cpu_cores: u.broker_cpu.map(cores),
            pg_cpu_cores: cores(u.pg_cpu),
            other_cpu_cores: cores(u.other_cpu),
            machine_busy: u.machine_busy,
        };
        if phase == "soak" {
            out.soak_e2e.add(&interval.e2e).expect("same bounds");
        }
        eprintln!(
            "  {:>6.0} s {:<5} push {:>6.0}/s delivered {:>6.0}/s e2e p99 {:>7} ms backlog {:>7} \
             {:>7.1} MB ({:.1} MB in {} segments) dead {}",
            sample.t_s,
            phase,
            sample.pushed_per_sec,
            sample.delivered_per_sec,
            num(sample.e2e_p99_ms),
            sample.backlog,
            sample.total_bytes as f64 / 1e6,
            sample.message_bytes as f64 / 1e6,
            sample.segment_tables,
            sample.dead_tuples,
        );
        out.samples.push(sample);
    }

    /// Samples every `sample` seconds from now until `end`, the last interval cut short at
    /// `end` so that no interval straddles two phases.
    async fn until(
        &mut self,
        live: &Live,
        end: Instant,
        sample: f64,
        phase: &'static str,
        out: &mut Outcome,
    ) {
        let start = Instant::now();
        for t in ticks((end - start).as_secs_f64(), sample) {
            tokio::time::sleep_until((start + Duration::from_secs_f64(t)).into()).await;
            self.sample(live, phase, out).await;
        }
    }
}

async fn measure(
    args: &Args,
    setup: &Setup,
    url: &str,
    addr: SocketAddr,
    pid: u32,
) -> Result<Outcome, BoxError> {
    let options = format!(
        "{{\"retentionSeconds\":{},\"completedRetentionSeconds\":{}}}",
        setup.retention_s, setup.completed_retention_s
    );
    load::configure(addr, &options).await?;
    // One message per partition creates the partitions; they count as pushed.
    let filled = load::fill(addr, args.partitions, 1, 4).await?;
    let stats = peers::connect(url).await?;
    stats.batch_execute("ANALYZE; CHECKPOINT").await?;
    let meter = Meter::new(Some(pid), peers::connect(url).await?).await?;
    let live = Live {
        counters: Counters::new(filled),
        consumer_errors: Arc::new(AtomicU64::new(0)),
    };
    let mut out = Outcome {
        samples: Vec::new(),
        soak_e2e: histogram(),
        peak_pushed: None,
        peak_delivered: None,
        offered: args.rate.unwrap_or(0.0),
        drain_s: 0.0,
        soak_start_s: 0.0,
        push_errors: 0,
        consumer_errors: 0,
        segments_seen: BTreeSet::new(),
        segments_at_end: 0,
        stored_at_end: None,
        other_tables_at_end: Vec::new(),
    };

    // The consumers run through every phase; they are stopped when the soak ends.
    let latest_end = Instant::now()
        + Duration::from_secs_f64(
            setup.warmup + setup.peak + setup.drain_max + setup.soak + 3600.0,
        );
    let consumers: Vec<_> = (0..args.consumers)
        .map(|_| {
            tokio::spawn(load::consume_live(
                addr,
                args.batch,
                latest_end,
                live.counters.delivered.clone(),
                live.counters.e2e.clone(),
                live.consumer_errors.clone(),
            ))
        })
        .collect();
    let mut sampler = Sampler::new(stats, meter, &live).await;

    if args.rate.is_none() {
        eprintln!(
            "peak: {:.0} s warm-up, then {:.0} s of closed-loop pushes ({} connections) with {} \
             consumers",
            setup.warmup, setup.peak, args.peak_producers, args.consumers
        );
        let window = Window::after(
            Duration::from_secs_f64(setup.warmup),
            Duration::from_secs_f64(setup.peak),
        );
        let producers = load::closed_push_counted(
            addr,
            args.peak_producers,
            1,
            args.partitions,
            window,
            live.counters.pushed.clone(),
        );
        let watch = async {
            tokio::time::sleep_until(window.start.into()).await;
            sampler.restart(&live).await;
            let (p0, d0) = (
                live.counters.pushed.load(Ordering::Relaxed),
                live.counters.delivered.load(Ordering::Relaxed),
            );
            sampler
                .until(&live, window.end, setup.sample, "peak", &mut out)
                .await;
            let (p1, d1) = (
                live.counters.pushed.load(Ordering::Relaxed),
                live.counters.delivered.load(Ordering::Relaxed),
            );
            (
                (p1 - p0) as f64 / window.secs(),
                (d1 - d0) as f64 / window.secs(),
            )
        };
        let (tally, (pushed, delivered)) = tokio::join!(producers, watch);
        out.push_errors += tally.errors;
        out.peak_pushed = Some(pushed);
        out.peak_delivered = Some(delivered);
        out.offered = args.fraction * delivered;
        eprintln!(
            "peak: pushed {pushed:.0} msg/s, delivered {delivered:.0} msg/s; the soak offers \
             {:.0} msg/s",
            out.offered
        );
        if out.offered.is_nan() || out.offered < 1.0 {
            return Err("the peak phase delivered nothing: no rate to soak at".into());
        }

        // Drain: producers stopped, until at most one second of the soak's rate is waiting.
        let drain_start = Instant::now();
        let drain_end = drain_start + Duration::from_secs_f64(setup.drain_max);
        let mut last_sample = drain_start;
        loop {
            let backlog = live
                .counters
                .pushed
                .load(Ordering::Relaxed)
                .saturating_sub(live.counters.delivered.load(Ordering::Relaxed));
            let now = Instant::now();
            if backlog as f64 <= out.offered || now >= drain_end {
                break;
            }
            if (now - last_sample).as_secs_f64() >= setup.sample {
                sampler.sample(&live, "drain", &mut out).await;
                last_sample = now;
            }
            let tick = (now + Duration::from_millis(500)).min(drain_end);
            tokio::time::sleep_until(tick.into()).await;
        }
        if (Instant::now() - last_sample).as_secs_f64() >= 0.5 {
            sampler.sample(&live, "drain", &mut out).await;
        }
        out.drain_s = (Instant::now() - drain_start).as_secs_f64();
        out.soak_start_s = sampler.t();
    } else {
        sampler.restart(&live).await;
    }

    eprintln!(
        "soak: {:.0} msg/s for {:.0} s ({} connections), a sample every {:.0} s",
        out.offered, setup.soak, args.producers, setup.sample
    );
    let window = Window::after(Duration::ZERO, Duration::from_secs_f64(setup.soak));
    let rate = Rate {
        msgs_per_sec: out.offered,
        msgs_per_req: 1,
        conns: args.producers,
        partitions: args.partitions,
    };
    let producers = load::open_push(addr, rate, window, live.counters.pushed.clone());
    let watch = sampler.until(&live, window.end, setup.sample, "soak", &mut out);
    let (tally, ()) = tokio::join!(producers, watch);
    out.push_errors += tally.errors;

    // Bytes per stored message, for the retention bound.
    let stored = sampler
        .stats
        .query_one("SELECT count(*)::int8 FROM comb.messages", &[])
        .await
        .ok()
        .map(|r| r.get::<_, i64>(0));
    let end_tables = tables(&sampler.stats, "comb").await.unwrap_or_default();
    let message_tables: Vec<_> = end_tables
        .iter()
        .filter(|t| is_message_table(&t.name))
        .collect();
    out.segments_at_end = message_tables.len();
    let mut others: Vec<(String, i64)> = end_tables
        .iter()
        .filter(|t| !is_message_table(&t.name))
        .map(|t| (t.name.clone(), t.total_bytes))
        .collect();
    others.sort_by_key(|(_, b)| std::cmp::Reverse(*b));
    out.other_tables_at_end = others;
    out.stored_at_end =
        stored.map(|n| (n, message_tables.iter().map(|t| t.total_bytes).sum::<i64>()));
    for c in consumers {
        c.abort();
    }
    out.consumer_errors = live.consumer_errors.load(Ordering::Relaxed);
    out.segments_seen = std::mem::take(&mut sampler.segments_seen);
    Ok(out)
}

/// The figures the verdict rests on: `summary` in `bench/results/soak.json`.
#[derive(Debug, Clone, Serialize)]
struct Summary {
    /// Closed-loop pushes accepted per second in the peak phase.
    peak_pushed_per_sec: Option<f64>,
    /// Messages delivered per second in the peak phase: the peak.
    peak_delivered_per_sec: Option<f64>,
    /// Share of the peak offered in the soak (`None` with `--rate`).
    fraction: Option<f64>,
    /// Fixed rate offered in the soak, msgs/s.
    offered_per_sec: f64,
    /// Seconds the peak's backlog took to drain before the soak.
    drain_s: f64,
    /// Start of the soak, seconds on the samples' clock.
    soak_start_s: f64,
    /// Length of the soak, seconds.
    soak_s: f64,
    /// Mean pushed and delivered rates over the soak, msgs/s.
    soak_pushed_per_sec: Option<f64>,
    soak_delivered_per_sec: Option<f64>,
    /// End-to-end latency over all deliveries of the soak, ms.
    soak_e2e_p50_ms: Option<f64>,
    soak_e2e_p99_ms: Option<f64>,
    /// Backlog at the end of the soak and its least-squares slope over the fit window, msgs/s.
    backlog_end: Option<i64>,
    backlog_slope_per_sec: Option<f64>,
    /// The fit window: the samples of the last two thirds of the soak.
    fit_from_s: f64,
    fit_to_s: f64,
    fit_samples: usize,
    /// Total size of all Comb tables over the fit window: mean, smallest, largest, bytes.
    mean_total_bytes: Option<f64>,
    min_total_bytes: Option<i64>,
    max_total_bytes: Option<i64>,
    /// Least-squares slope of the total size over the fit window.
    slope_bytes_per_min: Option<f64>,
    /// The slope as a share of the mean size per hour, %.
    slope_pct_of_mean_per_hour: Option<f64>,
    /// The change the slope predicts over 30 minutes, % of the mean size.
    change_30min_pct_of_mean: Option<f64>,
    /// Slope of the tables other than message segments over the fit window.
    other_tables_slope_bytes_per_min: Option<f64>,
    /// Messages in message storage right after the soak, and their bytes per message.
    stored_messages_end: Option<i64>,
    bytes_per_message: Option<f64>,
    /// The longest a message can stay stored under the queue's retention, seconds.
    retention_window_s: f64,
    /// What retention allows message storage to hold: the retention window's messages at the
    /// offered rate, times the bytes per message.
    message_bound_bytes: Option<f64>,
    /// Largest message storage in the fit window.
    max_message_bytes: Option<i64>,
    /// Message segment tables made (seen) and dropped during the run.
    segment_tables_seen: usize,
    segment_tables_dropped: usize,
    /// Largest `n_dead_tup` over all Comb tables in a soak sample.
    max_dead_tuples: Option<i64>,
    segment_seconds: u64,
    maintenance_interval_ms: u64,
    retention_s: u64,
    completed_retention_s: u64,
    push_errors: u64,
    consumer_errors: u64,
    /// Whether the size slope is within the criterion.
    slope_ok: Option<bool>,
    /// Whether message storage stayed within the retention bound.
    bound_ok: Option<bool>,
    /// `flat` when both hold, `not flat` when either fails, `not judged` without figures.
    verdict: String,
}

fn summarize(args: &Args, setup: &Setup, out: &Outcome) -> Summary {
    let soak: Vec<&Sample> = out.samples.iter().filter(|s| s.phase == "soak").collect();
    let fit_from = out.soak_start_s + setup.soak / 3.0;
    let fit: Vec<&&Sample> = soak.iter().filter(|s| s.t_s > fit_from + 1e-6).collect();
    let minutes = |s: &Sample| s.t_s / 60.0;
    let points = |f: fn(&Sample) -> i64| -> Vec<(f64, f64)> {
        fit.iter().map(|s| (minutes(s), f(s) as f64)).collect()
    };
    let mean_total = mean(&fit.iter().map(|s| s.total_bytes as f64).collect::<Vec<_>>());
    let slope_total = slope(&points(|s| s.total_bytes));
    let pct_per_hour = slope_total
        .zip(mean_total)
        .filter(|(_, m)| *m > 0.0)
        .map(|(k, m)| 100.0 * k * 60.0 / m);
    let change_30 = slope_total
        .zip(mean_total)
        .filter(|(_, m)| *m > 0.0)
        .map(|(k, m)| 100.0 * k * FLAT_HORIZON_MIN / m);
    let backlog_slope = slope(
        &fit.iter()
            .map(|s| (s.t_s, s.backlog as f64))
            .collect::<Vec<_>>(),
    );
    let bytes_per_message = out
        .stored_at_end
        .filter(|(n, _)| *n > 0)
        .map(|(n, b)| b as f64 / n as f64);
    let window = setup.retention_window_s();
    let bound = bytes_per_message.map(|b| b * out.offered * window);
    let max_message = fit.iter().map(|s| s.message_bytes).max();
    let slope_ok = change_30.map(|c| c.abs() <= 100.0 * FLAT_SHARE);
    let bound_ok = bound.zip(max_message).map(|(b, m)| m as f64 <= b);
    let verdict = match (slope_ok, bound_ok) {
        (Some(true), Some(true)) => "flat",
        (Some(false), _) | (_, Some(false)) => "not flat",
        _ => "not judged",
    };
    let seen = out.segments_seen.len();
    Summary {
        peak_pushed_per_sec: out.peak_pushed,
        peak_delivered_per_sec: out.peak_delivered,
        fraction: args.rate.is_none().then_some(args.fraction),
        offered_per_sec: out.offered,
        drain_s: out.drain_s,
        soak_start_s: out.soak_start_s,
        soak_s: setup.soak,
        soak_pushed_per_sec: mean(&soak.iter().map(|s| s.pushed_per_sec).collect::<Vec<_>>()),
        soak_delivered_per_sec: mean(&soak.iter().map(|s| s.delivered_per_sec).collect::<Vec<_>>()),
        soak_e2e_p50_ms: quantile_ms(&out.soak_e2e, 0.5),
        soak_e2e_p99_ms: quantile_ms(&out.soak_e2e, 0.99),
        backlog_end: soak.last().map(|s| s.backlog),
        backlog_slope_per_sec: backlog_slope,
        fit_from_s: fit_from,
        fit_to_s: out.soak_start_s + setup.soak,
        fit_samples: fit.len(),
        mean_total_bytes: mean_total,
        min_total_bytes: fit.iter().map(|s| s.total_bytes).min(),
        max_total_bytes: fit.iter().map(|s| s.total_bytes).max(),
        slope_bytes_per_min: slope_total,
        slope_pct_of_mean_per_hour: pct_per_hour,
        change_30min_pct_of_mean: change_30,
        other_tables_slope_bytes_per_min: slope(&points(|s| s.total_bytes - s.message_bytes)),
        stored_messages_end: out.stored_at_end.map(|(n, _)| n),
        bytes_per_message,
        retention_window_s: window,
        message_bound_bytes: bound,
        max_message_bytes: max_message,
        segment_tables_seen: seen,
        segment_tables_dropped: seen.saturating_sub(out.segments_at_end),
        max_dead_tuples: soak.iter().map(|s| s.dead_tuples).max(),
        segment_seconds: setup.segment_seconds,
        maintenance_interval_ms: setup.maintenance_ms,
        retention_s: setup.retention_s,
        completed_retention_s: setup.completed_retention_s,
        push_errors: out.push_errors,
        consumer_errors: out.consumer_errors,
        slope_ok,
        bound_ok,
        verdict: verdict.to_string(),
    }
}

fn mb(bytes: f64) -> String {
    format!("{:.1}", bytes / 1e6)
}

fn opt_mb(bytes: Option<f64>) -> String {
    bytes.map(mb).unwrap_or_else(|| "-".into())
}

/// The printed report: the load, every sample, the summary and the verdict.
fn render(args: &Args, setup: &Setup, out: &Outcome, sum: &Summary) -> Report {
    let mut s = String::new();
    let peak = match (out.peak_pushed, out.peak_delivered) {
        (Some(p), Some(d)) => format!(
            "Peak: {:.0} s of closed-loop pushes (1 message per request, {} connections) after \
             {:.0} s warm-up, with the soak's consumers: pushed {p:.0} msg/s, delivered {d:.0} \
             msg/s; then {:.0} s with producers stopped for the backlog to drain. Soak offered \
             {:.0}% of the delivered peak: ",
            setup.peak,
            args.peak_producers,
            setup.warmup,
            out.drain_s,
            args.fraction * 100.0
        ),
        _ => "Soak rate given with --rate (no peak phase): ".to_string(),
    };
    let _ = writeln!(
        s,
        "{peak}{:.0} msg/s for {:.0} s, fixed rate, 1 message per push, {} producer connections. \
         Both phases: {} partitions; {} consumers (pop batch {}, long poll 500 ms, explicit \
         ack). comb serve --segment-seconds {} --maintenance-interval-ms {}; queue \
         retentionSeconds {}, completedRetentionSeconds {}. A sample every {:.0} s.\n",
        out.offered,
        setup.soak,
        args.producers,
        args.partitions,
        args.consumers,
        args.batch,
        setup.segment_seconds,
        setup.maintenance_ms,
        setup.retention_s,
        setup.completed_retention_s,
        setup.sample,
    );

    let intro = std::mem::take(&mut s);
    let header: Vec<String> = [
        "phase", "t_s", "push/s", "deliv/s", "e2e p99", "backlog", "MB", "msg MB", "segs",
        "tables", "dead", "comb cpu", "pg cpu", "other", "busy",
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    let rows: Vec<Vec<String>> = out
        .samples
        .iter()
        .map(|x| {
            vec![
                x.phase.to_string(),
                format!("{:.0}", x.t_s),
                format!("{:.0}", x.pushed_per_sec),
                format!("{:.0}", x.delivered_per_sec),
                num(x.e2e_p99_ms),
                x.backlog.to_string(),
                mb(x.total_bytes as f64),
                mb(x.message_bytes as f64),
                x.segment_tables.to_string(),
                x.tables.to_string(),
                x.dead_tuples.to_string(),
                num(x.broker_cpu_cores),
                num(Some(x.pg_cpu_cores)),
                num(Some(x.other_cpu_cores)),
                format!("{:.0}%", x.machine_busy * 100.0),
            ]
        })
        .collect();
    s.push_str(&align(&header, &rows));
    let _ = writeln!(
        s,
        "(push/s = accepted, deliv/s = returned by pops; e2e p99 in ms over the interval's \
         deliveries; MB = pg_total_relation_size of every table of schema comb, msg MB = of the \
         message segment tables (segs); tables = tables of schema comb; dead = their n_dead_tup; \
         cpu in cores; other = cores used by processes outside this run; busy = whole machine)\n"
    );
    let samples = std::mem::take(&mut s);

    let _ = writeln!(
        s,
        "Soak: pushed {} msg/s, delivered {} msg/s on average; end-to-end p50 {} ms, p99 {} ms \
         over all its deliveries; backlog at the end {}, slope {} msg/s over the fit window.",
        num(sum.soak_pushed_per_sec),
        num(sum.soak_delivered_per_sec),
        num(sum.soak_e2e_p50_ms),
        num(sum.soak_e2e_p99_ms),
        sum.backlog_end
            .map(|b| b.to_string())
            .unwrap_or_else(|| "-".into()),
        sum.backlog_slope_per_sec
            .map(|k| format!("{k:+.2}"))
            .unwrap_or_else(|| "-".into()),
    );
    let _ = writeln!(
        s,
        "Size over the fit window (the last two thirds of the soak, t = {:.0}–{:.0} s, {} \
         samples): mean {} MB, {}–{} MB; least-squares slope {} MB/min = {} of the mean per \
         hour, {} of the mean over {FLAT_HORIZON_MIN:.0} min. Tables other than message \
         segments: slope {} MB/min.",
        sum.fit_from_s,
        sum.fit_to_s,
        sum.fit_samples,
        opt_mb(sum.mean_total_bytes),
        opt_mb(sum.min_total_bytes.map(|b| b as f64)),
        opt_mb(sum.max_total_bytes.map(|b| b as f64)),
        sum.slope_bytes_per_min
            .map(|k| format!("{:+.3}", k / 1e6))
            .unwrap_or_else(|| "-".into()),
        signed_pct(sum.slope_pct_of_mean_per_hour),
        signed_pct(sum.change_30min_pct_of_mean),
        sum.other_tables_slope_bytes_per_min
            .map(|k| format!("{:+.3}", k / 1e6))
            .unwrap_or_else(|| "-".into()),
    );
    let largest: Vec<String> = out
        .other_tables_at_end
        .iter()
        .take(5)
        .map(|(name, bytes)| format!("{name} {} MB", mb(*bytes as f64)))
        .collect();
    let _ = writeln!(
        s,
        "Largest other tables at the end: {}.",
        if largest.is_empty() {
            "-".to_string()
        } else {
            largest.join(", ")
        }
    );
    let _ = writeln!(
        s,
        "Segments: {} message segment tables seen, {} dropped during the run; at most {} dead \
         tuples over all Comb tables in a soak sample.",
        sum.segment_tables_seen,
        sum.segment_tables_dropped,
        sum.max_dead_tuples
            .map(|d| d.to_string())
            .unwrap_or_else(|| "-".into()),
    );
    let _ = writeln!(
        s,
        "Retention bound: a message stays at most {:.0} s (retentionSeconds {} + one segment \
         period {} + three maintenance cycles of {:.0} s); at the end {} messages were stored at \
         {} bytes each (indexes included), so at {:.0} msg/s message storage may hold {} MB.",
        sum.retention_window_s,
        setup.retention_s,
        setup.segment_seconds,
        setup.maintenance_s(),
        sum.stored_messages_end
            .map(|n| n.to_string())
            .unwrap_or_else(|| "-".into()),
        num(sum.bytes_per_message),
        out.offered,
        opt_mb(sum.message_bound_bytes),
    );
    let busy: Vec<f64> = out.samples.iter().map(|x| x.machine_busy).collect();
    let other: Vec<f64> = out.samples.iter().map(|x| x.other_cpu_cores).collect();
    let _ = writeln!(s, "{}\n", machine_load(&busy, &other));

    let checks = [
        Check {
            target: "total size flat: the slope over the last two thirds of the soak predicts a \
                     change of at most 10% of the mean size over 30 min",
            measured: match (sum.slope_bytes_per_min, sum.change_30min_pct_of_mean) {
                (Some(k), Some(c)) => format!(
                    "{:+.3} MB/min, {} over 30 min (mean {} MB)",
                    k / 1e6,
                    signed_pct(Some(c)),
                    opt_mb(sum.mean_total_bytes)
                ),
                _ => "too few samples".into(),
            },
            verdict: Verdict::from(sum.slope_ok),
        },
        Check {
            target: "message storage within what retention allows over the same window",
            measured: match (sum.max_message_bytes, sum.message_bound_bytes) {
                (Some(m), Some(b)) => format!(
                    "largest {} MB, bound {} MB ({:.0}%)",
                    mb(m as f64),
                    mb(b),
                    100.0 * m as f64 / b
                ),
                _ => "no stored messages to size the bound".into(),
            },
            verdict: Verdict::from(sum.bound_ok),
        },
    ];
    s.push_str(&checks_text(&checks));
    let _ = writeln!(s, "\nVerdict: {}", sum.verdict);
    if sum.push_errors > 0 || sum.consumer_errors > 0 {
        let _ = writeln!(
            s,
            "Errors: {} pushes, {} pops or acks failed",
            sum.push_errors, sum.consumer_errors
        );
    }
    Report {
        head: intro,
        samples,
        tail: s,
    }
}

fn signed_pct(v: Option<f64>) -> String {
    v.map(|v| format!("{v:+.1}%")).unwrap_or_else(|| "-".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `comb-bench soak`'s flags alone.
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse<const N: usize>(argv: [&str; N]) -> Args {
        Cli::parse_from(argv).args
    }

    fn sample(phase: &'static str, t_s: f64, total: i64, message: i64) -> Sample {
        Sample {
            phase,
            t_s,
            interval_s: 10.0,
            pushed_per_sec: 100.0,
            delivered_per_sec: 100.0,
            e2e_p99_ms: Some(5.0),
            backlog: 3,
            total_bytes: total,
            message_bytes: message,
            segment_tables: 3,
            tables: 12,
            dead_tuples: 0,
            broker_cpu_cores: Some(0.1),
            pg_cpu_cores: 0.2,
            other_cpu_cores: 0.0,
            machine_busy: 0.5,
        }
    }

    fn outcome(samples: Vec<Sample>) -> Outcome {
        Outcome {
            samples,
            soak_e2e: histogram(),
            peak_pushed: Some(200.0),
            peak_delivered: Some(150.0),
            offered: 100.0,
            drain_s: 1.0,
            soak_start_s: 70.0,
            push_errors: 0,
            consumer_errors: 0,
            segments_seen: ["messages_1", "messages_2", "messages_3", "messages_4"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            segments_at_end: 3,
            stored_at_end: Some((30_000, 30_000_000)),
            other_tables_at_end: vec![("cursors".into(), 2_000_000)],
        }
    }

    fn args() -> Args {
        parse(["soak", "--duration-s", "300"])
    }

    #[test]
    fn a_saw_tooth_around_a_level_is_flat() {
        let args = args();
        let setup = setup(&args).unwrap();
        let mut samples = vec![sample("peak", 10.0, 1, 1)];
        for k in 1..=30 {
            let t = 70.0 + 10.0 * k as f64;
            // Segments fill and drop: the size climbs for 12 samples, then falls back.
            let saw = 1_000_000 * (k % 12) as i64;
            samples.push(sample("soak", t, 20_000_000 + saw, 15_000_000 + saw));
        }
        let out = outcome(samples);
        let sum = summarize(&args, &setup, &out);
        assert_eq!(sum.fit_samples, 20);
        assert_eq!(sum.segment_tables_dropped, 1);
        assert_eq!(sum.bytes_per_message, Some(1000.0));
        // 100 msg/s over 300 + 120 + 15 s at 1,000 bytes each.
        assert_eq!(sum.message_bound_bytes, Some(43_500_000.0));
        assert_eq!(sum.bound_ok, Some(true));
        assert!(sum.change_30min_pct_of_mean.unwrap().abs() <= 10.0);
        assert_eq!(sum.verdict, "flat");
        let report = render(&args, &setup, &out, &sum);
        assert!(report.tail.contains("Verdict: flat"), "{}", report.whole());
        // The page leaves the samples out and says where they are.
        let page = report.page("bench/results/history/soak-x.md");
        assert!(!report.samples.is_empty() && !page.contains(&report.samples));
        assert!(page.contains("`bench/results/history/soak-x.md`"), "{page}");
    }

    #[test]
    fn steady_growth_is_not_flat() {
        let args = args();
        let setup = setup(&args).unwrap();
        let samples: Vec<Sample> = (1..=30)
            .map(|k| {
                let t = 70.0 + 10.0 * k as f64;
                // +1 MB a minute on about 30 MB: far more than 10 % in 30 minutes.
                let size = 20_000_000 + (t * 1e6 / 60.0) as i64;
                sample("soak", t, size, 10_000_000)
            })
            .collect();
        let sum = summarize(&args, &setup, &outcome(samples));
        assert!((sum.slope_bytes_per_min.unwrap() - 1e6).abs() < 1e3);
        assert_eq!(sum.slope_ok, Some(false));
        assert_eq!(sum.verdict, "not flat");
    }

    #[test]
    fn the_retention_window_adds_a_segment_and_three_cycles() {
        let args = parse(["soak", "--smoke"]);
        let setup = setup(&args).unwrap();
        assert_eq!(setup.retention_window_s(), 30.0 + 20.0 + 6.0);
    }

    #[test]
    fn the_section_has_its_own_markers() {
        let doc = SOAK_SECTION.splice("# Benchmarks\n", "- Date: x\n");
        assert!(doc.contains("## Soak (make bench-soak)\n\n<!-- soak:begin"));
        assert!(doc.ends_with("- Date: x\n<!-- soak:end -->\n"));
    }
}
