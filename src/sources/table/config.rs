//! The settings of inbox and outbox sources: what an entry may say, and
//! what a table source runs on once every key has been checked. The
//! settings every source has (name, owner, service, poll interval, timeout,
//! objectives) are read and checked by [`crate::sources::common`]; a table
//! source embeds them.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::error_classes::{self, ErrorClasses, RawErrorClass};
use super::events::{EventsSpec, RawEvents, events_spec};
use super::sql::Sql;
// The meanings of a row's status, read from here by the rest of the folder.
pub use super::meaning::{Status, StatusMap};
use super::rules::{self, Rule, Statuses};
use crate::dsn::Dsn;
use crate::sources::common::{self, Common, Defaults, RawCommon};
use crate::tracing_link::config::{RawSourceTrace, SourceTrace, validate_source};
use crate::validation::{Environment, Validator, is_identifier, is_table_name};

// ---------------------------------------------------------------------------
// What an entry may say.

/// The keys inbox and outbox entries share, besides those every source has
/// ([`RawCommon`]; for a table, `timeout` is the statement timeout of one
/// poll, and `service_name` the `service.name` of the consumer's spans).
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
    /// How late a transaction may commit and still be counted (default `30s`).
    pub overlap: Option<String>,
    /// Time limit of a poll that reads every unfinished row: the first, and a
    /// full reconcile (default `5m`, at least `timeout`).
    pub full_read_timeout: Option<String>,
    /// Sliding window of the quantile gauges (default `5m`).
    pub quantile_window: Option<String>,
    /// How long the state of a finished event is remembered to count late duplicates (default `15m`).
    pub state_retention: Option<String>,
    /// How often the gauges kept from the tailed rows are checked: the count
    /// of unfinished rows each time, the aggregate over them (which catches
    /// deleted rows) when it differs and every tenth time (default `1m`).
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
    /// How changes are found: `"updated_at"` tails the column bumped on
    /// every change; `"none"` follows watermarks on the arrival, start and
    /// finish times and looks up the rows in flight (re-reading every
    /// unfinished row on each poll only where status rules, deleted rows or
    /// a missing start or finish time leave no other way); `"events"`
    /// (inbox) tails an append-only log of status changes by its id
    /// (`[sources.events]`) and re-reads the unfinished rows for the gauges. Default:
    /// `"updated_at"` when `columns.updated_at` is mapped, else `"none"`.
    pub cursor: Option<String>,
    /// `"kept"` (default): finished rows stay in the table; `"deleted"`: the
    /// consumer deletes a row once it is done, and a tracked unfinished row
    /// that disappears is counted as finished.
    pub finished_rows: Option<String>,
    /// With `finished_rows = "deleted"`: observe the durations of deleted
    /// rows, which run to the poll that noticed the deletion (upper bounds;
    /// default false: only the counters move).
    pub deleted_durations: Option<bool>,
    /// Largest growth of `attempts` or `deliveries` in one change that is
    /// believed (default 1000); a larger one is rejected as `implausible_count`.
    pub max_count_jump: Option<i64>,
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
    /// Status worked out from columns: ordered, first match wins, before
    /// the status words.
    pub status_rules: Option<Vec<RawRule>>,
    /// With `finished_rows = "deleted"`: the outcome a deleted row counts
    /// as, `"succeeded"` (default) or `"dead"`.
    pub deleted_as: Option<String>,
    /// What `columns.attempts` counts: `"started"` attempts (default: the
    /// current one included) or `"failed"` ones (a consumer that bumps it
    /// only when an attempt fails, as .NET CAP's `Retries`).
    pub attempts_count: Option<String>,
    /// Added to `attempts` on rows whose `started_at` is set: 1 for a column
    /// that counts retries, not attempts (default 0).
    pub attempts_offset: Option<i64>,
    /// Error classes by pattern on `last_error`: ordered, first match wins,
    /// tried before the built-in ones.
    pub error_classes: Option<Vec<RawErrorClass>>,
    /// `false` drops the built-in error classes, so that `error_classes` replaces them (default true).
    pub default_error_classes: Option<bool>,
    /// With `columns.ordering_key` and `columns.version`: the keys whose
    /// versions are remembered (default 100000); the least recently seen is
    /// forgotten first, counted in `inboxwatch_ordering_keys_evicted_total`.
    pub ordering_keys_limit: Option<i64>,
    /// What `inboxwatch dead-letters replay` and `ignore` write with.
    pub dead_letter_actions: Option<RawActions>,
    /// With `cursor = "events"`: the append-only log of status changes the
    /// counters come from.
    pub events: Option<RawEvents>,
}

