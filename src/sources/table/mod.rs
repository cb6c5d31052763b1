//! Inbox and outbox tables on PostgreSQL, MySQL/MariaDB and SQLite.
//!
//! Each poll is one read-only transaction that tails the change cursor
//! (`updated_at`) — or, without one, the arrival and finish times — from the
//! last high-water mark minus a short look-back, and re-reads the slices of
//! the overlap window that just became a third of it and all of it old
//! ([`LateReads`]), so a transaction that commits late is still seen. What
//! a row changed since it was last seen is worked out against a bounded map
//! of recently seen events, so re-reading never counts twice. The gauges come
//! from a map of the unfinished rows kept from the same rows ([`backlog`]),
//! checked every `reconcile_every`; without a change cursor (or when finished
//! rows are deleted) the unfinished rows are re-read on every poll instead,
//! and those that left them are looked up by id.

mod actions;
pub mod backlog;
pub mod capabilities;
mod card;
pub mod config;
mod doctor;
pub mod error_classes;
pub mod events;
pub mod inbox;
mod keymap;
mod kind;
pub mod lock;
mod lookup;
pub mod meaning;
mod ordering;
pub mod outbox;
pub mod presets;
mod recent;
mod replays;
pub mod rules;
pub mod schema;
mod shape;
pub mod sql;

pub use config::{InboxSpec, OutboxSpec, Status, StatusMap, TableSpec};

use std::cell::Cell;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use sqlx::any::AnyPoolOptions;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, AnyPool, Connection, Row};
use tracing::{debug, info, warn};

use crate::dsn::Dialect;
use crate::sources::poll_loop::{PollStats, Source, SourceError};
use crate::telemetry::catalogue as metric;
use backlog::{Backlog, GaugeMap, Mark, NO_MARK, Unfinished};
use config::{Cursor, FinishedRows};
use keymap::KeyMap;
use sql::{IdBind, Param, Sql};

/// How far behind the change cursor every poll looks, for transactions that
/// commit shortly after setting `updated_at`; older stragglers (up to the
/// source's `overlap`) are caught by the re-read slices ([`LateReads`]).
/// Every row version in it is visited on every poll (on PostgreSQL only to
/// be skipped by its `xmin`): at 1 s polls, 1 s instead of 2 s took the
/// tail's database time from 3.5 to 2.3–2.5 ms (docs/performance.md).
pub const COMMIT_LAG: Duration = Duration::from_secs(1);

/// Text of `last_error` longer than this (in characters) is rejected as a label
/// source and counted under `last_error_too_long`.
pub const MAX_ERROR_LEN: i64 = 64 * 1024;

/// A row's change cursor when the column is NULL.
pub(crate) const NO_CURSOR: i64 = i64::MIN;

/// Why a row was rejected (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reject {
    NullTime,
    UnknownStatus,
    FinishBeforeStart,
    LastErrorTooLong,
    /// A `traceparent` that is not a W3C trace context: its span has no link.
    BadTraceparent,
    /// A time with no value in range (`infinity`, a year past 294,000, a
    /// text that is not a time).
    TimeOutOfRange,
    /// `attempts` or `deliveries` negative, or grown by more than
    /// `max_count_jump` in one change.
    ImplausibleCount,
    /// A NULL change cursor: the tail cannot see the row change.
    NullCursor,
}

impl Reject {
    /// Every reason, for creating the series at 0.
    pub const ALL: [Reject; 8] = [
        Reject::NullTime,
        Reject::UnknownStatus,
        Reject::FinishBeforeStart,
        Reject::LastErrorTooLong,
        Reject::BadTraceparent,
        Reject::TimeOutOfRange,
        Reject::ImplausibleCount,
        Reject::NullCursor,
    ];

    /// The reasons a row is not used at all for: the ones that can make a
    /// source degraded.
    pub const UNUSABLE: [Reject; 6] = [
        Reject::NullTime,
        Reject::UnknownStatus,
        Reject::FinishBeforeStart,
        Reject::TimeOutOfRange,
        Reject::ImplausibleCount,
        Reject::NullCursor,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Reject::NullTime => "null_time",
            Reject::UnknownStatus => "unknown_status",
            Reject::FinishBeforeStart => "finish_before_start",
            Reject::LastErrorTooLong => "last_error_too_long",
            Reject::BadTraceparent => "bad_traceparent",
            Reject::TimeOutOfRange => "time_out_of_range",
            Reject::ImplausibleCount => "implausible_count",
            Reject::NullCursor => "null_cursor",
        }
    }
}

/// The part of a table source that differs between inbox and outbox tables.
pub trait TableKind: Send + 'static {
    /// Every column the source reads as (config key under the source, column),
    /// for the schema check: `columns.status`, `status_rules[2].when`.
    fn columns(&self) -> Vec<(String, String)>;
    /// The select list of every query that reads rows, as (meaning,
    /// expression). The event id comes first, as text.
    fn select_list(&self, sql: &Sql) -> Vec<(&'static str, String)>;
    /// The columns tailed by a watermark, with their place in the select
    /// list: the change cursor (`updated_at`), or without one the arrival
    /// and finish times.
    fn cursors(&self) -> Vec<(String, usize)>;
    /// Without a change cursor, whether a poll may read only what can have
    /// changed instead of every unfinished row ([`Incremental`]); `None`
    /// when the shape lets a row change where no time column shows it.
    fn incremental(&self) -> Option<Incremental> {
        None
    }
    /// Without [`TableKind::incremental`], why every unfinished row is
    /// re-read on every poll, for [`TableSource::reads`].
    fn why_every_unfinished_row(&self) -> Option<String> {
        None
    }
    /// The event id column: the keyset of the scan for NULL change cursors
    /// and the key rows that left the unfinished ones are looked up by.
    fn event_id(&self) -> &str;
    /// The optional meanings this source could use and does not map: a
    /// table with a column of the meaning's own name is told how to map it.
    /// Not `updated_at`: mapping it changes how the table is read, which
    /// `doctor` explains.
    fn unmapped_meanings(&self) -> Vec<&'static str>;
    /// The condition that selects the unfinished rows: they seed the state
    /// map at start (so their later changes count exactly) and, without a
    /// change cursor, are re-read on every poll.
    fn unfinished_filter(&self, sql: &Sql) -> String;
    /// [`Incremental`]: the condition that selects the rows in flight
    /// (processing or failed) and the start column's name, as the partial
    /// index that serves their reads ([`TableSource::in_flight_query`]) is
    /// written; `None` where no status word means either.
    fn in_flight(&self, _sql: &Sql) -> Option<(String, String)> {
        None
    }

    /// The column a row's arrival is read from, where the kind has one:
    /// MySQL's check of the stuck rows slices the rows in flight by it
    /// ([`TableSource::in_flight_status_query`]).
    fn received_column(&self) -> Option<String> {
        None
    }

    /// The status column, where the kind reads its status from one column
    /// of words alone.
    fn status_column(&self) -> Option<String> {
        None
    }

    /// The status index ([`Unfinished::class`]) a status word means, if it
    /// means an unfinished status.
    fn class_of_word(&self, _word: &str) -> Option<usize> {
        None
    }
    /// Counts a rejected row the kind did not read itself.
    fn reject(&mut self, reason: Reject);
    /// Sets the agent's start on the database clock.
    fn start(&mut self, db_now: i64);
    /// The database's time at the start of a poll: without a change cursor
    /// the time a row is seen stands in for the time it changed.
    fn begin(&mut self, db_now: i64);
    /// Takes one row of the tail (or seed) into account. `baseline`: the row
    /// predates the agent and only sets the state it is compared with later.
    fn observe(&mut self, row: &AnyRow, baseline: bool) -> Result<(), String>;
    /// A tail or seed row's event key and, if the row is unfinished, what the
    /// gauges need of it.
    fn unfinished(&mut self, row: &AnyRow) -> Result<(u64, Option<Unfinished>), String>;
    /// `cursor = "events"`: takes one event of the log, read as a version of
    /// its job's row whose status is a meaning's name ([`events`]).
    fn observe_event(&mut self, row: &AnyRow) -> Result<(), String>;
    /// A row last seen unfinished is gone from the table: counted as
    /// finished when `deleted` gives its last unfinished version
    /// (`finished_rows = "deleted"`), else only forgotten as unfinished.
    /// `noticed`: the poll's database time.
    fn gone(&mut self, key: u64, deleted: Option<&Unfinished>, noticed: i64);
    /// The aggregate over unfinished rows that gives the gauges.
    fn gauge_query(&self, sql: &Sql, db_now: i64) -> String;
    /// The aggregate over parked rows, run on every poll, if rows can be
    /// parked: one row of count, distinct keys and earliest arrival.
    fn parked_query(&self, _sql: &Sql) -> Option<String> {
        None
    }
    /// Takes the row of [`TableKind::parked_query`].
    fn parked(&mut self, _row: &AnyRow) -> Result<(), String> {
        Ok(())
    }
    /// The read of the replays recorded in the dead-letter audit table
    /// (`replays`), run before each poll's transaction, and its lower bound
    /// (microseconds); `None` when the kind follows none.
    fn replays_query(&self) -> Option<(&str, i64)> {
        None
    }
    /// Takes the rows of [`TableKind::replays_query`], or why it failed.
    fn replays(&mut self, _read: Result<Vec<AnyRow>, String>) {}
    /// The gauges in the gauge query's rows.
    fn gauges(&mut self, rows: &[AnyRow]) -> Result<GaugeMap, String>;
    /// Rows whose `stuck_from` lies before this are stuck (microseconds).
    fn stuck_before(&self, db_now: i64) -> i64;
    /// Records what the poll accumulated and the gauges, once, and forgets
    /// old state.
    fn flush(&mut self, gauges: &GaugeMap, db_now: i64, now: Instant);
}

/// Without a change cursor, the reads that replace re-reading every
/// unfinished row on every poll. The time columns are tailed (arrivals,
/// starts, completions: [`TableKind::cursors`]); a row that can change
/// without moving one of them is one in flight — in `processing` or `failed`
/// — and those are looked up by id ([`TableSource::look_up_in_flight`]): on
/// every poll those started within the last `max(overlap, stuck_after)`,
/// and the ones started earlier (stuck, or waiting long for a retry) in
/// turn, each about once per `overlap` (less often when there are more than
/// [`STUCK_PER_POLL`] a poll's share). What neither shows (a row deleted or
/// re-driven, a status moved by hand) is caught by the reconcile of the kept
/// backlog every `reconcile_every`, which re-reads and counts every
/// unfinished row when the count (or, every tenth time, the aggregate)
/// differs.
#[derive(Debug, Clone, Copy)]
pub struct Incremental {
    /// The start time's place in the select list; `None` when nothing is
    /// ever in flight (an outbox row is unpublished or published).
    pub started: Option<usize>,
    /// How long after its start a row in flight is looked up on every poll:
    /// `max(overlap, stuck_after)`; later it is stuck, and is looked up in
    /// turn with the other stuck rows ([`in_flight_rounds`]).
    pub horizon: Duration,
}

/// A table source: connection, cursor and the poll transaction.
pub struct TableSource<K: TableKind> {
    spec: TableSpec,
    sql: Sql,
    kind: K,
    conn: Option<AnyConnection>,
    /// The database's shared pool, when the agent gives one (`run`); without
    /// one (`doctor`, `trace`) the source keeps a connection of its own.
    pool: Option<AnyPool>,
    /// Whether the table and columns were checked on the pool's connections.
    schema_checked: bool,
    /// What the last schema check found worth telling (columns left unmapped).
    notes: Vec<String>,
    /// PostgreSQL: whether the rows carry `xmin` (a table, not a view), so
    /// the tail can skip rows an earlier poll read.
    xmin: bool,
    /// PostgreSQL: whether a row version's place (`ctid`) names one row of
    /// the table (a table or a materialized view, not a partitioned table,
    /// whose partitions each number their own), so that the tails can be
    /// merged by place ([`Self::together_query`]). False until the schema
    /// check has read it.
    tids: bool,
    /// How look-ups by event id bind the ids, from the id column's type
    /// (literals until the schema check has read it).
    id_bind: IdBind,
    /// Whether the first (baseline) poll has run.
    started: bool,
    /// Per tailed column ([`TableKind::cursors`]): the highest value read so
    /// far (microseconds), capped at the database's now.
    highs: Vec<Option<i64>>,
    /// When the events log's whole overlap window was last re-read, and the
    /// NULL-cursor scan last ran.
    last_sweep: Option<Instant>,
    /// PostgreSQL: the snapshot xmin of the last poll (see [`Sql::unseen`]).
    poll_xmin: Option<i64>,
    /// The tailed columns are read one by one, page by page, instead of
    /// together ([`TableSource::tail_together`]): the last poll's tails read
    /// a page's worth of rows or more (counted once each where the keys
    /// read are kept).
    apart: bool,
    /// Per tailed column: the re-reads for late commits.
    late: Vec<LateReads>,
    /// The unfinished rows, for the gauges.
    backlog: Backlog,
    /// When the backlog was last checked against the gauge query.
    last_reconcile: Option<Instant>,
    /// Reconciles since the last full one (see [`FULL_RECONCILE_EVERY`]).
    cheap_reconciles: u32,
    /// This poll checks the backlog kept against the table (a count of the
    /// unfinished rows, or their aggregate, every `reconcile_every`): decided
    /// by [`Source::timeout`] as the poll begins, which gives it
    /// `full_read_timeout`, as the count grows with the backlog.
    check_due: Cell<bool>,
    /// The time limit [`Source::timeout`] gave the poll about to begin: the
    /// poll loop asks before the poll, the poll again, and both must agree.
    decided: Cell<Option<Duration>>,
    /// The next poll is a full reconcile ([`TableSource::kept_gauges`]).
    full_due: bool,
    /// Polls begun since the last one that finished: between polls, those
    /// cut short (by their time limit, a lost connection); each doubles the
    /// time the next may take ([`Source::timeout`]).
    begun: u32,
    /// The time limit of the poll under way.
    limit: Duration,
    /// Rows whose change cursor is NULL, which the tail cannot see.
    nulls: NullScan,
    /// Re-reading the unfinished rows on every poll: which were read.
    unfinished: Reread,
    /// `cursor = "events"`: the tail of the events log.
    events: Option<events::EventsTail>,
    /// Without a change cursor: the reads that replace the re-read of every
    /// unfinished row, when the shape allows them.
    incremental: Option<Incremental>,
    /// MariaDB / MySQL: per tailed column, what the look-back and the
    /// late-commit slices need not read in full again ([`ReadPairs`]).
    pairs: Option<Vec<ReadPairs>>,
    /// [`Incremental`]: whether a partial index over the rows in flight
    /// serves [`TableSource::in_flight_query`], which then reads them instead
    /// of their look-ups by id; `None` until a poll has found out.
    in_flight_index: Option<bool>,
    /// MySQL and MariaDB: the index on (status, received_at) that
    /// [`TableSource::in_flight_status_query`] names (`FORCE INDEX`), once
    /// the probe found it serves the read.
    status_index: Option<String>,
    /// The next poll finds that out again: after each schema check, so that
    /// an index created (or dropped) since is found.
    in_flight_probe: bool,
    /// The database's time at the start of the poll under way (µs).
    db_now: i64,
}

/// The scan for rows with a NULL change cursor, a page per sweep: each such
/// row is counted once as rejected (`null_cursor`) while it stays NULL.
#[derive(Debug, Default)]
struct NullScan {
    /// The last event id of the previous page; empty: from the start.
    after: String,
    /// Keys counted, and the keys seen in the current pass over the table:
    /// a key not seen again in a whole pass has left (got a cursor, deleted).
    counted: HashSet<u64>,
    pass: HashSet<u64>,
}

/// The unfinished rows of the last re-read, by key, with their event id:
/// a row that is no longer among them, and was not read by the tail either,
/// is looked up by its id — finished without a trace the tail can follow,
/// or deleted. Each such row's [`Seen`] is kept as its mark in the backlog's
/// map ([`Backlog::set_mark`]), beside the row the gauges are counted from,
/// so that an unfinished row has one entry: 8 bytes and the id's length
/// per unfinished row beside the backlog's row.
#[derive(Debug, Default)]
struct Reread {
    /// The ids of the rows with a mark.
    ids: Ids,
    /// With `finished_rows = "deleted"`: the last unfinished version of each
    /// row with a mark, which a deleted row is counted from (elsewhere the
    /// kind needs nothing of a row that left).
    lasts: KeyMap<Unfinished>,
    /// Numbers the re-reads, to tell the rows of the last one (wrapping: a
    /// row is of the last one or not, so only equality counts).
    pass: u32,
    /// Keys the tail read in the current poll.
    tailed: HashSet<u64>,
    /// [`Incremental`]: the rows in flight (their last read showed them
    /// unfinished and not pending) by key, with their start.
    in_flight: KeyMap<i64>,
    /// [`Incremental`]: the rows in flight started before the horizon are
    /// looked up in turn, those whose key is `turn` modulo `rounds` on each
    /// poll; `rounds` is set anew when a cycle ends ([`in_flight_rounds`]).
    turn: u64,
    rounds: u64,
    /// [`Incremental`] through an index: where the slices of the stuck rows
    /// are in their round ([`TableSource::stuck_slice`],
    /// [`TableSource::check_in_flight`]).
    slices: Slices,
}

/// The slices of the stuck rows' starts (or arrivals) in their round: each
/// poll reads the next ([`next_slice`]), and a round takes at least the
/// polls [`in_flight_rounds`] gave it when it began. A round can end sooner
/// where one time is shared by more rows than a slice's share (a batch
/// claimed by one statement, inserted in one): its slice takes them all, and
/// the round ends a poll later. Without the wait the next round would begin
/// at once, and rows that share a time would be read every other poll
/// instead of about once per `overlap`.
#[derive(Debug, Default)]
struct Slices {
    /// Where the last slice ended; `None`: the next begins a round.
    after: Option<i64>,
    /// The polls left before another round may begin: [`in_flight_rounds`]
    /// when the last one began, less the polls since.
    wait: u64,
}

impl Slices {
    /// The next slice (`lo`, `hi`], as [`next_slice`] makes it; an empty
    /// range while the round's polls have not all passed after its last.
    fn next<I: Iterator<Item = i64>>(
        &mut self,
        rounds: impl FnOnce(usize) -> u64,
        values: impl Fn() -> I,
        end: impl FnOnce(Option<i64>) -> i64,
    ) -> (i64, i64) {
        self.wait = self.wait.saturating_sub(1);
        if self.after.is_none() && self.wait > 0 {
            let end = end(None);
            return (end, end);
        }
        let begins = self.after.is_none();
        let mut len = 0;
        let slice = next_slice(
            &mut self.after,
            |count| {
                len = rounds(count);
                len
            },
            values,
            end,
        );
        if begins {
            self.wait = len;
        }
        slice
    }
}

/// 8 bytes, a row's mark in the backlog's map ([`Seen::mark`]): where its
/// id lies in [`Reread::ids`] (an [`IdRef`], laid out flat so that it packs
/// with the pass), and the re-read that last saw it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Seen {
    at: u32,
    len: u16,
    /// [`Reread::pass`]'s low 16 bits. Only equality with the current pass
    /// counts. A row of an older pass is looked up and forgotten at the
    /// re-read's end ([`TableSource::look_up_gone`]); only if 65,536 polls
    /// in a row were cut short between a re-read and its look-ups could an
    /// old pass be taken for the current one, and the next re-read looks
    /// the row up then.
    pass: u16,
}

impl Seen {
    fn new(id: IdRef, pass: u32) -> Seen {
        Seen {
            at: id.at,
            len: id.len,
            pass: pass as u16,
        }
    }

    fn id(&self) -> IdRef {
        IdRef {
            at: self.at,
            len: self.len,
        }
    }

    /// As the backlog keeps it. Never [`NO_MARK`]: that would be a long id
    /// ([`LONG_ID`]) at byte `u32::MAX`, past the 4 GiB [`Ids::push`] keeps.
    fn mark(self) -> Mark {
        let mark = u64::from(self.at) | u64::from(self.len) << 32 | u64::from(self.pass) << 48;
        debug_assert_ne!(mark, NO_MARK);
        mark
    }

    fn of_mark(mark: Mark) -> Seen {
        Seen {
            at: mark as u32,
            len: (mark >> 32) as u16,
            pass: (mark >> 48) as u16,
        }
    }

    /// Marks the row seen by re-read `pass`.
    fn see(&mut self, pass: u32) {
        self.pass = pass as u16;
    }

    /// Whether the row was seen by re-read `pass`.
    fn of(&self, pass: u32) -> bool {
        self.pass == pass as u16
    }
}

/// Where an id lies in [`Ids`]. An id of [`LONG_ID`] bytes or more has its
/// length in [`LONG_PREFIX`] bytes before it, and `len` is [`LONG_ID`].
#[derive(Debug, Clone, Copy)]
struct IdRef {
    at: u32,
    len: u16,
}

/// The `len` of an [`IdRef`] whose length is stored in [`Ids`].
const LONG_ID: u16 = u16::MAX;
/// The bytes of a long id's length in [`Ids`]: 7 bits each, 35 in all.
const LONG_PREFIX: usize = 5;

/// The event ids of the rows with a mark ([`Reread`]), end to end in one buffer:
/// an id costs its length, where a `Box<str>` of its own costs a 16-byte
/// pointer and an allocation of at least 32 bytes (200,000 ids of 11 bytes:
/// 2.2 MB instead of 9.6). An id forgotten leaves a gap, and when the gaps
/// are more than a quarter of the buffer the ids still in use are moved
/// down over them, in place ([`Reread::compact_if_due`]).
#[derive(Debug, Default)]
struct Ids {
    bytes: String,
    /// Bytes of `bytes` no row refers to any more.
    gaps: usize,
}

impl Reread {
    /// The event id of a row with a mark.
    fn id(&self, s: &Seen) -> &str {
        self.ids.get(s.id())
    }

