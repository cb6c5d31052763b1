//! The inbox / processing-record table: one row per event id, updated in place.
//!
//! Counting rules (what `/metrics` promises):
//! * an event whose row first appears with `received_at` at or after the
//!   agent's start is new: `received` +1, `deliveries` + its deliveries,
//!   `duplicates` + (deliveries − 1);
//! * later increments of `deliveries` are duplicate deliveries;
//! * failed attempts: a row in `failed` (or back in `pending`) after `a`
//!   attempts has had `a` of them; in `processing` or finished, `a − 1`; the
//!   counter follows the largest value seen and never goes back, except that
//!   a re-drive that resets the attempts counts the new ones from 0;
//! * reaching succeeded or dead counts one completion with its processing,
//!   end-to-end and attempts observations, once per event (again only after a
//!   re-drive takes it back to an unfinished status — seen in its row, or in
//!   a replay read from the dead-letter audit table, [`super::replays`]);
//! * events that predate the agent are a baseline: their later changes count,
//!   their history does not;
//! * failed attempts, retries and dead letters carry the error class of the
//!   row's `last_error` when they are counted (the last text seen before, if
//!   the row shows none; `unknown` when none was ever seen): a dead letter
//!   +1 in `inbox_dead_letters_total` with its completion; a retry — an
//!   attempt started after a failed one: in `processing` or finished after
//!   `f` failures, `f` of them, in `failed` or `pending`, `f − 1` — +1 in
//!   `inbox_permanent_error_retries_total` when that class is not retryable;
//! * a row moving from `failed` (`pending`, `parked`) to a final status
//!   with no attempt started since (its attempts unchanged; without an
//!   attempts column, no start after that change) completes the attempt it
//!   showed failed: no new attempt, failure or retry — `f − 1` retries, and
//!   the journal's last attempt is that one, now ended.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::any::AnyRow;

use super::backlog::{GaugeMap, Unfinished};
use super::config::{Cursor, FinishedRows, InboxSpec, Status};
use super::ordering::Ordering;
use super::recent::{Entry, Flags, Tracked};
use super::replays::Replays;
use super::shape::Shape;
use super::sql::{OUT_OF_RANGE, Sql};
use super::{
    Incremental, MAX_ERROR_LEN, NO_CURSOR, Reject, Rejections, TableKind, get, get_time, key_of,
};
use crate::journal::{Attempt as JournalAttempt, Journal, Outcome};
use crate::telemetry::catalogue as metric;
use crate::telemetry::labels::LabelCap;
use crate::telemetry::sketch::WindowedSketch;
use crate::tracing_link::{self as link, Attempt, SpanSink, TraceParent};

/// Quantiles exported by the sketch gauge.
pub const QUANTILES: [f64; 3] = [0.5, 0.95, 0.99];
/// Relative accuracy of the quantile sketch.
const SKETCH_ACCURACY: f64 = 0.005;
/// Slices of the sliding window.
const SKETCH_SLICES: u32 = 30;

/// What the agent remembers of one event, as the counting rules use it; the
/// map stores it as [`Remembered`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    updated: i64,
    received: i64,
    deliveries: u32,
    failures: u32,
    status: Status,
    completed: bool,
    /// The row version last counted as rejected, so re-reads do not count again.
    rejected_at: Option<i64>,
    long_error_at: Option<i64>,
    /// False while the only versions seen were rejected.
    valid: bool,
    /// The highest attempt whose failed-attempt span was emitted.
    spanned: u32,
    /// The error class of the last `last_error` seen (an index into the
    /// source's [`super::error_classes::ErrorClasses`]).
    class: u8,
    /// The final status ended the attempt the row last showed failed,
    /// without a new one: that failure was not retried.
    ended_failed: bool,
}

impl State {
    /// An event none of whose history is counted yet: pending, with no
    /// delivery, failure or span, no version of it rejected; `valid` once a
    /// version of it was usable.
    fn new(updated: i64, received: i64, class: u8, valid: bool) -> State {
        State {
            updated,
            received,
            deliveries: 0,
            failures: 0,
            status: Status::Pending,
            completed: false,
            rejected_at: None,
            long_error_at: None,
            valid,
            spanned: 0,
            class,
            ended_failed: false,
        }
    }
}

/// What a usable row shows of its event, read once for every step of
/// [`Inbox::take`].
#[derive(Debug, Clone, Copy)]
struct Shown {
    /// The `event_type` label.
    label: usize,
    status: Status,
    received: i64,
    /// Whether `status` is final.
    terminal: bool,
    /// Its deliveries, at least 1.
    deliveries: u32,
    /// Its error class, or when it shows no error the last one seen.
    class: u8,
    /// When it was taken: the clock of the quantile sketches.
    now: Instant,
}

/// [`State`] as the map stores it: 16 bytes instead of 64, so a slot is
/// 24 bytes with its key. Each word holds a time as 51 bits ([`pack_time`]:
/// the microseconds from 1994 to 2065, exact), the first with the error
/// class and the flags (the booleans and the status), the second with the
/// three counts in 5, 4 and 4 bits. What few events ever have — a rejected
/// version, a version with a `last_error` too long to read, a count past
/// what its bits hold, a time outside those years — is kept apart, in
/// [`Rare`], with one bit saying whether there is any (and one whether the
/// times are there).
#[derive(Debug, Clone, Copy, Default)]
struct Remembered {
    /// `updated` (bits 0–50), the class (51–55), the [`Flags`] (56–63).
    first: u64,
    /// `received` (bits 0–50), deliveries (51–55), failures (56–59) and
    /// the attempts spanned (60–63).
    second: u64,
}

/// Bits of a time in [`Remembered`].
const TIME_BITS: u32 = 51;
const TIME_MASK: u64 = (1 << TIME_BITS) - 1;
/// The middle of the times [`Remembered`] holds: 2030-01-01 00:00:00 UTC in
/// microseconds; it holds 2⁵⁰ µs (35.7 years) either side.
const TIME_CENTER: i64 = 1_893_456_000_000_000;
const CLASS_BITS: u32 = 5;
const _: () = assert!(super::error_classes::MAX_CLASSES <= 1 << CLASS_BITS);
/// Where the flags byte starts in [`Remembered::first`], after the class.
const FLAGS_SHIFT: u32 = TIME_BITS + CLASS_BITS;
const _: () = assert!(FLAGS_SHIFT + u8::BITS == u64::BITS);
/// The bits of deliveries, failures and the attempts spanned, and where
/// each starts in [`Remembered::second`]: one after the other, after the time.
const COUNT_BITS: [u32; 3] = [5, 4, 4];
const COUNT_SHIFT: [u32; 3] = [
    TIME_BITS,
    TIME_BITS + COUNT_BITS[0],
    TIME_BITS + COUNT_BITS[0] + COUNT_BITS[1],
];
const _: () = assert!(COUNT_SHIFT[2] + COUNT_BITS[2] == u64::BITS);

/// `t` as the 51 bits of [`Remembered`], if it is within the years they hold.
fn pack_time(t: i64) -> Option<u64> {
    let d = t
        .checked_sub(TIME_CENTER)?
        .checked_add(1 << (TIME_BITS - 1))?;
    u64::try_from(d).ok().filter(|d| *d <= TIME_MASK)
}

/// The time [`pack_time`] packed into the low bits of `word`.
fn unpack_time(word: u64) -> i64 {
    (word & TIME_MASK) as i64 - (1 << (TIME_BITS - 1)) + TIME_CENTER
}

impl Remembered {
    fn flags(self) -> Flags {
        Flags::from_bits((self.first >> FLAGS_SHIFT) as u8)
    }
}

/// Bits of [`Remembered`]'s flags; the status is in the bits from
/// [`STATUS_SHIFT`] on.
const COMPLETED: u8 = 0;
const VALID: u8 = 1;
const ENDED_FAILED: u8 = 2;
/// The event has an entry in [`Inbox::rare`].
const RARE: u8 = 3;
/// The times are in that entry ([`Rare::times`]), not in the 51 bits.
const FAR: u8 = 4;
/// Where the status's index in [`Status::ALL`] starts in the flags.
const STATUS_SHIFT: u8 = 5;

/// What [`Remembered`] leaves out of [`State`]: a rejected version, a
/// version with a `last_error` too long to read, the counts when one is
/// past what its bits hold, and the times when one is outside the years
/// they hold. Kept by key for the few events that have one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rare {
    rejected_at: Option<i64>,
    long_error_at: Option<i64>,
    /// Deliveries, failures and the attempts spanned, when one of them is
    /// over what [`COUNT_BITS`] hold.
    counts: Option<[u32; 3]>,
    /// `updated` and `received`, when one of them does not [`pack_time`].
    times: Option<[i64; 2]>,
}

