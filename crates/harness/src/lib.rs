//! Throwaway PostgreSQL clusters and `comb serve` processes for tests, benchmarks and audits.
//!
//! Comb's behaviour only means something against a real PostgreSQL server, so the test suites
//! start real clusters instead of mocking the database. This crate keeps that cheap and
//! predictable:
//!
//! * [`Postgres`] runs `initdb` in a short temporary directory under `/tmp`, starts the
//!   cluster on a free TCP port on 127.0.0.1 with trust authentication (user `postgres`) and
//!   settings tuned for speed, and removes everything again when dropped.
//! * [`Postgres::shared`] gives every test in a process one cluster to create databases in,
//!   which is much faster than one cluster per test.
//! * [`Server`] spawns the `comb` binary against a database and waits until it is ready.
//! * [`Citus`] runs three such clusters with Citus as a coordinator and two workers.
//!
//! Every cluster and server is also guarded by a small watchdog shell loop, so that a test
//! process that is killed (or whose statics are never dropped) does not leave PostgreSQL or
//! Comb processes behind.
//!
//! With `COMB_KEEP_LOGS=<directory>` set, every cluster's `postgres.log` and every server's
//! `comb.log` is copied there when it is stopped (named after its temporary directory), so a
//! failure's database errors can be read after the run removed the directories.
//!
//! PostgreSQL refuses to run as root. When the tests run as root, the cluster's files are
//! handed to the `postgres` user and the server-side tools run through `runuser -u postgres`.

#![warn(missing_docs)]

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The operating-system user that owns clusters when the tests run as root.
const PG_OS_USER: &str = "postgres";

/// How many times a start is retried with a fresh port when the chosen port was taken.
const PORT_ATTEMPTS: usize = 3;

/// How long [`Server::start`] waits for `GET /ready` to answer 200: a loaded machine (CI
/// runs the whole suite on two cores) can take far longer than the usual second to migrate a
/// fresh database and start; the wait ends as soon as the server is ready.
const SERVER_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// How many log lines error messages include.
const LOG_TAIL_LINES: usize = 40;

/// Settings every test cluster gets. Durability is switched off because test data is
/// disposable; `max_connections` is high because many servers with connection pools share
/// one cluster.
const TEST_SETTINGS: &[(&str, &str)] = &[
    ("listen_addresses", "127.0.0.1"),
    ("unix_socket_directories", ""),
    ("fsync", "off"),
    ("synchronous_commit", "off"),
    ("full_page_writes", "off"),
    ("max_connections", "400"),
    ("shared_buffers", "128MB"),
];

/// Environment variables that would make libpq tools connect somewhere other than where
/// they are told to, or change session behaviour behind the test's back.
const PG_ENV_VARS: &[&str] = &[
    "PGHOST",
    "PGHOSTADDR",
    "PGPORT",
    "PGDATABASE",
    "PGUSER",
    "PGPASSWORD",
    "PGPASSFILE",
    "PGSERVICE",
    "PGSERVICEFILE",
    "PGOPTIONS",
    "PGSSLMODE",
    "PGDATA",
    "PGTZ",
    "PGCLIENTENCODING",
];

/// A throwaway PostgreSQL cluster in a temporary directory, listening on TCP
/// `127.0.0.1:<free port>` with trust authentication for user `postgres`.
///
/// It exists so that tests and benchmarks run against a real, isolated PostgreSQL without
/// any setup on the machine beyond installed binaries. Dropping it stops the cluster and
/// deletes its directory.
pub struct Postgres {
    /// Owns the directory; removing it on drop deletes the cluster's files.
    dir: tempfile::TempDir,
    data: PathBuf,
    log: PathBuf,
    port: u16,
    bin: PathBuf,
    as_pg_user: bool,
}

