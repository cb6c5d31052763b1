//! What a source kind is to the rest of the agent: how its `[[sources]]`
//! entry is read and checked, how it starts (its election and its poll
//! loop), what `doctor` checks of it, and whether the on-call lookups can
//! search it. `app`, `doctor`, `lookup` and the configuration reach a kind
//! only through [`Kind`], by way of the registry in `sources/mod.rs`.

use std::any::Any;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use toml::Spanned;
use toml::de::DeValue;

use crate::card::{Card, Past};
use crate::checks::{Unknown, Validator, keys_at, knows};
use crate::coordination::{Leadership, Lock, elect};
use crate::health::Health;
use crate::journal::Journal;
use crate::redact::Redactor;
use crate::sources::run::{Source, run_loop};
use crate::telemetry::values::Reading;
use crate::tracing_link::Linker;

/// A kind of source: one folder under `src/sources/`, one variant of the
/// registry's `SourceSpec`. The value is the validated settings of one source.
pub trait Kind: Sized + Clone + std::fmt::Debug + Send + Sync + 'static {
    /// The `kind = "…"` that names it in the file.
    const KIND: &'static str;
    /// The entry as written (without `name` and `kind`).
    type Raw: DeserializeOwned;

    /// Reads the entry; keys it does not take are returned, not reported.
    fn read(v: &mut Validator<'_>, key: &str, entry: Spanned<DeValue<'_>>) -> Read<Self::Raw> {
        v.read::<Self::Raw>(key, entry)
    }

    /// Whether the kind takes the key at `path` (to say whose key a
    /// misplaced one is).
    fn knows(path: &[String]) -> bool {
        knows::<Self::Raw>(path)
    }

    /// The keys the kind takes in the table at `path` of its entry (besides
    /// `name` and `kind` at the top).
    fn keys_at(path: &[String]) -> Vec<&'static str> {
        keys_at::<Self::Raw>(path)
    }

    /// Checks every setting, reporting each problem with its key
    /// (`key` is the entry's, e.g. `sources[2]`). `None` when any is wrong.
    fn validate(raw: Self::Raw, key: &str, name: String, v: &mut Validator<'_>) -> Option<Self>;

    /// The configured name: the `source` label.
    fn name(&self) -> &str;

    /// The team that owns the source (`owner`), "" when none is configured.
    fn owner(&self) -> &str;

    /// The `service` label of `inboxwatch_source_info`: the consumer's
    /// `service_name` (the `service.name` of its spans), else the source name.
    fn service(&self) -> &str {
        self.name()
    }

    /// Starts watching: the election that decides whether this agent polls
    /// the source, and the poll loop.
    fn start(self, rt: &mut Runtime) -> anyhow::Result<()>;

    /// What `doctor` prints after the name, e.g. `kafka, brokers a:9092`.
    fn describe(&self) -> String;

    /// `doctor`'s checks of this source (run on the command's own runtime:
    /// the future need not be `Send`).
    fn doctor(&self) -> impl Future<Output = Vec<Finding>>;

    /// The source's status card (the status page, `/api/v1/status`), from
    /// what it recorded (`values`: nothing when another agent exports it)
    /// and its history (`past`).
    fn card(&self, values: &Reading<'_>, past: &dyn Past) -> Card;

    /// Whether `trace` and `dead-letters` can search this source: it keeps
    /// one row per event.
    fn keeps_events(&self) -> bool {
        false
    }

    /// The error classes the source's dead letters can have (`error_class`).
    fn error_classes(&self) -> Vec<String> {
        Vec::new()
    }

    /// What the source knows of one event, as `trace` prints it, the
    /// table's texts masked by `redact`; `None` when it has no row of that
    /// event.
    fn trace_event(
        &self,
        _event_id: &str,
        _redact: &Redactor,
    ) -> impl Future<Output = Result<Option<String>, String>> + Send {
        async { Ok(None) }
    }

    /// What each poll reads, in words, with the mode (`cursor = "none": …`),
    /// for `run`'s start line, `doctor`, the status card and API; `None`
    /// for sources that read no table.
    fn reads(&self) -> Option<String> {
        None
    }

    /// The indexes the source's queries need, as DDL in its dialect
    /// (`schema --config`); `None` for sources that read no table.
    fn indexes(&self) -> Option<String> {
        None
    }

    /// The events dead-lettered within `since`, newest first, at most `limit`.
    fn dead_letters(
        &self,
        _since: Duration,
        _limit: usize,
    ) -> impl Future<Output = Result<Vec<DeadLetter>, String>> + Send {
        async { Ok(Vec::new()) }
    }

    /// The DDL of the table `dead-letters replay` / `ignore` record their
    /// actions in (`schema --config`); `None` when the source has none.
    fn audit_ddl(&self) -> Option<String> {
        None
    }

    /// `inboxwatch dead-letters replay` / `ignore`: one transaction per
    /// event over the source's write-capable action DSN. Only the command
    /// line calls this; the agent's poll never does.
    fn dead_letter_action(
        &self,
        _request: &ActionRequest,
    ) -> impl Future<Output = Result<Vec<ActionOutcome>, ActionError>> + Send {
        async { Err(ActionError::Unsupported(Self::KIND)) }
    }

    /// The replay / ignore history of these events, oldest first, read over
    /// the agent's own read-only connection; empty when the source records
    /// none or its audit table does not exist.
    fn dead_letter_history(
        &self,
        _event_ids: &[String],
    ) -> impl Future<Output = Result<Vec<AuditEntry>, String>> + Send {
        async { Ok(Vec::new()) }
    }

    /// Whether `dead-letters` reads dead-letter topics of this source (the
    /// records themselves, not rows of a table).
    fn reads_dead_letter_topics(&self) -> bool {
        false
    }

    /// The latest records of the source's dead-letter topics: at most
    /// `per_partition` per partition and `total` in all, newest first, read
    /// without a consumer group.
    fn dead_letter_records(
        &self,
        _per_partition: usize,
        _total: usize,
    ) -> impl Future<Output = Result<DeadRecords, String>> + Send {
        async { Ok(DeadRecords::default()) }
    }
}

/// What `dead-letters replay` / `ignore` do to a dead-lettered event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Back to the replay status, for the consumer to process again.
    Replay,
    /// Recorded as deliberately not processed (and, if configured, given
    /// the ignored status).
    Ignore,
}