/// `s` as the map stores it, and its rare part if it has one.
fn split(s: State) -> (Remembered, Option<Rare>) {
    let counts = [s.deliveries, s.failures, s.spanned];
    let big = counts
        .iter()
        .zip(COUNT_BITS)
        .any(|(c, bits)| *c >= 1 << bits);
    let packed = pack_time(s.updated).zip(pack_time(s.received));
    let far = packed.is_none();
    let rare =
        (s.rejected_at.is_some() || s.long_error_at.is_some() || big || far).then_some(Rare {
            rejected_at: s.rejected_at,
            long_error_at: s.long_error_at,
            counts: big.then_some(counts),
            times: far.then_some([s.updated, s.received]),
        });
    let mut flags = Flags::default();
    flags.set(COMPLETED, s.completed);
    flags.set(VALID, s.valid);
    flags.set(ENDED_FAILED, s.ended_failed);
    flags.set(RARE, rare.is_some());
    flags.set(FAR, far);
    let status = Status::ALL
        .iter()
        .position(|x| *x == s.status)
        .expect("every status is in Status::ALL");
    flags.set_field(STATUS_SHIFT, status as u8);
    assert!(
        u32::from(s.class) < 1 << CLASS_BITS,
        "at most MAX_CLASSES error classes"
    );
    let (updated, received) = packed.unwrap_or_default();
    let mut second = received;
    if !big {
        for (c, shift) in counts.iter().zip(COUNT_SHIFT) {
            second |= u64::from(*c) << shift;
        }
    }
    let r = Remembered {
        first: updated | u64::from(s.class) << TIME_BITS | u64::from(flags.bits()) << FLAGS_SHIFT,
        second,
    };
    (r, rare)
}

/// The [`State`] that [`split`] stored: `rare` is looked up only when a
/// flag of `r` says there is one.
fn join(r: Remembered, rare: impl FnOnce() -> Option<Rare>) -> State {
    let flags = r.flags();
    let rare = if flags.get(RARE) { rare() } else { None };
    let small =
        [0, 1, 2].map(|i| ((r.second >> COUNT_SHIFT[i]) & ((1 << COUNT_BITS[i]) - 1)) as u32);
    let [deliveries, failures, spanned] = rare.and_then(|x| x.counts).unwrap_or(small);
    let [updated, received] = rare
        .and_then(|x| x.times)
        .unwrap_or([unpack_time(r.first), unpack_time(r.second)]);
    State {
        updated,
        received,
        deliveries,
        failures,
        status: Status::ALL[usize::from(flags.field(STATUS_SHIFT))],
        completed: flags.get(COMPLETED),
        rejected_at: rare.and_then(|x| x.rejected_at),
        long_error_at: rare.and_then(|x| x.long_error_at),
        valid: flags.get(VALID),
        spanned,
        class: ((r.first >> TIME_BITS) & ((1 << CLASS_BITS) - 1)) as u8,
        ended_failed: flags.get(ENDED_FAILED),
    }
}

impl Entry for Remembered {
    /// Exact unless [`Entry::far`]: then [`Rare::times`] has it.
    fn updated_at(&self) -> i64 {
        unpack_time(self.first)
    }
    fn born_at(&self) -> i64 {
        unpack_time(self.second)
    }
    fn finished(&self) -> bool {
        let flags = self.flags();
        flags.get(COMPLETED) || !flags.get(VALID)
    }
    fn far(&self) -> bool {
        self.flags().get(FAR)
    }
}

/// One row as the tail query returns it (times in microseconds).
#[derive(Debug)]
struct Row {
    event_id: String,
    event_type: Option<String>,
    status: String,
    received: Option<i64>,
    started: Option<i64>,
    finished: Option<i64>,
    attempts: Option<i64>,
    deliveries: Option<i64>,
    error_len: Option<i64>,
    /// The start of `last_error`: its first `ERROR_TEXT_LEN + 1` characters.
    error_text: Option<String>,
    /// The error class of `error_text`.
    class: u8,
    traceparent: Option<String>,
    /// When the row last changed: its change cursor, or without one the
    /// poll that read it.
    updated: i64,
    /// Which version of the row this is, so a rejected version is counted
    /// once: the change cursor, or without one a hash of the values read.
    version: i64,
    /// Whether `status` names a meaning (an event of `cursor = "events"`)
    /// rather than a status word of the table.
    meaning: bool,
    /// `ordering_key` and `version`, when both are mapped and set.
    ordering_key: Option<String>,
    key_version: Option<i64>,
}

/// The times a completion's durations are observed from; none without an end.
#[derive(Debug, Clone, Copy)]
struct Times {
    received: Option<i64>,
    started: Option<i64>,
    end: Option<i64>,
}

/// Sums of one poll for one `event_type` label.
#[derive(Debug, Default)]
struct Counts {
    received: u64,
    deliveries: u64,
    /// Duplicate deliveries by phase ([`IN_FLIGHT`], [`AFTER_COMPLETION`]).
    duplicates: [u64; 2],
    succeeded: u64,
    dead: u64,
    processing: Vec<f64>,
    end_to_end: Vec<f64>,
    attempts: Vec<f64>,
}

/// Sums of one poll for one `event_type` label and one error class.
#[derive(Debug, Default, Clone, Copy)]
struct ClassCounts {
    failures: u64,
    dead: u64,
    permanent_retries: u64,
}

/// The inbox part of a table source.
pub struct Inbox {
    spec: InboxSpec,
    states: Tracked<Remembered>,
    /// The rare versions of the events in `states` that have one.
    rare: HashMap<u64, Rare>,
    labels: LabelCap,
    start: i64,
    counts: HashMap<usize, Counts>,
    /// This poll's sums by (`event_type` label, error class).
    by_class: HashMap<(usize, u8), ClassCounts>,
    /// (label, class) pairs whose series exist (created at 0).
    class_series: HashSet<(usize, u8)>,
    rejections: Rejections,
    reported: HashSet<usize>,
    /// Labels whose counter series exist (created at 0).
    series: HashSet<usize>,
    sketches: HashMap<usize, WindowedSketch>,
    /// Where the consumer spans go, when `[tracing]` is configured.
    spans: Option<SpanSink>,
    /// Overlap window in microseconds: how far back a restarted agent re-emits spans.
    overlap: i64,
    /// The database's time at the start of the current poll.
    poll_now: i64,
    /// Where failing events' attempts are noted, and the source's name.
    journal: Option<(Journal, Arc<str>)>,
    /// The versions per ordering key, when `ordering_key` and `version` are mapped.
    ordering: Option<Ordering>,
    /// The parked rows' aggregate of the last poll, when the table parks.
    parked: Option<Parked>,
    /// Whether the per-source series (ordering, parked) exist.
    source_series: bool,
    /// Replayed events followed until they finish again.
    replays: Replays,
}

/// The parked rows of the table, from [`Inbox::parked_query`].
#[derive(Debug, Default, Clone, Copy)]
struct Parked {
    messages: u64,
    keys: u64,
    /// The earliest `received_at` among them (microseconds).
    oldest: Option<i64>,
}

/// What a row shows the ordering memory.
#[derive(Debug, Clone, Copy)]
enum Noted {
    /// Its version arrived: `counted` as a new event, which may be out of
    /// order; else as a row of the baseline.
    Arrival { counted: bool },
    /// It succeeded with this change.
    Success,
}

/// Index of each phase in [`Counts::duplicates`].
const IN_FLIGHT: usize = 0;
const AFTER_COMPLETION: usize = 1;
/// The `phase` label of each index of [`Counts::duplicates`].
const PHASES: [&str; 2] = ["in_flight", "after_completion"];

impl Inbox {
    /// The inbox logic of one configured source.
    pub fn new(spec: InboxSpec) -> Self {
        let states = Tracked::new(spec.table.max_tracked_events);
        let labels = LabelCap::new(spec.table.event_type_limit);
        let overlap = micros(spec.table.overlap);
        let ordering = spec
            .ordered()
            .then(|| Ordering::new(spec.ordering_keys_limit));
        let replays = Replays::new(
            &spec,
            Sql {
                dialect: spec.table.dsn.dialect(),
            },
        );
        Inbox {
            ordering,
            parked: None,
            source_series: false,
            replays,
            spec,
            states,
            rare: HashMap::new(),
            labels,
            start: i64::MIN,
            counts: HashMap::new(),
            by_class: HashMap::new(),
            class_series: HashSet::new(),
            rejections: Rejections::default(),
            reported: HashSet::new(),
            series: HashSet::new(),
            sketches: HashMap::new(),
            spans: None,
            journal: None,
            overlap,
            poll_now: i64::MIN,
        }
    }

    /// Emits consumer spans into `sink`.
    pub fn with_spans(mut self, sink: Option<SpanSink>) -> Self {
        self.spans = sink;
        self
    }

    /// Notes the attempts of failing events in `journal` (`/events/{id}`).
    pub fn with_journal(mut self, journal: Journal) -> Self {
        self.journal = Some((journal, Arc::from(self.spec.table.name.as_str())));
        self
    }

    /// Notes in the journal what this change of a row shows of its
    /// attempts: `before` failed attempts were counted, now `failures` are;
    /// `finished` is the number of the attempt that ended the event, when it
    /// reached a final status with this change.
    fn note_attempts(
        &self,
        row: &Row,
        status: Status,
        class: u8,
        before: u32,
        failures: u32,
        finished: Option<u32>,
    ) {
        let Some((journal, source)) = &self.journal else {
            return;
        };
        let class_of = || {
            Some(Arc::<str>::from(
                self.spec.error_classes.get(class).name.as_str(),
            ))
        };
        let error = || {
            row.error_text
                .as_deref()
                .map(|e| link::truncate(e, crate::journal::ERROR_KEPT))
        };
        let note = |missed: std::ops::Range<u32>, attempt: JournalAttempt| {
            journal.record(
                source,
                &row.event_id,
                row.event_type.as_deref(),
                row.received,
                missed,
                attempt,
            )
        };
        if let Some(number) = finished {
            let dead = status == Status::Dead;
            note(
                before + 1..number,
                JournalAttempt {
                    number,
                    observed: true,
                    started: row.started,
                    ended: row.finished.or(Some(row.updated)),
                    outcome: if dead {
                        Outcome::DeadLettered
                    } else {
                        Outcome::Succeeded
                    },
                    error_class: if dead { class_of() } else { None },
                    error: if dead { error() } else { None },
                },
            );
        } else if failures > before {
            // In `failed` or back in `pending`, the row shows its failed
            // attempt; in `processing`, the next one has started and the
            // failure was not seen (its error still shows).
            let shown = matches!(status, Status::Failed | Status::Pending);
            note(
                before + 1..failures,
                JournalAttempt {
                    number: failures,
                    observed: shown,
                    started: if shown { row.started } else { None },
                    ended: if shown { Some(row.updated) } else { None },
                    outcome: Outcome::Failed,
                    error_class: class_of(),
                    error: error(),
                },
            );
        }
    }

