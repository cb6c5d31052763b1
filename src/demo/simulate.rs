//! The consumer simulation behind `inboxwatch demo`.
//!
//! It plays an at-least-once consumer writing its inbox table in SQLite: events
//! arrive, some are delivered twice (the idempotency guard only bumps
//! `deliveries`), a pool of workers sized for the arrival rate claims and processes them, attempts fail
//! and are retried with exponential backoff, and the hopeless ones are
//! dead-lettered. Every timestamp is the real time of the write, so the agent
//! reading the same file sees genuine ages and durations.
//!
//! All writes go through one connection owned by the loop in [`run`]; the workers
//! are tasks that only sleep for their processing time. The pending queue is the
//! table itself, so memory stays bounded whatever the backlog.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, Row, Sqlite, SqlitePool};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Attempts processed at the same time, at least.
const MIN_WORKERS: usize = 8;
/// Worker time one event takes on average: an attempt takes 0.18 s with the
/// slow tail, and an event needs about 1.1 attempts. The pool has twice the
/// workers the rate needs, so the consumer keeps up and the backlog stays
/// bounded at any `rate_per_sec`: with a fixed pool of 8 (about 40 events/s)
/// `demo --rate 300` grew the table's backlog by 260 rows a second, and the
/// agent's memory with it.
const WORKER_SECONDS_PER_EVENT: f64 = 0.2;
/// How often an idle worker pool looks for claimable rows.
const CLAIM_INTERVAL: Duration = Duration::from_millis(100);
/// Backoff before the first retry; doubles with every further failed attempt.
const RETRY_BASE: Duration = Duration::from_millis(200);
/// Median time of a normal attempt.
const MEDIAN_PROCESSING_SECS: f64 = 0.080;
/// Log-normal spread of normal attempts.
const PROCESSING_SIGMA: f64 = 0.6;
/// Share of attempts that hit a slow dependency and take 1–5 s.
const SLOW_SHARE: f64 = 0.03;
/// Redeliveries waiting to happen, at most; beyond it a duplicate is not scheduled.
const REDELIVERY_CAPACITY: usize = 4096;
/// Share of duplicates that arrive while the first delivery is still unfinished.
const EARLY_DUPLICATE_SHARE: f64 = 0.35;
/// Chance that a redelivered event is redelivered once more.
const REPEAT_DUPLICATE_SHARE: f64 = 0.1;
/// Id of the row planted as stuck; regular ids are `evt-<counter>-<hex>`.
const STUCK_EVENT_ID: &str = "evt-stuck-0";
/// The current time in the table's canonical text format.
const NOW: &str = "strftime('%Y-%m-%d %H:%M:%f','now')";

/// Poison events (failing every attempt) per unit of `failure_ratio`.
const POISON_PER_FAILURE_RATIO: f64 = 0.1;

/// Errors of attempts that may succeed when retried.
const TRANSIENT_ERRORS: &[&str] = &[
    "TimeoutError: upstream payments-api did not answer in 2s",
    "TimeoutError: inventory-service did not answer in 1500ms",
    "ConnectionError: connection reset by peer (orders-db:5432)",
    "HttpError: 503 Service Unavailable from shipping-api",
    "HttpError: 429 Too Many Requests from tax-service (retry after 1s)",
    "DeadlockError: deadlock detected while updating orders row",
];
/// Errors of poison events; retrying does not help.
const PERMANENT_ERRORS: &[&str] = &[
    "ValidationError: field 'amount' must be positive, got -12.50",
    "SchemaError: unknown field 'customer_ref' in payload version 3",
];

/// Settings of the simulation.
#[derive(Debug, Clone)]
pub struct Simulation {
    /// Inbox table to create and write; a plain SQL identifier (`[A-Za-z_][A-Za-z0-9_]*`).
    pub table: String,
    /// New events per second, on average (exponential gaps between arrivals); 0 stops arrivals.
    pub rate_per_sec: f64,
    /// Event types, picked uniformly; the second one fails more often than the others.
    pub event_types: Vec<String>,
    /// Share of events delivered a second time, some while unfinished, most after completion.
    pub duplicate_ratio: f64,
    /// Chance that one processing attempt fails (the second event type fails more).
    /// Besides, a tenth of this share of events are poison and fail every attempt,
    /// so dead letters keep coming even when retries nearly always help.
    pub failure_ratio: f64,
    /// Attempts before an event is dead-lettered.
    pub max_attempts: u32,
    /// The agent's `stuck_after`; the planted stuck row started well before it.
    pub stuck_after: Duration,
}