impl Postgres {
    /// Runs `initdb` and starts the cluster with settings meant for tests: `fsync=off`,
    /// `synchronous_commit=off`, `full_page_writes=off`, `max_connections=400`,
    /// `shared_buffers=128MB` and no Unix sockets. Returns once it accepts connections.
    ///
    /// This is the normal way for a test that needs a cluster of its own (for example one
    /// it will stop and restart) to get one.
    pub fn start() -> io::Result<Postgres> {
        Self::start_with(&[])
    }

    /// Like [`Postgres::start`], with extra settings applied after the test defaults, so they
    /// win. Exists for benchmarks that need durable settings such as `fsync=on`.
    pub fn start_with(settings: &[(&str, &str)]) -> io::Result<Postgres> {
        let bin = pg_bin_dir()?;
        let as_pg_user = running_as_root();
        let dir = tempfile::Builder::new()
            .prefix("combpg")
            .tempdir_in("/tmp")?;
        let data = dir.path().join("data");
        let log = data.join("postgres.log");
        if as_pg_user {
            chown_to_pg_user(dir.path())?;
        }

        let mut pg = Postgres {
            dir,
            data,
            log,
            port: 0,
            bin,
            as_pg_user,
        };

        let mut initdb = pg.server_tool("initdb");
        initdb
            .arg("-D")
            .arg(&pg.data)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8"])
            .args(["--no-locale", "--no-sync"]);
        run(initdb, "initdb")?;

        // Our settings live in their own file so the generated postgresql.conf stays intact
        // and the port can be rewritten if a start has to be retried.
        let mut conf = OpenOptions::new()
            .append(true)
            .open(pg.data.join("postgresql.conf"))?;
        writeln!(conf, "\ninclude 'comb-harness.conf'")?;
        drop(conf);

        spawn_cluster_watchdog(&pg)?;

        let mut last_error = None;
        for _ in 0..PORT_ATTEMPTS {
            pg.port = free_port();
            pg.write_settings(settings)?;
            match pg.pg_ctl_start() {
                Ok(()) => return Ok(pg),
                Err(StartError::PortInUse(e)) => last_error = Some(e),
                Err(StartError::Other(e)) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("could not start PostgreSQL")))
    }