    fn decode(&self, row: &AnyRow) -> Result<Row, String> {
        let row_in = row;
        let mut row = Row {
            event_id: get::<Option<String>>(row, 0, "event_id")?.unwrap_or_default(),
            event_type: get(row, 1, "event_type")?,
            status: get::<Option<String>>(row, 2, "status")?.unwrap_or_default(),
            received: get_time(row, 3, "received_at")?,
            started: get_time(row, 4, "started_at")?,
            finished: get_time(row, 5, "finished_at")?,
            attempts: get(row, 6, "attempts")?,
            deliveries: get(row, 7, "deliveries")?,
            error_len: get(row, 8, "last_error")?,
            error_text: get(row, 9, "last_error")?,
            traceparent: get(row, 10, "traceparent")?,
            updated: get_time(row, 11, "updated_at")?.unwrap_or(NO_CURSOR),
            version: 0,
            class: 0,
            meaning: false,
            ordering_key: None,
            key_version: None,
        };
        if self.ordering.is_some() {
            row.ordering_key = get(row_in, 12, "ordering_key")?;
            row.key_version = get(row_in, 13, "version")?;
        }
        row.class = self.spec.error_classes.index(row.error_text.as_deref());
        let count = self.spec.attempts_count;
        row.attempts = row
            .attempts
            .map(|a| count.started(a, self.spec.meaning_of(&row.status)));
        if self.spec.table.cursor == Cursor::None {
            row.updated = self.poll_now;
            row.version = version_of(&row);
        } else {
            row.version = row.updated;
        }
        Ok(row)
    }

    /// What is wrong with a row, if anything keeps it from being used.
    fn check(&self, row: &Row, status: Option<Status>) -> Option<Reject> {
        if row.updated == NO_CURSOR {
            return Some(Reject::NullCursor);
        }
        let times = [row.received, row.started, row.finished, Some(row.updated)];
        if times.contains(&Some(OUT_OF_RANGE)) {
            return Some(Reject::TimeOutOfRange);
        }
        if row.attempts.is_some_and(|a| a < 0) || row.deliveries.is_some_and(|d| d < 0) {
            return Some(Reject::ImplausibleCount);
        }
        let Some(status) = status else {
            return Some(Reject::UnknownStatus);
        };
        // A final row without a finished time is counted, without durations.
        let Some(received) = row.received else {
            return Some(Reject::NullTime);
        };
        if finish_before_start(row, status, received) {
            return Some(Reject::FinishBeforeStart);
        }
        None
    }

    /// Failed attempts a row shows, following the rules in the module docs.
    fn failures_shown(&self, status: Status, attempts: Option<i64>, prev: &State) -> u32 {
        match attempts {
            Some(a) => {
                let a = u32::try_from(a.max(0)).unwrap_or(u32::MAX);
                match status {
                    // A parked row's attempts all failed (or none was made).
                    Status::Failed | Status::Pending | Status::Parked => a,
                    Status::Processing | Status::Succeeded | Status::Dead => a.saturating_sub(1),
                }
            }
            // Without an attempts column, count the moves into `failed` that are seen.
            None => {
                prev.failures + u32::from(status == Status::Failed && prev.status != Status::Failed)
            }
        }
    }

    /// A replay read from the audit table re-opens its event: an event the
    /// agent last saw finished, in a version older than the replay, is
    /// remembered as back in `pending` (with its attempts from 0 when the
    /// replay resets them), as if the agent had seen the replay's row — so
    /// that a death that follows the replay within one poll counts as a
    /// completion again, like one the agent sees after the pending row.
    fn reopen(&mut self, event_id: &str, at: i64) {
        let key = key_of(event_id);
        let Some(prev) = self.load(key) else {
            return;
        };
        if !prev.valid || !prev.completed || prev.updated >= at {
            return;
        }
        let reset = self.spec.actions.as_ref().is_some_and(|a| a.reset_attempts);
        self.store(
            key,
            State {
                status: Status::Pending,
                completed: false,
                failures: if reset { 0 } else { prev.failures },
                ended_failed: false,
                ..prev
            },
        );
    }

    /// Counts one completion of the event a row shows (see
    /// [`Inbox::completion`]), and tells the ordering memory of a success.
    fn count_completion(&mut self, row: &Row, shown: &Shown) {
        let attempts = row.attempts.map_or(1.0, |a| a.max(1) as f64);
        let times = Times {
            received: row.received,
            started: row.started,
            end: row.finished,
        };
        self.completion(
            shown.label,
            shown.status,
            shown.class,
            attempts,
            times,
            shown.now,
        );
        if shown.status == Status::Succeeded {
            self.note_order(row, Noted::Success);
        }
    }

    /// Counts one completion and its observations: the attempts, and when
    /// its end is known the end-to-end latency and the processing time.
    fn completion(
        &mut self,
        label: usize,
        status: Status,
        class: u8,
        attempts: f64,
        t: Times,
        now: Instant,
    ) {
        let window = self.spec.table.quantile_window;
        if status == Status::Dead {
            self.by_class.entry((label, class)).or_default().dead += 1;
        }
        let counts = self.counts.entry(label).or_default();
        if status == Status::Dead {
            counts.dead += 1;
        } else {
            counts.succeeded += 1;
        }
        counts.attempts.push(attempts);
        let Some(fin) = t.end else {
            return;
        };
        if let Some(received) = t.received {
            counts.end_to_end.push(seconds(fin - received));
        }
        if let Some(started) = t.started {
            let d = seconds(fin - started);
            counts.processing.push(d);
            self.sketches
                .entry(label)
                .or_insert_with(|| WindowedSketch::new(window, SKETCH_SLICES, SKETCH_ACCURACY))
                .add(now, d);
        }
    }

    /// Counts what one row shows, following the rules of the module docs:
    /// a version that cannot be used is [rejected](Inbox::reject_version);
    /// the first sight of an event makes what is remembered of it (the
    /// [baseline](Inbox::first_sight_of_old) of an event older than the
    /// agent's memory, or a [new event](Inbox::first_sight)); then the
    /// [changes](Inbox::changes) since the version last seen are counted.
    fn take(&mut self, row: Row, baseline: bool) {
        self.rejections.read();
        let key = key_of(&row.event_id);
        let label = self.labels.resolve(row.event_type.as_deref());
        let existing = self.load(key);
        let long_error_at = self.long_error(&row, existing, baseline);
        let status = if row.meaning {
            Status::from_name(&row.status)
        } else {
            self.spec.meaning_of(&row.status)
        };
        let state = match self.check(&row, status) {
            Some(reason) => self.reject_version(&row, reason, existing, long_error_at, baseline),
            None => {
                let shown = self.shown(&row, label, status, existing);
                if !baseline {
                    match status {
                        Some(Status::Dead) => {
                            let when = row.updated.max(row.finished.unwrap_or(i64::MIN));
                            self.replays.dead(&row.event_id, shown.class, when);
                        }
                        Some(Status::Succeeded) => self.replays.succeeded(&row.event_id),
                        _ => {}
                    }
                }
                match existing.filter(|s| s.valid) {
                    Some(prev) => {
                        let prev = State {
                            long_error_at,
                            ..prev
                        };
                        self.changes(&row, &shown, prev, baseline)
                    }
                    None => {
                        let first = State {
                            rejected_at: existing.and_then(|s| s.rejected_at),
                            long_error_at,
                            ..State::new(row.updated, shown.received, shown.class, true)
                        };
                        if baseline || !self.states.is_new(shown.received) {
                            self.first_sight_of_old(&row, &shown, first, baseline)
                        } else {
                            self.first_sight(&row, &shown);
                            self.changes(&row, &shown, first, baseline)
                        }
                    }
                }
            }
        };
        self.store(key, state);
    }

    /// What the agent remembers of an event, if anything.
    fn load(&self, key: u64) -> Option<State> {
        let r = *self.states.get(key)?;
        Some(join(r, || self.rare.get(&key).copied()))
    }

    /// Remembers `state` for an event.
    fn store(&mut self, key: u64, state: State) {
        let (r, rare) = split(state);
        self.states.insert(key, r);
        match rare {
            Some(x) => {
                self.rare.insert(key, x);
            }
            None if !self.rare.is_empty() => {
                self.rare.remove(&key);
            }
            None => {}
        }
    }

