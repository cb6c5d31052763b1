//! The container image's build stage (issue 16: it did not build, because the
//! manifest names bench targets whose files the Dockerfile did not copy). No
//! container engine runs here, so this lays out exactly what the build stage's
//! `COPY` lines bring from the context, minus what `.dockerignore` excludes, and
//! runs the stage's `cargo build` command there as `cargo check` with the same
//! flags: the manifest, the lock file (`--locked`), the target's modules, build
//! scripts and `include_str!`/`include_bytes!` are all resolved by a check, so
//! a file the build needs and the image lacks fails it the same way. Code
//! generation and linking, which do not depend on which files were copied, are
//! skipped.
//!
//! Cost: the context sits at a fixed path outside the repository (so no
//! `.cargo/config.toml` of the checkout leaks in) with the sources' modification
//! times, and the check runs in the dev profile (`--release` or `--profile dist` dropped: which files
//! cargo reads does not depend on the profile) in the tests' target directory, so
//! it reuses what clippy checked there and is incremental after the first run.

use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// What the build stage does, read from the Dockerfile.
#[derive(Debug, Default)]
struct BuildStage {
    workdir: String,
    /// (sources relative to the context, destination as written).
    copies: Vec<(Vec<String>, String)>,
    /// The `cargo build …` command, split into words.
    build: Vec<String>,
}

/// Instructions with their `\`-continued lines joined; comments dropped.
fn instructions(dockerfile: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                out.push(std::mem::take(&mut current));
            }
        }
    }
    out
}

/// The stage the final image copies its binary from, as a [`BuildStage`].
fn build_stage(dockerfile: &str) -> BuildStage {
    let instructions = instructions(dockerfile);
    let name = instructions
        .iter()
        .find_map(|i| {
            let rest = i.strip_prefix("COPY --from=")?;
            Some(rest.split_whitespace().next()?.to_string())
        })
        .expect("the final stage copies the binary with COPY --from=STAGE");
    let start = instructions
        .iter()
        .position(|i| {
            let words: Vec<&str> = i.split_whitespace().collect();
            words.first() == Some(&"FROM")
                && words.len() == 4
                && words[2].eq_ignore_ascii_case("AS")
                && words[3] == name
        })
        .unwrap_or_else(|| panic!("no `FROM … AS {name}` stage"));
    let mut stage = BuildStage {
        workdir: "/".into(),
        ..BuildStage::default()
    };
    for instruction in instructions[start + 1..]
        .iter()
        .take_while(|i| !i.starts_with("FROM "))
    {
        let (keyword, rest) = instruction
            .split_once(' ')
            .unwrap_or((instruction.as_str(), ""));
        match keyword {
            "WORKDIR" => stage.workdir = rest.trim().to_string(),
            "COPY" => {
                let mut words: Vec<String> = rest
                    .split_whitespace()
                    .filter(|w| !w.starts_with("--chown") && !w.starts_with("--chmod"))
                    .map(str::to_string)
                    .collect();
                assert!(
                    !rest.trim_start().starts_with('[')
                        && !words.iter().any(|w| w.starts_with("--")),
                    "`COPY {rest}`: flags other than --chown/--chmod and the JSON form are not simulated; extend tests/image.rs"
                );
                let dest = words.pop().expect("COPY has a destination");
                assert!(!words.is_empty(), "`COPY {rest}` has no source");
                stage.copies.push((words, dest));
            }
            "RUN" if rest.trim_start().starts_with("cargo build ") => {
                assert!(
                    stage.build.is_empty(),
                    "two `RUN cargo build` lines in the build stage"
                );
                assert!(
                    !rest.contains(['&', '|', ';', '$', '`']),
                    "`RUN {rest}` is not one plain command; extend tests/image.rs"
                );
                stage.build = rest.split_whitespace().map(str::to_string).collect();
            }
            _ => panic!(
                "the build stage's `{instruction}` is not simulated by tests/image.rs; extend it"
            ),
        }
    }
    assert!(
        !stage.build.is_empty(),
        "no `RUN cargo build …` in the build stage"
    );
    stage
}

/// `.dockerignore` as Docker reads it: last matching pattern wins, `!` re-includes,
/// `*` and `?` within a path component, `**` across components, and a pattern that
/// matches a directory excludes everything under it.
struct Ignore(Vec<(bool, Vec<String>)>);

impl Ignore {
    fn parse(text: &str) -> Ignore {
        let patterns = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| {
                let (include, pattern) = match l.strip_prefix('!') {
                    Some(p) => (true, p.trim()),
                    None => (false, l),
                };
                let parts = pattern
                    .split('/')
                    .filter(|p| !p.is_empty() && *p != ".")
                    .map(str::to_string)
                    .collect();
                (include, parts)
            })
            .collect();
        Ignore(patterns)
    }

    /// Whether the context-relative `path` is left out of the context.
    fn excludes(&self, path: &str) -> bool {
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let mut excluded = false;
        for (include, pattern) in &self.0 {
            let pattern: Vec<&str> = pattern.iter().map(String::as_str).collect();
            if (1..=parts.len()).any(|n| glob_path(&pattern, &parts[..n])) {
                excluded = !include;
            }
        }
        excluded
    }
}

