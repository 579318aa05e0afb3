//! `comb-bench`: runs the benchmark suite, or with a subcommand one of the long runs
//! (`comb-bench xmin`, `comb-bench soak`); see `docs/benchmarks.md`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use comb_bench::long::{soak, xmin};
use comb_bench::profile::Profile;
use comb_bench::run::{Options, PG_SETTINGS, Peer, Runner};
use comb_bench::{cells, compare};
use comb_bench::{report, scaleout};

/// Runs Comb's benchmark cells and their peers against one PostgreSQL and prints one table.
#[derive(Debug, Parser)]
#[command(name = "comb-bench", args_conflicts_with_subcommands = true)]
struct Args {
    /// A long run instead of the cells.
    #[command(subcommand)]
    long: Option<Long>,
    /// Cells to run, comma-separated (empty: all). `--list` shows them.
    #[arg(long, env = "CELLS", default_value = "")]
    cells: String,
    /// List the cells and exit.
    #[arg(long)]
    list: bool,
    /// The `comb` binary to benchmark (a release build).
    #[arg(long, default_value = "target/release/comb")]
    comb: PathBuf,
    /// Warm-up seconds per cell (load runs, nothing is counted).
    #[arg(long, default_value_t = 5.0)]
    warmup: f64,
    /// Measured seconds per cell.
    #[arg(long, default_value_t = 20.0)]
    duration: f64,
    /// A quick run that proves the tool works end to end (1 s warm-up, 3 s window, small
    /// pre-fill). Its numbers mean nothing.
    #[arg(long)]
    smoke: bool,
    /// Messages per partition pre-filled for the `pop` cell.
    #[arg(long, default_value_t = 1000)]
    pop_fill: usize,
    /// Partitions the ceiling's rows are spread over.
    #[arg(long, default_value_t = 100)]
    ceiling_partitions: usize,
    /// Write the rows here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Update the results section of this Markdown file.
    #[arg(long)]
    doc: Option<PathBuf>,
    /// Earlier results, for the rates of fixed-rate cells whose source cell is not run.
    #[arg(long, default_value = "bench/results/latest.json")]
    baseline: PathBuf,
    /// Write profiles (pg_stat_statements, wait events) per cell into this directory.
    #[arg(long)]
    profile: Option<PathBuf>,
    /// With `--profile`: also `perf record` the whole machine during each window.
    #[arg(long)]
    perf: bool,
    /// Extra flag for `comb serve` (repeatable), e.g. `--comb-arg=--push-workers=8`.
    #[arg(long = "comb-arg", allow_hyphen_values = true)]
    comb_args: Vec<String>,
    /// Worker threads of the load generator's runtime.
    #[arg(long, default_value_t = 1)]
    client_threads: usize,
    /// Offered rate of `steady` in msgs/s (default: push1's rate).
    #[arg(long)]
    steady_rate: Option<f64>,
    /// Offered rate base of `fanout` in msgs/s, times the cell's fraction (default: push10's
    /// rate).
    #[arg(long)]
    fanout_rate: Option<f64>,
    /// Partitions one consumer's pop may lease (the pop `partitions` option, 1 to 100).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=100))]
    pop_partitions: u16,
    /// Make each cell's database with this ICU collation (`en-US`, `de-DE`…) instead of the
    /// cluster's `C`: what every comparison of text (transaction ids, consumer groups) costs
    /// in a database made with a language's collation. Plain PostgreSQL only.
    #[arg(long, value_parser = parse_icu_locale)]
    icu_locale: Option<String>,
    /// Another server speaking Queen's HTTP API v1, as NAME=PROGRAM (repeatable): each Comb
    /// cell runs against it right after Comb, on a fresh database, started as `PROGRAM serve
    /// --listen ADDR` with `DATABASE_URL` and ready once `GET /health` answers 200; a table
    /// of Comb ÷ peer per cell follows the results.
    #[arg(long = "peer")]
    peers: Vec<Peer>,
    /// How the run was started, for the docs (default: this command line).
    #[arg(long)]
    command: Option<String>,
    /// Also run every Comb cell on a Citus cluster started for the run (a coordinator and two
    /// workers on loopback), and print what each PostgreSQL node does per message, plain
    /// PostgreSQL beside it (`docs/scale-out.md`).
    #[arg(long)]
    citus: bool,
    /// Workers of the `--citus` cluster; several (`1,2`) start a cluster of each size and run
    /// every Comb cell on each, and the scale-out model is then checked against every
    /// measured point (`docs/scale-out-measured.md`).
    #[arg(long, default_value = "2", value_delimiter = ',',
          value_parser = clap::value_parser!(u16).range(1..=8))]
    citus_workers: Vec<u16>,
    /// Where the Comb servers on Citus send a partition's hot path (`comb serve
    /// --citus-route`); by default nothing is passed and the server's default applies.
    #[arg(long, value_parser = ["direct", "coordinator"])]
    citus_route: Option<String>,
    /// With `--citus`: where the per-node figures, the scale-out model and the cluster
    /// targets are written as JSON.
    #[arg(long, default_value = "bench/results/citus.json")]
    citus_json: PathBuf,
    /// The scale-out model's hardware: cores of each worker.
    #[arg(long, default_value_t = 16.0)]
    model_worker_cores: f64,
    /// The scale-out model's hardware: cores of the coordinator.
    #[arg(long, default_value_t = 16.0)]
    model_coordinator_cores: f64,
    /// The scale-out model's hardware: WAL each worker can write, MB/s.
    #[arg(long, default_value_t = 200.0)]
    model_worker_wal_mb_s: f64,
    /// Compare `--comb` (A) with this `comb` binary (B): the cells run for each in turns,
    /// `--rounds` times, and the table shows both with the ratio of their medians.
    #[arg(long)]
    against: Option<PathBuf>,
    /// Extra flag for B's `comb serve` (repeatable), instead of `--comb-arg`'s; alone, it
    /// compares two configurations of `--comb`.
    #[arg(long = "against-arg", allow_hyphen_values = true)]
    against_args: Vec<String>,
    /// Rounds of a comparison, each running A and B (A first in odd rounds, B in even ones).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=20))]
    rounds: u16,
}

