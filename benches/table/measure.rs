//! What the benchmark measures: `/metrics` scrapes, the server's statement
//! statistics per system, the processes' CPU and memory, and the report.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::{AnyConnection, Row};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::writer::{PROBE_TYPE, Truth};
use crate::{AGENT_USER, Dialect, EXPORTER_USER, connect, exec, load};

/// One scrape of a Prometheus text endpoint.
#[derive(Debug, Default)]
pub struct Metrics {
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

impl Metrics {
    fn parse(text: &str) -> Metrics {
        let mut samples = Vec::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let mut map = BTreeMap::new();
            for pair in labels.split("\",").filter(|p| !p.is_empty()) {
                if let Some((k, v)) = pair.split_once("=\"") {
                    map.insert(
                        k.trim_start_matches(',').to_string(),
                        v.trim_end_matches('"').to_string(),
                    );
                }
            }
            samples.push((name.to_string(), map, value));
        }
        Metrics { samples }
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = f64> + 'a {
        self.samples
            .iter()
            .filter(move |(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, _, v)| *v)
    }

    /// The value of the one series of `name` carrying `labels` (and maybe others).
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.matching(name, labels).next()
    }

    /// The sum over every series of `name` carrying `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).sum()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.samples.iter().map(|(n, _, _)| n.as_str())
    }
}

/// GET /metrics on 127.0.0.1:`port` (HTTP/1.0, so no chunked body).
pub async fn scrape(port: u16) -> Result<Metrics, String> {
    let get = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(10), get)
        .await
        .map_err(|_| "scrape timed out".to_string())??;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no HTTP body")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(head.lines().next().unwrap_or_default().to_string());
    }
    Ok(Metrics::parse(body))
}

/// CPU seconds used so far and peak resident memory of a process.
pub struct ProcStats {
    pub cpu: f64,
    pub peak_rss_kb: u64,
}

pub fn proc_stats(pid: u32) -> ProcStats {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime is the 14th field.
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Linux reports in USER_HZ, 100 on every mainstream architecture.
    let cpu = (ticks(11) + ticks(12)) / 100.0;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let peak_rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    ProcStats { cpu, peak_rss_kb }
}

/// Whole-window statement totals of each system.
#[derive(Debug, Default, Clone)]
pub struct Totals {
    /// (agent, exporter): database time in ms, all their statements.
    pub time_ms: (f64, f64),
    /// (agent, exporter): rows returned.
    pub rows_sent: (f64, f64),
    /// (agent, exporter): rows examined (MariaDB) or shared pages touched (PostgreSQL).
    pub work: (f64, f64),
    /// Calls of the exporter's queries on the table.
    pub exporter_calls: u64,
}

/// Database time of each refresh, per system (ms).
#[derive(Debug, Default)]
pub struct Bursts {
    pub agent: Vec<f64>,
    pub exporter: Vec<f64>,
}

/// Samples the server's statement statistics every 100 ms.
pub struct Sampler {
    dialect: Dialect,
    conn: AnyConnection,
}

fn users() -> String {
    format!("('{AGENT_USER}', '{EXPORTER_USER}')")
}

impl Sampler {
    pub async fn new(dialect: Dialect, url: String) -> Sampler {
        Sampler {
            dialect,
            conn: connect(&url).await,
        }
    }

    /// Clears the statistics at the start of the window.
    pub async fn reset(mut self) -> Sampler {
        match self.dialect {
            Dialect::Postgres => exec(&mut self.conn, "SELECT pg_stat_statements_reset()").await,
            Dialect::MySql => {
                exec(
                    &mut self.conn,
                    "TRUNCATE TABLE performance_schema.events_statements_summary_by_digest",
                )
                .await;
                exec(
                    &mut self.conn,
                    "TRUNCATE TABLE performance_schema.events_statements_summary_by_user_by_event_name",
                )
                .await;
            }
        }
        self
    }

