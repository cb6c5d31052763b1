//! `inboxwatch demo` through the binary: a newcomer sees live metrics with one
//! command and no services.

use crate::common;

use std::time::{Duration, Instant};

use common::{Agent, wait_until};

/// Every §3.1 inbox metric, by the sample name that carries its value.
const SECTION_3_1: [&str; 12] = [
    "inbox_messages_received_total",
    "inbox_deliveries_total",
    "inbox_duplicate_deliveries_total",
    "inbox_messages_completed_total",
    "inbox_attempt_failures_total",
    "inbox_processing_duration_seconds_count",
    "inbox_end_to_end_latency_seconds_count",
    "inbox_delivery_attempts_count",
    "inbox_processing_duration_quantile_seconds",
    "inbox_backlog_messages",
    "inbox_oldest_unprocessed_age_seconds",
    "inbox_stuck_messages",
];

/// Guards the demo promise (§6): within 30 s of `inboxwatch demo` starting, every
/// §3.1 metric has at least one non-zero sample — duplicates, retries, dead letters
/// (`outcome="dead_lettered"`), backlog, age and stuck rows included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_exports_every_inbox_metric_with_a_nonzero_sample_within_30s() {
    let started = Instant::now();
    let agent = Agent::demo();
    agent.wait_ready(Duration::from_secs(30)).await;
    let left = Duration::from_secs(30).saturating_sub(started.elapsed());
    let agent_ref = &agent;
    // A metric counts once any scrape showed it non-zero: the planted stuck
    // row is reclaimed by the consumer's lease 14 s in, and on a loaded
    // machine the first dead letter can come after that.
    let shown = std::sync::Mutex::new(std::collections::HashSet::<String>::new());
    let shown = &shown;
    let res = wait_until(left, || async move {
        let m = agent_ref.try_scrape().await?;
        let mut shown = shown.lock().expect("not poisoned");
        for name in SECTION_3_1 {
            if m.series(name, &[]).any(|s| s.value != 0.0) {
                shown.insert(name.to_string());
            }
        }
        let dead = "inbox_messages_completed_total{outcome=\"dead_lettered\"}";
        if m.series(
            "inbox_messages_completed_total",
            &[("outcome", "dead_lettered")],
        )
        .any(|s| s.value != 0.0)
        {
            shown.insert(dead.to_string());
        }
        let missing: Vec<&str> = SECTION_3_1
            .iter()
            .copied()
            .chain([dead])
            .filter(|name| !shown.contains(*name))
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "no non-zero sample yet for: {}",
                missing.join(", ")
            ))
        }
    })
    .await;
    if let Err(e) = res {
        panic!("demo after {:?}: {e}", started.elapsed());
    }

    // SIGTERM: the demo stops in order, exits 0 and removes its temporary database.
    let db = agent
        .stdout()
        .split("writes to ")
        .nth(1)
        .and_then(|rest| rest.split(" and the agent").next())
        .map(std::path::PathBuf::from)
        .expect("the demo prints the path of its database");
    assert!(db.exists(), "{} exists while the demo runs", db.display());
    let status = agent
        .terminate(Duration::from_secs(25))
        .expect("the demo exits within 25 s of SIGTERM");
    assert!(status.success(), "demo exit status after SIGTERM: {status}");
    let dir = db.parent().expect("the database lives in a directory");
    assert!(!dir.exists(), "{} is left behind", dir.display());
}

/// Issue 35: `inboxwatch demo` with its port taken exits 1 at once with the
/// message `run` gives, and leaves no directory behind (it hung before, holding
/// the SQLite pool for a consumer it had started first, deaf to Ctrl-C, its
/// directory left in the temp dir).
#[test]
fn demo_with_its_port_taken_exits_1_and_cleans_up() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let addr = taken.local_addr().expect("its address");
    let tmp = tempfile::tempdir().expect("a temp dir");
    let out = common::Cmd::new(["demo", "--listen", &addr.to_string()])
        .env("TMPDIR", tmp.path())
        .timeout(Duration::from_secs(60))
        .output();
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr
            .contains(&format!("server.listen: {addr} is already in use")),
        "{}",
        out.describe()
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("read the temp dir")
        .map(|e| e.expect("an entry").path())
        .collect();
    assert!(left.is_empty(), "the demo left {left:?} behind");
    drop(taken);
}

/// Issue 35: the demo's config (it holds the DSN) is readable by its user only,
/// in a directory only its user can enter.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demos_config_is_private_to_its_user() {
    use std::os::unix::fs::PermissionsExt as _;
    let tmp = tempfile::tempdir().expect("a temp dir");
    let agent = Agent::demo_with(&[]).env("TMPDIR", tmp.path()).start();
    agent.wait_ready(Duration::from_secs(30)).await;
    let dirs: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("read the temp dir")
        .map(|e| e.expect("an entry").path())
        .collect();
    assert_eq!(dirs.len(), 1, "one demo directory: {dirs:?}");
    let mode = |p: &std::path::Path| {
        std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode(&dirs[0]), 0o700, "{}", dirs[0].display());
    let config = dirs[0].join("inboxwatch.toml");
    assert_eq!(mode(&config), 0o600, "{}", config.display());
    agent.terminate(Duration::from_secs(30));
}