impl Default for Simulation {
    fn default() -> Self {
        Self {
            table: "inbox".to_owned(),
            rate_per_sec: 20.0,
            event_types: [
                "orders.created",
                "payments.captured",
                "shipments.dispatched",
                "invoices.issued",
            ]
            .map(str::to_owned)
            .to_vec(),
            duplicate_ratio: 0.04,
            failure_ratio: 0.08,
            max_attempts: 4,
            stuck_after: Duration::from_secs(10),
        }
    }
}

/// Switches the database behind `pool` to WAL and creates the inbox `table` with
/// its indexes if missing, so that the agent finds it before the first event.
/// [`run`] does the same; calling both is harmless.
pub async fn create_table(pool: &SqlitePool, table: &str) -> Result<(), sqlx::Error> {
    check_identifier(table)?;
    let mut conn = pool.acquire().await?;
    prepare(&mut conn, &Statements::new(table)).await
}

/// Creates the table in the database behind `pool` if missing, plants one row that
/// is already stuck, then runs the consumer until `cancel` fires.
///
/// Holds one connection of `pool` for the whole run and switches the database to
/// WAL. Attempts in flight at cancellation are abandoned in `processing`, as a
/// killed consumer leaves them. Returns `Ok(())` on cancellation and the first
/// database error otherwise.
pub async fn run(
    pool: SqlitePool,
    sim: Simulation,
    cancel: CancellationToken,
) -> Result<(), sqlx::Error> {
    let sim = Settings::new(sim)?;
    let sql = Statements::new(&sim.table);
    let mut conn = pool.acquire().await?;
    prepare(&mut conn, &sql).await?;
    let mut rng = fastrand::Rng::new();
    plant_stuck_row(&mut conn, &sql, &sim, &mut rng).await?;
    info!(
        table = %sim.table,
        rate_per_sec = sim.rate_per_sec,
        workers = sim.workers,
        "Consumer simulation started."
    );
    let mut consumer = Consumer {
        conn,
        sql,
        sim,
        rng,
        workers: JoinSet::new(),
        redeliveries: BinaryHeap::new(),
        next_id: 0,
        stats: Stats::default(),
    };
    let result = consumer.run(cancel).await;
    let s = &consumer.stats;
    info!(
        received = s.received,
        duplicates = s.duplicates,
        attempts = s.attempts,
        failed_attempts = s.failed_attempts,
        succeeded = s.succeeded,
        dead_lettered = s.dead_lettered,
        "Consumer simulation stopped."
    );
    result
}