impl Action {
    /// The `action` column of the audit table.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Replay => "replay",
            Action::Ignore => "ignore",
        }
    }
}

/// One `dead-letters replay` / `ignore` command.
#[derive(Debug, Clone)]
pub struct ActionRequest {
    pub action: Action,
    pub operator: String,
    pub reason: String,
    pub event_ids: Vec<String>,
    /// `--yes`: write; without it, only say what would be done.
    pub apply: bool,
}

/// What became of one event of an [`ActionRequest`].
#[derive(Debug, Clone)]
pub struct ActionOutcome {
    pub event_id: String,
    /// Done (or, without `--yes`, would be done).
    pub done: bool,
    /// One line saying what was done or why not.
    pub line: String,
}

/// Why a `dead-letters replay` / `ignore` command did nothing at all.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    /// The source's kind keeps no dead-lettered rows.
    #[error("is of kind \"{0}\": only inbox sources have dead-lettered rows to replay or ignore")]
    Unsupported(&'static str),
    /// The inbox has no `[sources.dead_letter_actions]`.
    #[error(
        "has no [sources.dead_letter_actions]: replay and ignore need its write-capable dsn \
         (docs/configuration.md, \"Dead-letter actions\")"
    )]
    NotConfigured,
    /// Connecting, or the audit table, failed: nothing was written.
    #[error("{0}")]
    Failed(String),
}

/// One row of the audit table: a replay or an ignore of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    pub event_id: String,
    /// `replay` or `ignore`.
    pub action: String,
    pub operator: String,
    pub reason: String,
    /// When, on the database's clock: microseconds since the epoch.
    pub at: i64,
    /// The row's status word before the action.
    pub previous_status: Option<String>,
    /// The row's attempts before the action.
    pub attempts: Option<i64>,
    /// The row's last error before the action.
    pub last_error: Option<String>,
}

/// A read entry and the keys it had that the kind does not take.
pub type Read<T> = (Option<T>, Vec<Unknown>);

/// One finding of `doctor`.
#[derive(Debug)]
pub enum Finding {
    Ok(String),
    Warn(String),
    Error(String),
}

/// One dead-lettered event, as `dead-letters` lists it.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub event_id: String,
    pub event_type: Option<String>,
    /// Microseconds since the epoch.
    pub received: Option<i64>,
    /// Microseconds since the epoch.
    pub dead_at: Option<i64>,
    pub attempts: Option<i64>,
    pub last_error: Option<String>,
    /// The optional `business_key` column (an order id, say): shown, never a label.
    pub business_key: Option<String>,
    /// The optional `summary` column (a body digest, say): shown, never a label.
    pub summary: Option<String>,
    /// The class of `last_error` (`[[sources.error_classes]]`).
    pub error_class: Option<String>,
}

/// Bytes of a dead-letter record's value that [`DeadRecord`] keeps.
pub const VALUE_PREFIX: usize = 256;

