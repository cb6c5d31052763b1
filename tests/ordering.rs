//! Ordering health and duplicate deliveries by phase (issue 14), against ground
//! truth on PostgreSQL and MariaDB: a seeded plan of several hundred ordering keys
//! whose versions arrive late, skip, repeat, complete out of order and get parked is
//! written in the order of its own timestamps; every ordering counter must equal what
//! the plan says, and every ordering and parked gauge a direct computation over the
//! table, once the agent has caught up and still a few polls later. A small
//! `ordering_keys_limit` is honoured with its evictions counted exactly, and an
//! evicted key starts afresh. Duplicate deliveries before and after completion are
//! counted by `phase`, exactly.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::checks::{Expectations, Tol};
use common::scenarios::{CONVERGE, inbox_gauge_expectations, inbox_source_toml, wait_for_live};
use common::{Agent, Db, Dialect, Metrics, READY_TIMEOUT, V, wait_until};

const VERSION_GAPS: &str = "inbox_version_gaps";
const GAP_AGE: &str = "inbox_oldest_version_gap_age_seconds";
const LATE_ARRIVALS: &str = "inbox_out_of_order_arrivals_total";
const LATE_COMPLETIONS: &str = "inbox_out_of_order_completions_total";
const PARKED: &str = "inbox_parked_messages";
const PARKED_KEYS: &str = "inbox_parked_keys";
const PARKED_AGE: &str = "inbox_oldest_parked_age_seconds";
const EVICTED: &str = "inboxwatch_ordering_keys_evicted_total";
const DUPLICATES: &str = "inbox_duplicate_deliveries_total";

/// Milliseconds between two steps of one key's history in the ground truth; keys
/// are spread within a step by their index (one millisecond each), so no two writes
/// share a time.
const STEP_MS: i64 = 400;
/// Steps between the versions below a missing one and those above it.
const GAP_PAUSE_STEPS: i64 = 10;
/// Writes of a plan per transaction.
const WRITES_PER_COMMIT: usize = 50;
/// Keys of the ground-truth plan.
const KEYS: usize = 360;

/// The contract's table plus the two ordering columns.
async fn ordered_table(db: &Db, short: &str) -> String {
    let t = db.fresh_tables(short).await.inbox;
    db.exec(
        &format!("ALTER TABLE {t} ADD COLUMN ordering_key VARCHAR(64), ADD COLUMN version BIGINT"),
        &[],
    )
    .await;
    t
}

/// An inbox source on `table` with the ordering columns mapped, `parked` as the
/// parked status word, and `extra` keys.
fn ordered_source(name: &str, db: &Db, table: &str, extra: &str) -> String {
    let toml = inbox_source_toml(name, &db.dsn, table).replace(
        "updated_at = \"updated_at\" }",
        "updated_at = \"updated_at\", ordering_key = \"ordering_key\", version = \"version\" }",
    );
    assert!(toml.contains("ordering_key"), "{toml}");
    format!("{toml}{extra}\n[sources.statuses]\nparked = [\"parked\"]\n")
}

/// The database's current time, for `updated_at`.
fn now_sql(d: Dialect) -> &'static str {
    match d {
        Dialect::Postgres => "clock_timestamp()",
        Dialect::Mysql => "UTC_TIMESTAMP(6)",
        Dialect::Sqlite => "strftime('%Y-%m-%d %H:%M:%f','now')",
    }
}

/// A time column as microseconds since the epoch, as text.
fn micros_sql(d: Dialect, col: &str) -> String {
    match d {
        Dialect::Postgres => {
            format!("CAST(CAST(EXTRACT(EPOCH FROM {col}) * 1000000 AS BIGINT) AS text)")
        }
        Dialect::Mysql => format!("CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', {col}) AS CHAR)"),
        Dialect::Sqlite => unreachable!("the ordering tests run on PostgreSQL and MariaDB"),
    }
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) % n
    }
}

/// One event of the plan.
#[derive(Clone, Debug)]
struct Event {
    id: String,
    key: usize,
    version: i64,
    /// `received_at`, milliseconds.
    received: i64,
    /// `finished_at` of a success, milliseconds.
    succeeded: Option<i64>,
    parked: bool,
}

