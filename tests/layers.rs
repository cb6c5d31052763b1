//! Guards the shape of `src/` (docs/architecture.md, "Layers"): every module
//! belongs to a layer of the table in docs/architecture.md, and a module
//! imports only from its own unit or from a lower layer — so no import loops
//! between units, and the layers point one way.
//!
//! Imports are read from the source text: every `crate::…`, `super::…` and
//! `self::…` path outside comments, with `use` groups expanded, resolved
//! against the file's own module path.
//!
//! Two more rules of the same page are checked here: nothing outside
//! `src/sources/` names a kind (a `kind = "…"` word or a kind's metric, in a
//! string literal or as a catalogue constant), and the files of one folder do
//! not import each other in a loop.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The layer table: unit name → rank (higher imports lower).
fn layers() -> BTreeMap<String, usize> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md"))
            .expect("docs/architecture.md is readable");
    let block = doc
        .split("```text layers\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/architecture.md has a ```text layers block");
    let mut out = BTreeMap::new();
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let mut words = line.split_whitespace();
        let rank: usize = words
            .next()
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("layer line without a rank: {line:?}"));
        for unit in words {
            assert!(
                out.insert(unit.to_string(), rank).is_none(),
                "{unit} is listed twice in the layer table"
            );
        }
    }
    out
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under src/ (`sources/kafka/mod.rs` →
/// `["sources", "kafka"]`); `None` for the crate roots.
fn module_of(src: &Path, file: &Path) -> Option<Vec<String>> {
    let rel = file.strip_prefix(src).expect("under src/");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    match last.as_str() {
        "lib.rs" | "main.rs" if parts.is_empty() => return None,
        "mod.rs" => {}
        other => parts.push(other.trim_end_matches(".rs").to_string()),
    }
    Some(parts)
}

/// The source without comments and string literals (a path in a message is
/// no import), up to its unit tests (`#[cfg(test)]`: an inline module whose
/// `super` is the file, which may use what it tests).
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if line.trim() == "#[cfg(test)]" {
            break;
        }
        let mut in_str = false;
        let mut prev = ' ';
        let mut kept = String::new();
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if !in_str && c == '/' && chars.get(i + 1) == Some(&'/') {
                break;
            }
            if c == '"' && prev != '\\' {
                in_str = !in_str;
            } else if !in_str {
                kept.push(c);
            }
            prev = if prev == '\\' && c == '\\' { ' ' } else { c };
            i += 1;
        }
        out.push_str(&kept);
        out.push('\n');
    }
    out
}

/// Every path the code names that starts with `crate`, `super` or `self`,
/// as module paths from the crate root.
fn imports(module: &[String], code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let tokens: Vec<&str> = code
        .split(|c: char| {
            !(c.is_alphanumeric() || c == '_' || c == ':' || c == '{' || c == '}' || c == ',')
        })
        .filter(|t| !t.is_empty())
        .collect();
    // Re-join `use a::{b, c}` groups split by the tokenizer on spaces.
    let joined = tokens.join(" ");
    let mut rest = joined.as_str();
    while let Some(at) = ["crate::", "super::", "self::"]
        .iter()
        .filter_map(|p| rest.find(p).map(|i| (i, *p)))
        .min_by_key(|(i, _)| *i)
    {
        let (i, _) = at;
        let preceded = rest[..i]
            .chars()
            .last()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        let start = &rest[i..];
        let end = path_end(start);
        let path = &start[..end];
        rest = &start[end.max(1)..];
        if preceded {
            continue;
        }
        for expanded in expand(path) {
            if let Some(p) = resolve(module, &expanded) {
                out.push(p);
            }
        }
    }
    out
}

/// Where a path (with its brace groups) ends.
fn path_end(s: &str) -> usize {
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return i,
            '}' => depth -= 1,
            ' ' | ',' if depth == 0 => return i,
            _ => {}
        }
    }
    s.len()
}

/// `a::{b::c, d}` → `a::b::c`, `a::d`.
fn expand(path: &str) -> Vec<String> {
    let Some(open) = path.find('{') else {
        return vec![path.trim_end_matches("::").to_string()];
    };
    let prefix = &path[..open];
    let inner = &path[open + 1..path.rfind('}').unwrap_or(path.len())];
    let mut parts = Vec::new();
    let (mut depth, mut from) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[from..]);
    parts
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand(&format!("{prefix}{p}")))
        .collect()
}

