//! The memory soak (`scripts/bench.sh --soak`): what one remembered event and
//! one tracked unfinished event cost in the agent's resident memory under
//! `run`, with a steady writer for longer than `state_retention`.
//!
//! Two agents watch the same table at the same time, alike but for
//! `state_retention` (short and long), so everything else — the writer, the
//! rows per poll, the backlog — is equal and the difference of their RSS
//! plateaus over the difference of their remembered events is the cost of
//! one remembered event. Then a block of unfinished rows that nobody works on
//! is added to the table; both agents hold them (the state map and the
//! backlog map), and the rise of each plateau over the rows added is the cost
//! of one tracked unfinished event. RSS is `VmRSS` and `RssAnon` from
//! `/proc/PID/status`, sampled every second; a plateau is the median of its
//! window.

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::AnyConnection;

use crate::load::{COLUMNS, TABLE};
use crate::measure::Metrics;
use crate::writer::{self, Truth};
use crate::{Dialect, Proc, connect, exec, free_port, spawn, wait_for};

/// What one soak run does.
pub struct Plan {
    /// `state_retention` of the two agents (seconds), short then long.
    pub retentions: (u64, u64),
    /// Unfinished rows added for the second measurement.
    pub backlog: u64,
    /// Samples per plateau (one a second).
    pub window: u64,
    /// Row changes per second of the writer.
    pub rate: u64,
    /// The agents' poll interval (seconds).
    pub poll: f64,
}

/// One agent under test.
struct Agent {
    retention: u64,
    proc: Proc,
}

/// Resident memory of a process in kB: (VmRSS, RssAnon).
fn rss_kb(pid: u32) -> (u64, u64) {
    (status_kb(pid, "VmRSS:"), status_kb(pid, "RssAnon:"))
}

/// One memory field of `/proc/PID/status` in kB (0 if the process is gone).
fn status_kb(pid: u32, name: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// The plateaus of every agent over `window` one-second samples: (VmRSS, RssAnon) in kB.
async fn plateau(agents: &[Agent], window: u64) -> Vec<(u64, u64)> {
    let mut samples: Vec<(Vec<u64>, Vec<u64>)> = vec![Default::default(); agents.len()];
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    for _ in 0..window {
        tick.tick().await;
        for (a, s) in agents.iter().zip(samples.iter_mut()) {
            let (rss, anon) = rss_kb(a.proc.0.id());
            s.0.push(rss);
            s.1.push(anon);
        }
    }
    samples
        .iter_mut()
        .map(|(rss, anon)| (median(rss), median(anon)))
        .collect()
}

/// Events an agent with `retention` remembers now: every unfinished row and
/// every row changed within the retention. Eviction runs every 10 s, so on
/// average the map also holds the last 5 s before the horizon.
async fn remembered(conn: &mut AnyConnection, retention: u64) -> u64 {
    let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {TABLE} WHERE updated_at >= now() - interval '{} seconds' \
         OR status IN ('pending', 'processing', 'failed')",
        retention + 5
    )))
    .fetch_one(&mut *conn)
    .await
    .expect("count remembered events");
    u64::try_from(n).unwrap_or(0)
}

