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
use sqlx::{AnyConnection, Connection};

use super::config::{DeadLetterActions, InboxSpec, Status};
use super::inbox::Inbox;
use super::lookup::open;
use super::sql::Sql;
use super::{TableSource, get};
use crate::dsn::Dialect;
use crate::sources::kind::{Action, ActionError, ActionOutcome, ActionRequest, AuditEntry};

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
    let insert = format!(
        "INSERT INTO {} ({}, {}, {}, {}, {}, {}, {}, {}, {}) VALUES ({}, {}, {}, {}, {}, {}, {}, {}, {})",
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
    sqlx::query(sqlx::AssertSqlSafe(insert))
        .bind(spec.table.name.clone())
        .bind(id.to_string())
        .bind(req.action.as_str())
        .bind(req.operator.clone())
        .bind(req.reason.clone())
        .bind(row.word.clone())
        .bind(row.attempts)
        .bind(row.last_error.clone())
        .execute(&mut *conn)
        .await?;
    Ok(())
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