    /// Forgets old events ([`Tracked::tidy`]), and their rare versions.
    fn tidy(&mut self, db_now: i64, now: Instant) {
        let rare = &self.rare;
        let far = |k: u64| match rare.get(&k).and_then(|x| x.times) {
            Some([updated, received]) => (updated, received),
            None => unreachable!("a far event's times are in its rare part"),
        };
        if self.states.tidy(&self.spec.table, db_now, now, far) && !self.rare.is_empty() {
            // Only an eviction forgets events; the rare versions go with them.
            let states = &self.states;
            self.rare.retain(|k, _| states.get(*k).is_some());
            if self.rare.capacity() > 4 * self.rare.len().max(16) {
                // A burst of rejected rows leaves no large map behind.
                self.rare.shrink_to_fit();
            }
        }
    }

    /// The version of the event last seen with a `last_error` longer than is
    /// kept: counted as rejected once per version, though the row is used.
    fn long_error(&mut self, row: &Row, existing: Option<State>, baseline: bool) -> Option<i64> {
        let before = existing.and_then(|s| s.long_error_at);
        let too_long = row.error_len.is_some_and(|n| n > MAX_ERROR_LEN);
        if !too_long || before == Some(row.version) {
            return before;
        }
        if !baseline {
            self.rejections.add(Reject::LastErrorTooLong);
        }
        Some(row.version)
    }

    /// A version that cannot be used (see [`Inbox::check`]): counted as
    /// rejected once, and nothing else of it counted. An event seen only in
    /// such versions is remembered as not valid, so that its first usable
    /// version is its first sight.
    fn reject_version(
        &mut self,
        row: &Row,
        reason: Reject,
        existing: Option<State>,
        long_error_at: Option<i64>,
        baseline: bool,
    ) -> State {
        self.rejections.unusable(reason);
        let seen = existing.and_then(|s| s.rejected_at) == Some(row.version);
        if !seen && !baseline {
            self.rejections.add(reason);
        }
        let updated = forget_after(row.updated);
        let before = existing.unwrap_or_else(|| {
            let received = row.received.unwrap_or(i64::MIN);
            State::new(updated, received, row.class, false)
        });
        State {
            updated: updated.max(before.updated),
            rejected_at: Some(row.version),
            long_error_at,
            ..before
        }
    }

    /// What a usable row (one [`Inbox::check`] passed) shows of its event.
    fn shown(
        &self,
        row: &Row,
        label: usize,
        status: Option<Status>,
        existing: Option<State>,
    ) -> Shown {
        let status = status.expect("check() rejects unknown statuses");
        // A row that shows no error keeps the class of the last one seen.
        let unknown = self.spec.error_classes.unknown();
        let class = match existing {
            Some(s) if row.class == unknown => s.class,
            _ => row.class,
        };
        Shown {
            label,
            status,
            received: row.received.expect("check() rejects a NULL received_at"),
            class,
            deliveries: row
                .deliveries
                .map_or(1, |d| u32::try_from(d.max(1)).unwrap_or(u32::MAX)),
            terminal: status.is_terminal(),
            now: Instant::now(),
        }
    }

    /// The first sight of an event older than the agent's memory, or read
    /// as the baseline: its row is the baseline, its history not counted.
    /// Only a completion that happened since the start is counted, and not
    /// one of an event counted and forgotten since.
    fn first_sight_of_old(
        &mut self,
        row: &Row,
        shown: &Shown,
        first: State,
        baseline: bool,
    ) -> State {
        let counted = !baseline
            && shown.terminal
            && row
                .finished
                .is_some_and(|f| f >= self.start && !self.states.may_have_counted(f));
        self.note_order(row, Noted::Arrival { counted: false });
        if counted {
            self.count_completion(row, shown);
        }
        let zero = State {
            deliveries: shown.deliveries,
            status: shown.status,
            completed: shown.terminal,
            ..first
        };
        let failures = self.failures_shown(shown.status, row.attempts, &zero);
        // Spans are idempotent (derived ids), so unlike counters they are
        // emitted again for what changed within the overlap window before
        // the start: a restart loses no span.
        let recent = self.start.saturating_sub(self.overlap);
        let finished_recently = row.finished.is_some_and(|f| f >= recent);
        let emit_terminal = shown.terminal && (counted || finished_recently);
        let emit_failed = shown.status == Status::Failed && row.updated >= recent;
        let attempt = attempt_shown(row, shown.status, failures, false);
        let emit = emit_terminal || emit_failed;
        let spanned = self.emit(row, shown.status, attempt, 0, emit, !baseline);
        State {
            failures,
            spanned,
            ..zero
        }
    }

    /// The first sight of a new event: it was received once.
    fn first_sight(&mut self, row: &Row, shown: &Shown) {
        self.counts.entry(shown.label).or_default().received += 1;
        self.note_order(row, Noted::Arrival { counted: true });
    }

    /// Counts what changed since `prev`, the version of the event last
    /// counted (for a new event, its first sight): the deliveries and failed
    /// attempts added, a completion; notes the attempts in the journal and
    /// emits their spans. Returns what is remembered of the event now.
    fn changes(&mut self, row: &Row, shown: &Shown, prev: State, baseline: bool) -> State {
        let prev = self.redriven(row, shown, prev);
        let mut next = self.next_state(row, shown, &prev);
        // Counts that grow by more than `max_count_jump` in one change are a
        // corrupt or foreign value, not that many deliveries or attempts: the
        // version is rejected as such and its counts become the new baseline,
        // so one bad value never adds millions to a counter for good. The
        // rest of the row (status, completion, durations) is used as usual.
        let jump = self.spec.table.max_count_jump;
        let implausible = u64::from(shown.deliveries.saturating_sub(prev.deliveries.max(1))) > jump
            || u64::from(next.failures - prev.failures) > jump;
        if implausible {
            if prev.rejected_at != Some(row.version) && !baseline {
                self.rejections.add(Reject::ImplausibleCount);
            }
            next.rejected_at = Some(row.version);
        }
        self.count_deliveries(shown.label, &prev, &next, implausible);
        if !implausible {
            self.count_failures(shown.label, &prev, &next);
        }
        let completes = next.completed && !prev.completed;
        if completes {
            self.count_completion(row, shown);
        }
        if !baseline && !implausible {
            let finished = completes.then(|| next.failures + u32::from(!next.ended_failed));
            let (status, class) = (next.status, next.class);
            self.note_attempts(row, status, class, prev.failures, next.failures, finished);
        }
        let attempt = attempt_shown(row, next.status, next.failures, next.ended_failed);
        let emit = completes || next.status == Status::Failed;
        next.spanned = self.emit(row, next.status, attempt, prev.spanned, emit, !baseline);
        next
    }

    /// `prev`, its failures counted anew from 0 when a re-drive (a finished
    /// event back in an unfinished status) started its attempts again from 0
    /// (`reset_attempts`): the row shows fewer failures than were counted.
    fn redriven(&self, row: &Row, shown: &Shown, mut prev: State) -> State {
        if prev.completed
            && !shown.terminal
            && self.failures_shown(shown.status, row.attempts, &prev) < prev.failures
        {
            prev.failures = 0;
        }
        prev
    }

    /// What is remembered of the event after this change of its row, before
    /// its spans: the failures follow the largest value seen; a final status
    /// may end the attempt the row last showed failed.
    fn next_state(&self, row: &Row, shown: &Shown, prev: &State) -> State {
        let failures = self
            .failures_shown(shown.status, row.attempts, prev)
            .max(prev.failures);
        let ended_failed = match (shown.terminal, prev.completed) {
            (true, true) => prev.ended_failed,
            (true, false) => ends_failed_attempt(row, prev),
            (false, _) => false,
        };
        State {
            updated: row.updated.max(prev.updated),
            received: shown.received,
            deliveries: shown.deliveries.max(prev.deliveries),
            failures,
            status: shown.status,
            completed: shown.terminal,
            class: shown.class,
            ended_failed,
            ..*prev
        }
    }

    /// Counts the deliveries a change adds (an implausible one: only the
    /// arrival of a new event). The first delivery of a new event is not a
    /// duplicate; a delivery to an event last seen finished came after its
    /// completion, one seen with the completion, or before it, in flight.
    fn count_deliveries(&mut self, label: usize, prev: &State, next: &State, implausible: bool) {
        // The label's sums exist from here, so its series show this poll.
        let counts = self.counts.entry(label).or_default();
        if implausible {
            counts.deliveries += u64::from(prev.deliveries == 0);
            return;
        }
        if next.deliveries <= prev.deliveries {
            return;
        }
        let added = u64::from(next.deliveries - prev.deliveries);
        counts.deliveries += added;
        let phase = if prev.completed {
            AFTER_COMPLETION
        } else {
            IN_FLIGHT
        };
        counts.duplicates[phase] += if prev.deliveries == 0 {
            added - 1
        } else {
            added
        };
    }

    /// Counts the failed attempts a change adds, by error class, and the
    /// retries it shows of a class that is not retryable.
    fn count_failures(&mut self, label: usize, prev: &State, next: &State) {
        let retries = retries_shown(next.status, next.failures, next.ended_failed)
            .saturating_sub(retries_shown(prev.status, prev.failures, prev.ended_failed));
        let permanent = !self.spec.error_classes.get(next.class).retryable;
        if next.failures > prev.failures || (permanent && retries > 0) {
            let c = self.by_class.entry((label, next.class)).or_default();
            c.failures += u64::from(next.failures - prev.failures);
            if permanent {
                c.permanent_retries += u64::from(retries);
            }
        }
    }