/// A `crate::`/`super::`/`self::` path as a path from the crate root.
fn resolve(module: &[String], path: &str) -> Option<Vec<String>> {
    let mut segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let mut base: Vec<String> = match segs.first()? {
        &"crate" => {
            segs.remove(0);
            Vec::new()
        }
        // `self` is the file's module, `super` its parent (for `x.rs` as
        // for `x/mod.rs`: the module is `…::x` either way).
        _ => module.to_vec(),
    };
    while let Some(first) = segs.first() {
        match *first {
            "self" => {
                segs.remove(0);
            }
            "super" => {
                segs.remove(0);
                base.pop()?;
            }
            _ => break,
        }
    }
    base.extend(segs.iter().map(|s| s.to_string()));
    Some(base)
}

/// The unit a module path belongs to: the longest unit of the table that
/// prefixes it, where `a::*` stands for every folder `src/a/<x>/` (`a::<x>`,
/// each a unit of its own).
fn unit_of(
    layers: &BTreeMap<String, usize>,
    src: &Path,
    path: &[String],
) -> Option<(String, usize)> {
    let listed = layers
        .iter()
        .filter(|(u, _)| {
            let parts: Vec<&str> = u.split("::").collect();
            parts.len() <= path.len() && parts.iter().zip(path).all(|(a, b)| a == b)
        })
        .max_by_key(|(u, _)| u.split("::").count())
        .map(|(u, r)| (u.clone(), *r));
    if let [parent, child, ..] = path
        && listed.as_ref().is_none_or(|(u, _)| u == parent)
        && let Some(rank) = layers.get(&format!("{parent}::*"))
        && src.join(parent).join(child).is_dir()
    {
        return Some((format!("{parent}::{child}"), *rank));
    }
    listed
}

/// The upward (or sideways) imports in `src`, as `file: unit → unit` lines.
fn violations(src: &Path) -> Vec<String> {
    let layers = layers();
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut out = Vec::new();
    for file in &files {
        let Some(module) = module_of(src, file) else {
            continue;
        };
        let rel = file
            .strip_prefix(src)
            .expect("under src/")
            .display()
            .to_string();
        let Some((from, from_rank)) = unit_of(&layers, src, &module) else {
            out.push(format!(
                "{rel}: module {} is in no layer of docs/architecture.md",
                module.join("::")
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).expect("readable source");
        for target in imports(&module, &code_only(&text)) {
            let Some((to, to_rank)) = unit_of(&layers, src, &target) else {
                continue; // the crate root's own items
            };
            if to != from && to_rank >= from_rank {
                let line = format!(
                    "{rel}: {from} (layer {from_rank}) imports {} from {to} (layer {to_rank})",
                    target.join("::"),
                );
                if !out.contains(&line) {
                    out.push(line);
                }
            }
        }
    }
    out
}

#[test]
fn modules_import_only_from_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = violations(&src);
    assert!(
        found.is_empty(),
        "imports against the layers of docs/architecture.md:\n{}",
        found.join("\n")
    );
}

/// Writes `text` to `rel` under `src`, with its folders (the checks' own tests).
fn write_file(src: &Path, rel: &str, text: &str) {
    let path = src.join(rel);
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

/// Guards the check itself: an upward import, a sideways one between units
/// of one layer, and a module in no layer are each found.
#[test]
fn the_check_finds_upward_and_sideways_imports() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let src = dir.path();
    let write = |rel: &str, text: &str| write_file(src, rel, text);
    write("validation.rs", "use crate::app::Agent;\n");
    write(
        "sources/table/mod.rs",
        "use super::{kafka::KafkaSpec, poll_loop::Source};\n",
    );
    write(
        "sources/kafka/mod.rs",
        "// crate::app is only named in a comment\nfn f() { let _ = \"crate::app\"; }\n",
    );
    write("nowhere.rs", "");
    let found = violations(src);
    let says = |what: &str| found.iter().any(|l| l.contains(what));
    assert!(
        says("validation.rs: validation (layer 0) imports app::Agent from app"),
        "{found:#?}"
    );
    assert!(
        says(
            "sources/table/mod.rs: sources::table (layer 4) imports sources::kafka::KafkaSpec from sources::kafka (layer 4)"
        ),
        "{found:#?}"
    );
    assert!(
        says("nowhere.rs: module nowhere is in no layer"),
        "{found:#?}"
    );
    assert_eq!(found.len(), 3, "{found:#?}");
}

// ---------------------------------------------------------------------------
// Kinds are named only under src/sources/.

/// Where a kind may be named outside `src/sources/`, and why: (file under
/// src/, the whole literal, the reason). Each entry is a value, not a
/// reference to a kind.
const KIND_WORDS_ALLOWED: &[(&str, &str, &str)] = &[
    (
        "cli.rs",
        "inbox",
        "the default table name of `schema` (a table called inbox), not the kind",
    ),
    (
        "tracing_link/config.rs",
        "inbox",
        "the default `messaging.system` of consumer spans (docs/traces.md), not the kind",
    ),
];

/// Files outside `src/sources/` that may name kinds and their metrics: the
/// catalogue defines every metric; the demo is a user of the table kind (it
/// writes a config and its drills name the series a user would watch).
fn names_kinds_by_design(rel: &str) -> bool {
    rel == "telemetry/catalogue.rs" || rel.starts_with("demo/")
}

/// The catalogue's metrics of kinds (every name not `inboxwatch_…`), as
/// (constant, name).
fn kind_metrics(src: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(src.join("telemetry/catalogue.rs"))
        .expect("src/telemetry/catalogue.rs is readable");
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((konst, rest)) = line.trim().split_once(" = \"") else {
            continue;
        };
        let Some(name) = rest.strip_suffix("\";") else {
            continue;
        };
        let upper = |c: char| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_';
        if !konst.is_empty() && konst.chars().all(upper) && !name.starts_with("inboxwatch_") {
            out.push((konst.to_string(), name.to_string()));
        }
    }
    out
}

