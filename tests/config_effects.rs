//! Documented settings that change what the agent exports, each through the binary
//! against a ground truth the test writes itself (issue 29, item 3).
//!
//! Every table test runs on SQLite (no server) with the contract table of
//! `inboxwatch schema`; its rows are written with SQL after the agent is ready
//! (rows present at the start are a baseline, not counted), times from the
//! database clock.

use crate::common;

use std::time::{Duration, Instant};

use common::checks::{Expectations, Tol, render_diff};
use common::scenarios::{CONVERGE, inbox_source_toml, outbox_source_toml, wait_for_expectations};
use common::{Agent, Db, Metrics, READY_TIMEOUT, stays, wait_until};

/// The SQLite database clock in the canonical text of the contract table.
const NOW: &str = "strftime('%Y-%m-%d %H:%M:%f','now')";

/// The database clock `secs` seconds ago.
fn ago(secs: f64) -> String {
    format!("strftime('%Y-%m-%d %H:%M:%f','now','-{secs:.3} seconds')")
}

/// One statement (or script); panics with it on error.
async fn sql(db: &Db, stmt: &str) {
    db.pool
        .raw(stmt)
        .await
        .unwrap_or_else(|e| panic!("{stmt}: {e}"));
}

/// Waits until `exp` holds on a scrape (panicking with the diff after [`CONVERGE`]),
/// then checks that it still holds over `hold` (nothing counted twice later).
async fn settle(agent: &Agent, exp: &Expectations, hold: Duration, what: &str) -> Metrics {
    let m = wait_for_expectations(agent, exp, CONVERGE, what).await;
    let stable = stays(hold, || async {
        let d = exp.diff(&agent.try_scrape().await?);
        if d.is_empty() {
            Ok(())
        } else {
            Err(render_diff(&d))
        }
    })
    .await;
    if let Err(d) = stable {
        panic!("{what}: the counters moved after reaching the truth:\n{d}");
    }
    m
}

// ---------------------------------------------------------------------------------
// default_error_classes = false
// ---------------------------------------------------------------------------------

/// The source's own classes, on both sources of the error-class test.
const OWN_CLASSES: &str = "[[sources.error_classes]]\nclass = \"fraud_check\"\n\
     pattern = 'fraud[ _-]?check'\nretryable = false\n";

/// Error texts (None: no `last_error`), each with its class under the built-in
/// classes and with `default_error_classes = false` (the same own classes).
const TEXTS: [(Option<&str>, &str, &str); 5] = [
    (
        Some("TimeoutError: upstream did not answer"),
        "timeout",
        "other",
    ),
    (
        Some("ValidationError: field `amount` must be positive"),
        "invalid",
        "other",
    ),
    (
        Some("HttpError: 503 Service Unavailable from inventory"),
        "server_error",
        "other",
    ),
    (
        Some("FraudCheckFailed: card flagged"),
        "fraud_check",
        "fraud_check",
    ),
    (None, "unknown", "unknown"),
];

/// How many of [`TEXTS`] fall in each class, with the built-in classes or without.
fn class_counts(builtin: bool) -> std::collections::BTreeMap<&'static str, f64> {
    let mut n = std::collections::BTreeMap::new();
    for (_, with, without) in TEXTS {
        *n.entry(if builtin { with } else { without }).or_default() += 1.0;
    }
    n
}

/// Whether a retry after an error of `class` is wasted: the non-retryable
/// built-in classes and the own `fraud_check` (`other` and `unknown` are retryable).
fn permanent(class: &str) -> bool {
    matches!(class, "invalid" | "permission" | "conflict" | "fraud_check")
}

