//! Standing checks on the repository's own source, run with every test command:
//!
//! - the layers point one way: `time` imports no other layer but the `sync` facade, `wire`
//!   and `connection` import no protocol, and the two protocols (`worker`, `execution`)
//!   import nothing from each other;
//! - the client of reattachable executions imports nothing from the server side, and each
//!   Spark condition is written once (`execution::condition`);
//! - each metric name is written once (its side's table of `Metric`s), and the table in
//!   `tether::observe`'s docs lists exactly those metrics, with their kinds and units;
//! - no new import cycle between sibling modules, at any depth and through re-exports: an
//!   import of an item through a `mod.rs` face counts for the file that defines it (the
//!   known cycles are listed, with the work that removes them);
//! - no file reaches a path outside the repository (the repository stands alone);
//! - no comment or document cites a file outside the repository, and every citation of the
//!   protocol reference (`udf §4.5`, `rx §3.5`, `connect §2`) names a section that exists in
//!   the chapter under `docs/reference/`;
//! - every public item outside `#[cfg(test)]` code has a doc comment that cites its source:
//!   a section of the protocol reference, or upstream Spark (a class or method, a JIRA).
//!
//! These read the files as text: they need no build of anything but this test.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use regex::Regex;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Build output, fuzz corpora and VCS data: never the repository's own text.
const NOT_SOURCES: &[&str] = &[
    ".git",
    "target",
    "corpus",
    "artifacts",
    "coverage",
    "__pycache__",
];

/// Every file under `dir` (relative to the repository; `""` for all of it) whose name ends
/// with one of `exts`, skipping [`NOT_SOURCES`] and `target-*` directories.
fn files(dir: &str, exts: &[&str]) -> Vec<PathBuf> {
    fn walk(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if !NOT_SOURCES.contains(&name.as_str()) && !name.starts_with("target-") {
                    walk(&path, exts, out);
                }
            } else if exts.iter().any(|e| name.ends_with(&format!(".{e}"))) {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root().join(dir), exts, &mut out);
    out.sort();
    out
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .to_string_lossy()
        .into_owned()
}

/// Every library source file with its shipped code: without a `tests.rs` file or a file's
/// trailing `#[cfg(test)] mod tests`.
fn shipped_sources() -> Vec<(PathBuf, String)> {
    files("src", &["rs"])
        .into_iter()
        .filter(|file| !file.ends_with("tests.rs"))
        .map(|file| {
            let text = fs::read_to_string(&file).unwrap();
            let shipped = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
            let shipped = shipped.to_owned();
            (file, shipped)
        })
        .collect()
}

/// The lines of a Rust file that are code, not comments: `(line number, text)`.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(i, l)| (i + 1, l))
}

/// The top-level module of a file under `src/` (`src/worker/engine/core.rs` → `worker`;
/// `src/time.rs` → `time`; `src/lib.rs` → `lib`).
fn top_module(path: &Path) -> String {
    let rel = path.strip_prefix(root().join("src")).expect("under src/");
    let first = rel.components().next().expect("non-empty path");
    first
        .as_os_str()
        .to_string_lossy()
        .trim_end_matches(".rs")
        .to_string()
}

/// Layer rank of each top-level module: a module may import only from ranks at or below
/// its own, and never from the other protocol.
fn rank(module: &str) -> Option<u8> {
    Some(match module {
        // `sync`: the std-or-loom facade of locks and atomics (`--cfg tether_loom`);
        // `observe`: the event channel both protocols report through.
        "time" | "reference" | "sync" | "observe" => 0,
        "wire" => 1,
        "connection" => 2,
        "worker" | "execution" => 3,
        "spark" => 4,
        "lib" => 5,
        _ => return None,
    })
}

