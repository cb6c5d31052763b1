//! The "schema-tested" presets (issue 17, item 3): libraries that cannot run here
//! (Oban, River, good_job, Spring Modulith, solid_queue, .NET CAP). For each, the tables
//! are created in a fresh schema from the library's PUBLISHED DDL
//! (`tests/presets/<name>.sql`, each naming the file and version it copies), the agent
//! starts on the preset, and one generic driver writes a generated workload (fixed seed:
//! successes, failures retried until they succeed, failures for good, re-sends of an
//! existing key) with the statements the library's own source runs to enqueue, claim,
//! fail, retry, complete and give up — each library's "how it writes" is one [`Recipe`].
//! The ground truth is the generated plan: what the library's tables must hold is
//! checked first (a harness check), then /metrics must equal what the plan implies under
//! the counting rules of `cursor = "none"`.
//!
//! The workload advances in rounds (enqueue; claim; fail or complete; ...); between two
//! rounds the agent finishes two polls, so it sees each intermediate state the way it
//! would see a slow worker. Needs PostgreSQL (`INBOXWATCH_TEST_PG`): without it the tests
//! FAIL, they do not skip.
//!
//! Libraries of issue 17 with no preset, because their tables cannot be expressed: the
//! Eventuate Tram `message` and `received_messages` tables keep times as epoch
//! milliseconds in bigint columns and the outbox has no published time; NServiceBus's
//! `OutboxData` has no arrival time (only `DispatchedAt`); Wolverine's incoming envelopes
//! have no arrival time unless `InboxStaleTime` adds the `timestamp` column
//! (`received_at` is the listener's URI); MassTransit's EF Core `InboxState` is created by
//! the application's own EF migration, and a failed consumption rolls back, leaving no
//! trace of failures, while `OutboxMessage` rows are deleted when sent and carry no
//! published time.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::checks::{Expectations, Tol};
use common::library::{
    ABSENT_WITHOUT_DELIVERIES, STABLE, converge, drop_schema, fresh_schema, num, preset_source,
};
use common::workload::{ATTEMPT_BUCKETS, INBOX_EXACT_NAMES};
use common::{Agent, Db, READY_TIMEOUT, repo_path, wait_until};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

/// The seed of every generated workload (the same plan on every run).
const SEED: u64 = 17;
/// Events per library.
const EVENTS: usize = 240;
/// The job types (the `event_type` label).
const TYPES: [&str; 3] = ["Billing.ChargeCard", "Mailer.Welcome", "Reports.Nightly"];
/// Error texts of failed attempts, with the built-in class each falls in and whether
/// that class is retryable (docs/configuration.md, "Error classes").
const ERRORS: [(&str, &str, bool); 4] = [
    ("Timeout: upstream timed out after 5000 ms", "timeout", true),
    (
        "ECONNREFUSED: connection refused by ledger",
        "connection",
        true,
    ),
    ("invalid payload: missing field amount", "invalid", false),
    ("RuntimeError: card declined", "other", true),
];

// ---------------------------------------------------------------------------------
// How each library writes
// ---------------------------------------------------------------------------------

/// How the rows of a library show the plan of one event.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Model {
    /// One row per event, updated in place; giving up makes it dead.
    Row,
    /// One row per event; giving up leaves it failed (nothing dead-letters it).
    FailedStays,
    /// A new row per attempt: a retried attempt's row finishes as a success and a new
    /// row is enqueued; giving up leaves the last row unfinished (pending). No attempts
    /// column.
    RowPerAttempt,
}

/// What a library does to one event's rows.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Step {
    Enqueue,
    Resend,
    Claim,
    RetryLater,
    Requeue,
    Complete,
    GiveUp,
}

/// One library's way of writing its tables: the statements its source runs at each
/// [`Step`], with `{id}` (the row's id: the event's key until a statement with
/// RETURNING gives it), `{prev}` (the id before the last RETURNING), `{key}` (a uuid
/// the client chooses), `{type}`, `{n}` (the attempt), `{max}` (attempts before giving
/// up) and `{error}`. The statements run with the test's schema as search_path.
struct Recipe {
    /// The preset, `presets/<preset>.toml`.
    preset: &'static str,
    /// The published DDL, run with the test's schema as search_path; a line starting
    /// `-- migration: ` starts a migration of its own (its own transaction).
    ddl: &'static str,
    /// The table the preset watches, without its schema.
    table: &'static str,
    model: Model,
    /// Attempts before the library gives up.
    max_attempts: u32,
    /// Attempts made back to back, with no poll in between (1: the agent sees each).
    burst: u32,
    enqueue: &'static [&'static str],
    /// A re-send of an existing key that the library rejects (empty: the library has
    /// no such check, and a re-send is a new event; the plan sends none).
    resend: &'static [&'static str],
    claim: &'static [&'static str],
    /// A failed attempt that will be retried.
    retry_later: &'static [&'static str],
    /// The retry comes due (a scheduler's step), just before the next claim.
    requeue: &'static [&'static str],
    complete: &'static [&'static str],
    /// The last attempt failed and no retry is left.
    give_up: &'static [&'static str],
    /// `type, fate, attempts, count` of the rows, with the library's own notion of
    /// each state (fate: succeeded, dead, failed, pending; attempts 0 without a column).
    harness: &'static str,
}

