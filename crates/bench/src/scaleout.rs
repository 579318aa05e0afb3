//! The scale-out model of `comb-bench --citus`, its check against the measured points, the
//! targets of a cluster, and `bench/results/citus.json`, which records them with every
//! node's figures.
//!
//! The model takes a cell's per-message costs from the largest cluster measured: the
//! coordinator's CPU, the workers' CPU and WAL (added over the workers), the broker's and the
//! load generator's CPU. A cost that grew from a smaller measured cluster to a larger one
//! keeps growing with the workers in the model, by its growth per worker ([`Cost::fit`]): work
//! every worker does for every message (a queue-wide pop's listing reads every worker) makes
//! the workers' total cost per message grow with their number, and a model holding it flat
//! would promise a cluster that grows where it does not. A cost that fell is held at the
//! largest cluster's value (a fall is spread work, or noise, and never goes below zero).

use std::fmt::Write as _;
use std::io;
use std::path::Path;

use serde::Serialize;

use crate::nodes::{self, NodeRow};
use crate::report::Row;

/// The cluster sizes the model predicts for.
pub const SIZES: [usize; 5] = [1, 2, 4, 8, 16];

/// How far a measured point may be from the model and still agree with it.
pub const WITHIN: f64 = 0.25;

/// What the scale-out model assumes of the hardware it predicts for.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Hardware {
    /// Cores of each worker.
    pub worker_cores: f64,
    /// Cores of the coordinator.
    pub coordinator_cores: f64,
    /// WAL each worker can write, MB/s.
    pub worker_wal_mb_s: f64,
}

/// A per-message cost as a line in the worker count: its value on the largest cluster
/// measured, and its growth per worker over the sizes measured (never negative).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Cost {
    /// Workers of the largest cluster measured.
    pub largest: usize,
    /// The cost measured there.
    pub at_largest: f64,
    /// Growth per worker: the least-squares slope over the sizes measured, 0 if it fell or
    /// only one size was measured.
    pub per_worker: f64,
}

impl Cost {
    /// The line through `points` (workers, cost per message), anchored at the largest.
    pub fn fit(points: &[(usize, f64)]) -> Option<Cost> {
        let &(largest, at_largest) = points.iter().max_by_key(|p| p.0)?;
        let n = points.len() as f64;
        let mean_w = points.iter().map(|p| p.0 as f64).sum::<f64>() / n;
        let mean_c = points.iter().map(|p| p.1).sum::<f64>() / n;
        let sxx: f64 = points.iter().map(|p| (p.0 as f64 - mean_w).powi(2)).sum();
        let sxy: f64 = points
            .iter()
            .map(|p| (p.0 as f64 - mean_w) * (p.1 - mean_c))
            .sum();
        let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
        Some(Cost {
            largest,
            at_largest,
            per_worker: slope.max(0.0),
        })
    }

    /// The cost on a cluster of `workers` workers.
    pub fn at(&self, workers: usize) -> f64 {
        (self.at_largest + self.per_worker * (workers as f64 - self.largest as f64)).max(0.0)
    }
}

/// A cell's per-message costs as the model uses them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Costs {
    /// The Citus systems they were fitted over, smallest first (`comb-citus-1w`, …).
    pub measured_on: Vec<String>,
    /// The coordinator's CPU, µs.
    pub coordinator_cpu_us: Cost,
    /// Every worker's CPU added up, µs.
    pub workers_cpu_us: Cost,
    /// Every worker's WAL added up, bytes.
    pub workers_wal_bytes: Cost,
    /// The broker's CPU, µs (servers are added as needed; counted only on this machine).
    pub broker_cpu_us: Cost,
    /// The load generator's CPU, µs (counted only on this machine).
    pub loadgen_cpu_us: Cost,
}

/// The workers of a Citus row: its `worker…` nodes.
fn workers_of(r: &Row) -> usize {
    r.nodes
        .iter()
        .filter(|n| n.node.starts_with("worker"))
        .count()
}

/// Whether a row was measured on a Citus cluster, with node figures.
fn is_citus(r: &Row) -> bool {
    r.system.starts_with("comb-citus") && !r.nodes.is_empty()
}

/// The Citus rows of `cell`, smallest cluster first.
fn citus_rows<'a>(rows: &'a [Row], cell: &str) -> Vec<&'a Row> {
    let mut out: Vec<&Row> = rows
        .iter()
        .filter(|r| r.cell == cell && is_citus(r) && r.msgs_per_sec > 0.0)
        .collect();
    out.sort_by_key(|r| workers_of(r));
    out
}