/// Guards `default_error_classes = false` (docs/configuration.md "Error classes"):
/// only the source's own `[[sources.error_classes]]` apply, then `other`/`unknown`,
/// while a source with the default keeps the built-in classes. Two sources with the
/// same own class (`fraud_check`, permanent) watch two tables with the same five
/// events, each written after the start: processing, failed once with its text,
/// retried, dead with the same text. A timeout, a validation error and a 503 are
/// `timeout`, `invalid`, `server_error` with the default and `other` without; the
/// fraud-check text is `fraud_check` on both, no text is `unknown` on both. Exact
/// `inbox_attempt_failures_total`, `inbox_dead_letters_total` and
/// `inbox_permanent_error_retries_total` per class (a retry after `invalid` is wasted
/// with the built-ins only), and no other class of them non-zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_error_classes_false_leaves_only_the_sources_own_classes() {
    let db = Db::sqlite().await;
    let builtin_t = db.fresh_tables("cls_on").await.inbox;
    let own_t = db.fresh_tables("cls_off").await.inbox;
    let (builtin, own) = ("classes-builtin", "classes-own");
    let config = format!(
        "{}{OWN_CLASSES}\n{}default_error_classes = false\n{OWN_CLASSES}",
        inbox_source_toml(builtin, &db.dsn, &builtin_t),
        inbox_source_toml(own, &db.dsn, &own_t),
    );
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;

    let error = |text: Option<&str>| text.map_or("NULL".to_string(), |t| format!("'{t}'"));
    for t in [&builtin_t, &own_t] {
        for (i, _) in TEXTS.iter().enumerate() {
            sql(
                &db,
                &format!(
                    "INSERT INTO {t} (event_id, event_type, status, received_at, started_at, \
                     attempts, deliveries, updated_at) VALUES ('e{i}', 'order.paid', 'processing', \
                     {NOW}, {NOW}, 1, 1, {NOW})"
                ),
            )
            .await;
        }
    }
    let mut exp = Expectations::default();
    for s in [builtin, own] {
        exp.push(
            "inbox_messages_received_total",
            &[("source", s)],
            TEXTS.len() as f64,
            Tol::Exact,
        );
    }
    wait_for_expectations(&agent, &exp, CONVERGE, "five arrivals on each source").await;

    // Failed once: the failure is counted under the class of the text it shows.
    for t in [&builtin_t, &own_t] {
        for (i, (text, _, _)) in TEXTS.iter().enumerate() {
            sql(
                &db,
                &format!(
                    "UPDATE {t} SET status = 'failed', last_error = {}, updated_at = {NOW} \
                     WHERE event_id = 'e{i}'",
                    error(*text)
                ),
            )
            .await;
        }
    }
    let classes = |s: &str| class_counts(s == builtin);
    let mut failures = Expectations::default();
    for s in [builtin, own] {
        for (class, n) in classes(s) {
            failures.push(
                "inbox_attempt_failures_total",
                &[("source", s), ("error_class", class)],
                n,
                Tol::Exact,
            );
        }
        failures.close("inbox_attempt_failures_total", &[("source", s)]);
    }
    wait_for_expectations(&agent, &failures, CONVERGE, "one failed attempt each").await;

    // Retried (the text kept), then dead with the same text.
    for t in [&builtin_t, &own_t] {
        sql(
            &db,
            &format!(
                "UPDATE {t} SET status = 'processing', attempts = 2, started_at = {NOW}, \
                 updated_at = {NOW}"
            ),
        )
        .await;
        sql(
            &db,
            &format!("UPDATE {t} SET status = 'dead', finished_at = {NOW}, updated_at = {NOW}"),
        )
        .await;
    }
    let mut exp = failures.clone();
    for s in [builtin, own] {
        for (class, n) in classes(s) {
            let l = [("source", s), ("error_class", class)];
            exp.push("inbox_dead_letters_total", &l, n, Tol::Exact);
            if permanent(class) {
                exp.push("inbox_permanent_error_retries_total", &l, n, Tol::Exact);
            }
        }
        exp.push(
            "inbox_messages_completed_total",
            &[("source", s), ("outcome", "dead_lettered")],
            TEXTS.len() as f64,
            Tol::Exact,
        );
        exp.close("inbox_dead_letters_total", &[("source", s)]);
        exp.close("inbox_permanent_error_retries_total", &[("source", s)]);
    }
    settle(
        &agent,
        &exp,
        Duration::from_secs(2),
        "dead letters and retries by class",
    )
    .await;
    drop(agent);
    db.cleanup().await;
}

