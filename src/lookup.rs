//! The on-call lookups, read-only like everything else: `inboxwatch trace
//! EVENT_ID` (one event's timeline and the trace ids to paste into a trace
//! viewer) and `inboxwatch dead-letters` (what was dead-lettered lately).

use std::fmt::Write as _;
use std::time::Duration;

use crate::config::Config;
use crate::fingerprint::Groups;
use crate::sources::SourceSpec;
use crate::sources::kind::VALUE_PREFIX;
use crate::text::{ERROR_SHOWN, bytes_text as escape, printable, terminal_text, timestamp};
use crate::tracing_link::{self as link, to_hex};

/// Why a lookup could not answer.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// `--source` names no table source of the config.
    #[error("--source: no source named \"{0}\" in the config that this command can read")]
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

fn selected_by<'a>(
    config: &'a Config,
    source: Option<&str>,
    searchable: impl Fn(&SourceSpec) -> bool,
) -> Result<Vec<&'a SourceSpec>, LookupError> {
    let out: Vec<&SourceSpec> = config
        .sources
        .iter()
        .filter(|s| searchable(s))
        .filter(|s| source.is_none_or(|n| s.name() == n))
        .collect();
    match (out.is_empty(), source) {
        (true, Some(n)) => Err(LookupError::UnknownSource(n.to_string())),
        _ => Ok(out),
    }
}

/// The sources that offer capability `C`, each with it.
fn with<'a, C: ?Sized>(
    sources: &[&'a SourceSpec],
    offer: impl Fn(&'a SourceSpec) -> Option<&'a C>,
) -> Vec<(&'a SourceSpec, &'a C)> {
    sources
        .iter()
        .filter_map(|s| offer(s).map(|c| (*s, c)))
        .collect()
}

/// `inboxwatch trace`: prints what the tables know of one event.
pub async fn trace(
    config: &Config,
    event_id: &str,
    source: Option<&str>,
) -> Result<String, LookupError> {
    // Lookups read event rows: sources of a kind without them are skipped.
    let sources = selected_by(config, source, |s| s.lookups().is_some())?;
    let mut out = String::new();
    let _ = writeln!(out, "event {event_id}");
    let _ = writeln!(
        out,
        "trace id {}  (derived from the event id)",
        to_hex(&link::trace_id(event_id))
    );
    let mut found = false;
    for (spec, lookups) in with(&sources, SourceSpec::lookups) {
        let text = lookups
            .trace_event(event_id, &config.redact)
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
    // Whole: the id, and what the tables hold (a type, a status word, an
    // error text), can hold ESC, BEL or CR.
    Ok(terminal_text(&out))
}

/// `inboxwatch dead-letters`: what was dead-lettered within `since`, as
/// tab-separated lines, newest first per source; then, when a Kafka source
/// is among those searched, after an empty line, the latest records of its
/// dead-letter topics (at most `per_partition` per partition and `limit`
/// per source, whatever their age), newest first per source.
pub async fn dead_letters(
    config: &Config,
    source: Option<&str>,
    since: Duration,
    limit: usize,
    per_partition: usize,
) -> Result<String, LookupError> {
    let all = selected_by(config, source, |s| {
        s.lookups().is_some() || s.dead_letter_topics().is_some()
    })?;
    let mut out = String::from(
        "source\tevent_id\tevent_type\tfirst_received\tdead_lettered\tattempts\ttrace_id\tlast_error\n",
    );
    for (spec, lookups) in with(&all, SourceSpec::lookups) {
        let rows = lookups
            .dead_letters(since, limit)
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
                printable(&r.event_id),
                r.event_type
                    .as_deref()
                    .map_or("unknown".to_string(), printable),
                r.received.map_or("-".to_string(), timestamp),
                r.dead_at.map_or("-".to_string(), timestamp),
                r.attempts.map_or("-".to_string(), |a| a.to_string()),
                to_hex(&link::trace_id(&r.event_id)),
                r.last_error
                    .as_deref()
                    .map_or("-".to_string(), |e| printable(&link::truncate(
                        &config.redact.prefix(e, ERROR_SHOWN),
                        ERROR_SHOWN
                    ))),
            );
        }
    }
    let topics = with(&all, SourceSpec::dead_letter_topics);
    if topics.is_empty() {
        return Ok(out);
    }
    out.push_str(
        "\nsource\ttopic\tpartition\toffset\ttimestamp\tkey\toriginal_topic\texception_class\texception_message\theaders\tvalue_bytes\tvalue\n",
    );
    for (spec, topics) in topics {
        let found = topics
            .dead_letter_records(per_partition, limit)
            .await
            .map_err(|message| LookupError::Source {
                source_name: spec.name().to_string(),
                message,
            })?;
        for r in &found.records {
            let headers: Vec<String> = r
                .headers
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{}={}",
                        escape(k.as_bytes(), HEADER_SHOWN),
                        escape(v, HEADER_SHOWN)
                    )
                })
                .collect();
            let text = |v: Option<&str>, max: usize| {
                v.map_or("-".to_string(), |v| escape(v.as_bytes(), max))
            };
            let _ = writeln!(
                out,
                "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                spec.name(),
                escape(r.topic.as_bytes(), usize::MAX),
                r.partition,
                r.offset,
                timestamp(r.timestamp.saturating_mul(1000)),
                r.key
                    .as_deref()
                    .map_or("-".to_string(), |k| escape(k, VALUE_PREFIX)),
                text(r.original_topic.as_deref(), HEADER_SHOWN),
                text(r.exception_class.as_deref(), HEADER_SHOWN),
                text(r.exception_message.as_deref(), ERROR_SHOWN),
                if headers.is_empty() {
                    "-".to_string()
                } else {
                    headers.join(" ")
                },
                r.value_len.map_or("-".to_string(), |n| n.to_string()),
                match r.value_len {
                    None => "-".to_string(),
                    Some(n) if n > r.value_prefix.len() => {
                        format!("{}…", escape(&r.value_prefix, usize::MAX))
                    }
                    Some(_) => escape(&r.value_prefix, usize::MAX),
                },
            );
        }
        for p in &found.problems {
            let _ = writeln!(
                out,
                "{}\t{}\t{}\t-\t-\t-\t-\t-\t-\t-\t-\t(not read: {})",
                spec.name(),
                escape(p.topic.as_bytes(), usize::MAX),
                p.partition,
                one_line(&p.message)
            );
        }
    }
    Ok(out)
}

