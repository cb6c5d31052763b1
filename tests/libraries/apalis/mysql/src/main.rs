//! The standard workload through apalis-mysql 1.0.0-rc.8's own API on MariaDB, for
//! tests/preset_apalis.rs. `--phase setup` runs the crate's migrations in the
//! connection's database (the test gives each run its own) with one change made here:
//! they declare `COLLATE = utf8mb4_0900_ai_ci`, a MySQL 8 collation MariaDB 10.11 does
//! not have, which becomes `utf8mb4_unicode_ci` (the collation apalis-mysql's own
//! `fetch_completed_tasks` query compares ids in). `--phase run` pushes the jobs of the
//! plan, re-pushes `--dups` existing idempotency keys (apalis rejects them), runs one
//! worker per job type until `fetch_by_id` shows every job final, and prints ONE JSON
//! object with what apalis reported (see `workload::Report::to_json`).

#[path = "../../workload.rs"]
mod workload;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use apalis_core::backend::{FetchById, TaskSink};
use apalis_core::error::{BoxDynError, WorkerError};
use apalis_core::task::attempt::Attempt;
use apalis_core::task::builder::TaskBuilder;
use apalis_core::task::status::Status;
use apalis_core::task::task_id::TaskId;
use apalis_core::worker::builder::WorkerBuilder;
use apalis_mysql::{Config, MySqlPool, MySqlStorage, TaskBuilderExt};
use serde_json::Value;
use sqlx::migrate::Migration;
use workload::{Args, DEADLINE, JOB_TYPES, MAX_ATTEMPTS, Report, plan, work};

/// What the crate's migrations say, and what MariaDB needs instead.
const MYSQL_COLLATION: &str = "utf8mb4_0900_ai_ci";
const MARIADB_COLLATION: &str = "utf8mb4_unicode_ci";

async fn handle(job: Value, attempt: Attempt) -> Result<(), BoxDynError> {
    work(&job, attempt.current()).await.map_err(Into::into)
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let pool = MySqlPool::connect(&args.db)
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", args.db));
    match args.phase.as_str() {
        "setup" => setup(&pool).await,
        // `run` names what it waits for when DEADLINE passes; this guard only
        // catches a call into apalis that never returns.
        "run" => {
            let guard = DEADLINE + Duration::from_secs(5);
            match tokio::time::timeout(guard, run(&args, &pool)).await {
                Ok(report) => println!("{}", report.to_json()),
                Err(_) => panic!("a call into apalis did not return within {guard:?}"),
            }
        }
        other => panic!("--phase setup|run, not {other:?}"),
    }
}

/// The crate's migrations, each with MariaDB's collation for MySQL 8's.
async fn setup(pool: &MySqlPool) {
    let mut migrator = MySqlStorage::migrations();
    let changed: Vec<Migration> = migrator
        .migrations
        .iter()
        .map(|m| {
            Migration::new(
                m.version,
                m.description.clone(),
                m.migration_type,
                Cow::Owned(m.sql.replace(MYSQL_COLLATION, MARIADB_COLLATION)),
                m.no_tx,
            )
        })
        .collect();
    migrator.migrations = Cow::Owned(changed);
    migrator
        .run(pool)
        .await
        .unwrap_or_else(|e| panic!("apalis-mysql migrations: {e}"));
}

async fn run(args: &Args, pool: &MySqlPool) -> Report {
    let mut report = Report::default();
    let jobs = plan(args);
    let mut ids: Vec<(&str, TaskId<ulid::Ulid>)> = Vec::new();
    for job in &jobs {
        let id = TaskId::new(ulid::Ulid::new());
        let task = TaskBuilder::new(job.args())
            .with_task_id(id)
            .with_idempotency_key(&job.key)
            .max_attempts(MAX_ATTEMPTS as u32)
            .build();
        MySqlStorage::<Value, (), ()>::new_with_config(pool, &Config::new(job.job_type))
            .push_task(task)
            .await
            .unwrap_or_else(|e| panic!("push job {}: {e}", job.n));
        report.pushed(job.job_type);
        ids.push((job.job_type, id));
    }
    // The same idempotency key again, in the same job type: apalis's unique index on
    // (job_type, idempotency_key) rejects the push.
    for job in jobs.iter().take(args.dups) {
        let task = TaskBuilder::new(job.args())
            .with_idempotency_key(&job.key)
            .max_attempts(MAX_ATTEMPTS as u32)
            .build();
        match MySqlStorage::<Value, (), ()>::new_with_config(pool, &Config::new(job.job_type))
            .push_task(task)
            .await
        {
            Err(e) if e.to_string().contains("idx_jobs_idempotency_key") => {
                report.rejected(job.job_type);
            }
            Err(e) => panic!("re-push of key {}: unexpected error {e}", job.key),
            Ok(()) => panic!("re-push of key {} was accepted", job.key),
        }
    }

    let mut stops = Vec::new();
    let mut workers = Vec::new();
    for job_type in JOB_TYPES {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let worker = WorkerBuilder::new(format!("workload-{job_type}"))
            .backend(MySqlStorage::<Value, (), ()>::new_with_config(
                pool,
                &Config::new(job_type),
            ))
            .build(handle);
        stops.push(stop);
        workers.push(tokio::spawn(worker.run_until(async move {
            let _ = stopped.await;
            Ok::<(), WorkerError>(())
        })));
    }

    // apalis-mysql's wait_for casts to JSON, which MariaDB cannot: ask each job.
    let mut open: BTreeMap<String, (&str, TaskId<ulid::Ulid>)> = ids
        .into_iter()
        .map(|(t, id)| (id.to_string(), (t, id)))
        .collect();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !open.is_empty() {
        // Past the deadline this pass is the last: it notes what each open job shows.
        let late = tokio::time::Instant::now() >= deadline;
        let mut done = Vec::new();
        let mut waiting = Vec::new();
        for (key, (job_type, id)) in &open {
            let mut backend =
                MySqlStorage::<Value, (), ()>::new_with_config(pool, &Config::new(job_type));
            let task = backend
                .fetch_by_id(id)
                .await
                .unwrap_or_else(|e| panic!("fetch_by_id {key}: {e}"))
                .unwrap_or_else(|| panic!("job {key} is gone"));
            let status = task.parts.status.load();
            let attempts = task.parts.attempt.current();
            let max = task.parts.ctx.max_attempts() as usize;
            let last = match status {
                Status::Done | Status::Killed => true,
                Status::Failed => attempts >= max,
                _ => false,
            };
            if last {
                report.finished(job_type, &status.to_string(), attempts);
                done.push(key.clone());
            } else if late {
                waiting.push(format!(
                    "{job_type} {key}: {status} after {attempts} of {max}"
                ));
            }
        }
        for key in done {
            open.remove(&key);
        }
        if !open.is_empty() && late {
            // What a failed run needs to be told apart: a worker that stopped on its
            // own (which), or jobs that apalis never took again (their state).
            let stopped: Vec<String> = JOB_TYPES
                .iter()
                .zip(&workers)
                .filter(|(_, w)| w.is_finished())
                .map(|(t, _)| t.to_string())
                .collect();
            panic!(
                "the workload did not finish within {DEADLINE:?}: {} jobs not final; \
                 workers stopped on their own: {stopped:?}; the first 20 jobs: {:#?}",
                open.len(),
                &waiting[..waiting.len().min(20)]
            );
        }
        if !open.is_empty() {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    for stop in stops {
        let _ = stop.send(());
    }
    for w in workers {
        w.await
            .expect("a worker task")
            .unwrap_or_else(|e| panic!("worker: {e}"));
    }
    report
}
