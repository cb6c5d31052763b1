//! `doctor`'s checks of a table source: the table and its mapped columns,
//! their types, and an EXPLAIN of every query the agent runs, warning —
//! with the index to create — where one would scan the whole table.

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::capabilities;
use super::config::{InboxSpec, Status};
use super::schema::create_index;
use super::shape::Shape;
use super::sql::Sql;
use super::{TableKind, TableSource};
use crate::dsn::Dialect;
use crate::sources::kind::Finding;

pub(crate) async fn check<K: TableKind>(
    source: &mut TableSource<K>,
    spec: Shape<'_>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut conn = match source.opener().open().await {
        Ok((c, checked)) => {
            source.set_checked(checked);
            c
        }
        Err(e) => {
            out.push(Finding::Error(e.to_string()));
            return out;
        }
    };
    out.push(Finding::Ok(
        "connected; table and every mapped column present".into(),
    ));
    let table = spec.table();
    let sql = Sql {
        dialect: table.dsn.dialect(),
    };
    // The table's columns, read once for the type checks and the suggestions.
    match columns_of(&mut conn, &sql, &table.table).await {
        Ok(present) => {
            out.extend(check_types(&present, &sql, spec));
            out.extend(describe_mode(&mut conn, &sql, source, spec, &present).await);
        }
        Err(e) => out.push(Finding::Error(format!("reading the columns failed: {e}"))),
    }
    if let Shape::Inbox(s) = spec {
        out.extend(status_words(&mut conn, &sql, s).await);
    }
    for (what, query, binds_cursor) in source.queries() {
        if what == IN_FLIGHT {
            // Not a scan of the whole table without its index but a range of
            // the start's own index, over every row started in it: what
            // counts is whether the partial index serves it.
            let mysql = sql.dialect == Dialect::MySql;
            match source.in_flight_index(&mut conn).await {
                Ok(Some(index)) if mysql => out.push(Finding::Ok(format!(
                    "the stuck rows in flight are checked through the index {index} on \
                     (status, received_at), without reading them"
                ))),
                Ok(Some(index)) => out.push(Finding::Ok(format!(
                    "the rows in flight are read through the partial index {index}"
                ))),
                Ok(None) if mysql => out.push(Finding::Warn(format!(
                    "the stuck rows in flight are looked up by id in turn, one index look-up \
                     each, as no index holds their ids and statuses (the event id must be the \
                     primary key); create: {}",
                    index_for(&what, spec, &sql).trim_end()
                ))),
                Ok(None) => out.push(Finding::Warn(format!(
                    "the rows in flight are looked up by id, one index look-up each, as no \
                     partial index over them serves their read; create: {}",
                    index_for(&what, spec, &sql).trim_end()
                ))),
                Err(e) => out.push(Finding::Error(format!(
                    "finding the index of the rows in flight failed: {e}"
                ))),
            }
            continue;
        }
        let query = if binds_cursor {
            inline(&sql, &query)
        } else {
            query
        };
        match scans(&mut conn, &sql, &query, &table.table).await {
            Ok(false) => out.push(Finding::Ok(format!("the {what} query uses an index"))),
            Ok(true) => out.push(Finding::Warn(format!(
                "the {what} query would scan the whole table; create: {}",
                index_for(&what, spec, &sql).trim_end()
            ))),
            Err(e) => out.push(Finding::Error(format!(
                "EXPLAIN of the {what} query failed: {e}"
            ))),
        }
    }
    out
}

/// What [`TableSource::queries`] calls the read of the rows in flight.
pub(crate) const IN_FLIGHT: &str = "rows in flight";

/// The indexes that serve every query a poll of `source` runs, each once.
pub(crate) fn indexes<K: TableKind>(source: &TableSource<K>, spec: Shape<'_>) -> String {
    let sql = source.sql();
    let mut out: Vec<String> = Vec::new();
    for (what, _, _) in source.queries() {
        let ddl = index_for(&what, spec, &sql);
        if !out.contains(&ddl) {
            out.push(ddl);
        }
    }
    out.concat()
}