#[test]
fn layers_point_one_way() {
    let crate_path = Regex::new(r"\bcrate::([a-z_]+)").unwrap();
    let mut violations = Vec::new();
    for file in files("src", &["rs"]) {
        let from = top_module(&file);
        let from_rank = rank(&from).unwrap_or_else(|| panic!("unranked module {from}"));
        let text = fs::read_to_string(&file).unwrap();
        for (line, code) in code_lines(&text) {
            for cap in crate_path.captures_iter(code) {
                let to = &cap[1];
                if to == from {
                    continue;
                }
                let Some(to_rank) = rank(to) else {
                    continue; // a crate-root item such as a macro
                };
                let protocols = ["worker", "execution"];
                let crosses = protocols.contains(&from.as_str()) && protocols.contains(&to);
                if to_rank > from_rank
                    || crosses
                    || (["time", "observe"].contains(&from.as_str())
                        && !["time", "sync"].contains(&to))
                {
                    violations.push(format!("{}:{line}: {from} → {to}", relative(&file)));
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "imports against the layer order (time < wire < connection < worker | execution < \
         spark):\n{}",
        violations.join("\n")
    );
}

/// What the client side of reattachable executions may import from `execution`: itself, the
/// shared condition table and the status code. Everything else there is the server.
const CLIENT_MAY_USE: &[&str] = &["client", "condition", "Code"];

/// The client stands beside the server, not on it: nothing under `src/execution/client/`, nor
/// the gRPC client `src/spark/connect/client.rs`, names a server module or item of
/// `execution` (rx §6 is written against the wire, not against the server's types). Both
/// sides share only `execution::condition` and `execution::Code`.
#[test]
fn the_client_imports_nothing_from_the_server() {
    let path = Regex::new(r"\bcrate::execution::(\{[^}]*\}?|[A-Za-z_]+)").unwrap();
    let above = Regex::new(r"\bsuper::super\b").unwrap();
    let mut sources = files("src/execution/client", &["rs"]);
    sources.push(root().join("src/spark/connect/client.rs"));
    let mut violations = Vec::new();
    for file in &sources {
        let text = fs::read_to_string(file).unwrap();
        let in_execution_client = relative(file).starts_with("src/execution/client");
        for (line, code) in code_lines(&text) {
            for cap in path.captures_iter(code) {
                let names = cap[1].trim_matches(|c| c == '{' || c == '}');
                for name in names
                    .split(',')
                    .map(|n| n.trim().split("::").next().unwrap_or(""))
                {
                    if !name.is_empty() && !CLIENT_MAY_USE.contains(&name) {
                        violations.push(format!(
                            "{}:{line}: crate::execution::{name}",
                            relative(file)
                        ));
                    }
                }
            }
            if in_execution_client && above.is_match(code) {
                violations.push(format!("{}:{line}: super::super", relative(file)));
            }
        }
    }
    assert!(sources.len() > 5, "no client sources found");
    assert!(
        violations.is_empty(),
        "the client names the server (allowed from execution: {CLIENT_MAY_USE:?}):\n{}",
        violations.join("\n")
    );
}

/// Each Spark condition of reattachable executions is written once in the library: its
/// name appears as a string literal in exactly one place of `src/` outside test code, the
/// table `execution::condition` (rx §1.8). Test code (`#[cfg(test)] mod tests` at a file's
/// end, and `tests.rs` files) may spell them out to pin what goes on the wire.
#[test]
fn each_spark_condition_is_written_once() {
    let mut counts: BTreeMap<&str, Vec<String>> = tether::execution::condition::ALL
        .iter()
        .chain([&tether::execution::condition::RESPONSE_ALREADY_RECEIVED])
        .map(|c| (c.name(), Vec::new()))
        .collect();
    assert!(counts.len() > 10, "the condition table is empty");
    for (file, shipped) in shipped_sources() {
        for (line, code) in code_lines(&shipped) {
            for (name, places) in counts.iter_mut() {
                if code.contains(&format!("\"{name}\"")) {
                    places.push(format!("{}:{line}", relative(&file)));
                }
            }
        }
    }
    let wrong: Vec<String> = counts
        .iter()
        .filter(|(_, places)| places.len() != 1)
        .map(|(name, places)| format!("{name}: {places:?}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "conditions not written exactly once outside tests:\n{}",
        wrong.join("\n")
    );
}

/// Each metric is written once in the library: its name appears as a string literal in
/// exactly one place of `src/` outside test code, its side's table (`Metric::counter(…)`,
/// `gauge`, `histogram`), and the table in `tether::observe`'s docs lists exactly those
/// metrics, each with the kind and the unit of its definition (the `metrics` facade's `Count`,
/// `Bytes` or `Seconds`; the docs name what is counted).
#[test]
fn each_metric_is_written_once_and_the_observe_table_lists_them() {
    let literal = Regex::new(r#""(tether_(?:connect|udf|events)_[a-z_]+)""#).unwrap();
    let definition = Regex::new(
        r#"Metric::(counter|gauge|histogram)\(\s*"(tether_[a-z_]+)",\s*(?:metrics::)?(?:Unit::)?(Count|Bytes|Seconds)\b"#,
    )
    .unwrap();
    let mut places: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut defined: BTreeMap<String, (String, String)> = BTreeMap::new();
    for (file, shipped) in shipped_sources() {
        for (line, code) in code_lines(&shipped) {
            for cap in literal.captures_iter(code) {
                places
                    .entry(cap[1].to_string())
                    .or_default()
                    .push(format!("{}:{line}", relative(&file)));
            }
        }
        for cap in definition.captures_iter(&shipped) {
            let unit = match &cap[3] {
                "Bytes" => "bytes",
                "Seconds" => "seconds",
                _ => "count",
            };
            defined.insert(cap[2].to_string(), (cap[1].to_string(), unit.to_string()));
        }
    }
    assert!(
        defined.len() > 20,
        "found {} metric definitions",
        defined.len()
    );
    let not_once: Vec<String> = places
        .iter()
        .filter(|(name, at)| at.len() != 1 || !defined.contains_key(*name))
        .map(|(name, at)| format!("{name}: {at:?}"))
        .collect();
    assert!(
        not_once.is_empty(),
        "metric names not written exactly once, in a `Metric::…(name, …)` definition:\n{}",
        not_once.join("\n")
    );

    let row = Regex::new(r"(?m)^//! \| `(tether_[a-z_]+)` \| ([a-z]+) \| ([a-z]+) \|").unwrap();
    let docs = fs::read_to_string(root().join("src/observe/mod.rs")).unwrap();
    let mut listed: BTreeMap<String, (String, String)> = BTreeMap::new();
    for cap in row.captures_iter(&docs) {
        let unit = match &cap[3] {
            "bytes" | "seconds" => cap[3].to_string(),
            _ => "count".to_string(),
        };
        let before = listed.insert(cap[1].to_string(), (cap[2].to_string(), unit));
        assert!(
            before.is_none(),
            "{} is listed twice in observe's table",
            &cap[1]
        );
    }
    let missing: Vec<_> = defined
        .keys()
        .filter(|n| !listed.contains_key(*n))
        .collect();
    let unknown: Vec<_> = listed
        .keys()
        .filter(|n| !defined.contains_key(*n))
        .collect();
    let differ: Vec<String> = defined
        .iter()
        .filter_map(|(name, code)| {
            let doc = listed.get(name)?;
            (doc != code).then(|| format!("{name}: defined {code:?}, listed {doc:?}"))
        })
        .collect();
    assert!(
        missing.is_empty() && unknown.is_empty() && differ.is_empty(),
        "observe's metric table (src/observe/mod.rs) and the metric definitions differ: \
         not listed {missing:?}; listed but not defined {unknown:?}; kind or unit {differ:?}"
    );
}

/// The examples ship in the package (users learn from them, docs.rs shows them), where the
/// workspace's test-support crate does not exist: no example may use `tether_testing`.
#[test]
fn no_example_uses_the_test_support_crate() {
    let mut offenders = Vec::new();
    for file in files("examples", &["rs"]) {
        let text = fs::read_to_string(&file).unwrap();
        for (line, code) in code_lines(&text) {
            if code.contains("tether_testing") {
                offenders.push(format!("{}:{line}", relative(&file)));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "examples using tether_testing:\n{}",
        offenders.join("\n")
    );
}

/// Import cycles between sibling modules that exist today, each owned by a tracked piece of
/// work (each cycle as its members, sorted). A cycle not listed here fails the check; a
/// listed one that is gone fails it too, so the list shrinks as the work lands.
const KNOWN_CYCLES: &[&[&str]] = &[];

/// What one module file declares at its top level: the names it defines, the names its
/// `use` declarations bind (with the path each names, as written) and its glob imports.
#[derive(Default)]
struct ModuleText {
    defined: BTreeSet<String>,
    bound: BTreeMap<String, Vec<String>>,
    globs: Vec<Vec<String>>,
    /// Every `crate::…`, `super::…` and `self::…` path the file names, expanded from its
    /// `use` trees and read inline from its code.
    paths: Vec<Vec<String>>,
}

/// The library as modules: each module path (`["worker", "engine"]`; the crate root is `[]`)
/// with the text of its file. Modules are found by their files (`x.rs` or `x/mod.rs`);
/// inline modules are not (the only ones are test modules, left out).
struct ModuleTree {
    modules: BTreeMap<Vec<String>, ModuleText>,
}

/// `use` trees expanded to `(binding, path)` pairs: `a::{b, c::d as e, f::*}` gives
/// `(b, a::b)`, `(e, a::c::d)` and `(*, a::f)`; `a::{self}` binds `a`.
fn expand_use_tree(prefix: &[String], tree: &str, out: &mut Vec<(String, Vec<String>)>) {
    let tree = tree.trim();
    if tree.is_empty() {
        return;
    }
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = tree[..open]
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let base: Vec<String> = prefix.iter().cloned().chain(head).collect();
        // Split the group at its top-level commas.
        let (mut depth, mut from) = (0, 0);
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand_use_tree(&base, &inner[from..i], out);
                    from = i + 1;
                }
                _ => {}
            }
        }
        expand_use_tree(&base, &inner[from..], out);
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p.trim(), Some(a.trim())),
        None => (tree, None),
    };
    let mut segs: Vec<String> = prefix.to_vec();
    segs.extend(
        path.split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
    );
    if segs.last().is_some_and(|s| s == "self") {
        segs.pop();
    }
    let Some(last) = segs.last().cloned() else {
        return;
    };
    let name = match alias {
        Some(a) => a.to_owned(),
        None if last == "*" => {
            segs.pop();
            "*".to_owned()
        }
        None => last,
    };
    out.push((name, segs));
}

/// Reads one module file: its top-level definitions and `use` bindings, and every path it
/// names (test code at the file's end and comments left out).
fn read_module(text: &str) -> ModuleText {
    let item = Regex::new(
        r"^(?:pub(?:\([^)]*\))?\s+)?(?:(?:const|async|unsafe|extern)\s+)*(?:fn|struct|enum|trait|type|const|static|union|mod)\s+([A-Za-z_][A-Za-z0-9_]*)",
    )
    .unwrap();
    let macro_def = Regex::new(r"^macro_rules!\s*([A-Za-z_][A-Za-z0-9_]*)").unwrap();
    let use_start = Regex::new(r"^(\s*)(?:pub(?:\([^)]*\))?\s+)?use\s+").unwrap();
    let inline = Regex::new(r"\b(?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+").unwrap();
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    // Comments out: whole comment lines, and what follows a `//` that is not part of `://`.
    let code: Vec<String> = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("//") {
                return String::new();
            }
            let mut cut = l.len();
            let bytes = l.as_bytes();
            for i in 0..bytes.len().saturating_sub(1) {
                if bytes[i] == b'/' && bytes[i + 1] == b'/' && (i == 0 || bytes[i - 1] != b':') {
                    cut = i;
                    break;
                }
            }
            l[..cut].to_owned()
        })
        .collect();
    let mut module = ModuleText::default();
    let mut i = 0;
    while i < code.len() {
        let line = &code[i];
        if let Some(cap) = item.captures(line).or_else(|| macro_def.captures(line)) {
            module.defined.insert(cap[1].to_owned());
        }
        for m in inline.find_iter(line) {
            module
                .paths
                .push(m.as_str().split("::").map(str::to_owned).collect());
        }
        if let Some(cap) = use_start.captures(line) {
            let top_level = cap[1].is_empty();
            let mut statement = line[cap.get(0).unwrap().end()..].to_owned();
            while !statement.contains(';') && i + 1 < code.len() {
                i += 1;
                statement.push(' ');
                statement.push_str(&code[i]);
            }
            let tree = statement.split(';').next().unwrap_or("");
            let mut pairs = Vec::new();
            expand_use_tree(&[], tree, &mut pairs);
            for (name, path) in pairs {
                if matches!(
                    path.first().map(String::as_str),
                    Some("crate" | "super" | "self")
                ) {
                    module.paths.push(path.clone());
                }
                if !top_level {
                    continue;
                }
                if name == "*" {
                    module.globs.push(path);
                } else {
                    module.bound.insert(name, path);
                }
            }
        }
        i += 1;
    }
    module
}

