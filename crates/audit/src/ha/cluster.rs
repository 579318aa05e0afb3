//! A highly available PostgreSQL on loopback: one etcd and three PostgreSQL nodes under
//! Patroni (Debian's packages), small enough for a two-core machine.
//!
//! Every process is started in a process group of its own and killed with its group when the
//! cluster is dropped (also while a panic unwinds), together with each node's postmaster
//! group (Patroni starts PostgreSQL in a session of its own), and the directory is removed.
//! Patroni and PostgreSQL run as `postgres` when the audit runs as root.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The Patroni scope (cluster name) and the database Comb uses.
pub const SCOPE: &str = "comb-ha";
pub const DATABASE: &str = "comb";

/// One PostgreSQL node under Patroni.
#[derive(Debug)]
pub struct Node {
    pub name: String,
    pub pg_port: u16,
    pub rest_port: u16,
    config: PathBuf,
    data: PathBuf,
    log: PathBuf,
    patroni: Option<Child>,
}

impl Node {
    /// The postmaster's pid, from `postmaster.pid`.
    pub fn postmaster(&self) -> Option<u32> {
        std::fs::read_to_string(self.data.join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// A libpq connection string for this node alone.
    pub fn conninfo(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={DATABASE} connect_timeout=2",
            self.pg_port
        )
    }

    /// The last lines of this node's Patroni log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// etcd and three Patroni nodes.
pub struct Cluster {
    dir: PathBuf,
    etcd: Option<Child>,
    pub etcd_port: u16,
    pub nodes: Vec<Node>,
    http: reqwest::Client,
}

fn kill_group(pid: u32) {
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
    unsafe {
        libc_kill(-(pid as i32), 9);
    }
}

fn kill_pid(pid: u32) {
    // SAFETY: as above, for one process.
    unsafe {
        libc_kill(pid as i32, 9);
    }
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// The uid and gid of `postgres` when running as root (PostgreSQL refuses root).
fn run_as() -> Option<(u32, u32)> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return None;
    }
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, "postgres"]).output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    Some((id("-u")?, id("-g")?))
}

fn chown_tree(path: &Path, owner: Option<(u32, u32)>) -> io::Result<()> {
    if let Some((uid, gid)) = owner {
        let status = Command::new("chown")
            .arg("-R")
            .arg(format!("{uid}:{gid}"))
            .arg(path)
            .status()?;
        if !status.success() {
            return Err(io::Error::other("chown failed"));
        }
    }
    Ok(())
}

fn spawn_logged(mut cmd: Command, log: &Path) -> io::Result<Child> {
    use std::os::unix::process::CommandExt;
    let out = std::fs::File::create(log)?;
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0);
    cmd.spawn()
}

async fn wait_for<F: std::future::Future<Output = bool>>(
    what: &str,
    limit: Duration,
    mut ok: impl FnMut() -> F,
) -> io::Result<()> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if ok().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        format!("{what} not within {} s", limit.as_secs()),
    ))
}