/// The long runs: many minutes of load, sampled as they go.
#[derive(Debug, clap::Subcommand)]
enum Long {
    /// Comb, then the SKIP LOCKED table (or both at once), through a clean phase, a held
    /// `REPEATABLE READ` snapshot and its release (`make bench-xmin`).
    Xmin(xmin::Args),
    /// The peak delivered rate, then a fixed-rate soak at a share of it with retention on,
    /// judging whether storage stays flat (`make bench-soak`).
    Soak(soak::Args),
    /// The `queen1` load (Queen 1.0's soak shape) at a share of its searched maximum for a
    /// long time, sampled, then every message audited (`make bench-queen1-soak`).
    Queen1Soak(comb_bench::queen1::soak::Args),
}

impl Args {
    /// Whether this run compares two variants.
    fn compares(&self) -> bool {
        self.against.is_some() || !self.against_args.is_empty()
    }
}

fn main() {
    let mut args = Args::parse();
    let (name, result) = match args.long.take() {
        Some(Long::Xmin(a)) => ("comb-bench xmin", xmin::run(a)),
        Some(Long::Soak(a)) => ("comb-bench soak", soak::run(a)),
        Some(Long::Queen1Soak(a)) => ("comb-bench queen1-soak", comb_bench::queen1::soak::run(a)),
        None => ("comb-bench", run(args)),
    };
    if let Err(e) = result {
        eprintln!("{name}: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let selected = cells::select(&args.cells)?;
    if args.list {
        for c in cells::all() {
            println!("{:<12} {:<10} {}", c.name, c.system(), c.about);
        }
        return Ok(());
    }
    for bin in std::iter::once(&args.comb).chain(&args.against) {
        if !bin.is_file() {
            return Err(format!(
                "{} not found: build it first (cargo build --release -p comb-cli)",
                bin.display()
            )
            .into());
        }
    }
    if args.compares() && (args.doc.is_some() || args.profile.is_some()) {
        return Err(
            "a comparison (--against, --against-arg) takes neither --doc nor --profile".into(),
        );
    }
    let (warmup, duration, pop_fill) = if args.smoke {
        (1.0, 3.0, 150)
    } else {
        (args.warmup, args.duration, args.pop_fill)
    };
    let baseline = report::read_json(&args.baseline).unwrap_or_default();
    let opts = Options {
        comb_bin: args.comb.clone(),
        comb_args: args.comb_args.clone(),
        warmup: Duration::from_secs_f64(warmup),
        duration: Duration::from_secs_f64(duration),
        pop_fill_per_partition: pop_fill,
        ceiling_partitions: args.ceiling_partitions,
        profile: args.profile.clone().map(|dir| Profile {
            dir,
            perf: args.perf,
        }),
        baseline,
        steady_rate: args.steady_rate,
        pop_partitions: usize::from(args.pop_partitions),
        icu_locale: args.icu_locale.clone(),
        fanout_rate: args.fanout_rate,
        peers: args.peers.clone(),
        citus: args.citus,
        citus_workers: {
            let mut w: Vec<usize> = args.citus_workers.iter().map(|&n| usize::from(n)).collect();
            w.sort_unstable();
            w.dedup();
            w
        },
        citus_route: args.citus_route.clone(),
    };
    let rt = if args.client_threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.client_threads)
            .enable_all()
            .build()?
    };
    let started = Instant::now();
    // The tree may change while the suite runs; record what was built.
    let commit = report::shell("git describe --always --dirty 2>/dev/null || echo unknown");
    let mut runner = Runner::new(opts, rt)?;
    eprintln!(
        "PostgreSQL on port {}; {} cells, {warmup} s warm-up + {duration} s each",
        runner.pg.port(),
        selected.len()
    );
    for c in &runner.citus {
        eprintln!(
            "Citus coordinator on port {}, workers on {}",
            c.coordinator().port(),
            c.workers()
                .iter()
                .map(|w| w.port().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if args.compares() {
        return compare(&args, runner, &selected, started);
    }
    let rows = run_cells(&mut runner, &selected, &args.peers);
    let hardware = scaleout::Hardware {
        worker_cores: args.model_worker_cores,
        coordinator_cores: args.model_coordinator_cores,
        worker_wal_mb_s: args.model_worker_wal_mb_s,
    };
    let table = report::table(&rows)
        + &with_blank(report::program_table(&rows))
        + &with_blank(comb_bench::nodes::table(&rows))
        + &with_blank(scaleout::text(&rows, hardware, host_cores()));
    let checks = report::checks_text(&report::checks(&rows));
    println!("\n{table}\n{checks}");
    println!(
        "Whole run: {:.1} min",
        started.elapsed().as_secs_f64() / 60.0
    );
    if let Some(path) = &args.json {
        report::write_json(path, &rows)?;
        eprintln!("rows written to {}", path.display());
    }
    if args.citus {
        let run = scaleout::Run {
            command: args
                .command
                .clone()
                .unwrap_or_else(|| std::env::args().collect::<Vec<_>>().join(" ")),
            date: report::shell("date -u +%Y-%m-%dT%H:%MZ"),
            machine: scaleout::Machine::here(),
            uptime: report::shell("uptime"),
            commit: commit.clone(),
            citus_route: args.citus_route.clone(),
            warmup_s: warmup,
            duration_s: duration,
            model_hardware: hardware,
        };
        scaleout::write(
            &args.citus_json,
            &scaleout::record(&rows, run, host_cores()),
        )?;
        eprintln!("Citus figures written to {}", args.citus_json.display());
    }
    if let Some(path) = &args.doc {
        let pg_version = runner
            .pg
            .psql("postgres", "SHOW server_version")
            .unwrap_or_default();
        let command = args
            .command
            .clone()
            .unwrap_or_else(|| std::env::args().collect::<Vec<_>>().join(" "));
        let info = RunInfo {
            command: &command,
            commit: &commit,
            pg_version: &pg_version,
            warmup,
            duration,
            took: started.elapsed(),
        };
        let section = results_section(&info, &table, &checks);
        let doc = std::fs::read_to_string(path).unwrap_or_else(|_| "# Benchmarks\n".into());
        std::fs::write(path, report::splice(&doc, &section))?;
        eprintln!("results section of {} updated", path.display());
    }
    Ok(())
}

/// The cores of this machine, which every process of a run shares.
/// An ICU locale name as `CREATE DATABASE … ICU_LOCALE` takes it, from letters, digits, `-`
/// and `_` only: it is written into SQL.
fn parse_icu_locale(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    match ok {
        true => Ok(s.to_string()),
        false => Err(format!(
            "{s:?} is not an ICU locale name (letters, digits, '-' and '_', such as en-US)"
        )),
    }
}

fn host_cores() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

/// A blank line before `text`, unless it is empty.
fn with_blank(text: String) -> String {
    if text.is_empty() {
        text
    } else {
        format!("\n{text}")
    }
}

/// Runs `cells` in order, each Comb cell followed by the same cell against every `--peer`
/// server, and returns their rows, peers' ratios filled in.
fn run_cells(runner: &mut Runner, cells: &[cells::Cell], peers: &[Peer]) -> Vec<report::Row> {
    runner.rows.clear();
    let report = |result: Result<report::Row, _>, t: Instant| match result {
        Ok(row) => eprintln!(
            "  {:.0} msg/s, p99 {} ms ({:.0} s)",
            row.msgs_per_sec,
            report::num(row.p99_ms),
            t.elapsed().as_secs_f64()
        ),
        Err(e) => eprintln!("  FAILED: {e}"),
    };
    for cell in cells {
        eprintln!("cell {:<12} {}", cell.name, cell.about);
        let t = Instant::now();
        report(runner.run(cell), t);
        if cell.system() != "comb" {
            continue;
        }
        for peer in peers {
            eprintln!("cell {:<12} the same against {}", cell.name, peer.name);
            let t = Instant::now();
            report(runner.run_with(cell, peer), t);
        }
        for i in 0..runner.citus.len() {
            eprintln!(
                "cell {:<12} the same on Citus, {} worker(s)",
                cell.name,
                runner.citus[i].workers().len()
            );
            let t = Instant::now();
            report(runner.run_citus(cell, i), t);
        }
    }
    let mut rows = runner.rows.clone();
    report::fill_ratios(&mut rows, |name| {
        cells::all()
            .into_iter()
            .find(|c| c.name == name)
            .and_then(|c| c.compare)
    });
    report::fill_program_ratios(&mut rows);
    rows
}

/// Runs the cells for A and B in turns (see [`compare`]) and prints both.
fn compare(
    args: &Args,
    mut runner: Runner,
    cells: &[cells::Cell],
    started: Instant,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    runner.fix_rates();
    let a = (args.comb.clone(), args.comb_args.clone());
    let b = (
        args.against.clone().unwrap_or_else(|| args.comb.clone()),
        if args.against_args.is_empty() {
            args.comb_args.clone()
        } else {
            args.against_args.clone()
        },
    );
    let (mut rounds_a, mut rounds_b) = (Vec::new(), Vec::new());
    for round in 0..usize::from(args.rounds) {
        let a_first = compare::a_first(round);
        for is_a in [a_first, !a_first] {
            let (bin, comb_args) = if is_a { &a } else { &b };
            eprintln!(
                "round {} of {}: {}",
                round + 1,
                args.rounds,
                if is_a { "A" } else { "B" }
            );
            runner.use_comb(bin.clone(), comb_args.clone());
            let rows = run_cells(&mut runner, cells, &args.peers);
            if is_a {
                rounds_a.push(rows);
            } else {
                rounds_b.push(rows);
            }
        }
    }
    let describe = |(bin, comb_args): &(PathBuf, Vec<String>)| {
        std::iter::once(bin.display().to_string())
            .chain(comb_args.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "\nA: {}\nB: {}\nRounds: {} (A first in odd rounds, B in even ones)\n\n{}",
        describe(&a),
        describe(&b),
        args.rounds,
        compare::table(&rounds_a, &rounds_b)
    );
    println!(
        "Whole run: {:.1} min",
        started.elapsed().as_secs_f64() / 60.0
    );
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&serde_json::json!({
            "a": { "comb": describe(&a), "rounds": rounds_a },
            "b": { "comb": describe(&b), "rounds": rounds_b },
        }))?;
        std::fs::write(path, text + "\n")?;
        eprintln!("rounds written to {}", path.display());
    }
    Ok(())
}

/// How, when and where a run was made, for the benchmarks page.
struct RunInfo<'a> {
    command: &'a str,
    commit: &'a str,
    pg_version: &'a str,
    warmup: f64,
    duration: f64,
    took: Duration,
}

/// The generated part of the benchmarks page: how, when and where, then the table.
fn results_section(run: &RunInfo, table: &str, checks: &str) -> String {
    let settings: Vec<String> = PG_SETTINGS
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let mut s = String::new();
    let _ = writeln!(s, "- Command: `{}`", run.command);
    let _ = writeln!(s, "- Date: {}", report::shell("date -u +%Y-%m-%dT%H:%MZ"));
    let _ = writeln!(s, "- Machine: {}", report::machine());
    let _ = writeln!(
        s,
        "- PostgreSQL {}: {}",
        run.pg_version,
        settings.join(", ")
    );
    let _ = writeln!(s, "- Comb commit: {}", run.commit);
    let _ = writeln!(
        s,
        "- Per cell: {} s warm-up, {} s measured; whole run {:.1} min",
        run.warmup,
        run.duration,
        run.took.as_secs_f64() / 60.0
    );
    let _ = writeln!(
        s,
        "\n```text\n{table}```\n\nTargets:\n\n```text\n{checks}```"
    );
    s
}

#[cfg(test)]
mod tests {
    use super::Args;
    use clap::Parser;

    #[test]
    fn a_comparison_needs_a_second_variant_and_a_sane_number_of_rounds() {
        let parse = |args: &[&str]| {
            Args::try_parse_from(std::iter::once("comb-bench").chain(args.iter().copied()))
        };
        assert!(!parse(&[]).unwrap().compares());
        assert!(parse(&["--against", "/tmp/other"]).unwrap().compares());
        assert!(
            parse(&["--against-arg=--push-workers=2"])
                .unwrap()
                .compares()
        );
        for bad in ["0", "21", "x"] {
            assert!(
                parse(&["--against", "b", "--rounds", bad]).is_err(),
                "{bad}"
            );
        }
        assert_eq!(parse(&[]).unwrap().rounds, 2);
    }

    #[test]
    fn the_long_runs_are_subcommands_with_their_own_flags() {
        let args = Args::try_parse_from(["comb-bench", "xmin", "--smoke", "--rate", "50"]).unwrap();
        assert!(matches!(args.long, Some(super::Long::Xmin(_))));
        let args = Args::try_parse_from(["comb-bench", "soak", "--comb-arg=--push-workers=2"]);
        assert!(matches!(args.unwrap().long, Some(super::Long::Soak(_))));
        // The suite's flags do not mix with a long run's.
        assert!(Args::try_parse_from(["comb-bench", "--cells", "push1", "soak"]).is_err());
        assert!(Args::try_parse_from(["comb-bench", "xmin", "--cells", "push1"]).is_err());
        assert!(Args::try_parse_from(["comb-bench"]).unwrap().long.is_none());
    }

    #[test]
    fn peers_are_named_programs() {
        let args = Args::try_parse_from([
            "comb-bench",
            "--peer",
            "queen=/opt/queen/bin/queen",
            "--peer=other=./x",
        ])
        .unwrap();
        let named: Vec<(&str, &str)> = args
            .peers
            .iter()
            .map(|p| (p.name.as_str(), p.program.to_str().unwrap()))
            .collect();
        assert_eq!(named, [("queen", "/opt/queen/bin/queen"), ("other", "./x")]);
        for bad in [
            "queen",
            "=prog",
            "queen=",
            "comb=./x",
            "skiplocked=./x",
            "a b=./x",
        ] {
            assert!(
                Args::try_parse_from(["comb-bench", "--peer", bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn citus_runs_on_one_cluster_size_or_several() {
        let parse = |args: &[&str]| {
            Args::try_parse_from(std::iter::once("comb-bench").chain(args.iter().copied()))
        };
        assert_eq!(parse(&[]).unwrap().citus_workers, [2]);
        assert_eq!(
            parse(&["--citus-workers", "1,2"]).unwrap().citus_workers,
            [1, 2]
        );
        for bad in ["0", "9", "1,x", ""] {
            assert!(parse(&["--citus-workers", bad]).is_err(), "{bad}");
        }
        assert_eq!(parse(&[]).unwrap().citus_route, None);
        assert_eq!(
            parse(&["--citus-route", "direct"]).unwrap().citus_route,
            Some("direct".into())
        );
        assert!(parse(&["--citus-route", "workers"]).is_err());
        assert_eq!(
            parse(&[]).unwrap().citus_json,
            std::path::Path::new("bench/results/citus.json")
        );
    }

    #[test]
    fn icu_locales_are_names_not_sql() {
        let parse = |v: &str| Args::try_parse_from(["comb-bench", "--icu-locale", v]);
        assert_eq!(parse("en-US").unwrap().icu_locale.as_deref(), Some("en-US"));
        assert_eq!(parse("de_DE").unwrap().icu_locale.as_deref(), Some("de_DE"));
        assert!(parse("en-US' LOCALE 'x").is_err());
        assert!(parse("").is_err());
        assert_eq!(
            Args::try_parse_from(["comb-bench"]).unwrap().icu_locale,
            None
        );
    }

    #[test]
    fn pop_partitions_must_be_what_a_pop_accepts() {
        for bad in ["0", "101", "x"] {
            assert!(Args::try_parse_from(["comb-bench", "--pop-partitions", bad]).is_err());
        }
        let args = Args::try_parse_from(["comb-bench", "--pop-partitions", "4"]).unwrap();
        assert_eq!(args.pop_partitions, 4);
        assert_eq!(
            Args::try_parse_from(["comb-bench"]).unwrap().pop_partitions,
            1
        );
    }
}
