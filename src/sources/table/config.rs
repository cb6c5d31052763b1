//! The settings of inbox and outbox sources: what an entry may say, and
//! what a table source runs on once every key has been checked.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;
use toml::de::DeValue;

use crate::checks::{Environment, Unknown, Validator, is_identifier, is_table_name};
use crate::dsn::Dsn;
use crate::sources::kind::Read;
use crate::tracing_link::config::{RawSourceTrace, SourceTrace, validate_source};

// ---------------------------------------------------------------------------
// What an entry may say.

/// The keys inbox and outbox entries share.
#[derive(Debug, Default, Deserialize)]
pub struct RawTable {
    /// Connection string; the scheme picks the dialect (`postgres://`, `mysql://`, `sqlite://`).
    /// `${VAR}` is replaced by the environment variable VAR, percent-encoded
    /// where it lands in the user, password or a query value.
    pub dsn: Option<String>,
    /// A file whose content is the DSN (a mounted secret); instead of `dsn`.
    pub dsn_file: Option<String>,
    /// The watched table, optionally schema-qualified (`schema.table`).
    pub table: Option<String>,
    /// How often the source is polled (default `5s`).
    pub poll_interval: Option<String>,
    /// How late a transaction may commit and still be counted (default `30s`).
    pub overlap: Option<String>,
    /// Statement timeout of one poll (default: the poll interval, at least 1s).
    pub timeout: Option<String>,
    /// Sliding window of the quantile gauges (default `5m`).
    pub quantile_window: Option<String>,
    /// How long the state of a finished event is remembered to count late duplicates (default `15m`).
    pub state_retention: Option<String>,
    /// How often the gauges kept from the tailed rows are checked against an
    /// aggregate over the unfinished rows, which catches deleted rows (default `1m`).
    pub reconcile_every: Option<String>,
    /// Distinct `event_type` label values kept; the rest fold into `other` (default 50).
    pub event_type_limit: Option<i64>,
    /// Upper bound on events whose state is remembered, and on the backlog
    /// kept for the gauges (default 400000: both maps then stay within 2^19
    /// buckets, 45 MiB, and one inbox source fits the DaemonSet's 128Mi;
    /// docs/performance.md, "Memory").
    pub max_tracked_events: Option<i64>,
    /// Rows fetched per query page (default 5000).
    pub batch_size: Option<i64>,
    /// Largest growth of `attempts` or `deliveries` in one change that is
    /// believed (default 1000); a larger one is rejected as `implausible_count`.
    pub max_count_jump: Option<i64>,
    /// `service.name` of the spans emitted for this consumer.
    pub service_name: Option<String>,
    /// Objectives exported as gauges for the alert rules.
    #[serde(default)]
    pub objectives: RawObjectives,
    /// How this consumer's spans describe it (with `[tracing]`).
    pub trace: Option<RawSourceTrace>,
}

/// The keys only inbox entries take.
#[derive(Debug, Default, Deserialize)]
pub struct RawInbox {
    /// Rows in processing for longer than this are stuck (default `10m`).
    pub stuck_after: Option<String>,
    /// Column names by meaning.
    #[serde(default)]
    pub columns: RawInboxColumns,
    /// Status words by meaning.
    pub statuses: Option<RawStatuses>,
}

/// The keys only outbox entries take.
#[derive(Debug, Default, Deserialize)]
pub struct RawOutbox {
    /// Column names by meaning.
    #[serde(default)]
    pub columns: RawOutboxColumns,
}

/// An inbox's `[sources.columns]`: meaning = column name. An empty string means "not present".
#[derive(Debug, Default, Deserialize)]
pub struct RawInboxColumns {
    pub event_id: Option<String>,
    pub event_type: Option<String>,
    pub status: Option<String>,
    pub received_at: Option<String>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub attempts: Option<String>,
    pub deliveries: Option<String>,
    pub last_error: Option<String>,
    pub traceparent: Option<String>,
    pub updated_at: Option<String>,
}

