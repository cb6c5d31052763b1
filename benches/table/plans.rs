//! The plans of the statements inboxwatch ran, as it ran them: captured
//! for a few seconds after the measured window while the writer goes on at
//! the same rate, so that what the capture costs is not in the figures.
//!
//! * PostgreSQL: `auto_explain` (preloaded by `scripts/bench.sh`, off until
//!   here) logs EXPLAIN (ANALYZE, BUFFERS) of every statement into the
//!   server's log, read back with `pg_read_file`. These are the plans the
//!   agent's sessions execute (their generic plans, parameters as `$n`),
//!   not plans of a text rebuilt from `pg_stat_statements`.
//! * MariaDB: the general query log, on from the server's start (it writes
//!   a prepared statement's values into its text only when it was on at the
//!   prepare) and written nowhere until here, into the table
//!   `mysql.general_log`, holds each executed statement with its values; the
//!   last of each kind is run again under `ANALYZE FORMAT=JSON`.
//!
//! A capture that fails says why in the report instead of a plan, and fails
//! the run under `--check` (CI's runs of the bench).

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::{AnyConnection, Row};

use crate::{AGENT_USER, Dialect, exec, load};

/// The server's log file, relative to the data directory (`scripts/bench.sh`
/// starts the cluster with `pg_ctl -l $WORK/pg/server.log`, `-D $WORK/pg`).
const PG_LOG: &str = "server.log";

/// PostgreSQL settings switched on for the capture (all reloadable, so the
/// agent's open sessions take them at their next statement).
const PG_SETTINGS: [(&str, &str); 6] = [
    ("auto_explain.log_min_duration", "0"),
    ("auto_explain.log_analyze", "'on'"),
    ("auto_explain.log_buffers", "'on'"),
    ("auto_explain.log_timing", "'on'"),
    ("auto_explain.log_format", "'text'"),
    ("log_line_prefix", "'%m [%p] user=%u '"),
];

/// The title of the report's entry that says why there are no plans.
pub const NOT_CAPTURED: &str = "the agent's plans were not captured";

/// Where a capture began, or why it could not begin.
pub enum Capture {
    /// The server log's length in bytes.
    Postgres(i64),
    /// The server's time, and the log output to restore (`MY_SLOW_LOG`
    /// keeps the slow log in a file).
    MySql {
        from: String,
        output: String,
    },
    Failed(String),
}

/// Switches the capture on.
pub async fn start(conn: &mut AnyConnection, d: Dialect) -> Capture {
    let started = match d {
        Dialect::Postgres => pg_start(conn).await,
        Dialect::MySql => my_start(conn).await,
    };
    started.unwrap_or_else(Capture::Failed)
}

/// Switches the capture off and returns a plan per kind of statement the
/// agent ran on the bench table, titled by what it is, or why there are
/// none.
pub async fn finish(
    conn: &mut AnyConnection,
    capture: Capture,
) -> Result<Vec<(String, Vec<String>)>, String> {
    match capture {
        Capture::Failed(e) => Err(e),
        Capture::Postgres(from) => pg_finish(conn, from).await,
        Capture::MySql { from, output } => my_finish(conn, &from, &output).await,
    }
}

async fn pg_start(conn: &mut AnyConnection) -> Result<Capture, String> {
    let size: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT size FROM pg_stat_file('{PG_LOG}')"
    )))
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| format!("the server's log {PG_LOG}: {e}"))?;
    for (name, value) in PG_SETTINGS {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER SYSTEM SET {name} = {value}"
        )))
        .execute(&mut *conn)
        .await
        .map_err(|e| format!("ALTER SYSTEM SET {name}: {e}"))?;
    }
    reload(conn).await?;
    Ok(Capture::Postgres(size))
}

async fn reload(conn: &mut AnyConnection) -> Result<(), String> {
    sqlx::query("SELECT pg_reload_conf()")
        .execute(&mut *conn)
        .await
        .map(|_| ())
        .map_err(|e| format!("pg_reload_conf(): {e}"))
}

