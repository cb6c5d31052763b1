//! The consumer simulation behind `inboxwatch demo`.
//!
//! It plays an at-least-once consumer writing its inbox table in SQLite,
//! PostgreSQL or MariaDB: events arrive, some are delivered twice (the
//! idempotency guard only bumps `deliveries`), a pool of workers sized for the
//! arrival rate claims and processes them (one event of an ordering key at a
//! time, in version order), attempts fail and are retried with exponential
//! backoff, and the hopeless ones are dead-lettered. Every timestamp is the
//! database's time of the write, so the agent reading the same table sees
//! genuine ages and durations. Its normal run stays under every alert of
//! alerts/inboxwatch.rules.yml but the informational single dead letter; a
//! [`Drill`] injects one fault for a while ([`super::drill`]).
//!
//! All writes go through one connection owned by the loop in [`run`]; the workers
//! are tasks that only sleep for their processing time. The pending queue is the
//! table itself, so memory stays bounded whatever the backlog.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyPool, AssertSqlSafe, Row};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::drill::{Drill, FAULT_START};
use super::sql::Statements;
use crate::dsn::Dialect;

/// Attempts processed at the same time, at least.
const MIN_WORKERS: usize = 8;
/// Worker time one event takes on average: an attempt takes 0.18 s with the
/// slow tail, and an event needs about 1.1 attempts. The pool has twice the
/// workers the rate needs, so the consumer keeps up and the backlog stays
/// bounded at any `rate_per_sec`: with a fixed pool of 8 (about 40 events/s)
/// `demo --rate 300` grew the table's backlog by 260 rows a second, and the
/// agent's memory with it.
const WORKER_SECONDS_PER_EVENT: f64 = 0.2;
/// How often an idle worker pool looks for claimable rows (and a drill checks its clock).
const CLAIM_INTERVAL: Duration = Duration::from_millis(100);
/// Backoff before the first retry; doubles with every further failed attempt,
/// up to 2^[`super::sql::MAX_BACKOFF_DOUBLINGS`] times (3.2 s).
const RETRY_BASE: Duration = Duration::from_millis(200);
/// Median time of a normal attempt.
const MEDIAN_PROCESSING_SECS: f64 = 0.080;
/// Log-normal spread of normal attempts.
const PROCESSING_SIGMA: f64 = 0.6;
/// Share of attempts that hit a slow dependency and take 1–5 s.
const SLOW_SHARE: f64 = 0.03;
/// Redeliveries waiting to happen, at most; beyond it a duplicate is not scheduled.
const REDELIVERY_CAPACITY: usize = 4096;
/// A duplicate of the normal run arrives within this long of the first
/// delivery, while it is still pending (a producer's retry): a healthy consumer
/// sees no duplicates after completion. Those are lost acknowledgements, which
/// InboxAckFailures pages on from 1 % of the completions, and which the
/// `ack-timeout` and `kill-after-commit` drills inject. (With two thirds of the
/// duplicates after completion, a quiet demo kept that alert pending.)
const DUPLICATE_WITHIN: Duration = Duration::from_millis(20);
/// Chance that a redelivered event is redelivered once more.
const REPEAT_DUPLICATE_SHARE: f64 = 0.1;
/// Id of the row planted as stuck; regular ids are `evt-<counter>-<hex>`.
const STUCK_EVENT_ID: &str = "evt-stuck-0";
/// Id of the event planted as poison, so that a dead letter shows within seconds.
const POISON_EVENT_ID: &str = "evt-poison-0";
/// Ordering keys per event type: 2,000 in all, so a key's versions are far apart.
const KEYS_PER_TYPE: u32 = 500;
/// Poison events (failing every attempt) per unit of `failure_ratio`: about
/// 0.04 dead letters/s at the default 20 events/s, under the 0.1/s floor of
/// InboxDeadLetterSpike.
const POISON_PER_FAILURE_RATIO: f64 = 0.025;

/// `kill-after-commit`: a kill every this often while the fault lasts.
const KILL_EVERY: Duration = Duration::from_secs(10);
/// `kill-after-commit`: the consumer's restart takes this long.
const RESTART_TAKES: Duration = Duration::from_secs(2);
/// `kill-after-commit`: completions this recent were committed but not acknowledged.
const UNACKED_WINDOW: Duration = Duration::from_secs(1);
/// `ack-timeout`: share of completed events delivered again.
const ACK_TIMEOUT_SHARE: f64 = 0.4;
/// `concurrent-delivery`: share of new events delivered twice at once.
const CONCURRENT_SHARE: f64 = 0.35;
/// `downstream-throttling`: share of attempts answered 429, and how much slower the rest are.
const THROTTLED_SHARE: f64 = 0.85;
const THROTTLED_SLOWDOWN: f64 = 4.0;
/// `dead-letter-replay`: the events of the bad deploy.
pub const BATCH_EVENTS: usize = 60;
/// `dead-letter-replay`: ids of the batch start with this.
pub const BATCH_PREFIX: &str = "drill-batch-";
/// `poison-key`: the key, and a new version of it this often.
pub const POISON_KEY: &str = "account-poison-1";
const POISON_KEY_EVERY: Duration = Duration::from_secs(2);

/// Errors of attempts that may succeed when retried.
const TRANSIENT_ERRORS: &[&str] = &[
    "TimeoutError: upstream payments-api did not answer in 2s",
    "TimeoutError: inventory-service did not answer in 1500ms",
    "ConnectionError: connection reset by peer (orders-db:5432)",
    "HttpError: 503 Service Unavailable from shipping-api",
    "HttpError: 429 Too Many Requests from tax-service (retry after 1s)",
    "DeadlockError: deadlock detected while updating orders row",
];
/// Errors of poison events; retrying does not help, so they are dead-lettered
/// on their first attempt (a consumer that retried them would trip
/// InboxRetryingPermanentErrors).
const PERMANENT_ERRORS: &[&str] = &[
    "ValidationError: field 'amount' must be positive, got -12.50",
    "SchemaError: unknown field 'customer_ref' in payload version 3",
];
/// The error of the poison key's events (`poison-key`): retryable, so they are
/// retried until the key is parked.
const POISON_KEY_ERROR: &str = "TimeoutError: ledger-service did not answer in 2s (account locked)";
/// The downstream's answer under `downstream-throttling`.
const THROTTLED_ERROR: &str = "HttpError: 429 Too Many Requests from pricing-api (retry after 1s)";