/// The string literals of `text` with their line numbers, up to its unit
/// tests, outside comments (raw strings included).
fn literals(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim() == "#[cfg(test)]" {
            break;
        }
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            match chars[i] {
                '/' if chars.get(i + 1) == Some(&'/') => break,
                // A char literal ('"') is no string.
                '\'' if chars.get(i + 2) == Some(&'\'') => i += 3,
                '\'' if chars.get(i + 1) == Some(&'\\') && chars.get(i + 3) == Some(&'\'') => {
                    i += 4
                }
                '"' => {
                    let mut lit = String::new();
                    i += 1;
                    while i < chars.len() && chars[i] != '"' {
                        if chars[i] == '\\' && i + 1 < chars.len() {
                            lit.push(chars[i]);
                            i += 1;
                        }
                        lit.push(chars[i]);
                        i += 1;
                    }
                    out.push((n + 1, lit));
                    i += 1;
                }
                _ => i += 1,
            }
        }
    }
    out
}

/// Whether `word` stands in `text` as a word of its own, in any case
/// (`Kafka topics`): not inside a longer name (`demo-inbox`, `inbox.attempt`,
/// `inbox_table`, `--outbox-table`). A literal that is the word's prefix of
/// names (`kafka_`, `inbox.`) names it too.
fn names_word(text: &str, word: &str) -> bool {
    let lower = text.to_lowercase();
    if lower == format!("{word}_") || lower == format!("{word}.") {
        return true;
    }
    let part = |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.');
    lower.match_indices(word).any(|(at, _)| {
        let before = lower[..at].chars().next_back();
        let after = lower[at + word.len()..].chars().next();
        !before.is_some_and(part) && !after.is_some_and(part)
    })
}

