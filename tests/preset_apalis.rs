//! The `apalis-postgres` and `apalis-mysql` presets against the real crates (issue 17):
//! apalis-postgres 1.0.0 on PostgreSQL and apalis-mysql 1.0.0-rc.8 on MariaDB, pinned
//! in `tests/libraries/apalis/*/Cargo.lock` and built by `scripts/test.sh`, create their
//! tables with their own migrations in a database of the test's own (apalis's SQL names
//! its schema, `apalis`, or uses the connection's database), the agent starts on the
//! empty tables on the preset (`preset = "apalis-postgres"`), and a workload runs through apalis's own
//! API — 140 jobs that succeed, 40 that fail twice then succeed, 20 that always fail
//! (max_attempts 3), 40 pushes of an existing idempotency key, over two job types —
//! and prints what apalis's `wait_for` reported for every job. The tables are checked
//! against those counts first (a harness check); then every counter per event type
//! (= job_type) must equal them exactly, the backlog and oldest age end at 0 and no
//! row is rejected.
//!
//! Needs PostgreSQL (`INBOXWATCH_TEST_PG`), MariaDB (`INBOXWATCH_TEST_MYSQL`) and the
//! built workloads: without them the tests FAIL, they do not skip.

use crate::common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::checks::{Expectations, Tol};
use common::library::*;
use common::{Agent, Db, READY_TIMEOUT, repo_path, wait_until};

/// Where the two workload projects and their shared target directory are.
const WORKLOADS: &str = "tests/libraries/apalis";

/// One of the two crates: its workload binary, preset and table.
struct Flavor {
    /// `postgres` or `mysql`: the workload's project directory.
    crate_dir: &'static str,
    preset: &'static str,
    /// The preset's table (the test's own database holds it under that name).
    table: &'static str,
    source: &'static str,
}

const POSTGRES: Flavor = Flavor {
    crate_dir: "postgres",
    preset: "apalis-postgres",
    table: "apalis.jobs",
    source: "apalis-pg",
};

const MYSQL: Flavor = Flavor {
    crate_dir: "mysql",
    preset: "apalis-mysql",
    table: "jobs",
    source: "apalis-my",
};

impl Flavor {
    /// The built workload; panics with how to build it when it is missing.
    fn binary(&self) -> PathBuf {
        let bin = repo_path(&format!(
            "{WORKLOADS}/target/debug/apalis-{}-workload",
            self.crate_dir
        ));
        assert!(
            bin.is_file(),
            "{} is missing: build it with `cargo build --locked --manifest-path \
             {WORKLOADS}/{}/Cargo.toml --target-dir {WORKLOADS}/target` \
             (scripts/test.sh does it)",
            bin.display(),
            self.crate_dir
        );
        bin
    }

    async fn workload(&self, dsn: &str, phase: &str, args: &[&str]) -> String {
        let mut cmd = Command::new(self.binary());
        cmd.args(["--db", dsn, "--phase", phase]).args(args);
        let what = format!("apalis-{}-workload --phase {phase}", self.crate_dir);
        run_workload(&what, &mut cmd).await
    }
}