/// Settings of the simulation.
#[derive(Debug, Clone)]
pub struct Simulation {
    /// Inbox table to write; a plain SQL identifier (`[A-Za-z_][A-Za-z0-9_]*`).
    pub table: String,
    /// The database behind the pool.
    pub dialect: Dialect,
    /// New events per second, on average (exponential gaps between arrivals); 0 stops arrivals.
    pub rate_per_sec: f64,
    /// Event types, picked uniformly; the second one fails more often than the others.
    pub event_types: Vec<String>,
    /// Share of events delivered a second time, within 20 ms, while still pending.
    pub duplicate_ratio: f64,
    /// Chance that one processing attempt fails (the second event type fails more).
    /// Besides, a fortieth of this share of events are poison and fail every attempt,
    /// so dead letters keep coming even when retries nearly always help.
    pub failure_ratio: f64,
    /// Attempts before an event is dead-lettered.
    pub max_attempts: u32,
    /// The agent's `stuck_after`; the planted stuck row started just before it.
    pub stuck_after: Duration,
    /// Plant one row stuck in processing at the start (reclaimed after [`super::sql::LEASE`]).
    pub plant_stuck_row: bool,
    /// The fault to inject from [`FAULT_START`] on, if any.
    pub drill: Option<Drill>,
    /// Told when the fault starts and when it ends (the consumer has the fix then).
    pub phases: Option<tokio::sync::mpsc::UnboundedSender<Phase>>,
}

/// Where a drill's fault is, as [`Simulation::phases`] tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    FaultStarts,
    FaultEnds,
}

impl Default for Simulation {
    fn default() -> Self {
        Self {
            table: "inbox".to_owned(),
            dialect: Dialect::Sqlite,
            rate_per_sec: 20.0,
            event_types: [
                "orders.created",
                "payments.captured",
                "shipments.dispatched",
                "invoices.issued",
            ]
            .map(str::to_owned)
            .to_vec(),
            duplicate_ratio: 0.02,
            failure_ratio: 0.08,
            max_attempts: 4,
            stuck_after: Duration::from_secs(10),
            plant_stuck_row: true,
            drill: None,
            phases: None,
        }
    }
}