    /// Notes for the ordering memory what a row shows. Rows without a key
    /// or version are not ordered.
    fn note_order(&mut self, row: &Row, what: Noted) {
        let (Some(ordering), Some(key), Some(version)) = (
            self.ordering.as_mut(),
            row.ordering_key.as_deref(),
            row.key_version,
        ) else {
            return;
        };
        let key = key_of(key);
        match what {
            Noted::Success => ordering.success(key, version, row.finished.unwrap_or(row.updated)),
            Noted::Arrival { counted } => {
                if let Some(received) = row.received {
                    ordering.arrival(key, version, received, counted);
                }
            }
        }
    }

    /// Emits the span of `attempt` a row shows, if `emit` and it was not
    /// emitted yet: a terminal row's last attempt, or a failed row's failed
    /// attempt (once per attempt: `spanned` is the highest one already
    /// emitted). A malformed `traceparent` is counted as rejected if
    /// `count_rejects`. Returns the new `spanned`.
    fn emit(
        &mut self,
        row: &Row,
        status: Status,
        attempt: u32,
        spanned: u32,
        emit: bool,
        count_rejects: bool,
    ) -> u32 {
        let outcome = match status {
            Status::Succeeded => "succeeded",
            Status::Dead => "dead_lettered",
            Status::Failed => "failed",
            Status::Pending | Status::Processing | Status::Parked => return spanned,
        };
        if !emit || (status == Status::Failed && attempt <= spanned) {
            return spanned;
        }
        let Some(sink) = self.spans.as_mut() else {
            return spanned;
        };
        let Some(received) = row.received else {
            return spanned;
        };
        // A failed attempt ends when the row turned failed: its change time.
        let end = match status {
            Status::Failed => row.updated,
            _ => row.finished.unwrap_or(row.updated),
        };
        let processing = row.started.map(|s| end - s);
        let failed = status != Status::Succeeded || attempt > 1;
        let traceparent = row.traceparent.as_deref().filter(|t| !t.is_empty());
        let parsed = traceparent.and_then(TraceParent::parse);
        // A baseline read re-sends spans (same ids) but counts nothing again.
        if count_rejects && traceparent.is_some() && parsed.is_none() {
            self.rejections.add(Reject::BadTraceparent);
        }
        if sink.keep(&row.event_id, failed, processing) {
            let span = link::consumer_span(
                &sink.identity,
                &Attempt {
                    event_id: &row.event_id,
                    event_type: row.event_type.as_deref(),
                    outcome,
                    attempt,
                    attempts: row.attempts,
                    deliveries: row.deliveries,
                    received,
                    started: row.started,
                    end,
                    last_error: row.error_text.as_deref(),
                    traceparent: parsed,
                },
            );
            sink.send(span);
        }
        if status == Status::Failed {
            attempt
        } else {
            spanned
        }
    }

    fn record(&mut self) {
        let source = self.spec.table.name.clone();
        let counts: Vec<(usize, Counts)> = self.counts.drain().collect();
        for (label, c) in counts {
            let et = self.labels.value(label).to_string();
            let l = [("source", source.clone()), ("event_type", et.clone())];
            // A new series first shows at 0, its first amount one poll later:
            // `rate()` and `increase()` see no increase in a series' first sample.
            // Without a deliveries column the table cannot show duplicate
            // deliveries: their series are not exported (absent, not 0).
            let deliveries = self.spec.columns.deliveries.is_some();
            if self.series.insert(label) {
                metrics::counter!(metric::INBOX_RECEIVED, &l).increment(0);
                if deliveries {
                    metrics::counter!(metric::INBOX_DELIVERIES, &l).increment(0);
                    for phase in PHASES {
                        metrics::counter!(metric::INBOX_DUPLICATES, "source" => source.clone(), "event_type" => et.clone(), "phase" => phase)
                            .increment(0);
                    }
                }
                for outcome in ["succeeded", "dead_lettered"] {
                    metrics::counter!(metric::INBOX_COMPLETED, "source" => source.clone(), "event_type" => et.clone(), "outcome" => outcome)
                        .increment(0);
                }
                self.counts.insert(label, c);
                continue;
            }
            let inc = |name: &'static str, n: u64| {
                if n > 0 {
                    metrics::counter!(name, &l).increment(n);
                }
            };
            inc(metric::INBOX_RECEIVED, c.received);
            if deliveries {
                inc(metric::INBOX_DELIVERIES, c.deliveries);
                for (phase, n) in PHASES.into_iter().zip(c.duplicates) {
                    if n > 0 {
                        metrics::counter!(metric::INBOX_DUPLICATES, "source" => source.clone(), "event_type" => et.clone(), "phase" => phase)
                            .increment(n);
                    }
                }
            }
            for (outcome, n) in [("succeeded", c.succeeded), ("dead_lettered", c.dead)] {
                if n > 0 {
                    metrics::counter!(metric::INBOX_COMPLETED, "source" => source.clone(), "event_type" => et.clone(), "outcome" => outcome)
                        .increment(n);
                }
            }
            for (name, values) in [
                (metric::INBOX_PROCESSING_DURATION, &c.processing),
                (metric::INBOX_END_TO_END, &c.end_to_end),
                (metric::INBOX_ATTEMPTS, &c.attempts),
            ] {
                if !values.is_empty() {
                    let h = metrics::histogram!(name, &l);
                    values.iter().for_each(|v| h.record(*v));
                }
            }
        }
        self.record_classes(&source);
        self.rejections.flush(&source);
        if let Some(sink) = self.spans.as_mut() {
            sink.flush();
        }
    }

    /// The series by error class. A (label, class) pair first shows at 0
    /// and its amounts one poll later, like the series by label alone;
    /// retries on permanent errors exist only for the non-retryable classes.
    fn record_classes(&mut self, source: &str) {
        let by_class: Vec<((usize, u8), ClassCounts)> = self.by_class.drain().collect();
        for ((label, class), c) in by_class {
            let error_class = self.spec.error_classes.get(class);
            let permanent = !error_class.retryable;
            let l = [
                ("source", source.to_string()),
                ("event_type", self.labels.value(label).to_string()),
                ("error_class", error_class.name.clone()),
            ];
            let mut series = vec![
                (metric::INBOX_ATTEMPT_FAILURES, c.failures),
                (metric::INBOX_DEAD_LETTERS, c.dead),
            ];
            if permanent {
                series.push((metric::INBOX_PERMANENT_RETRIES, c.permanent_retries));
            }
            if self.class_series.insert((label, class)) {
                for (name, _) in &series {
                    metrics::counter!(*name, &l).increment(0);
                }
                self.by_class.insert((label, class), c);
                continue;
            }
            for (name, n) in series {
                if n > 0 {
                    metrics::counter!(name, &l).increment(n);
                }
            }
        }
    }

    /// The series of the source as a whole: ordering health (with
    /// `ordering_key` and `version`) and parked rows (with a status meaning
    /// parked). Counters first show at 0, on the first poll.
    fn record_source(&mut self, db_now: i64) {
        let source = self.spec.table.name.clone();
        let first = !self.source_series;
        self.source_series = true;
        let age = |oldest: Option<i64>| oldest.map_or(0.0, |t| seconds(db_now - t).max(0.0));
        if let Some(ordering) = self.ordering.as_mut() {
            let c = ordering.apply();
            for (name, n) in [
                (metric::INBOX_OUT_OF_ORDER_ARRIVALS, c.arrivals),
                (metric::INBOX_OUT_OF_ORDER_COMPLETIONS, c.completions),
                (metric::ORDERING_KEYS_EVICTED, c.evicted),
            ] {
                if first || n > 0 {
                    metrics::counter!(name, "source" => source.clone()).increment(n);
                }
            }
            let gaps = ordering.gaps();
            metrics::gauge!(metric::INBOX_VERSION_GAPS, "source" => source.clone())
                .set(gaps.keys as f64);
            metrics::gauge!(metric::INBOX_OLDEST_GAP_AGE, "source" => source.clone())
                .set(age(gaps.oldest));
        }
        if let Some(p) = self.parked.take() {
            metrics::gauge!(metric::INBOX_PARKED, "source" => source.clone())
                .set(p.messages as f64);
            if self.ordering.is_some() {
                metrics::gauge!(metric::INBOX_PARKED_KEYS, "source" => source.clone())
                    .set(p.keys as f64);
            }
            metrics::gauge!(metric::INBOX_OLDEST_PARKED_AGE, "source" => source.clone())
                .set(age(p.oldest));
        }
    }

    fn record_gauges(&mut self, gauges: &GaugeMap, db_now: i64, now: Instant) {
        let source = self.spec.table.name.clone();
        let labels: Vec<usize> = self
            .reported
            .iter()
            .chain(gauges.keys())
            .copied()
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        for label in labels {
            let g = gauges.get(&label).copied().unwrap_or_default();
            let et = self.labels.value(label).to_string();
            for (status, n) in [
                ("pending", g.counts[PENDING]),
                ("processing", g.counts[PROCESSING]),
                ("failed", g.counts[FAILED]),
            ] {
                metrics::gauge!(metric::INBOX_BACKLOG, "source" => source.clone(), "event_type" => et.clone(), "status" => status)
                    .set(n as f64);
            }
            let age = g.oldest.map_or(0.0, |r| seconds(db_now - r).max(0.0));
            metrics::gauge!(metric::INBOX_OLDEST_AGE, "source" => source.clone(), "event_type" => et.clone()).set(age);
            metrics::gauge!(metric::INBOX_STUCK, "source" => source.clone(), "event_type" => et.clone())
                .set(g.stuck as f64);
            self.reported.insert(label);
        }
        for (label, sketch) in &mut self.sketches {
            let et = self.labels.value(*label).to_string();
            let values = sketch.quantiles(now, &QUANTILES);
            for (i, q) in QUANTILES.iter().enumerate() {
                let v = values.as_ref().map_or(f64::NAN, |v| v[i]);
                metrics::gauge!(metric::INBOX_DURATION_QUANTILE, "source" => source.clone(), "event_type" => et.clone(), "quantile" => q.to_string())
                    .set(v);
            }
        }
    }
}

