//! The on-call lookups, read-only like everything else: `inboxwatch trace
//! EVENT_ID` (one event's timeline and the trace ids to paste into a trace
//! viewer) and `inboxwatch dead-letters` (what was dead-lettered lately).

use std::fmt::Write as _;
use std::time::Duration;

use crate::config::Config;
use crate::sources::SourceSpec;
use crate::sources::kind::{ERROR_SHOWN, timestamp};
use crate::tracing_link::{self as link, to_hex};

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
    // Lookups read event rows: sources of a kind without them are skipped.
    let out: Vec<&SourceSpec> = config
        .sources
        .iter()
        .filter(|s| s.keeps_events())
        .filter(|s| source.is_none_or(|n| s.name() == n))
        .collect();
    match (out.is_empty(), source) {
        (true, Some(n)) => Err(LookupError::UnknownSource(n.to_string())),
        _ => Ok(out),
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
        let text = spec
            .trace_event(event_id)
            .await
            .map_err(|message| LookupError::Source {
                source_name: spec.name().to_string(),
                message,
            })?;
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

/// `inboxwatch dead-letters`: what was dead-lettered within `since`, as
/// tab-separated lines, newest first per source.
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
        let rows =
            spec.dead_letters(since, limit)
                .await
                .map_err(|message| LookupError::Source {
                    source_name: spec.name().to_string(),
                    message,
                })?;
        for r in rows {
            let _ = writeln!(
                out,
                "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                spec.name(),
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
