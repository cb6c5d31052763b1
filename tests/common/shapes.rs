//! Ground truth for the tables consumers already have (issue 12): processing records
//! with no change cursor (`updated_at`), no `deliveries` and no `traceparent`, under
//! their own column names and status words, and a job table whose consumer deletes a
//! row when it succeeds.
//!
//! * shape A: `message_key`, `business_type`, `body_digest`, `first_arrival`,
//!   `processing_start`, `processing_end`, `status`, `failure_reason`, `retry_count`
//!   (the attempts made so far);
//! * shape B: `event_id`, `event_type`, `status`, `first_received`, `completion_time`,
//!   `error_summary` — no start time, no attempts;
//! * deleted on success: `event_id`, `event_type`, `status`, `received_at`,
//!   `started_at`, `finished_at`, `attempts`, `last_error`; a succeeded row is
//!   DELETEd, a dead one kept.
//!
//! Four writers, each on its own connection, play consumers: events that succeed first
//! time, fail and retry then succeed, fail for good (dead), stay pending, processing or
//! failed at the end, several types, and late commits (a transaction that writes
//! received and finished times and commits 3 s later, inside the agent's 10 s overlap
//! window). Every state written is kept, and the exact value of every counter and
//! histogram `_count`/`_sum` follows from the final states by the counting rules of
//! `cursor = "none"` (docs/metrics.md).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering as Atomic};
use std::time::Duration;

use super::checks::{Expectations, Tol};
use super::workload::{ATTEMPT_BUCKETS, Clock, EVENT_TYPES, Status, Target, seed_from_env};
use super::{Conn, Db, Dialect, V, parse_ts, toml_str};

/// Poll interval of every source these tests configure.
pub const POLL_MS: i64 = 300;
/// `stuck_after` of every source these tests configure, in seconds.
pub const STUCK_AFTER_S: i64 = 5;
/// How late a late transaction commits after the times it writes (or, on SQLite, how
/// far in the past those times are): well inside the 10 s overlap window.
pub const LATE_MS: i64 = 3000;
/// When the first late transaction begins, after the generator's start (SQLite's late
/// rows are stamped `LATE_MS` before it, and must still be after the agent's start).
pub const LATE_FIRST_MS: i64 = LATE_MS + 100;
/// Late transactions take turns, one writer after the other, this far apart: at most
/// two hold one open at a time, and the other writers go on writing newer rows, which
/// is what makes a commit late for the agent (the rows it has read are newer).
pub const LATE_SPACING_MS: i64 = 1500;
/// How far behind the newest rows the agent has read a late commit must be to be
/// caught only by the overlap window (the agent's ordinary look-back is 1 s).
pub const LATE_BEHIND_MS: i64 = 2100;
/// The longest a late transaction is held waiting for another writer to commit a
/// row `LATE_BEHIND_MS` newer than its times (a loaded machine can slow the others
/// past `LATE_MS`): its commit stays well inside the 10 s overlap window.
const LATE_MAX_MS: i64 = 6000;
/// Without an attempts column the agent counts a failed attempt only when it sees a row
/// move into failed: each failed state, and the processing state before it, lasts at
/// least this long — more than six 300 ms polls — so that every poll-to-poll gap
/// falls inside it at least once, whatever a busy machine does to the poll cadence.
pub const FAIL_HOLD_MS: i64 = 2000;
/// Deleted on success: the last processing state before the DELETE lasts at least
/// this long, so that the agent has seen the row unfinished, with its final attempts,
/// before it disappears (a row inserted and deleted between two polls is never seen).
/// As [`FAIL_HOLD_MS`], more than six 300 ms polls: at 1 s, a whole-suite run beside
/// two builds (load average 17) had polls more than a second apart, and on PostgreSQL
/// and SQLite a row of some event types was not seen processing before its DELETE
/// (seen pending, then gone: its completion counted, its processing time not).
pub const DELETE_HOLD_MS: i64 = 2000;

const ERRORS: [&str; 4] = [
    "TimeoutException: downstream ledger did not answer within 5000 ms",
    "SqlException: deadlock victim, rerun the transaction",
    "HttpRequestException: 502 Bad Gateway from pricing",
    "InvalidOperationException: customer 4711 is locked",
];

const BUSINESS_TYPES: [&str; 4] = [
    "OrderPlaced",
    "PaymentCaptured",
    "InvoiceIssued",
    "StockReserved",
];

/// Which table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    A,
    B,
    DeletedOnSuccess,
}

/// A table's columns by meaning and its status words; `None` where the table has no
/// such column.
#[derive(Clone, Debug)]
pub struct Layout {
    pub shape: Shape,
    /// Table name prefix and source name suffix.
    pub prefix: &'static str,
    pub id: &'static str,
    pub event_type: &'static str,
    pub status: &'static str,
    pub received: &'static str,
    pub started: Option<&'static str>,
    pub finished: &'static str,
    pub attempts: Option<&'static str>,
    pub last_error: &'static str,
    /// A column the agent is not told about (shape A's body digest).
    pub digest: Option<&'static str>,
    /// The words for pending, processing, succeeded, failed, dead.
    pub words: [&'static str; 5],
    pub types: &'static [&'static str],
}

fn idx(s: Status) -> usize {
    match s {
        Status::Pending => 0,
        Status::Processing => 1,
        Status::Succeeded => 2,
        Status::Failed => 3,
        Status::Dead => 4,
    }
}

const MEANINGS: [&str; 5] = ["pending", "processing", "succeeded", "failed", "dead"];

impl Layout {
    pub fn shape_a() -> Layout {
        Layout {
            shape: Shape::A,
            prefix: "shape_a",
            id: "message_key",
            event_type: "business_type",
            status: "status",
            received: "first_arrival",
            started: Some("processing_start"),
            finished: "processing_end",
            attempts: Some("retry_count"),
            last_error: "failure_reason",
            digest: Some("body_digest"),
            words: [
                "RECEIVED",
                "PROCESSING",
                "PROCESSED",
                "FAILED",
                "DEAD_LETTER",
            ],
            types: &BUSINESS_TYPES,
        }
    }

    pub fn shape_b() -> Layout {
        Layout {
            shape: Shape::B,
            prefix: "shape_b",
            id: "event_id",
            event_type: "event_type",
            status: "status",
            received: "first_received",
            started: None,
            finished: "completion_time",
            attempts: None,
            last_error: "error_summary",
            digest: None,
            words: ["new", "in_progress", "done", "error", "parked"],
            types: &EVENT_TYPES,
        }
    }

    pub fn deleted_on_success() -> Layout {
        Layout {
            shape: Shape::DeletedOnSuccess,
            prefix: "jobs_del",
            id: "event_id",
            event_type: "event_type",
            status: "status",
            received: "received_at",
            started: Some("started_at"),
            finished: "finished_at",
            attempts: Some("attempts"),
            last_error: "last_error",
            digest: None,
            words: MEANINGS,
            types: &EVENT_TYPES,
        }
    }

