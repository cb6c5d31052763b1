//! `inboxwatch schema`: the recommended tables and indexes of SPEC §2 for each
//! dialect — the change-cursor index for tailing and an index over the
//! unfinished rows for the gauges.

use super::config::{StatusMap, runs_table};
use super::sql::Sql;
use crate::dsn::Dialect;

/// DDL for an inbox table and, optionally, an outbox table.
pub fn ddl(dialect: Dialect, inbox: &str, outbox: Option<&str>) -> String {
    let mut out = inbox_ddl(dialect, inbox);
    if let Some(o) = outbox {
        out.push('\n');
        out.push_str(&outbox_ddl(dialect, o));
    }
    out
}

fn index_name(table: &str, suffix: &str) -> String {
    format!("{}_{suffix}", table.replace('.', "_"))
}

/// The inbox / processing-record table.
pub fn inbox_ddl(dialect: Dialect, table: &str) -> String {
    let sql = Sql { dialect };
    let t = sql.table(table);
    let (id, word, time, text, int) = types(dialect);
    // Status words are short; a narrow column keeps MySQL's (status, received_at) index small.
    let status = if dialect == Dialect::MySql {
        "VARCHAR(32)"
    } else {
        word
    };
    let mut out = format!(
        "-- Inbox / processing-record table: one row per event id, updated in place.\n\
         CREATE TABLE IF NOT EXISTS {t} (\n\
         \x20   event_id     {id} PRIMARY KEY,\n\
         \x20   event_type   {word},\n\
         \x20   status       {status} NOT NULL,\n\
         \x20   received_at  {time} NOT NULL,\n\
         \x20   started_at   {time},\n\
         \x20   finished_at  {time},\n\
         \x20   attempts     {int} NOT NULL DEFAULT 0,\n\
         \x20   deliveries   {int} NOT NULL DEFAULT 1,\n\
         \x20   last_error   {text},\n\
         \x20   traceparent  {word},\n\
         \x20   updated_at   {time} NOT NULL\n\
         );\n"
    );
    let updated = index_name(table, "updated_at");
    let unfinished = index_name(table, "unfinished");
    out.push_str("-- Tailing by the change cursor.\n");
    out.push_str(&create_index(dialect, &updated, &t, "updated_at", None));
    out.push_str("-- Oldest age, backlog and stuck rows over the unfinished rows only.\n");
    // The same words in the same order as the agent's queries: SQLite uses a
    // partial index only when the query repeats its condition term for term.
    let words = StatusMap::default();
    let unfinished_filter = sql.is_in("status", &words.unfinished_words());
    match dialect {
        Dialect::MySql => out.push_str(&create_index(
            dialect,
            &unfinished,
            &t,
            "status, received_at",
            None,
        )),
        _ => out.push_str(&create_index(
            dialect,
            &unfinished,
            &t,
            "received_at",
            Some(&unfinished_filter),
        )),
    }
    out
}

/// The outbox table.
pub fn outbox_ddl(dialect: Dialect, table: &str) -> String {
    let sql = Sql { dialect };
    let t = sql.table(table);
    let (id, word, time, _, _) = types(dialect);
    let mut out = format!(
        "-- Outbox table: published_at stays NULL until the row is sent.\n\
         CREATE TABLE IF NOT EXISTS {t} (\n\
         \x20   event_id     {id} PRIMARY KEY,\n\
         \x20   event_type   {word},\n\
         \x20   created_at   {time} NOT NULL,\n\
         \x20   published_at {time},\n\
         \x20   traceparent  {word},\n\
         \x20   updated_at   {time} NOT NULL\n\
         );\n"
    );
    let updated = index_name(table, "updated_at");
    let unpublished = index_name(table, "unpublished");
    out.push_str(&create_index(dialect, &updated, &t, "updated_at", None));
    match dialect {
        Dialect::MySql => out.push_str(&create_index(
            dialect,
            &unpublished,
            &t,
            "published_at, created_at",
            None,
        )),
        _ => out.push_str(&create_index(
            dialect,
            &unpublished,
            &t,
            "created_at",
            Some("published_at IS NULL"),
        )),
    }
    out
}

