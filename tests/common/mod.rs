//! Shared harness for the integration tests that run the real `inboxwatch` binary
//! against the real databases: the agent process, scraping and parsing `/metrics`,
//! polling waits, database helpers, and a TCP proxy that can cut connections.
//!
//! Every test binary includes this module with `mod common;` and uses a different
//! subset of it, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod checks;
pub mod otlp;
pub mod proxy;
pub mod scenarios;
pub mod workload;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs::File;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{MySql, Postgres, Row, Sqlite};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[allow(unused_imports)]
pub use proxy::Proxy;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_inboxwatch");

/// How long to wait for the agent's `/readyz` after spawning it.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------
// Small utilities
// ---------------------------------------------------------------------------------

/// A free TCP port on 127.0.0.1 (bind :0, read the port, release it).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0 to pick a port");
    l.local_addr()
        .expect("local_addr of a bound listener")
        .port()
}

/// A name unique across parallel test processes: `{prefix}_{short}_{pid}_{random}`.
pub fn unique_name(prefix: &str, short: &str) -> String {
    format!(
        "{prefix}_{short}_{}_{:06x}",
        std::process::id(),
        fastrand::u32(..0x00ff_ffff)
    )
}

/// PostgreSQL URL for tests (`INBOXWATCH_TEST_PG`).
pub fn pg_url() -> String {
    std::env::var("INBOXWATCH_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// MariaDB/MySQL URL for tests (`INBOXWATCH_TEST_MYSQL`).
pub fn mysql_url() -> String {
    std::env::var("INBOXWATCH_TEST_MYSQL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_string())
}

/// `host:port` of a `scheme://[user[:pw]@]host:port/db[?..]` URL.
pub fn url_hostport(url: &str) -> String {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let rest = rest.rsplit_once('@').map(|(_, r)| r).unwrap_or(rest);
    rest.split(['/', '?']).next().unwrap_or(rest).to_string()
}

/// The same URL with another `host:port`.
pub fn url_with_hostport(url: &str, hostport: &str) -> String {
    let old = url_hostport(url);
    let (scheme, rest) = url.split_once("://").expect("a database URL has a scheme");
    let (userinfo, after) = match rest.rsplit_once('@') {
        Some((u, a)) => (format!("{u}@"), a),
        None => (String::new(), rest),
    };
    let tail = after.strip_prefix(old.as_str()).unwrap_or(after);
    format!("{scheme}://{userinfo}{hostport}{tail}")
}

/// The same URL with other credentials.
pub fn url_with_user(url: &str, user: &str, password: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a database URL has a scheme");
    let after = rest.rsplit_once('@').map(|(_, a)| a).unwrap_or(rest);
    format!("{scheme}://{user}:{password}@{after}")
}

/// A TOML basic string literal.
pub fn toml_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Remove ANSI colour sequences (the agent's log formatter may emit them).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Polls `check` every 100 ms until it returns `Ok`, or `timeout` passes; the error
/// then carries the last reason `check` gave (typically a diff).
pub async fn wait_until<T, F, Fut>(timeout: Duration, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let started = Instant::now();
    loop {
        let last = match check().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if started.elapsed() >= timeout {
            return Err(format!("timed out after {timeout:?}; last state:\n{last}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Checks `check` every 200 ms for `duration`; the first failure ends it. For
/// "stays true" properties (no double counting on re-reads, the agent keeps running).
pub async fn stays<F, Fut>(duration: Duration, mut check: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let started = Instant::now();
    while started.elapsed() < duration {
        check()
            .await
            .map_err(|e| format!("after {:?}: {e}", started.elapsed()))?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Timestamps: UTC milliseconds since the epoch <-> canonical text
// ---------------------------------------------------------------------------------

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DD HH:MM:SS.mmm` (UTC), the canonical SQLite text format.
pub fn fmt_ts(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let milli = ms.rem_euclid(1000);
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{mo:02}-{d:02} {:02}:{:02}:{:02}.{milli:03}",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// Parses `YYYY-MM-DD[ T]HH:MM:SS[.fraction][Z|+00|+00:00]` (UTC) to milliseconds,
/// truncating sub-millisecond digits.
pub fn parse_ts(s: &str) -> Option<i64> {
    let s = s.trim();
    let s = s
        .strip_suffix("+00:00")
        .or_else(|| s.strip_suffix("+00"))
        .or_else(|| s.strip_suffix('Z'))
        .unwrap_or(s);
    let (date, time) = s.split_once([' ', 'T'])?;
    let mut dp = date.split('-');
    let y: i64 = dp.next()?.parse().ok()?;
    let mo: u32 = dp.next()?.parse().ok()?;
    let d: u32 = dp.next()?.parse().ok()?;
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut tp = hms.split(':');
    let h: i64 = tp.next()?.parse().ok()?;
    let mi: i64 = tp.next()?.parse().ok()?;
    let se: i64 = tp.next()?.parse().ok()?;
    let frac3: String = frac.chars().chain("000".chars()).take(3).collect();
    let milli: i64 = frac3.parse().ok()?;
    Some(((days_from_civil(y, mo, d) * 86_400) + h * 3600 + mi * 60 + se) * 1000 + milli)
}

// ---------------------------------------------------------------------------------
// The agent process
// ---------------------------------------------------------------------------------

/// A running `inboxwatch` process. Killed on drop; if the test is panicking, its
/// stdout/stderr are printed so the failure shows what the agent said.
pub struct Agent {
    child: Child,
    /// The port of its HTTP listener on 127.0.0.1.
    pub port: u16,
    dir: tempfile::TempDir,
    stderr_path: PathBuf,
    stdout_path: PathBuf,
}

impl Agent {
    /// `inboxwatch run --config <tempfile> --listen 127.0.0.1:<free port>`.
    pub fn start(config_toml: &str) -> Agent {
        Self::start_with_env(config_toml, &[])
    }

    /// [`Agent::start`] with extra environment variables (they win over the
    /// harness's own, so `INBOXWATCH_LOG` sets the log filter).
    pub fn start_with_env(config_toml: &str, env: &[(&str, &str)]) -> Agent {
        let dir = tempfile::tempdir().expect("create a temp dir for the agent");
        let config_path = dir.path().join("inboxwatch.toml");
        std::fs::write(&config_path, config_toml).expect("write the agent config");
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        Self::spawn(
            dir,
            port,
            &[
                OsStr::new("run"),
                OsStr::new("--config"),
                config_path.as_os_str(),
                OsStr::new("--listen"),
                OsStr::new(&listen),
            ],
            env,
        )
    }

    /// `inboxwatch demo --listen 127.0.0.1:<free port>` in a fresh working directory.
    pub fn demo() -> Agent {
        let dir = tempfile::tempdir().expect("create a temp dir for the demo");
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        Self::spawn(
            dir,
            port,
            &[
                OsStr::new("demo"),
                OsStr::new("--listen"),
                OsStr::new(&listen),
            ],
            &[],
        )
    }

    fn spawn(dir: tempfile::TempDir, port: u16, args: &[&OsStr], env: &[(&str, &str)]) -> Agent {
        let stderr_path = dir.path().join("agent.stderr");
        let stdout_path = dir.path().join("agent.stdout");
        let stderr = File::create(&stderr_path).expect("create the agent's stderr file");
        let stdout = File::create(&stdout_path).expect("create the agent's stdout file");
        // The agent's log filter: `--log`/INBOXWATCH_LOG (RUST_LOG too, in case).
        let log = std::env::var("INBOXWATCH_TEST_LOG").unwrap_or_else(|_| "info".to_string());
        let child = Command::new(BIN)
            .args(args)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .env("RUST_LOG", &log)
            .env("INBOXWATCH_LOG", &log)
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .spawn()
            .unwrap_or_else(|e| panic!("failed to spawn {BIN}: {e}"));
        Agent {
            child,
            port,
            dir,
            stderr_path,
            stdout_path,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The working directory of the process (the demo keeps its files there).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Everything the agent wrote to stderr so far, without colour codes.
    pub fn stderr(&self) -> String {
        strip_ansi(&String::from_utf8_lossy(
            &std::fs::read(&self.stderr_path).unwrap_or_default(),
        ))
    }

    /// Everything the agent wrote to stdout so far.
    pub fn stdout(&self) -> String {
        strip_ansi(&String::from_utf8_lossy(
            &std::fs::read(&self.stdout_path).unwrap_or_default(),
        ))
    }

    /// `Some(status)` once the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGTERM, then wait up to `timeout` for the process to exit by itself.
    #[allow(dead_code)]
    pub fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// GET `path` on the agent's listener.
    pub async fn get(&self, path: &str) -> Result<(u16, String), String> {
        http_get(self.port, path).await
    }

    /// Polls `/readyz` until 200; panics (printing stderr) on timeout or exit.
    pub async fn wait_ready(&mut self, timeout: Duration) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.exited() {
                panic!("the agent exited with {status} before it became ready");
            }
            let last = match self.get("/readyz").await {
                Ok((200, _)) => return,
                Ok((code, body)) => format!("/readyz answered {code}: {body}"),
                Err(e) => e,
            };
            if started.elapsed() > timeout {
                panic!("the agent was not ready within {timeout:?}; last answer: {last}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// GET /metrics and parse it.
    pub async fn try_scrape(&self) -> Result<Metrics, String> {
        let (code, body) = self.get("/metrics").await?;
        if code != 200 {
            return Err(format!("/metrics answered {code}: {body}"));
        }
        Metrics::parse(&body)
    }

    /// GET /metrics and parse it; panics if that fails.
    pub async fn scrape(&self) -> Metrics {
        match self.try_scrape().await {
            Ok(m) => m,
            Err(e) => panic!("scraping the agent failed: {e}"),
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let tail = |s: String| {
                const MAX: usize = 120_000;
                if s.len() > MAX {
                    let cut = s.len() - MAX;
                    let cut = (cut..s.len())
                        .find(|i| s.is_char_boundary(*i))
                        .unwrap_or(cut);
                    format!("[... {cut} bytes cut ...]\n{}", &s[cut..])
                } else {
                    s
                }
            };
            eprintln!(
                "----- agent stderr (port {}) -----\n{}\n----- agent stdout -----\n{}\n----- end of agent output -----",
                self.port,
                tail(self.stderr()),
                tail(self.stdout())
            );
        }
    }
}

/// A minimal HTTP/1.1 GET against 127.0.0.1:`port` (5 s timeout). Returns the status
/// code and the body (de-chunked).
pub async fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    http_get_accepting(port, path, "text/plain").await
}

/// [`http_get`] with another `Accept` header (Alertmanager's v2 API wants JSON).
#[allow(dead_code)]
pub async fn http_get_accepting(
    port: u16,
    path: &str,
    accept: &str,
) -> Result<(u16, String), String> {
    let exchange = async {
        let mut s = TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("connect 127.0.0.1:{port}: {e}"))?;
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| format!("write request: {e}"))?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)
            .await
            .map_err(|e| format!("read response: {e}"))?;
        Ok::<_, String>(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| format!("GET {path} timed out after 5s"))??;
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no end of headers in {} bytes", buf.len()))?;
    let head = String::from_utf8_lossy(&buf[..split]).to_string();
    let body = &buf[split + 4..];
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default();
    let code: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok((code, String::from_utf8_lossy(&body).to_string()))
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("truncated chunk size line")?;
        let size_txt = String::from_utf8_lossy(&b[..eol]).to_string();
        let size = usize::from_str_radix(size_txt.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|e| format!("bad chunk size {size_txt:?}: {e}"))?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if b.len() < size {
            return Err("truncated chunk".into());
        }
        out.extend_from_slice(&b[..size]);
        b = b.get(size + 2..).unwrap_or(&[]);
    }
}

// ---------------------------------------------------------------------------------
// Prometheus text format
// ---------------------------------------------------------------------------------

/// One sample line.
#[derive(Clone, Debug)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    /// `name{a="b",...}`
    pub fn series(&self) -> String {
        series_name(
            &self.name,
            self.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        )
    }
}

/// `name{a="b",...}` for messages.
pub fn series_name<'a>(name: &str, labels: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let l: Vec<String> = labels
        .into_iter()
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect();
    if l.is_empty() {
        name.to_string()
    } else {
        format!("{name}{{{}}}", l.join(","))
    }
}

/// Whether a sample's label `key` equals `want`. `le` and `quantile` compare as numbers,
/// so `1` matches `1.0` and `0.5` matches `0.50`.
pub fn label_matches(key: &str, have: &str, want: &str) -> bool {
    if have == want {
        return true;
    }
    if (key == "le" || key == "quantile")
        && let (Some(a), Some(b)) = (parse_value(have), parse_value(want))
    {
        return a == b;
    }
    false
}

/// A parsed scrape.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub samples: Vec<Sample>,
    pub text: String,
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" | "inf" | "+inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" | "nan" => Some(f64::NAN),
        s => f64::from_str(s).ok(),
    }
}

impl Metrics {
    /// Parses the Prometheus text exposition format (comments skipped).
    pub fn parse(text: &str) -> Result<Metrics, String> {
        let mut samples = Vec::new();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            samples
                .push(Self::parse_line(line).map_err(|e| format!("line {}: {e}: {raw:?}", n + 1))?);
        }
        Ok(Metrics {
            samples,
            text: text.to_string(),
        })
    }

    fn parse_line(line: &str) -> Result<Sample, String> {
        let name_end = line
            .find(|c: char| c == '{' || c.is_whitespace())
            .ok_or("no value")?;
        let name = line[..name_end].to_string();
        let mut rest = &line[name_end..];
        let mut labels = BTreeMap::new();
        if let Some(r) = rest.strip_prefix('{') {
            let mut chars = r.char_indices().peekable();
            let close;
            loop {
                while let Some((_, c)) = chars.peek() {
                    if *c == ',' || c.is_whitespace() {
                        chars.next();
                    } else {
                        break;
                    }
                }
                let (i, c) = chars.next().ok_or("unterminated labels")?;
                if c == '}' {
                    close = i;
                    break;
                }
                let mut key = String::from(c);
                loop {
                    let (_, c) = chars.next().ok_or("unterminated label name")?;
                    if c == '=' {
                        break;
                    }
                    key.push(c);
                }
                if chars.next().map(|(_, c)| c) != Some('"') {
                    return Err(format!("label {key} value is not quoted"));
                }
                let mut val = String::new();
                loop {
                    let (_, c) = chars.next().ok_or("unterminated label value")?;
                    match c {
                        '\\' => match chars.next().map(|(_, c)| c) {
                            Some('n') => val.push('\n'),
                            Some(c) => val.push(c),
                            None => return Err("dangling escape".into()),
                        },
                        '"' => break,
                        c => val.push(c),
                    }
                }
                labels.insert(key.trim().to_string(), val);
            }
            rest = &r[close + 1..];
        }
        let value_txt = rest.split_whitespace().next().ok_or("no value")?;
        let value = parse_value(value_txt).ok_or_else(|| format!("bad value {value_txt:?}"))?;
        Ok(Sample {
            name,
            labels,
            value,
        })
    }

    /// Every sample named `name` whose labels include all of `labels`.
    pub fn series<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels.iter().all(|(k, v)| {
                    s.labels
                        .get(*k)
                        .is_some_and(|have| label_matches(k, have, v))
                })
        })
    }

    /// The first sample named `name` whose labels include all of `labels`.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.series(name, labels).next().map(|s| s.value)
    }

    /// The sum over every sample named `name` whose labels include all of `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.series(name, labels).map(|s| s.value).sum()
    }

    /// Distinct sample names.
    pub fn names(&self) -> BTreeSet<&str> {
        self.samples.iter().map(|s| s.name.as_str()).collect()
    }
}

// ---------------------------------------------------------------------------------
// Databases
// ---------------------------------------------------------------------------------

/// The three SQL dialects the agent supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Postgres,
    Mysql,
    Sqlite,
}

impl Dialect {
    /// The value of `inboxwatch schema --dialect`.
    pub fn cli_name(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgres",
            Dialect::Mysql => "mysql",
            Dialect::Sqlite => "sqlite",
        }
    }

    /// The type to CAST to for text results.
    pub fn text_type(self) -> &'static str {
        match self {
            Dialect::Postgres => "text",
            Dialect::Mysql => "CHAR",
            Dialect::Sqlite => "TEXT",
        }
    }

    /// The timestamp text this dialect's column accepts, for `ms`.
    pub fn ts_text(self, ms: i64) -> String {
        match self {
            Dialect::Postgres => format!("{}+00", fmt_ts(ms)),
            Dialect::Mysql | Dialect::Sqlite => fmt_ts(ms),
        }
    }

    /// Renders a statement template: `{ts}` is a timestamp parameter (bound as text by
    /// [`Dialect::ts_text`]), `?` any other parameter, `{text}` the text cast type.
    pub fn render(self, template: &str) -> String {
        let ts = match self {
            Dialect::Postgres => "CAST(? AS timestamptz)",
            Dialect::Mysql => "CAST(? AS DATETIME(6))",
            Dialect::Sqlite => "?",
        };
        let sql = template
            .replace("{ts}", ts)
            .replace("{text}", self.text_type());
        if self != Dialect::Postgres {
            return sql;
        }
        let mut out = String::with_capacity(sql.len() + 16);
        let mut n = 0;
        for c in sql.chars() {
            if c == '?' {
                n += 1;
                out.push_str(&format!("${n}"));
            } else {
                out.push(c);
            }
        }
        out
    }
}

/// A bound parameter.
#[derive(Clone, Debug)]
pub enum V {
    Text(String),
    Int(i32),
    /// NULL, typed as text.
    Null,
}

impl V {
    pub fn text(s: impl Into<String>) -> V {
        V::Text(s.into())
    }
    pub fn opt_text(s: Option<impl Into<String>>) -> V {
        s.map_or(V::Null, |s| V::Text(s.into()))
    }
}

macro_rules! bind_all {
    ($db:ty, $sql:expr, $args:expr) => {{
        let mut q = sqlx::query::<$db>(sqlx::AssertSqlSafe($sql.to_string()));
        for a in $args.iter() {
            q = match a {
                V::Text(s) => q.bind(s.clone()),
                V::Int(i) => q.bind(*i),
                V::Null => q.bind(None::<String>),
            };
        }
        q
    }};
}

fn rows_to_text<R: Row>(rows: Vec<R>) -> Result<Vec<Vec<Option<String>>>, sqlx::Error>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    rows.iter()
        .map(|r| {
            (0..r.len())
                .map(|i| r.try_get::<Option<String>, _>(i))
                .collect()
        })
        .collect()
}

/// A connection pool of one of the three dialects.
#[derive(Clone, Debug)]
pub enum Pool {
    Pg(sqlx::PgPool),
    My(sqlx::MySqlPool),
    Lite(sqlx::SqlitePool),
}

impl Pool {
    /// Runs one statement (an already rendered one).
    pub async fn execute(&self, sql: &str, args: &[V]) -> Result<u64, sqlx::Error> {
        Ok(match self {
            Pool::Pg(p) => bind_all!(Postgres, sql, args)
                .execute(p)
                .await?
                .rows_affected(),
            Pool::My(p) => bind_all!(MySql, sql, args)
                .execute(p)
                .await?
                .rows_affected(),
            Pool::Lite(p) => bind_all!(Sqlite, sql, args)
                .execute(p)
                .await?
                .rows_affected(),
        })
    }

    /// Runs a query whose every column is text (CAST it) or NULL.
    pub async fn fetch_text(
        &self,
        sql: &str,
        args: &[V],
    ) -> Result<Vec<Vec<Option<String>>>, sqlx::Error> {
        match self {
            Pool::Pg(p) => rows_to_text(bind_all!(Postgres, sql, args).fetch_all(p).await?),
            Pool::My(p) => rows_to_text(bind_all!(MySql, sql, args).fetch_all(p).await?),
            Pool::Lite(p) => rows_to_text(bind_all!(Sqlite, sql, args).fetch_all(p).await?),
        }
    }

    /// Runs a script (several `;`-separated statements) unprepared.
    pub async fn raw(&self, sql: &str) -> Result<(), sqlx::Error> {
        let sql = sqlx::AssertSqlSafe(sql.to_string());
        match self {
            Pool::Pg(p) => sqlx::raw_sql(sql).execute(p).await.map(drop),
            Pool::My(p) => sqlx::raw_sql(sql).execute(p).await.map(drop),
            Pool::Lite(p) => sqlx::raw_sql(sql).execute(p).await.map(drop),
        }
    }

    /// A dedicated connection (for a writer that holds a transaction open).
    pub async fn acquire(&self) -> Conn {
        match self {
            Pool::Pg(p) => Conn::Pg(p.acquire().await.expect("acquire a PostgreSQL connection")),
            Pool::My(p) => Conn::My(p.acquire().await.expect("acquire a MariaDB connection")),
            Pool::Lite(p) => Conn::Lite(p.acquire().await.expect("acquire an SQLite connection")),
        }
    }
}

/// One dedicated connection.
pub enum Conn {
    Pg(PoolConnection<Postgres>),
    My(PoolConnection<MySql>),
    Lite(PoolConnection<Sqlite>),
}

impl Conn {
    /// Runs one statement (an already rendered one).
    pub async fn execute(&mut self, sql: &str, args: &[V]) -> Result<u64, sqlx::Error> {
        Ok(match self {
            Conn::Pg(c) => bind_all!(Postgres, sql, args)
                .execute(&mut **c)
                .await?
                .rows_affected(),
            Conn::My(c) => bind_all!(MySql, sql, args)
                .execute(&mut **c)
                .await?
                .rows_affected(),
            Conn::Lite(c) => bind_all!(Sqlite, sql, args)
                .execute(&mut **c)
                .await?
                .rows_affected(),
        })
    }

    /// Runs an unprepared statement such as BEGIN or COMMIT.
    pub async fn raw(&mut self, sql: &'static str) -> Result<(), sqlx::Error> {
        match self {
            Conn::Pg(c) => sqlx::raw_sql(sql).execute(&mut **c).await.map(drop),
            Conn::My(c) => sqlx::raw_sql(sql).execute(&mut **c).await.map(drop),
            Conn::Lite(c) => sqlx::raw_sql(sql).execute(&mut **c).await.map(drop),
        }
    }
}

/// The inbox and outbox table names of one test.
#[derive(Clone, Debug)]
pub struct Tables {
    pub inbox: String,
    pub outbox: String,
}

/// A database for one test: a pool, the DSN the agent should use, and everything the
/// test created there (dropped by [`Db::cleanup`], or on drop as a fallback).
pub struct Db {
    pub dialect: Dialect,
    pub pool: Pool,
    /// The DSN for the agent's config.
    pub dsn: String,
    tables: Mutex<Vec<String>>,
    roles: Mutex<Vec<String>>,
    dir: Option<tempfile::TempDir>,
}

impl Db {
    pub async fn postgres() -> Db {
        let dsn = pg_url();
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(30))
            .connect(&dsn)
            .await
            .unwrap_or_else(|e| panic!("connect to PostgreSQL at {dsn} (INBOXWATCH_TEST_PG): {e}"));
        Self::new(Dialect::Postgres, Pool::Pg(pool), dsn, None)
    }

    pub async fn mysql() -> Db {
        let dsn = mysql_url();
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(30))
            .connect(&dsn)
            .await
            .unwrap_or_else(|e| panic!("connect to MariaDB at {dsn} (INBOXWATCH_TEST_MYSQL): {e}"));
        Self::new(Dialect::Mysql, Pool::My(pool), dsn, None)
    }

    /// A fresh SQLite file in a temp dir, in WAL mode so that the agent's reads and
    /// the workload's writes do not block each other.
    pub async fn sqlite() -> Db {
        use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
        let dir = tempfile::tempdir().expect("temp dir for the SQLite database");
        let path = dir.path().join("inbox.db");
        let opts = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(30));
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(opts)
            .await
            .unwrap_or_else(|e| panic!("open SQLite at {}: {e}", path.display()));
        let dsn = format!("sqlite://{}", path.display());
        Self::new(Dialect::Sqlite, Pool::Lite(pool), dsn, Some(dir))
    }

    fn new(dialect: Dialect, pool: Pool, dsn: String, dir: Option<tempfile::TempDir>) -> Db {
        Db {
            dialect,
            pool,
            dsn,
            tables: Mutex::new(Vec::new()),
            roles: Mutex::new(Vec::new()),
            dir,
        }
    }

    /// Renders a template for this dialect (see [`Dialect::render`]).
    pub fn sql(&self, template: &str) -> String {
        self.dialect.render(template)
    }

    /// Renders and runs one statement; panics with the SQL on error.
    pub async fn exec(&self, template: &str, args: &[V]) -> u64 {
        let sql = self.sql(template);
        self.pool
            .execute(&sql, args)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Renders and runs a query whose columns are all text; panics with the SQL on error.
    pub async fn query(&self, template: &str, args: &[V]) -> Vec<Vec<Option<String>>> {
        let sql = self.sql(template);
        self.pool
            .fetch_text(&sql, args)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// The database clock, UTC, in milliseconds (truncated).
    pub async fn now_ms(&self) -> i64 {
        let q = match self.dialect {
            Dialect::Postgres => {
                "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')"
            }
            Dialect::Mysql => "SELECT CAST(UTC_TIMESTAMP(6) AS CHAR)",
            Dialect::Sqlite => "SELECT strftime('%Y-%m-%d %H:%M:%f','now')",
        };
        let rows = self.query(q, &[]).await;
        let txt = rows
            .first()
            .and_then(|r| r.first().cloned().flatten())
            .expect("the clock query returns one value");
        parse_ts(&txt).unwrap_or_else(|| panic!("cannot parse the database clock {txt:?}"))
    }

    /// Remembers a table to drop at cleanup.
    pub fn register_table(&self, name: &str) {
        self.tables
            .lock()
            .expect("tables lock")
            .push(name.to_string());
    }

    /// Remembers a PostgreSQL role (or a MariaDB user, at `%`, `localhost` and
    /// `127.0.0.1`) to drop at cleanup.
    pub fn register_role(&self, name: &str) {
        self.roles
            .lock()
            .expect("roles lock")
            .push(name.to_string());
    }

    /// Creates fresh, uniquely named inbox and outbox tables from the binary's
    /// `schema` output; falls back to the contract's DDL if the subcommand is not
    /// usable yet (with a warning on stderr).
    pub async fn fresh_tables(&self, short: &str) -> Tables {
        let tables = Tables {
            inbox: unique_name("inbox", short),
            outbox: unique_name("outbox", short),
        };
        self.register_table(&tables.inbox);
        self.register_table(&tables.outbox);
        let out = Command::new(BIN)
            .args([
                "schema",
                "--dialect",
                self.dialect.cli_name(),
                "--table",
                &tables.inbox,
                "--outbox-table",
                &tables.outbox,
            ])
            .output();
        let ddl = match out {
            Ok(o) if o.status.success() && !o.stdout.is_empty() => {
                Some(String::from_utf8_lossy(&o.stdout).to_string())
            }
            Ok(o) => {
                eprintln!(
                    "note: `inboxwatch schema` is not usable ({}; stderr: {}); using the contract DDL",
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("note: cannot run `inboxwatch schema` ({e}); using the contract DDL");
                None
            }
        };
        if let Some(ddl) = ddl {
            match self.pool.raw(&ddl).await {
                Ok(()) => {}
                Err(e) => {
                    // MariaDB may refuse multi-statement text; retry one statement at a time.
                    let mut failed = Some(e);
                    if self.dialect == Dialect::Mysql {
                        failed = None;
                        for stmt in split_statements(&ddl) {
                            if let Err(e) = self.pool.raw(&stmt).await {
                                failed = Some(e);
                                break;
                            }
                        }
                    }
                    if let Some(e) = failed {
                        eprintln!(
                            "WARNING (agent bug?): the DDL printed by `inboxwatch schema --dialect {}` does not execute: {e}\n{ddl}\nFalling back to the contract DDL.",
                            self.dialect.cli_name()
                        );
                        self.contract_ddl(&tables).await;
                    }
                }
            }
        } else {
            self.contract_ddl(&tables).await;
        }
        tables
    }

    async fn contract_ddl(&self, t: &Tables) {
        for stmt in split_statements(&contract_ddl(self.dialect, &t.inbox, &t.outbox)) {
            self.pool
                .raw(&stmt)
                .await
                .unwrap_or_else(|e| panic!("contract DDL failed: {stmt}: {e}"));
        }
    }

    /// Drops every table and role this test registered.
    pub async fn cleanup(&self) {
        let tables = std::mem::take(&mut *self.tables.lock().expect("tables lock"));
        let roles = std::mem::take(&mut *self.roles.lock().expect("roles lock"));
        for stmt in cleanup_statements(self.dialect, &tables, &roles) {
            if let Err(e) = self.pool.raw(&stmt).await {
                eprintln!("cleanup: {stmt}: {e}");
            }
        }
    }
}

fn cleanup_statements(dialect: Dialect, tables: &[String], roles: &[String]) -> Vec<String> {
    let mut out: Vec<String> = tables
        .iter()
        .map(|t| format!("DROP TABLE IF EXISTS {t}"))
        .collect();
    for r in roles {
        match dialect {
            Dialect::Postgres => {
                out.push(format!("DROP OWNED BY {r}"));
                out.push(format!("DROP ROLE IF EXISTS {r}"));
            }
            Dialect::Mysql => out.extend(
                ["%", "localhost", "127.0.0.1"]
                    .map(|host| format!("DROP USER IF EXISTS '{r}'@'{host}'")),
            ),
            Dialect::Sqlite => {}
        }
    }
    out
}

impl Drop for Db {
    /// Best effort when a test panicked before its explicit cleanup: a fresh
    /// connection on a separate thread (the test's runtime may be unwinding).
    fn drop(&mut self) {
        let tables = std::mem::take(&mut *self.tables.lock().unwrap_or_else(|e| e.into_inner()));
        let roles = std::mem::take(&mut *self.roles.lock().unwrap_or_else(|e| e.into_inner()));
        if self.dialect == Dialect::Sqlite || (tables.is_empty() && roles.is_empty()) {
            return;
        }
        let stmts = cleanup_statements(self.dialect, &tables, &roles);
        let dialect = self.dialect;
        let dsn = self.dsn.clone();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let pool = match dialect {
                    Dialect::Postgres => sqlx::PgPool::connect(&dsn).await.map(Pool::Pg),
                    _ => sqlx::MySqlPool::connect(&dsn).await.map(Pool::My),
                };
                if let Ok(pool) = pool {
                    for s in stmts {
                        let _ = pool.raw(&s).await;
                    }
                }
            });
        })
        .join();
        drop(self.dir.take());
    }
}

/// Splits a DDL script on `;` at line ends, dropping comment-only pieces.
pub fn split_statements(ddl: &str) -> Vec<String> {
    ddl.split(';')
        .map(|s| {
            s.lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n")
                .trim()
                .to_string()
        })
        .filter(|s| !s.is_empty())
        .collect()
}

/// The DDL from the contract (used only while `inboxwatch schema` is not usable).
pub fn contract_ddl(dialect: Dialect, inbox: &str, outbox: &str) -> String {
    match dialect {
        Dialect::Postgres => format!(
            "CREATE TABLE IF NOT EXISTS {inbox} (event_id text PRIMARY KEY, event_type text, status text NOT NULL, \
             received_at timestamptz NOT NULL, started_at timestamptz, finished_at timestamptz, \
             attempts integer NOT NULL DEFAULT 0, deliveries integer NOT NULL DEFAULT 1, last_error text, \
             traceparent text, updated_at timestamptz NOT NULL);\n\
             CREATE INDEX IF NOT EXISTS {inbox}_updated_at_idx ON {inbox} (updated_at);\n\
             CREATE INDEX IF NOT EXISTS {inbox}_unfinished_idx ON {inbox} (received_at) WHERE status IN ('pending','processing','failed');\n\
             CREATE TABLE IF NOT EXISTS {outbox} (event_id text PRIMARY KEY, event_type text, created_at timestamptz NOT NULL, \
             published_at timestamptz, traceparent text, updated_at timestamptz NOT NULL);\n\
             CREATE INDEX IF NOT EXISTS {outbox}_updated_at_idx ON {outbox} (updated_at);\n\
             CREATE INDEX IF NOT EXISTS {outbox}_unpublished_idx ON {outbox} (created_at) WHERE published_at IS NULL;\n"
        ),
        Dialect::Mysql => format!(
            "CREATE TABLE IF NOT EXISTS {inbox} (event_id VARCHAR(191) NOT NULL PRIMARY KEY, event_type VARCHAR(191), \
             status VARCHAR(32) NOT NULL, received_at DATETIME(6) NOT NULL, started_at DATETIME(6) NULL, \
             finished_at DATETIME(6) NULL, attempts INT NOT NULL DEFAULT 0, deliveries INT NOT NULL DEFAULT 1, \
             last_error MEDIUMTEXT, traceparent VARCHAR(64), updated_at DATETIME(6) NOT NULL, \
             INDEX {inbox}_updated_at_idx (updated_at), INDEX {inbox}_unfinished_idx (status, received_at));\n\
             CREATE TABLE IF NOT EXISTS {outbox} (event_id VARCHAR(191) NOT NULL PRIMARY KEY, event_type VARCHAR(191), \
             created_at DATETIME(6) NOT NULL, published_at DATETIME(6) NULL, traceparent VARCHAR(64), \
             updated_at DATETIME(6) NOT NULL, INDEX {outbox}_updated_at_idx (updated_at), \
             INDEX {outbox}_unpublished_idx (published_at, created_at));\n"
        ),
        Dialect::Sqlite => format!(
            "CREATE TABLE IF NOT EXISTS {inbox} (event_id TEXT PRIMARY KEY, event_type TEXT, status TEXT NOT NULL, \
             received_at TEXT NOT NULL, started_at TEXT, finished_at TEXT, attempts INTEGER NOT NULL DEFAULT 0, \
             deliveries INTEGER NOT NULL DEFAULT 1, last_error TEXT, traceparent TEXT, updated_at TEXT NOT NULL);\n\
             CREATE INDEX IF NOT EXISTS {inbox}_updated_at_idx ON {inbox} (updated_at);\n\
             CREATE INDEX IF NOT EXISTS {inbox}_unfinished_idx ON {inbox} (received_at) WHERE status IN ('pending','processing','failed');\n\
             CREATE TABLE IF NOT EXISTS {outbox} (event_id TEXT PRIMARY KEY, event_type TEXT, created_at TEXT NOT NULL, \
             published_at TEXT, traceparent TEXT, updated_at TEXT NOT NULL);\n\
             CREATE INDEX IF NOT EXISTS {outbox}_updated_at_idx ON {outbox} (updated_at);\n\
             CREATE INDEX IF NOT EXISTS {outbox}_unpublished_idx ON {outbox} (created_at) WHERE published_at IS NULL;\n"
        ),
    }
}