/// `[sources.dead_letter_actions]`: the write-capable connection of the
/// dead-letter commands (never opened by `run`) and what they write.
#[derive(Debug, Default, Deserialize)]
pub struct RawActions {
    /// Write-capable connection string, in the source's dialect.
    pub dsn: Option<String>,
    /// A file whose content is that DSN; instead of `dsn`.
    pub dsn_file: Option<String>,
    /// The status word a replayed row gets (default: the first `pending` word).
    pub replay_status: Option<String>,
    /// Whether a replay also sets `attempts` to 0 (default false).
    pub reset_attempts: Option<bool>,
    /// The status word an ignored row gets (default: its status is kept).
    pub ignored_status: Option<String>,
    /// Where each action is recorded (default `inboxwatch_dead_letter_actions`).
    pub audit_table: Option<String>,
}

/// One `[[sources.status_rules]]` entry.
#[derive(Debug, Default, Deserialize)]
pub struct RawRule {
    /// pending, processing, succeeded, failed, dead or parked.
    pub meaning: Option<String>,
    /// The condition, in the grammar of [`super::rules`].
    pub when: Option<String>,
}

/// The keys only outbox entries take.
#[derive(Debug, Default, Deserialize)]
pub struct RawOutbox {
    /// Column names by meaning.
    #[serde(default)]
    pub columns: RawOutboxColumns,
}

/// An inbox's `[sources.columns]`: meaning = column name. An optional
/// meaning that is not written (or written as "") is not used.
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
    /// A business id (an order id, say): shown on the dead-letter page, never a label.
    pub business_key: Option<String>,
    /// A short description of the event (a body digest, say): shown, never a label.
    pub summary: Option<String>,
    /// What must be processed in order (an order, an account id): never a label.
    pub ordering_key: Option<String>,
    /// The event's version within its ordering key, an integer.
    pub version: Option<String>,
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
    /// Moved aside after failing, with the later versions of its key, to be
    /// replayed once fixed: neither finished nor backlog. No default word.
    pub parked: Option<Vec<String>>,
}

// ---------------------------------------------------------------------------
// What a table source runs on.

/// Settings shared by inbox and outbox sources. It embeds the settings
/// every source has: `spec.name`, `spec.poll_interval`, `spec.timeout` (the
/// statement timeout of one poll) and the others are [`Common`]'s.
#[derive(Debug, Clone)]
pub struct TableSpec {
    /// Name, owner, service, poll interval, timeout, objectives.
    pub common: Common,
    pub dsn: Dsn,
    /// Table name, possibly `schema.table`; checked to be a plain identifier.
    pub table: String,
    pub overlap: Duration,
    /// At least `timeout`.
    pub full_read_timeout: Duration,
    pub quantile_window: Duration,
    pub state_retention: Duration,
    pub reconcile_every: Duration,
    pub event_type_limit: usize,
    pub max_tracked_events: usize,
    pub batch_size: usize,
    pub max_count_jump: u64,
    /// How changes are found (resolved from `cursor` and the column map).
    pub cursor: Cursor,
    /// `[sources.events]`, with `cursor = "events"`.
    pub events: Option<Arc<EventsSpec>>,
    pub finished_rows: FinishedRows,
    pub deleted_durations: bool,
    /// `[sources.trace]`: how the consumer's spans describe it.
    pub trace: SourceTrace,
}

impl Deref for TableSpec {
    type Target = Common;

    /// The embedded settings every source has, read as the spec's own.
    fn deref(&self) -> &Common {
        &self.common
    }
}

/// How a table source finds what changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cursor {
    /// Tails the column bumped on every change.
    UpdatedAt,
    /// Watermarks on the arrival and finish times, and the unfinished rows
    /// re-read on every poll.
    None,
    /// An append-only log of status changes tailed by its id
    /// ([`super::events`]); the unfinished rows re-read for the gauges.
    Events,
}

impl Cursor {
    pub fn as_str(self) -> &'static str {
        match self {
            Cursor::UpdatedAt => "updated_at",
            Cursor::None => "none",
            Cursor::Events => "events",
        }
    }
}

/// What the consumer does with a finished row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishedRows {
    Kept,
    Deleted,
}

impl TableSpec {
    /// Whether every poll re-reads the unfinished rows (and looks up those
    /// that left them): without a change cursor, or when finished rows are
    /// deleted, that is the only way to see their changes.
    pub fn rereads_unfinished(&self) -> bool {
        self.cursor != Cursor::UpdatedAt || self.finished_rows == FinishedRows::Deleted
    }
}

/// A validated inbox source.
#[derive(Debug, Clone)]
pub struct InboxSpec {
    pub table: TableSpec,
    pub stuck_after: Duration,
    pub columns: InboxColumns,
    pub statuses: StatusMap,
    /// `[[sources.status_rules]]`, tried before the status words.
    pub rules: Vec<Rule>,
    /// The outcome of a deleted row (`finished_rows = "deleted"`).
    pub deleted_as: Status,
    /// What `columns.attempts` counts.
    pub attempts_count: AttemptsCount,
    /// Added to `attempts` on rows that have a `started_at` (0: the column
    /// counts attempts; 1: it counts retries, as pg-boss's `retry_count`).
    pub attempts_offset: i64,
    /// What kind of failure a `last_error` shows (`error_class` label);
    /// shared, as every clone of the spec classifies alike.
    pub error_classes: Arc<ErrorClasses>,
    /// `[sources.dead_letter_actions]`, for the `dead-letters replay` and
    /// `ignore` commands only. Boxed: most sources have none.
    pub actions: Option<Box<DeadLetterActions>>,
    /// Ordering keys whose versions are remembered (`ordering_keys_limit`).
    pub ordering_keys_limit: usize,
}

