//! The code's own rules, checked: which module may import which, and where SQL may live.
//!
//! Modules sit in layers (see `ARCHITECTURE.md`, "Rules of the code"). A module may use
//! modules of lower layers and of its own layer, never of a higher one, and no two modules may
//! use each other, directly or around a loop — nor may two files of one module. HTTP handlers
//! hold no SQL: statements live with the module that owns their tables. A module missing from
//! [`LAYERS`] fails the test, so every new module is placed on purpose.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "the command-line client, a client of the HTTP API only",
        &["cli"],
    ),
    (
        "foundation: configuration, database access, counters, names and options, schema",
        &[
            "config",
            "cursor",
            "db",
            "encryption",
            "metrics",
            "queue",
            "refusal",
            "replication",
            "schema",
            "fusion",
            "auth",
        ],
    ),
    ("notification between servers", &["wake"]),
    (
        "the catalog of names and what is pending",
        &["catalog", "backlog"],
    ),
    (
        "use cases",
        &[
            "ack",
            "admin",
            "dead_letter",
            "lease",
            "pop",
            "push",
            "transaction",
            "streams",
            "maintenance",
        ],
    ),
    (
        "the edge and the wiring",
        &["http", "dashboard", "server", "layering"],
    ),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file below `dir`.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The top-level module a file of `src/` belongs to (`None` for `lib.rs` and `main.rs`).
fn module_of(file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src()).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    let name = first.trim_end_matches(".rs").to_string();
    (name != "lib" && name != "main").then_some(name)
}

/// Source text without comments, so prose that names a module does not count as a use.
fn code_of(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The names that follow `prefix` (such as `crate::` or `super::`) in `code`, including
/// those inside `use prefix{a, b::c}` groups.
fn uses_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().last();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name = ident(part.trim());
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, m)| m.contains(&module))
}

/// A cycle in `graph`, if there is one, as the path around it.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == node) {
            let mut found = path[i..].to_vec();
            found.push(node.to_string());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(c) = visit(node, graph, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

/// Which top-level module uses which, from every file's `crate::` paths.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files(&src()) {
        let Some(module) = module_of(&file) else {
            continue;
        };
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        let entry = graph.entry(module.clone()).or_default();
        for used in uses_after(&code, "crate::") {
            if used != module && layer_of(&used).is_some() {
                entry.insert(used);
            }
        }
    }
    graph
}

#[test]
fn every_module_has_a_layer() {
    let unplaced: Vec<String> = module_graph()
        .into_keys()
        .filter(|m| layer_of(m).is_none())
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules in no layer of layering.rs: {unplaced:?}"
    );
}

#[test]
fn modules_use_only_their_own_layer_and_those_below() {
    let mut upward = Vec::new();
    for (module, used) in module_graph() {
        let Some(own) = layer_of(&module) else {
            continue;
        };
        for u in used {
            let theirs = layer_of(&u).unwrap();
            if theirs > own {
                upward.push(format!(
                    "{module} ({}) uses {u} ({})",
                    LAYERS[own].0, LAYERS[theirs].0
                ));
            }
        }
    }
    assert!(upward.is_empty(), "imports upward: {upward:#?}");
}

#[test]
fn no_two_modules_use_each_other() {
    let graph = module_graph();
    assert_eq!(cycle(&graph), None, "a cycle between modules");
}

#[test]
fn no_two_files_of_a_module_use_each_other() {
    let mut dirs = BTreeSet::new();
    for file in files(&src()) {
        dirs.insert(file.parent().unwrap().to_path_buf());
    }
    for dir in dirs {
        let siblings: BTreeSet<String> = files(&dir)
            .iter()
            .filter(|f| f.parent() == Some(&dir))
            .filter_map(|f| f.file_stem()?.to_str().map(str::to_string))
            .filter(|s| s != "mod" && s != "lib" && s != "main")
            .collect();
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for name in &siblings {
            let code = code_of(&std::fs::read_to_string(dir.join(format!("{name}.rs"))).unwrap());
            let used = uses_after(&code, "super::")
                .into_iter()
                .filter(|u| u != name && siblings.contains(u))
                .collect();
            graph.insert(name.clone(), used);
        }
        assert_eq!(cycle(&graph), None, "a cycle between files of {dir:?}");
    }
}

#[test]
fn handlers_hold_no_sql() {
    let words = [
        "SELECT ",
        "INSERT INTO",
        "UPDATE comb",
        "DELETE FROM",
        ".query(",
        ".query_one(",
        ".query_opt(",
        ".execute(",
        ".batch_execute(",
        ".prepare",
    ];
    let mut found = Vec::new();
    for file in files(&src().join("http")) {
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        for w in words {
            // A statement call takes its SQL: `uri().query()` is not one.
            let called = code
                .match_indices(w)
                .any(|(i, _)| !w.ends_with('(') || !code[i + w.len()..].starts_with(')'));
            if called {
                found.push(format!("{}: {w}", file.display()));
            }
        }
    }
    assert!(found.is_empty(), "SQL in handlers: {found:#?}");
}

#[test]
fn the_checks_see_what_they_look_for() {
    let code = code_of(
        "use crate::{db::DbError, queue};\nuse crate::push::Pusher; // crate::http\nfoo::crate::x",
    );
    assert_eq!(
        uses_after(&code, "crate::"),
        ["db", "push", "queue"].map(String::from).into()
    );
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    assert!(cycle(&g).is_some());
    g.get_mut("b").unwrap().clear();
    assert_eq!(cycle(&g), None);
}