    /// MariaDB: the agent's statements by kind of command and their
    /// database time over the window. MariaDB counts no executions per
    /// prepared statement (`prepared_statements_instances` keeps
    /// `COUNT_EXECUTE` at 0), and prepared statements get no digest, so the
    /// time of each of the agent's statements shows only in a log of every
    /// statement (`MY_SLOW_LOG`, `scripts/slowlog-statements.py`).
    pub async fn my_statements(&mut self) -> Vec<String> {
        let commands: Vec<(String, i64, f64, f64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT CAST(EVENT_NAME AS CHAR), CAST(COUNT_STAR AS SIGNED), \
             CAST(SUM_TIMER_WAIT / 1e9 AS DOUBLE), CAST(MAX_TIMER_WAIT / 1e9 AS DOUBLE) \
             FROM performance_schema.events_statements_summary_by_user_by_event_name \
             WHERE USER = '{AGENT_USER}' AND COUNT_STAR > 0 ORDER BY SUM_TIMER_WAIT DESC"
        )))
        .fetch_all(&mut self.conn)
        .await
        .expect("events_statements_summary_by_user_by_event_name");
        time_table(
            "command",
            commands
                .into_iter()
                .map(|(name, calls, ms, max)| (calls, ms, ms / calls.max(1) as f64, max, name)),
        )
    }

    /// Cumulative database time (ms) of each system's queries on the table,
    /// and whether a query of it is running.
    async fn sample(&mut self) -> ((f64, bool), (f64, bool)) {
        let (time_sql, busy_sql) = match self.dialect {
            Dialect::Postgres => (
                format!(
                    "SELECT r.rolname::text, sum(s.total_exec_time + s.total_plan_time)::float8 FROM pg_stat_statements s \
                     JOIN pg_roles r ON r.oid = s.userid WHERE r.rolname IN {} AND s.query LIKE '%{}%' GROUP BY 1",
                    users(),
                    load::TABLE
                ),
                format!(
                    "SELECT usename::text FROM pg_stat_activity WHERE usename IN {} AND state = 'active'",
                    users()
                ),
            ),
            Dialect::MySql => (
                // The agent's statements are prepared, which get no digest:
                // its time is its user's total, which counts the statements
                // of connected sessions as they end. Digests have no user:
                // the exporter's queries are told by not starting with a
                // CAST (the agent's text-protocol statements do).
                format!(
                    "SELECT '{AGENT_USER}', CAST(SUM(SUM_TIMER_WAIT) / 1e9 AS DOUBLE) \
                     FROM performance_schema.events_statements_summary_by_user_by_event_name \
                     WHERE USER = '{AGENT_USER}' UNION ALL \
                     SELECT '{EXPORTER_USER}', CAST(SUM(SUM_TIMER_WAIT) / 1e9 AS DOUBLE) \
                     FROM performance_schema.events_statements_summary_by_digest \
                     WHERE DIGEST_TEXT LIKE 'SELECT%' AND DIGEST_TEXT NOT LIKE '%GET_LOCK%' \
                     AND DIGEST_TEXT NOT LIKE 'SELECT CAST%' AND DIGEST_TEXT LIKE '%{}%'",
                    load::TABLE
                ),
                format!(
                    "SELECT CAST(USER AS CHAR) FROM information_schema.PROCESSLIST WHERE USER IN {} \
                     AND COMMAND IN ('Query', 'Execute')",
                    users()
                ),
            ),
        };
        let mut out = ((0.0, false), (0.0, false));
        let rows = sqlx::query(sqlx::AssertSqlSafe(time_sql))
            .fetch_all(&mut self.conn)
            .await
            .expect("statement statistics");
        for r in rows {
            let user: String = r.get(0);
            let ms: f64 = r.try_get::<Option<f64>, _>(1).ok().flatten().unwrap_or(0.0);
            if user == AGENT_USER {
                out.0.0 = ms;
            } else {
                out.1.0 = ms;
            }
        }
        let busy = sqlx::query(sqlx::AssertSqlSafe(busy_sql))
            .fetch_all(&mut self.conn)
            .await
            .expect("activity");
        for r in busy {
            let user: String = r.get(0);
            if user == AGENT_USER {
                out.0.1 = true;
            } else {
                out.1.1 = true;
            }
        }
        out
    }

    /// Samples until `stop`, then cuts the samples into refreshes: runs of
    /// samples with database time accruing or a query running, separated by
    /// at least 300 ms of neither.
    pub async fn run(mut self, stop: Arc<AtomicBool>) -> Bursts {
        let (mut agent, mut exporter) = (Vec::new(), Vec::new());
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let (a, e) = self.sample().await;
            agent.push(a);
            exporter.push(e);
        }
        Bursts {
            agent: bursts(&agent),
            exporter: bursts(&exporter),
        }
    }

    /// Whole-window totals of every statement of each system.
    pub async fn totals(&mut self) -> Totals {
        let (sql, calls_sql) = match self.dialect {
            Dialect::Postgres => (
                format!(
                    "SELECT r.rolname::text, sum(s.total_exec_time + s.total_plan_time)::float8, sum(s.rows)::float8, \
                     sum(s.shared_blks_hit + s.shared_blks_read)::float8 FROM pg_stat_statements s \
                     JOIN pg_roles r ON r.oid = s.userid WHERE r.rolname IN {} GROUP BY 1",
                    users()
                ),
                format!(
                    "SELECT COALESCE(sum(s.calls), 0)::bigint FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid \
                     WHERE r.rolname = '{EXPORTER_USER}' AND s.query LIKE '%{}%'",
                    load::TABLE
                ),
            ),
            Dialect::MySql => (
                format!(
                    "SELECT CAST(USER AS CHAR), CAST(SUM(SUM_TIMER_WAIT) / 1e9 AS DOUBLE), CAST(SUM(SUM_ROWS_SENT) AS DOUBLE), \
                     CAST(SUM(SUM_ROWS_EXAMINED) AS DOUBLE) FROM performance_schema.events_statements_summary_by_user_by_event_name \
                     WHERE USER IN {} GROUP BY USER",
                    users()
                ),
                format!(
                    "SELECT CAST(COALESCE(SUM(COUNT_STAR), 0) AS SIGNED) FROM performance_schema.events_statements_summary_by_digest \
                     WHERE DIGEST_TEXT LIKE 'SELECT%' AND DIGEST_TEXT LIKE '%{}%' AND DIGEST_TEXT NOT LIKE 'SELECT CAST%'",
                    load::TABLE
                ),
            ),
        };
        let mut t = Totals::default();
        for r in sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(&mut self.conn)
            .await
            .expect("totals")
        {
            let user: String = r.get(0);
            let v = |i: usize| r.try_get::<Option<f64>, _>(i).ok().flatten().unwrap_or(0.0);
            if user == AGENT_USER {
                (t.time_ms.0, t.rows_sent.0, t.work.0) = (v(1), v(2), v(3));
            } else {
                (t.time_ms.1, t.rows_sent.1, t.work.1) = (v(1), v(2), v(3));
            }
        }
        let calls: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(calls_sql))
            .fetch_one(&mut self.conn)
            .await
            .expect("exporter calls");
        t.exporter_calls = u64::try_from(calls).unwrap_or(0);
        t
    }

    /// Rows the exporter's queries scan per refresh (PostgreSQL: from EXPLAIN
    /// ANALYZE of each, run once now; MariaDB reports rows examined itself).
    pub async fn exporter_rows_scanned(
        &mut self,
        queries: &[(&'static str, Vec<&'static str>, &'static str, String)],
    ) -> Option<f64> {
        if self.dialect != Dialect::Postgres {
            return None;
        }
        let mut total = 0.0;
        for (_, _, _, q) in queries {
            let plan: Vec<String> =
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN ANALYZE {q}")))
                    .fetch_all(&mut self.conn)
                    .await
                    .expect("EXPLAIN ANALYZE");
            total += scanned(&plan);
        }
        Some(total)
    }
}

/// Where inboxwatch's database time went on PostgreSQL, statement by
/// statement (`pg_stat_statements` over the run), and EXPLAIN (ANALYZE,
/// BUFFERS) of the reconciling count and aggregate, which run once a minute
/// and so seldom fall in the capture of the agent's own plans
/// ([`crate::plans`]): rebuilt here, `end` µs being the writer's end.
pub async fn agent_plans(conn: &mut AnyConnection, end: i64) -> Vec<(String, Vec<String>)> {
    let statements: Vec<(String, i64, f64, f64, f64)> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT regexp_replace(s.query, '\\s+', ' ', 'g'), s.calls, \
         s.total_exec_time::float8, s.mean_exec_time::float8, s.max_exec_time::float8 \
         FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid \
         WHERE r.rolname = '{AGENT_USER}' ORDER BY s.total_exec_time DESC LIMIT 12"
        )))
        .fetch_all(&mut *conn)
        .await
        .unwrap_or_default();
    let statements = time_table(
        "statement",
        statements.into_iter().map(|(q, calls, total, mean, max)| {
            let short: String = q.chars().take(110).collect();
            (
                calls,
                total,
                mean,
                max,
                format!("{}{short}", statement_label(&q)),
            )
        }),
    );
    let mut out = vec![(
        "inboxwatch's statements by database time (pg_stat_statements over the run)".to_string(),
        statements,
    )];
    let stuck = end - 600_000_000;
    let runs = vec![
        (
            "reconciling count of the unfinished rows (once a minute; rebuilt)".to_string(),
            format!(
                "SELECT COUNT(*) FROM \"{}\" WHERE \"status\" IN ('pending', 'processing', 'failed')",
                load::TABLE
            ),
        ),
        (
            "reconciling aggregate over the unfinished rows (every tenth check, or when the count \
             differs; rebuilt)"
                .to_string(),
            format!(
                "SELECT CAST(\"status\" AS TEXT), CAST(\"event_type\" AS TEXT), COUNT(*), \
                 CAST(date_part('epoch', MIN(\"received_at\")) * 1000000 AS BIGINT), \
                 CAST(SUM(CASE WHEN \"status\" IN ('processing') AND CAST(date_part('epoch', \"started_at\") * 1000000 AS BIGINT) < {stuck} \
                 THEN 1 ELSE 0 END) AS BIGINT) FROM \"{}\" WHERE \"status\" IN ('pending', 'processing', 'failed') \
                 GROUP BY \"status\", \"event_type\"",
                load::TABLE
            ),
        ),
    ];
    out.extend(explain(conn, runs).await);
    out
}

