//! `inboxwatch dead-letters replay` and `ignore` on an inbox table, and the
//! history they leave in the audit table.
//!
//! The actions are the only writes inboxwatch makes, and the agent process
//! never makes them: they connect with `[sources.dead_letter_actions] dsn`,
//! a separate write-capable DSN that only [`connect`] opens, and only the
//! command line reaches [`act`]. Each event is one transaction: the row is
//! locked, re-checked to be dead, changed, and the action recorded in the
//! audit table — or nothing changes. The history is read over the agent's own
//! read-only connection.

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Connection, Row as _};

use super::config::{DeadLetterActions, InboxSpec, Status, runs_table};
use super::inbox::Inbox;
use super::lookup::open;
use super::sql::Sql;
use super::{TableSource, get};
use crate::dsn::Dialect;
use crate::sources::kind::{
    Action, ActionError, ActionOutcome, ActionRequest, AuditEntry, Run, RunCounts,
};

/// How long an action waits for a row the consumer holds locked.
const LOCK_WAIT_SECS: u64 = 10;

/// Event ids per history query.
const HISTORY_CHUNK: usize = 500;

/// Opens the write-capable action DSN: the one place that does.
async fn connect(spec: &InboxSpec, a: &DeadLetterActions) -> Result<AnyConnection, ActionError> {
    let failed = |e: sqlx::Error| {
        ActionError::Failed(format!(
            "{}.dead_letter_actions.dsn: cannot connect to {}: {}",
            spec.table.key,
            a.dsn,
            a.dsn.scrub(&e.to_string())
        ))
    };
    let mut conn = AnyConnection::connect(a.dsn.expose())
        .await
        .map_err(failed)?;
    let setup: Vec<String> = match a.dsn.dialect() {
        Dialect::Postgres => vec![
            "SET TIME ZONE 'UTC'".into(),
            "SET application_name = 'inboxwatch-dead-letters'".into(),
            format!("SET lock_timeout = '{LOCK_WAIT_SECS}s'"),
        ],
        Dialect::MySql => vec![
            "SET time_zone = '+00:00'".into(),
            format!("SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_SECS}"),
        ],
        Dialect::Sqlite => vec![format!("PRAGMA busy_timeout = {}", LOCK_WAIT_SECS * 1000)],
    };
    for stmt in setup {
        sqlx::raw_sql(sqlx::AssertSqlSafe(stmt))
            .execute(&mut conn)
            .await
            .map_err(failed)?;
    }
    Ok(conn)
}

/// The database's now, as a value of the dialect's time columns.
fn now(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => "now()",
        Dialect::MySql => "UTC_TIMESTAMP(6)",
        Dialect::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now')",
    }
}

async fn exec(conn: &mut AnyConnection, stmt: &str) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(stmt.to_string()))
        .execute(conn)
        .await
        .map(drop)
}

/// `dead-letters replay` / `ignore`: one transaction per event, an outcome
/// line for each. `Err` when nothing could be tried at all.
pub(crate) async fn act(
    spec: &InboxSpec,
    req: &ActionRequest,
) -> Result<Vec<ActionOutcome>, ActionError> {
    let a = spec.actions.as_ref().ok_or(ActionError::NotConfigured)?;
    let mut conn = connect(spec, a).await?;
    let sql = Sql {
        dialect: a.dsn.dialect(),
    };
    let present = sqlx::query(sqlx::AssertSqlSafe(sql.columns_query(&a.audit_table)))
        .fetch_all(&mut conn)
        .await
        .map_err(|e| ActionError::Failed(db_error(&e, spec, a)))?;
    if present.is_empty() {
        let _ = conn.close().await;
        return Err(ActionError::Failed(format!(
            "audit table \"{}\" does not exist or the action DSN's user cannot see it \
             ({}.dead_letter_actions.audit_table): create it with the DDL `inboxwatch schema \
             --config FILE` prints; nothing was changed",
            a.audit_table, spec.table.key
        )));
    }
    if req.run_id.is_some() && !has_run_id(&present) {
        let _ = conn.close().await;
        return Err(ActionError::Failed(no_run_id(sql, a)));
    }
    let mut out = Vec::new();
    for id in &req.event_ids {
        let outcome = match one(&mut conn, sql, spec, a, req, id).await {
            Ok(o) => o,
            Err(e) => {
                let _ = exec(&mut conn, "ROLLBACK").await;
                ActionOutcome {
                    event_id: id.clone(),
                    done: false,
                    line: format!("failed {id}: {}; nothing changed", db_error(&e, spec, a)),
                }
            }
        };
        out.push(outcome);
    }
    let _ = conn.close().await;
    Ok(out)
}

