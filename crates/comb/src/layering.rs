//! The code's own rules, checked: which module may import which, where SQL may live, and
//! which module owns each table.
//!
//! Modules sit in layers (see `ARCHITECTURE.md`, "Rules of the code"). A module may use
//! modules of lower layers and of its own layer, never of a higher one, and no two modules may
//! use each other, directly or around a loop — nor may two files of one module. The edge and
//! the client hold no SQL. SQL that names a table of schema `comb` lives in the table's owner
//! ([`OWNERS`]), or in `schema` ([`SCHEMA`]), which makes every table and function and may
//! therefore name any (its migrations create them; `schema::citus` distributes them). A module missing from [`LAYERS`] fails the test, so every new module is
//! placed on purpose.
//!
//! Every file is read by a Rust parser (`syn`), so comments of every kind say nothing, `use`
//! trees are read to their last nested group, and a path counts in any form (`crate::`,
//! `super::`, `self::`, or a child module by its name), in code and in macro arguments alike.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// The layers, lowest first.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "foundation: configuration, database access, counters, names and options, schema, message storage",
        &[
            "backend",
            "code",
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
            "messages",
        ],
    ),
    ("notification between servers", &["wake"]),
    ("the catalog of names", &["catalog"]),
    (
        "use cases",
        &[
            "ack",
            "admin",
            "backlog",
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

/// Modules that hold no SQL at all: the edge decodes, calls a use case and encodes. (The
/// command-line client is its own crate, `crates/cli`, and speaks HTTP only.)
const NO_SQL: &[&str] = &["http", "dashboard", "server"];

/// The module that owns the schema itself: its migrations create every table, view and
/// function, and `schema::citus` distributes the tables and makes the functions Citus needs,
/// so its SQL may name any of them. It reads and writes no one's rows on the data path.
const SCHEMA: &str = "schema";

/// Every table, view and function of schema `comb` and the one module that owns it: the only
/// module whose SQL names it. Others call the owner. `ARCHITECTURE.md` ("Tables") has the same
/// list with who calls each owner.
const OWNERS: &[(&str, &str)] = &[
    ("queues", "catalog"),
    ("partitions", "catalog"),
    ("partition_ids", "catalog"),
    ("create_partition", "catalog"),
    ("subscriptions", "catalog"),
    ("messages", "messages"),
    ("lock_partitions", "catalog"),
    ("partition_head", "messages"),
    ("segments", "messages"),
    ("segment_partitions", "messages"),
    ("maintenance_runs", "maintenance"),
    ("cursors", "cursor"),
    ("cursor_states", "cursor"),
    ("cursor_gens", "cursor"),
    ("cursors_now", "cursor"),
    ("cursor_state", "cursor"),
    ("lock_cursors", "cursor"),
    ("cursor_lag", "cursor"),
    ("claimable_now", "pop"),
    ("claim_partition", "pop"),
    ("lock_expired", "lease"),
    ("extend_lease", "lease"),
    ("judge_acks", "ack"),
    ("complete_acks", "ack"),
    ("hand_off", "push"),
    ("store_batch", "push"),
    ("refuse_sealed_payload", "pop"),
    ("stream_queries", "streams"),
    ("stream_partitions", "streams"),
    ("stream_states", "streams"),
    ("stream_state_keys", "streams"),
    ("stream_state_now", "streams"),
    ("retention_secs", "queue"),
    ("completed_retention_secs", "queue"),
    ("dead_letters", "dead_letter"),
    ("dead_letter_requeues", "dead_letter"),
    ("queue_figures", "backlog"),
    ("group_figures", "backlog"),
    ("latest_snapshot", "backlog"),
    ("queue_live", "admin"),
    ("group_live", "admin"),
    ("partition_stats", "admin"),
    ("lagging_cursors", "admin"),
    ("payload_json", "admin"),
    ("iso", "admin"),
    ("traces", "admin"),
    ("server_minutes", "admin"),
    ("queue_counts", "admin"),
    ("queue_minutes", "admin"),
    ("group_minutes", "admin"),
    ("system_modes", "admin"),
    ("migrations", "schema"),
    ("servers", "schema"),
    ("schema_settings", "schema"),
];

/// Tables whose statements still sit in modules other than their owner: the ownership rule
/// is not enforced for them yet. The test prints each with the files that still name it, and
/// fails once one of them is clean, so that it leaves this list.
const PENDING_OWNERSHIP: &[&str] = &[];

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

/// The module path of a file of `src/`: `ack/store.rs` is `["ack", "store"]`, `ack/mod.rs`
/// is `["ack"]`, `lib.rs` and `main.rs` are the crate root `[]`.
fn module_path(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_str().unwrap().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// What one file says, as the parser reads it: the paths it names, its string literals and
/// the methods it calls with arguments.
#[derive(Default)]
struct Source {
    paths: Vec<Vec<String>>,
    strings: Vec<String>,
    calls: Vec<String>,
}

impl Source {
    fn parse(text: &str) -> Source {
        let file = syn::parse_file(text).expect("a Rust source file");
        let mut out = Source::default();
        out.visit_file(&file);
        out
    }

    /// Paths and string literals inside a macro's tokens, which the parser leaves unread.
    fn tokens(&mut self, tokens: TokenStream) {
        let mut path: Vec<String> = Vec::new();
        let mut colons = 0;
        let flush = |path: &mut Vec<String>, paths: &mut Vec<Vec<String>>| {
            if path.len() > 1 {
                paths.push(std::mem::take(path));
            }
            path.clear();
        };
        for tree in tokens {
            match tree {
                TokenTree::Ident(i) => {
                    if colons != 2 {
                        flush(&mut path, &mut self.paths);
                    }
                    path.push(i.to_string());
                    colons = 0;
                }
                TokenTree::Punct(p) if p.as_char() == ':' && !path.is_empty() => colons += 1,
                TokenTree::Group(g) => {
                    flush(&mut path, &mut self.paths);
                    colons = 0;
                    self.tokens(g.stream());
                }
                TokenTree::Literal(l) => {
                    flush(&mut path, &mut self.paths);
                    colons = 0;
                    if let Ok(s) = syn::parse_str::<syn::LitStr>(&l.to_string()) {
                        self.strings.push(s.value());
                    }
                }
                TokenTree::Punct(_) => {
                    flush(&mut path, &mut self.paths);
                    colons = 0;
                }
            }
        }
        flush(&mut path, &mut self.paths);
    }
}

/// Every full path a `use` tree names, its nested groups expanded.
fn use_paths(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut full = prefix.clone();
            if n.ident != "self" {
                full.push(n.ident.to_string());
            }
            out.push(full);
        }
        syn::UseTree::Rename(r) => {
            let mut full = prefix.clone();
            if r.ident != "self" {
                full.push(r.ident.to_string());
            }
            out.push(full);
        }
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_paths(t, prefix, out);
            }
        }
    }
}

