//! Results: one [`Row`] per cell, the printed table, the target checks, the JSON file and
//! the results section of `docs/benchmarks.md`.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

/// One cell's figures. Fields that do not apply to a cell are `None` (JSON `null`), so that
/// scripts can compare runs key by key.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Row {
    /// Cell name.
    pub cell: String,
    /// `comb`, `ceiling` or `skiplocked`.
    pub system: String,
    /// Messages per second by the cell's main measure (pushed for push cells, delivered for
    /// consumer cells, deliveries summed over groups for fan-out, rows for the ceiling).
    pub msgs_per_sec: f64,
    /// Requests per second (HTTP requests for Comb, statements for peers).
    pub req_per_sec: Option<f64>,
    /// Median latency of the cell's main request (push, pop, COPY or INSERT), ms.
    pub p50_ms: Option<f64>,
    /// 99th percentile of the same, ms.
    pub p99_ms: Option<f64>,
    /// Median delivery latency, producer send to consumer receipt, ms.
    pub e2e_p50_ms: Option<f64>,
    /// 99th percentile delivery latency, ms.
    pub e2e_p99_ms: Option<f64>,
    /// 99th percentile latency of pops (or dequeues), ms.
    pub pop_p99_ms: Option<f64>,
    /// 99th percentile latency of ack batches, ms.
    pub ack_p99_ms: Option<f64>,
    /// Broker CPU per HTTP request over the window, µs.
    pub broker_cpu_us_per_req: Option<f64>,
    /// Broker CPU per message (by `msgs_per_sec`'s measure), µs.
    pub broker_cpu_us_per_msg: Option<f64>,
    /// Broker peak resident set size over the cell (VmHWM), MiB.
    pub broker_rss_mb: Option<f64>,
    /// Broker CPU in cores (CPU seconds per second).
    pub broker_cpu_cores: Option<f64>,
    /// PostgreSQL CPU in cores.
    pub pg_cpu_cores: Option<f64>,
    /// Broker and PostgreSQL CPU together, in cores: what the queue costs the machine.
    pub all_in_cpu_cores: Option<f64>,
    /// Broker and PostgreSQL CPU per message (by `msgs_per_sec`'s measure: per delivered
    /// message in consumer cells), µs.
    pub all_in_cpu_us_per_msg: Option<f64>,
    /// Load generator CPU in cores.
    pub loadgen_cpu_cores: Option<f64>,
    /// CPU used by everything else on the machine, in cores: on a shared machine, the
    /// neighbours' share of the cores the cell ran on.
    pub other_cpu_cores: Option<f64>,
    /// Busy fraction of the whole machine (all cores), 0–1.
    pub machine_busy: Option<f64>,
    /// Fraction of the machine's time stolen by the hypervisor, 0–1.
    pub machine_steal: Option<f64>,
    /// Transactions committed per second (whole cluster).
    pub pg_commits_per_sec: Option<f64>,
    /// WAL flushes per second.
    pub pg_wal_syncs_per_sec: Option<f64>,
    /// WAL bytes per message.
    pub pg_wal_bytes_per_msg: Option<f64>,
    /// Offered rate of fixed-rate producers, msgs/s.
    pub offered_per_sec: Option<f64>,
    /// Messages accepted per second.
    pub pushed_per_sec: Option<f64>,
    /// Messages delivered per second (per group for fan-out: the slowest group).
    pub consumed_per_sec: Option<f64>,
    /// Backlog at the end of the window (worst group), messages.
    pub backlog_end: Option<f64>,
    /// Backlog growth over the window (worst group), msgs/s.
    pub backlog_slope: Option<f64>,
    /// Whether consumers kept up: producers met the offered rate and backlog stayed flat.
    pub keeps_up: Option<bool>,
    /// For peers: the compared Comb cell's rate divided by this row's.
    pub ratio: Option<f64>,
    /// The Comb cell of `ratio`.
    pub ratio_of: Option<String>,
    /// Failed requests during the cell.
    pub errors: u64,
    /// Length of the measured window, s.
    pub window_s: f64,
    /// Anything a reader must know about this cell's numbers.
    pub note: Option<String>,
    /// What each PostgreSQL node did (`comb-bench --citus`): a row per node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<crate::nodes::NodeRow>,
    /// On Citus, the route the broker ran with (`direct` or `coordinator`,
    /// [`crate::scaleout::route_of`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
}

/// Fills `ratio` of every peer row from the Comb cell it is compared with.
pub fn fill_ratios(rows: &mut [Row], compare: impl Fn(&str) -> Option<&'static str>) {
    let comb: Vec<(String, f64)> = rows
        .iter()
        .filter(|r| r.system == "comb")
        .map(|r| (r.cell.clone(), r.msgs_per_sec))
        .collect();
    for r in rows.iter_mut().filter(|r| r.system != "comb") {
        let Some(other) = compare(&r.cell) else {
            continue;
        };
        r.ratio_of = Some(other.to_string());
        r.ratio = comb
            .iter()
            .find(|(c, _)| c == other)
            .filter(|_| r.msgs_per_sec > 0.0)
            .map(|(_, rate)| rate / r.msgs_per_sec);
    }
}

