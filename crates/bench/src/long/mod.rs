//! The long runs, `comb-bench xmin` ([`xmin`]) and `comb-bench soak` ([`soak`]): many
//! minutes of load, sampled as they go, each ending in a printed report, a JSON file and its
//! own section of `docs/long-runs.md`.
//!
//! They share one skeleton, kept here so that they cannot drift apart: the flags every long
//! run takes ([`Common`]); a cluster their records describe and a `comb serve` with short
//! segments ([`Session`]); the counters a load updates and a sampler reads interval by
//! interval ([`Counters`]); the sample clock ([`ticks`]); and the record they write
//! ([`Session::finish`]).
//!
//! A long run is judged from its record alone, often much later and next to runs from other
//! days, so every record states the same facts the same way: command, date, machine, the
//! cluster's settings, the commit, and the run's own report.

pub mod soak;
pub mod xmin;

use std::fmt::Write as _;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use comb_harness::{Postgres, Server};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::http::BoxError;
use crate::report::{self, Section, num, shell};
use crate::run::PG_SETTINGS;
use crate::stats::{histogram, mean};

/// The cluster of a long run and what its record says about it.
pub struct Cluster {
    /// The running cluster.
    pub pg: Postgres,
    /// `server_version`.
    pub version: String,
    /// The autovacuum settings in effect. Long runs leave them at their defaults, because what
    /// autovacuum does in a default installation is part of what they measure.
    pub autovacuum: String,
}

impl Cluster {
    /// Starts a cluster with the suite's settings plus `extra` (for instance what
    /// pg_stat_statements needs).
    pub fn start(extra: &[(&str, &str)]) -> Result<Cluster, BoxError> {
        let mut settings: Vec<(&str, &str)> = PG_SETTINGS.to_vec();
        settings.extend_from_slice(extra);
        let pg = Postgres::start_with(&settings)?;
        let version = pg
            .psql("postgres", "SHOW server_version")
            .unwrap_or_default();
        let autovacuum = pg
            .psql(
                "postgres",
                "SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings \
                 WHERE name IN ('autovacuum', 'autovacuum_naptime', \
                 'autovacuum_vacuum_scale_factor', 'autovacuum_vacuum_threshold')",
            )
            .unwrap_or_default();
        eprintln!("PostgreSQL {version} on port {}; {autovacuum}", pg.port());
        Ok(Cluster {
            pg,
            version,
            autovacuum,
        })
    }

    /// The PostgreSQL line of a record: version, the suite's settings and autovacuum's.
    pub fn describe(&self) -> String {
        let settings: Vec<String> = PG_SETTINGS
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        format!(
            "PostgreSQL {}: {}; {} (defaults)",
            self.version,
            settings.join(", "),
            self.autovacuum
        )
    }
}

/// Fails before anything is started when the `comb` binary is missing: a long run should not
/// spend a cluster start-up on finding that out.
pub fn require_comb(bin: &Path) -> Result<(), BoxError> {
    if bin.is_file() {
        return Ok(());
    }
    Err(format!(
        "{} not found: build it first (cargo build --release -p comb-cli)",
        bin.display()
    )
    .into())
}

/// The flags every long run takes: the server it runs and where its results go.
#[derive(Debug, Clone, clap::Args)]
pub struct Common {
    /// The `comb` binary to run (a release build).
    #[arg(long, default_value = "target/release/comb")]
    pub comb: PathBuf,
    /// Extra flag for `comb serve` (repeatable).
    #[arg(long = "comb-arg", allow_hyphen_values = true)]
    pub comb_args: Vec<String>,
    /// JSON file, page section and record.
    #[command(flatten)]
    pub out: Outputs,
}

/// Where a long run writes its results, and what its record says about how it was started.
#[derive(Debug, Clone, clap::Args)]
pub struct Outputs {
    /// Write the results here as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Update this run's section of this Markdown file.
    #[arg(long)]
    pub doc: Option<PathBuf>,
    /// How the run was started, for the docs (default: this command line).
    #[arg(long)]
    pub command: Option<String>,
    /// The commit the `comb` binary was built from, for the docs (default: `git describe`
    /// of the working tree).
    #[arg(long)]
    pub comb_commit: Option<String>,
}

