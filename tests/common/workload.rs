//! The ground-truth generator shared by the dialect tests.
//!
//! Several writers, each on its own connection, play consumers against one inbox (or
//! outbox) table: new events, duplicate deliveries before and after completion,
//! processing attempts, failures with retries, successes, dead letters, several event
//! types, and "late" transactions whose `updated_at` is older than rows the agent has
//! already read when they commit. Every timestamp is computed here (UTC, millisecond
//! precision), every row state written is kept, and the exact value of every counter
//! and histogram `_count`/`_sum` follows from the final states by the contract's rules.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::checks::{Expectations, Tol, exact_quantile};
use super::{Conn, Dialect, Pool, V};

/// The event types the workload uses; about 2 % of events have a NULL type instead
/// (exported as `event_type="unknown"`).
pub const EVENT_TYPES: [&str; 5] = [
    "order.created",
    "order.paid",
    "payment.refunded",
    "shipment.dispatched",
    "customer.updated",
];

/// `inbox_delivery_attempts` buckets from the contract.
pub const ATTEMPT_BUCKETS: [f64; 10] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0];
/// The latency histograms' buckets in seconds, as docs/metrics.md lists them ("Histogram
/// buckets"): 5 ms to 1 h.
pub const LATENCY_BUCKETS: [f64; 18] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0,
];

/// `{name}_bucket` of each latency bucket (and `+Inf`): how many of `values_ms` are at
/// most its bound, exactly.
pub fn push_latency_buckets(
    x: &mut Expectations,
    name: &str,
    l: &[(&str, &str)],
    values_ms: &[i64],
) {
    for le in LATENCY_BUCKETS.iter().copied().chain([f64::INFINITY]) {
        let le_txt = if le.is_infinite() {
            "+Inf".to_string()
        } else {
            le.to_string()
        };
        let c = values_ms
            .iter()
            .filter(|&&v| v as f64 / 1000.0 <= le)
            .count();
        let mut lb: Vec<(&str, &str)> = l.to_vec();
        lb.push(("le", le_txt.as_str()));
        x.push(&format!("{name}_bucket"), &lb, c as f64, Tol::Exact);
    }
}

const ERRORS: [&str; 5] = [
    "TimeoutError: upstream did not answer within 5s",
    "ConnectionResetError: payment gateway reset the connection",
    "ValidationError: field `amount` must be positive",
    "DeadlockDetected: retry the transaction",
    "HttpError: 503 Service Unavailable from inventory",
];

/// Where a workload writes.
#[derive(Clone, Debug)]
pub struct Target {
    pub dialect: Dialect,
    pub pool: Pool,
    pub table: String,
}

/// The generator's clock: the database clock read once (`base_ms`), advanced by a
/// monotonic local clock. The database runs on the same machine, so the two agree to
/// within milliseconds, and every event's `received_at >= base_ms`.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base_ms: i64,
    start: Instant,
}

impl Clock {
    pub fn new(base_ms: i64) -> Clock {
        Clock {
            base_ms,
            start: Instant::now(),
        }
    }
    pub fn base(&self) -> i64 {
        self.base_ms
    }
    pub fn now(&self) -> i64 {
        self.base_ms + self.start.elapsed().as_millis() as i64
    }
}

fn ts(d: Dialect, ms: Option<i64>) -> V {
    V::opt_text(ms.map(|ms| d.ts_text(ms)))
}

/// Runs one rendered statement on a writer's connection; a failure is a harness
/// failure, so it panics with the statement.
async fn run(conn: &mut Conn, sql: &str, args: &[V]) {
    if let Err(e) = conn.execute(sql, args).await {
        panic!("workload statement failed: {sql}: {e}");
    }
}

fn lognormal_ms(rng: &mut fastrand::Rng, median_ms: f64, sigma: f64, lo: i64, hi: i64) -> i64 {
    // Box-Muller.
    let u1 = rng.f64().max(1e-12);
    let u2 = rng.f64();
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    ((median_ms * (sigma * z).exp()) as i64).clamp(lo, hi)
}

fn random_traceparent(rng: &mut fastrand::Rng) -> String {
    format!("00-{:032x}-{:016x}-01", rng.u128(1..), rng.u64(1..))
}

fn random_type(rng: &mut fastrand::Rng) -> Option<String> {
    if rng.f64() < 0.02 {
        None
    } else {
        Some(EVENT_TYPES[rng.usize(..EVENT_TYPES.len())].to_string())
    }
}

/// The label an event type is exported under.
pub fn type_label(t: &Option<String>) -> String {
    t.clone().unwrap_or_else(|| "unknown".to_string())
}

// ---------------------------------------------------------------------------------
// Inbox
// ---------------------------------------------------------------------------------

/// A status as the workload's table spells it (the default status words).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Pending,
    Processing,
    Succeeded,
    Failed,
    Dead,
}

impl Status {
    pub fn word(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Processing => "processing",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::Dead => "dead",
        }
    }
}

/// The last state the generator wrote for one inbox row.
#[derive(Clone, Debug)]
pub struct InboxEvent {
    pub id: String,
    pub event_type: Option<String>,
    pub status: Status,
    pub received_ms: i64,
    pub started_ms: Option<i64>,
    pub finished_ms: Option<i64>,
    pub attempts: i32,
    pub deliveries: i32,
    pub last_error: Option<String>,
    pub traceparent: Option<String>,
    pub updated_ms: i64,
}