    pub fn deletes_succeeded(&self) -> bool {
        self.shape == Shape::DeletedOnSuccess
    }

    pub fn word(&self, s: Status) -> &'static str {
        self.words[idx(s)]
    }

    /// The meaning (`pending`, …) of a status word of this table.
    pub fn meaning(&self, word: &str) -> Option<&'static str> {
        self.words
            .iter()
            .position(|w| *w == word)
            .map(|i| MEANINGS[i])
    }

    fn unfinished_words(&self) -> String {
        [Status::Pending, Status::Processing, Status::Failed]
            .map(|s| format!("'{}'", self.word(s)))
            .join(", ")
    }

    /// CREATE TABLE and its indexes, one statement each.
    pub fn ddl(&self, d: Dialect, table: &str) -> Vec<String> {
        let ts = match d {
            Dialect::Postgres => "timestamptz",
            Dialect::Mysql => "DATETIME(6)",
            Dialect::Sqlite => "TEXT",
        };
        let mut cols = vec![
            format!("{} VARCHAR(64) NOT NULL PRIMARY KEY", self.id),
            format!("{} VARCHAR(100) NULL", self.event_type),
        ];
        if let Some(c) = self.digest {
            cols.push(format!("{c} CHAR(64) NOT NULL"));
        }
        cols.push(format!("{} VARCHAR(20) NOT NULL", self.status));
        cols.push(format!("{} {ts} NOT NULL", self.received));
        if let Some(c) = self.started {
            cols.push(format!("{c} {ts} NULL"));
        }
        cols.push(format!("{} {ts} NULL", self.finished));
        cols.push(format!("{} TEXT NULL", self.last_error));
        if let Some(c) = self.attempts {
            cols.push(format!("{c} INTEGER NOT NULL DEFAULT 0"));
        }
        let mut out = vec![format!("CREATE TABLE {table} ({})", cols.join(", "))];
        let unfinished = match d {
            Dialect::Mysql => format!(
                "CREATE INDEX {table}_unf ON {table} ({}, {})",
                self.status, self.received
            ),
            _ => format!(
                "CREATE INDEX {table}_unf ON {table} ({}) WHERE {} IN ({})",
                self.received,
                self.status,
                self.unfinished_words()
            ),
        };
        out.push(unfinished);
        out.push(format!(
            "CREATE INDEX {table}_rcv ON {table} ({})",
            self.received
        ));
        out.push(format!(
            "CREATE INDEX {table}_fin ON {table} ({})",
            self.finished
        ));
        out
    }

    /// Creates a fresh, uniquely named table of this layout (dropped at cleanup).
    pub async fn create_table(&self, db: &Db, short: &str) -> String {
        let table = super::unique_name(self.prefix, short);
        db.register_table(&table);
        for stmt in self.ddl(db.dialect, &table) {
            db.exec(&stmt, &[]).await;
        }
        table
    }

    /// As [`Layout::create_table`], on PostgreSQL as a table partitioned by
    /// a hash of the event id into two partitions (the indexes made on the
    /// partitioned table, and so on each partition): a row's `ctid` is then
    /// its place in its own partition only.
    pub async fn create_partitioned_table(&self, db: &Db, short: &str) -> String {
        assert_eq!(db.dialect, Dialect::Postgres, "partitions: PostgreSQL only");
        let table = super::unique_name(self.prefix, short);
        db.register_table(&table);
        let mut ddl = self.ddl(db.dialect, &table);
        ddl[0].push_str(&format!(" PARTITION BY HASH ({})", self.id));
        for r in 0..2 {
            ddl.insert(
                1 + r,
                format!(
                    "CREATE TABLE {table}_p{r} PARTITION OF {table} \
                     FOR VALUES WITH (MODULUS 2, REMAINDER {r})"
                ),
            );
        }
        for stmt in ddl {
            db.exec(&stmt, &[]).await;
        }
        table
    }

    /// `[sources.columns]`: exactly the columns this table has, nothing else.
    pub fn columns_toml(&self) -> String {
        let mut m: Vec<(&str, &str)> = vec![
            ("event_id", self.id),
            ("event_type", self.event_type),
            ("status", self.status),
            ("received_at", self.received),
        ];
        if let Some(c) = self.started {
            m.push(("started_at", c));
        }
        m.push(("finished_at", self.finished));
        if let Some(c) = self.attempts {
            m.push(("attempts", c));
        }
        m.push(("last_error", self.last_error));
        let mut s = String::from("[sources.columns]\n");
        for (k, v) in m {
            s.push_str(&format!("{k} = {}\n", toml_str(v)));
        }
        s
    }

    /// `[sources.statuses]`: the table's words.
    pub fn statuses_toml(&self) -> String {
        let mut s = String::from("[sources.statuses]\n");
        for (meaning, word) in MEANINGS.iter().zip(self.words) {
            s.push_str(&format!("{meaning} = [{}]\n", toml_str(word)));
        }
        s
    }

    /// One `[[sources]]` block: no `cursor` (so "none", no `updated_at` being mapped),
    /// poll 300 ms, overlap 10 s, stuck after 5 s, the columns and words of this
    /// table; `extra` are more keys of the source (e.g. `finished_rows`).
    pub fn source_toml(&self, name: &str, dsn: &str, table: &str, extra: &str) -> String {
        format!(
            "[[sources]]\nname = {}\nkind = \"inbox\"\ndsn = {}\ntable = {}\n\
             poll_interval = \"{POLL_MS}ms\"\noverlap = \"10s\"\nstuck_after = \"{STUCK_AFTER_S}s\"\n\
             event_type_limit = 50\ntimeout = \"2s\"\n{extra}\n{}\n{}\n",
            toml_str(name),
            toml_str(dsn),
            toml_str(table),
            self.columns_toml(),
            self.statuses_toml()
        )
    }
}

// ---------------------------------------------------------------------------------
// Rows
// ---------------------------------------------------------------------------------

/// One state the generator wrote.
#[derive(Clone, Copy, Debug)]
pub struct Written {
    pub status: Status,
    pub at_ms: i64,
    pub attempts: i32,
    /// In a late transaction (or, on SQLite, stamped `LATE_MS` in the past).
    pub late: bool,
}

/// One row: its current state (or its state when it was deleted) and every state
/// written before. `started_ms` and `attempts` are the consumer's own bookkeeping,
/// written only where the layout has the column.
#[derive(Clone, Debug)]
pub struct Record {
    pub id: String,
    /// The writer that wrote it (`usize::MAX`: written before the agent started).
    pub writer: usize,
    pub event_type: Option<String>,
    pub digest: String,
    pub status: Status,
    pub received_ms: i64,
    pub started_ms: Option<i64>,
    pub finished_ms: Option<i64>,
    pub attempts: i32,
    pub last_error: Option<String>,
    /// When the consumer deleted the row (deleted on success).
    pub deleted_ms: Option<i64>,
    pub states: Vec<Written>,
}