impl ModuleTree {
    /// The modules of the crate whose root is `src/lib.rs` under `src`.
    fn read(src: &Path) -> Self {
        let mut modules = BTreeMap::new();
        fn walk(dir: &Path, at: &[String], modules: &mut BTreeMap<Vec<String>, ModuleText>) {
            let Ok(entries) = fs::read_dir(dir) else {
                return;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let name = entry.file_name().to_string_lossy().into_owned();
                if path.is_dir() {
                    let mut next = at.to_vec();
                    next.push(name);
                    walk(&path, &next, modules);
                } else if let Some(stem) = name.strip_suffix(".rs") {
                    let mut module = at.to_vec();
                    if !(stem == "mod" || (at.is_empty() && stem == "lib")) {
                        module.push(stem.to_owned());
                    }
                    let text = fs::read_to_string(&path).unwrap();
                    modules.insert(module, read_module(&text));
                }
            }
        }
        walk(src, &[], &mut modules);
        Self { modules }
    }

    /// The module that defines what `path` names, seen from `module`: a module itself, or
    /// the module whose file defines the item, following `use` bindings (re-exports
    /// included) to the definition. `None` for another crate's item or what it cannot find.
    fn resolve(&self, module: &[String], path: &[String], depth: usize) -> Option<Vec<String>> {
        if depth > 32 {
            return None;
        }
        let mut at = module.to_vec();
        let mut rest = path;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                at.clear();
                rest = &rest[1..];
            }
            Some("self") => rest = &rest[1..],
            _ => {}
        }
        while rest.first().is_some_and(|s| s == "super") {
            at.pop()?;
            rest = &rest[1..];
        }
        self.resolve_in(at, rest, depth)
    }

    fn resolve_in(&self, at: Vec<String>, rest: &[String], depth: usize) -> Option<Vec<String>> {
        let Some((name, tail)) = rest.split_first() else {
            return self.modules.contains_key(&at).then_some(at);
        };
        let mut child = at.clone();
        child.push(name.clone());
        if self.modules.contains_key(&child) {
            return self.resolve_in(child, tail, depth);
        }
        let text = self.modules.get(&at)?;
        if text.defined.contains(name) {
            return Some(at);
        }
        if let Some(target) = text.bound.get(name) {
            let full: Vec<String> = target.iter().chain(tail).cloned().collect();
            return self.resolve(&at, &full, depth + 1);
        }
        text.globs.iter().find_map(|glob| {
            let full: Vec<String> = glob.iter().chain(rest).cloned().collect();
            self.resolve(&at, &full, depth + 1)
        })
    }

    /// Import edges between sibling modules: a file of one naming an item defined in
    /// another (or in a module below it), through any number of re-exports. An edge
    /// between modules deeper down counts as one between the siblings that contain them.
    fn sibling_edges(&self) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
        let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
        for (from, text) in &self.modules {
            for path in &text.paths {
                let Some(to) = self.resolve(from, path, 0) else {
                    continue;
                };
                let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
                if common == from.len() || common == to.len() {
                    continue; // a module and its own ancestor or descendant
                }
                edges
                    .entry(from[..=common].to_vec())
                    .or_default()
                    .insert(to[..=common].to_vec());
            }
        }
        edges
    }

    /// The import cycles between sibling modules: each strongly connected set of two or
    /// more, as its members' paths (`worker::engine`), sorted.
    fn sibling_cycles(&self) -> BTreeSet<Vec<String>> {
        let edges = self.sibling_edges();
        let reaches = |from: &Vec<String>| {
            let mut seen = BTreeSet::new();
            let mut stack = vec![from.clone()];
            while let Some(m) = stack.pop() {
                for next in edges.get(&m).into_iter().flatten() {
                    if seen.insert(next.clone()) {
                        stack.push(next.clone());
                    }
                }
            }
            seen
        };
        let reach: BTreeMap<&Vec<String>, BTreeSet<Vec<String>>> =
            edges.keys().map(|m| (m, reaches(m))).collect();
        let mut cycles = BTreeSet::new();
        for (m, seen) in &reach {
            if !seen.contains(*m) {
                continue;
            }
            let members: Vec<String> = seen
                .iter()
                .filter(|o| reach.get(o).is_some_and(|r| r.contains(*m)))
                .map(|o| o.join("::"))
                .collect();
            cycles.insert(members);
        }
        cycles
    }
}