/// Each place outside `src/sources/` that names a kind or a kind's metric.
fn kind_leaks(src: &Path, words: &[&str]) -> Vec<String> {
    let metrics = kind_metrics(src);
    // A folder under sources/ the layer table names (`sources::kind`) is no kind's.
    let units = layers();
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut out = Vec::new();
    for file in &files {
        let rel = file
            .strip_prefix(src)
            .expect("under src/")
            .to_string_lossy()
            .replace('\\', "/");
        if rel.starts_with("sources/") || names_kinds_by_design(&rel) {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("readable source");
        for (line, lit) in literals(&text) {
            for word in words {
                let allowed = KIND_WORDS_ALLOWED
                    .iter()
                    .any(|(f, l, _)| *f == rel && *l == lit);
                if names_word(&lit, word) && !allowed {
                    out.push(format!("{rel}:{line}: the kind {word:?} in \"{lit}\""));
                }
            }
            for (_, name) in &metrics {
                if lit.contains(name.as_str()) {
                    out.push(format!("{rel}:{line}: the metric {name} in \"{lit}\""));
                }
            }
        }
        // A kind's folder reached into (`crate::sources::table::…`; from the
        // binary, `inboxwatch::sources::table::…`).
        let module = module_of(src, file).unwrap_or_default();
        for (line, code) in code_only(&text).lines().enumerate() {
            let code = code.replace("inboxwatch::", "crate::");
            for target in imports(&module, &code) {
                if let [first, folder, ..] = target.as_slice()
                    && first == "sources"
                    && src.join("sources").join(folder).is_dir()
                    && !units.contains_key(&format!("sources::{folder}"))
                {
                    out.push(format!(
                        "{rel}:{}: imports {} from the kind's folder",
                        line + 1,
                        target.join("::")
                    ));
                }
            }
            for (konst, name) in &metrics {
                if code.contains(&format!("::{konst}"))
                    && code
                        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .any(|t| t == konst)
                {
                    out.push(format!("{rel}:{}: the metric {name} ({konst})", line + 1));
                }
            }
        }
    }
    out
}

#[test]
fn kinds_are_named_only_under_sources() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    // The `kind = "…"` words, from the registry.
    let found = kind_leaks(&src, inboxwatch::sources::SourceSpec::KINDS);
    assert!(
        found.is_empty(),
        "kinds named outside src/sources/ (docs/architecture.md, \"Adding a kind of \
         source\"):\n{}",
        found.join("\n")
    );
}

/// Guards the check itself: a kind compared by its word, named in a heading
/// or by its prefix of names, a kind's metric in a literal and as a
/// constant, and the binary importing from a kind's folder are each found; a longer name holding the word, a comment, the registry
/// and a unit test are not.
#[test]
fn the_check_finds_kinds_named_outside_sources() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let src = dir.path();
    let write = |rel: &str, text: &str| write_file(src, rel, text);
    write(
        "sources/example/mod.rs",
        "fn f() { let _ = \"example\"; }\n",
    );
    write(
        "main.rs",
        "use inboxwatch::sources::example::schema;\nuse inboxwatch::sources::SourceSpec;\n",
    );
    write(
        "telemetry/catalogue.rs",
        "names! {\n    EXAMPLE_LAG = \"example_lag_seconds\";\n    UP = \"inboxwatch_up\";\n}\n",
    );
    write(
        "http/pages.rs",
        "fn card(s: &S) {\n    if s.kind == \"example\" {}\n\
         \x20   let n = \"demo-example.db\"; // \"example\"\n\
         \x20   let m = metric::EXAMPLE_LAG;\n\
         \x20   let t = \"sum(example_lag_seconds)\";\n\
         \x20   let u = \"inboxwatch_up\";\n\
         \x20   let h = \"<h2>Example topics</h2>\";\n\
         \x20   let p = name.starts_with(\"example_\");\n}\n\
         #[cfg(test)]\nmod tests { const K: &str = \"example\"; }\n",
    );
    let found = kind_leaks(src, &["example"]);
    assert_eq!(
        found,
        [
            "http/pages.rs:2: the kind \"example\" in \"example\"",
            "http/pages.rs:5: the metric example_lag_seconds in \"sum(example_lag_seconds)\"",
            "http/pages.rs:7: the kind \"example\" in \"<h2>Example topics</h2>\"",
            "http/pages.rs:8: the kind \"example\" in \"example_\"",
            "http/pages.rs:4: the metric example_lag_seconds (EXAMPLE_LAG)",
            "main.rs:1: imports sources::example::schema from the kind's folder",
        ],
    );
}

// ---------------------------------------------------------------------------
// No loops between the files of one folder.

