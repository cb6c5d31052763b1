//! The `procrastinate` and `pgqueuer` presets against the REAL libraries (PyPI, pinned
//! in `tests/libraries/python/requirements.txt`, installed by `scripts/test.sh` into
//! `tests/libraries/python/.venv`): each applies its own schema in a fresh schema, the
//! agent starts on the empty tables with the preset (its table moved to that schema,
//! the events log following it), and a Python workload runs through the library's own
//! API and worker — successes, failures retried until they succeed, failures for good,
//! re-sends of existing keys the library refuses — and prints the library's counts.
//!
//! Neither jobs table carries the times (procrastinate keeps them only in
//! `procrastinate_events`, pgqueuer deletes finished rows and keeps `pgqueuer_log`):
//! both presets count from the log (`cursor = "events"`). Every counter per task /
//! entrypoint must equal the library's counts, the duration sums equal the log's, the
//! gauges end at 0, and nothing is rejected. The tables are checked against the
//! library's counts first, so that a mismatch with /metrics is the agent's.
//!
//! Needs PostgreSQL (`INBOXWATCH_TEST_PG`) and the venv: without them the tests FAIL,
//! they do not skip.

use crate::common;

use std::collections::BTreeMap;
use std::process::Command;

use common::checks::{Expectations, Tol};
use common::library::*;
use common::{Agent, Db, READY_TIMEOUT, repo_path};

/// The venv's interpreter, relative to the checkout.
const PYTHON: &str = "tests/libraries/python/.venv/bin/python";

/// `python tests/libraries/python/<script> --db <dsn> --schema <schema> --phase
/// <phase>` to completion: its stdout. Panics if the venv is missing.
async fn python(script: &str, dsn: &str, schema: &str, phase: &str) -> String {
    let python = repo_path(PYTHON);
    assert!(
        python.is_file(),
        "{PYTHON} is missing: scripts/test.sh creates the venv from \
         tests/libraries/python/requirements.txt"
    );
    let dir = repo_path("tests/libraries/python");
    let mut cmd = Command::new(python);
    cmd.arg(dir.join(script))
        .args(["--db", dsn, "--schema", schema, "--phase", phase])
        .current_dir(&dir);
    run_workload(&format!("{script} --phase {phase}"), &mut cmd).await
}

/// Completions of one event type and their duration sums (seconds), read from the log.
#[derive(Debug, Default, Clone, Copy)]
struct Durations {
    n: f64,
    processing: f64,
    end_to_end: f64,
}

/// Per event type: completions, and the sums of (end − the last start before it) and
/// (end − the first arrival), from an events log. `log` names the log's columns as
/// (table, job column, kind column, time column), `of_type` the SQL giving a log row's
/// event type (`e` is the terminal event).
#[allow(clippy::too_many_arguments)]
async fn durations(
    db: &Db,
    log: (&str, &str, &str, &str),
    of_type: &str,
    received: &str,
    started: &str,
    terminal: &str,
) -> BTreeMap<String, Durations> {
    let (table, job, kind, at) = log;
    rows(
        db,
        &format!(
            "SELECT {of_type}, CAST(count(*) AS text), \
             CAST(sum(EXTRACT(EPOCH FROM e.{at} - (SELECT max(s.{at}) FROM {table} s \
               WHERE s.{job} = e.{job} AND s.{kind} = '{started}' AND s.id <= e.id))) AS text), \
             CAST(sum(EXTRACT(EPOCH FROM e.{at} - (SELECT min(r.{at}) FROM {table} r \
               WHERE r.{job} = e.{job} AND r.{kind} = '{received}'))) AS text) \
             FROM {table} e WHERE CAST(e.{kind} AS text) IN ({terminal}) GROUP BY 1"
        ),
    )
    .await
    .into_iter()
    .map(|r| {
        let d = Durations {
            n: num(&r[1]),
            processing: num(&r[2]),
            end_to_end: num(&r[3]),
        };
        (r[0].clone(), d)
    })
    .collect()
}

/// The counters of one event type from the library's counts (see [`inbox_counts`]),
/// with the durations an events log gives: every completion observes its processing
/// time (from its last start) and its end-to-end latency (from its first arrival).
#[allow(clippy::too_many_arguments)]
fn event_type_counts(
    x: &mut Expectations,
    source: &str,
    t: &str,
    received: f64,
    succeeded: f64,
    dead: f64,
    attempts: &BTreeMap<i64, f64>,
    d: Durations,
) {
    let mut own = Expectations::default();
    inbox_counts(
        &mut own,
        source,
        Some(t),
        received,
        succeeded,
        dead,
        attempts,
    );
    // inbox_counts expects no processing time (no started_at); the log has every start.
    own.items
        .retain(|e| e.name != "inbox_processing_duration_seconds_count");
    x.extend(own);
    let l = [("source", source), ("event_type", t)];
    assert_eq!(
        d.n,
        succeeded + dead,
        "HARNESS: the log's completions of {t} differ from the library's counts"
    );
    for (name, sum) in [
        ("inbox_processing_duration_seconds", d.processing),
        ("inbox_end_to_end_latency_seconds", d.end_to_end),
    ] {
        x.push(&format!("{name}_count"), &l, d.n, Tol::Exact);
        x.push(
            &format!("{name}_sum"),
            &l,
            sum,
            Tol::Abs(0.001 * d.n + 1e-6),
        );
    }
}