/// Oban 2.23.0, `Oban.Engines.Basic` (lib/oban/engines/basic.ex): `insert_job` with a
/// unique check, `fetch_jobs`, `error_job`, the stager's `stage_jobs`, `complete_job`,
/// `discard_job`. Times are `utc_now()`, stored without a time zone.
const OBAN: Recipe = Recipe {
    preset: "oban",
    ddl: include_str!("presets/oban.sql"),
    table: "oban_jobs",
    model: Model::Row,
    max_attempts: 3,
    burst: 1,
    enqueue: &[
        "INSERT INTO oban_jobs (state, queue, worker, args, meta, tags, errors, attempt, \
         max_attempts, priority, inserted_at, scheduled_at) VALUES ('available', 'default', \
         '{type}', '{\"key\": \"{key}\"}', '{}', '{}', '{}', 0, {max}, 0, \
         timezone('UTC', now()), timezone('UTC', now())) RETURNING CAST(id AS text)",
    ],
    // insert_unique finds the live job with the same worker and args: nothing is written.
    resend: &[
        "SELECT id FROM oban_jobs WHERE worker = '{type}' AND args @> '{\"key\": \"{key}\"}' \
         AND state IN ('available', 'scheduled', 'executing', 'retryable', 'completed') LIMIT 1",
    ],
    claim: &[
        "WITH subset AS (SELECT id FROM oban_jobs WHERE state = 'available' AND queue = 'default' \
         AND id = {id} ORDER BY priority, scheduled_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) \
         UPDATE oban_jobs j SET state = 'executing', attempted_at = timezone('UTC', now()), \
         attempted_by = ARRAY['node@host', 'producer-uuid'], attempt = j.attempt + 1 \
         FROM subset x WHERE j.id = x.id AND j.attempt < j.max_attempts",
    ],
    retry_later: &[
        "UPDATE oban_jobs SET state = 'retryable', scheduled_at = timezone('UTC', now()), \
         errors = errors || ARRAY[jsonb_build_object('attempt', attempt, 'at', now(), 'error', '{error}')] \
         WHERE id = {id}",
    ],
    requeue: &[
        "UPDATE oban_jobs SET state = 'available' WHERE id IN (SELECT id FROM oban_jobs \
         WHERE state IN ('scheduled', 'retryable') AND scheduled_at <= timezone('UTC', now()) \
         AND id = {id} FOR UPDATE SKIP LOCKED)",
    ],
    complete: &[
        "UPDATE oban_jobs SET state = 'completed', completed_at = timezone('UTC', now()) \
         WHERE id = {id}",
    ],
    give_up: &[
        "UPDATE oban_jobs SET state = 'discarded', discarded_at = timezone('UTC', now()), \
         errors = errors || ARRAY[jsonb_build_object('attempt', attempt, 'at', now(), 'error', '{error}')] \
         WHERE id = {id}",
    ],
    harness: "SELECT worker, CASE state WHEN 'completed' THEN 'succeeded' WHEN 'discarded' THEN 'dead' \
         ELSE CAST(state AS text) END, CAST(attempt AS text), CAST(count(*) AS text) \
         FROM oban_jobs GROUP BY 1, 2, 3",
};

/// River 0.43.0, riverdriver/riverpgxv5/internal/dbsqlc/river_job.sql for one job:
/// `JobInsertFastMany` (unique_key with the default unique states: a live duplicate
/// only rewrites kind), `JobGetAvailable`, `JobSetStateIfRunningMany` (retryable,
/// completed, discarded) and the scheduler's `JobSchedule`.
const RIVER: Recipe = Recipe {
    preset: "river",
    ddl: include_str!("presets/river.sql"),
    table: "river_job",
    model: Model::Row,
    max_attempts: 3,
    burst: 1,
    enqueue: &[RIVER_INSERT],
    resend: &[RIVER_INSERT],
    claim: &[
        "WITH locked_jobs AS (SELECT * FROM river_job WHERE state = 'available' \
         AND queue = 'default' AND scheduled_at <= now() AND id = {id} \
         ORDER BY priority ASC, scheduled_at ASC, id ASC LIMIT 1 FOR UPDATE SKIP LOCKED) \
         UPDATE river_job SET state = 'running', attempt = river_job.attempt + 1, \
         attempted_at = now(), attempted_by = array_append(river_job.attempted_by, 'client-1') \
         FROM locked_jobs WHERE river_job.id = locked_jobs.id",
    ],
    retry_later: &["UPDATE river_job SET attempt = attempt, \
         errors = array_append(errors, jsonb_build_object('at', now(), 'attempt', attempt, 'error', '{error}')), \
         scheduled_at = now(), state = 'retryable' WHERE id = {id} AND state = 'running'"],
    requeue: &[
        "UPDATE river_job SET state = 'available' WHERE id IN (SELECT id FROM river_job \
         WHERE state IN ('retryable', 'scheduled') AND priority >= 0 AND queue IS NOT NULL \
         AND scheduled_at <= now() AND id = {id} FOR UPDATE)",
    ],
    complete: &[
        "UPDATE river_job SET finalized_at = now(), state = 'completed' \
         WHERE id = {id} AND state = 'running'",
    ],
    give_up: &["UPDATE river_job SET \
         errors = array_append(errors, jsonb_build_object('at', now(), 'attempt', attempt, 'error', '{error}')), \
         finalized_at = now(), state = 'discarded' WHERE id = {id} AND state = 'running'"],
    harness: "SELECT kind, CASE state WHEN 'completed' THEN 'succeeded' WHEN 'discarded' THEN 'dead' \
         ELSE CAST(state AS text) END, CAST(attempt AS text), CAST(count(*) AS text) \
         FROM river_job GROUP BY 1, 2, 3",
};

const RIVER_INSERT: &str = "INSERT INTO river_job (args, created_at, kind, max_attempts, metadata, \
     priority, queue, scheduled_at, state, tags, unique_key, unique_states) \
     VALUES ('{\"key\": \"{key}\"}', now(), '{type}', {max}, '{}', 1, 'default', now(), \
     'available', '{}', convert_to('{key}', 'UTF8'), CAST(245 AS integer)::bit(8)) \
     ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND unique_states IS NOT NULL \
     AND river_job_state_in_bitmask(unique_states, state) DO UPDATE SET kind = EXCLUDED.kind \
     RETURNING CAST(id AS text)";