fn ts(d: Dialect, ms: Option<i64>) -> V {
    V::opt_text(ms.map(|ms| d.ts_text(ms)))
}

impl Record {
    pub fn label(&self) -> String {
        super::workload::type_label(&self.event_type)
    }

    pub fn is_terminal(&self) -> bool {
        matches!(self.status, Status::Succeeded | Status::Dead)
    }

    /// Writes into failed: what the agent counts without an attempts column.
    pub fn failed_moves(&self) -> i64 {
        self.states
            .iter()
            .filter(|w| w.status == Status::Failed)
            .count() as i64
    }

    /// `inbox_attempt_failures_total` for this row. With an attempts column: `a` in
    /// failed or pending, `a - 1` in processing, succeeded or dead, the largest value
    /// seen — the generator only ever raises it, so the largest is the last. Without:
    /// the moves into failed (each one seen, [`FAIL_HOLD_MS`]).
    pub fn attempt_failures(&self, l: &Layout) -> i64 {
        if l.attempts.is_none() {
            return self.failed_moves();
        }
        let a = i64::from(self.attempts);
        match self.status {
            Status::Failed | Status::Pending => a,
            Status::Processing | Status::Succeeded | Status::Dead => a - 1,
        }
        .max(0)
    }

    /// When the row became final: `finished_ms`, or the DELETE.
    pub fn end_ms(&self) -> Option<i64> {
        if !self.is_terminal() {
            return None;
        }
        self.deleted_ms.or(self.finished_ms)
    }

    /// End minus start, for a final row whose table has a start column.
    pub fn processing_ms(&self, l: &Layout) -> Option<i64> {
        l.started?;
        Some(self.end_ms()? - self.started_ms?)
    }

    pub fn e2e_ms(&self) -> Option<i64> {
        Some(self.end_ms()? - self.received_ms)
    }

    /// `inbox_delivery_attempts` observed at completion (1 without an attempts column).
    pub fn observed_attempts(&self, l: &Layout) -> i32 {
        if l.attempts.is_some() {
            self.attempts
        } else {
            1
        }
    }

    pub fn insert_stmt(&self, l: &Layout, d: Dialect, table: &str) -> (String, Vec<V>) {
        let mut cols = vec![l.id, l.event_type, l.status, l.received];
        let mut vals = vec!["?", "?", "?", "{ts}"];
        let mut args = vec![
            V::text(&self.id),
            V::opt_text(self.event_type.clone()),
            V::text(l.word(self.status)),
            ts(d, Some(self.received_ms)),
        ];
        if let Some(c) = l.digest {
            cols.push(c);
            vals.push("?");
            args.push(V::text(&self.digest));
        }
        if let Some(c) = l.started {
            cols.push(c);
            vals.push("{ts}");
            args.push(ts(d, self.started_ms));
        }
        cols.push(l.finished);
        vals.push("{ts}");
        args.push(ts(d, self.finished_ms));
        cols.push(l.last_error);
        vals.push("?");
        args.push(V::opt_text(self.last_error.clone()));
        if let Some(c) = l.attempts {
            cols.push(c);
            vals.push("?");
            args.push(V::Int(self.attempts));
        }
        let sql = d.render(&format!(
            "INSERT INTO {table} ({}) VALUES ({})",
            cols.join(", "),
            vals.join(", ")
        ));
        (sql, args)
    }

    pub fn update_stmt(&self, l: &Layout, d: Dialect, table: &str) -> (String, Vec<V>) {
        let mut sets = vec![format!("{} = ?", l.status)];
        let mut args = vec![V::text(l.word(self.status))];
        if let Some(c) = l.started {
            sets.push(format!("{c} = {{ts}}"));
            args.push(ts(d, self.started_ms));
        }
        sets.push(format!("{} = {{ts}}", l.finished));
        args.push(ts(d, self.finished_ms));
        sets.push(format!("{} = ?", l.last_error));
        args.push(V::opt_text(self.last_error.clone()));
        if let Some(c) = l.attempts {
            sets.push(format!("{c} = ?"));
            args.push(V::Int(self.attempts));
        }
        args.push(V::text(&self.id));
        let sql = d.render(&format!(
            "UPDATE {table} SET {} WHERE {} = ?",
            sets.join(", "),
            l.id
        ));
        (sql, args)
    }

    pub fn delete_stmt(&self, l: &Layout, d: Dialect, table: &str) -> (String, Vec<V>) {
        let sql = d.render(&format!("DELETE FROM {table} WHERE {} = ?", l.id));
        (sql, vec![V::text(&self.id)])
    }

    fn last_write_ms(&self) -> i64 {
        self.states.last().map_or(self.received_ms, |w| w.at_ms)
    }
}

// ---------------------------------------------------------------------------------
// Lives
// ---------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    /// A new attempt starts: processing, attempts + 1, start time.
    Process,
    /// The running attempt failed; it will be retried.
    Fail,
    /// A failed event is queued again (pending, attempts unchanged).
    Requeue,
    /// Succeeded (deleted on success: the row is DELETEd).
    Succeed,
    /// The running attempt failed for the last time: dead-lettered, row kept.
    Dead,
    /// Dead-lettered on receipt, never started (attempts 1, no start time).
    DeadUnstarted,
}

/// The life of one event, chosen at creation. Final moves come from processing (or
/// from pending for `DeadUnstarted`), so the attempt-failure value never goes down.
/// `retries`: false for lives written whole inside one late transaction on a table
/// without an attempts column, where a failed state nobody could see would be a
/// failure nobody can count.
fn plan(rng: &mut fastrand::Rng, retries: bool) -> VecDeque<Action> {
    use Action::*;
    let mut steps = Vec::new();
    let attempts = |steps: &mut Vec<Action>, rng: &mut fastrand::Rng, k: u32| {
        for a in 1..=k {
            steps.push(Process);
            if a < k {
                steps.push(Fail);
                if rng.bool() {
                    steps.push(Requeue);
                }
            }
        }
    };
    let r = rng.f64();
    if !retries {
        match r {
            r if r < 0.7 => steps.extend([Process, Succeed]),
            r if r < 0.9 => steps.extend([Process, Dead]),
            _ => steps.push(DeadUnstarted),
        }
        return steps.into();
    }
    if r < 0.50 {
        attempts(&mut steps, rng, 1);
        steps.push(Succeed);
    } else if r < 0.60 {
        attempts(&mut steps, rng, 2);
        steps.push(Succeed);
    } else if r < 0.65 {
        attempts(&mut steps, rng, 3);
        steps.push(Succeed);
    } else if r < 0.68 {
        let k = rng.u32(4..=6);
        attempts(&mut steps, rng, k);
        steps.push(Succeed);
    } else if r < 0.76 {
        let k = rng.u32(1..=5);
        attempts(&mut steps, rng, k);
        steps.push(Dead);
    } else if r < 0.78 {
        steps.push(DeadUnstarted);
    } else if r < 0.84 {
        // Left pending, never attempted.
    } else if r < 0.88 {
        // Left pending after failed attempts.
        let k = rng.u32(1..=3);
        attempts(&mut steps, rng, k);
        steps.extend([Fail, Requeue]);
    } else if r < 0.94 {
        // Left processing.
        let k = rng.u32(1..=3);
        attempts(&mut steps, rng, k);
    } else {
        // Left failed.
        let k = rng.u32(1..=4);
        attempts(&mut steps, rng, k);
        steps.push(Fail);
    }
    steps.into()
}