impl Cluster {
    /// Starts etcd and three nodes with `synchronous_mode` on, and creates the database
    /// [`DATABASE`]; returns once the primary has a streaming synchronous standby and the
    /// third node replicates too.
    pub async fn start(pg_bin: &Path) -> io::Result<Cluster> {
        let dir = PathBuf::from(format!("/tmp/cha{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let mut cluster = Cluster {
            dir: dir.clone(),
            etcd: None,
            etcd_port: comb_harness::free_port(),
            nodes: Vec::new(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(3))
                .build()
                .map_err(io::Error::other)?,
        };
        let peer = comb_harness::free_port();
        let mut etcd = Command::new("etcd");
        let client_url = format!("http://127.0.0.1:{}", cluster.etcd_port);
        let peer_url = format!("http://127.0.0.1:{peer}");
        etcd.arg("--name")
            .arg("ha")
            .arg("--data-dir")
            .arg(dir.join("etcd"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("ha={peer_url}")])
            .args(["--quota-backend-bytes", "67108864"]);
        cluster.etcd = Some(spawn_logged(etcd, &dir.join("etcd.log"))?);
        let health = format!("{client_url}/health");
        let http = cluster.http.clone();
        wait_for("etcd healthy", Duration::from_secs(30), || async {
            http.get(&health)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await?;
        let owner = run_as();
        for i in 1..=3 {
            let name = format!("node{i}");
            let home = dir.join(&name);
            std::fs::create_dir_all(&home)?;
            let node = Node {
                pg_port: comb_harness::free_port(),
                rest_port: comb_harness::free_port(),
                config: home.join("patroni.yml"),
                data: home.join("data"),
                log: home.join("patroni.log"),
                name,
                patroni: None,
            };
            std::fs::write(
                &node.config,
                config(&node, &home, pg_bin, cluster.etcd_port),
            )?;
            cluster.nodes.push(node);
        }
        chown_tree(&dir, owner)?;
        cluster.start_patroni(0)?;
        wait_for(
            "node1 to bootstrap as primary",
            Duration::from_secs(90),
            || cluster.rest_ok(0, "primary"),
        )
        .await?;
        cluster.start_patroni(1)?;
        cluster.start_patroni(2)?;
        wait_for(
            "both replicas streaming",
            Duration::from_secs(120),
            || async { cluster.replicas_streaming().await == 2 },
        )
        .await?;
        let primary = cluster
            .primary()
            .await
            .ok_or_else(|| io::Error::other("no primary"))?;
        cluster.psql(primary, "postgres", &format!("CREATE DATABASE {DATABASE}"))?;
        cluster
            .wait_synchronous(true, Duration::from_secs(60))
            .await?;
        Ok(cluster)
    }

    /// Starts (or starts again) node `i`'s Patroni.
    pub fn start_patroni(&mut self, i: usize) -> io::Result<()> {
        let node = &self.nodes[i];
        let mut cmd = match run_as() {
            Some(_) => {
                // setpriv execs Patroni itself, so the child's pid is Patroni's.
                let mut c = Command::new("setpriv");
                c.args([
                    "--reuid=postgres",
                    "--regid=postgres",
                    "--init-groups",
                    "--",
                    "patroni",
                ]);
                c
            }
            None => Command::new("patroni"),
        };
        cmd.arg(&node.config)
            .env("HOME", node.config.parent().expect("node dir"))
            .env_remove("PGHOST")
            .env_remove("PGPORT")
            .env_remove("PGDATABASE")
            .env_remove("PGUSER");
        // Appends to the log across restarts.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)?;
        use std::os::unix::process::CommandExt;
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        let child = cmd.spawn()?;
        self.nodes[i].patroni = Some(child);
        Ok(())
    }

    /// `kill -9` of node `i`'s Patroni and postmaster together: what a crashed machine
    /// looks like to the others. Its leader key, if it held it, expires after the TTL.
    pub fn crash(&mut self, i: usize) -> io::Result<()> {
        let postmaster = self.nodes[i].postmaster();
        if let Some(mut p) = self.nodes[i].patroni.take() {
            kill_group(p.id());
            let _ = p.kill();
            let _ = p.wait();
        }
        match postmaster {
            Some(pid) => {
                kill_pid(pid);
                Ok(())
            }
            None => Err(io::Error::other("no postmaster.pid")),
        }
    }

    /// Whether `GET /<check>` of node `i`'s Patroni REST API answers 200.
    pub async fn rest_ok(&self, i: usize, check: &str) -> bool {
        self.http
            .get(format!(
                "http://127.0.0.1:{}/{check}",
                self.nodes[i].rest_port
            ))
            .send()
            .await
            .is_ok_and(|r| r.status().as_u16() == 200)
    }

    /// The node Patroni runs as primary, if any.
    pub async fn primary(&self) -> Option<usize> {
        for i in 0..self.nodes.len() {
            if self.rest_ok(i, "primary").await {
                return Some(i);
            }
        }
        None
    }

    /// The cluster as Patroni describes it (`GET /cluster` of any node that answers).
    pub async fn describe(&self) -> Value {
        for n in &self.nodes {
            if let Ok(r) = self
                .http
                .get(format!("http://127.0.0.1:{}/cluster", n.rest_port))
                .send()
                .await
                && let Ok(v) = r.json::<Value>().await
            {
                return v;
            }
        }
        Value::Null
    }

    /// Replicas streaming from the primary, by its `pg_stat_replication`.
    pub async fn replicas_streaming(&self) -> usize {
        let Some(p) = self.primary().await else {
            return 0;
        };
        self.psql(
            p,
            "postgres",
            "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
        )
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
    }

    /// Runs `sql` with psql on node `i`.
    pub fn psql(&self, i: usize, db: &str, sql: &str) -> io::Result<String> {
        let bin = comb_harness::pg_bin_dir()?;
        let out = Command::new(bin.join("psql"))
            .args(["-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-U", "postgres"])
            .arg("-p")
            .arg(self.nodes[i].pg_port.to_string())
            .args(["-d", db, "-c", sql])
            .env("PGCONNECT_TIMEOUT", "3")
            .stdin(Stdio::null())
            .output()?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(io::Error::other(
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ))
        }
    }

    /// Turns Patroni's `synchronous_mode` on or off and waits until the primary's
    /// `synchronous_standby_names` says so.
    pub async fn set_synchronous(&self, on: bool) -> io::Result<()> {
        let p = self
            .primary()
            .await
            .ok_or_else(|| io::Error::other("no primary"))?;
        let r = self
            .http
            .patch(format!(
                "http://127.0.0.1:{}/config",
                self.nodes[p].rest_port
            ))
            .json(&serde_json::json!({"synchronous_mode": on}))
            .send()
            .await
            .map_err(io::Error::other)?;
        if !r.status().is_success() {
            return Err(io::Error::other(format!("PATCH /config: {}", r.status())));
        }
        self.wait_synchronous(on, Duration::from_secs(60)).await
    }

    async fn wait_synchronous(&self, on: bool, limit: Duration) -> io::Result<()> {
        wait_for("synchronous replication as asked", limit, || async {
            let Some(p) = self.primary().await else {
                return false;
            };
            let sync = self
                .psql(
                    p,
                    "postgres",
                    "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
                )
                .ok()
                .and_then(|s| s.parse::<i64>().ok());
            match sync {
                Some(n) => (n > 0) == on,
                None => false,
            }
        })
        .await
    }

    /// `patronictl switchover` from the current primary to `candidate`.
    pub fn switchover(&self, primary: usize, candidate: usize) -> io::Result<String> {
        let out = Command::new("patronictl")
            .arg("-c")
            .arg(&self.nodes[primary].config)
            .args(["switchover", SCOPE, "--force"])
            .args(["--leader", &self.nodes[primary].name])
            .args(["--candidate", &self.nodes[candidate].name])
            .stdin(Stdio::null())
            .output()?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            Ok(text)
        } else {
            Err(io::Error::other(text))
        }
    }

    /// The multi-host URL Comb is given.
    pub fn database_url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.pg_port))
            .collect();
        format!(
            "postgres://postgres@{}/{DATABASE}?target_session_attrs=read-write",
            hosts.join(",")
        )
    }

    /// Stops and removes everything (also done on drop).
    pub fn shut_down(&mut self) {
        for n in &mut self.nodes {
            let postmaster = n.postmaster();
            if let Some(mut p) = n.patroni.take() {
                kill_group(p.id());
                let _ = p.kill();
                let _ = p.wait();
            }
            if let Some(pid) = postmaster {
                // The postmaster leads its own group (Patroni starts it in a new session):
                // the group takes its children along.
                kill_group(pid);
                kill_pid(pid);
            }
        }
        if let Some(mut e) = self.etcd.take() {
            kill_group(e.id());
            let _ = e.kill();
            let _ = e.wait();
        }
        // Backends notice the postmaster's death on their own; give them a moment, then
        // make sure no process of this cluster is left (found by the data directories in
        // their command lines or as children of a dead postmaster's group).
        std::thread::sleep(Duration::from_millis(300));
        for pid in processes_mentioning(&self.dir) {
            kill_pid(pid);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// Pids whose command line mentions `dir` (this cluster's own directory, unique per run).
fn processes_mentioning(dir: &Path) -> Vec<u32> {
    let needle = dir.to_string_lossy().to_string();
    crate::pg::processes()
        .into_iter()
        .filter(|&pid| pid != std::process::id())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmd| String::from_utf8_lossy(&cmd).contains(&needle))
        })
        .collect()
}