/// Whether a row is of a server given with `--peer` (not Comb, nor one of the suite's own
/// SQL peers).
pub fn is_program_peer(row: &Row) -> bool {
    !["comb", "ceiling", "skiplocked"].contains(&row.system.as_str())
}

/// Fills `ratio` of every `--peer` server's row: the same cell's Comb rate divided by its.
pub fn fill_program_ratios(rows: &mut [Row]) {
    let comb: Vec<(String, f64)> = rows
        .iter()
        .filter(|r| r.system == "comb")
        .map(|r| (r.cell.clone(), r.msgs_per_sec))
        .collect();
    for r in rows.iter_mut().filter(|r| is_program_peer(r)) {
        r.ratio_of = Some(r.cell.clone());
        r.ratio = comb
            .iter()
            .find(|(c, _)| *c == r.cell)
            .filter(|_| r.msgs_per_sec > 0.0)
            .map(|(_, rate)| rate / r.msgs_per_sec);
    }
}

/// Comb ÷ each `--peer` server, cell by cell: rate (above 1: Comb faster), and latency, CPU
/// and memory (below 1: Comb lower). Empty when no peer server ran.
pub fn program_table(rows: &[Row]) -> String {
    type Figure = (&'static str, fn(&Row) -> Option<f64>);
    const FIGURES: [Figure; 7] = [
        ("msg/s", |r| Some(r.msgs_per_sec)),
        ("p99", |r| r.p99_ms),
        ("e2e p99", |r| r.e2e_p99_ms),
        ("all-in us/msg", |r| r.all_in_cpu_us_per_msg),
        ("broker us/msg", |r| r.broker_cpu_us_per_msg),
        ("pg cpu", |r| r.pg_cpu_cores),
        ("RSS MB", |r| r.broker_rss_mb),
    ];
    let mut header = vec!["cell".to_string(), "peer".to_string()];
    header.extend(FIGURES.iter().map(|f| format!("{} ratio", f.0)));
    let mut lines = Vec::new();
    for peer in rows.iter().filter(|r| is_program_peer(r)) {
        let Some(comb) = rows
            .iter()
            .find(|r| r.system == "comb" && r.cell == peer.cell)
        else {
            continue;
        };
        let mut line = vec![peer.cell.clone(), peer.system.clone()];
        for (_, f) in FIGURES {
            let ratio = f(comb)
                .zip(f(peer))
                .filter(|(_, p)| *p > 0.0)
                .map(|(c, p)| c / p);
            line.push(num(ratio));
        }
        lines.push(line);
    }
    if lines.is_empty() {
        return String::new();
    }
    format!("Comb / peer, by cell:\n\n{}", align(&header, &lines))
}

/// A number for the table: integers above 100, otherwise three significant digits.
pub fn num(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if !v.is_finite() => "-".into(),
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 10.0 => format!("{v:.1}"),
        Some(v) if v.abs() >= 1.0 => format!("{v:.2}"),
        Some(v) => format!("{v:.3}"),
    }
}

fn pct(v: Option<f64>) -> String {
    v.map(|v| format!("{:.0}%", v * 100.0))
        .unwrap_or_else(|| "-".into())
}