/// The cell's costs, fitted over its Citus rows; `None` without one that has them.
pub fn costs(rows: &[Row], cell: &str) -> Option<Costs> {
    let citus = citus_rows(rows, cell);
    let points = |f: &dyn Fn(&Row) -> Option<f64>| -> Option<Cost> {
        let p: Vec<(usize, f64)> = citus
            .iter()
            .filter_map(|r| f(r).map(|v| (workers_of(r), v)))
            .collect();
        Cost::fit(&p)
    };
    let sum = |r: &Row, pick: fn(&NodeRow) -> Option<f64>| -> Option<f64> {
        let v: Vec<f64> = r
            .nodes
            .iter()
            .filter(|n| n.node.starts_with("worker"))
            .filter_map(pick)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum())
    };
    Some(Costs {
        measured_on: citus.iter().map(|r| r.system.clone()).collect(),
        coordinator_cpu_us: points(&|r| {
            r.nodes
                .iter()
                .find(|n| n.node == "coordinator")
                .and_then(|n| n.cpu_us_per_msg)
        })?,
        workers_cpu_us: points(&|r| sum(r, |n| n.cpu_us_per_msg))?,
        workers_wal_bytes: points(&|r| sum(r, |n| n.wal_bytes_per_msg))
            .unwrap_or(Cost::fit(&[(1, 0.0)])?),
        broker_cpu_us: points(&|r| r.broker_cpu_us_per_msg).unwrap_or(Cost::fit(&[(1, 0.0)])?),
        loadgen_cpu_us: points(&|r| Some(r.loadgen_cpu_cores? * 1e6 / r.msgs_per_sec))
            .unwrap_or(Cost::fit(&[(1, 0.0)])?),
    })
}

/// The rate a cluster of `workers` workers would carry on `hw`, and what bounds it: the
/// coordinator's CPU, the workers' CPU (their cost per message spread evenly over them) or
/// the workers' WAL. Comb servers are stateless and assumed added as needed.
pub fn predict(costs: &Costs, hw: Hardware, workers: usize) -> (f64, &'static str) {
    let w = workers as f64;
    let cc = costs.coordinator_cpu_us.at(workers);
    let cw = costs.workers_cpu_us.at(workers);
    let ww = costs.workers_wal_bytes.at(workers);
    let mut bounds = vec![(hw.coordinator_cores * 1e6 / cc.max(1e-9), "coordinator CPU")];
    if cw > 0.0 {
        bounds.push((w * hw.worker_cores * 1e6 / cw, "worker CPU"));
    }
    if ww > 0.0 {
        bounds.push((w * hw.worker_wal_mb_s * 1e6 / ww, "worker WAL"));
    }
    bounds
        .into_iter()
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .expect("the coordinator's bound is always there")
}

/// What a message costs this machine on a cluster of `workers` workers by `costs`, µs:
/// every node, the broker and the load generator, which share the machine's cores in a run.
fn machine_us_per_msg(costs: &Costs, workers: usize) -> f64 {
    costs.coordinator_cpu_us.at(workers)
        + costs.workers_cpu_us.at(workers)
        + costs.broker_cpu_us.at(workers)
        + costs.loadgen_cpu_us.at(workers)
}

/// The rate `costs` predict for a measured point on this machine: the cores the cell had (the
/// machine's, less what neighbours used) over what a message costs at the point's size,
/// capped by the offered rate of a fixed-rate cell.
pub fn predict_here(costs: &Costs, measured: &Row, host_cores: f64) -> f64 {
    let cores = (host_cores - measured.other_cpu_cores.unwrap_or(0.0)).max(0.0);
    let capacity = cores * 1e6 / machine_us_per_msg(costs, workers_of(measured)).max(1e-9);
    match measured.offered_per_sec {
        Some(offered) => capacity.min(offered),
        None => capacity,
    }
}

/// Whether `measured` is within [`WITHIN`] of `predicted` (off by `predicted / measured - 1`).
pub fn within(predicted: f64, measured: f64) -> bool {
    (predicted / measured.max(1e-9) - 1.0).abs() <= WITHIN
}

/// The model's rates of one cell, by [`SIZES`], with `{"1": …, "16": …}` as its JSON.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Rates {
    #[serde(rename = "1")]
    w1: f64,
    #[serde(rename = "2")]
    w2: f64,
    #[serde(rename = "4")]
    w4: f64,
    #[serde(rename = "8")]
    w8: f64,
    #[serde(rename = "16")]
    w16: f64,
}

impl Rates {
    /// The rates in the order of [`SIZES`].
    pub fn all(&self) -> [f64; 5] {
        [self.w1, self.w2, self.w4, self.w8, self.w16]
    }
}

/// A measured point beside the model's prediction for it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Point {
    /// `comb-citus-Nw`.
    pub system: String,
    /// Its workers.
    pub workers: usize,
    /// What it carried, msg/s.
    pub measured_msgs_per_sec: f64,
    /// What the model predicts for its size on this machine, msg/s.
    pub model_msgs_per_sec: f64,
    /// `model / measured - 1`.
    pub off_by: f64,
    /// Whether that is within 25 %.
    pub within_25_pct: bool,
    /// What the largest cluster's costs held flat would predict, msg/s (the model before
    /// costs grew with the workers).
    pub flat_msgs_per_sec: f64,
}

/// One cell's model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CellModel {
    /// The cell.
    pub cell: String,
    /// The costs the model grows from.
    pub costs: Costs,
    /// Predicted msg/s at 1, 2, 4, 8 and 16 workers of the model's hardware.
    pub model: Rates,
    /// What bounds the rate at each size, in the order of [`SIZES`].
    pub bounds: Vec<&'static str>,
    /// Model at 16 workers ÷ model at 1.
    pub scale_16_over_1: f64,
    /// What 16 workers would carry with the largest cluster's costs held flat, msg/s: how
    /// much of the model's shape at 16 is the growth of its costs.
    pub flat_16: f64,
    /// Each measured point against the model.
    pub points: Vec<Point>,
}