    /// One cluster per test process, started on first use.
    ///
    /// Starting a cluster takes a second or two, so tests that only need a fresh database
    /// should call [`Postgres::create_database`] on this one instead of starting their own.
    /// A static is never dropped, so the cluster is stopped and its directory removed by a
    /// detached watchdog process once the test process has exited.
    ///
    /// Panics if the cluster cannot be started.
    pub fn shared() -> &'static Postgres {
        static SHARED: OnceLock<Postgres> = OnceLock::new();
        SHARED.get_or_init(|| match Postgres::start() {
            Ok(pg) => pg,
            Err(e) => panic!("could not start the shared PostgreSQL cluster: {e}"),
        })
    }

    /// The TCP port the cluster listens on (on 127.0.0.1). It stays the same across
    /// [`Postgres::stop`] and [`Postgres::restart`].
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The connection URL for database `db`: `postgres://postgres@127.0.0.1:{port}/{db}`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates a database with a name unique to this process (`prefix`, a counter and the
    /// process id) and returns its URL, so that tests sharing a cluster do not see each
    /// other's data.
    pub fn create_database(&self, prefix: &str) -> io::Result<String> {
        self.create_database_with(prefix, "")
    }

    /// [`Postgres::create_database`] with `options` after the name of `CREATE DATABASE`
    /// (for example a collation: `TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'`).
    pub fn create_database_with(&self, prefix: &str, options: &str) -> io::Result<String> {
        static COUNTER: AtomicU64 = AtomicU64::new(1);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{}_{n}_{}", sanitize_db_prefix(prefix), std::process::id());
        self.psql("postgres", &format!("CREATE DATABASE \"{name}\" {options}"))?;
        Ok(self.url(&name))
    }

    /// Runs `sql` with `psql -v ON_ERROR_STOP=1 -At -c` against database `db` and returns its
    /// standard output without the trailing newline (so `SELECT 1` gives `"1"`).
    ///
    /// Exists for test setup and assertions that are easiest to express in SQL, without
    /// making the test depend on a PostgreSQL client library. If `sql` holds several
    /// statements, only the last one's result is printed. Errors carry psql's message.
    pub fn psql(&self, db: &str, sql: &str) -> io::Result<String> {
        self.psql_as("postgres", db, sql)
    }

    /// [`Postgres::psql`] as role `user` (trust authentication admits any role that exists).
    pub fn psql_as(&self, user: &str, db: &str, sql: &str) -> io::Result<String> {
        let mut cmd = Command::new(self.bin.join("psql"));
        clear_pg_env(&mut cmd);
        cmd.env("PGCONNECT_TIMEOUT", "10")
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-At"])
            .args(["-h", "127.0.0.1", "-U", user])
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-d")
            .arg(db)
            .arg("-c")
            .arg(sql)
            .stdin(Stdio::null());
        let mut out = run(cmd, "psql")?;
        while out.ends_with('\n') || out.ends_with('\r') {
            out.pop();
        }
        Ok(out)
    }

    /// Stops the cluster with `pg_ctl stop -m <mode>` (`smart`, `fast` or `immediate`) and
    /// waits for it to be down. Chaos tests use this to take the database away from a
    /// running server; `immediate` simulates a crash.
    pub fn stop(&self, mode: &str) -> io::Result<()> {
        let mut cmd = self.server_tool("pg_ctl");
        cmd.arg("-D")
            .arg(&self.data)
            .args(["-m", mode, "-w", "-t", "60", "stop"]);
        run(cmd, "pg_ctl stop")
            .map(drop)
            .map_err(|e| self.with_log_tail(e, 0))
    }

    /// Starts a stopped cluster again on the same port and data directory (after a crash
    /// stop this includes crash recovery), returning once it accepts connections.
    pub fn restart(&self) -> io::Result<()> {
        self.pg_ctl_start().map_err(StartError::into_inner)
    }

    /// Writes the settings file read by postgresql.conf: test defaults, port, then `extra`.
    fn write_settings(&self, extra: &[(&str, &str)]) -> io::Result<()> {
        let mut text = String::from("# Written by comb-harness; later lines win.\n");
        let port = self.port.to_string();
        let all = TEST_SETTINGS
            .iter()
            .copied()
            .chain([("port", port.as_str())])
            .chain(extra.iter().copied());
        for (name, value) in all {
            text.push_str(&format!("{name} = '{}'\n", value.replace('\'', "''")));
        }
        let path = self.data.join("comb-harness.conf");
        fs::write(&path, text)?;
        if self.as_pg_user {
            chown_to_pg_user(&path)?;
        }
        Ok(())
    }

    /// `pg_ctl start -w`, telling a taken port apart from other failures.
    fn pg_ctl_start(&self) -> Result<(), StartError> {
        let log_offset = fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0);
        let mut cmd = self.server_tool("pg_ctl");
        cmd.arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(&self.log)
            .args(["-w", "-t", "60", "start"]);
        match run(cmd, "pg_ctl start") {
            Ok(_) => Ok(()),
            Err(e) => {
                let log = read_from(&self.log, log_offset);
                let port_taken = log.contains("Address already in use")
                    || log.contains("could not create any TCP/IP sockets");
                let e = self.with_log_tail(e, log_offset);
                if port_taken {
                    Err(StartError::PortInUse(e))
                } else {
                    Err(StartError::Other(e))
                }
            }
        }
    }

    /// A command for a server-side tool, run as the `postgres` user when we are root.
    fn server_tool(&self, tool: &str) -> Command {
        let program = self.bin.join(tool);
        let mut cmd = if self.as_pg_user {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", PG_OS_USER, "--"]).arg(program);
            cmd
        } else {
            Command::new(program)
        };
        clear_pg_env(&mut cmd);
        // The postgres user may not be able to enter the caller's working directory.
        cmd.current_dir(self.dir.path()).stdin(Stdio::null());
        cmd
    }

    /// Appends the end of the PostgreSQL log (from byte `offset`) to an error.
    fn with_log_tail(&self, e: io::Error, offset: u64) -> io::Error {
        let log = read_from(&self.log, offset);
        io::Error::new(
            e.kind(),
            format!(
                "{e}\n--- PostgreSQL log ({}) ---\n{}",
                self.log.display(),
                last_lines(&log, LOG_TAIL_LINES)
            ),
        )
    }
}

