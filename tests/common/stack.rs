//! The monitoring stack around the agent, for real: Prometheus and Alertmanager
//! processes (the Debian packages `prometheus` and `prometheus-alertmanager`), their
//! HTTP APIs, `promtool` and `amtool` runs, and a webhook receiver that records what
//! Alertmanager notifies. A missing tool fails the test, saying how to install it;
//! nothing skips.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::process::{Proc, run_in_root};
use super::{Outcome, free_port, http_get, http_get_accepting, repo_path};

/// How to get the tools.
pub const INSTALL_HINT: &str = "install the Debian packages: apt-get install -y \
     --no-install-recommends prometheus prometheus-alertmanager (scripts/test.sh does)";

/// How long Prometheus or Alertmanager may take to answer `/-/ready`.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// `name` on PATH, else `/usr/bin/name`; panics with the install hint.
pub fn tool_path(name: &str) -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    let found = on_path.or_else(|| {
        let p = Path::new("/usr/bin").join(name);
        p.is_file().then_some(p)
    });
    found.unwrap_or_else(|| panic!("`{name}` is not installed: {INSTALL_HINT}"))
}

/// Runs a tool (`promtool`, `amtool`) to completion in the checkout's root.
pub fn run_tool(name: &str, args: &[&str]) -> Outcome {
    run_in_root(tool_path(name), args)
        .unwrap_or_else(|e| panic!("cannot run `{name}` ({e}): {INSTALL_HINT}"))
}

/// Panics with the tool's output unless it exited 0.
pub fn assert_success(what: &str, out: &Outcome) {
    assert!(out.success(), "{what} failed:\n{}", out.describe());
}