/// The model of every cell with Citus rows, in run order.
pub fn models(rows: &[Row], hw: Hardware, host_cores: f64) -> Vec<CellModel> {
    let mut cells: Vec<&str> = Vec::new();
    for r in rows.iter().filter(|r| is_citus(r)) {
        if !cells.contains(&r.cell.as_str()) {
            cells.push(&r.cell);
        }
    }
    let mut out = Vec::new();
    for cell in cells {
        let Some(costs) = costs(rows, cell) else {
            continue;
        };
        let predicted: Vec<(f64, &'static str)> =
            SIZES.iter().map(|&w| predict(&costs, hw, w)).collect();
        let flat = Costs {
            coordinator_cpu_us: flat(costs.coordinator_cpu_us),
            workers_cpu_us: flat(costs.workers_cpu_us),
            workers_wal_bytes: flat(costs.workers_wal_bytes),
            broker_cpu_us: flat(costs.broker_cpu_us),
            loadgen_cpu_us: flat(costs.loadgen_cpu_us),
            ..costs.clone()
        };
        let points = citus_rows(rows, cell)
            .into_iter()
            .map(|m| {
                let p = predict_here(&costs, m, host_cores);
                Point {
                    system: m.system.clone(),
                    workers: workers_of(m),
                    measured_msgs_per_sec: m.msgs_per_sec,
                    model_msgs_per_sec: p,
                    off_by: p / m.msgs_per_sec - 1.0,
                    within_25_pct: within(p, m.msgs_per_sec),
                    flat_msgs_per_sec: predict_here(&flat, m, host_cores),
                }
            })
            .collect();
        let r: Vec<f64> = predicted.iter().map(|p| p.0).collect();
        out.push(CellModel {
            cell: cell.to_string(),
            costs,
            model: Rates {
                w1: r[0],
                w2: r[1],
                w4: r[2],
                w8: r[3],
                w16: r[4],
            },
            bounds: predicted.iter().map(|p| p.1).collect(),
            scale_16_over_1: r[4] / r[0].max(1e-9),
            flat_16: predict(&flat, hw, 16).0,
            points,
        });
    }
    out
}

/// The same cost held at the largest cluster's value.
fn flat(c: Cost) -> Cost {
    Cost {
        per_worker: 0.0,
        ..c
    }
}

/// A cluster target's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The target is met.
    Met,
    /// Only the first, looser bar is met.
    FirstBar,
    /// Missed.
    Missed,
    /// Nothing to judge it on in this run.
    NotRun,
}

impl Verdict {
    fn of(ok: Option<bool>) -> Verdict {
        match ok {
            Some(true) => Verdict::Met,
            Some(false) => Verdict::Missed,
            None => Verdict::NotRun,
        }
    }

    fn text(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::FirstBar => "first bar met",
            Verdict::Missed => "MISSED",
            Verdict::NotRun => "not run",
        }
    }
}

/// One target of a cluster, judged on one cell (and cluster size).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Target {
    /// The target, in words.
    pub target: &'static str,
    /// The cell.
    pub cell: String,
    /// The Citus system judged (`comb-citus-Nw`), or `model` for the model's figure.
    pub system: String,
    /// The figures it was judged on.
    pub measured: String,
    /// The outcome.
    pub verdict: Verdict,
}

/// Cells whose model must grow twelvefold from 1 to 16 workers.
const SCALES: [&str; 6] = [
    "push1",
    "push100",
    "part10k",
    "steady-half",
    "fanout",
    "pop",
];
/// Cells whose cluster must cost ≤ 1.5× plain PostgreSQL's all-in CPU per message.
const CPU_LIKE_PLAIN: [&str; 3] = ["push1", "light", "pop"];
/// Cells whose cluster must run ≤ 1.5× plain PostgreSQL's statements and transactions.
const STATEMENTS_LIKE_PLAIN: [&str; 2] = ["push1", "part10k"];
/// Cells that must run no two-phase commit and no multi-shard statement.
const ONE_SHARD: [&str; 5] = ["push1", "part10k", "light", "fanout", "pop"];