/// Replaces the cursor placeholder with a literal, so EXPLAIN sees a realistic value.
fn inline(sql: &Sql, query: &str) -> String {
    let literal = sql.cursor_literal(super::sql::wall_clock_micros() - 30_000_000);
    // PostgreSQL's tail also binds the high-water mark ($2) and a snapshot
    // xmin ($3, 0: every row).
    let query = query.replacen(&sql.placeholder(1), &literal, 1);
    if sql.dialect == Dialect::Postgres {
        query.replacen("$2", &literal, 1).replacen("$3", "0", 1)
    } else {
        query
    }
}

/// Whether the plan of `query` reads every row of `table`.
async fn scans(
    conn: &mut AnyConnection,
    sql: &Sql,
    query: &str,
    table: &str,
) -> Result<bool, sqlx::Error> {
    let (_, bare) = super::sql::split_table(table);
    match sql.dialect {
        Dialect::Postgres => {
            let rows = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {query}")))
                .fetch_all(&mut *conn)
                .await?;
            Ok(rows.iter().any(|r| {
                let line: String = r.try_get(0).unwrap_or_default();
                line.contains(&format!("Seq Scan on {bare}"))
                    || line.contains(&format!("Seq Scan on \"{bare}\""))
            }))
        }
        Dialect::MySql => {
            let rows = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {query}")))
                .fetch_all(&mut *conn)
                .await?;
            // ALL reads the table, index the whole index: both grow with the table.
            Ok(rows
                .iter()
                .any(|r| matches!(column_text(r, "type").as_deref(), Some("ALL" | "index"))))
        }
        Dialect::Sqlite => {
            let rows = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {query}")))
                .fetch_all(&mut *conn)
                .await?;
            Ok(rows.iter().any(|r| {
                let detail: String = r.try_get(3).unwrap_or_default();
                detail.starts_with(&format!("SCAN {bare}")) && !detail.contains("USING")
            }))
        }
    }
}

fn column_text(row: &AnyRow, name: &str) -> Option<String> {
    row.try_get::<Option<String>, _>(name).ok().flatten()
}

