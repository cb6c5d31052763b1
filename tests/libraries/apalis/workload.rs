//! What the apalis workloads (PostgreSQL and MySQL) share: the command line, the plan
//! of the standard workload (which job is ok, flaky or doomed, of which job type, with
//! which idempotency key) and the report, built from the results apalis returns.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

/// The job types (apalis queues; the `job_type` column): every job goes to one.
pub const JOB_TYPES: [&str; 2] = ["send_email", "render_invoice"];
/// Every job may be tried this often (`max_attempts`).
pub const MAX_ATTEMPTS: usize = 3;
/// How long one attempt works before it returns, so that processing times are real.
pub const WORK: Duration = Duration::from_millis(150);
/// The whole run must end within this; the test's own guard is longer.
pub const DEADLINE: Duration = Duration::from_secs(110);

pub struct Args {
    pub db: String,
    pub phase: String,
    pub ok: usize,
    pub flaky: usize,
    pub doomed: usize,
    pub dups: usize,
}

impl Args {
    /// `--db DSN --phase setup|run [--ok N --flaky N --doomed N --dups N]`.
    pub fn parse() -> Args {
        let mut a = Args {
            db: String::new(),
            phase: String::new(),
            ok: 140,
            flaky: 40,
            doomed: 20,
            dups: 40,
        };
        let argv: Vec<String> = std::env::args().skip(1).collect();
        for pair in argv.chunks(2) {
            let [key, value] = pair else {
                panic!("usage: --db DSN --phase setup|run [--ok N --flaky N --doomed N --dups N]")
            };
            let n = || {
                value
                    .parse::<usize>()
                    .unwrap_or_else(|_| panic!("{key}: not a count"))
            };
            match key.as_str() {
                "--db" => a.db = value.clone(),
                "--phase" => a.phase = value.clone(),
                "--ok" => a.ok = n(),
                "--flaky" => a.flaky = n(),
                "--doomed" => a.doomed = n(),
                "--dups" => a.dups = n(),
                other => panic!("unknown argument {other}"),
            }
        }
        assert!(!a.db.is_empty(), "--db is required");
        a
    }
}

/// What a job does: succeed, fail twice then succeed, or always fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Ok,
    Flaky,
    Doomed,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Ok => "ok",
            Kind::Flaky => "flaky",
            Kind::Doomed => "doomed",
        }
    }

    pub fn from_name(s: &str) -> Kind {
        match s {
            "ok" => Kind::Ok,
            "flaky" => Kind::Flaky,
            "doomed" => Kind::Doomed,
            other => panic!("unknown job kind {other:?}"),
        }
    }
}

/// One job of the plan.
pub struct Job {
    pub n: usize,
    pub kind: Kind,
    pub job_type: &'static str,
    pub key: String,
}

impl Job {
    /// The job's arguments (apalis serialises them into the `job` column).
    pub fn args(&self) -> Value {
        json!({ "n": self.n, "kind": self.kind.name() })
    }
}

/// The jobs, in push order: ok, then flaky, then doomed; job types alternate.
pub fn plan(a: &Args) -> Vec<Job> {
    let kinds = std::iter::repeat_n(Kind::Ok, a.ok)
        .chain(std::iter::repeat_n(Kind::Flaky, a.flaky))
        .chain(std::iter::repeat_n(Kind::Doomed, a.doomed));
    kinds
        .enumerate()
        .map(|(n, kind)| Job {
            n,
            kind,
            job_type: JOB_TYPES[n % JOB_TYPES.len()],
            key: format!("job-{n}"),
        })
        .collect()
}

/// The handler's decision for one attempt (`attempt` counts from 1): `Err` is the
/// error text apalis stores in `last_result`.
pub async fn work(args: &Value, attempt: usize) -> Result<(), String> {
    tokio::time::sleep(WORK).await;
    let kind = Kind::from_name(args["kind"].as_str().unwrap_or_default());
    match kind {
        Kind::Ok => Ok(()),
        Kind::Flaky if attempt > 2 => Ok(()),
        Kind::Flaky => Err(format!("flaky job: transient failure on attempt {attempt}")),
        Kind::Doomed => Err(format!("doomed job: fails on every attempt ({attempt})")),
    }
}

/// The counts of one job type, from what apalis reported.
#[derive(Default)]
pub struct TypeCounts {
    pushed: u64,
    rejected: u64,
    /// status word -> attempts -> jobs
    finished: BTreeMap<String, BTreeMap<usize, u64>>,
}

#[derive(Default)]
pub struct Report {
    by_type: BTreeMap<String, TypeCounts>,
}

impl Report {
    pub fn pushed(&mut self, job_type: &str) {
        self.by_type.entry(job_type.into()).or_default().pushed += 1;
    }

    pub fn rejected(&mut self, job_type: &str) {
        self.by_type.entry(job_type.into()).or_default().rejected += 1;
    }

    /// One job apalis reports final: its status word and attempts.
    pub fn finished(&mut self, job_type: &str, status: &str, attempts: usize) {
        *self
            .by_type
            .entry(job_type.into())
            .or_default()
            .finished
            .entry(status.into())
            .or_default()
            .entry(attempts)
            .or_default() += 1;
    }

    /// `{"by_type": {T: {"pushed", "rejected", "done", "failed", "killed",
    /// "attempts": {"Done": {"1": n, …}, "Failed": {…}, "Killed": {…}}}}}`:
    /// `failed` counts jobs left Failed with attempts >= max_attempts (apalis's
    /// failed for good), `killed` jobs left Killed.
    pub fn to_json(&self) -> Value {
        let by_type: serde_json::Map<String, Value> = self
            .by_type
            .iter()
            .map(|(t, c)| {
                let total = |status: &str| -> u64 {
                    c.finished.get(status).map_or(0, |m| m.values().sum())
                };
                let attempts: serde_json::Map<String, Value> = c
                    .finished
                    .iter()
                    .map(|(status, m)| {
                        let m: serde_json::Map<String, Value> =
                            m.iter().map(|(a, n)| (a.to_string(), json!(n))).collect();
                        (status.clone(), Value::Object(m))
                    })
                    .collect();
                (
                    t.clone(),
                    json!({
                        "pushed": c.pushed,
                        "rejected": c.rejected,
                        "done": total("Done"),
                        "failed": total("Failed"),
                        "killed": total("Killed"),
                        "attempts": attempts,
                    }),
                )
            })
            .collect();
        json!({ "by_type": by_type })
    }
}