/// The rows in flight of an inbox whose status is words only: the condition
/// (its processing and failed words) and the start column's name, from which
/// the agent's read of them ([`super::TableSource::in_flight_query`]) and the
/// partial index that serves it (`schema --config`, `doctor`) are both
/// written, so that the planner matches one with the other.
pub(crate) fn in_flight(spec: &InboxSpec, sql: &Sql) -> Option<(String, String)> {
    let status = spec.words_only()?;
    let started = spec.columns.started_at.as_deref()?;
    let words: Vec<&str> = [Status::Processing, Status::Failed]
        .into_iter()
        .flat_map(|s| spec.statuses.words_for(s))
        .collect();
    if words.is_empty() {
        return None;
    }
    Some((sql.is_in(&sql.ident(status), &words), started.to_string()))
}

impl TableKind for Inbox {
    fn columns(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .spec
            .columns
            .mapped()
            .into_iter()
            .map(|(m, c)| (format!("columns.{m}"), c.to_string()))
            .collect();
        for (i, rule) in self.spec.rules.iter().enumerate() {
            for c in rule.when.columns() {
                out.push((format!("status_rules[{i}].when"), c.to_string()));
            }
        }
        out
    }

    fn select_list(&self, sql: &Sql) -> Vec<(&'static str, String)> {
        let c = &self.spec.columns;
        let opt = |col: &Option<String>, f: &dyn Fn(&str) -> String| {
            col.as_deref()
                .map_or("NULL".to_string(), |c| f(&sql.ident(c)))
        };
        let updated_at = match self.spec.table.cursor {
            Cursor::UpdatedAt => opt(&c.updated_at, &|e| sql.row_time(e)),
            Cursor::None | Cursor::Events => "NULL".to_string(),
        };
        vec![
            ("event_id", sql.text(&sql.ident(&c.event_id))),
            ("event_type", opt(&c.event_type, &|e| sql.text(e))),
            ("status", self.spec.status_select(sql)),
            ("received_at", sql.row_time(&self.spec.received_sql(sql))),
            (
                "started_at",
                self.spec
                    .started_sql(sql)
                    .map_or("NULL".to_string(), |e| sql.row_time(&e)),
            ),
            ("finished_at", opt(&c.finished_at, &|e| sql.row_time(e))),
            ("attempts", self.spec.attempts_select(sql)),
            ("deliveries", opt(&c.deliveries, &|e| sql.int(e))),
            (
                "last_error",
                opt(&c.last_error, &|e| sql.int(&sql.char_length(e))),
            ),
            (
                "last_error",
                // Read whenever mapped: it gives the error class.
                opt(&c.last_error, &|e| {
                    sql.text(&sql.prefix(e, link::ERROR_TEXT_LEN + 1))
                }),
            ),
            (
                "traceparent",
                if self.spans.is_some() {
                    opt(&c.traceparent, &|e| sql.text(e))
                } else {
                    "NULL".to_string()
                },
            ),
            ("updated_at", updated_at),
            ("ordering_key", opt(&c.ordering_key, &|e| sql.text(e))),
            ("version", opt(&c.version, &|e| sql.int(e))),
        ]
    }

    fn cursors(&self) -> Vec<(String, usize)> {
        let c = &self.spec.columns;
        match (self.spec.table.cursor, &c.updated_at) {
            (Cursor::UpdatedAt, Some(u)) => vec![(u.clone(), 11)],
            // The events log is the cursor (see `events`).
            (Cursor::Events, _) => Vec::new(),
            _ => {
                let mut out = vec![(c.received_at.clone(), 3)];
                // Starts are tailed when the in-flight rows are looked up
                // instead of every unfinished row re-read.
                if let (Some(s), Some(_)) = (&c.started_at, self.incremental()) {
                    out.push((s.clone(), 4));
                }
                if let Some(f) = &c.finished_at {
                    out.push((f.clone(), 5));
                }
                out
            }
        }
    }

    /// Without a change cursor a row with a status column, a start and a
    /// finish time changes where no time column shows it only while in
    /// flight (failing, going back to pending, redelivered): arrivals, starts
    /// and completions are tailed, the rows in flight looked up. Status rules
    /// (whose meaning can change with the clock or any column), deleted rows
    /// (a row that leaves leaves no time) and a missing start or finish time
    /// keep the re-read of every unfinished row.
    fn why_every_unfinished_row(&self) -> Option<String> {
        let t = &self.spec.table;
        let c = &self.spec.columns;
        let why = if t.finished_rows == FinishedRows::Deleted {
            "a row deleted when it finishes leaves no time to tail"
        } else if self.spec.words_only().is_none() {
            "status_rules: a row's meaning can change with the clock or any column"
        } else if c.started_at.is_none() {
            "no started_at: a start cannot be tailed"
        } else if c.finished_at.is_none() {
            "no finished_at: a completion cannot be tailed"
        } else {
            return None;
        };
        Some(why.to_string())
    }

    fn incremental(&self) -> Option<Incremental> {
        let t = &self.spec.table;
        let eligible = t.cursor == Cursor::None
            && t.events.is_none()
            && self.why_every_unfinished_row().is_none();
        eligible.then(|| Incremental {
            started: Some(4),
            horizon: t.overlap.max(self.spec.stuck_after),
        })
    }

    fn event_id(&self) -> &str {
        &self.spec.columns.event_id
    }