/// The cluster targets of a run, for the cells it ran.
pub fn targets(rows: &[Row], models: &[CellModel]) -> Vec<Target> {
    let ran = |cell: &str| rows.iter().any(|r| r.cell == cell);
    let plain = |cell: &str| rows.iter().find(|r| r.cell == cell && r.system == "comb");
    let mut out = Vec::new();
    for cell in SCALES.into_iter().filter(|c| ran(c)) {
        let m = models.iter().find(|m| m.cell == cell);
        out.push(Target {
            target: "model 16 workers / 1 worker >= 12x",
            cell: cell.into(),
            system: "model".into(),
            measured: m.map_or(String::new(), |m| {
                format!(
                    "{:.1}x ({:.0} / {:.0} msg/s)",
                    m.scale_16_over_1, m.model.w16, m.model.w1
                )
            }),
            verdict: Verdict::of(m.map(|m| m.scale_16_over_1 >= 12.0)),
        });
    }
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b.filter(|b| *b > 0.0)).map(|(a, b)| a / b);
    let per_size = |cells: &[&str], f: &mut dyn FnMut(&str, &Row, Option<&Row>)| {
        for &cell in cells.iter().filter(|c| ran(c)) {
            for r in citus_rows(rows, cell) {
                f(cell, r, plain(cell));
            }
        }
    };
    per_size(&CPU_LIKE_PLAIN, &mut |cell, r, p| {
        let x = ratio(
            r.all_in_cpu_us_per_msg,
            p.and_then(|p| p.all_in_cpu_us_per_msg),
        );
        out.push(Target {
            target: "all-in CPU per message <= 1.5x plain PostgreSQL's (first bar 3x)",
            cell: cell.into(),
            system: r.system.clone(),
            measured: x.map_or(String::new(), |x| {
                format!(
                    "{x:.2}x ({:.0} vs {:.0} us)",
                    r.all_in_cpu_us_per_msg.unwrap_or(0.0),
                    p.and_then(|p| p.all_in_cpu_us_per_msg).unwrap_or(0.0)
                )
            }),
            verdict: match x {
                Some(x) if x <= 1.5 => Verdict::Met,
                Some(x) if x <= 3.0 => Verdict::FirstBar,
                Some(_) => Verdict::Missed,
                None => Verdict::NotRun,
            },
        });
    });
    type Figure = (&'static str, fn(&NodeRow) -> Option<f64>);
    let figures: [Figure; 2] = [
        ("statements per message <= 1.5x plain PostgreSQL's", |n| {
            n.statements_per_msg
        }),
        ("transactions per message <= 1.5x plain PostgreSQL's", |n| {
            n.commits_per_msg
        }),
    ];
    for (target, f) in figures {
        per_size(&STATEMENTS_LIKE_PLAIN, &mut |cell, r, p| {
            let c = cluster(r).as_ref().and_then(f);
            let q = p.and_then(cluster).as_ref().and_then(f);
            let x = ratio(c, q);
            out.push(Target {
                target,
                cell: cell.into(),
                system: r.system.clone(),
                measured: x.map_or(String::new(), |x| {
                    format!(
                        "{x:.2}x ({:.3} vs {:.3})",
                        c.unwrap_or(0.0),
                        q.unwrap_or(0.0)
                    )
                }),
                verdict: Verdict::of(x.map(|x| x <= 1.5)),
            });
        });
    }
    per_size(&ONE_SHARD, &mut |cell, r, _| {
        let c = cluster(r);
        let (two, multi) = (
            c.as_ref().and_then(|c| c.two_phase_per_msg),
            c.as_ref().and_then(|c| c.multi_shard_per_msg),
        );
        out.push(Target {
            target: "no two-phase commit, no multi-shard statement",
            cell: cell.into(),
            system: r.system.clone(),
            measured: two.zip(multi).map_or(String::new(), |(t, m)| {
                format!("2PC {t:.4}/msg, multi-shard {m:.4}/msg")
            }),
            verdict: Verdict::of(two.zip(multi).map(|(t, m)| t == 0.0 && m == 0.0)),
        });
    });
    per_size(&["light"], &mut |cell, r, _| {
        out.push(Target {
            target: "light keeps up, end-to-end p99 <= 50 ms",
            cell: cell.into(),
            system: r.system.clone(),
            measured: format!(
                "keeps up {}, e2e p99 {} ms",
                r.keeps_up.map_or("-", |k| if k { "yes" } else { "no" }),
                crate::report::num(r.e2e_p99_ms)
            ),
            verdict: Verdict::of(r.keeps_up.zip(r.e2e_p99_ms).map(|(k, p)| k && p <= 50.0)),
        });
    });
    out
}

/// A row's nodes added up (its one node on plain PostgreSQL).
fn cluster(r: &Row) -> Option<NodeRow> {
    match r.nodes.len() {
        0 => None,
        1 => Some(r.nodes[0].clone()),
        _ => Some(nodes::sum(&r.nodes)),
    }
}