/// The index that serves one of the agent's queries.
fn index_for(what: &str, spec: Shape<'_>, sql: &Sql) -> String {
    let table = spec.table();
    let t = sql.table(&table.table);
    let base = table.table.replace('.', "_");
    if what == IN_FLIGHT && sql.dialect == Dialect::MySql {
        // The stuck rows are checked through the index on (status,
        // received_at), which also serves the unfinished rows.
        return index_for("unfinished rows", spec, sql);
    }
    if what == IN_FLIGHT
        && let Shape::Inbox(s) = spec
        && let Some((filter, started)) = super::inbox::in_flight(s, sql)
    {
        return create_index(
            sql.dialect,
            &format!("{base}_in_flight"),
            &t,
            &sql.ident(&started),
            Some(&filter),
        );
    }
    if let Some(column) = what.strip_prefix("tail on ") {
        return create_index(
            sql.dialect,
            &format!("{base}_{column}"),
            &t,
            &sql.ident(column),
            None,
        );
    }
    match spec {
        // The parked rows by their status words: on MySQL the index on
        // (status, received_at) below serves them too.
        Shape::Inbox(s) if what == "parked rows" && sql.dialect != Dialect::MySql => {
            if let Some(status) = s.words_only() {
                let words = s.statuses.words_for(super::Status::Parked);
                let filter = sql.is_in(&sql.ident(status), &words);
                let received = sql.ident(&s.columns.received_at);
                return create_index(
                    sql.dialect,
                    &format!("{base}_parked"),
                    &t,
                    &received,
                    Some(&filter),
                );
            }
            index_for("unfinished rows", spec, sql)
        }
        Shape::Inbox(s) => {
            // With the arrival time in an events log, the rows by id.
            let received = match s.columns.received_at.as_str() {
                "" => sql.ident(&s.columns.event_id),
                column => sql.ident(column),
            };
            let name = format!("{base}_unfinished");
            match s.words_only() {
                Some(status) if sql.dialect == Dialect::MySql => create_index(
                    sql.dialect,
                    &name,
                    &t,
                    &format!("{}, {received}", sql.ident(status)),
                    None,
                ),
                Some(status) => {
                    let words = s.statuses.unfinished_words();
                    let filter = sql.is_in(&sql.ident(status), &words);
                    create_index(sql.dialect, &name, &t, &received, Some(&filter))
                }
                None => {
                    // The rules' finished conditions that do not change with
                    // time make the partial index; MySQL has none, and an
                    // index on their columns serves it.
                    let filter = s.status_sql().index_filter(sql);
                    if sql.dialect == Dialect::MySql {
                        let cols: Vec<String> = s
                            .rules
                            .iter()
                            .take_while(|r| r.meaning.is_terminal())
                            .flat_map(|r| r.when.columns())
                            .map(|c| sql.ident(c))
                            .chain([received.clone()])
                            .collect();
                        create_index(sql.dialect, &name, &t, &cols.join(", "), None)
                    } else {
                        create_index(sql.dialect, &name, &t, &received, filter.as_deref())
                    }
                }
            }
        }
        Shape::Outbox(s) => {
            let published = sql.ident(&s.columns.published_at);
            let created = sql.ident(&s.columns.created_at);
            if sql.dialect == Dialect::MySql {
                create_index(
                    sql.dialect,
                    &format!("{base}_unpublished"),
                    &t,
                    &format!("{published}, {created}"),
                    None,
                )
            } else {
                create_index(
                    sql.dialect,
                    &format!("{base}_unpublished"),
                    &t,
                    &created,
                    Some(&format!("{published} IS NULL")),
                )
            }
        }
    }
}

/// The cursor mode and what it costs, what each metric will be, and the
/// optional meanings left unmapped with the columns that look like them.
async fn describe_mode<K: TableKind>(
    conn: &mut AnyConnection,
    sql: &Sql,
    source: &TableSource<K>,
    spec: Shape<'_>,
    present: &[(String, String)],
) -> Vec<Finding> {
    let table = spec.table();
    let mut out = Vec::new();
    let mode = source.reads();
    if source.rereads_every_poll() {
        let count = format!(
            "SELECT COUNT(*) FROM {} WHERE {}",
            sql.table(&table.table),
            source.unfinished_filter()
        );
        match sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(count))
            .fetch_one(&mut *conn)
            .await
        {
            Ok(n) => out.push(Finding::Ok(format!(
                "{mode}: {n} unfinished rows now, read on every poll (over \
                 max_tracked_events = {} the gauges come from an aggregate and rows that \
                 leave are not looked up)",
                table.max_tracked_events
            ))),
            Err(e) => out.push(Finding::Error(format!(
                "counting the unfinished rows failed: {e}"
            ))),
        }
    } else {
        out.push(Finding::Ok(mode));
    }
    let capabilities = match spec {
        Shape::Inbox(s) => capabilities::inbox(s),
        Shape::Outbox(s) => capabilities::outbox(s),
    };
    for c in capabilities {
        out.push(Finding::Ok(c.line()));
    }
    for line in capabilities::suggestions(spec, present) {
        out.push(Finding::Ok(line));
    }
    out
}

/// The table's columns and their types (lower case), in table order.
async fn columns_of(
    conn: &mut AnyConnection,
    sql: &Sql,
    table: &str,
) -> Result<Vec<(String, String)>, sqlx::Error> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql.columns_query(table)))
        .fetch_all(&mut *conn)
        .await?;
    Ok(rows
        .iter()
        .filter_map(|r| {
            Some((
                r.try_get::<String, _>(0).ok()?,
                r.try_get::<String, _>(1)
                    .ok()
                    .unwrap_or_default()
                    .to_lowercase(),
            ))
        })
        .collect())
}