/// A database error as the operator needs it: a missing privilege said so,
/// by its code (PostgreSQL SQLSTATE 42501; MariaDB/MySQL errors 1142, 1143,
/// 1044, 1227; SQLite's SQLITE_READONLY family), with what the action DSN's
/// user needs.
fn db_error(e: &sqlx::Error, spec: &InboxSpec, a: &DeadLetterActions) -> String {
    let text = a.dsn.scrub(&e.to_string());
    let denied = match e {
        sqlx::Error::Database(d) => {
            let sqlite_readonly = d.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
                && d.code()
                    .and_then(|c| c.parse::<i32>().ok())
                    .is_some_and(|c| c & 0xff == 8);
            d.code().as_deref() == Some("42501")
                || d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                    .is_some_and(|m| matches!(m.number(), 1142 | 1143 | 1044 | 1227))
                || sqlite_readonly
        }
        _ => false,
    };
    if denied {
        format!(
            "permission denied: the dead_letter_actions DSN's user needs SELECT and UPDATE on \
             \"{}\" and INSERT on \"{}\" ({text})",
            spec.table.table, a.audit_table
        )
    } else {
        text
    }
}

/// What the row says before the action.
struct Row {
    meaning: Option<Status>,
    word: Option<String>,
    attempts: Option<i64>,
    last_error: Option<String>,
}

fn read_row(spec: &InboxSpec, row: &AnyRow) -> Result<Row, String> {
    let meaning: Option<String> = get(row, 0, "status")?;
    Ok(Row {
        meaning: spec.meaning_of(meaning.as_deref().unwrap_or_default()),
        word: get(row, 1, "status")?,
        attempts: get(row, 2, "attempts")?,
        last_error: get(row, 3, "last_error")?,
    })
}

/// The row's meaning, status word, attempts and last error, by event id
/// (locked for update when `lock`).
fn select_row(sql: Sql, spec: &InboxSpec, id: &str, lock: bool) -> String {
    let c = &spec.columns;
    let status = c
        .status
        .as_deref()
        .expect("dead_letter_actions are validated to need a status column");
    let opt = |col: &Option<String>, f: &dyn Fn(&str) -> String| {
        col.as_deref()
            .map_or("NULL".to_string(), |c| f(&sql.ident(c)))
    };
    format!(
        "SELECT {}, {}, {}, {} FROM {} WHERE {} = {}{}",
        spec.status_select(&sql),
        sql.text(&sql.ident(status)),
        opt(&c.attempts, &|e| sql.int(e)),
        opt(&c.last_error, &|e| sql.text(e)),
        sql.table(&spec.table.table),
        sql.ident(&c.event_id),
        sql.literal(id),
        if lock && sql.dialect != Dialect::Sqlite {
            " FOR UPDATE"
        } else {
            ""
        }
    )
}

/// One event's transaction. `Err` on a database error (the caller rolls back).
async fn one(
    conn: &mut AnyConnection,
    sql: Sql,
    spec: &InboxSpec,
    a: &DeadLetterActions,
    req: &ActionRequest,
    id: &str,
) -> Result<ActionOutcome, sqlx::Error> {
    let outcome = |done: bool, line: String| ActionOutcome {
        event_id: id.to_string(),
        done,
        line,
    };
    exec(conn, begin(sql.dialect, req.apply)).await?;
    let row = match dead_row(conn, sql, spec, id, req.apply).await? {
        Ok(row) => row,
        Err(refused) => {
            exec(conn, "ROLLBACK").await?;
            return Ok(outcome(false, refused));
        }
    };
    let change = Change::of(sql, spec, a, req.action, &row);
    let what = format!(
        "{}; audit row in \"{}\"",
        change.said.join(", "),
        a.audit_table
    );
    if !req.apply {
        exec(conn, "ROLLBACK").await?;
        let verb = match req.action {
            Action::Replay => "replay",
            Action::Ignore => "ignore",
        };
        return Ok(outcome(true, format!("would {verb} {id}: {what}")));
    }
    if let Some(refused) = update(conn, sql, spec, a, req.action, id, &change.sets).await? {
        exec(conn, "ROLLBACK").await?;
        return Ok(outcome(false, refused));
    }
    record(conn, sql, spec, a, req, id, &row).await?;
    exec(conn, "COMMIT").await?;
    let done = match req.action {
        Action::Replay => "replayed",
        Action::Ignore => "ignored",
    };
    Ok(outcome(true, format!("{done} {id}: {what}")))
}