/// The model's table, the model checked at the measured points, and the targets, as text.
pub fn text(rows: &[Row], hw: Hardware, host_cores: f64) -> String {
    let models = models(rows, hw, host_cores);
    if models.is_empty() {
        return String::new();
    }
    let mut header: Vec<String> = [
        "cell",
        "costs from",
        "coord us/msg",
        "+/worker",
        "workers us/msg",
        "+/worker",
        "WAL B/msg",
        "+/worker",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    header.extend(SIZES.iter().map(|w| format!("{w} w msg/s")));
    header.extend([
        "16 w / 1 w".into(),
        "bound at 16".into(),
        "16 w, costs flat".into(),
    ]);
    let lines: Vec<Vec<String>> = models
        .iter()
        .map(|m| {
            let c = &m.costs;
            let mut line = vec![
                m.cell.clone(),
                c.measured_on.last().cloned().unwrap_or_default(),
            ];
            for cost in [c.coordinator_cpu_us, c.workers_cpu_us, c.workers_wal_bytes] {
                line.push(format!("{:.0}", cost.at_largest));
                line.push(format!("{:.0}", cost.per_worker));
            }
            line.extend(m.model.all().iter().map(|r| format!("{r:.0}")));
            line.push(format!("{:.1}x", m.scale_16_over_1));
            line.push(m.bounds.last().copied().unwrap_or("-").into());
            line.push(format!("{:.0}", m.flat_16));
            line
        })
        .collect();
    let mut s = format!(
        "Scale-out model: {} cores per worker, {} on the coordinator, {} MB/s of WAL per worker; \
         per-message costs of the largest cluster measured, growing by their growth per worker \
         between the sizes measured (+/worker)\n{}",
        hw.worker_cores,
        hw.coordinator_cores,
        hw.worker_wal_mb_s,
        crate::report::align(&header, &lines)
    );
    let header: Vec<String> = [
        "cell",
        "measured on",
        "msg/s",
        "model msg/s",
        "off by",
        "within 25 %",
        "costs held flat",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let lines: Vec<Vec<String>> = models
        .iter()
        .flat_map(|m| {
            m.points.iter().map(|p| {
                vec![
                    m.cell.clone(),
                    p.system.clone(),
                    format!("{:.0}", p.measured_msgs_per_sec),
                    format!("{:.0}", p.model_msgs_per_sec),
                    format!("{:+.0} %", p.off_by * 100.0),
                    if p.within_25_pct { "yes" } else { "NO" }.into(),
                    format!("{:.0}", p.flat_msgs_per_sec),
                ]
            })
        })
        .collect();
    let _ = write!(
        s,
        "\nThe model at the measured points ({host_cores} cores shared by every node, the broker \
         and the load generator, less what neighbours used)\n{}",
        crate::report::align(&header, &lines)
    );
    let _ = write!(
        s,
        "\nCluster targets\n{}",
        targets_text(&targets(rows, &models))
    );
    s
}

/// The targets as a table, every column left-aligned.
fn targets_text(targets: &[Target]) -> String {
    let lines: Vec<[&str; 5]> = targets
        .iter()
        .map(|t| {
            [
                t.target,
                t.cell.as_str(),
                t.system.as_str(),
                t.measured.as_str(),
                t.verdict.text(),
            ]
        })
        .collect();
    let header = ["target", "cell", "system", "measured", "verdict"];
    let mut w = header.map(str::len);
    for l in &lines {
        for (i, c) in l.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let fmt = |l: &[&str; 5]| {
        let mut line = String::new();
        for (i, c) in l.iter().enumerate() {
            let _ = write!(line, "{c:<width$}  ", width = w[i]);
        }
        line.trim_end().to_string() + "\n"
    };
    let mut s = fmt(&header);
    s.push_str(&"-".repeat(w.iter().sum::<usize>() + 8));
    s.push('\n');
    for l in &lines {
        s.push_str(&fmt(l));
    }
    s
}

/// The route a Comb server on Citus ran with, from its log: `direct` once it opened a worker's
/// pools (logged at `info`); else the flag it was given; else `coordinator`, its default when
/// it logs at `info`, or `default` when its log would not have shown the direct route.
pub fn route_of(log: &str, flag: Option<&str>, logs_info: bool) -> String {
    if log.contains("direct route to a Citus worker") {
        return "direct".into();
    }
    match flag {
        Some(f) => f.to_string(),
        None if logs_info => "coordinator".into(),
        None => "default".into(),
    }
}

/// Whether a server started now logs at `info` (`COMB_LOG` unset, or naming `info` or more).
pub fn logs_info() -> bool {
    std::env::var("COMB_LOG").map_or(true, |f| {
        let f = f.to_ascii_lowercase();
        ["info", "debug", "trace"].iter().any(|l| f.contains(l))
    })
}

/// How, when and where the run was made.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    /// The command line (or `--command`).
    pub command: String,
    /// UTC, to the minute.
    pub date: String,
    /// The machine: CPU model, cores, and the benchmarks page's one-line description.
    pub machine: Machine,
    /// `uptime` when the run ended: the machine is shared, and its load average says by how
    /// much.
    pub uptime: String,
    /// `git describe` of the tree built.
    pub commit: String,
    /// `--citus-route`, when given (the servers' default otherwise).
    pub citus_route: Option<String>,
    /// Warm-up seconds per cell.
    pub warmup_s: f64,
    /// Measured seconds per cell.
    pub duration_s: f64,
    /// The model's hardware.
    pub model_hardware: Hardware,
}

/// The machine of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// `/proc/cpuinfo`'s model name.
    pub cpu: String,
    /// Cores available to the run.
    pub cores: usize,
    /// CPU, cores, memory, kernel and compiler in one line.
    pub description: String,
}

impl Machine {
    /// This machine.
    pub fn here() -> Machine {
        Machine {
            cpu: crate::report::cpu_model(),
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            description: crate::report::machine(),
        }
    }
}

/// One node of one system in one cell, as `citus.json` records it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeLine {
    /// The cell.
    pub cell: String,
    /// `comb` (plain PostgreSQL) or `comb-citus-Nw`.
    pub system: String,
    /// `postgres`, `coordinator`, `worker1`, …, or `cluster` (the nodes added up).
    pub node: String,
    /// Workers of the cluster, 0 on plain PostgreSQL.
    pub workers: usize,
    /// The route the broker ran with on Citus (`direct`, `coordinator`); null on plain.
    pub route: Option<String>,
    /// What the system carried, msg/s (the cell's main measure).
    pub msgs_per_sec: f64,
    /// The node's PostgreSQL CPU per message, µs.
    pub cpu_us_per_msg: Option<f64>,
    /// Broker and PostgreSQL CPU per message, µs (`postgres` and `cluster` lines).
    pub all_in_cpu_us_per_msg: Option<f64>,
    /// Statements per message (utility statements left out).
    pub stmts_per_msg: Option<f64>,
    /// Transactions committed per message.
    pub xacts_per_msg: Option<f64>,
    /// WAL bytes per message.
    pub wal_bytes_per_msg: Option<f64>,
    /// Two-phase commits per message (Citus).
    pub twopc_per_msg: Option<f64>,
    /// Statements over one shard per message (Citus).
    pub single_shard_per_msg: Option<f64>,
    /// Statements over several shards per message (Citus).
    pub multi_shard_per_msg: Option<f64>,
    /// The system's end-to-end p99 in the cell, ms (consumer cells).
    pub e2e_p99_ms: Option<f64>,
    /// Whether its consumers kept up (fixed-rate cells).
    pub keeps_up: Option<bool>,
}

