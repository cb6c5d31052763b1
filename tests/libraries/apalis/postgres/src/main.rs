//! The standard workload through apalis-postgres 1.0.0's own API, for
//! tests/preset_apalis.rs. `--phase setup` runs the crate's migrations (they create
//! the schema `apalis`, a name the crate's SQL hard-codes: the test gives each run a
//! database of its own); `--phase run` pushes the jobs of the plan into their job
//! types' queues, re-pushes `--dups` existing idempotency keys (apalis rejects them),
//! runs one worker per job type until `wait_for` has every job final, and prints ONE
//! JSON object with what apalis reported (see `workload::Report::to_json`).

#[path = "../../workload.rs"]
mod workload;

use std::collections::BTreeMap;
use std::str::FromStr;

use apalis_core::backend::{TaskSink, WaitForCompletion};
use apalis_core::error::{BoxDynError, WorkerError};
use apalis_core::task::attempt::Attempt;
use apalis_core::task::builder::TaskBuilder;
use apalis_core::task::task_id::TaskId;
use apalis_core::worker::builder::WorkerBuilder;
use apalis_postgres::{Config, PgPool, PostgresStorage};
use futures::StreamExt;
use serde_json::Value;
use workload::{Args, DEADLINE, JOB_TYPES, MAX_ATTEMPTS, Report, plan, work};

async fn handle(job: Value, attempt: Attempt) -> Result<(), BoxDynError> {
    work(&job, attempt.current()).await.map_err(Into::into)
}

fn storage(pool: &PgPool, job_type: &str) -> PostgresStorage<Value> {
    PostgresStorage::new(pool).with_config(Config::default().queue(job_type))
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let pool = PgPool::connect(&args.db)
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", args.db));
    match args.phase.as_str() {
        "setup" => PostgresStorage::setup(&pool)
            .await
            .unwrap_or_else(|e| panic!("apalis-postgres migrations: {e}")),
        "run" => match tokio::time::timeout(DEADLINE, run(&args, &pool)).await {
            Ok(report) => println!("{}", report.to_json()),
            Err(_) => panic!("the workload did not finish within {DEADLINE:?}"),
        },
        other => panic!("--phase setup|run, not {other:?}"),
    }
}

async fn run(args: &Args, pool: &PgPool) -> Report {
    let mut report = Report::default();
    let jobs = plan(args);
    let mut ids: BTreeMap<&str, Vec<TaskId>> = BTreeMap::new();
    for job in &jobs {
        let id = TaskId::from_str(&ulid::Ulid::generate().to_string()).expect("a ULID");
        let task = TaskBuilder::new(job.args())
            .task_id(id.clone())
            .idempotency_key(&job.key)
            .max_attempts(MAX_ATTEMPTS)
            .build();
        storage(pool, job.job_type)
            .push_task(task)
            .await
            .unwrap_or_else(|e| panic!("push job {}: {e}", job.n));
        report.pushed(job.job_type);
        ids.entry(job.job_type).or_default().push(id);
    }
    // The same idempotency key again, in the same job type: apalis's unique index on
    // (job_type, idempotency_key) rejects the push.
    for job in jobs.iter().take(args.dups) {
        let task = TaskBuilder::new(job.args())
            .idempotency_key(&job.key)
            .max_attempts(MAX_ATTEMPTS)
            .build();
        match storage(pool, job.job_type).push_task(task).await {
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
            .backend(storage(pool, job_type))
            .build(handle);
        stops.push(stop);
        workers.push(tokio::spawn(worker.run_until(async move {
            let _ = stopped.await;
            Ok::<(), WorkerError>(())
        })));
    }

    for job_type in JOB_TYPES {
        let want = ids.get(job_type).map_or(0, Vec::len);
        let mut results = WaitForCompletion::<Value>::wait_for(
            &mut storage(pool, job_type),
            ids.remove(job_type).unwrap_or_default(),
        );
        let mut got = 0;
        while let Some(r) = results.next().await {
            let r = r.unwrap_or_else(|e| panic!("wait_for: {e}"));
            report.finished(job_type, &r.status.to_string(), r.attempt);
            got += 1;
        }
        assert_eq!(
            got, want,
            "wait_for ended with {got} of {want} {job_type} jobs"
        );
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