impl<'ast> Visit<'ast> for Source {
    /// Attributes (doc comments among them) are prose and configuration, not uses or SQL.
    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        use_paths(&u.tree, &mut Vec::new(), &mut self.paths);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        self.paths
            .push(p.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        syn::visit::visit_macro(self, m);
        self.tokens(m.tokens.clone());
    }

    fn visit_lit_str(&mut self, s: &'ast syn::LitStr) {
        self.strings.push(s.value());
    }

    fn visit_expr_method_call(&mut self, c: &'ast syn::ExprMethodCall) {
        if !c.args.is_empty() {
            self.calls.push(c.method.to_string());
        }
        syn::visit::visit_expr_method_call(self, c);
    }
}

/// The module path `path` names when written in module `here`, if it names one of
/// `modules` (or an item inside one): `crate::` from the root, `super::` from the parent,
/// `self::` and a child module's bare name from `here`. The longest module path it starts
/// with; `None` for paths outside the crate.
fn resolve(
    path: &[String],
    here: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let mut base: Vec<String> = here.to_vec();
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &path[1..];
        }
        Some("super") => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        Some("self") => rest = &path[1..],
        _ => {}
    }
    let mut found = None;
    let mut full = base.clone();
    for seg in rest {
        full.push(seg.clone());
        if modules.contains(&full) {
            found = Some(full.clone());
        } else {
            break;
        }
    }
    found
}