    fn unmapped_meanings(&self) -> Vec<&'static str> {
        Shape::Inbox(&self.spec).unmapped_meanings()
    }

    fn in_flight(&self, sql: &Sql) -> Option<(String, String)> {
        in_flight(&self.spec, sql)
    }

    fn received_column(&self) -> Option<String> {
        Some(self.spec.columns.received_at.clone()).filter(|c| !c.is_empty())
    }

    fn status_column(&self) -> Option<String> {
        self.spec.words_only().map(str::to_string)
    }

    fn class_of_word(&self, word: &str) -> Option<usize> {
        self.spec.meaning_of(word).and_then(class_of)
    }

    fn unfinished_filter(&self, sql: &Sql) -> String {
        match self.spec.words_only() {
            Some(status) => sql.is_in(&sql.ident(status), &self.spec.statuses.unfinished_words()),
            None => self.spec.status_sql().unfinished_sql(sql),
        }
    }

    fn reject(&mut self, reason: Reject) {
        self.rejections.add(reason);
    }

    fn start(&mut self, db_now: i64) {
        self.start = db_now;
        self.states.start(db_now);
    }

    fn begin(&mut self, db_now: i64) {
        self.poll_now = db_now;
    }

    fn observe(&mut self, row: &AnyRow, baseline: bool) -> Result<(), String> {
        let row = self.decode(row)?;
        self.take(row, baseline);
        Ok(())
    }

    fn observe_event(&mut self, row: &AnyRow) -> Result<(), String> {
        let mut row = self.decode(row)?;
        row.meaning = true;
        self.take(row, false);
        Ok(())
    }

    fn gone(&mut self, key: u64, deleted: Option<&Unfinished>, noticed: i64) {
        let Some(prev) = self.load(key) else {
            return;
        };
        if !prev.valid || prev.completed {
            return;
        }
        if let Some(last) = deleted {
            // The attempt that finished it follows the failed ones seen; its
            // end is this poll at the latest (an upper bound, if observed).
            let attempts = f64::from(prev.failures.saturating_add(1));
            let times = Times {
                received: last.born(),
                started: last.started(),
                end: self.spec.table.deleted_durations.then_some(noticed),
            };
            self.completion(
                last.label(),
                self.spec.deleted_as,
                prev.class,
                attempts,
                times,
                Instant::now(),
            );
        }
        // Gone either way: no longer unfinished, forgotten after the retention.
        self.store(
            key,
            State {
                updated: noticed.max(prev.updated),
                completed: true,
                status: if deleted.is_some() {
                    self.spec.deleted_as
                } else {
                    prev.status
                },
                ..prev
            },
        );
    }

    fn gauge_query(&self, sql: &Sql, db_now: i64) -> String {
        let c = &self.spec.columns;
        let stuck_before = db_now - micros(self.spec.stuck_after);
        let table = sql.table(&self.spec.table.table);
        let et = c.event_type.as_deref().map(|e| sql.ident(e));
        let et_select = et.as_deref().map_or("NULL".to_string(), |e| sql.text(e));
        let started_sql = self.spec.started_sql(sql);
        let received = self.spec.received_sql(sql);
        let started = |processing: &str| match &started_sql {
            Some(started) => format!(
                "CASE WHEN {processing} AND {} BETWEEN {} AND {} THEN 1 ELSE 0 END",
                sql.micros(started),
                OUT_OF_RANGE + 1,
                stuck_before - 1,
            ),
            None => "0".to_string(),
        };
        match self.spec.words_only() {
            Some(status) => {
                let status = sql.ident(status);
                let stuck =
                    started(&sql.is_in(&status, &self.spec.statuses.words_for(Status::Processing)));
                let group = et
                    .as_deref()
                    .map_or(status.clone(), |e| format!("{status}, {e}"));
                format!(
                    "SELECT {}, {et_select}, COUNT(*), {}, {} FROM {table} WHERE {status} IN {} GROUP BY {group}",
                    sql.text(&status),
                    sql.min_micros(&received),
                    sql.int(&format!("SUM({})", stuck)),
                    sql.in_list(&self.spec.statuses.unfinished_words()),
                )
            }
            None => {
                // The meaning is worked out per row; grouped by position, as
                // the expression is long (and PostgreSQL, MySQL and SQLite
                // all take positions).
                let meaning = self.spec.status_select(sql);
                let stuck = started(&format!("{meaning} = 'processing'"));
                let group = if et.is_some() { "1, 2" } else { "1" };
                format!(
                    "SELECT {meaning}, {et_select}, COUNT(*), {}, {} FROM {table} WHERE {} GROUP BY {group}",
                    sql.min_micros(&received),
                    sql.int(&format!("SUM({})", stuck)),
                    self.unfinished_filter(sql),
                )
            }
        }
    }

    fn parked_query(&self, sql: &Sql) -> Option<String> {
        if !self.spec.parks() {
            return None;
        }
        let c = &self.spec.columns;
        let condition = match self.spec.words_only() {
            Some(status) => sql.is_in(
                &sql.ident(status),
                &self.spec.statuses.words_for(Status::Parked),
            ),
            None => format!(
                "{} = {}",
                self.spec.status_select(sql),
                sql.literal(Status::Parked.as_str())
            ),
        };
        let keys = match (&c.ordering_key, self.spec.ordered()) {
            (Some(k), true) => format!("COUNT(DISTINCT {})", sql.ident(k)),
            _ => "0".to_string(),
        };
        Some(format!(
            "SELECT {}, {}, {} FROM {} WHERE {condition}",
            sql.int("COUNT(*)"),
            sql.int(&keys),
            sql.min_micros(&self.spec.received_sql(sql)),
            sql.table(&self.spec.table.table),
        ))
    }

    fn parked(&mut self, row: &AnyRow) -> Result<(), String> {
        let messages: Option<i64> = get(row, 0, "status")?;
        let keys: Option<i64> = get(row, 1, "ordering_key")?;
        let oldest = Sql::in_range(get(row, 2, "received_at")?);
        let count = |n: Option<i64>| u64::try_from(n.unwrap_or(0)).unwrap_or(0);
        self.parked = Some(Parked {
            messages: count(messages),
            keys: count(keys),
            oldest,
        });
        Ok(())
    }

    fn gauges(&mut self, rows: &[AnyRow]) -> Result<GaugeMap, String> {
        let mut out = GaugeMap::new();
        for row in rows {
            let word: Option<String> = get(row, 0, "status")?;
            let et: Option<String> = get(row, 1, "event_type")?;
            let count: i64 = get(row, 2, "status")?;
            let oldest = Sql::in_range(get(row, 3, "received_at")?);
            let stuck: Option<i64> = get(row, 4, "started_at")?;
            // A word the database matched but the agent does not (MySQL compares
            // case-insensitively) is an unknown status, as the tail rejects it.
            let Some(class) = word
                .and_then(|w| self.spec.meaning_of(&w))
                .and_then(class_of)
            else {
                continue;
            };
            let label = self.labels.resolve(et.as_deref());
            out.entry(label).or_default().add(
                class,
                u64::try_from(count).unwrap_or(0),
                oldest,
                u64::try_from(stuck.unwrap_or(0)).unwrap_or(0),
            );
        }
        Ok(out)
    }

    fn unfinished(&mut self, row: &AnyRow) -> Result<(u64, Option<Unfinished>), String> {
        let event_id: Option<String> = get(row, 0, "event_id")?;
        let key = key_of(event_id.as_deref().unwrap_or_default());
        let word: Option<String> = get(row, 2, "status")?;
        let Some(class) = word
            .and_then(|w| self.spec.meaning_of(&w))
            .and_then(class_of)
        else {
            return Ok((key, None));
        };
        let et: Option<String> = get(row, 1, "event_type")?;
        let born = Sql::in_range(get_time(row, 3, "received_at")?);
        let started = Sql::in_range(get_time(row, 4, "started_at")?);
        Ok((
            key,
            Some(Unfinished::new(
                self.labels.resolve(et.as_deref()),
                class,
                born,
                if class == PROCESSING { started } else { None },
            )),
        ))
    }

    fn stuck_before(&self, db_now: i64) -> i64 {
        if self.spec.columns.started_at.is_some() {
            db_now - micros(self.spec.stuck_after)
        } else {
            i64::MIN
        }
    }

    fn replays_query(&self) -> Option<(&str, i64)> {
        self.replays.query()
    }

    fn replays(&mut self, read: Result<Vec<AnyRow>, String>) {
        for (event_id, at) in self.replays.take(&self.spec.table.name, read) {
            self.reopen(&event_id, at);
        }
    }

    fn flush(&mut self, gauges: &GaugeMap, db_now: i64, now: Instant) {
        self.replays
            .flush(&self.spec.table.name, &self.spec.error_classes);
        self.record();
        self.record_source(db_now);
        self.record_gauges(gauges, db_now, now);
        self.tidy(db_now, now);
    }
}

/// Attempts a row shows were started after a failed one, given the failed
/// attempts it shows: each failure was retried, except the last one while the
/// row waits (failed, or back in pending) for its next attempt, or when its
/// final status ended that attempt (`ended_failed`).
fn retries_shown(status: Status, failures: u32, ended_failed: bool) -> u32 {
    match status {
        Status::Failed | Status::Pending | Status::Parked => failures.saturating_sub(1),
        Status::Succeeded | Status::Dead if ended_failed => failures.saturating_sub(1),
        Status::Processing | Status::Succeeded | Status::Dead => failures,
    }
}

/// Whether a row reaching a final status ends the attempt it last showed
/// failed rather than a new one: it waited (failed, pending, parked) after a
/// failure, and shows no attempt started since — its attempts unchanged,
/// or without an attempts column no start after that change.
fn ends_failed_attempt(row: &Row, prev: &State) -> bool {
    let waited = matches!(
        prev.status,
        Status::Failed | Status::Pending | Status::Parked
    );
    let no_new_start = match row.attempts {
        Some(a) => a <= i64::from(prev.failures),
        None => row.started.is_none_or(|s| s <= prev.updated),
    };
    waited && prev.failures > 0 && no_new_start
}

/// The number of the attempt a row shows: its attempts, or without an
/// attempts column from the failures counted — the failed one in `failed`
/// or when the final status ended it, else the one after it.
fn attempt_shown(row: &Row, status: Status, failures: u32, ended_failed: bool) -> u32 {
    match row.attempts {
        Some(a) => u32::try_from(a.max(1)).unwrap_or(u32::MAX),
        None if status == Status::Failed || ended_failed => failures.max(1),
        None => failures + 1,
    }
}

/// A version of a row read without a change cursor: a hash of every value
/// the counting rules read, so a rejected version is counted once however
/// often it is re-read, and again when any of them changes.
fn version_of(row: &Row) -> i64 {
    use std::hash::{Hash, Hasher};
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new_with_keys(0x7665_7273_696f_6e73, 0x6f66_2072_6f77_7321);
    (
        &row.status,
        row.received,
        row.started,
        row.finished,
        row.attempts,
        row.deliveries,
        row.error_len,
    )
        .hash(&mut h);
    h.finish() as i64
}

/// Index of each unfinished status in [`super::backlog::Gauges::counts`].
const PENDING: usize = 0;
const PROCESSING: usize = 1;
const FAILED: usize = 2;

fn class_of(status: Status) -> Option<usize> {
    match status {
        Status::Pending => Some(PENDING),
        Status::Processing => Some(PROCESSING),
        Status::Failed => Some(FAILED),
        Status::Succeeded | Status::Dead | Status::Parked => None,
    }
}

/// The change time a rejected row is remembered by. A cursor out of range
/// (`infinity`) sorts after every other and is read again on every poll: such
/// a row is kept as if it had just changed, so it is not forgotten and
/// counted again.
pub(crate) fn forget_after(updated: i64) -> i64 {
    if updated == OUT_OF_RANGE {
        i64::MAX
    } else {
        updated
    }
}

/// Microseconds to seconds.
pub(crate) fn seconds(micros: i64) -> f64 {
    micros as f64 / 1e6
}