/// A write of the plan, at its time.
#[derive(Clone, Copy, Debug)]
enum Write {
    Arrive(usize),
    Succeed(usize),
    Park(usize),
}

/// The plan: events, and the writes in time order.
struct Plan {
    events: Vec<Event>,
    writes: Vec<(i64, Write)>,
}

impl Plan {
    /// `keys` keys from `base` (ms), `step` ms between two writes of a key (more
    /// than `keys`); each key a short history of one of a few shapes.
    fn new(seed: u64, keys: usize, base: i64, step_ms: i64) -> Plan {
        assert!(step_ms > keys as i64, "keys are spread within a step");
        let mut rng = Rng(seed);
        let mut events: Vec<Event> = Vec::new();
        let mut writes = Vec::new();
        for key in 0..keys {
            let n = 2 + rng.below(4) as i64; // 2..=5 versions
            let shape = rng.below(10);
            let at = |step: i64| base + step * step_ms + key as i64;
            let mut step = 0;
            // The order versions arrive in.
            let mut arrivals: Vec<i64> = (1..=n).collect();
            let mut late: Option<i64> = None;
            let mut never: Option<i64> = None;
            match shape {
                // A version arrives after the next one.
                0 | 1 => {
                    let v = 1 + rng.below(n as u64 - 1) as usize;
                    arrivals.swap(v - 1, v);
                }
                // A version never arrives: the later ones wait (a gap).
                3 if n >= 3 => {
                    let m = 2 + rng.below(n as u64 - 2) as i64;
                    arrivals.retain(|v| *v != m);
                    never = Some(m);
                }
                // A version arrives after every later one: a jump, then the fill.
                4 if n >= 3 => {
                    let m = 2 + rng.below(n as u64 - 2) as i64;
                    arrivals.retain(|v| *v != m);
                    late = Some(m);
                }
                _ => {}
            }
            let mut index: BTreeMap<i64, usize> = BTreeMap::new();
            let arrive = |events: &mut Vec<Event>,
                          writes: &mut Vec<(i64, Write)>,
                          step: &mut i64,
                          v: i64,
                          suffix: &str| {
                let i = events.len();
                events.push(Event {
                    id: format!("k{key:03}-v{v}{suffix}"),
                    key,
                    version: v,
                    received: at(*step),
                    succeeded: None,
                    parked: false,
                });
                writes.push((at(*step), Write::Arrive(i)));
                *step += 1;
                i
            };
            // The versions above a missing one come well after those below it
            // (more than the gauges' 2 s tolerance), so that a gap's age is told
            // apart from the age of its key's first arrival.
            let mut paused = false;
            for v in &arrivals {
                if !paused && never.or(late).is_some_and(|m| *v > m) {
                    step += GAP_PAUSE_STEPS;
                    paused = true;
                }
                let i = arrive(&mut events, &mut writes, &mut step, *v, "");
                index.insert(*v, i);
            }
            if let Some(m) = late {
                let i = arrive(&mut events, &mut writes, &mut step, m, "");
                index.insert(m, i);
            }
            // A repeat under a new event id, after the others: of version 1 (out
            // of order), or of the highest version (not: none is higher).
            let repeat = match shape {
                5 => Some(1),
                9 => Some(n),
                _ => None,
            }
            .map(|v| arrive(&mut events, &mut writes, &mut step, v, "-again"));
            // What happens to each arrived version, in version order.
            let mut finish: Vec<usize> = Vec::new();
            let mut park: Vec<usize> = Vec::new();
            let parked_from = (shape == 6).then(|| 1 + rng.below(n as u64) as i64);
            for (v, i) in &index {
                if never.is_some_and(|m| *v > m) {
                    continue; // held back behind the missing version
                }
                if shape == 7 && *v == n {
                    continue; // still pending
                }
                if parked_from.is_some_and(|p| *v >= p) {
                    park.push(*i);
                } else {
                    finish.push(*i);
                }
            }
            // Two successes the other way round.
            if shape == 2 && finish.len() >= 2 {
                let j = rng.below(finish.len() as u64 - 1) as usize;
                finish.swap(j, j + 1);
            }
            finish.extend(repeat);
            for i in finish {
                events[i].succeeded = Some(at(step));
                writes.push((at(step), Write::Succeed(i)));
                step += 1;
            }
            for i in park {
                events[i].parked = true;
                writes.push((at(step), Write::Park(i)));
                step += 1;
            }
        }
        writes.sort_by_key(|(t, _)| *t);
        Plan { events, writes }
    }