/// The modules of `src/` by their paths, and each file's path and text.
fn sources() -> Vec<(PathBuf, Vec<String>, String)> {
    files(&src())
        .into_iter()
        .map(|f| {
            let m = module_path(&f);
            let text = std::fs::read_to_string(&f).unwrap();
            (f, m, text)
        })
        .collect()
}

fn module_set(sources: &[(PathBuf, Vec<String>, String)]) -> BTreeSet<Vec<String>> {
    sources.iter().map(|(_, m, _)| m.clone()).collect()
}

/// The modules a file in module `here` uses (full module paths), from its source text.
fn uses(text: &str, here: &[String], modules: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    Source::parse(text)
        .paths
        .iter()
        .filter_map(|p| resolve(p, here, modules))
        .collect()
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

/// Which top-level module uses which.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let sources = sources();
    let modules = module_set(&sources);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, here, text) in &sources {
        let Some(module) = here.first() else {
            continue;
        };
        let entry = graph.entry(module.clone()).or_default();
        for used in uses(text, here, &modules) {
            if let Some(top) = used.first()
                && top != module
            {
                entry.insert(top.clone());
            }
        }
    }
    graph
}

/// Which files of one module (children of the same parent) use which, by name.
fn sibling_graphs() -> BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> {
    let sources = sources();
    let modules = module_set(&sources);
    let mut graphs: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (file, here, text) in &sources {
        let is_parent = file
            .file_stem()
            .is_some_and(|s| s == "mod" || s == "lib" || s == "main");
        if is_parent || here.is_empty() {
            continue;
        }
        let parent = here[..here.len() - 1].to_vec();
        let name = here.last().unwrap().clone();
        let used: BTreeSet<String> = uses(text, here, &modules)
            .into_iter()
            .filter(|u| u.len() > parent.len() && u[..parent.len()] == parent[..])
            .map(|u| u[parent.len()].clone())
            .filter(|u| *u != name)
            .collect();
        graphs.entry(parent).or_default().insert(name, used);
    }
    graphs
}

/// Whether a string literal is a SQL statement (or a piece of one).
fn is_sql(s: &str) -> bool {
    const WORDS: &[&str] = &[
        "SELECT", "INSERT", "UPDATE", "DELETE", "FROM", "JOIN", "CREATE", "ALTER", "DROP", "LOCK",
        "ANALYZE", "COPY", "TRUNCATE", "BEGIN", "COMMIT", "ROLLBACK", "LISTEN", "NOTIFY",
    ];
    s.split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .any(|w| WORDS.contains(&w))
}

/// The names of schema `comb` a SQL text names (`comb.messages` gives `messages`).
fn names_in(sql: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = sql;
    while let Some(i) = rest.find("comb.") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "comb.".len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        // `comb.messages_{seg}`, `comb.messages_2`: a leaf table, owned with its parent.
        let name = match name.rfind('_') {
            Some(i) if name[i + 1..].chars().all(|c| c.is_ascii_digit()) => &name[..i],
            _ => &name,
        };
        if !name.is_empty() {
            out.insert(name.to_string());
        }
    }
    out
}

/// Statement calls on a database client; each takes its SQL.
const STATEMENT_CALLS: &[&str] = &[
    "query",
    "query_one",
    "query_opt",
    "query_raw",
    "execute",
    "execute_raw",
    "batch_execute",
    "prepare",
    "prepare_cached",
    "prepare_typed",
    "copy_in",
    "simple_query",
];

