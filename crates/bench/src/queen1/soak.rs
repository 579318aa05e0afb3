//! `comb-bench queen1-soak`: the `queen1` load for a long time at a share of its measured
//! maximum (`make bench-queen1-soak`, see `docs/queen1.md`).
//!
//! First the rate search of the cell finds the highest rate the consumers keep up with; then
//! fixed-rate pushes at a share of it (80 %) for the soak, sampled every interval: pushed and
//! delivered rates (steadiness), end-to-end p50/p99, backlog, the broker's resident memory and
//! CPU. Afterwards the producers stop, the consumers drain the queue, and every message is
//! audited: each accepted message (every one carries its own transaction id) must have been
//! delivered.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use comb_harness::Server;
use serde::Serialize;

use super::{
    Live, PARTITIONS, SearchPlan, consume, drain, produce, queue_options, rss_mb, search,
    serve_args, serve_env, stop,
};
use crate::http::BoxError;
use crate::load;
use crate::long::{Common, Finished, Report, Session, block_on, machine_load, ticks};
use crate::meter::{Meter, usage};
use crate::peers;
use crate::report::{Section, num};
use crate::stats::{histogram, mean, quantile_ms, slope};

/// Runs the `queen1` load at a share of its maximum for a long time, then audits it.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Seconds of the soak.
    #[arg(long, default_value_t = 1800.0)]
    duration_s: f64,
    /// Share of the searched maximum offered in the soak.
    #[arg(long, default_value_t = 0.8)]
    fraction: f64,
    /// Offer this many messages per second and skip the search.
    #[arg(long)]
    rate: Option<f64>,
    /// Where the search starts, msgs/s.
    #[arg(long, default_value_t = 4_000.0)]
    search_from: f64,
    /// Seconds between samples.
    #[arg(long, default_value_t = 10.0)]
    sample_s: f64,
    /// Most seconds to wait for the consumers to drain the queue after the soak.
    #[arg(long, default_value_t = 50.0)]
    drain_max_s: f64,
    /// `encryptionEnabled` on the queue.
    #[arg(long)]
    encrypted: bool,
    /// A quick run that proves the tool works (short search, 30 s soak); nothing is written.
    #[arg(long)]
    smoke: bool,
    /// The server, the JSON file, the page section and the record.
    #[command(flatten)]
    common: Common,
}

/// The section of `docs/queen1.md` this run writes.
pub const QUEEN1_SOAK_SECTION: Section = Section {
    heading: "## Soak (make bench-queen1-soak)",
    begin: "<!-- queen1-soak:begin (written by comb-bench queen1-soak; edit outside these markers) -->",
    end: "<!-- queen1-soak:end -->",
};

/// One sample of the soak.
#[derive(Debug, Clone, Serialize)]
struct Sample {
    /// End of the interval, seconds from the start of the soak.
    t_s: f64,
    pushed_per_sec: f64,
    delivered_per_sec: f64,
    e2e_p50_ms: Option<f64>,
    e2e_p99_ms: Option<f64>,
    backlog: i64,
    /// The broker's resident set, MiB.
    broker_rss_mb: Option<f64>,
    broker_cpu_cores: Option<f64>,
    pg_cpu_cores: f64,
    other_cpu_cores: f64,
    machine_busy: f64,
    /// Broker + PostgreSQL CPU per delivered message, µs.
    all_in_us_per_msg: Option<f64>,
    /// WAL bytes per delivered message.
    wal_bytes_per_msg: Option<f64>,
}

