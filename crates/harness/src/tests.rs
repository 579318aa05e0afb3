use super::*;

fn accepts_connections(port: u16) -> bool {
    TcpStream::connect_timeout(
        &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        Duration::from_secs(1),
    )
    .is_ok()
}

fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    condition()
}

#[test]
fn free_port_is_bindable() {
    let port = free_port();
    assert_ne!(port, 0);
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("port should be free");
}

#[test]
fn finds_server_binaries() {
    let dir = pg_bin_dir().expect("PostgreSQL binaries");
    assert!(dir.join("initdb").is_file(), "{}", dir.display());
    assert!(dir.join("psql").is_file(), "{}", dir.display());
}

#[test]
fn sanitizes_database_prefixes() {
    assert_eq!(sanitize_db_prefix("Queue-Tests 1"), "queue_tests_1");
    assert_eq!(sanitize_db_prefix(""), "test");
    assert_eq!(sanitize_db_prefix(&"x".repeat(100)).len(), 40);
}

#[test]
fn keeps_the_last_lines() {
    assert_eq!(last_lines("a\nb\nc\n", 2), "b\nc");
    assert_eq!(last_lines("a", 5), "a");
    assert_eq!(last_lines("", 5), "");
}

#[test]
fn quotes_for_the_shell() {
    assert_eq!(sh_quote("/tmp/a b"), "'/tmp/a b'");
    assert_eq!(sh_quote("it's"), r"'it'\''s'");
}

#[test]
fn cluster_lifecycle() {
    let pg = Postgres::start().expect("start");
    let port = pg.port();
    assert!(accepts_connections(port));
    assert_eq!(
        pg.url("x"),
        format!("postgres://postgres@127.0.0.1:{port}/x")
    );
    assert_eq!(pg.psql("postgres", "SELECT 1").unwrap(), "1");

    // The test settings are in effect.
    for (name, value) in [
        ("fsync", "off"),
        ("synchronous_commit", "off"),
        ("full_page_writes", "off"),
        ("max_connections", "400"),
        ("shared_buffers", "128MB"),
        ("unix_socket_directories", ""),
        ("listen_addresses", "127.0.0.1"),
    ] {
        assert_eq!(pg.psql("postgres", &format!("SHOW {name}")).unwrap(), value);
    }

    // Databases get unique names and are usable.
    let a = pg.create_database("Life Cycle").unwrap();
    let b = pg.create_database("Life Cycle").unwrap();
    assert_ne!(a, b);
    let prefix = format!("postgres://postgres@127.0.0.1:{port}/");
    let db = a.strip_prefix(&prefix).expect("url of this cluster");
    assert!(db.starts_with("life_cycle_"), "{db}");
    assert!(db.ends_with(&format!("_{}", std::process::id())), "{db}");
    pg.psql(db, "CREATE TABLE t (v int); INSERT INTO t VALUES (7)")
        .unwrap();
    assert_eq!(pg.psql(db, "SELECT v FROM t").unwrap(), "7");

    // SQL errors are reported with psql's message.
    let err = pg.psql(db, "SELECT * FROM missing").unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");

    // A fast stop checkpoints, so committed data survives; the port stays the same.
    pg.stop("fast").unwrap();
    assert!(!accepts_connections(port));
    assert!(pg.psql(db, "SELECT 1").is_err());
    pg.restart().unwrap();
    assert_eq!(pg.port(), port);
    assert_eq!(pg.psql(db, "SELECT v FROM t").unwrap(), "7");

    // An immediate stop is a crash; restart runs recovery.
    pg.stop("immediate").unwrap();
    assert!(!accepts_connections(port));
    pg.restart().unwrap();
    assert_eq!(pg.psql(db, "SELECT v FROM t").unwrap(), "7");

    // Stopping a stopped cluster is an error that carries the log.
    pg.stop("fast").unwrap();
    let err = pg.stop("fast").unwrap_err();
    assert!(err.to_string().contains("PostgreSQL log"), "{err}");
    pg.restart().unwrap();

    // Dropping stops the cluster and removes its files.
    let dir = pg.dir.path().to_path_buf();
    assert!(dir.join("data/PG_VERSION").is_file());
    drop(pg);
    assert!(!dir.exists());
    assert!(!accepts_connections(port));
}