/// The agent's database time as a table, one line per row of (calls,
/// total ms, mean ms, max ms, what ran), headed by the column `what`.
fn time_table(what: &str, rows: impl Iterator<Item = (i64, f64, f64, f64, String)>) -> Vec<String> {
    std::iter::once(format!(
        "{:>8} {:>10} {:>8} {:>8}  {what}",
        "calls", "total ms", "mean ms", "max ms"
    ))
    .chain(rows.map(|(calls, total, mean, max, ran)| {
        format!("{calls:>8} {total:>10.1} {mean:>8.3} {max:>8.1}  {ran}")
    }))
    .collect()
}

/// What one of the agent's statements is, from its text (their first
/// characters look alike): a prefix for the list of statements.
pub fn statement_label(query: &str) -> &'static str {
    if query.contains("AS tail0") {
        "[tails together] "
    } else if query.contains(" IS NULL AND ") && query.contains("ORDER BY") {
        "[rows without a change cursor] "
    } else if query.contains("AS stuck") {
        "[rows in flight] "
    } else if query.contains("\"started_at\" <= ") && query.contains("ORDER BY") {
        "[stuck rows: ids and statuses] "
    } else if query.contains("\"status\" IN (") && query.contains("\"started_at\" > ") {
        "[rows in flight, recent] "
    } else if query.starts_with("SELECT CAST(\"event_id\" AS CHAR), CAST(\"status\" AS CHAR) FROM")
    {
        "[rows in flight: ids and statuses] "
    } else if query.contains(" AND NOT ") && query.contains("UNION ALL") {
        "[late-commit slices] "
    } else if query.contains("\"event_id\" IN (") {
        "[by event id] "
    } else if query.contains("ORDER BY") {
        "[tail] "
    } else {
        ""
    }
}