/// What an `attempts` column counts (`attempts_count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptsCount {
    /// Attempts started, the current one included (the counting rules' own sense).
    Started,
    /// Failed attempts only: bumped when an attempt fails, never when one starts.
    Failed,
}

impl AttemptsCount {
    /// The attempts started that a row in `status` showing `value` has had: a
    /// count of failed attempts misses the attempt under way (`processing`) or
    /// the one that succeeded; a row waiting for its next attempt, or given up
    /// after its last failure, has started as many as failed.
    pub fn started(self, value: i64, status: Option<Status>) -> i64 {
        match (self, status) {
            (AttemptsCount::Failed, Some(Status::Processing | Status::Succeeded)) => {
                value.saturating_add(1)
            }
            _ => value,
        }
    }
}

/// The largest `attempts_offset`: 1 is the case in the wild (a retry count);
/// a larger one is more likely a mistake than a table.
const MAX_ATTEMPTS_OFFSET: i64 = 10;

/// The default `ordering_keys_limit`.
pub const DEFAULT_ORDERING_KEYS: usize = 100_000;
/// The largest `ordering_keys_limit`: about 2 GB of key state at ~200 bytes a key.
const MAX_ORDERING_KEYS: usize = 10_000_000;

/// The runs table of an audit table: one row per bulk run, beside it (in
/// its schema, when it names one).
pub fn runs_table(audit_table: &str) -> String {
    format!("{audit_table}_runs")
}

/// A validated `[sources.dead_letter_actions]`.
#[derive(Debug, Clone)]
pub struct DeadLetterActions {
    /// The write-capable DSN. Private to the table unit: only
    /// `actions::connect` (reached from the command line's `dead-letters
    /// replay` / `ignore`) opens it; the agent's poll never does.
    pub(in crate::sources::table) dsn: Dsn,
    /// The status word a replayed row gets.
    pub replay_status: String,
    /// Whether a replay sets `attempts` to 0.
    pub reset_attempts: bool,
    /// The status word an ignored row gets, if any.
    pub ignored_status: Option<String>,
    /// The audit table, possibly `schema.table`.
    pub audit_table: String,
}

impl InboxSpec {
    /// The status column when its words alone give the status (no rules):
    /// queries then test the column itself, as the recommended indexes do.
    pub fn words_only(&self) -> Option<&str> {
        self.columns
            .status
            .as_deref()
            .filter(|_| self.rules.is_empty())
    }

    /// The expression every query reads a row's status from: the status
    /// column's text when words alone give it, else the meaning the rules
    /// (and words) work out in SQL.
    pub fn status_select(&self, sql: &Sql) -> String {
        match self.words_only() {
            Some(column) => sql.text(&sql.ident(column)),
            None => self.status_sql().meaning_sql(sql),
        }
    }

    /// The expression a row's arrival time is read from: `received_at`, or
    /// with an events log and no such column, the first arrival in the log.
    pub fn received_sql(&self, sql: &Sql) -> String {
        match &self.table.events {
            Some(e) if self.columns.received_at.is_empty() => e.first_sql(sql, &self.table.table),
            _ => sql.ident(&self.columns.received_at),
        }
    }

    /// The expression a row's start is read from: `started_at`, or with an
    /// events log and no such column, the last start in the log.
    pub fn started_sql(&self, sql: &Sql) -> Option<String> {
        match (&self.columns.started_at, &self.table.events) {
            (Some(c), _) => Some(sql.ident(c)),
            (None, Some(e)) => Some(e.last_start_sql(sql, &self.table.table)),
            (None, None) => None,
        }
    }

    /// The expression every query reads a row's attempts from (`NULL`
    /// without an attempts column): the column, plus `attempts_offset` once
    /// the row has started, so that a column counting retries reads as the
    /// attempts made so far (0 before the first one starts).
    pub fn attempts_select(&self, sql: &Sql) -> String {
        let c = &self.columns;
        let Some(attempts) = c.attempts.as_deref() else {
            return "NULL".to_string();
        };
        let attempts = sql.ident(attempts);
        match c.started_at.as_deref() {
            Some(started) if self.attempts_offset != 0 => sql.int(&format!(
                "CASE WHEN {} IS NULL THEN {attempts} ELSE {attempts} + {} END",
                sql.ident(started),
                self.attempts_offset
            )),
            _ => sql.int(&attempts),
        }
    }

