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
//!    variables substituted) answers `success` with at least one sample, except the
//!    ones listed in [`NO_DATA_EXPECTED`] with the reason.
//! 4. Every rule Prometheus loaded evaluated without an error.
//!
//! Needs `/usr/bin/prometheus` and `/usr/bin/prometheus-alertmanager` (Debian packages
//! `prometheus prometheus-alertmanager`). Takes about three and a half minutes; run
//! with `cargo nextest run --test e2e_alerting --no-capture` to see the timeline.

mod common;

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use common::workload::{Clock, EVENT_TYPES, InboxEvent, Status};
use common::{
    Agent, Db, Pool, READY_TIMEOUT, free_port, http_get, http_get_accepting, toml_str, wait_until,
};

/// The source under test (the `source` label, and `$source` in the dashboards).
const SOURCE: &str = "e2e-orders";
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
/// Prometheus / Alertmanager ready, the first scrape, rules loaded.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// The receiver prefix in config/alertmanager.yml that the test replaces.
const WEBHOOK_PREFIX: &str = "http://alert-bridge.monitoring.svc:9095";
/// The dead-letter spike, the one alert that has to page here.
const SPIKE: &str = "InboxDeadLetterSpike";

/// Dashboard queries allowed to return no sample in this scenario: (a substring of
/// the expression, why it has no data here). They still have to evaluate.
const NO_DATA_EXPECTED: &[(&str, &str)] = &[
    (
        "outbox_",
        "no outbox source in this scenario ($source is the inbox e2e-orders)",
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
        "inboxwatch_poll_errors_total",
        "no poll fails in this scenario, so the counter has no series",
    ),
    (
        "kafka_",
        "no Kafka source in this scenario, so no Kafka series",
    ),
    (
        NO_KAFKA_CLUSTER,
        "no Kafka source in this scenario ($cluster matches no source)",
    ),
];

/// `$cluster` of the Kafka dashboard: no Kafka source here, so it matches none.
const NO_KAFKA_CLUSTER: &str = "e2e-no-kafka-cluster";

/// Grafana variables and what they stand for here.
const DASHBOARD_VARS: &[(&str, &str)] = &[
    ("__rate_interval", "1m"),
    ("__interval", "15s"),
    ("source", SOURCE),
    ("event_type", ".*"),
    ("cluster", NO_KAFKA_CLUSTER),
    ("group", ".*"),
    ("topic", ".*"),
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

// ---------------------------------------------------------------------------------
// Child processes: Prometheus and Alertmanager
// ---------------------------------------------------------------------------------

/// `name` on PATH, else `/usr/bin/name`; fails with how to install it.
fn tool(name: &str) -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    let found = on_path.or_else(|| {
        let p = Path::new("/usr/bin").join(name);
        p.is_file().then_some(p)
    });
    found.unwrap_or_else(|| {
        panic!(
            "`{name}` is not installed: the end-to-end alerting test needs a real Prometheus and \
             Alertmanager. Install the Debian packages: \
             apt-get install -y --no-install-recommends prometheus prometheus-alertmanager"
        )
    })
}

