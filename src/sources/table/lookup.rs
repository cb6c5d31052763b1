//! The on-call lookups of a table source: one event's row as `trace` shows
//! it, and the dead-lettered rows for `dead-letters`. Read-only: every
//! query runs in a transaction that is rolled back.

use std::fmt::Write as _;
use std::time::Duration;

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Connection};

use super::config::{InboxSpec, OutboxSpec, Status};
use super::sql::{Param, Sql};
use super::{TableKind, TableSource, get};
use crate::dsn::Dialect;
use crate::redact::Redactor;
use crate::sources::kind::DeadLetter;
use crate::text::{ERROR_SHOWN, ms, timestamp};
use crate::tracing_link::{self as link, TraceParent, to_hex};

/// A connection for one lookup, and the source's dialect.
pub(super) async fn open<K: TableKind>(
    source: TableSource<K>,
) -> Result<(AnyConnection, Sql), String> {
    let sql = source.sql();
    let (conn, _) = source.opener().open().await.map_err(|e| e.to_string())?;
    Ok((conn, sql))
}

/// What an inbox table knows of one event, its `last_error` masked by `redact`.
pub(crate) async fn trace_inbox(
    s: &InboxSpec,
    event_id: &str,
    redact: &Redactor,
) -> Result<Option<String>, String> {
    let (mut conn, sql) = open(TableSource::new(
        s.table.clone(),
        super::inbox::Inbox::new(s.clone()),
    ))
    .await?;
    let found = inbox_event(&mut conn, sql, s, event_id, redact).await;
    let _ = conn.close().await;
    found
}

/// What an outbox table knows of one event (no text of its own to mask).
pub(crate) async fn trace_outbox(
    s: &OutboxSpec,
    event_id: &str,
    _redact: &Redactor,
) -> Result<Option<String>, String> {
    let (mut conn, sql) = open(TableSource::new(
        s.table.clone(),
        super::outbox::Outbox::new(s.clone()),
    ))
    .await?;
    let found = outbox_event(&mut conn, sql, s, event_id).await;
    let _ = conn.close().await;
    found
}

/// The events an inbox dead-lettered within `since`, newest first.
pub(crate) async fn dead_letters(
    s: &InboxSpec,
    since: Duration,
    limit: usize,
) -> Result<Vec<DeadLetter>, String> {
    failures(s, Status::Dead, since, limit).await
}

/// The events failing now (a `failed` status) whose last failure lies
/// within `since`, the latest first: for the failure groups.
pub(crate) async fn failing(
    s: &InboxSpec,
    since: Duration,
    limit: usize,
) -> Result<Vec<DeadLetter>, String> {
    failures(s, Status::Failed, since, limit).await
}

/// [`failure_rows`] over a connection of its own.
async fn failures(
    s: &InboxSpec,
    status: Status,
    since: Duration,
    limit: usize,
) -> Result<Vec<DeadLetter>, String> {
    let (mut conn, sql) = open(TableSource::new(
        s.table.clone(),
        super::inbox::Inbox::new(s.clone()),
    ))
    .await?;
    let rows = failure_rows(&mut conn, sql, s, status, since, limit).await;
    let _ = conn.close().await;
    rows
}

fn producer(tp: Option<&str>) -> String {
    match tp.map(str::trim).filter(|t| !t.is_empty()) {
        None => "none (no traceparent stored)".to_string(),
        Some(t) => match TraceParent::parse(t) {
            Some(p) => format!("{} (parent span {})", p.trace_hex(), to_hex(&p.span_id)),
            None => format!("unreadable traceparent \"{}\"", link::truncate(t, 80)),
        },
    }
}

fn opt_col(sql: Sql, col: &Option<String>, f: impl Fn(&str) -> String) -> String {
    col.as_deref()
        .map_or("NULL".to_string(), |c| f(&sql.ident(c)))
}

