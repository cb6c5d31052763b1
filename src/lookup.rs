//! The on-call lookups, read-only like everything else: `inboxwatch trace
//! EVENT_ID` (one event's timeline and the trace ids to paste into a trace
//! viewer) and `inboxwatch dead-letters` (what was dead-lettered lately).

use std::fmt::Write as _;
use std::time::Duration;

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Connection};

use crate::config::{Config, InboxSpec, OutboxSpec, SourceSpec, Status};
use crate::sources::table::TableSource;
use crate::sources::table::dialect::Sql;
use crate::sources::table::get;
use crate::sources::table::inbox::Inbox;
use crate::sources::table::outbox::Outbox;
use crate::tracing_link::{self as link, TraceParent, to_hex};

/// Characters of `last_error` shown by the lookups.
const ERROR_SHOWN: usize = 200;

/// Why a lookup could not answer.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// `--source` names no table source of the config.
    #[error("--source: no inbox or outbox source named \"{0}\" in the config")]
    UnknownSource(String),
    /// The event id is in none of the searched tables.
    #[error("event \"{id}\" not found in {searched}")]
    NotFound { id: String, searched: String },
    /// A source could not be read.
    #[error("source \"{source_name}\": {message}")]
    Source {
        source_name: String,
        message: String,
    },
}

impl LookupError {
    /// Exit code: 2 for a usage error, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            LookupError::UnknownSource(_) => 2,
            _ => 1,
        }
    }
}

fn selected<'a>(
    config: &'a Config,
    source: Option<&str>,
) -> Result<Vec<&'a SourceSpec>, LookupError> {
    // Lookups read tables: Kafka sources have no event rows.
    let out: Vec<&SourceSpec> = config
        .sources
        .iter()
        .filter(|s| s.table().is_some())
        .filter(|s| source.is_none_or(|n| s.name() == n))
        .collect();
    match (out.is_empty(), source) {
        (true, Some(n)) => Err(LookupError::UnknownSource(n.to_string())),
        _ => Ok(out),
    }
}

async fn open(spec: &SourceSpec) -> Result<(AnyConnection, Sql), LookupError> {
    let err = |message: String| LookupError::Source {
        source_name: spec.name().to_string(),
        message,
    };
    let opener = match spec {
        SourceSpec::Inbox(s) => TableSource::new(s.table.clone(), Inbox::new(s.clone())).opener(),
        SourceSpec::Outbox(s) => TableSource::new(s.table.clone(), Outbox::new(s.clone())).opener(),
        SourceSpec::Kafka(_) => unreachable!("lookups select table sources only"),
    };
    let conn = opener.open().await.map_err(|e| err(e.to_string()))?;
    Ok((
        conn,
        Sql {
            dialect: spec.table().expect("a table source").dsn.dialect(),
        },
    ))
}

/// RFC 3339 UTC with milliseconds, from microseconds since the epoch; a time
/// RFC 3339 cannot show (before 1970 for the formatter, after 9999, or out of
/// range in the database) is shown as what it is.
pub fn timestamp(micros: i64) -> String {
    /// 10000-01-01T00:00:00Z.
    const YEAR_10000: i64 = 253_402_300_800_000_000;
    if micros == crate::sources::table::dialect::OUT_OF_RANGE {
        "(out of range)".to_string()
    } else if !(0..YEAR_10000).contains(&micros) {
        format!("({micros} µs from 1970-01-01T00:00:00Z)")
    } else {
        humantime::format_rfc3339_millis(link::at(micros)).to_string()
    }
}