/// Where a file of module `module` holds SQL it may not: statements or statement calls in a
/// module of [`NO_SQL`].
fn sql_out_of_place(module: &str, text: &str) -> Vec<String> {
    if !NO_SQL.contains(&module) {
        return Vec::new();
    }
    let source = Source::parse(text);
    let mut found: Vec<String> = source
        .strings
        .iter()
        .filter(|s| is_sql(s))
        .map(|s| format!("statement {:?}", s.trim()))
        .collect();
    found.extend(
        source
            .calls
            .iter()
            .filter(|c| STATEMENT_CALLS.contains(&c.as_str()))
            .map(|c| format!("call .{c}(…)")),
    );
    found
}

/// The names of schema `comb` that SQL in a file of `module` names although another module
/// owns them (or nobody does), as `name (owner)`. A name of [`OWNERS`] counts in every string
/// literal, statement or not: a fragment such as `"comb.cursor_state(c.partition_id,
/// c.consumer_group)"` holds no keyword and is SQL all the same. A name nobody owns counts in
/// statements only (`comb.css` is a file).
fn foreign_names(module: &str, text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    if module == SCHEMA {
        return out;
    }
    for s in &Source::parse(text).strings {
        for name in names_in(s) {
            match OWNERS.iter().find(|(n, _)| *n == name) {
                Some((_, owner)) if *owner == module => {}
                Some((_, owner)) => {
                    out.insert(format!("{name} ({owner})"));
                }
                None if is_sql(s) => {
                    out.insert(format!("{name} (no owner in OWNERS)"));
                }
                None => {}
            }
        }
    }
    out
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
    for (parent, graph) in sibling_graphs() {
        assert_eq!(cycle(&graph), None, "a cycle between files of {parent:?}");
    }
}

#[test]
fn the_edge_and_the_client_hold_no_sql() {
    let mut found = Vec::new();
    for (file, here, text) in sources() {
        let Some(module) = here.first() else {
            continue;
        };
        for f in sql_out_of_place(module, &text) {
            found.push(format!("{}: {f}", file.display()));
        }
    }
    assert!(found.is_empty(), "SQL outside the use cases: {found:#?}");
}

#[test]
fn sql_naming_a_table_lives_in_its_owner() {
    let mut found: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, here, text) in sources() {
        let Some(module) = here.first() else {
            continue;
        };
        if module == "layering" {
            continue;
        }
        let rel = file.strip_prefix(src()).unwrap().display().to_string();
        for name in foreign_names(module, &text) {
            found.entry(name).or_default().insert(rel.clone());
        }
    }
    let pending = |entry: &String| {
        PENDING_OWNERSHIP
            .iter()
            .any(|t| entry.split(' ').next() == Some(*t))
    };
    let (waiting, broken): (Vec<_>, Vec<_>) = found.into_iter().partition(|(e, _)| pending(e));
    println!("ownership not enforced yet for: {PENDING_OWNERSHIP:?}");
    for (name, files) in &waiting {
        println!("  {name} named in {files:?}");
    }
    assert!(
        broken.is_empty(),
        "SQL naming a table outside its owner (name (owner): files): {broken:#?}"
    );
    for t in PENDING_OWNERSHIP {
        assert!(
            waiting.iter().any(|(e, _)| e.split(' ').next() == Some(*t)),
            "{t} is clean: take it out of PENDING_OWNERSHIP"
        );
    }
}

#[test]
fn every_owner_is_a_module() {
    for (name, owner) in OWNERS {
        assert!(
            layer_of(owner).is_some(),
            "{name}: owner {owner} is no module"
        );
    }
}