impl Drop for Postgres {
    /// Stops the cluster immediately (errors ignored); the directory is then removed (its log
    /// kept first with `COMB_KEEP_LOGS`).
    fn drop(&mut self) {
        let mut cmd = self.server_tool("pg_ctl");
        cmd.arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let _ = cmd.status();
        keep_log(&self.log, self.dir.path(), "postgres.log");
    }
}

/// The directory `COMB_KEEP_LOGS` names, if set: logs are copied there before their
/// temporary directories are removed.
fn kept_logs_dir() -> Option<PathBuf> {
    std::env::var_os("COMB_KEEP_LOGS")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
}

/// Copies `log` into [`kept_logs_dir`] as `<name of dir>-<suffix>` (best effort).
fn keep_log(log: &Path, dir: &Path, suffix: &str) {
    if let Some(keep) = kept_logs_dir() {
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        let _ = fs::create_dir_all(&keep);
        let _ = fs::copy(log, keep.join(format!("{name}-{suffix}")));
    }
}

enum StartError {
    PortInUse(io::Error),
    Other(io::Error),
}

impl StartError {
    fn into_inner(self) -> io::Error {
        match self {
            StartError::PortInUse(e) | StartError::Other(e) => e,
        }
    }
}

/// Finds the directory holding PostgreSQL's server binaries (`initdb`, `pg_ctl`,
/// `postgres`, `psql`).
///
/// Looks at the `COMB_PG_BIN` environment variable, then `pg_config --bindir`, then the
/// highest-versioned `/usr/lib/postgresql/*/bin` (Debian and Ubuntu keep the server
/// binaries off `PATH`), then `PATH`. A directory only counts if it contains `initdb`:
/// client-only packages install `psql` into the same place.
pub fn pg_bin_dir() -> io::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("COMB_PG_BIN") {
        let dir = PathBuf::from(dir);
        if has_server_binaries(&dir) {
            return Ok(dir);
        }
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("COMB_PG_BIN={} does not contain initdb", dir.display()),
        ));
    }

    if let Ok(out) = Command::new("pg_config")
        .arg("--bindir")
        .stderr(Stdio::null())
        .output()
        && out.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if has_server_binaries(&dir) {
            return Ok(dir);
        }
    }

    if let Ok(entries) = fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<(Vec<u64>, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let version = name
                    .split('.')
                    .map(|part| part.parse::<u64>().ok())
                    .collect::<Option<Vec<_>>>()?;
                let bin = entry.path().join("bin");
                has_server_binaries(&bin).then_some((version, bin))
            })
            .collect();
        versions.sort();
        if let Some((_, bin)) = versions.pop() {
            return Ok(bin);
        }
    }

    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if has_server_binaries(&dir) {
                return Ok(dir);
            }
        }
    }

    Err(io::Error::new(
        io::ErrorKind::NotFound,
        "no PostgreSQL server binaries found (set COMB_PG_BIN, put pg_config on PATH, \
         or run scripts/install-postgres.sh)",
    ))
}

/// A running `comb serve` child process listening on 127.0.0.1.
///
/// Exists so end-to-end tests, benchmarks and audits exercise the real binary over HTTP,
/// exactly as users run it. Dropping it kills the process.
pub struct Server {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
    status: Option<ExitStatus>,
    /// Owns the directory holding the log file.
    _dir: tempfile::TempDir,
}