/// One record of a dead-letter topic, as `dead-letters` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadRecord {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// Milliseconds since the epoch: the producer's CreateTime, or the
    /// broker's LogAppendTime when the topic uses it.
    pub timestamp: i64,
    /// `None`: a null key.
    pub key: Option<Vec<u8>>,
    /// In the record's order; a null header value is empty. A key the
    /// record repeats appears once, with its last value.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The first [`VALUE_PREFIX`] bytes of the value.
    pub value_prefix: Vec<u8>,
    /// Bytes of the whole value; `None`: a null value (a tombstone).
    pub value_len: Option<usize>,
}

/// Headers that name the topic a dead letter came from: Spring Kafka's
/// `DeadLetterPublishingRecoverer`, then Kafka Connect's error reporter.
pub const ORIGINAL_TOPIC_HEADERS: &[&str] = &["kafka_dlt-original-topic", "__connect.errors.topic"];
/// Headers that name the exception's class.
pub const EXCEPTION_CLASS_HEADERS: &[&str] = &[
    "kafka_dlt-exception-fqcn",
    "__connect.errors.exception.class.name",
];
/// Headers that hold the exception's message.
pub const EXCEPTION_MESSAGE_HEADERS: &[&str] = &[
    "kafka_dlt-exception-message",
    "__connect.errors.exception.message",
];

impl DeadRecord {
    /// The value of header `name` (its last, if repeated).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }

    /// The first of `names` the record carries, as text (invalid UTF-8
    /// replaced).
    fn first_header(&self, names: &[&str]) -> Option<String> {
        names
            .iter()
            .find_map(|n| self.header(n))
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// The topic the failed record came from (Spring Kafka's
    /// `kafka_dlt-original-topic`, Kafka Connect's `__connect.errors.topic`).
    pub fn original_topic(&self) -> Option<String> {
        self.first_header(ORIGINAL_TOPIC_HEADERS)
    }

    /// The class of the exception that dead-lettered it
    /// (`kafka_dlt-exception-fqcn`, `__connect.errors.exception.class.name`).
    pub fn exception_class(&self) -> Option<String> {
        self.first_header(EXCEPTION_CLASS_HEADERS)
    }

    /// The exception's message (`kafka_dlt-exception-message`,
    /// `__connect.errors.exception.message`).
    pub fn exception_message(&self) -> Option<String> {
        self.first_header(EXCEPTION_MESSAGE_HEADERS)
    }
}

/// A partition of a dead-letter topic whose latest records could not be
/// read (its leader did not answer, a batch used an unknown compression
/// codec or was larger than the read allows, …); its other partitions are
/// still listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadPartitionProblem {
    pub topic: String,
    pub partition: i32,
    pub message: String,
}

/// The latest records of a source's dead-letter topics, newest first, and
/// the partitions that could not be read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadRecords {
    pub records: Vec<DeadRecord>,
    pub problems: Vec<DeadPartitionProblem>,
}

/// What a starting source gets from the agent: where to spawn its tasks,
/// the agent's ownership and health records, span export, and values the
/// sources of one kind share (a pool per database, say).
pub struct Runtime {
    pub leadership: Arc<Leadership>,
    pub health: Arc<Health>,
    pub cancel: CancellationToken,
    /// Span export, when `[tracing]` is configured.
    pub linker: Option<Linker>,
    /// `[server] max_connections_per_database`.
    pub max_connections_per_database: u32,
    /// Where sources note the attempts of failed events (`/events/{id}`).
    pub journal: Journal,
    tasks: JoinSet<()>,
    /// Senders of sources no election decides: kept so that ownership never ends.
    owned_outright: Vec<watch::Sender<Option<bool>>>,
    shared: Vec<Box<dyn Any + Send>>,
}

impl Runtime {
    pub fn new(
        health: Arc<Health>,
        leadership: Arc<Leadership>,
        cancel: CancellationToken,
        linker: Option<Linker>,
        max_connections_per_database: u32,
    ) -> Runtime {
        Runtime {
            leadership,
            health,
            cancel,
            linker,
            max_connections_per_database,
            journal: Journal::default(),
            tasks: JoinSet::new(),
            owned_outright: Vec::new(),
            shared: Vec::new(),
        }
    }

    /// The agent's one value of type `T`, made by `make` when first asked for.
    pub fn shared<T: Any + Send + Clone>(&mut self, make: impl FnOnce(&Runtime) -> T) -> T {
        if let Some(found) = self.shared.iter().find_map(|b| b.downcast_ref::<T>()) {
            return found.clone();
        }
        let made = make(self);
        self.shared.push(Box::new(made.clone()));
        made
    }

    /// Spawns the election of a source; the receiver says whether this agent owns it.
    pub fn elect<L: Lock>(&mut self, lock: L) -> watch::Receiver<Option<bool>> {
        let (tx, rx) = watch::channel(None);
        self.tasks.spawn(elect(
            lock,
            self.leadership.clone(),
            self.health.clone(),
            tx,
            self.cancel.clone(),
        ));
        rx
    }