async fn pg_finish(
    conn: &mut AnyConnection,
    from: i64,
) -> Result<Vec<(String, Vec<String>)>, String> {
    for (name, _) in PG_SETTINGS {
        exec(conn, &format!("ALTER SYSTEM RESET {name}")).await;
    }
    reload(conn).await?;
    let text: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT pg_read_file('{PG_LOG}', {from}, \
         (SELECT size FROM pg_stat_file('{PG_LOG}')) - {from})"
    )))
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| format!("reading {PG_LOG}: {e}"))?;
    let plans = pg_plans(&text);
    if plans.is_empty() {
        return Err(format!(
            "auto_explain logged no plan of {AGENT_USER}'s statements on {} \
             (is auto_explain in shared_preload_libraries?)",
            load::TABLE
        ));
    }
    Ok(plans)
}

/// The plans `auto_explain` logged for the agent's statements on the bench
/// table in `log`: the last of each kind, titled with how many ran.
fn pg_plans(log: &str) -> Vec<(String, Vec<String>)> {
    let marker = format!(" user={AGENT_USER} LOG:  duration: ");
    let mut entries: Vec<(String, Vec<String>)> = Vec::new();
    let mut lines = log.lines().peekable();
    while let Some(line) = lines.next() {
        if !(line.contains(&marker) && line.ends_with("plan:")) {
            continue;
        }
        let mut body = Vec::new();
        while let Some(next) = lines.next_if(|l| l.starts_with('\t')) {
            body.push(next[1..].to_string());
        }
        let Some(query) = body
            .first()
            .and_then(|q| q.strip_prefix("Query Text: "))
            .map(str::to_string)
        else {
            continue;
        };
        entries.push((query, body.split_off(1)));
    }
    last_of_each(entries)
        .into_iter()
        .map(|(title, query, plan)| (title, with_text(&query, plan)))
        .collect()
}

/// The last entry of each kind of statement on the bench table, in the
/// order the kinds first ran: (title with the kind and how many ran, the
/// statement, its plan).
fn last_of_each(entries: Vec<(String, Vec<String>)>) -> Vec<(String, String, Vec<String>)> {
    let mut order: Vec<String> = Vec::new();
    let mut by: BTreeMap<String, (usize, String, Vec<String>)> = BTreeMap::new();
    for (query, plan) in entries {
        if !query.contains(load::TABLE) {
            continue;
        }
        let key = kind(&query);
        let e = by.entry(key.clone()).or_insert_with(|| {
            order.push(key.clone());
            (0, String::new(), Vec::new())
        });
        e.0 += 1;
        e.1 = query;
        e.2 = plan;
    }
    let kinds: Vec<(usize, String, Vec<String>, String)> = order
        .into_iter()
        .filter_map(|key| by.remove(&key))
        .map(|(n, query, plan)| {
            let label = crate::measure::statement_label(&query.replace('`', "\""));
            let label = label.trim().trim_matches(|c| c == '[' || c == ']');
            let what = if label.is_empty() {
                format!("{}…", query.chars().take(100).collect::<String>())
            } else {
                label.to_string()
            };
            (n, query, plan, what)
        })
        .collect();
    kinds
        .iter()
        .map(|(n, query, plan, what)| {
            // Kinds of one label (MariaDB's tail of each time column) told
            // apart by the column they are ordered by.
            let twins = kinds.iter().filter(|k| &k.3 == what).count();
            let by = query
                .rsplit_once(" ORDER BY ")
                .and_then(|(_, o)| o.split_whitespace().next())
                .filter(|_| twins > 1)
                .map_or(String::new(), |c| format!(" of {c}"));
            (
                format!("{what}{by} (the last of {n} in the capture)"),
                query.clone(),
                plan.clone(),
            )
        })
        .collect()
}

/// `query` with its select list shortened to `…` where the list is longer
/// than `longer_than` characters (the agent's columns, each cast).
fn without_select_list(query: &str, longer_than: usize) -> String {
    match (query.strip_prefix("SELECT "), query.find(" FROM ")) {
        (Some(_), Some(from)) if from > longer_than => format!("SELECT …{}", &query[from..]),
        _ => query.to_string(),
    }
}