/// `ARCHITECTURE.md`'s table of owners says what [`OWNERS`] says: every name in a row's first
/// column has the row's owner, and every owned name has a row.
#[test]
fn the_map_names_the_same_owners() {
    let map = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ARCHITECTURE.md"),
    )
    .unwrap();
    let start = map
        .find("## Tables (schema `comb`)")
        .expect("the Tables section");
    let section = &map[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let ticked = |cell: &str| -> Vec<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    let mut listed = BTreeSet::new();
    for row in section
        .lines()
        .filter(|l| l.starts_with("| `") || l.starts_with("| (`"))
    {
        let cells: Vec<&str> = row.split('|').collect();
        let owner = ticked(cells[2]);
        assert_eq!(owner.len(), 1, "one owner per row: {row}");
        for name in ticked(cells[1]) {
            listed.insert((name, owner[0].clone()));
        }
    }
    let owners: BTreeSet<(String, String)> = OWNERS
        .iter()
        .map(|(n, o)| (n.to_string(), o.to_string()))
        .collect();
    assert_eq!(listed, owners, "ARCHITECTURE.md's Tables and OWNERS differ");
}

/// The parser's view of a small file in module `here`, over the modules `modules`.
fn uses_in(text: &str, here: &[&str], modules: &[&[&str]]) -> BTreeSet<Vec<String>> {
    let modules: BTreeSet<Vec<String>> = modules
        .iter()
        .map(|m| m.iter().map(|s| s.to_string()).collect())
        .collect();
    let here: Vec<String> = here.iter().map(|s| s.to_string()).collect();
    uses(text, &here, &modules)
}