    /// Whether the source follows versions per key: both `ordering_key`
    /// and `version` mapped.
    pub fn ordered(&self) -> bool {
        self.columns.ordering_key.is_some() && self.columns.version.is_some()
    }

    /// Whether a row can be parked: a status word or a rule means `parked`.
    pub fn parks(&self) -> bool {
        let words =
            self.columns.status.is_some() && !self.statuses.words_for(Status::Parked).is_empty();
        words || self.rules.iter().any(|r| r.meaning == Status::Parked)
    }

    /// What a value read through [`InboxSpec::status_select`] means.
    pub fn meaning_of(&self, text: &str) -> Option<Status> {
        if self.words_only().is_some() {
            self.statuses.classify(text)
        } else {
            Status::from_name(text)
        }
    }

    /// The rules and the status column's words, for the SQL that works out
    /// a row's meaning.
    pub fn status_sql(&self) -> Statuses<'_> {
        Statuses {
            rules: &self.rules,
            words: self.columns.status.as_deref().map(|c| (c, &self.statuses)),
        }
    }
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
    /// `None` when the status comes from `status_rules` only.
    pub status: Option<String>,
    /// Empty with `cursor = "events"` when the arrival time comes from the
    /// log (see [`InboxSpec::received_sql`]).
    pub received_at: String,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub attempts: Option<String>,
    pub deliveries: Option<String>,
    pub last_error: Option<String>,
    pub traceparent: Option<String>,
    pub updated_at: Option<String>,
    pub business_key: Option<String>,
    pub summary: Option<String>,
    pub ordering_key: Option<String>,
    pub version: Option<String>,
}

