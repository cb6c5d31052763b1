//! End to end against REAL libraries writing their OWN tables (issue 12, "watch the
//! tables consumers already have"): the npm packages pinned in
//! `tests/libraries/package-lock.json` (installed by `scripts/test.sh` with `npm ci`)
//! create their tables with their own setup SQL or migrations in a fresh schema, the
//! agent starts on those empty tables, and a Node script runs a workload through the
//! library's own API — successes, failures retried until they succeed, failures for
//! good, duplicates the library swallows — and prints the library's own counts. Every
//! exported number must then equal what those counts imply under the counting rules of
//! `cursor = "none"`; nothing is read back from the tables for the expectations except
//! the sums of durations, and the tables are only checked against the library's counts
//! first (so that a mismatch with /metrics is the agent's).
//!
//! Needs PostgreSQL (`INBOXWATCH_TEST_PG`), `node` and `tests/libraries/node_modules`:
//! without them the tests FAIL, they do not skip.

use crate::common;

use std::collections::BTreeMap;

use common::checks::{Expectations, Tol};
use common::library::*;
use common::{Agent, Db, READY_TIMEOUT};

// ---------------------------------------------------------------------------------
// pg-transactional-outbox
// ---------------------------------------------------------------------------------

/// The agent's config for pg-transactional-outbox's `inbox` and `outbox` tables: the
/// library's two presets (no status column: status from rules on its own columns; no
/// started_at, no deliveries, no updated_at, so no cursor), on the test's schema.
fn pto_config(dsn: &str, schema: &str) -> String {
    let mut t = preset_source(
        "pg-transactional-outbox-inbox",
        "pto-inbox",
        dsn,
        Some(&format!("{schema}.inbox")),
    );
    t.push_str(&preset_source(
        "pg-transactional-outbox-outbox",
        "pto-outbox",
        dsn,
        Some(&format!("{schema}.outbox")),
    ));
    t
}