    /// The rows of `keys` that have a mark in `rows`, with their ids.
    fn with_ids<'a>(
        &self,
        rows: &Backlog,
        keys: impl Iterator<Item = &'a u64>,
    ) -> Vec<(u64, Box<str>)> {
        keys.filter_map(|k| {
            rows.mark(*k)
                .map(|m| (*k, self.id(&Seen::of_mark(m)).into()))
        })
        .collect()
    }

    /// Tracks a row not tracked yet, read in `pass`.
    fn remember(&mut self, rows: &mut Backlog, key: u64, id: &str, pass: u32) {
        if let Some(id) = self.ids.push(id) {
            rows.set_mark(key, Seen::new(id, pass).mark());
        }
    }

    /// Forgets a row; returns its last version if one was kept.
    fn forget(&mut self, rows: &mut Backlog, key: &u64) -> Option<Unfinished> {
        if let Some(m) = rows.remove_mark(*key) {
            self.ids.forget(Seen::of_mark(m).id());
        }
        self.in_flight.remove(key);
        let last = self.lasts.remove(key);
        self.compact_if_due(rows);
        last
    }

    /// Forgets every row.
    fn forget_all(&mut self, rows: &mut Backlog) {
        rows.clear_marks();
        self.lasts.clear();
        self.in_flight.clear();
        self.ids = Ids::default();
    }

    /// Keeps the rows read in `pass` only (their last versions and whether
    /// they are in flight, not: see [`TableSource::look_up_gone`]).
    fn keep_pass(&mut self, rows: &mut Backlog, pass: u32) {
        let ids = &mut self.ids;
        rows.retain_marks(|_, m| {
            let s = Seen::of_mark(*m);
            let keep = s.of(pass);
            if !keep {
                ids.forget(s.id());
            }
            keep
        });
        self.compact_if_due(rows);
    }

    /// Moves the ids still in use down over the gaps when these are a
    /// quarter of the buffer, in place and in their order: a copy into a
    /// new buffer held both at once, at 200,000 ids of 12 bytes 2.4 MB more
    /// on top of a buffer twice that. What it needs beside the buffer is a
    /// bit a byte (which bytes are in use) and a count every 512 bytes.
    fn compact_if_due(&mut self, rows: &mut Backlog) {
        if !self.ids.fragmented() {
            return;
        }
        let ids = &mut self.ids;
        let len = ids.bytes.len();
        let mut used = vec![0u64; len.div_ceil(64)];
        for (_, m) in rows.marks() {
            let r = Seen::of_mark(m).id();
            let at = r.at as usize;
            set_bits(&mut used, at..at + ids.span(r).1);
        }
        let rank = Rank::new(&used);
        let mut bytes = std::mem::take(&mut ids.bytes).into_bytes();
        let mut to = 0;
        for run in runs(&used, len) {
            let n = run.len();
            bytes.copy_within(run, to);
            to += n;
        }
        bytes.truncate(to);
        bytes.shrink_to_fit();
        ids.bytes = String::from_utf8(bytes).expect("whole ids, each UTF-8, end to end");
        ids.gaps = 0;
        rows.retain_marks(|_, m| {
            let mut s = Seen::of_mark(*m);
            s.at = u32::try_from(rank.before(s.at as usize)).expect("fewer bytes than before");
            *m = s.mark();
            true
        });
    }
}

/// Sets the bits of `range` in `bits` (bit `i` is bit `i % 64` of word
/// `i / 64`).
fn set_bits(bits: &mut [u64], range: std::ops::Range<usize>) {
    for i in range {
        bits[i / 64] |= 1 << (i % 64);
    }
}

/// The runs of set bits in the first `len` bits of `bits`, in order.
fn runs(bits: &[u64], len: usize) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let bit = move |i: usize| i < len && bits[i / 64] & (1 << (i % 64)) != 0;
    let mut at = 0;
    std::iter::from_fn(move || {
        // Whole words of clear bits are passed at once.
        while at < len && !bit(at) {
            if at % 64 == 0 && bits[at / 64] == 0 {
                at += 64;
            } else {
                at += 1;
            }
        }
        if at >= len {
            return None;
        }
        let start = at;
        while bit(at) {
            if at % 64 == 0 && bits[at / 64] == u64::MAX && at + 64 <= len {
                at += 64;
            } else {
                at += 1;
            }
        }
        Some(start..at)
    })
}

/// How many bits of a bit set lie before a place: a count every eight words,
/// and the words after it counted when asked.
struct Rank<'a> {
    bits: &'a [u64],
    blocks: Vec<usize>,
}

impl<'a> Rank<'a> {
    fn new(bits: &'a [u64]) -> Self {
        let mut blocks = Vec::with_capacity(bits.len().div_ceil(8));
        let mut n = 0;
        for block in bits.chunks(8) {
            blocks.push(n);
            n += block.iter().map(|w| w.count_ones() as usize).sum::<usize>();
        }
        blocks.push(n);
        Rank { bits, blocks }
    }

    /// The set bits before bit `i`.
    fn before(&self, i: usize) -> usize {
        let (word, block) = (i / 64, i / 512);
        let whole: usize = self.bits[block * 8..word]
            .iter()
            .map(|w| w.count_ones() as usize)
            .sum();
        let part = self
            .bits
            .get(word)
            .map_or(0, |w| (w & ((1u64 << (i % 64)) - 1)).count_ones() as usize);
        self.blocks[block] + whole + part
    }
}

/// Below this many bytes the buffer is never compacted.
const IDS_COMPACT_FROM: usize = 64 * 1024;

impl Ids {
    /// Where the id of `r` lies in `bytes`, and the bytes it takes there.
    fn span(&self, r: IdRef) -> (std::ops::Range<usize>, usize) {
        let at = r.at as usize;
        if r.len < LONG_ID {
            let len = usize::from(r.len);
            return (at..at + len, len);
        }
        let prefix = &self.bytes.as_bytes()[at..at + LONG_PREFIX];
        let len = prefix
            .iter()
            .rev()
            .fold(0usize, |n, b| (n << 7) | usize::from(*b));
        (at + LONG_PREFIX..at + LONG_PREFIX + len, LONG_PREFIX + len)
    }

    fn get(&self, r: IdRef) -> &str {
        &self.bytes[self.span(r).0]
    }

    /// Stores `id`; `None` if the buffer would pass 4 GiB (the row is then
    /// not tracked by id, as over `max_tracked_events`). An id of
    /// [`LONG_ID`] bytes or more follows its length, in [`LONG_PREFIX`]
    /// ASCII bytes of seven bits each (the buffer stays UTF-8).
    fn push(&mut self, id: &str) -> Option<IdRef> {
        let at = u32::try_from(self.bytes.len()).ok()?;
        let n = u32::try_from(id.len()).ok()?;
        let len = u16::try_from(n).ok().filter(|l| *l < LONG_ID);
        let stored = if len.is_some() {
            n
        } else {
            n.checked_add(LONG_PREFIX as u32)?
        };
        at.checked_add(stored)?;
        if len.is_none() {
            for i in 0..LONG_PREFIX {
                self.bytes.push(char::from(((n >> (7 * i)) & 0x7f) as u8));
            }
        }
        self.bytes.push_str(id);
        Some(IdRef {
            at,
            len: len.unwrap_or(LONG_ID),
        })
    }

    fn forget(&mut self, r: IdRef) {
        self.gaps += self.span(r).1;
    }

    /// Whether the gaps are worth a [`Reread::compact_if_due`].
    fn fragmented(&self) -> bool {
        self.bytes.len() >= IDS_COMPACT_FROM && self.gaps * 4 > self.bytes.len()
    }
}

/// MariaDB / MySQL without a change cursor (`cursor = "none"`), which have
/// no `xmin` to tell a row version already read: the (event, value) pairs
/// of one tailed column (`received_at`, `started_at`, `finished_at`) that a
/// poll read in
/// full, by any read, within the look-back and the late-commit slices'
/// reach. Those reads first take only the event id and the value from the
/// column's index (an InnoDB secondary index holds the primary key: with
/// the event id as the key, no row is visited), then read in full only the
/// pairs not read before: a late commit, or a row whose value changed. A
/// pair read before is the row as it was with that value; what changed in it
/// since without moving a time column is for the reads that look rows up
/// (in flight) and the reconcile, as for every row older than the window.
#[derive(Debug, Default)]
struct ReadPairs {
    /// The column's place in the select list.
    at: usize,
    /// The pairs, each as [`pair`]'s 64 bits: 8 bytes a slot.
    set: KeyMap<()>,
    /// The pairs in the order they were first read.
    order: VecDeque<u64>,
    /// Per read: (database time, how many pairs it added to `order`),
    /// oldest first. One entry a poll instead of a time beside every pair.
    reads: VecDeque<(i64, usize)>,
}

/// An (event key, value) pair in 64 bits, 8 bytes instead of 16: the key
/// (already a SipHash of the event id) XOR a bijective mix of the value
/// (splitmix64's, [`keymap::mix`]). Two pairs that share their key or their
/// value never collide; two that share neither do with a chance of 2⁻⁶⁴,
/// the same as two event ids with one key.
fn pair(key: u64, value: i64) -> u64 {
    key ^ keymap::mix((value as u64).wrapping_add(0x9e37_79b9_7f4a_7c15))
}

impl ReadPairs {
    fn insert(&mut self, now: i64, key: u64, value: i64) {
        let p = pair(key, value);
        if self.set.insert(p, ()).is_none() {
            self.order.push_back(p);
            match self.reads.back_mut() {
                Some((at, n)) if *at == now => *n += 1,
                _ => self.reads.push_back((now, 1)),
            }
        }
    }

    fn contains(&self, key: u64, value: i64) -> bool {
        self.set.contains_key(&pair(key, value))
    }

    /// Forgets the pairs read before `before`: their values are older than
    /// any read of the window (a pair forgotten too early is only read in
    /// full again).
    fn prune(&mut self, before: i64) {
        while let Some(&(at, n)) = self.reads.front() {
            if at >= before {
                break;
            }
            self.reads.pop_front();
            for p in self.order.drain(..n) {
                self.set.remove(&p);
            }
        }
    }
}

/// The re-reads that catch a transaction committing later than
/// [`COMMIT_LAG`] after the cursor value it wrote (up to the source's
/// `overlap`). On every poll, for each lag in [`LateReads::lags`] (a third of
/// `overlap`, and `overlap`), the slice of the cursor's range that became
/// that old since the last poll (by the database's clock) is read again: each
/// value is re-read once soon and once at the end of the window. That reads
/// what a sweep of the whole window every third of it would, spread evenly
/// over the polls instead of in a burst every few polls. On PostgreSQL a slice
/// returns only rows written by transactions the tails had not seen
/// ([`Sql::unseen`]); elsewhere every row of the slice, recognised by the map
/// of recently seen events.
#[derive(Debug, Default)]
struct LateReads {
    /// Per lag: the cursor value (microseconds) up to which the slices have
    /// read; set by the baseline poll, which reads the whole window.
    done: [Option<i64>; LATE_LAGS],
    /// PostgreSQL: `(low, snapshot xmin)` of the recent polls' tails, oldest
    /// first. After such a tail, every row of a transaction older than the
    /// xmin with a cursor above the low has been read.
    tails: VecDeque<(i64, i64)>,
}

/// The lags of the late-commit slices ([`LateReads::lags`]).
const LATE_LAGS: usize = 2;

impl LateReads {
    /// The lags of the slices (microseconds), for an overlap and a look-back.
    fn lags(overlap: i64, lookback: i64) -> [i64; LATE_LAGS] {
        [(overlap / 3).max(lookback), overlap]
    }

    /// The snapshot xmin below which the rows above `from` were all read: the
    /// latest tail that read from `from` or lower; 0 (every row) if none did.
    fn seen_before(&self, from: i64) -> i64 {
        self.tails
            .iter()
            .rev()
            .find(|(low, _)| *low <= from)
            .map_or(0, |(_, xmin)| *xmin)
    }

    /// Forgets the tails no slice needs: all before the latest one that read
    /// from the lowest slice start or lower.
    fn prune(&mut self) {
        let Some(from) = self.done.iter().flatten().min().copied() else {
            return;
        };
        if let Some(k) = self.tails.iter().rposition(|(low, _)| *low <= from) {
            self.tails.drain(..k);
        }
        while self.tails.len() > MAX_TAILS_KEPT {
            self.tails.pop_front();
        }
    }
}

/// A bound on [`LateReads::tails`]: a poll interval far below a second over a
/// long overlap. Dropping the oldest only makes a slice return more rows.
const MAX_TAILS_KEPT: usize = 4096;

/// Every this many reconciles the full aggregate runs even when the count of
/// unfinished rows agrees with the backlog kept (see
/// [`TableSource::kept_gauges`]).
const FULL_RECONCILE_EVERY: u32 = 10;

/// Event ids per lookup query of the rows that left the unfinished ones.
const LOOKUP_CHUNK: usize = 512;

/// The size a look-up's list of `n` ids is padded to: the next power of two
/// (at most [`LOOKUP_CHUNK`]), so that ten statements serve every list.
fn lookup_size(n: usize) -> usize {
    n.next_power_of_two().min(LOOKUP_CHUNK)
}

/// About how many of the rows in flight started before the horizon one poll
/// looks up at most ([`in_flight_rounds`]). Each costs about 8 µs of
/// PostgreSQL time (its index entry and a heap page of its own:
/// docs/performance.md, "Stuck rows looked up in turn"); past this many, a
/// round takes longer, and the full reconcile (whose aggregate by status a
/// stuck row's failure changes) bounds how late one is seen.
const STUCK_PER_POLL: usize = 100;

impl<K: TableKind> TableSource<K> {
    /// A source that connects on its first poll.
    pub fn new(spec: TableSpec, kind: K) -> Self {
        let sql = Sql {
            dialect: spec.dsn.dialect(),
        };
        let cursors = kind.cursors().len();
        // Without a change cursor only: a change cursor written at a coarse
        // resolution (DATETIME's seconds) keeps one value over several
        // versions of a row, which the look-back re-reads.
        let pairs = (sql.dialect == Dialect::MySql && spec.cursor == Cursor::None).then(|| {
            kind.cursors()
                .into_iter()
                .map(|(_, at)| ReadPairs {
                    at,
                    ..ReadPairs::default()
                })
                .collect()
        });
        let incremental = kind.incremental().filter(|_| spec.rereads_unfinished());
        let events = spec.events.clone().map(|spec| events::EventsTail {
            spec,
            window: events::IdWindow::default(),
        });
        TableSource {
            backlog: Backlog::new(spec.max_tracked_events),
            spec,
            sql,
            kind,
            conn: None,
            pool: None,
            schema_checked: false,
            notes: Vec::new(),
            xmin: sql.snapshot_xmin().is_some(),
            tids: false,
            id_bind: IdBind::Literals,
            started: false,
            highs: vec![None; cursors],
            last_sweep: None,
            poll_xmin: None,
            apart: false,
            late: (0..cursors).map(|_| LateReads::default()).collect(),
            last_reconcile: None,
            cheap_reconciles: 0,
            check_due: Cell::new(false),
            decided: Cell::new(None),
            full_due: false,
            begun: 0,
            limit: Duration::ZERO,
            nulls: NullScan::default(),
            unfinished: Reread::default(),
            events,
            incremental,
            pairs,
            in_flight_index: None,
            status_index: None,
            in_flight_probe: true,
            db_now: 0,
        }
    }

    /// Polls on connections of `pool` (one pool per database, shared by its
    /// sources) instead of a connection of its own.
    pub fn with_pool(mut self, pool: AnyPool) -> Self {
        self.pool = Some(pool);
        self
    }

    /// The SQL dialect of the source's database.
    pub fn sql(&self) -> Sql {
        self.sql
    }

    /// What connecting needs, detached from the source so that no borrow of
    /// it (and of its connection) is held across the connect.
    pub fn opener(&self) -> Opener {
        Opener {
            spec: self.spec.clone(),
            sql: self.sql,
            columns: self.kind.columns(),
            event_id: self.kind.event_id().to_string(),
            unmapped: self.kind.unmapped_meanings(),
        }
    }

    /// The select list of every query that reads rows.
    fn select_list(&self) -> String {
        let list: Vec<String> = self
            .kind
            .select_list(&self.sql)
            .into_iter()
            .map(|(_, e)| e)
            .collect();
        list.join(", ")
    }

    /// The tail of one watermarked column: rows after a value, in the
    /// column's index order (no sort), a page of `batch_size` rows.
    fn tail_query(&self, column: &str) -> String {
        let col = self.sql.ident(column);
        let unseen = self.unseen(&col);
        format!(
            "SELECT {} FROM {} WHERE {}{unseen} ORDER BY {col} {}",
            self.select_list(),
            self.sql.table(&self.spec.table),
            self.sql.after(&col, 1),
            self.sql.limit(self.spec.batch_size),
        )
    }

    /// The tails of every watermarked column in one statement: each
    /// column's rows after its value (`$1`…`$n`, in [`TableKind::cursors`]'s
    /// order; PostgreSQL: only those after its high-water mark `$n+1`… or of
    /// a transaction not older than the xmin `$2n+1`), a page of each in
    /// the column's index order as [`Self::tail_query`] reads it, merged (on
    /// PostgreSQL by the TID scan of their places, elsewhere by a `UNION`):
    /// a row that moved several columns since the last poll
    /// (arrived, started and finished within it) is sent once instead of
    /// once per column, and the poll makes one round trip instead of one per
    /// column. Each part keeps its own index range scan, which is also the
    /// generic plan every statement of the agent's PostgreSQL sessions runs
    /// ([`Sql::optional_setup`]); a `WHERE` of the columns' ranges joined by
    /// `OR` is planned generically as a scan of the whole table.
    fn together_query(&self) -> String {
        let cursors = self.kind.cursors();
        let n = cursors.len();
        let table = self.sql.table(&self.spec.table);
        // A part's rows: on PostgreSQL only their places (`ctid`), so that
        // the scan merges 6-byte row versions and each version is then
        // read once, by its place, under the statement's one snapshot
        // (`ctid = ANY`: a TID scan of exactly those versions). Merging the
        // rows themselves hashed every column of every part's row, and read
        // a row that several parts hold once per part: at 2,000 changes/s,
        // 1,994 rows for 822 (docs/performance.md, "The stuck rows as ids and
        // statuses, and the tails merged by row version"). Two rows whose
        // columns compare equal (ids equal under a non-deterministic
        // collation) stay two.
        // Set only for a table or materialized view, which carry `xmin`.
        let tids = self.tids;
        let what = if tids {
            "ctid".to_string()
        } else if self.xmin {
            // A partitioned table: the rows, with their place as text, so
            // that the `UNION` merges only a version several parts read.
            format!("{}, CAST(ctid AS TEXT)", self.select_list())
        } else {
            self.select_list()
        };
        let parts: Vec<String> = cursors
            .iter()
            .enumerate()
            .map(|(i, (column, _))| {
                let col = self.sql.ident(column);
                let unseen = self
                    .sql
                    .unseen(&col, n + i + 1, 2 * n + 1)
                    .filter(|_| self.xmin)
                    .map_or(String::new(), |u| format!(" AND {u}"));
                format!(
                    "SELECT * FROM (SELECT {what} FROM {table} WHERE {}{unseen} ORDER BY {col} {}) \
                     AS tail{i}",
                    self.sql.after(&col, i + 1),
                    self.sql.limit(self.spec.batch_size),
                )
            })
            .collect();
        if tids {
            // `UNION ALL`: the TID scan sorts its list of places and drops
            // the repeated ones itself (a list of places has OR semantics),
            // so a `UNION` only hashed them a second time, in a table sized
            // for every part's full page (793 kB at a `batch_size` of 5,000).
            format!(
                "SELECT {} FROM {table} WHERE ctid = ANY(ARRAY({}))",
                self.select_list(),
                parts.join(" UNION ALL ")
            )
        } else {
            parts.join(" UNION ")
        }
    }

    /// Every row whose watermarked column lies in (`$1`, `$2`]: one value,
    /// the rows of which a full page may have cut (a bulk transaction writes
    /// any number of rows with one `updated_at`: PostgreSQL's `now()` is one
    /// value per transaction). Read whole, streamed, in no order.
    fn ties_query(&self, column: &str) -> String {
        let col = self.sql.ident(column);
        format!(
            "SELECT {} FROM {} WHERE {} AND NOT {}",
            self.select_list(),
            self.sql.table(&self.spec.table),
            self.sql.after(&col, 1),
            self.sql.after(&col, 2),
        )
    }

    /// A page of rows whose change cursor is NULL, after an event id.
    fn null_query(&self, updated_at: &str) -> String {
        let id = self.sql.id_key(&self.sql.ident(self.kind.event_id()));
        format!(
            "SELECT {} FROM {} WHERE {} IS NULL AND {id} > {} ORDER BY {id} {}",
            self.select_list(),
            self.sql.table(&self.spec.table),
            self.sql.ident(updated_at),
            self.sql.id_param(1),
            self.sql.limit(self.spec.batch_size),
        )
    }

    /// Every unfinished row (up to the cap).
    fn seed_query(&self) -> String {
        format!(
            "SELECT {} FROM {} WHERE {} {}",
            self.select_list(),
            self.sql.table(&self.spec.table),
            self.kind.unfinished_filter(&self.sql),
            self.sql.limit(self.spec.max_tracked_events),
        )
    }

    /// The rows of `n` event ids, found by the id column's own index: bound
    /// as [`Sql::id_bind`] says, one statement per `n` (the look-ups pad
    /// their lists to a power of two: [`lookup_size`]); where the ids cannot
    /// be bound, as literals, which each dialect converts to the column's
    /// type.
    fn lookup_query(&self, ids: &[&str]) -> String {
        let column = self.sql.ident(self.kind.event_id());
        let filter = match self.id_bind {
            IdBind::Literals => self.sql.is_in(&column, ids),
            bind => self.sql.id_params(&column, ids.len(), bind),
        };
        format!(
            "SELECT {} FROM {} WHERE {filter}",
            self.select_list(),
            self.sql.table(&self.spec.table),
        )
    }