/// The files of one folder that import each other in a loop, each loop once
/// as `a ↔ b ↔ c` (module paths from the crate root, files of the same
/// folder only: the layers already order the units).
fn folder_loops(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut edges: BTreeMap<Vec<String>, Vec<Vec<String>>> = BTreeMap::new();
    for file in &files {
        let Some(module) = module_of(src, file) else {
            continue;
        };
        let text = std::fs::read_to_string(file).expect("readable source");
        let mut to: Vec<Vec<String>> = imports(&module, &code_only(&text))
            .into_iter()
            .filter_map(|t| {
                // The sibling file the path names: same parent, one level down.
                let parent = &module[..module.len().saturating_sub(1)];
                (!module.is_empty()
                    && t.len() > parent.len()
                    && t[..parent.len()] == *parent
                    && t[parent.len()] != module[module.len() - 1])
                    .then(|| t[..=parent.len()].to_vec())
            })
            .filter(|t| {
                let mut p = src.to_path_buf();
                t.iter().for_each(|s| p.push(s));
                p.with_extension("rs").is_file() || p.join("mod.rs").is_file()
            })
            .collect();
        to.sort();
        to.dedup();
        edges.insert(module, to);
    }
    // Each strongly connected set of more than one file is a loop.
    let nodes: Vec<&Vec<String>> = edges.keys().collect();
    let mut out = Vec::new();
    let mut placed: Vec<&Vec<String>> = Vec::new();
    for a in &nodes {
        if placed.contains(a) {
            continue;
        }
        let from_a = reachable(&edges, a);
        let mut set: Vec<&Vec<String>> = nodes
            .iter()
            .copied()
            .filter(|b| b != a && from_a.contains(b) && reachable(&edges, b).contains(a))
            .collect();
        if set.is_empty() {
            continue;
        }
        set.push(a);
        set.sort();
        placed.extend(set.iter().copied());
        out.push(
            set.iter()
                .map(|m| m.join("::"))
                .collect::<Vec<_>>()
                .join(" ↔ "),
        );
    }
    out
}

/// The modules `from` reaches through `edges` (itself not included unless
/// on a loop).
fn reachable<'a>(
    edges: &'a BTreeMap<Vec<String>, Vec<Vec<String>>>,
    from: &Vec<String>,
) -> Vec<&'a Vec<String>> {
    let mut seen: Vec<&Vec<String>> = Vec::new();
    let mut todo: Vec<&Vec<String>> = edges
        .get(from)
        .map(|t| t.iter().collect())
        .unwrap_or_default();
    while let Some(m) = todo.pop() {
        if seen.contains(&m) {
            continue;
        }
        seen.push(m);
        if let Some(next) = edges.get(m) {
            todo.extend(next.iter());
        }
    }
    seen
}

#[test]
fn files_of_a_folder_do_not_import_each_other_in_a_loop() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = folder_loops(&src);
    assert!(
        found.is_empty(),
        "files of one folder importing each other (move what both need into one of \
         them, or into a module of its own):\n{}",
        found.join("\n")
    );
}

/// Guards the check itself: two sibling files importing each other, and
/// three in a ring, are found; a file importing its sibling one way, and a
/// module importing its own children, are not.
#[test]
fn the_check_finds_a_loop_between_sibling_files() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let src = dir.path();
    let write = |rel: &str, text: &str| write_file(src, rel, text);
    write(
        "demo/mod.rs",
        "use self::sql::Sql;\nuse self::simulate::run;\n",
    );
    write("demo/simulate.rs", "use super::sql::Sql;\n");
    write("demo/sql.rs", "use super::simulate::Plan;\n");
    write("demo/drill.rs", "use super::sql::Sql;\n");
    write("sources/table/config.rs", "use super::events::E;\n");
    write("sources/table/events.rs", "use super::rules::R;\n");
    write(
        "sources/table/rules.rs",
        "use crate::sources::table::config::C;\n",
    );
    write("sources/table/mod.rs", "use self::config::C;\n");
    assert_eq!(
        folder_loops(src),
        [
            "demo::simulate ↔ demo::sql",
            "sources::table::config ↔ sources::table::events ↔ sources::table::rules",
        ]
    );
}
