//! Running a real library's workload and comparing /metrics with the library's own
//! counts: shared by `tests/libraries.rs` and the preset tests (`tests/preset_*.rs`).
//! A workload is a script or program that prints ONE JSON object with what the
//! library saw; the tests FAIL, they do not skip, when its runtime is missing.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::checks::{Expectations, Tol, render_diff};
use super::db::{Dialect, url_with_database};
use super::process::Proc;
use super::scenarios::{CONVERGE, POLL};
use super::workload::{ATTEMPT_BUCKETS, INBOX_EXACT_NAMES};
use super::{Agent, Db, Metrics, repo_path, stays, toml_str, unique_name, wait_until};

/// Where the scripts and their `node_modules` are, relative to the checkout.
pub const LIBRARIES: &str = "tests/libraries";
/// A script has its own deadline (50–60 s; the apalis workloads 110 s); this only
/// guards against a hang.
pub const NODE_TIMEOUT: Duration = Duration::from_secs(150);
/// How long the counters must stay put once they match (longer than `overlap = 10s`,
/// so every re-read of the overlap window has happened).
pub const STABLE: Duration = Duration::from_secs(12);

// ---------------------------------------------------------------------------------
// Running a library's script
// ---------------------------------------------------------------------------------

/// Panics unless `node` runs and the npm packages are installed: the tests FAIL, they
/// do not skip, without them.
pub fn require_node() {
    let dir = repo_path(LIBRARIES);
    match Command::new("node").arg("--version").output() {
        Ok(out) if out.status.success() => {}
        other => panic!(
            "`node --version` failed ({other:?}): tests/libraries.rs needs Node.js >= 18 \
             (scripts/test.sh installs it)"
        ),
    }
    assert!(
        dir.join("node_modules").is_dir(),
        "{LIBRARIES}/node_modules is missing: run `npm ci --prefix {LIBRARIES}` \
         (scripts/test.sh does it when it is missing)"
    );
}

/// `node tests/libraries/<script> --db <dsn> --schema <schema> --phase <phase> <args>`
/// to completion: its stdout. Panics (with its stderr) if node or the npm packages are
/// missing, if it fails, or if it runs longer than [`NODE_TIMEOUT`].
pub async fn node(script: &str, dsn: &str, schema: &str, phase: &str, args: &[&str]) -> String {
    require_node();
    let dir = repo_path(LIBRARIES);
    let mut cmd = Command::new("node");
    cmd.arg(dir.join(script))
        .args(["--db", dsn, "--schema", schema, "--phase", phase])
        .args(args)
        .current_dir(&dir);
    let what = format!(
        "node {LIBRARIES}/{script} --phase {phase} {}",
        args.join(" ")
    );
    run_workload(&what, &mut cmd).await
}

/// Runs a workload (any program: node, python, a built binary) to completion: its
/// stdout. Panics (with its stderr) if it cannot start, fails, or runs longer than
/// [`NODE_TIMEOUT`]. `what` names it in messages.
pub async fn run_workload(what: &str, cmd: &mut Command) -> String {
    let out = tempfile::tempdir().expect("a temp dir for the workload's output");
    let proc = Proc::spawn(what, cmd, out.path(), "workload");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = proc.exited() {
            break status;
        }
        if started.elapsed() > NODE_TIMEOUT {
            proc.kill();
            panic!(
                "`{what}` did not finish within {NODE_TIMEOUT:?}\n{}",
                proc.output_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        status.success(),
        "`{what}` failed ({status})\n{}",
        proc.output_tail()
    );
    eprintln!("`{what}` took {:.1} s", started.elapsed().as_secs_f64());
    proc.stdout()
}

/// The one JSON line a workload prints.
pub fn report(stdout: &str) -> Value {
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("the workload's stdout is not one JSON object ({e}):\n{stdout}"))
}

/// A count of the report at `path`.
pub fn count(v: &Value, path: &[&str]) -> f64 {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_f64()
        .unwrap_or_else(|| panic!("the report has no number at {path:?}: {v}"))
}

/// The keys of the object at `path` (event types / task identifiers).
pub fn keys(v: &Value, path: &[&str]) -> Vec<String> {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_object()
        .unwrap_or_else(|| panic!("the report has no object at {path:?}: {v}"))
        .keys()
        .cloned()
        .collect()
}

/// An `{"attempts": count}` object of the report as a map.
pub fn attempts_map(v: &Value, path: &[&str]) -> BTreeMap<i64, f64> {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_object()
        .unwrap_or_else(|| panic!("the report has no attempts object at {path:?}: {v}"))
        .iter()
        .map(|(a, c)| {
            let a: i64 = a.parse().expect("attempts are integers");
            (a, c.as_f64().expect("a count"))
        })
        .collect()
}