/// The audit table of `dead-letters replay` and `ignore`: one row per
/// action on one event, written in the same transaction as the change.
pub fn audit_ddl(dialect: Dialect, table: &str) -> String {
    let sql = Sql { dialect };
    let t = sql.table(table);
    let (id, word, time, text, int) = types(dialect);
    let key = match dialect {
        Dialect::Postgres => "bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
        Dialect::MySql => "BIGINT AUTO_INCREMENT PRIMARY KEY",
        Dialect::Sqlite => "INTEGER PRIMARY KEY AUTOINCREMENT",
    };
    let mut out = format!(
        "-- Dead-letter actions (inboxwatch dead-letters replay / ignore): one row per action.\n\
         CREATE TABLE IF NOT EXISTS {t} (\n\
         \x20   id              {key},\n\
         \x20   source          {word} NOT NULL,\n\
         \x20   event_id        {id} NOT NULL,\n\
         \x20   action          {word} NOT NULL,\n\
         \x20   operator        {word} NOT NULL,\n\
         \x20   reason          {text} NOT NULL,\n\
         \x20   at              {time} NOT NULL,\n\
         \x20   previous_status {word},\n\
         \x20   attempts        {int},\n\
         \x20   last_error      {text},\n\
         \x20   run_id          {word}\n\
         );\n"
    );
    out.push_str("-- The history of an event, for the pages.\n");
    out.push_str(&create_index(
        dialect,
        &index_name(table, "event"),
        &t,
        "source, event_id",
        None,
    ));
    out.push_str("-- The replays the agent reads on each poll (those since its last read).\n");
    out.push_str(&create_index(
        dialect,
        &index_name(table, "at"),
        &t,
        "source, at",
        None,
    ));
    out.push_str("-- The events a bulk run has done, for --resume.\n");
    out.push_str(&create_index(
        dialect,
        &index_name(table, "run"),
        &t,
        "run_id",
        None,
    ));
    let runs_name = runs_table(table);
    let runs = sql.table(&runs_name);
    // A snapshot of up to 100,000 ids outgrows MEDIUMTEXT's 16 MiB only with
    // ids near 191 characters; LONGTEXT holds any.
    let snapshot = match dialect {
        Dialect::MySql => "LONGTEXT",
        _ => text,
    };
    out.push_str(&format!(
        "-- Bulk runs (dead-letters replay / ignore with a group or filter): one row per run;\n\
         -- event_ids is its snapshot, a JSON array in the run's order.\n\
         CREATE TABLE IF NOT EXISTS {runs} (\n\
         \x20   id          {word} PRIMARY KEY,\n\
         \x20   source      {word} NOT NULL,\n\
         \x20   action      {word} NOT NULL,\n\
         \x20   operator    {word} NOT NULL,\n\
         \x20   reason      {text} NOT NULL,\n\
         \x20   selection   {text} NOT NULL,\n\
         \x20   rate        {int} NOT NULL,\n\
         \x20   started_at  {time} NOT NULL,\n\
         \x20   finished_at {time},\n\
         \x20   total       {int} NOT NULL,\n\
         \x20   done        {int} NOT NULL,\n\
         \x20   skipped     {int} NOT NULL,\n\
         \x20   failed      {int} NOT NULL,\n\
         \x20   event_ids   {snapshot} NOT NULL\n\
         );\n"
    ));
    out
}

/// (event id, short text, timestamp, long text, integer) column types.
fn types(
    dialect: Dialect,
) -> (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
) {
    match dialect {
        Dialect::Postgres => ("text", "text", "timestamptz", "text", "integer"),
        // DATETIME(6) values are UTC; MEDIUMTEXT holds stack traces past TEXT's 64 KiB.
        Dialect::MySql => (
            "VARCHAR(191)",
            "VARCHAR(191)",
            "DATETIME(6)",
            "MEDIUMTEXT",
            "INT",
        ),
        // Times as text in the canonical UTC form strftime('%Y-%m-%d %H:%M:%f','now') writes.
        Dialect::Sqlite => ("TEXT", "TEXT", "TEXT", "TEXT", "INTEGER"),
    }
}

/// `CREATE INDEX`, idempotent in every dialect.
pub fn create_index(
    dialect: Dialect,
    name: &str,
    table: &str,
    columns: &str,
    filter: Option<&str>,
) -> String {
    let where_ = filter.map_or(String::new(), |f| format!(" WHERE {f}"));
    match dialect {
        Dialect::Postgres | Dialect::Sqlite => {
            format!("CREATE INDEX IF NOT EXISTS {name} ON {table} ({columns}){where_};\n")
        }
        // MariaDB has IF NOT EXISTS; MySQL 8 does not, and has no partial indexes.
        Dialect::MySql => format!("CREATE INDEX IF NOT EXISTS {name} ON {table} ({columns});\n"),
    }
}