/// good_job 4.19.2, app/models/good_job/job.rb: `enqueue` (a new row whose id is the
/// ActiveJob job id), `perform` (an execution row, then performed_at and
/// executions_count), ActiveJob's `retry_on` re-enqueueing the SAME row (performed_at
/// and finished_at cleared, error_event retried = 3), success, and `retry_on` giving up
/// (the error re-raised: error_event retry_stopped = 4, finished_at set). A concurrency
/// limit's enqueue check (`good_job_control_concurrency_with`) only counts.
const GOOD_JOB: Recipe = Recipe {
    preset: "good-job",
    ddl: include_str!("presets/good-job.sql"),
    table: "good_jobs",
    model: Model::Row,
    max_attempts: 3,
    burst: 1,
    enqueue: &[
        "INSERT INTO good_jobs (id, active_job_id, job_class, queue_name, priority, \
         serialized_params, concurrency_key, created_at, scheduled_at, updated_at) VALUES ('{key}', \
         '{key}', '{type}', 'default', 0, \
         '{\"job_class\": \"{type}\", \"job_id\": \"{key}\", \"executions\": 0}', '{key}', \
         timezone('UTC', now()), timezone('UTC', now()), timezone('UTC', now()))",
    ],
    resend: &[
        "SELECT count(*) FROM good_jobs WHERE concurrency_key = '{key}' AND finished_at IS NULL",
    ],
    claim: &[
        "INSERT INTO good_job_executions (active_job_id, job_class, queue_name, serialized_params, \
         scheduled_at, created_at, updated_at, process_id) SELECT active_job_id, job_class, \
         queue_name, serialized_params, COALESCE(scheduled_at, created_at), timezone('UTC', now()), \
         timezone('UTC', now()), '00000000-0000-4000-8000-00000000c0de' FROM good_jobs WHERE id = '{id}'",
        "UPDATE good_jobs SET performed_at = timezone('UTC', now()), \
         executions_count = COALESCE(executions_count, 0) + 1, \
         locked_by_id = '00000000-0000-4000-8000-00000000c0de', locked_at = timezone('UTC', now()), \
         updated_at = timezone('UTC', now()) WHERE id = '{id}'",
    ],
    retry_later: &[
        "UPDATE good_jobs SET serialized_params = jsonb_set(serialized_params, '{executions}', to_jsonb({n})), \
         scheduled_at = timezone('UTC', now()), performed_at = NULL, finished_at = NULL, \
         updated_at = timezone('UTC', now()) WHERE id = '{id}'",
        "UPDATE good_job_executions SET error = '{error}', error_event = 3, \
         finished_at = timezone('UTC', now()), duration = interval '0.01 seconds', \
         updated_at = timezone('UTC', now()) WHERE active_job_id = '{id}' AND finished_at IS NULL",
        "UPDATE good_jobs SET locked_by_id = NULL, locked_at = NULL, error = '{error}', \
         error_event = 3, updated_at = timezone('UTC', now()) WHERE id = '{id}'",
    ],
    requeue: &[],
    complete: &[
        "UPDATE good_job_executions SET finished_at = timezone('UTC', now()), \
         duration = interval '0.01 seconds', updated_at = timezone('UTC', now()) \
         WHERE active_job_id = '{id}' AND finished_at IS NULL",
        "UPDATE good_jobs SET locked_by_id = NULL, locked_at = NULL, error = NULL, error_event = NULL, \
         finished_at = timezone('UTC', now()), updated_at = timezone('UTC', now()) WHERE id = '{id}'",
    ],
    give_up: &[
        "UPDATE good_job_executions SET error = '{error}', error_event = 4, \
         finished_at = timezone('UTC', now()), duration = interval '0.01 seconds', \
         updated_at = timezone('UTC', now()) WHERE active_job_id = '{id}' AND finished_at IS NULL",
        "UPDATE good_jobs SET locked_by_id = NULL, locked_at = NULL, error = '{error}', error_event = 4, \
         finished_at = timezone('UTC', now()), updated_at = timezone('UTC', now()) WHERE id = '{id}'",
    ],
    harness: "SELECT j.job_class, CASE WHEN j.finished_at IS NOT NULL AND j.error IS NOT NULL THEN 'dead' \
         WHEN j.finished_at IS NOT NULL THEN 'succeeded' ELSE 'pending' END, \
         CAST(j.executions_count AS text), CAST(count(*) AS text) FROM good_jobs j \
         WHERE j.executions_count = (SELECT count(*) FROM good_job_executions e \
         WHERE e.active_job_id = j.id AND e.finished_at IS NOT NULL) GROUP BY 1, 2, 3",
};

/// Spring Modulith 2.1.0, spring-modulith-events-jdbc `JdbcEventPublicationRepositoryV2`:
/// `create` (PUBLISHED, completion_attempts 1), `markProcessing`, `markFailed`,
/// `markResubmitted` (the application's resubmission of failed publications:
/// completion_attempts + 1) and `markCompleted` by event and listener (completion mode
/// UPDATE, the default). Nothing dead-letters a publication and nothing rejects a
/// re-published event.
const SPRING_MODULITH: Recipe = Recipe {
    preset: "spring-modulith",
    ddl: include_str!("presets/spring-modulith.sql"),
    table: "event_publication",
    model: Model::FailedStays,
    max_attempts: 3,
    burst: 1,
    enqueue: &[
        "INSERT INTO event_publication (ID, EVENT_TYPE, LISTENER_ID, PUBLICATION_DATE, \
         SERIALIZED_EVENT, STATUS, COMPLETION_ATTEMPTS, LAST_RESUBMISSION_DATE) VALUES ('{key}', \
         '{type}', 'com.example.Listeners.on', now(), '{\"key\":\"{key}\"}', 'PUBLISHED', 1, now())",
    ],
    resend: &[],
    claim: &[
        "UPDATE event_publication SET STATUS = 'PROCESSING' WHERE ID = '{id}' \
         AND STATUS != 'PROCESSING'",
    ],
    retry_later: &[MODULITH_FAILED],
    requeue: &["UPDATE event_publication SET STATUS = 'RESUBMITTED', \
         COMPLETION_ATTEMPTS = COMPLETION_ATTEMPTS + 1, LAST_RESUBMISSION_DATE = now() \
         WHERE ID = '{id}' AND STATUS != 'RESUBMITTED'"],
    complete: &[
        "UPDATE event_publication SET STATUS = 'COMPLETED', COMPLETION_DATE = now() \
         WHERE LISTENER_ID = 'com.example.Listeners.on' AND COMPLETION_DATE IS NULL \
         AND SERIALIZED_EVENT = '{\"key\":\"{key}\"}'",
    ],
    give_up: &[MODULITH_FAILED],
    harness: "SELECT event_type, CASE status WHEN 'COMPLETED' THEN 'succeeded' WHEN 'FAILED' THEN 'failed' \
         ELSE status END, CAST(completion_attempts AS text), CAST(count(*) AS text) \
         FROM event_publication GROUP BY 1, 2, 3",
};