/// A child process with its output in files. Killed on drop; if the test is
/// panicking, its output is printed.
struct Proc {
    name: &'static str,
    child: Child,
    port: u16,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Proc {
    fn spawn(name: &'static str, bin: &Path, args: &[String], dir: &Path, port: u16) -> Proc {
        let stdout = dir.join(format!("{name}.stdout"));
        let stderr = dir.join(format!("{name}.stderr"));
        let child = Command::new(bin)
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).expect("create a stdout file"))
            .stderr(File::create(&stderr).expect("create a stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("failed to spawn {}: {e}", bin.display()));
        eprintln!(
            "started {name} (pid {}) on 127.0.0.1:{port}: {} {}",
            child.id(),
            bin.display(),
            args.join(" ")
        );
        Proc {
            name,
            child,
            port,
            stdout,
            stderr,
        }
    }

    fn output(&self) -> String {
        let read =
            |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).to_string();
        let tail = |s: String| {
            const MAX: usize = 60_000;
            if s.len() <= MAX {
                return s;
            }
            let cut = (s.len() - MAX..s.len())
                .find(|i| s.is_char_boundary(*i))
                .unwrap_or(0);
            format!("[... {cut} bytes cut ...]\n{}", &s[cut..])
        };
        format!("{}{}", tail(read(&self.stderr)), tail(read(&self.stdout)))
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits for `GET /-/ready` to answer 200; panics if the process exits first.
    async fn wait_ready(&mut self) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.exited() {
                panic!("{} exited with {status} before it became ready", self.name);
            }
            let last = match http_get(self.port, "/-/ready").await {
                Ok((200, _)) => return,
                Ok((code, body)) => format!("answered {code}: {}", body.trim()),
                Err(e) => e,
            };
            if started.elapsed() > START_TIMEOUT {
                panic!(
                    "{} was not ready within {START_TIMEOUT:?}; /-/ready: {last}",
                    self.name
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.exited() {
            panic!("{} exited with {status} during the test", self.name);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "----- {} output (port {}) -----\n{}\n----- end of {} output -----",
                self.name,
                self.port,
                self.output(),
                self.name
            );
        }
    }
}

// ---------------------------------------------------------------------------------
// The Prometheus HTTP API
// ---------------------------------------------------------------------------------

fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// GET an API path; the `data` of a `success` answer, else the whole answer.
async fn prom_api(port: u16, path: &str) -> Result<Value, String> {
    let (code, body) = http_get(port, path).await?;
    let v: Value = serde_json::from_str(&body)
        .map_err(|e| format!("GET {path}: HTTP {code}, not JSON ({e}): {body}"))?;
    if v["status"] != "success" {
        return Err(format!("GET {path}: HTTP {code}: {body}"));
    }
    Ok(v["data"].clone())
}

/// An instant query: the number of samples it returned (a scalar or string counts as one).
async fn prom_query(port: u16, expr: &str) -> Result<usize, String> {
    let data = prom_api(port, &format!("/api/v1/query?query={}", urlencode(expr))).await?;
    match data["resultType"].as_str() {
        Some("vector") | Some("matrix") => Ok(data["result"].as_array().map_or(0, Vec::len)),
        Some("scalar") | Some("string") => Ok(1),
        other => Err(format!("unexpected resultType {other:?}: {data}")),
    }
}

/// One alert as `GET /api/v1/alerts` shows it.
#[derive(Clone, Debug)]
struct PromAlert {
    name: String,
    state: String,
    labels: BTreeMap<String, String>,
    active_at: String,
    value: String,
}

impl PromAlert {
    fn severity(&self) -> &str {
        self.labels.get("severity").map_or("", String::as_str)
    }
    fn brief(&self) -> String {
        format!(
            "{}{{{}}} {} since {} (value {})",
            self.name,
            self.labels
                .iter()
                .filter(|(k, _)| *k != "alertname")
                .map(|(k, v)| format!("{k}={v:?}"))
                .collect::<Vec<_>>()
                .join(","),
            self.state,
            self.active_at,
            self.value
        )
    }
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// Pending and firing alerts in Prometheus.
async fn prom_alerts(port: u16) -> Result<Vec<PromAlert>, String> {
    let data = prom_api(port, "/api/v1/alerts").await?;
    Ok(data["alerts"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|a| {
                    let labels = string_map(&a["labels"]);
                    PromAlert {
                        name: labels.get("alertname").cloned().unwrap_or_default(),
                        state: a["state"].as_str().unwrap_or_default().to_string(),
                        active_at: a["activeAt"].as_str().unwrap_or_default().to_string(),
                        value: a["value"].as_str().unwrap_or_default().to_string(),
                        labels,
                    }
                })
                .collect()
        })
        .unwrap_or_default())
}