impl Server {
    /// Spawns `<bin> serve --listen 127.0.0.1:<free port> <extra_args>` with
    /// `DATABASE_URL=<database_url>`, writing its output to a log file, and waits up to
    /// [`SERVER_READY_TIMEOUT`] until `GET /ready` answers 200.
    ///
    /// `COMB_*` variables inherited from the caller's environment are not passed on (except
    /// the log filter `COMB_LOG`), so a developer's shell cannot change test behaviour.
    ///
    /// If the process exits early or never becomes ready, the error contains the last 40
    /// lines of its log. A start that fails because the port was taken meanwhile is retried
    /// with another port.
    pub fn start(bin: &Path, database_url: &str, extra_args: &[&str]) -> io::Result<Server> {
        Self::start_with_env(bin, database_url, extra_args, &[])
    }

    /// Like [`Server::start`], with extra environment variables for the process (for
    /// configuration that is read from the environment, or `RUST_LOG`).
    pub fn start_with_env(
        bin: &Path,
        database_url: &str,
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> io::Result<Server> {
        Self::spawn(bin, database_url, extra_args, env, "/ready")
    }

    /// Starts another server that speaks Queen's HTTP API the way [`Server::start`] starts
    /// Comb (`<bin> serve --listen ADDR`, `DATABASE_URL`), ready once `GET <ready_path>`
    /// answers 200: benchmarks measure it beside Comb.
    pub fn start_program(bin: &Path, database_url: &str, ready_path: &str) -> io::Result<Server> {
        Self::spawn(bin, database_url, &[], &[], ready_path)
    }

    fn spawn(
        bin: &Path,
        database_url: &str,
        extra_args: &[&str],
        env: &[(&str, &str)],
        ready_path: &str,
    ) -> io::Result<Server> {
        let dir = tempfile::Builder::new()
            .prefix("combsrv")
            .tempdir_in("/tmp")?;
        let log = dir.path().join("comb.log");
        let mut last_error = None;
        for _ in 0..PORT_ATTEMPTS {
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
            let log_offset = fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
            let out = OpenOptions::new().create(true).append(true).open(&log)?;
            let err = out.try_clone()?;
            let mut cmd = Command::new(bin);
            // Settings from the caller's shell would make runs differ between machines;
            // tests pass what they need explicitly. COMB_LOG (the log filter) is kept.
            for (name, _) in std::env::vars_os() {
                if name.to_str().is_some_and(|n| {
                    (n.starts_with("COMB_") && n != "COMB_LOG") || n == "QUEEN_ENCRYPTION_KEY"
                }) {
                    cmd.env_remove(name);
                }
            }
            let mut child = cmd
                .arg("serve")
                .arg("--listen")
                .arg(addr.to_string())
                .args(extra_args)
                .env("DATABASE_URL", database_url)
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .map_err(|e| {
                    io::Error::new(e.kind(), format!("could not run {}: {e}", bin.display()))
                })?;
            // Best effort: without the watchdog a killed test run would only leak the process.
            let _ = spawn_server_watchdog(child.id());
            match wait_ready(&mut child, addr, ready_path, SERVER_READY_TIMEOUT) {
                Ok(()) => {
                    return Ok(Server {
                        child,
                        addr,
                        log,
                        status: None,
                        _dir: dir,
                    });
                }
                Err(failure) => {
                    let _ = child.kill();
                    let status = child.wait().ok();
                    let output = read_from(&log, log_offset);
                    let e = io::Error::new(
                        failure.kind(),
                        format!(
                            "{failure}\n--- comb log ({}) ---\n{}",
                            log.display(),
                            last_lines(&output, LOG_TAIL_LINES)
                        ),
                    );
                    let port_taken = status.is_some_and(|s| !s.success())
                        && output.contains("Address already in use");
                    if !port_taken {
                        return Err(e);
                    }
                    last_error = Some(e);
                }
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("could not start comb")))
    }

    /// The server's base URL, `http://127.0.0.1:PORT`, for HTTP clients.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address the server listens on, for raw TCP tests.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The process id, for tests that signal the process themselves.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The file that receives the server's stdout and stderr, so a failing test can point
    /// at it. It is deleted when the `Server` is dropped.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of the server's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        last_lines(&read_from(&self.log, 0), lines)
    }

