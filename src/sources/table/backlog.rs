//! The unfinished rows the gauges are computed from, kept up to date from the
//! rows the tail reads, so that a poll costs O(rows changed) rather than an
//! aggregate over every unfinished row.
//!
//! The map starts from the seed query (every unfinished row) and takes each
//! tailed row's current version. Changes the tail cannot see — a deleted row,
//! a row changed without moving the change cursor, a commit later than the
//! overlap — are caught by a reconciling aggregate every `reconcile_every`
//! (default 1 min): when its result differs from the map, the map is re-read
//! from the table.
//! A backlog larger than the map's cap is not kept: the aggregate then runs
//! on every poll until the backlog fits again.

use std::collections::BTreeMap;

use super::keymap::KeyMap;

/// The gauge-relevant part of one unfinished row, kept small (24 bytes):
/// a backlog of 100 000 rows is held in full.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unfinished {
    /// `received_at` / `created_at` (microseconds), [`NONE`] if NULL.
    born: i64,
    /// The start of a row that counts toward stuck rows (processing), [`NONE`] if none.
    stuck_from: i64,
    /// The `event_type` label id.
    label: u32,
    /// Index into [`Gauges::counts`] (the status: pending, processing, failed).
    class: u8,
}

/// A missing time in [`Unfinished`].
const NONE: i64 = i64::MIN;

impl Unfinished {
    /// An unfinished row of label `label` and status index `class`.
    pub fn new(label: usize, class: usize, born: Option<i64>, stuck_from: Option<i64>) -> Self {
        Unfinished {
            born: born.unwrap_or(NONE),
            stuck_from: stuck_from.unwrap_or(NONE),
            label: u32::try_from(label).expect("label ids are bounded by event_type_limit"),
            class: u8::try_from(class).expect("three unfinished statuses"),
        }
    }
}

impl Unfinished {
    /// The `event_type` label id.
    pub fn label(&self) -> usize {
        self.label as usize
    }

    /// `received_at` / `created_at`, if the row had one.
    pub fn born(&self) -> Option<i64> {
        (self.born != NONE).then_some(self.born)
    }

    /// The status index: 0 pending (an outbox's unpublished), 1 processing,
    /// 2 failed.
    pub fn class(&self) -> usize {
        usize::from(self.class)
    }

    /// The start of a row in processing, if it had one.
    pub fn started(&self) -> Option<i64> {
        (self.stuck_from != NONE).then_some(self.stuck_from)
    }
}

/// Gauge values of one `event_type` label.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Gauges {
    /// Unfinished rows by status (the outbox uses the first only).
    pub counts: [u64; 3],
    /// The oldest `born` of the unfinished rows.
    pub oldest: Option<i64>,
    /// Rows whose `stuck_from` lies before the stuck horizon.
    pub stuck: u64,
}

impl Gauges {
    /// Adds one row (or one group of `n` rows) to the values.
    pub fn add(&mut self, class: usize, n: u64, oldest: Option<i64>, stuck: u64) {
        if let Some(c) = self.counts.get_mut(class) {
            *c += n;
        }
        if let Some(o) = oldest {
            self.oldest = Some(self.oldest.map_or(o, |p| p.min(o)));
        }
        self.stuck += stuck;
    }
}

/// Gauge values by label id.
pub type GaugeMap = BTreeMap<usize, Gauges>;

/// Whether the map can be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fill {
    /// Not kept: never read, or over the cap.
    Off,
    /// A re-read of every unfinished row is under way.
    Filling,
    /// The map holds every unfinished row of the table.
    Complete,
}

/// Unfinished rows by event key, bounded by a cap.
#[derive(Debug)]
pub struct Backlog {
    rows: KeyMap<Unfinished>,
    cap: usize,
    fill: Fill,
}

impl Backlog {
    /// An empty map, not yet kept, holding at most `cap` rows.
    pub fn new(cap: usize) -> Self {
        Backlog {
            rows: KeyMap::new(),
            cap,
            fill: Fill::Off,
        }
    }

    /// Whether the gauges can come from the map.
    pub fn is_complete(&self) -> bool {
        self.fill == Fill::Complete
    }