/// EXPLAIN (ANALYZE, BUFFERS) of each query; a query the server refuses
/// shows its error in the plan's place.
async fn explain(
    conn: &mut AnyConnection,
    runs: Vec<(String, String)>,
) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for (what, q) in runs {
        let sql = format!("EXPLAIN (ANALYZE, BUFFERS) {q}");
        let plan = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql))
            .fetch_all(&mut *conn)
            .await
            .unwrap_or_else(|e| vec![format!("EXPLAIN failed: {e}"), q]);
        out.push((what, plan));
    }
    out
}

/// Rows the scan nodes of an EXPLAIN ANALYZE text plan read: actual rows ×
/// loops, plus the rows their filters removed.
fn scanned(plan: &[String]) -> f64 {
    let num = |line: &str, key: &str| -> Option<f64> {
        let rest = &line[line.find(key)? + key.len()..];
        let end = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        rest[..end].parse().ok()
    };
    let mut total = 0.0;
    let mut scan_loops: Option<f64> = None;
    for line in plan {
        if line.contains("(actual time=") {
            scan_loops = None;
            if line.contains("Scan") {
                let rows = num(line, " rows=").unwrap_or(0.0);
                let loops = num(line, " loops=").unwrap_or(1.0);
                total += rows * loops;
                scan_loops = Some(loops);
            }
        } else if let (Some(loops), Some(removed)) =
            (scan_loops, num(line, "Rows Removed by Filter: "))
        {
            total += removed * loops;
        }
    }
    total
}

