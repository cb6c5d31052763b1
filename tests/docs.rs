//! The documentation holds together: every relative link in `README.md` and in
//! `docs/**/*.md` names a file or folder that exists, and every `#anchor` in
//! such a link (or an in-page `#anchor`) is a heading of the file it points
//! at, slugged as GitHub does. The README stays a page a newcomer reads to the
//! end: under 250 lines, the reference lives in `docs/`.
//!
//! Only std: the Markdown is read as lines, fenced code blocks and inline code
//! are skipped, and links are `[text](target)`, `![alt](target)` and
//! `[label]: target` definitions. Links with a scheme (`https:`, `mailto:`)
//! are not followed.

use std::collections::HashMap;
use std::fs;
use std::path::{Component, Path, PathBuf};

/// Most lines the README may have.
const README_MAX_LINES: usize = 250;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn readme_stays_under_250_lines() {
    let readme = fs::read_to_string(root().join("README.md")).expect("read README.md");
    let lines = readme.lines().count();
    assert!(
        lines < README_MAX_LINES,
        "README.md has {lines} lines; keep it under {README_MAX_LINES} and move reference \
         material into docs/"
    );
}

/// The README states the minimum Rust version beside its first command, the
/// one Cargo.toml's `rust-version` gives (issue 35).
#[test]
fn readme_states_the_minimum_rust_version() {
    let manifest = fs::read_to_string(root().join("Cargo.toml")).expect("read Cargo.toml");
    let version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("Cargo.toml sets rust-version");
    let readme = fs::read_to_string(root().join("README.md")).expect("read README.md");
    let quick_start = &readme[readme
        .find("## Quick start")
        .expect("a Quick start section")..];
    let first_command = quick_start.find("```sh").expect("a first command");
    assert!(
        quick_start[..first_command].contains(&format!("Rust {version} or newer")),
        "README.md does not say \"Rust {version} or newer\" before its first command"
    );
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let root = root();
    let mut files = vec![root.join("README.md")];
    markdown_files(&root.join("docs"), &mut files);
    assert!(files.len() > 1, "docs/ has no Markdown page");
    let broken = check(&root, &files);
    assert!(
        broken.is_empty(),
        "broken links in the documentation:\n{}",
        broken.join("\n")
    );
}

/// The checker finds what it must: a missing file, a missing anchor in
/// another page, a missing in-page anchor, and it accepts the good ones.
#[test]
fn the_checker_reports_broken_links() {
    let dir = std::env::temp_dir().join(format!("inboxwatch-docs-test-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("docs")).unwrap();
    fs::write(
        dir.join("README.md"),
        "# Title\n\n## Quick start: `demo` (1 minute)\n\n\
         [ok](docs/page.md#the-page) [ok](#quick-start-demo-1-minute) [ok](docs/)\n\
         [missing file](docs/nope.md) [missing anchor](docs/page.md#nope)\n\
         [in-page missing](#nowhere) [ok](https://example.com/x.md#y)\n\
         `[in code](docs/nope.md)`\n\n```md\n[in a fence](docs/nope.md)\n```\n\n\
         [def]: docs/gone.md\n",
    )
    .unwrap();
    fs::write(
        dir.join("docs/page.md"),
        "# The page\n\n## Repeated\n\n## Repeated\n\n\
         [ok](../README.md#title) [ok](#repeated-1) [missing](#repeated-2)\n\
         ```sh\n# not a heading\n```\n[missing](#not-a-heading)\n",
    )
    .unwrap();
    let files = vec![dir.join("README.md"), dir.join("docs/page.md")];
    let broken = check(&dir, &files);
    let _ = fs::remove_dir_all(&dir);
    let expected = [
        "README.md:6: docs/nope.md: no such file",
        "README.md:6: docs/page.md#nope: no heading \"nope\" in docs/page.md",
        "README.md:7: #nowhere: no heading \"nowhere\" in README.md",
        "README.md:14: docs/gone.md: no such file",
        "docs/page.md:7: #repeated-2: no heading \"repeated-2\" in docs/page.md",
        "docs/page.md:11: #not-a-heading: no heading \"not-a-heading\" in docs/page.md",
    ];
    assert_eq!(broken, expected);
}

#[test]
fn slugs_follow_github() {
    assert_eq!(slug("Linked traces (OTLP)"), "linked-traces-otlp");
    assert_eq!(
        slug("On-call lookups: `trace` and `dead-letters`"),
        "on-call-lookups-trace-and-dead-letters"
    );
    assert_eq!(
        slug("1. Build and push the image"),
        "1-build-and-push-the-image"
    );
    assert_eq!(slug("`[server]`"), "server");
    assert_eq!(
        slug("`[[sources]]`: inbox and outbox"),
        "sources-inbox-and-outbox"
    );
    assert_eq!(
        slug("max_tracked_events & memory"),
        "max_tracked_events--memory"
    );
    assert_eq!(slug("See [the page](x.md)"), "see-the-page");
}

/// Every `.md` file under `dir`, recursively, in a stable order.
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.map(|e| e.expect("read docs/").path()).collect();
    paths.sort();
    for path in paths {
        if path.is_dir() {
            markdown_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// One line per broken link: `file:line: target: why`.
fn check(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut anchors: HashMap<PathBuf, Vec<String>> = HashMap::new();
    let mut broken = Vec::new();
    for file in files {
        let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let here = rel(root, file);
        for (line_no, target) in links(&text) {
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let dest = if path.is_empty() {
                file.clone()
            } else {
                normalize(&file.parent().expect("a file has a folder").join(path))
            };
            if !dest.exists() {
                broken.push(format!("{here}:{line_no}: {target}: no such file"));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if dest.extension().is_some_and(|e| e == "md") {
                let known = anchors
                    .entry(dest.clone())
                    .or_insert_with(|| headings(&fs::read_to_string(&dest).unwrap_or_default()));
                if !known.iter().any(|a| a == anchor) {
                    broken.push(format!(
                        "{here}:{line_no}: {target}: no heading \"{anchor}\" in {}",
                        rel(root, &dest)
                    ));
                }
            } else if !is_line_anchor(anchor) {
                broken.push(format!(
                    "{here}:{line_no}: {target}: only .md files have heading anchors"
                ));
            }
        }
    }
    broken
}

/// `#L10` or `#L10-L20`, which GitHub gives every line of a file.
fn is_line_anchor(anchor: &str) -> bool {
    let digits = |s: &str| {
        s.strip_prefix('L')
            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
    };
    match anchor.split_once('-') {
        Some((a, b)) => digits(a) && digits(b),
        None => digits(anchor),
    }
}

fn rel(root: &Path, file: &Path) -> String {
    file.strip_prefix(root)
        .unwrap_or(file)
        .to_string_lossy()
        .replace('\\', "/")
}

/// Resolves `.` and `..` without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The lines outside fenced code blocks, numbered from 1.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = if trimmed.starts_with("```") {
            Some("```")
        } else if trimmed.starts_with("~~~") {
            Some("~~~")
        } else {
            None
        };
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(f), Some(m)) if f == m => fence = None,
            (Some(_), _) => {}
            (None, None) => out.push((i + 1, line)),
        }
    }
    out
}

