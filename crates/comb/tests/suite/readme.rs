//! The README's first session, replayed command by command against a fresh server: what a
//! newcomer types and what they see must stay true. Ids and times are compared by shape.

use std::process::Command;

use crate::common::Env;
use regex::Regex;

/// The commands and expected outputs of the README's `console` block under "A first session".
fn session() -> Vec<(String, String)> {
    let readme = include_str!("../../../../README.md");
    let start = readme
        .find("## A first session")
        .expect("README has a first session");
    let block = &readme[start..];
    let open = block.find("```console\n").expect("console block") + "```console\n".len();
    let close = block[open..].find("```").expect("block end") + open;
    let mut steps: Vec<(String, String)> = Vec::new();
    let mut continued = false;
    for line in block[open..close].lines() {
        if continued {
            let cmd = &mut steps.last_mut().unwrap().0;
            cmd.push('\n');
            cmd.push_str(line);
            continued = line.ends_with('\\');
        } else if let Some(cmd) = line.strip_prefix("$ ") {
            steps.push((cmd.to_string(), String::new()));
            continued = cmd.ends_with('\\');
        } else {
            let out = &mut steps.last_mut().expect("output after a command").1;
            out.push_str(line);
            out.push('\n');
        }
    }
    steps
}

/// Replaces ids and timestamps, which differ on every run, by placeholders.
fn shape(text: &str) -> String {
    let uuid = Regex::new(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").unwrap();
    let time = Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z").unwrap();
    let text = uuid.replace_all(text, "<uuid>");
    time.replace_all(&text, "<time>").trim_end().to_string()
}

#[tokio::test]
async fn the_readme_session_is_what_a_newcomer_sees() {
    let env = Env::start().await;
    let steps = session();
    assert!(steps.len() >= 4, "push, pop, ack and the final pop");
    let dir = tempfile::tempdir().unwrap();
    for (i, (cmd, expected)) in steps.iter().enumerate() {
        let cmd = cmd.replace("http://127.0.0.1:6632", &env.server.base_url());
        let bin_dir = crate::common::comb_bin().parent().unwrap().to_path_buf();
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = Command::new("bash")
            .args(["-o", "pipefail", "-c", &cmd])
            .env("PATH", path)
            .env("COMB_URL", env.server.base_url())
            .current_dir(dir.path())
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "step {i} failed: {cmd}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            shape(&got),
            shape(expected),
            "step {i} of the README session prints something else: {cmd}"
        );
    }
}

#[test]
fn shapes_hide_only_ids_and_times() {
    assert_eq!(
        shape(
            "{\"id\":\"01a203e0-b52f-7303-a242-a56f64da2a40\",\"at\":\"2026-11-22T15:29:47.826Z\",\"n\":1}\n"
        ),
        "{\"id\":\"<uuid>\",\"at\":\"<time>\",\"n\":1}"
    );
}