/// The statement that opens an event's transaction: read-only for a dry run
/// where the dialect has one; on SQLite, one that takes the write lock at
/// once when the action applies.
fn begin(dialect: Dialect, apply: bool) -> &'static str {
    match (dialect, apply) {
        (Dialect::Sqlite, true) => "BEGIN IMMEDIATE",
        (Dialect::Sqlite, false) => "BEGIN",
        (Dialect::Postgres, false) => "BEGIN READ ONLY",
        (Dialect::MySql, false) => "START TRANSACTION READ ONLY",
        (_, true) => "BEGIN",
    }
}

/// The event's row (locked when the action applies), or why the action is
/// refused: no such event, or not dead.
async fn dead_row(
    conn: &mut AnyConnection,
    sql: Sql,
    spec: &InboxSpec,
    id: &str,
    lock: bool,
) -> Result<Result<Row, String>, sqlx::Error> {
    let found = sqlx::query(sqlx::AssertSqlSafe(select_row(sql, spec, id, lock)))
        .fetch_optional(&mut *conn)
        .await?;
    let Some(found) = found else {
        return Ok(Err(format!("refused {id}: not found")));
    };
    let row = read_row(spec, &found).map_err(sqlx::Error::Protocol)?;
    if row.meaning == Some(Status::Dead) {
        return Ok(Ok(row));
    }
    let word = row.word.as_deref().unwrap_or_default();
    let meaning = row.meaning.map_or("not in the status map", Status::as_str);
    Ok(Err(format!(
        "refused {id}: status is \"{word}\" ({meaning}), not dead; nothing changed"
    )))
}

/// What an action changes in a dead row: the `SET` clauses, and each change
/// as the outcome line says it.
struct Change {
    sets: Vec<String>,
    said: Vec<String>,
}

impl Change {
    /// What `action` changes in `row`: its status word (`ignore` without an
    /// `ignored_status` keeps it), its attempts (reset by `replay` with
    /// `reset_attempts`), and with any change its change cursor.
    fn of(sql: Sql, spec: &InboxSpec, a: &DeadLetterActions, action: Action, row: &Row) -> Change {
        let c = &spec.columns;
        let word = row.word.as_deref().unwrap_or_default();
        let mut change = Change {
            sets: Vec::new(),
            said: Vec::new(),
        };
        let new_word = match action {
            Action::Replay => Some(a.replay_status.as_str()),
            Action::Ignore => a.ignored_status.as_deref(),
        };
        match new_word {
            Some(w) => {
                let status = c.status.as_deref().unwrap_or_default();
                change.set(sql.ident(status), sql.literal(w));
                change.said.push(format!("status \"{word}\" → \"{w}\""));
            }
            None => change.said.push(format!("status \"{word}\" kept")),
        }
        if let Some(col) = &c.attempts {
            let n = row.attempts.map_or("NULL".to_string(), |n| n.to_string());
            if action == Action::Replay && a.reset_attempts {
                change.set(sql.ident(col), "0".to_string());
                change.said.push(format!("attempts {n} → 0"));
            } else {
                change.said.push(format!("attempts {n} kept"));
            }
        }
        // The agent tails the change cursor: without the bump it would never
        // see the row change.
        if let Some(col) = c.updated_at.as_ref().filter(|_| !change.sets.is_empty()) {
            change.set(sql.ident(col), now(sql.dialect).to_string());
            change.said.push("updated_at → now".to_string());
        }
        change
    }

    fn set(&mut self, column: String, value: String) {
        self.sets.push(format!("{column} = {value}"));
    }
}

