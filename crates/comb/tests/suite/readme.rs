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

/// The repository's root, two levels above this crate.
fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The pages a reader is sent to: `docs/*.md`, `README.md` and `ARCHITECTURE.md`.
fn pages() -> Vec<(String, String)> {
    let mut names = vec!["README.md".to_string(), "ARCHITECTURE.md".to_string()];
    for entry in std::fs::read_dir(repo().join("docs")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".md") {
            names.push(format!("docs/{name}"));
        }
    }
    names.sort();
    names
        .into_iter()
        .map(|n| {
            let text = std::fs::read_to_string(repo().join(&n)).unwrap();
            (n, text)
        })
        .collect()
}

/// A page longer than this has become a notebook: its history belongs in
/// `bench/results/history/` (or another page), not in what a reader must get through.
const PAGE_LIMIT: usize = 30 * 1024;

#[test]
fn every_page_is_at_most_30_kb() {
    let long: Vec<String> = pages()
        .into_iter()
        .filter(|(_, text)| text.len() > PAGE_LIMIT)
        .map(|(name, text)| format!("{name}: {} bytes", text.len()))
        .collect();
    assert!(long.is_empty(), "pages over {PAGE_LIMIT} bytes: {long:#?}");
}

/// Files the pages name that a command writes rather than the repository holding them.
const WRITTEN_BY_COMMANDS: &[&str] = &["bench/results/subset.json"];

/// Where a path named in a page may be relative to: the root, a crate, the server's sources.
const BASES: &[&str] = &[
    "",
    "crates/comb",
    "crates/comb/src",
    "crates/bench",
    "crates/audit",
    "crates/harness",
];

/// Every file name below `dir`, leaving out build output and version control.
fn file_names(dir: &std::path::Path, out: &mut std::collections::BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        if [".git", "target", ".data", "__pycache__"].contains(&name.as_str()) {
            continue;
        }
        if entry.file_type().unwrap().is_dir() {
            file_names(&entry.path(), out);
        } else {
            out.insert(name);
        }
    }
}

/// The source paths `text` names that are not in the repository: paths with a directory
/// (`crates/comb/src/db/watch.rs`, `tests/suite/acks.rs`, `scripts/pg.sh`, resolved against
/// each of [`BASES`]; a glob by the directory before its `*`) and bare file names in
/// backticks (`layering.rs`, found anywhere in the tree). URL paths (`/api/v1/…`) and
/// placeholders in capitals (`xmin-DATE.md`) are not files.
fn missing_files(text: &str, names: &std::collections::BTreeSet<String>) -> Vec<String> {
    let exts = "rs|sh|sql|json|py|toml|md|html|yml|yaml";
    let path = Regex::new(&format!(
        r"(^|[^A-Za-z0-9_./:*-])((?:[A-Za-z0-9_.*-]+/)+[A-Za-z0-9_.*-]+\.(?:{exts}))\b"
    ))
    .unwrap();
    let bare = Regex::new(r"`([A-Za-z0-9_-]+\.(?:rs|sh|sql|py))`").unwrap();
    let placeholder = Regex::new(r"-[A-Z]{2,}\.").unwrap();
    let exists = |p: &str| {
        let p = match p.find('*') {
            Some(i) => &p[..p[..i].rfind('/').unwrap_or(0)],
            None => p,
        };
        BASES.iter().any(|b| repo().join(b).join(p).exists())
    };
    let mut missing = Vec::new();
    for c in path.captures_iter(text) {
        let p = &c[2];
        if !WRITTEN_BY_COMMANDS.contains(&p) && !placeholder.is_match(p) && !exists(p) {
            missing.push(p.to_string());
        }
    }
    for c in bare.captures_iter(text) {
        if !names.contains(&c[1]) {
            missing.push(c[1].to_string());
        }
    }
    missing
}

#[test]
fn pages_name_only_files_that_exist() {
    let mut names = std::collections::BTreeSet::new();
    file_names(&repo(), &mut names);
    let mut missing = Vec::new();
    for (page, text) in pages() {
        for file in missing_files(&text, &names) {
            missing.push(format!("{page}: {file}"));
        }
    }
    assert!(
        missing.is_empty(),
        "pages name files that are gone: {missing:#?}"
    );
}

#[test]
fn the_file_check_sees_what_it_looks_for() {
    let names = ["layering.rs".to_string()].into();
    let text = "see `crates/comb/src/db.rs`, tests/suite/gone.rs, scripts/nope.sh and `gone.rs`; \
                not GET /api/v1/openapi.json, `schema/migrations/*.sql`, `bench/results/history/xmin-DATE.md`, \
                `layering.rs` or crates/comb/src/db/watch.rs";
    assert_eq!(
        missing_files(text, &names),
        [
            "crates/comb/src/db.rs",
            "tests/suite/gone.rs",
            "scripts/nope.sh",
            "gone.rs"
        ]
    );
}