    /// Kills the process with SIGKILL and waits for it, simulating a crash. Does nothing if
    /// it has already exited.
    pub fn kill(&mut self) {
        if self.status.is_some() {
            return;
        }
        let _ = self.child.kill();
        self.status = self.child.wait().ok();
    }

    /// Sends SIGTERM and waits up to `timeout` for the process to exit, returning its exit
    /// status. Tests of graceful shutdown use this. On timeout the process is killed with
    /// SIGKILL and `None` is returned. If the process had already exited, its status is
    /// returned.
    pub fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Some(status) = self.status {
            return Some(status);
        }
        if let Ok(Some(status)) = self.child.try_wait() {
            self.status = Some(status);
            return Some(status);
        }
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    self.status = Some(status);
                    return Some(status);
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    self.kill();
                    return None;
                }
            }
        }
    }
}

impl Drop for Server {
    /// Kills the process so no server outlives its test (its log kept with `COMB_KEEP_LOGS`).
    fn drop(&mut self) {
        self.kill();
        // A test that fails on a 500 points at the log by request id; the log is about to be
        // deleted, so its tail goes to the test's output.
        if std::thread::panicking() {
            eprintln!(
                "--- comb log ({}), last {LOG_TAIL_LINES} lines ---\n{}",
                self.log.display(),
                self.log_tail(LOG_TAIL_LINES)
            );
        }
        keep_log(&self.log, self._dir.path(), "comb.log");
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago (bind port 0, read it, release it).
///
/// Exists to give each cluster and server its own port so tests can run in parallel. Another
/// process can take the port before it is used; the starters here retry when that happens.
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("binding 127.0.0.1:0")
}

/// Waits until `GET /ready` on `addr` answers 200 while `child` keeps running.
fn wait_ready(
    child: &mut Child,
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> io::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Err(io::Error::other(format!(
                "comb exited during startup ({status})"
            )));
        }
        // The second check makes sure it is our process answering, not one that took the port.
        if probe_ready(addr, path) && child.try_wait()?.is_none() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the server did not answer GET {path} on {addr} with 200 within {timeout:?}"
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends `GET <path>` and reports whether the answer's status is 200.
fn probe_ready(addr: SocketAddr, path: &str) -> bool {
    let attempt = || -> io::Result<bool> {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.set_write_timeout(Some(Duration::from_secs(2)))?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )?;
        let mut head = Vec::new();
        let mut buf = [0u8; 256];
        while !head.windows(2).any(|w| w == b"\r\n") && head.len() < 4096 {
            let n = stream.read(&mut buf)?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        let head = String::from_utf8_lossy(&head);
        let mut status_line = head.lines().next().unwrap_or("").split_whitespace();
        Ok(status_line.next().is_some_and(|v| v.starts_with("HTTP/"))
            && status_line.next() == Some("200"))
    };
    attempt().unwrap_or(false)
}

/// Whether this process runs as root, in which case PostgreSQL must run as another user.
fn running_as_root() -> bool {
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| {
        Command::new("id")
            .arg("-u")
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
            .unwrap_or(false)
    })
}

fn chown_to_pg_user(path: &Path) -> io::Result<()> {
    let mut cmd = Command::new("chown");
    cmd.arg("-R")
        .arg(format!("{PG_OS_USER}:{PG_OS_USER}"))
        .arg(path);
    run(cmd, "chown").map(drop)
}