const MODULITH_FAILED: &str =
    "UPDATE event_publication SET STATUS = 'FAILED' WHERE ID = '{id}' AND STATUS != 'FAILED'";

/// solid_queue 1.5.0, app/models/solid_queue/: `Job.enqueue` (a jobs row and a ready
/// execution), `ReadyExecution.claim` (a claimed execution replaces the ready one),
/// `ClaimedExecution#perform` finishing the job (`finished!`: finished_at) or failing
/// it (`failed_with`: a failed execution), ActiveJob's `retry_on` enqueueing a NEW jobs
/// row with the same active_job_id (a scheduled execution) while the attempt itself
/// finishes, and the dispatcher moving a due scheduled execution to ready.
const SOLID_QUEUE: Recipe = Recipe {
    preset: "solid-queue-jobs",
    ddl: include_str!("presets/solid-queue.sql"),
    table: "solid_queue_jobs",
    model: Model::RowPerAttempt,
    max_attempts: 3,
    burst: 1,
    enqueue: &[
        "INSERT INTO solid_queue_jobs (queue_name, class_name, arguments, priority, active_job_id, \
         scheduled_at, created_at, updated_at) VALUES ('default', '{type}', \
         '{\"job_class\":\"{type}\",\"job_id\":\"{key}\",\"executions\":0}', 0, '{key}', \
         timezone('UTC', now()), timezone('UTC', now()), timezone('UTC', now())) RETURNING CAST(id AS text)",
        "INSERT INTO solid_queue_ready_executions (job_id, queue_name, priority, created_at) \
         VALUES ({id}, 'default', 0, timezone('UTC', now()))",
    ],
    resend: &[],
    claim: &[
        "INSERT INTO solid_queue_claimed_executions (job_id, process_id, created_at) \
         VALUES ({id}, 1, timezone('UTC', now()))",
        "DELETE FROM solid_queue_ready_executions WHERE job_id IN ({id})",
    ],
    retry_later: &[
        "INSERT INTO solid_queue_jobs (queue_name, class_name, arguments, priority, active_job_id, \
         scheduled_at, created_at, updated_at) VALUES ('default', '{type}', \
         '{\"job_class\":\"{type}\",\"job_id\":\"{key}\",\"executions\":{n}}', 0, '{key}', \
         timezone('UTC', now()), timezone('UTC', now()), timezone('UTC', now())) RETURNING CAST(id AS text)",
        "INSERT INTO solid_queue_scheduled_executions (job_id, queue_name, priority, scheduled_at, \
         created_at) VALUES ({id}, 'default', 0, timezone('UTC', now()), timezone('UTC', now()))",
        "UPDATE solid_queue_jobs SET finished_at = timezone('UTC', now()), \
         updated_at = timezone('UTC', now()) WHERE id = {prev}",
        "DELETE FROM solid_queue_claimed_executions WHERE job_id = {prev}",
    ],
    requeue: &[
        "INSERT INTO solid_queue_ready_executions (job_id, queue_name, priority, created_at) \
         SELECT job_id, queue_name, priority, timezone('UTC', now()) \
         FROM solid_queue_scheduled_executions WHERE job_id = {id}",
        "DELETE FROM solid_queue_scheduled_executions WHERE job_id = {id}",
    ],
    complete: &[
        "UPDATE solid_queue_jobs SET finished_at = timezone('UTC', now()), \
         updated_at = timezone('UTC', now()) WHERE id = {id}",
        "DELETE FROM solid_queue_claimed_executions WHERE job_id = {id}",
    ],
    give_up: &[
        "INSERT INTO solid_queue_failed_executions (job_id, error, created_at) VALUES ({id}, \
         '{\"exception_class\":\"RuntimeError\",\"message\":\"{error}\",\"backtrace\":[]}', \
         timezone('UTC', now()))",
        "DELETE FROM solid_queue_claimed_executions WHERE job_id = {id}",
    ],
    // A row failed for good is the one with a failed execution; it stays pending.
    harness: "SELECT j.class_name, CASE WHEN j.finished_at IS NOT NULL THEN 'succeeded' \
         WHEN EXISTS (SELECT 1 FROM solid_queue_failed_executions f WHERE f.job_id = j.id) \
         THEN 'pending' ELSE 'other' END, '0', CAST(count(*) AS text) \
         FROM solid_queue_jobs j GROUP BY 1, 2, 3",
};

