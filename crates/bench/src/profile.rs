//! Optional profiling of a cell's window: what PostgreSQL spent its time on
//! (`pg_stat_statements`), what its backends were waiting for (sampled
//! `pg_stat_activity`), which records made its WAL (`pg_waldump`), and where the machine's
//! CPU went (`perf record -a`).
//!
//! The published numbers are taken without any of this: profiling costs CPU on a 2-core
//! machine. It exists to find what bounds a cell, not to measure it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use inferno::collapse::Collapse as _;
use tokio_postgres::Client;

/// Where profiles go and what to collect.
#[derive(Debug, Clone)]
pub struct Profile {
    /// Directory for `<cell>.txt` (and `<cell>.perf.*` with `perf`).
    pub dir: PathBuf,
    /// Also run `perf record -a` over the window.
    pub perf: bool,
}

/// PostgreSQL settings that profiling needs in addition to the suite's.
pub const PG_SETTINGS: &[(&str, &str)] = &[
    ("shared_preload_libraries", "pg_stat_statements"),
    ("pg_stat_statements.track", "all"),
    ("pg_stat_statements.track_planning", "on"),
    ("track_io_timing", "on"),
    ("track_wal_io_timing", "on"),
];

/// Prepares the cell's database (creates the extension).
pub async fn prepare(client: &Client) -> Result<(), tokio_postgres::Error> {
    client
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
}

/// Clears statement statistics at the start of the window.
pub async fn reset(client: &Client) {
    let _ = client
        .batch_execute("SELECT pg_stat_statements_reset()")
        .await;
}

/// `perf record` processes of one window.
pub struct Perf {
    children: Vec<Child>,
}

/// Starts `perf record` for `secs` seconds: the whole machine without call graphs (where
/// the CPU goes, by process and function), and, given its pid, the broker alone with DWARF
/// call graphs (what its functions cost including their callees). Each sample copies the
/// most of the stack `perf` allows (64 KiB): the broker's async stacks are deep, and with
/// 16 KiB copied the frames nearest `main` (the connection that runs a handler) were lost
/// from about half of the samples, which then counted for their handler but not for it.
pub fn start_perf(dir: &Path, cell: &str, secs: f64, broker_pid: Option<u32>) -> Perf {
    let _ = std::fs::create_dir_all(dir);
    let mut children = Vec::new();
    let sleep = format!("{secs:.1}");
    let mut all = Command::new("perf");
    all.args(["record", "-a", "-F", "499", "-o"])
        .arg(dir.join(format!("{cell}.perf.data")))
        .args(["--", "sleep", &sleep]);
    children.extend(spawn_quiet(all));
    if let Some(pid) = broker_pid {
        let mut broker = Command::new("perf");
        broker
            .args(["record", "-F", "199", "--call-graph", "dwarf,65528", "-p"])
            .arg(pid.to_string())
            .arg("-o")
            .arg(dir.join(format!("{cell}.comb.perf.data")))
            .args(["--", "sleep", &sleep]);
        children.extend(spawn_quiet(broker));
    }
    Perf { children }
}

fn spawn_quiet(mut cmd: Command) -> Option<Child> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| eprintln!("  perf record could not start: {e}"))
        .ok()
}