/// The verdict's figures.
#[derive(Debug, Clone, Serialize)]
struct Summary {
    searched_max_per_sec: Option<f64>,
    fraction: Option<f64>,
    offered_per_sec: f64,
    soak_s: f64,
    mean_delivered_per_sec: Option<f64>,
    /// Coefficient of variation of the per-interval delivered rate, %.
    delivered_cv_pct: Option<f64>,
    min_delivered_per_sec: Option<f64>,
    max_delivered_per_sec: Option<f64>,
    e2e_p50_ms: Option<f64>,
    e2e_p99_ms: Option<f64>,
    /// Worst interval's p99.
    worst_interval_p99_ms: Option<f64>,
    rss_first_mb: Option<f64>,
    rss_last_mb: Option<f64>,
    rss_max_mb: Option<f64>,
    /// Slope of the RSS over the last two thirds of the soak, MiB per hour.
    rss_slope_mb_per_hour: Option<f64>,
    all_in_us_per_msg: Option<f64>,
    wal_bytes_per_msg: Option<f64>,
    accepted: u64,
    delivered: u64,
    lost: u64,
    redelivered: u64,
    duplicates: u64,
    phantoms: u64,
    backlog_after_drain: i64,
    errors: u64,
    verdict: String,
}

#[derive(Serialize)]
struct Results<'a> {
    summary: &'a Summary,
    search: &'a Option<super::Search>,
    samples: &'a [Sample],
}

/// Runs the soak and writes its records.
pub fn run(args: Args) -> Result<(), BoxError> {
    let (soak_s, sample_s) = match args.smoke {
        true => (30.0, 5.0),
        false => (args.duration_s, args.sample_s),
    };
    if !(soak_s > 0.0 && sample_s > 0.0 && args.fraction > 0.0) {
        return Err("duration, sample length and fraction must be positive".into());
    }
    let session = Session::start(&args.common, true, &[("commit_delay", "200")])?;
    let url = session.cluster.pg.create_database("queen1_soak")?;
    let mut flags = serve_args();
    flags.extend(args.common.comb_args.iter().cloned());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let server = Server::start_with_env(&args.common.comb, &url, &flags, &serve_env())?;
    let (addr, pid) = (server.addr(), server.pid());
    let started = shell_date();
    let out = block_on(measure(&args, soak_s, sample_s, &url, addr, pid))??;
    drop(server);
    let summary = summarize(&args, soak_s, &out);
    let report = render(&args, soak_s, sample_s, &started, &out, &summary);
    session.finish(
        &args.common.out,
        args.smoke,
        Finished {
            report: &report,
            name: "queen1-soak",
            results: &Results {
                summary: &summary,
                search: &out.search,
                samples: &out.samples,
            },
            section: &QUEEN1_SOAK_SECTION,
        },
    )
}

fn shell_date() -> String {
    crate::report::shell("date -u +%Y-%m-%dT%H:%MZ; uptime")
}

struct Outcome {
    search: Option<super::Search>,
    offered: f64,
    samples: Vec<Sample>,
    e2e: hdrhistogram::Histogram<u64>,
    accepted: u64,
    delivered: u64,
    lost: u64,
    redelivered: u64,
    duplicates: u64,
    phantoms: u64,
    backlog_after_drain: i64,
    errors: u64,
    uptime_end: String,
}

