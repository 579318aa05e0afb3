//! Queen MQ's own Python client, unmodified from PyPI, against a real Comb: the suite in
//! `clients/queen-python` runs with the version Comb's compatibility is defined against
//! (0.15.0) and with the newest one tested (2.6.0). `scripts/install-queen-clients.sh`
//! installs them under `target/queen-py/` (it does nothing when they are there).

use std::path::PathBuf;
use std::process::Command;

use crate::common::Env;

const KEY: &str = "7f3c2a1b0e9d8c7b6a5f4e3d2c1b0a99887766554433221100ffeeddccbbaa01";
const VERSIONS: [&str; 2] = ["0.15.0", "2.6.0"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs the suite with one client version and returns pytest's summary line.
fn run_suite(version: &str, url: &str) -> String {
    let root = root();
    let python = root.join(format!("target/queen-py/v{version}/bin/python"));
    let out = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .current_dir(root.join("clients/queen-python"))
        .env("COMB_URL", url)
        .env_remove("QUEEN_CLIENT_LOG")
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
}

#[tokio::test]
async fn queens_python_client_works_unchanged() {
    let install = Command::new(root().join("scripts/install-queen-clients.sh"))
        .args(VERSIONS)
        .status()
        .expect("run scripts/install-queen-clients.sh");
    assert!(
        install.success(),
        "installing Queen's Python clients failed"
    );
    let env = Env::start_with_env(&[], &[("COMB_ENCRYPTION_KEY", KEY)]).await;
    let url = format!("http://{}", env.server.addr());
    for version in VERSIONS {
        let url = url.clone();
        let summary = tokio::task::spawn_blocking(move || run_suite(version, &url))
            .await
            .unwrap();
        let passed: usize = summary
            .split_whitespace()
            .zip(summary.split_whitespace().skip(1))
            .find(|(_, w)| w.trim_end_matches(',') == "passed")
            .and_then(|(n, _)| n.parse().ok())
            .unwrap_or(0);
        // Every test ran and passed: none skipped, none deselected.
        assert!(passed >= 31, "queen-mq {version}: {summary}");
        for word in ["failed", "skipped", "error", "deselected", "xfail"] {
            assert!(!summary.contains(word), "queen-mq {version}: {summary}");
        }
    }
}