    /// A source no other agent can watch (a local file): this agent owns it.
    pub fn own_outright(&mut self, name: &str) -> watch::Receiver<Option<bool>> {
        self.leadership.set(name, true);
        let (tx, rx) = watch::channel(Some(true));
        self.owned_outright.push(tx);
        rx
    }

    /// Spawns the poll loop of a source, polling while `leader` says this agent owns it.
    pub fn spawn_loop<S, F>(&mut self, name: &str, make: F, leader: watch::Receiver<Option<bool>>)
    where
        S: Source,
        F: Fn() -> S + Send + 'static,
    {
        self.tasks.spawn(run_loop(
            name.to_string(),
            make,
            self.health.clone(),
            leader,
            self.cancel.clone(),
        ));
    }

    /// The spawned tasks, the span linker and what keeps outright ownership,
    /// once every source has started.
    pub fn finish(
        self,
    ) -> (
        JoinSet<()>,
        Option<Linker>,
        Vec<watch::Sender<Option<bool>>>,
    ) {
        (self.tasks, self.linker, self.owned_outright)
    }
}

/// Bytes as text for a tab-separated line: UTF-8 as it is, a backslash as
/// `\\`, control characters and bytes that are not UTF-8 as `\xNN`; at
/// most `max` bytes of the input, `…` after a cut.
pub fn bytes_text(bytes: &[u8], max: usize) -> String {
    let cut = bytes.len() > max;
    let bytes = &bytes[..bytes.len().min(max)];
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                c if c.is_control() => {
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        let _ = write!(out, "\\x{b:02x}");
                    }
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    if cut {
        out.push('…');
    }
    out
}

/// Table data as text for a terminal or a tab-separated line, whole:
/// [`bytes_text`] without a cut. An event id, status word or error text that
/// holds ESC, BEL, CR, a tab or a newline cannot move the cursor, retitle
/// the terminal or split a row.
pub fn printable(text: &str) -> String {
    bytes_text(text.as_bytes(), usize::MAX)
}

/// Text for a terminal, its lines kept: each control character but the
/// newline as `\xNN` (ESC, BEL, CR, a tab), the rest as it is. For what is
/// printed as lines rather than as tab-separated fields: `trace`, and the
/// error messages of the lookups and actions (a driver's error can echo an id).
pub fn terminal_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\n' {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "\\x{b:02x}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The farthest back a dead-letter listing looks (`?since=`, `--since`): 3650
/// days, as [`parse_since`] says. Farther would reach past what the databases' time types hold
/// (MariaDB's `TIMESTAMP` begins in 1970) and fail in the driver.
pub const MAX_SINCE: Duration = Duration::from_secs(3650 * 86_400);

/// A `since` duration: `1h`, `2d`, … up to [`MAX_SINCE`].
pub fn parse_since(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration like 1h or 2d: {e}"))?;
    if d > MAX_SINCE {
        return Err(format!(
            "{text:?} is longer than 3650d (ten years), the farthest back a listing looks"
        ));
    }
    Ok(d)
}

/// Characters of `last_error` the lookups show.
pub const ERROR_SHOWN: usize = 200;

/// What a kind gives for a time that has no microsecond value that fits in
/// 64 bits (PostgreSQL's `infinity`, a year past 294,000) or that cannot be
/// read as a time: a row holding one is rejected as `time_out_of_range`,
/// and the lookups show it as such.
pub const OUT_OF_RANGE: i64 = i64::MIN + 1;

/// RFC 3339 UTC with milliseconds, from microseconds since the epoch; a time
/// RFC 3339 cannot show (before 1970 for the formatter, after 9999, or out of
/// range in the database) is shown as what it is.
pub fn timestamp(micros: i64) -> String {
    /// 10000-01-01T00:00:00Z.
    const YEAR_10000: i64 = 253_402_300_800_000_000;
    if micros == OUT_OF_RANGE {
        "(out of range)".to_string()
    } else if !(0..YEAR_10000).contains(&micros) {
        format!("({micros} µs from 1970-01-01T00:00:00Z)")
    } else {
        humantime::format_rfc3339_millis(crate::tracing_link::at(micros)).to_string()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards `trace` and `dead-letters` on rows with times out of range
    /// (`infinity`, before 1970, after 9999): shown as such, never a panic.
    #[test]
    fn timestamps_rfc3339_cannot_show_are_shown_as_they_are() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(timestamp(1_500), "1970-01-01T00:00:00.001Z");
        assert_eq!(timestamp(OUT_OF_RANGE), "(out of range)");
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