    /// [`Incremental`], on PostgreSQL and SQLite: the rows in flight whose
    /// start lies in (`$1`, `$2`] (a slice of the stuck ones'), and those
    /// started after `$3` (within the horizon), as two range scans of a
    /// partial index on the start over the rows in flight, joined by `UNION
    /// ALL` (the ranges do not meet). The condition is written as the index's
    /// (`schema --config`), so that the planner, the generic plan included,
    /// takes the index for it. `None` where the kind has no such condition,
    /// and on MySQL, which has no partial indexes.
    fn in_flight_query(&self) -> Option<String> {
        let (filter, started) = self.in_flight_partial()?;
        let part = |range: String| {
            format!(
                "SELECT {} FROM {} WHERE {filter} AND {range}",
                self.select_list(),
                self.sql.table(&self.spec.table),
            )
        };
        // The slice at most a page, in the start's order: its bounds come
        // from the rows the agent tracks, and over `max_tracked_events` many
        // more rows in flight may lie between two tracked starts. A tracked
        // row a full page cut off is looked up by id.
        let slice = part(format!(
            "{} AND {}",
            self.sql.after(&started, 1),
            self.sql.at_most(&started, 2)
        ));
        Some(format!(
            "SELECT * FROM ({slice} ORDER BY {started} {}) AS stuck UNION ALL {}",
            self.sql.limit(self.spec.batch_size),
            part(self.sql.after(&started, 3)),
        ))
    }

    /// On PostgreSQL and SQLite with an [`Incremental`] plan: the condition
    /// of the rows in flight, as the partial index over them holds it, and
    /// their start column, quoted. `None` on MySQL, which has no partial
    /// indexes, or where the kind has no such condition.
    fn in_flight_partial(&self) -> Option<(String, String)> {
        if self.incremental.is_none() || self.sql.dialect == Dialect::MySql {
            return None;
        }
        let (filter, started) = self.kind.in_flight(&self.sql)?;
        Some((filter, self.sql.ident(&started)))
    }