fn perf_report(data: &Path, args: &[&str]) -> String {
    Command::new("perf")
        .args(["report", "--stdio", "-i"])
        .arg(data)
        .args(args)
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Waits for the recordings and writes `<cell>.perf.txt`: CPU by process and library, the
/// PostgreSQL functions, the broker's functions by own time and the broker's CPU by part;
/// beside it the broker's folded stacks `<cell>.comb.folded` and a flame graph
/// `<cell>.comb.svg`.
pub fn finish_perf(perf: Perf, dir: &Path, cell: &str) {
    for mut child in perf.children {
        let _ = child.wait();
    }
    let all = dir.join(format!("{cell}.perf.data"));
    let comb = dir.join(format!("{cell}.comb.perf.data"));
    let mut text = String::new();
    let sections: [(&str, &Path, &[&str]); 4] = [
        (
            "Whole machine: CPU by process and library",
            &all,
            &[
                "--no-children",
                "--sort",
                "comm,dso",
                "--percent-limit",
                "0.5",
            ],
        ),
        (
            "PostgreSQL processes: functions (share of PostgreSQL's samples)",
            &all,
            &[
                "--no-children",
                "--comms",
                "postgres",
                "--percentage",
                "relative",
                "--sort",
                "sym",
                "--percent-limit",
                "0.8",
            ],
        ),
        (
            "Load generator: functions (share of its samples)",
            &all,
            &[
                "--no-children",
                "--comms",
                "comb-bench",
                "--percentage",
                "relative",
                "--sort",
                "sym",
                "--percent-limit",
                "2",
            ],
        ),
        (
            "Broker: functions by own time",
            &comb,
            &[
                "--no-children",
                "--sort",
                "sym",
                "-g",
                "none",
                "--percent-limit",
                "0.8",
            ],
        ),
    ];
    for (title, data, args) in sections {
        if !data.exists() {
            continue;
        }
        text.push_str(&format!("\n======== {title} ========\n"));
        let report = perf_report(data, args);
        // perf's header comments add nothing here.
        for line in report
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        {
            text.push_str(line.trim_end());
            text.push('\n');
        }
    }
    if comb.exists() {
        text.push_str("\n======== Broker: share of samples whose stack contains ========\n");
        match fold_and_draw(&comb, dir, cell) {
            Ok(stacks) => {
                for (name, share) in categories(&stacks) {
                    text.push_str(&format!("  {:>5.1}%  {name}\n", share * 100.0));
                }
            }
            Err(why) => text.push_str(&format!("  (no call graphs: {why})\n")),
        }
    }
    let _ = std::fs::write(dir.join(format!("{cell}.perf.txt")), text);
    let _ = std::fs::remove_file(all);
    let _ = std::fs::remove_file(comb);
}

/// Folds the broker's DWARF call graphs (`perf script`) into one line per distinct stack,
/// writes them as `<cell>.comb.folded` (small, and what flame graph tools read) and draws
/// `<cell>.comb.svg`. Returns the folded stacks, or why there are none: a recording without
/// samples or a `perf script` that resolved no stacks reads as an error here, never as a
/// breakdown of zeros.
fn fold_and_draw(data: &Path, dir: &Path, cell: &str) -> Result<String, String> {
    let script = Command::new("perf")
        .args(["script", "-i"])
        .arg(data)
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("perf script could not run: {e}"))?;
    let mut folded = Vec::new();
    inferno::collapse::perf::Folder::default()
        .collapse(&script.stdout[..], &mut folded)
        .map_err(|e| format!("the stacks could not be folded: {e}"))?;
    let folded = String::from_utf8_lossy(&folded).into_owned();
    if folded.trim().is_empty() {
        return Err(format!(
            "perf script gave {} bytes and no stacks",
            script.stdout.len()
        ));
    }
    let _ = std::fs::write(dir.join(format!("{cell}.comb.folded")), &folded);
    let mut options = inferno::flamegraph::Options::default();
    options.title = format!("comb, cell {cell}");
    let mut svg = Vec::new();
    if inferno::flamegraph::from_lines(&mut options, folded.lines(), &mut svg).is_ok() {
        let _ = std::fs::write(dir.join(format!("{cell}.comb.svg")), svg);
    }
    Ok(folded)
}