/// .NET CAP 10.0.1, src/DotNetCore.CAP.PostgreSql/IDataStorage.PostgreSql.cs and
/// src/DotNetCore.CAP/Internal/ISubscribeExector.Default.cs: `StoreReceivedMessageAsync`
/// (a row per delivery: a snowflake Id, Retries 0, Scheduled, Added = DateTime.Now),
/// nothing written when an attempt starts, `SetFailedState` (Retries + 1, the exception
/// in Content's headers, Failed) and `SetSuccessfulState` (Succeeded). Retries stop at
/// FailedRetryCount (50): the first three attempts run back to back, the retry
/// processor's (a SELECT of Failed rows under 50 Retries) every minute after; several
/// attempts fall between two polls. A redelivered message is a new row, not a rejected
/// key: the plan sends none.
const CAP: Recipe = Recipe {
    preset: "cap-received",
    ddl: include_str!("presets/cap.sql"),
    table: "received",
    model: Model::Row,
    max_attempts: 50,
    burst: 10,
    enqueue: &[
        "INSERT INTO received (\"Id\",\"Version\",\"Name\",\"Group\",\"Content\",\"Retries\",\"Added\",\"ExpiresAt\",\"StatusName\") \
         VALUES({num},'v1','{type}','billing.v1', \
         '{\"Headers\":{\"cap-msg-id\":\"{key}\",\"cap-msg-name\":\"{type}\",\"cap-msg-group\":\"billing.v1\"},\"Value\":{}}', \
         0,LOCALTIMESTAMP,NULL,'Scheduled') RETURNING CAST(\"Id\" AS text)",
    ],
    resend: &[],
    claim: &[],
    retry_later: &[CAP_FAILED],
    requeue: &[],
    complete: &[
        "UPDATE received SET \"Content\"='{\"Headers\":{\"cap-msg-id\":\"{key}\",\"cap-msg-name\":\"{type}\",\"cap-msg-group\":\"billing.v1\"},\"Value\":{}}', \
         \"Retries\"={failed},\"ExpiresAt\"=LOCALTIMESTAMP + interval '86400 seconds',\"StatusName\"='Succeeded' WHERE \"Id\"={id}",
    ],
    give_up: &[CAP_FAILED],
    harness: "SELECT \"Name\", CASE WHEN \"StatusName\" = 'Succeeded' THEN 'succeeded' \
         WHEN \"StatusName\" = 'Failed' AND \"Retries\" >= 50 THEN 'dead' ELSE \"StatusName\" END, \
         CAST(CASE WHEN \"StatusName\" = 'Succeeded' THEN \"Retries\" + 1 ELSE \"Retries\" END AS text), \
         CAST(count(*) AS text) FROM received GROUP BY 1, 2, 3",
};

const CAP_FAILED: &str = "UPDATE received SET \"Content\"='{\"Headers\":{\"cap-msg-id\":\"{key}\",\"cap-msg-name\":\"{type}\",\"cap-msg-group\":\"billing.v1\",\"cap-exception\":\"{error}\"},\"Value\":{}}', \
     \"Retries\"={n},\"ExpiresAt\"=\"Added\" + interval '1296000 seconds',\"StatusName\"='Failed' WHERE \"Id\"={id}";

impl Recipe {
    fn statements(&self, step: Step) -> &'static [&'static str] {
        match step {
            Step::Enqueue => self.enqueue,
            Step::Resend => self.resend,
            Step::Claim => self.claim,
            Step::RetryLater => self.retry_later,
            Step::Requeue => self.requeue,
            Step::Complete => self.complete,
            Step::GiveUp => self.give_up,
        }
    }
}

// ---------------------------------------------------------------------------------
// The generated plan and what it implies
// ---------------------------------------------------------------------------------

/// One generated event: its type, how many attempts fail, whether it is given up, and
/// whether its key is sent again.
#[derive(Clone, Debug)]
struct Event {
    index: usize,
    ty: &'static str,
    failures: u32,
    given_up: bool,
    resent: bool,
    /// The text, class and retryability of every failure of this event.
    error: (&'static str, &'static str, bool),
}

impl Event {
    fn key(&self) -> String {
        format!("00000000-0000-4000-8000-{:012x}", 0x17_0000 + self.index)
    }
}

/// The plan: about 60 % succeed at once, 25 % after 1 or 2 failures, 15 % fail every
/// attempt and are given up; 15 % of the keys are sent again.
fn plan(max_attempts: u32) -> Vec<Event> {
    let mut rng = fastrand::Rng::with_seed(SEED);
    (0..EVENTS)
        .map(|index| {
            let ty = TYPES[rng.usize(..TYPES.len())];
            let roll = rng.u32(..100);
            let (failures, given_up) = if roll < 60 {
                (0, false)
            } else if roll < 85 {
                (rng.u32(1..max_attempts), false)
            } else {
                (max_attempts, true)
            };
            Event {
                index,
                ty,
                failures,
                given_up,
                resent: rng.u32(..100) < 15,
                error: ERRORS[rng.usize(..ERRORS.len())],
            }
        })
        .collect()
}

/// Where a row of the library's table ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fate {
    Succeeded,
    Dead,
    /// Unfinished, failed (counted in the backlog).
    Failed,
    /// Unfinished, pending (counted in the backlog).
    Pending,
}

impl Fate {
    fn word(self) -> &'static str {
        match self {
            Fate::Succeeded => "succeeded",
            Fate::Dead => "dead",
            Fate::Failed => "failed",
            Fate::Pending => "pending",
        }
    }
}