/// Warns about column types the agent reads in a way the user may not expect.
fn check_types(present: &[(String, String)], sql: &Sql, spec: Shape<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    let types: std::collections::HashMap<&str, &str> = present
        .iter()
        .map(|(c, t)| (c.as_str(), t.as_str()))
        .collect();
    let times: Vec<(&str, String)> = match spec {
        Shape::Inbox(s) => {
            let c = &s.columns;
            [
                ("received_at", Some(&c.received_at)),
                ("started_at", c.started_at.as_ref()),
                ("finished_at", c.finished_at.as_ref()),
                ("updated_at", c.updated_at.as_ref()),
            ]
            .into_iter()
            .filter_map(|(m, c)| c.map(|c| (m, c.clone())))
            .collect()
        }
        Shape::Outbox(s) => {
            let c = &s.columns;
            let mut times = vec![
                ("created_at", c.created_at.clone()),
                ("published_at", c.published_at.clone()),
            ];
            times.extend(c.updated_at.clone().map(|u| ("updated_at", u)));
            times
        }
    };
    for (meaning, col) in times {
        let ty = types.get(col.as_str()).copied().unwrap_or_default();
        let fine = match sql.dialect {
            Dialect::Postgres => ty.starts_with("timestamp"),
            Dialect::MySql => ty == "datetime" || ty == "timestamp",
            Dialect::Sqlite => {
                ty.is_empty() || ty == "text" || ty == "datetime" || ty == "timestamp"
            }
        };
        if !fine {
            out.push(Finding::Warn(format!(
                "column \"{col}\" ({meaning}) has type {ty}; the agent reads it as a timestamp"
            )));
        } else if sql.dialect == Dialect::Postgres && ty == "timestamp without time zone" {
            out.push(Finding::Ok(format!(
                "column \"{col}\" ({meaning}) is timestamp without time zone: its values are read as UTC"
            )));
        }
    }
    if let Shape::Inbox(s) = spec {
        for (i, rule) in s.rules.iter().enumerate() {
            out.push(Finding::Ok(format!(
                "status rule {i}: {} when {}",
                rule.meaning.as_str(),
                rule.when.describe(sql)
            )));
        }
        if s.columns.status.is_some() {
            let words: Vec<&str> = Status::ALL
                .iter()
                .flat_map(|st| s.statuses.words_for(*st))
                .collect();
            out.push(Finding::Ok(format!(
                "status words configured: {}",
                words.join(", ")
            )));
        }
    }
    out
}

/// Rows whose status words `doctor` reads: a sample bounds the read on a
/// table of any size.
pub(crate) const STATUS_SAMPLE: u64 = 10_000;
/// Distinct words listed at most.
const STATUS_WORDS_SHOWN: u64 = 50;