/// `1.5s`, for timelines.
pub fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Percent-encodes everything but unreserved characters (a query parameter).
pub fn urlencode(s: &str) -> String {
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

/// A YAML double-quoted scalar (a JSON string is one).
pub fn yaml_str(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// Polls `GET /-/ready` on `port` until 200; panics if the process exits first or
/// [`START_TIMEOUT`] passes.
async fn wait_ready(proc: &Proc, port: u16) {
    let started = Instant::now();
    loop {
        if let Some(status) = proc.exited() {
            panic!("{} exited with {status} before it became ready", proc.name);
        }
        let last = match http_get(port, "/-/ready").await {
            Ok((200, _)) => return,
            Ok((code, body)) => format!("answered {code}: {}", body.trim()),
            Err(e) => e,
        };
        if started.elapsed() > START_TIMEOUT {
            panic!(
                "{} was not ready within {START_TIMEOUT:?}; /-/ready: {last}",
                proc.name
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------
// Alertmanager
// ---------------------------------------------------------------------------------

/// A real Alertmanager on a free port, with its own storage and no gossip port (so
/// that tests can run side by side). Killed on drop.
pub struct Alertmanager {
    pub proc: Proc,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Alertmanager {
    /// Starts on the config file `config`; [`Alertmanager::wait_ready`] waits for it.
    pub fn start(config: &Path) -> Alertmanager {
        let dir = tempfile::tempdir().expect("temp dir for Alertmanager");
        Self::spawn(dir, config)
    }

    /// Starts on the config text `yml` (written to its directory).
    pub fn start_with(yml: &str) -> Alertmanager {
        let dir = tempfile::tempdir().expect("temp dir for Alertmanager");
        let config = dir.path().join("alertmanager.yml");
        std::fs::write(&config, yml).expect("write alertmanager.yml");
        Self::spawn(dir, &config)
    }

    fn spawn(dir: tempfile::TempDir, config: &Path) -> Alertmanager {
        let port = free_port();
        let storage = dir.path().join("am-data");
        std::fs::create_dir_all(&storage).expect("create the Alertmanager data dir");
        let mut cmd = Command::new(tool_path("prometheus-alertmanager"));
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.path={}", storage.display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            // No gossip port: tests may run side by side.
            .arg("--cluster.listen-address=")
            .current_dir(dir.path());
        let proc = Proc::spawn("alertmanager", &mut cmd, dir.path(), "alertmanager");
        eprintln!(
            "started alertmanager (pid {}) on 127.0.0.1:{port}",
            proc.pid()
        );
        Alertmanager {
            proc,
            port,
            _dir: dir,
        }
    }

    /// `--alertmanager.url=…` for amtool.
    pub fn amtool_url(&self) -> String {
        format!("--alertmanager.url=http://127.0.0.1:{}", self.port)
    }

    pub async fn wait_ready(&self) {
        wait_ready(&self.proc, self.port).await;
    }

    /// `GET /api/v2/alerts`, parsed.
    pub async fn alerts(&self) -> Result<Value, String> {
        let (code, body) =
            http_get_accepting(self.port, "/api/v2/alerts", "application/json").await?;
        serde_json::from_str(&body)
            .map_err(|e| format!("GET /api/v2/alerts: HTTP {code}, not JSON ({e}): {body}"))
    }
}

// ---------------------------------------------------------------------------------
// Prometheus
// ---------------------------------------------------------------------------------

/// A real Prometheus on a free port with its own TSDB. Killed on drop.
pub struct Prometheus {
    pub proc: Proc,
    pub port: u16,
    _dir: tempfile::TempDir,
}

/// One alert as `GET /api/v1/alerts` shows it.
#[derive(Clone, Debug)]
pub struct PromAlert {
    pub name: String,
    pub state: String,
    pub labels: BTreeMap<String, String>,
    pub active_at: String,
    pub value: String,
}

impl PromAlert {
    pub fn severity(&self) -> &str {
        self.labels.get("severity").map_or("", String::as_str)
    }

    /// `Name{labels} state since … (value …)`.
    pub fn brief(&self) -> String {
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

/// One line per alert, for timelines and failure messages.
pub fn render_alerts(alerts: &[PromAlert]) -> String {
    if alerts.is_empty() {
        return "  (none)\n".to_string();
    }
    alerts
        .iter()
        .map(|a| format!("  {}\n", a.brief()))
        .collect()
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

/// A `prometheus.yml` that scrapes `targets` (job `inboxwatch`) every second,
/// evaluates `rules` every second and sends alerts to `alertmanager_port`.
pub fn prometheus_yml(rules: &[PathBuf], targets: &[u16], alertmanager_port: u16) -> String {
    let rule_lines: String = rules
        .iter()
        .map(|p| format!("  - {}\n", yaml_str(&p.to_string_lossy())))
        .collect();
    let targets: Vec<String> = targets.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
    format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n{rule_lines}\
         alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['127.0.0.1:{alertmanager_port}']\n\
         scrape_configs:\n  - job_name: inboxwatch\n    static_configs:\n      - targets: [{}]\n",
        targets.join(", ")
    )
}

/// The rule files of the checkout (`alerts/*.yml`), absolute.
pub fn rule_file_paths() -> Vec<PathBuf> {
    super::repo_files("alerts", &[".yml", ".yaml"])
        .iter()
        .map(|f| repo_path(f))
        .collect()
}

impl Prometheus {
    /// Starts on the config text `yml`; [`Prometheus::wait_ready`] waits for it.
    pub fn start(yml: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("temp dir for Prometheus");
        let port = free_port();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(&config, yml).expect("write prometheus.yml");
        let mut cmd = Command::new(tool_path("prometheus"));
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .current_dir(dir.path());
        let proc = Proc::spawn("prometheus", &mut cmd, dir.path(), "prometheus");
        eprintln!(
            "started prometheus (pid {}) on 127.0.0.1:{port}",
            proc.pid()
        );
        Prometheus {
            proc,
            port,
            _dir: dir,
        }
    }

    pub async fn wait_ready(&self) {
        wait_ready(&self.proc, self.port).await;
    }

    /// GET an API path; the `data` of a `success` answer, else the whole answer.
    pub async fn api(&self, path: &str) -> Result<Value, String> {
        let (code, body) = http_get(self.port, path).await?;
        let v: Value = serde_json::from_str(&body)
            .map_err(|e| format!("GET {path}: HTTP {code}, not JSON ({e}): {body}"))?;
        if v["status"] != "success" {
            return Err(format!("GET {path}: HTTP {code}: {body}"));
        }
        Ok(v["data"].clone())
    }

    /// An instant query: the number of samples it returned (a scalar or string
    /// counts as one).
    pub async fn query(&self, expr: &str) -> Result<usize, String> {
        let data = self
            .api(&format!("/api/v1/query?query={}", urlencode(expr)))
            .await?;
        match data["resultType"].as_str() {
            Some("vector") | Some("matrix") => Ok(data["result"].as_array().map_or(0, Vec::len)),
            Some("scalar") | Some("string") => Ok(1),
            other => Err(format!("unexpected resultType {other:?}: {data}")),
        }
    }

    /// A query's result as JSON text (or the error), for failure messages.
    pub async fn query_values(&self, expr: &str) -> String {
        match self
            .api(&format!("/api/v1/query?query={}", urlencode(expr)))
            .await
        {
            Ok(data) => data["result"].to_string(),
            Err(e) => e,
        }
    }

    /// The values of `label`, of series matching `selector` if given.
    pub async fn label_values(
        &self,
        label: &str,
        selector: Option<&str>,
    ) -> Result<Vec<String>, String> {
        let mut path = format!("/api/v1/label/{}/values", urlencode(label));
        if let Some(s) = selector {
            path.push_str(&format!("?match%5B%5D={}", urlencode(s)));
        }
        let data = self.api(&path).await?;
        Ok(data
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect())
    }

    /// Pending and firing alerts.
    pub async fn alerts(&self) -> Result<Vec<PromAlert>, String> {
        let data = self.api("/api/v1/alerts").await?;
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

    /// Every loaded rule: (group, name, type, health, last error).
    pub async fn rules(&self) -> Result<Vec<[String; 5]>, String> {
        let data = self.api("/api/v1/rules").await?;
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
}

// ---------------------------------------------------------------------------------
// The webhook receiver (Alertmanager's receivers point here)
// ---------------------------------------------------------------------------------

/// One alert in one webhook notification.
#[derive(Clone, Debug)]
pub struct NotifiedAlert {
    pub status: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

impl NotifiedAlert {
    pub fn name(&self) -> &str {
        self.labels.get("alertname").map_or("", String::as_str)
    }
    pub fn label(&self, k: &str) -> &str {
        self.labels.get(k).map_or("", String::as_str)
    }
}

/// One POST Alertmanager made.
#[derive(Clone, Debug)]
pub struct Notification {
    pub at: Instant,
    pub path: String,
    pub alerts: Vec<NotifiedAlert>,
}

#[derive(Default)]
struct WebhookLog {
    notifications: Vec<Notification>,
    errors: Vec<String>,
}

/// An HTTP/1.1 server on 127.0.0.1 that records every POST (keep-alive included).
pub struct Webhook {
    pub port: u16,
    t0: Instant,
    log: Arc<Mutex<WebhookLog>>,
    task: tokio::task::JoinHandle<()>,
}

impl Webhook {
    /// Starts it; [`Webhook::render`] shows arrival times relative to `t0`.
    pub async fn start(t0: Instant) -> Webhook {
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

    pub fn notifications(&self) -> Vec<Notification> {
        self.log.lock().expect("webhook log").notifications.clone()
    }

    /// Requests it could not take (not a POST, not JSON, truncated).
    pub fn errors(&self) -> Vec<String> {
        self.log.lock().expect("webhook log").errors.clone()
    }

    /// Every alert that arrived at `path`, with its arrival time.
    pub fn alerts_at(&self, path: &str) -> Vec<(Instant, NotifiedAlert)> {
        self.notifications()
            .into_iter()
            .filter(|n| n.path == path)
            .flat_map(|n| n.alerts.into_iter().map(move |a| (n.at, a)))
            .collect()
    }

    /// One line per notified alert.
    pub fn render(&self) -> String {
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