    /// The select list of a read of the stuck rows' ids and statuses alone:
    /// the event id's and the status word's expressions, as the full select
    /// list has them.
    fn id_and_status(&self) -> Option<String> {
        let list = self.kind.select_list(&self.sql);
        let expr = |name: &str| {
            list.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, e)| e.as_str())
        };
        Some(format!("{}, {}", expr("event_id")?, expr("status")?))
    }

    /// [`Self::in_flight_query`]'s two ranges as statements of their own,
    /// for [`Self::check_stuck`]: the slice of the stuck rows' starts
    /// (`$1`, `$2`] as each row's event id and status word alone, at most a
    /// page in the start's order, and the rows started after `$1` in full.
    /// The same condition and ranges, so the same partial index serves them.
    fn in_flight_parts(&self) -> Option<(String, String)> {
        let (filter, started) = self.in_flight_partial()?;
        let table = self.sql.table(&self.spec.table);
        let stuck = format!(
            "SELECT {} FROM {table} WHERE {filter} AND {} AND {} ORDER BY {started} {}",
            self.id_and_status()?,
            self.sql.after(&started, 1),
            self.sql.at_most(&started, 2),
            self.sql.limit(self.spec.batch_size),
        );
        let recent = format!(
            "SELECT {} FROM {table} WHERE {filter} AND {}",
            self.select_list(),
            self.sql.after(&started, 1),
        );
        Some((stuck, recent))
    }

    /// [`Incremental`] on MySQL and MariaDB, which have no partial indexes:
    /// the rows in flight received in (`$1`, `$2`], each as its event id and
    /// status word alone, at most a page. The index on (status, received_at)
    /// that `schema` prints holds both (an InnoDB secondary index carries the
    /// primary key, the event id), so the range is read from the index
    /// without visiting a row: a stuck row is checked at the cost of an
    /// index entry, and only one whose status changed, or that left the
    /// rows in flight, is then read in full by id
    /// ([`Self::check_in_flight`]). `None` elsewhere, or where the kind has
    /// no such condition.
    fn in_flight_status_query(&self) -> Option<String> {
        if self.incremental.is_none() || self.sql.dialect != Dialect::MySql {
            return None;
        }
        let (filter, _) = self.kind.in_flight(&self.sql)?;
        let received = self.sql.ident(&self.kind.received_column()?);
        // The index named, once found: the optimizer would otherwise weigh
        // each slice's range anew, and may take the one on `received_at`
        // alone, which visits every row.
        let force = self.status_index.as_deref().map_or(String::new(), |i| {
            format!(" FORCE INDEX ({})", self.sql.ident(i))
        });
        Some(format!(
            "SELECT {} FROM {}{force} WHERE {filter} AND {} AND {} {}",
            self.id_and_status()?,
            self.sql.table(&self.spec.table),
            self.sql.after(&received, 1),
            self.sql.at_most(&received, 2),
            self.sql.limit(self.spec.batch_size),
        ))
    }

    /// MySQL and MariaDB: the index through which
    /// [`Self::in_flight_status_query`] reads, which it then names: an index
    /// whose first two columns are the status and `received_at` (as
    /// `schema` prints it), found in `information_schema`, and through which
    /// the server's plan for the statement is one range scan that needs no
    /// row (`Using index`: the event id is in the index, as the primary key
    /// of an InnoDB table is). `None` when none does (or there is no
    /// query): the stuck rows in flight are then looked up by id, in turn.
    async fn in_flight_status_index(
        &mut self,
        conn: &mut AnyConnection,
    ) -> Result<Option<String>, sqlx::Error> {
        self.status_index = None;
        let (Some(_), Some(received), Some(status)) = (
            self.in_flight_status_query(),
            self.kind.received_column(),
            self.kind.status_column(),
        ) else {
            return Ok(None);
        };
        let (schema, bare) = sql::split_table(&self.spec.table);
        let columns: Vec<(String, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT CAST(index_name AS CHAR), CAST(column_name AS CHAR) FROM \
             information_schema.statistics WHERE table_schema = {} AND table_name = {} \
             AND seq_in_index <= 2 ORDER BY index_name, seq_in_index",
            schema.map_or("DATABASE()".to_string(), |s| self.sql.literal(s)),
            self.sql.literal(bare)
        )))
        .fetch_all(&mut *conn)
        .await?;
        let same = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
        // A name the statement could not quote as it stands is not taken.
        let found = columns.windows(2).find_map(|w| {
            let ((i, first), (j, second)) = (&w[0], &w[1]);
            (i == j && !i.contains('`') && same(first, &status) && same(second, &received))
                .then(|| i.clone())
        });
        let Some(index) = found else {
            return Ok(None);
        };
        self.status_index = Some(index.clone());
        let query = self
            .in_flight_status_query()
            .expect("the statement exists, as above");
        // A range of the last day: the plan of a slice of the stuck rows.
        // With the bounds written out and not prepared: MariaDB 10.11
        // reports a prepared EXPLAIN, executed again after the statement
        // itself ran, as `Using index condition`.
        let now = sql::wall_clock_micros();
        let day = 86_400 * 1_000_000;
        let mut explain = format!("EXPLAIN {query}");
        for bound in [now - day, now] {
            let literal = self.sql.cursor_literal(bound);
            explain = explain.replacen(
                "TIMESTAMPADD(MICROSECOND, ?,",
                &format!("TIMESTAMPADD(MICROSECOND, {literal},"),
                1,
            );
        }
        let plan = sqlx::raw_sql(sqlx::AssertSqlSafe(explain))
            .fetch_all(&mut *conn)
            .await;
        let plan = plan.inspect_err(|_| self.status_index = None)?;
        let served = match plan.as_slice() {
            [row] => {
                let text = |name: &str| -> Option<String> {
                    row.try_get::<Option<String>, _>(name).ok().flatten()
                };
                let covered = text("Extra")
                    .is_some_and(|extra| extra.split(';').any(|part| part.trim() == "Using index"));
                text("type").as_deref() == Some("range")
                    && covered
                    && text("key").is_some_and(|k| same(&k, &index))
            }
            _ => false,
        };
        if !served {
            self.status_index = None;
            return Ok(None);
        }
        Ok(Some(index))
    }

    /// The partial index through which [`Self::in_flight_query`] reads the
    /// rows in flight, by the plan the agent's sessions run (PostgreSQL: the
    /// generic plan of the prepared statement; SQLite: its query plan): each
    /// scan of the table uses a partial index whose first column is the
    /// start. `None` when no such index serves it (or there is no query):
    /// the rows in flight are then looked up by id. `&mut self`, as
    /// [`Self::fetch_by_ids`] says.
    pub(crate) async fn in_flight_index(
        &mut self,
        conn: &mut AnyConnection,
    ) -> Result<Option<String>, sqlx::Error> {
        if self.sql.dialect == Dialect::MySql {
            return self.in_flight_status_index(conn).await;
        }
        let Some(query) = self.in_flight_query() else {
            return Ok(None);
        };
        let Some((filter, started)) = self.kind.in_flight(&self.sql) else {
            return Ok(None);
        };
        let table = self.sql.literal(&self.sql.table(&self.spec.table));
        let (_, bare) = sql::split_table(&self.spec.table);
        let (partial, plan): (Vec<String>, Vec<String>) = match self.sql.dialect {
            Dialect::Postgres => {
                let partial = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT CAST(c.relname AS TEXT) FROM pg_index i \
                     JOIN pg_class c ON c.oid = i.indexrelid \
                     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
                     WHERE i.indrelid = to_regclass({table}) AND i.indpred IS NOT NULL \
                     AND a.attname = {}",
                    self.sql.literal(&started)
                )))
                .fetch_all(&mut *conn)
                .await?;
                // One transaction, so that a pooler hands all three to one
                // server connection; a name of its own, as a statement whose
                // EXPLAIN failed stays prepared (PREPARE is not undone).
                static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let name = format!(
                    "inboxwatch_in_flight_{}_{}",
                    std::process::id(),
                    PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                );
                let mut tx = conn.begin().await?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("PREPARE {name} AS {query}")))
                    .execute(&mut *tx)
                    .await?;
                let plan = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "EXPLAIN EXECUTE {name}(0, 0, 0)"
                )))
                .fetch_all(&mut *tx)
                .await;
                if plan.is_ok() {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DEALLOCATE {name}")))
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                let plan = plan?
                    .iter()
                    .map(|r| r.try_get::<String, _>(0).unwrap_or_default())
                    .collect();
                (partial, plan)
            }
            Dialect::Sqlite => {
                // SQLite uses a partial index only where the query holds its
                // condition word for word, and names no filter in its plan:
                // only an index over the rows in flight themselves counts.
                let partial = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT l.name FROM pragma_index_list({}) AS l, pragma_index_info(l.name) AS i, \
                     sqlite_master AS m WHERE l.partial = 1 AND i.seqno = 0 AND i.name = {} \
                     AND m.type = 'index' AND m.name = l.name AND instr(m.sql, {}) > 0",
                    self.sql.literal(bare),
                    self.sql.literal(&started),
                    self.sql.literal(&format!("WHERE {filter}")),
                )))
                .fetch_all(&mut *conn)
                .await?;
                let zero = self.sql.cursor(0);
                let mut q = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {query}")));
                for _ in 0..3 {
                    q = bind(q, zero.clone());
                }
                let plan = q
                    .fetch_all(&mut *conn)
                    .await?
                    .iter()
                    .map(|r| r.try_get::<String, _>(3).unwrap_or_default())
                    .collect();
                (partial, plan)
            }
            Dialect::MySql => return Ok(None),
        };
        Ok(plan_uses(&plan, &partial, bare, self.sql.dialect))
    }

    /// Finds out, once after each schema check, whether a partial index
    /// serves the read of the rows in flight, and says so when that changes.
    async fn probe_in_flight(&mut self, conn: &mut AnyConnection) {
        self.in_flight_probe = false;
        let mysql = self.in_flight_status_query().is_some();
        if self.in_flight_query().is_none() && !mysql {
            return;
        }
        let found = match self.in_flight_index(conn).await {
            Ok(found) => found,
            Err(e) => {
                warn!(source = %self.spec.name, error = %e, "Finding the index of the rows in flight failed: they are looked up by id.");
                None
            }
        };
        let served = found.is_some();
        if self.in_flight_index != Some(served) {
            match found {
                // The name is the database's: escaped for the terminal.
                Some(index) if mysql => {
                    let index = crate::text::printable(&index);
                    info!(source = %self.spec.name, %index, "The stuck rows in flight are checked through the index on (status, received_at), without reading them; only those that changed are looked up by id.")
                }
                Some(index) => {
                    let index = crate::text::printable(&index);
                    info!(source = %self.spec.name, %index, "The rows in flight are read through a partial index. While every unfinished row is kept, the stuck ones are read as ids and statuses, and looked up by id only when they changed.")
                }
                None if mysql => {
                    info!(source = %self.spec.name, "The rows in flight are looked up by id, one index look-up each: no index on (status, received_at) holds their ids and statuses (inboxwatch schema --config prints it).")
                }
                None => {
                    info!(source = %self.spec.name, "The rows in flight are looked up by id, one index look-up each: no partial index on the start over them serves their read (inboxwatch schema --config prints it).")
                }
            }
        }
        self.in_flight_index = Some(served);
    }

    /// Takes what [`Opener::open`] found of the table.
    pub fn set_checked(&mut self, checked: Checked) {
        self.in_flight_probe = true;
        self.xmin = checked.xmin;
        self.tids = checked.tids;
        self.id_bind = checked.id_bind;
        if checked.notes != self.notes {
            for note in &checked.notes {
                warn!(source = %self.spec.name, "{note}.");
            }
            self.notes = checked.notes;
        }
    }

    /// The condition of the unfinished rows, for `doctor`'s estimate.
    pub fn unfinished_filter(&self) -> String {
        self.kind.unfinished_filter(&self.sql)
    }

    /// The queries one poll runs, for `doctor`'s EXPLAIN: (what, SQL, whether
    /// it binds the cursor as its first parameter).
    pub fn queries(&self) -> Vec<(String, String, bool)> {
        let mut out: Vec<(String, String, bool)> = self
            .kind
            .cursors()
            .into_iter()
            .map(|(col, _)| (format!("tail on {col}"), self.tail_query(&col), true))
            .collect();
        if let Some(tail) = &self.events {
            out.push((
                format!("tail of {}", tail.spec.table),
                tail.spec
                    .tail_query(&self.sql, &self.spec.table, self.spec.batch_size),
                true,
            ));
        }
        let seed = self.seed_query();
        if self.rereads_every_poll() {
            out.push(("unfinished rows".into(), seed, false));
        } else {
            out.push(("gauges".into(), self.kind.gauge_query(&self.sql, 0), false));
            out.push(("seed".into(), seed, false));
        }
        if let Some(parked) = self.kind.parked_query(&self.sql) {
            out.push(("parked rows".into(), parked, false));
        }
        if let Some(in_flight) = self
            .in_flight_query()
            .or_else(|| self.in_flight_status_query())
        {
            out.push((doctor::IN_FLIGHT.into(), in_flight, true));
        }
        out
    }

    /// Whether every poll re-reads every unfinished row: without a change
    /// cursor (or with deleted rows) when the shape allows no [`Incremental`].
    pub fn rereads_every_poll(&self) -> bool {
        self.spec.rereads_unfinished() && self.incremental.is_none()
    }

    /// What each poll reads, in words, for `run`'s start line, `doctor` and
    /// the status API: the mode first (`cursor = "none": …`).
    pub fn reads(&self) -> String {
        let mut tails: Vec<String> = self.kind.cursors().into_iter().map(|(c, _)| c).collect();
        let last = tails.pop().unwrap_or_default();
        let tails = if tails.is_empty() {
            last
        } else {
            format!("{} or {last}", tails.join(", "))
        };
        let every = humantime::format_duration(self.spec.reconcile_every);
        let mut mode = format!("cursor = \"{}\"", self.spec.cursor.as_str());
        if self.spec.finished_rows == FinishedRows::Deleted {
            mode.push_str(", finished_rows = \"deleted\"");
        }
        if let Some(tail) = &self.events {
            return format!(
                "{mode}: each poll reads the events of {} added since the last one, and every \
                 unfinished row for the gauges",
                tail.spec.table
            );
        }
        if self.rereads_every_poll() {
            let why = self
                .kind
                .why_every_unfinished_row()
                .map_or(String::new(), |w| format!(" ({w})"));
            return format!(
                "{mode}: each poll reads the rows whose {tails} passed its watermark, and every \
                 unfinished row, O(backlog){why}"
            );
        }
        match self.incremental {
            Some(i) => format!(
                "{mode}: each poll reads the rows whose {tails} passed its watermark{}; every \
                 unfinished row only when the reconcile every {every} finds the kept backlog \
                 differs",
                if self.in_flight_query().is_some() {
                    ", and reads the rows in flight through the partial index on their start \
                     (the stuck ones as ids and statuses, looked up by id only when they \
                     changed; all by id where no index serves them)"
                } else if self.in_flight_status_query().is_some() {
                    ", and looks up the rows in flight by id (the stuck ones only when the \
                     index on (status, received_at) shows they changed, where it serves)"
                } else if i.started.is_some() {
                    ", and looks up the rows in flight by id"
                } else {
                    ""
                },
            ),
            None => format!(
                "{mode}: each poll reads the rows whose {tails} passed its watermark; the \
                 unfinished rows are counted every {every}"
            ),
        }
    }

    async fn poll_once(&mut self) -> Result<PollStats, SourceError> {
        if let Some(pool) = self.pool.clone() {
            let conn = session(&self.spec, &pool).await?;
            return self.poll_pooled(conn).await;
        }
        // The connection is taken for the poll and put back only when it
        // succeeds: a failed poll leaves none, so the next one reconnects.
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => {
                let (conn, checked) = self.opener().open().await?;
                self.set_checked(checked);
                conn
            }
        };
        let stats = self.poll_on(&mut conn).await?;
        self.conn = Some(conn);
        Ok(stats)
    }

    /// One poll on a session of the pool, closed instead of handed back when
    /// the poll fails.
    async fn poll_pooled(
        &mut self,
        conn: sqlx::pool::PoolConnection<sqlx::Any>,
    ) -> Result<PollStats, SourceError> {
        let mut held = Held { conn, ok: false };
        let conn = &mut held.conn;
        let result = async {
            if !self.schema_checked {
                let checked = self.opener().check_schema(&mut *conn).await?;
                self.set_checked(checked);
                self.schema_checked = true;
            }
            self.poll_on(&mut *conn).await
        }
        .await;
        if result.is_err() {
            self.schema_checked = false;
        }
        held.ok = result.is_ok();
        result
    }

    async fn poll_on(&mut self, conn: &mut AnyConnection) -> Result<PollStats, SourceError> {
        // A poll that reads every unfinished row (the first, a full
        // reconcile) may take `full_read_timeout`: its statements too.
        let full = self.full_due;
        let limit = self.limit;
        let long = limit > self.spec.timeout;
        if long {
            set_statement_timeout(conn, self.sql, limit)
                .await
                .map_err(query_error)?;
        }
        // Replays first: a replayed event the poll then finds dead died
        // again (a replay commits with its audit row). Outside the
        // transaction, so that a missing audit table does not abort it.
        if let Some((query, since)) = self.kind.replays_query() {
            let query = query.to_string();
            let read = bind(
                sqlx::query(sqlx::AssertSqlSafe(query)),
                self.sql.cursor(since),
            )
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| self.spec.dsn.scrub(&e.to_string()));
            self.kind.replays(read);
        }
        if self.in_flight_probe && self.incremental.is_some() {
            self.probe_in_flight(conn).await;
        }
        let mut tx = conn.begin().await.map_err(query_error)?;
        let now_row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {}, {}",
            self.sql.now_micros(),
            self.sql.snapshot_xmin().unwrap_or("0")
        )))
        .fetch_one(&mut *tx)
        .await
        .map_err(query_error)?;
        let db_now: i64 = now_row.try_get(0).map_err(query_error)?;
        let snapshot_xmin: i64 = now_row.try_get(1).map_err(query_error)?;
        self.db_now = db_now;
        let reach = pairs_reach(&self.spec);
        if let Some(pairs) = &mut self.pairs {
            for p in pairs.iter_mut() {
                p.prune(db_now.saturating_sub(reach));
            }
        }
        self.kind.begin(db_now);
        // Every poll looks back COMMIT_LAG, which catches ordinary commit
        // latency at once; the rare transaction that commits later still is
        // caught by the slices of LateReads (the events log: by a sweep of the
        // whole window every third of it). Reads stay proportional to the
        // change rate, not to overlap / interval.
        let sweep_every = (self.spec.overlap / 3).max(self.spec.poll_interval);
        let sweep = self.last_sweep.is_none_or(|t| t.elapsed() >= sweep_every);
        if sweep {
            self.last_sweep = Some(Instant::now());
        }
        let baseline = !self.started;
        let lag = self.spec.overlap.min(COMMIT_LAG);
        // The first poll reads the whole window, from which the slices go on.
        let lookback = if baseline { self.spec.overlap } else { lag };
        let mut rows_read = 0u64;
        if baseline {
            self.kind.start(db_now);
        }
        let rereads = self.rereads_every_poll();
        if baseline || rereads {
            rows_read += self.read_unfinished(&mut tx, baseline).await?;
        }
        // Rows up to the high-water mark in the range re-read were read by the
        // last poll unless written by a transaction still running then; 0
        // (unknown) re-reads them all.
        let seen_before = if baseline {
            0
        } else {
            self.poll_xmin.unwrap_or(0)
        };
        let micros = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
        let window = Window {
            db_now,
            lookback: micros(lookback),
            seen_before,
            snapshot_xmin,
            baseline,
        };
        if self.pairs.is_some() && !baseline {
            rows_read += self.read_windows(&mut tx, &window).await?;
        }
        let cursors = self.kind.cursors();
        // After the first poll, without MariaDB's pairs (which read the
        // look-backs apart), several tailed columns are read together.
        let mut together = false;
        if !baseline && self.pairs.is_none() && cursors.len() > 1 && !self.apart {
            let (n, done) = self.tail_together(&mut tx, &cursors, &window).await?;
            rows_read += n;
            together = done;
        }
        let mut apart = 0u64;
        for (i, (column, at)) in cursors.into_iter().enumerate() {
            if !together {
                apart += self.tail(&mut tx, i, &column, at, &window).await?;
            }
        }
        rows_read += apart;
        // Apart until a poll's changes fit a page again: the rows the tails
        // read, each once (a row read by several columns' tails is one row
        // of the statement together), before the slices add theirs.
        let distinct = if self.spec.rereads_unfinished() {
            self.unfinished.tailed.len() as u64
        } else {
            apart
        };
        self.apart = !together && distinct >= self.spec.batch_size as u64;
        if !baseline && self.pairs.is_none() {
            rows_read += self.reread_late(&mut tx, &window).await?;
        }
        let events_window = Window {
            lookback: micros(if sweep { self.spec.overlap } else { lookback }),
            ..window
        };
        rows_read += self.tail_events(&mut tx, &events_window).await?;
        self.started = true;
        self.poll_xmin = Some(snapshot_xmin);
        if sweep && self.spec.cursor == Cursor::UpdatedAt {
            rows_read += self.scan_nulls(&mut tx).await?;
        }
        if rereads && !baseline && self.events.is_none() {
            rows_read += self.look_up_gone(&mut tx, db_now).await?;
        }
        if self.incremental.is_some() && !baseline {
            rows_read += self.look_up_in_flight(&mut tx, db_now).await?;
        }
        let gauges = if rereads {
            self.unfinished.tailed.clear();
            if self.backlog.is_complete() {
                self.backlog.gauges(self.kind.stuck_before(db_now))
            } else {
                self.gauge_query(&mut tx, db_now).await?
            }
        } else {
            let (gauges, n) = self.kept_gauges(&mut tx, db_now, full).await?;
            self.unfinished.tailed.clear();
            rows_read += n;
            gauges
        };
        if let Some(parked) = self.kind.parked_query(&self.sql) {
            let row = sqlx::query(sqlx::AssertSqlSafe(parked))
                .fetch_one(&mut *tx)
                .await
                .map_err(query_error)?;
            self.kind.parked(&row).map_err(SourceError::Schema)?;
        }
        tx.commit().await.map_err(query_error)?;
        if long {
            set_statement_timeout(conn, self.sql, self.spec.timeout)
                .await
                .map_err(query_error)?;
        }
        if full {
            self.full_due = false;
        }
        self.kind.flush(&gauges, db_now, Instant::now());
        Ok(PollStats {
            rows_read,
            notes: self.notes.clone(),
        })
    }

    /// Reads every unfinished row (up to the cap) into the state and the
    /// backlog: at start, and on every poll when the unfinished rows are
    /// re-read. Streamed: the backlog can be large, and memory stays bounded
    /// by the maps, not by the result set.
    async fn read_unfinished(
        &mut self,
        conn: &mut AnyConnection,
        baseline: bool,
    ) -> Result<u64, SourceError> {
        let seed = self.seed_query();
        // With an events log the rows give the gauges only: the log counts.
        let events = self.events.is_some();
        let track = self.spec.rereads_unfinished() && !events;
        self.unfinished.pass = self.unfinished.pass.wrapping_add(1);
        let pass = self.unfinished.pass;
        let mut rows = sqlx::query(sqlx::AssertSqlSafe(seed)).fetch(&mut *conn);
        let mut n = 0usize;
        self.backlog.clear();
        while let Some(row) = rows.try_next().await.map_err(query_error)? {
            // A read of many rows runs for seconds: each row takes from the
            // task's budget, so that the other tasks of its thread (the HTTP
            // server's) run in between.
            tokio::task::consume_budget().await;
            n += 1;
            if !events {
                self.kind
                    .observe(&row, baseline)
                    .map_err(SourceError::Schema)?;
            }
            let (key, unfinished) = self.kind.unfinished(&row).map_err(SourceError::Schema)?;
            self.backlog.update(key, unfinished);
            if track && unfinished.is_some() {
                self.track(&row, key, unfinished, pass)?;
            }
        }
        let all = n < self.spec.max_tracked_events;
        self.backlog.filled(all);
        if !all {
            // Over the cap the re-read is partial: which rows left cannot be
            // told from which were not read.
            self.unfinished.forget_all(&mut self.backlog);
        }
        self.last_reconcile = Some(Instant::now());
        Ok(n as u64)
    }

    /// Reads one watermarked column from its high-water mark minus the
    /// window's look-back, page by page.
    async fn tail(
        &mut self,
        tx: &mut AnyConnection,
        i: usize,
        column: &str,
        at: usize,
        w: &Window,
    ) -> Result<u64, SourceError> {
        let tail = self.tail_query(column);
        let ties = self.ties_query(column);
        let (mut low, high) = self.tail_from(i, w);
        let mut max_seen = high;
        let mut rows_read = 0u64;
        if self.pairs.is_some() && !w.baseline {
            // The look-back was read before, as pairs ([`Self::read_windows`]).
            low = high;
        }
        loop {
            let mut query = bind(
                sqlx::query(sqlx::AssertSqlSafe(tail.clone())),
                self.sql.cursor(low),
            );
            if self.xmin {
                query = bind(query, self.sql.cursor(high)).bind(w.seen_before);
            }
            // Taken as they come, not gathered first: the rows a poll held
            // as `AnyRow`s were the largest part of its own memory at the
            // cap of remembered events (1.4 MB), and a page of them need
            // not be held at once.
            let mut rows = query.fetch(&mut *tx);
            let mut n = 0;
            let mut value = None;
            while let Some(row) = rows.try_next().await.map_err(query_error)? {
                n += 1;
                self.take(&row, w.baseline)?;
                value = get_time(&row, at, column).map_err(SourceError::Schema)?;
                if let Some(u) = value.filter(|u| *u != sql::OUT_OF_RANGE) {
                    max_seen = max_seen.max(u);
                }
            }
            drop(rows);
            rows_read += n as u64;
            if n < self.spec.batch_size {
                break;
            }
            // The last row's value. Rows whose value is out of range
            // (`infinity`) sort last: the page holds only such rows from
            // here on, each rejected.
            let Some(last) = value.filter(|c| *c != sql::OUT_OF_RANGE) else {
                break;
            };
            // The page may end inside a run of rows sharing its last value:
            // read all of that value (those already read are recognised),
            // then go on strictly after it. One unit below, as the value is
            // rounded to a microsecond (SQLite: a millisecond).
            let mut tied = bind(
                bind(
                    sqlx::query(sqlx::AssertSqlSafe(ties.clone())),
                    self.sql.cursor(last.saturating_sub(self.sql.cursor_unit())),
                ),
                self.sql.cursor(last),
            )
            .fetch(&mut *tx);
            while let Some(row) = tied.try_next().await.map_err(query_error)? {
                tokio::task::consume_budget().await;
                rows_read += 1;
                self.take(&row, w.baseline)?;
            }
            drop(tied);
            low = last;
        }
        self.tail_to(i, max_seen, w);
        Ok(rows_read)
    }

    /// Where the tail of column `i` reads from this poll, and its high-water
    /// mark: (the mark less the window's look-back, the mark).
    fn tail_from(&mut self, i: usize, w: &Window) -> (i64, i64) {
        let (low, high) = self.tail_marks(i, w);
        let late = &mut self.late[i];
        if w.baseline {
            late.done = [Some(low); LATE_LAGS];
        }
        late.tails.push_back((low, w.snapshot_xmin));
        (low, high)
    }

    /// The look-back's start and the high-water mark of column `i` this
    /// poll, without taking note of a read ([`Self::tail_from`]).
    fn tail_marks(&self, i: usize, w: &Window) -> (i64, i64) {
        let high = self.highs[i].unwrap_or(w.db_now);
        (high.saturating_sub(w.lookback), high)
    }

    /// Moves the high-water mark of column `i` to the highest value its
    /// tail read.
    fn tail_to(&mut self, i: usize, max_seen: i64, w: &Window) {
        // A clock ahead of the database must not push the mark into the
        // future; quiet after a burst, the mark follows the database's clock
        // to `overlap` behind it, so that the look-back stops re-reading the
        // burst's rows (on MySQL and SQLite every one of them, every poll)
        // once they are older than any commit the window allows. A time
        // written by a clock further behind the database's is a commit later
        // than the window, as everywhere else.
        let overlap = i64::try_from(self.spec.overlap.as_micros()).unwrap_or(i64::MAX);
        let floor = w.db_now.saturating_sub(overlap);
        self.highs[i] = Some(max_seen.max(floor).min(w.db_now));
    }

    /// The tails of every watermarked column in one statement
    /// ([`Self::together_query`]), as [`Self::tail`] reads each: returns the
    /// rows read, and whether that was all of them. After a full page (a
    /// burst) the tails read apart, page by page, the rows it held included.
    async fn tail_together(
        &mut self,
        tx: &mut AnyConnection,
        cursors: &[(String, usize)],
        w: &Window,
    ) -> Result<(u64, bool), SourceError> {
        let marks: Vec<(i64, i64)> = (0..cursors.len()).map(|i| self.tail_marks(i, w)).collect();
        let mut query = sqlx::query(sqlx::AssertSqlSafe(self.together_query()));
        for (low, _) in &marks {
            query = bind(query, self.sql.cursor(*low));
        }
        if self.xmin {
            for (_, high) in &marks {
                query = bind(query, self.sql.cursor(*high));
            }
            query = query.bind(w.seen_before);
        }
        // Taken as they come, as the tails apart take theirs, so that the
        // poll does not hold its rows as `AnyRow`s all at once. A page found
        // full once read has its rows taken already: the tails apart read
        // each of them again, and a row version read again is recognised.
        let mut max_seen: Vec<i64> = marks.iter().map(|(_, high)| *high).collect();
        let mut rows = query.fetch(&mut *tx);
        let mut n = 0usize;
        while let Some(row) = rows.try_next().await.map_err(query_error)? {
            tokio::task::consume_budget().await;
            n += 1;
            self.take(&row, false)?;
            for (i, (column, at)) in cursors.iter().enumerate() {
                let value = get_time(&row, *at, column).map_err(SourceError::Schema)?;
                if let Some(u) = value.filter(|u| *u != sql::OUT_OF_RANGE) {
                    max_seen[i] = max_seen[i].max(u);
                }
            }
        }
        drop(rows);
        if n >= self.spec.batch_size {
            return Ok((n as u64, false));
        }
        for (i, max) in max_seen.into_iter().enumerate() {
            self.tail_from(i, w);
            self.tail_to(i, max, w);
        }
        Ok((n as u64, true))
    }

    /// Re-reads, for each tailed column and each lag of [`LateReads`], the
    /// slice that became that old since the last poll, up to where the tail
    /// reads anyway: every slice in one statement ([`Self::slices_query`]),
    /// streamed whole (a slice holds about one poll interval of changes).
    async fn reread_late(
        &mut self,
        tx: &mut AnyConnection,
        w: &Window,
    ) -> Result<u64, SourceError> {
        let columns = self.late.len();
        // Per column and lag: (from, to, xmin); an empty range where no
        // slice is due, so that the statement stays one: after now, where
        // an index holds next to nothing (SQLite's ranges end at an index's
        // end, not at `NOT c > to`).
        let mut binds = vec![(w.db_now, w.db_now, 0); columns * LATE_LAGS];
        let mut done: Vec<(usize, usize, i64)> = Vec::new();
        for i in 0..columns {
            for (j, from, to) in self.due_slices(i, w) {
                binds[i * LATE_LAGS + j] = (from, to, self.late[i].seen_before(from));
                done.push((i, j, to));
            }
        }
        let mut rows_read = 0u64;
        if !done.is_empty() {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(self.slices_query()));
            for (from, to, xmin) in binds {
                q = bind(bind(q, self.sql.cursor(from)), self.sql.cursor(to));
                if self.xmin {
                    q = q.bind(xmin);
                }
            }
            let mut rows = q.fetch(&mut *tx);
            while let Some(row) = rows.try_next().await.map_err(query_error)? {
                tokio::task::consume_budget().await;
                rows_read += 1;
                self.take(&row, false)?;
            }
        }
        for (i, j, to) in done {
            self.late[i].done[j] = Some(to);
        }
        for late in &mut self.late {
            late.prune();
        }
        Ok(rows_read)
    }

    /// The late-commit slices of every tailed column, each lag's (`from`,
    /// `to`] (PostgreSQL: only rows of transactions not older than its
    /// xmin), bound in that order per column and lag: one statement, in no
    /// order, each slice a part of a `UNION ALL` that keeps its own index
    /// range scan (as [`Self::together_query`]'s parts). A row in several
    /// slices is sent once per slice, as before: on PostgreSQL a slice holds
    /// late commits only, and a `UNION` would merge rows whose columns
    /// compare equal under the id column's collation (MySQL's are
    /// case-insensitive).
    fn slices_query(&self) -> String {
        let per = if self.xmin { 3 } else { 2 };
        let mut parts = Vec::new();
        for (i, (column, _)) in self.kind.cursors().into_iter().enumerate() {
            let col = self.sql.ident(&column);
            for j in 0..LATE_LAGS {
                let first = (i * LATE_LAGS + j) * per + 1;
                let written = self
                    .sql
                    .written_since(first + 2)
                    .filter(|_| self.xmin)
                    .map_or(String::new(), |x| format!(" AND {x}"));
                parts.push(format!(
                    "SELECT {} FROM {} WHERE {} AND NOT {}{written}",
                    self.select_list(),
                    self.sql.table(&self.spec.table),
                    self.sql.after(&col, first),
                    self.sql.after(&col, first + 1),
                ));
            }
        }
        parts.join(" UNION ALL ")
    }

    /// The late-commit slices of the tailed column `i` due this poll, for
    /// each lag of [`LateReads`] (its place, from, to): what became that old
    /// since the last poll, up to where the tail reads anyway.
    fn due_slices(&self, i: usize, w: &Window) -> Vec<(usize, i64, i64)> {
        let overlap = i64::try_from(self.spec.overlap.as_micros()).unwrap_or(i64::MAX);
        let Some(high) = self.highs[i] else {
            return Vec::new();
        };
        if overlap <= w.lookback {
            return Vec::new();
        }
        // The tail re-reads from here on every poll.
        let top = high.saturating_sub(w.lookback);
        LateReads::lags(overlap, w.lookback)
            .into_iter()
            .enumerate()
            .filter_map(|(j, lag)| {
                let from = self.late[i].done[j]?;
                let to = w.db_now.saturating_sub(lag).min(top);
                (to > from).then_some((j, from, to))
            })
            .collect()
    }

    /// MariaDB / MySQL, when the pairs cannot tell what was read
    /// ([`Self::read_windows`]): reads in full, streamed, the rows of
    /// `column` in (`from`, `to`] ([`Self::slice_query`]). Returns the rows
    /// read.
    async fn read_slice(
        &mut self,
        tx: &mut AnyConnection,
        column: &str,
        from: i64,
        to: i64,
    ) -> Result<u64, SourceError> {
        let query = self.slice_query(column);
        let q = bind(
            bind(
                sqlx::query(sqlx::AssertSqlSafe(query)),
                self.sql.cursor(from),
            ),
            self.sql.cursor(to),
        );
        let mut rows_read = 0u64;
        let mut rows = q.fetch(&mut *tx);
        while let Some(row) = rows.try_next().await.map_err(query_error)? {
            tokio::task::consume_budget().await;
            rows_read += 1;
            self.take(&row, false)?;
        }
        Ok(rows_read)
    }

    /// PostgreSQL tables: ` AND` the condition that skips the rows up to the
    /// high-water mark `$2` that a poll with snapshot xmin `$3` read
    /// ([`Sql::unseen`]); elsewhere nothing.
    fn unseen(&self, col: &str) -> String {
        self.sql
            .unseen(col, 2, 3)
            .filter(|_| self.xmin)
            .map_or(String::new(), |u| format!(" AND {u}"))
    }

    /// The rows whose watermarked column lies in (`?`, `?`], in no order.
    fn slice_query(&self, column: &str) -> String {
        let col = self.sql.ident(column);
        format!(
            "SELECT {} FROM {} WHERE {} AND NOT {}",
            self.select_list(),
            self.sql.table(&self.spec.table),
            self.sql.after(&col, 1),
            self.sql.after(&col, 2),
        )
    }

    /// MariaDB / MySQL: the (tailed column's place, event id, value) of
    /// every row in three ranges of each tailed column, (`?`, `?`] each,
    /// from the columns' indexes: one statement for the look-backs and the
    /// late-commit slices of a poll.
    fn windows_query(&self) -> String {
        let list = self.kind.select_list(&self.sql);
        let parts: Vec<String> = self
            .kind
            .cursors()
            .into_iter()
            .enumerate()
            .map(|(i, (column, at))| {
                let col = self.sql.ident(&column);
                let range = format!(
                    "({} AND NOT {})",
                    self.sql.after(&col, 1),
                    self.sql.after(&col, 2)
                );
                format!(
                    "SELECT {}, {}, {} FROM {} WHERE {range} OR {range} OR {range}",
                    self.sql.int(&i.to_string()),
                    list[0].1,
                    list[at].1,
                    self.sql.table(&self.spec.table),
                )
            })
            .collect();
        parts.join(" UNION ALL ")
    }

    /// MariaDB / MySQL, which have no `xmin`: reads each tailed column's
    /// look-back (what the tail re-read every poll) and its late-commit
    /// slices ([`LateReads`]) as (event id, value) pairs, in one statement,
    /// and reads in full, by id, only the rows whose pair no read took
    /// before ([`ReadPairs`]). A row without an event id cannot be read by
    /// id: then the ranges are read in full, as elsewhere. Returns the rows
    /// read (of both reads).
    async fn read_windows(
        &mut self,
        tx: &mut AnyConnection,
        w: &Window,
    ) -> Result<u64, SourceError> {
        let cursors = self.kind.cursors();
        // Per column: the look-back and the two slices; (0, 0) is empty.
        let mut ranges: Vec<(usize, i64, i64)> = Vec::new();
        let mut binds: Vec<(i64, i64)> = Vec::new();
        let mut slices_done: Vec<(usize, usize, i64)> = Vec::new();
        for i in 0..cursors.len() {
            let high = self.highs[i].unwrap_or(w.db_now);
            let mut three = [(high.saturating_sub(w.lookback), high), (0, 0), (0, 0)];
            for (j, from, to) in self.due_slices(i, w) {
                three[j + 1] = (from, to);
                slices_done.push((i, j, to));
            }
            for (from, to) in three {
                binds.push((from, to));
                if to > from {
                    ranges.push((i, from, to));
                }
            }
        }
        let mut q = sqlx::query(sqlx::AssertSqlSafe(self.windows_query()));
        for (from, to) in binds {
            q = bind(bind(q, self.sql.cursor(from)), self.sql.cursor(to));
        }
        let rows = q.fetch_all(&mut *tx).await.map_err(query_error)?;
        let mut rows_read = rows.len() as u64;
        let mut unseen: Vec<String> = Vec::new();
        let mut whole = false;
        let pairs = self.pairs.as_ref().expect("MariaDB / MySQL keep pairs");
        for row in &rows {
            let i: i64 = row.try_get(0).map_err(query_error)?;
            let id: Option<String> = get(row, 1, "event_id").map_err(SourceError::Schema)?;
            let Some(id) = id else {
                whole = true;
                break;
            };
            let value = get_time(row, 2, "").ok().flatten();
            let known = usize::try_from(i)
                .ok()
                .and_then(|i| pairs.get(i))
                .zip(value)
                .is_some_and(|(p, v)| p.contains(key_of(&id), v));
            if !known {
                unseen.push(id);
            }
        }
        drop(rows);
        if whole {
            for (i, from, to) in ranges {
                rows_read += self.read_slice(tx, &cursors[i].0, from, to).await?;
            }
        } else {
            unseen.sort_unstable();
            unseen.dedup();
            rows_read += self.read_by_id(tx, &unseen).await?;
        }
        for (i, j, to) in slices_done {
            self.late[i].done[j] = Some(to);
        }
        for late in &mut self.late {
            late.prune();
        }
        Ok(rows_read)
    }

    /// Reads the rows of `ids` in full and takes each found (one gone since
    /// is for the look-ups and the reconcile). Returns the rows read.
    async fn read_by_id(
        &mut self,
        tx: &mut AnyConnection,
        ids: &[String],
    ) -> Result<u64, SourceError> {
        let mut rows_read = 0u64;
        for chunk in ids.chunks(LOOKUP_CHUNK) {
            let ids: Vec<&str> = chunk.iter().map(|id| &**id).collect();
            let rows = self.fetch_by_ids(tx, ids).await?;
            rows_read += rows.len() as u64;
            for row in &rows {
                self.take(row, false)?;
            }
        }
        Ok(rows_read)
    }

    /// The rows of at most [`LOOKUP_CHUNK`] event ids, by the id column's
    /// index ([`Self::lookup_query`]). `&mut self`: a poll's future must be
    /// `Send`, and the source is not `Sync` (its `Cell`s).
    async fn fetch_by_ids(
        &mut self,
        tx: &mut AnyConnection,
        mut ids: Vec<&str>,
    ) -> Result<Vec<AnyRow>, SourceError> {
        let bound = self.id_bind != IdBind::Literals;
        if bound && !ids.is_empty() {
            // The last id repeated up to the list's size: the same few
            // statements serve every look-up.
            let last = ids[ids.len() - 1];
            ids.resize(lookup_size(ids.len()), last);
        }
        let mut q = sqlx::query(sqlx::AssertSqlSafe(self.lookup_query(&ids)));
        if bound {
            for id in &ids {
                q = q.bind(*id);
            }
        }
        q.fetch_all(&mut *tx).await.map_err(query_error)
    }

    /// A page of the rows whose change cursor is NULL.
    async fn scan_nulls(&mut self, tx: &mut AnyConnection) -> Result<u64, SourceError> {
        let Some((updated_at, _)) = self.kind.cursors().into_iter().next() else {
            return Ok(0);
        };
        let rows = sqlx::query(sqlx::AssertSqlSafe(self.null_query(&updated_at)))
            .bind(self.nulls.after.clone())
            .fetch_all(&mut *tx)
            .await
            .map_err(query_error)?;
        for row in &rows {
            let key = row_key(row)?;
            self.nulls.pass.insert(key);
            if self.nulls.counted.insert(key) {
                self.kind.reject(Reject::NullCursor);
            }
            self.see(row)?;
        }
        match rows.last() {
            Some(last) if rows.len() == self.spec.batch_size => {
                let id: Option<String> = get(last, 0, "event_id").map_err(SourceError::Schema)?;
                self.nulls.after = id.unwrap_or_default();
            }
            _ => {
                // A whole pass: forget the rows that were not seen in it.
                self.nulls.after.clear();
                let pass = std::mem::take(&mut self.nulls.pass);
                self.nulls.counted.retain(|k| pass.contains(k));
            }
        }
        Ok(rows.len() as u64)
    }

    /// The rows that were unfinished at the last re-read and are neither
    /// among the unfinished ones now nor read by the tail: looked up by id,
    /// a row still there is taken as it is (finished, or with a status no
    /// longer recognised), a row gone was deleted.
    async fn look_up_gone(
        &mut self,
        tx: &mut AnyConnection,
        db_now: i64,
    ) -> Result<u64, SourceError> {
        let pass = self.unfinished.pass;
        let left: Vec<(u64, Box<str>)> = self
            .backlog
            .marks()
            .map(|(k, m)| (k, Seen::of_mark(m)))
            .filter(|(k, s)| !s.of(pass) && !self.unfinished.tailed.contains(k))
            .map(|(k, s)| (k, self.unfinished.id(&s).into()))
            .collect();
        self.unfinished.keep_pass(&mut self.backlog, pass);
        let rows = &self.backlog;
        self.unfinished
            .in_flight
            .retain(|k, _| rows.mark(*k).is_some());
        let deleted = self.spec.finished_rows == FinishedRows::Deleted;
        let found = self.look_up(tx, &left, db_now, deleted).await;
        let rows = &self.backlog;
        self.unfinished.lasts.retain(|k, _| rows.mark(*k).is_some());
        found
    }

    /// Looks up tracked rows by id: a row found is taken as it is, a row
    /// gone from the table is gone for the kind (`deleted`: counted as a
    /// completion) and forgotten as unfinished. Returns the rows read.
    async fn look_up(
        &mut self,
        tx: &mut AnyConnection,
        rows: &[(u64, Box<str>)],
        db_now: i64,
        deleted: bool,
    ) -> Result<u64, SourceError> {
        let mut rows_read = 0u64;
        for chunk in rows.chunks(LOOKUP_CHUNK) {
            let ids: Vec<&str> = chunk.iter().map(|(_, id)| &**id).collect();
            let found_rows = self.fetch_by_ids(tx, ids).await?;
            rows_read += found_rows.len() as u64;
            let mut found = HashSet::new();
            for row in &found_rows {
                found.insert(self.take(row, false)?);
            }
            for (key, _) in chunk.iter().filter(|(k, _)| !found.contains(k)) {
                // Without its last version (not kept, or not read) a
                // deleted row is forgotten uncounted, as a row deleted by
                // hand is.
                let last = self.unfinished.forget(&mut self.backlog, key);
                self.kind
                    .gone(*key, last.as_ref().filter(|_| deleted), db_now);
                self.backlog.update(*key, None);
            }
        }
        Ok(rows_read)
    }

    async fn gauge_query(
        &mut self,
        tx: &mut AnyConnection,
        db_now: i64,
    ) -> Result<GaugeMap, SourceError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(
            self.kind.gauge_query(&self.sql, db_now),
        ))
        .fetch_all(&mut *tx)
        .await
        .map_err(query_error)?;
        self.kind.gauges(&rows).map_err(SourceError::Schema)
    }

    /// The gauges of a source that tails a change cursor: from the backlog
    /// kept from the tailed rows, checked every `reconcile_every` (and from
    /// the aggregate while the backlog is too large to keep). Returns them
    /// and the rows read.
    ///
    /// The check is the count of unfinished rows; when it differs, and every
    /// tenth time, the next poll is a full reconcile (`full`): the aggregate
    /// over the unfinished rows, and when it differs from the backlog kept a
    /// re-read of them. It reads every unfinished row, so it may take
    /// `full_read_timeout` ([`Source::timeout`]) instead of `timeout`.
    async fn kept_gauges(
        &mut self,
        tx: &mut AnyConnection,
        db_now: i64,
        full: bool,
    ) -> Result<(GaugeMap, u64), SourceError> {
        let stuck_before = self.kind.stuck_before(db_now);
        // Decided as the poll began; not due after all when this poll's
        // baseline read has just reconciled.
        let due = self.check_due.replace(false)
            && self
                .last_reconcile
                .is_none_or(|t| t.elapsed() >= self.spec.reconcile_every);
        let complete = self.backlog.is_complete();
        if complete && !full {
            let kept = self.backlog.gauges(stuck_before);
            if !due {
                return Ok((kept, 0));
            }
            self.last_reconcile = Some(Instant::now());
            // The planner's choice can change with the table's statistics:
            // the next poll finds again whether the index serves the read.
            self.in_flight_probe = true;
            if self.cheap_reconciles + 1 < FULL_RECONCILE_EVERY {
                // The cheap check: the number of unfinished rows, which an
                // index over them answers without visiting each (an
                // index-only scan where the table's visibility map allows).
                // A deleted row changes it; only a change that neither moves
                // the cursor nor the count waits for the next full check.
                let count = format!(
                    "SELECT COUNT(*) FROM {} WHERE {}",
                    self.sql.table(&self.spec.table),
                    self.kind.unfinished_filter(&self.sql)
                );
                let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count))
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(query_error)?;
                let total: u64 = kept.values().flat_map(|g| g.counts).sum();
                if u64::try_from(n).is_ok_and(|n| n == total) {
                    self.cheap_reconciles += 1;
                    return Ok((kept, 0));
                }
            }
            self.full_due = true;
            return Ok((kept, 0));
        }
        let truth = self.gauge_query(tx, db_now).await?;
        let total: u64 = truth.values().flat_map(|g| g.counts).sum();
        let fits = usize::try_from(total).is_ok_and(|n| n < self.backlog.cap());
        if !full {
            // The backlog is too large to keep: the gauges come from the
            // aggregate on every poll, and once it fits again a full
            // reconcile re-reads it.
            if due {
                self.last_reconcile = Some(Instant::now());
                self.full_due = fits;
            }
            return Ok((truth, 0));
        }
        self.cheap_reconciles = 0;
        self.last_reconcile = Some(Instant::now());
        let mut rows_read = 0;
        if fits && !(complete && self.backlog.gauges(stuck_before) == truth) {
            // Rows changed where the tail cannot see them (deleted, or
            // changed without moving the cursor), or the backlog fits again
            // after being too large: read it afresh.
            debug!(source = %self.spec.name, complete, "Re-reading the unfinished rows for the gauges.");
            if self.incremental.is_some() {
                // Without a change cursor the re-read also counts what
                // changed where no time column shows it, and looks up the
                // rows that left the unfinished ones.
                rows_read += self.read_unfinished(tx, false).await?;
                rows_read += self.look_up_gone(tx, db_now).await?;
                return Ok((truth, rows_read));
            }
            let mut rows = sqlx::query(sqlx::AssertSqlSafe(self.seed_query())).fetch(&mut *tx);
            let mut n = 0usize;
            self.backlog.clear();
            while let Some(row) = rows.try_next().await.map_err(query_error)? {
                tokio::task::consume_budget().await;
                n += 1;
                let (key, unfinished) = self.kind.unfinished(&row).map_err(SourceError::Schema)?;
                self.backlog.update(key, unfinished);
            }
            rows_read += n as u64;
            self.backlog.filled(n < self.spec.max_tracked_events);
        }
        Ok((truth, rows_read))
    }

    /// Takes a tailed row into the counts and the backlog; returns its key.
    fn take(&mut self, row: &AnyRow, baseline: bool) -> Result<u64, SourceError> {
        self.kind
            .observe(row, baseline)
            .map_err(SourceError::Schema)?;
        let (key, unfinished) = self.kind.unfinished(row).map_err(SourceError::Schema)?;
        self.backlog.update(key, unfinished);
        if let Some(pairs) = &mut self.pairs {
            let since = self.db_now.saturating_sub(pairs_reach(&self.spec));
            for p in pairs.iter_mut() {
                // Only values a window may still cover (a stuck row's
                // `received_at` is not); an unusable value is not kept:
                // its row is read again.
                if let Ok(Some(value)) = get_time(row, p.at, "")
                    && value >= since
                {
                    p.insert(self.db_now, key, value);
                }
            }
        }
        if self.spec.rereads_unfinished() {
            self.unfinished.tailed.insert(key);
            if self.incremental.is_some() && self.events.is_none() {
                let pass = self.unfinished.pass;
                self.track(row, key, unfinished, pass)?;
            }
        }
        Ok(key)
    }

    /// Keeps what a read showed of an unfinished row (its id, to look it up
    /// when it leaves them, and with [`Incremental`] whether it is in
    /// flight); forgets a row read finished.
    fn track(
        &mut self,
        row: &AnyRow,
        key: u64,
        unfinished: Option<Unfinished>,
        pass: u32,
    ) -> Result<(), SourceError> {
        let Some(last) = unfinished else {
            self.unfinished.forget(&mut self.backlog, &key);
            return Ok(());
        };
        match self.backlog.mark_mut(key) {
            Some(m) => {
                let mut seen = Seen::of_mark(*m);
                seen.see(pass);
                *m = seen.mark();
            }
            None => {
                let id: Option<String> = get(row, 0, "event_id").map_err(SourceError::Schema)?;
                self.unfinished.remember(
                    &mut self.backlog,
                    key,
                    id.as_deref().unwrap_or_default(),
                    pass,
                );
            }
        }
        if self.spec.finished_rows == FinishedRows::Deleted {
            self.unfinished.lasts.insert(key, last);
        }
        let started = match self.incremental.and_then(|i| i.started) {
            Some(at) if last.class() != 0 => {
                Sql::in_range(get_time(row, at, "started_at").map_err(SourceError::Schema)?)
            }
            _ => None,
        };
        match started {
            Some(t) => self.unfinished.in_flight.insert(key, t),
            None => self.unfinished.in_flight.remove(&key),
        };
        Ok(())
    }

    /// The next of the turns in which the stuck rows in flight (started
    /// before `since`) are looked up by key: (this turn, turns in the
    /// round); the round's length is set anew when one ends
    /// ([`in_flight_rounds`]).
    fn next_turn(&mut self, since: i64) -> (u64, u64) {
        let r = &mut self.unfinished;
        r.turn += 1;
        if r.turn >= r.rounds {
            let stuck = r.in_flight.values().filter(|s| **s < since).count();
            r.turn = 0;
            r.rounds = in_flight_rounds(self.spec.overlap, self.spec.poll_interval, stuck);
        }
        (r.turn, r.rounds)
    }

    /// [`Incremental`]: looks up by id the rows in flight that the tails did
    /// not read this poll, which can fail, go back to pending or be
    /// redelivered without moving a time column: every poll those started
    /// within `max(overlap, stuck_after)`, and of those started earlier one
    /// in [`in_flight_rounds`] on each poll, by key, so that each is looked up
    /// about once per `overlap` (a stuck row that a reaper fails, a failed row
    /// whose retry waits long), and about [`STUCK_PER_POLL`] of them a poll
    /// at most. A row gone from the table is forgotten as unfinished.
    async fn look_up_in_flight(
        &mut self,
        tx: &mut AnyConnection,
        db_now: i64,
    ) -> Result<u64, SourceError> {
        let Some(plan) = self.incremental else {
            return Ok(0);
        };
        let horizon = i64::try_from(plan.horizon.as_micros()).unwrap_or(i64::MAX);
        let since = db_now.saturating_sub(horizon);
        if self.in_flight_index == Some(true)
            && self.backlog.is_complete()
            && let Some(parts) = self.in_flight_parts()
        {
            let (read, looked_up) = self.check_stuck(tx, db_now, since, parts).await?;
            return Ok(read + looked_up);
        }
        if self.in_flight_index == Some(true)
            && let Some(query) = self.in_flight_query()
        {
            let (read, looked_up) = self.read_in_flight(tx, db_now, since, query).await?;
            return Ok(read + looked_up);
        }
        if self.in_flight_index == Some(true)
            && self.backlog.is_complete()
            && let Some(query) = self.in_flight_status_query()
        {
            let (read, looked_up) = self.check_in_flight(tx, db_now, since, query).await?;
            return Ok(read + looked_up);
        }
        let (turn, rounds) = self.next_turn(since);
        let r = &self.unfinished;
        let due = r.with_ids(
            &self.backlog,
            r.in_flight
                .iter()
                .filter(|(k, started)| **started >= since || **k % rounds == turn)
                .filter(|(k, _)| !r.tailed.contains(k))
                .map(|(k, _)| k),
        );
        self.look_up(tx, &due, db_now, false).await
    }

    /// [`Incremental`] through the partial index over the rows in flight
    /// ([`Self::in_flight_query`]): every row in flight started at or after
    /// `since` (within the horizon), and of those started earlier the next
    /// slice of starts ([`Self::stuck_slice`]), so that the slices go
    /// through every stuck row about once per `overlap`, as the look-ups by
    /// id in turn do. A range returns the rows in flight it holds now, also
    /// those not known to be in flight (a pending row failed by hand); a row
    /// known in flight in a range read that is not returned left the rows in
    /// flight without moving a time column (back to pending, finished by
    /// hand, deleted), and is looked up by id. Rows the tails read this poll
    /// are not taken again. Returns the rows the ranges read and those
    /// looked up by id.
    async fn read_in_flight(
        &mut self,
        tx: &mut AnyConnection,
        db_now: i64,
        since: i64,
        query: String,
    ) -> Result<(u64, u64), SourceError> {
        let (lo, hi) = self.stuck_slice(since);
        let recent = since.saturating_sub(1);
        let rows = bind(
            bind(
                bind(sqlx::query(sqlx::AssertSqlSafe(query)), self.sql.cursor(lo)),
                self.sql.cursor(hi),
            ),
            self.sql.cursor(recent),
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(query_error)?;
        let returned = self.take_untailed(&rows)?;
        let left = self.left_in_flight(recent, (lo, hi), &returned);
        let looked_up = self.look_up(tx, &left, db_now, false).await?;
        Ok((rows.len() as u64, looked_up))
    }

    /// [`Self::read_in_flight`] while the backlog holds every unfinished
    /// row, through the same partial index: the rows in flight started
    /// within the horizon are read in full, the next slice of the stuck
    /// ones' starts only as event ids and status words
    /// ([`Self::in_flight_parts`]). A stuck row is looked up by id only when
    /// its status means another than the backlog keeps, when the slice no
    /// longer returns it (back to pending, restarted, finished or deleted),
    /// or when it is not known in flight; a full page, as there, looks up
    /// those of the slice it did not return. What the status cannot show —
    /// a redelivery, a new error text, attempts moved with the status and
    /// the start unchanged — is seen with the row's next change of status or
    /// start, as on MariaDB. Rows the tails read this poll are not taken
    /// again. Returns the rows and entries read and the rows looked up.
    async fn check_stuck(
        &mut self,
        tx: &mut AnyConnection,
        db_now: i64,
        since: i64,
        (stuck, recent_query): (String, String),
    ) -> Result<(u64, u64), SourceError> {
        let (lo, hi) = self.stuck_slice(since);
        let recent = since.saturating_sub(1);
        let rows = bind(
            sqlx::query(sqlx::AssertSqlSafe(recent_query)),
            self.sql.cursor(recent),
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(query_error)?;
        let mut returned = self.take_untailed(&rows)?;
        let words = read_range(self.sql, tx, stuck, (lo, hi)).await?;
        let changed = self.changed_statuses(&words, &mut returned)?;
        let mut due = self.left_in_flight(recent, (lo, hi), &returned);
        due.extend(changed);
        let looked_up = self.look_up(tx, &due, db_now, false).await?;
        Ok(((rows.len() + words.len()) as u64, looked_up))
    }

    /// The next slice (`lo`, `hi`] of the starts of the rows in flight started
    /// before `since` (stuck, or failed and waiting long): about one round's
    /// share of them ([`in_flight_rounds`]), every row of the last start
    /// taken. The slices follow each other from the earliest start; the one
    /// that reaches `since` ends the round, which takes at least the polls
    /// it was given ([`Slices`]). An empty range when none is stuck, or
    /// while a round that ended early waits.
    fn stuck_slice(&mut self, since: i64) -> (i64, i64) {
        let r = &mut self.unfinished;
        let in_flight = &r.in_flight;
        r.slices.next(
            in_flight_rounds_of(&self.spec),
            || in_flight.values().copied().filter(|s| *s < since),
            |_| since.saturating_sub(1),
        )
    }

    /// [`Incremental`] on MySQL and MariaDB through the index on (status,
    /// received_at) ([`Self::in_flight_status_query`]): the rows in flight
    /// started within the horizon are looked up by id on every poll, as
    /// elsewhere (their pages are the recent ones); of those started earlier
    /// the next slice of arrivals is read as ids and status words from the
    /// index alone, so that each stuck row is checked about once per
    /// `overlap` (or in as many more polls as keep it to about
    /// [`STUCK_PER_POLL`] a poll, as the look-ups in turn do). A stuck row is
    /// looked up by id only when its status word means another status than
    /// the one kept, when the range no longer returns it (back to pending,
    /// finished or deleted by hand), or when it is not known in flight. What
    /// the index cannot show — a redelivery, a new error text, attempts
    /// moved by hand with the status unchanged — is seen with the row's next
    /// change of status or start. Rows the tails read this poll are not
    /// looked up again. Returns the index entries read and the rows looked
    /// up by id.
    async fn check_in_flight(
        &mut self,
        tx: &mut AnyConnection,
        db_now: i64,
        since: i64,
        query: String,
    ) -> Result<(u64, u64), SourceError> {
        // The stuck rows by arrival, as the backlog keeps it; one without
        // (its `received_at` unusable) is looked up by id in turn.
        let (turn, rounds) = self.next_turn(since);
        // The recent rows in flight by key; the stuck ones are gone through
        // again where needed rather than listed (with 100,000 stuck, a list
        // of them and their arrivals was 3 MB allocated on every poll).
        let recent: Vec<u64> = self
            .unfinished
            .in_flight
            .iter()
            .filter(|(_, started)| **started >= since)
            .map(|(k, _)| *k)
            .collect();
        let backlog = &self.backlog;
        let born = |k: &u64| backlog.get(*k).and_then(|u| u.born());
        let in_flight = &self.unfinished.in_flight;
        let stuck = || {
            in_flight
                .iter()
                .filter(|(_, started)| **started < since)
                .map(|(k, _)| k)
        };
        // The round ends at the latest arrival kept (one stamped ahead of the
        // database's clock included), at the database's time otherwise.
        let (lo, hi) = self.unfinished.slices.next(
            in_flight_rounds_of(&self.spec),
            || stuck().filter_map(born),
            |latest| latest.unwrap_or(db_now).max(db_now),
        );
        let rows = read_range(self.sql, tx, query, (lo, hi)).await?;
        let mut returned = HashSet::with_capacity(rows.len());
        let changed = self.changed_statuses(&rows, &mut returned)?;
        // A full page (more rows in flight share the slice's arrivals than
        // `batch_size`, as a bulk insert stamped with one second can make):
        // what it left out cannot be told from what left, so the rows of the
        // slice it did not return are not looked up all at once; the stuck
        // rows are looked up in turn by id instead until the next reconcile
        // finds the index again.
        let full = rows.len() >= self.spec.batch_size;
        if full {
            info!(source = %self.spec.name, "A slice of the stuck rows' arrivals holds more rows in flight than batch_size: the stuck rows are looked up by id in turn until the next reconcile.");
            self.in_flight_index = Some(false);
        }
        // The recent rows, the stuck ones without an arrival in turn, and
        // those of the slice that it no longer returned.
        let left = stuck().filter(|k| match born(k) {
            None => **k % rounds == turn,
            Some(b) => !full && b > lo && b <= hi && !returned.contains(*k),
        });
        let r = &self.unfinished;
        let mut due = r.with_ids(
            backlog,
            recent.iter().chain(left).filter(|k| !r.tailed.contains(k)),
        );
        let again: HashSet<u64> = changed.iter().map(|(k, _)| *k).collect();
        due.retain(|(k, _)| !again.contains(k));
        due.extend(changed);
        let looked_up = self.look_up(tx, &due, db_now, false).await?;
        Ok((rows.len() as u64, looked_up))
    }

    /// Takes the rows read in full that the tails did not read this poll;
    /// returns the keys of every row read.
    fn take_untailed(&mut self, rows: &[AnyRow]) -> Result<HashSet<u64>, SourceError> {
        let mut returned = HashSet::with_capacity(rows.len());
        for row in rows {
            let key = row_key(row)?;
            returned.insert(key);
            if !self.unfinished.tailed.contains(&key) {
                self.take(row, false)?;
            }
        }
        Ok(returned)
    }

    /// The rows known in flight, started after `recent` or within the slice
    /// (`lo`, `hi`], that the ranges read did not return and the tails did
    /// not read: they left the rows in flight, and are looked up by id.
    fn left_in_flight(
        &self,
        recent: i64,
        (lo, hi): (i64, i64),
        returned: &HashSet<u64>,
    ) -> Vec<(u64, Box<str>)> {
        let r = &self.unfinished;
        r.with_ids(
            &self.backlog,
            r.in_flight
                .iter()
                .filter(|(_, s)| **s > recent || (**s > lo && **s <= hi))
                .filter(|(k, _)| !returned.contains(k) && !r.tailed.contains(k))
                .map(|(k, _)| k),
        )
    }

    /// Of rows read as (event id, status word), those whose status means
    /// another class than the backlog keeps for them, or that it does not
    /// keep: they changed, and are looked up in full. Rows the tails read
    /// this poll are left out. Every id read goes into `returned`.
    fn changed_statuses(
        &self,
        rows: &[AnyRow],
        returned: &mut HashSet<u64>,
    ) -> Result<Vec<(u64, Box<str>)>, SourceError> {
        let mut changed = Vec::new();
        for row in rows {
            let id: Option<String> = get(row, 0, "event_id").map_err(SourceError::Schema)?;
            let word: Option<String> = get(row, 1, "status").map_err(SourceError::Schema)?;
            let Some(id) = id else {
                continue;
            };
            let key = key_of(&id);
            returned.insert(key);
            if self.unfinished.tailed.contains(&key) {
                continue;
            }
            // A word the agent does not take as a status (one the server's
            // collation matched) would read the same in full: not looked
            // up. A row kept with another status, or not kept, changed.
            let Some(shown) = word.and_then(|w| self.kind.class_of_word(&w)) else {
                continue;
            };
            if self.backlog.get(key).map(|u| u.class()) != Some(shown) {
                changed.push((key, id.into()));
            }
        }
        Ok(changed)
    }

    /// Takes a row's current version into the backlog; returns its key.
    fn see(&mut self, row: &AnyRow) -> Result<u64, SourceError> {
        let (key, unfinished) = self.kind.unfinished(row).map_err(SourceError::Schema)?;
        self.backlog.update(key, unfinished);
        Ok(key)
    }
}

/// The rows of `query` in the range (`lo`, `hi`] of its two parameters;
/// none, and no statement sent, for an empty range (nothing stuck, or a
/// round waiting).
async fn read_range(
    sql: Sql,
    tx: &mut AnyConnection,
    query: String,
    (lo, hi): (i64, i64),
) -> Result<Vec<AnyRow>, SourceError> {
    if lo >= hi {
        return Ok(Vec::new());
    }
    bind(
        bind(sqlx::query(sqlx::AssertSqlSafe(query)), sql.cursor(lo)),
        sql.cursor(hi),
    )
    .fetch_all(&mut *tx)
    .await
    .map_err(query_error)
}

/// What the tails of one poll read: how far back, and what was read before.
struct Window {
    db_now: i64,
    /// Microseconds before each high-water mark.
    lookback: i64,
    /// PostgreSQL: the snapshot xmin of the poll that read the range last.
    seen_before: i64,
    /// PostgreSQL: this poll's snapshot xmin.
    snapshot_xmin: i64,
    baseline: bool,
}

/// The next slice (`lo`, `hi`] of the values `values` yields (one per stuck
/// row: its start, or on MySQL its arrival), up to `end` (given the greatest
/// value, if any): about one round's share of them (`rounds`, of their
/// number: [`in_flight_rounds`]), every row of the last value taken. The
/// slices follow each other from the least value (`stuck_after` holds where
/// the last one ended); the one that reaches `end` ends the round. An empty
/// range when there are none. `values` is gone through twice rather than
/// listed: the rows in flight can be a large part of the backlog, and this
/// runs on every poll.
fn next_slice<I: Iterator<Item = i64>>(
    stuck_after: &mut Option<i64>,
    rounds: impl FnOnce(usize) -> u64,
    values: impl Fn() -> I,
    end: impl FnOnce(Option<i64>) -> i64,
) -> (i64, i64) {
    let mut count = 0usize;
    let mut bounds: Option<(i64, i64)> = None;
    for v in values() {
        count += 1;
        bounds = Some(bounds.map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v))));
    }
    let end = end(bounds.map(|(_, latest)| latest));
    let Some((earliest, _)) = bounds else {
        *stuck_after = None;
        return (end, end);
    };
    let rounds = rounds(count);
    let share = usize::try_from(rounds).map_or(1, |n| count.div_ceil(n).max(1));
    let lo = stuck_after
        .filter(|p| *p < end)
        .unwrap_or(earliest.saturating_sub(1));
    // The `share` least values after `lo`, greatest on top: the top is the
    // share-th least, where the slice ends.
    let mut least: BinaryHeap<i64> = BinaryHeap::with_capacity(share.min(count) + 1);
    let mut after = 0usize;
    for v in values().filter(|v| *v > lo) {
        after += 1;
        if least.len() < share {
            least.push(v);
        } else if least.peek().is_some_and(|top| v < *top) {
            least.pop();
            least.push(v);
        }
    }
    match least.peek() {
        Some(hi) if after > share => {
            *stuck_after = Some(*hi);
            (lo, *hi)
        }
        _ => {
            *stuck_after = None;
            (lo, end)
        }
    }
}