/// What `bench/results/citus.json` holds.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// How, when and where.
    pub run: Run,
    /// A line per cell, system and node.
    pub rows: Vec<NodeLine>,
    /// The model of each cell with Citus rows.
    pub cells: Vec<CellModel>,
    /// The cluster targets.
    pub targets: Vec<Target>,
}

/// Rounded to `digits` decimals, so that a committed record changes only where figures do.
fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

fn round_opt(v: Option<f64>, digits: i32) -> Option<f64> {
    v.map(|v| round(v, digits))
}

/// The node lines of every row measured per node.
pub fn node_lines(rows: &[Row]) -> Vec<NodeLine> {
    let mut out = Vec::new();
    for r in rows.iter().filter(|r| !r.nodes.is_empty()) {
        let citus = is_citus(r);
        let mut nodes = r.nodes.clone();
        if citus && nodes.len() > 1 {
            nodes.push(nodes::sum(&r.nodes));
        }
        let whole = nodes.len() == 1;
        for n in nodes {
            let all_in = whole || n.node == "cluster";
            out.push(NodeLine {
                cell: r.cell.clone(),
                system: r.system.clone(),
                workers: if citus { workers_of(r) } else { 0 },
                route: if citus { r.route.clone() } else { None },
                msgs_per_sec: round(r.msgs_per_sec, 1),
                cpu_us_per_msg: round_opt(n.cpu_us_per_msg, 1),
                all_in_cpu_us_per_msg: round_opt(r.all_in_cpu_us_per_msg.filter(|_| all_in), 1),
                stmts_per_msg: round_opt(n.statements_per_msg, 4),
                xacts_per_msg: round_opt(n.commits_per_msg, 4),
                wal_bytes_per_msg: round_opt(n.wal_bytes_per_msg, 1),
                twopc_per_msg: round_opt(n.two_phase_per_msg, 4),
                single_shard_per_msg: round_opt(n.single_shard_per_msg, 4),
                multi_shard_per_msg: round_opt(n.multi_shard_per_msg, 4),
                e2e_p99_ms: round_opt(r.e2e_p99_ms, 2),
                keeps_up: r.keeps_up,
                node: n.node,
            });
        }
    }
    out
}

/// The record of a run.
pub fn record(rows: &[Row], run: Run, host_cores: f64) -> Record {
    let mut cells = models(rows, run.model_hardware, host_cores);
    let targets = targets(rows, &cells);
    for m in &mut cells {
        for c in [
            &mut m.costs.coordinator_cpu_us,
            &mut m.costs.workers_cpu_us,
            &mut m.costs.workers_wal_bytes,
            &mut m.costs.broker_cpu_us,
            &mut m.costs.loadgen_cpu_us,
        ] {
            c.at_largest = round(c.at_largest, 1);
            c.per_worker = round(c.per_worker, 1);
        }
        let r = &mut m.model;
        for v in [&mut r.w1, &mut r.w2, &mut r.w4, &mut r.w8, &mut r.w16] {
            *v = v.round();
        }
        m.scale_16_over_1 = round(m.scale_16_over_1, 2);
        m.flat_16 = m.flat_16.round();
        for p in &mut m.points {
            p.measured_msgs_per_sec = round(p.measured_msgs_per_sec, 1);
            p.model_msgs_per_sec = p.model_msgs_per_sec.round();
            p.flat_msgs_per_sec = p.flat_msgs_per_sec.round();
            p.off_by = round(p.off_by, 3);
        }
    }
    Record {
        run,
        rows: node_lines(rows),
        cells,
        targets,
    }
}