impl InboxEvent {
    pub fn label(&self) -> String {
        type_label(&self.event_type)
    }

    pub fn is_terminal(&self) -> bool {
        matches!(self.status, Status::Succeeded | Status::Dead)
    }

    /// A new event in `pending`, received and last changed at `t`, delivered
    /// once, with no attempt yet.
    pub fn pending(id: String, event_type: Option<String>, t: i64) -> InboxEvent {
        InboxEvent {
            id,
            event_type,
            status: Status::Pending,
            received_ms: t,
            started_ms: None,
            finished_ms: None,
            attempts: 0,
            deliveries: 1,
            last_error: None,
            traceparent: None,
            updated_ms: t,
        }
    }

    /// `inbox_attempt_failures_total` for this event, by the contract's rules.
    pub fn attempt_failures(&self) -> i64 {
        let a = i64::from(self.attempts);
        match self.status {
            Status::Succeeded | Status::Dead => a - 1,
            Status::Failed | Status::Pending => a,
            Status::Processing => a - 1,
        }
        .max(0)
    }

    /// finished_at - started_at, for completed events that have a start.
    pub fn processing_ms(&self) -> Option<i64> {
        if !self.is_terminal() {
            return None;
        }
        Some(self.finished_ms? - self.started_ms?)
    }

    /// finished_at - received_at, for completed events.
    pub fn e2e_ms(&self) -> Option<i64> {
        if !self.is_terminal() {
            return None;
        }
        Some(self.finished_ms? - self.received_ms)
    }

    /// The INSERT of this state.
    pub fn insert_stmt(&self, d: Dialect, table: &str) -> (String, Vec<V>) {
        let sql = d.render(&format!(
            "INSERT INTO {table} (event_id, event_type, status, received_at, started_at, finished_at, \
             attempts, deliveries, last_error, traceparent, updated_at) \
             VALUES (?, ?, ?, {{ts}}, {{ts}}, {{ts}}, ?, ?, ?, ?, {{ts}})"
        ));
        let args = vec![
            V::text(&self.id),
            V::opt_text(self.event_type.clone()),
            V::text(self.status.word()),
            ts(d, Some(self.received_ms)),
            ts(d, self.started_ms),
            ts(d, self.finished_ms),
            V::Int(self.attempts),
            V::Int(self.deliveries),
            V::opt_text(self.last_error.clone()),
            V::opt_text(self.traceparent.clone()),
            ts(d, Some(self.updated_ms)),
        ];
        (sql, args)
    }

