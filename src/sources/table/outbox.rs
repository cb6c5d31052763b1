//! The outbox table: one row per event to publish, `published_at` NULL until sent.
//!
//! A row counts as published once, when its `published_at` is first seen set
//! (at or after the agent's start); the publish delay is `published_at −
//! created_at`. Unpublished rows at start are the baseline.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use sqlx::any::AnyRow;

use super::backlog::{GaugeMap, Unfinished};
use super::config::{Cursor, FinishedRows, OutboxSpec};
use super::inbox::seconds;
use super::recent::{Entry, Flags, Tracked};
use super::shape::Shape;
use super::sql::{OUT_OF_RANGE, Sql};
use super::{Incremental, NO_CURSOR, Reject, Rejections, TableKind, get, get_time, key_of};
use crate::telemetry::catalogue as metric;
use crate::telemetry::labels::LabelCap;
use crate::tracing_link::{self as link, Publish, SpanSink, TraceParent};

/// What the agent remembers of one outbox row; the map stores it as
/// [`Remembered`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    updated: i64,
    created: i64,
    published: bool,
    rejected_at: Option<i64>,
    /// False while the only versions seen were rejected.
    valid: bool,
}

/// [`State`] as the map stores it, every value kept: 32 bytes instead of 40.
#[derive(Debug, Clone, Copy, Default)]
struct Remembered {
    updated: i64,
    created: i64,
    rejected_at: i64,
    flags: Flags,
}

/// Bits of [`Remembered::flags`].
const PUBLISHED: u8 = 0;
const VALID: u8 = 1;
const REJECTED: u8 = 2;

impl From<State> for Remembered {
    fn from(s: State) -> Self {
        let mut flags = Flags::default();
        flags.set(PUBLISHED, s.published);
        flags.set(VALID, s.valid);
        Remembered {
            updated: s.updated,
            created: s.created,
            rejected_at: flags.put_time(REJECTED, s.rejected_at),
            flags,
        }
    }
}

impl From<Remembered> for State {
    fn from(r: Remembered) -> Self {
        State {
            updated: r.updated,
            created: r.created,
            published: r.flags.get(PUBLISHED),
            rejected_at: r.flags.time(REJECTED, r.rejected_at),
            valid: r.flags.get(VALID),
        }
    }
}

impl Entry for Remembered {
    fn updated_at(&self) -> i64 {
        self.updated
    }
    fn born_at(&self) -> i64 {
        self.created
    }
    fn finished(&self) -> bool {
        self.flags.get(PUBLISHED) || !self.flags.get(VALID)
    }
}

#[derive(Debug, Default)]
struct Counts {
    published: u64,
    delays: Vec<f64>,
}

/// The outbox part of a table source.
pub struct Outbox {
    spec: OutboxSpec,
    states: Tracked<Remembered>,
    labels: LabelCap,
    start: i64,
    counts: HashMap<usize, Counts>,
    rejections: Rejections,
    reported: HashSet<usize>,
    /// Labels whose counter series exist (created at 0).
    series: HashSet<usize>,
    /// Where the producer spans go, when `[tracing]` is configured.
    spans: Option<SpanSink>,
    /// Overlap window in microseconds: how far back a restarted agent re-emits spans.
    overlap: i64,
    /// The database's time at the start of the current poll.
    poll_now: i64,
}

impl Outbox {
    /// The outbox logic of one configured source.
    pub fn new(spec: OutboxSpec) -> Self {
        let overlap = super::inbox::micros(spec.table.overlap);
        Outbox {
            states: Tracked::new(spec.table.max_tracked_events),
            labels: LabelCap::new(spec.table.event_type_limit),
            spec,
            start: i64::MIN,
            counts: HashMap::new(),
            rejections: Rejections::default(),
            reported: HashSet::new(),
            series: HashSet::new(),
            spans: None,
            overlap,
            poll_now: i64::MIN,
        }
    }

    /// Emits producer spans into `sink`.
    pub fn with_spans(mut self, sink: Option<SpanSink>) -> Self {
        self.spans = sink;
        self
    }

    /// An outbox has no attempts to note: the journal is not used.
    pub fn with_journal(self, _journal: crate::journal::Journal) -> Self {
        self
    }