    /// The number of unfinished rows the map may hold.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Starts a re-read of every unfinished row.
    pub fn clear(&mut self) {
        self.rows.clear();
        self.fill = Fill::Filling;
    }

    /// Ends a re-read: the map is complete if the read returned every row and
    /// they fit.
    pub fn filled(&mut self, all_read: bool) {
        if self.fill == Fill::Filling && all_read {
            self.fill = Fill::Complete;
        } else {
            self.drop_all();
        }
    }

    fn drop_all(&mut self) {
        self.rows = KeyMap::new();
        self.fill = Fill::Off;
    }

    /// Takes a row's current version: unfinished rows are kept, others dropped.
    pub fn update(&mut self, key: u64, row: Option<Unfinished>) {
        if self.fill == Fill::Off {
            return;
        }
        match row {
            Some(u) => {
                self.rows.insert(key, u);
                if self.rows.len() > self.cap {
                    // Too large to keep: the aggregate gives the gauges
                    // until a re-read finds the backlog small enough again.
                    self.drop_all();
                }
            }
            None => {
                self.rows.remove(&key);
            }
        }
    }

    /// The gauges of the rows in the map; rows started before `stuck_before`
    /// count as stuck.
    pub fn gauges(&self, stuck_before: i64) -> GaugeMap {
        let mut out = GaugeMap::new();
        for u in self.rows.values() {
            let stuck = u64::from(u.stuck_from != NONE && u.stuck_from < stuck_before);
            let born = (u.born != NONE).then_some(u.born);
            out.entry(u.label as usize)
                .or_default()
                .add(usize::from(u.class), 1, born, stuck);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(label: usize, class: usize, born: i64, stuck_from: Option<i64>) -> Option<Unfinished> {
        Some(Unfinished::new(label, class, Some(born), stuck_from))
    }

    #[test]
    fn gauges_follow_the_current_version_of_each_row() {
        let mut b = Backlog::new(10);
        b.clear();
        b.update(1, row(0, 0, 100, None));
        b.update(2, row(0, 1, 50, Some(60)));
        b.update(3, row(1, 2, 70, None));
        b.filled(true);
        assert!(b.is_complete());
        let g = b.gauges(1_000);
        assert_eq!(g[&0].counts, [1, 1, 0]);
        assert_eq!(g[&0].oldest, Some(50));
        assert_eq!(g[&0].stuck, 1);
        assert_eq!(g[&1].counts, [0, 0, 1]);
        // Row 2 finishes, row 1 moves to failed, a new row arrives.
        b.update(2, None);
        b.update(1, row(0, 2, 100, None));
        b.update(4, row(1, 0, 90, None));
        let g = b.gauges(1_000);
        assert_eq!(g[&0].counts, [0, 0, 1]);
        assert_eq!(g[&0].oldest, Some(100));
        assert_eq!(g[&0].stuck, 0);
        assert_eq!(g[&1].counts, [1, 0, 1]);
        assert_eq!(g[&1].oldest, Some(70));
        // Only rows started before the horizon are stuck.
        b.update(5, row(1, 1, 95, Some(500)));
        assert_eq!(b.gauges(400)[&1].stuck, 0);
        assert_eq!(b.gauges(600)[&1].stuck, 1);
    }

    #[test]
    fn a_backlog_over_the_cap_is_not_kept() {
        let mut b = Backlog::new(2);
        b.clear();
        b.update(1, row(0, 0, 1, None));
        b.update(2, row(0, 0, 2, None));
        b.filled(true);
        assert!(b.is_complete());
        b.update(3, row(0, 0, 3, None));
        assert!(!b.is_complete(), "three rows do not fit a cap of two");
        assert!(b.gauges(0).is_empty(), "nothing kept once over the cap");
        // Rows seen while incomplete are not kept: the map would be partial.
        b.update(4, row(0, 0, 4, None));
        assert!(b.gauges(0).is_empty());
        // A re-read that did not return every row leaves it incomplete.
        b.clear();
        b.update(1, row(0, 0, 1, None));
        b.filled(false);
        assert!(!b.is_complete());
    }
}