#[test]
fn no_new_import_cycles_between_sibling_modules() {
    let tree = ModuleTree::read(&root().join("src"));
    assert!(
        tree.modules.len() > 50,
        "the walk found {} modules",
        tree.modules.len()
    );
    let cycles = tree.sibling_cycles();
    let known: BTreeSet<Vec<String>> = KNOWN_CYCLES
        .iter()
        .map(|c| c.iter().map(|m| m.to_string()).collect())
        .collect();
    let new: Vec<_> = cycles.difference(&known).collect();
    let gone: Vec<_> = known.difference(&cycles).collect();
    assert!(
        new.is_empty(),
        "new import cycles between siblings (through re-exports too): {new:?}"
    );
    assert!(
        gone.is_empty(),
        "cycles listed in KNOWN_CYCLES no longer exist; remove them: {gone:?}"
    );
}

/// Writes a small crate of `files` (`(path under src/, text)`) to a fresh directory and
/// returns its `src`.
fn synthetic_crate(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}-{}", std::process::id()))
        .join("src");
    let _ = fs::remove_dir_all(&src);
    for (path, text) in files {
        let file = src.join(path);
        fs::create_dir_all(file.parent().unwrap()).unwrap();
        fs::write(file, text).unwrap();
    }
    src
}

/// The cycle check sees a circle that runs through `mod.rs` faces: `super::Name` and
/// `crate::…::Name` imports are followed through `pub use` re-exports to the file that
/// defines the item (the two circles found in `execution` and `worker` had this shape),
/// and an edge from inside a directory counts for the directory.
#[test]
fn the_cycle_check_follows_re_exports_to_the_defining_file() {
    let circle = [
        ("lib.rs", "mod a;\nmod w;\n"),
        // a: `core` names `events` by module; `events` names `core`'s item through the face.
        (
            "a/mod.rs",
            "mod core;\nmod events;\n\npub use self::core::{Phase, Removal};\npub use events::Status;\n",
        ),
        (
            "a/core.rs",
            "use super::events::Status;\n\npub enum Removal {\n    Released,\n}\npub struct Phase;\n",
        ),
        (
            "a/events.rs",
            "/// Doc naming super::Phase in a comment only.\npub enum Status {\n    Closed(super::Removal),\n}\n",
        ),
        // w: `events` imports from `engine`'s face; `engine/config.rs` imports `events`'
        // item through `w`'s face, with `crate::` paths in a grouped `use`.
        (
            "w/mod.rs",
            "pub mod engine;\nmod events;\n\npub use events::{Event, Kind as EventKind};\n",
        ),
        (
            "w/events.rs",
            "use crate::w::engine::{\n    Config,\n};\n\npub struct Event;\npub enum Kind {}\n",
        ),
        (
            "w/engine/mod.rs",
            "mod config;\n\npub use self::config::Config;\n",
        ),
        (
            "w/engine/config.rs",
            "use crate::w::{EventKind, engine};\n\npub struct Config;\n",
        ),
    ];
    let tree = ModuleTree::read(&synthetic_crate("cycle-check", &circle));
    let found: Vec<Vec<String>> = tree.sibling_cycles().into_iter().collect();
    assert_eq!(
        found,
        [vec!["a::core", "a::events"], vec!["w::engine", "w::events"]],
        "the planted circles through re-exports"
    );

    // The same crate with the back arrows gone: one-way imports through faces are no cycle.
    let mut open = circle;
    open[3].1 = "pub enum Status {\n    Closed,\n}\n";
    open[7].1 = "pub struct Config;\n";
    let tree = ModuleTree::read(&synthetic_crate("cycle-check-open", &open));
    assert_eq!(tree.sibling_cycles(), BTreeSet::new());
}