fn p(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

const MODULES: &[&[&str]] = &[
    &["db"],
    &["queue"],
    &["push"],
    &["http"],
    &["ack"],
    &["ack", "cursor"],
    &["ack", "store"],
];

#[test]
fn a_use_group_is_read_past_its_first_closing_brace() {
    let used = uses_in(
        "use crate::{db::{DbError, Pools}, queue::{Name}, push::Pusher};",
        &["ack"],
        MODULES,
    );
    assert_eq!(used, [p(&["db"]), p(&["push"]), p(&["queue"])].into());
}

#[test]
fn a_file_using_its_sibling_by_any_path_is_seen() {
    for text in [
        "use crate::ack::cursor::Cursor;",
        "use super::cursor::Cursor;",
        "fn f() { let _ = crate::ack::cursor::Cursor::new(); }",
        "use crate::ack::{completed, cursor::{Cursor}};",
        "fn f() { let _ = format!(\"{}\", crate::ack::cursor::NAME); }",
    ] {
        let used = uses_in(text, &["ack", "store"], MODULES);
        assert!(used.contains(&p(&["ack", "cursor"])), "not seen: {text}");
    }
    // From the parent, `self::` and a child's bare name are the child.
    for text in ["use self::cursor::Cursor;", "fn f() { cursor::apply(); }"] {
        let used = uses_in(text, &["ack"], MODULES);
        assert!(used.contains(&p(&["ack", "cursor"])), "not seen: {text}");
    }
}

#[test]
fn comments_are_not_uses() {
    let text = "//! Uses crate::queue.\n\
                /* use crate::http;\n crate::push::x() /* nested crate::queue */ */\n\
                /** crate::push */\n\
                /// Unlike `crate::queue`.\n\
                fn f() { let url = \"http://x\"; crate::ack::go(); } // crate::http";
    let used = uses_in(text, &["db"], MODULES);
    assert_eq!(used, [p(&["ack"])].into());
}

#[test]
fn sql_outside_http_is_found() {
    let text = "const Q: &str = \"SELECT 1\";\n\
                async fn f(c: &Client) { c.query_one(Q, &[]).await; }";
    assert_eq!(sql_out_of_place("dashboard", text).len(), 2);
    assert_eq!(sql_out_of_place("server", text).len(), 2);
    // Prose is not a statement; a call without arguments is not a statement call.
    let prose = "/// SELECT everything\nfn f(u: &Uri) { let _ = (u.query(), \"Select a queue\"); }";
    assert!(sql_out_of_place("http", prose).is_empty());
    // In a use case, SQL naming another owner's table is found, also inside a macro.
    let text = "const Q: &str = \"SELECT 1 FROM comb.cursor_states\";\n\
                fn f(t: &str) -> String { format!(\"DELETE FROM comb.messages_{t}\") }\n\
                const R: &str = \"SELECT * FROM comb.traces\";";
    assert_eq!(
        foreign_names("admin", text),
        [
            "cursor_states (cursor)".to_string(),
            "messages (messages)".to_string()
        ]
        .into()
    );
    let text = "fn f() -> String { format!(\"SELECT * FROM comb.cursors WHERE {}\", 1) }";
    assert_eq!(
        foreign_names("ack", text),
        ["cursors (cursor)".to_string()].into()
    );
    assert_eq!(
        foreign_names("ack", "const Q: &str = \"SELECT * FROM comb.nowhere\";"),
        ["nowhere (no owner in OWNERS)".to_string()].into()
    );
    // A fragment without a keyword, in a macro of another module, is SQL all the same.
    let text = "macro_rules! state { () => { concat!(\"comb.cursor_state(\", \"$1, $2)\") }; }";
    assert_eq!(
        foreign_names("ack", text),
        ["cursor_state (cursor)".to_string()].into()
    );
    assert!(foreign_names("cursor", text).is_empty());
}

#[test]
fn a_cycle_is_found() {
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    assert!(cycle(&g).is_some());
    g.get_mut("b").unwrap().clear();
    assert_eq!(cycle(&g), None);
}

// The storage seam (`backend`): statements are constants, and only the seam knows the
// storage's kinds.

/// The seam's own file: the one place that names the storage's kinds.
const SEAM: &str = "backend";

/// Whether a string literal reads as SQL: a statement's keyword, a table of schema `comb`, or
/// a parameter (`$1`).
fn reads_as_sql(text: &str) -> bool {
    const WORDS: &[&str] = &[
        "SELECT ", "FROM ", "WHERE ", "JOIN ", "INSERT ", "UPDATE ", "DELETE ", "SET ", " AND ",
        " ON ", "comb.",
    ];
    let parameter = text
        .as_bytes()
        .windows(2)
        .any(|w| w[0] == b'$' && w[1].is_ascii_digit());
    parameter || WORDS.iter().any(|w| text.contains(w))
}

/// The names of the macros the crate defines (`macro_rules!`): its SQL fragments.
fn fragment_macros(texts: &[String]) -> BTreeSet<String> {
    struct Defined(BTreeSet<String>);
    impl<'ast> Visit<'ast> for Defined {
        fn visit_item_macro(&mut self, m: &'ast syn::ItemMacro) {
            if let Some(name) = &m.ident {
                self.0.insert(name.to_string());
            }
        }
    }
    let mut defined = Defined(BTreeSet::new());
    for text in texts {
        defined.visit_file(&syn::parse_file(text).expect("a Rust source file"));
    }
    defined.0
}

/// Whether an expression holds SQL: a literal that reads as SQL, a name that says so
/// (`…_SQL`, `sql`), or a fragment macro of the crate.
fn holds_sql(e: &syn::Expr, fragments: &BTreeSet<String>) -> bool {
    let mut s = Source::default();
    s.visit_expr(e);
    s.strings.iter().any(|t| reads_as_sql(t))
        || s.paths.iter().flatten().any(|i| {
            i.contains("SQL") || i.to_lowercase().ends_with("sql") || fragments.contains(i)
        })
}

/// The `.replace(…)` calls of `text` that rewrite SQL (their receiver or an argument holds
/// SQL), each as `line: call`.
fn sql_rewrites(text: &str, fragments: &BTreeSet<String>) -> Vec<String> {
    struct Rewrites<'f> {
        fragments: &'f BTreeSet<String>,
        found: Vec<String>,
    }
    impl<'ast> Visit<'ast> for Rewrites<'_> {
        fn visit_expr_method_call(&mut self, c: &'ast syn::ExprMethodCall) {
            if matches!(c.method.to_string().as_str(), "replace" | "replacen")
                && (holds_sql(&c.receiver, self.fragments)
                    || c.args.iter().any(|a| holds_sql(a, self.fragments)))
            {
                let mut receiver = Source::default();
                receiver.visit_expr(&c.receiver);
                let named = receiver.paths.first().map(|p| p.join("::"));
                self.found.push(format!(
                    "`{}.replace(…)`",
                    named.unwrap_or_else(|| "…".to_string())
                ));
            }
            syn::visit::visit_expr_method_call(self, c);
        }

        fn visit_macro(&mut self, m: &'ast syn::Macro) {
            // A macro's body (format!, assert! arguments…) read as expressions where it parses.
            if let Ok(args) = m.parse_body_with(
                syn::punctuated::Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated,
            ) {
                for a in &args {
                    self.visit_expr(a);
                }
            }
        }
    }
    let file = syn::parse_file(text).expect("a Rust source file");
    let mut v = Rewrites {
        fragments,
        found: Vec::new(),
    };
    v.visit_file(&file);
    v.found
}

