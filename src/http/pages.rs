//! The pages on-call looks at (`/`, `/dead-letters`, `/events/{id}`) and the
//! same data as JSON (`/api/v1/…`). Served from the binary: no script, no
//! font, no stylesheet from elsewhere; every value that comes from a table,
//! a broker or the configuration is HTML-escaped. Read-only: the status page
//! lays out each source's card, which its kind builds from the values
//! `/metrics` renders (`crate::card`); the dead-letter and event pages read the
//! tables through the agent's own read-only connections, like the
//! `dead-letters` and `trace` commands.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::AppState;
use super::history;
use crate::card::{Card, Part, Table};
use crate::coordination::hide_standby;
use crate::fingerprint::{Groups, Key};
use crate::journal::{FIRST_KEPT, Trail};
use crate::redact::Redactor;
use crate::sources::SourceSpec;
use crate::sources::kind::{AuditEntry, DeadLetter, DeadLetterTopics, DeadRecord, Lookups};
use crate::telemetry::snapshot;
use crate::telemetry::values::Reading;
use crate::text::{ERROR_SHOWN, bytes_text, parse_since, timestamp};
use crate::tracing_link::{self as link, ERROR_TEXT_LEN, to_hex};

/// Dead letters listed per source at most.
const DEAD_LETTERS_SHOWN: usize = 200;
/// Rows read per source when `?error_class=` filters them (the class is
/// worked out from the text, so the filter cannot be a query's).
const DEAD_LETTERS_SCANNED: usize = 2_000;
/// Dead letters read per source for the failure groups.
const GROUPS_SCANNED: usize = 10_000;
/// Events a failure group lists when expanded.
const GROUP_EVENTS_SHOWN: usize = 20;
/// Lookups the pages run against the databases at once, across requests;
/// a request that finds them all busy waits this long, then gets 503.
pub const LOOKUPS_AT_ONCE: usize = 2;
const LOOKUP_QUEUE: Duration = Duration::from_secs(5);
/// How long the dead-letter and event pages wait for a source.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How far back `/dead-letters` looks without `?since=`.
const DEFAULT_SINCE: Duration = Duration::from_secs(24 * 3600);

/// `&`, `<`, `>`, `"` and `'` as entities: safe in text and in quoted attributes.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A span of time as a person says it: `500 ms`, `49 s`, `7 min`, `2 h`,
/// `1 day`, `3 days` — days or hours when they divide it, else whole minutes
/// from two minutes on (not humantime's `1day` or `7m 17s`).
fn span(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{} ms", d.as_millis()),
        _ if s >= 86_400 && s.is_multiple_of(86_400) => match s / 86_400 {
            1 => "1 day".to_string(),
            n => format!("{n} days"),
        },
        _ if s >= 3_600 && s.is_multiple_of(3_600) => format!("{} h", s / 3_600),
        _ if s >= 120 => format!("{} min", s / 60),
        _ => format!("{s} s"),
    }
}

