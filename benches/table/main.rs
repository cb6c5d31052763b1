//! Benchmark of the table source against prometheus-sql-exporter (issue 6,
//! SPEC §7): one inbox table, one writer at a steady change rate, inboxwatch
//! and prometheus-sql-exporter refreshing at the same interval side by side.
//! Run it through `scripts/bench.sh`, which starts and removes the database.
//!
//! Measured per system over the writer's run: database time per refresh
//! (median from a 100 ms sampler of the server's statement statistics, mean
//! from their totals), rows read and pages touched per refresh, CPU seconds
//! and peak RSS of the process, freshness (a probe row's change until it shows
//! on `/metrics`), and for inboxwatch its counters against the writer's ground
//! truth and its P95 against `percentile_cont` over the same completions.
//!
//! With `--soak` it measures the agent's memory instead ([`soak`]).

mod load;
mod measure;
mod plans;
mod soak;
mod writer;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::{AnyConnection, Connection, Row};

use measure::{Metrics, Sampler, proc_stats, scrape};
use writer::{PROBE_TYPE, Truth};

/// The database the benchmark runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Postgres,
    MySql,
}

impl Dialect {
    fn cli(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgres",
            Dialect::MySql => "mysql",
        }
    }

    fn now(self) -> &'static str {
        match self {
            Dialect::Postgres => "now()",
            Dialect::MySql => "UTC_TIMESTAMP(6)",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Dialect::Postgres => "PostgreSQL",
            Dialect::MySql => "MariaDB",
        }
    }
}

/// Runs one statement, panicking with the statement on failure.
pub async fn exec(conn: &mut AnyConnection, sql: &str) {
    if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
        .execute(&mut *conn)
        .await
    {
        panic!("{e}\n  in: {sql}");
    }
}

struct Args {
    dialect: Dialect,
    /// host:port of the benchmark's own server.
    host: String,
    rows: u64,
    seconds: u64,
    rate: u64,
    poll: f64,
    out: Option<PathBuf>,
    check: bool,
    work: PathBuf,
    /// The memory soak instead of the comparison, with its plan.
    soak: Option<soak::Plan>,
    /// The agent binary (default: the one built with this benchmark).
    agent: Option<String>,
    /// `cursor = "none"`: the agent is not given the `updated_at` column.
    no_cursor: bool,
    /// Unfinished rows of the history (default 1 % of `rows`).
    unfinished: Option<u64>,
    /// The agent's `max_tracked_events` (default: its own default).
    max_tracked: Option<u64>,
}

fn args() -> Args {
    let mut a = Args {
        dialect: Dialect::Postgres,
        host: String::new(),
        rows: 100_000,
        seconds: 30,
        rate: 2_000,
        poll: 5.0,
        out: None,
        check: false,
        work: std::env::temp_dir(),
        soak: None,
        agent: None,
        no_cursor: false,
        unfinished: None,
        max_tracked: None,
    };
    let mut soak = soak::Plan {
        retentions: (30, 240),
        backlog: 100_000,
        window: 60,
        rate: 0,
        poll: 0.0,
    };
    let mut soaking = false;
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--dialect" => {
                a.dialect = match v().as_str() {
                    "postgres" => Dialect::Postgres,
                    "mysql" => Dialect::MySql,
                    d => panic!("unknown dialect {d}"),
                }
            }
            "--host" => a.host = v(),
            "--rows" => a.rows = v().parse().expect("--rows N"),
            "--unfinished" => a.unfinished = Some(v().parse().expect("--unfinished N")),
            "--max-tracked" => a.max_tracked = Some(v().parse().expect("--max-tracked N")),
            "--seconds" => a.seconds = v().parse().expect("--seconds N"),
            "--rate" => a.rate = v().parse().expect("--rate N"),
            "--poll" => a.poll = v().parse().expect("--poll SECONDS"),
            "--out" => a.out = Some(v().into()),
            "--work" => a.work = v().into(),
            "--check" => a.check = true,
            "--soak" => soaking = true,
            "--retentions" => {
                let v = v();
                let (s, l) = v
                    .split_once(',')
                    .expect("--retentions SHORT,LONG (seconds)");
                soak.retentions = (
                    s.parse().expect("--retentions SHORT,LONG"),
                    l.parse().expect("--retentions SHORT,LONG"),
                );
            }
            "--backlog" => soak.backlog = v().parse().expect("--backlog N"),
            "--window" => soak.window = v().parse().expect("--window SECONDS"),
            "--agent" => a.agent = Some(v()),
            "--cursor" => {
                a.no_cursor = match v().as_str() {
                    "none" => true,
                    "updated_at" => false,
                    other => panic!("--cursor none|updated_at, not {other}"),
                }
            }
            // cargo bench passes --bench to harness = false targets.
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    assert!(!a.host.is_empty(), "--host HOST:PORT is required");
    if soaking {
        soak.rate = a.rate;
        soak.poll = a.poll;
        a.soak = Some(soak);
    }
    a
}