/// Creates the inbox `table` with its indexes in the database behind `pool`.
/// SQLite: switched to WAL, and the table created only if missing. PostgreSQL
/// and MariaDB: the table must not exist, and gets `comment` as its table
/// comment (how `demo --dsn` recognises its own table).
pub async fn create_table(
    pool: &AnyPool,
    dialect: Dialect,
    table: &str,
    comment: &str,
) -> Result<(), sqlx::Error> {
    check_identifier(table)?;
    let mut conn = pool.acquire().await?;
    if dialect == Dialect::Sqlite {
        sqlite_pragmas(&mut conn).await?;
    }
    for ddl in Statements::new(dialect, table).ddl(comment) {
        sqlx::raw_sql(AssertSqlSafe(ddl))
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Plants one row that is already stuck (if asked), then runs the consumer on
/// the existing table until `cancel` fires.
///
/// Holds one connection of `pool` for the whole run. Attempts in flight at
/// cancellation are abandoned in `processing`, as a killed consumer leaves them.
/// Returns `Ok(())` on cancellation and the first database error otherwise.
pub async fn run(
    pool: AnyPool,
    sim: Simulation,
    cancel: CancellationToken,
) -> Result<(), sqlx::Error> {
    let sim = Settings::new(sim)?;
    let sql = Statements::new(sim.dialect, &sim.table);
    let mut conn = pool.acquire().await?;
    if sim.dialect == Dialect::Sqlite {
        sqlite_pragmas(&mut conn).await?;
    }
    let mut rng = fastrand::Rng::new();
    if sim.plant_stuck_row {
        plant_stuck_row(&mut conn, &sql, &sim, &mut rng).await?;
    }
    info!(
        table = %sim.table,
        rate_per_sec = sim.rate_per_sec,
        workers = sim.workers,
        drill = sim.drill.map_or("none", |d| d.info().name),
        "Consumer simulation started."
    );
    let started = Instant::now();
    let mut consumer = Consumer {
        conn,
        sql,
        sim,
        rng,
        workers: JoinSet::new(),
        in_flight: HashMap::new(),
        redeliveries: BinaryHeap::new(),
        next_id: 0,
        versions: HashMap::new(),
        stats: Stats::default(),
        fault: Fault::new(started),
    };
    let poison = consumer.message(POISON_EVENT_ID.to_owned());
    consumer.deliver(&poison).await?;
    let result = consumer.run(cancel).await;
    let s = &consumer.stats;
    info!(
        received = s.received,
        duplicates = s.duplicates,
        attempts = s.attempts,
        failed_attempts = s.failed_attempts,
        succeeded = s.succeeded,
        dead_lettered = s.dead_lettered,
        parked = s.parked,
        kills = s.kills,
        "Consumer simulation stopped."
    );
    result
}

/// [`Simulation`] checked and clamped into a usable range.
struct Settings {
    table: String,
    dialect: Dialect,
    rate_per_sec: f64,
    event_types: Vec<String>,
    duplicate_ratio: f64,
    failure_ratio: f64,
    max_attempts: u32,
    stuck_after: Duration,
    plant_stuck_row: bool,
    drill: Option<Drill>,
    phases: Option<tokio::sync::mpsc::UnboundedSender<Phase>>,
    /// Size of the worker pool.
    workers: usize,
}

impl Settings {
    fn new(sim: Simulation) -> Result<Self, sqlx::Error> {
        check_identifier(&sim.table)?;
        let ratio = |r: f64| if r.is_nan() { 0.0 } else { r.clamp(0.0, 1.0) };
        let event_types = if sim.event_types.is_empty() {
            Simulation::default().event_types
        } else {
            sim.event_types
        };
        let rate_per_sec = if sim.rate_per_sec.is_finite() {
            sim.rate_per_sec.max(0.0)
        } else {
            0.0
        };
        Ok(Self {
            table: sim.table,
            dialect: sim.dialect,
            rate_per_sec,
            workers: workers_for(rate_per_sec),
            event_types,
            duplicate_ratio: ratio(sim.duplicate_ratio),
            failure_ratio: ratio(sim.failure_ratio),
            max_attempts: sim.max_attempts.max(1),
            stuck_after: sim.stuck_after,
            plant_stuck_row: sim.plant_stuck_row,
            drill: sim.drill,
            phases: sim.phases,
        })
    }

    /// Failure chance of one attempt of `event_type`: the second type is the
    /// flaky one, as if each of its attempts had to get past the failure twice.
    fn failure_ratio(&self, event_type: Option<&str>) -> f64 {
        let p = self.failure_ratio;
        match (event_type, self.event_types.get(1)) {
            (Some(t), Some(flaky)) if t == flaky => 1.0 - (1.0 - p) * (1.0 - p),
            _ => p,
        }
    }
}

/// Workers that keep up with `rate_per_sec` arrivals twice over.
fn workers_for(rate_per_sec: f64) -> usize {
    let needed = (2.0 * rate_per_sec * WORKER_SECONDS_PER_EVENT).ceil();
    // A float-to-int `as` saturates; the rate is finite and not negative.
    (needed as usize).max(MIN_WORKERS)
}

/// Whether every attempt of `msg` fails with a permanent error: a drill's own
/// events (the dead-letter batch, the poison key's versions) while its fault is
/// on and never after it (the cause is fixed, and by chance they would be parked
/// or dead-lettered again behind the drill's back); other events when
/// [`is_poison`] draws them at `share`.
fn fails_every_attempt(msg: &Message, share: f64, fault_over: bool) -> bool {
    if is_drills_own(msg) {
        return !fault_over;
    }
    is_poison(&msg.event_id, share)
}

/// Whether `msg` is one of a drill's own events: the dead-letter batch, the
/// poison key's versions.
fn is_drills_own(msg: &Message) -> bool {
    msg.event_id.starts_with(BATCH_PREFIX) || msg.ordering_key == POISON_KEY
}

/// Whether an attempt of `msg` may fail by chance (a transient error at the
/// simulation's failure ratio): not a drill's own event once the fault is
/// over. A replayed batch event keeps its attempt, so three transient
/// failures in a row would dead-letter it again behind the drill's back
/// (about one run in fourteen at the default ratios).
fn may_fail_by_chance(msg: &Message, fault_over: bool) -> bool {
    !(fault_over && is_drills_own(msg))
}

/// Whether `event_id` is a poison event, drawn once per id (FNV-1a) so that
/// every attempt of the event, even after a restart, agrees.
fn is_poison(event_id: &str, share: f64) -> bool {
    if event_id == POISON_EVENT_ID {
        return true;
    }
    let hash = event_id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let unit = (hash >> 11) as f64 / (1u64 << 53) as f64;
    unit < share
}

/// The business key and summary a consumer would store with an event: the
/// id of the order (or invoice …) it is about, and a digest of its body.
fn business_of(event_id: &str, event_type: &str) -> (String, String) {
    let hash = event_id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (
        format!("{}-{}", entity_of(event_type), 10_000 + hash % 90_000),
        format!("{event_type} body sha256:{:016x}…", hash.rotate_left(17)),
    )
}

/// `orders.created` → `order`.
fn entity_of(event_type: &str) -> &str {
    let entity = event_type.split('.').next().unwrap_or("entity");
    entity.strip_suffix('s').unwrap_or(entity)
}

/// The table name is pasted into SQL, so it must be a plain identifier.
fn check_identifier(table: &str) -> Result<(), sqlx::Error> {
    let mut chars = table.chars();
    let plain = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain {
        Ok(())
    } else {
        Err(sqlx::Error::InvalidArgument(format!(
            "simulation table {table:?} is not a plain SQL identifier"
        )))
    }
}

async fn sqlite_pragmas(conn: &mut PoolConnection<Any>) -> Result<(), sqlx::Error> {
    // The agent reads while we write: WAL keeps readers and the writer apart, and
    // a demo may lose its last transactions in a power cut (synchronous=NORMAL).
    sqlx::raw_sql("PRAGMA journal_mode=WAL; PRAGMA busy_timeout=5000; PRAGMA synchronous=NORMAL;")
        .execute(&mut **conn)
        .await?;
    Ok(())
}

async fn plant_stuck_row(
    conn: &mut PoolConnection<Any>,
    sql: &Statements,
    sim: &Settings,
    rng: &mut fastrand::Rng,
) -> Result<(), sqlx::Error> {
    // Just past stuck_after: stuck at once, and reclaimed by the lease before
    // its age reaches the demo's 30 s objective.
    let started_ago = sim.stuck_after.as_secs_f64() + 1.0;
    sqlx::query(AssertSqlSafe(sql.plant_stuck_at(started_ago)))
        .bind(STUCK_EVENT_ID)
        .bind(&sim.event_types[0])
        .bind(traceparent(rng))
        .execute(&mut **conn)
        .await?;
    Ok(())
}

/// A message as the broker delivers it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Message {
    event_id: String,
    event_type: String,
    traceparent: String,
    ordering_key: String,
    version: i64,
}

/// An event a worker holds.
#[derive(Debug)]
struct Attempt {
    msg: Message,
    attempt: u32,
    duration: Duration,
    error: Option<&'static str>,
}

/// A delivery the broker will make again; the heap is the bounded ring of event
/// ids still eligible for duplicates.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Redelivery {
    at: Instant,
    msg: Message,
}