/// [`in_flight_rounds`] with the source's `overlap` and `poll_interval`.
fn in_flight_rounds_of(spec: &TableSpec) -> impl FnOnce(usize) -> u64 {
    let (overlap, poll_interval) = (spec.overlap, spec.poll_interval);
    move |stuck| in_flight_rounds(overlap, poll_interval, stuck)
}

/// In how many polls the `stuck` rows in flight started before the horizon
/// are looked up in turn: `overlap` over `poll_interval` (each about once
/// per `overlap`), or more where that would take over [`STUCK_PER_POLL`]
/// of them a poll; at least one.
fn in_flight_rounds(overlap: Duration, poll_interval: Duration, stuck: usize) -> u64 {
    let interval = poll_interval.as_micros().max(1);
    let per_overlap = u64::try_from(overlap.as_micros().div_ceil(interval)).unwrap_or(u64::MAX);
    let per_cap = u64::try_from(stuck.div_ceil(STUCK_PER_POLL)).unwrap_or(u64::MAX);
    per_overlap.max(per_cap).max(1)
}

/// The index a plan reads its table through when every read of it is a range
/// of one of `indexes` (PostgreSQL: index scans, no sequential scan, and no
/// row filtered out after the index — a partial index over more than the
/// rows in flight, `WHERE started_at IS NOT NULL`, would be one; SQLite:
/// `SEARCH … USING INDEX`, no `SCAN`); `None` otherwise.
fn plan_uses(plan: &[String], indexes: &[String], table: &str, dialect: Dialect) -> Option<String> {
    let mut used: Option<String> = None;
    for line in plan {
        let line = line.trim_start().trim_start_matches("->").trim_start();
        let name = match dialect {
            Dialect::Postgres => {
                if line.contains("Seq Scan") || line.starts_with("Filter:") {
                    return None;
                }
                let Some((_, rest)) = line
                    .split_once("Index Scan using ")
                    .or_else(|| line.split_once("Index Only Scan using "))
                    .or_else(|| line.split_once("Bitmap Index Scan on "))
                else {
                    continue;
                };
                rest.split_whitespace().next().unwrap_or(rest)
            }
            Dialect::Sqlite => {
                // Only the table's own lines: `SCAN stuck` reads the
                // slice's subquery.
                let of_table = |verb: &str| {
                    line.strip_prefix(verb)
                        .and_then(|r| r.strip_prefix(table))
                        .is_some_and(|r| r.is_empty() || r.starts_with(' '))
                };
                if of_table("SCAN ") {
                    return None;
                }
                if !of_table("SEARCH ") {
                    continue;
                }
                let (_, rest) = line
                    .split_once(" USING INDEX ")
                    .or_else(|| line.split_once(" USING COVERING INDEX "))?;
                rest.split_whitespace().next().unwrap_or(rest)
            }
            Dialect::MySql => return None,
        };
        let name = name.trim().trim_matches('"');
        if !indexes.iter().any(|i| i == name) {
            return None;
        }
        used.get_or_insert_with(|| name.to_string());
    }
    used
}