/// Writes the change; with status rules, reads the row again, and refuses
/// a replay whose row the rules do not take as unfinished (the caller rolls
/// it back).
async fn update(
    conn: &mut AnyConnection,
    sql: Sql,
    spec: &InboxSpec,
    a: &DeadLetterActions,
    action: Action,
    id: &str,
    sets: &[String],
) -> Result<Option<String>, sqlx::Error> {
    if !sets.is_empty() {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "UPDATE {} SET {} WHERE {} = {}",
            sql.table(&spec.table.table),
            sets.join(", "),
            sql.ident(&spec.columns.event_id),
            sql.literal(id)
        )))
        .execute(&mut *conn)
        .await?;
    }
    // With status rules the new word alone does not decide what the row
    // means: a replayed row must come out unfinished, or nothing changes.
    if action != Action::Replay || spec.rules.is_empty() {
        return Ok(None);
    }
    let again = sqlx::query(sqlx::AssertSqlSafe(select_row(sql, spec, id, false)))
        .fetch_one(&mut *conn)
        .await?;
    let after = read_row(spec, &again).map_err(sqlx::Error::Protocol)?;
    if matches!(after.meaning, Some(Status::Pending | Status::Failed)) {
        return Ok(None);
    }
    let meaning = after
        .meaning
        .map_or("not in the status map", Status::as_str);
    Ok(Some(format!(
        "refused {id}: with status \"{}\" the status rules say the row is {meaning}, \
         not pending ({}.dead_letter_actions.replay_status); nothing changed",
        a.replay_status, spec.table.key
    )))
}

/// Whether the audit table's columns (a `columns_query` answer) include
/// `run_id`.
fn has_run_id(columns: &[AnyRow]) -> bool {
    columns.iter().any(|r| {
        r.try_get::<String, _>(0)
            .is_ok_and(|c| c.eq_ignore_ascii_case("run_id"))
    })
}

/// Why a bulk run cannot be recorded in an audit table made before runs.
fn no_run_id(sql: Sql, a: &DeadLetterActions) -> String {
    let word = match sql.dialect {
        Dialect::MySql => "VARCHAR(191)",
        _ => "TEXT",
    };
    format!(
        "audit table \"{}\" has no run_id column: it was made before bulk runs; add it with \
         `ALTER TABLE {} ADD COLUMN run_id {word}` and create the runs table with the DDL \
         `inboxwatch schema --config FILE` prints; nothing was changed",
        a.audit_table,
        sql.table(&a.audit_table)
    )
}

/// The audit row of the action, with what the row showed before it.
async fn record(
    conn: &mut AnyConnection,
    sql: Sql,
    spec: &InboxSpec,
    a: &DeadLetterActions,
    req: &ActionRequest,
    id: &str,
    row: &Row,
) -> Result<(), sqlx::Error> {
    let p = |n| sql.placeholder(n);
    // The run id only when there is one: an audit table made before bulk
    // runs has no such column, and single actions still work on it.
    let (run_col, run_value) = match req.run_id {
        Some(_) => (format!(", {}", sql.ident("run_id")), format!(", {}", p(9))),
        None => (String::new(), String::new()),
    };
    let insert = format!(
        "INSERT INTO {} ({}, {}, {}, {}, {}, {}, {}, {}, {}{run_col}) \
         VALUES ({}, {}, {}, {}, {}, {}, {}, {}, {}{run_value})",
        sql.table(&a.audit_table),
        sql.ident("source"),
        sql.ident("event_id"),
        sql.ident("action"),
        sql.ident("operator"),
        sql.ident("reason"),
        sql.ident("at"),
        sql.ident("previous_status"),
        sql.ident("attempts"),
        sql.ident("last_error"),
        p(1),
        p(2),
        p(3),
        p(4),
        p(5),
        now(sql.dialect),
        p(6),
        p(7),
        p(8),
    );
    let mut q = sqlx::query(sqlx::AssertSqlSafe(insert))
        .bind(spec.table.name.clone())
        .bind(id.to_string())
        .bind(req.action.as_str())
        .bind(req.operator.clone())
        .bind(req.reason.clone())
        .bind(row.word.clone())
        .bind(row.attempts)
        .bind(row.last_error.clone());
    if let Some(run) = &req.run_id {
        q = q.bind(run.clone());
    }
    q.execute(&mut *conn).await?;
    Ok(())
}