/// Waits until the database's clock is in a later whole second than it was once the
/// agent was ready: apalis writes `run_at` (the preset's `received_at`) in whole
/// seconds, so a job pushed in the agent's first second would predate its start.
async fn next_second(db: &Db) {
    let ready = db.now_ms().await;
    let check = || async {
        let now = db.now_ms().await;
        if now / 1000 > ready / 1000 {
            Ok(())
        } else {
            Err(format!(
                "database clock {now} ms still in the second of {ready} ms"
            ))
        }
    };
    wait_until(Duration::from_secs(5), check)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The final rows (apalis's own rule, as in its `fetch_completed_tasks`).
const FINAL: &str =
    "(status IN ('Done', 'Killed') OR (status = 'Failed' AND attempts >= max_attempts))";

async fn apalis_matches_the_librarys_counts(flavor: Flavor, server: Db) {
    let bin = flavor.binary();
    eprintln!("workload {}", bin.display());
    let (database, db) = fresh_database(&server, "apalis").await;
    flavor.workload(&db.dsn, "setup", &[]).await;

    // The preset as a user writes it: its own table, in the test's own database.
    let agent = Agent::start(&preset_source(flavor.preset, flavor.source, &db.dsn, None));
    agent.wait_ready(READY_TIMEOUT).await;
    next_second(&db).await;

    let out = flavor
        .workload(
            &db.dsn,
            "run",
            &[
                "--ok", "140", "--flaky", "40", "--doomed", "20", "--dups", "40",
            ],
        )
        .await;
    let r = report(&out);
    eprintln!("library counts: {r}");

    let types = keys(&r, &["by_type"]);
    let total = |field: &str| -> f64 {
        types
            .iter()
            .map(|t| count(&r, &["by_type", t, field]))
            .sum()
    };
    let design = [
        ("job types", types.len() as f64, 2.0),
        ("pushed", total("pushed"), 200.0),
        ("done", total("done"), 180.0),
        ("failed for good", total("failed") + total("killed"), 20.0),
        ("rejected pushes", total("rejected"), 40.0),
    ];
    for (what, got, want) in design {
        assert_eq!(
            got, want,
            "the library's run differs from the design: {what}\n{r}"
        );
    }

    // The table, (job_type, status, attempts) -> jobs, against what wait_for reported
    // (a harness check, before /metrics).
    let t = flavor.table;
    let table: BTreeMap<(String, String, i64), f64> = rows(
        &db,
        &format!(
            "SELECT job_type, status, CAST(attempts AS {{text}}), CAST(count(*) AS {{text}}) \
             FROM {t} GROUP BY job_type, status, attempts"
        ),
    )
    .await
    .into_iter()
    .map(|row| {
        (
            (row[0].clone(), row[1].clone(), num(&row[2]) as i64),
            num(&row[3]),
        )
    })
    .collect();
    let mut library = BTreeMap::new();
    for ty in &types {
        for status in keys(&r, &["by_type", ty, "attempts"]) {
            for (a, c) in attempts_map(&r, &["by_type", ty, "attempts", &status]) {
                library.insert((ty.clone(), status.clone(), a), c);
            }
        }
    }
    assert_eq!(
        table, library,
        "HARNESS: the jobs table (job_type, status, attempts) -> jobs differs from what \
         apalis's wait_for reported"
    );

    // Sums of durations: not in the library's counts, so from the table.
    let seconds = |from: &str| match server.dialect {
        common::Dialect::Postgres => format!("EXTRACT(EPOCH FROM done_at - {from})"),
        _ => format!("TIMESTAMPDIFF(MICROSECOND, {from}, done_at) / 1000000"),
    };
    let durations: BTreeMap<String, (f64, f64)> = rows(
        &db,
        &format!(
            "SELECT job_type, CAST(SUM({}) AS {{text}}), CAST(SUM({}) AS {{text}}) \
             FROM {t} WHERE {FINAL} GROUP BY job_type",
            seconds("lock_at"),
            seconds("run_at")
        ),
    )
    .await
    .into_iter()
    .map(|row| (row[0].clone(), (num(&row[1]), num(&row[2]))))
    .collect();

    let source = flavor.source;
    let mut x = Expectations::default();
    for ty in &types {
        let mut attempts = BTreeMap::new();
        for status in keys(&r, &["by_type", ty, "attempts"]) {
            for (a, c) in attempts_map(&r, &["by_type", ty, "attempts", &status]) {
                *attempts.entry(a).or_default() += c;
            }
        }
        let dead = count(&r, &["by_type", ty, "failed"]) + count(&r, &["by_type", ty, "killed"]);
        let finished = count(&r, &["by_type", ty, "done"]) + dead;
        inbox_counts(
            &mut x,
            source,
            Some(ty),
            count(&r, &["by_type", ty, "pushed"]),
            count(&r, &["by_type", ty, "done"]),
            dead,
            &attempts,
        );
        let l = [("source", source), ("event_type", ty.as_str())];
        x.push("inbox_dead_letters_total", &l, dead, Tol::Exact);
        // lock_at and done_at: every final job observes its last attempt's
        // processing time and its time from run_at.
        let (processing, end_to_end) = durations.get(ty).copied().unwrap_or_default();
        let tol = Tol::Abs(0.001 * finished + 1e-6);
        x.set(
            "inbox_processing_duration_seconds_count",
            &l,
            finished,
            Tol::Exact,
        );
        x.push("inbox_processing_duration_seconds_sum", &l, processing, tol);
        x.push(
            "inbox_end_to_end_latency_seconds_count",
            &l,
            finished,
            Tol::Exact,
        );
        x.push("inbox_end_to_end_latency_seconds_sum", &l, end_to_end, tol);
    }
    inbox_settled(&mut x, source);

    converge(
        &agent,
        &x,
        &[(source, &ABSENT_WITHOUT_DELIVERIES)],
        flavor.preset,
    )
    .await;

    drop(agent);
    drop(db);
    drop_database(&server, &database).await;
}

/// Guards the `apalis-postgres` preset: apalis-postgres 1.0.0's own migrations, pushes
/// and workers on PostgreSQL; per job_type, received = pushed, succeeded = Done,
/// dead-lettered = Failed with attempts = max_attempts, failed attempts and the
/// attempts histogram as apalis's wait_for reports them, durations from lock_at and
/// run_at to done_at; re-pushed idempotency keys leave no trace; nothing is rejected
/// (a retried job's old done_at is not a finish before its new lock_at).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn apalis_postgres_matches_the_librarys_counts() {
    apalis_matches_the_librarys_counts(POSTGRES, Db::postgres().await).await;
}

/// Guards the `apalis-mysql` preset: apalis-mysql 1.0.0-rc.8's own migrations (with
/// MariaDB's collation), pushes and workers on MariaDB; per job_type, received =
/// pushed, succeeded = Done, dead-lettered = Killed (apalis-mysql's word for a last
/// attempt that failed), failed attempts and the attempts histogram as apalis's
/// fetch_by_id reports them, durations (whole seconds) from lock_at and run_at to
/// done_at; re-pushed idempotency keys leave no trace; nothing is rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn apalis_mysql_matches_the_librarys_counts() {
    apalis_matches_the_librarys_counts(MYSQL, Db::mysql().await).await;
}