/// The table printed at the end of a run (and copied into the docs).
pub fn table(rows: &[Row]) -> String {
    let header = [
        "cell",
        "system",
        "msg/s",
        "req/s",
        "p50 ms",
        "p99 ms",
        "e2e p50",
        "e2e p99",
        "all-in us/msg",
        "all-in cpu",
        "us/req",
        "us/msg",
        "RSS MB",
        "comb cpu",
        "pg cpu",
        "bench cpu",
        "other cpu",
        "busy",
        "steal",
        "commit/s",
        "ratio",
        "notes",
    ];
    let mut lines: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    for r in rows {
        lines.push(vec![
            r.cell.clone(),
            r.system.clone(),
            num(Some(r.msgs_per_sec)),
            num(r.req_per_sec),
            num(r.p50_ms),
            num(r.p99_ms),
            num(r.e2e_p50_ms),
            num(r.e2e_p99_ms),
            num(r.all_in_cpu_us_per_msg),
            num(r.all_in_cpu_cores),
            num(r.broker_cpu_us_per_req),
            num(r.broker_cpu_us_per_msg),
            num(r.broker_rss_mb),
            num(r.broker_cpu_cores),
            num(r.pg_cpu_cores),
            num(r.loadgen_cpu_cores),
            num(r.other_cpu_cores),
            pct(r.machine_busy),
            pct(r.machine_steal),
            num(r.pg_commits_per_sec),
            match (&r.ratio, &r.ratio_of) {
                (Some(x), Some(of)) => format!("{x:.2} ({of})"),
                _ => "-".into(),
            },
            notes(r),
        ]);
    }
    let cols = header.len();
    let width: Vec<usize> = (0..cols)
        .map(|c| {
            lines
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for (i, l) in lines.iter().enumerate() {
        let mut line = String::new();
        for c in 0..cols {
            let cell = &l[c];
            let pad = width[c] - cell.chars().count();
            if c == cols - 1 {
                line.push_str(cell);
            } else if c < 2 {
                let _ = write!(line, "{cell}{}  ", " ".repeat(pad));
            } else {
                let _ = write!(line, "{}{cell}  ", " ".repeat(pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
        if i == 0 {
            let total: usize = width.iter().sum::<usize>() + 2 * (cols - 1);
            out.push_str(&"-".repeat(total.min(200)));
            out.push('\n');
        }
    }
    out
}

fn notes(r: &Row) -> String {
    let mut parts = Vec::new();
    if let Some(offered) = r.offered_per_sec {
        parts.push(format!(
            "offered {} pushed {}",
            num(Some(offered)),
            num(r.pushed_per_sec)
        ));
    }
    if r.system == "skiplocked" && r.consumed_per_sec.is_some() {
        parts.push(format!(
            "enq {} deq {}",
            num(r.pushed_per_sec),
            num(r.consumed_per_sec)
        ));
    }
    if let Some(s) = r.backlog_slope {
        parts.push(format!("backlog {:+.0}/s end {}", s, num(r.backlog_end)));
    }
    match r.keeps_up {
        Some(true) => parts.push("keeps up".into()),
        Some(false) => parts.push("FALLS BEHIND".into()),
        None => {}
    }
    if r.errors > 0 {
        parts.push(format!("{} errors", r.errors));
    }
    if let Some(n) = &r.note {
        parts.push(n.clone());
    }
    parts.join("; ")
}

/// Whether a performance target holds in this run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The figures meet it.
    Met,
    /// The figures miss it.
    Missed,
    /// A cell it needs did not run.
    NotRun,
}

impl From<Option<bool>> for Verdict {
    /// Met or missed when the figures could be judged; not run when a figure is missing.
    fn from(ok: Option<bool>) -> Verdict {
        match ok {
            Some(true) => Verdict::Met,
            Some(false) => Verdict::Missed,
            None => Verdict::NotRun,
        }
    }
}

/// One of the issue's targets, checked against a run.
#[derive(Debug, Clone)]
pub struct Check {
    /// The target, in words.
    pub target: &'static str,
    /// The figures it was judged on.
    pub measured: String,
    /// The outcome.
    pub verdict: Verdict,
}

/// Checks the performance targets against a run's rows. These are benchmark figures, to be
/// read by people, never asserted by tests.
pub fn checks(rows: &[Row]) -> Vec<Check> {
    let get = |name: &str| rows.iter().find(|r| r.cell == name);
    let verdict = Verdict::from;
    let mut out = Vec::new();

    let (p100, ceil) = (get("push100"), get("ceiling"));
    let ratio = p100.zip(ceil).map(|(a, b)| a.msgs_per_sec / b.msgs_per_sec);
    out.push(Check {
        target: "push 100 msgs/request >= 70% of the ceiling",
        measured: ratio
            .map(|r| {
                format!(
                    "{:.1}% ({} vs {} msg/s)",
                    r * 100.0,
                    num(p100.map(|r| r.msgs_per_sec)),
                    num(ceil.map(|r| r.msgs_per_sec))
                )
            })
            .unwrap_or_default(),
        verdict: verdict(ratio.map(|r| r >= 0.70)),
    });

    let (p1, sl) = (get("push1"), get("sl-enq"));
    let ratio = p1.zip(sl).map(|(a, b)| a.msgs_per_sec / b.msgs_per_sec);
    out.push(Check {
        target: "push 1 msg/request >= 1.5x SKIP LOCKED enqueue",
        measured: ratio
            .map(|r| {
                format!(
                    "{r:.2}x ({} vs {} msg/s)",
                    num(p1.map(|r| r.msgs_per_sec)),
                    num(sl.map(|r| r.msgs_per_sec))
                )
            })
            .unwrap_or_default(),
        verdict: verdict(ratio.map(|r| r >= 1.5)),
    });

    let cpu = p1.and_then(|r| r.broker_cpu_us_per_req);
    out.push(Check {
        target: "push 1 msg/request <= 40 us broker CPU per request",
        measured: cpu.map(|c| format!("{c:.1} us")).unwrap_or_default(),
        verdict: verdict(cpu.map(|c| c <= 40.0)),
    });

    let (k10, k10k) = (get("part10"), get("part10k"));
    let ratio = k10.zip(k10k).map(|(a, b)| b.msgs_per_sec / a.msgs_per_sec);
    out.push(Check {
        target: "10,000 partitions >= 85% of the 10-partition rate",
        measured: ratio
            .map(|r| {
                format!(
                    "{:.1}% ({} vs {} msg/s)",
                    r * 100.0,
                    num(k10k.map(|r| r.msgs_per_sec)),
                    num(k10.map(|r| r.msgs_per_sec))
                )
            })
            .unwrap_or_default(),
        verdict: verdict(ratio.map(|r| r >= 0.85)),
    });

    let steady = get("steady");
    out.push(Check {
        target: "steady: consumers keep up with push1's rate (backlog flat)",
        measured: steady
            .map(|r| {
                format!(
                    "offered {} pushed {} delivered {} msg/s, backlog {:+.0}/s",
                    num(r.offered_per_sec),
                    num(r.pushed_per_sec),
                    num(Some(r.msgs_per_sec)),
                    r.backlog_slope.unwrap_or(0.0)
                )
            })
            .unwrap_or_default(),
        verdict: verdict(steady.and_then(|r| r.keeps_up)),
    });

    let p99 = steady.and_then(|r| r.e2e_p99_ms);
    out.push(Check {
        target: "steady: end-to-end p99 <= 100 ms",
        measured: p99.map(|p| format!("{p:.1} ms")).unwrap_or_default(),
        verdict: verdict(p99.map(|p| p <= 100.0)),
    });

    let half = get("steady-half");
    let p99 = half.and_then(|r| r.e2e_p99_ms);
    out.push(Check {
        target: "steady at half that rate: end-to-end p99 <= 50 ms",
        measured: p99
            .map(|p| format!("{p:.1} ms at {} msg/s", num(half.map(|r| r.msgs_per_sec))))
            .unwrap_or_default(),
        verdict: verdict(p99.map(|p| p <= 50.0)),
    });

    for (cell, fraction, target) in FANOUT_CHECKS {
        out.push(fanout_check(get(cell), get("push10"), fraction, target));
    }

    out.extend(light_checks(rows));

    out.extend(delivery_checks(rows));
    out.push(crate::stream_state::check(rows));

    let rss: Vec<(&str, f64)> = rows
        .iter()
        .filter_map(|r| r.broker_rss_mb.map(|m| (r.cell.as_str(), m)))
        .collect();
    let worst = rss.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1));
    out.push(Check {
        target: "broker RSS <= 64 MB in every cell",
        measured: worst
            .map(|(c, m)| format!("max {m:.1} MB ({c})"))
            .unwrap_or_default(),
        verdict: verdict(worst.map(|(_, m)| m <= 64.0)),
    });
    out
}

/// The fan-out cells judged, with the fraction of `push10`'s rate each offers: the same
/// deliveries in all over 10 groups and over 50.
const FANOUT_CHECKS: [(&str, f64, &str); 2] = [
    (
        "fanout",
        0.1,
        "fan-out: 10 groups keep up with a producer at 10% of push10, e2e p99 <= 250 ms",
    ),
    (
        "fanout50",
        0.02,
        "fan-out: 50 groups keep up with a producer at 2% of push10, e2e p99 <= 250 ms",
    ),
];

/// A fan-out cell keeps up: every group consumes what is pushed (the slowest group's rate,
/// the backlog's slope), the producer got its offered share of `push10`, and e2e p99 stays
/// within 250 ms.
fn fanout_check(
    fan: Option<&Row>,
    p10: Option<&Row>,
    fraction: f64,
    target: &'static str,
) -> Check {
    let fan_ok = fan.zip(p10).map(|(f, p)| {
        f.keeps_up == Some(true)
            && f.pushed_per_sec.unwrap_or(0.0) >= fraction * p.msgs_per_sec * 0.97
            && f.e2e_p99_ms.is_some_and(|e| e <= 250.0)
    });
    Check {
        target,
        measured: fan
            .map(|r| {
                format!(
                    "producer {} msg/s ({}), slowest group {} msg/s, backlog {:+.0}/s, e2e p99 {} ms",
                    num(r.pushed_per_sec),
                    p10.map(|p| format!(
                        "{:.0}% of push10",
                        100.0 * r.pushed_per_sec.unwrap_or(0.0) / p.msgs_per_sec
                    ))
                    .unwrap_or_default(),
                    num(r.consumed_per_sec),
                    r.backlog_slope.unwrap_or(0.0),
                    num(r.e2e_p99_ms)
                )
            })
            .unwrap_or_default(),
        verdict: Verdict::from(fan_ok),
    }
}

/// The light cells' targets: a quiet queue delivers quickly and costs little, no more than
/// the SKIP LOCKED table at the same rate, and hardly more over ten times the partitions.
fn light_checks(rows: &[Row]) -> Vec<Check> {
    let get = |cell: &str, system: &str| rows.iter().find(|r| r.cell == cell && r.system == system);
    let (light, sl, k) = (
        get("light", "comb"),
        get("sl-light", "skiplocked"),
        get("light-1k", "comb"),
    );
    let p99 = light.and_then(|r| r.e2e_p99_ms);
    let cores = light.and_then(|r| r.all_in_cpu_cores);
    let sl_cores = sl.and_then(|r| r.all_in_cpu_cores);
    let within = |f: fn(&Row) -> Option<f64>| {
        light
            .and_then(f)
            .zip(k.and_then(f))
            .map(|(a, b)| (b / a, b <= 1.5 * a))
    };
    let (p99_ratio, cpu_ratio) = (within(|r| r.e2e_p99_ms), within(|r| r.all_in_cpu_cores));
    vec![
        Check {
            target: "light: end-to-end p99 <= 20 ms",
            measured: p99.map(|p| format!("{p:.1} ms")).unwrap_or_default(),
            verdict: Verdict::from(p99.map(|p| p <= 20.0)),
        },
        Check {
            target: "light: all-in CPU <= 0.15 cores and <= the SKIP LOCKED peer's",
            measured: cores
                .map(|c| {
                    format!(
                        "{c:.3} cores ({} us/msg), SKIP LOCKED {} cores",
                        num(light.and_then(|r| r.all_in_cpu_us_per_msg)),
                        num(sl_cores)
                    )
                })
                .unwrap_or_default(),
            verdict: Verdict::from(cores.zip(sl_cores).map(|(c, s)| c <= 0.15 && c <= s)),
        },
        Check {
            target: "light-1k within 1.5x of light (e2e p99 and all-in CPU)",
            measured: p99_ratio
                .zip(cpu_ratio)
                .map(|(p, c)| format!("e2e p99 {:.2}x, all-in CPU {:.2}x", p.0, c.0))
                .unwrap_or_default(),
            verdict: Verdict::from(p99_ratio.zip(cpu_ratio).map(|(p, c)| p.1 && c.1)),
        },
    ]
}

/// What delivering costs next to pushing: a delivered message at most twice a pushed one at
/// the same rate, light fan-out at most twice light's CPU, both light cells within their
/// peers' CPU and 10 ms end to end, and waiting consumers costing next to nothing.
fn delivery_checks(rows: &[Row]) -> Vec<Check> {
    let get = |cell: &str, system: &str| rows.iter().find(|r| r.cell == cell && r.system == system);
    let cores = |r: Option<&Row>| r.and_then(|r| r.all_in_cpu_cores);
    let mut out = Vec::new();

    let pairs = [("light", "sl-light"), ("light-1k", "sl-light-1k")];
    let judged: Vec<Option<(String, bool)>> = pairs
        .iter()
        .map(|(cell, peer)| {
            let c = get(cell, "comb")?;
            let (p99, cpu, sl) = (
                c.e2e_p99_ms?,
                c.all_in_cpu_cores?,
                cores(get(peer, "skiplocked"))?,
            );
            Some((
                format!("{cell} e2e p99 {p99:.1} ms, {cpu:.3} vs {sl:.3} cores"),
                p99 <= 10.0 && cpu <= sl,
            ))
        })
        .collect();
    out.push(all_of(
        "light and light-1k: e2e p99 <= 10 ms and all-in CPU <= their SKIP LOCKED peers'",
        judged.into_iter().collect(),
    ));

    let per_delivered = get("light", "comb").and_then(|r| r.all_in_cpu_us_per_msg);
    let per_pushed = get("light-push", "comb").and_then(|r| r.all_in_cpu_us_per_msg);
    let ratio = per_delivered.zip(per_pushed).map(|(d, p)| d / p);
    out.push(Check {
        target: "light: all-in us per delivered message <= 2x light-push's per pushed message",
        measured: ratio
            .map(|r| format!("{r:.2}x ({} vs {} us)", num(per_delivered), num(per_pushed)))
            .unwrap_or_default(),
        verdict: Verdict::from(ratio.map(|r| r <= 2.0)),
    });

    // What a delivery cannot avoid: its push, and two more exchanges (its pop and its ack).
    let exchange = get("exchange", "comb").and_then(|r| r.all_in_cpu_us_per_msg);
    let floor = per_pushed.zip(exchange).map(|(p, e)| p + 2.0 * e);
    let judged: Option<Vec<(String, bool)>> = ["light", "light-1k"]
        .iter()
        .map(|cell| {
            let d = get(cell, "comb")?.all_in_cpu_us_per_msg?;
            let f = floor?;
            Some((
                format!("{cell} {:.2}x ({d:.0} vs {f:.0} us)", d / f),
                d <= 1.25 * f,
            ))
        })
        .collect();
    out.push(all_of(
        "light and light-1k: all-in us per delivered message <= 1.25x (light-push + 2 x exchange)",
        judged,
    ));

    let (fan, light) = (
        cores(get("fanout-light", "comb")),
        cores(get("light", "comb")),
    );
    let ratio = fan.zip(light).map(|(f, l)| f / l);
    out.push(Check {
        target: "fanout-light: all-in CPU <= 2x light's",
        measured: ratio
            .map(|r| format!("{r:.2}x ({} vs {} cores)", num(fan), num(light)))
            .unwrap_or_default(),
        verdict: Verdict::from(ratio.map(|r| r <= 2.0)),
    });

    let idle = cores(get("idle", "comb"));
    out.push(Check {
        target: "idle: all-in CPU <= 0.01 cores",
        measured: idle.map(|c| format!("{c:.4} cores")).unwrap_or_default(),
        verdict: Verdict::from(idle.map(|c| c <= 0.01)),
    });
    out
}

/// A target met when each of its cells is (each judged as its figures and whether it met);
/// not run when any cell was not.
fn all_of(target: &'static str, judged: Option<Vec<(String, bool)>>) -> Check {
    Check {
        target,
        measured: judged
            .as_ref()
            .map(|v| {
                v.iter()
                    .map(|(t, _)| t.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_default(),
        verdict: Verdict::from(judged.map(|v| v.iter().all(|(_, ok)| *ok))),
    }
}

/// The target checks as text.
pub fn checks_text(checks: &[Check]) -> String {
    let mut out = String::new();
    for c in checks {
        let v = match c.verdict {
            Verdict::Met => "met   ",
            Verdict::Missed => "MISSED",
            Verdict::NotRun => "not run",
        };
        let _ = writeln!(out, "{v}  {}: {}", c.target, c.measured);
    }
    out
}

/// Writes rows as a JSON array.
pub fn write_json(path: &Path, rows: &[Row]) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let text = serde_json::to_string_pretty(rows).map_err(io::Error::other)?;
    fs::write(path, text + "\n")
}

/// Reads rows written by [`write_json`].
pub fn read_json(path: &Path) -> io::Result<Vec<Row>> {
    let text = fs::read_to_string(path)?;
    serde_json::from_str(&text).map_err(io::Error::other)
}

/// Start of the generated part of the benchmarks page.
pub const BEGIN: &str =
    "<!-- results:begin (written by comb-bench; edit outside these markers) -->";
/// End of the generated part.
pub const END: &str = "<!-- results:end -->";

/// Replaces the text between [`BEGIN`] and [`END`] in `doc` (appending both when absent).
pub fn splice(doc: &str, generated: &str) -> String {
    match (doc.find(BEGIN), doc.find(END)) {
        (Some(b), Some(e)) if b < e => {
            format!("{}{BEGIN}\n{generated}{}", &doc[..b], &doc[e..])
        }
        _ => format!("{doc}\n{BEGIN}\n{generated}{END}\n"),
    }
}

/// A section of a Markdown page that a long run writes on its own: its heading, and markers
/// around the generated part so that text written by hand around it survives the next run.
#[derive(Debug, Clone, Copy)]
pub struct Section {
    /// The heading line, added with the markers when the page does not have them yet.
    pub heading: &'static str,
    /// The line before the generated part.
    pub begin: &'static str,
    /// The line after it.
    pub end: &'static str,
}

impl Section {
    /// Replaces the generated part of this section in `doc`, appending the section at the end
    /// of the page when it is not there yet.
    pub fn splice(&self, doc: &str, generated: &str) -> String {
        let Section {
            heading,
            begin,
            end,
        } = self;
        match (doc.find(begin), doc.find(end)) {
            (Some(b), Some(e)) if b < e => {
                format!("{}{begin}\n{generated}{}", &doc[..b], &doc[e..])
            }
            _ => {
                let sep = if doc.ends_with('\n') { "" } else { "\n" };
                format!("{doc}{sep}\n{heading}\n\n{begin}\n{generated}{end}\n")
            }
        }
    }
}

/// A plain-text table: the first two columns (names) left-aligned, the rest (numbers)
/// right-aligned, two spaces apart, a rule under the header. The long runs print many columns
/// of samples, and aligned text is what survives copying into a Markdown code block.
pub fn align(header: &[String], rows: &[Vec<String>]) -> String {
    let n = header.len();
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(n) {
            w[i] = w[i].max(c.len());
        }
    }
    let text_cols = 2;
    let fmt = |cells: &[String]| {
        let mut line = String::new();
        for (i, c) in cells.iter().enumerate().take(n) {
            if i > 0 {
                line.push_str("  ");
            }
            if i < text_cols {
                let _ = write!(line, "{c:<width$}", width = w[i]);
            } else {
                let _ = write!(line, "{c:>width$}", width = w[i]);
            }
        }
        line.trim_end().to_string()
    };
    let mut s = fmt(header);
    s.push('\n');
    s.push_str(&"-".repeat(w.iter().sum::<usize>() + 2 * (n - 1)));
    s.push('\n');
    for r in rows {
        s.push_str(&fmt(r));
        s.push('\n');
    }
    s
}

/// The CPU model from `/proc/cpuinfo`: numbers from different machines are not comparable,
/// so every recorded run names its machine.
pub fn cpu_model() -> String {
    fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The machine a run was made on, as the benchmarks page records it: CPU, cores, memory,
/// kernel and compiler.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem_gib = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0 / 1024.0)
        .unwrap_or(0.0);
    format!(
        "{}, {cores} cores, {mem_gib:.0} GiB, Linux {}, {}",
        cpu_model(),
        shell("uname -r"),
        shell("rustc --version")
    )
}

/// The trimmed standard output of a shell command (empty if it fails): dates, commits and
/// versions for the records of a run, where a missing value must not stop the run.
pub fn shell(cmd: &str) -> String {
    Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cell: &str, system: &str, rate: f64) -> Row {
        Row {
            cell: cell.into(),
            system: system.into(),
            msgs_per_sec: rate,
            ..Row::default()
        }
    }

    #[test]
    fn json_round_trip_keeps_nulls() {
        let rows = vec![row("push1", "comb", 1234.5)];
        let dir = std::env::temp_dir().join(format!("combbench{}", std::process::id()));
        let path = dir.join("r.json");
        write_json(&path, &rows).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"broker_rss_mb\": null"));
        assert!(text.contains("\"msgs_per_sec\": 1234.5"));
        assert_eq!(read_json(&path).unwrap(), rows);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn ratios_divide_comb_by_peer() {
        let mut rows = vec![
            row("push1", "comb", 3000.0),
            row("sl-enq", "skiplocked", 2000.0),
        ];
        fill_ratios(&mut rows, |c| (c == "sl-enq").then_some("push1"));
        assert_eq!(rows[1].ratio, Some(1.5));
        assert_eq!(rows[1].ratio_of.as_deref(), Some("push1"));
        assert_eq!(rows[0].ratio, None);
    }

    #[test]
    fn table_aligns_columns() {
        let mut a = row("push1", "comb", 12345.0);
        a.p99_ms = Some(3.25);
        a.keeps_up = Some(false);
        let t = table(&[a, row("ceiling", "ceiling", 99.5)]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[0].starts_with("cell "));
        assert!(lines[2].contains("12345"));
        assert!(lines[2].contains("3.25"));
        assert!(lines[2].ends_with("FALLS BEHIND"));
        assert!(lines[3].contains("99.5"));
        // Right-aligned numbers end in the same column.
        let col = |l: &str, s: &str| l.find(s).unwrap() + s.len();
        assert_eq!(col(lines[2], "12345"), col(lines[3], "99.5"));
    }

    #[test]
    fn formats_numbers() {
        assert_eq!(num(None), "-");
        assert_eq!(num(Some(1234.4)), "1234");
        assert_eq!(num(Some(12.34)), "12.3");
        assert_eq!(num(Some(1.234)), "1.23");
        assert_eq!(num(Some(0.1234)), "0.123");
        assert_eq!(num(Some(f64::NAN)), "-");
    }

    #[test]
    fn all_in_cpu_is_a_column_next_to_the_delivery_latency() {
        let mut a = row("light", "comb", 300.0);
        a.e2e_p99_ms = Some(15.0);
        a.all_in_cpu_us_per_msg = Some(333.0);
        a.all_in_cpu_cores = Some(0.1);
        let t = table(&[a]);
        let head: Vec<&str> = t
            .lines()
            .next()
            .unwrap()
            .split("  ")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        let e2e = head.iter().position(|h| *h == "e2e p99").unwrap();
        assert_eq!(head[e2e + 1], "all-in us/msg");
        assert_eq!(head[e2e + 2], "all-in cpu");
        let cells: Vec<&str> = t.lines().nth(2).unwrap().split_whitespace().collect();
        assert_eq!(&cells[e2e..e2e + 3], ["15.0", "333", "0.100"]);
    }

    #[test]
    fn light_checks_compare_with_the_peer_and_the_larger_cell() {
        let mut light = row("light", "comb", 300.0);
        light.e2e_p99_ms = Some(12.0);
        light.all_in_cpu_cores = Some(0.10);
        let mut sl = row("sl-light", "skiplocked", 300.0);
        sl.all_in_cpu_cores = Some(0.20);
        let mut k = row("light-1k", "comb", 300.0);
        k.e2e_p99_ms = Some(17.0);
        k.all_in_cpu_cores = Some(0.14);
        let mut rows = vec![light, sl, k];
        let verdict = |rows: &[Row], t: &str| {
            checks(rows)
                .into_iter()
                .find(|c| c.target.starts_with(t))
                .unwrap()
                .verdict
        };
        assert_eq!(verdict(&rows, "light: end-to-end"), Verdict::Met);
        assert_eq!(verdict(&rows, "light: all-in"), Verdict::Met);
        assert_eq!(verdict(&rows, "light-1k"), Verdict::Met);
        // Cheaper than 0.15 cores but dearer than the peer: missed.
        rows[1].all_in_cpu_cores = Some(0.05);
        assert_eq!(verdict(&rows, "light: all-in"), Verdict::Missed);
        // 1,000 partitions costing twice as much: missed.
        rows[2].all_in_cpu_cores = Some(0.2);
        assert_eq!(verdict(&rows, "light-1k"), Verdict::Missed);
        rows[0].e2e_p99_ms = Some(25.0);
        assert_eq!(verdict(&rows, "light: end-to-end"), Verdict::Missed);
        assert_eq!(verdict(&rows[1..], "light: end-to-end"), Verdict::NotRun);
    }

    #[test]
    fn delivery_checks_weigh_deliveries_against_pushes_and_waiting() {
        let mut light = row("light", "comb", 300.0);
        light.e2e_p99_ms = Some(8.0);
        light.all_in_cpu_cores = Some(0.10);
        light.all_in_cpu_us_per_msg = Some(333.0);
        let mut sl = row("sl-light", "skiplocked", 300.0);
        sl.all_in_cpu_cores = Some(0.12);
        let mut k = row("light-1k", "comb", 300.0);
        k.e2e_p99_ms = Some(9.0);
        k.all_in_cpu_cores = Some(0.11);
        let mut slk = row("sl-light-1k", "skiplocked", 300.0);
        slk.all_in_cpu_cores = Some(0.12);
        let mut push = row("light-push", "comb", 300.0);
        push.all_in_cpu_us_per_msg = Some(200.0);
        let mut fan = row("fanout-light", "comb", 3000.0);
        fan.all_in_cpu_cores = Some(0.19);
        let mut idle = row("idle", "comb", 0.0);
        idle.all_in_cpu_cores = Some(0.008);
        k.all_in_cpu_us_per_msg = Some(330.0);
        let mut exchange = row("exchange", "comb", 900.0);
        exchange.all_in_cpu_us_per_msg = Some(40.0);
        let mut rows = vec![light, sl, k, slk, push, fan, idle, exchange];
        let verdict = |rows: &[Row], t: &str| {
            checks(rows)
                .into_iter()
                .find(|c| c.target.starts_with(t))
                .unwrap()
                .verdict
        };
        assert_eq!(verdict(&rows, "light and light-1k"), Verdict::Met);
        assert_eq!(
            verdict(&rows, "light: all-in us per delivered"),
            Verdict::Met
        );
        assert_eq!(verdict(&rows, "fanout-light"), Verdict::Met);
        assert_eq!(verdict(&rows, "idle"), Verdict::Met);
        let unavoidable = "light and light-1k: all-in us per delivered message <= 1.25x";
        // 333 against 1.25 x (200 + 2 x 40) = 350.
        assert_eq!(verdict(&rows, unavoidable), Verdict::Met);
        rows[2].all_in_cpu_us_per_msg = Some(360.0);
        assert_eq!(verdict(&rows, unavoidable), Verdict::Missed);
        rows[2].all_in_cpu_us_per_msg = Some(330.0);
        rows.pop();
        assert_eq!(verdict(&rows, unavoidable), Verdict::NotRun);
        // light-1k dearer than its peer: the pair is missed.
        rows[2].all_in_cpu_cores = Some(0.13);
        assert_eq!(verdict(&rows, "light and light-1k"), Verdict::Missed);
        // A delivered message at 2.2x a pushed one.
        rows[4].all_in_cpu_us_per_msg = Some(150.0);
        assert_eq!(
            verdict(&rows, "light: all-in us per delivered"),
            Verdict::Missed
        );
        rows[5].all_in_cpu_cores = Some(0.21);
        assert_eq!(verdict(&rows, "fanout-light"), Verdict::Missed);
        rows[6].all_in_cpu_cores = Some(0.014);
        assert_eq!(verdict(&rows, "idle"), Verdict::Missed);
        // Without the peer of light-1k, the pair is not judged.
        rows.remove(3);
        assert_eq!(verdict(&rows, "light and light-1k"), Verdict::NotRun);
    }

    #[test]
    fn program_peers_are_divided_into_by_cell() {
        let mut comb = row("light", "comb", 300.0);
        comb.e2e_p99_ms = Some(10.0);
        comb.broker_rss_mb = Some(20.0);
        let mut queen = row("light", "queen", 150.0);
        queen.e2e_p99_ms = Some(40.0);
        queen.broker_rss_mb = Some(80.0);
        let mut rows = vec![comb, row("sl-light", "skiplocked", 300.0), queen];
        fill_program_ratios(&mut rows);
        assert_eq!(rows[2].ratio, Some(2.0));
        assert_eq!(rows[2].ratio_of.as_deref(), Some("light"));
        assert_eq!(
            rows[1].ratio, None,
            "the suite's own peers are not program peers"
        );
        let t = program_table(&rows);
        let line: Vec<&str> = t.lines().last().unwrap().split_whitespace().collect();
        assert_eq!(line[..2], ["light", "queen"]);
        assert_eq!(line[2], "2.00");
        assert_eq!(line[4], "0.250");
        assert_eq!(line[8], "0.250");
        assert_eq!(program_table(&rows[..2]), "");
    }

    #[test]
    fn checks_judge_targets() {
        let mut rows = vec![
            row("push1", "comb", 3000.0),
            row("sl-enq", "skiplocked", 2500.0),
            row("push100", "comb", 80000.0),
            row("ceiling", "ceiling", 100000.0),
        ];
        rows[0].broker_cpu_us_per_req = Some(35.0);
        rows[0].broker_rss_mb = Some(70.0);
        let c = checks(&rows);
        let find = |t: &str| c.iter().find(|c| c.target.starts_with(t)).unwrap();
        assert_eq!(find("push 100").verdict, Verdict::Met);
        assert_eq!(find("push 1 msg/request >=").verdict, Verdict::Missed);
        assert_eq!(find("push 1 msg/request <=").verdict, Verdict::Met);
        assert_eq!(find("10,000").verdict, Verdict::NotRun);
        assert_eq!(find("broker RSS").verdict, Verdict::Missed);
        assert!(checks_text(&c).contains("MISSED"));
    }

    #[test]
    fn splices_generated_section() {
        let doc = format!("# B\nintro\n{BEGIN}\nold\n{END}\nanalysis\n");
        let out = splice(&doc, "new\n");
        assert_eq!(out, format!("# B\nintro\n{BEGIN}\nnew\n{END}\nanalysis\n"));
        let fresh = splice("# B\n", "x\n");
        assert!(fresh.ends_with(&format!("{BEGIN}\nx\n{END}\n")));
    }

    #[test]
    fn sections_splice_their_own_part() {
        const S: Section = Section {
            heading: "## Soak",
            begin: "<!-- s:begin -->",
            end: "<!-- s:end -->",
        };
        let fresh = S.splice("# B\n\n## Latest results\n", "x\n");
        assert!(fresh.ends_with("## Soak\n\n<!-- s:begin -->\nx\n<!-- s:end -->\n"));
        let again = S.splice(&format!("{fresh}\nAnalysis.\n"), "y\n");
        assert!(again.contains("<!-- s:begin -->\ny\n<!-- s:end -->\n\nAnalysis.\n"));
        assert_eq!(again.matches("## Soak").count(), 1);
        assert!(
            S.splice("no newline", "z\n")
                .starts_with("no newline\n\n## Soak")
        );
    }

    #[test]
    fn aligns_columns() {
        let head = vec!["a".to_string(), "b".to_string(), "n".to_string()];
        let rows = vec![vec!["xx".to_string(), "y".to_string(), "1234".to_string()]];
        let t = align(&head, &rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0].len(), lines[2].len());
        assert!(lines[2].ends_with("1234"));
        assert!(lines[2].starts_with("xx  y"));
    }
}