fn bursts(samples: &[(f64, bool)]) -> Vec<f64> {
    let mut out = Vec::new();
    let (mut acc, mut quiet, mut open) = (0.0, 0, false);
    let mut prev = samples.first().map_or(0.0, |s| s.0);
    for &(t, busy) in samples.iter().skip(1) {
        let dt = t - prev;
        prev = t;
        if dt > 0.0 || busy {
            acc += dt;
            open = true;
            quiet = 0;
        } else if open {
            quiet += 1;
            if quiet >= 3 {
                if acc > 0.0 {
                    out.push(acc);
                }
                (acc, open) = (0.0, false);
            }
        }
    }
    out
}

/// The counters compared with the ground truth, for the report.
pub fn counters_checked(truth: &Truth) -> usize {
    truth.by_type.len() * 6
}

/// Every counter inboxwatch exports per event type that differs from the
/// truth. `no_cursor`: without a change cursor a duplicate delivery to a
/// finished event is not seen (docs/metrics.md), so the delivery counters
/// are lower bounds: they may be below the truth, never above.
pub fn counter_diff(m: &Metrics, truth: &Truth, no_cursor: bool) -> Vec<String> {
    let mut out = Vec::new();
    for (et, c) in &truth.by_type {
        let l = |extra: Option<(&'static str, &'static str)>| {
            let mut v = vec![("source", "bench"), ("event_type", et.as_str())];
            v.extend(extra);
            v
        };
        for (name, extra, want) in [
            ("inbox_messages_received_total", None, c.received),
            ("inbox_deliveries_total", None, c.deliveries),
            ("inbox_duplicate_deliveries_total", None, c.duplicates),
            ("inbox_attempt_failures_total", None, c.failures),
            (
                "inbox_messages_completed_total",
                Some(("outcome", "succeeded")),
                c.succeeded,
            ),
            (
                "inbox_messages_completed_total",
                Some(("outcome", "dead_lettered")),
                c.dead,
            ),
        ] {
            // Summed over the labels the truth does not split by (`error_class`).
            let got = m.sum(name, &l(extra));
            let bound = no_cursor
                && matches!(
                    name,
                    "inbox_deliveries_total" | "inbox_duplicate_deliveries_total"
                );
            if (bound && got > want as f64) || (!bound && got != want as f64) {
                out.push(format!(
                    "{name}{{event_type={et:?}{extra:?}}}: truth {want}, inboxwatch {got}"
                ));
            }
        }
    }
    out
}