// ---------------------------------------------------------------------------------
// quantile_window
// ---------------------------------------------------------------------------------

/// `quantile_window` of the sliding-window test: 6 s, above the 1 s the config
/// accepts at least, long enough for a few polls of 300 ms.
const WINDOW: Duration = Duration::from_secs(6);
/// The window is cut into this many slices (`SKETCH_SLICES` in
/// src/sources/table/inbox.rs) and a slice is cleared as a whole, so a value counts
/// at least `WINDOW - WINDOW / SLICES` after it was added (src/telemetry/sketch.rs).
const SLICES: u32 = 30;
/// Processing time of the steady stream of short events, and of the burst of long ones.
const SHORT_S: f64 = 0.25;
const LONG_S: f64 = 40.0;
/// Long events in the burst: more than 5 % of what a 6 s window holds, so they make
/// the P95; and more than 5 % of every short event written in the first 4 minutes
/// (one per 300 ms at most), so that, were they never to leave, the short ones
/// could not outnumber them enough to bring the P95 down before [`LEAVE_BY`].
const LONG_EVENTS: usize = 40;
/// The long values must have left the window this long after the P95 first showed
/// them, at the latest: the window, then a generous allowance for the polls.
const LEAVE_BY: Duration = Duration::from_secs(6 + 20);
/// The relative error of the quantile gauges allowed here (the sketch promises 0.5 %).
const SKETCH_TOLERANCE: f64 = 0.01;

/// The P95 gauge of `source` for `order.paid`, if exported.
fn p95(m: &Metrics, source: &str) -> Option<f64> {
    m.get(
        "inbox_processing_duration_quantile_seconds",
        &[
            ("source", source),
            ("event_type", "order.paid"),
            ("quantile", "0.95"),
        ],
    )
}