async fn measure(
    args: &Args,
    soak_s: f64,
    sample_s: f64,
    url: &str,
    addr: SocketAddr,
    pid: u32,
) -> Result<Outcome, BoxError> {
    load::configure(addr, &queue_options(args.encrypted)).await?;
    let live = Arc::new(Live::default());
    let filled = load::fill(addr, PARTITIONS, 1, 4).await?;
    live.pushed.fetch_add(filled, Ordering::Relaxed);
    let consumers = consume(addr, live.clone());
    let search_result = match args.rate {
        Some(_) => None,
        None => {
            let plan = SearchPlan {
                start: args.search_from,
                warmup: 3.0,
                secs: if args.smoke { 4.0 } else { 8.0 },
                probes: if args.smoke { 3 } else { 7 },
                resolution: 1.15,
            };
            eprintln!("rate search from {:.0} msg/s", plan.start);
            Some(search(addr, &live, plan).await)
        }
    };
    let offered = match (&search_result, args.rate) {
        (_, Some(r)) => r,
        (Some(s), None) => s.rate * args.fraction,
        _ => unreachable!(),
    };
    drain(&live, offered * 0.5, Duration::from_secs(30)).await;
    eprintln!("soak: {offered:.0} msg/s for {soak_s:.0} s, a sample every {sample_s:.0} s");

    let client = peers::connect(url).await?;
    client.batch_execute("ANALYZE; CHECKPOINT").await?;
    let meter = Meter::new(Some(pid), client).await?;
    let mut snapshot = meter.snapshot().await;
    let _ = live.take();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(soak_s);
    let producers = produce(addr, live.clone(), offered, end);
    let mut samples = Vec::new();
    let mut all_e2e = histogram();
    let sampling = async {
        let mut at = start;
        let mut mark = (
            live.pushed.load(Ordering::Relaxed),
            live.consumed.load(Ordering::Relaxed),
        );
        for t in ticks(soak_s, sample_s) {
            tokio::time::sleep_until((start + Duration::from_secs_f64(t)).into()).await;
            let now = Instant::now();
            let secs = (now - at).as_secs_f64().max(1e-3);
            at = now;
            let (e2e, _, _) = live.take();
            let counts = (
                live.pushed.load(Ordering::Relaxed),
                live.consumed.load(Ordering::Relaxed),
            );
            let next = meter.snapshot().await;
            let u = usage(&snapshot, &next);
            snapshot = next;
            let delivered = (counts.1 - mark.1) as f64;
            let cores = |cpu: f64| cpu / u.secs.max(1e-3);
            let sample = Sample {
                t_s: (t * 10.0).round() / 10.0,
                pushed_per_sec: (counts.0 - mark.0) as f64 / secs,
                delivered_per_sec: delivered / secs,
                e2e_p50_ms: quantile_ms(&e2e, 0.5),
                e2e_p99_ms: quantile_ms(&e2e, 0.99),
                backlog: live.backlog(),
                broker_rss_mb: rss_mb(pid),
                broker_cpu_cores: u.broker_cpu.map(cores),
                pg_cpu_cores: cores(u.pg_cpu),
                other_cpu_cores: cores(u.other_cpu),
                machine_busy: u.machine_busy,
                all_in_us_per_msg: (delivered > 0.0)
                    .then(|| (u.broker_cpu.unwrap_or(0.0) + u.pg_cpu) * 1e6 / delivered),
                wal_bytes_per_msg: u
                    .wal_bytes
                    .filter(|_| delivered > 0.0)
                    .map(|b| b / delivered),
            };
            mark = counts;
            all_e2e.add(&e2e).expect("same bounds");
            eprintln!(
                "  {:>6.0} s push {:>7.0}/s delivered {:>7.0}/s e2e p50 {:>6} p99 {:>6} ms backlog \
                 {:>6} RSS {:>6} MiB all-in {:>5} µs/msg",
                sample.t_s,
                sample.pushed_per_sec,
                sample.delivered_per_sec,
                num(sample.e2e_p50_ms),
                num(sample.e2e_p99_ms),
                sample.backlog,
                num(sample.broker_rss_mb),
                num(sample.all_in_us_per_msg),
            );
            samples.push(sample);
        }
    };
    tokio::join!(producers, sampling);
    // Everything accepted is delivered once the consumers have drained the queue.
    drain(&live, 0.0, Duration::from_secs_f64(args.drain_max_s)).await;
    stop(&live, consumers).await;
    let audit = live.audit.lock().expect("not poisoned");
    Ok(Outcome {
        search: search_result,
        offered,
        samples,
        e2e: all_e2e,
        accepted: audit.accepted(),
        delivered: audit.delivered(),
        lost: audit.lost(),
        redelivered: audit.redelivered,
        duplicates: audit.duplicates,
        phantoms: audit.unaccepted(),
        backlog_after_drain: live.backlog(),
        errors: live.errors.load(Ordering::Relaxed),
        uptime_end: crate::report::shell("uptime"),
    })
}

