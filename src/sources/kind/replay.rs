//! Sending records of a dead-letter topic back: `dead-letters replay
//! --topic`, which a kind with dead-letter topics may offer. The command
//! (`actions`) owns the run — the dry run, the rate, the summary — and the
//! kind what is particular to its broker: which records a selection picks,
//! producing them with its write credentials, and the audit row of each.

use std::time::Duration;

use super::{ActionError, ActionOutcome, Answer};
use crate::dsn::Dialect;

/// `dead-letters replay --topic` on a source's dead-letter topics.
pub trait TopicReplay: Sync {
    /// The audit table records sent back are recorded in: the dialect of its
    /// DSN and its name (`schema --config`); `None` without an audit DSN.
    fn audit_table(&self) -> Option<(Dialect, &str)>;

    /// The records `selection` picks, oldest first within each partition
    /// (partitions in order), each with where it goes; at most
    /// `selection.max + 1`, so that the caller can tell a selection that is
    /// too large. Reads only; an error names what was wrong (no such topic,
    /// an offset range outside the partition, a record without an original
    /// topic and no `--to`, …).
    fn select<'a>(
        &'a self,
        selection: &'a TopicSelection,
    ) -> Answer<'a, Result<Vec<ReplayRecord>, ActionError>>;

    /// Opens a run: checks the audit table, connects with the write
    /// credentials and registers an idempotent producer. Nothing is
    /// produced yet.
    fn open<'a>(
        &'a self,
        run: &'a ReplayRun,
    ) -> Answer<'a, Result<Box<dyn ReplaySender + 'a>, ActionError>>;
}

/// An open run: produces records, each with its audit row.
pub trait ReplaySender: Send {
    /// Produces each of `records` to its destination, in order, and writes
    /// one audit row for each produced; one outcome per record. `Err` when
    /// the run cannot go on (the broker or the audit database is gone).
    fn send<'a>(
        &'a mut self,
        records: &'a [ReplayRecord],
    ) -> Answer<'a, Result<Vec<ActionOutcome>, ActionError>>;
}

/// Which records of a dead-letter topic, and where they go.
#[derive(Debug, Clone, Default)]
pub struct TopicSelection {
    /// `--topic`: the dead-letter topic.
    pub topic: String,
    /// `--partition`, with `--from-offset` / `--to-offset`.
    pub partition: Option<i32>,
    /// `--from-offset`: the first offset (inclusive).
    pub from_offset: Option<i64>,
    /// `--to-offset`: the last offset (inclusive).
    pub to_offset: Option<i64>,
    /// `--header k=v`: records carrying every one of these headers with
    /// exactly this value.
    pub headers: Vec<(String, String)>,
    /// `--since`: records stamped within this long.
    pub since: Option<Duration>,
    /// `--until`: records stamped at least this long ago.
    pub until: Option<Duration>,
    /// `--to`: the topic every record goes to, instead of its original one.
    pub to: Option<String>,
    /// The most records one run sends back.
    pub max: usize,
}

/// One record of a dead-letter topic to send back: all of it (the whole
/// value, not a prefix) and where it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayRecord {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// Milliseconds since the epoch.
    pub timestamp: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// In the record's order; `None`: a null header value.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// The exception's message, as the headers say (for the audit row).
    pub exception_message: Option<String>,
    /// The topic it is produced to: `--to`, else its original topic.
    pub destination: String,
}

impl ReplayRecord {
    /// `topic/partition/offset`: the record's coordinates, its audit
    /// `event_id`.
    pub fn coordinates(&self) -> String {
        format!("{}/{}/{}", self.topic, self.partition, self.offset)
    }
}

/// One `dead-letters replay --topic --yes`.
#[derive(Debug, Clone)]
pub struct ReplayRun {
    /// Carried by every record sent (`inboxwatch-replay-run-id`).
    pub run_id: String,
    pub operator: String,
    pub reason: String,
}