#[test]
fn extra_settings_override_the_defaults() {
    let pg = Postgres::start_with(&[
        ("fsync", "on"),
        ("synchronous_commit", "on"),
        ("cluster_name", "it's comb"),
    ])
    .expect("start");
    assert_eq!(pg.psql("postgres", "SHOW fsync").unwrap(), "on");
    assert_eq!(
        pg.psql("postgres", "SHOW synchronous_commit").unwrap(),
        "on"
    );
    assert_eq!(
        pg.psql("postgres", "SHOW cluster_name").unwrap(),
        "it's comb"
    );
    assert_eq!(pg.psql("postgres", "SHOW max_connections").unwrap(), "400");
}

#[test]
fn bad_settings_fail_with_the_log() {
    let err = match Postgres::start_with(&[("no_such_setting", "1")]) {
        Ok(_) => panic!("an unknown setting should fail the start"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("no_such_setting"), "{err}");
    assert!(err.contains("PostgreSQL log"), "{err}");
}

#[test]
fn shared_cluster_is_shared() {
    let a = Postgres::shared();
    let b = Postgres::shared();
    assert!(std::ptr::eq(a, b));
    assert_eq!(a.psql("postgres", "SELECT 1").unwrap(), "1");
    let url = a.create_database("shared").unwrap();
    assert!(url.starts_with(&a.url("shared_")), "{url}");
}

const WATCHDOG_CHILD_ENV: &str = "COMB_HARNESS_WATCHDOG_CHILD";

/// Run as a separate process by `watchdog_cleans_up_after_exit`; a no-op otherwise.
#[test]
fn watchdog_child() {
    if std::env::var_os(WATCHDOG_CHILD_ENV).is_none() {
        return;
    }
    let pg = Postgres::shared();
    let server = Command::new("sleep")
        .arg("600")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    spawn_server_watchdog(server.id()).unwrap();
    println!(
        "WATCHDOG dir={} port={} sleeper={}",
        pg.dir.path().display(),
        pg.port(),
        server.id()
    );
    // Exit without running any destructor, as a killed test process would.
    std::process::exit(0);
}

#[test]
fn watchdog_cleans_up_after_exit() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "tests::watchdog_child", "--nocapture"])
        .env(WATCHDOG_CHILD_ENV, "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("WATCHDOG "))
        .unwrap_or_else(|| {
            panic!(
                "child printed no report:\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let field = |name: &str| -> String {
        line.split(' ')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .unwrap()
            .to_string()
    };
    let dir = PathBuf::from(field("dir"));
    let port: u16 = field("port").parse().unwrap();
    let sleeper = field("sleeper");

    assert!(
        wait_until(Duration::from_secs(20), || !dir.exists()),
        "{} still exists",
        dir.display()
    );
    assert!(!accepts_connections(port));
    // The sleeper was orphaned, so once killed it may stay a zombie if nothing reaps it;
    // what matters is that it no longer runs.
    let sleeper_alive = || {
        fs::read_to_string(format!("/proc/{sleeper}/stat")).is_ok_and(|stat| {
            let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
            !state.is_some_and(|rest| rest.starts_with('Z') || rest.starts_with('X'))
        })
    };
    assert!(wait_until(Duration::from_secs(10), || !sleeper_alive()));
}

#[test]
fn a_citus_cluster_distributes_over_two_workers() {
    let citus = Citus::start().expect("Citus cluster (scripts/install-citus.sh)");
    let url = citus.create_database("citus").unwrap();
    let db = url.rsplit('/').next().unwrap();
    let c = citus.coordinator();
    assert_eq!(
        c.psql(db, "SELECT count(*) FROM citus_get_active_worker_nodes()")
            .unwrap(),
        "2"
    );
    c.psql(
        db,
        "CREATE TABLE t (k int PRIMARY KEY); SELECT create_distributed_table('t', 'k')",
    )
    .unwrap();
    c.psql(db, "INSERT INTO t SELECT generate_series(1, 100)")
        .unwrap();
    let ports: Vec<String> = citus
        .workers()
        .iter()
        .map(|w| w.port().to_string())
        .collect();
    let holding = c
        .psql(
            db,
            "SELECT string_agg(DISTINCT nodeport::text, ',' ORDER BY nodeport::text) \
             FROM citus_shards WHERE table_name = 't'::regclass",
        )
        .unwrap();
    let mut want = ports.clone();
    want.sort();
    assert_eq!(holding, want.join(","), "both workers hold shards of t");
    assert_eq!(c.psql(db, "SELECT count(*) FROM t").unwrap(), "100");
}