/// Section numbers of a reference chapter: every `#`-heading that starts with a number.
fn sections(chapter: &str) -> BTreeSet<String> {
    let heading = Regex::new(r"(?m)^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s").unwrap();
    let text = fs::read_to_string(root().join("docs/reference").join(chapter)).unwrap();
    heading
        .captures_iter(&text)
        .map(|c| c[1].to_string())
        .collect()
}

#[test]
fn citations_resolve_and_stay_inside_the_repository() {
    let chapters = [
        ("udf", sections("udf-worker-protocol.md")),
        ("rx", sections("reattach-protocol.md")),
        ("connect", sections("spark-connect.md")),
    ];
    for (name, s) in &chapters {
        assert!(s.len() > 5, "chapter {name} has no numbered sections");
    }
    let citation = Regex::new(r"\b(udf|rx|connect) §(\d+(?:\.\d+)*)").unwrap();
    let outside = Regex::new(
        r"\.\./shared|shared/(spec|reviews|oracle)|\bspec/[a-z-]+\.md|DESIGN\.md|issue item \d",
    )
    .unwrap();
    let mut problems = Vec::new();
    let mut sources = Vec::new();
    for dir in ["src", "tether-testing/src", "tests", "examples", "benches"] {
        sources.extend(files(dir, &["rs"]));
    }
    sources.extend(files("docs", &["md"]));
    sources.push(root().join("README.md"));
    for file in sources {
        let text = fs::read_to_string(&file).unwrap();
        let is_rust = file.extension().is_some_and(|e| e == "rs");
        for (i, line) in text.lines().enumerate() {
            let comment = match line.find("//") {
                Some(at) if is_rust => &line[at..],
                _ if is_rust => continue,
                _ => line,
            };
            if outside.is_match(comment) {
                problems.push(format!(
                    "{}:{}: cites a file outside the repository: {}",
                    relative(&file),
                    i + 1,
                    comment.trim()
                ));
            }
            for cap in citation.captures_iter(comment) {
                let (_, known) = chapters.iter().find(|(n, _)| *n == &cap[1]).unwrap();
                let number = &cap[2];
                // `§4.5.2` resolves to `4.5` when the chapter has no heading below 4.5 (a
                // numbered step or rule inside it); `§4.99` does not resolve to `4`.
                let mut prefix = number.to_string();
                let resolves = loop {
                    if known.contains(&prefix) {
                        let deeper = format!("{prefix}.");
                        break prefix == number || !known.iter().any(|k| k.starts_with(&deeper));
                    }
                    match prefix.rfind('.') {
                        Some(dot) => prefix.truncate(dot),
                        None => break false,
                    }
                };
                if !resolves {
                    problems.push(format!(
                        "{}:{}: `{} §{number}` is not a section of the {} chapter",
                        relative(&file),
                        i + 1,
                        &cap[1],
                        &cap[1]
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every text file of the repository (sources, scripts, manifests, docs, CI).
fn repository_text_files() -> Vec<PathBuf> {
    let mut out = files(
        "",
        &["rs", "sh", "py", "toml", "md", "txt", "yml", "yaml", "json"],
    );
    out.push(root().join(".ci/run"));
    out
}

/// `dir` joined with the relative `path` (`..` and `.` resolved by hand), or `None` when it
/// climbs above the repository root.
fn resolve_inside(dir: &Path, path: &str) -> Option<PathBuf> {
    let mut parts: Vec<String> = relative(dir)
        .split('/')
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            other => parts.push(other.to_owned()),
        }
    }
    Some(parts.iter().fold(root(), |p, part| p.join(part)))
}

/// The repository stands alone: no file reaches a path outside it. A relative path that
/// climbs (`../x`, or a `".."` component of a join such as `"..", "tests"`) must resolve, from
/// the file's own directory, to something that exists inside the repository; the former
/// sibling folder (`shared/`) and absolute paths under `/work` are rejected outright.
#[test]
fn no_path_leaves_the_repository() {
    let climbing = Regex::new(r#"(?:^|[^.\w])((?:\.\./)+[\w.\-/]*)"#).unwrap();
    let joined = Regex::new(r#""\.\."((?:\s*,\s*"[\w.\-]+")*)"#).unwrap();
    let sibling = Regex::new(r"\bshared/(oracle|spec|reviews|hooks|DESIGN)|/work/").unwrap();
    let mut problems = Vec::new();
    let files = repository_text_files();
    assert!(
        files.len() > 100,
        "the walk found only {} files",
        files.len()
    );
    for file in files {
        if file.ends_with("tests/checks/standing.rs") {
            continue; // this check's own patterns
        }
        let Ok(text) = fs::read_to_string(&file) else {
            continue;
        };
        let dir = file.parent().unwrap();
        for (i, line) in text.lines().enumerate() {
            let mut paths: Vec<String> = climbing
                .captures_iter(line)
                .map(|c| c[1].trim_end_matches(['.', ',']).to_owned())
                .collect();
            for c in joined.captures_iter(line) {
                let rest: Vec<&str> = c[1]
                    .split(',')
                    .map(|p| p.trim().trim_matches('"'))
                    .filter(|p| !p.is_empty())
                    .collect();
                paths.push(
                    std::iter::once("..")
                        .chain(rest)
                        .collect::<Vec<_>>()
                        .join("/"),
                );
            }
            for path in paths {
                match resolve_inside(dir, &path) {
                    Some(target) if target.exists() => {}
                    Some(target) => problems.push(format!(
                        "{}:{}: `{path}` names {}, which does not exist in the repository",
                        relative(&file),
                        i + 1,
                        relative(&target)
                    )),
                    None => problems.push(format!(
                        "{}:{}: `{path}` climbs out of the repository",
                        relative(&file),
                        i + 1
                    )),
                }
            }
            if sibling.is_match(line) {
                problems.push(format!(
                    "{}:{}: names a path outside the repository: {}",
                    relative(&file),
                    i + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Directories whose public items may still lack a citation, because they are being written
/// now. Each entry is a path prefix under the repository root. A directory that has no
/// offender left fails the check, so the list shrinks as the work lands: remove it then.
const UNCITED_DIRS_IN_PROGRESS: &[&str] = &[];

/// A public item (`pub fn`, also `const`/`async`/`unsafe`, `pub struct`, `enum`, `trait`,
/// `const`, `type`, `static`, `union`) that is not in `#[cfg(test)]` code and whose doc
/// comment cites no source.
struct Uncited {
    file: String,
    line: usize,
    kind: String,
    name: String,
}

/// The public items of one Rust source file whose doc comments cite no source, and the
/// files its `#[cfg(test)] mod name;` declarations make test-only.
fn uncited_items(file: &Path, text: &str) -> (Vec<Uncited>, Vec<PathBuf>) {
    let item = Regex::new(
        r"^\s*pub\s+(?:(?:const|async|unsafe)\s+)*(fn|struct|enum|trait|const|type|static|union)\s+(\w+)",
    )
    .unwrap();
    let cite =
        Regex::new(r"(udf|rx|connect) §\d|SPARK-\d+|Spark(?:'s)? `|upstream|PySpark").unwrap();
    let mod_decl = Regex::new(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;").unwrap();
    let test_only = |attr: &str| attr.contains("cfg(test)") || attr.contains("cfg(all(test");
    let lines: Vec<&str> = text.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut uncited = Vec::new();
    let mut test_files = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        // `#[cfg(test)]` code: skip the item it applies to, with its body.
        if trimmed.starts_with("#[") && test_only(trimmed) {
            let mut j = i + 1;
            while j < lines.len() {
                let t = lines[j].trim_start();
                if t.is_empty() || t.starts_with("#[") || t.starts_with("//") {
                    j += 1;
                } else {
                    break;
                }
            }
            let Some(target) = lines.get(j) else { break };
            if let Some(m) = mod_decl.captures(target) {
                let dir = if file
                    .file_name()
                    .is_some_and(|n| n == "mod.rs" || n == "lib.rs")
                {
                    file.parent().unwrap().to_path_buf()
                } else {
                    file.with_extension("")
                };
                test_files.push(dir.join(format!("{}.rs", &m[1])));
                test_files.push(dir.join(&m[1]).join("mod.rs"));
                i = j + 1;
                continue;
            }
            if target.trim_end().ends_with(';') {
                i = j + 1;
                continue;
            }
            // The body ends at the first line back at the item's indentation that closes it
            // (rustfmt puts the closing `}` or `);` there).
            let depth = indent(target);
            let mut k = j + 1;
            while k < lines.len() {
                let t = lines[k].trim();
                let closes = t.starts_with('}') || (t.starts_with(')') && t.ends_with(';'));
                if indent(lines[k]) == depth && closes {
                    break;
                }
                k += 1;
            }
            i = k + 1;
            continue;
        }
        let Some(cap) = item.captures(lines[i]) else {
            i += 1;
            continue;
        };
        // Walk up over the doc comment and the attributes (which may span lines, e.g.
        // `#[allow(\n    clippy::x,\n    reason = "…"\n)]`) to collect the doc text.
        let mut doc = String::new();
        let mut j = i;
        let mut in_attribute = false;
        let mut cfg_test = false;
        while j > 0 {
            j -= 1;
            let t = lines[j].trim();
            if in_attribute {
                if t.starts_with("#[") {
                    in_attribute = false;
                    cfg_test |= test_only(t);
                }
                continue;
            }
            if let Some(d) = t.strip_prefix("///") {
                doc.push_str(d);
                doc.push('\n');
            } else if t.starts_with("#[") {
                cfg_test |= test_only(t);
                if let Some(d) = t.strip_prefix("#[doc") {
                    doc.push_str(d);
                    doc.push('\n');
                }
            } else if t.ends_with(']') && !t.starts_with("//") {
                // The last line of an attribute that began further up.
                in_attribute = true;
            } else if t.starts_with("//") && !t.starts_with("//!") {
                // A plain comment between the doc and the item: the doc still applies.
            } else {
                break;
            }
        }
        if !cfg_test && !cite.is_match(&doc) {
            uncited.push(Uncited {
                file: relative(file),
                line: i + 1,
                kind: cap[1].to_string(),
                name: cap[2].to_string(),
            });
        }
        i += 1;
    }
    (uncited, test_files)
}

#[test]
fn every_public_item_cites_its_source() {
    // The library and its test-support crate, which keeps the same standard.
    let mut sources = files("src", &["rs"]);
    sources.extend(files("tether-testing/src", &["rs"]));
    let mut test_files = BTreeSet::new();
    let mut found = Vec::new();
    for file in &sources {
        let text = fs::read_to_string(file).unwrap();
        let (uncited, tests) = uncited_items(file, &text);
        found.extend(uncited);
        test_files.extend(tests);
    }
    let (allowed, offenders): (Vec<_>, Vec<_>) = found
        .into_iter()
        .filter(|u| !test_files.contains(&root().join(&u.file)))
        .partition(|u| {
            UNCITED_DIRS_IN_PROGRESS
                .iter()
                .any(|d| u.file.starts_with(d))
        });
    let list = |items: &[Uncited]| {
        items
            .iter()
            .map(|u| format!("{}:{}: pub {} {}", u.file, u.line, u.kind, u.name))
            .collect::<Vec<_>>()
            .join("\n")
    };
    if !allowed.is_empty() {
        println!(
            "uncited public items in directories still being written (UNCITED_DIRS_IN_PROGRESS):\n{}",
            list(&allowed)
        );
    }
    assert!(
        offenders.is_empty(),
        "public items whose doc comment cites no source (a protocol reference section such as \
         `udf §4.5`, `rx §3.5`, `connect §2`; Spark's `Class.method`; or a SPARK-nnnnn JIRA):\n{}",
        list(&offenders)
    );
    let done: Vec<_> = UNCITED_DIRS_IN_PROGRESS
        .iter()
        .filter(|d| !allowed.iter().any(|u| u.file.starts_with(*d)))
        .collect();
    assert!(
        done.is_empty(),
        "directories in UNCITED_DIRS_IN_PROGRESS have no uncited item left; remove them: \
         {done:?}"
    );
}

/// The reader behind `every_public_item_cites_its_source`: attributes spanning lines,
/// `#[doc]` attributes, plain comments and `#[cfg(test)]` code.
#[test]
fn uncited_items_reads_attributes_and_skips_test_code() {
    let text = r#"
/// Cited (udf §4.1).
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "the doc is above the attributes"
)]
pub struct Cited;

/// No source here.
pub fn uncited() {}

// A plain comment is no doc.
pub const BARE: u8 = 1;

#[cfg(test)]
mod tests {
    pub fn in_test_module() {}
}

#[cfg(test)]
mod oracle;

/// Spark's `WorkerSession.close`.
// A plain comment between the doc and the item.
pub async fn cited_after_a_test_module() {}

#[cfg(test)]
impl Cited {
    pub fn in_test_impl() {}
}

#[doc = "SPARK-57318"]
pub const fn cited_by_a_doc_attribute() {}

/// Cited (rx §3.5), but in test code.
#[cfg(test)]
pub struct TestOnly(
    u8,
);

/// No source either.
pub(crate) fn crate_private_is_not_checked() {}
"#;
    let (uncited, test_files) = uncited_items(Path::new("src/demo.rs"), text);
    let found: Vec<_> = uncited
        .iter()
        .map(|u| format!("{}:{} {} {}", u.file, u.line, u.kind, u.name))
        .collect();
    assert_eq!(
        found,
        ["src/demo.rs:11 fn uncited", "src/demo.rs:14 const BARE"]
    );
    assert_eq!(
        test_files,
        [
            PathBuf::from("src/demo/oracle.rs"),
            PathBuf::from("src/demo/oracle/mod.rs")
        ]
    );
}
