//! CPU and memory accounting from `/proc`.
//!
//! The suite reports what each party costs (broker, PostgreSQL, the load generator itself)
//! from the kernel's own counters rather than from sampling, so that the figures are exact
//! over a cell's window and cost nothing to collect while the load runs.

use std::fs;
use std::io;
use std::process::Command;
use std::sync::OnceLock;

/// The fields of `/proc/<pid>/stat` the suite needs. Times are in clock ticks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    /// Command name (without the parentheses).
    pub comm: String,
    /// Parent process id, used to find a PostgreSQL postmaster's children.
    pub ppid: u32,
    /// User-mode CPU time of the process.
    pub utime: u64,
    /// Kernel-mode CPU time of the process.
    pub stime: u64,
    /// User-mode CPU time of children that exited and were waited for.
    pub cutime: u64,
    /// Kernel-mode CPU time of children that exited and were waited for.
    pub cstime: u64,
}

impl ProcStat {
    /// CPU time of the process itself (all its threads).
    pub fn own(&self) -> u64 {
        self.utime + self.stime
    }

    /// CPU time of the process plus its reaped children. PostgreSQL backends that exit are
    /// reaped by the postmaster, so this keeps their CPU in the total.
    pub fn with_children(&self) -> u64 {
        self.own() + self.cutime + self.cstime
    }
}

/// Parses the text of `/proc/<pid>/stat`.
///
/// The command name sits in parentheses and may itself contain spaces or parentheses, so
/// the fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    // Field 3 (state) is the first after the name; fields are numbered from 1.
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    let field = |n: usize| -> Option<u64> { rest.get(n - 3)?.parse().ok() };
    Some(ProcStat {
        comm,
        ppid: field(4)? as u32,
        utime: field(14)?,
        stime: field(15)?,
        cutime: field(16)?,
        cstime: field(17)?,
    })
}

/// Reads `/proc/<pid>/stat`.
pub fn read_stat(pid: u32) -> io::Result<ProcStat> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&text).ok_or_else(|| io::Error::other(format!("unparsable /proc/{pid}/stat")))
}

/// CPU time of this process (the load generator), in ticks.
pub fn self_cpu() -> u64 {
    read_stat(std::process::id()).map(|s| s.own()).unwrap_or(0)
}

/// Parses the peak resident set size (`VmHWM`) from `/proc/<pid>/status`, in kB.
pub fn parse_peak_rss_kb(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Peak resident set size of a process, in MiB.
pub fn peak_rss_mb(pid: u32) -> Option<f64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_peak_rss_kb(&status).map(|kb| kb as f64 / 1024.0)
}

/// CPU time of a process tree rooted at `root` (one level of children, which is the shape
/// of a PostgreSQL cluster: the postmaster and its backends and workers), in ticks.
pub fn tree_cpu(root: u32) -> u64 {
    let Ok(root_stat) = read_stat(root) else {
        return 0;
    };
    let mut total = root_stat.with_children();
    if let Ok(entries) = fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if let Ok(stat) = read_stat(pid)
                && stat.ppid == root
            {
                total += stat.own();
            }
        }
    }
    total
}

/// Whole-machine CPU counters from the first line of `/proc/stat`, in ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SysCpu {
    /// Every tick of every CPU.
    pub total: u64,
    /// Ticks spent idle or waiting for I/O.
    pub idle: u64,
    /// Ticks the hypervisor gave to someone else: on a shared machine this is the noise.
    pub steal: u64,
}

/// Parses the aggregate `cpu` line of `/proc/stat`.
pub fn parse_sys_cpu(text: &str) -> Option<SysCpu> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice]; guest time is
    // already counted in user time.
    let total = v.iter().take(8).sum();
    Some(SysCpu {
        total,
        idle: v.get(3)? + v.get(4).copied().unwrap_or(0),
        steal: v.get(7).copied().unwrap_or(0),
    })
}

/// Reads the machine's CPU counters.
pub fn sys_cpu() -> SysCpu {
    fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|t| parse_sys_cpu(&t))
        .unwrap_or_default()
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on every Linux we know of).
pub fn ticks_per_sec() -> u64 {
    static TCK: OnceLock<u64> = OnceLock::new();
    *TCK.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100)
    })
}

/// Converts ticks to seconds.
pub fn ticks_to_secs(ticks: u64) -> f64 {
    ticks as f64 / ticks_per_sec() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_awkward_command_names() {
        let text = "4242 (comb (serve) x) S 17 4242 4242 0 -1 4194560 1200 0 0 0 \
                    250 75 3 4 20 0 6 0 12345 1000000 500 18446744073709551615";
        let s = parse_stat(text).unwrap();
        assert_eq!(s.comm, "comb (serve) x");
        assert_eq!(s.ppid, 17);
        assert_eq!((s.utime, s.stime, s.cutime, s.cstime), (250, 75, 3, 4));
        assert_eq!(s.own(), 325);
        assert_eq!(s.with_children(), 332);
    }

    #[test]
    fn rejects_truncated_stat() {
        assert!(parse_stat("12 (x) S 1 2 3").is_none());
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn reads_own_stat() {
        let s = read_stat(std::process::id()).unwrap();
        assert!(!s.comm.is_empty());
        assert!(ticks_per_sec() > 0);
    }

    #[test]
    fn parses_peak_rss() {
        let status = "Name:\tcomb\nVmPeak:\t  900000 kB\nVmHWM:\t   40960 kB\nVmRSS:\t 30000 kB\n";
        assert_eq!(parse_peak_rss_kb(status), Some(40960));
        assert_eq!(parse_peak_rss_kb("Name:\tx\n"), None);
        assert!(peak_rss_mb(std::process::id()).unwrap() > 0.0);
    }

    #[test]
    fn parses_machine_cpu() {
        let text = "cpu  100 5 50 800 20 1 2 7 0 0\ncpu0 50 2 25 400 10 0 1 3 0 0\n";
        let c = parse_sys_cpu(text).unwrap();
        assert_eq!(c.total, 100 + 5 + 50 + 800 + 20 + 1 + 2 + 7);
        assert_eq!(c.idle, 820);
        assert_eq!(c.steal, 7);
        assert!(parse_sys_cpu("intr 1 2 3").is_none());
    }
}