/// Patroni's configuration of one node: loopback only, trust authentication, a 10 s leader
/// TTL and a 1 s loop (failover within seconds), `synchronous_mode` on, small memory.
fn config(node: &Node, home: &Path, pg_bin: &Path, etcd_port: u16) -> String {
    format!(
        r#"scope: {SCOPE}
namespace: /comb-ha/
name: {name}
restapi:
  listen: 127.0.0.1:{rest}
  connect_address: 127.0.0.1:{rest}
etcd3:
  hosts: 127.0.0.1:{etcd_port}
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 4
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    synchronous_mode_strict: false
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
        max_connections: 120
        synchronous_commit: "on"
  initdb:
    - encoding: UTF8
    - locale: C
postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{pg}
  data_dir: {data}
  bin_dir: {bin}
  pgpass: {home}/pgpass
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
  authentication:
    superuser:
      username: postgres
      password: postgres
    replication:
      username: replicator
      password: replicator
  parameters:
    unix_socket_directories: {home}
    shared_buffers: 32MB
    work_mem: 4MB
    maintenance_work_mem: 16MB
    max_wal_size: 256MB
    logging_collector: "off"
tags: {{}}
"#,
        name = node.name,
        rest = node.rest_port,
        pg = node.pg_port,
        data = node.data.display(),
        bin = pg_bin.display(),
        home = home.display(),
    )
}