/// Guards the pg-transactional-outbox presets, watching pg-transactional-outbox 0.5.7's own `inbox` and `outbox` tables
/// (no status column: status from rules; no updated_at: cursor-less tailing), written
/// by its own storage and polling listeners: received, completed by outcome, attempt
/// failures, the attempts histogram and the end-to-end count equal the library's
/// counts per message type, the outbox's published count equals its listener's, the
/// backlogs end at 0, no row is rejected, and deliveries / duplicates are absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_transactional_outbox_tables_match_the_librarys_counts() {
    const SCRIPT: &str = "pg-transactional-outbox.mjs";
    require_node();
    let db = Db::postgres().await;
    let schema = fresh_schema(&db, "pto").await;
    node(SCRIPT, &db.dsn, &schema, "setup", &[]).await;

    let agent = Agent::start(&pto_config(&db.dsn, &schema));
    agent.wait_ready(READY_TIMEOUT).await;

    let out = node(
        SCRIPT,
        &db.dsn,
        &schema,
        "run",
        &[
            "--ok",
            "140",
            "--flaky",
            "40",
            "--doomed",
            "20",
            "--dups",
            "40",
            "--redeliveries",
            "40",
        ],
    )
    .await;
    let r = report(&out);
    eprintln!("library counts: {r}");

    // The run went as designed (else the library behaved differently, not the agent).
    let types = keys(&r, &["inbox", "by_type"]);
    let total = |field: &str| -> f64 {
        types
            .iter()
            .map(|t| count(&r, &["inbox", "by_type", t, field]))
            .sum()
    };
    let design = [
        ("inbox succeeded", total("succeeded"), 180.0),
        ("inbox abandoned", total("abandoned"), 20.0),
        ("inbox messages", total("messages"), 200.0),
        (
            "outbox duplicates swallowed",
            count(&r, &["outbox", "duplicates_swallowed"]),
            40.0,
        ),
        (
            "inbox duplicates swallowed",
            count(&r, &["inbox", "duplicates_swallowed"]),
            40.0,
        ),
        ("inbox rows stored", count(&r, &["inbox", "stored"]), 200.0),
    ];
    for (what, got, want) in design {
        assert_eq!(
            got, want,
            "the library's run differs from the design: {what}\n{r}"
        );
    }

    // The tables agree with the library's counts (a harness check, before /metrics).
    let inbox = format!("{schema}.inbox");
    let outbox = format!("{schema}.outbox");
    let table: BTreeMap<(String, String, i64), f64> = rows(
        &db,
        &format!(
            "SELECT message_type, CASE WHEN abandoned_at IS NOT NULL THEN 'abandoned' \
             WHEN processed_at IS NOT NULL THEN 'succeeded' ELSE 'open' END, \
             CAST(finished_attempts AS text), CAST(count(*) AS text) FROM {inbox} \
             WHERE started_attempts = finished_attempts GROUP BY 1, 2, 3 \
             UNION ALL SELECT message_type, 'crashed attempts', '0', CAST(count(*) AS text) \
             FROM {inbox} WHERE started_attempts <> finished_attempts GROUP BY 1"
        ),
    )
    .await
    .into_iter()
    .map(|r| ((r[0].clone(), r[1].clone(), num(&r[2]) as i64), num(&r[3])))
    .collect();
    let mut library = BTreeMap::new();
    for t in &types {
        for outcome in ["succeeded", "abandoned"] {
            for (a, c) in attempts_map(&r, &["inbox", "by_type", t, "attempts", outcome]) {
                library.insert((t.clone(), outcome.to_string(), a), c);
            }
        }
    }
    assert_eq!(
        table, library,
        "HARNESS: the inbox table (type, state, finished_attempts) -> rows differs from \
         the library's counts"
    );
    let published: BTreeMap<String, f64> = rows(
        &db,
        &format!(
            "SELECT message_type, CAST(count(*) AS text) FROM {outbox} \
             WHERE processed_at IS NOT NULL AND abandoned_at IS NULL GROUP BY 1"
        ),
    )
    .await
    .into_iter()
    .map(|r| (r[0].clone(), num(&r[1])))
    .collect();
    let library_published: BTreeMap<String, f64> = keys(&r, &["outbox", "published"])
        .into_iter()
        .map(|t| {
            let c = count(&r, &["outbox", "published", &t]);
            (t, c)
        })
        .collect();
    assert_eq!(
        published, library_published,
        "HARNESS: the outbox table's processed rows differ from the listener's counts"
    );
    let outbox_rows =
        num(&rows(&db, &format!("SELECT CAST(count(*) AS text) FROM {outbox}")).await[0][0]);
    assert_eq!(
        outbox_rows,
        count(&r, &["outbox", "stored"]),
        "HARNESS: outbox rows"
    );

    // Sums of durations: not in the library's counts, so from the table.
    let durations = |table: String| {
        let db = &db;
        async move {
            rows(
                db,
                &format!(
                    "SELECT message_type, CAST(count(*) AS text), \
                     CAST(SUM(EXTRACT(EPOCH FROM processed_at - created_at)) AS text) \
                     FROM {table} WHERE processed_at IS NOT NULL GROUP BY 1"
                ),
            )
            .await
            .into_iter()
            .map(|r| (r[0].clone(), (num(&r[1]), num(&r[2]))))
            .collect::<BTreeMap<String, (f64, f64)>>()
        }
    };
    let e2e = durations(inbox.clone()).await;
    let delay = durations(outbox.clone()).await;

    let mut x = Expectations::default();
    for t in &types {
        let mut attempts = attempts_map(&r, &["inbox", "by_type", t, "attempts", "succeeded"]);
        for (a, c) in attempts_map(&r, &["inbox", "by_type", t, "attempts", "abandoned"]) {
            *attempts.entry(a).or_default() += c;
        }
        let succeeded = count(&r, &["inbox", "by_type", t, "succeeded"]);
        inbox_counts(
            &mut x,
            "pto-inbox",
            Some(t),
            count(&r, &["inbox", "by_type", t, "messages"]),
            succeeded,
            count(&r, &["inbox", "by_type", t, "abandoned"]),
            &attempts,
        );
        // processed_at is the finish of succeeded rows only; abandoned rows have none.
        let l = [("source", "pto-inbox"), ("event_type", t.as_str())];
        x.push(
            "inbox_end_to_end_latency_seconds_count",
            &l,
            succeeded,
            Tol::Exact,
        );
        let (n, sum) = e2e.get(t).copied().unwrap_or_default();
        x.push(
            "inbox_end_to_end_latency_seconds_sum",
            &l,
            sum,
            Tol::Abs(0.001 * n + 1e-6),
        );
    }
    inbox_settled(&mut x, "pto-inbox");
    for (t, published) in &library_published {
        let l = [("source", "pto-outbox"), ("event_type", t.as_str())];
        x.push(
            "outbox_messages_published_total",
            &l,
            *published,
            Tol::Exact,
        );
        x.push(
            "outbox_publish_delay_seconds_count",
            &l,
            *published,
            Tol::Exact,
        );
        let (n, sum) = delay.get(t).copied().unwrap_or_default();
        x.push(
            "outbox_publish_delay_seconds_sum",
            &l,
            sum,
            Tol::Abs(0.001 * n + 1e-6),
        );
    }
    let s = [("source", "pto-outbox")];
    x.push("outbox_backlog_messages", &s, 0.0, Tol::Exact);
    x.push("outbox_oldest_unpublished_age_seconds", &s, 0.0, Tol::Exact);
    x.push("inboxwatch_rows_rejected_total", &s, 0.0, Tol::Exact);
    x.push("inboxwatch_source_up", &s, 1.0, Tol::Exact);
    for name in [
        "outbox_messages_published_total",
        "outbox_publish_delay_seconds_count",
        "outbox_publish_delay_seconds_sum",
        "outbox_backlog_messages",
        "outbox_oldest_unpublished_age_seconds",
        "inboxwatch_rows_rejected_total",
    ] {
        x.close(name, &s);
    }

    converge(
        &agent,
        &x,
        &[("pto-inbox", &ABSENT_WITHOUT_DELIVERIES)],
        "pg-transactional-outbox",
    )
    .await;

    drop(agent);
    drop_schema(&db, &schema).await;
}