/// A duration in milliseconds, as `1.234s` or `56ms`.
pub fn ms(micros: i64) -> String {
    let ms = micros.div_euclid(1000);
    if ms.abs() >= 1000 {
        format!("{:.3}s", ms as f64 / 1000.0)
    } else {
        format!("{ms}ms")
    }
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

/// `inboxwatch trace`: prints what the tables know of one event.
pub async fn trace(
    config: &Config,
    event_id: &str,
    source: Option<&str>,
) -> Result<String, LookupError> {
    let sources = selected(config, source)?;
    let mut out = String::new();
    let _ = writeln!(out, "event {event_id}");
    let _ = writeln!(
        out,
        "trace id {}  (derived from the event id)",
        to_hex(&link::trace_id(event_id))
    );
    let mut found = false;
    for spec in &sources {
        let (mut conn, sql) = open(spec).await?;
        let err = |e: String| LookupError::Source {
            source_name: spec.name().to_string(),
            message: e,
        };
        let text = match spec {
            SourceSpec::Inbox(s) => inbox_event(&mut conn, sql, s, event_id).await,
            SourceSpec::Outbox(s) => outbox_event(&mut conn, sql, s, event_id).await,
            SourceSpec::Kafka(_) => unreachable!("lookups select table sources only"),
        }
        .map_err(err)?;
        let _ = conn.close().await;
        if let Some(text) = text {
            found = true;
            out.push_str(&text);
        }
    }
    if !found {
        let names: Vec<String> = sources
            .iter()
            .map(|s| format!("\"{}\"", s.name()))
            .collect();
        return Err(LookupError::NotFound {
            id: event_id.to_string(),
            searched: format!("source {}", names.join(", ")),
        });
    }
    Ok(out)
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
) -> Result<Option<String>, String> {
    let c = &s.columns;
    let query = format!(
        "SELECT {}, {}, {}, {}, {}, {}, {}, {}, {}, {} FROM {} WHERE {} = {}",
        opt_col(sql, &c.event_type, |e| sql.text(e)),
        sql.text(&sql.ident(&c.status)),
        sql.micros(&sql.ident(&c.received_at)),
        opt_col(sql, &c.started_at, |e| sql.micros(e)),
        opt_col(sql, &c.finished_at, |e| sql.micros(e)),
        opt_col(sql, &c.attempts, |e| sql.int(e)),
        opt_col(sql, &c.deliveries, |e| sql.int(e)),
        opt_col(sql, &c.last_error, |e| sql
            .text(&sql.prefix(e, ERROR_SHOWN + 1))),
        opt_col(sql, &c.traceparent, |e| sql.text(e)),
        sql.micros(&sql.ident(&c.updated_at)),
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
    let status = s.statuses.classify(&word);
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
        let _ = writeln!(out, "  last error      {}", link::truncate(e, ERROR_SHOWN));
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
pub async fn dead_letters(
    config: &Config,
    source: Option<&str>,
    since: Duration,
    limit: usize,
) -> Result<String, LookupError> {
    let sources = selected(config, source)?;
    let mut out = String::from(
        "source\tevent_id\tevent_type\tfirst_received\tdead_lettered\tattempts\ttrace_id\tlast_error\n",
    );
    for spec in sources {
        let SourceSpec::Inbox(s) = spec else {
            continue;
        };
        let (mut conn, sql) = open(spec).await?;
        let rows = dead_rows(&mut conn, sql, s, since, limit)
            .await
            .map_err(|message| LookupError::Source {
                source_name: s.table.name.clone(),
                message,
            })?;
        let _ = conn.close().await;
        for r in rows {
            let _ = writeln!(
                out,
                "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                s.table.name,
                r.event_id,
                r.event_type.as_deref().unwrap_or("unknown"),
                r.received.map_or("-".to_string(), timestamp),
                r.dead_at.map_or("-".to_string(), timestamp),
                r.attempts.map_or("-".to_string(), |a| a.to_string()),
                to_hex(&link::trace_id(&r.event_id)),
                r.last_error
                    .as_deref()
                    .map_or("-".to_string(), |e| one_line(&link::truncate(
                        e,
                        ERROR_SHOWN
                    ))),
            );
        }
    }
    Ok(out)
}

fn one_line(s: &str) -> String {
    s.replace(['\t', '\n', '\r'], " ")
}

struct Dead {
    event_id: String,
    event_type: Option<String>,
    received: Option<i64>,
    dead_at: Option<i64>,
    attempts: Option<i64>,
    last_error: Option<String>,
}

async fn dead_rows(
    conn: &mut AnyConnection,
    sql: Sql,
    s: &InboxSpec,
    since: Duration,
    limit: usize,
) -> Result<Vec<Dead>, String> {
    let c = &s.columns;
    let words = s.statuses.words_for(Status::Dead);
    if words.is_empty() {
        return Ok(Vec::new());
    }
    let mut tx = conn.begin().await.map_err(|e| e.to_string())?;
    let now: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {}", sql.now_micros())))
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
    let cutoff = now.saturating_sub(i64::try_from(since.as_micros()).unwrap_or(i64::MAX));
    // The change cursor is indexed and set when a row is dead-lettered, so
    // bounding it first keeps this proportional to recent changes.
    let dead_at = c.finished_at.as_deref().unwrap_or(&c.updated_at);
    let mut filter = format!(
        "{} AND {} IN {}",
        sql.after(&sql.ident(&c.updated_at), 1),
        sql.ident(&c.status),
        sql.in_list(&words)
    );
    if c.finished_at.is_some() {
        filter.push_str(&format!(" AND {}", sql.after(&sql.ident(dead_at), 2)));
    }
    let query = format!(
        "SELECT {}, {}, {}, {}, {}, {} FROM {} WHERE {filter} ORDER BY {} DESC, {} {}",
        sql.text(&sql.ident(&c.event_id)),
        opt_col(sql, &c.event_type, |e| sql.text(e)),
        sql.micros(&sql.ident(&c.received_at)),
        sql.micros(&sql.ident(dead_at)),
        opt_col(sql, &c.attempts, |e| sql.int(e)),
        opt_col(sql, &c.last_error, |e| sql
            .text(&sql.prefix(e, ERROR_SHOWN + 1))),
        sql.table(&s.table.table),
        sql.ident(dead_at),
        sql.ident(&c.event_id),
        sql.limit(limit),
    );
    let mut q = sqlx::query(sqlx::AssertSqlSafe(query));
    for _ in 0..(1 + usize::from(c.finished_at.is_some())) {
        q = match sql.cursor(cutoff) {
            crate::sources::table::dialect::Param::Int(v) => q.bind(v),
            crate::sources::table::dialect::Param::Text(v) => q.bind(v),
        };
    }
    let rows = q.fetch_all(&mut *tx).await.map_err(|e| e.to_string())?;
    tx.rollback().await.map_err(|e| e.to_string())?;
    rows.iter()
        .map(|row| {
            Ok(Dead {
                event_id: get::<Option<String>>(row, 0, "event_id")?.unwrap_or_default(),
                event_type: get(row, 1, "event_type")?,
                received: get(row, 2, "received_at")?,
                dead_at: get(row, 3, "finished_at")?,
                attempts: get(row, 4, "attempts")?,
                last_error: get(row, 5, "last_error")?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards `trace` and `dead-letters` on rows with times out of range
    /// (`infinity`, before 1970, after 9999): shown as such, never a panic.
    #[test]
    fn timestamps_rfc3339_cannot_show_are_shown_as_they_are() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(timestamp(1_500), "1970-01-01T00:00:00.001Z");
        assert_eq!(
            timestamp(crate::sources::table::dialect::OUT_OF_RANGE),
            "(out of range)"
        );
        assert_eq!(
            timestamp(-1_000_000),
            "(-1000000 µs from 1970-01-01T00:00:00Z)"
        );
        assert_eq!(
            timestamp(253_402_300_800_000_000),
            "(253402300800000000 µs from 1970-01-01T00:00:00Z)"
        );
    }
}