/// An outbox's `[sources.columns]`.
#[derive(Debug, Default, Deserialize)]
pub struct RawOutboxColumns {
    pub event_id: Option<String>,
    pub event_type: Option<String>,
    pub created_at: Option<String>,
    pub published_at: Option<String>,
    pub traceparent: Option<String>,
    pub updated_at: Option<String>,
}

/// `[sources.statuses]`: meaning = the words the table uses for it.
#[derive(Debug, Default, Deserialize)]
pub struct RawStatuses {
    pub pending: Option<Vec<String>>,
    pub processing: Option<Vec<String>>,
    pub succeeded: Option<Vec<String>>,
    pub failed: Option<Vec<String>>,
    pub dead: Option<Vec<String>>,
}

/// `[sources.objectives]`.
#[derive(Debug, Default, Deserialize)]
pub struct RawObjectives {
    /// Objective for the age of the oldest unprocessed message.
    pub oldest_age: Option<String>,
    /// Objective for the 95th percentile of processing time.
    pub p95: Option<String>,
}

// ---------------------------------------------------------------------------
// What a table source runs on.

/// Settings shared by inbox and outbox sources.
#[derive(Debug, Clone)]
pub struct TableSpec {
    pub name: String,
    pub dsn: Dsn,
    /// Table name, possibly `schema.table`; checked to be a plain identifier.
    pub table: String,
    pub poll_interval: Duration,
    pub overlap: Duration,
    pub timeout: Duration,
    pub quantile_window: Duration,
    pub state_retention: Duration,
    pub reconcile_every: Duration,
    pub event_type_limit: usize,
    pub max_tracked_events: usize,
    pub batch_size: usize,
    pub max_count_jump: u64,
    pub service_name: Option<String>,
    /// `[sources.trace]`: how the consumer's spans describe it.
    pub trace: SourceTrace,
    pub objectives: Objectives,
    /// `sources[i]`, for messages that point back at the file.
    pub key: String,
}

/// Per-source objectives, exported as `inboxwatch_objective_*` gauges.
#[derive(Debug, Clone, Default)]
pub struct Objectives {
    pub oldest_age: Option<Duration>,
    pub p95: Option<Duration>,
}

/// A validated inbox source.
#[derive(Debug, Clone)]
pub struct InboxSpec {
    pub table: TableSpec,
    pub stuck_after: Duration,
    pub columns: InboxColumns,
    pub statuses: StatusMap,
}

/// A validated outbox source.
#[derive(Debug, Clone)]
pub struct OutboxSpec {
    pub table: TableSpec,
    pub columns: OutboxColumns,
}

/// Column names of an inbox table; `None` for optional columns the table lacks.
#[derive(Debug, Clone)]
pub struct InboxColumns {
    pub event_id: String,
    pub event_type: Option<String>,
    pub status: String,
    pub received_at: String,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub attempts: Option<String>,
    pub deliveries: Option<String>,
    pub last_error: Option<String>,
    pub traceparent: Option<String>,
    pub updated_at: String,
}

impl InboxColumns {
    /// Every mapped column with the meaning it has, for schema checks.
    pub fn mapped(&self) -> Vec<(&'static str, &str)> {
        let mut out = vec![
            ("event_id", self.event_id.as_str()),
            ("status", self.status.as_str()),
            ("received_at", self.received_at.as_str()),
            ("updated_at", self.updated_at.as_str()),
        ];
        let optional = [
            ("event_type", &self.event_type),
            ("started_at", &self.started_at),
            ("finished_at", &self.finished_at),
            ("attempts", &self.attempts),
            ("deliveries", &self.deliveries),
            ("last_error", &self.last_error),
            ("traceparent", &self.traceparent),
        ];
        out.extend(
            optional
                .into_iter()
                .filter_map(|(m, c)| c.as_deref().map(|c| (m, c))),
        );
        out
    }
}

/// Column names of an outbox table.
#[derive(Debug, Clone)]
pub struct OutboxColumns {
    pub event_id: String,
    pub event_type: Option<String>,
    pub created_at: String,
    pub published_at: String,
    pub traceparent: Option<String>,
    pub updated_at: String,
}