/// The scrapes `(time after the burst, P95)` as runs of one value, one line each.
fn runs(log: &[(Duration, Option<f64>)]) -> String {
    let mut out: Vec<(Duration, Duration, Option<f64>)> = Vec::new();
    for &(t, v) in log {
        match out.last_mut() {
            Some(last) if last.2 == v => last.1 = t,
            _ => out.push((t, t, v)),
        }
    }
    out.iter()
        .map(|(from, to, v)| format!("  P95 {v:?} from {from:?} to {to:?} after the burst"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn near(v: f64, want: f64) -> bool {
    (v - want).abs() <= SKETCH_TOLERANCE * want
}

/// Guards `quantile_window` (docs/configuration.md): the quantile gauges are over the
/// last window only. A writer completes an event of 0.25 s every 300 ms throughout;
/// once the P95 shows 0.25 s, 40 events of 40 s complete at once: P95 becomes 40 s.
/// The test scrapes every 100 ms from then on: the P95 is 40 s (within 1 %) until
/// the long values leave, which is never before 6 s − 6 s/30 (the sketch's slice)
/// after their rows were written, and at the latest 26 s after the P95 showed them
/// (long before the short values alone could dilute them below 5 %); then it is
/// 0.25 s (within 1 %). Never anything else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quantile_window_lets_old_values_leave_the_quantile_gauges() {
    let db = Db::sqlite().await;
    let t = db.fresh_tables("qwin").await.inbox;
    let source = "window";
    let config = inbox_source_toml(source, &db.dsn, &t).replace(
        "quantile_window = \"5m\"",
        &format!("quantile_window = \"{}s\"", WINDOW.as_secs()),
    );
    assert!(
        config.contains("quantile_window = \"6s\""),
        "HARNESS BUG: the window is not set:\n{config}"
    );
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;

    // The steady stream of short events, until the test ends.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (pool, t, stop) = (db.pool.clone(), t.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let stmt = format!(
                    "INSERT INTO {t} (event_id, event_type, status, received_at, started_at, \
                     finished_at, attempts, deliveries, updated_at) VALUES ('short-{n}', \
                     'order.paid', 'succeeded', {started}, {started}, {NOW}, 1, 1, {NOW})",
                    started = ago(SHORT_S)
                );
                pool.raw(&stmt)
                    .await
                    .unwrap_or_else(|e| panic!("{stmt}: {e}"));
                n += 1;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let wait_p95 = |want: f64, what: &'static str| {
        let agent = &agent;
        async move {
            let res = wait_until(CONVERGE, || async {
                let m = agent.try_scrape().await?;
                match p95(&m, source) {
                    Some(v) if near(v, want) => Ok(Instant::now()),
                    other => Err(format!("P95 {other:?}, want {want} s (±1 %)")),
                }
            })
            .await;
            res.unwrap_or_else(|e| panic!("{what}: {e}"))
        }
    };
    wait_p95(SHORT_S, "the short events alone").await;

    let written = Instant::now();
    let mut burst = Vec::new();
    for i in 0..LONG_EVENTS {
        burst.push(format!(
            "INSERT INTO {t} (event_id, event_type, status, received_at, started_at, \
             finished_at, attempts, deliveries, updated_at) VALUES ('long-{i}', 'order.paid', \
             'succeeded', {long}, {long}, {NOW}, 1, 1, {NOW});",
            long = ago(LONG_S)
        ));
    }
    // One transaction: the agent sees the whole burst at one poll.
    sql(&db, &format!("BEGIN;\n{}\nCOMMIT;", burst.concat())).await;
    let seen = wait_p95(LONG_S, "the burst of long events").await;

    // From here on, every scrape: the long P95 until the window has passed, then the
    // short one.
    let earliest = written + WINDOW - WINDOW / SLICES;
    let mut log: Vec<(Duration, Option<f64>)> = Vec::new();
    let dropped = loop {
        let m = agent.scrape().await;
        let now = Instant::now();
        let v = p95(&m, source);
        log.push((now - written, v));
        let history = || runs(&log);
        match v {
            Some(v) if near(v, LONG_S) => {}
            Some(v) if near(v, SHORT_S) => break now,
            other => panic!(
                "P95 {other:?} is neither the long {LONG_S} s nor the short {SHORT_S} s\n{}",
                history()
            ),
        }
        assert!(
            now < seen + LEAVE_BY,
            "the long values had not left the {WINDOW:?} window {LEAVE_BY:?} after the P95 \
             showed them: P95 still {LONG_S} s\n{}",
            history()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        dropped >= earliest,
        "the P95 came down {:?} after the long rows were written, before the {WINDOW:?} \
         window (less one {:?} slice) had passed",
        dropped - written,
        WINDOW / SLICES
    );
    eprintln!(
        "P95 back to {SHORT_S} s {:?} after the long rows were written (window {WINDOW:?})",
        dropped - written
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.await.expect("the short-event writer");
    drop(agent);
    db.cleanup().await;
}

// ---------------------------------------------------------------------------------
// Objectives and build info
// ---------------------------------------------------------------------------------

/// Every sample named `name`, as `series value` lines (for messages and comparisons).
fn samples_of(m: &Metrics, name: &str) -> Vec<String> {
    let mut out: Vec<String> = m
        .series(name, &[])
        .map(|s| format!("{} {}", s.series(), s.value))
        .collect();
    out.sort();
    out
}

/// Guards `[sources.objectives]` and the build info (docs/metrics.md): an inbox with
/// `oldest_age = "7m"` and `p95 = "1500ms"` exports
/// `inboxwatch_objective_oldest_age_seconds{source} 420` and
/// `inboxwatch_objective_p95_seconds{source} 1.5`; an outbox with only
/// `oldest_age = "1h 30m 15s"` exports 5415 and no P95 objective; an inbox without
/// objectives exports neither. Those are all the objective series there are, with
/// `source` as their only label, and `inboxwatch_build_info` is one series,
/// `{version="<the crate version>"} 1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objectives_are_exported_as_configured_and_build_info_carries_the_version() {
    let db = Db::sqlite().await;
    let a = db.fresh_tables("obj_a").await;
    let c = db.fresh_tables("obj_c").await;
    let config = format!(
        "{}[sources.objectives]\noldest_age = \"7m\"\np95 = \"1500ms\"\n\n\
         {}[sources.objectives]\noldest_age = \"1h 30m 15s\"\n\n{}",
        inbox_source_toml("with-both", &db.dsn, &a.inbox),
        outbox_source_toml("outbox-age-only", &db.dsn, &a.outbox),
        inbox_source_toml("without", &db.dsn, &c.inbox),
    );
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;

    // Once every source has polled, the objective series are all set up.
    let want = |name: &str| -> Vec<String> {
        match name {
            "inboxwatch_objective_oldest_age_seconds" => vec![
                "inboxwatch_objective_oldest_age_seconds{source=\"outbox-age-only\"} 5415"
                    .to_string(),
                "inboxwatch_objective_oldest_age_seconds{source=\"with-both\"} 420".to_string(),
            ],
            "inboxwatch_objective_p95_seconds" => {
                vec!["inboxwatch_objective_p95_seconds{source=\"with-both\"} 1.5".to_string()]
            }
            _ => vec![format!(
                "inboxwatch_build_info{{version={:?}}} 1",
                env!("CARGO_PKG_VERSION")
            )],
        }
    };
    let names = [
        "inboxwatch_objective_oldest_age_seconds",
        "inboxwatch_objective_p95_seconds",
        "inboxwatch_build_info",
    ];
    let res = wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        let mut bad = Vec::new();
        for s in ["with-both", "outbox-age-only", "without"] {
            if m.get("inboxwatch_source_up", &[("source", s)]) != Some(1.0) {
                bad.push(format!("{s} has not polled yet"));
            }
        }
        for name in names {
            let (have, want) = (samples_of(&m, name), want(name));
            if have != want {
                bad.push(format!("{name}: have {have:#?}, want {want:#?}"));
            }
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(bad.join("\n"))
        }
    })
    .await;
    if let Err(e) = res {
        panic!("objective and build-info series: {e}");
    }
    drop(agent);
    db.cleanup().await;
}