fn glob_path(pattern: &[&str], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((&"**", rest)) => (0..=path.len()).any(|skip| glob_path(rest, &path[skip..])),
        Some((first, rest)) => path.split_first().is_some_and(|(component, tail)| {
            glob_component(first.as_bytes(), component.as_bytes()) && glob_path(rest, tail)
        }),
    }
}

fn glob_component(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|skip| glob_component(rest, &text[skip..])),
        Some((b'?', rest)) => !text.is_empty() && glob_component(rest, &text[1..]),
        Some((c, rest)) => text.first() == Some(c) && glob_component(rest, &text[1..]),
    }
}

/// Copies the context-relative `source` (file or directory contents) to `dest`,
/// leaving out what `.dockerignore` excludes, keeping modification times.
fn copy_in(ignore: &Ignore, source: &str, dest: &Path) {
    let from = Path::new(ROOT).join(source);
    let meta = std::fs::metadata(&from).unwrap_or_else(|e| panic!("COPY source {source}: {e}"));
    if meta.is_dir() {
        std::fs::create_dir_all(dest).expect("create a directory in the context");
        let mut entries: Vec<_> = std::fs::read_dir(&from)
            .unwrap_or_else(|e| panic!("read {source}: {e}"))
            .map(|e| e.expect("a directory entry").file_name())
            .collect();
        entries.sort();
        for name in entries {
            let name = name.to_str().expect("UTF-8 file names");
            let child = format!("{}/{name}", source.trim_end_matches('/'));
            if !ignore.excludes(&child) {
                copy_in(ignore, &child, &dest.join(name));
            }
        }
    } else {
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).expect("create a directory in the context");
        }
        std::fs::copy(&from, dest).unwrap_or_else(|e| panic!("copy {source}: {e}"));
        let modified = meta.modified().expect("a modification time");
        std::fs::File::options()
            .write(true)
            .open(dest)
            .and_then(|f| f.set_modified(modified))
            .expect("keep the modification time");
    }
}

/// Lays out the build stage's working directory under `context`.
fn lay_out(stage: &BuildStage, ignore: &Ignore, context: &Path) {
    for (sources, dest) in &stage.copies {
        let dest_path = if dest.starts_with('/') {
            let inside = Path::new(dest)
                .strip_prefix(&stage.workdir)
                .unwrap_or_else(|_| panic!("COPY to {dest}, outside WORKDIR {}", stage.workdir));
            context.join(inside)
        } else {
            context.join(dest)
        };
        let into_dir = dest.ends_with('/') || sources.len() > 1;
        for source in sources {
            let source = source.trim_start_matches("./").trim_end_matches('/');
            assert!(
                !source.contains(['*', '?', '[']),
                "COPY wildcards are not simulated; extend tests/image.rs"
            );
            assert!(
                !ignore.excludes(source),
                "COPY {source}: excluded by .dockerignore, so the build would fail"
            );
            let is_dir = Path::new(ROOT).join(source).is_dir();
            let target = if into_dir && !is_dir {
                dest_path.join(Path::new(source).file_name().expect("a file name"))
            } else {
                dest_path.clone()
            };
            copy_in(ignore, source, &target);
        }
    }
}