/// Opens the action DSN and checks that the audit table has `run_id` and
/// the runs table exists: what every bulk run needs before it writes.
async fn open_runs(spec: &InboxSpec) -> Result<(AnyConnection, Sql, String), ActionError> {
    let a = spec.actions.as_ref().ok_or(ActionError::NotConfigured)?;
    let mut conn = connect(spec, a).await?;
    let sql = Sql {
        dialect: a.dsn.dialect(),
    };
    let runs = runs_table(&a.audit_table);
    let columns = |t: &str| sqlx::query(sqlx::AssertSqlSafe(sql.columns_query(t)));
    let audit = columns(&a.audit_table)
        .fetch_all(&mut conn)
        .await
        .map_err(|e| ActionError::Failed(db_error(&e, spec, a)))?;
    let problem = if audit.is_empty() {
        Some(format!(
            "audit table \"{}\" does not exist or the action DSN's user cannot see it \
             ({}.dead_letter_actions.audit_table): create it with the DDL `inboxwatch schema \
             --config FILE` prints; nothing was changed",
            a.audit_table, spec.table.key
        ))
    } else if !has_run_id(&audit) {
        Some(no_run_id(sql, a))
    } else {
        let present = columns(&runs)
            .fetch_all(&mut conn)
            .await
            .map_err(|e| ActionError::Failed(db_error(&e, spec, a)))?;
        present.is_empty().then(|| {
            format!(
                "runs table \"{runs}\" does not exist or the action DSN's user cannot see it: \
                 create it with the DDL `inboxwatch schema --config FILE` prints (it sits \
                 beside {}.dead_letter_actions.audit_table); nothing was changed",
                spec.table.key
            )
        })
    };
    if let Some(p) = problem {
        let _ = conn.close().await;
        return Err(ActionError::Failed(p));
    }
    Ok((conn, sql, runs))
}

/// A count as the runs table keeps it.
fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A bulk run's row, written before its first event.
pub(crate) async fn begin_run(spec: &InboxSpec, run: &Run) -> Result<(), ActionError> {
    let (mut conn, sql, runs) = open_runs(spec).await?;
    let a = spec.actions.as_ref().ok_or(ActionError::NotConfigured)?;
    let p = |n| sql.placeholder(n);
    let cols = [
        "id",
        "source",
        "action",
        "operator",
        "reason",
        "selection",
        "rate",
        "started_at",
        "total",
        "done",
        "skipped",
        "failed",
        "event_ids",
    ];
    let values = [
        p(1),
        p(2),
        p(3),
        p(4),
        p(5),
        p(6),
        p(7),
        now(sql.dialect).to_string(),
        p(8),
        p(9),
        p(10),
        p(11),
        p(12),
    ];
    let insert = format!(
        "INSERT INTO {} ({}) VALUES ({})",
        sql.table(&runs),
        cols.map(|c| sql.ident(c)).join(", "),
        values.join(", ")
    );
    let ids = serde_json::to_string(&run.event_ids).unwrap_or_default();
    let result = sqlx::query(sqlx::AssertSqlSafe(insert))
        .bind(run.id.clone())
        .bind(spec.table.name.clone())
        .bind(run.action.as_str())
        .bind(run.operator.clone())
        .bind(run.reason.clone())
        .bind(run.selection.clone())
        .bind(i64::from(run.rate))
        .bind(count(run.event_ids.len() as u64))
        .bind(count(run.counts.done))
        .bind(count(run.counts.skipped))
        .bind(count(run.counts.failed))
        .bind(ids)
        .execute(&mut conn)
        .await;
    let _ = conn.close().await;
    result
        .map(drop)
        .map_err(|e| ActionError::Failed(db_error(&e, spec, a)))
}

