//! Alternating comparison of two Comb builds or configurations (`comb-bench --against`).
//!
//! On a shared machine the same cell moves more between runs minutes apart than most changes
//! move it, so a change is judged by running both variants in turns on one cluster, in the
//! order A B, B A, A B, … (drift in the machine's speed then favours neither), and comparing
//! medians. Fixed-rate cells offer both variants the same rate.

use std::fmt::Write as _;

use crate::report::{Row, num};

/// One variant's rows of one round, in run order.
pub type Round = Vec<Row>;

/// The order of the variants in round `r` (0-based): `true` when A runs first.
pub fn a_first(round: usize) -> bool {
    round.is_multiple_of(2)
}

/// A figure of a row, for comparing: its name and how to read it.
type Figure = (&'static str, fn(&Row) -> Option<f64>);

/// The figures compared, in table order.
const FIGURES: [Figure; 10] = [
    ("msg/s", |r| Some(r.msgs_per_sec)),
    ("broker us/msg", |r| r.broker_cpu_us_per_msg),
    ("pg cores", |r| r.pg_cpu_cores),
    ("all-in cores", |r| r.all_in_cpu_cores),
    ("all-in us/msg", |r| r.all_in_cpu_us_per_msg),
    ("p99 ms", |r| r.p99_ms),
    ("e2e p99 ms", |r| r.e2e_p99_ms),
    ("WAL B/msg", |r| r.pg_wal_bytes_per_msg),
    ("RSS MB", |r| r.broker_rss_mb),
    ("comb / peer", |r| r.ratio),
];

/// The median of the values present (mean of the middle two for an even count).
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// The comparison table: per cell and figure, each round's value for A and for B, and the
/// ratio of B's median to A's. Figures no round has for a cell are left out.
pub fn table(a: &[Round], b: &[Round]) -> String {
    let mut cells: Vec<&str> = Vec::new();
    for row in a.iter().chain(b).flatten() {
        if !cells.contains(&row.cell.as_str()) {
            cells.push(&row.cell);
        }
    }
    let values = |rounds: &[Round], cell: &str, f: &Figure| -> Vec<Option<f64>> {
        rounds
            .iter()
            .map(|round| round.iter().find(|r| r.cell == cell).and_then(f.1))
            .collect()
    };
    let join = |v: &[Option<f64>]| v.iter().map(|x| num(*x)).collect::<Vec<_>>().join(" ");
    let mut lines = vec![[
        "cell".to_string(),
        "figure".into(),
        "A by round".into(),
        "B by round".into(),
        "B/A (medians)".into(),
    ]];
    for cell in cells {
        for f in &FIGURES {
            let (va, vb) = (values(a, cell, f), values(b, cell, f));
            if va.iter().chain(&vb).all(Option::is_none) {
                continue;
            }
            let present = |v: &[Option<f64>]| v.iter().flatten().copied().collect::<Vec<_>>();
            let ratio = match (median(&present(&va)), median(&present(&vb))) {
                (Some(ma), Some(mb)) if ma != 0.0 => Some(mb / ma),
                _ => None,
            };
            lines.push([
                cell.to_string(),
                f.0.into(),
                join(&va),
                join(&vb),
                num(ratio),
            ]);
        }
    }
    let mut widths = [0usize; 5];
    for line in &lines {
        for (w, s) in widths.iter_mut().zip(line) {
            *w = (*w).max(s.len());
        }
    }
    let mut out = String::new();
    for line in &lines {
        let _ = writeln!(
            out,
            "{:<w0$}  {:<w1$}  {:>w2$}  {:>w3$}  {:>w4$}",
            line[0],
            line[1],
            line[2],
            line[3],
            line[4],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3],
            w4 = widths[4],
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cell: &str, system: &str, rate: f64, ratio: Option<f64>) -> Row {
        Row {
            cell: cell.into(),
            system: system.into(),
            msgs_per_sec: rate,
            ratio,
            ..Row::default()
        }
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN]), None);
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn rounds_alternate_which_variant_runs_first() {
        let order: Vec<bool> = (0..4).map(a_first).collect();
        assert_eq!(order, [true, false, true, false]);
    }

    #[test]
    fn the_table_shows_every_round_and_the_ratio_of_medians() {
        let a = vec![
            vec![
                row("push100", "comb", 100.0, None),
                row("ceiling", "ceiling", 200.0, Some(0.5)),
            ],
            vec![
                row("push100", "comb", 120.0, None),
                row("ceiling", "ceiling", 200.0, Some(0.6)),
            ],
        ];
        let b = vec![
            vec![
                row("push100", "comb", 150.0, None),
                row("ceiling", "ceiling", 200.0, Some(0.75)),
            ],
            vec![
                row("push100", "comb", 130.0, None),
                row("ceiling", "ceiling", 200.0, Some(0.65)),
            ],
        ];
        let t = table(&a, &b);
        let line = |cell: &str, figure: &str| {
            t.lines()
                .find(|l| l.starts_with(cell) && l.contains(figure))
                .unwrap_or_else(|| panic!("no {cell} {figure} in\n{t}"))
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        // Medians 110 and 140.
        assert_eq!(
            line("push100", "msg/s"),
            "push100 msg/s 100 120 150 130 1.27"
        );
        // Medians 0.55 and 0.70.
        assert_eq!(
            line("ceiling", "comb / peer"),
            "ceiling comb / peer 0.500 0.600 0.750 0.650 1.27"
        );
        // No round measured broker CPU: the figure is left out.
        assert!(!t.contains("broker us/msg"), "{t}");
        // The broker's peak memory, measured in one round of each.
        let with_rss = |mut rounds: Vec<Round>, mb: f64| {
            rounds[0][0].broker_rss_mb = Some(mb);
            rounds
        };
        let t = table(&with_rss(a, 40.0), &with_rss(b, 90.0));
        let rss: Vec<&str> = t
            .lines()
            .find(|l| l.starts_with("push100") && l.contains("RSS MB"))
            .unwrap_or_else(|| panic!("no RSS in\n{t}"))
            .split_whitespace()
            .collect();
        assert_eq!(rss.join(" "), "push100 RSS MB 40.0 - 90.0 - 2.25");
    }
}
