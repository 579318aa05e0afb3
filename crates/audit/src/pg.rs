//! Making a PostgreSQL cluster unreachable without stopping it.
//!
//! Stopping PostgreSQL closes its sockets, so clients learn at once that it is gone. A
//! database behind a dead network link or on a frozen machine is worse: connections stay
//! open and nothing answers. On loopback the faithful way to get that is to freeze the
//! processes: SIGSTOP the postmaster (new connections then wait in its listen queue,
//! unanswered) and every backend (queries on open connections wait forever), and SIGCONT
//! them later.

use std::io;
use std::process::{Command, Stdio};

use comb_harness::Postgres;

/// A frozen cluster; [`Frozen::thaw`] (or dropping it) lets it run again.
#[derive(Debug)]
pub struct Frozen {
    /// Postmaster first, then its children.
    pids: Vec<u32>,
    thawed: bool,
}

/// The postmaster's process id, from `postmaster.pid` in the data directory.
pub fn postmaster_pid(pg: &Postgres) -> io::Result<u32> {
    let dir = pg.psql("postgres", "SHOW data_directory")?;
    let text = std::fs::read_to_string(std::path::Path::new(dir.trim()).join("postmaster.pid"))?;
    text.lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .ok_or_else(|| io::Error::other("postmaster.pid has no pid"))
}

/// The ids of every process, read from `/proc`.
pub fn processes() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .collect()
}

/// Process ids whose parent is `parent`, read from `/proc`.
pub fn children(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for pid in processes() {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The command name is in parentheses and may hold spaces; fields follow the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok());
        if ppid == Some(parent) {
            out.push(pid);
        }
    }
    out
}

fn signal(sig: &str, pids: &[u32]) -> io::Result<()> {
    if pids.is_empty() {
        return Ok(());
    }
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .args(pids.iter().map(u32::to_string))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("kill -{sig} failed: {status}")))
    }
}

/// Freezes the cluster: the postmaster first (so it forks no new backends), then every
/// process it had started.
pub fn freeze(pg: &Postgres) -> io::Result<Frozen> {
    let postmaster = postmaster_pid(pg)?;
    signal("STOP", &[postmaster])?;
    let mut pids = vec![postmaster];
    // A backend forked just before the stop may only now appear; look twice.
    for _ in 0..2 {
        let fresh: Vec<u32> = children(postmaster)
            .into_iter()
            .filter(|p| !pids.contains(p))
            .collect();
        signal("STOP", &fresh)?;
        pids.extend(fresh);
    }
    Ok(Frozen {
        pids,
        thawed: false,
    })
}

impl Frozen {
    /// How many processes were frozen (postmaster included).
    pub fn processes(&self) -> usize {
        self.pids.len()
    }

    /// Lets the cluster run again: children first, then the postmaster.
    pub fn thaw(mut self) -> io::Result<()> {
        self.thawed = true;
        let mut order = self.pids.clone();
        order.rotate_left(1);
        signal("CONT", &order)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if !self.thawed {
            let _ = signal("CONT", &self.pids);
        }
    }
}