// ---------------------------------------------------------------------------------
// deleted_as
// ---------------------------------------------------------------------------------

/// Guards `deleted_as = "dead"` (docs/configuration.md "Rows deleted on
/// completion"): with `finished_rows = "deleted"`, a tracked unfinished row that
/// disappears counts as a dead letter, not a success. Two sources watch two tables
/// with the same three rows, written after the start: one processing on its first
/// attempt, one failed once with a timeout and back in processing on its second,
/// one pending. Once the agent has seen them so (one failed attempt counted, the
/// backlog 1 pending, 2 processing), the consumer deletes them. With `deleted_as =
/// "dead"`: 3 completions `dead_lettered`, none `succeeded`, dead letters by class
/// `timeout` 1 (the last error seen) and `unknown` 2; with the default: 3
/// `succeeded`, no dead letter. On both: attempts observed 3, summing 4 (the failed
/// attempts seen + 1), one failed attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_as_dead_counts_a_deleted_row_as_a_dead_letter() {
    let db = Db::sqlite().await;
    let dead_t = db.fresh_tables("del_dead").await.inbox;
    let ok_t = db.fresh_tables("del_ok").await.inbox;
    let (dead, ok) = ("deleted-dead", "deleted-ok");
    let config = format!(
        "{}finished_rows = \"deleted\"\ndeleted_as = \"dead\"\n\n{}finished_rows = \"deleted\"\n",
        inbox_source_toml(dead, &db.dsn, &dead_t),
        inbox_source_toml(ok, &db.dsn, &ok_t),
    );
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;

    for t in [&dead_t, &ok_t] {
        sql(
            &db,
            &format!(
                "INSERT INTO {t} (event_id, event_type, status, received_at, started_at, \
                 attempts, deliveries, last_error, updated_at) VALUES \
                 ('first', 'order.paid', 'processing', {NOW}, {NOW}, 1, 1, NULL, {NOW}), \
                 ('retried', 'order.paid', 'failed', {NOW}, {NOW}, 1, 1, \
                  'TimeoutError: upstream did not answer', {NOW}), \
                 ('waiting', 'order.paid', 'pending', {NOW}, NULL, 0, 1, NULL, {NOW})"
            ),
        )
        .await;
    }
    let mut exp = Expectations::default();
    for s in [dead, ok] {
        exp.push(
            "inbox_messages_received_total",
            &[("source", s)],
            3.0,
            Tol::Exact,
        );
        exp.push(
            "inbox_attempt_failures_total",
            &[("source", s), ("error_class", "timeout")],
            1.0,
            Tol::Exact,
        );
    }
    wait_for_expectations(&agent, &exp, CONVERGE, "three rows seen, one failed").await;
    for t in [&dead_t, &ok_t] {
        sql(
            &db,
            &format!(
                "UPDATE {t} SET status = 'processing', attempts = 2, started_at = {NOW}, \
                 updated_at = {NOW} WHERE event_id = 'retried'"
            ),
        )
        .await;
    }
    let mut backlog = exp.clone();
    for s in [dead, ok] {
        for (status, n) in [("pending", 1.0), ("processing", 2.0), ("failed", 0.0)] {
            backlog.push(
                "inbox_backlog_messages",
                &[("source", s), ("status", status)],
                n,
                Tol::Exact,
            );
        }
    }
    wait_for_expectations(&agent, &backlog, CONVERGE, "the retry seen in processing").await;

    for t in [&dead_t, &ok_t] {
        sql(&db, &format!("DELETE FROM {t}")).await;
    }
    for (s, succeeded, dead_lettered) in [(dead, 0.0, 3.0), (ok, 3.0, 0.0)] {
        let l = [("source", s)];
        for (outcome, n) in [("succeeded", succeeded), ("dead_lettered", dead_lettered)] {
            exp.push(
                "inbox_messages_completed_total",
                &[("source", s), ("outcome", outcome)],
                n,
                Tol::Exact,
            );
        }
        exp.push("inbox_delivery_attempts_count", &l, 3.0, Tol::Exact);
        exp.push("inbox_delivery_attempts_sum", &l, 4.0, Tol::Exact);
        exp.close("inbox_attempt_failures_total", &l);
        exp.close("inbox_dead_letters_total", &l);
    }
    for (class, n) in [("timeout", 1.0), ("unknown", 2.0)] {
        exp.push(
            "inbox_dead_letters_total",
            &[("source", dead), ("error_class", class)],
            n,
            Tol::Exact,
        );
    }
    settle(
        &agent,
        &exp,
        Duration::from_secs(2),
        "completions of the deleted rows",
    )
    .await;
    drop(agent);
    db.cleanup().await;
}