/// One loaded rule: (group, name, type, health, last error).
async fn prom_rules(port: u16) -> Result<Vec<[String; 5]>, String> {
    let data = prom_api(port, "/api/v1/rules").await?;
    let mut out = Vec::new();
    for g in data["groups"].as_array().into_iter().flatten() {
        for r in g["rules"].as_array().into_iter().flatten() {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            out.push([
                s(&g["name"]),
                s(&r["name"]),
                s(&r["type"]),
                s(&r["health"]),
                s(&r["lastError"]),
            ]);
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------
// The webhook receiver (Alertmanager's receivers point here)
// ---------------------------------------------------------------------------------

/// One alert in one webhook notification.
#[derive(Clone, Debug)]
struct NotifiedAlert {
    status: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

impl NotifiedAlert {
    fn name(&self) -> &str {
        self.labels.get("alertname").map_or("", String::as_str)
    }
    fn label(&self, k: &str) -> &str {
        self.labels.get(k).map_or("", String::as_str)
    }
}

/// One POST Alertmanager made.
#[derive(Clone, Debug)]
struct Notification {
    at: Instant,
    path: String,
    alerts: Vec<NotifiedAlert>,
}

#[derive(Default)]
struct WebhookLog {
    notifications: Vec<Notification>,
    errors: Vec<String>,
}

/// An HTTP/1.1 server on 127.0.0.1 that records every POST (keep-alive included).
struct Webhook {
    port: u16,
    t0: Instant,
    log: Arc<Mutex<WebhookLog>>,
    task: tokio::task::JoinHandle<()>,
}

impl Webhook {
    async fn start(t0: Instant) -> Webhook {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the webhook receiver");
        let port = listener.local_addr().expect("webhook address").port();
        let log = Arc::new(Mutex::new(WebhookLog::default()));
        let log2 = log.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let log = log2.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve_webhook_conn(stream, &log).await {
                        log.lock().expect("webhook log").errors.push(e);
                    }
                });
            }
        });
        Webhook {
            port,
            t0,
            log,
            task,
        }
    }

    fn notifications(&self) -> Vec<Notification> {
        self.log.lock().expect("webhook log").notifications.clone()
    }

    fn errors(&self) -> Vec<String> {
        self.log.lock().expect("webhook log").errors.clone()
    }

    /// Every alert that arrived at `path`, with its arrival time.
    fn alerts_at(&self, path: &str) -> Vec<(Instant, NotifiedAlert)> {
        self.notifications()
            .into_iter()
            .filter(|n| n.path == path)
            .flat_map(|n| n.alerts.into_iter().map(move |a| (n.at, a)))
            .collect()
    }

    fn render(&self) -> String {
        let mut out = String::new();
        for n in self.notifications() {
            for a in &n.alerts {
                out.push_str(&format!(
                    "  +{} {} {} [{}] source={:?} severity={:?}\n",
                    secs(n.at - self.t0),
                    n.path,
                    a.name(),
                    a.status,
                    a.label("source"),
                    a.label("severity")
                ));
            }
        }
        if out.is_empty() {
            out.push_str("  (nothing)\n");
        }
        out
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.task.abort();
        if std::thread::panicking() {
            eprintln!(
                "----- webhook notifications -----\n{}errors: {:?}",
                self.render(),
                self.errors()
            );
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

async fn serve_webhook_conn(mut s: TcpStream, log: &Mutex<WebhookLog>) -> Result<(), String> {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        // Headers.
        let head_end = loop {
            if let Some(p) = find(&buf, b"\r\n\r\n") {
                break p;
            }
            let n = match tokio::time::timeout(Duration::from_secs(120), s.read(&mut chunk)).await {
                Ok(Ok(n)) => n,
                _ => return Ok(()),
            };
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let mut lines = head.lines();
        let request = lines.next().unwrap_or_default().to_string();
        let mut parts = request.split_whitespace();
        let method = parts.next().unwrap_or_default().to_string();
        let path = parts.next().unwrap_or_default().to_string();
        let mut len = 0usize;
        for l in lines {
            if let Some((k, v)) = l.split_once(':') {
                let k = k.trim().to_ascii_lowercase();
                if k == "content-length" {
                    len = v
                        .trim()
                        .parse()
                        .map_err(|e| format!("bad Content-Length in {request:?}: {e}"))?;
                } else if k == "transfer-encoding" {
                    return Err(format!(
                        "{request:?}: Transfer-Encoding {} is not supported by the test receiver",
                        v.trim()
                    ));
                }
            }
        }
        // Body.
        let body_start = head_end + 4;
        while buf.len() < body_start + len {
            let n = match tokio::time::timeout(Duration::from_secs(30), s.read(&mut chunk)).await {
                Ok(Ok(n)) => n,
                _ => return Err(format!("{request:?}: body truncated")),
            };
            if n == 0 {
                return Err(format!("{request:?}: body truncated"));
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let body = buf[body_start..body_start + len].to_vec();
        buf.drain(..body_start + len);
        let at = Instant::now();
        if method != "POST" {
            log.lock()
                .expect("webhook log")
                .errors
                .push(format!("unexpected request {request:?}"));
        } else {
            match serde_json::from_slice::<Value>(&body) {
                Ok(v) => {
                    let alerts = v["alerts"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|a| NotifiedAlert {
                            status: a["status"].as_str().unwrap_or_default().to_string(),
                            labels: string_map(&a["labels"]),
                            annotations: string_map(&a["annotations"]),
                        })
                        .collect();
                    log.lock()
                        .expect("webhook log")
                        .notifications
                        .push(Notification { at, path, alerts });
                }
                Err(e) => log.lock().expect("webhook log").errors.push(format!(
                    "{request:?}: body is not JSON ({e}): {}",
                    String::from_utf8_lossy(&body)
                )),
            }
        }
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            .await
            .map_err(|e| format!("write the webhook answer: {e}"))?;
    }
}

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
    if rng.f64() < 0.04 {
        let at = rng.usize(0..=plan.len());
        plan.insert(at, Step::Dup);
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
        let ev = InboxEvent {
            id: format!("e2e-{kind}-{n:06}-{:06x}", self.rng.u32(..0x00ff_ffff)),
            event_type: Some(event_type.to_string()),
            status: Status::Pending,
            received_ms: t,
            started_ms: None,
            finished_ms: None,
            attempts: 0,
            deliveries: 1,
            last_error: None,
            traceparent: None,
            updated_ms: t,
        };
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
                rng.i64(20..200)
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

/// One panel target of a dashboard.
#[derive(Clone, Debug)]
struct DashQuery {
    file: String,
    panel: String,
    ref_id: String,
    expr: String,
}

fn collect_targets(v: &Value, file: &str, panel: &str, out: &mut Vec<DashQuery>) {
    match v {
        Value::Object(o) => {
            let title = o.get("title").and_then(Value::as_str).unwrap_or(panel);
            if let Some(targets) = o.get("targets").and_then(Value::as_array) {
                for t in targets {
                    if let Some(expr) = t.get("expr").and_then(Value::as_str) {
                        out.push(DashQuery {
                            file: file.to_string(),
                            panel: title.to_string(),
                            ref_id: t
                                .get("refId")
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .to_string(),
                            expr: expr.to_string(),
                        });
                    }
                }
            }
            for (k, child) in o {
                if k != "targets" {
                    collect_targets(child, file, title, out);
                }
            }
        }
        Value::Array(a) => {
            for child in a {
                collect_targets(child, file, panel, out);
            }
        }
        _ => {}
    }
}

/// Every `dashboards/*.json`: (file name, parsed JSON).
fn dashboards() -> Vec<(String, Value)> {
    let dir = repo().join("dashboards");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no dashboards/*.json in {}",
        dir.display()
    );
    files
        .into_iter()
        .map(|f| {
            let text =
                std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("read {}: {e}", f.display()));
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{} is not JSON: {e}", f.display()));
            let name = f
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default();
            (name, v)
        })
        .collect()
}

fn dashboard_queries(dashboards: &[(String, Value)]) -> Vec<DashQuery> {
    let mut out = Vec::new();
    for (name, v) in dashboards {
        collect_targets(v, name, "", &mut out);
    }
    out
}

/// The `label_values(...)` queries of the dashboards' query variables: (file, variable
/// name, query).
fn dashboard_variables(dashboards: &[(String, Value)]) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (file, v) in dashboards {
        for var in v["templating"]["list"].as_array().into_iter().flatten() {
            if var["type"] != "query" {
                continue;
            }
            let q = var["query"]
                .as_str()
                .or_else(|| var["query"]["query"].as_str())
                .unwrap_or_default();
            out.push((
                file.clone(),
                var["name"].as_str().unwrap_or_default().to_string(),
                q.to_string(),
            ));
        }
    }
    out
}

/// Evaluates a variable's `label_values([selector, ]label)` through the label values
/// API: the values it offers.
async fn variable_values(port: u16, query: &str) -> Result<Vec<String>, String> {
    let inner = query
        .trim()
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .ok_or_else(|| format!("not a label_values(...) query: {query:?}"))?;
    let (selector, label) = match inner.rsplit_once(',') {
        Some((s, l)) => (Some(substitute(s.trim())?), l.trim()),
        None => (None, inner.trim()),
    };
    let mut path = format!("/api/v1/label/{}/values", urlencode(label));
    if let Some(s) = selector {
        path.push_str(&format!("?match%5B%5D={}", urlencode(&s)));
    }
    let data = prom_api(port, &path).await?;
    Ok(data
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect())
}

/// Replaces Grafana variables (`$name`, `${name}`, `${name:format}`, `[[name]]`) by
/// [`DASHBOARD_VARS`]; an unknown variable is an error.
fn substitute(expr: &str) -> Result<String, String> {
    let lookup = |name: &str| {
        DASHBOARD_VARS
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
            .ok_or_else(|| format!("unknown Grafana variable {name:?}"))
    };
    let mut out = String::with_capacity(expr.len());
    let mut rest = expr;
    while let Some(i) = rest.find(['$', '[']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(inner) = tail.strip_prefix("${") {
            let end = inner.find('}').ok_or("unterminated ${")?;
            let name = inner[..end].split(':').next().unwrap_or_default();
            out.push_str(lookup(name)?);
            rest = &inner[end + 1..];
        } else if let Some(inner) = tail.strip_prefix("[[") {
            let end = inner.find("]]").ok_or("unterminated [[")?;
            let name = inner[..end].split(':').next().unwrap_or_default();
            out.push_str(lookup(name)?);
            rest = &inner[end + 2..];
        } else if let Some(inner) = tail.strip_prefix('$') {
            let end = inner
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(inner.len());
            if end == 0 {
                return Err("a lone `$`".into());
            }
            out.push_str(lookup(&inner[..end])?);
            rest = &inner[end..];
        } else {
            out.push('[');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

// ---------------------------------------------------------------------------------
// Configuration files
// ---------------------------------------------------------------------------------

fn rule_files() -> Vec<PathBuf> {
    let dir = repo().join("alerts");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no rule files (alerts/*.yml) in {}",
        dir.display()
    );
    files
}

fn yaml_str(s: &str) -> String {
    // A JSON string is a valid YAML double-quoted scalar.
    Value::String(s.to_string()).to_string()
}

fn prometheus_yml(rules: &[PathBuf], agent_port: u16, am_port: u16) -> String {
    let rule_lines: String = rules
        .iter()
        .map(|p| format!("  - {}\n", yaml_str(&p.to_string_lossy())))
        .collect();
    format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n{rule_lines}\
         alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['127.0.0.1:{am_port}']\n\
         scrape_configs:\n  - job_name: inboxwatch\n    static_configs:\n      - targets: ['127.0.0.1:{agent_port}']\n"
    )
}

fn alertmanager_yml(webhook_port: u16) -> String {
    let path = repo().join("config/alertmanager.yml");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    assert!(
        text.contains(WEBHOOK_PREFIX),
        "{} does not contain the receiver prefix {WEBHOOK_PREFIX} that the test points at its \
         webhook receiver",
        path.display()
    );
    text.replace(WEBHOOK_PREFIX, &format!("http://127.0.0.1:{webhook_port}"))
}

fn agent_toml(dsn: &str, table: &str) -> String {
    format!(
        "[[sources]]\nname = {}\nkind = \"inbox\"\ndsn = {}\ntable = {}\npoll_interval = \"500ms\"\n\
         overlap = \"10s\"\ntimeout = \"2s\"\n\n[sources.objectives]\noldest_age = \"5m\"\np95 = \"2s\"\n",
        toml_str(SOURCE),
        toml_str(dsn),
        toml_str(table)
    )
}

// ---------------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------------

/// Fails if the writer stopped with an error or a process exited.
fn assert_alive(ctl: &Control, prom: &mut Proc, am: &mut Proc, agent: &mut Agent) {
    if let Some(e) = ctl.error() {
        panic!("the workload failed: {e}");
    }
    prom.assert_running();
    am.assert_running();
    if let Some(status) = agent.exited() {
        panic!("the agent exited with {status} during the test");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_letter_spike_pages_oncall_and_dashboards_have_data() {
    let t0 = Instant::now();
    let prometheus_bin = tool("prometheus");
    let alertmanager_bin = tool("prometheus-alertmanager");
    let rules = rule_files();
    let dashboards = dashboards();
    let queries = dashboard_queries(&dashboards);
    let variables = dashboard_variables(&dashboards);
    let dir = tempfile::tempdir().expect("temp dir for Prometheus and Alertmanager");

    // The inbox table and the agent.
    let db = Db::postgres().await;
    let tables = db.fresh_tables("e2e").await;
    let mut agent = Agent::start(&agent_toml(&db.dsn, &tables.inbox));
    agent.wait_ready(READY_TIMEOUT).await;

    // Webhook receiver, Alertmanager, Prometheus.
    let webhook = Webhook::start(t0).await;
    let am_port = free_port();
    let am_config = dir.path().join("alertmanager.yml");
    std::fs::write(&am_config, alertmanager_yml(webhook.port)).expect("write alertmanager.yml");
    std::fs::create_dir_all(dir.path().join("am-data")).expect("create the Alertmanager data dir");
    let mut am = Proc::spawn(
        "alertmanager",
        &alertmanager_bin,
        &[
            format!("--config.file={}", am_config.display()),
            format!("--storage.path={}", dir.path().join("am-data").display()),
            format!("--web.listen-address=127.0.0.1:{am_port}"),
            "--cluster.listen-address=".to_string(),
        ],
        dir.path(),
        am_port,
    );
    am.wait_ready().await;

    let prom_port = free_port();
    let prom_config = dir.path().join("prometheus.yml");
    std::fs::write(&prom_config, prometheus_yml(&rules, agent.port, am_port))
        .expect("write prometheus.yml");
    let mut prom = Proc::spawn(
        "prometheus",
        &prometheus_bin,
        &[
            format!("--config.file={}", prom_config.display()),
            format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()),
            format!("--web.listen-address=127.0.0.1:{prom_port}"),
        ],
        dir.path(),
        prom_port,
    );
    prom.wait_ready().await;

    // Rules loaded, the agent scraped.
    let loaded = wait_until(START_TIMEOUT, || async move {
        let r = prom_rules(prom_port).await?;
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
        match prom_query(prom_port, "up{job=\"inboxwatch\"} == 1").await? {
            0 => Err("up{job=\"inboxwatch\"} is not 1 yet".to_string()),
            _ => Ok(()),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("Prometheus does not scrape the agent: {e}"));
    eprintln!("+{} Prometheus scrapes the agent", secs(t0.elapsed()));

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
    let active = prom_alerts(prom_port)
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
        if let Ok(alerts) = prom_alerts(prom_port).await {
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
            let alerts = prom_alerts(prom_port).await.unwrap_or_default();
            let rate = prom_query_values(
                prom_port,
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
    let inhibited = wait_until(Duration::from_secs(30), || async move {
        let (code, body) =
            http_get_accepting(am_port, "/api/v2/alerts", "application/json").await?;
        let v: Value = serde_json::from_str(&body)
            .map_err(|e| format!("GET /api/v2/alerts: HTTP {code}, not JSON ({e}): {body}"))?;
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
                "Alertmanager has no InboxDeadLetter{{source={SOURCE:?}}}: {body}"
            )),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{SPIKE} does not inhibit InboxDeadLetter: {e}"));
    eprintln!("InboxDeadLetter in Alertmanager: {inhibited}");

    // 3. Dashboards, with the healthy traffic still running.
    let mut failures = Vec::new();
    let mut no_data_ok = Vec::new();
    for q in &queries {
        let what = format!("{} / {:?} / {}: {}", q.file, q.panel, q.ref_id, q.expr);
        let expr = match substitute(&q.expr) {
            Ok(e) => e,
            Err(e) => {
                failures.push(format!("{what}\n    {e}"));
                continue;
            }
        };
        match prom_query(prom_port, &expr).await {
            Err(e) => failures.push(format!("{what}\n    does not evaluate: {e}")),
            Ok(0) => match NO_DATA_EXPECTED.iter().find(|(pat, _)| expr.contains(pat)) {
                Some((_, why)) => no_data_ok.push(format!("{what}\n    ({why})")),
                None => failures.push(format!("{what}\n    returned no sample")),
            },
            Ok(_) => {}
        }
    }
    for (file, name, query) in &variables {
        match variable_values(prom_port, query).await {
            Err(e) => failures.push(format!("{file} / variable {name}: {query}\n    {e}")),
            Ok(values)
                if values.is_empty()
                    && !NO_DATA_EXPECTED.iter().any(|(pat, _)| query.contains(pat)) =>
            {
                failures.push(format!(
                    "{file} / variable {name}: {query}\n    offers no value"
                ))
            }
            Ok(values) if name == "source" && !values.iter().any(|v| v == SOURCE) => {
                failures.push(format!(
                    "{file} / variable {name}: {query}\n    does not offer {SOURCE:?}: {values:?}"
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
    let rules_now = prom_rules(prom_port)
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

    // Stop the workload (it finishes its events in flight).
    ctl.stop.store(true, Ordering::Relaxed);
    tokio::time::timeout(Duration::from_secs(30), &mut writer_task.0)
        .await
        .expect("the workload did not stop within 30 s")
        .expect("the workload task panicked");
    let final_alerts = prom_alerts(prom_port).await.unwrap_or_default();
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

fn render_alerts(alerts: &[PromAlert]) -> String {
    if alerts.is_empty() {
        return "  (none)\n".to_string();
    }
    alerts
        .iter()
        .map(|a| format!("  {}\n", a.brief()))
        .collect()
}

/// A query's samples as `{labels} value` lines, for failure messages.
async fn prom_query_values(port: u16, expr: &str) -> String {
    match prom_api(port, &format!("/api/v1/query?query={}", urlencode(expr))).await {
        Ok(data) => data["result"].to_string(),
        Err(e) => e,
    }
}