/// The library's attempts histogram of one event type (both outcomes).
fn attempts_of(r: &serde_json::Value, by: &str, t: &str) -> BTreeMap<i64, f64> {
    let mut attempts = BTreeMap::new();
    for outcome in ["succeeded", "failed"] {
        for (a, c) in attempts_map(r, &[by, t, "attempts", outcome]) {
            *attempts.entry(a).or_default() += c;
        }
    }
    attempts
}

/// Asserts the totals over event types the workload was designed for.
fn check_design(r: &serde_json::Value, by: &str, received: &str) {
    let types = keys(r, &[by]);
    let total = |field: &str| -> f64 { types.iter().map(|t| count(r, &[by, t, field])).sum() };
    let design = [
        (received, total(received), 200.0),
        ("succeeded", total("succeeded"), 180.0),
        ("failed for good", total("failed"), 20.0),
        ("duplicates refused", total("rejected_duplicates"), 40.0),
    ];
    for (what, got, want) in design {
        assert_eq!(
            got, want,
            "the library's run differs from the design: {what}\n{r}"
        );
    }
    assert!(types.len() >= 2, "at least two event types: {r}");
}

// ---------------------------------------------------------------------------------
// procrastinate
// ---------------------------------------------------------------------------------

/// Guards the procrastinate preset, watching procrastinate 3.10.0's own
/// `procrastinate_jobs` and `procrastinate_events`, written by its own defer and worker:
/// per task, the deferred jobs, successes, jobs failed for good, failed attempts and the
/// attempts histogram equal the library's counts, the durations equal the log's, the
/// gauges end at 0, no row is rejected, and deliveries / duplicates are absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn procrastinate_preset_matches_the_librarys_counts() {
    const SCRIPT: &str = "procrastinate_workload.py";
    let db = Db::postgres().await;
    let schema = fresh_schema(&db, "procr").await;
    python(SCRIPT, &db.dsn, &schema, "setup").await;

    let agent = Agent::start(&preset_source(
        "procrastinate",
        "procrastinate",
        &db.dsn,
        Some(&format!("{schema}.procrastinate_jobs")),
    ));
    agent.wait_ready(READY_TIMEOUT).await;

    let r = report(&python(SCRIPT, &db.dsn, &schema, "run").await);
    eprintln!("library counts: {r}");
    check_design(&r, "by_task", "deferred");
    let tasks = keys(&r, &["by_task"]);

    // The jobs table agrees with the library: (task, status, attempts) -> jobs, where
    // procrastinate's attempts equal the runs the task code saw (a harness check).
    let table: BTreeMap<(String, String, i64), f64> = rows(
        &db,
        &format!(
            "SELECT task_name, CAST(status AS text), CAST(attempts AS text), \
             CAST(count(*) AS text) FROM {schema}.procrastinate_jobs GROUP BY 1, 2, 3"
        ),
    )
    .await
    .into_iter()
    .map(|r| ((r[0].clone(), r[1].clone(), num(&r[2]) as i64), num(&r[3])))
    .collect();
    let mut library = BTreeMap::new();
    for t in &tasks {
        for outcome in ["succeeded", "failed"] {
            for (a, c) in attempts_map(&r, &["by_task", t, "attempts", outcome]) {
                library.insert((t.clone(), outcome.to_string(), a), c);
            }
            assert_eq!(
                attempts_map(&r, &["by_task", t, "attempts", outcome]),
                attempts_map(&r, &["by_task", t, "library_attempts", outcome]),
                "the runs the task code saw differ from procrastinate's attempts"
            );
        }
    }
    assert_eq!(
        table, library,
        "HARNESS: procrastinate_jobs (task, status, attempts) -> jobs differs from the \
         library's counts"
    );

    let events = format!("{schema}.procrastinate_events");
    let d = durations(
        &db,
        (&events, "job_id", "type", "at"),
        &format!("(SELECT task_name FROM {schema}.procrastinate_jobs j WHERE j.id = e.job_id)"),
        "deferred",
        "started",
        "'succeeded', 'failed'",
    )
    .await;
    let mut x = Expectations::default();
    for t in &tasks {
        event_type_counts(
            &mut x,
            "procrastinate",
            t,
            count(&r, &["by_task", t, "deferred"]),
            count(&r, &["by_task", t, "succeeded"]),
            count(&r, &["by_task", t, "failed"]),
            &attempts_of(&r, "by_task", t),
            d.get(t).copied().unwrap_or_default(),
        );
    }
    inbox_settled(&mut x, "procrastinate");
    converge(
        &agent,
        &x,
        &[("procrastinate", &ABSENT_WITHOUT_DELIVERIES)],
        "procrastinate",
    )
    .await;

    drop(agent);
    drop_schema(&db, &schema).await;
}

