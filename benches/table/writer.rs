//! A consumer simulation that changes the inbox at a steady rate and keeps the
//! ground truth of what inboxwatch must count: new events, starts, retries
//! after failures, completions with known processing times, dead letters and
//! duplicate deliveries (also after completion).

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::{AnyConnection, Connection};

use crate::load::{EVENT_TYPES, TABLE};
use crate::{Dialect, exec};

/// What inboxwatch must have counted for one event type.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    pub received: u64,
    pub deliveries: u64,
    pub duplicates: u64,
    pub succeeded: u64,
    pub dead: u64,
    pub failures: u64,
    /// Processing times (seconds) of every completion.
    pub durations: Vec<f64>,
}

/// Ground truth by event type, and the number of row changes written.
#[derive(Debug, Default)]
pub struct Truth {
    pub by_type: BTreeMap<String, Counts>,
    pub changes: u64,
}

pub type Shared = Arc<Mutex<Truth>>;

struct Event {
    id: String,
    et: usize,
    attempts: u32,
    due: u64,
}

/// Ticks per second of the writer; each tick is one transaction.
const TICKS: u64 = 20;

fn pick_type() -> usize {
    let mut r = fastrand::u32(0..100);
    for (i, (_, w)) in EVENT_TYPES.iter().enumerate() {
        if r < *w {
            return i;
        }
        r -= w;
    }
    0
}

/// A processing time in microseconds: log-normal around 80 ms, slower for
/// some types, with a heavy tail.
fn duration_us(et: usize) -> i64 {
    let (u1, u2) = (fastrand::f64().max(1e-12), fastrand::f64());
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    let scale = [1.0, 2.5, 1.5, 0.7, 3.0, 0.5][et % 6];
    let us = (80_000.0 * scale * (0.9 * z).exp()).clamp(1_000.0, 60_000_000.0);
    us.round() as i64
}

fn list(ids: &[&str]) -> String {
    let quoted: Vec<String> = ids.iter().map(|i| format!("'{i}'")).collect();
    format!("({})", quoted.join(", "))
}