/// Parts of the broker, each named by frames that mark it. A sample counts for every part
/// whose frame is on its stack, so shares overlap (an allocation inside JSON parsing counts
/// for both).
const CATEGORIES: &[(&str, &[&str])] = &[
    (
        "HTTP connections (hyper/axum), handlers included",
        &["axum::serve::handle_connection"],
    ),
    ("  route handlers", &["axum::handler::Handler"]),
    (
        "    request body JSON parsing",
        &["comb::http::body::parse_json"],
    ),
    (
        "    response JSON",
        &["axum::json::Json<T> as axum_core::response::into_response"],
    ),
    (
        "    name resolution (catalog)",
        &["comb::push::Pusher::resolve", "comb::catalog::"],
    ),
    ("    message ids (UUIDv7)", &["now_v7"]),
    (
        "fused batch workers (push, pop, ack)",
        &["comb::fusion::Fuser"],
    ),
    (
        "PostgreSQL connection I/O (tokio-postgres)",
        &["tokio_postgres::connection::Connection"],
    ),
    (
        "PostgreSQL query encode/decode",
        &[
            "tokio_postgres::client::Client::query",
            "tokio_postgres::query::",
        ],
    ),
    ("comb push path", &["comb::push::", "comb::http::push::"]),
    ("comb pop path", &["comb::pop::", "comb::http::pop::"]),
    ("comb ack path", &["comb::ack::", "comb::http::ack::"]),
    ("hashing (SipHash)", &["sip::Hasher"]),
    (
        "allocator (malloc/free)",
        &["malloc", "cfree", "_int_free", "realloc"],
    ),
    ("system calls", &["do_syscall_64"]),
    ("  socket writes", &["writev", "sys_sendto", "sys_write"]),
    ("  socket reads", &["recvfrom", "sys_read"]),
    ("  epoll", &["epoll_wait"]),
    ("  futex", &["futex"]),
    (
        "runtime worker parking and waking",
        &["worker::Context::park", "unpark"],
    ),
    ("kernel context switches", &["finish_task_switch"]),
];

