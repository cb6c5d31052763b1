//! The one harness of the integration tests, split by concern:
//!
//! * [`agent`]: the binary under test — a subcommand run to completion ([`Cmd`],
//!   [`Outcome`]) or a long-running agent ([`Agent`]: config, environment, pid,
//!   SIGTERM/SIGKILL, `/readyz`, scrapes, its stderr);
//! * [`process`]: any child process with its output in files (the agent, a Kafka
//!   broker, Prometheus, Alertmanager);
//! * [`http`]: a minimal HTTP/1.1 GET; [`metrics`]: the Prometheus text format;
//! * [`db`]: the databases, DSNs, timestamps, [`Db`] with its tables and roles;
//! * [`workload`] and [`scenarios`]: ground-truth generators and the test bodies
//!   shared by the dialects; [`shapes`]: the generator for tables without a change
//!   cursor (issue 12); [`checks`]: expected series and diffs;
//! * [`proxy`]: a TCP proxy that can cut connections; [`otlp`]: an OTLP receiver;
//! * [`stack`]: Prometheus, Alertmanager, promtool/amtool, a webhook receiver;
//! * [`fake_kafka`]: a fake Kafka broker on `kafka-protocol`'s broker half (SASL
//!   session lifetimes, OAUTHBEARER, answers a test writes itself);
//! * `kafka.rs`: a tansu broker and rdkafka clients (included only by the Kafka
//!   test binaries, with `#[path]`, so that the others do not link librdkafka).
//!
//! Every test binary includes this module with `mod common;` and uses a different
//! subset of it, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod agent;
pub mod checks;
pub mod db;
pub mod fake_kafka;
pub mod grafana;
pub mod http;
pub mod ids;
pub mod library;
pub mod metrics;
pub mod nats;
pub mod otlp;
pub mod process;
pub mod proxy;
pub mod rabbitmq;
pub mod redis_streams;
pub mod scenarios;
pub mod shapes;
pub mod stack;
pub mod workload;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[allow(unused_imports)]
pub use agent::{Agent, BIN, Cmd, Outcome, READY_TIMEOUT, schema_indexes};
#[allow(unused_imports)]
pub use db::*;
#[allow(unused_imports)]
pub use http::{http_get, http_get_accepting};
#[allow(unused_imports)]
pub use metrics::{Metrics, Sample, label_matches, series_name};
#[allow(unused_imports)]
pub use proxy::Proxy;

// ---------------------------------------------------------------------------------
// Small utilities
// ---------------------------------------------------------------------------------

/// A TCP port on 127.0.0.1 for a server a test starts (the agent, a broker,
/// Prometheus, a receiver), reserved for this test process until it exits.
///
/// Binding `:0` and releasing the port is not enough: before the server binds it,
/// a test running beside this one may be handed the same port, or an outgoing
/// connection may take it as its local port. So ports are drawn below the
/// kernel's ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`), where
/// no outgoing connection lands, and each is claimed by locking a file named
/// after it in a directory all test processes share; the lock goes with the
/// process. A port something else listens on is skipped.
pub fn free_port() -> u16 {
    static HELD: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let range = 10_000..low.max(12_000);
    let dir = std::env::temp_dir().join("inboxwatch-test-ports");
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("create the port lock directory {}: {e}", dir.display()));
    for _ in 0..1000 {
        let port = fastrand::u16(range.clone());
        let path = dir.join(port.to_string());
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("open the port lock file {}: {e}", path.display()));
        if file.try_lock().is_err() {
            continue; // another test process holds it
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue; // in use by something else; the lock goes with `file`
        }
        HELD.lock().unwrap_or_else(|e| e.into_inner()).push(file);
        return port;
    }
    panic!("no free port in {range:?} after 1000 tries")
}

/// A name unique across parallel test processes: `{prefix}_{short}_{pid}_{random}`.
pub fn unique_name(prefix: &str, short: &str) -> String {
    format!(
        "{prefix}_{short}_{}_{:06x}",
        std::process::id(),
        fastrand::u32(..0x00ff_ffff)
    )
}

/// A TOML basic string literal.
pub fn toml_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Remove ANSI colour sequences (the agent's log formatter may emit them).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Polls `check` every 100 ms until it returns `Ok`, or `timeout` passes; the error
/// then carries the last reason `check` gave (typically a diff).
pub async fn wait_until<T, F, Fut>(timeout: Duration, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let started = Instant::now();
    loop {
        let last = match check().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if started.elapsed() >= timeout {
            return Err(format!("timed out after {timeout:?}; last state:\n{last}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Checks `check` every 200 ms for `duration`; the first failure ends it. For
/// "stays true" properties (no double counting on re-reads, the agent keeps running).
pub async fn stays<F, Fut>(duration: Duration, mut check: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let started = Instant::now();
    while started.elapsed() < duration {
        check()
            .await
            .map_err(|e| format!("after {:?}: {e}", started.elapsed()))?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// The repository's own files (configs, rules, dashboards)
// ---------------------------------------------------------------------------------

/// The checkout's root.
pub const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A path relative to the checkout's root.
pub fn repo_path(path: &str) -> PathBuf {
    Path::new(ROOT).join(path)
}

/// A file of the checkout (path relative to the root), as text.
pub fn repo_read(path: &str) -> String {
    let p = repo_path(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// Files of `dir` (relative to the root) whose names end with one of `suffixes`, as
/// paths relative to the root, sorted; panics if there is none.
pub fn repo_files(dir: &str, suffixes: &[&str]) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(repo_path(dir))
        .unwrap_or_else(|e| panic!("cannot read {dir}/: {e}"))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_file())
        .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_string))
        .filter(|n| suffixes.iter().any(|s| n.ends_with(s)))
        .map(|n| format!("{dir}/{n}"))
        .collect();
    found.sort();
    assert!(!found.is_empty(), "no {dir}/*{suffixes:?} files");
    found
}