#[derive(Debug, Default)]
struct Stats {
    received: u64,
    duplicates: u64,
    attempts: u64,
    failed_attempts: u64,
    succeeded: u64,
    dead_lettered: u64,
    parked: u64,
    kills: u64,
}

/// Where a drill stands.
struct Fault {
    /// The simulation's start; the fault runs from FAULT_START after it.
    started: Instant,
    /// The fault is on now.
    active: bool,
    /// The fault has ended (it runs once).
    over: bool,
    /// `kill-after-commit`: the next kill, and the end of the restart after the last one.
    next_kill: Option<Instant>,
    down_until: Option<Instant>,
    /// Arrivals the broker held while the consumer was down.
    held_arrivals: u64,
    /// `kill-after-commit`: recent completions, not yet acknowledged.
    unacked: VecDeque<(Instant, Message)>,
    /// `poison-key`: the next version of the poison key, and when.
    next_poison: Option<Instant>,
    /// `poison-key`: keys whose events are moved aside.
    parked_keys: HashSet<String>,
}

impl Fault {
    fn new(started: Instant) -> Self {
        Self {
            started,
            active: false,
            over: false,
            next_kill: None,
            down_until: None,
            held_arrivals: 0,
            unacked: VecDeque::new(),
            next_poison: None,
            parked_keys: HashSet::new(),
        }
    }

    /// Whether the consumer is down after a kill.
    fn down(&self, now: Instant) -> bool {
        self.down_until.is_some_and(|t| now < t)
    }
}

enum Wake {
    Cancelled,
    Finished(Result<Attempt, tokio::task::JoinError>),
    Arrival,
    Redelivery,
    ClaimTick,
}

struct Consumer {
    conn: PoolConnection<Any>,
    sql: Statements,
    sim: Settings,
    rng: fastrand::Rng,
    workers: JoinSet<Attempt>,
    /// The messages the workers hold, by event id.
    in_flight: HashMap<String, Message>,
    redeliveries: BinaryHeap<Reverse<Redelivery>>,
    next_id: u64,
    /// The last version of each ordering key (a bounded set of keys).
    versions: HashMap<String, i64>,
    stats: Stats,
    fault: Fault,
}

impl Consumer {
    async fn run(&mut self, cancel: CancellationToken) -> Result<(), sqlx::Error> {
        let mut claim_tick = tokio::time::interval(CLAIM_INTERVAL);
        claim_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let arrivals = self.sim.rate_per_sec > 0.0;
        let mut next_arrival = Instant::now() + self.arrival_gap();
        loop {
            let up = !self.fault.down(Instant::now());
            let next_redelivery = self.redeliveries.peek().map(|r| r.0.at).filter(|_| up);
            let wake = tokio::select! {
                biased;
                () = cancel.cancelled() => Wake::Cancelled,
                Some(done) = self.workers.join_next() => Wake::Finished(done),
                () = tokio::time::sleep_until(next_arrival), if arrivals => Wake::Arrival,
                () = sleep_until_or_never(next_redelivery) => Wake::Redelivery,
                _ = claim_tick.tick() => Wake::ClaimTick,
            };
            match wake {
                Wake::Cancelled => return Ok(()),
                Wake::Finished(Ok(attempt)) => {
                    self.finish(attempt).await?;
                    self.claim().await?;
                }
                Wake::Finished(Err(error)) => {
                    warn!(
                        error = %error,
                        "Simulated worker ended abnormally; its row stays processing."
                    );
                }
                Wake::Arrival => {
                    if self.fault.down(Instant::now()) {
                        self.fault.held_arrivals += 1;
                    } else {
                        self.receive().await?;
                    }
                    let now = Instant::now();
                    next_arrival += self.arrival_gap();
                    // After a stall, resume the normal rate instead of bursting to catch up.
                    if next_arrival + Duration::from_secs(1) < now {
                        next_arrival = now;
                    }
                }
                Wake::Redelivery => {
                    if let Some(Reverse(r)) = self.redeliveries.pop() {
                        self.redeliver(r).await?;
                    }
                }
                Wake::ClaimTick => {
                    self.drill_tick().await?;
                    self.claim().await?;
                }
            }
        }
    }

    fn arrival_gap(&mut self) -> Duration {
        if self.sim.rate_per_sec <= 0.0 {
            return Duration::from_secs(3600);
        }
        let gap = -(1.0 - self.rng.f64()).ln() / self.sim.rate_per_sec;
        Duration::from_secs_f64(gap.min(3600.0))
    }

    /// Whether the fault of `drill` is on.
    fn during(&self, drill: Drill) -> bool {
        self.fault.active && self.sim.drill == Some(drill)
    }