impl InboxColumns {
    /// Every mapped column with the meaning it has, for schema checks.
    pub fn mapped(&self) -> Vec<(&'static str, &str)> {
        let mut out = vec![("event_id", self.event_id.as_str())];
        if !self.received_at.is_empty() {
            out.push(("received_at", self.received_at.as_str()));
        }
        let optional = [
            ("status", &self.status),
            ("updated_at", &self.updated_at),
            ("event_type", &self.event_type),
            ("started_at", &self.started_at),
            ("finished_at", &self.finished_at),
            ("attempts", &self.attempts),
            ("deliveries", &self.deliveries),
            ("last_error", &self.last_error),
            ("traceparent", &self.traceparent),
            ("business_key", &self.business_key),
            ("summary", &self.summary),
            ("ordering_key", &self.ordering_key),
            ("version", &self.version),
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
    pub updated_at: Option<String>,
}

impl OutboxColumns {
    /// Every mapped column with the meaning it has, for schema checks.
    pub fn mapped(&self) -> Vec<(&'static str, &str)> {
        let mut out = vec![
            ("event_id", self.event_id.as_str()),
            ("created_at", self.created_at.as_str()),
            ("published_at", self.published_at.as_str()),
        ];
        if let Some(c) = &self.updated_at {
            out.push(("updated_at", c));
        }
        if let Some(c) = &self.event_type {
            out.push(("event_type", c));
        }
        if let Some(c) = &self.traceparent {
            out.push(("traceparent", c));
        }
        out
    }
}

// ---------------------------------------------------------------------------
// Reading and checking an entry.

/// The settings every source has, as a table source reads them: polled every
/// 5 s, and a statement timeout of the poll interval, at least 1 s.
fn common_defaults(kind: &'static str) -> Defaults {
    Defaults {
        kind,
        poll_interval: Duration::from_secs(5),
        timeout_floor: Duration::from_secs(1),
        objectives: &["oldest_age", "p95"],
    }
}

/// Checks the keys inbox and outbox entries share, the settings every
/// source has among them. The cursor is settled by the kind, which knows
/// whether an `updated_at` column is mapped: the returned spec holds
/// `Cursor::None` until then, with the written mode.
pub(crate) fn table_spec(
    (common, raw): (RawCommon, RawTable),
    kind: &'static str,
    key: &str,
    name: String,
    v: &mut Validator<'_>,
) -> (TableSpec, Option<Cursor>) {
    let dsn = dsn(v, key, &raw);
    let table = table_name(v, key, raw.table.as_deref());
    let common = common::check(common, key, name, &common_defaults(kind), v);
    let windows = windows(v, key, &raw, common.timeout);
    let limits = limits(v, key, &raw);
    let trace = validate_source(key, raw.trace.as_ref(), v);
    let cursor = written_cursor(v, key, raw.cursor.as_deref());
    let finished_rows = finished_rows(v, key, &raw);
    let spec = TableSpec {
        common,
        dsn: dsn.unwrap_or_else(Dsn::refused),
        table,
        overlap: windows.overlap,
        full_read_timeout: windows.full_read_timeout,
        quantile_window: windows.quantile_window,
        state_retention: windows.state_retention,
        reconcile_every: windows.reconcile_every,
        event_type_limit: limits.event_type_limit,
        max_tracked_events: limits.max_tracked_events,
        batch_size: limits.batch_size,
        max_count_jump: limits.max_count_jump,
        cursor: Cursor::None,
        events: None,
        finished_rows,
        deleted_durations: raw.deleted_durations.unwrap_or(false),
        trace,
    };
    (spec, cursor)
}

/// `table`: required, a table name, optionally `schema.table`.
fn table_name(v: &mut Validator<'_>, key: &str, written: Option<&str>) -> String {
    match written {
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
    }
}

/// The time windows of a table source, checked against each other.
struct Windows {
    overlap: Duration,
    /// At least `timeout`.
    full_read_timeout: Duration,
    quantile_window: Duration,
    state_retention: Duration,
    reconcile_every: Duration,
}

/// `overlap`, `full_read_timeout` (at least `timeout`), `quantile_window`,
/// `state_retention` (at least `overlap`) and `reconcile_every`.
fn windows(v: &mut Validator<'_>, key: &str, raw: &RawTable, timeout: Duration) -> Windows {
    let duration = |v: &mut Validator<'_>, name: &str, written: &Option<String>, default: u64| {
        v.duration(
            &format!("{key}.{name}"),
            written.as_deref(),
            Duration::from_secs(default),
        )
    };
    let overlap = duration(v, "overlap", &raw.overlap, 30);
    let full_read_timeout = duration(v, "full_read_timeout", &raw.full_read_timeout, 300);
    if raw.full_read_timeout.is_some() && full_read_timeout < timeout {
        v.problem(
            &format!("{key}.full_read_timeout"),
            format!(
                "must be at least the timeout ({})",
                humantime::format_duration(timeout)
            ),
        );
    }
    let quantile_window = duration(v, "quantile_window", &raw.quantile_window, 300);
    if quantile_window < Duration::from_secs(1) {
        v.problem(
            &format!("{key}.quantile_window"),
            "must be at least 1s".into(),
        );
    }
    let state_retention = duration(v, "state_retention", &raw.state_retention, 900);
    if state_retention < overlap {
        v.problem(
            &format!("{key}.state_retention"),
            "must be at least the overlap window".into(),
        );
    }
    let reconcile_every = duration(v, "reconcile_every", &raw.reconcile_every, 60);
    if reconcile_every.is_zero() {
        v.problem(
            &format!("{key}.reconcile_every"),
            "must be greater than zero".into(),
        );
    }
    Windows {
        overlap,
        full_read_timeout: full_read_timeout.max(timeout),
        quantile_window,
        state_retention,
        reconcile_every,
    }
}

/// The bounds on what a table source keeps and reads at once.
struct Limits {
    event_type_limit: usize,
    max_tracked_events: usize,
    batch_size: usize,
    max_count_jump: u64,
}

/// `event_type_limit`, `max_tracked_events`, `batch_size` and `max_count_jump`.
fn limits(v: &mut Validator<'_>, key: &str, raw: &RawTable) -> Limits {
    let mut positive = |name: &str, written: Option<i64>, default: usize, max: usize| {
        v.positive(&format!("{key}.{name}"), written, default, max)
    };
    Limits {
        event_type_limit: positive("event_type_limit", raw.event_type_limit, 50, 10_000),
        max_tracked_events: positive(
            "max_tracked_events",
            raw.max_tracked_events,
            400_000,
            100_000_000,
        ),
        batch_size: positive("batch_size", raw.batch_size, 5_000, 1_000_000),
        max_count_jump: positive("max_count_jump", raw.max_count_jump, 1_000, 1_000_000_000) as u64,
    }
}

/// The `cursor` mode as written, if it is one.
fn written_cursor(v: &mut Validator<'_>, key: &str, written: Option<&str>) -> Option<Cursor> {
    match written {
        None => None,
        Some("updated_at") => Some(Cursor::UpdatedAt),
        Some("none") => Some(Cursor::None),
        Some("events") => Some(Cursor::Events),
        Some(other) => {
            v.problem(
                &format!("{key}.cursor"),
                format!("\"{other}\" is not a cursor mode: \"updated_at\", \"none\" or \"events\""),
            );
            None
        }
    }
}

/// `finished_rows`, and `deleted_durations` only with `"deleted"`.
fn finished_rows(v: &mut Validator<'_>, key: &str, raw: &RawTable) -> FinishedRows {
    let finished_rows = match raw.finished_rows.as_deref() {
        None | Some("kept") => FinishedRows::Kept,
        Some("deleted") => FinishedRows::Deleted,
        Some(other) => {
            v.problem(
                &format!("{key}.finished_rows"),
                format!("\"{other}\" is not one of \"kept\", \"deleted\""),
            );
            FinishedRows::Kept
        }
    };
    if raw.deleted_durations.is_some() && finished_rows != FinishedRows::Deleted {
        v.problem(
            &format!("{key}.deleted_durations"),
            "applies only with finished_rows = \"deleted\"".into(),
        );
    }
    finished_rows
}

/// Settles the cursor mode: as written, else `updated_at` when that column
/// is mapped; `updated_at` without the column is a problem.
fn settle_cursor(
    v: &mut Validator<'_>,
    key: &str,
    written: Option<Cursor>,
    updated_at: Option<&str>,
) -> Cursor {
    match (written, updated_at) {
        (Some(Cursor::UpdatedAt), None) => {
            v.problem(
                &format!("{key}.cursor"),
                "\"updated_at\" needs columns.updated_at (a column set on every change of a row); \
                 without one, use cursor = \"none\""
                    .into(),
            );
            Cursor::None
        }
        (Some(c), _) => c,
        (None, Some(_)) => Cursor::UpdatedAt,
        (None, None) => Cursor::None,
    }
}

/// Checks an inbox's own keys.
pub(crate) fn inbox_spec(
    (mut table, cursor): (TableSpec, Option<Cursor>),
    raw: RawInbox,
    key: &str,
    v: &mut Validator<'_>,
) -> Option<InboxSpec> {
    let stuck_after = v.duration(
        &format!("{key}.stuck_after"),
        raw.stuck_after.as_deref(),
        Duration::from_secs(600),
    );
    let rules = status_rules(v, key, raw.status_rules.as_deref().unwrap_or_default());
    // Rules stand in for a status column even when one of them is wrong:
    // that one is the problem to name, not the missing column.
    let has_rules = raw.status_rules.as_ref().is_some_and(|r| !r.is_empty());
    let with_events = cursor == Some(Cursor::Events);
    let columns = inbox_columns(v, key, &raw.columns, has_rules, with_events);
    let statuses = statuses(v, key, raw.statuses.as_ref());
    let deleted_as = deleted_as(v, key, raw.deleted_as.as_deref(), table.finished_rows);
    let attempts_count = attempts_count(v, key, &raw);
    let error_classes = Arc::new(error_classes::validate(
        v,
        key,
        raw.error_classes.as_deref().unwrap_or_default(),
        raw.default_error_classes,
    ));
    let events = events_spec(v, key, raw.events.as_ref(), with_events, &table.table);
    if with_events
        && raw
            .columns
            .deliveries
            .as_deref()
            .is_some_and(|d| !d.is_empty())
    {
        v.problem(
            &format!("{key}.columns.deliveries"),
            "not read with cursor = \"events\": the log shows no redelivery".into(),
        );
    }
    let columns = columns?;
    let ordering_keys_limit = ordering_keys_limit(v, key, raw.ordering_keys_limit, &columns);
    let attempts_offset = attempts_offset(v, key, raw.attempts_offset, &columns);
    table.cursor = settle_cursor(v, key, cursor, columns.updated_at.as_deref());
    table.events = events.map(|e| {
        Arc::new(EventsSpec {
            jobs_event_id: columns.event_id.clone(),
            jobs_event_type: columns.event_type.clone(),
            ..e
        })
    });
    let actions = raw.dead_letter_actions.as_ref().and_then(|a| {
        dead_letter_actions(v, key, a, &table, &columns, &statuses, !rules.is_empty())
    });
    Some(InboxSpec {
        table,
        stuck_after,
        columns,
        statuses,
        rules,
        deleted_as,
        attempts_count,
        attempts_offset,
        actions,
        error_classes,
        ordering_keys_limit,
    })
}

/// `deleted_as`: the outcome a deleted row counts as, only with
/// `finished_rows = "deleted"`.
fn deleted_as(
    v: &mut Validator<'_>,
    key: &str,
    written: Option<&str>,
    finished_rows: FinishedRows,
) -> Status {
    let at = format!("{key}.deleted_as");
    let status = match written {
        None | Some("succeeded") => Status::Succeeded,
        Some("dead") => Status::Dead,
        Some(other) => {
            v.problem(
                &at,
                format!("\"{other}\" is not one of \"succeeded\", \"dead\""),
            );
            Status::Succeeded
        }
    };
    if written.is_some() && finished_rows != FinishedRows::Deleted {
        v.problem(&at, "applies only with finished_rows = \"deleted\"".into());
    }
    status
}

/// `attempts_count`: what `columns.attempts` counts, only with that column.
fn attempts_count(v: &mut Validator<'_>, key: &str, raw: &RawInbox) -> AttemptsCount {
    let at = format!("{key}.attempts_count");
    let count = match raw.attempts_count.as_deref() {
        None | Some("started") => AttemptsCount::Started,
        Some("failed") => AttemptsCount::Failed,
        Some(other) => {
            v.problem(
                &at,
                format!("\"{other}\" is not one of \"started\", \"failed\""),
            );
            AttemptsCount::Started
        }
    };
    if raw.attempts_count.is_some() && raw.columns.attempts.as_deref().unwrap_or("").is_empty() {
        v.problem(&at, "applies only with columns.attempts".into());
    }
    count
}

/// `ordering_keys_limit`: within its bounds, only with the ordering columns.
fn ordering_keys_limit(
    v: &mut Validator<'_>,
    key: &str,
    written: Option<i64>,
    columns: &InboxColumns,
) -> usize {
    let at = format!("{key}.ordering_keys_limit");
    let limit = v.positive(&at, written, DEFAULT_ORDERING_KEYS, MAX_ORDERING_KEYS);
    let ordered = columns.ordering_key.is_some() && columns.version.is_some();
    if written.is_some() && !ordered {
        v.problem(
            &at,
            "applies only with columns.ordering_key and columns.version".into(),
        );
    }
    limit
}

/// `attempts_offset`: small and not negative, with both columns it joins.
fn attempts_offset(
    v: &mut Validator<'_>,
    key: &str,
    written: Option<i64>,
    columns: &InboxColumns,
) -> i64 {
    let Some(offset) = written else {
        return 0;
    };
    let at = format!("{key}.attempts_offset");
    if !(0..=MAX_ATTEMPTS_OFFSET).contains(&offset) {
        v.problem(
            &at,
            format!("{offset} is not between 0 and {MAX_ATTEMPTS_OFFSET}"),
        );
    }
    if columns.attempts.is_none() || columns.started_at.is_none() {
        v.problem(
            &at,
            "needs columns.attempts and columns.started_at: the offset is added to \
             the attempts of rows that have started"
                .into(),
        );
    }
    offset
}

/// Checks `[sources.dead_letter_actions]`.
fn dead_letter_actions(
    v: &mut Validator<'_>,
    key: &str,
    raw: &RawActions,
    table: &TableSpec,
    columns: &InboxColumns,
    statuses: &StatusMap,
    has_rules: bool,
) -> Option<Box<DeadLetterActions>> {
    let at = format!("{key}.dead_letter_actions");
    let before = v.count();
    let dsn = dsn_at(v, &at, &raw.dsn, &raw.dsn_file);
    if let Some(d) = &dsn {
        let ours = table.dsn.dialect();
        if !d.expose().is_empty() && !table.dsn.expose().is_empty() && d.dialect() != ours {
            v.problem(
                &format!("{at}.dsn"),
                format!(
                    "a {} DSN, but the source's table is on {}: the actions write to the same database",
                    d.dialect().as_str(),
                    ours.as_str()
                ),
            );
        }
    }
    if columns.status.is_none() {
        v.problem(
            &at,
            "needs columns.status: replay and ignore write the status column".into(),
        );
    }
    let unfinished =
        |w: &str| matches!(statuses.classify(w), Some(Status::Pending | Status::Failed));
    let replay_status = match raw.replay_status.as_deref() {
        Some(w) if unfinished(w) => w.to_string(),
        Some(w) => {
            v.problem(
                &format!("{at}.replay_status"),
                format!(
                    "\"{w}\" is not a pending or failed word of this source's statuses: \
                     a replayed row must be one the consumer picks up again"
                ),
            );
            String::new()
        }
        None if has_rules => {
            v.problem(
                &format!("{at}.replay_status"),
                "required with status_rules: name the status word that makes a replayed row \
                 pending (the rules, not the words alone, decide what a row means)"
                    .into(),
            );
            String::new()
        }
        None => statuses
            .words_for(Status::Pending)
            .first()
            .map_or(String::new(), |w| (*w).to_string()),
    };
    let ignored_status = raw.ignored_status.as_deref().map(|w| {
        if statuses.classify(w).is_none() {
            v.problem(
                &format!("{at}.ignored_status"),
                format!(
                    "\"{w}\" is not a status word of this source (statuses.*): \
                     the agent would reject an ignored row as unknown_status"
                ),
            );
        }
        w.to_string()
    });
    let audit_table = match raw.audit_table.as_deref() {
        None => crate::sources::kind::DEFAULT_AUDIT_TABLE.to_string(),
        Some(t) if is_table_name(t) => t.to_string(),
        Some(t) => {
            v.problem(
                &format!("{at}.audit_table"),
                format!("\"{t}\" is not a table name (letters, digits, _ and $, optionally schema.table)"),
            );
            String::new()
        }
    };
    if v.count() > before {
        return None;
    }
    Some(Box::new(DeadLetterActions {
        dsn: dsn?,
        replay_status,
        reset_attempts: raw.reset_attempts.unwrap_or(false),
        ignored_status,
        audit_table,
    }))
}

/// Checks an outbox's own keys.
pub(crate) fn outbox_spec(
    (mut table, cursor): (TableSpec, Option<Cursor>),
    raw: RawOutbox,
    key: &str,
    v: &mut Validator<'_>,
) -> Option<OutboxSpec> {
    if cursor == Some(Cursor::Events) {
        v.problem(
            &format!("{key}.cursor"),
            "\"events\" applies to inbox sources only".into(),
        );
    }
    let columns = outbox_columns(v, key, &raw.columns)?;
    table.cursor = settle_cursor(v, key, cursor, columns.updated_at.as_deref());
    Some(OutboxSpec { table, columns })
}

/// Checks `[[sources.status_rules]]`: each names a meaning and a condition
/// in the grammar of [`rules`].
fn status_rules(v: &mut Validator<'_>, key: &str, raw: &[RawRule]) -> Vec<Rule> {
    let mut out = Vec::new();
    for (i, r) in raw.iter().enumerate() {
        let at = format!("{key}.status_rules[{i}]");
        let meaning = match r.meaning.as_deref() {
            Some(m) => Status::from_name(m).or_else(|| {
                v.problem(
                    &format!("{at}.meaning"),
                    format!(
                        "\"{m}\" is not a meaning: one of pending, processing, succeeded, failed, dead, parked"
                    ),
                );
                None
            }),
            None => {
                v.problem(&format!("{at}.meaning"), "required".into());
                None
            }
        };
        let when = match r.when.as_deref() {
            Some(w) => rules::parse(w)
                .map_err(|e| v.problem(&format!("{at}.when"), e))
                .ok(),
            None => {
                v.problem(&format!("{at}.when"), "required".into());
                None
            }
        };
        if let (Some(meaning), Some(when)) = (meaning, when) {
            out.push(Rule { meaning, when });
        }
    }
    out
}

fn dsn(v: &mut Validator<'_>, key: &str, raw: &RawTable) -> Option<Dsn> {
    dsn_at(v, key, &raw.dsn, &raw.dsn_file)
}

/// Checks `dsn` / `dsn_file` of the table at `key`: exactly one of them, the
/// file readable, every `${VAR}` set, the result a DSN sqlx connects with.
fn dsn_at(
    v: &mut Validator<'_>,
    key: &str,
    dsn: &Option<String>,
    dsn_file: &Option<String>,
) -> Option<Dsn> {
    let (dsn_key, text) = match (dsn, dsn_file) {
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

/// A mapped column. A required meaning not written has its own name as
/// the column's; an optional one not written (or written as "") is not used.
fn column(
    v: &mut Validator<'_>,
    key: &str,
    meaning: &str,
    value: &Option<String>,
    required: bool,
) -> Option<String> {
    let full = format!("{key}.columns.{meaning}");
    match value.as_deref() {
        None if required => Some(meaning.to_string()),
        None => None,
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

fn inbox_columns(
    v: &mut Validator<'_>,
    key: &str,
    c: &RawInboxColumns,
    has_rules: bool,
    with_events: bool,
) -> Option<InboxColumns> {
    let before = v.count();
    let cols = InboxColumns {
        event_id: column(v, key, "event_id", &c.event_id, true).unwrap_or_default(),
        event_type: column(v, key, "event_type", &c.event_type, false),
        // Rules can stand in for a status column.
        status: column(v, key, "status", &c.status, !has_rules),
        // With an events log, the arrival time can come from the log.
        received_at: column(v, key, "received_at", &c.received_at, !with_events)
            .unwrap_or_default(),
        started_at: column(v, key, "started_at", &c.started_at, false),
        finished_at: column(v, key, "finished_at", &c.finished_at, false),
        attempts: column(v, key, "attempts", &c.attempts, false),
        deliveries: column(v, key, "deliveries", &c.deliveries, false),
        last_error: column(v, key, "last_error", &c.last_error, false),
        traceparent: column(v, key, "traceparent", &c.traceparent, false),
        updated_at: column(v, key, "updated_at", &c.updated_at, false),
        business_key: column(v, key, "business_key", &c.business_key, false),
        summary: column(v, key, "summary", &c.summary, false),
        ordering_key: column(v, key, "ordering_key", &c.ordering_key, false),
        version: column(v, key, "version", &c.version, false),
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
        ("business_key", &c.business_key),
        ("summary", &c.summary),
        ("ordering_key", &c.ordering_key),
        ("version", &c.version),
    ];
    // Versions mean something only within a key, and a key only with versions.
    match (&cols.ordering_key, &cols.version) {
        (None, Some(_)) => v.problem(
            &format!("{key}.columns.version"),
            "needs columns.ordering_key: a version counts within its key".into(),
        ),
        (Some(_), None) => v.problem(
            &format!("{key}.columns.ordering_key"),
            "needs columns.version: the order within a key comes from the version".into(),
        ),
        _ => {}
    }
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
        updated_at: column(v, key, "updated_at", &c.updated_at, false),
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
        (Status::Parked, &raw.parked),
    ];
    let mut words: Vec<(String, Status)> = Vec::new();
    for (status, list) in lists {
        let full = format!("{key}.statuses.{}", status.as_str());
        let list = match list {
            Some(l) => l.clone(),
            None if status == Status::Parked => Vec::new(),
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
    StatusMap::new(words)
}