// ---------------------------------------------------------------------------------
// pgqueuer
// ---------------------------------------------------------------------------------

/// Guards the pgqueuer preset, watching pgqueuer 1.6.0's own `pgqueuer` queue (finished
/// rows deleted, jobs failed for good held on one entrypoint) and `pgqueuer_log`, written
/// by its own enqueue and queue manager with database-level retries: per entrypoint, the
/// enqueued jobs, successes, jobs failed for good, failed attempts and the attempts
/// histogram equal the library's counts, the durations equal the log's, the gauges end
/// at 0, no row is rejected, and deliveries / duplicates are absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pgqueuer_preset_matches_the_librarys_counts() {
    const SCRIPT: &str = "pgqueuer_workload.py";
    let db = Db::postgres().await;
    let schema = fresh_schema(&db, "pgq").await;
    python(SCRIPT, &db.dsn, &schema, "setup").await;

    let agent = Agent::start(&preset_source(
        "pgqueuer",
        "pgqueuer",
        &db.dsn,
        Some(&format!("{schema}.pgqueuer")),
    ));
    agent.wait_ready(READY_TIMEOUT).await;

    let r = report(&python(SCRIPT, &db.dsn, &schema, "run").await);
    eprintln!("library counts: {r}");
    check_design(&r, "by_entrypoint", "enqueued");
    let entrypoints = keys(&r, &["by_entrypoint"]);

    // The log agrees with the library: its statistics per status, and per job the
    // picks before its terminal status equal the runs the handlers saw (a harness check).
    let log = format!("{schema}.pgqueuer_log");
    let statuses: BTreeMap<(String, String), f64> = rows(
        &db,
        &format!(
            "SELECT entrypoint, CAST(status AS text), CAST(count(*) AS text) FROM {log} \
             GROUP BY 1, 2"
        ),
    )
    .await
    .into_iter()
    .map(|r| ((r[0].clone(), r[1].clone()), num(&r[2])))
    .collect();
    let mut library = BTreeMap::new();
    for e in &entrypoints {
        for s in keys(&r, &["by_entrypoint", e, "log"]) {
            library.insert(
                (e.clone(), s.clone()),
                count(&r, &["by_entrypoint", e, "log", &s]),
            );
        }
    }
    assert_eq!(
        statuses, library,
        "HARNESS: pgqueuer_log (entrypoint, status) -> rows differs from the library's \
         log_statistics"
    );
    let picks: BTreeMap<(String, String, i64), f64> = rows(
        &db,
        &format!(
            "SELECT entrypoint, outcome, CAST(picks AS text), CAST(count(*) AS text) FROM \
             (SELECT job_id, min(entrypoint) AS entrypoint, \
               max(CASE WHEN status = 'successful' THEN 'succeeded' \
                 WHEN status IN ('exception', 'failed') THEN 'failed' END) AS outcome, \
               count(*) FILTER (WHERE status = 'picked') AS picks \
              FROM {log} GROUP BY job_id) j GROUP BY 1, 2, 3"
        ),
    )
    .await
    .into_iter()
    .map(|r| ((r[0].clone(), r[1].clone(), num(&r[2]) as i64), num(&r[3])))
    .collect();
    let mut library = BTreeMap::new();
    for e in &entrypoints {
        for outcome in ["succeeded", "failed"] {
            for (a, c) in attempts_map(&r, &["by_entrypoint", e, "attempts", outcome]) {
                library.insert((e.clone(), outcome.to_string(), a), c);
            }
        }
    }
    assert_eq!(
        picks, library,
        "HARNESS: pgqueuer_log (entrypoint, outcome, picks) -> jobs differs from the runs \
         the handlers saw"
    );

    let d = durations(
        &db,
        (&log, "job_id", "status", "created"),
        "e.entrypoint",
        "queued",
        "picked",
        "'successful', 'exception', 'failed'",
    )
    .await;
    let mut x = Expectations::default();
    for e in &entrypoints {
        event_type_counts(
            &mut x,
            "pgqueuer",
            e,
            count(&r, &["by_entrypoint", e, "enqueued"]),
            count(&r, &["by_entrypoint", e, "succeeded"]),
            count(&r, &["by_entrypoint", e, "failed"]),
            &attempts_of(&r, "by_entrypoint", e),
            d.get(e).copied().unwrap_or_default(),
        );
    }
    inbox_settled(&mut x, "pgqueuer");
    converge(
        &agent,
        &x,
        &[("pgqueuer", &ABSENT_WITHOUT_DELIVERIES)],
        "pgqueuer",
    )
    .await;

    drop(agent);
    drop_schema(&db, &schema).await;
}