    /// Starts and ends the fault, and does what a drill does on the clock.
    async fn drill_tick(&mut self) -> Result<(), sqlx::Error> {
        let Some(drill) = self.sim.drill else {
            return Ok(());
        };
        let now = Instant::now();
        let start = self.fault.started + FAULT_START;
        let end = start + drill.info().length;
        if !self.fault.active && !self.fault.over && now >= start {
            self.fault.active = true;
            info!(drill = drill.info().name, "Drill: the fault starts.");
            self.tell(Phase::FaultStarts);
            match drill {
                Drill::KillAfterCommit => self.fault.next_kill = Some(now),
                Drill::PoisonKey => self.fault.next_poison = Some(now),
                Drill::DeadLetterReplay => {
                    for n in 0..BATCH_EVENTS {
                        // Keys of their own: a replayed event completing after a
                        // later version of its key would be an out-of-order completion.
                        let msg = Message {
                            event_id: format!("{BATCH_PREFIX}{n:03}-{:08x}", self.rng.u32(..)),
                            event_type: self.sim.event_types[n % self.sim.event_types.len()]
                                .clone(),
                            traceparent: traceparent(&mut self.rng),
                            ordering_key: format!("{BATCH_PREFIX}{n:03}"),
                            version: 1,
                        };
                        self.deliver(&msg).await?;
                        self.stats.received += 1;
                    }
                }
                _ => {}
            }
        }
        if self.fault.active && now >= end {
            self.fault.active = false;
            self.fault.over = true;
            self.fault.next_kill = None;
            self.fault.next_poison = None;
            if drill == Drill::PoisonKey {
                // Fixed: the parked key is replayed, in version order.
                self.fault.parked_keys.remove(POISON_KEY);
                sqlx::query(AssertSqlSafe(self.sql.unpark.clone()))
                    .bind(POISON_KEY)
                    .execute(&mut *self.conn)
                    .await?;
            }
            info!(drill = drill.info().name, "Drill: the fault ends.");
            self.tell(Phase::FaultEnds);
        }
        if self.fault.next_kill.is_some_and(|t| now >= t) {
            self.kill(now);
            self.fault.next_kill = Some(now + KILL_EVERY);
        }
        if let Some(until) = self.fault.down_until.filter(|t| now >= *t) {
            self.fault.down_until = None;
            debug!(?until, "Drill: the consumer restarted.");
            for _ in 0..std::mem::take(&mut self.fault.held_arrivals) {
                self.receive().await?;
            }
        }
        if self.fault.next_poison.is_some_and(|t| now >= t) {
            let version = self.versions.get(POISON_KEY).copied().unwrap_or(0) + 1;
            self.versions.insert(POISON_KEY.to_owned(), version);
            self.next_id += 1;
            let msg = Message {
                event_id: format!("evt-{}-{:08x}", self.next_id, self.rng.u32(..)),
                event_type: self.sim.event_types[0].clone(),
                traceparent: traceparent(&mut self.rng),
                ordering_key: POISON_KEY.to_owned(),
                version,
            };
            self.deliver(&msg).await?;
            self.stats.received += 1;
            self.fault.next_poison = Some(now + POISON_KEY_EVERY);
        }
        Ok(())
    }

    fn tell(&self, phase: Phase) {
        if let Some(tx) = &self.sim.phases {
            // Nobody listening is fine.
            let _ = tx.send(phase);
        }
    }