    /// The last time the plan writes (ms).
    fn end(&self) -> i64 {
        self.writes.last().map_or(0, |(t, _)| *t)
    }

    /// Events that arrived after a higher version of their key had.
    fn late_arrivals(&self) -> usize {
        self.events
            .iter()
            .filter(|e| {
                self.events
                    .iter()
                    .any(|o| o.key == e.key && o.version > e.version && o.received < e.received)
            })
            .count()
    }

    /// Events that succeeded after a higher version of their key had.
    fn late_completions(&self) -> usize {
        self.events
            .iter()
            .filter_map(|e| e.succeeded.map(|f| (e, f)))
            .filter(|(e, f)| {
                self.events.iter().any(|o| {
                    o.key == e.key && o.version > e.version && o.succeeded.is_some_and(|g| g < *f)
                })
            })
            .count()
    }

    /// Writes the plan in time order, [`WRITES_PER_COMMIT`] writes per transaction
    /// (each commit on MariaDB waits for the disk).
    async fn write(&self, db: &Db, table: &str, ordered: bool) {
        let now = now_sql(db.dialect);
        let mut conn = db.pool.acquire().await;
        for (n, (t, w)) in self.writes.iter().enumerate() {
            if n % WRITES_PER_COMMIT == 0 {
                if n > 0 {
                    conn.raw("COMMIT").await.expect("COMMIT");
                }
                conn.raw("BEGIN").await.expect("BEGIN");
            }
            let ts = V::text(db.dialect.ts_text(*t));
            match *w {
                Write::Arrive(i) => {
                    let e = &self.events[i];
                    let (cols, vals) = if ordered {
                        (
                            ", ordering_key, version",
                            format!(", 'key-{:03}', {}", e.key, e.version),
                        )
                    } else {
                        ("", String::new())
                    };
                    let sql = db.sql(&format!(
                        "INSERT INTO {table} (event_id, event_type, status, received_at, \
                         attempts, deliveries, updated_at{cols}) VALUES ('{}', \
                         'account.changed', 'pending', {{ts}}, 0, 1, {now}{vals})",
                        e.id
                    ));
                    conn.execute(&sql, &[ts])
                        .await
                        .unwrap_or_else(|e| panic!("{sql}: {e}"));
                }
                Write::Succeed(i) => {
                    let sql = db.sql(&format!(
                        "UPDATE {table} SET status = 'succeeded', started_at = {{ts}}, \
                         finished_at = {{ts}}, attempts = 1, updated_at = {now} \
                         WHERE event_id = '{}'",
                        self.events[i].id
                    ));
                    conn.execute(&sql, &[ts.clone(), ts])
                        .await
                        .unwrap_or_else(|e| panic!("{sql}: {e}"));
                }
                Write::Park(i) => {
                    let sql = db.sql(&format!(
                        "UPDATE {table} SET status = 'parked', attempts = 3, \
                         last_error = 'TimeoutError: downstream', updated_at = {now} \
                         WHERE event_id = '{}'",
                        self.events[i].id
                    ));
                    conn.execute(&sql, &[])
                        .await
                        .unwrap_or_else(|e| panic!("{sql}: {e}"));
                }
            }
        }
        conn.raw("COMMIT").await.expect("COMMIT");
    }
}

/// Waits until the database clock has passed `ms`.
async fn wait_for_clock(db: &Db, ms: i64) {
    wait_until(Duration::from_secs(30), || async move {
        let now = db.now_ms().await;
        if now > ms {
            Ok(())
        } else {
            Err(format!("the clock is at {now}, waiting for {ms}"))
        }
    })
    .await
    .expect("the database clock moves");
}

