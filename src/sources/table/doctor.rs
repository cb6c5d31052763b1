//! `doctor`'s checks of a table source: the table and its mapped columns,
//! their types, and an EXPLAIN of every query the agent runs, warning —
//! with the index to create — where one would scan the whole table.

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::config::{InboxSpec, OutboxSpec, Status, TableSpec};
use super::dialect::{Param, Sql};
use super::schema::create_index;
use super::{TableKind, TableSource};
use crate::dsn::Dialect;
use crate::sources::kind::Finding;

/// An inbox or an outbox source, for the checks that differ.
#[derive(Clone, Copy)]
pub(crate) enum Shape<'a> {
    Inbox(&'a InboxSpec),
    Outbox(&'a OutboxSpec),
}

impl Shape<'_> {
    fn table(&self) -> &TableSpec {
        match self {
            Shape::Inbox(s) => &s.table,
            Shape::Outbox(s) => &s.table,
        }
    }
}

pub(crate) async fn check<K: TableKind>(source: &TableSource<K>, spec: Shape<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut conn = match source.opener().open().await {
        Ok(c) => c,
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
    out.extend(check_types(&mut conn, &sql, spec).await);
    for (what, query, binds_cursor) in source.queries() {
        let query = if binds_cursor {
            inline(&sql, &query)
        } else {
            query
        };
        match scans(&mut conn, &sql, &query, &table.table).await {
            Ok(false) => out.push(Finding::Ok(format!("the {what} query uses an index"))),
            Ok(true) => out.push(Finding::Warn(format!(
                "the {what} query would scan the whole table; create: {}",
                index_for(what, spec, &sql).trim_end()
            ))),
            Err(e) => out.push(Finding::Error(format!(
                "EXPLAIN of the {what} query failed: {e}"
            ))),
        }
    }
    out
}

/// Replaces the cursor placeholder with a literal, so EXPLAIN sees a realistic value.
fn inline(sql: &Sql, query: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    let literal = match sql.cursor(now - 30_000_000) {
        Param::Int(v) => v.to_string(),
        Param::Text(t) => sql.literal(&t),
    };
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
    let (_, bare) = super::dialect::split_table(table);
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
    match (what, spec) {
        ("tail", Shape::Inbox(s)) => create_index(
            sql.dialect,
            &format!("{base}_updated_at"),
            &t,
            &sql.ident(&s.columns.updated_at),
            None,
        ),
        ("tail", Shape::Outbox(s)) => create_index(
            sql.dialect,
            &format!("{base}_updated_at"),
            &t,
            &sql.ident(&s.columns.updated_at),
            None,
        ),
        (_, Shape::Inbox(s)) => {
            let status = sql.ident(&s.columns.status);
            let received = sql.ident(&s.columns.received_at);
            if sql.dialect == Dialect::MySql {
                create_index(
                    sql.dialect,
                    &format!("{base}_unfinished"),
                    &t,
                    &format!("{status}, {received}"),
                    None,
                )
            } else {
                let words = s.statuses.unfinished_words();
                let filter = format!("{status} IN {}", sql.in_list(&words));
                create_index(
                    sql.dialect,
                    &format!("{base}_unfinished"),
                    &t,
                    &received,
                    Some(&filter),
                )
            }
        }
        (_, Shape::Outbox(s)) => {
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

/// Warns about column types the agent reads in a way the user may not expect.
async fn check_types(conn: &mut AnyConnection, sql: &Sql, spec: Shape<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    let table = spec.table();
    let rows = match sqlx::query(sqlx::AssertSqlSafe(sql.columns_query(&table.table)))
        .fetch_all(&mut *conn)
        .await
    {
        Ok(r) => r,
        Err(e) => return vec![Finding::Error(format!("reading the columns failed: {e}"))],
    };
    let types: std::collections::HashMap<String, String> = rows
        .iter()
        .filter_map(|r| {
            Some((
                r.try_get::<String, _>(0).ok()?,
                r.try_get::<String, _>(1).ok()?.to_lowercase(),
            ))
        })
        .collect();
    let times: Vec<(&str, String)> = match spec {
        Shape::Inbox(s) => {
            let c = &s.columns;
            [
                ("received_at", Some(&c.received_at)),
                ("started_at", c.started_at.as_ref()),
                ("finished_at", c.finished_at.as_ref()),
                ("updated_at", Some(&c.updated_at)),
            ]
            .into_iter()
            .filter_map(|(m, c)| c.map(|c| (m, c.clone())))
            .collect()
        }
        Shape::Outbox(s) => {
            let c = &s.columns;
            vec![
                ("created_at", c.created_at.clone()),
                ("published_at", c.published_at.clone()),
                ("updated_at", c.updated_at.clone()),
            ]
        }
    };
    for (meaning, col) in times {
        let ty = types.get(&col).cloned().unwrap_or_default();
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
        let words: Vec<&str> = Status::ALL
            .iter()
            .flat_map(|st| s.statuses.words_for(*st))
            .collect();
        out.push(Finding::Ok(format!(
            "status words mapped: {}",
            words.join(", ")
        )));
    }
    out
}