/// One row as the plan leaves it: its fate, the attempts its column shows (`None`
/// without an attempts column) and the failed attempts the agent counts for it.
#[derive(Clone, Copy, Debug)]
struct RowEnd {
    fate: Fate,
    attempts: Option<u32>,
    failures: u32,
    /// The class of its failures and whether that class is retryable.
    class: (&'static str, bool),
}

/// The rows one event leaves, by the library's model.
fn rows_of(model: Model, e: &Event) -> Vec<RowEnd> {
    let attempts = if e.given_up {
        e.failures
    } else {
        e.failures + 1
    };
    match model {
        Model::Row => vec![RowEnd {
            fate: if e.given_up {
                Fate::Dead
            } else {
                Fate::Succeeded
            },
            attempts: Some(attempts),
            // A dead row's last attempt is its dead-lettering, not a retried failure.
            failures: attempts - 1,
            class: (e.error.1, e.error.2),
        }],
        Model::FailedStays => vec![RowEnd {
            fate: if e.given_up {
                Fate::Failed
            } else {
                Fate::Succeeded
            },
            attempts: Some(attempts),
            failures: if e.given_up { attempts } else { attempts - 1 },
            class: (e.error.1, e.error.2),
        }],
        Model::RowPerAttempt => (1..=attempts)
            .map(|a| RowEnd {
                fate: if a == attempts && e.given_up {
                    Fate::Pending
                } else {
                    Fate::Succeeded
                },
                attempts: None,
                failures: 0,
                class: (e.error.1, e.error.2),
            })
            .collect(),
    }
}

/// The steps of one event, round by round: enqueue; then per burst of attempts a claim
/// round (the re-send goes with the first claim, the scheduler's requeue with the later
/// ones) and a round with the outcome of each attempt of the burst (and the claims of
/// all but its first).
fn rounds_of(r: &Recipe, e: &Event) -> Vec<Vec<Step>> {
    let mut out = vec![vec![Step::Enqueue]];
    let attempts = if e.given_up {
        e.failures
    } else {
        e.failures + 1
    };
    let outcome = |n: u32| {
        if n <= e.failures {
            if n == attempts && e.given_up {
                Step::GiveUp
            } else {
                Step::RetryLater
            }
        } else {
            Step::Complete
        }
    };
    let mut first = 1;
    while first <= attempts {
        let last = (first + r.burst - 1).min(attempts);
        let mut claim = Vec::new();
        if first == 1 && e.resent && !r.resend.is_empty() {
            claim.push(Step::Resend);
        }
        if first > 1 {
            claim.push(Step::Requeue);
        }
        claim.push(Step::Claim);
        out.push(claim);
        let mut outcomes = vec![outcome(first)];
        for n in first + 1..=last {
            outcomes.extend([Step::Requeue, Step::Claim, outcome(n)]);
        }
        out.push(outcomes);
        first = last + 1;
    }
    out
}

// ---------------------------------------------------------------------------------
// The driver
// ---------------------------------------------------------------------------------

/// The state of one event's row(s) while the driver writes.
struct Cursor {
    id: String,
    prev: String,
    attempt: u32,
}

fn fill(sql: &str, r: &Recipe, e: &Event, c: &Cursor) -> String {
    sql.replace("{id}", &c.id)
        .replace("{prev}", &c.prev)
        .replace("{key}", &e.key())
        .replace("{type}", e.ty)
        .replace(
            "{num}",
            &(7_130_000_000_000_000_i64 + e.index as i64).to_string(),
        )
        .replace("{n}", &c.attempt.to_string())
        .replace("{failed}", &c.attempt.saturating_sub(1).to_string())
        .replace("{max}", &r.max_attempts.to_string())
        .replace("{error}", e.error.0)
}

/// A connection pool whose sessions have `schema` as search_path: the library's
/// statements run unqualified, as the library runs them in its own schema.
async fn writer(db: &Db, schema: &str) -> PgPool {
    let opts: PgConnectOptions = db
        .dsn
        .parse()
        .unwrap_or_else(|e| panic!("parse the PostgreSQL DSN {}: {e}", db.dsn));
    PgPoolOptions::new()
        .max_connections(1)
        .connect_with(opts.options([("search_path", schema)]))
        .await
        .unwrap_or_else(|e| panic!("connect the writer to {}: {e}", db.dsn))
}

async fn run(pool: &PgPool, sql: &str) -> Option<String> {
    let q = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql.to_string()));
    if sql.contains("RETURNING") {
        Some(
            q.fetch_one(pool)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}")),
        )
    } else {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
            .execute(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        None
    }
}

/// Rows of a query whose columns are all text, through the writer's session.
async fn text_rows(pool: &PgPool, sql: &str) -> Vec<Vec<String>> {
    use sqlx::Row;
    sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
        .fetch_all(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|row| {
            (0..row.len())
                .map(|i| {
                    row.try_get::<Option<String>, _>(i)
                        .unwrap_or_else(|e| panic!("{sql}: column {i} is not text: {e}"))
                        .unwrap_or_default()
                })
                .collect()
        })
        .collect()
}

/// Polls the source has finished.
async fn polls(agent: &Agent, source: &str) -> f64 {
    agent.scrape().await.sum(
        "inboxwatch_poll_duration_seconds_count",
        &[("source", source)],
    )
}