/// A line without its inline code spans.
fn without_code(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for ch in line.chars() {
        if ch == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(ch);
        }
    }
    out
}

/// Relative link targets, with their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (line_no, line) in prose(text) {
        let line = without_code(line);
        // `[label]: target` definitions.
        let trimmed = line.trim_start();
        if trimmed.starts_with('[')
            && let Some(close) = trimmed.find("]:")
            && !trimmed[..close].contains('(')
        {
            let target = trimmed[close + 2..].split_whitespace().next().unwrap_or("");
            push_target(&mut out, line_no, target);
            continue;
        }
        // `[text](target)` and `![alt](target)`.
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split_whitespace().next().unwrap_or("");
            let target = target.trim_start_matches('<').trim_end_matches('>');
            push_target(&mut out, line_no, target);
            rest = &after[end..];
        }
    }
    out
}

fn push_target(out: &mut Vec<(usize, String)>, line_no: usize, target: &str) {
    let external = target.contains("://") || target.starts_with("mailto:");
    if !target.is_empty() && !external {
        out.push((line_no, target.to_string()));
    }
}

/// The anchors of a page's headings (`#` to `######`, outside code blocks),
/// a repeated one numbered as GitHub numbers it (`-1`, `-2`, …), plus any
/// `<a name="…">` / `<a id="…">`.
fn headings(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (_, line) in prose(text) {
        for key in ["<a name=\"", "<a id=\""] {
            if let Some(at) = line.find(key)
                && let Some(end) = line[at + key.len()..].find('"')
            {
                out.push(line[at + key.len()..at + key.len() + end].to_string());
            }
        }
        let hashes = line.bytes().take_while(|&b| b == b'#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let text = line[hashes..].trim().trim_end_matches('#').trim();
        let base = slug(text);
        let n = seen.entry(base.clone()).or_insert(0);
        out.push(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// GitHub's heading slug: the heading's text (links reduced to their text,
/// code to its content), lower case, every character that is not a letter, a
/// digit, a space, `-` or `_` dropped, and spaces turned into `-`.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // [text](url) → text
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](") else {
            break;
        };
        let Some(close) = rest[open + mid..].find(')') else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..open + mid]);
        rest = &rest[open + mid + close + 1..];
    }
    text.push_str(rest);
    text.chars()
        .flat_map(char::to_lowercase)
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}
