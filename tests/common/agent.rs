//! The binary under test, the one way every test runs it: [`Cmd`] runs a subcommand
//! to completion (`check-config`, `schema`, `doctor`, `lookup`, `metrics`, …) and
//! returns its exit code and output; [`Agent`] is a long-running `inboxwatch run` or
//! `demo` with its listener on a free port, scraped over HTTP, stopped with SIGTERM
//! or SIGKILL.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use super::process::Proc;
use super::{Metrics, free_port, http_get, wait_until};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_inboxwatch");

/// How long to wait for the agent's `/readyz` after spawning it.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long past its `min` a wait for polls gives a stalled agent before failing
/// ([`Agent::wait_polls`], [`Agent::wait_for_polls`]).
pub const POLLS_CAP: Duration = Duration::from_secs(300);

/// How long a [`Cmd`] may run unless it says otherwise.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------
// One run to completion
// ---------------------------------------------------------------------------------

/// A command line of the binary: arguments, environment changes, working directory.
#[derive(Clone, Debug)]
pub struct Cmd {
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    env_remove: Vec<OsString>,
    dir: Option<PathBuf>,
    timeout: Duration,
}

impl Cmd {
    /// `inboxwatch <args>`.
    pub fn new<I, S>(args: I) -> Cmd
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Cmd {
            args: args.into_iter().map(|a| a.as_ref().to_owned()).collect(),
            env: Vec::new(),
            env_remove: Vec::new(),
            dir: None,
            timeout: RUN_TIMEOUT,
        }
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Cmd {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Cmd {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    pub fn envs<I, K, V>(mut self, vars: I) -> Cmd
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        for (k, v) in vars {
            self = self.env(k, v);
        }
        self
    }

    /// Removes a variable from the child's environment (after the test's own).
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Cmd {
        self.env_remove.push(key.as_ref().to_owned());
        self
    }

    pub fn current_dir(mut self, dir: impl AsRef<Path>) -> Cmd {
        self.dir = Some(dir.as_ref().to_owned());
        self
    }

    /// How long [`Cmd::output`] waits before it kills the process and fails the test.
    pub fn timeout(mut self, timeout: Duration) -> Cmd {
        self.timeout = timeout;
        self
    }

    /// The `std::process::Command` (no stdio set): removals first, so that a
    /// variable removed and then set is set.
    fn command(&self) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(&self.args).env("NO_COLOR", "1");
        for k in &self.env_remove {
            cmd.env_remove(k);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(dir) = &self.dir {
            cmd.current_dir(dir);
        }
        cmd
    }

    fn describe(&self) -> String {
        let args: Vec<_> = self.args.iter().map(|a| a.to_string_lossy()).collect();
        format!("inboxwatch {}", args.join(" "))
    }

    /// Runs it to completion: exit status, stdout and stderr. Panics if it cannot be
    /// started, or has not exited within the timeout (it is killed then).
    pub fn output(&self) -> Outcome {
        let dir = tempfile::tempdir().expect("a temp dir for the command's output");
        let what = self.describe();
        let proc = Proc::spawn(&what, &mut self.command(), dir.path(), "out");
        let Some(status) = proc.wait_exit(self.timeout) else {
            proc.kill();
            panic!(
                "`{what}` did not exit within {:?}\n{}",
                self.timeout,
                proc.output_tail()
            );
        };
        Outcome {
            status,
            code: status.code(),
            stdout: proc.stdout(),
            stderr: proc.stderr(),
        }
    }
}

/// How one run of the binary ended and what it printed.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub status: ExitStatus,
    /// The exit code (`None` when a signal ended it).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl From<std::process::Output> for Outcome {
    fn from(out: std::process::Output) -> Outcome {
        Outcome {
            status: out.status,
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

impl Outcome {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Exit code, stdout and stderr, for failure messages.
    pub fn describe(&self) -> String {
        format!(
            "exit code {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// `inboxwatch <args>` run to completion with the default timeout.
pub fn run<I, S>(args: I) -> Outcome
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Cmd::new(args).output()
}

/// The DDL `inboxwatch schema --dialect <dialect> --table <inbox> [--outbox-table
/// <outbox>]` prints; panics (with its output) unless it exits 0.
pub fn schema_ddl(dialect: &str, inbox: &str, outbox: Option<&str>) -> String {
    let mut cmd = Cmd::new(["schema", "--dialect", dialect, "--table", inbox]);
    if let Some(outbox) = outbox {
        cmd = cmd.arg("--outbox-table").arg(outbox);
    }
    let out = cmd.output();
    assert_eq!(
        out.code,
        Some(0),
        "`{}` failed\n{}",
        cmd.describe(),
        out.describe()
    );
    out.stdout
}

// ---------------------------------------------------------------------------------
// The long-running agent
// ---------------------------------------------------------------------------------

/// The config an agent runs on.
enum Config {
    /// Written to `inboxwatch.toml` in the agent's own directory.
    Text(String),
    /// An existing file (several agents sharing one).
    File(PathBuf),
    /// `inboxwatch demo` and these arguments: no config.
    Demo(Vec<OsString>),
}

/// How to start an [`Agent`]: [`Agent::run`], [`Agent::run_file`], then environment,
/// listener port, working directory, name; [`AgentBuilder::start`] spawns it.
pub struct AgentBuilder {
    config: Config,
    cmd: Cmd,
    port: Option<u16>,
    host: Option<String>,
    dir: Option<PathBuf>,
    name: Option<String>,
}

impl AgentBuilder {
    /// An extra environment variable (it wins over the harness's own, so
    /// `INBOXWATCH_LOG` sets the log filter).
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.cmd = self.cmd.env(key, value);
        self
    }

    pub fn envs<I, K, V>(mut self, vars: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        self.cmd = self.cmd.envs(vars);
        self
    }

    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Self {
        self.cmd = self.cmd.env_remove(key);
        self
    }

    /// Listen on this port (default: a free one).
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Listen on this address instead of 127.0.0.1 (e.g. `0.0.0.0`, which the
    /// harness still reaches on 127.0.0.1).
    pub fn host(mut self, host: &str) -> Self {
        self.host = Some(host.to_string());
        self
    }

    /// Run in this (existing) directory, writing `{name}.stdout`/`.stderr` there,
    /// instead of a fresh temp dir of its own.
    pub fn dir(mut self, dir: &Path) -> Self {
        self.dir = Some(dir.to_owned());
        self
    }

    /// What failure messages call it (default `agent`); also the stem of its output files.
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// Spawns it: `inboxwatch run --config <file> --listen 127.0.0.1:<port>` (or
    /// `demo --listen …`), log filter `INBOXWATCH_TEST_LOG` (default `info`).
    pub fn start(self) -> Agent {
        let (own_dir, dir) = match self.dir {
            Some(d) => (None, d),
            None => {
                let t = tempfile::tempdir().expect("create a temp dir for the agent");
                let p = t.path().to_owned();
                (Some(t), p)
            }
        };
        let port = self.port.unwrap_or_else(free_port);
        let host = self.host.unwrap_or_else(|| "127.0.0.1".to_string());
        let listen = format!("{host}:{port}");
        let name = self.name.unwrap_or_else(|| "agent".to_string());
        let args: Vec<OsString> = match self.config {
            Config::Text(toml) => {
                let path = dir.join("inboxwatch.toml");
                std::fs::write(&path, toml).expect("write the agent config");
                run_args(&path, &listen)
            }
            Config::File(path) => run_args(&path, &listen),
            Config::Demo(extra) => ["demo", "--listen", &listen]
                .map(OsString::from)
                .into_iter()
                .chain(extra)
                .collect(),
        };
        // The agent's log filter: `--log`/INBOXWATCH_LOG (RUST_LOG too, in case).
        let log = std::env::var("INBOXWATCH_TEST_LOG").unwrap_or_else(|_| "info".to_string());
        let mut cmd = Cmd::new(args)
            .env("RUST_LOG", &log)
            .env("INBOXWATCH_LOG", &log);
        cmd.env.extend(self.cmd.env);
        cmd.env_remove = self.cmd.env_remove;
        let mut command = cmd.current_dir(&dir).command();
        let label = format!("{name} (port {port})");
        let proc = Proc::spawn(&label, &mut command, &dir, &name);
        Agent {
            proc,
            port,
            dir,
            _own_dir: own_dir,
        }
    }
}

fn run_args(config: &Path, listen: &str) -> Vec<OsString> {
    vec![
        "run".into(),
        "--config".into(),
        config.as_os_str().to_owned(),
        "--listen".into(),
        listen.into(),
    ]
}

/// A running `inboxwatch` process. Killed on drop; if the test is panicking, its
/// stderr/stdout are printed so the failure shows what the agent said.
pub struct Agent {
    // Dropped before the directory that holds its output files.
    proc: Proc,
    /// The port of its HTTP listener on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
    _own_dir: Option<tempfile::TempDir>,
}

impl Agent {
    /// `inboxwatch run --config <tempfile> --listen 127.0.0.1:<free port>`.
    pub fn start(config_toml: &str) -> Agent {
        Self::run(config_toml).start()
    }

    /// [`Agent::start`] with extra environment variables (they win over the
    /// harness's own, so `INBOXWATCH_LOG` sets the log filter).
    pub fn start_with_env(config_toml: &str, env: &[(&str, &str)]) -> Agent {
        Self::run(config_toml).envs(env.iter().copied()).start()
    }

    /// `inboxwatch demo --listen 127.0.0.1:<free port>` in a fresh working directory.
    pub fn demo() -> Agent {
        Self::builder(Config::Demo(Vec::new())).start()
    }

    /// `inboxwatch demo --listen 127.0.0.1:<free port> ARGS…`, to be configured
    /// further and started.
    pub fn demo_with(args: &[&str]) -> AgentBuilder {
        Self::builder(Config::Demo(args.iter().map(OsString::from).collect()))
    }

    /// `inboxwatch run` on `config_toml`, to be configured further and started.
    pub fn run(config_toml: &str) -> AgentBuilder {
        Self::builder(Config::Text(config_toml.to_string()))
    }

    /// `inboxwatch run` on an existing config file.
    pub fn run_file(config: &Path) -> AgentBuilder {
        Self::builder(Config::File(config.to_owned()))
    }

    fn builder(config: Config) -> AgentBuilder {
        AgentBuilder {
            config,
            cmd: Cmd::new(Vec::<OsString>::new()),
            port: None,
            host: None,
            dir: None,
            name: None,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// The working directory of the process (the demo keeps its files there; a
    /// config given as text is `inboxwatch.toml` there).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Everything the agent wrote to stderr so far, without colour codes.
    pub fn stderr(&self) -> String {
        self.proc.stderr()
    }

    /// Everything the agent wrote to stdout so far.
    pub fn stdout(&self) -> String {
        self.proc.stdout()
    }

    /// `Some(status)` once the process has exited.
    pub fn exited(&self) -> Option<ExitStatus> {
        self.proc.exited()
    }

    /// SIGTERM, then wait up to `timeout` for the process to exit by itself.
    pub fn terminate(&self, timeout: Duration) -> Option<ExitStatus> {
        self.proc.terminate(timeout)
    }

    /// Sends SIGTERM and returns at once: the moment just before the signal.
    pub fn sigterm(&self) -> Instant {
        let at = Instant::now();
        self.proc.signal("-TERM");
        at
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&self, timeout: Duration) -> Option<ExitStatus> {
        self.proc.wait_exit(timeout)
    }

    /// SIGKILL (`kill -9`) and reap: the moment just before the signal.
    pub fn sigkill(&self) -> Instant {
        let at = Instant::now();
        self.proc.signal("-9");
        self.proc.wait_exit(Duration::from_secs(30));
        at
    }

    /// SIGKILL and reap, if it still runs.
    pub fn kill(&self) {
        self.proc.kill();
    }

    /// GET `path` on the agent's listener.
    pub async fn get(&self, path: &str) -> Result<(u16, String), String> {
        http_get(self.port, path).await
    }

    /// What `/api/v1/status` says of the source named `name` (its object in
    /// `sources`); `Err` when the API does not answer 200 or lists no such source.
    pub async fn api_source(&self, name: &str) -> Result<serde_json::Value, String> {
        let (code, body) = self.get("/api/v1/status").await?;
        if code != 200 {
            return Err(format!("/api/v1/status answered {code}: {body}"));
        }
        let v: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| format!("/api/v1/status: {e}: {body}"))?;
        v["sources"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["name"] == name))
            .cloned()
            .ok_or_else(|| format!("no source {name:?} in /api/v1/status: {body}"))
    }

    /// Polls `/readyz` until 200; panics (printing stderr) on timeout or exit.
    pub async fn wait_ready(&self, timeout: Duration) {
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
        try_scrape(self.port).await
    }

    /// Polls of `source` finished so far (`inboxwatch_poll_duration_seconds_count`).
    pub fn polls(m: &Metrics, source: &str) -> f64 {
        m.sum(
            "inboxwatch_poll_duration_seconds_count",
            &[("source", source)],
        )
    }

    /// Waits until `source` has finished at least `polls` more polls and at least
    /// `min` has passed, and returns a scrape taken after both: the evidence that a
    /// check of what "still holds later" looks at polls that ran, not at an agent
    /// that stalled. Panics (with the agent's log) after [`POLLS_CAP`] more: a
    /// poll that reads a large backlog takes a minute and more on a loaded
    /// machine, and the cap only bounds how long a stalled agent takes to fail.
    pub async fn wait_polls(&self, source: &str, polls: u32, min: Duration) -> Metrics {
        let started = Instant::now();
        let from = Self::polls(&self.scrape().await, source);
        let res = wait_until(min + POLLS_CAP, || async {
            let m = self.try_scrape().await?;
            let ran = Self::polls(&m, source) - from;
            (ran >= f64::from(polls) && started.elapsed() >= min)
                .then_some(m)
                .ok_or_else(|| {
                    format!(
                        "{ran} of {polls} polls of {source} after {:?} (at least {min:?})",
                        started.elapsed()
                    )
                })
        })
        .await;
        res.unwrap_or_else(|e| panic!("{e}\n{}", self.stderr()))
    }

    /// Waits until `check` holds on a scrape, and returns what it returned. Gives
    /// up (with the last difference) only once `min` has passed and each of
    /// `sources` has finished `polls` polls since the wait began, or after
    /// [`POLLS_CAP`] past `min`: evidence that the agent had its polls to get
    /// there, not only the time, since a poll that reads a large backlog beside
    /// other suites takes a minute and more.
    pub async fn wait_for_polls<T>(
        &self,
        sources: &[&str],
        min: Duration,
        polls: u32,
        mut check: impl FnMut(&Metrics) -> Result<T, String>,
    ) -> Result<T, String> {
        let started = Instant::now();
        let first = wait_until(Duration::from_secs(60), || self.try_scrape()).await?;
        let from: Vec<f64> = sources.iter().map(|s| Self::polls(&first, s)).collect();
        loop {
            // A scrape that fails (one the agent answered too slowly beside
            // other suites: 5 s once, in the middle of a read of 50,000 rows)
            // is tried again, within the same bounds as a check that fails.
            let m = match self.try_scrape().await {
                Ok(m) => m,
                Err(e) if started.elapsed() < min + POLLS_CAP => {
                    eprintln!("scraping the agent failed, trying again: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let last = match check(&m) {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let ran: Vec<f64> = sources
                .iter()
                .zip(&from)
                .map(|(s, f)| Self::polls(&m, s) - f)
                .collect();
            let polled = ran.iter().all(|r| *r >= f64::from(polls));
            let waited = started.elapsed();
            if waited >= min && (polled || waited >= min + POLLS_CAP) {
                return Err(format!(
                    "after {waited:?} and {ran:?} polls of {sources:?} (at least {min:?} and \
                     {polls} polls each); last state:\n{last}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// GET /metrics and parse it; panics if that fails.
    pub async fn scrape(&self) -> Metrics {
        match self.try_scrape().await {
            Ok(m) => m,
            Err(e) => panic!("scraping the agent failed: {e}"),
        }
    }
}

/// GET /metrics of the agent listening on `port` and parse it.
pub async fn try_scrape(port: u16) -> Result<Metrics, String> {
    let (code, body) = http_get(port, "/metrics").await?;
    if code != 200 {
        return Err(format!("/metrics answered {code}: {body}"));
    }
    Metrics::parse(&body)
}

/// The `CREATE INDEX` statements `inboxwatch schema --config` prints for
/// `config` (each without its `;`), as a user would run them when `doctor`
/// asks; fails the test if the command does.
pub fn schema_indexes(config: &str) -> Vec<String> {
    let dir = tempfile::tempdir().expect("a temp dir for the config");
    let path = dir.path().join("indexes.toml");
    std::fs::write(&path, config).expect("write the config");
    let out = Cmd::new(["schema", "--config"]).arg(&path).output();
    assert!(out.success(), "{}", out.describe());
    out.stdout
        .lines()
        .filter(|l| l.starts_with("CREATE INDEX"))
        .map(|l| l.trim_end_matches(';').to_string())
        .collect()
}