/// A duration in microseconds.
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Whether a final row finished before it started or was received. Only a
/// final row's finished time is its finish: a job queue keeps the previous
/// attempt's finish time while the job waits for and runs its next attempt
/// (apalis's `done_at` stays while the retry's `lock_at` is newer).
fn finish_before_start(row: &Row, status: Status, received: i64) -> bool {
    status.is_terminal()
        && row
            .finished
            .is_some_and(|fin| row.started.is_some_and(|s| fin < s) || fin < received)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards apalis's retried jobs: while a job waits for or runs its next
    /// attempt its row keeps the previous attempt's `done_at`, older than the
    /// new `lock_at`; only a final row with such times is rejected.
    #[test]
    fn only_a_final_row_can_finish_before_it_started() {
        let row = |started: i64, finished: i64| Row {
            event_id: "job".into(),
            event_type: None,
            status: String::new(),
            meaning: false,
            received: Some(100),
            started: Some(started),
            finished: Some(finished),
            attempts: Some(1),
            deliveries: None,
            error_len: None,
            error_text: None,
            class: 0,
            traceparent: None,
            updated: 0,
            version: 0,
            ordering_key: None,
            key_version: None,
        };
        let retried = row(300, 200);
        for status in [Status::Pending, Status::Processing, Status::Failed] {
            assert!(!finish_before_start(&retried, status, 100), "{status:?}");
        }
        for status in [Status::Succeeded, Status::Dead] {
            assert!(finish_before_start(&retried, status, 100), "{status:?}");
            assert!(!finish_before_start(&row(200, 300), status, 100));
            assert!(
                finish_before_start(&row(50, 60), status, 100),
                "before received"
            );
        }
    }

    /// Guards the map's memory figures (docs/performance.md, "Memory at
    /// 10 M rows: the maps").
    #[test]
    fn a_remembered_event_is_16_bytes_and_its_bucket_24() {
        assert_eq!(size_of::<Remembered>(), 16);
        assert_eq!(size_of::<(u64, Remembered)>(), 24);
    }

    /// A time packs exactly from 2⁵⁰ µs before [`TIME_CENTER`] to 2⁵⁰ − 1
    /// after, and not a microsecond beyond.
    #[test]
    fn times_pack_within_their_years() {
        let half = 1i64 << (TIME_BITS - 1);
        for t in [
            TIME_CENTER - half,
            TIME_CENTER - half + 1,
            TIME_CENTER,
            1_796_629_365_591_380,
            TIME_CENTER + half - 1,
        ] {
            let p = pack_time(t).expect("within");
            assert_eq!(p & !TIME_MASK, 0);
            assert_eq!(unpack_time(p), t);
        }
        for t in [
            TIME_CENTER - half - 1,
            TIME_CENTER + half,
            i64::MIN,
            i64::MAX,
            0,
        ] {
            assert_eq!(pack_time(t), None, "{t}");
        }
    }

    /// Every value the counting rules read comes back from the stored form,
    /// including the extremes of each time and an absent one.
    #[test]
    fn the_stored_form_keeps_every_value() {
        let times = [None, Some(i64::MIN), Some(-1), Some(0), Some(i64::MAX)];
        let half = 1i64 << (TIME_BITS - 1);
        // The change and arrival: far (outside the packed years, at either
        // edge of i64, and a microsecond past the packed years), and near.
        let pairs = |n: i64| match n % 5 {
            0 => (i64::MIN + n, i64::MAX - n),
            1 => (TIME_CENTER + half, TIME_CENTER),
            2 => (TIME_CENTER, TIME_CENTER - half - 1),
            3 => (TIME_CENTER - half + n, TIME_CENTER + half - 1 - n),
            _ => (1_796_629_365_591_380 + n, 1_796_629_365_000_000 - n),
        };
        let mut n = 0;
        for status in Status::ALL {
            for (completed, valid) in [(false, false), (true, false), (false, true), (true, true)] {
                for (rejected_at, ended_failed) in
                    times.into_iter().zip([false, true].into_iter().cycle())
                {
                    for long_error_at in times {
                        // The counts far past their bits, one just past
                        // (5, 4 and 4 bits), at their edges, and small.
                        let counts = match n % 7 {
                            0 => [u32::MAX, u32::MAX - 1, 7],
                            1 => [3, 0, 65_536],
                            2 => [32, 0, 0],
                            3 => [1, 16, 0],
                            4 => [1, 0, 16],
                            5 => [31, 15, 15],
                            _ => [1, 2, 0],
                        };
                        let big = matches!(n % 7, 0..=4);
                        let (updated, received) = pairs(n);
                        let far = matches!(n % 5, 0..=2);
                        let s = State {
                            updated,
                            received,
                            deliveries: counts[0],
                            failures: counts[1],
                            status,
                            completed,
                            rejected_at,
                            long_error_at,
                            valid,
                            spanned: counts[2],
                            class: 31 - (n % 32) as u8,
                            ended_failed,
                        };
                        let (r, rare) = split(s);
                        assert_eq!(
                            rare.is_some(),
                            rejected_at.is_some() || long_error_at.is_some() || big || far
                        );
                        assert_eq!(r.far(), far);
                        assert_eq!(rare.and_then(|x| x.times).is_some(), far);
                        assert_eq!(join(r, || rare), s);
                        // The rare part is asked for only when there is one.
                        if rare.is_none() {
                            assert_eq!(join(r, || panic!("looked up")), s);
                        }
                        if !far {
                            assert_eq!(r.updated_at(), s.updated);
                            assert_eq!(r.born_at(), s.received);
                        }
                        assert_eq!(r.finished(), completed || !valid);
                        n += 1;
                    }
                }
            }
        }
    }

    /// The rare versions live beside the remembered state and leave with it:
    /// a later version without one removes it, and an evicted event takes
    /// its own along.
    #[test]
    fn rare_versions_come_back_and_go_with_their_event() {
        let text = "[[sources]]\nname = \"orders\"\nkind = \"inbox\"\n\
                    dsn = \"postgres://u@db/orders\"\ntable = \"inbox\"\n\
                    state_retention = \"1m\"\n\
                    columns = { event_id = \"id\", status = \"status\", received_at = \"received_at\", \
                    started_at = \"started_at\", finished_at = \"finished_at\" }\n";
        let cfg = crate::config::parse_str(text).expect("valid");
        let crate::sources::SourceSpec::Inbox(spec) = &cfg.sources[0] else {
            panic!("expected an inbox source")
        };
        let mut inbox = Inbox::new(spec.clone());
        let minute = 60_000_000;
        // A time the packed form holds (2026-12-07), and one it does not.
        let t0 = 1_796_629_365_591_380;
        let long_ago = 0;
        let done = |updated: i64| State {
            completed: true,
            status: Status::Succeeded,
            ..State::new(updated, updated, 0, true)
        };
        let rejected = |updated: i64| State {
            rejected_at: Some(updated),
            ..State::new(updated, updated, 0, true)
        };
        // 1: rejected, then a usable version; 2: rejected and kept;
        // 3: a long error, finished long ago; 4: plain; 5 and 6: times
        // the packed form does not hold, finished long ago and unfinished.
        inbox.store(1, rejected(t0 + 10 * minute));
        assert_eq!(
            inbox.load(1).and_then(|s| s.rejected_at),
            Some(t0 + 10 * minute)
        );
        inbox.store(1, State::new(t0 + 11 * minute, t0 + 10 * minute, 0, true));
        assert_eq!(inbox.load(1).and_then(|s| s.rejected_at), None);
        assert!(
            !inbox.rare.contains_key(&1),
            "a version without one drops it"
        );
        inbox.store(2, rejected(t0 + 10 * minute));
        let long = State {
            long_error_at: Some(t0 + minute),
            ..done(t0 + minute)
        };
        inbox.store(3, long);
        inbox.store(4, done(t0 + 10 * minute));
        assert_eq!(inbox.load(3), Some(long));
        assert_eq!(inbox.rare.len(), 2);
        // 5's arrival (set past its change, which no row shows, so that the
        // floor tells which arrival it took) is past the packed years.
        let past = TIME_CENTER + (1 << (TIME_BITS - 1));
        let far_done = State {
            received: past,
            ..done(long_ago + minute)
        };
        let far_open = State::new(long_ago, long_ago - minute, 0, true);
        inbox.store(5, far_done);
        inbox.store(6, far_open);
        assert_eq!(inbox.load(5), Some(far_done));
        assert_eq!(inbox.load(6), Some(far_open));
        assert_eq!(inbox.rare.len(), 4);
        // Eleven minutes in with a retention of one: 3 and 5 are forgotten,
        // and their rare versions with them; 2 and 6 are unfinished and
        // stay. The floor passes 5's arrival, the latest of theirs: its
        // own time, not the packed bits'.
        inbox.tidy(t0 + 11 * minute, Instant::now());
        assert_eq!(inbox.load(3), None);
        assert_eq!(inbox.load(5), None);
        assert_eq!(inbox.load(4).map(|s| s.updated), Some(t0 + 10 * minute));
        assert_eq!(
            inbox.load(2).and_then(|s| s.rejected_at),
            Some(t0 + 10 * minute)
        );
        assert_eq!(inbox.load(6), Some(far_open));
        let mut kept = inbox.rare.keys().copied().collect::<Vec<_>>();
        kept.sort_unstable();
        assert_eq!(kept, [2, 6]);
        assert!(inbox.states.is_new(past + 1));
        assert!(!inbox.states.is_new(past));
    }

    /// A row version rejected at a NULL cursor (read as `i64::MIN`) is still
    /// recognised when read again: no sentinel value stands for "none".
    #[test]
    fn a_rejection_at_the_smallest_version_is_remembered() {
        let mut t: Tracked<Remembered> = Tracked::new(10);
        let (r, rare) = split(State {
            rejected_at: Some(i64::MIN),
            ..State::new(i64::MIN, i64::MIN, 0, false)
        });
        t.insert(1, r);
        let back = join(*t.get(1).expect("remembered"), || rare);
        assert_eq!(back.rejected_at, Some(i64::MIN));
        assert_eq!(back.long_error_at, None);
    }
}