impl OutboxColumns {
    /// Every mapped column with the meaning it has, for schema checks.
    pub fn mapped(&self) -> Vec<(&'static str, &str)> {
        let mut out = vec![
            ("event_id", self.event_id.as_str()),
            ("created_at", self.created_at.as_str()),
            ("published_at", self.published_at.as_str()),
            ("updated_at", self.updated_at.as_str()),
        ];
        if let Some(c) = &self.event_type {
            out.push(("event_type", c));
        }
        if let Some(c) = &self.traceparent {
            out.push(("traceparent", c));
        }
        out
    }
}

/// What a status word means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    Pending,
    Processing,
    Succeeded,
    Failed,
    Dead,
}

impl Status {
    /// The meanings in the order of the config keys.
    pub const ALL: [Status; 5] = [
        Status::Pending,
        Status::Processing,
        Status::Succeeded,
        Status::Failed,
        Status::Dead,
    ];

    /// The config key / label value of this meaning.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Processing => "processing",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::Dead => "dead",
        }
    }

    /// Succeeded or dead-lettered: the event is done.
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Succeeded | Status::Dead)
    }
}

/// The status words of one table, in the order of their meanings (pending,
/// processing, succeeded, failed, dead) and, within one, as configured — so
/// generated SQL lists them in the same order as the recommended indexes.
#[derive(Debug, Clone)]
pub struct StatusMap {
    words: Vec<(String, Status)>,
}

impl StatusMap {
    /// What a word means, if the table's map knows it.
    pub fn classify(&self, word: &str) -> Option<Status> {
        self.words.iter().find(|(w, _)| w == word).map(|(_, s)| *s)
    }

    /// The words that mean `status`.
    pub fn words_for(&self, status: Status) -> Vec<&str> {
        self.words
            .iter()
            .filter(|(_, s)| *s == status)
            .map(|(w, _)| w.as_str())
            .collect()
    }

    /// The words of every unfinished meaning: pending, then processing, then failed.
    pub fn unfinished_words(&self) -> Vec<&str> {
        [Status::Pending, Status::Processing, Status::Failed]
            .into_iter()
            .flat_map(|s| self.words_for(s))
            .collect()
    }
}

impl Default for StatusMap {
    fn default() -> Self {
        StatusMap {
            words: Status::ALL
                .iter()
                .map(|s| (s.as_str().to_string(), *s))
                .collect(),
        }
    }
}

// ---------------------------------------------------------------------------
// Reading and checking an entry.

/// Reads an inbox or outbox entry: the shared keys and the kind's own, each
/// from the same table; a key is unknown when neither part takes it.
pub(crate) fn read<T: serde::de::DeserializeOwned>(
    v: &mut Validator<'_>,
    key: &str,
    entry: Spanned<DeValue<'_>>,
) -> Read<(RawTable, T)> {
    let (common, unknown_common) = v.read::<RawTable>(key, entry.clone());
    let (own, unknown_own) = v.read::<T>(key, entry);
    let unknown = unknown_to_both(&unknown_common, &unknown_own);
    (common.zip(own), unknown)
}

/// The keys neither part takes: a path is unknown to a part when the part
/// ignored it or a table holding it; the most precise path is kept.
fn unknown_to_both(a: &[Unknown], b: &[Unknown]) -> Vec<Unknown> {
    let ignored_by =
        |side: &[Unknown], path: &[String]| side.iter().any(|u| path.starts_with(&u.path));
    let mut out: Vec<Unknown> = Vec::new();
    for (mine, other) in [(a, b), (b, a)] {
        for u in mine {
            if ignored_by(other, &u.path) && !out.iter().any(|o| o.path == u.path) {
                out.push(u.clone());
            }
        }
    }
    // A table reported whole by one part and key by key by the other: keep the keys.
    let keys: Vec<Vec<String>> = out.iter().map(|u| u.path.clone()).collect();
    out.retain(|u| {
        !keys
            .iter()
            .any(|k| k.len() > u.path.len() && k.starts_with(&u.path))
    });
    out.sort_by_key(|u| u.line);
    out
}