// ---------------------------------------------------------------------------------
// graphile-worker
// ---------------------------------------------------------------------------------

/// The agent's config for graphile-worker's jobs: the library's preset, on the test's
/// schema. It reads the `jobs` view (the table holds a task id; the view joins the task
/// identifier, the event type): successes are DELETED, permanently failed jobs stay
/// with attempts = max_attempts; status from rules. A view has no `xmin`: the agent
/// reads it without the filter that skips rows an earlier poll read.
fn graphile_config(dsn: &str, schema: &str) -> String {
    preset_source(
        "graphile-worker",
        "gw-jobs",
        dsn,
        Some(&format!("{schema}.jobs")),
    )
}

/// Guards the graphile-worker preset, watching graphile-worker 0.17.3's own jobs table, written by its own
/// migrations, addJob and worker pool, where a success DELETES the row: received,
/// succeeded (counted by disappearance), dead-lettered (attempts reach max_attempts),
/// attempt failures and the attempts histogram equal the library's job events;
/// re-added job keys are not counted again; the backlog ends at 0, no row is
/// rejected, deliveries / duplicates are absent. Every job waits 3 s before it runs and
/// every successful attempt takes 1.2 s (see the script), so each job is seen before it
/// disappears and the expected counts are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graphile_worker_jobs_match_the_librarys_counts() {
    const SCRIPT: &str = "graphile-worker.mjs";
    require_node();
    let db = Db::postgres().await;
    let schema = fresh_schema(&db, "gw").await;
    node(SCRIPT, &db.dsn, &schema, "setup", &[]).await;

    let agent = Agent::start(&graphile_config(&db.dsn, &schema));
    agent.wait_ready(READY_TIMEOUT).await;

    let out = node(
        SCRIPT,
        &db.dsn,
        &schema,
        "run",
        &[
            "--ok", "140", "--flaky", "40", "--doomed", "20", "--dups", "40",
        ],
    )
    .await;
    let r = report(&out);
    eprintln!("library counts: {r}");

    let tasks = keys(&r, &["by_task"]);
    let total = |field: &str| -> f64 {
        tasks
            .iter()
            .map(|t| count(&r, &["by_task", t, field]))
            .sum()
    };
    let design = [
        ("jobs", total("jobs"), 200.0),
        ("succeeded", total("succeeded"), 180.0),
        ("failed permanently", total("failed_permanently"), 20.0),
        ("re-added keys folded", total("duplicates_folded"), 40.0),
        (
            "re-added keys as new rows",
            total("duplicates_new_rows"),
            0.0,
        ),
    ];
    for (what, got, want) in design {
        assert_eq!(
            got, want,
            "the library's run differs from the design: {what}\n{r}"
        );
    }

    // What is left in the table: exactly the permanently failed jobs, unlocked, with
    // attempts = max_attempts and their last error (a harness check, before /metrics).
    let left: BTreeMap<(String, i64, String), f64> = rows(
        &db,
        &format!(
            "SELECT task_identifier, CAST(attempts AS text), \
             CASE WHEN attempts = max_attempts AND locked_at IS NULL AND last_error IS NOT NULL \
             THEN 'failed for good' ELSE 'other' END, CAST(count(*) AS text) \
             FROM {schema}.jobs GROUP BY 1, 2, 3"
        ),
    )
    .await
    .into_iter()
    .map(|r| ((r[0].clone(), num(&r[1]) as i64, r[2].clone()), num(&r[3])))
    .collect();
    let mut library = BTreeMap::new();
    for t in &tasks {
        for (a, c) in attempts_map(&r, &["by_task", t, "attempts", "failed"]) {
            library.insert((t.clone(), a, "failed for good".to_string()), c);
        }
    }
    assert_eq!(
        left, library,
        "HARNESS: the rows left in the jobs table differ from the library's job:failed events"
    );

    // Per task (the event type): the library's counts of that task.
    let mut x = Expectations::default();
    for t in &tasks {
        let mut attempts = BTreeMap::new();
        for outcome in ["succeeded", "failed"] {
            for (a, c) in attempts_map(&r, &["by_task", t, "attempts", outcome]) {
                *attempts.entry(a).or_default() += c;
            }
        }
        inbox_counts(
            &mut x,
            "gw-jobs",
            Some(t),
            count(&r, &["by_task", t, "jobs"]),
            count(&r, &["by_task", t, "succeeded"]),
            count(&r, &["by_task", t, "failed_permanently"]),
            &attempts,
        );
    }
    // No finished_at: deleted rows observe no duration (deleted_durations = false),
    // dead rows have no finish time.
    x.push(
        "inbox_end_to_end_latency_seconds_count",
        &[("source", "gw-jobs")],
        0.0,
        Tol::Exact,
    );
    inbox_settled(&mut x, "gw-jobs");

    converge(
        &agent,
        &x,
        &[("gw-jobs", &ABSENT_WITHOUT_DELIVERIES)],
        "graphile-worker",
    )
    .await;

    drop(agent);
    drop_schema(&db, &schema).await;
}