/// A bulk run's counts, and its end when `finished`.
pub(crate) async fn update_run(
    spec: &InboxSpec,
    run_id: &str,
    counts: RunCounts,
    finished: bool,
) -> Result<(), ActionError> {
    let a = spec.actions.as_ref().ok_or(ActionError::NotConfigured)?;
    let mut conn = connect(spec, a).await?;
    let sql = Sql {
        dialect: a.dsn.dialect(),
    };
    let update = format!(
        "UPDATE {} SET {} = {}, {} = {}, {} = {}{} WHERE {} = {}",
        sql.table(&runs_table(&a.audit_table)),
        sql.ident("done"),
        sql.placeholder(1),
        sql.ident("skipped"),
        sql.placeholder(2),
        sql.ident("failed"),
        sql.placeholder(3),
        if finished {
            format!(", {} = {}", sql.ident("finished_at"), now(sql.dialect))
        } else {
            String::new()
        },
        sql.ident("id"),
        sql.placeholder(4),
    );
    let result = sqlx::query(sqlx::AssertSqlSafe(update))
        .bind(count(counts.done))
        .bind(count(counts.skipped))
        .bind(count(counts.failed))
        .bind(run_id.to_string())
        .execute(&mut conn)
        .await;
    let _ = conn.close().await;
    result
        .map(drop)
        .map_err(|e| ActionError::Failed(db_error(&e, spec, a)))
}

/// A bulk run as its row says, and the events its audit rows say it has
/// done.
pub(crate) async fn load_run(
    spec: &InboxSpec,
    run_id: &str,
) -> Result<(Run, Vec<String>), ActionError> {
    let (mut conn, sql, runs) = open_runs(spec).await?;
    let a = spec.actions.as_ref().ok_or(ActionError::NotConfigured)?;
    let found = read_run(&mut conn, sql, spec, a, &runs, run_id).await;
    let _ = conn.close().await;
    found
}

async fn read_run(
    conn: &mut AnyConnection,
    sql: Sql,
    spec: &InboxSpec,
    a: &DeadLetterActions,
    runs: &str,
    run_id: &str,
) -> Result<(Run, Vec<String>), ActionError> {
    let failed = |e: sqlx::Error| ActionError::Failed(db_error(&e, spec, a));
    let col = |c: &str| sql.ident(c);
    let query = format!(
        "SELECT {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {} FROM {} WHERE {} = {} AND {} = {}",
        sql.text(&col("action")),
        sql.text(&col("operator")),
        sql.text(&col("reason")),
        sql.text(&col("selection")),
        sql.int(&col("rate")),
        sql.micros(&col("started_at")),
        sql.micros(&col("finished_at")),
        sql.int(&col("done")),
        sql.int(&col("skipped")),
        sql.int(&col("failed")),
        sql.text(&col("event_ids")),
        sql.text(&col("source")),
        sql.table(runs),
        col("id"),
        sql.placeholder(1),
        col("source"),
        sql.placeholder(2),
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(query))
        .bind(run_id.to_string())
        .bind(spec.table.name.clone())
        .fetch_optional(&mut *conn)
        .await
        .map_err(failed)?
        .ok_or_else(|| {
            ActionError::Failed(format!(
                "run \"{run_id}\": no such run of source \"{}\" in \"{runs}\"",
                spec.table.name
            ))
        })?;
    let bad = |m: String| ActionError::Failed(format!("run \"{run_id}\" in \"{runs}\": {m}"));
    let word: Option<String> = get(&row, 0, "action").map_err(bad)?;
    let action = Action::parse(word.as_deref().unwrap_or_default())
        .ok_or_else(|| bad(format!("action {word:?} is neither replay nor ignore")))?;
    let ids: Option<String> = get(&row, 10, "event_ids").map_err(bad)?;
    let event_ids: Vec<String> = serde_json::from_str(ids.as_deref().unwrap_or_default())
        .map_err(|e| bad(format!("event_ids is not a JSON array of ids: {e}")))?;
    let n = |i: usize, name: &str| -> Result<u64, ActionError> {
        let v: Option<i64> = get(&row, i, name).map_err(bad)?;
        Ok(v.and_then(|v| u64::try_from(v).ok()).unwrap_or_default())
    };
    let run = Run {
        id: run_id.to_string(),
        action,
        operator: get::<Option<String>>(&row, 1, "operator")
            .map_err(bad)?
            .unwrap_or_default(),
        reason: get::<Option<String>>(&row, 2, "reason")
            .map_err(bad)?
            .unwrap_or_default(),
        selection: get::<Option<String>>(&row, 3, "selection")
            .map_err(bad)?
            .unwrap_or_default(),
        rate: u32::try_from(n(4, "rate")?).unwrap_or(1),
        started_at: get::<Option<i64>>(&row, 5, "started_at")
            .map_err(bad)?
            .unwrap_or_default(),
        finished_at: get(&row, 6, "finished_at").map_err(bad)?,
        counts: RunCounts {
            done: n(7, "done")?,
            skipped: n(8, "skipped")?,
            failed: n(9, "failed")?,
        },
        event_ids,
    };
    let done_query = format!(
        "SELECT {} FROM {} WHERE {} = {} AND {} = {}",
        sql.text(&col("event_id")),
        sql.table(&a.audit_table),
        col("run_id"),
        sql.placeholder(1),
        col("source"),
        sql.placeholder(2),
    );
    let done: Vec<String> =
        sqlx::query_scalar::<_, Option<String>>(sqlx::AssertSqlSafe(done_query))
            .bind(run_id.to_string())
            .bind(spec.table.name.clone())
            .fetch_all(&mut *conn)
            .await
            .map_err(failed)?
            .into_iter()
            .flatten()
            .collect();
    Ok((run, done))
}