    fn emit(&mut self, p: &Publish<'_>, traceparent: Option<&str>, count_rejects: bool) {
        let Some(sink) = self.spans.as_mut() else {
            return;
        };
        if count_rejects && traceparent.is_some() && p.traceparent.is_none() {
            self.rejections.add(Reject::BadTraceparent);
        }
        if sink.keep(p.event_id, false, None) {
            let span = link::producer_span(&sink.identity, p);
            sink.send(span);
        }
    }
}

impl TableKind for Outbox {
    fn columns(&self) -> Vec<(String, String)> {
        self.spec
            .columns
            .mapped()
            .into_iter()
            .map(|(m, c)| (format!("columns.{m}"), c.to_string()))
            .collect()
    }

    fn select_list(&self, sql: &Sql) -> Vec<(&'static str, String)> {
        let c = &self.spec.columns;
        vec![
            ("event_id", sql.text(&sql.ident(&c.event_id))),
            (
                "event_type",
                c.event_type
                    .as_deref()
                    .map_or("NULL".to_string(), |e| sql.text(&sql.ident(e))),
            ),
            ("created_at", sql.row_time(&sql.ident(&c.created_at))),
            ("published_at", sql.row_time(&sql.ident(&c.published_at))),
            (
                "traceparent",
                match (&c.traceparent, &self.spans) {
                    (Some(t), Some(_)) => sql.text(&sql.ident(t)),
                    _ => "NULL".to_string(),
                },
            ),
            (
                "updated_at",
                match (self.spec.table.cursor, &c.updated_at) {
                    (Cursor::UpdatedAt, Some(u)) => sql.row_time(&sql.ident(u)),
                    _ => "NULL".to_string(),
                },
            ),
        ]
    }

    fn cursors(&self) -> Vec<(String, usize)> {
        let c = &self.spec.columns;
        match (self.spec.table.cursor, &c.updated_at) {
            (Cursor::UpdatedAt, Some(u)) => vec![(u.clone(), 5)],
            _ => vec![(c.created_at.clone(), 2), (c.published_at.clone(), 3)],
        }
    }

    /// Without a change cursor an unpublished row changes only by being
    /// published (its `published_at` tailed) or deleted (the reconcile).
    fn incremental(&self) -> Option<Incremental> {
        let t = &self.spec.table;
        (t.cursor == Cursor::None && self.why_every_unfinished_row().is_none()).then_some(
            Incremental {
                started: None,
                horizon: std::time::Duration::ZERO,
            },
        )
    }

    fn why_every_unfinished_row(&self) -> Option<String> {
        (self.spec.table.finished_rows == FinishedRows::Deleted)
            .then(|| "a row deleted when it is published leaves no time to tail".to_string())
    }

    fn event_id(&self) -> &str {
        &self.spec.columns.event_id
    }