// ---------------------------------------------------------------------------------
// A fresh schema per test
// ---------------------------------------------------------------------------------

/// Drops and creates `schema`; the test drops it at its end (a failed test leaves it
/// for inspection: its name is printed).
pub async fn fresh_schema(db: &Db, short: &str) -> String {
    let schema = unique_name("lib", short).to_lowercase();
    db.pool
        .raw(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
        ))
        .await
        .unwrap_or_else(|e| panic!("create schema {schema}: {e}"));
    eprintln!("schema {schema}");
    schema
}

pub async fn drop_schema(db: &Db, schema: &str) {
    if let Err(e) = db
        .pool
        .raw(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .await
    {
        eprintln!("cleanup: drop schema {schema}: {e}");
    }
}

/// A fresh database on `db`'s server, for a library whose SQL names its own schema
/// (apalis's `apalis.jobs`) or uses the connection's database (apalis-mysql's
/// `jobs`): its name and a pool on it. [`drop_database`] drops it at the test's end
/// (a failed test leaves it for inspection: its name is printed).
pub async fn fresh_database(db: &Db, short: &str) -> (String, Db) {
    let name = unique_name("lib", short).to_lowercase();
    db.pool
        .raw(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap_or_else(|e| panic!("create database {name}: {e}"));
    eprintln!("database {name}");
    let dsn = url_with_database(&db.dsn, &name);
    let fresh = match db.dialect {
        Dialect::Postgres => Db::postgres_at(dsn).await,
        Dialect::Mysql => Db::mysql_at(dsn).await,
        Dialect::Sqlite => panic!("SQLite has no databases to create"),
    };
    (name, fresh)
}

/// Drops a database of [`fresh_database`], closing what is still connected to it.
pub async fn drop_database(db: &Db, name: &str) {
    let sql = match db.dialect {
        Dialect::Postgres => format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        _ => format!("DROP DATABASE IF EXISTS {name}"),
    };
    if let Err(e) = db.pool.raw(&sql).await {
        eprintln!("cleanup: drop database {name}: {e}");
    }
}

/// Rows of a query whose columns are all text.
pub async fn rows(db: &Db, sql: &str) -> Vec<Vec<String>> {
    db.query(sql, &[])
        .await
        .into_iter()
        .map(|r| r.into_iter().map(Option::unwrap_or_default).collect())
        .collect()
}

pub fn num(s: &str) -> f64 {
    s.trim()
        .parse()
        .unwrap_or_else(|_| panic!("not a number from the database: {s:?}"))
}

// ---------------------------------------------------------------------------------
// Expectations from the library's counts
// ---------------------------------------------------------------------------------

/// Counters and the attempts histogram of one event type of an inbox source (or of all
/// its series when `event_type` is `None`: a source with no event type mapped), from
/// the library's counts. `attempts` maps the attempts a row shows at completion to how
/// many rows completed so (both outcomes). The rules of `cursor = "none"`: a row shows
/// `a` failed attempts while failed, `a - 1` in processing, succeeded or dead, and the
/// counter follows the largest value seen — so the final attempt of a dead-lettered row
/// is not an attempt failure, it is the dead-lettering.
pub fn inbox_counts(
    x: &mut Expectations,
    source: &str,
    event_type: Option<&str>,
    received: f64,
    succeeded: f64,
    dead: f64,
    attempts: &BTreeMap<i64, f64>,
) {
    let mut l = vec![("source", source)];
    if let Some(t) = event_type {
        l.push(("event_type", t));
    }
    let with = |k: &'static str, v: &'static str| {
        let mut l = l.clone();
        l.push((k, v));
        l
    };
    x.push("inbox_messages_received_total", &l, received, Tol::Exact);
    for (outcome, v) in [("succeeded", succeeded), ("dead_lettered", dead)] {
        x.push(
            "inbox_messages_completed_total",
            &with("outcome", outcome),
            v,
            Tol::Exact,
        );
    }
    let failures: f64 = attempts
        .iter()
        .map(|(a, c)| (*a - 1).max(0) as f64 * c)
        .sum();
    x.push("inbox_attempt_failures_total", &l, failures, Tol::Exact);
    let n: f64 = attempts.values().sum();
    let sum: f64 = attempts.iter().map(|(a, c)| *a as f64 * c).sum();
    x.push("inbox_delivery_attempts_count", &l, n, Tol::Exact);
    x.push("inbox_delivery_attempts_sum", &l, sum, Tol::Exact);
    for le in ATTEMPT_BUCKETS.iter().copied().chain([f64::INFINITY]) {
        let le_txt = if le.is_infinite() {
            "+Inf".to_string()
        } else {
            le.to_string()
        };
        let c: f64 = attempts
            .iter()
            .filter(|(a, _)| **a as f64 <= le)
            .map(|(_, c)| c)
            .sum();
        let mut lb = l.clone();
        lb.push(("le", le_txt.as_str()));
        x.push("inbox_delivery_attempts_bucket", &lb, c, Tol::Exact);
    }
    // No started_at is mapped: no processing duration is ever observed.
    x.push(
        "inbox_processing_duration_seconds_count",
        &l,
        0.0,
        Tol::Exact,
    );
}

/// What every library inbox source must show once the library has settled: nothing
/// left in the backlog, no oldest age, nothing stuck, no row rejected for any reason,
/// the source up; and every exact name closed (no series nobody expected).
pub fn inbox_settled(x: &mut Expectations, source: &str) {
    let s = [("source", source)];
    x.push("inbox_backlog_messages", &s, 0.0, Tol::Exact);
    x.push("inbox_oldest_unprocessed_age_seconds", &s, 0.0, Tol::Exact);
    x.push("inbox_stuck_messages", &s, 0.0, Tol::Exact);
    x.push("inboxwatch_rows_rejected_total", &s, 0.0, Tol::Exact);
    x.push("inboxwatch_source_up", &s, 1.0, Tol::Exact);
    for name in INBOX_EXACT_NAMES.iter().copied().chain([
        "inbox_backlog_messages",
        "inbox_oldest_unprocessed_age_seconds",
        "inbox_stuck_messages",
    ]) {
        x.close(name, &s);
    }
}

/// Metric names that must have NO series at all for `source` (not even 0): a source
/// without a `deliveries` column cannot know deliveries or duplicates.
pub const ABSENT_WITHOUT_DELIVERIES: [&str; 2] =
    ["inbox_deliveries_total", "inbox_duplicate_deliveries_total"];

pub fn absent_diff(m: &Metrics, source: &str, names: &[&str]) -> Vec<String> {
    let scope = [("source", source)];
    names
        .iter()
        .flat_map(|name| m.series(name, &scope))
        .map(|s| {
            format!(
                "{}: must be absent (no deliveries column), got {}",
                s.series(),
                s.value
            )
        })
        .collect()
}

/// Waits until the scrape matches `exp` and `absent` holds, then checks that it keeps
/// matching for [`STABLE`] (nothing counted twice on re-reads or deletion look-ups).
pub async fn converge(agent: &Agent, exp: &Expectations, absent: &[(&str, &[&str])], what: &str) {
    let check = || async {
        let m = agent.try_scrape().await?;
        let mut d = exp.diff(&m);
        for (source, names) in absent {
            d.extend(absent_diff(&m, source, names));
        }
        if d.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} mismatches (expected from the library's counts vs /metrics):\n{}",
                d.len(),
                render_diff(&d)
            ))
        }
    };
    let started = Instant::now();
    if let Err(e) = wait_until(CONVERGE, check).await {
        panic!("{what}: /metrics did not reach the library's counts: {e}");
    }
    eprintln!(
        "{what}: /metrics matched the library's counts {:.1} s after the workload ended",
        started.elapsed().as_secs_f64()
    );
    if let Err(e) = stays(STABLE, check).await {
        panic!("{what}: counters moved after matching the library's counts:\n{e}");
    }
}

// ---------------------------------------------------------------------------------
// The agent's config
// ---------------------------------------------------------------------------------

/// One `[[sources]]` block on a preset (which gives the kind, table, column map and
/// statuses), with the knobs of every correctness test (poll every [`POLL`], overlap
/// 10 s); `table` overrides the preset's table (a schema of the test's own).
pub fn preset_source(preset: &str, name: &str, dsn: &str, table: Option<&str>) -> String {
    let table = table
        .map(|t| format!("table = {}\n", toml_str(t)))
        .unwrap_or_default();
    format!(
        "[[sources]]\nname = {}\npreset = {}\ndsn = {}\n{table}poll_interval = \"{}ms\"\n\
         overlap = \"10s\"\nevent_type_limit = 50\ntimeout = \"2s\"\n",
        toml_str(name),
        toml_str(preset),
        toml_str(dsn),
        POLL.as_millis()
    )
}