/// Checks the keys inbox and outbox entries share.
pub(crate) fn table_spec(
    raw: RawTable,
    key: &str,
    name: String,
    v: &mut Validator<'_>,
) -> TableSpec {
    let dsn = dsn(v, key, &raw);
    let table = match raw.table.as_deref() {
        Some(t) if is_table_name(t) => t.to_string(),
        Some(t) => {
            v.problem(
                &format!("{key}.table"),
                format!("\"{t}\" is not a table name (letters, digits, _ and $, optionally schema.table)"),
            );
            String::new()
        }
        None => {
            v.problem(&format!("{key}.table"), "required".into());
            String::new()
        }
    };
    let poll_interval = v.duration(
        &format!("{key}.poll_interval"),
        raw.poll_interval.as_deref(),
        Duration::from_secs(5),
    );
    if poll_interval.is_zero() {
        v.problem(
            &format!("{key}.poll_interval"),
            "must be greater than zero".into(),
        );
    }
    let overlap = v.duration(
        &format!("{key}.overlap"),
        raw.overlap.as_deref(),
        Duration::from_secs(30),
    );
    let timeout = v.duration(
        &format!("{key}.timeout"),
        raw.timeout.as_deref(),
        poll_interval.max(Duration::from_secs(1)),
    );
    if timeout.is_zero() {
        v.problem(
            &format!("{key}.timeout"),
            "must be greater than zero".into(),
        );
    }
    let quantile_window = v.duration(
        &format!("{key}.quantile_window"),
        raw.quantile_window.as_deref(),
        Duration::from_secs(300),
    );
    if quantile_window < Duration::from_secs(1) {
        v.problem(
            &format!("{key}.quantile_window"),
            "must be at least 1s".into(),
        );
    }
    let state_retention = v.duration(
        &format!("{key}.state_retention"),
        raw.state_retention.as_deref(),
        Duration::from_secs(900),
    );
    if state_retention < overlap {
        v.problem(
            &format!("{key}.state_retention"),
            "must be at least the overlap window".into(),
        );
    }
    let reconcile_every = v.duration(
        &format!("{key}.reconcile_every"),
        raw.reconcile_every.as_deref(),
        Duration::from_secs(60),
    );
    if reconcile_every.is_zero() {
        v.problem(
            &format!("{key}.reconcile_every"),
            "must be greater than zero".into(),
        );
    }
    let event_type_limit = v.positive(
        &format!("{key}.event_type_limit"),
        raw.event_type_limit,
        50,
        10_000,
    );
    let max_tracked_events = v.positive(
        &format!("{key}.max_tracked_events"),
        raw.max_tracked_events,
        400_000,
        100_000_000,
    );
    let batch_size = v.positive(
        &format!("{key}.batch_size"),
        raw.batch_size,
        5_000,
        1_000_000,
    );
    let max_count_jump = v.positive(
        &format!("{key}.max_count_jump"),
        raw.max_count_jump,
        1_000,
        1_000_000_000,
    ) as u64;
    let objectives = Objectives {
        oldest_age: raw.objectives.oldest_age.as_deref().map(|t| {
            v.duration(
                &format!("{key}.objectives.oldest_age"),
                Some(t),
                Duration::ZERO,
            )
        }),
        p95: raw
            .objectives
            .p95
            .as_deref()
            .map(|t| v.duration(&format!("{key}.objectives.p95"), Some(t), Duration::ZERO)),
    };
    let trace = validate_source(key, raw.trace.as_ref(), v);
    TableSpec {
        name,
        dsn: dsn.unwrap_or_else(Dsn::refused),
        table,
        poll_interval,
        overlap,
        timeout,
        quantile_window,
        state_retention,
        reconcile_every,
        event_type_limit,
        max_tracked_events,
        batch_size,
        max_count_jump,
        service_name: raw.service_name,
        trace,
        objectives,
        key: key.to_string(),
    }
}