/// Adds `n` pending rows received an hour ago that nobody works on, in
/// blocks of 5,000 with distinct change times, half a second apart.
async fn add_backlog(conn: &mut AnyConnection, n: u64) {
    let mut done = 0;
    while done < n {
        let k = (n - done).min(5_000);
        exec(
            conn,
            &format!(
                "INSERT INTO {TABLE} (event_id, event_type, status, received_at, attempts, deliveries, updated_at) \
                 SELECT 'soak-' || g, 'orders.created', 'pending', now() - interval '1 hour', 0, 1, \
                 now() - (g - {done}) * interval '1 microsecond' FROM generate_series({} + 1, {}) g",
                done,
                done + k
            ),
        )
        .await;
        done += k;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// Bytes per event from two plateaus (kB) and two event counts.
fn slope(kb: (u64, u64), events: (u64, u64)) -> f64 {
    let bytes = (kb.1 as f64 - kb.0 as f64) * 1024.0;
    bytes / (events.1 as f64 - events.0 as f64).max(1.0)
}

/// Runs the soak on PostgreSQL and returns its report (Markdown).
pub async fn run(
    dialect: Dialect,
    agent_bin: &str,
    agent_dsn: &str,
    admin_dsn: &str,
    work: &Path,
    plan: &Plan,
) -> String {
    assert_eq!(
        dialect,
        Dialect::Postgres,
        "the soak runs on PostgreSQL (its backlog insert uses generate_series)"
    );
    let (short, long) = plan.retentions;
    assert!(short < long, "--retentions SHORT,LONG with SHORT < LONG");
    let poll_ms = (plan.poll * 1000.0).round() as u64;
    let mut agents = Vec::new();
    let mut ports = Vec::new();
    for retention in [short, long] {
        let port = free_port();
        // The overlap must not exceed the retention.
        let overlap = retention.min(30);
        let config = format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n\n[[sources]]\nname = \"soak-{retention}s\"\n\
             kind = \"inbox\"\ndsn = \"{agent_dsn}\"\ntable = \"{TABLE}\"\npoll_interval = \"{poll_ms}ms\"\n\
             overlap = \"{overlap}s\"\nstate_retention = \"{retention}s\"\n{COLUMNS}"
        );
        let path = work.join(format!("soak-{retention}.toml"));
        std::fs::write(&path, config).expect("write agent config");
        let proc = spawn(
            Command::new(agent_bin)
                .args(["run", "--config"])
                .arg(&path)
                .env("INBOXWATCH_LOG", "warn"),
            work.join(format!("soak-{retention}.log")),
        );
        agents.push(Agent { retention, proc });
        ports.push((port, format!("soak-{retention}s")));
    }
    for (port, name) in &ports {
        wait_for(*port, name, Duration::from_secs(120), |m: &Metrics| {
            m.get("inboxwatch_source_up", &[("source", name)]) == Some(1.0)
        })
        .await;
    }
    let idle = plateau(&agents, 5).await;

    let mut conn = connect(admin_dsn).await;
    let settle = 20 + 2 * plan.poll.ceil() as u64;
    // Long enough for both plateaus and the backlog step between them.
    let seconds = long + 2 * (settle + plan.window) + plan.backlog / 10_000 + 30;
    let truth = Arc::new(Mutex::new(Truth::default()));
    let writer_conn = connect(admin_dsn).await;
    let rate = plan.rate;
    eprintln!(
        "soak: writing {rate} changes/s for up to {seconds} s; agents with state_retention {short} s and {long} s"
    );
    let t0 = Instant::now();
    let writing =
        tokio::spawn(
            async move { writer::run(writer_conn, dialect, rate, (seconds, 0), truth).await },
        );

    // 1. Remembered events: past the long retention and one eviction.
    tokio::time::sleep(Duration::from_secs(long + settle)).await;
    eprintln!("soak: sampling the remembered-events plateau...");
    let sampling = plateau(&agents, plan.window);
    let counting = async {
        tokio::time::sleep(Duration::from_secs(plan.window / 2)).await;
        let mut n = Vec::new();
        for a in &agents {
            n.push(remembered(&mut conn, a.retention).await);
        }
        n
    };
    let (first, events) = tokio::join!(sampling, counting);
    let changes_per_s = {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {TABLE} WHERE finished_at >= now() - interval '60 seconds' AND event_id LIKE 'w-%'"
        )))
        .fetch_one(&mut conn)
        .await
        .expect("completions");
        n as f64 / 60.0
    };

    // 2. Tracked unfinished events: a backlog nobody works on.
    eprintln!("soak: adding {} unfinished rows...", plan.backlog);
    add_backlog(&mut conn, plan.backlog).await;
    tokio::time::sleep(Duration::from_secs(settle)).await;
    eprintln!("soak: sampling the backlog plateau...");
    let second = plateau(&agents, plan.window).await;
    let elapsed = t0.elapsed().as_secs();
    let peaks: Vec<u64> = agents
        .iter()
        .map(|a| status_kb(a.proc.0.id(), "VmHWM:"))
        .collect();
    writing.abort();
    let _ = writing.await;
    for a in &agents {
        let up = rss_kb(a.proc.0.id());
        assert!(up.0 > 0, "agent with retention {} s exited", a.retention);
    }
    exec(
        &mut conn,
        &format!("DELETE FROM {TABLE} WHERE event_id LIKE 'soak-%'"),
    )
    .await;

    let per_remembered = (
        slope((first[0].0, first[1].0), (events[0], events[1])),
        slope((first[0].1, first[1].1), (events[0], events[1])),
    );
    let per_tracked: Vec<(f64, f64)> = (0..agents.len())
        .map(|i| {
            (
                slope((first[i].0, second[i].0), (0, plan.backlog)),
                slope((first[i].1, second[i].1), (0, plan.backlog)),
            )
        })
        .collect();
    let mut s = String::new();
    s.push_str(&format!(
        "### Memory soak — PostgreSQL, {rate} changes/s ({changes_per_s:.0} completions/s), poll every {} s\n\n\
         Two agents (release build) on the same table at the same time, `state_retention` {short} s and {long} s, \
         every other setting at its default; writer for {elapsed} s; each plateau is the median of {} one-second \
         samples of `/proc/PID/status`. Then {} unfinished rows added.\n\n",
        plan.poll, plan.window, plan.backlog
    ));
    s.push_str("| | retention short | retention long | per event (VmRSS / RssAnon) |\n|---|---:|---:|---:|\n");
    s.push_str(&format!(
        "| RSS idle, before the writer (MiB) | {:.1} | {:.1} | |\n",
        mb(idle[0].0),
        mb(idle[1].0)
    ));
    s.push_str(&format!(
        "| remembered events (unfinished + changed within the retention + 5 s) | {} | {} | |\n",
        events[0], events[1]
    ));
    s.push_str(&format!(
        "| RSS plateau under load (MiB; RssAnon) | {:.1} ({:.1}) | {:.1} ({:.1}) | **{:.0} / {:.0} B per remembered event** |\n",
        mb(first[0].0),
        mb(first[0].1),
        mb(first[1].0),
        mb(first[1].1),
        per_remembered.0,
        per_remembered.1
    ));
    s.push_str(&format!(
        "| RSS plateau with {} more unfinished rows (MiB; RssAnon) | {:.1} ({:.1}) | {:.1} ({:.1}) | **{:.0} / {:.0} and {:.0} / {:.0} B per tracked unfinished event** |\n",
        plan.backlog,
        mb(second[0].0),
        mb(second[0].1),
        mb(second[1].0),
        mb(second[1].1),
        per_tracked[0].0,
        per_tracked[0].1,
        per_tracked[1].0,
        per_tracked[1].1
    ));
    s.push_str(&format!(
        "| peak RSS over the run, VmHWM (MiB) | {:.1} | {:.1} | |\n",
        mb(peaks[0]),
        mb(peaks[1])
    ));
    s
}