    /// `kill-after-commit`: the process dies right after a commit. The attempts
    /// in flight stay in processing; the broker redelivers, once the consumer is
    /// back, every message it did not get an acknowledgement for.
    fn kill(&mut self, now: Instant) {
        self.stats.kills += 1;
        self.workers.abort_all();
        self.workers.detach_all();
        let back = now + RESTART_TAKES;
        self.fault.down_until = Some(back);
        while self
            .fault
            .unacked
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > UNACKED_WINDOW)
        {
            self.fault.unacked.pop_front();
        }
        let unacked: Vec<Message> = self
            .fault
            .unacked
            .drain(..)
            .map(|(_, m)| m)
            .chain(self.in_flight.drain().map(|(_, m)| m))
            .collect();
        info!(
            unacknowledged = unacked.len(),
            "Drill: the consumer is killed right after a commit."
        );
        for msg in unacked {
            let at = back + Duration::from_secs_f64(self.rng.f64() * 0.5);
            self.redeliveries.push(Reverse(Redelivery { at, msg }));
        }
    }

    /// A new message: the next version of one of the type's ordering keys.
    fn message(&mut self, event_id: String) -> Message {
        let event_type = self.sim.event_types[self.rng.usize(..self.sim.event_types.len())].clone();
        let ordering_key = format!(
            "{}-{}",
            entity_of(&event_type),
            self.rng.u32(..KEYS_PER_TYPE)
        );
        let version = self.versions.entry(ordering_key.clone()).or_insert(0);
        *version += 1;
        Message {
            event_id,
            version: *version,
            ordering_key,
            event_type,
            traceparent: traceparent(&mut self.rng),
        }
    }

    async fn receive(&mut self) -> Result<(), sqlx::Error> {
        self.next_id += 1;
        let event_id = format!("evt-{}-{:08x}", self.next_id, self.rng.u32(..));
        let msg = self.message(event_id);
        self.deliver(&msg).await?;
        self.stats.received += 1;
        if self.during(Drill::ConcurrentDelivery) && self.rng.f64() < CONCURRENT_SHARE {
            let at = Instant::now() + Duration::from_secs_f64(self.rng.f64() * 0.15);
            self.redeliveries.push(Reverse(Redelivery {
                at,
                msg: msg.clone(),
            }));
        }
        if self.rng.f64() < self.sim.duplicate_ratio {
            self.schedule_redelivery(msg);
        }
        Ok(())
    }

    async fn redeliver(&mut self, r: Redelivery) -> Result<(), sqlx::Error> {
        self.deliver(&r.msg).await?;
        self.stats.duplicates += 1;
        debug!(event_id = %r.msg.event_id, "Event delivered again.");
        if self.rng.f64() < REPEAT_DUPLICATE_SHARE {
            self.schedule_redelivery(r.msg);
        }
        Ok(())
    }

    fn schedule_redelivery(&mut self, msg: Message) {
        if self.redeliveries.len() >= REDELIVERY_CAPACITY {
            return;
        }
        let delay = self.rng.f64() * DUPLICATE_WITHIN.as_secs_f64();
        self.redeliveries.push(Reverse(Redelivery {
            at: Instant::now() + Duration::from_secs_f64(delay),
            msg,
        }));
    }

    async fn deliver(&mut self, msg: &Message) -> Result<(), sqlx::Error> {
        let (key, summary) = business_of(&msg.event_id, &msg.event_type);
        sqlx::query(AssertSqlSafe(self.sql.deliver.clone()))
            .bind(&msg.event_id)
            .bind(&msg.event_type)
            .bind(&msg.traceparent)
            .bind(key)
            .bind(summary)
            .bind(&msg.ordering_key)
            .bind(msg.version)
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }

    /// Whether every attempt of this message fails with a permanent error now.
    fn is_poison(&self, msg: &Message) -> bool {
        let share = self.sim.failure_ratio(Some(&msg.event_type)) * POISON_PER_FAILURE_RATIO;
        fails_every_attempt(msg, share, self.fault.over)
    }

    /// Claims as many claimable rows as there are idle workers and starts them.
    async fn claim(&mut self) -> Result<(), sqlx::Error> {
        let idle = self.sim.workers.saturating_sub(self.workers.len());
        if idle == 0 || self.fault.down(Instant::now()) || self.during(Drill::Rebalance) {
            return Ok(());
        }
        let rows = sqlx::query(AssertSqlSafe(self.sql.claimable.clone()))
            .bind(RETRY_BASE.as_secs_f64())
            .bind(i64::try_from(idle).unwrap_or(i64::MAX))
            .fetch_all(&mut *self.conn)
            .await?;
        for row in rows {
            let event_id: String = row.try_get("event_id")?;
            let event_type: Option<String> = row.try_get("event_type")?;
            let attempts: i64 = row.try_get("attempts")?;
            let ordering_key: Option<String> = row.try_get("ordering_key")?;
            let version: Option<i64> = row.try_get("version")?;
            let traceparent: Option<String> = row.try_get("traceparent")?;
            let msg = Message {
                event_id,
                event_type: event_type.unwrap_or_default(),
                traceparent: traceparent.unwrap_or_default(),
                ordering_key: ordering_key.unwrap_or_default(),
                version: version.unwrap_or(0),
            };
            if self.fault.parked_keys.contains(&msg.ordering_key) {
                // The key is parked: its later versions are moved aside unprocessed.
                self.stats.parked += 1;
                sqlx::query(AssertSqlSafe(self.sql.park.clone()))
                    .bind(format!(
                        "Parked behind an earlier version of {}",
                        msg.ordering_key
                    ))
                    .bind(&msg.event_id)
                    .execute(&mut *self.conn)
                    .await?;
                continue;
            }
            sqlx::query(AssertSqlSafe(self.sql.claim.clone()))
                .bind(&msg.event_id)
                .execute(&mut *self.conn)
                .await?;
            let failure_ratio = self.sim.failure_ratio(Some(&msg.event_type));
            let mut duration = processing_time(&mut self.rng);
            let error = if self.is_poison(&msg) {
                Some(if msg.ordering_key == POISON_KEY {
                    POISON_KEY_ERROR
                } else {
                    PERMANENT_ERRORS[self.rng.usize(..PERMANENT_ERRORS.len())]
                })
            } else if self.during(Drill::DownstreamThrottling) {
                if self.rng.f64() < THROTTLED_SHARE {
                    duration = Duration::from_millis(self.rng.u64(30..80));
                    Some(THROTTLED_ERROR)
                } else {
                    duration = duration.mul_f64(THROTTLED_SLOWDOWN);
                    None
                }
            } else {
                (may_fail_by_chance(&msg, self.fault.over) && self.rng.f64() < failure_ratio)
                    .then(|| TRANSIENT_ERRORS[self.rng.usize(..TRANSIENT_ERRORS.len())])
            };
            let attempt = Attempt {
                attempt: u32::try_from(attempts + 1).unwrap_or(u32::MAX),
                msg,
                duration,
                error,
            };
            self.stats.attempts += 1;
            self.in_flight
                .insert(attempt.msg.event_id.clone(), attempt.msg.clone());
            self.workers.spawn(async move {
                tokio::time::sleep(attempt.duration).await;
                attempt
            });
        }
        Ok(())
    }

    async fn finish(&mut self, attempt: Attempt) -> Result<(), sqlx::Error> {
        self.in_flight.remove(&attempt.msg.event_id);
        let id = &attempt.msg.event_id;
        let result = match attempt.error {
            None => {
                self.stats.succeeded += 1;
                let done = sqlx::query(AssertSqlSafe(self.sql.succeed.clone()))
                    .bind(id)
                    .execute(&mut *self.conn)
                    .await?;
                let now = Instant::now();
                if self.during(Drill::AckTimeout) && self.rng.f64() < ACK_TIMEOUT_SHARE {
                    let at = now + Duration::from_secs_f64(1.0 + 4.0 * self.rng.f64());
                    self.redeliveries.push(Reverse(Redelivery {
                        at,
                        msg: attempt.msg.clone(),
                    }));
                }
                if self.during(Drill::KillAfterCommit) {
                    self.fault.unacked.push_back((now, attempt.msg.clone()));
                    if self.fault.unacked.len() > REDELIVERY_CAPACITY {
                        self.fault.unacked.pop_front();
                    }
                }
                done
            }
            Some(error) => {
                self.stats.failed_attempts += 1;
                // A throttled attempt is retried however often; an error no retry
                // can fix is dead-lettered at once.
                let throttled = error == THROTTLED_ERROR;
                let permanent = PERMANENT_ERRORS.contains(&error);
                let statement =
                    if throttled || (attempt.attempt < self.sim.max_attempts && !permanent) {
                        &self.sql.fail
                    } else if attempt.msg.ordering_key == POISON_KEY && !self.fault.over {
                        // The key's first version gives up: the key is parked.
                        self.stats.parked += 1;
                        self.fault.parked_keys.insert(POISON_KEY.to_owned());
                        &self.sql.park
                    } else {
                        self.stats.dead_lettered += 1;
                        debug!(
                            event_id = %id,
                            event_type = %attempt.msg.event_type,
                            attempts = attempt.attempt,
                            error,
                            "Event dead-lettered."
                        );
                        &self.sql.dead
                    };
                sqlx::query(AssertSqlSafe(statement.clone()))
                    .bind(error)
                    .bind(id)
                    .execute(&mut *self.conn)
                    .await?
            }
        };
        if result.rows_affected() == 0 {
            debug!(event_id = %id, "Row changed under the worker; result dropped.");
        }
        Ok(())
    }
}