/// Percent-encodes a path segment or a query value.
fn url_part(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// Quotes an argument for a POSIX shell.
fn shell(arg: &str) -> String {
    if !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c))
    {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5em;color:#1b1b1b;background:#fff}\
h1{font-size:1.4em;margin:0 0 .3em}h2{font-size:1.15em;margin:1.2em 0 .4em}\
nav a{margin-right:1em}table{border-collapse:collapse;margin:.4em 0}\
td,th{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top;font-size:.92em}\
th{background:#f3f3f3}.up{color:#126b12;font-weight:600}.down{color:#b00020;font-weight:600}.degraded{color:#a15c00;font-weight:600}\
.standby{color:#666}.over{color:#b00020;font-weight:600}.muted{color:#666}\
pre,code{font-family:ui-monospace,monospace;font-size:.9em;white-space:pre-wrap;word-break:break-all}\
svg{vertical-align:middle}#dead-letters td{max-width:24em;word-break:break-word}\
#dead-letters pre{max-height:8em;overflow:auto;margin:0}details code{display:block;margin:.3em 0}.card{border:1px solid #ddd;border-radius:6px;padding:.6em 1em;margin:1em 0}";

fn page(title: &str, refresh: Option<u32>, body: &str) -> Response {
    let mut html = String::from("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">");
    if let Some(s) = refresh {
        let _ = write!(html, "<meta http-equiv=\"refresh\" content=\"{s}\">");
    }
    let _ = write!(
        html,
        "<meta name=\"viewport\" content=\"width=device-width\"><title>{} · inboxwatch</title>\
         <style>{STYLE}</style></head><body>\
         <nav><a href=\"/\">status</a><a href=\"/dead-letters\">dead letters</a>\
         <a href=\"/metrics\">/metrics</a><a href=\"/healthz\">/healthz</a><a href=\"/readyz\">/readyz</a>\
         <a href=\"/api/v1/status\">/api/v1/status</a></nav>{body}</body></html>",
        escape(title)
    );
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // Nothing on a page may load from elsewhere or run.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:",
            ),
        ],
        html,
    )
        .into_response()
}

fn json<T: Serialize>(value: &T) -> Response {
    match serde_json::to_string_pretty(value) {
        Ok(text) => ([(header::CONTENT_TYPE, "application/json")], text).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// An inline SVG line of `values` (NaN breaks the line), or a dash.
fn sparkline(values: &[f64]) -> String {
    const W: f64 = 120.0;
    const H: f64 = 24.0;
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.is_empty() {
        return "<span class=\"muted\">–</span>".to_string();
    }
    let lo = finite
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .min(0.0);
    let hi = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let span = if hi > lo { hi - lo } else { 1.0 };
    let step = if values.len() > 1 {
        W / (values.len() - 1) as f64
    } else {
        0.0
    };
    let mut lines = Vec::new();
    let mut current = String::new();
    for (i, v) in values.iter().enumerate() {
        if !v.is_finite() {
            if !current.is_empty() {
                lines.push(std::mem::take(&mut current));
            }
            continue;
        }
        let x = i as f64 * step;
        let y = H - 1.0 - (v - lo) / span * (H - 2.0);
        let _ = write!(current, "{x:.1},{y:.1} ");
    }
    if !current.is_empty() {
        lines.push(current);
    }
    let mut svg = format!(
        "<svg width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"last hour\">"
    );
    for l in lines {
        let points = l.trim_end();
        match points.split_once(' ') {
            Some(_) => {
                let _ = write!(
                    svg,
                    "<polyline fill=\"none\" stroke=\"#3366cc\" stroke-width=\"1.5\" points=\"{points}\"/>"
                );
            }
            // A lone value: a dot.
            None => {
                let (x, y) = points.split_once(',').unwrap_or(("0", "0"));
                let _ = write!(
                    svg,
                    "<circle cx=\"{x}\" cy=\"{y}\" r=\"1.5\" fill=\"#3366cc\"/>"
                );
            }
        }
    }
    svg.push_str("</svg>");
    svg
}

/// A number as the page prints it: integers without a fraction, others with
/// up to three decimals.
pub fn number(v: f64) -> String {
    if !v.is_finite() {
        "–".to_string()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// A number in an element of its own, `data-value` naming it (tests read it).
fn val(key: &str, v: f64) -> String {
    format!("<span data-value=\"{}\">{}</span>", escape(key), number(v))
}

/// Parts of a card as HTML: texts escaped, numbers and spans formatted.
fn parts(parts: &[Part]) -> String {
    let mut out = String::new();
    for p in parts {
        match p {
            Part::Text(t) => out.push_str(&escape(t)),
            Part::Value { key, value } => out.push_str(&val(key, *value)),
            Part::Number(v) => out.push_str(&number(*v)),
            Part::Span(d) => out.push_str(&span(*d)),
            Part::Missing => out.push('–'),
            Part::Muted(inner) => {
                let _ = write!(out, "<span class=\"muted\">{}</span>", self::parts(inner));
            }
            Part::Judged {
                over,
                field,
                parts: inner,
            } => {
                let field = field.map_or(String::new(), |f| format!(" data-field=\"{f}\""));
                let _ = write!(
                    out,
                    "<span class=\"{}\"{field}>{}</span>",
                    if *over { "over" } else { "ok" },
                    self::parts(inner)
                );
            }
            Part::Link {
                path,
                query,
                parts: inner,
            } => {
                let query: Vec<String> = query
                    .iter()
                    .map(|(k, v)| format!("{k}={}", url_part(v)))
                    .collect();
                let href = if query.is_empty() {
                    path.to_string()
                } else {
                    format!("{path}?{}", query.join("&"))
                };
                let _ = write!(
                    out,
                    "<a href=\"{}\">{}</a>",
                    escape(&href),
                    self::parts(inner)
                );
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The status page.

/// One source as the status page and `/api/v1/status` show it.
#[derive(Debug, Serialize)]
pub struct SourceStatus {
    pub name: String,
    pub kind: &'static str,
    pub owner: Option<String>,
    /// `up`, `degraded` (up, but its kind judges it degraded: `error` says
    /// why), `down`, `starting` or `standby`.
    pub state: &'static str,
    pub error: Option<String>,
    /// This agent polls the source (false: another agent owns it).
    pub leader: bool,
    /// What each poll reads, in words (a table source with its mode,
    /// `cursor = "none": …`); every kind says it.
    pub reads: String,
    /// What the source's setup leaves out, with the line that fixes it
    /// (a column the table has and the configuration does not map).
    pub notes: Vec<String>,
    /// What its card says of it now, as numbers (the kind's own); none on standby.
    pub numbers: Option<serde_json::Value>,
    /// The last hour of its card's trends, one value per sample and the
    /// current one last (null where absent).
    pub history: BTreeMap<&'static str, Vec<Option<f64>>>,
    /// The rest of its card (tables and rows), for the page.
    #[serde(skip)]
    pub card: Option<Card>,
}

#[derive(Debug, Serialize)]
pub struct StatusReport {
    pub generated_at: String,
    pub sources: Vec<SourceStatus>,
}

/// What `/metrics` renders now: the recorder and the snapshots, without the
/// sources another agent owns.
pub fn exposition(state: &AppState) -> String {
    let (rendered, standing_by, contending) = state.leadership.rendering(|| state.metrics.render());
    let mut text = hide_standby(rendered, &standing_by, &contending);
    snapshot::render(&mut text, &[standing_by, contending].concat());
    text
}

/// Every source's card, in the order of `config.sources`, from the values
/// `/metrics` renders now, read while no source changes hands, and hidden
/// as `/metrics` hides them: `None` for a source another agent owns, a card
/// of no values for one out of this agent's reach.
fn cards(state: &AppState) -> Vec<Option<Card>> {
    let (cards, _, _) = state.leadership.rendering(|| {
        let standing_by = state.leadership.standing_by();
        let contending = state.leadership.contending();
        let mut cards = Vec::with_capacity(state.config.sources.len());
        for spec in state.config.sources.iter() {
            let name = spec.name();
            let reading = if standing_by.iter().any(|s| s == name) {
                cards.push(None);
                continue;
            } else if contending.iter().any(|s| s == name) {
                Reading::nothing(name)
            } else {
                state.values.reading(name)
            };
            cards.push(Some(spec.card(&reading, &state.history.of(name))));
        }
        cards
    });
    cards
}

/// Adds a sample of every source's trends to the history.
pub fn record_history(state: &AppState) {
    for (spec, card) in state.config.sources.iter().zip(cards(state)) {
        state
            .history
            .record(spec.name(), card.as_ref().map(|c| c.trends.as_slice()));
    }
}

pub fn status_report(state: &AppState) -> StatusReport {
    let health = state.health.snapshot();
    let cards = cards(state);
    let mut sources = Vec::new();
    for ((spec, reads), card) in state
        .config
        .sources
        .iter()
        .zip(state.reads.iter())
        .zip(cards)
    {
        let name = spec.name().to_string();
        let h = health.get(&name).cloned().unwrap_or_default();
        let mut card = card.filter(|_| !h.standby);
        let st = match (card.is_none(), h.polled, h.up) {
            (true, _, _) => "standby",
            (false, false, _) => "starting",
            (false, true, true) => "up",
            (false, true, false) => "down",
        };
        let (st, error) = match (st, card.as_ref().and_then(|c| c.degraded.clone())) {
            ("up", Some(why)) => ("degraded", Some(why)),
            _ => (st, h.error.clone()),
        };
        let mut history = BTreeMap::new();
        let mut numbers = None;
        if let Some(card) = &mut card {
            numbers = Some(std::mem::take(&mut card.numbers));
            for (k, v) in state.history.drawn(&name, &card.trends) {
                history.insert(
                    k,
                    v.into_iter().map(|x| x.is_finite().then_some(x)).collect(),
                );
            }
        }
        sources.push(SourceStatus {
            kind: spec.kind(),
            owner: owner(spec),
            state: st,
            error,
            leader: card.is_some(),
            reads: reads.clone(),
            notes: h.notes.clone(),
            numbers,
            history,
            card,
            name,
        });
    }
    StatusReport {
        generated_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        sources,
    }
}

pub async fn status_page(State(state): State<AppState>) -> Response {
    let report = status_report(&state);
    let mut body = String::from("<h1>inboxwatch</h1>");
    let _ = write!(
        body,
        "<p class=\"muted\">{} source(s) · as of {} · this page refreshes every 15 s · \
         sparklines: the last hour, one point per {} s</p>",
        report.sources.len(),
        escape(&report.generated_at),
        history::SAMPLE_EVERY.as_secs()
    );
    for s in &report.sources {
        let _ = write!(
            body,
            "<div class=\"card\" id=\"source-{id}\"><h2>{name} <span class=\"muted\">({kind})</span></h2><p>",
            id = escape(&s.name),
            name = escape(&s.name),
            kind = s.kind
        );
        let _ = write!(
            body,
            "<span class=\"{cls}\" data-field=\"state\">{state}</span>",
            cls = s.state,
            state = s.state
        );
        if let Some(e) = &s.error {
            let _ = write!(body, ": <code data-field=\"error\">{}</code>", escape(e));
        }
        let _ = write!(
            body,
            " · owner: <span data-field=\"owner\">{}</span> · {}</p>",
            s.owner.as_deref().map_or("(none)".to_string(), escape),
            if s.leader {
                "polled by this agent"
            } else {
                "standby: another agent owns it"
            }
        );
        let _ = write!(
            body,
            "<p class=\"muted\" data-field=\"reads\">{}</p>",
            escape(&s.reads)
        );
        for note in &s.notes {
            let _ = write!(body, "<p data-field=\"note\">{}</p>", escape(note));
        }
        if let Some(card) = &s.card {
            body.push_str(&numbers_table(card, &s.history));
        }
        body.push_str("</div>");
    }
    page("status", Some(15), &body)
}

/// One row of named numbers: its title and value (HTML) and its sparkline.
fn row(body: &mut String, field: &str, title: &str, value: &str, spark: Option<&Vec<Option<f64>>>) {
    let line = spark.map_or(String::new(), |v| {
        sparkline(&v.iter().map(|x| x.unwrap_or(f64::NAN)).collect::<Vec<_>>())
    });
    let _ = write!(
        body,
        "<tr><th>{title}</th><td data-field=\"{field}\">{value}</td><td>{line}</td></tr>"
    );
}

/// A card's table: a header row, then a row per key (`data-{rows_are}`
/// holding it) or the card's word for none.
fn table(body: &mut String, t: &Table) {
    let _ = write!(body, "<table><tr><th>{}</th>", escape(t.rows_are));
    for (_, title) in &t.columns {
        let _ = write!(body, "<th>{}</th>", escape(title));
    }
    body.push_str("</tr>");
    for r in &t.rows {
        let key = escape(&r.key);
        let _ = write!(
            body,
            "<tr data-{}=\"{key}\"><td>{key}</td>",
            escape(t.rows_are)
        );
        for ((field, _), cell) in t.columns.iter().zip(&r.cells) {
            let _ = write!(body, "<td data-field=\"{field}\">{}</td>", parts(cell));
        }
        body.push_str("</tr>");
    }
    if t.rows.is_empty() {
        let _ = write!(
            body,
            "<tr><td colspan=\"{}\" class=\"muted\">{}</td></tr>",
            t.columns.len() + 1,
            escape(t.empty)
        );
    }
    body.push_str("</table>");
}

/// A card's tables, then its rows of named numbers, each with the
/// sparkline of the trend it names.
fn numbers_table(card: &Card, history: &BTreeMap<&'static str, Vec<Option<f64>>>) -> String {
    let mut body = String::new();
    for t in &card.tables {
        table(&mut body, t);
    }
    if !card.rows.is_empty() {
        body.push_str("<table>");
        for r in &card.rows {
            row(
                &mut body,
                r.field,
                &parts(&r.title),
                &parts(&r.value),
                r.spark.and_then(|k| history.get(k)),
            );
        }
        body.push_str("</table>");
    }
    body
}

pub async fn api_status(State(state): State<AppState>) -> Response {
    json(&status_report(&state))
}

// ---------------------------------------------------------------------------
// Dead letters.

/// The filters of `/dead-letters`.
#[derive(Debug, Default)]
struct Filters {
    source: Option<String>,
    since: Duration,
    error_class: Option<String>,
    /// A failure group's id: only its dead letters.
    group: Option<String>,
}

fn filters(uri: &Uri) -> Result<Filters, String> {
    let mut f = Filters {
        since: DEFAULT_SINCE,
        ..Filters::default()
    };
    for (k, v) in url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        match &*k {
            "source" if !v.is_empty() => f.source = Some(v.into_owned()),
            "error_class" if !v.is_empty() => f.error_class = Some(v.into_owned()),
            "group" if !v.is_empty() => {
                if v.len() != 16 || !v.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!("group: {v:?} is not a group id (16 hex digits)"));
                }
                f.group = Some(v.to_ascii_lowercase());
            }
            "since" if !v.is_empty() => {
                f.since = parse_since(&v).map_err(|e| format!("since: {e}"))?;
            }
            "source" | "since" | "error_class" | "group" => {}
            other => {
                return Err(format!(
                    "unknown query parameter {other:?}: expected source, since, error_class or group"
                ));
            }
        }
    }
    Ok(f)
}

/// One dead letter as the page and `/api/v1/dead-letters` show it.
#[derive(Debug, Serialize)]
pub struct DeadLetterView {
    pub source: String,
    pub owner: Option<String>,
    pub event_id: String,
    pub event_type: Option<String>,
    pub business_key: Option<String>,
    pub summary: Option<String>,
    pub first_received: Option<String>,
    /// When its first attempt failed, as the agent saw it (the journal);
    /// null when that attempt ended between two polls or before the agent
    /// watched the event.
    pub first_failed_at: Option<String>,
    pub dead_lettered_at: Option<String>,
    pub attempts: Option<i64>,
    pub error_class: Option<String>,
    pub last_error: Option<String>,
    pub trace_id: String,
    pub trace_url: Option<String>,
    pub replay_command: String,
    pub ignore_command: String,
    /// The source has `[sources.dead_letter_actions]`: the commands can run.
    pub actions_configured: bool,
    /// The replays and ignores recorded for it, oldest first.
    pub history: Vec<ActionView>,
    /// It was dead-lettered again after an audited replay: the replay did
    /// not fix it.
    pub failed_again_after_replay: bool,
}

/// One audited replay or ignore (`dead-letters replay` / `ignore`).
#[derive(Debug, Serialize)]
pub struct ActionView {
    pub action: String,
    pub operator: String,
    pub reason: String,
    pub at: String,
    pub previous_status: Option<String>,
    pub attempts: Option<i64>,
    pub last_error: Option<String>,
    /// `at` in microseconds since the epoch, to compare with a dead letter's time.
    #[serde(skip)]
    pub at_micros: i64,
}

impl From<AuditEntry> for ActionView {
    fn from(a: AuditEntry) -> ActionView {
        ActionView {
            at_micros: a.at,
            action: a.action,
            operator: a.operator,
            reason: a.reason,
            at: timestamp(a.at),
            previous_status: a.previous_status,
            attempts: a.attempts,
            last_error: a.last_error,
        }
    }
}

/// The audit history of `ids` in one source, by event id, its texts masked
/// by `redact`; an error is a note, not a failure of the page.
async fn histories(
    spec: &SourceSpec,
    ids: &[String],
    redact: &Redactor,
    errors: &mut Vec<(String, String)>,
) -> BTreeMap<String, Vec<ActionView>> {
    let mut out: BTreeMap<String, Vec<ActionView>> = BTreeMap::new();
    let Some(actions) = spec.dead_letter_actions().filter(|_| !ids.is_empty()) else {
        return out;
    };
    match tokio::time::timeout(LOOKUP_TIMEOUT, actions.history(ids)).await {
        Ok(Ok(entries)) => {
            for e in entries {
                let id = e.event_id.clone();
                let mut v = ActionView::from(e);
                v.last_error = redact.owned(v.last_error);
                out.entry(id).or_default().push(v);
            }
        }
        Ok(Err(e)) => errors.push((spec.name().to_string(), format!("audit history: {e}"))),
        Err(_) => errors.push((
            spec.name().to_string(),
            format!(
                "audit history: no answer within {}s",
                LOOKUP_TIMEOUT.as_secs()
            ),
        )),
    }
    out
}

fn history_html(history: &[ActionView]) -> String {
    if history.is_empty() {
        return String::new();
    }
    let mut out = String::from("<ul class=\"history\">");
    for a in history {
        let _ = write!(
            out,
            "<li data-field=\"action\">{} {} by {}: {} <span class=\"muted\">(was {}, {} attempts)</span></li>",
            escape(&a.at),
            escape(&a.action),
            escape(&a.operator),
            escape(&a.reason),
            a.previous_status.as_deref().map_or("–".to_string(), escape),
            a.attempts.map_or("–".to_string(), |n| n.to_string()),
        );
    }
    out.push_str("</ul>");
    out
}

/// One record of a Kafka dead-letter topic.
#[derive(Debug, Serialize)]
pub struct DeadRecordView {
    pub source: String,
    pub owner: Option<String>,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub timestamp: String,
    /// As text: UTF-8 as it is, other bytes as `\xNN`; null for a null key.
    pub key: Option<String>,
    pub original_topic: Option<String>,
    pub exception_class: Option<String>,
    pub exception_message: Option<String>,
    pub headers: Vec<(String, String)>,
    /// The first bytes of the value, as text.
    pub value_prefix: String,
    /// Bytes of the whole value; null for a tombstone.
    pub value_bytes: Option<usize>,
}

/// Records listed per Kafka source, and per partition.
const RECORDS_SHOWN: usize = 50;
const RECORDS_PER_PARTITION: usize = 5;

fn record_view(spec: &SourceSpec, r: DeadRecord) -> DeadRecordView {
    DeadRecordView {
        source: spec.name().to_string(),
        owner: owner(spec),
        timestamp: timestamp(r.timestamp.saturating_mul(1000)),
        key: r.key.as_deref().map(|k| bytes_text(k, 256)),
        headers: r
            .headers
            .iter()
            .map(|(k, v)| (bytes_text(k.as_bytes(), 64), bytes_text(v, 256)))
            .collect(),
        value_prefix: bytes_text(&r.value_prefix, usize::MAX),
        value_bytes: r.value_len,
        original_topic: r.original_topic,
        exception_class: r.exception_class,
        exception_message: r.exception_message,
        topic: r.topic,
        partition: r.partition,
        offset: r.offset,
    }
}

#[derive(Debug, Serialize)]
pub struct DeadLettersReport {
    pub since_seconds: u64,
    pub dead_letters: Vec<DeadLetterView>,
    /// Sources with more dead letters in the window than the list holds
    /// (it holds the newest 200 per source; narrow `?since=`).
    pub cut: Vec<String>,
    /// The latest records of the Kafka sources' dead-letter topics (not
    /// filtered by `since` or `error_class`).
    pub topic_records: Vec<DeadRecordView>,
    /// Sources that could not be read, with why.
    pub errors: Vec<(String, String)>,
}

/// The source's owner, none when not configured.
fn owner(spec: &SourceSpec) -> Option<String> {
    Some(spec.owner().to_string()).filter(|o| !o.is_empty())
}

fn trace_link(state: &AppState, trace_id: &str) -> Option<String> {
    state
        .config
        .trace_url
        .as_ref()
        .map(|u| u.replace("{trace_id}", trace_id))
}

fn command(state: &AppState, action: &str, source: &str, event_id: &str) -> String {
    format!(
        "inboxwatch dead-letters {action} --config {} --source {} --operator \"$USER\" --reason '…' -- {}",
        shell(state.config.path.as_deref().unwrap_or("inboxwatch.toml")),
        shell(source),
        shell(event_id)
    )
}

/// One dead letter as listed; `actions_configured`: the source has
/// `[sources.dead_letter_actions]` (asked once per source).
fn view(
    state: &AppState,
    spec: &SourceSpec,
    actions_configured: bool,
    d: DeadLetter,
) -> DeadLetterView {
    let trace_id = to_hex(&link::trace_id(&d.event_id));
    let first_failed_at = state
        .journal
        .trail(spec.name(), &d.event_id)
        .and_then(|t| t.first_failure())
        .map(timestamp);
    let redact = &state.config.redact;
    DeadLetterView {
        source: spec.name().to_string(),
        owner: owner(spec),
        replay_command: command(state, "replay", spec.name(), &d.event_id),
        ignore_command: command(state, "ignore", spec.name(), &d.event_id),
        actions_configured,
        history: Vec::new(),
        failed_again_after_replay: false,
        trace_url: trace_link(state, &trace_id),
        trace_id,
        event_type: d.event_type,
        business_key: redact.owned(d.business_key),
        summary: d
            .summary
            .map(|s| redact.prefix(&s, ERROR_SHOWN).into_owned()),
        first_received: d.received.map(timestamp),
        first_failed_at,
        dead_lettered_at: d.dead_at.map(timestamp),
        attempts: d.attempts,
        error_class: d.error_class,
        last_error: d
            .last_error
            .map(|e| redact.prefix(&e, ERROR_SHOWN).into_owned()),
        event_id: d.event_id,
    }
}

async fn dead_letters_report(state: &AppState, f: &Filters) -> Result<DeadLettersReport, String> {
    let chosen = |s: &&SourceSpec| f.source.as_deref().is_none_or(|n| n == s.name());
    let sources: Vec<(&SourceSpec, &dyn Lookups)> = state
        .config
        .sources
        .iter()
        .filter(chosen)
        .filter_map(|s| Some((s, s.lookups()?)))
        .collect();
    let topics: Vec<(&SourceSpec, &dyn DeadLetterTopics)> = state
        .config
        .sources
        .iter()
        .filter(chosen)
        .filter_map(|s| Some((s, s.dead_letter_topics()?)))
        .collect();
    if let Some(n) = &f.source
        && sources.is_empty()
        && topics.is_empty()
    {
        return Err(format!(
            "source: no source named {n:?} with dead letters to list"
        ));
    }
    if let Some(class) = &f.error_class {
        let mut known: Vec<String> = sources
            .iter()
            .flat_map(|(_, lookups)| lookups.error_classes())
            .collect();
        known.sort();
        known.dedup();
        if !known.contains(class) {
            return Err(format!(
                "error_class: {class:?} is not a class of these sources; their classes: {}",
                known.join(", ")
            ));
        }
    }
    let mut topic_records = Vec::new();
    let mut errors = Vec::new();
    for (spec, topics) in topics
        .iter()
        .filter(|_| f.error_class.is_none() && f.group.is_none())
    {
        match tokio::time::timeout(
            LOOKUP_TIMEOUT,
            topics.dead_letter_records(RECORDS_PER_PARTITION, RECORDS_SHOWN),
        )
        .await
        {
            Ok(Ok(read)) => {
                topic_records.extend(read.records.into_iter().map(|r| record_view(spec, r)));
                for p in read.problems {
                    errors.push((
                        spec.name().to_string(),
                        format!(
                            "{} partition {}: not read: {}",
                            p.topic, p.partition, p.message
                        ),
                    ));
                }
            }
            Ok(Err(e)) => errors.push((spec.name().to_string(), e)),
            Err(_) => errors.push((
                spec.name().to_string(),
                format!("no answer within {}s", LOOKUP_TIMEOUT.as_secs()),
            )),
        }
    }
    let mut out = Vec::new();
    let mut cut = Vec::new();
    let scan = if f.error_class.is_some() || f.group.is_some() {
        DEAD_LETTERS_SCANNED
    } else {
        DEAD_LETTERS_SHOWN
    };
    for (spec, lookups) in sources {
        match tokio::time::timeout(LOOKUP_TIMEOUT, lookups.dead_letters(f.since, scan)).await {
            Ok(Ok(rows)) => {
                let read = rows.len();
                let mut rows: Vec<DeadLetter> = rows
                    .into_iter()
                    .filter(|d| f.error_class.is_none() || d.error_class == f.error_class)
                    .filter(|d| {
                        f.group
                            .as_deref()
                            .is_none_or(|g| group_key(&state.config.redact, spec, d).id() == g)
                    })
                    .collect();
                if read >= scan || rows.len() > DEAD_LETTERS_SHOWN {
                    rows.truncate(DEAD_LETTERS_SHOWN);
                    cut.push(spec.name().to_string());
                }
                let ids: Vec<String> = rows.iter().map(|d| d.event_id.clone()).collect();
                let mut history = histories(spec, &ids, &state.config.redact, &mut errors).await;
                let configured = spec
                    .dead_letter_actions()
                    .is_some_and(|a| a.audit_ddl().is_some());
                for d in rows {
                    let at = d.dead_at;
                    let mut v = view(state, spec, configured, d);
                    v.history = history.remove(&v.event_id).unwrap_or_default();
                    v.failed_again_after_replay = at.is_some_and(|dead| {
                        v.history
                            .iter()
                            .any(|a| a.action == "replay" && a.at_micros < dead)
                    });
                    out.push((at, v));
                }
            }
            Ok(Err(e)) => errors.push((spec.name().to_string(), e)),
            Err(_) => errors.push((
                spec.name().to_string(),
                format!("no answer within {}s", LOOKUP_TIMEOUT.as_secs()),
            )),
        }
    }
    // Newest first across sources (each source's list already is).
    out.sort_by_key(|b| std::cmp::Reverse(b.0));
    Ok(DeadLettersReport {
        since_seconds: f.since.as_secs(),
        dead_letters: out.into_iter().map(|(_, v)| v).collect(),
        cut,
        topic_records,
        errors,
    })
}

/// The failure group of dead letter `d` of `spec`, its error text masked as
/// the page shows it.
fn group_key(redact: &Redactor, spec: &SourceSpec, d: &DeadLetter) -> Key {
    d.as_letter(redact, spec.name(), spec.owner(), |l| Key::of(&l))
}

/// One failure group as the page and `/api/v1/dead-letter-groups` show it.
#[derive(Debug, Serialize)]
pub struct GroupView {
    pub id: String,
    pub source: String,
    pub owner: Option<String>,
    pub event_type: String,
    pub error_class: String,
    /// The error text without its variable parts.
    pub fingerprint: String,
    /// Dead letters.
    pub count: u64,
    /// Events failing now (a failed status, waiting for their next attempt).
    pub failing: u64,
    /// The earliest and latest failure, dead letters and failing events alike.
    pub first_seen: Option<String>,
    pub last_seen: Option<String>,
    /// The latest failure of the group.
    pub sample_event_id: String,
    pub sample_error: Option<String>,
    /// Its latest dead letters (at most [`GROUP_EVENTS_SHOWN`]), newest
    /// first: event id and when it was dead-lettered.
    pub events: Vec<(String, Option<String>)>,
    /// Its latest events failing now, newest first: event id and its last
    /// failure.
    pub failing_events: Vec<(String, Option<String>)>,
}

#[derive(Debug, Serialize)]
pub struct GroupsReport {
    pub since_seconds: u64,
    /// The latest last seen first.
    pub groups: Vec<GroupView>,
    /// Sources with more dead letters in the window than were grouped
    /// (the newest [`GROUPS_SCANNED`] per source).
    pub cut: Vec<String>,
    pub errors: Vec<(String, String)>,
}

/// The dead letters of the filters' window gathered into failure groups.
async fn groups_report(state: &AppState, f: &Filters) -> GroupsReport {
    let redact = &state.config.redact;
    let mut groups = Groups::default();
    let mut events: BTreeMap<String, Vec<(String, Option<i64>)>> = BTreeMap::new();
    let mut failing_events: BTreeMap<String, Vec<(String, Option<i64>)>> = BTreeMap::new();
    let mut cut = Vec::new();
    let mut errors = Vec::new();
    let sources = state
        .config
        .sources
        .iter()
        .filter(|s| f.source.as_deref().is_none_or(|n| n == s.name()))
        .filter_map(|s| Some((s, s.lookups()?)));
    for (spec, lookups) in sources {
        let rows = match tokio::time::timeout(
            LOOKUP_TIMEOUT,
            lookups.dead_letters(f.since, GROUPS_SCANNED),
        )
        .await
        {
            Ok(Ok(rows)) => rows,
            Ok(Err(e)) => {
                errors.push((spec.name().to_string(), e));
                continue;
            }
            Err(_) => {
                errors.push((
                    spec.name().to_string(),
                    format!("no answer within {}s", LOOKUP_TIMEOUT.as_secs()),
                ));
                continue;
            }
        };
        if rows.len() >= GROUPS_SCANNED {
            cut.push(spec.name().to_string());
        }
        let failing =
            match tokio::time::timeout(LOOKUP_TIMEOUT, lookups.failing(f.since, GROUPS_SCANNED))
                .await
            {
                Ok(Ok(rows)) => rows,
                Ok(Err(e)) => {
                    errors.push((spec.name().to_string(), e));
                    Vec::new()
                }
                Err(_) => {
                    errors.push((
                        spec.name().to_string(),
                        format!("no answer within {}s", LOOKUP_TIMEOUT.as_secs()),
                    ));
                    Vec::new()
                }
            };
        if failing.len() >= GROUPS_SCANNED && !cut.iter().any(|c| c == spec.name()) {
            cut.push(spec.name().to_string());
        }
        let picked = |d: &&DeadLetter| f.error_class.is_none() || d.error_class == f.error_class;
        for (list, dead) in [(&rows, true), (&failing, false)] {
            for d in list.iter().filter(picked) {
                d.as_letter(redact, spec.name(), spec.owner(), |letter| {
                    let id = Key::of(&letter).id();
                    let listed = if dead {
                        events.entry(id).or_default()
                    } else {
                        failing_events.entry(id).or_default()
                    };
                    if listed.len() < GROUP_EVENTS_SHOWN {
                        listed.push((d.event_id.clone(), d.dead_at));
                    }
                    if dead {
                        groups.add(letter);
                    } else {
                        groups.add_failing(letter);
                    }
                });
            }
        }
    }
    let owners: BTreeMap<&str, Option<String>> = state
        .config
        .sources
        .iter()
        .map(|s| (s.name(), owner(s)))
        .collect();
    let groups = groups
        .into_sorted()
        .into_iter()
        .map(|g| {
            let id = g.key.id();
            let newest_first = |mut l: Vec<(String, Option<i64>)>| {
                l.sort_by_key(|(_, at)| std::cmp::Reverse(*at));
                l.into_iter()
                    .map(|(e, at)| (e, at.map(timestamp)))
                    .collect()
            };
            let listed = newest_first(events.remove(&id).unwrap_or_default());
            let failing_listed = newest_first(failing_events.remove(&id).unwrap_or_default());
            GroupView {
                owner: owners.get(g.key.source.as_str()).cloned().flatten(),
                id,
                count: g.count,
                failing: g.failing,
                failing_events: failing_listed,
                first_seen: g.first_seen.map(timestamp),
                last_seen: g.last_seen.map(timestamp),
                sample_event_id: g.sample_event_id,
                sample_error: g.sample_error,
                events: listed,
                source: g.key.source,
                event_type: g.key.event_type,
                error_class: g.key.error_class,
                fingerprint: g.key.fingerprint,
            }
        })
        .collect();
    GroupsReport {
        since_seconds: f.since.as_secs(),
        groups,
        cut,
        errors,
    }
}

/// The failure groups as a table, each expanding to its latest events.
fn groups_html(body: &mut String, f: &Filters, report: &GroupsReport) {
    body.push_str(
        "<h2>Failure groups</h2><p class=\"muted\">dead letters and events failing now by source, \
         event type, error class and the error text without its variable parts; the latest last \
         seen first</p>",
    );
    for source in &report.cut {
        let _ = write!(
            body,
            "<p class=\"over\" data-field=\"groups_cut\">source {}: more dead letters than grouped; \
             these groups count the newest {GROUPS_SCANNED} (narrow <code>?since=</code>)</p>",
            escape(source)
        );
    }
    if report.groups.is_empty() {
        body.push_str("<p class=\"muted\">No failure group in this window.</p>");
        return;
    }
    body.push_str(
        "<table id=\"dead-letter-groups\"><tr><th>source</th><th>owner</th><th>event type</th>\
         <th>error class</th><th>count</th><th>failing now</th><th>first seen</th><th>last seen</th><th>error (variable parts taken out)</th>\
         <th>events</th></tr>",
    );
    for g in &report.groups {
        let item = |(id, at): &(String, Option<String>), failing: bool| {
            format!(
                "<li><a href=\"/events/{}\">{}</a> <span class=\"muted\">{}{}</span></li>",
                url_part(id),
                escape(id),
                at.as_deref().map_or("–".to_string(), escape),
                if failing { " (failing)" } else { "" }
            )
        };
        let items: String = g
            .events
            .iter()
            .map(|e| item(e, false))
            .chain(g.failing_events.iter().map(|e| item(e, true)))
            .collect();
        let _ = write!(
            body,
            "<tr class=\"group\" data-group=\"{id}\"><td>{}</td><td data-field=\"owner\">{}</td><td data-field=\"event_type\">{}</td>\
             <td data-field=\"error_class\">{}</td><td data-field=\"count\">{}</td><td data-field=\"failing\">{}</td><td data-field=\"first_seen\">{}</td>\
             <td data-field=\"last_seen\">{}</td><td><pre data-field=\"fingerprint\">{}</pre></td>\
             <td><details><summary>{} latest</summary><ul>{items}</ul>\
             <a href=\"/dead-letters?group={id}&amp;since={}\">all of them below</a></details></td></tr>",
            escape(&g.source),
            g.owner.as_deref().map_or("–".to_string(), escape),
            escape(&g.event_type),
            escape(&g.error_class),
            g.count,
            g.failing,
            g.first_seen.as_deref().map_or("–".to_string(), escape),
            g.last_seen.as_deref().map_or("–".to_string(), escape),
            escape(&g.fingerprint),
            g.events.len() + g.failing_events.len(),
            f.since.as_secs(),
            id = escape(&g.id),
        );
    }
    body.push_str("</table>");
}

pub async fn api_dead_letter_groups(State(state): State<AppState>, uri: Uri) -> Response {
    let f = match filters(&uri) {
        Ok(f) => f,
        Err(e) => return bad_request(&e),
    };
    if let Some(n) = &f.source
        && !state
            .config
            .sources
            .iter()
            .any(|s| s.name() == n && s.lookups().is_some())
    {
        return bad_request(&format!(
            "source: no source named {n:?} with dead letters to group"
        ));
    }
    let _slot = match lookup_slot(&state).await {
        Ok(slot) => slot,
        Err(r) => return r,
    };
    json(&groups_report(&state, &f).await)
}

/// A turn to read the databases: at most [`LOOKUPS_AT_ONCE`] page requests
/// do at once, so that open tabs or a script polling the API during an
/// incident cannot pile connections onto a struggling database.
async fn lookup_slot(state: &AppState) -> Result<tokio::sync::OwnedSemaphorePermit, Response> {
    match tokio::time::timeout(LOOKUP_QUEUE, state.lookups.clone().acquire_owned()).await {
        Ok(Ok(permit)) => Ok(permit),
        _ => Err((
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "5")],
            format!(
                "the agent is already reading the databases for {LOOKUPS_AT_ONCE} other page requests; \
                 retry in a few seconds\n"
            ),
        )
            .into_response()),
    }
}

fn bad_request(message: &str) -> Response {
    (StatusCode::BAD_REQUEST, format!("{message}\n")).into_response()
}

/// What `/dead-letters` and `/api/v1/dead-letters` answer: the filters of
/// `uri` checked, a lookup turn taken, the tables read.
async fn dead_letters_for(
    state: &AppState,
    uri: &Uri,
) -> Result<(Filters, DeadLettersReport), Response> {
    let f = filters(uri).map_err(|e| bad_request(&e))?;
    let _slot = lookup_slot(state).await?;
    let report = dead_letters_report(state, &f)
        .await
        .map_err(|e| bad_request(&e))?;
    Ok((f, report))
}

/// What `/dead-letters` shows: the list of [`dead_letters_for`] and, unless
/// one group is asked for, the failure groups, read side by side in one
/// lookup turn (a slow database costs the page one lookup's wait, not two).
async fn dead_letters_and_groups(
    state: &AppState,
    uri: &Uri,
) -> Result<(Filters, DeadLettersReport, Option<GroupsReport>), Response> {
    let f = filters(uri).map_err(|e| bad_request(&e))?;
    let _slot = lookup_slot(state).await?;
    let groups = async {
        match f.group {
            None => Some(groups_report(state, &f).await),
            Some(_) => None,
        }
    };
    let (report, groups) = tokio::join!(dead_letters_report(state, &f), groups);
    let report = report.map_err(|e| bad_request(&e))?;
    Ok((f, report, groups))
}

pub async fn dead_letters_page(State(state): State<AppState>, uri: Uri) -> Response {
    let (f, report, groups) = match dead_letters_and_groups(&state, &uri).await {
        Ok(found) => found,
        Err(r) => return r,
    };
    let mut body = String::from("<h1>Dead letters</h1>");
    if let Some(groups) = &groups {
        groups_html(&mut body, &f, groups);
        body.push_str("<h2>Dead letters</h2>");
    }
    let _ = write!(
        body,
        "<p class=\"muted\">newest first · within {} · source {} · error class {} · group {} · \
         filters: <code>?source=</code> <code>?since=1h</code> <code>?error_class=</code> <code>?group=</code></p>",
        span(f.since),
        f.source.as_deref().map_or("any".to_string(), escape),
        f.error_class.as_deref().map_or("any".to_string(), escape),
        f.group.as_deref().map_or("any".to_string(), escape),
    );
    for (source, e) in &report.errors {
        let _ = write!(
            body,
            "<p class=\"down\">source {}: {}</p>",
            escape(source),
            escape(e)
        );
    }
    for source in &report.cut {
        let _ = write!(
            body,
            "<p class=\"over\" data-field=\"cut\">source {}: more dead letters than shown; \
             these are the newest {DEAD_LETTERS_SHOWN} (narrow <code>?since=</code>)</p>",
            escape(source)
        );
    }
    body.push_str(
        "<table id=\"dead-letters\"><tr><th>source</th><th>owner</th><th>event id</th><th>event type</th>\
         <th>business key</th><th>summary</th><th>first received</th><th>first failed</th>\
         <th>dead-lettered</th><th>attempts</th><th>error class</th><th>last error</th><th>trace id</th><th>replay / ignore</th></tr>",
    );
    for d in &report.dead_letters {
        let trace = match &d.trace_url {
            Some(u) => format!("<a href=\"{}\">{}</a>", escape(u), escape(&d.trace_id)),
            None => escape(&d.trace_id),
        };
        let o = |v: &Option<String>| v.as_deref().map_or("–".to_string(), escape);
        let _ = write!(
            body,
            "<tr class=\"dead-letter\"><td>{}</td><td data-field=\"owner\">{}</td><td data-field=\"event_id\"><a href=\"/events/{}\">{}</a>{}</td>\
             <td>{}</td><td data-field=\"business_key\">{}</td><td data-field=\"summary\">{}</td><td>{}</td>\
             <td data-field=\"first_failed_at\">{}</td><td>{}</td><td data-field=\"attempts\">{}</td><td data-field=\"error_class\">{}</td><td><pre data-field=\"last_error\">{}</pre></td>\
             <td data-field=\"trace_id\">{trace}</td><td>{}{}</td></tr>",
            escape(&d.source),
            o(&d.owner),
            url_part(&d.event_id),
            escape(&d.event_id),
            if d.failed_again_after_replay {
                "<br><span class=\"over\" data-field=\"failed_again\">failed again after replay</span>"
            } else {
                ""
            },
            o(&d.event_type),
            o(&d.business_key),
            o(&d.summary),
            o(&d.first_received),
            o(&d.first_failed_at),
            o(&d.dead_lettered_at),
            d.attempts.map_or("–".to_string(), |a| a.to_string()),
            o(&d.error_class),
            o(&d.last_error),
            history_html(&d.history),
            if d.actions_configured {
                format!(
                    "<details><summary>commands</summary><code>{}</code><br><code>{}</code></details>",
                    escape(&d.replay_command),
                    escape(&d.ignore_command)
                )
            } else {
                "<span class=\"muted\">replay and ignore need \
                 <code>[sources.dead_letter_actions]</code></span>"
                    .to_string()
            },
        );
    }
    body.push_str("</table>");
    if report.dead_letters.is_empty() {
        body.push_str("<p class=\"muted\">No dead letters in this window.</p>");
    }
    if !report.topic_records.is_empty() {
        body.push_str(
            "<h2>Dead-letter topics</h2><p class=\"muted\">the latest records of each partition, \
             newest first, read without a consumer group</p><table id=\"dead-records\"><tr><th>source</th>\
             <th>owner</th><th>topic</th><th>partition</th><th>offset</th><th>timestamp</th><th>key</th>\
             <th>original topic</th><th>exception</th><th>headers</th><th>value (first bytes)</th></tr>",
        );
        for r in &report.topic_records {
            let o = |v: &Option<String>| v.as_deref().map_or("–".to_string(), escape);
            let headers = r
                .headers
                .iter()
                .map(|(k, v)| format!("{}: {}", escape(k), escape(v)))
                .collect::<Vec<_>>()
                .join("<br>");
            let _ = write!(
                body,
                "<tr class=\"dead-record\"><td>{}</td><td data-field=\"owner\">{}</td><td data-field=\"topic\">{}</td><td data-field=\"partition\">{}</td>\
                 <td data-field=\"offset\">{}</td><td>{}</td><td data-field=\"key\">{}</td><td>{}</td>\
                 <td>{}{}</td><td>{headers}</td><td><pre data-field=\"value\">{}</pre>{}</td></tr>",
                escape(&r.source),
                o(&r.owner),
                escape(&r.topic),
                r.partition,
                r.offset,
                escape(&r.timestamp),
                o(&r.key),
                o(&r.original_topic),
                o(&r.exception_class),
                r.exception_message
                    .as_deref()
                    .map_or(String::new(), |m| format!("<br>{}", escape(m))),
                escape(&r.value_prefix),
                match r.value_bytes {
                    Some(n) => format!("<span class=\"muted\">{n} bytes</span>"),
                    None => "<span class=\"muted\">null (tombstone)</span>".to_string(),
                },
            );
        }
        body.push_str("</table>");
    }
    page("dead letters", None, &body)
}

pub async fn api_dead_letters(State(state): State<AppState>, uri: Uri) -> Response {
    match dead_letters_for(&state, &uri).await {
        Ok((_, r)) => json(&r),
        Err(r) => r,
    }
}

// ---------------------------------------------------------------------------
// One event.

#[derive(Debug, Serialize)]
pub struct AttemptView {
    pub number: u32,
    pub observed: bool,
    pub started: Option<String>,
    pub ended: Option<String>,
    pub outcome: &'static str,
    pub error_class: Option<String>,
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct TrajectoryView {
    pub source: String,
    pub event_type: Option<String>,
    pub received: Option<String>,
    /// Attempts the journal dropped from the middle of a long trajectory.
    pub elided: u32,
    pub attempts: Vec<AttemptView>,
}

#[derive(Debug, Serialize)]
pub struct EventReport {
    pub event_id: String,
    pub trace_id: String,
    pub trace_url: Option<String>,
    /// What `inboxwatch trace` prints; none when no table has the event.
    pub trace: Option<String>,
    pub trajectories: Vec<TrajectoryView>,
    /// Replays and ignores recorded for the event, by source.
    pub actions: Vec<(String, Vec<ActionView>)>,
    pub errors: Vec<(String, String)>,
}

/// One journal trail as shown, its error texts masked by `redact`.
fn trajectory(source: &str, t: Trail, redact: &Redactor) -> TrajectoryView {
    TrajectoryView {
        source: source.to_string(),
        event_type: t.event_type,
        received: t.received.map(timestamp),
        elided: t.elided,
        attempts: t
            .attempts
            .into_iter()
            .map(|a| AttemptView {
                number: a.number,
                observed: a.observed,
                started: a.started.map(timestamp),
                ended: a.ended.map(timestamp),
                outcome: a.outcome.as_str(),
                error_class: a.error_class.map(|c| c.to_string()),
                error: a
                    .error
                    .map(|e| redact.prefix(&e, ERROR_TEXT_LEN).into_owned()),
            })
            .collect(),
    }
}

async fn event_report(state: &AppState, event_id: &str) -> EventReport {
    let redact = &state.config.redact;
    let trace_id = to_hex(&link::trace_id(event_id));
    let mut text = String::new();
    let mut found = false;
    let mut errors = Vec::new();
    let mut actions = Vec::new();
    for spec in state.config.sources.iter() {
        let Some(lookups) = spec.lookups() else {
            continue;
        };
        match tokio::time::timeout(LOOKUP_TIMEOUT, lookups.trace_event(event_id, redact)).await {
            Ok(Ok(Some(t))) => {
                found = true;
                text.push_str(&t);
                let ids = [event_id.to_string()];
                if let Some((_, h)) = histories(spec, &ids, redact, &mut errors).await.pop_first() {
                    actions.push((spec.name().to_string(), h));
                }
            }
            Ok(Ok(None)) => {}
            Ok(Err(e)) => errors.push((spec.name().to_string(), e)),
            Err(_) => errors.push((
                spec.name().to_string(),
                format!("no answer within {}s", LOOKUP_TIMEOUT.as_secs()),
            )),
        }
    }
    EventReport {
        event_id: event_id.to_string(),
        trace_url: trace_link(state, &trace_id),
        trace_id,
        trace: found.then_some(text),
        trajectories: state
            .journal
            .get(event_id)
            .into_iter()
            .map(|(s, t)| trajectory(&s, t, redact))
            .collect(),
        actions,
        errors,
    }
}

/// What `/events/{id}` and `/api/v1/events/{id}` answer, after a lookup
/// turn, with 404 when neither a table nor the journal knows the event.
async fn event_for(state: &AppState, id: &str) -> Result<(StatusCode, EventReport), Response> {
    let _slot = lookup_slot(state).await?;
    let r = event_report(state, id).await;
    let status = if r.trace.is_none() && r.trajectories.is_empty() {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::OK
    };
    Ok((status, r))
}

pub async fn event_page(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    let (status, r) = match event_for(&state, &id).await {
        Ok(found) => found,
        Err(r) => return r,
    };
    let mut body = format!(
        "<h1>Event <code data-field=\"event_id\">{}</code></h1>",
        escape(&r.event_id)
    );
    let trace = match &r.trace_url {
        Some(u) => format!("<a href=\"{}\">{}</a>", escape(u), escape(&r.trace_id)),
        None => escape(&r.trace_id),
    };
    let _ = write!(
        body,
        "<p>trace id <code data-field=\"trace_id\">{trace}</code> <span class=\"muted\">(derived from the event id)</span></p>"
    );
    for (source, e) in &r.errors {
        let _ = write!(
            body,
            "<p class=\"down\">source {}: {}</p>",
            escape(source),
            escape(e)
        );
    }
    match &r.trace {
        Some(t) => {
            let _ = write!(
                body,
                "<h2>What the tables say</h2><pre data-field=\"trace\">{}</pre>",
                escape(t)
            );
        }
        None => body.push_str("<p class=\"muted\">No watched table has a row of this event.</p>"),
    }
    for (source, h) in &r.actions {
        let _ = write!(
            body,
            "<h2>Replays and ignores in {}</h2>{}",
            escape(source),
            history_html(h)
        );
    }
    body.push_str("<h2>Retry trajectory</h2>");
    if r.trajectories.is_empty() {
        body.push_str(
            "<p class=\"muted\">The agent has not seen this event fail since it started \
             (it keeps the attempts of recent failed and dead-lettered events only).</p>",
        );
    }
    for t in &r.trajectories {
        let _ = write!(
            body,
            "<p>source {} · event type {} · received {}</p><table class=\"trajectory\">\
             <tr><th>attempt</th><th>started</th><th>ended</th><th>outcome</th><th>error class</th><th>error</th></tr>",
            escape(&t.source),
            t.event_type.as_deref().map_or("–".to_string(), escape),
            t.received.as_deref().map_or("–".to_string(), escape),
        );
        for (i, a) in t.attempts.iter().enumerate() {
            if t.elided > 0 && i == FIRST_KEPT {
                let _ = write!(
                    body,
                    "<tr><td colspan=\"6\" class=\"muted\">… {} attempts not kept …</td></tr>",
                    t.elided
                );
            }
            if !a.observed {
                let o = |v: &Option<String>| v.as_deref().map_or("–".to_string(), escape);
                let _ = write!(
                    body,
                    "<tr class=\"attempt\" data-observed=\"false\"><td>{}</td><td colspan=\"3\" class=\"muted\">\
                     not observed (it started and failed between two polls)</td>\
                     <td data-field=\"error_class\">{}</td><td><pre>{}</pre></td></tr>",
                    a.number,
                    o(&a.error_class),
                    o(&a.error),
                );
                continue;
            }
            let o = |v: &Option<String>| v.as_deref().map_or("–".to_string(), escape);
            let _ = write!(
                body,
                "<tr class=\"attempt\" data-observed=\"true\"><td>{}</td><td>{}</td><td>{}</td>\
                 <td data-field=\"outcome\">{}</td><td data-field=\"error_class\">{}</td><td><pre>{}</pre></td></tr>",
                a.number,
                o(&a.started),
                o(&a.ended),
                a.outcome,
                o(&a.error_class),
                o(&a.error),
            );
        }
        body.push_str("</table>");
    }
    let mut resp = page("event", None, &body);
    *resp.status_mut() = status;
    resp
}

pub async fn api_event(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    let (status, r) = match event_for(&state, &id).await {
        Ok(found) => found,
        Err(r) => return r,
    };
    let mut resp = json(&r);
    *resp.status_mut() = status;
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_read_as_people_say_them() {
        let s = |secs| span(Duration::from_secs(secs));
        assert_eq!(s(49), "49 s");
        assert_eq!(s(119), "119 s");
        assert_eq!(s(437), "7 min");
        assert_eq!(span(Duration::from_millis(500)), "500 ms");
        assert_eq!(s(900), "15 min");
        assert_eq!(s(5_400), "90 min");
        assert_eq!(s(7_200), "2 h");
        assert_eq!(s(86_400), "1 day");
        assert_eq!(s(3 * 86_400), "3 days");
        assert_eq!(s(86_401), "1440 min");
    }

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            escape("<script>alert(\"x\")</script> & 'y'"),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
    }

    #[test]
    fn shell_quotes_what_a_shell_would_interpret() {
        assert_eq!(shell("evt-1"), "evt-1");
        assert_eq!(shell("a b"), "'a b'");
        assert_eq!(shell("it's $(x)"), r"'it'\''s $(x)'");
    }

    #[test]
    fn sparkline_breaks_at_missing_values() {
        let svg = sparkline(&[1.0, 2.0, f64::NAN, 3.0, 4.0]);
        assert_eq!(svg.matches("<polyline").count(), 2);
        let dot = sparkline(&[1.0, f64::NAN, 3.0, 4.0]);
        assert_eq!(
            (
                dot.matches("<polyline").count(),
                dot.matches("<circle").count()
            ),
            (1, 1)
        );
        assert_eq!(sparkline(&[f64::NAN]), "<span class=\"muted\">–</span>");
    }

    #[test]
    fn numbers_print_integers_without_fraction() {
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.125), "0.125");
        assert_eq!(number(2.5), "2.5");
        assert_eq!(number(f64::NAN), "–");
    }
}