impl Outputs {
    /// The commit a record names: `--comb-commit` (when the binary was built elsewhere), or
    /// `git describe` of the working tree. Taken when a run starts, before the tree can change.
    pub fn commit(&self) -> String {
        self.comb_commit
            .clone()
            .unwrap_or_else(|| shell("git describe --always --dirty 2>/dev/null || echo unknown"))
    }
}

/// One long run from its start to its record: the cluster, the commit and the start time.
pub struct Session {
    /// The cluster the run measures.
    pub cluster: Cluster,
    commit: String,
    started: Instant,
}

impl Session {
    /// Starts a run: fails at once if it needs `comb` and the binary is missing, notes the
    /// commit and the time, and starts the cluster with the suite's settings plus `pg_extra`.
    pub fn start(
        common: &Common,
        needs_comb: bool,
        pg_extra: &[(&str, &str)],
    ) -> Result<Session, BoxError> {
        if needs_comb {
            require_comb(&common.comb)?;
        }
        let started = Instant::now();
        let commit = common.out.commit();
        let cluster = Cluster::start(pg_extra)?;
        Ok(Session {
            cluster,
            commit,
            started,
        })
    }

    /// Starts `comb serve` on `url` with a segment period and maintenance interval short
    /// enough that segments are made, rolled over and dropped while the run lasts, plus the
    /// run's `--comb-arg` flags.
    pub fn serve(
        &self,
        common: &Common,
        url: &str,
        segment_seconds: u64,
        maintenance_ms: u64,
    ) -> Result<Server, BoxError> {
        let mut flags = vec![
            "--segment-seconds".to_string(),
            segment_seconds.to_string(),
            "--maintenance-interval-ms".to_string(),
            maintenance_ms.to_string(),
        ];
        flags.extend(common.comb_args.iter().cloned());
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Ok(Server::start(&common.comb, url, &flags)?)
    }

    /// Prints the report and how long the run took, then, unless this was a smoke run (whose
    /// numbers mean nothing), writes the JSON file and the page section.
    pub fn finish<T: Serialize>(
        &self,
        out: &Outputs,
        smoke: bool,
        run: Finished<T>,
    ) -> Result<(), BoxError> {
        println!("\n{}", run.report.whole());
        println!(
            "Whole run: {:.1} min",
            self.started.elapsed().as_secs_f64() / 60.0
        );
        if smoke {
            eprintln!("smoke run: nothing written");
            return Ok(());
        }
        if let Some(path) = &out.json {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(path, serde_json::to_string_pretty(run.results)? + "\n")?;
            eprintln!("results written to {}", path.display());
        }
        if let Some(path) = &out.doc {
            // The page is a document: it keeps the run's summary and goals, and the samples go
            // to a history file beside the other runs' records.
            let history = PathBuf::from(HISTORY).join(format!(
                "{}-{}.md",
                run.name,
                shell("date -u +%Y-%m-%dT%H%MZ")
            ));
            std::fs::create_dir_all(HISTORY)?;
            let whole = self.record(out.command.as_deref(), &run.report.whole());
            std::fs::write(&history, format!("# {}\n\n{whole}", run.section.heading))?;
            eprintln!("every sample written to {}", history.display());
            let doc = std::fs::read_to_string(path).unwrap_or_else(|_| "# Benchmarks\n".into());
            let page = run.report.page(&history.display().to_string());
            let generated = self.record(out.command.as_deref(), &page);
            std::fs::write(path, run.section.splice(&doc, &generated))?;
            eprintln!("\"{}\" in {} updated", run.section.heading, path.display());
        }
        Ok(())
    }

    /// The generated part of a run's page section: how, when and where it ran, then its
    /// report. `command` defaults to this process's command line.
    fn record(&self, command: Option<&str>, report: &str) -> String {
        let command = command
            .map(str::to_string)
            .unwrap_or_else(|| std::env::args().collect::<Vec<_>>().join(" "));
        let mut s = String::new();
        let _ = writeln!(s, "- Command: `{command}`");
        let _ = writeln!(s, "- Date: {}", shell("date -u +%Y-%m-%dT%H:%MZ"));
        let _ = writeln!(s, "- Machine: {}", machine());
        let _ = writeln!(s, "- {}", self.cluster.describe());
        let _ = writeln!(s, "- Comb commit: {}", self.commit);
        let _ = writeln!(
            s,
            "- Whole run {:.1} min\n\n```text\n{}```",
            self.started.elapsed().as_secs_f64() / 60.0,
            report
        );
        s
    }
}

