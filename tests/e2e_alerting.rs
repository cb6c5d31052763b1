//! End to end, for real (SPEC §5): the `inboxwatch` agent on a PostgreSQL inbox table,
//! scraped every second by a real Prometheus that evaluates the repository's rule
//! files (`alerts/*.yml`, as they are) and notifies a real Alertmanager running the
//! repository's routing (`config/alertmanager.yml`, its receiver URLs pointed at a
//! webhook receiver inside this test).
//!
//! 1. A healthy phase: steady events completing, a few retries and duplicate
//!    deliveries, two single dead letters. Nothing may page (`/oncall`), and at its end
//!    no critical alert may even be pending in Prometheus.
//! 2. A burst: [`BURST_EVENTS`] events dead-lettered within a minute.
//!    `InboxDeadLetterSpike{source="e2e-orders"}` has to reach `/oncall`, firing,
//!    within [`SPIKE_TIMEOUT`] of the burst's start; nothing else may page.
//! 3. Every dashboard query (`dashboards/*.json`, each target's `expr`, Grafana
//!    variables substituted, `$source` each of the three sources in turn) answers
//!    `success` with at least one sample for one of them, except the ones listed in
//!    [`NO_DATA_EXPECTED`] with the reason. Beside the inbox, an outbox table with
//!    its own workload and a Kafka cluster (tansu) with a lagging group, a
//!    dead-letter topic and a retry topic give the outbox and Kafka panels data,
//!    and ordering columns on the inbox (each event its own key) the ordering ones.
//! 4. Every rule Prometheus loaded evaluated without an error.
//!
//! Beside them, from the start: [`REPLAYED`] dead letters from before the agent
//! started are replayed with `inboxwatch dead-letters replay` and
//! [`DEAD_AGAIN`] of them die again (the others succeed);
//! `InboxReplayFailingAgain{source="e2e-orders"}` has to fire in Prometheus by the
//! end, with [`REPLAYED`] replays and [`DEAD_AGAIN`] events failed again counted.
//!
//! Needs `/usr/bin/prometheus` and `/usr/bin/prometheus-alertmanager` (Debian packages
//! `prometheus prometheus-alertmanager`). Takes about three and a half minutes; run
//! with `cargo nextest run --test e2e_alerting --no-capture` to see the timeline.

use crate::common;
use crate::kafka_support;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::grafana;
use common::stack::{
    Alertmanager, PromAlert, Prometheus, START_TIMEOUT, Webhook, prometheus_yml, render_alerts,
    rule_file_paths, secs,
};
use common::workload::{Clock, EVENT_TYPES, InboxEvent, OutboxWorkload, Status, Target};
use common::{Agent, Db, Pool, READY_TIMEOUT, repo_read, toml_str, wait_until};

/// The source under test (the `source` label, and `$source` in the dashboards).
const SOURCE: &str = "e2e-orders";
/// The outbox source beside it, for the outbox panels.
const OUTBOX_SOURCE: &str = "e2e-outbox";
/// The Kafka source (its `cluster` label), for the Kafka panels.
const KAFKA_SOURCE: &str = "e2e-kafka";
/// What `$source` stands for in turn: a query passes when one of them gives it data.
/// The queue source (Redis Streams), for the Queues panels.
const QUEUE_SOURCE: &str = "e2e-queue";
const SOURCES: [&str; 4] = [SOURCE, OUTBOX_SOURCE, KAFKA_SOURCE, QUEUE_SOURCE];
/// The Kafka topics: a consumed topic, its dead-letter and its retry topic.
const KAFKA_TOPIC: &str = "e2e.orders";
const KAFKA_DLQ: &str = "e2e.orders.DLQ";
const KAFKA_RETRY: &str = "e2e.orders.retry.10s";
/// Dead letters from before the agent's start that are replayed, and how many
/// of them die again.
const REPLAYED: usize = 10;
const DEAD_AGAIN: usize = 6;
/// The replay alert.
const REPLAY_ALERT: &str = "InboxReplayFailingAgain";
/// The dead-letter audit table of the inbox source.
const AUDIT_TABLE: &str = "e2e_dead_letter_actions";
/// Steady, healthy traffic before the burst.
const HEALTHY_PHASE: Duration = Duration::from_secs(75);
/// One new healthy event every this many milliseconds (for the whole test).
const HEALTHY_EVERY_MS: i64 = 200;
/// Dead letters in the burst, one every [`BURST_EVERY_MS`] (45 s in all, 0.6/s over
/// 5 minutes, six times the 0.1/s floor).
const BURST_EVENTS: usize = 180;
const BURST_EVERY_MS: i64 = 250;
/// Event types of the burst; each already has one dead letter from the healthy
/// phase, so their `outcome="dead_lettered"` series exist before the burst and
/// `rate()` sees the whole burst (a series born with a non-zero value loses it).
const BURST_TYPES: [&str; 2] = ["order.paid", "payment.refunded"];
/// From the burst's first dead letter to the page at `/oncall`.
const SPIKE_TIMEOUT: Duration = Duration::from_secs(180);
/// The routing under test.
const ALERTMANAGER_CONFIG: &str = "config/alertmanager.yml";
/// The receiver prefix in config/alertmanager.yml that the test replaces.
const WEBHOOK_PREFIX: &str = "http://alert-bridge.monitoring.svc:9095";
/// The dead-letter spike, the one alert that has to page here.
const SPIKE: &str = "InboxDeadLetterSpike";

/// Dashboard queries allowed to return no sample in this scenario: (a substring of
/// the expression, why it has no data here). They still have to evaluate.
const NO_DATA_EXPECTED: &[(&str, &str)] = &[
    (
        "queue_redeliveries_total",
        "only RabbitMQ counts redeliveries per queue; the queue source here is Redis Streams",
    ),
    (
        "inboxwatch_spans_",
        "no OTLP exporter is configured, so no span counters",
    ),
    (
        "inboxwatch_rows_rejected_total",
        "the workload writes no unusable rows, so the counter has no series",
    ),
    (
        "inbox_permanent_error_retries_total",
        "the consumer retries only timeouts (a retryable class): no retry on a permanent error, so no series",
    ),
    (
        "inboxwatch_poll_errors_total",
        "no poll fails in this scenario, so the counter has no series",
    ),
];