async fn sleep_until_or_never(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// One attempt's processing time: log-normal around the median, plus a slow tail.
fn processing_time(rng: &mut fastrand::Rng) -> Duration {
    if rng.f64() < SLOW_SHARE {
        return Duration::from_secs_f64(1.0 + 4.0 * rng.f64());
    }
    // Box–Muller; 1 - f64() is in (0, 1], so the logarithm is finite.
    let z = (-2.0 * (1.0 - rng.f64()).ln()).sqrt() * (std::f64::consts::TAU * rng.f64()).cos();
    Duration::from_secs_f64((MEDIAN_PROCESSING_SECS * (PROCESSING_SIGMA * z).exp()).min(0.9))
}

/// A W3C `traceparent` of a sampled producer span.
fn traceparent(rng: &mut fastrand::Rng) -> String {
    format!("00-{:032x}-{:016x}-01", rng.u128(1..), rng.u64(1..))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::any::AnyPoolOptions;
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    /// A temporary database file, removed (with its WAL files) on drop.
    struct TempDb(PathBuf);

    impl TempDb {
        fn new(name: &str) -> Self {
            Self(std::env::temp_dir().join(format!(
                "inboxwatch-sim-{name}-{}-{:016x}.db",
                std::process::id(),
                fastrand::u64(..)
            )))
        }
    }

    impl Drop for TempDb {
        fn drop(&mut self) {
            for suffix in ["", "-wal", "-shm"] {
                let mut p = self.0.clone().into_os_string();
                p.push(suffix);
                let _ = std::fs::remove_file(p);
            }
        }
    }

    async fn pool(path: &Path, read_only: bool) -> AnyPool {
        sqlx::any::install_default_drivers();
        let mode = if read_only { "ro" } else { "rwc" };
        AnyPoolOptions::new()
            .max_connections(2)
            .connect(&format!("sqlite://{}?mode={mode}", path.display()))
            .await
            .expect("test database opens")
    }

    #[test]
    fn processing_time_has_the_intended_shape() {
        let mut rng = fastrand::Rng::with_seed(7);
        let mut secs: Vec<f64> = (0..20_000)
            .map(|_| processing_time(&mut rng).as_secs_f64())
            .collect();
        secs.sort_by(f64::total_cmp);
        let median = secs[secs.len() / 2];
        let slow = secs.iter().filter(|&&s| s >= 1.0).count() as f64 / secs.len() as f64;
        assert!((0.07..0.09).contains(&median), "median {median}");
        assert!((0.02..0.04).contains(&slow), "slow share {slow}");
        assert!(secs[secs.len() - 1] <= 5.0);
    }

    #[test]
    fn the_worker_pool_keeps_up_with_the_rate() {
        assert_eq!(workers_for(0.0), MIN_WORKERS);
        assert_eq!(
            workers_for(20.0),
            MIN_WORKERS,
            "the default rate keeps 8 workers"
        );
        assert_eq!(workers_for(300.0), 120);
        // The estimate against the processing-time model, at 1.1 attempts an event.
        let mut rng = fastrand::Rng::with_seed(7);
        let mean = (0..100_000)
            .map(|_| processing_time(&mut rng).as_secs_f64())
            .sum::<f64>()
            / 100_000.0;
        let per_event = mean * 1.1;
        assert!(
            (per_event - WORKER_SECONDS_PER_EVENT).abs() < 0.1 * WORKER_SECONDS_PER_EVENT,
            "{per_event} s of worker time an event"
        );
    }

    #[test]
    fn poison_share_follows_the_ratio() {
        let mut rng = fastrand::Rng::with_seed(3);
        let ids: Vec<String> = (0..100_000)
            .map(|i| format!("evt-{i}-{:08x}", rng.u32(..)))
            .collect();
        let poison = ids.iter().filter(|id| is_poison(id, 0.008)).count();
        assert!((600..1000).contains(&poison), "{poison} poison ids");
        assert!(!ids.iter().any(|id| is_poison(id, 0.0)));
    }

    #[test]
    fn a_drills_own_events_fail_exactly_while_its_fault_is_on() {
        let mut rng = fastrand::Rng::with_seed(5);
        let msg = |event_id: String, ordering_key: &str| Message {
            event_id,
            event_type: "OrderPlaced".to_owned(),
            traceparent: String::new(),
            ordering_key: ordering_key.to_owned(),
            version: 1,
        };
        let ids: Vec<String> = (0..10_000)
            .map(|i| format!("evt-{i}-{:08x}", rng.u32(..)))
            .collect();
        // At a share of a half, thousands of these ids are drawn as poison; none
        // of the drill's own events may be once the cause is fixed.
        for id in &ids {
            for m in [
                msg(id.clone(), POISON_KEY),
                msg(
                    format!("{BATCH_PREFIX}{id}"),
                    &format!("{BATCH_PREFIX}{id}"),
                ),
            ] {
                assert!(
                    fails_every_attempt(&m, 0.5, false),
                    "{m:?} during the fault"
                );
                assert!(!fails_every_attempt(&m, 0.5, true), "{m:?} after the fault");
                assert!(may_fail_by_chance(&m, false), "{m:?} during the fault");
                assert!(!may_fail_by_chance(&m, true), "{m:?} after the fault");
            }
            let other = msg(id.clone(), "account-1");
            assert!(
                may_fail_by_chance(&other, true),
                "{other:?} after the fault"
            );
        }
        let drawn = ids
            .iter()
            .filter(|id| fails_every_attempt(&msg((*id).clone(), "account-1"), 0.5, true))
            .count();
        assert_eq!(drawn, ids.iter().filter(|id| is_poison(id, 0.5)).count());
        assert!((4_000..6_000).contains(&drawn), "{drawn} poison ids");
    }

    #[test]
    fn traceparent_is_w3c() {
        let tp = traceparent(&mut fastrand::Rng::with_seed(1));
        let parts: Vec<&str> = tp.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [2, 32, 16, 2]
        );
        assert!(tp.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
    }

    #[tokio::test]
    async fn rejects_a_table_name_that_is_not_an_identifier() {
        let db = TempDb::new("badname");
        let sim = Simulation {
            table: "inbox; DROP TABLE x".into(),
            ..Simulation::default()
        };
        let pool = pool(&db.0, false).await;
        let err = run(pool.clone(), sim, CancellationToken::new())
            .await
            .expect_err("bad table name is refused");
        assert!(matches!(err, sqlx::Error::InvalidArgument(_)), "{err}");
        let err = create_table(&pool, Dialect::Sqlite, "a.b", "")
            .await
            .expect_err("bad table name is refused");
        assert!(matches!(err, sqlx::Error::InvalidArgument(_)), "{err}");
    }

    /// Runs the consumer against a file while a read-only reader (like the agent)
    /// samples it, then checks the table's final state.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_a_realistic_inbox() {
        let db = TempDb::new("run");
        let sim = Simulation {
            table: "inbox_sim".into(),
            rate_per_sec: 50.0,
            duplicate_ratio: 0.2,
            failure_ratio: 0.5,
            max_attempts: 2,
            ..Simulation::default()
        };
        let stuck_after = sim.stuck_after;
        let writer_pool = pool(&db.0, false).await;
        create_table(&writer_pool, Dialect::Sqlite, &sim.table, "")
            .await
            .expect("table created");
        let reader = pool(&db.0, true).await;
        let cancel = CancellationToken::new();
        let writer = tokio::spawn(run(writer_pool, sim, cancel.clone()));

        // At least 8 s (about 400 events at 50 a second) and until 250 rows are
        // written: a loaded machine slows the writer (it wrote 234 in 8 s beside
        // the suite once), and how fast it writes is not what this checks. At
        // most 11 s: the planted row, started 11 s before, is reclaimed 25 s
        // after its start.
        let started = Instant::now();
        let mut seen = BTreeSet::new();
        let mut rows = 0;
        while started.elapsed() < Duration::from_secs(8)
            || (rows <= 250 && started.elapsed() < Duration::from_secs(11))
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(!writer.is_finished(), "simulation ended early");
            let statuses: Vec<String> = sqlx::query_scalar("SELECT DISTINCT status FROM inbox_sim")
                .fetch_all(&reader)
                .await
                .expect("reader sees the table");
            seen.extend(statuses);
            rows = sqlx::query_scalar::<_, i64>("SELECT count(*) FROM inbox_sim")
                .fetch_one(&reader)
                .await
                .expect("reader counts the table");
        }
        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(5), writer)
            .await
            .expect("simulation stops on cancel")
            .expect("simulation task")
            .expect("simulation ends with Ok");
        let expected: BTreeSet<String> = ["pending", "processing", "succeeded", "failed", "dead"]
            .map(String::from)
            .into();
        assert_eq!(seen, expected, "statuses seen while running");

        let count = |sql: &'static str| {
            let reader = reader.clone();
            async move {
                sqlx::query_scalar::<_, i64>(sql)
                    .fetch_one(&reader)
                    .await
                    .expect(sql)
            }
        };
        let total = count("SELECT count(*) FROM inbox_sim").await;
        let succeeded = count("SELECT count(*) FROM inbox_sim WHERE status = 'succeeded'").await;
        let dead = count("SELECT count(*) FROM inbox_sim WHERE status = 'dead'").await;
        let duplicated = count("SELECT count(*) FROM inbox_sim WHERE deliveries > 1").await;
        let retried = count("SELECT count(*) FROM inbox_sim WHERE attempts > 1").await;
        eprintln!(
            "rows {total}, succeeded {succeeded}, dead {dead}, \
             duplicated {duplicated}, retried {retried}"
        );
        assert!(
            total > 250,
            "over 250 events expected within 11 s, got {total}"
        );
        assert!(succeeded > 0 && dead > 0 && duplicated > 0 && retried > 0);
        let stuck: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM inbox_sim WHERE status = 'processing' AND started_at < \
             strftime('%Y-%m-%d %H:%M:%f','now', ?1)",
        )
        .bind(format!("-{} seconds", stuck_after.as_secs()))
        .fetch_one(&reader)
        .await
        .expect("stuck query");
        assert_eq!(stuck, 1, "exactly the planted row is stuck");
        assert_eq!(
            count(
                "SELECT count(*) FROM inbox_sim WHERE status IN ('succeeded','dead') AND NOT \
                 (finished_at >= started_at AND started_at >= received_at)"
            )
            .await,
            0,
            "terminal rows have received <= started <= finished"
        );
        assert_eq!(
            count(
                "SELECT count(*) FROM inbox_sim WHERE updated_at < received_at \
                 OR updated_at < coalesce(started_at, '') OR updated_at < coalesce(finished_at, '')"
            )
            .await,
            0,
            "updated_at is the latest time of its row"
        );
        assert_eq!(
            count(
                "SELECT count(*) FROM inbox_sim WHERE (status IN ('succeeded','dead')) \
                 != (finished_at IS NOT NULL) OR (attempts > 0) != (started_at IS NOT NULL) \
                 OR (status = 'dead' AND NOT (attempts = 2 OR (attempts = 1 AND \
                 (last_error LIKE 'ValidationError%' OR last_error LIKE 'SchemaError%')))) \
                 OR (status = 'dead' AND last_error IS NULL) \
                 OR (status = 'succeeded' AND last_error IS NOT NULL) \
                 OR attempts > 2"
            )
            .await,
            0,
            "statuses agree with the other columns"
        );
        let digits = |n: usize| "[0-9]".repeat(n);
        let canonical = format!(
            "{}-{}-{} {}:{}:{}.{}",
            digits(4),
            digits(2),
            digits(2),
            digits(2),
            digits(2),
            digits(2),
            digits(3)
        );
        let malformed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM inbox_sim WHERE NOT (received_at GLOB ?1 AND updated_at GLOB ?1 \
             AND coalesce(started_at, received_at) GLOB ?1 \
             AND coalesce(finished_at, received_at) GLOB ?1)",
        )
        .bind(canonical)
        .fetch_one(&reader)
        .await
        .expect("format query");
        assert_eq!(malformed, 0, "timestamps are canonical");
    }
}