fn lognormal_ms(rng: &mut fastrand::Rng, median_ms: f64, sigma: f64, lo: i64, hi: i64) -> i64 {
    let u1 = rng.f64().max(1e-12);
    let u2 = rng.f64();
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    ((median_ms * (sigma * z).exp()) as i64).clamp(lo, hi)
}

/// Applies `a` at `t` to the row (the caller writes it).
fn apply(r: &mut Record, a: Action, t: i64, rng: &mut fastrand::Rng) {
    match a {
        Action::Process => {
            r.status = Status::Processing;
            r.attempts += 1;
            r.started_ms = Some(t);
            r.finished_ms = None;
        }
        Action::Fail => {
            r.status = Status::Failed;
            r.last_error = Some(ERRORS[rng.usize(..ERRORS.len())].to_string());
        }
        Action::Requeue => r.status = Status::Pending,
        Action::Succeed => r.status = Status::Succeeded,
        Action::Dead => {
            r.status = Status::Dead;
            r.last_error = Some(ERRORS[rng.usize(..ERRORS.len())].to_string());
        }
        Action::DeadUnstarted => {
            r.status = Status::Dead;
            r.attempts = 1;
            r.started_ms = None;
            r.last_error = Some("SchemaViolation: body does not match contract v2".to_string());
        }
    }
}

/// How long the state `a` produced lasts before `next`.
fn hold_ms(l: &Layout, a: Option<Action>, next: Option<Action>, rng: &mut fastrand::Rng) -> i64 {
    if l.attempts.is_none() && (a == Some(Action::Fail) || next == Some(Action::Fail)) {
        return rng.i64(FAIL_HOLD_MS..FAIL_HOLD_MS + 300);
    }
    if l.deletes_succeeded() && next == Some(Action::Succeed) {
        return rng.i64(DELETE_HOLD_MS..DELETE_HOLD_MS + 600);
    }
    match a {
        None | Some(Action::Requeue) => rng.i64(5..80),
        Some(Action::Process) => lognormal_ms(rng, 150.0, 1.0, 3, 3000),
        Some(Action::Fail) => rng.i64(20..250),
        Some(_) => 0,
    }
}

// ---------------------------------------------------------------------------------
// The workload
// ---------------------------------------------------------------------------------

/// Size and seed of a workload.
#[derive(Clone, Debug)]
pub struct ShapeWorkload {
    pub layout: Layout,
    pub events: usize,
    pub workers: usize,
    pub create_every_ms: i64,
    /// Late transactions per writer (deleted on success: transactions that insert and
    /// delete rows nobody ever sees).
    pub late_batches: usize,
    pub seed: u64,
}

impl ShapeWorkload {
    /// 1,200 events from 4 writers over about 17 s of arrivals, 2 late transactions each.
    pub fn standard(layout: Layout) -> ShapeWorkload {
        ShapeWorkload::new(layout, 1200, 2)
    }

    pub fn small(layout: Layout, events: usize) -> ShapeWorkload {
        ShapeWorkload::new(layout, events, 1)
    }

    /// `events` from 4 writers, `late_batches` late transactions each, arrivals spread
    /// over the time the late transactions take (so that the others keep writing while
    /// one is held open).
    pub fn new(layout: Layout, events: usize, late_batches: usize) -> ShapeWorkload {
        let workers = 4;
        let slots = (late_batches * workers) as i64;
        let span = LATE_FIRST_MS + (slots - 1).max(0) * LATE_SPACING_MS + LATE_MS;
        ShapeWorkload {
            layout,
            events,
            workers,
            create_every_ms: span / (events / workers).max(1) as i64 + 1,
            late_batches,
            seed: seed_from_env(),
        }
    }

    /// Runs it to its end; the ground truth.
    pub async fn run(&self, target: &Target, clock: Clock) -> ShapeTruth {
        eprintln!(
            "{:?} workload: {} events, {} writers, seed {} (INBOXWATCH_TEST_SEED to replay)",
            self.layout.shape, self.events, self.workers, self.seed
        );
        let mut handles = Vec::new();
        let newest = Arc::new(AtomicI64::new(i64::MIN));
        for w in 0..self.workers {
            let cfg = self.clone();
            let target = target.clone();
            let newest = newest.clone();
            handles.push(tokio::spawn(async move {
                writer(w, cfg, target, clock, newest).await
            }));
        }
        let mut truth = ShapeTruth {
            layout: self.layout.clone(),
            records: Vec::new(),
            base_ms: clock.base(),
            late_writes: 0,
            late_commits: Vec::new(),
            ghosts: 0,
        };
        for h in handles {
            let wr = h.await.expect("a shape workload writer panicked");
            truth.records.extend(wr.slots.into_iter().map(|s| s.rec));
            truth.late_writes += wr.late_writes;
            truth
                .late_commits
                .extend(wr.late_commits.into_iter().map(|(t, c)| (wr.w, t, c)));
            truth.ghosts += wr.ghosts;
        }
        truth
    }
}

struct Slot {
    rec: Record,
    plan: VecDeque<Action>,
    ready_at: i64,
}

struct Writer {
    w: usize,
    cfg: ShapeWorkload,
    target: Target,
    clock: Clock,
    rng: fastrand::Rng,
    conn: Conn,
    quota: usize,
    slots: Vec<Slot>,
    active: Vec<usize>,
    late_writes: usize,
    /// Each late transaction's times and when it committed (SQLite: was written).
    late_commits: Vec<(i64, i64)>,
    /// The newest time any writer has written and committed outside a late
    /// transaction: what a late transaction waits to be behind.
    newest: Arc<AtomicI64>,
    ghosts: usize,
}

async fn run_stmt(conn: &mut Conn, (sql, args): (String, Vec<V>)) {
    if let Err(e) = conn.execute(&sql, &args).await {
        panic!("workload statement failed: {sql}: {e}");
    }
}

impl Writer {
    fn new_record(&mut self, t: i64) -> Record {
        let n = self.slots.len();
        let types = self.cfg.layout.types;
        Record {
            id: format!("w{}-{n:05}-{:08x}", self.w, self.rng.u32(..)),
            writer: self.w,
            event_type: (self.rng.f64() >= 0.02)
                .then(|| types[self.rng.usize(..types.len())].to_string()),
            digest: format!("{:032x}{:032x}", self.rng.u128(..), self.rng.u128(..)),
            status: Status::Pending,
            received_ms: t,
            started_ms: None,
            finished_ms: None,
            attempts: 0,
            last_error: None,
            deleted_ms: None,
            states: Vec::new(),
        }
    }