/// The replay / ignore history of `event_ids`, oldest first, over the
/// agent's own read-only connection. Empty when the source has no
/// `dead_letter_actions` or its audit table does not exist (or is not
/// readable by the agent's user: both look the same in the catalog).
pub(crate) async fn audit_history(
    spec: &InboxSpec,
    event_ids: &[String],
) -> Result<Vec<AuditEntry>, String> {
    let Some(a) = spec.actions.as_ref() else {
        return Ok(Vec::new());
    };
    if event_ids.is_empty() {
        return Ok(Vec::new());
    }
    let (mut conn, sql) = open(TableSource::new(
        spec.table.clone(),
        Inbox::new(spec.clone()),
    ))
    .await?;
    let found = history(&mut conn, sql, spec, a, event_ids).await;
    let _ = conn.close().await;
    found
}

async fn history(
    conn: &mut AnyConnection,
    sql: Sql,
    spec: &InboxSpec,
    a: &DeadLetterActions,
    event_ids: &[String],
) -> Result<Vec<AuditEntry>, String> {
    let mut tx = conn.begin().await.map_err(|e| e.to_string())?;
    let present = sqlx::query(sqlx::AssertSqlSafe(sql.columns_query(&a.audit_table)))
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    if !present.is_empty() {
        for ids in event_ids.chunks(HISTORY_CHUNK) {
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            let col = |c: &str| sql.ident(c);
            let query = format!(
                "SELECT {}, {}, {}, {}, {}, {}, {}, {} FROM {} WHERE {} = {} AND {} IN {} \
                 ORDER BY {}, {}",
                sql.text(&col("event_id")),
                sql.text(&col("action")),
                sql.text(&col("operator")),
                sql.text(&col("reason")),
                sql.micros(&col("at")),
                sql.text(&col("previous_status")),
                sql.int(&col("attempts")),
                sql.text(&col("last_error")),
                sql.table(&a.audit_table),
                col("source"),
                sql.literal(&spec.table.name),
                col("event_id"),
                sql.in_list(&ids),
                col("at"),
                col("id"),
            );
            let rows = sqlx::query(sqlx::AssertSqlSafe(query))
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| e.to_string())?;
            for r in &rows {
                out.push(AuditEntry {
                    event_id: get::<Option<String>>(r, 0, "event_id")?.unwrap_or_default(),
                    action: get::<Option<String>>(r, 1, "action")?.unwrap_or_default(),
                    operator: get::<Option<String>>(r, 2, "operator")?.unwrap_or_default(),
                    reason: get::<Option<String>>(r, 3, "reason")?.unwrap_or_default(),
                    at: get::<Option<i64>>(r, 4, "at")?.unwrap_or_default(),
                    previous_status: get(r, 5, "previous_status")?,
                    attempts: get(r, 6, "attempts")?,
                    last_error: get(r, 7, "last_error")?,
                });
            }
        }
    }
    tx.rollback().await.map_err(|e| e.to_string())?;
    out.sort_by_key(|e| e.at);
    Ok(out)
}