async fn one_row(conn: &mut AnyConnection, query: String) -> Result<Option<AnyRow>, String> {
    let mut tx = conn.begin().await.map_err(|e| e.to_string())?;
    let row = sqlx::query(sqlx::AssertSqlSafe(query))
        .fetch_optional(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
    tx.rollback().await.map_err(|e| e.to_string())?;
    Ok(row)
}

async fn inbox_event(
    conn: &mut AnyConnection,
    sql: Sql,
    s: &InboxSpec,
    event_id: &str,
    redact: &Redactor,
) -> Result<Option<String>, String> {
    if sql.dialect == Dialect::Postgres && event_id.contains('\0') {
        // PostgreSQL's text cannot hold NUL: no row has this id (asking would
        // only fail with the driver's "invalid byte sequence").
        return Ok(None);
    }
    let c = &s.columns;
    let query = format!(
        "SELECT {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {} FROM {} WHERE {} = {}",
        opt_col(sql, &c.event_type, |e| sql.text(e)),
        s.status_select(&sql),
        sql.micros(&s.received_sql(&sql)),
        opt_col(sql, &c.started_at, |e| sql.micros(e)),
        opt_col(sql, &c.finished_at, |e| sql.micros(e)),
        s.attempts_select(&sql),
        opt_col(sql, &c.deliveries, |e| sql.int(e)),
        opt_col(sql, &c.last_error, |e| sql
            .text(&sql.prefix(e, ERROR_SHOWN + 1))),
        opt_col(sql, &c.traceparent, |e| sql.text(e)),
        opt_col(sql, &c.updated_at, |e| sql.micros(e)),
        opt_col(sql, &c.business_key, |e| sql
            .text(&sql.prefix(e, ERROR_SHOWN + 1))),
        sql.table(&s.table.table),
        sql.ident(&c.event_id),
        sql.literal(event_id),
    );
    let Some(row) = one_row(conn, query).await? else {
        return Ok(None);
    };
    let event_type: Option<String> = get(&row, 0, "event_type")?;
    let word: String = get::<Option<String>>(&row, 1, "status")?.unwrap_or_default();
    let received: Option<i64> = get(&row, 2, "received_at")?;
    let started: Option<i64> = get(&row, 3, "started_at")?;
    let finished: Option<i64> = get(&row, 4, "finished_at")?;
    let attempts: Option<i64> = get(&row, 5, "attempts")?;
    let deliveries: Option<i64> = get(&row, 6, "deliveries")?;
    let last_error: Option<String> = get(&row, 7, "last_error")?;
    let traceparent: Option<String> = get(&row, 8, "traceparent")?;
    let updated: Option<i64> = get(&row, 9, "updated_at")?;
    let business_key: Option<String> = get(&row, 10, "business_key")?;
    let status = s.meaning_of(&word);
    let service = s
        .table
        .service_name
        .clone()
        .unwrap_or_else(|| s.table.name.clone());

    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nsource {} (inbox {}, service {service})",
        s.table.name, s.table.table
    );
    let _ = writeln!(
        out,
        "  event type      {}",
        event_type.as_deref().unwrap_or("unknown")
    );
    if let Some(k) = &business_key {
        let _ = writeln!(
            out,
            "  business key    {}",
            link::truncate(&redact.prefix(k, ERROR_SHOWN), ERROR_SHOWN)
        );
    }
    let meaning = status.map_or("not in the status map", Status::as_str);
    let _ = writeln!(out, "  status          {word} ({meaning})");
    let mut lines: Vec<(i64, String)> = Vec::new();
    if let Some(r) = received {
        lines.push((r, "received".to_string()));
    }
    let attempt = attempts.map(|a| a.max(1));
    if let Some(st) = started {
        let which = match attempt {
            Some(a) if a > 1 => {
                format!("attempt {a} started (earlier attempts' times are not stored)")
            }
            Some(a) => format!("attempt {a} started"),
            None => "latest attempt started".to_string(),
        };
        let waited = received.map_or(String::new(), |r| format!(", {} after receipt", ms(st - r)));
        lines.push((st, format!("{which}{waited}")));
    }
    match (status, finished) {
        (Some(Status::Succeeded), Some(f)) => {
            lines.push((f, finished_line("succeeded", started, f)))
        }
        (Some(Status::Dead), Some(f)) => {
            lines.push((f, finished_line("dead-lettered", started, f)))
        }
        (Some(Status::Failed), _) => {
            if let Some(u) = updated {
                lines.push((
                    u,
                    "failed; will be retried (last change of the row)".to_string(),
                ));
            }
        }
        _ => {}
    }
    lines.sort_by_key(|(t, _)| *t);
    for (t, what) in &lines {
        let _ = writeln!(out, "  {}  {what}", timestamp(*t));
    }
    if let Some(a) = attempts {
        let _ = writeln!(out, "  attempts        {a}");
    }
    if let Some(d) = deliveries {
        let _ = writeln!(
            out,
            "  deliveries      {d} ({} duplicate{})",
            (d - 1).max(0),
            if d == 2 { "" } else { "s" }
        );
    }
    if let Some(e) = &last_error {
        let _ = writeln!(
            out,
            "  last error      {}",
            link::truncate(&redact.prefix(e, ERROR_SHOWN), ERROR_SHOWN)
        );
    }
    if let Some(a) = attempt {
        let a = u32::try_from(a).unwrap_or(u32::MAX);
        let _ = writeln!(
            out,
            "  span id         {}  (attempt {a})",
            to_hex(&link::span_id("process", &service, event_id, a))
        );
    }
    let _ = writeln!(
        out,
        "  producer trace  {}",
        producer(traceparent.as_deref())
    );
    Ok(Some(out))
}