fn summarize(args: &Args, soak_s: f64, out: &Outcome) -> Summary {
    let s = &out.samples;
    // The last interval may be short and the first holds the start: steadiness is judged on
    // the full intervals after the first.
    let steady: Vec<f64> = s
        .iter()
        .skip(1)
        .take(s.len().saturating_sub(2))
        .map(|x| x.delivered_per_sec)
        .collect();
    let m = mean(&steady);
    let cv = m.filter(|m| *m > 0.0).map(|m| {
        let var = steady.iter().map(|x| (x - m).powi(2)).sum::<f64>() / steady.len() as f64;
        100.0 * var.sqrt() / m
    });
    let rss: Vec<(f64, f64)> = s
        .iter()
        .filter(|x| x.t_s > soak_s / 3.0)
        .filter_map(|x| x.broker_rss_mb.map(|r| (x.t_s / 3600.0, r)))
        .collect();
    let all_rss: Vec<f64> = s.iter().filter_map(|x| x.broker_rss_mb).collect();
    let per_msg: Vec<f64> = s.iter().filter_map(|x| x.all_in_us_per_msg).collect();
    let wal: Vec<f64> = s.iter().filter_map(|x| x.wal_bytes_per_msg).collect();
    let rss_slope = slope(&rss);
    let audit_ok = out.lost == 0 && out.phantoms == 0 && out.duplicates == 0;
    let steady_ok = cv.is_some_and(|c| c <= 10.0);
    let rss_ok = rss_slope
        .zip(mean(&all_rss))
        .is_none_or(|(k, m)| (k * soak_s / 3600.0).abs() <= 0.1 * m);
    let verdict = match (audit_ok, steady_ok, rss_ok) {
        (true, true, true) => "pass: 0 lost, steady rate, flat RSS".to_string(),
        _ => format!(
            "FAIL:{}{}{}",
            if audit_ok { "" } else { " audit" },
            if steady_ok {
                ""
            } else {
                " rate not steady (CV > 10 %)"
            },
            if rss_ok {
                ""
            } else {
                " RSS grows (> 10 % over the soak)"
            }
        ),
    };
    Summary {
        searched_max_per_sec: out.search.as_ref().map(|s| s.rate),
        fraction: args.rate.is_none().then_some(args.fraction),
        offered_per_sec: out.offered,
        soak_s,
        mean_delivered_per_sec: m,
        delivered_cv_pct: cv,
        min_delivered_per_sec: steady.iter().copied().reduce(f64::min),
        max_delivered_per_sec: steady.iter().copied().reduce(f64::max),
        e2e_p50_ms: quantile_ms(&out.e2e, 0.5),
        e2e_p99_ms: quantile_ms(&out.e2e, 0.99),
        worst_interval_p99_ms: s.iter().filter_map(|x| x.e2e_p99_ms).reduce(f64::max),
        rss_first_mb: all_rss.first().copied(),
        rss_last_mb: all_rss.last().copied(),
        rss_max_mb: all_rss.iter().copied().reduce(f64::max),
        rss_slope_mb_per_hour: rss_slope,
        all_in_us_per_msg: mean(&per_msg),
        wal_bytes_per_msg: mean(&wal),
        accepted: out.accepted,
        delivered: out.delivered,
        lost: out.lost,
        redelivered: out.redelivered,
        duplicates: out.duplicates,
        phantoms: out.phantoms,
        backlog_after_drain: out.backlog_after_drain,
        errors: out.errors,
        verdict,
    }
}