/// Writes `rate` row changes per second for `seconds`, recording the truth;
/// its new events are numbered after `first_id`.
pub async fn run(
    mut conn: AnyConnection,
    dialect: Dialect,
    rate: u64,
    (seconds, first_id): (u64, u64),
    truth: Shared,
) -> (u64, Duration) {
    let now = match dialect {
        Dialect::Postgres => "now()",
        Dialect::MySql => "UTC_TIMESTAMP(6)",
    };
    let mut pending: VecDeque<Event> = VecDeque::new();
    let mut processing: VecDeque<Event> = VecDeque::new();
    let mut failed: VecDeque<Event> = VecDeque::new();
    let mut done: VecDeque<(String, usize)> = VecDeque::new();
    let mut next_id = first_id;
    let mut changes = 0u64;
    let start = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_millis(1000 / TICKS));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tick = 0u64;
    while start.elapsed() < Duration::from_secs(seconds) {
        ticker.tick().await;
        tick += 1;
        let owed = (rate as f64 * start.elapsed().as_secs_f64()) as u64;
        let mut budget = owed.saturating_sub(changes).min(rate / 2);
        let mut local: BTreeMap<usize, Counts> = BTreeMap::new();
        let take = |q: &mut VecDeque<Event>, budget: &mut u64| {
            let mut out = Vec::new();
            while *budget > 0 && q.front().is_some_and(|e| e.due <= tick) {
                out.push(q.pop_front().expect("front exists"));
                *budget -= 1;
            }
            out
        };
        let finishing = take(&mut processing, &mut budget);
        let retrying = take(&mut failed, &mut budget);
        let starting = take(&mut pending, &mut budget);
        let mut stmts = Vec::new();

        // Completions and failures of the attempts that were running.
        let (mut complete, mut fail) = (Vec::new(), Vec::new());
        for e in finishing {
            let r = fastrand::f64();
            if r < 0.005 || (r < 0.07 && e.attempts >= 4) {
                complete.push((e, "dead"));
            } else if r < 0.07 {
                fail.push(e);
            } else {
                complete.push((e, "succeeded"));
            }
        }
        if !complete.is_empty() {
            let rows: Vec<(String, &str, i64)> = complete
                .iter()
                .map(|(e, s)| (e.id.clone(), *s, duration_us(e.et)))
                .collect();
            stmts.push(match dialect {
                Dialect::Postgres => {
                    let values: Vec<String> = rows
                        .iter()
                        .map(|(id, s, d)| format!("('{id}', '{s}', {d})"))
                        .collect();
                    format!(
                        "UPDATE {TABLE} AS x SET status = v.s, started_at = now() - v.d * interval '1 microsecond', \
                         finished_at = now(), updated_at = now(), \
                         last_error = CASE WHEN v.s = 'dead' THEN 'ValidationError: poison message' ELSE x.last_error END \
                         FROM (VALUES {}) AS v(id, s, d) WHERE x.event_id = v.id",
                        values.join(", ")
                    )
                }
                Dialect::MySql => {
                    let values: Vec<String> = rows
                        .iter()
                        .map(|(id, s, d)| format!("SELECT '{id}' AS id, '{s}' AS s, {d} AS d"))
                        .collect();
                    format!(
                        "UPDATE {TABLE} x JOIN ({}) v ON x.event_id = v.id SET x.status = v.s, \
                         x.started_at = TIMESTAMPADD(MICROSECOND, -v.d, UTC_TIMESTAMP(6)), \
                         x.finished_at = UTC_TIMESTAMP(6), x.updated_at = UTC_TIMESTAMP(6), \
                         x.last_error = CASE WHEN v.s = 'dead' THEN 'ValidationError: poison message' ELSE x.last_error END",
                        values.join(" UNION ALL ")
                    )
                }
            });
            for ((e, s), (_, _, d)) in complete.into_iter().zip(&rows) {
                let c = local.entry(e.et).or_default();
                if s == "dead" {
                    c.dead += 1;
                } else {
                    c.succeeded += 1;
                }
                c.durations.push(*d as f64 / 1e6);
                done.push_back((e.id, e.et));
            }
            while done.len() > 5_000 {
                done.pop_front();
            }
        }
        if !fail.is_empty() {
            let ids: Vec<&str> = fail.iter().map(|e| e.id.as_str()).collect();
            stmts.push(format!(
                "UPDATE {TABLE} SET status = 'failed', last_error = 'TimeoutError: upstream did not answer', \
                 updated_at = {now} WHERE event_id IN {}",
                list(&ids)
            ));
            for mut e in fail {
                local.entry(e.et).or_default().failures += 1;
                e.due = tick + TICKS / 2;
                failed.push_back(e);
            }
        }
        // New attempts: first starts and retries.
        let mut attempts: Vec<Event> = starting.into_iter().chain(retrying).collect();
        if !attempts.is_empty() {
            let ids: Vec<&str> = attempts.iter().map(|e| e.id.as_str()).collect();
            stmts.push(format!(
                "UPDATE {TABLE} SET status = 'processing', started_at = {now}, attempts = attempts + 1, \
                 updated_at = {now} WHERE event_id IN {}",
                list(&ids)
            ));
            for e in attempts.iter_mut() {
                e.attempts += 1;
                e.due = tick + 2 + fastrand::u64(0..4);
            }
            processing.extend(attempts);
        }
        // Duplicate deliveries of events already completed: about 3 % of the
        // new events (what is left of the budget).
        let dups = ((budget as f64) * 0.03 + fastrand::f64() - 0.5)
            .round()
            .max(0.0) as u64;
        let mut chosen = HashSet::new();
        if !done.is_empty() {
            for _ in 0..dups {
                chosen.insert(fastrand::usize(0..done.len()));
            }
        }
        if !chosen.is_empty() {
            budget -= chosen.len() as u64;
            let ids: Vec<&str> = chosen.iter().map(|i| done[*i].0.as_str()).collect();
            stmts.push(format!(
                "UPDATE {TABLE} SET deliveries = deliveries + 1, updated_at = {now} WHERE event_id IN {}",
                list(&ids)
            ));
            for i in &chosen {
                let c = local.entry(done[*i].1).or_default();
                c.duplicates += 1;
                c.deliveries += 1;
            }
        }
        // New events with what is left.
        if budget > 0 {
            let mut values = Vec::new();
            for _ in 0..budget {
                next_id += 1;
                let et = pick_type();
                let id = format!("w-{next_id}");
                values.push(format!(
                    "('{id}', '{}', 'pending', {now}, 0, 1, {now})",
                    EVENT_TYPES[et].0
                ));
                let c = local.entry(et).or_default();
                c.received += 1;
                c.deliveries += 1;
                pending.push_back(Event {
                    id,
                    et,
                    attempts: 0,
                    due: tick + 2,
                });
            }
            stmts.push(format!(
                "INSERT INTO {TABLE} (event_id, event_type, status, received_at, attempts, deliveries, updated_at) VALUES {}",
                values.join(", ")
            ));
        }
        let mut tx = conn.begin().await.expect("writer: BEGIN");
        let mut n = 0;
        for s in &stmts {
            n += sqlx::raw_sql(sqlx::AssertSqlSafe(s.clone()))
                .execute(&mut *tx)
                .await
                .unwrap_or_else(|e| panic!("writer: {e}\n{s}"))
                .rows_affected();
        }
        tx.commit().await.expect("writer: COMMIT");
        changes += n;
        let mut t = truth.lock().expect("truth lock");
        t.changes += n;
        for (et, c) in local {
            let e = t.by_type.entry(EVENT_TYPES[et].0.to_string()).or_default();
            e.received += c.received;
            e.deliveries += c.deliveries;
            e.duplicates += c.duplicates;
            e.succeeded += c.succeeded;
            e.dead += c.dead;
            e.failures += c.failures;
            e.durations.extend(c.durations);
        }
    }
    (changes, start.elapsed())
}