/// Where long runs keep every sample, one file per run, relative to the repository's root.
const HISTORY: &str = "bench/results/history";

/// A long run's printed report in three parts, so that the page can leave out the samples.
pub struct Report {
    /// What ran: load, settings, phases.
    pub head: String,
    /// One line per sample, with its legend.
    pub samples: String,
    /// The phases' summary, the goals and whatever else the run found.
    pub tail: String,
}

impl Report {
    /// Everything, as printed and as kept in the history file.
    pub fn whole(&self) -> String {
        format!("{}{}{}", self.head, self.samples, self.tail)
    }

    /// What the page shows: the samples replaced by where they are kept.
    pub fn page(&self, history: &str) -> String {
        format!(
            "{}Every sample of this run: `{history}`.\n\n{}",
            self.head, self.tail
        )
    }
}

/// A finished run's report and what goes into its records.
pub struct Finished<'a, T: Serialize> {
    /// The report, printed whole; the page section gets it without its samples.
    pub report: &'a Report,
    /// Names the run's history files (`bench/results/history/NAME-DATE.md`).
    pub name: &'a str,
    /// What the JSON file holds.
    pub results: &'a T,
    /// The run's section of the page.
    pub section: &'a Section,
}

/// Runs a run's load and sampling to completion on one current-thread runtime: the load
/// generator of a long run uses one core at most, whatever the run.
pub fn block_on<F: Future>(run: F) -> Result<F::Output, BoxError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok(rt.block_on(run))
}

/// The machine a long run's record names; the machine is shared, which its samples show.
fn machine() -> String {
    format!(
        "{}; a shared machine whose neighbours' CPU use shows in the `other` column",
        report::machine()
    )
}

/// What a running load counts and its sampler reads: messages accepted, messages delivered,
/// and the end-to-end latency of the deliveries since the last reading.
pub struct Counters {
    /// Messages accepted so far.
    pub pushed: Arc<AtomicU64>,
    /// Messages delivered so far.
    pub delivered: Arc<AtomicU64>,
    /// End-to-end latency (µs) of the deliveries since the last reading.
    pub e2e: Arc<Mutex<Histogram<u64>>>,
}

/// The counters' totals where an interval began.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mark {
    pushed: u64,
    delivered: u64,
}

/// What a load did in one interval.
pub struct Interval {
    /// Messages accepted in the interval.
    pub pushed: u64,
    /// Messages delivered in the interval.
    pub delivered: u64,
    /// Accepted but not yet delivered, at the end of the interval.
    pub backlog: i64,
    /// End-to-end latency of the interval's deliveries.
    pub e2e: Histogram<u64>,
}

impl Counters {
    /// Counters of a load whose set-up already accepted `pushed` messages.
    pub fn new(pushed: u64) -> Counters {
        Counters {
            pushed: Arc::new(AtomicU64::new(pushed)),
            delivered: Arc::new(AtomicU64::new(0)),
            e2e: Arc::new(Mutex::new(histogram())),
        }
    }

    /// Begins an interval now; the latencies recorded so far are dropped.
    pub fn mark(&self) -> Mark {
        *self.e2e.lock().expect("not poisoned") = histogram();
        Mark {
            pushed: self.pushed.load(Ordering::Relaxed),
            delivered: self.delivered.load(Ordering::Relaxed),
        }
    }

    /// Ends the interval begun at `mark` and begins the next one there.
    pub fn interval(&self, mark: &mut Mark) -> Interval {
        let pushed = self.pushed.load(Ordering::Relaxed);
        let delivered = self.delivered.load(Ordering::Relaxed);
        let e2e = std::mem::replace(&mut *self.e2e.lock().expect("not poisoned"), histogram());
        let interval = Interval {
            pushed: pushed.saturating_sub(mark.pushed),
            delivered: delivered.saturating_sub(mark.delivered),
            backlog: pushed as i64 - delivered as i64,
            e2e,
        };
        *mark = Mark { pushed, delivered };
        interval
    }
}