fn finished_line(what: &str, started: Option<i64>, f: i64) -> String {
    match started {
        Some(s) => format!("{what} after {} of processing", ms(f - s)),
        None => what.to_string(),
    }
}

async fn outbox_event(
    conn: &mut AnyConnection,
    sql: Sql,
    s: &OutboxSpec,
    event_id: &str,
) -> Result<Option<String>, String> {
    if sql.dialect == Dialect::Postgres && event_id.contains('\0') {
        // PostgreSQL's text cannot hold NUL: no row has this id (asking would
        // only fail with the driver's "invalid byte sequence").
        return Ok(None);
    }
    let c = &s.columns;
    let query = format!(
        "SELECT {}, {}, {}, {} FROM {} WHERE {} = {}",
        opt_col(sql, &c.event_type, |e| sql.text(e)),
        sql.micros(&sql.ident(&c.created_at)),
        sql.micros(&sql.ident(&c.published_at)),
        opt_col(sql, &c.traceparent, |e| sql.text(e)),
        sql.table(&s.table.table),
        sql.ident(&c.event_id),
        sql.literal(event_id),
    );
    let Some(row) = one_row(conn, query).await? else {
        return Ok(None);
    };
    let event_type: Option<String> = get(&row, 0, "event_type")?;
    let created: Option<i64> = get(&row, 1, "created_at")?;
    let published: Option<i64> = get(&row, 2, "published_at")?;
    let traceparent: Option<String> = get(&row, 3, "traceparent")?;
    let service = s
        .table
        .service_name
        .clone()
        .unwrap_or_else(|| s.table.name.clone());
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nsource {} (outbox {}, service {service})",
        s.table.name, s.table.table
    );
    let _ = writeln!(
        out,
        "  event type      {}",
        event_type.as_deref().unwrap_or("unknown")
    );
    if let Some(c) = created {
        let _ = writeln!(out, "  {}  created", timestamp(c));
    }
    match (created, published) {
        (Some(c), Some(p)) => {
            let _ = writeln!(out, "  {}  published after {}", timestamp(p), ms(p - c));
        }
        (_, None) => {
            let _ = writeln!(out, "  not published yet");
        }
        (None, Some(p)) => {
            let _ = writeln!(out, "  {}  published", timestamp(p));
        }
    }
    let _ = writeln!(
        out,
        "  producer trace  {}",
        producer(traceparent.as_deref())
    );
    Ok(Some(out))
}

