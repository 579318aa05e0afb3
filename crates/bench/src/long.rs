//! What the long runs (`comb-bench-xmin`, `comb-bench-soak`) share around their load: a
//! cluster that their records describe, a `comb serve` with short segments, and the JSON file
//! and page section they write.
//!
//! A long run is judged from its record alone, often much later and next to runs from other
//! days, so every record states the same facts the same way: command, date, machine, the
//! cluster's settings, the commit, and the run's own report.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use comb_harness::{Postgres, Server};
use serde::Serialize;

use crate::http::BoxError;
use crate::report::{Section, num, shell};
use crate::run::PG_SETTINGS;
use crate::stats::mean;

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
        "{} not found: build it first (cargo build --release -p comb)",
        bin.display()
    )
    .into())
}

/// Starts `comb serve` on `url` with a segment period and maintenance interval short enough
/// that segments are made, rolled over and dropped while the run lasts, plus `extra` flags.
pub fn start_comb(
    bin: &Path,
    url: &str,
    segment_seconds: u64,
    maintenance_ms: u64,
    extra: &[String],
) -> Result<Server, BoxError> {
    let mut flags = vec![
        "--segment-seconds".to_string(),
        segment_seconds.to_string(),
        "--maintenance-interval-ms".to_string(),
        maintenance_ms.to_string(),
    ];
    flags.extend(extra.iter().cloned());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Ok(Server::start(bin, url, &flags)?)
}

/// Where a long run writes its results, and what its record says about how it was started
/// (flattened into each tool's arguments).
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

/// A finished run: its printed report and what goes into its records.
pub struct Finished<'a, T: Serialize> {
    /// The report, printed and copied into the page section.
    pub report: &'a str,
    /// What the JSON file holds.
    pub results: &'a T,
    /// The run's section of the page.
    pub section: &'a Section,
    /// The run's description of the machine.
    pub machine: &'a str,
    /// The cluster it ran on.
    pub cluster: &'a Cluster,
    /// The commit, taken when the run started (see [`Outputs::commit`]).
    pub commit: &'a str,
    /// When the run started.
    pub started: Instant,
}

impl Outputs {
    /// The commit a record names: `--comb-commit` (when the binary was built elsewhere), or
    /// `git describe` of the working tree. Taken when a run starts, before the tree can change.
    pub fn commit(&self) -> String {
        self.comb_commit
            .clone()
            .unwrap_or_else(|| shell("git describe --always --dirty 2>/dev/null || echo unknown"))
    }

    /// Prints the report and how long the run took, then, unless this was a smoke run (whose
    /// numbers mean nothing), writes the JSON file and the page section.
    pub fn finish<T: Serialize>(&self, smoke: bool, run: Finished<T>) -> Result<(), BoxError> {
        println!("\n{}", run.report);
        println!(
            "Whole run: {:.1} min",
            run.started.elapsed().as_secs_f64() / 60.0
        );
        if smoke {
            eprintln!("smoke run: nothing written");
            return Ok(());
        }
        if let Some(path) = &self.json {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(path, serde_json::to_string_pretty(run.results)? + "\n")?;
            eprintln!("results written to {}", path.display());
        }
        if let Some(path) = &self.doc {
            let doc = std::fs::read_to_string(path).unwrap_or_else(|_| "# Benchmarks\n".into());
            let generated = record(self.command.as_deref(), &run);
            std::fs::write(path, run.section.splice(&doc, &generated))?;
            eprintln!("\"{}\" in {} updated", run.section.heading, path.display());
        }
        Ok(())
    }
}

/// The generated part of a run's page section: how, when and where it ran, then its report.
/// `command` defaults to this process's command line.
fn record<T: Serialize>(command: Option<&str>, run: &Finished<T>) -> String {
    let command = command
        .map(str::to_string)
        .unwrap_or_else(|| std::env::args().collect::<Vec<_>>().join(" "));
    let mut s = String::new();
    let _ = writeln!(s, "- Command: `{command}`");
    let _ = writeln!(s, "- Date: {}", shell("date -u +%Y-%m-%dT%H:%MZ"));
    let _ = writeln!(s, "- Machine: {}", run.machine);
    let _ = writeln!(s, "- {}", run.cluster.describe());
    let _ = writeln!(s, "- Comb commit: {}", run.commit);
    let _ = writeln!(
        s,
        "- Whole run {:.1} min\n\n```text\n{}```",
        run.started.elapsed().as_secs_f64() / 60.0,
        run.report
    );
    s
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
    fn a_missing_binary_is_named() {
        let e = require_comb(Path::new("/nonexistent/comb")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/comb not found"));
    }
}