/// The paths of `text` that ask which storage this is: the kinds by name, or a flag.
fn storage_asked(text: &str) -> Vec<String> {
    let asks = |p: &[String]| {
        p.windows(2).any(|w| {
            matches!(
                (w[0].as_str(), w[1].as_str()),
                ("citus", "on")
                    | ("Backend" | "Kind", "Citus" | "Postgres" | "PostgreSQL")
                    | ("Backend", "CITUS")
            )
        })
    };
    let s = Source::parse(text);
    s.paths
        .iter()
        .filter(|p| asks(p))
        .map(|p| p.join("::"))
        .collect()
}

#[test]
fn statements_are_not_rewritten_at_run_time_and_only_the_seam_knows_the_storage() {
    let all: Vec<(PathBuf, String)> = files(&src())
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap();
            (f, text)
        })
        .collect();
    let texts: Vec<String> = all.iter().map(|(_, t)| t.clone()).collect();
    let fragments = fragment_macros(&texts);
    let mut wrong = Vec::new();
    for (file, text) in &all {
        let rel = file.strip_prefix(src()).unwrap().display().to_string();
        for at in sql_rewrites(text, &fragments) {
            wrong.push(format!("{rel}: SQL text rewritten at run time, {at}"));
        }
        if module_path(file).first().map(String::as_str) != Some(SEAM) {
            for p in storage_asked(text) {
                wrong.push(format!("{rel}: asks the storage's kind ({p})"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_rewrite_of_sql_is_seen_and_escaping_is_not() {
    let fragments = BTreeSet::from(["cursors".to_string()]);
    let flagged = |t: &str| !sql_rewrites(t, &fragments).is_empty();
    assert!(flagged(
        "fn f() -> String { CLAIM_SQL.replace(\"a\", \"b\") }"
    ));
    assert!(flagged(
        "fn f(s: &str) -> String { s.replace(\"WHERE m.partition_id = p.id\", \"x\") }"
    ));
    assert!(flagged(
        "fn f(s: &str) -> String { s.replace(\"$1\", \"'x'\") }"
    ));
    assert!(flagged(
        "fn f(s: &str) -> String { s.replace(cursors!(), \"x\") }"
    ));
    assert!(flagged(
        "fn f(sql: &str) -> String { format!(\"{}\", sql.replace('a', \"b\")) }"
    ));
    assert!(!flagged(
        "fn f(h: &str) -> String { h.replace('\\\\', r\"\\\\\").replace('\"', \"\\\\\\\"\") }"
    ));
    assert!(!flagged(
        "fn f(pem: &str) -> String { pem.replace(\"\\\\n\", \"\\n\") }"
    ));
    assert!(!flagged("fn f(o: &mut Option<u8>) { o.replace(1); }"));
    assert_eq!(
        storage_asked("fn f() -> bool { crate::schema::citus::on() }"),
        ["crate::schema::citus::on"]
    );
    assert_eq!(
        storage_asked("fn f(b: Backend) -> bool { matches!(b, Backend::Citus) }"),
        ["Backend::Citus"]
    );
    assert!(storage_asked("fn f(b: Backend) -> bool { b.hands_off_in_push() }").is_empty());
}