/// The sample times of a phase `len` seconds long, in seconds from its start: every `every`
/// seconds, the last interval cut short at the phase's end so that none straddles two phases.
pub fn ticks(len: f64, every: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut k = 1u32;
    loop {
        let t = (every * f64::from(k)).min(len);
        out.push(t);
        if t >= len - 1e-6 {
            return out;
        }
        k += 1;
    }
}

/// How loaded the machine was over a run, from per-sample busy shares and neighbours' cores:
/// on a shared machine this says how much to trust the run's latencies.
pub fn machine_load(busy: &[f64], other: &[f64]) -> String {
    format!(
        "Machine: {} busy on average; processes outside this run used {} cores on average \
         (most in one sample: {}).",
        mean(busy)
            .map(|b| format!("{:.0}%", b * 100.0))
            .unwrap_or("-".into()),
        num(mean(other)),
        num(other.iter().copied().reduce(f64::max)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_load_states_means_and_the_worst_sample() {
        assert_eq!(
            machine_load(&[0.5, 1.0], &[0.25, 0.75]),
            "Machine: 75% busy on average; processes outside this run used 0.500 cores on \
             average (most in one sample: 0.750)."
        );
        assert!(machine_load(&[], &[]).starts_with("Machine: - busy"));
    }

    #[test]
    fn ticks_end_with_the_phase() {
        assert_eq!(ticks(30.0, 10.0), vec![10.0, 20.0, 30.0]);
        assert_eq!(ticks(25.0, 10.0), vec![10.0, 20.0, 25.0]);
        assert_eq!(ticks(5.0, 10.0), vec![5.0]);
        assert_eq!(ticks(960.0, 10.0).len(), 96);
    }

    #[test]
    fn an_interval_counts_from_its_mark() {
        let c = Counters::new(100);
        c.e2e.lock().unwrap().record(5).unwrap();
        let mut mark = c.mark();
        assert!(c.e2e.lock().unwrap().is_empty(), "the warm-up is dropped");
        c.pushed.fetch_add(30, Ordering::Relaxed);
        c.delivered.fetch_add(120, Ordering::Relaxed);
        c.e2e.lock().unwrap().record(7).unwrap();
        let i = c.interval(&mut mark);
        assert_eq!((i.pushed, i.delivered, i.backlog), (30, 120, 10));
        assert_eq!(i.e2e.len(), 1);
        let i = c.interval(&mut mark);
        assert_eq!((i.pushed, i.delivered, i.e2e.len()), (0, 0, 0));
    }

    /// `make bench`, `make bench-xmin` and `make bench-soak` rewrite sections of these pages;
    /// a page that lost a writer's markers would get a second copy of the section at its end.
    #[test]
    fn the_pages_hold_every_writers_markers() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let makefile = std::fs::read_to_string(root.join("Makefile")).unwrap();
        let pages = [
            ("docs/benchmarks.md", report::BEGIN, report::END),
            (
                "docs/long-runs.md",
                xmin::XMIN_SECTION.begin,
                xmin::XMIN_SECTION.end,
            ),
            (
                "docs/long-runs.md",
                soak::SOAK_SECTION.begin,
                soak::SOAK_SECTION.end,
            ),
            (
                "docs/queen1.md",
                crate::queen1::soak::QUEEN1_SOAK_SECTION.begin,
                crate::queen1::soak::QUEEN1_SOAK_SECTION.end,
            ),
        ];
        for (page, begin, end) in pages {
            assert!(makefile.contains(&format!("--doc {page}")), "{page}");
            let text = std::fs::read_to_string(root.join(page)).unwrap();
            assert_eq!(text.matches(begin).count(), 1, "{page}: {begin}");
            assert_eq!(text.matches(end).count(), 1, "{page}: {end}");
            assert!(text.find(begin) < text.find(end), "{page}: {begin}");
        }
    }

    #[test]
    fn a_missing_binary_is_named() {
        let e = require_comb(Path::new("/nonexistent/comb")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/comb not found"));
    }
}