/// Checks an inbox's own keys.
pub(crate) fn inbox_spec(
    table: TableSpec,
    raw: RawInbox,
    key: &str,
    v: &mut Validator<'_>,
) -> Option<InboxSpec> {
    let stuck_after = v.duration(
        &format!("{key}.stuck_after"),
        raw.stuck_after.as_deref(),
        Duration::from_secs(600),
    );
    let columns = inbox_columns(v, key, &raw.columns);
    let statuses = statuses(v, key, raw.statuses.as_ref());
    columns.map(|columns| InboxSpec {
        table,
        stuck_after,
        columns,
        statuses,
    })
}

/// Checks an outbox's own keys.
pub(crate) fn outbox_spec(
    table: TableSpec,
    raw: RawOutbox,
    key: &str,
    v: &mut Validator<'_>,
) -> Option<OutboxSpec> {
    outbox_columns(v, key, &raw.columns).map(|columns| OutboxSpec { table, columns })
}

fn dsn(v: &mut Validator<'_>, key: &str, raw: &RawTable) -> Option<Dsn> {
    let (dsn_key, text) = match (&raw.dsn, &raw.dsn_file) {
        (Some(_), Some(_)) => {
            v.problem(
                &format!("{key}.dsn_file"),
                "give either dsn or dsn_file, not both".into(),
            );
            return None;
        }
        (Some(d), None) => (format!("{key}.dsn"), d.clone()),
        (None, Some(path)) => {
            let dsn_key = format!("{key}.dsn_file");
            match std::fs::read_to_string(path) {
                Ok(t) => (dsn_key, t.trim().to_string()),
                Err(e) => {
                    v.problem(&dsn_key, format!("cannot read \"{path}\": {e}"));
                    return None;
                }
            }
        }
        (None, None) => {
            v.problem(&format!("{key}.dsn"), "required (or dsn_file)".into());
            return None;
        }
    };
    if v.environment() == Environment::Placeholders && text.trim_start().starts_with("${") {
        // The scheme, and so everything, comes from a variable: nothing to check without it.
        return Some(Dsn::refused());
    }
    match Dsn::expand(&text, v.env()) {
        Ok(d) => Some(d),
        Err(e) => {
            v.problem(&dsn_key, e.to_string());
            None
        }
    }
}

/// A mapped column: its default name when absent, `None` when set to "" (not present).
fn column(
    v: &mut Validator<'_>,
    key: &str,
    meaning: &str,
    value: &Option<String>,
    required: bool,
) -> Option<String> {
    let full = format!("{key}.columns.{meaning}");
    match value.as_deref() {
        None => Some(meaning.to_string()),
        Some("") if required => {
            v.problem(
                &full,
                "required: this column cannot be left unmapped".into(),
            );
            None
        }
        Some("") => None,
        Some(c) if is_identifier(c) => Some(c.to_string()),
        Some(c) => {
            v.problem(
                &full,
                format!("\"{c}\" is not a column name (letters, digits, _ and $)"),
            );
            None
        }
    }
}

fn inbox_columns(v: &mut Validator<'_>, key: &str, c: &RawInboxColumns) -> Option<InboxColumns> {
    let before = v.count();
    let cols = InboxColumns {
        event_id: column(v, key, "event_id", &c.event_id, true).unwrap_or_default(),
        event_type: column(v, key, "event_type", &c.event_type, false),
        status: column(v, key, "status", &c.status, true).unwrap_or_default(),
        received_at: column(v, key, "received_at", &c.received_at, true).unwrap_or_default(),
        started_at: column(v, key, "started_at", &c.started_at, false),
        finished_at: column(v, key, "finished_at", &c.finished_at, false),
        attempts: column(v, key, "attempts", &c.attempts, false),
        deliveries: column(v, key, "deliveries", &c.deliveries, false),
        last_error: column(v, key, "last_error", &c.last_error, false),
        traceparent: column(v, key, "traceparent", &c.traceparent, false),
        updated_at: column(v, key, "updated_at", &c.updated_at, true).unwrap_or_default(),
    };
    let written = [
        ("event_id", &c.event_id),
        ("event_type", &c.event_type),
        ("status", &c.status),
        ("received_at", &c.received_at),
        ("started_at", &c.started_at),
        ("finished_at", &c.finished_at),
        ("attempts", &c.attempts),
        ("deliveries", &c.deliveries),
        ("last_error", &c.last_error),
        ("traceparent", &c.traceparent),
        ("updated_at", &c.updated_at),
    ];
    distinct_columns(v, key, &cols.mapped(), &written);
    (v.count() == before).then_some(cols)
}