/// How far back (µs) from a poll's start a read of MariaDB's pairs may still
/// cover ([`ReadPairs`]): the late-commit slices' reach, a poll or two
/// behind, and the look-back.
fn pairs_reach(spec: &TableSpec) -> i64 {
    let reach = spec.overlap + 2 * spec.poll_interval + COMMIT_LAG;
    i64::try_from(reach.as_micros()).unwrap_or(i64::MAX)
}

fn query_error(e: sqlx::Error) -> SourceError {
    SourceError::Query(e.to_string())
}

/// Sets a new session up: UTC, read-only transactions, the statement timeout.
async fn setup_session(
    conn: &mut AnyConnection,
    sql: Sql,
    timeout: Duration,
) -> Result<(), sqlx::Error> {
    for stmt in sql.session_setup() {
        sqlx::raw_sql(sqlx::AssertSqlSafe(stmt))
            .execute(&mut *conn)
            .await?;
    }
    for stmt in sql.optional_setup() {
        if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(stmt.clone()))
            .execute(&mut *conn)
            .await
        {
            debug!(statement = %stmt, error = %e, "Session setting refused; going on without it.");
        }
    }
    set_statement_timeout(conn, sql, timeout).await
}

/// Sets the session's statement timeout (PostgreSQL `statement_timeout`;
/// MariaDB `max_statement_time` or MySQL `max_execution_time`, whichever the
/// server has). A poll that sets a longer one sets it back when it succeeds;
/// when it fails, its connection is closed.
async fn set_statement_timeout(
    conn: &mut AnyConnection,
    sql: Sql,
    timeout: Duration,
) -> Result<(), sqlx::Error> {
    for stmt in sql.statement_timeout(timeout) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(stmt))
            .execute(&mut *conn)
            .await?;
    }
    let variants = sql.statement_timeout_variants(timeout);
    if !variants.is_empty() {
        let mut ok = false;
        for stmt in variants {
            if sqlx::raw_sql(sqlx::AssertSqlSafe(stmt))
                .execute(&mut *conn)
                .await
                .is_ok()
            {
                ok = true;
                break;
            }
        }
        if !ok {
            debug!("No statement timeout variable on this server.");
        }
    }
    Ok(())
}

/// A poll's connection from the pool, handed back only if the poll
/// succeeded, else closed: the pool opens a new one rather than handing this
/// one out again. After a failed poll it may be broken or mid-transaction.
/// After a poll dropped before it finished (cut short by its time limit),
/// handing it back would first read the rest of the cancelled statement's
/// answer, as long as the database takes to send it (up to the statement's
/// own limit, the long one of a full read), holding one of the pool's few
/// sessions all that while and keeping that limit: the polls after it could
/// find no session within `timeout` and fail with the pool's time-out, on
/// and on.
struct Held {
    conn: sqlx::pool::PoolConnection<sqlx::Any>,
    /// Set once the poll succeeded.
    ok: bool,
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.ok {
            self.conn.close_on_drop();
        }
    }
}

/// A session of `pool` for a poll of `spec`. The pool waits for a login up
/// to [`login_timeout`], and retries one the server turned away (refused,
/// `too many clients`, a role's connection limit) until then, saying at the
/// end only that the time ran out. So once `timeout` has passed without a
/// session while the pool has room for one (it is logging in), one more
/// login, outside the pool, tells the two apart: turned away, its error fails
/// the poll at once, in the server's words (an owner that cannot poll gives
/// the source up as soon as before); logged in, it is closed, and the poll
/// waits for the pool's own login (a loaded server, slow to log in).
async fn session(
    spec: &TableSpec,
    pool: &AnyPool,
) -> Result<sqlx::pool::PoolConnection<sqlx::Any>, SourceError> {
    let connect = |message: String| SourceError::Connect {
        dsn: spec.dsn.to_string(),
        message,
    };
    let max = pool.options().get_max_connections();
    let waited = humantime::format_duration(pool.options().get_acquire_timeout());
    let failed = |e: sqlx::Error| {
        connect(match e {
            sqlx::Error::PoolTimedOut if pool.size() >= max => format!(
                "each of the {max} sessions this agent keeps on the database \
                 ([server] max_connections_per_database) stayed busy for {waited}"
            ),
            sqlx::Error::PoolTimedOut => format!("no login finished within {waited}"),
            e => spec.dsn.scrub(&e.to_string()),
        })
    };
    let acquire = pool.acquire();
    tokio::pin!(acquire);
    tokio::select! {
        got = &mut acquire => return got.map_err(failed),
        _ = tokio::time::sleep(spec.timeout) => {}
    }
    if pool.size() < max {
        let url = connect_url(spec);
        let probe = AnyConnection::connect(&url);
        tokio::pin!(probe);
        tokio::select! {
            got = &mut acquire => return got.map_err(failed),
            probe = &mut probe => match probe {
                Err(e) => return Err(connect(spec.dsn.scrub(&e.to_string()))),
                Ok(conn) => {
                    let _ = conn.close().await;
                }
            },
        }
    }
    acquire.await.map_err(failed)
}

/// Longest a poll waits for a session of its pool: `timeout`, or
/// [`LOGIN_WAIT`] where that is longer (up to `full_read_timeout`). A poll
/// whose limit is `timeout` is cut at its limit anyway; one given longer (the
/// first, a full reconcile, a retry after a poll cut short) can use it. sqlx
/// drops a login at this limit: at `timeout`, a server slower to log in than
/// that (a loaded one) was never connected, whatever limit the poll had.
fn login_timeout(spec: &TableSpec) -> Duration {
    spec.timeout.max(LOGIN_WAIT.min(spec.full_read_timeout))
}

/// See [`login_timeout`]: long enough for a login on a loaded server.
const LOGIN_WAIT: Duration = Duration::from_secs(10);

/// The poll connections of an agent: one small pool per database (and
/// statement timeout), shared by every source on it, so that the sessions an
/// agent opens do not grow with the number of sources.
pub struct Pools {
    max_connections: u32,
    by_database: std::sync::Mutex<HashMap<(String, Duration, Duration), AnyPool>>,
}

impl Pools {
    /// Pools of at most `max_connections` sessions each.
    pub fn new(max_connections: u32) -> Self {
        Pools {
            max_connections,
            by_database: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The pool of `spec`'s database; connects lazily.
    pub fn get(&self, spec: &TableSpec) -> Result<AnyPool, SourceError> {
        let mut pools = self.by_database.lock().unwrap_or_else(|e| e.into_inner());
        let key = (
            spec.dsn.expose().to_string(),
            spec.timeout,
            login_timeout(spec),
        );
        if let Some(pool) = pools.get(&key) {
            return Ok(pool.clone());
        }
        let sql = Sql {
            dialect: spec.dsn.dialect(),
        };
        let timeout = spec.timeout;
        let pool = AnyPoolOptions::new()
            .max_connections(self.max_connections)
            .min_connections(0)
            .acquire_timeout(login_timeout(spec))
            .idle_timeout(Duration::from_secs(60))
            // A broken connection fails its poll and is closed then; a test
            // query before every poll would cost a round trip each.
            .test_before_acquire(false)
            .after_connect(move |conn, _meta| {
                Box::pin(async move { setup_session(conn, sql, timeout).await })
            })
            .connect_lazy(&connect_url(spec))
            .map_err(|e| SourceError::Connect {
                dsn: spec.dsn.to_string(),
                message: spec.dsn.scrub(&e.to_string()),
            })?;
        pools.insert(key, pool.clone());
        Ok(pool)
    }
}

/// Opens a checked, read-only connection for a table source.
pub struct Opener {
    spec: TableSpec,
    sql: Sql,
    columns: Vec<(String, String)>,
    event_id: String,
    unmapped: Vec<&'static str>,
}

/// What [`Opener::check_schema`] found of a table.
#[derive(Debug, Clone)]
pub struct Checked {
    /// Each optional meaning whose own-named column the table has but the
    /// source does not map, with the line that maps it.
    pub notes: Vec<String>,
    /// PostgreSQL: whether the rows carry `xmin`.
    pub xmin: bool,
    /// PostgreSQL: whether a row's `ctid` names it in the whole relation.
    pub tids: bool,
    /// How look-ups bind event ids, from the id column's type.
    pub id_bind: IdBind,
}

impl Opener {
    /// Connects, sets the session up (UTC, read-only, statement timeout) and
    /// checks the table and its mapped columns; also says what it found of
    /// them (see [`Opener::check_schema`]).
    pub async fn open(self) -> Result<(AnyConnection, Checked), SourceError> {
        let url = connect_url(&self.spec);
        let connect_err = |e: sqlx::Error| SourceError::Connect {
            dsn: self.spec.dsn.to_string(),
            message: self.spec.dsn.scrub(&e.to_string()),
        };
        let mut conn = AnyConnection::connect(&url).await.map_err(connect_err)?;
        setup_session(&mut conn, self.sql, self.spec.timeout)
            .await
            .map_err(connect_err)?;
        let checked = self.check_schema(&mut conn).await?;
        Ok((conn, checked))
    }

    /// Names the missing table or columns before the first query fails on
    /// them. Returns how look-ups bind event ids (from the id column's
    /// type) and whether the rows carry PostgreSQL's `xmin`, which the
    /// tail filters re-read rows by: a table does, a view (or a foreign
    /// table) does not, and is then read without that filter.
    async fn check_schema(&self, conn: &mut AnyConnection) -> Result<Checked, SourceError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(
            self.sql.columns_query(&self.spec.table),
        ))
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| SourceError::Query(e.to_string()))?;
        let mut present = HashMap::new();
        for row in &rows {
            let name: String = row
                .try_get(0)
                .map_err(|e| SourceError::Query(e.to_string()))?;
            let ty: String = row.try_get(1).unwrap_or_default();
            present.insert(name, ty);
        }
        if present.is_empty() {
            return Err(SourceError::Schema(format!(
                "table \"{}\" does not exist or is not readable ({}.table)",
                self.spec.table, self.spec.key
            )));
        }
        let mut missing: Vec<String> = Vec::new();
        for (at, col) in &self.columns {
            if present.contains_key(col.as_str()) {
                continue;
            }
            let line = if at.starts_with("columns.") {
                format!(
                    "table \"{}\" has no column \"{col}\" ({}.{at})",
                    self.spec.table, self.spec.key
                )
            } else {
                format!(
                    "{}.{at}: unknown column \"{col}\" (table \"{}\" has no such column)",
                    self.spec.key, self.spec.table
                )
            };
            if !missing.contains(&line) {
                missing.push(line);
            }
        }
        if !missing.is_empty() {
            return Err(SourceError::Schema(missing.join("; ")));
        }
        let id_bind = self
            .sql
            .id_bind(present.get(&self.event_id).map_or("", String::as_str));
        let notes: Vec<String> = self
            .unmapped
            .iter()
            .filter(|m| present.contains_key(**m) && !self.columns.iter().any(|(_, c)| c == **m))
            .map(|m| {
                format!(
                    "The table has a column \"{m}\" that is not mapped, so {m} is not used; \
                     to use it, add under [sources.columns]: {m} = \"{m}\""
                )
            })
            .collect();
        if self.sql.snapshot_xmin().is_none() {
            return Ok(Checked {
                xmin: false,
                tids: false,
                id_bind,
                notes,
            });
        }
        let kind: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT CAST(relkind AS TEXT) FROM pg_class WHERE oid = to_regclass({})",
            self.sql.literal(&self.sql.table(&self.spec.table))
        )))
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| SourceError::Query(e.to_string()))?;
        // Tables, partitioned tables and materialized views have row versions.
        Ok(Checked {
            xmin: matches!(kind.as_deref(), Some("r" | "p" | "m")),
            tids: matches!(kind.as_deref(), Some("r" | "m")),
            id_bind,
            notes,
        })
    }
}

impl<K: TableKind> Source for TableSource<K> {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn poll_interval(&self) -> Duration {
        self.spec.poll_interval
    }

    /// `full_read_timeout` for a poll that reads every unfinished row (the
    /// first, a full reconcile) or counts them (the reconcile's check, every
    /// `reconcile_every`); `timeout` for the others, doubled for
    /// each poll in a row that was cut short, up to `full_read_timeout`.
    /// What a poll must read after a burst (a bulk insert's rows, three
    /// times without `xmin`) can take longer than `timeout` on a loaded
    /// database; a retry with the same limit would read the same rows and be
    /// cut again, for good.
    fn timeout(&self) -> Duration {
        if let Some(limit) = self.decided.get() {
            return limit;
        }
        // A source that re-reads its unfinished rows every poll keeps no
        // backlog to check.
        if !self.rereads_every_poll()
            && self
                .last_reconcile
                .is_none_or(|t| t.elapsed() >= self.spec.reconcile_every)
        {
            self.check_due.set(true);
        }
        let limit = if !self.started || self.full_due || self.check_due.get() {
            self.spec.full_read_timeout
        } else {
            self.spec
                .timeout
                .saturating_mul(1u32 << self.begun.min(16))
                .min(self.spec.full_read_timeout)
        };
        self.decided.set(Some(limit));
        limit
    }

    async fn poll(&mut self) -> Result<PollStats, SourceError> {
        let limit = self.timeout();
        self.decided.set(None);
        if self.begun > 0 && limit > self.spec.timeout {
            info!(
                source = %self.spec.name,
                polls = self.begun,
                limit = %humantime::format_duration(limit),
                "The last polls did not finish; this one may take longer."
            );
        }
        self.begun = self.begun.saturating_add(1);
        self.limit = limit;
        let stats = self.poll_once().await?;
        self.begun = 0;
        Ok(stats)
    }

    fn reset(&mut self) {
        self.conn = None;
    }
}

fn bind<'q>(
    query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    param: Param,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
    match param {
        Param::Int(v) => query.bind(v),
        Param::Text(v) => query.bind(v),
    }
}