/// Grafana variables and what they stand for here (`$source`: each of [`SOURCES`]).
const DASHBOARD_VARS: &[(&str, &str)] = &[
    ("__rate_interval", "1m"),
    ("__interval", "15s"),
    ("event_type", ".*"),
    ("cluster", KAFKA_SOURCE),
    ("group", ".*"),
    ("topic", ".*"),
    ("broker", ".*"),
    ("queue", ".*"),
    ("consumer", ".*"),
];

// ---------------------------------------------------------------------------------
// The consumer simulation writing the inbox table
// ---------------------------------------------------------------------------------

/// A task aborted when the test ends early (a panic), so that it stops writing before
/// the table is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Shared between the test and the writer task.
#[derive(Default)]
struct Control {
    stop: AtomicBool,
    /// Burst dead letters still to create.
    burst_left: AtomicUsize,
    created: AtomicUsize,
    succeeded: AtomicUsize,
    dead: AtomicUsize,
    burst_dead: AtomicUsize,
    failed_attempts: AtomicUsize,
    duplicates: AtomicUsize,
    first_burst_dead: Mutex<Option<Instant>>,
    last_burst_dead: Mutex<Option<Instant>>,
    error: Mutex<Option<String>>,
}

impl Control {
    fn error(&self) -> Option<String> {
        self.error.lock().expect("control lock").clone()
    }
    fn summary(&self) -> String {
        let g = |a: &AtomicUsize| a.load(Ordering::Relaxed);
        format!(
            "{} events created, {} succeeded, {} dead-lettered ({} of them in the burst), \
             {} failed attempts retried, {} duplicate deliveries",
            g(&self.created),
            g(&self.succeeded),
            g(&self.dead),
            g(&self.burst_dead),
            g(&self.failed_attempts),
            g(&self.duplicates)
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// An attempt starts and takes this many milliseconds.
    Process(i64),
    Fail,
    Requeue,
    Succeed,
    Dead,
    Dup,
}

struct Slot {
    ev: InboxEvent,
    plan: VecDeque<Step>,
    ready_at: i64,
    burst: bool,
}

fn processing_ms(rng: &mut fastrand::Rng) -> i64 {
    // Log-normal around 120 ms (P95 about 450 ms, far under the 2 s objective).
    let u1 = rng.f64().max(1e-12);
    let u2 = rng.f64();
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    ((120.0 * (0.8 * z).exp()) as i64).clamp(5, 1500)
}

/// A healthy event: mostly one attempt, some retried once or twice, a few
/// duplicate deliveries; always succeeds.
fn healthy_plan(rng: &mut fastrand::Rng) -> VecDeque<Step> {
    let attempts = match rng.f64() {
        x if x < 0.88 => 1,
        x if x < 0.97 => 2,
        _ => 3,
    };
    let mut plan = Vec::new();
    for a in 1..=attempts {
        plan.push(Step::Process(processing_ms(rng)));
        if a < attempts {
            plan.push(Step::Fail);
            plan.push(Step::Requeue);
        }
    }
    plan.push(Step::Succeed);
    match rng.f64() {
        // Delivered again while in flight.
        x if x < 0.02 => {
            let at = rng.usize(0..plan.len());
            plan.insert(at, Step::Dup);
        }
        // Delivered again seconds after it succeeded (the acknowledgement was
        // lost): the agent has seen it finished, so the delivery counts as
        // `phase="after_completion"` (about 17 over the test: the ack-failure panels).
        x if x < 0.04 => plan.push(Step::Dup),
        _ => {}
    }
    plan.into()
}

/// A dead letter of the healthy phase: failed twice, then parked.
fn single_dead_letter_plan(rng: &mut fastrand::Rng) -> VecDeque<Step> {
    VecDeque::from([
        Step::Process(processing_ms(rng)),
        Step::Fail,
        Step::Requeue,
        Step::Process(processing_ms(rng)),
        Step::Dead,
    ])
}

/// A burst event: poison, dead-lettered on its first attempt.
fn burst_plan(rng: &mut fastrand::Rng) -> VecDeque<Step> {
    VecDeque::from([Step::Process(processing_ms(rng)), Step::Dead])
}

struct Writer {
    pool: Pool,
    table: String,
    clock: Clock,
    ctl: Arc<Control>,
    rng: fastrand::Rng,
    slots: Vec<Slot>,
}

impl Writer {
    async fn exec(&self, (sql, args): (String, Vec<common::V>)) -> Result<(), String> {
        self.pool
            .execute(&sql, &args)
            .await
            .map(drop)
            .map_err(|e| format!("workload statement failed: {sql}: {e}"))
    }

    async fn create(
        &mut self,
        kind: &str,
        event_type: &str,
        plan: VecDeque<Step>,
        burst: bool,
    ) -> Result<(), String> {
        let t = self.clock.now();
        let n = self.ctl.created.fetch_add(1, Ordering::Relaxed);
        let ev = InboxEvent::pending(
            format!("e2e-{kind}-{n:06}-{:06x}", self.rng.u32(..0x00ff_ffff)),
            Some(event_type.to_string()),
            t,
        );
        self.exec(ev.insert_stmt(common::Dialect::Postgres, &self.table))
            .await?;
        let ready_at = t + self.rng.i64(10..60);
        self.slots.push(Slot {
            ev,
            plan,
            ready_at,
            burst,
        });
        Ok(())
    }

    /// Applies the next step of `slots[i]` and writes the row.
    async fn step(&mut self, i: usize) -> Result<(), String> {
        let t = self.clock.now().max(self.slots[i].ev.updated_ms + 1);
        let rng = &mut self.rng;
        let slot = &mut self.slots[i];
        let step = slot
            .plan
            .pop_front()
            .expect("only slots with steps are stepped");
        let ev = &mut slot.ev;
        ev.updated_ms = t;
        let wait = match step {
            Step::Process(ms) => {
                ev.status = Status::Processing;
                ev.attempts += 1;
                ev.started_ms = Some(t);
                ev.finished_ms = None;
                ms
            }
            Step::Fail => {
                ev.status = Status::Failed;
                ev.last_error = Some("TimeoutError: upstream did not answer within 5s".into());
                self.ctl.failed_attempts.fetch_add(1, Ordering::Relaxed);
                rng.i64(50..300)
            }
            Step::Requeue => {
                ev.status = Status::Pending;
                rng.i64(20..100)
            }
            Step::Succeed => {
                ev.status = Status::Succeeded;
                ev.finished_ms = Some(t);
                self.ctl.succeeded.fetch_add(1, Ordering::Relaxed);
                if slot.plan.front() == Some(&Step::Dup) {
                    // Redelivered after the agent's next polls (every second).
                    rng.i64(2_500..4_000)
                } else {
                    rng.i64(20..200)
                }
            }
            Step::Dead => {
                ev.status = Status::Dead;
                ev.finished_ms = Some(t);
                ev.last_error = Some("ValidationError: payload does not match schema v3".into());
                self.ctl.dead.fetch_add(1, Ordering::Relaxed);
                if slot.burst {
                    let now = Instant::now();
                    self.ctl.burst_dead.fetch_add(1, Ordering::Relaxed);
                    self.ctl
                        .first_burst_dead
                        .lock()
                        .expect("control lock")
                        .get_or_insert(now);
                    *self.ctl.last_burst_dead.lock().expect("control lock") = Some(now);
                }
                rng.i64(20..200)
            }
            Step::Dup => {
                ev.deliveries += 1;
                self.ctl.duplicates.fetch_add(1, Ordering::Relaxed);
                rng.i64(10..100)
            }
        };
        slot.ready_at = t + wait;
        let stmt = slot.ev.update_stmt(common::Dialect::Postgres, &self.table);
        self.exec(stmt).await
    }

    /// Healthy traffic until `stop`, burst events while `burst_left > 0`; on `stop`,
    /// finishes the events in flight (so no row is left unfinished) and returns.
    async fn run(mut self) -> Result<(), String> {
        let start = self.clock.now();
        // The healthy phase's two dead letters, one per burst event type.
        let mut single_dead: VecDeque<(i64, &str)> = BURST_TYPES
            .iter()
            .enumerate()
            .map(|(i, t)| (start + 3_000 + 4_000 * i as i64, *t))
            .collect();
        let mut next_healthy = start;
        let mut next_burst: Option<i64> = None;
        loop {
            let now = self.clock.now();
            let stopping = self.ctl.stop.load(Ordering::Relaxed);
            if !stopping && now >= next_healthy {
                let t = EVENT_TYPES[self.rng.usize(..EVENT_TYPES.len())];
                let plan = healthy_plan(&mut self.rng);
                self.create("ok", t, plan, false).await?;
                next_healthy += HEALTHY_EVERY_MS;
                continue;
            }
            if !stopping && single_dead.front().is_some_and(|(at, _)| now >= *at) {
                let (_, t) = single_dead.pop_front().expect("checked");
                let plan = single_dead_letter_plan(&mut self.rng);
                self.create("dl", t, plan, false).await?;
                continue;
            }
            if self.ctl.burst_left.load(Ordering::Relaxed) > 0 {
                let due = *next_burst.get_or_insert(now);
                if now >= due {
                    self.ctl.burst_left.fetch_sub(1, Ordering::Relaxed);
                    let n = self.rng.usize(..BURST_TYPES.len());
                    let plan = burst_plan(&mut self.rng);
                    self.create("burst", BURST_TYPES[n], plan, true).await?;
                    next_burst = Some(due + BURST_EVERY_MS);
                    continue;
                }
            }
            // The most overdue step.
            let ready = (0..self.slots.len())
                .filter(|&i| !self.slots[i].plan.is_empty() && self.slots[i].ready_at <= now)
                .min_by_key(|&i| self.slots[i].ready_at);
            if let Some(i) = ready {
                self.step(i).await?;
                continue;
            }
            self.slots.retain(|s| !s.plan.is_empty());
            if stopping && self.slots.is_empty() {
                return Ok(());
            }
            let mut wake = self
                .slots
                .iter()
                .map(|s| s.ready_at)
                .min()
                .unwrap_or(i64::MAX);
            if !stopping {
                wake = wake.min(next_healthy);
            }
            if let Some(b) = next_burst.filter(|_| self.ctl.burst_left.load(Ordering::Relaxed) > 0)
            {
                wake = wake.min(b);
            }
            let wait = (wake - now).clamp(1, 20) as u64;
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
    }
}

// ---------------------------------------------------------------------------------
// Dashboards
// ---------------------------------------------------------------------------------

/// What a Grafana variable stands for here ([`DASHBOARD_VARS`], `$source` as
/// given); an unknown one is an error.
fn substitute(expr: &str, source: &str) -> Result<String, String> {
    grafana::substitute(expr, |name| {
        if name == "source" {
            return Ok(source.to_string());
        }
        DASHBOARD_VARS
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
            .ok_or_else(|| format!("unknown Grafana variable {name:?}"))
    })
}

/// Evaluates a variable's `label_values([selector, ]label)` through the label values
/// API: the values it offers.
async fn variable_values(
    prom: &Prometheus,
    query: &str,
    source: &str,
) -> Result<Vec<String>, String> {
    let inner = query
        .trim()
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .ok_or_else(|| format!("not a label_values(...) query: {query:?}"))?;
    let (selector, label) = match inner.rsplit_once(',') {
        Some((s, l)) => (Some(substitute(s.trim(), source)?), l.trim()),
        None => (None, inner.trim()),
    };
    prom.label_values(label, selector.as_deref()).await
}

// ---------------------------------------------------------------------------------
// Configuration files
// ---------------------------------------------------------------------------------

fn alertmanager_yml(webhook_port: u16) -> String {
    let text = repo_read(ALERTMANAGER_CONFIG);
    assert!(
        text.contains(WEBHOOK_PREFIX),
        "{ALERTMANAGER_CONFIG} does not contain the receiver prefix {WEBHOOK_PREFIX} that the \
         test points at its webhook receiver"
    );
    text.replace(WEBHOOK_PREFIX, &format!("http://127.0.0.1:{webhook_port}"))
}

/// The inbox's ordering columns: each event is its own key (a copy of its id),
/// at version 1 (columns [`ORDERING_DDL`] adds), and the word `parked`, which the
/// consumer never writes. Every ordering series then exists, at 0, for the
/// ordering panels.
const ORDERING_COLUMNS: &str = ", ordering_key = \"aggregate_id\", version = \"aggregate_version\" }\n\
     statuses = { parked = [\"parked\"] }\n";
/// Adds the ordering columns of [`ORDERING_COLUMNS`] to the inbox table `{}`.
const ORDERING_DDL: &str = "ALTER TABLE {} ADD COLUMN aggregate_id text GENERATED ALWAYS AS (event_id) STORED, \
     ADD COLUMN aggregate_version integer NOT NULL DEFAULT 1";

/// A Redis stream for the Queues panels: 5 entries, group `e2e-workers` delivered 3 of
/// them and acknowledged none (lag 2, 3 pending), and its dead-letter stream, which
/// [`queue_after_start`] grows. Returns (stream, dead-letter stream).
fn queue_stream() -> (String, String) {
    let stream = common::unique_name("e2e", "orders");
    let dead = format!("{stream}:dead");
    redis(&["DEL", &stream, &dead]);
    for _ in 0..5 {
        redis(&["XADD", &stream, "*", "order", "1"]);
    }
    redis(&["XGROUP", "CREATE", &stream, "e2e-workers", "0"]);
    redis(&[
        "XREADGROUP",
        "GROUP",
        "e2e-workers",
        "w1",
        "COUNT",
        "3",
        "STREAMS",
        &stream,
        ">",
    ]);
    redis(&["XADD", &dead, "*", "order", "1"]);
    (stream, dead)
}

/// Two dead letters after the agent's first poll: `queue_dead_letters_total` grows.
fn queue_after_start(dead: &str) {
    redis(&["XADD", dead, "*", "order", "2"]);
    redis(&["XADD", dead, "*", "order", "3"]);
}

/// One command to the machine's Redis (database 0), through `redis-cli`.
fn redis(args: &[&str]) {
    let out = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", "6379"])
        .args(args)
        .output()
        .expect("redis-cli runs");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !said.starts_with("ERR"),
        "redis-cli {args:?}: {said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// [`REPLAYED`] dead letters dead-lettered ten minutes ago, and the audit
/// tables `schema --config` prints; returns their ids.
async fn seed_dead_letters(db: &Db, table: &str, config: &std::path::Path) -> Vec<String> {
    db.register_table(AUDIT_TABLE);
    db.register_table(&format!("{AUDIT_TABLE}_runs"));
    let out = common::Cmd::new(["schema", "--config"])
        .arg(config)
        .output();
    assert!(out.success(), "schema --config: {}", out.describe());
    for stmt in common::split_statements(&out.stdout) {
        db.exec(&stmt, &[]).await;
    }
    let base = db.now_ms().await - 10 * 60_000;
    let mut ids = Vec::new();
    for i in 0..REPLAYED {
        let e = InboxEvent {
            id: format!("e2e-replayed-{i:02}"),
            event_type: Some(EVENT_TYPES[0].to_string()),
            status: Status::Dead,
            received_ms: base,
            started_ms: Some(base + 100),
            finished_ms: Some(base + 200),
            attempts: 3,
            deliveries: 1,
            last_error: Some("TimeoutError: payments did not answer".into()),
            traceparent: None,
            updated_ms: base + 200,
        };
        let (sql, args) = e.insert_stmt(db.dialect, table);
        db.pool
            .execute(&sql, &args)
            .await
            .expect("insert a dead letter");
        ids.push(e.id);
    }
    ids
}

/// Once Prometheus has the replay series at 0: replays `ids` (the CLI, by id),
/// then [`DEAD_AGAIN`] of them die again and the others succeed.
async fn replay_and_fail_again(
    db: &Db,
    table: &str,
    config: &std::path::Path,
    prom: &Prometheus,
    ids: &[String],
) {
    // Prometheus has both series at 0 (the agent has read the audit table),
    // so that what follows is an increase.
    wait_until(START_TIMEOUT, || async move {
        let query = format!(
            "count(inbox_dead_letter_replays_total{{source=\"{SOURCE}\"}} == 0) + \
             count(inbox_dead_letters_after_replay_total{{source=\"{SOURCE}\",error_class=\"timeout\"}} == 0)"
        );
        let v = prom.query_values(&query).await;
        let result: serde_json::Value = serde_json::from_str(&v).unwrap_or_default();
        match result[0]["value"][1].as_str() {
            Some("2") => Ok(()),
            _ => Err(format!("{query}: {v}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("the replay series are not at 0 in Prometheus: {e}"));
    let mut args: Vec<String> = ["dead-letters", "replay", "--config"]
        .map(String::from)
        .to_vec();
    args.push(config.to_string_lossy().into_owned());
    args.extend(
        [
            "--source",
            SOURCE,
            "--operator",
            "e2e",
            "--reason",
            "payments back",
            "--yes",
        ]
        .map(String::from),
    );
    args.extend(ids.iter().cloned());
    let out = common::Cmd::new(args).output();
    assert!(out.success(), "dead-letters replay: {}", out.describe());
    for (i, id) in ids.iter().enumerate() {
        let (status, error) = if i < DEAD_AGAIN {
            ("dead", "'TimeoutError: payments still down'")
        } else {
            ("succeeded", "NULL")
        };
        db.exec(
            &format!(
                "UPDATE {table} SET status = '{status}', attempts = 1, started_at = now(), \
                 finished_at = now(), last_error = {error}, updated_at = now() \
                 WHERE event_id = '{id}'"
            ),
            &[],
        )
        .await;
    }
}

fn agent_toml(dsn: &str, tables: &common::Tables, bootstrap: &str, queue: (&str, &str)) -> String {
    let columns = common::scenarios::INBOX_COLUMNS
        .trim_end()
        .strip_suffix('}')
        .expect("INBOX_COLUMNS is an inline table")
        .trim_end()
        .to_string()
        + ORDERING_COLUMNS;
    format!(
        "[[sources]]\nname = {}\nkind = \"inbox\"\ndsn = {}\ntable = {}\npoll_interval = \"500ms\"\n\
         overlap = \"10s\"\ntimeout = \"2s\"\n{}\n[sources.objectives]\noldest_age = \"5m\"\np95 = \"2s\"\n\
         [sources.dead_letter_actions]\ndsn = {}\naudit_table = {}\n{}{}",
        toml_str(SOURCE),
        toml_str(dsn),
        toml_str(&tables.inbox),
        columns,
        toml_str(dsn),
        toml_str(AUDIT_TABLE),
        common::scenarios::outbox_source_toml(OUTBOX_SOURCE, dsn, &tables.outbox),
        // Split into two shards, both held by this one agent: the split
        // path under a real Prometheus (`inboxwatch_kafka_shards` has data).
        kafka_support::kafka_source_toml(KAFKA_SOURCE, bootstrap, "shards = 2"),
    ) + &format!(
        "\n[[sources]]\nname = {}\nkind = \"redis_streams\"\nurl = \"redis://127.0.0.1:6379/0\"\n\
         poll_interval = \"1s\"\nowner = \"team-queues\"\nstreams = [{}]\n\
         dead_letter_streams = {{ {} = {} }}\n",
        toml_str(QUEUE_SOURCE),
        toml_str(queue.0),
        toml_str(queue.0),
        toml_str(queue.1),
    )
}

/// A Kafka cluster for the Kafka panels: group `e2e-billing` 4 records behind on
/// partition 0 of [`KAFKA_TOPIC`] and caught up on partition 1, group `e2e-audit`
/// caught up on both (its time to drain is 0: a finite estimate; `e2e-billing`'s
/// lag does not shrink, so its estimate is the "not draining" sentinel), with records on its
/// dead-letter and retry topics produced after the agent started (see
/// [`kafka_after_start`]).
async fn kafka_cluster() -> kafka_support::Broker {
    let broker = kafka_support::Broker::start().await;
    broker.create_topic(KAFKA_TOPIC, 2).await;
    broker.create_topic(KAFKA_DLQ, 1).await;
    broker.create_topic(KAFKA_RETRY, 1).await;
    let producer = broker.producer();
    for p in 0..2 {
        for _ in 0..10 {
            producer.send(KAFKA_TOPIC, p, kafka_support::now_ms()).await;
        }
    }
    let group = broker.committer("e2e-billing");
    group.consume_and_commit(KAFKA_TOPIC, 0, 5);
    group.consume_and_commit(KAFKA_TOPIC, 1, 10);
    let audit = broker.committer("e2e-audit");
    audit.consume_and_commit(KAFKA_TOPIC, 0, 10);
    audit.consume_and_commit(KAFKA_TOPIC, 1, 10);
    broker
}

/// Once the agent runs: a commit it sees move, and dead letters and retries it counts.
async fn kafka_after_start(broker: &kafka_support::Broker) {
    broker
        .committer("e2e-billing")
        .consume_and_commit(KAFKA_TOPIC, 0, 6);
    let producer = broker.producer();
    for _ in 0..3 {
        producer.send(KAFKA_DLQ, 0, kafka_support::now_ms()).await;
    }
    for _ in 0..4 {
        producer.send(KAFKA_RETRY, 0, kafka_support::now_ms()).await;
    }
}

// ---------------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------------

/// Fails if the writer stopped with an error or a process exited.
fn assert_alive(ctl: &Control, prom: &mut Prometheus, am: &mut Alertmanager, agent: &mut Agent) {
    if let Some(e) = ctl.error() {
        panic!("the workload failed: {e}");
    }
    prom.proc.assert_running();
    am.proc.assert_running();
    if let Some(status) = agent.exited() {
        panic!("the agent exited with {status} during the test");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_letter_spike_pages_oncall_and_dashboards_have_data() {
    let t0 = Instant::now();
    let rules = rule_file_paths();
    let dashboards = grafana::dashboards();
    let queries = grafana::queries(&dashboards);
    let variables = grafana::query_variables(&dashboards);

    // The inbox and outbox tables, the Kafka cluster and the agent.
    let db = Db::postgres().await;
    let tables = db.fresh_tables("e2e").await;
    db.exec(&ORDERING_DDL.replace("{}", &tables.inbox), &[])
        .await;
    let broker = kafka_cluster().await;
    let (stream, dead) = queue_stream();
    let toml = agent_toml(&db.dsn, &tables, &broker.bootstrap(), (&stream, &dead));
    let dir = tempfile::tempdir().expect("temp dir");
    let config_file = dir.path().join("agent.toml");
    std::fs::write(&config_file, &toml).expect("write the config");
    let replayed = seed_dead_letters(&db, &tables.inbox, &config_file).await;
    let mut agent = Agent::start(&toml);
    agent.wait_ready(READY_TIMEOUT).await;
    kafka_after_start(&broker).await;
    queue_after_start(&dead);
    let outbox = Target {
        dialect: db.dialect,
        pool: db.pool.clone(),
        table: tables.outbox.clone(),
    };
    let outbox_clock = Clock::new(db.now_ms().await + 5);
    let outbox_run = tokio::spawn(async move {
        let mut w = OutboxWorkload::standard(Vec::new());
        w.events = 300;
        w.workers = 2;
        w.run(&outbox, outbox_clock).await
    });

    // Webhook receiver, Alertmanager, Prometheus.
    let webhook = Webhook::start(t0).await;
    let mut am = Alertmanager::start_with(&alertmanager_yml(webhook.port));
    am.wait_ready().await;
    let mut prom = Prometheus::start(&prometheus_yml(&rules, &[agent.port], am.port));
    prom.wait_ready().await;
    let prom_ref = &prom;

    // Rules loaded, the agent scraped.
    let loaded = wait_until(START_TIMEOUT, || async move {
        let r = prom_ref.rules().await?;
        if r.iter().any(|r| r[1] == SPIKE) {
            Ok(r)
        } else {
            Err(format!("{} rules loaded, none named {SPIKE}", r.len()))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("Prometheus did not load the rules {rules:?}: {e}"));
    eprintln!(
        "Prometheus loaded {} rules ({} alerting) from {:?}",
        loaded.len(),
        loaded.iter().filter(|r| r[2] == "alerting").count(),
        rules
    );
    wait_until(START_TIMEOUT, || async move {
        match prom_ref.query("up{job=\"inboxwatch\"} == 1").await? {
            0 => Err("up{job=\"inboxwatch\"} is not 1 yet".to_string()),
            _ => Ok(()),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("Prometheus does not scrape the agent: {e}"));
    eprintln!("+{} Prometheus scrapes the agent", secs(t0.elapsed()));
    replay_and_fail_again(&db, &tables.inbox, &config_file, &prom, &replayed).await;
    eprintln!(
        "+{} {REPLAYED} dead letters replayed, {DEAD_AGAIN} of them dead again",
        secs(t0.elapsed())
    );

    // The consumer simulation.
    let ctl = Arc::new(Control::default());
    let writer = Writer {
        pool: db.pool.clone(),
        table: tables.inbox.clone(),
        clock: Clock::new(db.now_ms().await),
        ctl: ctl.clone(),
        rng: fastrand::Rng::new(),
        slots: Vec::new(),
    };
    let ctl2 = ctl.clone();
    let mut writer_task = AbortOnDrop(tokio::spawn(async move {
        if let Err(e) = writer.run().await {
            eprintln!("workload error: {e}");
            *ctl2.error.lock().expect("control lock") = Some(e);
        }
    }));

    // 1. Healthy phase: no page.
    let healthy_start = Instant::now();
    eprintln!(
        "+{} healthy phase for {}",
        secs(t0.elapsed()),
        secs(HEALTHY_PHASE)
    );
    while healthy_start.elapsed() < HEALTHY_PHASE {
        assert_alive(&ctl, &mut prom, &mut am, &mut agent);
        let pages = webhook.alerts_at("/oncall");
        assert!(
            pages.is_empty(),
            "a page during the healthy phase ({}):\n{}",
            ctl.summary(),
            webhook.render()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let active = prom
        .alerts()
        .await
        .unwrap_or_else(|e| panic!("GET /api/v1/alerts: {e}"));
    eprintln!(
        "+{} end of the healthy phase ({}); alerts pending or firing:\n{}",
        secs(t0.elapsed()),
        ctl.summary(),
        render_alerts(&active)
    );
    let critical: Vec<String> = active
        .iter()
        .filter(|a| a.severity() == "critical" || a.name == SPIKE)
        .map(PromAlert::brief)
        .collect();
    assert!(
        critical.is_empty(),
        "healthy traffic has critical alerts pending or firing (they would page):\n{}",
        critical.join("\n")
    );

    // 2. The burst.
    let burst_start = Instant::now();
    ctl.burst_left.store(BURST_EVENTS, Ordering::Relaxed);
    eprintln!(
        "+{} burst: {BURST_EVENTS} dead letters, one every {BURST_EVERY_MS} ms",
        secs(t0.elapsed())
    );
    let mut pending_at: Option<(Instant, usize)> = None;
    let mut firing_at: Option<(Instant, usize)> = None;
    let page = loop {
        assert_alive(&ctl, &mut prom, &mut am, &mut agent);
        if let Ok(alerts) = prom.alerts().await {
            for a in alerts.iter().filter(|a| a.name == SPIKE) {
                let n = ctl.burst_dead.load(Ordering::Relaxed);
                if pending_at.is_none() && (a.state == "pending" || a.state == "firing") {
                    pending_at = Some((Instant::now(), n));
                    eprintln!(
                        "+{} Prometheus: {} ({n} burst dead letters written)",
                        secs(t0.elapsed()),
                        a.brief()
                    );
                }
                if firing_at.is_none() && a.state == "firing" {
                    firing_at = Some((Instant::now(), n));
                    eprintln!("+{} Prometheus: {}", secs(t0.elapsed()), a.brief());
                }
            }
        }
        let spike = webhook
            .alerts_at("/oncall")
            .into_iter()
            .find(|(_, a)| a.name() == SPIKE && a.status == "firing");
        if let Some(p) = spike {
            break p;
        }
        let since = ctl
            .first_burst_dead
            .lock()
            .expect("control lock")
            .map_or(burst_start, |t| t);
        if since.elapsed() > SPIKE_TIMEOUT {
            let alerts = prom.alerts().await.unwrap_or_default();
            let rate = prom.query_values(
                "sum by (source) (rate(inbox_messages_completed_total{outcome=\"dead_lettered\"}[5m]))",
            )
            .await;
            panic!(
                "{SPIKE} did not reach /oncall within {SPIKE_TIMEOUT:?} of the burst's first dead \
                 letter ({}).\nDead-letter rate over 5m: {rate}\nPrometheus alerts:\n{}",
                ctl.summary(),
                render_alerts(&alerts)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let (paged_at, spike) = page;
    let first_dead = ctl
        .first_burst_dead
        .lock()
        .expect("control lock")
        .unwrap_or(burst_start);
    eprintln!(
        "+{} {SPIKE} arrived at /oncall: {:?}",
        secs(t0.elapsed()),
        spike.labels
    );
    assert_eq!(spike.label("source"), SOURCE, "the page's source label");
    assert_eq!(spike.label("severity"), "critical", "the page's severity");
    for key in ["summary", "description", "runbook_url"] {
        let v = spike.annotations.get(key).map_or("", String::as_str);
        assert!(
            !v.trim().is_empty(),
            "{SPIKE} has no {key} annotation: {:?}",
            spike.annotations
        );
        assert!(
            !v.contains("error expanding template") && !v.contains("<no value>"),
            "{SPIKE}'s {key} annotation did not render: {v:?}"
        );
    }
    eprintln!("{SPIKE} annotations: {:#?}", spike.annotations);
    let runbook = &spike.annotations["runbook_url"];
    assert!(
        runbook.ends_with("#inboxdeadletterspike"),
        "{SPIKE}'s runbook_url {runbook:?} does not point at #inboxdeadletterspike"
    );

    // The spike inhibits the single-dead-letter alert of the same source and family in
    // the real Alertmanager (config/alertmanager.yml's inhibit_rules).
    let am_ref = &am;
    let inhibited = wait_until(Duration::from_secs(30), || async move {
        let v = am_ref.alerts().await?;
        let found = v.as_array().into_iter().flatten().find(|a| {
            a["labels"]["alertname"] == "InboxDeadLetter" && a["labels"]["source"] == SOURCE
        });
        match found {
            Some(a)
                if a["status"]["state"] == "suppressed"
                    && a["status"]["inhibitedBy"]
                        .as_array()
                        .is_some_and(|i| !i.is_empty()) =>
            {
                Ok(a["status"].to_string())
            }
            Some(a) => Err(format!("InboxDeadLetter is not inhibited: {}", a["status"])),
            None => Err(format!(
                "Alertmanager has no InboxDeadLetter{{source={SOURCE:?}}}: {v}"
            )),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{SPIKE} does not inhibit InboxDeadLetter: {e}"));
    eprintln!("InboxDeadLetter in Alertmanager: {inhibited}");

    // The replayed events that died again: the alert fired (it is a warning: it
    // goes to chat, never pages).
    let prom_ref = &prom;
    let fired = wait_until(Duration::from_secs(60), || async move {
        let alerts = prom_ref.alerts().await?;
        alerts
            .into_iter()
            .find(|a| {
                a.name == REPLAY_ALERT
                    && a.state == "firing"
                    && a.labels.get("source").map(String::as_str) == Some(SOURCE)
            })
            .ok_or_else(|| format!("{REPLAY_ALERT}{{source={SOURCE:?}}} is not firing"))
    })
    .await;
    let fired = match fired {
        Ok(a) => a,
        Err(e) => {
            let series: Vec<String> = agent
                .try_scrape()
                .await
                .map(|m| {
                    [
                        "inbox_dead_letter_replays_total",
                        "inbox_dead_letters_after_replay_total",
                    ]
                    .iter()
                    .flat_map(|n| {
                        m.series(n, &[])
                            .map(|x| format!("{} {}", x.series(), x.value))
                            .collect::<Vec<_>>()
                    })
                    .collect()
                })
                .unwrap_or_default();
            let alerts = prom.alerts().await.unwrap_or_default();
            panic!(
                "{e}\nthe agent's replay series:\n{}\nPrometheus alerts:\n{}",
                series.join("\n"),
                render_alerts(&alerts)
            )
        }
    };
    eprintln!("+{} Prometheus: {}", secs(t0.elapsed()), fired.brief());
    assert_eq!(fired.severity(), "warning", "{}", fired.brief());
    // The alert's value is increase() over the hour: the events dead again,
    // extrapolated a little (the counters themselves are exact, below).
    let value: f64 = fired.value.parse().unwrap_or_default();
    assert!(
        (DEAD_AGAIN as f64..DEAD_AGAIN as f64 + 0.5).contains(&value),
        "the alert's value is about the events dead again: {}",
        fired.brief()
    );
    for (query, want) in [
        (
            format!("inbox_dead_letter_replays_total{{source=\"{SOURCE}\"}}"),
            REPLAYED,
        ),
        (
            format!("sum(inbox_dead_letters_after_replay_total{{source=\"{SOURCE}\"}})"),
            DEAD_AGAIN,
        ),
    ] {
        let v = prom.query_values(&query).await;
        let result: serde_json::Value = serde_json::from_str(&v).unwrap_or_default();
        assert_eq!(
            result[0]["value"][1].as_str(),
            Some(want.to_string().as_str()),
            "{query}: {v}"
        );
    }

    // 3. Dashboards, just after the inbox workload stopped and its backlog drained:
    // the drain-time panels have an estimate (0: nothing left), the rate panels still
    // see the last minute's traffic. (The outbox workload has long finished: its
    // counters and histograms stay, its unpublished rows are backlog.)
    ctl.stop.store(true, Ordering::Relaxed);
    tokio::time::timeout(Duration::from_secs(30), &mut writer_task.0)
        .await
        .expect("the workload did not stop within 30 s")
        .expect("the workload task panicked");
    let stopped = Instant::now();
    let prom_ref = &prom;
    let drained = wait_until(Duration::from_secs(30), || async move {
        let backlog = format!("source:inbox_backlog_messages:sum{{source=\"{SOURCE}\"}}");
        let v = prom_ref.query_values(&backlog).await;
        let result: serde_json::Value = serde_json::from_str(&v).unwrap_or_default();
        match result[0]["value"][1].as_str() {
            Some("0") => Ok(()),
            _ => Err(format!("{backlog}: {v}")),
        }
    })
    .await;
    if let Err(e) = drained {
        panic!("the inbox backlog did not drain within 30 s of the workload's end: {e}");
    }
    // One more rule evaluation (every second) for the drain-time rules.
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!(
        "+{} workload stopped ({}); the backlog drained in {}",
        secs(t0.elapsed()),
        ctl.summary(),
        secs(stopped.elapsed())
    );
    let outbox_truth = outbox_run.await.expect("the outbox workload");
    eprintln!(
        "+{} outbox workload: {} events written",
        secs(t0.elapsed()),
        outbox_truth.events.len()
    );
    let mut failures = Vec::new();
    let mut no_data_ok = Vec::new();
    for q in &queries {
        let what = format!("{} / {:?} / {}: {}", q.file, q.panel, q.ref_id, q.expr);
        let mut samples = 0;
        let mut broken = Vec::new();
        for source in SOURCES {
            let evaluated = match substitute(&q.expr, source) {
                Ok(expr) => prom
                    .query(&expr)
                    .await
                    .map_err(|e| format!("does not evaluate: {e}")),
                Err(e) => Err(e),
            };
            match evaluated {
                Ok(n) => samples += n,
                Err(e) => broken.push(format!("($source = {source}) {e}")),
            }
        }
        if !broken.is_empty() {
            failures.push(format!("{what}\n    {}", broken.join("\n    ")));
        } else if samples == 0 {
            match NO_DATA_EXPECTED
                .iter()
                .find(|(pat, _)| q.expr.contains(pat))
            {
                Some((_, why)) => no_data_ok.push(format!("{what}\n    ({why})")),
                None => failures.push(format!(
                    "{what}\n    returned no sample for any $source of {SOURCES:?}"
                )),
            }
        }
    }
    for (file, name, query) in &variables {
        // A Queues variable selects among the queue sources: `$source` is the queue one.
        let source = if query.contains("queue_") {
            QUEUE_SOURCE
        } else {
            SOURCE
        };
        match variable_values(&prom, query, source).await {
            Err(e) => failures.push(format!("{file} / variable {name}: {query}\n    {e}")),
            Ok(values)
                if values.is_empty()
                    && !NO_DATA_EXPECTED.iter().any(|(pat, _)| query.contains(pat)) =>
            {
                failures.push(format!(
                    "{file} / variable {name}: {query}\n    offers no value"
                ))
            }
            Ok(values) if name == "source" && !values.iter().any(|v| v == source) => {
                failures.push(format!(
                    "{file} / variable {name}: {query}\n    does not offer {source:?}: {values:?}"
                ))
            }
            Ok(_) => {}
        }
    }
    eprintln!(
        "+{} {} dashboard queries and {} variables evaluated; {} without data, as expected:\n{}",
        secs(t0.elapsed()),
        queries.len(),
        variables.len(),
        no_data_ok.len(),
        no_data_ok.join("\n")
    );

    // 4. Every rule evaluated without an error.
    let rules_now = prom
        .rules()
        .await
        .unwrap_or_else(|e| panic!("GET /api/v1/rules: {e}"));
    let broken: Vec<String> = rules_now
        .iter()
        .filter(|r| r[3] != "ok")
        .map(|r| {
            format!(
                "{} / {} ({}): health {:?}: {}",
                r[0], r[1], r[2], r[3], r[4]
            )
        })
        .collect();

    // Nothing but the spike paged.
    let other_pages: Vec<String> = webhook
        .alerts_at("/oncall")
        .into_iter()
        .filter(|(_, a)| a.name() != SPIKE || a.label("source") != SOURCE)
        .map(|(at, a)| {
            format!(
                "+{} {} [{}] {:?}",
                secs(at - t0),
                a.name(),
                a.status,
                a.labels
            )
        })
        .collect();

    let final_alerts = prom.alerts().await.unwrap_or_default();
    let last_dead = *ctl.last_burst_dead.lock().expect("control lock");
    let rel = |t: Instant| format!("{:+.1}s", t.duration_since(first_dead).as_secs_f64());
    eprintln!(
        "\n===== e2e_alerting timeline (relative to the burst's first dead letter) =====\n\
         workload: {}\n\
         burst: {BURST_EVENTS} dead letters from +0.0s to {}\n\
         {SPIKE} pending in Prometheus: {}\n\
         {SPIKE} firing in Prometheus:  {}\n\
         {SPIKE} at /oncall:            {}\n\
         notifications received:\n{}\
         alerts pending or firing at the end:\n{}\
         total test time so far: {}\n",
        ctl.summary(),
        last_dead.map_or("?".into(), rel),
        pending_at.map_or("not seen".into(), |(t, n)| format!(
            "{} (after {n} burst dead letters)",
            rel(t)
        )),
        firing_at.map_or("not seen".into(), |(t, n)| format!(
            "{} (after {n} burst dead letters)",
            rel(t)
        )),
        rel(paged_at),
        webhook.render(),
        render_alerts(&final_alerts),
        secs(t0.elapsed())
    );
    assert!(
        webhook.errors().is_empty(),
        "the webhook receiver saw bad requests: {:?}",
        webhook.errors()
    );
    assert!(
        other_pages.is_empty(),
        "alerts other than {SPIKE}{{source={SOURCE:?}}} paged /oncall:\n{}",
        other_pages.join("\n")
    );
    assert!(
        broken.is_empty(),
        "rules that failed to evaluate in Prometheus:\n{}",
        broken.join("\n")
    );
    assert!(
        failures.is_empty(),
        "{} of {} dashboard queries and variables failed against Prometheus:\n{}",
        failures.len(),
        queries.len() + variables.len(),
        failures.join("\n")
    );

    drop(prom);
    drop(am);
    drop(agent);
    db.cleanup().await;
}