    /// Inserts a new pending row received at `t` with life `plan`; its index.
    async fn create(&mut self, t: i64, plan: VecDeque<Action>, late: bool) -> usize {
        let mut rec = self.new_record(t);
        rec.states.push(Written {
            status: Status::Pending,
            at_ms: t,
            attempts: 0,
            late,
        });
        let l = &self.cfg.layout;
        run_stmt(
            &mut self.conn,
            rec.insert_stmt(l, self.target.dialect, &self.target.table),
        )
        .await;
        if !late {
            self.newest.fetch_max(t, Atomic::SeqCst);
        }
        let ready_at = t + hold_ms(l, None, plan.front().copied(), &mut self.rng);
        let i = self.slots.len();
        if !plan.is_empty() {
            self.active.push(i);
        }
        self.slots.push(Slot {
            rec,
            plan,
            ready_at,
        });
        if late {
            self.late_writes += 1;
        }
        i
    }

    /// Applies and writes the next step of `slots[i]` at `t`.
    async fn step(&mut self, i: usize, t: i64, late: bool) {
        let l = &self.cfg.layout;
        let (d, table) = (self.target.dialect, self.target.table.as_str());
        let slot = &mut self.slots[i];
        let a = slot
            .plan
            .pop_front()
            .expect("only rows with steps left are stepped");
        assert!(
            t > slot.rec.last_write_ms(),
            "HARNESS BUG: step at {t} not after the row's last write"
        );
        apply(&mut slot.rec, a, t, &mut self.rng);
        let stmt = if a == Action::Succeed && l.deletes_succeeded() {
            slot.rec.deleted_ms = Some(t);
            slot.rec.delete_stmt(l, d, table)
        } else {
            if matches!(a, Action::Succeed | Action::Dead | Action::DeadUnstarted) {
                slot.rec.finished_ms = Some(t);
            }
            slot.rec.update_stmt(l, d, table)
        };
        slot.rec.states.push(Written {
            status: slot.rec.status,
            at_ms: t,
            attempts: slot.rec.attempts,
            late,
        });
        slot.ready_at = t + hold_ms(l, Some(a), slot.plan.front().copied(), &mut self.rng);
        run_stmt(&mut self.conn, stmt).await;
        if late {
            self.late_writes += 1;
        } else {
            self.newest.fetch_max(t, Atomic::SeqCst);
        }
    }