fn outbox_columns(v: &mut Validator<'_>, key: &str, c: &RawOutboxColumns) -> Option<OutboxColumns> {
    let before = v.count();
    let cols = OutboxColumns {
        event_id: column(v, key, "event_id", &c.event_id, true).unwrap_or_default(),
        event_type: column(v, key, "event_type", &c.event_type, false),
        created_at: column(v, key, "created_at", &c.created_at, true).unwrap_or_default(),
        published_at: column(v, key, "published_at", &c.published_at, true).unwrap_or_default(),
        traceparent: column(v, key, "traceparent", &c.traceparent, false),
        updated_at: column(v, key, "updated_at", &c.updated_at, true).unwrap_or_default(),
    };
    let written = [
        ("event_id", &c.event_id),
        ("event_type", &c.event_type),
        ("created_at", &c.created_at),
        ("published_at", &c.published_at),
        ("traceparent", &c.traceparent),
        ("updated_at", &c.updated_at),
    ];
    distinct_columns(v, key, &cols.mapped(), &written);
    (v.count() == before).then_some(cols)
}

/// One meaning per column: a column mapped twice (`status` and `event_id`
/// to `id`) is named at the key the file sets, the later one when both are set.
fn distinct_columns(
    v: &mut Validator<'_>,
    key: &str,
    mapped: &[(&'static str, &str)],
    raw: &[(&str, &Option<String>)],
) {
    let written = |meaning: &str| {
        raw.iter()
            .any(|(m, c)| *m == meaning && c.as_deref().is_some_and(|c| !c.is_empty()))
    };
    for (i, (meaning, column)) in mapped.iter().enumerate() {
        if let Some((earlier, _)) = mapped[..i].iter().find(|(_, c)| c == column) {
            let named = if written(meaning) || !written(earlier) {
                meaning
            } else {
                earlier
            };
            let other = if named == meaning { earlier } else { meaning };
            v.problem(
                &format!("{key}.columns.{named}"),
                format!(
                    "column \"{column}\" is also mapped to {other}; a column can have one meaning only"
                ),
            );
        }
    }
}

fn statuses(v: &mut Validator<'_>, key: &str, raw: Option<&RawStatuses>) -> StatusMap {
    let Some(raw) = raw else {
        return StatusMap::default();
    };
    let lists = [
        (Status::Pending, &raw.pending),
        (Status::Processing, &raw.processing),
        (Status::Succeeded, &raw.succeeded),
        (Status::Failed, &raw.failed),
        (Status::Dead, &raw.dead),
    ];
    let mut words: Vec<(String, Status)> = Vec::new();
    for (status, list) in lists {
        let full = format!("{key}.statuses.{}", status.as_str());
        let list = match list {
            Some(l) => l.clone(),
            None => vec![status.as_str().to_string()],
        };
        if list.is_empty() && matches!(status, Status::Pending | Status::Succeeded) {
            v.problem(&full, "needs at least one status word".into());
        }
        for word in list {
            if word.is_empty() {
                v.problem(&full, "status words must not be empty".into());
                continue;
            }
            if let Some((_, prev)) = words.iter().find(|(w, _)| *w == word) {
                v.problem(
                    &full,
                    format!(
                        "\"{word}\" is already mapped to {}; a word can have one meaning only",
                        prev.as_str()
                    ),
                );
            } else {
                words.push((word, status));
            }
        }
    }
    StatusMap { words }
}