/// The probe's event type: one row at a time, to time freshness.
pub const PROBE_TYPE: &str = "bench.probe";

/// Inserts probe `k` (pending) and returns when it committed.
pub async fn probe_insert(conn: &mut AnyConnection, dialect: Dialect, k: u64, truth: &Shared) {
    let now = dialect.now();
    exec(
        conn,
        &format!(
            "INSERT INTO {TABLE} (event_id, event_type, status, received_at, attempts, deliveries, updated_at) \
             VALUES ('probe-{k}', '{PROBE_TYPE}', 'pending', {now}, 0, 1, {now})"
        ),
    )
    .await;
    let mut t = truth.lock().expect("truth lock");
    let c = t.by_type.entry(PROBE_TYPE.to_string()).or_default();
    c.received += 1;
    c.deliveries += 1;
}

/// Completes probe `k` after 50 ms of processing.
pub async fn probe_complete(conn: &mut AnyConnection, dialect: Dialect, k: u64, truth: &Shared) {
    let sql = match dialect {
        Dialect::Postgres => format!(
            "UPDATE {TABLE} SET status = 'succeeded', attempts = 1, started_at = now() - interval '50 milliseconds', \
             finished_at = now(), updated_at = now() WHERE event_id = 'probe-{k}'"
        ),
        Dialect::MySql => format!(
            "UPDATE {TABLE} SET status = 'succeeded', attempts = 1, started_at = TIMESTAMPADD(MICROSECOND, -50000, UTC_TIMESTAMP(6)), \
             finished_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6) WHERE event_id = 'probe-{k}'"
        ),
    };
    exec(conn, &sql).await;
    let mut t = truth.lock().expect("truth lock");
    let c = t.by_type.entry(PROBE_TYPE.to_string()).or_default();
    c.succeeded += 1;
    c.durations.push(0.05);
}