    /// A late transaction. PostgreSQL and MariaDB: BEGIN, rows received at `t`,
    /// completions at `t` of rows waiting for their final step, and whole lives from
    /// `t` on (received, attempted, finished inside the transaction), committed
    /// `LATE_MS` later — and not before another writer has committed a row
    /// `LATE_BEHIND_MS` newer — while the other writers go on, so that every time it
    /// wrote is older than rows the agent has already read. SQLite (a held write lock
    /// would stop every other writer): the same writes stamped `LATE_MS` in the past,
    /// once another writer has committed a row `LATE_BEHIND_MS` newer than that.
    async fn late_batch(&mut self) {
        let hold = self.target.dialect != Dialect::Sqlite;
        if !hold {
            let start = self.clock.now();
            while self.clock.now() - start < LATE_MAX_MS - LATE_MS {
                let now = self.clock.now();
                let newest = self.newest.load(Atomic::SeqCst);
                if newest > now - LATE_MS + LATE_BEHIND_MS && newest < now - 50 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let now = self.clock.now();
        let t = if hold { now } else { now - LATE_MS };
        if !hold {
            self.late_commits.push((t, now));
        }
        if hold {
            self.conn
                .raw("BEGIN")
                .await
                .expect("BEGIN a late transaction");
        }
        for _ in 0..2 {
            if self.slots.len() < self.quota {
                let p = plan(&mut self.rng, true);
                self.create(t, p, true).await;
            }
        }
        let mut picks: Vec<usize> = self
            .active
            .iter()
            .copied()
            .filter(|&i| {
                let s = &self.slots[i];
                s.plan.len() == 1
                    && matches!(s.plan[0], Action::Succeed | Action::Dead)
                    && s.ready_at <= now
                    && s.rec.last_write_ms() < t
            })
            .collect();
        self.rng.shuffle(&mut picks);
        picks.truncate(6);
        for i in picks {
            self.step(i, t, true).await;
        }
        let retries = self.cfg.layout.attempts.is_some();
        for _ in 0..3 {
            if self.slots.len() >= self.quota {
                break;
            }
            let p = plan(&mut self.rng, retries);
            let i = self.create(t, p, true).await;
            let mut at = t;
            while !self.slots[i].plan.is_empty() {
                at += self.rng.i64(1..20);
                self.step(i, at, true).await;
            }
        }
        let slots = &self.slots;
        self.active.retain(|&i| !slots[i].plan.is_empty());
        if hold {
            tokio::time::sleep(Duration::from_millis(LATE_MS as u64)).await;
            // Held on until another writer's newer row is committed and 50 ms old.
            while self.clock.now() - t < LATE_MAX_MS {
                let newest = self.newest.load(Atomic::SeqCst);
                if newest > t + LATE_BEHIND_MS && newest < self.clock.now() - 50 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            self.late_commits.push((t, self.clock.now()));
            self.conn
                .raw("COMMIT")
                .await
                .expect("COMMIT a late transaction");
        }
    }

    /// Deleted on success: a transaction that inserts rows, starts them and deletes
    /// them. Nobody ever sees them, so nothing may count them.
    async fn ghost_batch(&mut self) {
        let (d, table) = (self.target.dialect, self.target.table.clone());
        let l = self.cfg.layout.clone();
        self.conn
            .raw("BEGIN")
            .await
            .expect("BEGIN a ghost transaction");
        for _ in 0..2 {
            let t = self.clock.now();
            let mut rec = self.new_record(t);
            rec.id = format!("ghost-{}", rec.id);
            run_stmt(&mut self.conn, rec.insert_stmt(&l, d, &table)).await;
            apply(&mut rec, Action::Process, t + 1, &mut self.rng);
            run_stmt(&mut self.conn, rec.update_stmt(&l, d, &table)).await;
            run_stmt(&mut self.conn, rec.delete_stmt(&l, d, &table)).await;
            self.ghosts += 1;
        }
        self.conn
            .raw("COMMIT")
            .await
            .expect("COMMIT a ghost transaction");
    }
}

async fn writer(
    w: usize,
    cfg: ShapeWorkload,
    target: Target,
    clock: Clock,
    newest: Arc<AtomicI64>,
) -> Writer {
    let quota = cfg.events / cfg.workers + usize::from(w < cfg.events % cfg.workers);
    let rng =
        fastrand::Rng::with_seed(cfg.seed ^ (w as u64 + 7).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    // Turns: writer w holds the k-th late transaction in slot k * workers + w.
    let mut late_at: VecDeque<i64> = (0..cfg.late_batches)
        .map(|k| {
            let slot = (k * cfg.workers + w) as i64;
            clock.base() + LATE_FIRST_MS + slot * LATE_SPACING_MS
        })
        .collect();
    let conn = target.pool.acquire().await;
    let mut wr = Writer {
        w,
        cfg,
        target,
        clock,
        rng,
        conn,
        quota,
        slots: Vec::with_capacity(quota),
        active: Vec::new(),
        late_writes: 0,
        late_commits: Vec::new(),
        newest,
        ghosts: 0,
    };
    let mut next_create = clock.now();
    loop {
        let now = clock.now();
        // Room kept for the rows the late transactions still have to create (ghost
        // transactions leave no row).
        let reserve = if wr.cfg.layout.deletes_succeeded() {
            0
        } else {
            5 * late_at.len()
        };
        if late_at.front().is_some_and(|&at| now >= at) {
            late_at.pop_front();
            if wr.cfg.layout.deletes_succeeded() {
                wr.ghost_batch().await;
            } else {
                wr.late_batch().await;
            }
            continue;
        }
        if wr.slots.len() + reserve < quota && now >= next_create {
            let p = plan(&mut wr.rng, true);
            wr.create(now, p, false).await;
            next_create += wr.cfg.create_every_ms;
            continue;
        }
        let ready: Vec<usize> = (0..wr.active.len())
            .filter(|&p| wr.slots[wr.active[p]].ready_at <= now)
            .collect();
        if !ready.is_empty() {
            let p = ready[wr.rng.usize(..ready.len())];
            let i = wr.active[p];
            let t = clock.now().max(wr.slots[i].rec.last_write_ms() + 1);
            wr.step(i, t, false).await;
            if wr.slots[i].plan.is_empty() {
                wr.active.swap_remove(p);
            }
            continue;
        }
        if wr.slots.len() >= quota && wr.active.is_empty() && late_at.is_empty() {
            break;
        }
        let mut wake = if wr.slots.len() + reserve < quota {
            next_create
        } else {
            i64::MAX
        };
        for &i in &wr.active {
            wake = wake.min(wr.slots[i].ready_at);
        }
        if let Some(&at) = late_at.front() {
            wake = wake.min(at);
        }
        let wait = (wake - now).clamp(1, 20) as u64;
        tokio::time::sleep(Duration::from_millis(wait)).await;
    }
    wr
}

/// Rows that exist before the agent starts, received long before it: never counted,
/// part of every gauge. Only two event types have them, so that the oldest age of the
/// others comes from the workload's rows. Pending and processing only (attempts 0 and
/// 1: no failed attempt to count or not), plus final rows (kept tables only) whose
/// times are all long past. Two are processing since an hour ago: stuck where the table
/// has a start time, not stuck (0) where it has none.
pub async fn seed_history(target: &Target, l: &Layout, now_ms: i64) -> Vec<Record> {
    const MIN: i64 = 60_000;
    let mut out = Vec::new();
    for i in 0..8i64 {
        let event_type = Some(l.types[i as usize % 2].to_string());
        let received = now_ms - 70 * MIN + i * 1000;
        let (status, started, finished, attempts) = match i % 4 {
            0 => (Status::Processing, Some(now_ms - 60 * MIN), None, 1),
            1 => (Status::Pending, None, None, 0),
            2 if !l.deletes_succeeded() => (
                Status::Succeeded,
                Some(received + 500),
                Some(received + 900),
                1,
            ),
            2 => (Status::Pending, None, None, 0),
            _ => (
                Status::Dead,
                Some(received + 2000),
                Some(received + 2500),
                3,
            ),
        };
        out.push(Record {
            id: format!("history-{i:02}"),
            writer: usize::MAX,
            event_type,
            digest: "0".repeat(64),
            status,
            received_ms: received,
            started_ms: started,
            finished_ms: finished,
            attempts,
            last_error: None,
            deleted_ms: None,
            states: vec![Written {
                status,
                at_ms: received,
                attempts,
                late: false,
            }],
        });
    }
    for r in &out {
        let (sql, args) = r.insert_stmt(l, target.dialect, &target.table);
        target
            .pool
            .execute(&sql, &args)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    out
}

// ---------------------------------------------------------------------------------
// The truth
// ---------------------------------------------------------------------------------

/// Every row the workload wrote, as it is now (or was when deleted).
#[derive(Clone, Debug)]
pub struct ShapeTruth {
    pub layout: Layout,
    pub records: Vec<Record>,
    /// The generator's start on the database clock (after the agent's start).
    pub base_ms: i64,
    /// Writes in late transactions (or stamped in the past on SQLite).
    pub late_writes: usize,
    /// Each late transaction: its writer, its times and when it committed (on
    /// SQLite: when its rows stamped in the past were written).
    pub late_commits: Vec<(usize, i64, i64)>,
    /// Rows inserted and deleted inside one transaction (never visible).
    pub ghosts: usize,
}

/// The inbox series whose every value is known for these tables (deliveries and
/// duplicates are checked to be absent separately).
pub const EXACT_NAMES: [&str; 10] = [
    "inbox_messages_received_total",
    "inbox_messages_completed_total",
    "inbox_attempt_failures_total",
    "inbox_processing_duration_seconds_count",
    "inbox_processing_duration_seconds_sum",
    "inbox_end_to_end_latency_seconds_count",
    "inbox_end_to_end_latency_seconds_sum",
    "inbox_delivery_attempts_count",
    "inbox_delivery_attempts_sum",
    "inbox_delivery_attempts_bucket",
];

/// The resolution a duration read from the dialect's column may be rounded to:
/// DATETIME(6) / timestamptz microseconds, SQLite's text milliseconds.
pub fn resolution_s(d: Dialect) -> f64 {
    match d {
        Dialect::Sqlite => 1e-3,
        Dialect::Postgres | Dialect::Mysql => 1e-6,
    }
}

impl ShapeTruth {
    pub fn by_type(&self) -> BTreeMap<String, Vec<&Record>> {
        let mut m: BTreeMap<String, Vec<&Record>> = BTreeMap::new();
        for r in &self.records {
            m.entry(r.label()).or_default().push(r);
        }
        m
    }

    /// A duration histogram's `_count` and `_sum`: exact durations within the dialect's
    /// rounding; durations of deleted rows (upper bounds, noticed at the next poll)
    /// between the true value (less 1 ms of the generator's clock) and the true value
    /// plus a poll interval and one second.
    fn push_durations(
        x: &mut Expectations,
        name: &str,
        l: &[(&str, &str)],
        exact: &[i64],
        deleted: &[i64],
        res: f64,
    ) {
        let n = (exact.len() + deleted.len()) as f64;
        x.push(&format!("{name}_count"), l, n, Tol::Exact);
        let sum = (exact.iter().sum::<i64>() + deleted.iter().sum::<i64>()) as f64 / 1000.0;
        let rounding = n * res + 1e-9;
        let (lo, hi) = (
            sum - rounding - deleted.len() as f64 * 0.001,
            sum + rounding + deleted.len() as f64 * (POLL_MS as f64 / 1000.0 + 1.0),
        );
        x.push(
            &format!("{name}_sum"),
            l,
            (lo + hi) / 2.0,
            Tol::Abs((hi - lo) / 2.0),
        );
    }

    /// Every counter and histogram `_count`/`_sum` (and the attempt buckets) of
    /// `source` per event type; any other series of those names for the source, and
    /// any rejected row, must be absent or 0.
    pub fn expectations(&self, source: &str, d: Dialect) -> Expectations {
        let l = &self.layout;
        let mut x = Expectations::default();
        for (label, recs) in self.by_type() {
            let lb = [("source", source), ("event_type", label.as_str())];
            x.push(
                "inbox_messages_received_total",
                &lb,
                recs.len() as f64,
                Tol::Exact,
            );
            let count = |s: Status| recs.iter().filter(|r| r.status == s).count() as f64;
            for (outcome, v) in [
                ("succeeded", count(Status::Succeeded)),
                ("dead_lettered", count(Status::Dead)),
            ] {
                let lo = [lb[0], lb[1], ("outcome", outcome)];
                x.push("inbox_messages_completed_total", &lo, v, Tol::Exact);
            }
            let failures: i64 = recs.iter().map(|r| r.attempt_failures(l)).sum();
            x.push(
                "inbox_attempt_failures_total",
                &lb,
                failures as f64,
                Tol::Exact,
            );
            let split = |f: &dyn Fn(&Record) -> Option<i64>| {
                let mut exact = Vec::new();
                let mut deleted = Vec::new();
                for r in &recs {
                    if let Some(v) = f(r) {
                        if r.deleted_ms.is_some() {
                            deleted.push(v);
                        } else {
                            exact.push(v);
                        }
                    }
                }
                (exact, deleted)
            };
            let (pe, pd) = split(&|r| r.processing_ms(l));
            Self::push_durations(
                &mut x,
                "inbox_processing_duration_seconds",
                &lb,
                &pe,
                &pd,
                resolution_s(d),
            );
            let (ee, ed) = split(&|r| r.e2e_ms());
            Self::push_durations(
                &mut x,
                "inbox_end_to_end_latency_seconds",
                &lb,
                &ee,
                &ed,
                resolution_s(d),
            );
            let attempts: Vec<i32> = recs
                .iter()
                .filter(|r| r.is_terminal())
                .map(|r| r.observed_attempts(l))
                .collect();
            x.push(
                "inbox_delivery_attempts_count",
                &lb,
                attempts.len() as f64,
                Tol::Exact,
            );
            x.push(
                "inbox_delivery_attempts_sum",
                &lb,
                attempts.iter().map(|&a| f64::from(a)).sum(),
                Tol::Exact,
            );
            for le in ATTEMPT_BUCKETS.iter().copied().chain([f64::INFINITY]) {
                let le_txt = if le.is_infinite() {
                    "+Inf".to_string()
                } else {
                    le.to_string()
                };
                let c = attempts.iter().filter(|&&a| f64::from(a) <= le).count();
                let lbk = [lb[0], lb[1], ("le", le_txt.as_str())];
                x.push("inbox_delivery_attempts_bucket", &lbk, c as f64, Tol::Exact);
            }
        }
        for name in EXACT_NAMES
            .iter()
            .chain(&["inboxwatch_rows_rejected_total"])
        {
            x.close(name, &[("source", source)]);
        }
        x
    }

    /// A census for the test log.
    pub fn summary(&self) -> String {
        let mut by_status: BTreeMap<&str, usize> = BTreeMap::new();
        for r in &self.records {
            let k = if r.deleted_ms.is_some() {
                "deleted"
            } else {
                MEANINGS[idx(r.status)]
            };
            *by_status.entry(k).or_default() += 1;
        }
        let failed_moves: i64 = self.records.iter().map(Record::failed_moves).sum();
        let late_final = self
            .records
            .iter()
            .filter(|r| r.is_terminal() && r.states.last().is_some_and(|w| w.late))
            .count();
        format!(
            "{} rows {by_status:?}; {failed_moves} moves into failed; {} late writes ({late_final} rows final in a late write); {} ghost rows",
            self.records.len(),
            self.late_writes,
            self.ghosts
        )
    }

    /// Harness self-checks of the timing rules the expectations rely on; one line per
    /// violation.
    pub fn timing_violations(&self) -> Vec<String> {
        let l = &self.layout;
        let mut out = Vec::new();
        for r in &self.records {
            for (k, w) in r.states.iter().enumerate() {
                let next = r.states.get(k + 1);
                let lasted = next.map(|n| n.at_ms - w.at_ms);
                // Without attempts: a failed state and the state before it last
                // FAIL_HOLD_MS (the one still current at the end lasts anyway).
                if l.attempts.is_none()
                    && next
                        .is_some_and(|n| n.status == Status::Failed || w.status == Status::Failed)
                    && lasted.is_some_and(|d| d < FAIL_HOLD_MS)
                {
                    out.push(format!(
                        "{}: state {k} {:?} lasted {lasted:?} ms",
                        r.id, w.status
                    ));
                }
                if w.status == Status::Failed && w.late && l.attempts.is_none() {
                    out.push(format!("{}: failed state {k} written late", r.id));
                }
            }
            if let Some(del) = r.deleted_ms {
                let before = r
                    .states
                    .iter()
                    .rev()
                    .nth(1)
                    .map(|w| (w.status, del - w.at_ms));
                if !before.is_some_and(|(s, d)| s == Status::Processing && d >= DELETE_HOLD_MS) {
                    out.push(format!("{}: deleted after {before:?}", r.id));
                }
            }
            if r.received_ms < self.base_ms {
                out.push(format!("{}: received before the generator's start", r.id));
            }
        }
        // A late transaction is late only if the agent read newer rows before it
        // committed: other writers wrote (and committed) rows more than
        // LATE_BEHIND_MS newer than its times while it was held (or, on SQLite,
        // before its rows stamped in the past were written) — and it committed
        // inside the overlap window.
        for &(w, t, commit) in &self.late_commits {
            let newer = self
                .records
                .iter()
                .filter(|o| o.writer != w)
                .flat_map(|o| &o.states)
                .filter(|s| !s.late && s.at_ms > t + LATE_BEHIND_MS && s.at_ms < commit - 50)
                .count();
            if newer == 0 {
                out.push(format!(
                    "late transaction of writer {w} at {t}: no other writer wrote between {} ms \
                     later and 50 ms before its commit {} ms later, so its commit is not late",
                    LATE_BEHIND_MS,
                    commit - t
                ));
            }
            if commit - t > LATE_MAX_MS + 1000 {
                out.push(format!(
                    "late transaction of writer {w} at {t}: committed {} ms later, past the \
                     {LATE_MAX_MS} ms it may be held",
                    commit - t
                ));
            }
        }
        let batches = self
            .records
            .iter()
            .filter(|r| r.states[0].late)
            .map(|r| (r.writer, r.received_ms))
            .collect::<std::collections::BTreeSet<_>>();
        if batches.len() > self.late_commits.len() {
            out.push(format!(
                "{} late batches wrote rows, {} committed",
                batches.len(),
                self.late_commits.len()
            ));
        }
        out
    }
}

// ---------------------------------------------------------------------------------
// Direct queries
// ---------------------------------------------------------------------------------

fn txt(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("")
}

fn num(v: &Option<String>) -> f64 {
    v.as_deref()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("expected a number from the database, got {v:?}"))
}

fn ts_col(d: Dialect, col: &str) -> String {
    match d {
        Dialect::Postgres => {
            format!("to_char({col} AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS')")
        }
        Dialect::Mysql => format!("DATE_FORMAT({col}, '%Y-%m-%d %H:%i:%s.%f')"),
        Dialect::Sqlite => col.to_string(),
    }
}

/// Harness self-check: the table holds exactly the rows the generator believes it
/// wrote (`records` plus `history`), deleted rows and ghosts are gone.
pub async fn table_diff(db: &Db, table: &str, l: &Layout, records: &[&Record]) -> Vec<String> {
    let d = db.dialect;
    let null = "CAST(NULL AS {text})".to_string();
    let started = l.started.map_or(null.clone(), |c| ts_col(d, c));
    let attempts = l
        .attempts
        .map_or(null, |c| format!("CAST({c} AS {{text}})"));
    let sql = format!(
        "SELECT CAST({} AS {{text}}), CAST({} AS {{text}}), CAST({} AS {{text}}), {}, {started}, {}, \
         {attempts}, CAST({} AS {{text}}) FROM {table}",
        l.id,
        l.event_type,
        l.status,
        ts_col(d, l.received),
        ts_col(d, l.finished),
        l.last_error,
    );
    let rows = db.query(&sql, &[]).await;
    let by_id: HashMap<&str, &Vec<Option<String>>> = rows.iter().map(|r| (txt(&r[0]), r)).collect();
    let t = |v: &Option<String>| v.as_deref().and_then(parse_ts);
    let mut out = Vec::new();
    let mut present = 0;
    for r in records {
        let row = by_id.get(r.id.as_str());
        if r.deleted_ms.is_some() {
            if row.is_some() {
                out.push(format!("{}: deleted, still in the table", r.id));
            }
            continue;
        }
        let Some(row) = row else {
            out.push(format!("{}: not in the table", r.id));
            continue;
        };
        present += 1;
        let have = (
            row[1].clone(),
            txt(&row[2]).to_string(),
            t(&row[3]),
            t(&row[4]),
            t(&row[5]),
            row[6].as_ref().map(|_| num(&row[6]) as i32),
            row[7].clone(),
        );
        let want = (
            r.event_type.clone(),
            l.word(r.status).to_string(),
            Some(r.received_ms),
            l.started.and(r.started_ms),
            r.finished_ms,
            l.attempts.map(|_| r.attempts),
            r.last_error.clone(),
        );
        if have != want {
            out.push(format!("{}: table {have:?} != model {want:?}", r.id));
        }
    }
    if rows.len() != present {
        out.push(format!(
            "the table has {} rows, the model {present} (ghost rows visible?)",
            rows.len()
        ));
    }
    out
}

/// Gauges straight from the table: backlog by status meaning, oldest unfinished age
/// (±2 s) and stuck rows (processing, start older than `stuck_after`; none without a
/// start column), per event type; other series of those gauges for `source` must be
/// absent or 0.
pub async fn gauge_expectations(db: &Db, table: &str, l: &Layout, source: &str) -> Expectations {
    let mut x = Expectations::default();
    let unf = l.unfinished_words();
    let ty = format!("COALESCE({}, 'unknown')", l.event_type);
    let rows = db
        .query(
            &format!(
                "SELECT CAST({ty} AS {{text}}), CAST({st} AS {{text}}), CAST(COUNT(*) AS {{text}}) \
                 FROM {table} WHERE {st} IN ({unf}) GROUP BY {ty}, {st}",
                st = l.status
            ),
            &[],
        )
        .await;
    for r in &rows {
        let meaning = l
            .meaning(txt(&r[1]))
            .unwrap_or_else(|| panic!("unknown status word {:?}", r[1]));
        x.push(
            "inbox_backlog_messages",
            &[
                ("source", source),
                ("event_type", txt(&r[0])),
                ("status", meaning),
            ],
            num(&r[2]),
            Tol::Exact,
        );
    }
    let rc = l.received;
    let age = match db.dialect {
        Dialect::Postgres => format!("CAST(EXTRACT(EPOCH FROM (now() - MIN({rc}))) AS text)"),
        Dialect::Mysql => format!(
            "CAST(TIMESTAMPDIFF(MICROSECOND, MIN({rc}), UTC_TIMESTAMP(6)) / 1000000 AS CHAR)"
        ),
        Dialect::Sqlite => {
            format!("CAST((julianday('now') - julianday(MIN({rc}))) * 86400.0 AS TEXT)")
        }
    };
    let rows = db
        .query(
            &format!(
                "SELECT CAST({ty} AS {{text}}), {age} FROM {table} WHERE {} IN ({unf}) GROUP BY {ty}",
                l.status
            ),
            &[],
        )
        .await;
    for r in &rows {
        x.push(
            "inbox_oldest_unprocessed_age_seconds",
            &[("source", source), ("event_type", txt(&r[0]))],
            num(&r[1]),
            Tol::Abs(2.0),
        );
    }
    if let Some(sc) = l.started {
        let cond = match db.dialect {
            Dialect::Postgres => format!("{sc} < now() - interval '{STUCK_AFTER_S} seconds'"),
            Dialect::Mysql => format!("{sc} < UTC_TIMESTAMP(6) - INTERVAL {STUCK_AFTER_S} SECOND"),
            Dialect::Sqlite => {
                format!("{sc} < strftime('%Y-%m-%d %H:%M:%f', 'now', '-{STUCK_AFTER_S} seconds')")
            }
        };
        let rows = db
            .query(
                &format!(
                    "SELECT CAST({ty} AS {{text}}), CAST(COUNT(*) AS {{text}}) FROM {table} \
                     WHERE {} = '{}' AND {cond} GROUP BY {ty}",
                    l.status,
                    l.word(Status::Processing)
                ),
                &[],
            )
            .await;
        for r in &rows {
            x.push(
                "inbox_stuck_messages",
                &[("source", source), ("event_type", txt(&r[0]))],
                num(&r[1]),
                Tol::Exact,
            );
        }
    }
    for name in [
        "inbox_backlog_messages",
        "inbox_oldest_unprocessed_age_seconds",
        "inbox_stuck_messages",
    ] {
        x.close(name, &[("source", source)]);
    }
    x
}
