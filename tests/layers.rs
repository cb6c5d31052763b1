//! Guards the shape of `src/` (docs/architecture.md, "Layers"): every module
//! belongs to a layer of the table in docs/architecture.md, and a module
//! imports only from its own unit or from a lower layer — so no import loops
//! between units, and the layers point one way.
//!
//! Imports are read from the source text: every `crate::…`, `super::…` and
//! `self::…` path outside comments, with `use` groups expanded, resolved
//! against the file's own module path.

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

/// Guards the check itself: an upward import, a sideways one between units
/// of one layer, and a module in no layer are each found.
#[test]
fn the_check_finds_upward_and_sideways_imports() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let src = dir.path();
    let write = |rel: &str, text: &str| {
        let path = src.join(rel);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    };
    write("checks.rs", "use crate::app::Agent;\n");
    write(
        "sources/table/mod.rs",
        "use super::{kafka::KafkaSpec, run::Source};\n",
    );
    write(
        "sources/kafka/mod.rs",
        "// crate::app is only named in a comment\nfn f() { let _ = \"crate::app\"; }\n",
    );
    write("nowhere.rs", "");
    let found = violations(src);
    let says = |what: &str| found.iter().any(|l| l.contains(what));
    assert!(
        says("checks.rs: checks (layer 0) imports app::Agent from app"),
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