/// `inboxwatch dead-letters groups`: the dead letters of `since` (at most
/// `limit` per source) gathered into failure groups (`fingerprint`), as
/// tab-separated lines, the latest last seen first; a source with more dead
/// letters than `limit` is named on a line of its own after them.
pub async fn dead_letter_groups(
    config: &Config,
    source: Option<&str>,
    since: Duration,
    limit: usize,
) -> Result<String, LookupError> {
    let all = selected_by(config, source, |s| s.lookups().is_some())?;
    let mut groups = Groups::default();
    let mut cut = Vec::new();
    let mut cut_failing = Vec::new();
    for (spec, lookups) in with(&all, SourceSpec::lookups) {
        let rows = lookups
            .dead_letters(since, limit.saturating_add(1))
            .await
            .map_err(|message| LookupError::Source {
                source_name: spec.name().to_string(),
                message,
            })?;
        if rows.len() > limit {
            cut.push(spec.name());
        }
        for r in rows.iter().take(limit) {
            r.as_letter(&config.redact, spec.name(), spec.owner(), |l| groups.add(l));
        }
        let failing = lookups
            .failing(since, limit.saturating_add(1))
            .await
            .map_err(|message| LookupError::Source {
                source_name: spec.name().to_string(),
                message,
            })?;
        if failing.len() > limit {
            cut_failing.push(spec.name());
        }
        for r in failing.iter().take(limit) {
            r.as_letter(&config.redact, spec.name(), spec.owner(), |l| {
                groups.add_failing(l)
            });
        }
    }
    let mut out = String::from(
        "group\tsource\towner\tevent_type\terror_class\tcount\tfailing\tfirst_seen\tlast_seen\tsample_event_id\tfingerprint\n",
    );
    for g in groups.into_sorted() {
        let owner = if g.owner.is_empty() { "-" } else { &g.owner };
        let _ = writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            g.key.id(),
            g.key.source,
            printable(owner),
            printable(&g.key.event_type),
            printable(&g.key.error_class),
            g.count,
            g.failing,
            g.first_seen.map_or("-".to_string(), timestamp),
            g.last_seen.map_or("-".to_string(), timestamp),
            printable(&g.sample_event_id),
            if g.key.fingerprint.is_empty() {
                "-".to_string()
            } else {
                printable(&g.key.fingerprint)
            },
        );
    }
    for name in cut {
        let _ = writeln!(
            out,
            "(source {name} has more than {limit} dead letters within the window: the groups count the latest {limit}; raise --limit)"
        );
    }
    for name in cut_failing {
        let _ = writeln!(
            out,
            "(source {name} has more than {limit} events failing within the window: the groups count the latest {limit}; raise --limit)"
        );
    }
    Ok(out)
}

/// Bytes of a header's key or value `dead-letters` shows.
const HEADER_SHOWN: usize = 64;

fn one_line(s: &str) -> String {
    s.replace(['\t', '\n', '\r'], " ")
}