    fn unmapped_meanings(&self) -> Vec<&'static str> {
        Shape::Outbox(&self.spec).unmapped_meanings()
    }

    fn unfinished_filter(&self, sql: &Sql) -> String {
        format!("{} IS NULL", sql.ident(&self.spec.columns.published_at))
    }

    fn begin(&mut self, db_now: i64) {
        self.poll_now = db_now;
    }

    fn observe_event(&mut self, _row: &AnyRow) -> Result<(), String> {
        Err("cursor = \"events\" applies to inbox sources only".into())
    }

    fn gone(&mut self, key: u64, deleted: Option<&Unfinished>, noticed: i64) {
        let Some(prev) = self.states.get(key).copied().map(State::from) else {
            return;
        };
        if !prev.valid || prev.published {
            return;
        }
        if let Some(last) = deleted {
            // Deleted once sent: published by this poll at the latest.
            let counts = self.counts.entry(last.label()).or_default();
            counts.published += 1;
            if self.spec.table.deleted_durations {
                counts.delays.push(seconds(noticed - prev.created));
            }
        }
        self.states.insert(
            key,
            State {
                updated: noticed.max(prev.updated),
                published: true,
                ..prev
            },
        );
    }

    fn reject(&mut self, reason: Reject) {
        self.rejections.add(reason);
    }

    fn start(&mut self, db_now: i64) {
        self.start = db_now;
        self.states.start(db_now);
    }

    fn observe(&mut self, row: &AnyRow, baseline: bool) -> Result<(), String> {
        self.rejections.read();
        let event_id: String = get::<Option<String>>(row, 0, "event_id")?.unwrap_or_default();
        let event_type: Option<String> = get(row, 1, "event_type")?;
        let created = get_time(row, 2, "created_at")?;
        let published = get_time(row, 3, "published_at")?;
        let traceparent: Option<String> = get(row, 4, "traceparent")?;
        let mut updated: i64 = get_time(row, 5, "updated_at")?.unwrap_or(NO_CURSOR);
        // Without a change cursor, the poll that reads a row stands in for
        // its change time, and its values for its version.
        let version = if self.spec.table.cursor == Cursor::None {
            updated = self.poll_now;
            version_of(created, published)
        } else {
            updated
        };
        let key = key_of(&event_id);
        let label = self.labels.resolve(event_type.as_deref());
        let existing = self.states.get(key).copied().map(State::from);

        let problem = match (created, published) {
            _ if updated == NO_CURSOR => Some(Reject::NullCursor),
            _ if [created, published, Some(updated)].contains(&Some(OUT_OF_RANGE)) => {
                Some(Reject::TimeOutOfRange)
            }
            (None, _) => Some(Reject::NullTime),
            (Some(c), Some(p)) if p < c => Some(Reject::FinishBeforeStart),
            _ => None,
        };
        if let Some(reason) = problem {
            self.rejections.unusable(reason);
            if !baseline && existing.and_then(|s| s.rejected_at) != Some(version) {
                self.rejections.add(reason);
            }
            let state = existing.unwrap_or(State {
                updated: super::inbox::forget_after(updated),
                created: created.unwrap_or(i64::MIN),
                published: false,
                rejected_at: None,
                valid: false,
            });
            self.states.insert(
                key,
                State {
                    rejected_at: Some(version),
                    ..state
                },
            );
            return Ok(());
        }
        let created = created.expect("rows without created_at are rejected above");
        let was_published = match existing.filter(|s| s.valid) {
            Some(s) => s.published,
            None if baseline => published.is_some(),
            // First seen: a new row starts unpublished; an older one counts
            // only if it was published since the agent started.
            None if self.states.is_new(created) => false,
            None => published.is_none_or(|p| p < self.start || self.states.may_have_counted(p)),
        };
        if let Some(p) = published
            && !was_published
        {
            let counts = self.counts.entry(label).or_default();
            counts.published += 1;
            counts.delays.push(seconds(p - created));
        }
        // Spans have derived ids, so a restart re-emits those published within
        // the overlap window before the start instead of losing them.
        let first_seen_recent = existing.is_none_or(|s| !s.valid)
            && published.is_some_and(|p| p >= self.start.saturating_sub(self.overlap));
        if let Some(p) = published
            && (!was_published || first_seen_recent)
        {
            let tp = traceparent.as_deref().filter(|t| !t.is_empty());
            self.emit(
                &Publish {
                    event_id: &event_id,
                    event_type: event_type.as_deref(),
                    created,
                    published: p,
                    traceparent: tp.and_then(TraceParent::parse),
                },
                tp,
                !baseline,
            );
        }
        self.states.insert(
            key,
            State {
                updated: existing.map_or(updated, |s| s.updated.max(updated)),
                created,
                published: published.is_some(),
                rejected_at: existing.and_then(|s| s.rejected_at),
                valid: true,
            },
        );
        Ok(())
    }

    fn gauge_query(&self, sql: &Sql, _db_now: i64) -> String {
        let c = &self.spec.columns;
        let (et_select, group) = match &c.event_type {
            Some(et) => (
                sql.text(&sql.ident(et)),
                format!(" GROUP BY {}", sql.ident(et)),
            ),
            None => ("NULL".to_string(), String::new()),
        };
        format!(
            "SELECT {et_select}, COUNT(*), {} FROM {} WHERE {} IS NULL{group}",
            sql.min_micros(&sql.ident(&c.created_at)),
            sql.table(&self.spec.table.table),
            sql.ident(&c.published_at),
        )
    }

    fn gauges(&mut self, rows: &[AnyRow]) -> Result<GaugeMap, String> {
        let mut out = GaugeMap::new();
        for row in rows {
            let et: Option<String> = get(row, 0, "event_type")?;
            let count: i64 = get(row, 1, "published_at")?;
            let oldest = Sql::in_range(get(row, 2, "created_at")?);
            if count == 0 {
                continue;
            }
            let label = self.labels.resolve(et.as_deref());
            out.entry(label)
                .or_default()
                .add(0, u64::try_from(count).unwrap_or(0), oldest, 0);
        }
        Ok(out)
    }

    fn unfinished(&mut self, row: &AnyRow) -> Result<(u64, Option<Unfinished>), String> {
        let event_id: Option<String> = get(row, 0, "event_id")?;
        let key = key_of(event_id.as_deref().unwrap_or_default());
        let published = get_time(row, 3, "published_at")?;
        if published.is_some() {
            return Ok((key, None));
        }
        let et: Option<String> = get(row, 1, "event_type")?;
        let born = Sql::in_range(get_time(row, 2, "created_at")?);
        Ok((
            key,
            Some(Unfinished::new(
                self.labels.resolve(et.as_deref()),
                0,
                born,
                None,
            )),
        ))
    }

    fn stuck_before(&self, _db_now: i64) -> i64 {
        i64::MIN
    }

    fn flush(&mut self, gauges: &GaugeMap, db_now: i64, now: Instant) {
        let source = self.spec.table.name.clone();
        let counts: Vec<(usize, Counts)> = self.counts.drain().collect();
        for (label, c) in counts {
            let l = [
                ("source", source.clone()),
                ("event_type", self.labels.value(label).to_string()),
            ];
            // A new series first shows at 0, its first amount one poll later.
            if self.series.insert(label) {
                metrics::counter!(metric::OUTBOX_PUBLISHED, &l).increment(0);
                self.counts.insert(label, c);
                continue;
            }
            metrics::counter!(metric::OUTBOX_PUBLISHED, &l).increment(c.published);
            let h = metrics::histogram!(metric::OUTBOX_PUBLISH_DELAY, &l);
            c.delays.iter().for_each(|d| h.record(*d));
        }
        self.rejections.flush(&source);
        if let Some(sink) = self.spans.as_mut() {
            sink.flush();
        }
        let labels: HashSet<usize> = self.reported.iter().chain(gauges.keys()).copied().collect();
        for label in labels {
            let g = gauges.get(&label).copied().unwrap_or_default();
            let l = [
                ("source", source.clone()),
                ("event_type", self.labels.value(label).to_string()),
            ];
            metrics::gauge!(metric::OUTBOX_BACKLOG, &l).set(g.counts[0] as f64);
            let age = g.oldest.map_or(0.0, |c| seconds(db_now - c).max(0.0));
            metrics::gauge!(metric::OUTBOX_OLDEST_AGE, &l).set(age);
            self.reported.insert(label);
        }
        self.states.tidy(&self.spec.table, db_now, now, |_| {
            unreachable!("no entry is far")
        });
    }
}