/// The URL the agent connects with: SQLite files are opened read-only.
pub fn connect_url(spec: &TableSpec) -> String {
    let url = spec.dsn.expose();
    if spec.dsn.dialect() == Dialect::Sqlite && !url.contains("mode=") {
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}mode=ro")
    } else {
        url.to_string()
    }
}

/// Per-label-id sums of a poll, recorded once at its end.
#[derive(Debug, Default)]
pub(crate) struct Rejections {
    counts: HashMap<Reject, u64>,
    created: bool,
    /// This poll's rows read and those unusable, for [`Degraded`].
    poll: Tally,
    degraded: Degraded,
}

/// Rows read and rows unusable (rejected by their checks, re-reads
/// included), by reason.
#[derive(Debug, Default, Clone)]
struct Tally {
    read: u64,
    unusable: HashMap<Reject, u64>,
}

/// Over how long the share of unusable rows is taken.
pub const DEGRADED_WINDOW: Duration = Duration::from_secs(5 * 60);
/// The fewest rows read in [`DEGRADED_WINDOW`] that can make a source degraded.
pub const DEGRADED_MIN_ROWS: u64 = 10;

/// Whether most rows a source read lately were unusable: more than half of
/// the rows read in [`DEGRADED_WINDOW`] (at least [`DEGRADED_MIN_ROWS`]), and
/// the reason most of them had.
#[derive(Debug, Default)]
struct Degraded {
    polls: VecDeque<(Instant, Tally)>,
}

impl Degraded {
    fn push(&mut self, now: Instant, tally: Tally) -> Option<Reject> {
        self.polls.push_back((now, tally));
        while self
            .polls
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > DEGRADED_WINDOW)
        {
            self.polls.pop_front();
        }
        let read: u64 = self.polls.iter().map(|(_, t)| t.read).sum();
        let mut unusable: HashMap<Reject, u64> = HashMap::new();
        for (reason, n) in self.polls.iter().flat_map(|(_, t)| &t.unusable) {
            *unusable.entry(*reason).or_default() += n;
        }
        let rejected: u64 = unusable.values().sum();
        if read < DEGRADED_MIN_ROWS || rejected * 2 <= read {
            return None;
        }
        unusable
            .into_iter()
            .max_by_key(|(reason, n)| (*n, std::cmp::Reverse(reason.as_str())))
            .map(|(reason, _)| reason)
    }
}

impl Rejections {
    pub(crate) fn add(&mut self, reason: Reject) {
        *self.counts.entry(reason).or_default() += 1;
    }

    /// One row read (each read, re-reads included).
    pub(crate) fn read(&mut self) {
        self.poll.read += 1;
    }

    /// A row read that cannot be used at all, for `reason` (each read).
    pub(crate) fn unusable(&mut self, reason: Reject) {
        *self.poll.unusable.entry(reason).or_default() += 1;
    }

    /// Records the poll's rejections; every reason's series exists from the
    /// first poll on, at 0, so that the first rejection shows in `rate()`.
    pub(crate) fn flush(&mut self, source: &str) {
        if !self.created {
            self.created = true;
            for reason in Reject::ALL {
                metrics::counter!(metric::ROWS_REJECTED, "source" => source.to_string(), "reason" => reason.as_str())
                    .increment(0);
            }
        }
        for (reason, n) in self.counts.drain() {
            metrics::counter!(metric::ROWS_REJECTED, "source" => source.to_string(), "reason" => reason.as_str())
                .increment(n);
        }
        let degraded = self
            .degraded
            .push(Instant::now(), std::mem::take(&mut self.poll));
        for reason in Reject::UNUSABLE {
            metrics::gauge!(metric::SOURCE_DEGRADED, "source" => source.to_string(), "reason" => reason.as_str())
                .set(if degraded == Some(reason) { 1.0 } else { 0.0 });
        }
    }
}

/// Reads column `i` of a row, naming the meaning in the error.
pub(crate) fn get<'r, T>(row: &'r AnyRow, i: usize, meaning: &str) -> Result<T, String>
where
    T: sqlx::Decode<'r, sqlx::Any> + sqlx::Type<sqlx::Any>,
{
    row.try_get(i)
        .map_err(|e| format!("column for {meaning} has an unusable type: {e}"))
}

/// A time of the select list (written with [`Sql::row_time`]; the events
/// log's list with [`Sql::micros`]): microseconds since the epoch, or
/// [`sql::OUT_OF_RANGE`].
pub(crate) fn get_time(row: &AnyRow, i: usize, meaning: &str) -> Result<Option<i64>, String> {
    use sqlx::ValueRef;
    use sqlx::any::AnyTypeInfoKind;
    let unusable =
        |e: &dyn std::fmt::Display| format!("column for {meaning} has an unusable type: {e}");
    let raw = row.try_get_raw(i).map_err(|e| unusable(&e))?;
    if raw.is_null() || raw.type_info().kind() != AnyTypeInfoKind::Blob {
        return get(row, i, meaning);
    }
    let bytes = <&[u8] as sqlx::Decode<sqlx::Any>>::decode(raw).map_err(|e| unusable(&e))?;
    Sql::read_time(bytes).map(Some).map_err(|e| unusable(&e))
}

/// The key of a row read with the source's select list (its event id first).
fn row_key(row: &AnyRow) -> Result<u64, SourceError> {
    let id: Option<String> = get(row, 0, "event_id").map_err(SourceError::Schema)?;
    Ok(key_of(id.as_deref().unwrap_or_default()))
}