fn has_server_binaries(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("pg_ctl").is_file()
}

fn clear_pg_env(cmd: &mut Command) {
    for var in PG_ENV_VARS {
        cmd.env_remove(var);
    }
}

/// Runs a command to completion; on failure the error holds its exit status and output.
fn run(mut cmd: Command, what: &str) -> io::Result<String> {
    let out = cmd
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("could not run {what}: {e}")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(io::Error::other(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end(),
            match String::from_utf8_lossy(&out.stdout).trim_end() {
                "" => String::new(),
                stdout => format!("\n{stdout}"),
            }
        )))
    }
}

/// Makes a prefix safe to use unquoted-looking inside a database name.
fn sanitize_db_prefix(prefix: &str) -> String {
    let mut name: String = prefix
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    if name.is_empty() {
        name.push_str("test");
    }
    name
}

/// The contents of a file from byte `offset`, or an empty string if it cannot be read.
fn read_from(path: &Path, offset: u64) -> String {
    let mut bytes = Vec::new();
    if let Ok(mut file) = File::open(path) {
        let _ = file.seek(SeekFrom::Start(offset));
        let _ = file.read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Quotes a string for `sh`.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Starts a detached shell loop that, once this process has exited, stops the cluster and
/// removes its directory (its log copied first with `COMB_KEEP_LOGS`). It gives up on its own when the directory disappears, which is
/// what happens when the `Postgres` is dropped normally.
fn spawn_cluster_watchdog(pg: &Postgres) -> io::Result<()> {
    let data = sh_quote(&pg.data.to_string_lossy());
    let pg_ctl = sh_quote(&pg.bin.join("pg_ctl").to_string_lossy());
    let stop = if pg.as_pg_user {
        format!("runuser -u {PG_OS_USER} -- {pg_ctl}")
    } else {
        pg_ctl
    };
    let keep = match kept_logs_dir() {
        Some(keep) => {
            let name = pg
                .dir
                .path()
                .file_name()
                .unwrap_or_default()
                .to_string_lossy();
            let to = keep.join(format!("{name}-postgres.log"));
            format!(
                "mkdir -p {k} && cp {log} {to}\n",
                k = sh_quote(&keep.to_string_lossy()),
                log = sh_quote(&pg.log.to_string_lossy()),
                to = sh_quote(&to.to_string_lossy()),
            )
        }
        None => String::new(),
    };
    let script = format!(
        "cd / || exit 1\n\
         while kill -0 {pid} 2>/dev/null; do\n\
           [ -d {data} ] || exit 0\n\
           sleep 0.5\n\
         done\n\
         {stop} -D {data} -m immediate -w stop >/dev/null 2>&1\n\
         {keep}\
         rm -rf {dir}\n",
        pid = std::process::id(),
        dir = sh_quote(&pg.dir.path().to_string_lossy()),
    );
    spawn_detached(&script)
}

/// Starts a detached shell loop that kills a server once this process has exited.
fn spawn_server_watchdog(server_pid: u32) -> io::Result<()> {
    let script = format!(
        "cd / || exit 1\n\
         while kill -0 {pid} 2>/dev/null && kill -0 {server_pid} 2>/dev/null; do\n\
           sleep 0.5\n\
         done\n\
         kill -0 {pid} 2>/dev/null || kill -KILL {server_pid} 2>/dev/null\n",
        pid = std::process::id(),
    );
    spawn_detached(&script)
}

/// Runs `sh -c script` in its own process group (so Ctrl-C on the test run does not kill it)
/// with no inherited stdio (so it does not hold the test runner's pipes open).
fn spawn_detached(script: &str) -> io::Result<()> {
    let mut cmd = Command::new("sh");
    clear_pg_env(&mut cmd);
    cmd.arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    // The child is deliberately not waited for; it outlives this process.
    cmd.spawn().map(drop)
}

mod citus;
pub use citus::Citus;

#[cfg(test)]
mod tests;