/// The version of an outbox row read without a change cursor.
fn version_of(created: Option<i64>, published: Option<i64>) -> i64 {
    use std::hash::{Hash, Hasher};
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new_with_keys(0x6f75_7462_6f78_2076, 0x6572_7369_6f6e_7321);
    (created, published).hash(&mut h);
    h.finish() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards the map's memory figures (docs/performance.md, "Memory").
    #[test]
    fn a_remembered_row_is_32_bytes_and_its_bucket_40() {
        assert_eq!(size_of::<Remembered>(), 32);
        assert_eq!(size_of::<(u64, Remembered)>(), 40);
    }

    /// Every value the counting rules read comes back from the stored form.
    #[test]
    fn the_stored_form_keeps_every_value() {
        for rejected_at in [None, Some(i64::MIN), Some(0), Some(i64::MAX)] {
            for (published, valid) in [(false, false), (true, false), (false, true), (true, true)] {
                let s = State {
                    updated: i64::MAX,
                    created: i64::MIN,
                    published,
                    rejected_at,
                    valid,
                };
                let r = Remembered::from(s);
                assert_eq!(State::from(r), s);
                assert_eq!(r.updated_at(), s.updated);
                assert_eq!(r.born_at(), s.created);
                assert_eq!(r.finished(), published || !valid);
            }
        }
    }
}
