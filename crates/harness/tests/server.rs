//! Tests for `Server` against a stand-in for `comb serve`: when this binary is run with
//! `serve --listen ADDR` it behaves like a minimal Comb server, otherwise it runs the tests.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use comb_harness::Server;

/// Selects the stand-in's behaviour: `ok` (default), `slow` (not ready for the first
/// second) or `crash` (prints 50 lines and exits with status 3).
const MODE_ENV: &str = "FAKE_COMB_MODE";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("serve") {
        fake_serve(&args[2..]);
        return;
    }

    // SAFETY: no other threads exist yet.
    unsafe {
        std::env::set_var("COMB_FROM_SHELL", "leaked");
        std::env::set_var("COMB_LOG", "debug");
    }

    let tests: &[(&str, fn())] = &[
        (
            "starts_and_passes_configuration",
            starts_and_passes_configuration,
        ),
        ("waits_until_ready", waits_until_ready),
        (
            "reports_early_exit_with_log_tail",
            reports_early_exit_with_log_tail,
        ),
        ("reports_missing_binary", reports_missing_binary),
        ("kill_stops_the_process", kill_stops_the_process),
        ("terminate_sends_sigterm", terminate_sends_sigterm),
        ("drop_kills_the_process", drop_kills_the_process),
    ];
    let filters: Vec<&String> = args[1..].iter().filter(|a| !a.starts_with('-')).collect();
    let mut failed = 0;
    for (name, test) in tests {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let result = std::panic::catch_unwind(test);
        println!(
            "test {name} ... {}",
            if result.is_ok() { "ok" } else { "FAILED" }
        );
        if result.is_err() {
            failed += 1;
        }
    }
    if failed > 0 {
        eprintln!("{failed} test(s) failed");
        std::process::exit(1);
    }
}

fn fake_serve(args: &[String]) {
    let listen = match args {
        [flag, addr, ..] if flag == "--listen" => addr.clone(),
        _ => panic!("expected --listen ADDR, got {args:?}"),
    };
    let mode = std::env::var(MODE_ENV).unwrap_or_else(|_| "ok".into());
    if mode == "crash" {
        for i in 1..=50 {
            eprintln!("fake comb line {i}");
        }
        std::process::exit(3);
    }
    println!("fake comb listening on {listen}");
    let started = Instant::now();
    let listener = TcpListener::bind(&listen).expect("bind");
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let mut request_line = String::new();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        if reader.read_line(&mut request_line).is_err() {
            continue;
        }
        // Skip the headers.
        let mut line = String::new();
        while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
            line.clear();
        }
        let path = request_line.split_whitespace().nth(1).unwrap_or("");
        let (status, body) = match path {
            "/ready" if mode == "slow" && started.elapsed() < Duration::from_secs(1) => {
                ("503 Service Unavailable", "starting".to_string())
            }
            "/ready" => ("200 OK", "ready".to_string()),
            "/info" => (
                "200 OK",
                format!(
                    "args={}\ndatabase_url={}\nextra={}\nshell={}\nlog={}\nexplicit={}\n",
                    args.join(" "),
                    std::env::var("DATABASE_URL").unwrap_or_default(),
                    std::env::var("FAKE_COMB_EXTRA").unwrap_or_default(),
                    std::env::var("COMB_FROM_SHELL").unwrap_or_default(),
                    std::env::var("COMB_LOG").unwrap_or_default(),
                    std::env::var("COMB_EXPLICIT").unwrap_or_default(),
                ),
            ),
            _ => ("404 Not Found", String::new()),
        };
        let _ = write!(
            stream,
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
}

fn this_binary() -> PathBuf {
    std::env::current_exe().unwrap()
}

fn get(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

fn refuses_connections(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err()
}

fn process_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

fn starts_and_passes_configuration() {
    let server = Server::start_with_env(
        &this_binary(),
        "postgres://postgres@127.0.0.1:1/db",
        &["--flag", "value"],
        &[
            (MODE_ENV, "ok"),
            ("FAKE_COMB_EXTRA", "hello"),
            ("COMB_EXPLICIT", "yes"),
        ],
    )
    .unwrap();
    let addr = server.addr();
    assert_eq!(addr.ip().to_string(), "127.0.0.1");
    assert_eq!(
        server.base_url(),
        format!("http://127.0.0.1:{}", addr.port())
    );
    let info = get(addr, "/info");
    assert!(info.starts_with("HTTP/1.1 200"), "{info}");
    assert!(
        info.contains(&format!("args=--listen {addr} --flag value\n")),
        "{info}"
    );
    assert!(
        info.contains("database_url=postgres://postgres@127.0.0.1:1/db\n"),
        "{info}"
    );
    assert!(info.contains("extra=hello\n"), "{info}");
    // COMB_* settings from the caller's environment are dropped, except the log filter;
    // ones passed explicitly arrive.
    assert!(info.contains("shell=\n"), "{info}");
    assert!(info.contains("log=debug\n"), "{info}");
    assert!(info.contains("explicit=yes\n"), "{info}");
    let log = std::fs::read_to_string(server.log_path()).unwrap();
    assert!(
        log.contains(&format!("fake comb listening on {addr}")),
        "{log}"
    );
    assert!(server.log_tail(1).contains("listening"));
}

fn waits_until_ready() {
    let started = Instant::now();
    let server =
        Server::start_with_env(&this_binary(), "postgres://x", &[], &[(MODE_ENV, "slow")]).unwrap();
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(get(server.addr(), "/ready").starts_with("HTTP/1.1 200"));
}

fn reports_early_exit_with_log_tail() {
    let err =
        match Server::start_with_env(&this_binary(), "postgres://x", &[], &[(MODE_ENV, "crash")]) {
            Ok(_) => panic!("a crashing server should not start"),
            Err(e) => e.to_string(),
        };
    assert!(err.contains("exited during startup"), "{err}");
    assert!(err.contains("fake comb line 50"), "{err}");
    assert!(err.contains("fake comb line 11\n"), "{err}");
    assert!(
        !err.contains("fake comb line 10\n"),
        "only the last 40 lines: {err}"
    );
}

fn reports_missing_binary() {
    let err = match Server::start(
        std::path::Path::new("/nonexistent/comb"),
        "postgres://x",
        &[],
    ) {
        Ok(_) => panic!("a missing binary should not start"),
        Err(e) => e,
    };
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    assert!(err.to_string().contains("/nonexistent/comb"), "{err}");
}

fn kill_stops_the_process() {
    let mut server = Server::start(&this_binary(), "postgres://x", &[]).unwrap();
    let pid = server.pid();
    server.kill();
    assert!(refuses_connections(server.addr()));
    assert!(!process_exists(pid));
    // Killing again, and terminating a dead process, are harmless.
    server.kill();
    let status = server
        .terminate(Duration::from_secs(1))
        .expect("status of the dead process");
    assert_eq!(status.signal(), Some(9));
}

fn terminate_sends_sigterm() {
    let mut server = Server::start(&this_binary(), "postgres://x", &[]).unwrap();
    let status = server
        .terminate(Duration::from_secs(10))
        .expect("exits on SIGTERM");
    assert_eq!(status.signal(), Some(15));
    assert!(refuses_connections(server.addr()));
}

fn drop_kills_the_process() {
    let server = Server::start(&this_binary(), "postgres://x", &[]).unwrap();
    let (pid, addr, log) = (server.pid(), server.addr(), server.log_path().to_path_buf());
    drop(server);
    assert!(!process_exists(pid));
    assert!(refuses_connections(addr));
    assert!(!log.exists());
}