/// Writes `record` as pretty JSON, ending with a newline.
pub fn write(path: &Path, record: &Record) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let text = serde_json::to_string_pretty(record).map_err(io::Error::other)?;
    std::fs::write(path, text + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cpu: f64, wal: f64) -> NodeRow {
        NodeRow {
            node: name.into(),
            cpu_us_per_msg: Some(cpu),
            wal_bytes_per_msg: Some(wal),
            statements_per_msg: Some(1.0),
            commits_per_msg: Some(0.5),
            two_phase_per_msg: Some(0.0),
            multi_shard_per_msg: Some(0.0),
            ..NodeRow::default()
        }
    }

    /// A Citus row of `workers` workers, each costing `per_worker` µs a message.
    fn citus(cell: &str, workers: usize, rate: f64, coord: f64, per_worker: f64) -> Row {
        let mut nodes = vec![node("coordinator", coord, 0.0)];
        nodes.extend((1..=workers).map(|i| node(&format!("worker{i}"), per_worker, 100.0)));
        Row {
            cell: cell.into(),
            system: format!("comb-citus-{workers}w"),
            msgs_per_sec: rate,
            broker_cpu_us_per_msg: Some(100.0),
            loadgen_cpu_cores: Some(rate * 50.0 / 1e6),
            all_in_cpu_us_per_msg: Some(100.0 + coord + per_worker * workers as f64),
            route: Some("direct".into()),
            nodes,
            ..Row::default()
        }
    }

    fn plain(cell: &str, rate: f64, cpu: f64) -> Row {
        Row {
            cell: cell.into(),
            system: "comb".into(),
            msgs_per_sec: rate,
            broker_cpu_us_per_msg: Some(50.0),
            all_in_cpu_us_per_msg: Some(50.0 + cpu),
            nodes: vec![NodeRow {
                two_phase_per_msg: None,
                multi_shard_per_msg: None,
                ..node("postgres", cpu, 500.0)
            }],
            ..Row::default()
        }
    }

    const HW: Hardware = Hardware {
        worker_cores: 4.0,
        coordinator_cores: 4.0,
        worker_wal_mb_s: 1000.0,
    };

    #[test]
    fn a_cost_grows_by_its_growth_per_worker_and_never_falls_below_the_largest_clusters() {
        let c = Cost::fit(&[(1, 100.0), (2, 150.0)]).unwrap();
        assert_eq!((c.largest, c.at_largest, c.per_worker), (2, 150.0, 50.0));
        assert_eq!(c.at(1), 100.0);
        assert_eq!(c.at(16), 850.0);
        // A cost that fell is held at the largest cluster's value.
        let c = Cost::fit(&[(1, 100.0), (2, 80.0)]).unwrap();
        assert_eq!((c.at(1), c.at(16)), (80.0, 80.0));
        // One size: flat.
        let c = Cost::fit(&[(2, 70.0)]).unwrap();
        assert_eq!((c.at(1), c.at(16)), (70.0, 70.0));
        // Three sizes: the least-squares slope, anchored at the largest.
        let c = Cost::fit(&[(1, 10.0), (2, 30.0), (4, 50.0)]).unwrap();
        assert!((c.per_worker - 90.0 / 7.0).abs() < 1e-9, "{c:?}");
        assert_eq!(c.at(4), 50.0);
        assert_eq!(Cost::fit(&[]), None);
    }

    #[test]
    fn a_cost_flat_in_workers_scales_linearly_until_the_coordinator_binds() {
        // The workers' 100 µs a message spread over them, the coordinator's 10 µs alike on
        // both sizes: the workers' CPU bounds, 40,000 msg/s per worker, up to the
        // coordinator's 400,000.
        let rows = [
            citus("push1", 1, 1000.0, 10.0, 100.0),
            citus("push1", 2, 1000.0, 10.0, 50.0),
        ];
        let m = &models(&rows, HW, 2.0)[0];
        let r = m.model.all();
        for (i, w) in [1.0, 2.0, 4.0, 8.0].iter().enumerate() {
            assert!((r[i] - w * 40_000.0).abs() < 1e-6, "{r:?}");
        }
        assert_eq!(m.bounds[..4], ["worker CPU"; 4]);
        assert!((r[4] - 400_000.0).abs() < 1e-6, "{r:?}");
        assert_eq!(m.bounds[4], "coordinator CPU");
        assert!((m.scale_16_over_1 - 10.0).abs() < 1e-9);
    }

    #[test]
    fn a_worker_cost_that_doubles_from_one_worker_to_two_makes_the_model_flat() {
        // Every worker does a message's whole work again (a listing read on each of them).
        let rows = [
            citus("pop", 1, 1000.0, 10.0, 100.0),
            citus("pop", 2, 1000.0, 10.0, 100.0),
        ];
        let m = &models(&rows, HW, 2.0)[0];
        assert_eq!(m.costs.workers_cpu_us.per_worker, 100.0);
        for r in m.model.all() {
            assert!((r - 40_000.0).abs() < 1e-6, "{:?}", m.model);
        }
        assert!((m.scale_16_over_1 - 1.0).abs() < 1e-9);
        // Held flat at two workers' cost, it would have grown eightfold.
        let flat = Costs {
            workers_cpu_us: flat(m.costs.workers_cpu_us),
            ..m.costs.clone()
        };
        assert!((predict(&flat, HW, 16).0 - 320_000.0).abs() < 1e-6);
        assert!((m.flat_16 - 320_000.0).abs() < 1e-6);
        // A coordinator cost that doubles makes the model fall.
        let rows = [
            citus("pop", 1, 1000.0, 10.0, 1.0),
            citus("pop", 2, 1000.0, 20.0, 0.5),
        ];
        let m = &models(&rows, HW, 2.0)[0];
        assert!(m.model.w16 < m.model.w1 / 10.0, "{:?}", m.model);
    }

    #[test]
    fn a_measured_point_is_within_25_percent_of_the_model_or_not() {
        assert!(within(1_250.0, 1_000.0));
        assert!(within(750.0, 1_000.0));
        assert!(!within(1_260.0, 1_000.0));
        assert!(!within(740.0, 1_000.0));
        // 100 broker + 50 load generator + 350 coordinator + 500 workers: 1,000 µs a message
        // on 2 cores, less 0.1 used by neighbours, is 1,900 msg/s.
        let mut two = citus("push1", 2, 1_900.0, 350.0, 250.0);
        two.loadgen_cpu_cores = Some(1_900.0 * 50.0 / 1e6);
        two.other_cpu_cores = Some(0.1);
        let one = citus("push1", 1, 1_000.0, 350.0, 500.0);
        let m = &models(&[one, two], HW, 2.0)[0];
        let p: Vec<(usize, f64, bool)> = m
            .points
            .iter()
            .map(|p| (p.workers, p.model_msgs_per_sec, p.within_25_pct))
            .collect();
        assert_eq!(p[1].0, 2);
        assert!((p[1].1 - 1_900.0).abs() < 1e-6, "{p:?}");
        assert!(p[1].2);
        // The one-worker point carried half what its costs allow: not within 25 %.
        assert!((p[0].1 - 2_000.0).abs() < 1e-6, "{p:?}");
        assert!(!p[0].2);
        let text = text(&[citus("push1", 1, 1_000.0, 350.0, 500.0)], HW, 2.0);
        assert!(text.contains("NO"), "{text}");
    }

    #[test]
    fn targets_compare_the_cluster_with_plain_postgresql_in_the_same_run() {
        let mut rows = vec![
            plain("push1", 5_000.0, 100.0),
            citus("push1", 1, 1_000.0, 50.0, 100.0),
            plain("light", 300.0, 100.0),
            citus("light", 1, 300.0, 50.0, 400.0),
        ];
        rows[3].keeps_up = Some(true);
        rows[3].e2e_p99_ms = Some(20.0);
        rows[3].nodes[0].multi_shard_per_msg = Some(0.07);
        let t = targets(&rows, &models(&rows, HW, 2.0));
        let find = |target: &str, cell: &str| {
            t.iter()
                .find(|x| x.target.starts_with(target) && x.cell == cell)
                .unwrap_or_else(|| panic!("{target} {cell}: {t:?}"))
                .verdict
        };
        // push1: 250 µs all in against plain's 150.
        assert_eq!(find("all-in", "push1"), Verdict::FirstBar);
        assert_eq!(find("all-in", "light"), Verdict::Missed);
        // Two nodes of 1 statement against plain's 1.
        assert_eq!(find("statements", "push1"), Verdict::Missed);
        assert_eq!(find("no two-phase", "push1"), Verdict::Met);
        assert_eq!(find("no two-phase", "light"), Verdict::Missed);
        assert_eq!(find("light keeps up", "light"), Verdict::Met);
        // One size alone: the model is flat.
        assert_eq!(find("model", "push1"), Verdict::Missed);
        // Cells not run are not listed.
        assert!(t.iter().all(|x| x.cell != "pop"));
    }

    #[test]
    fn the_record_has_a_line_per_node_a_cluster_line_and_a_model_per_cell() {
        let rows = [
            plain("push1", 5_000.0, 100.0),
            citus("push1", 1, 1_000.0, 10.0, 100.0),
            citus("push1", 2, 1_000.0, 10.0, 50.0),
        ];
        let run = Run {
            command: "comb-bench --citus".into(),
            date: "2026-11-29T05:00Z".into(),
            machine: Machine::here(),
            uptime: String::new(),
            commit: "abc".into(),
            citus_route: None,
            warmup_s: 2.0,
            duration_s: 10.0,
            model_hardware: HW,
        };
        let record = record(&rows, run, 2.0);
        let names: Vec<(&str, &str, usize)> = record
            .rows
            .iter()
            .map(|l| (l.system.as_str(), l.node.as_str(), l.workers))
            .collect();
        assert_eq!(
            names,
            [
                ("comb", "postgres", 0),
                ("comb-citus-1w", "coordinator", 1),
                ("comb-citus-1w", "worker1", 1),
                ("comb-citus-1w", "cluster", 1),
                ("comb-citus-2w", "coordinator", 2),
                ("comb-citus-2w", "worker1", 2),
                ("comb-citus-2w", "worker2", 2),
                ("comb-citus-2w", "cluster", 2),
            ]
        );
        assert_eq!(record.rows[0].route, None);
        assert_eq!(record.rows[1].route.as_deref(), Some("direct"));
        assert_eq!(record.rows[3].cpu_us_per_msg, Some(110.0));
        assert_eq!(record.rows[3].all_in_cpu_us_per_msg, Some(210.0));
        assert_eq!(record.rows[1].all_in_cpu_us_per_msg, None);
        let json = serde_json::to_value(&record).unwrap();
        let model = &json["cells"][0]["model"];
        let keys: Vec<&String> = model.as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), 5);
        for w in ["1", "2", "4", "8", "16"] {
            assert!(model[w].as_f64().unwrap() > 0.0, "{model}");
        }
        assert_eq!(json["cells"][0]["points"].as_array().unwrap().len(), 2);
        // The same rows write the same text.
        assert_eq!(
            serde_json::to_string_pretty(&record).unwrap(),
            serde_json::to_string_pretty(&self::record(&rows, record.run.clone(), 2.0)).unwrap()
        );
    }

    #[test]
    fn the_route_is_read_from_the_servers_log_else_from_its_flag() {
        let direct = "INFO comb::db::route: direct route to a Citus worker worker=x:1";
        assert_eq!(route_of(direct, None, true), "direct");
        assert_eq!(route_of(direct, Some("coordinator"), true), "direct");
        assert_eq!(route_of("comb is serving", Some("direct"), false), "direct");
        assert_eq!(route_of("comb is serving", None, true), "coordinator");
        assert_eq!(route_of("", None, false), "default");
    }
}