/// inboxwatch's P95 of one event type against the exact percentile_cont.
#[derive(Debug)]
pub struct P95 {
    pub event_type: String,
    pub n: u64,
    pub exact: f64,
    pub agent: f64,
    pub error: f64,
    /// Error against the exact value at the sketch's own rank,
    /// sorted[⌊0.95 (n − 1)⌋] of the writer's durations: what the sketch
    /// guarantees within 0.5 %. With few completions percentile_cont's
    /// interpolation between neighbours adds to `error`.
    pub rank_error: f64,
}

/// The sketch P95 per event type against `percentile_cont(0.95)` of the same
/// completions (the writer's, finished since `run_start` µs), computed by the database.
pub async fn p95_errors(
    conn: &mut AnyConnection,
    d: Dialect,
    m: &Metrics,
    run_start: i64,
    truth: &Truth,
) -> Vec<P95> {
    let t = load::TABLE;
    let sql = match d {
        Dialect::Postgres => format!(
            "SELECT event_type, count(*)::bigint, percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at))::float8 \
             FROM {t} WHERE updated_at >= TIMESTAMPTZ 'epoch' + {run_start} * interval '1 microsecond' \
             AND finished_at IS NOT NULL AND event_id LIKE 'w-%' GROUP BY event_type"
        ),
        Dialect::MySql => format!(
            "SELECT DISTINCT CAST(event_type AS CHAR), CAST(COUNT(*) OVER (PARTITION BY event_type) AS SIGNED), \
             CAST(PERCENTILE_CONT(0.95) WITHIN GROUP (ORDER BY TIMESTAMPDIFF(MICROSECOND, started_at, finished_at) / 1e6) \
             OVER (PARTITION BY event_type) AS DOUBLE) FROM {t} \
             WHERE updated_at >= TIMESTAMPADD(MICROSECOND, {run_start}, '1970-01-01') AND finished_at IS NOT NULL AND event_id LIKE 'w-%'"
        ),
    };
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_all(&mut *conn)
        .await
        .expect("percentile_cont");
    let mut out = Vec::new();
    for r in rows {
        let et: String = r.get(0);
        if et == PROBE_TYPE {
            continue;
        }
        let n: i64 = r.get(1);
        let exact: f64 = r.get(2);
        let agent = m
            .get(
                "inbox_processing_duration_quantile_seconds",
                &[
                    ("source", "bench"),
                    ("event_type", &et),
                    ("quantile", "0.95"),
                ],
            )
            .unwrap_or(f64::NAN);
        let error = ((agent - exact) / exact).abs();
        let mut sorted = truth
            .by_type
            .get(&et)
            .map(|c| c.durations.clone())
            .unwrap_or_default();
        sorted.sort_by(f64::total_cmp);
        let at_rank = sorted
            .get(((sorted.len().max(1) - 1) as f64 * 0.95).floor() as usize)
            .copied()
            .unwrap_or(f64::NAN);
        let rank_error = ((agent - at_rank) / at_rank).abs();
        out.push(P95 {
            rank_error: if rank_error.is_nan() {
                f64::INFINITY
            } else {
                rank_error
            },
            event_type: et,
            n: u64::try_from(n).unwrap_or(0),
            exact,
            agent,
            error: if error.is_nan() { f64::INFINITY } else { error },
        });
    }
    out
}

/// Everything one run found.
pub struct Report {
    pub dialect: Dialect,
    /// The agent ran with `cursor = "none"`.
    pub no_cursor: bool,
    pub rows: u64,
    pub unfinished: u64,
    pub table_bytes: i64,
    pub load_s: f64,
    pub poll: f64,
    pub rate: u64,
    pub changes: u64,
    pub window: f64,
    pub polls: f64,
    pub exporter_refreshes: f64,
    pub totals: Totals,
    pub bursts: Bursts,
    pub cpu: (f64, f64),
    pub rss: (u64, u64),
    pub rows_scanned_exporter: Option<f64>,
    pub fresh_agent: Vec<f64>,
    pub fresh_exporter: Vec<f64>,
    pub fresh_missed: u32,
    pub mismatches: Vec<String>,
    /// Seconds from the writer's last change to the counters' check: to
    /// exact counters, or to the deadline when they differ.
    pub catch_up: f64,
    pub p95: Vec<P95>,
    pub counters_checked: usize,
    pub plans: Vec<(String, Vec<String>)>,
}

fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((s.len() - 1) as f64 * q).round() as usize]
}

fn human(rows: u64) -> String {
    if rows >= 1_000_000 && rows.is_multiple_of(1_000_000) {
        format!("{} M", rows / 1_000_000)
    } else if rows >= 1_000 && rows.is_multiple_of(1_000) {
        format!("{} k", rows / 1_000)
    } else {
        rows.to_string()
    }
}

/// Milliseconds with `digits` decimals, or a dash when not measured.
fn ms(v: f64, digits: usize) -> String {
    if v.is_finite() {
        format!("{v:.digits$}")
    } else {
        "—".to_string()
    }
}

fn ratio(a: f64, b: f64) -> String {
    if a > 0.0 && b.is_finite() {
        format!("{:.0}×", b / a)
    } else {
        "—".to_string()
    }
}

impl Report {
    /// The report as a Markdown section.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        s.push_str(&format!(
            "### {} — {} rows ({} unfinished), {} changes/s, refresh every {} s{}\n\n",
            self.dialect.name(),
            human(self.rows),
            self.unfinished,
            self.rate,
            self.poll,
            if self.no_cursor {
                ", `cursor = \"none\"`"
            } else {
                ""
            }
        ));
        s.push_str(&format!(
            "Table {:.0} MB, built in {:.0} s. Writer: {} row changes in {:.0} s ({:.0}/s). \
             Refreshes in the window: inboxwatch {:.0} polls, prometheus-sql-exporter {:.1}. \
             Load average at the end: {}.\n\n",
            self.table_bytes as f64 / 1e6,
            self.load_s,
            self.changes,
            self.window,
            self.changes as f64 / self.window,
            self.polls,
            self.exporter_refreshes,
            load.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        ));
        let (ta, te) = self.totals.time_ms;
        let refreshes = self.exporter_refreshes.max(1.0);
        let mean = (ta / self.polls, te / refreshes);
        let med = (
            quantile(&self.bursts.agent, 0.5),
            quantile(&self.bursts.exporter, 0.5),
        );
        let p95 = (
            quantile(&self.bursts.agent, 0.95),
            quantile(&self.bursts.exporter, 0.95),
        );
        let per_s = (ta / self.window, te / self.window);
        let fresh_a = (
            quantile(&self.fresh_agent, 0.5),
            quantile(&self.fresh_agent, 1.0),
        );
        let fresh_e = (
            quantile(&self.fresh_exporter, 0.5),
            quantile(&self.fresh_exporter, 1.0),
        );
        let rows_read = (
            self.totals.rows_sent.0 / self.polls,
            self.rows_scanned_exporter
                .unwrap_or(self.totals.work.1 / refreshes),
        );
        s.push_str("| per refresh | inboxwatch | prometheus-sql-exporter | exporter ÷ inboxwatch |\n|---|---:|---:|---:|\n");
        let mut row = |what: &str, a: String, e: String, r: String| {
            s.push_str(&format!("| {what} | {a} | {e} | {r} |\n"));
        };
        row(
            "database time, median (ms)",
            ms(med.0, 2),
            ms(med.1, 1),
            ratio(med.0, med.1),
        );
        row(
            "database time, p95 (ms)",
            ms(p95.0, 2),
            ms(p95.1, 1),
            ratio(p95.0, p95.1),
        );
        row(
            "database time, mean (ms)",
            format!("{:.2}", mean.0),
            format!("{:.1}", mean.1),
            ratio(mean.0, mean.1),
        );
        row(
            "database time per second of wall clock (ms/s)",
            format!("{:.2}", per_s.0),
            format!("{:.1}", per_s.1),
            ratio(per_s.0, per_s.1),
        );
        match self.dialect {
            Dialect::Postgres => {
                row(
                    "rows read (inboxwatch: returned; exporter: scanned, EXPLAIN ANALYZE)",
                    format!("{:.0}", rows_read.0),
                    format!("{:.0}", rows_read.1),
                    ratio(rows_read.0, rows_read.1),
                );
                let pages = (
                    self.totals.work.0 / self.polls,
                    self.totals.work.1 / refreshes,
                );
                row(
                    "8 kB pages touched (shared_blks_hit + read)",
                    format!("{:.0}", pages.0),
                    format!("{:.0}", pages.1),
                    ratio(pages.0, pages.1),
                );
            }
            Dialect::MySql => {
                let ex = (
                    self.totals.work.0 / self.polls,
                    self.totals.work.1 / refreshes,
                );
                row(
                    "rows examined (performance_schema)",
                    format!("{:.0}", ex.0),
                    format!("{:.0}", ex.1),
                    ratio(ex.0, ex.1),
                );
            }
        }
        row(
            "CPU of the exporter process (% of one core)",
            format!("{:.2}", 100.0 * self.cpu.0 / self.window),
            format!("{:.2}", 100.0 * self.cpu.1 / self.window),
            String::new(),
        );
        row(
            "peak RSS of the exporter process (MB)",
            format!("{:.1}", self.rss.0 as f64 / 1024.0),
            format!("{:.1}", self.rss.1 as f64 / 1024.0),
            String::new(),
        );
        row(
            "freshness: change → /metrics, median / max (s)",
            format!("{:.1} / {:.1}", fresh_a.0, fresh_a.1),
            format!("{:.1} / {:.1}", fresh_e.0, fresh_e.1),
            String::new(),
        );
        let worst = self.p95.iter().map(|p| p.error).fold(0.0, f64::max);
        row(
            "counters vs writer's ground truth",
            if self.mismatches.is_empty() && self.no_cursor {
                format!(
                    "exact ({} of {}; the {} delivery counters within their lower bound)",
                    self.counters_checked - self.counters_checked / 3,
                    self.counters_checked - self.counters_checked / 3,
                    self.counters_checked / 3
                )
            } else if self.mismatches.is_empty() {
                format!(
                    "exact ({} of {})",
                    self.counters_checked, self.counters_checked
                )
            } else {
                format!(
                    "{} of {} differ",
                    self.mismatches.len(),
                    self.counters_checked
                )
            } + &format!(", {:.1} s after the writer's last change", self.catch_up),
            "no counters (5-min window counts)".to_string(),
            String::new(),
        );
        row(
            "P95 vs percentile_cont of the same completions (worst event type)",
            format!(
                "{:.2} % off ({:.2} % at the sketch's rank)",
                worst * 100.0,
                self.p95.iter().map(|p| p.rank_error).fold(0.0, f64::max) * 100.0
            ),
            "is percentile_cont".to_string(),
            String::new(),
        );
        s.push('\n');
        if self.fresh_missed > 0 {
            s.push_str(&format!(
                "{} freshness probes did not show within 60 s.\n\n",
                self.fresh_missed
            ));
        }
        s.push_str("<details><summary>P95 per event type</summary>\n\n| event type | completions | percentile_cont (s) | inboxwatch (s) | error | error at the sketch's rank |\n|---|---:|---:|---:|---:|---:|\n");
        for p in &self.p95 {
            s.push_str(&format!(
                "| {} | {} | {:.4} | {:.4} | {:.2} % | {:.2} % |\n",
                p.event_type,
                p.n,
                p.exact,
                p.agent,
                p.error * 100.0,
                p.rank_error * 100.0
            ));
        }
        s.push_str("\n</details>\n");
        for (what, plan) in &self.plans {
            // The statement table is not a plan.
            let title = if what.starts_with("inboxwatch's statements")
                || what == crate::plans::NOT_CAPTURED
            {
                what.clone()
            } else if self.dialect == Dialect::MySql {
                format!("ANALYZE FORMAT=JSON, inboxwatch: {what}")
            } else {
                format!("EXPLAIN (ANALYZE, BUFFERS), inboxwatch: {what}")
            };
            s.push_str(&format!(
                "\n<details><summary>{title}</summary>\n\n```\n{}\n```\n\n</details>\n",
                plan.join("\n")
            ));
        }
        if !self.mismatches.is_empty() {
            s.push_str(&format!(
                "\nCounter mismatches:\n\n```\n{}\n```\n",
                self.mismatches.join("\n")
            ));
        }
        s
    }
}