/// The gauges of ordering and parking, straight from the table: keys whose
/// versions between the lowest and highest present are not all present, the age of
/// the earliest arrival above such a gap (±2 s), and the parked rows (count,
/// distinct keys, age of the oldest arrival).
async fn table_gauges(db: &Db, table: &str, source: &str) -> Expectations {
    let d = db.dialect;
    let rows = db
        .query(
            &format!(
                "SELECT ordering_key, CAST(version AS {{text}}), {}, {} FROM {table} \
                 WHERE ordering_key IS NOT NULL",
                micros_sql(d, "received_at"),
                micros_sql(d, now_sql(d))
            ),
            &[],
        )
        .await;
    let mut now = 0i64;
    let mut by_key: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for r in &rows {
        let key = r[0].clone().expect("a key");
        let num = |i: usize| -> i64 {
            r[i].as_deref()
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("a number in column {i}: {r:?}"))
        };
        now = now.max(num(3));
        by_key.entry(key).or_default().push((num(1), num(2)));
    }
    let mut gapped = 0;
    let mut oldest: Option<i64> = None;
    for versions in by_key.values() {
        let mut present: Vec<i64> = versions.iter().map(|(v, _)| *v).collect();
        present.sort();
        present.dedup();
        let Some(missing) = present
            .windows(2)
            .find(|w| w[1] > w[0] + 1)
            .map(|w| w[0] + 1)
        else {
            continue;
        };
        gapped += 1;
        let first = versions
            .iter()
            .filter(|(v, _)| *v > missing)
            .map(|(_, r)| *r)
            .min();
        oldest = oldest.min(first).or(first);
    }
    let age =
        |oldest: Option<i64>, now: i64| oldest.map_or(0.0, |o| ((now - o) as f64 / 1e6).max(0.0));
    let mut x = Expectations::default();
    let s = [("source", source)];
    x.push(VERSION_GAPS, &s, gapped as f64, Tol::Exact);
    x.push(GAP_AGE, &s, age(oldest, now), Tol::Abs(2.0));
    let parked = db
        .query(
            &format!(
                "SELECT CAST(COUNT(*) AS {{text}}), CAST(COUNT(DISTINCT ordering_key) AS {{text}}), \
                 {}, {} FROM {table} WHERE status = 'parked'",
                micros_sql(d, "MIN(received_at)"),
                micros_sql(d, now_sql(d))
            ),
            &[],
        )
        .await;
    let r = &parked[0];
    let num = |i: usize| r[i].as_deref().and_then(|s| s.parse::<i64>().ok());
    x.push(PARKED, &s, num(0).unwrap_or(0) as f64, Tol::Exact);
    x.push(PARKED_KEYS, &s, num(1).unwrap_or(0) as f64, Tol::Exact);
    x.push(
        PARKED_AGE,
        &s,
        age(num(2), num(3).expect("the clock")),
        Tol::Abs(2.0),
    );
    x
}

/// The plan's counters.
fn counters(plan: &Plan, source: &str, evicted: f64) -> Expectations {
    let mut x = Expectations::default();
    let s = [("source", source)];
    x.push(LATE_ARRIVALS, &s, plan.late_arrivals() as f64, Tol::Exact);
    x.push(
        LATE_COMPLETIONS,
        &s,
        plan.late_completions() as f64,
        Tol::Exact,
    );
    x.push(EVICTED, &s, evicted, Tol::Exact);
    x.push(
        "inbox_messages_received_total",
        &s,
        plan.events.len() as f64,
        Tol::Exact,
    );
    let succeeded = plan.events.iter().filter(|e| e.succeeded.is_some()).count();
    x.push(
        "inbox_messages_completed_total",
        &s,
        succeeded as f64,
        Tol::Exact,
    );
    x.push("inboxwatch_rows_rejected_total", &s, 0.0, Tol::Exact);
    x
}