    /// The UPDATE that writes this (whole) state over the row.
    pub fn update_stmt(&self, d: Dialect, table: &str) -> (String, Vec<V>) {
        let sql = d.render(&format!(
            "UPDATE {table} SET status = ?, started_at = {{ts}}, finished_at = {{ts}}, attempts = ?, \
             deliveries = ?, last_error = ?, updated_at = {{ts}} WHERE event_id = ?"
        ));
        let args = vec![
            V::text(self.status.word()),
            ts(d, self.started_ms),
            ts(d, self.finished_ms),
            V::Int(self.attempts),
            V::Int(self.deliveries),
            V::opt_text(self.last_error.clone()),
            ts(d, Some(self.updated_ms)),
            V::text(&self.id),
        ];
        (sql, args)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    /// A (new) attempt starts: processing, attempts + 1, started_at.
    Process,
    /// The running attempt failed; it will be retried.
    Fail,
    /// A failed event is queued again (pending, attempts unchanged).
    Requeue,
    Succeed,
    /// The running attempt failed for the last time: dead-lettered.
    Dead,
    /// Dead-lettered on receipt without a processing start (attempts 1, no started_at).
    DeadUnstarted,
    /// A duplicate delivery: deliveries + 1.
    Dup,
}

/// The life of one event, chosen at creation. Terminal moves always come from
/// `processing` (or, for `DeadUnstarted`, from `pending` with 0 attempts), so the
/// contract's attempt-failure value never has to go down between two states.
fn plan(rng: &mut fastrand::Rng) -> VecDeque<Action> {
    use Action::*;
    let mut steps: Vec<Action> = Vec::new();
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
    let terminal = if r < 0.52 {
        attempts(&mut steps, rng, 1);
        steps.push(Succeed);
        true
    } else if r < 0.62 {
        attempts(&mut steps, rng, 2);
        steps.push(Succeed);
        true
    } else if r < 0.67 {
        attempts(&mut steps, rng, 3);
        steps.push(Succeed);
        true
    } else if r < 0.70 {
        let k = rng.u32(4..=7);
        attempts(&mut steps, rng, k);
        steps.push(Succeed);
        true
    } else if r < 0.78 {
        let k = rng.u32(1..=6);
        attempts(&mut steps, rng, k);
        steps.push(Dead);
        true
    } else if r < 0.79 {
        steps.push(DeadUnstarted);
        true
    } else if r < 0.84 {
        // Left pending, never attempted.
        false
    } else if r < 0.88 {
        // Left pending after failed attempts.
        let k = rng.u32(1..=3);
        attempts(&mut steps, rng, k);
        steps.push(Fail);
        steps.push(Requeue);
        false
    } else if r < 0.94 {
        // Left processing.
        let k = rng.u32(1..=3);
        attempts(&mut steps, rng, k);
        false
    } else {
        // Left failed.
        let k = rng.u32(1..=4);
        attempts(&mut steps, rng, k);
        steps.push(Fail);
        false
    };
    let dups_before = match rng.f64() {
        x if x < 0.80 => 0,
        x if x < 0.92 => 1,
        x if x < 0.98 => 2,
        _ => 3,
    };
    let end_of_life = if terminal {
        steps.len() - 1
    } else {
        steps.len()
    };
    for _ in 0..dups_before {
        let at = rng.usize(0..=end_of_life);
        steps.insert(at, Dup);
    }
    if terminal {
        let dups_after = match rng.f64() {
            x if x < 0.85 => 0,
            x if x < 0.97 => 1,
            _ => 2,
        };
        steps.extend(std::iter::repeat_n(Dup, dups_after));
    }
    steps.into()
}

/// Applies `a` at time `t` to the model; returns how long to wait before the next step.
fn apply(ev: &mut InboxEvent, a: Action, t: i64, rng: &mut fastrand::Rng) -> i64 {
    ev.updated_ms = t;
    match a {
        Action::Process => {
            ev.status = Status::Processing;
            ev.attempts += 1;
            ev.started_ms = Some(t);
            ev.finished_ms = None;
            lognormal_ms(rng, 150.0, 1.0, 3, 4000)
        }
        Action::Fail => {
            ev.status = Status::Failed;
            ev.last_error = Some(ERRORS[rng.usize(..ERRORS.len())].to_string());
            rng.i64(20..250)
        }
        Action::Requeue => {
            ev.status = Status::Pending;
            rng.i64(5..80)
        }
        Action::Succeed => {
            ev.status = Status::Succeeded;
            ev.finished_ms = Some(t);
            rng.i64(50..800)
        }
        Action::Dead => {
            ev.status = Status::Dead;
            ev.finished_ms = Some(t);
            ev.last_error = Some(ERRORS[rng.usize(..ERRORS.len())].to_string());
            rng.i64(50..800)
        }
        Action::DeadUnstarted => {
            ev.status = Status::Dead;
            ev.attempts = 1;
            ev.started_ms = None;
            ev.finished_ms = Some(t);
            ev.last_error = Some("SchemaError: payload does not match schema v3".to_string());
            rng.i64(50..800)
        }
        Action::Dup => {
            ev.deliveries += 1;
            rng.i64(5..120)
        }
    }
}

/// Shape of an inbox workload.
#[derive(Clone, Debug)]
pub struct InboxWorkload {
    pub events: usize,
    /// Concurrent writers, each on its own connection.
    pub workers: usize,
    /// Each writer creates one event every this many milliseconds.
    pub create_every_ms: i64,
    /// Late-commit batches per writer.
    pub late_batches: usize,
    /// How much older than already-read rows a late batch's `updated_at` is.
    pub late_by_ms: i64,
    pub seed: u64,
}

impl InboxWorkload {
    /// 2,000 events from 4 writers over roughly 10-15 s, with 3 late batches each,
    /// committed 4 s late: past the 2 s every poll looks back, so only the
    /// agent's sweep of the whole overlap window (10 s) can count them.
    pub fn standard() -> InboxWorkload {
        InboxWorkload {
            events: 2000,
            workers: 4,
            create_every_ms: 16,
            late_batches: 3,
            late_by_ms: 4000,
            seed: seed_from_env(),
        }
    }

    /// A smaller one for tests that check something else alongside.
    pub fn small(events: usize, workers: usize) -> InboxWorkload {
        InboxWorkload {
            events,
            workers,
            create_every_ms: 20,
            late_batches: 1,
            late_by_ms: 2000,
            seed: seed_from_env(),
        }
    }