fn render(
    args: &Args,
    soak_s: f64,
    sample_s: f64,
    started: &str,
    out: &Outcome,
    s: &Summary,
) -> Report {
    let mut head = String::new();
    let _ = writeln!(
        head,
        "queen1 load: {PARTITIONS} partitions, pushes of {} with transactionIds, pops of up to \
         {} over up to {} partitions with async acks, {} B payloads, retentionSeconds {}, \
         encryption {}; database commit_delay=200, synchronous_commit=on.",
        super::PUSH_BATCH,
        super::POP_BATCH,
        super::POP_PARTITIONS,
        super::PAYLOAD_BYTES,
        super::RETENTION_S,
        if args.encrypted { "on" } else { "off" },
    );
    let _ = writeln!(head, "Start: {}", started.replace('\n', "; "));
    if let Some(search) = &out.search {
        let probes: Vec<String> = search
            .probes
            .iter()
            .map(|p| format!("{:.0}{}", p.offered, if p.keeps_up { "+" } else { "-" }))
            .collect();
        let _ = writeln!(
            head,
            "Search: probes {} (+ kept up): max {:.0} msg/s; soak at {:.0} % = {:.0} msg/s for {:.0} s.",
            probes.join(" "),
            search.rate,
            100.0 * args.fraction,
            out.offered,
            soak_s
        );
    } else {
        let _ = writeln!(
            head,
            "Soak at {:.0} msg/s (given) for {soak_s:.0} s.",
            out.offered
        );
    }
    head.push('\n');
    let mut samples = format!(
        "Every {sample_s:.0} s: t, pushed/s, delivered/s, e2e p50, p99 ms, backlog, RSS MiB, \
         broker + PostgreSQL + other cores, busy, all-in µs/msg, WAL B/msg\n"
    );
    for x in &out.samples {
        let _ = writeln!(
            samples,
            "{:>6.0} {:>7.0} {:>7.0} {:>6} {:>6} {:>6} {:>6} {:>5}+{:>5}+{:>5} {:>3.0}% {:>5} {:>5}",
            x.t_s,
            x.pushed_per_sec,
            x.delivered_per_sec,
            num(x.e2e_p50_ms),
            num(x.e2e_p99_ms),
            x.backlog,
            num(x.broker_rss_mb),
            num(x.broker_cpu_cores),
            num(Some(x.pg_cpu_cores)),
            num(Some(x.other_cpu_cores)),
            x.machine_busy * 100.0,
            num(x.all_in_us_per_msg),
            num(x.wal_bytes_per_msg),
        );
    }
    samples.push('\n');
    let mut tail = String::new();
    let _ = writeln!(
        tail,
        "Rate: delivered {} msg/s on average (offered {:.0}); per interval min {}, max {}, CV {} %.",
        num(s.mean_delivered_per_sec),
        s.offered_per_sec,
        num(s.min_delivered_per_sec),
        num(s.max_delivered_per_sec),
        num(s.delivered_cv_pct)
    );
    let _ = writeln!(
        tail,
        "Latency: e2e p50 {} ms, p99 {} ms over the soak; worst interval p99 {} ms.",
        num(s.e2e_p50_ms),
        num(s.e2e_p99_ms),
        num(s.worst_interval_p99_ms)
    );
    let _ = writeln!(
        tail,
        "Broker RSS: first {} MiB, last {}, max {}; slope over the last two thirds {} MiB/h.",
        num(s.rss_first_mb),
        num(s.rss_last_mb),
        num(s.rss_max_mb),
        num(s.rss_slope_mb_per_hour)
    );
    let _ = writeln!(
        tail,
        "Cost: all-in {} µs CPU per delivered message (broker + PostgreSQL), WAL {} B per message.",
        num(s.all_in_us_per_msg),
        num(s.wal_bytes_per_msg)
    );
    let _ = writeln!(
        tail,
        "Audit: {} accepted, {} delivered, {} lost, {} redelivered, {} answered duplicate, {} \
         phantoms; backlog after the drain {}; {} failed requests.",
        s.accepted,
        s.delivered,
        s.lost,
        s.redelivered,
        s.duplicates,
        s.phantoms,
        s.backlog_after_drain,
        s.errors
    );
    let busy: Vec<f64> = out.samples.iter().map(|x| x.machine_busy).collect();
    let other: Vec<f64> = out.samples.iter().map(|x| x.other_cpu_cores).collect();
    let _ = writeln!(tail, "{}", machine_load(&busy, &other));
    let _ = writeln!(tail, "End: {}", out.uptime_end);
    let _ = writeln!(tail, "Verdict: {}", s.verdict);
    Report {
        head,
        samples,
        tail,
    }
}