/// [`Simulation`] checked and clamped into a usable range.
struct Settings {
    table: String,
    rate_per_sec: f64,
    event_types: Vec<String>,
    duplicate_ratio: f64,
    failure_ratio: f64,
    max_attempts: u32,
    stuck_after: Duration,
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
            rate_per_sec,
            workers: workers_for(rate_per_sec),
            event_types,
            duplicate_ratio: ratio(sim.duplicate_ratio),
            failure_ratio: ratio(sim.failure_ratio),
            max_attempts: sim.max_attempts.max(1),
            stuck_after: sim.stuck_after,
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

/// Whether `event_id` is a poison event, drawn once per id (FNV-1a) so that
/// every attempt of the event, even after a restart, agrees.
fn is_poison(event_id: &str, share: f64) -> bool {
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
    let entity = event_type.split('.').next().unwrap_or("entity");
    let entity = entity.strip_suffix('s').unwrap_or(entity);
    (
        format!("{entity}-{}", 10_000 + hash % 90_000),
        format!("{event_type} body sha256:{:016x}…", hash.rotate_left(17)),
    )
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

/// The statements of one run, built once for its table.
struct Statements {
    ddl: String,
    plant_stuck: Arc<str>,
    deliver: Arc<str>,
    claim: Arc<str>,
    succeed: Arc<str>,
    fail: Arc<str>,
}

impl Statements {
    fn new(t: &str) -> Self {
        // A row's new timestamp never goes below its updated_at, so the row's times
        // stay ordered even if the wall clock steps back.
        let now = format!("max({NOW}, updated_at)");
        let sql = |s: String| Arc::<str>::from(s);
        Self {
            ddl: format!(
                "CREATE TABLE IF NOT EXISTS {t} (event_id TEXT PRIMARY KEY, event_type TEXT, \
                 status TEXT NOT NULL, received_at TEXT NOT NULL, started_at TEXT, \
                 finished_at TEXT, attempts INTEGER NOT NULL DEFAULT 0, \
                 deliveries INTEGER NOT NULL DEFAULT 1, last_error TEXT, traceparent TEXT, \
                 updated_at TEXT NOT NULL, business_key TEXT, summary TEXT);\n\
                 CREATE INDEX IF NOT EXISTS {t}_updated_at ON {t} (updated_at);\n\
                 CREATE INDEX IF NOT EXISTS {t}_unfinished ON {t} (received_at) \
                 WHERE status IN ('pending','processing','failed');\n"
            ),
            plant_stuck: sql(format!(
                "INSERT INTO {t} (event_id, event_type, status, received_at, started_at, \
                 finished_at, attempts, deliveries, last_error, traceparent, updated_at) \
                 VALUES (?1, ?2, 'processing', strftime('%Y-%m-%d %H:%M:%f','now',?3), \
                 strftime('%Y-%m-%d %H:%M:%f','now',?4), NULL, 1, 1, NULL, ?5, {NOW}) \
                 ON CONFLICT (event_id) DO UPDATE SET status = excluded.status, \
                 received_at = excluded.received_at, started_at = excluded.started_at, \
                 finished_at = NULL, attempts = 1, deliveries = 1, last_error = NULL, \
                 updated_at = excluded.updated_at"
            )),
            // The inbox write of a real consumer: the first delivery inserts, a
            // redelivery hits the primary key and only counts itself.
            deliver: sql(format!(
                "INSERT INTO {t} (event_id, event_type, status, received_at, attempts, \
                 deliveries, traceparent, updated_at, business_key, summary) \
                 VALUES (?1, ?2, 'pending', {NOW}, 0, 1, ?3, {NOW}, ?4, ?5) \
                 ON CONFLICT (event_id) DO UPDATE SET deliveries = deliveries + 1, \
                 updated_at = {now}"
            )),
            // Oldest first among pending rows and failed rows whose backoff is over;
            // the status IN (...) term lets SQLite walk the partial index.
            claim: sql(format!(
                "UPDATE {t} SET status = 'processing', attempts = attempts + 1, \
                 started_at = {now}, updated_at = {now} \
                 WHERE event_id IN (SELECT event_id FROM {t} \
                 WHERE status IN ('pending','processing','failed') \
                 AND (status = 'pending' OR (status = 'failed' AND julianday(updated_at) \
                 + (?1 * (1 << min(max(attempts - 1, 0), 20))) / 86400.0 <= julianday('now'))) \
                 ORDER BY received_at LIMIT ?2) \
                 RETURNING event_id, event_type, attempts"
            )),
            succeed: sql(format!(
                "UPDATE {t} SET status = 'succeeded', finished_at = {now}, last_error = NULL, \
                 updated_at = {now} WHERE event_id = ?1 AND status = 'processing'"
            )),
            fail: sql(format!(
                "UPDATE {t} SET status = ?2, \
                 finished_at = CASE WHEN ?2 = 'dead' THEN {now} END, last_error = ?3, \
                 updated_at = {now} WHERE event_id = ?1 AND status = 'processing'"
            )),
        }
    }
}

async fn prepare(conn: &mut PoolConnection<Sqlite>, sql: &Statements) -> Result<(), sqlx::Error> {
    // The agent reads while we write: WAL keeps readers and the writer apart, and
    // a demo may lose its last transactions in a power cut (synchronous=NORMAL).
    sqlx::raw_sql("PRAGMA journal_mode=WAL; PRAGMA busy_timeout=5000; PRAGMA synchronous=NORMAL;")
        .execute(&mut **conn)
        .await?;
    sqlx::raw_sql(AssertSqlSafe(sql.ddl.clone()))
        .execute(&mut **conn)
        .await?;
    Ok(())
}

async fn plant_stuck_row(
    conn: &mut PoolConnection<Sqlite>,
    sql: &Statements,
    sim: &Settings,
    rng: &mut fastrand::Rng,
) -> Result<(), sqlx::Error> {
    let started_ago = sim.stuck_after.as_secs_f64() * 2.0 + 60.0;
    sqlx::query(AssertSqlSafe(sql.plant_stuck.clone()))
        .bind(STUCK_EVENT_ID)
        .bind(&sim.event_types[0])
        .bind(format!("-{:.3} seconds", started_ago + 0.25))
        .bind(format!("-{started_ago:.3} seconds"))
        .bind(traceparent(rng))
        .execute(&mut **conn)
        .await?;
    Ok(())
}

/// An event a worker holds.
#[derive(Debug)]
struct Attempt {
    event_id: String,
    event_type: Option<String>,
    attempt: u32,
    duration: Duration,
    error: Option<&'static str>,
}

/// A delivery the broker will make again; the heap is the bounded ring of event
/// ids still eligible for duplicates.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Redelivery {
    at: Instant,
    event_id: String,
    event_type: String,
    traceparent: String,
}

#[derive(Debug, Default)]
struct Stats {
    received: u64,
    duplicates: u64,
    attempts: u64,
    failed_attempts: u64,
    succeeded: u64,
    dead_lettered: u64,
}

enum Wake {
    Cancelled,
    Finished(Result<Attempt, tokio::task::JoinError>),
    Arrival,
    Redelivery,
    ClaimTick,
}

struct Consumer {
    conn: PoolConnection<Sqlite>,
    sql: Statements,
    sim: Settings,
    rng: fastrand::Rng,
    workers: JoinSet<Attempt>,
    redeliveries: BinaryHeap<Reverse<Redelivery>>,
    next_id: u64,
    stats: Stats,
}

impl Consumer {
    async fn run(&mut self, cancel: CancellationToken) -> Result<(), sqlx::Error> {
        let mut claim_tick = tokio::time::interval(CLAIM_INTERVAL);
        claim_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let arrivals = self.sim.rate_per_sec > 0.0;
        let mut next_arrival = Instant::now() + self.arrival_gap();
        loop {
            let next_redelivery = self.redeliveries.peek().map(|r| r.0.at);
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
                    self.receive().await?;
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
                Wake::ClaimTick => self.claim().await?,
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

    async fn receive(&mut self) -> Result<(), sqlx::Error> {
        self.next_id += 1;
        let event_id = format!("evt-{}-{:08x}", self.next_id, self.rng.u32(..));
        let event_type = self.sim.event_types[self.rng.usize(..self.sim.event_types.len())].clone();
        let traceparent = traceparent(&mut self.rng);
        self.deliver(&event_id, &event_type, &traceparent).await?;
        self.stats.received += 1;
        if self.rng.f64() < self.sim.duplicate_ratio {
            self.schedule_redelivery(event_id, event_type, traceparent);
        }
        Ok(())
    }

    async fn redeliver(&mut self, r: Redelivery) -> Result<(), sqlx::Error> {
        self.deliver(&r.event_id, &r.event_type, &r.traceparent)
            .await?;
        self.stats.duplicates += 1;
        debug!(event_id = %r.event_id, "Event delivered again.");
        if self.rng.f64() < REPEAT_DUPLICATE_SHARE {
            self.schedule_redelivery(r.event_id, r.event_type, r.traceparent);
        }
        Ok(())
    }

    fn schedule_redelivery(&mut self, event_id: String, event_type: String, traceparent: String) {
        if self.redeliveries.len() >= REDELIVERY_CAPACITY {
            return;
        }
        // Some duplicates race the first delivery (pending or processing); most
        // come back after completion, from a broker that lost the acknowledgement.
        let delay = if self.rng.f64() < EARLY_DUPLICATE_SHARE {
            self.rng.f64() * 0.2
        } else {
            60f64.powf(self.rng.f64())
        };
        self.redeliveries.push(Reverse(Redelivery {
            at: Instant::now() + Duration::from_secs_f64(delay),
            event_id,
            event_type,
            traceparent,
        }));
    }

    async fn deliver(
        &mut self,
        event_id: &str,
        event_type: &str,
        traceparent: &str,
    ) -> Result<(), sqlx::Error> {
        let (key, summary) = business_of(event_id, event_type);
        sqlx::query(AssertSqlSafe(self.sql.deliver.clone()))
            .bind(event_id)
            .bind(event_type)
            .bind(traceparent)
            .bind(key)
            .bind(summary)
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }

    /// Claims as many claimable rows as there are idle workers and starts them.
    async fn claim(&mut self) -> Result<(), sqlx::Error> {
        let idle = self.sim.workers.saturating_sub(self.workers.len());
        if idle == 0 {
            return Ok(());
        }
        let rows = sqlx::query(AssertSqlSafe(self.sql.claim.clone()))
            .bind(RETRY_BASE.as_secs_f64())
            .bind(i64::try_from(idle).unwrap_or(i64::MAX))
            .fetch_all(&mut *self.conn)
            .await?;
        for row in rows {
            let event_id: String = row.try_get("event_id")?;
            let event_type: Option<String> = row.try_get("event_type")?;
            let attempt: i64 = row.try_get("attempts")?;
            let failure_ratio = self.sim.failure_ratio(event_type.as_deref());
            let error = if is_poison(&event_id, failure_ratio * POISON_PER_FAILURE_RATIO) {
                Some(PERMANENT_ERRORS[self.rng.usize(..PERMANENT_ERRORS.len())])
            } else {
                (self.rng.f64() < failure_ratio)
                    .then(|| TRANSIENT_ERRORS[self.rng.usize(..TRANSIENT_ERRORS.len())])
            };
            let attempt = Attempt {
                event_id,
                event_type,
                attempt: u32::try_from(attempt).unwrap_or(u32::MAX),
                duration: processing_time(&mut self.rng),
                error,
            };
            self.stats.attempts += 1;
            self.workers.spawn(async move {
                tokio::time::sleep(attempt.duration).await;
                attempt
            });
        }
        Ok(())
    }

    async fn finish(&mut self, attempt: Attempt) -> Result<(), sqlx::Error> {
        let result = match attempt.error {
            None => {
                self.stats.succeeded += 1;
                sqlx::query(AssertSqlSafe(self.sql.succeed.clone()))
                    .bind(&attempt.event_id)
                    .execute(&mut *self.conn)
                    .await?
            }
            Some(error) => {
                self.stats.failed_attempts += 1;
                let status = if attempt.attempt >= self.sim.max_attempts {
                    self.stats.dead_lettered += 1;
                    debug!(
                        event_id = %attempt.event_id,
                        event_type = attempt.event_type.as_deref().unwrap_or("unknown"),
                        attempts = attempt.attempt,
                        error,
                        "Event dead-lettered."
                    );
                    "dead"
                } else {
                    "failed"
                };
                sqlx::query(AssertSqlSafe(self.sql.fail.clone()))
                    .bind(&attempt.event_id)
                    .bind(status)
                    .bind(error)
                    .execute(&mut *self.conn)
                    .await?
            }
        };
        if result.rows_affected() == 0 {
            debug!(event_id = %attempt.event_id, "Row changed under the worker; result dropped.");
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
    use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
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

    async fn pool(path: &Path, read_only: bool) -> SqlitePool {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(!read_only)
            .read_only(read_only);
        SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(options)
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
        let err = create_table(&pool, "a.b")
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
        create_table(&writer_pool, &sim.table)
            .await
            .expect("table created");
        let reader = pool(&db.0, true).await;
        let cancel = CancellationToken::new();
        let writer = tokio::spawn(run(writer_pool, sim, cancel.clone()));

        let deadline = Instant::now() + Duration::from_secs(8);
        let mut seen = BTreeSet::new();
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(!writer.is_finished(), "simulation ended early");
            let statuses: Vec<String> = sqlx::query_scalar("SELECT DISTINCT status FROM inbox_sim")
                .fetch_all(&reader)
                .await
                .expect("reader sees the table");
            seen.extend(statuses);
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
        assert!(total > 250, "about 400 events expected, got {total}");
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
                 OR (status = 'dead' AND (attempts != 2 OR last_error IS NULL)) \
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