/// A stable 64-bit key of an event id (SipHash with fixed keys).
pub(crate) fn key_of(event_id: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new_with_keys(0x696e_626f_7877_6174, 0x6368_6576_656e_7473);
    event_id.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    fn tally(read: u64, unusable: &[(Reject, u64)]) -> Tally {
        Tally {
            read,
            unusable: unusable.iter().copied().collect(),
        }
    }

    /// Guards the degraded state: more than half of at least 10 rows read
    /// in the window, by the reason most had, and healthy again once the
    /// rejected polls leave the window.
    #[test]
    fn a_source_is_degraded_while_most_recent_rows_are_unusable() {
        let t0 = Instant::now();
        let mut d = Degraded::default();
        // 9 rows, all rejected: too few to tell.
        assert_eq!(d.push(t0, tally(9, &[(Reject::UnknownStatus, 9)])), None);
        // 20 rows, 14 rejected: most of them for unknown_status.
        let two = tally(11, &[(Reject::UnknownStatus, 1), (Reject::NullTime, 4)]);
        assert_eq!(d.push(t0, two), Some(Reject::UnknownStatus));
        // 40 rows, 14 rejected: half or less is not degraded.
        assert_eq!(d.push(t0 + Duration::from_secs(60), tally(20, &[])), None);
        // The rejected polls leave the window; null_time now leads.
        let later = t0 + DEGRADED_WINDOW + Duration::from_secs(1);
        let nulls = tally(10, &[(Reject::NullTime, 6), (Reject::UnknownStatus, 1)]);
        assert_eq!(d.push(later, nulls), None, "20 + 10 rows, 7 rejected");
        let nulls = tally(10, &[(Reject::NullTime, 10)]);
        let last = later + DEGRADED_WINDOW - Duration::from_secs(30);
        assert_eq!(
            d.push(last, nulls),
            Some(Reject::NullTime),
            "20 rows, 17 rejected"
        );
    }

    /// Guards the time limits a poll is given: `full_read_timeout` for the
    /// first poll and for one that counts the backlog (every
    /// `reconcile_every`), decided as the poll begins and the same when the
    /// poll asks again; `timeout` between. A cold CI pass counted 300,000
    /// unfinished MariaDB rows in more than the 1 s `timeout`, so every check
    /// failed its poll.
    #[test]
    fn a_poll_that_counts_the_backlog_may_take_full_read_timeout() {
        let text = "[[sources]]\nname = \"orders\"\nkind = \"inbox\"\n\
                    dsn = \"postgres://u@db/orders\"\ntable = \"inbox\"\n\
                    timeout = \"1s\"\nfull_read_timeout = \"1m\"\nreconcile_every = \"1h\"\n\
                    columns = { event_id = \"id\", status = \"status\", received_at = \"received_at\", \
                    started_at = \"started_at\", finished_at = \"finished_at\" }\n";
        let cfg = crate::config::parse_str(text).expect("valid");
        let crate::sources::SourceSpec::Inbox(s) = &cfg.sources[0] else {
            panic!("expected an inbox source")
        };
        let mut source = TableSource::new(s.table.clone(), inbox::Inbox::new(s.clone()));
        assert!(!source.rereads_every_poll(), "the shape keeps its backlog");
        let (short, full) = (Duration::from_secs(1), Duration::from_secs(60));
        let begin = |source: &TableSource<inbox::Inbox>| {
            let limit = source.timeout();
            source.decided.set(None);
            limit
        };
        assert_eq!(begin(&source), full, "the first poll");
        source.started = true;
        source.last_reconcile = Some(Instant::now());
        source.check_due.set(false);
        assert_eq!(begin(&source), short, "between checks");
        let hour = Duration::from_secs(3600);
        source.last_reconcile = Instant::now().checked_sub(hour);
        // The poll loop asks, then the poll: a check decided stays decided.
        assert_eq!(source.timeout(), full, "a check is due");
        source.last_reconcile = Some(Instant::now());
        assert_eq!(source.timeout(), full, "asked again by the poll");
        assert!(source.check_due.get());
        // Cut short before its check: the next poll checks, with the limit.
        source.decided.set(None);
        assert_eq!(begin(&source), full);
        source.check_due.set(false);
        assert_eq!(begin(&source), short);
    }

    /// Guards what MariaDB's look-back and slices skip: a pair read before,
    /// not the same event with another value, and nothing once forgotten.
    #[test]
    fn read_pairs_know_an_event_by_its_value_until_forgotten() {
        let mut p = ReadPairs::default();
        p.insert(10 * S, 1, 5 * S);
        p.insert(12 * S, 1, 11 * S);
        p.insert(12 * S, 2, 11 * S);
        // Read again later: still forgotten with its first reading.
        p.insert(20 * S, 1, 5 * S);
        assert!(p.contains(1, 5 * S));
        assert!(!p.contains(1, 6 * S), "a new value is a new version");
        assert!(!p.contains(3, 11 * S));
        p.prune(11 * S);
        assert!(!p.contains(1, 5 * S));
        assert!(p.contains(1, 11 * S) && p.contains(2, 11 * S));
        p.prune(13 * S);
        assert!(p.set.len() == 0 && p.order.is_empty() && p.reads.is_empty());
    }

    /// A pair's 64 bits tell apart the pairs a poll keeps: a grid of keys
    /// (small, as in these tests, and SipHashes of ids) by nearby values
    /// (one microsecond apart, and times of one second) gives as many
    /// distinct values as pairs.
    #[test]
    fn pairs_of_one_key_or_one_value_never_collide() {
        let keys: Vec<u64> = (0..300u64)
            .chain((0..300).map(|i| key_of(&format!("evt-{i}"))))
            .collect();
        let values: Vec<i64> = (0..300)
            .map(|i| 1_700_000_000_000_000 + i)
            .chain((0..300).map(|i| i * S))
            .collect();
        let mut seen = HashSet::new();
        for k in &keys {
            for v in &values {
                assert!(seen.insert(pair(*k, *v)), "({k}, {v}) collides");
            }
        }
        assert_eq!(seen.len(), keys.len() * values.len());
    }

    #[test]
    fn late_reads_lag_a_third_of_the_overlap_and_all_of_it() {
        assert_eq!(LateReads::lags(30 * S, 2 * S), [10 * S, 30 * S]);
        // Never closer than the look-back every poll reads anyway.
        assert_eq!(LateReads::lags(3 * S, 2 * S), [2 * S, 3 * S]);
    }

    #[test]
    fn a_slice_skips_only_what_a_tail_from_at_or_below_it_read() {
        let mut late = LateReads {
            done: [Some(100 * S), Some(80 * S)],
            tails: [(70 * S, 7), (90 * S, 9), (100 * S, 10), (105 * S, 11)].into(),
        };
        // The latest tail that started at or below the slice's start.
        assert_eq!(late.seen_before(100 * S), 10);
        assert_eq!(late.seen_before(99 * S), 9);
        assert_eq!(late.seen_before(80 * S), 7);
        // Below every tail kept: nothing is known to be read; all rows return.
        assert_eq!(late.seen_before(60 * S), 0);
        // Pruning keeps what the slices still need: the lowest start is 80 s,
        // read after the tail from 70 s.
        late.prune();
        assert_eq!(late.tails.len(), 4);
        late.done = [Some(104 * S), Some(95 * S)];
        late.prune();
        assert_eq!(
            late.tails.iter().copied().collect::<Vec<_>>(),
            [(90 * S, 9), (100 * S, 10), (105 * S, 11)]
        );
        assert_eq!(late.seen_before(95 * S), 9);
    }

    #[test]
    fn look_up_lists_are_padded_to_ten_sizes() {
        assert_eq!(lookup_size(1), 1);
        assert_eq!(lookup_size(3), 4);
        assert_eq!(lookup_size(100), 128);
        assert_eq!(lookup_size(257), LOOKUP_CHUNK);
        assert_eq!(lookup_size(LOOKUP_CHUNK), LOOKUP_CHUNK);
        let sizes: HashSet<usize> = (1..=LOOKUP_CHUNK).map(lookup_size).collect();
        assert_eq!(sizes.len(), 10);
    }

    #[test]
    fn a_reread_row_is_8_bytes_and_its_mark_too() {
        assert_eq!(size_of::<Seen>(), 8);
        let s = Seen {
            at: u32::MAX,
            len: LONG_ID - 1,
            pass: u16::MAX,
        };
        assert_eq!(Seen::of_mark(s.mark()), s);
        assert_ne!(s.mark(), NO_MARK);
    }

    /// Ids of 65,535 bytes and more keep their length in the buffer: they
    /// come back whole beside short ones, through a compaction too, and a
    /// forgotten one leaves a gap of all the bytes it took.
    #[test]
    fn long_ids_are_kept_whole() {
        let mut r = Reread::default();
        let mut b = Backlog::new(0);
        // With the two bytes of "é": 65,534 bytes is short, 65,535 long.
        let lens = [0, 1, 65_532, 65_533, 65_534, 70_000, 200_000];
        let ids: Vec<String> = lens
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let c = char::from(b'a' + i as u8);
                std::iter::repeat_n(c, *n).collect::<String>() + "é"
            })
            .collect();
        for id in &ids {
            r.remember(&mut b, key_of(id), id, 1);
        }
        for id in &ids {
            assert_eq!(r.id(&Seen::of_mark(b.mark(key_of(id)).expect("kept"))), id);
        }
        let total = r.ids.bytes.len();
        r.forget(&mut b, &key_of(&ids[5]));
        assert_eq!(r.ids.gaps, ids[5].len() + LONG_PREFIX);
        r.forget(&mut b, &key_of(&ids[6]));
        assert!(r.ids.bytes.len() < total, "compacted");
        for id in ids.iter().take(5) {
            assert_eq!(r.id(&Seen::of_mark(b.mark(key_of(id)).expect("kept"))), id);
        }
        assert_eq!(r.ids.bytes.len() - r.ids.gaps, {
            let short: usize = ids[..3].iter().map(String::len).sum();
            short + ids[3].len() + ids[4].len() + 2 * LONG_PREFIX
        });
    }

    /// Ids kept end to end stay right through forgetting, re-reads and the
    /// compaction the gaps set off, and the buffer shrinks with the rows.
    #[test]
    fn tracked_ids_survive_their_compaction() {
        let mut r = Reread::default();
        let mut b = Backlog::new(0);
        let id = |i: usize| format!("evt-{i}-{}", "x".repeat(i % 40));
        let mut truth: HashMap<u64, String> = HashMap::new();
        for i in 0..20_000 {
            let key = key_of(&id(i));
            r.remember(&mut b, key, &id(i), 1);
            truth.insert(key, id(i));
        }
        let full = r.ids.bytes.len();
        // Forget three rows in four, one by one, then keep a re-read's rows.
        for i in (0..20_000).filter(|i| i % 4 != 0) {
            let key = key_of(&id(i));
            r.forget(&mut b, &key);
            truth.remove(&key);
        }
        assert!(r.ids.bytes.len() < full / 2, "compacted at least once");
        for (i, key) in (0..20_000).step_by(4).map(|i| (i, key_of(&id(i)))) {
            if i % 8 == 0 {
                let mut s = Seen::of_mark(b.mark(key).expect("kept"));
                s.pass = 2;
                b.set_mark(key, s.mark());
            } else {
                truth.remove(&key);
            }
        }
        r.keep_pass(&mut b, 2);
        assert_eq!(b.marks_len(), truth.len());
        for (key, want) in &truth {
            assert_eq!(r.id(&Seen::of_mark(b.mark(*key).expect("tracked"))), want);
        }
        let live: usize = truth.values().map(String::len).sum();
        assert_eq!(r.ids.bytes.len() - r.ids.gaps, live);
        assert!(r.ids.bytes.len() <= (live * 4 / 3 + 1).max(IDS_COMPACT_FROM));
        r.forget_all(&mut b);
        assert_eq!((b.marks_len(), r.ids.bytes.len()), (0, 0));
    }

    /// The compaction in place against the ids as they were pushed: 100
    /// random rounds of ids pushed and forgotten, each id read back after
    /// every step, in the buffer's order, and after forgetting never more
    /// than a quarter of gaps past the compaction's threshold.
    #[test]
    fn compaction_in_place_keeps_every_id_and_its_order() {
        let mut rng = fastrand::Rng::with_seed(7);
        for round in 0..100 {
            let mut r = Reread::default();
            let mut b = Backlog::new(0);
            let mut truth: std::collections::BTreeMap<u64, String> = Default::default();
            let mut next = 0usize;
            for _ in 0..rng.usize(1..6) {
                for _ in 0..rng.usize(0..3_000) {
                    next += 1;
                    // Lengths from 0 to long ones that keep their length.
                    let n = match rng.u16(0..1_000) {
                        0 => rng.usize(65_530..66_000),
                        1..=50 => 0,
                        _ => rng.usize(1..40),
                    };
                    let id = format!("{next}-{}", "é".repeat(n / 2));
                    r.remember(&mut b, key_of(&id), &id, 1);
                    truth.insert(key_of(&id), id);
                }
                let keys: Vec<u64> = truth.keys().copied().collect();
                let share = rng.u32(0..=100);
                let mut forgot = false;
                for key in keys.into_iter().filter(|_| rng.u32(0..100) < share) {
                    r.forget(&mut b, &key);
                    truth.remove(&key);
                    forgot = true;
                }
                assert_eq!(b.marks_len(), truth.len(), "round {round}");
                for (key, want) in &truth {
                    assert_eq!(
                        r.id(&Seen::of_mark(b.mark(*key).expect("kept"))),
                        want,
                        "round {round}"
                    );
                }
                let len = r.ids.bytes.len();
                // Each forget compacts when due.
                assert!(
                    !forgot || len < IDS_COMPACT_FROM || r.ids.gaps * 4 <= len,
                    "round {round}: {len} bytes, {} gaps",
                    r.ids.gaps
                );
                // Ids keep the order they were pushed in: by their number.
                let mut by_place: Vec<(u32, usize)> = b
                    .marks()
                    .map(|(_, m)| Seen::of_mark(m))
                    .map(|s| (s.at, r.id(&s).split('-').next().unwrap().parse().unwrap()))
                    .collect();
                by_place.sort_unstable();
                assert!(
                    by_place.windows(2).all(|w| w[0].1 < w[1].1),
                    "round {round}"
                );
            }
        }
    }

    /// The runs of set bits and the counts before each place, against one
    /// bit at a time.
    #[test]
    fn runs_and_ranks_are_what_counting_bit_by_bit_finds() {
        let mut rng = fastrand::Rng::with_seed(11);
        for _ in 0..300 {
            let len = rng.usize(0..2_000);
            let mut bits = vec![0u64; len.div_ceil(64)];
            let dense = rng.u32(0..=100);
            let mut want = Vec::new();
            for i in 0..len {
                if rng.u32(0..100) < dense {
                    set_bits(&mut bits, i..i + 1);
                    want.push(i);
                }
            }
            let got: Vec<usize> = runs(&bits, len).flatten().collect();
            assert_eq!(got, want);
            let starts: Vec<usize> = runs(&bits, len).map(|r| r.start).collect();
            assert!(
                starts
                    .iter()
                    .all(|s| *s == 0 || want.binary_search(&(s - 1)).is_err()),
                "runs are maximal"
            );
            let rank = Rank::new(&bits);
            let mut before = 0;
            for i in 0..=bits.len() * 64 {
                assert_eq!(rank.before(i), before);
                before += usize::from(want.binary_search(&i).is_ok());
            }
        }
    }

    #[test]
    fn stuck_rows_in_flight_are_looked_up_in_turn_once_per_overlap() {
        let ms = Duration::from_millis;
        // 10 s of overlap at 300 ms polls: each stuck row every 34th poll.
        assert_eq!(in_flight_rounds(ms(10_000), ms(300), 40), 34);
        assert_eq!(in_flight_rounds(ms(30_000), ms(1_000), 2_000), 30);
        // An overlap shorter than a poll: every stuck row on every poll.
        assert_eq!(in_flight_rounds(ms(500), ms(1_000), 0), 1);
        assert_eq!(in_flight_rounds(ms(0), ms(0), 0), 1);
        // About 100 of them a poll at most: 10,000 stuck rows take 100 polls.
        assert_eq!(in_flight_rounds(ms(30_000), ms(1_000), 10_000), 100);
        assert_eq!(in_flight_rounds(ms(30_000), ms(1_000), 10_001), 101);
        assert_eq!(in_flight_rounds(ms(30_000), ms(1_000), 3_000), 30);
        // Keys spread evenly over the rounds (event ids hashed by key_of):
        // every key has its turn once in `rounds` polls.
        let rounds = in_flight_rounds(ms(10_000), ms(300), 0);
        let mut per_turn = vec![0u32; rounds as usize];
        for i in 0..34_000 {
            per_turn[(key_of(&format!("evt-{i}")) % rounds) as usize] += 1;
        }
        let (lo, hi) = (per_turn.iter().min(), per_turn.iter().max());
        assert!(
            lo.is_some_and(|l| *l > 850) && hi.is_some_and(|h| *h < 1150),
            "{per_turn:?}"
        );
    }

    /// The slices of the stuck rows' starts follow each other from the
    /// earliest: in a round of [`in_flight_rounds`] polls each stuck row is
    /// in exactly one slice (ties of a start in the same one), and a round
    /// ends with the slice that reaches the horizon.
    #[tokio::test]
    async fn stuck_slices_take_every_stuck_row_once_a_round() {
        let (_dir, _writer, mut source) =
            sqlite_inbox("overlap = \"3s\"\nstuck_after = \"2s\"\npoll_interval = \"300ms\"").await;
        let since = 1_000_000;
        // 40 stuck rows, four of them with one start; 5 within the horizon.
        let mut starts: Vec<i64> = (0..36).map(|i| 10_000 + i * 7).collect();
        starts.extend([50_000; 4]);
        for (k, s) in starts.iter().enumerate() {
            source.unfinished.in_flight.insert(k as u64, *s);
        }
        for k in 0..5u64 {
            source
                .unfinished
                .in_flight
                .insert(100 + k, since + k as i64);
        }
        // 3 s over 300 ms: ten rounds, four rows a slice.
        for round in 0..3 {
            let mut seen = vec![0u32; starts.len()];
            let mut last_hi = None;
            for poll in 0..10 {
                let (lo, hi) = source.stuck_slice(since);
                if let Some(h) = last_hi {
                    assert_eq!(lo, h, "round {round}, poll {poll}: slices meet");
                }
                last_hi = Some(hi);
                for (i, s) in starts.iter().enumerate() {
                    if *s > lo && *s <= hi {
                        seen[i] += 1;
                    }
                }
                if poll == 9 {
                    assert_eq!(
                        hi,
                        since - 1,
                        "round {round}: the last slice reaches the horizon"
                    );
                } else {
                    assert!(hi < since - 1, "round {round}, poll {poll}: {hi}");
                }
            }
            assert_eq!(seen, vec![1; starts.len()], "round {round}");
        }
        // Nothing stuck: an empty range.
        source.unfinished.in_flight.retain(|k, _| *k >= 100);
        let (lo, hi) = source.stuck_slice(since);
        assert_eq!((lo, hi), (since - 1, since - 1));
    }

    /// A round of slices takes at least the polls it was given: rows that
    /// share one time are read once a round, not every other poll, and so
    /// is a single stuck row; a round whose slices take their polls, or more
    /// (rows that became stuck during it), is followed by the next at once.
    #[test]
    fn a_round_of_slices_takes_at_least_its_polls() {
        const END: i64 = 1_000;
        /// How often each value is in a slice over `polls` polls, and the
        /// slices.
        fn read(slices: &mut Slices, values: &[i64], polls: usize) -> (Vec<u32>, Vec<(i64, i64)>) {
            let mut seen = vec![0u32; values.len()];
            let mut taken = Vec::new();
            for _ in 0..polls {
                let (lo, hi) = slices.next(|_| 10, || values.iter().copied(), |_| END);
                taken.push((lo, hi));
                for (i, v) in values.iter().enumerate() {
                    if *v > lo && *v <= hi {
                        seen[i] += 1;
                    }
                }
            }
            (seen, taken)
        }
        // 40 rows of one start (more than a slice's share of 4): once in
        // each 10 polls, at the 1st, 11th and 21st.
        let tied = vec![500; 40];
        let mut slices = Slices::default();
        let (seen, taken) = read(&mut slices, &tied, 30);
        assert_eq!(seen, vec![3; 40]);
        assert_eq!(
            (taken[0], taken[10], taken[20]),
            ((499, 500), (499, 500), (499, 500))
        );
        // One stuck row: once in 10 polls too.
        let (seen, _) = read(&mut Slices::default(), &[7], 30);
        assert_eq!(seen, vec![3]);
        // 40 starts apart: four a poll, every poll, each once a round.
        let apart: Vec<i64> = (0..40).map(|i| 10 + i * 3).collect();
        let mut slices = Slices::default();
        let (seen, taken) = read(&mut slices, &apart, 30);
        assert_eq!(seen, vec![3; 40]);
        assert!(
            taken.iter().all(|(lo, _)| *lo < END),
            "no poll waits: {taken:?}"
        );
        // 20 rows become stuck 5 polls into a round (20 rows read): the
        // other 40 take 7 more slices of 6, 12 polls in all, and the next
        // round begins at once, from the earliest.
        let mut slices = Slices::default();
        read(&mut slices, &apart, 5);
        let more: Vec<i64> = apart.iter().copied().chain(200..220).collect();
        let (seen, taken) = read(&mut slices, &more, 8);
        assert_eq!(taken[6], (215, END), "the round's last slice");
        assert_eq!(taken[7], (9, apart[5]), "the next round at once");
        assert_eq!(
            seen[20..],
            vec![1; 40],
            "the rest of the round, and the new rows"
        );
    }

    /// [`next_slice`] goes through the values twice instead of listing
    /// them: it ends each slice where sorting the values after the last one
    /// puts the round's share, ties and all, for values with many ties and
    /// few, and rounds of one poll up to more than there are values.
    #[test]
    fn next_slice_ends_where_sorting_the_values_would() {
        /// The slice as sorting every value after `after` finds it.
        fn sorted(values: &[i64], after: Option<i64>, rounds: u64, end: i64) -> (i64, i64) {
            let Some(earliest) = values.iter().min() else {
                return (end, end);
            };
            let share = usize::try_from(rounds).map_or(1, |n| values.len().div_ceil(n).max(1));
            let lo = after.filter(|p| *p < end).unwrap_or(earliest - 1);
            let mut next: Vec<i64> = values.iter().copied().filter(|v| *v > lo).collect();
            next.sort_unstable();
            if next.len() <= share {
                (lo, end)
            } else {
                (lo, next[share - 1])
            }
        }
        let mut rng = fastrand::Rng::with_seed(33);
        for case in 0..2_000 {
            let n = rng.usize(0..300);
            let spread = [3, 50, 10_000][case % 3];
            let values: Vec<i64> = (0..n).map(|_| rng.i64(0..spread)).collect();
            let rounds = rng.u64(1..400);
            let end = spread + rng.i64(0..3);
            let mut after = rng.bool().then(|| rng.i64(-1..spread + 2));
            // A whole round, slice after slice, as polls take them.
            for poll in 0..=rounds {
                let want = sorted(&values, after, rounds, end);
                let mut got_after = after;
                let got = next_slice(
                    &mut got_after,
                    |count| {
                        assert_eq!(count, values.len(), "case {case}: the values counted");
                        rounds
                    },
                    || values.iter().copied(),
                    |latest| {
                        assert_eq!(latest, values.iter().max().copied(), "case {case}");
                        end
                    },
                );
                assert_eq!(
                    got, want,
                    "case {case}, poll {poll}: {values:?} after {after:?}"
                );
                let ended = got.1 == end;
                assert_eq!(
                    got_after,
                    (!ended).then_some(got.1),
                    "case {case}, poll {poll}"
                );
                after = got_after;
                if ended {
                    break;
                }
            }
        }
    }

    /// The read of the rows in flight counts as served only where every read
    /// of the table in its plan is a range of a partial index on the start.
    #[test]
    fn a_plan_serves_the_rows_in_flight_only_through_a_partial_index() {
        let lines = |t: &[&str]| t.iter().map(|l| l.to_string()).collect::<Vec<_>>();
        let partial = lines(&["inbox_in_flight"]);
        let pg = lines(&[
            "Append  (cost=0.29..19.54 rows=2 width=177)",
            "  ->  Index Scan using inbox_in_flight on inbox  (cost=0.29..9.77 rows=1 width=177)",
            "        Index Cond: ((started_at > x) AND (started_at <= y))",
            "  ->  Bitmap Heap Scan on inbox inbox_1  (cost=4.3..9.7 rows=1 width=177)",
            "        ->  Bitmap Index Scan on inbox_in_flight  (cost=0.00..4.3 rows=1 width=0)",
        ]);
        assert_eq!(
            plan_uses(&pg, &partial, "inbox", Dialect::Postgres).as_deref(),
            Some("inbox_in_flight")
        );
        let full = lines(&[
            "Append",
            "  ->  Index Scan using inbox_in_flight on inbox",
            "  ->  Index Scan using inbox_started on inbox inbox_1",
        ]);
        assert_eq!(plan_uses(&full, &partial, "inbox", Dialect::Postgres), None);
        let seq = lines(&[
            "Append",
            "  ->  Seq Scan on inbox",
            "  ->  Seq Scan on inbox inbox_1",
        ]);
        assert_eq!(plan_uses(&seq, &partial, "inbox", Dialect::Postgres), None);
        // A partial index over more than the rows in flight: the status
        // filtered after it.
        let wider = lines(&[
            "Append",
            "  ->  Index Scan using inbox_in_flight on inbox",
            "        Filter: ((status)::text = ANY ('{processing,failed}'::text[]))",
        ]);
        assert_eq!(
            plan_uses(&wider, &partial, "inbox", Dialect::Postgres),
            None
        );
        assert_eq!(
            plan_uses(&lines(&["Result"]), &partial, "inbox", Dialect::Postgres),
            None
        );
        let sqlite = lines(&[
            "COMPOUND QUERY",
            "LEFT-MOST SUBQUERY",
            "CO-ROUTINE stuck",
            "SEARCH inbox USING INDEX inbox_in_flight (started_at>? AND started_at<?)",
            "SCAN stuck",
            "UNION ALL",
            "SEARCH inbox USING INDEX inbox_in_flight (started_at>?)",
        ]);
        assert_eq!(
            plan_uses(&sqlite, &partial, "inbox", Dialect::Sqlite).as_deref(),
            Some("inbox_in_flight")
        );
        let scan = lines(&[
            "SEARCH inbox USING INDEX inbox_in_flight (started_at>?)",
            "SCAN inbox",
        ]);
        assert_eq!(plan_uses(&scan, &partial, "inbox", Dialect::Sqlite), None);
        let other = lines(&["SEARCH inbox USING INDEX inbox_started (started_at>?)"]);
        assert_eq!(plan_uses(&other, &partial, "inbox", Dialect::Sqlite), None);
    }

    /// On SQLite the probe finds the partial index `schema --config` prints
    /// once it exists, and only then.
    #[tokio::test]
    async fn the_rows_in_flight_use_the_partial_index_once_it_exists() {
        let (dir, mut writer, mut source) = sqlite_inbox("").await;
        let mut conn = source.opener().open().await.expect("open").0;
        assert_eq!(
            source.in_flight_index(&mut conn).await.expect("probe"),
            None
        );
        let text = format!(
            "[[sources]]\nname = \"orders\"\nkind = \"inbox\"\ndsn = \"sqlite://{}\"\n\
             table = \"inbox\"\n\
             columns = {{ event_id = \"id\", status = \"status\", received_at = \"received_at\", \
             started_at = \"started_at\", finished_at = \"finished_at\" }}\n",
            dir.path().join("inbox.db").display()
        );
        let cfg = crate::config::parse_str(&text).expect("valid");
        let ddl = crate::schema::indexes(&cfg);
        let index = ddl
            .lines()
            .find(|l| l.contains("inbox_in_flight"))
            .unwrap_or_else(|| panic!("no index of the rows in flight in:\n{ddl}"));
        assert_eq!(
            index,
            "CREATE INDEX IF NOT EXISTS inbox_in_flight ON \"inbox\" (\"started_at\") \
             WHERE \"status\" IN ('processing', 'failed');"
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(index))
            .execute(&mut writer)
            .await
            .expect("create the index");
        let mut conn = source.opener().open().await.expect("open").0;
        assert_eq!(
            source
                .in_flight_index(&mut conn)
                .await
                .expect("probe")
                .as_deref(),
            Some("inbox_in_flight")
        );
        // Its two ranges apart (the stuck ones as ids and statuses, the
        // recent ones in full) are served by the same index.
        let (stuck, recent) = source.in_flight_parts().expect("the two ranges");
        for (query, binds) in [(stuck, 2), (recent, 1)] {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {query}")));
            for _ in 0..binds {
                q = bind(q, source.sql.cursor(0));
            }
            let plan: Vec<String> = q
                .fetch_all(&mut conn)
                .await
                .expect("plan")
                .iter()
                .map(|r| r.try_get::<String, _>(3).unwrap_or_default())
                .collect();
            assert_eq!(
                plan_uses(
                    &plan,
                    &["inbox_in_flight".to_string()],
                    "inbox",
                    Dialect::Sqlite
                )
                .as_deref(),
                Some("inbox_in_flight"),
                "{query}: {plan:?}"
            );
        }
    }

    /// Through the partial index the ranges return the rows in flight
    /// themselves: in a round of slices every stuck row once and the recent
    /// ones on every poll, none looked up by id; a stuck row moved back to
    /// pending by hand (no time moving) is the one looked up, and is no
    /// longer in flight.
    #[tokio::test]
    async fn the_rows_in_flight_are_read_by_their_ranges() {
        let settings = "overlap = \"3s\"\nstuck_after = \"2s\"\npoll_interval = \"300ms\"\n\
                        reconcile_every = \"1h\"";
        let (_dir, mut writer, mut source) = sqlite_inbox(settings).await;
        let ts = |secs: i64| format!("strftime('%Y-%m-%d %H:%M:%f', 'now', '{secs} seconds')");
        let mut stmts = vec![
            "CREATE INDEX inbox_in_flight ON \"inbox\" (\"started_at\") \
             WHERE \"status\" IN ('processing', 'failed')"
                .to_string(),
        ];
        // 20 stuck rows, a second apart an hour ago; 5 started just now.
        for i in 0..20 {
            stmts.push(format!(
                "INSERT INTO inbox VALUES ('s{i}', 'processing', {}, {}, NULL)",
                ts(-3700 + i),
                ts(-3600 + i)
            ));
        }
        for i in 0..5 {
            stmts.push(format!(
                "INSERT INTO inbox VALUES ('r{i}', 'processing', {}, {}, NULL)",
                ts(0),
                ts(0)
            ));
        }
        for stmt in stmts {
            sqlx::raw_sql(sqlx::AssertSqlSafe(stmt))
                .execute(&mut writer)
                .await
                .expect("write");
        }
        source.poll().await.expect("the first poll");
        assert_eq!(source.in_flight_index, Some(true));
        assert_eq!(source.unfinished.in_flight.len(), 25);
        let query = source
            .in_flight_query()
            .expect("a read of the rows in flight");
        let mut conn = source.opener().open().await.expect("open").0;
        let since = source.db_now - 3_000_000;
        // 3 s over 300 ms: ten slices of two.
        let mut round = async |source: &mut TableSource<inbox::Inbox>| {
            let (mut read, mut looked_up) = (0, 0);
            for _ in 0..10 {
                // As each poll ends.
                source.unfinished.tailed.clear();
                let (r, l) = source
                    .read_in_flight(&mut conn, source.db_now, since, query.clone())
                    .await
                    .expect("read");
                read += r;
                looked_up += l;
            }
            (read, looked_up)
        };
        assert_eq!(round(&mut source).await, (20 + 10 * 5, 0));
        sqlx::raw_sql(sqlx::AssertSqlSafe(
            "UPDATE inbox SET status = 'pending' WHERE id = 's7'",
        ))
        .execute(&mut writer)
        .await
        .expect("back to pending");
        assert_eq!(round(&mut source).await, (19 + 10 * 5, 1));
        assert_eq!(source.unfinished.in_flight.len(), 24);
        assert_eq!(round(&mut source).await, (19 + 10 * 5, 0));
    }

    /// An SQLite table with the three time columns indexed, its file and a
    /// writer; and an inbox source of it, mapped without a change cursor,
    /// with these settings.
    async fn sqlite_inbox(
        settings: &str,
    ) -> (tempfile::TempDir, AnyConnection, TableSource<inbox::Inbox>) {
        sqlx::any::install_default_drivers();
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("inbox.db");
        let dsn = format!("sqlite://{}?mode=rwc", path.display());
        let mut writer = AnyConnection::connect(&dsn).await.expect("open SQLite");
        for stmt in [
            "CREATE TABLE inbox (id TEXT PRIMARY KEY, status TEXT NOT NULL, received_at TEXT NOT NULL, \
             started_at TEXT, finished_at TEXT)",
            "CREATE INDEX inbox_received ON inbox (received_at)",
            "CREATE INDEX inbox_started ON inbox (started_at)",
            "CREATE INDEX inbox_finished ON inbox (finished_at)",
        ] {
            sqlx::raw_sql(sqlx::AssertSqlSafe(stmt))
                .execute(&mut writer)
                .await
                .expect("schema");
        }
        let text = format!(
            "[[sources]]\nname = \"orders\"\nkind = \"inbox\"\ndsn = \"sqlite://{}\"\n\
             table = \"inbox\"\n{settings}\n\
             columns = {{ event_id = \"id\", status = \"status\", received_at = \"received_at\", \
             started_at = \"started_at\", finished_at = \"finished_at\" }}\n",
            path.display()
        );
        let cfg = crate::config::parse_str(&text).expect("valid");
        let crate::sources::SourceSpec::Inbox(s) = &cfg.sources[0] else {
            panic!("expected an inbox source")
        };
        let source = TableSource::new(s.table.clone(), inbox::Inbox::new(s.clone()));
        assert_eq!(source.kind.cursors().len(), 3);
        (dir, writer, source)
    }

    /// Guards the late-commit slices read in one statement, each column's
    /// bound to its own range: a row committed after the look-back passed
    /// its times (all three, two seconds before the commit) is read by the
    /// slice one second back of each of its three columns (a `UNION ALL`
    /// part each): 3, and 0 if a part missed it. Exact when the steps take
    /// under 0.9 s; a machine that stalls them longer may also put it in
    /// the tail and in the slices `overlap` back (at most 7 reads).
    #[tokio::test]
    async fn a_late_commit_in_several_slices_is_read_once() {
        let (_dir, mut writer, mut source) =
            sqlite_inbox("overlap = \"3s\"\nreconcile_every = \"1h\"").await;
        let began = Instant::now();
        assert_eq!(source.poll().await.expect("poll").rows_read, 0);
        let then = "strftime('%Y-%m-%d %H:%M:%f', 'now', '-2 seconds')";
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "INSERT INTO inbox VALUES ('late', 'succeeded', {then}, {then}, {then})"
        )))
        .execute(&mut writer)
        .await
        .expect("insert");
        let read = source.poll().await.expect("poll").rows_read;
        if began.elapsed() < Duration::from_millis(900) {
            assert_eq!(read, 3);
        } else {
            assert!((3..=7).contains(&read), "read {read} times");
        }
    }

    /// Guards the tails read together: rows that arrived, started and
    /// finished between two polls are read once, not once per time column;
    /// a page filled by a burst is read apart, page by page, that poll and
    /// the next, and together again once a poll's changes fit a page.
    /// SQLite, polled by hand: each count below is exact (no `xmin`, so a
    /// look-back re-reads what it covers; every sleep outlasts the 1 s
    /// look-back and the 1 s `overlap`, which only longer sleeps could
    /// change).
    #[tokio::test]
    async fn rows_that_moved_several_columns_are_read_once() {
        let settings = "overlap = \"1s\"\nreconcile_every = \"1h\"\nbatch_size = 100";
        let (_dir, mut writer, mut source) = sqlite_inbox(settings).await;
        let mut next = 0;
        // `n` rows that arrived, started and finished in one statement: each
        // of the three columns holds the statement's time.
        let mut finish = async |n: usize| {
            let ids: Vec<String> = (next..next + n).map(|i| format!("('e{i}')")).collect();
            next += n;
            let now = "strftime('%Y-%m-%d %H:%M:%f', 'now')";
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "WITH ids(id) AS (VALUES {}) INSERT INTO inbox \
                 SELECT id, 'succeeded', {now}, {now}, {now} FROM ids",
                ids.join(", ")
            )))
            .execute(&mut writer)
            .await
            .expect("insert");
        };
        let mut poll = async || source.poll().await.expect("poll").rows_read;
        let quiet = Duration::from_millis(2500);

        assert_eq!(poll().await, 0, "the first poll, of an empty table");
        finish(50).await;
        assert_eq!(poll().await, 50, "read together: once each, not 150");
        tokio::time::sleep(quiet).await;
        poll().await;
        assert_eq!(poll().await, 0, "quiet, past the look-back");

        // 120 rows with one time: the pages of 100 read together are full
        // (the same 100 rows in each column's page: SQLite's index orders
        // ties by rowid), so the tails read apart: per column a page of
        // 100, the rest of its value (the 120), and an empty page after it.
        finish(120).await;
        assert_eq!(
            poll().await,
            100 + 3 * (100 + 120),
            "a full page, then apart"
        );
        tokio::time::sleep(quiet).await;
        poll().await;
        // 40 rows that moved three columns, read apart: 120 reads, but 40
        // rows, under a page, so the next poll reads together again: the 40
        // (SQLite's look-back re-reads them) and 10 more, 50; apart, 150.
        // Only a poll stalled over a second leaves the 40 out (10; 30).
        finish(40).await;
        poll().await;
        finish(10).await;
        let read = poll().await;
        assert!(matches!(read, 50 | 10), "read {read}: not together again");
        tokio::time::sleep(quiet).await;
        poll().await;
        assert_eq!(poll().await, 0, "quiet again");
        finish(10).await;
        assert_eq!(poll().await, 10, "together again: once each, not 30");
    }
}