/// The statement's text above its plan: a long select list shortened, then
/// the first 600 characters.
fn with_text(query: &str, plan: Vec<String>) -> Vec<String> {
    let short: String = without_select_list(query, 80).chars().take(600).collect();
    std::iter::once(format!("-- {short}")).chain(plan).collect()
}

/// A statement's kind: its text without the select list, literals, numbers
/// and parameter numbers (an id list's length varies).
fn kind(query: &str) -> String {
    let mut out = String::new();
    let rest = without_select_list(query, 0);
    let mut chars = rest.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                for n in chars.by_ref() {
                    if n == '\'' {
                        break;
                    }
                }
                out.push('?');
            }
            '$' | '0'..='9' => {
                while chars.next_if(|n| n.is_ascii_digit()).is_some() {}
                out.push('?');
            }
            _ => out.push(c),
        }
    }
    // `IN (?, ?, …)` of any length.
    while let Some(i) = out.find("?, ?") {
        out.replace_range(i..i + 4, "?");
    }
    out
}

/// Begins at the server's time, once the log output goes to the table.
async fn my_start(conn: &mut AnyConnection) -> Result<Capture, String> {
    let row = sqlx::query(
        "SELECT CAST(NOW(6) AS CHAR), CAST(@@GLOBAL.log_output AS CHAR), \
         CAST(@@GLOBAL.general_log AS SIGNED)",
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| format!("NOW(6), log_output, general_log: {e}"))?;
    let (from, output, on): (String, String, i64) = (row.get(0), row.get(1), row.get(2));
    if on != 1 {
        // Switched on now, it would log the agent's prepared statements
        // without their values.
        return Err(
            "the general query log was off as the agent prepared its statements \
             (scripts/bench.sh starts mariadbd with --general-log=1)"
                .to_string(),
        );
    }
    sqlx::query("SET GLOBAL log_output = 'TABLE'")
        .execute(&mut *conn)
        .await
        .map_err(|e| format!("SET GLOBAL log_output = 'TABLE': {e}"))?;
    Ok(Capture::MySql { from, output })
}

async fn my_finish(
    conn: &mut AnyConnection,
    from: &str,
    output: &str,
) -> Result<Vec<(String, Vec<String>)>, String> {
    exec(conn, &format!("SET GLOBAL log_output = '{output}'")).await;
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT CAST(argument AS CHAR) FROM mysql.general_log \
         WHERE event_time >= '{from}' AND user_host LIKE '{AGENT_USER}[%' \
         AND command_type IN ('Execute', 'Query') ORDER BY event_time"
    )))
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| format!("reading mysql.general_log: {e}"))?;
    // TRUNCATE needs the log off; it stays on for the next run.
    exec(conn, "SET GLOBAL general_log = 0").await;
    exec(conn, "TRUNCATE TABLE mysql.general_log").await;
    exec(conn, "SET GLOBAL general_log = 1").await;
    let statements: Vec<(String, Vec<String>)> = rows
        .iter()
        .filter_map(|r| r.try_get::<String, _>(0).ok())
        .filter(|q| q.trim_start().starts_with("SELECT"))
        .map(|q| (q.trim().to_string(), Vec::new()))
        .collect();
    let kinds = last_of_each(statements);
    if kinds.is_empty() {
        return Err(format!(
            "the general log holds no statement of {AGENT_USER}'s on {}",
            load::TABLE
        ));
    }
    let mut out = Vec::new();
    for (title, query, _) in kinds {
        // In the text protocol: under the binary one (`sqlx::query`) the
        // statement's answer never came.
        let analyze = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("ANALYZE FORMAT=JSON {query}")))
            .fetch_all(&mut *conn);
        let plan = match tokio::time::timeout(Duration::from_secs(60), analyze).await {
            Ok(Ok(rows)) => rows
                .iter()
                .filter_map(|r| r.try_get::<String, _>(0).ok())
                .flat_map(|p| p.lines().map(str::to_string).collect::<Vec<_>>())
                .collect(),
            Ok(Err(e)) => vec![format!("ANALYZE failed: {e}")],
            Err(_) => vec!["ANALYZE failed: no answer in 60 s".to_string()],
        };
        out.push((title, with_text(&query, plan)));
    }
    Ok(out)
}
