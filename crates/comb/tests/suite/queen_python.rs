//! Queen MQ's own Python client, unmodified from PyPI, against a real Comb: the suite in
//! `clients/queen-python` runs with the version Comb's compatibility is defined against
//! (0.15.0) and with the newest one tested (2.6.0), once against an open server and once
//! against a server requiring tokens (with an administrator's token, then the refusals a
//! client without a token or with a reader's gets). `scripts/install-queen-clients.sh`
//! installs the clients under `target/queen-py/` (it does nothing when they are there).

use std::path::PathBuf;
use std::process::Command;

use crate::common::{Env, TOKENS_SECRET, WITH_TOKENS};

const KEY: &str = "7f3c2a1b0e9d8c7b6a5f4e3d2c1b0a99887766554433221100ffeeddccbbaa01";
const VERSIONS: [&str; 2] = ["0.15.0", "2.6.0"];
/// How many tests the whole suite holds (each passes, none is skipped): both client versions
/// carry the streams SDK, so `test_streams.py` runs with each.
const SUITE_TESTS: usize = 62;
/// How many tests `test_refusals.py` holds.
const REFUSAL_TESTS: usize = 2;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn install_clients() {
    let install = Command::new(root().join("scripts/install-queen-clients.sh"))
        .args(VERSIONS)
        .status()
        .expect("run scripts/install-queen-clients.sh");
    assert!(
        install.success(),
        "installing Queen's Python clients failed"
    );
}

/// An HS256 token of the servers started here, for `role`.
fn token(role: &str) -> String {
    let claims = serde_json::json!({"sub": format!("python-{role}"), "role": role,
                                    "exp": 4_102_444_800u64});
    jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(TOKENS_SECRET.as_bytes()),
    )
    .unwrap()
}

/// A server for the suite: counters written every 200 ms (the analytics tests read them),
/// and tokens required when `tokens` is set (already so under [`WITH_TOKENS`]).
async fn server(tokens: bool) -> Env {
    let mut args = vec!["--stats-interval-ms", "200"];
    if tokens && std::env::var_os(WITH_TOKENS).is_none() {
        args.extend(["--jwt-enabled", "--jwt-secret", TOKENS_SECRET]);
    }
    Env::start_with_env(&args, &[("COMB_ENCRYPTION_KEY", KEY)]).await
}

/// Runs pytest (with `args`) with one client version and `env`, asserts that exactly
/// `expected` tests ran and passed (none failed, skipped or deselected), and returns
/// pytest's summary line.
async fn run(
    version: &'static str,
    url: String,
    args: &[&str],
    env: Vec<(&'static str, String)>,
    expected: usize,
) {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let summary = tokio::task::spawn_blocking(move || {
        let root = root();
        let python = root.join(format!("target/queen-py/v{version}/bin/python"));
        let mut command = Command::new(&python);
        command
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .args(&args)
            .current_dir(root.join("clients/queen-python"))
            .env("COMB_URL", &url)
            .env_remove("COMB_TOKEN")
            .env_remove("COMB_READ_TOKEN")
            .env_remove("QUEEN_CLIENT_LOG");
        for (k, v) in &env {
            command.env(k, v);
        }
        let out = command
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", python.display()));
        let stdout = String::from_utf8_lossy(&out.stdout);
        // Exit 0 only: 1 is a failure, 5 means no test ran, anything else an error of pytest.
        assert_eq!(
            out.status.code(),
            Some(0),
            "queen-mq {version}: pytest failed\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
            .lines()
            .rev()
            .find(|l| l.contains(" passed"))
            .unwrap_or_else(|| panic!("queen-mq {version}: no summary\n{stdout}"))
            .to_string()
    })
    .await
    .unwrap();
    let passed: usize = summary
        .split_whitespace()
        .zip(summary.split_whitespace().skip(1))
        .find(|(_, w)| w.trim_end_matches(',') == "passed")
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or(0);
    // Every test ran and passed: none skipped, none deselected.
    assert_eq!(passed, expected, "queen-mq {version}: {summary}");
    for word in ["failed", "skipped", "error", "deselected", "xfail"] {
        assert!(!summary.contains(word), "queen-mq {version}: {summary}");
    }
}

#[tokio::test]
async fn queens_python_client_works_unchanged() {
    install_clients();
    let env = server(false).await;
    let url = format!("http://{}", env.server.addr());
    // Under WITH_TOKENS the server requires a token: the suite carries an administrator's.
    let token: Vec<_> = std::env::var_os(WITH_TOKENS)
        .map(|_| ("COMB_TOKEN", token("admin")))
        .into_iter()
        .collect();
    for version in VERSIONS {
        run(version, url.clone(), &[], token.clone(), SUITE_TESTS).await;
    }
}

#[tokio::test]
async fn with_tokens_required_the_suite_passes_with_an_admins_token_and_is_refused_without() {
    install_clients();
    let env = server(true).await;
    let url = format!("http://{}", env.server.addr());
    for version in VERSIONS {
        run(
            version,
            url.clone(),
            &[],
            vec![("COMB_TOKEN", token("admin"))],
            SUITE_TESTS,
        )
        .await;
        run(
            version,
            url.clone(),
            &["test_refusals.py"],
            vec![
                ("COMB_READ_TOKEN", token("read-only")),
                ("COMB_TOKEN", token("admin")),
            ],
            REFUSAL_TESTS,
        )
        .await;
    }
}