/// Guards the image build (issue 16): the Dockerfile's build command succeeds on
/// exactly what its build stage copies. Before the fix it failed with "can't find
/// `kafka_scale` bench at `benches/kafka_scale.rs`".
#[test]
fn the_build_stage_builds_from_what_the_dockerfile_copies() {
    let read = |p: &str| {
        std::fs::read_to_string(Path::new(ROOT).join(p))
            .unwrap_or_else(|e| panic!("cannot read {p}: {e}"))
    };
    let stage = build_stage(&read("Dockerfile"));
    let ignore = Ignore::parse(&read(".dockerignore"));
    // One fixed place per checkout, so that the check stays incremental.
    let checkout: u64 = ROOT.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let context = std::env::temp_dir().join(format!("inboxwatch-image-{checkout:016x}"));
    if context.exists() {
        std::fs::remove_dir_all(&context).expect("clear the previous context");
    }
    lay_out(&stage, &ignore, &context);

    let mut args = stage.build[1..].to_vec();
    assert_eq!(args[0], "build", "{:?}", stage.build);
    args[0] = "check".into();
    // Which files cargo needs does not depend on the profile: checked in the dev
    // profile, the check shares the dependencies clippy and the tests already
    // checked in this target directory instead of a cold release-profile check of
    // every crate (and of sqlite's C code at -O3).
    // The image's build names its own profile (`--profile dist`): dropped too.
    take_profile(&mut args);
    // With a bench beside the binary, as clippy's `--all-targets`: cargo then
    // resolves the dependencies' features with the dev-dependencies' (tonic's
    // server, hyper-util's `server-auto`, bitflags' `std`), as clippy and the
    // test build did, and checks none of them again. For the binary alone it
    // resolved other features and checked most dependencies again: 518 s of a
    // cold CI pass beside the suite, where it took 24-37 s before the RabbitMQ
    // and gRPC test servers' dev-dependencies. `table` needs nothing the build
    // stage does not copy (the Kafka bench reads `tests/common/`).
    args.extend(["--bench".to_string(), "table".to_string()]);
    let target_dir: PathBuf = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .to_path_buf();
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let started = std::time::Instant::now();
    let mut command = Command::new(cargo);
    // Without what cargo sets for this test's own run (`CARGO_MANIFEST_DIR`,
    // `CARGO_PKG_*`, …): build scripts that read them (ring's, rustls') would see
    // an environment the suite's other builds do not have, re-run, and leave
    // those crates and everything above them to be rebuilt by the next `cargo`
    // in this target directory.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_BIN_EXE_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
            ]
            .contains(&key.as_ref())
        {
            command.env_remove(key.as_ref());
        }
    }
    let out = command
        .args(&args)
        .current_dir(&context)
        .env("CARGO_TARGET_DIR", &target_dir)
        .output()
        .unwrap_or_else(|e| panic!("run {cargo}: {e}"));
    eprintln!(
        "`cargo {}` in {} took {:?}",
        args.join(" "),
        context.display(),
        started.elapsed()
    );
    assert!(
        out.status.success(),
        "the image's build stage fails (`{}`, run as `cargo {}` on what the Dockerfile copies):\n{}",
        stage.build.join(" "),
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Removes the arguments of a cargo command line that choose its profile
/// (`--release`, `-r`, `--profile NAME`, `--profile=NAME`); returns the
/// profile they named, the last one if several.
fn take_profile(args: &mut Vec<String>) -> Option<String> {
    let mut named = None;
    let mut kept = Vec::with_capacity(args.len());
    let mut rest = std::mem::take(args).into_iter();
    while let Some(a) = rest.next() {
        match a.as_str() {
            "--release" | "-r" => named = Some("release".to_string()),
            "--profile" => named = rest.next(),
            _ => match a.strip_prefix("--profile=") {
                Some(name) => named = Some(name.to_string()),
                None => kept.push(a),
            },
        }
    }
    *args = kept;
    named
}

/// The final stage copies the binary from where the build stage's profile
/// puts it: `target/release` for `--release`, `target/NAME` for `--profile
/// NAME` or `--profile=NAME`, `target/debug` for dev and test (the image
/// builds the dist profile; a stale `target/release` path would fail only in
/// `docker build`).
#[test]
fn the_final_stage_copies_the_binary_the_build_made() {
    let dockerfile =
        std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).expect("read the Dockerfile");
    let stage = build_stage(&dockerfile);
    // Cargo puts the dev and test profiles' builds in `target/debug`.
    let profile = match take_profile(&mut stage.build.clone()) {
        Some(name) if name != "dev" && name != "test" => name,
        _ => "debug".to_string(),
    };
    let from = instructions(&dockerfile)
        .into_iter()
        .find_map(|i| {
            let rest = i.strip_prefix("COPY --from=")?.to_string();
            Some(rest.split_whitespace().nth(1)?.to_string())
        })
        .expect("COPY --from=STAGE SOURCE DEST");
    let want = format!(
        "{}/target/{profile}/inboxwatch",
        stage.workdir.trim_end_matches('/')
    );
    assert_eq!(from, want, "the image copies another build's binary");
}

#[test]
fn dockerignore_patterns_match_as_docker_does() {
    let ignore = Ignore::parse("# comment\ntarget/\n/.git\n**/*.tmp\ndocs/*.md\n!docs/keep.md\n");
    for excluded in [
        "target",
        "target/release/x",
        ".git/HEAD",
        "a/b/c.tmp",
        "x.tmp",
        "docs/a.md",
    ] {
        assert!(ignore.excludes(excluded), "{excluded} should be excluded");
    }
    for kept in [
        "src/main.rs",
        "targets",
        "docs/keep.md",
        "docs/sub/a.md",
        "Cargo.toml",
    ] {
        assert!(!ignore.excludes(kept), "{kept} should be kept");
    }
}

#[test]
fn the_build_stage_is_read_from_the_dockerfile() {
    let stage = build_stage(
        "FROM rust AS build\nWORKDIR /src\nCOPY a b ./\nCOPY src \\\n  ./src\n\
         RUN cargo build --release --locked --bin x\nFROM debian\nCOPY --from=build /src/x /x\n",
    );
    assert_eq!(stage.workdir, "/src");
    assert_eq!(
        stage.copies,
        vec![
            (vec!["a".to_string(), "b".to_string()], "./".to_string()),
            (vec!["src".to_string()], "./src".to_string()),
        ]
    );
    assert_eq!(
        stage.build,
        ["cargo", "build", "--release", "--locked", "--bin", "x"]
    );
}