const AGENT_USER: &str = "iw_agent";
const EXPORTER_USER: &str = "iw_sqlexp";
const PASSWORD: &str = "bench";
const DB: &str = "bench";
/// How long `--check` waits for the counters to come right after the
/// writer stops (the time taken is reported, not bounded).
const CATCH_UP_DEADLINE: Duration = Duration::from_secs(600);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

async fn connect(url: &str) -> AnyConnection {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match AnyConnection::connect(url).await {
            Ok(c) => return c,
            Err(e) if Instant::now() > deadline => panic!("connect {url}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(cmd: &mut Command, log: PathBuf) -> Proc {
    let f = std::fs::File::create(&log).expect("log file");
    let child = cmd
        .stdout(Stdio::from(f.try_clone().expect("log file")))
        .stderr(Stdio::from(f))
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    Proc(child)
}

async fn wait_for<F: Fn(&Metrics) -> bool>(port: u16, what: &str, timeout: Duration, ok: F) {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(m) = scrape(port).await
            && ok(&m)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} not ready after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Time from a committed change until `shows` holds on `port`'s /metrics, in
/// seconds (None: not within 60 s).
async fn time_until<F: Fn(&Metrics) -> bool>(port: u16, since: Instant, shows: F) -> Option<f64> {
    while since.elapsed() < Duration::from_secs(60) {
        if let Ok(m) = scrape(port).await
            && shows(&m)
        {
            return Some(since.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

#[derive(Default)]
struct Fresh {
    agent: Vec<f64>,
    exporter: Vec<f64>,
    missed: u32,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    sqlx::any::install_default_drivers();
    let a = args();
    let d = a.dialect;
    let agent_bin = a
        .agent
        .clone()
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_inboxwatch").to_string());
    let agent_bin = agent_bin.as_str();
    let admin_url = match d {
        Dialect::Postgres => format!("postgres://postgres@{}/postgres", a.host),
        Dialect::MySql => format!("mysql://root@{}/mysql", a.host),
    };
    let mut admin = connect(&admin_url).await;
    match d {
        Dialect::Postgres => {
            let exists = sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT 1 FROM pg_database WHERE datname = '{DB}'"
            )))
            .fetch_optional(&mut admin)
            .await
            .expect("pg_database");
            if exists.is_none() {
                exec(&mut admin, &format!("CREATE DATABASE {DB}")).await;
            }
        }
        Dialect::MySql => exec(&mut admin, &format!("CREATE DATABASE IF NOT EXISTS {DB}")).await,
    }
    let url = |user: &str, pw: Option<&str>| {
        let cred = pw.map_or(user.to_string(), |p| format!("{user}:{p}"));
        match d {
            Dialect::Postgres => format!("postgres://{cred}@{}/{DB}", a.host),
            Dialect::MySql => format!("mysql://{cred}@{}/{DB}", a.host),
        }
    };
    let admin_user = if d == Dialect::Postgres {
        "postgres"
    } else {
        "root"
    };
    let mut conn = connect(&url(admin_user, None)).await;
    if d == Dialect::Postgres {
        exec(
            &mut conn,
            "CREATE EXTENSION IF NOT EXISTS pg_stat_statements",
        )
        .await;
    }

    eprintln!("building {} rows of history...", a.rows);
    let t0 = Instant::now();
    let unfinished = load::build(
        &mut conn,
        agent_bin,
        d,
        a.rows,
        a.unfinished.unwrap_or(a.rows / 100),
    )
    .await;
    let load_s = t0.elapsed().as_secs_f64();
    eprintln!("table built in {load_s:.0} s");
    let size: i64 = match d {
        Dialect::Postgres => sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT pg_total_relation_size('{}')::bigint",
            load::TABLE
        ))),
        Dialect::MySql => sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT CAST(data_length + index_length AS SIGNED) FROM information_schema.tables WHERE table_schema = '{DB}' AND table_name = '{}'",
            load::TABLE
        ))),
    }
    .fetch_one(&mut conn)
    .await
    .expect("table size");

    for user in [AGENT_USER, EXPORTER_USER] {
        match d {
            Dialect::Postgres => {
                exec(&mut conn, &format!("DROP ROLE IF EXISTS {user}")).await;
                exec(
                    &mut conn,
                    &format!("CREATE ROLE {user} LOGIN PASSWORD '{PASSWORD}'"),
                )
                .await;
                exec(
                    &mut conn,
                    &format!("GRANT SELECT ON {} TO {user}", load::TABLE),
                )
                .await;
            }
            Dialect::MySql => {
                exec(&mut conn, &format!("DROP USER IF EXISTS '{user}'@'%'")).await;
                exec(
                    &mut conn,
                    &format!("CREATE USER '{user}'@'%' IDENTIFIED BY '{PASSWORD}'"),
                )
                .await;
                exec(
                    &mut conn,
                    &format!("GRANT SELECT ON {DB}.* TO '{user}'@'%'"),
                )
                .await;
            }
        }
    }

    if let Some(plan) = &a.soak {
        let report = soak::run(
            d,
            agent_bin,
            &url(AGENT_USER, Some(PASSWORD)),
            &url(admin_user, None),
            &a.work,
            plan,
        )
        .await;
        println!("{report}");
        if let Some(out) = &a.out {
            std::fs::write(out, &report).expect("write report");
        }
        return;
    }

    // inboxwatch, with the documented defaults except the poll interval and
    // the P95's sliding window. That window (5 min by default) is stretched
    // over the whole run and the catch-up after it, so that the sketch holds
    // the same completions as the percentile_cont it is compared with: a run
    // longer than 5 min would otherwise compare its last 5 min with all of it.
    // 600 s more for what the agent sees before the writer's run: its own
    // start and the exporter's (at most 120 + 300 s, `wait_for` below).
    let agent_port = free_port();
    let poll_ms = (a.poll * 1000.0).round() as u64;
    let quantile_window = a.seconds + CATCH_UP_DEADLINE.as_secs() + 600;
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:{agent_port}\"\n\n[[sources]]\nname = \"bench\"\nkind = \"inbox\"\n\
         dsn = \"{}\"\ntable = \"{}\"\npoll_interval = \"{poll_ms}ms\"\nquantile_window = \"{quantile_window}s\"\n{}{}",
        url(AGENT_USER, Some(PASSWORD)),
        load::TABLE,
        if a.no_cursor {
            load::COLUMNS_NO_CURSOR
        } else {
            load::COLUMNS
        },
        a.max_tracked
            .map_or(String::new(), |n| format!("max_tracked_events = {n}\n"))
    );
    let config_path = a.work.join("inboxwatch.toml");
    std::fs::write(&config_path, config).expect("write agent config");
    if a.no_cursor {
        // The indexes this mode's queries need, as `schema --config` prints
        // them (the tails on received_at and finished_at).
        let out = Command::new(agent_bin)
            .args(["schema", "--config"])
            .arg(&config_path)
            .env("INBOXWATCH_LOG", "warn")
            .output()
            .expect("inboxwatch schema --config runs");
        assert!(out.status.success(), "inboxwatch schema --config failed");
        let ddl = String::from_utf8(out.stdout).expect("UTF-8");
        for stmt in ddl.lines().filter(|l| l.starts_with("CREATE INDEX")) {
            exec(&mut conn, stmt.trim_end_matches(';')).await;
        }
        if d == Dialect::Postgres {
            exec(&mut conn, &format!("ANALYZE {}", load::TABLE)).await;
        }
    }
    let agent_log = a.work.join("inboxwatch.log");
    let mut agent = spawn(
        Command::new(agent_bin)
            .args(["run", "--config"])
            .arg(&config_path)
            .env("INBOXWATCH_LOG", "warn"),
        agent_log.clone(),
    );
    wait_for(agent_port, "inboxwatch", Duration::from_secs(120), |m| {
        m.get("inboxwatch_source_up", &[("source", "bench")]) == Some(1.0)
    })
    .await;

    let exporter_port = free_port();
    let exporter_dsn = match d {
        Dialect::Postgres => format!(
            "postgres://{EXPORTER_USER}:{PASSWORD}@{}/{DB}?sslmode=disable",
            a.host
        ),
        Dialect::MySql => format!("mysql://{EXPORTER_USER}:{PASSWORD}@tcp({})/{DB}", a.host),
    };
    let exporter_config = a.work.join("sql-exporter.yml");
    std::fs::write(
        &exporter_config,
        load::exporter_config(d, &exporter_dsn, a.poll),
    )
    .expect("write exporter config");
    let exporter = spawn(
        Command::new("prometheus-sql-exporter")
            .arg(format!("-config.file={}", exporter_config.display()))
            .arg(format!("-web.listen-address=127.0.0.1:{exporter_port}"))
            .env("LOGLEVEL", "warn"),
        a.work.join("sql-exporter.log"),
    );
    wait_for(
        exporter_port,
        "prometheus-sql-exporter",
        Duration::from_secs(300),
        |m| m.names().any(|n| n == "sql_inbox_processing_p95_seconds"),
    )
    .await;

    // The measurement window: the writer's run.
    let sampler = Sampler::new(d, url(admin_user, None)).await.reset().await;
    let agent_pid = agent.0.id();
    let exporter_pid = exporter.0.id();
    let cpu0 = (proc_stats(agent_pid).cpu, proc_stats(exporter_pid).cpu);
    let polls0 = scrape(agent_port).await.expect("scrape").sum(
        "inboxwatch_poll_duration_seconds_count",
        &[("source", "bench")],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let samples = tokio::spawn(sampler.run(stop.clone()));

    let truth = Arc::new(Mutex::new(Truth::default()));
    let writer_conn = connect(&url(admin_user, None)).await;
    let run_start: i64 = sqlx::query(sqlx::AssertSqlSafe(match d {
        Dialect::Postgres => {
            "SELECT CAST(EXTRACT(EPOCH FROM now()) * 1000000 AS BIGINT)".to_string()
        }
        Dialect::MySql => {
            "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) AS SIGNED)"
                .to_string()
        }
    }))
    .fetch_one(&mut conn)
    .await
    .expect("now")
    .get(0);
    let writing = Arc::new(AtomicBool::new(true));
    let fresh = {
        let (truth, writing) = (truth.clone(), writing.clone());
        let mut probe_conn = connect(&url(admin_user, None)).await;
        let gap = Duration::from_secs_f64(a.poll * 1.37 + 0.6);
        tokio::spawn(async move {
            let mut f = Fresh::default();
            let mut k = 0;
            let label = [("event_type", PROBE_TYPE), ("status", "pending")];
            while writing.load(Ordering::Relaxed) {
                tokio::time::sleep(gap).await;
                k += 1;
                writer::probe_insert(&mut probe_conn, d, k, &truth).await;
                let at = Instant::now();
                let (x, y) = tokio::join!(
                    time_until(agent_port, at, |m| m.get("inbox_backlog_messages", &label)
                        == Some(1.0)),
                    time_until(exporter_port, at, |m| m.get("sql_inbox_backlog", &label)
                        == Some(1.0)),
                );
                writer::probe_complete(&mut probe_conn, d, k, &truth).await;
                let at2 = Instant::now();
                let gone = |name: &'static str| {
                    move |m: &Metrics| m.get(name, &label).unwrap_or(0.0) == 0.0
                };
                let (x2, y2) = tokio::join!(
                    time_until(agent_port, at2, gone("inbox_backlog_messages")),
                    time_until(exporter_port, at2, gone("sql_inbox_backlog")),
                );
                for (v, into) in [(x, 0), (x2, 0), (y, 1), (y2, 1)] {
                    match v {
                        Some(s) if into == 0 => f.agent.push(s),
                        Some(s) => f.exporter.push(s),
                        None => f.missed += 1,
                    }
                }
            }
            f
        })
    };
    eprintln!("writing {} changes/s for {} s...", a.rate, a.seconds);
    let (changes, elapsed) =
        writer::run(writer_conn, d, a.rate, (a.seconds, 0), truth.clone()).await;
    writing.store(false, Ordering::Relaxed);
    let fresh = fresh.await.expect("probe task");
    let window = elapsed.as_secs_f64();
    // Let the last refreshes of the window land in the statistics.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let bursts = samples.await.expect("sampler");
    let mut sampler = Sampler::new(d, url(admin_user, None)).await;
    let totals = sampler.totals().await;
    let statements = match d {
        Dialect::MySql => sampler.my_statements().await,
        Dialect::Postgres => Vec::new(),
    };
    let cpu1 = (proc_stats(agent_pid).cpu, proc_stats(exporter_pid).cpu);
    let polls1 = scrape(agent_port).await.expect("scrape").sum(
        "inboxwatch_poll_duration_seconds_count",
        &[("source", "bench")],
    );
    let polls = (polls1 - polls0).max(1.0);
    // The agent's plans, as it ran them, over a few polls more while the
    // writer goes on at the same rate: after the measured window, since
    // capturing them costs time of its own (plans.rs). Its events are
    // numbered after the window's, and counted in the truth too.
    let capture = plans::start(&mut conn, d).await;
    let capture_s = (a.poll * 3.0).ceil().max(3.0) as u64 + 1;
    writer::run(
        connect(&url(admin_user, None)).await,
        d,
        a.rate,
        (capture_s, 1_000_000_000),
        truth.clone(),
    )
    .await;
    // The writer's last change: the catch-up below counts from here (and
    // so includes the reading of the plans, well under a second).
    let wrote = Instant::now();
    let captured = plans::finish(&mut conn, capture).await;
    let exporter_refreshes = totals.exporter_calls as f64 / load::exporter_queries(d).len() as f64;
    let rows_scanned_exporter = sampler
        .exporter_rows_scanned(&load::exporter_queries(d))
        .await;

    // Accuracy: counters against the truth once the agent has caught up.
    // How long that takes is a measurement, reported: an agent short of CPU
    // (a debug build on a loaded CI machine re-reading the unfinished rows
    // every poll) may catch up late without counting wrongly. The deadline
    // only bounds a run whose counters never come right.
    let truth = truth.lock().expect("truth").clone_counts();
    let deadline = Instant::now() + CATCH_UP_DEADLINE;
    let (mismatches, m) = loop {
        let m = scrape(agent_port).await.expect("scrape");
        let d = measure::counter_diff(&m, &truth, a.no_cursor);
        if d.is_empty() || Instant::now() > deadline {
            break (d, m);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let catch_up = wrote.elapsed().as_secs_f64();
    let p95 = measure::p95_errors(&mut conn, d, &m, run_start, &truth).await;
    let mut plans = match d {
        Dialect::Postgres => {
            measure::agent_plans(&mut conn, run_start + (window * 1e6) as i64).await
        }
        Dialect::MySql => vec![(
            "inboxwatch's statements by kind of command (performance_schema over the run)"
                .to_string(),
            statements,
        )],
    };
    // After the statement list, before the rebuilt reconcile.
    let at = plans.len().min(1);
    let capture_failed = captured.as_ref().err().cloned();
    match captured {
        Ok(p) => {
            plans.splice(at..at, p);
        }
        Err(e) => plans.insert(at, (plans::NOT_CAPTURED.to_string(), vec![e])),
    }
    let agent_proc = proc_stats(agent_pid);
    let exporter_proc = proc_stats(exporter_pid);
    drop(exporter);
    let _ = agent.0.kill();
    let _ = agent.0.wait();

    let r = measure::Report {
        dialect: d,
        no_cursor: a.no_cursor,
        rows: a.rows,
        unfinished,
        table_bytes: size,
        load_s,
        poll: a.poll,
        rate: a.rate,
        changes,
        window,
        polls,
        exporter_refreshes,
        totals,
        bursts,
        cpu: (cpu1.0 - cpu0.0, cpu1.1 - cpu0.1),
        rss: (agent_proc.peak_rss_kb, exporter_proc.peak_rss_kb),
        rows_scanned_exporter,
        fresh_agent: fresh.agent,
        fresh_exporter: fresh.exporter,
        fresh_missed: fresh.missed,
        mismatches: mismatches.clone(),
        catch_up,
        p95,
        counters_checked: measure::counters_checked(&truth),
        plans,
    };
    let text = r.markdown();
    println!("{text}");
    if let Some(out) = &a.out {
        std::fs::write(out, &text).expect("write report");
    }
    if a.check {
        if !mismatches.is_empty() {
            // The work directory goes with the script's exit: show why the
            // agent fell behind (slow or failed polls) while it is at hand.
            let log = std::fs::read_to_string(&agent_log).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "inboxwatch's last {} log lines:\n{}",
                lines.len().min(60),
                lines[lines.len().saturating_sub(60)..].join("\n")
            );
            for name in [
                "inboxwatch_poll_errors_total",
                "inboxwatch_poll_duration_seconds_count",
                "inboxwatch_poll_duration_seconds_sum",
            ] {
                eprintln!("{name}: {}", m.sum(name, &[]));
            }
        }
        assert!(
            mismatches.is_empty(),
            "inboxwatch's counters differ from the ground truth:\n{}",
            mismatches.join("\n")
        );
        // At the sketch's own rank: with the CI's few hundred completions per
        // event type, percentile_cont's interpolation alone can exceed 1 %.
        let worst = r.p95.iter().map(|p| p.rank_error).fold(0.0, f64::max);
        assert!(!r.p95.is_empty(), "no P95 to compare");
        assert!(
            worst <= 0.01,
            "P95 off by {:.2} % (> 1 %) from the exact value at its rank",
            worst * 100.0
        );
        if let Some(e) = &capture_failed {
            panic!("{}: {e}", plans::NOT_CAPTURED);
        }
        let refused: Vec<&String> = r
            .plans
            .iter()
            .flat_map(|(_, p)| p)
            .filter(|l| l.starts_with("ANALYZE failed") || l.starts_with("EXPLAIN failed"))
            .collect();
        assert!(
            refused.is_empty(),
            "the server refused to explain some statements: {refused:?}"
        );
        assert!(
            r.exporter_refreshes >= 1.0,
            "prometheus-sql-exporter never refreshed"
        );
        // The median and P95 per refresh come from these (on MariaDB the
        // agent's from its user's statement totals): none, and the report
        // shows a dash.
        assert!(
            !r.bursts.agent.is_empty() && !r.bursts.exporter.is_empty(),
            "the sampler saw no refresh of {}",
            if r.bursts.agent.is_empty() {
                "inboxwatch"
            } else {
                "prometheus-sql-exporter"
            }
        );
        assert!(
            !r.fresh_agent.is_empty(),
            "no freshness probe reached inboxwatch"
        );
    }
}

trait CloneCounts {
    fn clone_counts(&self) -> Truth;
}

impl CloneCounts for Truth {
    fn clone_counts(&self) -> Truth {
        Truth {
            by_type: self.by_type.clone(),
            changes: self.changes,
        }
    }
}