/// Shares of samples (0–1) per [`CATEGORIES`] entry in folded stacks (`a;b;c 12` lines).
pub fn categories(folded: &str) -> Vec<(&'static str, f64)> {
    let mut total = 0u64;
    let mut counts = vec![0u64; CATEGORIES.len()];
    for line in folded.lines() {
        let Some((stack, n)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        total += n;
        for (i, (_, marks)) in CATEGORIES.iter().enumerate() {
            if marks.iter().any(|m| stack.contains(m)) {
                counts[i] += n;
            }
        }
    }
    CATEGORIES
        .iter()
        .zip(counts)
        .map(|((name, _), c)| (*name, c as f64 / total.max(1) as f64))
        .collect()
}

/// Wait events of the cell's active backends, counted over samples.
#[derive(Debug, Default)]
pub struct Waits {
    samples: u64,
    counts: BTreeMap<String, u64>,
}

const WAITS_SQL: &str = "SELECT coalesce(wait_event_type, 'CPU') || ':' || coalesce(wait_event, 'running'), count(*)::int8
    FROM pg_stat_activity
    WHERE datname = current_database() AND state <> 'idle' AND pid <> pg_backend_pid()
    GROUP BY 1";

impl Waits {
    /// Samples `pg_stat_activity` every 50 ms until `until`.
    pub async fn sample(client: &Client, until: tokio::time::Instant) -> Waits {
        let mut w = Waits::default();
        while tokio::time::Instant::now() < until {
            if let Ok(rows) = client.query(WAITS_SQL, &[]).await {
                w.samples += 1;
                for r in rows {
                    *w.counts.entry(r.get(0)).or_default() += r.get::<_, i64>(1) as u64;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        w
    }

    /// Average number of backends in each state, busiest first.
    pub fn text(&self) -> String {
        let mut v: Vec<(&String, &u64)> = self.counts.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1));
        let mut out = format!(
            "Active backends by wait event (average over {} samples):\n",
            self.samples
        );
        for (k, n) in v {
            let _ = writeln!(
                out,
                "  {:>7.2}  {k}",
                *n as f64 / self.samples.max(1) as f64
            );
        }
        out
    }
}

const STATEMENTS_SQL: &str = "
SELECT calls::int8, total_exec_time, mean_exec_time, rows::int8, wal_bytes::int8,
       100 * total_exec_time / nullif(sum(total_exec_time) OVER (), 0),
       left(regexp_replace(query, '\\s+', ' ', 'g'), 150),
       plans::int8, total_plan_time
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY total_exec_time + total_plan_time DESC
LIMIT 15";

/// The statements that took most of PostgreSQL's execution time in the window.
pub async fn statements(client: &Client, secs: f64) -> String {
    let rows = match client.query(STATEMENTS_SQL, &[]).await {
        Ok(r) => r,
        Err(e) => return format!("pg_stat_statements unavailable: {e}\n"),
    };
    let mut out = String::from(
        "Statements by total execution and planning time (pg_stat_statements, window only;\n\
         share is of execution time):\n\
         calls/s    total ms/s  mean ms   rows/call  WAL B/call  share  plans/s  plan ms/s  query\n",
    );
    for r in rows {
        let calls: i64 = r.get(0);
        let total: f64 = r.get(1);
        let mean: f64 = r.get(2);
        let rows: i64 = r.get(3);
        let wal: i64 = r.get(4);
        let share: Option<f64> = r.get(5);
        let q: String = r.get(6);
        let plans: i64 = r.get(7);
        let plan_ms: f64 = r.get(8);
        let per = |x: i64| x as f64 / calls.max(1) as f64;
        let _ = writeln!(
            out,
            "{:>8.0}  {:>10.1}  {:>8.3}  {:>9.1}  {:>10.0}  {:>4.0}%  {:>7.0}  {:>9.1}  {q}",
            calls as f64 / secs,
            total / secs,
            mean,
            per(rows),
            per(wal),
            share.unwrap_or(0.0),
            plans as f64 / secs,
            plan_ms / secs
        );
    }
    out
}

/// The cluster's WAL insert position now, to read the window's records back afterwards.
pub async fn wal_lsn(client: &Client) -> Option<String> {
    let row = client
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await
        .ok()?;
    Some(row.get(0))
}

/// The window's WAL by record type (`pg_waldump --stats=record` between two positions of
/// [`wal_lsn`]), per second: which records (heap inserts, index
/// entries, full-page images, commits) make a message's bytes, where `pg_stat_wal` gives only
/// their sum. All the cluster's WAL, not only the cell's database.
pub async fn wal_records(client: &Client, from: &str, secs: f64) -> String {
    // pg_waldump reads the files, so the window ends at what is already flushed.
    let (to, data) = match client
        .query_one(
            "SELECT pg_current_wal_flush_lsn()::text, current_setting('data_directory')",
            &[],
        )
        .await
    {
        Ok(r) => (r.get::<_, String>(0), r.get::<_, String>(1)),
        Err(e) => return format!("WAL records unavailable: {e}\n"),
    };
    let bin = match comb_harness::pg_bin_dir() {
        Ok(b) => b.join("pg_waldump"),
        Err(e) => return format!("WAL records unavailable: {e}\n"),
    };
    let out = Command::new(bin)
        .args(["--path"])
        .arg(Path::new(&data).join("pg_wal"))
        .args(["--start", from, "--end", &to, "--stats=record"])
        .stderr(Stdio::piped())
        .output();
    match out {
        Ok(o) if o.status.success() => waldump_text(&String::from_utf8_lossy(&o.stdout), secs),
        Ok(o) => format!(
            "WAL records unavailable: pg_waldump: {}\n",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("WAL records unavailable: {e}\n"),
    }
}

/// `pg_waldump --stats=record` output as counts and bytes per second of the window, the
/// largest record types first (those under 0.5 % of the bytes left out).
fn waldump_text(stats: &str, secs: f64) -> String {
    let mut rows: Vec<(String, f64, f64, f64)> = Vec::new();
    let mut total = 0.0;
    for line in stats.lines() {
        // "Heap/INSERT   123 ( 4.56)   7890 ( 1.23)   0 ( 0.00)   7890 ( 1.23)"
        let mut fields = line.split_whitespace();
        let Some(kind) = fields.next() else { continue };
        let nums: Vec<f64> = fields
            .filter(|f| !f.starts_with('(') && !f.ends_with(')'))
            .filter_map(|f| f.parse().ok())
            .collect();
        if nums.len() != 4 {
            continue;
        }
        if kind == "Total" {
            total = nums[3];
            continue;
        }
        rows.push((kind.to_string(), nums[0], nums[1], nums[2]));
    }
    rows.sort_by(|a, b| (b.2 + b.3).total_cmp(&(a.2 + a.3)));
    let mut out = format!(
        "\nWAL by record type (pg_waldump --stats=record over the window; whole cluster):\n\
         {:<28} {:>10} {:>12} {:>12}  share\n",
        "record", "records/s", "bytes/s", "FPI bytes/s"
    );
    for (kind, n, rec, fpi) in rows {
        let share = (rec + fpi) / total.max(1.0);
        if share < 0.005 {
            continue;
        }
        let _ = writeln!(
            out,
            "{kind:<28} {:>10.0} {:>12.0} {:>12.0}  {:>4.1}%",
            n / secs,
            rec / secs,
            fpi / secs,
            share * 100.0
        );
    }
    let _ = writeln!(out, "{:<28} {:>10} {:>12.0}", "all", "", total / secs);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recording_without_stacks_says_so_instead_of_a_breakdown_of_zeros() {
        let dir = std::env::temp_dir().join(format!("comb-fold-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let missing = dir.join("none.perf.data");
        let why = fold_and_draw(&missing, &dir, "cell").expect_err("no stacks to fold");
        assert!(
            why.contains("no stacks") || why.contains("could not run"),
            "{why}"
        );
        assert!(!dir.join("cell.comb.folded").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn categories_share_samples() {
        let folded = "main;axum::serve::handle_connection::x;comb::http::body::parse_json 30\n\
                      main;tokio_postgres::connection::Connection<S,T>::poll;malloc 10\n\
                      main;idle 60\n\
                      garbage line\n";
        let c = categories(folded);
        let get = |n: &str| {
            c.iter()
                .find(|(k, _)| k.trim_start().starts_with(n))
                .unwrap()
                .1
        };
        assert!((get("HTTP connections") - 0.3).abs() < 1e-9);
        assert!((get("request body JSON") - 0.3).abs() < 1e-9);
        assert!((get("PostgreSQL connection I/O") - 0.1).abs() < 1e-9);
        assert!((get("allocator") - 0.1).abs() < 1e-9);
        assert_eq!(get("comb pop"), 0.0);
        assert!(categories("").iter().all(|(_, s)| *s == 0.0));
    }

    #[test]
    fn waldump_stats_become_rates_largest_first() {
        let stats = "\
Type                                           N      (%)          Record size      (%)             FPI size      (%)        Combined size      (%)
----                                           -      ---          -----------      ---             --------      ---        -------------      ---
XLOG/FPI_FOR_HINT                              2 (  0.10)                  100 (  0.01)                 8000 ( 10.00)                 8100 ( 10.00)
Heap/INSERT                                 1000 ( 80.00)                60000 ( 75.00)                    0 (  0.00)                60000 ( 75.00)
Btree/INSERT_LEAF                            200 ( 19.00)                11900 ( 15.00)                    0 (  0.00)                11900 ( 14.90)
Transaction/COMMIT                             1 (  0.01)                    2 (  0.00)                    0 (  0.00)                    2 (  0.00)
                                        --------                      --------                      --------                      --------
Total                                       1203                         72002 [90.00%]                 8000 [10.00%]                80002 [100%]
";
        let text = waldump_text(stats, 2.0);
        let lines: Vec<&str> = text.trim_start().lines().collect();
        assert!(lines[2].starts_with("Heap/INSERT"), "{text}");
        assert!(
            lines[2].contains(" 500 ") && lines[2].contains(" 30000 "),
            "{text}"
        );
        assert!(lines[3].starts_with("Btree/INSERT_LEAF"), "{text}");
        assert!(
            lines[4].starts_with("XLOG/FPI_FOR_HINT") && lines[4].contains(" 4000 "),
            "{text}"
        );
        assert!(
            !text.contains("Transaction/COMMIT"),
            "under 0.5 % is left out: {text}"
        );
        assert!(
            lines[5].starts_with("all") && lines[5].ends_with(" 40001"),
            "{text}"
        );
    }
}