/// The status words the table holds, from a sample of its first
/// [`STATUS_SAMPLE`] rows (in the order the database returns them, no
/// sort): each word the map does not know is a warning with the
/// `[sources.statuses]` line that maps it, since its rows are rejected.
async fn status_words(conn: &mut AnyConnection, sql: &Sql, s: &InboxSpec) -> Vec<Finding> {
    let Some(column) = s.words_only() else {
        return Vec::new();
    };
    let query = format!(
        "SELECT w, {count} FROM (SELECT {word} AS w FROM {table} LIMIT {STATUS_SAMPLE}) sample \
         GROUP BY w ORDER BY 2 DESC, 1 LIMIT {STATUS_WORDS_SHOWN}",
        count = sql.int("COUNT(*)"),
        word = sql.text(&sql.ident(column)),
        table = sql.table(&s.table.table),
    );
    let rows = match sqlx::query(sqlx::AssertSqlSafe(query))
        .fetch_all(&mut *conn)
        .await
    {
        Ok(rows) => rows,
        Err(e) => {
            return vec![Finding::Error(format!(
                "reading the status words failed: {e}"
            ))];
        }
    };
    let words: Vec<(Option<String>, i64)> = rows
        .iter()
        .map(|r| (r.try_get(0).ok().flatten(), r.try_get(1).unwrap_or(0)))
        .collect();
    let sampled: i64 = words.iter().map(|(_, n)| n).sum();
    let unmapped: Vec<(Option<&str>, i64)> = words
        .iter()
        .map(|(w, n)| (w.as_deref(), *n))
        .filter(|(w, _)| w.is_none_or(|w| s.statuses.classify(w).is_none()))
        .collect();
    let sample = format!("a sample of {sampled} rows (the first {STATUS_SAMPLE} at most)");
    if unmapped.is_empty() {
        let seen: Vec<String> = words
            .iter()
            .filter_map(|(w, _)| w.as_deref().map(crate::text::printable))
            .collect();
        return vec![Finding::Ok(format!(
            "status words in {sample}: {} — every one mapped",
            if seen.is_empty() {
                "none".to_string()
            } else {
                seen.join(", ")
            }
        ))];
    }
    let mut out = Vec::new();
    for (word, n) in &unmapped {
        let Some(word) = word else {
            out.push(Finding::Warn(format!(
                "{n} of {sample} have a NULL status: they are rejected as unknown_status"
            )));
            continue;
        };
        // A word of no known meaning gets `failed`'s line as an example.
        let meaning = guess_meaning(word).unwrap_or(Status::Failed);
        let mut list: Vec<&str> = s.statuses.words_for(meaning);
        list.extend(
            unmapped
                .iter()
                .filter_map(|(w, _)| *w)
                .filter(|w| guess_meaning(w) == Some(meaning) || w == word),
        );
        list.dedup();
        let line = format!(
            "{} = [{}]",
            meaning.as_str(),
            list.iter()
                .map(|w| toml::Value::String(w.to_string()).to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let fix = if guess_meaning(word).is_some() {
            format!("add under [sources.statuses]: {line}")
        } else {
            format!("add it under [sources.statuses] to the words of what it means, e.g. {line}")
        };
        out.push(Finding::Warn(format!(
            "status word \"{}\" ({n} of {sample}) is not mapped: its rows are rejected as \
             unknown_status; {fix}",
            crate::text::printable(word)
        )));
    }
    out
}

/// The meaning a status word most likely has, by the words libraries use.
fn guess_meaning(word: &str) -> Option<Status> {
    const WORDS: [(Status, &[&str]); 6] = [
        (
            Status::Pending,
            &[
                "new",
                "queued",
                "waiting",
                "scheduled",
                "ready",
                "created",
                "enqueued",
                "todo",
                "open",
                "received",
                "available",
            ],
        ),
        (
            Status::Processing,
            &[
                "in_progress",
                "inprogress",
                "running",
                "active",
                "locked",
                "started",
                "claimed",
                "working",
                "executing",
                "busy",
                "handling",
            ],
        ),
        (
            Status::Succeeded,
            &[
                "done",
                "completed",
                "complete",
                "success",
                "successful",
                "succeeded",
                "ok",
                "processed",
                "finished",
                "handled",
                "acked",
            ],
        ),
        (
            Status::Failed,
            &[
                "error",
                "errored",
                "failure",
                "retry",
                "retrying",
                "retryable",
                "nacked",
            ],
        ),
        (
            Status::Dead,
            &[
                "dead_letter",
                "dead_lettered",
                "deadletter",
                "buried",
                "discarded",
                "poison",
                "abandoned",
                "expired",
                "cancelled",
                "canceled",
                "dlq",
                "rejected",
            ],
        ),
        (
            Status::Parked,
            &["quarantined", "held", "on_hold", "blocked"],
        ),
    ];
    let norm: String = word
        .trim()
        .to_lowercase()
        .chars()
        .map(|c| if c.is_alphanumeric() { c } else { '_' })
        .collect();
    WORDS
        .iter()
        .find(|(_, words)| words.contains(&norm.as_str()))
        .map(|(meaning, _)| *meaning)
}