/// `inboxwatch dead-letters`: the events dead-lettered within `since`, newest
/// first, as tab-separated columns under a header.
/// The rows in `status` (dead, or failed) whose failure lies within
/// `since`, the latest first. A dead row's time is its `finished_at` (else
/// its change cursor); a failed row's its change cursor (else the start of
/// the attempt that failed).
async fn failure_rows(
    conn: &mut AnyConnection,
    sql: Sql,
    s: &InboxSpec,
    status: Status,
    since: Duration,
    limit: usize,
) -> Result<Vec<DeadLetter>, String> {
    let c = &s.columns;
    let dead = match s.words_only() {
        Some(column) => {
            let words = s.statuses.words_for(status);
            if words.is_empty() {
                return Ok(Vec::new());
            }
            sql.is_in(&sql.ident(column), &words)
        }
        None => format!("{} = '{}'", s.status_select(&sql), status.as_str()),
    };
    let mut tx = conn.begin().await.map_err(|e| e.to_string())?;
    let now: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {}", sql.now_micros())))
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
    let cutoff = now.saturating_sub(i64::try_from(since.as_micros()).unwrap_or(i64::MAX));
    // The change cursor is indexed and set when a row is dead-lettered, so
    // bounding it first keeps this proportional to recent changes. Without
    // either time, every dead row is listed, newest arrival first.
    let (times, dead_at): (Vec<&str>, Option<&str>) = if status == Status::Dead {
        (
            [c.updated_at.as_deref(), c.finished_at.as_deref()]
                .into_iter()
                .flatten()
                .collect(),
            c.finished_at.as_deref().or(c.updated_at.as_deref()),
        )
    } else {
        let at = c.updated_at.as_deref().or(c.started_at.as_deref());
        (at.into_iter().collect(), at)
    };
    let mut filter = String::new();
    for (i, t) in times.iter().enumerate() {
        filter.push_str(&format!("{} AND ", sql.after(&sql.ident(t), i + 1)));
    }
    filter.push_str(&dead);
    let order = dead_at.map_or_else(|| s.received_sql(&sql), |d| sql.ident(d));
    let query = format!(
        "SELECT {}, {}, {}, {}, {}, {}, {}, {} FROM {} WHERE {filter} ORDER BY {order} DESC, {} {}",
        sql.text(&sql.ident(&c.event_id)),
        opt_col(sql, &c.event_type, |e| sql.text(e)),
        sql.micros(&s.received_sql(&sql)),
        dead_at.map_or("NULL".to_string(), |d| sql.micros(&sql.ident(d))),
        s.attempts_select(&sql),
        opt_col(sql, &c.last_error, |e| sql
            .text(&sql.prefix(e, ERROR_SHOWN + 1))),
        opt_col(sql, &c.business_key, |e| sql.text(e)),
        opt_col(sql, &c.summary, |e| sql
            .text(&sql.prefix(e, ERROR_SHOWN + 1))),
        sql.table(&s.table.table),
        sql.ident(&c.event_id),
        sql.limit(limit),
    );
    let mut q = sqlx::query(sqlx::AssertSqlSafe(query));
    for _ in 0..times.len() {
        q = match sql.cursor(cutoff) {
            Param::Int(v) => q.bind(v),
            Param::Text(v) => q.bind(v),
        };
    }
    let rows = q.fetch_all(&mut *tx).await.map_err(|e| e.to_string())?;
    tx.rollback().await.map_err(|e| e.to_string())?;
    rows.iter()
        .map(|row| {
            let last_error: Option<String> = get(row, 5, "last_error")?;
            Ok(DeadLetter {
                event_id: get::<Option<String>>(row, 0, "event_id")?.unwrap_or_default(),
                event_type: get(row, 1, "event_type")?,
                received: get(row, 2, "received_at")?,
                dead_at: get(row, 3, "finished_at")?,
                attempts: get(row, 4, "attempts")?,
                error_class: Some(
                    s.error_classes
                        .classify(last_error.as_deref())
                        .0
                        .to_string(),
                ),
                last_error,
                business_key: get(row, 6, "business_key")?,
                summary: get(row, 7, "summary")?,
            })
        })
        .collect()
}