/// Waits until the agent has finished two more polls of `source` (so one began after
/// the writes so far).
async fn two_polls(agent: &Agent, source: &str) {
    let start = polls(agent, source).await;
    wait_until(Duration::from_secs(20), || async {
        if polls(agent, source).await >= start + 2.0 {
            Ok(())
        } else {
            Err(format!("{source}: fewer than two polls since {start}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Writes the whole plan, round by round, the agent polling in between.
async fn drive(r: &Recipe, pool: &PgPool, events: &[Event], agent: &Agent, source: &str) {
    let rounds: Vec<_> = events.iter().map(|e| rounds_of(r, e)).collect();
    let mut cursors: Vec<Cursor> = events
        .iter()
        .map(|e| Cursor {
            id: e.key(),
            prev: e.key(),
            attempt: 0,
        })
        .collect();
    let longest = rounds.iter().map(Vec::len).max().unwrap_or(0);
    for round in 0..longest {
        for (i, e) in events.iter().enumerate() {
            let Some(steps) = rounds[i].get(round) else {
                continue;
            };
            for step in steps {
                if *step == Step::Claim {
                    cursors[i].attempt += 1;
                }
                for sql in r.statements(*step) {
                    let sql = fill(sql, r, e, &cursors[i]);
                    if let Some(id) = run(pool, &sql).await {
                        cursors[i].prev = std::mem::replace(&mut cursors[i].id, id);
                    }
                }
            }
        }
        two_polls(agent, source).await;
    }
}

// ---------------------------------------------------------------------------------
// The preset as a [[sources]] entry
// ---------------------------------------------------------------------------------

/// The preset's column map, from its file (the agent reads the same file, embedded).
fn preset_columns(preset: &str) -> toml::Table {
    let path = repo_path(&format!("presets/{preset}.toml"));
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let file: toml::Table = text
        .parse()
        .unwrap_or_else(|e| panic!("{} is not TOML: {e}", path.display()));
    assert_eq!(
        file.get("proof").and_then(|p| p.as_str()),
        Some("schema-tested"),
        "{preset}: a preset proven by this test is \"schema-tested\""
    );
    file.get("source")
        .and_then(|s| s.get("columns"))
        .and_then(|c| c.as_table())
        .cloned()
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------
// Expectations
// ---------------------------------------------------------------------------------

/// Per event type: count and sum (seconds) of the processing durations (started_at →
/// finished_at) and of the end-to-end latencies (received_at → finished_at) of the
/// finished rows, from the table (the plan has no clock).
async fn durations(
    pool: &PgPool,
    table: &str,
    columns: &toml::Table,
) -> BTreeMap<String, [(f64, f64); 2]> {
    let col = |m: &str| {
        columns
            .get(m)
            .and_then(|c| c.as_str())
            .map(|c| format!("\"{c}\""))
    };
    let Some(finished) = col("finished_at") else {
        return BTreeMap::new();
    };
    let ty = col("event_type").expect("every recipe maps event_type");
    let received = col("received_at").expect("received_at is required");
    let processing = match col("started_at") {
        Some(started) => format!(
            "CAST(count({started}) AS text), \
             CAST(COALESCE(SUM(EXTRACT(EPOCH FROM {finished} - {started})), 0) AS text)"
        ),
        None => "'0', '0'".to_string(),
    };
    text_rows(
        pool,
        &format!(
            "SELECT {ty}, {processing}, CAST(count(*) AS text), \
             CAST(COALESCE(SUM(EXTRACT(EPOCH FROM {finished} - {received})), 0) AS text) \
             FROM {table} WHERE {finished} IS NOT NULL GROUP BY 1"
        ),
    )
    .await
    .into_iter()
    .map(|r| {
        (
            r[0].clone(),
            [(num(&r[1]), num(&r[2])), (num(&r[3]), num(&r[4]))],
        )
    })
    .collect()
}

/// What /metrics must show for `source` once the plan is written.
fn expectations(
    source: &str,
    ends: &BTreeMap<&'static str, Vec<RowEnd>>,
    durations: &BTreeMap<String, [(f64, f64); 2]>,
    classes: bool,
) -> Expectations {
    let mut x = Expectations::default();
    let mut backlog = 0.0;
    for (ty, rows) in ends {
        let l = [("source", source), ("event_type", *ty)];
        let with = |k: &'static str, v: &'static str| {
            let mut l = l.to_vec();
            l.push((k, v));
            l
        };
        let count = |f: Fate| rows.iter().filter(|e| e.fate == f).count() as f64;
        x.push(
            "inbox_messages_received_total",
            &l,
            rows.len() as f64,
            Tol::Exact,
        );
        x.push(
            "inbox_messages_completed_total",
            &with("outcome", "succeeded"),
            count(Fate::Succeeded),
            Tol::Exact,
        );
        x.push(
            "inbox_messages_completed_total",
            &with("outcome", "dead_lettered"),
            count(Fate::Dead),
            Tol::Exact,
        );
        backlog += count(Fate::Failed) + count(Fate::Pending);
        let failures: u32 = rows.iter().map(|e| e.failures).sum();
        x.push(
            "inbox_attempt_failures_total",
            &l,
            f64::from(failures),
            Tol::Exact,
        );
        if classes {
            // With last_error mapped: dead letters by the class of their error, and the
            // retries spent after a failure no retry can fix. (Failures by class are
            // not compared: good_job saves a retried job in two writes, the re-enqueue
            // before the error, and a poll between them counts that failure as
            // `unknown`; their total is compared above.)
            let mut dead: BTreeMap<&str, f64> = BTreeMap::new();
            let mut permanent = 0.0;
            for e in rows {
                if e.fate == Fate::Dead {
                    *dead.entry(e.class.0).or_default() += 1.0;
                }
                if !e.class.1 && matches!(e.fate, Fate::Succeeded | Fate::Dead) {
                    permanent += f64::from(e.failures);
                }
            }
            for (class, n) in dead {
                let mut lc = l.to_vec();
                lc.push(("error_class", class));
                x.push("inbox_dead_letters_total", &lc, n, Tol::Exact);
            }
            x.push(
                "inbox_permanent_error_retries_total",
                &l,
                permanent,
                Tol::Exact,
            );
        }
        let completed: Vec<f64> = rows
            .iter()
            .filter(|e| matches!(e.fate, Fate::Succeeded | Fate::Dead))
            .map(|e| f64::from(e.attempts.unwrap_or(1)))
            .collect();
        x.push(
            "inbox_delivery_attempts_count",
            &l,
            completed.len() as f64,
            Tol::Exact,
        );
        x.push(
            "inbox_delivery_attempts_sum",
            &l,
            completed.iter().sum(),
            Tol::Exact,
        );
        for le in ATTEMPT_BUCKETS.iter().copied().chain([f64::INFINITY]) {
            let le_txt = if le.is_infinite() {
                "+Inf".to_string()
            } else {
                le.to_string()
            };
            let mut lb = l.to_vec();
            lb.push(("le", le_txt.as_str()));
            let c = completed.iter().filter(|a| **a <= le).count() as f64;
            x.push("inbox_delivery_attempts_bucket", &lb, c, Tol::Exact);
        }
        let [(pn, psum), (en, esum)] = durations.get(*ty).copied().unwrap_or_default();
        for (name, n) in [
            ("inbox_processing_duration_seconds_count", pn),
            ("inbox_end_to_end_latency_seconds_count", en),
        ] {
            x.push(name, &l, n, Tol::Exact);
        }
        for (name, n, sum) in [
            ("inbox_processing_duration_seconds_sum", pn, psum),
            ("inbox_end_to_end_latency_seconds_sum", en, esum),
        ] {
            x.push(name, &l, sum, Tol::Abs(0.001 * n + 1e-6));
        }
    }
    let s = [("source", source)];
    x.push("inbox_backlog_messages", &s, backlog, Tol::Exact);
    if backlog == 0.0 {
        x.push("inbox_oldest_unprocessed_age_seconds", &s, 0.0, Tol::Exact);
    }
    x.push("inbox_stuck_messages", &s, 0.0, Tol::Exact);
    x.push("inboxwatch_rows_rejected_total", &s, 0.0, Tol::Exact);
    x.push("inboxwatch_source_up", &s, 1.0, Tol::Exact);
    for name in INBOX_EXACT_NAMES
        .iter()
        .copied()
        .chain(["inbox_backlog_messages", "inbox_stuck_messages"])
    {
        x.close(name, &s);
    }
    if classes {
        x.close("inbox_dead_letters_total", &s);
        x.close("inbox_permanent_error_retries_total", &s);
    }
    x
}

// ---------------------------------------------------------------------------------
// One recipe, end to end
// ---------------------------------------------------------------------------------

async fn prove(r: &Recipe) {
    let started = Instant::now();
    let db = Db::postgres().await;
    let schema = fresh_schema(&db, &r.preset.replace('-', "_")).await;
    let pool = writer(&db, &schema).await;
    // One transaction per migration, as the libraries run them (a new enum value cannot
    // be used in the transaction that adds it).
    for migration in r.ddl.split("\n-- migration: ") {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("-- {migration}")))
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("{}: the published DDL failed: {e}", r.preset));
    }

    let source = r.preset;
    let columns = preset_columns(r.preset);
    let table = format!("{schema}.{}", r.table);
    let agent = Agent::start(&preset_source(r.preset, source, &db.dsn, Some(&table)));
    agent.wait_ready(READY_TIMEOUT).await;

    let events = plan(r.max_attempts);
    drive(r, &pool, &events, &agent, source).await;

    // What the plan leaves in the table, by the library's own notion of each state.
    let mut ends: BTreeMap<&'static str, Vec<RowEnd>> = BTreeMap::new();
    for e in &events {
        ends.entry(e.ty).or_default().extend(rows_of(r.model, e));
    }
    let mut planned: BTreeMap<(String, String, u32), f64> = BTreeMap::new();
    for (ty, rows) in &ends {
        for e in rows {
            *planned
                .entry((
                    ty.to_string(),
                    e.fate.word().to_string(),
                    e.attempts.unwrap_or(0),
                ))
                .or_default() += 1.0;
        }
    }
    let table: BTreeMap<(String, String, u32), f64> = text_rows(&pool, r.harness)
        .await
        .into_iter()
        .map(|row| {
            (
                (row[0].clone(), row[1].clone(), num(&row[2]) as u32),
                num(&row[3]),
            )
        })
        .collect();
    assert_eq!(
        table, planned,
        "HARNESS: {}: the rows (type, state, attempts) -> count differ from the plan",
        r.preset
    );
    let resent = events.iter().filter(|e| e.resent).count();
    let all: Vec<&RowEnd> = ends.values().flatten().collect();
    let fates: BTreeMap<&str, usize> = all.iter().fold(BTreeMap::new(), |mut m, e| {
        *m.entry(e.fate.word()).or_default() += 1;
        m
    });
    eprintln!(
        "{}: {} events, {} rows {fates:?}, {} failed attempts, {} re-sent keys rejected; \
         wrote in {:.1} s",
        r.preset,
        events.len(),
        all.len(),
        all.iter().map(|e| e.failures).sum::<u32>(),
        if r.resend.is_empty() { 0 } else { resent },
        started.elapsed().as_secs_f64()
    );

    let durations = durations(&pool, r.table, &columns).await;
    let x = expectations(
        source,
        &ends,
        &durations,
        columns.contains_key("last_error"),
    );
    converge(
        &agent,
        &x,
        &[(source, &ABSENT_WITHOUT_DELIVERIES)],
        r.preset,
    )
    .await;
    eprintln!(
        "{}: proven in {:.1} s (of which {:.0} s staying put)",
        r.preset,
        started.elapsed().as_secs_f64(),
        STABLE.as_secs_f64()
    );

    drop(agent);
    pool.close().await;
    drop_schema(&db, &schema).await;
}

/// Guards the `oban` preset against Oban 2.23.0's published schema and the statements of
/// its Basic engine: received, completed (completed / discarded), attempt failures and
/// the attempts histogram per worker equal the plan, durations equal the table's, the
/// backlog ends at 0, rejected unique re-inserts leave no count.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oban_preset_matches_the_plan() {
    prove(&OBAN).await;
}

/// Guards the `river` preset against River 0.43.0's migrations and its job queries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn river_preset_matches_the_plan() {
    prove(&RIVER).await;
}

/// Guards the `good-job` preset (status from rules, error classes from `error`) against
/// good_job 4.19.2's migration and its perform / retry / discard writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn good_job_preset_matches_the_plan() {
    prove(&GOOD_JOB).await;
}

/// Guards the `spring-modulith` preset against the v2 event publication schema of Spring
/// Modulith 2.1.0 and its JDBC repository: failed publications stay in the backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spring_modulith_preset_matches_the_plan() {
    prove(&SPRING_MODULITH).await;
}

/// Guards the `cap-received` preset (a column of failed attempts, `attempts_count =
/// "failed"`; dead at Retries 50 by a rule) against CAP 10.0.1's PostgreSQL storage.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cap_received_preset_matches_the_plan() {
    prove(&CAP).await;
}

/// Guards the `solid-queue-jobs` preset against solid_queue 1.5.0's schema: a row per
/// attempt, jobs failed for good stay pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn solid_queue_preset_matches_the_plan() {
    prove(&SOLID_QUEUE).await;
}