// ---------------------------------------------------------------------------------
// demo --rate
// ---------------------------------------------------------------------------------

/// How long the arrivals of the demo are counted.
const DEMO_MEASURED: Duration = Duration::from_secs(30);
/// The chance, per bound and per demo, that a correct simulation falls outside it.
const DEMO_FALSE_ALARM: f64 = 1e-6;

/// `inbox_messages_received_total` of the demo's source, summed over event types.
async fn demo_received(agent: &Agent) -> Result<f64, String> {
    let m = agent.try_scrape().await?;
    Ok(m.sum("inbox_messages_received_total", &[("source", "demo-inbox")]))
}

/// The first scrape (every 100 ms) at which the demo's received counter has moved:
/// the moment just after one of its polls, and the count then.
async fn demo_after_a_poll(agent: &Agent, what: &str) -> (Instant, f64) {
    let before = demo_received(agent)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    wait_until(Duration::from_secs(30), || async {
        let now = demo_received(agent).await?;
        if now != before {
            Ok((Instant::now(), now))
        } else {
            Err(format!("inbox_messages_received_total still {before}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Bounds on a Poisson count of mean `mean` that it leaves with a probability of at
/// most `p` on each side, by the Chernoff bound
/// `P(X ≥ u·mean), P(X ≤ u·mean) ≤ exp(−mean·(u·ln u − u + 1))` (u above, below 1).
fn poisson_bounds(mean: f64, p: f64) -> (f64, f64) {
    let h = |u: f64| u * u.ln() - u + 1.0;
    let target = -p.ln() / mean;
    // h falls on (0, 1) and rises on (1, ∞): bisect each side for h(u) = target.
    let solve = |mut inside: f64, mut outside: f64| {
        for _ in 0..200 {
            let mid = (inside + outside) / 2.0;
            if h(mid) < target {
                inside = mid;
            } else {
                outside = mid;
            }
        }
        outside
    };
    (mean * solve(1.0, 1e-12), mean * solve(1.0, 1e6))
}

/// Guards `inboxwatch demo --rate N`: the simulated consumer receives N new events a
/// second. Two demos run side by side, at 3 and at 30 a second (neither the default
/// 20, so a flag that were ignored fails both); each one's
/// `inbox_messages_received_total` grows over a measured interval of about 30 s,
/// from just after one of the agent's polls to just after another (so both ends
/// count what the table held at a poll, give or take a 100 ms scrape interval), by
/// the arrivals of that interval. The simulation draws exponential gaps of mean
/// 1/N (src/demo/simulate.rs, `arrival_gap`): the arrivals in time T are Poisson
/// with mean N·T, and the bounds are the Chernoff bounds that a correct run leaves
/// with a chance of at most 1e-6 each (5 to 6 standard deviations √(N·T) from the
/// mean), widened by N events on each side for the alignment of the ends on polls.
/// At 3/s that is about 42–147 events, at 30/s about 717–1092: far apart, and the
/// 30/s one misses a rate off by a factor of 2 either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_rate_sets_the_arrival_rate_of_the_simulation() {
    let rates = [3.0, 30.0];
    let demos: Vec<Agent> = rates
        .iter()
        .map(|r| {
            Agent::demo_with(&["--rate", &r.to_string()])
                .name(&format!("demo-rate-{r}"))
                .start()
        })
        .collect();
    for d in &demos {
        d.wait_ready(Duration::from_secs(30)).await;
    }
    // The first count after the start (the planted rows, the first arrivals) is
    // the baseline of each.
    let mut starts = Vec::new();
    for (d, r) in demos.iter().zip(rates) {
        starts.push(demo_after_a_poll(d, &format!("demo --rate {r}, start")).await);
    }
    tokio::time::sleep(DEMO_MEASURED).await;
    let mut failures = Vec::new();
    for ((d, r), (t0, n0)) in demos.iter().zip(rates).zip(starts) {
        let (t1, n1) = demo_after_a_poll(d, &format!("demo --rate {r}, end")).await;
        let elapsed = (t1 - t0).as_secs_f64();
        let (lo, hi) = poisson_bounds(r * elapsed, DEMO_FALSE_ALARM);
        let (lo, hi) = (lo - r, hi + r);
        let got = n1 - n0;
        eprintln!(
            "demo --rate {r}: {got} arrivals in {elapsed:.2} s (mean {:.0}, bounds {lo:.0}..{hi:.0})",
            r * elapsed
        );
        if !(lo..=hi).contains(&got) {
            failures.push(format!(
                "demo --rate {r}: {got} new events in {elapsed:.2} s ({:.2}/s), want \
                 {lo:.0}..{hi:.0} around {:.0}",
                got / elapsed,
                r * elapsed
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for (d, r) in demos.iter().zip(rates) {
        let status = d
            .terminate(Duration::from_secs(25))
            .unwrap_or_else(|| panic!("demo --rate {r} did not exit within 25 s of SIGTERM"));
        assert!(status.success(), "demo --rate {r} exit status: {status}");
    }
}