/// The whole ordering ground truth on one database.
async fn ordering_matches_the_plan(db: Db) {
    let source = "orders";
    let t = ordered_table(&db, "ordering").await;
    let agent = Agent::start(&ordered_source(source, &db, &t, ""));
    agent.wait_ready(READY_TIMEOUT).await;
    let base = db.now_ms().await + 100;
    let plan = Plan::new(0x5eed_0f0d_e4ed, KEYS, base, STEP_MS);
    // Every time of the plan is in the past when written, so that ages are positive.
    wait_for_clock(&db, plan.end()).await;
    plan.write(&db, &t, true).await;

    // The plan reaches every shape it is meant to.
    let parked = plan.events.iter().filter(|e| e.parked).count();
    let pending = plan
        .events
        .iter()
        .filter(|e| e.succeeded.is_none() && !e.parked)
        .count();
    eprintln!(
        "{} events on {KEYS} keys: {} out-of-order arrivals, {} out-of-order completions, \
         {parked} parked, {pending} pending",
        plan.events.len(),
        plan.late_arrivals(),
        plan.late_completions()
    );
    assert!(plan.late_arrivals() >= 30 && plan.late_completions() >= 20);
    assert!(parked >= 20 && pending >= 20);

    let want = || async {
        let mut x = counters(&plan, source, 0.0);
        x.extend(table_gauges(&db, &t, source).await);
        x.extend(inbox_gauge_expectations(&db, &t, source).await);
        x
    };
    let m = wait_for_live(&agent, CONVERGE, "ordering after the plan", want).await;
    assert!(
        m.get(VERSION_GAPS, &[("source", source)]).unwrap_or(0.0) >= 10.0,
        "the plan leaves gaps"
    );
    // Still equal a few polls later.
    agent.wait_polls(source, 3, Duration::from_secs(2)).await;
    wait_for_live(
        &agent,
        Duration::from_secs(5),
        "ordering, 3 polls later",
        want,
    )
    .await;

    // The missing versions arrive: every gap closes, each a late arrival.
    let missing: Vec<(usize, i64)> = {
        let mut by_key: BTreeMap<usize, Vec<i64>> = BTreeMap::new();
        for e in &plan.events {
            by_key.entry(e.key).or_default().push(e.version);
        }
        by_key
            .iter()
            .flat_map(|(k, vs)| {
                let top = *vs.iter().max().expect("a version");
                (1..top)
                    .filter(|v| !vs.contains(v))
                    .map(|v| (*k, v))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    assert!(!missing.is_empty());
    let fill_at = db.now_ms().await;
    let mut filled = Plan {
        events: plan.events.clone(),
        writes: Vec::new(),
    };
    for (n, (key, version)) in missing.iter().enumerate() {
        let i = filled.events.len();
        let received = fill_at + n as i64;
        filled.events.push(Event {
            id: format!("k{key:03}-v{version}"),
            key: *key,
            version: *version,
            received,
            succeeded: None,
            parked: false,
        });
        filled.writes.push((received, Write::Arrive(i)));
    }
    wait_for_clock(&db, filled.end()).await;
    filled.write(&db, &t, true).await;
    assert!(filled.late_arrivals() >= plan.late_arrivals() + missing.len());
    let want = || async {
        let mut x = counters(&filled, source, 0.0);
        x.extend(table_gauges(&db, &t, source).await);
        x
    };
    let m = wait_for_live(&agent, CONVERGE, "ordering after the fill", want).await;
    assert_eq!(m.get(VERSION_GAPS, &[("source", source)]), Some(0.0));
    drop(agent);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordering_counters_and_gauges_match_the_plan_postgres() {
    ordering_matches_the_plan(Db::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordering_counters_and_gauges_match_the_plan_mariadb() {
    ordering_matches_the_plan(Db::mysql().await).await;
}

/// A scrape's value of `name` for `source`, summed, 0 when absent.
fn value(m: &Metrics, name: &str, source: &str) -> f64 {
    m.sum(name, &[("source", source)])
}

/// Guards `ordering_keys_limit`: 200 keys in groups of 20, each group written and
/// seen before the next, with a limit of 40: each group from the third on pushes out
/// the 20 keys of the group two before it (the least recently seen), 160 evictions
/// in all. A lower version of an evicted key then starts that key afresh (not out of
/// order, one more eviction); the same for a key still remembered is out of order.
async fn the_key_limit_is_honoured(db: Db) {
    let source = "limited";
    let t = ordered_table(&db, "keylimit").await;
    let agent = Agent::start(&ordered_source(source, &db, &t, "ordering_keys_limit = 40"));
    agent.wait_ready(READY_TIMEOUT).await;
    let mut received = 0.0;
    for group in 0..10 {
        let base = db.now_ms().await;
        let mut plan = Plan::new(7 + group, 20, base, 25);
        // This group's own keys.
        plan.events.iter_mut().for_each(|e| {
            e.id = format!("g{group}-{}", e.id);
            e.key += 20 * group as usize;
        });
        wait_for_clock(&db, plan.end()).await;
        plan.write(&db, &t, true).await;
        received += plan.events.len() as f64;
        let evicted = (20.0 * (group as f64 - 1.0)).max(0.0);
        let want = [
            ("inbox_messages_received_total", received),
            (EVICTED, evicted),
        ];
        wait_until(CONVERGE, || async {
            let m = agent.try_scrape().await?;
            let bad: Vec<String> = want
                .iter()
                .filter(|(n, v)| value(&m, n, source) != *v)
                .map(|(n, v)| format!("{n}: {} (want {v})", value(&m, n, source)))
                .collect();
            if bad.is_empty() {
                Ok(())
            } else {
                Err(bad.join("; "))
            }
        })
        .await
        .unwrap_or_else(|e| panic!("group {group}: {e}"));
    }
    let before = agent.scrape().await;
    let arrivals = value(&before, LATE_ARRIVALS, source);
    // Version 0 of key 0 (evicted long ago) and of key 199 (remembered).
    let now = now_sql(db.dialect);
    for (id, key) in [("old-key-0", 0), ("old-key-199", 199)] {
        let ts = V::text(db.dialect.ts_text(db.now_ms().await));
        db.exec(
            &format!(
                "INSERT INTO {t} (event_id, event_type, status, received_at, attempts, \
                 deliveries, updated_at, ordering_key, version) VALUES ('{id}', \
                 'account.changed', 'pending', {{ts}}, 0, 1, {now}, 'key-{key:03}', 0)"
            ),
            &[ts],
        )
        .await;
    }
    let want = [
        (EVICTED, 161.0),
        (LATE_ARRIVALS, arrivals + 1.0),
        ("inbox_messages_received_total", received + 2.0),
    ];
    let check = || async {
        let m = agent.try_scrape().await?;
        let bad: Vec<String> = want
            .iter()
            .filter(|(n, v)| value(&m, n, source) != *v)
            .map(|(n, v)| format!("{n}: {} (want {v})", value(&m, n, source)))
            .collect();
        if bad.is_empty() {
            Ok(())
        } else {
            Err(bad.join("; "))
        }
    };
    wait_until(CONVERGE, check)
        .await
        .unwrap_or_else(|e| panic!("after the lower versions: {e}"));
    agent.wait_polls(source, 3, Duration::from_secs(2)).await;
    check()
        .await
        .unwrap_or_else(|e| panic!("3 polls later: {e}"));
    drop(agent);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ordering_key_limit_evicts_the_least_recently_seen_postgres() {
    the_key_limit_is_honoured(Db::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ordering_key_limit_evicts_the_least_recently_seen_mariadb() {
    the_key_limit_is_honoured(Db::mysql().await).await;
}

/// Guards `phase` on duplicate deliveries: 30 events, some delivered again while
/// pending or processing (`in_flight`), some in the same write that completes them
/// (seen together with the completion: `in_flight`, as the agent cannot tell which
/// came first), and, once the agent has seen every event finished, some delivered
/// again after they succeeded or were dead-lettered (`after_completion`: the broker
/// never got the ack). Each phase is counted exactly, and the idempotency counters
/// that sum over phases still add up.
async fn duplicates_are_counted_by_phase(db: Db) {
    let source = "acks";
    let t = db.fresh_tables("phase").await.inbox;
    let agent = Agent::start(&inbox_source_toml(source, &db.dsn, &t));
    agent.wait_ready(READY_TIMEOUT).await;
    let now = now_sql(db.dialect);
    let n = 30usize;
    let (mut in_flight, mut after) = (0u32, 0u32);
    let upd = |set: String, i: usize| {
        format!("UPDATE {t} SET {set}, updated_at = {now} WHERE event_id = 'a{i:02}'")
    };
    for i in 0..n {
        db.exec(
            &format!(
                "INSERT INTO {t} (event_id, event_type, status, received_at, attempts, \
                 deliveries, updated_at) VALUES ('a{i:02}', 'payment.captured', 'pending', \
                 {now}, 0, 1, {now})"
            ),
            &[],
        )
        .await;
    }
    for i in 0..n {
        // Delivered again while waiting, and twice more while being processed.
        if i % 3 == 1 {
            db.exec(&upd("deliveries = deliveries + 1".into(), i), &[])
                .await;
            in_flight += 1;
        }
        db.exec(
            &upd(
                format!("status = 'processing', attempts = 1, started_at = {now}"),
                i,
            ),
            &[],
        )
        .await;
        if i % 3 == 2 {
            db.exec(&upd("deliveries = deliveries + 2".into(), i), &[])
                .await;
            in_flight += 2;
        }
        // Delivered again in the write that completes it.
        let with = if i % 4 == 0 {
            in_flight += 1;
            ", deliveries = deliveries + 1"
        } else {
            ""
        };
        let status = if i % 6 == 5 { "dead" } else { "succeeded" };
        db.exec(
            &upd(format!("status = '{status}', finished_at = {now}{with}"), i),
            &[],
        )
        .await;
    }
    let s = [("source", source)];
    let phase = |p: &'static str| [("source", source), ("phase", p)];
    let mut x = Expectations::default();
    x.push("inbox_messages_completed_total", &s, n as f64, Tol::Exact);
    x.push(
        DUPLICATES,
        &phase("in_flight"),
        f64::from(in_flight),
        Tol::Exact,
    );
    x.push(DUPLICATES, &phase("after_completion"), 0.0, Tol::Exact);
    common::scenarios::wait_for_expectations(&agent, &x, CONVERGE, "in flight").await;

    // Every event is finished and seen so: the acks were lost for some.
    for i in 0..n {
        if i % 2 == 0 {
            db.exec(&upd("deliveries = deliveries + 1".into(), i), &[])
                .await;
            after += 1;
        }
        if i % 5 == 0 {
            db.exec(&upd("deliveries = deliveries + 2".into(), i), &[])
                .await;
            after += 2;
        }
    }
    let mut x = Expectations::default();
    x.push("inbox_messages_received_total", &s, n as f64, Tol::Exact);
    x.push("inbox_messages_completed_total", &s, n as f64, Tol::Exact);
    x.push(
        DUPLICATES,
        &phase("in_flight"),
        f64::from(in_flight),
        Tol::Exact,
    );
    x.push(
        DUPLICATES,
        &phase("after_completion"),
        f64::from(after),
        Tol::Exact,
    );
    x.push(DUPLICATES, &s, f64::from(in_flight + after), Tol::Exact);
    x.push(
        "inbox_deliveries_total",
        &s,
        (n as u32 + in_flight + after).into(),
        Tol::Exact,
    );
    x.close(DUPLICATES, &s);
    common::scenarios::wait_for_expectations(&agent, &x, CONVERGE, "after completion").await;
    agent.wait_polls(source, 3, Duration::from_secs(2)).await;
    common::scenarios::wait_for_expectations(&agent, &x, Duration::from_secs(5), "3 polls later")
        .await;
    // Every series of the counter carries a phase, and only the two.
    let m = agent.scrape().await;
    for sample in m.series(DUPLICATES, &s) {
        let p = sample.labels.get("phase").map(String::as_str);
        assert!(
            matches!(p, Some("in_flight" | "after_completion")),
            "{}",
            sample.series()
        );
    }
    drop(agent);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_are_counted_by_phase_postgres() {
    duplicates_are_counted_by_phase(Db::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_are_counted_by_phase_mariadb() {
    duplicates_are_counted_by_phase(Db::mysql().await).await;
}