    /// Runs the workload to its end and returns the ground truth.
    pub async fn run(&self, target: &Target, clock: Clock) -> InboxTruth {
        eprintln!(
            "inbox workload: {} events, {} writers, seed {} (INBOXWATCH_TEST_SEED to replay)",
            self.events, self.workers, self.seed
        );
        let mut handles = Vec::new();
        for w in 0..self.workers {
            let cfg = self.clone();
            let target = target.clone();
            handles.push(tokio::spawn(async move {
                inbox_worker(w, cfg, target, clock).await
            }));
        }
        let mut events = Vec::with_capacity(self.events);
        let mut late_writes = 0;
        let mut max_write_lag_ms = 0;
        for h in handles {
            let (evs, late, lag) = h.await.expect("an inbox workload writer panicked");
            events.extend(evs);
            late_writes += late;
            max_write_lag_ms = max_write_lag_ms.max(lag);
        }
        InboxTruth {
            events,
            base_ms: clock.base(),
            late_writes,
            max_write_lag_ms,
        }
    }
}

/// `INBOXWATCH_TEST_SEED` or a random seed.
pub fn seed_from_env() -> u64 {
    std::env::var("INBOXWATCH_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..))
}

struct Slot {
    ev: InboxEvent,
    plan: VecDeque<Action>,
    ready_at: i64,
}

struct InboxWriter {
    w: usize,
    cfg: InboxWorkload,
    target: Target,
    clock: Clock,
    rng: fastrand::Rng,
    conn: Conn,
    quota: usize,
    slots: Vec<Slot>,
    /// Indexes into `slots` of events with steps left.
    active: Vec<usize>,
    /// Rows written by late batches.
    late_writes: usize,
}

impl InboxWriter {
    async fn create(&mut self, t: i64) {
        let n = self.slots.len();
        let id = format!("w{}-{n:05}-{:08x}", self.w, self.rng.u32(..));
        let event_type = random_type(&mut self.rng);
        let ev = InboxEvent {
            traceparent: Some(random_traceparent(&mut self.rng)),
            ..InboxEvent::pending(id, event_type, t)
        };
        let (sql, args) = ev.insert_stmt(self.target.dialect, &self.target.table);
        run(&mut self.conn, &sql, &args).await;
        let plan = plan(&mut self.rng);
        let ready_at = t + self.rng.i64(5..80);
        if !plan.is_empty() {
            self.active.push(n);
        }
        self.slots.push(Slot { ev, plan, ready_at });
    }

    /// Applies the next step of `slots[i]` at time `t` and writes it.
    async fn step(&mut self, i: usize, t: i64) {
        let slot = &mut self.slots[i];
        let a = slot
            .plan
            .pop_front()
            .expect("only events with steps left are active");
        let wait = apply(&mut slot.ev, a, t, &mut self.rng);
        slot.ready_at = t + wait;
        let (sql, args) = slot.ev.update_stmt(self.target.dialect, &self.target.table);
        run(&mut self.conn, &sql, &args).await;
    }

    /// A batch whose `updated_at` is older than rows the agent has already read when
    /// it becomes visible. PostgreSQL/MariaDB: a transaction stamped at its start and
    /// committed `late_by` later while the other writers go on. SQLite (a held write
    /// lock would block every other writer): rows stamped `late_by` in the past.
    async fn late_batch(&mut self) {
        let hold = self.target.dialect != Dialect::Sqlite;
        let t = if hold {
            self.clock.now()
        } else {
            self.clock.now() - self.cfg.late_by_ms
        };
        if hold {
            self.conn
                .raw("BEGIN")
                .await
                .expect("BEGIN a late transaction");
        }
        for _ in 0..3 {
            if self.slots.len() < self.quota {
                self.create(t).await;
                self.late_writes += 1;
            }
        }
        let now = self.clock.now();
        let mut picks: Vec<usize> = self
            .active
            .iter()
            .copied()
            .filter(|&i| self.slots[i].ev.updated_ms < t && self.slots[i].ready_at <= now)
            .collect();
        // Prefer final steps: a later write to the same row would otherwise make a
        // missed late commit invisible in the counters.
        self.rng.shuffle(&mut picks);
        let slots = &self.slots;
        picks.sort_by_key(|&i| slots[i].plan.len() != 1);
        picks.truncate(8);
        self.late_writes += picks.len();
        for i in picks {
            self.step(i, t).await;
        }
        if !hold {
            // Few SQLite events sit idle for 2 s, so also write whole lives in the
            // past: their final states are late rows that no later write heals.
            for _ in 0..6 {
                if self.slots.len() >= self.quota {
                    break;
                }
                let mut at = t;
                self.create(at).await;
                self.late_writes += 1;
                let i = self.slots.len() - 1;
                while !self.slots[i].plan.is_empty() {
                    at += self.rng.i64(1..20);
                    self.step(i, at).await;
                    self.late_writes += 1;
                }
            }
        }
        let slots = &self.slots;
        self.active.retain(|&i| !slots[i].plan.is_empty());
        if hold {
            tokio::time::sleep(Duration::from_millis(self.cfg.late_by_ms as u64)).await;
            self.conn
                .raw("COMMIT")
                .await
                .expect("COMMIT a late transaction");
        }
    }
}

async fn inbox_worker(
    w: usize,
    cfg: InboxWorkload,
    target: Target,
    clock: Clock,
) -> (Vec<InboxEvent>, usize, i64) {
    let quota = cfg.events / cfg.workers + usize::from(w < cfg.events % cfg.workers);
    let mut rng =
        fastrand::Rng::with_seed(cfg.seed ^ (w as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut late_marks: VecDeque<usize> = (1..=cfg.late_batches)
        .map(|i| quota * i / (cfg.late_batches + 1) + rng.usize(0..=quota / 20))
        .collect();
    let conn = target.pool.acquire().await;
    let mut wr = InboxWriter {
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
    };
    let mut next_create = clock.now();
    // The longest an ordinary write (not a late batch's) took from its stamp to
    // its commit: how long a change can stay invisible after the time it shows.
    let mut max_lag = 0i64;
    loop {
        let now = clock.now();
        let late_due = late_marks.front().is_some_and(|&m| wr.slots.len() >= m)
            && (wr.target.dialect != Dialect::Sqlite
                || now - wr.cfg.late_by_ms > clock.base() + 10);
        if late_due {
            late_marks.pop_front();
            wr.late_batch().await;
            continue;
        }
        if wr.slots.len() < quota && now >= next_create {
            wr.create(now).await;
            max_lag = max_lag.max(clock.now() - now);
            next_create += wr.cfg.create_every_ms;
            continue;
        }
        let ready: Vec<usize> = (0..wr.active.len())
            .filter(|&p| wr.slots[wr.active[p]].ready_at <= now)
            .collect();
        if !ready.is_empty() {
            let p = ready[wr.rng.usize(..ready.len())];
            let i = wr.active[p];
            let t = clock.now().max(wr.slots[i].ev.updated_ms + 1);
            wr.step(i, t).await;
            max_lag = max_lag.max(clock.now() - t);
            if wr.slots[i].plan.is_empty() {
                wr.active.swap_remove(p);
            }
            continue;
        }
        if wr.slots.len() >= quota && wr.active.is_empty() && late_marks.is_empty() {
            break;
        }
        let mut wake = if wr.slots.len() < quota {
            next_create
        } else {
            i64::MAX
        };
        for &i in &wr.active {
            wake = wake.min(wr.slots[i].ready_at);
        }
        let wait = (wake - now).clamp(1, 20) as u64;
        tokio::time::sleep(Duration::from_millis(wait)).await;
    }
    (
        wr.slots.into_iter().map(|s| s.ev).collect(),
        wr.late_writes,
        max_lag,
    )
}

/// Rows that exist before the agent starts (received long before its start time `S`):
/// they must never reach the counters, but they are part of every gauge. Four of them
/// are processing since an hour ago (stuck with `stuck_after = "10m"`).
pub async fn seed_inbox_history(target: &Target, now_ms: i64) -> Vec<InboxEvent> {
    const MIN: i64 = 60_000;
    let mut out = Vec::new();
    for i in 0..12i64 {
        let event_type = Some(EVENT_TYPES[i as usize % EVENT_TYPES.len()].to_string());
        let (status, received, started, finished, attempts) = match i % 3 {
            0 => (
                Status::Processing,
                now_ms - 65 * MIN - i * 1000,
                Some(now_ms - 60 * MIN - i * 1000),
                None,
                1,
            ),
            1 => (Status::Pending, now_ms - 30 * MIN - i * 1000, None, None, 0),
            _ => (
                Status::Succeeded,
                now_ms - 50 * MIN,
                Some(now_ms - 50 * MIN + 100),
                Some(now_ms - 49 * MIN),
                1,
            ),
        };
        out.push(InboxEvent {
            id: format!("history-{i:02}"),
            event_type,
            status,
            received_ms: received,
            started_ms: started,
            finished_ms: finished,
            attempts,
            deliveries: 1,
            last_error: None,
            traceparent: None,
            updated_ms: now_ms,
        });
    }
    for ev in &out {
        let (sql, args) = ev.insert_stmt(target.dialect, &target.table);
        target
            .pool
            .execute(&sql, &args)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    out
}

/// The final state of every event the workload wrote, and what the agent must export.
#[derive(Clone, Debug)]
pub struct InboxTruth {
    pub events: Vec<InboxEvent>,
    /// The generator's start on the database clock (after the agent's start `S`).
    pub base_ms: i64,
    /// Rows written by late batches (stamped older than rows already written).
    pub late_writes: usize,
    /// The longest any other write took from the time it stamped to its
    /// commit (ms, the generator's clock).
    pub max_write_lag_ms: i64,
}

/// Names of the inbox counters and histogram series whose every value is known.
pub const INBOX_EXACT_NAMES: [&str; 13] = [
    "inbox_messages_received_total",
    "inbox_deliveries_total",
    "inbox_duplicate_deliveries_total",
    "inbox_messages_completed_total",
    "inbox_attempt_failures_total",
    "inbox_processing_duration_seconds_count",
    "inbox_processing_duration_seconds_sum",
    "inbox_end_to_end_latency_seconds_count",
    "inbox_end_to_end_latency_seconds_sum",
    "inbox_delivery_attempts_count",
    "inbox_delivery_attempts_sum",
    "inbox_delivery_attempts_bucket",
    // Rejections: a clean workload has none.
    "inboxwatch_rows_rejected_total",
];

impl InboxTruth {
    /// Events grouped by their exported `event_type` label.
    pub fn by_type(&self) -> BTreeMap<String, Vec<&InboxEvent>> {
        let mut m: BTreeMap<String, Vec<&InboxEvent>> = BTreeMap::new();
        for e in &self.events {
            m.entry(e.label()).or_default().push(e);
        }
        m
    }

    /// Adds events written outside the workload (they count like workload events).
    pub fn add(&mut self, more: impl IntoIterator<Item = InboxEvent>) {
        self.events.extend(more);
    }

    /// Every counter and histogram `_count`/`_sum` (and the attempts buckets) of
    /// `source`, per event type; other series of those names must be absent or 0.
    pub fn expectations(&self, source: &str) -> Expectations {
        self.expectations_for(source, None)
    }

    /// Like [`InboxTruth::expectations`], restricted to the given labels (and without
    /// closing the names, since other event types are not checked).
    pub fn expectations_for(&self, source: &str, only: Option<&[&str]>) -> Expectations {
        let mut x = Expectations::default();
        for (label, evs) in self.by_type() {
            if only.is_some_and(|o| !o.contains(&label.as_str())) {
                continue;
            }
            let l = [("source", source), ("event_type", label.as_str())];
            let n = evs.len() as f64;
            let deliveries: i64 = evs.iter().map(|e| i64::from(e.deliveries)).sum();
            let succeeded = evs.iter().filter(|e| e.status == Status::Succeeded).count();
            let dead = evs.iter().filter(|e| e.status == Status::Dead).count();
            let failures: i64 = evs.iter().map(|e| e.attempt_failures()).sum();
            let proc: Vec<i64> = evs.iter().filter_map(|e| e.processing_ms()).collect();
            let e2e: Vec<i64> = evs.iter().filter_map(|e| e.e2e_ms()).collect();
            let attempts: Vec<i32> = evs
                .iter()
                .filter(|e| e.is_terminal())
                .map(|e| e.attempts)
                .collect();
            x.push("inbox_messages_received_total", &l, n, Tol::Exact);
            x.push("inbox_deliveries_total", &l, deliveries as f64, Tol::Exact);
            x.push(
                "inbox_duplicate_deliveries_total",
                &l,
                (deliveries - evs.len() as i64) as f64,
                Tol::Exact,
            );
            for (outcome, v) in [("succeeded", succeeded), ("dead_lettered", dead)] {
                let lo = [l[0], l[1], ("outcome", outcome)];
                x.push("inbox_messages_completed_total", &lo, v as f64, Tol::Exact);
            }
            x.push(
                "inbox_attempt_failures_total",
                &l,
                failures as f64,
                Tol::Exact,
            );
            x.push(
                "inbox_processing_duration_seconds_count",
                &l,
                proc.len() as f64,
                Tol::Exact,
            );
            x.push(
                "inbox_processing_duration_seconds_sum",
                &l,
                proc.iter().sum::<i64>() as f64 / 1000.0,
                Tol::Rel(1e-6),
            );
            push_latency_buckets(&mut x, "inbox_processing_duration_seconds", &l, &proc);
            push_latency_buckets(&mut x, "inbox_end_to_end_latency_seconds", &l, &e2e);
            x.push(
                "inbox_end_to_end_latency_seconds_count",
                &l,
                e2e.len() as f64,
                Tol::Exact,
            );
            x.push(
                "inbox_end_to_end_latency_seconds_sum",
                &l,
                e2e.iter().sum::<i64>() as f64 / 1000.0,
                Tol::Rel(1e-6),
            );
            x.push(
                "inbox_delivery_attempts_count",
                &l,
                attempts.len() as f64,
                Tol::Exact,
            );
            x.push(
                "inbox_delivery_attempts_sum",
                &l,
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
                let lb = [l[0], l[1], ("le", le_txt.as_str())];
                x.push("inbox_delivery_attempts_bucket", &lb, c as f64, Tol::Exact);
            }
        }
        if only.is_none() {
            for name in INBOX_EXACT_NAMES.iter().copied().chain([
                "inbox_processing_duration_seconds_bucket",
                "inbox_end_to_end_latency_seconds_bucket",
            ]) {
                x.close(name, &[("source", source)]);
            }
        }
        x
    }

    /// Sorted processing durations (seconds) of completed events of `label` (all
    /// events when `None`).
    pub fn processing_durations(&self, label: Option<&str>) -> Vec<f64> {
        let mut v: Vec<f64> = self
            .events
            .iter()
            .filter(|e| label.is_none_or(|l| e.label() == l))
            .filter_map(|e| e.processing_ms())
            .map(|ms| ms as f64 / 1000.0)
            .collect();
        v.sort_by(f64::total_cmp);
        v
    }

    /// A one-line census, for the test log.
    pub fn summary(&self) -> String {
        let mut by_status: BTreeMap<&str, usize> = BTreeMap::new();
        for e in &self.events {
            *by_status.entry(e.status.word()).or_default() += 1;
        }
        let dups: i64 = self
            .events
            .iter()
            .map(|e| i64::from(e.deliveries - 1))
            .sum();
        let p = self.processing_durations(None);
        format!(
            "{} events {:?}; {} duplicate deliveries; {} late writes; {} processing durations, p50 {:.3}s p95 {:.3}s p99 {:.3}s max {:.3}s",
            self.events.len(),
            by_status,
            dups,
            self.late_writes,
            p.len(),
            if p.is_empty() {
                0.0
            } else {
                exact_quantile(&p, 0.5)
            },
            if p.is_empty() {
                0.0
            } else {
                exact_quantile(&p, 0.95)
            },
            if p.is_empty() {
                0.0
            } else {
                exact_quantile(&p, 0.99)
            },
            p.last().copied().unwrap_or(0.0),
        )
    }
}

// ---------------------------------------------------------------------------------
// Outbox
// ---------------------------------------------------------------------------------

/// The last state the generator wrote for one outbox row.
#[derive(Clone, Debug)]
pub struct OutboxEvent {
    pub id: String,
    pub event_type: Option<String>,
    pub created_ms: i64,
    pub published_ms: Option<i64>,
    pub traceparent: Option<String>,
    pub updated_ms: i64,
}

impl OutboxEvent {
    pub fn label(&self) -> String {
        type_label(&self.event_type)
    }

    pub fn insert_stmt(&self, d: Dialect, table: &str) -> (String, Vec<V>) {
        let sql = d.render(&format!(
            "INSERT INTO {table} (event_id, event_type, created_at, published_at, traceparent, updated_at) \
             VALUES (?, ?, {{ts}}, {{ts}}, ?, {{ts}})"
        ));
        let args = vec![
            V::text(&self.id),
            V::opt_text(self.event_type.clone()),
            ts(d, Some(self.created_ms)),
            ts(d, self.published_ms),
            V::opt_text(self.traceparent.clone()),
            ts(d, Some(self.updated_ms)),
        ];
        (sql, args)
    }

    pub fn publish_stmt(&self, d: Dialect, table: &str) -> (String, Vec<V>) {
        let sql = d.render(&format!(
            "UPDATE {table} SET published_at = {{ts}}, updated_at = {{ts}} WHERE event_id = ?"
        ));
        let args = vec![
            ts(d, self.published_ms),
            ts(d, Some(self.updated_ms)),
            V::text(&self.id),
        ];
        (sql, args)
    }
}

/// Shape of an outbox workload.
#[derive(Clone, Debug)]
pub struct OutboxWorkload {
    pub events: usize,
    pub workers: usize,
    pub create_every_ms: i64,
    pub late_batches: usize,
    pub late_by_ms: i64,
    /// Share of new events never published.
    pub unpublished_share: f64,
    pub seed: u64,
    /// Pre-existing unpublished rows that writer 0 publishes during the run (they
    /// count: their `published_at` is after the agent's start).
    pub adopt: Vec<OutboxEvent>,
}

impl OutboxWorkload {
    /// 1,000 events from 4 writers, 2 late transactions each.
    pub fn standard(adopt: Vec<OutboxEvent>) -> OutboxWorkload {
        OutboxWorkload {
            events: 1000,
            workers: 4,
            create_every_ms: 25,
            late_batches: 2,
            late_by_ms: 2000,
            unpublished_share: 0.12,
            seed: seed_from_env(),
            adopt,
        }
    }

    pub async fn run(&self, target: &Target, clock: Clock) -> OutboxTruth {
        eprintln!(
            "outbox workload: {} events, {} writers, seed {} (INBOXWATCH_TEST_SEED to replay)",
            self.events, self.workers, self.seed
        );
        let mut handles = Vec::new();
        for w in 0..self.workers {
            let cfg = self.clone();
            let target = target.clone();
            handles.push(tokio::spawn(async move {
                outbox_worker(w, cfg, target, clock).await
            }));
        }
        let mut events = Vec::new();
        for h in handles {
            events.extend(h.await.expect("an outbox workload writer panicked"));
        }
        OutboxTruth {
            events,
            base_ms: clock.base(),
        }
    }
}

struct OutboxSlot {
    ev: OutboxEvent,
    publish_at: Option<i64>,
}

async fn outbox_worker(
    w: usize,
    cfg: OutboxWorkload,
    target: Target,
    clock: Clock,
) -> Vec<OutboxEvent> {
    let d = target.dialect;
    let quota = cfg.events / cfg.workers + usize::from(w < cfg.events % cfg.workers);
    let mut rng =
        fastrand::Rng::with_seed(cfg.seed ^ (w as u64 + 101).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut late_marks: VecDeque<usize> = (1..=cfg.late_batches)
        .map(|i| quota * i / (cfg.late_batches + 1) + rng.usize(0..=quota / 20))
        .collect();
    let mut conn = target.pool.acquire().await;
    let mut slots: Vec<OutboxSlot> = Vec::new();
    if w == 0 {
        for ev in &cfg.adopt {
            slots.push(OutboxSlot {
                ev: ev.clone(),
                publish_at: Some(clock.now() + rng.i64(500..3000)),
            });
        }
    }
    let mut created = 0usize;
    let mut next_create = clock.now();
    let new_event = |rng: &mut fastrand::Rng, n: usize, t: i64, cfg: &OutboxWorkload| {
        let ev = OutboxEvent {
            id: format!("ob-w{w}-{n:05}-{:08x}", rng.u32(..)),
            event_type: random_type(rng),
            created_ms: t,
            published_ms: None,
            traceparent: Some(random_traceparent(rng)),
            updated_ms: t,
        };
        let publish_at = (rng.f64() >= cfg.unpublished_share)
            .then(|| t + lognormal_ms(rng, 300.0, 1.0, 5, 5000));
        OutboxSlot { ev, publish_at }
    };
    loop {
        let now = clock.now();
        let late_due = late_marks.front().is_some_and(|&m| created >= m)
            && (d != Dialect::Sqlite || now - cfg.late_by_ms > clock.base() + 10);
        if late_due {
            late_marks.pop_front();
            let hold = d != Dialect::Sqlite;
            let t = if hold { now } else { now - cfg.late_by_ms };
            if hold {
                conn.raw("BEGIN").await.expect("BEGIN a late transaction");
            }
            for _ in 0..3 {
                if created < quota {
                    let s = new_event(&mut rng, created, t, &cfg);
                    let (sql, args) = s.ev.insert_stmt(d, &target.table);
                    run(&mut conn, &sql, &args).await;
                    slots.push(s);
                    created += 1;
                }
            }
            let mut picks: Vec<usize> = (0..slots.len())
                .filter(|&i| {
                    slots[i].ev.published_ms.is_none()
                        && slots[i].ev.updated_ms < t
                        && slots[i].publish_at.is_some_and(|p| p <= now)
                })
                .collect();
            rng.shuffle(&mut picks);
            picks.truncate(8);
            for i in picks {
                slots[i].ev.published_ms = Some(t);
                slots[i].ev.updated_ms = t;
                let (sql, args) = slots[i].ev.publish_stmt(d, &target.table);
                run(&mut conn, &sql, &args).await;
            }
            if hold {
                tokio::time::sleep(Duration::from_millis(cfg.late_by_ms as u64)).await;
                conn.raw("COMMIT").await.expect("COMMIT a late transaction");
            }
            continue;
        }
        if created < quota && now >= next_create {
            let s = new_event(&mut rng, created, now, &cfg);
            let (sql, args) = s.ev.insert_stmt(d, &target.table);
            run(&mut conn, &sql, &args).await;
            slots.push(s);
            created += 1;
            next_create += cfg.create_every_ms;
            continue;
        }
        let due: Vec<usize> = (0..slots.len())
            .filter(|&i| {
                slots[i].ev.published_ms.is_none() && slots[i].publish_at.is_some_and(|p| p <= now)
            })
            .collect();
        if !due.is_empty() {
            let i = due[rng.usize(..due.len())];
            let t = clock.now().max(slots[i].ev.updated_ms + 1);
            slots[i].ev.published_ms = Some(t);
            slots[i].ev.updated_ms = t;
            let (sql, args) = slots[i].ev.publish_stmt(d, &target.table);
            run(&mut conn, &sql, &args).await;
            continue;
        }
        let pending_publish = slots
            .iter()
            .filter(|s| s.ev.published_ms.is_none())
            .filter_map(|s| s.publish_at)
            .min();
        if created >= quota && pending_publish.is_none() && late_marks.is_empty() {
            break;
        }
        let mut wake = pending_publish.unwrap_or(i64::MAX);
        if created < quota {
            wake = wake.min(next_create);
        }
        let wait = (wake - now).clamp(1, 20) as u64;
        tokio::time::sleep(Duration::from_millis(wait)).await;
    }
    slots.into_iter().map(|s| s.ev).collect()
}

/// Outbox rows that exist before the agent starts: 4 published an hour ago (never
/// counted) and 6 unpublished since an hour ago. Returns 3 of the unpublished ones for
/// [`OutboxWorkload::adopt`].
pub async fn seed_outbox_history(target: &Target, now_ms: i64) -> Vec<OutboxEvent> {
    const MIN: i64 = 60_000;
    let mut rows = Vec::new();
    for i in 0..10i64 {
        let published = (i < 4).then_some(now_ms - 60 * MIN + i * 1000);
        rows.push(OutboxEvent {
            id: format!("ob-history-{i:02}"),
            event_type: Some(EVENT_TYPES[i as usize % EVENT_TYPES.len()].to_string()),
            created_ms: now_ms - 61 * MIN + i * 1000,
            published_ms: published,
            traceparent: None,
            updated_ms: now_ms,
        });
    }
    for ev in &rows {
        let (sql, args) = ev.insert_stmt(target.dialect, &target.table);
        target
            .pool
            .execute(&sql, &args)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    rows.into_iter().skip(4).take(3).collect()
}

/// The final state of every outbox row the workload wrote.
#[derive(Clone, Debug)]
pub struct OutboxTruth {
    pub events: Vec<OutboxEvent>,
    pub base_ms: i64,
}

impl OutboxTruth {
    /// Published count and publish-delay `_count`/`_sum`/`_bucket` per event type, for
    /// rows published during the run.
    pub fn expectations(&self, source: &str) -> Expectations {
        let mut by: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for e in &self.events {
            if let Some(p) = e.published_ms.filter(|&p| p >= self.base_ms) {
                by.entry(e.label()).or_default().push(p - e.created_ms);
            }
        }
        let mut x = Expectations::default();
        for (label, delays) in &by {
            let l = [("source", source), ("event_type", label.as_str())];
            x.push(
                "outbox_messages_published_total",
                &l,
                delays.len() as f64,
                Tol::Exact,
            );
            x.push(
                "outbox_publish_delay_seconds_count",
                &l,
                delays.len() as f64,
                Tol::Exact,
            );
            x.push(
                "outbox_publish_delay_seconds_sum",
                &l,
                delays.iter().sum::<i64>() as f64 / 1000.0,
                Tol::Rel(1e-6),
            );
            push_latency_buckets(&mut x, "outbox_publish_delay_seconds", &l, delays);
        }
        for name in [
            "outbox_messages_published_total",
            "outbox_publish_delay_seconds_count",
            "outbox_publish_delay_seconds_sum",
            "outbox_publish_delay_seconds_bucket",
        ] {
            x.close(name, &[("source", source)]);
        }
        x
    }

    pub fn summary(&self) -> String {
        let published = self
            .events
            .iter()
            .filter(|e| e.published_ms.is_some())
            .count();
        format!(
            "{} outbox events, {} published, {} left unpublished",
            self.events.len(),
            published,
            self.events.len() - published
        )
    }
}
